//! The `client` section of `tollgate.yaml`: what one client connection may cost the gateway
//! before it is admitted (issue 49). Header size and count (the replica gets nothing larger),
//! the bytes of request bodies being read at once across the node, how long a request's head
//! and body may take to arrive, how long a kept-alive connection may sit idle, and how many
//! connections may be open at once.

use std::time::Duration;

use serde::Deserialize;

use super::Problems;

#[derive(Deserialize)]
#[serde(deny_unknown_fields)]
pub(super) struct RawClient {
    #[serde(default = "default_max_header_bytes")]
    max_header_bytes: u64,
    #[serde(default = "default_max_headers")]
    max_headers: u64,
    #[serde(default = "default_body_buffer_budget")]
    body_buffer_budget_bytes: u64,
    #[serde(default = "default_body_timeout")]
    body_timeout_seconds: f64,
    #[serde(default = "default_body_min_rate")]
    body_min_rate_bytes_per_second: u64,
    #[serde(default = "default_head_timeout")]
    head_timeout_seconds: u64,
    #[serde(default = "default_idle_timeout")]
    idle_timeout_seconds: u64,
    #[serde(default = "default_stalled_reader")]
    stalled_reader_seconds: u64,
    #[serde(default = "default_max_connections")]
    max_connections: u64,
    /// Cleartext HTTP/2 with prior knowledge on the plain listener, beside HTTP/1.1.
    #[serde(default)]
    h2c: bool,
    /// Load balancers whose PROXY header or forwarding header is believed (addresses, CIDR).
    #[serde(default)]
    pub(super) trusted_proxies: Vec<String>,
    /// `x-forwarded-for` (default with trusted proxies), `x-real-ip` or `none`.
    #[serde(default)]
    pub(super) real_ip_header: Option<String>,
    /// Connections to the public listener start with a PROXY protocol header (v1 or v2).
    #[serde(default)]
    pub(super) proxy_protocol: bool,
}

impl Default for RawClient {
    fn default() -> Self {
        RawClient {
            max_header_bytes: default_max_header_bytes(),
            max_headers: default_max_headers(),
            body_buffer_budget_bytes: default_body_buffer_budget(),
            body_timeout_seconds: default_body_timeout(),
            body_min_rate_bytes_per_second: default_body_min_rate(),
            head_timeout_seconds: default_head_timeout(),
            idle_timeout_seconds: default_idle_timeout(),
            stalled_reader_seconds: default_stalled_reader(),
            max_connections: default_max_connections(),
            h2c: false,
            trusted_proxies: Vec::new(),
            real_ip_header: None,
            proxy_protocol: false,
        }
    }
}

/// Envoy's defaults: 60 KiB of headers, 100 of them.
fn default_max_header_bytes() -> u64 {
    60 * 1024
}
fn default_max_headers() -> u64 {
    100
}
/// 64 bodies of the largest size at once.
fn default_body_buffer_budget() -> u64 {
    256 * 1024 * 1024
}
fn default_body_timeout() -> f64 {
    30.0
}
/// nginx's `client_header_timeout` is 60 s; a head is one write for every real client.
fn default_head_timeout() -> u64 {
    10
}
/// nginx's `keepalive_timeout` is 75 s, Envoy's idle timeout an hour.
fn default_idle_timeout() -> u64 {
    60
}
/// nginx's `send_timeout`: between two successive writes, not for a whole one.
fn default_stalled_reader() -> u64 {
    60
}
/// Above the 2,048 concurrent streams the gateway is tested with, well under the unit's
/// 65,536 descriptors.
fn default_max_connections() -> u64 {
    10_000
}
/// A body of the largest size (3.5 MB) gets about 54 s at this rate.
fn default_body_min_rate() -> u64 {
    64 * 1024
}

/// Checked client limits.
#[derive(Debug, Clone, Copy)]
pub struct ClientLimits {
    /// Most bytes of a request's header lines (names, values, separators).
    pub max_header_bytes: u64,
    /// Most header lines in a request.
    pub max_headers: u64,
    /// Most bytes of request bodies being read at once on this node (before admission).
    pub body_buffer_budget: u64,
    /// Floor of a body's deadline; a large body gets more at `body_min_rate`.
    pub body_timeout: Duration,
    pub body_min_rate: u64,
    /// A request head must arrive whole within this once its first bytes did (else `408`).
    pub head_timeout: Duration,
    /// A kept-alive connection is closed after this long without a request.
    pub idle_timeout_seconds: u64,
    /// A client that reads nothing of its answer for this long is ended.
    pub stalled_reader: Duration,
    /// Most client connections open at once; at it, the oldest idle one is closed for a new one.
    pub max_connections: usize,
    /// The plain listener also takes cleartext HTTP/2 (prior knowledge).
    pub h2c: bool,
}

impl ClientLimits {
    /// How long a body of `len` bytes (declared; unknown for chunked uploads: the limit) may
    /// take to arrive: the floor, or the time at the minimum rate if longer.
    pub fn body_deadline(&self, len: u64) -> Duration {
        let at_rate = Duration::from_secs_f64(len as f64 / self.body_min_rate.max(1) as f64);
        self.body_timeout.max(at_rate)
    }
}

pub(super) fn check(p: &mut Problems, raw: &RawClient) -> ClientLimits {
    if !(1024..=1024 * 1024).contains(&raw.max_header_bytes) {
        p.add("client.max_header_bytes", "must be 1024..=1048576");
    }
    if !(8..=1000).contains(&raw.max_headers) {
        p.add("client.max_headers", "must be 8..=1000");
    }
    if raw.body_buffer_budget_bytes < 4 * 1024 * 1024 {
        p.add("client.body_buffer_budget_bytes", "must be at least 4194304 (one body of the largest size)");
    }
    if !(raw.body_timeout_seconds.is_finite() && (1.0..=3600.0).contains(&raw.body_timeout_seconds)) {
        p.add("client.body_timeout_seconds", "must be a number of seconds in [1, 3600]");
    }
    if raw.body_min_rate_bytes_per_second == 0 {
        p.add("client.body_min_rate_bytes_per_second", "must be above 0");
    }
    if !(1..=600).contains(&raw.head_timeout_seconds) {
        p.add("client.head_timeout_seconds", "must be 1..=600");
    }
    if !(1..=86_400).contains(&raw.idle_timeout_seconds) {
        p.add("client.idle_timeout_seconds", "must be 1..=86400");
    }
    if !(1..=3_600).contains(&raw.stalled_reader_seconds) {
        p.add("client.stalled_reader_seconds", "must be 1..=3600");
    }
    if !(1..=1_000_000).contains(&raw.max_connections) {
        p.add("client.max_connections", "must be 1..=1000000");
    }
    ClientLimits {
        max_header_bytes: raw.max_header_bytes,
        max_headers: raw.max_headers,
        body_buffer_budget: raw.body_buffer_budget_bytes,
        body_timeout: Duration::from_secs_f64(raw.body_timeout_seconds.clamp(1.0, 3600.0)),
        body_min_rate: raw.body_min_rate_bytes_per_second.max(1),
        head_timeout: Duration::from_secs(raw.head_timeout_seconds.clamp(1, 600)),
        idle_timeout_seconds: raw.idle_timeout_seconds.clamp(1, 86_400),
        stalled_reader: Duration::from_secs(raw.stalled_reader_seconds.clamp(1, 3_600)),
        max_connections: usize::try_from(raw.max_connections.clamp(1, 1_000_000)).unwrap_or(1_000_000),
        h2c: raw.h2c,
    }
}
