//! A messages-dialect request body as a chat-completions request body.
//!
//! The result only uses fields the chat path forwards (clarification 4), so the chat
//! plugin's own rules (system-message repair, clamping, JSON-format remedies) apply to it
//! unchanged afterwards. Fields the spec lists as "accepted and ignored", and unknown
//! top-level fields, are never read: ignoring them is the absence of code.

use serde_json::{Map, Value, json};

use super::caps::{Effort, ModelCaps, ReasoningOff};
use super::fields::{
    body_object, given, kind, optional_bool, optional_object, optional_positive, optional_str, required_str,
};
use super::messages_blocks::{system_message, translate};
use super::messages_tools::{tool_choice, tools};
use super::{ChatTranslation, Purpose, WARN_EFFORT_CLAMPED, WARN_THINKING_NOT_DISABLED};
use tollgate::config::ModelEntry;
use tollgate::http::error::{ErrorKind, GatewayError};

/// Translate `body` for `model`. `Purpose::CountTokens` makes `max_tokens` optional and
/// never asks for a stream (counting answers JSON).
pub fn to_chat(body: &Value, model: &ModelEntry, purpose: Purpose) -> Result<ChatTranslation, GatewayError> {
    to_chat_with(body, &ModelCaps::of(model), purpose)
}

/// [`to_chat`] with the model's capabilities already read.
pub fn to_chat_with(body: &Value, caps: &ModelCaps, purpose: Purpose) -> Result<ChatTranslation, GatewayError> {
    let obj = body_object(body)?;
    let max_tokens = optional_positive(obj, "max_tokens", "max_tokens")?;
    if max_tokens.is_none() && purpose == Purpose::Generate {
        return Err(GatewayError::missing_field("max_tokens"));
    }
    let mut messages: Vec<Value> = system_message(obj.get("system"))?.into_iter().collect();
    messages.extend(translate(obj.get("messages"), caps)?);

    let mut out = Map::new();
    if let Some(m) = obj.get("model") {
        out.insert("model".into(), m.clone());
    }
    out.insert("messages".into(), Value::Array(messages));
    if let Some(n) = max_tokens {
        out.insert("max_tokens".into(), json!(n));
    }
    let stream = optional_bool(obj, "stream", "stream")?.unwrap_or(false) && purpose == Purpose::Generate;
    if stream {
        out.insert("stream".into(), json!(true));
        // The final `message_delta` carries usage, so it is always asked for.
        out.insert("stream_options".into(), json!({ "include_usage": true }));
    }
    if let Some(stop) = stop_sequences(obj)? {
        out.insert("stop".into(), stop);
    }
    let declared = tools(obj.get("tools"), caps)?;
    let choice = tool_choice(obj.get("tool_choice"), &declared.names, caps)?;
    if let Some(t) = declared.tools {
        out.insert("tools".into(), t);
    }
    if let Some(c) = choice.tool_choice {
        out.insert("tool_choice".into(), c);
    }
    if let Some(p) = choice.parallel_tool_calls {
        out.insert("parallel_tool_calls".into(), json!(p));
    }
    let output_config = optional_object(obj, "output_config", "output_config")?;
    let mut warnings = Vec::new();
    if let Some(e) = reasoning_effort(obj, output_config, caps, &mut warnings)? {
        out.insert("reasoning_effort".into(), json!(e.as_str()));
    }
    if let Some(f) = response_format(output_config, caps)? {
        out.insert("response_format".into(), f);
    }
    if let Some(metadata) = optional_object(obj, "metadata", "metadata")? {
        if let Some(user) = optional_str(metadata, "user_id", "metadata.user_id")? {
            out.insert("user".into(), json!(user));
        }
    }
    for field in ["temperature", "top_p"] {
        if let Some(v) = given(obj, field) {
            if !v.is_number() {
                return Err(GatewayError::invalid_request(
                    field,
                    format!("`{field}` must be a number, got {}.", kind(v)),
                ));
            }
            out.insert(field.into(), v.clone());
        }
    }
    Ok(ChatTranslation { body: Value::Object(out), warnings, stream })
}

fn stop_sequences(obj: &Map<String, Value>) -> Result<Option<Value>, GatewayError> {
    let list = match given(obj, "stop_sequences") {
        None => return Ok(None),
        Some(Value::Array(list)) => list,
        Some(v) => {
            return Err(GatewayError::invalid_request(
                "stop_sequences",
                format!("`stop_sequences` must be an array of strings, got {}.", kind(v)),
            ));
        }
    };
    if let Some(k) = list.iter().position(|s| !s.is_string()) {
        return Err(GatewayError::invalid_request(
            &format!("stop_sequences[{k}]"),
            "Each stop sequence must be a string.",
        ));
    }
    Ok((!list.is_empty()).then(|| Value::Array(list.clone())))
}

/// `thinking` and `output_config.effort` as one `reasoning_effort`. `thinking: disabled`
/// wins over an effort where it can be honoured; where it cannot, it is ignored with a
/// warning and the effort (if any) applies (decisions.md 68).
fn reasoning_effort(
    obj: &Map<String, Value>,
    output_config: Option<&Map<String, Value>>,
    caps: &ModelCaps,
    warnings: &mut Vec<String>,
) -> Result<Option<Effort>, GatewayError> {
    let thinking = match optional_object(obj, "thinking", "thinking")? {
        None => None,
        // `budget_tokens` is accepted and ignored.
        Some(t) => match required_str(t, "type", "thinking.type")? {
            kind @ ("enabled" | "adaptive" | "disabled") => Some(kind),
            other => {
                return Err(GatewayError::invalid_request(
                    "thinking.type",
                    format!(
                        "`thinking.type` `{}` is not one of enabled, adaptive, disabled.",
                        tollgate::http::text::truncate(other, 64)
                    ),
                ));
            }
        },
    };
    let effort = match output_config {
        None => None,
        Some(o) => match optional_str(o, "effort", "output_config.effort")? {
            None => None,
            Some(s) => Some(Effort::parse(s).ok_or_else(|| {
                GatewayError::invalid_request(
                    "output_config.effort",
                    format!(
                        "`output_config.effort` `{}` is not one of none, minimal, low, medium, high, xhigh, max.",
                        tollgate::http::text::truncate(s, 64)
                    ),
                )
            })?),
        },
    };
    if thinking == Some("disabled") {
        match caps.reasoning_off() {
            ReasoningOff::Supported => return Ok(Some(Effort::None)),
            ReasoningOff::Unsupported => warnings.push(WARN_THINKING_NOT_DISABLED.to_string()),
            ReasoningOff::Undeclared => {}
        }
    }
    let Some(wanted) = effort else { return Ok(None) };
    let choice = caps.choose_effort(wanted);
    if choice.clamped {
        warnings.push(WARN_EFFORT_CLAMPED.to_string());
    }
    Ok(Some(choice.effort))
}

/// `output_config.format` (`type: json_schema` only) as a chat `response_format`.
fn response_format(
    output_config: Option<&Map<String, Value>>,
    caps: &ModelCaps,
) -> Result<Option<Value>, GatewayError> {
    let Some(format) = output_config.and_then(|o| given(o, "format")) else {
        return Ok(None);
    };
    let f = format.as_object().ok_or_else(|| {
        GatewayError::invalid_request("output_config.format", format!("must be an object, got {}.", kind(format)))
    })?;
    let t = required_str(f, "type", "output_config.format.type")?;
    if t != "json_schema" {
        return Err(GatewayError::invalid_request(
            "output_config.format.type",
            format!(
                "`output_config.format.type` `{}` is not supported; use json_schema.",
                tollgate::http::text::truncate(t, 64)
            ),
        ));
    }
    let schema = match given(f, "schema") {
        None => return Err(GatewayError::missing_field("output_config.format.schema")),
        Some(s @ Value::Object(_)) => s.clone(),
        Some(v) => {
            return Err(GatewayError::invalid_request(
                "output_config.format.schema",
                format!("`schema` must be a JSON Schema object, got {}.", kind(v)),
            ));
        }
    };
    if !caps.json_mode {
        return Err(GatewayError::new(
            ErrorKind::HostedCapabilityNotSupported,
            "This model does not accept a JSON output format.",
        )
        .with_param("output_config.format"));
    }
    // Chat's json_schema needs a name; the messages dialect has none to carry.
    Ok(Some(json!({ "type": "json_schema", "json_schema": { "name": "output", "schema": schema } })))
}
