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

#[tokio::test]
async fn invalid_json_and_missing_fields() {
    let mock = Mock::start();
    let gw = Gateway::start(&mock);
    let client = reqwest::Client::new();
    let r = client
        .post(gw.url("/v1/chat/completions"))
        .header("authorization", gw.bearer())
        .body("{not json")
        .send()
        .await
        .unwrap();
    let status = r.status().as_u16();
    let v: serde_json::Value = r.json().await.unwrap();
    assert_eq!((status, v["error"]["code"].as_str()), (400, Some("invalid_json")));

    let r = gw.post("/v1/chat/completions", &json!({"messages": []}), &[]).await;
    let v = r.assert_error(400, "missing_required_field");
    assert_eq!(v["error"]["param"], "model");

    let r = gw.post("/v1/chat/completions", &json!({"model": "chat-model"}), &[]).await;
    let v = r.assert_error(400, "missing_required_field");
    assert_eq!(v["error"]["param"], "messages");

    let r = gw.post("/v1/chat/completions", &json!({"model": "no-such-model", "messages": []}), &[]).await;
    let v = r.assert_error(404, "model_not_found");
    assert_eq!(v["error"]["param"], "model");
}

fn padded_body(total: usize) -> Vec<u8> {
    let head = br#"{"model":"chat-model","messages":[{"role":"user","content":"hi"}],"pad":""#;
    let tail = br#""}"#;
    let mut body = head.to_vec();
    body.resize(total - tail.len(), b'x');
    body.extend_from_slice(tail);
    body
}

#[tokio::test]
async fn body_limit_is_exactly_3_500_000_bytes() {
    let mock = Mock::start();
    let gw = Gateway::start(&mock);
    let client = reqwest::Client::new();
    let r = client
        .post(gw.url("/v1/chat/completions"))
        .header("authorization", gw.bearer())
        .header("content-type", "application/json")
        .body(padded_body(3_500_000))
        .send()
        .await
        .unwrap();
    assert_eq!(r.status().as_u16(), 200, "exactly 3,500,000 bytes are accepted");
    let r = client
        .post(gw.url("/v1/chat/completions"))
        .header("authorization", gw.bearer())
        .header("content-type", "application/json")
        .body(padded_body(3_500_001))
        .send()
        .await
        .unwrap();
    assert_eq!(r.status().as_u16(), 413);
    let v: serde_json::Value = r.json().await.unwrap();
    assert_eq!(v["error"]["code"], "payload_too_large");
    assert_eq!(v["error"]["type"], "invalid_request_error");

    // Chunked upload without a declared length: counted while streaming in.
    let body = padded_body(3_600_000);
    let stream = futures_stream(body);
    let r = client
        .post(gw.url("/v1/chat/completions"))
        .header("authorization", gw.bearer())
        .body(reqwest::Body::wrap_stream(stream))
        .send()
        .await;
    match r {
        Ok(r) => assert_eq!(r.status().as_u16(), 413),
        // The gateway may close before the whole upload is sent; then the 413 was still
        // written (checked on the raw socket in body_replay.rs).
        Err(e) => assert!(e.is_request() || e.is_body(), "{e}"),
    }
}

fn futures_stream(body: Vec<u8>) -> impl futures_core::Stream<Item = Result<Vec<u8>, std::io::Error>> {
    let chunks: Vec<Result<Vec<u8>, std::io::Error>> = body.chunks(64 * 1024).map(|c| Ok(c.to_vec())).collect();
    tokio_stream::iter(chunks)
}

#[tokio::test]
async fn model_list_and_presence_rules() {
    let mock = Mock::start();
    let gw = Gateway::start(&mock);
    let r = gw.get("/v1/models").await;
    assert_eq!(r.status, 200);
    let v = r.json();
    assert_eq!(v["object"], "list");
    let data = v["data"].as_array().unwrap();
    let ids: Vec<&str> = data.iter().map(|m| m["id"].as_str().unwrap()).collect();
    assert!(ids.contains(&"paused-model"), "paused models stay listed");
    let chat = data.iter().find(|m| m["id"] == "chat-model").unwrap();
    assert_eq!(chat["object"], "model");
    assert_eq!(chat["max_completion_tokens"], 4096);
    assert_eq!(chat["max_output_tokens"], 4096);
    assert_eq!(chat["context_window"], 32768);
    assert_eq!(chat["context_length"], 32768);
    assert_eq!(chat["max_request_bytes"], 3_500_000);
    assert_eq!(chat["response_time_ceiling_seconds"], 30);
    assert_eq!(chat["session_affinity_idle_ttl_seconds"], 900);
    assert_eq!(chat["pricing"]["input"], 0.1);
    assert_eq!(chat["cached_input_price_usd_per_mtok"], 0.05);
    assert_eq!(chat["cached_input_price"], 0.05);
    assert_eq!(chat["availability"], "available");
    assert!(chat.get("paused_until").is_none());
    assert_eq!(chat["reasoning_efforts"], json!([]));
    assert!(chat["default_reasoning_effort"].is_null());

    // Undeclared: absent, never zero or null (except max_completion_tokens, clarification 2).
    let embed = data.iter().find(|m| m["id"] == "embed-model").unwrap();
    assert!(embed["max_completion_tokens"].is_null());
    for absent in [
        "max_output_tokens",
        "context_window",
        "context_length",
        "pricing",
        "cached_input_price",
        "cache_isolation",
        "max_concurrent_requests_per_api_key",
        "max_tokens_per_minute_per_workspace",
        "paused_until",
    ] {
        assert!(embed.get(absent).is_none(), "{absent} must be absent");
    }
    // A shared cache neither discloses nor prices hits: no cached price published.
    let shared = data.iter().find(|m| m["id"] == "shared-cache-model").unwrap();
    assert!(shared.get("cached_input_price").is_none());

    let paused = data.iter().find(|m| m["id"] == "paused-model").unwrap();
    assert_eq!(paused["availability"], "paused");
    assert_eq!(paused["paused_until"], "2099-01-01T00:00:00Z");

    let one = gw.get("/v1/models/chat-model").await;
    assert_eq!(one.status, 200);
    assert_eq!(one.json()["id"], "chat-model");
    gw.get("/v1/models/nope").await.assert_error(404, "model_not_found");
    // A repository-id alias, with its `/` as sent raw or percent-encoded (the openai client's
    // `models.retrieve` encodes it): the model object, under its catalog id.
    for path in ["/v1/models/org/Chat-Model-7B", "/v1/models/org%2FChat-Model-7B", "/v1/models/chat%2Dmodel"] {
        let one = gw.get(path).await;
        assert_eq!((one.status, one.json()["id"].as_str()), (200, Some("chat-model")), "{path}: {}", one.text);
    }
    gw.get("/v1/models/%FF%FE").await.assert_error(404, "model_not_found");
}

#[tokio::test]
async fn paused_model_is_503_with_paused_until_and_capped_retry_after() {
    let mock = Mock::start();
    let gw = Gateway::start(&mock);
    let r = gw.post("/v1/chat/completions", &chat_body("paused-model", false), &[]).await;
    let v = r.assert_error(503, "hosted_model_paused");
    assert_eq!(v["error"]["type"], "api_error");
    assert_eq!(v["error"]["paused_until"], "2099-01-01T00:00:00Z");
    assert_eq!(r.header("retry-after").as_deref(), Some("3600"));
    assert_eq!(mock.stats().await["requests"], 0, "nothing reached a replica");
}

#[tokio::test]
async fn capability_routes_forward_or_refuse() {
    let mock = Mock::start();
    let gw = Gateway::start(&mock);
    let r = gw.post("/v1/embeddings", &json!({"model": "chat-model", "input": "x"}), &[]).await;
    let v = r.assert_error(400, "unsupported_model_operation");
    assert_eq!(v["error"]["type"], "invalid_request_error");

    let r = gw.post("/v1/embeddings", &json!({"model": "embed-model", "input": "x", "dimensions": 3}), &[]).await;
    assert_eq!(r.status, 200, "{}", r.text);
    assert_eq!(r.json()["object"], "list");
    let seen = mock.last_request().await;
    assert_eq!(seen["path"], "/v1/embeddings");
    assert_eq!(seen["body"]["model"], "org/embed", "upstream model name");
    assert_eq!(seen["body"]["dimensions"], 3, "other fields forwarded unchanged");

    let r = gw.post("/v1/chat/completions", &chat_body("unserved-model", false), &[]).await;
    r.assert_error(503, "hosted_inference_unavailable");
    assert!(r.header("retry-after").is_none());
}

#[test]
fn check_config_lists_every_problem_with_file_and_path() {
    let dir = std::env::temp_dir().join(format!("tollgate-badconf-{}", std::process::id()));
    std::fs::create_dir_all(&dir).unwrap();
    std::fs::write(
        dir.join("tollgate.yaml"),
        "listen: nowhere\nbudgets:\n  response_seconds: -1\nplans:\n  window_wait_seconds: 45\n  tiers:\n    pro: { five_hour_cents: 500, week_cents: 100, standby_day_cents: 10, plan_concurrency: 0, standby_concurrency: 1 }\n",
    )
    .unwrap();
    std::fs::write(
        dir.join("models.yaml"),
        "models:\n  - id: a\n    supported_endpoints: [chat_completions, teleport]\n    pricing: { input: 0.123456789, output: 1 }\n",
    )
    .unwrap();
    std::fs::write(dir.join("upstreams.yaml"), "pools: {}\n").unwrap();
    let out = std::process::Command::new(env!("CARGO_BIN_EXE_tollgate"))
        .args(["check-config", "--config"])
        .arg(dir.join("tollgate.yaml"))
        .output()
        .unwrap();
    assert!(!out.status.success());
    let err = String::from_utf8_lossy(&out.stderr);
    assert!(err.contains("tollgate.yaml: listen:"), "{err}");
    assert!(err.contains("tollgate.yaml: budgets.response_seconds:"), "{err}");
    assert!(err.contains("tollgate.yaml: plans.window_wait_seconds: must be 0..=30 seconds"), "{err}");
    assert!(err.contains("tollgate.yaml: plans.tiers.pro.plan_concurrency: must be 1..=10000, got 0"), "{err}");
    assert!(err.contains("tollgate.yaml: plans.tiers.pro.week_cents: must be at least five_hour_cents"), "{err}");

    // With the gateway file fixed, the catalog's problems are all listed together.
    std::fs::write(dir.join("tollgate.yaml"), "listen: 127.0.0.1:1\n").unwrap();
    let out = std::process::Command::new(env!("CARGO_BIN_EXE_tollgate"))
        .args(["check-config", "--config"])
        .arg(dir.join("tollgate.yaml"))
        .output()
        .unwrap();
    let err = String::from_utf8_lossy(&out.stderr);
    assert!(err.contains("models.yaml: models[0].supported_endpoints[1]: `teleport`"), "{err}");
    assert!(err.contains("models.yaml: models[0].pricing.input: 0.123456789 has more than 8 decimal places"), "{err}");

    // Unknown fields are errors with their path, not silent defaults.
    std::fs::write(
        dir.join("models.yaml"),
        "models:\n  - id: a\n    supported_endpoints: [chat_completions]\n    pricng: {}\n",
    )
    .unwrap();
    let out = std::process::Command::new(env!("CARGO_BIN_EXE_tollgate"))
        .args(["serve", "--config"])
        .arg(dir.join("tollgate.yaml"))
        .output()
        .unwrap();
    assert!(!out.status.success(), "serve refuses a bad config");
    let err = String::from_utf8_lossy(&out.stderr);
    assert!(err.contains("models.yaml: models[0].pricng:"), "{err}");
    assert!(err.contains("unknown field `pricng`"), "{err}");
}

#[tokio::test]
async fn a_dialect_without_its_plugin_is_a_clear_503_in_its_envelope() {
    let mock = Mock::start();
    let gw = Gateway::start_with(&mock, Opts { without_dialects: true, ..Opts::default() });
    let body = json!({"model": "chat-model", "max_tokens": 5, "messages": [{"role": "user", "content": "hi"}]});
    let r = gw.post("/v1/messages", &body, &[]).await;
    assert_eq!(r.status, 503, "{}", r.text);
    let v = r.json();
    assert_eq!(v["type"], "error");
    assert_eq!(v["error"]["type"], "overloaded_error");
    assert!(r.header("retry-after").is_none());
    let r = gw.post("/v1/responses", &json!({"model": "chat-model", "input": "hi"}), &[]).await;
    r.assert_error(503, "hosted_inference_unavailable");
    assert_eq!(mock.stats().await["requests"], 0, "nothing reached a replica");
}

#[test]
fn check_config_lists_the_chain_as_served() {
    let dir = std::env::temp_dir().join(format!("tollgate-okconf-{}", std::process::id()));
    std::fs::create_dir_all(&dir).unwrap();
    std::fs::write(dir.join("pepper"), "p".repeat(48)).unwrap();
    std::fs::write(dir.join("enc"), "ab".repeat(32)).unwrap();
    std::fs::write(
        dir.join("tollgate.yaml"),
        "listen: 127.0.0.1:1\nidentity:\n  store: { backend: sqlite, path: id.db }\n  key_pepper: { file: pepper }\n  key_encryption_key: { file: enc }\nplugins:\n  - name: billing\n  - name: chat_completions\n  - name: auth\n",
    )
    .unwrap();
    std::fs::write(dir.join("models.yaml"), "models:\n  - id: a\n    supported_endpoints: [chat_completions]\n")
        .unwrap();
    std::fs::write(
        dir.join("upstreams.yaml"),
        "pools:\n  a:\n    replicas:\n      - { address: \"127.0.0.1:2\", max_concurrency: 1 }\n",
    )
    .unwrap();
    let out = std::process::Command::new(env!("CARGO_BIN_EXE_tollgate"))
        .args(["check-config", "--config"])
        .arg(dir.join("tollgate.yaml"))
        .env_remove("TOLLGATE_ADMIN_TOKEN")
        .output()
        .unwrap();
    let text = String::from_utf8_lossy(&out.stdout);
    assert!(out.status.success(), "{text} {}", String::from_utf8_lossy(&out.stderr));
    assert!(
        text.contains(r#"plugins ["auth", "chat_completions", "billing"]"#),
        "in request order, stores or not: {text}"
    );
    assert!(!dir.join("id.db").exists(), "check-config opens no store");
    assert!(text.contains("warning: no admin token configured"), "an unusable admin listener is said: {text}");
    // A short token from the environment is blamed on the variable, not on a file.
    let out = std::process::Command::new(env!("CARGO_BIN_EXE_tollgate"))
        .args(["check-config", "--config"])
        .arg(dir.join("tollgate.yaml"))
        .env("TOLLGATE_ADMIN_TOKEN", "short")
        .output()
        .unwrap();
    let err = String::from_utf8_lossy(&out.stderr);
    assert!(!out.status.success());
    assert!(
        err.contains("TOLLGATE_ADMIN_TOKEN: the admin token in the environment variable must be at least 16"),
        "{err}"
    );
    let _ = std::fs::remove_dir_all(&dir);
}
