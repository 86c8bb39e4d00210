//! Placing a request on a replica with its session in mind: the stored placement of an
//! established session (shared through the limiter store), else rendezvous hashing; the
//! placement recorded again when it is new or moved; what happened counted in
//! `tollgate_placements_total{by, spill}`.

use std::sync::LazyLock;

use prometheus::{IntCounterVec, register_int_counter_vec};

use crate::http::error::GatewayError;
use crate::http::request;
use crate::proxy::ctx::RequestCtx;
use crate::state::placements::{self, Placed, PlacementStore, StoreDown};

static PLACEMENTS: LazyLock<Option<IntCounterVec>> = LazyLock::new(|| {
    register_int_counter_vec!(
        "tollgate_placements_total",
        "Requests placed on a replica, by what placed them (session, opening, load) and whether they spilled",
        &["by", "spill"]
    )
    .ok()
});

/// What names the request's conversation, read before any plugin rewrites the body.
pub(super) fn identify(headers: &http::HeaderMap, cx: &mut RequestCtx) {
    if let (Some(p), Some(principal)) = (cx.placement.as_mut(), cx.principal.as_ref()) {
        p.affinity = crate::http::session::affinity(&principal.workspace_id, headers, cx.body.as_ref());
    }
}

/// The session key of `cx` (none without a conversation to keep together) and how long its
/// placement is kept idle.
fn session(cx: &RequestCtx) -> (Option<u64>, u64) {
    let ttl_ms = cx.config.gateway.budgets.session_affinity_idle_ttl_seconds.saturating_mul(1000);
    (cx.placement.as_ref().and_then(|p| p.affinity).map(|a| a.key), ttl_ms)
}

/// The stored placement of `cx`'s session, read while the plugins run (`None`: no session
/// key, nothing to read). The future owns what it needs, so the chain can borrow `cx`
/// meanwhile; on Redis its `GETEX` leaves with the chain's first round trip (decision 150).
pub(super) fn lookup<'s>(
    store: &'s dyn PlacementStore,
    cx: &RequestCtx,
) -> impl std::future::Future<Output = Option<Result<Option<Placed>, StoreDown>>> + Send + use<'s> {
    let (key, ttl_ms) = session(cx);
    async move {
        match key {
            Some(k) => Some(store.get(k, ttl_ms).await),
            None => None,
        }
    }
}

/// Place `cx` on a replica given its session's `looked_up` placement
/// (`hosted_model_at_capacity` when the replicas offered are full).
pub(super) async fn place(
    store: &dyn PlacementStore,
    cx: &mut RequestCtx,
    looked_up: Option<Result<Option<Placed>, StoreDown>>,
) -> Result<(), GatewayError> {
    let (key, ttl_ms) = session(cx);
    let stored = match looked_up {
        Some(Ok(stored)) => stored,
        Some(Err(e)) => {
            log::warn!("{}: {e}; placing by hashing", cx.request_id);
            None
        }
        None => None,
    };
    if let Some(p) = cx.placement.as_mut() {
        let kept = stored.as_ref().and_then(|s| p.pool.replicas.iter().position(|r| r.authority == s.replica));
        p.home = kept.or_else(|| key.and_then(|k| crate::proxy::placement::preferred(&p.pool, k)));
    }
    request::place(cx)?;
    let Some(p) = cx.placement.as_ref() else { return Ok(()) };
    let by = p.affinity.map_or(crate::http::session::PlacedBy::Load, |a| a.by);
    if let Some(m) = PLACEMENTS.as_ref() {
        m.with_label_values(&[by.as_str(), if p.spilled { "true" } else { "false" }]).inc();
    }
    let (Some(k), Some(slot)) = (key, p.slot.as_ref()) else { return Ok(()) };
    let preferred = p.home.map(|h| p.pool.replicas[h].authority.as_str()).unwrap_or_default();
    if let Some(next) = placements::next(stored.as_ref(), preferred, &slot.replica.authority) {
        write(store, k, &next, ttl_ms, &cx.request_id).await;
    }
    Ok(())
}

async fn write(store: &dyn PlacementStore, key: u64, next: &Placed, ttl_ms: u64, rid: &str) {
    if let Err(e) = store.set(key, next, ttl_ms).await {
        log::warn!("{rid}: {e}; the session's placement was not recorded");
    }
}
