//! Operations through the real binary (issue 16): active replica health checks, hot reload of
//! `models.yaml` and `upstreams.yaml` (admin route and SIGHUP) under load.
#![allow(clippy::unwrap_used, clippy::expect_used, clippy::panic)]

mod common;

use std::sync::Arc;
use std::sync::atomic::{AtomicBool, AtomicU64, Ordering};
use std::time::{Duration, Instant};

use common::{Gateway, Mock, Opts, chat_body};
use serde_json::{Value, json};

const HEALTH: &str =
    "    health_check: { path: /health, interval_ms: 100, timeout_ms: 100, unhealthy_after: 2, healthy_after: 2 }\n";

async fn set_health(mock: &Mock, status: u16) {
    let r = reqwest::Client::new()
        .post(format!("http://{}/mock/health?status={status}", mock.addr()))
        .send()
        .await
        .unwrap();
    assert_eq!(r.status(), 200);
}

/// The chat pool's replica at `addr` in `GET /admin/v1/health`.
fn replica_health(gw: &Gateway, addr: &str) -> Value {
    let (s, v) = gw.admin("GET", "/admin/v1/health", None);
    assert_eq!(s, 200, "{v}");
    v["pools"]["chat-model"]["replicas"]
        .as_array()
        .unwrap()
        .iter()
        .find(|r| r["address"] == addr)
        .cloned()
        .unwrap_or_else(|| panic!("{addr} not in {v}"))
}

fn wait_for(what: &str, within: Duration, mut cond: impl FnMut() -> bool) {
    let deadline = Instant::now() + within;
    while !cond() {
        assert!(Instant::now() < deadline, "timed out waiting for {what}");
        std::thread::sleep(Duration::from_millis(50));
    }
}

async fn requests_of(mock: &Mock) -> u64 {
    mock.stats().await["requests"].as_u64().unwrap()
}

#[tokio::test(flavor = "multi_thread")]
async fn health_checks_take_a_failing_replica_out_and_bring_it_back() {
    let (a, b) = (Mock::start(), Mock::start());
    let opts = Opts { chat_replicas: vec![a.addr(), b.addr()], chat_pool_extra: HEALTH.into(), ..Opts::default() };
    let gw = Gateway::start_with(&a, opts);
    wait_for("the first checks", Duration::from_secs(5), || replica_health(&gw, &b.addr())["checks"] == "passing");
    assert!(b.stats().await["health_checks"].as_u64().unwrap() >= 1, "the replica was asked GET /health");

    set_health(&b, 503).await;
    wait_for("b out of service", Duration::from_secs(5), || replica_health(&gw, &b.addr())["up"] == false);
    let seen = replica_health(&gw, &b.addr());
    assert_eq!(seen["checks"], "failing", "{seen}");
    assert_eq!(seen["last_error"], "status 503", "{seen}");
    assert!(
        gw.metrics().await.contains(&format!("tollgate_replica_up{{model=\"chat-model\",replica=\"{}\"}} 0", b.addr()))
    );
    let before = requests_of(&b).await;
    for i in 0..24 {
        let body =
            json!({"model": "chat-model", "messages": [{"role": "user", "content": format!("conversation {i}")}]});
        let r = gw.post("/v1/chat/completions", &body, &[]).await;
        assert_eq!(r.status, 200, "{}", r.text);
    }
    assert_eq!(requests_of(&b).await, before, "a replica failing its checks gets no new request");

    // Both down: the pool answers the spec's 503 at once, without trying a replica.
    set_health(&a, 500).await;
    wait_for("a out of service", Duration::from_secs(5), || replica_health(&gw, &a.addr())["up"] == false);
    let (ra, rb) = (requests_of(&a).await, requests_of(&b).await);
    let started = Instant::now();
    let r = gw.post("/v1/chat/completions", &chat_body("chat-model", false), &[]).await;
    r.assert_error(503, "upstream_error");
    assert!(started.elapsed() < Duration::from_secs(2), "answered fast: {:?}", started.elapsed());
    assert_eq!((requests_of(&a).await, requests_of(&b).await), (ra, rb), "no replica was tried");
    let (_, v) = gw.admin("GET", "/admin/v1/health", None);
    assert_eq!(v["pools"]["chat-model"]["status"], "down", "{v}");
    assert_eq!(v["status"], "ok", "replica health does not fail the node's health: {v}");

    set_health(&a, 200).await;
    set_health(&b, 200).await;
    wait_for("b back", Duration::from_secs(5), || replica_health(&gw, &b.addr())["up"] == true);
    wait_for("a back", Duration::from_secs(5), || replica_health(&gw, &a.addr())["up"] == true);
    let before = requests_of(&b).await;
    for i in 0..24 {
        // New conversations (the earlier ones stay where they were placed), spread by
        // their opening messages.
        let body =
            json!({"model": "chat-model", "messages": [{"role": "user", "content": format!("after the return {i}")}]});
        let r = gw.post("/v1/chat/completions", &body, &[]).await;
        assert_eq!(r.status, 200, "{}", r.text);
    }
    assert!(requests_of(&b).await > before, "a replica passing its checks again takes requests");
    assert!(gw.log().contains("back in service"), "the return is logged");
}

/// `upstreams.yaml` with `chat-model` on `replicas` (the rest of the file as the harness wrote it).
fn with_chat_replicas(original: &str, replicas: &[String]) -> String {
    let mut out = String::new();
    let mut skipping = false;
    for line in original.lines() {
        if line == "  chat-model:" {
            out.push_str(line);
            out.push_str("\n    upstream_model: org/Chat-Model-7B\n    replicas:\n");
            for r in replicas {
                out.push_str(&format!("      - {{ address: \"{r}\", max_concurrency: 64 }}\n"));
            }
            skipping = true;
            continue;
        }
        if skipping && line.starts_with("    ") {
            continue;
        }
        skipping = false;
        out.push_str(line);
        out.push('\n');
    }
    out
}

/// One client of the steady load: alternately a non-streamed and a streamed chat request,
/// counting answers that are not a complete 200.
async fn steady_client(gw: Arc<Gateway>, stop: Arc<AtomicBool>, ok: Arc<AtomicU64>, failed: Arc<AtomicU64>) {
    let mut n = 0u64;
    while !stop.load(Ordering::Relaxed) {
        n += 1;
        let stream = n % 2 == 0;
        // Distinct conversations, so both replicas serve while both are in the pool.
        let body = json!({"model": "chat-model", "stream": stream, "messages": [{"role": "user", "content": format!("turn {n} {:p}", &n)}]});
        let r = gw.post("/v1/chat/completions", &body, &[("x-mock-tokens", "8"), ("x-mock-token-delay-ms", "5")]).await;
        let complete = r.status == 200 && (!stream || r.text.contains("data: [DONE]"));
        if complete {
            ok.fetch_add(1, Ordering::Relaxed);
        } else {
            failed.fetch_add(1, Ordering::Relaxed);
            eprintln!("failed under reload: {} {}", r.status, r.text);
        }
    }
}

#[tokio::test(flavor = "multi_thread")]
async fn twenty_reloads_under_load_fail_no_request() {
    let (a, b) = (Mock::start(), Mock::start());
    let gw = Arc::new(Gateway::start_with(&a, Opts::default()));
    let upstreams = gw.dir.join("upstreams.yaml");
    let original = std::fs::read_to_string(&upstreams).unwrap();
    let (stop, ok, failed) =
        (Arc::new(AtomicBool::new(false)), Arc::new(AtomicU64::new(0)), Arc::new(AtomicU64::new(0)));
    let clients: Vec<_> =
        (0..6).map(|_| tokio::spawn(steady_client(gw.clone(), stop.clone(), ok.clone(), failed.clone()))).collect();
    for i in 0..20 {
        // Alternate: the pool on both replicas, then on `b` alone (`a` removed: it drains).
        let replicas = if i % 2 == 0 { vec![a.addr(), b.addr()] } else { vec![b.addr()] };
        std::fs::write(&upstreams, with_chat_replicas(&original, &replicas)).unwrap();
        let gw2 = gw.clone();
        let (s, v) = tokio::task::spawn_blocking(move || gw2.admin("POST", "/admin/v1/reload", None)).await.unwrap();
        assert_eq!(s, 200, "{v}");
        assert_eq!(v["status"], "reloaded");
        if i % 2 == 1 {
            assert_eq!(v["replicas_draining"], json!([format!("chat-model {}", a.addr())]), "{v}");
        }
        tokio::time::sleep(Duration::from_millis(150)).await;
    }
    stop.store(true, Ordering::Relaxed);
    for c in clients {
        c.await.unwrap();
    }
    assert_eq!(failed.load(Ordering::Relaxed), 0, "no request failed across 20 reloads");
    assert!(ok.load(Ordering::Relaxed) >= 40, "the load ran: {} answers", ok.load(Ordering::Relaxed));
    // The last reload left `b` alone: new requests go there only.
    let before = requests_of(&a).await;
    for _ in 0..5 {
        assert_eq!(gw.post("/v1/chat/completions", &chat_body("chat-model", false), &[]).await.status, 200);
    }
    assert_eq!(requests_of(&a).await, before, "a removed replica gets no new request");
    let ledger = gw.settled_ledger();
    assert_eq!(ledger["check"]["consistent"], true);
}

#[tokio::test(flavor = "multi_thread")]
async fn a_bad_file_keeps_the_running_config_and_sighup_reloads_a_good_one() {
    let mock = Mock::start();
    let gw = Gateway::start(&mock);
    // An operator pause survives reloads.
    let (s, v) =
        gw.admin("POST", "/admin/v1/models/stream-model/pause", Some(json!({"until": "2099-01-01T00:00:00Z"})));
    assert_eq!(s, 200, "{v}");
    let models = gw.dir.join("models.yaml");
    let upstreams = gw.dir.join("upstreams.yaml");
    let good_models = std::fs::read_to_string(&models).unwrap();
    let good_upstreams = std::fs::read_to_string(&upstreams).unwrap();

    // A typo in upstreams.yaml: 422 naming file and field; nothing changes.
    std::fs::write(&upstreams, good_upstreams.replacen("max_concurrency: 64", "max_concurrency: 0", 1)).unwrap();
    let (s, v) = gw.admin("POST", "/admin/v1/reload", None);
    assert_eq!(s, 422, "{v}");
    assert_eq!(v["error"]["code"], "invalid_config");
    let problem = &v["error"]["problems"][0];
    assert!(problem["file"].as_str().unwrap().ends_with("upstreams.yaml"), "{v}");
    assert!(problem["field"].as_str().unwrap().ends_with(".max_concurrency"), "{v}");
    assert_eq!(gw.post("/v1/chat/completions", &chat_body("chat-model", false), &[]).await.status, 200);
    assert!(gw.metrics().await.contains("tollgate_config_reloads_total{outcome=\"invalid\"} 1"));

    // A new model and its pool, put in force by SIGHUP.
    std::fs::write(
        &upstreams,
        format!(
            "{good_upstreams}  added-model:\n    replicas:\n      - {{ address: \"{}\", max_concurrency: 8 }}\n",
            mock.addr()
        ),
    )
    .unwrap();
    std::fs::write(&models, format!("{good_models}  - id: added-model\n    supported_endpoints: [chat_completions]\n    max_output_tokens: 1024\n    pricing: {{ input: 100, output: 200 }}\n")).unwrap();
    let r = gw.post("/v1/chat/completions", &chat_body("added-model", false), &[]).await;
    assert_eq!(r.status, 404, "not served before the reload: {}", r.text);
    assert_eq!(unsafe { libc::kill(gw.pid() as i32, libc::SIGHUP) }, 0);
    wait_for("the SIGHUP reload", Duration::from_secs(5), || gw.log().contains("config reloaded"));
    let r = gw.post("/v1/chat/completions", &chat_body("added-model", false), &[]).await;
    assert_eq!(r.status, 200, "served after SIGHUP: {}", r.text);
    assert_eq!(r.json()["model"], "added-model");
    assert!(gw.get("/v1/models").await.text.contains("\"added-model\""));
    let r = gw.post("/v1/chat/completions", &chat_body("stream-model", false), &[]).await;
    r.assert_error(503, "hosted_model_paused");
    assert!(gw.metrics().await.contains("tollgate_config_reloads_total{outcome=\"ok\"} 1"));

    // A tollgate.yaml that would no longer load is said at the reload, not at the next start
    // (decision 176); the reload of the operator files itself goes on.
    let settings = gw.dir.join("tollgate.yaml");
    let text = std::fs::read_to_string(&settings).unwrap();
    std::fs::write(&settings, format!("{text}threads: many\n")).unwrap();
    let (s, v) = gw.admin("POST", "/admin/v1/reload", None);
    assert_eq!(
        (s, v["status"].as_str(), v["settings_file_changed"].as_bool()),
        (200, Some("reloaded"), Some(true)),
        "{v}"
    );
    let problems = v["settings_file_problems"].to_string();
    assert!(problems.contains("tollgate.yaml") && problems.contains("threads"), "{v}");
    assert!(gw.log().contains("the next start would be refused"), "{}", gw.log());
    std::fs::write(&settings, text).unwrap();
    let (s, v) = gw.admin("POST", "/admin/v1/reload", None);
    assert_eq!(s, 200, "{v}");
    assert!(v.get("settings_file_problems").is_none(), "a loadable file has none: {v}");
}

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

/// A chat stream of `tokens` tokens, one every `delay_ms`, started and seen by the replica;
/// the task answers (status, request id, body).
async fn stream_reaching_the_replica(
    gw: &Gateway,
    mock: &Mock,
    tokens: u32,
    delay_ms: u32,
) -> tokio::task::JoinHandle<(u16, String, String)> {
    let sent = reqwest::Client::new()
        .post(gw.url("/v1/chat/completions"))
        .bearer_auth(&gw.key)
        .header("x-mock-tokens", tokens.to_string())
        .header("x-mock-token-delay-ms", delay_ms.to_string())
        .json(&chat_body("chat-model", true))
        .send();
    let stream = tokio::spawn(async move {
        let r = sent.await.unwrap();
        let rid = r.headers()["x-request-id"].to_str().unwrap().to_string();
        (r.status().as_u16(), rid, r.text().await.unwrap())
    });
    let deadline = Instant::now() + Duration::from_secs(5);
    while requests_of(mock).await == 0 {
        assert!(Instant::now() < deadline, "the stream reached the replica");
        tokio::time::sleep(Duration::from_millis(20)).await;
    }
    stream
}

/// A graceful stop (SIGTERM) lets the stream in flight finish and settle, then ends the
/// process within a quiet second instead of sleeping out the grace period (decision 166).
#[tokio::test(flavor = "multi_thread")]
async fn a_graceful_stop_finishes_the_stream_in_flight_then_exits_without_waiting_out_the_grace() {
    let mock = Mock::start();
    let grace = Duration::from_secs(60);
    let mut gw = Gateway::start_with(&mock, Opts { grace_seconds: grace.as_secs(), ..Opts::default() });
    let stream = stream_reaching_the_replica(&gw, &mock, 40, 60).await;
    let signalled = Instant::now();
    assert_eq!(unsafe { libc::kill(gw.pid() as i32, libc::SIGTERM) }, 0);

    // The stream (about 2.4 s, longer than the quiet second) runs to its end.
    let (status, rid, text) = stream.await.unwrap();
    assert_eq!(status, 200, "{text}");
    assert!(text.contains("data: [DONE]"), "the stream ended whole: {text}");
    let streamed = signalled.elapsed();
    assert!(streamed >= Duration::from_millis(1500), "the stream outlived the quiet second: {streamed:?}");

    let dir = gw.dir.clone();
    let (exit, gw) = tokio::task::spawn_blocking(move || (gw.wait_exit(Duration::from_secs(20)), gw)).await.unwrap();
    let stopped = signalled.elapsed();
    assert!(exit.is_some_and(|s| s.success()), "the process ended cleanly: {exit:?} {}", gw.log());
    assert!(stopped < grace / 2, "ended well before the {grace:?} grace period: {stopped:?}");
    assert!(gw.log().contains("graceful stop: nothing left in flight"), "{}", gw.log());

    // The stream's settlement reached the ledger before the process ended.
    assert_settled_on_its_store(&mock, Opts::default(), dir, &gw.workspace, &rid);
}

/// Request `rid` of `workspace` is settled and no hold is left, as a new gateway on the
/// stopped one's store (`dir`, `opts`) reads its ledger.
fn assert_settled_on_its_store(mock: &Mock, opts: Opts, dir: std::path::PathBuf, workspace: &str, rid: &str) {
    let mut after = Gateway::start_in(mock, opts, dir);
    after.workspace = workspace.to_string();
    let ledger = after.settled_ledger();
    assert_eq!(ledger["held_cents"], 0, "no hold left: {ledger}");
    let settled =
        ledger["entries"].as_array().unwrap().iter().any(|e| e["kind"] == "settlement" && e["request_id"] == rid);
    assert!(settled, "request {rid} settled before the process ended: {ledger}");
}

/// A graceful stop also waits for work a request left behind: here its settlement, held up by
/// a lock on the workspace's row, keeps the process up until it is recorded (decision 166).
#[tokio::test(flavor = "multi_thread")]
async fn a_graceful_stop_waits_for_a_settlement_the_ledger_has_not_recorded_yet() {
    let mock = Mock::start();
    let db = common::pg::fresh_database().await;
    let opts = Opts { postgres_url: Some(db.clone()), grace_seconds: 60, ..Opts::default() };
    let mut gw = Gateway::start_with(&mock, opts.clone());
    let stream = stream_reaching_the_replica(&gw, &mock, 10, 80).await; // its hold is placed
    // The ledger's batch locks the workspace's row: while the test holds it, the settlement waits.
    let (client, conn) = tokio_postgres::connect(&db, tokio_postgres::NoTls).await.unwrap();
    tokio::spawn(conn);
    client.batch_execute("BEGIN").await.unwrap();
    client.query("SELECT id FROM workspaces WHERE id = $1 FOR UPDATE", &[&gw.workspace]).await.unwrap();
    let (status, rid, text) = stream.await.unwrap();
    assert!(status == 200 && text.contains("data: [DONE]"), "{status} {text}");

    assert_eq!(unsafe { libc::kill(gw.pid() as i32, libc::SIGTERM) }, 0);
    tokio::time::sleep(Duration::from_millis(2500)).await;
    assert!(gw.exited().is_none(), "still up while its settlement waits: {}", gw.log());
    client.batch_execute("COMMIT").await.unwrap();
    let (exit, gw) = tokio::task::spawn_blocking(move || (gw.wait_exit(Duration::from_secs(20)), gw)).await.unwrap();
    assert!(exit.is_some_and(|s| s.success()), "ended once it was recorded: {exit:?} {}", gw.log());

    assert_settled_on_its_store(&mock, opts, gw.dir.clone(), &gw.workspace, &rid);
}

/// A graceful stop gives back the instance's unused lease (decision 187): the store it
/// leaves holds nothing, so the next process (or another instance) can spend all of it.
#[tokio::test(flavor = "multi_thread")]
async fn a_graceful_stop_leaves_no_lease_held() {
    let mock = Mock::start();
    let mut gw = Gateway::start_with(&mock, Opts { grace_seconds: 60, ..Opts::default() });
    let credits = format!("/admin/v1/workspaces/{}/credits", gw.workspace);
    let (s, v) = gw.admin("POST", &credits, Some(json!({"amount_cents": 100_000, "source": "purchase"})));
    assert_eq!(s, 201, "{v}");
    // pricey-model: a cent per output token, so each request holds 20 cents; the first one
    // asks for a lease.
    let mut body = chat_body("pricey-model", false);
    body["max_tokens"] = json!(20);
    let ledger = format!("/admin/v1/workspaces/{}/ledger", gw.workspace);
    let mut leased = 0;
    for _ in 0..20 {
        assert_eq!(gw.post("/v1/chat/completions", &body, &[("x-mock-tokens", "5")]).await.status, 200);
        leased = gw.admin("GET", &ledger, None).1["leased_cents"].as_i64().unwrap();
        if leased > 0 {
            break;
        }
        tokio::time::sleep(Duration::from_millis(20)).await;
    }
    assert!(leased > 0, "a lease was granted");
    assert_eq!(unsafe { libc::kill(gw.pid() as i32, libc::SIGTERM) }, 0);
    let (exit, gw) = tokio::task::spawn_blocking(move || (gw.wait_exit(Duration::from_secs(20)), gw)).await.unwrap();
    assert!(exit.is_some_and(|s| s.success()), "{exit:?} {}", gw.log());

    let mut after = Gateway::start_in(&mock, Opts::default(), gw.dir.clone());
    after.workspace = gw.workspace.clone();
    let v = after.settled_ledger();
    let stopped = gw.log();
    assert_eq!((v["held_cents"].as_i64(), v["leased_cents"].as_i64()), (Some(0), Some(0)), "{v}\n{stopped}");
    assert_eq!(v["check"]["stored_balance_cents"], v["balance_cents"], "nothing held in the store: {v}");
}
