//! Prompt token counting per request (`plugins::shared::prompt_tokens::count_prompt_tokens`),
//! the figure behind the context-window check, the prompt estimate and `count_tokens`.
//!
//!   small: a 3-message chat (~150 bytes of text); large: one ~100 KB user message.
//!   bytes4: no tokenizer declared (the bytes/4 rule); tokenizer: the committed fixture
//!       `tests/fixtures/tokenizers/tiny-bpe.json` (byte-level BPE, 2,000 tokens; a real
//!       model's vocabulary is larger, which makes merges cheaper per byte, not dearer).
//! Throughput is `Elements(tokens counted)`: criterion's "thrpt" is tokens per second, and
//! the time is the cost per request.
//!
//! Run (from the package root):
//!   cargo bench --bench tokenize -- --warm-up-time 1 --measurement-time 3
#![allow(clippy::unwrap_used, clippy::expect_used, clippy::panic)]

use std::hint::black_box;
use std::path::Path;

use criterion::{Criterion, Throughput, criterion_group, criterion_main};
use serde_json::{Value, json};
use tollgate::config::PromptTokenizer;
use tollgate_plugins::shared::prompt_tokens::count_prompt_tokens;

fn small() -> Value {
    json!({"messages": [
        {"role": "system", "content": "You are a concise assistant."},
        {"role": "user", "content": "Summarise the gateway's request rules in two sentences."},
        {"role": "assistant", "content": "It validates messages, then forwards an allowlist."},
    ]})
}

fn large() -> Value {
    let prose = include_str!("../README.md");
    let mut text = String::with_capacity(100 * 1024 + prose.len());
    while text.len() < 100 * 1024 {
        text.push_str(prose);
    }
    let mut cut = 100 * 1024;
    while !text.is_char_boundary(cut) {
        cut -= 1;
    }
    text.truncate(cut);
    json!({"messages": [{"role": "user", "content": text}]})
}

fn bench(c: &mut Criterion) {
    let tok = PromptTokenizer::load(Path::new("tests/fixtures/tokenizers/tiny-bpe.json"))
        .unwrap_or_else(|e| panic!("run from the package root: {e}"));
    let mut g = c.benchmark_group("count_prompt_tokens");
    for (size, body) in [("small", small()), ("large_100k", large())] {
        for (name, t) in [("bytes4", None), ("tokenizer", Some(&tok))] {
            let n = count_prompt_tokens(&body, t);
            eprintln!("{size}/{name}: {n} tokens");
            g.throughput(Throughput::Elements(n));
            g.bench_function(format!("{size}/{name}"), |b| b.iter(|| count_prompt_tokens(black_box(&body), t)));
        }
    }
    g.finish();
}

criterion_group!(benches, bench);
criterion_main!(benches);
