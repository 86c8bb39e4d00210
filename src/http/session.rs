//! Session affinity: which conversation a request belongs to (spec "Session affinity",
//! clarification 14), as a key that never holds the identity itself. The first valid
//! identity in the spec's order names the session; an invalid candidate is skipped and never
//! masks a valid one below it. Without one, the opening messages name it (decision 115).
//! The key is a 64-bit SipHash-1-3 of the workspace id, the namespace and the identity
//! (decision 135): scoped to the workspace, never stored or logged raw, and the headers that
//! carried it are not forwarded.

use http::HeaderMap;
use serde_json::Value;
use siphasher::sip::SipHasher13;
use std::hash::Hasher;

/// Header names as constants: a lookup by a `HeaderName` hashes it without parsing and
/// lowercasing the name again on every request.
mod names {
    use http::HeaderName;
    pub const SERVICE_SESSION: HeaderName = HeaderName::from_static("x-service-session");
    pub const SESSION_ID: HeaderName = HeaderName::from_static("x-session-id");
    pub const AGENT1_SESSION: HeaderName = HeaderName::from_static("x-agent1-session-id");
    pub const AGENT1_AGENT: HeaderName = HeaderName::from_static("x-agent1-agent-id");
    pub const AGENT2_SESSION: HeaderName = HeaderName::from_static("x-agent2-session-id");
    pub const SESSION_AFFINITY: HeaderName = HeaderName::from_static("x-session-affinity");
    pub const AFFINITY: HeaderName = HeaderName::from_static("x-affinity");
    pub const THREAD_ID: HeaderName = HeaderName::from_static("thread-id");
    pub const AGENT3_SESSION: HeaderName = HeaderName::from_static("session-id");
    pub const AGENT3_WINDOW: HeaderName = HeaderName::from_static("x-agent3-window-id");
    pub const PARENT_SESSION: HeaderName = HeaderName::from_static("x-parent-session-id");
}
use names::*;

/// Headers that may name a session; none of them reaches a replica.
pub const SESSION_HEADERS: [http::HeaderName; 11] = [
    SERVICE_SESSION,
    SESSION_ID,
    AGENT1_SESSION,
    AGENT1_AGENT,
    AGENT2_SESSION,
    SESSION_AFFINITY,
    AFFINITY,
    THREAD_ID,
    AGENT3_SESSION,
    AGENT3_WINDOW,
    PARENT_SESSION,
];

/// The resolved identity (with its agent namespace) is at most this long.
const MAX_IDENTITY: usize = 256;

/// How a request was placed.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum PlacedBy {
    /// A session identity named it.
    Session,
    /// No identity: its opening messages did.
    Opening,
    /// Nothing named it: the least-loaded replica.
    Load,
}

impl PlacedBy {
    pub fn as_str(self) -> &'static str {
        match self {
            PlacedBy::Session => "session",
            PlacedBy::Opening => "opening",
            PlacedBy::Load => "load",
        }
    }
}

/// A request's affinity: the hashed key and what named it.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct Affinity {
    pub key: u64,
    pub by: PlacedBy,
}

/// `service.sessionId` and `x-service-session`: 1 to 128 of letters, digits, `.`, `_`, `:`, `-`.
fn service_shape(v: &str) -> bool {
    (1..=128).contains(&v.len()) && v.bytes().all(|b| b.is_ascii_alphanumeric() || b".-_:".contains(&b))
}

/// A header value: nonempty after trimming, free of control characters.
fn header_value<'a>(h: &'a HeaderMap, name: &http::HeaderName) -> Option<&'a str> {
    let v = h.get(name)?.to_str().ok()?.trim();
    (!v.is_empty() && !v.chars().any(char::is_control)).then_some(v)
}

/// The identity when it fits: an agent's namespace counts toward the bound ("the resolved
/// identity (with any agent namespace) at most 256 characters"), the others do not.
fn bounded(ns: &'static str, id: String) -> Option<(&'static str, String)> {
    let counted = if ns.starts_with("agent") { ns.len() + 1 } else { 0 };
    (counted + id.chars().count() <= MAX_IDENTITY).then_some((ns, id))
}

/// The session a request names: (namespace, identity), in the spec's order.
pub fn resolve(h: &HeaderMap, body: Option<&Value>) -> Option<(&'static str, String)> {
    // Members looked up one by one: `Value::pointer` unescapes its path into new strings.
    let from_body = |path: &[&str]| path.iter().try_fold(body?, |v, member| v.get(member)).and_then(Value::as_str);
    let generic = |name: &http::HeaderName| header_value(h, name).and_then(|v| bounded("generic", v.to_string()));
    let agent3 = header_value(h, &AGENT3_WINDOW).is_some();
    let own = from_body(&["service", "sessionId"])
        .filter(|v| service_shape(v))
        .map(|v| ("service", v.to_string()))
        .or_else(|| header_value(h, &SERVICE_SESSION).filter(|v| service_shape(v)).map(|v| ("service", v.to_string())))
        .or_else(|| generic(&SESSION_ID))
        .or_else(|| {
            let session = header_value(h, &AGENT1_SESSION)?;
            let id = match header_value(h, &AGENT1_AGENT) {
                Some(agent) => format!("{session}/{agent}"),
                None => session.to_string(),
            };
            bounded("agent1", id).or_else(|| bounded("agent1", session.to_string()))
        })
        .or_else(|| header_value(h, &AGENT2_SESSION).and_then(|v| bounded("agent2", v.to_string())))
        .or_else(|| generic(&SESSION_AFFINITY))
        .or_else(|| generic(&AFFINITY))
        .or_else(|| if agent3 { generic(&THREAD_ID) } else { None })
        .or_else(|| if agent3 { generic(&AGENT3_SESSION) } else { None });
    own.or_else(|| generic(&PARENT_SESSION)).or_else(|| {
        let key = from_body(&["prompt_cache_key"]).map(str::trim).filter(|v| !v.is_empty())?;
        bounded("prompt_cache_key", key.to_string())
    })
}

/// Each part of the opening counts up to this many bytes: enough to tell conversations
/// apart, and a long first message costs no more to hash than a short one.
const OPENING_PART: usize = 4096;

fn clipped(s: &str) -> &str {
    let mut end = s.len().min(OPENING_PART);
    while !s.is_char_boundary(end) {
        end -= 1;
    }
    &s[..end]
}

/// Text of a message's content (a string, or the text parts of a list), clipped.
fn content_text(m: &Value) -> String {
    match m.get("content") {
        Some(Value::String(s)) => clipped(s).to_string(),
        Some(Value::Array(parts)) => {
            let all = parts.iter().filter_map(|p| p.get("text").and_then(Value::as_str)).collect::<Vec<_>>().join("\n");
            clipped(&all).to_string()
        }
        _ => String::new(),
    }
}

/// The opening of a conversation: the `user` value, the leading system or developer text,
/// the first user message; the same on every turn of one conversation (decision 115).
pub fn opening(body: &Value) -> Option<String> {
    let mut out = String::new();
    if let Some(u) = body.get("user").and_then(Value::as_str) {
        out.push_str(clipped(u));
    }
    out.push('\u{1}');
    if let Some(s) = body.get("system") {
        // The messages dialect keeps its system prompt beside the messages.
        out.push_str(&content_text(&serde_json::json!({ "content": s })));
    }
    if let Some(s) = body.get("instructions").and_then(Value::as_str) {
        out.push_str(clipped(s));
    }
    let messages = body.get("messages").or_else(|| body.get("input")).and_then(Value::as_array);
    let mut first_user = None;
    for m in messages.into_iter().flatten() {
        match m.get("role").and_then(Value::as_str) {
            Some("system" | "developer") if first_user.is_none() => out.push_str(&content_text(m)),
            Some("user") => {
                first_user = Some(content_text(m));
                break;
            }
            _ => {}
        }
    }
    let first_user = match (first_user, body.get("input").and_then(Value::as_str)) {
        (Some(f), _) => f,
        (None, Some(s)) => clipped(s).to_string(),
        (None, None) => return None,
    };
    out.push('\u{1}');
    out.push_str(&first_user);
    Some(out)
}

/// The affinity key: the identity hashed with the workspace id and its namespace.
/// SipHash's output is fixed by its specification and these keys, so every instance and
/// version computes the same key (placements are shared on Redis). It is not a secret: a
/// collision only moves a request's placement, it never crosses data between sessions.
pub fn key(workspace_id: &str, namespace: &str, identity: &str) -> u64 {
    let mut h = SipHasher13::new_with_keys(AFFINITY_K0, AFFINITY_K1);
    for part in [workspace_id, namespace, identity] {
        h.write(&(part.len() as u64).to_le_bytes());
        h.write(part.as_bytes());
    }
    h.finish()
}

const AFFINITY_K0: u64 = u64::from_le_bytes(*b"tollgate");
const AFFINITY_K1: u64 = u64::from_le_bytes(*b"affinity");

/// The request's affinity: its session, else its opening messages, else none (load).
pub fn affinity(workspace_id: &str, h: &HeaderMap, body: Option<&Value>) -> Option<Affinity> {
    if let Some((ns, id)) = resolve(h, body) {
        return Some(Affinity { key: key(workspace_id, ns, &id), by: PlacedBy::Session });
    }
    let open = opening(body?)?;
    Some(Affinity { key: key(workspace_id, "opening", &open), by: PlacedBy::Opening })
}

#[cfg(test)]
#[path = "session_tests.rs"]
mod tests;
