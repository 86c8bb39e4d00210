//! Chat request -> replica request (clarification 4): only the fields the gateway handles,
//! the rule-1 allowlist and the sampling fields are forwarded; `model` becomes the upstream
//! name and usage is always requested on streams so billing can settle (the body itself is
//! written by `upstream_body.rs`).
//!
//! The rule groups live beside this file and run in this order (decisions.md 56): message
//! shapes (`messages.rs`), rules 4 and the candidate count (here), capabilities (rule 5,
//! `capability.rs`), content parts (rule 8, `images.rs`), system messages (rule 6), schemas
//! (rule 7, `schema.rs`), efforts (rules 9-10, `effort.rs`), then the prompt is counted and
//! fitted to the context window (rule 11, `context.rs`).

use bytes::Bytes;
use serde_json::{Map, Value};

use super::{capability, context, effort, images, messages, schema, upstream_body};
use crate::shared::prompt_tokens::count_prompt_tokens;
use tollgate::http::error::{ErrorKind, GatewayError};
use tollgate::proxy::ctx::RequestCtx;

/// Candidate-count fields: at most four (rule 2 reads them, then most are removed).
const CANDIDATE_FIELDS: &[&str] = &["n", "best_of", "num_return_sequences", "num_beams", "beam_width"];

fn positive_int(body: &Map<String, Value>, field: &str) -> Result<Option<u64>, GatewayError> {
    match body.get(field) {
        None | Some(Value::Null) => Ok(None),
        Some(v) => match v.as_u64() {
            Some(n) if n >= 1 => Ok(Some(n)),
            _ => Err(GatewayError::invalid_request(field, format!("`{field}` must be an integer of at least 1."))),
        },
    }
}

/// Validate the chat request, set `cx.stream` and the `cx.chat_request` facts the later phases
/// read, and return the body for the replica.
pub fn rewrite(cx: &mut RequestCtx) -> Result<Bytes, GatewayError> {
    let Some(Value::Object(body)) = cx.body.take() else {
        return Err(GatewayError::internal("chat body missing"));
    };
    let model = cx.model().cloned().ok_or_else(|| GatewayError::internal("no model resolved"))?;
    let list = messages::check(body.get("messages"))?;
    for field in ["prompt_cache_options", "prompt_cache_retention"] {
        if body.contains_key(field) {
            return Err(GatewayError::new(
                ErrorKind::HostedParameterNotSupported,
                format!("`{field}` is not supported on hosted models; remove it."),
            )
            .with_param(field));
        }
    }
    for field in CANDIDATE_FIELDS {
        if let Some(v) = body.get(*field).filter(|v| !v.is_null()) {
            match v.as_u64() {
                Some(n) if n <= 4 => {}
                Some(_) => {
                    return Err(GatewayError::new(
                        ErrorKind::GenerationCount,
                        format!("`{field}` asks for more than four candidates."),
                    )
                    .with_param(*field));
                }
                None => {
                    return Err(GatewayError::invalid_request(field, format!("`{field}` must be a whole number.")));
                }
            }
        }
    }
    let max_tokens = positive_int(&body, "max_tokens")?;
    let max_completion_tokens = positive_int(&body, "max_completion_tokens")?;
    let stream = match body.get("stream") {
        None | Some(Value::Null) => false,
        Some(Value::Bool(b)) => *b,
        Some(_) => {
            return Err(GatewayError::invalid_request("stream", "`stream` must be a boolean."));
        }
    };
    let include_usage =
        body.get("stream_options").and_then(|o| o.get("include_usage")).and_then(Value::as_bool).unwrap_or(false);

    let json_format = capability::check(&body, &model)?;
    images::check(list, model.input_modalities.iter().any(|m| m == "image"))?;
    let mut body = body;
    let mut changed = upstream_body::Changed::default();
    if let Some(Value::Array(list)) = body.get_mut("messages") {
        changed.messages = messages::repair_system(list, model.chat.system_messages)?;
    }
    schema::sanitize_body(&mut body)?;
    let applied_effort = effort::apply(&mut body, &model.chat, json_format)?;
    changed.effort = applied_effort.is_some();

    let pool = cx.pool().cloned().ok_or_else(|| GatewayError::internal("no pool resolved"))?;
    // Counted on what the replica reads: the messages and tools, both forwarded.
    let body = Value::Object(body);
    let prompt_tokens = count_prompt_tokens(&body, model.chat.tokenizer.as_deref());
    let Value::Object(mut body) = body else { return Err(GatewayError::internal("body is an object")) };
    let clamped = context::fit(&mut body, model.context_window, prompt_tokens)?;
    changed.ceilings = clamped.is_some();
    // The client's own text, unless a dialect translated it into this body.
    let client_text = cx.raw_body.as_deref().filter(|_| cx.answer_translator.is_none());
    let upstream = pool.to_upstream();
    let bytes = match client_text.and_then(|t| upstream_body::from_client_text(t, &body, upstream, stream, changed)) {
        Some(b) => b,
        None => upstream_body::serialize(body, upstream, stream)?,
    };
    if let Some(e) = applied_effort {
        cx.response_headers.push((effort::APPLIED_HEADER, e));
    }
    if let Some(c) = clamped {
        cx.response_headers.push((context::CLAMPED_HEADER, "true".into()));
        cx.response_headers.push((context::CEILING_HEADER, c.to_string()));
    }
    // The same counter as the context check (tokenizer or bytes/4 rule; decisions.md 63).
    cx.prompt_estimate = prompt_tokens;
    cx.stream = stream;
    let output_ceiling = match clamped {
        Some(c) => Some(max_completion_tokens.or(max_tokens).map_or(c, |v| v.min(c))),
        None => max_completion_tokens.or(max_tokens),
    };
    cx.chat_request = tollgate::proxy::ctx::ChatRequestFacts { include_usage, output_ceiling };
    Ok(Bytes::from(bytes))
}
