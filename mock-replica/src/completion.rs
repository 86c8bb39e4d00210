//! What one chat completion answers, and its non-streamed JSON body.
//!
//! The request and the knobs are boiled down once into a `Completion`; both
//! the plain JSON answer (here) and the SSE stream (`sse.rs`) render from it,
//! so the two modes always agree on tokens, finish reason and usage.

use std::time::{SystemTime, UNIX_EPOCH};

use bytes::{BufMut, Bytes, BytesMut};

use crate::json::{push_opt_str, push_str, push_u64};
use crate::knobs::{DEFAULT_TOKENS, Knobs};
use crate::request::ChatRequest;

/// Arguments of every mocked tool call, already JSON-encoded as a string.
pub const TOOL_ARGUMENTS_JSON: &str = r#""{\"city\":\"Paris\"}""#;
/// Id of every mocked tool call.
pub const TOOL_CALL_ID: &str = "call_1";

pub struct Completion {
    /// `chatcmpl-<uuid>`.
    pub id: String,
    pub created: u64,
    pub model: String,
    /// Output tokens in total (reasoning included).
    pub tokens: u64,
    /// The first `reasoning` tokens are reasoning tokens.
    pub reasoning: u64,
    /// Function name when the answer is a tool call instead of content.
    pub tool_call: Option<String>,
    pub finish_reason: &'static str,
    /// `None` when the `x-mock-no-usage` knob removes it.
    pub usage: Option<Usage>,
}

#[derive(Clone, Copy)]
pub struct Usage {
    pub prompt: u64,
    pub completion: u64,
    pub cached: u64,
}

impl Completion {
    pub fn plan(req: &ChatRequest, knobs: &Knobs, model_name: Option<&str>) -> Self {
        let wanted = knobs.tokens.unwrap_or(DEFAULT_TOKENS);
        let cap = req.max_output();
        let tokens = cap.map_or(wanted, |cap| cap.min(wanted));
        let finish_reason = if knobs.tool_call.is_some() {
            "tool_calls"
        } else if tokens < wanted {
            "length"
        } else {
            "stop"
        };
        let prompt = knobs.prompt_tokens.unwrap_or_else(|| req.prompt_bytes() / 4 + 1);
        let usage =
            (!knobs.no_usage).then_some(Usage { prompt, completion: tokens, cached: knobs.cached_tokens.min(prompt) });
        let model = model_name.or(req.model.as_deref()).unwrap_or("mock").to_owned();
        Self {
            id: format!("chatcmpl-{}", uuid::Uuid::new_v4().simple()),
            created: unix_now(),
            model,
            tokens,
            reasoning: knobs.reasoning.min(tokens),
            tool_call: knobs.tool_call.clone(),
            finish_reason,
            usage,
        }
    }

    /// Content tokens (zero for a tool call, whose answer replaces them).
    pub fn content_tokens(&self) -> u64 {
        if self.tool_call.is_some() { 0 } else { self.tokens - self.reasoning }
    }

    /// The `chat.completion` JSON body.
    pub fn to_json(&self) -> Bytes {
        let content_len = (self.content_tokens() * 8) as usize;
        let reasoning_len = (self.reasoning * 10) as usize;
        let mut out = BytesMut::with_capacity(512 + content_len + reasoning_len);
        out.put_slice(b"{\"id\":");
        push_str(&mut out, &self.id);
        out.put_slice(b",\"object\":\"chat.completion\",\"created\":");
        push_u64(&mut out, self.created);
        out.put_slice(b",\"model\":");
        push_str(&mut out, &self.model);
        out.put_slice(b",\"choices\":[{\"index\":0,\"message\":{\"role\":\"assistant\",\"content\":");
        if self.content_tokens() == 0 {
            out.put_slice(b"null");
        } else {
            out.put_u8(b'"');
            for i in self.reasoning..self.tokens {
                push_token(&mut out, "tok", i);
            }
            out.put_u8(b'"');
        }
        out.put_slice(b",\"reasoning_content\":");
        if self.reasoning == 0 {
            out.put_slice(b"null");
        } else {
            out.put_u8(b'"');
            for i in 0..self.reasoning {
                push_token(&mut out, "think", i);
            }
            out.put_u8(b'"');
        }
        if let Some(name) = &self.tool_call {
            out.put_slice(b",\"tool_calls\":[{\"id\":\"");
            out.put_slice(TOOL_CALL_ID.as_bytes());
            out.put_slice(b"\",\"type\":\"function\",\"function\":{\"name\":");
            push_str(&mut out, name);
            out.put_slice(b",\"arguments\":");
            out.put_slice(TOOL_ARGUMENTS_JSON.as_bytes());
            out.put_slice(b"}}]");
        }
        out.put_slice(b"},\"logprobs\":null,\"finish_reason\":");
        push_opt_str(&mut out, Some(self.finish_reason));
        out.put_slice(b"}]");
        if let Some(usage) = &self.usage {
            out.put_slice(b",\"usage\":");
            push_usage(&mut out, usage);
        }
        out.put_u8(b'}');
        out.freeze()
    }
}

/// Token `i`'s text, `"{prefix}{i} "`, without quotes (it needs no escaping).
pub fn push_token(out: &mut BytesMut, prefix: &str, i: u64) {
    out.put_slice(prefix.as_bytes());
    push_u64(out, i);
    out.put_u8(b' ');
}

/// The OpenAI `usage` object.
pub fn push_usage(out: &mut BytesMut, usage: &Usage) {
    out.put_slice(b"{\"prompt_tokens\":");
    push_u64(out, usage.prompt);
    out.put_slice(b",\"total_tokens\":");
    push_u64(out, usage.prompt + usage.completion);
    out.put_slice(b",\"completion_tokens\":");
    push_u64(out, usage.completion);
    out.put_slice(b",\"prompt_tokens_details\":{\"cached_tokens\":");
    push_u64(out, usage.cached);
    out.put_slice(b"}}");
}

pub fn unix_now() -> u64 {
    SystemTime::now().duration_since(UNIX_EPOCH).map_or(0, |d| d.as_secs())
}

#[cfg(test)]
#[allow(clippy::unwrap_used)]
mod tests {
    use super::*;
    use serde_json::Value;

    fn request(body: &str) -> ChatRequest {
        serde_json::from_str(body).unwrap()
    }

    fn json(c: &Completion) -> Value {
        serde_json::from_slice(&c.to_json()).unwrap()
    }

    #[test]
    fn plain_answer() {
        let req = request(r#"{"model":"m","messages":[{"role":"user","content":"12345678"}]}"#);
        let knobs = Knobs { tokens: Some(3), ..Knobs::default() };
        let v = json(&Completion::plan(&req, &knobs, None));
        assert_eq!(v["object"], "chat.completion");
        assert_eq!(v["model"], "m");
        assert!(v["id"].as_str().unwrap().starts_with("chatcmpl-"));
        let choice = &v["choices"][0];
        assert_eq!(choice["message"]["content"], "tok0 tok1 tok2 ");
        assert_eq!(choice["message"]["reasoning_content"], Value::Null);
        assert!(choice["message"].get("tool_calls").is_none());
        assert_eq!(choice["finish_reason"], "stop");
        assert_eq!(choice["logprobs"], Value::Null);
        assert_eq!(v["usage"]["prompt_tokens"], 3);
        assert_eq!(v["usage"]["completion_tokens"], 3);
        assert_eq!(v["usage"]["total_tokens"], 6);
        assert_eq!(v["usage"]["prompt_tokens_details"]["cached_tokens"], 0);
    }

    #[test]
    fn capped_reasoning_answer() {
        let req = request(r#"{"model":"m","messages":[],"max_tokens":4}"#);
        let knobs = Knobs { reasoning: 2, prompt_tokens: Some(10), cached_tokens: 50, ..Knobs::default() };
        let v = json(&Completion::plan(&req, &knobs, Some("served")));
        assert_eq!(v["model"], "served");
        let msg = &v["choices"][0]["message"];
        assert_eq!(msg["reasoning_content"], "think0 think1 ");
        assert_eq!(msg["content"], "tok2 tok3 ");
        assert_eq!(v["choices"][0]["finish_reason"], "length");
        assert_eq!(v["usage"]["prompt_tokens"], 10);
        assert_eq!(v["usage"]["prompt_tokens_details"]["cached_tokens"], 10);
    }

    #[test]
    fn tool_call_answer_without_usage() {
        let req = request(r#"{"messages":[]}"#);
        let knobs = Knobs { tool_call: Some("get_weather".to_owned()), no_usage: true, ..Knobs::default() };
        let v = json(&Completion::plan(&req, &knobs, None));
        let msg = &v["choices"][0]["message"];
        assert_eq!(msg["content"], Value::Null);
        assert_eq!(msg["tool_calls"][0]["id"], "call_1");
        assert_eq!(msg["tool_calls"][0]["function"]["name"], "get_weather");
        assert_eq!(msg["tool_calls"][0]["function"]["arguments"], r#"{"city":"Paris"}"#);
        assert_eq!(v["choices"][0]["finish_reason"], "tool_calls");
        assert!(v.get("usage").is_none());
    }
}
