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

/// Two chat requests in one write, the second with `extra` header lines.
fn two_pipelined(key: &str, extra: &str) -> Vec<u8> {
    let (a, b) = (chat_json(5), chat_json(6));
    let mut wire = post_head(key, a.len(), "");
    wire.extend_from_slice(&a);
    wire.extend_from_slice(&post_head(key, b.len(), extra));
    wire.extend_from_slice(&b);
    wire
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

#[path = "body_replay/framing.rs"]
mod framing;
#[path = "body_replay/kept_alive.rs"]
mod kept_alive;
#[path = "body_replay/large_bodies.rs"]
mod large_bodies;
