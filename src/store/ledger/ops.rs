//! The ledger's writes as data: the ops a request's hold, funding, settlement and release
//! (and an instance's leases) become, and what each did. `plan.rs` decides them.

use std::sync::Arc;

use crate::money::Microcents;
use crate::money::plans::PlanSettings;
use crate::money::plans::decide::{FundAsk, Funding, Refusal};
use crate::money::plans::view::PlanSeen;
use crate::runtime::clock::Millis;
use crate::store::StoreError;

/// A lease takes at most this fraction of the balance (1/8), so what one instance reserves
/// leaves the rest for the others' requests and leases.
pub const LEASE_SHARE: i64 = 8;
/// How long a refused request's recall stops leases for its workspace (decision 191): past
/// the [`crate::store::ledger::lease::LEASE_USE`] of a lease granted just before, with a second to
/// spare for its return to be written.
pub const LEASE_RECALL_MS: Millis = 2_500;

/// One write to the ledger.
#[derive(Debug, Clone, PartialEq, Eq)]
pub enum LedgerOp {
    Hold {
        request_id: String,
        workspace_id: String,
        key_id: Option<String>,
        amount_cents: i64,
        expires_at: Millis,
        now: Millis,
    },
    /// The funding decision and its hold (plan, credits or Standby), in one write.
    Fund(Box<FundOp>),
    Settle(Settlement),
    Release {
        request_id: String,
        now: Millis,
    },
    /// Reserve a chunk of a plan-less workspace's balance for this instance to place holds
    /// from in memory (`ledger/lease.rs`), recorded as an open hold row under `lease_id`: up to
    /// `want_cents` but never more than [`LEASE_SHARE`] of the balance, and not at all when
    /// that is less than `min_cents`.
    LeaseGrant {
        lease_id: String,
        workspace_id: String,
        want_cents: i64,
        min_cents: i64,
        expires_at: Millis,
        now: Millis,
    },
    /// The row of a hold this instance already placed from its lease `lease_id`: the amount
    /// moves from the lease's row to the request's, the balance is unchanged.
    LeaseHold {
        lease_id: String,
        request_id: String,
        workspace_id: String,
        key_id: Option<String>,
        amount_cents: i64,
        expires_at: Millis,
        now: Millis,
    },
}

impl LedgerOp {
    pub fn request_id(&self) -> &str {
        match self {
            LedgerOp::Hold { request_id, .. }
            | LedgerOp::Release { request_id, .. }
            | LedgerOp::LeaseHold { request_id, .. } => request_id,
            LedgerOp::LeaseGrant { lease_id, .. } => lease_id,
            LedgerOp::Fund(f) => &f.request_id,
            LedgerOp::Settle(s) => &s.request_id,
        }
    }

    /// The workspace the op names itself (a release learns it from the hold row).
    pub fn workspace_id(&self) -> Option<&str> {
        match self {
            LedgerOp::Hold { workspace_id, .. }
            | LedgerOp::LeaseGrant { workspace_id, .. }
            | LedgerOp::LeaseHold { workspace_id, .. } => Some(workspace_id),
            LedgerOp::Fund(f) => Some(&f.workspace_id),
            LedgerOp::Settle(s) => Some(&s.workspace_id),
            LedgerOp::Release { .. } => None,
        }
    }

    /// The existing hold row the op reads besides its own: a lease hold's lease.
    pub fn lease_id(&self) -> Option<&str> {
        match self {
            LedgerOp::LeaseHold { lease_id, .. } => Some(lease_id),
            _ => None,
        }
    }

    /// The op names a request id (or lease id) this process just made, so no row of it can
    /// exist yet (a duplicate still fails, on the primary key).
    pub fn is_fresh(&self) -> bool {
        matches!(
            self,
            LedgerOp::Hold { .. } | LedgerOp::Fund(_) | LedgerOp::LeaseGrant { .. } | LedgerOp::LeaseHold { .. }
        )
    }
}

/// A hold op (the arguments of `RequestLedger::place_hold`).
pub fn hold_op(rid: &str, ws: &str, key: Option<&str>, amount_cents: i64, expires_at: Millis, now: Millis) -> LedgerOp {
    LedgerOp::Hold {
        request_id: rid.into(),
        workspace_id: ws.into(),
        key_id: key.map(Into::into),
        amount_cents,
        expires_at,
        now,
    }
}

/// What one op did.
#[derive(Debug, Clone, PartialEq, Eq)]
pub enum OpOutcome {
    Hold(HoldOutcome),
    Fund(Box<FundOutcome>),
    Settle(SettleOutcome),
    /// `false` when there was no open hold.
    Release(bool),
    /// The lease's amount, when granted.
    Lease(Option<i64>),
}

pub type OpResult = Result<OpOutcome, StoreError>;

#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum HoldOutcome {
    Placed {
        balance_cents: i64,
    },
    /// The balance cannot cover the hold; nothing was written.
    Insufficient {
        balance_cents: i64,
    },
}

/// One request's settlement.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct Settlement {
    pub request_id: String,
    pub workspace_id: String,
    pub key_id: Option<String>,
    /// The cost the client saw (the usage object), debited with the carry rule.
    pub cost: Microcents,
    /// The usage value at the model's per-token rates: what a plan or Standby request meters
    /// into its windows (its `cost` is 0).
    pub value: Microcents,
    pub now: Millis,
    /// UTC month of the settlement, `YYYY-MM` (the key spending limit's period).
    pub month: String,
}

#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum SettleOutcome {
    Settled {
        debit_cents: i64,
        balance_cents: i64,
    },
    /// This request was settled before; nothing changed.
    AlreadySettled,
}

/// Admit a request: who pays, decided under the workspace lock, and the hold that goes with it.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct FundOp {
    pub request_id: String,
    pub workspace_id: String,
    pub key_id: Option<String>,
    pub ask: FundAsk,
    pub settings: Arc<PlanSettings>,
    pub expires_at: Millis,
    pub now: Millis,
}

/// What a `Fund` op decided, with the plan as the decision saw it (for the funding headers
/// and the refusal's fields).
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct FundOutcome {
    pub verdict: Result<Funding, FundRefusal>,
    /// The workspace's plan (serving or not), if it has one.
    pub plan: Option<PlanSeen>,
}

#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum FundRefusal {
    /// A plan decision refused (or asks to wait).
    Plan(Refusal),
    /// Pay-as-you-go: the balance cannot cover the hold.
    Insufficient { balance_cents: i64 },
    /// Pay-as-you-go: the key's monthly spending limit is reached.
    KeyLimit,
}
