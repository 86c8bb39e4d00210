//! What billing costs the ledger per request: one hold (before the replica) and one settlement
//! (in the log phase) on SQLite and on PostgreSQL at `DATABASE_URL`, one request at a time and
//! 16 and 256 at once (the settlements per second one workspace sustains; every request of one
//! workspace serialises on its balance row, which is the worst case).
//!
//!   cargo bench --bench ledger
#![allow(clippy::unwrap_used, clippy::expect_used)]

use std::sync::Arc;
use std::sync::atomic::{AtomicU64, Ordering};
use std::time::{Duration, Instant};

#[path = "support/mod.rs"]
mod support;

use criterion::{Criterion, criterion_group, criterion_main};
use futures::StreamExt;
use tollgate::identity::{RateTier, Workspace};
use tollgate::runtime::clock::now_ms;
use tollgate::store::StoreConfig;
use tollgate::store::ledger::{LedgerStore, Settlement};

static N: AtomicU64 = AtomicU64::new(0);

async fn ledger(config: StoreConfig) -> Option<(Arc<dyn LedgerStore>, String)> {
    let s = tollgate::store::open_stores(&config).await.ok()?;
    s.identity.migrate().await.ok()?;
    let ws = Workspace {
        id: uuid::Uuid::new_v4().to_string(),
        name: "bench".into(),
        rate_tier: RateTier::Free,
        created_at: now_ms(),
        frozen: None,
        lifetime_purchases_cents: 0,
        plan: None,
    };
    s.identity.create_workspace(&ws).await.ok()?;
    s.ledger.top_up(&ws.id, 1_000_000_000, "grant", None, now_ms()).await.ok()?;
    Some((s.ledger, ws.id))
}

/// One billed request's ledger work: hold 10 cents, settle 3.
async fn billed_request(l: &dyn LedgerStore, ws: &str) {
    let rid = format!("bench-{}-{}", std::process::id(), N.fetch_add(1, Ordering::Relaxed));
    let now = now_ms();
    l.place_hold(&rid, ws, Some("k"), 10, now + 900_000, now).await.unwrap();
    let s = Settlement {
        request_id: rid,
        workspace_id: ws.into(),
        key_id: Some("k".into()),
        cost: tollgate::money::Microcents(3_000_000),
        value: tollgate::money::Microcents(3_000_000),
        now,
        month: "2026-11".into(),
    };
    l.settle(&s).await.unwrap();
}

fn bench(c: &mut Criterion) {
    let rt = tokio::runtime::Builder::new_multi_thread().worker_threads(2).enable_all().build().unwrap();
    let dir = std::env::temp_dir().join(format!("tollgate-bench-ledger-{}", std::process::id()));
    let mut stores = vec![("sqlite", StoreConfig::Sqlite { path: dir.join("ledger.db") })];
    match support::bench_database(&rt, "tollgate_bench_ledger") {
        Some(url) => stores.push(("postgres", StoreConfig::postgres(url))),
        None => eprintln!("ledger: PostgreSQL not reachable, its rows are not measured"),
    }
    let mut g = c.benchmark_group("ledger");
    g.measurement_time(Duration::from_secs(5));
    for (name, config) in stores {
        let (l, ws) = rt.block_on(ledger(config)).unwrap();
        g.bench_function(format!("hold_and_settle/{name}"), |b| b.iter(|| rt.block_on(billed_request(&*l, &ws))));
        // Wall time per request with 16 and 256 in flight: 1 / settlements per second. Each
        // criterion iteration is `in_flight` requests (the time is divided back), so every
        // sample really has that many in flight, however few iterations criterion asks for.
        for in_flight in [16u32, 256] {
            g.bench_function(format!("hold_and_settle_{in_flight}_concurrent/{name}"), |b| {
                b.iter_custom(|iters| {
                    let started = Instant::now();
                    let requests = iters * u64::from(in_flight);
                    rt.block_on(futures::stream::iter(0..requests).for_each_concurrent(in_flight as usize, |_| {
                        let (l, ws) = (l.clone(), ws.clone());
                        async move { billed_request(&*l, &ws).await }
                    }));
                    started.elapsed() / in_flight
                })
            });
        }
    }
    g.finish();
    let _ = std::fs::remove_dir_all(&dir);
}

criterion_group!(benches, bench);
criterion_main!(benches);
