//! Tests of the one response pipeline (`response.rs`, `stream.rs`, `account.rs`,
//! `edits.rs`). Each chat case also runs through the plain `Value` reference
//! (`pipeline_reference.rs`): the output must be the same JSON and the request must end in the
//! same state. The dialect cases check that a registered translator gets the typed answer.
use std::sync::Arc;

use bytes::{Bytes, BytesMut};
use serde_json::Value;

use super::pipeline_reference as reference;
use super::response::rewrite;
use super::stream::on_frame;
use tollgate::config::Config;
use tollgate::http::sse::data_payload;
use tollgate::proxy::ctx::RequestCtx;

pub(super) const UP: &str = "meta-llama/Llama-3.1-8B-Instruct";

pub(super) fn ctx() -> RequestCtx {
    static CONFIG: std::sync::OnceLock<Arc<Config>> = std::sync::OnceLock::new();
    let config = CONFIG
        .get_or_init(|| {
            // The bench's configuration: one model served under another name.
            let dir = std::env::temp_dir().join(format!("tollgate-raw-test-{}", std::process::id()));
            std::fs::create_dir_all(&dir).unwrap();
            std::fs::write(
                dir.join("models.yaml"),
                "models:\n  - id: llama-3.1-8b-instruct\n    display_name: L\n    created: 1721692800\n    \
                 supported_endpoints: [chat_completions]\n    max_output_tokens: 8192\n    \
                 context_window: 131072\n    pricing: { input: 0.10, output: 0.30 }\n",
            )
            .unwrap();
            std::fs::write(
                dir.join("upstreams.yaml"),
                format!(
                    "pools:\n  llama-3.1-8b-instruct:\n    upstream_model: {UP}\n    replicas:\n      \
                     - {{ address: \"127.0.0.1:9\", max_concurrency: 4 }}\n"
                ),
            )
            .unwrap();
            std::fs::write(
                dir.join("tollgate.yaml"),
                "listen: 127.0.0.1:1\nadmin_listen: 127.0.0.1:2\nmodels_file: models.yaml\n\
                 upstreams_file: upstreams.yaml\nplugins:\n  - name: chat_completions\n",
            )
            .unwrap();
            Arc::new(tollgate::config::load(&dir.join("tollgate.yaml")).unwrap())
        })
        .clone();
    let mut cx = RequestCtx::new(config.clone());
    cx.route = Some(tollgate::http::routes::Route::ChatCompletions);
    let model = config.catalog.get("llama-3.1-8b-instruct").cloned().unwrap();
    let pool = config.pools.get("llama-3.1-8b-instruct").cloned().unwrap();
    cx.placement = Some(tollgate::proxy::ctx::Placement::new(model, pool));
    cx.logged = true;
    cx
}

pub(super) fn state(cx: &RequestCtx) -> String {
    format!(
        "{:?} {:?} {} {} {} {} {:?}",
        cx.usage.figures(),
        cx.response.answered,
        cx.response.delivered_tokens,
        cx.response.delivered_text_bytes,
        cx.response.saw_done,
        cx.first_token_seen,
        cx.failure.as_ref().map(|f| f.kind),
    )
}

pub(super) fn json(b: &[u8]) -> Value {
    serde_json::from_slice(b).unwrap_or_else(|e| panic!("{e}: {}", String::from_utf8_lossy(b)))
}

/// Members whose value is `null` are not compared: the pipeline copies them as they came
/// (`"usage": null` on every chunk of some replicas), the reference dropped some.
pub(super) fn without_nulls(mut v: Value) -> Value {
    if let Some(o) = v.as_object_mut() {
        o.retain(|_, x| !x.is_null());
        o.remove("request_id"); // differs between two contexts
    }
    v
}

#[test]
fn bodies_match_the_reference() {
    let usage = r#""usage":{"prompt_tokens":3,"total_tokens":9,"completion_tokens":6,"prompt_tokens_details":{"cached_tokens":1}}"#;
    let cases = [
        format!(
            r#"{{"id":"c1","object":"chat.completion","created":17,"model":"{UP}","choices":[{{"index":0,"message":{{"role":"assistant","content":"tok0 tok1 ","reasoning_content":null}},"logprobs":null,"finish_reason":"stop"}}],{usage}}}"#
        ),
        format!(
            r#"{{"model":"{UP}","choices":[{{"message":{{"content":"","reasoning_content":"think"}},"finish_reason":"length"}}],{usage}}}"#
        ),
        format!(
            r#"{{"model":"{UP}","choices":[{{"message":{{"content":null,"reasoning":null,"reasoning_content":"t"}},"finish_reason":"stop","service":1}}]}}"#
        ),
        format!(
            r#"{{"model":"{UP}","choices":[{{"message":{{"reasoning":"keep","reasoning_content":"drop","tool_calls":[ ]}},"finish_reason":"stop"}}]}}"#
        ),
        format!(
            r#"{{"model":"{UP}","choices":[{{"message":{{"tool_calls":[{{"id":"x"}}]}},"finish_reason":"tool_calls"}},{{"message":"m","finish_reason":"stop"}}],{usage}}}"#
        ),
        format!(r#"{{"model":"{UP}", "choices": [], "usage": {{"total_tokens": 1}} }}"#),
        format!(
            "{{ \"model\" : \"{UP}\" ,\n \"choices\" : [ {{ \"message\" : {{ \"reasoning_content\" : \"a\\\"b\" , \"content\" : \"x\" }} }} ] , \"usage\" : null }}"
        ),
    ];
    for body in &cases {
        let (mut a, mut b) = (ctx(), ctx());
        let got = rewrite(body.as_bytes(), &mut a).unwrap_or_else(|e| panic!("{body}: {e:?}"));
        let expected = reference::body(body.as_bytes(), &mut b).unwrap();
        assert_eq!(json(&got), expected, "{body}");
        assert_eq!(state(&a), state(&b), "{body}");
    }
    // Not chat completions (decision 48) and unreadable bodies: a malformed answer. A member
    // the gateway reads given twice is unreadable (decision 89).
    for body in [
        format!(r#"{{"model":"{UP}","choices":[{{"message":{{"content":"a"}},"finish_reason":"stop"}},7]}}"#),
        r#"{"model":"other","choices":{},"usage":null,"x\"y":[1.50, 2e3]}"#.to_string(),
        "{}".to_string(),
        "[1]".to_string(),
        "not json".to_string(),
        r#"[{"choices":[]}]"#.to_string(),
        r#"{"choices":[],"choices":[]}"#.to_string(),
        r#"{"choices":[{"message":{"content":"a","content":"b"}}]}"#.to_string(),
    ] {
        let e = rewrite(body.as_bytes(), &mut ctx()).expect_err(&body);
        assert_eq!(e.kind, tollgate::http::error::ErrorKind::UpstreamFailed, "{body}");
    }
    // Unknown members given twice are copied as they are.
    let twice = r#"{"a":1,"a":2,"choices":[]}"#;
    assert_eq!(rewrite(twice.as_bytes(), &mut ctx()).unwrap(), twice.as_bytes());
}

fn run(frames: &[String], pipeline: bool) -> (Vec<Value>, String) {
    let mut cx = ctx();
    cx.chat_request.include_usage = true;
    let mut outs = Vec::new();
    for f in frames {
        let frame = Bytes::from(f.clone());
        let data = data_payload(&frame).unwrap().into_owned();
        let mut out = BytesMut::new();
        if pipeline {
            on_frame(&frame, &mut cx, &mut out);
            if out.is_empty() {
                // The usage frame is held for `[DONE]` (dropped if the stream errors instead):
                // this compares each frame's rendering, and
                // `the_usage_frame_goes_out_only_with_done` checks when it goes out.
                out.extend_from_slice(&cx.response.usage_frame.take().unwrap());
            }
        } else {
            reference::frame(&frame, &data, &mut cx, &mut out);
        }
        let text = out.strip_prefix(b"data: ").unwrap().strip_suffix(b"\n\n").unwrap();
        assert!(!text.contains(&b'\n'), "one data line: {}", String::from_utf8_lossy(&out));
        outs.push(without_nulls(json(text)));
    }
    (outs, state(&cx))
}

#[test]
fn stream_frames_match_the_reference() {
    let head = format!(r#"{{"id":"c","object":"chat.completion.chunk","created":1,"model":"{UP}","#);
    let deltas = [
        r#""choices":[{"index":0,"delta":{"role":"assistant","content":""},"logprobs":null,"finish_reason":null}]"#,
        r#""choices":[{"index":0,"delta":{"reasoning_content":"hm"},"finish_reason":null}],"usage":null"#,
        r#""choices":[{"index":1,"delta":{"content":"tok0 "},"finish_reason":null},{"index":2,"delta":{"reasoning":null,"reasoning_content":"r"}}]"#,
        r#""choices":[{"index":0,"delta":{"content":"tok1 "},"logprobs":null,"finish_reason":null}]"#,
        r#""choices":[{"index":0,"delta":{},"finish_reason":"stop"},{"index":2,"delta":{},"finish_reason":"length"},{"index":1,"delta":{"tool_calls":[{"id":"t"}]},"finish_reason":"tool_calls"}]"#,
        r#""choices":[],"usage":{"prompt_tokens":4,"total_tokens":10,"completion_tokens":6}"#,
    ];
    let mut frames: Vec<String> = deltas.iter().map(|d| format!("data: {head}{d}}}\n\n")).collect();
    frames.push(format!("data: {head}\"choices\":[{{\"index\":3,\"delta\":{{\"content\":\"a\"}}}},{{\"index\":3,\"delta\":{{}},\"finish_reason\":\"stop\"}},{{\"delta\":{{\"content\":\"\"}},\"finish_reason\":\"stop\"}}]}}\n\n"));
    frames.push(format!("data: {head}\"choices\":[{{\"index\":0,\"delta\":{{}},\"finish_reason\":\"stop\"}}]}}\n\n"));
    frames.push(format!("data: {head}\ndata: \"choices\":[{{\"index\":5,\"delta\":{{\"content\":\"b\"}}}}]}}\n\n"));
    frames.push("data: {\"model\":\"other\",\"choices\":[{\"delta\":{\"content\":\"x\"}}]}\n\n".into());
    frames.push("data: {\"error\":{\"message\":\"boom\"}}\n\n".into());
    assert_eq!(run(&frames, true), run(&frames, false));
    // An unchanged content frame is forwarded byte for byte but for the model's name.
    let mut cx = ctx();
    let mut out = BytesMut::new();
    on_frame(frames[3].as_bytes(), &mut cx, &mut out);
    assert_eq!(out, frames[3].replace(UP, "llama-3.1-8b-instruct").as_bytes());
}

/// Spec, chat stream: `[DONE]` is "sent with the usage frame", and "an errored stream never
/// quotes a cost": the priced usage frame waits for `[DONE]` and goes out only with it.
#[test]
fn the_usage_frame_goes_out_only_with_done() {
    let usage = format!(
        "data: {{\"id\":\"c\",\"object\":\"chat.completion.chunk\",\"model\":\"{UP}\",\"choices\":[],\"usage\":{{\"prompt_tokens\":4,\"completion_tokens\":2,\"total_tokens\":6}}}}\n\n"
    );
    let content = format!(
        "data: {{\"id\":\"c\",\"object\":\"chat.completion.chunk\",\"model\":\"{UP}\",\"choices\":[{{\"index\":0,\"delta\":{{\"content\":\"hi\"}},\"finish_reason\":\"stop\"}}]}}\n\n"
    );
    let stream = |frames: &[&str], eos: bool| {
        let mut cx = ctx();
        cx.chat_request.include_usage = true;
        let mut body = Some(Bytes::from(frames.concat()));
        super::stream::on_chunk(&mut body, eos, &mut cx);
        String::from_utf8(body.map(|b| b.to_vec()).unwrap_or_default()).unwrap()
    };
    // Before `[DONE]` arrives, the usage frame is not out yet.
    let open = stream(&[&content, &usage], false);
    assert!(open.contains("\"hi\"") && !open.contains("\"usage\""), "{open}");
    // With `[DONE]`, it goes out right before it, priced.
    let done = stream(&[&content, &usage, "data: [DONE]\n\n"], true);
    let at = done.find("\"cost\"").expect("the usage frame is priced");
    assert!(at < done.find("[DONE]").unwrap(), "{done}");
    // A stream that ends without `[DONE]`: an error frame, and no cost anywhere.
    let cut = stream(&[&content, &usage], true);
    assert!(cut.contains("upstream_stream_error"), "{cut}");
    assert!(!cut.contains("\"cost\"") && !cut.contains("\"usage\""), "{cut}");
}

#[test]
fn malformed_frames_end_the_stream_once() {
    for bad in ["data: [1]\n\n", "data: {\"choices\":7}\n\n", "data: {}\n\n", "data: nope\n\n"] {
        let mut cx = ctx();
        let mut out = BytesMut::new();
        on_frame(bad.as_bytes(), &mut cx, &mut out);
        let after = out.len();
        on_frame(b"data: {\"choices\":[]}\n\n", &mut cx, &mut out);
        assert_eq!(out.len(), after, "nothing after the error frame: {bad}");
        let v = json(out.strip_prefix(b"data: ").unwrap().strip_suffix(b"\n\n").unwrap());
        assert_eq!(v["error"]["code"], "upstream_error", "{bad}");
    }
}

/// A stream on the messages route: the translator gets typed pieces and the priced usage,
/// comments and the chat text never reach the client.
#[test]
fn a_translator_gets_the_answer_typed() {
    let mut cx = ctx();
    cx.answer_translator = Some(Box::new(crate::dialects::MessagesStream::new("llama-3.1-8b-instruct", b"k")));
    let head = format!(r#"data: {{"id":"chatcmpl-z","object":"chat.completion.chunk","created":1,"model":"{UP}","#);
    let sse = format!(
        ": comment\n\n{head}\"choices\":[{{\"index\":0,\"delta\":{{\"reasoning_content\":\"hm\"}}}}]}}\n\n\
         {head}\"choices\":[{{\"index\":0,\"delta\":{{\"content\":\"Hi\"}},\"finish_reason\":\"stop\"}}]}}\n\n\
         {head}\"choices\":[],\"usage\":{{\"prompt_tokens\":7,\"completion_tokens\":2,\"total_tokens\":9}}}}\n\ndata: [DONE]\n\n"
    );
    let mut body = Some(Bytes::from(sse));
    super::stream::on_chunk(&mut body, true, &mut cx);
    let text = String::from_utf8(body.unwrap().to_vec()).unwrap();
    let names: Vec<&str> = text.lines().filter_map(|l| l.strip_prefix("event: ")).collect();
    assert_eq!(
        names,
        [
            "message_start",
            "content_block_start",
            "content_block_delta",
            "content_block_delta",
            "content_block_stop",
            "content_block_start",
            "content_block_delta",
            "content_block_stop",
            "message_delta",
            "message_stop"
        ]
    );
    assert!(text.contains(r#""thinking":"hm""#) && text.contains(r#""text":"Hi""#), "{text}");
    assert!(text.contains(r#""usage":{"cache_creation_input_tokens":0,"cache_read_input_tokens":0,"input_tokens":7,"output_tokens":2}"#), "{text}");
    assert!(!text.contains("comment") && !text.contains("chat.completion"), "{text}");
    assert_eq!(cx.usage.figures().map(|u| u.completion_tokens), Some(2));
    assert_eq!((cx.response.delivered_tokens, cx.response.saw_done), (2, true));

    // A malformed frame ends it with the translator's error event, once.
    let mut cx = ctx();
    cx.answer_translator = Some(Box::new(crate::dialects::ResponsesStream::new("m")));
    let mut body = Some(Bytes::from_static(b"data: {\"choices\":{}}\n\n"));
    super::stream::on_chunk(&mut body, true, &mut cx);
    let text = String::from_utf8(body.unwrap().to_vec()).unwrap();
    assert_eq!(text.matches("event: response.failed").count(), 1, "{text}");
    assert!(text.contains(r#""code":"upstream_error""#), "{text}");
}

/// A whole answer on the Responses route is the translator's body, priced.
#[test]
fn a_translator_gets_the_whole_answer() {
    let mut cx = ctx();
    cx.answer_translator = Some(Box::new(crate::dialects::ResponsesStream::new("llama-3.1-8b-instruct")));
    let body = format!(
        r#"{{"id":"chatcmpl-w","created":5,"model":"{UP}","choices":[{{"index":0,"message":{{"content":"Yes"}},"finish_reason":"stop"}}],"usage":{{"prompt_tokens":1000,"completion_tokens":100,"total_tokens":1100}}}}"#
    );
    let v = json(&rewrite(body.as_bytes(), &mut cx).unwrap());
    assert_eq!(v["object"], "response");
    assert_eq!(v["id"], "resp_w");
    assert_eq!(v["output"][0]["content"][0]["text"], "Yes");
    // $0.10 / $0.30 per Mtok: 1000 * 10 + 100 * 30 = 13,000 microcents.
    assert_eq!(v["usage"]["service"]["cost_microcents"], 13_000);
    assert_eq!(cx.usage.figures().map(|u| u.cost.0), Some(13_000));
}

pub(super) fn translated(which: u8) -> RequestCtx {
    let mut cx = ctx();
    match which {
        1 => cx.answer_translator = Some(Box::new(crate::dialects::MessagesStream::new("m", b"k"))),
        2 => cx.answer_translator = Some(Box::new(crate::dialects::ResponsesStream::new("m"))),
        _ => {}
    }
    cx
}

/// Frames a replica might send, good and bad, for the stream property below.
fn frame_of(kind: u8, n: u8) -> String {
    let head = format!(r#"{{"id":"c","object":"chat.completion.chunk","created":1,"model":"{UP}","#);
    match kind % 9 {
        0 => format!("data: {head}\"choices\":[{{\"index\":0,\"delta\":{{\"content\":\"t{n} \"}}}}]}}\n\n"),
        1 => format!("data: {head}\"choices\":[{{\"index\":0,\"delta\":{{\"reasoning_content\":\"r{n}\"}}}}]}}\n\n"),
        2 => format!("data: {head}\"choices\":[{{\"index\":{n},\"delta\":{{}},\"finish_reason\":\"length\"}}]}}\n\n"),
        3 => format!("data: {head}\"choices\":[],\"usage\":{{\"prompt_tokens\":{n},\"completion_tokens\":2}}}}\n\n"),
        4 => "data: [DONE]\n\n".into(),
        5 => ": keep-alive\n\n".into(),
        6 => format!(
            "data: {head}\ndata: \"choices\":[{{\"delta\":{{\"tool_calls\":[{{\"index\":0,\"function\":{{\"arguments\":\"{{\\\"a\\\":{n}}}\"}}}}]}}}}]}}\n\n"
        ),
        7 => "data: {\"error\":{\"message\":\"x\"}}\n\n".into(),
        _ => format!("data: {{\"choices\":[{n}\n\n"),
    }
}

proptest::proptest! {
    /// Any bytes, cut anywhere, on the chat route and through both translators: no panic, and
    /// a stream that ended is closed exactly once (`[DONE]` / its dialect's end, or one error).
    #[test]
    fn any_replica_stream_ends_once_and_never_panics(
        frames in proptest::collection::vec((0u8..9, 0u8..200), 0..12),
        noise in proptest::collection::vec(proptest::prelude::any::<u8>(), 0..64),
        cut in 0usize..4096,
        which in 0u8..3,
    ) {
        let mut bytes: Vec<u8> = frames.iter().flat_map(|&(k, n)| frame_of(k, n).into_bytes()).collect();
        bytes.extend_from_slice(&noise);
        let cut = cut.min(bytes.len());
        let mut cx = translated(which);
        let mut out = Vec::new();
        for (part, eos) in [(&bytes[..cut], false), (&bytes[cut..], true)] {
            let mut body = Some(Bytes::copy_from_slice(part));
            super::stream::on_chunk(&mut body, eos, &mut cx);
            out.extend_from_slice(&body.unwrap_or_default());
        }
        proptest::prop_assert!(cx.response.saw_done);
        let text = String::from_utf8_lossy(&out);
        let ends = match which {
            0 => text.matches("data: [DONE]").count() + text.matches("\"error\":{").count(),
            1 => text.matches("event: message_stop").count() + text.matches("event: error").count(),
            _ => text.matches("event: response.completed").count()
                + text.matches("event: response.incomplete").count()
                + text.matches("event: response.failed").count(),
        };
        proptest::prop_assert_eq!(ends, 1, "{}", text);
    }
}
