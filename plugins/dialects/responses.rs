//! A normalised chat completion as a Responses-shaped object, and the pieces of that shape
//! the Responses stream shares (ids, status, output items, usage).
//!
//! The spec shows only part of the envelope; the rest follows the public Responses shape
//! so existing clients parse it: `output` holds a `reasoning` item (when the model
//! reasoned), a `message` item with one `output_text` part, then `function_call` items.

use serde_json::{Map, Value, json};

use crate::shared::answer::{ChunkMeta, Piece, PricedUsage};

/// The Responses object for a whole chat answer (its first choice's pieces, as the chat path
/// read them). Serialize it with `render_json` so `usage.cost` keeps its eight decimals.
pub fn from_answer(meta: &ChunkMeta<'_>, pieces: &[Piece<'_>], usage: Option<&PricedUsage>, model_id: &str) -> Value {
    let suffix = id_suffix(meta.id.as_deref());
    let mut output = Vec::new();
    let mut finish = None;
    for piece in pieces {
        match piece {
            Piece::Reasoning(r) => output.push(reasoning_item(&suffix, r)),
            Piece::Text(t) => output.push(message_item(&suffix, t, "completed")),
            Piece::Tool { id, name, args, .. } => output.push(function_call_item(
                id.as_deref().unwrap_or(""),
                name.as_deref().unwrap_or(""),
                args.as_deref().unwrap_or(""),
                "completed",
            )),
            Piece::Finish(f) => finish = Some(f.as_ref()),
        }
    }
    let mut r = skeleton(&suffix, meta.created, model_id);
    let (status, incomplete) = status_of(finish);
    r.insert("status".into(), json!(status));
    r.insert("incomplete_details".into(), incomplete);
    r.insert("output".into(), Value::Array(output));
    r.insert("usage".into(), usage.map_or(Value::Null, responses_usage));
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
pub(super) fn skeleton(suffix: &str, created: Option<i64>, model_id: &str) -> Map<String, Value> {
    let created_at = created.unwrap_or_else(|| jiff::Timestamp::now().as_second());
    let mut r = Map::new();
    r.insert("id".into(), json!(format!("resp_{suffix}")));
    r.insert("object".into(), json!("response"));
    r.insert("created_at".into(), json!(created_at));
    r.insert("model".into(), json!(model_id));
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
        // An idempotent replay of an original stream that ended early (decision 186).
        Some(crate::shared::answer::INTERRUPTED) => ("incomplete", json!({ "reason": "interrupted" })),
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

/// The Responses usage from the priced chat usage: counts renamed, the cached count as
/// `input_tokens_details.cached_tokens`, and `cost` and `service` as the chat dialect
/// renders them (spec "Usage object", last rule).
pub(super) fn responses_usage(priced: &PricedUsage) -> Value {
    let f = &priced.figures;
    let chat: Value =
        serde_json::from_str(&tollgate::money::usage::render_chat_usage(f, priced.no_answer)).unwrap_or_default();
    let mut u = Map::new();
    u.insert("input_tokens".into(), json!(f.prompt_tokens));
    u.insert("output_tokens".into(), json!(f.completion_tokens));
    u.insert("total_tokens".into(), json!(f.total_tokens));
    u.insert("input_tokens_details".into(), json!({ "cached_tokens": f.cached_tokens }));
    for key in ["cost", "service"] {
        if let Some(v) = chat.get(key) {
            u.insert(key.into(), v.clone());
        }
    }
    Value::Object(u)
}
