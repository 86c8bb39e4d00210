//! Non-streamed chat responses, and what both response forms share: the choice
//! normalisation (reasoning on `reasoning`, `service.output_status` when a choice ends
//! without answer content), the model name and the usage splice.

use bytes::Bytes;
use serde_json::{Map, Value, json};

use tollgate::ctx::RequestCtx;
use tollgate::error::{ErrorKind, GatewayError};
use tollgate::usage;

/// What one choice's `message` or `delta` carried.
#[derive(Debug, Default, Clone, Copy)]
pub struct ChoiceOutput {
    /// The object was rewritten.
    pub changed: bool,
    /// Answer content (non-empty text) or tool calls.
    pub answer: bool,
    /// Answer or reasoning output (a delivered token).
    pub output: bool,
    pub text_bytes: usize,
}

fn non_empty_str(v: Option<&Value>) -> usize {
    v.and_then(Value::as_str).map_or(0, str::len)
}

/// Move replica reasoning (`reasoning_content`) to `reasoning`, and say what was carried.
pub fn normalize(part: &mut Map<String, Value>) -> ChoiceOutput {
    let mut out = ChoiceOutput::default();
    if let Some(rc) = part.remove("reasoning_content") {
        out.changed = true;
        if part.get("reasoning").is_none_or(Value::is_null) {
            part.insert("reasoning".into(), rc);
        }
    }
    let content = non_empty_str(part.get("content"));
    let reasoning = non_empty_str(part.get("reasoning"));
    let tools = part.get("tool_calls").and_then(Value::as_array).is_some_and(|a| !a.is_empty());
    out.answer = content > 0 || tools;
    out.output = out.answer || reasoning > 0;
    out.text_bytes = content + reasoning;
    out
}

/// `service.output_status` for a choice that ended without answer content.
pub fn output_status(finish_reason: &str) -> Value {
    if finish_reason == "length" {
        json!({ "output_status": {
            "code": "generation_limit_reached_before_answer",
            "message": "The output limit was reached before the model produced answer content; raise max_tokens or lower reasoning_effort."
        }})
    } else {
        json!({ "output_status": {
            "code": "no_answer_content",
            "message": "The model finished without producing answer content."
        }})
    }
}

/// Replace the replica's model name with the catalog id the client used.
pub fn rename_model(obj: &mut Map<String, Value>, cx: &RequestCtx) -> bool {
    let Some(pool) = cx.pool() else { return false };
    let Some(m) = obj.get_mut("model") else { return false };
    match m.as_str().and_then(|name| pool.from_upstream(name)) {
        Some(id) => {
            *m = Value::String(id.to_string());
            true
        }
        None => false,
    }
}

/// Serialize `obj` with `"usage": <usage_json>` appended (the usage object is rendered as
/// text so `cost` keeps its fixed eight decimals).
pub fn with_usage(obj: &Map<String, Value>, usage_json: &str) -> Result<Vec<u8>, GatewayError> {
    let mut out = serde_json::to_vec(obj).map_err(|e| GatewayError::internal(format!("serialize: {e}")))?;
    out.pop(); // the closing brace
    if !obj.is_empty() {
        out.push(b',');
    }
    out.extend_from_slice(b"\"usage\":");
    out.extend_from_slice(usage_json.as_bytes());
    out.push(b'}');
    Ok(out)
}

fn malformed() -> GatewayError {
    GatewayError::new(ErrorKind::UpstreamFailed, "The model server sent a malformed response.")
}

/// Collect the body; at the end, rewrite it whole.
pub fn on_chunk(body: &mut Option<Bytes>, eos: bool, cx: &mut RequestCtx) -> Result<(), GatewayError> {
    if let Some(b) = body.take() {
        cx.response.body_buf.extend_from_slice(&b);
    }
    if !eos {
        return Ok(());
    }
    let raw = cx.response.body_buf.split().freeze();
    let out = match super::raw::json_body(&raw, cx) {
        Some(out) => out,
        None => rewrite_value(&raw, cx)?,
    };
    *body = Some(Bytes::from(out));
    Ok(())
}

/// The whole body rewritten through a `Value` (bodies `raw::json_body` does not take).
pub(super) fn rewrite_value(raw: &[u8], cx: &mut RequestCtx) -> Result<Vec<u8>, GatewayError> {
    let mut v: Value = serde_json::from_slice(raw).map_err(|_| malformed())?;
    let obj = v.as_object_mut().ok_or_else(malformed)?;
    // A chat completion: `choices` is a list of objects (clarification 11: anything else is a
    // malformed answer, `502 upstream_error`, never passed on as a 200).
    let is_completion = obj.get("choices").and_then(Value::as_array).is_some_and(|c| c.iter().all(Value::is_object));
    if !is_completion {
        return Err(malformed());
    }
    rename_model(obj, cx);
    let mut choices_seen = 0;
    let mut answered_any = false;
    let mut text_bytes = 0;
    if let Some(choices) = obj.get_mut("choices").and_then(Value::as_array_mut) {
        for choice in choices.iter_mut().filter_map(Value::as_object_mut) {
            choices_seen += 1;
            let out = match choice.get_mut("message").and_then(Value::as_object_mut) {
                Some(m) => normalize(m),
                None => ChoiceOutput::default(),
            };
            text_bytes += out.text_bytes;
            answered_any |= out.answer;
            if !out.answer {
                if let Some(fr) = choice.get("finish_reason").and_then(Value::as_str) {
                    let status = output_status(fr);
                    choice.insert("service".into(), status);
                }
            }
        }
    }
    let no_answer = choices_seen > 0 && !answered_any;
    let provider = obj.remove("usage");
    let figures = match (provider.as_ref(), cx.model()) {
        (Some(u), Some(m)) => usage::from_provider(u, m),
        _ => None,
    };
    // Fallback count for settlement when the replica reported no usage.
    cx.response.delivered_tokens = (text_bytes as u64).div_ceil(4);
    cx.response.delivered_text_bytes = text_bytes as u64;
    let out = match figures {
        Some(f) => {
            cx.usage = Some(f);
            with_usage(obj, &usage::render_chat_usage(&f, no_answer))?
        }
        // Never synthesized: no usage reported, none sent.
        None => serde_json::to_vec(&v).map_err(|e| GatewayError::internal(format!("serialize: {e}")))?,
    };
    Ok(out)
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn reasoning_content_moves_to_reasoning() {
        let mut m = json!({"role":"assistant","content":null,"reasoning_content":"thinking"});
        let out = normalize(m.as_object_mut().unwrap_or(&mut Map::new()));
        assert!(out.changed && out.output && !out.answer);
        assert_eq!(m["reasoning"], "thinking");
        assert!(m.get("reasoning_content").is_none());
    }

    #[test]
    fn tool_calls_count_as_an_answer() {
        let mut m = json!({"content":null,"tool_calls":[{"id":"c"}]});
        assert!(normalize(m.as_object_mut().unwrap_or(&mut Map::new())).answer);
    }

    #[test]
    fn output_status_codes_follow_finish_reason() {
        assert_eq!(output_status("length")["output_status"]["code"], "generation_limit_reached_before_answer");
        assert_eq!(output_status("stop")["output_status"]["code"], "no_answer_content");
    }

    #[test]
    fn usage_splice_is_valid_json() {
        let obj = json!({"id":"x"});
        let out = with_usage(obj.as_object().unwrap_or(&Map::new()), "{\"cost\":0.00000001}").unwrap_or_default();
        let v: Value = serde_json::from_slice(&out).unwrap_or_default();
        assert_eq!(v["usage"]["cost"].as_f64(), Some(0.00000001));
        assert_eq!(v["id"], "x");
    }
}
