//! Session placements on Redis, shared by every gateway using it: `GETEX` (the read resets
//! the idle time) and `SET ... PX` under the limiter's hash tag (`{<prefix>}:p:<key>`),
//! bounded by the limiter's timeout, on the limiter's connection when the gateway composes
//! them (decision 150).

use std::sync::Arc;
use std::time::Duration;

use async_trait::async_trait;

use super::{Placed, PlacementStore, StoreDown};
use crate::state::redis_conn::LazyRedis;

pub struct RedisPlacements {
    redis: Arc<LazyRedis>,
    tag: String,
    timeout: Duration,
}

fn down(e: impl std::fmt::Display) -> StoreDown {
    StoreDown(e.to_string())
}

impl RedisPlacements {
    /// Parses the URL; does not connect (the first call does). `prefix` is the limiter's.
    pub fn new(url: &str, prefix: &str, timeout: Duration) -> Result<Self, StoreDown> {
        Ok(Self::on(Arc::new(LazyRedis::open(url, timeout).map_err(down)?), prefix, timeout))
    }

    /// On the limiter store's connection, so a `GETEX` sent while the chain's check is in
    /// flight leaves in the same write (decision 150).
    pub fn on(redis: Arc<LazyRedis>, prefix: &str, timeout: Duration) -> Self {
        Self { redis, tag: format!("{{{prefix}}}"), timeout }
    }

    fn key(&self, key: u64) -> String {
        format!("{}:p:{key:016x}", self.tag)
    }
}

#[async_trait]
impl PlacementStore for RedisPlacements {
    async fn get(&self, key: u64, ttl_ms: u64) -> Result<Option<Placed>, StoreDown> {
        let mut c = self.redis.get().await.map_err(down)?;
        let v: Option<String> = tokio::time::timeout(
            self.timeout,
            redis::cmd("GETEX").arg(self.key(key)).arg("PX").arg(ttl_ms.max(1)).query_async(&mut c),
        )
        .await
        .map_err(|_| down("timed out"))?
        .map_err(down)?;
        Ok(v.as_deref().and_then(Placed::decode))
    }

    async fn set(&self, key: u64, placed: &Placed, ttl_ms: u64) -> Result<(), StoreDown> {
        let mut c = self.redis.get().await.map_err(down)?;
        let _: () = tokio::time::timeout(
            self.timeout,
            redis::cmd("SET").arg(self.key(key)).arg(placed.encode()).arg("PX").arg(ttl_ms.max(1)).query_async(&mut c),
        )
        .await
        .map_err(|_| down("timed out"))?
        .map_err(down)?;
        Ok(())
    }
}
