//! The chat-completions request rules (spec "POST /v1/chat/completions" rules 2-11,
//! clarifications 15 and 16) through the real gateway: status, `error.code`, `error.param`,
//! response headers, and what the replica received (`/mock/last-request`).
#![allow(clippy::unwrap_used, clippy::expect_used, clippy::panic)]

mod common;

use common::*;
use serde_json::{Value, json};

/// A 1x1 PNG.
const PNG: &str = "iVBORw0KGgoAAAANSUhEUgAAAAEAAAABCAYAAAAfFcSJAAAADUlEQVR42mNk+M9QDwADhgGAWjR9awAAAABJRU5ErkJggg==";

fn body(model: &str, messages: Value) -> Value {
    json!({ "model": model, "messages": messages })
}

fn with(mut b: Value, extra: Value) -> Value {
    for (k, v) in extra.as_object().unwrap() {
        b[k] = v.clone();
    }
    b
}

async fn refused(gw: &Gateway, b: &Value, code: &str, param: &str) -> Value {
    let r = gw.post("/v1/chat/completions", b, &[]).await;
    let v = r.assert_error(400, code);
    assert_eq!(v["error"]["param"], param, "{}", r.text);
    v
}

async fn forwarded(gw: &Gateway, mock: &Mock, b: &Value) -> (Reply, Value) {
    let r = gw.post("/v1/chat/completions", b, &[]).await;
    assert_eq!(r.status, 200, "{}", r.text);
    let seen = mock.last_request().await;
    (r, seen["body"].clone())
}

#[tokio::test]
async fn message_shapes_are_refused_naming_the_field() {
    let mock = Mock::start();
    let gw = Gateway::start(&mock);
    let user = json!({"role": "user", "content": "q"});
    let call = |args: Value| json!({"id": "c1", "type": "function", "function": {"name": "f", "arguments": args}});
    for args in [json!("[1, 2]"), json!("{not json"), json!({"a": 1})] {
        let msgs = json!([user, {"role": "assistant", "content": null, "tool_calls": [call(args)]}]);
        refused(&gw, &body("chat-model", msgs), "invalid_request", "messages[1].tool_calls[0].function.arguments")
            .await;
    }
    let msgs =
        json!([user, {"role": "assistant", "tool_calls": [call(json!("{}"))]}, {"role": "tool", "content": "r"}]);
    refused(&gw, &body("chat-model", msgs), "missing_required_field", "messages[2].tool_call_id").await;
    let msgs = json!([user, {"role": "assistant", "tool_calls": [call(json!("{}"))]}, {"role": "tool", "content": "r", "tool_call_id": ""}]);
    refused(&gw, &body("chat-model", msgs), "invalid_request", "messages[2].tool_call_id").await;
    refused(
        &gw,
        &body("chat-model", json!([{"role": "user", "content": 7}])),
        "invalid_request",
        "messages[0].content",
    )
    .await;
    let msgs = json!([user, {"role": "assistant", "content": null, "tool_calls": []}]);
    refused(&gw, &body("chat-model", msgs), "missing_required_field", "messages[1].content").await;
    refused(&gw, &body("chat-model", json!([{"role": "system"}])), "missing_required_field", "messages[0].content")
        .await;
    // A well-formed tool loop passes, arguments unchanged.
    let msgs = json!([user, {"role": "assistant", "content": null, "tool_calls": [call(json!("{\"x\": 1}"))]},
        {"role": "tool", "content": "r", "tool_call_id": "c1"}]);
    let (_, seen) = forwarded(&gw, &mock, &body("chat-model", msgs)).await;
    assert_eq!(seen["messages"][1]["tool_calls"][0]["function"]["arguments"], "{\"x\": 1}");
}

#[tokio::test]
async fn dropped_fields_and_thinking_switches_never_reach_the_replica() {
    let mock = Mock::start();
    let gw = Gateway::start(&mock);
    let extra = json!({
        "enable_thinking": true, "chat_template_kwargs": {"enable_thinking": false}, "thinking_budget": 100,
        "thinking": {"type": "enabled"}, "reasoning": {"effort": "high"}, "text": {}, "include": [],
        "truncation": "auto", "previous_response_id": "r1", "min_p": 0.1, "repetition_penalty": 1.1,
        "length_penalty": 1.0, "guided_regex": "a+", "guided_choice": ["a"], "guided_grammar": "g",
        "use_beam_search": false, "best_of": 2, "num_return_sequences": 2, "beam_width": 2,
        "frequency_penalty": 0.5, "logit_bias": {"1": 1}, "parallel_tool_calls": true, "verbosity": "low",
        "metadata": {"k": "v"},
    });
    let b = with(body("chat-model", json!([{"role": "user", "content": "hi"}])), extra.clone());
    let (_, seen) = forwarded(&gw, &mock, &b).await;
    let allowed = ["frequency_penalty", "logit_bias", "parallel_tool_calls", "verbosity", "metadata"];
    for (k, v) in extra.as_object().unwrap() {
        if allowed.contains(&k.as_str()) {
            assert_eq!(&seen[k], v, "{k} is on the allowlist");
        } else {
            assert!(seen.get(k).is_none(), "{k} reached the replica: {seen}");
        }
    }
}

#[tokio::test]
async fn capabilities_the_model_lacks_are_refused() {
    let mock = Mock::start();
    let gw = Gateway::start(&mock);
    let msgs = json!([{"role": "user", "content": "hi"}]);
    let tool = json!([{"type": "function", "function": {"name": "f", "parameters": {"type": "object"}}}]);
    // rules-model: no tool calling.
    refused(
        &gw,
        &with(body("rules-model", msgs.clone()), json!({"tools": tool})),
        "hosted_capability_not_supported",
        "tools",
    )
    .await;
    refused(
        &gw,
        &with(body("rules-model", msgs.clone()), json!({"tool_choice": "auto"})),
        "hosted_capability_not_supported",
        "tool_choice",
    )
    .await;
    // stream-model: no JSON mode; `text` is never refused.
    let json_object = json!({"response_format": {"type": "json_object"}});
    refused(
        &gw,
        &with(body("stream-model", msgs.clone()), json_object),
        "hosted_capability_not_supported",
        "response_format",
    )
    .await;
    let (_, seen) =
        forwarded(&gw, &mock, &with(body("stream-model", msgs), json!({"response_format": {"type": "text"}}))).await;
    assert_eq!(seen["response_format"]["type"], "text");
}

#[tokio::test]
async fn system_messages_are_repaired_for_first_only_models() {
    let mock = Mock::start();
    let gw = Gateway::start(&mock);
    let msgs = json!([
        {"role": "developer", "content": "a"}, {"role": "system", "content": [{"type": "text", "text": "b"}]},
        {"role": "user", "content": "u"}, {"role": "system", "content": "later"}, {"role": "user", "content": "v"},
    ]);
    let (_, seen) = forwarded(&gw, &mock, &body("rules-model", msgs.clone())).await;
    assert_eq!(
        seen["messages"],
        json!([{"role": "system", "content": "a\n\nb"}, {"role": "user", "content": "u"},
               {"role": "user", "content": "later"}, {"role": "user", "content": "v"}])
    );
    // Elsewhere only `developer` changes.
    let (_, seen) = forwarded(&gw, &mock, &body("chat-model", msgs)).await;
    let roles: Vec<&str> = seen["messages"].as_array().unwrap().iter().map(|m| m["role"].as_str().unwrap()).collect();
    assert_eq!(roles, ["system", "system", "user", "system", "user"]);
    let only_system = json!([{"role": "system", "content": "a"}, {"role": "developer", "content": "b"}]);
    refused(&gw, &body("rules-model", only_system), "invalid_request", "messages").await;
}

#[tokio::test]
async fn schemas_lose_unsatisfiable_bounds_and_refuse_empty_enums_and_bad_patterns() {
    let mock = Mock::start();
    let gw = Gateway::start(&mock);
    let msgs = json!([{"role": "user", "content": "hi"}]);
    let params = json!({"type": "object", "properties": {
        "n": {"type": "integer", "minimum": 10, "maximum": 1},
        "s": {"type": "string", "minLength": 1, "maxLength": 5, "pattern": "^(?=a)[a-z]+$"}}});
    let tools = json!([{"type": "function", "function": {"name": "f", "parameters": params}}]);
    let (_, seen) = forwarded(&gw, &mock, &with(body("vision-model", msgs.clone()), json!({"tools": tools}))).await;
    let p = &seen["tools"][0]["function"]["parameters"]["properties"];
    assert_eq!(p["n"], json!({"type": "integer"}), "unsatisfiable pair removed");
    assert_eq!(p["s"]["maxLength"], 5, "satisfiable bounds kept");

    let bad =
        json!([{"type": "function", "function": {"name": "f", "parameters": {"properties": {"x": {"enum": []}}}}}]);
    let b = with(body("vision-model", msgs.clone()), json!({"tools": bad}));
    refused(&gw, &b, "hosted_parameter_not_supported", "tools[0].function.parameters.properties.x.enum").await;
    let format = json!({"type": "json_schema", "json_schema": {"name": "o", "schema": {"properties": {"x": {"pattern": "(a"}}}}});
    let b = with(body("vision-model", msgs), json!({"response_format": format}));
    refused(&gw, &b, "hosted_parameter_not_supported", "response_format.json_schema.schema.properties.x.pattern").await;
}

fn image(url: &str) -> Value {
    json!({"type": "image_url", "image_url": {"url": url}})
}

#[tokio::test]
async fn image_parts_follow_rule_8() {
    let mock = Mock::start();
    let gw = Gateway::start(&mock);
    let png = format!("data:image/png;base64,{PNG}");
    let msgs = |part: Value| json!([{"role": "user", "content": [{"type": "text", "text": "what is it"}, part]}]);
    let (_, seen) = forwarded(&gw, &mock, &body("vision-model", msgs(image(&png)))).await;
    assert_eq!(seen["messages"][0]["content"][1]["image_url"]["url"], png.as_str(), "forwarded unchanged");

    let remote = msgs(image("https://example.com/cat.png"));
    refused(&gw, &body("vision-model", remote), "hosted_parameter_not_supported", "messages[0].content[1]").await;
    let truncated = format!("data:image/png;base64,{}", &PNG[..PNG.len() - 8]);
    refused(&gw, &body("vision-model", msgs(image(&truncated))), "invalid_request", "messages[0].content[1]").await;
    let mislabelled = format!("data:image/jpeg;base64,{PNG}");
    refused(&gw, &body("vision-model", msgs(image(&mislabelled))), "invalid_request", "messages[0].content[1]").await;
    let nine: Vec<Value> = (0..9).map(|_| image(&png)).collect();
    refused(
        &gw,
        &body("vision-model", json!([{"role": "user", "content": nine}])),
        "invalid_request",
        "messages[0].content[8]",
    )
    .await;
    // Not stripped: refused with `param: messages`.
    refused(&gw, &body("rules-model", msgs(image(&png))), "hosted_parameter_not_supported", "messages").await;
    let audio = json!({"type": "input_audio", "input_audio": {"data": "AAAA", "format": "wav"}});
    refused(&gw, &body("vision-model", msgs(audio)), "hosted_parameter_not_supported", "messages").await;
}

#[tokio::test]
async fn reasoning_efforts_follow_rules_9_and_10() {
    let mock = Mock::start();
    let gw = Gateway::start(&mock);
    let msgs = json!([{"role": "user", "content": "hi"}]);
    let json_object = json!({"response_format": {"type": "json_object"}});
    let (r, seen) = forwarded(&gw, &mock, &with(body("rules-model", msgs.clone()), json_object.clone())).await;
    assert_eq!(r.header("x-service-reasoning-effort-applied").as_deref(), Some("none"));
    assert_eq!(seen["reasoning_effort"], "none");
    // Without a JSON format nothing is substituted.
    let (r, seen) = forwarded(&gw, &mock, &body("rules-model", msgs.clone())).await;
    assert!(r.header("x-service-reasoning-effort-applied").is_none());
    assert!(seen.get("reasoning_effort").is_none());

    let schema = json!({"response_format": {"type": "json_schema", "json_schema": {"name": "o", "schema": {}}}, "reasoning_effort": "high"});
    let v = refused(
        &gw,
        &with(body("rules-model", msgs.clone()), schema),
        "hosted_parameter_not_supported",
        "response_format",
    )
    .await;
    assert!(v["error"]["message"].as_str().unwrap().contains("reasoning_effort: none"), "{v}");
    let minimal = json!({"reasoning_effort": "minimal"});
    refused(
        &gw,
        &with(body("rules-model", msgs.clone()), minimal),
        "hosted_parameter_not_supported",
        "reasoning_effort",
    )
    .await;
    let (r, seen) = forwarded(&gw, &mock, &with(body("rules-model", msgs), json!({"reasoning_effort": "high"}))).await;
    assert!(r.header("x-service-reasoning-effort-applied").is_none());
    assert_eq!(seen["reasoning_effort"], "high");
}

#[tokio::test]
async fn the_context_window_refuses_long_prompts_and_clamps_ceilings() {
    let mock = Mock::start();
    let gw = Gateway::start(&mock);
    // rules-model: 300-token window, no tokenizer (bytes / 4).
    let long = "x".repeat(1200);
    let v = refused(
        &gw,
        &body("rules-model", json!([{"role": "user", "content": long}])),
        "context_length_exceeded",
        "messages",
    )
    .await;
    assert_eq!(v["error"]["context_window"], 300, "an integer inside `error`");
    let schema = json!({"response_format": {"type": "json_object"}, "reasoning_effort": "low"});
    refused(
        &gw,
        &with(body("rules-model", json!([{"role": "user", "content": "hi"}])), schema),
        "hosted_parameter_not_supported",
        "response_format",
    )
    .await;
    // Refused before generation and uncharged: no replica call, the grant untouched.
    assert_eq!(mock.stats().await["requests"], 0);
    let credits = gw.get("/v1/credits").await.json();
    assert_eq!(credits["balance_cents"], 100, "{credits}");
    assert_eq!(credits["held_cents"], 0, "{credits}");

    // "Say hello": 3 + 4 + ceil(9 / 4) = 10 tokens, so 290 remain.
    let b = with(body("rules-model", json!([{"role": "user", "content": "Say hello"}])), json!({"max_tokens": 1000}));
    let (r, seen) = forwarded(&gw, &mock, &b).await;
    assert_eq!(r.header("x-service-output-clamped").as_deref(), Some("true"));
    assert_eq!(r.header("x-service-output-token-ceiling").as_deref(), Some("290"));
    assert_eq!(seen["max_tokens"], 290);
    let b = with(
        body("rules-model", json!([{"role": "user", "content": "Say hello"}])),
        json!({"max_completion_tokens": 50}),
    );
    let (r, seen) = forwarded(&gw, &mock, &b).await;
    assert!(r.header("x-service-output-clamped").is_none());
    assert_eq!(seen["max_completion_tokens"], 50);
}

#[tokio::test]
async fn a_declared_tokenizer_counts_for_the_window_and_count_tokens() {
    let mock = Mock::start();
    let gw = Gateway::start(&mock);
    let text = "Say hello to the gateway, please.";
    // The fixture tokenizer gives 13 tokens for `text`: 3 + 4 + 13 = 20 (bytes / 4 would give 16).
    let b = with(body("vision-model", json!([{"role": "user", "content": text}])), json!({"max_tokens": 100000}));
    let (r, seen) = forwarded(&gw, &mock, &b).await;
    assert_eq!(r.header("x-service-output-token-ceiling").as_deref(), Some("4076"));
    assert_eq!(seen["max_tokens"], 4076);
    let count = |model: &str| json!({"model": model, "messages": [{"role": "user", "content": text}]});
    let r = gw.post("/v1/messages/count_tokens", &count("vision-model"), &[]).await;
    assert_eq!(r.json()["input_tokens"], 20, "{}", r.text);
    let r = gw.post("/v1/messages/count_tokens", &count("rules-model"), &[]).await;
    assert_eq!(r.json()["input_tokens"], 16, "{}", r.text);
}

#[tokio::test]
async fn rule_fields_stay_out_of_the_model_object() {
    let mock = Mock::start();
    let gw = Gateway::start(&mock);
    let m = gw.get("/v1/models/rules-model").await.json();
    assert_eq!(m["id"], "rules-model", "{m}");
    for field in ["system_message", "json_format_effort", "json_format_refused_efforts", "refused_efforts", "tokenizer"]
    {
        assert!(m.get(field).is_none(), "{field}: {m}");
    }
}
