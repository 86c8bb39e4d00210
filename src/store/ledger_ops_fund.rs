//! The `Fund` op: who pays for a request, decided under the workspace lock with the plan as
//! the batch read it (`plans::decide` on a serving plan, else pay-as-you-go), and the hold
//! that goes with the decision, in the same write.

use std::sync::Arc;

use super::{NewHoldArgs, OpOutcome, OpResult, Planner, touch};
use crate::money::MICROCENTS_PER_CENT;
use crate::money::plans::PlanSettings;
use crate::money::plans::decide::{FundAsk, Funding, Refusal, decide};
use crate::money::plans::view::PlanSeen;
use crate::runtime::clock::Millis;
use crate::store::StoreError;
use crate::store::ledger::HoldOutcome;

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

impl Planner {
    /// Decide who pays (`plans::decide` on a serving plan, else pay-as-you-go) and place the
    /// hold that goes with it.
    pub(super) fn fund(&mut self, f: &FundOp) -> OpResult {
        if self.snap.holds.contains_key(&f.request_id) {
            return Err(StoreError::Conflict(format!("a hold for request {} exists already", f.request_id)));
        }
        let balance = self.snap.workspaces.get(&f.workspace_id).map_or(0, |m| m.balance_cents);
        let h =
            NewHoldArgs { rid: &f.request_id, ws: &f.workspace_id, key: f.key_id.as_deref(), amount: f.ask.hold_cents };
        let ask = &f.ask;
        let mut seen = None;
        if let Some(rec) = self.snap.plans.get_mut(&f.workspace_id) {
            rec.counters.roll(rec.terms.started_at, f.now);
            let limits = f.settings.limits(rec.terms.tier);
            let applies = !ask.credits_only && ask.covered && ask.value_microcents > 0 && rec.terms.serving(f.now);
            if applies {
                let before = rec.counters;
                let verdict = decide(rec, &limits, balance, ask, f.now);
                let seen = Some(PlanSeen { record: rec.clone(), limits, balance_cents: balance });
                let admitted_at = rec.counters.admitted_at(f.now);
                let verdict = match verdict {
                    Ok(funding @ (Funding::Plan | Funding::Standby)) => {
                        let plan_hold = NewHoldArgs { amount: 0, ..h };
                        self.hold(&plan_hold, funding, ask.value_microcents, f.expires_at, admitted_at)?;
                        Ok(funding)
                    }
                    Ok(Funding::Credits) => {
                        let pending = ask.hold_cents * MICROCENTS_PER_CENT;
                        match self.hold(&h, Funding::Credits, pending, f.expires_at, admitted_at.max(f.now))? {
                            HoldOutcome::Placed { .. } => Ok(Funding::Credits),
                            HoldOutcome::Insufficient { balance_cents } => {
                                Err(FundRefusal::Insufficient { balance_cents })
                            }
                        }
                    }
                    Ok(Funding::PayAsYouGo) => Ok(Funding::PayAsYouGo),
                    Err(r) => Err(FundRefusal::Plan(r)),
                };
                if verdict.is_ok() {
                    touch(&mut self.changed_plans, &f.workspace_id);
                } else if let Some(rec) = self.snap.plans.get_mut(&f.workspace_id) {
                    // A refusal writes nothing: undo what the decision counted.
                    rec.counters = before;
                }
                return Ok(OpOutcome::Fund(Box::new(FundOutcome { verdict, plan: seen })));
            }
            seen = Some(PlanSeen { record: rec.clone(), limits, balance_cents: balance });
        }
        let verdict = if ask.key_limit_reached {
            Err(FundRefusal::KeyLimit)
        } else {
            match self.hold(&h, Funding::PayAsYouGo, 0, f.expires_at, f.now)? {
                HoldOutcome::Placed { .. } => Ok(Funding::PayAsYouGo),
                HoldOutcome::Insufficient { balance_cents } => Err(FundRefusal::Insufficient { balance_cents }),
            }
        };
        Ok(OpOutcome::Fund(Box::new(FundOutcome { verdict, plan: seen })))
    }
}
