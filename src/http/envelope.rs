//! The two error envelopes: the chat-dialect (OpenAI-style) one used on every route but the
//! messages routes, and the messages-dialect one (clarification 9). Also the SSE error frame
//! that ends a stream that already started. Pure functions: no logging, no I/O.

use bytes::Bytes;
use serde_json::{Map, Value, json};

use crate::http::error::{ErrorKind, GatewayError};

/// Which envelope a route answers errors in.
#[derive(Clone, Copy, Debug, PartialEq, Eq, Default)]
pub enum Envelope {
    #[default]
    Chat,
    Messages,
}

/// A rendered error response: status, headers and a JSON body.
#[derive(Debug)]
pub struct RenderedError {
    pub status: u16,
    pub headers: Vec<(&'static str, String)>,
    pub body: Bytes,
}

/// Messages-dialect `error.type` by HTTP status (clarification 9).
pub fn messages_error_type(status: u16) -> &'static str {
    match status {
        401 => "authentication_error",
        403 => "permission_error",
        404 => "not_found_error",
        413 => "request_too_large",
        402 => "billing_error",
        429 => "rate_limit_error",
        503 => "overloaded_error",
        // 200: the error frame of a stream that already started (`upstream_stream_error`).
        200 | 500..=599 => "api_error",
        _ => "invalid_request_error",
    }
}

fn chat_body(err: &GatewayError, request_id: &str) -> Value {
    let (_, etype, code) = err.kind.spec();
    let mut inner = Map::with_capacity(4 + err.extra.len());
    inner.insert("message".into(), Value::String(err.message.clone()));
    inner.insert("type".into(), Value::String(etype.into()));
    inner.insert("param".into(), err.param.clone().map(Value::String).unwrap_or(Value::Null));
    inner.insert("code".into(), Value::String(code.into()));
    for (k, v) in &err.extra {
        inner.insert(k.clone(), v.clone());
    }
    json!({ "error": Value::Object(inner), "request_id": request_id })
}

fn messages_body(err: &GatewayError, request_id: &str) -> Value {
    // Spec, Errors (messages routes): a context overflow's message starts with this.
    const OVERFLOW: &str = "prompt is too long";
    let message = if err.kind == ErrorKind::ContextLengthExceeded && !err.message.starts_with(OVERFLOW) {
        format!("{OVERFLOW}: {}", err.message)
    } else {
        err.message.clone()
    };
    json!({
        "type": "error",
        "error": { "type": messages_error_type(err.status()), "message": message },
        "request_id": request_id,
    })
}

/// Render `err` as a complete HTTP error response in the given envelope.
pub fn render(err: &GatewayError, envelope: Envelope, request_id: &str) -> RenderedError {
    let body = match envelope {
        Envelope::Chat => chat_body(err, request_id),
        Envelope::Messages => messages_body(err, request_id),
    };
    let mut headers = err.headers.clone();
    if let Some(secs) = err.retry_after_seconds() {
        headers.push(("retry-after", secs.to_string()));
    }
    RenderedError { status: err.status(), headers, body: Bytes::from(body.to_string()) }
}

/// The frame that ends a stream already opened with 200: the standard envelope as one
/// `data:` frame (chat) or an `event: error` frame (messages). No `[DONE]` follows.
pub fn sse_error_frame(err: &GatewayError, envelope: Envelope, request_id: &str) -> Bytes {
    match envelope {
        Envelope::Chat => Bytes::from(format!("data: {}\n\n", chat_body(err, request_id))),
        Envelope::Messages => Bytes::from(format!("event: error\ndata: {}\n\n", messages_body(err, request_id))),
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn chat_envelope_has_the_four_fields_and_extras_inside_error() {
        let e = GatewayError::new(ErrorKind::ContextLengthExceeded, "too long")
            .with_param("messages")
            .with_field("context_window", 8192);
        let r = render(&e, Envelope::Chat, "req_1");
        let v: Value = serde_json::from_slice(&r.body).unwrap_or_default();
        assert_eq!(r.status, 400);
        assert_eq!(v["error"]["type"], "invalid_request_error");
        assert_eq!(v["error"]["code"], "context_length_exceeded");
        assert_eq!(v["error"]["param"], "messages");
        assert_eq!(v["error"]["context_window"], 8192);
        assert_eq!(v["request_id"], "req_1");
        assert!(v["error"].get("details").is_none());
    }

    #[test]
    fn chat_envelope_param_is_null_when_absent() {
        let r = render(&GatewayError::internal("boom"), Envelope::Chat, "r");
        let v: Value = serde_json::from_slice(&r.body).unwrap_or_default();
        assert!(v["error"]["param"].is_null());
        assert!(r.headers.iter().any(|(k, _)| *k == "retry-after"));
    }

    #[test]
    fn messages_envelope_has_no_code() {
        let e = GatewayError::new(ErrorKind::PayloadTooLarge, "big");
        let r = render(&e, Envelope::Messages, "req_2");
        let v: Value = serde_json::from_slice(&r.body).unwrap_or_default();
        assert_eq!(v["type"], "error");
        assert_eq!(v["error"]["type"], "request_too_large");
        assert!(v["error"].get("code").is_none());
        assert_eq!(v["request_id"], "req_2");
    }

    #[test]
    fn a_messages_context_overflow_starts_with_prompt_is_too_long() {
        let e = GatewayError::new(ErrorKind::ContextLengthExceeded, "The prompt is about 900 tokens.");
        let v: Value = serde_json::from_slice(&render(&e, Envelope::Messages, "r").body).unwrap_or_default();
        assert_eq!(v["error"]["message"], "prompt is too long: The prompt is about 900 tokens.");
        let frame = sse_error_frame(&e, Envelope::Messages, "r");
        assert!(String::from_utf8_lossy(&frame).contains("\"message\":\"prompt is too long: "));
        let chat: Value = serde_json::from_slice(&render(&e, Envelope::Chat, "r").body).unwrap_or_default();
        assert_eq!(chat["error"]["message"], "The prompt is about 900 tokens.", "the chat envelope is unchanged");
    }

    #[test]
    fn messages_types_follow_clarification_9() {
        let cases = [
            (400, "invalid_request_error"),
            (401, "authentication_error"),
            (402, "billing_error"),
            (403, "permission_error"),
            (404, "not_found_error"),
            (413, "request_too_large"),
            (429, "rate_limit_error"),
            (500, "api_error"),
            (502, "api_error"),
            (503, "overloaded_error"),
            (504, "api_error"),
        ];
        for (status, t) in cases {
            assert_eq!(messages_error_type(status), t, "{status}");
        }
    }

    #[test]
    fn error_frames_differ_by_dialect() {
        let e = GatewayError::new(ErrorKind::UpstreamStreamError, "cut");
        let chat = sse_error_frame(&e, Envelope::Chat, "r");
        assert!(chat.starts_with(b"data: {\"error\""));
        assert!(chat.ends_with(b"\n\n"));
        let msg = sse_error_frame(&e, Envelope::Messages, "r");
        assert!(msg.starts_with(b"event: error\ndata: "));
    }
}
