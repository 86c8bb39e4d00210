//! A normalised chat completion as a Messages response (spec "Messages response").
//!
//! The pieces (id, stop reason, usage) are shared with the stream translator so a streamed
//! and a non-streamed answer of the same generation report the same values.

use serde_json::{Map, Value, json};

use super::signature::sign_thinking;
use crate::shared::answer::{ChunkMeta, Piece, PricedUsage};

/// The Messages response for a whole chat answer (its first choice's pieces, as the chat
/// path read them). `model_id` is the catalog id the client named; `key` signs thinking
/// blocks.
pub fn from_answer(
    meta: &ChunkMeta<'_>,
    pieces: &[Piece<'_>],
    usage_of: Option<&PricedUsage>,
    model_id: &str,
    key: &[u8],
) -> Value {
    let mut content = Vec::new();
    let mut finish = None;
    let mut tool_use = false;
    for piece in pieces {
        match piece {
            Piece::Reasoning(thinking) => content
                .push(json!({ "type": "thinking", "thinking": thinking, "signature": sign_thinking(key, thinking) })),
            Piece::Text(text) => content.push(json!({ "type": "text", "text": text })),
            Piece::Tool { id, name, args, .. } => {
                tool_use = true;
                content.push(json!({
                    "type": "tool_use",
                    "id": tool_use_id(id.as_deref()),
                    "name": name.as_deref().unwrap_or(""),
                    "input": parse_input(args.as_deref()),
                }));
            }
            Piece::Finish(f) => finish = Some(f.as_ref()),
        }
    }
    json!({
        "id": message_id(meta.id.as_deref()),
        "type": "message",
        "role": "assistant",
        "content": content,
        "model": model_id,
        "stop_reason": stop_reason(finish, tool_use),
        "stop_sequence": null,
        "usage": usage(usage_of),
    })
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
pub(super) fn parse_input(arguments: Option<&str>) -> Value {
    let parsed = arguments.and_then(|s| serde_json::from_str::<Value>(s).ok());
    parsed.filter(Value::is_object).unwrap_or_else(|| Value::Object(Map::new()))
}

/// The four-field messages usage from the priced chat usage (zeros before it is known).
pub(super) fn usage(priced: Option<&PricedUsage>) -> Value {
    let (prompt, cached, completion) =
        priced.map_or((0, 0, 0), |u| (u.figures.prompt_tokens, u.figures.cached_tokens, u.figures.completion_tokens));
    let cached = cached.min(prompt);
    let mut usage = json!({
        "input_tokens": prompt - cached,
        "output_tokens": completion,
        "cache_read_input_tokens": cached,
        "cache_creation_input_tokens": 0,
    });
    // Plan- or Standby-paid usage also carries `cost` (0) and `service` (spec "Messages
    // response"); credit-funded usage carries the four counters only.
    if let Some((from, value)) = priced.and_then(|u| u.figures.paid) {
        usage["cost"] = json!(0);
        usage["service"] =
            json!({ "cost_microcents": 0, "plan_value_microcents": value.0, "paid_from": from.as_str() });
    }
    usage
}
