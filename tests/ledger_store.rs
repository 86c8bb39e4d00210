//! The ledger store suite on both backends, each with group commit (what `serve` runs) and
//! without (each write its own transaction): top-ups, atomic holds, exactly-once settlement
//! with the cent carry, releases, the expiry sweep, and balance == sum of entries; and what
//! batching must keep exact under concurrency (refusals, settlement once, the audit).
#![allow(clippy::unwrap_used, clippy::expect_used, clippy::panic)]

mod common;

use std::sync::Arc;
use std::time::Duration;

use common::pg;
use tollgate::identity::{RateTier, Workspace};
use tollgate::money::plans::decide::{FundAsk, Funding, Refusal};
use tollgate::money::plans::{PlanSettings, PlanTerms, Status, Tier};
use tollgate::runtime::clock::now_ms;
use tollgate::store::ledger::{HoldOutcome, LedgerStore, SettleOutcome, Settlement};
use tollgate::store::ledger_ops::{FundOp, FundRefusal};
use tollgate::store::{StoreConfig, Stores};

async fn sqlite() -> Stores {
    let dir = std::env::temp_dir().join(format!("tollgate-ledger-{}", uuid::Uuid::new_v4().simple()));
    let s = tollgate::store::open_stores(&StoreConfig::Sqlite { path: dir.join("l.db") }).await.unwrap();
    s.identity.migrate().await.unwrap();
    s
}

/// PostgreSQL with a generous call bound: these tests run hundreds of calls at once on one
/// workspace row, on a machine that may be running a build beside them, and are about
/// exactness, not outages (a timed-out call there is a store outage, tested elsewhere).
fn pg_config(url: String) -> StoreConfig {
    StoreConfig::Postgres { url, call_timeout: Duration::from_secs(120), tls: None }
}

async fn postgres() -> Stores {
    let s = tollgate::store::open_stores(&pg_config(pg::fresh_database().await)).await.unwrap();
    s.identity.migrate().await.unwrap();
    s
}

async fn sqlite_unbatched() -> Stores {
    let dir = std::env::temp_dir().join(format!("tollgate-ledger-{}", uuid::Uuid::new_v4().simple()));
    let s = tollgate::store::open_stores_unbatched(&StoreConfig::Sqlite { path: dir.join("l.db") }).await.unwrap();
    s.identity.migrate().await.unwrap();
    s
}

async fn postgres_unbatched() -> Stores {
    let url = pg::fresh_database().await;
    let s = tollgate::store::open_stores_unbatched(&pg_config(url)).await.unwrap();
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
        plan: None,
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
        value: tollgate::money::Microcents(cost),
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
            #[tokio::test(flavor = "multi_thread", worker_threads = 2)]
            async fn sqlite_unbatched() { super::$name(super::sqlite_unbatched().await).await }
            #[tokio::test(flavor = "multi_thread", worker_threads = 2)]
            async fn postgres_unbatched() { super::$name(super::postgres_unbatched().await).await }
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
    concurrent_holds_of_mixed_sizes_refuse_exactly_what_does_not_fit,
    concurrent_settlements_apply_once_each_and_the_audit_holds,
    plan_holds_meter_once_and_the_sweeper_frees_them,
    a_second_hold_for_a_request_fails_alone_and_its_batch_commits,
    ops_for_a_workspace_that_does_not_exist_write_nothing,
);

fn fund_op(ws: &str, rid: &str, value_cents: i64, expires_at: i64) -> FundOp {
    let mut settings = PlanSettings::default();
    settings.starter.five_hour_microcents = 40 * 1_000_000;
    settings.starter.plan_concurrency = 4;
    FundOp {
        request_id: rid.into(),
        workspace_id: ws.into(),
        key_id: Some("key_a".into()),
        ask: FundAsk {
            value_microcents: value_cents * 1_000_000,
            hold_cents: value_cents,
            covered: true,
            ..FundAsk::default()
        },
        settings: Arc::new(settings),
        expires_at,
        now: now_ms(),
    }
}

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

/// A plan-funded request reserves no money, meters its value into the windows once when it
/// settles, and a plan hold whose gateway died is freed by the sweeper (pending and running
/// back to zero, nothing metered).
async fn plan_holds_meter_once_and_the_sweeper_frees_them(s: Stores) {
    let ws = workspace(&s).await;
    let l = &s.ledger;
    l.top_up(&ws, 100, "grant", None, now_ms()).await.unwrap();
    let now = now_ms();
    let terms = PlanTerms {
        tier: Tier::Starter,
        status: Status::Active,
        started_at: now,
        cancel_at: None,
        grace_until: None,
        credits_enabled: false,
        cap_cents: None,
        pending_tier: None,
        pending_effective_at: None,
    };
    assert!(l.set_plan(&ws, &terms, now).await.unwrap().is_some());
    let a = l.fund(fund_op(&ws, "pa", 20, now + 60_000)).await.unwrap();
    assert_eq!(a.verdict, Ok(Funding::Plan));
    assert!(
        a.plan.unwrap().record.counters.five_hour_start.is_some(),
        "the first plan request starts the 5-hour clock"
    );
    let dead = l.fund(fund_op(&ws, "pdead", 20, now - 1)).await.unwrap();
    assert_eq!(dead.verdict, Ok(Funding::Plan));
    // Running requests hold all 40 cents: the next one waits for room.
    let busy = l.fund(fund_op(&ws, "pc", 20, now + 60_000)).await.unwrap();
    assert_eq!(busy.verdict, Err(FundRefusal::Plan(Refusal::WindowBusy)));
    let b = l.balance(&ws).await.unwrap().unwrap();
    assert_eq!((b.balance_cents, b.held_cents), (100, 0), "plan holds reserve no money");
    let mut paid = settlement(&ws, "pa", 0);
    paid.value = tollgate::money::Microcents(15_000_000);
    assert!(matches!(l.settle(&paid).await.unwrap(), SettleOutcome::Settled { debit_cents: 0, .. }));
    assert_eq!(l.settle(&paid).await.unwrap(), SettleOutcome::AlreadySettled);
    assert_eq!(l.sweep_expired_holds(now_ms()).await.unwrap(), vec!["pdead".to_string()]);
    let c = l.plan(&ws).await.unwrap().unwrap().counters;
    assert_eq!((c.five_hour_used, c.week_used, c.plan_pending, c.plan_running), (15_000_000, 15_000_000, 0, 0));
    assert_eq!(l.balance(&ws).await.unwrap().unwrap().balance_cents, 100);
    assert_eq!(l.derived_balance(&ws).await.unwrap(), 100);
    // Room again: 15 of 40 used, nothing pending.
    assert_eq!(l.fund(fund_op(&ws, "pd", 20, now + 60_000)).await.unwrap().verdict, Ok(Funding::Plan));
    assert!(l.clear_plan(&ws).await.unwrap());
    assert!(l.plan(&ws).await.unwrap().is_none());
}

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

/// Decision 133 on a store that was in use before it: a hold placed by the old code (with its
/// `hold` entry) is released with the matching `hold_release` after migration 5, a new hold
/// writes no entry, and the stored balance equals the derived one at every step.
#[tokio::test]
async fn a_hold_placed_before_migration_5_is_released_with_its_entry() {
    let dir = std::env::temp_dir().join(format!("tollgate-ledger-{}", uuid::Uuid::new_v4().simple()));
    std::fs::create_dir_all(&dir).unwrap();
    let file = dir.join("l.db");
    {
        // The database as the previous release left it: migrations 1-4, a $1 balance with an
        // open 30-cent hold that wrote its entry.
        let c = rusqlite::Connection::open(&file).unwrap();
        c.execute_batch("CREATE TABLE schema_migrations (version INTEGER PRIMARY KEY, name TEXT NOT NULL, applied_at INTEGER NOT NULL)")
            .unwrap();
        for (version, name, sql) in &tollgate::store::SQLITE_MIGRATIONS[..4] {
            c.execute_batch(sql).unwrap();
            c.execute("INSERT INTO schema_migrations VALUES (?1, ?2, 0)", rusqlite::params![version, name]).unwrap();
        }
        c.execute_batch(
            "INSERT INTO workspaces (id, name, rate_tier, created_at, balance_cents, held_cents) VALUES ('w', 'w', 'free', 0, 70, 30);
             INSERT INTO ledger_entries (workspace_id, kind, source, amount_cents, created_at) VALUES ('w', 'topup', 'grant', 100, 0);
             INSERT INTO ledger_entries (workspace_id, kind, amount_cents, request_id, created_at) VALUES ('w', 'hold', -30, 'old', 1);
             INSERT INTO holds (request_id, workspace_id, amount_cents, state, expires_at, created_at) VALUES ('old', 'w', 30, 'open', 99999999999999, 1);",
        )
        .unwrap();
    }
    let s = tollgate::store::open_stores(&StoreConfig::Sqlite { path: file }).await.unwrap();
    s.identity.migrate().await.unwrap();
    let l = s.ledger.clone();
    let consistent = |b: i64| {
        let l = l.clone();
        async move {
            assert_eq!(l.balance("w").await.unwrap().unwrap().balance_cents, b);
            assert_eq!(l.derived_balance("w").await.unwrap(), b, "stored balance == derived balance");
        }
    };
    consistent(70).await;
    assert!(l.release_hold("old", now_ms()).await.unwrap());
    consistent(100).await;
    assert_eq!(
        l.place_hold("new", "w", None, 40, now_ms() + 60_000, now_ms()).await.unwrap(),
        HoldOutcome::Placed { balance_cents: 60 }
    );
    consistent(60).await;
    l.settle(&settlement("w", "new", 5_000_000)).await.unwrap();
    consistent(95).await;
    let kinds: Vec<(String, Option<String>)> =
        l.entries("w", 100).await.unwrap().into_iter().map(|e| (e.kind, e.request_id)).collect();
    let of = |rid: &str| {
        kinds.iter().filter(|(_, r)| r.as_deref() == Some(rid)).map(|(k, _)| k.as_str()).collect::<Vec<_>>()
    };
    let mut old = of("old");
    old.sort_unstable();
    assert_eq!(old, ["hold", "hold_release"], "the old hold keeps its pair of entries");
    assert_eq!(of("new"), ["settlement"], "the new hold wrote none");
    let _ = std::fs::remove_dir_all(&dir);
}

/// A ledger batch locks its workspaces through the primary key, whatever the number of
/// workspaces: the plan on a store of 20,000 must look them up (`Index Cond`), not filter the
/// table (as `id = ANY($1) OR id IN (SELECT ...)` did).
#[tokio::test]
async fn a_postgres_batch_finds_its_workspaces_by_key_not_by_scanning_them() {
    let url = pg::fresh_database().await;
    let s = tollgate::store::open_stores(&pg_config(url.clone())).await.unwrap();
    s.identity.migrate().await.unwrap();
    let (c, conn) = tokio_postgres::connect(&url, tokio_postgres::NoTls).await.unwrap();
    tokio::spawn(conn);
    c.batch_execute(
        "INSERT INTO workspaces (id, name, rate_tier, created_at) SELECT 'ws' || g, 'w', 'free', 0 FROM generate_series(1, 20000) g;
         INSERT INTO holds (request_id, workspace_id, amount_cents, state, expires_at, created_at)
             SELECT 'r' || g, 'ws' || g, 1, 'settled', 0, 0 FROM generate_series(1, 20000) g;
         ANALYZE;",
    )
    .await
    .unwrap();
    c.batch_execute(&format!("PREPARE lock_batch(TEXT[], TEXT[]) AS {}", tollgate::store::postgres_batch_lock_sql()))
        .await
        .unwrap();
    let plan: String = c
        .query("EXPLAIN EXECUTE lock_batch(ARRAY['ws5'], ARRAY['r7', 'r9'])", &[])
        .await
        .unwrap()
        .iter()
        .map(|r| r.get::<_, String>(0))
        .collect::<Vec<_>>()
        .join("\n");
    assert!(plan.contains("Index Cond: (id = ANY"), "{plan}");
    assert!(!plan.contains("Seq Scan on workspaces") && !plan.contains("Filter: ((id = ANY"), "{plan}");
    let locked = c.query("EXECUTE lock_batch(ARRAY['ws5'], ARRAY['r7', 'r9'])", &[]).await.unwrap();
    let ids: Vec<String> = locked.iter().map(|r| r.get(0)).collect();
    assert_eq!(ids, ["ws5", "ws7", "ws9"], "the named workspace and those of the hold rows, in id order");
}

/// Holds taken from leases (decision 187) on both backends: waves of concurrent requests,
/// funded and settled; once the leases are given back nothing stays held and the stored
/// balance is the sum of the entries and exactly the initial credit less the settled costs.
/// `leased`: the store runs group commit, so the leases must have been used.
async fn holds_from_leases_keep_the_ledger_exact(s: Stores, leased: bool) {
    let ws = workspace(&s).await;
    let l: Arc<dyn LedgerStore> = s.ledger.clone();
    l.top_up(&ws, 1_000_000, "purchase", None, now_ms()).await.unwrap();
    let mut most_leased = 0;
    for wave in 0..8 {
        let requests: Vec<_> = (0..50)
            .map(|i| {
                let (l, ws) = (l.clone(), ws.clone());
                tokio::spawn(async move {
                    let rid = format!("lq_{wave}_{i}");
                    let funded = l.fund(fund_op(&ws, &rid, 7, now_ms() + 60_000)).await.unwrap();
                    assert_eq!(funded.verdict, Ok(Funding::PayAsYouGo));
                    let settled = l.settle(&settlement(&ws, &rid, 3_300_000)).await.unwrap();
                    assert!(matches!(settled, SettleOutcome::Settled { .. }), "{settled:?}");
                })
            })
            .collect();
        for r in requests {
            r.await.unwrap();
        }
        most_leased = most_leased.max(l.leased_cents(&ws));
    }
    assert_eq!(leased, most_leased > 0, "leases used: {most_leased} cents unused at most");
    // Given back within a second of their last use.
    tokio::time::sleep(tollgate::store::ledger_lease::LEASE_USE).await;
    let mut b = l.balance(&ws).await.unwrap().unwrap();
    for _ in 0..100 {
        if b.held_cents == 0 {
            break;
        }
        tokio::time::sleep(std::time::Duration::from_millis(20)).await;
        b = l.balance(&ws).await.unwrap().unwrap();
    }
    assert_eq!(l.leased_cents(&ws), 0);
    // 400 settlements of 3.3 cents: 1,320 cents, whatever the carry's order.
    assert_eq!((b.balance_cents, b.held_cents), (1_000_000 - 1_320, 0));
    assert_eq!(l.derived_balance(&ws).await.unwrap(), b.balance_cents);
    assert!(l.expired_holds(i64::MAX).await.unwrap().is_empty(), "no hold row open, leases' included");
}

mod holds_from_leases_keep_the_ledger_exact {
    #[tokio::test(flavor = "multi_thread", worker_threads = 2)]
    async fn sqlite() {
        super::holds_from_leases_keep_the_ledger_exact(super::sqlite().await, true).await
    }
    #[tokio::test(flavor = "multi_thread", worker_threads = 2)]
    async fn postgres() {
        super::holds_from_leases_keep_the_ledger_exact(super::postgres().await, true).await
    }
    #[tokio::test(flavor = "multi_thread", worker_threads = 2)]
    async fn sqlite_unbatched() {
        super::holds_from_leases_keep_the_ledger_exact(super::sqlite_unbatched().await, false).await
    }
    #[tokio::test(flavor = "multi_thread", worker_threads = 2)]
    async fn postgres_unbatched() {
        super::holds_from_leases_keep_the_ledger_exact(super::postgres_unbatched().await, false).await
    }
}

/// Two instances on one store (decision 190): each reads the balance as if there were no
/// leases, the other instance's unused lease counted as balance (before, it showed as held
/// for up to a second); a lease row whose instance stopped renewing it (older than
/// `LEASE_LIVE`) is money nobody can spend until it is swept, so it stays held.
async fn another_instances_unused_lease_reads_as_balance(a: Stores, b: Stores) {
    use tollgate::store::ledger_ops::LedgerOp;
    let ws = workspace(&a).await;
    let (la, lb): (Arc<dyn LedgerStore>, Arc<dyn LedgerStore>) = (a.ledger.clone(), b.ledger.clone());
    la.top_up(&ws, 1_000_000, "purchase", None, now_ms()).await.unwrap();
    // Instance A admits one request through the ledger, is granted a lease, and takes five
    // more holds from it; all six stay in flight (42 cents held by requests).
    la.fund(fund_op(&ws, "two_0", 7, now_ms() + 60_000)).await.unwrap();
    for _ in 0..200 {
        if la.leased_cents(&ws) > 0 {
            break;
        }
        tokio::time::sleep(std::time::Duration::from_millis(10)).await;
    }
    assert!(la.leased_cents(&ws) > 0, "instance A holds a lease");
    for i in 1..6 {
        let funded = la.fund(fund_op(&ws, &format!("two_{i}"), 7, now_ms() + 60_000)).await.unwrap();
        assert_eq!(funded.verdict, Ok(Funding::PayAsYouGo));
    }
    let shown = async |l: &Arc<dyn LedgerStore>| l.balance_shown(&ws).await.unwrap().unwrap();
    let a_view = shown(&la).await;
    assert_eq!((a_view.balance_cents, a_view.held_cents), (1_000_000 - 42, 42), "A, from memory at once");
    // B sees A's lease row once A's lease holds are written (a settlement linger later).
    let mut b_view = shown(&lb).await;
    for _ in 0..200 {
        if b_view.held_cents == 42 {
            break;
        }
        tokio::time::sleep(std::time::Duration::from_millis(10)).await;
        b_view = shown(&lb).await;
    }
    assert!(lb.balance(&ws).await.unwrap().unwrap().held_cents > 42, "the store holds A's lease");
    assert_eq!((b_view.balance_cents, b_view.held_cents), (1_000_000 - 42, 42), "B: A's unused lease is balance");
    // A lease row of an instance that stopped ten seconds ago stays held on both.
    let now = now_ms();
    let dead = LedgerOp::LeaseGrant {
        lease_id: "lease_00000000000000000000000000000001".into(),
        workspace_id: ws.clone(),
        want_cents: 5_000,
        min_cents: 1,
        expires_at: now + 60_000,
        now: now - 10_000,
    };
    assert!(matches!(lb.submit(dead).await.unwrap(), tollgate::store::ledger_ops::OpOutcome::Lease(Some(5_000))));
    for l in [&la, &lb] {
        let v = shown(l).await;
        assert_eq!((v.balance_cents, v.held_cents), (1_000_000 - 42 - 5_000, 42 + 5_000));
    }
    // Settled, given back and swept: the audit holds.
    for i in 0..6 {
        la.settle(&settlement(&ws, &format!("two_{i}"), 7_000_000)).await.unwrap();
    }
    la.give_back_leases().await;
    lb.release_hold("lease_00000000000000000000000000000001", now_ms()).await.unwrap();
    let end = lb.balance(&ws).await.unwrap().unwrap();
    assert_eq!((end.balance_cents, end.held_cents), (1_000_000 - 42, 0));
    assert_eq!(lb.derived_balance(&ws).await.unwrap(), end.balance_cents);
    assert_eq!(lb.balance_and_unused_leases(&ws).await.unwrap(), Some((end, 0)));
}

/// Two instances (two sets of stores, as two gateways open them) on one store, for each backend.
macro_rules! two_instances {
    ($($name:ident),* $(,)?) => {$(
        mod $name {
            use tollgate::store::{StoreConfig, open_stores};

            async fn run(cfg: StoreConfig) {
                let a = open_stores(&cfg).await.unwrap();
                a.identity.migrate().await.unwrap();
                let b = open_stores(&cfg).await.unwrap();
                super::$name(a, b).await
            }
            #[tokio::test(flavor = "multi_thread", worker_threads = 2)]
            async fn sqlite() {
                let dir = std::env::temp_dir().join(format!("tollgate-ledger-{}", uuid::Uuid::new_v4().simple()));
                run(StoreConfig::Sqlite { path: dir.join("l.db") }).await
            }
            #[tokio::test(flavor = "multi_thread", worker_threads = 2)]
            async fn postgres() {
                run(super::pg_config(super::pg::fresh_database().await)).await
            }
        }
    )*};
}

two_instances!(another_instances_unused_lease_reads_as_balance, a_refused_hold_recalls_the_other_instances_lease);

/// Decision 191: a hold the stored balance refuses while another instance's lease keeps the
/// money it needs recalls the leases: that instance's renewal is refused, and once it has
/// given its lease back the same hold, asked again, is placed. Without the recall a busy
/// instance renews its lease for as long as it is busy, and the hold is refused throughout.
async fn a_refused_hold_recalls_the_other_instances_lease(a: Stores, b: Stores) {
    use tollgate::store::ledger_ops::{LedgerOp, OpOutcome};
    let ws = workspace(&a).await;
    let (la, lb): (Arc<dyn LedgerStore>, Arc<dyn LedgerStore>) = (a.ledger.clone(), b.ledger.clone());
    la.top_up(&ws, 10_000, "purchase", None, now_ms()).await.unwrap();
    let start = la.balance(&ws).await.unwrap().unwrap().balance_cents;
    la.fund(fund_op(&ws, "rc_0", 7, now_ms() + 60_000)).await.unwrap();
    for _ in 0..200 {
        if la.leased_cents(&ws) > 0 {
            break;
        }
        tokio::time::sleep(std::time::Duration::from_millis(10)).await;
    }
    assert_eq!(la.leased_cents(&ws), (start - 7) / 8, "instance A holds an eighth of the balance");
    // B asks for all the balance shows: the lease keeps an eighth of it from the store.
    let all = start - 7;
    let refused = lb.fund(fund_op(&ws, "rc_big", all, now_ms() + 60_000)).await.unwrap();
    assert!(matches!(refused.verdict, Err(FundRefusal::Insufficient { .. })), "{refused:?}");
    // A's next grant (its renewal) is refused while the recall stands.
    let renewal = LedgerOp::LeaseGrant {
        lease_id: "lease_00000000000000000000000000000002".into(),
        workspace_id: ws.clone(),
        want_cents: 700,
        min_cents: 1,
        expires_at: now_ms() + 60_000,
        now: now_ms(),
    };
    assert_eq!(la.submit(renewal).await.unwrap(), OpOutcome::Lease(None), "no lease while recalled");
    // A gives its lease back (at the end of its second, or now); asked again, B's hold fits.
    assert_eq!(la.give_back_leases().await, 1);
    let placed = lb.fund(fund_op(&ws, "rc_big", all, now_ms() + 60_000)).await.unwrap();
    assert_eq!(placed.verdict, Ok(Funding::PayAsYouGo));
    la.settle(&settlement(&ws, "rc_0", 7_000_000)).await.unwrap();
    lb.settle(&settlement(&ws, "rc_big", 1_000_000)).await.unwrap();
    lb.give_back_leases().await;
    let end = lb.balance(&ws).await.unwrap().unwrap();
    assert_eq!((end.balance_cents, end.held_cents), (start - 8, 0));
    assert_eq!(lb.derived_balance(&ws).await.unwrap(), end.balance_cents);
}
