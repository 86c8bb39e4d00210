//! Every upstream failure path: HTTP failures, refused connections, full replicas, budgets, malformed bodies.

use super::*;

#[tokio::test]
async fn upstream_http_failures_map_to_the_catalogue() {
    let mock = Mock::start();
    let gw = Gateway::start(&mock);
    let r = gw
        .post(
            "/v1/chat/completions",
            &chat_body("chat-model", false),
            &[("x-mock-status", "500"), ("x-mock-retry-after", "7")],
        )
        .await;
    r.assert_error(502, "upstream_http_error");
    assert_eq!(r.header("retry-after").as_deref(), Some("7"), "the replica's Retry-After is forwarded");
    let r = gw.post("/v1/chat/completions", &chat_body("chat-model", false), &[("x-mock-status", "503")]).await;
    r.assert_error(502, "upstream_http_error");
    assert!(r.header("retry-after").is_none());
    let r = gw.post("/v1/chat/completions", &chat_body("chat-model", true), &[("x-mock-status", "500")]).await;
    r.assert_error(502, "upstream_http_error");

    let refused = [("x-mock-status", "400"), ("x-mock-retry-after", "3")];
    let r = gw.post("/v1/chat/completions", &chat_body("chat-model", false), &refused).await;
    let v = r.assert_error(400, "upstream_error");
    assert_eq!(v["error"]["type"], "invalid_request_error");
    assert!(v["error"]["message"].as_str().unwrap().contains("mock failure"));
    assert!(r.header("retry-after").is_none(), "a 400 needs a changed request and carries no retry timing");
    // A refusal of the gateway itself (a replica's 401, 404, ...) is not the request's fault
    // (decision 181): the server side failed, streamed or not.
    for (status, stream) in [("404", false), ("401", true), ("403", false)] {
        let r = gw.post("/v1/chat/completions", &chat_body("chat-model", stream), &[("x-mock-status", status)]).await;
        let v = r.assert_error(502, "upstream_error");
        assert!(v["error"]["message"].as_str().unwrap().contains(&format!("HTTP {status}")), "{v}");
    }
    // A full replica is a capacity refusal the client may wait out, streamed or not.
    for stream in [false, true] {
        let full = [("x-mock-status", "429"), ("x-mock-retry-after", "3")];
        let r = gw.post("/v1/chat/completions", &chat_body("chat-model", stream), &full).await;
        let v = r.assert_error(429, "hosted_model_at_capacity");
        assert_eq!(v["error"]["type"], "rate_limit_error");
        assert_eq!(r.header("retry-after").as_deref(), Some("3"), "the replica's wait");
    }
    let r = gw.post("/v1/chat/completions", &chat_body("chat-model", false), &[("x-mock-status", "429")]).await;
    r.assert_error(429, "hosted_model_at_capacity");
    assert_eq!(r.header("retry-after").as_deref(), Some("1"));

    // Nothing listens on either replica of dead-model.
    let r = gw.post("/v1/chat/completions", &chat_body("dead-model", false), &[]).await;
    r.assert_error(503, "upstream_error");
    assert!(r.header("retry-after").is_some());
}

#[tokio::test]
async fn a_replica_that_refuses_connections_is_skipped() {
    let mock = Mock::start();
    let dead = format!("127.0.0.1:{}", closed_port());
    let gw = Gateway::start_with(&mock, Opts { chat_replicas: vec![dead, mock.addr()], ..Opts::default() });
    for _ in 0..4 {
        let r = gw.post("/v1/chat/completions", &chat_body("chat-model", false), &[]).await;
        assert_eq!(r.status, 200, "{}", r.text);
    }
}

#[tokio::test]
async fn full_replicas_answer_hosted_model_at_capacity() {
    let mock = Mock::start();
    let gw = Gateway::start(&mock);
    let url = gw.url("/v1/chat/completions");
    let bearer = gw.bearer();
    let hold = tokio::spawn(async move {
        reqwest::Client::new()
            .post(url)
            .header("authorization", bearer)
            .header("x-mock-ttft-ms", "1500")
            .json(&chat_body("tiny-pool-model", false))
            .send()
            .await
            .map(|r| r.status().as_u16())
    });
    tokio::time::sleep(std::time::Duration::from_millis(400)).await;
    let r = gw.post("/v1/chat/completions", &chat_body("tiny-pool-model", false), &[]).await;
    let v = r.assert_error(429, "hosted_model_at_capacity");
    assert_eq!(v["error"]["type"], "rate_limit_error");
    assert!(v["error"].get("limit").is_none());
    assert!(r.header("x-hosted-limit-scope").is_none());
    assert_eq!(hold.await.unwrap().unwrap(), 200);
    // The slot is released when the first request ends.
    let r = gw.post("/v1/chat/completions", &chat_body("tiny-pool-model", false), &[]).await;
    assert_eq!(r.status, 200);
}

#[tokio::test]
async fn response_budget_gives_504_and_first_token_budget_an_error_frame() {
    let mock = Mock::start();
    let gw = Gateway::start_with(&mock, Opts { response_seconds: 1.0, first_token_seconds: 0.5, ..Opts::default() });
    let t = std::time::Instant::now();
    let r = gw.post("/v1/chat/completions", &chat_body("chat-model", false), &[("x-mock-hang", "1")]).await;
    let v = r.assert_error(504, "hosted_inference_response_timeout");
    assert!(v["error"]["message"].as_str().unwrap().contains("set `stream: true`"), "{v}");
    assert!(r.header("retry-after").is_none());
    assert!(t.elapsed().as_secs_f64() < 5.0, "cut at the budget, not a read timeout");

    let r = gw.post("/v1/chat/completions", &chat_body("chat-model", true), &[("x-mock-ttft-ms", "3000")]).await;
    assert_eq!(r.status, 200);
    let (frames, done) = parse_frames(&r);
    assert!(!done);
    assert_eq!(frames.last().unwrap()["error"]["code"], "hosted_inference_response_timeout", "{}", r.text);
    // A stream is never told to stream (decision 185).
    let message = frames.last().unwrap()["error"]["message"].as_str().unwrap().to_string();
    assert!(!message.contains("stream: true") && message.contains("max_tokens"), "{message}");

    // A stream that keeps producing past the whole-response budget is cut too.
    let r = gw
        .post(
            "/v1/chat/completions",
            &chat_body("chat-model", true),
            &[("x-mock-tokens", "100"), ("x-mock-token-delay-ms", "50")],
        )
        .await;
    let (frames, done) = parse_frames(&r);
    assert!(!done);
    assert_eq!(frames.last().unwrap()["error"]["code"], "hosted_inference_response_timeout");
}

#[tokio::test]
async fn a_malformed_non_streamed_body_is_a_clean_502() {
    let mock = Mock::start();
    let gw = Gateway::start(&mock);
    // The answer is held until its body is judged (src/transport/held_output.rs), so the status can
    // still change: never `not json{`, never a 200.
    let r = gw.post("/v1/chat/completions", &chat_body("chat-model", false), &[("x-mock-malformed", "1")]).await;
    r.assert_error(502, "upstream_error");
    // The gateway still serves the next request.
    let ok = gw.post("/v1/chat/completions", &chat_body("chat-model", false), &[]).await;
    assert_eq!(ok.status, 200);
}

#[tokio::test]
async fn a_replica_that_refuses_a_connection_is_ejected_and_a_pool_without_one_answers_at_once() {
    let mock = Mock::start();
    let dead = format!("127.0.0.1:{}", closed_port());
    let gw = Gateway::start_with(&mock, Opts { chat_replicas: vec![dead.clone(), mock.addr()], ..Opts::default() });
    // Sixteen conversations: some prefer the dead replica; only the first of those finds out.
    for i in 0..16 {
        let mut b = chat_body("chat-model", false);
        b["messages"][0]["content"] = serde_json::json!(format!("conversation {i}"));
        let r = gw.post("/v1/chat/completions", &b, &[]).await;
        assert_eq!(r.status, 200, "{}", r.text);
    }
    let ejections = gw.log().matches(&format!("replica {dead} of chat-model ejected for 10 s (refused")).count();
    assert_eq!(ejections, 1, "ejected once, then skipped: {}", gw.log());
    let text = gw.metrics().await;
    assert!(text.contains(&format!("tollgate_replica_up{{model=\"chat-model\",replica=\"{dead}\"}} 0")), "{text}");

    // Both replicas of dead-model refuse: the first request finds out, the next is answered
    // at once without a connection attempt.
    gw.post("/v1/chat/completions", &chat_body("dead-model", false), &[]).await.assert_error(503, "upstream_error");
    let before = gw.log().matches("refused a connection").count();
    let started = std::time::Instant::now();
    let r = gw.post("/v1/chat/completions", &chat_body("dead-model", false), &[]).await;
    r.assert_error(503, "upstream_error");
    assert!(r.header("retry-after").is_some());
    assert!(
        started.elapsed() < std::time::Duration::from_secs(2),
        "answered at once (a generous bound; the log check below is exact)"
    );
    assert_eq!(gw.log().matches("refused a connection").count(), before, "no replica was tried");
}
