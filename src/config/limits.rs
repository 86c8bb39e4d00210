//! The `limits` section of `tollgate.yaml`: the request body bound, the limiter store, and
//! the budgets of the rate-limit layers (spec "Limits" and its four "Rate limit layers").
//! Per-model values (per-key concurrency, shared-model concurrency, tokens per minute) live
//! in `models.yaml`; the values here are gateway-wide or per tier.

use std::time::Duration;

use serde::Deserialize;

use super::Problems;
use crate::state::limits::{LimiterConfig, RedisOptions};

#[derive(Deserialize)]
#[serde(deny_unknown_fields)]
pub(super) struct RawLimits {
    #[serde(default = "default_max_request_bytes")]
    pub(super) max_request_bytes: u64,
    #[serde(default)]
    store: RawLimiterStore,
    #[serde(default)]
    connection_gate: RawGate,
    #[serde(default)]
    requests_per_minute: RawTiers,
    #[serde(default = "default_reads_per_minute")]
    reads_per_minute: u64,
    #[serde(default = "default_workspace_concurrency")]
    workspace_concurrency: RawTiers,
    #[serde(default = "default_large_prompt_tokens")]
    large_prompt_tokens: u64,
    #[serde(default = "default_large_prompt_shed_percent")]
    large_prompt_shed_percent: u64,
    #[serde(default = "default_lease_ttl")]
    lease_ttl_seconds: u64,
    #[serde(default = "default_max_pending")]
    max_pending_admissions: u64,
}

impl Default for RawLimits {
    fn default() -> Self {
        RawLimits {
            max_request_bytes: default_max_request_bytes(),
            store: RawLimiterStore::default(),
            connection_gate: RawGate::default(),
            requests_per_minute: RawTiers::default(),
            reads_per_minute: default_reads_per_minute(),
            workspace_concurrency: default_workspace_concurrency(),
            large_prompt_tokens: default_large_prompt_tokens(),
            large_prompt_shed_percent: default_large_prompt_shed_percent(),
            lease_ttl_seconds: default_lease_ttl(),
            max_pending_admissions: default_max_pending(),
        }
    }
}

#[derive(Deserialize, Default)]
#[serde(tag = "backend", rename_all = "snake_case", deny_unknown_fields)]
enum RawLimiterStore {
    /// One node: counts in this process (the embedded default).
    #[default]
    InProcess,
    /// Shared by every gateway instance.
    Redis {
        url: Option<String>,
        url_env: Option<String>,
        #[serde(default = "default_prefix")]
        prefix: String,
        #[serde(default = "default_timeout_ms")]
        timeout_ms: u64,
        /// A `rediss://` link's CA and client certificate (issue 52).
        #[serde(default)]
        tls: Option<super::tls::RawStoreTls>,
    },
    /// Not configured: rate-limited routes answer `503 limiter_unavailable`.
    None,
}

#[derive(Deserialize)]
#[serde(deny_unknown_fields)]
struct RawGate {
    #[serde(default = "default_per_address")]
    per_address_per_minute: u64,
    #[serde(default = "default_service_wide")]
    service_per_minute: u64,
    #[serde(default = "default_trusted_minutes")]
    trusted_key_minutes: u64,
}

impl Default for RawGate {
    fn default() -> Self {
        RawGate {
            per_address_per_minute: default_per_address(),
            service_per_minute: default_service_wide(),
            trusted_key_minutes: default_trusted_minutes(),
        }
    }
}

/// A value per rate tier.
#[derive(Deserialize, Clone, Copy)]
#[serde(deny_unknown_fields)]
struct RawTiers {
    free: u64,
    core: u64,
    enterprise: u64,
}

impl Default for RawTiers {
    /// Spec "Limits": requests per minute per key by tier.
    fn default() -> Self {
        RawTiers { free: 10_000, core: 50_000, enterprise: 200_000 }
    }
}

fn default_max_request_bytes() -> u64 {
    3_500_000
}
fn default_reads_per_minute() -> u64 {
    60
}
fn default_workspace_concurrency() -> RawTiers {
    RawTiers { free: 32, core: 256, enterprise: 1024 }
}
fn default_large_prompt_tokens() -> u64 {
    32_000
}
fn default_large_prompt_shed_percent() -> u64 {
    90
}
fn default_lease_ttl() -> u64 {
    30
}
fn default_max_pending() -> u64 {
    1024
}
fn default_prefix() -> String {
    "tollgate".into()
}
fn default_timeout_ms() -> u64 {
    250
}
fn default_per_address() -> u64 {
    600
}
fn default_service_wide() -> u64 {
    20_000
}
fn default_trusted_minutes() -> u64 {
    15
}

/// A value per rate tier (free before the first purchase, core after, enterprise).
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct Tiers {
    pub free: u64,
    pub core: u64,
    pub enterprise: u64,
}

impl Tiers {
    pub fn get(&self, tier: crate::identity::RateTier) -> u64 {
        use crate::identity::RateTier::*;
        match tier {
            Free => self.free,
            Core => self.core,
            Enterprise => self.enterprise,
        }
    }
}

/// The connection gate's budgets for unrecognized credentials (layer 1).
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct GateSettings {
    pub per_address_per_minute: u64,
    pub service_per_minute: u64,
    /// A key that succeeded bypasses the gate on this instance for this long.
    pub trusted_for: Duration,
}

#[derive(Debug, Clone, PartialEq, Eq)]
pub struct LimitSettings {
    pub store: LimiterConfig,
    pub gate: GateSettings,
    pub requests_per_minute: Tiers,
    pub reads_per_minute: u64,
    pub workspace_concurrency: Tiers,
    /// A prompt of at least this many tokens is shed first near full concurrency.
    pub large_prompt_tokens: u64,
    /// "Near full": the share of the shared-model limit above which large prompts are shed.
    pub large_prompt_shed_percent: u64,
    pub lease_ttl: Duration,
    /// Admission checks waiting on the store at once on this instance; beyond it,
    /// `429 hosted_admission_congested`.
    pub max_pending_admissions: u64,
}

impl Default for LimitSettings {
    /// The defaults of an empty `limits` section.
    fn default() -> Self {
        let mut out = Vec::new();
        check(
            &mut Problems::new(std::path::Path::new("tollgate.yaml"), &mut out),
            std::path::Path::new("tollgate.yaml"),
            &RawLimits::default(),
        )
    }
}

fn positive(p: &mut Problems, path: &str, v: u64, max: u64) -> u64 {
    if v == 0 || v > max {
        p.add(path, format!("must be a whole number from 1 to {max}, got {v}"));
    }
    v.clamp(1, max)
}

fn tiers(p: &mut Problems, path: &str, t: RawTiers, max: u64) -> Tiers {
    Tiers {
        free: positive(p, &format!("{path}.free"), t.free, max),
        core: positive(p, &format!("{path}.core"), t.core, max),
        enterprise: positive(p, &format!("{path}.enterprise"), t.enterprise, max),
    }
}

const MAX_RATE: u64 = 100_000_000;

pub(super) fn check(p: &mut Problems, settings_file: &std::path::Path, raw: &RawLimits) -> LimitSettings {
    let store = match &raw.store {
        RawLimiterStore::InProcess => LimiterConfig::InProcess,
        RawLimiterStore::None => LimiterConfig::Disabled,
        RawLimiterStore::Redis { url, url_env, prefix, timeout_ms, tls } => {
            if prefix.is_empty()
                || prefix.len() > 64
                || prefix.contains(['{', '}'])
                || prefix.contains(char::is_whitespace)
            {
                p.add("limits.store.prefix", "must be 1 to 64 characters without braces or spaces");
            }
            let timeout = positive(p, "limits.store.timeout_ms", *timeout_ms, 60_000);
            let url = match (url, url_env) {
                (Some(u), None) => u.clone(),
                (None, var) => {
                    let var = var.clone().unwrap_or_else(|| "REDIS_URL".into());
                    std::env::var(&var).unwrap_or_else(|_| {
                        p.add("limits.store.url_env", format!("environment variable `{var}` is not set"));
                        String::new()
                    })
                }
                (Some(_), Some(_)) => {
                    p.add("limits.store", "give `url` or `url_env`, not both");
                    String::new()
                }
            };
            if !(url.is_empty() || url.starts_with("redis://") || url.starts_with("rediss://")) {
                p.add("limits.store.url", "must be a redis:// or rediss:// URL");
            }
            if tls.is_some() && url.starts_with("redis://") {
                p.add("limits.store.tls", "needs a rediss:// URL (redis:// is plain TCP)");
            }
            let tls = tls.as_ref().and_then(|t| super::tls::store_tls(p, settings_file, "limits.store.tls", t));
            LimiterConfig::Redis {
                url,
                options: RedisOptions {
                    prefix: prefix.clone(),
                    timeout: Duration::from_millis(timeout),
                    tls: tls.map(std::sync::Arc::new),
                },
            }
        }
    };
    let g = &raw.connection_gate;
    LimitSettings {
        store,
        gate: GateSettings {
            per_address_per_minute: positive(
                p,
                "limits.connection_gate.per_address_per_minute",
                g.per_address_per_minute,
                MAX_RATE,
            ),
            service_per_minute: positive(
                p,
                "limits.connection_gate.service_per_minute",
                g.service_per_minute,
                MAX_RATE,
            ),
            trusted_for: Duration::from_secs(
                60 * positive(p, "limits.connection_gate.trusted_key_minutes", g.trusted_key_minutes, 15),
            ),
        },
        requests_per_minute: tiers(p, "limits.requests_per_minute", raw.requests_per_minute, MAX_RATE),
        reads_per_minute: positive(p, "limits.reads_per_minute", raw.reads_per_minute, MAX_RATE),
        workspace_concurrency: tiers(p, "limits.workspace_concurrency", raw.workspace_concurrency, 1_000_000),
        large_prompt_tokens: positive(p, "limits.large_prompt_tokens", raw.large_prompt_tokens, 100_000_000),
        large_prompt_shed_percent: positive(p, "limits.large_prompt_shed_percent", raw.large_prompt_shed_percent, 100),
        lease_ttl: Duration::from_secs(positive(p, "limits.lease_ttl_seconds", raw.lease_ttl_seconds, 3600)),
        max_pending_admissions: positive(p, "limits.max_pending_admissions", raw.max_pending_admissions, 1_000_000),
    }
}
