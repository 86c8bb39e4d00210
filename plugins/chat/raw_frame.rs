//! The common stream frame, read in one pass as a borrowed view (`raw.rs` takes the rest):
//! no error, no usage, no reasoning to move and no choice ending without an answer, so its
//! only possible change is the model name, spliced into the text as it arrived.

use std::sync::atomic::Ordering;

use bytes::BytesMut;
use serde::Deserialize;
use serde_json::value::RawValue;

use super::raw::{non_empty_array, str_len};
use super::response::ChoiceOutput;
use tollgate::ctx::RequestCtx;
use tollgate::json_raw;

/// The members of a frame this module reads, in one pass (everything else is skipped).
#[derive(Deserialize)]
struct FrameView<'a> {
    #[serde(borrow)]
    model: Option<&'a RawValue>,
    #[serde(borrow)]
    choices: Option<Vec<ChoiceView<'a>>>,
    #[serde(borrow)]
    usage: Option<&'a RawValue>,
    #[serde(borrow)]
    error: Option<&'a RawValue>,
}

#[derive(Deserialize)]
struct ChoiceView<'a> {
    #[serde(borrow)]
    index: Option<&'a RawValue>,
    #[serde(borrow)]
    delta: Option<DeltaView<'a>>,
    #[serde(borrow)]
    finish_reason: Option<&'a RawValue>,
}

#[derive(Deserialize)]
struct DeltaView<'a> {
    #[serde(borrow)]
    content: Option<&'a RawValue>,
    #[serde(borrow)]
    reasoning: Option<&'a RawValue>,
    #[serde(borrow)]
    reasoning_content: Option<&'a RawValue>,
    #[serde(borrow)]
    tool_calls: Option<&'a RawValue>,
}

/// The common frame, read in one pass: no error, no usage, no reasoning to move and no
/// choice ending without an answer. Its only possible change is the model name, spliced
/// into the text as it arrived. `false` (nothing in `cx` changed) for any other frame.
pub(super) fn plain_frame(data: &[u8], frame: &[u8], cx: &mut RequestCtx, out: &mut BytesMut) -> bool {
    let Ok(view) = serde_json::from_slice::<FrameView<'_>>(data) else {
        return false;
    };
    if view.error.is_some() || view.usage.is_some() {
        return false;
    }
    // A frame without `choices` is not the common frame (the `Value` path judges it).
    let Some(choices) = view.choices else {
        return false;
    };
    // `index`, else the position (as `on_frame_value` reads it).
    let idxs: Vec<usize> = choices
        .iter()
        .enumerate()
        .map(|(pos, c)| {
            c.index.and_then(|r| serde_json::from_str::<u64>(r.get()).ok()).map_or(pos, |i| i as usize).min(64)
        })
        .collect();
    let mut outputs: Vec<Option<ChoiceOutput>> = Vec::with_capacity(choices.len());
    for (pos, c) in choices.iter().enumerate() {
        let idx = idxs[pos];
        let o = match &c.delta {
            Some(d) if d.reasoning_content.is_some() => return false,
            Some(d) => {
                let content = str_len(d.content);
                let reasoning = str_len(d.reasoning);
                let answer = content > 0 || d.tool_calls.is_some_and(non_empty_array);
                Some(ChoiceOutput {
                    changed: false,
                    answer,
                    output: answer || reasoning > 0,
                    text_bytes: content + reasoning,
                })
            }
            None => None,
        };
        if c.finish_reason.is_some_and(|f| f.get().starts_with('"')) {
            // Needs `service` unless this choice (here or in an earlier frame) answered.
            let answered = cx.response.answered.get(idx).copied().unwrap_or(false)
                || idxs[..=pos]
                    .iter()
                    .zip(outputs.iter().chain(std::iter::once(&o)))
                    .any(|(&i, o)| i == idx && o.is_some_and(|o| o.answer));
            if !answered {
                return false;
            }
        }
        outputs.push(o);
    }
    // Nothing can fail from here on.
    for (&idx, o) in idxs.iter().zip(&outputs) {
        if cx.response.answered.len() <= idx {
            cx.response.answered.resize(idx + 1, false);
        }
        if let Some(o) = o {
            if o.output {
                cx.response.delivered_tokens += 1;
                cx.response.delivered_text_bytes += o.text_bytes as u64;
                cx.first_token_seen.store(true, Ordering::Release);
            }
            cx.response.answered[idx] |= o.answer;
        }
    }
    let renamed = view.model.and_then(|m| Some((m, cx.pool()?.from_upstream(&json_raw::as_str(m)?.0)?)));
    match renamed {
        None => out.extend_from_slice(frame),
        Some((m, id)) => {
            // `m` borrows from `data`: its offset there is where the name goes.
            let start = (m.get().as_ptr() as usize).saturating_sub(data.as_ptr() as usize);
            let end = start + m.get().len();
            out.reserve(data.len() + id.len() + 8);
            out.extend_from_slice(b"data: ");
            out.extend_from_slice(&data[..start]);
            json_raw::write_string(out, id);
            out.extend_from_slice(&data[end..]);
            out.extend_from_slice(b"\n\n");
        }
    }
    true
}
