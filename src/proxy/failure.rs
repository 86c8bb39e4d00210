//! How a request that failed is answered, and what a held answer becomes at the end: the
//! classification of proxy errors no phase classified, the one place that writes an error
//! response, an error frame or a replacement for a held answer (`fail_to_proxy`), and panics
//! caught in phases.

use crate::proxy::plugin::Chain;
use std::panic::AssertUnwindSafe;
use std::time::Duration;

use pingora::http::ResponseHeader;
use pingora::proxy::{FailToProxy, Session};
use pingora::{Error, ErrorSource, ErrorType};

use super::timers::{Fired, ResponseTimers, TAIL_GRACE};
use crate::http::envelope;
use crate::http::error::{ErrorKind, GatewayError};
use crate::http::responder;
use crate::proxy::ctx::RequestCtx;
use crate::transport::held_output::OutputHold;

/// Classify a proxy error that no phase classified.
fn classify(e: &Error, cx: &RequestCtx) -> GatewayError {
    use ErrorType::*;
    if let Some(fired) = cx.timers.as_ref().and_then(ResponseTimers::fired) {
        return match fired {
            // A request the replica never answered, and that could not go to another (decision
            // 204): the replica failed, not the request's budget.
            Fired::FirstByte => GatewayError::new(
                ErrorKind::UpstreamFailed,
                "The model server accepted the request but did not start answering in time.",
            ),
            Fired::FirstToken => timeout_error("No token arrived within the first-token budget.", cx.stream),
            Fired::Response => timeout_error("The response did not finish within the response budget.", cx.stream),
            // Not reached in practice (`answer` ends a stream whose tail timer fired before
            // classifying); kept so every firing has its error.
            Fired::Tail => GatewayError::new(
                ErrorKind::UpstreamFailed,
                "The model server did not end its response after the stream ended.",
            ),
        };
    }
    match (e.etype(), e.esource()) {
        (ConnectTimedout | ConnectRefused | ConnectNoRoute | ConnectError | ConnectProxyFailure, _) => {
            GatewayError::new(ErrorKind::UpstreamUnreachable, "The model server could not be reached.")
        }
        (ReadTimedout | WriteTimedout, ErrorSource::Upstream) => {
            timeout_error("The model server did not answer within the response budget.", cx.stream)
        }
        (_, ErrorSource::Upstream) => {
            GatewayError::new(ErrorKind::UpstreamFailed, "The model server failed after the request was admitted.")
        }
        (etype, source) => {
            // Nothing classified it: the one line an operator gets about it (the error's own
            // log line is suppressed once the failure is set).
            log::warn!("{}: unclassified proxy error ({etype:?}, {source:?}): {e}", cx.request_id);
            GatewayError::internal("The gateway failed unexpectedly.")
        }
    }
}

/// `fail_to_proxy`: answer `e` (or the failure a phase already classified) in the form the
/// client can still receive: a whole error response, a replacement for a held answer, or an
/// error frame on a stream that already opened.
pub(super) async fn answer(s: &mut Session, e: &Error, cx: &mut RequestCtx, chain: &Chain) -> FailToProxy {
    if let Some(t) = cx.timers.as_mut() {
        t.quiet(); // no ping after our own write of the error frame or the body's end
    }
    let replica_side = e.esource() == &ErrorSource::Upstream || cx.response.tail_fault;
    if replica_side && cx.failure.is_none() && cx.response.streaming && cx.response.saw_done && header_sent(s) {
        // The client already has the whole stream, `[DONE]` included; only the replica's body
        // failed after it (broken framing, or held open past the tail grace). The client's
        // body ends properly and the request settles as the complete answer it was.
        // Already set: a slow client, not the replica (logged in `stream_end`).
        if !cx.response.tail_fault {
            let rid = &cx.request_id;
            match cx.timers.as_ref().and_then(ResponseTimers::fired) {
                Some(Fired::Tail) => log::warn!(
                    "{rid}: the model server's body did not end within {TAIL_GRACE:?} after its stream ended"
                ),
                _ => log::warn!("{rid}: the model server's body did not end cleanly after its stream ended: {e}"),
            }
        }
        cx.response.tail_fault = true; // no second (ERROR) line from Pingora
        let ended = end_body(s, None, cx).await;
        return FailToProxy { error_code: 200, can_reuse_downstream: ended };
    }
    let err = match cx.failure.take() {
        Some(err) => err,
        None => classify(e, cx),
    };
    // Whether the client has a complete response and may send its next request on this
    // connection (decision 158): Pingora then keeps it, as after a response that succeeded.
    let mut complete = false;
    let code = if replace_held(cx, &err) {
        // Nothing of the response had reached the client: all of it was replaced.
        err.status()
    } else if header_sent(s) {
        if cx.response.streaming && !cx.response.saw_done {
            let frame_err = match err.kind {
                ErrorKind::UpstreamFailed | ErrorKind::ResponseTimeout | ErrorKind::UpstreamHttpError => err.clone(),
                _ => GatewayError::new(ErrorKind::UpstreamStreamError, err.message.clone()),
            };
            // A translated stream (the Responses adapter) ends in its own grammar.
            let frame = chain
                .stream_failure_frame(&frame_err, cx)
                .unwrap_or_else(|| envelope::sse_error_frame(&frame_err, cx.envelope, &cx.request_id));
            complete = end_body(s, Some(frame), cx).await;
        } else if cx.response.streaming {
            // The stream already ended with its error frame: only the body's end is missing.
            complete = end_body(s, None, cx).await;
        }
        // A body that was not held (routes forwarded as they are) and already started cannot
        // change status: the connection is closed, so the client sees an incomplete response.
        200
    } else {
        let status = err.status();
        match responder::error(s, cx, &err).await {
            Ok(()) => complete = true,
            Err(we) => log::debug!("{}: error response not written: {we}", cx.request_id),
        }
        status
    };
    cx.failure = Some(err);
    // A failure on the client's side (its body's framing, say) leaves the connection unusable.
    let reusable = complete && e.esource() != &ErrorSource::Downstream;
    FailToProxy { error_code: code, can_reuse_downstream: reusable }
}

/// Write the last bytes of a stream the client already has the start of, and its end (the
/// chunked terminator), so the client sees a cleanly ended body; whether it was written.
/// Bounded: Pingora writes the terminator without a timeout, and a client that stopped reading
/// must not hold the request (and its settlement in `logging`) open.
async fn end_body(s: &mut Session, last: Option<bytes::Bytes>, cx: &RequestCtx) -> bool {
    match tokio::time::timeout(END_WRITE_LIMIT, s.write_response_body(last, true)).await {
        Ok(Ok(())) => true,
        Ok(Err(we)) => {
            log::debug!("{}: end of the stream not written: {we}", cx.request_id);
            false
        }
        Err(_) => {
            log::debug!("{}: end of the stream not written within {END_WRITE_LIMIT:?}", cx.request_id);
            false
        }
    }
}

/// How long the last write of a failed stream may take.
const END_WRITE_LIMIT: Duration = Duration::from_secs(5);

/// In `logging`: a held answer that never completed is replaced by an error, a replacement is
/// sent before the connection closes, and the switch is reset for a kept connection. Returns
/// the status the client saw (for the access line).
pub(super) async fn finish_output(s: &mut Session, cx: &mut RequestCtx) -> u16 {
    let mut status = s.response_written().map(|r| r.status.as_u16()).unwrap_or(0);
    // A held answer whose body never came to an end (no phase released or replaced it): the
    // client must not wait for it.
    let err = GatewayError::new(ErrorKind::UpstreamFailed, "The model server's answer did not complete.");
    if replace_held(cx, &err) {
        s.set_keepalive(None);
    }
    if let Some(h) = &cx.output {
        if h.is_replaced() {
            status = cx.failure.as_ref().map_or(500, GatewayError::status);
            // Pingora drops a connection it will not reuse without closing it: send the
            // replacement response first.
            let _ = tokio::time::timeout(Duration::from_secs(2), s.downstream_session.shutdown()).await;
        }
        h.finish();
    }
    status
}

/// While the answer is held, replace all of it with `err` as a whole response; `false` when
/// nothing is held (bytes of the answer may already be on the wire).
fn replace_held(cx: &mut RequestCtx, err: &GatewayError) -> bool {
    let Some(hold) = cx.output.clone().filter(OutputHold::is_holding) else { return false };
    responder::error_wire(cx, err).is_ok_and(|wire| hold.replace(wire))
}

/// A panic caught in a phase: logged once with its message, answered as `500 internal_error`
/// (never a dropped connection where a response can still be written).
pub(super) fn panicked(phase: &str, payload: &(dyn std::any::Any + Send), request_id: &str) -> GatewayError {
    let what = crate::runtime::faults::panic_text(payload);
    log::error!("{request_id}: panic in the {phase} phase: {what}");
    GatewayError::internal("The gateway failed unexpectedly.")
}

/// Run a synchronous phase, turning a panic into an internal error.
pub(super) fn guarded<T>(
    phase: &str,
    cx: &mut RequestCtx,
    f: impl FnOnce(&mut RequestCtx) -> Result<T, GatewayError>,
) -> Result<T, GatewayError> {
    match std::panic::catch_unwind(AssertUnwindSafe(|| f(&mut *cx))) {
        Ok(r) => r,
        Err(p) => Err(panicked(phase, &*p, &cx.request_id)),
    }
}

/// A budget ran out. The advice fits the request: a streamed one is already streaming
/// (decision 185).
fn timeout_error(what: &str, streamed: bool) -> GatewayError {
    let advice = if streamed {
        "Lower `max_tokens` or send a shorter prompt, or retry later."
    } else {
        "For non-streaming requests set `stream: true` or lower `max_tokens`."
    };
    GatewayError::new(ErrorKind::ResponseTimeout, format!("{what} {advice}"))
}

/// A replica answer that can carry no body: `204`, `304`, or a zero `Content-Length`.
pub(super) fn has_no_body(resp: &ResponseHeader) -> bool {
    matches!(resp.status.as_u16(), 204 | 304)
        || resp
            .headers
            .get("content-length")
            .and_then(|v| v.to_str().ok())
            .is_some_and(|v| v.trim().parse::<u64>() == Ok(0))
}

fn header_sent(s: &Session) -> bool {
    s.response_written().is_some_and(|r| !r.status.is_informational())
}

/// Write the access line of a finished request: JSON through the writer thread, or text.
pub(super) fn access_log(s: &Session, cx: &RequestCtx, status: u16, json: bool) {
    // The gateway's own fault: its message is logged at any access-log setting.
    if let Some(f) = cx.failure.as_ref().filter(|f| f.kind == ErrorKind::InternalError) {
        log::warn!("{}: internal error: {}", cx.request_id, f.message);
    }
    if json {
        let h = s.req_header();
        let bytes_in = h.headers.get("content-length").and_then(|v| v.to_str().ok()?.parse().ok());
        let path = crate::http::text::redacted_path(h.uri.path());
        let line = crate::observe::access_log::json_line(cx, status, &path, bytes_in, s.body_bytes_sent());
        crate::observe::access_log::write_json(line);
    } else {
        log::info!("{}", access_line(s, cx, status));
    }
}

/// The access log line of a finished request: id, method, path, status, error code, model,
/// time, usage, how it was placed (`session`, `opening` or `load`, `+spill` when it went to
/// another replica than its preferred one), the client's address and whether it left. Never
/// an identity.
fn access_line(s: &Session, cx: &RequestCtx, status: u16) -> String {
    let placed = cx.placement.as_ref().filter(|p| p.placed).map(|p| {
        let by = p.affinity.map_or(crate::http::session::PlacedBy::Load, |a| a.by).as_str();
        format!(" placed={by}{}", if p.spilled { "+spill" } else { "" })
    });
    format!(
        "{} {} {} status={} code={} model={} ms={} usage={:?}{} client={}{}",
        cx.request_id,
        s.req_header().method,
        crate::http::text::redacted_path(s.req_header().uri.path()),
        status,
        cx.failure.as_ref().map(|f| f.kind.code()).unwrap_or("-"),
        cx.model().map(|m| m.id.as_str()).unwrap_or("-"),
        cx.started.elapsed().as_millis(),
        cx.usage.figures(),
        placed.unwrap_or_default(),
        cx.client_ip.map_or_else(|| "-".to_string(), |ip| ip.to_string()),
        if cx.client_gone { " client_gone" } else { "" },
    )
}

/// The answer to a request Pingora refused before any phase ran (`refusal_response`).
pub(super) fn refusal(status: u16) -> Option<(ResponseHeader, bytes::Bytes)> {
    let err = if status == 405 {
        GatewayError::new(ErrorKind::MethodNotAllowed, "This method is not served here.")
    } else if status == 408 {
        GatewayError::new(ErrorKind::RequestTimeout, "The request head did not arrive in time.")
    } else {
        GatewayError::invalid_request(
            "request",
            "The request is not valid HTTP/1.1 (its request line, headers or framing); nothing was done.",
        )
    };
    let request_id = crate::proxy::ctx::next_request_id();
    let r = envelope::render(&err, envelope::Envelope::Chat, &request_id);
    let mut resp = ResponseHeader::build(r.status, Some(5)).ok()?;
    resp.insert_header("content-type", "application/json").ok()?;
    resp.insert_header("content-length", r.body.len()).ok()?;
    resp.insert_header("x-request-id", request_id.as_str()).ok()?;
    resp.insert_header("connection", "close").ok()?;
    log::info!("{request_id} refused before routing: status={status}");
    Some((resp, r.body))
}
