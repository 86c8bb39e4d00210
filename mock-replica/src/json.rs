//! Hand-rolled JSON writing for the hot paths.
//!
//! The mock must cost far less than the gateway it benchmarks, so responses
//! are written straight into one `BytesMut` instead of building a
//! `serde_json::Value` tree per request. Only strings that come from the
//! outside (model and tool names) need escaping; everything else is ASCII we
//! control.

use std::fmt::Write as _;

use bytes::{BufMut, BytesMut};
use http::StatusCode;

/// Appends `s` as a quoted JSON string.
pub fn push_str(out: &mut BytesMut, s: &str) {
    out.put_u8(b'"');
    let bytes = s.as_bytes();
    // Copy runs of safe bytes in one go; escape the rare special ones.
    let mut start = 0;
    for (i, &b) in bytes.iter().enumerate() {
        let escape: &[u8] = match b {
            b'"' => b"\\\"",
            b'\\' => b"\\\\",
            b'\n' => b"\\n",
            b'\r' => b"\\r",
            b'\t' => b"\\t",
            0..=0x1f => b"",
            _ => continue,
        };
        out.put_slice(&bytes[start..i]);
        if escape.is_empty() {
            push_fmt(out, format_args!("\\u{b:04x}"));
        } else {
            out.put_slice(escape);
        }
        start = i + 1;
    }
    out.put_slice(&bytes[start..]);
    out.put_u8(b'"');
}

/// Appends a JSON string or `null`.
pub fn push_opt_str(out: &mut BytesMut, s: Option<&str>) {
    match s {
        Some(s) => push_str(out, s),
        None => out.put_slice(b"null"),
    }
}

/// Appends a decimal number.
pub fn push_u64(out: &mut BytesMut, n: u64) {
    push_fmt(out, format_args!("{n}"));
}

fn push_fmt(out: &mut BytesMut, args: std::fmt::Arguments<'_>) {
    // `BytesMut`'s `fmt::Write` only grows the buffer, it never fails.
    let _ = out.write_fmt(args);
}

/// vLLM's error body: `{"object":"error","message":..,"type":..,"param":null,"code":..}`.
pub fn error_body(status: StatusCode, message: &str) -> BytesMut {
    let mut out = BytesMut::with_capacity(128 + message.len());
    out.put_slice(b"{\"object\":\"error\",\"message\":");
    push_str(&mut out, message);
    out.put_slice(b",\"type\":");
    push_str(&mut out, error_type(status));
    out.put_slice(b",\"param\":null,\"code\":");
    push_u64(&mut out, u64::from(status.as_u16()));
    out.put_u8(b'}');
    out
}

/// The `type` vLLM reports for a status (it mirrors OpenAI's error classes).
fn error_type(status: StatusCode) -> &'static str {
    match status.as_u16() {
        400 => "BadRequestError",
        401 => "AuthenticationError",
        403 => "PermissionDeniedError",
        404 => "NotFoundError",
        408 => "TimeoutError",
        422 => "UnprocessableEntityError",
        429 => "RateLimitError",
        501 => "NotImplementedError",
        503 => "ServiceUnavailableError",
        s if s < 500 => "BadRequestError",
        _ => "InternalServerError",
    }
}

#[cfg(test)]
#[allow(clippy::unwrap_used)]
mod tests {
    use super::*;

    #[test]
    fn escapes_like_serde() {
        for s in ["plain", "quo\"te", "back\\slash", "nl\nx\ttab\u{1}", "ünï"] {
            let mut out = BytesMut::new();
            push_str(&mut out, s);
            let expected = serde_json::to_string(s).unwrap();
            assert_eq!(std::str::from_utf8(&out).unwrap(), expected);
        }
    }

    #[test]
    fn error_body_is_vllm_shaped() {
        let body = error_body(StatusCode::TOO_MANY_REQUESTS, "mock failure");
        let v: serde_json::Value = serde_json::from_slice(&body).unwrap();
        assert_eq!(v["object"], "error");
        assert_eq!(v["message"], "mock failure");
        assert_eq!(v["type"], "RateLimitError");
        assert_eq!(v["param"], serde_json::Value::Null);
        assert_eq!(v["code"], 429);
    }
}
