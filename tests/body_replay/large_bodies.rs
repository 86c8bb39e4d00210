//! Large bodies, `Expect: 100-continue`, chunked uploads, keepalive reuse, pipelining and the size limit.

use super::*;

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
