//! The `messages` field: the shape rules of the spec's field table (roles, `content`,
//! `tool_calls`, `tool_call_id`; clarification 16) and the system-message repair of rule 6.

use serde_json::{Map, Value};

use tollgate::config::SystemMessages;
use tollgate::http::error::{ErrorKind, GatewayError};

const ROLES: &[&str] = &["system", "developer", "user", "assistant", "tool"];

/// Check every message; returns the list (non-empty).
pub fn check(messages: Option<&Value>) -> Result<&Vec<Value>, GatewayError> {
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
        check_one(i, m)?;
    }
    Ok(list)
}

fn check_one(i: usize, m: &Value) -> Result<(), GatewayError> {
    let Some(m) = m.as_object() else {
        return Err(GatewayError::invalid_request(&format!("messages[{i}]"), "Each message must be an object."));
    };
    let role = match m.get("role").and_then(Value::as_str) {
        Some(r) if ROLES.contains(&r) => r,
        Some(r) => {
            return Err(GatewayError::invalid_request(
                &format!("messages[{i}].role"),
                format!("Role `{}` is not one of {}.", tollgate::http::text::truncate(r, 64), ROLES.join(", ")),
            ));
        }
        None => return Err(GatewayError::missing_field(&format!("messages[{i}].role"))),
    };
    let has_content = check_content(i, m.get("content"))?;
    match role {
        "assistant" => {
            let calls = check_tool_calls(i, m.get("tool_calls"))?;
            if !has_content && calls == 0 {
                return Err(GatewayError::new(
                    ErrorKind::MissingRequiredField,
                    "An assistant message needs `content` or a non-empty `tool_calls`.",
                )
                .with_param(format!("messages[{i}].content")));
            }
        }
        "tool" => {
            if !has_content {
                return Err(GatewayError::missing_field(&format!("messages[{i}].content")));
            }
            let param = format!("messages[{i}].tool_call_id");
            match m.get("tool_call_id") {
                None | Some(Value::Null) => return Err(GatewayError::missing_field(&param)),
                Some(Value::String(s)) if !s.is_empty() => {}
                Some(_) => {
                    return Err(GatewayError::invalid_request(&param, "`tool_call_id` must be a non-empty string."));
                }
            }
        }
        _ if !has_content => return Err(GatewayError::missing_field(&format!("messages[{i}].content"))),
        _ => {}
    }
    Ok(())
}

/// `content` is a string, an array of part objects (each with a string `type`) or null.
/// Returns whether content is present (not absent, not null).
fn check_content(i: usize, content: Option<&Value>) -> Result<bool, GatewayError> {
    match content {
        None | Some(Value::Null) => Ok(false),
        Some(Value::String(_)) => Ok(true),
        Some(Value::Array(parts)) => {
            for (j, p) in parts.iter().enumerate() {
                if p.get("type").and_then(Value::as_str).is_none() {
                    return Err(GatewayError::invalid_request(
                        &format!("messages[{i}].content[{j}]"),
                        "Each content part must be an object with a string `type`.",
                    ));
                }
            }
            Ok(true)
        }
        Some(_) => Err(GatewayError::invalid_request(
            &format!("messages[{i}].content"),
            "`content` must be a string, an array of content parts or null.",
        )),
    }
}

/// Check `tool_calls` (clarification 16); returns how many there are.
fn check_tool_calls(i: usize, calls: Option<&Value>) -> Result<usize, GatewayError> {
    let calls = match calls {
        None | Some(Value::Null) => return Ok(0),
        Some(Value::Array(calls)) => calls,
        Some(_) => {
            return Err(GatewayError::invalid_request(
                &format!("messages[{i}].tool_calls"),
                "`tool_calls` must be an array.",
            ));
        }
    };
    for (j, call) in calls.iter().enumerate() {
        let Some(function) = call.get("function").and_then(Value::as_object) else {
            return Err(GatewayError::invalid_request(
                &format!("messages[{i}].tool_calls[{j}].function"),
                "Each tool call needs a `function` object.",
            ));
        };
        let holds_object = function
            .get("arguments")
            .and_then(Value::as_str)
            .is_some_and(|s| serde_json::from_str::<Value>(s).is_ok_and(|v| v.is_object()));
        if !holds_object {
            return Err(GatewayError::invalid_request(
                &format!("messages[{i}].tool_calls[{j}].function.arguments"),
                "`arguments` must be a JSON object serialized as a string (\"{}\" for no arguments).",
            ));
        }
    }
    Ok(calls.len())
}

/// Rule 6: `developer` is sent as `system`; on a model taking one system message, first,
/// the leading system messages merge (blank-line separated) and later ones become `user`
/// messages in place. Impossible (decisions.md 58): a leading system message that is not
/// text, or no message other than system ones. Returns whether the list changed (the
/// replica's body then carries the list as changed, not as the client wrote it).
pub fn repair_system(list: &mut Vec<Value>, mode: SystemMessages) -> Result<bool, GatewayError> {
    let mut changed = false;
    for m in list.iter_mut() {
        if m.get("role").and_then(Value::as_str) == Some("developer") {
            m["role"] = Value::String("system".into());
            changed = true;
        }
    }
    if mode == SystemMessages::Any {
        return Ok(changed);
    }
    let is_system = |m: &Value| m.get("role").and_then(Value::as_str) == Some("system");
    let leading = list.iter().take_while(|m| is_system(m)).count();
    if leading == list.len() {
        return Err(GatewayError::invalid_request(
            "messages",
            "This model takes one system message, first, followed by the conversation; no other message was sent.",
        ));
    }
    if leading > 1 {
        let mut texts = Vec::with_capacity(leading);
        for (i, m) in list[..leading].iter().enumerate() {
            texts.push(text_of(m.get("content")).ok_or_else(|| {
                GatewayError::invalid_request(
                    "messages",
                    format!("System message {i} cannot be merged into the first one: only text can be merged."),
                )
            })?);
        }
        let merged = texts.join("\n\n");
        let mut first: Map<String, Value> = list[0].as_object().cloned().unwrap_or_default();
        first.insert("content".into(), Value::String(merged));
        list.splice(..leading, std::iter::once(Value::Object(first)));
        changed = true;
    }
    for m in list.iter_mut().skip(1) {
        if is_system(m) {
            m["role"] = Value::String("user".into());
            changed = true;
        }
    }
    Ok(changed)
}

/// The text of a string content or of an array of only text parts.
fn text_of(content: Option<&Value>) -> Option<String> {
    match content? {
        Value::String(s) => Some(s.clone()),
        Value::Array(parts) => {
            let texts: Option<Vec<&str>> = parts
                .iter()
                .map(|p| (p.get("type").and_then(Value::as_str) == Some("text")).then(|| p.get("text")?.as_str())?)
                .collect();
            texts.map(|t| t.join("\n\n"))
        }
        _ => None,
    }
}

#[cfg(test)]
#[path = "messages_tests.rs"]
mod tests;
