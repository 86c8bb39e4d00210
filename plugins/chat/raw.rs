//! The response normalisation of `response.rs` and `stream.rs`, done on raw JSON text
//! (`tollgate::json_raw`) instead of a `serde_json::Value`: same decisions, same members
//! changed, everything else copied as it arrived. A body or frame this path does not take
//! (not an object, a repeated key, an error frame, a stream's usage frame) returns `None`
//! before anything in `cx` changes, and the caller runs the `Value` path on it.

use std::sync::atomic::Ordering;

use bytes::{BufMut, BytesMut};
use serde_json::Value;
use serde_json::value::RawValue;

use super::response::{ChoiceOutput, output_status};
use tollgate::ctx::RequestCtx;
use tollgate::json_raw::{self, Members, ObjectWriter, Str};
use tollgate::usage;

/// One element of `choices`.
struct Choice<'a> {
    raw: &'a RawValue,
    /// `None`: not an object (copied as it is, not counted).
    members: Option<Members<'a>>,
    /// `message` or `delta`, when it is an object.
    part: Option<Members<'a>>,
    index: Option<u64>,
    finish_reason: Option<Str<'a>>,
    out: ChoiceOutput,
    /// The finish reason to explain in `service.output_status`.
    service: Option<Str<'a>>,
}

pub(super) fn str_len(raw: Option<&RawValue>) -> usize {
    raw.and_then(json_raw::as_str).map_or(0, |s| s.0.len())
}

/// `normalize` of `response.rs`, read-only: what the part carries once rewritten.
fn part_output(part: &Members<'_>) -> ChoiceOutput {
    let rc = part.get("reasoning_content");
    let existing = part.get("reasoning");
    let reasoning = match rc {
        Some(rc) if existing.is_none_or(json_raw::is_null) => Some(rc),
        _ => existing,
    };
    let content = str_len(part.get("content"));
    let reasoning = str_len(reasoning);
    let tools = part.get("tool_calls").is_some_and(non_empty_array);
    let answer = content > 0 || tools;
    ChoiceOutput { changed: rc.is_some(), answer, output: answer || reasoning > 0, text_bytes: content + reasoning }
}

pub(super) fn non_empty_array(raw: &RawValue) -> bool {
    let t = raw.get();
    t.starts_with('[') && t[1..].trim_start().as_bytes().first() != Some(&b']')
}

/// The elements of `choices` (an array), each split when it is an object.
fn choices<'a>(raw: &'a RawValue, part_key: &str) -> Option<Vec<Choice<'a>>> {
    let list: Vec<&'a RawValue> = serde_json::from_str(raw.get()).ok()?;
    let mut out = Vec::with_capacity(list.len());
    for raw in list {
        let mut c = Choice {
            raw,
            members: None,
            part: None,
            index: None,
            finish_reason: None,
            out: ChoiceOutput::default(),
            service: None,
        };
        if json_raw::is_object(raw) {
            let m = Members::of(raw)?;
            c.part = match m.get(part_key) {
                Some(p) if json_raw::is_object(p) => Some(Members::of(p)?),
                _ => None,
            };
            c.index = m.get("index").and_then(|r| serde_json::from_str::<u64>(r.get()).ok());
            c.finish_reason = m.get("finish_reason").and_then(json_raw::as_str);
            c.out = c.part.as_ref().map(part_output).unwrap_or_default();
            c.members = Some(m);
        }
        out.push(c);
    }
    Some(out)
}

/// The part with `reasoning_content` moved to `reasoning` (as `normalize` does).
fn write_part<B: BufMut>(out: &mut B, part: &Members<'_>) {
    let rc = part.get("reasoning_content");
    let existing = part.get("reasoning");
    let replace = rc.filter(|_| existing.is_none_or(json_raw::is_null));
    let mut w = ObjectWriter::new(out);
    for (k, v) in &part.0 {
        match (k.0.as_ref(), replace) {
            ("reasoning_content", _) => {}
            ("reasoning", Some(rc)) => w.raw("reasoning", rc.get()),
            (k, _) => w.raw(k, v.get()),
        }
    }
    if let (Some(rc), None) = (replace, existing) {
        w.raw("reasoning", rc.get());
    }
    w.finish();
}

fn write_choices<B: BufMut>(out: &mut B, list: &[Choice<'_>], part_key: &str) {
    out.put_u8(b'[');
    for (i, c) in list.iter().enumerate() {
        if i > 0 {
            out.put_u8(b',');
        }
        let Some(m) = c.members.as_ref().filter(|_| c.out.changed || c.service.is_some()) else {
            out.put_slice(c.raw.get().as_bytes());
            continue;
        };
        let mut w = ObjectWriter::new(out);
        for (k, v) in &m.0 {
            let k = k.0.as_ref();
            if k == part_key && c.out.changed {
                if let Some(p) = &c.part {
                    w.with(k, |b| write_part(b, p));
                    continue;
                }
            }
            if k == "service" && c.service.is_some() {
                continue; // replaced below
            }
            w.raw(k, v.get());
        }
        if let Some(fr) = &c.service {
            w.with("service", |b| json_raw::write_json(b, &output_status(&fr.0)));
        }
        w.finish();
    }
    out.put_u8(b']');
}

/// The catalog id to put in `model`, when the replica's name is there (`rename_model`).
fn renamed_model<'c>(top: &Members<'_>, cx: &'c RequestCtx) -> Option<&'c str> {
    cx.pool()?.from_upstream(&json_raw::as_str(top.get("model")?)?.0)
}

/// Write `top` with `model` renamed, `choices` rewritten where they changed, `usage`
/// dropped, then `usage_json` appended when given.
fn write_top<B: BufMut>(
    out: &mut B,
    top: &Members<'_>,
    model: Option<&str>,
    list: Option<&[Choice<'_>]>,
    part_key: &str,
    usage_json: Option<&str>,
) {
    let choices_changed = list.is_some_and(|l| l.iter().any(|c| c.out.changed || c.service.is_some()));
    let mut w = ObjectWriter::new(out);
    for (k, v) in &top.0 {
        match k.0.as_ref() {
            "usage" => {}
            "model" if model.is_some() => w.with("model", |b| json_raw::write_string(b, model.unwrap_or_default())),
            "choices" if choices_changed => {
                if let Some(l) = list {
                    w.with("choices", |b| write_choices(b, l, part_key));
                }
            }
            k => w.raw(k, v.get()),
        }
    }
    if let Some(u) = usage_json {
        w.raw("usage", u);
    }
    w.finish();
}

/// A whole non-streamed body (`response::on_chunk`): the new body, or `None` for the
/// `Value` path.
pub fn json_body(raw: &[u8], cx: &mut RequestCtx) -> Option<Vec<u8>> {
    let top = Members::parse(raw)?;
    // Anything but a completion with a list of choice objects is the `Value` path's to refuse.
    let mut list = match top.get("choices") {
        Some(c) if json_raw::is_array(c) => Some(choices(c, "message")?),
        _ => return None,
    };
    if list.iter().flatten().any(|c| c.members.is_none()) {
        return None;
    }
    let provider: Option<Value> = match top.get("usage") {
        Some(u) => Some(serde_json::from_str(u.get()).ok()?),
        None => None,
    };
    // Nothing can fail from here on.
    let mut choices_seen = 0;
    let mut answered_any = false;
    let mut text_bytes = 0;
    for c in list.iter_mut().flatten().filter(|c| c.members.is_some()) {
        choices_seen += 1;
        text_bytes += c.out.text_bytes;
        answered_any |= c.out.answer;
        if !c.out.answer {
            c.service = c.finish_reason.clone();
        }
    }
    let no_answer = choices_seen > 0 && !answered_any;
    let figures = match (provider.as_ref(), cx.model()) {
        (Some(u), Some(m)) => usage::from_provider(u, m),
        _ => None,
    };
    cx.response.delivered_tokens = (text_bytes as u64).div_ceil(4);
    cx.response.delivered_text_bytes = text_bytes as u64;
    let usage_json = figures.map(|f| {
        cx.usage = Some(f);
        usage::render_chat_usage(&f, no_answer)
    });
    let mut out = Vec::with_capacity(raw.len() + usage_json.as_ref().map_or(0, String::len) + 64);
    write_top(&mut out, &top, renamed_model(&top, cx), list.as_deref(), "message", usage_json.as_deref());
    Some(out)
}

/// One stream frame's JSON payload (`stream::on_frame`): appends the frame to `out`
/// (`frame` itself when nothing changed), or `None` for the `Value` path (error frames and
/// the usage frame take it).
pub fn stream_frame(data: &[u8], frame: &[u8], cx: &mut RequestCtx, out: &mut BytesMut) -> Option<()> {
    // A payload spread over several `data:` lines holds line breaks that copied text would
    // carry into one line: leave those to the `Value` path, which re-serializes everything.
    if memchr::memchr2(b'\n', b'\r', data).is_some() {
        return None;
    }
    if super::raw_frame::plain_frame(data, frame, cx, out) {
        return Some(());
    }
    let top = Members::parse(data)?;
    if top.get("error").is_some() && top.get("choices").is_none() {
        return None;
    }
    if top.get("usage").is_some_and(|u| !json_raw::is_null(u)) {
        return None;
    }
    let mut list = match top.get("choices") {
        Some(c) if json_raw::is_array(c) => Some(choices(c, "delta")?),
        _ => return None,
    };
    if list.iter().flatten().any(|c| c.members.is_none()) {
        return None;
    }
    // Nothing can fail from here on.
    let rename = renamed_model(&top, cx).is_some();
    let mut changed = rename;
    for (pos, c) in list.iter_mut().flatten().enumerate() {
        if c.members.is_none() {
            continue;
        }
        let idx = c.index.map_or(pos, |i| i as usize).min(64);
        if cx.response.answered.len() <= idx {
            cx.response.answered.resize(idx + 1, false);
        }
        if c.part.is_some() {
            changed |= c.out.changed;
            if c.out.output {
                cx.response.delivered_tokens += 1;
                cx.response.delivered_text_bytes += c.out.text_bytes as u64;
                cx.first_token_seen.store(true, Ordering::Release);
            }
            cx.response.answered[idx] |= c.out.answer;
        }
        if c.finish_reason.is_some() && !cx.response.answered[idx] {
            c.service = c.finish_reason.clone();
            changed = true;
        }
    }
    if !changed {
        out.extend_from_slice(frame);
        return Some(());
    }
    out.reserve(data.len() + 16);
    out.extend_from_slice(b"data: ");
    let model = if rename { renamed_model(&top, cx) } else { None };
    write_top(out, &top, model, list.as_deref(), "delta", None);
    out.extend_from_slice(b"\n\n");
    Some(())
}

#[cfg(test)]
#[allow(clippy::unwrap_used, clippy::expect_used, clippy::panic)]
#[path = "raw_tests.rs"]
mod tests;
