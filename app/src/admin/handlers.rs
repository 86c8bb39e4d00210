//! Admin routes and their handlers.

use std::sync::Arc;

use http::Response;
use serde_json::{Value, json};

use super::fields::Fields;
use super::{AdminApp, AdminError, json_response};
use tollgate::identity::lifecycle::{KeyOpError, MAX_LIVE_PER_SCOPE};
use tollgate::identity::service::{CopyRole, Identity, NewKey};
use tollgate::identity::{KeyRecord, KeyScope, RateTier, Workspace};
use tollgate::runtime::clock::{iso, now_ms};
use tollgate::store::{KeyPatch, RotateOpts};

type Answer = Result<Response<Vec<u8>>, AdminError>;

fn key_err(e: KeyOpError) -> AdminError {
    match e {
        KeyOpError::NotFound => AdminError::not_found("key or workspace"),
        KeyOpError::LiveKeyLimit => {
            AdminError::new(400, "api_key_limit", format!("at most {MAX_LIVE_PER_SCOPE} live keys per scope")).key_op()
        }
        KeyOpError::RotationOverlap => AdminError::new(400, "api_key_rotation_overlap_limit", e.to_string()).key_op(),
        KeyOpError::NotActive(..) => AdminError::new(409, "api_key_not_active", e.to_string()).key_op(),
        KeyOpError::NotCopyable => AdminError::new(409, "api_key_not_copyable", e.to_string()).key_op(),
        KeyOpError::CopyForbidden => AdminError::new(403, "api_key_copy_forbidden", e.to_string()).key_op(),
        KeyOpError::Invalid { field, message } => AdminError::bad(field, &message),
        KeyOpError::Store(m) => {
            let mut err =
                AdminError::new(503, "api_key_mint_busy", format!("nothing changed; resend the same request ({m})"))
                    .key_op();
            err.retry_after = Some(2);
            err
        }
    }
}

fn identity(app: &AdminApp) -> Result<&Arc<Identity>, AdminError> {
    app.identity
        .as_ref()
        .ok_or_else(|| AdminError::new(503, "identity_not_configured", "no identity store is configured"))
}

fn opt_iso(ms: Option<i64>) -> Value {
    ms.map(|m| json!(iso(m))).unwrap_or(Value::Null)
}

/// Key metadata: never the plaintext, never the digest or the encrypted copy.
pub fn key_json(k: &KeyRecord) -> Value {
    let now = now_ms();
    json!({
        "id": k.id,
        "workspace_id": k.workspace_id,
        "name": k.name,
        "scope": k.scope.as_str(),
        "state": k.state(now).as_str(),
        "created_at": iso(k.created_at),
        "expires_at": opt_iso(k.expires_at),
        "revoked_at": opt_iso(k.revoked_at),
        "grace_until": opt_iso(k.grace_until),
        "rotated_from": k.rotated_from,
        "created_by": k.created_by,
        "credits_only": k.credits_only,
        "monthly_spend_limit_cents": k.monthly_spend_limit_cents,
        "rate_limit_rpm": k.rate_limit_rpm,
        "copyable": k.encrypted_copy.is_some() && k.is_live(now),
        "legacy_format": k.legacy_format(),
    })
}

fn workspace_json(w: &Workspace) -> Value {
    json!({
        "id": w.id,
        "name": w.name,
        "rate_tier": w.rate_tier.as_str(),
        "created_at": iso(w.created_at),
        "lifetime_purchases_cents": w.lifetime_purchases_cents,
        "frozen": w.frozen.is_some(),
        "frozen_reason": w.frozen,
    })
}

pub async fn route(app: &AdminApp, method: &str, path: &str, body: &Value) -> Answer {
    let parts: Vec<&str> = path.trim_end_matches('/').split('/').skip(1).collect();
    match (method, parts.as_slice()) {
        ("GET", ["admin", "v1", "health"]) => health(app).await,
        ("GET", ["metrics"]) => {
            tollgate::observe::metrics::refresh(&app.live.current());
            Ok(metrics())
        }
        ("POST", ["admin", "v1", "reload"]) => Fields::none(body).map(|()| super::pools::reload(app)),
        ("POST", ["admin", "v1", "workspaces"]) => create_workspace(app, body).await,
        ("GET", ["admin", "v1", "workspaces", ws]) => get_workspace(app, ws).await,
        ("POST", ["admin", "v1", "workspaces", ws, "keys"]) => create_key(app, ws, body).await,
        ("GET", ["admin", "v1", "keys", id]) => get_key(app, id).await,
        ("PATCH", ["admin", "v1", "keys", id]) => patch_key(app, id, body).await,
        ("DELETE", ["admin", "v1", "keys", id]) => {
            Fields::none(body)?;
            delete_key(app, id).await
        }
        ("POST", ["admin", "v1", "keys", id, "copy"]) => copy_key(app, id, body).await,
        ("POST", ["admin", "v1", "keys", id, "rotate"]) => rotate_key(app, id, body).await,
        ("POST", ["admin", "v1", "keys", id, "revoke"]) => {
            Fields::none(body)?;
            revoke_key(app, id).await
        }
        ("POST", ["admin", "v1", "models", rest @ ..]) if rest.len() >= 2 => {
            let (action, model) = (rest[rest.len() - 1], rest[..rest.len() - 1].join("/"));
            model_pause(app, &model, action, body).await
        }
        ("POST", ["admin", "v1", "workspaces", ws, "credits"]) => super::credits::top_up(app, ws, body).await,
        ("POST", ["admin", "v1", "workspaces", ws, "freeze"]) => super::credits::freeze(app, ws, body, true).await,
        ("POST", ["admin", "v1", "workspaces", ws, "unfreeze"]) => super::credits::freeze(app, ws, body, false).await,
        ("GET", ["admin", "v1", "workspaces", ws, "ledger"]) => super::credits::ledger_listing(app, ws).await,
        ("PUT", ["admin", "v1", "workspaces", ws, "plan"]) => super::plans::put(app, ws, body).await,
        ("GET", ["admin", "v1", "workspaces", ws, "plan"]) => super::plans::get(app, ws).await,
        ("DELETE", ["admin", "v1", "workspaces", ws, "plan"]) => {
            Fields::none(body)?;
            super::plans::delete(app, ws).await
        }
        _ => match allowed_methods(&parts) {
            Some(allow) => {
                Err(AdminError::new(405, "method_not_allowed", format!("{path} takes {allow}")).with_allow(allow))
            }
            None => Err(AdminError::new(404, "unknown_route", format!("{method} {path} is not an admin route"))),
        },
    }
}

/// The methods a known admin path takes (`405` with `Allow` for another, decision 175).
fn allowed_methods(parts: &[&str]) -> Option<&'static str> {
    Some(match parts {
        ["admin", "v1", "health"] | ["metrics"] => "GET",
        ["admin", "v1", "reload"] | ["admin", "v1", "workspaces"] => "POST",
        ["admin", "v1", "workspaces", _] => "GET",
        ["admin", "v1", "workspaces", _, "keys" | "credits" | "freeze" | "unfreeze"] => "POST",
        ["admin", "v1", "workspaces", _, "ledger"] => "GET",
        ["admin", "v1", "workspaces", _, "plan"] => "GET, PUT, DELETE",
        ["admin", "v1", "keys", _] => "GET, PATCH, DELETE",
        ["admin", "v1", "keys", _, "copy" | "rotate" | "revoke"] => "POST",
        ["admin", "v1", "models", .., "pause" | "resume"] if parts.len() >= 5 => "POST",
        _ => return None,
    })
}

async fn health(app: &AdminApp) -> Answer {
    let mut stores = serde_json::Map::new();
    let mut ok = true;
    if let Some(id) = &app.identity {
        match id.store().ping().await {
            Ok(()) => {
                stores.insert("identity".into(), json!({"backend": id.store().backend(), "status": "ok"}));
            }
            Err(e) => {
                ok = false;
                stores.insert(
                    "identity".into(),
                    json!({"backend": id.store().backend(), "status": "down", "error": e.to_string()}),
                );
            }
        }
    }
    // Every admission, idempotency check and placement goes through the limiter's Redis: a
    // node without it refuses all inference (decision 175).
    if let Some(redis) = &app.redis {
        let state = match redis.ping().await {
            Ok(()) => json!({"backend": "redis", "status": "ok"}),
            Err(e) => {
                ok = false;
                json!({"backend": "redis", "status": "down", "error": e})
            }
        };
        stores.insert("limiter".into(), state);
    }
    // Replica health is reported, not folded into the status: a node whose one pool is down
    // still serves the others (decision 125).
    let pools = super::pools::pools_health(&app.live.current());
    let mut body = json!({ "status": if ok { "ok" } else { "degraded" }, "stores": stores, "pools": pools });
    // This node's view of the fleet's pauses: when it last read them, and what they are.
    if let Some(shared) = &app.model_states {
        body["model_states"] = shared.health();
    }
    Ok(json_response(if ok { 200 } else { 503 }, &body))
}

fn metrics() -> Response<Vec<u8>> {
    let mut buf = Vec::new();
    let encoder = prometheus::TextEncoder::new();
    if prometheus::Encoder::encode(&encoder, &prometheus::gather(), &mut buf).is_err() {
        buf.clear();
    }
    Response::builder()
        .status(200)
        .header("content-type", "text/plain; version=0.0.4")
        .header("content-length", buf.len())
        .body(buf)
        .unwrap_or_default()
}

async fn create_workspace(app: &AdminApp, body: &Value) -> Answer {
    let f = Fields::new(body, &["name", "rate_tier"])?;
    let name = f.str("name", 200)?.ok_or_else(|| AdminError::bad("name", "is required"))?;
    let tier =
        f.one_of("rate_tier", &["free", "core", "enterprise"])?.and_then(RateTier::parse).unwrap_or(RateTier::Free);
    let ws = identity(app)?.create_workspace(name, tier).await.map_err(AdminError::store)?;
    super::credits::signup_grant(app, &ws.id).await?;
    Ok(json_response(
        201,
        &json!({"id": ws.id, "name": ws.name, "rate_tier": ws.rate_tier.as_str(), "created_at": iso(ws.created_at)}),
    ))
}

async fn get_workspace(app: &AdminApp, ws: &str) -> Answer {
    let w = identity(app)?
        .workspace(ws)
        .await
        .map_err(AdminError::store)?
        .ok_or_else(|| AdminError::not_found("workspace"))?;
    let mut body = workspace_json(&w);
    if let Some(b) = super::credits::balance(app, ws).await? {
        body["balance_cents"] = json!(b.balance_cents);
        body["held_cents"] = json!(b.held_cents);
        body["lifetime_purchases_cents"] = json!(b.lifetime_purchases_cents);
    }
    // `rate_tier` is what was set; a purchase raises the tier served (decision 39).
    let purchases = body["lifetime_purchases_cents"].as_i64().unwrap_or(0);
    body["rate_tier_in_force"] = json!(w.rate_tier.in_force(purchases).as_str());
    Ok(json_response(200, &body))
}

const DAY_MS: i64 = 86_400_000;
/// A monthly key limit above $1,000,000,000 is a typo, not a limit.
const MAX_SPEND_LIMIT_CENTS: i64 = 100_000_000_000;

async fn create_key(app: &AdminApp, ws: &str, body: &Value) -> Answer {
    let f = Fields::new(
        body,
        &[
            "name",
            "scope",
            "monthly_spend_limit_cents",
            "expires_at",
            "expires_in_days",
            "credits_only",
            "rate_limit_rpm",
            "created_by",
        ],
    )?;
    let now = now_ms();
    // One message for every bad value: the four choices, never a range that suggests more.
    let days = f
        .int("expires_in_days", 1, 365)
        .map_err(|_| AdminError::bad("expires_in_days", "must be 30, 60, 90 or 365"))?;
    let expires_at = match (f.instant("expires_at")?, days) {
        (Some(_), Some(_)) => {
            return Err(AdminError::bad("expires_in_days", "give either expires_at or expires_in_days"));
        }
        (Some(at), None) if at <= now => {
            return Err(AdminError::bad("expires_at", "must be in the future"));
        }
        (Some(at), None) => Some(at),
        (None, Some(d)) if [30, 60, 90, 365].contains(&d) => Some(now + d * DAY_MS),
        (None, Some(_)) => {
            return Err(AdminError::bad("expires_in_days", "must be 30, 60, 90 or 365"));
        }
        (None, None) => None,
    };
    let opts = NewKey {
        name: f.str("name", 200)?.map(str::to_string),
        scope: f.one_of("scope", &["workspace", "deployment", "terminal"])?.and_then(KeyScope::parse),
        // Minimum monthly limit: $1.00.
        monthly_spend_limit_cents: f.int("monthly_spend_limit_cents", 100, MAX_SPEND_LIMIT_CENTS)?,
        expires_at,
        credits_only: f.bool("credits_only")?.unwrap_or(false),
        rate_limit_rpm: f.int("rate_limit_rpm", 1, 10_000_000)?,
        created_by: f.str("created_by", 200)?.map(str::to_string),
        without_copy: false,
    };
    let (k, plaintext) = identity(app)?.create_key(ws, opts).await.map_err(key_err)?;
    Ok(json_response(
        201,
        &json!({"id": k.id, "key": plaintext, "scope": k.scope.as_str(), "created_at": iso(k.created_at), "expires_at": opt_iso(k.expires_at)}),
    ))
}

async fn get_key(app: &AdminApp, id: &str) -> Answer {
    let k = identity(app)?.key(id).await.map_err(AdminError::store)?.ok_or_else(|| AdminError::not_found("key"))?;
    Ok(json_response(200, &key_json(&k)))
}

async fn patch_key(app: &AdminApp, id: &str, body: &Value) -> Answer {
    let f = Fields::new(body, &["monthly_spend_limit_cents", "credits_only", "rate_limit_rpm", "expires_at"])?;
    let clear_or = |name: &str, v: Option<i64>| {
        if f.is_null(name) { Some(None) } else { v.map(Some) }
    };
    let patch = KeyPatch {
        monthly_spend_limit_cents: clear_or(
            "monthly_spend_limit_cents",
            f.int("monthly_spend_limit_cents", 100, MAX_SPEND_LIMIT_CENTS)?,
        ),
        credits_only: f.bool("credits_only")?,
        rate_limit_rpm: clear_or("rate_limit_rpm", f.int("rate_limit_rpm", 1, 10_000_000)?),
        expires_at: clear_or("expires_at", f.instant("expires_at")?),
    };
    let k = identity(app)?.update_key(id, &patch).await.map_err(key_err)?;
    Ok(json_response(200, &key_json(&k)))
}

async fn delete_key(app: &AdminApp, id: &str) -> Answer {
    if identity(app)?.delete_key(id).await.map_err(key_err)? {
        Ok(Response::builder().status(204).body(Vec::new()).unwrap_or_default())
    } else {
        Err(AdminError::not_found("key"))
    }
}

async fn copy_key(app: &AdminApp, id: &str, body: &Value) -> Answer {
    let f = Fields::new(body, &["actor", "role"])?;
    let actor = f.str("actor", 200)?.ok_or_else(|| AdminError::bad("actor", "is required"))?;
    let role = f
        .one_of("role", &["owner", "creator", "member", "viewer"])?
        .and_then(CopyRole::parse)
        .ok_or_else(|| AdminError::bad("role", "is required"))?;
    let key = identity(app)?.copy_key(id, actor, role).await.map_err(key_err)?;
    Ok(json_response(200, &json!({ "key": key })))
}

async fn rotate_key(app: &AdminApp, id: &str, body: &Value) -> Answer {
    let f = Fields::new(body, &["revoke_previous_immediately", "grace_seconds"])?;
    let opts = RotateOpts {
        revoke_previous_immediately: f.bool("revoke_previous_immediately")?.unwrap_or(false),
        grace_ms: f.int("grace_seconds", 0, 86_400)?.map(|s| s * 1000),
    };
    let (new_key, plaintext, prev) = identity(app)?.rotate_key(id, opts).await.map_err(key_err)?;
    Ok(json_response(
        201,
        &json!({
            "id": new_key.id,
            "key": plaintext,
            "previous": {"id": prev.id, "state": prev.state(now_ms()).as_str(), "grace_until": opt_iso(prev.grace_until)},
        }),
    ))
}

async fn revoke_key(app: &AdminApp, id: &str) -> Answer {
    let k = identity(app)?.revoke_key(id).await.map_err(key_err)?;
    Ok(json_response(200, &key_json(&k)))
}

async fn model_pause(app: &AdminApp, model: &str, action: &str, body: &Value) -> Answer {
    if app.live.current().catalog.get(model).is_none() {
        return Err(AdminError::not_found("model"));
    }
    let until = match action {
        "pause" => {
            let f = Fields::new(body, &["until"])?;
            let until = f.instant("until")?.ok_or_else(|| AdminError::bad("until", "is required"))?;
            jiff::Timestamp::from_millisecond(until).map_err(|_| AdminError::bad("until", "out of range"))?;
            Some(until)
        }
        "resume" => {
            Fields::none(body)?;
            None
        }
        _ => return Err(AdminError::new(404, "unknown_route", "use pause or resume")),
    };
    match &app.model_states {
        // Shared with every instance on the identity store, and kept across restarts.
        Some(shared) => shared.set(model, until).await.map_err(AdminError::store)?,
        // No identity store: this node alone, until it restarts.
        None => app.live.with_current(|config| {
            if let Some(entry) = config.catalog.get(model) {
                entry.set_paused_until(until.and_then(|ms| jiff::Timestamp::from_millisecond(ms).ok()));
            }
        }),
    }
    let config = app.live.current();
    let entry = config.catalog.get(model).ok_or_else(|| AdminError::not_found("model"))?;
    Ok(json_response(200, &entry.to_json()))
}
