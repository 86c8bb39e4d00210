//! Lease releases on Redis that ride with the next check (decision 148). A request's release
//! at the end of its log phase is queued; this gateway's next check sends the queued `ZREM`s
//! in front of its `EVALSHA`, in one pipeline, so a release costs no round trip of its own
//! under load. A release no check has carried goes in a pipeline of its own after
//! [`FLUSH_AFTER`].
//!
//! Order: a pipeline takes the queued releases and is handed to the connection in the same
//! poll, with no await in between, and Redis runs one connection's commands in the order they
//! were handed over. So when Redis runs a check, every release queued before the check began
//! has been applied, just ahead of it or earlier; on a runtime with one thread (the shipped
//! `threads: 1`) and a connection that is up, that holds without exception. With several
//! threads, a pipeline built on another thread in the same instant could reach the connection
//! a moment after the check: the check then counts that lease for one more check, which can
//! refuse only a gate that is exactly full. A client's request already races its previous
//! request's release when it uses a new connection (the answer is sent before the log phase
//! runs). Another gateway sees a release up to [`FLUSH_AFTER`] plus a round trip later than if
//! it were sent alone. A pipeline that fails puts its releases back at the front of the queue;
//! `ZREM` of a missing member does nothing, so sending one twice is harmless.

use std::collections::VecDeque;
use std::sync::atomic::{AtomicBool, AtomicU64, Ordering};
use std::sync::{Arc, Mutex};
use std::time::Duration;

use tokio::sync::Notify;

/// How long a queued release waits for a check to carry it.
pub const FLUSH_AFTER: Duration = Duration::from_millis(2);
/// Most releases one pipeline carries; the rest wait for the next.
pub const CARRY_MAX: usize = 64;
/// Most releases queued. Past it (Redis unreachable for a while) the oldest are dropped and
/// their slots free by the lease TTL, as for a gateway that died.
const QUEUE_MAX: usize = 10_000;

/// One released lease: its gates' Redis keys and its id.
struct Entry {
    gate_keys: Vec<String>,
    lease_id: std::sync::Arc<str>,
}

/// The releases a pipeline took, to put back if it fails.
pub struct Carried(Vec<Entry>);

#[derive(Default)]
pub struct Releases {
    queue: Mutex<VecDeque<Entry>>,
    wake: Notify,
    flusher_started: AtomicBool,
    dropped: AtomicU64,
}

impl Releases {
    /// Queue a release. Returns true once, for the first release ever: the caller then
    /// starts the flusher ([`Releases::flush_loop`]).
    pub fn push(&self, gate_keys: Vec<String>, lease_id: std::sync::Arc<str>) -> bool {
        {
            let mut q = self.queue.lock().unwrap_or_else(|e| e.into_inner());
            q.push_back(Entry { gate_keys, lease_id });
            if q.len() > QUEUE_MAX
                && q.pop_front().is_some()
                && self.dropped.fetch_add(1, Ordering::Relaxed) % 1000 == 0
            {
                log::warn!(
                    "limiter: {QUEUE_MAX} lease releases queued and Redis not taking them; the oldest are left to expire by their TTL"
                );
            }
        }
        self.wake.notify_one();
        !self.flusher_started.swap(true, Ordering::AcqRel)
    }

    /// Take the oldest queued releases, at most `max`, and append their `ZREM`s (ignored in
    /// the reply) to `pipe`. `None` when nothing is queued. Hand `pipe` to the connection
    /// before the next await (see the module comment).
    pub fn carry(&self, pipe: &mut redis::Pipeline, max: usize) -> Option<Carried> {
        let taken: Vec<Entry> = {
            let mut q = self.queue.lock().unwrap_or_else(|e| e.into_inner());
            let n = q.len().min(max);
            q.drain(..n).collect()
        };
        if taken.is_empty() {
            return None;
        }
        for e in &taken {
            for k in &e.gate_keys {
                pipe.zrem(k, &*e.lease_id).ignore();
            }
        }
        Some(Carried(taken))
    }

    /// The pipeline that carried these failed: they go back to the front, oldest first.
    pub fn put_back(&self, carried: Carried) {
        let mut q = self.queue.lock().unwrap_or_else(|e| e.into_inner());
        for e in carried.0.into_iter().rev() {
            q.push_front(e);
        }
        while q.len() > QUEUE_MAX {
            q.pop_back();
        }
    }

    pub fn len(&self) -> usize {
        self.queue.lock().unwrap_or_else(|e| e.into_inner()).len()
    }

    /// Sends what no check carried: woken by each release, it waits [`FLUSH_AFTER`] and sends
    /// what is still queued, until the queue is empty. `send` runs one pipeline and reports
    /// whether Redis answered it; after a failure it waits for the next release (a check that
    /// succeeds carries the queue too).
    pub async fn flush_loop<F, Fut>(self: Arc<Self>, send: F)
    where
        F: Fn(redis::Pipeline) -> Fut,
        Fut: std::future::Future<Output = bool>,
    {
        loop {
            self.wake.notified().await;
            loop {
                tokio::time::sleep(FLUSH_AFTER).await;
                let mut pipe = redis::pipe();
                let Some(carried) = self.carry(&mut pipe, CARRY_MAX) else { break };
                if !send(pipe).await {
                    self.put_back(carried);
                    break;
                }
            }
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn a_pipeline_takes_the_oldest_releases_and_a_failed_one_puts_them_back() {
        let r = Releases::default();
        assert!(r.push(vec!["g1".into(), "g2".into()], "a".into()));
        assert!(!r.push(vec!["g1".into()], "b".into()));
        r.push(vec!["g3".into()], "c".into());
        let mut first = redis::pipe();
        let carried = r.carry(&mut first, 2).unwrap();
        // a's two gates and b's one; c waits for the next pipeline.
        let sent: Vec<Vec<u8>> = first.cmd_iter().map(|c| c.get_packed_command()).collect();
        assert_eq!(sent.len(), 3);
        assert!(sent[0].ends_with(b"$2\r\ng1\r\n$1\r\na\r\n") && sent[2].ends_with(b"$1\r\nb\r\n"));
        assert_eq!(r.len(), 1);
        r.put_back(carried);
        let mut again = redis::pipe();
        let all = r.carry(&mut again, CARRY_MAX).unwrap();
        let order: Vec<&str> = all.0.iter().map(|e| &*e.lease_id).collect();
        assert_eq!((order, r.len()), (vec!["a", "b", "c"], 0));
        assert!(r.carry(&mut redis::pipe(), CARRY_MAX).is_none());
    }

    #[test]
    fn the_queue_is_bounded_and_drops_its_oldest() {
        let r = Releases::default();
        for i in 0..QUEUE_MAX + 5 {
            r.push(vec!["g".into()], format!("l{i}").into());
        }
        assert_eq!(r.len(), QUEUE_MAX);
        let mut pipe = redis::pipe();
        let taken = r.carry(&mut pipe, 1).unwrap();
        assert_eq!(&*taken.0[0].lease_id, "l5");
    }
}
