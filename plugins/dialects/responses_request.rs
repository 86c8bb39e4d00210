//! A `POST /v1/responses` body as a chat-completions body (spec "POST /v1/responses").
//!
//! The adapter is stateless: everything the model should see must be in the request.
//! What would need server-side state or a hosted tool (`previous_response_id`, `include`,
//! a `reasoning` object, hosted tools, `background`, `conversation`, stored prompts) is
//! refused with `400 hosted_parameter_not_supported` naming the field, never dropped
//! silently, so a client does not mistake an unsupported feature for an empty result.

use serde_json::{Map, Value, json};

use super::ChatTranslation;
use super::caps::ModelCaps;
use super::fields::{
    body_object, given, kind, optional_bool, optional_object, optional_positive, optional_str, required_str,
};
use super::images::{ImageCount, MEDIA_TYPES, parse_data_url};
use tollgate::config::ModelEntry;
use tollgate::http::error::{ErrorKind, GatewayError};

const JOIN: &str = "\n\n";

pub fn responses_to_chat(body: &Value, model: &ModelEntry) -> Result<ChatTranslation, GatewayError> {
    responses_to_chat_with(body, &ModelCaps::of(model))
}

/// [`responses_to_chat`] with the model's capabilities already read.
pub fn responses_to_chat_with(body: &Value, caps: &ModelCaps) -> Result<ChatTranslation, GatewayError> {
    let obj = body_object(body)?;
    refuse_stateful(obj)?;
    let mut messages = Vec::new();
    if let Some(i) = optional_str(obj, "instructions", "instructions")?.filter(|i| !i.is_empty()) {
        messages.push(json!({ "role": "system", "content": i }));
    }
    input_messages(given(obj, "input"), caps, &mut messages)?;

    let mut out = Map::new();
    if let Some(m) = obj.get("model") {
        out.insert("model".into(), m.clone());
    }
    out.insert("messages".into(), Value::Array(messages));
    if let Some(n) = optional_positive(obj, "max_output_tokens", "max_output_tokens")? {
        out.insert("max_tokens".into(), json!(n));
    }
    let stream = optional_bool(obj, "stream", "stream")?.unwrap_or(false);
    if stream {
        out.insert("stream".into(), json!(true));
        out.insert("stream_options".into(), json!({ "include_usage": true }));
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
    // Passed as given: the chat path applies the model's honoured set (spec rules 9, 10).
    if let Some(e) = optional_str(obj, "reasoning_effort", "reasoning_effort")? {
        out.insert("reasoning_effort".into(), json!(e));
    }
    if let Some(f) = response_format(obj, caps)? {
        out.insert("response_format".into(), f);
    }
    if let Some(t) = tools(obj, caps)? {
        out.insert("tools".into(), t);
    }
    if let Some(c) = given(obj, "tool_choice") {
        out.insert("tool_choice".into(), tool_choice(c)?);
    }
    for field in ["parallel_tool_calls", "user"] {
        if let Some(v) = given(obj, field) {
            out.insert(field.into(), v.clone());
        }
    }
    Ok(ChatTranslation { body: Value::Object(out), warnings: Vec::new(), stream })
}

fn not_here(param: &str, why: &str) -> GatewayError {
    GatewayError::new(ErrorKind::HostedParameterNotSupported, format!("`{param}` is not supported: {why}"))
        .with_param(param)
}

/// `store` is accepted either way: nothing is ever stored (decisions.md 79).
fn refuse_stateful(obj: &Map<String, Value>) -> Result<(), GatewayError> {
    const STATELESS: &str = "the adapter keeps no state; send the whole conversation in `input`.";
    for field in ["previous_response_id", "conversation", "prompt"] {
        if given(obj, field).is_some() {
            return Err(not_here(field, STATELESS));
        }
    }
    if given(obj, "include").is_some_and(|v| v.as_array().is_none_or(|a| !a.is_empty())) {
        return Err(not_here("include", "no extra output items are produced."));
    }
    if given(obj, "reasoning").is_some() {
        return Err(not_here("reasoning", "use the top-level `reasoning_effort` field."));
    }
    if optional_bool(obj, "background", "background")? == Some(true) {
        return Err(not_here("background", "responses run in the request; there are no background jobs."));
    }
    Ok(())
}

fn input_messages(input: Option<&Value>, caps: &ModelCaps, out: &mut Vec<Value>) -> Result<(), GatewayError> {
    let items = match input {
        None => return Err(GatewayError::missing_field("input")),
        Some(Value::String(s)) => {
            out.push(json!({ "role": "user", "content": s }));
            return Ok(());
        }
        Some(Value::Array(items)) if !items.is_empty() => items,
        Some(v) => {
            return Err(GatewayError::invalid_request(
                "input",
                format!("`input` must be a string or a non-empty array of input items, got {}.", kind(v)),
            ));
        }
    };
    let mut images = ImageCount::default();
    for (i, item) in items.iter().enumerate() {
        let at = format!("input[{i}]");
        let obj =
            item.as_object().ok_or_else(|| GatewayError::invalid_request(&at, format!("`{at}` must be an object.")))?;
        match optional_str(obj, "type", &format!("{at}.type"))?.unwrap_or("message") {
            "message" => out.push(message(obj, &at, caps, &mut images)?),
            "function_call" => {
                let call = json!({
                    "id": required_str(obj, "call_id", &format!("{at}.call_id"))?,
                    "type": "function",
                    "function": {
                        "name": required_str(obj, "name", &format!("{at}.name"))?,
                        "arguments": optional_str(obj, "arguments", &format!("{at}.arguments"))?.unwrap_or("{}"),
                    },
                });
                // Calls join the assistant turn before them, as one chat assistant message.
                match out.last_mut() {
                    Some(last) if last["role"] == "assistant" => match last.get_mut("tool_calls") {
                        Some(Value::Array(calls)) => calls.push(call),
                        _ => last["tool_calls"] = json!([call]),
                    },
                    _ => out.push(json!({ "role": "assistant", "content": null, "tool_calls": [call] })),
                }
            }
            "function_call_output" => {
                let id = required_str(obj, "call_id", &format!("{at}.call_id"))?;
                let output = match given(obj, "output") {
                    Some(Value::String(s)) => s.clone(),
                    Some(v) => v.to_string(),
                    None => String::new(),
                };
                out.push(json!({ "role": "tool", "tool_call_id": id, "content": output }));
            }
            // Earlier reasoning sent back with the outputs: never shown to the model.
            "reasoning" => {}
            "item_reference" => return Err(not_here(&at, "items cannot be referenced; send them in full.")),
            other => {
                return Err(GatewayError::invalid_request(
                    &format!("{at}.type"),
                    format!("Input item type `{}` is not supported.", tollgate::http::text::truncate(other, 64)),
                ));
            }
        }
    }
    Ok(())
}

fn message(
    obj: &Map<String, Value>,
    at: &str,
    caps: &ModelCaps,
    images: &mut ImageCount,
) -> Result<Value, GatewayError> {
    let role = required_str(obj, "role", &format!("{at}.role"))?;
    if !["user", "assistant", "system", "developer"].contains(&role) {
        return Err(GatewayError::invalid_request(
            &format!("{at}.role"),
            format!(
                "Role `{}` is not one of user, assistant, system, developer.",
                tollgate::http::text::truncate(role, 64)
            ),
        ));
    }
    let content = match given(obj, "content") {
        None => return Err(GatewayError::missing_field(&format!("{at}.content"))),
        Some(Value::String(s)) => Value::String(s.clone()),
        Some(Value::Array(parts)) => {
            let mut texts = Vec::new();
            let mut chat_parts = Vec::new();
            for (j, part) in parts.iter().enumerate() {
                let pat = format!("{at}.content[{j}]");
                let p =
                    part.as_object().ok_or_else(|| GatewayError::invalid_request(&pat, "must be a content part"))?;
                match required_str(p, "type", &format!("{pat}.type"))? {
                    "input_text" | "output_text" | "text" => {
                        let t = match given(p, "text") {
                            Some(Value::String(s)) => s.as_str(),
                            None => return Err(GatewayError::missing_field(&format!("{pat}.text"))),
                            Some(v) => {
                                return Err(GatewayError::invalid_request(
                                    &format!("{pat}.text"),
                                    format!("`text` must be a string, got {}.", kind(v)),
                                ));
                            }
                        };
                        texts.push(t.to_string());
                        chat_parts.push(json!({ "type": "text", "text": t }));
                    }
                    "input_image" => chat_parts.push(image(p, &pat, caps, images)?),
                    other => {
                        return Err(GatewayError::invalid_request(
                            &pat,
                            format!(
                                "Content part type `{}` is not supported.",
                                tollgate::http::text::truncate(other, 64)
                            ),
                        ));
                    }
                }
            }
            if texts.len() == chat_parts.len() { Value::String(texts.join(JOIN)) } else { Value::Array(chat_parts) }
        }
        Some(v) => {
            return Err(GatewayError::invalid_request(
                &format!("{at}.content"),
                format!("`content` must be a string or an array of parts, got {}.", kind(v)),
            ));
        }
    };
    Ok(json!({ "role": role, "content": content }))
}

fn image(p: &Map<String, Value>, at: &str, caps: &ModelCaps, images: &mut ImageCount) -> Result<Value, GatewayError> {
    if !caps.image_input {
        return Err(not_here("input", &format!("this model accepts text input only (`{at}` is an image).")));
    }
    let url = p.get("image_url").and_then(Value::as_str).unwrap_or("");
    if !url.starts_with("data:") {
        // Clarification 15: remote images (and file ids) are not fetched.
        return Err(not_here(at, "send the image inline as a data URL; remote images are not fetched."));
    }
    if parse_data_url(url).is_none() {
        return Err(GatewayError::invalid_request(
            at,
            format!(
                "The image is incomplete or undecodable: a base64 data URL of {} is expected.",
                MEDIA_TYPES.join(", ")
            ),
        ));
    }
    images.take(at)?;
    Ok(json!({ "type": "image_url", "image_url": { "url": url } }))
}

/// `text.format` (which wins, clarification 18) or `response_format`, as a chat format.
fn response_format(obj: &Map<String, Value>, caps: &ModelCaps) -> Result<Option<Value>, GatewayError> {
    let text_format = optional_object(obj, "text", "text")?.and_then(|t| given(t, "format"));
    let (param, format) = match (text_format, given(obj, "response_format")) {
        (Some(f), _) => ("text.format", f),
        (None, Some(f)) => ("response_format", f),
        (None, None) => return Ok(None),
    };
    let f = format.as_object().ok_or_else(|| {
        GatewayError::invalid_request(param, format!("`{param}` must be an object, got {}.", kind(format)))
    })?;
    let t = required_str(f, "type", &format!("{param}.type"))?;
    let chat = match (param, t) {
        (_, "text") => return Ok(Some(json!({ "type": "text" }))),
        (_, "json_object") => json!({ "type": "json_object" }),
        ("response_format", "json_schema") => format.clone(),
        (_, "json_schema") => {
            // The Responses form is flat; chat nests it under `json_schema`.
            let mut schema = Map::new();
            schema.insert("name".into(), f.get("name").cloned().unwrap_or_else(|| json!("output")));
            for key in ["schema", "strict", "description"] {
                if let Some(v) = given(f, key) {
                    schema.insert(key.into(), v.clone());
                }
            }
            json!({ "type": "json_schema", "json_schema": schema })
        }
        (_, other) => {
            return Err(GatewayError::invalid_request(
                &format!("{param}.type"),
                format!(
                    "Format type `{}` is not one of text, json_object, json_schema.",
                    tollgate::http::text::truncate(other, 64)
                ),
            ));
        }
    };
    if !caps.json_mode {
        return Err(GatewayError::new(
            ErrorKind::HostedCapabilityNotSupported,
            "This model does not accept a JSON format.",
        )
        .with_param(param));
    }
    Ok(Some(chat))
}

/// Function tools in chat form (the flat Responses form is nested); hosted tools refused.
fn tools(obj: &Map<String, Value>, caps: &ModelCaps) -> Result<Option<Value>, GatewayError> {
    let list = match given(obj, "tools") {
        None => return Ok(None),
        Some(Value::Array(list)) if list.is_empty() => return Ok(None),
        Some(Value::Array(list)) => list,
        Some(v) => {
            return Err(GatewayError::invalid_request("tools", format!("`tools` must be an array, got {}.", kind(v))));
        }
    };
    if !caps.tool_calling {
        return Err(GatewayError::new(ErrorKind::HostedCapabilityNotSupported, "This model does not accept tools.")
            .with_param("tools"));
    }
    let mut out = Vec::with_capacity(list.len());
    for (i, tool) in list.iter().enumerate() {
        let at = format!("tools[{i}]");
        let t =
            tool.as_object().ok_or_else(|| GatewayError::invalid_request(&at, format!("`{at}` must be an object.")))?;
        let ty = required_str(t, "type", &format!("{at}.type"))?;
        if ty != "function" {
            return Err(not_here(
                &format!("{at}.type"),
                &format!(
                    "`{}` is a hosted tool; only function tools run here.",
                    tollgate::http::text::truncate(ty, 64)
                ),
            ));
        }
        if t.get("function").is_some_and(Value::is_object) {
            out.push(tool.clone());
            continue;
        }
        let mut function = Map::new();
        function.insert("name".into(), json!(required_str(t, "name", &format!("{at}.name"))?));
        for key in ["description", "parameters", "strict"] {
            if let Some(v) = given(t, key) {
                function.insert(key.into(), v.clone());
            }
        }
        out.push(json!({ "type": "function", "function": function }));
    }
    Ok(Some(Value::Array(out)))
}

fn tool_choice(c: &Value) -> Result<Value, GatewayError> {
    let Some(obj) = c.as_object() else { return Ok(c.clone()) };
    match obj.get("type").and_then(Value::as_str) {
        Some("function") if obj.get("function").is_some() => Ok(c.clone()),
        Some("function") => {
            Ok(json!({ "type": "function", "function": { "name": required_str(obj, "name", "tool_choice.name")? } }))
        }
        Some(other) => Err(not_here(
            "tool_choice.type",
            &format!("`{}` names a hosted tool.", tollgate::http::text::truncate(other, 64)),
        )),
        None => Err(GatewayError::missing_field("tool_choice.type")),
    }
}
