//! A chat stream as a messages-dialect event stream (spec "Messages-dialect stream").
//!
//! Frames are translated one at a time as they arrive, so nothing is buffered beyond the
//! text of the open thinking block (its signature covers the whole text). Order:
//! `message_start` on the first frame, blocks opened only when their first output arrives,
//! one `signature_delta` just before a thinking block stops, then `message_delta` with the
//! chat usage and `message_stop` at `[DONE]`. A failure ends the stream with one `error`
//! event and no `message_stop`.

use bytes::{Bytes, BytesMut};
use serde_json::{Value, json};

use super::chat_pieces::{ChatFrame, Piece, pieces, read_frame};
use super::messages_response::{message_id, paid_extra_of, stop_reason, tool_use_id, usage};
use super::render::sse_event;
use super::signature::sign_thinking;
use tollgate::envelope;
use tollgate::error::GatewayError;

/// The heartbeat sent every 15 seconds while the model is silent.
pub fn ping() -> Bytes {
    Bytes::from_static(b"event: ping\ndata: {\"type\": \"ping\"}\n\n")
}

enum Kind {
    /// The text so far, signed when the block stops.
    Thinking(String),
    Text,
    /// The chat tool-call index the block carries.
    Tool(u64),
}

struct Open {
    index: usize,
    kind: Kind,
}

#[derive(Clone, Copy, PartialEq, Eq)]
enum Phase {
    Waiting,
    Streaming,
    Ended,
}

/// Translator state for one streamed response.
pub struct MessagesStream {
    model: String,
    key: Vec<u8>,
    phase: Phase,
    next_index: usize,
    /// Blocks started and not stopped, in index order: one thinking or text block, or
    /// any number of tool blocks (parallel calls may interleave their fragments).
    open: Vec<Open>,
    /// Every chat tool-call index that got a block, open or stopped.
    tools_seen: Vec<u64>,
    finish: Option<String>,
    usage: Option<Value>,
}

impl MessagesStream {
    /// `model_id` is the catalog id the client named; `key` signs thinking blocks.
    pub fn new(model_id: &str, key: &[u8]) -> MessagesStream {
        MessagesStream {
            model: model_id.to_string(),
            key: key.to_vec(),
            phase: Phase::Waiting,
            next_index: 0,
            open: Vec::new(),
            tools_seen: Vec::new(),
            finish: None,
            usage: None,
        }
    }

    /// The stream is over (`message_stop` or `error` written); later input is ignored.
    pub fn is_ended(&self) -> bool {
        self.phase == Phase::Ended
    }

    /// One whole chat SSE frame (as `SseFramer` yields it): `[DONE]`, an error frame or a
    /// chunk. Frames without data (comments) and data that is not JSON give nothing.
    pub fn on_sse_frame(&mut self, frame: &[u8], out: &mut BytesMut) {
        match read_frame(frame) {
            Some(ChatFrame::Done) => self.on_done(out),
            Some(ChatFrame::Error(v)) => self.on_error(&v, out),
            Some(ChatFrame::Chunk(v)) => self.on_chat_frame(&v, out),
            None => {}
        }
    }

    /// One parsed `chat.completion.chunk` (or the usage frame).
    pub fn on_chat_frame(&mut self, frame: &Value, out: &mut BytesMut) {
        if self.phase == Phase::Ended {
            return;
        }
        self.start(frame.get("id").and_then(Value::as_str), out);
        for piece in pieces(frame) {
            match piece {
                Piece::Reasoning(t) => {
                    if !matches!(self.open.last(), Some(Open { kind: Kind::Thinking(_), .. })) {
                        self.close_all(out);
                        self.open_block(
                            Kind::Thinking(String::new()),
                            json!({"type": "thinking", "thinking": "", "signature": ""}),
                            out,
                        );
                    }
                    if let Some(Open { index, kind: Kind::Thinking(text) }) = self.open.last_mut() {
                        text.push_str(t);
                        let index = *index;
                        delta(out, index, json!({ "type": "thinking_delta", "thinking": t }));
                    }
                }
                Piece::Text(t) => {
                    if !matches!(self.open.last(), Some(Open { kind: Kind::Text, .. })) {
                        self.close_all(out);
                        self.open_block(Kind::Text, json!({"type": "text", "text": ""}), out);
                    }
                    if let Some(o) = self.open.last() {
                        delta(out, o.index, json!({ "type": "text_delta", "text": t }));
                    }
                }
                Piece::Tool { index, id, name, args } => self.on_tool(index, id, name, args, out),
                Piece::Finish(f) => self.finish = Some(f.to_string()),
                Piece::Usage(u) => self.usage = Some(u.clone()),
            }
        }
    }

    /// The chat stream's `[DONE]`: stop open blocks, then `message_delta` and `message_stop`.
    pub fn on_done(&mut self, out: &mut BytesMut) {
        if self.phase == Phase::Ended {
            return;
        }
        self.start(None, out);
        self.close_all(out);
        let paid = self.usage.as_ref().and_then(paid_extra_of);
        let payload = json!({
            "type": "message_delta",
            "delta": {
                "stop_reason": stop_reason(self.finish.as_deref(), !self.tools_seen.is_empty()),
                "stop_sequence": null,
            },
            "usage": usage(self.usage.as_ref(), paid.as_ref()),
        });
        sse_event(out, "message_delta", &payload);
        sse_event(out, "message_stop", &json!({ "type": "message_stop" }));
        self.phase = Phase::Ended;
    }

    /// A chat error frame (`{"error": {...}, "request_id": ...}`): one `error` event in the
    /// messages envelope; nothing follows it.
    pub fn on_error(&mut self, err_json: &Value, out: &mut BytesMut) {
        self.end_with_error(&messages_error_from_chat(err_json), out);
    }

    /// A failure the gateway raised itself (budget, early end): as [`Self::on_error`]. The
    /// 200-status `upstream_stream_error` is an `api_error`, as the chat table types it.
    pub fn on_failure(&mut self, err: &GatewayError, request_id: &str, out: &mut BytesMut) {
        let error_type = match err.status() {
            200 => "api_error",
            status => envelope::messages_error_type(status),
        };
        let body = error_body(error_type, err.kind.code(), &err.message, json!(request_id));
        self.end_with_error(&body, out);
    }

    fn end_with_error(&mut self, body: &Value, out: &mut BytesMut) {
        if self.phase == Phase::Ended {
            return;
        }
        sse_event(out, "error", body);
        self.phase = Phase::Ended;
    }

    fn start(&mut self, chat_id: Option<&str>, out: &mut BytesMut) {
        if self.phase != Phase::Waiting {
            return;
        }
        self.phase = Phase::Streaming;
        let message = json!({
            "id": message_id(chat_id),
            "type": "message",
            "role": "assistant",
            "content": [],
            "model": self.model,
            "stop_reason": null,
            "stop_sequence": null,
            "usage": usage(None, None),
        });
        sse_event(out, "message_start", &json!({ "type": "message_start", "message": message }));
    }

    fn on_tool(
        &mut self,
        chat_index: u64,
        id: Option<&str>,
        name: Option<&str>,
        args: Option<&str>,
        out: &mut BytesMut,
    ) {
        let open = self.open.iter().find(|o| matches!(o.kind, Kind::Tool(i) if i == chat_index)).map(|o| o.index);
        let index = match open {
            Some(index) => index,
            // Fragments of a call whose block already stopped cannot be delivered
            // (blocks never reopen); decisions.md 75.
            None if self.tools_seen.contains(&chat_index) => return,
            None => {
                if !matches!(self.open.last(), None | Some(Open { kind: Kind::Tool(_), .. })) {
                    self.close_all(out);
                }
                self.tools_seen.push(chat_index);
                let block = json!({
                    "type": "tool_use",
                    "id": tool_use_id(id),
                    "name": name.unwrap_or(""),
                    "input": {},
                });
                self.open_block(Kind::Tool(chat_index), block, out)
            }
        };
        if let Some(a) = args {
            delta(out, index, json!({ "type": "input_json_delta", "partial_json": a }));
        }
    }

    fn open_block(&mut self, kind: Kind, block: Value, out: &mut BytesMut) -> usize {
        let index = self.next_index;
        self.next_index += 1;
        sse_event(
            out,
            "content_block_start",
            &json!({ "type": "content_block_start", "index": index, "content_block": block }),
        );
        self.open.push(Open { index, kind });
        index
    }

    fn close_all(&mut self, out: &mut BytesMut) {
        for o in std::mem::take(&mut self.open) {
            if let Kind::Thinking(text) = &o.kind {
                let signature = sign_thinking(&self.key, text);
                delta(out, o.index, json!({ "type": "signature_delta", "signature": signature }));
            }
            sse_event(out, "content_block_stop", &json!({ "type": "content_block_stop", "index": o.index }));
        }
    }
}

fn delta(out: &mut BytesMut, index: usize, delta: Value) {
    sse_event(out, "content_block_delta", &json!({ "type": "content_block_delta", "index": index, "delta": delta }));
}

/// A chat-envelope error as the messages envelope (clarification 9): the type follows the
/// status class the chat `type` and `code` imply, `code` and `param` are dropped, and a
/// context overflow's message starts with `prompt is too long`.
pub fn messages_error_from_chat(err_json: &Value) -> Value {
    let inner = err_json.get("error").unwrap_or(err_json);
    let field = |k: &str| inner.get(k).and_then(Value::as_str).unwrap_or("");
    let (chat_type, code) = (field("type"), field("code"));
    let request_id = err_json.get("request_id").cloned().unwrap_or(Value::Null);
    error_body(messages_type(chat_type, code), code, field("message"), request_id)
}

fn error_body(error_type: &str, code: &str, message: &str, request_id: Value) -> Value {
    let mut message = if message.is_empty() { "The response failed.".to_string() } else { message.to_string() };
    if code == "context_length_exceeded" && !message.starts_with("prompt is too long") {
        message = format!("prompt is too long: {message}");
    }
    json!({ "type": "error", "error": { "type": error_type, "message": message }, "request_id": request_id })
}

fn messages_type(chat_type: &str, code: &str) -> &'static str {
    match code {
        "insufficient_credits" | "account_frozen" | "plan_limit_reached" | "spend_limit_reached" => "billing_error",
        "payload_too_large" => "request_too_large",
        "invalid_api_key" => "authentication_error",
        // The 503 codes of the spec's table that are not also used with another status.
        "hosted_model_paused"
        | "limiter_unavailable"
        | "hosted_admission_unavailable"
        | "hosted_evidence_unavailable"
        | "hosted_inference_unavailable"
        | "datastore_unavailable"
        | "idempotency_unavailable"
        | "billing_settlement_error"
        | "pricing_unavailable" => "overloaded_error",
        _ => match chat_type {
            "authentication_error" if code == "auth_error" => "permission_error",
            "authentication_error" => "authentication_error",
            "permission_error" => "permission_error",
            "not_found_error" => "not_found_error",
            "rate_limit_error" => "rate_limit_error",
            "invalid_request_error" => "invalid_request_error",
            _ => "api_error",
        },
    }
}
