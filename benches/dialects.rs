//! What the messages dialect and the Responses adapter add per request and per streamed
//! frame, on top of the chat path (benches/body_rewrite.rs measures the chat path itself):
//!
//!   request: `to_chat` (messages) and `responses_to_chat` on a parsed body of a small
//!       conversation with a system prompt, a tool and a prior tool call;
//!   response: a whole answer's typed pieces (as the chat path reads them) to a Messages
//!       response (with a thinking signature) and to a Responses object;
//!   frame: one content delta's pieces through `MessagesStream` / `ResponsesStream` (the steady
//!       state of a stream: one delta in, one event out), measured over a 64-frame stream and
//!       divided. Reading the chat text is the chat path's cost (benches/body_rewrite.rs).
//!
//! Run from the package root (the catalog is `conf/models.yaml`, through conf/tollgate.yaml):
//!   cargo bench --bench dialects -- --warm-up-time 1 --measurement-time 3
#![allow(clippy::unwrap_used, clippy::expect_used, clippy::panic)]

use std::hint::black_box;
use std::path::Path;

use bytes::BytesMut;
use criterion::{Criterion, Throughput, criterion_group, criterion_main};
use serde_json::{Value, json};
use tollgate_plugins::dialects::{
    MessagesStream, Purpose, ResponsesStream, messages_from_answer, responses_from_answer, responses_to_chat, to_chat,
};
use tollgate_plugins::shared::answer::{AnswerTranslator, AnswerView, ChunkMeta, Form, Piece, pieces};

const MODEL_ID: &str = "llama-3.1-8b-instruct";
const KEY: &[u8] = b"bench signing key 0123456789abcdef";
const FRAMES: u64 = 64;

fn messages_body() -> Value {
    json!({
        "model": MODEL_ID,
        "max_tokens": 512,
        "system": "You are a helpful assistant. Answer briefly.",
        "tools": [{"name": "get_weather", "description": "Weather for a city",
                   "input_schema": {"type": "object", "properties": {"city": {"type": "string"}}}}],
        "messages": [
            {"role": "user", "content": "What is the weather in Paris?"},
            {"role": "assistant", "content": [{"type": "tool_use", "id": "toolu_1", "name": "get_weather", "input": {"city": "Paris"}}]},
            {"role": "user", "content": [{"type": "tool_result", "tool_use_id": "toolu_1", "content": "Sunny, 21 C"}]},
        ],
    })
}

fn responses_body() -> Value {
    json!({
        "model": MODEL_ID,
        "instructions": "You are a helpful assistant. Answer briefly.",
        "input": [{"role": "user", "content": [{"type": "input_text", "text": "What is the capital of France?"}]}],
        "max_output_tokens": 512,
        "tools": [{"type": "function", "name": "get_weather", "parameters": {"type": "object"}}],
    })
}

fn chat_completion() -> Value {
    json!({
        "id": "chatcmpl-bench", "object": "chat.completion", "created": 1_700_000_000, "model": MODEL_ID,
        "choices": [{"index": 0, "finish_reason": "stop",
                     "message": {"role": "assistant", "reasoning": "The user wants a short answer.",
                                 "content": "It is sunny in Paris, about 21 C."}}],
        "usage": {"prompt_tokens": 60, "completion_tokens": 20, "total_tokens": 80,
                  "prompt_tokens_details": {"cached_tokens": 0}},
    })
}

/// A 64-frame chat stream: role, 62 content deltas, finish; then usage and `[DONE]`.
fn chat_stream() -> Vec<Vec<u8>> {
    let frame = |v: Value| format!("data: {v}\n\n").into_bytes();
    let chunk = |delta: Value, finish: Value| {
        json!({"id": "chatcmpl-bench", "object": "chat.completion.chunk", "created": 1_700_000_000,
               "model": MODEL_ID, "choices": [{"index": 0, "delta": delta, "finish_reason": finish}]})
    };
    let mut out = vec![frame(chunk(json!({"role": "assistant", "content": ""}), Value::Null))];
    for i in 0..FRAMES - 2 {
        out.push(frame(chunk(json!({"content": format!("tok{i} ")}), Value::Null)));
    }
    out.push(frame(chunk(json!({}), json!("stop"))));
    out.push(frame(json!({"id": "chatcmpl-bench", "object": "chat.completion.chunk", "choices": [],
                          "usage": {"prompt_tokens": 60, "completion_tokens": 64, "total_tokens": 124}})));
    out.push(b"data: [DONE]\n\n".to_vec());
    out
}

fn bench(c: &mut Criterion) {
    let config = tollgate::config::load(Path::new("conf/tollgate.yaml"))
        .unwrap_or_else(|e| panic!("conf/tollgate.yaml (run from the package root): {e}"));
    let model = config.catalog.get(MODEL_ID).cloned().expect("bench model in conf/models.yaml");
    let mut g = c.benchmark_group("dialects");
    g.throughput(Throughput::Elements(1));
    let (mb, rb) = (messages_body(), responses_body());
    assert!(to_chat(&mb, &model, Purpose::Generate).is_ok() && responses_to_chat(&rb, &model).is_ok());
    g.bench_function("request/messages_to_chat", |b| {
        b.iter(|| to_chat(black_box(&mb), &model, Purpose::Generate).unwrap())
    });
    g.bench_function("request/responses_to_chat", |b| b.iter(|| responses_to_chat(black_box(&rb), &model).unwrap()));
    let chat = serde_json::to_vec(&chat_completion()).unwrap();
    let view = AnswerView::parse(&chat).unwrap();
    let (meta, answer) = (view.meta(), pieces(&view, Form::Body));
    g.bench_function("response/messages_from_answer", |b| {
        b.iter(|| messages_from_answer(&meta, black_box(&answer), None, MODEL_ID, KEY))
    });
    g.bench_function("response/responses_from_answer", |b| {
        b.iter(|| responses_from_answer(&meta, black_box(&answer), None, MODEL_ID))
    });
    let frames = chat_stream();
    // The chunks as the chat path hands them to a translator (`None`: the stream's end).
    let views: Vec<Option<AnswerView<'_>>> = frames.iter().map(|f| AnswerView::parse(&f[6..f.len() - 2])).collect();
    let chunks: Vec<Option<(ChunkMeta<'_>, Vec<Piece<'_>>)>> =
        views.iter().map(|v| v.as_ref().map(|v| (v.meta(), pieces(v, Form::Chunk)))).collect();
    let run = |t: &mut dyn AnswerTranslator| {
        let mut out = BytesMut::with_capacity(16 * 1024);
        for c in &chunks {
            match c {
                Some((meta, p)) => t.on_chunk(meta, p, &mut out),
                None => t.on_done(&mut out),
            }
        }
        out
    };
    g.throughput(Throughput::Elements(FRAMES));
    g.bench_function("stream_64_frames/messages", |b| b.iter(|| run(&mut MessagesStream::new(MODEL_ID, KEY))));
    g.bench_function("stream_64_frames/responses", |b| b.iter(|| run(&mut ResponsesStream::new(MODEL_ID))));
    g.finish();
}

criterion_group!(benches, bench);
criterion_main!(benches);
