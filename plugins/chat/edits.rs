//! Edits to a replica's JSON text, located by the borrowed view's raw values: replace a
//! value, remove a member, rename a member's key, add a member. Everything not edited is
//! copied as it arrived (numbers never re-formatted, member order kept), so forwarding a
//! frame costs one parse and one copy whatever it carries.
//!
//! The text was validated by the parse that produced the raw values, so a value's key is
//! found by reading backwards over `"key"` `:` and white space. A place that cannot be
//! located (which valid JSON never gives) makes the edit fail, and the caller treats the
//! text as malformed rather than send invalid JSON.

use std::borrow::Cow;

use bytes::{BufMut, Bytes};
use serde_json::value::RawValue;

/// One splice: (start, end, replacement).
type Splice = (usize, usize, Bytes);

/// Splices on one text, applied in order of `start`. Most frames get one edit (the model
/// name) or none: the first is kept inline, so that case allocates no list.
pub struct Edits<'t> {
    text: &'t [u8],
    first: Option<Splice>,
    more: Vec<Splice>,
}

fn is_ws(b: u8) -> bool {
    matches!(b, b' ' | b'\t' | b'\n' | b'\r')
}

impl<'t> Edits<'t> {
    pub fn new(text: &'t [u8]) -> Self {
        Edits { text, first: None, more: Vec::new() }
    }

    pub fn is_empty(&self) -> bool {
        self.first.is_none()
    }

    /// The text the edits apply to.
    pub fn text(&self) -> &'t [u8] {
        self.text
    }

    /// Where `raw` (borrowed from the text) stands in it.
    pub fn span(&self, raw: &RawValue) -> Option<(usize, usize)> {
        let start = (raw.get().as_ptr() as usize).checked_sub(self.text.as_ptr() as usize)?;
        let end = start + raw.get().len();
        (end <= self.text.len()).then_some((start, end))
    }

    /// The `"key"` token of the member whose value is `raw`.
    fn key_span(&self, raw: &RawValue) -> Option<(usize, usize)> {
        let (start, _) = self.span(raw)?;
        let t = self.text;
        let mut i = start;
        while i > 0 && is_ws(t[i - 1]) {
            i -= 1;
        }
        if i == 0 || t[i - 1] != b':' {
            return None;
        }
        i -= 1;
        while i > 0 && is_ws(t[i - 1]) {
            i -= 1;
        }
        if i == 0 || t[i - 1] != b'"' {
            return None;
        }
        let key_end = i;
        let mut j = key_end - 1; // the closing quote
        loop {
            if j == 0 {
                return None;
            }
            j -= 1;
            if t[j] == b'"' {
                let backslashes = t[..j].iter().rev().take_while(|&&b| b == b'\\').count();
                if backslashes % 2 == 0 {
                    return Some((j, key_end));
                }
            }
        }
    }

    fn push(&mut self, start: usize, end: usize, with: impl Into<Bytes>) -> Option<()> {
        let splice = (start, end, with.into());
        match self.first {
            None => self.first = Some(splice),
            Some(_) => self.more.push(splice),
        }
        Some(())
    }

    /// Replace the value `raw` with `with` (JSON text).
    pub fn replace_value(&mut self, raw: &RawValue, with: impl Into<Bytes>) -> Option<()> {
        let (s, e) = self.span(raw)?;
        self.push(s, e, with)
    }

    /// Give the member whose value is `raw` the key `key`.
    pub fn rename_key(&mut self, raw: &RawValue, key: &str) -> Option<()> {
        let (s, e) = self.key_span(raw)?;
        let mut k = Vec::with_capacity(key.len() + 2);
        tollgate::http::json_raw::write_string(&mut k, key);
        self.push(s, e, k)
    }

    /// Remove the member whose value is `raw`, with one comma beside it.
    pub fn remove_member(&mut self, raw: &RawValue) -> Option<()> {
        let (key_start, _) = self.key_span(raw)?;
        let (_, value_end) = self.span(raw)?;
        let t = self.text;
        let mut after = value_end;
        while after < t.len() && is_ws(t[after]) {
            after += 1;
        }
        if t.get(after) == Some(&b',') {
            return self.push(key_start, after + 1, Bytes::new());
        }
        let mut before = key_start;
        while before > 0 && is_ws(t[before - 1]) {
            before -= 1;
        }
        if before > 0 && t[before - 1] == b',' {
            return self.push(before - 1, value_end, Bytes::new());
        }
        self.push(key_start, value_end, Bytes::new()) // the only member
    }

    /// Add `"key":value` just before the member whose value is `next`.
    pub fn insert_before(&mut self, next: &RawValue, key: &str, value: &[u8]) -> Option<()> {
        let (s, _) = self.key_span(next)?;
        let mut m = Vec::with_capacity(key.len() + value.len() + 4);
        tollgate::http::json_raw::write_string(&mut m, key);
        m.push(b':');
        m.extend_from_slice(value);
        m.push(b',');
        self.push(s, s, m)
    }

    /// The edited text before `start` and after `end`, when no edit touches `start..end`
    /// (one that ends at `start` or begins at `end` is outside it) and none overlap.
    pub fn around(&self, start: usize, end: usize) -> Option<(Vec<u8>, Vec<u8>)> {
        let mut splices: Vec<&Splice> = self.first.iter().chain(&self.more).collect();
        splices.sort_by_key(|&&(s, e, _)| (s, e));
        let t = self.text;
        let (mut before, mut after) = (Vec::new(), Vec::new());
        let (mut at_before, mut at_after) = (0, end);
        for (s, e, with) in splices {
            let (s, e) = (*s, *e);
            if e <= start && s < start && s >= at_before {
                before.extend_from_slice(&t[at_before..s]);
                before.extend_from_slice(with);
                at_before = e;
            } else if s >= end && e > end && s >= at_after {
                after.extend_from_slice(&t[at_after..s]);
                after.extend_from_slice(with);
                at_after = e;
            } else {
                return None; // touches the span, or overlaps another edit (never planned)
            }
        }
        before.extend_from_slice(t.get(at_before..start)?);
        after.extend_from_slice(t.get(at_after..)?);
        Some((before, after))
    }

    /// The edited text.
    pub fn write<B: BufMut>(self, out: &mut B) {
        let Edits { text, first, mut more } = self;
        let Some(first) = first else {
            out.put_slice(text);
            return;
        };
        more.push(first);
        more.sort_by_key(|&(s, e, _)| (s, e));
        let mut at = 0;
        for (s, e, with) in &more {
            if *s < at {
                // Overlapping edits are never planned; keep the text valid if one ever is.
                log::warn!("overlapping edit skipped");
                continue;
            }
            out.put_slice(&text[at..*s]);
            out.put_slice(with);
            at = *e;
        }
        out.put_slice(&text[at..]);
    }
}

/// A `data:` payload on one line. Several `data:` lines are joined with line breaks, which
/// copied text would carry into the one line the gateway writes: outside strings they are
/// white space and become spaces (same length, so offsets hold); inside a string a raw line
/// break is invalid JSON and is left for the parse to refuse.
pub fn one_line(data: Cow<'_, [u8]>) -> Cow<'_, [u8]> {
    if memchr::memchr2(b'\n', b'\r', &data).is_none() {
        return data;
    }
    let mut v = data.into_owned();
    let (mut in_string, mut escaped) = (false, false);
    for b in &mut v {
        if in_string {
            match *b {
                _ if escaped => escaped = false,
                b'\\' => escaped = true,
                b'"' => in_string = false,
                _ => {}
            }
        } else if *b == b'"' {
            in_string = true;
        } else if *b == b'\n' || *b == b'\r' {
            *b = b' ';
        }
    }
    Cow::Owned(v)
}

#[cfg(test)]
mod tests {
    use super::*;

    fn member<'a>(text: &'a str, key: &str) -> &'a RawValue {
        let m: std::collections::HashMap<String, &RawValue> = serde_json::from_str(text).unwrap_or_default();
        m.get(key).copied().unwrap_or_else(|| panic!("no {key} in {text}"))
    }

    fn apply(text: &str, f: impl FnOnce(&mut Edits<'_>) -> Option<()>) -> String {
        let mut e = Edits::new(text.as_bytes());
        assert!(f(&mut e).is_some(), "edit located in {text}");
        let mut out = Vec::new();
        e.write(&mut out);
        String::from_utf8(out).unwrap_or_default()
    }

    #[test]
    fn members_are_removed_with_one_comma() {
        let t = r#"{"a":1, "b" : [2,3] ,"c":"x"}"#;
        assert_eq!(apply(t, |e| e.remove_member(member(t, "a"))), r#"{ "b" : [2,3] ,"c":"x"}"#);
        assert_eq!(apply(t, |e| e.remove_member(member(t, "b"))), r#"{"a":1, "c":"x"}"#);
        assert_eq!(apply(t, |e| e.remove_member(member(t, "c"))), r#"{"a":1, "b" : [2,3] }"#);
        let only = r#"{ "k\"q" : null }"#;
        assert_eq!(apply(only, |e| e.remove_member(member(only, "k\"q"))), "{  }");
    }

    #[test]
    fn keys_are_renamed_and_members_added_in_place() {
        let t = r#"{"x\\":1,"reasoning_content":"r","f":"stop"}"#;
        assert_eq!(
            apply(t, |e| e.rename_key(member(t, "reasoning_content"), "reasoning")),
            t.replace("reasoning_content", "reasoning")
        );
        assert_eq!(apply(t, |e| e.rename_key(member(t, "x\\"), "y")), t.replace(r#""x\\""#, r#""y""#));
        assert_eq!(
            apply(t, |e| e.insert_before(member(t, "f"), "service", b"{}")),
            r#"{"x\\":1,"reasoning_content":"r","service":{},"f":"stop"}"#
        );
        assert_eq!(apply(t, |e| e.replace_value(member(t, "f"), b"1.50".to_vec())), t.replace(r#""stop""#, "1.50"));
    }

    #[test]
    fn the_text_around_a_span_is_edited_apart_unless_an_edit_touches_it() {
        let t = r#"{"m":"x","c":"tok","r":null}"#;
        let mut e = Edits::new(t.as_bytes());
        let Some((c0, c1)) = e.span(member(t, "c")) else { panic!("the content is in the text") };
        assert!(e.replace_value(member(t, "m"), &b"\"y\""[..]).is_some());
        assert!(e.rename_key(member(t, "r"), "q").is_some());
        let Some((before, after)) = e.around(c0, c1) else { panic!("no edit touches the content") };
        assert_eq!(
            [&before[..], &t.as_bytes()[c0..c1], &after[..]].concat(),
            apply(t, |e| {
                e.replace_value(member(t, "m"), &b"\"y\""[..])?;
                e.rename_key(member(t, "r"), "q")
            })
            .as_bytes()
        );
        assert!(e.replace_value(member(t, "c"), &b"1"[..]).is_some());
        assert!(e.around(c0, c1).is_none());
    }

    #[test]
    fn line_breaks_outside_strings_become_spaces() {
        let joined = Cow::Borrowed(&b"{\"a\":\n\"x\\\"\n\",\r\n\"b\":1}"[..]);
        assert_eq!(&one_line(joined)[..], &b"{\"a\": \"x\\\"\n\",  \"b\":1}"[..]);
        assert!(matches!(one_line(Cow::Borrowed(&b"{}"[..])), Cow::Borrowed(_)));
    }
}
