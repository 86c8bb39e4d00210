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

use super::messages_response::{from_answer, message_id, stop_reason, tool_use_id, usage};
use super::render::{sse_event, to_vec};
use super::signature::sign_thinking;
use crate::shared::answer::{AnswerTranslator, ChunkMeta, Piece, PricedUsage};
use tollgate::http::envelope;
use tollgate::http::error::GatewayError;

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
    usage: Option<PricedUsage>,
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
            "usage": usage(None),
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

impl AnswerTranslator for MessagesStream {
    /// One chat chunk's pieces.
    fn on_chunk(&mut self, meta: &ChunkMeta<'_>, pieces: &[Piece<'_>], out: &mut BytesMut) {
        if self.phase == Phase::Ended {
            return;
        }
        self.start(meta.id.as_deref(), out);
        for piece in pieces {
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
                Piece::Tool { index, id, name, args } => {
                    self.on_tool(*index, id.as_deref(), name.as_deref(), args.as_deref(), out)
                }
                Piece::Finish(f) => self.finish = Some(f.to_string()),
            }
        }
    }

    /// The chat stream's `[DONE]`: stop open blocks, then `message_delta` and `message_stop`.
    fn on_done(&mut self, out: &mut BytesMut) {
        if self.phase == Phase::Ended {
            return;
        }
        self.start(None, out);
        self.close_all(out);
        let payload = json!({
            "type": "message_delta",
            "delta": {
                "stop_reason": stop_reason(self.finish.as_deref(), !self.tools_seen.is_empty()),
                "stop_sequence": null,
            },
            "usage": usage(self.usage.as_ref()),
        });
        sse_event(out, "message_delta", &payload);
        sse_event(out, "message_stop", &json!({ "type": "message_stop" }));
        self.phase = Phase::Ended;
    }

    /// A failure ends the stream with one `error` event in the messages envelope (the one
    /// renderer of the error catalogue); nothing follows it.
    fn on_failure(&mut self, err: &GatewayError, request_id: &str, out: &mut BytesMut) {
        if self.phase == Phase::Ended {
            return;
        }
        out.extend_from_slice(&envelope::sse_error_frame(err, envelope::Envelope::Messages, request_id));
        self.phase = Phase::Ended;
    }

    fn on_usage(&mut self, usage: PricedUsage) {
        self.usage = Some(usage);
    }

    fn whole(&self, meta: &ChunkMeta<'_>, pieces: &[Piece<'_>], usage: Option<PricedUsage>) -> Vec<u8> {
        to_vec(&from_answer(meta, pieces, usage.as_ref(), &self.model, &self.key))
    }
}
