//! Admin calls on coding plans: set (`PUT`), read (`GET`) and clear (`DELETE`)
//! `/admin/v1/workspaces/{ws}/plan`. Setting a plan keeps the counters of an existing one (a
//! tier change does not refill windows); a new plan starts with empty windows.

use serde_json::{Value, json};

use super::fields::Fields;
use super::{AdminApp, AdminError, json_response};
use tollgate::money::plans::decide::windows;
use tollgate::money::plans::{PlanRecord, PlanTerms, Status, Tier};
use tollgate::runtime::clock::{Millis, iso, now_ms};

type Answer = Result<http::Response<Vec<u8>>, AdminError>;

fn ledger(app: &AdminApp) -> Result<&std::sync::Arc<dyn tollgate::store::ledger::LedgerStore>, AdminError> {
    app.ledger.as_ref().ok_or_else(|| AdminError::new(503, "ledger_not_configured", "no ledger store is configured"))
}

/// The plan state an operator sees: terms, serving, and the windows as stored now.
fn plan_json(app: &AdminApp, ws: &str, mut rec: PlanRecord, now: Millis) -> Value {
    rec.counters.roll(rec.terms.started_at, now);
    let t = &rec.terms;
    let c = &rec.counters;
    let limits = app.live.current().gateway.plans.limits(t.tier);
    let [five, week] = windows(c, &limits);
    json!({
        "workspace_id": ws,
        "tier": t.tier.as_str(),
        "interval": "month",
        "status": t.status.as_str(),
        "serving": t.serving(now),
        "price_cents": t.tier.price_cents(),
        "started_at": iso(t.started_at),
        "cancel_at": t.cancel_at.map(iso),
        "grace_until": t.grace_until.map(iso),
        "credits_after_limits": { "enabled": t.credits_enabled, "cap_cents": t.cap_cents },
        "pending_change": t.pending_tier.map(|p| json!({ "tier": p.as_str(), "effective_at": t.pending_effective_at.map(iso) })),
        "five_hour": { "started_at": c.five_hour_start.map(iso), "used_microcents": five.used, "limit_microcents": five.limit },
        "week": { "started_at": iso(c.week_start), "used_microcents": week.used, "limit_microcents": week.limit },
        "standby_day": { "used_microcents": c.standby_used, "limit_microcents": limits.standby_day_microcents },
        "pending_microcents": { "plan": c.plan_pending, "standby": c.standby_pending, "credits": c.credits_pending },
        "running": { "plan": c.plan_running, "standby": c.standby_running },
    })
}

/// `credits_after_limits: {"enabled": bool, "cap_cents": int|null}`.
fn credits_after_limits(body: &Value) -> Result<(bool, Option<i64>), AdminError> {
    let Some(v) = body.get("credits_after_limits") else { return Ok((false, None)) };
    if v.is_null() {
        return Ok((false, None));
    }
    let f = Fields::new(v, &["enabled", "cap_cents"])
        .map_err(|_| AdminError::bad("credits_after_limits", "must be an object with `enabled` and `cap_cents`"))?;
    let enabled = f.bool("enabled")?.ok_or_else(|| AdminError::bad("credits_after_limits.enabled", "is required"))?;
    let cap = f.int("cap_cents", 0, 100_000_000)?;
    Ok((enabled, cap))
}

fn terms_of(body: &Value, now: Millis, existing: Option<&PlanTerms>) -> Result<PlanTerms, AdminError> {
    let f = Fields::new(
        body,
        &["tier", "status", "credits_after_limits", "started_at", "cancel_at", "grace_until", "pending_change"],
    )?;
    let tier = f.one_of("tier", &["starter", "pro", "team"])?.and_then(Tier::parse);
    let tier = tier.ok_or_else(|| AdminError::bad("tier", "is required (starter, pro or team)"))?;
    let status = f.one_of("status", &Status::NAMES)?.and_then(Status::parse);
    let status = status
        .ok_or_else(|| AdminError::bad("status", "is required (active, past_due, unpaid, disputed or canceled)"))?;
    let (credits_enabled, cap_cents) = credits_after_limits(body)?;
    let grace_until = f.instant("grace_until")?;
    if status == Status::PastDue && grace_until.is_none() {
        return Err(AdminError::bad("grace_until", "is required with status past_due (the plan serves until then)"));
    }
    let (pending_tier, pending_effective_at) = match body.get("pending_change").filter(|v| !v.is_null()) {
        None => (None, None),
        Some(v) => {
            let p = Fields::new(v, &["tier", "effective_at"])
                .map_err(|_| AdminError::bad("pending_change", "must be an object with `tier` and `effective_at`"))?;
            let tier = p.one_of("tier", &["starter", "pro", "team"])?.and_then(Tier::parse);
            let tier = tier.ok_or_else(|| AdminError::bad("pending_change.tier", "is required"))?;
            (Some(tier), p.instant("effective_at")?)
        }
    };
    Ok(PlanTerms {
        tier,
        status,
        started_at: f.instant("started_at")?.or(existing.map(|t| t.started_at)).unwrap_or(now),
        cancel_at: f.instant("cancel_at")?,
        grace_until,
        credits_enabled,
        cap_cents,
        pending_tier,
        pending_effective_at,
    })
}

pub(super) async fn put(app: &AdminApp, ws: &str, body: &Value) -> Answer {
    let l = ledger(app)?;
    let now = now_ms();
    let existing = l.plan(ws).await.map_err(AdminError::store)?;
    let terms = terms_of(body, now, existing.as_ref().map(|p| &p.terms))?;
    let rec = l
        .set_plan(ws, &terms, now)
        .await
        .map_err(AdminError::store)?
        .ok_or_else(|| AdminError::not_found("workspace"))?;
    Ok(json_response(200, &plan_json(app, ws, rec, now)))
}

pub(super) async fn get(app: &AdminApp, ws: &str) -> Answer {
    let rec = ledger(app)?.plan(ws).await.map_err(AdminError::store)?.ok_or_else(|| AdminError::not_found("plan"))?;
    Ok(json_response(200, &plan_json(app, ws, rec, now_ms())))
}

pub(super) async fn delete(app: &AdminApp, ws: &str) -> Answer {
    if !ledger(app)?.clear_plan(ws).await.map_err(AdminError::store)? {
        return Err(AdminError::not_found("plan"));
    }
    Ok(json_response(200, &json!({ "workspace_id": ws, "plan": null })))
}
