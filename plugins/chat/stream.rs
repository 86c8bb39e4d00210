//! Streamed chat responses, frame by frame as they arrive (never buffered beyond one
//! partial frame): reasoning renamed, `service.output_status` on a no-answer terminal
//! frame, the usage frame priced and forwarded only when asked for (or when no choice
//! answered), `[DONE]` passed through; a stream that ends without `[DONE]` gets one error
//! frame instead.

use std::sync::atomic::Ordering;

use bytes::{Bytes, BytesMut};
use serde_json::Value;

use super::response::{normalize, output_status, rename_model, with_usage};
use tollgate::ctx::RequestCtx;
use tollgate::envelope;
use tollgate::error::{ErrorKind, GatewayError};
use tollgate::sse::data_payload;
use tollgate::usage;

pub fn on_chunk(body: &mut Option<Bytes>, eos: bool, cx: &mut RequestCtx) {
    if let Some(b) = body.take() {
        cx.response.framer.push(&b);
    }
    let mut out = BytesMut::new();
    while let Some(frame) = cx.response.framer.next_frame() {
        on_frame(frame, cx, &mut out);
    }
    if eos {
        if cx.response.framer.has_partial() {
            // A last frame without its blank line: complete it.
            let mut rest = BytesMut::from(&cx.response.framer.take_rest()[..]);
            rest.extend_from_slice(b"\n\n");
            on_frame(rest.freeze(), cx, &mut out);
        }
        if !cx.response.saw_done && cx.failure.is_none() {
            let err = GatewayError::new(
                ErrorKind::UpstreamStreamError,
                "The model server ended the stream early; the response is incomplete.",
            );
            out.extend_from_slice(&envelope::sse_error_frame(&err, cx.envelope, &cx.request_id));
            cx.failure = Some(err);
        }
    }
    *body = (!out.is_empty()).then(|| out.freeze());
}

fn emit_json(v: &Value, out: &mut BytesMut) {
    out.extend_from_slice(b"data: ");
    if serde_json::to_writer(bytes::BufMut::writer(&mut *out), v).is_err() {
        log::warn!("stream frame could not be serialized");
    }
    out.extend_from_slice(b"\n\n");
}

fn on_frame(frame: Bytes, cx: &mut RequestCtx, out: &mut BytesMut) {
    if cx.failure.is_some() {
        return; // the stream already ended with an error frame: nothing follows it
    }
    let Some(data) = data_payload(&frame) else {
        out.extend_from_slice(&frame);
        return;
    };
    if data.trim_ascii() == b"[DONE]" {
        cx.response.saw_done = true;
        out.extend_from_slice(b"data: [DONE]\n\n");
        return;
    }
    if super::raw::stream_frame(&data, &frame, cx, out).is_none() {
        on_frame_value(&frame, &data, cx, out);
    }
}

/// End the stream with one error frame: nothing after it is forwarded (see `on_frame`).
fn fail_stream(cx: &mut RequestCtx, out: &mut BytesMut, message: &str) {
    let err = GatewayError::new(ErrorKind::UpstreamFailed, message);
    out.extend_from_slice(&envelope::sse_error_frame(&err, cx.envelope, &cx.request_id));
    cx.failure = Some(err);
    cx.response.saw_done = true; // ended: no second error frame, whatever the replica does next
}

/// A chat chunk: an object whose `choices` is a list of objects, or a usage-only frame.
fn is_chunk(obj: &serde_json::Map<String, Value>) -> bool {
    match obj.get("choices") {
        Some(Value::Array(list)) => list.iter().all(Value::is_object),
        None => obj.get("usage").is_some_and(Value::is_object),
        Some(_) => false,
    }
}

/// One frame through a `Value` (frames `raw::stream_frame` does not take).
pub(super) fn on_frame_value(frame: &[u8], data: &[u8], cx: &mut RequestCtx, out: &mut BytesMut) {
    let mut v = match serde_json::from_slice::<Value>(data) {
        Ok(v @ Value::Object(_)) => v,
        // Clarification 11: a frame that is not a chat chunk is a malformed answer.
        _ => return fail_stream(cx, out, "The model server sent a malformed stream frame."),
    };
    let Some(obj) = v.as_object_mut() else { return };
    if obj.contains_key("error") && !obj.contains_key("choices") {
        // The replica reported a failure inside the stream: end with our error frame.
        return fail_stream(cx, out, "The model server failed during generation.");
    }
    if !is_chunk(obj) {
        return fail_stream(cx, out, "The model server sent a malformed stream frame.");
    }
    let mut changed = rename_model(obj, cx);
    let mut choices_empty = true;
    if let Some(choices) = obj.get_mut("choices").and_then(Value::as_array_mut) {
        choices_empty = choices.is_empty();
        for (pos, choice) in choices.iter_mut().enumerate() {
            let Some(choice) = choice.as_object_mut() else {
                continue;
            };
            let idx = choice.get("index").and_then(Value::as_u64).map_or(pos, |i| i as usize).min(64);
            if cx.response.answered.len() <= idx {
                cx.response.answered.resize(idx + 1, false);
            }
            if let Some(delta) = choice.get_mut("delta").and_then(Value::as_object_mut) {
                let o = normalize(delta);
                changed |= o.changed;
                if o.output {
                    cx.response.delivered_tokens += 1;
                    cx.response.delivered_text_bytes += o.text_bytes as u64;
                    cx.first_token_seen.store(true, Ordering::Release);
                }
                cx.response.answered[idx] |= o.answer;
            }
            let finished = choice.get("finish_reason").and_then(Value::as_str).map(str::to_owned);
            if let Some(fr) = finished {
                if !cx.response.answered[idx] {
                    choice.insert("service".into(), output_status(&fr));
                    changed = true;
                }
            }
        }
    }
    let provider_usage = obj.remove("usage").filter(|u| !u.is_null());
    if let Some(u) = provider_usage {
        let figures = cx.model().and_then(|m| usage::from_provider(&u, m));
        let no_answer = !cx.response.answered.is_empty() && cx.response.answered.iter().all(|a| !a);
        if let Some(f) = figures {
            cx.usage = Some(f);
            if crate::shared::ChatRequest::of(cx).include_usage || (no_answer && choices_empty) {
                match with_usage(obj, &usage::render_chat_usage(&f, no_answer)) {
                    Ok(bytes) => {
                        out.extend_from_slice(b"data: ");
                        out.extend_from_slice(&bytes);
                        out.extend_from_slice(b"\n\n");
                    }
                    Err(e) => log::warn!("usage frame not rendered: {e}"),
                }
                return;
            }
        }
        if choices_empty {
            return; // a usage-only frame the client did not ask for
        }
        emit_json(&v, out);
        return;
    }
    if changed {
        emit_json(&v, out);
    } else {
        out.extend_from_slice(frame);
    }
}
