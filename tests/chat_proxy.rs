//! Chat completions through the gateway against the mock replica: the request rewrite, the
//! response normalisation and Usage object, streaming, and every upstream failure path.
#![allow(clippy::unwrap_used, clippy::expect_used, clippy::panic)]

mod common;

use common::*;
use serde_json::{Value, json};

#[tokio::test]
async fn non_streaming_usage_object_and_cost_with_cached_tier() {
    let mock = Mock::start();
    let gw = Gateway::start(&mock);
    let r = gw
        .post(
            "/v1/chat/completions",
            &chat_body("chat-model", false),
            &[("x-mock-prompt-tokens", "1000"), ("x-mock-cached-tokens", "400"), ("x-mock-tokens", "100")],
        )
        .await;
    assert_eq!(r.status, 200, "{}", r.text);
    let v = r.json();
    assert_eq!(v["object"], "chat.completion");
    assert_eq!(v["model"], "chat-model", "the catalog id, not the upstream name");
    let u = &v["usage"];
    assert_eq!(u["prompt_tokens"], 1000);
    assert_eq!(u["completion_tokens"], 100);
    assert_eq!(u["total_tokens"], 1100);
    assert_eq!(u["prompt_tokens_details"]["cached_tokens"], 400);
    assert_eq!(u["service"]["cached_input_tokens"], 400);
    // 600 x $0.10 + 400 x $0.05 + 100 x $0.30 per Mtok = 11,000 microcents.
    assert_eq!(u["service"]["cost_microcents"], 11_000);
    assert!(r.text.contains("\"cost\":0.00011000"), "eight decimals: {}", r.text);
    assert!(u["service"].get("output_token_accounting").is_none());
    assert!(r.header("content-length").is_none() || r.header("transfer-encoding").is_none());
}

#[tokio::test]
async fn shared_cache_hits_are_reported_zero_and_priced_uncached() {
    let mock = Mock::start();
    let gw = Gateway::start(&mock);
    let r = gw
        .post(
            "/v1/chat/completions",
            &chat_body("shared-cache-model", false),
            &[("x-mock-prompt-tokens", "1000"), ("x-mock-cached-tokens", "400"), ("x-mock-tokens", "10")],
        )
        .await;
    let u = &r.json()["usage"];
    assert_eq!(u["prompt_tokens_details"]["cached_tokens"], 0);
    // 1000 x $1 + 10 x $2 per Mtok = 102,000 microcents.
    assert_eq!(u["service"]["cost_microcents"], 102_000);
}

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

#[tokio::test]
async fn reasoning_is_never_on_content_and_no_answer_is_annotated() {
    let mock = Mock::start();
    let gw = Gateway::start(&mock);
    let mut b = chat_body("chat-model", false);
    b["max_tokens"] = json!(4);
    // All four tokens are reasoning: the budget ran out before any answer.
    let r = gw.post("/v1/chat/completions", &b, &[("x-mock-reasoning", "10"), ("x-mock-tokens", "10")]).await;
    let v = r.json();
    let choice = &v["choices"][0];
    assert!(choice["message"]["reasoning"].as_str().unwrap().starts_with("think0"));
    assert!(choice["message"].get("reasoning_content").is_none());
    assert!(choice["message"]["content"].is_null());
    assert_eq!(choice["finish_reason"], "length");
    assert_eq!(choice["service"]["output_status"]["code"], "generation_limit_reached_before_answer");
    let acc = &v["usage"]["service"]["output_token_accounting"];
    assert_eq!(acc["visible_answer_tokens"], 0);
    assert_eq!(acc["non_answer_completion_tokens"], 4);
    assert_eq!(acc["sources"]["visible_answer_tokens"], "proxy_classified");
    assert_eq!(acc["sources"]["non_answer_completion_tokens"], "provider_reported");

    // With an answer: no output_status, reasoning separate from content.
    let r = gw
        .post(
            "/v1/chat/completions",
            &chat_body("chat-model", false),
            &[("x-mock-reasoning", "2"), ("x-mock-tokens", "5")],
        )
        .await;
    let v = r.json();
    assert_eq!(v["choices"][0]["message"]["reasoning"], "think0 think1 ");
    assert_eq!(v["choices"][0]["message"]["content"], "tok2 tok3 tok4 ");
    assert!(v["choices"][0].get("service").is_none());

    // A tool call is an answer.
    let r =
        gw.post("/v1/chat/completions", &chat_body("chat-model", false), &[("x-mock-tool-call", "get_weather")]).await;
    let v = r.json();
    assert_eq!(v["choices"][0]["finish_reason"], "tool_calls");
    assert!(v["choices"][0].get("service").is_none());
}

fn parse_frames(r: &Reply) -> (Vec<Value>, bool) {
    let data = r.sse_data();
    let done = data.last().is_some_and(|d| d == "[DONE]");
    let frames = data.iter().filter(|d| *d != "[DONE]").map(|d| serde_json::from_str(d).unwrap()).collect();
    (frames, done)
}

#[tokio::test]
async fn streaming_forwards_usage_only_when_asked() {
    let mock = Mock::start();
    let gw = Gateway::start(&mock);
    let r = gw
        .post(
            "/v1/chat/completions",
            &chat_body("chat-model", true),
            &[("x-mock-tokens", "5"), ("x-mock-reasoning", "2")],
        )
        .await;
    assert_eq!(r.status, 200);
    assert!(r.header("content-type").unwrap().starts_with("text/event-stream"));
    assert_eq!(r.header("cache-control").as_deref(), Some("no-cache"));
    let (frames, done) = parse_frames(&r);
    assert!(done, "ends with [DONE]");
    assert!(frames.iter().all(|f| f.get("usage").is_none()), "no usage frame unless asked");
    assert!(frames.iter().all(|f| f["model"] == "chat-model"));
    assert!(!r.text.contains("reasoning_content"));
    let reasoning: String = frames.iter().filter_map(|f| f["choices"][0]["delta"]["reasoning"].as_str()).collect();
    let content: String = frames.iter().filter_map(|f| f["choices"][0]["delta"]["content"].as_str()).collect();
    assert_eq!(reasoning, "think0 think1 ");
    assert_eq!(content, "tok2 tok3 tok4 ");

    let mut b = chat_body("chat-model", true);
    b["stream_options"] = json!({"include_usage": true});
    let r = gw.post("/v1/chat/completions", &b, &[("x-mock-tokens", "5"), ("x-mock-prompt-tokens", "20")]).await;
    let (frames, done) = parse_frames(&r);
    assert!(done);
    let usage = frames.iter().find(|f| f.get("usage").is_some()).expect("usage frame");
    assert_eq!(usage["choices"], json!([]));
    assert_eq!(usage["usage"]["completion_tokens"], 5);
    assert_eq!(usage["usage"]["prompt_tokens_details"]["cached_tokens"], 0);
    // 20 x 0.10 + 5 x 0.30 = 3.5 microdollars = 350 microcents.
    assert_eq!(usage["usage"]["service"]["cost_microcents"], 350);
}

#[tokio::test]
async fn frames_split_anywhere_come_out_the_same() {
    let mock = Mock::start();
    let gw = Gateway::start(&mock);
    let mut b = chat_body("chat-model", true);
    b["stream_options"] = json!({"include_usage": true});
    let whole = gw.post("/v1/chat/completions", &b, &[("x-mock-tokens", "8")]).await;
    let split = gw.post("/v1/chat/completions", &b, &[("x-mock-tokens", "8"), ("x-mock-split", "7")]).await;
    let strip = |r: &Reply| -> Vec<Value> {
        parse_frames(r)
            .0
            .into_iter()
            .map(|mut f| {
                f["id"] = json!("");
                f["created"] = json!(0);
                f
            })
            .collect()
    };
    assert_eq!(strip(&whole), strip(&split));
    assert!(parse_frames(&split).1);
}

#[tokio::test]
async fn no_answer_stream_gets_annotated_usage_frame_regardless() {
    let mock = Mock::start();
    let gw = Gateway::start(&mock);
    let mut b = chat_body("chat-model", true);
    b["max_tokens"] = json!(3);
    let r = gw.post("/v1/chat/completions", &b, &[("x-mock-reasoning", "10"), ("x-mock-tokens", "10")]).await;
    let (frames, done) = parse_frames(&r);
    assert!(done);
    let terminal = frames.iter().find(|f| f["choices"][0]["finish_reason"] == "length").expect("terminal frame");
    assert_eq!(terminal["choices"][0]["service"]["output_status"]["code"], "generation_limit_reached_before_answer");
    let usage = frames.iter().find(|f| f.get("usage").is_some()).expect("annotated usage frame");
    assert_eq!(usage["usage"]["service"]["output_token_accounting"]["non_answer_completion_tokens"], 3);
}

#[tokio::test]
async fn mid_stream_failures_end_with_one_error_frame_and_no_done() {
    let mock = Mock::start();
    let gw = Gateway::start(&mock);
    // The replica resets the connection after two tokens.
    let r = gw.post("/v1/chat/completions", &chat_body("chat-model", true), &[("x-mock-abort-after", "2")]).await;
    assert_eq!(r.status, 200);
    let (frames, done) = parse_frames(&r);
    assert!(!done, "{}", r.text);
    let last = frames.last().unwrap();
    assert_eq!(last["error"]["code"], "upstream_error", "{}", r.text);
    assert_eq!(frames.iter().filter(|f| f.get("error").is_some()).count(), 1);
    assert!(frames.iter().any(|f| f["choices"][0]["delta"]["content"] == "tok0 "));

    // The replica ends cleanly without [DONE], after its usage frame: the error frame ends the
    // stream, and the usage frame (priced, asked for) is not forwarded: an errored stream
    // never quotes a cost.
    let mut asked = chat_body("chat-model", true);
    asked["stream_options"] = json!({"include_usage": true});
    let r = gw.post("/v1/chat/completions", &asked, &[("x-mock-no-done", "1")]).await;
    let (frames, done) = parse_frames(&r);
    assert!(!done);
    assert_eq!(frames.last().unwrap()["error"]["code"], "upstream_stream_error");
    assert_eq!(frames.last().unwrap()["error"]["type"], "api_error");
    assert!(frames.iter().all(|f| f.get("usage").is_none()), "{}", r.text);
    // The same request with its [DONE]: the priced usage frame comes right before it.
    let r = gw.post("/v1/chat/completions", &asked, &[]).await;
    let (frames, done) = parse_frames(&r);
    assert!(done, "{}", r.text);
    assert!(frames.last().unwrap()["usage"]["cost"].is_number(), "{}", r.text);
}

#[tokio::test]
async fn upstream_http_failures_map_to_the_catalogue() {
    let mock = Mock::start();
    let gw = Gateway::start(&mock);
    let r = gw
        .post(
            "/v1/chat/completions",
            &chat_body("chat-model", false),
            &[("x-mock-status", "500"), ("x-mock-retry-after", "7")],
        )
        .await;
    r.assert_error(502, "upstream_http_error");
    assert_eq!(r.header("retry-after").as_deref(), Some("7"), "the replica's Retry-After is forwarded");
    let r = gw.post("/v1/chat/completions", &chat_body("chat-model", false), &[("x-mock-status", "503")]).await;
    r.assert_error(502, "upstream_http_error");
    assert!(r.header("retry-after").is_none());
    let r = gw.post("/v1/chat/completions", &chat_body("chat-model", true), &[("x-mock-status", "500")]).await;
    r.assert_error(502, "upstream_http_error");

    let refused = [("x-mock-status", "400"), ("x-mock-retry-after", "3")];
    let r = gw.post("/v1/chat/completions", &chat_body("chat-model", false), &refused).await;
    let v = r.assert_error(400, "upstream_error");
    assert_eq!(v["error"]["type"], "invalid_request_error");
    assert!(v["error"]["message"].as_str().unwrap().contains("mock failure"));
    assert!(r.header("retry-after").is_none(), "a 400 needs a changed request and carries no retry timing");
    // A refusal of the gateway itself (a replica's 401, 404, ...) is not the request's fault
    // (decision 181): the server side failed, streamed or not.
    for (status, stream) in [("404", false), ("401", true), ("403", false)] {
        let r = gw.post("/v1/chat/completions", &chat_body("chat-model", stream), &[("x-mock-status", status)]).await;
        let v = r.assert_error(502, "upstream_error");
        assert!(v["error"]["message"].as_str().unwrap().contains(&format!("HTTP {status}")), "{v}");
    }
    // A full replica is a capacity refusal the client may wait out, streamed or not.
    for stream in [false, true] {
        let full = [("x-mock-status", "429"), ("x-mock-retry-after", "3")];
        let r = gw.post("/v1/chat/completions", &chat_body("chat-model", stream), &full).await;
        let v = r.assert_error(429, "hosted_model_at_capacity");
        assert_eq!(v["error"]["type"], "rate_limit_error");
        assert_eq!(r.header("retry-after").as_deref(), Some("3"), "the replica's wait");
    }
    let r = gw.post("/v1/chat/completions", &chat_body("chat-model", false), &[("x-mock-status", "429")]).await;
    r.assert_error(429, "hosted_model_at_capacity");
    assert_eq!(r.header("retry-after").as_deref(), Some("1"));

    // Nothing listens on either replica of dead-model.
    let r = gw.post("/v1/chat/completions", &chat_body("dead-model", false), &[]).await;
    r.assert_error(503, "upstream_error");
    assert!(r.header("retry-after").is_some());
}

#[tokio::test]
async fn a_replica_that_refuses_connections_is_skipped() {
    let mock = Mock::start();
    let dead = format!("127.0.0.1:{}", closed_port());
    let gw = Gateway::start_with(&mock, Opts { chat_replicas: vec![dead, mock.addr()], ..Opts::default() });
    for _ in 0..4 {
        let r = gw.post("/v1/chat/completions", &chat_body("chat-model", false), &[]).await;
        assert_eq!(r.status, 200, "{}", r.text);
    }
}

#[tokio::test]
async fn full_replicas_answer_hosted_model_at_capacity() {
    let mock = Mock::start();
    let gw = Gateway::start(&mock);
    let url = gw.url("/v1/chat/completions");
    let bearer = gw.bearer();
    let hold = tokio::spawn(async move {
        reqwest::Client::new()
            .post(url)
            .header("authorization", bearer)
            .header("x-mock-ttft-ms", "1500")
            .json(&chat_body("tiny-pool-model", false))
            .send()
            .await
            .map(|r| r.status().as_u16())
    });
    tokio::time::sleep(std::time::Duration::from_millis(400)).await;
    let r = gw.post("/v1/chat/completions", &chat_body("tiny-pool-model", false), &[]).await;
    let v = r.assert_error(429, "hosted_model_at_capacity");
    assert_eq!(v["error"]["type"], "rate_limit_error");
    assert!(v["error"].get("limit").is_none());
    assert!(r.header("x-hosted-limit-scope").is_none());
    assert_eq!(hold.await.unwrap().unwrap(), 200);
    // The slot is released when the first request ends.
    let r = gw.post("/v1/chat/completions", &chat_body("tiny-pool-model", false), &[]).await;
    assert_eq!(r.status, 200);
}

#[tokio::test]
async fn response_budget_gives_504_and_first_token_budget_an_error_frame() {
    let mock = Mock::start();
    let gw = Gateway::start_with(&mock, Opts { response_seconds: 1.0, first_token_seconds: 0.5, ..Opts::default() });
    let t = std::time::Instant::now();
    let r = gw.post("/v1/chat/completions", &chat_body("chat-model", false), &[("x-mock-hang", "1")]).await;
    let v = r.assert_error(504, "hosted_inference_response_timeout");
    assert!(v["error"]["message"].as_str().unwrap().contains("set `stream: true`"), "{v}");
    assert!(r.header("retry-after").is_none());
    assert!(t.elapsed().as_secs_f64() < 5.0, "cut at the budget, not a read timeout");

    let r = gw.post("/v1/chat/completions", &chat_body("chat-model", true), &[("x-mock-ttft-ms", "3000")]).await;
    assert_eq!(r.status, 200);
    let (frames, done) = parse_frames(&r);
    assert!(!done);
    assert_eq!(frames.last().unwrap()["error"]["code"], "hosted_inference_response_timeout", "{}", r.text);
    // A stream is never told to stream (decision 185).
    let message = frames.last().unwrap()["error"]["message"].as_str().unwrap().to_string();
    assert!(!message.contains("stream: true") && message.contains("max_tokens"), "{message}");

    // A stream that keeps producing past the whole-response budget is cut too.
    let r = gw
        .post(
            "/v1/chat/completions",
            &chat_body("chat-model", true),
            &[("x-mock-tokens", "100"), ("x-mock-token-delay-ms", "50")],
        )
        .await;
    let (frames, done) = parse_frames(&r);
    assert!(!done);
    assert_eq!(frames.last().unwrap()["error"]["code"], "hosted_inference_response_timeout");
}

#[tokio::test]
async fn a_malformed_non_streamed_body_is_a_clean_502() {
    let mock = Mock::start();
    let gw = Gateway::start(&mock);
    // The answer is held until its body is judged (src/transport/held_output.rs), so the status can
    // still change: never `not json{`, never a 200.
    let r = gw.post("/v1/chat/completions", &chat_body("chat-model", false), &[("x-mock-malformed", "1")]).await;
    r.assert_error(502, "upstream_error");
    // The gateway still serves the next request.
    let ok = gw.post("/v1/chat/completions", &chat_body("chat-model", false), &[]).await;
    assert_eq!(ok.status, 200);
}

#[tokio::test]
async fn a_replica_that_refuses_a_connection_is_ejected_and_a_pool_without_one_answers_at_once() {
    let mock = Mock::start();
    let dead = format!("127.0.0.1:{}", closed_port());
    let gw = Gateway::start_with(&mock, Opts { chat_replicas: vec![dead.clone(), mock.addr()], ..Opts::default() });
    // Sixteen conversations: some prefer the dead replica; only the first of those finds out.
    for i in 0..16 {
        let mut b = chat_body("chat-model", false);
        b["messages"][0]["content"] = serde_json::json!(format!("conversation {i}"));
        let r = gw.post("/v1/chat/completions", &b, &[]).await;
        assert_eq!(r.status, 200, "{}", r.text);
    }
    let ejections = gw.log().matches(&format!("replica {dead} of chat-model ejected for 10 s (refused")).count();
    assert_eq!(ejections, 1, "ejected once, then skipped: {}", gw.log());
    let text = gw.metrics().await;
    assert!(text.contains(&format!("tollgate_replica_up{{model=\"chat-model\",replica=\"{dead}\"}} 0")), "{text}");

    // Both replicas of dead-model refuse: the first request finds out, the next is answered
    // at once without a connection attempt.
    gw.post("/v1/chat/completions", &chat_body("dead-model", false), &[]).await.assert_error(503, "upstream_error");
    let before = gw.log().matches("refused a connection").count();
    let started = std::time::Instant::now();
    let r = gw.post("/v1/chat/completions", &chat_body("dead-model", false), &[]).await;
    r.assert_error(503, "upstream_error");
    assert!(r.header("retry-after").is_some());
    assert!(
        started.elapsed() < std::time::Duration::from_secs(2),
        "answered at once (a generous bound; the log check below is exact)"
    );
    assert_eq!(gw.log().matches("refused a connection").count(), before, "no replica was tried");
}
