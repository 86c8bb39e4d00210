//! A redis-server of a test's own, on a free port, stopped by its pid: outage tests never
//! touch the shared server.
#![allow(dead_code, clippy::unwrap_used, clippy::expect_used, clippy::panic)]

use std::time::{Duration, Instant};

/// A redis-server of this test's own on a free port, stopped by its pid (never the shared one).
pub struct RedisChild {
    child: Option<std::process::Child>,
    pub port: u16,
}

impl RedisChild {
    /// A port no other test of this run is given (see `common::free_port`).
    pub fn free_port() -> u16 {
        super::free_port()
    }

    pub async fn start(port: u16) -> Self {
        let child = std::process::Command::new("redis-server")
            .args(["--port", &port.to_string(), "--bind", "127.0.0.1", "--save", "", "--appendonly", "no"])
            .stdout(std::process::Stdio::null())
            .stderr(std::process::Stdio::null())
            .spawn()
            .unwrap_or_else(|e| panic!("cannot start redis-server ({e}); install it with scripts/services.sh"));
        let me = Self { child: Some(child), port };
        let client = redis::Client::open(me.url()).unwrap();
        let deadline = Instant::now() + Duration::from_secs(10);
        loop {
            if let Ok(mut c) = client.get_multiplexed_async_connection().await
                && redis::cmd("PING").query_async::<String>(&mut c).await.is_ok()
            {
                return me;
            }
            assert!(Instant::now() < deadline, "redis-server on port {port} did not come up");
            tokio::time::sleep(Duration::from_millis(20)).await;
        }
    }

    pub fn url(&self) -> String {
        format!("redis://127.0.0.1:{}", self.port)
    }

    pub fn signal(&self, sig: libc::c_int) {
        let pid = self.child.as_ref().expect("running").id();
        assert_eq!(unsafe { libc::kill(pid as libc::pid_t, sig) }, 0);
    }

    pub fn kill(&mut self) {
        if let Some(mut c) = self.child.take() {
            let _ = c.kill();
            let _ = c.wait();
        }
    }
}

impl Drop for RedisChild {
    fn drop(&mut self) {
        self.kill();
    }
}
