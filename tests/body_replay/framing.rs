//! Request framing on every inference route, pipelined requests, and `Connection: close`.

use super::*;

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
