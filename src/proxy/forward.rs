//! How a rewritten request body reaches the replica.
//!
//! The body is read before `upstream_peer` (routing needs `model`) and rewritten, and Pingora
//! then sends it in place of what the client sent (`replace_request_body`, a vendored
//! pingora-core patch), with the upstream header's `Content-Length` set to its length.
//!
//! An HTTP/2 request always goes that way. An HTTP/1 connection's first request goes through
//! the body replay instead (`body_replay.rs`): the session is rebuilt over a socket wrapper
//! that carries the connection's output switch (`held_output.rs`) and times writes by
//! progress. Rebuilding parses the header a second time and costs about a quarter of what a
//! bare Pingora proxy spends on a request; a later request on the same kept-alive connection
//! already goes through that wrapper and is sent in place (decision 192). `Expect:
//! 100-continue` is replayed (a `100 Continue` written here turns keepalive off).

use bytes::Bytes;
use pingora::http::RequestHeader;
use pingora::protocols::http::ServerSession;
use pingora::proxy::Session;

use crate::http::error::GatewayError;
use crate::proxy::ctx::RequestCtx;
use crate::transport::held_output::OutputHold;

/// Before the body is read: whether this request's rewritten body may be sent in place.
pub fn prepare(s: &Session, cx: &RequestCtx) -> bool {
    match &*s.downstream_session {
        ServerSession::H2(_) => true,
        ServerSession::H1(_) => {
            let wrapped = cx.carried_output.as_ref().is_some_and(OutputHold::is_passing);
            wrapped && !s.req_header().headers.contains_key(http::header::EXPECT)
        }
        _ => false,
    }
}

/// Send `body` upstream instead of what the client sent: in place when `prepare` allowed it
/// (the whole body was read by now), otherwise by the replay.
pub async fn forward(
    s: &mut Session,
    cx: &mut RequestCtx,
    body: Bytes,
    keepalive: Option<u64>,
    in_place: bool,
) -> Result<(), GatewayError> {
    if in_place && matches!(*s.downstream_session, ServerSession::H2(_)) && !s.downstream_session.is_body_done() {
        // The body was read to its end, so a stream not at its end now was reset, or its
        // connection closed, by the client: it left before the request went upstream (there is
        // no replay for HTTP/2 to fall back on).
        cx.client_gone = true;
        return Err(GatewayError::invalid_request(
            "body",
            "The client closed its stream before the request was forwarded; nothing was done.",
        ));
    }
    if in_place && s.downstream_session.is_body_done() && s.downstream_session.replace_request_body(body.clone()) {
        // An HTTP/1 connection's wrapper holds non-streamed answers; HTTP/2 streams have none.
        cx.output = cx.carried_output.clone().filter(|_| matches!(*s.downstream_session, ServerSession::H1(_)));
        cx.body_in_place = Some(body);
        return Ok(());
    }
    let hold = OutputHold::default();
    let stall = cx.config.gateway.client.stalled_reader;
    crate::transport::body_replay::replace_request_body(&mut s.downstream_session, body, keepalive, &hold, stall)
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

/// What the next request on this kept-alive connection inherits: the switch of the wrapper the
/// socket goes through (this request's, or the one it inherited if it replayed nothing).
pub fn carried(cx: &RequestCtx) -> Option<OutputHold> {
    cx.output.clone().or_else(|| cx.carried_output.clone())
}
