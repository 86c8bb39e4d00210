//! The limiter store suite on both backends (in-process and Redis): sliding request windows,
//! ordered concurrency gates with expiring leases, tokens per minute, two gateways sharing one
//! Redis under concurrent load, and the outage fallback against a redis-server child that the
//! test stalls, kills and restarts. Redis tests never skip: an unreachable `REDIS_URL` fails them.
#![allow(clippy::unwrap_used, clippy::expect_used, clippy::panic)]

mod common;

use std::sync::Arc;
use std::sync::atomic::{AtomicBool, AtomicU64, AtomicUsize, Ordering};
use std::time::{Duration, Instant};

use common::redis::RedisChild;
use tollgate::runtime::clock::now_ms;
use tollgate::state::limits::{
    Check, ConcurrencyGate, Counting, DisabledLimiter, FallbackLimiter, FallbackOptions, InProcessLimiter, Lease,
    LimiterError, LimiterStore, Outcome, RedisLimiter, RedisOptions, Renewal, TokenBudget, Verdict, WindowLimit,
    WindowState,
};

// ---- backends -------------------------------------------------------------------------------

/// Two handles on one store, as two gateways would hold (in-process: the same instance).
struct Pair {
    a: Arc<dyn LimiterStore>,
    b: Arc<dyn LimiterStore>,
}

async fn memory() -> Pair {
    let s: Arc<dyn LimiterStore> = Arc::new(InProcessLimiter::new());
    Pair { a: s.clone(), b: s }
}

fn redis_url() -> String {
    std::env::var("REDIS_URL").unwrap_or_else(|_| "redis://127.0.0.1:6379".into())
}

async fn redis_store(url: &str, timeout: Duration) -> Arc<dyn LimiterStore> {
    let s = RedisLimiter::new(url, RedisOptions { prefix: "tollgate-test".into(), timeout, ..RedisOptions::default() })
        .unwrap();
    s.ping().await.unwrap_or_else(|e| {
        panic!("Redis is not reachable at {url} ({e}); start it with scripts/services.sh or set REDIS_URL")
    });
    Arc::new(s)
}

/// Two `RedisLimiter`s, each with its own connection. A generous timeout: the suite runs many
/// tasks on two cores, and these tests are about semantics, not outages.
async fn redis() -> Pair {
    let url = redis_url();
    Pair { a: redis_store(&url, Duration::from_secs(5)).await, b: redis_store(&url, Duration::from_secs(5)).await }
}

macro_rules! both_backends {
    ($($name:ident),* $(,)?) => {$(
        mod $name {
            #[tokio::test(flavor = "multi_thread", worker_threads = 2)]
            async fn in_process() { super::$name(super::memory().await).await }
            #[tokio::test(flavor = "multi_thread", worker_threads = 2)]
            async fn redis() { super::$name(super::redis().await).await }
        }
    )*};
}

// ---- helpers --------------------------------------------------------------------------------

fn uniq(p: &str) -> String {
    format!("{p}:{}", uuid::Uuid::new_v4().simple())
}

/// A second boundary, so bucket arithmetic in the assertions is exact.
fn t0() -> i64 {
    now_ms() / 1000 * 1000
}

fn window(key: &str, limit: u64) -> WindowLimit {
    WindowLimit { key: key.into(), limit }
}

fn gate(scope: &'static str, key: &str, limit: u64) -> ConcurrencyGate {
    ConcurrencyGate { scope, key: key.into(), limit }
}

fn check(now_ms: i64) -> Check {
    Check {
        now_ms,
        windows: vec![],
        gates: vec![],
        tpm: None,
        lease_id: uuid::Uuid::new_v4().to_string().into(),
        lease_ttl_ms: 10_000,
    }
}

fn windows(now_ms: i64, w: Vec<WindowLimit>) -> Check {
    Check { windows: w, ..check(now_ms) }
}

fn gates(now_ms: i64, lease: &str, g: Vec<ConcurrencyGate>) -> Check {
    Check { gates: g, lease_id: lease.into(), ..check(now_ms) }
}

fn tokens(now_ms: i64, key: &str, tokens: u64, limit: u64) -> Check {
    Check { tpm: Some(TokenBudget { key: key.into(), tokens, limit }), ..check(now_ms) }
}

fn admitted_windows(v: Verdict) -> Vec<WindowState> {
    match v {
        Verdict::Admitted { windows, .. } => windows,
        other => panic!("expected Admitted, got {other:?}"),
    }
}

fn admitted_lease(v: Verdict) -> (Lease, Vec<u64>) {
    match v {
        Verdict::Admitted { lease: Some(l), gates_in_use, .. } => (l, gates_in_use),
        other => panic!("expected Admitted with a lease, got {other:?}"),
    }
}

// ---- the suite ------------------------------------------------------------------------------

#[path = "limits_store/concurrency_gates.rs"]
mod concurrency_gates;
#[path = "limits_store/fallback.rs"]
mod fallback;
#[path = "limits_store/outages.rs"]
mod outages;
#[path = "limits_store/redis_only.rs"]
mod redis_only;
#[path = "limits_store/sliding_windows.rs"]
mod sliding_windows;
