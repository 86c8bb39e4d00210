//! Slow readers: a client that keeps reading gets its whole stream, one that stops is ended and billed.

use super::*;

/// A connection to `port` whose receive buffer is `rcvbuf` bytes (set before connecting, so
/// the window is that small), as a slow mobile client's.
fn connect_with_rcvbuf(port: u16, rcvbuf: i32) -> TcpStream {
    use std::os::fd::FromRawFd;
    // SAFETY: plain socket calls on a descriptor this function owns until it hands it to
    // `TcpStream`, which closes it.
    unsafe {
        let fd = libc::socket(libc::AF_INET, libc::SOCK_STREAM, 0);
        assert!(fd >= 0);
        let size = rcvbuf;
        let set = libc::setsockopt(
            fd,
            libc::SOL_SOCKET,
            libc::SO_RCVBUF,
            (&size as *const i32).cast(),
            std::mem::size_of::<i32>() as libc::socklen_t,
        );
        assert_eq!(set, 0);
        let addr = libc::sockaddr_in {
            sin_family: libc::AF_INET as libc::sa_family_t,
            sin_port: port.to_be(),
            sin_addr: libc::in_addr { s_addr: u32::from_be_bytes([127, 0, 0, 1]).to_be() },
            sin_zero: [0; 8],
        };
        let ok = libc::connect(
            fd,
            (&addr as *const libc::sockaddr_in).cast(),
            std::mem::size_of::<libc::sockaddr_in>() as libc::socklen_t,
        );
        assert_eq!(ok, 0);
        TcpStream::from_raw_fd(fd)
    }
}

/// A streamed chat request of `tokens` tokens on a gateway with a 3 s stall limit, read
/// `chunk` bytes at a time with `pause` between reads through a receive buffer of `rcvbuf`
/// bytes: the gateway (its log is checked by the caller), everything read, and how long it took.
fn read_slowly(tokens: u32, rcvbuf: i32, chunk: usize, pause: Duration) -> (Mock, Gateway, String, Duration) {
    read_slowly_within(tokens, rcvbuf, chunk, pause, 300.0)
}

/// [`read_slowly`] with a response budget of `response_seconds`.
fn read_slowly_within(
    tokens: u32,
    rcvbuf: i32,
    chunk: usize,
    pause: Duration,
    response_seconds: f64,
) -> (Mock, Gateway, String, Duration) {
    let mock = Mock::start();
    let gw = Gateway::start_with(
        &mock,
        Opts {
            extra_yaml: "client:\n  stalled_reader_seconds: 3\n".into(),
            response_seconds,
            first_token_seconds: response_seconds.min(30.0),
            ..Opts::default()
        },
    );
    let body = r#"{"model":"chat-model","stream":true,"messages":[{"role":"user","content":"hi"}]}"#;
    let mut c = connect_with_rcvbuf(gw.port, rcvbuf);
    let head = format!(
        "POST /v1/chat/completions HTTP/1.1\r\nHost: a\r\nAuthorization: Bearer {}\r\nx-mock-tokens: {tokens}\r\nContent-Type: application/json\r\nContent-Length: {}\r\n\r\n{body}",
        gw.key,
        body.len()
    );
    c.write_all(head.as_bytes()).unwrap();
    c.set_read_timeout(Some(Duration::from_secs(30))).unwrap();
    let (mut got, mut buf, started) = (Vec::new(), vec![0u8; chunk], Instant::now());
    while started.elapsed() < Duration::from_secs(240) {
        match c.read(&mut buf) {
            Ok(0) | Err(_) => break,
            Ok(n) => got.extend_from_slice(&buf[..n]),
        }
        if got.ends_with(b"0\r\n\r\n") {
            break;
        }
        std::thread::sleep(pause);
    }
    let text = String::from_utf8_lossy(&got).into_owned();
    (mock, gw, text, started.elapsed())
}

/// Finding 3: a client that keeps reading, however slowly, is never cut while the replica
/// produces: writes are timed by their progress, not each as a whole, and the kernel holds
/// little unsent for it (so a write is woken as the client reads, not once half a large
/// buffer drained). Here the client has an 8 KB receive buffer and reads 8 KB every 200 ms
/// (40 KB/s) of a 3,000-token stream (about 600 KB, more than the kernel would otherwise
/// buffer), with a stall limit of 3 s: a write is never left waiting that long.
#[tokio::test]
async fn a_slow_reader_gets_its_whole_stream() {
    let (_mock, gw, text, _) = read_slowly(3000, 8 * 1024, 8192, Duration::from_millis(200));
    assert!(text.contains("data: [DONE]"), "cut after {} bytes: {}", text.len(), gw.log());
    assert_eq!(text.matches("\"content\":\"tok").count(), 3000, "every token arrived");
    assert!(!gw.log().contains("client_gone"), "{}", gw.log());
}

/// Finding 3, at the rate the finding measured: a client reading 2 KB a second through a 2 KB
/// receive buffer gets its whole stream although that takes several times the stall limit (3 s
/// here; the finding's client was cut at the 60 s write timeout with no end frame). About 40 KB
/// over 20 s: every write waits on the client, none is cut.
#[tokio::test]
async fn a_client_reading_2_kb_a_second_gets_its_whole_stream() {
    let (_mock, gw, text, took) = read_slowly(200, 2 * 1024, 2048, Duration::from_secs(1));
    assert!(text.contains("data: [DONE]"), "cut after {} bytes: {}", text.len(), gw.log());
    assert_eq!(text.matches("\"content\":\"tok").count(), 200, "every token arrived");
    assert!(took > Duration::from_secs(6), "slower than twice the stall limit ({took:?})");
    assert!(!gw.log().contains("client_gone"), "{}", gw.log());
}

/// Clarification 19: a reader that keeps up is served for as long as the response budget
/// runs, not beyond it. A 20 MB stream read at 2 KB a second would take 2.7 hours, far past
/// the 740 s budget; such a stream ends at the budget with the timeout error frame (which the
/// slow client still reads) and is billed for what its connection took. Here the budget is
/// 10 s and the replica sends 20,000 tokens (about 3 MB) at once.
#[tokio::test]
async fn a_2_kb_a_second_reader_of_a_stream_longer_than_the_budget_is_told_at_the_budget() {
    let (_mock, gw, text, took) = read_slowly_within(20_000, 2 * 1024, 2048, Duration::from_secs(1), 10.0);
    assert!(!text.contains("data: [DONE]"), "a stream past its budget has no [DONE]");
    assert!(
        text.contains("hosted_inference_response_timeout"),
        "no timeout error frame after {} bytes in {took:?}: {}",
        text.len(),
        gw.log()
    );
    assert!(took >= Duration::from_secs(10), "ended before the budget ({took:?})");
    assert!(!gw.log().contains("client_gone"), "the reader was never cut as stalled: {}", gw.log());
    let read = text.matches("\"content\":\"tok").count() as i64;
    let (ledger, cost) = settled_cost(&gw);
    // chat-model's output price is $0.30 a million: 30 microcents a token. Billed for what the
    // connection took: at least what the client read, far less than the 20,000 produced.
    assert!(cost >= read * 30 && cost < 20_000 * 30 / 4, "billed {cost} microcents for {read} tokens read: {ledger}");
}

/// Finding 3: a client that stops reading is ended after the stall limit, billed for what its
/// connection took (what the kernel's socket buffers accepted, a few MB on loopback; not the
/// 200,000 tokens, about 30 MB, the replica would produce), and its concurrency slot is freed.
#[tokio::test]
async fn a_client_that_stops_reading_is_ended_billed_for_what_it_took_and_its_slot_freed() {
    let mock = Mock::start();
    let limits = "  workspace_concurrency: { free: 1, core: 1, enterprise: 1 }\n".to_string();
    let gw = Gateway::start_with(
        &mock,
        Opts { extra_yaml: "client:\n  stalled_reader_seconds: 2\n".into(), limits: Some(limits), ..Opts::default() },
    );
    let mut c = stream_request(&gw, "x-mock-tokens: 200000\r\n");
    let mut first = [0u8; 2048];
    c.set_read_timeout(Some(Duration::from_secs(10))).unwrap();
    let n = c.read(&mut first).unwrap();
    assert!(String::from_utf8_lossy(&first[..n]).starts_with("HTTP/1.1 200"));
    // Now it reads nothing more, and keeps the connection open.
    let ended = Instant::now();
    let deadline = Instant::now() + Duration::from_secs(60);
    while !gw.log().contains("client_gone") {
        assert!(Instant::now() < deadline, "the stalled client was never ended: {}", gw.log());
        tokio::time::sleep(Duration::from_millis(100)).await;
    }
    assert!(ended.elapsed() >= Duration::from_secs(2), "not before the stall limit");
    // Billed for what its connection took: a fraction of what the replica produced.
    let (ledger, cost) = settled_cost(&gw);
    let full = 200_000 * 30; // 200,000 output tokens at $0.30 a million, in microcents
    assert!(cost > 0 && cost < full / 2, "billed {cost} microcents, the whole stream is {full}: {ledger}");
    // The slot is free: the workspace's one slot takes the next request.
    let r = gw.post("/v1/chat/completions", &common::chat_body("chat-model", false), &[]).await;
    assert_eq!(r.status, 200, "{}", r.text);
    drop(c);
}

/// The settled ledger of `gw`'s workspace and the cost of its settlements, in microcents.
fn settled_cost(gw: &Gateway) -> (serde_json::Value, i64) {
    let ledger = gw.settled_ledger();
    let cost = ledger["entries"]
        .as_array()
        .unwrap()
        .iter()
        .filter(|e| e["kind"] == "settlement")
        .filter_map(|e| e["cost_microcents"].as_i64())
        .sum();
    (ledger, cost)
}
