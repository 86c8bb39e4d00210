//! Billing through the running gateway: the signup grant, `GET /v1/credits`, the 402s with
//! their fields, holds released on every failure before output, settlement equal to the
//! usage the client saw, cut-short streams, and 200 concurrent requests against a small
//! balance on both backends (the other store rules run on both in ledger_store.rs).
#![allow(clippy::unwrap_used, clippy::expect_used, clippy::panic)]

mod common;

use common::*;
use serde_json::{Value, json};

fn balance(gw: &Gateway, ws: &str) -> Value {
    let (s, v) = gw.admin("GET", &format!("/admin/v1/workspaces/{ws}/ledger"), None);
    assert_eq!(s, 200, "{v}");
    assert_eq!(v["check"]["consistent"], true, "stored balance == sum of entries: {v}");
    v
}

fn top_up(gw: &Gateway, ws: &str, cents: i64) {
    let (s, v) = gw.admin(
        "POST",
        &format!("/admin/v1/workspaces/{ws}/credits"),
        Some(json!({"amount_cents": cents, "source": "purchase"})),
    );
    assert_eq!(s, 201, "{v}");
}

/// The costs of the ledger's settlement entries, in entry order.
fn settled_costs(l: &Value) -> Vec<i64> {
    let entries = l["entries"].as_array().map(Vec::as_slice).unwrap_or_default();
    entries.iter().filter(|e| e["kind"] == "settlement").filter_map(|e| e["cost_microcents"].as_i64()).collect()
}

#[tokio::test]
async fn credits_object_and_signup_grant() {
    let mock = Mock::start();
    let gw = Gateway::start(&mock);
    let r = gw.get("/v1/credits").await;
    assert_eq!(r.status, 200, "{}", r.text);
    assert_eq!(r.header("cache-control").as_deref(), Some("no-store"));
    let v = r.json();
    assert_eq!(v["object"], "credits");
    assert_eq!(v["workspace_id"], gw.workspace.as_str());
    assert_eq!(v["balance_cents"], 100, "the $1 signup grant");
    assert_eq!(v["held_cents"], 0);
    assert_eq!(v["available_cents"], 100);
    assert_eq!(v["currency"], "usd");
    assert!(v["period"]["start"].as_str().unwrap().ends_with("-01T00:00:00Z"));
    assert_eq!(v["period"]["spent_cents"], 0);
    assert_eq!(
        v["spend_cap"],
        json!({"limit_cents": null, "hard": false, "used_cents": null, "remaining_cents": null, "gates_inference": false})
    );
    assert_eq!(v["plan_tier"], "free");
    assert!(v["as_of"].is_string());
    assert!(v.get("coding_plan").is_none());
    let r = gw.post("/v1/credits", &json!({}), &[]).await;
    r.assert_error(405, "method_not_allowed");
    assert_eq!(r.header("allow").as_deref(), Some("GET"));
}

#[tokio::test]
async fn insufficient_credits_402_has_its_fields_and_reaches_no_replica() {
    let mock = Mock::start();
    let gw = Gateway::start(&mock);
    // 4096 output tokens at $10,000 per Mtok: a $40.96 hold against a $1 balance.
    let r = gw.post("/v1/chat/completions", &chat_body("pricey-model", false), &[]).await;
    let v = r.assert_error(402, "insufficient_credits");
    assert_eq!(v["error"]["type"], "permission_error");
    assert_eq!(v["error"]["required_cents"], 4096);
    assert_eq!(v["error"]["current_balance_cents"], 100);
    assert_eq!(v["error"]["topup_url"], "https://pay.example.com/top-up");
    assert!(v["error"].get("free_window_ended_at").is_none());
    assert!(r.header("retry-after").is_none());
    assert_eq!(mock.stats().await["requests"], 0);
    // A smaller ceiling fits: the hold follows max_tokens.
    let mut b = chat_body("pricey-model", false);
    b["max_tokens"] = json!(50);
    let r = gw.post("/v1/chat/completions", &b, &[("x-mock-tokens", "5")]).await;
    assert_eq!(r.status, 200, "{}", r.text);
    let u = &r.json()["usage"];
    assert_eq!(u["service"]["cost_microcents"], 5_000_000, "5 tokens at a cent each");
    // The settlement commits just after the answer (decision 128).
    let l = gw.settled_ledger();
    assert_eq!(l["balance_cents"], 95);
    assert_eq!(l["held_cents"], 0);
}

#[tokio::test]
async fn every_failure_before_output_releases_the_hold() {
    let mock = Mock::start();
    let gw = Gateway::start(&mock);
    let mut b = chat_body("pricey-model", false);
    b["max_tokens"] = json!(10);
    for headers in [vec![("x-mock-status", "500")], vec![("x-mock-status", "400")], vec![("x-mock-abort-after", "0")]] {
        let r = gw.post("/v1/chat/completions", &b, &headers).await;
        assert_ne!(r.status, 200, "{headers:?}");
    }
    let r = gw.post("/v1/chat/completions", &chat_body("dead-model", false), &[]).await;
    assert_eq!(r.status, 503);
    // Settlement runs in the log phase, just after the answer went out.
    tokio::time::sleep(std::time::Duration::from_millis(300)).await;
    // A refusal after the hold would have been placed (client error from the replica) and
    // the paused model: nothing charged, nothing held.
    let l = balance(&gw, &gw.workspace);
    assert_eq!((l["balance_cents"].as_i64(), l["held_cents"].as_i64()), (Some(100), Some(0)), "{l}");
    let kinds: Vec<&str> = l["entries"].as_array().unwrap().iter().map(|e| e["kind"].as_str().unwrap()).collect();
    assert!(!kinds.contains(&"settlement"), "{kinds:?}");
}

#[tokio::test]
async fn frozen_workspaces_and_key_spending_limits() {
    let mock = Mock::start();
    let gw = Gateway::start(&mock);
    let ws = gw.workspace.clone();
    let (s, _) = gw.admin("POST", &format!("/admin/v1/workspaces/{ws}/freeze"), Some(json!({"reason": "dispute"})));
    assert_eq!(s, 200);
    tokio::time::sleep(std::time::Duration::from_millis(600)).await; // key cache freshness
    let r = gw.post("/v1/chat/completions", &chat_body("chat-model", false), &[]).await;
    let v = r.assert_error(402, "account_frozen");
    assert!(v["error"]["message"].as_str().unwrap().contains("dispute"));
    top_up(&gw, &ws, 1000);
    tokio::time::sleep(std::time::Duration::from_millis(600)).await;
    gw.post("/v1/chat/completions", &chat_body("chat-model", false), &[]).await.assert_error(402, "account_frozen");
    gw.admin("POST", &format!("/admin/v1/workspaces/{ws}/unfreeze"), None);
    tokio::time::sleep(std::time::Duration::from_millis(600)).await;
    assert_eq!(gw.post("/v1/chat/completions", &chat_body("chat-model", false), &[]).await.status, 200);

    // A key limited to $1.00 a month: 20 tokens of pricey-model cost 20 cents a request.
    let limited = gw.mint_key(&ws, json!({"monthly_spend_limit_cents": 100}));
    let bearer = format!("Bearer {}", limited["key"].as_str().unwrap());
    let mut b = chat_body("pricey-model", false);
    b["max_tokens"] = json!(20);
    let mut ok = 0;
    let refusal = loop {
        let r = gw.post_as("/v1/chat/completions", &b, &[("authorization", &bearer), ("x-mock-tokens", "20")]).await;
        if r.status != 200 {
            break r;
        }
        ok += 1;
        assert!(ok <= 5, "the limit must stop the key");
        // Settlement lands in the log phase, after the answer: let it land.
        tokio::time::sleep(std::time::Duration::from_millis(100)).await;
    };
    assert_eq!(ok, 5);
    let v = refusal.assert_error(402, "spend_limit_reached");
    assert_eq!(v["error"]["limit_cents"], 100);
    assert_eq!(v["error"]["spent_cents"], 100);
    assert!(v["error"]["resets_at"].as_str().unwrap().ends_with("-01T00:00:00Z"));
    // Other keys and the balance are unaffected.
    assert_eq!(gw.post("/v1/chat/completions", &b, &[("x-mock-tokens", "20")]).await.status, 200);
}

#[tokio::test]
async fn cut_short_streams_bill_what_was_delivered_and_settle_once() {
    let mock = Mock::start();
    let gw = Gateway::start(&mock);
    top_up(&gw, &gw.workspace, 500);
    // stream-model: input free, output $1 per Mtok = 100 microcents a token.
    let r = gw.post("/v1/chat/completions", &chat_body("stream-model", true), &[("x-mock-abort-after", "3")]).await;
    assert_eq!(r.status, 200);
    assert!(!r.text.contains("[DONE]"));
    assert!(!r.text.contains("cost"), "an errored stream never quotes a cost");
    let r2 = gw.post("/v1/chat/completions", &chat_body("stream-model", false), &[("x-mock-tokens", "7")]).await;
    assert_eq!(r2.json()["usage"]["service"]["cost_microcents"], 700);
    tokio::time::sleep(std::time::Duration::from_millis(300)).await;
    let l = balance(&gw, &gw.workspace);
    let settlements = settled_costs(&l);
    assert_eq!(settlements.len(), 2, "{l}");
    assert!(settlements.contains(&300), "three delivered tokens billed: {settlements:?}");
    assert!(settlements.contains(&700), "the ledger equals the usage the client saw");
    assert_eq!(l["carry_microcents"], 1000, "0.1 cent carried, nothing debited yet");
    assert_eq!(l["balance_cents"], 600);
}

#[tokio::test]
async fn a_client_that_leaves_mid_stream_is_billed_for_what_reached_it_once() {
    let mock = Mock::start();
    let gw = Gateway::start(&mock);
    // pricey-model: a cent per output token; the hold is 40 cents for max_tokens 40.
    let mut b = chat_body("pricey-model", true);
    b["max_tokens"] = json!(40);
    let mut r = reqwest::Client::new()
        .post(gw.url("/v1/chat/completions"))
        .header("authorization", gw.bearer())
        .header("x-mock-tokens", "40")
        .header("x-mock-token-delay-ms", "100")
        .json(&b)
        .send()
        .await
        .unwrap();
    assert_eq!(r.status(), 200);
    let mut seen = String::new();
    while seen.matches("\"content\":\"tok").count() < 3 {
        let chunk = r.chunk().await.unwrap().expect("the stream ended before three tokens");
        seen.push_str(&String::from_utf8_lossy(&chunk));
    }
    drop(r); // the client hangs up with 37 tokens still to come
    let mut l = balance(&gw, &gw.workspace);
    for _ in 0..50 {
        if l["held_cents"] == 0 {
            break;
        }
        tokio::time::sleep(std::time::Duration::from_millis(100)).await;
        l = balance(&gw, &gw.workspace);
    }
    assert_eq!(l["held_cents"], 0, "the hold is closed when the client leaves: {l}");
    let settled = settled_costs(&l);
    assert_eq!(settled.len(), 1, "settled once: {l}");
    let cost = settled[0];
    // Billed for the frames written before the gateway saw the socket gone: at least the
    // three the client read, never the 40 the replica would have made.
    assert!((3_000_000..=10_000_000).contains(&cost), "3 to 10 delivered tokens at a cent: {cost}");
    assert_eq!(l["balance_cents"], 100 - cost / 1_000_000, "{l}");
    // A client leaving is an outcome, logged once as its access line, never as an ERROR.
    assert!(!gw.log().contains("Fail to proxy"), "{}", gw.log());
}

#[tokio::test]
async fn forwarded_routes_are_billed_from_the_replicas_usage_or_their_estimate() {
    let mock = Mock::start();
    let gw = Gateway::start(&mock);
    // Both models: input a cent a token, no output price (1,000,000 microcents a token).
    let embed = json!({"model": "priced-embed-model", "input": ["a", "b"]});
    let r = gw.post("/v1/embeddings", &embed, &[("x-mock-prompt-tokens", "7")]).await;
    assert_eq!(r.status, 200, "{}", r.text);
    // The replica reported no usage (the mock's rerank answer): the body's estimate, about
    // four bytes a token, is charged.
    let rerank = json!({"model": "priced-rerank-model", "query": "q", "documents": ["d1", "d2"]});
    let estimate = (serde_json::to_vec(&rerank).unwrap().len() as i64 + 3) / 4;
    let r = gw.post("/v1/rerank", &rerank, &[]).await;
    assert_eq!(r.status, 200, "{}", r.text);
    // A replica failure, an empty answer and an answer that declares JSON and is not: nothing
    // is charged (clarification 11); the empty one is a 502, never an empty 200.
    let r = gw.post("/v1/embeddings", &embed, &[("x-mock-status", "500")]).await;
    assert_ne!(r.status, 200);
    let r = gw.post("/v1/embeddings", &embed, &[("x-mock-raw-body", "")]).await;
    r.assert_error(502, "upstream_error");
    let r = gw.post("/v1/embeddings", &embed, &[("x-mock-malformed", "1")]).await;
    assert_eq!((r.status, r.text.as_str()), (200, "not json{"), "forwarded as the replica wrote it");
    let mut l = balance(&gw, &gw.workspace);
    for _ in 0..30 {
        if l["held_cents"] == 0 && settled_costs(&l).len() >= 2 {
            break;
        }
        tokio::time::sleep(std::time::Duration::from_millis(100)).await;
        l = balance(&gw, &gw.workspace);
    }
    let mut settled = settled_costs(&l);
    settled.sort_unstable();
    let mut expected = vec![7 * 1_000_000, estimate * 1_000_000];
    expected.sort_unstable();
    assert_eq!(settled, expected, "the reported 7 tokens and the estimate, the failure uncharged: {l}");
    assert_eq!(l["held_cents"], 0, "{l}");
    assert_eq!(l["balance_cents"], 100 - 7 - estimate, "{l}");
    // A workspace that cannot cover the estimate is refused before the replica.
    let before = mock.stats().await["requests"].as_i64().unwrap();
    let big = json!({"model": "priced-embed-model", "input": "x".repeat(4_000)});
    let r = gw.post("/v1/embeddings", &big, &[]).await;
    r.assert_error(402, "insufficient_credits");
    assert_eq!(mock.stats().await["requests"].as_i64().unwrap(), before, "refused before the replica");
}

#[tokio::test]
async fn a_panic_in_an_earlier_log_hook_does_not_skip_the_settlement() {
    let mock = Mock::start();
    // Every request panics in the idempotency plugin's log hook, which runs before billing's.
    let env = vec![("TOLLGATE_FAULT_PANIC", "log:idempotency".to_string())];
    let gw = Gateway::start_with(&mock, Opts { env, ..Opts::default() });
    let mut b = chat_body("pricey-model", false);
    b["max_tokens"] = json!(10);
    let r = gw.post("/v1/chat/completions", &b, &[("x-mock-tokens", "4")]).await;
    assert_eq!(r.status, 200, "{}", r.text);
    let mut l = balance(&gw, &gw.workspace);
    // Up to 10 s: the settlement lands within milliseconds, but this suite runs its gateways
    // (debug builds) side by side on two cores, and one run saw it take more than 3 s.
    for _ in 0..100 {
        if l["held_cents"] == 0 {
            break;
        }
        tokio::time::sleep(std::time::Duration::from_millis(100)).await;
        l = balance(&gw, &gw.workspace);
    }
    assert_eq!(settled_costs(&l), vec![4_000_000], "billing still settled: {l}");
    assert_eq!(l["held_cents"], 0, "{l}");
    assert!(gw.log().contains("panic in the idempotency plugin's log hook"), "{}", gw.log());
}

#[tokio::test]
async fn a_request_made_in_a_free_window_is_free_however_late_it_ends() {
    let written = std::time::Instant::now(); // the catalog's window closes 6 s after this
    let mock = Mock::start();
    let gw = Gateway::start(&mock);
    let ttft = CLOSING_FREE_WINDOW + std::time::Duration::from_secs(1);
    assert!(written.elapsed() < CLOSING_FREE_WINDOW / 2, "the gateway took too long to start for this test");
    let mut b = chat_body("closing-free-model", false);
    b["max_tokens"] = json!(10);
    let ttft_ms = ttft.as_millis().to_string();
    let r = gw.post("/v1/chat/completions", &b, &[("x-mock-tokens", "5"), ("x-mock-ttft-ms", &ttft_ms)]).await;
    assert_eq!(r.status, 200, "{}", r.text);
    assert!(written.elapsed() > CLOSING_FREE_WINDOW, "the answer ended after the window closed");
    assert_eq!(r.json()["usage"]["service"]["cost_microcents"], 0, "priced as when it was made: {}", r.text);
    tokio::time::sleep(std::time::Duration::from_millis(300)).await;
    let l = balance(&gw, &gw.workspace);
    assert_eq!((l["balance_cents"].as_i64(), l["held_cents"].as_i64()), (Some(100), Some(0)), "{l}");
    assert!(settled_costs(&l).is_empty(), "nothing charged: {l}");
}

#[tokio::test]
async fn a_client_that_resets_mid_stream_is_an_access_line_not_an_error() {
    use std::io::{Read, Write};
    use std::os::fd::AsRawFd;
    let mock = Mock::start();
    let gw = Gateway::start(&mock);
    let mut b = chat_body("pricey-model", true);
    b["max_tokens"] = json!(40);
    let body = serde_json::to_vec(&b).unwrap();
    let mut c = std::net::TcpStream::connect(("127.0.0.1", gw.port)).unwrap();
    let head = format!(
        "POST /v1/chat/completions HTTP/1.1\r\nHost: t\r\nAuthorization: {}\r\nx-mock-tokens: 40\r\nx-mock-token-delay-ms: 50\r\nContent-Type: application/json\r\nContent-Length: {}\r\n\r\n",
        gw.bearer(),
        body.len()
    );
    c.write_all(head.as_bytes()).unwrap();
    c.write_all(&body).unwrap();
    let mut buf = [0u8; 4096];
    assert!(c.read(&mut buf).unwrap() > 0, "the stream started");
    // Close with a reset (SO_LINGER 0), as a client killed mid-stream does.
    let linger = libc::linger { l_onoff: 1, l_linger: 0 };
    let size = std::mem::size_of::<libc::linger>() as libc::socklen_t;
    let set =
        unsafe { libc::setsockopt(c.as_raw_fd(), libc::SOL_SOCKET, libc::SO_LINGER, (&raw const linger).cast(), size) };
    assert_eq!(set, 0);
    drop(c);
    tokio::time::sleep(std::time::Duration::from_millis(600)).await;
    assert_eq!(gw.settled_ledger()["held_cents"], 0, "settled for what was delivered");
    let log = gw.log();
    assert!(log.contains("status=200"), "the access line: {log}");
    assert!(!log.contains("Fail to proxy"), "a client gone is an outcome, not an ERROR: {log}");
}

#[tokio::test]
async fn two_hundred_parallel_requests_never_overdraw_on_sqlite() {
    two_hundred_parallel_requests_never_overdraw(Opts::default()).await
}

#[tokio::test]
async fn two_hundred_parallel_requests_never_overdraw_on_postgres() {
    let url = pg::fresh_database().await;
    two_hundred_parallel_requests_never_overdraw(Opts { postgres_url: Some(url), ..Opts::default() }).await
}

async fn two_hundred_parallel_requests_never_overdraw(opts: Opts) {
    let mock = Mock::start();
    let gw = Gateway::start_with(&mock, opts);
    // Each request holds 10 cents (10 tokens at a cent) and spends 3: the $1 grant covers
    // at most ten in flight at once; the rest are refused with 402.
    let mut b = chat_body("pricey-model", false);
    b["max_tokens"] = json!(10);
    let bearer = gw.bearer();
    let url = gw.url("/v1/chat/completions");
    let client = reqwest::Client::new();
    let tasks: Vec<_> = (0..200)
        .map(|_| {
            let (client, url, bearer, b) = (client.clone(), url.clone(), bearer.clone(), b.clone());
            tokio::spawn(async move {
                let r = client
                    .post(url)
                    .header("authorization", bearer)
                    .header("x-mock-tokens", "3")
                    .header("x-mock-ttft-ms", "20")
                    .json(&b)
                    .send()
                    .await
                    .unwrap();
                let status = r.status().as_u16();
                let v: Value = r.json().await.unwrap_or(Value::Null);
                (status, v)
            })
        })
        .collect();
    let mut spent = 0i64;
    let mut ok = 0;
    for t in tasks {
        let (status, v) = t.await.unwrap();
        match status {
            200 => {
                ok += 1;
                spent += v["usage"]["service"]["cost_microcents"].as_i64().unwrap();
            }
            402 => assert_eq!(v["error"]["code"], "insufficient_credits"),
            other => panic!("unexpected {other}: {v}"),
        }
    }
    assert!(ok >= 10, "at least the covered requests ran: {ok}");
    tokio::time::sleep(std::time::Duration::from_millis(300)).await;
    let l = balance(&gw, &gw.workspace);
    let balance = l["balance_cents"].as_i64().unwrap();
    let carry = l["carry_microcents"].as_i64().unwrap();
    assert!(balance >= 0, "no overdraft: {balance}");
    assert_eq!(l["held_cents"], 0);
    assert_eq!((100 - balance) * 1_000_000 + carry, spent, "balance == top-ups minus settled costs, to the microcent");
}

#[tokio::test]
async fn free_window_prices_at_zero_and_recent_end_is_reported() {
    let mock = Mock::start();
    let gw = Gateway::start(&mock);
    // Inside the window: priced at zero, no hold even for a $40 ceiling.
    let r = gw.post("/v1/chat/completions", &chat_body("free-model", false), &[("x-mock-tokens", "9")]).await;
    assert_eq!(r.status, 200, "{}", r.text);
    let u = &r.json()["usage"];
    assert_eq!(u["service"]["cost_microcents"], 0);
    assert!(r.text.contains("\"cost\":0.00000000"));
    // Window closed yesterday: normal price, and the 402 says when the window ended.
    let r = gw.post("/v1/chat/completions", &chat_body("ended-free-model", false), &[]).await;
    let v = r.assert_error(402, "insufficient_credits");
    let ended = v["error"]["free_window_ended_at"].as_str().expect("free_window_ended_at");
    let ended: jiff::Timestamp = ended.parse().unwrap();
    let ago = jiff::Timestamp::now().duration_since(ended).as_secs();
    assert!((86_000..=87_000).contains(&ago), "{ago}");
    tokio::time::sleep(std::time::Duration::from_millis(200)).await;
    let l = balance(&gw, &gw.workspace);
    assert_eq!(l["balance_cents"], 100);
}

#[tokio::test]
async fn a_gateway_killed_mid_stream_leaves_a_hold_the_sweeper_releases() {
    let mock = Mock::start();
    let opts = Opts { response_seconds: 2.0, first_token_seconds: 2.0, hold_margin_seconds: 1, ..Opts::default() };
    let mut gw = Gateway::start_with(&mock, opts.clone());
    let mut b = chat_body("pricey-model", true);
    b["max_tokens"] = json!(40);
    let url = gw.url("/v1/chat/completions");
    let bearer = gw.bearer();
    let stream = tokio::spawn(async move {
        let r = reqwest::Client::new()
            .post(url)
            .header("authorization", bearer)
            .header("x-mock-tokens", "40")
            .header("x-mock-token-delay-ms", "100")
            .json(&b)
            .send()
            .await;
        match r {
            Ok(r) => r.text().await.is_ok(),
            Err(_) => false,
        }
    });
    tokio::time::sleep(std::time::Duration::from_millis(700)).await;
    let held = balance(&gw, &gw.workspace);
    assert_eq!(held["held_cents"], 40, "the hold is open mid-stream: {held}");
    gw.kill();
    assert!(!stream.await.unwrap(), "the client saw the connection die");
    // A new instance on the same store: its sweeper releases the expired hold, unsettled.
    let gw2 = Gateway::start_in(&mock, opts, gw.dir.clone());
    tokio::time::sleep(std::time::Duration::from_millis(4500)).await;
    let l = balance(&gw2, &gw.workspace);
    assert_eq!((l["held_cents"].as_i64(), l["balance_cents"].as_i64()), (Some(0), Some(100)), "{l}");
    let kinds: Vec<&str> = l["entries"].as_array().unwrap().iter().map(|e| e["kind"].as_str().unwrap()).collect();
    assert!(!kinds.contains(&"settlement") && !kinds.contains(&"hold_release"), "released, not charged: {kinds:?}");
    assert!(gw2.log().contains("released 1 expired holds"), "the release is logged");
}

/// A hold whose answer was lost may still have been recorded: the refused request's hold is
/// released at once rather than after its expiry, 150 s here (decision 173).
#[tokio::test]
async fn a_hold_recorded_but_unanswered_is_released_at_once() {
    let mock = Mock::start();
    let opts = Opts { env: vec![("TOLLGATE_FAULT_LOST_REPLY", "hold".into())], ..Opts::default() };
    let gw = Gateway::start_with(&mock, opts);
    let r = gw.post("/v1/chat/completions", &chat_body("chat-model", false), &[]).await;
    r.assert_error(500, "credit_reservation_failed");
    assert_eq!(mock.stats().await["requests"], 0, "the replica never saw it");
    let deadline = std::time::Instant::now() + std::time::Duration::from_secs(5);
    let l = loop {
        let l = balance(&gw, &gw.workspace);
        if l["held_cents"] == 0 || std::time::Instant::now() > deadline {
            break l;
        }
        std::thread::sleep(std::time::Duration::from_millis(50));
    };
    assert_eq!((l["held_cents"].as_i64(), l["balance_cents"].as_i64()), (Some(0), Some(100)), "{l}");
    let kinds: Vec<&str> = l["entries"].as_array().unwrap().iter().map(|e| e["kind"].as_str().unwrap()).collect();
    assert!(!kinds.contains(&"settlement"), "released, not charged: {kinds:?}");
    assert!(gw.log().contains("unanswered hold released"), "{}", gw.log());
}

/// Two gateways on one store (decision 190): while one takes its requests' holds from a lease,
/// both show the same balance, and `held_cents` counts only the running requests (before, the
/// other showed the lease's unused part as held). A request the shown balance covers but the
/// stored one does not, because the busy instance's lease keeps the difference, is served by
/// the other instance (decision 191): its refusal recalls the leases, the busy instance gives
/// its lease back instead of renewing it, and the hold asked again finds the money (before,
/// a 402 while the busy instance kept renewing).
#[tokio::test]
async fn two_instances_show_one_balance_while_one_holds_a_lease() {
    let mock = Mock::start();
    let gw1 = Gateway::start(&mock);
    let gw2 = Gateway::start_in(&mock, Opts::default(), gw1.dir.clone());
    let ws = gw1.workspace.clone();
    top_up(&gw1, &ws, 4_300); // 4,400 cents with the signup grant
    let leased = |gw: &Gateway| balance(gw, &ws)["leased_cents"].as_i64().unwrap();
    // pricey-model: a cent per output token, a 10-cent hold for max_tokens 10.
    let mut small = chat_body("pricey-model", false);
    small["max_tokens"] = json!(10);
    let r = gw1.post("/v1/chat/completions", &small, &[("x-mock-tokens", "1")]).await;
    assert_eq!(r.status, 200, "{}", r.text);
    for _ in 0..100 {
        if leased(&gw1) > 0 {
            break;
        }
        std::thread::sleep(std::time::Duration::from_millis(10));
    }
    assert_eq!(leased(&gw1), 548, "gw1 leased an eighth of the 4,390 cents its first hold left");
    // Two slow streams on gw1, their holds taken from the lease (3 s each).
    let mut slow = small.clone();
    slow["stream"] = json!(true);
    let streams: Vec<_> = (0..2)
        .map(|_| {
            let (url, bearer, body) = (gw1.url("/v1/chat/completions"), gw1.bearer(), slow.clone());
            tokio::spawn(async move {
                let r = reqwest::Client::new()
                    .post(url)
                    .header("authorization", bearer)
                    .header("x-mock-tokens", "10")
                    .header("x-mock-token-delay-ms", "300")
                    .json(&body)
                    .send()
                    .await
                    .unwrap();
                r.text().await.unwrap()
            })
        })
        .collect();
    tokio::time::sleep(std::time::Duration::from_millis(200)).await;
    let auth = gw1.bearer();
    let credits = |gw: &Gateway| {
        let (url, auth) = (gw.url("/v1/credits"), auth.clone());
        async move {
            let r = reqwest::Client::new().get(url).header("authorization", auth).send().await.unwrap();
            r.json::<Value>().await.unwrap()
        }
    };
    let (on1, on2) = (credits(&gw1).await, credits(&gw2).await);
    assert_eq!((on1["balance_cents"].as_i64(), on1["held_cents"].as_i64()), (Some(4_379), Some(20)), "{on1}");
    assert_eq!((on2["balance_cents"].as_i64(), on2["held_cents"].as_i64()), (Some(4_379), Some(20)), "{on2}");
    // gw1 stays busy: a request every 20 ms, each asking its lease for a hold, so a lease
    // past three quarters of its second is renewed unless the ledger refuses the grant.
    let busy = std::sync::Arc::new(std::sync::atomic::AtomicBool::new(true));
    let looping = {
        let (url, bearer, body, busy) = (gw1.url("/v1/chat/completions"), gw1.bearer(), small.clone(), busy.clone());
        tokio::spawn(async move {
            let client = reqwest::Client::new();
            let mut served = 0;
            while busy.load(std::sync::atomic::Ordering::Relaxed) {
                let r = client.post(&url).header("authorization", &bearer).header("x-mock-tokens", "1");
                let r = r.json(&body).send().await.unwrap();
                served += i32::from(r.status() == 200);
                r.bytes().await.unwrap();
                tokio::time::sleep(std::time::Duration::from_millis(20)).await;
            }
            served
        })
    };
    tokio::time::sleep(std::time::Duration::from_millis(300)).await;
    assert!(leased(&gw1) > 0, "gw1 holds a lease while busy");
    // 4,096 cents fit the balance shown, not what gw1's lease leaves in the store.
    let mut big = chat_body("pricey-model", false);
    big["max_tokens"] = json!(4_096);
    let r = gw2.post_as("/v1/chat/completions", &big, &[("authorization", &auth), ("x-mock-tokens", "5")]).await;
    assert_eq!(r.status, 200, "served once gw1 gave its lease back: {}", r.text);
    busy.store(false, std::sync::atomic::Ordering::Relaxed);
    assert!(looping.await.unwrap() > 10, "gw1 served its requests throughout");
    for s in streams {
        assert!(s.await.unwrap().contains("[DONE]"));
    }
    // Every request settled at its usage; nothing stays held once gw1's lease is back.
    let deadline = std::time::Instant::now() + std::time::Duration::from_secs(5);
    let l = loop {
        let l = balance(&gw2, &ws);
        if l["held_cents"] == 0 || std::time::Instant::now() > deadline {
            break l;
        }
        std::thread::sleep(std::time::Duration::from_millis(100));
    };
    let cents: i64 = settled_costs(&l).iter().sum::<i64>() / 1_000_000;
    assert_eq!((l["held_cents"].as_i64(), l["balance_cents"].as_i64()), (Some(0), Some(4_400 - cents)), "{l}");
}

/// Decision 191's wait ends where a stalled instance's lease stops counting: a lease row older
/// than two seconds (`LEASE_LIVE`) belongs to an instance that is not renewing it, nobody can
/// spend it until it is swept, and the balance shown no longer includes it. A request refused
/// for money that lease keeps waits for it to go stale, then gets a 402 naming the balance
/// without it; it never waits for the stopped instance.
#[tokio::test]
async fn a_stalled_instances_lease_ends_the_wait_with_a_402() {
    let mock = Mock::start();
    let gw1 = Gateway::start(&mock);
    let gw2 = Gateway::start_in(&mock, Opts::default(), gw1.dir.clone());
    let ws = gw1.workspace.clone();
    top_up(&gw1, &ws, 4_300); // 4,400 cents with the signup grant
    let mut small = chat_body("pricey-model", false);
    small["max_tokens"] = json!(10);
    let r = gw1.post("/v1/chat/completions", &small, &[("x-mock-tokens", "1")]).await;
    assert_eq!(r.status, 200, "{}", r.text);
    // gw1 holds its lease (548 cents, an eighth of 4,390) and the request is settled.
    for _ in 0..100 {
        let l = balance(&gw2, &ws);
        if balance(&gw1, &ws)["leased_cents"] == 548 && settled_costs(&l) == vec![1_000_000] {
            break;
        }
        std::thread::sleep(std::time::Duration::from_millis(10));
    }
    assert_eq!(balance(&gw1, &ws)["leased_cents"], 548);
    assert_eq!(unsafe { libc::kill(gw1.pid() as i32, libc::SIGSTOP) }, 0);
    // 4,096 cents: covered by the 4,399 shown while the lease is live, not by the 3,851 stored.
    let mut big = chat_body("pricey-model", false);
    big["max_tokens"] = json!(4_096);
    let r = gw2.post_as("/v1/chat/completions", &big, &[("authorization", &gw1.bearer())]).await;
    assert_eq!(unsafe { libc::kill(gw1.pid() as i32, libc::SIGCONT) }, 0);
    let v = r.assert_error(402, "insufficient_credits");
    assert_eq!(
        (v["error"]["required_cents"].as_i64(), v["error"]["current_balance_cents"].as_i64()),
        (Some(4_096), Some(3_851)),
        "the stale lease is not shown as balance: {v}"
    );
    let message = v["error"]["message"].as_str().unwrap();
    assert!(message.contains("add at least 245 cents"), "{message}");
}
