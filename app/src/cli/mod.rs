//! The `tollgate` command line: `serve`, `check-config`, `migrate`, `init-secrets`, and the
//! operator subcommands under `admin` (a client of the admin API).

mod admin;

use std::path::{Path, PathBuf};
use std::process::ExitCode;
use std::sync::Arc;

use tollgate::config::{self, Config};
use tollgate::identity::keys::KeySecrets;
use tollgate::identity::service::Identity;
use tollgate::identity::service::cache::KeyCache;
use tollgate_plugins::Services;

pub const USAGE: &str = "usage:
  tollgate serve        [--config conf/tollgate.yaml] [--upgrade]
  tollgate check-config [--config conf/tollgate.yaml]
  tollgate migrate      [--config conf/tollgate.yaml]
  tollgate init-secrets [--dir data/secrets]
  tollgate admin [--config F] [--url URL] [--json] <command>   (tollgate admin help)";

/// Split `--config PATH` out of `args`; the rest is returned in order.
pub fn take_flag(args: &[String], names: &[&str]) -> Result<(Option<String>, Vec<String>), String> {
    let mut value = None;
    let mut rest = Vec::new();
    let mut it = args.iter();
    while let Some(a) = it.next() {
        if names.contains(&a.as_str()) {
            value = Some(it.next().cloned().ok_or(format!("{a} needs a value"))?);
        } else if let Some((k, v)) = a.split_once('=').filter(|(k, _)| names.contains(k)) {
            let _ = k;
            value = Some(v.to_string());
        } else {
            rest.push(a.clone());
        }
    }
    Ok((value, rest))
}

fn config_path(args: &[String]) -> Result<(PathBuf, Vec<String>), String> {
    let (path, rest) = take_flag(args, &["--config", "-c"])?;
    Ok((PathBuf::from(path.unwrap_or_else(|| "conf/tollgate.yaml".into())), rest))
}

fn no_more(rest: &[String]) -> Result<(), String> {
    match rest.first() {
        Some(a) => Err(format!("unknown argument `{a}`")),
        None => Ok(()),
    }
}

/// Open the stores and services the config names (migrating when configured to).
pub fn open_services(config: &Config, force_migrate: bool) -> Result<Services, String> {
    let redis = tollgate::state::limits::shared_connection(&config.gateway.limits.store);
    check_redis_tls(&config.gateway.limits.store)?;
    let Some(id) = &config.gateway.identity else {
        return Ok(Services { redis, ..Services::default() });
    };
    let rt = tokio::runtime::Builder::new_current_thread().enable_all().build().map_err(|e| e.to_string())?;
    let stores = rt.block_on(async {
        let stores = tollgate::store::open_stores_tuned(&id.store, config.gateway.ledger_max_wait)
            .await
            .map_err(|e| format!("store {:?}: {e}", id.store))?;
        if id.migrate_on_start || force_migrate {
            stores.identity.migrate().await.map_err(|e| format!("migrations failed: {e}"))?;
        }
        Ok::<_, String>(stores)
    })?;
    let secrets = KeySecrets::new(&id.key_pepper, &id.key_encryption_key).map_err(|e| e.to_string())?;
    Ok(Services {
        identity: Some(Arc::new(Identity::new(stores.identity, secrets, KeyCache::default()))),
        ledger: Some(stores.ledger),
        redis,
    })
}

/// A `rediss://` limiter store is tried once at start: a certificate the configured CA does
/// not verify is a configuration mistake, refused with the field to fix. Redis being down is
/// an outage the gateway starts through (it connects on first use).
fn check_redis_tls(store: &tollgate::state::limits::LimiterConfig) -> Result<(), String> {
    let tollgate::state::limits::LimiterConfig::Redis { url, options } = store else { return Ok(()) };
    if !url.starts_with("rediss://") {
        return Ok(());
    }
    let rt = tokio::runtime::Builder::new_current_thread().enable_all().build().map_err(|e| e.to_string())?;
    let timeout = options.timeout.max(std::time::Duration::from_secs(2));
    let probe = tollgate::state::redis_conn::LazyRedis::open_tls(url, timeout, options.tls.as_deref())?;
    match rt.block_on(probe.ping()) {
        Ok(()) => Ok(()),
        Err(e) if e.to_ascii_lowercase().contains("certificate") => Err(format!(
            "limits.store: TLS to {} failed: {e} (is limits.store.tls.ca_file the CA that signed the server's certificate, and the URL's host a name in it?)",
            tollgate::store::redact_url(url)
        )),
        Err(e) => {
            log::warn!("limits.store: Redis did not answer at start ({e}); it is tried again on first use");
            Ok(())
        }
    }
}

fn load(path: &Path) -> Result<Config, String> {
    config::load(path).map_err(|e| e.to_string())
}

fn init_secrets(args: &[String]) -> Result<(), String> {
    let (dir, rest) = take_flag(args, &["--dir"])?;
    no_more(&rest)?;
    let dir = PathBuf::from(dir.unwrap_or_else(|| "data/secrets".into()));
    std::fs::create_dir_all(&dir).map_err(|e| format!("{}: {e}", dir.display()))?;
    for name in ["key_pepper", "key_encryption_key", "admin_token"] {
        let path = dir.join(name);
        if path.exists() {
            println!("kept     {}", path.display());
            continue;
        }
        let mut bytes = [0u8; 32];
        getrandom::fill(&mut bytes).map_err(|e| e.to_string())?;
        write_private(&path, &hex::encode(bytes))?;
        println!("created  {}", path.display());
    }
    Ok(())
}

/// Write a file readable by its owner only.
fn write_private(path: &Path, contents: &str) -> Result<(), String> {
    use std::io::Write;
    use std::os::unix::fs::OpenOptionsExt;
    let mut f = std::fs::OpenOptions::new()
        .write(true)
        .create_new(true)
        .mode(0o600)
        .open(path)
        .map_err(|e| format!("{}: {e}", path.display()))?;
    f.write_all(contents.as_bytes()).map_err(|e| e.to_string())
}

fn fail(e: String) -> ExitCode {
    eprintln!("{e}");
    ExitCode::from(1)
}

pub fn main(args: Vec<String>) -> ExitCode {
    let Some((cmd, rest)) = args.split_first() else {
        eprintln!("{USAGE}");
        return ExitCode::from(2);
    };
    let run = || -> Result<ExitCode, String> {
        match cmd.as_str() {
            "check-config" => {
                let (path, rest) = config_path(rest)?;
                no_more(&rest)?;
                let config = load(&path)?;
                // Plugins are checked without opening stores.
                tollgate_plugins::build(&config, &Services::default()).map_err(|e| e.to_string())?;
                let names = tollgate_plugins::served_order(&config);
                println!("ok: {} models, plugins {names:?}", config.catalog.models.len());
                for w in config.warnings() {
                    println!("warning: {w}");
                }
                Ok(ExitCode::SUCCESS)
            }
            "serve" => {
                // SIGHUP reloads once the server runs; until then (config, stores, migrations)
                // it must not end the process, which is its default action.
                // SAFETY: setting a signal's disposition to "ignore" has no preconditions.
                #[allow(unsafe_code)]
                unsafe {
                    libc::signal(libc::SIGHUP, libc::SIG_IGN)
                };
                let (path, mut rest) = config_path(rest)?;
                // `--upgrade`: take the listeners of the running process (zero-downtime upgrade).
                let upgrade = rest.iter().any(|a| a == "--upgrade" || a == "-u");
                rest.retain(|a| a != "--upgrade" && a != "-u");
                no_more(&rest)?;
                let config =
                    load(&path).map_err(|e| format!("refusing to start, the configuration has problems:\n{e}"))?;
                let services = open_services(&config, false)?;
                let chain = tollgate_plugins::build(&config, &services).map_err(|e| e.to_string())?;
                let pid_dir = std::env::temp_dir();
                crate::server::run(config, chain, services, crate::server::Start { pid_dir: &pid_dir, upgrade })
            }
            "migrate" => {
                let (path, rest) = config_path(rest)?;
                no_more(&rest)?;
                let config = load(&path)?;
                if config.gateway.identity.is_none() {
                    return Err("the configuration names no store to migrate".into());
                }
                open_services(&config, true)?;
                println!("migrations applied");
                Ok(ExitCode::SUCCESS)
            }
            "init-secrets" => init_secrets(rest).map(|_| ExitCode::SUCCESS),
            "admin" => admin::main(rest),
            "-h" | "--help" | "help" => {
                println!("{USAGE}");
                Ok(ExitCode::SUCCESS)
            }
            other => Err(format!("unknown command `{other}`\n{USAGE}")),
        }
    };
    run().unwrap_or_else(fail)
}
