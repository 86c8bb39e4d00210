//! Coding plans: the tiers and their amounts, a workspace's stored plan (the terms an operator
//! sets and the metered counters), its windows, and the funding decision (`decide.rs`).
//!
//! Everything here is pure: the ledger applies it under the workspace lock (`ledger::plan`), so
//! two gateway instances on one store never both admit into the last room of a window. Usage
//! value is metered in microcents at the model's per-token rates.

pub mod decide;
pub mod view;

use std::time::Duration;

use crate::runtime::clock::{Millis, utc_month_bounds};

pub const FIVE_HOURS_MS: Millis = 5 * 3_600_000;
pub const WEEK_MS: Millis = 7 * DAY_MS;
pub const DAY_MS: Millis = 86_400_000;

#[derive(Debug, Clone, Copy, PartialEq, Eq, Hash)]
pub enum Tier {
    Starter,
    Pro,
    Team,
}

impl Tier {
    pub const ALL: [Tier; 3] = [Tier::Starter, Tier::Pro, Tier::Team];

    pub fn as_str(self) -> &'static str {
        match self {
            Tier::Starter => "starter",
            Tier::Pro => "pro",
            Tier::Team => "team",
        }
    }

    pub fn parse(s: &str) -> Option<Tier> {
        Tier::ALL.into_iter().find(|t| t.as_str() == s)
    }

    /// The quoted monthly price (spec "Limits": $10, $29, $99).
    pub fn price_cents(self) -> i64 {
        match self {
            Tier::Starter => 1_000,
            Tier::Pro => 2_900,
            Tier::Team => 9_900,
        }
    }
}

/// Payment status of a plan (decision 101: the spec does not list them).
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Status {
    Active,
    /// A payment failed; the plan serves until `grace_until`.
    PastDue,
    /// The grace ended unpaid: not serving, the account is frozen for the bill.
    Unpaid,
    /// A payment dispute: not serving.
    Disputed,
    Canceled,
}

impl Status {
    pub const NAMES: [&'static str; 5] = ["active", "past_due", "unpaid", "disputed", "canceled"];

    pub fn as_str(self) -> &'static str {
        match self {
            Status::Active => "active",
            Status::PastDue => "past_due",
            Status::Unpaid => "unpaid",
            Status::Disputed => "disputed",
            Status::Canceled => "canceled",
        }
    }

    pub fn parse(s: &str) -> Option<Status> {
        [Status::Active, Status::PastDue, Status::Unpaid, Status::Disputed, Status::Canceled]
            .into_iter()
            .find(|t| t.as_str() == s)
    }
}

/// The amounts of one tier (not in the spec: `tollgate.yaml` `plans.tiers`, decision 101).
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct TierLimits {
    pub five_hour_microcents: i64,
    pub week_microcents: i64,
    pub standby_day_microcents: i64,
    /// Plan-funded requests running at once per workspace.
    pub plan_concurrency: i64,
    /// Standby-funded requests running at once per workspace (`0` closes Standby).
    pub standby_concurrency: i64,
}

/// `plans:` in `tollgate.yaml`.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct PlanSettings {
    pub starter: TierLimits,
    pub pro: TierLimits,
    pub team: TierLimits,
    /// How long a request waits for room while running requests hold a window's rest.
    pub window_wait: Duration,
}

const fn limits(five_hour_cents: i64, week_cents: i64, standby_cents: i64, plan: i64, standby: i64) -> TierLimits {
    const M: i64 = crate::money::MICROCENTS_PER_CENT;
    TierLimits {
        five_hour_microcents: five_hour_cents * M,
        week_microcents: week_cents * M,
        standby_day_microcents: standby_cents * M,
        plan_concurrency: plan,
        standby_concurrency: standby,
    }
}

impl Default for PlanSettings {
    /// Documented defaults (docs/configuration.md, "Coding plans"): a week holds four full 5-hour windows,
    /// Standby a day of a fifth of one.
    fn default() -> Self {
        PlanSettings {
            starter: limits(250, 1_000, 50, 2, 1),
            pro: limits(750, 3_000, 150, 4, 2),
            team: limits(2_500, 10_000, 500, 16, 4),
            window_wait: Duration::from_secs(30),
        }
    }
}

impl PlanSettings {
    pub fn limits(&self, tier: Tier) -> TierLimits {
        match tier {
            Tier::Starter => self.starter,
            Tier::Pro => self.pro,
            Tier::Team => self.team,
        }
    }
}

/// What an operator sets (`PUT /admin/v1/workspaces/{ws}/plan`).
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct PlanTerms {
    pub tier: Tier,
    pub status: Status,
    /// When the plan started: the weekly windows and the billing months count from it.
    pub started_at: Millis,
    pub cancel_at: Option<Millis>,
    /// `past_due`: the plan serves until then.
    pub grace_until: Option<Millis>,
    pub credits_enabled: bool,
    /// `None` with credits enabled: no cap.
    pub cap_cents: Option<i64>,
    pub pending_tier: Option<Tier>,
    pub pending_effective_at: Option<Millis>,
}

impl PlanTerms {
    /// The plan can fund requests now (a stored record alone does not mean serving).
    pub fn serving(&self, now: Millis) -> bool {
        let paid = match self.status {
            Status::Active => true,
            Status::PastDue => self.grace_until.is_some_and(|g| now < g),
            Status::Unpaid | Status::Disputed | Status::Canceled => false,
        };
        paid && self.cancel_at.is_none_or(|c| now < c)
    }
}

/// The metered state, in microcents of usage value. Pending amounts are what running requests
/// may still use (their admission estimates); they never reset with a window.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Default)]
pub struct Counters {
    /// `None` until an admitted plan request starts the clock.
    pub five_hour_start: Option<Millis>,
    pub five_hour_used: i64,
    pub week_start: Millis,
    pub week_used: i64,
    /// The UTC day of the Standby allowance.
    pub day_start: Millis,
    pub standby_used: i64,
    /// The plan's billing month (`included_month`).
    pub period_start: Millis,
    pub period_used: i64,
    /// Credits after limits in the UTC month (the cap's period).
    pub credits_month_start: Millis,
    pub credits_spent: i64,
    pub plan_pending: i64,
    pub standby_pending: i64,
    pub credits_pending: i64,
    pub plan_running: i64,
    pub standby_running: i64,
}

/// A workspace's stored plan.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct PlanRecord {
    pub terms: PlanTerms,
    pub counters: Counters,
}

/// Start and end of the billing month containing `now`, counted in calendar months from
/// `started_at` (a plan started on the 31st renews on the last day of shorter months).
pub fn period_bounds(started_at: Millis, now: Millis) -> (Millis, Millis) {
    use jiff::{Span, Timestamp, tz::TimeZone};
    let Ok(start) = Timestamp::from_millisecond(started_at) else { return (started_at, started_at + 30 * DAY_MS) };
    let start = start.to_zoned(TimeZone::UTC);
    let at = |n: i64| {
        start.checked_add(Span::new().months(n)).map(|z| z.timestamp().as_millisecond()).unwrap_or(Millis::MAX)
    };
    // Months elapsed, estimated from 31-day months, then corrected.
    let mut n = ((now - started_at).max(0) / (31 * DAY_MS)).min(12_000);
    while at(n + 1) <= now {
        n += 1;
    }
    (at(n), at(n + 1))
}

impl Counters {
    /// Fresh counters of a plan starting at `now`.
    pub fn starting(now: Millis) -> Counters {
        let mut c = Counters { week_start: now, period_start: now, ..Counters::default() };
        c.roll(now, now);
        c
    }

    /// Bring every window to `now`: an ended window's usage is gone (pending stays). Windows
    /// only move forward: a gateway whose clock is a little behind the one that last rolled
    /// them never reopens a window that ended.
    pub fn roll(&mut self, started_at: Millis, now: Millis) {
        if self.five_hour_start.is_some_and(|s| now >= s + FIVE_HOURS_MS) {
            self.five_hour_start = None;
            self.five_hour_used = 0;
        }
        let week = started_at + (now - started_at).max(0) / WEEK_MS * WEEK_MS;
        if week > self.week_start {
            self.week_start = week;
            self.week_used = 0;
        }
        let day = now - now.rem_euclid(DAY_MS);
        if day > self.day_start {
            self.day_start = day;
            self.standby_used = 0;
        }
        let (period, _) = period_bounds(started_at, now);
        if period > self.period_start {
            self.period_start = period;
            self.period_used = 0;
        }
        let (month, _, _) = utc_month_bounds(now);
        if month > self.credits_month_start {
            self.credits_month_start = month;
            self.credits_spent = 0;
        }
    }

    /// When a request admitted at `now` counts as admitted: never before the windows it was
    /// admitted into started (another gateway's clock may have started them a moment later),
    /// so its usage is metered into them when it settles.
    pub fn admitted_at(&self, now: Millis) -> Millis {
        [
            self.five_hour_start.unwrap_or(Millis::MIN),
            self.week_start,
            self.day_start,
            self.period_start,
            self.credits_month_start,
        ]
        .into_iter()
        .fold(now, Millis::max)
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    fn at(s: &str) -> Millis {
        s.parse::<jiff::Timestamp>().map(|t| t.as_millisecond()).unwrap_or(0)
    }

    #[test]
    fn windows_roll_at_their_ends_and_keep_pending() {
        let start = at("2026-11-02T10:00:00Z");
        let mut c = Counters::starting(start);
        c.five_hour_start = Some(start);
        c.five_hour_used = 5;
        c.week_used = 7;
        c.standby_used = 3;
        c.plan_pending = 9;
        c.roll(start, start + FIVE_HOURS_MS - 1);
        assert_eq!((c.five_hour_start, c.five_hour_used), (Some(start), 5), "still inside the 5 hours");
        c.roll(start, start + FIVE_HOURS_MS);
        assert_eq!((c.five_hour_start, c.five_hour_used), (None, 0), "ended: null until the next plan request");
        assert_eq!(c.standby_used, 3, "the same UTC day");
        c.roll(start, at("2026-11-03T00:00:00Z"));
        assert_eq!((c.standby_used, c.day_start), (0, at("2026-11-03T00:00:00Z")), "Standby refills at UTC midnight");
        assert_eq!(c.week_used, 7);
        c.roll(start, start + WEEK_MS);
        assert_eq!((c.week_used, c.week_start), (0, start + WEEK_MS), "weeks count from the plan's start");
        assert_eq!(c.plan_pending, 9, "pending commitments never reset");
    }

    #[test]
    fn billing_months_count_from_the_start_day() {
        let start = at("2026-01-31T12:00:00Z");
        assert_eq!(period_bounds(start, at("2026-02-15T00:00:00Z")), (start, at("2026-02-28T12:00:00Z")));
        let (s, e) = period_bounds(start, at("2026-11-23T00:00:00Z"));
        assert_eq!((s, e), (at("2026-10-31T12:00:00Z"), at("2026-11-30T12:00:00Z")));
        assert_eq!(period_bounds(start, start).0, start);
    }

    #[test]
    fn serving_follows_status_grace_and_cancellation() {
        let terms = PlanTerms {
            tier: Tier::Pro,
            status: Status::Active,
            started_at: 0,
            cancel_at: None,
            grace_until: None,
            credits_enabled: false,
            cap_cents: None,
            pending_tier: None,
            pending_effective_at: None,
        };
        assert!(terms.serving(10));
        assert!(!PlanTerms { cancel_at: Some(10), ..terms.clone() }.serving(10));
        assert!(PlanTerms { status: Status::PastDue, grace_until: Some(11), ..terms.clone() }.serving(10));
        assert!(!PlanTerms { status: Status::PastDue, grace_until: Some(10), ..terms.clone() }.serving(10));
        for s in [Status::Unpaid, Status::Disputed, Status::Canceled] {
            assert!(!PlanTerms { status: s, ..terms.clone() }.serving(10), "{s:?}");
        }
    }
}
