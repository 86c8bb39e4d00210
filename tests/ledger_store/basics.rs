//! One request at a time on every backend: top-ups, holds, settlement with the carry, releases, sweeps, freezing.

use super::*;

both_backends!(
    top_ups_and_lifetime_purchases,
    holds_are_refused_when_the_balance_cannot_cover_them,
    settlement_is_exactly_once_and_carries_sub_cent_remainders,
    releases_and_the_expiry_sweep_charge_nothing,
    freezing,
    expired_credit_is_removed_once_and_spending_uses_it_first,
    a_second_hold_for_a_request_fails_alone_and_its_batch_commits,
    ops_for_a_workspace_that_does_not_exist_write_nothing,
);

/// No op writes a row for a workspace that does not exist: no hold, no entry, whichever op
/// names it, and a real workspace's ops batched with them commit. On PostgreSQL no foreign
/// key stands behind this since decision 195: the batch's planner is what keeps it.
async fn ops_for_a_workspace_that_does_not_exist_write_nothing(s: Stores) {
    let ws = workspace(&s).await;
    let ghost = uuid::Uuid::new_v4().to_string();
    let l = &s.ledger;
    l.top_up(&ws, 1000, "purchase", None, now_ms()).await.unwrap();
    assert!(l.top_up(&ghost, 1000, "purchase", None, now_ms()).await.is_err(), "a top-up of no workspace");
    let now = now_ms();
    // Together, so that group commit puts them in one batch.
    let ghost_settlement = settlement(&ghost, "g2", 2_000_000);
    let (real, ghost_hold, ghost_settled, ghost_funded) = tokio::join!(
        l.place_hold("r1", &ws, Some("key_a"), 10, now + 60_000, now),
        l.place_hold("g1", &ghost, Some("key_a"), 10, now + 60_000, now),
        l.settle(&ghost_settlement),
        l.fund(fund_op(&ghost, "g3", 5, now + 60_000)),
    );
    assert_eq!(real.unwrap(), HoldOutcome::Placed { balance_cents: 990 });
    assert_eq!(ghost_hold.unwrap(), HoldOutcome::Insufficient { balance_cents: 0 });
    assert!(ghost_settled.is_err(), "a settlement of no workspace: {ghost_settled:?}");
    assert_eq!(ghost_funded.unwrap().verdict, Err(FundRefusal::Insufficient { balance_cents: 0 }));
    for rid in ["g1", "g2", "g3"] {
        assert!(!l.release_hold(rid, now_ms()).await.unwrap(), "a hold row for {rid}");
    }
    assert!(l.entries(&ghost, 100).await.unwrap().is_empty(), "entries for no workspace");
    assert!(l.balance(&ghost).await.unwrap().is_none());
    assert_eq!(
        l.settle(&settlement(&ws, "r1", 2_000_000)).await.unwrap(),
        SettleOutcome::Settled { debit_cents: 2, balance_cents: 998 }
    );
    assert_eq!(l.derived_balance(&ws).await.unwrap(), 998);
}

async fn expired_credit_is_removed_once_and_spending_uses_it_first(s: Stores) {
    let ws = workspace(&s).await;
    let l = &s.ledger;
    let t0 = now_ms();
    let (soon, later) = (t0 + 1_000, t0 + 10_000);
    l.top_up(&ws, 100, "grant", None, t0).await.unwrap();
    l.top_up(&ws, 1_000, "purchase", Some(soon), t0).await.unwrap();
    l.top_up(&ws, 500, "promo", Some(later), t0).await.unwrap();
    // Spend $3 and keep 50 cents held by a running request.
    l.settle(&settlement(&ws, "r1", 300 * 1_000_000)).await.unwrap();
    assert!(matches!(l.place_hold("r2", &ws, None, 50, later, t0).await.unwrap(), HoldOutcome::Placed { .. }));
    assert_eq!(l.balance(&ws).await.unwrap().unwrap().balance_cents, 1_250);
    assert!(l.sweep_expired_credit(soon - 1).await.unwrap().is_empty(), "nothing is due before the expiry");
    // Balance 1,250 belongs to the grant (100), the promo (500) and 650 of the purchase.
    assert_eq!(l.sweep_expired_credit(soon).await.unwrap(), vec![(ws.clone(), 650)]);
    let b = l.balance(&ws).await.unwrap().unwrap();
    assert_eq!((b.balance_cents, b.held_cents), (600, 50), "held credit does not expire under a request");
    assert_eq!(l.derived_balance(&ws).await.unwrap(), 600, "the expiry is an entry");
    assert!(l.sweep_expired_credit(soon + 5).await.unwrap().is_empty(), "a top-up expires once");
    let entries = l.entries(&ws, 50).await.unwrap();
    assert_eq!(entries.iter().filter(|e| e.kind == "expiry").map(|e| e.amount_cents).collect::<Vec<_>>(), vec![-650]);
    // The hold settles for 20 of its 50 cents; then the promo expires whole. The 30 cents the
    // hold gave back belong to no live top-up and stay, with the never-expiring grant.
    l.settle(&settlement(&ws, "r2", 20 * 1_000_000)).await.unwrap();
    assert_eq!(l.balance(&ws).await.unwrap().unwrap().balance_cents, 630);
    assert_eq!(l.sweep_expired_credit(later).await.unwrap(), vec![(ws.clone(), 500)]);
    let b = l.balance(&ws).await.unwrap().unwrap();
    assert_eq!(b.balance_cents, 130);
    assert_eq!(l.derived_balance(&ws).await.unwrap(), 130);
}

async fn top_ups_and_lifetime_purchases(s: Stores) {
    let ws = workspace(&s).await;
    let l = &s.ledger;
    l.top_up(&ws, 100, "grant", None, now_ms()).await.unwrap();
    l.top_up(&ws, 500, "purchase", Some(now_ms() + 1), now_ms()).await.unwrap();
    let (_, bal) = l.top_up(&ws, 300, "promo", None, now_ms()).await.unwrap();
    assert_eq!(bal, 900);
    let b = l.balance(&ws).await.unwrap().unwrap();
    assert_eq!(b.lifetime_purchases_cents, 500, "promotional credit and grants are not purchases");
    assert_eq!(l.derived_balance(&ws).await.unwrap(), 900);
    assert_eq!(l.entries(&ws, 10).await.unwrap().len(), 3);
}

async fn holds_are_refused_when_the_balance_cannot_cover_them(s: Stores) {
    let ws = workspace(&s).await;
    let l = &s.ledger;
    l.top_up(&ws, 100, "grant", None, now_ms()).await.unwrap();
    let now = now_ms();
    assert_eq!(
        l.place_hold("r1", &ws, None, 60, now + 1000, now).await.unwrap(),
        HoldOutcome::Placed { balance_cents: 40 }
    );
    assert_eq!(
        l.place_hold("r2", &ws, None, 41, now + 1000, now).await.unwrap(),
        HoldOutcome::Insufficient { balance_cents: 40 }
    );
    let b = l.balance(&ws).await.unwrap().unwrap();
    assert_eq!((b.balance_cents, b.held_cents), (40, 60), "held amounts are inside the balance");
    assert_eq!(l.derived_balance(&ws).await.unwrap(), 40);
}

async fn settlement_is_exactly_once_and_carries_sub_cent_remainders(s: Stores) {
    let ws = workspace(&s).await;
    let l = &s.ledger;
    l.top_up(&ws, 1000, "purchase", None, now_ms()).await.unwrap();
    let now = now_ms();
    l.place_hold("r1", &ws, Some("key_a"), 10, now + 1000, now).await.unwrap();
    // 2.5 cents: 2 debited, half a cent carried.
    let out = l.settle(&settlement(&ws, "r1", 2_500_000)).await.unwrap();
    assert_eq!(out, SettleOutcome::Settled { debit_cents: 2, balance_cents: 998 });
    assert_eq!(l.settle(&settlement(&ws, "r1", 2_500_000)).await.unwrap(), SettleOutcome::AlreadySettled);
    let b = l.balance(&ws).await.unwrap().unwrap();
    assert_eq!((b.balance_cents, b.held_cents, b.carry_microcents), (998, 0, 500_000));
    // Ten sub-cent requests of 0.3 cents: 3 cents in all with the carry.
    for i in 0..10 {
        l.settle(&settlement(&ws, &format!("s{i}"), 300_000)).await.unwrap();
    }
    let b = l.balance(&ws).await.unwrap().unwrap();
    // 0.5 + 3.0 = 3.5 cents more: balance drops by 3, carry 0.5 cent.
    assert_eq!((b.balance_cents, b.carry_microcents), (995, 500_000));
    assert_eq!(l.derived_balance(&ws).await.unwrap(), b.balance_cents);
    assert_eq!(l.key_month_spend("key_a", "2026-11").await.unwrap(), 2_500_000 + 10 * 300_000);
    assert_eq!(l.spent_since(&ws, 0).await.unwrap(), 5);
}

async fn releases_and_the_expiry_sweep_charge_nothing(s: Stores) {
    let ws = workspace(&s).await;
    let l = &s.ledger;
    l.top_up(&ws, 100, "grant", None, now_ms()).await.unwrap();
    let now = now_ms();
    l.place_hold("a", &ws, None, 30, now + 60_000, now).await.unwrap();
    l.place_hold("b", &ws, None, 30, now - 1, now).await.unwrap();
    assert!(l.release_hold("a", now).await.unwrap());
    assert!(!l.release_hold("a", now).await.unwrap(), "released once");
    assert_eq!(l.sweep_expired_holds(now).await.unwrap(), vec!["b".to_string()]);
    assert!(l.sweep_expired_holds(now).await.unwrap().is_empty());
    let b = l.balance(&ws).await.unwrap().unwrap();
    assert_eq!((b.balance_cents, b.held_cents), (100, 0));
    // A late settlement of a swept request still settles once, for its delivered cost only.
    assert!(matches!(
        l.settle(&settlement(&ws, "b", 1_000_000)).await.unwrap(),
        SettleOutcome::Settled { debit_cents: 1, .. }
    ));
    assert_eq!(l.balance(&ws).await.unwrap().unwrap().balance_cents, 99);
    assert_eq!(l.derived_balance(&ws).await.unwrap(), 99);
    // A hold of nothing (an unpriced model) released stays released: on PostgreSQL a batch
    // that changed only a hold's state once wrote nothing, and the sweeper found it again.
    l.place_hold("z", &ws, None, 0, now - 1, now).await.unwrap();
    assert!(l.release_hold("z", now).await.unwrap());
    assert!(!l.release_hold("z", now).await.unwrap(), "released once");
    assert!(l.sweep_expired_holds(now).await.unwrap().is_empty());
}

/// A request id holds once. The batched SQLite store does not look the id up before the
/// insert (decision 142): the duplicate fails on the primary key and only that op fails; the
/// holds queued beside it are placed, and the money counts each hold once.
async fn a_second_hold_for_a_request_fails_alone_and_its_batch_commits(s: Stores) {
    let ws = workspace(&s).await;
    let l: Arc<dyn LedgerStore> = s.ledger.clone();
    l.top_up(&ws, 1000, "purchase", None, now_ms()).await.unwrap();
    let now = now_ms();
    assert_eq!(
        l.place_hold("d0", &ws, None, 10, now + 60_000, now).await.unwrap(),
        HoldOutcome::Placed { balance_cents: 990 }
    );
    // Queued together, so the duplicate usually shares a transaction with the others.
    let tasks: Vec<_> = ["d1", "d0", "d2", "d0", "d3"]
        .into_iter()
        .map(|rid| {
            let (l, ws) = (l.clone(), ws.clone());
            tokio::spawn(async move { (rid, l.place_hold(rid, &ws, None, 10, now + 60_000, now).await) })
        })
        .collect();
    for t in tasks {
        let (rid, r) = t.await.unwrap();
        if rid == "d0" {
            assert!(matches!(r, Err(tollgate::store::StoreError::Conflict(_))), "{rid}: {r:?}");
        } else {
            assert!(matches!(r, Ok(HoldOutcome::Placed { .. })), "{rid}: {r:?}");
        }
    }
    let b = l.balance(&ws).await.unwrap().unwrap();
    assert_eq!((b.balance_cents, b.held_cents), (960, 40), "four holds, each once");
    // The first hold is still the one in force: releasing it gives back its 10 cents once.
    assert!(l.release_hold("d0", now_ms()).await.unwrap());
    assert!(!l.release_hold("d0", now_ms()).await.unwrap());
    let b = l.balance(&ws).await.unwrap().unwrap();
    assert_eq!((b.balance_cents, b.held_cents), (970, 30));
    assert_eq!(l.derived_balance(&ws).await.unwrap(), 970, "entries minus open holds");
}

async fn freezing(s: Stores) {
    let ws = workspace(&s).await;
    assert!(s.ledger.set_frozen(&ws, Some("dispute")).await.unwrap());
    assert_eq!(s.identity.workspace(&ws).await.unwrap().unwrap().frozen.as_deref(), Some("dispute"));
    assert!(s.ledger.set_frozen(&ws, None).await.unwrap());
    assert_eq!(s.identity.workspace(&ws).await.unwrap().unwrap().frozen, None);
    assert!(!s.ledger.set_frozen("nope", None).await.unwrap());
}
