//! The session placement store on both backends (in process, and a real Redis at
//! `REDIS_URL`, default 127.0.0.1:6379, never skipped): a stored placement is read back, each
//! read resets its idle time, and it is gone once idle past its TTL.
#![allow(clippy::unwrap_used, clippy::expect_used, clippy::panic)]

use std::time::Duration;

use tollgate::state::placements::{InProcessPlacements, Placed, PlacementStore, RedisPlacements};

fn redis() -> RedisPlacements {
    let url = std::env::var("REDIS_URL").unwrap_or_else(|_| "redis://127.0.0.1:6379".into());
    let prefix = format!("tollgate-test-placements-{}-{}", std::process::id(), tollgate::runtime::clock::now_ms());
    RedisPlacements::new(&url, &prefix, Duration::from_secs(2)).unwrap()
}

async fn kept_while_used_and_forgotten_when_idle(store: &dyn PlacementStore) {
    let p = Placed { replica: "10.0.0.1:8000".into(), spills: 1 };
    assert_eq!(store.get(7, 400).await.unwrap(), None);
    store.set(7, &p, 400).await.unwrap();
    assert_eq!(store.get(7, 400).await.unwrap(), Some(p.clone()));
    // Read every 250 ms for a second: each read resets the 400 ms idle time.
    for _ in 0..4 {
        tokio::time::sleep(Duration::from_millis(250)).await;
        assert_eq!(store.get(7, 400).await.unwrap(), Some(p.clone()), "kept while used");
    }
    assert_eq!(store.get(8, 400).await.unwrap(), None, "another session is another key");
    tokio::time::sleep(Duration::from_millis(600)).await;
    assert_eq!(store.get(7, 400).await.unwrap(), None, "idle past its TTL");
}

#[tokio::test]
async fn in_process() {
    kept_while_used_and_forgotten_when_idle(&InProcessPlacements::new()).await
}

#[tokio::test]
async fn on_redis() {
    kept_while_used_and_forgotten_when_idle(&redis()).await
}
