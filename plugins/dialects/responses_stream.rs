//! A chat stream as a Responses-dialect event stream (spec "Responses-dialect stream").
//!
//! The spec shows `response.output_text.delta` (field `delta`) and `response.failed`; the
//! rest follows the public Responses event grammar so its clients can assemble the result:
//! `response.created`, then per output item `response.output_item.added`, its deltas,
//! its `.done` events and `response.output_item.done`, then `response.completed` (or
//! `response.incomplete` when cut short) with the whole response and usage. Items begin
//! in the order their first output arrives and are finished when another item begins.

use bytes::BytesMut;
use serde_json::{Value, json};

use super::render::{sse_event, to_vec};
use super::responses::{
    from_answer, function_call_item, id_suffix, message_item, reasoning_item, responses_usage, skeleton, status_of,
};
use crate::shared::answer::{AnswerTranslator, ChunkMeta, Piece, PricedUsage};
use tollgate::http::error::GatewayError;

enum Kind {
    Reasoning,
    Message,
    Call { chat_index: u64, call_id: String, name: String },
}

struct Item {
    kind: Kind,
    id: String,
    /// Text, or the call's arguments so far.
    text: String,
    open: bool,
}

#[derive(Clone, Copy, PartialEq, Eq)]
enum Phase {
    Waiting,
    Streaming,
    Ended,
}

/// Translator state for one streamed Responses request.
pub struct ResponsesStream {
    model: String,
    suffix: String,
    created: Option<i64>,
    phase: Phase,
    seq: u64,
    items: Vec<Item>,
    finish: Option<String>,
    usage: Option<PricedUsage>,
}

impl ResponsesStream {
    /// `model_id` is the catalog id the client named.
    pub fn new(model_id: &str) -> ResponsesStream {
        ResponsesStream {
            model: model_id.to_string(),
            suffix: String::new(),
            created: None,
            phase: Phase::Waiting,
            seq: 0,
            items: Vec::new(),
            finish: None,
            usage: None,
        }
    }

    pub fn is_ended(&self) -> bool {
        self.phase == Phase::Ended
    }

    fn start(&mut self, meta: &ChunkMeta<'_>, out: &mut BytesMut) {
        if self.phase != Phase::Waiting {
            return;
        }
        self.phase = Phase::Streaming;
        self.suffix = id_suffix(meta.id.as_deref());
        // Fixed once, so every event quotes the same `created_at`.
        self.created = Some(meta.created.unwrap_or_else(|| jiff::Timestamp::now().as_second()));
        let r = self.response("in_progress");
        self.emit(out, "response.created", json!({ "response": r }));
    }

    /// The response object as it stands, with the items begun so far.
    fn response(&self, status: &str) -> Value {
        let mut r = skeleton(&self.suffix, self.created, &self.model);
        r.insert("status".into(), json!(status));
        // Items still open when a response fails were cut short.
        let output = self.items.iter().map(|it| {
            let item_status = if it.open && status == "failed" { "incomplete" } else { "completed" };
            self.item_json(it, item_status)
        });
        r.insert("output".into(), Value::Array(output.collect()));
        r.insert("usage".into(), Value::Null);
        Value::Object(r)
    }

    /// The open item for which `is_it` holds, or a new item of `make()` after finishing the
    /// open ones (parallel calls stay open together). Returns its output index.
    fn current(&mut self, is_it: impl Fn(&Kind) -> bool, make: impl FnOnce() -> Kind, out: &mut BytesMut) -> usize {
        if let Some(i) = self.items.iter().rposition(|it| it.open && is_it(&it.kind)) {
            return i;
        }
        let kind = make();
        // A new call joins other open calls (parallel calls interleave); anything else
        // finishes what is open first.
        let is_call = |k: &Kind| matches!(k, Kind::Call { .. });
        if !(is_call(&kind) && self.items.iter().all(|it| !it.open || is_call(&it.kind))) {
            self.finish_items(out);
        }
        let i = self.items.len();
        let id = match &kind {
            Kind::Call { call_id, .. } => format!("fc_{call_id}"),
            Kind::Reasoning | Kind::Message => {
                let prefix = if matches!(kind, Kind::Reasoning) { "rs" } else { "msg" };
                let first =
                    !self.items.iter().any(|it| std::mem::discriminant(&it.kind) == std::mem::discriminant(&kind));
                if first { format!("{prefix}_{}", self.suffix) } else { format!("{prefix}_{}_{i}", self.suffix) }
            }
        };
        self.items.push(Item { kind, id, text: String::new(), open: true });
        let added = match &self.items[i].kind {
            Kind::Reasoning => json!({ "type": "reasoning", "id": self.items[i].id, "summary": [], "content": [] }),
            Kind::Message => {
                json!({ "type": "message", "id": self.items[i].id, "status": "in_progress", "role": "assistant", "content": [] })
            }
            Kind::Call { call_id, name, .. } => function_call_item(call_id, name, "", "in_progress"),
        };
        self.emit(out, "response.output_item.added", json!({ "output_index": i, "item": added }));
        if matches!(self.items[i].kind, Kind::Message) {
            let id = self.items[i].id.clone();
            let part = json!({ "type": "output_text", "text": "", "annotations": [] });
            self.emit(
                out,
                "response.content_part.added",
                json!({ "item_id": id, "output_index": i, "content_index": 0, "part": part }),
            );
        }
        i
    }

    fn text_delta(&mut self, i: usize, name: &str, t: &str, out: &mut BytesMut) {
        self.items[i].text.push_str(t);
        let id = self.items[i].id.clone();
        self.emit(out, name, json!({ "item_id": id, "output_index": i, "content_index": 0, "delta": t }));
    }

    fn finish_items(&mut self, out: &mut BytesMut) {
        for i in 0..self.items.len() {
            if !self.items[i].open {
                continue;
            }
            self.items[i].open = false;
            let (id, text) = (self.items[i].id.clone(), self.items[i].text.clone());
            match self.items[i].kind {
                Kind::Reasoning => {
                    self.emit(
                        out,
                        "response.reasoning_text.done",
                        json!({ "item_id": id, "output_index": i, "content_index": 0, "text": text }),
                    );
                }
                Kind::Message => {
                    self.emit(
                        out,
                        "response.output_text.done",
                        json!({ "item_id": id, "output_index": i, "content_index": 0, "text": text }),
                    );
                    let part = json!({ "type": "output_text", "text": text, "annotations": [] });
                    self.emit(
                        out,
                        "response.content_part.done",
                        json!({ "item_id": id, "output_index": i, "content_index": 0, "part": part }),
                    );
                }
                Kind::Call { .. } => {
                    self.emit(
                        out,
                        "response.function_call_arguments.done",
                        json!({ "item_id": id, "output_index": i, "arguments": text }),
                    );
                }
            }
            let item = self.item_json(&self.items[i], "completed");
            self.emit(out, "response.output_item.done", json!({ "output_index": i, "item": item }));
        }
    }

    fn item_json(&self, it: &Item, status: &str) -> Value {
        let mut v = match &it.kind {
            Kind::Reasoning => reasoning_item("", &it.text),
            Kind::Message => message_item("", &it.text, status),
            Kind::Call { call_id, name, .. } => function_call_item(call_id, name, &it.text, status),
        };
        v["id"] = json!(it.id);
        v
    }

    /// Write one event; `type` and `sequence_number` are added to `data`.
    fn emit(&mut self, out: &mut BytesMut, name: &str, mut data: Value) {
        data["type"] = json!(name);
        data["sequence_number"] = json!(self.seq);
        self.seq += 1;
        sse_event(out, name, &data);
    }
}

impl AnswerTranslator for ResponsesStream {
    /// One chat chunk's pieces.
    fn on_chunk(&mut self, meta: &ChunkMeta<'_>, pieces: &[Piece<'_>], out: &mut BytesMut) {
        if self.phase == Phase::Ended {
            return;
        }
        self.start(meta, out);
        for piece in pieces {
            match piece {
                Piece::Reasoning(t) => {
                    let i = self.current(|k| matches!(k, Kind::Reasoning), || Kind::Reasoning, out);
                    self.text_delta(i, "response.reasoning_text.delta", t, out);
                }
                Piece::Text(t) => {
                    let i = self.current(|k| matches!(k, Kind::Message), || Kind::Message, out);
                    self.text_delta(i, "response.output_text.delta", t, out);
                }
                Piece::Tool { index, id, name, args } => {
                    let index = *index;
                    let found = self
                        .items
                        .iter()
                        .position(|it| matches!(it.kind, Kind::Call { chat_index, .. } if chat_index == index));
                    let i = match found {
                        Some(i) if self.items[i].open => i,
                        Some(_) => continue, // a finished call never reopens (decisions.md 75)
                        None => {
                            let call_id = id
                                .as_deref()
                                .map_or_else(|| format!("call_{}", uuid::Uuid::new_v4().simple()), str::to_string);
                            let kind = Kind::Call {
                                chat_index: index,
                                call_id,
                                name: name.as_deref().unwrap_or("").to_string(),
                            };
                            self.current(|_| false, || kind, out)
                        }
                    };
                    if let Some(a) = args {
                        let id = self.items[i].id.clone();
                        self.items[i].text.push_str(a);
                        self.emit(
                            out,
                            "response.function_call_arguments.delta",
                            json!({ "item_id": id, "output_index": i, "delta": a }),
                        );
                    }
                }
                Piece::Finish(f) => self.finish = Some(f.to_string()),
            }
        }
    }

    /// The chat stream's `[DONE]`: finish open items, then the terminal event.
    fn on_done(&mut self, out: &mut BytesMut) {
        if self.phase == Phase::Ended {
            return;
        }
        self.start(&ChunkMeta::default(), out);
        self.finish_items(out);
        let (status, incomplete) = status_of(self.finish.as_deref());
        let mut r = self.response(status);
        r["incomplete_details"] = incomplete;
        r["usage"] = self.usage.as_ref().map_or(Value::Null, responses_usage);
        let name = if status == "incomplete" { "response.incomplete" } else { "response.completed" };
        self.emit(out, name, json!({ "response": r }));
        self.phase = Phase::Ended;
    }

    /// A failure: `response.failed` carrying the error's code and message (a context-length
    /// refusal among them); nothing follows it.
    fn on_failure(&mut self, err: &GatewayError, _request_id: &str, out: &mut BytesMut) {
        if self.phase == Phase::Ended {
            return;
        }
        self.start(&ChunkMeta::default(), out);
        let mut r = self.response("failed");
        r["error"] = json!({ "code": err.kind.code(), "message": err.message });
        self.emit(out, "response.failed", json!({ "response": r }));
        self.phase = Phase::Ended;
    }

    fn on_usage(&mut self, usage: PricedUsage) {
        self.usage = Some(usage);
    }

    fn whole(&self, meta: &ChunkMeta<'_>, pieces: &[Piece<'_>], usage: Option<PricedUsage>) -> Vec<u8> {
        to_vec(&from_answer(meta, pieces, usage.as_ref(), &self.model))
    }
}
