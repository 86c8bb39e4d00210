//! Hot reload of `models.yaml` and `upstreams.yaml` (admin route and SIGHUP) under load.

use super::*;

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
