//! How the gateway's own background threads are scheduled beside Pingora's request threads.
//!
//! Only the ledger writer, on a thread of its own, uses it: no request thread ever changes
//! its policy or gives way.

use std::cell::Cell;
use std::time::{Duration, Instant};

/// Mark the calling thread `SCHED_BATCH` (Linux): the same share of the CPU as any other
/// thread, but waking it does not preempt the thread running on that core (decision 140).
///
/// The ledger writer is woken by request threads: by every hold, and by the first op of a
/// batch (since decision 193 a settlement queued during its linger wakes nothing; before it,
/// every settlement did). With the default policy each wake-up preempted the request thread
/// on a busy core, so the writer committed a batch of a few ops at a time and the core paid
/// two context switches per batch; as a batch thread it runs when the request thread waits
/// for the network or its time slice ends, and takes everything queued by then in one
/// transaction. On an idle core it still runs at once, so a lone request waits no longer for
/// its hold. The reverse does not hold: a request thread woken while the writer runs does not
/// preempt it either, which is why a long batch gives way ([`GivingWay`], decision 194).
///
/// Changing to `SCHED_BATCH` needs no privilege; if the kernel refuses (a seccomp filter, a
/// non-Linux system) the thread keeps the default policy and a warning says so.
pub fn run_as_batch(thread: &str) {
    #[cfg(target_os = "linux")]
    {
        let param = libc::sched_param { sched_priority: 0 };
        // SAFETY: `sched_setscheduler` on the calling thread (pid 0) with a valid, initialised
        // parameter; it reads `param` and changes nothing else.
        let rc = unsafe { libc::sched_setscheduler(0, libc::SCHED_BATCH, &param) };
        if rc != 0 {
            log::warn!("{thread}: SCHED_BATCH refused ({}); the default policy stays", std::io::Error::last_os_error());
        }
    }
    #[cfg(not(target_os = "linux"))]
    log::debug!("{thread}: no SCHED_BATCH on this system; the default policy stays");
}

/// How long a thread that gives way runs before it lets a waiting thread have the core.
pub const GIVE_WAY_EVERY: Duration = Duration::from_micros(100);

thread_local! {
    /// When this thread last gave way (or began to); `None` while it does not give way.
    static GAVE_WAY_AT: Cell<Option<Instant>> = const { Cell::new(None) };
    /// How many times this thread gave way (tests read it).
    static GAVE_WAY: Cell<u64> = const { Cell::new(0) };
}

/// While this guard lives, the calling thread gives way at each [`give_way`] point once it
/// has run [`GIVE_WAY_EVERY`] since it last did (decision 194).
///
/// The ledger writer commits a lingering batch, 1 ms of work at 5,000 requests/s, in one go.
/// A request thread woken meanwhile on the same core (its answer came back from the replica)
/// does not preempt it: the writer slept while that thread ran, so the scheduler counts the
/// core as owed to the writer and lets it finish its slice. One request in every batch then
/// waited the whole commit (the c=1 p99). Giving way is `sched_yield`: when nothing else
/// waits for the core it returns at once, and the yielder keeps its share of the CPU.
pub struct GivingWay {
    before: Option<Instant>,
}

impl GivingWay {
    /// Give way from now on if `on`; otherwise (and when the guard drops) as before.
    pub fn start(on: bool) -> GivingWay {
        let before = GAVE_WAY_AT.replace(on.then(Instant::now));
        GivingWay { before }
    }
}

impl Drop for GivingWay {
    fn drop(&mut self) {
        GAVE_WAY_AT.set(self.before);
    }
}

/// A point in long work where the calling thread may give way (see [`GivingWay`]); free
/// unless a guard is live on this thread, then a clock read.
pub fn give_way() {
    let Some(since) = GAVE_WAY_AT.get() else { return };
    if since.elapsed() >= GIVE_WAY_EVERY {
        std::thread::yield_now();
        GAVE_WAY.set(GAVE_WAY.get() + 1);
        GAVE_WAY_AT.set(Some(Instant::now()));
    }
}

/// How many times the calling thread gave way.
pub fn times_given_way() -> u64 {
    GAVE_WAY.get()
}

/// The calling thread's scheduling policy (`libc::SCHED_*`), for tests.
#[cfg(all(test, target_os = "linux"))]
fn policy() -> i32 {
    // SAFETY: `sched_getscheduler` on the calling thread reads no memory of ours.
    unsafe { libc::sched_getscheduler(0) }
}

#[cfg(all(test, target_os = "linux"))]
mod tests {
    use super::*;

    #[test]
    fn a_batch_thread_is_scheduled_as_batch_and_others_are_not() {
        let (before, after) = std::thread::spawn(|| {
            let before = policy();
            run_as_batch("test");
            (before, policy())
        })
        .join()
        .unwrap_or((-1, -1));
        assert_eq!(before, libc::SCHED_OTHER);
        assert_eq!(after, libc::SCHED_BATCH);
        assert_eq!(policy(), libc::SCHED_OTHER, "only the calling thread changes");
    }

    /// Work `for_us` microseconds, calling `give_way` all along; how many times it gave way.
    fn work_with_give_way_points(for_us: u64) -> u64 {
        let (before, end) = (times_given_way(), Instant::now() + Duration::from_micros(for_us));
        while Instant::now() < end {
            give_way();
        }
        times_given_way() - before
    }

    /// Call `give_way` until it gave way `times` times (or 2 s passed); how many times it did
    /// and in how long.
    fn give_way_points_until(times: u64) -> (u64, Duration) {
        let (before, started) = (times_given_way(), Instant::now());
        while times_given_way() - before < times && started.elapsed() < Duration::from_secs(2) {
            give_way();
        }
        (times_given_way() - before, started.elapsed())
    }

    #[test]
    fn a_thread_gives_way_only_while_its_guard_lives_and_once_per_period() {
        std::thread::spawn(|| {
            assert_eq!(work_with_give_way_points(500), 0, "no guard: never");
            {
                // Timed from before the guard starts: the periods count from its start.
                let began = Instant::now();
                let _g = GivingWay::start(true);
                let (n, _) = give_way_points_until(5);
                let took = began.elapsed();
                assert_eq!(n, 5, "gave way {n} times in {took:?}");
                // Each time after a full period of work since the last (or the guard's start).
                assert!(took >= GIVE_WAY_EVERY * 5, "gave way {n} times in {took:?}");
                {
                    let _off = GivingWay::start(false);
                    assert_eq!(work_with_give_way_points(300), 0, "a nested guard that is off");
                }
                assert_eq!(give_way_points_until(1).0, 1, "the outer guard is back in force");
            }
            assert_eq!(work_with_give_way_points(300), 0, "the guard dropped");
        })
        .join()
        .unwrap();
    }
}
