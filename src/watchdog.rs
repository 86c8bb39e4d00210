//! Time budgets of a generation: the replica's first byte (streams: a live replica sends its
//! response header at once), the first-token budget (streams) and the whole-response budget. Pingora's `read_timeout` is per read, not a total, so a timer task shuts the
//! upstream socket down at the deadline; the pending read then fails at once and
//! `fail_to_proxy` answers 504 (nothing sent yet) or writes the error frame (stream open).
//!
//! The timer works on a `dup` of the socket so the descriptor number cannot be reused by
//! another connection while the timer holds it. Exactly one side closes the dup: the timer
//! when it fires, or `disarm` when the response ended first (a compare-and-swap decides).

use std::os::fd::RawFd;
use std::sync::Arc;
use std::sync::atomic::{AtomicBool, AtomicU8, Ordering};

use tokio::task::JoinHandle;
use tokio::time::Instant;

const ARMED: u8 = 0;
const DISARMED: u8 = 1;
const FIRED_FIRST_TOKEN: u8 = 2;
const FIRED_RESPONSE: u8 = 3;
const FIRED_TAIL: u8 = 4;
const FIRED_FIRST_BYTE: u8 = 5;

/// How long a replica has to end its HTTP body once its stream has ended (`[DONE]`, or the
/// gateway's error frame): a correct one ends it in the same write.
pub const TAIL_GRACE: std::time::Duration = std::time::Duration::from_secs(1);

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

#[derive(Debug)]
pub struct Watchdog {
    state: Arc<AtomicU8>,
    fd: RawFd,
    task: JoinHandle<()>,
    /// The tail timer (`end_within`), once started.
    tail: Option<JoinHandle<()>>,
}

fn fire(state: &AtomicU8, fd: RawFd, why: u8) {
    if state.compare_exchange(ARMED, why, Ordering::AcqRel, Ordering::Acquire).is_ok() {
        // SAFETY: `fd` is our own dup, still open: only the winner of the exchange above
        // closes it, and that is this branch.
        unsafe {
            libc::shutdown(fd, libc::SHUT_RDWR);
            libc::close(fd);
        }
    }
}

impl Watchdog {
    /// Arm the budgets on the upstream socket `fd`. `first_byte` and `first_token` are checked
    /// only when given (streamed requests); each flag is set when that arrives (the response
    /// header; the first content frame, by the stream parser).
    pub fn arm(
        fd: RawFd,
        response_deadline: Instant,
        first_byte: Option<(Instant, Arc<AtomicBool>)>,
        first_token: Option<(Instant, Arc<AtomicBool>)>,
    ) -> Option<Watchdog> {
        // SAFETY: dup of a descriptor pingora holds open for the duration of this call.
        let dup = unsafe { libc::dup(fd) };
        if dup < 0 {
            log::warn!("watchdog: dup failed; budgets fall back to read timeouts");
            return None;
        }
        let state = Arc::new(AtomicU8::new(ARMED));
        let st = state.clone();
        let task = tokio::spawn(async move {
            if let Some((at, seen)) = first_byte {
                // Past the first-token deadline, that budget's own error says more.
                let first = first_token.as_ref().is_none_or(|(token_at, _)| at < *token_at);
                if first && at < response_deadline {
                    tokio::time::sleep_until(at).await;
                    if !seen.load(Ordering::Acquire) {
                        fire(&st, dup, FIRED_FIRST_BYTE);
                        return;
                    }
                }
            }
            if let Some((at, seen)) = first_token {
                if at < response_deadline {
                    tokio::time::sleep_until(at).await;
                    if !seen.load(Ordering::Acquire) {
                        fire(&st, dup, FIRED_FIRST_TOKEN);
                        return;
                    }
                }
            }
            tokio::time::sleep_until(response_deadline).await;
            fire(&st, dup, FIRED_RESPONSE);
        });
        Some(Watchdog { state, fd: dup, task, tail: None })
    }

    /// The stream has ended for the client: the replica's body must end within `grace`, or
    /// its socket is shut down (a replica that holds the connection open after `[DONE]` must
    /// not keep the client waiting out the response budget). Started once.
    pub fn end_within(&mut self, grace: std::time::Duration) {
        if self.tail.is_some() || self.state.load(Ordering::Acquire) != ARMED {
            return;
        }
        let (st, fd) = (self.state.clone(), self.fd);
        self.tail = Some(tokio::spawn(async move {
            tokio::time::sleep(grace).await;
            // A no-op after `disarm` (the exchange fails), so `fd` is never touched then.
            fire(&st, fd, FIRED_TAIL);
        }));
    }

    /// Stop the timer (the response ended in time). Safe to call more than once.
    pub fn disarm(&self) {
        if self.state.compare_exchange(ARMED, DISARMED, Ordering::AcqRel, Ordering::Acquire).is_ok() {
            self.stop_timers();
            // SAFETY: we won the exchange, so the timer will never touch `fd`.
            unsafe {
                libc::close(self.fd);
            }
        }
    }

    fn stop_timers(&self) {
        self.task.abort();
        if let Some(tail) = &self.tail {
            tail.abort();
        }
    }

    pub fn fired(&self) -> Option<Fired> {
        match self.state.load(Ordering::Acquire) {
            FIRED_FIRST_BYTE => Some(Fired::FirstByte),
            FIRED_FIRST_TOKEN => Some(Fired::FirstToken),
            FIRED_RESPONSE => Some(Fired::Response),
            FIRED_TAIL => Some(Fired::Tail),
            _ => None,
        }
    }
}

impl Drop for Watchdog {
    fn drop(&mut self) {
        self.disarm();
        // After one timer fired, `disarm` does nothing: the other would sleep on to its
        // deadline (the response budget, minutes) for a request already over.
        self.stop_timers();
    }
}
