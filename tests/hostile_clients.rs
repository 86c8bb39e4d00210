//! Hostile and slow clients (issue 49), through the real binary and raw sockets: what Pingora's
//! parser refuses carries the envelope, oversized headers are `431` and never reach a replica,
//! a bare LF in a chunk extension is refused, a key in a URL path is never logged, and bodies
//! that arrive slowly pin memory only as they arrive and are cut at their deadline, and open
//! connections are capped, the oldest idle one closed first.
#![allow(clippy::unwrap_used, clippy::expect_used, clippy::panic)]

mod common;

use std::io::{Read, Write};
use std::net::TcpStream;
use std::time::{Duration, Instant};

use common::{Gateway, Mock, Opts};

/// Everything the gateway answers on a fresh connection to `request`, until it closes (or
/// `wait` passes).
fn exchange(gw: &Gateway, request: &[u8], wait: Duration) -> String {
    gw.raw(request, wait)
}

/// The status and the JSON body of a whole response (`Content-Length` framed).
fn status_and_body(answer: &str) -> (u16, serde_json::Value) {
    let status = answer.split(' ').nth(1).and_then(|s| s.parse().ok()).unwrap_or(0);
    let body = answer.split_once("\r\n\r\n").map(|(_, b)| b).unwrap_or("");
    (status, serde_json::from_str(body).unwrap_or(serde_json::Value::Null))
}

/// A raw streamed chat request on a new connection (the test's key; `extra` header lines).
fn stream_request(gw: &Gateway, extra: &str) -> TcpStream {
    let body = r#"{"model":"chat-model","stream":true,"messages":[{"role":"user","content":"hi"}]}"#;
    let mut c = TcpStream::connect(("127.0.0.1", gw.port)).unwrap();
    let head = format!(
        "POST /v1/chat/completions HTTP/1.1\r\nHost: a\r\nAuthorization: Bearer {}\r\n{extra}Content-Type: application/json\r\nContent-Length: {}\r\n\r\n{body}",
        gw.key,
        body.len()
    );
    c.write_all(head.as_bytes()).unwrap();
    c
}

#[path = "hostile_clients/connection_cap.rs"]
mod connection_cap;
#[path = "hostile_clients/parser.rs"]
mod parser;
#[path = "hostile_clients/slow_readers.rs"]
mod slow_readers;
#[path = "hostile_clients/slow_senders.rs"]
mod slow_senders;
