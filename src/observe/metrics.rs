//! Prometheus metrics of the request path, served by the admin listener's `GET /metrics`
//! (with the admin token). Names follow the OpenTelemetry GenAI server conventions where one
//! exists. Labels are bounded: route, model (catalog ids, `-` for none), status, error code
//! (the catalogue), funding, token kind, replica (configured addresses). Never a key,
//! workspace or session.

use std::sync::LazyLock;
use std::time::Duration;

use prometheus::{
    HistogramOpts, HistogramVec, IntCounterVec, IntGaugeVec, Opts, register_histogram_vec, register_int_counter_vec,
    register_int_gauge_vec,
};

use crate::config::Config;
use crate::http::routes::Route;
use crate::money::usage::UsageFigures;

struct Metrics {
    requests: IntCounterVec,
    duration: HistogramVec,
    ttft: HistogramVec,
    tpot: HistogramVec,
    tokens: IntCounterVec,
    cost: IntCounterVec,
    replica_in_flight: IntGaugeVec,
    replica_up: IntGaugeVec,
    reloads: IntCounterVec,
    store_ops: IntCounterVec,
    store_seconds: HistogramVec,
    refusals: IntCounterVec,
    settlement_retries: IntCounterVec,
    holds_outstanding: IntGaugeVec,
    ejections: IntCounterVec,
    replica_retries: IntCounterVec,
    client_connections: prometheus::IntGauge,
    connections_shed: IntCounterVec,
}

const STORE_BUCKETS: &[f64] = &[0.0001, 0.00025, 0.0005, 0.001, 0.0025, 0.005, 0.01, 0.025, 0.05, 0.1, 0.25, 1.0];

const DURATION_BUCKETS: &[f64] =
    &[0.005, 0.01, 0.025, 0.05, 0.1, 0.25, 0.5, 1.0, 2.5, 5.0, 10.0, 30.0, 60.0, 120.0, 300.0, 740.0];
const TTFT_BUCKETS: &[f64] = &[0.001, 0.005, 0.01, 0.025, 0.05, 0.1, 0.25, 0.5, 1.0, 2.5, 5.0, 10.0, 30.0, 180.0];
const TPOT_BUCKETS: &[f64] = &[0.0005, 0.001, 0.0025, 0.005, 0.01, 0.025, 0.05, 0.1, 0.25, 0.5, 1.0];

fn register() -> prometheus::Result<Metrics> {
    let hist = |name: &str, help: &str, labels: &[&str], buckets: &[f64]| {
        register_histogram_vec!(HistogramOpts::new(name, help).buckets(buckets.to_vec()), labels)
    };
    Ok(Metrics {
        requests: register_int_counter_vec!(
            Opts::new("tollgate_requests_total", "Requests answered, by route, model, status and error code"),
            &["route", "model", "status", "code"]
        )?,
        duration: hist(
            "gen_ai_server_request_duration_seconds",
            "Time from the request's arrival to the end of its answer",
            &["route", "model"],
            DURATION_BUCKETS,
        )?,
        ttft: hist(
            "gen_ai_server_time_to_first_token_seconds",
            "Streamed answers: time to the first output token",
            &["model"],
            TTFT_BUCKETS,
        )?,
        tpot: hist(
            "gen_ai_server_time_per_output_token_seconds",
            "Streamed answers: time per output token after the first",
            &["model"],
            TPOT_BUCKETS,
        )?,
        tokens: register_int_counter_vec!(
            Opts::new("tollgate_tokens_total", "Tokens of answered requests (prompt, cached, completion), by funding"),
            &["model", "kind", "funding"]
        )?,
        cost: register_int_counter_vec!(
            Opts::new("tollgate_cost_microcents_total", "Charged cost (microcents), by model and funding"),
            &["model", "funding"]
        )?,
        replica_in_flight: register_int_gauge_vec!(
            Opts::new("tollgate_replica_in_flight", "Requests this instance has on each replica now"),
            &["model", "replica"]
        )?,
        replica_up: register_int_gauge_vec!(
            Opts::new(
                "tollgate_replica_up",
                "1 while the replica takes new requests, 0 while ejected or failing checks"
            ),
            &["model", "replica"]
        )?,
        reloads: register_int_counter_vec!(
            Opts::new("tollgate_config_reloads_total", "Reloads of models.yaml and upstreams.yaml, by outcome"),
            &["outcome"]
        )?,
        store_ops: register_int_counter_vec!(
            Opts::new("tollgate_store_operations_total", "Round trips to the identity, ledger and limiter stores"),
            &["store", "op", "outcome"]
        )?,
        store_seconds: hist(
            "tollgate_store_operation_seconds",
            "Latency of store round trips (a ledger batch counts once)",
            &["store", "op"],
            STORE_BUCKETS,
        )?,
        refusals: register_int_counter_vec!(
            Opts::new("tollgate_admission_refusals_total", "Requests refused by a rate limit or admission gate"),
            &["gate"]
        )?,
        settlement_retries: register_int_counter_vec!(
            Opts::new("tollgate_settlement_retries_total", "Ledger settlements retried after a store failure"),
            &["store"]
        )?,
        holds_outstanding: register_int_gauge_vec!(
            Opts::new(
                "tollgate_holds_outstanding",
                "Credit holds this instance has placed and not yet settled or released"
            ),
            &["store"]
        )?,
        ejections: register_int_counter_vec!(
            Opts::new(
                "tollgate_replica_ejections_total",
                "Replicas taken out of placement by passive health: refused connections, or consecutive failures"
            ),
            &["model", "replica", "reason"]
        )?,
        replica_retries: register_int_counter_vec!(
            Opts::new(
                "tollgate_replica_retries_total",
                "Requests sent to another replica after one gave no byte (connect failure, reset, no header in time)"
            ),
            &["model", "reason"]
        )?,
        client_connections: prometheus::register_int_gauge!(
            "tollgate_client_connections",
            "Client connections open on the public listener"
        )?,
        connections_shed: register_int_counter_vec!(
            Opts::new(
                "tollgate_client_connections_shed_total",
                "At the connection cap: idle connections closed to make room, and new ones refused"
            ),
            &["action"]
        )?,
    })
}

/// A replica was ejected by passive health (`reason`: a fixed name).
pub fn replica_ejected(model: &str, replica: &str, reason: &str) {
    if let Some(m) = metrics() {
        m.ejections.with_label_values(&[model, replica, reason]).inc();
    }
}

/// A request was sent to another replica after `reason` (a fixed name).
pub fn replica_retried(model: &str, reason: &str) {
    if let Some(m) = metrics() {
        m.replica_retries.with_label_values(&[model, reason]).inc();
    }
}

/// `metrics.enabled` in `tollgate.yaml` (default on); set once at start.
static ENABLED: std::sync::atomic::AtomicBool = std::sync::atomic::AtomicBool::new(true);

/// Turn recording off (`metrics: { enabled: false }`): every record call returns at once.
pub fn set_enabled(on: bool) {
    ENABLED.store(on, std::sync::atomic::Ordering::Relaxed);
}

fn metrics() -> Option<&'static Metrics> {
    if ENABLED.load(std::sync::atomic::Ordering::Relaxed) { METRICS.as_ref() } else { None }
}

static METRICS: LazyLock<Option<Metrics>> =
    LazyLock::new(|| register().map_err(|e| log::error!("metrics not registered: {e}")).ok());

fn route_name(route: Option<Route>) -> &'static str {
    match route {
        Some(Route::ListModels | Route::GetModel) => "models",
        Some(Route::Credits) => "credits",
        Some(Route::Usage) => "usage",
        Some(Route::CountTokens) => "count_tokens",
        Some(r) => r.endpoint_name(),
        None => "unknown",
    }
}

/// A finished request, as the metrics see it (the proxy reads it off its context).
pub struct Finished<'a> {
    pub route: Option<Route>,
    pub model: &'a str,
    pub status: u16,
    /// The error code, `-` when none.
    pub code: &'a str,
    pub elapsed: Duration,
    pub first_token_after: Option<Duration>,
    pub usage: Option<UsageFigures>,
    /// Who paid, as a label.
    pub funding: &'static str,
}

/// Record a finished request (the logging phase).
pub fn record(f: &Finished) {
    let Some(m) = metrics() else { return };
    let route = route_name(f.route);
    let model = f.model;
    let mut status_buf = itoa_buf(f.status);
    m.requests.with_label_values(&[route, model, status_str(&mut status_buf), f.code]).inc();
    m.duration.with_label_values(&[route, model]).observe(f.elapsed.as_secs_f64());
    if let Some(first) = f.first_token_after {
        m.ttft.with_label_values(&[model]).observe(first.as_secs_f64());
        let completion = f.usage.map_or(0, |u| u.completion_tokens);
        if completion > 1 {
            let per = f.elapsed.saturating_sub(first).as_secs_f64() / (completion - 1) as f64;
            m.tpot.with_label_values(&[model]).observe(per);
        }
    }
    if let Some(u) = f.usage {
        for (kind, n) in [("prompt", u.prompt_tokens), ("cached", u.cached_tokens), ("completion", u.completion_tokens)]
        {
            m.tokens.with_label_values(&[model, kind, f.funding]).inc_by(n);
        }
        m.cost.with_label_values(&[model, f.funding]).inc_by(u.cost.0);
    }
}

fn itoa_buf(status: u16) -> [u8; 3] {
    let s = status.min(999);
    [b'0' + (s / 100) as u8, b'0' + (s / 10 % 10) as u8, b'0' + (s % 10) as u8]
}

fn status_str(buf: &mut [u8; 3]) -> &str {
    std::str::from_utf8(buf).unwrap_or("000")
}

/// Bring the gauges read at scrape time up to date (the admin listener, before gathering).
pub fn refresh(config: &Config) {
    let Some(m) = metrics() else { return };
    let now = crate::runtime::clock::now_ms();
    // Replicas a reload removed leave the gauges.
    m.replica_in_flight.reset();
    m.replica_up.reset();
    for (model, pool) in config.pools.iter() {
        for r in &pool.replicas {
            let labels = [model.as_str(), r.authority.as_str()];
            let n = r.in_flight();
            m.replica_in_flight.with_label_values(&labels).set(i64::from(n));
            m.replica_up.with_label_values(&labels).set(i64::from(r.up(now)));
        }
    }
}

/// A reload of the operator files ended (`ok`: put in force).
pub fn config_reloaded(ok: bool) {
    if let Some(m) = metrics() {
        m.reloads.with_label_values(&[if ok { "ok" } else { "invalid" }]).inc();
    }
}

/// The series of one store operation, resolved once (a call site keeps it in a static, so
/// recording is two atomic adds and a histogram observation, no label lookup).
pub struct StoreOp {
    ok: prometheus::IntCounter,
    error: prometheus::IntCounter,
    seconds: prometheus::Histogram,
}

impl StoreOp {
    /// `store` is identity, ledger or limiter; `op` a fixed name.
    pub fn new(store: &str, op: &str) -> Option<StoreOp> {
        let m = metrics()?;
        Some(StoreOp {
            ok: m.store_ops.with_label_values(&[store, op, "ok"]),
            error: m.store_ops.with_label_values(&[store, op, "error"]),
            seconds: m.store_seconds.with_label_values(&[store, op]),
        })
    }

    /// One round trip that took `elapsed`.
    pub fn record(this: &Option<StoreOp>, ok: bool, elapsed: Duration) {
        if let Some(s) = this {
            if ok { &s.ok } else { &s.error }.inc();
            s.seconds.observe(elapsed.as_secs_f64());
        }
    }
}

/// A request refused by `gate` (a fixed name per limit layer).
pub fn admission_refused(gate: &str) {
    if let Some(m) = metrics() {
        m.refusals.with_label_values(&[gate]).inc();
    }
}

/// A ledger settlement that failed and is tried again.
pub fn settlement_retried() {
    if let Some(m) = metrics() {
        m.settlement_retries.with_label_values(&["ledger"]).inc();
    }
}

/// The ledger's holds gauge, resolved at the first hold (moved twice per billed request, so
/// no label lookup each time).
static HOLDS: LazyLock<Option<prometheus::IntGauge>> =
    LazyLock::new(|| metrics().map(|m| m.holds_outstanding.with_label_values(&["ledger"])));

/// Ledger holds placed (+1) and settled or released (-1).
pub fn holds_moved(delta: i64) {
    if let Some(g) = HOLDS.as_ref() {
        g.add(delta);
    }
}

/// Client connections opened (+1) and ended (-1).
pub fn client_connections(delta: i64) {
    if let Some(m) = metrics() {
        m.client_connections.add(delta);
    }
}

/// The connection cap closed an idle connection (`closed_idle`) or refused a new one (`refused`).
pub fn connection_shed(action: &str) {
    if let Some(m) = metrics() {
        m.connections_shed.with_label_values(&[action]).inc();
    }
}
