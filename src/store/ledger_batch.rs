//! Group commit for the ledger. Every hold and settlement of a workspace changes the same
//! balance row, so one transaction per change caps a workspace at what that row sustains
//! (~700 billed requests/s on PostgreSQL, issue 12). [`BatchedLedger`] wraps a backend and
//! keeps the [`LedgerStore`] contract: a hold, settlement or release is queued to one writer
//! per process, which takes everything queued (up to [`MAX_BATCH`] ops) and applies it in ONE
//! transaction (`LedgerWrites::apply`, the money rules in `ledger_ops::plan`), then answers
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
//! `ledger_lease.rs`, decision 187). Such a row, and a lease's return, is nobody's to retry:
//! when its batch fails (the store restarted or went away) the writer keeps it and sends it
//! again at the head of its next batches until the store takes it (decision 203), so the row
//! still lands before the request's settlement, which billing sends again after the failure.

use std::sync::Arc;
use std::sync::atomic::Ordering;
use std::time::{Duration, Instant};

use async_trait::async_trait;
use tokio::sync::{Notify, mpsc, oneshot};

use super::StoreError;
use super::ledger::{Balance, LedgerEntry, LedgerStore};
use super::ledger_congestion::Congestion;
use super::ledger_lease::{LEASE_USE, LeaseRow, Leases};
use super::ledger_ops::{FundOp, FundOutcome, LedgerOp, OpOutcome, OpResult};
use crate::money::plans::{PlanRecord, PlanTerms};
use crate::runtime::clock::Millis;

/// Most ops in one transaction.
pub const MAX_BATCH: usize = 512;
/// Queue length (ops waiting for the writer).
pub const QUEUE: usize = 8_192;
/// Free slots kept for settlements and releases (a quarter of the queue): a hold is refused
/// when no more are free.
pub const SETTLE_RESERVE: usize = QUEUE / 4;
/// Longest a settlement or release waits for room in the queue.
pub const ENQUEUE_WAIT: Duration = Duration::from_secs(5);
/// Longest a batch of only settlements and releases (and lease holds) waits for a hold to
/// ride with: with leases it sets how many requests share a commit (decision 189).
pub const SETTLE_LINGER: Duration = Duration::from_millis(10);
/// Default longest wait for the writer before holds are shed (`billing.ledger_max_wait_ms`).
pub const MAX_HOLD_WAIT: Duration = Duration::from_millis(500);

/// A backend that applies a batch of ledger writes in one transaction.
#[async_trait]
pub trait LedgerWrites: Send + Sync {
    /// Lock the workspaces `ops` touch, apply them in order (`ledger_ops::plan`) and commit;
    /// one result per op. An `Err` means nothing was written.
    async fn apply(&self, ops: Arc<[LedgerOp]>) -> Result<Vec<OpResult>, StoreError>;

    /// Request ids of open holds whose expiry has passed.
    async fn expired_holds(&self, now: Millis) -> Result<Vec<String>, StoreError>;

    /// The workspace's stored balance and its open lease rows, every instance's, read in one
    /// snapshot (`ledger_lease.rs`); `None` for no workspace.
    async fn balance_with_leases(&self, _workspace_id: &str) -> Result<Option<(Balance, Vec<LeaseRow>)>, StoreError> {
        Err(StoreError::Unavailable("this ledger backend reads no balance".into()))
    }

    /// Whether the writer's runtime needs an I/O driver: a store whose connections the writer
    /// drives itself (PostgreSQL, decision 151). Without one, waking the writer is a futex
    /// wake (decision 134).
    fn needs_io(&self) -> bool {
        false
    }
}

/// Apply one op through `w` (the unbatched backends use this, so there is one write path).
pub async fn apply_one(w: &(impl LedgerWrites + ?Sized), op: LedgerOp) -> OpResult {
    w.apply(Arc::from(vec![op]))
        .await?
        .into_iter()
        .next()
        .unwrap_or_else(|| Err(StoreError::Unavailable("the ledger answered no result".into())))
}

struct Job {
    op: LedgerOp,
    reply: Reply,
    queued: Instant,
    /// Sent again after failed batches (see [`Job::kept_until_written`]); such a job's
    /// `queued` time is no measure of the queue's wait.
    retried: bool,
}

/// Where a job's outcome goes: a caller waiting for it, or a continuation run on the writer's
/// thread (a settlement nobody waits for: no task to wake on the request runtime).
enum Reply {
    Wait(oneshot::Sender<OpResult>),
    Then(super::ledger::Detached),
}

impl Reply {
    fn send(self, r: OpResult) {
        match self {
            Reply::Wait(tx) => {
                let _ = tx.send(r); // the caller may have gone (client disconnected)
            }
            Reply::Then(done) => done(r),
        }
    }
}

impl Job {
    /// An op nobody waits for: `done` gets its outcome on whichever thread completes it.
    fn then(op: LedgerOp, done: super::ledger::Detached) -> Job {
        Job { op, reply: Reply::Then(done), queued: Instant::now(), retried: false }
    }

    /// A lease hold's row or a lease's return: no caller waits for it and none would send it
    /// again, so the writer keeps it through failed batches until the store takes it.
    fn kept_until_written(&self) -> bool {
        matches!(self.reply, Reply::Then(_))
            && match &self.op {
                LedgerOp::LeaseHold { .. } => true,
                LedgerOp::Release { request_id, .. } => request_id.starts_with(super::ledger_lease::LEASE_PREFIX),
                _ => false,
            }
    }

    /// A hold or funding decision: a request waits for it before going upstream.
    fn holds(&self) -> bool {
        matches!(self.op, LedgerOp::Hold { .. } | LedgerOp::Fund(_))
    }
}

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
    /// Balance this instance places holds from in memory (`ledger_lease.rs`).
    leases: Arc<Leases>,
}

impl BatchedLedger {
    /// Start the writer (a thread of its own with a small runtime, so it outlives whichever
    /// runtime opened the store: the stores are opened before Pingora starts its own). It
    /// stops when the last handle is dropped.
    pub fn new<S: LedgerStore + LedgerWrites + 'static>(store: Arc<S>) -> Result<BatchedLedger, StoreError> {
        BatchedLedger::with_parts(store.clone(), store, QUEUE)
    }

    /// Use each balance lease for `d` instead of [`LEASE_USE`] (tests that must not depend on
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
                crate::runtime::thread_policy::run_as_batch("ledger writer");
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
    fn queue_now(&self, op: LedgerOp, done: super::ledger::Detached) -> bool {
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
    /// ledger's, after which a lease is asked for (`ledger_lease.rs`).
    async fn fund_op(&self, op: FundOp) -> Result<FundOutcome, StoreError> {
        // A lease hold takes a slot without waiting: not while holds would be shed or the
        // queue is down to the room kept for settlements.
        if self.congested().is_none() && self.queue.capacity() > self.reserve {
            let placed = self.leases.take(&op, |row| self.queue_now(row, Box::new(written)));
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
            self.queue_now(op, Box::new(written));
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

/// The outcome of a row nobody waits for: logged if it failed.
fn written(r: OpResult) {
    match r {
        Ok(_) => {}
        // Sent again after a batch whose commit went through but whose answer was lost.
        Err(StoreError::Conflict(m)) => log::debug!("a lease's ledger row was written already: {m}"),
        Err(e) => log::warn!("a lease's ledger row was not written: {e}"),
    }
}

/// Most jobs kept through failed batches at once: a longer outage drops the newer ones (their
/// holds stay in their lease's row, given back with it, or expire and are swept).
pub const KEPT_MAX: usize = MAX_BATCH;
/// First wait before a batch of kept jobs is sent again with nothing else queued; doubled up
/// to [`KEPT_RETRY_MAX`].
const KEPT_RETRY: Duration = Duration::from_millis(100);
const KEPT_RETRY_MAX: Duration = Duration::from_secs(2);

/// Give back leases past their use, four times per [`LEASE_USE`], until the writer stops.
async fn return_leases(queue: mpsc::WeakSender<Job>, leases: Arc<Leases>) {
    let mut tick = tokio::time::interval(LEASE_USE / 4);
    loop {
        tick.tick().await;
        let Some(queue) = queue.upgrade() else { return };
        for op in leases.due(None, crate::runtime::clock::now_ms()) {
            if queue.try_send(Job::then(op, Box::new(written))).is_err() {
                log::warn!("a lease could not be given back now (full queue); its row expires and is swept");
            }
        }
    }
}

thread_local! {
    /// Set on the writer's own thread: a store may run its blocking work inline there (the
    /// thread has nothing else to do while a batch commits) instead of handing it to another
    /// thread and back, two context switches per batch.
    static ON_WRITER: std::cell::Cell<bool> = const { std::cell::Cell::new(false) };
}

/// Whether this is a ledger writer's thread.
pub(crate) fn on_writer_thread() -> bool {
    ON_WRITER.get()
}

static BATCH: std::sync::LazyLock<Option<crate::observe::metrics::StoreOp>> =
    std::sync::LazyLock::new(|| crate::observe::metrics::StoreOp::new("ledger", "batch"));

/// Drain the queue: everything waiting (up to `MAX_BATCH`) in one transaction. Jobs kept
/// through a failed batch go first in the next one (they were queued before anything queued
/// now); with nothing else queued they are sent again after a growing wait.
async fn writer(
    mut rx: mpsc::Receiver<Job>,
    writes: Arc<dyn LedgerWrites>,
    congestion: Arc<Congestion>,
    urgent: Arc<Notify>,
) {
    let mut jobs: Vec<Job> = Vec::with_capacity(MAX_BATCH);
    let mut kept: Vec<Job> = Vec::new();
    let mut retry_in = KEPT_RETRY;
    loop {
        let room = MAX_BATCH - kept.len().min(MAX_BATCH);
        if kept.is_empty() {
            if rx.recv_many(&mut jobs, MAX_BATCH).await == 0 {
                return;
            }
        } else if room > 0 {
            // A closed queue (0) still sends the kept jobs once more.
            let _ = tokio::time::timeout(retry_in, rx.recv_many(&mut jobs, room)).await;
        } else {
            tokio::time::sleep(retry_in).await;
        }
        if !kept.is_empty() {
            let new = std::mem::take(&mut jobs);
            jobs = kept.drain(..).chain(new).collect();
        }
        if !jobs.iter().any(Job::holds) && jobs.len() < MAX_BATCH {
            linger(&mut rx, &mut jobs, &urgent).await;
        }
        // The queue is first in, first out: the first job queued now waited longest.
        let oldest = jobs.iter().find(|j| !j.retried).map_or(0, |j| j.queued.elapsed().as_millis());
        congestion.seen_wait_ms.store(u64::try_from(oldest).unwrap_or(u64::MAX), Ordering::Relaxed);
        congestion.applying_since.store(congestion.ms() + 1, Ordering::Relaxed);
        // No request waits for a batch without holds, and one whose oldest op waited little
        // more than the linger is not behind: it may give way to request threads on its core
        // (decision 194). A batch holds waited for, or a writer falling behind, does not.
        let give_way = oldest <= 2 * SETTLE_LINGER.as_millis() && !jobs.iter().any(Job::holds);
        let ops: Vec<LedgerOp> = jobs.iter().map(|j| j.op.clone()).collect();
        log::trace!("ledger batch of {}", ops.len());
        let started = Instant::now();
        let giving_way = crate::runtime::thread_policy::GivingWay::start(give_way);
        let (results, failed) = apply_batch(&*writes, ops).await;
        drop(giving_way);
        crate::observe::metrics::StoreOp::record(&BATCH, results.iter().all(|r| r.is_ok()), started.elapsed());
        congestion.applying_since.store(0, Ordering::Relaxed);
        if rx.is_empty() {
            congestion.seen_wait_ms.store(0, Ordering::Relaxed);
        }
        retry_in = if failed { (retry_in * 2).min(KEPT_RETRY_MAX) } else { KEPT_RETRY };
        for (mut job, r) in jobs.drain(..).zip(results) {
            if failed && job.kept_until_written() {
                if kept.len() < KEPT_MAX {
                    job.retried = true;
                    kept.push(job);
                    continue;
                }
                log::warn!("ledger: too many rows wait for the store; one is dropped (its lease keeps the money)");
            }
            job.reply.send(r);
        }
    }
}

/// A batch of settlements and releases only waits up to [`SETTLE_LINGER`] for more ops, and
/// goes at once when a hold arrives (decision 132). No request waits for a settlement
/// (decision 128), so at low load a settlement rides in the next request's hold transaction
/// instead of a commit of its own: one transaction per request instead of two.
///
/// The wait does not poll the queue: a channel wakes its receiver only while the receiver
/// waits on it, so the settlements and lease rows queued meanwhile (two per request) do not
/// each wake this thread to look at them and park again. A hold, or a full batch's worth
/// of ops, ends the wait through `urgent` (`BatchedLedger::queued`, decision 193).
async fn linger(rx: &mut mpsc::Receiver<Job>, jobs: &mut Vec<Job>, urgent: &Notify) {
    let woken = urgent.notified();
    tokio::pin!(woken);
    // Registered before the queue is looked at, so a hold queued after the look wakes it
    // and one queued before it is found by it.
    woken.as_mut().enable();
    if take_queued(rx, jobs) {
        return;
    }
    tokio::select! {
        () = tokio::time::sleep(SETTLE_LINGER) => {}
        () = woken => {}
    }
    take_queued(rx, jobs);
}

/// Move what is queued into `jobs` (up to [`MAX_BATCH`]) without waiting; whether the batch
/// should go now: it holds a hold, or it is full.
fn take_queued(rx: &mut mpsc::Receiver<Job>, jobs: &mut Vec<Job>) -> bool {
    while jobs.len() < MAX_BATCH {
        match rx.try_recv() {
            Ok(job) => jobs.push(job),
            Err(_) => break,
        }
    }
    jobs.len() >= MAX_BATCH || jobs.iter().any(Job::holds)
}

/// One transaction for `ops`, and whether it failed whole (an outage: nothing written). A
/// uniqueness conflict (which the snapshot should have prevented) fails a whole transaction,
/// so then each op is retried alone and only the offending one fails.
async fn apply_batch(writes: &dyn LedgerWrites, ops: Vec<LedgerOp>) -> (Vec<OpResult>, bool) {
    let n = ops.len();
    let ops: Arc<[LedgerOp]> = Arc::from(ops);
    match writes.apply(ops.clone()).await {
        Ok(results) if results.len() == n => (results, false),
        Ok(_) => (vec![Err(StoreError::Unavailable("the ledger answered a batch partly".into())); n], true),
        Err(StoreError::Conflict(m)) if n > 1 => {
            log::warn!("ledger batch of {n} refused ({m}); applying its ops one by one");
            let mut out = Vec::with_capacity(n);
            for op in ops.iter() {
                out.push(apply_one(writes, op.clone()).await);
            }
            (out, false)
        }
        Err(e) => {
            let outage = matches!(e, StoreError::Unavailable(_));
            (vec![Err(e); n], outage)
        }
    }
}

#[async_trait]
impl LedgerStore for BatchedLedger {
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

    async fn balance(&self, workspace_id: &str) -> Result<Option<Balance>, StoreError> {
        self.store.balance(workspace_id).await
    }

    async fn submit(&self, op: LedgerOp) -> OpResult {
        self.enqueue(op).await
    }

    async fn fund(&self, op: FundOp) -> Result<FundOutcome, StoreError> {
        self.fund_op(op).await
    }

    fn leased_cents(&self, workspace_id: &str) -> i64 {
        self.leases.unused(workspace_id)
    }

    async fn balance_and_unused_leases(&self, workspace_id: &str) -> Result<Option<(Balance, i64)>, StoreError> {
        let read = self.writes.balance_with_leases(workspace_id).await?;
        let now = crate::runtime::clock::now_ms();
        Ok(read.map(|(b, rows)| (b, self.leases.unused_everywhere(workspace_id, &rows, now))))
    }

    async fn give_back_leases(&self) -> usize {
        let mut given = 0;
        loop {
            let ops = self.leases.all();
            let answers = futures_util::future::join_all(ops.into_iter().map(|op| self.enqueue(op))).await;
            given += answers.iter().filter(|r| matches!(r, Ok(OpOutcome::Release(true)))).count();
            // A grant the writer has not answered yet becomes a lease when it does (on a busy
            // machine, after the requests that asked for it ended): give that back too. The
            // caller bounds the wait.
            if !self.leases.granting() {
                return given;
            }
            tokio::time::sleep(std::time::Duration::from_millis(5)).await;
        }
    }

    fn submit_detached(self: Arc<Self>, op: LedgerOp, done: super::ledger::Detached) {
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

    async fn expired_holds(&self, now: Millis) -> Result<Vec<String>, StoreError> {
        self.writes.expired_holds(now).await
    }

    fn congested(&self) -> Option<Duration> {
        let wait = self.congestion.wait();
        (wait > self.max_hold_wait).then_some(wait)
    }

    async fn plan(&self, workspace_id: &str) -> Result<Option<PlanRecord>, StoreError> {
        self.store.plan(workspace_id).await
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

    async fn set_frozen(&self, workspace_id: &str, reason: Option<&str>) -> Result<bool, StoreError> {
        self.store.set_frozen(workspace_id, reason).await
    }

    async fn sweep_expired_credit(&self, now: Millis) -> Result<Vec<(String, i64)>, StoreError> {
        self.store.sweep_expired_credit(now).await
    }
}

#[cfg(test)]
#[path = "ledger_batch_tests.rs"]
mod tests;
