//! The credits ledger contract. Balances in integer cents, costs in integer microcents
//! (1 cent = 1,000,000); no floating point. Every settled change writes an entry and an open
//! hold is recorded by its row (decision 133), so the stored balance is always the sum of the
//! workspace's entries less its open holds (`derived_balance` proves it).

pub mod batch;
mod congestion;
pub mod lease;
pub mod ops;
pub mod plan;
mod writer;

use async_trait::async_trait;

use crate::money::plans::{PlanRecord, PlanTerms};
use crate::runtime::clock::Millis;
use crate::store::StoreError;
use crate::store::ledger::ops::{FundOp, FundOutcome, LedgerOp, OpOutcome, OpResult, hold_op};
pub use crate::store::ledger::ops::{HoldOutcome, SettleOutcome, Settlement};

pub use crate::money::MICROCENTS_PER_CENT;

/// A workspace's money, as stored.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct Balance {
    /// Holds already deducted; may be negative.
    pub balance_cents: i64,
    /// Reserved by in-flight requests (inside the balance).
    pub held_cents: i64,
    /// Fractional cent carried to the next settlement.
    pub carry_microcents: i64,
    pub lifetime_purchases_cents: i64,
}

impl Balance {
    /// As a client is shown it: `leased` cents of unused leases, held by the store but by no
    /// request (`LedgerReads::balance_and_unused_leases`), counted as balance.
    pub fn with_lease_unused(self, leased: i64) -> Balance {
        Balance { balance_cents: self.balance_cents + leased, held_cents: self.held_cents - leased, ..self }
    }
}

#[derive(Debug, Clone, PartialEq, Eq)]
pub struct LedgerEntry {
    pub id: i64,
    pub kind: String,
    pub source: Option<String>,
    pub amount_cents: i64,
    pub request_id: Option<String>,
    pub cost_microcents: Option<i64>,
    pub expires_at: Option<Millis>,
    pub created_at: Millis,
}

/// The money a request moves: its hold (or funding), its settlement or release.
#[async_trait]
pub trait RequestLedger: Send + Sync {
    /// Apply one money write (a hold, a settlement or a release): straight to the store, or
    /// queued for group commit (`ledger/batch.rs`). The four calls below are built on it, so
    /// every backend writes money through one path (`ledger::plan::plan`).
    async fn submit(&self, op: LedgerOp) -> OpResult;

    /// Queue `op` (a settlement or a release, which no request waits for) and return at
    /// once; `done` gets its outcome on whichever thread completes it, so it must be quick.
    /// Stores without a writer of their own run it on a task of the calling runtime.
    fn submit_detached(self: std::sync::Arc<Self>, op: LedgerOp, done: Detached)
    where
        Self: 'static,
    {
        tokio::spawn(async move { done(self.submit(op).await) });
    }

    /// `Some(wait)` while ledger writes wait longer than this instance allows, so a hold
    /// asked for now would be shed (decision 131); a cheap read, for refusing early.
    fn congested(&self) -> Option<std::time::Duration> {
        None
    }

    /// Reserve `amount_cents` for `request_id` if the balance covers it, atomically (no
    /// read-then-write race between concurrent requests of one workspace).
    async fn place_hold(
        &self,
        request_id: &str,
        workspace_id: &str,
        key_id: Option<&str>,
        amount_cents: i64,
        expires_at: Millis,
        now: Millis,
    ) -> Result<HoldOutcome, StoreError> {
        hold_outcome(self.submit(hold_op(request_id, workspace_id, key_id, amount_cents, expires_at, now)).await)
    }

    /// Decide who pays for a request and place its hold, in one write (see `FundOp`).
    async fn fund(&self, op: FundOp) -> Result<FundOutcome, StoreError> {
        match self.submit(LedgerOp::Fund(Box::new(op))).await? {
            OpOutcome::Fund(f) => Ok(*f),
            other => Err(StoreError::Unavailable(format!("unexpected ledger answer {other:?}"))),
        }
    }

    /// Release the request's hold (if still open) and debit its cost in whole cents with the
    /// fractional remainder carried. Exactly once per request id.
    async fn settle(&self, s: &Settlement) -> Result<SettleOutcome, StoreError> {
        settle_outcome(self.submit(LedgerOp::Settle(s.clone())).await)
    }

    /// Release the request's hold without charge (refusal or failure before output).
    /// `false` when there was no open hold.
    async fn release_hold(&self, request_id: &str, now: Millis) -> Result<bool, StoreError> {
        release_outcome(self.submit(LedgerOp::Release { request_id: request_id.into(), now }).await)
    }
}

/// What the ledger holds, read: balances (with this instance's unused leases), plans, entries
/// and spend.
#[async_trait]
pub trait LedgerReads: Send + Sync {
    async fn balance(&self, workspace_id: &str) -> Result<Option<Balance>, StoreError>;

    /// Cents this instance has reserved for holds in a lease and not yet used (from memory).
    fn leased_cents(&self, _workspace_id: &str) -> i64 {
        0
    }

    /// The stored balance and the cents it counts as held that no request holds: the unused
    /// part of every instance's live leases (`Leases::unused_everywhere`), read with the
    /// balance. The balance a client or operator is shown adds them back
    /// (`Balance::with_lease_unused`, [`LedgerReads::balance_shown`]), so it reads as without
    /// leases.
    async fn balance_and_unused_leases(&self, workspace_id: &str) -> Result<Option<(Balance, i64)>, StoreError> {
        Ok(self.balance(workspace_id).await?.map(|b| (b, self.leased_cents(workspace_id))))
    }

    /// The balance as a client is shown it (`GET /v1/credits`): unused leases added back.
    async fn balance_shown(&self, workspace_id: &str) -> Result<Option<Balance>, StoreError> {
        Ok(self.balance_and_unused_leases(workspace_id).await?.map(|(b, leased)| b.with_lease_unused(leased)))
    }

    /// The workspace's plan with its counters as stored (not rolled to now).
    async fn plan(&self, workspace_id: &str) -> Result<Option<PlanRecord>, StoreError>;

    async fn entries(&self, workspace_id: &str, limit: i64) -> Result<Vec<LedgerEntry>, StoreError>;

    /// SUM of the workspace's entries less the open holds that wrote no entry (decision 133):
    /// must equal the stored balance.
    async fn derived_balance(&self, workspace_id: &str) -> Result<i64, StoreError>;

    /// Settled debits (cents) since `since` (the billing period's spend).
    async fn spent_since(&self, workspace_id: &str, since: Millis) -> Result<i64, StoreError>;

    /// Settled cost (microcents) of a key in a UTC month `YYYY-MM`.
    async fn key_month_spend(&self, key_id: &str, month: &str) -> Result<i64, StoreError>;
}

/// The operator's writes (top-ups, plans, freezing) and the maintenance that runs beside the
/// requests: sweeps of expired holds and credit, leases given back at a stop. Expired holds are
/// released through the request path.
#[async_trait]
pub trait LedgerAdmin: RequestLedger {
    /// Add credit (`purchase`, `promo` or `grant`); purchases count toward lifetime
    /// purchases. Returns (entry id, new balance).
    async fn top_up(
        &self,
        workspace_id: &str,
        amount_cents: i64,
        source: &str,
        expires_at: Option<Millis>,
        now: Millis,
    ) -> Result<(i64, i64), StoreError>;

    /// Set the plan's terms (the counters of an existing plan stay), under the workspace
    /// lock. `None`: no such workspace.
    async fn set_plan(
        &self,
        workspace_id: &str,
        terms: &PlanTerms,
        now: Millis,
    ) -> Result<Option<PlanRecord>, StoreError>;

    /// Remove the plan; `false` when there was none. Running plan requests settle without it.
    async fn clear_plan(&self, workspace_id: &str) -> Result<bool, StoreError>;

    /// Freeze (`Some(reason)`) or unfreeze (`None`). `false` when there is no such workspace.
    async fn set_frozen(&self, workspace_id: &str, reason: Option<&str>) -> Result<bool, StoreError>;

    /// Request ids of open holds whose expiry has passed.
    async fn expired_holds(&self, now: Millis) -> Result<Vec<String>, StoreError>;

    /// Release holds still open past their expiry (their gateway died); returns the request
    /// ids released. Never charges.
    async fn sweep_expired_holds(&self, now: Millis) -> Result<Vec<String>, StoreError> {
        let ids = self.expired_holds(now).await?;
        let answers = futures_util::future::join_all(
            ids.iter().map(|id| self.submit(LedgerOp::Release { request_id: id.clone(), now })),
        )
        .await;
        let mut released = Vec::new();
        for (id, r) in ids.into_iter().zip(answers) {
            if release_outcome(r)? {
                released.push(id);
            }
        }
        Ok(released)
    }

    /// Remove the unspent part of top-ups whose expiry has passed (see [`expiring_credit`]),
    /// once per top-up, as one `expiry` entry per workspace. Returns (workspace, cents removed)
    /// for each workspace that lost credit.
    async fn sweep_expired_credit(&self, now: Millis) -> Result<Vec<(String, i64)>, StoreError>;

    /// Give back every lease this instance holds (it is stopping); how many were given back.
    async fn give_back_leases(&self) -> usize {
        0
    }
}

/// The whole ledger: what a backend (SQLite, PostgreSQL, the batching writer in front of
/// either) implements, in three parts so a caller can name the part it uses.
pub trait LedgerStore: RequestLedger + LedgerReads + LedgerAdmin {}

impl<T: RequestLedger + LedgerReads + LedgerAdmin + ?Sized> LedgerStore for T {}

/// The answers of the four money calls, from what `submit` returned.
pub fn hold_outcome(r: OpResult) -> Result<HoldOutcome, StoreError> {
    match r? {
        OpOutcome::Hold(h) => Ok(h),
        other => Err(StoreError::Unavailable(format!("unexpected ledger answer {other:?}"))),
    }
}

/// What runs when a detached op completes (see [`RequestLedger::submit_detached`]).
pub type Detached = Box<dyn FnOnce(OpResult) + Send>;

pub fn settle_outcome(r: OpResult) -> Result<SettleOutcome, StoreError> {
    match r? {
        OpOutcome::Settle(s) => Ok(s),
        other => Err(StoreError::Unavailable(format!("unexpected ledger answer {other:?}"))),
    }
}

pub fn release_outcome(r: OpResult) -> Result<bool, StoreError> {
    match r? {
        OpOutcome::Release(b) => Ok(b),
        other => Err(StoreError::Unavailable(format!("unexpected ledger answer {other:?}"))),
    }
}

/// A top-up not yet swept: (entry id, amount in cents, expiry).
pub type LiveTopUp = (i64, i64, Option<Millis>);

/// What expires now: (cents to remove, top-ups to mark swept).
///
/// Spending is taken from the credit that expires soonest (it would be lost first), so what
/// remains of the balance belongs to the credit that expires last: the balance is assigned to
/// the live top-ups from the never-expiring grant and the latest expiry down, and the part
/// assigned to a top-up whose expiry has passed is what expires. Holds are already deducted
/// from the balance, so credit reserved by running requests never expires under them; a
/// negative balance has nothing left to expire.
pub fn expiring_credit(balance_cents: i64, live: &[LiveTopUp], now: Millis) -> (i64, Vec<i64>) {
    let mut order: Vec<&LiveTopUp> = live.iter().collect();
    // Never-expiring first, then the latest expiry; among equals the newest first.
    order.sort_by_key(|&&(id, _, exp)| (std::cmp::Reverse(exp.unwrap_or(Millis::MAX)), std::cmp::Reverse(id)));
    let mut left = balance_cents.max(0);
    let (mut expired, mut swept) = (0, Vec::new());
    for &&(id, amount, exp) in &order {
        let share = amount.max(0).min(left);
        left -= share;
        if exp.is_some_and(|e| e <= now) {
            expired += share;
            swept.push(id);
        }
    }
    (expired, swept)
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn spending_uses_the_soonest_expiring_credit_first() {
        let year = 365 * 86_400_000;
        // $1 grant (never expires), $10 bought at 0 (expires at `year`), $5 bought later.
        let live = [(1, 100, None), (2, 1_000, Some(year)), (3, 500, Some(year + 1_000))];
        // $3 spent: balance 1,300. At `year` the first purchase has 700 left of its 1,000.
        assert_eq!(expiring_credit(1_300, &live, year), (700, vec![2]));
        // Before its expiry nothing goes.
        assert_eq!(expiring_credit(1_300, &live, year - 1), (0, vec![]));
        // Spent down to 400: the grant and the later purchase hold it; nothing of #2 is left.
        assert_eq!(expiring_credit(400, &live, year), (0, vec![2]));
        // Both purchases expired: only the grant's dollar stays.
        assert_eq!(expiring_credit(1_300, &live, year + 1_000), (1_200, vec![3, 2]));
        // A negative balance has nothing to expire.
        assert_eq!(expiring_credit(-50, &live, year), (0, vec![2]));
    }
}
