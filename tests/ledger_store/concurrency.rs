//! What batching must keep exact under concurrency: refusals, settlement once, the audit.

use super::*;

both_backends!(
    racing_settlements_of_one_request_debit_once,
    concurrent_holds_never_overdraw,
    concurrent_holds_of_mixed_sizes_refuse_exactly_what_does_not_fit,
    concurrent_settlements_apply_once_each_and_the_audit_holds,
);

async fn concurrent_holds_of_mixed_sizes_refuse_exactly_what_does_not_fit(s: Stores) {
    let ws = workspace(&s).await;
    let l: Arc<dyn LedgerStore> = s.ledger.clone();
    l.top_up(&ws, 500, "purchase", None, now_ms()).await.unwrap();
    let tasks: Vec<_> = (0..300i64)
        .map(|i| {
            let (l, ws) = (l.clone(), ws.clone());
            let amount = [3, 5, 11][(i % 3) as usize];
            tokio::spawn(async move {
                let now = now_ms();
                (amount, l.place_hold(&format!("m{i}"), &ws, Some("key_a"), amount, now + 60_000, now).await.unwrap())
            })
        })
        .collect();
    let (mut placed, mut refused) = (Vec::new(), Vec::new());
    for t in tasks {
        match t.await.unwrap() {
            (a, HoldOutcome::Placed { balance_cents }) => placed.push((a, balance_cents)),
            (a, HoldOutcome::Insufficient { balance_cents }) => {
                assert!(balance_cents < a, "refused only when the balance at its turn could not cover it");
                refused.push(a)
            }
        }
    }
    let b = l.balance(&ws).await.unwrap().unwrap();
    let held: i64 = placed.iter().map(|p| p.0).sum();
    assert_eq!((b.balance_cents, b.held_cents), (500 - held, held), "no overdraft, every placed hold counted");
    assert!(b.balance_cents >= 0);
    // The balance only fell during the run, so each refused hold exceeds the final balance.
    assert!(
        refused.iter().all(|&a| a > b.balance_cents),
        "a refused hold would fit: {refused:?} at {}",
        b.balance_cents
    );
    assert!(!refused.is_empty() && !placed.is_empty());
    assert!(placed.iter().all(|p| p.1 >= 0 && p.1 >= b.balance_cents));
    assert_eq!(l.derived_balance(&ws).await.unwrap(), b.balance_cents);
}

async fn concurrent_settlements_apply_once_each_and_the_audit_holds(s: Stores) {
    let ws = workspace(&s).await;
    let l: Arc<dyn LedgerStore> = s.ledger.clone();
    l.top_up(&ws, 100_000, "purchase", None, now_ms()).await.unwrap();
    let n = 300u64;
    let holds: Vec<_> = (0..n)
        .map(|i| {
            let (l, ws) = (l.clone(), ws.clone());
            tokio::spawn(async move {
                let now = now_ms();
                l.place_hold(&format!("q{i}"), &ws, Some("key_a"), 10, now + 60_000, now).await.unwrap()
            })
        })
        .collect();
    for h in holds {
        assert!(matches!(h.await.unwrap(), HoldOutcome::Placed { .. }));
    }
    // Every request settled twice at once (a retry racing the first attempt); costs with
    // sub-cent remainders so the carry is exercised across batches.
    let cost = |i: u64| 1_000_000 + i * 37_313;
    let tasks: Vec<_> = (0..2 * n)
        .map(|j| {
            let (l, ws, i) = (l.clone(), ws.clone(), j % n);
            tokio::spawn(async move { l.settle(&settlement(&ws, &format!("q{i}"), cost(i))).await.unwrap() })
        })
        .collect();
    let (mut settled, mut again, mut debited) = (0, 0, 0);
    for t in tasks {
        match t.await.unwrap() {
            SettleOutcome::Settled { debit_cents, .. } => {
                settled += 1;
                debited += debit_cents;
            }
            SettleOutcome::AlreadySettled => again += 1,
        }
    }
    assert_eq!((settled, again), (n, n), "each request settles exactly once");
    let total: u64 = (0..n).map(cost).sum();
    let b = l.balance(&ws).await.unwrap().unwrap();
    assert_eq!(debited * 1_000_000 + b.carry_microcents, total as i64, "whole cents debited, the rest carried");
    assert_eq!((b.balance_cents, b.held_cents), (100_000 - debited, 0), "no hold left");
    assert_eq!(l.derived_balance(&ws).await.unwrap(), b.balance_cents, "balance = sum of entries");
    let entries = l.entries(&ws, 10_000).await.unwrap();
    let count = |kind: &str| entries.iter().filter(|e| e.kind == kind).count() as u64;
    assert_eq!(count("settlement"), n, "one settlement entry per request");
    assert_eq!((count("hold"), count("hold_release")), (0, 0), "holds are recorded by their rows (decision 133)");
    assert_eq!(l.key_month_spend("key_a", "2026-11").await.unwrap(), total as i64);
    assert!(l.sweep_expired_holds(now_ms() + 120_000).await.unwrap().is_empty(), "nothing left to sweep");
}

async fn racing_settlements_of_one_request_debit_once(s: Stores) {
    let ws = workspace(&s).await;
    let l: Arc<dyn LedgerStore> = s.ledger.clone();
    l.top_up(&ws, 1000, "purchase", None, now_ms()).await.unwrap();
    let now = now_ms();
    l.place_hold("race", &ws, Some("key_a"), 10, now + 60_000, now).await.unwrap();
    let tasks: Vec<_> = (0..8)
        .map(|_| {
            let (l, ws) = (l.clone(), ws.clone());
            tokio::spawn(async move { l.settle(&settlement(&ws, "race", 3_000_000)).await.unwrap() })
        })
        .collect();
    let mut settled = 0;
    for t in tasks {
        match t.await.unwrap() {
            SettleOutcome::Settled { debit_cents, .. } => {
                assert_eq!(debit_cents, 3);
                settled += 1;
            }
            SettleOutcome::AlreadySettled => {}
        }
    }
    assert_eq!(settled, 1, "exactly one of eight racing settlements applies");
    let b = l.balance(&ws).await.unwrap().unwrap();
    assert_eq!((b.balance_cents, b.held_cents), (997, 0));
    assert_eq!(l.derived_balance(&ws).await.unwrap(), 997);
    assert_eq!(l.key_month_spend("key_a", "2026-11").await.unwrap(), 3_000_000);
}

async fn concurrent_holds_never_overdraw(s: Stores) {
    let ws = workspace(&s).await;
    let l: Arc<dyn LedgerStore> = s.ledger.clone();
    l.top_up(&ws, 1000, "purchase", None, now_ms()).await.unwrap();
    let tasks: Vec<_> = (0..200)
        .map(|i| {
            let (l, ws) = (l.clone(), ws.clone());
            tokio::spawn(async move {
                let now = now_ms();
                l.place_hold(&format!("c{i}"), &ws, None, 7, now + 60_000, now).await.unwrap()
            })
        })
        .collect();
    let mut placed = 0;
    for t in tasks {
        if matches!(t.await.unwrap(), HoldOutcome::Placed { .. }) {
            placed += 1;
        }
    }
    assert_eq!(placed, 1000 / 7, "exactly as many holds as the balance covers");
    let b = l.balance(&ws).await.unwrap().unwrap();
    assert_eq!(b.balance_cents, 1000 - 7 * placed);
    assert!(b.balance_cents >= 0);
    assert_eq!(l.derived_balance(&ws).await.unwrap(), b.balance_cents);
}
