//! `tollgate.yaml`: listeners, limits, budgets, shutdown, and the plugin chain.

use std::net::SocketAddr;
use std::path::{Path, PathBuf};
use std::time::Duration;

use super::gateway_file::RawGateway;
use super::identity::{IdentitySettings, Secret, identity_settings};
use super::limits::LimitSettings;
use super::{ConfigProblem, Problems, parse_yaml, sibling};

/// The two time budgets of a generation (spec "Limits").
#[derive(Debug, Clone, Copy)]
pub struct Budgets {
    pub first_token: Duration,
    pub response: Duration,
    /// Published as `response_time_ceiling_seconds`.
    pub response_ceiling_seconds: u64,
    pub session_affinity_idle_ttl_seconds: u64,
    /// Silence after which a messages stream gets a `ping` (15 s).
    pub heartbeat: Duration,
}

/// A plugin named in the chain, with its settings as given.
#[derive(Debug, Clone)]
pub struct PluginSpec {
    pub name: String,
    pub settings: serde_json::Value,
}

/// Checked `tollgate.yaml`.
#[derive(Debug)]
pub struct GatewaySettings {
    pub listen: SocketAddr,
    pub admin_listen: SocketAddr,
    pub public_base_url: Option<String>,
    pub threads: usize,
    /// One work-stealing runtime for the request threads, or one runtime per thread
    /// (each connection stays on one, chosen when it is accepted). Decision 198.
    pub work_stealing: bool,
    pub models_file: PathBuf,
    pub upstreams_file: PathBuf,
    pub owned_by: String,
    pub max_request_bytes: u64,
    /// What one client connection may cost before admission (issue 49).
    pub client: super::ClientLimits,
    /// Where a client's address comes from behind load balancers (issue 52).
    pub client_addressing: super::ClientAddressing,
    /// Rate-limit layers and the limiter store.
    pub limits: LimitSettings,
    pub budgets: Budgets,
    pub grace_period_seconds: u64,
    pub graceful_shutdown_timeout_seconds: u64,
    pub plugins: Vec<PluginSpec>,
    pub identity: Option<IdentitySettings>,
    /// `None`: no admin token, the admin listener refuses every call.
    pub admin_token: Option<Secret>,
    pub topup_url: String,
    pub hold_margin: Duration,
    pub sweep_interval: Duration,
    /// `billing.ledger_max_wait_ms` (decision 131).
    pub ledger_max_wait: Duration,
    /// Coding plan tiers and the window wait.
    pub plans: std::sync::Arc<crate::money::plans::PlanSettings>,
    /// `access_log.format: json`.
    pub access_log_json: bool,
    /// Request traces exported over OTLP; `None`: off.
    pub tracing: Option<crate::observe::traces::TracingSettings>,
    /// `metrics.enabled` (default true).
    pub metrics_enabled: bool,
    /// `Some`: the public listener speaks HTTPS (HTTP/1.1 by ALPN).
    pub tls: Option<super::ListenerTls>,
}

fn budget(p: &mut Problems, path: &str, secs: f64) -> Duration {
    if !(secs.is_finite() && secs > 0.0 && secs <= 86_400.0) {
        p.add(path, format!("must be a number of seconds in (0, 86400], got {secs}"));
        return Duration::from_secs(1);
    }
    Duration::from_secs_f64(secs)
}

pub(super) fn load(file: &Path, out: &mut Vec<ConfigProblem>) -> Option<GatewaySettings> {
    // Every field has a default, so an emptied file (a bad deploy, a full disk) would start an
    // open proxy with no plugins on all interfaces.
    let blank = |t: String| match serde_yaml_ng::from_str::<serde_yaml_ng::Value>(&t) {
        Ok(serde_yaml_ng::Value::Null) => true,
        Ok(serde_yaml_ng::Value::Mapping(m)) => m.is_empty(),
        _ => false,
    };
    if std::fs::read_to_string(file).is_ok_and(blank) {
        Problems::new(file, out)
            .add(".", "the file is empty: it needs at least `plugins` (conf/tollgate.yaml has the default chain)");
        return None;
    }
    let raw: RawGateway = parse_yaml(file, out)?;
    let before = out.len();
    let mut p = Problems::new(file, out);
    let (listen, admin_listen) = super::process::listeners(&mut p, &raw.listen, &raw.admin_listen);
    super::process::shutdown(&mut p, raw.shutdown.grace_period_seconds, raw.shutdown.graceful_shutdown_timeout_seconds);
    if raw.threads == 0 || raw.threads > 256 {
        p.add("threads", format!("must be 1..=256, got {}", raw.threads));
    }
    if let Some(u) = &raw.public_base_url {
        if !(u.starts_with("http://") || u.starts_with("https://")) || u.ends_with('/') {
            p.add("public_base_url", format!("`{u}` must be an absolute http(s) URL without a trailing slash"));
        }
    }
    if raw.limits.max_request_bytes == 0 || raw.limits.max_request_bytes > 64 * 1024 * 1024 {
        p.add("limits.max_request_bytes", "must be between 1 and 67108864");
    }
    let limits = super::limits::check(&mut p, file, &raw.limits);
    let client = super::client::check(&mut p, &raw.client);
    let client_addressing = super::client_address::check(
        &mut p,
        &raw.client.trusted_proxies,
        raw.client.real_ip_header.as_deref(),
        raw.client.proxy_protocol,
    );
    let plans = std::sync::Arc::new(super::plans::check(&mut p, &raw.plans));
    let tracing = raw.tracing.as_ref().and_then(|t| super::tracing::check(&mut p, t));
    let access_log_json = match raw.access_log.format.as_deref() {
        None | Some("text") => false,
        Some("json") => true,
        Some(other) => {
            p.add("access_log.format", format!("`{other}` is not a format (text or json)"));
            false
        }
    };
    let first_token = budget(&mut p, "budgets.first_token_seconds", raw.budgets.first_token_seconds);
    let response = budget(&mut p, "budgets.response_seconds", raw.budgets.response_seconds);
    if first_token > response {
        p.add("budgets.first_token_seconds", "is above budgets.response_seconds, which ends the response first");
    }
    let heartbeat = budget(&mut p, "budgets.heartbeat_seconds", raw.budgets.heartbeat_seconds);
    let mut seen = std::collections::HashSet::new();
    let mut plugins = Vec::new();
    for (i, plug) in raw.plugins.into_iter().enumerate() {
        if !seen.insert(plug.name.clone()) {
            p.add(format!("plugins[{i}].name"), format!("`{}` is listed twice", plug.name));
        }
        if !(plug.settings.is_null() || plug.settings.as_object().is_some_and(|o| o.is_empty())) {
            // Nothing reads them: a plugin's settings are its own section (`limits:`, ...).
            p.add(
                format!("plugins[{i}].settings"),
                "no plugin takes settings here; each has its own section (e.g. `limits:`)",
            );
        }
        if plug.enabled {
            plugins.push(PluginSpec { name: plug.name, settings: plug.settings });
        }
    }
    let identity = raw.identity.as_ref().and_then(|i| identity_settings(&mut p, file, i));
    let admin_token = super::process::admin_token(&mut p, file, raw.admin.token_file.as_ref());
    let admin_token = admin_token.map(Secret);
    let topup = &raw.billing.topup_url;
    if !(topup.starts_with("https://") || topup.starts_with("http://")) || topup.len() > 2000 {
        p.add("billing.topup_url", format!("`{topup}` must be an absolute http(s) URL"));
    }
    if !(10..=60_000).contains(&raw.billing.ledger_max_wait_ms) {
        p.add("billing.ledger_max_wait_ms", "must be between 10 and 60000 (milliseconds)");
    }
    let settings = GatewaySettings {
        listen,
        admin_listen,
        public_base_url: raw.public_base_url,
        threads: raw.threads,
        // With one thread there is nothing to steal: the stealing scheduler's bookkeeping
        // would be pure cost (decision 198).
        work_stealing: raw.work_stealing.unwrap_or(raw.threads > 1),
        models_file: sibling(file, &raw.models_file),
        upstreams_file: sibling(file, &raw.upstreams_file),
        owned_by: raw.owned_by,
        max_request_bytes: raw.limits.max_request_bytes,
        client,
        client_addressing,
        limits,
        budgets: Budgets {
            first_token,
            response,
            response_ceiling_seconds: response.as_secs_f64().ceil() as u64,
            session_affinity_idle_ttl_seconds: raw.budgets.session_affinity_idle_ttl_seconds,
            heartbeat,
        },
        grace_period_seconds: raw.shutdown.grace_period_seconds,
        graceful_shutdown_timeout_seconds: raw.shutdown.graceful_shutdown_timeout_seconds,
        plugins,
        identity,
        admin_token,
        topup_url: raw.billing.topup_url.clone(),
        hold_margin: Duration::from_secs(raw.billing.hold_margin_seconds),
        sweep_interval: Duration::from_secs(raw.billing.sweep_interval_seconds.clamp(1, 3600)),
        ledger_max_wait: Duration::from_millis(raw.billing.ledger_max_wait_ms),
        plans,
        access_log_json,
        tracing,
        metrics_enabled: raw.metrics.enabled,
        tls: raw.tls.as_ref().and_then(|t| super::tls::listener(&mut p, file, &t.cert_file, &t.key_file)),
    };
    (out.len() == before).then_some(settings)
}

#[cfg(test)]
#[path = "gateway_tests.rs"]
mod tests;
