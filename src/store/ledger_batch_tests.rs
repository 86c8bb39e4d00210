//! Group commit: shedding, the reserved room, the settlement linger.

use super::*;
use crate::store::ledger::{HoldOutcome, SettleOutcome, Settlement};
use crate::store::ledger_ops::OpOutcome;
use tokio::sync::Semaphore;

/// Wait (up to 20 s: a busy machine) until the writer is inside a batch.
async fn applying(l: &BatchedLedger) {
    for _ in 0..2_000 {
        if l.congestion.applying_since.load(std::sync::atomic::Ordering::Relaxed) != 0 {
            return;
        }
        tokio::time::sleep(Duration::from_millis(10)).await;
    }
    panic!("the writer never took a batch");
}

/// Wait (up to 20 s: a busy machine) until `n` ops wait in the writer's queue.
async fn queued_until(l: &BatchedLedger, n: usize) {
    for _ in 0..2_000 {
        if l.queue.max_capacity() - l.queue.capacity() == n {
            return;
        }
        tokio::time::sleep(Duration::from_millis(10)).await;
    }
    panic!("{n} ops never waited in the queue");
}

/// Answers every op after the test lets one batch through.
struct Gated(Arc<Semaphore>);

#[async_trait]
impl LedgerWrites for Gated {
    async fn apply(&self, ops: Arc<[LedgerOp]>) -> Result<Vec<OpResult>, StoreError> {
        self.0.acquire().await.map_err(|e| StoreError::Unavailable(e.to_string()))?.forget();
        Ok(ops
            .iter()
            .map(|op| match op {
                LedgerOp::Hold { .. } => Ok(OpOutcome::Hold(HoldOutcome::Placed { balance_cents: 0 })),
                LedgerOp::Settle(_) => Ok(OpOutcome::Settle(SettleOutcome::AlreadySettled)),
                LedgerOp::Release { .. } => Ok(OpOutcome::Release(true)),
                _ => Err(StoreError::Unavailable("not in this test".into())),
            })
            .collect())
    }

    async fn expired_holds(&self, _now: Millis) -> Result<Vec<String>, StoreError> {
        Ok(Vec::new())
    }
}

#[tokio::test]
async fn a_full_queue_refuses_holds_at_once_and_keeps_room_for_releases() {
    let dir = std::env::temp_dir().join(format!("tollgate-batch-{}", uuid::Uuid::new_v4().simple()));
    let store = Arc::new(crate::store::sqlite::SqliteStore::open(&dir.join("l.db")).unwrap());
    let gate = Arc::new(Semaphore::new(0));
    let l = Arc::new(BatchedLedger::with_parts(store, Arc::new(Gated(gate.clone())), 8).unwrap());
    let hold = |l: Arc<BatchedLedger>, i: usize| {
        tokio::spawn(async move { l.place_hold(&format!("r{i}"), "w", None, 1, 10, 1).await })
    };
    // The writer takes the first hold and waits at the gate; six more fill the queue up
    // to its reserve of two.
    let mut waiting = vec![hold(l.clone(), 0)];
    applying(&l).await; // the writer took it
    waiting.extend((1..7).map(|i| hold(l.clone(), i)));
    queued_until(&l, 6).await;
    let started = std::time::Instant::now();
    let refused = l.place_hold("r7", "w", None, 1, 10, 1).await;
    assert!(matches!(refused, Err(StoreError::NotQueued(_))), "{refused:?}");
    assert!(started.elapsed() < Duration::from_secs(1), "refused without waiting (a generous bound: a busy machine)");
    let release = {
        let l = l.clone();
        tokio::spawn(async move { l.release_hold("r0", 2).await })
    };
    tokio::time::sleep(Duration::from_millis(20)).await;
    gate.add_permits(100);
    for w in waiting {
        assert_eq!(w.await.unwrap(), Ok(HoldOutcome::Placed { balance_cents: 0 }));
    }
    assert_eq!(release.await.unwrap(), Ok(true), "a release is queued in the reserved room");
    let _ = std::fs::remove_dir_all(&dir);
}

#[tokio::test]
async fn holds_are_shed_while_writes_wait_longer_than_the_bound_and_admitted_again_after() {
    let dir = std::env::temp_dir().join(format!("tollgate-batch-{}", uuid::Uuid::new_v4().simple()));
    let store = Arc::new(crate::store::sqlite::SqliteStore::open(&dir.join("l.db")).unwrap());
    let gate = Arc::new(Semaphore::new(0));
    let l = Arc::new(
        BatchedLedger::with_parts(store, Arc::new(Gated(gate.clone())), 64)
            .unwrap()
            .with_max_hold_wait(Duration::from_millis(60)),
    );
    // The writer takes the first hold and is stuck in its batch.
    let first = {
        let l = l.clone();
        tokio::spawn(async move { l.place_hold("r0", "w", None, 1, 10, 1).await })
    };
    applying(&l).await;
    let queued = {
        let l = l.clone();
        tokio::spawn(async move { l.place_hold("r1", "w", None, 1, 10, 1).await })
    };
    queued_until(&l, 1).await;
    tokio::time::sleep(Duration::from_millis(100)).await;
    // The running batch has taken longer than the bound: a new hold is shed at once.
    let started = std::time::Instant::now();
    let shed = l.place_hold("r2", "w", None, 1, 10, 1).await;
    assert!(matches!(shed, Err(StoreError::Busy(_))), "{shed:?}");
    assert!(started.elapsed() < Duration::from_secs(1), "shed without waiting (a generous bound: a busy machine)");
    // A release is never shed.
    let release = {
        let l = l.clone();
        tokio::spawn(async move { l.release_hold("r0", 2).await })
    };
    queued_until(&l, 2).await;
    // The next batch (r1 and the release) waited over the bound too: still shedding.
    gate.add_permits(1);
    assert_eq!(first.await.unwrap(), Ok(HoldOutcome::Placed { balance_cents: 0 }));
    tokio::time::sleep(Duration::from_millis(20)).await;
    let shed = l.place_hold("r3", "w", None, 1, 10, 1).await;
    assert!(matches!(shed, Err(StoreError::Busy(_))), "{shed:?}");
    // Once the writer drains the queue, holds are admitted again.
    gate.add_permits(100);
    assert_eq!(queued.await.unwrap(), Ok(HoldOutcome::Placed { balance_cents: 0 }));
    assert_eq!(release.await.unwrap(), Ok(true));
    assert_eq!(l.place_hold("r4", "w", None, 1, 10, 1).await, Ok(HoldOutcome::Placed { balance_cents: 0 }));
    let _ = std::fs::remove_dir_all(&dir);
}

/// Records the ops of each batch it writes.
#[derive(Default)]
struct Recorder(std::sync::Mutex<Vec<Vec<String>>>);

#[async_trait]
impl LedgerWrites for Recorder {
    async fn apply(&self, ops: Arc<[LedgerOp]>) -> Result<Vec<OpResult>, StoreError> {
        self.0.lock().unwrap().push(ops.iter().map(|o| o.request_id().to_string()).collect());
        Gated(Arc::new(Semaphore::new(1))).apply(ops).await
    }

    async fn expired_holds(&self, _now: Millis) -> Result<Vec<String>, StoreError> {
        Ok(Vec::new())
    }
}

/// A batched ledger whose writes `Recorder` records, and the directory of its store.
fn recorded() -> (std::path::PathBuf, Arc<Recorder>, Arc<BatchedLedger>) {
    let dir = std::env::temp_dir().join(format!("tollgate-batch-{}", uuid::Uuid::new_v4().simple()));
    let store = Arc::new(crate::store::sqlite::SqliteStore::open(&dir.join("l.db")).unwrap());
    let rec = Arc::new(Recorder::default());
    let l = Arc::new(BatchedLedger::with_parts(store, rec.clone(), 64).unwrap());
    (dir, rec, l)
}

fn settlement(rid: &str) -> Settlement {
    Settlement {
        request_id: rid.into(),
        workspace_id: "w".into(),
        key_id: None,
        cost: crate::money::Microcents::ZERO,
        value: crate::money::Microcents::ZERO,
        now: 1,
        month: "2026-11".into(),
    }
}

#[tokio::test]
async fn a_settlement_rides_with_the_next_hold_and_is_written_alone_when_none_comes() {
    let (dir, rec, l) = recorded();
    // `join!` polls the settlement first (it queues and waits), then the hold.
    let s1 = settlement("s1");
    let started = Instant::now();
    let (settled, held) = tokio::join!(l.settle(&s1), l.place_hold("h1", "w", None, 1, 10, 1));
    assert_eq!(held, Ok(HoldOutcome::Placed { balance_cents: 0 }));
    assert!(started.elapsed() < SETTLE_LINGER * 10, "the hold did not wait for the linger");
    assert_eq!(settled, Ok(SettleOutcome::AlreadySettled));
    assert_eq!(*rec.0.lock().unwrap(), vec![vec!["s1".to_string(), "h1".to_string()]], "one transaction");
    // Alone, a settlement is written after the linger.
    assert_eq!(l.settle(&settlement("s2")).await, Ok(SettleOutcome::AlreadySettled));
    assert_eq!(rec.0.lock().unwrap().last().unwrap(), &vec!["s2".to_string()]);
    let _ = std::fs::remove_dir_all(&dir);
}

#[tokio::test]
async fn after_a_hold_the_next_settlement_still_waits_to_ride_with_the_following_hold() {
    let (dir, rec, l) = recorded();
    // A hold written alone must leave nothing behind that cuts the next linger short.
    assert_eq!(l.place_hold("h1", "w", None, 1, 10, 1).await, Ok(HoldOutcome::Placed { balance_cents: 0 }));
    let settled = {
        let l = l.clone();
        tokio::spawn(async move { l.settle(&settlement("s1")).await })
    };
    tokio::time::sleep(Duration::from_millis(2)).await;
    assert_eq!(l.place_hold("h2", "w", None, 1, 10, 1).await, Ok(HoldOutcome::Placed { balance_cents: 0 }));
    assert_eq!(settled.await.unwrap(), Ok(SettleOutcome::AlreadySettled));
    let batches = rec.0.lock().unwrap().clone();
    assert_eq!(batches, vec![vec!["h1".to_string()], vec!["s1".to_string(), "h2".to_string()]]);
    let _ = std::fs::remove_dir_all(&dir);
}

/// The writer thread's voluntary context switches so far (it parked that many times).
#[cfg(target_os = "linux")]
fn writer_parks() -> u64 {
    let status = std::fs::read_to_string("/proc/thread-self/status").unwrap_or_default();
    status
        .lines()
        .find_map(|l| l.strip_prefix("voluntary_ctxt_switches:"))
        .and_then(|v| v.trim().parse().ok())
        .unwrap_or(u64::MAX)
}

#[cfg(target_os = "linux")]
#[tokio::test]
async fn settlements_queued_during_the_linger_do_not_wake_the_writer_one_by_one() {
    let (dir, rec, l) = recorded();
    // The continuation of an op nobody waits for runs on the writer's thread, after its batch:
    // it reads how often that thread has parked.
    let reading = |tx: std::sync::mpsc::Sender<u64>| -> crate::store::ledger::Detached {
        Box::new(move |_r| {
            let _ = tx.send(writer_parks());
        })
    };
    let (tx, rx) = std::sync::mpsc::channel();
    l.clone().submit_detached(LedgerOp::Settle(settlement("s0")), reading(tx.clone()));
    let before = rx.recv_timeout(Duration::from_secs(5)).unwrap();
    // Twenty-five settlements, one every 200 us: all within one linger (10 ms).
    for i in 1..=25 {
        let done = if i == 25 { reading(tx.clone()) } else { Box::new(|_r| {}) as crate::store::ledger::Detached };
        l.clone().submit_detached(LedgerOp::Settle(settlement(&format!("s{i}"))), done);
        std::thread::sleep(Duration::from_micros(200));
    }
    let after = rx.recv_timeout(Duration::from_secs(5)).unwrap();
    let batches = rec.0.lock().unwrap().len();
    // Woken by the first one and by the linger's end (once more per extra batch if the
    // sends outlasted a linger): not once per settlement.
    assert!(
        after - before <= 2 * batches as u64 + 2,
        "the writer parked {} times for 25 settlements in {} batches",
        after - before,
        batches
    );
    assert!(batches <= 4, "{batches} batches for 26 settlements");
    let _ = std::fs::remove_dir_all(&dir);
}

mod leases {
    use super::*;
    use crate::identity::{RateTier, Workspace};
    use crate::money::plans::PlanSettings;
    use crate::money::plans::decide::{FundAsk, Funding};
    use crate::store::IdentityStore;
    use crate::store::ledger::Settlement;
    use crate::store::ledger_lease::LEASE_USE;
    use crate::store::ledger_ops::{FundOp, FundRefusal};
    use crate::store::sqlite::SqliteStore;

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
        until(async || LedgerStore::expired_holds(&*store, Millis::MAX).await.unwrap().contains(&"r2".to_string()))
            .await;
        let b = store.balance("w").await.unwrap().unwrap();
        assert_eq!((b.balance_cents, b.held_cents), (100_000 - 5 - 5_120, 5 + 5_120), "moved, not added");
        // A key at its limit is refused by the ledger, as without a lease.
        let limited = l.fund(fund("r3", 5, true)).await.unwrap();
        assert_eq!(limited.verdict, Err(FundRefusal::KeyLimit));
        l.settle(&settlement("r1", 3_500_000)).await.unwrap();
        l.settle(&settlement("r2", 3_500_000)).await.unwrap();
        // Past its use the lease is given back: nothing is held, every cent accounted for.
        tokio::time::sleep(LEASE_USE).await;
        until(async || LedgerStore::expired_holds(&*store, Millis::MAX).await.unwrap().is_empty()).await;
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
        assert_eq!(
            LedgerStore::expired_holds(&*store, Millis::MAX).await.unwrap(),
            vec!["r1".to_string()],
            "no lease row"
        );
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
        let open = LedgerStore::expired_holds(store, Millis::MAX).await.unwrap();
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
        until(async || LedgerStore::expired_holds(&*store, Millis::MAX).await.unwrap().is_empty()).await;
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
                let _ = held.send(crate::runtime::thread_policy::times_given_way());
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
                let _ = tx.send(crate::runtime::thread_policy::times_given_way());
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
}
