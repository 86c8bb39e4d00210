//! `system` and `messages[]` of a messages-dialect request as chat messages.
//!
//! Consecutive same-role messages merge into one turn (spec "POST /v1/messages"); a turn is
//! then translated as a whole, so a user turn's `tool_result` blocks become chat `tool`
//! messages placed first, right after the assistant's tool calls as chat templates expect,
//! followed by one `user` message with the rest. Every refusal names the original message
//! and block by index (clarification 15), not the merged position.

use std::collections::HashSet;

use serde_json::{Map, Value, json};

use super::caps::ModelCaps;
use super::fields::{given, kind, optional_bool, required_str};
use super::images::{ImageCount, MEDIA_TYPES, is_base64};
use tollgate::http::error::{ErrorKind, GatewayError};

/// Text blocks of one turn are joined with a blank line, as the chat path joins merged
/// system messages (spec rule 6).
const JOIN: &str = "\n\n";

#[derive(Clone, Copy, PartialEq, Eq)]
enum Role {
    System,
    User,
    Assistant,
}

/// One block with the path it is reported under.
struct Block<'a> {
    /// `None` for string content (an implicit text block).
    obj: Option<&'a Map<String, Value>>,
    text: &'a str,
    param: String,
}

impl Block<'_> {
    fn kind(&self) -> &str {
        self.obj.and_then(|o| o.get("type")).and_then(Value::as_str).unwrap_or("text")
    }
}

struct Turn<'a> {
    role: Role,
    blocks: Vec<Block<'a>>,
}

enum Part {
    Text(String),
    Image(Value),
}

/// State carried across turns.
struct BlockCheck<'c> {
    caps: &'c ModelCaps,
    images: ImageCount,
    /// `tool_use` ids seen so far: a `tool_result` must answer one of them.
    tool_use_ids: HashSet<String>,
}

/// The top-level `system` (string or text blocks) as a leading chat system message.
pub fn system_message(system: Option<&Value>) -> Result<Option<Value>, GatewayError> {
    let text = match system {
        None | Some(Value::Null) => return Ok(None),
        Some(Value::String(s)) => s.clone(),
        Some(Value::Array(items)) => {
            let mut texts = Vec::with_capacity(items.len());
            for (k, item) in items.iter().enumerate() {
                texts.push(text_block(item, &format!("system[{k}]"))?);
            }
            texts.join(JOIN)
        }
        Some(v) => {
            return Err(GatewayError::invalid_request(
                "system",
                format!("`system` must be a string or an array of text blocks, got {}.", kind(v)),
            ));
        }
    };
    Ok((!text.is_empty()).then(|| json!({ "role": "system", "content": text })))
}

/// The text of a `{type: text, text}` block (`cache_control` and other keys ignored).
fn text_block(item: &Value, param: &str) -> Result<String, GatewayError> {
    let obj = item
        .as_object()
        .ok_or_else(|| GatewayError::invalid_request(param, format!("`{param}` must be a text block object.")))?;
    match required_str(obj, "type", &format!("{param}.type"))? {
        "text" => text_of(obj, param),
        other => {
            Err(GatewayError::invalid_request(param, format!("Only text blocks are accepted here, got `{other}`.")))
        }
    }
}

fn text_of(obj: &Map<String, Value>, param: &str) -> Result<String, GatewayError> {
    match given(obj, "text") {
        Some(Value::String(s)) => Ok(s.clone()),
        None => Err(GatewayError::missing_field(&format!("{param}.text"))),
        Some(v) => {
            Err(GatewayError::invalid_request(&format!("{param}.text"), format!("must be a string, got {}.", kind(v))))
        }
    }
}

/// `messages[]` as chat messages.
pub fn translate(messages: Option<&Value>, caps: &ModelCaps) -> Result<Vec<Value>, GatewayError> {
    let list = match messages {
        None | Some(Value::Null) => return Err(GatewayError::missing_field("messages")),
        Some(Value::Array(list)) => list,
        Some(v) => {
            return Err(GatewayError::invalid_request(
                "messages",
                format!("`messages` must be an array, got {}.", kind(v)),
            ));
        }
    };
    let mut turns: Vec<Turn<'_>> = Vec::new();
    for (i, m) in list.iter().enumerate() {
        let (role, blocks) = read_message(m, i)?;
        match turns.last_mut() {
            Some(t) if t.role == role => t.blocks.extend(blocks),
            _ => turns.push(Turn { role, blocks }),
        }
    }
    if !turns.iter().any(|t| t.role != Role::System) {
        return Err(GatewayError::invalid_request(
            "messages",
            "`messages` needs at least one user or assistant message.",
        ));
    }
    let mut check = BlockCheck { caps, images: ImageCount::default(), tool_use_ids: HashSet::new() };
    let mut out = Vec::with_capacity(turns.len() + 2);
    for turn in turns {
        match turn.role {
            Role::System => out.push(system_turn(&turn)?),
            Role::User => user_turn(&mut check, &turn, &mut out)?,
            Role::Assistant => out.push(assistant_turn(&mut check, &turn)?),
        }
    }
    Ok(out)
}

fn read_message(m: &Value, i: usize) -> Result<(Role, Vec<Block<'_>>), GatewayError> {
    let at = format!("messages[{i}]");
    let obj = m.as_object().ok_or_else(|| GatewayError::invalid_request(&at, format!("`{at}` must be an object.")))?;
    let role = match required_str(obj, "role", &format!("{at}.role"))? {
        "user" => Role::User,
        "assistant" => Role::Assistant,
        "system" => Role::System,
        other => {
            return Err(GatewayError::invalid_request(
                &format!("{at}.role"),
                format!("Role `{}` is not one of user, assistant, system.", tollgate::http::text::truncate(other, 64)),
            ));
        }
    };
    let param = format!("{at}.content");
    let blocks = match given(obj, "content") {
        None => return Err(GatewayError::missing_field(&param)),
        Some(Value::String(s)) => vec![Block { obj: None, text: s, param }],
        Some(Value::Array(items)) => {
            let mut blocks = Vec::with_capacity(items.len());
            for (j, item) in items.iter().enumerate() {
                let param = format!("{param}[{j}]");
                let obj = item.as_object().ok_or_else(|| {
                    GatewayError::invalid_request(&param, format!("`{param}` must be a content block."))
                })?;
                required_str(obj, "type", &format!("{param}.type"))?;
                blocks.push(Block { obj: Some(obj), text: "", param });
            }
            blocks
        }
        Some(v) => {
            return Err(GatewayError::invalid_request(
                &param,
                format!("`{param}` must be a string or an array of content blocks, got {}.", kind(v)),
            ));
        }
    };
    if role == Role::User {
        // Spec: tool_result blocks come before the other blocks of that user message.
        let mut other_seen = false;
        for b in &blocks {
            if b.kind() != "tool_result" {
                other_seen = true;
            } else if other_seen {
                return Err(GatewayError::invalid_request(
                    &b.param,
                    "`tool_result` blocks must come before any other block of the user message.",
                ));
            }
        }
    }
    Ok((role, blocks))
}

fn system_turn(turn: &Turn<'_>) -> Result<Value, GatewayError> {
    let mut texts = Vec::with_capacity(turn.blocks.len());
    for b in &turn.blocks {
        match b.obj {
            None => texts.push(b.text.to_string()),
            Some(o) if b.kind() == "text" => texts.push(text_of(o, &b.param)?),
            Some(_) => return Err(wrong_place(b, "system messages hold text blocks only")),
        }
    }
    Ok(json!({ "role": "system", "content": texts.join(JOIN) }))
}

fn user_turn(check: &mut BlockCheck<'_>, turn: &Turn<'_>, out: &mut Vec<Value>) -> Result<(), GatewayError> {
    let mut parts = Vec::new();
    let mut carried = Vec::new();
    let mut tool_messages = 0;
    for b in &turn.blocks {
        let Some(o) = b.obj else {
            parts.push(Part::Text(b.text.to_string()));
            continue;
        };
        match b.kind() {
            "text" => parts.push(Part::Text(text_of(o, &b.param)?)),
            "image" => parts.push(Part::Image(check.image(o, &b.param)?)),
            "tool_result" => {
                out.push(check.tool_result(o, &b.param, &mut carried)?);
                tool_messages += 1;
            }
            "tool_use" | "thinking" | "redacted_thinking" => {
                return Err(wrong_place(b, "this block is only accepted in assistant messages"));
            }
            other => return Err(unsupported(&b.param, other)),
        }
    }
    // Chat tool messages hold text only: images of tool results follow in the user message.
    carried.extend(parts);
    if !carried.is_empty() || tool_messages == 0 {
        out.push(json!({ "role": "user", "content": content(carried) }));
    }
    Ok(())
}

fn assistant_turn(check: &mut BlockCheck<'_>, turn: &Turn<'_>) -> Result<Value, GatewayError> {
    let mut texts = Vec::new();
    let mut calls = Vec::new();
    for b in &turn.blocks {
        let Some(o) = b.obj else {
            texts.push(b.text.to_string());
            continue;
        };
        match b.kind() {
            "text" => texts.push(text_of(o, &b.param)?),
            "tool_use" => calls.push(check.tool_use(o, &b.param)?),
            // Prior reasoning is accepted with any signature and never reaches the model.
            "thinking" | "redacted_thinking" => {}
            "image" | "tool_result" => return Err(wrong_place(b, "this block is only accepted in user messages")),
            other => return Err(unsupported(&b.param, other)),
        }
    }
    let content = if texts.is_empty() && !calls.is_empty() { Value::Null } else { Value::String(texts.join(JOIN)) };
    let mut msg = json!({ "role": "assistant", "content": content });
    if !calls.is_empty() {
        msg["tool_calls"] = Value::Array(calls);
    }
    Ok(msg)
}

impl BlockCheck<'_> {
    fn image(&mut self, o: &Map<String, Value>, param: &str) -> Result<Value, GatewayError> {
        if !self.caps.image_input {
            return Err(GatewayError::new(
                ErrorKind::HostedParameterNotSupported,
                format!("This model accepts text input only; `{param}` is an image block. Remove it."),
            )
            .with_param("messages"));
        }
        let bad = |why: &str| GatewayError::invalid_request(param, format!("Image block `{param}`: {why}"));
        let source = o.get("source").and_then(Value::as_object).ok_or_else(|| bad("`source` object is missing."))?;
        match source.get("type").and_then(Value::as_str) {
            Some("base64") => {}
            Some(t @ ("url" | "file")) => {
                return Err(bad(&format!("`{t}` sources are not supported; send the image inline as base64.")));
            }
            _ => return Err(bad("`source.type` must be `base64`.")),
        }
        let media = source.get("media_type").and_then(Value::as_str).unwrap_or("");
        if !MEDIA_TYPES.contains(&media) {
            return Err(bad(&format!("`source.media_type` must be one of {}.", MEDIA_TYPES.join(", "))));
        }
        let data = source.get("data").and_then(Value::as_str).unwrap_or("");
        if !is_base64(data) {
            return Err(bad("`source.data` is not complete base64 data."));
        }
        self.images.take(param)?;
        Ok(json!({ "type": "image_url", "image_url": { "url": format!("data:{media};base64,{data}") } }))
    }

    fn tool_use(&mut self, o: &Map<String, Value>, param: &str) -> Result<Value, GatewayError> {
        let id = required_str(o, "id", &format!("{param}.id"))?;
        let name = required_str(o, "name", &format!("{param}.name"))?;
        let input = match given(o, "input") {
            None => Value::Object(Map::new()),
            Some(v @ Value::Object(_)) => v.clone(),
            Some(v) => {
                return Err(GatewayError::invalid_request(
                    &format!("{param}.input"),
                    format!("`input` must be an object, got {}.", kind(v)),
                ));
            }
        };
        self.tool_use_ids.insert(id.to_string());
        Ok(json!({ "id": id, "type": "function", "function": { "name": name, "arguments": input.to_string() } }))
    }

    fn tool_result(
        &mut self,
        o: &Map<String, Value>,
        param: &str,
        carried: &mut Vec<Part>,
    ) -> Result<Value, GatewayError> {
        let id_param = format!("{param}.tool_use_id");
        let id = required_str(o, "tool_use_id", &id_param)?;
        if !self.tool_use_ids.contains(id) {
            return Err(GatewayError::invalid_request(
                &id_param,
                format!(
                    "`tool_use_id` `{}` matches no earlier tool_use block.",
                    tollgate::http::text::truncate(id, 64)
                ),
            ));
        }
        let is_error = optional_bool(o, "is_error", &format!("{param}.is_error"))?.unwrap_or(false);
        let text = match given(o, "content") {
            None => String::new(),
            Some(Value::String(s)) => s.clone(),
            Some(Value::Array(items)) => {
                let mut texts = Vec::new();
                for (k, item) in items.iter().enumerate() {
                    let at = format!("{param}.content[{k}]");
                    match item.as_object() {
                        Some(io) if io.get("type").and_then(Value::as_str) == Some("text") => {
                            texts.push(text_of(io, &at)?);
                        }
                        Some(io) if io.get("type").and_then(Value::as_str) == Some("image") => {
                            carried.push(Part::Image(self.image(io, &at)?));
                        }
                        _ => {
                            return Err(GatewayError::invalid_request(
                                &at,
                                "`tool_result` content holds text and image blocks only.",
                            ));
                        }
                    }
                }
                texts.join(JOIN)
            }
            Some(v) => {
                return Err(GatewayError::invalid_request(
                    &format!("{param}.content"),
                    format!("`content` must be a string or an array of blocks, got {}.", kind(v)),
                ));
            }
        };
        // Chat has no error flag on tool messages: the model reads it from the text.
        let text = match (is_error, text.is_empty()) {
            (false, _) => text,
            (true, true) => "Error".to_string(),
            (true, false) => format!("Error: {text}"),
        };
        Ok(json!({ "role": "tool", "tool_call_id": id, "content": text }))
    }
}

fn content(parts: Vec<Part>) -> Value {
    if parts.iter().all(|p| matches!(p, Part::Text(_))) {
        let texts: Vec<String> =
            parts.into_iter().filter_map(|p| if let Part::Text(t) = p { Some(t) } else { None }).collect();
        return Value::String(texts.join(JOIN));
    }
    Value::Array(
        parts
            .into_iter()
            .map(|p| match p {
                Part::Text(t) => json!({ "type": "text", "text": t }),
                Part::Image(v) => v,
            })
            .collect(),
    )
}

fn wrong_place(b: &Block<'_>, why: &str) -> GatewayError {
    GatewayError::invalid_request(&b.param, format!("Block type `{}` is not accepted here: {why}.", b.kind()))
}

fn unsupported(param: &str, block_type: &str) -> GatewayError {
    let t = tollgate::http::text::truncate(block_type, 64);
    let hint = if t == "document" { "; send the document's text as a text block" } else { "" };
    GatewayError::invalid_request(param, format!("Content block type `{t}` is not supported{hint}."))
}
