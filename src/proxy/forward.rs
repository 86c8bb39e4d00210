//! How a rewritten request body reaches the replica.
//!
//! The first request on a connection goes through the body replay (`body_replay.rs`): the
//! session is rebuilt over a socket wrapper that yields the new body and carries the
//! connection's output switch (`held_output.rs`). Rebuilding parses the header a second time
//! and costs about a quarter of what a bare Pingora proxy spends on a request. A later request on the same kept-alive
//! connection already reads and writes through that wrapper, so when its body fits Pingora's
//! retry buffer (64 KiB) the session is kept: Pingora sends the buffered body upstream through
//! `request_body_filter`, which swaps it for the rewritten one, and `upstream_request_filter`
//! gives the upstream header the new length (decision 192). Anything else (a body over 64 KiB,
//! `Expect: 100-continue`, a connection's first request) is replayed as before.

use bytes::Bytes;
use pingora::http::RequestHeader;
use pingora::protocols::http::ServerSession;
use pingora::proxy::Session;

use crate::ctx::RequestCtx;
use crate::error::GatewayError;
use crate::held_output::OutputHold;

/// Before the body is read: whether this request may be forwarded in place, and if so, keep
/// Pingora's copy of the body it reads (the retry buffer, sent upstream in place of a replay).
pub fn prepare(s: &mut Session, cx: &RequestCtx) -> bool {
    let wrapped = cx.carried_output.as_ref().is_some_and(OutputHold::is_passing);
    // A `100 Continue` written here turns keepalive off on this session; the replay restores it.
    let expects = s.req_header().headers.contains_key(http::header::EXPECT);
    let in_place = wrapped && !expects && matches!(*s.downstream_session, ServerSession::H1(_));
    if in_place {
        s.downstream_session.enable_retry_buffering();
    }
    in_place
}

/// Send `body` upstream instead of what the client sent: in place when `prepare` allowed it and
/// the whole body is in the retry buffer, otherwise by the replay.
pub async fn forward(
    s: &mut Session,
    cx: &mut RequestCtx,
    body: Bytes,
    keepalive: Option<u64>,
    in_place: bool,
) -> Result<(), GatewayError> {
    let buffered = !s.downstream_session.retry_buffer_truncated() && s.downstream_session.is_body_done();
    if let (true, true, Some(hold)) = (in_place, buffered, cx.carried_output.clone()) {
        cx.body_in_place = Some(body);
        cx.output = Some(hold);
        return Ok(());
    }
    let hold = OutputHold::default();
    let stall = cx.config.gateway.client.stalled_reader;
    crate::body_replay::replace_request_body(&mut s.downstream_session, body, keepalive, &hold, stall)
        .await
        .map_err(|e| GatewayError::internal(format!("could not forward the request body: {e}")))?;
    cx.output = Some(hold);
    Ok(())
}

/// The upstream header of a body forwarded in place: the rewritten body's length.
pub fn upstream_header(req: &mut RequestHeader, cx: &RequestCtx) -> pingora::Result<()> {
    if let Some(body) = &cx.body_in_place {
        req.remove_header(&http::header::TRANSFER_ENCODING);
        req.insert_header(http::header::CONTENT_LENGTH, body.len())?;
    }
    Ok(())
}

/// Pingora sends the retry buffer once per attempt at a replica (again after a failed
/// connect), always as the whole body: each time, the rewritten body goes instead.
pub fn body_chunk(body: &mut Option<Bytes>, cx: &RequestCtx) {
    if let Some(b) = &cx.body_in_place {
        *body = Some(b.clone());
    }
}

/// What the next request on this kept-alive connection inherits: the switch of the wrapper the
/// socket goes through (this request's, or the one it inherited if it replayed nothing).
pub fn carried(cx: &RequestCtx) -> Option<OutputHold> {
    cx.output.clone().or_else(|| cx.carried_output.clone())
}
