//! The body replay (src/transport/body_replay.rs) on raw HTTP/1 connections: large bodies,
//! `Expect: 100-continue`, chunked uploads, keepalive reuse and a pipelining client, and
//! request framing broadly (HTTP/1.1 keep-alive and `Connection: close`, HTTP/1.0 with and
//! without keep-alive, chunked and Content-Length) on all three inference routes.
#![allow(clippy::unwrap_used, clippy::expect_used, clippy::panic)]

mod common;

use std::io::{BufRead, BufReader, Read, Write};
use std::net::TcpStream;
use std::time::Duration;

use common::*;

struct Conn {
    reader: BufReader<TcpStream>,
}

struct RawReply {
    status: u16,
    headers: Vec<(String, String)>,
    body: Vec<u8>,
    /// The body had no length and ended with the connection.
    close_delimited: bool,
}

impl RawReply {
    fn header(&self, name: &str) -> Option<&str> {
        self.headers.iter().find(|(k, _)| k.eq_ignore_ascii_case(name)).map(|(_, v)| v.as_str())
    }
}

impl Conn {
    fn open(port: u16) -> Conn {
        let s = TcpStream::connect(("127.0.0.1", port)).unwrap();
        s.set_read_timeout(Some(Duration::from_secs(10))).unwrap();
        Conn { reader: BufReader::new(s) }
    }

    fn send(&mut self, bytes: &[u8]) {
        self.reader.get_mut().write_all(bytes).unwrap();
    }

    fn line(&mut self) -> String {
        let mut l = String::new();
        self.reader.read_line(&mut l).unwrap();
        l.trim_end().to_string()
    }

    /// Read one response (Content-Length or chunked body).
    fn read(&mut self) -> RawReply {
        let status_line = self.line();
        let status: u16 = status_line
            .split(' ')
            .nth(1)
            .and_then(|s| s.parse().ok())
            .unwrap_or_else(|| panic!("status line {status_line:?}"));
        let mut headers = Vec::new();
        loop {
            let l = self.line();
            if l.is_empty() {
                break;
            }
            let (k, v) = l.split_once(':').unwrap();
            headers.push((k.trim().to_string(), v.trim().to_string()));
        }
        let mut reply = RawReply { status, headers, body: Vec::new(), close_delimited: false };
        if status == 100 {
            return reply;
        }
        if let Some(n) = reply.header("content-length").map(|v| v.parse::<usize>().unwrap()) {
            let mut body = vec![0; n];
            self.reader.read_exact(&mut body).unwrap();
            reply.body = body;
        } else if reply.header("transfer-encoding").is_some() {
            loop {
                let size = usize::from_str_radix(&self.line(), 16).unwrap();
                let mut chunk = vec![0; size + 2];
                self.reader.read_exact(&mut chunk).unwrap();
                if size == 0 {
                    break;
                }
                reply.body.extend_from_slice(&chunk[..size]);
            }
        } else {
            // No length: the body ends with the connection (HTTP/1.0 framing).
            self.reader.read_to_end(&mut reply.body).unwrap();
            reply.close_delimited = true;
        }
        reply
    }

    fn closed(&mut self) -> bool {
        let mut b = [0u8; 1];
        matches!(self.reader.read(&mut b), Ok(0))
    }
}

/// A chat body of about `pad` bytes, for `stream-model`: it declares no context window, so
/// megabyte prompts pass the context check (rule 11) and only the body handling is tested.
fn chat_json(pad: usize) -> Vec<u8> {
    format!(r#"{{"model":"stream-model","messages":[{{"role":"user","content":"{}"}}]}}"#, "p".repeat(pad)).into_bytes()
}

fn post_head(key: &str, len: usize, extra: &str) -> Vec<u8> {
    format!("POST /v1/chat/completions HTTP/1.1\r\nHost: t\r\nAuthorization: Bearer {key}\r\nContent-Type: application/json\r\nContent-Length: {len}\r\n{extra}\r\n").into_bytes()
}

#[tokio::test]
async fn expect_100_continue_with_a_3mb_body_keeps_the_connection() {
    let mock = Mock::start();
    let gw = Gateway::start(&mock);
    let body = chat_json(3_000_000);
    let mut c = Conn::open(gw.port);
    c.send(&post_head(&gw.key, body.len(), "Expect: 100-continue\r\n"));
    let cont = c.read();
    assert_eq!(cont.status, 100, "the gateway answers 100 Continue itself");
    c.send(&body);
    let r = c.read();
    assert_eq!(r.status, 200, "{}", String::from_utf8_lossy(&r.body));
    let seen = mock.last_request().await;
    assert_eq!(seen["body"]["messages"][0]["content"].as_str().map(str::len), Some(3_000_000), "whole body forwarded");
    assert!(seen["headers"].get("expect").is_none(), "Expect is not forwarded");
    // Same connection, next request.
    let small = chat_json(10);
    c.send(&post_head(&gw.key, small.len(), ""));
    c.send(&small);
    assert_eq!(c.read().status, 200);
}

#[tokio::test]
async fn chunked_upload_is_forwarded_with_a_length() {
    let mock = Mock::start();
    let gw = Gateway::start(&mock);
    let body = chat_json(1_200_000);
    let mut c = Conn::open(gw.port);
    c.send(format!("POST /v1/chat/completions HTTP/1.1\r\nHost: t\r\nAuthorization: Bearer {}\r\nTransfer-Encoding: chunked\r\n\r\n", gw.key).as_bytes());
    for chunk in body.chunks(100_000) {
        c.send(format!("{:x}\r\n", chunk.len()).as_bytes());
        c.send(chunk);
        c.send(b"\r\n");
    }
    c.send(b"0\r\n\r\n");
    let r = c.read();
    assert_eq!(r.status, 200, "{}", String::from_utf8_lossy(&r.body));
    let seen = mock.last_request().await;
    assert!(seen["headers"].get("transfer-encoding").is_none());
    let forwarded_len: usize = seen["headers"]["content-length"].as_str().unwrap().parse().unwrap();
    assert!(forwarded_len > 1_200_000);
    assert_eq!(seen["body"]["messages"][0]["content"].as_str().map(str::len), Some(1_200_000));
}

#[tokio::test]
async fn keepalive_connection_serves_many_rewritten_requests() {
    let mock = Mock::start();
    let gw = Gateway::start(&mock);
    let mut c = Conn::open(gw.port);
    for i in 0..20 {
        let body = chat_json(i * 1000);
        c.send(&post_head(&gw.key, body.len(), ""));
        c.send(&body);
        let r = c.read();
        assert_eq!(r.status, 200, "request {i}");
        assert!(String::from_utf8_lossy(&r.body).contains("chat.completion"));
    }
    assert_eq!(mock.stats().await["requests"], 20);
}

/// Two chat requests in one write, the second with `extra` header lines.
fn two_pipelined(key: &str, extra: &str) -> Vec<u8> {
    let (a, b) = (chat_json(5), chat_json(6));
    let mut wire = post_head(key, a.len(), "");
    wire.extend_from_slice(&a);
    wire.extend_from_slice(&post_head(key, b.len(), extra));
    wire.extend_from_slice(&b);
    wire
}

#[tokio::test]
async fn a_pipelining_client_gets_every_answer() {
    let mock = Mock::start();
    let gw = Gateway::start(&mock);
    let mut c = Conn::open(gw.port);
    let mut wire = two_pipelined(&gw.key, "");
    wire.extend_from_slice(
        format!("GET /v1/models HTTP/1.1\r\nHost: t\r\nAuthorization: Bearer {}\r\n\r\n", gw.key).as_bytes(),
    );
    c.send(&wire);
    assert_eq!(c.read().status, 200);
    assert_eq!(c.read().status, 200);
    let models = c.read();
    assert_eq!(models.status, 200);
    assert!(String::from_utf8_lossy(&models.body).contains("\"object\":\"list\""));
}

#[tokio::test]
async fn oversized_chunked_upload_is_413_and_the_connection_closes() {
    let mock = Mock::start();
    let gw = Gateway::start(&mock);
    let mut c = Conn::open(gw.port);
    c.send(format!("POST /v1/chat/completions HTTP/1.1\r\nHost: t\r\nAuthorization: Bearer {}\r\nTransfer-Encoding: chunked\r\n\r\n", gw.key).as_bytes());
    let chunk = vec![b'x'; 500_000];
    for _ in 0..8 {
        c.send(format!("{:x}\r\n", chunk.len()).as_bytes());
        if c.reader.get_mut().write_all(&chunk).is_err() {
            break;
        }
        let _ = c.reader.get_mut().write_all(b"\r\n");
    }
    let r = c.read();
    assert_eq!(r.status, 413);
    let v: serde_json::Value = serde_json::from_slice(&r.body).unwrap();
    assert_eq!(v["error"]["code"], "payload_too_large");
    assert!(c.closed(), "the rest of the upload is not drained");
    assert_eq!(mock.stats().await["requests"], 0);
}

#[tokio::test]
async fn declared_oversize_is_refused_before_the_body_is_sent() {
    let mock = Mock::start();
    let gw = Gateway::start(&mock);
    let mut c = Conn::open(gw.port);
    c.send(&post_head(&gw.key, 3_500_001, "Expect: 100-continue\r\n"));
    let r = c.read();
    assert_eq!(r.status, 413, "no 100 Continue for a body that will be refused");
}

/// The three inference routes, each with a small body its dialect accepts.
const ROUTES: [(&str, &str, &str); 3] = [
    ("/v1/chat/completions", r#"{"model":"chat-model","messages":[{"role":"user","content":"hi"}]"#, "chat.completion"),
    ("/v1/messages", r#"{"model":"chat-model","max_tokens":32,"messages":[{"role":"user","content":"hi"}]"#, "message"),
    ("/v1/responses", r#"{"model":"chat-model","input":"hi""#, "response"),
];

/// `open` (a JSON object without its closing brace) with `"stream": stream` and `}`.
fn route_body(open: &str, stream: bool) -> Vec<u8> {
    format!("{open},\"stream\":{stream}}}").into_bytes()
}

/// How a test request is framed on the wire.
#[derive(Clone, Copy, Debug)]
struct Framing {
    version: &'static str,
    connection: Option<&'static str>,
    chunked: bool,
    expect_continue: bool,
}

impl Framing {
    /// The connection stays open after the response.
    fn keeps_alive(self) -> bool {
        match self.version {
            "HTTP/1.1" => !self.connection.is_some_and(|c| c.eq_ignore_ascii_case("close")),
            _ => false, // HTTP/1.0: a body of unknown length ends with the connection
        }
    }
}

const FRAMINGS: [Framing; 7] = [
    Framing { version: "HTTP/1.1", connection: None, chunked: false, expect_continue: false },
    Framing { version: "HTTP/1.1", connection: Some("keep-alive"), chunked: true, expect_continue: false },
    Framing { version: "HTTP/1.1", connection: Some("close"), chunked: false, expect_continue: false },
    Framing { version: "HTTP/1.1", connection: Some("close"), chunked: true, expect_continue: true },
    Framing { version: "HTTP/1.1", connection: Some("Close"), chunked: false, expect_continue: true },
    Framing { version: "HTTP/1.0", connection: None, chunked: false, expect_continue: false },
    Framing { version: "HTTP/1.0", connection: Some("keep-alive"), chunked: false, expect_continue: false },
];

/// Send one request with `framing` on `c` and read its answer (after any `100 Continue`).
fn exchange(c: &mut Conn, key: &str, path: &str, body: &[u8], f: Framing) -> RawReply {
    let mut head = format!(
        "POST {path} {}\r\nHost: t\r\nAuthorization: Bearer {key}\r\nContent-Type: application/json\r\n",
        f.version
    );
    if let Some(conn) = f.connection {
        head.push_str(&format!("Connection: {conn}\r\n"));
    }
    if f.expect_continue {
        head.push_str("Expect: 100-continue\r\n");
    }
    if f.chunked {
        head.push_str("Transfer-Encoding: chunked\r\n\r\n");
    } else {
        head.push_str(&format!("Content-Length: {}\r\n\r\n", body.len()));
    }
    c.send(head.as_bytes());
    if f.expect_continue {
        assert_eq!(c.read().status, 100, "{f:?}: 100 Continue first");
    }
    if f.chunked {
        let (a, b) = body.split_at(body.len() / 2);
        for part in [a, b] {
            c.send(format!("{:x}\r\n", part.len()).as_bytes());
            c.send(part);
            c.send(b"\r\n");
        }
        c.send(b"0\r\n\r\n");
    } else {
        c.send(body);
    }
    c.read()
}

#[tokio::test]
async fn every_framing_is_served_on_every_inference_route() {
    let mock = Mock::start();
    let gw = Gateway::start(&mock);
    for (path, open, object) in ROUTES {
        for f in FRAMINGS {
            for stream in [false, true] {
                let what = format!("{path} stream={stream} {f:?}");
                let mut c = Conn::open(gw.port);
                let r = exchange(&mut c, &gw.key, path, &route_body(open, stream), f);
                assert_eq!(r.status, 200, "{what}: {}", String::from_utf8_lossy(&r.body));
                let text = String::from_utf8_lossy(&r.body).into_owned();
                if stream {
                    assert!(text.contains("data: "), "{what}: an event stream: {text}");
                    assert!(!text.contains("\"error\":{"), "{what}: {text}");
                } else {
                    let v: serde_json::Value =
                        serde_json::from_str(&text).unwrap_or_else(|e| panic!("{what}: not JSON ({e}): {text}"));
                    assert_eq!(v["object"].as_str().or(v["type"].as_str()), Some(object), "{what}: {text}");
                }
                if f.version == "HTTP/1.0" {
                    assert!(r.header("transfer-encoding").is_none(), "{what}: no chunked framing for HTTP/1.0");
                }
                if f.keeps_alive() {
                    assert!(!r.close_delimited, "{what}");
                    // The same connection serves the next request.
                    let again = exchange(&mut c, &gw.key, path, &route_body(open, false), f);
                    assert_eq!(again.status, 200, "{what}: second request on the connection");
                } else {
                    assert_eq!(r.header("connection").map(str::to_ascii_lowercase).as_deref(), Some("close"), "{what}");
                    assert!(r.close_delimited || c.closed(), "{what}: the connection closes after the response");
                }
            }
        }
    }
    assert!(!gw.log().contains("panicked"), "no worker panicked: {}", gw.log());
}

#[tokio::test]
async fn pipelined_requests_survive_the_gateways_own_answers_and_failures_keep_the_connection() {
    let mock = Mock::start();
    let gw = Gateway::start(&mock);
    let mut c = Conn::open(gw.port);
    // Two requests pipelined, each answered by the gateway itself.
    let models = format!("GET /v1/models HTTP/1.1\r\nHost: t\r\nAuthorization: Bearer {}\r\n\r\n", gw.key);
    c.send(format!("{models}{models}").as_bytes());
    for n in ["first", "second"] {
        let r = c.read();
        assert_eq!(r.status, 200, "{n}: {}", String::from_utf8_lossy(&r.body));
        assert_eq!(r.header("connection"), Some("keep-alive"), "{n}");
    }
    // A refusal of the gateway's own with a request pipelined behind it.
    let post = |body: &str, extra: &str| {
        format!(
            "POST /v1/chat/completions HTTP/1.1\r\nHost: t\r\nAuthorization: Bearer {}\r\n{extra}Content-Type: application/json\r\nContent-Length: {}\r\n\r\n{body}",
            gw.key,
            body.len()
        )
    };
    let good = r#"{"model":"chat-model","messages":[{"role":"user","content":"hi"}]}"#;
    c.send(format!("{}{}", post("{bad", ""), post(good, "")).as_bytes());
    assert_eq!(c.read().status, 400, "invalid JSON");
    assert_eq!(c.read().status, 200, "the request pipelined behind it");
    // A replica failure (502), a replica reset before the header (502) and a stream the replica
    // cuts mid-way (an error frame on the 200, then the chunked end): each answer is complete,
    // so the connection stays open and serves the client's next request (decision 158, issue
    // 48: a client that pooled the connection must not find it closed).
    let cut_stream = r#"{"model":"chat-model","stream":true,"messages":[{"role":"user","content":"hi"}]}"#;
    for (body, extra, status) in [
        (good, "x-mock-status: 500\r\n", 502),
        (good, "x-mock-abort-after: 0\r\n", 502),
        (cut_stream, "x-mock-tokens: 10\r\nx-mock-abort-after: 3\r\n", 200),
    ] {
        let mut c = Conn::open(gw.port);
        c.send(post(body, extra).as_bytes());
        let r = c.read();
        let text = String::from_utf8_lossy(&r.body).into_owned();
        assert_eq!(r.status, status, "{extra}: {text}");
        assert!(text.contains("\"error\":{") && !text.contains("[DONE]"), "{extra}: {text}");
        assert_eq!(r.header("connection"), Some("keep-alive"), "{extra}");
        assert!(!r.close_delimited, "{extra}");
        c.send(post(good, "").as_bytes());
        let next = c.read();
        assert_eq!(next.status, 200, "{extra}: the next request on the same connection");
    }
}

#[tokio::test]
async fn a_pipelined_request_asking_to_close_is_answered_then_the_connection_closes() {
    let mock = Mock::start();
    let gw = Gateway::start(&mock);
    let mut c = Conn::open(gw.port);
    c.send(&two_pipelined(&gw.key, "Connection: close\r\n"));
    let first = c.read();
    assert_eq!(first.status, 200);
    assert_eq!(first.header("connection"), Some("keep-alive"));
    let second = c.read();
    assert_eq!(second.status, 200, "{}", String::from_utf8_lossy(&second.body));
    assert_eq!(second.header("connection"), Some("close"));
    assert!(c.closed());
}

#[tokio::test]
async fn connection_close_on_an_error_answer_gets_the_envelope() {
    let mock = Mock::start();
    let gw = Gateway::start(&mock);
    let f = Framing { version: "HTTP/1.1", connection: Some("close"), chunked: false, expect_continue: false };
    // Refused after the body is read (unknown model) and after the replica answered (5xx).
    let mut c = Conn::open(gw.port);
    let r = exchange(&mut c, &gw.key, "/v1/chat/completions", br#"{"model":"nope","messages":[]}"#, f);
    assert_eq!(r.status, 404);
    let v: serde_json::Value = serde_json::from_slice(&r.body).unwrap();
    assert_eq!(v["error"]["code"], "model_not_found");
    let mut c = Conn::open(gw.port);
    c.send(
        format!(
            "POST /v1/messages HTTP/1.1\r\nHost: t\r\nx-api-key: {}\r\nConnection: close\r\nx-mock-status: 500\r\nContent-Length: {}\r\n\r\n",
            gw.key,
            route_body(ROUTES[1].1, false).len()
        )
        .as_bytes(),
    );
    c.send(&route_body(ROUTES[1].1, false));
    let r = c.read();
    assert_eq!(r.status, 502, "{}", String::from_utf8_lossy(&r.body));
    let v: serde_json::Value = serde_json::from_slice(&r.body).unwrap();
    assert_eq!(v["type"], "error", "messages envelope");
    assert!(c.closed());
}

/// A chat request for `model` in conversation `n`, as a raw HTTP/1.1 keep-alive request.
fn chat_request(key: &str, model: &str, n: usize, extra: &str) -> Vec<u8> {
    let body = format!(r#"{{"model":"{model}","messages":[{{"role":"user","content":"conversation {n}"}}]}}"#);
    let mut wire = post_head(key, body.len(), extra);
    wire.extend_from_slice(body.as_bytes());
    wire
}

// Decision 192: a kept-alive connection's later requests are forwarded without a replay when
// their body fits Pingora's retry buffer. Each test below fails if that path forwards the
// client's body instead of the rewritten one, keeps the client's framing, or loses the hold.

#[tokio::test]
async fn a_kept_alive_connection_forwards_the_rewritten_body_with_its_length() {
    let mock = Mock::start();
    let gw = Gateway::start(&mock);
    let mut c = Conn::open(gw.port);
    c.send(&chat_request(&gw.key, "chat-model", 0, ""));
    assert_eq!(c.read().status, 200);
    // The second request, chunked: the replica gets the rewritten body (its upstream model
    // name) with a length, never the client's chunks.
    let body = br#"{"model":"chat-model","messages":[{"role":"user","content":"chunked, kept alive"}]}"#;
    let f = Framing { version: "HTTP/1.1", connection: None, chunked: true, expect_continue: false };
    let r = exchange(&mut c, &gw.key, "/v1/chat/completions", body, f);
    assert_eq!(r.status, 200, "{}", String::from_utf8_lossy(&r.body));
    let seen = mock.last_request().await;
    assert_eq!(seen["body"]["model"], "org/Chat-Model-7B", "the rewritten body was forwarded: {seen}");
    assert_eq!(seen["body"]["messages"][0]["content"], "chunked, kept alive");
    assert!(seen["headers"].get("transfer-encoding").is_none(), "{seen}");
    let forwarded_len: usize = seen["headers"]["content-length"].as_str().unwrap().parse().unwrap();
    assert_eq!(forwarded_len, serde_json::to_vec(&seen["body"]).unwrap().len(), "{seen}");
    // A third request with Content-Length on the same connection.
    c.send(&chat_request(&gw.key, "chat-model", 3, ""));
    assert_eq!(c.read().status, 200);
    assert_eq!(mock.last_request().await["body"]["messages"][0]["content"], "conversation 3");
    assert_eq!(mock.stats().await["requests"], 3);
}

#[tokio::test]
async fn a_malformed_answer_on_a_kept_alive_connection_is_still_a_clean_502() {
    let mock = Mock::start();
    let gw = Gateway::start(&mock);
    let mut c = Conn::open(gw.port);
    for n in 0..2 {
        c.send(&chat_request(&gw.key, "chat-model", n, ""));
        assert_eq!(c.read().status, 200);
    }
    // The answer is held until its body is judged (clarification 11) also on this path: the
    // replica's 200 header goes out before its body, which is not a completion.
    c.send(&chat_request(&gw.key, "chat-model", 2, "x-mock-raw-body: not json{\r\nx-mock-body-delay-ms: 150\r\n"));
    let r = c.read();
    assert_eq!(r.status, 502, "{}", String::from_utf8_lossy(&r.body));
    let v: serde_json::Value = serde_json::from_slice(&r.body).unwrap();
    assert_eq!(v["error"]["code"], "upstream_error", "{v}");
}

#[tokio::test]
async fn a_replica_refusing_the_connection_gets_the_body_retried_on_another() {
    let mock = Mock::start();
    let dead = format!("127.0.0.1:{}", closed_port());
    let gw = Gateway::start_with(&mock, Opts { chat_replicas: vec![dead.clone(), mock.addr()], ..Opts::default() });
    let mut c = Conn::open(gw.port);
    // The first request (another pool) puts the connection's wrapper in place; every request
    // after it is forwarded in place, so the one that meets the dead replica is retried from
    // Pingora's buffer.
    c.send(&chat_request(&gw.key, "stream-model", 0, ""));
    assert_eq!(c.read().status, 200);
    for n in 1..=16 {
        c.send(&chat_request(&gw.key, "chat-model", n, ""));
        let r = c.read();
        assert_eq!(r.status, 200, "conversation {n}: {}", String::from_utf8_lossy(&r.body));
        let seen = mock.last_request().await;
        assert_eq!(seen["body"]["model"], "org/Chat-Model-7B", "{seen}");
        assert_eq!(seen["body"]["messages"][0]["content"], format!("conversation {n}"));
    }
    let ejections = gw.log().matches(&format!("replica {dead} of chat-model ejected for 10 s (refused")).count();
    assert_eq!(ejections, 1, "one conversation met the dead replica and was retried: {}", gw.log());
}
