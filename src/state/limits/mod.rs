//! Rate limits and hosted admission: the store contract behind layers (2) and (3) of the
//! spec's "Rate limit layers", and its backends.
//!
//! It is a trait because the same check must give the same answer on one embedded node
//! ([`InProcessLimiter`]) and on a fleet of gateways sharing Redis ([`RedisLimiter`]); one
//! test suite (`tests/limits_store.rs`) runs against both. A hot-path [`Check`] is one call
//! and, on Redis, one round trip: the per-key request windows, then the concurrency gates in
//! the order given, then the workspace tokens-per-minute budget. Nothing is recorded unless
//! every part passes, so a refusal never consumes quota.
//!
//! Windows are sliding 60-second windows counted in one-second buckets: a request stays
//! counted for more than 60 and at most 61 seconds, so no 60-second span ever admits more
//! than the limit, and memory per key is bounded by 61 counters whatever the limit (a
//! 200,000-a-minute key is 61 hash fields, not 200,000 sorted-set members).
//!
//! Concurrency is held by [`Lease`]s that expire: a gateway renews the lease of a running
//! request and releases it when the request ends; a crashed gateway's slots free by
//! themselves within the lease TTL. A renewal that finds its lease gone (the store restarted
//! without persistence, failed over, or the lease expired while its gateway could not reach
//! the store) registers it again: the request is still running, so it is counted again
//! (decision 202). After the store lost its data, gated checks wait a short recovery
//! ([`LimiterError::Recovering`]) while every gateway registers its running leases again.
//!
//! During a store outage [`FallbackLimiter`] answers the request windows from a per-server
//! fixed 60-second window (and says so), while admission returns the error so the caller
//! answers `503 hosted_admission_unavailable`. "Not configured" is [`DisabledLimiter`], which
//! errors on every call (`503 limiter_unavailable`): a limiter never falls back to no limit.

mod buckets;
pub mod fallback;
pub mod leases;
pub mod memory;
pub mod redis;
mod redis_releases;
mod redis_reply;

use std::sync::Arc;

use async_trait::async_trait;

pub use fallback::{Counting, FallbackLimiter, FallbackOptions, Outcome};
pub use leases::{Held, LeaseKeeper};
pub use memory::InProcessLimiter;
pub use redis::{RedisLimiter, RedisOptions};

/// The length of every window: requests and tokens per minute.
pub const WINDOW_MS: i64 = 60_000;
/// Retry estimates on hosted admission refusals (gates and tokens per minute) are capped here
/// (spec, "Retry rules").
pub const ADMISSION_RETRY_CAP_MS: u64 = 8_000;

/// A sliding 60-second request window; each admitted check counts one request.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct WindowLimit {
    /// Logical key, e.g. `key:<key id>` or `reads:<key id>`; distinct within one check.
    pub key: String,
    pub limit: u64,
}

/// A concurrency gate: at most `limit` live leases on `key`.
///
/// The same key may appear in two gates with different limits (e.g. the shared-model gate
/// and, for a large prompt, a lower large-prompt shed threshold on the same key). To count
/// requests without enforcing (the per-key cap applies only while the model is busy), pass
/// `limit: u64::MAX`.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct ConcurrencyGate {
    /// Names the gate to the caller (`X-Hosted-Limit-Scope`); not stored.
    pub scope: &'static str,
    pub key: String,
    pub limit: u64,
}

/// Rolling 60-second tokens per minute: admitted when `used + tokens <= limit`.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct TokenBudget {
    pub key: String,
    /// This request's tokens (the caller's estimate at admission), recorded when admitted.
    pub tokens: u64,
    pub limit: u64,
}

/// One admission question. `now_ms` is the caller's clock (gateways are assumed NTP-synced;
/// a skew of d shifts a gateway's entries by d).
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct Check {
    pub now_ms: i64,
    /// Checked first, in order.
    pub windows: Vec<WindowLimit>,
    /// Checked second, in order; the first full gate refuses.
    pub gates: Vec<ConcurrencyGate>,
    /// Checked last.
    pub tpm: Option<TokenBudget>,
    /// Names the lease taken on every gate (unique per request, e.g. the request id). A check
    /// repeated with the same id while its lease is live does not take a second slot (and pushes
    /// its expiry). After `Unavailable`, retry with a new id: the failed attempt's lease is
    /// released in the background in case it was applied late. Shared, not copied, by the lease
    /// and by the stores that keep it (the in-process gates, the lease keeper).
    pub lease_id: Arc<str>,
    pub lease_ttl_ms: u64,
}

/// A window as seen by this check, for the `X-RateLimit-*` headers.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct WindowState {
    pub limit: u64,
    /// After this request (0 on refusal).
    pub remaining: u64,
    /// When `remaining` next rises: the oldest counted request leaves the window (on refusal,
    /// when this request would fit).
    pub reset_at_ms: i64,
}

/// Concurrency slots held by one request. Renew it while the request runs; release it when
/// the request ends.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct Lease {
    pub id: Arc<str>,
    /// The gates' logical keys, without duplicates.
    pub keys: Vec<String>,
    pub expires_at_ms: i64,
}

#[derive(Debug, Clone, PartialEq, Eq)]
pub enum Verdict {
    /// Everything passed and was recorded.
    Admitted {
        /// One per window of the check, in order.
        windows: Vec<WindowState>,
        /// Live leases on each gate's key after admission (this one included), in order.
        gates_in_use: Vec<u64>,
        /// `None` when the check had no gates.
        lease: Option<Lease>,
    },
    /// Window `index` is full; nothing was recorded. `retry_after_ms`: until enough counted
    /// requests leave the window for this one to fit (not capped: this is the per-key window).
    WindowRefused { index: usize, state: WindowState, retry_after_ms: u64 },
    /// Gate `index` has `in_use >= limit` live leases; nothing was recorded.
    /// `retry_after_ms`: until the oldest lease would expire, capped at 8 s.
    GateRefused { index: usize, in_use: u64, retry_after_ms: u64 },
    /// `used + tokens > limit`; nothing was recorded. `never`: this request alone is above the
    /// limit and cannot succeed by waiting (then `retry_after_ms` is 0). Otherwise an estimate
    /// of when enough tokens leave the window, capped at 8 s.
    TokensRefused { used: u64, limit: u64, retry_after_ms: u64, never: bool },
}

/// The result of [`LimiterStore::renew`]. Renew only a running request's lease: a renewal
/// registers the lease again wherever it is missing.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Renewal {
    Renewed {
        expires_at_ms: i64,
    },
    /// The lease was missing (or expired) on at least one gate and is counted there again: the
    /// store lost it (a restart without persistence, a failover) or it expired while its
    /// gateway could not renew it. A gate may be over its limit until running requests end.
    Restored {
        expires_at_ms: i64,
    },
}

/// What a limiter store knows of its own continuity: it changes when the store lost its data.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct Epoch(pub String);

#[derive(Debug, Clone, PartialEq, Eq)]
pub enum LimiterError {
    /// The store could not answer in time (down, unreachable, timed out, or failed).
    Unavailable(String),
    /// No limiter store is configured (`503 limiter_unavailable`).
    NotConfigured,
    /// The check itself is malformed (a caller bug).
    Invalid(String),
    /// The store lost its data moments ago (its epoch is new) and gated checks wait while
    /// every gateway registers its running leases again (`503 hosted_admission_unavailable`).
    Recovering { retry_after_ms: u64 },
}

impl std::fmt::Display for LimiterError {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        match self {
            LimiterError::Unavailable(m) => write!(f, "limiter store unavailable: {m}"),
            LimiterError::NotConfigured => write!(f, "no limiter store is configured"),
            LimiterError::Invalid(m) => write!(f, "invalid limiter check: {m}"),
            LimiterError::Recovering { retry_after_ms } => {
                write!(f, "limiter store recovering from a data loss for {retry_after_ms} ms more")
            }
        }
    }
}

impl std::error::Error for LimiterError {}

/// Request windows, concurrency leases and tokens per minute, shared by every gateway using
/// the same store.
#[async_trait]
pub trait LimiterStore: Send + Sync {
    fn backend(&self) -> &'static str;
    /// Windows, then gates, then tokens per minute, atomically; records only if all pass.
    async fn check(&self, c: &Check) -> Result<Verdict, LimiterError>;
    /// Push the lease's expiry to `now_ms + ttl_ms` on every gate, registering it again on any
    /// gate that lost it. Only for a running request's lease (a released one would come back).
    async fn renew(&self, lease: &Lease, ttl_ms: u64, now_ms: i64) -> Result<Renewal, LimiterError>;
    /// Free the lease's slots. Idempotent: releasing twice, or after expiry, is `Ok`.
    async fn release(&self, lease: &Lease) -> Result<(), LimiterError>;
    /// Free the lease's slots without waiting for the store (a request's log phase). This
    /// instance's next check counts them free; other instances may count them a few
    /// milliseconds longer (Redis: decision 148). The default frees them at once.
    async fn release_deferred(&self, lease: &Lease) -> Result<(), LimiterError> {
        self.release(lease).await
    }
    /// The store's epoch, created (with a recovery period for gated checks) when the store has
    /// none: a store that can lose its data while gateways hold leases in it says so by a new
    /// epoch, and each gateway then registers its running leases again. `None`: this store
    /// never loses leases while the process lives (in process).
    async fn epoch(&self, _now_ms: i64) -> Result<Option<Epoch>, LimiterError> {
        Ok(None)
    }
}

/// "Off": every call errors, so the caller answers `503 limiter_unavailable` rather than
/// admitting without a limit.
#[derive(Debug, Default, Clone, Copy)]
pub struct DisabledLimiter;

#[async_trait]
impl LimiterStore for DisabledLimiter {
    fn backend(&self) -> &'static str {
        "disabled"
    }
    async fn check(&self, _: &Check) -> Result<Verdict, LimiterError> {
        Err(LimiterError::NotConfigured)
    }
    async fn renew(&self, _: &Lease, _: u64, _: i64) -> Result<Renewal, LimiterError> {
        Err(LimiterError::NotConfigured)
    }
    async fn release(&self, _: &Lease) -> Result<(), LimiterError> {
        Err(LimiterError::NotConfigured)
    }
}

/// Which limiter store to run.
#[derive(Debug, Clone, PartialEq, Eq)]
pub enum LimiterConfig {
    Disabled,
    /// One node: counts in this process.
    InProcess,
    /// Shared across gateways.
    Redis {
        url: String,
        options: RedisOptions,
    },
}

/// The connection a Redis limiter store shares with the idempotency records and the session
/// placements kept under its prefix: one multiplexed connection, so a request's commands sent
/// in the same instant leave in one write and come back in one read (decision 150). `None`
/// for the other stores, and for a URL that does not parse (`open_limiter` reports it).
/// Never connects.
pub fn shared_connection(cfg: &LimiterConfig) -> Option<Arc<crate::state::redis_conn::LazyRedis>> {
    match cfg {
        LimiterConfig::Redis { url, options } => {
            crate::state::redis_conn::LazyRedis::open_tls(url, options.timeout, options.tls.as_deref())
                .ok()
                .map(Arc::new)
        }
        _ => None,
    }
}

/// The one factory, on `shared` when given (see [`shared_connection`]). Never connects (a
/// Redis store connects on first use, so a gateway can start during an outage); never logs
/// credentials.
pub fn open_limiter(
    cfg: &LimiterConfig,
    shared: Option<Arc<crate::state::redis_conn::LazyRedis>>,
) -> Result<Arc<dyn LimiterStore>, LimiterError> {
    Ok(match cfg {
        LimiterConfig::Disabled => {
            log::warn!("limiter store: disabled; rate-limited routes answer 503 limiter_unavailable");
            Arc::new(DisabledLimiter)
        }
        LimiterConfig::InProcess => {
            log::info!("limiter store: in-process (one node)");
            Arc::new(InProcessLimiter::new())
        }
        LimiterConfig::Redis { url, options } => {
            let store = match shared {
                Some(redis) => RedisLimiter::on(redis, options.clone())?,
                None => RedisLimiter::new(url, options.clone())?,
            };
            log::info!("limiter store: redis at {}", redact(url));
            Arc::new(store)
        }
    })
}

/// `redis://user:secret@host:port/db` -> `redis://***@host:port/db`.
pub fn redact(url: &str) -> String {
    match (url.split_once("://"), url.rfind('@')) {
        (Some((scheme, _)), Some(at)) if at > scheme.len() + 3 => format!("{scheme}://***{}", &url[at..]),
        _ => url.to_string(),
    }
}

impl Check {
    /// A check of request windows only (no gates, no tokens per minute, so no lease).
    pub fn windows_only(now_ms: i64, windows: Vec<WindowLimit>) -> Check {
        static NO_LEASE: std::sync::LazyLock<Arc<str>> = std::sync::LazyLock::new(|| Arc::from(""));
        Check { now_ms, windows, gates: Vec::new(), tpm: None, lease_id: NO_LEASE.clone(), lease_ttl_ms: 0 }
    }

    /// Reject checks no backend can answer meaningfully.
    fn validate(&self) -> Result<(), LimiterError> {
        if !self.gates.is_empty() {
            if self.lease_id.is_empty() {
                return Err(LimiterError::Invalid("a check with gates needs a lease id".into()));
            }
            if self.lease_ttl_ms == 0 {
                return Err(LimiterError::Invalid("a check with gates needs a lease TTL".into()));
            }
        }
        Ok(())
    }

    /// The lease this check takes when admitted (`None` without gates). A caller whose check
    /// was cancelled mid-flight (its future dropped) can release this to be sure.
    pub fn lease(&self) -> Option<Lease> {
        if self.gates.is_empty() {
            return None;
        }
        let mut keys: Vec<String> = Vec::with_capacity(self.gates.len());
        for g in &self.gates {
            if !keys.contains(&g.key) {
                keys.push(g.key.clone());
            }
        }
        Some(Lease { id: self.lease_id.clone(), keys, expires_at_ms: expiry(self.now_ms, self.lease_ttl_ms) })
    }
}

fn expiry(now_ms: i64, ttl_ms: u64) -> i64 {
    now_ms.saturating_add(i64::try_from(ttl_ms).unwrap_or(i64::MAX))
}

#[cfg(test)]
mod tests {
    use super::redact;

    #[test]
    fn redacts_credentials() {
        assert_eq!(redact("redis://u:pw@127.0.0.1:6379/0"), "redis://***@127.0.0.1:6379/0");
        assert_eq!(redact("redis://127.0.0.1:6379"), "redis://127.0.0.1:6379");
        assert_eq!(redact("rediss://:pw@h:1"), "rediss://***@h:1");
    }
}
