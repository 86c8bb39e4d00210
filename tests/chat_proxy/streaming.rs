//! Streaming: usage frames only when asked, frames split anywhere, mid-stream failures' error frame.

use super::*;

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
