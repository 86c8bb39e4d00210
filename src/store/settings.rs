//! What the config names as the store: a leaf of the store module, so `config` can build it
//! without depending on the backends.

use std::time::Duration;

/// Longest a single store call may take before it counts as unavailable, unless configured.
pub const CALL_TIMEOUT: Duration = Duration::from_secs(5);

/// Which backend a config names.
#[derive(Clone, PartialEq, Eq)]
pub enum StoreConfig {
    Sqlite {
        path: std::path::PathBuf,
    },
    Postgres {
        url: String,
        /// Bound on each store call, waiting for a pooled connection included.
        call_timeout: std::time::Duration,
        /// TLS to the server (required when set); `None`: as the URL's `sslmode` says, without
        /// a TLS implementation (plain).
        tls: Option<super::tls::StoreTls>,
    },
}

impl StoreConfig {
    /// PostgreSQL at `url` with the default call timeout.
    pub fn postgres(url: impl Into<String>) -> StoreConfig {
        StoreConfig::Postgres { url: url.into(), call_timeout: CALL_TIMEOUT, tls: None }
    }
}

impl std::fmt::Debug for StoreConfig {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        match self {
            StoreConfig::Sqlite { path } => write!(f, "sqlite {}", path.display()),
            StoreConfig::Postgres { url, tls, .. } => {
                write!(f, "postgres {}", redact_url(url))?;
                if let Some(tls) = tls {
                    write!(f, " with {tls:?}")?;
                }
                Ok(())
            }
        }
    }
}

/// `postgres://user:secret@host/db` -> `postgres://user:***@host/db`, for logs.
pub fn redact_url(url: &str) -> String {
    match (url.find("://"), url.rfind('@')) {
        (Some(s), Some(at)) if at > s => {
            let creds = &url[s + 3..at];
            match creds.find(':') {
                Some(c) => format!("{}{}:***{}", &url[..s + 3], &creds[..c], &url[at..]),
                None => url.to_string(),
            }
        }
        _ => url.to_string(),
    }
}

#[cfg(test)]
mod tests {
    #[test]
    fn urls_are_redacted() {
        assert_eq!(super::redact_url("postgres://u:pw@h:5432/db"), "postgres://u:***@h:5432/db");
        assert_eq!(super::redact_url("postgres://h/db"), "postgres://h/db");
    }
}
