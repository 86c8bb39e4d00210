//! `upstreams.yaml`: per model a pool of replicas (OpenAI-compatible model servers such as
//! vLLM or SGLang), each with its address and its own concurrency.

use std::collections::{BTreeMap, HashMap};
use std::net::{SocketAddr, ToSocketAddrs};
use std::path::Path;
use std::sync::Arc;
use std::sync::atomic::AtomicU32;
use std::time::Duration;

use serde::Deserialize;

use super::{Catalog, ConfigProblem, Problems, parse_yaml};

#[derive(Deserialize)]
#[serde(deny_unknown_fields)]
struct RawUpstreams {
    pools: BTreeMap<String, RawPool>,
}

#[derive(Deserialize)]
#[serde(deny_unknown_fields)]
struct RawPool {
    /// The model name the replicas serve; default: the catalog id.
    upstream_model: Option<String>,
    replicas: Vec<RawReplica>,
    #[serde(default = "default_connect_timeout_ms")]
    connect_timeout_ms: u64,
    /// Clarification 5: busy at or above this share of the pool's capacity.
    #[serde(default = "default_busy_percent")]
    busy_threshold_percent: u8,
    /// Environment variable holding a bearer token the replicas expect (never the client's).
    api_key_env: Option<String>,
}

#[derive(Deserialize)]
#[serde(deny_unknown_fields)]
struct RawReplica {
    address: String,
    max_concurrency: u32,
}

fn default_connect_timeout_ms() -> u64 {
    2_000
}
fn default_busy_percent() -> u8 {
    75
}

/// One model server.
#[derive(Debug)]
pub struct Replica {
    pub addr: SocketAddr,
    /// `host:port` as configured, sent as `Host`.
    pub authority: String,
    pub max_concurrency: u32,
    /// Requests this gateway instance has on the replica now.
    pub in_flight: AtomicU32,
    /// Passive health: no new request is placed on it before this instant (Unix ms) after a
    /// connect failure (decision 121); 0 while healthy.
    pub ejected_until_ms: std::sync::atomic::AtomicI64,
}

impl Replica {
    /// Takes new requests at `now` (not ejected).
    pub fn up(&self, now: i64) -> bool {
        self.ejected_until_ms.load(std::sync::atomic::Ordering::Relaxed) <= now
    }
}

/// The replicas serving one model.
#[derive(Debug)]
pub struct Pool {
    pub model_id: String,
    pub upstream_model: String,
    pub replicas: Vec<Arc<Replica>>,
    pub connect_timeout: Duration,
    pub busy_threshold_percent: u8,
    /// `Authorization` value for the replicas, if they need one.
    pub authorization: Option<String>,
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
}

/// Pools by catalog model id.
#[derive(Debug, Default)]
pub struct Pools {
    by_model: HashMap<String, Arc<Pool>>,
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

pub(super) fn load(file: &Path, catalog: &Catalog, out: &mut Vec<ConfigProblem>) -> Option<Pools> {
    let raw: RawUpstreams = parse_yaml(file, out)?;
    let before = out.len();
    let mut p = Problems::new(file, out);
    let mut pools = Pools::default();
    for (model, pool) in raw.pools {
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
        let mut replicas = Vec::new();
        for (i, r) in pool.replicas.iter().enumerate() {
            let rat = |f: &str| format!("pools.{model}.replicas[{i}].{f}");
            if r.max_concurrency == 0 || r.max_concurrency > 100_000 {
                p.add(rat("max_concurrency"), format!("must be 1..=100000, got {}", r.max_concurrency));
            }
            match r.address.to_socket_addrs().map(|mut a| a.next()) {
                Ok(Some(addr)) => replicas.push(Arc::new(Replica {
                    addr,
                    authority: r.address.clone(),
                    max_concurrency: r.max_concurrency.max(1),
                    in_flight: AtomicU32::new(0),
                    ejected_until_ms: std::sync::atomic::AtomicI64::new(0),
                })),
                _ => p.add(rat("address"), format!("`{}` is not a reachable host:port", r.address)),
            }
        }
        let pool = Pool {
            model_id: entry.id.clone(),
            upstream_model: pool.upstream_model.unwrap_or_else(|| entry.id.clone()),
            replicas,
            connect_timeout: Duration::from_millis(pool.connect_timeout_ms.max(1)),
            busy_threshold_percent: pool.busy_threshold_percent,
            authorization,
        };
        pools.by_model.insert(entry.id.clone(), Arc::new(pool));
    }
    (out.len() == before).then_some(pools)
}

#[cfg(test)]
mod tests {
    use super::*;

    fn pool(model_id: &str, upstream: &str) -> Pool {
        Pool {
            model_id: model_id.into(),
            upstream_model: upstream.into(),
            replicas: Vec::new(),
            connect_timeout: Duration::from_millis(1),
            busy_threshold_percent: 75,
            authorization: None,
        }
    }

    #[test]
    fn the_model_name_is_renamed_both_ways_in_one_place() {
        let p = pool("llama-3.1-8b", "meta-llama/Llama-3.1-8B");
        assert_eq!(p.to_upstream(), "meta-llama/Llama-3.1-8B");
        assert_eq!(p.from_upstream("meta-llama/Llama-3.1-8B"), Some("llama-3.1-8b"));
        assert_eq!(p.from_upstream("something-else"), None, "another name is left as it is");
        let same = pool("m", "m");
        assert_eq!(same.from_upstream("m"), None, "nothing to change when the names agree");
    }
}
