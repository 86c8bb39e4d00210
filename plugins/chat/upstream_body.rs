//! The body the replica gets (clarification 4): `model` as the upstream name, the forwarded
//! members (the rule-1 allowlist and the sampling fields), and on streams the usage the
//! gateway always asks for.
//!
//! On the chat route it is written once from the client's own text: each forwarded member
//! the rules left alone is copied as it arrived (numbers and escapes as the client wrote
//! them, its order kept); a member a rule changed is written from the parsed body. A dialect's
//! body has no such text (it was translated), so it is serialized from the parsed body.

use serde_json::{Map, Value, json};

use tollgate::http::error::GatewayError;
use tollgate::http::json_raw;

/// Forwarded as they are (spec rule 1, plus the fields of clarification 4). A `match`, so a
/// name is found by its length and bytes rather than by comparing it with each of 31.
pub fn is_forwarded(member: &[u8]) -> bool {
    matches!(
        member,
        b"messages"
            | b"max_tokens"
            | b"max_completion_tokens"
            | b"reasoning_effort"
            | b"response_format"
            | b"tools"
            | b"tool_choice"
            | b"n"
            | b"stop"
            | b"temperature"
            | b"top_p"
            | b"audio"
            | b"frequency_penalty"
            | b"function_call"
            | b"functions"
            | b"logit_bias"
            | b"logprobs"
            | b"metadata"
            | b"modalities"
            | b"moderation"
            | b"parallel_tool_calls"
            | b"prediction"
            | b"presence_penalty"
            | b"safety_identifier"
            | b"seed"
            | b"service_tier"
            | b"store"
            | b"top_logprobs"
            | b"user"
            | b"verbosity"
            | b"web_search_options"
    )
}

/// Members that carry schemas: the schema rule (rule 7) may rewrite them, so they are always
/// written from the parsed body.
const SCHEMA_MEMBERS: [&[u8]; 3] = [b"tools", b"functions", b"response_format"];

/// What the rules changed in the parsed body.
#[derive(Debug, Default, Clone, Copy)]
pub struct Changed {
    /// System messages repaired (rule 6).
    pub messages: bool,
    /// `reasoning_effort` put in place of an omitted one (rule 9).
    pub effort: bool,
    /// `max_tokens` / `max_completion_tokens` clamped to the context window (rule 11).
    pub ceilings: bool,
}

impl Changed {
    fn written_from_body(&self, member: &[u8]) -> bool {
        match member {
            b"messages" => self.messages,
            b"reasoning_effort" => self.effort,
            b"max_tokens" | b"max_completion_tokens" => self.ceilings,
            m => SCHEMA_MEMBERS.contains(&m),
        }
    }
}

/// `,"key":` (`model` is always the first member; `key` has no escapes).
fn push_key(out: &mut Vec<u8>, key: &[u8]) {
    out.extend_from_slice(b",\"");
    out.extend_from_slice(key);
    out.extend_from_slice(b"\":");
}

/// `,"key":value` with the value as the client wrote it.
fn push_member(out: &mut Vec<u8>, key: &[u8], value: &[u8]) {
    push_key(out, key);
    out.extend_from_slice(value);
}

/// `,"key":value` with the value serialized from the parsed body, straight into `out`.
fn push_parsed(out: &mut Vec<u8>, key: &[u8], body: &Map<String, Value>) -> Option<()> {
    let value = body.get(std::str::from_utf8(key).ok()?)?;
    push_key(out, key);
    serde_json::to_writer(&mut *out, value).ok()
}

const STREAM_MEMBERS: &[u8] = br#","stream":true,"stream_options":{"include_usage":true}}"#;

/// The replica's body from the client's `text`, whose parse (after the rules) is `body`.
/// `None` when `text` is not a JSON object (it always is: it parsed into `body`) or a member
/// name in it is escaped (`"\u006e"`, which no client writes): the caller then serializes.
pub fn from_client_text(
    text: &[u8],
    body: &Map<String, Value>,
    upstream: &str,
    stream: bool,
    changed: Changed,
) -> Option<Vec<u8>> {
    let members = json_raw::object_members(text)?;
    if members.iter().any(|(key, _)| key.contains(&b'\\')) {
        return None;
    }
    let mut out = Vec::with_capacity(text.len() + upstream.len() + STREAM_MEMBERS.len());
    out.extend_from_slice(b"{\"model\":");
    json_raw::write_string(&mut out, upstream);
    // Where each forwarded member last appears (at most 31 names): of a repeated member only
    // the last is sent, the one the parse kept and the rules checked. One pass with a short
    // list, so a body of many repeats costs no more than its length.
    let mut last: Vec<(&[u8], usize)> = Vec::with_capacity(8);
    for (i, &(key, _)) in members.iter().enumerate() {
        // `model`, `stream` and `stream_options` are not in the list: written here.
        if is_forwarded(key) {
            match last.iter_mut().find(|(k, _)| *k == key) {
                Some(slot) => slot.1 = i,
                None => last.push((key, i)),
            }
        }
    }
    last.sort_unstable_by_key(|&(_, i)| i);
    let mut has_effort = false;
    for &(key, i) in &last {
        has_effort |= key == b"reasoning_effort";
        if changed.written_from_body(key) {
            push_parsed(&mut out, key, body)?;
        } else {
            push_member(&mut out, key, members[i].1);
        }
    }
    // A member a rule added (an effort in place of an omitted one).
    if changed.effort && !has_effort {
        push_parsed(&mut out, b"reasoning_effort", body)?;
    }
    if stream {
        out.extend_from_slice(STREAM_MEMBERS);
    } else {
        out.push(b'}');
    }
    Some(out)
}

/// The replica's body serialized from the parsed `body` (a dialect's translation).
pub fn serialize(body: Map<String, Value>, upstream: &str, stream: bool) -> Result<Vec<u8>, GatewayError> {
    let mut out = Map::with_capacity(body.len() + 2);
    out.insert("model".into(), Value::String(upstream.to_string()));
    // The body's own members (a handful) looked up in the list, not the list's thirty-one
    // looked up in the body; the keys move over without a copy.
    for (field, v) in body {
        if is_forwarded(field.as_bytes()) {
            out.insert(field, v);
        }
    }
    if stream {
        out.insert("stream".into(), Value::Bool(true));
        // Always asked for, so the stream can be settled; forwarded to the client only
        // when it asked (see stream.rs).
        out.insert("stream_options".into(), json!({ "include_usage": true }));
    }
    serde_json::to_vec(&Value::Object(out))
        .map_err(|e| GatewayError::internal(format!("could not serialize the body: {e}")))
}

#[cfg(test)]
#[allow(clippy::unwrap_used, clippy::expect_used, clippy::panic)]
#[path = "upstream_body_tests.rs"]
mod tests;
