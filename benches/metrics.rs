//! What recording one request's metrics costs (`tollgate::observe::metrics::record`, called once per
//! request in the logging phase): a streamed chat answer with usage, so every series is
//! touched (requests, duration, first token, per token, tokens, cost); and building the JSON
//! access line.
//! `cargo bench -p tollgate-app --bench metrics`.

#![allow(clippy::panic)]

use std::path::Path;
use std::sync::Arc;
use std::time::Duration;

use criterion::{Criterion, criterion_group, criterion_main};
use tollgate::http::routes::Route;
use tollgate::money::usage::{UsageBasis, UsageFigures};
use tollgate::proxy::ctx::RequestCtx;

fn bench(c: &mut Criterion) {
    let file = Path::new(env!("CARGO_MANIFEST_DIR")).join("../conf/tollgate.yaml");
    let config = tollgate::config::load(&file).unwrap_or_else(|e| panic!("{}: {e}", file.display()));
    let config = Arc::new(config);
    let id = "llama-3.1-8b-instruct";
    let mut cx = RequestCtx::new(config.clone());
    cx.route = Some(Route::ChatCompletions);
    if let (Some(model), Some(pool)) = (config.catalog.get(id).cloned(), config.pools.get(id).cloned()) {
        cx.placement = Some(tollgate::proxy::ctx::Placement::new(model, pool));
    }
    cx.response.first_token_after = Some(Duration::from_millis(40));
    cx.usage.report(UsageFigures {
        prompt_tokens: 120,
        completion_tokens: 64,
        total_tokens: 184,
        cached_tokens: 0,
        cost: tollgate::money::Microcents(2_000),
        basis: UsageBasis::ProviderReported,
        paid: None,
    });
    cx.logged = true;
    let record = |cx: &RequestCtx| {
        let mut finished = cx.finished(200);
        finished.elapsed = Duration::from_millis(900);
        tollgate::observe::metrics::record(&finished);
    };
    record(&cx); // registers the series
    c.bench_function("metrics::record (streamed answer with usage)", |b| b.iter(|| record(&cx)));
    // The JSON access line as the logging phase builds it (the write happens on its own
    // thread).
    c.bench_function("access_log::json_line", |b| {
        b.iter(|| tollgate::observe::access_log::json_line(&cx, 200, "/v1/chat/completions", Some(412), 2_048))
    });
}

criterion_group!(benches, bench);
criterion_main!(benches);
