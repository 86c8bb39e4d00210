//! A stream's content frames differ in one string. A replica writes each token's chunk with
//! the same `id`, `created`, `model` and members around the `content` string, so the text
//! before that string and the text after it repeat frame after frame.
//!
//! A content frame that went through the full parse and accounting is kept as a pattern:
//! its text before and after the content string, as it arrived and as the chat dialect
//! writes it. A later frame made of the same text around a string with nothing to unescape
//! is that frame with another string in the same place. Putting one JSON string in place
//! of another keeps the text valid and the parse the same, except for that string, so the
//! frame is checked by scanning the string alone (no quote, backslash or control
//! character; valid UTF-8) and gets the same edits. Any other frame takes the full path.

use std::borrow::Cow;

use bytes::{BufMut, Bytes, BytesMut};

use super::edits::Edits;
use crate::shared::answer::{AnswerView, ChunkMeta, Form, Piece};
use tollgate::proxy::ctx::RequestCtx;

/// A content frame's text around its content string.
#[derive(Debug)]
pub struct ContentFrame {
    /// The payload up to the content string's opening quote, as it arrived.
    before: Bytes,
    /// The payload after the content string's closing quote, as it arrived.
    after: Bytes,
    /// `before` and `after` as the chat dialect writes them (the model renamed, say); `None`
    /// when it writes the frame unchanged.
    edited: Option<(Bytes, Bytes)>,
    /// The choice's slot (`ChoiceView::slot`).
    slot: usize,
    /// For a dialect's translator: the chunk's `id` and `created`, and whether the choice is
    /// the one with index 0 (the only one translated).
    id: Option<String>,
    created: Option<i64>,
    translated: bool,
}

/// Where the content string of a plain content chunk stands in the text `edits` apply to:
/// one choice, whose `delta` has a string `content` with nothing to unescape, no reasoning
/// and no tool calls (absent or `null`), no finish reason and no usage report. `None` for
/// any other chunk.
fn content_span(view: &AnswerView<'_>, edits: &Edits<'_>) -> Option<(usize, usize)> {
    if view.usage.value().is_some() {
        return None;
    }
    let [choice] = view.choices.as_deref()? else { return None };
    if choice.finish_reason.value().is_some() {
        return None;
    }
    let part = choice.part(Form::Chunk)?;
    if part.reasoning.value().is_some() || part.reasoning_content.value().is_some() || part.tool_calls.value().is_some()
    {
        return None;
    }
    let raw = part.content.0?;
    plain_string(raw.get().as_bytes())?;
    edits.span(raw)
}

/// The text of the string `token` (quotes included) when it has nothing to unescape: no
/// quote, backslash or control character inside, and valid UTF-8.
fn plain_string(token: &[u8]) -> Option<&str> {
    let inner = token.strip_prefix(b"\"")?.strip_suffix(b"\"")?;
    if inner.iter().any(|&b| b == b'"' || b == b'\\' || b < 0x20) {
        return None;
    }
    std::str::from_utf8(inner).ok()
}

impl ContentFrame {
    /// The pattern of a frame accounted by the full path: `view` read from the payload `edits`
    /// apply to, `edits` what the chat dialect changes in it. `None` for a frame that is not a
    /// plain content chunk, or when an edit touches its content string.
    pub fn record(view: &AnswerView<'_>, edits: &Edits<'_>) -> Option<ContentFrame> {
        let span = content_span(view, edits)?;
        let (choice, text, meta) = (view.choices.as_deref()?.first()?, edits.text(), view.meta());
        let edited = if edits.is_empty() {
            None
        } else {
            let (before, after) = edits.around(span.0, span.1)?;
            Some((Bytes::from(before), Bytes::from(after)))
        };
        Some(ContentFrame {
            before: Bytes::copy_from_slice(&text[..span.0]),
            after: Bytes::copy_from_slice(&text[span.1..]),
            edited,
            slot: choice.slot(0),
            id: meta.id.map(Cow::into_owned),
            created: meta.created,
            translated: choice.index.as_u64().unwrap_or(0) == 0,
        })
    }

    /// The content string of `data` (quotes included, and its text) when `data` is this
    /// frame with another plain string in place of the content.
    fn content_of<'d>(&self, data: &'d [u8]) -> Option<(&'d [u8], &'d str)> {
        let middle = data.strip_prefix(&self.before[..])?.strip_suffix(&self.after[..])?;
        plain_string(middle).map(|text| (middle, text))
    }

    /// Account and forward `frame` (payload `data`) when it matches: `false` leaves it to
    /// the full path. Accounting as `account` does for such a chunk: its one choice has
    /// answered and delivered a token when the content is not empty; a translator gets the
    /// text as `pieces` gives it.
    pub fn forward(&self, frame: &[u8], data: &[u8], cx: &mut RequestCtx, out: &mut BytesMut) -> bool {
        let Some((content, text)) = self.content_of(data) else { return false };
        if !text.is_empty() {
            cx.response.delivered_tokens += 1;
            cx.response.delivered_text_bytes += text.len() as u64;
            cx.first_token_seen = true;
            cx.response.first_token_after.get_or_insert_with(|| cx.started.elapsed());
            if let Some(answered) = cx.response.answered.get_mut(self.slot) {
                *answered = true;
            }
        }
        if let Some(t) = cx.answer_translator.as_mut() {
            let meta = ChunkMeta { id: self.id.as_deref().map(Cow::Borrowed), created: self.created };
            let pieces = [Piece::Text(Cow::Borrowed(text))];
            let given: &[Piece<'_>] = if self.translated && !text.is_empty() { &pieces } else { &[] };
            t.on_chunk(&meta, given, out);
            return true;
        }
        match &self.edited {
            None => out.extend_from_slice(frame),
            Some((before, after)) => {
                out.reserve(before.len() + content.len() + after.len() + 8);
                out.put_slice(b"data: ");
                out.put_slice(before);
                out.put_slice(content);
                out.put_slice(after);
                out.put_slice(b"\n\n");
            }
        }
        true
    }
}
