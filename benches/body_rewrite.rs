//! Per-request cost of the chat body rewrites (the non-streamed path).
//!
//!   rewrite_request: `plugins::chat::rewrite_request` on a parsed body (validation,
//!       allowlist, upstream model name, re-serialisation), for a small chat (3 messages)
//!       and a large one (~100 KB of messages). The `parse+` variants add the
//!       `serde_json::from_slice` of the raw body that the core does before the plugin
//!       runs, so they are the whole request-body CPU of one chat request.
//!   on_json_chunk: `plugins::chat::on_json_chunk` on a realistic non-streamed vLLM
//!       response (16 tokens, usage reported), delivered in one chunk with eos, as the
//!       replica's answer usually arrives: parse, model rename, choice normalisation,
//!       usage pricing, re-serialisation.
//! Throughput is `Elements(1)`: criterion's "thrpt" is requests per second.
//! The context (and the parsed body it carries) is built outside the timed part.
//!
//! Run (from the package root; the benches load `conf/tollgate.yaml`):
//!   cargo bench --bench body_rewrite -- --warm-up-time 1 --measurement-time 3
//! A/B a change:
//!   git stash; cargo bench --bench body_rewrite -- --save-baseline before
//!   git stash pop; cargo bench --bench body_rewrite -- --baseline before
#![allow(clippy::unwrap_used, clippy::expect_used, clippy::panic)]

use std::hint::black_box;
use std::path::Path;
use std::sync::Arc;

use bytes::Bytes;
use criterion::{BatchSize, Criterion, Throughput, criterion_group, criterion_main};
use serde_json::{Value, json};
use tollgate::config::Config;
use tollgate::http::routes::Route;
use tollgate::proxy::ctx::RequestCtx;

const MODEL_ID: &str = "llama-3.1-8b-instruct";

fn load_config() -> Arc<Config> {
    let config = tollgate::config::load(Path::new("conf/tollgate.yaml"))
        .unwrap_or_else(|e| panic!("conf/tollgate.yaml (run from the package root): {e}"));
    Arc::new(config)
}

/// A context as it stands after routing and model resolution.
fn chat_ctx(config: &Arc<Config>) -> RequestCtx {
    let mut cx = RequestCtx::new(config.clone());
    cx.route = Some(Route::ChatCompletions);
    if let (Some(model), Some(pool)) = (config.catalog.get(MODEL_ID).cloned(), config.pools.get(MODEL_ID).cloned()) {
        cx.placement = Some(tollgate::proxy::ctx::Placement::new(model, pool));
    }
    assert!(cx.placement.is_some(), "{MODEL_ID} not configured");
    // Dropped by the bench, not by a shutdown: keep Drop quiet.
    cx.logged = true;
    cx
}

fn small_body() -> Value {
    json!({
        "model": MODEL_ID,
        "messages": [
            {"role": "system", "content": "You are a helpful assistant. Answer briefly."},
            {"role": "user", "content": "What is the capital of France?"},
            {"role": "assistant", "content": "Paris."},
        ],
        "temperature": 0.7,
        "max_tokens": 256,
        "user": "bench-user-1",
    })
}

/// About 100 KB of conversation: 100 turns of ~1 KB each.
fn large_body() -> Value {
    let sentence = "The quick brown fox jumps over the lazy dog while the gateway rewrites the body. ";
    let mut messages = vec![json!({"role": "system", "content": "You are a helpful assistant."})];
    for i in 0..100 {
        let role = if i % 2 == 0 { "user" } else { "assistant" };
        let mut content = format!("turn {i}: ");
        while content.len() < 1000 {
            content.push_str(sentence);
        }
        messages.push(json!({"role": role, "content": content}));
    }
    json!({
        "model": MODEL_ID,
        "messages": messages,
        "temperature": 0.2,
        "max_completion_tokens": 1024,
        "stream": false,
    })
}

/// The replica's non-streamed answer (shape of vLLM's, 16 tokens, usage reported).
fn upstream_response() -> Bytes {
    let content: String = (0..16).map(|i| format!("tok{i} ")).collect();
    let v = json!({
        "id": "chatcmpl-3f2a9c1e8b7d4e5fa6b0c9d8e7f6a5b4",
        "object": "chat.completion",
        "created": 1_732_262_400,
        "model": "meta-llama/Llama-3.1-8B-Instruct",
        "choices": [{
            "index": 0,
            "message": {"role": "assistant", "content": content, "reasoning_content": null, "tool_calls": []},
            "logprobs": null,
            "finish_reason": "stop",
            "stop_reason": null
        }],
        "usage": {"prompt_tokens": 42, "total_tokens": 58, "completion_tokens": 16, "prompt_tokens_details": null},
        "prompt_logprobs": null
    });
    Bytes::from(serde_json::to_vec(&v).unwrap())
}

fn bench_rewrite_request(c: &mut Criterion) {
    let config = load_config();
    let mut g = c.benchmark_group("rewrite_request");
    g.throughput(Throughput::Elements(1));
    for (name, body) in [("small_3_messages", small_body()), ("large_100kb", large_body())] {
        let raw = serde_json::to_vec(&body).unwrap();
        // Sanity: it rewrites, and the upstream model name is in the output.
        let mut cx = chat_ctx(&config);
        cx.body = Some(body.clone());
        let out = tollgate_plugins::chat::rewrite_request(&mut cx).unwrap();
        assert!(
            memchr::memmem::find(&out, b"\"model\":\"meta-llama/Llama-3.1-8B-Instruct\"").is_some(),
            "model not rewritten"
        );
        eprintln!("{name}: {} bytes in, {} bytes out", raw.len(), out.len());

        g.bench_function(name, |b| {
            b.iter_batched(
                || {
                    let mut cx = chat_ctx(&config);
                    cx.body = Some(body.clone());
                    cx
                },
                |mut cx| {
                    tollgate_plugins::chat::rewrite_request(black_box(&mut cx)).unwrap();
                    cx
                },
                BatchSize::SmallInput,
            )
        });
        g.bench_function(format!("parse+{name}"), |b| {
            b.iter_batched(
                || chat_ctx(&config),
                |mut cx| {
                    cx.body = Some(serde_json::from_slice(black_box(&raw)).unwrap());
                    tollgate_plugins::chat::rewrite_request(&mut cx).unwrap();
                    cx
                },
                BatchSize::SmallInput,
            )
        });
    }
    g.finish();
}

fn bench_json_response(c: &mut Criterion) {
    let config = load_config();
    let resp = upstream_response();

    // Sanity: renamed, usage priced.
    let mut cx = chat_ctx(&config);
    let mut body = Some(resp.clone());
    tollgate_plugins::chat::on_json_chunk(&mut body, true, &mut cx).unwrap();
    let out = body.unwrap();
    let v: Value = serde_json::from_slice(&out).unwrap();
    assert_eq!(v["model"], MODEL_ID);
    assert!(v["usage"]["cost"].is_number(), "no priced usage: {v}");
    eprintln!("on_json_chunk: {} bytes in, {} bytes out", resp.len(), out.len());

    let mut g = c.benchmark_group("on_json_chunk");
    g.throughput(Throughput::Elements(1));
    g.bench_function("16_tokens_with_usage", |b| {
        b.iter_batched(
            || chat_ctx(&config),
            |mut cx| {
                let mut body = Some(resp.clone());
                tollgate_plugins::chat::on_json_chunk(&mut body, true, &mut cx).unwrap();
                (cx, body)
            },
            BatchSize::SmallInput,
        )
    });
    g.finish();
}

criterion_group!(benches, bench_rewrite_request, bench_json_response);
criterion_main!(benches);
