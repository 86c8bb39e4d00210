//! The ledger store suite on both backends: top-ups, atomic holds, exactly-once settlement
//! with the cent carry, releases, the expiry sweep, and balance == sum of entries.
#![allow(clippy::unwrap_used, clippy::expect_used, clippy::panic)]

mod common;

use std::sync::Arc;

use common::pg;
use tollgate::clock::now_ms;
use tollgate::identity::{RateTier, Workspace};
use tollgate::store::ledger::{HoldOutcome, LedgerStore, SettleOutcome, Settlement};
use tollgate::store::{StoreConfig, Stores};

async fn sqlite() -> Stores {
    let dir = std::env::temp_dir().join(format!("tollgate-ledger-{}", uuid::Uuid::new_v4().simple()));
    let s = tollgate::store::open_stores(&StoreConfig::Sqlite { path: dir.join("l.db") }).await.unwrap();
    s.identity.migrate().await.unwrap();
    s
}

async fn postgres() -> Stores {
    let s = tollgate::store::open_stores(&StoreConfig::Postgres { url: pg::fresh_database().await }).await.unwrap();
    s.identity.migrate().await.unwrap();
    s
}

async fn workspace(s: &Stores) -> String {
    let ws = Workspace {
        id: uuid::Uuid::new_v4().to_string(),
        name: "w".into(),
        rate_tier: RateTier::Free,
        created_at: now_ms(),
        frozen: None,
        lifetime_purchases_cents: 0,
    };
    s.identity.create_workspace(&ws).await.unwrap();
    ws.id
}

fn settlement(ws: &str, rid: &str, cost: u64) -> Settlement {
    Settlement {
        request_id: rid.into(),
        workspace_id: ws.into(),
        key_id: Some("key_a".into()),
        cost: tollgate::money::Microcents(cost),
        now: now_ms(),
        month: "2026-11".into(),
    }
}

macro_rules! both_backends {
    ($($name:ident),* $(,)?) => {$(
        mod $name {
            #[tokio::test(flavor = "multi_thread", worker_threads = 2)]
            async fn sqlite() { super::$name(super::sqlite().await).await }
            #[tokio::test(flavor = "multi_thread", worker_threads = 2)]
            async fn postgres() { super::$name(super::postgres().await).await }
        }
    )*};
}

both_backends!(
    top_ups_and_lifetime_purchases,
    holds_are_refused_when_the_balance_cannot_cover_them,
    settlement_is_exactly_once_and_carries_sub_cent_remainders,
    releases_and_the_expiry_sweep_charge_nothing,
    concurrent_holds_never_overdraw,
    freezing,
    expired_credit_is_removed_once_and_spending_uses_it_first,
    racing_settlements_of_one_request_debit_once,
);

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

async fn freezing(s: Stores) {
    let ws = workspace(&s).await;
    assert!(s.ledger.set_frozen(&ws, Some("dispute")).await.unwrap());
    assert_eq!(s.identity.workspace(&ws).await.unwrap().unwrap().frozen.as_deref(), Some("dispute"));
    assert!(s.ledger.set_frozen(&ws, None).await.unwrap());
    assert_eq!(s.identity.workspace(&ws).await.unwrap().unwrap().frozen, None);
    assert!(!s.ledger.set_frozen("nope", None).await.unwrap());
}
