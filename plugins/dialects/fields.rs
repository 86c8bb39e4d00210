//! Typed reads of request fields that fail with the catalogue's refusals, so every
//! translator names the offending field the same way (`param` is the dotted path with
//! 0-based indexes, clarification 15).

use serde_json::{Map, Value};

use tollgate::http::error::GatewayError;

/// The field, or `None` when it is absent or `null` (both mean "not given").
pub fn given<'a>(obj: &'a Map<String, Value>, key: &str) -> Option<&'a Value> {
    obj.get(key).filter(|v| !v.is_null())
}

/// What a JSON value is, for messages ("got a number").
pub fn kind(v: &Value) -> &'static str {
    match v {
        Value::Null => "null",
        Value::Bool(_) => "a boolean",
        Value::Number(_) => "a number",
        Value::String(_) => "a string",
        Value::Array(_) => "an array",
        Value::Object(_) => "an object",
    }
}

/// A required non-empty string.
pub fn required_str<'a>(obj: &'a Map<String, Value>, key: &str, param: &str) -> Result<&'a str, GatewayError> {
    match given(obj, key) {
        None => Err(GatewayError::missing_field(param)),
        Some(Value::String(s)) if !s.is_empty() => Ok(s),
        Some(v) => {
            Err(GatewayError::invalid_request(param, format!("`{param}` must be a non-empty string, got {}.", kind(v))))
        }
    }
}

/// An optional string.
pub fn optional_str<'a>(obj: &'a Map<String, Value>, key: &str, param: &str) -> Result<Option<&'a str>, GatewayError> {
    match given(obj, key) {
        None => Ok(None),
        Some(Value::String(s)) => Ok(Some(s)),
        Some(v) => Err(GatewayError::invalid_request(param, format!("`{param}` must be a string, got {}.", kind(v)))),
    }
}

/// An optional boolean.
pub fn optional_bool(obj: &Map<String, Value>, key: &str, param: &str) -> Result<Option<bool>, GatewayError> {
    match given(obj, key) {
        None => Ok(None),
        Some(Value::Bool(b)) => Ok(Some(*b)),
        Some(v) => Err(GatewayError::invalid_request(param, format!("`{param}` must be a boolean, got {}.", kind(v)))),
    }
}

/// An optional integer of at least 1 (`0`, negatives and fractions are refused).
pub fn optional_positive(obj: &Map<String, Value>, key: &str, param: &str) -> Result<Option<u64>, GatewayError> {
    match given(obj, key) {
        None => Ok(None),
        Some(v) => match v.as_u64() {
            Some(n) if n >= 1 => Ok(Some(n)),
            _ => Err(GatewayError::invalid_request(param, format!("`{param}` must be an integer of at least 1."))),
        },
    }
}

/// An optional object.
pub fn optional_object<'a>(
    obj: &'a Map<String, Value>,
    key: &str,
    param: &str,
) -> Result<Option<&'a Map<String, Value>>, GatewayError> {
    match given(obj, key) {
        None => Ok(None),
        Some(Value::Object(o)) => Ok(Some(o)),
        Some(v) => Err(GatewayError::invalid_request(param, format!("`{param}` must be an object, got {}.", kind(v)))),
    }
}

/// The whole body as an object.
pub fn body_object(body: &Value) -> Result<&Map<String, Value>, GatewayError> {
    body.as_object().ok_or_else(|| {
        GatewayError::new(
            tollgate::http::error::ErrorKind::InvalidRequest,
            format!("The request body must be a JSON object, got {}.", kind(body)),
        )
    })
}
