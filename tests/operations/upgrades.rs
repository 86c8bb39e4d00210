//! An upgrade under load: no connection refused, every stream billed once.

use super::*;

/// One client of the upgrade load: streams of about half a second (new connection each), each
/// recorded with its request id when complete.
async fn upgrade_client(
    port: u16,
    key: String,
    stop: Arc<AtomicBool>,
    done: Arc<std::sync::Mutex<Vec<String>>>,
    failed: Arc<AtomicU64>,
) {
    // No idle connection kept: every request opens one, so a refused connection shows.
    let client = reqwest::Client::builder().pool_max_idle_per_host(0).build().unwrap();
    let mut n = 0u64;
    while !stop.load(Ordering::Relaxed) {
        n += 1;
        let body = json!({"model": "chat-model", "stream": n % 3 != 0, "messages": [{"role": "user", "content": format!("upgrade {n} {:p}", &n)}]});
        let sent = client
            .post(format!("http://127.0.0.1:{port}/v1/chat/completions"))
            .bearer_auth(&key)
            .header("x-mock-tokens", "20")
            .header("x-mock-token-delay-ms", "25")
            .json(&body)
            .send()
            .await;
        let outcome = match sent {
            Ok(r) => {
                let (status, rid) =
                    (r.status().as_u16(), r.headers().get("x-request-id").map(|v| v.to_str().unwrap().to_string()));
                match r.text().await {
                    Ok(t) if status == 200 && (n % 3 == 0 || t.contains("data: [DONE]")) => Ok(rid.unwrap()),
                    Ok(t) => Err(format!("{status} {t}")),
                    Err(e) => Err(format!("{status}, body cut: {e}")),
                }
            }
            Err(e) => Err(format!("not sent: {e}")),
        };
        match outcome {
            Ok(rid) => done.lock().unwrap().push(rid),
            Err(e) => {
                failed.fetch_add(1, Ordering::Relaxed);
                eprintln!("failed during the upgrade: {e}");
            }
        }
    }
}

#[tokio::test(flavor = "multi_thread")]
async fn an_upgrade_under_load_refuses_no_connection_and_bills_every_stream_once() {
    let mock = Mock::start();
    let mut old = Gateway::start_with(&mock, Opts { grace_seconds: 3, ..Opts::default() });
    let (stop, failed) = (Arc::new(AtomicBool::new(false)), Arc::new(AtomicU64::new(0)));
    let done = Arc::new(std::sync::Mutex::new(Vec::new()));
    let clients: Vec<_> = (0..6)
        .map(|_| tokio::spawn(upgrade_client(old.port, old.key.clone(), stop.clone(), done.clone(), failed.clone())))
        .collect();
    tokio::time::sleep(Duration::from_millis(800)).await;

    // The new binary waits on the upgrade socket; SIGQUIT makes the old one hand the
    // listeners over, finish its streams and exit.
    old.name_ports_in_config();
    let log = std::fs::File::create(old.dir.join("gateway-new.log")).unwrap();
    let new = std::process::Command::new(env!("CARGO_BIN_EXE_tollgate"))
        .args(["serve", "--upgrade", "--config"])
        .arg(old.dir.join("tollgate.yaml"))
        .env("RUST_LOG", "info")
        .env_remove("TOLLGATE_ADMIN_TOKEN")
        .stdout(std::process::Stdio::null())
        .stderr(log)
        .spawn()
        .unwrap();
    let mut new = common::Proc::new(new);
    tokio::time::sleep(Duration::from_millis(500)).await;
    let in_flight_before = mock.stats().await["in_flight"].as_u64().unwrap();
    assert!(in_flight_before > 0, "streams are running when the upgrade starts");
    assert_eq!(unsafe { libc::kill(old.pid() as i32, libc::SIGQUIT) }, 0);
    tokio::time::sleep(Duration::from_millis(2500)).await;
    let served_by_new = std::fs::read_to_string(old.dir.join("gateway-new.log")).unwrap();
    stop.store(true, Ordering::Relaxed);
    for c in clients {
        c.await.unwrap();
    }
    let status = tokio::task::spawn_blocking(move || {
        let s = old.wait_exit(Duration::from_secs(15));
        (s, old)
    })
    .await
    .unwrap();
    let (exit, old) = status;
    assert!(exit.is_some(), "the old process exits after its grace period: {}", old.log());
    assert!(new.running(), "the new process runs on");
    assert_eq!(failed.load(Ordering::Relaxed), 0, "no request failed or was refused across the upgrade");
    let done = done.lock().unwrap().clone();
    assert!(done.len() >= 12, "the load ran: {} answers", done.len());
    assert!(served_by_new.contains("tollgate listening"), "{served_by_new}");

    // Every answered request is billed once, by whichever process served it.
    let ledger = old.settled_ledger();
    assert_eq!(ledger["held_cents"], 0, "no hold left: {ledger}");
    let settled: Vec<&str> = ledger["entries"]
        .as_array()
        .unwrap()
        .iter()
        .filter(|e| e["kind"] == "settlement")
        .map(|e| e["request_id"].as_str().unwrap())
        .collect();
    let unique: std::collections::HashSet<&str> = settled.iter().copied().collect();
    assert_eq!(unique.len(), settled.len(), "no request settled twice");
    for rid in &done {
        assert!(unique.contains(rid.as_str()), "request {rid} was answered but not billed");
    }
    drop(new);
}
