//! Slow senders: bodies pin only what arrived and are cut at their deadline, trickled heads, idle connections.

use super::*;

/// Finding 1: a body's buffer grows with the bytes that arrived, and bodies being read share
/// a node-wide budget: with a budget of 8 MB, connections declaring 3.5 MB bodies and sending
/// a little at a time all stay open (nothing was pinned for what they declared), and once the
/// bytes that arrived pass the budget the next chunk is shed with `429`.
#[tokio::test]
async fn slow_bodies_pin_only_what_arrived_and_share_a_budget() {
    let mock = Mock::start();
    let gw = Gateway::start_with(
        &mock,
        Opts { extra_yaml: "client:\n  body_buffer_budget_bytes: 8000000\n".into(), ..Opts::default() },
    );
    let rss = || rss_kb(gw.pid());
    let before = rss();
    let head = format!(
        "POST /v1/chat/completions HTTP/1.1\r\nHost: a\r\nAuthorization: Bearer {}\r\nContent-Length: 3500000\r\n\r\n{{\"model\": ",
        gw.key
    );
    let mut conns: Vec<TcpStream> = (0..200)
        .map(|_| {
            let mut c = TcpStream::connect(("127.0.0.1", gw.port)).unwrap();
            c.write_all(head.as_bytes()).unwrap();
            c
        })
        .collect();
    std::thread::sleep(Duration::from_secs(2));
    let grown = rss().saturating_sub(before);
    // 200 × 3.5 MB declared would be 700 MB; what arrived is a few bytes each.
    assert!(grown < 150_000, "RSS grew {grown} kB for 200 slow bodies");
    // Now push real bytes on three connections: two bodies of 3.4 MB fit the budget together,
    // a third does not: exactly one is shed (its share is given back, so the others stay).
    let chunk = vec![b' '; 3_400_000];
    let writers: Vec<_> = conns
        .drain(..3)
        .map(|mut c| {
            let chunk = chunk.clone();
            std::thread::spawn(move || {
                c.set_write_timeout(Some(Duration::from_secs(10))).unwrap();
                let _ = c.write_all(&chunk);
                c
            })
        })
        .collect();
    let _pushed: Vec<TcpStream> = writers.into_iter().map(|w| w.join().unwrap()).collect();
    let shed = |m: &str| {
        m.lines()
            .filter(|l| l.starts_with("tollgate_admission_refusals_total") && l.contains("gate=\"body_budget\""))
            .filter_map(|l| l.rsplit(' ').next()?.parse::<f64>().ok())
            .sum::<f64>()
    };
    let deadline = Instant::now() + Duration::from_secs(10);
    let mut m = gw.metrics().await;
    while shed(&m) < 1.0 && Instant::now() < deadline {
        tokio::time::sleep(Duration::from_millis(100)).await;
        m = gw.metrics().await;
    }
    assert_eq!(shed(&m), 1.0, "one body shed: {m}");
    assert!(gw.log().contains("request bodies being read hold the node's budget"), "{}", gw.log());
    drop(conns);
}

/// Finding 2 (body): a body that stops arriving is answered `408` at its deadline.
#[tokio::test]
async fn a_body_that_stops_arriving_is_408_at_its_deadline() {
    let mock = Mock::start();
    let gw = Gateway::start_with(
        &mock,
        Opts { extra_yaml: "client:\n  body_timeout_seconds: 2\n".into(), ..Opts::default() },
    );
    let mut c = TcpStream::connect(("127.0.0.1", gw.port)).unwrap();
    let head = format!(
        "POST /v1/chat/completions HTTP/1.1\r\nHost: a\r\nAuthorization: Bearer {}\r\nContent-Length: 100\r\n\r\n{{\"mo",
        gw.key
    );
    c.write_all(head.as_bytes()).unwrap();
    let started = Instant::now();
    c.set_read_timeout(Some(Duration::from_secs(30))).unwrap();
    let mut answer = String::new();
    let _ = c.read_to_string(&mut answer);
    let (status, v) = status_and_body(&answer);
    assert_eq!((status, v["error"]["code"].as_str()), (408, Some("request_timeout")), "{answer}");
    assert!(started.elapsed() >= Duration::from_secs(2), "not before its deadline");
}

/// The resident set of process `pid`, in kB.
fn rss_kb(pid: u32) -> u64 {
    let status = std::fs::read_to_string(format!("/proc/{pid}/status")).unwrap();
    status
        .lines()
        .find_map(|l| l.strip_prefix("VmRSS:"))
        .and_then(|v| v.trim().trim_end_matches("kB").trim().parse().ok())
        .unwrap_or(0)
}

/// Finding 2 (head, idle): a head sent a few bytes at a time (each read well within the
/// per-read timeout) is answered `408` with the envelope at its deadline, and a kept-alive
/// connection left idle is closed after the idle timeout.
#[tokio::test]
async fn a_trickled_head_is_408_at_its_deadline_and_an_idle_connection_closes() {
    let mock = Mock::start();
    let gw = Gateway::start_with(
        &mock,
        Opts {
            extra_yaml: "client:\n  head_timeout_seconds: 2\n  idle_timeout_seconds: 2\n".into(),
            ..Opts::default()
        },
    );
    let mut c = TcpStream::connect(("127.0.0.1", gw.port)).unwrap();
    c.set_read_timeout(Some(Duration::from_millis(400))).unwrap();
    let started = Instant::now();
    let _ = c.write_all(b"GET /v1/models HTTP/1.1\r\nHost: a\r\n");
    let mut answer = Vec::new();
    let mut buf = [0u8; 4096];
    while started.elapsed() < Duration::from_secs(30) {
        match c.read(&mut buf) {
            Ok(0) => break,
            Ok(n) => answer.extend_from_slice(&buf[..n]),
            Err(_) => {
                let _ = c.write_all(b"X-Slow: a\r\n"); // one more line every 400 ms
            }
        }
    }
    let answer = String::from_utf8_lossy(&answer).into_owned();
    let (status, v) = status_and_body(&answer);
    assert_eq!((status, v["error"]["code"].as_str()), (408, Some("request_timeout")), "{answer}");
    assert!(started.elapsed() >= Duration::from_secs(2), "not before its deadline");
    assert!(started.elapsed() < Duration::from_secs(30), "closed, not held open by the per-read timeout");

    // A kept-alive connection that stays idle after its answer is closed.
    let mut c = TcpStream::connect(("127.0.0.1", gw.port)).unwrap();
    c.write_all(format!("GET /v1/models HTTP/1.1\r\nHost: a\r\nAuthorization: Bearer {}\r\n\r\n", gw.key).as_bytes())
        .unwrap();
    c.set_read_timeout(Some(Duration::from_secs(30))).unwrap();
    let idle_from = Instant::now();
    let mut all = Vec::new();
    loop {
        match c.read(&mut buf) {
            Ok(0) | Err(_) => break,
            Ok(n) => all.extend_from_slice(&buf[..n]),
        }
    }
    let all = String::from_utf8_lossy(&all);
    assert!(all.starts_with("HTTP/1.1 200") && all.contains("keep-alive"), "{all}");
    let idle = idle_from.elapsed();
    assert!(idle >= Duration::from_secs(2) && idle < Duration::from_secs(30), "closed after {idle:?} idle");
}
