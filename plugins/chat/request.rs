//! Chat request -> replica request (clarification 4): only the fields the gateway handles,
//! the rule-1 allowlist and the sampling fields are forwarded; `model` becomes the upstream
//! name and usage is always requested on streams so billing can settle.

use bytes::Bytes;
use serde_json::{Map, Value, json};

use crate::ctx::RequestCtx;
use crate::error::{ErrorKind, GatewayError};

/// Forwarded as they are (spec rule 1, plus the fields of clarification 4).
const FORWARDED: &[&str] = &[
    "messages",
    "max_tokens",
    "max_completion_tokens",
    "reasoning_effort",
    "response_format",
    "tools",
    "tool_choice",
    "n",
    "stop",
    "temperature",
    "top_p",
    "audio",
    "frequency_penalty",
    "function_call",
    "functions",
    "logit_bias",
    "logprobs",
    "metadata",
    "modalities",
    "moderation",
    "parallel_tool_calls",
    "prediction",
    "presence_penalty",
    "safety_identifier",
    "seed",
    "service_tier",
    "store",
    "top_logprobs",
    "user",
    "verbosity",
    "web_search_options",
];

/// Candidate-count fields: at most four (rule 2 reads them, then most are removed).
const CANDIDATE_FIELDS: &[&str] = &["n", "best_of", "num_return_sequences", "num_beams", "beam_width"];

const ROLES: &[&str] = &["system", "developer", "user", "assistant", "tool"];

fn check_messages(messages: Option<&Value>) -> Result<&Vec<Value>, GatewayError> {
    let list = match messages {
        None | Some(Value::Null) => return Err(GatewayError::missing_field("messages")),
        Some(Value::Array(list)) if !list.is_empty() => list,
        Some(_) => {
            return Err(GatewayError::invalid_request(
                "messages",
                "`messages` must be a non-empty array of message objects.",
            ));
        }
    };
    for (i, m) in list.iter().enumerate() {
        let role = m.get("role").and_then(Value::as_str);
        match role {
            Some(r) if ROLES.contains(&r) => {}
            Some(r) => {
                return Err(GatewayError::invalid_request(
                    &format!("messages[{i}].role"),
                    format!("Role `{}` is not one of {}.", crate::request::truncate(r, 64), ROLES.join(", ")),
                ));
            }
            None => return Err(GatewayError::missing_field(&format!("messages[{i}].role"))),
        }
    }
    Ok(list)
}

fn positive_int(body: &Map<String, Value>, field: &str) -> Result<Option<u64>, GatewayError> {
    match body.get(field) {
        None | Some(Value::Null) => Ok(None),
        Some(v) => match v.as_u64() {
            Some(n) if n >= 1 => Ok(Some(n)),
            _ => Err(GatewayError::invalid_request(field, format!("`{field}` must be an integer of at least 1."))),
        },
    }
}

/// Validate the chat request and set `cx.upstream_body`, `cx.stream`, `cx.include_usage`.
pub fn rewrite(cx: &mut RequestCtx) -> Result<(), GatewayError> {
    let Some(Value::Object(body)) = cx.body.take() else {
        return Err(GatewayError::internal("chat body missing"));
    };
    check_messages(body.get("messages"))?;
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

    let pool = cx.pool.clone().ok_or_else(|| GatewayError::internal("no pool resolved"))?;
    let mut out = Map::with_capacity(body.len() + 2);
    out.insert("model".into(), Value::String(pool.upstream_model.clone()));
    let mut body = body;
    for field in FORWARDED {
        if let Some(v) = body.remove(*field) {
            out.insert((*field).to_string(), v);
        }
    }
    if stream {
        out.insert("stream".into(), Value::Bool(true));
        // Always asked for, so the stream can be settled; forwarded to the client only
        // when it asked (see stream.rs).
        out.insert("stream_options".into(), json!({ "include_usage": true }));
    }
    let bytes = serde_json::to_vec(&Value::Object(out))
        .map_err(|e| GatewayError::internal(format!("could not serialize the body: {e}")))?;
    // Fallback prompt estimate (about four bytes a token) until a tokenizer is declared.
    cx.prompt_estimate = (bytes.len() as u64).div_ceil(4);
    cx.stream = stream;
    cx.include_usage = include_usage;
    cx.output_ceiling = max_completion_tokens.or(max_tokens);
    cx.upstream_body = Some(Bytes::from(bytes));
    Ok(())
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn roles_are_checked_with_param() {
        let msgs = json!([{"role": "user", "content": "hi"}, {"role": "robot", "content": "x"}]);
        let e = check_messages(Some(&msgs)).err();
        assert_eq!(e.and_then(|e| e.param), Some("messages[1].role".to_string()));
        assert_eq!(check_messages(None).err().map(|e| e.kind), Some(ErrorKind::MissingRequiredField));
        assert!(check_messages(Some(&json!([]))).is_err());
    }
}
