//! A chat answer as the chat path reads it, once: the borrowed view of a completion body or
//! a stream chunk (`AnswerView`), the pieces of its first choice a dialect turns into its own
//! shape (`Piece`; the translator contract itself is the core's `http::answer`).
//!
//! The chat plugin parses each body or frame once into the view, does its accounting on it
//! and, on a dialect route, hands the translator typed pieces and typed usage: no translator
//! reads or re-parses chat text. Values stay the raw text they arrived as (validated by the
//! parse, never copied), so an unchanged frame can be forwarded byte for byte and a changed
//! one edited in place (`plugins/chat/edits.rs`).

use std::borrow::Cow;

use serde::de::{self, IgnoredAny, MapAccess, SeqAccess, Visitor};
use serde::{Deserialize, Deserializer};
use serde_json::value::RawValue;

pub use tollgate::http::answer::{AnswerTranslator, ChunkMeta, Piece, PricedUsage};
use tollgate::http::json_raw;

/// A member as raw JSON text: `None` when absent. Unlike `Option<&RawValue>`, a `null` value
/// is kept (as the text `null`), so its place in the text is known.
#[derive(Debug, Default, Clone, Copy)]
pub struct Field<'a>(pub Option<&'a RawValue>);

impl<'de: 'a, 'a> Deserialize<'de> for Field<'a> {
    fn deserialize<D: Deserializer<'de>>(d: D) -> Result<Self, D::Error> {
        <&'a RawValue>::deserialize(d).map(|raw| Field(Some(raw)))
    }
}

impl<'a> Field<'a> {
    /// Present and not `null`.
    pub fn value(self) -> Option<&'a RawValue> {
        self.0.filter(|r| !json_raw::is_null(r))
    }

    pub fn is_present(self) -> bool {
        self.0.is_some()
    }

    pub fn as_str(self) -> Option<Cow<'a, str>> {
        self.0.and_then(json_raw::as_str).map(|s| s.0)
    }

    /// Bytes of a non-empty string value (0 for anything else).
    pub fn str_len(self) -> usize {
        self.as_str().map_or(0, |s| s.len())
    }

    pub fn as_u64(self) -> Option<u64> {
        self.0.and_then(|r| serde_json::from_str::<u64>(r.get()).ok())
    }

    /// A non-empty array.
    pub fn is_non_empty_array(self) -> bool {
        self.0.is_some_and(|r| {
            let t = r.get();
            t.starts_with('[') && t[1..].trim_start().as_bytes().first() != Some(&b']')
        })
    }
}

/// The members of a chat completion (or one stream chunk) the gateway reads; every other
/// member is skipped (still validated). A repeated member the gateway reads makes the text
/// unreadable (decisions.md 89).
#[derive(Debug, Deserialize)]
pub struct AnswerView<'a> {
    #[serde(borrow, default)]
    pub id: Field<'a>,
    #[serde(borrow, default)]
    pub created: Field<'a>,
    #[serde(borrow, default)]
    pub model: Field<'a>,
    /// A list of objects; `None` when absent or `null` (anything else fails the parse).
    #[serde(borrow, default)]
    pub choices: Option<Vec<ChoiceView<'a>>>,
    #[serde(borrow, default)]
    pub usage: Field<'a>,
    #[serde(borrow, default)]
    pub error: Field<'a>,
}

#[derive(Debug, Deserialize)]
pub struct ChoiceView<'a> {
    #[serde(borrow, default)]
    pub index: Field<'a>,
    /// A completion's choice.
    #[serde(borrow, default)]
    pub message: Part<'a>,
    /// A stream chunk's choice.
    #[serde(borrow, default)]
    pub delta: Part<'a>,
    #[serde(borrow, default)]
    pub finish_reason: Field<'a>,
    #[serde(borrow, default)]
    pub service: Field<'a>,
}

/// A choice's `message` or `delta`, read in the same pass as the rest of the text.
#[derive(Debug, Default)]
pub enum Part<'a> {
    /// Absent.
    #[default]
    Absent,
    /// Present but not an object (skipped, validated).
    NotObject,
    Object(PartView<'a>),
}

/// The members of a `message` or `delta` the gateway reads. A repeated one makes the text
/// unreadable (decisions.md 89).
#[derive(Debug, Default)]
pub struct PartView<'a> {
    pub content: Field<'a>,
    pub reasoning: Field<'a>,
    /// A replica's name for `reasoning` (moved there on the way out).
    pub reasoning_content: Field<'a>,
    pub tool_calls: Field<'a>,
}

impl<'de: 'a, 'a> Deserialize<'de> for Part<'a> {
    fn deserialize<D: Deserializer<'de>>(d: D) -> Result<Self, D::Error> {
        d.deserialize_any(PartVisitor(std::marker::PhantomData))
    }
}

struct PartVisitor<'a>(std::marker::PhantomData<&'a ()>);

impl<'de: 'a, 'a> Visitor<'de> for PartVisitor<'a> {
    type Value = Part<'a>;
    fn expecting(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.write_str("any JSON value")
    }
    fn visit_map<A: MapAccess<'de>>(self, mut map: A) -> Result<Part<'a>, A::Error> {
        let mut p = PartView::default();
        while let Some(key) = map.next_key::<json_raw::Str<'de>>()? {
            let slot = match key.0.as_ref() {
                "content" => &mut p.content,
                "reasoning" => &mut p.reasoning,
                "reasoning_content" => &mut p.reasoning_content,
                "tool_calls" => &mut p.tool_calls,
                _ => {
                    map.next_value::<IgnoredAny>()?;
                    continue;
                }
            };
            if slot.is_present() {
                return Err(de::Error::custom(format!("duplicate field `{}`", key.0)));
            }
            *slot = map.next_value::<Field<'a>>()?;
        }
        Ok(Part::Object(p))
    }
    fn visit_seq<A: SeqAccess<'de>>(self, mut seq: A) -> Result<Part<'a>, A::Error> {
        while seq.next_element::<IgnoredAny>()?.is_some() {}
        Ok(Part::NotObject)
    }
    fn visit_bool<E>(self, _: bool) -> Result<Part<'a>, E> {
        Ok(Part::NotObject)
    }
    fn visit_i64<E>(self, _: i64) -> Result<Part<'a>, E> {
        Ok(Part::NotObject)
    }
    fn visit_u64<E>(self, _: u64) -> Result<Part<'a>, E> {
        Ok(Part::NotObject)
    }
    fn visit_f64<E>(self, _: f64) -> Result<Part<'a>, E> {
        Ok(Part::NotObject)
    }
    fn visit_str<E>(self, _: &str) -> Result<Part<'a>, E> {
        Ok(Part::NotObject)
    }
    fn visit_unit<E>(self) -> Result<Part<'a>, E> {
        Ok(Part::NotObject)
    }
}

impl<'a> Part<'a> {
    pub fn object(&self) -> Option<&PartView<'a>> {
        match self {
            Part::Object(p) => Some(p),
            _ => None,
        }
    }
}

#[derive(Deserialize)]
struct ToolCallView<'a> {
    #[serde(borrow, default)]
    index: Field<'a>,
    #[serde(borrow, default)]
    id: Field<'a>,
    #[serde(borrow, default)]
    function: Field<'a>,
}

#[derive(Deserialize)]
struct FunctionView<'a> {
    #[serde(borrow, default)]
    name: Field<'a>,
    #[serde(borrow, default)]
    arguments: Field<'a>,
}

/// Which member of a choice holds its output.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Form {
    /// A whole completion: `choices[].message`.
    Body,
    /// A stream chunk: `choices[].delta`.
    Chunk,
}

impl<'a> AnswerView<'a> {
    /// `None` when `text` is not a JSON object with these members readable.
    pub fn parse(text: &'a [u8]) -> Option<AnswerView<'a>> {
        // A struct also parses from an array (fields by position): only an object is one.
        if text.trim_ascii_start().first() != Some(&b'{') {
            return None;
        }
        json_raw::from_text(text).ok()
    }

    /// An error object in place of a chunk.
    pub fn is_error(&self) -> bool {
        self.error.is_present() && self.choices.is_none()
    }

    pub fn meta(&self) -> ChunkMeta<'a> {
        ChunkMeta { id: self.id.as_str(), created: self.created.0.and_then(|r| r.get().parse::<i64>().ok()) }
    }
}

impl<'a> ChoiceView<'a> {
    /// `index`, else the position in `choices` (capped: the gateway tracks at most 65).
    pub fn slot(&self, position: usize) -> usize {
        self.index.as_u64().map_or(position, |i| i as usize).min(64)
    }

    /// The output part when it is an object.
    pub fn part(&self, form: Form) -> Option<&PartView<'a>> {
        match form {
            Form::Body => &self.message,
            Form::Chunk => &self.delta,
        }
        .object()
    }
}

/// The finish reason of an idempotent replay's receipt whose original stream ended early
/// without one (decision 186); the Responses dialect renders it `incomplete`.
pub const INTERRUPTED: &str = "interrupted";

fn non_empty(s: Option<Cow<'_, str>>) -> Option<Cow<'_, str>> {
    s.filter(|s| !s.is_empty())
}

/// The pieces of the choice with index 0 (neither dialect asks for more than one).
pub fn pieces<'a>(view: &AnswerView<'a>, form: Form) -> Vec<Piece<'a>> {
    let mut out = Vec::new();
    let Some(choice) = view.choices.iter().flatten().find(|c| c.index.as_u64().unwrap_or(0) == 0) else {
        return out;
    };
    if let Some(part) = choice.part(form) {
        if let Some(r) = non_empty(part.reasoning.as_str().or_else(|| part.reasoning_content.as_str())) {
            out.push(Piece::Reasoning(r));
        }
        if let Some(t) = non_empty(part.content.as_str()) {
            out.push(Piece::Text(t));
        }
        tool_pieces(part.tool_calls, &mut out);
    }
    if let Some(f) = choice.finish_reason.as_str() {
        out.push(Piece::Finish(f));
    }
    out
}

fn tool_pieces<'a>(calls: Field<'a>, out: &mut Vec<Piece<'a>>) {
    let Some(list) = calls.value().and_then(|r| serde_json::from_str::<Vec<&'a RawValue>>(r.get()).ok()) else {
        return;
    };
    for (pos, raw) in list.into_iter().enumerate() {
        let Ok(call) = serde_json::from_str::<ToolCallView<'a>>(raw.get()) else { continue };
        let function = call.function.value().and_then(|r| serde_json::from_str::<FunctionView<'a>>(r.get()).ok());
        // Arguments are JSON text in a string; an object given directly is kept as its text.
        let args = function.as_ref().and_then(|f| match f.arguments.value() {
            Some(r) if json_raw::is_object(r) => Some(Cow::Borrowed(r.get())),
            _ => f.arguments.as_str(),
        });
        out.push(Piece::Tool {
            index: call.index.as_u64().unwrap_or(pos as u64),
            id: non_empty(call.id.as_str()),
            name: non_empty(function.as_ref().and_then(|f| f.name.as_str())),
            args: non_empty(args),
        });
    }
}

/// Note in `facts` what `view` says about the answer, if a later phase asked for them.
pub fn note_facts(facts: &mut Option<tollgate::proxy::ctx::AnswerFacts>, view: &AnswerView<'_>) {
    let Some(facts) = facts.as_mut() else { return };
    if facts.id.is_none() {
        let meta = view.meta();
        facts.id = meta.id.map(Cow::into_owned);
        facts.created = meta.created;
    }
    let first = view.choices.iter().flatten().find(|c| c.index.as_u64().unwrap_or(0) == 0);
    if let Some(f) = first.and_then(|c| c.finish_reason.as_str()) {
        facts.finish_reason = Some(f.into_owned());
    }
}
