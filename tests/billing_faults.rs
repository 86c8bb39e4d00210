//! PostgreSQL stopped in the middle of billed traffic (issue: credits ledger, "Faults"): the
//! database is cut by a TCP switch between the gateway and the machine's PostgreSQL. A request
//! that needs a hold while it is down gets a catalogued error fast and is charged nothing; a
//! request whose settlement failed is settled exactly once when the database returns; the
//! ledger stays consistent (stored balance == sum of entries) throughout.
#![allow(clippy::unwrap_used, clippy::expect_used, clippy::panic)]

mod common;

use std::time::{Duration, Instant};

use common::tcp_switch::{TcpSwitch, authority, with_port};
use common::{Gateway, Mock, Opts, chat_body, pg};
use serde_json::{Value, json};

fn ledger(gw: &Gateway) -> Value {
    let (s, v) = gw.admin("GET", &format!("/admin/v1/workspaces/{}/ledger", gw.workspace), None);
    assert_eq!(s, 200, "{v}");
    assert_eq!(v["check"]["consistent"], true, "stored balance == sum of entries: {v}");
    v
}

/// Another session that holds `ws`'s row lock (in an open transaction) until it commits:
/// the next ledger batch of that workspace waits on it.
async fn lock_workspace_row(db: &str, ws: &str) -> tokio_postgres::Client {
    let (locker, conn) = tokio_postgres::connect(db, tokio_postgres::NoTls).await.unwrap();
    tokio::spawn(conn);
    locker.batch_execute("BEGIN").await.unwrap();
    locker.query("SELECT 1 FROM workspaces WHERE id = $1 FOR UPDATE", &[&ws]).await.unwrap();
    locker
}

fn settlements(l: &Value) -> Vec<i64> {
    l["entries"]
        .as_array()
        .unwrap()
        .iter()
        .filter(|e| e["kind"] == "settlement")
        .map(|e| e["cost_microcents"].as_i64().unwrap())
        .collect()
}

#[tokio::test]
async fn postgres_stopped_mid_traffic_charges_nothing_twice_and_settles_when_it_returns() {
    let mock = Mock::start();
    let db = pg::fresh_database().await;
    let switch = TcpSwitch::start(&authority(&db));
    let gw = Gateway::start_with(&mock, Opts { postgres_url: Some(with_port(&db, switch.port)), ..Opts::default() });
    let (s, v) = gw.admin(
        "POST",
        &format!("/admin/v1/workspaces/{}/credits", gw.workspace),
        Some(json!({"amount_cents": 500, "source": "purchase"})),
    );
    assert_eq!(s, 201, "{v}");
    // pricey-model: output at a cent a token; three tokens cost 3 cents, the hold is 10.
    let mut body = chat_body("pricey-model", false);
    body["max_tokens"] = json!(10);
    let r = gw.post("/v1/chat/completions", &body, &[("x-mock-tokens", "3")]).await;
    assert_eq!(r.status, 200, "{}", r.text);

    // A request generating while the database goes away: the client still gets its answer.
    let (slow, ()) = tokio::join!(
        gw.post("/v1/chat/completions", &body, &[("x-mock-tokens", "3"), ("x-mock-ttft-ms", "800")]),
        async {
            tokio::time::sleep(Duration::from_millis(300)).await;
            switch.off();
        }
    );
    assert_eq!(slow.status, 200, "{}", slow.text);
    assert_eq!(slow.json()["usage"]["service"]["cost_microcents"], 3_000_000);

    // While it is down, a request that needs a hold is refused fast, with a catalogued error.
    let started = Instant::now();
    let r = gw.post("/v1/chat/completions", &body, &[("x-mock-tokens", "3")]).await;
    assert!(started.elapsed() < Duration::from_secs(7), "bounded by the store's call timeout");
    let code = r.json()["error"]["code"].as_str().unwrap_or_default().to_string();
    assert!(
        (r.status == 500 && code == "credit_reservation_failed")
            || (r.status == 503 && code == "datastore_unavailable"),
        "{} {}",
        r.status,
        r.text
    );
    assert!(r.header("retry-after").is_some(), "retryable");
    // The plan snapshot is read from the ledger on every call: unavailable while it is down.
    let r = gw.get("/v1/usage").await;
    r.assert_error(503, "datastore_unavailable");
    let ra: u64 = r.header("retry-after").unwrap().parse().unwrap();
    assert!((1..=4).contains(&ra));

    switch.on();
    // The failed settlement is retried in the background (1 s, then doubling).
    let deadline = Instant::now() + Duration::from_secs(20);
    let l = loop {
        let (s, l) = gw.admin("GET", &format!("/admin/v1/workspaces/{}/ledger", gw.workspace), None);
        if s == 200 && settlements(&l).len() == 2 && l["held_cents"] == 0 {
            break ledger(&gw);
        }
        assert!(Instant::now() < deadline, "the settlement was not retried: {l}\n{}", gw.log());
        tokio::time::sleep(Duration::from_millis(500)).await;
    };
    assert_eq!(settlements(&l), vec![3_000_000, 3_000_000], "each billed request settled exactly once: {l}");
    // $5 purchase + $1 grant - 6 cents; the refused request charged nothing.
    assert_eq!(l["balance_cents"], 594, "{l}");
    tokio::time::sleep(Duration::from_secs(3)).await;
    assert_eq!(settlements(&ledger(&gw)).len(), 2, "a later retry does not settle twice");
    assert_eq!(gw.post("/v1/chat/completions", &body, &[("x-mock-tokens", "3")]).await.status, 200, "back to normal");
}

/// Decision 131: while the ledger's writes wait longer than `billing.ledger_max_wait_ms`, a
/// new request is refused at once with `429 hosted_admission_congested` instead of queueing
/// behind them; the request already waiting is served and billed once, the refused one is
/// charged nothing, and requests are admitted again once the writes flow.
#[tokio::test]
async fn a_stalled_ledger_sheds_new_requests_at_once_and_bills_the_admitted_ones() {
    let mock = Mock::start();
    let db = pg::fresh_database().await;
    let gw =
        Gateway::start_with(&mock, Opts { postgres_url: Some(db.clone()), ledger_max_wait_ms: 100, ..Opts::default() });
    let body = chat_body("chat-model", false);
    assert_eq!(gw.post("/v1/chat/completions", &body, &[]).await.status, 200);
    let before = gw.settled_ledger();

    let locker = lock_workspace_row(&db, &gw.workspace).await;

    let (stalled, shed) = tokio::join!(gw.post("/v1/chat/completions", &body, &[]), async {
        // The first request's hold has waited past the bound by now.
        tokio::time::sleep(Duration::from_millis(400)).await;
        let started = Instant::now();
        let r = gw.post("/v1/chat/completions", &body, &[]).await;
        let took = started.elapsed();
        locker.batch_execute("COMMIT").await.unwrap();
        (r, took)
    });
    let (shed, took) = shed;
    let err = shed.assert_error(429, "hosted_admission_congested");
    assert!(took < Duration::from_millis(300), "refused without queueing: {took:?}");
    assert_eq!(shed.header("retry-after").as_deref(), Some("1"));
    assert!(err["error"].get("limit").is_none(), "not a quota: {err}");
    assert!(shed.header("x-hosted-limit-scope").is_none());
    assert_eq!(stalled.status, 200, "the request already waiting is served: {}", stalled.text);

    // The writes flow again: requests are admitted.
    assert_eq!(gw.post("/v1/chat/completions", &body, &[]).await.status, 200);
    let after = gw.settled_ledger();
    assert_eq!(
        settlements(&after).len(),
        settlements(&before).len() + 2,
        "the two served requests settled once each, the shed one not at all: {after}"
    );
    let m = gw.metrics().await;
    assert!(m.contains("tollgate_admission_refusals_total{gate=\"ledger\"} 1"), "{m}");
}

/// A ledger batch that outlives the store call's timeout (5 s) while waiting for a workspace
/// row lock is abandoned: its connection must not go back to the pool with the transaction
/// still open, or it would take the lock once freed and hold it for whoever uses that
/// connection next. The request gets a catalogued error, nothing is left "idle in
/// transaction", and the next request is served and billed.
#[tokio::test]
async fn a_batch_abandoned_at_the_timeout_leaves_no_transaction_open() {
    let mock = Mock::start();
    let db = pg::fresh_database().await;
    let gw = Gateway::start_with(&mock, Opts { postgres_url: Some(db.clone()), ..Opts::default() });
    let body = chat_body("chat-model", false);
    assert_eq!(gw.post("/v1/chat/completions", &body, &[]).await.status, 200);
    let before = gw.settled_ledger();

    let locker = lock_workspace_row(&db, &gw.workspace).await;
    let r = gw.post("/v1/chat/completions", &body, &[]).await;
    r.assert_error(500, "credit_reservation_failed");
    locker.batch_execute("COMMIT").await.unwrap();

    // The abandoned batch's LOCK is granted once the lock is free; its session must then end
    // (its connection was closed), not sit in an open transaction holding the lock.
    let deadline = Instant::now() + Duration::from_secs(5);
    loop {
        let open: i64 = locker
            .query_one(
                "SELECT count(*) FROM pg_stat_activity WHERE datname = current_database() \
                 AND state LIKE 'idle in transaction%' AND pid <> pg_backend_pid()",
                &[],
            )
            .await
            .unwrap()
            .get(0);
        if open == 0 {
            break;
        }
        assert!(Instant::now() < deadline, "{open} gateway sessions left in an open transaction");
        tokio::time::sleep(Duration::from_millis(100)).await;
    }
    let started = Instant::now();
    assert_eq!(gw.post("/v1/chat/completions", &body, &[]).await.status, 200);
    assert!(started.elapsed() < Duration::from_secs(2), "the ledger is not stuck behind a lock");
    let after = gw.settled_ledger();
    assert_eq!(settlements(&after).len(), settlements(&before).len() + 1, "{after}");
    assert_eq!(after["held_cents"], 0, "no hold left open: {after}");
}
