//! The one accounting step of the response pipeline: given the borrowed view of a body or a
//! stream chunk, update what the request has delivered (answered choices, delivered tokens
//! and text, the first token) and plan the edits the chat dialect makes to the text (the
//! model name, reasoning moved to `reasoning`, `service.output_status` on a choice that ended
//! without answer content). Usage is priced by the caller, which knows the body's form.

use bytes::Bytes;
use serde_json::{Value, json};

use super::edits::Edits;
use crate::shared::answer::{AnswerView, Form, PartView};
use tollgate::proxy::ctx::RequestCtx;

/// What one choice's `message` or `delta` carried.
#[derive(Debug, Default, Clone, Copy)]
struct PartOutput {
    /// Answer content (non-empty text) or tool calls.
    answer: bool,
    /// Answer or reasoning output (a delivered token).
    output: bool,
    text_bytes: usize,
}

/// The part as the client gets it: a replica's `reasoning_content` counts as `reasoning`
/// where that is absent or null.
fn part_output(part: &PartView<'_>) -> PartOutput {
    let reasoning = match part.reasoning.value() {
        Some(_) => part.reasoning.str_len(),
        None => part.reasoning_content.str_len(),
    };
    let content = part.content.str_len();
    let answer = content > 0 || part.tool_calls.is_non_empty_array();
    PartOutput { answer, output: answer || reasoning > 0, text_bytes: content + reasoning }
}

/// `reasoning_content` becomes `reasoning` (where `reasoning` is absent or null; otherwise it
/// is dropped).
fn move_reasoning(part: &PartView<'_>, edits: &mut Edits<'_>) -> Option<()> {
    let Some(rc) = part.reasoning_content.0 else { return Some(()) };
    match part.reasoning.0 {
        None => edits.rename_key(rc, "reasoning"),
        Some(r) if part.reasoning.value().is_none() => {
            edits.replace_value(r, rc.get().as_bytes().to_vec())?;
            edits.remove_member(rc)
        }
        Some(_) => edits.remove_member(rc),
    }
}

/// The catalog id (as JSON text) where the answer names the replicas' model; computed once
/// per request and then shared by every frame.
fn renamed_model(view: &AnswerView<'_>, cx: &mut RequestCtx) -> Option<Bytes> {
    struct ModelJson(Bytes);
    let name = view.model.as_str()?;
    if let Some(ModelJson(json)) = cx.ext.get::<ModelJson>() {
        return cx.pool()?.from_upstream(&name).map(|_| json.clone());
    }
    let id = cx.pool()?.from_upstream(&name)?;
    let mut json = Vec::with_capacity(id.len() + 2); // quotes; an id with escapes grows it
    tollgate::http::json_raw::write_string(&mut json, id);
    let json = Bytes::from(json);
    cx.ext.insert(ModelJson(json.clone()));
    Some(json)
}

/// `service.output_status` for a choice that ended without answer content.
pub fn output_status(finish_reason: &str) -> Value {
    if finish_reason == "length" {
        json!({ "output_status": {
            "code": "generation_limit_reached_before_answer",
            "message": "The output limit was reached before the model produced answer content; raise max_tokens or lower reasoning_effort."
        }})
    } else {
        json!({ "output_status": {
            "code": "no_answer_content",
            "message": "The model finished without producing answer content."
        }})
    }
}

/// Account for one body or chunk and plan its edits. `None`: a place to edit could not be
/// located (the text is then treated as malformed); nothing in `cx` is trusted after it.
pub fn account<'t>(view: &AnswerView<'t>, form: Form, cx: &mut RequestCtx, edits: &mut Edits<'t>) -> Option<()> {
    crate::shared::answer::note_facts(&mut cx.answer_facts, view);
    if let (Some(model), Some(json)) = (view.model.0, renamed_model(view, cx)) {
        edits.replace_value(model, json)?;
    }
    let mut body_text_bytes = 0;
    for (pos, choice) in view.choices.iter().flatten().enumerate() {
        let slot = choice.slot(pos);
        if cx.response.answered.len() <= slot {
            cx.response.answered.resize(slot + 1, false);
        }
        if let Some(part) = choice.part(form) {
            move_reasoning(part, edits)?;
            let out = part_output(part);
            match form {
                Form::Body => body_text_bytes += out.text_bytes,
                Form::Chunk if out.output => {
                    cx.response.delivered_tokens += 1;
                    cx.response.delivered_text_bytes += out.text_bytes as u64;
                    cx.first_token_seen = true;
                    cx.response.first_token_after.get_or_insert_with(|| cx.started.elapsed());
                }
                Form::Chunk => {}
            }
            cx.response.answered[slot] |= out.answer;
        }
        let Some(finish) = choice.finish_reason.as_str() else { continue };
        // Only a sampled trace keeps them: nothing is allocated for other requests.
        if let Some(trace) = tollgate::observe::traces::RequestTrace::sampled(&mut cx.trace) {
            if !trace.finish_reasons.iter().any(|r| *r == *finish) {
                trace.finish_reasons.push(finish.to_string());
            }
        }
        if !cx.response.answered[slot] {
            let status = serde_json::to_vec(&output_status(&finish)).ok()?;
            match choice.service.0 {
                Some(existing) => edits.replace_value(existing, status)?,
                None => edits.insert_before(choice.finish_reason.0?, "service", &status)?,
            }
        }
    }
    if form == Form::Body {
        // Fallback count for settlement when the replica reported no usage.
        cx.response.delivered_tokens = (body_text_bytes as u64).div_ceil(4);
        cx.response.delivered_text_bytes = body_text_bytes as u64;
    }
    Some(())
}

/// Every choice seen so far ended without answer content.
pub fn no_answer(cx: &RequestCtx) -> bool {
    !cx.response.answered.is_empty() && cx.response.answered.iter().all(|a| !a)
}

/// Without a usage report, the figures that will be billed: the prompt estimate and the
/// delivered output (clarification 13). A dialect's answer must carry a usage object, and it
/// shows these rather than zeros; `None` when nothing was delivered (nothing is billed).
pub fn delivered(cx: &RequestCtx) -> Option<tollgate::money::usage::UsageFigures> {
    tollgate::money::usage::from_delivered(cx.model()?, cx.arrived_ms, cx.prompt_estimate, cx.response.delivered_tokens)
        .map(|f| f.paid_by(cx.paid_from))
}

/// The replica's usage report priced for the resolved model; `None` when it is not one. The
/// report is believed only up to what the request allowed: output at most its output ceiling
/// (`max_tokens`, else the model's `max_output_tokens`), the prompt at most the context
/// window. A replica claiming more is not billed for it (decision 180).
pub fn priced(usage: &serde_json::value::RawValue, cx: &RequestCtx) -> Option<tollgate::money::usage::UsageFigures> {
    let model = cx.model()?;
    let output = cx.chat_request.output_ceiling.or(model.max_output_tokens);
    let ceilings =
        tollgate::money::usage::Ceilings { prompt: model.context_window, completion: output.or(model.context_window) };
    tollgate::money::usage::from_provider_text(usage.get(), model, cx.arrived_ms, ceilings)
        .map(|f| f.paid_by(cx.paid_from))
}
