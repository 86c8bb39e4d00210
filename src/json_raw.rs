//! Small helpers for JSON kept as raw text (`serde_json::value::RawValue`).
//!
//! A replica's answer is mostly passed through: only a few members change (the model name,
//! a reasoning field, the usage object). The chat path reads each body or frame into a
//! borrowed view whose values stay the raw text they arrived as (validated, never copied)
//! and edits that text in place; these are the helpers it reads and writes values with.

use std::borrow::Cow;
use std::fmt;

use bytes::BufMut;
use serde::de::{self, Deserialize, Deserializer, Visitor};
use serde_json::value::RawValue;

/// A JSON string, borrowed from the input when it has no escapes.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct Str<'a>(pub Cow<'a, str>);

impl<'de> Deserialize<'de> for Str<'de> {
    fn deserialize<D: Deserializer<'de>>(d: D) -> Result<Self, D::Error> {
        struct V;
        impl<'de> Visitor<'de> for V {
            type Value = Str<'de>;
            fn expecting(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
                f.write_str("a string")
            }
            fn visit_borrowed_str<E: de::Error>(self, v: &'de str) -> Result<Str<'de>, E> {
                Ok(Str(Cow::Borrowed(v)))
            }
            fn visit_str<E: de::Error>(self, v: &str) -> Result<Str<'de>, E> {
                Ok(Str(Cow::Owned(v.to_owned())))
            }
            fn visit_string<E: de::Error>(self, v: String) -> Result<Str<'de>, E> {
                Ok(Str(Cow::Owned(v)))
            }
        }
        d.deserialize_str(V)
    }
}

pub fn is_null(raw: &RawValue) -> bool {
    raw.get() == "null"
}

pub fn is_object(raw: &RawValue) -> bool {
    raw.get().starts_with('{')
}

/// The string a raw value holds, if it is a string.
pub fn as_str(raw: &RawValue) -> Option<Str<'_>> {
    if !raw.get().starts_with('"') {
        return None;
    }
    serde_json::from_str(raw.get()).ok()
}

/// `s` as a JSON string.
pub fn write_string<B: BufMut>(out: &mut B, s: &str) {
    if s.bytes().all(|b| b >= 0x20 && b != b'"' && b != b'\\') {
        out.put_u8(b'"');
        out.put_slice(s.as_bytes());
        out.put_u8(b'"');
    } else if let Err(e) = serde_json::to_writer((&mut *out).writer(), s) {
        // Writing into memory does not fail; keep the output valid JSON regardless.
        log::warn!("string not serialized: {e}");
        out.put_slice(b"\"\"");
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    fn raw(text: &str) -> &RawValue {
        serde_json::from_str(text).unwrap_or_else(|_| panic!("{text}"))
    }

    #[test]
    fn strings_borrow_unless_escaped_and_other_values_are_not_strings() {
        assert!(matches!(as_str(raw(r#""plain""#)), Some(Str(Cow::Borrowed("plain")))));
        assert_eq!(as_str(raw(r#""q\"s""#)).map(|s| s.0.into_owned()), Some("q\"s".to_string()));
        assert!(as_str(raw("1")).is_none() && as_str(raw("null")).is_none());
        assert!(is_null(raw("null")) && is_object(raw(r#"{"a":1}"#)) && !is_object(raw("[1]")));
    }

    #[test]
    fn written_strings_are_json() {
        for s in ["plain", "q\"s", "line\nbreak", "back\\slash", "\u{1}"] {
            let mut out: Vec<u8> = Vec::new();
            write_string(&mut out, s);
            assert_eq!(serde_json::from_slice::<String>(&out).ok().as_deref(), Some(s));
        }
    }
}
