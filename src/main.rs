//! The `tollgate` command: `serve` runs the gateway, `check-config` validates every YAML
//! file and prints each problem with its file and field path.

use std::path::PathBuf;
use std::process::ExitCode;

const USAGE: &str = "usage: tollgate <serve|check-config> [--config conf/tollgate.yaml]";

fn config_path(args: &[String]) -> Result<PathBuf, String> {
    let mut path = PathBuf::from("conf/tollgate.yaml");
    let mut it = args.iter();
    while let Some(a) = it.next() {
        match a.as_str() {
            "--config" | "-c" => {
                path = it
                    .next()
                    .map(PathBuf::from)
                    .ok_or("--config needs a path")?;
            }
            other => return Err(format!("unknown argument `{other}`")),
        }
    }
    Ok(path)
}

fn load(args: &[String]) -> Result<(tollgate::config::Config, tollgate::plugin::Chain), String> {
    let path = config_path(args)?;
    let config = tollgate::config::load(&path).map_err(|e| e.to_string())?;
    let chain = tollgate::plugins::build(&config).map_err(|e| e.to_string())?;
    Ok((config, chain))
}

fn main() -> ExitCode {
    env_logger::Builder::from_env(env_logger::Env::default().default_filter_or("info")).init();
    let args: Vec<String> = std::env::args().skip(1).collect();
    let Some((cmd, rest)) = args.split_first() else {
        eprintln!("{USAGE}");
        return ExitCode::from(2);
    };
    match cmd.as_str() {
        "check-config" => match load(rest) {
            Ok((config, chain)) => {
                println!(
                    "ok: {} models, plugins {:?}",
                    config.catalog.models.len(),
                    chain.names()
                );
                ExitCode::SUCCESS
            }
            Err(e) => {
                eprint!("{e}");
                ExitCode::from(1)
            }
        },
        "serve" => match load(rest) {
            Ok((config, chain)) => {
                let run_dir = std::env::temp_dir();
                tollgate::server::run(config, chain, &run_dir)
            }
            Err(e) => {
                eprint!("refusing to start, the configuration has problems:\n{e}");
                ExitCode::from(1)
            }
        },
        "-h" | "--help" | "help" => {
            println!("{USAGE}");
            ExitCode::SUCCESS
        }
        other => {
            eprintln!("unknown command `{other}`\n{USAGE}");
            ExitCode::from(2)
        }
    }
}
