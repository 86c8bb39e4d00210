//! Plan-funded holds: metered once when settled, freed by the sweeper, on every backend.

use super::*;

both_backends!(plan_holds_meter_once_and_the_sweeper_frees_them);

/// A plan-funded request reserves no money, meters its value into the windows once when it
/// settles, and a plan hold whose gateway died is freed by the sweeper (pending and running
/// back to zero, nothing metered).
async fn plan_holds_meter_once_and_the_sweeper_frees_them(s: Stores) {
    let ws = workspace(&s).await;
    let l = &s.ledger;
    l.top_up(&ws, 100, "grant", None, now_ms()).await.unwrap();
    let now = now_ms();
    let terms = PlanTerms {
        tier: Tier::Starter,
        status: Status::Active,
        started_at: now,
        cancel_at: None,
        grace_until: None,
        credits_enabled: false,
        cap_cents: None,
        pending_tier: None,
        pending_effective_at: None,
    };
    assert!(l.set_plan(&ws, &terms, now).await.unwrap().is_some());
    let a = l.fund(fund_op(&ws, "pa", 20, now + 60_000)).await.unwrap();
    assert_eq!(a.verdict, Ok(Funding::Plan));
    assert!(
        a.plan.unwrap().record.counters.five_hour_start.is_some(),
        "the first plan request starts the 5-hour clock"
    );
    let dead = l.fund(fund_op(&ws, "pdead", 20, now - 1)).await.unwrap();
    assert_eq!(dead.verdict, Ok(Funding::Plan));
    // Running requests hold all 40 cents: the next one waits for room.
    let busy = l.fund(fund_op(&ws, "pc", 20, now + 60_000)).await.unwrap();
    assert_eq!(busy.verdict, Err(FundRefusal::Plan(Refusal::WindowBusy)));
    let b = l.balance(&ws).await.unwrap().unwrap();
    assert_eq!((b.balance_cents, b.held_cents), (100, 0), "plan holds reserve no money");
    let mut paid = settlement(&ws, "pa", 0);
    paid.value = tollgate::money::Microcents(15_000_000);
    assert!(matches!(l.settle(&paid).await.unwrap(), SettleOutcome::Settled { debit_cents: 0, .. }));
    assert_eq!(l.settle(&paid).await.unwrap(), SettleOutcome::AlreadySettled);
    assert_eq!(l.sweep_expired_holds(now_ms()).await.unwrap(), vec!["pdead".to_string()]);
    let c = l.plan(&ws).await.unwrap().unwrap().counters;
    assert_eq!((c.five_hour_used, c.week_used, c.plan_pending, c.plan_running), (15_000_000, 15_000_000, 0, 0));
    assert_eq!(l.balance(&ws).await.unwrap().unwrap().balance_cents, 100);
    assert_eq!(l.derived_balance(&ws).await.unwrap(), 100);
    // Room again: 15 of 40 used, nothing pending.
    assert_eq!(l.fund(fund_op(&ws, "pd", 20, now + 60_000)).await.unwrap().verdict, Ok(Funding::Plan));
    assert!(l.clear_plan(&ws).await.unwrap());
    assert!(l.plan(&ws).await.unwrap().is_none());
}
