//! The HTTP surface the core answers itself: routes, envelopes, request ids, trace header,
//! body limit, JSON errors, model reads, paused models and capability checks.
#![allow(clippy::unwrap_used, clippy::expect_used, clippy::panic)]

mod common;

use common::*;
use serde_json::json;

#[tokio::test]
async fn unknown_paths_doubled_v1_and_endpoint_base_urls_are_404_with_base_url() {
    let mock = Mock::start();
    let gw = Gateway::start(&mock);
    // A doubled `/v1` is not a messages route either (what the anthropic client sends with a
    // `/v1` base): every unknown path answers the chat envelope with `error.base_url`.
    for path in [
        "/v1/v1/chat/completions",
        "/v1/chat/completions/chat/completions",
        "/chat/completions",
        "/nope",
        "/v1/v1/messages",
        "/v1/v1/messages/count_tokens",
        "/messages",
    ] {
        let r = gw.post(path, &chat_body("chat-model", false), &[("x-api-key", gw.key.as_str())]).await;
        let v = r.assert_error(404, "unknown_endpoint");
        assert_eq!(v["error"]["type"], "not_found_error");
        assert_eq!(v["error"]["base_url"], format!("http://127.0.0.1:{}/v1", gw.port), "{path}");
        assert!(r.header("request-id").is_none(), "{path}: not a messages route");
    }
}

#[tokio::test]
async fn a_panic_in_a_phase_is_a_500_in_the_routes_envelope_and_the_worker_lives() {
    let mock = Mock::start();
    let panicking = |phase: &str| Opts { env: vec![("TOLLGATE_FAULT_PANIC", phase.to_string())], ..Opts::default() };
    let gw = Gateway::start_with(&mock, panicking("request"));
    for _ in 0..2 {
        let r = gw.post("/v1/chat/completions", &chat_body("chat-model", false), &[]).await;
        r.assert_error(500, "internal_error");
        let msg = json!({"model": "chat-model", "max_tokens": 5, "messages": [{"role": "user", "content": "hi"}]});
        let r = gw.post("/v1/messages", &msg, &[]).await;
        assert_eq!(r.status, 500, "{}", r.text);
        assert_eq!(r.json()["error"]["type"], "api_error", "{}", r.text);
        let r = gw.post("/v1/responses", &json!({"model": "chat-model", "input": "hi"}), &[]).await;
        r.assert_error(500, "internal_error");
    }
    assert_eq!(gw.get("/v1/models").await.status, 200, "the worker still serves");
    assert!(gw.log().contains("panic in the request phase"), "logged once with its message: {}", gw.log());
    // At the end of a non-streamed body: the held answer becomes the 500. In a stream that
    // already delivered output: an error frame ends it.
    let gw = Gateway::start_with(&mock, panicking("response_end"));
    let r = gw.post("/v1/chat/completions", &chat_body("chat-model", false), &[]).await;
    r.assert_error(500, "internal_error");
    let gw = Gateway::start_with(&mock, panicking("response_after_output"));
    let r = gw.post("/v1/chat/completions", &chat_body("chat-model", true), &[("x-mock-token-delay-ms", "20")]).await;
    assert_eq!(r.status, 200, "{}", r.text);
    let last = r.sse_data().last().cloned().unwrap_or_default();
    assert!(last.contains("\"error\""), "ends with an error frame: {}", r.text);
    assert!(!r.text.contains("[DONE]"));
    assert_eq!(gw.settled_ledger()["held_cents"], 0, "no hold left open");
}

#[tokio::test]
async fn wrong_method_is_405_with_allow() {
    let mock = Mock::start();
    let gw = Gateway::start(&mock);
    let r = gw.get("/v1/chat/completions").await;
    let v = r.assert_error(405, "method_not_allowed");
    assert_eq!(v["error"]["type"], "invalid_request_error");
    assert_eq!(r.header("allow").as_deref(), Some("POST"));
    let r = gw.post("/v1/models", &json!({}), &[]).await;
    r.assert_error(405, "method_not_allowed");
    assert_eq!(r.header("allow").as_deref(), Some("GET"));
}

#[tokio::test]
async fn request_ids_and_trace_header() {
    let mock = Mock::start();
    let gw = Gateway::start(&mock);
    let r =
        gw.post("/v1/chat/completions", &chat_body("chat-model", false), &[("x-client-request-id", "trace-42")]).await;
    assert_eq!(r.status, 200, "{}", r.text);
    assert!(r.header("x-request-id").is_some_and(|v| v.starts_with("req_")));
    assert_eq!(r.header("x-client-request-id").as_deref(), Some("trace-42"));
    let models = gw.get("/v1/models").await;
    assert!(models.header("x-request-id").is_some());

    let long = "a".repeat(513);
    for bad in ["   ", long.as_str()] {
        let r = gw.post("/v1/chat/completions", &chat_body("chat-model", false), &[("x-client-request-id", bad)]).await;
        let v = r.assert_error(400, "invalid_trace_header");
        assert_eq!(v["error"]["type"], "invalid_request_error");
    }
    let ok512 = "b".repeat(512);
    let r = gw
        .post("/v1/chat/completions", &chat_body("chat-model", false), &[("x-client-request-id", ok512.as_str())])
        .await;
    assert_eq!(r.status, 200);

    // Messages routes carry `request-id` beside `x-request-id`.
    let r = gw.post("/v1/messages", &json!("not an object"), &[]).await;
    assert_eq!(r.header("request-id"), r.header("x-request-id"));
    assert_eq!(r.json()["request_id"].as_str(), r.header("x-request-id").as_deref());
}

#[path = "http_surface/bodies.rs"]
mod bodies;
#[path = "http_surface/check_config.rs"]
mod check_config;
#[path = "http_surface/model_reads.rs"]
mod model_reads;
