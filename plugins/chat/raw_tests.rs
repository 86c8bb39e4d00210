//! Tests of `raw.rs`. Each case goes through this path and through the `Value` path: the output must be
//! the same JSON and the context must end in the same state.
use std::sync::Arc;

use bytes::{Bytes, BytesMut};
use serde_json::Value;

use super::{json_body, stream_frame};
use crate::chat::response::rewrite_value;
use crate::chat::stream::on_frame_value;
use tollgate::config::Config;
use tollgate::ctx::RequestCtx;
use tollgate::sse::data_payload;

const UP: &str = "meta-llama/Llama-3.1-8B-Instruct";

fn ctx() -> RequestCtx {
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
    cx.route = Some(tollgate::routes::Route::ChatCompletions);
    let model = config.catalog.get("llama-3.1-8b-instruct").cloned().unwrap();
    let pool = config.pools.get("llama-3.1-8b-instruct").cloned().unwrap();
    cx.placement = Some(tollgate::ctx::Placement::new(model, pool));
    cx.logged = true;
    cx
}

fn state(cx: &RequestCtx) -> String {
    format!(
        "{:?} {:?} {} {} {} {} {:?}",
        cx.usage,
        cx.response.answered,
        cx.response.delivered_tokens,
        cx.response.delivered_text_bytes,
        cx.response.saw_done,
        cx.first_token_seen.load(std::sync::atomic::Ordering::Relaxed),
        cx.failure.as_ref().map(|f| f.kind),
    )
}

fn json(b: &[u8]) -> Value {
    serde_json::from_slice(b).unwrap_or_else(|e| panic!("{e}: {}", String::from_utf8_lossy(b)))
}

#[test]
fn bodies_match_the_value_path() {
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
    ];
    for body in &cases {
        let (mut a, mut b) = (ctx(), ctx());
        let fast = json_body(body.as_bytes(), &mut a).unwrap_or_else(|| panic!("not taken: {body}"));
        let slow = rewrite_value(body.as_bytes(), &mut b).unwrap();
        assert_eq!(json(&fast), json(&slow), "{body}");
        assert_eq!(state(&a), state(&b), "{body}");
    }
    // Left to the `Value` path.
    for body in ["[1]", "{\"a\":1,\"a\":2}", "not json", r#"{"choices":[{"message":{"content":"a","content":"b"}}]}"#] {
        assert!(json_body(body.as_bytes(), &mut ctx()).is_none(), "{body}");
    }
    // Not chat completions (decision 48): left to the `Value` path, which refuses them.
    for body in [
        format!(r#"{{"model":"{UP}","choices":[{{"message":{{"content":"a"}},"finish_reason":"stop"}},7]}}"#),
        r#"{"model":"other","choices":{},"usage":null,"x\"y":[1.50, 2e3]}"#.to_string(),
        "{}".to_string(),
    ] {
        assert!(json_body(body.as_bytes(), &mut ctx()).is_none(), "{body}");
        assert!(rewrite_value(body.as_bytes(), &mut ctx()).is_err(), "{body}");
    }
}

fn run(frames: &[String], fast: bool) -> (Vec<Value>, String) {
    let mut cx = ctx();
    cx.ext.insert(crate::shared::ChatRequest { include_usage: true, output_ceiling: None });
    let mut outs = Vec::new();
    for f in frames {
        let frame = Bytes::from(f.clone());
        let data = data_payload(&frame).unwrap().into_owned();
        let mut out = BytesMut::new();
        if !fast || stream_frame(&data, &frame, &mut cx, &mut out).is_none() {
            on_frame_value(&frame, &data, &mut cx, &mut out);
        }
        let text = out.strip_prefix(b"data: ").unwrap().strip_suffix(b"\n\n").unwrap();
        assert!(!text.contains(&b'\n'), "one data line: {}", String::from_utf8_lossy(&out));
        let mut v = json(text);
        if let Some(o) = v.as_object_mut() {
            o.remove("request_id"); // differs between the two contexts
        }
        outs.push(v);
    }
    (outs, state(&cx))
}

#[test]
fn stream_frames_match_the_value_path() {
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
    // The content frames take the one-pass path.
    let mut cx = ctx();
    let mut out = BytesMut::new();
    let f = frames[3].as_bytes();
    assert!(super::super::raw_frame::plain_frame(&f[6..f.len() - 2], f, &mut cx, &mut out));
    assert!(out.starts_with(b"data: {\"id\":\"c\",\"object\":\"chat.completion.chunk\",\"created\":1,\"model\":\"llama-3.1-8b-instruct\",\"choices\""));
}
