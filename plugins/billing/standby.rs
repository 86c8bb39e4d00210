//! Standby's capacity across workspaces: at most a model's Standby capacity of Standby
//! requests run at once, whichever workspaces they come from. Held as a concurrency lease on
//! the shared limiter (Redis with several instances, in process on one node), taken only once
//! the ledger decided Standby pays, and released in the log phase.

use std::sync::Arc;

use tollgate::config::{ModelEntry, Pool};
use tollgate::http::error::{ErrorKind, GatewayError};
use tollgate::proxy::ctx::RequestCtx;
use tollgate::runtime::clock::now_ms;
use tollgate::state::limits::{Check, ConcurrencyGate, FallbackLimiter, Held, LeaseKeeper, Verdict};

pub struct StandbyGate {
    store: Arc<FallbackLimiter>,
    keeper: Arc<LeaseKeeper>,
}

/// In `cx.ext`: the Standby lease of a running Standby request.
struct StandbySlot(Option<Held>);

/// Standby requests at once on `model` across every workspace: declared, else a quarter of
/// the pool's capacity (decision 114).
pub fn capacity(model: &ModelEntry, pool: &Pool) -> u64 {
    model.max_concurrent_standby_requests.unwrap_or_else(|| (u64::from(pool.capacity()) / 4).max(1))
}

impl StandbyGate {
    pub fn new(store: Arc<FallbackLimiter>, ttl: std::time::Duration) -> Self {
        StandbyGate { keeper: LeaseKeeper::new(store.clone(), ttl), store }
    }

    /// Take a Standby slot on the request's model, or refuse with
    /// `429 hosted_standby_aggregate_limit`.
    pub async fn take(&self, cx: &mut RequestCtx) -> Result<(), GatewayError> {
        let (Some(model), Some(pool)) = (cx.model().cloned(), cx.pool().cloned()) else { return Ok(()) };
        let limit = capacity(&model, &pool);
        let check = Check {
            now_ms: now_ms(),
            windows: Vec::new(),
            gates: vec![ConcurrencyGate { scope: "standby_aggregate", key: format!("sb:{}", model.id), limit }],
            tpm: None,
            lease_id: format!("{}:standby", cx.request_id).into(),
            lease_ttl_ms: self.keeper.ttl_ms(),
        };
        let outcome = self.store.check(&check).await.map_err(|e| {
            log::warn!("{}: Standby capacity not checked: {e}", cx.request_id);
            GatewayError::new(ErrorKind::HostedAdmissionUnavailable, "Standby capacity cannot be checked right now.")
        })?;
        match outcome.verdict {
            Verdict::Admitted { lease, .. } => {
                cx.ext.insert(StandbySlot(lease.map(|l| self.keeper.hold(l))));
                Ok(())
            }
            Verdict::GateRefused { retry_after_ms, .. } => Err(GatewayError::new(
                ErrorKind::HostedStandbyAggregateLimit,
                format!("Standby on {} is at its capacity of {limit} requests; retry when one finishes.", model.id),
            )
            .with_header("x-hosted-limit-scope", "standby_aggregate")
            .with_header("x-hosted-limit-value", limit.to_string())
            .with_retry_after(retry_after_ms.div_ceil(1000).max(1))),
            other => Err(GatewayError::internal(format!("unexpected limiter verdict {other:?}"))),
        }
    }

    /// Free the request's Standby slot, if it holds one.
    pub async fn release(cx: &mut RequestCtx) {
        if let Some(held) = cx.ext.get_mut::<StandbySlot>().and_then(|s| s.0.take()) {
            held.release().await;
        }
    }
}
