//! A graceful stop (SIGTERM): streams in flight finish, settlements are recorded, no lease stays held.

use super::*;

/// A chat stream of `tokens` tokens, one every `delay_ms`, started and seen by the replica;
/// the task answers (status, request id, body).
async fn stream_reaching_the_replica(
    gw: &Gateway,
    mock: &Mock,
    tokens: u32,
    delay_ms: u32,
) -> tokio::task::JoinHandle<(u16, String, String)> {
    let sent = reqwest::Client::new()
        .post(gw.url("/v1/chat/completions"))
        .bearer_auth(&gw.key)
        .header("x-mock-tokens", tokens.to_string())
        .header("x-mock-token-delay-ms", delay_ms.to_string())
        .json(&chat_body("chat-model", true))
        .send();
    let stream = tokio::spawn(async move {
        let r = sent.await.unwrap();
        let rid = r.headers()["x-request-id"].to_str().unwrap().to_string();
        (r.status().as_u16(), rid, r.text().await.unwrap())
    });
    let deadline = Instant::now() + Duration::from_secs(5);
    while requests_of(mock).await == 0 {
        assert!(Instant::now() < deadline, "the stream reached the replica");
        tokio::time::sleep(Duration::from_millis(20)).await;
    }
    stream
}

/// A graceful stop (SIGTERM) lets the stream in flight finish and settle, then ends the
/// process within a quiet second instead of sleeping out the grace period (decision 166).
#[tokio::test(flavor = "multi_thread")]
async fn a_graceful_stop_finishes_the_stream_in_flight_then_exits_without_waiting_out_the_grace() {
    let mock = Mock::start();
    let grace = Duration::from_secs(60);
    let mut gw = Gateway::start_with(&mock, Opts { grace_seconds: grace.as_secs(), ..Opts::default() });
    let stream = stream_reaching_the_replica(&gw, &mock, 40, 60).await;
    let signalled = Instant::now();
    assert_eq!(unsafe { libc::kill(gw.pid() as i32, libc::SIGTERM) }, 0);

    // The stream (about 2.4 s, longer than the quiet second) runs to its end.
    let (status, rid, text) = stream.await.unwrap();
    assert_eq!(status, 200, "{text}");
    assert!(text.contains("data: [DONE]"), "the stream ended whole: {text}");
    let streamed = signalled.elapsed();
    assert!(streamed >= Duration::from_millis(1500), "the stream outlived the quiet second: {streamed:?}");

    let dir = gw.dir.clone();
    let (exit, gw) = tokio::task::spawn_blocking(move || (gw.wait_exit(Duration::from_secs(20)), gw)).await.unwrap();
    let stopped = signalled.elapsed();
    assert!(exit.is_some_and(|s| s.success()), "the process ended cleanly: {exit:?} {}", gw.log());
    assert!(stopped < grace / 2, "ended well before the {grace:?} grace period: {stopped:?}");
    assert!(gw.log().contains("graceful stop: nothing left in flight"), "{}", gw.log());

    // The stream's settlement reached the ledger before the process ended.
    assert_settled_on_its_store(&mock, Opts::default(), dir, &gw.workspace, &rid);
}

/// Request `rid` of `workspace` is settled and no hold is left, as a new gateway on the
/// stopped one's store (`dir`, `opts`) reads its ledger.
fn assert_settled_on_its_store(mock: &Mock, opts: Opts, dir: std::path::PathBuf, workspace: &str, rid: &str) {
    let mut after = Gateway::start_in(mock, opts, dir);
    after.workspace = workspace.to_string();
    let ledger = after.settled_ledger();
    assert_eq!(ledger["held_cents"], 0, "no hold left: {ledger}");
    let settled =
        ledger["entries"].as_array().unwrap().iter().any(|e| e["kind"] == "settlement" && e["request_id"] == rid);
    assert!(settled, "request {rid} settled before the process ended: {ledger}");
}

/// A graceful stop also waits for work a request left behind: here its settlement, held up by
/// a lock on the workspace's row, keeps the process up until it is recorded (decision 166).
#[tokio::test(flavor = "multi_thread")]
async fn a_graceful_stop_waits_for_a_settlement_the_ledger_has_not_recorded_yet() {
    let mock = Mock::start();
    let db = common::pg::fresh_database().await;
    let opts = Opts { postgres_url: Some(db.clone()), grace_seconds: 60, ..Opts::default() };
    let mut gw = Gateway::start_with(&mock, opts.clone());
    let stream = stream_reaching_the_replica(&gw, &mock, 10, 80).await; // its hold is placed
    // The ledger's batch locks the workspace's row: while the test holds it, the settlement waits.
    let (client, conn) = tokio_postgres::connect(&db, tokio_postgres::NoTls).await.unwrap();
    tokio::spawn(conn);
    client.batch_execute("BEGIN").await.unwrap();
    client.query("SELECT id FROM workspaces WHERE id = $1 FOR UPDATE", &[&gw.workspace]).await.unwrap();
    let (status, rid, text) = stream.await.unwrap();
    assert!(status == 200 && text.contains("data: [DONE]"), "{status} {text}");

    assert_eq!(unsafe { libc::kill(gw.pid() as i32, libc::SIGTERM) }, 0);
    tokio::time::sleep(Duration::from_millis(2500)).await;
    assert!(gw.exited().is_none(), "still up while its settlement waits: {}", gw.log());
    client.batch_execute("COMMIT").await.unwrap();
    let (exit, gw) = tokio::task::spawn_blocking(move || (gw.wait_exit(Duration::from_secs(20)), gw)).await.unwrap();
    assert!(exit.is_some_and(|s| s.success()), "ended once it was recorded: {exit:?} {}", gw.log());

    assert_settled_on_its_store(&mock, opts, gw.dir.clone(), &gw.workspace, &rid);
}

/// A graceful stop gives back the instance's unused lease (decision 187): the store it
/// leaves holds nothing, so the next process (or another instance) can spend all of it.
#[tokio::test(flavor = "multi_thread")]
async fn a_graceful_stop_leaves_no_lease_held() {
    let mock = Mock::start();
    let mut gw = Gateway::start_with(&mock, Opts { grace_seconds: 60, ..Opts::default() });
    let credits = format!("/admin/v1/workspaces/{}/credits", gw.workspace);
    let (s, v) = gw.admin("POST", &credits, Some(json!({"amount_cents": 100_000, "source": "purchase"})));
    assert_eq!(s, 201, "{v}");
    // pricey-model: a cent per output token, so each request holds 20 cents; the first one
    // asks for a lease.
    let mut body = chat_body("pricey-model", false);
    body["max_tokens"] = json!(20);
    let ledger = format!("/admin/v1/workspaces/{}/ledger", gw.workspace);
    let mut leased = 0;
    for _ in 0..20 {
        assert_eq!(gw.post("/v1/chat/completions", &body, &[("x-mock-tokens", "5")]).await.status, 200);
        leased = gw.admin("GET", &ledger, None).1["leased_cents"].as_i64().unwrap();
        if leased > 0 {
            break;
        }
        tokio::time::sleep(Duration::from_millis(20)).await;
    }
    assert!(leased > 0, "a lease was granted");
    assert_eq!(unsafe { libc::kill(gw.pid() as i32, libc::SIGTERM) }, 0);
    let (exit, gw) = tokio::task::spawn_blocking(move || (gw.wait_exit(Duration::from_secs(20)), gw)).await.unwrap();
    assert!(exit.is_some_and(|s| s.success()), "{exit:?} {}", gw.log());

    let mut after = Gateway::start_in(&mock, Opts::default(), gw.dir.clone());
    after.workspace = gw.workspace.clone();
    let v = after.settled_ledger();
    let stopped = gw.log();
    assert_eq!((v["held_cents"].as_i64(), v["leased_cents"].as_i64()), (Some(0), Some(0)), "{v}\n{stopped}");
    assert_eq!(v["check"]["stored_balance_cents"], v["balance_cents"], "nothing held in the store: {v}");
}
