//! Ordered concurrency gates on both backends: their leases, renewal, expiry and releases.

use super::*;

both_backends!(
    gates_are_checked_in_order_and_nothing_is_recorded_on_refusal,
    a_key_in_two_gates_sheds_large_prompts_first,
    a_lease_not_renewed_frees_after_its_ttl,
    release_is_idempotent,
    a_deferred_release_frees_the_slot_here_at_once_and_elsewhere_soon,
);

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
