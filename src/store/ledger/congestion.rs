//! How long ledger ops wait for the writer, as the writer sees it: what sheds holds when the
//! ledger falls behind (decision 131).

use std::sync::atomic::{AtomicU64, Ordering};
use std::time::{Duration, Instant};

/// How long ops wait for the writer, as the writer sees it. Read by every hold, written once
/// per batch: two atomics, no lock.
pub(in crate::store) struct Congestion {
    epoch: Instant,
    /// Queue wait of the oldest op of the batch being applied or last applied (ms); 0 once
    /// the writer finds the queue empty.
    pub(in crate::store) seen_wait_ms: AtomicU64,
    /// 1 + the ms (since `epoch`) at which the batch being applied started; 0 when none is.
    pub(in crate::store) applying_since: AtomicU64,
}

impl Congestion {
    pub(in crate::store) fn new() -> Congestion {
        Congestion { epoch: Instant::now(), seen_wait_ms: AtomicU64::new(0), applying_since: AtomicU64::new(0) }
    }

    pub(in crate::store) fn ms(&self) -> u64 {
        u64::try_from(self.epoch.elapsed().as_millis()).unwrap_or(u64::MAX - 1)
    }

    /// The longer of the last queue wait seen and how long the running batch has taken: a
    /// store stalled mid-batch sheds holds too, before the queue shows it.
    pub(in crate::store) fn wait(&self) -> Duration {
        let seen = self.seen_wait_ms.load(Ordering::Relaxed);
        let since = self.applying_since.load(Ordering::Relaxed);
        let running = if since == 0 { 0 } else { self.ms().saturating_sub(since - 1) };
        Duration::from_millis(seen.max(running))
    }
}
