//! `upstreams.yaml` as written (`Raw*`, unknown fields refused) and the checks that turn it
//! into the running pools, each problem named by its dotted field path.

use std::net::ToSocketAddrs;
use std::path::Path;
use std::sync::Arc;
use std::time::Duration;

use serde::Deserialize;

use super::upstreams::{HealthCheck, Pool, Pools, Replica, UpstreamTls};
use super::{Catalog, ConfigProblem, Problems, parse_yaml};

#[derive(Deserialize)]
#[serde(deny_unknown_fields)]
struct RawUpstreams {
    pools: super::unique::UniqueKeys<RawPool>,
}

#[derive(Deserialize)]
#[serde(deny_unknown_fields)]
struct RawPool {
    /// The model name the replicas serve; default: the catalog id.
    upstream_model: Option<String>,
    replicas: Vec<RawReplica>,
    #[serde(default = "default_connect_timeout_ms")]
    connect_timeout_ms: u64,
    /// A replica connection left idle this long is closed rather than kept for reuse.
    #[serde(default = "default_idle_connection_ms")]
    idle_connection_ms: u64,
    /// Clarification 5: busy at or above this share of the pool's capacity.
    #[serde(default = "default_busy_percent")]
    busy_threshold_percent: u8,
    /// Environment variable holding a bearer token the replicas expect (never the client's).
    api_key_env: Option<String>,
    /// Active health checks; off unless given (decision 123).
    health_check: Option<RawHealthCheck>,
    /// Passive health: consecutive failures (timeouts, resets, 5xx answers) after which a
    /// replica is ejected like one that refused a connection (decision 204).
    #[serde(default = "default_eject_after_failures")]
    eject_after_failures: u32,
    /// A streamed request's replica must send its response header within this, else it is
    /// taken as not answering (and the request tried once on another replica).
    #[serde(default = "default_first_byte_timeout_ms")]
    first_byte_timeout_ms: u64,
    /// `https://` replicas: certificates verified against `ca_file` (else the system roots).
    #[serde(default)]
    tls: bool,
    ca_file: Option<String>,
    /// Name the certificates must carry; default: the host of each replica's address.
    sni: Option<String>,
}

#[derive(Deserialize)]
#[serde(deny_unknown_fields)]
struct RawReplica {
    address: String,
    max_concurrency: u32,
}

#[derive(Deserialize)]
#[serde(deny_unknown_fields)]
struct RawHealthCheck {
    #[serde(default = "default_health_path")]
    path: String,
    #[serde(default = "default_health_interval")]
    interval_ms: u64,
    #[serde(default = "default_health_timeout")]
    timeout_ms: u64,
    #[serde(default = "default_unhealthy_after")]
    unhealthy_after: u32,
    #[serde(default = "default_healthy_after")]
    healthy_after: u32,
}

fn default_connect_timeout_ms() -> u64 {
    2_000
}
/// Under the 5 s keep-alive of uvicorn (vLLM, SGLang): the gateway closes an idle connection
/// before the replica does, so a request never goes out on one the replica is closing, and
/// the connections (and their buffers) a burst opened are gone seconds after it.
fn default_idle_connection_ms() -> u64 {
    4_000
}
fn default_eject_after_failures() -> u32 {
    3
}
fn default_first_byte_timeout_ms() -> u64 {
    30_000
}
fn default_busy_percent() -> u8 {
    75
}
fn default_health_path() -> String {
    "/health".into()
}
fn default_health_interval() -> u64 {
    5_000
}
fn default_health_timeout() -> u64 {
    1_000
}
fn default_unhealthy_after() -> u32 {
    3
}
fn default_healthy_after() -> u32 {
    2
}

/// Load and check `upstreams.yaml`. On a reload, `previous` is the running pools: a replica
/// kept (same model, same address) keeps its counters and health.
pub(super) fn load(
    file: &Path,
    catalog: &Catalog,
    previous: Option<&Pools>,
    out: &mut Vec<ConfigProblem>,
) -> Option<Pools> {
    let raw: RawUpstreams = parse_yaml(file, out)?;
    let before = out.len();
    let mut p = Problems::new(file, out);
    let mut pools = Pools::default();
    for (model, pool) in raw.pools.0 {
        let at = |f: &str| format!("pools.{model}.{f}");
        let Some(entry) = catalog.get(&model) else {
            p.add(format!("pools.{model}"), "names no model id of the catalog");
            continue;
        };
        if entry.id != model {
            p.add(format!("pools.{model}"), format!("use the model id `{}`, not an alias", entry.id));
        }
        if pool.replicas.is_empty() {
            p.add(at("replicas"), "needs at least one replica");
        }
        if !(1..=100).contains(&pool.busy_threshold_percent) {
            p.add(at("busy_threshold_percent"), "must be 1..=100");
        }
        if pool.connect_timeout_ms == 0 || pool.connect_timeout_ms > 60_000 {
            p.add(at("connect_timeout_ms"), "must be 1..=60000");
        }
        if !(100..=300_000).contains(&pool.idle_connection_ms) {
            p.add(at("idle_connection_ms"), "must be 100..=300000");
        }
        if !(1..=1_000).contains(&pool.eject_after_failures) {
            p.add(at("eject_after_failures"), "must be 1..=1000");
        }
        if !(100..=740_000).contains(&pool.first_byte_timeout_ms) {
            p.add(at("first_byte_timeout_ms"), "must be 100..=740000");
        }
        let authorization = match &pool.api_key_env {
            Some(var) => match std::env::var(var) {
                Ok(v) if !v.trim().is_empty() => Some(format!("Bearer {}", v.trim())),
                _ => {
                    p.add(at("api_key_env"), format!("environment variable `{var}` is not set"));
                    None
                }
            },
            None => None,
        };
        if let Some(name) = &pool.upstream_model {
            if !super::valid_model_name(name) {
                p.add(at("upstream_model"), "must be 1 to 256 characters without spaces or control characters");
            }
        }
        let health_check = pool.health_check.as_ref().map(|h| health_check(&mut p, &model, h));
        let tls = upstream_tls(&mut p, file, &model, &pool);
        let kept = previous.and_then(|old| old.get(&model));
        let mut replicas = Vec::new();
        for (i, r) in pool.replicas.iter().enumerate() {
            let rat = |f: &str| format!("pools.{model}.replicas[{i}].{f}");
            if r.max_concurrency == 0 || r.max_concurrency > 100_000 {
                p.add(rat("max_concurrency"), format!("must be 1..=100000, got {}", r.max_concurrency));
            }
            match r.address.to_socket_addrs().map(|mut a| a.next()) {
                Ok(Some(addr)) if addr.port() == 0 => {
                    p.add(rat("address"), format!("`{}` has port 0, which no replica listens on", r.address));
                }
                // Listed twice, one server's capacity would count twice (names compared as
                // written: two names behind one address are two replicas by their `Host`).
                Ok(Some(_))
                    if replicas.iter().any(|seen: &Arc<Replica>| seen.authority.eq_ignore_ascii_case(&r.address)) =>
                {
                    p.add(rat("address"), format!("`{}` is listed twice in this pool", r.address));
                }
                Ok(Some(addr)) => replicas.push(Arc::new(Replica {
                    addr,
                    authority: r.address.clone(),
                    max_concurrency: r.max_concurrency.max(1),
                    state: kept
                        .and_then(|old| old.replica(&r.address))
                        .map_or_else(Default::default, |old| old.state.clone()),
                })),
                _ => p.add(rat("address"), format!("`{}` is not a reachable host:port", r.address)),
            }
        }
        let pool = Pool {
            model_id: entry.id.clone(),
            upstream_model: pool.upstream_model.unwrap_or_else(|| entry.id.clone()),
            replicas,
            connect_timeout: Duration::from_millis(pool.connect_timeout_ms.max(1)),
            idle_connection: Duration::from_millis(pool.idle_connection_ms.max(1)),
            busy_threshold_percent: pool.busy_threshold_percent,
            authorization,
            health_check,
            tls,
            eject_after_failures: pool.eject_after_failures.max(1),
            first_byte_timeout: Duration::from_millis(pool.first_byte_timeout_ms.max(1)),
        };
        pools.by_model.insert(entry.id.clone(), Arc::new(pool));
    }
    (out.len() == before).then_some(pools)
}

fn health_check(p: &mut Problems, model: &str, h: &RawHealthCheck) -> HealthCheck {
    let at = |f: &str| format!("pools.{model}.health_check.{f}");
    if !h.path.starts_with('/') || h.path.len() > 256 || h.path.bytes().any(|b| b <= b' ' || b == 0x7f) {
        p.add(at("path"), format!("`{}` must be a path starting with `/`, without spaces, at most 256 bytes", h.path));
    }
    if !(100..=3_600_000).contains(&h.interval_ms) {
        p.add(at("interval_ms"), "must be 100..=3600000");
    }
    if h.timeout_ms == 0 || h.timeout_ms > h.interval_ms {
        p.add(at("timeout_ms"), "must be at least 1 and at most interval_ms");
    }
    for (name, v) in [("unhealthy_after", h.unhealthy_after), ("healthy_after", h.healthy_after)] {
        if !(1..=100).contains(&v) {
            p.add(at(name), format!("must be 1..=100, got {v}"));
        }
    }
    HealthCheck {
        path: h.path.clone(),
        interval: Duration::from_millis(h.interval_ms.max(100)),
        timeout: Duration::from_millis(h.timeout_ms.max(1)),
        unhealthy_after: h.unhealthy_after.max(1),
        healthy_after: h.healthy_after.max(1),
    }
}

fn upstream_tls(p: &mut Problems, file: &Path, model: &str, pool: &RawPool) -> Option<UpstreamTls> {
    let at = |f: &str| format!("pools.{model}.{f}");
    if !pool.tls {
        if pool.ca_file.is_some() || pool.sni.is_some() {
            p.add(at("tls"), "`ca_file` and `sni` need `tls: true`");
        }
        return None;
    }
    if let Some(sni) = &pool.sni {
        if sni.is_empty() || sni.len() > 253 || !sni.bytes().all(|b| b.is_ascii_alphanumeric() || b"-._".contains(&b)) {
            p.add(at("sni"), format!("`{sni}` is not a host name"));
        }
    }
    let mut ca_fingerprint = 0;
    let ca = pool.ca_file.as_ref().and_then(|name| {
        let path = super::sibling(file, name);
        let der = super::tls::pem_certificates(&path).inspect(|der| {
            use std::hash::{Hash, Hasher};
            let mut h = std::collections::hash_map::DefaultHasher::new();
            der.hash(&mut h);
            ca_fingerprint = h.finish();
        });
        match der.and_then(super::tls::ca_list) {
            Ok(ca) => Some(ca),
            Err(e) => {
                p.add(at("ca_file"), format!("{}: {e}", path.display()));
                None
            }
        }
    });
    Some(UpstreamTls { sni: pool.sni.clone(), ca, ca_fingerprint })
}
