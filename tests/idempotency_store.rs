//! The idempotency record store contract, one body run against both backends (in process and
//! a real Redis at `REDIS_URL`, default 127.0.0.1:6379): lock, conflict, renew, settle,
//! release, expiry of a lock whose holder died. Never skipped.
#![allow(clippy::unwrap_used, clippy::expect_used, clippy::panic)]

use std::sync::Arc;
use std::time::Duration;

use tollgate::state::idempotency::{Begin, IdempotencyStore, InProcessRecords, RedisRecords};

fn stores() -> Vec<Arc<dyn IdempotencyStore>> {
    let url = std::env::var("REDIS_URL").unwrap_or_else(|_| "redis://127.0.0.1:6379".into());
    let prefix = format!("tgidemstore{}x{}", std::process::id(), rand_suffix());
    vec![
        Arc::new(InProcessRecords::new()),
        Arc::new(RedisRecords::new(&url, &prefix, Duration::from_millis(500)).unwrap()),
    ]
}

fn rand_suffix() -> u128 {
    std::time::SystemTime::now().duration_since(std::time::UNIX_EPOCH).unwrap().as_nanos()
}

#[tokio::test]
async fn the_record_lifecycle_is_the_same_on_every_backend() {
    for s in stores() {
        let b = s.backend();
        assert_eq!(s.begin("k1", "req-a", 5_000).await.unwrap(), Begin::Started, "{b}");
        assert_eq!(
            s.begin("k1", "req-b", 5_000).await.unwrap(),
            Begin::Running,
            "{b}: a second request meets the lock"
        );
        assert!(s.renew("k1", "req-a", 5_000).await.unwrap(), "{b}");
        assert!(!s.renew("k1", "req-b", 5_000).await.unwrap(), "{b}: only the holder renews");
        assert!(!s.settle("k1", "req-b", b"{\"x\":1}", 60_000).await.unwrap(), "{b}: only the holder settles");
        s.release("k1", "req-b").await.unwrap();
        assert_eq!(s.begin("k1", "req-c", 5_000).await.unwrap(), Begin::Running, "{b}: another's release is a no-op");
        assert!(s.settle("k1", "req-a", b"{\"x\":1}", 60_000).await.unwrap(), "{b}");
        assert_eq!(s.begin("k1", "req-d", 5_000).await.unwrap(), Begin::Settled(b"{\"x\":1}".to_vec()), "{b}");
        s.release("k1", "req-a").await.unwrap();
        assert!(
            matches!(s.begin("k1", "req-e", 5_000).await.unwrap(), Begin::Settled(_)),
            "{b}: a settled record stays"
        );

        // A released lock lets the next request run; an expired one too (its holder died).
        assert_eq!(s.begin("k2", "req-a", 5_000).await.unwrap(), Begin::Started, "{b}");
        s.release("k2", "req-a").await.unwrap();
        assert_eq!(s.begin("k2", "req-b", 150).await.unwrap(), Begin::Started, "{b}");
        tokio::time::sleep(Duration::from_millis(300)).await;
        assert_eq!(s.begin("k2", "req-c", 5_000).await.unwrap(), Begin::Started, "{b}: the dead holder's lock expired");
        assert!(!s.renew("k2", "req-b", 5_000).await.unwrap(), "{b}: the old holder lost it");
    }
}

#[tokio::test]
async fn an_unreachable_redis_is_unavailable_within_the_timeout() {
    let s = RedisRecords::new("redis://127.0.0.1:1", "tgidemdown", Duration::from_millis(200)).unwrap();
    let started = std::time::Instant::now();
    assert!(s.begin("k", "req", 1_000).await.is_err());
    assert!(started.elapsed() < Duration::from_secs(2));
}
