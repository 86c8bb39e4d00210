//! The funding decision as the caller sees it: what the request asks of the ledger, the
//! funding headers of an admission, and the refusals (`402 plan_limit_reached` with its
//! fields, the plan 429s, `402 insufficient_credits` naming a plan that is not paying).

use tollgate::http::error::{ErrorKind, GatewayError};
use tollgate::http::routes::Route;
use tollgate::money::plans::decide::{Funding, Refusal, limiting_window};
use tollgate::money::plans::view::{PlanSeen, credits_json, fixes, funding_headers};
use tollgate::money::plans::{DAY_MS, Status};
use tollgate::money::usage::PaidFrom;
use tollgate::money::{MICROCENTS_PER_CENT, Microcents};
use tollgate::proxy::ctx::RequestCtx;
use tollgate::runtime::clock::utc_month_bounds;
use tollgate::runtime::clock::{Millis, iso};
use tollgate::store::ledger::ops::FundRefusal;

use super::refusals::store_down;
use super::{Billing, DEFAULT_OUTPUT_CEILING, forwarded};

/// The covered operation categories (spec "What the service does" item 4): `chat` (chat
/// completions, messages, Responses), `embeddings` and `rerank`. Images and audio stay
/// pay-as-you-go on credits.
pub fn covered(route: Option<Route>) -> bool {
    matches!(
        route,
        Some(Route::ChatCompletions | Route::Messages | Route::Responses | Route::Embeddings | Route::Rerank)
    )
}

/// Record an admitted request's funding in the context: who pays (for the usage object) and
/// the funding headers when a plan decision applied.
pub fn apply(cx: &mut RequestCtx, funding: Funding, plan: Option<&PlanSeen>) {
    cx.paid_from = match funding {
        Funding::Plan => Some(PaidFrom::Plan),
        Funding::Standby => Some(PaidFrom::Standby),
        Funding::Credits | Funding::PayAsYouGo => None,
    };
    if let (Some(seen), false) = (plan, funding == Funding::PayAsYouGo) {
        cx.response_headers.extend(funding_headers(funding, seen));
    }
}

/// The refusal of a funding decision as the error the client gets.
pub fn refusal(r: FundRefusal, plan: Option<&PlanSeen>, topup_url: &str, hold: i64, now: Millis) -> GatewayError {
    match r {
        FundRefusal::Insufficient { balance_cents } => insufficient(balance_cents, hold, topup_url, plan, now),
        // Billing answers this one with the key's own reading (limit, spend, reset).
        FundRefusal::KeyLimit => GatewayError::internal("a key-limit refusal without the key's reading"),
        FundRefusal::Plan(r) => {
            let err = match r {
                Refusal::LimitReached { .. } => return limit_reached(r, plan, now),
                Refusal::WindowBusy => GatewayError::new(
                    ErrorKind::PlanWindowBusy,
                    "Running requests hold the rest of the plan's window; the gateway waited for room. Retry shortly.",
                ),
                Refusal::PlanConcurrency => GatewayError::new(
                    ErrorKind::HostedPlanConcurrencyLimit,
                    "The workspace has as many plan-funded requests running as its plan allows; retry when one finishes.",
                ),
                Refusal::StandbyWorkspace => GatewayError::new(
                    ErrorKind::HostedStandbyWorkspaceLimit,
                    "The workspace has as many Standby requests running as Standby allows; retry when one finishes.",
                ),
                Refusal::StandbyPressure => GatewayError::new(
                    ErrorKind::HostedStandbyPressure,
                    "Standby is paused on this model while it is under load; retry when load drops.",
                ),
            };
            // These clear when a running request finishes: ask again in a second.
            refused_headers(err.with_retry_after(1), plan)
        }
    }
}

/// A refusal after the funding decision (Standby capacity) with the plan's refused headers.
pub fn with_refused_headers(err: GatewayError, plan: Option<&PlanSeen>) -> GatewayError {
    refused_headers(err, plan)
}

/// The funding headers of a refusal: `x-service-funding: refused` and the plan's state.
fn refused_headers(mut err: GatewayError, plan: Option<&PlanSeen>) -> GatewayError {
    if let Some(seen) = plan {
        for (name, value) in funding_headers(Funding::Plan, seen) {
            err = err.with_header(name, if name == "x-service-funding" { "refused".to_string() } else { value });
        }
    }
    err
}

/// `402 plan_limit_reached`: every field of the spec, a message that stands on its own (the
/// messages envelope keeps only the message).
fn limit_reached(r: Refusal, plan: Option<&PlanSeen>, now: Millis) -> GatewayError {
    let (Refusal::LimitReached { credits, standby }, Some(seen)) = (r, plan) else {
        return GatewayError::internal("plan refusal without a plan");
    };
    let c = &seen.record.counters;
    let window = limiting_window(c, &seen.limits, now);
    let (limit, resets_at, used, cap) = window
        .map_or(("five_hour", None, 0, seen.limits.five_hour_microcents), |w| (w.name, w.resets_at, w.used, w.limit));
    let standby_resets = c.day_start + DAY_MS;
    let message = format!(
        "The coding plan's {} limit is reached{}; credits after limits cannot pay ({}) and Standby cannot pay ({}, refills at {}). {}",
        if limit == "five_hour" { "5-hour" } else { "weekly" },
        resets_at.map(|t| format!(" until {}", iso(t))).unwrap_or_default(),
        credits.as_str().replace('_', " "),
        standby.as_str(),
        iso(standby_resets),
        "Enable or raise credits after limits, add funds, or wait for the reset.",
    );
    let err = GatewayError::new(ErrorKind::PlanLimitReached, message)
        .with_field("limit", limit)
        .with_field("resets_at", resets_at.map(iso))
        .with_field("tier", seen.record.terms.tier.as_str())
        .with_field("used_microcents", used)
        .with_field("limit_microcents", cap)
        .with_field("pending_microcents", c.plan_pending)
        .with_field("standby_resets_at", iso(standby_resets))
        .with_field("standby_blocker", standby.as_str())
        .with_field("credits", credits_json(seen, Some(credits)))
        .with_field("fixes", fixes(credits, standby))
        .with_header("x-should-retry", "false");
    refused_headers(err, plan)
}

/// `402 insufficient_credits`; when a plan exists but is not paying, the message ends with
/// its state and the next step.
fn insufficient(balance: i64, hold: i64, topup_url: &str, plan: Option<&PlanSeen>, now: Millis) -> GatewayError {
    let mut message = if balance >= hold {
        // The balance as shown covers the hold, but the ledger refused it again and again:
        // another instance's lease was not given back in time (decisions 190, 191), or
        // running requests kept taking what others freed.
        format!(
            "Running requests and other gateway instances hold part of the balance, so it cannot cover this request's reservation of {hold} cents now; retry in a few seconds or add at least {hold} cents."
        )
    } else {
        format!(
            "The balance cannot cover this request's reservation of {hold} cents; add at least {} cents.",
            hold - balance
        )
    };
    if let Some(seen) = plan.filter(|s| !s.record.terms.serving(now)) {
        let t = &seen.record.terms;
        let step = match t.status {
            Status::PastDue | Status::Unpaid => "pay the outstanding invoice to resume it",
            Status::Disputed => "a payment dispute holds it; contact support",
            Status::Canceled => "it was canceled; subscribe again to resume it",
            Status::Active => "its cancellation took effect; subscribe again to resume it",
        };
        message.push_str(&format!(
            " The {} coding plan is not paying ({}): {step}.",
            t.tier.as_str(),
            t.status.as_str()
        ));
    }
    GatewayError::new(ErrorKind::InsufficientCredits, message)
        .with_field("required_cents", hold)
        .with_field("current_balance_cents", balance)
        .with_field("topup_url", topup_url.to_string())
}

impl Billing {
    /// A balance refusal names the balance `GET /v1/credits` shows (the spec: "same as the
    /// balance endpoint"): read as that read does, unused leases added back (decision 190);
    /// when it cannot be read, the balance the ledger refused against. With it, how many
    /// cents unused leases (of any instance) keep.
    pub(super) async fn as_shown(&self, r: FundRefusal, workspace_id: &str) -> (FundRefusal, i64) {
        match r {
            FundRefusal::Insufficient { balance_cents } => {
                match self.ledger.balance_and_unused_leases(workspace_id).await {
                    Ok(Some((stored, leased))) => {
                        let shown = stored.with_lease_unused(leased);
                        (FundRefusal::Insufficient { balance_cents: shown.balance_cents }, leased)
                    }
                    _ => (FundRefusal::Insufficient { balance_cents }, 0),
                }
            }
            other => (other, 0),
        }
    }

    /// The most the request may cost (clarification 12): its value in microcents, and the
    /// credit hold in whole cents (rounded up: the hold must cover the cost).
    pub(super) fn estimate(cx: &RequestCtx) -> (Microcents, i64) {
        let Some(pricing) = cx.model().and_then(|m| m.pricing_at(cx.arrived_ms)) else { return (Microcents::ZERO, 0) };
        let ceiling = if forwarded::is_forwarded(cx.route) {
            forwarded::output_ceiling(cx.route, cx.model().map(|m| &**m), DEFAULT_OUTPUT_CEILING)
        } else {
            cx.chat_request
                .output_ceiling
                .or(cx.model().and_then(|m| m.max_output_tokens))
                .unwrap_or(DEFAULT_OUTPUT_CEILING)
        };
        let value = tollgate::money::usage::cost_microcents(Some(&pricing), cx.prompt_estimate, 0, ceiling);
        (value, value.ceil_cents().0)
    }

    /// The key's monthly spending limit, when it is reached: the refusal pay-as-you-go
    /// requests get (on a serving plan it only blocks credits after limits).
    pub(super) async fn key_limit(
        &self,
        p: &tollgate::identity::Principal,
        now: Millis,
    ) -> Result<Option<GatewayError>, GatewayError> {
        let Some(limit) = p.monthly_spend_limit_cents else { return Ok(None) };
        let (_, next_month, month) = utc_month_bounds(now);
        let spent = self.ledger.key_month_spend(&p.key_id, &month).await.map_err(store_down)?;
        if spent < limit.saturating_mul(MICROCENTS_PER_CENT) {
            return Ok(None);
        }
        Ok(Some(
            GatewayError::new(
                ErrorKind::SpendLimitReached,
                "This key reached its monthly spending limit; it resets at the start of the next UTC month.",
            )
            .with_field("limit_cents", limit)
            .with_field("spent_cents", spent / MICROCENTS_PER_CENT)
            .with_field("resets_at", iso(next_month)),
        ))
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    /// A balance that covers the hold as shown (leases or running requests kept it from the
    /// ledger, decision 191) says so, not "add 0 cents"; one that does not names the shortfall.
    #[test]
    fn an_insufficient_balance_names_the_shortfall_or_what_holds_the_rest() {
        let short = insufficient(30, 100, "https://pay.example.com", None, 0);
        assert!(short.message.contains("add at least 70 cents"), "{}", short.message);
        let held = insufficient(120, 100, "https://pay.example.com", None, 0);
        let m = &held.message;
        assert!(m.contains("Running requests and other gateway instances hold part of the balance"), "{m}");
        assert!(m.contains("add at least 100 cents") && !m.contains("add at least -"), "{m}");
    }
}
