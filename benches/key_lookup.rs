//! What a key lookup costs on the hot path: `Identity::authenticate` with the key in the
//! cache (HMAC digest + map lookup + state check), and with the cache bypassed (a store read
//! on every call) for SQLite and, when reachable, PostgreSQL at `DATABASE_URL`.
//!
//!   cargo bench --bench key_lookup
#![allow(clippy::unwrap_used, clippy::expect_used)]

use std::time::Duration;

#[path = "support/mod.rs"]
mod support;

use criterion::{Criterion, criterion_group, criterion_main};
use tollgate::identity::RateTier;
use tollgate::identity::keys::KeySecrets;
use tollgate::identity::service::cache::KeyCache;
use tollgate::identity::service::{Identity, NewKey};
use tollgate::store::StoreConfig;

fn identity(rt: &tokio::runtime::Runtime, config: StoreConfig, cache: KeyCache) -> Option<(Identity, String)> {
    rt.block_on(async {
        let store = tollgate::store::open(&config).await.ok()?;
        store.migrate().await.ok()?;
        let id = Identity::new(store, KeySecrets::new(&[3u8; 32], &"ef".repeat(32)).ok()?, cache);
        let ws = id.create_workspace("bench", RateTier::Free).await.ok()?;
        let (_, key) = id.create_key(&ws.id, NewKey::default()).await.ok()?;
        Some((id, key))
    })
}

fn bench(c: &mut Criterion) {
    let rt = tokio::runtime::Builder::new_multi_thread().worker_threads(1).enable_all().build().unwrap();
    let dir = std::env::temp_dir().join(format!("tollgate-bench-keys-{}", std::process::id()));
    let sqlite = || StoreConfig::Sqlite { path: dir.join(format!("{}.db", uuid::Uuid::new_v4().simple())) };
    let never_fresh = || KeyCache::new(Duration::ZERO, Duration::ZERO, Duration::from_secs(30), 1000);
    let mut g = c.benchmark_group("key_lookup");

    let (hit, key) = identity(&rt, sqlite(), KeyCache::default()).unwrap();
    rt.block_on(hit.authenticate(&key)).unwrap();
    g.bench_function("cache_hit", |b| b.iter(|| rt.block_on(hit.authenticate(&key)).unwrap()));

    let (miss, key) = identity(&rt, sqlite(), never_fresh()).unwrap();
    g.bench_function("cache_miss_sqlite", |b| b.iter(|| rt.block_on(miss.authenticate(&key)).unwrap()));

    g.bench_function("malformed_key_rejected", |b| b.iter(|| rt.block_on(hit.authenticate("rp_short")).unwrap_err()));

    match support::bench_database(&rt, "tollgate_bench")
        .and_then(|url| identity(&rt, StoreConfig::postgres(url), never_fresh()))
    {
        Some((pg, key)) => {
            g.bench_function("cache_miss_postgres", |b| b.iter(|| rt.block_on(pg.authenticate(&key)).unwrap()));
        }
        None => eprintln!("key_lookup: PostgreSQL not reachable, cache_miss_postgres not measured"),
    }
    g.finish();
}

criterion_group!(benches, bench);
criterion_main!(benches);
