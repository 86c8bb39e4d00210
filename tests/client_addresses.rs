//! The client's address behind load balancers (issue 52): a trusted proxy's
//! `X-Forwarded-For` and PROXY protocol header name the client for the connection gate and
//! the access line; an untrusted sender's claims are ignored.
#![allow(clippy::unwrap_used, clippy::expect_used, clippy::panic)]

mod common;

use std::io::{Read, Write};
use std::net::TcpStream;
use std::time::Duration;

use common::{Gateway, Mock, Opts};

const BAD_KEY: &str = "Bearer rp_0000000000000000000000000000000000000000";

/// A gateway whose gate allows 3 unrecognized requests a minute per address, trusting `trusted`.
fn gateway(mock: &Mock, client_section: &str) -> Gateway {
    let opts = Opts {
        limits: Some("  connection_gate: { per_address_per_minute: 3 }\n".into()),
        extra_yaml: format!("client:\n{client_section}"),
        ..Opts::default()
    };
    Gateway::start_with(mock, opts)
}

/// The gateway's log once it holds every one of `wanted` (an access line is written just
/// after its answer).
fn log_with(gw: &Gateway, wanted: &[&str]) -> String {
    let deadline = std::time::Instant::now() + Duration::from_secs(20);
    loop {
        let log = gw.log();
        if wanted.iter().all(|w| log.contains(w)) {
            return log;
        }
        assert!(std::time::Instant::now() < deadline, "the log never showed {wanted:?}: {log}");
        std::thread::sleep(Duration::from_millis(20));
    }
}

async fn bad_key_from(gw: &Gateway, forwarded_for: &str) -> u16 {
    gw.get_as("/v1/models", &[("authorization", BAD_KEY), ("x-forwarded-for", forwarded_for)]).await.status
}

#[tokio::test]
async fn a_trusted_proxys_forwarded_for_names_the_client_for_the_gate_and_the_log() {
    let mock = Mock::start();
    let gw = gateway(&mock, "  trusted_proxies: [\"127.0.0.1\"]\n");
    // The client may prepend anything: the entry the trusted peer appended is believed.
    for _ in 0..3 {
        assert_eq!(bad_key_from(&gw, "6.6.6.6, 198.51.100.1").await, 401);
    }
    assert_eq!(bad_key_from(&gw, "198.51.100.1").await, 429, "198.51.100.1 spent its budget");
    assert_eq!(bad_key_from(&gw, "198.51.100.2").await, 401, "another client behind the same proxy has its own");
    let log = log_with(&gw, &["client=198.51.100.1", "client=198.51.100.2"]);
    assert!(!log.contains("client=6.6.6.6"), "a client-written entry was believed: {log}");
}

#[tokio::test]
async fn an_untrusted_senders_forwarded_for_is_ignored() {
    let mock = Mock::start();
    // Loopback is not among the trusted proxies: every request is the TCP peer's.
    let gw = gateway(&mock, "  trusted_proxies: [\"10.0.0.0/8\"]\n");
    for i in 0..3 {
        assert_eq!(bad_key_from(&gw, &format!("198.51.100.{i}")).await, 401);
    }
    assert_eq!(bad_key_from(&gw, "198.51.100.9").await, 429, "one budget, whatever the header says");
    let log = log_with(&gw, &["client=127.0.0.1"]);
    assert!(!log.contains("client=198.51.100"), "an untrusted header was believed: {log}");
}

/// A PROXY protocol v2 header for a TCP/IPv4 connection from `src`.
fn proxy_v2(src: [u8; 4], src_port: u16) -> Vec<u8> {
    let mut h = b"\r\n\r\n\0\r\nQUIT\n".to_vec();
    h.extend_from_slice(&[0x21, 0x11, 0, 12]); // v2 PROXY, TCP over IPv4, 12 address bytes
    h.extend_from_slice(&src);
    h.extend_from_slice(&[127, 0, 0, 1]);
    h.extend_from_slice(&src_port.to_be_bytes());
    h.extend_from_slice(&443u16.to_be_bytes());
    h
}

/// Send `preface` then a `GET /v1/models` with the gateway's key; the answer's status line
/// (empty when the connection was closed without one).
fn exchange(gw: &Gateway, preface: &[u8]) -> String {
    let mut c = TcpStream::connect(("127.0.0.1", gw.port)).unwrap();
    c.set_read_timeout(Some(Duration::from_secs(30))).unwrap();
    let mut req = preface.to_vec();
    req.extend_from_slice(
        format!("GET /v1/models HTTP/1.1\r\nHost: x\r\nAuthorization: Bearer {}\r\nConnection: close\r\n\r\n", gw.key)
            .as_bytes(),
    );
    let _ = c.write_all(&req);
    let mut out = Vec::new();
    let _ = c.read_to_end(&mut out);
    String::from_utf8_lossy(&out).lines().next().unwrap_or_default().to_string()
}

#[tokio::test]
async fn the_proxy_protocol_names_the_client_and_a_connection_without_it_is_closed() {
    let mock = Mock::start();
    let gw = gateway(&mock, "  trusted_proxies: [\"127.0.0.1/32\"]\n  proxy_protocol: true\n");
    // `gw.key` was minted on the admin listener, which reads no PROXY header.
    assert_eq!(exchange(&gw, &proxy_v2([192, 0, 2, 44], 50_000)), "HTTP/1.1 200 OK");
    assert_eq!(exchange(&gw, b"PROXY TCP4 192.0.2.45 127.0.0.1 50001 443\r\n"), "HTTP/1.1 200 OK");
    log_with(&gw, &["client=192.0.2.44", "client=192.0.2.45"]);
    // HTTP without the header: not a request from the balancer; closed, nothing served.
    assert_eq!(exchange(&gw, b""), "");
    assert_eq!(exchange(&gw, b"PROXY TCP4 nonsense\r\n"), "");
}

#[tokio::test]
async fn the_proxy_protocol_is_refused_from_an_untrusted_sender() {
    let mock = Mock::start();
    let gw = gateway(&mock, "  trusted_proxies: [\"10.0.0.0/8\"]\n  proxy_protocol: true\n");
    assert_eq!(exchange(&gw, &proxy_v2([192, 0, 2, 44], 50_000)), "");
    assert!(!gw.log().contains("client=192.0.2.44"));
}
