//! Fixtures: capability sets, real catalog entries loaded through `config::load`, and
//! helpers to read translated output.

use std::sync::Arc;

use bytes::BytesMut;
use serde_json::{Value, json};

use crate::dialects::{Effort, ModelCaps};
use crate::shared::answer::{AnswerTranslator, AnswerView, Form, PricedUsage, pieces};
use tollgate::config::ModelEntry;
use tollgate::http::error::{ErrorKind, GatewayError};
use tollgate::http::sse::{SseFramer, data_payload};
use tollgate::money::Microcents;
use tollgate::money::usage::{UsageBasis, UsageFigures};

pub const KEY: &[u8] = b"test-signing-key";

pub fn caps(image_input: bool, tool_calling: bool, json_mode: bool, efforts: &[&str]) -> ModelCaps {
    ModelCaps {
        image_input,
        tool_calling,
        forced_tool_calling_limited: false,
        json_mode,
        reasoning_efforts: efforts.iter().filter_map(|e| Effort::parse(e)).collect(),
    }
    .normalized()
}

/// Text only, tools and JSON, no declared efforts (like the demo llama).
pub fn text_model() -> ModelCaps {
    caps(false, true, true, &[])
}

pub fn vision_model() -> ModelCaps {
    caps(true, true, true, &[])
}

/// The models of a `models.yaml` body, loaded with the real config loader.
pub fn catalog_models(models_yaml: &str) -> Vec<Arc<ModelEntry>> {
    let dir = std::env::temp_dir().join(format!("tollgate-messages-{}", uuid::Uuid::new_v4().simple()));
    std::fs::create_dir_all(&dir).unwrap();
    std::fs::write(dir.join("tollgate.yaml"), "threads: 1\n").unwrap();
    std::fs::write(dir.join("models.yaml"), models_yaml).unwrap();
    std::fs::write(dir.join("upstreams.yaml"), "pools: {}\n").unwrap();
    let config = tollgate::config::load(&dir.join("tollgate.yaml"));
    let _ = std::fs::remove_dir_all(&dir);
    match config {
        Ok(c) => c.catalog.models,
        Err(e) => panic!("fixture catalog does not load: {e}"),
    }
}

/// Assert `r` failed with `kind` and `param`, returning the message.
pub fn refused<T: std::fmt::Debug>(r: Result<T, GatewayError>, kind: ErrorKind, param: &str) -> String {
    match r {
        Err(e) => {
            assert_eq!(e.kind, kind, "{}", e.message);
            assert_eq!(e.param.as_deref(), Some(param), "{}", e.message);
            e.message
        }
        Ok(v) => panic!("expected {kind:?} on {param}, got {v:?}"),
    }
}

/// Event names and parsed data of an event-named SSE byte stream.
pub fn events(bytes: &[u8]) -> Vec<(String, Value)> {
    let mut framer = SseFramer::default();
    framer.push(bytes);
    let mut out = Vec::new();
    while let Some(frame) = framer.next_frame() {
        let text = std::str::from_utf8(&frame).unwrap();
        let name = text.lines().find_map(|l| l.strip_prefix("event: ")).unwrap_or("").to_string();
        let data = data_payload(&frame).map(|d| serde_json::from_slice(&d).unwrap()).unwrap_or(Value::Null);
        out.push((name, data));
    }
    assert!(!framer.has_partial(), "trailing bytes after the last frame");
    out
}

pub fn names(events: &[(String, Value)]) -> Vec<&str> {
    events.iter().map(|(n, _)| n.as_str()).collect()
}

/// A chat stream body, one `data:` frame per value, ending in `[DONE]`.
pub fn chat_sse(frames: &[Value]) -> Vec<u8> {
    let mut out = Vec::new();
    for f in frames {
        out.extend_from_slice(format!("data: {f}\n\n").as_bytes());
    }
    out.extend_from_slice(b"data: [DONE]\n\n");
    out
}

pub fn chunk(delta: Value) -> Value {
    json!({ "id": "chatcmpl-abc", "object": "chat.completion.chunk", "created": 1700000000, "model": "m",
            "choices": [{ "index": 0, "delta": delta, "finish_reason": null }] })
}

pub fn finish(reason: &str) -> Value {
    json!({ "id": "chatcmpl-abc", "object": "chat.completion.chunk", "created": 1700000000, "model": "m",
            "choices": [{ "index": 0, "delta": {}, "finish_reason": reason }] })
}

pub fn usage_frame(prompt: u64, cached: u64, completion: u64) -> Value {
    json!({ "id": "chatcmpl-abc", "object": "chat.completion.chunk", "created": 1700000000, "model": "m",
            "choices": [], "usage": chat_usage(prompt, cached, completion) })
}

pub fn chat_usage(prompt: u64, cached: u64, completion: u64) -> Value {
    json!({ "prompt_tokens": prompt, "completion_tokens": completion, "total_tokens": prompt + completion,
            "prompt_tokens_details": { "cached_tokens": cached }, "cost": 0.00001234,
            "service": { "cost_microcents": 1234, "cached_input_tokens": cached } })
}

/// Feed `bytes` through an `SseFramer` in the given chunks, calling `f` per whole frame.
pub fn feed(chunks: &[&[u8]], mut f: impl FnMut(&[u8], &mut BytesMut)) -> Vec<u8> {
    let mut framer = SseFramer::default();
    let mut out = BytesMut::new();
    for c in chunks {
        framer.push(c);
        while let Some(frame) = framer.next_frame() {
            f(&frame, &mut out);
        }
    }
    out.to_vec()
}

/// The priced usage the chat path hands a translator, from a chat Usage object (counts, and
/// the cost in `service.cost_microcents`).
pub fn priced_of(u: &Value) -> PricedUsage {
    let n = |p: &str| u.pointer(p).and_then(Value::as_u64).unwrap_or(0);
    let figures = UsageFigures {
        prompt_tokens: n("/prompt_tokens"),
        completion_tokens: n("/completion_tokens"),
        total_tokens: n("/total_tokens"),
        cached_tokens: n("/prompt_tokens_details/cached_tokens"),
        cost: Microcents(n("/service/cost_microcents")),
        basis: UsageBasis::ProviderReported,
        paid: None,
    };
    PricedUsage { figures, no_answer: u.pointer("/service/output_token_accounting").is_some() }
}

/// Drive `t` with one chat SSE frame the way the chat path does: the borrowed view's typed
/// pieces for a chunk, the priced usage for a usage report, `[DONE]`, or a failure for an
/// error frame (its message kept).
pub fn drive(t: &mut dyn AnswerTranslator, frame: &[u8], out: &mut BytesMut) {
    let Some(data) = data_payload(frame) else { return };
    if data.trim_ascii() == b"[DONE]" {
        return t.on_done(out);
    }
    let Some(view) = AnswerView::parse(&data) else { return };
    if view.is_error() {
        let v: Value = serde_json::from_slice(&data).unwrap();
        let message = v.pointer("/error/message").and_then(Value::as_str).unwrap_or("failed").to_string();
        let request_id = v["request_id"].as_str().unwrap_or("req_test");
        return t.on_failure(&GatewayError::new(ErrorKind::UpstreamFailed, message), request_id, out);
    }
    t.on_chunk(&view.meta(), &pieces(&view, Form::Chunk), out);
    if let Some(u) = view.usage.value() {
        t.on_usage(priced_of(&serde_json::from_str(u.get()).unwrap()));
    }
}

/// A whole chat completion (as JSON) as the translator's body, read the way the chat path
/// reads it.
pub fn whole(t: &dyn AnswerTranslator, chat: &Value) -> Value {
    let text = serde_json::to_vec(chat).unwrap();
    let view = AnswerView::parse(&text).unwrap();
    let usage = chat.get("usage").filter(|u| u.is_object()).map(priced_of);
    serde_json::from_slice(&t.whole(&view.meta(), &pieces(&view, Form::Body), usage)).unwrap()
}
