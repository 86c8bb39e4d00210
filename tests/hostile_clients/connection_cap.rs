//! The cap on open client connections: the oldest idle connection makes room.

use super::*;

/// A GET of `/v1/models` on `c`, kept alive; its whole answer (`Content-Length` framed).
fn models_on(c: &mut TcpStream, key: &str) -> String {
    c.write_all(format!("GET /v1/models HTTP/1.1\r\nHost: a\r\nAuthorization: Bearer {key}\r\n\r\n").as_bytes())
        .unwrap();
    c.set_read_timeout(Some(Duration::from_secs(20))).unwrap();
    let mut got = Vec::new();
    let mut buf = [0u8; 8192];
    loop {
        let text = String::from_utf8_lossy(&got).into_owned();
        if let Some((head, body)) = text.split_once("\r\n\r\n") {
            let len = head
                .lines()
                .find_map(|l| l.strip_prefix("content-length: ").or_else(|| l.strip_prefix("Content-Length: ")))
                .and_then(|v| v.trim().parse::<usize>().ok());
            if len.is_some_and(|n| body.len() >= n) {
                return text;
            }
        }
        match c.read(&mut buf) {
            Ok(0) | Err(_) => return text,
            Ok(n) => got.extend_from_slice(&buf[..n]),
        }
    }
}

/// Whether the gateway closed `c` (it reads the end within `wait`).
fn closed_by_gateway(c: &mut TcpStream, wait: Duration) -> bool {
    c.set_read_timeout(Some(wait)).unwrap();
    let mut buf = [0u8; 64];
    matches!(c.read(&mut buf), Ok(0))
}

/// What to build: a cap on open client connections, the oldest idle one closed first. With a
/// cap of 3: a connection idle after its answer is closed for a newer one before a connection
/// accepted later and still silent; with every connection busy, a new one is answered
/// `429 hosted_admission_congested` with the envelope. (The short pauses order the test's own
/// steps: the gateway marks a connection idle when it logged the answer the test just read.)
#[tokio::test]
async fn at_the_connection_cap_the_oldest_idle_connection_makes_room() {
    let mock = Mock::start();
    let gw =
        Gateway::start_with(&mock, Opts { extra_yaml: "client:\n  max_connections: 3\n".into(), ..Opts::default() });
    let pause = || std::thread::sleep(Duration::from_millis(300));
    // A: idle after an answer. B: a stream whose replica is silent (busy). C: accepted, silent.
    let mut a = TcpStream::connect(("127.0.0.1", gw.port)).unwrap();
    assert!(models_on(&mut a, &gw.key).starts_with("HTTP/1.1 200"));
    pause();
    let mut b = stream_request(&gw, "x-mock-ttft-ms: 60000\r\n");
    pause();
    let mut c = TcpStream::connect(("127.0.0.1", gw.port)).unwrap();
    pause();
    // D at the cap: A, idle the longest, makes room; C stays.
    let mut d = TcpStream::connect(("127.0.0.1", gw.port)).unwrap();
    assert!(models_on(&mut d, &gw.key).starts_with("HTTP/1.1 200"));
    assert!(closed_by_gateway(&mut a, Duration::from_secs(10)), "the oldest idle connection was closed");
    assert!(models_on(&mut c, &gw.key).starts_with("HTTP/1.1 200"), "a younger idle connection is kept");
    pause();
    // Streams on two new connections close D, then C; B was never touched.
    let mut e = stream_request(&gw, "x-mock-ttft-ms: 60000\r\n");
    let mut f = stream_request(&gw, "x-mock-ttft-ms: 60000\r\n");
    assert!(closed_by_gateway(&mut d, Duration::from_secs(10)));
    assert!(closed_by_gateway(&mut c, Duration::from_secs(10)));
    // All three busy: the next connection is refused with the envelope, and closed.
    let answer = gw.raw(b"GET /v1/models HTTP/1.1\r\nHost: a\r\n\r\n", Duration::from_secs(10));
    let (status, v) = status_and_body(&answer);
    assert_eq!((status, v["error"]["code"].as_str()), (429, Some("hosted_admission_congested")), "{answer}");
    assert!(answer.to_ascii_lowercase().contains("retry-after: 1"), "{answer}");
    for s in [&mut b, &mut e, &mut f] {
        assert!(!closed_by_gateway(s, Duration::from_millis(200)), "a busy connection is never closed for room");
    }
}
