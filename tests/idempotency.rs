//! `Idempotency-Key` through the running gateway (spec "Idempotency key" table, "Idempotent
//! replay receipt", clarifications 6 and 7): each row of the state table, 50 concurrent
//! duplicates, replays of non-streamed and streamed originals in the three dialects, key
//! scope, and on Redis two instances sharing records and an outage refusing before any charge.
#![allow(clippy::unwrap_used, clippy::expect_used, clippy::panic)]

mod common;

use common::redis::RedisChild;
use common::*;
use serde_json::{Value, json};

async fn replica_calls(mock: &Mock) -> u64 {
    mock.stats().await["requests"].as_u64().unwrap()
}

/// Settlement entries of the test workspace's ledger (holds all released).
fn settlements(gw: &Gateway) -> usize {
    let v = gw.settled_ledger();
    v["entries"].as_array().unwrap().iter().filter(|e| e["kind"] == "settlement").count()
}

fn top_up(gw: &Gateway, cents: i64) {
    let path = format!("/admin/v1/workspaces/{}/credits", gw.workspace);
    let (s, v) = gw.admin("POST", &path, Some(json!({"amount_cents": cents, "source": "purchase"})));
    assert_eq!(s, 201, "{v}");
}

fn priced(stream: bool) -> Value {
    let mut b = chat_body("chat-model", stream);
    if stream {
        b["stream_options"] = json!({"include_usage": true});
    }
    b
}

#[tokio::test]
async fn each_row_of_the_state_table_on_a_non_streamed_original() {
    let mock = Mock::start();
    let gw = Gateway::start(&mock);
    let body = priced(false);
    let key = [("idempotency-key", "order-42")];
    let first = gw.post("/v1/chat/completions", &body, &key).await;
    assert_eq!(first.status, 200, "{}", first.text);
    assert!(first.header("x-service-idempotent-replay").is_none());
    let calls = replica_calls(&mock).await;
    let settled = settlements(&gw);
    assert_eq!(settled, 1);

    // Settled + same key, method, route and body: the stored response, no replica, no charge.
    let again = gw.post("/v1/chat/completions", &body, &key).await;
    assert_eq!(again.status, 200, "{}", again.text);
    assert_eq!(again.header("x-service-idempotent-replay").as_deref(), Some("true"));
    assert_eq!(again.text, first.text, "the stored body, byte for byte");
    assert_eq!(replica_calls(&mock).await, calls);
    assert_eq!(settlements(&gw), settled);

    // Settled + a different body, or route: mismatch.
    let mut other = body.clone();
    other["messages"][0]["content"] = json!("Say goodbye");
    gw.post("/v1/chat/completions", &other, &key).await.assert_error(400, "idempotency_mismatch");
    let r = gw.post("/v1/responses", &json!({"model": "chat-model", "input": "Say hello"}), &key).await;
    r.assert_error(400, "idempotency_mismatch");
    // Requests without the key are untouched; another key of the same workspace has its own scope.
    assert_eq!(gw.post("/v1/chat/completions", &body, &[]).await.status, 200);
    let k2 = gw.mint_key(&gw.workspace, json!({"name": "second"}))["key"].as_str().unwrap().to_string();
    let bearer = format!("Bearer {k2}");
    let r = gw.post_as("/v1/chat/completions", &body, &[("authorization", &bearer), key[0]]).await;
    assert_eq!(r.status, 200, "{}", r.text);
    assert!(r.header("x-service-idempotent-replay").is_none(), "another key never sees the record");
    assert_eq!(replica_calls(&mock).await, calls + 2);
}

#[tokio::test]
async fn malformed_keys_are_refused_before_anything_runs() {
    let mock = Mock::start();
    let gw = Gateway::start(&mock);
    let long = "k".repeat(256);
    for bad in ["   ", long.as_str(), "caf\u{e9}"] {
        let r = gw.post("/v1/chat/completions", &priced(false), &[("idempotency-key", bad)]).await;
        let v = r.assert_error(400, "invalid_idempotency_key");
        assert_eq!(v["error"]["param"], "Idempotency-Key");
    }
    assert_eq!(replica_calls(&mock).await, 0);
    let ok = "k".repeat(255);
    assert_eq!(gw.post("/v1/chat/completions", &priced(false), &[("idempotency-key", &ok)]).await.status, 200);
}

#[tokio::test]
async fn fifty_concurrent_duplicates_run_and_bill_once() {
    let mock = Mock::start();
    let gw = std::sync::Arc::new(Gateway::start(&mock));
    fifty_duplicates(&mock, std::slice::from_ref(&gw)).await;
    assert_eq!(settlements(&gw), 1, "one charge");
}

#[tokio::test]
async fn fifty_concurrent_duplicates_through_two_instances_on_redis_run_once() {
    let mock = Mock::start();
    let url = std::env::var("REDIS_URL").unwrap_or_else(|_| "redis://127.0.0.1:6379".into());
    let prefix = format!("tgidemburst{}x{}", std::process::id(), free_port());
    let db = pg::fresh_database().await;
    let opts = Opts { postgres_url: Some(db), limits: Some(redis_limits(&url, &prefix)), ..Opts::default() };
    let a = Gateway::start_with(&mock, opts.clone());
    let mut b = Gateway::start_with(&mock, opts);
    b.key = a.key.clone();
    b.workspace = a.workspace.clone();
    // Both instances stay up until the end (the one that answered settles in its log phase).
    let (a, b) = (std::sync::Arc::new(a), std::sync::Arc::new(b));
    fifty_duplicates(&mock, &[a.clone(), b.clone()]).await;
    let ledger = a.settled_ledger();
    assert_eq!(settlements(&a), 1, "one charge: {ledger}");
}

/// 50 requests with one key at once, spread over `gws`: one runs (slowly), 49 meet its lock.
async fn fifty_duplicates(mock: &Mock, gws: &[std::sync::Arc<Gateway>]) {
    let body = priced(false);
    let mut tasks = Vec::new();
    for i in 0..50 {
        let (gw, body) = (gws[i % gws.len()].clone(), body.clone());
        tasks.push(tokio::spawn(async move {
            gw.post("/v1/chat/completions", &body, &[("idempotency-key", "burst"), ("x-mock-ttft-ms", "800")]).await
        }));
    }
    let mut ok = 0;
    let mut conflicts = 0;
    for t in tasks {
        let r = t.await.unwrap();
        match r.status {
            200 => ok += 1,
            409 => {
                r.assert_error(409, "idempotency_conflict");
                assert_eq!(r.header("retry-after").as_deref(), Some("1"));
                conflicts += 1;
            }
            s => panic!("unexpected {s}: {}", r.text),
        }
    }
    assert_eq!((ok, conflicts), (1, 49));
    assert_eq!(replica_calls(mock).await, 1, "one generation");
}

#[tokio::test]
async fn a_streamed_original_replays_a_receipt_never_its_content() {
    let mock = Mock::start();
    let gw = Gateway::start(&mock);
    let body = priced(true);
    let key = [("idempotency-key", "stream-1"), ("x-mock-tokens", "12")];
    let first = gw.post("/v1/chat/completions", &body, &key).await;
    assert_eq!(first.status, 200);
    let usage: Value = serde_json::from_str(first.sse_data().iter().rev().nth(1).unwrap()).unwrap();
    let calls = replica_calls(&mock).await;

    let again = gw.post("/v1/chat/completions", &body, &key).await;
    assert_eq!(again.status, 200);
    assert_eq!(again.header("x-service-idempotent-replay").as_deref(), Some("true"));
    assert!(again.header("content-type").unwrap().starts_with("text/event-stream"));
    let frames = again.sse_data();
    assert_eq!(frames.len(), 3, "receipt chunk, usage frame, [DONE]: {frames:?}");
    let receipt: Value = serde_json::from_str(&frames[0]).unwrap();
    assert_eq!(receipt["choices"][0]["delta"]["content"], Value::Null);
    assert_eq!(receipt["choices"][0]["finish_reason"], Value::Null, "the original was not cut short");
    let replay = &receipt["idempotent_replay"];
    assert_eq!(
        (replay["replayed"].clone(), replay["streamed"].clone(), replay["content_replayed"].clone()),
        (json!(true), json!(true), json!(false))
    );
    assert_eq!((replay["regenerated"].clone(), replay["billed_again"].clone()), (json!(false), json!(false)));
    assert_eq!(replay["original_status"], 200);
    assert_eq!(replay["stream_outcome"], "completed");
    assert_eq!(replay["usage_basis"], "provider_reported");
    assert_eq!(replay["cost_microcents"], usage["usage"]["service"]["cost_microcents"]);
    assert!(replay["detail"].as_str().is_some_and(|d| !d.is_empty()));
    let replayed_usage: Value = serde_json::from_str(&frames[1]).unwrap();
    assert_eq!(replayed_usage["usage"], usage["usage"], "the settled figures");
    assert_eq!(frames[2], "[DONE]");
    assert!(first.text.contains("tok0") && !again.text.contains("tok0"), "no content is sent again");
    assert_eq!(replica_calls(&mock).await, calls);
    assert_eq!(settlements(&gw), 1);
}

#[tokio::test]
async fn a_failure_before_any_output_releases_the_key() {
    let mock = Mock::start();
    let gw = Gateway::start(&mock);
    let body = priced(true);
    let r = gw.post("/v1/chat/completions", &body, &[("idempotency-key", "retry-me"), ("x-mock-status", "503")]).await;
    r.assert_error(502, "upstream_http_error");
    let r = gw.post("/v1/chat/completions", &body, &[("idempotency-key", "retry-me")]).await;
    assert_eq!(r.status, 200, "{}", r.text);
    assert!(r.header("x-service-idempotent-replay").is_none(), "the retry ran normally");
    assert!(r.text.contains("data: [DONE]"));
    // A stream that opened and ended before any output delivered nothing and billed nothing.
    let key = [("idempotency-key", "retry-stream"), ("x-mock-abort-after", "0")];
    let r = gw.post("/v1/chat/completions", &body, &key).await;
    assert_eq!(r.status, 200);
    assert!(!r.text.contains("data: [DONE]") && r.text.contains("\"error\""), "{}", r.text);
    let r = gw.post("/v1/chat/completions", &body, &[key[0]]).await;
    assert!(r.header("x-service-idempotent-replay").is_none() && r.text.contains("data: [DONE]"), "{}", r.text);
    assert_eq!(replica_calls(&mock).await, 4);
}

#[tokio::test]
async fn the_dialects_replay_in_their_own_shape() {
    let mock = Mock::start();
    let gw = Gateway::start(&mock);
    let messages = json!({"model": "chat-model", "max_tokens": 64, "messages": [{"role": "user", "content": "Hi"}]});
    let responses = json!({"model": "chat-model", "input": "Hi"});
    for (path, body) in [("/v1/messages", &messages), ("/v1/responses", &responses)] {
        let key = [("idempotency-key", path)];
        let first = gw.post(path, body, &key).await;
        assert_eq!(first.status, 200, "{}", first.text);
        let again = gw.post(path, body, &key).await;
        assert_eq!(again.header("x-service-idempotent-replay").as_deref(), Some("true"), "{path}");
        assert_eq!(again.text, first.text, "{path}: the stored body");
    }
    // Streamed originals: a short stream in the dialect, with no text.
    let mut messages = messages.clone();
    messages["stream"] = json!(true);
    let key = [("idempotency-key", "m-stream")];
    assert_eq!(gw.post("/v1/messages", &messages, &key).await.status, 200);
    let again = gw.post("/v1/messages", &messages, &key).await;
    let names: Vec<&str> = again.text.lines().filter_map(|l| l.strip_prefix("event: ")).collect();
    assert_eq!(names, ["message_start", "message_delta", "message_stop"], "{}", again.text);
    assert!(!again.text.contains("text_delta"));
    assert!(again.text.contains("\"output_tokens\":"), "the settled usage: {}", again.text);
    let mut responses = responses.clone();
    responses["stream"] = json!(true);
    let key = [("idempotency-key", "r-stream")];
    assert_eq!(gw.post("/v1/responses", &responses, &key).await.status, 200);
    let again = gw.post("/v1/responses", &responses, &key).await;
    let names: Vec<&str> = again.text.lines().filter_map(|l| l.strip_prefix("event: ")).collect();
    assert_eq!(names, ["response.created", "response.completed"], "{}", again.text);
    assert_eq!(replica_calls(&mock).await, 4);
    // An original stream that ended early (`response.failed`) is not replayed as completed:
    // it keeps `incomplete` (spec, Responses; decision 186), streamed or not.
    let key = [("idempotency-key", "r-stream-cut"), ("x-mock-no-done", "1")];
    let first = gw.post("/v1/responses", &responses, &key).await;
    assert!(first.text.contains("event: response.failed"), "{}", first.text);
    let again = gw.post("/v1/responses", &responses, &key).await;
    let names: Vec<&str> = again.text.lines().filter_map(|l| l.strip_prefix("event: ")).collect();
    assert_eq!(names, ["response.created", "response.incomplete"], "{}", again.text);
    let last = again.sse_data().last().cloned().unwrap();
    let last: Value = serde_json::from_str(&last).unwrap();
    assert_eq!(last["response"]["status"], "incomplete", "{last}");
    assert_eq!(last["response"]["incomplete_details"]["reason"], "interrupted", "{last}");
}

fn redis_limits(url: &str, prefix: &str) -> String {
    format!("  store: {{ backend: redis, url: \"{url}\", prefix: {prefix}, timeout_ms: 300 }}\n")
}

#[tokio::test]
async fn two_instances_on_redis_share_records_and_an_outage_charges_nothing() {
    let mock = Mock::start();
    let port = free_port();
    let mut redis = RedisChild::start(port).await;
    let prefix = format!("tgidem{}x{}", std::process::id(), free_port());
    let db = pg::fresh_database().await;
    let opts = Opts { postgres_url: Some(db), limits: Some(redis_limits(&redis.url(), &prefix)), ..Opts::default() };
    let a = Gateway::start_with(&mock, opts.clone());
    let mut b = Gateway::start_with(&mock, opts);
    b.key = a.key.clone();
    b.workspace = a.workspace.clone();
    let body = priced(false);
    let key = [("idempotency-key", "shared")];
    let first = a.post("/v1/chat/completions", &body, &key).await;
    assert_eq!(first.status, 200, "{}", first.text);
    let again = b.post("/v1/chat/completions", &body, &key).await;
    assert_eq!(again.header("x-service-idempotent-replay").as_deref(), Some("true"), "{}", again.text);
    assert_eq!(again.text, first.text);
    assert_eq!(replica_calls(&mock).await, 1);

    redis.kill();
    let r = a.post("/v1/chat/completions", &body, &[("idempotency-key", "during-outage")]).await;
    r.assert_error(503, "idempotency_unavailable");
    assert!(r.header("retry-after").is_some());
    let r = a
        .post(
            "/v1/messages",
            &json!({"model": "chat-model", "max_tokens": 8, "messages": [{"role": "user", "content": "Hi"}]}),
            &[("idempotency-key", "m")],
        )
        .await;
    assert_eq!(r.status, 503);
    assert_eq!(r.json()["error"]["type"], "overloaded_error");
    assert_eq!(replica_calls(&mock).await, 1, "nothing ran");
    assert_eq!(settlements(&a), 1, "nothing billed");
}

#[tokio::test]
async fn a_stored_answer_above_the_bound_is_not_replayed() {
    let mock = Mock::start();
    let gw = Gateway::start(&mock);
    top_up(&gw, 100_000);
    // About 1.3 MB of answer: above the 1,048,576-byte bound of a stored body.
    let key = [("idempotency-key", "huge"), ("x-mock-tokens", "200000")];
    let first = gw.post("/v1/chat/completions", &priced(false), &key).await;
    assert_eq!(first.status, 200, "{}", &first.text[..first.text.len().min(300)]);
    assert!(first.text.len() > 1_048_576);
    let again = gw.post("/v1/chat/completions", &priced(false), &key).await;
    let e = again.assert_error(422, "idempotency_replay_unavailable");
    assert_eq!(replica_calls(&mock).await, 1, "not run again either");
    // Support is sent the request that was charged, not the retry.
    let charged = first.header("x-request-id").unwrap();
    assert!(e["error"]["message"].as_str().unwrap().contains(&charged), "{e}");
    assert_ne!(again.header("x-request-id").unwrap(), charged);
}

#[tokio::test]
async fn a_killed_instances_lock_expires_and_a_retry_runs() {
    let mock = Mock::start();
    let prefix = format!("tgidemkill{}x{}", std::process::id(), free_port());
    let url = std::env::var("REDIS_URL").unwrap_or_else(|_| "redis://127.0.0.1:6379".into());
    let limits = format!("{}  lease_ttl_seconds: 2\n", redis_limits(&url, &prefix));
    let db = pg::fresh_database().await;
    let opts = Opts { postgres_url: Some(db), limits: Some(limits), ..Opts::default() };
    let mut a = Gateway::start_with(&mock, opts.clone());
    let mut b = Gateway::start_with(&mock, opts);
    b.key = a.key.clone();
    b.workspace = a.workspace.clone();
    let body = priced(false);
    let url_a = a.url("/v1/chat/completions");
    let bearer = a.bearer();
    let slow_body = body.clone();
    let slow = tokio::spawn(async move {
        reqwest::Client::new()
            .post(url_a)
            .header("authorization", bearer)
            .header("idempotency-key", "orphan")
            .header("x-mock-ttft-ms", "20000")
            .json(&slow_body)
            .send()
            .await
    });
    let deadline = std::time::Instant::now() + std::time::Duration::from_secs(10);
    while mock.stats().await["in_flight"].as_u64() != Some(1) {
        assert!(std::time::Instant::now() < deadline, "the original never reached the replica");
        tokio::time::sleep(std::time::Duration::from_millis(20)).await;
    }
    let key = [("idempotency-key", "orphan")];
    b.post("/v1/chat/completions", &body, &key).await.assert_error(409, "idempotency_conflict");
    // Renewed while it runs: still held after more than one TTL.
    tokio::time::sleep(std::time::Duration::from_millis(2_500)).await;
    b.post("/v1/chat/completions", &body, &key).await.assert_error(409, "idempotency_conflict");
    a.kill();
    let _ = slow.await;
    tokio::time::sleep(std::time::Duration::from_millis(2_500)).await;
    let r = b.post("/v1/chat/completions", &body, &key).await;
    assert_eq!(r.status, 200, "{}", r.text);
    assert!(r.header("x-service-idempotent-replay").is_none(), "the retry ran");
}

#[tokio::test]
async fn an_embeddings_retry_with_the_same_key_is_a_replay_charged_once() {
    let mock = Mock::start();
    let gw = Gateway::start(&mock);
    let body = json!({"model": "priced-embed-model", "input": ["a", "b"]});
    let headers = [("idempotency-key", "embed-retry-1"), ("x-mock-prompt-tokens", "7")];
    let first = gw.post("/v1/embeddings", &body, &headers).await;
    assert_eq!(first.status, 200, "{}", first.text);
    let calls = replica_calls(&mock).await;
    let again = gw.post("/v1/embeddings", &body, &headers).await;
    assert_eq!(again.status, 200, "{}", again.text);
    assert_eq!(again.header("x-service-idempotent-replay").as_deref(), Some("true"));
    assert_eq!(again.text, first.text, "the stored answer");
    assert_eq!(replica_calls(&mock).await, calls, "the replica is not called again");
    assert_eq!(settlements(&gw), 1, "charged once");
    let other = json!({"model": "priced-embed-model", "input": ["c"]});
    gw.post("/v1/embeddings", &other, &headers).await.assert_error(400, "idempotency_mismatch");
}
