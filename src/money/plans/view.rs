//! What clients see of a plan: the funding headers, the window and credits objects of the
//! plan snapshot (`GET /v1/usage`) and the fields of `402 plan_limit_reached`. Built from the
//! record as the admission (or the read) saw it, under the same rules everywhere.

use serde_json::{Value, json};

use super::decide::{CreditsBlocker, Funding, StandbyBlocker, WindowFacts, windows};
use super::{DAY_MS, PlanRecord, TierLimits, period_bounds};
use crate::runtime::clock::{Millis, iso, utc_month_bounds};

/// A plan as one admission or read saw it.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct PlanSeen {
    pub record: PlanRecord,
    pub limits: TierLimits,
    pub balance_cents: i64,
}

/// The funding headers of an admission where a plan decision applied.
pub fn funding_headers(funding: Funding, seen: &PlanSeen) -> Vec<(&'static str, String)> {
    let mut h = vec![
        ("x-service-funding", funding.as_str().to_string()),
        ("x-service-plan", seen.record.terms.tier.as_str().to_string()),
    ];
    let [five, week] = windows(&seen.record.counters, &seen.limits);
    if let Some(resets) = five.resets_at {
        h.push(("x-service-plan-5h-used-percent", five.used_percent().to_string()));
        h.push(("x-service-plan-5h-resets-at", (resets / 1000).to_string()));
    }
    h.push(("x-service-plan-week-used-percent", week.used_percent().to_string()));
    if let Some(resets) = week.resets_at {
        h.push(("x-service-plan-week-resets-at", (resets / 1000).to_string()));
    }
    h
}

/// A window object: `starts_at`, `resets_at`, `used_microcents`, `limit_microcents`,
/// `used_percent`.
pub fn window_json(w: &WindowFacts, starts_at: Millis) -> Value {
    json!({
        "starts_at": iso(starts_at),
        "resets_at": w.resets_at.map(iso),
        "used_microcents": w.used,
        "limit_microcents": w.limit,
        "used_percent": w.used_percent(),
    })
}

/// The credits-after-limits object.
pub fn credits_json(seen: &PlanSeen, blocker: Option<CreditsBlocker>) -> Value {
    let t = &seen.record.terms;
    let c = &seen.record.counters;
    let (_, next_month, _) = utc_month_bounds(c.credits_month_start);
    let mut v = json!({
        "enabled": t.credits_enabled,
        "cap_cents": t.cap_cents,
        "balance_cents": seen.balance_cents,
        "month_spent_microcents": c.credits_spent,
        "pending_max_holds_microcents": c.credits_pending,
        "resets_at": iso(next_month),
    });
    if let Some(b) = blocker {
        v["blocker"] = json!(b.as_str());
    }
    v
}

/// The Standby day's counters; `resets_at` is the refill time.
pub fn standby_day_json(seen: &PlanSeen) -> Value {
    let c = &seen.record.counters;
    let day = WindowFacts {
        name: "standby_day",
        used: c.standby_used,
        limit: seen.limits.standby_day_microcents,
        pending: c.standby_pending,
        resets_at: Some(c.day_start + DAY_MS),
    };
    window_json(&day, c.day_start)
}

/// `included_month`: the plan's billing month and the plan value used in it.
pub fn included_month_json(seen: &PlanSeen, now: Millis) -> Value {
    let (start, end) = period_bounds(seen.record.terms.started_at, now);
    json!({ "starts_at": iso(start), "resets_at": iso(end), "used_microcents": seen.record.counters.period_used })
}

/// The five-hour window object (null before a plan request starts it) and the week's.
pub fn window_objects(seen: &PlanSeen) -> (Value, Value) {
    let c = &seen.record.counters;
    let [five, week] = windows(c, &seen.limits);
    let five_json = c.five_hour_start.map_or(Value::Null, |s| window_json(&five, s));
    (five_json, window_json(&week, c.week_start))
}

/// The fixes offered on a refusal: what an owner can change, then the member's fix (a key
/// does not say who holds it, decision 102).
pub fn fixes(credits: CreditsBlocker, standby: StandbyBlocker) -> Value {
    let owner = match credits {
        CreditsBlocker::Disabled => ("enable_credits", "Enable credits after plan limits"),
        CreditsBlocker::BalanceNegative | CreditsBlocker::Empty => ("add_funds", "Add credits"),
        CreditsBlocker::KeyLimit => ("raise_key_limit", "Raise this key's monthly spending limit"),
        CreditsBlocker::Cap => ("raise_cap", "Raise the credits-after-limits cap"),
    };
    let mut list = vec![json!({ "code": owner.0, "label": owner.1 })];
    if standby == StandbyBlocker::Exhausted {
        list.push(json!({ "code": "wait_for_refill", "label": "Wait for the plan window or the Standby refill" }));
    }
    list.push(json!({ "code": "contact_support", "label": "Contact support" }));
    list.push(json!({ "code": "ask_owner", "label": "Ask a workspace owner" }));
    Value::Array(list)
}

/// The remedy of a plan that cannot fund the next request (`remedy_code`).
pub fn remedy(credits: CreditsBlocker) -> &'static str {
    match credits {
        CreditsBlocker::Disabled => "enable_credits",
        CreditsBlocker::Cap => "raise_cap",
        CreditsBlocker::KeyLimit => "raise_key_limit",
        CreditsBlocker::BalanceNegative | CreditsBlocker::Empty => "add_funds",
    }
}
