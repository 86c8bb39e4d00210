//! Editing JSON objects without building a `serde_json::Value`.
//!
//! A response frame is mostly passed through: only a few members change (the model name,
//! a reasoning field, the usage object). Parsing the whole frame into a `Value` and
//! serializing it back allocates a string or map per member and was most of the gateway's
//! CPU on a stream. Here an object is split into its members, each value kept as the raw
//! text it arrived as (validated, never copied), and written back with only the edited
//! members replaced. Values keep their exact text (numbers are never re-formatted); the
//! object itself is written compactly, in the order it arrived.

use std::borrow::Cow;
use std::fmt;

use bytes::BufMut;
use serde::de::{self, Deserialize, Deserializer, MapAccess, Visitor};
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

/// The members of one JSON object, in order, each value as its raw text.
#[derive(Debug)]
pub struct Members<'a>(pub Vec<(Str<'a>, &'a RawValue)>);

impl<'de> Deserialize<'de> for Members<'de> {
    fn deserialize<D: Deserializer<'de>>(d: D) -> Result<Self, D::Error> {
        struct V;
        impl<'de> Visitor<'de> for V {
            type Value = Members<'de>;
            fn expecting(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
                f.write_str("a JSON object")
            }
            fn visit_map<A: MapAccess<'de>>(self, mut map: A) -> Result<Members<'de>, A::Error> {
                let mut list = Vec::with_capacity(map.size_hint().unwrap_or(8));
                while let Some((k, v)) = map.next_entry::<Str<'de>, &'de RawValue>()? {
                    list.push((k, v));
                }
                Ok(Members(list))
            }
        }
        d.deserialize_map(V)
    }
}

impl<'a> Members<'a> {
    /// `None` when `text` is not a valid JSON object, or repeats a key (a `Value` keeps the
    /// last of repeated keys; callers fall back to it for such input).
    pub fn parse(text: &'a [u8]) -> Option<Self> {
        let m: Members<'a> = serde_json::from_slice(text).ok()?;
        let keys = &m.0;
        for (i, (k, _)) in keys.iter().enumerate() {
            if keys[..i].iter().any(|(other, _)| other == k) {
                return None;
            }
        }
        Some(m)
    }

    /// Members of a raw value that is an object; `None` otherwise (see `parse`).
    pub fn of(raw: &'a RawValue) -> Option<Self> {
        Members::parse(raw.get().as_bytes())
    }

    pub fn get(&self, key: &str) -> Option<&'a RawValue> {
        self.0.iter().find(|(k, _)| k.0 == key).map(|(_, v)| *v)
    }
}

pub fn is_null(raw: &RawValue) -> bool {
    raw.get() == "null"
}

pub fn is_object(raw: &RawValue) -> bool {
    raw.get().starts_with('{')
}

pub fn is_array(raw: &RawValue) -> bool {
    raw.get().starts_with('[')
}

/// The string a raw value holds, if it is a string.
pub fn as_str(raw: &RawValue) -> Option<Str<'_>> {
    if !raw.get().starts_with('"') {
        return None;
    }
    serde_json::from_str(raw.get()).ok()
}

/// Writes one JSON object member by member.
pub struct ObjectWriter<'o, B: BufMut> {
    out: &'o mut B,
    empty: bool,
}

impl<'o, B: BufMut> ObjectWriter<'o, B> {
    pub fn new(out: &'o mut B) -> Self {
        out.put_u8(b'{');
        ObjectWriter { out, empty: true }
    }

    fn key(&mut self, key: &str) {
        if !self.empty {
            self.out.put_u8(b',');
        }
        self.empty = false;
        write_string(self.out, key);
        self.out.put_u8(b':');
    }

    /// A member whose value is raw JSON text.
    pub fn raw(&mut self, key: &str, value: &str) {
        self.key(key);
        self.out.put_slice(value.as_bytes());
    }

    /// A member whose value is written by `f`.
    pub fn with(&mut self, key: &str, f: impl FnOnce(&mut B)) {
        self.key(key);
        f(self.out);
    }

    pub fn finish(self) {
        self.out.put_u8(b'}');
    }
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

/// `v` as JSON.
pub fn write_json<B: BufMut, T: serde::Serialize + ?Sized>(out: &mut B, v: &T) {
    if let Err(e) = serde_json::to_writer((&mut *out).writer(), v) {
        log::warn!("value not serialized: {e}");
        out.put_slice(b"null");
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn members_keep_raw_text_and_order() {
        let m = Members::parse(br#"{"b": 1.50, "a":{"x":[1, 2]},"c\n":"q\"s"}"#).unwrap_or(Members(vec![]));
        let keys: Vec<&str> = m.0.iter().map(|(k, _)| k.0.as_ref()).collect();
        assert_eq!(keys, ["b", "a", "c\n"]);
        assert_eq!(m.get("b").map(RawValue::get), Some("1.50"));
        assert_eq!(m.get("a").map(RawValue::get), Some(r#"{"x":[1, 2]}"#));
        assert_eq!(m.get("c\n").and_then(as_str).map(|s| s.0.into_owned()), Some("q\"s".to_string()));
    }

    #[test]
    fn repeated_keys_and_non_objects_are_refused() {
        assert!(Members::parse(br#"{"a":1,"a":2}"#).is_none());
        assert!(Members::parse(b"[1]").is_none());
        assert!(Members::parse(b"{\"a\":").is_none());
    }

    #[test]
    fn writer_round_trips() {
        let m = Members::parse(br#"{"k\"ey":[1,2], "n":null}"#).unwrap_or(Members(vec![]));
        let mut out: Vec<u8> = Vec::new();
        let mut w = ObjectWriter::new(&mut out);
        for (k, v) in &m.0 {
            w.raw(&k.0, v.get());
        }
        w.with("extra", |b| write_json(b, &serde_json::json!({"z": true})));
        w.finish();
        let v: serde_json::Value = serde_json::from_slice(&out).unwrap_or_default();
        assert_eq!(v, serde_json::json!({"k\"ey":[1,2],"n":null,"extra":{"z":true}}));
    }
}
