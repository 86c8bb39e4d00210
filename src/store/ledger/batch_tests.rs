//! Group commit: shedding, the reserved room, the settlement linger.

use super::*;
use crate::store::ledger::ops::OpOutcome;
use crate::store::ledger::{HoldOutcome, SettleOutcome, Settlement};
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

#[path = "batch_lease_tests.rs"]
mod leases;
