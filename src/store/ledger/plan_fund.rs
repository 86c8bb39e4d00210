//! The `Fund` op: who pays for a request, decided under the workspace lock with the plan as
//! the batch read it (`plans::decide` on a serving plan, else pay-as-you-go), and the hold
//! that goes with the decision, in the same write.

use super::{NewHoldArgs, Planner, touch};
use crate::money::MICROCENTS_PER_CENT;
use crate::money::plans::decide::{Funding, decide};
use crate::money::plans::view::PlanSeen;
use crate::store::StoreError;
use crate::store::ledger::ops::{FundOp, FundOutcome, FundRefusal, HoldOutcome, OpOutcome, OpResult};

impl Planner {
    /// Decide who pays (`plans::decide` on a serving plan, else pay-as-you-go) and place the
    /// hold that goes with it.
    pub(in crate::store) fn fund(&mut self, f: &FundOp) -> OpResult {
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
