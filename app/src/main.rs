//! The `tollgate` binary: the command line (`cli/`) and the server bootstrap (`server.rs`).
//! This crate is the composition root: it opens the stores, builds the plugin chain from
//! config (`tollgate_plugins::build`) and hands both to the core's proxy.

mod cli;
mod server;

use std::process::ExitCode;

/// mimalloc instead of glibc's malloc: the request path allocates many small, short-lived
/// buffers (headers, JSON views, ledger ops), where glibc spent about 12% of the request
/// thread (decision 137).
#[global_allocator]
static ALLOCATOR: mimalloc::MiMalloc = mimalloc::MiMalloc;

fn main() -> ExitCode {
    let logger = env_logger::Builder::from_env(env_logger::Env::default().default_filter_or("info")).build();
    let max = logger.filter();
    if log::set_boxed_logger(Box::new(NoPingoraTrace(logger))).is_ok() {
        log::set_max_level(max);
    }
    cli::main(std::env::args().skip(1).collect())
}

/// `RUST_LOG` as asked, except two kinds of Pingora lines: its `trace` lines print whole
/// request heads, the client's API key and the admin token included, and a key is never
/// logged (decision 170); and one ERROR its connection pool writes when a pooled upstream
/// connection is busy, after which it simply opens another (an alert on ERROR lines would
/// fire on healthy traffic).
struct NoPingoraTrace(env_logger::Logger);

fn kept(level: log::Level, target: &str, message: Option<&str>) -> bool {
    let pingora = target.starts_with("pingora");
    !(pingora && (level == log::Level::Trace || message == Some("failed to acquire reusable stream")))
}

impl log::Log for NoPingoraTrace {
    fn enabled(&self, meta: &log::Metadata<'_>) -> bool {
        kept(meta.level(), meta.target(), None) && self.0.enabled(meta)
    }

    fn log(&self, record: &log::Record<'_>) {
        if kept(record.level(), record.target(), record.args().as_str()) && self.0.enabled(record.metadata()) {
            self.0.log(record);
        }
    }

    fn flush(&self) {
        self.0.flush();
    }
}

#[cfg(test)]
mod tests {
    use log::Level;

    #[test]
    fn pingora_trace_and_its_busy_pool_error_are_dropped_and_nothing_else() {
        assert!(!super::kept(Level::Trace, "pingora_proxy", Some("Request header: ...")));
        assert!(!super::kept(Level::Error, "pingora_core::connectors", Some("failed to acquire reusable stream")));
        assert!(super::kept(Level::Error, "pingora_core::connectors", Some("another failure")));
        assert!(super::kept(Level::Debug, "pingora_proxy", None));
        assert!(super::kept(Level::Trace, "tollgate::proxy", None), "our own trace lines stay");
        assert!(super::kept(Level::Error, "tollgate::proxy", Some("failed to acquire reusable stream")));
    }
}
