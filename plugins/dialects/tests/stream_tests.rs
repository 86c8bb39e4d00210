//! `MessagesStream`: event order and payloads, errors, and chunking independence.

use bytes::BytesMut;
use proptest::prelude::*;
use serde_json::{Value, json};

use super::support::*;
use crate::dialects::{MessagesStream, ping, sign_thinking};
use crate::shared::answer::AnswerTranslator;
use tollgate::http::error::{ErrorKind, GatewayError};

fn translate(sse: &[u8]) -> Vec<(String, Value)> {
    let mut s = MessagesStream::new("m1", KEY);
    events(&feed(&[sse], |frame, out| drive(&mut s, frame, out)))
}

fn tool_start(index: u64, id: &str, name: &str) -> Value {
    chunk(
        json!({ "tool_calls": [{ "index": index, "id": id, "type": "function", "function": { "name": name, "arguments": "" } }] }),
    )
}

fn tool_args(index: u64, args: &str) -> Value {
    chunk(json!({ "tool_calls": [{ "index": index, "function": { "arguments": args } }] }))
}

fn full_stream() -> Vec<u8> {
    chat_sse(&[
        chunk(json!({ "role": "assistant", "content": "" })),
        chunk(json!({ "reasoning": "Think" })),
        chunk(json!({ "reasoning": "ing." })),
        chunk(json!({ "content": "Hel" })),
        chunk(json!({ "content": "lo" })),
        tool_start(0, "call_1", "get_weather"),
        tool_args(0, "{\"city\""),
        tool_args(0, ":\"Paris\"}"),
        finish("tool_calls"),
        usage_frame(120, 20, 35),
    ])
}

#[test]
fn a_full_stream_follows_the_spec_order_with_exact_payloads() {
    let ev = translate(&full_stream());
    assert_eq!(
        names(&ev),
        vec![
            "message_start",
            "content_block_start",
            "content_block_delta",
            "content_block_delta",
            "content_block_delta",
            "content_block_stop",
            "content_block_start",
            "content_block_delta",
            "content_block_delta",
            "content_block_stop",
            "content_block_start",
            "content_block_delta",
            "content_block_delta",
            "content_block_stop",
            "message_delta",
            "message_stop",
        ]
    );
    let data: Vec<&Value> = ev.iter().map(|(_, d)| d).collect();
    assert_eq!(
        *data[0],
        json!({ "type": "message_start", "message": {
            "id": "msg_abc", "type": "message", "role": "assistant", "content": [], "model": "m1",
            "stop_reason": null, "stop_sequence": null,
            "usage": { "input_tokens": 0, "output_tokens": 0, "cache_read_input_tokens": 0, "cache_creation_input_tokens": 0 }
        } })
    );
    assert_eq!(
        *data[1],
        json!({ "type": "content_block_start", "index": 0, "content_block": { "type": "thinking", "thinking": "", "signature": "" } })
    );
    assert_eq!(
        *data[2],
        json!({ "type": "content_block_delta", "index": 0, "delta": { "type": "thinking_delta", "thinking": "Think" } })
    );
    assert_eq!(
        *data[4],
        json!({ "type": "content_block_delta", "index": 0, "delta": { "type": "signature_delta", "signature": sign_thinking(KEY, "Thinking.") } })
    );
    assert_eq!(*data[5], json!({ "type": "content_block_stop", "index": 0 }));
    assert_eq!(
        *data[6],
        json!({ "type": "content_block_start", "index": 1, "content_block": { "type": "text", "text": "" } })
    );
    assert_eq!(
        *data[8],
        json!({ "type": "content_block_delta", "index": 1, "delta": { "type": "text_delta", "text": "lo" } })
    );
    assert_eq!(
        *data[10],
        json!({ "type": "content_block_start", "index": 2, "content_block": { "type": "tool_use", "id": "call_1", "name": "get_weather", "input": {} } })
    );
    assert_eq!(
        *data[11],
        json!({ "type": "content_block_delta", "index": 2, "delta": { "type": "input_json_delta", "partial_json": "{\"city\"" } })
    );
    assert_eq!(
        *data[14],
        json!({ "type": "message_delta", "delta": { "stop_reason": "tool_use", "stop_sequence": null },
                "usage": { "input_tokens": 100, "output_tokens": 35, "cache_read_input_tokens": 20, "cache_creation_input_tokens": 0 } })
    );
    assert_eq!(*data[15], json!({ "type": "message_stop" }));
}

#[test]
fn the_wire_form_is_event_then_data() {
    let mut s = MessagesStream::new("m1", KEY);
    let mut out = BytesMut::new();
    s.on_done(&mut out);
    let text = String::from_utf8(out.to_vec()).unwrap();
    assert!(text.starts_with("event: message_start\ndata: {"), "{text}");
    assert!(text.ends_with("event: message_stop\ndata: {\"type\":\"message_stop\"}\n\n"), "{text}");
    assert_eq!(&ping()[..], b"event: ping\ndata: {\"type\": \"ping\"}\n\n");
}

#[test]
fn an_empty_stream_still_starts_and_stops() {
    let ev = translate(&chat_sse(&[finish("stop")]));
    assert_eq!(names(&ev), vec!["message_start", "message_delta", "message_stop"]);
    assert_eq!(ev[1].1["delta"]["stop_reason"], "end_turn");
    assert_eq!(ev[1].1["usage"]["output_tokens"], 0);
}

#[test]
fn length_maps_to_max_tokens_and_credit_usage_has_the_four_counters() {
    let ev = translate(&chat_sse(&[chunk(json!({ "content": "x" })), finish("length"), usage_frame(10, 0, 5)]));
    let delta = &ev[ev.len() - 2].1;
    assert_eq!(delta["delta"]["stop_reason"], "max_tokens");
    // Spec "Messages response": credit-funded usage carries the four counters only.
    assert_eq!(
        delta["usage"],
        json!({ "input_tokens": 10, "output_tokens": 5, "cache_read_input_tokens": 0, "cache_creation_input_tokens": 0 })
    );
}

#[test]
fn parallel_tool_calls_may_interleave() {
    let ev = translate(&chat_sse(&[
        tool_start(0, "c0", "a"),
        tool_start(1, "c1", "b"),
        tool_args(0, "{}"),
        tool_args(1, "{\"x\":1}"),
        finish("tool_calls"),
    ]));
    let summary: Vec<(String, Value)> =
        ev.iter().map(|(n, d)| (n.clone(), d.get("index").cloned().unwrap_or(Value::Null))).collect();
    let expect = [
        ("message_start", Value::Null),
        ("content_block_start", json!(0)),
        ("content_block_start", json!(1)),
        ("content_block_delta", json!(0)),
        ("content_block_delta", json!(1)),
        ("content_block_stop", json!(0)),
        ("content_block_stop", json!(1)),
        ("message_delta", Value::Null),
        ("message_stop", Value::Null),
    ];
    assert_eq!(summary, expect.iter().map(|(n, i)| (n.to_string(), i.clone())).collect::<Vec<_>>());
    assert_eq!(ev[4].1["delta"]["partial_json"], "{\"x\":1}");
}

#[test]
fn text_after_a_tool_call_closes_it_and_late_fragments_are_dropped() {
    let ev = translate(&chat_sse(&[
        tool_start(0, "c0", "a"),
        chunk(json!({ "content": "note" })),
        tool_args(0, "{}"),
        finish("stop"),
    ]));
    assert_eq!(
        names(&ev),
        vec![
            "message_start",
            "content_block_start",
            "content_block_stop",
            "content_block_start",
            "content_block_delta",
            "content_block_stop",
            "message_delta",
            "message_stop"
        ]
    );
    assert_eq!(ev[6].1["delta"]["stop_reason"], "tool_use");
}

#[test]
fn a_tool_call_without_id_gets_one() {
    let ev = translate(&chat_sse(&[tool_args(0, "{}")]));
    let id = ev[1].1["content_block"]["id"].as_str().unwrap();
    assert!(id.starts_with("toolu_"), "{id}");
    assert_eq!(ev[1].1["content_block"]["name"], "");
}

#[test]
fn an_error_frame_ends_the_stream_without_message_stop() {
    let mut sse = Vec::new();
    sse.extend_from_slice(format!("data: {}\n\n", chunk(json!({ "content": "par" }))).as_bytes());
    sse.extend_from_slice(
        b"data: {\"error\":{\"message\":\"cut\",\"type\":\"api_error\",\"param\":null,\"code\":\"upstream_stream_error\"},\"request_id\":\"req_9\"}\n\n",
    );
    sse.extend_from_slice(b"data: [DONE]\n\n");
    let ev = translate(&sse);
    assert_eq!(names(&ev), vec!["message_start", "content_block_start", "content_block_delta", "error"]);
    assert_eq!(
        ev[3].1,
        json!({ "type": "error", "error": { "type": "api_error", "message": "cut" }, "request_id": "req_9" })
    );
}

#[test]
fn an_error_before_any_output_is_the_only_event() {
    let mut s = MessagesStream::new("m1", KEY);
    let mut out = BytesMut::new();
    s.on_failure(&GatewayError::new(ErrorKind::ResponseTimeout, "too slow"), "req_1", &mut out);
    s.on_done(&mut out);
    assert!(s.is_ended());
    let ev = events(&out);
    assert_eq!(names(&ev), vec!["error"]);
    assert_eq!(
        ev[0].1,
        json!({ "type": "error", "error": { "type": "api_error", "message": "too slow" }, "request_id": "req_1" })
    );
    let mut s = MessagesStream::new("m1", KEY);
    let mut out = BytesMut::new();
    s.on_failure(&GatewayError::new(ErrorKind::UpstreamStreamError, "early end"), "r", &mut out);
    assert_eq!(events(&out)[0].1["error"]["type"], "api_error");
}

#[test]
fn nothing_is_written_after_the_end() {
    let mut s = MessagesStream::new("m1", KEY);
    let mut out = BytesMut::new();
    s.on_done(&mut out);
    let len = out.len();
    drive(&mut s, format!("data: {}\n\n", chunk(json!({ "content": "late" }))).as_bytes(), &mut out);
    s.on_failure(&GatewayError::new(ErrorKind::UpstreamFailed, "x"), "r", &mut out);
    s.on_done(&mut out);
    assert_eq!(out.len(), len);
}

/// A chat stream from generated output pieces: (kind, text) with kind 0 reasoning, 1 text,
/// 2 tool arguments (tool index 0).
fn generated_stream(pieces: &[(u8, String)]) -> Vec<u8> {
    let mut frames = vec![chunk(json!({ "role": "assistant", "content": "" }))];
    for (kind, text) in pieces {
        frames.push(match kind {
            0 => chunk(json!({ "reasoning": text })),
            1 => chunk(json!({ "content": text })),
            _ => chunk(json!({ "tool_calls": [{ "index": 0, "id": "call_p", "function": { "name": "f", "arguments": text } }] })),
        });
    }
    frames.push(finish("stop"));
    frames.push(usage_frame(7, 3, 11));
    let mut sse = chat_sse(&frames);
    // CRLF frame ends and comments appear in the wild too.
    sse.splice(0..0, b": hello\r\n\r\n".iter().copied());
    sse
}

proptest! {
    #[test]
    fn any_chunking_of_the_chat_stream_gives_the_same_events(
        pieces in proptest::collection::vec((0u8..3, "\\PC{0,12}"), 0..12),
        cuts in proptest::collection::vec(any::<prop::sample::Index>(), 0..16),
    ) {
        let sse = generated_stream(&pieces);
        let mut points: Vec<usize> = cuts.iter().map(|c| c.index(sse.len() + 1)).collect();
        points.sort_unstable();
        let mut chunks: Vec<&[u8]> = Vec::new();
        let mut last = 0;
        for p in points {
            chunks.push(&sse[last..p]);
            last = p;
        }
        chunks.push(&sse[last..]);
        let mut whole = MessagesStream::new("m1", KEY);
        let expected = feed(&[&sse], |f, out| drive(&mut whole, f, out));
        let mut split = MessagesStream::new("m1", KEY);
        let got = feed(&chunks, |f, out| drive(&mut split, f, out));
        prop_assert_eq!(&got, &expected);
        // And the events are well formed: start first, stop last, every started block stopped.
        let ev = events(&got);
        let n = names(&ev);
        prop_assert_eq!(n.first().copied(), Some("message_start"));
        prop_assert_eq!(n.last().copied(), Some("message_stop"));
        let starts = n.iter().filter(|x| **x == "content_block_start").count();
        let stops = n.iter().filter(|x| **x == "content_block_stop").count();
        prop_assert_eq!(starts, stops);
    }
}

#[test]
fn the_chat_plugins_own_frames_translate() {
    use tollgate::http::envelope::{Envelope, sse_error_frame};
    use tollgate::money::usage::{UsageBasis, UsageFigures, render_chat_usage};
    let figures = UsageFigures {
        prompt_tokens: 50,
        completion_tokens: 9,
        total_tokens: 59,
        cached_tokens: 30,
        cost: tollgate::money::Microcents(4_321),
        basis: UsageBasis::ProviderReported,
        paid: None,
    };
    let usage =
        format!("data: {{\"id\":\"chatcmpl-u\",\"choices\":[],\"usage\":{}}}\n\n", render_chat_usage(&figures, false));
    let mut sse = format!("data: {}\n\n", finish("stop")).into_bytes();
    sse.extend_from_slice(usage.as_bytes());
    sse.extend_from_slice(b"data: [DONE]\n\n");
    let ev = translate(&sse);
    assert_eq!(
        ev[1].1["usage"],
        json!({ "input_tokens": 20, "output_tokens": 9, "cache_read_input_tokens": 30, "cache_creation_input_tokens": 0 })
    );
    let err = GatewayError::new(ErrorKind::UpstreamFailed, "The model server failed during generation.");
    let ev = translate(&sse_error_frame(&err, Envelope::Chat, "req_7"));
    assert_eq!(
        ev,
        vec![(
            "error".to_string(),
            json!({ "type": "error", "error": { "type": "api_error", "message": "The model server failed during generation." },
                    "request_id": "req_7" })
        )]
    );
}
