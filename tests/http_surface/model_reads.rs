//! Model reads and presence rules, paused models, capability routes, and a dialect without its plugin.

use super::*;

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
