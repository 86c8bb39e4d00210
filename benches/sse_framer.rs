//! Per-frame cost of the streamed chat path.
//!
//! A synthetic vLLM stream (64 content frames, the final frame, the usage frame and
//! `data: [DONE]`, 67 frames in all) is pushed through
//!   (a) bare framing: `SseFramer` alone, fed one chunk per frame and fed 37-byte chunks
//!       (frames split mid-JSON, as TCP reads do);
//!   (b) the whole chat stream phase, `plugins::chat::on_stream_chunk`, as the gateway runs
//!       it per upstream chunk: framing, JSON parse, model rename, delta normalisation,
//!       usage pricing, re-serialisation. A fresh `RequestCtx` per iteration (built outside
//!       the timed part).
//! Throughput is `Elements(67)`: criterion's "thrpt" is frames per second, and time / 67
//! is the cost of one frame.
//!
//! Run (from the package root; the chat benches load `conf/tollgate.yaml`):
//!   cargo bench --bench sse_framer -- --warm-up-time 1 --measurement-time 3
//! A/B a change:
//!   git stash; cargo bench --bench sse_framer -- --save-baseline before
//!   git stash pop; cargo bench --bench sse_framer -- --baseline before
//! One group only: `cargo bench --bench sse_framer -- chat_stream_phase`.
#![allow(clippy::unwrap_used, clippy::expect_used, clippy::panic)]

use std::hint::black_box;
use std::path::Path;
use std::sync::Arc;

use bytes::Bytes;
use criterion::{BatchSize, Criterion, Throughput, criterion_group, criterion_main};
use tollgate::config::Config;
use tollgate::http::routes::Route;
use tollgate::http::sse::{SseFramer, data_payload};
use tollgate::proxy::ctx::RequestCtx;

const CONTENT_FRAMES: usize = 64;
/// Content frames + final frame + usage frame + `[DONE]`.
const FRAMES: u64 = CONTENT_FRAMES as u64 + 3;
const UPSTREAM_MODEL: &str = "meta-llama/Llama-3.1-8B-Instruct";
const MODEL_ID: &str = "llama-3.1-8b-instruct";

/// The stream as vLLM sends it, one `Bytes` per frame.
fn vllm_frames() -> Vec<Bytes> {
    let head = format!(
        r#"{{"id":"chatcmpl-3f2a9c1e8b7d4e5fa6b0c9d8e7f6a5b4","object":"chat.completion.chunk","created":1732262400,"model":"{UPSTREAM_MODEL}","#
    );
    let mut frames = Vec::with_capacity(FRAMES as usize);
    for i in 0..CONTENT_FRAMES {
        let delta = if i == 0 {
            format!(r#"{{"role":"assistant","content":"tok{i} "}}"#)
        } else {
            format!(r#"{{"content":"tok{i} "}}"#)
        };
        frames.push(Bytes::from(format!(
            "data: {head}\"choices\":[{{\"index\":0,\"delta\":{delta},\"logprobs\":null,\"finish_reason\":null}}]}}\n\n"
        )));
    }
    frames.push(Bytes::from(format!(
        "data: {head}\"choices\":[{{\"index\":0,\"delta\":{{}},\"logprobs\":null,\"finish_reason\":\"stop\",\"stop_reason\":null}}]}}\n\n"
    )));
    frames.push(Bytes::from(format!(
        "data: {head}\"choices\":[],\"usage\":{{\"prompt_tokens\":42,\"total_tokens\":106,\"completion_tokens\":64,\"prompt_tokens_details\":null}}}}\n\n"
    )));
    frames.push(Bytes::from_static(b"data: [DONE]\n\n"));
    frames
}

fn rechunk(frames: &[Bytes], size: usize) -> Vec<Bytes> {
    let whole: Vec<u8> = frames.iter().flat_map(|f| f.iter().copied()).collect();
    whole.chunks(size).map(Bytes::copy_from_slice).collect::<Vec<_>>()
}

fn load_config() -> Arc<Config> {
    let config = tollgate::config::load(Path::new("conf/tollgate.yaml"))
        .unwrap_or_else(|e| panic!("conf/tollgate.yaml (run from the package root): {e}"));
    Arc::new(config)
}

/// A context as it stands when the replica's SSE response starts.
fn stream_ctx(config: &Arc<Config>, include_usage: bool) -> RequestCtx {
    let mut cx = RequestCtx::new(config.clone());
    cx.route = Some(Route::ChatCompletions);
    if let (Some(model), Some(pool)) = (config.catalog.get(MODEL_ID).cloned(), config.pools.get(MODEL_ID).cloned()) {
        cx.placement = Some(tollgate::proxy::ctx::Placement::new(model, pool));
    }
    assert!(cx.placement.is_some(), "{MODEL_ID} not configured");
    cx.stream = true;
    cx.chat_request.include_usage = include_usage;
    cx.response.streaming = true;
    cx.response.upstream_status = Some(200);
    // Dropped by the bench, not by a shutdown: keep Drop quiet.
    cx.logged = true;
    cx
}

fn frame_all(chunks: &[Bytes]) -> u64 {
    let mut framer = SseFramer::default();
    let mut n = 0u64;
    for c in chunks {
        framer.push(c);
        while let Some(f) = framer.next_frame() {
            black_box(&f);
            n += 1;
        }
    }
    n
}

fn bench_framing(c: &mut Criterion) {
    let frames = vllm_frames();
    let small = rechunk(&frames, 37);
    assert_eq!(frame_all(&frames), FRAMES);
    assert_eq!(frame_all(&small), FRAMES);

    let mut g = c.benchmark_group("sse_framing");
    g.throughput(Throughput::Elements(FRAMES));
    g.bench_function("frame_chunks", |b| b.iter(|| frame_all(black_box(&frames))));
    g.bench_function("37_byte_chunks", |b| b.iter(|| frame_all(black_box(&small))));
    // Framing plus locating each frame's data payload (what the stream phase does first).
    g.bench_function("frame_chunks+data_payload", |b| {
        b.iter(|| {
            let mut framer = SseFramer::default();
            let mut n = 0usize;
            for c in black_box(&frames) {
                framer.push(c);
                while let Some(f) = framer.next_frame() {
                    n += data_payload(&f).map_or(0, |d| d.len());
                }
            }
            n
        })
    });
    g.finish();
}

/// Runs the stream phase over `chunks`; returns the context (dropped outside the timing)
/// and the bytes sent to the client.
fn run_stream(chunks: &[Bytes], mut cx: RequestCtx) -> (RequestCtx, usize) {
    let mut sent = 0usize;
    let last = chunks.len() - 1;
    for (i, c) in chunks.iter().enumerate() {
        let mut body = Some(c.clone());
        tollgate_plugins::chat::on_stream_chunk(&mut body, i == last, &mut cx);
        sent += body.map_or(0, |b| b.len());
    }
    (cx, sent)
}

fn bench_stream_phase(c: &mut Criterion) {
    let config = load_config();
    let frames = vllm_frames();
    let small = rechunk(&frames, 37);

    // Sanity: the model is renamed on every frame and the stream ends cleanly.
    let (cx, _) = run_stream(&frames, stream_ctx(&config, true));
    assert!(cx.failure.is_none() && cx.response.saw_done && cx.usage.figures().is_some());
    assert_eq!(cx.response.delivered_tokens, CONTENT_FRAMES as u64);
    let mut probe = stream_ctx(&config, false);
    let mut one = Some(frames[0].clone());
    tollgate_plugins::chat::on_stream_chunk(&mut one, false, &mut probe);
    let out = one.unwrap_or_default();
    assert!(
        std::str::from_utf8(&out).unwrap_or("").contains(&format!("\"model\":\"{MODEL_ID}\"")),
        "model not renamed: {out:?}"
    );

    let mut g = c.benchmark_group("chat_stream_phase");
    g.throughput(Throughput::Elements(FRAMES));
    g.bench_function("frame_chunks", |b| {
        b.iter_batched(|| stream_ctx(&config, false), |cx| run_stream(black_box(&frames), cx), BatchSize::SmallInput)
    });
    g.bench_function("frame_chunks+include_usage", |b| {
        b.iter_batched(|| stream_ctx(&config, true), |cx| run_stream(black_box(&frames), cx), BatchSize::SmallInput)
    });
    g.bench_function("37_byte_chunks", |b| {
        b.iter_batched(|| stream_ctx(&config, false), |cx| run_stream(black_box(&small), cx), BatchSize::SmallInput)
    });
    g.finish();
}

criterion_group!(benches, bench_framing, bench_stream_phase);
criterion_main!(benches);
