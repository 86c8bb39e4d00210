//! The configuration in force. A reload (SIGHUP, `POST /admin/v1/reload`) checks the new
//! `models.yaml` and `upstreams.yaml` completely before anything changes, then swaps the whole
//! [`Config`] at once: a request reads the config once, when it starts, and keeps that one
//! (its pool, its replica) to the end, so a removed replica drains.

use std::collections::BTreeSet;
use std::hash::{Hash, Hasher};
use std::sync::{Arc, Mutex};

use arc_swap::ArcSwap;
use serde::Serialize;

use super::{Config, ConfigErrors};

pub struct LiveConfig {
    current: ArcSwap<Config>,
    /// One reload at a time (two would both read the files and race to swap).
    reloading: Mutex<()>,
    /// `tollgate.yaml` as the process read it: a reload says when the file has changed since,
    /// because its settings need a restart or an upgrade.
    settings_fingerprint: u64,
}

/// What a reload changed.
#[derive(Debug, Serialize, PartialEq, Eq)]
pub struct ReloadReport {
    pub models: usize,
    pub replicas: usize,
    pub models_added: Vec<String>,
    pub models_removed: Vec<String>,
    /// `model replica-address`, new in the pools.
    pub replicas_added: Vec<String>,
    /// `model replica-address`, gone from the pools: they finish the requests they have.
    pub replicas_draining: Vec<String>,
    /// `tollgate.yaml` differs from the file the process started with; its changes are not
    /// applied by a reload.
    pub settings_file_changed: bool,
}

impl LiveConfig {
    pub fn new(config: Config) -> Self {
        let settings_fingerprint = fingerprint(&config.source);
        LiveConfig { current: ArcSwap::from_pointee(config), reloading: Mutex::new(()), settings_fingerprint }
    }

    /// The config in force now (what a request starting now runs with).
    pub fn current(&self) -> Arc<Config> {
        self.current.load_full()
    }

    /// Run `f` on the config in force with reloads held off, so a change `f` makes to it (an
    /// operator's pause) cannot be lost to a reload copying the old state at the same time.
    pub fn with_current<T>(&self, f: impl FnOnce(&Config) -> T) -> T {
        let _one = self.reloading.lock().unwrap_or_else(|e| e.into_inner());
        f(&self.current())
    }

    /// Check the operator files again and, when they are valid, put them in force. A bad file
    /// changes nothing and returns every problem with its file and field.
    pub fn reload(&self) -> Result<ReloadReport, ConfigErrors> {
        let _one = self.reloading.lock().unwrap_or_else(|e| e.into_inner());
        let old = self.current();
        let new = super::reload(&old)?;
        let report = ReloadReport {
            models: new.catalog.models.len(),
            replicas: new.pools.iter().map(|(_, p)| p.replicas.len()).sum(),
            models_added: difference(model_ids(&new), model_ids(&old)),
            models_removed: difference(model_ids(&old), model_ids(&new)),
            replicas_added: difference(replica_names(&new), replica_names(&old)),
            replicas_draining: difference(replica_names(&old), replica_names(&new)),
            settings_file_changed: fingerprint(&old.source) != self.settings_fingerprint,
        };
        self.current.store(Arc::new(new));
        Ok(report)
    }
}

fn model_ids(c: &Config) -> BTreeSet<String> {
    c.catalog.models.iter().map(|m| m.id.clone()).collect()
}

fn replica_names(c: &Config) -> BTreeSet<String> {
    c.pools.iter().flat_map(|(m, p)| p.replicas.iter().map(move |r| format!("{m} {}", r.authority))).collect()
}

fn difference(a: BTreeSet<String>, b: BTreeSet<String>) -> Vec<String> {
    a.difference(&b).cloned().collect()
}

fn fingerprint(path: &std::path::Path) -> u64 {
    let mut h = std::collections::hash_map::DefaultHasher::new();
    std::fs::read(path).unwrap_or_default().hash(&mut h);
    h.finish()
}
