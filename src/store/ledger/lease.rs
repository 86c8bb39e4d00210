//! Holds placed in memory from a lease (issue 12, decision 187). A request's hold used to wait
//! for its transaction's commit, and on SQLite that commit sometimes waits milliseconds
//! behind the checkpoint's writes: the embedded store's p99. Instead, once a plan-less
//! workspace has shown it can pay, this instance asks the ledger for a lease: a chunk of the
//! balance recorded as an open hold row of its own (`LedgerOp::LeaseGrant`). A request's hold
//! is then taken from that chunk in memory, and its row is written in the background
//! (`LedgerOp::LeaseHold`, which moves the amount from the lease's row to the request's), so
//! the request goes upstream without waiting for the ledger. The next lease is asked for in
//! the background once three quarters of this one's time or money is used, so at a steady
//! load no request waits for a grant either.
//!
//! What stays exact: the money a lease holds is deducted from the stored balance before any
//! hold is taken from it, so a hold from a lease is in force (no other request, on any
//! instance, can spend it) before the replica sees the request; the rows are written in queue
//! order (the lease hold before its request's settlement or release, the last lease hold
//! before the lease's return); settlement stays once per request id. A lease is used for
//! [`LEASE_USE`] at most and then given back (`LedgerOp::Release` of its row), so a plan set
//! on another instance applies within that time; its row expires with a request's hold (and
//! the sweeper gives it back) if this instance dies. A crash loses what it always lost: the
//! queued rows of requests that die with it.
//!
//! What a lease changes: the stored balance counts the unused part of every open lease as
//! held; the reads that show a balance (the credits read, the admin ledger listing) add the
//! unused leases back, this instance's from memory and the other instances' live rows as
//! stored (`LedgerReads::balance_shown`, [`Leases::unused_everywhere`], decision 190).
//! A lease takes at most an eighth of the balance and is only asked for when the balance
//! covers [`LEASE_MIN_HOLDS`] holds of the request's size, so a low balance is decided hold
//! by hold by the ledger, as before.
//!
//! A hold the stored balance refuses while the open holds could cover it recalls the leases
//! (`workspaces.leases_recalled_until`, decision 191): no lease is granted for the workspace
//! for a few seconds, so the instances holding one give it back within a second, and the
//! billing plugin asks for the refused hold again meanwhile.

use std::sync::Mutex;
use std::sync::atomic::{AtomicU64, Ordering};
use std::time::{Duration, Instant};

use crate::money::plans::decide::Funding;
use crate::runtime::clock::Millis;
use crate::runtime::fast_map::FastMap;
use crate::store::ledger::Balance;
use crate::store::ledger::ops::{FundOp, FundOutcome, LedgerOp, OpOutcome};

/// Longest a lease is used before it is given back (and a fresh one asked for).
pub const LEASE_USE: Duration = Duration::from_secs(1);
/// A lease asks for this many holds of the request that asked for it.
pub const LEASE_HOLDS: i64 = 1_024;
/// No lease is granted smaller than this many holds (the ledger decides each hold then).
pub const LEASE_MIN_HOLDS: i64 = 16;
/// A lease row younger than this is a running instance's: a lease in use is renewed or given
/// back within [`LEASE_USE`]. An older open one is a stalled or dead instance's, held until
/// the sweeper gives it back.
pub const LEASE_LIVE: Duration = Duration::from_secs(2);

/// What every lease's id starts with (its hold row's request id).
pub const LEASE_PREFIX: &str = "lease_";

/// A lease as stored: an open hold row named `lease_…` (`LedgerWrites::balance_with_leases`).
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct LeaseRow {
    pub id: String,
    pub amount_cents: i64,
    pub created_at: Millis,
}

/// This instance's leases, by workspace.
pub struct Leases {
    slots: Mutex<FastMap<String, Slot>>,
    /// `lease_` and a per-process random prefix: this instance's lease ids are it and a
    /// counter.
    own: String,
    counter: AtomicU64,
    /// How long a lease is used ([`LEASE_USE`]; tests on a busy machine set it longer).
    use_ms: AtomicU64,
    /// Lease rows queued without a waiter and not yet answered ([`Leases::row_queued`]).
    rows_queued: AtomicU64,
}

#[derive(Default)]
struct Slot {
    lease: Option<Lease>,
    /// A grant is queued: ask no other.
    granting: bool,
    /// A refused grant is not asked for again before this.
    quiet_until: Option<Instant>,
    /// Leases replaced by a renewal, to be given back (after the holds already queued).
    retired: Vec<Lease>,
}

struct Lease {
    id: String,
    granted_cents: i64,
    left_cents: i64,
    use_until: Instant,
}

impl Slot {
    /// A lease in use past three quarters of its time or of its money: ask for the next one
    /// now, so the requests never wait for a grant.
    fn renewal_due(&self, use_for: Duration) -> bool {
        let Some(l) = self.lease.as_ref().filter(|_| !self.granting) else { return false };
        let quiet = self.quiet_until.is_some_and(|t| Instant::now() < t);
        !quiet && (l.left_cents < l.granted_cents / 4 || Instant::now() + use_for / 4 >= l.use_until)
    }
}

impl Default for Leases {
    fn default() -> Leases {
        let b = uuid::Uuid::new_v4().into_bytes();
        let prefix = u64::from_le_bytes([b[0], b[1], b[2], b[3], b[4], b[5], b[6], b[7]]);
        Leases {
            slots: Mutex::new(FastMap::default()),
            own: format!("{LEASE_PREFIX}{prefix:016x}"),
            counter: AtomicU64::new(0),
            use_ms: AtomicU64::new(u64::try_from(LEASE_USE.as_millis()).unwrap_or(u64::MAX)),
            rows_queued: AtomicU64::new(0),
        }
    }
}

impl Leases {
    /// Use each lease for `d` instead of [`LEASE_USE`].
    pub fn set_use(&self, d: Duration) {
        self.use_ms.store(u64::try_from(d.as_millis()).unwrap_or(u64::MAX), Ordering::Relaxed);
    }

    fn use_for(&self) -> Duration {
        Duration::from_millis(self.use_ms.load(Ordering::Relaxed))
    }

    fn slots(&self) -> std::sync::MutexGuard<'_, FastMap<String, Slot>> {
        self.slots.lock().unwrap_or_else(std::sync::PoisonError::into_inner)
    }

    /// Take `f`'s hold from the workspace's lease if one covers it, with the grant of the
    /// next lease to queue when this one is running out (answered to [`Leases::granted`]).
    /// `queue` sends an op (the request's hold row, or a lease given back) and says whether it
    /// was queued; it runs with the map locked, so a lease's rows are queued in the order
    /// taken and before its return.
    pub fn take(&self, f: &FundOp, queue: impl Fn(LedgerOp) -> bool) -> Option<(FundOutcome, Option<LedgerOp>)> {
        if f.ask.key_limit_reached || f.ask.hold_cents < 0 {
            return None;
        }
        let mut slots = self.slots();
        let slot = slots.get_mut(&f.workspace_id)?;
        // Retired leases, and this one if it cannot cover the hold, go back first.
        let spent =
            slot.lease.as_ref().is_some_and(|l| l.left_cents < f.ask.hold_cents || Instant::now() >= l.use_until);
        let gone = if spent { slot.lease.take() } else { None };
        for l in slot.retired.drain(..).chain(gone) {
            if !queue(give_back(l, f.now)) {
                log::warn!("a lease could not be given back now (full queue); its row expires and is swept");
            }
        }
        let lease = slot.lease.as_mut()?;
        let op = LedgerOp::LeaseHold {
            lease_id: lease.id.clone(),
            request_id: f.request_id.clone(),
            workspace_id: f.workspace_id.clone(),
            key_id: f.key_id.clone(),
            amount_cents: f.ask.hold_cents,
            expires_at: f.expires_at,
            now: f.now,
        };
        if !queue(op) {
            return None;
        }
        lease.left_cents -= f.ask.hold_cents;
        let renewal = slot.renewal_due(self.use_for()).then(|| self.grant(slot, f));
        Some((FundOutcome { verdict: Ok(Funding::PayAsYouGo), plan: None }, renewal))
    }

    /// After the ledger admitted `f` pay-as-you-go without a plan: the op that asks for a
    /// lease for its workspace, unless one is held, asked for or lately refused.
    pub fn ask(&self, f: &FundOp, outcome: &FundOutcome) -> Option<LedgerOp> {
        let pay_as_you_go = outcome.plan.is_none() && outcome.verdict == Ok(Funding::PayAsYouGo);
        if !pay_as_you_go || f.ask.key_limit_reached {
            return None;
        }
        let mut slots = self.slots();
        let slot = slots.entry(f.workspace_id.clone()).or_default();
        if slot.granting || slot.lease.is_some() || slot.quiet_until.is_some_and(|t| Instant::now() < t) {
            return None;
        }
        Some(self.grant(slot, f))
    }

    /// The op asking for a lease sized for `f`'s hold; the slot waits for its answer.
    fn grant(&self, slot: &mut Slot, f: &FundOp) -> LedgerOp {
        slot.granting = true;
        let n = self.counter.fetch_add(1, Ordering::Relaxed);
        let use_ms = Millis::try_from(self.use_for().as_millis()).unwrap_or(Millis::MAX);
        LedgerOp::LeaseGrant {
            lease_id: format!("{}{n:016x}", self.own),
            workspace_id: f.workspace_id.clone(),
            want_cents: f.ask.hold_cents.saturating_mul(LEASE_HOLDS),
            min_cents: f.ask.hold_cents.saturating_mul(LEASE_MIN_HOLDS),
            // Past every hold taken from it; the sweeper gives it back if this instance dies.
            expires_at: f.expires_at.saturating_add(use_ms),
            now: f.now,
        }
    }

    /// The grant's answer (on the writer's thread): the lease is in use from now; the one it
    /// renews is retired, given back by the next hold or the returner.
    pub fn granted(&self, grant: &LedgerOp, answer: &crate::store::ledger::ops::OpResult) {
        let LedgerOp::LeaseGrant { lease_id, workspace_id, .. } = grant else { return };
        let mut slots = self.slots();
        let slot = slots.entry(workspace_id.clone()).or_default();
        slot.granting = false;
        match answer {
            Ok(OpOutcome::Lease(Some(cents))) => {
                slot.quiet_until = None;
                let fresh = Lease {
                    id: lease_id.clone(),
                    granted_cents: *cents,
                    left_cents: *cents,
                    use_until: Instant::now() + self.use_for(),
                };
                if let Some(old) = slot.lease.replace(fresh) {
                    slot.retired.push(old);
                }
            }
            Ok(_) => slot.quiet_until = Some(Instant::now() + self.use_for()),
            Err(e) => {
                log::warn!("lease for {workspace_id} not granted: {e}");
                slot.quiet_until = Some(Instant::now() + self.use_for());
            }
        }
    }

    /// Leases past their use, and `workspace`'s lease if named, taken out to be given back;
    /// slots with nothing left to remember are dropped.
    pub fn due(&self, workspace: Option<&str>, now: Millis) -> Vec<LedgerOp> {
        let at = Instant::now();
        let mut slots = self.slots();
        let mut ops = Vec::new();
        slots.retain(|ws, slot| {
            if slot.lease.as_ref().is_some_and(|l| at >= l.use_until || workspace == Some(ws.as_str())) {
                ops.extend(slot.lease.take().map(|l| give_back(l, now)));
            }
            ops.extend(slot.retired.drain(..).map(|l| give_back(l, now)));
            slot.granting || slot.lease.is_some() || slot.quiet_until.is_some_and(|t| at < t)
        });
        ops
    }

    /// Whether a grant is waiting for the writer's answer.
    pub fn granting(&self) -> bool {
        self.slots().values().any(|slot| slot.granting)
    }

    /// The continuation of a lease's row queued with no caller waiting (a hold taken from
    /// it, the lease given back by the returner or a plan change): counted until the writer
    /// answers it (or drops it), so a stopping instance does not exit with a give-back still
    /// in the writer's queue and the lease's money held until its row expires.
    pub fn row_queued(self: &std::sync::Arc<Self>) -> crate::store::ledger::Detached {
        self.rows_queued.fetch_add(1, Ordering::SeqCst);
        let row = QueuedRow(self.clone());
        Box::new(move |r| {
            let _answered = row;
            written(r);
        })
    }

    /// Whether a lease row queued with no caller waiting is not yet answered.
    pub fn rows_unanswered(&self) -> bool {
        self.rows_queued.load(Ordering::SeqCst) > 0
    }

    /// Every lease, taken out to be given back (the instance is stopping, with nothing in
    /// flight); no lease is asked for after. A grant still unanswered is not among them: see
    /// [`Leases::granting`].
    pub fn all(&self) -> Vec<LedgerOp> {
        let now = crate::runtime::clock::now_ms();
        let mut ops = Vec::new();
        for slot in self.slots().values_mut() {
            slot.quiet_until = Some(Instant::now() + Duration::from_secs(3_600));
            ops.extend(slot.retired.drain(..).chain(slot.lease.take()).map(|l| give_back(l, now)));
        }
        ops
    }

    /// Unused cents of this instance's leases for `workspace` (a retired one not yet given
    /// back included: its row still holds them).
    pub fn unused(&self, workspace: &str) -> i64 {
        self.slots().get(workspace).map_or(0, |s| s.retired.iter().chain(&s.lease).map(|l| l.left_cents).sum())
    }

    /// Cents held by leases of `workspace` and by no request, on every instance: this
    /// instance's unused leases (exact, from memory) and the live lease rows of the others as
    /// stored (`rows`: their holds of the last few milliseconds, not yet written, still inside
    /// them). A stale row (older than [`LEASE_LIVE`]: its instance stalled or died) is money
    /// nobody can spend until it is swept, so it stays held.
    pub fn unused_everywhere(&self, workspace: &str, rows: &[LeaseRow], now: Millis) -> i64 {
        let live_since = now.saturating_sub(Millis::try_from(LEASE_LIVE.as_millis()).unwrap_or(Millis::MAX));
        let others: i64 = rows
            .iter()
            .filter(|r| !r.id.starts_with(&self.own) && r.created_at >= live_since)
            .map(|r| r.amount_cents.max(0))
            .sum();
        self.unused(workspace) + others
    }
}

/// The rows of a workspace joined with its open lease rows (one row, its lease `None`, when it
/// has none) as its balance and its leases; `None` for no workspace.
pub fn balance_and_leases(rows: Vec<(Balance, Option<LeaseRow>)>) -> Option<(Balance, Vec<LeaseRow>)> {
    let balance = rows.first()?.0;
    Some((balance, rows.into_iter().filter_map(|(_, l)| l).collect()))
}

/// One lease row counted in [`Leases::row_queued`], uncounted when dropped: with its answer, or
/// with the job if the writer drops it unanswered.
struct QueuedRow(std::sync::Arc<Leases>);

impl Drop for QueuedRow {
    fn drop(&mut self) {
        self.0.rows_queued.fetch_sub(1, Ordering::SeqCst);
    }
}

/// The outcome of a lease's row nobody waits for: logged if it failed.
fn written(r: crate::store::ledger::ops::OpResult) {
    match r {
        Ok(_) => {}
        // Sent again after a batch whose commit went through but whose answer was lost.
        Err(crate::store::StoreError::Conflict(m)) => log::debug!("a lease's ledger row was written already: {m}"),
        Err(e) => log::warn!("a lease's ledger row was not written: {e}"),
    }
}

fn give_back(l: Lease, now: Millis) -> LedgerOp {
    LedgerOp::Release { request_id: l.id, now }
}
