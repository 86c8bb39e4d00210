//! Rules 9 and 10: reasoning efforts a model refuses outright, and JSON formats on models
//! that cannot enforce them while reasoning (catalog `refused_efforts`,
//! `json_format_effort`, `json_format_refused_efforts`).

use serde_json::{Map, Value};

use tollgate::config::ChatRules;
use tollgate::http::error::{ErrorKind, GatewayError};

/// Response header naming the effort put in place of an omitted one (rule 9).
pub const APPLIED_HEADER: &str = "x-service-reasoning-effort-applied";

fn not_supported(param: &str, message: String) -> GatewayError {
    GatewayError::new(ErrorKind::HostedParameterNotSupported, message).with_param(param)
}

/// Check `reasoning_effort` against the model's rules, filling it in where rule 9 asks;
/// returns the effort applied in place of an omitted one.
pub fn apply(
    body: &mut Map<String, Value>,
    rules: &ChatRules,
    json_format: bool,
) -> Result<Option<String>, GatewayError> {
    let effort = match body.get("reasoning_effort") {
        None | Some(Value::Null) => None,
        Some(Value::String(s)) => Some(s.as_str()),
        Some(_) => {
            return Err(GatewayError::invalid_request("reasoning_effort", "`reasoning_effort` must be a string."));
        }
    };
    match effort {
        Some(e) if rules.refused_efforts.iter().any(|r| r == e) => Err(not_supported(
            "reasoning_effort",
            format!("This model does not accept `reasoning_effort: {e}`; choose another effort or omit it."),
        )),
        Some(e) if json_format && rules.json_format_refused_efforts.iter().any(|r| r == e) => {
            let use_instead = rules.json_format_effort.as_deref().unwrap_or("low");
            Err(not_supported(
                "response_format",
                format!(
                    "This model cannot enforce a JSON format with `reasoning_effort: {e}`; use `reasoning_effort: {use_instead}` or drop the format."
                ),
            ))
        }
        None if json_format => {
            let Some(sub) = rules.json_format_effort.clone() else { return Ok(None) };
            body.insert("reasoning_effort".into(), Value::String(sub.clone()));
            Ok(Some(sub))
        }
        _ => Ok(None),
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use serde_json::json;

    fn rules() -> ChatRules {
        ChatRules {
            json_format_effort: Some("none".into()),
            json_format_refused_efforts: vec!["high".into(), "medium".into()],
            refused_efforts: vec!["minimal".into()],
            ..ChatRules::default()
        }
    }

    fn run(body: Value, json_format: bool) -> (Result<Option<String>, GatewayError>, Value) {
        let mut b = body.as_object().cloned().unwrap_or_default();
        let r = apply(&mut b, &rules(), json_format);
        (r, Value::Object(b))
    }

    #[test]
    fn an_omitted_effort_is_substituted_beside_a_json_format() {
        let (r, body) = run(json!({}), true);
        assert_eq!(r.ok().flatten().as_deref(), Some("none"));
        assert_eq!(body["reasoning_effort"], "none");
        let (r, body) = run(json!({}), false);
        assert_eq!(r.ok().flatten(), None, "no JSON format, nothing substituted");
        assert!(body.get("reasoning_effort").is_none());
        let (r, _) = run(json!({"reasoning_effort": "low"}), true);
        assert_eq!(r.ok().flatten(), None, "a compatible explicit effort is kept");
    }

    #[test]
    fn an_incompatible_effort_beside_a_json_format_names_the_one_to_use() {
        let (r, _) = run(json!({"reasoning_effort": "high"}), true);
        let e = r.err();
        assert_eq!(e.as_ref().and_then(|e| e.param.as_deref()), Some("response_format"));
        assert!(e.is_some_and(|e| e.message.contains("reasoning_effort: none")));
        assert!(run(json!({"reasoning_effort": "high"}), false).0.is_ok());
    }

    #[test]
    fn refused_efforts_name_reasoning_effort() {
        let (r, _) = run(json!({"reasoning_effort": "minimal"}), false);
        let e = r.err();
        assert_eq!(
            e.map(|e| (e.kind, e.param)),
            Some((ErrorKind::HostedParameterNotSupported, Some("reasoning_effort".into())))
        );
        assert_eq!(run(json!({"reasoning_effort": 3}), false).0.err().map(|e| e.kind), Some(ErrorKind::InvalidRequest));
        let plain = ChatRules::default();
        let mut b = Map::new();
        assert_eq!(apply(&mut b, &plain, true).ok().flatten(), None, "models without rules change nothing");
    }
}
