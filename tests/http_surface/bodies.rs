//! Request bodies: JSON errors and missing fields, and the 3,500,000-byte limit.

use super::*;

#[tokio::test]
async fn invalid_json_and_missing_fields() {
    let mock = Mock::start();
    let gw = Gateway::start(&mock);
    let client = reqwest::Client::new();
    let r = client
        .post(gw.url("/v1/chat/completions"))
        .header("authorization", gw.bearer())
        .body("{not json")
        .send()
        .await
        .unwrap();
    let status = r.status().as_u16();
    let v: serde_json::Value = r.json().await.unwrap();
    assert_eq!((status, v["error"]["code"].as_str()), (400, Some("invalid_json")));

    let r = gw.post("/v1/chat/completions", &json!({"messages": []}), &[]).await;
    let v = r.assert_error(400, "missing_required_field");
    assert_eq!(v["error"]["param"], "model");

    let r = gw.post("/v1/chat/completions", &json!({"model": "chat-model"}), &[]).await;
    let v = r.assert_error(400, "missing_required_field");
    assert_eq!(v["error"]["param"], "messages");

    let r = gw.post("/v1/chat/completions", &json!({"model": "no-such-model", "messages": []}), &[]).await;
    let v = r.assert_error(404, "model_not_found");
    assert_eq!(v["error"]["param"], "model");
}

fn padded_body(total: usize) -> Vec<u8> {
    let head = br#"{"model":"chat-model","messages":[{"role":"user","content":"hi"}],"pad":""#;
    let tail = br#""}"#;
    let mut body = head.to_vec();
    body.resize(total - tail.len(), b'x');
    body.extend_from_slice(tail);
    body
}

#[tokio::test]
async fn body_limit_is_exactly_3_500_000_bytes() {
    let mock = Mock::start();
    let gw = Gateway::start(&mock);
    let client = reqwest::Client::new();
    let r = client
        .post(gw.url("/v1/chat/completions"))
        .header("authorization", gw.bearer())
        .header("content-type", "application/json")
        .body(padded_body(3_500_000))
        .send()
        .await
        .unwrap();
    assert_eq!(r.status().as_u16(), 200, "exactly 3,500,000 bytes are accepted");
    let r = client
        .post(gw.url("/v1/chat/completions"))
        .header("authorization", gw.bearer())
        .header("content-type", "application/json")
        .body(padded_body(3_500_001))
        .send()
        .await
        .unwrap();
    assert_eq!(r.status().as_u16(), 413);
    let v: serde_json::Value = r.json().await.unwrap();
    assert_eq!(v["error"]["code"], "payload_too_large");
    assert_eq!(v["error"]["type"], "invalid_request_error");

    // Chunked upload without a declared length: counted while streaming in.
    let body = padded_body(3_600_000);
    let stream = futures_stream(body);
    let r = client
        .post(gw.url("/v1/chat/completions"))
        .header("authorization", gw.bearer())
        .body(reqwest::Body::wrap_stream(stream))
        .send()
        .await;
    match r {
        Ok(r) => assert_eq!(r.status().as_u16(), 413),
        // The gateway may close before the whole upload is sent; then the 413 was still
        // written (checked on the raw socket in body_replay.rs).
        Err(e) => assert!(e.is_request() || e.is_body(), "{e}"),
    }
}

fn futures_stream(body: Vec<u8>) -> impl futures_core::Stream<Item = Result<Vec<u8>, std::io::Error>> {
    let chunks: Vec<Result<Vec<u8>, std::io::Error>> = body.chunks(64 * 1024).map(|c| Ok(c.to_vec())).collect();
    tokio_stream::iter(chunks)
}
