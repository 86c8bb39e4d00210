//! What the parser refuses: the envelope on Pingora's refusals, oversized headers, a bare LF, a key in a path.

use super::*;

/// Finding 5: Pingora's own refusals (a head it cannot parse, `CONNECT`) had an empty body.
#[tokio::test]
async fn the_parsers_refusals_carry_the_envelope() {
    let mock = Mock::start();
    let gw = Gateway::start(&mock);
    let heads: [&[u8]; 5] = [
        b"POST /v1/chat/completions HTTP/1.1\r\nHost: a\r\nContent-Length: 5\r\nContent-Length: 6\r\n\r\nhello",
        b"GET /v1/models HTTP/1.1\r\nHost: a\r\nX-Folded: a\r\n b\r\n\r\n",
        b"GET /v1/models HTTP/1.1\r\nHost: a\r\nX-Nul: a\x00b\r\n\r\n",
        b"GET /v1/models\r\n\r\n",
        b"CONNECT 127.0.0.1:1 HTTP/1.1\r\nHost: a\r\n\r\n",
    ];
    for head in heads {
        let answer = exchange(&gw, head, Duration::from_secs(5));
        let (status, v) = status_and_body(&answer);
        assert!(matches!(status, 400 | 405), "{:?}: {answer}", String::from_utf8_lossy(head));
        let code = if status == 405 { "method_not_allowed" } else { "invalid_request" };
        assert_eq!(v["error"]["code"], code, "{answer}");
        assert_eq!(v["error"]["type"], "invalid_request_error", "{answer}");
        let rid = v["request_id"].as_str().unwrap_or_default().to_string();
        assert!(answer.to_ascii_lowercase().contains(&format!("x-request-id: {rid}")), "{answer}");
    }
    // Ten thousand headers: too many for the parser, answered the same way.
    let mut many = b"GET /v1/models HTTP/1.1\r\nHost: a\r\n".to_vec();
    for i in 0..10_000 {
        many.extend_from_slice(format!("X-H{i}: v\r\n").as_bytes());
    }
    many.extend_from_slice(b"\r\n");
    let (status, v) = status_and_body(&exchange(&gw, &many, Duration::from_secs(5)));
    assert_eq!((status, v["error"]["code"].as_str()), (400, Some("invalid_request")));
    assert_eq!(mock.stats().await["requests"], 0, "nothing reached the replica");
}

/// Finding 6: a header of 1,000,000 bytes (under the parser's own 1 MiB) is `431`, not
/// forwarded; so are more header lines than `client.max_headers`.
#[tokio::test]
async fn oversized_headers_are_431_and_never_reach_a_replica() {
    let mock = Mock::start();
    let gw = Gateway::start(&mock);
    let body = br#"{"model":"chat-model","messages":[{"role":"user","content":"hi"}]}"#;
    let big = "x".repeat(1_000_000);
    let head = format!(
        "POST /v1/chat/completions HTTP/1.1\r\nHost: a\r\nAuthorization: Bearer {}\r\nX-Big: {big}\r\nContent-Length: {}\r\n\r\n",
        gw.key,
        body.len()
    );
    let answer = exchange(&gw, &[head.as_bytes(), body].concat(), Duration::from_secs(10));
    let (status, v) = status_and_body(&answer);
    assert_eq!((status, v["error"]["code"].as_str()), (431, Some("request_header_fields_too_large")), "{answer}");
    let mut many = format!("POST /v1/chat/completions HTTP/1.1\r\nHost: a\r\nAuthorization: Bearer {}\r\n", gw.key);
    for i in 0..150 {
        many.push_str(&format!("X-H{i}: v\r\n"));
    }
    many.push_str(&format!("Content-Length: {}\r\n\r\n", body.len()));
    let (status, _) = status_and_body(&exchange(&gw, &[many.as_bytes(), body].concat(), Duration::from_secs(10)));
    assert_eq!(status, 431);
    // The messages dialect answers in its own envelope.
    let head = format!(
        "POST /v1/messages HTTP/1.1\r\nHost: a\r\nx-api-key: {}\r\nX-Big: {big}\r\nContent-Length: 2\r\n\r\n{{}}",
        gw.key
    );
    let (status, v) = status_and_body(&exchange(&gw, head.as_bytes(), Duration::from_secs(10)));
    assert_eq!((status, v["type"].as_str()), (431, Some("error")), "{v}");
    assert_eq!(mock.stats().await["requests"], 0, "nothing reached the replica");
}

/// Finding 7: a bare LF inside a chunk extension frames the body differently behind a proxy
/// that reads it as a line end; it is refused.
#[tokio::test]
async fn a_bare_lf_in_a_chunk_extension_is_refused() {
    let mock = Mock::start();
    let gw = Gateway::start(&mock);
    let body = r#"{"model":"chat-model","messages":[{"role":"user","content":"hi"}]}"#;
    let head = format!(
        "POST /v1/chat/completions HTTP/1.1\r\nHost: a\r\nAuthorization: Bearer {}\r\nTransfer-Encoding: chunked\r\n\r\n",
        gw.key
    );
    let smuggled = format!("{head}{:x};a=b\nX\r\n{body}\r\n0\r\n\r\n", body.len());
    let (status, v) = status_and_body(&exchange(&gw, smuggled.as_bytes(), Duration::from_secs(5)));
    assert_eq!((status, v["error"]["code"].as_str()), (400, Some("invalid_request")), "{v}");
    // The same body with a proper extension is served.
    let fine = format!("{head}{:x};a=b\r\n{body}\r\n0\r\n\r\n", body.len());
    let answer = exchange(&gw, fine.as_bytes(), Duration::from_secs(2));
    assert!(answer.starts_with("HTTP/1.1 200"), "{answer}");
    assert_eq!(mock.stats().await["requests"], 1);
}

/// Finding 8: an API key put in a URL path never reaches a log line.
#[tokio::test]
async fn a_key_in_a_path_is_not_logged() {
    let mock = Mock::start();
    let gw = Gateway::start_with(&mock, Opts { extra_yaml: "access_log:\n  format: json\n".into(), ..Opts::default() });
    let text = Gateway::start(&mock);
    for g in [&gw, &text] {
        let r = g.get(&format!("/v1/models/{}", g.key)).await;
        assert_eq!(r.status, 404, "{}", r.text);
        let r = g.get(&format!("/v1/{}/chat/completions", g.key)).await;
        assert!(r.status >= 400, "{}", r.text);
    }
    std::thread::sleep(Duration::from_millis(300));
    for g in [&gw, &text] {
        let log = g.log();
        let secret = &g.key["rp_".len()..];
        assert!(!log.contains(secret), "a key reached the log: {log}");
        assert!(log.contains("rp_[redacted]"), "{log}");
    }
}
