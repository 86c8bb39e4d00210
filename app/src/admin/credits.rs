//! Admin calls on money: top-ups (with the spec's bounds), the $1 signup grant, freezing,
//! and the ledger listing with its consistency check (stored balance == sum of entries less open holds, decision 133).

use std::sync::Arc;

use serde_json::{Value, json};

use super::fields::Fields;
use super::{AdminApp, AdminError, json_response};
use tollgate::runtime::clock::{iso, now_ms};
use tollgate::store::ledger::{Balance, LedgerStore};

type Answer = Result<http::Response<Vec<u8>>, AdminError>;

/// The signup grant of clarification 12: $1, never expires.
const SIGNUP_GRANT_CENTS: i64 = 100;
/// Purchases: $5 to $1,000,000 per top-up.
const PURCHASE_MIN_CENTS: i64 = 500;
const PURCHASE_MAX_CENTS: i64 = 100_000_000;
/// Purchased (and promotional) balance lasts one year.
const TOPUP_LIFETIME_MS: i64 = 365 * 86_400_000;

fn ledger(app: &AdminApp) -> Result<&Arc<dyn LedgerStore>, AdminError> {
    app.ledger.as_ref().ok_or_else(|| AdminError::new(503, "ledger_not_configured", "no ledger store is configured"))
}

pub(super) async fn signup_grant(app: &AdminApp, ws: &str) -> Result<(), AdminError> {
    if let Some(l) = &app.ledger {
        l.top_up(ws, SIGNUP_GRANT_CENTS, "grant", None, now_ms()).await.map_err(AdminError::store)?;
    }
    Ok(())
}

pub(super) async fn balance(app: &AdminApp, ws: &str) -> Result<Option<Balance>, AdminError> {
    match &app.ledger {
        // Unused leases are shown as balance, as the credits read shows them.
        Some(l) => l.balance_shown(ws).await.map_err(AdminError::store),
        None => Ok(None),
    }
}

async fn existing(app: &AdminApp, ws: &str) -> Result<(), AdminError> {
    match ledger(app)?.balance(ws).await.map_err(AdminError::store)? {
        Some(_) => Ok(()),
        None => Err(AdminError::not_found("workspace")),
    }
}

pub(super) async fn top_up(app: &AdminApp, ws: &str, body: &Value) -> Answer {
    let f = Fields::new(body, &["amount_cents", "source"])?;
    let source = f
        .one_of("source", &["purchase", "promo", "grant"])?
        .ok_or_else(|| AdminError::bad("source", "is required (purchase, promo or grant)"))?;
    let (min, max) =
        if source == "purchase" { (PURCHASE_MIN_CENTS, PURCHASE_MAX_CENTS) } else { (1, PURCHASE_MAX_CENTS) };
    let amount = f.int("amount_cents", min, max)?.ok_or_else(|| AdminError::bad("amount_cents", "is required"))?;
    existing(app, ws).await?;
    let now = now_ms();
    let expires_at = (source != "grant").then_some(now + TOPUP_LIFETIME_MS);
    let (entry, stored) = ledger(app)?.top_up(ws, amount, source, expires_at, now).await.map_err(AdminError::store)?;
    // As the credits read shows it (read again, so the unused leases are of the same moment).
    let shown = ledger(app)?.balance_shown(ws).await.map_err(AdminError::store)?;
    let balance = shown.map_or(stored, |b| b.balance_cents);
    Ok(json_response(201, &json!({ "entry_id": entry, "balance_cents": balance })))
}

pub(super) async fn freeze(app: &AdminApp, ws: &str, body: &Value, on: bool) -> Answer {
    let f = Fields::new(body, &["reason"])?;
    let reason = f.one_of("reason", &["unpaid", "dispute"])?.unwrap_or("unpaid");
    let changed = ledger(app)?.set_frozen(ws, on.then_some(reason)).await.map_err(AdminError::store)?;
    if !changed {
        return Err(AdminError::not_found("workspace"));
    }
    Ok(json_response(200, &json!({ "id": ws, "frozen": on, "frozen_reason": on.then_some(reason) })))
}

pub(super) async fn ledger_listing(app: &AdminApp, ws: &str) -> Answer {
    let l = ledger(app)?;
    // The stored balance and the sum of entries are two reads: a hold or settlement landing
    // between them would show a false mismatch under traffic. A pair is trusted when the
    // balance did not move across the sum's read; a real mismatch never agrees.
    let mut attempt = 0;
    // Unused leases (decisions 187 and 190) are read with the stored balance: held in it,
    // which the check compares; shown as balance, as the credits read shows them.
    let (stored, leased, derived) = loop {
        attempt += 1;
        let (stored, leased) = l
            .balance_and_unused_leases(ws)
            .await
            .map_err(AdminError::store)?
            .ok_or_else(|| AdminError::not_found("workspace"))?;
        let derived = l.derived_balance(ws).await.map_err(AdminError::store)?;
        let again = l.balance(ws).await.map_err(AdminError::store)?;
        if attempt >= 5 || (again == Some(stored) && derived == stored.balance_cents) {
            break (stored, leased, derived);
        }
    };
    let shown = stored.with_lease_unused(leased);
    let entries = l.entries(ws, 500).await.map_err(AdminError::store)?;
    let entries: Vec<Value> = entries
        .iter()
        .map(|e| {
            json!({
                "id": e.id, "kind": e.kind, "source": e.source, "amount_cents": e.amount_cents,
                "request_id": e.request_id, "cost_microcents": e.cost_microcents,
                "expires_at": e.expires_at.map(iso), "created_at": iso(e.created_at),
            })
        })
        .collect();
    Ok(json_response(
        200,
        &json!({
            "workspace_id": ws,
            "balance_cents": shown.balance_cents,
            "held_cents": shown.held_cents,
            "leased_cents": leased,
            "carry_microcents": stored.carry_microcents,
            "check": {
                "stored_balance_cents": stored.balance_cents,
                "derived_balance_cents": derived,
                "consistent": derived == stored.balance_cents,
            },
            "entries": entries,
        }),
    ))
}
