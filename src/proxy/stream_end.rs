//! The end of a replica's answer as the response body filter sees it: at the body's end the
//! held answer is released, the replica slot freed and the time budgets disarmed; once the
//! client's stream has ended (`[DONE]` or an error frame) the replica gets a short grace to
//! end its body (decision 182); the heartbeat stops at whichever comes first.

use pingora::{Error, ErrorSource, ErrorType, Result};

use crate::ctx::RequestCtx;
use crate::watchdog::{Fired, TAIL_GRACE};

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
        if let Some(w) = &cx.watchdog {
            if w.fired() == Some(Fired::Tail) {
                // The replica did end its body, but only after the tail timer had shut its
                // socket (the client was slow to take the stream's end): failing here keeps
                // that connection out of Pingora's pool. The client's body still ends
                // cleanly (`failure::answer`), and the replica is not blamed for it.
                log::info!("{}: the client took the stream's end after the tail grace", cx.request_id);
                cx.response.tail_fault = true;
                return Error::e_explain(ErrorType::ReadError, "replica socket shut after the stream ended");
            }
            w.disarm();
        }
    } else if cx.response.saw_done {
        // The client's stream has ended (`[DONE]` or an error frame): the replica's body
        // must end soon after, or the client would wait for a terminator that never comes.
        if let Some(w) = cx.watchdog.as_mut() {
            w.end_within(TAIL_GRACE);
        }
    }
    if let Some(h) = &cx.heartbeat {
        if eos || cx.failure.is_some() || cx.response.saw_done {
            h.stop(); // the end, or `[DONE]` or an error frame already ended the stream
        } else if delivering {
            h.pulse.delivering();
        }
    }
    Ok(())
}

/// The client closed or reset its connection, or stopped reading (a write to it timed out):
/// nothing more can be written to it.
pub(super) fn client_left(e: &Error) -> bool {
    e.esource() == &ErrorSource::Downstream
        && matches!(
            e.etype(),
            ErrorType::ConnectionClosed | ErrorType::ReadError | ErrorType::WriteError | ErrorType::WriteTimedout
        )
}
