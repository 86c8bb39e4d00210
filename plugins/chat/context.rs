//! Rule 11 and the output ceiling: a prompt that does not fit the context window is
//! refused with `error.context_window`; `max_tokens` / `max_completion_tokens` above what
//! the window leaves are clamped to it, and the response says so.

use serde_json::{Map, Value};

use tollgate::http::error::{ErrorKind, GatewayError};

pub const CLAMPED_HEADER: &str = "x-service-output-clamped";
pub const CEILING_HEADER: &str = "x-service-output-token-ceiling";
const CEILING_FIELDS: [&str; 2] = ["max_tokens", "max_completion_tokens"];

/// Check `prompt_tokens` against `window` and clamp the ceilings of `out` (the forwarded
/// body); returns the clamped value when a ceiling was lowered. A prompt that leaves no room
/// for one output token does not fit (decisions.md 62).
pub fn fit(out: &mut Map<String, Value>, window: Option<u64>, prompt_tokens: u64) -> Result<Option<u64>, GatewayError> {
    let Some(window) = window else { return Ok(None) };
    if prompt_tokens >= window {
        return Err(GatewayError::new(
            ErrorKind::ContextLengthExceeded,
            format!(
                "The prompt is about {prompt_tokens} tokens; this model's context window is {window} tokens, including the output."
            ),
        )
        .with_param("messages")
        .with_field("context_window", window));
    }
    let remaining = window - prompt_tokens;
    let mut clamped = None;
    for field in CEILING_FIELDS {
        if out.get(field).and_then(Value::as_u64).is_some_and(|v| v > remaining) {
            out.insert(field.into(), Value::from(remaining));
            clamped = Some(remaining);
        }
    }
    Ok(clamped)
}

#[cfg(test)]
mod tests {
    use super::*;
    use serde_json::json;

    fn run(body: Value, window: Option<u64>, prompt: u64) -> (Result<Option<u64>, GatewayError>, Value) {
        let mut b = body.as_object().cloned().unwrap_or_default();
        let r = fit(&mut b, window, prompt);
        (r, Value::Object(b))
    }

    #[test]
    fn a_prompt_over_the_window_is_refused_with_the_window() {
        let e = run(json!({}), Some(100), 100).0.err();
        assert_eq!(e.as_ref().map(|e| e.kind), Some(ErrorKind::ContextLengthExceeded));
        assert_eq!(e.map(|e| e.extra.get("context_window").cloned()), Some(Some(json!(100))));
        assert!(run(json!({}), Some(100), 99).0.is_ok());
        assert!(run(json!({}), None, u64::MAX).0.is_ok(), "no declared window, no check");
    }

    #[test]
    fn oversized_ceilings_are_clamped_and_small_ones_kept() {
        let (r, body) = run(json!({"max_tokens": 500, "max_completion_tokens": 10}), Some(100), 40);
        assert_eq!(r.ok().flatten(), Some(60));
        assert_eq!(body, json!({"max_tokens": 60, "max_completion_tokens": 10}));
        let (r, body) = run(json!({"max_tokens": 60}), Some(100), 40);
        assert_eq!(r.ok().flatten(), None);
        assert_eq!(body["max_tokens"], 60);
    }
}
