//! What the gateway tells its operator: Prometheus metrics, the access log, request traces.

pub mod access_log;
pub mod metrics;
pub mod traces;
