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

/// Parse `text` as `T`. Valid UTF-8 (every body a client or replica sends, nearly) is parsed
/// as a `&str`, whose strings and raw values serde_json then borrows without checking each
/// one's UTF-8 again; anything else goes through the byte parser, so the result and its
/// errors are exactly `serde_json::from_slice`'s.
pub fn from_text<'a, T: Deserialize<'a>>(text: &'a [u8]) -> serde_json::Result<T> {
    match std::str::from_utf8(text) {
        Ok(s) => serde_json::from_str(s),
        Err(_) => serde_json::from_slice(text),
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
    let text = raw.get();
    if !text.starts_with('"') {
        return None;
    }
    // A raw value is text a parse accepted, so a string with no backslash holds exactly the
    // text between its quotes: borrowed without running the parser again (every stream
    // frame's content, reasoning and finish reason are read this way).
    if let Some(inner) = text.strip_prefix('"').and_then(|t| t.strip_suffix('"')) {
        if memchr::memchr(b'\\', inner.as_bytes()).is_none() {
            return Some(Str(Cow::Borrowed(inner)));
        }
    }
    serde_json::from_str(text).ok()
}

/// One member of an object as raw text: the key between its quotes (escapes not decoded)
/// and the value.
pub type RawMember<'a> = (&'a [u8], &'a [u8]);

/// The members of the JSON object `text`, in order, without parsing their values: for text a
/// parser already accepted (a request body that parsed), so it only finds where each member
/// is, a few instructions a byte. Text that is not an object, or not JSON, gives `None` or
/// spans of no use, never a panic.
pub fn object_members(text: &[u8]) -> Option<Vec<RawMember<'_>>> {
    let mut members = Vec::with_capacity(8);
    let mut i = skip_ws(text, 0);
    if text.get(i) != Some(&b'{') {
        return None;
    }
    i = skip_ws(text, i + 1);
    if text.get(i) == Some(&b'}') {
        return Some(members);
    }
    loop {
        if text.get(i) != Some(&b'"') {
            return None;
        }
        let key_end = string_end(text, i)?;
        let key = &text[i + 1..key_end - 1];
        i = skip_ws(text, key_end);
        if text.get(i) != Some(&b':') {
            return None;
        }
        let start = skip_ws(text, i + 1);
        let end = value_end(text, start)?;
        members.push((key, &text[start..end]));
        i = skip_ws(text, end);
        match text.get(i) {
            Some(b',') => i = skip_ws(text, i + 1),
            Some(b'}') => return Some(members),
            _ => return None,
        }
    }
}

fn skip_ws(text: &[u8], mut i: usize) -> usize {
    while matches!(text.get(i), Some(b' ' | b'\t' | b'\n' | b'\r')) {
        i += 1;
    }
    i
}

/// Just past the string opening at `text[start]`.
fn string_end(text: &[u8], start: usize) -> Option<usize> {
    let mut i = start + 1;
    loop {
        i += memchr::memchr2(b'"', b'\\', text.get(i..)?)?;
        if text[i] == b'"' {
            return Some(i + 1);
        }
        i += 2; // an escape: the next byte is never the string's end
    }
}

/// Just past the value starting at `text[start]`.
fn value_end(text: &[u8], start: usize) -> Option<usize> {
    match *text.get(start)? {
        b'"' => string_end(text, start),
        b'{' | b'[' => {
            // Byte by byte: request bodies are mostly short tokens, where a vector search's
            // setup costs more than it saves; strings (the long part of a prompt) use one.
            let mut depth = 0usize;
            let mut i = start;
            while let Some(&b) = text.get(i) {
                match b {
                    b'"' => {
                        i = string_end(text, i)?;
                        continue;
                    }
                    b'{' | b'[' => depth += 1,
                    b'}' | b']' => {
                        depth = depth.checked_sub(1)?;
                        if depth == 0 {
                            return Some(i + 1);
                        }
                    }
                    _ => {}
                }
                i += 1;
            }
            None
        }
        _ => {
            let len = text[start..].iter().position(|b| matches!(b, b',' | b'}' | b']' | b' ' | b'\t' | b'\n' | b'\r'));
            Some(start + len.unwrap_or(text.len() - start)).filter(|&end| end > start)
        }
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

#[cfg(test)]
mod tests {
    use super::*;

    fn raw(text: &str) -> &RawValue {
        serde_json::from_str(text).unwrap_or_else(|_| panic!("{text}"))
    }

    #[test]
    fn text_parses_as_the_byte_parser_parses_it() {
        let cases: [&[u8]; 5] = [
            br#"{"a":"caf\u00e9","b":[1,2.5,null]}"#,
            b"{\"a\":1,}",
            b"{\"a\":\"\xff\"}",
            b"[1",
            "{\"é\":\"ü\"}".as_bytes(),
        ];
        for text in cases {
            let by_text = from_text::<serde_json::Value>(text).map_err(|e| e.to_string());
            let by_bytes = serde_json::from_slice::<serde_json::Value>(text).map_err(|e| e.to_string());
            assert_eq!(by_text, by_bytes, "{}", String::from_utf8_lossy(text));
        }
        assert!(from_text::<serde_json::Value>(b"{\"a\":\"\xff\"}").is_err(), "invalid UTF-8 is refused");
    }

    #[test]
    fn members_are_found_where_a_parser_finds_them() {
        let text = br#" { "a" : "x\"}" , "b\\":[{"c":"]"},[]], "n":-1.5e3,"t":true ,"o":{}}"#;
        let found = object_members(text).unwrap_or_default();
        let by_parser: Vec<(String, Box<RawValue>)> =
            serde_json::from_slice::<serde_json::Map<String, serde_json::Value>>(text)
                .map(|m| m.into_iter().map(|(k, v)| (k, serde_json::value::to_raw_value(&v).unwrap())).collect())
                .unwrap_or_default();
        assert_eq!(found.len(), 5);
        let keys: Vec<&[u8]> = found.iter().map(|m| m.0).collect();
        assert_eq!(keys, [&b"a"[..], br"b\\", b"n", b"t", b"o"]);
        for (key, value) in &found {
            let key = serde_json::from_slice::<String>(&[b"\"", *key, b"\""].concat()).unwrap_or_default();
            let parsed = serde_json::from_slice::<serde_json::Value>(value).unwrap_or_default();
            let expected = by_parser.iter().find(|(k, _)| *k == key).map(|(_, v)| v.get());
            assert_eq!(Some(parsed.to_string().as_str()), expected, "{key}");
        }
        assert_eq!(object_members(b"{}").map(|m| m.len()), Some(0));
        for not_an_object in [&b"[1]"[..], b"", b"{", b"{\"a\"}", b"{\"a\":}", b"{\"a\":[1}", b"{\"a\":\"x"] {
            assert!(object_members(not_an_object).is_none(), "{}", String::from_utf8_lossy(not_an_object));
        }
    }

    #[test]
    fn strings_borrow_unless_escaped_and_other_values_are_not_strings() {
        assert!(matches!(as_str(raw(r#""plain""#)), Some(Str(Cow::Borrowed("plain")))));
        assert_eq!(as_str(raw(r#""q\"s""#)).map(|s| s.0.into_owned()), Some("q\"s".to_string()));
        assert!(as_str(raw("1")).is_none() && as_str(raw("null")).is_none());
        assert!(is_null(raw("null")) && is_object(raw(r#"{"a":1}"#)) && !is_object(raw("[1]")));
    }

    #[test]
    fn strings_read_as_the_parser_reads_them() {
        let cases = [
            r#""""#,
            r#""caf\u00e9 \ud83d\ude00""#,
            r#""tab\there""#,
            r#""ends with a backslash\\""#,
            r#""\"quoted\"""#,
            "\"ünïcödé ✓ 😀\"",
            r#""slash / and ' quote""#,
        ];
        for text in cases {
            let parsed: String = serde_json::from_str(text).unwrap_or_else(|_| panic!("{text}"));
            let read = as_str(raw(text)).unwrap_or_else(|| panic!("{text}"));
            assert_eq!(read.0, parsed, "{text}");
            // Borrowed from the text exactly when there is nothing to decode.
            assert_eq!(matches!(read.0, Cow::Borrowed(_)), !text.contains('\\'), "{text}");
        }
        // A member of a larger text too.
        #[derive(serde::Deserialize)]
        struct Holder<'a> {
            #[serde(borrow)]
            s: &'a RawValue,
        }
        let holder: Holder<'_> = serde_json::from_str(r#"{ "s" : "in \"here\"" }"#).unwrap_or_else(|e| panic!("{e}"));
        assert_eq!(as_str(holder.s).map(|s| s.0.into_owned()).as_deref(), Some("in \"here\""));
        let plain: Holder<'_> = serde_json::from_str(r#"{"s":"plain text"}"#).unwrap_or_else(|e| panic!("{e}"));
        assert!(matches!(as_str(plain.s), Some(Str(Cow::Borrowed("plain text")))));
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
