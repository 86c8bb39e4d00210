//! The parts of an OpenAI chat request the mock looks at.
//!
//! Only what shapes the answer is read: the model to echo, the streaming
//! options, the token caps and the size of the prompt (to fake
//! `prompt_tokens`). Message texts are measured while parsing and never
//! copied. Unknown fields (`tools`, `temperature`, ...) are accepted and
//! ignored, like a permissive server would.

use std::fmt;

use serde::Deserialize;
use serde::de::{self, Deserializer, IgnoredAny, MapAccess, SeqAccess, Visitor};

#[derive(Debug, Deserialize)]
pub struct ChatRequest {
    #[serde(default)]
    pub model: Option<String>,
    pub messages: Vec<Message>,
    #[serde(default)]
    pub stream: Option<bool>,
    #[serde(default)]
    pub stream_options: Option<StreamOptions>,
    #[serde(default)]
    pub max_tokens: Option<u64>,
    #[serde(default)]
    pub max_completion_tokens: Option<u64>,
}

#[derive(Debug, Deserialize)]
pub struct StreamOptions {
    #[serde(default)]
    pub include_usage: Option<bool>,
}

#[derive(Debug, Deserialize)]
pub struct Message {
    #[serde(default)]
    pub content: TextBytes,
}

impl ChatRequest {
    /// Total bytes of all message texts (string contents and text parts).
    pub fn prompt_bytes(&self) -> u64 {
        self.messages.iter().map(|m| m.content.0).sum()
    }

    /// The output cap, preferring `max_completion_tokens` as vLLM does.
    pub fn max_output(&self) -> Option<u64> {
        self.max_completion_tokens.or(self.max_tokens)
    }

    pub fn wants_stream(&self) -> bool {
        self.stream == Some(true)
    }

    pub fn include_usage(&self) -> bool {
        self.stream_options.as_ref().and_then(|o| o.include_usage).unwrap_or(false)
    }
}

/// Byte length of a message `content`: a string, an array of parts
/// (only `text` parts count), or null.
#[derive(Debug, Default)]
pub struct TextBytes(pub u64);

impl<'de> Deserialize<'de> for TextBytes {
    fn deserialize<D: Deserializer<'de>>(deserializer: D) -> Result<Self, D::Error> {
        deserializer.deserialize_any(TextBytesVisitor)
    }
}

struct TextBytesVisitor;

impl<'de> Visitor<'de> for TextBytesVisitor {
    type Value = TextBytes;

    fn expecting(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.write_str("a string, an array of content parts, or null")
    }

    fn visit_str<E: de::Error>(self, v: &str) -> Result<TextBytes, E> {
        Ok(TextBytes(v.len() as u64))
    }

    fn visit_unit<E: de::Error>(self) -> Result<TextBytes, E> {
        Ok(TextBytes(0))
    }

    fn visit_none<E: de::Error>(self) -> Result<TextBytes, E> {
        Ok(TextBytes(0))
    }

    fn visit_seq<A: SeqAccess<'de>>(self, mut seq: A) -> Result<TextBytes, A::Error> {
        let mut total = 0;
        while let Some(part) = seq.next_element::<Part>()? {
            total += part.0;
        }
        Ok(TextBytes(total))
    }
}

/// One content part; its `text` field counts, images and the like do not.
struct Part(u64);

impl<'de> Deserialize<'de> for Part {
    fn deserialize<D: Deserializer<'de>>(deserializer: D) -> Result<Self, D::Error> {
        deserializer.deserialize_map(PartVisitor)
    }
}

struct PartVisitor;

impl<'de> Visitor<'de> for PartVisitor {
    type Value = Part;

    fn expecting(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.write_str("a content part object")
    }

    fn visit_map<A: MapAccess<'de>>(self, mut map: A) -> Result<Part, A::Error> {
        let mut bytes = 0;
        while let Some(key) = map.next_key::<std::borrow::Cow<'de, str>>()? {
            if key == "text" {
                bytes += map.next_value::<TextBytes>()?.0;
            } else {
                map.next_value::<IgnoredAny>()?;
            }
        }
        Ok(Part(bytes))
    }
}

#[cfg(test)]
#[allow(clippy::unwrap_used)]
mod tests {
    use super::*;

    #[test]
    fn measures_strings_parts_and_nulls() {
        let req: ChatRequest = serde_json::from_str(
            r#"{"model":"m","messages":[
                {"role":"system","content":"abcd"},
                {"role":"user","content":[{"type":"text","text":"xy"},{"type":"image_url","image_url":{"url":"u"}}]},
                {"role":"assistant","content":null,"tool_calls":[]},
                {"role":"tool"}
            ],"max_tokens":3,"max_completion_tokens":5,"stream":true,
            "stream_options":{"include_usage":true},"tools":[{"type":"function"}]}"#,
        )
        .unwrap();
        assert_eq!(req.prompt_bytes(), 6);
        assert_eq!(req.max_output(), Some(5));
        assert!(req.wants_stream() && req.include_usage());
    }

    #[test]
    fn escaped_text_counts_decoded_bytes() {
        let req: ChatRequest = serde_json::from_str(r#"{"messages":[{"role":"user","content":"a\"b"}]}"#).unwrap();
        assert_eq!(req.prompt_bytes(), 3);
        assert!(!req.wants_stream());
    }

    #[test]
    fn rejects_missing_messages_and_bad_content() {
        assert!(serde_json::from_str::<ChatRequest>(r#"{"model":"m"}"#).is_err());
        assert!(serde_json::from_str::<ChatRequest>(r#"{"messages":[{"content":5}]}"#).is_err());
    }
}
