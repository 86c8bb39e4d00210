//! HTTP/2 from clients through the real binary (issue 50, decision 219): cleartext with prior
//! knowledge (`client.h2c`) on every route, streamed and not; a 3.4 MB body; many streams on
//! one connection, one of them stalled and then reset by its client. Over TLS (ALPN): `tls.rs`.
#![allow(clippy::unwrap_used, clippy::expect_used, clippy::panic)]

mod common;

use std::time::Duration;

use common::routes::every_route_answers;
use common::{Gateway, Mock, Opts, chat_body};
use serde_json::json;

fn h2c_gateway(mock: &Mock) -> Gateway {
    Gateway::start_with(mock, Opts { extra_yaml: "client:\n  h2c: true\n".into(), ..Opts::default() })
}

fn h2c_client() -> reqwest::Client {
    reqwest::Client::builder().http2_prior_knowledge().build().unwrap()
}

#[tokio::test]
async fn h2c_with_prior_knowledge_serves_every_route_beside_http1() {
    let mock = Mock::start();
    let gw = h2c_gateway(&mock);
    every_route_answers(&h2c_client(), &gw.url(""), &gw).await;
    // The same listener still serves HTTP/1.1.
    let r = gw.post("/v1/chat/completions", &chat_body("chat-model", false), &[]).await;
    assert_eq!(r.status, 200, "{}", r.text);
    // Without the option, the HTTP/2 preface is refused as before.
    let plain = Gateway::start(&mock);
    assert!(h2c_client().get(plain.url("/v1/models")).send().await.is_err());
}

/// `curl` with `--http2-prior-knowledge`, streamed and not: HTTP/2 end to end, the same bodies.
#[tokio::test]
async fn curl_with_http2_prior_knowledge() {
    let mock = Mock::start();
    let gw = h2c_gateway(&mock);
    for stream in [false, true] {
        let out = std::process::Command::new("curl")
            .args(["-sS", "--http2-prior-knowledge", "-w", "\n%{http_version} %{http_code}", "-H"])
            .arg(format!("authorization: {}", gw.bearer()))
            .args(["-H", "content-type: application/json", "-d"])
            .arg(chat_body("chat-model", stream).to_string())
            .arg(gw.url("/v1/chat/completions"))
            .output()
            .expect("curl runs");
        let text = String::from_utf8_lossy(&out.stdout);
        assert!(text.ends_with("\n2 200"), "HTTP/2, 200: {text} {}", String::from_utf8_lossy(&out.stderr));
        let expected = if stream { "data: [DONE]" } else { "\"object\":\"chat.completion\"" };
        assert!(text.contains(expected), "{text}");
    }
}

#[tokio::test]
async fn a_3_4_mb_body_is_forwarded_over_http2() {
    let mock = Mock::start();
    let gw = h2c_gateway(&mock);
    // JSON whitespace pads the body to 3.4 MB; the replica gets the rewritten request.
    let pad = " ".repeat(3_400_000);
    let body = format!(r#"{{"model": "chat-model",{pad}"messages": [{{"role": "user", "content": "big"}}]}}"#);
    let r = h2c_client()
        .post(gw.url("/v1/chat/completions"))
        .header("authorization", gw.bearer())
        .header("content-type", "application/json")
        .body(body)
        .send()
        .await
        .unwrap();
    assert_eq!(r.version(), reqwest::Version::HTTP_2);
    assert_eq!(r.status(), 200);
    let sent = mock.last_request().await;
    assert_eq!(sent["body"]["messages"][0]["content"], "big", "{sent}");
}

#[tokio::test]
async fn a_stalled_stream_does_not_stall_its_neighbours_and_its_reset_settles_what_it_took() {
    let mock = Mock::start();
    let gw = h2c_gateway(&mock);
    let (s, v) = gw.admin(
        "POST",
        &format!("/admin/v1/workspaces/{}/credits", gw.workspace),
        Some(json!({"amount_cents": 100_000, "source": "purchase"})),
    );
    assert_eq!(s, 201, "{v}");
    // A stream takes at most 64 KiB the client has not read (no adaptive window).
    let client = reqwest::Client::builder()
        .http2_prior_knowledge()
        .http2_initial_stream_window_size(65_535)
        .http2_initial_connection_window_size(4 << 20)
        .build()
        .unwrap();
    let post = |model: &str, tokens: &str, delay: &str| {
        let mut body = chat_body(model, true);
        body["max_tokens"] = json!(4000);
        client
            .post(gw.url("/v1/chat/completions"))
            .header("authorization", gw.bearer())
            .header("x-mock-tokens", tokens)
            .header("x-mock-token-delay-ms", delay)
            .json(&body)
            .send()
    };
    // pricey-model: a cent per output token. Its stream (4,000 frames, ~600 KB) is far larger
    // than the stream's window, and the client reads none of it.
    let stalled = post("pricey-model", "4000", "0").await.unwrap();
    assert_eq!(stalled.status(), 200);
    // 99 streams on the same connection complete meanwhile.
    let others = (0..99).map(|_| async {
        let r = post("stream-model", "20", "10").await.unwrap();
        assert_eq!(r.status(), 200);
        r.text().await.unwrap()
    });
    let texts = futures::future::join_all(others).await;
    assert!(texts.iter().all(|t| t.ends_with("data: [DONE]\n\n")), "every neighbour completes");
    // The client resets the stalled stream: settled for what reached it, far below 4,000 tokens.
    drop(stalled);
    let ledger = {
        let mut l = gw.settled_ledger();
        for _ in 0..50 {
            if l["held_cents"] == 0 {
                break;
            }
            tokio::time::sleep(Duration::from_millis(100)).await;
            l = gw.settled_ledger();
        }
        l
    };
    assert_eq!(ledger["held_cents"], 0, "the reset stream's hold is closed: {ledger}");
    let pricey: Vec<i64> = ledger["entries"]
        .as_array()
        .unwrap()
        .iter()
        .filter(|e| e["kind"] == "settlement" && e["cost_microcents"].as_i64().unwrap_or(0) >= 1_000_000)
        .filter_map(|e| e["cost_microcents"].as_i64())
        .collect();
    assert_eq!(pricey.len(), 1, "the stalled stream settled once: {ledger}");
    // About 290 tokens fill a 64 KiB window.
    assert!(
        (1_000_000..1_000 * 1_000_000).contains(&pricey[0]),
        "billed for what was delivered, not all 4,000 tokens: {}",
        pricey[0]
    );
    assert!(gw.log().contains("client_gone"), "an access line says the client left: {}", gw.log());
    assert!(!gw.log().contains("Fail to proxy"), "a reset stream is an outcome, not an error: {}", gw.log());
    // Its slot is free: the key's next request is served.
    let r = post("stream-model", "2", "0").await.unwrap();
    assert_eq!(r.status(), 200);
}

/// An HTTP/2 connection with no stream is closed after `client.idle_timeout_seconds`, as an
/// idle HTTP/1 connection is (issue 49's deadlines on the HTTP/2 path).
#[test]
fn an_idle_http2_connection_is_closed() {
    use std::io::{Read, Write};
    let mock = Mock::start();
    let gw = Gateway::start_with(
        &mock,
        Opts { extra_yaml: "client:\n  h2c: true\n  idle_timeout_seconds: 2\n".into(), ..Opts::default() },
    );
    let mut s = std::net::TcpStream::connect(("127.0.0.1", gw.port)).unwrap();
    s.set_read_timeout(Some(Duration::from_secs(60))).unwrap();
    // The preface and an empty SETTINGS frame, then nothing.
    s.write_all(b"PRI * HTTP/2.0\r\n\r\nSM\r\n\r\n\0\0\0\x04\0\0\0\0\0").unwrap();
    let opened = std::time::Instant::now();
    let mut buf = [0u8; 4096];
    let mut read = Vec::new();
    loop {
        match s.read(&mut buf) {
            Ok(0) => break,
            Ok(n) => read.extend_from_slice(&buf[..n]),
            Err(e) => panic!("the connection was not closed: {e} (after {:?})", opened.elapsed()),
        }
    }
    let closed = opened.elapsed();
    assert!(closed >= Duration::from_millis(1500), "closed at its idle timeout, not at once: {closed:?}");
    assert!(closed < Duration::from_secs(30), "closed at its idle timeout (2 s): {closed:?}");
    assert_eq!(read.get(3), Some(&4), "the server's SETTINGS came first: {read:?}");
}
