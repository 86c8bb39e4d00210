//! Test harness: the real `tollgate` binary and the mock replica as child processes on
//! ephemeral ports, with a temporary config written per test.
#![allow(dead_code, clippy::unwrap_used, clippy::expect_used, clippy::panic)]

pub mod pg;
pub mod redis;
pub mod routes;
pub mod tcp_switch;

use std::io::{BufRead, BufReader, Read, Write};
use std::net::{TcpListener, TcpStream};
use std::path::PathBuf;
use std::process::{Child, Command, Stdio};
use std::time::{Duration, Instant};

pub struct Proc {
    child: Child,
}

impl Proc {
    pub fn new(child: Child) -> Proc {
        Proc { child }
    }

    /// Still running (not exited).
    pub fn running(&mut self) -> bool {
        self.child.try_wait().unwrap().is_none()
    }
}

impl Drop for Proc {
    fn drop(&mut self) {
        let _ = self.child.kill();
        let _ = self.child.wait();
    }
}

/// The mock replica's binary: built by the workspace beside `tollgate` (another package, so
/// Cargo gives the tests no `CARGO_BIN_EXE_` for it; `cargo build` builds every member).
pub fn mock_binary() -> PathBuf {
    let path = std::path::Path::new(env!("CARGO_BIN_EXE_tollgate")).with_file_name("tollgate-mock-replica");
    assert!(path.exists(), "{} is missing: run `cargo build` at the workspace root first", path.display());
    path
}

/// The mock replica, started on port 0; the port comes from its first stdout line.
pub struct Mock {
    pub port: u16,
    _proc: Proc,
}

impl Mock {
    pub fn start() -> Mock {
        let mut child = Command::new(mock_binary())
            .args(["--listen", "127.0.0.1:0"])
            .stdout(Stdio::piped())
            .stderr(Stdio::null())
            .spawn()
            .expect("mock replica starts");
        let stdout = child.stdout.take().expect("stdout");
        let mut line = String::new();
        BufReader::new(stdout).read_line(&mut line).expect("mock prints its port");
        let port = line
            .trim()
            .rsplit(':')
            .next()
            .and_then(|p| p.parse().ok())
            .unwrap_or_else(|| panic!("unexpected mock line {line:?}"));
        Mock { port, _proc: Proc { child } }
    }

    pub fn addr(&self) -> String {
        format!("127.0.0.1:{}", self.port)
    }

    /// Send `sig` to the mock's process (SIGSTOP freezes it: connections are still accepted
    /// by the kernel, nothing is answered; SIGCONT wakes it).
    pub fn signal(&self, sig: libc::c_int) {
        let pid = self._proc.child.id();
        // SAFETY: a plain kill(2) on our own child's pid.
        assert_eq!(unsafe { libc::kill(pid as libc::pid_t, sig) }, 0);
    }

    /// What the mock received last (`/mock/last-request`).
    pub async fn last_request(&self) -> serde_json::Value {
        reqwest::get(format!("http://{}/mock/last-request", self.addr())).await.unwrap().json().await.unwrap()
    }

    pub async fn stats(&self) -> serde_json::Value {
        reqwest::get(format!("http://{}/mock/stats", self.addr())).await.unwrap().json().await.unwrap()
    }
}

/// A port for a gateway listener. Not an ephemeral port (bound and released), because the
/// tests of one binary run in parallel and the kernel hands a released ephemeral port to the
/// next caller: two gateways could be given the same one. Instead each process walks its own
/// block of 1,000 ports below the ephemeral range (test binaries run one after another), and
/// skips any port something else holds.
pub fn free_port() -> u16 {
    use std::sync::atomic::{AtomicU16, Ordering};
    static NEXT: AtomicU16 = AtomicU16::new(0);
    let base = 20_000 + (std::process::id() % 12) as u16 * 1_000;
    loop {
        let port = base + NEXT.fetch_add(1, Ordering::SeqCst) % 1_000;
        if TcpListener::bind(("127.0.0.1", port)).is_ok() {
            return port;
        }
    }
}

/// A port with nothing listening (bound once, then released).
pub fn closed_port() -> u16 {
    free_port()
}

/// `closing-free-model`'s free window closes this long after the catalog is written.
pub const CLOSING_FREE_WINDOW: std::time::Duration = std::time::Duration::from_secs(6);

/// The test catalog, with free windows placed around the current time.
pub fn models_yaml() -> String {
    let now = jiff::Timestamp::now();
    let day = jiff::SignedDuration::from_hours(24);
    format!(
        "{MODELS_YAML}  - id: free-model\n    supported_endpoints: [chat_completions]\n    max_output_tokens: 4096\n    pricing: {{ input: 0, output: 10000 }}\n    free_window: {{ starts_at: \"{}\", ends_at: \"{}\" }}\n  - id: ended-free-model\n    supported_endpoints: [chat_completions]\n    max_output_tokens: 4096\n    pricing: {{ input: 0, output: 10000 }}\n    free_window: {{ starts_at: \"{}\", ends_at: \"{}\" }}\n  - id: closing-free-model\n    supported_endpoints: [chat_completions]\n    max_output_tokens: 4096\n    pricing: {{ input: 0, output: 10000 }}\n    free_window: {{ starts_at: \"{}\", ends_at: \"{}\" }}\n",
        now - day,
        now + day,
        now - day * 3,
        now - day,
        now - day,
        now + CLOSING_FREE_WINDOW,
    ) + &chat_rules_models_yaml()
}

/// Models for the chat request rules (`tests/chat_rules.rs`): one with every per-model rule
/// and a small window, one with image input and the test tokenizer.
pub fn chat_rules_models_yaml() -> String {
    let tokenizer = concat!(env!("CARGO_MANIFEST_DIR"), "/../tests/fixtures/tokenizers/tiny-bpe.json");
    format!(
        "  - id: rules-model\n    supported_endpoints: [chat_completions, messages]\n    json_mode: true\n    reasoning_efforts: [none, low, medium, high]\n    context_window: 300\n    system_message: first_only\n    json_format_effort: none\n    json_format_refused_efforts: [low, medium, high]\n    refused_efforts: [minimal]\n  - id: vision-model\n    supported_endpoints: [chat_completions, messages]\n    tool_calling: true\n    forced_tool_calling: limited\n    json_mode: true\n    input_modalities: [text, image]\n    context_window: 4096\n    tokenizer: \"{tokenizer}\"\n"
    )
}

pub const MODELS_YAML: &str = r#"
models:
  - id: chat-model
    aliases: [org/Chat-Model-7B]
    display_name: Chat Model
    created: 1700000000
    supported_endpoints: [chat_completions, responses, messages]
    tool_calling: true
    json_mode: true
    max_output_tokens: 4096
    context_window: 32768
    pricing: { input: 0.10, output: 0.30 }
    cached_input_price: 0.05
    cache_isolation: isolated
    cache_tiers: [gpu, host_ram]
    cache_retention: best_effort
    max_concurrent_requests_per_api_key: 8
    max_tokens_per_minute_per_workspace: 1000000
  - id: shared-cache-model
    supported_endpoints: [chat_completions]
    pricing: { input: 1.00, output: 2.00 }
    cached_input_price: 0.50
    cache_isolation: shared
  - id: embed-model
    modality: embedding
    supported_endpoints: [embeddings]
  - id: priced-embed-model
    modality: embedding
    supported_endpoints: [embeddings]
    pricing: { input: 10000, output: 0 }
  - id: priced-rerank-model
    modality: rerank
    supported_endpoints: [rerank]
    pricing: { input: 10000, output: 0 }
  - id: paused-model
    supported_endpoints: [chat_completions]
    availability: paused
    paused_until: "2099-01-01T00:00:00Z"
  - id: pricey-model
    supported_endpoints: [chat_completions]
    max_output_tokens: 4096
    pricing: { input: 0, output: 10000 }
    max_concurrent_standby_requests: 1
  - id: stream-model
    supported_endpoints: [chat_completions]
    pricing: { input: 0, output: 1.0 }
  - id: tiny-pool-model
    supported_endpoints: [chat_completions]
    pricing: { input: 0.10, output: 0.30 }
  - id: dead-model
    supported_endpoints: [chat_completions]
  - id: unserved-model
    supported_endpoints: [chat_completions]
  - id: limited-model
    supported_endpoints: [chat_completions, messages]
    max_concurrent_requests_per_api_key: 1
    max_concurrent_requests: 3
    max_tokens_per_minute_per_workspace: 3000
  - id: busy-model
    supported_endpoints: [chat_completions]
    max_concurrent_requests_per_api_key: 1
"#;

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
        let port = free_port();
        std::fs::create_dir_all(&dir).unwrap();
        let chat = if opts.chat_replicas.is_empty() { vec![mock.addr()] } else { opts.chat_replicas.clone() };
        let admin_port = free_port();
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
                "listen: 127.0.0.1:{port}\nadmin_listen: 127.0.0.1:{admin_port}\nthreads: 1\nlimits:\n  max_request_bytes: {}\n{}budgets:\n  first_token_seconds: {}\n  response_seconds: {}\n  heartbeat_seconds: {}\n  session_affinity_idle_ttl_seconds: {}\nshutdown:\n  grace_period_seconds: {}\n  graceful_shutdown_timeout_seconds: 1\nidentity:\n  store: {store}\n  key_pepper: {{ file: pepper }}\n  key_encryption_key: {{ file: enc }}\n{admin}billing:\n  topup_url: https://pay.example.com/top-up\n  hold_margin_seconds: {}\n  ledger_max_wait_ms: {}\n  sweep_interval_seconds: 1\nplugins:\n{}  - name: auth\n{}  - name: chat_completions\n  - name: billing\n{}",
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
        let child = Command::new(env!("CARGO_BIN_EXE_tollgate"))
            .args(["serve", "--config"])
            .arg(dir.join("tollgate.yaml"))
            .env("RUST_LOG", "info")
            .env_remove("TOLLGATE_ADMIN_TOKEN")
            .envs(opts.env.iter().map(|(k, v)| (*k, v.as_str())))
            .stdout(Stdio::null())
            .stderr(log)
            .spawn()
            .expect("gateway starts");
        let mut gw = Gateway {
            port,
            admin_port,
            dir,
            admin_token: ADMIN_TOKEN.to_string(),
            key: String::new(),
            workspace: String::new(),
            proc: Proc { child },
        };
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

pub struct Reply {
    pub status: u16,
    pub headers: reqwest::header::HeaderMap,
    pub text: String,
}

impl Reply {
    async fn from(r: reqwest::Response) -> Reply {
        let status = r.status().as_u16();
        let headers = r.headers().clone();
        let text = r.text().await.unwrap_or_default();
        Reply { status, headers, text }
    }

    pub fn json(&self) -> serde_json::Value {
        serde_json::from_str(&self.text).unwrap_or_else(|e| panic!("not JSON ({e}): {}", self.text))
    }

    pub fn header(&self, name: &str) -> Option<String> {
        self.headers.get(name).map(|v| v.to_str().unwrap_or_default().to_string())
    }

    /// The `data:` payloads of an SSE body.
    pub fn sse_data(&self) -> Vec<String> {
        self.text
            .split("\n\n")
            .filter_map(|f| f.lines().find_map(|l| l.strip_prefix("data: ")).map(str::to_string))
            .collect()
    }

    /// Assert the chat-dialect error envelope with this status and code.
    pub fn assert_error(&self, status: u16, code: &str) -> serde_json::Value {
        assert_eq!(self.status, status, "body: {}", self.text);
        let v = self.json();
        assert_eq!(v["error"]["code"], code, "body: {}", self.text);
        let rid = self.header("x-request-id").expect("x-request-id header");
        assert_eq!(v["request_id"], rid.as_str(), "request_id equals X-Request-Id");
        v
    }
}

pub fn chat_body(model: &str, stream: bool) -> serde_json::Value {
    serde_json::json!({
        "model": model,
        "messages": [{"role": "user", "content": "Say hello"}],
        "stream": stream,
    })
}
