//! Server bootstrap: one Pingora server with the public proxy listener and the admin
//! listener. The chain of plugins is built from config by `plugins::build` (the one place
//! that names concrete plugins) before this runs.

use std::io::Write;
use std::sync::Arc;

use pingora::server::Server;
use pingora::server::configuration::{Opt, ServerConf};
use pingora::services::listening::Service;

use crate::admin::AdminApp;
use crate::listeners::Listeners;
use tollgate::config::{Config, LiveConfig};
use tollgate::proxy::Gateway;
use tollgate::proxy::plugin::Chain;
use tollgate::transport::connection_cap::{ConnectionCap, Connections};
use tollgate_plugins::Services;

/// How the process starts.
pub struct Start<'a> {
    /// Where the pid file and the upgrade socket live (the temp dir).
    pub pid_dir: &'a std::path::Path,
    /// `--upgrade`: take the listening sockets from the running process instead of binding
    /// (it hands them over on SIGQUIT, then finishes its requests and exits).
    pub upgrade: bool,
}

/// Pingora's settings for `gateway` listening on `port`; the pid file and upgrade socket go in
/// `pid_dir`.
fn server_conf(gateway: &tollgate::config::GatewaySettings, port: u16, pid_dir: &std::path::Path) -> ServerConf {
    // Per-instance files, named by the public port, so several gateways (and tests) run side
    // by side.
    ServerConf {
        threads: gateway.threads,
        work_stealing: gateway.work_stealing,
        grace_period_seconds: Some(gateway.grace_period_seconds),
        graceful_shutdown_timeout_seconds: Some(gateway.graceful_shutdown_timeout_seconds),
        pid_file: pid_dir.join(format!("tollgate-{port}.pid")).to_string_lossy().into_owned(),
        upgrade_sock: pid_dir.join(format!("tollgate-{port}.sock")).to_string_lossy().into_owned(),
        // Connect failures are retried on another replica by `fail_to_connect` (at most two).
        max_retries: 2,
        // Blocking work is the embedded store's, behind one connection's lock: more threads
        // only wait on it, each with its stack and allocator heap (tokio's default is 512;
        // a burst of 2,048 streams started 150, issue 49).
        max_blocking_threads: Some(16),
        ..ServerConf::default()
    }
}

/// Build and run the server; never returns.
pub fn run(config: Config, chain: Chain, services: Services, start: Start<'_>) -> ! {
    let live = Arc::new(LiveConfig::new(config));
    let config = live.current();
    let pid_dir = start.pid_dir;
    tollgate::observe::metrics::set_enabled(config.gateway.metrics_enabled);
    // In an upgrade the running process holds the ports and hands them over. Held until exit.
    let listeners = match Listeners::reserve(config.gateway.listen, config.gateway.admin_listen, start.upgrade) {
        Ok(l) => l,
        Err(e) => {
            log::error!("{e}");
            std::process::exit(1);
        }
    };
    // Where to connect, for whoever started the process; a closed stdout does not stop it.
    let _ = writeln!(std::io::stdout(), "{}", listeners.report());
    let conf = server_conf(&config.gateway, listeners.public.port(), pid_dir);
    exit_on_listener_panic();
    let opt = Opt { upgrade: start.upgrade, ..Opt::default() };
    let mut server = Server::new_with_opt_and_conf(opt, conf);
    // In an upgrade this returns once the running process handed the listeners over.
    server.bootstrap();
    // Pingora writes its pid file only as a daemon; operators and the upgrade script read it.
    let pid_file = &server.configuration.pid_file;
    if let Err(e) = std::fs::write(pid_file, format!("{}\n", std::process::id())) {
        log::warn!("pid file {pid_file}: {e}");
    }
    let listen = listeners.public.to_string();
    let config_sweep = config.gateway.sweep_interval;
    let admin_listen = listeners.admin.to_string();
    log::info!("tollgate listening on {listen} (admin {admin_listen}) with plugins {:?}", chain.names());
    for w in config.warnings() {
        log::warn!("{w}");
    }
    // Operators' pauses are the fleet's: read from the identity store before serving.
    let model_states = services.identity.as_ref().map(|id| {
        let shared = crate::admin::model_states::ModelStates::new(id.store().clone(), live.clone());
        shared.start();
        shared
    });
    let admin = AdminApp {
        model_states,
        token: config.gateway.admin_token.as_ref().map(|t| t.expose().to_string()),
        live: live.clone(),
        identity: services.identity.clone(),
        ledger: services.ledger.clone(),
        redis: services.redis.clone(),
    };
    let mut gateway =
        Gateway::new(live.clone(), chain, placement_store(&config.gateway.limits.store, services.redis.clone()));
    let traces = match &config.gateway.tracing {
        Some(settings) => match tollgate::observe::traces::Exporter::new(settings) {
            Ok(exporter) => {
                log::info!(
                    "traces: exported to {} for {}% of requests without a sampled traceparent",
                    settings.otlp_endpoint,
                    settings.sample_ratio * 100.0
                );
                Some(Arc::new(exporter))
            }
            Err(e) => {
                log::error!("{e}");
                std::process::exit(1);
            }
        },
        None => None,
    };
    if let Some(exporter) = &traces {
        gateway = gateway.with_traces(exporter.clone());
    }
    let head_timeout = config.gateway.client.head_timeout;
    let mut app = pingora::proxy::http_proxy(&server.configuration, gateway);
    // A request head must arrive whole within this once it started (issue 49).
    let mut options = pingora::apps::HttpServerOptions::default();
    options.h1_head_timeout = Some(head_timeout);
    // HTTP/2 without TLS, when asked: a client that opens with the HTTP/2 preface (decision 219).
    options.h2c = config.gateway.client.h2c;
    // An HTTP/2 connection without a stream is closed as an idle HTTP/1 one is.
    options.h2_idle_timeout = Some(std::time::Duration::from_secs(config.gateway.client.idle_timeout_seconds));
    app.server_options = Some(options);
    // Open connections are capped, the oldest idle one closed for a new one (decision 216).
    let connections = Connections::new(config.gateway.client.max_connections);
    // The request threads' heaps are collected every 2 s (issue 49; `tollgate_allocator`).
    let capped = ConnectionCap::new(app, connections).on_request_runtime(|| {
        tollgate_allocator::spawn_heap_collectors(8, tollgate_allocator::COLLECT_EVERY);
    });
    let mut proxy = Service::new("tollgate".to_string(), capped);
    if config.gateway.client_addressing.proxy_protocol {
        // Every connection starts with a PROXY header from a trusted balancer, read within
        // the head deadline (decision 212).
        let reader = tollgate::transport::client_address::ProxyProtocol::new(
            config.gateway.client_addressing.clone(),
            head_timeout,
        );
        proxy.endpoints().set_pre_tls_callback(Arc::new(reader));
    }
    match &config.gateway.tls {
        Some(tls) => {
            // The files were read and checked with the config; ALPN offers HTTP/2 and
            // HTTP/1.1 (decision 219).
            let (cert, key) = (tls.cert_file.to_string_lossy(), tls.key_file.to_string_lossy());
            match pingora::listeners::tls::TlsSettings::intermediate(&cert, &key) {
                Ok(mut settings) => {
                    settings.set_alpn(pingora::protocols::ALPN::H2H1);
                    proxy.add_tls_with_settings(&listen, listeners.socket_options(listeners.public), settings);
                }
                Err(e) => {
                    log::error!("TLS listener {listen}: {e}");
                    std::process::exit(1);
                }
            }
        }
        None => match listeners.socket_options(listeners.public) {
            Some(options) => proxy.add_tcp_with_settings(&listen, options),
            None => proxy.add_tcp(&listen),
        },
    }
    let mut admin_service = Service::new("admin".to_string(), admin);
    match listeners.socket_options(listeners.admin) {
        Some(options) => admin_service.add_tcp_with_settings(&admin_listen, options),
        None => admin_service.add_tcp(&admin_listen),
    }
    admin_service.threads = Some(1);
    server.add_service(proxy);
    server.add_service(admin_service);
    if let Some(ledger) = services.ledger.clone() {
        spawn_hold_sweeper(ledger, config_sweep);
    }
    if let Some(identity) = services.identity.clone() {
        spawn_copy_eraser(identity.store().clone(), config_sweep);
    }
    tollgate::proxy::health::spawn(live.clone());
    spawn_reload_on_hangup(live);
    let ledger = services.ledger.clone().map(|l| l as Arc<dyn tollgate::store::ledger::LedgerAdmin>);
    end_stop_when_drained(&server, config.gateway.grace_period_seconds, ledger, traces);
    server.run_forever()
}

/// Pingora's panics when a listener cannot start (a port taken after the check above, a
/// certificate its TLS setup refuses): the process exits with status 1 instead of running
/// on without its public listener.
fn exit_on_listener_panic() {
    const LISTENER_PANICS: [&str; 3] = [
        "Failed to build listeners",
        "Failed to create server listener config",
        "Failed to load provided certificates",
    ];
    let report = std::panic::take_hook();
    std::panic::set_hook(Box::new(move |info| {
        report(info);
        let payload = info.payload();
        let text = payload
            .downcast_ref::<String>()
            .map(String::as_str)
            .or_else(|| payload.downcast_ref::<&str>().copied())
            .unwrap_or("");
        if LISTENER_PANICS.iter().any(|m| text.contains(m)) {
            log::error!("a listener could not start; exiting");
            std::process::exit(1);
        }
    }));
}

/// Pingora sleeps out the whole grace period of a graceful stop (SIGTERM, or the old process
/// of an upgrade) even when nothing runs. Once the grace period has begun, this ends the
/// process as soon as no request is in flight and no settlement waits for the ledger, for a
/// quiet second (decision 166); a request still running keeps it alive up to the grace period.
fn end_stop_when_drained(
    server: &Server,
    grace_seconds: u64,
    ledger: Option<Arc<dyn tollgate::store::ledger::LedgerAdmin>>,
    traces: Option<Arc<tollgate::observe::traces::Exporter>>,
) {
    use pingora::server::ExecutionPhase;
    let mut phases = server.watch_execution_phase();
    let watch = move || {
        loop {
            match phases.blocking_recv() {
                Ok(ExecutionPhase::ShutdownGracePeriod) => break,
                Ok(_) | Err(tokio::sync::broadcast::error::RecvError::Lagged(_)) => {}
                Err(tokio::sync::broadcast::error::RecvError::Closed) => return,
            }
        }
        let began = std::time::Instant::now();
        let grace = std::time::Duration::from_secs(grace_seconds);
        let deadline = began.checked_add(grace).unwrap_or(began + std::time::Duration::from_secs(86_400));
        if tollgate::runtime::drain::PROCESS.wait_until_quiet(tollgate::runtime::drain::QUIET, deadline) {
            log::info!("graceful stop: nothing left in flight after {:.1} s; exiting", began.elapsed().as_secs_f64());
            if let Some(ledger) = &ledger {
                give_back_leases(&**ledger);
            }
            if let Some(traces) = &traces {
                traces.flush(); // the last requests' spans
            }
            std::process::exit(0);
        }
    };
    if let Err(e) = std::thread::Builder::new().name("stop-watch".into()).spawn(watch) {
        log::warn!("graceful stop watcher could not start ({e}); a stop waits the whole grace period");
    }
}

/// Give back this instance's unused leases (decision 187) before it exits, so their money is
/// not held until their rows expire; ten seconds at most (a commit behind a busy writer on a
/// loaded machine took more than two; past the bound the rows expire and are swept).
fn give_back_leases(ledger: &dyn tollgate::store::ledger::LedgerAdmin) {
    let rt = match tokio::runtime::Builder::new_current_thread().enable_time().build() {
        Ok(rt) => rt,
        Err(e) => return log::warn!("leases not given back ({e}); their rows expire and are swept"),
    };
    let wait = std::time::Duration::from_secs(10);
    match rt.block_on(async { tokio::time::timeout(wait, ledger.give_back_leases()).await }) {
        Ok(n) if n > 0 => log::info!("gave back {n} unused leases"),
        Ok(_) => {}
        Err(_) => log::warn!("leases not all given back in {wait:?}; their rows expire and are swept"),
    }
}

/// Every `every` (30 s by default), release holds whose request outlived its hold (a gateway died mid-request;
/// released, never charged, each release logged) and remove the unspent part of expired top-ups.
fn spawn_hold_sweeper(ledger: Arc<dyn tollgate::store::ledger::LedgerAdmin>, every: std::time::Duration) {
    tollgate::runtime::background::spawn("hold-sweeper", async move {
        loop {
            tokio::time::sleep(every).await;
            match ledger.sweep_expired_holds(tollgate::runtime::clock::now_ms()).await {
                Ok(ids) if !ids.is_empty() => log::warn!("released {} expired holds: {ids:?}", ids.len()),
                Ok(_) => {}
                Err(e) => log::warn!("hold sweep failed: {e}"),
            }
            // Credit past its expiry (purchase balance lasts one year).
            match ledger.sweep_expired_credit(tollgate::runtime::clock::now_ms()).await {
                Ok(gone) => {
                    for (ws, cents) in gone {
                        log::info!("workspace {ws}: {cents} cents of credit expired");
                    }
                }
                Err(e) => log::warn!("credit expiry sweep failed: {e}"),
            }
        }
    });
}

/// Every `every`, erase the encrypted copies of keys that can never work again (a grace that
/// ended, an expiry that passed): revocation erases its copy at once, these states come by
/// the clock (decision 172).
fn spawn_copy_eraser(store: Arc<dyn tollgate::store::IdentityStore>, every: std::time::Duration) {
    tollgate::runtime::background::spawn("copy-eraser", async move {
        loop {
            match store.erase_dead_copies(tollgate::runtime::clock::now_ms()).await {
                Ok(0) => {}
                Ok(n) => log::info!("erased the encrypted copies of {n} keys whose grace or expiry ended"),
                Err(e) => log::warn!("erasing ended keys' copies failed: {e}"),
            }
            tokio::time::sleep(every).await;
        }
    });
}

/// SIGHUP reloads `models.yaml` and `upstreams.yaml` like `POST /admin/v1/reload` (the
/// outcome is logged). Registering the handler also keeps SIGHUP from ending the process.
fn spawn_reload_on_hangup(live: Arc<LiveConfig>) {
    tollgate::runtime::background::spawn("reload-signal", async move {
        use tokio::signal::unix::{SignalKind, signal};
        let Ok(mut hangups) = signal(SignalKind::hangup()) else {
            log::error!("SIGHUP handler could not be installed");
            return;
        };
        while hangups.recv().await.is_some() {
            log::info!("SIGHUP: reloading models.yaml and upstreams.yaml");
            let _ = crate::admin::reload_answer(&live);
        }
    });
}

/// Session placements live in the limiter's store: in process, or on the same Redis (so every
/// instance keeps a session on one replica), over its connection (decision 150).
fn placement_store(
    cfg: &tollgate::state::limits::LimiterConfig,
    shared: Option<Arc<tollgate::state::redis_conn::LazyRedis>>,
) -> Arc<dyn tollgate::state::placements::PlacementStore> {
    use tollgate::state::limits::LimiterConfig;
    use tollgate::state::placements::{InProcessPlacements, RedisPlacements};
    match cfg {
        LimiterConfig::Redis { url, options } => match shared {
            Some(redis) => Arc::new(RedisPlacements::on(redis, &options.prefix, options.timeout)),
            None => match RedisPlacements::new(url, &options.prefix, options.timeout) {
                Ok(store) => Arc::new(store),
                Err(e) => {
                    log::warn!("{e}; session placements are kept in this process");
                    Arc::new(InProcessPlacements::new())
                }
            },
        },
        _ => Arc::new(InProcessPlacements::new()),
    }
}

#[cfg(test)]
mod tests {
    use super::server_conf;

    fn gateway(yaml: &str) -> tollgate::config::GatewaySettings {
        let dir = std::env::temp_dir().join(format!("tollgate-srvconf-{}", uuid::Uuid::new_v4().simple()));
        std::fs::create_dir_all(&dir).unwrap();
        let file = dir.join("tollgate.yaml");
        let text = format!(
            "listen: 127.0.0.1:18080\nadmin_listen: 127.0.0.1:18081\n{yaml}plugins:\n  - name: chat_completions\n"
        );
        std::fs::write(&file, text).unwrap();
        let settings = tollgate::config::load_settings(&file);
        let _ = std::fs::remove_dir_all(&dir);
        settings.unwrap()
    }

    #[test]
    fn pingora_gets_the_threads_and_their_work_stealing_from_the_config() {
        let dir = std::path::Path::new("/run/tollgate-test");
        let one = server_conf(&gateway("threads: 1\n"), 18080, dir);
        assert_eq!((one.threads, one.work_stealing), (1, false), "one thread: nothing to steal from");
        let two = server_conf(&gateway("threads: 2\n"), 18080, dir);
        assert_eq!((two.threads, two.work_stealing), (2, true));
        let pinned = server_conf(&gateway("threads: 4\nwork_stealing: false\n"), 18080, dir);
        assert_eq!((pinned.threads, pinned.work_stealing), (4, false));
        assert_eq!(one.pid_file, "/run/tollgate-test/tollgate-18080.pid");
        assert_eq!(one.max_retries, 2);
    }
}
