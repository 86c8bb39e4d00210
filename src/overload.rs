//! How late the request runtime runs what is ready (decision 134). A probe task sleeps
//! [`PERIOD`] again and again and records how much later than asked it woke. When every
//! worker is busy, ready requests queue behind each other and that lateness is their wait:
//! admission sheds new requests while it is above `limits.max_event_loop_lag_ms`, so a
//! closed-loop client population larger than the node can serve gets quick refusals instead
//! of a queue that grows with the number of connections.

use std::sync::OnceLock;
use std::sync::atomic::{AtomicU64, Ordering};
use std::time::{Duration, Instant};

/// How often the probe wakes.
pub const PERIOD: Duration = Duration::from_millis(10);

struct Probe {
    epoch: Instant,
    /// Lateness of the last wake-up (ms).
    lag_ms: AtomicU64,
    /// When the probe last woke (ms since `epoch`).
    woke_ms: AtomicU64,
}

static PROBE: OnceLock<Probe> = OnceLock::new();

fn ms(d: Duration) -> u64 {
    u64::try_from(d.as_millis()).unwrap_or(u64::MAX)
}

/// Start the probe on the runtime this is called from, once per process. Call it from a
/// request's task: the probe then measures the runtime that serves requests.
pub fn watch() {
    if PROBE.get().is_some() {
        return;
    }
    let mut first = false;
    let probe = PROBE.get_or_init(|| {
        first = true;
        Probe { epoch: Instant::now(), lag_ms: AtomicU64::new(0), woke_ms: AtomicU64::new(0) }
    });
    if first && tokio::runtime::Handle::try_current().is_ok() {
        tokio::spawn(run(probe));
    }
}

async fn run(p: &'static Probe) {
    loop {
        let asked = Instant::now();
        tokio::time::sleep(PERIOD).await;
        p.lag_ms.store(ms(asked.elapsed().saturating_sub(PERIOD)), Ordering::Relaxed);
        p.woke_ms.store(ms(p.epoch.elapsed()), Ordering::Relaxed);
    }
}

/// Past this without a wake-up the probe is taken for gone (its runtime shut down), not late.
const GONE: Duration = Duration::from_secs(2);

/// The runtime's lag now: the last wake-up's lateness, or how overdue the next one is (a
/// runtime blocked right now shows before the probe gets to run). Zero before [`watch`] and
/// once the probe's runtime has gone.
pub fn lag() -> Duration {
    let Some(p) = PROBE.get() else { return Duration::ZERO };
    let since = ms(p.epoch.elapsed()).saturating_sub(p.woke_ms.load(Ordering::Relaxed));
    if since > ms(GONE) {
        return Duration::ZERO;
    }
    // The timer wheel's millisecond granularity: a wake-up a tick late is on time.
    let overdue = since.saturating_sub(ms(PERIOD) + 1);
    Duration::from_millis(p.lag_ms.load(Ordering::Relaxed).max(overdue))
}

#[cfg(test)]
mod tests {
    use super::*;

    #[tokio::test(flavor = "current_thread")]
    async fn a_blocked_runtime_shows_as_lag_and_a_free_one_does_not() {
        watch();
        tokio::time::sleep(PERIOD * 3).await;
        assert!(lag() < Duration::from_millis(50), "idle: {:?}", lag());
        // Block the only worker: the probe cannot run, and it is overdue.
        std::thread::sleep(Duration::from_millis(150));
        assert!(lag() >= Duration::from_millis(100), "blocked: {:?}", lag());
        tokio::time::sleep(PERIOD * 3).await;
        assert!(lag() < Duration::from_millis(50), "recovered: {:?}", lag());
    }
}
