//! Group commit with balance leases: holds taken in memory, their rows and returns.

use super::*;
use crate::identity::{RateTier, Workspace};
use crate::money::plans::PlanSettings;
use crate::money::plans::decide::{FundAsk, Funding};
use crate::store::IdentityStore;
use crate::store::ledger::Settlement;
use crate::store::ledger::lease::LEASE_USE;
use crate::store::ledger::ops::{FundOp, FundRefusal};
use crate::store::sqlite::SqliteStore;
use std::sync::atomic::Ordering;

async fn funded(cents: i64) -> (std::path::PathBuf, Arc<SqliteStore>, Arc<BatchedLedger>) {
    let dir = std::env::temp_dir().join(format!("tollgate-lease-{}", uuid::Uuid::new_v4().simple()));
    let store = Arc::new(SqliteStore::open(&dir.join("l.db")).unwrap());
    store.migrate().await.unwrap();
    let ws = Workspace {
        id: "w".into(),
        name: "w".into(),
        rate_tier: RateTier::Core,
        created_at: 0,
        frozen: None,
        lifetime_purchases_cents: 0,
        plan: None,
    };
    store.create_workspace(&ws).await.unwrap();
    store.top_up("w", cents, "purchase", None, 1).await.unwrap();
    let l = Arc::new(BatchedLedger::new(store.clone()).unwrap());
    (dir, store, l)
}

fn fund(rid: &str, hold_cents: i64, key_limit_reached: bool) -> FundOp {
    let now = crate::runtime::clock::now_ms();
    FundOp {
        request_id: rid.into(),
        workspace_id: "w".into(),
        key_id: None,
        ask: FundAsk {
            value_microcents: hold_cents * 1_000_000,
            hold_cents,
            credits_only: false,
            key_limit_reached,
            covered: true,
            standby_pressure: false,
            standby_closed: false,
        },
        settings: Arc::new(PlanSettings::default()),
        expires_at: now + 60_000,
        now,
    }
}

fn settlement(rid: &str, cost: u64) -> Settlement {
    Settlement {
        request_id: rid.into(),
        workspace_id: "w".into(),
        key_id: None,
        cost: crate::money::Microcents(cost),
        value: crate::money::Microcents(cost),
        now: crate::runtime::clock::now_ms(),
        month: "2026-11".into(),
    }
}

/// Polls (the lease's rows are written in the background) up to twenty seconds: a
/// generous bound, so a machine busy with other work does not fail the test.
async fn until(mut ok: impl AsyncFnMut() -> bool) {
    for _ in 0..2_000 {
        if ok().await {
            return;
        }
        tokio::time::sleep(Duration::from_millis(10)).await;
    }
    panic!("not reached in 20 s");
}

#[tokio::test]
async fn holds_come_from_a_lease_once_granted_and_the_ledger_is_exact_after_it_is_given_back() {
    let (dir, store, l) = funded(100_000).await;
    // The first request is decided by the ledger; it asks for a lease of 1,024 holds.
    let first = l.fund(fund("r1", 5, false)).await.unwrap();
    assert_eq!(first.verdict, Ok(Funding::PayAsYouGo));
    until(async || l.leased_cents("w") == 5 * 1_024).await;
    let b = store.balance("w").await.unwrap().unwrap();
    assert_eq!((b.balance_cents, b.held_cents), (100_000 - 5 - 5_120, 5 + 5_120), "the lease is held");
    // The next one is placed from the lease: its row comes after, moved out of the lease's.
    let second = l.fund(fund("r2", 5, false)).await.unwrap();
    assert_eq!((second.verdict, second.plan), (Ok(Funding::PayAsYouGo), None));
    assert_eq!(l.leased_cents("w"), 5_115);
    until(async || LedgerAdmin::expired_holds(&*store, Millis::MAX).await.unwrap().contains(&"r2".to_string())).await;
    let b = store.balance("w").await.unwrap().unwrap();
    assert_eq!((b.balance_cents, b.held_cents), (100_000 - 5 - 5_120, 5 + 5_120), "moved, not added");
    // A key at its limit is refused by the ledger, as without a lease.
    let limited = l.fund(fund("r3", 5, true)).await.unwrap();
    assert_eq!(limited.verdict, Err(FundRefusal::KeyLimit));
    l.settle(&settlement("r1", 3_500_000)).await.unwrap();
    l.settle(&settlement("r2", 3_500_000)).await.unwrap();
    // Past its use the lease is given back: nothing is held, every cent accounted for.
    tokio::time::sleep(LEASE_USE).await;
    until(async || LedgerAdmin::expired_holds(&*store, Millis::MAX).await.unwrap().is_empty()).await;
    assert_eq!(l.leased_cents("w"), 0);
    let b = store.balance("w").await.unwrap().unwrap();
    assert_eq!((b.balance_cents, b.held_cents), (100_000 - 7, 0));
    assert_eq!(store.derived_balance("w").await.unwrap(), b.balance_cents);
    let _ = std::fs::remove_dir_all(&dir);
}

#[tokio::test]
async fn a_low_balance_gets_no_lease_and_each_hold_is_decided_by_the_ledger() {
    // 1,000 cents: an eighth (125) is under 16 holds of 10 cents.
    let (dir, store, l) = funded(1_000).await;
    assert_eq!(l.fund(fund("r1", 10, false)).await.unwrap().verdict, Ok(Funding::PayAsYouGo));
    tokio::time::sleep(Duration::from_millis(100)).await;
    assert_eq!(l.leased_cents("w"), 0);
    assert_eq!(LedgerAdmin::expired_holds(&*store, Millis::MAX).await.unwrap(), vec!["r1".to_string()], "no lease row");
    let _ = std::fs::remove_dir_all(&dir);
}

#[tokio::test]
async fn a_hold_the_lease_cannot_cover_gives_it_back_and_goes_to_the_ledger() {
    let (dir, store, l) = funded(1_000_000).await;
    l.fund(fund("r1", 1, false)).await.unwrap();
    until(async || l.leased_cents("w") == 1_024).await;
    // 2,000 cents do not fit in the lease's 1,024: the ledger decides (after the lease is
    // given back, queued first), and a new lease is asked for at that size.
    let big = l.fund(fund("r2", 2_000, false)).await.unwrap();
    assert_eq!(big.verdict, Ok(Funding::PayAsYouGo));
    until(async || l.leased_cents("w") > 0).await;
    let b = store.balance("w").await.unwrap().unwrap();
    let leased = l.leased_cents("w");
    assert_eq!(leased, (1_000_000 - 1 - 2_000) / 8, "an eighth of the balance, under 1,024 holds");
    assert_eq!(b.held_cents, 1 + 2_000 + leased, "the first lease was released in full");
    let _ = std::fs::remove_dir_all(&dir);
}

async fn open_leases(store: &SqliteStore) -> usize {
    let open = LedgerAdmin::expired_holds(store, Millis::MAX).await.unwrap();
    open.iter().filter(|id| id.starts_with("lease_")).count()
}

#[tokio::test]
async fn a_lease_running_out_is_renewed_before_it_is_empty_and_then_given_back() {
    let (dir, store, _) = funded(1_000_000).await;
    // Leases used for a minute: the 770 holds below must not outlast one on a busy machine.
    let l = Arc::new(BatchedLedger::new(store.clone()).unwrap().with_lease_use(Duration::from_secs(60)));
    l.fund(fund("r0", 1, false)).await.unwrap();
    until(async || l.leased_cents("w") == 1_024).await;
    // Three quarters of the lease used: the next lease is asked for in the background.
    for i in 1..=769 {
        let out = l.fund(fund(&format!("r{i}"), 1, false)).await.unwrap();
        assert_eq!(out.verdict, Ok(Funding::PayAsYouGo));
    }
    // The grant's row is visible a moment before the writer's thread answers the leases:
    // wait for both, then the old lease's rest is still held until given back.
    until(async || open_leases(&store).await == 2 && l.leased_cents("w") == 255 + 1_024).await;
    // The next hold comes from the new lease and gives the old one back.
    l.fund(fund("r770", 1, false)).await.unwrap();
    until(async || open_leases(&store).await == 1 && l.leased_cents("w") == 1_023).await;
    let b = store.balance("w").await.unwrap().unwrap();
    assert_eq!(b.held_cents, 771 + 1_023, "each request's hold and the new lease's rest");
    assert_eq!(store.derived_balance("w").await.unwrap(), b.balance_cents);
    let _ = std::fs::remove_dir_all(&dir);
}

/// A stopping instance gives back its leases and waits for the lease rows already queued:
/// a lease given back a moment before (by the returner at the end of its use, or a plan
/// change) lingers in the writer's queue, and the process must not end before it is written.
#[tokio::test]
async fn giving_back_at_a_stop_waits_for_a_give_back_already_queued() {
    let (dir, store, l) = funded(100_000).await;
    l.fund(fund("r1", 5, false)).await.unwrap();
    until(async || l.leased_cents("w") == 5 * 1_024).await;
    l.settle(&settlement("r1", 1_000_000)).await.unwrap();
    // Queued with no caller waiting: it waits in the writer's linger.
    l.give_back("w");
    assert_eq!(l.give_back_leases().await, 0, "nothing left in memory to give back");
    assert_eq!(open_leases(&store).await, 0, "the lease queued a moment before is written");
    let b = store.balance("w").await.unwrap().unwrap();
    assert_eq!((b.balance_cents, b.held_cents), (100_000 - 1, 0));
    let _ = std::fs::remove_dir_all(&dir);
}

/// The SQLite store's writes behind a switch: off, every batch fails whole, as when
/// PostgreSQL restarts under a batch.
struct Switch {
    store: Arc<SqliteStore>,
    down: std::sync::atomic::AtomicBool,
    failed: std::sync::atomic::AtomicUsize,
}

#[async_trait]
impl LedgerWrites for Switch {
    async fn apply(&self, ops: Arc<[LedgerOp]>) -> Result<Vec<OpResult>, StoreError> {
        if self.down.load(Ordering::SeqCst) {
            self.failed.fetch_add(1, Ordering::SeqCst);
            return Err(StoreError::Unavailable("switched off".into()));
        }
        self.store.apply(ops).await
    }
    async fn expired_holds(&self, now: Millis) -> Result<Vec<String>, StoreError> {
        LedgerWrites::expired_holds(&*self.store, now).await
    }
}

/// Decision 203: a hold placed from a lease while the store is down keeps its row through
/// the failed batches and lands before the request's settlement, sent again once the store
/// answers: no settlement without its hold, and the money exact.
#[tokio::test]
async fn a_lease_holds_row_outlives_an_outage_and_lands_before_its_settlement() {
    let (dir, store, _) = funded(100_000).await;
    let switch = Arc::new(Switch {
        store: store.clone(),
        down: std::sync::atomic::AtomicBool::new(false),
        failed: std::sync::atomic::AtomicUsize::new(0),
    });
    let l = Arc::new(BatchedLedger::with_parts(store.clone(), switch.clone(), QUEUE).unwrap());
    assert_eq!(l.fund(fund("r1", 5, false)).await.unwrap().verdict, Ok(Funding::PayAsYouGo));
    until(async || l.leased_cents("w") == 5 * 1_024).await;
    switch.down.store(true, Ordering::SeqCst);
    // Placed in memory from the lease; its row's batch fails (and fails again, kept).
    assert_eq!(l.fund(fund("r2", 5, false)).await.unwrap().verdict, Ok(Funding::PayAsYouGo));
    until(async || switch.failed.load(Ordering::SeqCst) >= 2).await;
    assert!(l.settle(&settlement("r2", 3_000_000)).await.is_err(), "the store is down");
    switch.down.store(false, Ordering::SeqCst);
    // Billing sends the settlement again; the kept row goes first in that batch at latest.
    assert!(matches!(l.settle(&settlement("r2", 3_000_000)).await, Ok(SettleOutcome::Settled { .. })));
    l.settle(&settlement("r1", 3_000_000)).await.unwrap();
    let count = |sql: &'static str| {
        let store = store.clone();
        async move { store.with_conn(move |c| c.query_row(sql, [], |r| r.get::<_, i64>(0))).await.unwrap() }
    };
    let unmatched = count(
        "SELECT count(*) FROM ledger_entries s WHERE s.kind = 'settlement' \
         AND NOT EXISTS (SELECT 1 FROM holds h WHERE h.request_id = s.request_id)",
    )
    .await;
    assert_eq!(unmatched, 0, "every settlement has its hold row");
    let r2 = count("SELECT count(*) FROM holds WHERE request_id = 'r2' AND state = 'settled'").await;
    assert_eq!(r2, 1, "r2's hold row was written and then settled");
    // The lease given back: nothing held, every cent accounted for.
    tokio::time::sleep(LEASE_USE).await;
    until(async || LedgerAdmin::expired_holds(&*store, Millis::MAX).await.unwrap().is_empty()).await;
    let b = store.balance("w").await.unwrap().unwrap();
    assert_eq!((b.balance_cents, b.held_cents), (100_000 - 6, 0));
    assert_eq!(store.derived_balance("w").await.unwrap(), b.balance_cents);
    let _ = std::fs::remove_dir_all(&dir);
}

/// Hold the writer's thread in a continuation until the returned sender is used (or
/// dropped), so what the test queues meanwhile goes into the writer's next batch.
/// Also returns how many times the writer had given way by then.
fn gate(l: &Arc<BatchedLedger>, id: &str) -> (std::sync::mpsc::Sender<()>, u64) {
    let (go, wait) = std::sync::mpsc::channel::<()>();
    let (held, holding) = std::sync::mpsc::channel();
    l.clone().submit_detached(
        LedgerOp::Settle(settlement(id, 1)),
        Box::new(move |_r| {
            let _ = held.send(tollgate_threads::times_given_way());
            let _ = wait.recv_timeout(Duration::from_secs(5));
        }),
    );
    (go, holding.recv_timeout(Duration::from_secs(5)).unwrap())
}

fn settle_all(l: &Arc<BatchedLedger>, prefix: &str, n: usize) {
    for i in 0..n {
        l.clone().submit_detached(LedgerOp::Settle(settlement(&format!("{prefix}{i}"), 1)), Box::new(|_r| {}));
    }
}

/// Decision 194: a lingering batch, which no request waits for, gives way to the request
/// threads sharing its core while it is written; a batch a hold waits for does not.
#[tokio::test]
async fn a_long_batch_gives_way_to_requests_unless_a_hold_waits_for_it() {
    let (dir, _store, l) = funded(1_000_000).await;
    // A continuation runs on the writer's thread after its op's batch.
    let (tx, rx) = std::sync::mpsc::channel();
    let reading = |tx: &std::sync::mpsc::Sender<u64>| -> crate::store::ledger::Detached {
        let tx = tx.clone();
        Box::new(move |_r| {
            let _ = tx.send(tollgate_threads::times_given_way());
        })
    };
    let read = || rx.recv_timeout(Duration::from_secs(10)).unwrap();
    // A full batch of settlements, milliseconds of SQLite work (full, it does not linger,
    // so its oldest op has not waited long): it gives way.
    let (go, before) = gate(&l, "gate-1");
    settle_all(&l, "s", MAX_BATCH - 1);
    l.clone().submit_detached(LedgerOp::Settle(settlement("then", 1)), reading(&tx));
    drop(go);
    let lingering = read();
    assert!(lingering > before, "a full batch of settlements never gave way");
    // The same with a hold queued behind them: its request waits for this batch.
    let (go, before) = gate(&l, "gate-2");
    settle_all(&l, "t", 400);
    let hold = {
        let l = l.clone();
        tokio::spawn(async move {
            let now = crate::runtime::clock::now_ms();
            l.place_hold("h", "w", None, 1, now + 60_000, now).await
        })
    };
    until(async || l.queue.max_capacity() - l.queue.capacity() >= 401).await;
    l.clone().submit_detached(LedgerOp::Settle(settlement("last", 1)), reading(&tx));
    drop(go);
    let with_hold = read();
    assert!(matches!(hold.await.unwrap(), Ok(HoldOutcome::Placed { .. })));
    assert_eq!(with_hold, before, "a batch with a hold in it gave way");
    let _ = std::fs::remove_dir_all(&dir);
}
