//! Group commit for the ledger. Every hold and settlement of a workspace changes the same
//! balance row, so one transaction per change caps a workspace at what that row sustains
//! (~700 billed requests/s on PostgreSQL, issue 12). [`BatchedLedger`] wraps a backend and
//! keeps the [`LedgerStore`] contract: a hold, settlement or release is queued to one writer
//! per process, which takes everything queued (up to [`MAX_BATCH`] ops) and applies it in ONE
//! transaction (`LedgerWrites::apply`, the money rules in `ledger::plan::plan`), then answers
//! each caller. A hold never waits for a timer: a lone request is written at once, and under
//! load the batch grows by itself while the previous one commits. Only a batch of nothing but
//! settlements and releases, which no request waits for, lingers up to [`SETTLE_LINGER`] for
//! a hold to ride with (decision 132).
//!
//! What stays exact: a hold is answered only after its transaction committed (so it is in
//! force before the replica sees the request); holds of one batch are applied in queue order
//! against the running balance (refusals are exactly those a one-at-a-time ledger would
//! make); settlement stays once per request id. Bounded (decision 131): a hold (or funding
//! decision) is refused with `StoreError::Busy` (billing answers `429
//! hosted_admission_congested`) while the writer's queue makes ops wait longer than the
//! instance's `billing.ledger_max_wait_ms`, so the queue stops growing however much more than
//! the store can write is offered (a batch already running still takes its own time); it is
//! refused with `StoreError::Unavailable` once the queue has fewer than [`SETTLE_RESERVE`]
//! free slots.
//! Settlements and releases are never shed: they wait for a slot up to
//! [`ENQUEUE_WAIT`] (their room is reserved), then fail like a store outage (billing retries
//! them in the background). A crash loses at most the ops queued or in the open batch: queued
//! holds were never answered (their requests never went upstream), queued settlements are an
//! undercharge whose hold the sweeper releases (decision 100).
//!
//! Most holds do not wait for the writer at all: a plan-less workspace's hold is taken in
//! memory from a lease of its balance and its row queued like a settlement (`fund_op`,
//! `ledger/lease.rs`, decision 187). Such a row, and a lease's return, is nobody's to retry:
//! when its batch fails (the store restarted or went away) the writer keeps it and sends it
//! again at the head of its next batches until the store takes it (decision 203), so the row
//! still lands before the request's settlement, which billing sends again after the failure.

use std::sync::Arc;
use std::time::{Duration, Instant};

use async_trait::async_trait;
use tokio::sync::{Notify, mpsc, oneshot};

use crate::money::plans::{PlanRecord, PlanTerms};
use crate::runtime::clock::Millis;
use crate::store::StoreError;
use crate::store::ledger::congestion::Congestion;
use crate::store::ledger::lease::Leases;
use crate::store::ledger::ops::{FundOp, FundOutcome, LedgerOp, OpOutcome, OpResult};
pub(crate) use crate::store::ledger::writer::on_writer_thread;
use crate::store::ledger::writer::{Job, ON_WRITER, Reply, return_leases, writer};
pub use crate::store::ledger::writer::{KEPT_MAX, LedgerWrites, MAX_BATCH, SETTLE_LINGER, apply_one};
use crate::store::ledger::{Balance, LedgerAdmin, LedgerEntry, LedgerReads, LedgerStore, RequestLedger};

/// Queue length (ops waiting for the writer).
pub const QUEUE: usize = 8_192;
/// Free slots kept for settlements and releases (a quarter of the queue): a hold is refused
/// when no more are free.
pub const SETTLE_RESERVE: usize = QUEUE / 4;
/// Longest a settlement or release waits for room in the queue.
pub const ENQUEUE_WAIT: Duration = Duration::from_secs(5);
/// Default longest wait for the writer before holds are shed (`billing.ledger_max_wait_ms`).
pub const MAX_HOLD_WAIT: Duration = Duration::from_millis(500);

/// The ledger with group commit; reads and rare writes go straight to the backend.
pub struct BatchedLedger {
    store: Arc<dyn LedgerStore>,
    writes: Arc<dyn LedgerWrites>,
    queue: mpsc::Sender<Job>,
    /// Free slots a hold leaves for settlements and releases.
    reserve: usize,
    congestion: Arc<Congestion>,
    /// Ends the writer's settlement linger: a hold was queued, or a batch's worth of ops.
    urgent: Arc<Notify>,
    /// Holds are shed while ops wait longer than this.
    max_hold_wait: Duration,
    /// Balance this instance places holds from in memory (`ledger/lease.rs`).
    leases: Arc<Leases>,
}

impl BatchedLedger {
    /// Start the writer (a thread of its own with a small runtime, so it outlives whichever
    /// runtime opened the store: the stores are opened before Pingora starts its own). It
    /// stops when the last handle is dropped.
    pub fn new<S: LedgerStore + LedgerWrites + 'static>(store: Arc<S>) -> Result<BatchedLedger, StoreError> {
        BatchedLedger::with_parts(store.clone(), store, QUEUE)
    }

    /// Use each balance lease for `d` instead of [`crate::store::ledger::lease::LEASE_USE`] (tests that must not depend on
    /// how fast the machine runs).
    pub fn with_lease_use(self, d: Duration) -> BatchedLedger {
        self.leases.set_use(d);
        self
    }

    /// Shed holds while ops wait longer than `wait` for the writer (default [`MAX_HOLD_WAIT`]).
    pub fn with_max_hold_wait(mut self, wait: Duration) -> BatchedLedger {
        self.max_hold_wait = wait;
        self
    }

    /// `store` for reads and top-ups, `writes` for the batches, a queue of `queue` ops (a
    /// quarter of it kept for settlements and releases).
    pub fn with_parts(
        store: Arc<dyn LedgerStore>,
        writes: Arc<dyn LedgerWrites>,
        queue: usize,
    ) -> Result<BatchedLedger, StoreError> {
        let (tx, rx) = mpsc::channel(queue.max(1));
        // SQLite runs inline and needs timers only (the settlement linger): waking the writer
        // from a request thread is then a futex wake instead of an eventfd write and an epoll
        // return (decision 134). PostgreSQL's batches run on connections the writer drives
        // itself, which need the I/O driver (decision 151).
        let mut rt = tokio::runtime::Builder::new_current_thread();
        if writes.needs_io() {
            rt.enable_io();
        }
        let rt =
            rt.enable_time().build().map_err(|e| StoreError::Unavailable(format!("ledger writer runtime: {e}")))?;
        let w = writes.clone();
        let congestion = Arc::new(Congestion::new());
        let seen = congestion.clone();
        let urgent = Arc::new(Notify::new());
        let woken = urgent.clone();
        let leases = Arc::new(Leases::default());
        rt.spawn(return_leases(tx.downgrade(), leases.clone()));
        std::thread::Builder::new()
            .name("ledger-writer".into())
            .spawn(move || {
                // Woken by requests (a batch's first op, every hold), it must not preempt
                // them: it commits what queued meanwhile when the request thread yields
                // (decision 140).
                tollgate_threads::run_as_batch("ledger writer");
                ON_WRITER.set(true);
                rt.block_on(writer(rx, w, seen, woken))
            })
            .map_err(|e| StoreError::Unavailable(format!("ledger writer thread: {e}")))?;
        Ok(BatchedLedger {
            store,
            writes,
            queue: tx,
            reserve: queue / 4,
            congestion,
            urgent,
            max_hold_wait: MAX_HOLD_WAIT,
            leases,
        })
    }

    /// Queue an op nobody waits for, if there is a free slot now; `done` gets its outcome on
    /// the writer's thread.
    fn queue_now(&self, op: LedgerOp, done: crate::store::ledger::Detached) -> bool {
        match self.try_queue(Job::then(op, done)) {
            Ok(()) => true,
            Err(mpsc::error::TrySendError::Full(job)) => {
                job.reply.send(Err(StoreError::NotQueued("the ledger queue is full".into())));
                false
            }
            Err(mpsc::error::TrySendError::Closed(job)) => {
                job.reply.send(Err(StoreError::NotQueued("the ledger writer stopped".into())));
                false
            }
        }
    }

    /// The funding decision from this instance's lease when one covers the hold; else the
    /// ledger's, after which a lease is asked for (`ledger/lease.rs`).
    async fn fund_op(&self, op: FundOp) -> Result<FundOutcome, StoreError> {
        // A lease hold takes a slot without waiting: not while holds would be shed or the
        // queue is down to the room kept for settlements.
        if self.congested().is_none() && self.queue.capacity() > self.reserve {
            let placed = self.leases.take(&op, |row| self.queue_now(row, self.leases.row_queued()));
            if let Some((outcome, renewal)) = placed {
                if let Some(grant) = renewal {
                    self.queue_grant(grant);
                }
                return Ok(outcome);
            }
        }
        let asked = op.clone();
        let outcome = match self.enqueue(LedgerOp::Fund(Box::new(op))).await? {
            OpOutcome::Fund(f) => *f,
            other => return Err(StoreError::Unavailable(format!("unexpected ledger answer {other:?}"))),
        };
        if let Some(grant) = self.leases.ask(&asked, &outcome) {
            self.queue_grant(grant);
        }
        Ok(outcome)
    }

    /// Queue a lease's grant, its answer to the leases (also when it could not be queued).
    fn queue_grant(&self, grant: LedgerOp) {
        let (leases, sent) = (self.leases.clone(), grant.clone());
        self.queue_now(grant, Box::new(move |r| leases.granted(&sent, &r)));
    }

    /// Give back `workspace`'s lease now (its plan changed here).
    fn give_back(&self, workspace: &str) {
        for op in self.leases.due(Some(workspace), crate::runtime::clock::now_ms()) {
            self.queue_now(op, self.leases.row_queued());
        }
    }
}

impl BatchedLedger {
    /// Queue `job` if there is a free slot now (every request-side send goes through here
    /// or through [`Self::queued`]).
    // The error hands the job back, as the channel's own `try_send` does.
    #[allow(clippy::result_large_err)]
    fn try_queue(&self, job: Job) -> Result<(), mpsc::error::TrySendError<Job>> {
        let holds = job.holds();
        self.queue.try_send(job)?;
        self.queued(holds);
        Ok(())
    }

    /// After a job was queued: the writer's settlement linger does not poll the queue, so
    /// a hold (a request waits for it) or a full batch's worth of ops wakes it here; any
    /// other op rides in the lingering batch without waking it (decision 193). Only a
    /// linger waiting now is woken: no permit is left to cut a later one short.
    fn queued(&self, holds: bool) {
        if holds || self.queue.max_capacity() - self.queue.capacity() >= MAX_BATCH {
            self.urgent.notify_waiters();
        }
    }

    async fn enqueue(&self, op: LedgerOp) -> OpResult {
        let (reply, answer) = oneshot::channel();
        let job = Job { op, reply: Reply::Wait(reply), queued: Instant::now(), retried: false };
        if job.holds() {
            if let Some(wait) = self.congested() {
                return Err(StoreError::Busy(format!(
                    "ledger writes wait {} ms, above the {} ms bound",
                    wait.as_millis(),
                    self.max_hold_wait.as_millis()
                )));
            }
            if self.queue.capacity() <= self.reserve {
                return Err(StoreError::NotQueued("the ledger queue is full".into()));
            }
            self.try_queue(job).map_err(|_| StoreError::NotQueued("the ledger queue is full".into()))?;
        } else {
            // A free slot takes the job at once; only a full queue arms the wait's timer.
            let job = match self.try_queue(job) {
                Ok(()) => None,
                Err(mpsc::error::TrySendError::Full(job)) => Some(job),
                Err(mpsc::error::TrySendError::Closed(_)) => {
                    return Err(StoreError::NotQueued("the ledger writer stopped".into()));
                }
            };
            if let Some(job) = job {
                match tokio::time::timeout(ENQUEUE_WAIT, self.queue.send(job)).await {
                    Ok(Ok(())) => self.queued(false),
                    Ok(Err(_)) => return Err(StoreError::NotQueued("the ledger writer stopped".into())),
                    Err(_) => return Err(StoreError::Unavailable("the ledger queue stayed full".into())),
                }
            }
        }
        answer.await.map_err(|_| StoreError::Unavailable("the ledger writer stopped".into()))?
    }
}

#[async_trait]
impl RequestLedger for BatchedLedger {
    async fn submit(&self, op: LedgerOp) -> OpResult {
        self.enqueue(op).await
    }

    async fn fund(&self, op: FundOp) -> Result<FundOutcome, StoreError> {
        self.fund_op(op).await
    }

    fn submit_detached(self: Arc<Self>, op: LedgerOp, done: crate::store::ledger::Detached) {
        let job = Job::then(op, done);
        match self.try_queue(job) {
            Ok(()) => {}
            Err(mpsc::error::TrySendError::Closed(job)) => {
                job.reply.send(Err(StoreError::NotQueued("the ledger writer stopped".into())));
            }
            // A full queue: wait for a slot on a task, as a waiting settlement would.
            Err(mpsc::error::TrySendError::Full(job)) => {
                tokio::spawn(async move {
                    match tokio::time::timeout(ENQUEUE_WAIT, self.queue.reserve()).await {
                        Ok(Ok(slot)) => {
                            slot.send(job);
                            self.queued(false);
                        }
                        Ok(Err(_)) => job.reply.send(Err(StoreError::NotQueued("the ledger writer stopped".into()))),
                        Err(_) => job.reply.send(Err(StoreError::Unavailable("the ledger queue stayed full".into()))),
                    }
                });
            }
        }
    }

    fn congested(&self) -> Option<Duration> {
        let wait = self.congestion.wait();
        (wait > self.max_hold_wait).then_some(wait)
    }
}

#[async_trait]
impl LedgerReads for BatchedLedger {
    async fn balance(&self, workspace_id: &str) -> Result<Option<Balance>, StoreError> {
        self.store.balance(workspace_id).await
    }

    fn leased_cents(&self, workspace_id: &str) -> i64 {
        self.leases.unused(workspace_id)
    }

    async fn balance_and_unused_leases(&self, workspace_id: &str) -> Result<Option<(Balance, i64)>, StoreError> {
        let read = self.writes.balance_with_leases(workspace_id).await?;
        let now = crate::runtime::clock::now_ms();
        Ok(read.map(|(b, rows)| (b, self.leases.unused_everywhere(workspace_id, &rows, now))))
    }

    async fn plan(&self, workspace_id: &str) -> Result<Option<PlanRecord>, StoreError> {
        self.store.plan(workspace_id).await
    }

    async fn entries(&self, workspace_id: &str, limit: i64) -> Result<Vec<LedgerEntry>, StoreError> {
        self.store.entries(workspace_id, limit).await
    }

    async fn derived_balance(&self, workspace_id: &str) -> Result<i64, StoreError> {
        self.store.derived_balance(workspace_id).await
    }

    async fn spent_since(&self, workspace_id: &str, since: Millis) -> Result<i64, StoreError> {
        self.store.spent_since(workspace_id, since).await
    }

    async fn key_month_spend(&self, key_id: &str, month: &str) -> Result<i64, StoreError> {
        self.store.key_month_spend(key_id, month).await
    }
}

#[async_trait]
impl LedgerAdmin for BatchedLedger {
    async fn top_up(
        &self,
        workspace_id: &str,
        amount_cents: i64,
        source: &str,
        expires_at: Option<Millis>,
        now: Millis,
    ) -> Result<(i64, i64), StoreError> {
        self.store.top_up(workspace_id, amount_cents, source, expires_at, now).await
    }

    async fn give_back_leases(&self) -> usize {
        let mut given = 0;
        loop {
            let ops = self.leases.all();
            let answers = futures_util::future::join_all(ops.into_iter().map(|op| self.enqueue(op))).await;
            given += answers.iter().filter(|r| matches!(r, Ok(OpOutcome::Release(true)))).count();
            // A grant the writer has not answered yet becomes a lease when it does (on a busy
            // machine, after the requests that asked for it ended): give that back too. A lease
            // the returner gave back a moment ago is still in the writer's queue: wait for it,
            // or the process ends before its row is written. The caller bounds the wait.
            if !self.leases.granting() && !self.leases.rows_unanswered() {
                return given;
            }
            tokio::time::sleep(std::time::Duration::from_millis(5)).await;
        }
    }

    async fn expired_holds(&self, now: Millis) -> Result<Vec<String>, StoreError> {
        self.writes.expired_holds(now).await
    }

    async fn set_plan(
        &self,
        workspace_id: &str,
        terms: &PlanTerms,
        now: Millis,
    ) -> Result<Option<PlanRecord>, StoreError> {
        let set = self.store.set_plan(workspace_id, terms, now).await;
        self.give_back(workspace_id);
        set
    }

    async fn clear_plan(&self, workspace_id: &str) -> Result<bool, StoreError> {
        self.store.clear_plan(workspace_id).await
    }

    async fn set_frozen(&self, workspace_id: &str, reason: Option<&str>) -> Result<bool, StoreError> {
        self.store.set_frozen(workspace_id, reason).await
    }

    async fn sweep_expired_credit(&self, now: Millis) -> Result<Vec<(String, i64)>, StoreError> {
        self.store.sweep_expired_credit(now).await
    }
}

#[cfg(test)]
#[path = "batch_tests.rs"]
mod tests;
