//! `tools` and `tool_choice` of a messages-dialect request as chat function tools.
//!
//! Only client tools exist on the chat path: a tool with a vendor `type` (bash, text
//! editor, web search, computer use and the like) would need the vendor to run it, so it is
//! refused by name rather than silently dropped.

use serde_json::{Map, Value, json};

use super::caps::ModelCaps;
use super::fields::{given, kind, optional_bool, optional_str, required_str};
use tollgate::http::error::{ErrorKind, GatewayError};

/// The chat `tools` and the names they declare.
pub struct Tools {
    /// `None` when no tool was given (an empty list is not forwarded).
    pub tools: Option<Value>,
    pub names: Vec<String>,
}

/// The chat `tool_choice` and `parallel_tool_calls`.
#[derive(Debug, Default, PartialEq)]
pub struct Choice {
    pub tool_choice: Option<Value>,
    pub parallel_tool_calls: Option<bool>,
}

pub fn tools(v: Option<&Value>, caps: &ModelCaps) -> Result<Tools, GatewayError> {
    let list = match v {
        None | Some(Value::Null) => return Ok(Tools { tools: None, names: Vec::new() }),
        Some(Value::Array(list)) => list,
        Some(v) => {
            return Err(GatewayError::invalid_request("tools", format!("`tools` must be an array, got {}.", kind(v))));
        }
    };
    if list.is_empty() {
        return Ok(Tools { tools: None, names: Vec::new() });
    }
    if !caps.tool_calling {
        return Err(GatewayError::new(ErrorKind::HostedCapabilityNotSupported, "This model does not accept tools.")
            .with_param("tools"));
    }
    let mut out = Vec::with_capacity(list.len());
    let mut names = Vec::with_capacity(list.len());
    for (i, tool) in list.iter().enumerate() {
        let at = format!("tools[{i}]");
        let obj =
            tool.as_object().ok_or_else(|| GatewayError::invalid_request(&at, format!("`{at}` must be an object.")))?;
        if let Some(t) = optional_str(obj, "type", &format!("{at}.type"))? {
            if t != "custom" {
                return Err(GatewayError::invalid_request(
                    &format!("{at}.type"),
                    format!(
                        "Tool type `{}` is a vendor server tool and is not supported; declare client tools \
                         with `name`, `description` and `input_schema`.",
                        tollgate::http::text::truncate(t, 64)
                    ),
                ));
            }
        }
        let name = required_str(obj, "name", &format!("{at}.name"))?;
        let schema = match given(obj, "input_schema") {
            None => return Err(GatewayError::missing_field(&format!("{at}.input_schema"))),
            Some(s @ Value::Object(_)) => s.clone(),
            Some(v) => {
                return Err(GatewayError::invalid_request(
                    &format!("{at}.input_schema"),
                    format!("`input_schema` must be a JSON Schema object, got {}.", kind(v)),
                ));
            }
        };
        // `strict`, `defer_loading`, `cache_control`, `input_examples`: accepted, ignored.
        let mut function = Map::new();
        function.insert("name".into(), json!(name));
        if let Some(d) = optional_str(obj, "description", &format!("{at}.description"))? {
            function.insert("description".into(), json!(d));
        }
        function.insert("parameters".into(), schema);
        out.push(json!({ "type": "function", "function": function }));
        names.push(name.to_string());
    }
    Ok(Tools { tools: Some(Value::Array(out)), names })
}

pub fn tool_choice(v: Option<&Value>, names: &[String], caps: &ModelCaps) -> Result<Choice, GatewayError> {
    let Some(v) = v.filter(|v| !v.is_null()) else {
        return Ok(Choice::default());
    };
    let obj = v.as_object().ok_or_else(|| {
        GatewayError::invalid_request("tool_choice", format!("`tool_choice` must be an object, got {}.", kind(v)))
    })?;
    let parallel = optional_bool(obj, "disable_parallel_tool_use", "tool_choice.disable_parallel_tool_use")?
        .and_then(|disable| disable.then_some(false));
    let choice = match required_str(obj, "type", "tool_choice.type")? {
        "auto" => json!("auto"),
        "none" => json!("none"),
        "any" => json!("required"),
        "tool" => {
            let name = required_str(obj, "name", "tool_choice.name")?;
            if !names.iter().any(|n| n == name) {
                return Err(GatewayError::invalid_request(
                    "tool_choice.name",
                    format!(
                        "`tool_choice.name` `{}` names no tool in `tools`.",
                        tollgate::http::text::truncate(name, 64)
                    ),
                ));
            }
            json!({ "type": "function", "function": { "name": name } })
        }
        other => {
            return Err(GatewayError::invalid_request(
                "tool_choice.type",
                format!(
                    "`tool_choice.type` `{}` is not one of auto, none, tool, any.",
                    tollgate::http::text::truncate(other, 64)
                ),
            ));
        }
    };
    if names.is_empty() {
        // Without tools, `auto` and `none` say nothing; forcing a call cannot be met.
        if choice == "auto" || choice == "none" {
            return Ok(Choice::default());
        }
        return Err(GatewayError::invalid_request(
            "tool_choice",
            "`tool_choice` forces a tool call but `tools` is empty.",
        ));
    }
    if choice == "required" && names.len() > 1 && caps.forced_tool_calling_limited {
        // Spec (messages request table): `any` with several tools is refused on models
        // limited in forced tool calling; one named tool, or a single tool, still works.
        return Err(GatewayError::new(
            ErrorKind::HostedCapabilityNotSupported,
            "This model cannot be forced to choose among several tools; name one with \
             `{\"type\": \"tool\", \"name\": ...}` or use `auto`.",
        )
        .with_param("tool_choice"));
    }
    Ok(Choice { tool_choice: Some(choice), parallel_tool_calls: parallel })
}
