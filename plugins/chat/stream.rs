//! Streamed chat responses, frame by frame as they arrive (never buffered beyond one partial
//! frame). Each frame is read once into the borrowed view and accounted (or, repeating the
//! last content frame's text around another string, by its pattern: `content_frame.rs`); then
//! the chat dialect gets it copied as it arrived or edited in place (reasoning renamed,
//! `service.output_status` on a no-answer terminal frame, the usage frame priced and
//! forwarded only when asked for, or when no choice answered, and then only together with
//! `[DONE]`), while a dialect's translator gets its typed pieces and usage. A stream that ends
//! without `[DONE]` gets one error frame (or the translator's error event) instead.

use bytes::{Bytes, BytesMut};

use super::account::{account, delivered, no_answer, priced};
use super::content_frame::ContentFrame;
use super::edits::{Edits, one_line};
use crate::shared::answer::{AnswerView, Form, PricedUsage, pieces};
use tollgate::http::envelope;
use tollgate::http::error::{ErrorKind, GatewayError};
use tollgate::http::sse::data_payload;
use tollgate::money::usage;
use tollgate::proxy::ctx::RequestCtx;

pub fn on_chunk(body: &mut Option<Bytes>, eos: bool, cx: &mut RequestCtx) {
    let mut out = BytesMut::new();
    if let Some(b) = body.take() {
        out.reserve(b.len() + 64); // most frames are forwarded as long as they came
        cx.response.framer.push(&b);
    }
    let mut pattern = take_pattern(cx);
    while let Some(frame) = cx.response.framer.next_frame() {
        next_frame(&frame, cx, &mut out, &mut pattern);
    }
    if eos {
        if cx.response.framer.has_partial() {
            // A last frame without its blank line: complete it.
            let mut rest = BytesMut::from(&cx.response.framer.take_rest()[..]);
            rest.extend_from_slice(b"\n\n");
            next_frame(&rest, cx, &mut out, &mut pattern);
        }
        if !cx.response.saw_done && cx.failure.is_none() {
            end_with(
                cx,
                &mut out,
                ErrorKind::UpstreamStreamError,
                "The model server ended the stream early; the response is incomplete.",
            );
        }
    }
    keep_pattern(cx, pattern);
    *body = (!out.is_empty()).then(|| out.freeze());
}

/// End the stream with one error frame (or the translator's error event): nothing after it
/// is forwarded (see `on_frame`), and no second one is written.
fn end_with(cx: &mut RequestCtx, out: &mut BytesMut, kind: ErrorKind, message: &str) {
    let err = GatewayError::new(kind, message);
    match cx.answer_translator.as_mut() {
        Some(t) => t.on_failure(&err, &cx.request_id, out),
        None => out.extend_from_slice(&envelope::sse_error_frame(&err, cx.envelope, &cx.request_id)),
    }
    cx.failure = Some(err);
    cx.response.saw_done = true;
    cx.response.usage_frame = None; // an errored stream never quotes a cost
}

fn malformed(cx: &mut RequestCtx, out: &mut BytesMut) {
    // Clarification 11: a frame that is not a chat chunk is a malformed answer.
    end_with(cx, out, ErrorKind::UpstreamFailed, "The model server sent a malformed stream frame.");
}

/// One frame, with the request's content-frame pattern kept in its `ext` between calls.
#[cfg(test)]
pub(super) fn on_frame(frame: &[u8], cx: &mut RequestCtx, out: &mut BytesMut) {
    let mut pattern = take_pattern(cx);
    next_frame(frame, cx, out, &mut pattern);
    keep_pattern(cx, pattern);
}

/// One frame read in full, with no content-frame pattern (the tests' comparison).
#[cfg(test)]
pub(super) fn on_frame_in_full(frame: &[u8], cx: &mut RequestCtx, out: &mut BytesMut) {
    next_frame(frame, cx, out, &mut None);
}

/// The request's content-frame pattern between chunks, in its own slot of `ext` (boxed once
/// per request, not once per chunk).
struct PatternSlot(Option<ContentFrame>);

fn take_pattern(cx: &mut RequestCtx) -> Option<ContentFrame> {
    cx.ext.get_mut::<PatternSlot>().and_then(|s| s.0.take())
}

fn keep_pattern(cx: &mut RequestCtx, pattern: Option<ContentFrame>) {
    let Some(p) = pattern else { return };
    match cx.ext.get_mut::<PatternSlot>() {
        Some(slot) => slot.0 = Some(p),
        None => cx.ext.insert(PatternSlot(Some(p))),
    }
}

/// One frame: forwarded by `pattern` when it is the last plain content frame with another
/// content string (`content_frame.rs`), else read, accounted and edited in full.
fn next_frame(frame: &[u8], cx: &mut RequestCtx, out: &mut BytesMut, pattern: &mut Option<ContentFrame>) {
    if cx.failure.is_some() || cx.response.saw_done {
        return; // the stream already ended (`[DONE]`, or an error frame): nothing follows it
    }
    let translating = cx.answer_translator.is_some();
    let Some(data) = data_payload(frame) else {
        if !translating {
            out.extend_from_slice(frame); // comments and bare fields pass through
        }
        return;
    };
    if data.trim_ascii() == b"[DONE]" {
        cx.response.saw_done = true;
        // Without a usage report, a dialect's final usage shows what will be billed: what the
        // core's completion counts from the delivered output.
        let unreported = if translating && cx.usage.figures().is_none() { delivered(cx) } else { None };
        let no_answer = no_answer(cx);
        match cx.answer_translator.as_mut() {
            Some(t) => {
                if let Some(figures) = unreported {
                    t.on_usage(PricedUsage { figures, no_answer });
                }
                t.on_done(out);
            }
            None => {
                if let Some(usage_frame) = cx.response.usage_frame.take() {
                    out.extend_from_slice(&usage_frame);
                }
                out.extend_from_slice(b"data: [DONE]\n\n");
            }
        }
        return;
    }
    let joined = matches!(data, std::borrow::Cow::Owned(_));
    if !joined && pattern.as_ref().is_some_and(|p| p.forward(frame, &data, cx, out)) {
        return;
    }
    let data = one_line(data);
    let Some(view) = AnswerView::parse(&data) else { return malformed(cx, out) };
    if view.is_error() {
        // The replica reported a failure inside the stream: end with our error frame.
        return end_with(cx, out, ErrorKind::UpstreamFailed, "The model server failed during generation.");
    }
    let usage_report = view.usage.value();
    // A chat chunk: `choices` is a list of objects, or it is a usage-only frame.
    if view.choices.is_none() && !usage_report.is_some_and(tollgate::http::json_raw::is_object) {
        return malformed(cx, out);
    }
    let mut edits = Edits::new(&data);
    if account(&view, Form::Chunk, cx, &mut edits).is_none() {
        return malformed(cx, out);
    }
    if !joined {
        // Kept for the frames that follow (the last plain content frame's pattern wins).
        if let Some(p) = ContentFrame::record(&view, &edits) {
            *pattern = Some(p);
        }
    }
    let figures = usage_report.and_then(|u| priced(u, cx));
    if let Some(f) = figures {
        cx.usage.report(f);
    }
    let no_answer = no_answer(cx);
    if let Some(t) = cx.answer_translator.as_mut() {
        t.on_chunk(&view.meta(), &pieces(&view, Form::Chunk), out);
        if let Some(figures) = figures {
            t.on_usage(PricedUsage { figures, no_answer });
        }
        return;
    }
    let choices_empty = view.choices.as_ref().is_none_or(Vec::is_empty);
    if let Some(u) = usage_report {
        let asked = cx.chat_request.include_usage;
        let planned = match figures {
            Some(f) if asked || (no_answer && choices_empty) => {
                edits.replace_value(u, usage::render_chat_usage(&f, no_answer).into_bytes())
            }
            // A usage-only frame the client did not ask for.
            _ if choices_empty => return,
            _ => edits.remove_member(u),
        };
        if planned.is_none() {
            return malformed(cx, out);
        }
    }
    if usage_report.is_some() && choices_empty {
        // Held until `[DONE]` (see `ResponseState::usage_frame`).
        let mut held = BytesMut::with_capacity(data.len() + 64);
        write_frame(edits, data.len(), &mut held);
        cx.response.usage_frame = Some(held.freeze());
        return;
    }
    if edits.is_empty() && !joined {
        out.extend_from_slice(frame);
        return;
    }
    write_frame(edits, data.len(), out);
}

/// One `data:` frame of the edited payload.
fn write_frame(edits: Edits<'_>, payload_len: usize, out: &mut BytesMut) {
    out.reserve(payload_len + 16);
    out.extend_from_slice(b"data: ");
    edits.write(out);
    out.extend_from_slice(b"\n\n");
}
