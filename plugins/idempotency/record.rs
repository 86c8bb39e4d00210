//! What a settled idempotency record holds, and the replay it gives.
//!
//! A non-streamed original keeps the exact body the client received (in its dialect). A
//! streamed original is never re-sent as content (spec "Retry rules"): the record keeps the
//! facts of a receipt (the chat id, `created`, the finish reason, the settled usage) and a
//! replay renders the receipt: the chat envelope with `message.content: null` and the
//! `idempotent_replay` object, or, on a dialect route, the dialect's own answer with no
//! content made by the request's translator (clarification 7).

use bytes::{Bytes, BytesMut};
use serde::{Deserialize, Serialize};
use serde_json::{Value, json};

use crate::shared::answer::{ChunkMeta, Piece, PricedUsage};
use tollgate::money::Microcents;
use tollgate::money::usage::{self, UsageBasis, UsageFigures};

/// Stored bodies above this are not kept: a replay answers `422
/// idempotency_replay_unavailable` (decisions.md 91).
pub const MAX_STORED_BODY: usize = 1_048_576;

#[derive(Debug, Clone, PartialEq, Eq, Serialize, Deserialize)]
pub struct Record {
    /// Fingerprint of the original: method, route and body hash.
    pub fp: String,
    pub status: u16,
    pub streamed: bool,
    /// The body was above [`MAX_STORED_BODY`].
    #[serde(default)]
    pub too_large: bool,
    /// A non-streamed original's body and content type.
    #[serde(default)]
    pub body: Option<String>,
    #[serde(default)]
    pub content_type: Option<String>,
    /// A streamed original's receipt facts.
    #[serde(default)]
    pub receipt: Option<Receipt>,
    /// The original's funding headers (a replay keeps the original receipt's).
    #[serde(default)]
    pub funding: Vec<(String, String)>,
    /// The original's request id: the one charged, which support looks up (records made
    /// before it was kept have none).
    #[serde(default)]
    pub request_id: Option<String>,
}

/// The funding headers an admission may set (spec, funding headers).
pub const FUNDING_HEADERS: [&str; 6] = [
    "x-service-funding",
    "x-service-plan",
    "x-service-plan-5h-used-percent",
    "x-service-plan-5h-resets-at",
    "x-service-plan-week-used-percent",
    "x-service-plan-week-resets-at",
];

/// The funding headers of a response being recorded.
pub fn funding_of(headers: &[(&'static str, String)]) -> Vec<(String, String)> {
    headers.iter().filter(|(k, _)| FUNDING_HEADERS.contains(k)).map(|(k, v)| ((*k).to_string(), v.clone())).collect()
}

/// Stored funding headers as response headers again (unknown names are dropped).
pub fn funding_headers(stored: &[(String, String)]) -> Vec<(&'static str, String)> {
    stored
        .iter()
        .filter_map(|(k, v)| FUNDING_HEADERS.iter().find(|h| **h == k.as_str()).map(|h| (*h, v.clone())))
        .collect()
}

#[derive(Debug, Clone, PartialEq, Eq, Serialize, Deserialize)]
pub struct Receipt {
    pub id: Option<String>,
    pub created: Option<i64>,
    pub model: String,
    pub finish_reason: Option<String>,
    /// The stream ended with `[DONE]` (else it was cut short after delivering output).
    pub completed: bool,
    pub usage: Option<StoredUsage>,
}

#[derive(Debug, Clone, PartialEq, Eq, Serialize, Deserialize)]
pub struct StoredUsage {
    pub prompt: u64,
    pub completion: u64,
    pub total: u64,
    pub cached: u64,
    pub cost_microcents: u64,
    pub no_answer: bool,
    pub provider_reported: bool,
    /// `plan` or `standby` when one paid (the value is then in `plan_value_microcents`).
    #[serde(default)]
    pub paid_from: Option<String>,
    #[serde(default)]
    pub plan_value_microcents: u64,
}

impl StoredUsage {
    pub fn of(f: &UsageFigures, no_answer: bool) -> Self {
        StoredUsage {
            prompt: f.prompt_tokens,
            completion: f.completion_tokens,
            total: f.total_tokens,
            cached: f.cached_tokens,
            cost_microcents: f.cost.0,
            no_answer,
            provider_reported: f.basis == UsageBasis::ProviderReported,
            paid_from: f.paid.map(|(from, _)| from.as_str().to_string()),
            plan_value_microcents: f.paid.map_or(0, |(_, v)| v.0),
        }
    }

    pub fn priced(&self) -> PricedUsage {
        let basis = if self.provider_reported { UsageBasis::ProviderReported } else { UsageBasis::DeliveredFrames };
        let figures = UsageFigures {
            prompt_tokens: self.prompt,
            completion_tokens: self.completion,
            total_tokens: self.total,
            cached_tokens: self.cached,
            cost: Microcents(self.cost_microcents),
            basis,
            paid: self
                .paid_from
                .as_deref()
                .and_then(tollgate::money::usage::PaidFrom::parse)
                .map(|from| (from, Microcents(self.plan_value_microcents))),
        };
        PricedUsage { figures, no_answer: self.no_answer }
    }
}

impl Receipt {
    /// The receipt's `finish_reason`: the original's when it was cut short (`length`,
    /// `content_filter`), otherwise null (spec "Idempotent replay receipt").
    pub fn finish(&self) -> Option<&str> {
        self.finish_reason.as_deref().filter(|f| matches!(*f, "length" | "content_filter"))
    }

    pub fn meta(&self) -> ChunkMeta<'_> {
        ChunkMeta { id: self.id.as_deref().map(Into::into), created: self.created }
    }

    /// The pieces a translator renders the receipt from: no content, the finish reason; an
    /// original stream that ended early without one is `interrupted`, which the Responses
    /// dialect renders `incomplete` (decision 186).
    pub fn pieces(&self) -> Vec<Piece<'_>> {
        let finish = self.finish().or((!self.completed).then_some(crate::shared::answer::INTERRUPTED));
        finish.map(|f| Piece::Finish(f.into())).into_iter().collect()
    }

    fn replay_object(&self, status: u16) -> Value {
        let cost = self.usage.as_ref().map_or(0, |u| u.cost_microcents);
        let basis = match &self.usage {
            Some(u) if !u.provider_reported => "delivered_frames",
            _ => "provider_reported",
        };
        json!({
            "replayed": true,
            "streamed": true,
            "content_replayed": false,
            "regenerated": false,
            "billed_again": false,
            "original_status": status,
            "stream_outcome": if self.completed { "completed" } else { "interrupted" },
            "usage_basis": basis,
            "cost_microcents": cost,
            "detail": "This key's request already ran as a stream; its content is not sent again and nothing was billed again. The usage is what was settled.",
        })
    }

    /// The chat-envelope receipt (a non-streaming retry).
    pub fn chat_json(&self, status: u16) -> Vec<u8> {
        let body = json!({
            "id": self.id.clone().unwrap_or_else(|| "chatcmpl-replay".into()),
            "object": "chat.completion",
            "created": self.created.unwrap_or_else(|| jiff::Timestamp::now().as_second()),
            "model": self.model,
            "choices": [{ "index": 0, "message": { "role": "assistant", "content": null }, "finish_reason": self.finish() }],
            "idempotent_replay": self.replay_object(status),
        });
        with_usage(&body, self.usage.as_ref().map(|u| u.priced()))
    }

    /// The receipt as a short chat event stream (a streaming retry, clarification 7): one
    /// chunk with the receipt fields and `finish_reason`, the usage frame, `data: [DONE]`.
    pub fn chat_sse(&self, status: u16) -> Bytes {
        let created = self.created.unwrap_or_else(|| jiff::Timestamp::now().as_second());
        let id = self.id.clone().unwrap_or_else(|| "chatcmpl-replay".into());
        let chunk = json!({
            "id": id, "object": "chat.completion.chunk", "created": created, "model": self.model,
            "choices": [{ "index": 0, "delta": { "role": "assistant", "content": null }, "finish_reason": self.finish() }],
            "idempotent_replay": self.replay_object(status),
        });
        let mut out = BytesMut::new();
        out.extend_from_slice(b"data: ");
        out.extend_from_slice(chunk.to_string().as_bytes());
        out.extend_from_slice(b"\n\n");
        if let Some(u) = &self.usage {
            let frame = json!({ "id": id, "object": "chat.completion.chunk", "created": created, "model": self.model, "choices": [] });
            out.extend_from_slice(b"data: ");
            out.extend_from_slice(&with_usage(&frame, Some(u.priced())));
            out.extend_from_slice(b"\n\n");
        }
        out.extend_from_slice(b"data: [DONE]\n\n");
        out.freeze()
    }
}

/// `v` (an object) as JSON text with the chat Usage object appended, its `cost` in the fixed
/// eight-decimal form.
fn with_usage(v: &Value, u: Option<PricedUsage>) -> Vec<u8> {
    let mut out = v.to_string().into_bytes();
    if let (Some(u), Some(b'}')) = (u, out.last().copied()) {
        out.pop();
        out.extend_from_slice(b",\"usage\":");
        out.extend_from_slice(usage::render_chat_usage(&u.figures, u.no_answer).as_bytes());
        out.push(b'}');
    }
    out
}
