//! `GET /v1/credits`: the workspace's balance as the ledger holds it now, never cached.

use bytes::Bytes;
use pingora::proxy::Session;
use serde_json::json;

use super::Billing;
use super::refusals::store_down;
use tollgate::http::error::GatewayError;
use tollgate::proxy::ctx::RequestCtx;
use tollgate::runtime::clock::{iso, now_ms, utc_month_bounds};

pub async fn read(b: &Billing, s: &mut Session, cx: &mut RequestCtx) -> Result<(), GatewayError> {
    let principal = cx.principal.clone().ok_or_else(|| GatewayError::internal("no principal"))?;
    let now = now_ms();
    let (month_start, _, _) = utc_month_bounds(now);
    // Unused leases are counted as held by the store but no request holds them
    // (`ledger/lease.rs`): shown as balance, as before leases.
    let balance = b.ledger.balance_shown(&principal.workspace_id).await.map_err(store_down)?;
    let balance = balance.ok_or_else(|| GatewayError::internal("workspace without a ledger row"))?;
    let spent = b.ledger.spent_since(&principal.workspace_id, month_start).await.map_err(store_down)?;
    let body = json!({
        "object": "credits",
        "workspace_id": principal.workspace_id,
        "balance_cents": balance.balance_cents,
        "held_cents": balance.held_cents,
        "available_cents": balance.balance_cents.max(0),
        "currency": "usd",
        "period": { "start": iso(month_start), "spent_cents": spent },
        "spend_cap": { "limit_cents": null, "hard": false, "used_cents": null, "remaining_cents": null, "gates_inference": false },
        "plan_tier": principal.tier().as_str(),
        "as_of": iso(now),
    });
    tollgate::http::responder::json(s, cx, 200, Bytes::from(body.to_string()), &[("cache-control", "no-store".into())])
        .await
        .map_err(|e| GatewayError::internal(format!("write failed: {e}")))
}
