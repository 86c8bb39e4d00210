//! A proxied request's timers, run by the proxy's response loop (`ProxyHttp::response_timer`,
//! a vendored patch: Pingora runs filters only when bytes arrive):
//!
//! - the time budgets of a generation: the whole response, and for a stream the replica's
//!   response header (a live replica sends a stream's at once) and the first token. Pingora's
//!   `read_timeout` is per read, not a total (and is not set: see `upstream_peer`); at a
//!   deadline the loop ends with an upstream error, the replica's connection is dropped, and
//!   `fail_to_proxy` answers 504 (nothing sent yet) or writes the error frame (stream open);
//! - the tail: once the client's stream has ended (`[DONE]` or an error frame), the replica
//!   must end its body within [`TAIL_GRACE`] (decision 182);
//! - the heartbeat a dialect asks for (the messages dialect's `ping` every 15 s of silence),
//!   written by the loop as response body, so it takes its turn with the proxy's own writes on
//!   every kind of connection (plain, TLS).
//!
//! A write to a client that reads slowly holds the loop, so a deadline that passes during one
//! is met when the write ends (the write itself is bounded by `stalled_reader_seconds`).

use std::time::{Duration, Instant};

use bytes::Bytes;
use pingora::{Error, ErrorType, Result};

/// How long a replica has to end its HTTP body once its stream has ended (`[DONE]`, or the
/// gateway's error frame): a correct one ends it in the same write.
pub const TAIL_GRACE: Duration = Duration::from_secs(1);

/// Which budget ran out.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Fired {
    /// The replica sent no response header in time (it accepted the connection and hangs).
    FirstByte,
    FirstToken,
    Response,
    /// The stream had ended, but the replica did not end its body within [`TAIL_GRACE`].
    Tail,
}

/// The heartbeat of one stream.
#[derive(Debug)]
struct Heartbeat {
    payload: Bytes,
    every: Duration,
    /// When the loop next looks: moved only when it looks (a delivery does not reset the
    /// loop's timer, which would cost a timer-wheel update per chunk).
    check_at: Option<Instant>,
    /// The last bytes the client was sent; `None` before the first (no ping precedes the
    /// stream's opening event).
    last_sent: Option<Instant>,
}

/// The timers of one attempt at a replica.
#[derive(Debug)]
pub struct ResponseTimers {
    /// The response header's deadline, when it comes before the other budgets.
    first_byte: Option<Instant>,
    /// The first token's deadline, when it comes before the response budget.
    first_token: Option<Instant>,
    response: Instant,
    tail: Option<Instant>,
    fired: Option<Fired>,
    heartbeat: Option<Heartbeat>,
}

impl ResponseTimers {
    /// The budgets of an attempt: the whole response and the first token counted from the
    /// request's arrival, the response header from now.
    pub fn new(response: Instant, first_token: Instant, first_byte: Option<Instant>) -> Self {
        let first_token = (first_token < response).then_some(first_token);
        // Past the first-token deadline, that budget's own error says more.
        let first_byte = first_byte.filter(|&at| at < response && first_token.is_none_or(|t| at < t));
        ResponseTimers { first_byte, first_token, response, tail: None, fired: None, heartbeat: None }
    }

    /// Write `payload` to the client after every `every` without a delivery, once the first
    /// delivery was made.
    pub fn heartbeat(&mut self, payload: Bytes, every: Duration) {
        self.heartbeat = Some(Heartbeat { payload, every, check_at: None, last_sent: None });
    }

    /// No more pings (the stream is ending).
    pub fn quiet(&mut self) {
        self.heartbeat = None;
    }

    /// The budget that ran out, if one did.
    pub fn fired(&self) -> Option<Fired> {
        self.fired
    }

    /// Bytes reached the client (called per chunk handed on).
    pub fn delivered(&mut self) {
        if let Some(h) = self.heartbeat.as_mut() {
            let now = Instant::now();
            h.last_sent = Some(now);
            h.check_at.get_or_insert(now + h.every);
        }
    }

    /// The stream has ended for the client: no more pings, and the replica's body must end
    /// within [`TAIL_GRACE`]. Started once.
    pub fn stream_ended(&mut self) {
        self.heartbeat = None;
        self.tail.get_or_insert_with(|| Instant::now() + TAIL_GRACE);
    }

    /// When the loop should call [`Self::on_timer`] next.
    pub fn next_at(&self, header_seen: bool, token_seen: bool) -> Option<Instant> {
        if self.fired.is_some() {
            return None;
        }
        let budgets = [
            self.first_byte.filter(|_| !header_seen),
            self.first_token.filter(|_| !token_seen),
            Some(self.response),
            self.tail,
            self.heartbeat.as_ref().and_then(|h| h.check_at),
        ];
        budgets.into_iter().flatten().min()
    }

    /// The loop's timer went off: a budget that ran out ends the attempt with an upstream
    /// error (its kind kept in [`Self::fired`]); else a ping that is due is returned.
    pub fn on_timer(&mut self, header_seen: bool, token_seen: bool) -> Result<Option<Bytes>> {
        let now = Instant::now();
        let passed = |at: Option<Instant>| at.is_some_and(|at| at <= now);
        let fired = if passed(self.first_byte) && !header_seen {
            Some(Fired::FirstByte)
        } else if passed(self.first_token) && !token_seen {
            Some(Fired::FirstToken)
        } else if self.response <= now {
            Some(Fired::Response)
        } else if passed(self.tail) {
            Some(Fired::Tail)
        } else {
            None
        };
        if let Some(fired) = fired {
            self.fired = Some(fired);
            self.heartbeat = None;
            let (kind, what) = match fired {
                Fired::Tail => (ErrorType::ReadError, "replica body not ended after the stream ended"),
                _ => (ErrorType::ReadTimedout, "a time budget of the response ran out"),
            };
            return Err(Error::explain(kind, what).into_up());
        }
        let Some(h) = self.heartbeat.as_mut() else { return Ok(None) };
        let Some(last) = h.last_sent else { return Ok(None) };
        if now.duration_since(last) >= h.every {
            h.last_sent = Some(now);
            h.check_at = Some(now + h.every);
            return Ok(Some(h.payload.clone()));
        }
        h.check_at = Some(last + h.every);
        Ok(None)
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    fn at(ms: u64) -> Instant {
        Instant::now() + Duration::from_millis(ms)
    }

    #[test]
    fn the_earliest_pending_budget_is_next_and_a_seen_one_is_skipped() {
        let (r, t, b) = (at(10_000), at(5_000), at(1_000));
        let timers = ResponseTimers::new(r, t, Some(b));
        assert_eq!(timers.next_at(false, false), Some(b));
        assert_eq!(timers.next_at(true, false), Some(t));
        assert_eq!(timers.next_at(true, true), Some(r));
    }

    #[test]
    fn a_first_byte_deadline_past_the_first_token_one_is_dropped() {
        let (r, t) = (at(10_000), at(1_000));
        let timers = ResponseTimers::new(r, t, Some(at(2_000)));
        assert_eq!(timers.next_at(false, false), Some(t));
    }

    #[test]
    fn a_passed_budget_fires_once_as_an_upstream_error() {
        let mut timers = ResponseTimers::new(at(10_000), Instant::now(), None);
        let e = timers.on_timer(true, false).unwrap_err();
        assert_eq!(e.esource(), &pingora::ErrorSource::Upstream);
        assert_eq!(timers.fired(), Some(Fired::FirstToken));
        assert_eq!(timers.next_at(true, false), None, "nothing more after a firing");
        let mut seen = ResponseTimers::new(at(10_000), Instant::now(), None);
        assert!(seen.on_timer(true, true).unwrap().is_none(), "a token that arrived disarms its budget");
    }

    #[test]
    fn pings_start_after_the_first_delivery_and_follow_silence() {
        let mut timers = ResponseTimers::new(at(60_000), at(60_000), None);
        timers.heartbeat(Bytes::from_static(b"ping"), Duration::ZERO);
        assert!(timers.on_timer(true, true).unwrap().is_none(), "no ping before the stream opened");
        timers.delivered();
        assert_eq!(timers.on_timer(true, true).unwrap().as_deref(), Some(&b"ping"[..]));
        timers.stream_ended();
        assert!(timers.on_timer(true, true).unwrap().is_none(), "no ping after the stream's end");
    }

    #[test]
    fn a_recent_delivery_postpones_the_ping() {
        let mut timers = ResponseTimers::new(at(60_000), at(60_000), None);
        timers.heartbeat(Bytes::from_static(b"ping"), Duration::from_secs(15));
        timers.delivered();
        let first = timers.next_at(true, true).unwrap();
        assert!(timers.on_timer(true, true).unwrap().is_none());
        assert!(timers.next_at(true, true).unwrap() >= first);
    }

    #[test]
    fn the_tail_waits_its_grace() {
        let mut timers = ResponseTimers::new(at(60_000), at(60_000), None);
        timers.stream_ended();
        let tail = timers.next_at(true, true).unwrap();
        assert!(tail <= Instant::now() + TAIL_GRACE);
        assert!(timers.on_timer(true, true).unwrap().is_none(), "not before its grace");
    }
}
