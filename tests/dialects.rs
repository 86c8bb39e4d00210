//! The messages dialect, count_tokens and the Responses adapter through the gateway, on the
//! chat serving path against the mock replica.
#![allow(clippy::unwrap_used, clippy::expect_used, clippy::panic)]

mod common;

use common::*;
use serde_json::{Value, json};

fn msg_body(stream: bool) -> Value {
    json!({"model": "chat-model", "max_tokens": 8, "stream": stream,
           "system": "Be brief.", "messages": [{"role": "user", "content": "hi"}]})
}

/// (event name, data) pairs of an event-named SSE body.
fn events(text: &str) -> Vec<(String, Value)> {
    text.split("\n\n")
        .filter(|f| !f.trim().is_empty())
        .map(|f| {
            let name = f.lines().find_map(|l| l.strip_prefix("event: ")).unwrap_or("").to_string();
            let data = f.lines().find_map(|l| l.strip_prefix("data: ")).unwrap_or("null");
            (name, serde_json::from_str(data).unwrap_or(Value::Null))
        })
        .collect()
}

#[tokio::test]
async fn messages_non_streaming_with_thinking_and_usage() {
    let mock = Mock::start();
    let gw = Gateway::start(&mock);
    let headers = [
        ("x-api-key", gw.key.as_str()),
        ("anthropic-version", "2023-06-01"),
        ("x-mock-reasoning", "2"),
        ("x-mock-tokens", "5"),
        ("x-mock-cached-tokens", "0"),
    ];
    let r = gw.post_as("/v1/messages", &msg_body(false), &headers).await;
    assert_eq!(r.status, 200, "{}", r.text);
    assert_eq!(r.header("anthropic-version").as_deref(), Some("2023-06-01"));
    assert_eq!(r.header("request-id"), r.header("x-request-id"));
    let v = r.json();
    assert_eq!(v["type"], "message");
    assert_eq!(v["role"], "assistant");
    assert_eq!(v["model"], "chat-model");
    let kinds: Vec<&str> = v["content"].as_array().unwrap().iter().map(|b| b["type"].as_str().unwrap()).collect();
    assert_eq!(kinds, vec!["thinking", "text"], "thinking first");
    assert!(!v["content"][0]["signature"].as_str().unwrap().is_empty());
    assert_eq!(v["content"][1]["text"], "tok2 tok3 tok4 ");
    assert_eq!(v["stop_reason"], "end_turn");
    assert!(v["stop_sequence"].is_null());
    let u = &v["usage"];
    assert_eq!(u["output_tokens"], 5);
    assert_eq!(u["cache_creation_input_tokens"], 0);
    assert!(u.get("cost").is_none(), "credit-funded usage carries the four counters only");
    // The replica got a chat request with the system prompt first and the upstream name.
    let seen = mock.last_request().await;
    assert_eq!(seen["path"], "/v1/chat/completions");
    assert_eq!(seen["body"]["model"], "org/Chat-Model-7B");
    assert_eq!(seen["body"]["messages"][0]["role"], "system");
    assert_eq!(seen["body"]["max_tokens"], 8);
}

#[tokio::test]
async fn messages_stream_has_the_event_order_and_no_done() {
    let mock = Mock::start();
    let gw = Gateway::start(&mock);
    let r =
        gw.post_as("/v1/messages", &msg_body(true), &[("x-api-key", gw.key.as_str()), ("x-mock-tokens", "3")]).await;
    assert_eq!(r.status, 200, "{}", r.text);
    assert!(r.header("content-type").unwrap().starts_with("text/event-stream"));
    assert!(!r.text.contains("[DONE]"));
    let ev = events(&r.text);
    let names: Vec<&str> = ev.iter().map(|(n, _)| n.as_str()).collect();
    assert_eq!(names.first(), Some(&"message_start"));
    assert_eq!(names.last(), Some(&"message_stop"));
    let delta = ev.iter().find(|(n, _)| n == "message_delta").expect("message_delta");
    assert_eq!(delta.1["delta"]["stop_reason"], "end_turn");
    assert_eq!(delta.1["usage"]["output_tokens"], 3);
    let text: String = ev
        .iter()
        .filter(|(n, d)| n == "content_block_delta" && d["delta"]["type"] == "text_delta")
        .map(|(_, d)| d["delta"]["text"].as_str().unwrap().to_string())
        .collect();
    assert_eq!(text, "tok0 tok1 tok2 ");
    assert!(
        names.iter().position(|n| *n == "content_block_start") < names.iter().position(|n| *n == "content_block_delta")
    );
}

#[tokio::test]
async fn messages_errors_use_the_messages_envelope() {
    let mock = Mock::start();
    let gw = Gateway::start(&mock);
    let key = [("x-api-key", gw.key.as_str())];
    let mut b = msg_body(false);
    b.as_object_mut().unwrap().remove("max_tokens");
    let r = gw.post_as("/v1/messages", &b, &key).await;
    assert_eq!(r.status, 400);
    let v = r.json();
    assert_eq!((v["type"].as_str(), v["error"]["type"].as_str()), (Some("error"), Some("invalid_request_error")));
    assert!(v["error"].get("code").is_none());
    let mut b = msg_body(false);
    b["model"] = json!("nope");
    let versioned = [("x-api-key", gw.key.as_str()), ("anthropic-version", "2023-06-01")];
    let r = gw.post_as("/v1/messages", &b, &versioned).await;
    assert_eq!((r.status, r.json()["error"]["type"].as_str()), (404, Some("not_found_error")));
    assert_eq!(r.header("anthropic-version").as_deref(), Some("2023-06-01"), "echoed on every answer (C10)");
    let bad_key = [("x-api-key", "rp_nope"), ("vendor-version", "2023-06-01")];
    let r = gw.post_as("/v1/messages", &msg_body(false), &bad_key).await;
    assert_eq!(r.status, 401, "{}", r.text);
    assert_eq!(r.header("vendor-version").as_deref(), Some("2023-06-01"), "a refusal before any plugin too");
    let mut b = msg_body(false);
    b["messages"] = json!([{"role": "user", "content": [{"type": "document", "source": {}}]}]);
    let r = gw.post_as("/v1/messages", &b, &key).await;
    assert_eq!(r.status, 400);
    assert!(r.json()["error"]["message"].as_str().unwrap().contains("document"));
    // A context overflow (rules-model: a 300-token window): the message starts with
    // `prompt is too long` (spec, Errors: messages routes).
    let long = json!({"model": "rules-model", "max_tokens": 5,
                      "messages": [{"role": "user", "content": "word ".repeat(2_000)}]});
    for stream in [false, true] {
        let mut b = long.clone();
        b["stream"] = json!(stream);
        let r = gw.post_as("/v1/messages", &b, &key).await;
        assert_eq!(r.status, 400, "{}", r.text);
        let v = r.json();
        assert_eq!(v["error"]["type"], "invalid_request_error");
        assert!(v["error"]["message"].as_str().unwrap().starts_with("prompt is too long"), "{v}");
    }
    assert_eq!(mock.stats().await["requests"], 0);
}

#[tokio::test]
async fn count_tokens_answers_without_a_replica_and_bills_nothing() {
    let mock = Mock::start();
    let gw = Gateway::start(&mock);
    let body = json!({"model": "chat-model", "messages": [{"role": "user", "content": "how many tokens is this?"}]});
    let r = gw.post_as("/v1/messages/count_tokens", &body, &[("x-api-key", gw.key.as_str())]).await;
    assert_eq!(r.status, 200, "{}", r.text);
    let n = r.json()["input_tokens"].as_u64().unwrap();
    assert!(n > 0);
    assert_eq!(mock.stats().await["requests"], 0);
    let (_, l) = gw.admin("GET", &format!("/admin/v1/workspaces/{}/ledger", gw.workspace), None);
    assert_eq!(l["balance_cents"], 100);
}

#[tokio::test]
async fn responses_adapter_plain_and_streamed() {
    let mock = Mock::start();
    let gw = Gateway::start(&mock);
    let body = json!({"model": "chat-model", "instructions": "Be brief.", "input": "hi", "max_output_tokens": 4});
    let r = gw.post("/v1/responses", &body, &[("x-mock-tokens", "9")]).await;
    assert_eq!(r.status, 200, "{}", r.text);
    let v = r.json();
    assert_eq!(v["object"], "response");
    assert_eq!(v["status"], "incomplete");
    assert_eq!(v["incomplete_details"]["reason"], "max_output_tokens");
    assert!(v["usage"]["output_tokens"].as_u64().is_some());
    let seen = mock.last_request().await;
    assert_eq!(seen["body"]["max_tokens"], 4);
    assert_eq!(seen["body"]["messages"][0]["role"], "system");
    let mut sb = body.clone();
    sb["stream"] = json!(true);
    sb["max_output_tokens"] = json!(50);
    let r = gw.post("/v1/responses", &sb, &[("x-mock-tokens", "3")]).await;
    let ev = events(&r.text);
    let deltas: String = ev
        .iter()
        .filter(|(n, _)| n == "response.output_text.delta")
        .map(|(_, d)| d["delta"].as_str().unwrap().to_string())
        .collect();
    assert_eq!(deltas, "tok0 tok1 tok2 ");
    assert!(ev.iter().any(|(n, _)| n == "response.completed"), "{}", r.text);
    let r = gw
        .post("/v1/responses", &json!({"model": "chat-model", "input": "x", "previous_response_id": "resp_1"}), &[])
        .await;
    assert_eq!(r.status, 400, "{}", r.text);
}

#[tokio::test]
async fn a_silent_messages_stream_gets_pings_between_whole_events() {
    let mock = Mock::start();
    let gw = Gateway::start_with(&mock, Opts { heartbeat_seconds: 0.5, ..Opts::default() });
    // Two tokens 1.6 s apart: at least two pings fall into the silence.
    let headers = [("x-api-key", gw.key.as_str()), ("x-mock-tokens", "2"), ("x-mock-token-delay-ms", "1600")];
    let r = gw.post_as("/v1/messages", &msg_body(true), &headers).await;
    assert_eq!(r.status, 200, "{}", r.text);
    let ev = events(&r.text);
    let names: Vec<&str> = ev.iter().map(|(n, _)| n.as_str()).collect();
    let pings = names.iter().filter(|n| **n == "ping").count();
    assert!(pings >= 2, "pings while the replica is silent: {names:?}");
    assert_eq!(names.first(), Some(&"message_start"), "never a ping before the opening event");
    assert_eq!(names.last(), Some(&"message_stop"), "{names:?}");
    for (name, data) in &ev {
        if name == "ping" {
            assert_eq!(data["type"], "ping");
        }
    }
    let text: String = ev
        .iter()
        .filter(|(n, d)| n == "content_block_delta" && d["delta"]["type"] == "text_delta")
        .map(|(_, d)| d["delta"]["text"].as_str().unwrap().to_string())
        .collect();
    assert_eq!(text, "tok0 tok1 ", "the answer is intact around the pings");
    // A stream that is never silent that long gets none.
    let quick = [("x-api-key", gw.key.as_str()), ("x-mock-tokens", "5")];
    let r = gw.post_as("/v1/messages", &msg_body(true), &quick).await;
    assert!(!r.text.contains("event: ping"), "{}", r.text);

    // An HTTP/1.0 client reads a body that ends with the connection: the pings come unframed,
    // between whole events, like the rest of the body.
    let body = msg_body(true).to_string();
    let request = format!(
        "POST /v1/messages HTTP/1.0\r\nHost: t\r\nx-api-key: {}\r\nx-mock-tokens: 2\r\nx-mock-token-delay-ms: 1600\r\nContent-Type: application/json\r\nContent-Length: {}\r\n\r\n{body}",
        gw.key,
        body.len()
    );
    let raw = gw.raw(request.as_bytes(), std::time::Duration::from_secs(30));
    let (head, body) = raw.split_once("\r\n\r\n").expect("a response");
    assert!(head.starts_with("HTTP/1.1 200") && !head.to_ascii_lowercase().contains("transfer-encoding"), "{head}");
    let names: Vec<String> = events(body).into_iter().map(|(n, _)| n).collect();
    assert!(names.iter().filter(|n| *n == "ping").count() >= 2, "{names:?}");
    assert_eq!(names.last().map(String::as_str), Some("message_stop"), "{names:?}");
}

#[tokio::test]
async fn forcing_any_of_several_tools_is_refused_on_a_limited_model() {
    let mock = Mock::start();
    let gw = Gateway::start(&mock);
    let headers = [("x-api-key", gw.key.as_str()), ("anthropic-version", "2023-06-01")];
    let tool = |name: &str| json!({"name": name, "input_schema": {"type": "object"}});
    let ask = |model: &str, tools: Value| {
        json!({"model": model, "max_tokens": 8, "tools": tools, "tool_choice": {"type": "any"},
               "messages": [{"role": "user", "content": "hi"}]})
    };
    // vision-model declares `forced_tool_calling: limited`.
    let r = gw.post_as("/v1/messages", &ask("vision-model", json!([tool("a"), tool("b")])), &headers).await;
    assert_eq!(r.status, 400, "{}", r.text);
    let v = r.json();
    assert_eq!((v["type"].as_str(), v["error"]["type"].as_str()), (Some("error"), Some("invalid_request_error")));
    assert!(v["error"]["message"].as_str().unwrap().contains("several tools"), "{v}");
    assert_eq!(mock.stats().await["requests"], 0, "refused before the replica");
    // A single tool can still be forced there.
    let r = gw.post_as("/v1/messages", &ask("vision-model", json!([tool("a")])), &headers).await;
    assert_eq!(r.status, 200, "{}", r.text);
    assert_eq!(mock.last_request().await["body"]["tool_choice"], "required");
}

#[tokio::test]
async fn a_responses_stream_cut_by_the_replica_ends_with_response_failed() {
    let mock = Mock::start();
    let gw = Gateway::start(&mock);
    let body = json!({"model": "chat-model", "input": "hi", "stream": true});
    // The replica resets the connection after two tokens: the core closes the stream.
    let r = gw.post("/v1/responses", &body, &[("x-mock-tokens", "9"), ("x-mock-abort-after", "2")]).await;
    assert_eq!(r.status, 200, "{}", r.text);
    let ev = events(&r.text);
    assert!(ev.iter().all(|(name, _)| !name.is_empty()), "every frame is a named Responses event: {}", r.text);
    let (last, data) = ev.last().expect("events");
    assert_eq!(last, "response.failed", "{}", r.text);
    assert_eq!(data["response"]["status"], "failed", "{data}");
    assert_eq!(data["response"]["error"]["code"], "upstream_error", "{data}");
    assert!(!ev.iter().any(|(n, _)| n == "response.completed"));
}

#[tokio::test]
async fn without_a_usage_report_the_messages_usage_shows_what_is_billed() {
    let mock = Mock::start();
    let gw = Gateway::start(&mock);
    let headers = [("x-api-key", gw.key.as_str()), ("x-mock-tokens", "4"), ("x-mock-no-usage", "1")];
    // Streamed: the final message_delta carries the delivered count (four content frames).
    let r = gw.post_as("/v1/messages", &msg_body(true), &headers).await;
    assert_eq!(r.status, 200, "{}", r.text);
    let ev = events(&r.text);
    let delta = ev.iter().find(|(n, _)| n == "message_delta").expect("message_delta");
    assert_eq!(delta.1["usage"]["output_tokens"], 4, "{}", r.text);
    assert!(delta.1["usage"]["input_tokens"].as_u64().unwrap() > 0, "the prompt estimate: {}", r.text);
    // Not streamed: the delivered text (20 bytes, about four bytes a token).
    let r = gw.post_as("/v1/messages", &msg_body(false), &headers).await;
    assert_eq!(r.status, 200, "{}", r.text);
    let u = &r.json()["usage"];
    assert_eq!(u["output_tokens"], 5, "{u}");
    assert!(u["input_tokens"].as_u64().unwrap() > 0, "{u}");
}
