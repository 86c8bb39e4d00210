//! A normalised chat completion as a Responses-shaped object, and the pieces of that shape
//! the Responses stream shares (ids, status, output items, usage).
//!
//! The spec shows only part of the envelope; the rest follows the public Responses shape
//! so existing clients parse it: `output` holds a `reasoning` item (when the model
//! reasoned), a `message` item with one `output_text` part, then `function_call` items.

use serde_json::{Map, Value, json};

use super::messages_response::reasoning_text;

/// The Responses object for `chat` (the chat plugin's normalised body). Serialize it with
/// `render_json` so `usage.cost` keeps its eight decimals.
pub fn chat_to_response(chat: &Value) -> Value {
    let suffix = id_suffix(chat.get("id").and_then(Value::as_str));
    let choice = chat.pointer("/choices/0");
    let message = choice.and_then(|c| c.get("message"));
    let mut output = Vec::new();
    if let Some(r) = message.and_then(reasoning_text).filter(|r| !r.is_empty()) {
        output.push(reasoning_item(&suffix, r));
    }
    if let Some(t) = message.and_then(|m| m.get("content")).and_then(Value::as_str).filter(|t| !t.is_empty()) {
        output.push(message_item(&suffix, t, "completed"));
    }
    for call in message.and_then(|m| m.get("tool_calls")).and_then(Value::as_array).map(Vec::as_slice).unwrap_or(&[]) {
        let f = call.get("function");
        let s = |v: Option<&Value>| v.and_then(Value::as_str).unwrap_or("").to_string();
        output.push(function_call_item(
            &s(call.get("id")),
            &s(f.and_then(|f| f.get("name"))),
            &s(f.and_then(|f| f.get("arguments"))),
            "completed",
        ));
    }
    let finish = choice.and_then(|c| c.get("finish_reason")).and_then(Value::as_str);
    let mut r = skeleton(&suffix, chat.get("created"), chat.get("model"));
    let (status, incomplete) = status_of(finish);
    r.insert("status".into(), json!(status));
    r.insert("incomplete_details".into(), incomplete);
    r.insert("output".into(), Value::Array(output));
    r.insert("usage".into(), chat.get("usage").filter(|u| u.is_object()).map_or(Value::Null, responses_usage));
    Value::Object(r)
}

/// The chat id without its `chatcmpl-` prefix, or a fresh one; every item id derives
/// from it so the items of one response are recognisably its own.
pub(super) fn id_suffix(chat_id: Option<&str>) -> String {
    match chat_id.map(|id| id.strip_prefix("chatcmpl-").unwrap_or(id)).filter(|id| !id.is_empty()) {
        Some(id) => id.to_string(),
        None => uuid::Uuid::new_v4().simple().to_string(),
    }
}

/// The fields every Responses object carries; `status`, `output` and `usage` are set by
/// the caller.
pub(super) fn skeleton(suffix: &str, created: Option<&Value>, model: Option<&Value>) -> Map<String, Value> {
    let created_at = created.and_then(Value::as_i64).unwrap_or_else(|| jiff::Timestamp::now().as_second());
    let mut r = Map::new();
    r.insert("id".into(), json!(format!("resp_{suffix}")));
    r.insert("object".into(), json!("response"));
    r.insert("created_at".into(), json!(created_at));
    r.insert("model".into(), model.cloned().unwrap_or(Value::Null));
    r.insert("error".into(), Value::Null);
    r.insert("incomplete_details".into(), Value::Null);
    r
}

/// `status` and `incomplete_details` from a chat `finish_reason`: a cut-short answer is
/// `incomplete` with the reason (spec "POST /v1/responses", replay paragraph).
pub(super) fn status_of(finish_reason: Option<&str>) -> (&'static str, Value) {
    match finish_reason {
        Some("length") => ("incomplete", json!({ "reason": "max_output_tokens" })),
        Some("content_filter") => ("incomplete", json!({ "reason": "content_filter" })),
        _ => ("completed", Value::Null),
    }
}

pub(super) fn message_item(suffix: &str, text: &str, status: &str) -> Value {
    json!({
        "type": "message",
        "id": format!("msg_{suffix}"),
        "status": status,
        "role": "assistant",
        "content": [{ "type": "output_text", "text": text, "annotations": [] }],
    })
}

pub(super) fn reasoning_item(suffix: &str, text: &str) -> Value {
    json!({
        "type": "reasoning",
        "id": format!("rs_{suffix}"),
        "summary": [],
        "content": [{ "type": "reasoning_text", "text": text }],
    })
}

pub(super) fn function_call_item(call_id: &str, name: &str, arguments: &str, status: &str) -> Value {
    json!({
        "type": "function_call",
        "id": format!("fc_{call_id}"),
        "call_id": call_id,
        "name": name,
        "arguments": arguments,
        "status": status,
    })
}

/// The Responses usage from a chat Usage object: counts renamed, the cached count as
/// `input_tokens_details.cached_tokens`, and `cost` and `service` carried unchanged
/// (spec "Usage object", last rule).
pub(super) fn responses_usage(chat_usage: &Value) -> Value {
    let count = |p: &str| chat_usage.pointer(p).and_then(Value::as_u64).unwrap_or(0);
    let (prompt, completion) = (count("/prompt_tokens"), count("/completion_tokens"));
    let total = chat_usage.get("total_tokens").and_then(Value::as_u64).unwrap_or(prompt + completion);
    let mut u = Map::new();
    u.insert("input_tokens".into(), json!(prompt));
    u.insert("output_tokens".into(), json!(completion));
    u.insert("total_tokens".into(), json!(total));
    u.insert("input_tokens_details".into(), json!({ "cached_tokens": count("/prompt_tokens_details/cached_tokens") }));
    for key in ["cost", "service"] {
        if let Some(v) = chat_usage.get(key) {
            u.insert(key.into(), v.clone());
        }
    }
    Value::Object(u)
}
