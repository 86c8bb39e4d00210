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

/// `RUST_LOG` as asked, except Pingora's `trace` lines: they print whole request heads,
/// the client's API key and the admin token included, and a key is never logged.
struct NoPingoraTrace(env_logger::Logger);

impl log::Log for NoPingoraTrace {
    fn enabled(&self, meta: &log::Metadata<'_>) -> bool {
        !(meta.level() == log::Level::Trace && meta.target().starts_with("pingora")) && self.0.enabled(meta)
    }

    fn log(&self, record: &log::Record<'_>) {
        if self.enabled(record.metadata()) {
            self.0.log(record);
        }
    }

    fn flush(&self) {
        self.0.flush();
    }
}
