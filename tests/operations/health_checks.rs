//! Active replica health checks: a failing replica taken out of service and brought back.

use super::*;

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
