//! Rate limits shared through Redis by several gateway instances (issue: limits on Redis):
//! global accuracy under concurrent load, a Redis outage in the middle of traffic, and a
//! killed instance's concurrency slots freeing within the lease time. Real Redis at
//! `REDIS_URL` (default 127.0.0.1:6379) and a redis-server child of the test's own for the
//! outage; identity on PostgreSQL so the instances share keys. Never skipped.
#![allow(clippy::unwrap_used, clippy::expect_used, clippy::panic)]

mod common;

use std::time::{Duration, Instant};

use common::redis::RedisChild;
use common::{Gateway, Mock, Opts, chat_body, pg};
use serde_json::json;

fn redis_url() -> String {
    std::env::var("REDIS_URL").unwrap_or_else(|_| "redis://127.0.0.1:6379".into())
}

/// A key prefix no other test run shares.
fn prefix() -> String {
    format!("tgtest{}x{}", std::process::id(), common::free_port())
}

fn redis_limits(url: &str, prefix: &str, extra: &str) -> String {
    format!("  store: {{ backend: redis, url: \"{url}\", prefix: {prefix}, timeout_ms: 300 }}\n{extra}")
}

async fn two_gateways(mock: &Mock, limits: String) -> (Gateway, Gateway) {
    let db = pg::fresh_database().await;
    let opts = Opts { postgres_url: Some(db), limits: Some(limits), ..Opts::default() };
    let a = Gateway::start_with(mock, opts.clone());
    let b = Gateway::start_with(mock, opts);
    (a, b)
}

#[tokio::test]
async fn two_instances_admit_exactly_the_window_and_never_exceed_a_gate() {
    let mock = Mock::start();
    let limits = redis_limits(
        &redis_url(),
        &prefix(),
        "  requests_per_minute: { free: 20, core: 20, enterprise: 20 }\n  workspace_concurrency: { free: 3, core: 3, enterprise: 3 }\n",
    );
    let (a, b) = two_gateways(&mock, limits).await;
    let auth = a.bearer();
    let key_header = [("authorization", auth.as_str())];
    let mut calls = Vec::new();
    for i in 0..40 {
        let gw = if i % 2 == 0 { &a } else { &b };
        calls.push(gw.get_as("/v1/models", &key_header));
    }
    let replies = futures::future::join_all(calls).await;
    let ok = replies.iter().filter(|r| r.status == 200).count();
    let limited = replies.iter().filter(|r| r.status == 429).count();
    assert_eq!((ok, limited), (20, 20), "exactly the window across both instances");

    // Concurrency: a second key of the workspace (its own window), ten slow requests at once.
    let second = a.mint_key(&a.workspace, json!({}))["key"].as_str().unwrap().to_string();
    let auth = format!("Bearer {second}");
    let headers = [("authorization", auth.as_str()), ("x-mock-ttft-ms", "1500")];
    let body = chat_body("chat-model", false);
    let mut calls = Vec::new();
    for i in 0..10 {
        let gw = if i % 2 == 0 { &a } else { &b };
        calls.push(gw.post_as("/v1/chat/completions", &body, &headers));
    }
    let replies = futures::future::join_all(calls).await;
    let ok = replies.iter().filter(|r| r.status == 200).count();
    for r in replies.iter().filter(|r| r.status != 200) {
        r.assert_error(429, "hosted_workspace_concurrency_limit");
    }
    assert_eq!(ok, 3, "never more than the workspace's 3 in flight across instances");
}

#[tokio::test]
async fn a_redis_outage_answers_quickly_and_shared_counting_resumes() {
    let mock = Mock::start();
    let port = RedisChild::free_port();
    let mut redis = RedisChild::start(port).await;
    let limits = redis_limits(&redis.url(), &prefix(), "");
    let db = pg::fresh_database().await;
    let gw = Gateway::start_with(&mock, Opts { postgres_url: Some(db), limits: Some(limits), ..Opts::default() });
    let body = chat_body("chat-model", false);
    assert_eq!(gw.post("/v1/chat/completions", &body, &[]).await.status, 200);
    // The node's health names the limiter's Redis (decision 175).
    let (s, h) = gw.admin("GET", "/admin/v1/health", None);
    assert_eq!((s, h["stores"]["limiter"]["status"].as_str()), (200, Some("ok")), "{h}");

    redis.kill();
    let (s, h) = gw.admin("GET", "/admin/v1/health", None);
    assert_eq!((s, h["status"].as_str()), (503, Some("degraded")), "{h}");
    assert_eq!(h["stores"]["limiter"]["status"], "down", "{h}");
    assert_eq!(h["stores"]["identity"]["status"], "ok", "{h}");
    for _ in 0..5 {
        let started = Instant::now();
        let r = gw.post("/v1/chat/completions", &body, &[]).await;
        assert!(started.elapsed() < Duration::from_secs(2), "no hung request during the outage");
        r.assert_error(503, "hosted_admission_unavailable");
        let s: u64 = r.header("retry-after").unwrap().parse().unwrap();
        assert!((1..=4).contains(&s), "randomized 1-4 s, got {s}");
        // Window-only routes count in this instance's own window meanwhile.
        let r = gw.get("/v1/models").await;
        assert_eq!(r.status, 200, "{}", r.text);
        assert!(r.header("x-ratelimit-remaining").is_some());
    }

    let _redis = RedisChild::start(port).await;
    let deadline = Instant::now() + Duration::from_secs(10);
    loop {
        let r = gw.post("/v1/chat/completions", &body, &[]).await;
        if r.status == 200 {
            break;
        }
        assert!(Instant::now() < deadline, "admission did not resume after Redis came back: {}", r.text);
        tokio::time::sleep(Duration::from_millis(200)).await;
    }
    let (s, h) = gw.admin("GET", "/admin/v1/health", None);
    assert_eq!((s, h["stores"]["limiter"]["status"].as_str()), (200, Some("ok")), "{h}");
    assert!(!gw.log().contains("panicked"), "no panic: {}", gw.log());
}

#[tokio::test]
async fn a_killed_instance_frees_its_slots_within_the_lease_time() {
    let mock = Mock::start();
    let limits = redis_limits(
        &redis_url(),
        &prefix(),
        "  lease_ttl_seconds: 2\n  workspace_concurrency: { free: 2, core: 2, enterprise: 2 }\n",
    );
    let (mut a, b) = two_gateways(&mock, limits).await;
    let url = a.url("/v1/chat/completions");
    let auth = a.bearer();
    for _ in 0..2 {
        let (url, auth) = (url.clone(), auth.clone());
        tokio::spawn(async move {
            let _ = reqwest::Client::new()
                .post(url)
                .header("authorization", auth)
                .header("x-mock-ttft-ms", "20000")
                .json(&chat_body("chat-model", false))
                .send()
                .await;
        });
    }
    tokio::time::sleep(Duration::from_millis(500)).await;
    let r = b.post_as("/v1/chat/completions", &chat_body("chat-model", false), &[("authorization", &auth)]).await;
    r.assert_error(429, "hosted_workspace_concurrency_limit");
    a.kill();
    let killed = Instant::now();
    loop {
        let r = b.post_as("/v1/chat/completions", &chat_body("chat-model", false), &[("authorization", &auth)]).await;
        if r.status == 200 {
            break;
        }
        r.assert_error(429, "hosted_workspace_concurrency_limit");
        assert!(killed.elapsed() < Duration::from_secs(5), "slots still held 5 s after the kill (lease 2 s)");
        tokio::time::sleep(Duration::from_millis(200)).await;
    }
}

#[tokio::test]
async fn admissions_piling_up_on_a_stalled_store_are_shed_as_congested() {
    let mock = Mock::start();
    let port = RedisChild::free_port();
    let redis = RedisChild::start(port).await;
    let limits = redis_limits(&redis.url(), &prefix(), "  max_pending_admissions: 1\n");
    let db = pg::fresh_database().await;
    let gw = Gateway::start_with(&mock, Opts { postgres_url: Some(db), limits: Some(limits), ..Opts::default() });
    let body = chat_body("chat-model", false);
    assert_eq!(gw.post("/v1/chat/completions", &body, &[]).await.status, 200);
    redis.signal(libc::SIGSTOP); // stalled, not gone: checks wait for the store's timeout
    let replies = futures::future::join_all((0..5).map(|_| gw.post("/v1/chat/completions", &body, &[]))).await;
    redis.signal(libc::SIGCONT);
    let congested: Vec<_> = replies.iter().filter(|r| r.status == 429).collect();
    assert!(!congested.is_empty(), "{:?}", replies.iter().map(|r| r.status).collect::<Vec<_>>());
    for r in congested {
        let v = r.assert_error(429, "hosted_admission_congested");
        assert!(v["error"].get("limit").is_none(), "no limit field");
        assert!(r.header("x-hosted-limit-scope").is_none(), "no scope header");
        assert!(r.header("retry-after").is_some());
    }
    for r in replies.iter().filter(|r| r.status != 429) {
        r.assert_error(503, "hosted_admission_unavailable");
    }
}

/// Decision 150: one gateway's limiter, idempotency records and session placements share one
/// Redis connection, so a request's check and placement read leave in one write. A Redis of
/// the test's own, so every other client on it is this gateway's.
#[tokio::test]
async fn the_limiter_the_records_and_the_placements_share_one_connection() {
    let redis = RedisChild::start(RedisChild::free_port()).await;
    let mock = Mock::start();
    let prefix = prefix();
    let opts = Opts { limits: Some(redis_limits(&redis.url(), &prefix, "")), ..Opts::default() };
    let gw = Gateway::start_with(&mock, opts);
    for i in 0..3 {
        let key = format!("shared-connection-{i}");
        let r = gw.post("/v1/chat/completions", &chat_body("chat-model", false), &[("idempotency-key", &key)]).await;
        assert_eq!(r.status, 200, "{}", r.text);
    }

    let mut c = redis::Client::open(redis.url()).unwrap().get_multiplexed_async_connection().await.unwrap();
    let keys: Vec<String> = redis::cmd("KEYS").arg(format!("{{{prefix}}}:*")).query_async(&mut c).await.unwrap();
    for kind in [":w:", ":i:", ":p:"] {
        assert!(keys.iter().any(|k| k.contains(kind)), "no {kind} key: each store was used ({keys:?})");
    }
    let mine: i64 = redis::cmd("CLIENT").arg("ID").query_async(&mut c).await.unwrap();
    let list: String = redis::cmd("CLIENT").arg("LIST").query_async(&mut c).await.unwrap();
    let gateway_clients: Vec<&str> = list.lines().filter(|l| !l.starts_with(&format!("id={mine} "))).collect();
    assert_eq!(gateway_clients.len(), 1, "the gateway's connections: {gateway_clients:#?}");
}

/// Issue 48, finding 1 (decision 202): Redis restarted without persistence empties the gate
/// sets. The requests still running are counted again before anything else is admitted:
/// with 3 of the workspace's 4 slots taken by running requests, new requests after the
/// restart are refused (`503` while the limiter recovers, then `429`) except one.
#[tokio::test]
async fn running_requests_are_counted_again_after_a_redis_restart() {
    let mock = Mock::start();
    let port = RedisChild::free_port();
    let mut redis = RedisChild::start(port).await;
    let limits =
        redis_limits(&redis.url(), &prefix(), "  workspace_concurrency: { free: 4, core: 4, enterprise: 4 }\n");
    let gw = Gateway::start_with(&mock, Opts { limits: Some(limits), response_seconds: 60.0, ..Opts::default() });
    let url = gw.url("/v1/chat/completions");
    let auth = gw.bearer();
    // A request that runs for 30 s; its outcome (status and code) once it ends.
    let long = || {
        let (url, auth) = (url.clone(), auth.clone());
        tokio::spawn(async move {
            let r = reqwest::Client::new()
                .post(url)
                .header("authorization", auth)
                .header("x-mock-ttft-ms", "30000")
                .json(&chat_body("chat-model", false))
                .send()
                .await
                .unwrap();
            let status = r.status().as_u16();
            let v: serde_json::Value = r.json().await.unwrap_or_default();
            (status, v["error"]["code"].as_str().unwrap_or_default().to_string())
        })
    };
    let running: Vec<_> = (0..3).map(|_| long()).collect();
    tokio::time::sleep(Duration::from_millis(1_500)).await;
    assert!(running.iter().all(|t| !t.is_finished()), "three requests run");

    redis.kill();
    let _redis = RedisChild::start(port).await;
    // New requests for 8 s: each is refused at once, or admitted and still running at the end.
    let mut probes = Vec::new();
    let started = Instant::now();
    while started.elapsed() < Duration::from_secs(8) {
        probes.push(long());
        tokio::time::sleep(Duration::from_millis(300)).await;
    }
    tokio::time::sleep(Duration::from_millis(500)).await;
    let (mut admitted, mut codes) = (0, Vec::new());
    for p in probes {
        if p.is_finished() {
            codes.push(p.await.unwrap());
        } else {
            admitted += 1;
            p.abort();
        }
    }
    assert!(
        codes.iter().all(|(s, c)| matches!(
            (*s, c.as_str()),
            (503, "hosted_admission_unavailable") | (429, "hosted_workspace_concurrency_limit")
        )),
        "{codes:?}"
    );
    assert!(codes.iter().any(|(s, _)| *s == 429), "the running requests were counted again: {codes:?}");
    assert_eq!(admitted, 1, "one slot was free; refused: {codes:?}\n{}", gw.log());
    assert!(!gw.log().contains("panicked"));
}
