//! The process's own settings in `tollgate.yaml`: the two listeners and the shutdown times.
//! Each problem names its field; what Pingora would otherwise take and fail on later (one
//! socket for both listeners, a time that overflows) is refused here.

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
    if public.port() != 0 && public.port() == admin.port() && overlap(public.ip(), admin.ip()) {
        p.add("admin_listen", format!("`{admin}` takes the port of `listen` ({public}): the two need different ports"));
    }
    (public, admin)
}

/// Whether two listening addresses on one port collide, as Linux binds them: the same
/// address (an IPv4-mapped IPv6 address is its IPv4 one); `[::]` (dual-stack by default)
/// with any; `0.0.0.0` with any IPv4 address. `0.0.0.0` and `[::1]` do not.
fn overlap(a: std::net::IpAddr, b: std::net::IpAddr) -> bool {
    let (a, b) = (a.to_canonical(), b.to_canonical());
    let any_v6 = |ip: std::net::IpAddr| ip.is_ipv6() && ip.is_unspecified();
    let any_v4_over =
        |ip: std::net::IpAddr, other: std::net::IpAddr| ip.is_ipv4() && ip.is_unspecified() && other.is_ipv4();
    a == b || any_v6(a) || any_v6(b) || any_v4_over(a, b) || any_v4_over(b, a)
}

fn addr(p: &mut Problems, path: &str, value: &str) -> SocketAddr {
    match value.parse::<SocketAddr>() {
        // Port 0 is a free port the system picks; `serve` prints it (decision 222).
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
    } else if token.chars().any(char::is_control) {
        // A file of two lines would be a token nobody can send.
        p.add(source, format!("{what} must be one line without control characters"));
    }
    Some(token)
}

#[cfg(test)]
mod tests {
    use super::overlap;

    #[test]
    fn listeners_collide_as_linux_binds_them() {
        let ip = |s: &str| s.parse::<std::net::IpAddr>().unwrap_or_else(|e| panic!("{s}: {e}"));
        for (a, b, collide) in [
            ("127.0.0.1", "127.0.0.1", true),
            ("0.0.0.0", "127.0.0.1", true),
            ("::", "127.0.0.1", true),
            ("::", "::1", true),
            ("::ffff:127.0.0.1", "127.0.0.1", true),
            ("0.0.0.0", "::1", false),
            ("127.0.0.1", "127.0.0.2", false),
            ("127.0.0.1", "::1", false),
        ] {
            assert_eq!(overlap(ip(a), ip(b)), collide, "{a} {b}");
            assert_eq!(overlap(ip(b), ip(a)), collide, "{b} {a}");
        }
    }
}
