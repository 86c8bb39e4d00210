//! `GET /v1/usage`: the plan snapshot (spec "Plan snapshot"), read from the ledger on every
//! call, never cached. `predicted_funding` is the decision the next covered request would get
//! if it asked now (a dry run of `plans::decide` on a copy: nothing is written).

use bytes::Bytes;
use pingora::proxy::Session;
use serde_json::{Value, json};

use super::Billing;
use super::refusals::store_down;
use tollgate::http::error::GatewayError;
use tollgate::money::plans::decide::{FundAsk, Refusal, credits_blocker, decide, plan_blocked_until};
use tollgate::money::plans::view::{
    PlanSeen, credits_json, included_month_json, remedy, standby_day_json, window_objects,
};
use tollgate::money::plans::{PlanRecord, Status};
use tollgate::proxy::ctx::RequestCtx;
use tollgate::runtime::clock::{iso, now_ms};

pub async fn snapshot(b: &Billing, s: &mut Session, cx: &mut RequestCtx) -> Result<(), GatewayError> {
    let principal = cx.principal.clone().ok_or_else(|| GatewayError::internal("no principal"))?;
    let ws = &principal.workspace_id;
    let now = now_ms();
    // Unused leases are balance no request holds yet (`ledger/lease.rs`).
    let (plan, balance) = tokio::try_join!(b.ledger.plan(ws), b.ledger.balance_shown(ws)).map_err(store_down)?;
    let balance_cents = balance.map_or(0, |m| m.balance_cents);
    let current = plan.map(|mut record| {
        record.counters.roll(record.terms.started_at, now);
        let limits = b.plans.limits(record.terms.tier);
        current(&PlanSeen { record, limits, balance_cents }, principal.frozen.is_some(), now)
    });
    let body = json!({
        "workspace_id": ws,
        "coding_plan": {
            "observed_at": iso(now),
            "availability": "available",
            "current": current,
        },
        "covers": ["chat", "embeddings", "rerank"],
        "order": ["plan", "credits", "standby", "refused"],
    });
    tollgate::http::responder::json(s, cx, 200, Bytes::from(body.to_string()), &[("cache-control", "no-store".into())])
        .await
        .map_err(|e| GatewayError::internal(format!("write failed: {e}")))
}

/// What the next covered request would get (`predicted_funding`): a dry run on a copy of
/// the record; `None` while the plan is not serving.
fn predicted(seen: &PlanSeen, now: i64) -> Option<&'static str> {
    if !seen.record.terms.serving(now) {
        return None;
    }
    let mut copy: PlanRecord = seen.record.clone();
    let ask = FundAsk { value_microcents: 1, hold_cents: 1, covered: true, ..FundAsk::default() };
    Some(match decide(&mut copy, &seen.limits, seen.balance_cents, &ask, now) {
        Ok(f) => f.as_str(),
        Err(Refusal::WindowBusy | Refusal::PlanConcurrency) => "plan",
        Err(Refusal::StandbyWorkspace | Refusal::StandbyPressure) => "standby",
        Err(Refusal::LimitReached { .. }) => "refused",
    })
}

fn current(seen: &PlanSeen, billing_frozen: bool, now: i64) -> Value {
    let t = &seen.record.terms;
    let c = &seen.record.counters;
    let serving = t.serving(now);
    // A frozen account refuses every request, whatever the plan would say (decision 168).
    let predicted_name = if billing_frozen && serving { Some("refused") } else { predicted(seen, now) };
    let plan_exhausted = tollgate::money::plans::decide::limiting_window(c, &seen.limits, now).is_some();
    let ask = FundAsk { hold_cents: 1, ..FundAsk::default() };
    let credits_block = credits_blocker(&seen.record, seen.balance_cents, &ask);
    let remedy_code = match (billing_frozen, predicted_name) {
        (true, _) => None,
        (false, Some("refused")) => credits_block.map(remedy),
        (false, Some("standby")) => credits_block.map(remedy),
        _ if !serving => Some("contact_support"),
        _ => None,
    };
    let tile_state = if !serving {
        "ended"
    } else if t.status == Status::PastDue {
        "past_due"
    } else if t.cancel_at.is_some() {
        "canceling"
    } else if plan_exhausted {
        "limited"
    } else {
        "active"
    };
    let (_, period_end) = tollgate::money::plans::period_bounds(t.started_at, now);
    let serving_until = match (serving, t.status) {
        (false, _) => None,
        (true, Status::PastDue) => t.grace_until.into_iter().chain(t.cancel_at).min(),
        (true, _) => t.cancel_at,
    };
    let blocked_until = plan_blocked_until(c, &seen.limits, now);
    let resumes_at = match predicted_name {
        Some("refused") if !billing_frozen => {
            blocked_until.into_iter().chain([c.day_start + tollgate::money::plans::DAY_MS]).min().map(iso)
        }
        _ => None,
    };
    let (five_hour, week) = window_objects(seen);
    let summary = format!(
        "{} plan ({}){}.",
        t.tier.as_str(),
        t.status.as_str(),
        match predicted_name {
            Some(p) => format!("; the next request would be funded by: {p}"),
            None => "; not serving".to_string(),
        }
    );
    json!({
        "tier": t.tier.as_str(),
        "interval": "month",
        "status": t.status.as_str(),
        "tile_state": tile_state,
        "serving": serving,
        "price_cents": t.tier.price_cents(),
        "cancel_at": t.cancel_at.map(iso),
        "renews_at": (serving && t.status == Status::Active && t.cancel_at.is_none()).then(|| iso(period_end)),
        "five_hour_limit_microcents": seen.limits.five_hour_microcents,
        "plan_blocked_until": blocked_until.map(iso),
        "resumes_at": resumes_at,
        "five_hour": five_hour,
        "week": week,
        "standby_day": standby_day_json(seen),
        "included_month": included_month_json(seen, now),
        "pending_change": t.pending_tier.map(|tier| json!({ "tier": tier.as_str(), "effective_at": t.pending_effective_at.map(iso) })),
        "credits": credits_json(seen, None),
        "funding": null,
        "predicted_funding": predicted_name,
        "remedy_code": remedy_code,
        "serving_until": serving_until.map(iso),
        "can_keep": t.cancel_at.is_some_and(|c| c > now) && !matches!(t.status, Status::Disputed | Status::Canceled),
        "billing_frozen": billing_frozen,
        "copy": {
            "summary": summary,
            "policy": "Usage is paid by the plan while its 5-hour and weekly windows have room, then by credits after limits when enabled, then by Standby's daily allowance.",
            "actual": null,
            "remedy": remedy_code.map(|r| r.replace('_', " ")),
        },
    })
}
