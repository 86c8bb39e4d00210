//! What the gateway does with a replica's answer that is not what it promised to be
//! (clarification 11: reached, then failed: `502 upstream_error`, uncharged, hold released)
//! and with an answer that has no billable output (spec, Usage object rules: it settles at
//! zero), on all three inference routes.
#![allow(clippy::unwrap_used, clippy::expect_used, clippy::panic)]

mod common;

use common::routes::body_for;
use common::*;
use serde_json::{Value, json};

const ROUTES: [&str; 3] = ["/v1/chat/completions", "/v1/messages", "/v1/responses"];

/// Assert a 502 `upstream_error` in the route's envelope.
fn assert_upstream_error(route: &str, r: &Reply, what: &str) {
    assert_eq!(r.status, 502, "{route} {what}: {}", r.text);
    let v = r.json();
    if route == "/v1/messages" {
        assert_eq!(v["type"], "error", "{route} {what}: {v}");
        assert_eq!(v["error"]["type"], "api_error", "{route} {what}: {v}");
    } else {
        assert_eq!(v["error"]["code"], "upstream_error", "{route} {what}: {v}");
    }
}

/// The balance is still `before` and no hold is left: nothing was charged.
fn assert_uncharged(gw: &Gateway, before: &Value) {
    let after = gw.settled_ledger();
    assert_eq!(&after["balance_cents"], before, "nothing charged: {after}");
    assert_eq!(after["held_cents"], 0, "every hold released: {after}");
}

const NOT_COMPLETIONS: [&str; 7] =
    ["", "not json{", "{\"foo\":1}", "{\"choices\":\"nope\"}", "{\"choices\":[1]}", "[]", "null"];

#[tokio::test]
async fn non_streamed_answers_that_are_not_completions_are_502_and_uncharged() {
    let mock = Mock::start();
    let gw = Gateway::start(&mock);
    let before = gw.settled_ledger()["balance_cents"].clone();
    for route in ROUTES {
        for raw in NOT_COMPLETIONS {
            let r = gw.post(route, &body_for(route, false), &[("x-mock-raw-body", raw)]).await;
            assert_upstream_error(route, &r, &format!("body {raw:?}"));
            // The same when the body arrives after the 200 header went out from the replica.
            let r = gw
                .post(route, &body_for(route, false), &[("x-mock-raw-body", raw), ("x-mock-body-delay-ms", "150")])
                .await;
            assert_upstream_error(route, &r, &format!("late body {raw:?}"));
        }
    }
    assert_uncharged(&gw, &before);
}

#[tokio::test]
async fn answers_that_cannot_carry_a_body_are_errors_never_a_silent_wait() {
    let mock = Mock::start();
    let gw = Gateway::start(&mock);
    for route in ROUTES {
        for (status, expect) in [("204", 502), ("200", 502), ("400", 400), ("422", 400)] {
            let what = format!("{route} {status} without a body");
            let headers = [("x-mock-raw-body", ""), ("x-mock-raw-status", status)];
            let r = tokio::time::timeout(
                std::time::Duration::from_secs(10),
                gw.post(route, &body_for(route, false), &headers),
            )
            .await
            .unwrap_or_else(|_| panic!("{what}: the client waited"));
            assert_eq!(r.status, expect, "{what}: {}", r.text);
            let v = r.json();
            if route == "/v1/messages" {
                assert_eq!(v["type"], "error", "{what}: {v}");
            } else {
                assert_eq!(v["error"]["code"], "upstream_error", "{what}: {v}");
            }
        }
    }
    assert_eq!(gw.settled_ledger()["held_cents"], 0);
}

#[tokio::test]
async fn a_good_body_after_a_late_header_is_delivered_whole() {
    let mock = Mock::start();
    let gw = Gateway::start(&mock);
    let completion = json!({"id": "c1", "object": "chat.completion", "created": 1, "model": "org/Chat-Model-7B",
        "choices": [{"index": 0, "message": {"role": "assistant", "content": "late"}, "finish_reason": "stop"}],
        "usage": {"prompt_tokens": 3, "completion_tokens": 1, "total_tokens": 4}})
    .to_string();
    let r = gw
        .post(
            "/v1/chat/completions",
            &chat_body("chat-model", false),
            &[("x-mock-raw-body", &completion), ("x-mock-body-delay-ms", "200")],
        )
        .await;
    assert_eq!(r.status, 200, "{}", r.text);
    let v = r.json();
    assert_eq!(v["choices"][0]["message"]["content"], "late");
    assert_eq!(v["model"], "chat-model");
    assert_eq!(v["usage"]["completion_tokens"], 1);
}

#[tokio::test]
async fn stream_frames_that_are_not_chat_chunks_end_with_an_error_frame_uncharged() {
    let mock = Mock::start();
    let gw = Gateway::start(&mock);
    let before = gw.settled_ledger()["balance_cents"].clone();
    for route in ROUTES {
        for frame in ["not json", "{\"foo\":1}", "{\"choices\":\"nope\"}", "[1,2]", "{\"choices\":[7]}"] {
            let r = gw.post(route, &body_for(route, true), &[("x-mock-raw-frame", frame)]).await;
            assert_eq!(r.status, 200, "{route} {frame}: the stream opened");
            assert!(!r.text.contains("[DONE]") && !r.text.contains("message_stop"), "{route} {frame}: {}", r.text);
            assert!(!r.text.contains(frame), "{route} {frame}: the bad frame is not forwarded: {}", r.text);
            let last = r.sse_data().last().cloned().unwrap_or_default();
            let v: Value = serde_json::from_str(&last).unwrap_or_else(|e| panic!("{route} {frame} ({e}): {}", r.text));
            let code = if route == "/v1/messages" { &v["error"]["type"] } else { &v["error"]["code"] };
            let code = code.as_str().or(v["response"]["error"]["code"].as_str());
            assert!(
                matches!(code, Some("upstream_error" | "api_error")),
                "{route} {frame}: ends with an upstream error: {}",
                r.text
            );
        }
    }
    let after = gw.settled_ledger();
    assert_eq!(after["balance_cents"], before, "nothing delivered, nothing charged: {after}");
}

#[tokio::test]
async fn a_completion_without_output_settles_at_zero() {
    let mock = Mock::start();
    let gw = Gateway::start(&mock);
    let before = gw.settled_ledger()["balance_cents"].as_i64().unwrap();
    // pricey-model: $10,000 per million output tokens, input free; 1,000 prompt tokens of a
    // priced input on chat-model would cost something, so use chat-model for the prompt price.
    let r = gw
        .post(
            "/v1/chat/completions",
            &chat_body("chat-model", false),
            &[("x-mock-tokens", "0"), ("x-mock-prompt-tokens", "30000")],
        )
        .await;
    assert_eq!(r.status, 200, "{}", r.text);
    let usage = &r.json()["usage"];
    assert_eq!(usage["completion_tokens"], 0, "{usage}");
    assert_eq!(usage["prompt_tokens"], 30000, "{usage}");
    assert_eq!(usage["cost"].as_f64(), Some(0.0), "no billable output: cost 0: {usage}");
    assert_eq!(usage["service"]["cost_microcents"], 0, "{usage}");
    // The same in a stream's usage frame.
    let r = gw
        .post(
            "/v1/chat/completions",
            &json!({"model": "chat-model", "stream": true, "stream_options": {"include_usage": true},
                    "messages": [{"role": "user", "content": "hi"}]}),
            &[("x-mock-tokens", "0"), ("x-mock-prompt-tokens", "30000")],
        )
        .await;
    let usage_frame = r.sse_data().into_iter().rfind(|d| d.contains("\"usage\"")).unwrap_or_default();
    let v: Value = serde_json::from_str(&usage_frame).unwrap_or_else(|e| panic!("{e}: {}", r.text));
    assert_eq!(v["usage"]["service"]["cost_microcents"], 0, "{v}");
    // Messages and Responses carry no cost field for credit-funded usage; the ledger shows it.
    for route in ["/v1/messages", "/v1/responses"] {
        let r =
            gw.post(route, &body_for(route, false), &[("x-mock-tokens", "0"), ("x-mock-prompt-tokens", "30000")]).await;
        assert_eq!(r.status, 200, "{route}: {}", r.text);
    }
    let after = gw.settled_ledger();
    assert_eq!(after["balance_cents"].as_i64(), Some(before), "nothing debited: {after}");
    // A completion with output and the same prompt is charged (the rule above is what kept it free).
    let r = gw
        .post(
            "/v1/chat/completions",
            &chat_body("chat-model", false),
            &[("x-mock-tokens", "1"), ("x-mock-prompt-tokens", "30000")],
        )
        .await;
    assert!(r.json()["usage"]["service"]["cost_microcents"].as_u64().unwrap() >= 300_000, "{}", r.text);
}

/// A stream given for a whole answer, or a whole answer for a stream, is not an answer the
/// client can read: `502 upstream_error`, uncharged, on every route (decision 180).
#[tokio::test]
async fn an_answer_in_the_other_form_is_502_and_uncharged() {
    let mock = Mock::start();
    let gw = Gateway::start(&mock);
    let before = gw.settled_ledger()["balance_cents"].clone();
    let completion = r#"{"id":"c1","object":"chat.completion","created":1,"model":"org/Chat-Model-7B","choices":[{"index":0,"message":{"role":"assistant","content":"hello"},"finish_reason":"stop"}],"usage":{"prompt_tokens":5,"completion_tokens":2,"total_tokens":7}}"#;
    let frame = r#"{"id":"c1","object":"chat.completion.chunk","created":1,"model":"org/Chat-Model-7B","choices":[{"index":0,"delta":{"content":"hello"},"finish_reason":null}]}"#;
    for route in ROUTES {
        let r = gw.post(route, &body_for(route, false), &[("x-mock-raw-frame", frame)]).await;
        assert_upstream_error(route, &r, "a stream for a whole answer");
        let r = gw.post(route, &body_for(route, true), &[("x-mock-raw-body", completion)]).await;
        assert_upstream_error(route, &r, "a whole answer for a stream");
    }
    assert_uncharged(&gw, &before);
}

/// A replica's usage report is believed only up to what the request allowed: output at most
/// its `max_tokens` (decision 180). Here it claims a trillion tokens for a 2-token answer.
#[tokio::test]
async fn a_usage_report_above_the_output_ceiling_is_billed_at_the_ceiling() {
    let mock = Mock::start();
    let gw = Gateway::start(&mock);
    let inflated = r#"{"id":"c1","object":"chat.completion","created":1,"model":"org/Chat-Model-7B","choices":[{"index":0,"message":{"role":"assistant","content":"hello"},"finish_reason":"stop"}],"usage":{"prompt_tokens":5,"completion_tokens":1000000000000,"total_tokens":1000000000005}}"#;
    let mut body = chat_body("chat-model", false);
    body["max_tokens"] = json!(50);
    let r = gw.post("/v1/chat/completions", &body, &[("x-mock-raw-body", inflated)]).await;
    assert_eq!(r.status, 200, "{}", r.text);
    let usage = r.json()["usage"].clone();
    assert_eq!((usage["completion_tokens"].as_u64(), usage["total_tokens"].as_u64()), (Some(50), Some(55)), "{usage}");
    let l = gw.settled_ledger();
    assert!(l["balance_cents"].as_i64().unwrap() >= 0, "no runaway debit: {l}");
    assert_eq!(l["held_cents"], 0, "{l}");
}

/// The ledger's settlements with a cost (one per request billed for output).
fn paid_settlements(l: &Value) -> usize {
    let entries = l["entries"].as_array().map(Vec::as_slice).unwrap_or_default();
    entries.iter().filter(|e| e["kind"] == "settlement" && e["cost_microcents"].as_i64() > Some(0)).count()
}

/// A replica whose stream ended (`[DONE]`) but whose HTTP body then did not: it cut the
/// connection without the chunked terminator, or held it open. The client already has the
/// whole answer: its body ends cleanly (a client reading to the end gets no error), within
/// the tail grace rather than the response budget, and the request is billed as completed.
#[tokio::test]
async fn a_replica_body_that_does_not_end_after_the_stream_still_ends_the_clients_cleanly() {
    let mock = Mock::start();
    let gw = Gateway::start(&mock);
    let end_of_stream = |route: &str| match route {
        "/v1/messages" => "event: message_stop",
        "/v1/responses" => "event: response.completed",
        _ => "data: [DONE]",
    };
    for route in ROUTES {
        for after in ["cut", "hold"] {
            let what = format!("{route} after-done {after}");
            let before = paid_settlements(&gw.settled_ledger());
            let started = std::time::Instant::now();
            let r = reqwest::Client::new()
                .post(gw.url(route))
                .header("authorization", gw.bearer())
                .header("x-mock-after-done", after)
                .json(&body_for(route, true))
                .send()
                .await
                .unwrap();
            assert_eq!(r.status(), 200, "{what}");
            let rid = r.headers()["x-request-id"].to_str().unwrap().to_string();
            // `text()` fails on a chunked body cut short (no terminator).
            let text = r.text().await.unwrap_or_else(|e| panic!("{what}: the body did not end cleanly: {e}"));
            assert!(
                started.elapsed() < std::time::Duration::from_secs(10),
                "{what}: the client waited {:?} (response budget 30 s)",
                started.elapsed()
            );
            assert!(text.contains(end_of_stream(route)), "{what}: {text}");
            for failure in ["upstream_", "response.failed", "event: error"] {
                assert!(!text.contains(failure), "{what}: no error frame after a complete stream: {text}");
            }
            let l = gw.settled_ledger();
            assert_eq!(paid_settlements(&l), before + 1, "{what}: billed as completed: {l}");
            assert_eq!(l["held_cents"], 0, "{what}: {l}");
            // A completed request: no failure code in its access line.
            let access = format!("{rid} POST {route} status=200 code=- ");
            assert!(gw.log().contains(&access), "{what}: no `{access}` in the log:\n{}", gw.log());
        }
    }
    // Each named once as the replica's fault (WARN), never as a failed proxy (ERROR).
    let log = gw.log();
    assert_eq!(log.matches("did not end cleanly after its stream ended").count(), 3, "cut: {log}");
    assert_eq!(log.matches("did not end within 1s after its stream ended").count(), 3, "hold: {log}");
    assert!(!log.contains("Fail to proxy"), "{log}");

    // A stream that ended in the gateway's error frame (the replica reported a failure) while
    // the replica then held its body open: the client's body still ends, uncharged.
    let before = gw.settled_ledger();
    let started = std::time::Instant::now();
    let r = reqwest::Client::new()
        .post(gw.url("/v1/chat/completions"))
        .header("authorization", gw.bearer())
        .header("x-mock-raw-frame", r#"{"error":{"message":"boom"}}"#)
        .header("x-mock-after-done", "hold")
        .json(&body_for("/v1/chat/completions", true))
        .send()
        .await
        .unwrap();
    let text = r.text().await.unwrap_or_else(|e| panic!("error frame then hold: the body did not end: {e}"));
    assert!(started.elapsed() < std::time::Duration::from_secs(10), "waited {:?}", started.elapsed());
    assert!(text.contains("\"upstream_error\"") && !text.contains("[DONE]"), "{text}");
    let l = gw.settled_ledger();
    assert_eq!(paid_settlements(&l), paid_settlements(&before), "nothing charged: {l}");
    assert_eq!(l["held_cents"], 0, "{l}");
}
