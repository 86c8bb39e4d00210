//! The `tracing` section of `tollgate.yaml` (decision 215): OTLP export of request traces.
//! Absent: no traces (a client's `traceparent` then reaches the replica untouched).

use serde::Deserialize;

use super::Problems;
use crate::observe::traces::TracingSettings;

#[derive(Deserialize)]
#[serde(deny_unknown_fields)]
pub(super) struct RawTracing {
    /// The collector's OTLP/HTTP traces URL, e.g. `http://127.0.0.1:4318/v1/traces`.
    otlp_endpoint: String,
    #[serde(default = "default_ratio")]
    sample_ratio: f64,
    #[serde(default = "default_service")]
    service_name: String,
}

/// One request in a hundred, unless the client's `traceparent` says it is sampled.
fn default_ratio() -> f64 {
    0.01
}

fn default_service() -> String {
    "tollgate".into()
}

pub(super) fn check(p: &mut Problems, raw: &RawTracing) -> Option<TracingSettings> {
    let mut ok = true;
    if !raw.otlp_endpoint.starts_with("http://") || raw.otlp_endpoint.len() <= "http://".len() {
        let why = if raw.otlp_endpoint.starts_with("https://") {
            "must be an http:// URL: this build exports to a collector on the host or a sidecar, without TLS"
        } else {
            "must be an http:// URL of an OTLP/HTTP traces endpoint (e.g. http://127.0.0.1:4318/v1/traces)"
        };
        p.add("tracing.otlp_endpoint", why);
        ok = false;
    }
    if !(raw.sample_ratio.is_finite() && (0.0..=1.0).contains(&raw.sample_ratio)) {
        p.add("tracing.sample_ratio", "must be between 0 and 1");
        ok = false;
    }
    if raw.service_name.is_empty() || raw.service_name.len() > 128 {
        p.add("tracing.service_name", "must be 1 to 128 characters");
        ok = false;
    }
    ok.then(|| TracingSettings {
        otlp_endpoint: raw.otlp_endpoint.clone(),
        sample_ratio: raw.sample_ratio,
        service_name: raw.service_name.clone(),
    })
}
