//! Holding a non-streamed response until its body is known to be good.
//!
//! Pingora writes (and, for a chunked body, flushes) the response header as soon as the
//! replica's header arrives, but a non-streamed answer is only judged once its whole body is
//! in: an empty body, text that is not JSON, or JSON that is not a chat completion must reach
//! the client as `502 upstream_error` (clarification 11), not as a 200 cut short. So the
//! client socket of a rewritten request goes through [`OutputHold`]: while it holds, writes
//! are kept in memory; at the end of a good body it is released and the kept bytes go out
//! first; on a failure they are replaced by a complete error response and everything Pingora
//! writes after that is dropped (the connection then closes).
//!
//! The state is shared between the socket wrapper (`body_replay::PrefixedStream`, which
//! writes) and the request context (which switches it from the proxy phases). Both run on the
//! request's task, one after the other, so the lock is never contended.

use std::sync::{Arc, Mutex, MutexGuard};

#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Mode {
    /// Writes go to the socket (after any bytes still queued).
    Pass,
    /// Writes are kept in memory; flushes do nothing.
    Hold,
    /// The held answer is good and its end is being written: writes still gather in memory,
    /// and the flush that ends the body sends everything in one write (one `send` for head,
    /// body and chunk terminator instead of three).
    Gather,
    /// The queued bytes go to the socket; later writes are dropped.
    Replaced,
}

#[derive(Debug)]
pub struct HoldState {
    pub mode: Mode,
    /// The held answer goes out chunked (its end is the `0\r\n\r\n` terminator).
    pub chunked: bool,
    /// Bytes to write to the socket before anything else (what was held, or the replacement).
    pub queued: Vec<u8>,
}

/// One connection's output switch (see the module comment).
#[derive(Debug, Clone)]
pub struct OutputHold(Arc<Mutex<HoldState>>);

impl Default for OutputHold {
    fn default() -> Self {
        OutputHold(Arc::new(Mutex::new(HoldState { mode: Mode::Pass, chunked: false, queued: Vec::new() })))
    }
}

impl OutputHold {
    /// The state, for the socket wrapper. A poisoned lock (a panic while it was held) still
    /// gives the state: every change to it is a single assignment.
    pub fn lock(&self) -> MutexGuard<'_, HoldState> {
        self.0.lock().unwrap_or_else(|p| p.into_inner())
    }

    /// Keep the next writes in memory; `chunked`: the answer's body will be chunked.
    pub fn hold(&self, chunked: bool) {
        let mut s = self.lock();
        if s.mode == Mode::Pass {
            s.mode = Mode::Hold;
            s.chunked = chunked;
        }
    }

    /// The body is good: what was held, and the end of the body, go to the client together.
    pub fn release(&self) {
        let mut s = self.lock();
        if s.mode == Mode::Hold {
            s.mode = Mode::Gather;
        }
    }

    /// In `Gather`: whether a flush now should send (the body's end is in, or it has no marker
    /// to wait for). Sending early is always safe; it only costs a write.
    pub fn end_gathered(s: &HoldState) -> bool {
        !s.chunked || s.queued.ends_with(b"0\r\n\r\n")
    }

    /// While holding: drop what was held, send `response` instead, and drop everything written
    /// after it. `false` when nothing is held (the client may already have bytes of the
    /// response, so it cannot be replaced).
    pub fn replace(&self, response: Vec<u8>) -> bool {
        let mut s = self.lock();
        if s.mode != Mode::Hold {
            return false;
        }
        s.queued = response;
        s.mode = Mode::Replaced;
        true
    }

    /// The request ended: a connection that is kept goes back to passing writes through.
    /// Held bytes of a response that never completed are dropped (such a connection is closed).
    pub fn finish(&self) {
        let mut s = self.lock();
        if s.mode == Mode::Hold {
            s.queued.clear();
        }
        // A gathered end not flushed yet stays queued: the next write sends it first.
        if s.mode != Mode::Replaced {
            s.mode = Mode::Pass;
        }
    }

    /// Writes go straight through (no answer is held or replaced).
    pub fn is_passing(&self) -> bool {
        self.lock().mode == Mode::Pass
    }

    pub fn is_holding(&self) -> bool {
        self.lock().mode == Mode::Hold
    }

    /// The answer was replaced by an error response (the connection is then closed).
    pub fn is_replaced(&self) -> bool {
        self.lock().mode == Mode::Replaced
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn a_released_chunked_answer_is_sent_at_its_terminator() {
        let h = OutputHold::default();
        h.hold(true);
        h.lock().queued.extend_from_slice(b"HTTP/1.1 200 OK\r\n\r\n");
        h.release();
        h.lock().queued.extend_from_slice(b"5\r\nhello\r\n");
        assert_eq!(h.lock().mode, Mode::Gather);
        assert!(!OutputHold::end_gathered(&h.lock()), "the body chunk's flush waits");
        h.lock().queued.extend_from_slice(b"0\r\n\r\n");
        assert!(OutputHold::end_gathered(&h.lock()), "the terminator's flush sends");
        let sized = OutputHold::default();
        sized.hold(false);
        sized.release();
        assert!(OutputHold::end_gathered(&sized.lock()), "a body without chunks sends at its first flush");
    }

    #[test]
    fn held_bytes_are_released_or_replaced_never_both() {
        let h = OutputHold::default();
        h.hold(true);
        h.lock().queued.extend_from_slice(b"header");
        assert!(h.is_holding());
        assert!(h.replace(b"error".to_vec()));
        assert_eq!(h.lock().queued, b"error");
        assert_eq!(h.lock().mode, Mode::Replaced);
        h.release();
        assert_eq!(h.lock().mode, Mode::Replaced, "a replaced response stays replaced");
        assert!(!h.replace(b"again".to_vec()));
    }

    #[test]
    fn nothing_held_cannot_be_replaced() {
        let h = OutputHold::default();
        assert!(!h.replace(b"error".to_vec()));
        h.hold(true);
        h.release();
        assert!(!h.replace(b"error".to_vec()), "released bytes may already be on the wire");
    }

    #[test]
    fn finish_drops_an_unfinished_hold() {
        let h = OutputHold::default();
        h.hold(false);
        h.lock().queued.extend_from_slice(b"partial");
        h.finish();
        let s = h.lock();
        assert_eq!(s.mode, Mode::Pass);
        assert!(s.queued.is_empty());
    }
}
