//! The `identity:` section of `tollgate.yaml`: which store holds keys and the ledger, and the
//! key secrets (never inline in the YAML: from an environment variable or a file).

use std::path::Path;

use serde::Deserialize;

use super::{Problems, sibling};

fn default_true() -> bool {
    true
}

#[derive(Deserialize)]
#[serde(deny_unknown_fields)]
pub(super) struct RawIdentity {
    store: RawStore,
    #[serde(default = "default_true")]
    migrate_on_start: bool,
    /// Keys the digest of API keys (at least 32 bytes).
    key_pepper: RawSecret,
    /// AES-256-GCM key of the encrypted copies (64 hex characters).
    key_encryption_key: RawSecret,
}

#[derive(Deserialize)]
#[serde(tag = "backend", rename_all = "lowercase", deny_unknown_fields)]
enum RawStore {
    Sqlite {
        path: String,
    },
    Postgres {
        url: Option<String>,
        url_env: Option<String>,
        /// Bound on each store call in ms (default 5,000): past it the call counts as the store
        /// being unavailable.
        call_timeout_ms: Option<u64>,
        /// TLS to the server, verified against `ca_file` (issue 52).
        #[serde(default)]
        tls: Option<super::tls::RawStoreTls>,
    },
}

/// A secret from an environment variable or a file (never inline in the YAML).
#[derive(Deserialize)]
#[serde(deny_unknown_fields)]
pub(super) struct RawSecret {
    pub(super) env: Option<String>,
    pub(super) file: Option<String>,
}

/// A secret value whose `Debug` prints nothing of it.
#[derive(Clone, PartialEq, Eq)]
pub struct Secret(pub(super) String);

impl Secret {
    pub fn expose(&self) -> &str {
        &self.0
    }
}

impl std::fmt::Debug for Secret {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.write_str("<redacted>")
    }
}

/// Identity store and key secrets, checked.
pub struct IdentitySettings {
    pub store: crate::store::settings::StoreConfig,
    pub migrate_on_start: bool,
    pub key_pepper: Vec<u8>,
    pub key_encryption_key: String,
}

impl std::fmt::Debug for IdentitySettings {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("IdentitySettings")
            .field("store", &self.store)
            .field("migrate_on_start", &self.migrate_on_start)
            .finish_non_exhaustive()
    }
}

pub(super) fn read_secret(p: &mut Problems, path: &str, base: &Path, s: &RawSecret) -> Option<String> {
    let value = match (&s.env, &s.file) {
        (Some(var), None) => std::env::var(var).map_err(|_| format!("environment variable `{var}` is not set")),
        (None, Some(file)) => {
            let f = sibling(base, file);
            std::fs::read_to_string(&f).map_err(|e| format!("cannot read `{}`: {e}", f.display()))
        }
        _ => Err("give exactly one of `env` or `file`".to_string()),
    };
    match value.map(|v| v.trim().to_string()) {
        Ok(v) if !v.is_empty() => Some(v),
        Ok(_) => {
            p.add(path, "the secret is empty");
            None
        }
        Err(e) => {
            p.add(path, e);
            None
        }
    }
}

pub(super) fn identity_settings(p: &mut Problems, base: &Path, raw: &RawIdentity) -> Option<IdentitySettings> {
    let store = match &raw.store {
        RawStore::Sqlite { path } => crate::store::settings::StoreConfig::Sqlite { path: sibling(base, path) },
        RawStore::Postgres { url, url_env, call_timeout_ms, tls } => {
            let tls = tls.as_ref().and_then(|t| super::tls::store_tls(p, base, "identity.store.tls", t));
            let call_timeout = match call_timeout_ms {
                None => crate::store::settings::CALL_TIMEOUT,
                Some(ms) if (100..=600_000).contains(ms) => std::time::Duration::from_millis(*ms),
                Some(_) => {
                    p.add("identity.store.call_timeout_ms", "must be 100..=600000");
                    crate::store::settings::CALL_TIMEOUT
                }
            };
            let url = match (url, url_env) {
                (Some(u), None) => Some(u.clone()),
                (None, var) => {
                    let var = var.clone().unwrap_or_else(|| "DATABASE_URL".into());
                    std::env::var(&var).ok().or_else(|| {
                        p.add("identity.store.url_env", format!("environment variable `{var}` is not set"));
                        None
                    })
                }
                (Some(_), Some(_)) => {
                    p.add("identity.store", "give `url` or `url_env`, not both");
                    None
                }
            }?;
            crate::store::settings::StoreConfig::Postgres { url, call_timeout, tls }
        }
    };
    let pepper = read_secret(p, "identity.key_pepper", base, &raw.key_pepper);
    let enc = read_secret(p, "identity.key_encryption_key", base, &raw.key_encryption_key);
    if pepper.as_ref().is_some_and(|v| v.len() < 32) {
        p.add("identity.key_pepper", "must be at least 32 characters");
    }
    if enc.as_ref().is_some_and(|v| v.len() != 64 || !v.bytes().all(|b| b.is_ascii_hexdigit())) {
        p.add("identity.key_encryption_key", "must be 64 hex characters (32 bytes)");
    }
    Some(IdentitySettings {
        store,
        migrate_on_start: raw.migrate_on_start,
        key_pepper: pepper?.into_bytes(),
        key_encryption_key: enc?,
    })
}
