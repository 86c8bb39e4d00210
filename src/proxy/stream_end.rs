//! The end of a replica's answer as the response body filter sees it: at the body's end the
//! held answer is released, the replica slot freed and the time budgets disarmed; once the
//! client's stream has ended (`[DONE]` or an error frame) the replica gets a short grace to
//! end its body (decision 182) and the heartbeat stops. Also the response loop's timer phase
//! and the usage completed before the log hooks.

use pingora::{Error, ErrorSource, ErrorType, Result};

use crate::proxy::ctx::RequestCtx;

/// After the plugins have seen a body chunk (`delivering`: it carries bytes for the client).
pub(super) fn after_chunk(eos: bool, delivering: bool, cx: &mut RequestCtx) -> Result<()> {
    if eos {
        if let Some(h) = &cx.output {
            h.release(); // the body is good: what was held goes out before it
        }
        // The replica has answered: its slot frees now, before the client has the end of
        // the answer (not after settlement in the log phase), so a client's next request
        // finds the capacity this one used.
        if let Some(p) = cx.placement.as_mut() {
            p.slot = None;
        }
        cx.timers = None;
    } else if let Some(t) = cx.timers.as_mut() {
        if cx.response.saw_done {
            // The client's stream has ended (`[DONE]` or an error frame): the replica's body
            // must end soon after, or the client would wait for a terminator that never comes.
            t.stream_ended();
        } else if cx.failure.is_some() {
            t.quiet(); // an error frame follows
        } else if delivering {
            t.delivered();
        }
    }
    Ok(())
}

/// The client closed or reset its connection, or stopped reading (a write to it timed out),
/// or on HTTP/2 reset its stream or dropped the connection under it (`H2Error`): nothing more
/// can be written to it.
pub(super) fn client_left(e: &Error) -> bool {
    e.esource() == &ErrorSource::Downstream
        && matches!(
            e.etype(),
            ErrorType::ConnectionClosed
                | ErrorType::ReadError
                | ErrorType::WriteError
                | ErrorType::WriteTimedout
                | ErrorType::H2Error
        )
}

/// Complete the request's usage before any plugin's log hook runs (so the order of the log
/// hooks carries no meaning).
pub(super) fn complete_usage(s: &pingora::proxy::Session, cx: &mut RequestCtx) {
    // A stream whose client left (or stopped reading) delivered what its connection took,
    // not what the replica produced or the gateway still held (clarification 19).
    let mut cut_short = false;
    if cx.client_gone && cx.response.streaming {
        let took = cx.response.written.tokens(s.body_bytes_sent() as u64);
        cut_short = took < cx.response.delivered_tokens;
        cx.response.delivered_tokens = cx.response.delivered_tokens.min(took);
    }
    if let Some(model) = cx.model() {
        let completion = crate::money::request_usage::Completion {
            model,
            priced_at: cx.arrived_ms,
            prompt_estimate: cx.prompt_estimate,
            delivered_tokens: cx.response.delivered_tokens,
            cut_short,
            paid_from: cx.paid_from,
        };
        let mut usage = cx.usage; // `model` borrows the context
        usage.complete(&completion);
        cx.usage = usage;
    }
}

/// `response_timer_at` of the proxy.
pub(super) fn timer_at(cx: &RequestCtx) -> Option<std::time::Instant> {
    cx.timers.as_ref()?.next_at(cx.upstream_header_seen, cx.first_token_seen)
}

/// `response_timer` of the proxy: a ping written by the loop counts as bytes handed on, so
/// what the client was billed for stays tied to the bytes that carried tokens.
pub(super) fn on_timer(cx: &mut RequestCtx, written: u64) -> Result<Option<bytes::Bytes>> {
    let (header_seen, token_seen) = (cx.upstream_header_seen, cx.first_token_seen);
    let Some(t) = cx.timers.as_mut() else { return Ok(None) };
    let ping = t.on_timer(header_seen, token_seen)?;
    if let Some(p) = &ping {
        cx.response.written.padding(p.len() as u64, written);
    }
    Ok(ping)
}
