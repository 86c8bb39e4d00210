//! JSON text of translated responses, keeping `usage.cost` in the fixed eight-decimal form.
//!
//! The chat path writes `cost` as `0.00001234` (docs/decisions.md 1). Once parsed into a
//! `serde_json::Value` it is a float, and writing it back would give `1.234e-5`. Wherever a
//! `usage` object carries `service.cost_microcents`, its `cost` is rewritten from that
//! integer instead, so the dialects quote the same text the chat dialect does.

use serde_json::Value;

use tollgate::money::usage::dollars;

/// `v` as JSON text, with every `usage.cost` rendered from `usage.service.cost_microcents`.
pub fn to_vec(v: &Value) -> Vec<u8> {
    let mut out = Vec::with_capacity(256);
    write(&mut out, v, false);
    out
}

fn write(out: &mut Vec<u8>, v: &Value, is_usage: bool) {
    match v {
        Value::Object(map) => {
            let micro = if is_usage { map.get("service").and_then(|s| s.get("cost_microcents")) } else { None };
            let micro = micro.and_then(Value::as_u64);
            out.push(b'{');
            for (i, (k, val)) in map.iter().enumerate() {
                if i > 0 {
                    out.push(b',');
                }
                scalar(out, &Value::String(k.clone()));
                out.push(b':');
                match (k.as_str(), micro) {
                    ("cost", Some(m)) if val.is_number() => out.extend_from_slice(dollars(m).as_bytes()),
                    _ => write(out, val, k == "usage"),
                }
            }
            out.push(b'}');
        }
        Value::Array(items) => {
            out.push(b'[');
            for (i, item) in items.iter().enumerate() {
                if i > 0 {
                    out.push(b',');
                }
                write(out, item, false);
            }
            out.push(b']');
        }
        other => scalar(out, other),
    }
}

fn scalar(out: &mut Vec<u8>, v: &Value) {
    // Writing a scalar into a Vec cannot fail; `null` keeps the text valid if it ever did.
    if serde_json::to_writer(&mut *out, v).is_err() {
        out.extend_from_slice(b"null");
    }
}

/// One event-named SSE frame: `event: NAME\ndata: JSON\n\n`.
pub fn sse_event(out: &mut bytes::BytesMut, name: &str, data: &Value) {
    out.extend_from_slice(b"event: ");
    out.extend_from_slice(name.as_bytes());
    out.extend_from_slice(b"\ndata: ");
    out.extend_from_slice(&to_vec(data));
    out.extend_from_slice(b"\n\n");
}
