//! The request rewrite for the replica: forwarded members, and the refused candidate and cache parameters.

use super::*;

#[tokio::test]
async fn request_rewrite_for_the_replica() {
    let mock = Mock::start();
    let gw = Gateway::start(&mock);
    let body = json!({
        "model": "org/Chat-Model-7B",
        "messages": [{"role": "user", "content": "hi"}],
        "temperature": 0.5, "top_p": 0.9, "seed": 7, "user": "u1",
        "top_k": 5, "prompt_cache_key": "k", "guided_json": {}, "max_output_tokens": 3,
        "service": {"sessionId": "s"}, "num_beams": 2,
    });
    let r = gw
        .post(
            "/v1/chat/completions",
            &body,
            &[("accept-encoding", "gzip"), ("x-api-key", "rp_not_forwarded_either"), ("cookie", "a=1")],
        )
        .await;
    assert_eq!(r.status, 200, "{}", r.text);
    let seen = mock.last_request().await;
    let b = &seen["body"];
    assert_eq!(b["model"], "org/Chat-Model-7B");
    assert_eq!(b["temperature"], 0.5);
    assert_eq!(b["top_p"], 0.9);
    assert_eq!(b["seed"], 7);
    assert_eq!(b["user"], "u1");
    for dropped in
        ["top_k", "prompt_cache_key", "guided_json", "max_output_tokens", "service", "num_beams", "stream_options"]
    {
        assert!(b.get(dropped).is_none(), "{dropped} must not reach the replica");
    }
    let h = &seen["headers"];
    assert!(h.get("authorization").is_none(), "the client's key never reaches the replica");
    assert!(h.get("accept-encoding").is_none());
    for kept_back in ["x-api-key", "cookie"] {
        assert!(h.get(kept_back).is_none(), "{kept_back} must not reach the replica: {h}");
    }
    assert!(h.get("content-type").is_some(), "the other headers go on: {h}");

    // Streams always ask the replica for usage.
    let mut sbody = chat_body("chat-model", true);
    sbody["stream_options"] = json!({"include_usage": false});
    gw.post("/v1/chat/completions", &sbody, &[]).await;
    let seen = mock.last_request().await;
    assert_eq!(seen["body"]["stream_options"]["include_usage"], true);
}

/// Through the binary: the replica reads the client's own text for the members the gateway
/// leaves alone (decision 199), numbers as written and a repeated member's last value.
#[tokio::test]
async fn untouched_members_reach_the_replica_as_the_client_wrote_them() {
    let mock = Mock::start();
    let gw = Gateway::start(&mock);
    let text = r#"{"temperature": 1.0, "model": "org/Chat-Model-7B", "seed": 18446744073709551616,
        "messages": [ {"role": "user", "content": "caf\u00e9"} ], "n": 2, "top_k": 5, "n": 1}"#;
    let r = reqwest::Client::new()
        .post(gw.url("/v1/chat/completions"))
        .header("authorization", gw.bearer())
        .header("content-type", "application/json")
        .body(text)
        .send()
        .await
        .unwrap();
    assert_eq!(r.status(), 200, "{}", r.text().await.unwrap_or_default());
    let seen = mock.last_request().await;
    let raw = seen["raw_body"].as_str().unwrap_or_default();
    assert!(raw.starts_with(r#"{"model":"org/Chat-Model-7B","temperature":1.0,"seed":18446744073709551616,"#), "{raw}");
    assert!(raw.contains(r#""messages":[ {"role": "user", "content": "caf\u00e9"} ]"#), "copied as sent: {raw}");
    assert!(raw.ends_with(r#","n":1}"#) && !raw.contains(r#""n":2"#) && !raw.contains("top_k"), "{raw}");
    assert_eq!(seen["body"]["messages"][0]["content"], "café");
}

#[tokio::test]
async fn candidate_count_and_unsupported_cache_parameters() {
    let mock = Mock::start();
    let gw = Gateway::start(&mock);
    let mut b = chat_body("chat-model", false);
    b["n"] = json!(5);
    let v = gw.post("/v1/chat/completions", &b, &[]).await.assert_error(400, "generation_count");
    assert_eq!(v["error"]["param"], "n");
    let mut b = chat_body("chat-model", false);
    b["prompt_cache_retention"] = json!("24h");
    let v = gw.post("/v1/chat/completions", &b, &[]).await.assert_error(400, "hosted_parameter_not_supported");
    assert_eq!(v["error"]["param"], "prompt_cache_retention");
    let mut b = chat_body("chat-model", false);
    b["messages"] = json!([{"role": "wizard", "content": "x"}]);
    let v = gw.post("/v1/chat/completions", &b, &[]).await.assert_error(400, "invalid_request");
    assert_eq!(v["error"]["param"], "messages[0].role");
    assert_eq!(mock.stats().await["requests"], 0);
}
