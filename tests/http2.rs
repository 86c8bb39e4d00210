//! HTTP/2 from clients through the real binary (issue 50, decision 219): cleartext with prior
//! knowledge (`client.h2c`) on every route, streamed and not; a 3.4 MB body; many streams on
//! one connection, one of them stalled and then reset by its client. Over TLS (ALPN): `tls.rs`.
#![allow(clippy::unwrap_used, clippy::expect_used, clippy::panic)]

mod common;

use std::time::Duration;

use common::routes::{body_for, every_route_answers};
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

/// The connection cap (decision 216) takes an HTTP/2 connection as idle once none of its
/// streams is in progress: at the cap it makes room as an idle HTTP/1.1 connection does, and
/// the frames it still exchanges (flow control, pings) do not make it busy. Here the cap is
/// two: A is an HTTP/2 connection after one answer, B an HTTP/1.1 stream whose replica is
/// silent; C, the third, closes A and is served.
#[tokio::test]
async fn an_http2_connection_with_no_stream_in_progress_makes_room_at_the_cap() {
    use std::io::Write;
    let mock = Mock::start();
    let gw = Gateway::start_with(
        &mock,
        Opts { extra_yaml: "client:\n  h2c: true\n  max_connections: 2\n".into(), ..Opts::default() },
    );
    let a = h2c_client();
    let r = a.get(gw.url("/v1/models")).bearer_auth(&gw.key).send().await.unwrap();
    assert_eq!((r.version(), r.status().as_u16()), (reqwest::Version::HTTP_2, 200));
    r.text().await.unwrap();
    let body = chat_body("chat-model", true).to_string();
    let mut b = std::net::TcpStream::connect(("127.0.0.1", gw.port)).unwrap();
    write!(
        b,
        "POST /v1/chat/completions HTTP/1.1\r\nHost: a\r\nAuthorization: Bearer {}\r\nx-mock-ttft-ms: 60000\r\nContent-Type: application/json\r\nContent-Length: {}\r\n\r\n{body}",
        gw.key,
        body.len()
    )
    .unwrap();
    // The gateway marks A idle when it logged A's answer and B busy when B's bytes arrive.
    tokio::time::sleep(Duration::from_millis(500)).await;
    let key = gw.key.clone();
    let request =
        format!("GET /v1/models HTTP/1.1\r\nHost: a\r\nAuthorization: Bearer {key}\r\nConnection: close\r\n\r\n");
    let answer = gw.raw(request.as_bytes(), Duration::from_secs(10));
    assert!(answer.starts_with("HTTP/1.1 200"), "the third connection was not served: {answer}");
    let metrics = gw.metrics().await;
    assert!(
        metrics.lines().any(|l| l.starts_with("tollgate_client_connections_shed_total{action=\"closed_idle\"} 1")),
        "the idle HTTP/2 connection was not the one closed: {metrics}"
    );
    drop(b);
}

/// A client that goes away with streams in flight (as a load generator does at the end of its
/// run: the connection closes under them) has left; its requests are not the gateway's
/// failures: none is counted as `internal_error`, and the ledger keeps no hold.
#[tokio::test]
async fn streams_cut_by_the_clients_connection_closing_are_clients_leaving_not_internal_errors() {
    let mock = Mock::start();
    let gw = h2c_gateway(&mock);
    for stream in [true, false] {
        let client = h2c_client();
        let sends = (0..20).map(|_| {
            let mut body = chat_body("stream-model", stream);
            body["max_tokens"] = json!(4000);
            client
                .post(gw.url("/v1/chat/completions"))
                .header("authorization", gw.bearer())
                .header("x-mock-tokens", "2000")
                .header("x-mock-token-delay-ms", "5")
                .json(&body)
                .send()
        });
        // Every request is in flight (streams answering, whole answers being generated),
        // then the client and its connection go.
        let all = futures::future::join_all(sends);
        let _ = tokio::time::timeout(Duration::from_millis(800), all).await;
        drop(client);
    }
    let mut metrics = String::new();
    for _ in 0..100 {
        metrics = gw.metrics().await;
        let logged: f64 = metrics
            .lines()
            .filter(|l| l.starts_with("tollgate_requests_total{") && l.contains("route=\"chat_completions\""))
            .filter_map(|l| l.rsplit(' ').next()?.parse::<f64>().ok())
            .sum();
        if logged >= 40.0 {
            break;
        }
        tokio::time::sleep(Duration::from_millis(100)).await;
    }
    assert!(!metrics.contains("code=\"internal_error\""), "a client leaving is not an internal error: {metrics}");
    let ledger = gw.settled_ledger();
    assert_eq!(ledger["held_cents"], 0, "every hold closed: {ledger}");
}

/// A non-streamed answer is held until its body is judged on HTTP/2 too (the session's hold,
/// `pingora-proxy-0.9.1-response-hold.patch`): a body that is not a completion, also one
/// arriving after the replica's 200 header, is a complete `502 upstream_error` in the route's
/// envelope, not a reset stream, and nothing is charged.
#[tokio::test]
async fn a_non_streamed_answer_that_is_not_a_completion_is_a_clean_502_over_http2() {
    let mock = Mock::start();
    let gw = h2c_gateway(&mock);
    let before = gw.settled_ledger()["balance_cents"].clone();
    let client = h2c_client();
    for route in ["/v1/chat/completions", "/v1/messages", "/v1/responses"] {
        let body = body_for(route, false);
        for raw in ["not json{", "", "{\"choices\":[1]}"] {
            for delay in ["0", "150"] {
                let what = format!("{route} body {raw:?} after {delay} ms");
                let r = client
                    .post(gw.url(route))
                    .header("authorization", gw.bearer())
                    .header("x-mock-raw-body", raw)
                    .header("x-mock-body-delay-ms", delay)
                    .json(&body)
                    .send()
                    .await
                    .unwrap_or_else(|e| panic!("{what}: no response ({e})"));
                assert_eq!(r.version(), reqwest::Version::HTTP_2, "{what}");
                assert_eq!(r.status(), 502, "{what}");
                let text = r.text().await.unwrap_or_else(|e| panic!("{what}: the body was cut ({e})"));
                let v: serde_json::Value =
                    serde_json::from_str(&text).unwrap_or_else(|e| panic!("{what}: not JSON ({e}): {text}"));
                if route == "/v1/messages" {
                    assert_eq!(v["error"]["type"], "api_error", "{what}: {v}");
                } else {
                    assert_eq!(v["error"]["code"], "upstream_error", "{what}: {v}");
                }
            }
        }
    }
    let after = gw.settled_ledger();
    assert_eq!(after["balance_cents"], before, "nothing charged: {after}");
    assert_eq!(after["held_cents"], 0, "every hold released: {after}");
}
