//! The real `tollgate` binary as a child process, with a temporary config written per test.

use std::io::{Read, Write};
use std::net::TcpStream;
use std::path::PathBuf;
use std::process::Command;
use std::time::{Duration, Instant};

use super::{Mock, Proc, Reply, await_reported_ports, closed_port, free_port, models_yaml};

/// Gateway settings a test may change.
#[derive(Clone)]
pub struct Opts {
    pub response_seconds: f64,
    pub first_token_seconds: f64,
    /// Replicas of `chat-model`: the mock, unless a test lists others.
    pub chat_replicas: Vec<String>,
    /// Concurrency of each `chat-model` replica.
    pub chat_concurrency: u32,
    /// `budgets.session_affinity_idle_ttl_seconds`.
    pub affinity_ttl_seconds: u64,
    pub tiny_pool_concurrency: u32,
    pub max_request_bytes: u64,
    /// Identity store: SQLite in the temp dir, or this PostgreSQL URL.
    pub postgres_url: Option<String>,
    /// `tls: {...}` of that PostgreSQL store.
    pub postgres_tls: Option<String>,
    /// Start without an admin token (the admin listener must refuse everything).
    pub no_admin_token: bool,
    pub hold_margin_seconds: u64,
    /// `billing.ledger_max_wait_ms`: holds are shed while ledger writes wait longer.
    pub ledger_max_wait_ms: u64,
    /// Leave the dialects plugin out of the chain.
    pub without_dialects: bool,
    /// Lines of the `limits` section (indented two spaces); when given, the
    /// `connection_gate` and `limits` plugins join the chain.
    pub limits: Option<String>,
    /// Silence before a messages stream gets a `ping`.
    pub heartbeat_seconds: f64,
    /// Extra environment of the gateway process (e.g. `TOLLGATE_FAULT_PANIC`).
    pub env: Vec<(&'static str, String)>,
    /// Top-level sections appended to `tollgate.yaml` (e.g. `plans:`).
    pub extra_yaml: String,
    /// Lines added to the `chat-model` pool (indented four spaces), e.g. `health_check:`.
    pub chat_pool_extra: String,
    /// `shutdown.grace_period_seconds`.
    pub grace_seconds: u64,
}

impl Default for Opts {
    fn default() -> Self {
        Opts {
            response_seconds: 30.0,
            first_token_seconds: 30.0,
            chat_replicas: Vec::new(),
            chat_concurrency: 64,
            affinity_ttl_seconds: 900,
            tiny_pool_concurrency: 1,
            max_request_bytes: 3_500_000,
            postgres_url: None,
            postgres_tls: None,
            no_admin_token: false,
            hold_margin_seconds: 120,
            ledger_max_wait_ms: 2_000,
            without_dialects: false,
            limits: None,
            heartbeat_seconds: 15.0,
            env: Vec::new(),
            extra_yaml: String::new(),
            chat_pool_extra: String::new(),
            grace_seconds: 1,
        }
    }
}

pub struct Gateway {
    pub port: u16,
    pub admin_port: u16,
    pub dir: PathBuf,
    pub admin_token: String,
    /// A workspace key minted at start (empty when the admin API is closed).
    pub key: String,
    pub workspace: String,
    proc: Proc,
}

impl Drop for Gateway {
    /// Stop the process, then remove its temporary folder (store, secrets, log).
    fn drop(&mut self) {
        self.kill();
        if std::env::var_os("TOLLGATE_KEEP_TEST_DIRS").is_none() {
            let _ = std::fs::remove_dir_all(&self.dir);
        }
    }
}

pub const ADMIN_TOKEN: &str = "test-admin-token-0123456789abcdef";

fn replicas_yaml(addrs: &[String], concurrency: u32) -> String {
    addrs.iter().map(|a| format!("      - {{ address: \"{a}\", max_concurrency: {concurrency} }}\n")).collect()
}

impl Gateway {
    pub fn start(mock: &Mock) -> Gateway {
        Self::start_with(mock, Opts::default())
    }

    pub fn start_with(mock: &Mock, opts: Opts) -> Gateway {
        let dir = std::env::temp_dir().join(format!("tollgate-test-{}-{}", std::process::id(), free_port()));
        Self::start_in(mock, opts, dir)
    }

    /// Start in `dir` (reusing its store and secrets when another instance used it before).
    pub fn start_in(mock: &Mock, opts: Opts, dir: PathBuf) -> Gateway {
        std::fs::create_dir_all(&dir).unwrap();
        let chat = if opts.chat_replicas.is_empty() { vec![mock.addr()] } else { opts.chat_replicas.clone() };
        std::fs::write(dir.join("pepper"), "p".repeat(48)).unwrap();
        std::fs::write(dir.join("enc"), "ab".repeat(32)).unwrap();
        if !opts.no_admin_token {
            std::fs::write(dir.join("admin_token"), ADMIN_TOKEN).unwrap();
        }
        let store = match &opts.postgres_url {
            Some(url) => match &opts.postgres_tls {
                Some(tls) => format!("{{ backend: postgres, url: \"{url}\", {tls} }}"),
                None => format!("{{ backend: postgres, url: \"{url}\" }}"),
            },
            None => "{ backend: sqlite, path: identity.db }".to_string(),
        };
        let admin = if opts.no_admin_token { String::new() } else { "admin:\n  token_file: admin_token\n".into() };
        std::fs::write(
            dir.join("tollgate.yaml"),
            format!(
                "listen: 127.0.0.1:0\nadmin_listen: 127.0.0.1:0\nthreads: 1\nlimits:\n  max_request_bytes: {}\n{}budgets:\n  first_token_seconds: {}\n  response_seconds: {}\n  heartbeat_seconds: {}\n  session_affinity_idle_ttl_seconds: {}\nshutdown:\n  grace_period_seconds: {}\n  graceful_shutdown_timeout_seconds: 1\nidentity:\n  store: {store}\n  key_pepper: {{ file: pepper }}\n  key_encryption_key: {{ file: enc }}\n{admin}billing:\n  topup_url: https://pay.example.com/top-up\n  hold_margin_seconds: {}\n  ledger_max_wait_ms: {}\n  sweep_interval_seconds: 1\nplugins:\n{}  - name: auth\n{}  - name: chat_completions\n  - name: billing\n{}",
                opts.max_request_bytes, opts.limits.clone().unwrap_or_default(), opts.first_token_seconds, opts.response_seconds, opts.heartbeat_seconds, opts.affinity_ttl_seconds, opts.grace_seconds, opts.hold_margin_seconds, opts.ledger_max_wait_ms,
                if opts.limits.is_some() { "  - name: connection_gate\n" } else { "" },
                if opts.without_dialects { "" } else { "  - name: dialects\n  - name: idempotency\n" },
                if opts.limits.is_some() { "  - name: limits\n" } else { "" }
            ) + &opts.extra_yaml,
        )
        .unwrap();
        std::fs::write(dir.join("models.yaml"), models_yaml()).unwrap();
        let m = vec![mock.addr()];
        let dead = vec![format!("127.0.0.1:{}", closed_port()), format!("127.0.0.1:{}", closed_port())];
        let chat_extra =
            format!("    upstream_model: org/Chat-Model-7B\n    connect_timeout_ms: 500\n{}", opts.chat_pool_extra);
        let pools: Vec<(&str, &str, &[String], u32)> = vec![
            ("chat-model", &chat_extra, &chat, opts.chat_concurrency),
            ("shared-cache-model", "", &m, 64),
            ("embed-model", "    upstream_model: org/embed\n", &m, 64),
            ("priced-embed-model", "", &m, 64),
            ("priced-rerank-model", "", &m, 64),
            ("paused-model", "", &m, 64),
            ("pricey-model", "", &m, 256),
            ("stream-model", "", &m, 256),
            ("free-model", "", &m, 64),
            ("ended-free-model", "", &m, 64),
            ("closing-free-model", "", &m, 64),
            ("tiny-pool-model", "", &m, opts.tiny_pool_concurrency),
            ("dead-model", "    connect_timeout_ms: 300\n", &dead, 4),
            ("limited-model", "", &m, 4),
            ("busy-model", "", &m, 2),
            ("rules-model", "", &m, 64),
            ("vision-model", "", &m, 64),
        ];
        let mut upstreams = String::from("pools:\n");
        for (model, extra, replicas, concurrency) in pools {
            upstreams.push_str(&format!("  {model}:\n{extra}    replicas:\n{}", replicas_yaml(replicas, concurrency)));
        }
        std::fs::write(dir.join("upstreams.yaml"), upstreams).unwrap();
        let log = std::fs::File::create(dir.join("gateway.log")).unwrap();
        // Both listeners on port 0: `serve` prints the ports it picked (its one line of output).
        let out = std::fs::File::create(dir.join("gateway.out")).unwrap();
        let child = Command::new(env!("CARGO_BIN_EXE_tollgate"))
            .args(["serve", "--config"])
            .arg(dir.join("tollgate.yaml"))
            .env("RUST_LOG", "info")
            .env_remove("TOLLGATE_ADMIN_TOKEN")
            .envs(opts.env.iter().map(|(k, v)| (*k, v.as_str())))
            .stdout(out)
            .stderr(log)
            .spawn()
            .expect("gateway starts");
        let mut gw = Gateway {
            port: 0,
            admin_port: 0,
            dir,
            admin_token: ADMIN_TOKEN.to_string(),
            key: String::new(),
            workspace: String::new(),
            proc: Proc { child },
        };
        (gw.port, gw.admin_port) =
            await_reported_ports(&gw.dir.join("gateway.out"), &mut gw.proc, &gw.dir.join("gateway.log"));
        let (port, admin_port) = (gw.port, gw.admin_port);
        let deadline = Instant::now() + Duration::from_secs(20);
        while TcpStream::connect(("127.0.0.1", port)).is_err() || TcpStream::connect(("127.0.0.1", admin_port)).is_err()
        {
            assert!(Instant::now() < deadline, "gateway did not listen: {}", gw.log());
            assert!(gw.proc.child.try_wait().unwrap().is_none(), "gateway exited: {}", gw.log());
            std::thread::sleep(Duration::from_millis(20));
        }
        if !opts.no_admin_token {
            let (ws, key) = gw.mint_workspace_key();
            gw.workspace = ws;
            gw.key = key;
        }
        gw
    }

    /// Name the ports this instance picked in its `tollgate.yaml`, for a process that must
    /// take them over (an upgrade).
    pub fn name_ports_in_config(&self) {
        let path = self.dir.join("tollgate.yaml");
        let yaml = std::fs::read_to_string(&path).unwrap().replacen(
            "listen: 127.0.0.1:0\nadmin_listen: 127.0.0.1:0\n",
            &format!("listen: 127.0.0.1:{}\nadmin_listen: 127.0.0.1:{}\n", self.port, self.admin_port),
            1,
        );
        std::fs::write(path, yaml).unwrap();
    }

    /// The gateway's process id (for signals).
    pub fn pid(&self) -> u32 {
        self.proc.child.id()
    }

    /// The exit status if the process has ended (never waits).
    pub fn exited(&mut self) -> Option<std::process::ExitStatus> {
        self.proc.child.try_wait().unwrap()
    }

    /// Wait for the process to exit (after a signal that ends it); its exit status.
    pub fn wait_exit(&mut self, within: Duration) -> Option<std::process::ExitStatus> {
        let deadline = Instant::now() + within;
        while Instant::now() < deadline {
            if let Some(status) = self.proc.child.try_wait().unwrap() {
                return Some(status);
            }
            std::thread::sleep(Duration::from_millis(50));
        }
        None
    }

    /// Call the admin API (blocking; usable from sync and async tests alike).
    pub fn admin(&self, method: &str, path: &str, body: Option<serde_json::Value>) -> (u16, serde_json::Value) {
        let url = format!("http://127.0.0.1:{}{path}", self.admin_port);
        let token = self.admin_token.clone();
        let method = method.to_string();
        std::thread::spawn(move || {
            let rt = tokio::runtime::Builder::new_current_thread().enable_all().build().unwrap();
            rt.block_on(async move {
                let client = reqwest::Client::new();
                let mut req = client
                    .request(reqwest::Method::from_bytes(method.as_bytes()).unwrap(), url)
                    .header("authorization", format!("Bearer {token}"));
                if let Some(b) = body {
                    req = req.json(&b);
                }
                let r = req.send().await.unwrap();
                let status = r.status().as_u16();
                let text = r.text().await.unwrap();
                (status, serde_json::from_str(&text).unwrap_or(serde_json::Value::Null))
            })
        })
        .join()
        .unwrap()
    }

    /// A new workspace and a key in it: (workspace id, plaintext key).
    pub fn mint_workspace_key(&self) -> (String, String) {
        let (status, ws) = self.admin("POST", "/admin/v1/workspaces", Some(serde_json::json!({"name": "test"})));
        assert_eq!(status, 201, "{ws}");
        let ws = ws["id"].as_str().unwrap().to_string();
        let key = self.mint_key(&ws, serde_json::json!({}));
        (ws, key["key"].as_str().unwrap().to_string())
    }

    /// Mint a key in `ws` with these options; returns the admin answer.
    pub fn mint_key(&self, ws: &str, opts: serde_json::Value) -> serde_json::Value {
        let (status, key) = self.admin("POST", &format!("/admin/v1/workspaces/{ws}/keys"), Some(opts));
        assert_eq!(status, 201, "{key}");
        key
    }

    pub fn url(&self, path: &str) -> String {
        format!("http://127.0.0.1:{}{path}", self.port)
    }

    /// Kill the gateway process at once (SIGKILL: no shutdown, no logging phase).
    pub fn kill(&mut self) {
        let _ = self.proc.child.kill();
        let _ = self.proc.child.wait();
    }

    pub fn log(&self) -> String {
        std::fs::read_to_string(self.dir.join("gateway.log")).unwrap_or_default()
    }

    /// POST JSON and return (status, headers, body text).
    /// POST JSON with the gateway's test key and return (status, headers, body text).
    pub async fn post(&self, path: &str, body: &serde_json::Value, headers: &[(&str, &str)]) -> Reply {
        let bearer = self.bearer();
        let mut all = vec![("authorization", bearer.as_str())];
        all.extend_from_slice(headers);
        self.post_as(path, body, &all).await
    }

    /// POST JSON with exactly these headers (no key added; a later header of the same name
    /// replaces an earlier one).
    pub async fn post_as(&self, path: &str, body: &serde_json::Value, headers: &[(&str, &str)]) -> Reply {
        let mut map = reqwest::header::HeaderMap::new();
        for (k, v) in headers {
            map.insert(
                reqwest::header::HeaderName::from_bytes(k.as_bytes()).unwrap(),
                reqwest::header::HeaderValue::from_str(v).unwrap(),
            );
        }
        let r = reqwest::Client::new().post(self.url(path)).headers(map).json(body).send().await.unwrap();
        Reply::from(r).await
    }

    pub async fn get(&self, path: &str) -> Reply {
        self.get_as(path, &[("authorization", &format!("Bearer {}", self.key))]).await
    }

    pub async fn get_as(&self, path: &str, headers: &[(&str, &str)]) -> Reply {
        let mut req = reqwest::Client::new().get(self.url(path));
        for (k, v) in headers {
            req = req.header(*k, *v);
        }
        Reply::from(req.send().await.unwrap()).await
    }

    /// The ledger of the test workspace (admin API), checked consistent (stored balance equals
    /// the sum of its entries), once no hold is open: holds are released in the log phase,
    /// which may end just after the client read its answer.
    pub fn settled_ledger(&self) -> serde_json::Value {
        let deadline = Instant::now() + Duration::from_secs(5);
        loop {
            let (s, v) = self.admin("GET", &format!("/admin/v1/workspaces/{}/ledger", self.workspace), None);
            assert_eq!(s, 200, "{v}");
            assert_eq!(v["check"]["consistent"], true, "stored balance == sum of entries: {v}");
            if v["held_cents"] == 0 || Instant::now() > deadline {
                return v;
            }
            std::thread::sleep(Duration::from_millis(50));
        }
    }

    /// The admin listener's Prometheus text (`GET /metrics`, with the admin token).
    pub async fn metrics(&self) -> String {
        let url = format!("http://127.0.0.1:{}/metrics", self.admin_port);
        let r = reqwest::Client::new().get(url).bearer_auth(&self.admin_token).send().await.unwrap();
        assert_eq!(r.status(), 200);
        r.text().await.unwrap()
    }

    /// Authorization header with the test key.
    pub fn bearer(&self) -> String {
        format!("Bearer {}", self.key)
    }

    /// Send raw bytes on a fresh connection and read until the server closes or `until`
    /// appears; returns everything read.
    pub fn raw(&self, request: &[u8], read_timeout: Duration) -> String {
        let mut s = TcpStream::connect(("127.0.0.1", self.port)).unwrap();
        s.set_read_timeout(Some(read_timeout)).unwrap();
        s.write_all(request).unwrap();
        let mut out = Vec::new();
        let mut buf = [0u8; 65536];
        loop {
            match s.read(&mut buf) {
                Ok(0) => break,
                Ok(n) => out.extend_from_slice(&buf[..n]),
                Err(_) => break,
            }
        }
        String::from_utf8_lossy(&out).into_owned()
    }
}
