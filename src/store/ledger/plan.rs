//! The ledger's writes as data, and the one function that decides them. A batch of holds,
//! settlements and releases is applied in a single transaction (group commit,
//! `ledger/batch.rs`): each backend locks the workspace rows the batch touches, reads a
//! [`Snapshot`] (balances, the batch's hold rows, which requests are already settled), calls
//! [`plan`] and writes the [`Plan`]. So the money rules exist once, in Rust, for both
//! backends: holds in order against the running balance (a hold the balance cannot cover is
//! refused and writes nothing, exactly as if it ran alone), settlement once per request id
//! with the whole-cent debit and carried remainder of `money::debit_with_carry`, and one
//! entry for every settled change of a balance. A hold is deducted from the balance and
//! recorded by its row alone (decision 133), so the balance stays the sum of the entries less
//! the open holds' amounts.

use crate::money::plans::decide::{Funding, finish};
use crate::money::plans::{Counters, PlanRecord};
use crate::money::{Microcents, debit_with_carry};
use crate::runtime::clock::Millis;
use crate::runtime::fast_map::{FastMap, FastSet};
use crate::store::StoreError;
use crate::store::ledger::ops::{
    HoldOutcome, LEASE_RECALL_MS, LEASE_SHARE, LedgerOp, OpOutcome, OpResult, SettleOutcome, Settlement,
};

/// A workspace's money columns, as locked for the batch.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Default)]
pub struct Money {
    pub balance_cents: i64,
    pub held_cents: i64,
    pub carry_microcents: i64,
    /// No lease is granted before this (Unix ms): a refused request recalled them
    /// (decision 191).
    pub leases_recalled_until: Millis,
}

/// A row of `holds`.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct HoldRow {
    pub workspace_id: String,
    pub key_id: Option<String>,
    pub amount_cents: i64,
    /// `open`, `settled` or `released`.
    pub state: String,
    /// Who pays: the hold's `funding` column.
    pub funding: Funding,
    /// What the request added to its funding's pending commitments (microcents).
    pub value_microcents: i64,
    pub created_at: Millis,
    /// Placed before migration 5, with a `hold` entry: its release writes a `hold_release`.
    pub entry_written: bool,
}

/// What the batch reads under the workspace locks.
#[derive(Debug, Clone, Default)]
pub struct Snapshot {
    pub workspaces: FastMap<String, Money>,
    /// The hold rows of the batch's request ids (any state).
    pub holds: FastMap<String, HoldRow>,
    /// Request ids of the batch that already have a settlement entry.
    pub settled: FastSet<String>,
    /// The plans of the locked workspaces.
    pub plans: FastMap<String, PlanRecord>,
}

/// A hold row to insert (in its final state: a hold placed and settled in one batch is
/// written once).
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct NewHold {
    pub request_id: String,
    pub row: HoldRow,
    pub expires_at: Millis,
    pub created_at: Millis,
}

/// A ledger entry to insert.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct NewEntry {
    pub workspace_id: String,
    /// `hold`, `hold_release` or `settlement`.
    pub kind: &'static str,
    pub amount_cents: i64,
    pub request_id: String,
    pub key_id: Option<String>,
    pub cost_microcents: Option<i64>,
    pub created_at: Millis,
}

/// Everything a batch writes, in op order.
#[derive(Debug, Clone, Default)]
pub struct Plan {
    pub outcomes: Vec<OpResult>,
    pub new_holds: Vec<NewHold>,
    /// Existing holds whose state changed: (request id, new state).
    pub hold_states: Vec<(String, &'static str)>,
    /// Existing holds whose amount changed (leases that holds were placed from): (id, amount).
    pub hold_amounts: Vec<(String, i64)>,
    pub entries: Vec<NewEntry>,
    /// Final money of each workspace the batch changed.
    pub workspaces: Vec<(String, Money)>,
    /// Settled cost to add per (key, month), summed over the batch.
    pub key_spend: Vec<(String, String, i64)>,
    /// Final counters of each plan the batch changed.
    pub plans: Vec<(String, Counters)>,
}

/// Apply `ops` in order to `snap`; nothing is written for an op that is refused or fails.
pub fn plan(ops: &[LedgerOp], snap: Snapshot) -> Plan {
    let mut p = Planner {
        snap,
        plan: Plan::default(),
        new_holds: FastSet::default(),
        changed_holds: Vec::new(),
        changed_ws: Vec::new(),
        changed_plans: Vec::new(),
        resized: Vec::new(),
    };
    for op in ops {
        let result = match op {
            LedgerOp::Hold { request_id, workspace_id, key_id, amount_cents, expires_at, now } => {
                let h =
                    NewHoldArgs { rid: request_id, ws: workspace_id, key: key_id.as_deref(), amount: *amount_cents };
                p.hold(&h, Funding::PayAsYouGo, 0, *expires_at, *now).map(OpOutcome::Hold)
            }
            LedgerOp::Fund(f) => p.fund(f),
            LedgerOp::Settle(s) => p.settle(s),
            LedgerOp::Release { request_id, now } => {
                Ok(OpOutcome::Release(p.release(request_id, "released", *now, None)))
            }
            LedgerOp::LeaseGrant { lease_id, workspace_id, want_cents, min_cents, expires_at, now } => {
                let h = NewHoldArgs { rid: lease_id, ws: workspace_id, key: None, amount: *want_cents };
                p.grant_lease(&h, *min_cents, *expires_at, *now)
            }
            LedgerOp::LeaseHold { lease_id, request_id, workspace_id, key_id, amount_cents, expires_at, now } => {
                let h =
                    NewHoldArgs { rid: request_id, ws: workspace_id, key: key_id.as_deref(), amount: *amount_cents };
                p.hold_from_lease(lease_id, &h, *expires_at, *now)
            }
        };
        p.plan.outcomes.push(result);
    }
    p.finish()
}

struct Planner {
    snap: Snapshot,
    plan: Plan,
    new_holds: FastSet<String>,
    changed_holds: Vec<String>,
    changed_ws: Vec<String>,
    changed_plans: Vec<String>,
    /// Existing hold rows whose amount changed.
    resized: Vec<String>,
}

#[derive(Clone, Copy)]
struct NewHoldArgs<'a> {
    rid: &'a str,
    ws: &'a str,
    key: Option<&'a str>,
    amount: i64,
}

fn touch(list: &mut Vec<String>, id: &str) {
    if !list.iter().any(|x| x == id) {
        list.push(id.to_string());
    }
}

impl Planner {
    /// A credit hold of `h.amount` cents (refused, writing nothing, when the balance cannot
    /// cover it), or with `amount` 0 a plan or Standby hold that reserves no money.
    fn hold(
        &mut self,
        h: &NewHoldArgs<'_>,
        funding: Funding,
        value: i64,
        expires_at: Millis,
        now: Millis,
    ) -> Result<HoldOutcome, StoreError> {
        if self.snap.holds.contains_key(h.rid) {
            return Err(StoreError::Conflict(format!("a hold for request {} exists already", h.rid)));
        }
        let Some(m) = self.snap.workspaces.get(h.ws) else {
            return Ok(HoldOutcome::Insufficient { balance_cents: 0 });
        };
        if m.balance_cents < h.amount {
            let balance_cents = m.balance_cents;
            self.recall_leases(h.ws, h.amount, now);
            return Ok(HoldOutcome::Insufficient { balance_cents });
        }
        Ok(self.place(h, funding, value, expires_at, now))
    }

    /// A hold the balance cannot cover but the open holds could: leases (other instances',
    /// or one granted just before in this batch) may be what keeps the money, so none is
    /// granted for [`LEASE_RECALL_MS`]; the instances holding one give it back within a
    /// second and the refused request, retried, finds the money (decision 191). Written at
    /// most once per half recall, so a workspace refused again and again is not a write each.
    fn recall_leases(&mut self, ws: &str, amount: i64, now: Millis) {
        let Some(m) = self.snap.workspaces.get_mut(ws) else { return };
        let could_cover = m.balance_cents.saturating_add(m.held_cents) >= amount;
        if !could_cover || m.leases_recalled_until > now.saturating_add(LEASE_RECALL_MS / 2) {
            return;
        }
        m.leases_recalled_until = now.saturating_add(LEASE_RECALL_MS);
        touch(&mut self.changed_ws, ws);
    }

    /// Write the hold whatever the balance (the caller checked it, or the request is already
    /// admitted). The workspace must be in the snapshot.
    fn place(
        &mut self,
        h: &NewHoldArgs<'_>,
        funding: Funding,
        value: i64,
        expires_at: Millis,
        now: Millis,
    ) -> HoldOutcome {
        let Some(m) = self.snap.workspaces.get_mut(h.ws) else {
            return HoldOutcome::Insufficient { balance_cents: 0 };
        };
        m.balance_cents -= h.amount;
        m.held_cents += h.amount;
        let balance_cents = m.balance_cents;
        let row = HoldRow {
            workspace_id: h.ws.into(),
            key_id: h.key.map(Into::into),
            amount_cents: h.amount,
            state: "open".into(),
            funding,
            value_microcents: value,
            created_at: now,
            entry_written: false,
        };
        self.snap.holds.insert(h.rid.into(), row.clone());
        self.plan.new_holds.push(NewHold { request_id: h.rid.into(), row, expires_at, created_at: now });
        self.new_holds.insert(h.rid.into());
        // The hold row records the reserved money; no entry (decision 133).
        if h.amount != 0 {
            touch(&mut self.changed_ws, h.ws);
        }
        HoldOutcome::Placed { balance_cents }
    }

    /// A lease: a hold row of the chunk (`h.amount` at most, a [`LEASE_SHARE`] of the balance
    /// at most, `min` at least), for a workspace without a plan (a plan's decision needs the
    /// ledger for every request).
    fn grant_lease(&mut self, h: &NewHoldArgs<'_>, min: i64, expires_at: Millis, now: Millis) -> OpResult {
        if self.snap.holds.contains_key(h.rid) {
            return Err(StoreError::Conflict(format!("a lease {} exists already", h.rid)));
        }
        let Some(m) = self.snap.workspaces.get(h.ws) else { return Ok(OpOutcome::Lease(None)) };
        let amount = h.amount.min(m.balance_cents / LEASE_SHARE);
        let recalled = now < m.leases_recalled_until;
        if amount < min || amount < 0 || recalled || self.snap.plans.contains_key(h.ws) {
            return Ok(OpOutcome::Lease(None));
        }
        self.place(&NewHoldArgs { amount, ..*h }, Funding::PayAsYouGo, 0, expires_at, now);
        Ok(OpOutcome::Lease(Some(amount)))
    }

    /// The row of a hold placed in memory from a lease: its amount leaves the lease's row
    /// (credited back) and is held by the request's row, so the balance does not move. When
    /// the lease is gone or short (it expired and was swept), the hold is written anyway: the
    /// request is already running, and its settlement will debit whatever the balance.
    fn hold_from_lease(&mut self, lease: &str, h: &NewHoldArgs<'_>, expires_at: Millis, now: Millis) -> OpResult {
        if self.snap.holds.contains_key(h.rid) {
            return Err(StoreError::Conflict(format!("a hold for request {} exists already", h.rid)));
        }
        if !self.snap.workspaces.contains_key(h.ws) {
            return Err(StoreError::Conflict("a lease hold for a workspace that does not exist".into()));
        }
        let from_lease = self
            .snap
            .holds
            .get_mut(lease)
            .filter(|l| l.state == "open" && l.workspace_id == h.ws && l.amount_cents >= h.amount);
        if let Some(l) = from_lease {
            l.amount_cents -= h.amount;
            if let Some(m) = self.snap.workspaces.get_mut(h.ws) {
                m.balance_cents += h.amount;
                m.held_cents -= h.amount;
            }
            touch(&mut self.resized, lease);
        }
        Ok(OpOutcome::Hold(self.place(h, Funding::PayAsYouGo, 0, expires_at, now)))
    }

    /// Release the hold (if open) and debit the cost with the carry, once per request id. A
    /// plan or Standby request moves its plan's counters instead: the balance is untouched.
    fn settle(&mut self, s: &Settlement) -> OpResult {
        if self.snap.settled.contains(&s.request_id) {
            return Ok(OpOutcome::Settle(SettleOutcome::AlreadySettled));
        }
        if !self.snap.workspaces.contains_key(&s.workspace_id) {
            return Err(StoreError::Conflict("settlement for a workspace that does not exist".into()));
        }
        let funding = self.snap.holds.get(&s.request_id).map_or(Funding::PayAsYouGo, |h| h.funding);
        let plan_paid = matches!(funding, Funding::Plan | Funding::Standby);
        let used = if plan_paid { s.value } else { s.cost };
        self.release(&s.request_id, "settled", s.now, Some(used.as_i64()));
        let Some(m) = self.snap.workspaces.get_mut(&s.workspace_id) else {
            return Err(StoreError::Conflict("settlement for a workspace that does not exist".into()));
        };
        let cost = if plan_paid { Microcents::ZERO } else { s.cost };
        let (debit, carry) = debit_with_carry(Microcents::from_stored(m.carry_microcents), cost);
        m.balance_cents -= debit.0;
        m.carry_microcents = carry.as_i64();
        let balance_cents = m.balance_cents;
        let cost = cost.as_i64();
        self.plan.entries.push(NewEntry {
            workspace_id: s.workspace_id.clone(),
            kind: "settlement",
            amount_cents: -debit.0,
            request_id: s.request_id.clone(),
            key_id: s.key_id.clone(),
            cost_microcents: Some(cost),
            created_at: s.now,
        });
        if let Some(key) = s.key_id.as_ref().filter(|_| cost > 0) {
            match self.plan.key_spend.iter_mut().find(|(k, month, _)| k == key && *month == s.month) {
                Some(row) => row.2 += cost,
                None => self.plan.key_spend.push((key.clone(), s.month.clone(), cost)),
            }
        }
        self.snap.settled.insert(s.request_id.clone());
        if !plan_paid {
            // A plan- or Standby-paid settlement leaves the money as it was: no row to rewrite.
            touch(&mut self.changed_ws, &s.workspace_id);
        }
        Ok(OpOutcome::Settle(SettleOutcome::Settled { debit_cents: debit.0, balance_cents }))
    }

    /// Release `rid`'s open hold into `state`, crediting it back and taking it out of its
    /// plan's counters (metering `used` when it settles); `false` if none was open.
    fn release(&mut self, rid: &str, state: &str, now: Millis, used: Option<i64>) -> bool {
        let Some(hold) = self.snap.holds.get_mut(rid).filter(|h| h.state == "open") else { return false };
        let Some(m) = self.snap.workspaces.get_mut(&hold.workspace_id) else { return false };
        m.balance_cents += hold.amount_cents;
        m.held_cents -= hold.amount_cents;
        hold.state = state.into();
        let hold_cents = hold.amount_cents;
        if hold_cents != 0 && hold.entry_written {
            self.plan.entries.push(NewEntry {
                workspace_id: hold.workspace_id.clone(),
                kind: "hold_release",
                amount_cents: hold.amount_cents,
                request_id: rid.into(),
                key_id: hold.key_id.clone(),
                cost_microcents: None,
                created_at: now,
            });
        }
        let ws = hold.workspace_id.clone();
        if hold.funding != Funding::PayAsYouGo {
            if let Some(rec) = self.snap.plans.get_mut(&ws) {
                rec.counters.roll(rec.terms.started_at, now);
                finish(&mut rec.counters, hold.funding, hold.value_microcents, hold.created_at, used);
                touch(&mut self.changed_plans, &ws);
            }
        }
        if hold_cents != 0 {
            touch(&mut self.changed_ws, &ws);
        }
        self.changed_holds.push(rid.into());
        true
    }

    fn finish(mut self) -> Plan {
        // New hold rows are written once, in their final state; existing ones get their new
        // state.
        for h in &mut self.plan.new_holds {
            if let Some(row) = self.snap.holds.get(&h.request_id) {
                h.row.state.clone_from(&row.state);
                h.row.amount_cents = row.amount_cents;
            }
        }
        for id in self.resized.iter().filter(|r| !self.new_holds.contains(*r)) {
            if let Some(row) = self.snap.holds.get(id) {
                self.plan.hold_amounts.push((id.clone(), row.amount_cents));
            }
        }
        for rid in self.changed_holds.iter().filter(|r| !self.new_holds.contains(*r)) {
            if let Some(row) = self.snap.holds.get(rid) {
                self.plan.hold_states.push((rid.clone(), if row.state == "settled" { "settled" } else { "released" }));
            }
        }
        let ws = &self.snap.workspaces;
        self.plan.workspaces = self.changed_ws.iter().filter_map(|w| ws.get(w).map(|m| (w.clone(), *m))).collect();
        let plans = &self.snap.plans;
        self.plan.plans =
            self.changed_plans.iter().filter_map(|w| plans.get(w).map(|r| (w.clone(), r.counters))).collect();
        self.plan
    }
}

#[path = "plan_fund.rs"]
mod fund;

#[cfg(test)]
#[path = "plan_tests.rs"]
mod tests;
