//! The one `ProxyHttp` implementation. It stays thin: route and read the request, run the
//! plugin chain per phase, place the request on a replica, and turn every failure into a
//! catalogued error (`fail_to_proxy` is the single exit for errors after `request_filter`).

use std::any::Any;
use std::panic::AssertUnwindSafe;
use std::sync::Arc;
use std::time::Duration;

use async_trait::async_trait;
use bytes::Bytes;
use futures_util::FutureExt;
use pingora::http::ResponseHeader;
use pingora::prelude::HttpPeer;
use pingora::protocols::Digest;
use pingora::proxy::{FailToProxy, ProxyHttp, Session};
use pingora::{Error, ErrorSource, ErrorType, Result};

use crate::config::{GatewaySettings, LiveConfig};
use crate::http::envelope;
use crate::http::error::{ErrorKind, GatewayError};
use crate::http::request;
use crate::http::responder;
use crate::http::routes::Route;
use crate::proxy::ctx::RequestCtx;
use crate::proxy::plugin::{Chain, Flow};
use crate::transport::held_output::OutputHold;
use timers::ResponseTimers;

mod affinity;
pub mod ctx;
mod failure;
mod forward;
pub mod health;
pub mod placement;
pub mod placement_sim;
pub mod plugin;
mod request_phase;
mod retry;
mod stream_end;
pub mod timers;
mod upstream_status;

use failure::{guarded, panicked};

/// Request headers never sent to a replica (besides the session headers): the client's
/// credentials and cookies, a compression the gateway would have to undo, `Expect`
/// (answered here). Constants, so the removal hashes without parsing each name.
const NOT_FORWARDED: [http::HeaderName; 5] = [
    http::header::ACCEPT_ENCODING,
    http::header::AUTHORIZATION,
    http::HeaderName::from_static("x-api-key"),
    http::header::EXPECT,
    http::header::COOKIE,
];

/// Whether a request header stays at the gateway: the client's credentials and cookies, what
/// the gateway settles with the client itself (`Accept-Encoding`, `Expect`), and every header
/// that may name a session.
fn not_forwarded(name: &http::HeaderName) -> bool {
    NOT_FORWARDED.contains(name) || crate::http::session::SESSION_HEADERS.contains(name)
}

pub struct Gateway {
    /// The catalog and pools in force; each request takes the current one when it starts.
    pub live: Arc<LiveConfig>,
    /// `tollgate.yaml`, fixed for the process.
    pub settings: Arc<GatewaySettings>,
    pub chain: Chain,
    /// Established sessions' replicas (in process, or shared on Redis by every instance).
    placements: Arc<dyn crate::state::placements::PlacementStore>,
    /// Request traces, when `tracing:` is configured (decision 215).
    traces: Option<Arc<crate::observe::traces::Exporter>>,
}

impl Gateway {
    pub fn new(
        live: Arc<LiveConfig>,
        chain: Chain,
        placements: Arc<dyn crate::state::placements::PlacementStore>,
    ) -> Self {
        let settings = live.current().gateway.clone();
        Gateway { live, settings, chain, placements, traces: None }
    }

    /// Export request traces through `exporter`.
    pub fn with_traces(mut self, exporter: Arc<crate::observe::traces::Exporter>) -> Self {
        self.traces = Some(exporter);
        self
    }
}

#[async_trait]
impl ProxyHttp for Gateway {
    /// Boxed: Pingora moves the context into its per-request future, which it copies whole
    /// into a box of its own for every request; a pointer is cheaper to copy than 984 bytes.
    type CTX = Box<RequestCtx>;

    fn new_ctx(&self) -> Box<RequestCtx> {
        Box::new(RequestCtx::new(self.live.current()))
    }

    fn persist_connection_context(&self, _s: &Session, cx: &Self::CTX) -> Option<Box<dyn Any + Send + Sync>> {
        forward::carried(cx).map(|h| Box::new(h) as Box<dyn Any + Send + Sync>)
    }

    fn on_connection_reuse(&self, _s: &mut Session, cx: &mut Self::CTX, prev: Box<dyn Any + Send + Sync>) {
        cx.carried_output = prev.downcast::<OutputHold>().ok().map(|h| *h);
    }

    async fn request_filter(&self, s: &mut Session, cx: &mut Self::CTX) -> Result<bool> {
        // A request the client pipelined behind this one is served after its answer, also when
        // the gateway answers this one itself (Pingora drops it otherwise; decision 158).
        if let pingora::protocols::http::ServerSession::H1(h1) = &mut *s.downstream_session {
            h1.set_pipelining_enabled(true);
        }
        crate::transport::connection_cap::mark_busy(&s.downstream_session);
        let outcome = match AssertUnwindSafe(self.handle(s, cx)).catch_unwind().await {
            Ok(outcome) => outcome,
            Err(p) => Err(panicked("request", &*p, &cx.request_id)),
        };
        match outcome {
            Ok(Flow::Continue | Flow::Forward(_)) => Ok(false),
            Ok(Flow::Handled) => Ok(true),
            Err(err) => {
                responder::error(s, cx, &err).await?;
                Ok(true)
            }
        }
    }

    async fn upstream_peer(&self, _s: &mut Session, cx: &mut Self::CTX) -> Result<Box<HttpPeer>> {
        let Some((slot, pool)) = cx.placement.as_ref().and_then(|p| Some((p.slot.as_ref()?, &p.pool))) else {
            return Error::e_explain(ErrorType::InternalError, "no replica placed");
        };
        let mut peer = pool.peer(&slot.replica);
        if let Some(trace) = crate::observe::traces::RequestTrace::sampled(&mut cx.trace) {
            trace.replica_started.get_or_insert_with(std::time::SystemTime::now);
        }
        peer.options.connection_timeout = Some(pool.connect_timeout);
        // No read timeout: the response loop's timers hold every budget (`timers.rs`). A read
        // timeout as long as the response budget (740 s) kept a timer of Pingora's wheel alive
        // per request for that long, done or not: ~7 MB at 200 requests/s once warm, and a
        // burst's timers for twelve minutes after it.
        peer.options.read_timeout = None;
        peer.options.write_timeout = Some(Duration::from_secs(30));
        peer.options.idle_timeout = Some(pool.idle_connection);
        Ok(Box::new(peer))
    }

    fn fail_to_connect(&self, _s: &mut Session, _peer: &HttpPeer, cx: &mut Self::CTX, mut e: Box<Error>) -> Box<Error> {
        if retry::after_connect_failure(&e, cx) {
            e.set_retry(true);
            return e;
        }
        cx.failure =
            Some(GatewayError::new(ErrorKind::UpstreamUnreachable, "No replica of the model could be reached."));
        e
    }

    fn error_while_proxy(
        &self,
        peer: &HttpPeer,
        s: &mut Session,
        e: Box<Error>,
        cx: &mut Self::CTX,
        _client_reused: bool,
    ) -> Box<Error> {
        let mut e = e.more_context(format!("Peer: {peer}"));
        retry::after_proxy_error(s, &mut e, cx, &self.settings.budgets);
        e
    }

    async fn connected_to_upstream(
        &self,
        _s: &mut Session,
        _reused: bool,
        _peer: &HttpPeer,
        _fd: std::os::unix::io::RawFd,
        _digest: Option<&Digest>,
        cx: &mut Self::CTX,
    ) -> Result<()> {
        let budgets = &self.settings.budgets;
        let response = cx.started + budgets.response;
        cx.timers = Some(if cx.stream {
            // A live replica sends a stream's header at once; each attempt gets the pool's time.
            let first_byte = cx.pool().map(|p| std::time::Instant::now() + p.first_byte_timeout);
            ResponseTimers::new(response, cx.started + budgets.first_token, first_byte)
        } else {
            // A non-streamed answer arrives whole after the generation: the response budget
            // is its only deadline.
            ResponseTimers::new(response, response, None)
        });
        Ok(())
    }

    async fn upstream_request_filter(
        &self,
        _s: &mut Session,
        req: &mut pingora::http::RequestHeader,
        cx: &mut Self::CTX,
    ) -> Result<()> {
        // The request's own names looked up in the lists (a handful, compared), not the
        // lists' sixteen removed from the request (each a hash and a probe of both maps).
        while let Some(name) = req.headers.keys().find(|n| not_forwarded(n)).cloned() {
            req.remove_header(&name);
        }
        if let Some(slot) = cx.placement.as_ref().and_then(|p| p.slot.as_ref()) {
            req.insert_header("host", slot.replica.authority.as_str())?;
        }
        if let Some(path) = cx.route.and_then(Route::upstream_path) {
            let uri = http::Uri::from_static(path);
            req.set_uri(uri);
        }
        if let Some(auth) = cx.pool().and_then(|p| p.authorization.as_deref()) {
            req.insert_header("authorization", auth)?;
        }
        if let Some(trace) = &mut cx.trace {
            if trace.sampled && trace.replica_call.is_none() {
                trace.replica_call = Some(format!("{} {}", req.method, req.uri.path()));
            }
            // The replica continues this trace under the gateway's replica-call span.
            req.insert_header("traceparent", trace.replica_traceparent())?;
            match &trace.tracestate {
                Some(state) => req.insert_header("tracestate", state.as_str())?,
                None => drop(req.remove_header("tracestate")),
            }
        }
        forward::upstream_header(req, cx)
    }

    async fn upstream_response_filter(
        &self,
        _s: &mut Session,
        resp: &mut ResponseHeader,
        cx: &mut Self::CTX,
    ) -> Result<()> {
        if resp.status.is_informational() {
            return Ok(());
        }
        let status = resp.status.as_u16();
        cx.response.upstream_status = Some(status);
        cx.upstream_header_seen = true;
        if let Some(p) = cx.placement.as_ref() {
            if let Some(replica) = p.ran_on.and_then(|i| p.pool.replicas.get(i)) {
                if status >= 500 {
                    crate::proxy::placement::failed(
                        &p.pool,
                        replica,
                        crate::proxy::placement::Fault::ServerError,
                        &cx.request_id,
                    );
                } else {
                    crate::proxy::placement::answered(replica);
                }
            }
        }
        if !upstream_status::judge(resp, cx)? {
            return Ok(()); // a refusal, rewritten once its message is read
        }
        // The answer's form, read once by the core: it decides how failures are written
        // (an error frame or a whole response) and which answers are held.
        cx.response.streaming = resp
            .headers
            .get(http::header::CONTENT_TYPE)
            .is_some_and(|v| v.as_bytes().starts_with(b"text/event-stream"));
        guarded("response header", cx, |cx| self.chain.on_response_header(resp, cx)).map_err(|e| {
            cx.failure = Some(e);
            Error::explain(ErrorType::InternalError, "response header phase failed")
        })
    }

    async fn response_filter(&self, s: &mut Session, resp: &mut ResponseHeader, cx: &mut Self::CTX) -> Result<()> {
        if resp.status.is_informational() {
            return Ok(());
        }
        if s.req_header().version == http::Version::HTTP_10 && resp.remove_header("transfer-encoding").is_some() {
            // An HTTP/1.0 client cannot read chunked framing: a body of unknown length ends
            // with the connection, and the header says so.
            resp.set_version(http::Version::HTTP_11);
            s.set_keepalive(None);
        }
        if cx.response.streaming && resp.status.is_success() {
            // A sized body cannot take extra bytes.
            if let Some(payload) = cx.heartbeat_payload.clone().filter(|_| !resp.headers.contains_key("content-length"))
            {
                if let Some(t) = cx.timers.as_mut() {
                    t.heartbeat(payload, self.settings.budgets.heartbeat);
                }
            }
        } else if cx.route.is_some_and(Route::is_generation) {
            // A non-streamed answer is judged when its body is complete: until then nothing
            // reaches the client, so a bad body can still become a clean 502. An HTTP/1
            // connection holds it in its socket wrapper, an HTTP/2 stream in the session
            // (`pingora-proxy-0.9.1-response-hold.patch`).
            if let Some(h) = &cx.output {
                // Without a length, an HTTP/1.1 client gets the body chunked.
                let chunked =
                    !resp.headers.contains_key("content-length") && s.req_header().version == http::Version::HTTP_11;
                h.hold(chunked);
            } else {
                s.hold_response_until_end();
            }
        }
        responder::common_headers(resp, cx)
    }

    fn response_body_filter(
        &self,
        s: &mut Session,
        body: &mut Option<Bytes>,
        eos: bool,
        cx: &mut Self::CTX,
    ) -> Result<Option<Duration>> {
        if cx.response.upstream_refused {
            if let Some(b) = body.take() {
                cx.response.body_buf.extend_from_slice(&b);
            }
            if eos {
                let err = request::refusal_from_upstream(&cx.response.body_buf);
                *body = Some(envelope::render(&err, cx.envelope, &cx.request_id).body);
            }
        } else if let Err(e) = guarded("response body", cx, |cx| {
            if eos {
                crate::runtime::faults::panic_point("response_end");
            } else if cx.response.delivered_tokens > 0 {
                crate::runtime::faults::panic_point("response_after_output");
            }
            self.chain.on_response_chunk(body, eos, cx)
        }) {
            cx.failure = Some(e);
            return Error::e_explain(ErrorType::InternalError, "response body phase failed");
        }
        if cx.response.streaming {
            if let Some(len) = body.as_ref().map(|b| b.len() as u64).filter(|&n| n > 0) {
                let written = s.body_bytes_sent() as u64;
                cx.response.written.handed(len, cx.response.delivered_tokens, written);
            }
        }
        stream_end::after_chunk(eos, body.as_ref().is_some_and(|b| !b.is_empty()), cx)?;
        Ok(None)
    }

    /// A request Pingora refused before any phase ran (a head it cannot parse, `CONNECT`) gets
    /// the chat dialect's envelope like every other answer (the route is unknown), then the
    /// connection closes (issue 49).
    fn refusal_response(&self, status: u16) -> Option<(ResponseHeader, Bytes)> {
        failure::refusal(status)
    }

    /// Pingora's own log lines about a request (its errors): the request line with a key-shaped
    /// path segment redacted (never a key in a log, issue 49).
    fn request_summary(&self, s: &Session, cx: &Self::CTX) -> String {
        let h = s.req_header();
        format!("{} {} {}", cx.request_id, h.method, crate::http::text::redacted_path(h.uri.path()))
    }

    fn suppress_error_log(&self, _s: &Session, cx: &Self::CTX, e: &Error) -> bool {
        // Expected outcomes are logged once, as an access line, in `logging`: a client that
        // left included (its line says `client_gone`); a replica's fault after a stream it had
        // ended has its own WARN line (decision 182).
        cx.failure.is_some() || cx.response.tail_fault || stream_end::client_left(e)
    }

    fn response_timer_at(&self, _s: &Session, cx: &Self::CTX) -> Option<std::time::Instant> {
        stream_end::timer_at(cx)
    }

    async fn response_timer(&self, s: &mut Session, cx: &mut Self::CTX) -> Result<Option<Bytes>> {
        stream_end::on_timer(cx, s.body_bytes_sent() as u64)
    }

    async fn fail_to_proxy(&self, s: &mut Session, e: &Error, cx: &mut Self::CTX) -> FailToProxy {
        if stream_end::client_left(e) {
            cx.client_gone = true;
            return FailToProxy { error_code: 0, can_reuse_downstream: false };
        }
        failure::answer(s, e, cx, &self.chain).await
    }

    async fn logging(&self, s: &mut Session, e: Option<&Error>, cx: &mut Self::CTX) {
        cx.timers = None;
        let status = failure::finish_output(s, cx).await;
        if e.is_some_and(|e| e.esource() == &ErrorSource::Downstream) {
            cx.client_gone = true;
        }
        stream_end::complete_usage(s, cx);
        self.chain.on_log(cx).await; // each hook's panic is caught and logged there
        cx.logged = true;
        crate::observe::metrics::record(&cx.finished(status));
        crate::transport::connection_cap::mark_idle(&s.downstream_session);
        failure::access_log(s, cx, status, self.settings.access_log_json);
        if let Some(traces) = &self.traces {
            traces.finish(cx, status);
        }
    }
}
