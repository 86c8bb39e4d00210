//! Operator routes about the catalog and pools: `POST /admin/v1/reload` (also SIGHUP) and
//! the replica health shown by `GET /admin/v1/health`.

use std::sync::atomic::Ordering;

use serde_json::{Value, json};

use super::{AdminApp, json_response};
use tollgate::config::{Config, LiveConfig};
use tollgate::runtime::clock::iso;

/// Reload `models.yaml` and `upstreams.yaml`: 200 with what changed, or 422 listing every
/// problem (file, field, problem) with the running config unchanged.
pub(super) fn reload(app: &AdminApp) -> http::Response<Vec<u8>> {
    let (status, body) = reload_answer(&app.live);
    json_response(status, &body)
}

/// Reload and describe the outcome (shared by the admin route and SIGHUP's log line).
pub fn reload_answer(live: &LiveConfig) -> (u16, Value) {
    match live.reload() {
        Ok(report) => {
            tollgate::observe::metrics::config_reloaded(true);
            log::info!(
                "config reloaded: {} models, {} replicas; added {:?} {:?}; draining {:?}; removed models {:?}",
                report.models,
                report.replicas,
                report.models_added,
                report.replicas_added,
                report.replicas_draining,
                report.models_removed
            );
            // A changed tollgate.yaml applies at the next start: say now if that start would be
            // refused, not when the process restarts (decision 176).
            let next_start = match report.settings_file_changed {
                true => tollgate::config::load_settings(&live.current().source).err(),
                false => None,
            };
            if report.settings_file_changed {
                log::warn!("tollgate.yaml changed on disk: its settings apply after a restart or an upgrade");
            }
            if let Some(errors) = &next_start {
                log::warn!("tollgate.yaml on disk would not load: the next start would be refused:\n{errors}");
            }
            let mut body = json!({ "status": "reloaded" });
            if let (Some(o), Ok(Value::Object(r))) = (body.as_object_mut(), serde_json::to_value(&report)) {
                o.extend(r);
            }
            if let Some(errors) = next_start {
                body["settings_file_problems"] = problems_json(&errors);
            }
            (200, body)
        }
        Err(errors) => {
            tollgate::observe::metrics::config_reloaded(false);
            log::warn!("config reload refused, the running config stays:\n{errors}");
            let body = json!({ "error": {
                "code": "invalid_config",
                "message": format!("the new configuration has {} problem(s); the running configuration is unchanged", errors.0.len()),
                "problems": problems_json(&errors),
            }});
            (422, body)
        }
    }
}

/// Each problem as `{file, field, problem}`.
fn problems_json(errors: &tollgate::config::ConfigErrors) -> Value {
    let problems =
        errors.0.iter().map(|p| json!({ "file": p.file.display().to_string(), "field": p.path, "problem": p.problem }));
    Value::Array(problems.collect())
}

/// Each pool's replicas as this instance sees them.
pub(super) fn pools_health(config: &Config) -> Value {
    let now = tollgate::runtime::clock::now_ms();
    let mut pools = serde_json::Map::new();
    for (model, pool) in config.pools.iter() {
        let replicas: Vec<Value> = pool
            .replicas
            .iter()
            .map(|r| {
                let s = &r.state;
                let ejected_until = s.ejected_until_ms.load(Ordering::Relaxed);
                let checked = s.checks.last_check_ms.load(Ordering::Relaxed);
                let checks = match (&pool.health_check, s.checks.down.load(Ordering::Relaxed)) {
                    (None, _) => "off",
                    (Some(_), _) if checked == 0 => "pending",
                    (Some(_), true) => "failing",
                    (Some(_), false) => "passing",
                };
                json!({
                    "address": r.authority,
                    "up": r.up(now),
                    "in_flight": r.in_flight(),
                    "max_concurrency": r.max_concurrency,
                    "checks": checks,
                    "last_check_at": (checked > 0).then(|| iso(checked)),
                    "last_error": s.checks.last_error.lock().unwrap_or_else(|p| p.into_inner()).clone(),
                    "ejected_until": (ejected_until > now).then(|| iso(ejected_until)),
                })
            })
            .collect();
        let up = pool.replicas.iter().filter(|r| r.up(now)).count();
        let status = match up {
            0 => "down",
            n if n < pool.replicas.len() => "degraded",
            _ => "ok",
        };
        pools.insert(model.clone(), json!({ "status": status, "up": up, "replicas": replicas }));
    }
    Value::Object(pools)
}
