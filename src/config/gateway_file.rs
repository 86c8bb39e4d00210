//! `tollgate.yaml` as written: every section with its defaults, unknown fields refused
//! (`gateway.rs` checks it).

use serde::Deserialize;

use super::identity::RawIdentity;
use super::limits::RawLimits;

#[derive(Deserialize)]
#[serde(deny_unknown_fields)]
pub(super) struct RawGateway {
    #[serde(default = "default_listen")]
    pub(super) listen: String,
    #[serde(default = "default_admin_listen")]
    pub(super) admin_listen: String,
    /// Public root clients use (`{base_url}`), for `error.base_url`; default: from `Host`.
    #[serde(default)]
    pub(super) public_base_url: Option<String>,
    #[serde(default = "default_threads")]
    pub(super) threads: usize,
    /// Whether the request threads steal each other's tasks; default: only when there are
    /// several (decision 198).
    #[serde(default)]
    pub(super) work_stealing: Option<bool>,
    #[serde(default = "default_models_file")]
    pub(super) models_file: String,
    #[serde(default = "default_upstreams_file")]
    pub(super) upstreams_file: String,
    #[serde(default = "default_owned_by")]
    pub(super) owned_by: String,
    #[serde(default)]
    pub(super) limits: RawLimits,
    #[serde(default)]
    pub(super) client: super::client::RawClient,
    #[serde(default)]
    pub(super) budgets: RawBudgets,
    #[serde(default)]
    pub(super) shutdown: RawShutdown,
    #[serde(default)]
    pub(super) plugins: Vec<RawPlugin>,
    /// Workspaces and keys; without it no plugin can authenticate.
    #[serde(default)]
    pub(super) identity: Option<RawIdentity>,
    #[serde(default)]
    pub(super) admin: RawAdmin,
    #[serde(default)]
    pub(super) billing: RawBilling,
    #[serde(default)]
    pub(super) plans: super::plans::RawPlans,
    #[serde(default)]
    pub(super) access_log: RawAccessLog,
    #[serde(default)]
    pub(super) metrics: RawMetrics,
    /// TLS on the public listener.
    pub(super) tls: Option<RawTls>,
    /// OTLP export of request traces (decision 215).
    #[serde(default)]
    pub(super) tracing: Option<super::tracing::RawTracing>,
}

#[derive(Deserialize)]
#[serde(deny_unknown_fields)]
pub(super) struct RawTls {
    pub(super) cert_file: String,
    pub(super) key_file: String,
}

#[derive(Deserialize)]
#[serde(deny_unknown_fields)]
pub(super) struct RawMetrics {
    /// Record the Prometheus metrics of `GET /metrics` (on unless set false).
    #[serde(default = "default_true")]
    pub(super) enabled: bool,
}

impl Default for RawMetrics {
    fn default() -> Self {
        RawMetrics { enabled: true }
    }
}

#[derive(Deserialize, Default)]
#[serde(deny_unknown_fields)]
pub(super) struct RawAccessLog {
    /// `text` (default, through the log) or `json` (one object per line on stderr).
    #[serde(default)]
    pub(super) format: Option<String>,
}

#[derive(Deserialize)]
#[serde(deny_unknown_fields)]
pub(super) struct RawBilling {
    /// Absolute URL sent as `topup_url` in `402 insufficient_credits`.
    #[serde(default = "default_topup_url")]
    pub(super) topup_url: String,
    /// How long a hold outlives the response budget before the sweeper may release it.
    #[serde(default = "default_hold_margin")]
    pub(super) hold_margin_seconds: u64,
    #[serde(default = "default_sweep_interval")]
    pub(super) sweep_interval_seconds: u64,
    /// Holds are shed (`429 hosted_admission_congested`) while ledger writes wait longer.
    #[serde(default = "default_ledger_max_wait")]
    pub(super) ledger_max_wait_ms: u64,
}

impl Default for RawBilling {
    fn default() -> Self {
        RawBilling {
            topup_url: default_topup_url(),
            hold_margin_seconds: default_hold_margin(),
            sweep_interval_seconds: default_sweep_interval(),
            ledger_max_wait_ms: default_ledger_max_wait(),
        }
    }
}

fn default_hold_margin() -> u64 {
    120
}

fn default_sweep_interval() -> u64 {
    30
}

fn default_ledger_max_wait() -> u64 {
    500
}

fn default_topup_url() -> String {
    "https://billing.example.com/top-up".into()
}

#[derive(Deserialize, Default)]
#[serde(deny_unknown_fields)]
pub(super) struct RawAdmin {
    /// File holding the admin token; `TOLLGATE_ADMIN_TOKEN` wins when set.
    pub(super) token_file: Option<String>,
}

#[derive(Deserialize)]
#[serde(deny_unknown_fields)]
pub(super) struct RawBudgets {
    #[serde(default = "default_first_token")]
    pub(super) first_token_seconds: f64,
    #[serde(default = "default_response")]
    pub(super) response_seconds: f64,
    /// Messages streams: a `ping` after this many seconds without output.
    #[serde(default = "default_heartbeat")]
    pub(super) heartbeat_seconds: f64,
    #[serde(default = "default_affinity_ttl")]
    pub(super) session_affinity_idle_ttl_seconds: u64,
}

impl Default for RawBudgets {
    fn default() -> Self {
        RawBudgets {
            first_token_seconds: default_first_token(),
            response_seconds: default_response(),
            heartbeat_seconds: default_heartbeat(),
            session_affinity_idle_ttl_seconds: default_affinity_ttl(),
        }
    }
}

#[derive(Deserialize)]
#[serde(deny_unknown_fields)]
pub(super) struct RawShutdown {
    /// Above the 740 s response budget by default so in-flight work settles (pingora drops
    /// requests still running at the end of the grace period without calling `logging`).
    #[serde(default = "default_grace")]
    pub(super) grace_period_seconds: u64,
    #[serde(default = "default_final_timeout")]
    pub(super) graceful_shutdown_timeout_seconds: u64,
}

impl Default for RawShutdown {
    fn default() -> Self {
        RawShutdown {
            grace_period_seconds: default_grace(),
            graceful_shutdown_timeout_seconds: default_final_timeout(),
        }
    }
}

#[derive(Deserialize)]
#[serde(deny_unknown_fields)]
pub(super) struct RawPlugin {
    pub(super) name: String,
    #[serde(default = "default_true")]
    pub(super) enabled: bool,
    #[serde(default)]
    pub(super) settings: serde_json::Value,
}

fn default_listen() -> String {
    "0.0.0.0:8080".into()
}
fn default_admin_listen() -> String {
    "127.0.0.1:8081".into()
}
fn default_threads() -> usize {
    2
}
fn default_models_file() -> String {
    "models.yaml".into()
}
fn default_upstreams_file() -> String {
    "upstreams.yaml".into()
}
fn default_owned_by() -> String {
    "tollgate".into()
}
fn default_first_token() -> f64 {
    180.0
}
fn default_response() -> f64 {
    740.0
}
fn default_heartbeat() -> f64 {
    15.0
}
fn default_affinity_ttl() -> u64 {
    900
}
fn default_grace() -> u64 {
    800
}
fn default_final_timeout() -> u64 {
    5
}
fn default_true() -> bool {
    true
}
