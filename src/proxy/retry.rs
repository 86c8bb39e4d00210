//! Passive health and the one retry on another replica (decision 204). Every replica failure
//! the proxy sees (a refused or timed-out connect, a stream's header that never came, a reset,
//! a stream's missing first token, a 5xx answer) is counted against the replica, which is
//! ejected after enough of them in a row (`placement::failed`). A request that got no byte
//! from its replica is placed on another, once, while its budgets allow and its body can be
//! sent again; past that the failure is answered as before.

use std::time::Duration;

use pingora::proxy::Session;
use pingora::{Error, ErrorSource, ErrorType};

use super::timers::{Fired, ResponseTimers};
use crate::config::Budgets;
use crate::proxy::ctx::RequestCtx;
use crate::proxy::placement::{self, Fault};

/// A connect failure (`fail_to_connect`): count it, and place the request on another replica
/// if one is left. Whether it was placed again.
pub(super) fn after_connect_failure(e: &Error, cx: &mut RequestCtx) -> bool {
    let fault = match e.etype() {
        ErrorType::ConnectTimedout => Fault::ConnectTimeout,
        _ => Fault::Refused,
    };
    place_elsewhere(cx, fault)
}

/// An error while proxying (`error_while_proxy`): count it against the replica when it is the
/// replica's, and mark `e` for a retry when the request can go to another one.
pub(super) fn after_proxy_error(s: &Session, e: &mut Error, cx: &mut RequestCtx, budgets: &Budgets) {
    e.set_retry(false);
    let Some(fault) = replica_fault(e, cx) else { return };
    let no_byte = !cx.upstream_header_seen;
    let budget = if cx.stream { budgets.first_token } else { budgets.response };
    let retry = no_byte
        && matches!(fault, Fault::NoHeader | Fault::Reset)
        && cx.started.elapsed() + MIN_LEFT < budget
        && resendable(s, cx);
    if !retry {
        count(cx, fault);
        return;
    }
    if place_elsewhere(cx, fault) {
        e.set_retry(true);
    }
}

/// A retry needs at least this much of its budget left.
const MIN_LEFT: Duration = Duration::from_secs(1);

/// Which replica fault `e` is, if it is one: not the client's, not a budget the request ran
/// out of, and not a failure a phase already classified (a 5xx is counted when judged).
fn replica_fault(e: &Error, cx: &RequestCtx) -> Option<Fault> {
    if e.esource() != &ErrorSource::Upstream || cx.failure.is_some() || cx.response.saw_done {
        return None;
    }
    match cx.timers.as_ref().and_then(ResponseTimers::fired) {
        Some(Fired::FirstByte) => Some(Fault::NoHeader),
        Some(Fired::FirstToken) => Some(Fault::NoFirstToken),
        Some(Fired::Response | Fired::Tail) => None,
        // A non-streamed answer's read timeout is the response budget (`upstream_peer`).
        None if matches!(e.etype(), ErrorType::ReadTimedout | ErrorType::WriteTimedout) => None,
        None => Some(Fault::Reset),
    }
}

/// Pingora can send the body again: the rewritten body is sent in place, or its copy of the
/// replayed one is whole (64 KiB at most).
fn resendable(s: &Session, cx: &RequestCtx) -> bool {
    cx.body_in_place.is_some() || s.downstream_session.get_retry_buffer().is_some()
}

/// Count `fault` against the replica the request is on.
fn count(cx: &RequestCtx, fault: Fault) {
    if let Some(p) = &cx.placement {
        if let Some(replica) = p.ran_on.and_then(|i| p.pool.replicas.get(i)) {
            placement::failed(&p.pool, replica, fault, &cx.request_id);
        }
    }
}

/// Count `fault`, then move the request to another replica, if one is left to try.
fn place_elsewhere(cx: &mut RequestCtx, fault: Fault) -> bool {
    count(cx, fault);
    let Some(p) = cx.placement.as_mut() else { return false };
    if let Some(slot) = p.slot.take() {
        p.tried.push(slot.index);
    } else if let Some(i) = p.ran_on.filter(|i| !p.tried.contains(i)) {
        p.tried.push(i);
    }
    match placement::place_home(&p.pool, &p.tried, p.home) {
        Ok((next, spilled)) => {
            log::info!("{}: replica failed ({}), trying another", cx.request_id, fault.name());
            crate::observe::metrics::replica_retried(&p.pool.model_id, fault.name());
            p.ran_on = Some(next.index);
            p.slot = Some(next);
            p.spilled |= spilled;
            cx.upstream_header_seen = false;
            true
        }
        Err(_) => false,
    }
}
