//! Prometheus metrics through the real binary: the admin `GET /metrics` needs the token, and
//! its counters and histograms move with the requests served (bounded labels, no key or
//! workspace material).
#![allow(clippy::unwrap_used, clippy::expect_used, clippy::panic)]

mod common;

use common::*;
use serde_json::json;

/// `GET /metrics` without the admin token.
async fn scrape_without_token(gw: &Gateway) -> u16 {
    let url = format!("http://127.0.0.1:{}/metrics", gw.admin_port);
    reqwest::Client::new().get(url).send().await.unwrap().status().as_u16()
}

/// The value of the first sample whose line starts with `name{` and contains every label.
fn sample(text: &str, name: &str, labels: &[&str]) -> Option<f64> {
    text.lines()
        .filter(|l| l.starts_with(&format!("{name}{{")) && labels.iter().all(|lab| l.contains(lab)))
        .find_map(|l| l.rsplit(' ').next()?.parse().ok())
}

#[tokio::test]
async fn metrics_move_with_requests_and_carry_no_identity() {
    let mock = Mock::start();
    let gw = Gateway::start(&mock);
    assert_eq!(scrape_without_token(&gw).await, 401, "the admin token is required");

    let mut stream = chat_body("chat-model", true);
    stream["stream_options"] = json!({"include_usage": true});
    for _ in 0..3 {
        let r = gw.post("/v1/chat/completions", &stream, &[("x-mock-tokens", "5")]).await;
        assert_eq!(r.status, 200, "{}", r.text);
    }
    let r = gw.post("/v1/chat/completions", &chat_body("no-such-model", false), &[]).await;
    assert_eq!(r.status, 404);
    // The log phase (where a request is counted) may end just after the client's answer.
    let mut text = String::new();
    for _ in 0..40 {
        text = gw.metrics().await;
        let done = sample(&text, "tollgate_requests_total", &["model=\"chat-model\"", "status=\"200\""]) == Some(3.0)
            && sample(&text, "tollgate_requests_total", &["status=\"404\""]).is_some();
        if done {
            break;
        }
        tokio::time::sleep(std::time::Duration::from_millis(50)).await;
    }
    let requests = ["route=\"chat_completions\"", "model=\"chat-model\"", "status=\"200\"", "code=\"-\""];
    assert_eq!(sample(&text, "tollgate_requests_total", &requests), Some(3.0), "{text}");
    assert_eq!(sample(&text, "tollgate_requests_total", &["status=\"404\"", "code=\"model_not_found\""]), Some(1.0));
    let count = |name: &str| sample(&text, &format!("{name}_count"), &["model=\"chat-model\""]);
    assert_eq!(count("gen_ai_server_request_duration_seconds"), Some(3.0));
    assert_eq!(count("gen_ai_server_time_to_first_token_seconds"), Some(3.0), "streams measure the first token");
    assert_eq!(count("gen_ai_server_time_per_output_token_seconds"), Some(3.0));
    let tokens = ["model=\"chat-model\"", "kind=\"completion\"", "funding=\"credits\""];
    assert_eq!(sample(&text, "tollgate_tokens_total", &tokens), Some(15.0), "5 tokens x 3: {text}");
    assert!(sample(&text, "tollgate_cost_microcents_total", &["model=\"chat-model\""]).unwrap() > 0.0);
    assert!(sample(&text, "tollgate_replica_in_flight", &["model=\"chat-model\""]).is_some());
    assert!(!text.contains(&gw.key) && !text.contains(&gw.workspace), "no key or workspace in the metrics");
}

#[tokio::test]
async fn json_access_lines_parse_and_carry_no_key_material() {
    let mock = Mock::start();
    let gw = Gateway::start_with(&mock, Opts { extra_yaml: "access_log:\n  format: json\n".into(), ..Opts::default() });
    let mut body = chat_body("chat-model", true);
    body["stream_options"] = json!({"include_usage": true});
    let r = gw.post("/v1/chat/completions", &body, &[("x-mock-tokens", "4"), ("x-client-request-id", "trace-7")]).await;
    assert_eq!(r.status, 200, "{}", r.text);
    let rid = r.header("x-request-id").unwrap();
    let refused = gw.post("/v1/chat/completions", &chat_body("no-such-model", false), &[]).await;
    let refused_id = refused.header("x-request-id").unwrap();
    let find = |log: &str, id: &str| -> Option<serde_json::Value> {
        log.lines()
            .filter(|l| l.starts_with('{'))
            .filter_map(|l| serde_json::from_str::<serde_json::Value>(l).ok())
            .find(|v| v["request_id"] == id)
    };
    let mut log = String::new();
    for _ in 0..40 {
        log = gw.log();
        if find(&log, &rid).is_some() && find(&log, &refused_id).is_some() {
            break;
        }
        tokio::time::sleep(std::time::Duration::from_millis(50)).await;
    }
    let line = find(&log, &rid).unwrap_or_else(|| panic!("no JSON line for {rid}: {log}"));
    assert_eq!(line["client_request_id"], "trace-7");
    assert_eq!(line["route"], "/v1/chat/completions");
    assert_eq!(line["model"], "chat-model");
    assert_eq!(line["replica"], mock.addr().as_str());
    assert_eq!(line["status"], 200);
    assert_eq!(line["error_code"], serde_json::Value::Null);
    assert_eq!(line["workspace_id"], gw.workspace.as_str());
    assert!(line["key_id"].is_string());
    assert_eq!(line["placement"], "opening");
    assert_eq!(line["funding"], "credits");
    assert_eq!(line["completion_tokens"], 4);
    assert!(line["cost_microcents"].as_u64().unwrap() > 0);
    assert!(line["ttft_ms"].is_u64() && line["duration_ms"].is_u64());
    assert!(line["bytes_in"].as_u64().unwrap() > 0 && line["bytes_out"].as_u64().unwrap() > 0);
    assert!(line["time"].as_str().unwrap().ends_with('Z'));
    let refused = find(&log, &refused_id).unwrap();
    assert_eq!((refused["status"].as_u64(), refused["error_code"].as_str()), (Some(404), Some("model_not_found")));
    assert!(!log.contains(&gw.key), "the key never reaches the log");
}

/// Wait until the scrape satisfies `done` (the log phase may end just after the answer).
async fn scrape_until(gw: &Gateway, done: impl Fn(&str) -> bool) -> String {
    let mut text = String::new();
    for _ in 0..60 {
        text = gw.metrics().await;
        if done(&text) {
            break;
        }
        tokio::time::sleep(std::time::Duration::from_millis(50)).await;
    }
    text
}

#[tokio::test]
async fn store_round_trips_refusals_and_holds_are_counted() {
    let mock = Mock::start();
    let opts =
        Opts { limits: Some("  requests_per_minute: { free: 3, core: 5, enterprise: 9 }\n".into()), ..Opts::default() };
    let gw = Gateway::start_with(&mock, opts);
    for _ in 0..3 {
        let r = gw.post("/v1/chat/completions", &chat_body("chat-model", false), &[("x-mock-tokens", "3")]).await;
        assert_eq!(r.status, 200, "{}", r.text);
    }
    // The fourth in the minute is over the free tier's window.
    gw.post("/v1/chat/completions", &chat_body("chat-model", false), &[])
        .await
        .assert_error(429, "rate_limit_exceeded");
    let text = scrape_until(&gw, |t| {
        sample(t, "tollgate_holds_outstanding", &["store=\"ledger\""]) == Some(0.0)
            && sample(t, "tollgate_requests_total", &["status=\"429\""]).is_some()
    })
    .await;
    let ops = |store: &str, op: &str, outcome: &str| {
        sample(
            &text,
            "tollgate_store_operations_total",
            &[&format!("store=\"{store}\""), &format!("op=\"{op}\""), &format!("outcome=\"{outcome}\"")],
        )
    };
    // One key, looked up once (then cached); a window check per request; holds and
    // settlements in ledger batches.
    assert_eq!(ops("identity", "key_lookup", "ok"), Some(1.0), "{text}");
    let checks = ops("limiter", "check", "ok").unwrap();
    assert!(checks >= 4.0, "at least a window check per request: {text}");
    assert!(ops("ledger", "batch", "ok").unwrap() >= 2.0, "holds and settlements of 3 requests: {text}");
    assert_eq!(ops("ledger", "batch", "error"), Some(0.0));
    let latency = sample(&text, "tollgate_store_operation_seconds_count", &["store=\"limiter\"", "op=\"check\""]);
    assert_eq!(latency, Some(checks), "every round trip timed");
    assert_eq!(sample(&text, "tollgate_admission_refusals_total", &["gate=\"key_window\""]), Some(1.0), "{text}");
    assert_eq!(sample(&text, "tollgate_holds_outstanding", &["store=\"ledger\""]), Some(0.0), "every hold settled");
    assert_eq!(sample(&text, "tollgate_settlement_retries_total", &[]), None, "no retry without a store failure");
}

#[tokio::test]
async fn metrics_can_be_turned_off() {
    let mock = Mock::start();
    let gw = Gateway::start_with(&mock, Opts { extra_yaml: "metrics:\n  enabled: false\n".into(), ..Opts::default() });
    let r = gw.post("/v1/chat/completions", &chat_body("chat-model", false), &[]).await;
    assert_eq!(r.status, 200, "{}", r.text);
    tokio::time::sleep(std::time::Duration::from_millis(200)).await;
    let text = gw.metrics().await;
    assert_eq!(sample(&text, "tollgate_requests_total", &[]), None, "nothing recorded: {text}");
    assert_eq!(sample(&text, "tollgate_store_operations_total", &[]), None, "nothing recorded: {text}");
}
