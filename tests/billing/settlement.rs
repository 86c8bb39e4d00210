//! Settlement equal to the usage the client saw: cut-short streams, clients that leave, forwarded routes.

use super::*;

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
