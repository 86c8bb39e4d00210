//! Test harness: the real `tollgate` binary and the mock replica as child processes on
//! ephemeral ports, with a temporary config written per test.
#![allow(dead_code, clippy::unwrap_used, clippy::expect_used, clippy::panic)]

pub mod pg;
pub mod redis;
pub mod routes;
pub mod tcp_switch;

mod catalog;
mod gateway;
mod mock;

pub use catalog::*;
pub use gateway::*;
pub use mock::*;

use std::net::TcpListener;
use std::path::Path;
use std::process::Child;
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

/// A port a test names itself (a port nothing listens on, a Redis server's); gateways pick
/// theirs (port 0, `Gateway::start_in`). Not an ephemeral port (bound and released), because
/// the tests of one binary run in parallel and the kernel hands a released ephemeral port to
/// the next caller: two servers could be given the same one. Instead each process walks its own
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

/// Wait (20 s) for the ports `serve` prints into the file `out`; fails with the log at `log`
/// if `proc` exits first.
pub fn await_reported_ports(out: &Path, proc: &mut Proc, log: &Path) -> (u16, u16) {
    let deadline = Instant::now() + Duration::from_secs(20);
    loop {
        if let Some(ports) = reported_ports(&std::fs::read_to_string(out).unwrap_or_default()) {
            return ports;
        }
        let log = || std::fs::read_to_string(log).unwrap_or_default();
        assert!(Instant::now() < deadline, "no ports printed: {}", log());
        assert!(proc.running(), "exited before it printed its ports: {}", log());
        std::thread::sleep(Duration::from_millis(20));
    }
}

/// The ports in `serve`'s line `tollgate: listen 127.0.0.1:P admin_listen 127.0.0.1:Q`.
pub fn reported_ports(out: &str) -> Option<(u16, u16)> {
    let line = out.lines().find(|l| l.starts_with("tollgate: listen "))?;
    let port_of = |field: &str| -> Option<u16> {
        let addr = line.split(field).nth(1)?.split_whitespace().next()?;
        addr.parse::<std::net::SocketAddr>().ok().map(|a| a.port())
    };
    Some((port_of("listen ")?, port_of("admin_listen ")?))
}
