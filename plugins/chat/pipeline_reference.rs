//! The reference the pipeline is tested against: the chat normalisation written the plain
//! way, over a `serde_json::Value` (as the gateway did before it read answers through the
//! borrowed view). Test-only: `pipeline_tests.rs` runs every case through both and compares
//! the JSON and the request state.

use bytes::BytesMut;
use serde_json::{Map, Value};

use super::account::output_status;
use tollgate::http::envelope;
use tollgate::http::error::{ErrorKind, GatewayError};
use tollgate::money::usage;
use tollgate::proxy::ctx::RequestCtx;

#[derive(Default)]
struct PartOut {
    changed: bool,
    answer: bool,
    output: bool,
    text_bytes: usize,
}

fn str_len(v: Option<&Value>) -> usize {
    v.and_then(Value::as_str).map_or(0, str::len)
}

fn normalize(part: &mut Map<String, Value>) -> PartOut {
    let mut out = PartOut::default();
    if let Some(rc) = part.remove("reasoning_content") {
        out.changed = true;
        if part.get("reasoning").is_none_or(Value::is_null) {
            part.insert("reasoning".into(), rc);
        }
    }
    let content = str_len(part.get("content"));
    let reasoning = str_len(part.get("reasoning"));
    let tools = part.get("tool_calls").and_then(Value::as_array).is_some_and(|a| !a.is_empty());
    out.answer = content > 0 || tools;
    out.output = out.answer || reasoning > 0;
    out.text_bytes = content + reasoning;
    out
}

fn rename_model(obj: &mut Map<String, Value>, cx: &RequestCtx) -> bool {
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

fn with_usage(obj: &mut Map<String, Value>, usage_json: &str) -> Value {
    obj.insert("usage".into(), serde_json::from_str(usage_json).unwrap());
    Value::Object(obj.clone())
}

/// A whole body: the answer, or `Err` for a malformed one.
pub fn body(raw: &[u8], cx: &mut RequestCtx) -> Result<Value, ()> {
    let mut v: Value = serde_json::from_slice(raw).map_err(|_| ())?;
    let obj = v.as_object_mut().ok_or(())?;
    if !obj.get("choices").and_then(Value::as_array).is_some_and(|c| c.iter().all(Value::is_object)) {
        return Err(());
    }
    rename_model(obj, cx);
    let (mut seen, mut answered_any, mut text_bytes) = (0, false, 0);
    for choice in obj.get_mut("choices").and_then(Value::as_array_mut).into_iter().flatten() {
        let Some(choice) = choice.as_object_mut() else { continue };
        seen += 1;
        let out = choice.get_mut("message").and_then(Value::as_object_mut).map(normalize).unwrap_or_default();
        text_bytes += out.text_bytes;
        answered_any |= out.answer;
        cx.response.answered.push(out.answer);
        if !out.answer {
            if let Some(fr) = choice.get("finish_reason").and_then(Value::as_str) {
                let status = output_status(fr);
                choice.insert("service".into(), status);
            }
        }
    }
    let no_answer = seen > 0 && !answered_any;
    let provider = obj.remove("usage");
    let figures = provider
        .as_ref()
        .zip(cx.model())
        .and_then(|(u, m)| usage::from_provider(u, m, cx.arrived_ms))
        .map(|f| f.paid_by(cx.paid_from));
    cx.response.delivered_tokens = (text_bytes as u64).div_ceil(4);
    cx.response.delivered_text_bytes = text_bytes as u64;
    Ok(match figures {
        Some(f) => {
            cx.usage.report(f);
            with_usage(obj, &usage::render_chat_usage(&f, no_answer))
        }
        None => v,
    })
}

fn fail(cx: &mut RequestCtx, out: &mut BytesMut, message: &str) {
    let err = GatewayError::new(ErrorKind::UpstreamFailed, message);
    out.extend_from_slice(&envelope::sse_error_frame(&err, cx.envelope, &cx.request_id));
    cx.failure = Some(err);
    cx.response.saw_done = true;
}

fn emit(v: &Value, out: &mut BytesMut) {
    out.extend_from_slice(format!("data: {v}\n\n").as_bytes());
}

/// One stream frame's JSON payload `data`.
pub fn frame(frame: &[u8], data: &[u8], cx: &mut RequestCtx, out: &mut BytesMut) {
    let Ok(mut v @ Value::Object(_)) = serde_json::from_slice::<Value>(data) else {
        return fail(cx, out, "The model server sent a malformed stream frame.");
    };
    let Some(obj) = v.as_object_mut() else { return };
    if obj.contains_key("error") && !obj.contains_key("choices") {
        return fail(cx, out, "The model server failed during generation.");
    }
    let is_chunk = match obj.get("choices") {
        Some(Value::Array(list)) => list.iter().all(Value::is_object),
        None => obj.get("usage").is_some_and(Value::is_object),
        Some(_) => false,
    };
    if !is_chunk {
        return fail(cx, out, "The model server sent a malformed stream frame.");
    }
    let mut changed = rename_model(obj, cx);
    let mut choices_empty = true;
    if let Some(choices) = obj.get_mut("choices").and_then(Value::as_array_mut) {
        choices_empty = choices.is_empty();
        for (pos, choice) in choices.iter_mut().enumerate() {
            let Some(choice) = choice.as_object_mut() else { continue };
            let idx = choice.get("index").and_then(Value::as_u64).map_or(pos, |i| i as usize).min(64);
            if cx.response.answered.len() <= idx {
                cx.response.answered.resize(idx + 1, false);
            }
            if let Some(delta) = choice.get_mut("delta").and_then(Value::as_object_mut) {
                let o = normalize(delta);
                changed |= o.changed;
                if o.output {
                    cx.response.delivered_tokens += 1;
                    cx.response.delivered_text_bytes += o.text_bytes as u64;
                    cx.first_token_seen = true;
                }
                cx.response.answered[idx] |= o.answer;
            }
            let finished = choice.get("finish_reason").and_then(Value::as_str).map(str::to_owned);
            if let Some(fr) = finished {
                if !cx.response.answered[idx] {
                    choice.insert("service".into(), output_status(&fr));
                    changed = true;
                }
            }
        }
    }
    if let Some(u) = obj.remove("usage").filter(|u| !u.is_null()) {
        let figures =
            cx.model().and_then(|m| usage::from_provider(&u, m, cx.arrived_ms)).map(|f| f.paid_by(cx.paid_from));
        let no_answer = !cx.response.answered.is_empty() && cx.response.answered.iter().all(|a| !a);
        if let Some(f) = figures {
            cx.usage.report(f);
            if cx.chat_request.include_usage || (no_answer && choices_empty) {
                return emit(&with_usage(obj, &usage::render_chat_usage(&f, no_answer)), out);
            }
        }
        if choices_empty {
            return;
        }
        return emit(&v, out);
    }
    if changed {
        emit(&v, out);
    } else {
        out.extend_from_slice(frame);
    }
}
