//! The mock replica as a child process on an ephemeral port.

use std::io::{BufRead, BufReader};
use std::path::PathBuf;
use std::process::{Command, Stdio};

use super::Proc;

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
