//! The ledger writer: one thread per process that takes everything queued (up to
//! [`MAX_BATCH`] ops) and applies it in one transaction through the backend's
//! [`LedgerWrites`], then answers each job (the queue's side is `batch.rs`).

use std::sync::Arc;
use std::sync::atomic::Ordering;
use std::time::{Duration, Instant};

use async_trait::async_trait;
use tokio::sync::{Notify, mpsc, oneshot};

use crate::runtime::clock::Millis;
use crate::store::StoreError;
use crate::store::ledger::Balance;
use crate::store::ledger::congestion::Congestion;
use crate::store::ledger::lease::{LEASE_USE, LeaseRow, Leases};
use crate::store::ledger::ops::{LedgerOp, OpResult};

/// Most ops in one transaction.
pub const MAX_BATCH: usize = 512;
/// Longest a batch of only settlements and releases (and lease holds) waits for a hold to
/// ride with: with leases it sets how many requests share a commit (decision 189).
pub const SETTLE_LINGER: Duration = Duration::from_millis(10);
/// A backend that applies a batch of ledger writes in one transaction.
#[async_trait]
pub trait LedgerWrites: Send + Sync {
    /// Lock the workspaces `ops` touch, apply them in order (`ledger::plan::plan`) and commit;
    /// one result per op. An `Err` means nothing was written.
    async fn apply(&self, ops: Arc<[LedgerOp]>) -> Result<Vec<OpResult>, StoreError>;

    /// Request ids of open holds whose expiry has passed.
    async fn expired_holds(&self, now: Millis) -> Result<Vec<String>, StoreError>;

    /// The workspace's stored balance and its open lease rows, every instance's, read in one
    /// snapshot (`ledger/lease.rs`); `None` for no workspace.
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

pub(super) struct Job {
    pub(super) op: LedgerOp,
    pub(super) reply: Reply,
    pub(super) queued: Instant,
    /// Sent again after failed batches (see [`Job::kept_until_written`]); such a job's
    /// `queued` time is no measure of the queue's wait.
    pub(super) retried: bool,
}

/// Where a job's outcome goes: a caller waiting for it, or a continuation run on the writer's
/// thread (a settlement nobody waits for: no task to wake on the request runtime).
pub(super) enum Reply {
    Wait(oneshot::Sender<OpResult>),
    Then(crate::store::ledger::Detached),
}

impl Reply {
    pub(super) fn send(self, r: OpResult) {
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
    pub(super) fn then(op: LedgerOp, done: crate::store::ledger::Detached) -> Job {
        Job { op, reply: Reply::Then(done), queued: Instant::now(), retried: false }
    }

    /// A lease hold's row or a lease's return: no caller waits for it and none would send it
    /// again, so the writer keeps it through failed batches until the store takes it.
    pub(super) fn kept_until_written(&self) -> bool {
        matches!(self.reply, Reply::Then(_))
            && match &self.op {
                LedgerOp::LeaseHold { .. } => true,
                LedgerOp::Release { request_id, .. } => {
                    request_id.starts_with(crate::store::ledger::lease::LEASE_PREFIX)
                }
                _ => false,
            }
    }

    /// A hold or funding decision: a request waits for it before going upstream.
    pub(super) fn holds(&self) -> bool {
        matches!(self.op, LedgerOp::Hold { .. } | LedgerOp::Fund(_))
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
pub(super) async fn return_leases(queue: mpsc::WeakSender<Job>, leases: Arc<Leases>) {
    let mut tick = tokio::time::interval(LEASE_USE / 4);
    loop {
        tick.tick().await;
        let Some(queue) = queue.upgrade() else { return };
        for op in leases.due(None, crate::runtime::clock::now_ms()) {
            if queue.try_send(Job::then(op, leases.row_queued())).is_err() {
                log::warn!("a lease could not be given back now (full queue); its row expires and is swept");
            }
        }
    }
}

thread_local! {
    /// Set on the writer's own thread: a store may run its blocking work inline there (the
    /// thread has nothing else to do while a batch commits) instead of handing it to another
    /// thread and back, two context switches per batch.
    pub(super) static ON_WRITER: std::cell::Cell<bool> = const { std::cell::Cell::new(false) };
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
pub(super) async fn writer(
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
        let giving_way = tollgate_threads::GivingWay::start(give_way);
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
