//! Sliding request windows and tokens per minute on both backends, two gateways sharing one under load.

use super::*;

both_backends!(
    window_admits_exactly_the_limit_and_reports_remaining_and_reset,
    a_refused_window_records_nothing,
    tokens_per_minute_refuse_above_the_remaining_budget,
    two_gateways_admit_exactly_the_window_and_never_exceed_a_gate,
    malformed_checks_are_refused,
);

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
