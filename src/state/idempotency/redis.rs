//! Idempotency records on Redis, shared by every gateway using it. Each call is one `EVALSHA`
//! of a small script (compare the lock, then act), so `begin` is one round trip and a lock is
//! only ever renewed, settled or released by the request holding it. Keys are
//! `{<prefix>}:i:<key>`: the limiter's hash tag, so records sit on the limiter's shard.
//! Every call is bounded by the limiter's timeout; any failure is `Unavailable` (the plugin
//! answers `503 idempotency_unavailable` before inference or charge).

use std::sync::Arc;
use std::time::Duration;

use async_trait::async_trait;
use redis::aio::ConnectionManager;

use super::{Begin, IdempotencyStore, RecordsError, is_lock, lock_value};
use crate::state::redis_conn::LazyRedis;

const BEGIN_LUA: &str = "local v = redis.call('GET', KEYS[1]) if v then return v end \
    redis.call('SET', KEYS[1], ARGV[1], 'PX', ARGV[2]) return false";
const RENEW_LUA: &str = "if redis.call('GET', KEYS[1]) == ARGV[1] then \
    return redis.call('PEXPIRE', KEYS[1], ARGV[2]) end return 0";
const SETTLE_LUA: &str = "if redis.call('GET', KEYS[1]) == ARGV[1] then \
    redis.call('SET', KEYS[1], ARGV[2], 'PX', ARGV[3]) return 1 end return 0";
const RELEASE_LUA: &str = "if redis.call('GET', KEYS[1]) == ARGV[1] then \
    return redis.call('DEL', KEYS[1]) end return 0";

pub struct RedisRecords {
    redis: Arc<LazyRedis>,
    tag: String,
    timeout: Duration,
    scripts: [redis::Script; 4],
}

fn unavailable(e: impl std::fmt::Display) -> RecordsError {
    RecordsError::Unavailable(e.to_string())
}

impl RedisRecords {
    /// Parses the URL; does not connect (the first call does). `prefix` is the limiter's.
    pub fn new(url: &str, prefix: &str, timeout: Duration) -> Result<Self, RecordsError> {
        Ok(Self::on(Arc::new(LazyRedis::open(url, timeout).map_err(unavailable)?), prefix, timeout))
    }

    /// On the limiter store's connection (decision 150).
    pub fn on(redis: Arc<LazyRedis>, prefix: &str, timeout: Duration) -> Self {
        Self {
            redis,
            tag: format!("{{{prefix}}}"),
            timeout,
            scripts: [BEGIN_LUA, RENEW_LUA, SETTLE_LUA, RELEASE_LUA].map(redis::Script::new),
        }
    }

    async fn conn(&self) -> Result<ConnectionManager, RecordsError> {
        self.redis.get().await.map_err(unavailable)
    }

    /// Run script `which` on the record `key` with `args`, within the timeout.
    async fn run<T: redis::FromRedisValue>(&self, which: usize, key: &str, args: &[&[u8]]) -> Result<T, RecordsError> {
        let call = async {
            let mut conn = self.conn().await?;
            let mut invocation = self.scripts[which].key(format!("{}:i:{key}", self.tag));
            for a in args {
                invocation.arg(*a);
            }
            invocation.invoke_async::<T>(&mut conn).await.map_err(unavailable)
        };
        tokio::time::timeout(self.timeout, call).await.map_err(|_| unavailable("timed out"))?
    }
}

#[async_trait]
impl IdempotencyStore for RedisRecords {
    fn backend(&self) -> &'static str {
        "redis"
    }

    async fn begin(&self, key: &str, lock: &str, lock_ms: u64) -> Result<Begin, RecordsError> {
        let found: Option<Vec<u8>> = self.run(0, key, &[&lock_value(lock), lock_ms.to_string().as_bytes()]).await?;
        Ok(match found {
            None => Begin::Started,
            Some(v) if is_lock(&v) => Begin::Running,
            Some(v) => Begin::Settled(v),
        })
    }

    async fn renew(&self, key: &str, lock: &str, lock_ms: u64) -> Result<bool, RecordsError> {
        let n: i64 = self.run(1, key, &[&lock_value(lock), lock_ms.to_string().as_bytes()]).await?;
        Ok(n == 1)
    }

    async fn settle(&self, key: &str, lock: &str, record: &[u8], keep_ms: u64) -> Result<bool, RecordsError> {
        let n: i64 = self.run(2, key, &[&lock_value(lock), record, keep_ms.to_string().as_bytes()]).await?;
        Ok(n == 1)
    }

    async fn release(&self, key: &str, lock: &str) -> Result<(), RecordsError> {
        self.run::<i64>(3, key, &[&lock_value(lock)]).await.map(drop)
    }
}
