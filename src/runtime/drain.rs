//! What a graceful stop waits for: the requests in flight and the work they leave behind
//! after their answer (a settlement queued for the ledger's next commit, its retries). A stop
//! ends once both have been zero for a quiet second, instead of sleeping out the whole grace
//! period when nothing is left to finish (decision 166).

use std::sync::atomic::{AtomicUsize, Ordering};
use std::time::{Duration, Instant};

/// The process's counts.
pub static PROCESS: Counts = Counts::new();

/// Requests in flight and work left behind.
pub struct Counts {
    in_flight: AtomicUsize,
    left_behind: AtomicUsize,
}

/// How long nothing may be running before a stop ends: covers a request whose head was read
/// as the stop began, and the short flushes behind an answer (access lines, limiter releases).
pub const QUIET: Duration = Duration::from_secs(1);

/// One unit a stop waits for, counted while this value lives.
#[must_use = "the unit is counted only while this value lives"]
pub struct Tracked(&'static AtomicUsize);

impl Tracked {
    fn on(counter: &'static AtomicUsize) -> Tracked {
        counter.fetch_add(1, Ordering::Relaxed);
        Tracked(counter)
    }
}

impl Drop for Tracked {
    fn drop(&mut self) {
        self.0.fetch_sub(1, Ordering::Release);
    }
}

/// A request from the moment its head was read until its context is dropped (after `logging`).
pub fn request() -> Tracked {
    PROCESS.request()
}

/// Work a request left behind (e.g. its settlement until the ledger recorded it).
pub fn left_behind() -> Tracked {
    PROCESS.left_behind()
}

impl Counts {
    pub const fn new() -> Counts {
        Counts { in_flight: AtomicUsize::new(0), left_behind: AtomicUsize::new(0) }
    }

    pub fn request(&'static self) -> Tracked {
        Tracked::on(&self.in_flight)
    }

    pub fn left_behind(&'static self) -> Tracked {
        Tracked::on(&self.left_behind)
    }

    /// Requests in flight plus work left behind.
    pub fn busy(&self) -> usize {
        self.in_flight.load(Ordering::Acquire) + self.left_behind.load(Ordering::Acquire)
    }

    /// Block until `busy()` has read zero for `quiet` without a break (polled every 50 ms),
    /// or until `deadline`; whether it went quiet.
    pub fn wait_until_quiet(&self, quiet: Duration, deadline: Instant) -> bool {
        let mut quiet_since: Option<Instant> = None;
        loop {
            let now = Instant::now();
            if self.busy() == 0 {
                let since = *quiet_since.get_or_insert(now);
                if now.duration_since(since) >= quiet {
                    return true;
                }
            } else {
                quiet_since = None;
            }
            if now >= deadline {
                return false;
            }
            std::thread::sleep(Duration::from_millis(50));
        }
    }
}

impl Default for Counts {
    fn default() -> Self {
        Counts::new()
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn a_stop_waits_for_requests_and_left_behind_work_then_a_quiet_period() {
        static COUNTS: Counts = Counts::new();
        let request = COUNTS.request();
        let work = COUNTS.left_behind();
        assert_eq!(COUNTS.busy(), 2);
        let short = Instant::now() + Duration::from_millis(120);
        assert!(!COUNTS.wait_until_quiet(Duration::from_millis(10), short), "busy until the deadline");
        drop(request);
        assert_eq!(COUNTS.busy(), 1);
        let releaser = std::thread::spawn(move || {
            std::thread::sleep(Duration::from_millis(150));
            drop(work);
        });
        let began = Instant::now();
        let quiet = Duration::from_millis(200);
        assert!(COUNTS.wait_until_quiet(quiet, began + Duration::from_secs(10)));
        // Quiet only after the work ended and then the whole quiet period passed.
        assert!(began.elapsed() >= Duration::from_millis(150) + quiet, "{:?}", began.elapsed());
        let _ = releaser.join();
    }
}
