//! `Idempotency-Key` on the inference routes (chat completions, messages, Responses):
//! a retry with the same key runs and bills once (spec "Idempotency key" table,
//! clarifications 6 and 7).
//!
//! Priority 250: after the dialects (300) have translated the request and registered their
//! translator (a replay renders receipts with it), before the chat path (200), admission
//! (150) and the hold (100), so a replay or a conflict takes no slot, no hold and no charge.
//! In the response phases (which run in reverse) it sees the answer as the client gets it.
//! Requests without the header are not touched and cost nothing.

mod record;

use std::sync::Arc;

use async_trait::async_trait;
use bytes::Bytes;
use pingora::http::ResponseHeader;
use pingora::proxy::Session;
use sha2::{Digest, Sha256};

use record::{MAX_STORED_BODY, Receipt, Record, StoredUsage};
use tollgate::http::error::{ErrorKind, GatewayError};
use tollgate::proxy::ctx::RequestCtx;
use tollgate::proxy::plugin::{Flow, Plugin};
use tollgate::state::idempotency::{Begin, IdempotencyStore};

pub const IDEMPOTENCY_PRIORITY: i16 = 250;

/// Records are kept this long after settlement (clarification 6).
const KEEP_MS: u64 = 24 * 60 * 60 * 1000;

pub struct Idempotency {
    store: Arc<dyn IdempotencyStore>,
    /// TTL of a running request's lock (the limiter's lease TTL, decisions.md 94); renewed
    /// every third of it while the request runs.
    lock_ms: u64,
}

impl Idempotency {
    pub fn new(store: Arc<dyn IdempotencyStore>, lock_ms: u64) -> Self {
        Idempotency { store, lock_ms: lock_ms.max(300) }
    }
}

/// A lock this request holds, and what the response showed so far.
struct Held {
    key: String,
    fp: String,
    renewer: tokio::task::AbortHandle,
    streamed: bool,
    status: u16,
    content_type: Option<String>,
    body: Vec<u8>,
    too_large: bool,
    /// The non-streamed answer's body reached its end (it was produced, and charged, whole).
    complete: bool,
}

impl Drop for Held {
    fn drop(&mut self) {
        self.renewer.abort();
    }
}

/// The header's value: non-blank printable ASCII, at most 255 characters.
fn key_of(s: &Session) -> Result<Option<String>, GatewayError> {
    let Some(v) = s.req_header().headers.get(http::HeaderName::from_static("idempotency-key")) else { return Ok(None) };
    let v = v.as_bytes();
    if tollgate::http::text::printable_ascii(v, 255) && !v.trim_ascii().is_empty() {
        return Ok(Some(String::from_utf8_lossy(v).into_owned()));
    }
    Err(GatewayError::new(
        ErrorKind::InvalidIdempotencyKey,
        "Idempotency-Key must be non-blank printable ASCII of 255 characters or fewer.",
    )
    .with_param("Idempotency-Key"))
}

fn hex_sha256(parts: &[&[u8]]) -> String {
    let mut h = Sha256::new();
    for p in parts {
        h.update((p.len() as u64).to_be_bytes());
        h.update(p);
    }
    hex::encode(h.finalize())
}

fn unavailable(e: impl std::fmt::Display) -> GatewayError {
    log::warn!("idempotency store: {e}");
    GatewayError::new(
        ErrorKind::IdempotencyUnavailable,
        "The Idempotency-Key could not be checked; nothing was run or charged. Retry with the same key.",
    )
}

impl Idempotency {
    fn renewer(&self, key: String, lock: String) -> tokio::task::AbortHandle {
        let (store, lock_ms) = (self.store.clone(), self.lock_ms);
        tokio::spawn(async move {
            loop {
                tokio::time::sleep(std::time::Duration::from_millis(lock_ms / 3)).await;
                match store.renew(&key, &lock, lock_ms).await {
                    Ok(true) => {}
                    Ok(false) => return log::warn!("idempotency lock lost while its request runs"),
                    Err(e) => log::warn!("idempotency lock not renewed: {e}"),
                }
            }
        })
        .abort_handle()
    }

    async fn replay(&self, s: &mut Session, cx: &mut RequestCtx, rec: Record) -> Result<(), GatewayError> {
        if rec.too_large {
            return Err(GatewayError::new(
                ErrorKind::IdempotencyReplayUnavailable,
                format!(
                    "The original response is too large to replay; do not use a new key, contact support with request id {}.",
                    rec.request_id.as_deref().unwrap_or(&cx.request_id)
                ),
            ));
        }
        let (content_type, body) = match (&rec.body, &rec.receipt) {
            (Some(body), _) => {
                (rec.content_type.clone().unwrap_or_else(|| "application/json".into()), Bytes::from(body.clone()))
            }
            (None, Some(receipt)) => self.receipt(cx, receipt, rec.status),
            (None, None) => return Err(GatewayError::internal("an idempotency record without a response")),
        };
        cx.response_headers.push(("x-service-idempotent-replay", "true".into()));
        // A replay keeps the original's funding receipt, except on the Responses route, where
        // "only the header `X-Service-Idempotent-Replay` survives" (spec, Responses; decision 178).
        if cx.route != Some(tollgate::http::routes::Route::Responses) {
            cx.response_headers.extend(record::funding_headers(&rec.funding));
        }
        tollgate::http::responder::whole(s, cx, 200, &content_type, body, &[])
            .await
            .map_err(|e| GatewayError::internal(format!("write failed: {e}")))
    }

    /// A streamed original's receipt, in the form and dialect the retry asks for.
    fn receipt(&self, cx: &mut RequestCtx, r: &Receipt, status: u16) -> (String, Bytes) {
        let usage = r.usage.as_ref().map(|u| u.priced());
        let streaming =
            cx.body.as_ref().and_then(|b| b.get("stream")).and_then(serde_json::Value::as_bool) == Some(true);
        match cx.answer_translator.as_mut() {
            Some(t) if streaming => {
                let mut out = bytes::BytesMut::new();
                t.on_chunk(&r.meta(), &r.pieces(), &mut out);
                if let Some(u) = usage {
                    t.on_usage(u);
                }
                t.on_done(&mut out);
                ("text/event-stream".into(), out.freeze())
            }
            Some(t) => ("application/json".into(), Bytes::from(t.whole(&r.meta(), &r.pieces(), usage))),
            None if streaming => ("text/event-stream".into(), r.chat_sse(status)),
            None => ("application/json".into(), Bytes::from(r.chat_json(status))),
        }
    }

    /// The record of a finished request, or `None` when the key is to be released.
    fn record(cx: &RequestCtx, held: &Held) -> Option<Record> {
        let ok = (200..300).contains(&held.status);
        if !held.streamed {
            // An answer produced whole is recorded even if its client left before reading it:
            // it was charged, and the retry gets it without a second charge.
            if !ok || cx.failure.is_some() || !held.complete {
                return None;
            }
            // A body that is not text cannot be kept exactly: the retry gets 422, never a copy
            // that differs from what was charged for.
            let body = (!held.too_large).then(|| std::str::from_utf8(&held.body).ok().map(str::to_owned)).flatten();
            return Some(Record {
                fp: held.fp.clone(),
                status: held.status,
                streamed: false,
                too_large: body.is_none(),
                body,
                content_type: held.content_type.clone(),
                receipt: None,
                funding: record::funding_of(&cx.response_headers),
                request_id: Some(cx.request_id.clone()),
            });
        }
        // A stream that delivered nothing and billed nothing releases the key.
        let billed = cx.usage.figures().is_some_and(|u| u.value().0 > 0);
        if !ok || (cx.response.delivered_tokens == 0 && !billed) {
            return None;
        }
        let facts = cx.answer_facts.as_ref();
        let no_answer = !cx.response.answered.is_empty() && cx.response.answered.iter().all(|a| !a);
        Some(Record {
            fp: held.fp.clone(),
            status: held.status,
            streamed: true,
            too_large: false,
            body: None,
            content_type: None,
            receipt: Some(Receipt {
                id: facts.and_then(|f| f.id.clone()),
                created: facts.and_then(|f| f.created),
                model: cx.model().map(|m| m.id.clone()).unwrap_or_default(),
                finish_reason: facts.and_then(|f| f.finish_reason.clone()),
                completed: cx.response.saw_done && cx.failure.is_none(),
                usage: cx.usage.figures().map(|u| StoredUsage::of(&u, no_answer)),
            }),
            funding: record::funding_of(&cx.response_headers),
            request_id: Some(cx.request_id.clone()),
        })
    }
}

/// Routes an `Idempotency-Key` applies to: the inference routes (spec, Limits), whose answers
/// are JSON or SSE. count_tokens is answered by the dialects before this phase; speech answers
/// are audio bytes, which a record keeps as text, so they are not keyed (decision 161).
fn keyed(route: tollgate::http::routes::Route) -> bool {
    route.is_inference() && route != tollgate::http::routes::Route::AudioSpeech
}

#[async_trait]
impl Plugin for Idempotency {
    fn name(&self) -> &'static str {
        "idempotency"
    }

    fn priority(&self) -> i16 {
        IDEMPOTENCY_PRIORITY
    }

    async fn on_request(&self, s: &mut Session, cx: &mut RequestCtx) -> Result<Flow, GatewayError> {
        if !cx.route.is_some_and(keyed) {
            return Ok(Flow::Continue);
        }
        let Some(idem_key) = key_of(s)? else { return Ok(Flow::Continue) };
        let scope = cx.principal.as_ref().map_or("", |p| p.key_id.as_str());
        let key = format!("{scope}:{}", hex_sha256(&[idem_key.as_bytes()]));
        let req = s.req_header();
        let raw = cx.raw_body.clone().unwrap_or_default();
        let fp = hex_sha256(&[req.method.as_str().as_bytes(), req.uri.path().as_bytes(), &raw]);
        let lock = cx.request_id.clone();
        match self.store.begin(&key, &lock, self.lock_ms).await.map_err(unavailable)? {
            Begin::Running => Err(GatewayError::new(
                ErrorKind::IdempotencyConflict,
                "A request with this Idempotency-Key is still running; retry with the same key and body after Retry-After.",
            )),
            Begin::Settled(bytes) => {
                let rec: Record = serde_json::from_slice(&bytes).map_err(unavailable)?;
                if rec.fp != fp {
                    return Err(GatewayError::new(
                        ErrorKind::IdempotencyMismatch,
                        "This Idempotency-Key was used with a different method, route or body.",
                    )
                    .with_param("Idempotency-Key"));
                }
                self.replay(s, cx, rec).await?;
                Ok(Flow::Handled)
            }
            Begin::Started => {
                let renewer = self.renewer(key.clone(), lock);
                cx.answer_facts = Some(Default::default());
                cx.ext.insert(Held {
                    key,
                    fp,
                    renewer,
                    streamed: false,
                    status: 0,
                    content_type: None,
                    body: Vec::new(),
                    too_large: false,
                    complete: false,
                });
                Ok(Flow::Continue)
            }
        }
    }

    fn on_response_header(&self, resp: &mut ResponseHeader, cx: &mut RequestCtx) -> Result<(), GatewayError> {
        let streamed = cx.response.streaming;
        if let Some(h) = cx.ext.get_mut::<Held>() {
            h.status = resp.status.as_u16();
            h.streamed = streamed;
            h.content_type =
                resp.headers.get(http::header::CONTENT_TYPE).and_then(|v| v.to_str().ok()).map(str::to_owned);
        }
        Ok(())
    }

    fn on_response_chunk(&self, body: &mut Option<Bytes>, eos: bool, cx: &mut RequestCtx) -> Result<(), GatewayError> {
        let Some(h) = cx.ext.get_mut::<Held>() else { return Ok(()) };
        h.complete |= eos;
        if h.streamed || h.too_large {
            return Ok(());
        }
        if let Some(b) = body.as_ref() {
            if h.body.len() + b.len() > MAX_STORED_BODY {
                h.too_large = true;
                h.body = Vec::new();
            } else {
                h.body.extend_from_slice(b);
            }
        }
        Ok(())
    }

    async fn on_log(&self, cx: &mut RequestCtx) {
        let Some(held) = cx.ext.get::<Held>() else { return };
        held.renewer.abort();
        let (key, lock) = (held.key.clone(), cx.request_id.clone());
        let outcome = match Self::record(cx, held) {
            Some(rec) => match serde_json::to_vec(&rec) {
                Ok(bytes) => self.store.settle(&key, &lock, &bytes, KEEP_MS).await.map(drop),
                Err(e) => Err(tollgate::state::idempotency::RecordsError::Unavailable(e.to_string())),
            },
            None => self.store.release(&key, &lock).await,
        };
        if let Err(e) = outcome {
            // The lock then expires by itself within its TTL; a retry runs after that.
            log::warn!("{}: idempotency record not written: {e}", cx.request_id);
        }
    }
}
