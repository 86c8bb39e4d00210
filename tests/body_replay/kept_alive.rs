//! A kept-alive connection's later requests, forwarded without a replay (decision 192).

use super::*;

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
