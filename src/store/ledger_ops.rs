//! The ledger's writes as data, and the one function that decides them. A batch of holds,
//! settlements and releases is applied in a single transaction (group commit,
//! `ledger_batch.rs`): each backend locks the workspace rows the batch touches, reads a
//! [`Snapshot`] (balances, the batch's hold rows, which requests are already settled), calls
//! [`plan`] and writes the [`Plan`]. So the money rules exist once, in Rust, for both
//! backends: holds in order against the running balance (a hold the balance cannot cover is
//! refused and writes nothing, exactly as if it ran alone), settlement once per request id
//! with the whole-cent debit and carried remainder of `money::debit_with_carry`, and one
//! entry for every change of a balance, so the balance stays the sum of the entries.

use std::collections::{HashMap, HashSet};

use super::StoreError;
use super::ledger::{HoldOutcome, SettleOutcome, Settlement};
use crate::clock::Millis;
use crate::money::{Microcents, debit_with_carry};

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
    Settle(Settlement),
    Release {
        request_id: String,
        now: Millis,
    },
}

impl LedgerOp {
    pub fn request_id(&self) -> &str {
        match self {
            LedgerOp::Hold { request_id, .. } | LedgerOp::Release { request_id, .. } => request_id,
            LedgerOp::Settle(s) => &s.request_id,
        }
    }

    /// The workspace the op names itself (a release learns it from the hold row).
    pub fn workspace_id(&self) -> Option<&str> {
        match self {
            LedgerOp::Hold { workspace_id, .. } => Some(workspace_id),
            LedgerOp::Settle(s) => Some(&s.workspace_id),
            LedgerOp::Release { .. } => None,
        }
    }
}

/// A hold op (the arguments of `LedgerStore::place_hold`).
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
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum OpOutcome {
    Hold(HoldOutcome),
    Settle(SettleOutcome),
    /// `false` when there was no open hold.
    Release(bool),
}

pub type OpResult = Result<OpOutcome, StoreError>;

/// A workspace's money columns, as locked for the batch.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Default)]
pub struct Money {
    pub balance_cents: i64,
    pub held_cents: i64,
    pub carry_microcents: i64,
}

/// A row of `holds`.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct HoldRow {
    pub workspace_id: String,
    pub key_id: Option<String>,
    pub amount_cents: i64,
    /// `open`, `settled` or `released`.
    pub state: String,
}

/// What the batch reads under the workspace locks.
#[derive(Debug, Clone, Default)]
pub struct Snapshot {
    pub workspaces: HashMap<String, Money>,
    /// The hold rows of the batch's request ids (any state).
    pub holds: HashMap<String, HoldRow>,
    /// Request ids of the batch that already have a settlement entry.
    pub settled: HashSet<String>,
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
    pub entries: Vec<NewEntry>,
    /// Final money of each workspace the batch changed.
    pub workspaces: Vec<(String, Money)>,
    /// Settled cost to add per (key, month), summed over the batch.
    pub key_spend: Vec<(String, String, i64)>,
}

/// Apply `ops` in order to `snap`; nothing is written for an op that is refused or fails.
pub fn plan(ops: &[LedgerOp], snap: Snapshot) -> Plan {
    let mut p = Planner {
        snap,
        plan: Plan::default(),
        new_holds: HashSet::new(),
        changed_holds: Vec::new(),
        changed_ws: Vec::new(),
    };
    for op in ops {
        let result = match op {
            LedgerOp::Hold { request_id, workspace_id, key_id, amount_cents, expires_at, now } => {
                p.hold(request_id, workspace_id, key_id.as_deref(), *amount_cents, *expires_at, *now)
            }
            LedgerOp::Settle(s) => p.settle(s),
            LedgerOp::Release { request_id, now } => Ok(OpOutcome::Release(p.release(request_id, "released", *now))),
        };
        p.plan.outcomes.push(result);
    }
    p.finish()
}

struct Planner {
    snap: Snapshot,
    plan: Plan,
    new_holds: HashSet<String>,
    changed_holds: Vec<String>,
    changed_ws: Vec<String>,
}

fn touch(list: &mut Vec<String>, id: &str) {
    if !list.iter().any(|x| x == id) {
        list.push(id.to_string());
    }
}

impl Planner {
    fn hold(
        &mut self,
        rid: &str,
        ws: &str,
        key: Option<&str>,
        amount: i64,
        expires_at: Millis,
        now: Millis,
    ) -> OpResult {
        if self.snap.holds.contains_key(rid) {
            return Err(StoreError::Conflict(format!("a hold for request {rid} exists already")));
        }
        let Some(m) = self.snap.workspaces.get_mut(ws) else {
            return Ok(OpOutcome::Hold(HoldOutcome::Insufficient { balance_cents: 0 }));
        };
        if m.balance_cents < amount {
            return Ok(OpOutcome::Hold(HoldOutcome::Insufficient { balance_cents: m.balance_cents }));
        }
        m.balance_cents -= amount;
        m.held_cents += amount;
        let balance_cents = m.balance_cents;
        let row = HoldRow {
            workspace_id: ws.into(),
            key_id: key.map(Into::into),
            amount_cents: amount,
            state: "open".into(),
        };
        self.snap.holds.insert(rid.into(), row.clone());
        self.plan.new_holds.push(NewHold { request_id: rid.into(), row, expires_at, created_at: now });
        self.new_holds.insert(rid.into());
        touch(&mut self.changed_ws, ws);
        self.plan.entries.push(NewEntry {
            workspace_id: ws.into(),
            kind: "hold",
            amount_cents: -amount,
            request_id: rid.into(),
            key_id: key.map(Into::into),
            cost_microcents: None,
            created_at: now,
        });
        Ok(OpOutcome::Hold(HoldOutcome::Placed { balance_cents }))
    }

    /// Release the hold (if open) and debit the cost with the carry, once per request id.
    fn settle(&mut self, s: &Settlement) -> OpResult {
        if self.snap.settled.contains(&s.request_id) {
            return Ok(OpOutcome::Settle(SettleOutcome::AlreadySettled));
        }
        if !self.snap.workspaces.contains_key(&s.workspace_id) {
            return Err(StoreError::Conflict("settlement for a workspace that does not exist".into()));
        }
        self.release(&s.request_id, "settled", s.now);
        let Some(m) = self.snap.workspaces.get_mut(&s.workspace_id) else {
            return Err(StoreError::Conflict("settlement for a workspace that does not exist".into()));
        };
        let (debit, carry) = debit_with_carry(Microcents::from_stored(m.carry_microcents), s.cost);
        m.balance_cents -= debit.0;
        m.carry_microcents = carry.as_i64();
        let balance_cents = m.balance_cents;
        let cost = s.cost.as_i64();
        self.plan.entries.push(NewEntry {
            workspace_id: s.workspace_id.clone(),
            kind: "settlement",
            amount_cents: -debit.0,
            request_id: s.request_id.clone(),
            key_id: s.key_id.clone(),
            cost_microcents: Some(cost),
            created_at: s.now,
        });
        if let Some(key) = &s.key_id {
            match self.plan.key_spend.iter_mut().find(|(k, month, _)| k == key && *month == s.month) {
                Some(row) => row.2 += cost,
                None => self.plan.key_spend.push((key.clone(), s.month.clone(), cost)),
            }
        }
        self.snap.settled.insert(s.request_id.clone());
        touch(&mut self.changed_ws, &s.workspace_id);
        Ok(OpOutcome::Settle(SettleOutcome::Settled { debit_cents: debit.0, balance_cents }))
    }

    /// Release `rid`'s open hold into `state`, crediting it back; `false` if none was open.
    fn release(&mut self, rid: &str, state: &str, now: Millis) -> bool {
        let Some(hold) = self.snap.holds.get_mut(rid).filter(|h| h.state == "open") else { return false };
        let Some(m) = self.snap.workspaces.get_mut(&hold.workspace_id) else { return false };
        m.balance_cents += hold.amount_cents;
        m.held_cents -= hold.amount_cents;
        hold.state = state.into();
        self.plan.entries.push(NewEntry {
            workspace_id: hold.workspace_id.clone(),
            kind: "hold_release",
            amount_cents: hold.amount_cents,
            request_id: rid.into(),
            key_id: hold.key_id.clone(),
            cost_microcents: None,
            created_at: now,
        });
        let ws = hold.workspace_id.clone();
        touch(&mut self.changed_ws, &ws);
        self.changed_holds.push(rid.into());
        true
    }

    fn finish(mut self) -> Plan {
        // New hold rows are written once, in their final state; existing ones get their new
        // state.
        for h in &mut self.plan.new_holds {
            if let Some(row) = self.snap.holds.get(&h.request_id) {
                h.row.state.clone_from(&row.state);
            }
        }
        for rid in self.changed_holds.iter().filter(|r| !self.new_holds.contains(*r)) {
            if let Some(row) = self.snap.holds.get(rid) {
                self.plan.hold_states.push((rid.clone(), if row.state == "settled" { "settled" } else { "released" }));
            }
        }
        let ws = &self.snap.workspaces;
        self.plan.workspaces = self.changed_ws.iter().filter_map(|w| ws.get(w).map(|m| (w.clone(), *m))).collect();
        self.plan
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    fn hold(rid: &str, amount: i64) -> LedgerOp {
        LedgerOp::Hold {
            request_id: rid.into(),
            workspace_id: "w".into(),
            key_id: Some("k".into()),
            amount_cents: amount,
            expires_at: 10,
            now: 1,
        }
    }

    fn settle(rid: &str, cost: u64) -> LedgerOp {
        LedgerOp::Settle(Settlement {
            request_id: rid.into(),
            workspace_id: "w".into(),
            key_id: Some("k".into()),
            cost: Microcents(cost),
            now: 2,
            month: "2026-11".into(),
        })
    }

    fn snap(balance: i64) -> Snapshot {
        let mut s = Snapshot::default();
        s.workspaces.insert("w".into(), Money { balance_cents: balance, ..Money::default() });
        s
    }

    fn sum(p: &Plan) -> i64 {
        p.entries.iter().map(|e| e.amount_cents).sum()
    }

    #[test]
    fn holds_apply_in_order_against_the_running_balance() {
        let ops = [hold("a", 6), hold("b", 5), hold("c", 4), hold("d", 1)];
        let p = plan(&ops, snap(10));
        let placed: Vec<bool> =
            p.outcomes.iter().map(|o| matches!(o, Ok(OpOutcome::Hold(HoldOutcome::Placed { .. })))).collect();
        assert_eq!(placed, [true, false, true, false], "b does not fit after a; c does; nothing is left for d");
        assert_eq!(p.outcomes[1], Ok(OpOutcome::Hold(HoldOutcome::Insufficient { balance_cents: 4 })));
        assert_eq!(
            p.workspaces,
            vec![("w".to_string(), Money { balance_cents: 0, held_cents: 10, carry_microcents: 0 })]
        );
        assert_eq!(sum(&p), -10, "one entry per change");
        assert_eq!(p.new_holds.len(), 2);
    }

    #[test]
    fn settlement_is_once_with_the_carry_and_a_hold_settled_in_its_batch_is_written_once() {
        let ops = [hold("a", 3), settle("a", 2_500_000), settle("a", 2_500_000), settle("b", 600_000)];
        let p = plan(&ops, snap(100));
        assert_eq!(p.outcomes[1], Ok(OpOutcome::Settle(SettleOutcome::Settled { debit_cents: 2, balance_cents: 98 })));
        assert_eq!(p.outcomes[2], Ok(OpOutcome::Settle(SettleOutcome::AlreadySettled)));
        // Half a cent carried plus 0.6: one more cent, 0.1 carried.
        assert_eq!(p.outcomes[3], Ok(OpOutcome::Settle(SettleOutcome::Settled { debit_cents: 1, balance_cents: 97 })));
        assert_eq!(p.workspaces[0].1, Money { balance_cents: 97, held_cents: 0, carry_microcents: 100_000 });
        assert_eq!(sum(&p), -3);
        assert_eq!(p.new_holds.len(), 1);
        assert_eq!(p.new_holds[0].row.state, "settled");
        assert!(p.hold_states.is_empty());
        assert_eq!(p.key_spend, vec![("k".to_string(), "2026-11".to_string(), 3_100_000)]);
    }

    #[test]
    fn existing_holds_are_released_once_and_settled_requests_stay_settled() {
        let mut s = snap(50);
        s.workspaces.insert("w".into(), Money { balance_cents: 50, held_cents: 20, carry_microcents: 0 });
        let open =
            |amount| HoldRow { workspace_id: "w".into(), key_id: None, amount_cents: amount, state: "open".into() };
        s.holds.insert("x".into(), open(20));
        s.holds.insert("done".into(), HoldRow { state: "settled".into(), ..open(5) });
        s.settled.insert("done".into());
        let release = |rid: &str| LedgerOp::Release { request_id: rid.into(), now: 3 };
        let ops = [release("x"), release("x"), settle("done", 9_000_000), hold("done", 1), release("nope")];
        let p = plan(&ops, s);
        assert_eq!(p.outcomes[0], Ok(OpOutcome::Release(true)));
        assert_eq!(p.outcomes[1], Ok(OpOutcome::Release(false)));
        assert_eq!(p.outcomes[2], Ok(OpOutcome::Settle(SettleOutcome::AlreadySettled)));
        assert!(matches!(p.outcomes[3], Err(StoreError::Conflict(_))), "a request id holds once");
        assert_eq!(p.outcomes[4], Ok(OpOutcome::Release(false)));
        assert_eq!(p.hold_states, vec![("x".to_string(), "released")]);
        assert_eq!(p.workspaces[0].1, Money { balance_cents: 70, held_cents: 0, carry_microcents: 0 });
        assert_eq!(sum(&p), 20);
    }

    #[test]
    fn an_unknown_workspace_is_refused_without_writing() {
        let p = plan(&[hold("a", 1), settle("a", 1)], Snapshot::default());
        assert_eq!(p.outcomes[0], Ok(OpOutcome::Hold(HoldOutcome::Insufficient { balance_cents: 0 })));
        assert!(matches!(p.outcomes[1], Err(StoreError::Conflict(_))));
        assert!(p.entries.is_empty() && p.workspaces.is_empty() && p.new_holds.is_empty());
    }
}
