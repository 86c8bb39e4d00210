//! The `plans` section of `tollgate.yaml`: the amounts of each coding plan tier (the spec does
//! not publish them, decision 101) and the plan window wait.

use std::time::Duration;

use serde::Deserialize;

use super::Problems;
use crate::money::MICROCENTS_PER_CENT;
use crate::money::plans::{PlanSettings, Tier, TierLimits};

#[derive(Deserialize, Default)]
#[serde(deny_unknown_fields)]
pub(super) struct RawPlans {
    #[serde(default)]
    window_wait_seconds: Option<f64>,
    #[serde(default)]
    tiers: RawTiers,
}

#[derive(Deserialize, Default)]
#[serde(deny_unknown_fields)]
struct RawTiers {
    starter: Option<RawTier>,
    pro: Option<RawTier>,
    team: Option<RawTier>,
}

/// Amounts in cents of usage value at the models' per-token rates.
#[derive(Deserialize)]
#[serde(deny_unknown_fields)]
struct RawTier {
    five_hour_cents: i64,
    week_cents: i64,
    standby_day_cents: i64,
    plan_concurrency: i64,
    standby_concurrency: i64,
}

fn tier(p: &mut Problems, tier: Tier, raw: Option<&RawTier>, default: TierLimits) -> TierLimits {
    let Some(r) = raw else { return default };
    let path = |field: &str| format!("plans.tiers.{}.{field}", tier.as_str());
    let mut cents = |field: &str, v: i64| {
        if !(0..=100_000_000).contains(&v) {
            p.add(path(field), format!("must be 0..=100000000 cents, got {v}"));
        }
        v.clamp(0, 100_000_000) * MICROCENTS_PER_CENT
    };
    let limits = TierLimits {
        five_hour_microcents: cents("five_hour_cents", r.five_hour_cents),
        week_microcents: cents("week_cents", r.week_cents),
        standby_day_microcents: cents("standby_day_cents", r.standby_day_cents),
        plan_concurrency: r.plan_concurrency,
        standby_concurrency: r.standby_concurrency,
    };
    if !(1..=10_000).contains(&r.plan_concurrency) {
        p.add(path("plan_concurrency"), format!("must be 1..=10000, got {}", r.plan_concurrency));
    }
    if !(0..=10_000).contains(&r.standby_concurrency) {
        p.add(
            path("standby_concurrency"),
            format!("must be 0..=10000 (0 closes Standby), got {}", r.standby_concurrency),
        );
    }
    if r.week_cents < r.five_hour_cents {
        p.add(path("week_cents"), "must be at least five_hour_cents (a week holds every 5-hour window in it)");
    }
    limits
}

pub(super) fn check(p: &mut Problems, raw: &RawPlans) -> PlanSettings {
    let d = PlanSettings::default();
    let wait = raw.window_wait_seconds.unwrap_or(d.window_wait.as_secs_f64());
    if !(wait.is_finite() && (0.0..=30.0).contains(&wait)) {
        p.add("plans.window_wait_seconds", format!("must be 0..=30 seconds (spec: up to 30), got {wait}"));
    }
    PlanSettings {
        starter: tier(p, Tier::Starter, raw.tiers.starter.as_ref(), d.starter),
        pro: tier(p, Tier::Pro, raw.tiers.pro.as_ref(), d.pro),
        team: tier(p, Tier::Team, raw.tiers.team.as_ref(), d.team),
        window_wait: Duration::from_secs_f64(wait.clamp(0.0, 30.0)),
    }
}
