//! Plans on the other routes: dialect funding headers, the model object, embeddings, idempotent replays.

use super::*;

async fn dialect_headers(postgres: bool) {
    let url = if postgres { Some(pg::fresh_database().await) } else { None };
    let mock = Mock::start();
    let gw = Gateway::start_with(&mock, opts(postgres, url, plans_yaml(0.2, 4, 1)));
    set_plan(&gw, &gw.workspace, json!({"tier": "starter", "status": "active"}));
    let msg = json!({"model": "chat-model", "max_tokens": 50, "messages": [{"role": "user", "content": "hi"}]});
    let r = gw.post("/v1/messages", &msg, &[("anthropic-version", "2023-06-01")]).await;
    assert_eq!(r.status, 200, "{}", r.text);
    assert_eq!(funding(&r).as_deref(), Some("plan"));
    assert_eq!(r.header("x-service-plan").as_deref(), Some("starter"));
    let u = &r.json()["usage"];
    assert_eq!(u["cost"].as_f64(), Some(0.0), "{u}");
    assert_eq!(u["service"]["cost_microcents"], 0);
    assert_eq!(u["service"]["paid_from"], "plan");
    assert!(u["service"]["plan_value_microcents"].as_i64().unwrap() > 0);
    // The streamed message_delta carries it too.
    let mut streamed = msg.clone();
    streamed["stream"] = json!(true);
    let r = gw.post("/v1/messages", &streamed, &[("anthropic-version", "2023-06-01")]).await;
    assert_eq!(funding(&r).as_deref(), Some("plan"));
    let delta = r.sse_data().into_iter().find(|d| d.contains("\"message_delta\"")).expect("message_delta");
    let delta: Value = serde_json::from_str(&delta).unwrap();
    assert_eq!(delta["usage"]["service"]["paid_from"], "plan", "{delta}");

    let resp = json!({"model": "chat-model", "input": "hi", "max_output_tokens": 50});
    let r = gw.post("/v1/responses", &resp, &[]).await;
    assert_eq!(r.status, 200, "{}", r.text);
    assert_eq!(funding(&r).as_deref(), Some("plan"));
    let u = &r.json()["usage"];
    assert_eq!(u["service"]["paid_from"], "plan", "{u}");
    assert_eq!(u["service"]["cost_microcents"], 0);

    // A streamed chat answer's usage frame says the plan paid.
    let mut b = chat_body("chat-model", true);
    b["stream_options"] = json!({"include_usage": true});
    let r = gw.post("/v1/chat/completions", &b, &[]).await;
    assert_eq!(funding(&r).as_deref(), Some("plan"));
    let usage = r.sse_data().into_iter().rev().find(|d| d.contains("\"usage\"")).expect("a usage frame");
    let usage: Value = serde_json::from_str(&usage).unwrap();
    assert_eq!(usage["usage"]["service"]["paid_from"], "plan", "{usage}");
    assert_eq!(usage["usage"]["service"]["cost_microcents"], 0);

    // A promotional zero-price request makes no funding decision.
    let r = gw.post("/v1/chat/completions", &chat_body("free-model", false), &[]).await;
    assert_eq!(r.status, 200, "{}", r.text);
    assert_eq!(funding(&r), None, "free window: no funding headers");

    // count_tokens is not billed and carries no funding decision.
    let r = gw.post("/v1/messages/count_tokens", &msg, &[("anthropic-version", "2023-06-01")]).await;
    assert_eq!(r.status, 200, "{}", r.text);
    assert_eq!(funding(&r), None);
}

#[tokio::test]
async fn funding_headers_and_plan_paid_usage_on_messages_and_responses_on_sqlite() {
    dialect_headers(false).await
}

#[tokio::test]
async fn funding_headers_and_plan_paid_usage_on_messages_and_responses_on_postgres() {
    dialect_headers(true).await
}

#[tokio::test]
async fn messages_routes_answer_a_plan_limit_as_billing_error() {
    let mock = Mock::start();
    let gw = Gateway::start_with(&mock, opts(false, None, plans_yaml(0.2, 4, 0)));
    set_plan(&gw, &gw.workspace, json!({"tier": "starter", "status": "active"}));
    // Fill the window on the chat route, then ask on the messages route.
    assert_eq!(funding(&twenty_cents(&gw, &gw.key).await).as_deref(), Some("plan"));
    assert_eq!(funding(&twenty_cents(&gw, &gw.key).await).as_deref(), Some("plan"));
    plan_state(&gw, &gw.workspace);
    let msg = json!({"model": "chat-model", "max_tokens": 50, "messages": [{"role": "user", "content": "hi"}]});
    let r = gw.post("/v1/messages", &msg, &[("anthropic-version", "2023-06-01")]).await;
    assert_eq!(r.status, 402, "{}", r.text);
    let v = r.json();
    assert_eq!(v["type"], "error");
    assert_eq!(v["error"]["type"], "billing_error");
    let m = v["error"]["message"].as_str().unwrap();
    assert!(m.contains("5-hour limit") && m.contains("Standby"), "self-contained: {m}");
    assert_eq!(funding(&r).as_deref(), Some("refused"));
}

#[tokio::test]
async fn the_model_object_shows_plan_concurrency_and_the_pro_token_floor_only_while_the_plan_serves() {
    let mock = Mock::start();
    let gw = Gateway::start_with(
        &mock,
        Opts { limits: Some(String::new()), extra_yaml: plans_yaml(0.2, 3, 1), ..Opts::default() },
    );
    let model = |v: &Value, id: &str| v["data"].as_array().unwrap().iter().find(|m| m["id"] == id).cloned().unwrap();
    let m = gw.get("/v1/models/chat-model").await.json();
    assert!(m.get("max_concurrent_plan_requests_per_workspace").is_none(), "{m}");
    assert!(m.get("max_concurrent_standby_requests_per_workspace").is_none());
    assert_eq!(m["max_tokens_per_minute_per_workspace"], 1_000_000);

    set_plan(&gw, &gw.workspace, json!({"tier": "starter", "status": "active"}));
    tokio::time::sleep(std::time::Duration::from_millis(700)).await; // key cache lifetime
    let list = gw.get("/v1/models").await.json();
    let m = model(&list, "chat-model");
    assert_eq!(m["max_concurrent_plan_requests_per_workspace"], 3, "{m}");
    assert_eq!(m["max_concurrent_standby_requests_per_workspace"], 1);
    assert_eq!(m["max_tokens_per_minute_per_workspace"], 1_000_000, "starter has no token floor");
    assert!(model(&list, "embed-model").get("max_concurrent_plan_requests_per_workspace").is_none(), "unpriced");
    let embed = model(&list, "priced-embed-model");
    assert_eq!(embed["max_concurrent_plan_requests_per_workspace"], 3, "embeddings are covered: {embed}");
    assert!(embed.get("max_concurrent_standby_requests_per_workspace").is_none(), "Standby's field: chat models");
    assert!(model(&list, "dead-model").get("max_concurrent_plan_requests_per_workspace").is_none(), "unpriced");

    set_plan(&gw, &gw.workspace, json!({"tier": "pro", "status": "active"}));
    tokio::time::sleep(std::time::Duration::from_millis(700)).await;
    let m = gw.get("/v1/models/chat-model").await.json();
    assert_eq!(m["max_tokens_per_minute_per_workspace"], 20_000_000, "the Pro floor: {m}");
    assert_eq!(m["max_concurrent_plan_requests_per_workspace"], 4, "pro's default");

    set_plan(&gw, &gw.workspace, json!({"tier": "pro", "status": "disputed"}));
    tokio::time::sleep(std::time::Duration::from_millis(700)).await;
    let m = gw.get("/v1/models/chat-model").await.json();
    assert!(m.get("max_concurrent_plan_requests_per_workspace").is_none(), "a plan that does not serve: {m}");
    assert_eq!(m["max_tokens_per_minute_per_workspace"], 1_000_000);
}

#[tokio::test]
async fn a_serving_plan_pays_for_embeddings_and_meters_their_usage() {
    let mock = Mock::start();
    let gw = Gateway::start_with(&mock, opts(false, None, plans_yaml(0.2, 4, 1)));
    set_plan(&gw, &gw.workspace, json!({"tier": "starter", "status": "active"}));
    // priced-embed-model: input a cent a token; the replica reports 6 tokens.
    let b = json!({"model": "priced-embed-model", "input": "hello"});
    let r = gw.post("/v1/embeddings", &b, &[("x-mock-prompt-tokens", "6")]).await;
    assert_eq!(r.status, 200, "{}", r.text);
    assert_eq!(funding(&r).as_deref(), Some("plan"), "embeddings are a covered category");
    assert_eq!(r.json()["object"], "list", "the answer is forwarded as the replica wrote it");
    let p = plan_state(&gw, &gw.workspace);
    assert_eq!(p["five_hour"]["used_microcents"], 6 * M, "the reported usage is metered: {p}");
    assert_eq!(ledger(&gw, &gw.workspace)["balance_cents"], 100, "the balance is untouched");
}

#[tokio::test]
async fn an_idempotent_replay_keeps_the_original_funding_receipt_and_meters_once() {
    let mock = Mock::start();
    let gw = Gateway::start_with(&mock, opts(false, None, plans_yaml(0.2, 4, 1)));
    set_plan(&gw, &gw.workspace, json!({"tier": "starter", "status": "active"}));
    let mut b = chat_body("pricey-model", false);
    b["max_tokens"] = json!(10);
    let key = [("idempotency-key", "plan-replay-1"), ("x-mock-tokens", "10")];
    let first = gw.post("/v1/chat/completions", &b, &key).await;
    assert_eq!(first.status, 200, "{}", first.text);
    assert_eq!(funding(&first).as_deref(), Some("plan"));
    // Another request moves the window on.
    assert_eq!(funding(&twenty_cents(&gw, &gw.key).await).as_deref(), Some("plan"));
    plan_state(&gw, &gw.workspace);
    let replay = gw.post("/v1/chat/completions", &b, &key).await;
    assert_eq!(replay.status, 200, "{}", replay.text);
    assert_eq!(replay.header("x-service-idempotent-replay").as_deref(), Some("true"));
    for h in ["x-service-funding", "x-service-plan", "x-service-plan-5h-used-percent", "x-service-plan-5h-resets-at"] {
        assert_eq!(replay.header(h), first.header(h), "{h}: the original receipt");
    }
    assert_eq!(replay.json()["usage"]["service"]["paid_from"], "plan");
    let p = plan_state(&gw, &gw.workspace);
    assert_eq!(p["five_hour"]["used_microcents"], 30 * M, "10 + 20 cents: the replay metered nothing: {p}");
    // On the Responses route only `X-Service-Idempotent-Replay` survives (decision 178).
    let rb = json!({"model": "chat-model", "input": "hi", "max_output_tokens": 10});
    let key = [("idempotency-key", "plan-replay-responses"), ("x-mock-tokens", "10")];
    let first = gw.post("/v1/responses", &rb, &key).await;
    assert_eq!((first.status, funding(&first).as_deref()), (200, Some("plan")), "{}", first.text);
    let replay = gw.post("/v1/responses", &rb, &key).await;
    assert_eq!(replay.status, 200, "{}", replay.text);
    assert_eq!(replay.header("x-service-idempotent-replay").as_deref(), Some("true"));
    assert_eq!(replay.json(), first.json(), "the same Responses object");
    for h in
        ["x-service-funding", "x-service-plan", "x-service-plan-5h-used-percent", "x-service-plan-week-used-percent"]
    {
        assert!(replay.header(h).is_none(), "{h} does not survive a Responses replay");
    }
}
