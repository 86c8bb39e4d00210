//! The outage fallback against a store switched off in process: local windows, and no papering over.

use async_trait::async_trait;

use super::*;

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
