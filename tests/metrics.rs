//! Prometheus metrics through the real binary: the admin `GET /metrics` needs the token, and
//! its counters and histograms move with the requests served (bounded labels, no key or
//! workspace material).
#![allow(clippy::unwrap_used, clippy::expect_used, clippy::panic)]

mod common;

use common::*;
use serde_json::json;

async fn scrape(gw: &Gateway, token: Option<&str>) -> (u16, String) {
    let mut req = reqwest::Client::new().get(format!("http://127.0.0.1:{}/metrics", gw.admin_port));
    if let Some(t) = token {
        req = req.header("authorization", format!("Bearer {t}"));
    }
    let r = req.send().await.unwrap();
    (r.status().as_u16(), r.text().await.unwrap())
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
    let (status, _) = scrape(&gw, None).await;
    assert_eq!(status, 401, "the admin token is required");

    let mut stream = chat_body("chat-model", true);
    stream["stream_options"] = json!({"include_usage": true});
    for _ in 0..3 {
        let r = gw.post("/v1/chat/completions", &stream, &[("x-mock-tokens", "5")]).await;
        assert_eq!(r.status, 200, "{}", r.text);
    }
    let r = gw.post("/v1/chat/completions", &chat_body("no-such-model", false), &[]).await;
    assert_eq!(r.status, 404);
    let token = gw.admin_token.clone();
    // The log phase (where a request is counted) may end just after the client's answer.
    let mut text = String::new();
    for _ in 0..40 {
        text = scrape(&gw, Some(&token)).await.1;
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
