//! Outage behaviour (spec, "Rate limit layers" (2)): while the shared store is unavailable,
//! each server counts the per-key request windows in its own fixed 60-second window, and says
//! so ([`Counting::Local`]); concurrency gates and tokens per minute need the shared store, so a
//! check that has any returns the store's error and the caller answers
//! `503 hosted_admission_unavailable`. `NotConfigured` is never papered over.
//!
//! After a failure the shared store is skipped for [`FallbackOptions::retry_shared_after_ms`]
//! (answers are local at once instead of each waiting for the store's timeout); then one call at
//! a time probes it, and the first success resumes shared counting for every call.

use std::collections::HashMap;
use std::sync::atomic::{AtomicBool, AtomicI64, Ordering};
use std::sync::{Arc, Mutex};

use super::{Check, Lease, LimiterError, LimiterStore, Renewal, Verdict, WINDOW_MS, WindowState};

#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct FallbackOptions {
    /// After the store fails, answer locally for this long before probing it again.
    pub retry_shared_after_ms: i64,
}

impl Default for FallbackOptions {
    fn default() -> Self {
        Self { retry_shared_after_ms: 1_000 }
    }
}

/// Who counted a check.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Counting {
    /// The shared store: global across gateways.
    Shared,
    /// This server alone, in a fixed 60-second window, because the shared store is unavailable.
    Local,
}

#[derive(Debug, Clone, PartialEq, Eq)]
pub struct Outcome {
    pub verdict: Verdict,
    pub counting: Counting,
}

/// "Healthy" for `down_until_ms`.
const UP: i64 = i64::MIN;

pub struct FallbackLimiter {
    primary: Arc<dyn LimiterStore>,
    opts: FallbackOptions,
    local: Mutex<LocalWindows>,
    /// Skip the shared store until this instant (the checks' clock); `UP` when healthy.
    down_until_ms: AtomicI64,
    /// One call at a time probes a store marked down.
    probing: AtomicBool,
}

/// Fixed 60-second windows aligned to the minute; all keys of the current minute.
#[derive(Debug, Default)]
struct LocalWindows {
    minute: i64,
    counts: HashMap<String, u64>,
}

enum Route<'a> {
    Shared(Option<ProbeGuard<'a>>),
    Local,
}

/// Clears `probing` however the probe ends (a caller may drop the future mid-await).
struct ProbeGuard<'a>(&'a AtomicBool);

impl Drop for ProbeGuard<'_> {
    fn drop(&mut self) {
        self.0.store(false, Ordering::SeqCst);
    }
}

impl FallbackLimiter {
    pub fn new(primary: Arc<dyn LimiterStore>, opts: FallbackOptions) -> Self {
        Self {
            primary,
            opts,
            local: Mutex::new(LocalWindows::default()),
            down_until_ms: AtomicI64::new(UP),
            probing: AtomicBool::new(false),
        }
    }

    pub fn backend(&self) -> &'static str {
        self.primary.backend()
    }

    /// Whether checks at `now_ms` skip the shared store.
    pub fn shared_down(&self, now_ms: i64) -> bool {
        now_ms < self.down_until_ms.load(Ordering::SeqCst)
    }

    fn route(&self, now_ms: i64) -> Route<'_> {
        let down_until = self.down_until_ms.load(Ordering::SeqCst);
        if down_until == UP {
            return Route::Shared(None);
        }
        if now_ms < down_until {
            return Route::Local;
        }
        match self.probing.compare_exchange(false, true, Ordering::SeqCst, Ordering::SeqCst) {
            Ok(_) => Route::Shared(Some(ProbeGuard(&self.probing))),
            Err(_) => Route::Local,
        }
    }

    /// The shared verdict when the store answers; otherwise the local one for windows, or the
    /// store's error when the check needs the store (gates or tokens per minute).
    pub async fn check(&self, c: &Check) -> Result<Outcome, LimiterError> {
        let error = match self.route(c.now_ms) {
            Route::Shared(_probe) => match timed(&CHECK, self.primary.check(c)).await {
                Ok(verdict) => {
                    self.down_until_ms.store(UP, Ordering::SeqCst);
                    return Ok(Outcome { verdict, counting: Counting::Shared });
                }
                Err(LimiterError::Unavailable(m)) => {
                    let until = c.now_ms.saturating_add(self.opts.retry_shared_after_ms);
                    if self.down_until_ms.swap(until, Ordering::SeqCst) == UP {
                        log::warn!("limiter: shared store unavailable ({m}); counting request windows locally");
                    }
                    LimiterError::Unavailable(m)
                }
                Err(e) => return Err(e),
            },
            Route::Local => LimiterError::Unavailable("shared store marked down; probing it again shortly".into()),
        };
        self.local_check(c, error)
    }

    fn local_check(&self, c: &Check, error: LimiterError) -> Result<Outcome, LimiterError> {
        let mut local = self.local.lock().unwrap_or_else(|e| e.into_inner());
        let minute = c.now_ms.div_euclid(WINDOW_MS);
        if minute > local.minute {
            local.minute = minute;
            local.counts.clear();
        }
        let reset_at_ms = (local.minute + 1) * WINDOW_MS;
        let wait = u64::try_from(reset_at_ms - c.now_ms).unwrap_or(0);
        let mut windows = Vec::with_capacity(c.windows.len());
        for (index, w) in c.windows.iter().enumerate() {
            let n = local.counts.get(&w.key).copied().unwrap_or(0);
            if n + 1 > w.limit {
                let state = WindowState { limit: w.limit, remaining: 0, reset_at_ms };
                let verdict = Verdict::WindowRefused { index, state, retry_after_ms: wait };
                return Ok(Outcome { verdict, counting: Counting::Local });
            }
            windows.push(WindowState { limit: w.limit, remaining: w.limit - (n + 1), reset_at_ms });
        }
        if !c.gates.is_empty() || c.tpm.is_some() {
            return Err(error);
        }
        for w in &c.windows {
            *local.counts.entry(w.key.clone()).or_default() += 1;
        }
        let verdict = Verdict::Admitted { windows, gates_in_use: Vec::new(), lease: None };
        Ok(Outcome { verdict, counting: Counting::Local })
    }

    /// Leases exist only in the shared store: passed through.
    pub async fn renew(&self, lease: &Lease, ttl_ms: u64, now_ms: i64) -> Result<Renewal, LimiterError> {
        timed(&RENEW, self.primary.renew(lease, ttl_ms, now_ms)).await
    }

    /// The shared store's epoch (see [`LimiterStore::epoch`]), passed through.
    pub async fn epoch(&self, now_ms: i64) -> Result<Option<super::Epoch>, LimiterError> {
        timed(&EPOCH, self.primary.epoch(now_ms)).await
    }

    /// Passed through; a lease not released expires by its TTL.
    pub async fn release(&self, lease: &Lease) -> Result<(), LimiterError> {
        timed(&RELEASE, self.primary.release(lease)).await
    }

    /// [`LimiterStore::release_deferred`] of the shared store.
    pub async fn release_deferred(&self, lease: &Lease) -> Result<(), LimiterError> {
        timed(&RELEASE, self.primary.release_deferred(lease)).await
    }
}

type OpMetric = std::sync::LazyLock<Option<crate::observe::metrics::StoreOp>>;
static CHECK: OpMetric = std::sync::LazyLock::new(|| crate::observe::metrics::StoreOp::new("limiter", "check"));
static RENEW: OpMetric = std::sync::LazyLock::new(|| crate::observe::metrics::StoreOp::new("limiter", "renew"));
static RELEASE: OpMetric = std::sync::LazyLock::new(|| crate::observe::metrics::StoreOp::new("limiter", "release"));
static EPOCH: OpMetric = std::sync::LazyLock::new(|| crate::observe::metrics::StoreOp::new("limiter", "epoch"));

/// Run one store call and record its outcome and latency.
async fn timed<T>(
    metric: &OpMetric,
    call: impl std::future::Future<Output = Result<T, LimiterError>>,
) -> Result<T, LimiterError> {
    let started = std::time::Instant::now();
    let out = call.await;
    crate::observe::metrics::StoreOp::record(metric, out.is_ok(), started.elapsed());
    out
}
