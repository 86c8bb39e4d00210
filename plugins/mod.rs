//! The phase plugins, and the one place the chain is assembled from config.
//!
//! Each plugin is a small module with one job. `conf/tollgate.yaml` lists the enabled ones;
//! the chain runs them by priority (higher first), which follows the spec's layers.

#![forbid(unsafe_code)]

pub mod auth;
pub mod billing;
pub mod chat;
pub mod dialects;
pub mod gate;
pub mod idempotency;
pub mod limits;
pub mod shared;

use std::sync::Arc;

use tollgate::config::{Config, ConfigErrors, ConfigProblem};
use tollgate::identity::service::Identity;
use tollgate::proxy::plugin::{Chain, Plugin};
use tollgate::state::limits::{FallbackLimiter, FallbackOptions};
use tollgate::store::ledger::LedgerStore;

/// Shared services plugins are built with (opened by the server before the chain).
#[derive(Default, Clone)]
pub struct Services {
    pub identity: Option<Arc<Identity>>,
    pub ledger: Option<Arc<dyn LedgerStore>>,
    /// The limiter store's Redis connection, shared by the limiter, the idempotency records and
    /// the session placements (`tollgate::state::limits::shared_connection`).
    pub redis: Option<Arc<tollgate::state::redis_conn::LazyRedis>>,
}

/// The chain in the order its request phases run (response phases run it backwards), with
/// each plugin's priority. It follows the spec's layers: the connection gate before the
/// credential is read; authentication; the dialects translate onto the chat path and the chat
/// path validates and estimates tokens; admission then sees the estimate; billing places its
/// hold last, so a refused request never holds credit. An idempotent replay or conflict is
/// answered after the dialects registered their translator and before anything takes a slot
/// or a hold. In the log phase every plugin runs, and none depends on another's log hook (the
/// core completes the usage first).
pub const CHAIN_ORDER: [(&str, i16); 7] = [
    ("connection_gate", gate::GATE_PRIORITY),
    ("auth", auth::AUTH_PRIORITY),
    ("dialects", dialects::DIALECTS_PRIORITY),
    ("idempotency", idempotency::IDEMPOTENCY_PRIORITY),
    ("chat_completions", chat::CHAT_PRIORITY),
    ("limits", limits::LIMITS_PRIORITY),
    ("billing", billing::BILLING_PRIORITY),
];

const KNOWN: &str = "auth, billing, chat_completions, connection_gate, dialects, idempotency, limits";

/// The chain `serve` runs for this configuration, in request order (what `check-config`
/// prints: it builds the chain without opening the stores, so `auth` and `billing` are not
/// instantiated there, but they are served).
pub fn served_order(config: &Config) -> Vec<&'static str> {
    CHAIN_ORDER
        .iter()
        .filter(|(name, _)| config.gateway.plugins.iter().any(|p| p.name == *name))
        .map(|(n, _)| *n)
        .collect()
}

/// Build the chain named in `tollgate.yaml`.
pub fn build(config: &Config, services: &Services) -> Result<Chain, ConfigErrors> {
    let mut plugins: Vec<Arc<dyn Plugin>> = Vec::new();
    let mut problems = Vec::new();
    // One limiter store shared by the gate and the limits plugin (opening it never connects).
    let mut limiter: Option<Arc<FallbackLimiter>> = None;
    let mut open_limiter = |problems: &mut Vec<ConfigProblem>| -> Option<Arc<FallbackLimiter>> {
        if limiter.is_none() {
            match tollgate::state::limits::open_limiter(&config.gateway.limits.store, services.redis.clone()) {
                Ok(store) => limiter = Some(Arc::new(FallbackLimiter::new(store, FallbackOptions::default()))),
                Err(e) => problems.push(ConfigProblem {
                    file: config.source.clone(),
                    path: "limits.store".into(),
                    problem: e.to_string(),
                }),
            }
        }
        limiter.clone()
    };
    for (i, spec) in config.gateway.plugins.iter().enumerate() {
        let mut problem = |msg: String| {
            problems.push(ConfigProblem {
                file: config.source.clone(),
                path: format!("plugins[{i}].name"),
                problem: msg,
            })
        };
        match spec.name.as_str() {
            "chat_completions" => plugins.push(Arc::new(chat::ChatCompletions)),
            "connection_gate" => {
                if let Some(store) = open_limiter(&mut problems) {
                    plugins.push(Arc::new(gate::ConnectionGate::new(config.gateway.limits.gate, store)));
                }
            }
            "limits" if !config.gateway.plugins.iter().any(|p| p.name == "auth") => {
                problem("`limits` counts per API key and needs `auth` in the chain".into())
            }
            "limits" => {
                if let Some(store) = open_limiter(&mut problems) {
                    let settings = config.gateway.limits.clone();
                    plugins.push(Arc::new(limits::Limits::new(settings, store, &config.catalog.models)));
                }
            }
            "idempotency" => plugins.push(Arc::new(idempotency::Idempotency::new(
                idempotency_store(&config.gateway.limits.store, services.redis.clone()),
                u64::try_from(config.gateway.limits.lease_ttl.as_millis()).unwrap_or(u64::MAX),
            ))),
            "dialects" => {
                let pepper = config.gateway.identity.as_ref().map(|i| i.key_pepper.as_slice());
                plugins.push(Arc::new(dialects::Dialects::new(dialects::signing_key(pepper))))
            }
            "auth" => match (&services.identity, &config.gateway.identity) {
                (Some(id), _) => plugins.push(Arc::new(auth::Auth::new(id.clone()))),
                (None, None) => problem("`auth` needs the `identity` section (store and key secrets)".into()),
                // `check-config` builds the chain without opening the stores.
                (None, Some(_)) => {}
            },
            "billing" => match (&services.ledger, &config.gateway.identity) {
                (Some(ledger), _) => {
                    let billing = billing::Billing::new(
                        ledger.clone(),
                        config.gateway.topup_url.clone(),
                        i64::try_from((config.gateway.budgets.response + config.gateway.hold_margin).as_millis())
                            .unwrap_or(i64::MAX),
                        config.gateway.plans.clone(),
                    );
                    let billing = match open_limiter(&mut problems) {
                        Some(store) => billing.with_standby_capacity(store, config.gateway.limits.lease_ttl),
                        None => billing,
                    };
                    plugins.push(Arc::new(billing))
                }
                (None, None) => problem("`billing` needs the `identity` section (its store holds the ledger)".into()),
                (None, Some(_)) => {}
            },
            other => problem(format!("`{other}` is not a plugin of this build (known: {KNOWN})")),
        }
    }
    if problems.is_empty() { Ok(Chain::new(plugins)) } else { Err(ConfigErrors(problems)) }
}

/// The idempotency records live in the limiter's store: in process, or on the same Redis.
fn idempotency_store(
    cfg: &tollgate::state::limits::LimiterConfig,
    shared: Option<Arc<tollgate::state::redis_conn::LazyRedis>>,
) -> Arc<dyn tollgate::state::idempotency::IdempotencyStore> {
    use tollgate::state::idempotency::{DisabledRecords, InProcessRecords, RedisRecords};
    use tollgate::state::limits::LimiterConfig;
    match cfg {
        LimiterConfig::InProcess => Arc::new(InProcessRecords::new()),
        LimiterConfig::Redis { url, options } => match shared {
            Some(redis) => Arc::new(RedisRecords::on(redis, &options.prefix, options.timeout)),
            None => match RedisRecords::new(url, &options.prefix, options.timeout) {
                Ok(r) => Arc::new(r),
                Err(e) => {
                    log::error!("idempotency store: {e}");
                    Arc::new(DisabledRecords)
                }
            },
        },
        LimiterConfig::Disabled => Arc::new(DisabledRecords),
    }
}

#[cfg(test)]
mod tests {
    use super::CHAIN_ORDER;

    /// The frozen order of the chain. Hand-written on purpose: regenerating it from the
    /// code would stop it guarding anything.
    #[test]
    fn chain_order_is_frozen() {
        assert_eq!(
            CHAIN_ORDER,
            [
                ("connection_gate", 600),
                ("auth", 500),
                ("dialects", 300),
                ("idempotency", 250),
                ("chat_completions", 200),
                ("limits", 150),
                ("billing", 100),
            ]
        );
        assert!(CHAIN_ORDER.windows(2).all(|w| w[0].1 > w[1].1), "strictly by priority, no ties");
    }

    /// Each plugin answers with its own row of the list.
    #[test]
    fn plugins_report_their_row() {
        use tollgate::proxy::plugin::Plugin;
        let plugins: [&dyn Plugin; 2] = [&super::chat::ChatCompletions, &super::dialects::Dialects::new(Vec::new())];
        for p in plugins {
            assert!(CHAIN_ORDER.contains(&(p.name(), p.priority())), "{} {}", p.name(), p.priority());
        }
    }
}
