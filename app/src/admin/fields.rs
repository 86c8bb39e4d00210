//! Field validation for admin request bodies: each problem is a 400 naming the field.

use serde_json::{Map, Value};

use super::AdminError;

/// A JSON object body whose fields are checked one by one; unknown fields are refused.
pub struct Fields<'a> {
    obj: &'a Map<String, Value>,
}

impl<'a> Fields<'a> {
    pub fn new(body: &'a Value, allowed: &[&str]) -> Result<Fields<'a>, AdminError> {
        let obj = body.as_object().ok_or_else(|| AdminError::bad("body", "the body must be a JSON object"))?;
        if let Some(unknown) = obj.keys().find(|k| !allowed.contains(&k.as_str())) {
            return Err(AdminError::bad(unknown, &format!("unknown field; allowed: {}", allowed.join(", "))));
        }
        Ok(Fields { obj })
    }

    /// A call that takes no fields: no body, or an empty object (decision 22 for these too).
    pub fn none(body: &Value) -> Result<(), AdminError> {
        match body {
            Value::Null => Ok(()),
            Value::Object(o) => match o.keys().next() {
                None => Ok(()),
                Some(unknown) => Err(AdminError::bad(unknown, "unknown field; this call takes no fields")),
            },
            _ => Err(AdminError::bad("body", "the body must be a JSON object")),
        }
    }

    fn get(&self, name: &str) -> Option<&'a Value> {
        self.obj.get(name).filter(|v| !v.is_null())
    }

    pub fn str(&self, name: &str, max: usize) -> Result<Option<&'a str>, AdminError> {
        match self.get(name) {
            None => Ok(None),
            Some(Value::String(s)) if !s.trim().is_empty() && s.len() <= max && !s.chars().any(char::is_control) => {
                Ok(Some(s))
            }
            Some(_) => Err(AdminError::bad(name, &format!("must be a non-blank string of at most {max} characters"))),
        }
    }

    pub fn one_of(&self, name: &str, allowed: &[&str]) -> Result<Option<&'a str>, AdminError> {
        match self.get(name) {
            None => Ok(None),
            Some(Value::String(s)) if allowed.contains(&s.as_str()) => Ok(Some(s)),
            Some(_) => Err(AdminError::bad(name, &format!("must be one of {}", allowed.join(", ")))),
        }
    }

    pub fn int(&self, name: &str, min: i64, max: i64) -> Result<Option<i64>, AdminError> {
        match self.get(name) {
            None => Ok(None),
            Some(v) => match v.as_i64() {
                Some(n) if (min..=max).contains(&n) => Ok(Some(n)),
                _ => Err(AdminError::bad(name, &format!("must be a whole number from {min} to {max}"))),
            },
        }
    }

    pub fn bool(&self, name: &str) -> Result<Option<bool>, AdminError> {
        match self.get(name) {
            None => Ok(None),
            Some(Value::Bool(b)) => Ok(Some(*b)),
            Some(_) => Err(AdminError::bad(name, "must be true or false")),
        }
    }

    /// An ISO 8601 instant, as Unix milliseconds.
    pub fn instant(&self, name: &str) -> Result<Option<i64>, AdminError> {
        match self.get(name) {
            None => Ok(None),
            Some(Value::String(s)) => s
                .parse::<jiff::Timestamp>()
                .map(|t| Some(t.as_millisecond()))
                .map_err(|_| AdminError::bad(name, "must be an ISO 8601 time such as 2030-01-01T00:00:00Z")),
            Some(_) => Err(AdminError::bad(name, "must be an ISO 8601 time string")),
        }
    }

    /// Present and explicitly `null` (clears a setting in PATCH).
    pub fn is_null(&self, name: &str) -> bool {
        self.obj.get(name).is_some_and(Value::is_null)
    }
}
