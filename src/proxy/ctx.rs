//! The per-request context: one typed field per concern, filled in phase order. Every
//! plugin reads and writes it; `logging` reads it last. An `Option` here is `None` until
//! the phase that fills it has run (or when that phase does not apply to the route).

use std::sync::Arc;
use std::time::Instant;

use bytes::{Bytes, BytesMut};
use serde_json::Value;

use crate::config::{Config, ModelEntry, Pool};
use crate::http::envelope::Envelope;
use crate::http::error::GatewayError;
use crate::http::routes::Route;
use crate::http::sse::SseFramer;
use crate::money::request_usage::RequestUsage;
use crate::proxy::placement::Slot;

/// What the replica's response has shown so far (filled by the response phases).
#[derive(Debug, Default)]
pub struct ResponseState {
    /// Final status the replica answered with.
    pub upstream_status: Option<u16>,
    /// The replica answered 4xx: its body is collected and replaced by our 400.
    pub upstream_refused: bool,
    /// The replica answered an event stream (set by the core from its `Content-Type`).
    pub streaming: bool,
    /// Partial SSE frame carried between chunks.
    pub framer: SseFramer,
    /// Non-streamed body collected until the end.
    pub body_buf: BytesMut,
    /// Per choice index: final answer content (text or tool calls) was seen.
    pub answered: Vec<bool>,
    /// Output tokens delivered, for a response that reports no usage (clarification 13): one
    /// per content frame of a stream, or the answer text at four bytes a token.
    pub delivered_tokens: u64,
    /// `data: [DONE]` passed through.
    pub saw_done: bool,
    /// The priced usage-only frame of a chat stream, held until `[DONE]` goes out with it: a
    /// stream that ends in an error frame instead never quotes a cost.
    pub usage_frame: Option<bytes::Bytes>,
    /// The replica's body failed or stayed open after the client's stream had ended whole, or
    /// the tail timer shut its socket while a slow client took that end (decision 182): the
    /// request completed; logged once (WARN for the replica's fault), never as a failure.
    pub tail_fault: bool,
    /// Answer or reasoning text delivered to the client (bytes; fallback estimate).
    pub delivered_text_bytes: u64,
    /// Streams: when the first output token arrived, after the request's start.
    pub first_token_after: Option<std::time::Duration>,
    /// Streams: what reached the client's connection (clarification 19), see [`Written`].
    pub written: Written,
}

/// Which of a stream's output tokens the client's connection took (clarification 19: output
/// still queued in the gateway when the stream ends is not delivered). Each chunk handed to
/// Pingora is noted with the body bytes up to its end and the tokens counted by then; once
/// Pingora has written that many bytes, those tokens were delivered. Chunks known written are
/// dropped as they are, so only the few in flight are kept (a client that stops reading stops
/// the stream too: no more chunks are read from the replica).
#[derive(Debug, Default)]
pub struct Written {
    handed_bytes: u64,
    in_flight: std::collections::VecDeque<(u64, u64)>,
    tokens: u64,
}

impl Written {
    /// A chunk of `len` bytes was handed on, `tokens` counted so far; `written` body bytes
    /// had reached the connection.
    pub fn handed(&mut self, len: u64, tokens: u64, written: u64) {
        self.handed_bytes += len;
        self.in_flight.push_back((self.handed_bytes, tokens));
        self.confirm(written);
    }

    /// `len` bytes that carry no tokens (a heartbeat) were handed on.
    pub fn padding(&mut self, len: u64, written: u64) {
        let tokens = self.in_flight.back().map_or(self.tokens, |&(_, t)| t);
        self.handed(len, tokens, written);
    }

    /// Output tokens delivered once `written` body bytes reached the connection.
    pub fn tokens(&mut self, written: u64) -> u64 {
        self.confirm(written);
        self.tokens
    }

    fn confirm(&mut self, written: u64) {
        while let Some(&(end, tokens)) = self.in_flight.front() {
            if end > written {
                break;
            }
            self.tokens = tokens;
            self.in_flight.pop_front();
        }
    }
}

/// What placement resolved for one request, in one value: the catalog entry and its pool,
/// then the replica slot held and the replicas already tried.
pub struct Placement {
    pub model: Arc<ModelEntry>,
    pub pool: Arc<Pool>,
    /// The replica slot held for this request (released on drop); `None` before placement
    /// and after a replica failed to connect, until another is placed.
    pub slot: Option<Slot>,
    /// Replica indexes already tried (at most two are).
    pub tried: Vec<usize>,
    /// What names the request's conversation (its session or opening messages), if anything.
    pub affinity: Option<crate::http::session::Affinity>,
    /// The request had a preferred replica and was placed on another.
    pub spilled: bool,
    /// A replica slot was given at some point (the slot itself frees before logging).
    pub placed: bool,
    /// The replica the request prefers (its session's), if it has one.
    pub home: Option<usize>,
    /// The replica it last ran on (kept after the slot is freed, for the access log).
    pub ran_on: Option<usize>,
}

impl Placement {
    /// Resolved, not yet placed on a replica.
    pub fn new(model: Arc<ModelEntry>, pool: Arc<Pool>) -> Self {
        Placement {
            model,
            pool,
            slot: None,
            tried: Vec::new(),
            affinity: None,
            spilled: false,
            placed: false,
            home: None,
            ran_on: None,
        }
    }
}

pub struct RequestCtx {
    pub config: Arc<Config>,
    pub request_id: String,
    pub started: Instant,
    /// When the request arrived (Unix ms): the instant its usage is priced at, so a request
    /// made inside a model's free window is free however late it ends (decision 155).
    pub arrived_ms: crate::runtime::clock::Millis,
    /// `None` for a path that is not an endpoint.
    pub route: Option<Route>,
    pub envelope: Envelope,
    /// The authenticated caller (set by the auth plugin).
    pub principal: Option<crate::identity::Principal>,
    /// Validated `X-Client-Request-Id`, echoed back.
    pub client_request_id: Option<String>,
    /// The client's address: the TCP peer, or what a trusted proxy says (issue 52).
    pub client_ip: Option<std::net::IpAddr>,
    /// The request's trace, when tracing is configured (decision 215).
    pub trace: Option<crate::observe::traces::RequestTrace>,
    /// The request body was read to its end (so the connection can be kept).
    pub body_read: bool,
    /// The parsed request body (inference routes).
    pub body: Option<Value>,
    /// The request body as received (inference routes), for the request phase (e.g. a
    /// fingerprint); dropped once that phase has run.
    pub raw_body: Option<Bytes>,
    /// Where the request goes, once its `model` is resolved (inference routes).
    pub placement: Option<Placement>,
    /// The client asked for `stream: true`.
    pub stream: bool,
    /// Prompt tokens as estimated before generation (used when no usage report arrives).
    pub prompt_estimate: u64,
    /// What the chat serving path decided about the request, for the phases after it (written
    /// by `chat_completions` in its request phase; read by the chat response phases, admission
    /// and the billing hold). Default off the chat path.
    pub chat_request: ChatRequestFacts,
    /// The model was busy at admission: its shared in-flight count at the busy threshold of
    /// clarification 5 (written by `limits`; `billing` then refuses Standby, decision 103).
    pub model_busy: bool,
    /// What the answer said about itself, filled by the chat path as it reads the answer once
    /// a later phase asked for it by setting `Some` (the idempotency receipt).
    pub answer_facts: Option<AnswerFacts>,
    /// The translator of a request a dialect (messages, Responses) put on the chat path
    /// (written by the dialect's request phase; fed by the chat path's response phases, and
    /// by idempotency when it replays a receipt). `None`: the client reads chat completions.
    pub answer_translator: Option<Box<dyn crate::http::answer::AnswerTranslator>>,
    /// A plugin's own state by type (data one plugin keeps for its later phases; what plugins
    /// share is a typed field above). The core never looks inside.
    pub ext: Extensions,
    /// Headers added to the client response (e.g. `X-Service-Output-Clamped`).
    pub response_headers: Vec<(&'static str, String)>,
    /// A failure already classified by a phase, for `fail_to_proxy` to render.
    pub failure: Option<GatewayError>,
    /// A streamed attempt's budgets and heartbeat, run by the proxy's response loop.
    pub timers: Option<crate::proxy::timers::ResponseTimers>,
    /// The output switch of the client socket once the request body was forwarded, replayed or
    /// in place (`None` for requests answered by the gateway itself); see `held_output.rs`.
    pub output: Option<crate::transport::held_output::OutputHold>,
    /// On a kept-alive connection, the output switch of the socket wrapper an earlier request
    /// left in place (`proxy/forward.rs`).
    pub carried_output: Option<crate::transport::held_output::OutputHold>,
    /// A rewritten body forwarded without a replay: handed to Pingora as the request body
    /// (`replace_request_body`); its length goes in the upstream header.
    pub body_in_place: Option<Bytes>,
    /// What a dialect wants written to a silent stream every `budgets.heartbeat` (unframed).
    pub heartbeat_payload: Option<Bytes>,
    /// Set by the stream parser at the first content frame (ends the first-token budget).
    pub first_token_seen: bool,
    /// Set when the replica's response header arrives (ends the first-byte budget; read by
    /// the retry decision: a request that got no byte may go elsewhere).
    pub upstream_header_seen: bool,
    pub response: ResponseState,
    /// Usage of the response: reported by whoever reads the answer, completed once by the
    /// core before the log hooks (`money::request_usage`).
    pub usage: RequestUsage,
    /// A coding plan or Standby pays for this request (decided at admission): its usage
    /// shows cost 0 with the plan value and `paid_from`.
    pub paid_from: Option<crate::money::usage::PaidFrom>,
    /// The client went away before the response ended.
    pub client_gone: bool,
    /// `logging` ran.
    pub logged: bool,
    /// Counts this request for a graceful stop until the context is dropped.
    pub _in_flight: crate::runtime::drain::Tracked,
}

/// A map from type to value, for plugin state the core does not know (one value per type).
#[derive(Default)]
pub struct Extensions {
    map: Vec<Box<dyn std::any::Any + Send + Sync>>,
}

impl Extensions {
    /// Store `value`, replacing a value of the same type.
    pub fn insert<T: Send + Sync + 'static>(&mut self, value: T) {
        self.map.retain(|v| !v.is::<T>());
        self.map.push(Box::new(value));
    }

    pub fn get<T: 'static>(&self) -> Option<&T> {
        self.map.iter().find_map(|v| v.downcast_ref::<T>())
    }

    pub fn get_mut<T: 'static>(&mut self) -> Option<&mut T> {
        self.map.iter_mut().find_map(|v| v.downcast_mut::<T>())
    }
}

/// `req_` + a per-process random prefix + a counter: unique across instances without a
/// random draw (a syscall) per request.
pub fn next_request_id() -> String {
    use std::sync::OnceLock;
    use std::sync::atomic::{AtomicU64, Ordering};
    static PREFIX: OnceLock<u64> = OnceLock::new();
    static COUNTER: AtomicU64 = AtomicU64::new(0);
    let prefix = *PREFIX.get_or_init(|| {
        let b = uuid::Uuid::new_v4().into_bytes();
        u64::from_le_bytes([b[0], b[1], b[2], b[3], b[4], b[5], b[6], b[7]])
    });
    // `req_{prefix:016x}{counter:016x}`, without the formatting machinery (every request).
    let n = COUNTER.fetch_add(1, Ordering::Relaxed);
    let mut bytes = [0u8; 16];
    bytes[..8].copy_from_slice(&prefix.to_be_bytes());
    bytes[8..].copy_from_slice(&n.to_be_bytes());
    let mut digits = [0u8; 32];
    let mut id = String::with_capacity(36);
    id.push_str("req_");
    if hex::encode_to_slice(bytes, &mut digits).is_ok() {
        id.push_str(std::str::from_utf8(&digits).unwrap_or_default());
    }
    id
}

impl RequestCtx {
    /// Who paid, as a metrics and log label.
    pub fn funding_label(&self) -> &'static str {
        match (self.paid_from, self.usage.figures()) {
            (Some(p), _) => p.as_str(),
            (None, Some(u)) if u.cost.0 > 0 => "credits",
            _ => "none",
        }
    }

    /// The request as the metrics record it when it ends with `status`.
    pub fn finished(&self, status: u16) -> crate::observe::metrics::Finished<'_> {
        crate::observe::metrics::Finished {
            route: self.route,
            model: self.model().map_or("-", |m| m.id.as_str()),
            status,
            code: self.failure.as_ref().map_or("-", |f| f.kind.code()),
            elapsed: self.started.elapsed(),
            first_token_after: self.response.first_token_after,
            usage: self.usage.figures(),
            funding: self.funding_label(),
        }
    }

    /// The resolved model (`None` before resolution and on routes without one).
    pub fn model(&self) -> Option<&Arc<ModelEntry>> {
        self.placement.as_ref().map(|p| &p.model)
    }

    /// The resolved model's pool.
    pub fn pool(&self) -> Option<&Arc<Pool>> {
        self.placement.as_ref().map(|p| &p.pool)
    }

    pub fn new(config: Arc<Config>) -> Self {
        RequestCtx {
            config,
            request_id: next_request_id(),
            started: Instant::now(),
            arrived_ms: crate::runtime::clock::now_ms(),
            route: None,
            envelope: Envelope::Chat,
            principal: None,
            client_request_id: None,
            client_ip: None,
            trace: None,
            body_read: false,
            body: None,
            raw_body: None,
            placement: None,
            stream: false,
            prompt_estimate: 0,
            chat_request: ChatRequestFacts::default(),
            model_busy: false,
            answer_facts: None,
            answer_translator: None,
            ext: Extensions::default(),
            response_headers: Vec::new(),
            failure: None,
            timers: None,
            output: None,
            carried_output: None,
            body_in_place: None,
            heartbeat_payload: None,
            first_token_seen: false,
            upstream_header_seen: false,
            response: ResponseState::default(),
            usage: RequestUsage::default(),
            paid_from: None,
            client_gone: false,
            logged: false,
            _in_flight: crate::runtime::drain::request(),
        }
    }
}

impl Drop for RequestCtx {
    /// Pingora drops requests still running when the shutdown grace period ends without
    /// calling `logging`. The slot guard releases itself; what was delivered is recorded.
    fn drop(&mut self) {
        if !self.logged {
            log::warn!(
                "request {} dropped without logging (shutdown grace ended); usage {:?}",
                self.request_id,
                self.usage
            );
        }
    }
}

/// What the chat serving path decided about a request (see `RequestCtx::chat_request`).
#[derive(Debug, Default, Clone, Copy, PartialEq, Eq)]
pub struct ChatRequestFacts {
    /// The client asked for `stream_options.include_usage: true`.
    pub include_usage: bool,
    /// Output tokens the request may generate (`max_tokens` after clamping), when given.
    pub output_ceiling: Option<u64>,
}

/// What a replica's answer said about itself (see `RequestCtx::answer_facts`).
#[derive(Debug, Default, Clone, PartialEq, Eq)]
pub struct AnswerFacts {
    pub id: Option<String>,
    pub created: Option<i64>,
    /// The finish reason of the choice with index 0.
    pub finish_reason: Option<String>,
}

#[cfg(test)]
mod tests {
    /// `req_`, the process's prefix and the counter, each 16 lowercase hex digits.
    #[test]
    fn request_ids_are_the_prefix_and_a_counter_in_hex() {
        let (a, b) = (super::next_request_id(), super::next_request_id());
        for id in [&a, &b] {
            assert_eq!(id.len(), 36, "{id}");
            assert!(
                id.starts_with("req_") && id[4..].bytes().all(|c| c.is_ascii_digit() || (b'a'..=b'f').contains(&c))
            );
        }
        assert_eq!(a[..20], b[..20], "one prefix per process");
        let counter = |id: &str| u64::from_str_radix(&id[20..], 16).unwrap_or(u64::MAX);
        assert!(counter(&b) > counter(&a), "{a} {b}");
        assert_eq!(b, format!("{}{:016x}", &b[..20], counter(&b)));
    }
}
