//! The chaos suite (issue 48): production failures against the real binaries, each scenario
//! ending in the ledger audit and a check of the limits. Two gateway instances share one
//! PostgreSQL database (reached through a switch that can cut every connection, as a restart
//! does) and a redis-server of the suite's own; the full default chain (connection gate, auth,
//! dialects, idempotency, chat, limits, billing) with a priced model and a funded workspace
//! whose concurrency limit the streaming clients keep saturated.
//!
//! Scenarios: an instance SIGKILLed mid-stream; Redis restarted (no persistence) under
//! streaming load; PostgreSQL restarted under load; a replica killed and another frozen
//! (SIGSTOP) mid-stream; clients leaving mid-stream. Each prints one line:
//!
//! `chaos: scenario=.. requests=.. outcomes={..} hung=0 recover_ms=.. audit=pass limits=pass`
//!
//! and fails unless no request hung, the audit passed and the limits held. The test command
//! runs the short form (a few minutes); `scripts/chaos.sh --long` the long one (more clients,
//! longer faults).
#![allow(clippy::unwrap_used, clippy::expect_used, clippy::panic)]

mod common;

use std::collections::BTreeMap;
use std::sync::atomic::{AtomicBool, Ordering};
use std::sync::{Arc, Mutex};
use std::time::{Duration, Instant};

use common::redis::RedisChild;
use common::tcp_switch::{TcpSwitch, authority, with_port};
use common::{Gateway, Mock, Opts, pg};
use futures::StreamExt;

/// The workspace's concurrency limit (the clients keep it full).
const LIMIT: u64 = 6;
/// The response budget of the scenarios: a stream frozen mid-way ends with an error frame then.
const RESPONSE_SECONDS: u64 = 20;
/// A request still unanswered this long after it started has hung.
const HUNG_AFTER: Duration = Duration::from_secs(RESPONSE_SECONDS + 15);

/// How hard and how long: the short form in the test command, the long one on demand.
#[derive(Clone, Copy)]
struct Size {
    clients: usize,
    /// Load before the fault, and after it.
    before: Duration,
    after: Duration,
    /// How long a store stays down.
    outage: Duration,
}

fn size() -> Size {
    if std::env::var_os("CHAOS_LONG").is_some() {
        Size {
            clients: 48,
            before: Duration::from_secs(10),
            after: Duration::from_secs(60),
            outage: Duration::from_secs(10),
        }
    } else {
        Size {
            clients: 12,
            before: Duration::from_secs(2),
            after: Duration::from_secs(8),
            outage: Duration::from_secs(3),
        }
    }
}

/// The stores every scenario shares, and the gateways on them.
struct Fleet {
    gateways: Vec<Gateway>,
    /// Which gateways clients may use (a killed one is left).
    alive: Arc<Vec<AtomicBool>>,
    pg_switch: TcpSwitch,
    db_url: String,
    redis: RedisChild,
    key: String,
    workspace: String,
}

async fn fleet(mocks: &[&Mock], pool_extra: &str) -> Fleet {
    let db_url = pg::fresh_database().await;
    let pg_switch = TcpSwitch::start(&authority(&db_url));
    let redis = RedisChild::start(RedisChild::free_port()).await;
    let limits = format!(
        "  store: {{ backend: redis, url: \"{}\", prefix: chaos, timeout_ms: 300 }}\n  lease_ttl_seconds: 3\n  workspace_concurrency: {{ free: {LIMIT}, core: {LIMIT}, enterprise: {LIMIT} }}\n",
        redis.url()
    );
    let opts = Opts {
        postgres_url: Some(with_port(&db_url, pg_switch.port)),
        limits: Some(limits),
        chat_replicas: mocks.iter().map(|m| m.addr()).collect(),
        chat_pool_extra: format!("    first_byte_timeout_ms: 2000\n{pool_extra}"),
        response_seconds: RESPONSE_SECONDS as f64,
        first_token_seconds: 10.0,
        hold_margin_seconds: 1,
        ..Opts::default()
    };
    let a = Gateway::start_with(mocks[0], opts.clone());
    let b = Gateway::start_with(mocks[0], opts);
    let (key, workspace) = (a.key.clone(), a.workspace.clone());
    let (s, v) = a.admin(
        "POST",
        &format!("/admin/v1/workspaces/{workspace}/credits"),
        Some(serde_json::json!({"amount_cents": 100_000, "source": "purchase"})),
    );
    assert_eq!(s, 201, "{v}");
    Fleet {
        gateways: vec![a, b],
        alive: Arc::new(vec![AtomicBool::new(true), AtomicBool::new(true)]),
        pg_switch,
        db_url,
        redis,
        key,
        workspace,
    }
}

/// What each request of a scenario came to.
#[derive(Default)]
struct Tally {
    outcomes: BTreeMap<String, usize>,
    hung: usize,
    /// The first request started after the fault that completed, and when it did.
    recovered_at: Option<Instant>,
}

/// Streaming clients: each sends streamed chat requests one after another, to the live
/// gateways in turn, until `stop`. A client with `leaves` set reads a few frames and then drops
/// the connection.
fn clients(
    f: &Fleet,
    n: usize,
    leaves: usize,
    stop: Arc<AtomicBool>,
    fault_at: Arc<Mutex<Option<Instant>>>,
) -> (Arc<Mutex<Tally>>, Vec<tokio::task::JoinHandle<()>>) {
    let tally = Arc::new(Mutex::new(Tally::default()));
    let urls: Vec<String> = f.gateways.iter().map(|g| g.url("/v1/chat/completions")).collect();
    let tasks = (0..n)
        .map(|c| {
            let (urls, alive, stop, tally, fault_at) =
                (urls.clone(), f.alive.clone(), stop.clone(), tally.clone(), fault_at.clone());
            let auth = format!("Bearer {}", f.key);
            let leaving = c < leaves;
            tokio::spawn(async move {
                let client = reqwest::Client::new();
                let mut i = c;
                while !stop.load(Ordering::SeqCst) {
                    i += 1;
                    let Some(g) =
                        (0..urls.len()).map(|k| (i + k) % urls.len()).find(|&g| alive[g].load(Ordering::SeqCst))
                    else {
                        return;
                    };
                    let started = Instant::now();
                    let body = serde_json::json!({
                        "model": "chat-model",
                        "stream": true,
                        "messages": [{"role": "user", "content": format!("client {c} request {i}")}],
                    });
                    let call = client
                        .post(&urls[g])
                        .header("authorization", &auth)
                        .header("x-mock-tokens", "24")
                        .header("x-mock-token-delay-ms", "40")
                        .json(&body)
                        .send();
                    let outcome = match tokio::time::timeout(HUNG_AFTER, read_stream(call, leaving)).await {
                        Ok(o) => o,
                        Err(_) => "hung".to_string(),
                    };
                    let refused = outcome != "200 done" && outcome != "left";
                    let after_fault = fault_at.lock().unwrap().is_some_and(|at| started > at);
                    {
                        let mut t = tally.lock().unwrap();
                        if outcome == "hung" {
                            t.hung += 1;
                        }
                        if outcome == "200 done" && after_fault && t.recovered_at.is_none() {
                            t.recovered_at = Some(Instant::now());
                        }
                        *t.outcomes.entry(outcome).or_default() += 1;
                    }
                    if refused {
                        tokio::time::sleep(Duration::from_millis(100)).await; // back off a little, as clients do
                    }
                }
            })
        })
        .collect();
    (tally, tasks)
}

/// Read one streamed answer: `200 done`, `200 <code>` for an error frame, `<status> <code>`,
/// `left` (the client dropped it on purpose) or `transport` (the connection failed).
async fn read_stream(
    call: impl std::future::Future<Output = reqwest::Result<reqwest::Response>>,
    leaving: bool,
) -> String {
    let r = match call.await {
        Ok(r) => r,
        Err(_) => return "transport".into(),
    };
    let status = r.status().as_u16();
    if status != 200 {
        let v: serde_json::Value = r.json().await.unwrap_or_default();
        return format!("{status} {}", v["error"]["code"].as_str().unwrap_or("-"));
    }
    let mut body = r.bytes_stream();
    let mut text = Vec::new();
    let mut frames = 0;
    while let Some(chunk) = body.next().await {
        let Ok(chunk) = chunk else { return "transport".into() };
        text.extend_from_slice(&chunk);
        frames += chunk.windows(2).filter(|w| w == b"\n\n").count();
        if leaving && frames >= 3 {
            return "left".into();
        }
    }
    let text = String::from_utf8_lossy(&text);
    if text.contains("data: [DONE]") {
        return "200 done".into();
    }
    match text.split("\"code\":\"").nth(1).and_then(|rest| rest.split('"').next()) {
        Some(code) => format!("200 {code}"),
        None => "200 incomplete".into(),
    }
}

/// The ledger audit of the workspace, once every hold has closed (settlements retried, holds
/// of dead requests expired and swept): balance = entries, no open hold, one settlement per
/// request, no settlement without its hold, no settled hold without its settlement.
async fn audit(f: &Fleet) -> Result<String, String> {
    let (client, conn) = tokio_postgres::connect(&f.db_url, tokio_postgres::NoTls).await.unwrap();
    tokio::spawn(conn);
    let ws = &f.workspace;
    let count = |sql: String| {
        let client = &client;
        async move { client.query_one(&sql, &[]).await.unwrap().get::<_, i64>(0) }
    };
    let deadline = Instant::now() + Duration::from_secs(RESPONSE_SECONDS + 40);
    loop {
        let open = count(format!("SELECT count(*) FROM holds WHERE workspace_id = '{ws}' AND state = 'open'")).await;
        if open == 0 {
            break;
        }
        if Instant::now() > deadline {
            return Err(format!("{open} holds still open"));
        }
        tokio::time::sleep(Duration::from_millis(500)).await;
    }
    let unmatched = count(format!(
        "SELECT count(*) FROM ledger_entries s WHERE s.workspace_id = '{ws}' AND s.kind = 'settlement' \
         AND NOT EXISTS (SELECT 1 FROM holds h WHERE h.request_id = s.request_id)"
    ))
    .await;
    let unbooked = count(format!(
        "SELECT count(*) FROM holds h WHERE h.workspace_id = '{ws}' AND h.state = 'settled' \
         AND NOT EXISTS (SELECT 1 FROM ledger_entries s WHERE s.request_id = h.request_id AND s.kind = 'settlement')"
    ))
    .await;
    let twice = count(format!(
        "SELECT count(*) FROM (SELECT request_id FROM ledger_entries WHERE workspace_id = '{ws}' \
         AND kind = 'settlement' GROUP BY request_id HAVING count(*) > 1) d"
    ))
    .await;
    let settled =
        count(format!("SELECT count(*) FROM ledger_entries WHERE workspace_id = '{ws}' AND kind = 'settlement'")).await;
    let live = f.gateways.iter().zip(f.alive.iter()).find(|(_, a)| a.load(Ordering::SeqCst)).map(|(g, _)| g).unwrap();
    let (s, v) = live.admin("GET", &format!("/admin/v1/workspaces/{ws}/ledger"), None);
    let consistent = s == 200 && v["check"]["consistent"] == true;
    let line = format!(
        "settlements={settled} settlements_without_hold={unmatched} settled_holds_without_entry={unbooked} settled_twice={twice} balance_equals_entries={consistent}"
    );
    if unmatched == 0 && unbooked == 0 && twice == 0 && consistent { Ok(line) } else { Err(line) }
}

/// The limits after the scenario: every slot is free again (none leaked) and the limit still
/// holds: of `LIMIT + 2` requests at once, exactly `LIMIT` are admitted.
async fn limits_after(f: &Fleet) -> Result<String, String> {
    let live = f.gateways.iter().zip(f.alive.iter()).find(|(_, a)| a.load(Ordering::SeqCst)).map(|(g, _)| g).unwrap();
    let url = live.url("/v1/chat/completions");
    let deadline = Instant::now() + Duration::from_secs(15);
    loop {
        let calls = (0..LIMIT + 2).map(|_| {
            reqwest::Client::new()
                .post(&url)
                .header("authorization", format!("Bearer {}", f.key))
                .header("x-mock-ttft-ms", "1500")
                .json(&common::chat_body("chat-model", false))
                .send()
        });
        let statuses: Vec<u16> =
            futures::future::join_all(calls).await.into_iter().map(|r| r.map_or(0, |r| r.status().as_u16())).collect();
        let ok = statuses.iter().filter(|&&s| s == 200).count() as u64;
        let refused = statuses.iter().filter(|&&s| s == 429).count() as u64;
        if ok == LIMIT && refused == 2 {
            return Ok(format!("admitted={ok}/{}", LIMIT + 2));
        }
        if Instant::now() > deadline {
            return Err(format!("of {} at once: {statuses:?}", LIMIT + 2));
        }
        tokio::time::sleep(Duration::from_millis(500)).await;
    }
}

#[path = "chaos/scenarios.rs"]
mod scenarios;
