//! The limiter store suite on both backends (in-process and Redis): sliding request windows,
//! ordered concurrency gates with expiring leases, tokens per minute, two gateways sharing one
//! Redis under concurrent load, and the outage fallback against a redis-server child that the
//! test stalls, kills and restarts. Redis tests never skip: an unreachable `REDIS_URL` fails them.
#![allow(clippy::unwrap_used, clippy::expect_used, clippy::panic)]

mod common;

use std::sync::Arc;
use std::sync::atomic::{AtomicBool, AtomicU64, AtomicUsize, Ordering};
use std::time::{Duration, Instant};

use async_trait::async_trait;
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

both_backends!(
    window_admits_exactly_the_limit_and_reports_remaining_and_reset,
    a_refused_window_records_nothing,
    gates_are_checked_in_order_and_nothing_is_recorded_on_refusal,
    a_key_in_two_gates_sheds_large_prompts_first,
    a_lease_not_renewed_frees_after_its_ttl,
    release_is_idempotent,
    a_deferred_release_frees_the_slot_here_at_once_and_elsewhere_soon,
    tokens_per_minute_refuse_above_the_remaining_budget,
    two_gateways_admit_exactly_the_window_and_never_exceed_a_gate,
    malformed_checks_are_refused,
);

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

async fn window_admits_exactly_the_limit_and_reports_remaining_and_reset(s: Pair) {
    let k = uniq("key");
    let t0 = t0();
    // Five requests in seconds 0..4, alternating gateways: one shared window.
    for i in 0..5u64 {
        let store = if i % 2 == 0 { &s.a } else { &s.b };
        let v = store.check(&windows(t0 + i as i64 * 1000, vec![window(&k, 5)])).await.unwrap();
        // The oldest counted request (second 0) leaves the window after 61 s at most.
        assert_eq!(admitted_windows(v), vec![WindowState { limit: 5, remaining: 4 - i, reset_at_ms: t0 + 61_000 }]);
    }
    let refused = |now: i64, retry: u64| Verdict::WindowRefused {
        index: 0,
        state: WindowState { limit: 5, remaining: 0, reset_at_ms: now + retry as i64 },
        retry_after_ms: retry,
    };
    assert_eq!(s.b.check(&windows(t0 + 10_000, vec![window(&k, 5)])).await.unwrap(), refused(t0 + 10_000, 51_000));
    assert_eq!(s.a.check(&windows(t0 + 60_999, vec![window(&k, 5)])).await.unwrap(), refused(t0 + 60_999, 1));
    // Sliding: at 61 s only the request of second 0 has left; seconds 1..4 still count.
    let v = s.a.check(&windows(t0 + 61_000, vec![window(&k, 5)])).await.unwrap();
    assert_eq!(admitted_windows(v), vec![WindowState { limit: 5, remaining: 0, reset_at_ms: t0 + 62_000 }]);
    assert_eq!(s.b.check(&windows(t0 + 61_000, vec![window(&k, 5)])).await.unwrap(), refused(t0 + 61_000, 1_000));
    // Two minutes later the window is empty again.
    let v = s.b.check(&windows(t0 + 130_000, vec![window(&k, 5)])).await.unwrap();
    assert_eq!(admitted_windows(v)[0].remaining, 4);
}

async fn a_refused_window_records_nothing(s: Pair) {
    let (k1, k2) = (uniq("key"), uniq("reads"));
    let t = t0();
    let both = || windows(t, vec![window(&k1, 10), window(&k2, 1)]);
    assert_eq!(admitted_windows(s.a.check(&both()).await.unwrap()).len(), 2);
    match s.b.check(&both()).await.unwrap() {
        Verdict::WindowRefused { index: 1, state, .. } => assert_eq!(state.remaining, 0),
        other => panic!("expected the second window to refuse, got {other:?}"),
    }
    // The refused check did not count against the first window.
    assert_eq!(admitted_windows(s.a.check(&windows(t, vec![window(&k1, 10)])).await.unwrap())[0].remaining, 8);
}

async fn gates_are_checked_in_order_and_nothing_is_recorded_on_refusal(s: Pair) {
    let (w, ka, kb, kt) = (uniq("key"), uniq("ws"), uniq("model"), uniq("tpm"));
    let t = t0();
    admitted_lease(s.a.check(&gates(t, "holder", vec![gate("shared_model", &kb, 1)])).await.unwrap());
    let full = Check {
        windows: vec![window(&w, 100)],
        gates: vec![gate("workspace", &ka, 1), gate("shared_model", &kb, 1)],
        tpm: Some(TokenBudget { key: kt.clone(), tokens: 10, limit: 1000 }),
        ..check(t + 1000)
    };
    match s.b.check(&full).await.unwrap() {
        Verdict::GateRefused { index: 1, in_use: 1, retry_after_ms } => {
            // The holder's lease expires at t + 10 s: 9 s away, capped at 8 s.
            assert_eq!(retry_after_ms, 8_000)
        }
        other => panic!("expected the second gate to refuse, got {other:?}"),
    }
    // Nothing of the refused check was recorded: not its window, its first gate nor its tokens.
    let v = s.a.check(&windows(t + 1000, vec![window(&w, 100)])).await.unwrap();
    assert_eq!(admitted_windows(v)[0].remaining, 99);
    let (_, in_use) = admitted_lease(s.a.check(&gates(t + 1000, "y", vec![gate("workspace", &ka, 1)])).await.unwrap());
    assert_eq!(in_use, vec![1]);
    assert!(matches!(s.b.check(&tokens(t + 1000, &kt, 1000, 1000)).await.unwrap(), Verdict::Admitted { .. }));
    // Both gates full: the first one names the refusal.
    let both = gates(t + 2000, "z", vec![gate("workspace", &ka, 1), gate("shared_model", &kb, 1)]);
    assert!(matches!(s.b.check(&both).await.unwrap(), Verdict::GateRefused { index: 0, in_use: 1, .. }));
    // A full window refuses before any gate is looked at.
    let w1 = Check { windows: vec![window(&uniq("key"), 0)], ..both };
    assert!(matches!(s.a.check(&w1).await.unwrap(), Verdict::WindowRefused { index: 0, .. }));
}

async fn a_key_in_two_gates_sheds_large_prompts_first(s: Pair) {
    let m = uniq("model");
    let t = t0();
    for id in ["r1", "r2"] {
        admitted_lease(s.a.check(&gates(t, id, vec![gate("shared_model", &m, 3)])).await.unwrap());
    }
    // A large prompt passes the shared gate (2 < 3) but meets the shed threshold (2 >= 2).
    let large = gates(t, "big", vec![gate("shared_model", &m, 3), gate("large_prompt", &m, 2)]);
    assert!(matches!(s.b.check(&large).await.unwrap(), Verdict::GateRefused { index: 1, in_use: 2, .. }));
    let (lease, in_use) =
        admitted_lease(s.b.check(&gates(t, "small", vec![gate("shared_model", &m, 3)])).await.unwrap());
    assert_eq!((lease.keys.len(), in_use), (1, vec![3]));
    // A key named twice is held once.
    s.b.release(&lease).await.unwrap();
    let (lease, in_use) = admitted_lease(
        s.a.check(&gates(t, "big2", vec![gate("shared_model", &m, 4), gate("large_prompt", &m, 3)])).await.unwrap(),
    );
    assert_eq!((lease.keys, in_use), (vec![m.clone()], vec![3, 3]));
}

async fn a_lease_not_renewed_frees_after_its_ttl(s: Pair) {
    let g = uniq("ws");
    let t = t0();
    let one = |now: i64, id: &str| gates(now, id, vec![gate("workspace", &g, 1)]);
    let (a, in_use) = admitted_lease(s.a.check(&one(t, "a")).await.unwrap());
    assert_eq!((a.expires_at_ms, in_use), (t + 10_000, vec![1]));
    assert_eq!(
        s.b.check(&one(t + 9_999, "b")).await.unwrap(),
        Verdict::GateRefused { index: 0, in_use: 1, retry_after_ms: 1 }
    );
    // Nobody renewed "a": its slot is free at its expiry.
    let (b, _) = admitted_lease(s.b.check(&one(t + 10_000, "b")).await.unwrap());
    // "a"'s request is still running after all (its gateway could not renew in time): a
    // renewal counts it again, over the limit, until one of them ends (decision 202).
    assert_eq!(s.a.renew(&a, 10_000, t + 10_001).await.unwrap(), Renewal::Restored { expires_at_ms: t + 20_001 });
    assert!(matches!(s.b.check(&one(t + 10_002, "x")).await.unwrap(), Verdict::GateRefused { in_use: 2, .. }));
    s.a.release(&a).await.unwrap();
    // A renewed lease keeps its slot past its first expiry.
    assert_eq!(s.b.renew(&b, 10_000, t + 15_000).await.unwrap(), Renewal::Renewed { expires_at_ms: t + 25_000 });
    assert_eq!(
        s.a.check(&one(t + 21_000, "c")).await.unwrap(),
        Verdict::GateRefused { index: 0, in_use: 1, retry_after_ms: 4_000 }
    );
    admitted_lease(s.a.check(&one(t + 25_000, "c")).await.unwrap());
    // Repeating a live lease's check does not take a second slot (it refreshes the expiry).
    let (c, in_use) = admitted_lease(s.b.check(&one(t + 26_000, "c")).await.unwrap());
    assert_eq!((c.expires_at_ms, in_use), (t + 36_000, vec![1]));
}

async fn release_is_idempotent(s: Pair) {
    let (g1, g2) = (uniq("key"), uniq("ws"));
    let t = t0();
    let two = |id: &str| gates(t, id, vec![gate("per_key", &g1, 1), gate("workspace", &g2, 1)]);
    let (a, _) = admitted_lease(s.a.check(&two("a")).await.unwrap());
    assert!(matches!(s.b.check(&two("b")).await.unwrap(), Verdict::GateRefused { index: 0, .. }));
    s.a.release(&a).await.unwrap();
    s.b.release(&a).await.unwrap();
    s.a.release(&Lease { id: "never-held".into(), keys: vec![g1.clone()], expires_at_ms: t }).await.unwrap();
    s.a.release(&Lease { id: "no-gates".into(), keys: vec![], expires_at_ms: t }).await.unwrap();
    let (_, in_use) = admitted_lease(s.b.check(&two("b")).await.unwrap());
    assert_eq!(in_use, vec![1, 1]);
    // Renewing a released lease would count it again: the keeper renews running requests only.
    assert_eq!(s.a.renew(&a, 10_000, t + 1).await.unwrap(), Renewal::Restored { expires_at_ms: t + 10_001 });
    assert!(matches!(s.b.check(&two("c")).await.unwrap(), Verdict::GateRefused { index: 0, .. }));
}

/// Decision 148: the log phase's release. This instance's next check must count the slot free
/// (on Redis the release rides in front of that check); another instance sees it once the
/// queued release is flushed, within milliseconds.
async fn a_deferred_release_frees_the_slot_here_at_once_and_elsewhere_soon(s: Pair) {
    let g = uniq("ws");
    let t = t0();
    let one = |id: &str| gates(t, id, vec![gate("workspace", &g, 1)]);
    let (x, _) = admitted_lease(s.a.check(&one("x")).await.unwrap());
    s.a.release_deferred(&x).await.unwrap();
    let (y, in_use) = admitted_lease(s.a.check(&one("y")).await.unwrap());
    assert_eq!(in_use, vec![1]);
    s.a.release_deferred(&y).await.unwrap();
    let started = Instant::now();
    let mut attempt = 0;
    loop {
        attempt += 1;
        match s.b.check(&one(&format!("z{attempt}"))).await.unwrap() {
            Verdict::Admitted { gates_in_use, .. } => {
                assert_eq!(gates_in_use, vec![1]);
                break;
            }
            Verdict::GateRefused { in_use: 1, .. } if started.elapsed() < Duration::from_secs(2) => {
                tokio::time::sleep(Duration::from_millis(1)).await;
            }
            other => {
                panic!("the released slot was not free for another instance after {:?}: {other:?}", started.elapsed())
            }
        }
    }
}

/// On Redis a check sends the releases queued before it and clears them once Redis answers.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_redis_check_carries_the_queued_releases() {
    let r = RedisLimiter::new(
        &redis_url(),
        RedisOptions { prefix: "tollgate-test".into(), timeout: Duration::from_secs(5), ..RedisOptions::default() },
    )
    .unwrap();
    let (g1, g2) = (uniq("key"), uniq("ws"));
    let t = t0();
    let two = |id: &str| gates(t, id, vec![gate("per_key", &g1, 1), gate("workspace", &g2, 1)]);
    let (x, _) = admitted_lease(r.check(&two("x")).await.unwrap());
    r.release_deferred(&x).await.unwrap();
    let (_, in_use) = admitted_lease(r.check(&two("y")).await.unwrap());
    assert_eq!((in_use, r.queued_releases()), (vec![1, 1], 0));
}

/// Decision 149: during a rolling upgrade a v1 gateway (the script as it shipped, kept as a
/// fixture) and a v2 gateway share a window's hash and both count it exactly: v1 takes v2's
/// summary fields for stale seconds and deletes them, and v2 then reads the hash whole.
#[tokio::test]
async fn a_v1_gateway_and_a_v2_gateway_count_one_window_exactly() {
    let url = redis_url();
    let v2 = RedisLimiter::new(
        &url,
        RedisOptions { prefix: "tollgate-test".into(), timeout: Duration::from_secs(5), ..RedisOptions::default() },
    )
    .unwrap();
    let v1 = redis::Script::new(include_str!("fixtures/tollgate_check_v1.lua"));
    let mut conn = redis::Client::open(url.as_str()).unwrap().get_multiplexed_async_connection().await.unwrap();
    let k = uniq("key");
    let t = t0();
    let five = |now: i64| windows(now, vec![window(&k, 5)]);
    for i in 0..2 {
        admitted_windows(v2.check(&five(t + i * 1000)).await.unwrap());
    }
    // v1 counts v2's two requests and records a third.
    let v1_check = |now: i64| {
        let mut inv = v1.prepare_invoke();
        inv.key(format!("{{tollgate-test}}:w:{k}")).arg(now).arg(1).arg(0).arg(0).arg("v1-lease").arg(10_000).arg(5);
        inv
    };
    let reply: Vec<i64> = v1_check(t + 2000).invoke_async(&mut conn).await.unwrap();
    assert_eq!(reply, vec![0, 2, t / 1000]);
    // v2 counts all three, then v1 counts v2's fourth.
    let w = admitted_windows(v2.check(&five(t + 3000)).await.unwrap());
    assert_eq!(w[0].remaining, 1);
    let reply: Vec<i64> = v1_check(t + 4000).invoke_async(&mut conn).await.unwrap();
    assert_eq!(reply[..2], [0, 4]);
    // Full at five, for both.
    assert!(matches!(v2.check(&five(t + 5000)).await.unwrap(), Verdict::WindowRefused { .. }));
    let reply: Vec<i64> = v1_check(t + 5000).invoke_async(&mut conn).await.unwrap();
    assert_eq!(reply[0], 1);
    // Once the first second has left, each counts the four left.
    let w = admitted_windows(v2.check(&five(t + 61_000)).await.unwrap());
    assert_eq!(w[0].remaining, 0);
}

async fn tokens_per_minute_refuse_above_the_remaining_budget(s: Pair) {
    let k = uniq("tpm");
    let t = t0();
    assert!(matches!(s.a.check(&tokens(t, &k, 600, 1000)).await.unwrap(), Verdict::Admitted { lease: None, .. }));
    // 600 + 500 > 1000; the 600 leave in 60 s, an estimate capped at 8 s.
    assert_eq!(
        s.b.check(&tokens(t + 1000, &k, 500, 1000)).await.unwrap(),
        Verdict::TokensRefused { used: 600, limit: 1000, retry_after_ms: 8_000, never: false }
    );
    // A single request above the whole limit can never succeed by waiting.
    assert_eq!(
        s.a.check(&tokens(t + 1000, &k, 1001, 1000)).await.unwrap(),
        Verdict::TokensRefused { used: 600, limit: 1000, retry_after_ms: 0, never: true }
    );
    assert!(matches!(s.b.check(&tokens(t + 2000, &k, 400, 1000)).await.unwrap(), Verdict::Admitted { .. }));
    assert!(matches!(
        s.a.check(&tokens(t + 3000, &k, 1, 1000)).await.unwrap(),
        Verdict::TokensRefused { used: 1000, never: false, .. }
    ));
    // Near the end of the minute the estimate is exact: the 600 of second 0 leave at 61 s.
    assert_eq!(
        s.b.check(&tokens(t + 60_500, &k, 1, 1000)).await.unwrap(),
        Verdict::TokensRefused { used: 1000, limit: 1000, retry_after_ms: 500, never: false }
    );
    assert!(matches!(s.a.check(&tokens(t + 61_000, &k, 600, 1000)).await.unwrap(), Verdict::Admitted { .. }));
}

async fn two_gateways_admit_exactly_the_window_and_never_exceed_a_gate(s: Pair) {
    const TASKS: usize = 16;
    let (w, g) = (uniq("key"), uniq("model"));
    let t = t0();
    let stores = [s.a.clone(), s.b.clone()];
    // 16 tasks x 20 checks on a window of 150, from both gateways at once.
    let admitted = Arc::new(AtomicUsize::new(0));
    let mut tasks = Vec::new();
    for i in 0..TASKS {
        let (store, w, admitted) = (stores[i % 2].clone(), w.clone(), admitted.clone());
        tasks.push(tokio::spawn(async move {
            for _ in 0..20 {
                match store.check(&windows(t, vec![window(&w, 150)])).await.unwrap() {
                    Verdict::Admitted { .. } => _ = admitted.fetch_add(1, Ordering::SeqCst),
                    Verdict::WindowRefused { .. } => {}
                    other => panic!("unexpected {other:?}"),
                }
            }
        }));
    }
    for task in tasks {
        task.await.unwrap();
    }
    assert_eq!(admitted.load(Ordering::SeqCst), 150);

    // A gate of 4 under 16 tasks: never more than 4 running, as seen by the tasks themselves.
    let running = Arc::new(AtomicU64::new(0));
    let peak = Arc::new(AtomicU64::new(0));
    let outcomes = Arc::new([AtomicUsize::new(0), AtomicUsize::new(0)]);
    let mut tasks = Vec::new();
    for i in 0..TASKS {
        let (store, g, running, peak, outcomes) =
            (stores[i % 2].clone(), g.clone(), running.clone(), peak.clone(), outcomes.clone());
        tasks.push(tokio::spawn(async move {
            for _ in 0..15 {
                let c = Check {
                    lease_ttl_ms: 30_000,
                    ..gates(t, &uuid::Uuid::new_v4().to_string(), vec![gate("m", &g, 4)])
                };
                match store.check(&c).await.unwrap() {
                    Verdict::Admitted { lease: Some(lease), gates_in_use, .. } => {
                        assert!(gates_in_use[0] <= 4, "store counted {gates_in_use:?}");
                        let now = running.fetch_add(1, Ordering::SeqCst) + 1;
                        peak.fetch_max(now, Ordering::SeqCst);
                        assert!(now <= 4, "{now} requests running under a gate of 4");
                        tokio::time::sleep(Duration::from_millis(2)).await;
                        running.fetch_sub(1, Ordering::SeqCst);
                        store.release(&lease).await.unwrap();
                        outcomes[0].fetch_add(1, Ordering::SeqCst);
                    }
                    Verdict::GateRefused { in_use, retry_after_ms, .. } => {
                        assert!(in_use >= 4 && retry_after_ms <= 8_000);
                        outcomes[1].fetch_add(1, Ordering::SeqCst);
                    }
                    other => panic!("unexpected {other:?}"),
                }
            }
        }));
    }
    for task in tasks {
        task.await.unwrap();
    }
    let (ok, refused) = (outcomes[0].load(Ordering::SeqCst), outcomes[1].load(Ordering::SeqCst));
    assert_eq!(ok + refused, TASKS * 15);
    assert!(ok >= 4 && refused > 0, "admitted {ok}, refused {refused}");
    assert!(peak.load(Ordering::SeqCst) <= 4);
    // Every lease was released: the whole gate is free again.
    let (_, in_use) = admitted_lease(s.a.check(&gates(t, "last", vec![gate("m", &g, 4)])).await.unwrap());
    assert_eq!(in_use, vec![1]);
}

async fn malformed_checks_are_refused(s: Pair) {
    let g = vec![gate("m", &uniq("model"), 1)];
    let no_id = gates(t0(), "", g.clone());
    assert!(matches!(s.a.check(&no_id).await, Err(LimiterError::Invalid(_))));
    let no_ttl = Check { lease_ttl_ms: 0, ..gates(t0(), "x", g) };
    assert!(matches!(s.b.check(&no_ttl).await, Err(LimiterError::Invalid(_))));
}

// ---- the outage fallback --------------------------------------------------------------------

/// An in-process store that can be switched off, counting the calls that reach it.
#[derive(Default)]
struct Switchable {
    inner: InProcessLimiter,
    down: AtomicBool,
    calls: AtomicUsize,
}

#[async_trait]
impl LimiterStore for Switchable {
    fn backend(&self) -> &'static str {
        "switchable"
    }
    async fn check(&self, c: &Check) -> Result<Verdict, LimiterError> {
        self.calls.fetch_add(1, Ordering::SeqCst);
        if self.down.load(Ordering::SeqCst) {
            return Err(LimiterError::Unavailable("switched off".into()));
        }
        self.inner.check(c).await
    }
    async fn renew(&self, lease: &Lease, ttl_ms: u64, now_ms: i64) -> Result<Renewal, LimiterError> {
        self.inner.renew(lease, ttl_ms, now_ms).await
    }
    async fn release(&self, lease: &Lease) -> Result<(), LimiterError> {
        self.inner.release(lease).await
    }
}

#[tokio::test]
async fn the_fallback_counts_windows_locally_while_the_store_is_down() {
    let p = Arc::new(Switchable::default());
    let f = FallbackLimiter::new(p.clone(), FallbackOptions { retry_shared_after_ms: 1_000 });
    let minute = now_ms() / 60_000 * 60_000;
    let t = minute + 10_000;
    let k = uniq("key");
    let w = |now: i64| windows(now, vec![window(&k, 3)]);
    let out = f.check(&w(t)).await.unwrap();
    assert_eq!(out.counting, Counting::Shared);
    assert_eq!(admitted_windows(out.verdict)[0].remaining, 2);

    p.down.store(true, Ordering::SeqCst);
    // This server's own fixed window: it does not know the shared count.
    for i in 0..3u64 {
        let out = f.check(&w(t + 100 + i as i64)).await.unwrap();
        assert_eq!(out.counting, Counting::Local);
        let state = WindowState { limit: 3, remaining: 2 - i, reset_at_ms: minute + 60_000 };
        assert_eq!(admitted_windows(out.verdict), vec![state]);
    }
    let out = f.check(&w(t + 200)).await.unwrap();
    let state = WindowState { limit: 3, remaining: 0, reset_at_ms: minute + 60_000 };
    let retry_after_ms = (minute + 60_000 - t - 200) as u64;
    assert_eq!(out.verdict, Verdict::WindowRefused { index: 0, state, retry_after_ms });
    assert_eq!(out.counting, Counting::Local);
    // Admission needs the store: the caller answers 503 hosted_admission_unavailable.
    let g = vec![gate("workspace", &uniq("ws"), 10)];
    assert!(matches!(f.check(&gates(t + 300, "a", g.clone())).await, Err(LimiterError::Unavailable(_))));
    assert!(matches!(f.check(&tokens(t + 300, &uniq("tpm"), 1, 10)).await, Err(LimiterError::Unavailable(_))));
    // ... but a full window is still a window refusal, checked first.
    let both = Check { windows: vec![window(&k, 3)], ..gates(t + 300, "b", g) };
    assert!(matches!(f.check(&both).await.unwrap().verdict, Verdict::WindowRefused { .. }));
    // Within a second of the failure the store is not asked again.
    assert_eq!(p.calls.load(Ordering::SeqCst), 2);
    assert!(f.shared_down(t + 500));
    // Then one call probes it; still down, so a new minute is a new local window.
    let out = f.check(&w(minute + 60_005)).await.unwrap();
    assert_eq!((out.counting, admitted_windows(out.verdict)[0].remaining), (Counting::Local, 2));
    assert_eq!(p.calls.load(Ordering::SeqCst), 3);

    // The store is back: shared counting resumes at the next probe.
    p.down.store(false, Ordering::SeqCst);
    let out = f.check(&w(minute + 62_000)).await.unwrap();
    assert_eq!(out.counting, Counting::Shared);
    assert_eq!(admitted_windows(out.verdict)[0].remaining, 1, "the shared window still holds the request at t");
    assert!(!f.shared_down(minute + 62_001));
}

#[tokio::test]
async fn a_store_that_is_not_configured_is_never_papered_over() {
    let f = FallbackLimiter::new(Arc::new(DisabledLimiter), FallbackOptions::default());
    let c = windows(t0(), vec![window("k", 10)]);
    assert_eq!(f.check(&c).await, Err(LimiterError::NotConfigured));
    assert_eq!(DisabledLimiter.check(&c).await, Err(LimiterError::NotConfigured));
}

#[derive(Default)]
struct Traffic {
    shared: AtomicUsize,
    local: AtomicUsize,
    unavailable: AtomicUsize,
    slowest_ms: AtomicU64,
}

/// Poll until both gateways count in the shared store again.
async fn until_shared(gateways: &[Arc<FallbackLimiter>], within: Duration) {
    let deadline = Instant::now() + within;
    for f in gateways {
        loop {
            let out = f.check(&windows(now_ms(), vec![window(&uniq("probe"), 10)])).await.unwrap();
            if out.counting == Counting::Shared {
                break;
            }
            assert!(Instant::now() < deadline, "shared counting did not resume within {within:?}");
            tokio::time::sleep(Duration::from_millis(50)).await;
        }
    }
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn an_outage_counts_locally_without_hanging_and_shared_counting_resumes() {
    const BOUND: Duration = Duration::from_millis(1_500);
    let mut server = RedisChild::start(RedisChild::free_port()).await;
    let opts =
        || RedisOptions { prefix: "tollgate".into(), timeout: Duration::from_millis(300), ..RedisOptions::default() };
    let fb = FallbackOptions { retry_shared_after_ms: 200 };
    let gateway = || Arc::new(FallbackLimiter::new(Arc::new(RedisLimiter::new(&server.url(), opts()).unwrap()), fb));
    let gateways = [gateway(), gateway()];
    until_shared(&gateways, Duration::from_secs(5)).await;

    // Healthy: one window across both gateways.
    let k = uniq("key");
    let shared = |f: usize, limit: u64| {
        let (f, k) = (gateways[f].clone(), k.clone());
        async move { f.check(&windows(now_ms(), vec![window(&k, limit)])).await.unwrap() }
    };
    for f in [0, 1, 0, 1] {
        let out = shared(f, 4).await;
        assert_eq!(out.counting, Counting::Shared);
        assert!(matches!(out.verdict, Verdict::Admitted { .. }));
    }
    assert!(matches!(shared(0, 4).await.verdict, Verdict::WindowRefused { .. }));

    // Traffic from both gateways through every phase: windows-only and gated checks, each timed.
    let stop = Arc::new(AtomicBool::new(false));
    let traffic = Arc::new(Traffic::default());
    let gate_key = uniq("model");
    let mut tasks = Vec::new();
    for i in 0..8 {
        let (f, stop, traffic, gate_key) = (gateways[i % 2].clone(), stop.clone(), traffic.clone(), gate_key.clone());
        tasks.push(tokio::spawn(async move {
            let key = uniq("key");
            while !stop.load(Ordering::SeqCst) {
                let c = if i < 4 {
                    windows(now_ms(), vec![window(&key, 1_000_000)])
                } else {
                    let lease = uuid::Uuid::new_v4().to_string();
                    Check { lease_ttl_ms: 60_000, ..gates(now_ms(), &lease, vec![gate("m", &gate_key, 1_000_000)]) }
                };
                let started = Instant::now();
                let out = f.check(&c).await;
                traffic.slowest_ms.fetch_max(started.elapsed().as_millis() as u64, Ordering::SeqCst);
                match out {
                    Ok(Outcome { counting: Counting::Shared, verdict: Verdict::Admitted { lease, .. } }) => {
                        traffic.shared.fetch_add(1, Ordering::SeqCst);
                        if let Some(lease) = lease {
                            // A failed release leaves the lease to its TTL; the end check allows none.
                            while f.release(&lease).await.is_err() {
                                tokio::time::sleep(Duration::from_millis(50)).await;
                            }
                        }
                    }
                    Ok(Outcome { counting: Counting::Local, verdict: Verdict::Admitted { .. } }) => {
                        traffic.local.fetch_add(1, Ordering::SeqCst);
                    }
                    Err(LimiterError::Unavailable(_) | LimiterError::Recovering { .. }) => {
                        _ = traffic.unavailable.fetch_add(1, Ordering::SeqCst)
                    }
                    other => panic!("unexpected {other:?}"),
                }
                tokio::time::sleep(Duration::from_millis(5)).await;
            }
        }));
    }
    tokio::time::sleep(Duration::from_millis(300)).await;

    // (1) The store hangs (SIGSTOP): calls time out and count locally; gated calls are refused.
    let raw = RedisLimiter::new(&server.url(), opts()).unwrap();
    raw.ping().await.unwrap();
    let ghost = uniq("ws");
    let one = |lease: &str| gates(now_ms(), lease, vec![gate("workspace", &ghost, 1)]);
    server.signal(libc::SIGSTOP);
    let started = Instant::now();
    assert!(matches!(raw.check(&one("stalled")).await, Err(LimiterError::Unavailable(_))));
    assert!(started.elapsed() < BOUND);
    tokio::time::sleep(Duration::from_millis(1_000)).await;
    let out = gateways[0].check(&windows(now_ms(), vec![window(&uniq("key"), 5)])).await.unwrap();
    assert_eq!(out.counting, Counting::Local);
    server.signal(libc::SIGCONT);
    until_shared(&gateways, Duration::from_secs(5)).await;
    // The stalled check ran when the store woke up; its lease was released right behind it.
    let deadline = Instant::now() + Duration::from_secs(3);
    loop {
        match raw.check(&one(&uuid::Uuid::new_v4().to_string())).await.unwrap() {
            Verdict::Admitted { .. } => break,
            v => assert!(Instant::now() < deadline, "the stalled check's lease is still held: {v:?}"),
        }
        tokio::time::sleep(Duration::from_millis(50)).await;
    }

    // (2) The store dies (SIGKILL): a fresh key gets exactly its limit in this server's window.
    server.kill();
    tokio::time::sleep(Duration::from_millis(500)).await;
    let (k2, now) = (uniq("key"), now_ms());
    for i in 0..4 {
        let out = gateways[1].check(&windows(now, vec![window(&k2, 3)])).await.unwrap();
        assert_eq!(out.counting, Counting::Local);
        assert_eq!(matches!(out.verdict, Verdict::Admitted { .. }), i < 3, "{out:?}");
    }
    let g = gates(now, "x", vec![gate("m", &gate_key, 10)]);
    assert!(matches!(gateways[1].check(&g).await, Err(LimiterError::Unavailable(_))));
    tokio::time::sleep(Duration::from_millis(700)).await;

    // (3) The store is back (empty: no persistence): shared counting resumes on both gateways.
    let port = server.port;
    let _server = RedisChild::start(port).await;
    until_shared(&gateways, Duration::from_secs(10)).await;
    tokio::time::sleep(Duration::from_millis(300)).await;
    stop.store(true, Ordering::SeqCst);
    for task in tasks {
        task.await.unwrap();
    }
    let k3 = uniq("key");
    for (f, admitted) in [(0, true), (1, true), (0, false)] {
        let out = gateways[f].check(&windows(now_ms(), vec![window(&k3, 2)])).await.unwrap();
        assert_eq!((out.counting, matches!(out.verdict, Verdict::Admitted { .. })), (Counting::Shared, admitted));
    }

    let t = &traffic;
    let (shared, local, unavailable) =
        (t.shared.load(Ordering::SeqCst), t.local.load(Ordering::SeqCst), t.unavailable.load(Ordering::SeqCst));
    let slowest = Duration::from_millis(t.slowest_ms.load(Ordering::SeqCst));
    eprintln!("outage traffic: {shared} shared, {local} local, {unavailable} unavailable, slowest call {slowest:?}");
    assert!(shared > 0 && local > 0 && unavailable > 0);
    assert!(slowest < BOUND, "a call took {slowest:?}");
}

/// Decision 202 (issue 48): Redis restarted without persistence loses every gate set. The
/// running requests' leases are registered again by their keepers, and no gated check is
/// admitted before they are: two gateways hold 3 of a gate's 4 slots, Redis restarts, and
/// from then on exactly one more is admitted, never four.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn after_a_store_restart_running_leases_count_again_before_anything_is_admitted() {
    use tollgate::state::limits::LeaseKeeper;
    let port = RedisChild::free_port();
    let mut server = RedisChild::start(port).await;
    let opts =
        || RedisOptions { prefix: "tollgate".into(), timeout: Duration::from_millis(300), ..RedisOptions::default() };
    let fb = FallbackOptions { retry_shared_after_ms: 200 };
    let gateway = || Arc::new(FallbackLimiter::new(Arc::new(RedisLimiter::new(&server.url(), opts()).unwrap()), fb));
    let gateways = [gateway(), gateway()];
    let keepers = gateways.clone().map(|g| LeaseKeeper::new(g, Duration::from_secs(30)));
    let ws = uniq("ws");
    let one = |id: &str| Check { lease_ttl_ms: 30_000, ..gates(now_ms(), id, vec![gate("workspace", &ws, 4)]) };
    let mut running = Vec::new();
    for (i, id) in ["a", "b", "c"].into_iter().enumerate() {
        let out = gateways[i % 2].check(&one(id)).await.unwrap();
        let Verdict::Admitted { lease: Some(lease), .. } = out.verdict else { panic!("{out:?}") };
        running.push(keepers[i % 2].hold(lease));
    }
    // Let each keeper read the store's epoch once before the restart.
    tokio::time::sleep(Duration::from_millis(1_500)).await;
    server.kill();
    let _server = RedisChild::start(port).await;
    let restarted = Instant::now();
    // From the restart on: a gated check is either refused (recovering, or the gate full) or
    // admitted while the three running leases count; at most one is admitted in all.
    let mut admitted = Vec::new();
    let mut recovering = 0;
    while restarted.elapsed() < Duration::from_secs(8) {
        let id = uuid::Uuid::new_v4().to_string();
        match gateways[admitted.len() % 2].check(&one(&id)).await {
            Ok(Outcome { verdict: Verdict::Admitted { lease: Some(l), gates_in_use, .. }, .. }) => {
                assert_eq!(gates_in_use, vec![4], "admitted beside the three running requests");
                admitted.push(l);
            }
            Ok(Outcome { verdict: Verdict::GateRefused { in_use, .. }, .. }) => assert!(in_use >= 4, "{in_use}"),
            Err(LimiterError::Recovering { retry_after_ms }) => {
                assert!(retry_after_ms <= 3_000);
                recovering += 1;
            }
            Err(LimiterError::Unavailable(_)) => {} // reconnecting
            other => panic!("unexpected {other:?}"),
        }
        tokio::time::sleep(Duration::from_millis(50)).await;
    }
    assert!(recovering > 0, "gated checks waited for the recovery");
    assert_eq!(admitted.len(), 1, "one slot was free: {admitted:?}");
    for held in running {
        held.release().await;
    }
}
