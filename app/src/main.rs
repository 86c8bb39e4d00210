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
    env_logger::Builder::from_env(env_logger::Env::default().default_filter_or("info")).init();
    cli::main(std::env::args().skip(1).collect())
}
