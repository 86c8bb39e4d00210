//! `upstreams.yaml`: per model a pool of replicas (OpenAI-compatible model servers such as
//! vLLM or SGLang), each with its address and its own concurrency.

use std::net::SocketAddr;
use std::sync::Arc;
use std::sync::atomic::{AtomicBool, AtomicI64, AtomicU32, Ordering};
use std::time::Duration;

/// One model server.
#[derive(Debug)]
pub struct Replica {
    pub addr: SocketAddr,
    /// `host:port` as configured, sent as `Host`.
    pub authority: String,
    pub max_concurrency: u32,
    /// What changes at run time; the same value survives a reload that keeps the replica, so
    /// requests started before it count against the same capacity (decision 122).
    pub state: Arc<ReplicaState>,
}

/// A replica's counters and health, shared across reloads.
#[derive(Debug, Default)]
pub struct ReplicaState {
    /// Requests this gateway instance has on the replica now.
    pub in_flight: AtomicU32,
    /// Passive health: no new request is placed on it before this instant (Unix ms) after a
    /// connect failure (decision 121); 0 while healthy.
    pub ejected_until_ms: AtomicI64,
    /// Active health (decision 123).
    pub checks: HealthState,
    /// Passive health: failures in a row (timeouts, resets, 5xx), reset by an answer
    /// (decision 204).
    pub failures: AtomicU32,
}

/// The outcome of the active checks so far.
#[derive(Debug, Default)]
pub struct HealthState {
    /// Failed the last `unhealthy_after` checks and has not passed `healthy_after` since.
    pub down: AtomicBool,
    /// Consecutive checks whose outcome disagrees with `down` (failures while up, passes
    /// while down); reset by one that agrees.
    pub streak: AtomicU32,
    /// When the last check ended (Unix ms), 0 before the first.
    pub last_check_ms: AtomicI64,
    /// Why the last failed check failed.
    pub last_error: std::sync::Mutex<Option<String>>,
}

impl Replica {
    /// Takes new requests at `now`: not ejected after a refused connection and not failing
    /// its active checks.
    pub fn up(&self, now: i64) -> bool {
        self.state.ejected_until_ms.load(Ordering::Relaxed) <= now && !self.state.checks.down.load(Ordering::Relaxed)
    }

    /// Requests this instance has on it now.
    pub fn in_flight(&self) -> u32 {
        self.state.in_flight.load(Ordering::Acquire)
    }
}

/// Active health checks of one pool (`GET path` on each replica every `interval`).
#[derive(Debug, Clone)]
pub struct HealthCheck {
    pub path: String,
    pub interval: Duration,
    pub timeout: Duration,
    pub unhealthy_after: u32,
    pub healthy_after: u32,
}

/// TLS to a pool's replicas.
#[derive(Debug, Clone)]
pub struct UpstreamTls {
    /// Overrides the name checked in the certificates (else each replica's host).
    pub sni: Option<String>,
    /// The certificates of `ca_file`; `None`: the system's roots.
    pub ca: Option<Arc<pingora::protocols::tls::CaType>>,
    /// Fingerprint of the CA certificates, part of the upstream connections' reuse key: after a
    /// reload with another CA, no connection verified against the old one is reused.
    pub ca_fingerprint: u64,
}

impl UpstreamTls {
    /// The peer for `replica`, verified against this pool's CA and name.
    pub fn peer(&self, replica: &Replica) -> pingora::prelude::HttpPeer {
        let mut peer = pingora::prelude::HttpPeer::new(replica.addr, true, self.server_name(replica));
        peer.options.ca = self.ca.clone();
        peer.group_key = self.ca_fingerprint;
        peer
    }

    /// The name a replica's certificate must carry.
    pub fn server_name(&self, replica: &Replica) -> String {
        match &self.sni {
            Some(s) => s.clone(),
            None => host_of(&replica.authority).to_string(),
        }
    }
}

/// `host` of `host:port` (brackets of an IPv6 literal removed).
fn host_of(authority: &str) -> &str {
    let host = authority.rsplit_once(':').map_or(authority, |(h, _)| h);
    host.trim_start_matches('[').trim_end_matches(']')
}

/// The replicas serving one model.
#[derive(Debug)]
pub struct Pool {
    pub model_id: String,
    pub upstream_model: String,
    pub replicas: Vec<Arc<Replica>>,
    pub connect_timeout: Duration,
    /// An idle replica connection is closed after this.
    pub idle_connection: Duration,
    pub busy_threshold_percent: u8,
    /// `Authorization` value for the replicas, if they need one.
    pub authorization: Option<String>,
    pub health_check: Option<HealthCheck>,
    pub tls: Option<UpstreamTls>,
    /// Consecutive failures that eject a replica (decision 204).
    pub eject_after_failures: u32,
    /// A streamed request's response header must arrive within this.
    pub first_byte_timeout: Duration,
}

impl Pool {
    /// The model name the replicas serve: what a forwarded request's `model` becomes.
    pub fn to_upstream(&self) -> &str {
        &self.upstream_model
    }

    /// The catalog id to show the client where a replica answer says `name`: `Some` only when
    /// `name` is the replicas' own name and differs from the id (nothing to change otherwise).
    pub fn from_upstream(&self, name: &str) -> Option<&str> {
        (name == self.upstream_model && self.model_id != self.upstream_model).then_some(self.model_id.as_str())
    }

    /// Sum of replica concurrency.
    pub fn capacity(&self) -> u32 {
        self.replicas.iter().map(|r| r.max_concurrency).sum()
    }

    /// The peer of `replica`: over TLS, verified, when the pool says `tls: true`.
    pub fn peer(&self, replica: &Replica) -> pingora::prelude::HttpPeer {
        match &self.tls {
            Some(tls) => tls.peer(replica),
            None => pingora::prelude::HttpPeer::new(replica.addr, false, String::new()),
        }
    }

    /// The replica of this pool at `authority`, if any.
    pub fn replica(&self, authority: &str) -> Option<&Arc<Replica>> {
        self.replicas.iter().find(|r| r.authority == authority)
    }
}

/// Pools by catalog model id.
#[derive(Debug, Default)]
pub struct Pools {
    pub(super) by_model: crate::runtime::fast_map::FastMap<String, Arc<Pool>>,
}

impl Pools {
    pub fn get(&self, model_id: &str) -> Option<&Arc<Pool>> {
        self.by_model.get(model_id)
    }

    /// Every pool with its model id.
    pub fn iter(&self) -> impl Iterator<Item = (&String, &Arc<Pool>)> {
        self.by_model.iter()
    }
}

#[cfg(test)]
#[path = "upstreams_tests.rs"]
mod tests;
