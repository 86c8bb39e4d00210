//! Session placements on Redis, shared by every gateway using it: `GETEX` (the read resets
//! the idle time) and `SET ... PX`, one round trip each, under the limiter's hash tag
//! (`{<prefix>}:p:<key>`), bounded by the limiter's timeout.

use std::time::Duration;

use async_trait::async_trait;
use redis::aio::{ConnectionManager, ConnectionManagerConfig};
use tokio::sync::OnceCell;

use super::{Placed, PlacementStore, StoreDown};

pub struct RedisPlacements {
    client: redis::Client,
    conn: OnceCell<ConnectionManager>,
    tag: String,
    timeout: Duration,
}

fn down(e: impl std::fmt::Display) -> StoreDown {
    StoreDown(e.to_string())
}

impl RedisPlacements {
    /// Parses the URL; does not connect (the first call does). `prefix` is the limiter's.
    pub fn new(url: &str, prefix: &str, timeout: Duration) -> Result<Self, StoreDown> {
        let client = redis::Client::open(url).map_err(|e| down(format!("redis url: {e}")))?;
        Ok(Self { client, conn: OnceCell::new(), tag: format!("{{{prefix}}}"), timeout })
    }

    async fn conn(&self) -> Result<ConnectionManager, StoreDown> {
        let conn = self
            .conn
            .get_or_try_init(|| async {
                let cfg = ConnectionManagerConfig::new()
                    .set_connection_timeout(self.timeout)
                    .set_response_timeout(self.timeout)
                    .set_number_of_retries(0);
                ConnectionManager::new_with_config(self.client.clone(), cfg).await
            })
            .await
            .map_err(down)?;
        Ok(conn.clone())
    }

    fn key(&self, key: u64) -> String {
        format!("{}:p:{key:016x}", self.tag)
    }
}

#[async_trait]
impl PlacementStore for RedisPlacements {
    async fn get(&self, key: u64, ttl_ms: u64) -> Result<Option<Placed>, StoreDown> {
        let mut c = self.conn().await?;
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
        let mut c = self.conn().await?;
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
