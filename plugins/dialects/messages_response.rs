//! A normalised chat completion as a Messages response (spec "Messages response").
//!
//! The pieces (id, stop reason, usage) are shared with the stream translator so a streamed
//! and a non-streamed answer of the same generation report the same values.

use serde_json::{Map, Value, json};

use super::signature::sign_thinking;

/// The Messages response for `chat` (the chat plugin's normalised body). `model_id` is the
/// catalog id the client named; `key` signs thinking blocks; `paid_extra` (an object such
/// as [`paid_extra_of`] builds) is merged into `usage` when a plan or Standby paid.
pub fn from_chat(chat: &Value, model_id: &str, key: &[u8], paid_extra: Option<&Value>) -> Value {
    let choice = chat.pointer("/choices/0");
    let message = choice.and_then(|c| c.get("message"));
    let mut content = Vec::new();
    if let Some(thinking) = message.and_then(reasoning_text).filter(|t| !t.is_empty()) {
        content.push(json!({ "type": "thinking", "thinking": thinking, "signature": sign_thinking(key, thinking) }));
    }
    if let Some(text) = message.and_then(|m| m.get("content")).and_then(Value::as_str).filter(|t| !t.is_empty()) {
        content.push(json!({ "type": "text", "text": text }));
    }
    let calls = message.and_then(|m| m.get("tool_calls")).and_then(Value::as_array).map(Vec::as_slice).unwrap_or(&[]);
    for call in calls {
        let function = call.get("function");
        content.push(json!({
            "type": "tool_use",
            "id": tool_use_id(call.get("id").and_then(Value::as_str)),
            "name": function.and_then(|f| f.get("name")).and_then(Value::as_str).unwrap_or(""),
            "input": parse_input(function.and_then(|f| f.get("arguments"))),
        }));
    }
    let finish = choice.and_then(|c| c.get("finish_reason")).and_then(Value::as_str);
    json!({
        "id": message_id(chat.get("id").and_then(Value::as_str)),
        "type": "message",
        "role": "assistant",
        "content": content,
        "model": model_id,
        "stop_reason": stop_reason(finish, !calls.is_empty()),
        "stop_sequence": null,
        "usage": usage(chat.get("usage"), paid_extra),
    })
}

/// Reasoning text of a chat `message` or `delta` (`reasoning`, or a replica's
/// `reasoning_content` should one reach here unrenamed).
pub(super) fn reasoning_text(part: &Value) -> Option<&str> {
    part.get("reasoning").and_then(Value::as_str).or_else(|| part.get("reasoning_content").and_then(Value::as_str))
}

/// `msg_` plus the chat id without its `chatcmpl-` prefix, or a fresh id.
pub(super) fn message_id(chat_id: Option<&str>) -> String {
    match chat_id.map(|id| id.strip_prefix("chatcmpl-").unwrap_or(id)).filter(|id| !id.is_empty()) {
        Some(id) => format!("msg_{id}"),
        None => format!("msg_{}", uuid::Uuid::new_v4().simple()),
    }
}

/// The chat tool-call id, kept so a `tool_result` sent back matches it; a fresh one when the
/// replica gave none.
pub(super) fn tool_use_id(chat_id: Option<&str>) -> String {
    match chat_id.filter(|id| !id.is_empty()) {
        Some(id) => id.to_string(),
        None => format!("toolu_{}", uuid::Uuid::new_v4().simple()),
    }
}

/// `stop_reason` from a chat `finish_reason`: `stop` -> `end_turn`, `length` ->
/// `max_tokens`, `tool_calls` -> `tool_use`, anything else null. A turn that produced tool
/// calls ends in `tool_use` unless it was cut short (spec: "A tool call returns a tool_use
/// block and stop_reason: tool_use").
pub fn stop_reason(finish_reason: Option<&str>, tool_use: bool) -> Value {
    match finish_reason {
        Some("length") => json!("max_tokens"),
        Some("stop" | "tool_calls") if tool_use => json!("tool_use"),
        Some("stop") => json!("end_turn"),
        Some("tool_calls") => json!("tool_use"),
        _ => Value::Null,
    }
}

/// Tool-call `arguments` (JSON text) as the `input` object; arguments that are not a JSON
/// object (a replica cut short mid-call) give `{}` (decisions.md 74).
pub(super) fn parse_input(arguments: Option<&Value>) -> Value {
    let parsed = match arguments {
        Some(Value::String(s)) => serde_json::from_str::<Value>(s).ok(),
        Some(v @ Value::Object(_)) => Some(v.clone()),
        _ => None,
    };
    parsed.filter(Value::is_object).unwrap_or_else(|| Value::Object(Map::new()))
}

/// The four-field messages usage from a chat Usage object (zeros when absent), with
/// `paid_extra`'s fields merged in when given.
pub(super) fn usage(chat_usage: Option<&Value>, paid_extra: Option<&Value>) -> Value {
    let count = |p: &str| chat_usage.and_then(|u| u.pointer(p)).and_then(Value::as_u64).unwrap_or(0);
    let prompt = count("/prompt_tokens");
    let cached = count("/prompt_tokens_details/cached_tokens").min(prompt);
    let mut u = Map::new();
    u.insert("input_tokens".into(), json!(prompt - cached));
    u.insert("output_tokens".into(), json!(count("/completion_tokens")));
    u.insert("cache_read_input_tokens".into(), json!(cached));
    u.insert("cache_creation_input_tokens".into(), json!(0));
    if let Some(Value::Object(extra)) = paid_extra {
        for (k, v) in extra {
            u.insert(k.clone(), v.clone());
        }
    }
    Value::Object(u)
}

/// The usage fields a plan- or Standby-paid answer adds (`cost` 0 and `service` with
/// `cost_microcents`, `plan_value_microcents`, `paid_from`), read from a chat Usage object
/// that carries `service.paid_from`; `None` for credit-funded and pay-as-you-go usage.
pub fn paid_extra_of(chat_usage: &Value) -> Option<Value> {
    let service = chat_usage.get("service")?;
    let paid_from = service.get("paid_from").and_then(Value::as_str)?;
    let mut s = Map::new();
    s.insert("cost_microcents".into(), json!(service.get("cost_microcents").and_then(Value::as_u64).unwrap_or(0)));
    if let Some(v) = service.get("plan_value_microcents").and_then(Value::as_u64) {
        s.insert("plan_value_microcents".into(), json!(v));
    }
    s.insert("paid_from".into(), json!(paid_from));
    Some(json!({ "cost": 0, "service": s }))
}
