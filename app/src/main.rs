//! The `tollgate` binary: the command line (`cli/`) and the server bootstrap (`server.rs`).
//! This crate is the composition root: it opens the stores, builds the plugin chain from
//! config (`tollgate_plugins::build`) and hands both to the core's proxy.

#![deny(unsafe_code)]

mod admin;
mod cli;
mod listeners;
mod server;

use std::process::ExitCode;

/// mimalloc instead of glibc's malloc: the request path allocates many small, short-lived
/// buffers (headers, JSON views, ledger ops), where glibc spent about 12% of the request
/// thread (decision 137), called so word-aligned blocks take its fast path (decision 201).
/// The `system-allocator` feature keeps glibc's, for heap profilers that hook malloc
/// (heaptrack: `docs/operations.md`).
#[cfg(not(feature = "system-allocator"))]
#[global_allocator]
static ALLOCATOR: tollgate_allocator::Allocator = tollgate_allocator::Allocator;

fn main() -> ExitCode {
    tollgate_allocator::keep_small_pages();
    let logger = env_logger::Builder::from_env(env_logger::Env::default().default_filter_or("info")).build();
    let max = logger.filter();
    if log::set_boxed_logger(Box::new(PingoraLogFilter(logger))).is_ok() {
        log::set_max_level(max);
    }
    cli::main(std::env::args().skip(1).collect())
}

/// `RUST_LOG` as asked, except some Pingora lines: its `trace` lines and the `debug` line of
/// each request head sent upstream print headers, the client's API key, the admin token and
/// the replicas' own credential among them, and a key is never logged (decision 170); and
/// one ERROR its connection pool writes when a pooled upstream connection is busy, after
/// which it simply opens another (an alert on ERROR lines would fire on healthy traffic).
struct PingoraLogFilter(env_logger::Logger);

fn kept(level: log::Level, target: &str, message: &dyn Fn() -> String) -> bool {
    if !target.starts_with("pingora") {
        return true;
    }
    match level {
        log::Level::Trace => false,
        log::Level::Debug => !message().starts_with("Sending header to upstream"),
        log::Level::Error => message() != "failed to acquire reusable stream",
        _ => true,
    }
}

impl log::Log for PingoraLogFilter {
    fn enabled(&self, meta: &log::Metadata<'_>) -> bool {
        // Without its message only the level and target decide (all of Pingora's trace).
        kept(meta.level(), meta.target(), &String::new) && self.0.enabled(meta)
    }

    fn log(&self, record: &log::Record<'_>) {
        // The message is formatted only for Pingora's debug and error lines, and only when
        // they are to be written at all.
        let message = || record.args().as_str().map_or_else(|| record.args().to_string(), str::to_string);
        if self.0.enabled(record.metadata()) && kept(record.level(), record.target(), &message) {
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
    fn pingora_trace_its_upstream_head_and_its_busy_pool_error_are_dropped_and_nothing_else() {
        let says = |m: &'static str| move || m.to_string();
        assert!(!super::kept(Level::Trace, "pingora_proxy", &says("Request header: ...")));
        let head = "Sending header to upstream RequestHeader { authorization: Bearer replica-secret }";
        assert!(!super::kept(Level::Debug, "pingora_proxy::proxy_h1", &says(head)));
        assert!(!super::kept(Level::Error, "pingora_core::connectors", &says("failed to acquire reusable stream")));
        assert!(super::kept(Level::Error, "pingora_core::connectors", &says("another failure")));
        assert!(super::kept(Level::Debug, "pingora_proxy", &says("Successfully get a new request")));
        assert!(super::kept(Level::Trace, "tollgate::proxy", &says("ours")), "our own trace lines stay");
        assert!(super::kept(Level::Error, "tollgate::proxy", &says("failed to acquire reusable stream")));
    }
}
