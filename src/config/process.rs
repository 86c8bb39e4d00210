//! The process's own settings in `tollgate.yaml`: the two listeners and the shutdown times.
//! Each problem names its field; what Pingora would otherwise take and fail on later (a
//! random port, one socket for both listeners, a time that overflows) is refused here.

use std::net::SocketAddr;
use std::path::Path;

use super::Problems;
use super::identity::{RawSecret, read_secret};

/// `listen` and `admin_listen`, parsed and checked against each other.
pub(super) fn listeners(p: &mut Problems, listen: &str, admin_listen: &str) -> (SocketAddr, SocketAddr) {
    let public = addr(p, "listen", listen);
    let admin = addr(p, "admin_listen", admin_listen);
    // One port on overlapping addresses is one socket: connections would land on either
    // service at random, or the second listener would never bind.
    let overlap = public.ip() == admin.ip() || public.ip().is_unspecified() || admin.ip().is_unspecified();
    if public.port() != 0 && public.port() == admin.port() && overlap {
        p.add("admin_listen", format!("`{admin}` takes the port of `listen` ({public}): the two need different ports"));
    }
    (public, admin)
}

fn addr(p: &mut Problems, path: &str, value: &str) -> SocketAddr {
    match value.parse::<SocketAddr>() {
        Ok(a) if a.port() == 0 => {
            p.add(path, format!("`{value}` has port 0, which binds a random port nobody can reach: name a port"));
            a
        }
        Ok(a) => a,
        Err(_) => {
            p.add(path, format!("`{value}` is not an address like 127.0.0.1:8080"));
            SocketAddr::from(([127, 0, 0, 1], 0))
        }
    }
}

/// The longest grace period and final timeout taken: a day (a longer one would outlive any
/// request by far, and an absurd one overflows the clock when the stop begins).
const MAX_SHUTDOWN_SECONDS: u64 = 86_400;

/// `shutdown.grace_period_seconds` and `shutdown.graceful_shutdown_timeout_seconds`.
pub(super) fn shutdown(p: &mut Problems, grace: u64, final_timeout: u64) {
    for (path, secs) in
        [("shutdown.grace_period_seconds", grace), ("shutdown.graceful_shutdown_timeout_seconds", final_timeout)]
    {
        if secs > MAX_SHUTDOWN_SECONDS {
            p.add(path, format!("must be at most {MAX_SHUTDOWN_SECONDS} seconds, got {secs}"));
        }
    }
}

/// The admin token: `TOLLGATE_ADMIN_TOKEN` when set (not blank), else `admin.token_file`.
/// A problem names where a bad token came from.
pub(super) fn admin_token(p: &mut Problems, settings_file: &Path, token_file: Option<&String>) -> Option<String> {
    let from_env = std::env::var("TOLLGATE_ADMIN_TOKEN").ok().filter(|t| !t.trim().is_empty());
    let (source, what) = match from_env {
        Some(_) => ("TOLLGATE_ADMIN_TOKEN", "the admin token in the environment variable"),
        None => ("admin.token_file", "the admin token"),
    };
    let token = match from_env {
        Some(t) => t.trim().to_string(),
        None => {
            let file = RawSecret { env: None, file: Some(token_file?.clone()) };
            read_secret(p, "admin.token_file", settings_file, &file)?
        }
    };
    if token.len() < 16 {
        p.add(source, format!("{what} must be at least 16 characters"));
    } else if token.chars().any(|c| c.is_whitespace() || c.is_control()) {
        // A file of two lines would be a token nobody can send.
        p.add(source, format!("{what} must be one word: no spaces, line breaks or control characters"));
    }
    Some(token)
}
