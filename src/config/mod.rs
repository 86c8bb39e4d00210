//! Configuration: `conf/tollgate.yaml` names the listeners, budgets, plugins and the two
//! operator-edited files, `models.yaml` (the catalog) and `upstreams.yaml` (replica pools).
//!
//! One path from files to [`Config`]: each file is parsed into `Raw*` structs that deny
//! unknown fields (a typo is an error, not a silent default), then checked into runtime
//! types. Every problem is collected with its file and dotted field path, so `check-config`
//! and `serve` can list them all at once; a bad config never starts a half-working server.

mod catalog;
mod catalog_check;
mod chat_rules;
mod client;
mod client_address;
mod gateway;
mod gateway_file;
mod identity;
mod limits;
mod live;
mod plans;
mod process;
mod tls;
mod tokenizer;
mod tracing;
mod unique;
mod upstreams;
mod upstreams_check;

pub use catalog::{Catalog, ModelEntry, Pricing};
pub use chat_rules::{ChatRules, SystemMessages};
pub use client::ClientLimits;
pub use client_address::{ClientAddressing, RealIpHeader, canonical as canonical_ip};
pub use gateway::{Budgets, GatewaySettings, PluginSpec};
pub use identity::{IdentitySettings, Secret};
pub use limits::{GateSettings, LimitSettings, Tiers};
pub use live::{LiveConfig, ReloadReport};
pub use tls::ListenerTls;
pub use tokenizer::PromptTokenizer;
pub use upstreams::{HealthCheck, HealthState, Pool, Pools, Replica, ReplicaState, UpstreamTls};

use std::fmt;
use std::path::{Path, PathBuf};

use serde::de::DeserializeOwned;

/// One thing wrong with the configuration.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct ConfigProblem {
    pub file: PathBuf,
    /// Dotted path of the field, e.g. `models[2].pricing.input`; `.` for the whole file.
    pub path: String,
    pub problem: String,
}

impl fmt::Display for ConfigProblem {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        write!(f, "{}: {}: {}", self.file.display(), self.path, self.problem)
    }
}

/// Every problem found, in file order.
#[derive(Debug, Default)]
pub struct ConfigErrors(pub Vec<ConfigProblem>);

impl fmt::Display for ConfigErrors {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        for p in &self.0 {
            writeln!(f, "{p}")?;
        }
        Ok(())
    }
}

impl std::error::Error for ConfigErrors {}

/// Collects problems for one file.
pub(crate) struct Problems<'a> {
    file: &'a Path,
    out: &'a mut Vec<ConfigProblem>,
}

impl<'a> Problems<'a> {
    pub(crate) fn new(file: &'a Path, out: &'a mut Vec<ConfigProblem>) -> Self {
        Problems { file, out }
    }

    pub(crate) fn add(&mut self, path: impl Into<String>, problem: impl Into<String>) {
        self.out.push(ConfigProblem { file: self.file.to_path_buf(), path: path.into(), problem: problem.into() });
    }
}

/// The checked configuration a server runs with. `gateway` (`tollgate.yaml`) is fixed for
/// the life of the process; `catalog` and `pools` are replaced whole by a reload.
#[derive(Debug)]
pub struct Config {
    pub gateway: std::sync::Arc<GatewaySettings>,
    pub catalog: Catalog,
    pub pools: Pools,
    /// Where `tollgate.yaml` was read from (relative paths in it resolve against its folder).
    pub source: PathBuf,
}

impl Config {
    /// What is valid but likely not meant, said by `check-config` and at start: an admin
    /// listener nobody can use, a chain that serves every caller without a key, a model
    /// that a billed chain serves at no charge because `pricing` is missing (decision 174).
    pub fn warnings(&self) -> Vec<String> {
        let chain = |name: &str| self.gateway.plugins.iter().any(|p| p.name == name);
        let mut out = Vec::new();
        if self.gateway.admin_token.is_none() {
            out.push("no admin token configured: the admin listener refuses every call".to_string());
        }
        if chain("limits") && matches!(self.gateway.limits.store, crate::state::limits::LimiterConfig::Disabled) {
            out.push(
                "`limits.store` is `none`: every request the limits plugin checks is refused `503 limiter_unavailable`"
                    .into(),
            );
        }
        if !chain("auth") {
            out.push(
                "the plugin chain has no `auth`: every caller is served without a key, and nothing is billed".into(),
            );
        }
        if chain("billing") {
            for m in self.catalog.models.iter().filter(|m| m.pricing.is_none()) {
                out.push(format!(
                    "{}: model `{}` has no `pricing`: it is served at no charge (write `pricing: {{ input: 0, output: 0 }}` if that is meant)",
                    self.gateway.models_file.display(),
                    m.id
                ));
            }
        }
        out
    }
}

/// A model name as the catalog and the pools take it (a catalog id, an `upstream_model`):
/// 1 to 256 characters without spaces or control characters.
pub(crate) fn valid_model_name(name: &str) -> bool {
    !name.is_empty() && name.len() <= 256 && !name.chars().any(|c| c.is_control() || c == ' ')
}

/// Load and check `tollgate.yaml` and the files it names.
pub fn load(path: &Path) -> Result<Config, ConfigErrors> {
    let mut out = Vec::new();
    let gateway = gateway::load(path, &mut out);
    let Some(gateway) = gateway else {
        return Err(ConfigErrors(out));
    };
    load_operator_files(std::sync::Arc::new(gateway), path, None, out)
}

/// Load and check `tollgate.yaml` alone (the admin command line needs its listener and
/// token even while an operator file it names is broken, e.g. to ask for a reload).
pub fn load_settings(path: &Path) -> Result<GatewaySettings, ConfigErrors> {
    let mut out = Vec::new();
    gateway::load(path, &mut out).ok_or(ConfigErrors(out))
}

/// Read `models.yaml` and `upstreams.yaml` again for a running server: its `tollgate.yaml`
/// settings stay; replicas kept keep their counters and health, and a model the operator
/// paused or resumed keeps that state (decision 122).
pub fn reload(running: &Config) -> Result<Config, ConfigErrors> {
    let config = load_operator_files(running.gateway.clone(), &running.source, Some(running), Vec::new())?;
    for entry in &config.catalog.models {
        if let Some(old) = running.catalog.get(&entry.id).filter(|old| old.id == entry.id) {
            entry.keep_operator_state(old);
        }
    }
    Ok(config)
}

fn load_operator_files(
    gateway: std::sync::Arc<GatewaySettings>,
    source: &Path,
    running: Option<&Config>,
    mut out: Vec<ConfigProblem>,
) -> Result<Config, ConfigErrors> {
    let catalog = catalog_check::load(&gateway.models_file, &gateway, &mut out);
    let pools = match &catalog {
        Some(c) => upstreams_check::load(&gateway.upstreams_file, c, running.map(|r| &r.pools), &mut out),
        None => None,
    };
    match (catalog, pools) {
        (Some(catalog), Some(pools)) if out.is_empty() => {
            Ok(Config { gateway, catalog, pools, source: source.to_path_buf() })
        }
        _ => Err(ConfigErrors(out)),
    }
}

/// Parse one YAML file into `T`, recording a problem with the field path on failure.
pub(crate) fn parse_yaml<T: DeserializeOwned>(file: &Path, out: &mut Vec<ConfigProblem>) -> Option<T> {
    let mut problems = Problems::new(file, out);
    let text = match std::fs::read_to_string(file) {
        Ok(t) => t,
        Err(e) => {
            problems.add(".", format!("cannot read file: {e}"));
            return None;
        }
    };
    let de = serde_yaml_ng::Deserializer::from_str(&text);
    match serde_path_to_error::deserialize::<_, T>(de) {
        Ok(v) => Some(v),
        Err(e) => {
            let path = e.path().to_string();
            problems.add(path, e.into_inner().to_string());
            None
        }
    }
}

/// Resolve `name` against the folder of `base_file`.
pub(crate) fn sibling(base_file: &Path, name: &str) -> PathBuf {
    let p = Path::new(name);
    if p.is_absolute() { p.to_path_buf() } else { base_file.parent().unwrap_or(Path::new(".")).join(p) }
}
