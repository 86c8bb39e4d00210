//! The `tollgate` binary; the commands live in `tollgate::cli`.

use std::process::ExitCode;

fn main() -> ExitCode {
    env_logger::Builder::from_env(env_logger::Env::default().default_filter_or("info")).init();
    tollgate::cli::main(std::env::args().skip(1).collect())
}
