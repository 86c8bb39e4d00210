//! Rate limits and hosted admission (spec "Rate limit layers" (2) and (3)).
//!
//! Every authenticated request counts in its key's sliding 60-second window. On the routes
//! that reach a replica (chat completions, Responses, messages, and the forwarded embeddings,
//! rerank, audio and image routes) the window is checked together
//! with the admission gates, after the dialect has validated the request and estimated its
//! tokens: one limiter call, one Redis round trip. Other routes (model reads, credits, usage,
//! count_tokens) are counted when their headers arrive. A generation request refused before
//! admission (a 400, a 402) is counted in the log phase, so every request spends quota.
//!
//! Admission order: per-key concurrency (enforced only while the model is busy), workspace
//! concurrency, large-prompt shed, shared-model concurrency, workspace tokens per minute.
//! The lease taken is renewed while the request runs and released in the log phase.

pub mod policy;
mod refusals;

use std::sync::Arc;

use async_trait::async_trait;
use pingora::proxy::Session;
use pingora_limits::inflight::Inflight;
use serde_json::{Map, Value, json};

use tollgate::config::{LimitSettings, ModelEntry};
use tollgate::http::error::{ErrorKind, GatewayError};
use tollgate::http::routes::Route;
use tollgate::identity::Principal;
use tollgate::proxy::ctx::RequestCtx;
use tollgate::proxy::plugin::{Flow, Plugin};
use tollgate::runtime::clock::now_ms;
use tollgate::state::limits::{
    Check, ConcurrencyGate, FallbackLimiter, Held, LeaseKeeper, LimiterError, TokenBudget, Verdict, WindowLimit,
};

use policy::{BusyReadings, in_force};
use refusals::Scope;
pub use refusals::gate_refused;

/// After authentication (500) and the dialects (300, 200: the token estimate is known),
/// before billing places its hold (100): a refused request never holds credit.
pub const LIMITS_PRIORITY: i16 = 150;

pub struct Limits {
    settings: LimitSettings,
    store: Arc<FallbackLimiter>,
    keeper: Arc<LeaseKeeper>,
    busy: BusyReadings,
    /// `pingora-limits` in-flight counter of admission checks waiting on the store.
    pending: Inflight,
}

/// The key's window has been checked for this request.
struct Counted;

/// The concurrency lease of an admitted request.
struct Admission(Option<Held>);

/// Routes placed on a replica, checked by admission.
/// The routes that reach a replica (count_tokens is answered by the gateway).
fn admitted_route(route: Route) -> bool {
    route.is_inference() && route != Route::CountTokens
}

fn store_error(e: LimiterError, admission: bool, request_id: &str) -> GatewayError {
    match e {
        LimiterError::NotConfigured => {
            GatewayError::new(ErrorKind::LimiterUnavailable, "No rate-limit store is configured on this gateway.")
        }
        LimiterError::Unavailable(m) => {
            log::warn!("{request_id}: limiter store unavailable: {m}");
            if admission {
                GatewayError::new(ErrorKind::HostedAdmissionUnavailable, "Capacity admission could not complete.")
            } else {
                GatewayError::new(ErrorKind::LimiterUnavailable, "The rate limit could not be evaluated.")
            }
        }
        LimiterError::Invalid(m) => GatewayError::internal(format!("invalid limiter check: {m}")),
        // Only gated checks wait for the recovery; windows-only checks are counted at once.
        LimiterError::Recovering { retry_after_ms } => {
            log::info!("{request_id}: limiter store recovering from a data loss ({retry_after_ms} ms more)");
            GatewayError::new(
                ErrorKind::HostedAdmissionUnavailable,
                "Capacity admission is recovering from a rate-limit store restart; retry shortly.",
            )
        }
    }
}

/// The one key of the pending-admissions counter.
const PENDING: &str = "admissions";

impl Limits {
    pub fn new(settings: LimitSettings, store: Arc<FallbackLimiter>, models: &[Arc<ModelEntry>]) -> Self {
        let keeper = LeaseKeeper::new(store.clone(), settings.lease_ttl);
        let busy = BusyReadings::new(models.iter().map(|m| m.id.as_str()));
        Limits { settings, store, keeper, busy, pending: Inflight::new() }
    }

    fn key_window(&self, p: &Principal) -> WindowLimit {
        WindowLimit { key: ["k:", &p.key_id].concat(), limit: policy::requests_per_minute(&self.settings, p) }
    }

    /// The window-only check of routes without admission.
    async fn count_window(&self, cx: &mut RequestCtx, route: Route) -> Result<(), GatewayError> {
        let Some(p) = cx.principal.as_ref() else { return Ok(()) };
        let mut windows = vec![self.key_window(p)];
        // Each read endpoint has its own 60-a-minute bucket (decision 112).
        let bucket = match route {
            Route::Credits => Some("rc"),
            Route::Usage => Some("ru"),
            _ => None,
        };
        if let Some(b) = bucket {
            windows.push(WindowLimit { key: format!("{b}:{}", p.key_id), limit: self.settings.reads_per_minute });
        }
        let check = Check::windows_only(now_ms(), windows);
        let tier = p.tier();
        cx.ext.insert(Counted);
        let outcome = self.store.check(&check).await.map_err(|e| store_error(e, false, &cx.request_id))?;
        match outcome.verdict {
            Verdict::Admitted { windows, .. } => {
                if let Some(w) = windows.first() {
                    cx.response_headers.extend(refusals::window_headers(w, tier));
                }
                Ok(())
            }
            Verdict::WindowRefused { index, state, retry_after_ms } => {
                Err(refusals::window_refused(&state, tier, retry_after_ms, index == 1))
            }
            other => Err(GatewayError::internal(format!("unexpected limiter verdict {other:?}"))),
        }
    }

    async fn admit(&self, cx: &mut RequestCtx) -> Result<(), GatewayError> {
        let (Some(p), Some(model), Some(pool)) = (cx.principal.as_ref(), cx.model().cloned(), cx.pool().cloned())
        else {
            return Ok(());
        };
        // Admission checks waiting on the store on this instance (the guard leaves on drop).
        let (_pending, waiting) = self.pending.incr(PENDING, 1);
        if u64::try_from(waiting).unwrap_or(0) > self.settings.max_pending_admissions {
            return Err(refusals::congested());
        }
        let now = now_ms();
        let f = in_force(&self.settings, &model, &pool, p);
        let busy = self.busy.is_busy(&model.id, f.busy_at, now);
        let shared_key = ["m:", &model.id].concat();
        let per_key_limit = if busy { f.per_key_concurrency } else { u64::MAX };
        // At most four gates; their scopes beside them, to name a refusal (a gate past the
        // fourth would be refused as an internal error, never unnamed).
        let mut gates = Vec::with_capacity(4);
        let mut scopes = [Scope::PerKey; 4];
        let mut gate = |scope: Scope, key: String, limit: u64| {
            if let Some(slot) = scopes.get_mut(gates.len()) {
                *slot = scope;
            }
            gates.push(ConcurrencyGate { scope: scope.name(), key, limit });
        };
        gate(Scope::PerKey, ["pk:", &model.id, ":", &p.key_id].concat(), per_key_limit);
        gate(Scope::Workspace, ["w:", &p.workspace_id].concat(), f.workspace_concurrency);
        if cx.prompt_estimate >= self.settings.large_prompt_tokens {
            let shed_at = (f.shared_concurrency * self.settings.large_prompt_shed_percent / 100).max(1);
            gate(Scope::LargePrompt, shared_key.clone(), shed_at);
        }
        let shared_scope = if f.shared_declared { Scope::SharedModel } else { Scope::Capacity };
        gate(shared_scope, shared_key, f.shared_concurrency);
        let ceiling = cx.chat_request.output_ceiling;
        let tokens = cx.prompt_estimate.saturating_add(ceiling.unwrap_or(0));
        let shared_index = gates.len() - 1;
        let check = Check {
            now_ms: now,
            windows: vec![self.key_window(p)],
            gates,
            tpm: f.tokens_per_minute.map(|limit| TokenBudget {
                key: ["t:", &model.id, ":", &p.workspace_id].concat(),
                tokens,
                limit,
            }),
            lease_id: cx.request_id.as_str().into(),
            lease_ttl_ms: self.keeper.ttl_ms(),
        };
        let tier = p.tier();
        let outcome = self.store.check(&check).await.map_err(|e| store_error(e, true, &cx.request_id))?;
        match outcome.verdict {
            Verdict::Admitted { windows, gates_in_use, lease } => {
                cx.ext.insert(Counted);
                if let Some(w) = windows.first() {
                    cx.response_headers.extend(refusals::window_headers(w, tier));
                }
                if let Some(&n) = gates_in_use.get(shared_index) {
                    self.busy.record(&model.id, n, now);
                    cx.model_busy = n >= f.busy_at;
                }
                cx.ext.insert(Admission(lease.map(|l| self.keeper.hold(l))));
                Ok(())
            }
            Verdict::WindowRefused { state, retry_after_ms, .. } => {
                cx.ext.insert(Counted);
                Err(refusals::window_refused(&state, tier, retry_after_ms, false))
            }
            Verdict::GateRefused { index, in_use, retry_after_ms } => {
                let (Some(&scope), Some(gate)) = (scopes.get(index), check.gates.get(index)) else {
                    return Err(GatewayError::internal("limiter named a gate the check did not have"));
                };
                let limit = gate.limit;
                if index == shared_index {
                    self.busy.record(&model.id, in_use, now);
                }
                Err(refusals::admission_refused(scope, limit, Some(retry_after_ms)))
            }
            Verdict::TokensRefused { limit, retry_after_ms, never, .. } => Err(if never {
                refusals::tpm_never(limit, tokens)
            } else {
                refusals::admission_refused(Scope::WorkspaceTpm, limit, Some(retry_after_ms))
            }),
        }
    }

    /// Leases held by this instance now.
    pub fn live_leases(&self) -> usize {
        self.keeper.live_count()
    }
}

#[async_trait]
impl Plugin for Limits {
    fn name(&self) -> &'static str {
        "limits"
    }

    fn priority(&self) -> i16 {
        LIMITS_PRIORITY
    }

    async fn on_request_headers(&self, _s: &mut Session, cx: &mut RequestCtx) -> Result<Flow, GatewayError> {
        match cx.route {
            Some(route) if !admitted_route(route) => self.count_window(cx, route).await.map(|()| Flow::Continue),
            _ => Ok(Flow::Continue),
        }
    }

    fn request_span(&self) -> Option<&'static str> {
        Some("admission")
    }

    async fn on_request(&self, _s: &mut Session, cx: &mut RequestCtx) -> Result<Flow, GatewayError> {
        if cx.route.is_some_and(admitted_route) {
            self.admit(cx).await?;
        }
        Ok(Flow::Continue)
    }

    async fn on_log(&self, cx: &mut RequestCtx) {
        if let Some(Admission(held)) = cx.ext.get_mut::<Admission>() {
            if let Some(held) = held.take() {
                // Before the release: a reading taken after it no longer counts this request.
                if let Some(model) = cx.model() {
                    self.busy.ended(&model.id);
                }
                held.release().await;
            }
        }
        // A request refused before admission still spends quota (see the module comment).
        if let Some(route) = cx.route.filter(|&r| admitted_route(r)) {
            if cx.principal.is_some() && cx.ext.get::<Counted>().is_none() {
                if let Err(e) = self.count_window(cx, route).await {
                    log::debug!("{}: window count after refusal: {e}", cx.request_id);
                }
            }
        }
    }

    fn describe_model(&self, model: &ModelEntry, object: &mut Map<String, Value>, cx: &RequestCtx) {
        let (Some(p), Some(pool)) = (cx.principal.as_ref(), cx.config.pools.get(&model.id)) else { return };
        let f = in_force(&self.settings, model, pool, p);
        object.insert("max_concurrent_requests_per_api_key".into(), json!(f.per_key_concurrency));
        match f.tokens_per_minute {
            Some(t) => object.insert("max_tokens_per_minute_per_workspace".into(), json!(t)),
            None => object.remove("max_tokens_per_minute_per_workspace"),
        };
    }
}
