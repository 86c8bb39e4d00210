//! Group commit: shedding, the reserved room, the settlement linger.

use super::*;
use crate::store::ledger::{HoldOutcome, SettleOutcome, Settlement};
use crate::store::ledger_ops::OpOutcome;
use tokio::sync::Semaphore;

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
                LedgerOp::Fund(_) => Err(StoreError::Unavailable("not in this test".into())),
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
    tokio::time::sleep(Duration::from_millis(50)).await;
    waiting.extend((1..7).map(|i| hold(l.clone(), i)));
    tokio::time::sleep(Duration::from_millis(50)).await;
    let started = std::time::Instant::now();
    let refused = l.place_hold("r7", "w", None, 1, 10, 1).await;
    assert!(matches!(refused, Err(StoreError::NotQueued(_))), "{refused:?}");
    assert!(started.elapsed() < Duration::from_millis(20), "refused without waiting");
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
    tokio::time::sleep(Duration::from_millis(20)).await;
    let queued = {
        let l = l.clone();
        tokio::spawn(async move { l.place_hold("r1", "w", None, 1, 10, 1).await })
    };
    tokio::time::sleep(Duration::from_millis(100)).await;
    // The running batch has taken longer than the bound: a new hold is shed at once.
    let started = std::time::Instant::now();
    let shed = l.place_hold("r2", "w", None, 1, 10, 1).await;
    assert!(matches!(shed, Err(StoreError::Busy(_))), "{shed:?}");
    assert!(started.elapsed() < Duration::from_millis(20), "shed without waiting");
    // A release is never shed.
    let release = {
        let l = l.clone();
        tokio::spawn(async move { l.release_hold("r0", 2).await })
    };
    tokio::time::sleep(Duration::from_millis(20)).await;
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
    let dir = std::env::temp_dir().join(format!("tollgate-batch-{}", uuid::Uuid::new_v4().simple()));
    let store = Arc::new(crate::store::sqlite::SqliteStore::open(&dir.join("l.db")).unwrap());
    let rec = Arc::new(Recorder::default());
    let l = Arc::new(BatchedLedger::with_parts(store, rec.clone(), 64).unwrap());
    let settled = {
        let l = l.clone();
        tokio::spawn(async move { l.settle(&settlement("s1")).await })
    };
    tokio::task::yield_now().await;
    let started = Instant::now();
    assert_eq!(l.place_hold("h1", "w", None, 1, 10, 1).await, Ok(HoldOutcome::Placed { balance_cents: 0 }));
    assert!(started.elapsed() < SETTLE_LINGER * 10, "the hold did not wait for the linger");
    assert_eq!(settled.await.unwrap(), Ok(SettleOutcome::AlreadySettled));
    assert_eq!(*rec.0.lock().unwrap(), vec![vec!["s1".to_string(), "h1".to_string()]], "one transaction");
    // Alone, a settlement is written after the linger.
    assert_eq!(l.settle(&settlement("s2")).await, Ok(SettleOutcome::AlreadySettled));
    assert_eq!(rec.0.lock().unwrap().last().unwrap(), &vec!["s2".to_string()]);
    let _ = std::fs::remove_dir_all(&dir);
}
