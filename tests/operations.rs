//! Operations through the real binary (issue 16): active replica health checks, hot reload of
//! `models.yaml` and `upstreams.yaml` (admin route and SIGHUP) under load.
#![allow(clippy::unwrap_used, clippy::expect_used, clippy::panic)]

mod common;

use std::sync::Arc;
use std::sync::atomic::{AtomicBool, AtomicU64, Ordering};
use std::time::{Duration, Instant};

use common::{Gateway, Mock, Opts, chat_body};
use serde_json::{Value, json};

fn wait_for(what: &str, within: Duration, mut cond: impl FnMut() -> bool) {
    let deadline = Instant::now() + within;
    while !cond() {
        assert!(Instant::now() < deadline, "timed out waiting for {what}");
        std::thread::sleep(Duration::from_millis(50));
    }
}

async fn requests_of(mock: &Mock) -> u64 {
    mock.stats().await["requests"].as_u64().unwrap()
}

#[path = "operations/graceful_stop.rs"]
mod graceful_stop;
#[path = "operations/health_checks.rs"]
mod health_checks;
#[path = "operations/reloads.rs"]
mod reloads;
#[path = "operations/upgrades.rs"]
mod upgrades;
