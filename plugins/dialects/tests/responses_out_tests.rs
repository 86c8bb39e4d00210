//! A whole chat answer as a Responses object (read as the chat path reads it), `render_json`
//! and `ResponsesStream`.

use bytes::BytesMut;
use proptest::prelude::*;
use serde_json::{Value, json};

use super::support::*;
use crate::dialects::{ResponsesStream, render_json};
use crate::shared::answer::AnswerTranslator;
use tollgate::http::error::{ErrorKind, GatewayError};

fn chat_to_response(chat: &Value) -> Value {
    whole(&ResponsesStream::new(chat["model"].as_str().unwrap_or("")), chat)
}

fn chat(message: Value, finish: &str) -> Value {
    json!({
        "id": "chatcmpl-r1", "object": "chat.completion", "created": 1700000000, "model": "m1",
        "choices": [{ "index": 0, "message": message, "finish_reason": finish }],
        "usage": chat_usage(120, 20, 35),
    })
}

fn expected_usage() -> Value {
    json!({ "input_tokens": 120, "output_tokens": 35, "total_tokens": 155, "input_tokens_details": { "cached_tokens": 20 },
            "cost": 0.00001234, "service": { "cost_microcents": 1234, "cached_input_tokens": 20 } })
}

#[test]
fn a_completed_answer_is_one_message_item_with_output_text() {
    let r = chat_to_response(&chat(json!({ "role": "assistant", "content": "Hello" }), "stop"));
    assert_eq!(
        r,
        json!({
            "id": "resp_r1", "object": "response", "created_at": 1700000000, "model": "m1",
            "status": "completed", "error": null, "incomplete_details": null,
            "output": [{ "type": "message", "id": "msg_r1", "status": "completed", "role": "assistant",
                         "content": [{ "type": "output_text", "text": "Hello", "annotations": [] }] }],
            "usage": expected_usage(),
        })
    );
}

#[test]
fn length_is_incomplete_with_max_output_tokens() {
    let r =
        chat_to_response(&chat(json!({ "role": "assistant", "content": "", "reasoning": "long thought" }), "length"));
    assert_eq!(r["status"], "incomplete");
    assert_eq!(r["incomplete_details"], json!({ "reason": "max_output_tokens" }));
    assert_eq!(
        r["output"],
        json!([{ "type": "reasoning", "id": "rs_r1", "summary": [], "content": [{ "type": "reasoning_text", "text": "long thought" }] }])
    );
    let r = chat_to_response(&chat(json!({ "role": "assistant", "content": "x" }), "content_filter"));
    assert_eq!(r["incomplete_details"], json!({ "reason": "content_filter" }));
}

#[test]
fn tool_calls_become_function_call_items_after_the_message() {
    let r = chat_to_response(&chat(
        json!({ "role": "assistant", "content": "ok", "tool_calls": [
            { "id": "call_1", "type": "function", "function": { "name": "f", "arguments": "{\"a\":1}" } }
        ] }),
        "tool_calls",
    ));
    assert_eq!(r["status"], "completed");
    assert_eq!(r["output"][0]["type"], "message");
    assert_eq!(
        r["output"][1],
        json!({ "type": "function_call", "id": "fc_call_1", "call_id": "call_1", "name": "f", "arguments": "{\"a\":1}", "status": "completed" })
    );
}

#[test]
fn no_usage_is_null_and_a_missing_id_is_fresh() {
    let mut c = chat(json!({ "role": "assistant", "content": "x" }), "stop");
    c.as_object_mut().unwrap().remove("usage");
    c.as_object_mut().unwrap().remove("id");
    let r = chat_to_response(&c);
    assert_eq!(r["usage"], Value::Null);
    let id = r["id"].as_str().unwrap();
    assert!(id.starts_with("resp_") && id.len() == 37, "{id}");
}

#[test]
fn rendering_keeps_cost_at_eight_decimals() {
    let r = chat_to_response(&chat(json!({ "role": "assistant", "content": "x" }), "stop"));
    let text = String::from_utf8(render_json(&r)).unwrap();
    assert!(text.contains("\"cost\":0.00001234"), "{text}");
    assert_eq!(serde_json::from_str::<Value>(&text).unwrap(), r);
    // Without service.cost_microcents the number is written as it is.
    let v = json!({ "usage": { "cost": 0 }, "cost": 1.5, "s": "a\"b", "n": null, "l": [true, 2] });
    assert_eq!(String::from_utf8(render_json(&v)).unwrap(), v.to_string());
}

fn stream_events(sse: &[u8]) -> Vec<(String, Value)> {
    let mut s = ResponsesStream::new("m1");
    events(&feed(&[sse], |f, out| drive(&mut s, f, out)))
}

#[test]
fn a_text_stream_has_created_deltas_and_completed() {
    let ev = stream_events(&chat_sse(&[
        chunk(json!({ "role": "assistant", "content": "" })),
        chunk(json!({ "content": "Hel" })),
        chunk(json!({ "content": "lo" })),
        finish("stop"),
        usage_frame(120, 20, 35),
    ]));
    assert_eq!(
        names(&ev),
        vec![
            "response.created",
            "response.output_item.added",
            "response.content_part.added",
            "response.output_text.delta",
            "response.output_text.delta",
            "response.output_text.done",
            "response.content_part.done",
            "response.output_item.done",
            "response.completed",
        ]
    );
    let seqs: Vec<u64> = ev.iter().map(|(_, d)| d["sequence_number"].as_u64().unwrap()).collect();
    assert_eq!(seqs, (0..9).collect::<Vec<u64>>());
    assert_eq!(ev[0].1["response"]["status"], "in_progress");
    assert_eq!(ev[0].1["response"]["id"], "resp_abc");
    assert_eq!(ev[0].1["response"]["model"], "m1");
    assert_eq!(
        ev[3].1,
        json!({ "type": "response.output_text.delta", "sequence_number": 3, "item_id": "msg_abc", "output_index": 0,
                "content_index": 0, "delta": "Hel" })
    );
    assert_eq!(ev[5].1["text"], "Hello");
    let done = &ev[8].1["response"];
    assert_eq!(done["status"], "completed");
    assert_eq!(done["usage"], expected_usage());
    assert_eq!(done["output"][0]["content"][0]["text"], "Hello");
    assert_eq!(done["output"][0]["status"], "completed");
}

#[test]
fn reasoning_then_text_then_calls_are_separate_items_and_length_is_incomplete() {
    let ev = stream_events(&chat_sse(&[
        chunk(json!({ "reasoning": "hmm" })),
        chunk(json!({ "content": "ok" })),
        chunk(
            json!({ "tool_calls": [{ "index": 0, "id": "c1", "function": { "name": "f", "arguments": "{\"a\"" } }] }),
        ),
        chunk(json!({ "tool_calls": [{ "index": 0, "function": { "arguments": ":1}" } }] })),
        finish("length"),
    ]));
    let n = names(&ev);
    assert!(n.contains(&"response.reasoning_text.delta"));
    assert!(n.contains(&"response.function_call_arguments.done"));
    assert_eq!(n.last(), Some(&"response.incomplete"));
    let r = &ev.last().unwrap().1["response"];
    assert_eq!(r["incomplete_details"], json!({ "reason": "max_output_tokens" }));
    let kinds: Vec<&str> = r["output"].as_array().unwrap().iter().map(|i| i["type"].as_str().unwrap()).collect();
    assert_eq!(kinds, vec!["reasoning", "message", "function_call"]);
    assert_eq!(r["output"][2]["arguments"], "{\"a\":1}");
    assert_eq!(r["output"][2]["id"], "fc_c1");
    assert_eq!(r["usage"], Value::Null);
}

#[test]
fn a_failure_is_response_failed_with_the_code() {
    let mut s = ResponsesStream::new("m1");
    let mut out = BytesMut::new();
    s.on_failure(&GatewayError::new(ErrorKind::ContextLengthExceeded, "too long"), "r", &mut out);
    s.on_done(&mut out);
    assert!(s.is_ended());
    let ev = events(&out);
    assert_eq!(names(&ev), vec!["response.created", "response.failed"]);
    let r = &ev[1].1["response"];
    assert_eq!(r["status"], "failed");
    assert_eq!(r["error"], json!({ "code": "context_length_exceeded", "message": "too long" }));
}

#[test]
fn a_mid_stream_error_frame_fails_the_response() {
    let mut sse = format!("data: {}\n\n", chunk(json!({ "content": "par" }))).into_bytes();
    sse.extend_from_slice(
        b"data: {\"error\":{\"type\":\"api_error\",\"code\":\"upstream_stream_error\",\"message\":\"cut\"}}\n\n",
    );
    let ev = stream_events(&sse);
    assert_eq!(ev.last().unwrap().0, "response.failed");
    assert_eq!(ev.last().unwrap().1["response"]["output"][0]["status"], "incomplete");
}

proptest! {
    #[test]
    fn any_chunking_gives_the_same_responses_events(
        texts in proptest::collection::vec("\\PC{0,10}", 0..10),
        cuts in proptest::collection::vec(any::<prop::sample::Index>(), 0..12),
    ) {
        let mut frames: Vec<Value> = texts.iter().map(|t| chunk(json!({ "content": t }))).collect();
        frames.push(finish("stop"));
        let sse = chat_sse(&frames);
        let mut points: Vec<usize> = cuts.iter().map(|c| c.index(sse.len() + 1)).collect();
        points.sort_unstable();
        let mut chunks: Vec<&[u8]> = Vec::new();
        let mut last = 0;
        for p in points { chunks.push(&sse[last..p]); last = p; }
        chunks.push(&sse[last..]);
        let mut a = ResponsesStream::new("m1");
        let mut b = ResponsesStream::new("m1");
        let whole = feed(&[&sse], |f, out| drive(&mut a, f, out));
        prop_assert_eq!(feed(&chunks, |f, out| drive(&mut b, f, out)), whole);
    }
}

#[test]
fn parallel_calls_stay_open_together() {
    let call = |index: u64, id: Option<&str>, args: &str| {
        let mut c = json!({ "index": index, "function": { "arguments": args } });
        if let Some(id) = id {
            c["id"] = json!(id);
            c["function"]["name"] = json!(format!("f{index}"));
        }
        chunk(json!({ "tool_calls": [c] }))
    };
    let ev = stream_events(&chat_sse(&[
        call(0, Some("a"), ""),
        call(1, Some("b"), ""),
        call(0, None, "{}"),
        call(1, None, "[1]"),
        finish("tool_calls"),
    ]));
    let summary: Vec<(&str, Value)> =
        ev.iter().map(|(n, d)| (n.as_str(), d.get("output_index").cloned().unwrap_or(Value::Null))).collect();
    assert_eq!(
        summary,
        vec![
            ("response.created", Value::Null),
            ("response.output_item.added", json!(0)),
            ("response.output_item.added", json!(1)),
            ("response.function_call_arguments.delta", json!(0)),
            ("response.function_call_arguments.delta", json!(1)),
            ("response.function_call_arguments.done", json!(0)),
            ("response.output_item.done", json!(0)),
            ("response.function_call_arguments.done", json!(1)),
            ("response.output_item.done", json!(1)),
            ("response.completed", Value::Null),
        ]
    );
    let out = &ev.last().unwrap().1["response"]["output"];
    assert_eq!(
        out[0],
        json!({ "type": "function_call", "id": "fc_a", "call_id": "a", "name": "f0", "arguments": "{}", "status": "completed" })
    );
    assert_eq!(out[1]["arguments"], "[1]");
}
