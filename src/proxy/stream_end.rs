//! The end of a replica's answer as the response body filter sees it: at the body's end the
//! held answer is released, the replica slot freed and the time budgets disarmed; once the
//! client's stream has ended (`[DONE]` or an error frame) the replica gets a short grace to
//! end its body (decision 182) and the heartbeat stops.

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
