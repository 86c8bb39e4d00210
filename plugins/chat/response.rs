//! Non-streamed chat responses: collected to the end, read once into the borrowed view,
//! accounted, then either edited in place (the chat dialect: model name, reasoning,
//! `service.output_status`, the hosted Usage object) or handed as typed pieces to the
//! dialect's translator.

use bytes::Bytes;

use super::account::{account, delivered, no_answer, priced};
use super::edits::Edits;
use crate::shared::answer::{AnswerView, Form, PricedUsage, pieces};
use tollgate::http::error::{ErrorKind, GatewayError};
use tollgate::money::usage;
use tollgate::proxy::ctx::RequestCtx;

fn malformed() -> GatewayError {
    GatewayError::new(ErrorKind::UpstreamFailed, "The model server sent a malformed response.")
}

/// Collect the body; at the end, rewrite it whole.
pub fn on_chunk(body: &mut Option<Bytes>, eos: bool, cx: &mut RequestCtx) -> Result<(), GatewayError> {
    if let Some(b) = body.take() {
        cx.response.body_buf.extend_from_slice(&b);
    }
    if !eos {
        return Ok(());
    }
    let raw = cx.response.body_buf.split().freeze();
    *body = Some(Bytes::from(rewrite(&raw, cx)?));
    Ok(())
}

/// The answer the client gets for the replica's whole body `raw`.
pub fn rewrite(raw: &[u8], cx: &mut RequestCtx) -> Result<Vec<u8>, GatewayError> {
    // A chat completion: an object whose `choices` is a list of objects (clarification 11:
    // anything else is a malformed answer, `502 upstream_error`, never passed on as a 200).
    let view = AnswerView::parse(raw).ok_or_else(malformed)?;
    if view.choices.is_none() {
        return Err(malformed());
    }
    let mut edits = Edits::new(raw);
    account(&view, Form::Body, cx, &mut edits).ok_or_else(malformed)?;
    let translating = cx.answer_translator.is_some();
    let reported = view.usage.value().and_then(|u| priced(u, cx));
    if let Some(f) = reported {
        cx.usage.report(f);
    }
    // Without a report, a dialect's usage shows what will be billed (what the core's
    // completion counts from the delivered output).
    let figures = reported.or_else(|| if translating { delivered(cx) } else { None });
    let no_answer = no_answer(cx);
    if let Some(t) = cx.answer_translator.as_ref() {
        let usage = figures.map(|figures| PricedUsage { figures, no_answer });
        return Ok(t.whole(&view.meta(), &pieces(&view, Form::Body), usage));
    }
    if let Some(u) = view.usage.0 {
        // Never synthesized: a report that is not a usage object is dropped.
        match figures {
            Some(f) => edits.replace_value(u, usage::render_chat_usage(&f, no_answer).into_bytes()),
            None => edits.remove_member(u),
        }
        .ok_or_else(malformed)?;
    }
    let mut out = Vec::with_capacity(raw.len() + 256);
    edits.write(&mut out);
    Ok(out)
}
