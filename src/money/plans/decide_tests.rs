use super::*;
use crate::money::plans::{Counters, PlanRecord, PlanSettings, PlanTerms, Status, Tier};

const M: i64 = MICROCENTS_PER_CENT;
const NOW: Millis = 1_000_000_000;

fn record(credits_enabled: bool, cap_cents: Option<i64>) -> PlanRecord {
    PlanRecord {
        terms: PlanTerms {
            tier: Tier::Starter,
            status: Status::Active,
            started_at: NOW,
            cancel_at: None,
            grace_until: None,
            credits_enabled,
            cap_cents,
            pending_tier: None,
            pending_effective_at: None,
        },
        counters: Counters::starting(NOW),
    }
}

fn lim() -> TierLimits {
    TierLimits {
        five_hour_microcents: 100 * M,
        week_microcents: 300 * M,
        standby_day_microcents: 50 * M,
        plan_concurrency: 2,
        standby_concurrency: 1,
    }
}

fn ask(value_cents: i64) -> FundAsk {
    FundAsk { value_microcents: value_cents * M, hold_cents: value_cents, covered: true, ..FundAsk::default() }
}

#[test]
fn the_plan_pays_while_its_windows_have_room_and_starts_the_five_hour_clock() {
    let mut r = record(false, None);
    assert_eq!(r.counters.five_hour_start, None);
    assert_eq!(decide(&mut r, &lim(), 0, &ask(10), NOW + 5), Ok(Funding::Plan));
    assert_eq!(r.counters.five_hour_start, Some(NOW + 5));
    assert_eq!((r.counters.plan_pending, r.counters.plan_running), (10 * M, 1));
    finish(&mut r.counters, Funding::Plan, 10 * M, NOW + 5, Some(7 * M));
    assert_eq!((r.counters.plan_pending, r.counters.plan_running), (0, 0));
    assert_eq!((r.counters.five_hour_used, r.counters.week_used, r.counters.period_used), (7 * M, 7 * M, 7 * M));
}

#[test]
fn running_requests_holding_the_rest_make_the_next_one_wait_not_fall_through() {
    let mut r = record(true, None);
    r.counters.five_hour_start = Some(NOW);
    r.counters.five_hour_used = 60 * M;
    r.counters.plan_pending = 40 * M;
    assert_eq!(decide(&mut r, &lim(), 1_000, &ask(1), NOW), Err(Refusal::WindowBusy));
    assert_eq!(plan_blocked_until(&r.counters, &lim(), NOW), Some(NOW + FIVE_HOURS_MS));
    // The running request finishes below its estimate: room again.
    finish(&mut r.counters, Funding::Plan, 40 * M, NOW, Some(10 * M));
    assert_eq!(decide(&mut r, &lim(), 1_000, &ask(1), NOW), Ok(Funding::Plan));
}

#[test]
fn a_full_window_goes_to_credits_after_limits_then_standby_then_refused() {
    let mut r = record(true, Some(50));
    r.counters.five_hour_start = Some(NOW);
    r.counters.five_hour_used = 100 * M;
    // Credits enabled, under the cap, balance covers the hold.
    assert_eq!(decide(&mut r, &lim(), 500, &ask(30), NOW), Ok(Funding::Credits));
    assert_eq!(r.counters.credits_pending, 30 * M);
    // Spent plus pending plus this hold would pass the $0.50 cap: Standby.
    assert_eq!(credits_blocker(&r, 500, &ask(30)), Some(CreditsBlocker::Cap));
    assert_eq!(decide(&mut r, &lim(), 500, &ask(30), NOW), Ok(Funding::Standby));
    // Standby concurrency 1 is taken.
    assert_eq!(decide(&mut r, &lim(), 500, &ask(30), NOW), Err(Refusal::StandbyWorkspace));
    finish(&mut r.counters, Funding::Standby, 30 * M, NOW, Some(50 * M));
    assert_eq!(r.counters.standby_used, 50 * M);
    // The day's allowance is used: refused, naming both blockers.
    assert_eq!(
        decide(&mut r, &lim(), 500, &ask(30), NOW),
        Err(Refusal::LimitReached { credits: CreditsBlocker::Cap, standby: StandbyBlocker::Exhausted })
    );
    let w = limiting_window(&r.counters, &lim(), NOW).map(|w| w.name);
    assert_eq!(w, Some("five_hour"));
}

#[test]
fn credits_blockers_in_order() {
    let r = record(true, None);
    let a = ask(5);
    assert_eq!(credits_blocker(&record(false, None), 100, &a), Some(CreditsBlocker::Disabled));
    assert_eq!(credits_blocker(&r, -1, &a), Some(CreditsBlocker::BalanceNegative));
    assert_eq!(credits_blocker(&r, 100, &FundAsk { key_limit_reached: true, ..a }), Some(CreditsBlocker::KeyLimit));
    assert_eq!(credits_blocker(&r, 0, &a), Some(CreditsBlocker::Empty));
    assert_eq!(credits_blocker(&r, 4, &a), Some(CreditsBlocker::Empty));
    assert_eq!(credits_blocker(&r, 5, &a), None);
}

#[test]
fn plan_concurrency_and_standby_pressure_refuse_with_their_codes() {
    let mut r = record(false, None);
    let l = lim();
    assert_eq!(decide(&mut r, &l, 0, &ask(1), NOW), Ok(Funding::Plan));
    assert_eq!(decide(&mut r, &l, 0, &ask(1), NOW), Ok(Funding::Plan));
    assert_eq!(decide(&mut r, &l, 0, &ask(1), NOW), Err(Refusal::PlanConcurrency));
    r.counters.week_used = 300 * M;
    let pressed = FundAsk { standby_pressure: true, ..ask(1) };
    assert_eq!(decide(&mut r, &l, 0, &pressed, NOW), Err(Refusal::StandbyPressure));
    let closed = TierLimits { standby_concurrency: 0, ..l };
    assert_eq!(
        decide(&mut r, &closed, 0, &ask(1), NOW),
        Err(Refusal::LimitReached { credits: CreditsBlocker::Disabled, standby: StandbyBlocker::Closed })
    );
    assert_eq!(limiting_window(&r.counters, &l, NOW).map(|w| w.name), Some("week"));
}

#[test]
fn usage_of_an_ended_window_is_not_metered_into_the_next() {
    let mut c = Counters::starting(NOW);
    c.five_hour_start = Some(NOW + 10);
    c.plan_pending = 5;
    c.plan_running = 1;
    // Admitted before the current 5-hour window started (in an earlier one).
    finish(&mut c, Funding::Plan, 5, NOW, Some(9));
    assert_eq!(c.five_hour_used, 0);
    assert_eq!(c.week_used, 9);
    assert_eq!(windows(&c, &PlanSettings::default().starter)[0].used_percent(), 0);
}

#[test]
fn used_percent_is_clamped() {
    let w = WindowFacts { name: "week", used: 250, limit: 100, pending: 0, resets_at: None };
    assert_eq!(w.used_percent(), 100);
    assert_eq!(WindowFacts { used: 49, ..w }.used_percent(), 49);
    assert_eq!(WindowFacts { used: -5, ..w }.used_percent(), 0);
}
