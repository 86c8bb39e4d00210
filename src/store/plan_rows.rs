//! A `plans` row as both backends read and write it: one column list, one mapping.

use crate::money::plans::{Counters, PlanRecord, PlanTerms, Status, Tier};
use crate::runtime::clock::Millis;

/// The terms columns, in the order [`read_plan`] expects them.
pub const TERMS_COLUMNS: &str = "tier, status, started_at, cancel_at, grace_until, credits_enabled, cap_cents, \
     pending_tier, pending_effective_at";

/// The counter columns, in the order of [`counter_values`].
pub const COUNTER_COLUMNS: [&str; 15] = [
    "five_hour_start",
    "five_hour_used",
    "week_start",
    "week_used",
    "day_start",
    "standby_used",
    "period_start",
    "period_used",
    "credits_month_start",
    "credits_spent",
    "plan_pending",
    "standby_pending",
    "credits_pending",
    "plan_running",
    "standby_running",
];

/// Every column of a plan, terms then counters.
pub fn all_columns() -> String {
    format!("{TERMS_COLUMNS}, {}", COUNTER_COLUMNS.join(", "))
}

/// Read access to one result row, by column index.
pub trait PlanRow {
    fn text(&self, i: usize) -> Result<Option<String>, String>;
    fn int(&self, i: usize) -> Result<Option<i64>, String>;
    fn flag(&self, i: usize) -> Result<bool, String>;
}

/// The counters as column values (`five_hour_start` may be null).
pub fn counter_values(c: &Counters) -> [Option<i64>; 15] {
    [
        c.five_hour_start,
        Some(c.five_hour_used),
        Some(c.week_start),
        Some(c.week_used),
        Some(c.day_start),
        Some(c.standby_used),
        Some(c.period_start),
        Some(c.period_used),
        Some(c.credits_month_start),
        Some(c.credits_spent),
        Some(c.plan_pending),
        Some(c.standby_pending),
        Some(c.credits_pending),
        Some(c.plan_running),
        Some(c.standby_running),
    ]
}

/// The terms as column values, in [`TERMS_COLUMNS`] order (the flag separately).
pub struct TermValues<'a> {
    pub tier: &'static str,
    pub status: &'static str,
    pub started_at: Millis,
    pub cancel_at: Option<Millis>,
    pub grace_until: Option<Millis>,
    pub credits_enabled: bool,
    pub cap_cents: Option<i64>,
    pub pending_tier: Option<&'a str>,
    pub pending_effective_at: Option<Millis>,
}

pub fn term_values(t: &PlanTerms) -> TermValues<'static> {
    TermValues {
        tier: t.tier.as_str(),
        status: t.status.as_str(),
        started_at: t.started_at,
        cancel_at: t.cancel_at,
        grace_until: t.grace_until,
        credits_enabled: t.credits_enabled,
        cap_cents: t.cap_cents,
        pending_tier: t.pending_tier.map(Tier::as_str),
        pending_effective_at: t.pending_effective_at,
    }
}

/// A plan from a row holding [`all_columns`] from column `at` on.
pub fn read_plan(r: &impl PlanRow, at: usize) -> Result<PlanRecord, String> {
    let tier = r.text(at)?.unwrap_or_default();
    let status = r.text(at + 1)?.unwrap_or_default();
    let terms = PlanTerms {
        tier: Tier::parse(&tier).ok_or_else(|| format!("stored plan tier `{tier}` is unknown"))?,
        status: Status::parse(&status).ok_or_else(|| format!("stored plan status `{status}` is unknown"))?,
        started_at: r.int(at + 2)?.unwrap_or(0),
        cancel_at: r.int(at + 3)?,
        grace_until: r.int(at + 4)?,
        credits_enabled: r.flag(at + 5)?,
        cap_cents: r.int(at + 6)?,
        pending_tier: r.text(at + 7)?.as_deref().and_then(Tier::parse),
        pending_effective_at: r.int(at + 8)?,
    };
    let n = |i: usize| -> Result<i64, String> { Ok(r.int(at + 9 + i)?.unwrap_or(0)) };
    let counters = Counters {
        five_hour_start: r.int(at + 9)?,
        five_hour_used: n(1)?,
        week_start: n(2)?,
        week_used: n(3)?,
        day_start: n(4)?,
        standby_used: n(5)?,
        period_start: n(6)?,
        period_used: n(7)?,
        credits_month_start: n(8)?,
        credits_spent: n(9)?,
        plan_pending: n(10)?,
        standby_pending: n(11)?,
        credits_pending: n(12)?,
        plan_running: n(13)?,
        standby_running: n(14)?,
    };
    Ok(PlanRecord { terms, counters })
}
