//! `tollgate-mock-replica`: a fast stand-in for a vLLM OpenAI-compatible
//! model server.
//!
//! tollgate's integration tests, load benches and demo need replicas that
//! answer like vLLM, can be told (per request, via `x-mock-*` headers) to be
//! slow, fail or die mid-stream, and cost so little CPU that a bench measures
//! the gateway rather than the mock. This binary is independent of the
//! `tollgate` library on purpose: it must keep building while the gateway is
//! being changed.
//!
//! On startup it prints `listening on ADDR` (one line, flushed) so a test
//! that bound port 0 can learn the port, then serves until killed.

#![forbid(unsafe_code)]

mod body;
mod cli;
mod completion;
mod json;
mod knobs;
mod request;
mod routes;
mod server;
mod sse;
mod state;

use std::io::Write as _;
use std::process::ExitCode;
use std::sync::Arc;

use tokio::net::TcpListener;

use crate::cli::{Args, CliError};
use crate::state::State;

fn main() -> ExitCode {
    // Quiet unless RUST_LOG asks; logs go to stderr, stdout is for the port line.
    let _ = env_logger::try_init();
    let args = match Args::parse(std::env::args().skip(1)) {
        Ok(args) => args,
        Err(CliError::Help) => {
            println!("{}", cli::USAGE);
            return ExitCode::SUCCESS;
        }
        Err(e) => {
            eprintln!("{e}");
            return ExitCode::from(2);
        }
    };
    let runtime = match tokio::runtime::Builder::new_multi_thread().worker_threads(args.threads).enable_all().build() {
        Ok(runtime) => runtime,
        Err(e) => {
            eprintln!("cannot start the tokio runtime: {e}");
            return ExitCode::FAILURE;
        }
    };
    runtime.block_on(run(args))
}

async fn run(args: Args) -> ExitCode {
    let listener = match TcpListener::bind(&args.listen).await {
        Ok(listener) => listener,
        Err(e) => {
            eprintln!("cannot listen on {}: {e}", args.listen);
            return ExitCode::FAILURE;
        }
    };
    let addr = match listener.local_addr() {
        Ok(addr) => addr,
        Err(e) => {
            eprintln!("cannot read the bound address: {e}");
            return ExitCode::FAILURE;
        }
    };
    let mut stdout = std::io::stdout().lock();
    if let Err(e) = writeln!(stdout, "listening on {addr}").and_then(|()| stdout.flush()) {
        eprintln!("cannot announce the address: {e}");
        return ExitCode::FAILURE;
    }
    drop(stdout);
    // Spawned so the accept loop runs on a worker like everything else
    // (`block_on` would keep it on the main thread, outside `--threads`).
    let state = Arc::new(State::new(args.model_name));
    match tokio::spawn(server::serve(listener, state)).await {
        Ok(()) => ExitCode::SUCCESS,
        Err(e) => {
            eprintln!("server task failed: {e}");
            ExitCode::FAILURE
        }
    }
}
