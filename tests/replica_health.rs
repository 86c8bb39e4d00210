//! Passive replica health and the retry on another replica (issue 48, decision 204), through
//! the real binary: a replica that accepts connections and never answers (a frozen process),
//! and one that resets every connection before answering, each beside a healthy replica.
#![allow(clippy::unwrap_used, clippy::expect_used, clippy::panic)]

mod common;

use std::io::Read;
use std::net::TcpListener;

use common::{Gateway, Mock, Opts};

/// The sum of a Prometheus counter's series whose line contains every one of `parts`.
fn counter(metrics: &str, parts: &[&str]) -> u64 {
    metrics
        .lines()
        .filter(|l| !l.starts_with('#') && parts.iter().all(|p| l.contains(p)))
        .filter_map(|l| l.rsplit(' ').next()?.parse::<f64>().ok())
        .map(|v| v as u64)
        .sum()
}

/// Finding 3: one of two replicas is frozen (SIGSTOP: the kernel still accepts connections).
/// A stream placed on it gets no header within the pool's first-byte timeout, is sent to the
/// other replica and completes; after two such failures in a row the frozen replica is
/// ejected (a WARN line, a metric) and gets no new request.
#[tokio::test]
async fn a_frozen_replica_is_left_and_ejected_and_its_streams_complete_elsewhere() {
    let (frozen, healthy) = (Mock::start(), Mock::start());
    let gw = Gateway::start_with(
        &healthy,
        Opts {
            // Replica 0 is the one least-loaded placement tries first when both are idle.
            chat_replicas: vec![frozen.addr(), healthy.addr()],
            chat_pool_extra: "    first_byte_timeout_ms: 1000\n    eject_after_failures: 2\n".into(),
            ..Opts::default()
        },
    );
    frozen.signal(libc::SIGSTOP);
    // Each conversation is placed by its opening message (rendezvous hashing): about half go
    // to the frozen replica first. Until two have (then it is ejected), at most 40.
    let ejected = format!("replica {} of chat-model ejected", frozen.addr());
    let mut sent = 0;
    while sent < 40 && !gw.log().contains(&ejected) {
        let body = serde_json::json!({
            "model": "chat-model",
            "stream": true,
            "messages": [{"role": "user", "content": format!("conversation {sent}")}],
        });
        let r = gw.post("/v1/chat/completions", &body, &[]).await;
        assert_eq!(r.status, 200, "request {sent}: {}", r.text);
        assert!(r.text.contains("data: [DONE]") && !r.text.contains("\"error\""), "request {sent}: {}", r.text);
        sent += 1;
    }
    frozen.signal(libc::SIGCONT);
    assert_eq!(healthy.stats().await["requests"], sent, "every stream was served by the healthy replica");
    let log = gw.log();
    assert!(log.contains(&ejected), "{log}");
    assert!(log.contains("no_header"), "{log}");
    let m = gw.metrics().await;
    assert!(counter(&m, &["tollgate_replica_ejections_total", "reason=\"no_header\""]) >= 1, "{m}");
    assert!(counter(&m, &["tollgate_replica_retries_total", "reason=\"no_header\""]) >= 2, "{m}");
}

/// A replica that resets the connection before answering (a crashed server's port reused, a
/// proxy in front of a dead one): a non-streamed request that got no byte goes to the other
/// replica once and succeeds, and is not charged twice.
#[tokio::test]
async fn a_request_reset_before_any_byte_is_retried_once_on_another_replica() {
    let healthy = Mock::start();
    let resetting = TcpListener::bind("127.0.0.1:0").unwrap();
    let bad = resetting.local_addr().unwrap().to_string();
    std::thread::spawn(move || {
        for conn in resetting.incoming() {
            let Ok(mut conn) = conn else { continue };
            // Read the request, then close without a byte of answer.
            let mut buf = [0u8; 65536];
            let _ = conn.set_read_timeout(Some(std::time::Duration::from_millis(200)));
            let _ = conn.read(&mut buf);
            drop(conn);
        }
    });
    let gw =
        Gateway::start_with(&healthy, Opts { chat_replicas: vec![bad.clone(), healthy.addr()], ..Opts::default() });
    // Conversations are placed by their opening message: about half meet the resetting
    // replica first (until it is ejected after three in a row).
    for i in 0..20 {
        let body = serde_json::json!({
            "model": "chat-model",
            "messages": [{"role": "user", "content": format!("conversation {i}")}],
        });
        let r = gw.post("/v1/chat/completions", &body, &[]).await;
        assert_eq!(r.status, 200, "request {i}: {}", r.text);
        assert_eq!(r.json()["object"], "chat.completion");
    }
    assert_eq!(healthy.stats().await["requests"], 20);
    let m = gw.metrics().await;
    assert!(counter(&m, &["tollgate_replica_retries_total", "reason=\"reset\""]) >= 1, "{m}");
    let ledger = gw.settled_ledger();
    let settled = ledger["entries"].as_array().map_or(0, |e| e.iter().filter(|e| e["kind"] == "settlement").count());
    assert_eq!(settled, 20, "each request settled once: {ledger}");
}
