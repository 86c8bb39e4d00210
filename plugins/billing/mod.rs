//! Billing: the frozen-account check, then the funding decision with its hold before
//! inference (one ledger write: plan, credits after limits, Standby or refused on a serving
//! coding plan, else pay-as-you-go credits), settlement of the delivered usage in the log
//! phase (exactly once, per request id), and the reads `GET /v1/credits` and `GET /v1/usage`.

mod credits_read;
mod finish;
mod forwarded;
mod funding;
mod refusals;
mod standby;
mod usage_read;

use finish::Finish;
use forwarded::Forwarded;
use refusals::{hold_failed, ledger_shed, with_free_window};

use std::sync::Arc;

use async_trait::async_trait;
use bytes::Bytes;
use pingora::proxy::Session;
use serde_json::json;

use tollgate::http::error::{ErrorKind, GatewayError};
use tollgate::http::routes::Route;
use tollgate::money::Microcents;
use tollgate::money::plans::PlanSettings;
use tollgate::money::plans::decide::{FundAsk, Funding, Refusal};
use tollgate::proxy::ctx::RequestCtx;
use tollgate::proxy::plugin::{Flow, Plugin};
use tollgate::runtime::clock::{Millis, now_ms, utc_month_bounds};
use tollgate::store::ledger::ops::{FundOp, FundRefusal};
use tollgate::store::ledger::{LedgerStore, Settlement};

pub const BILLING_PRIORITY: i16 = 100;
/// Output ceiling used for the hold when neither the request nor the model gives one (C12).
const DEFAULT_OUTPUT_CEILING: u64 = 4096;

pub struct Billing {
    ledger: Arc<dyn LedgerStore>,
    topup_url: String,
    hold_ttl_ms: Millis,
    plans: Arc<PlanSettings>,
    /// Standby's capacity across workspaces (on the shared limiter).
    standby: Option<standby::StandbyGate>,
}

/// What this plugin placed for a request.
#[derive(Debug, Clone, Copy)]
struct Hold {
    cents: i64,
    funding: Funding,
}

/// How often a request waiting for room in a plan window asks again.
const WINDOW_POLL: std::time::Duration = std::time::Duration::from_millis(250);
/// A hold refused while leases keep the money it needs is asked again this often, for at most
/// [`RECALL_WAIT`]: the refusal recalled the leases, and each is given back within a second and
/// a quarter of its grant (decision 191).
const RECALL_POLL: std::time::Duration = std::time::Duration::from_millis(200);
/// The longest a refused request waits for recalled leases, from its first ask.
const RECALL_WAIT: std::time::Duration = std::time::Duration::from_millis(3_000);
/// A hold refused while running requests held the money it needs, freed by the time the
/// balance is read, is asked again at once this many times at most.
const FREED_RETRIES: u32 = 2;

impl Billing {
    /// `hold_ttl_ms`: the response budget plus the configured margin; past it an open hold
    /// belongs to a request whose gateway died, and the sweeper releases it.
    pub fn new(ledger: Arc<dyn LedgerStore>, topup_url: String, hold_ttl_ms: Millis, plans: Arc<PlanSettings>) -> Self {
        Billing { ledger, topup_url, hold_ttl_ms, plans, standby: None }
    }

    /// Count Standby requests per model on this limiter store (shared by every instance).
    pub fn with_standby_capacity(
        mut self,
        store: Arc<tollgate::state::limits::FallbackLimiter>,
        lease_ttl: std::time::Duration,
    ) -> Self {
        self.standby = Some(standby::StandbyGate::new(store, lease_ttl));
        self
    }
}

#[async_trait]
impl Plugin for Billing {
    fn name(&self) -> &'static str {
        "billing"
    }

    fn priority(&self) -> i16 {
        BILLING_PRIORITY
    }

    async fn on_request_headers(&self, s: &mut Session, cx: &mut RequestCtx) -> Result<Flow, GatewayError> {
        if cx.route == Some(Route::Credits) && cx.principal.is_some() {
            credits_read::read(self, s, cx).await?;
            return Ok(Flow::Handled);
        }
        if cx.route == Some(Route::Usage) && cx.principal.is_some() {
            usage_read::snapshot(self, s, cx).await?;
            return Ok(Flow::Handled);
        }
        // A request the ledger would shed is refused before its body is read and parsed, so
        // clients that retry at once cost as little as possible (decision 131).
        let billed = cx.route.is_some_and(|r| r.is_generation() && r != Route::CountTokens);
        if billed && cx.principal.as_ref().is_some_and(|p| p.frozen.is_none()) {
            if let Some(wait) = self.ledger.congested() {
                return Err(ledger_shed(&cx.request_id, &format_args!("writes wait {} ms", wait.as_millis())));
            }
        }
        Ok(Flow::Continue)
    }

    fn request_span(&self) -> Option<&'static str> {
        Some("ledger hold")
    }

    async fn on_request(&self, _s: &mut Session, cx: &mut RequestCtx) -> Result<Flow, GatewayError> {
        let Some(p) = cx.principal.clone() else { return Ok(Flow::Continue) };
        if cx.route == Some(Route::CountTokens) {
            return Ok(Flow::Continue); // not billed
        }
        if let Some(reason) = &p.frozen {
            let why = if reason == "dispute" {
                "A payment dispute holds this account; credits do not lift a dispute hold. Contact support."
            } else {
                "An unpaid bill freezes this account; pay it to resume."
            };
            return Err(with_free_window(GatewayError::new(ErrorKind::AccountFrozen, why), cx));
        }
        let now = now_ms();
        let key_limit = self.key_limit(&p, now).await?;
        let (value, hold) = Self::estimate(cx);
        if hold == 0 {
            // Nothing to reserve (a free window or an unpriced model): pay-as-you-go controls.
            return key_limit.map_or(Ok(Flow::Continue), Err);
        }
        let ask = FundAsk {
            value_microcents: value.as_i64(),
            hold_cents: hold,
            credits_only: p.credits_only,
            key_limit_reached: key_limit.is_some(),
            covered: funding::covered(cx.route),
            standby_pressure: cx.model_busy,
            standby_closed: match (cx.model(), cx.pool()) {
                (Some(m), Some(pool)) => standby::capacity(m, pool) == 0,
                _ => false,
            },
        };
        let started = std::time::Instant::now();
        let deadline = started + self.plans.window_wait;
        let mut freed_retries = 0;
        loop {
            let now = now_ms();
            let op = FundOp {
                request_id: cx.request_id.clone(),
                workspace_id: p.workspace_id.clone(),
                key_id: Some(p.key_id.clone()),
                ask,
                settings: self.plans.clone(),
                expires_at: now + self.hold_ttl_ms,
                now,
            };
            let mut funded = self.ledger.fund(op).await;
            if funded.is_ok() && tollgate::runtime::faults::reply_lost("hold") {
                funded = Err(tollgate::store::StoreError::Unavailable("the hold's answer was lost (fault)".into()));
            }
            let out = match funded {
                Ok(out) => out,
                Err(e) => {
                    self.release_unanswered_hold(&cx.request_id, &e);
                    return Err(hold_failed(&cx.request_id, e));
                }
            };
            match out.verdict {
                Ok(f) => {
                    if let (Funding::Standby, Some(gate)) = (f, &self.standby) {
                        if let Err(e) = gate.take(cx).await {
                            // The ledger counted it: take it out again (nothing was used).
                            if let Err(le) = self.ledger.release_hold(&cx.request_id, now_ms()).await {
                                log::warn!("{}: Standby hold not released ({le}); the sweeper frees it", cx.request_id);
                            }
                            return Err(funding::with_refused_headers(e, out.plan.as_ref()));
                        }
                    }
                    funding::apply(cx, f, out.plan.as_ref());
                    let cents = if matches!(f, Funding::Plan | Funding::Standby) { 0 } else { hold };
                    cx.ext.insert(Hold { cents, funding: f });
                    tollgate::observe::metrics::holds_moved(1);
                    return Ok(Flow::Continue);
                }
                // Running requests hold the rest of a window: wait for room, up to the limit.
                Err(FundRefusal::Plan(Refusal::WindowBusy)) if std::time::Instant::now() < deadline => {
                    let left = deadline.saturating_duration_since(std::time::Instant::now());
                    tokio::time::sleep(left.min(WINDOW_POLL)).await;
                }
                Err(FundRefusal::KeyLimit) => {
                    return Err(key_limit.unwrap_or_else(|| GatewayError::internal("key limit without a reading")));
                }
                Err(r) => {
                    let (r, leased) = self.as_shown(r, &p.workspace_id).await;
                    // The balance as shown covers the hold now (decision 191). With leases
                    // keeping part of it, the refusal recalled them: ask again once they are
                    // given back. Without, holds that ended since the refusal freed it: ask
                    // again at once, a few times at most.
                    let covered = matches!(r, FundRefusal::Insufficient { balance_cents } if balance_cents >= hold);
                    if covered && started.elapsed() < RECALL_WAIT && (leased > 0 || freed_retries < FREED_RETRIES) {
                        if leased > 0 {
                            tokio::time::sleep(RECALL_POLL).await;
                        } else {
                            freed_retries += 1;
                        }
                        continue;
                    }
                    let err = funding::refusal(r, out.plan.as_ref(), &self.topup_url, hold, now);
                    return Err(if matches!(r, FundRefusal::Insufficient { .. }) {
                        with_free_window(err, cx)
                    } else {
                        err
                    });
                }
            }
        }
    }

    /// While the caller's workspace plan serves, a covered (priced chat, embeddings or rerank)
    /// model publishes the plan concurrency per workspace, and a chat model the Standby
    /// concurrency beside it (so `GET /v1/models` depends on the caller).
    fn describe_model(
        &self,
        model: &tollgate::config::ModelEntry,
        object: &mut serde_json::Map<String, serde_json::Value>,
        cx: &RequestCtx,
    ) {
        let now = now_ms();
        let Some(tier) = cx.principal.as_ref().and_then(|p| p.plan).and_then(|b| b.serving_tier(now)) else { return };
        let chat = ["chat_completions", "messages", "responses"].iter().any(|e| model.supports(e));
        let covered = chat || ["embeddings", "rerank"].iter().any(|e| model.supports(e));
        if !covered || model.pricing_at(now).is_none() {
            return;
        }
        let limits = self.plans.limits(tier);
        object.insert("max_concurrent_plan_requests_per_workspace".into(), json!(limits.plan_concurrency));
        if !chat {
            return;
        }
        let closed = cx.config.pools.get(&model.id).is_some_and(|pool| standby::capacity(model, pool) == 0);
        let standby = if closed { 0 } else { limits.standby_concurrency };
        object.insert("max_concurrent_standby_requests_per_workspace".into(), json!(standby));
    }

    fn on_response_header(
        &self,
        resp: &mut pingora::http::ResponseHeader,
        cx: &mut RequestCtx,
    ) -> Result<(), GatewayError> {
        if forwarded::is_forwarded(cx.route) && resp.status.is_success() && cx.principal.is_some() {
            cx.ext.insert(Forwarded::new(resp.headers.get(http::header::CONTENT_TYPE).map(|v| v.as_bytes())));
        }
        Ok(())
    }

    fn on_response_chunk(&self, body: &mut Option<Bytes>, eos: bool, cx: &mut RequestCtx) -> Result<(), GatewayError> {
        if !forwarded::is_forwarded(cx.route) {
            return Ok(()); // the chat pipeline reads the usage of generation routes
        }
        let Some(f) = cx.ext.get_mut::<Forwarded>() else { return Ok(()) };
        f.push(body.as_ref(), eos);
        if eos {
            // The usage is known at the end of the answer, so every log hook sees it, as the
            // chat pipeline's (decision 153).
            let answer = std::mem::take(f);
            if let Some(m) = cx.model() {
                if let Some(u) = answer.figures(m, cx.arrived_ms, cx.prompt_estimate) {
                    cx.usage.report(u.paid_by(cx.paid_from));
                }
            }
        }
        Ok(())
    }

    async fn on_log(&self, cx: &mut RequestCtx) {
        standby::StandbyGate::release(cx).await;
        let Some(p) = cx.principal.as_ref() else { return };
        let held = cx.ext.get::<Hold>().copied();
        let cost = cx.usage.figures().map(|u| u.cost).unwrap_or_default();
        // A plan-paid request costs 0 but meters its value: settle it too.
        let value = cx.usage.figures().map(|u| u.value()).unwrap_or_default();
        let now = now_ms();
        let action = match (cx.usage.figures().is_some() && value > Microcents::ZERO, held) {
            // Something billable was delivered: settle (releases the hold in the same step).
            (true, _) => {
                let (_, _, month) = utc_month_bounds(now);
                Finish::Settle(Settlement {
                    request_id: cx.request_id.clone(),
                    workspace_id: p.workspace_id.clone(),
                    key_id: Some(p.key_id.clone()),
                    cost,
                    value,
                    now,
                    month,
                })
            }
            // Nothing billable: release the hold, charge nothing.
            (false, Some(h)) => {
                log::debug!("{}: releasing a {} hold of {} cents", cx.request_id, h.funding.as_str(), h.cents);
                Finish::Release(cx.request_id.clone())
            }
            (false, None) => return,
        };
        let had_hold = held.is_some();
        // The client has its answer: the connection does not wait for the commit (decision
        // 128). The write is queued at once for the next group commit; until it commits, the
        // request's hold still counts against the balance, so nothing can overspend meanwhile.
        // Its outcome is read where the ledger commits it; only a failure starts a task here
        // (decision 139).
        let (ledger, request_id) = (self.ledger.clone(), cx.request_id.clone());
        let runtime = tokio::runtime::Handle::current();
        let op = action.op();
        // A graceful stop waits until the ledger recorded it (decision 166).
        let pending = tollgate::runtime::drain::left_behind();
        let done = Box::new(move |r: tollgate::store::ledger::ops::OpResult| match action.outcome(r) {
            Ok(()) => {
                drop(pending);
                if had_hold {
                    tollgate::observe::metrics::holds_moved(-1);
                }
            }
            Err(e) => {
                // Retried while the store is down: both steps are idempotent per request id,
                // so a retry never charges twice. If the process ends first, the sweeper
                // releases the hold after its expiry.
                log::warn!("{request_id}: settlement not recorded yet ({e}); retrying in the background");
                let ledger = ledger.clone();
                runtime.spawn(async move {
                    if action.retry(&*ledger).await && had_hold {
                        tollgate::observe::metrics::holds_moved(-1);
                    }
                    drop(pending);
                });
            }
        });
        self.ledger.clone().submit_detached(op, done);
    }
}
