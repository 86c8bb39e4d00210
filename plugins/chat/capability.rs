//! Rule 5: a capability the model lacks (catalog `tool_calling`, `json_mode`) is
//! `400 hosted_capability_not_supported` naming the field. Image parts are rule 8's
//! (`images.rs`). A field that asks for nothing (`tools: []`, `tool_choice: "none"`,
//! `response_format: {type: text}`) is never refused (decisions.md 59).

use serde_json::{Map, Value};

use tollgate::config::ModelEntry;
use tollgate::http::error::{ErrorKind, GatewayError};

fn lacking(param: &str, what: &str) -> GatewayError {
    GatewayError::new(
        ErrorKind::HostedCapabilityNotSupported,
        format!("This model does not support {what}; remove `{param}`."),
    )
    .with_param(param)
}

/// Check the capability fields; returns whether a JSON `response_format` was asked for.
pub fn check(body: &Map<String, Value>, model: &ModelEntry) -> Result<bool, GatewayError> {
    for field in ["tools", "functions"] {
        match body.get(field) {
            None | Some(Value::Null) => {}
            Some(Value::Array(list)) if list.is_empty() || model.tool_calling => {}
            Some(Value::Array(_)) => return Err(lacking(field, "tool calling")),
            Some(_) => return Err(GatewayError::invalid_request(field, format!("`{field}` must be an array."))),
        }
    }
    for field in ["tool_choice", "function_call"] {
        match body.get(field) {
            None | Some(Value::Null) => {}
            Some(Value::String(s)) if s == "none" => {}
            Some(_) if model.tool_calling => {}
            Some(_) => return Err(lacking(field, "tool calling")),
        }
    }
    json_format(body, model)
}

fn json_format(body: &Map<String, Value>, model: &ModelEntry) -> Result<bool, GatewayError> {
    let format = match body.get("response_format") {
        None | Some(Value::Null) => return Ok(false),
        Some(Value::Object(f)) => f,
        Some(_) => {
            return Err(GatewayError::invalid_request("response_format", "`response_format` must be an object."));
        }
    };
    match format.get("type").and_then(Value::as_str) {
        Some("text") => Ok(false),
        Some("json_object" | "json_schema") if model.json_mode => Ok(true),
        Some("json_object" | "json_schema") => Err(lacking("response_format", "JSON output formats")),
        _ => Err(GatewayError::invalid_request(
            "response_format.type",
            "`response_format.type` must be `text`, `json_object` or `json_schema`.",
        )),
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use serde_json::json;

    fn model(tool_calling: bool, json_mode: bool) -> ModelEntry {
        let dir = std::env::temp_dir().join(format!("tollgate-cap-{}", uuid::Uuid::new_v4().simple()));
        let _ = std::fs::create_dir_all(&dir);
        let yaml = format!(
            "models:\n  - id: m\n    supported_endpoints: [chat_completions]\n    tool_calling: {tool_calling}\n    json_mode: {json_mode}\n"
        );
        let _ = std::fs::write(dir.join("tollgate.yaml"), "threads: 1\n");
        let _ = std::fs::write(dir.join("models.yaml"), yaml);
        let _ = std::fs::write(dir.join("upstreams.yaml"), "pools: {}\n");
        let config = tollgate::config::load(&dir.join("tollgate.yaml"));
        let _ = std::fs::remove_dir_all(&dir);
        match config.map(|c| c.catalog.models.into_iter().next()) {
            Ok(Some(m)) => std::sync::Arc::try_unwrap(m).unwrap_or_else(|_| panic!("shared")),
            _ => panic!("fixture catalog"),
        }
    }

    fn param(body: Value, m: &ModelEntry) -> Option<String> {
        let r = check(body.as_object().unwrap_or(&Map::new()), m);
        r.err().map(|e| {
            assert_eq!(e.kind, ErrorKind::HostedCapabilityNotSupported, "{}", e.message);
            e.param.unwrap_or_default()
        })
    }

    #[test]
    fn tools_need_tool_calling() {
        let plain = model(false, false);
        let tool = json!([{"type": "function", "function": {"name": "f"}}]);
        assert_eq!(param(json!({"tools": tool}), &plain), Some("tools".into()));
        assert_eq!(param(json!({"tool_choice": "auto"}), &plain), Some("tool_choice".into()));
        assert_eq!(param(json!({"functions": tool}), &plain), Some("functions".into()));
        assert_eq!(param(json!({"tools": [], "tool_choice": "none"}), &plain), None, "asks for nothing");
        assert_eq!(param(json!({"tools": tool, "tool_choice": "auto"}), &model(true, false)), None);
    }

    #[test]
    fn json_formats_need_json_mode_and_text_is_never_refused() {
        let plain = model(false, false);
        assert_eq!(param(json!({"response_format": {"type": "json_object"}}), &plain), Some("response_format".into()));
        assert_eq!(param(json!({"response_format": {"type": "json_schema"}}), &plain), Some("response_format".into()));
        assert_eq!(param(json!({"response_format": {"type": "text"}}), &plain), None);
        let json = model(false, true);
        assert_eq!(
            check(json!({"response_format": {"type": "json_object"}}).as_object().unwrap_or(&Map::new()), &json).ok(),
            Some(true)
        );
        let bad = check(json!({"response_format": {"type": "xml"}}).as_object().unwrap_or(&Map::new()), &json);
        assert_eq!(bad.err().and_then(|e| e.param), Some("response_format.type".into()));
    }
}
