//! The funding decision of one covered request on a serving plan, made once at admission
//! under the workspace lock: plan while its windows have room, then credits after limits,
//! then Standby, then refused. It updates the counters it admits into (pending and running);
//! the caller writes them in the same transaction.

use super::{Counters, FIVE_HOURS_MS, PlanRecord, TierLimits, WEEK_MS};
use crate::money::MICROCENTS_PER_CENT;
use crate::runtime::clock::Millis;

/// What the request asks of the ledger.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Default)]
pub struct FundAsk {
    /// The most this request may use, at the model's per-token rates (microcents).
    pub value_microcents: i64,
    /// The credit hold (whole cents) if credits pay.
    pub hold_cents: i64,
    /// The key bypasses the plan, Standby and the cap (pay-as-you-go controls only).
    pub credits_only: bool,
    /// The key's monthly spending limit is reached.
    pub key_limit_reached: bool,
    /// The operation and model are covered by plans (`chat` on a priced chat model).
    pub covered: bool,
    /// The model is under load: Standby would be refused with `hosted_standby_pressure`.
    pub standby_pressure: bool,
    /// The model takes no Standby requests (its Standby capacity is 0).
    pub standby_closed: bool,
}

/// Who pays.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Funding {
    /// No plan decision applied: credits as without a plan (no funding headers).
    PayAsYouGo,
    Plan,
    /// Credits after plan limits (the owner's choice, under the cap).
    Credits,
    Standby,
}

impl Funding {
    /// `x-service-funding`, and the hold row's `funding` column.
    pub fn as_str(self) -> &'static str {
        match self {
            Funding::PayAsYouGo => "pay_as_you_go",
            Funding::Plan => "plan",
            Funding::Credits => "credits",
            Funding::Standby => "standby",
        }
    }

    pub fn parse(s: &str) -> Funding {
        match s {
            "plan" => Funding::Plan,
            "credits" => Funding::Credits,
            "standby" => Funding::Standby,
            _ => Funding::PayAsYouGo,
        }
    }
}

/// Why credits after limits cannot pay (`credits.blocker`).
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum CreditsBlocker {
    Disabled,
    BalanceNegative,
    KeyLimit,
    Cap,
    Empty,
}

impl CreditsBlocker {
    pub fn as_str(self) -> &'static str {
        match self {
            CreditsBlocker::Disabled => "disabled",
            CreditsBlocker::BalanceNegative => "balance_negative",
            CreditsBlocker::KeyLimit => "key_limit",
            CreditsBlocker::Cap => "cap",
            CreditsBlocker::Empty => "empty",
        }
    }
}

/// Why Standby cannot pay (`standby_blocker`).
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum StandbyBlocker {
    /// The day's allowance is used (or held by running Standby requests).
    Exhausted,
    /// The tier has no Standby (concurrency 0).
    Closed,
}

impl StandbyBlocker {
    pub fn as_str(self) -> &'static str {
        match self {
            StandbyBlocker::Exhausted => "exhausted",
            StandbyBlocker::Closed => "closed",
        }
    }
}

#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Refusal {
    /// Running requests hold the rest of a window: wait for room (then `plan_window_busy`).
    WindowBusy,
    PlanConcurrency,
    StandbyWorkspace,
    StandbyPressure,
    /// `402 plan_limit_reached`.
    LimitReached {
        credits: CreditsBlocker,
        standby: StandbyBlocker,
    },
}

/// A window's state against its limit.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct WindowFacts {
    pub name: &'static str,
    pub used: i64,
    pub limit: i64,
    pub pending: i64,
    /// `None`: the 5-hour window has not started.
    pub resets_at: Option<Millis>,
}

impl WindowFacts {
    pub fn exhausted(&self) -> bool {
        self.used >= self.limit
    }

    /// Used plus what running requests may still use reaches the limit.
    pub fn blocked(&self) -> bool {
        self.used + self.pending >= self.limit
    }

    pub fn used_percent(&self) -> i64 {
        if self.limit <= 0 {
            return 100;
        }
        (i128::from(self.used) * 100 / i128::from(self.limit)).clamp(0, 100) as i64
    }
}

/// The two plan windows, 5-hour first.
pub fn windows(c: &Counters, lim: &TierLimits) -> [WindowFacts; 2] {
    [
        WindowFacts {
            name: "five_hour",
            used: c.five_hour_used,
            limit: lim.five_hour_microcents,
            pending: c.plan_pending,
            resets_at: c.five_hour_start.map(|s| s + FIVE_HOURS_MS),
        },
        WindowFacts {
            name: "week",
            used: c.week_used,
            limit: lim.week_microcents,
            pending: c.plan_pending,
            resets_at: Some(c.week_start + WEEK_MS),
        },
    ]
}

/// The window that keeps the plan from paying: of the exhausted ones the one that resets
/// last (the plan pays again only then); `None` while the plan has room.
pub fn limiting_window(c: &Counters, lim: &TierLimits, now: Millis) -> Option<WindowFacts> {
    windows(c, lim)
        .into_iter()
        .filter(WindowFacts::exhausted)
        .max_by_key(|w| w.resets_at.unwrap_or(now + FIVE_HOURS_MS))
}

/// Latest reset among windows that block counting pending commitments (`plan_blocked_until`).
pub fn plan_blocked_until(c: &Counters, lim: &TierLimits, now: Millis) -> Option<Millis> {
    windows(c, lim).into_iter().filter(WindowFacts::blocked).map(|w| w.resets_at.unwrap_or(now + FIVE_HOURS_MS)).max()
}

/// Why credits after limits cannot pay this request, if they cannot.
pub fn credits_blocker(rec: &PlanRecord, balance_cents: i64, ask: &FundAsk) -> Option<CreditsBlocker> {
    let c = &rec.counters;
    let cap_reached = rec.terms.cap_cents.is_some_and(|cap| {
        c.credits_spent + c.credits_pending + ask.hold_cents * MICROCENTS_PER_CENT > cap * MICROCENTS_PER_CENT
    });
    if !rec.terms.credits_enabled {
        Some(CreditsBlocker::Disabled)
    } else if balance_cents < 0 {
        Some(CreditsBlocker::BalanceNegative)
    } else if ask.key_limit_reached {
        Some(CreditsBlocker::KeyLimit)
    } else if cap_reached {
        Some(CreditsBlocker::Cap)
    } else if balance_cents == 0 || balance_cents < ask.hold_cents {
        Some(CreditsBlocker::Empty)
    } else {
        None
    }
}

/// Why Standby cannot pay at all today, if it cannot (capacity refusals come later).
pub fn standby_blocker(c: &Counters, lim: &TierLimits) -> Option<StandbyBlocker> {
    if lim.standby_concurrency <= 0 {
        Some(StandbyBlocker::Closed)
    } else if c.standby_used + c.standby_pending >= lim.standby_day_microcents {
        Some(StandbyBlocker::Exhausted)
    } else {
        None
    }
}

/// Decide who pays for a covered request on a serving plan whose counters are rolled to
/// `now`; admitted requests are counted into `rec`.
pub fn decide(
    rec: &mut PlanRecord,
    lim: &TierLimits,
    balance_cents: i64,
    ask: &FundAsk,
    now: Millis,
) -> Result<Funding, Refusal> {
    let [five, week] = windows(&rec.counters, lim);
    if !five.exhausted() && !week.exhausted() {
        if five.blocked() || week.blocked() {
            return Err(Refusal::WindowBusy);
        }
        if rec.counters.plan_running >= lim.plan_concurrency {
            return Err(Refusal::PlanConcurrency);
        }
        let c = &mut rec.counters;
        c.five_hour_start.get_or_insert(now);
        c.plan_pending += ask.value_microcents;
        c.plan_running += 1;
        return Ok(Funding::Plan);
    }
    let credits = credits_blocker(rec, balance_cents, ask);
    let Some(credits) = credits else {
        rec.counters.credits_pending += ask.hold_cents * MICROCENTS_PER_CENT;
        return Ok(Funding::Credits);
    };
    let closed = ask.standby_closed.then_some(StandbyBlocker::Closed);
    if let Some(standby) = closed.or_else(|| standby_blocker(&rec.counters, lim)) {
        return Err(Refusal::LimitReached { credits, standby });
    }
    if ask.standby_pressure {
        return Err(Refusal::StandbyPressure);
    }
    if rec.counters.standby_running >= lim.standby_concurrency {
        return Err(Refusal::StandbyWorkspace);
    }
    let c = &mut rec.counters;
    c.standby_pending += ask.value_microcents;
    c.standby_running += 1;
    Ok(Funding::Standby)
}

/// Take a finished (or released) request out of the counters, and meter what it used
/// (`used`, microcents of value; `None` for a release) in the windows current when it was
/// admitted (`admitted_at`); a window that has ended since keeps nothing of it.
pub fn finish(c: &mut Counters, funding: Funding, estimate: i64, admitted_at: Millis, used: Option<i64>) {
    match funding {
        Funding::Plan => {
            c.plan_pending = (c.plan_pending - estimate).max(0);
            c.plan_running = (c.plan_running - 1).max(0);
            if let Some(v) = used {
                if c.five_hour_start.is_some_and(|s| s <= admitted_at) {
                    c.five_hour_used += v;
                }
                if c.week_start <= admitted_at {
                    c.week_used += v;
                }
                if c.period_start <= admitted_at {
                    c.period_used += v;
                }
            }
        }
        Funding::Standby => {
            c.standby_pending = (c.standby_pending - estimate).max(0);
            c.standby_running = (c.standby_running - 1).max(0);
            if let Some(v) = used.filter(|_| c.day_start <= admitted_at) {
                c.standby_used += v;
            }
        }
        Funding::Credits => {
            c.credits_pending = (c.credits_pending - estimate).max(0);
            if let Some(v) = used.filter(|_| c.credits_month_start <= admitted_at) {
                c.credits_spent += v;
            }
        }
        Funding::PayAsYouGo => {}
    }
}

#[cfg(test)]
#[path = "decide_tests.rs"]
mod tests;
