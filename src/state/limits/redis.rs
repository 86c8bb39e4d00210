//! The Redis limiter: shared by every gateway pointed at the same Redis. A check is one
//! `EVALSHA` of `tollgate_check_v3` (a cold script cache adds one `SCRIPT LOAD`, once per
//! connection after a Redis restart), sent behind the `ZREM`s of the releases queued since the
//! last check (`redis_releases`, decision 148); renew is one `EVALSHA` of `tollgate_renew_v2`;
//! an immediate release is one pipelined round of `ZREM`s.
//!
//! Redis may lose its data (a restart without persistence, a failover to an empty replica)
//! while gateways hold leases in it. The store's epoch (`{<prefix>}:epoch`, a hash) says so:
//! a gateway's first check sets it, and a check that finds it missing creates a new one with
//! a recovery deadline: gated checks wait [`RECOVERY`] while every gateway, which reads the
//! epoch every second (`LimiterStore::epoch`), registers its running leases again (decision
//! 202).
//!
//! Keys are `{<prefix>}:<kind>:<logical key>` with kind `w` (window hash), `g` (gate sorted
//! set) or `t` (tokens hash), so a logical key reused across kinds never meets a wrong type.
//! v2 of the check keeps a summary in each bucket hash that v1 deletes when it meets it, so
//! both versions share the keys and count exactly during a rolling upgrade (decision 149).
//! Every key carries the same hash tag, `{<prefix>}`: a check touches the per-key window, the
//! workspace gate and the shared-model gate (which belongs to no workspace) in one atomic script,
//! and Redis Cluster runs a script only on keys of one slot. The limitation: on a cluster all
//! limiter keys live on one shard. A tag per workspace would shard them but would need a second
//! round trip (and a compensating release) for the shared-model gate.
//!
//! Every call is bounded by [`RedisOptions::timeout`], connecting included, and every failure is
//! [`LimiterError::Unavailable`]. The connection is made on first use, so a gateway can start
//! while Redis is down. A check that timed out may still run later (e.g. Redis was stalled, not
//! gone); its lease is then released by a compensating `ZREM` sent behind it on the same
//! connection, so a retry must use a new lease id. Its window counts are not taken back; they
//! leave the window within 61 s.

use std::future::Future;
use std::sync::Arc;
use std::time::Duration;

use async_trait::async_trait;
use redis::aio::ConnectionManager;

use crate::state::redis_conn::LazyRedis;

use super::redis_releases::{CARRY_MAX, Releases};
use super::redis_reply::verdict;
use super::{Check, Lease, LimiterError, LimiterStore, Renewal, Verdict, redact};

/// The check script's versioned name; see `tollgate_check_v3.lua`.
pub const CHECK_SCRIPT: &str = "tollgate_check_v3";
/// The renew script's versioned name; see `tollgate_renew_v2.lua`.
pub const RENEW_SCRIPT: &str = "tollgate_renew_v2";
const CHECK_LUA: &str = include_str!("tollgate_check_v3.lua");
const RENEW_LUA: &str = include_str!("tollgate_renew_v2.lua");
const EPOCH_LUA: &str = include_str!("tollgate_epoch_v1.lua");

/// How long gated checks wait after the store lost its data: every gateway reads the epoch
/// every [`super::leases::EPOCH_PROBE`] and then registers its running leases again, within a
/// store timeout or two.
pub const RECOVERY: Duration = Duration::from_secs(3);

/// How long a compensating release may wait behind a stalled check.
const COMPENSATE_TIMEOUT: Duration = Duration::from_secs(30);

#[derive(Debug, Clone, PartialEq, Eq)]
pub struct RedisOptions {
    /// Key prefix and cluster hash tag (no braces).
    pub prefix: String,
    /// Bound on every call, connecting included.
    pub timeout: Duration,
    /// A `rediss://` link's CA and client certificate; `None`: the system's roots.
    pub tls: Option<Arc<crate::store::tls::StoreTls>>,
}

impl Default for RedisOptions {
    fn default() -> Self {
        Self { prefix: "tollgate".into(), timeout: Duration::from_millis(250), tls: None }
    }
}

pub struct RedisLimiter {
    redis: Arc<LazyRedis>,
    opts: RedisOptions,
    tag: String,
    check_script: redis::Script,
    renew_script: redis::Script,
    epoch_script: redis::Script,
    releases: Arc<Releases>,
    /// This process has set the store's epoch where it had none (its first check does).
    epoch_set: std::sync::atomic::AtomicBool,
}

impl std::fmt::Debug for RedisLimiter {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("RedisLimiter").field("tag", &self.tag).field("timeout", &self.opts.timeout).finish()
    }
}

fn unavailable(e: redis::RedisError) -> LimiterError {
    LimiterError::Unavailable(e.to_string())
}

impl RedisLimiter {
    /// Parses the URL; does not connect (the first call does).
    pub fn new(url: &str, opts: RedisOptions) -> Result<Self, LimiterError> {
        Self::valid(&opts)?;
        let redis = LazyRedis::open_tls(url, opts.timeout, opts.tls.as_deref())
            .map_err(|e| LimiterError::Invalid(format!("{} ({e})", redact(url))))?;
        Self::on(Arc::new(redis), opts)
    }

    /// On a connection opened already: the one the gateway shares between the limiter, the
    /// idempotency records and the session placements (decision 150).
    pub fn on(redis: Arc<LazyRedis>, opts: RedisOptions) -> Result<Self, LimiterError> {
        Self::valid(&opts)?;
        Ok(Self {
            redis,
            tag: format!("{{{}}}", opts.prefix),
            opts,
            check_script: redis::Script::new(CHECK_LUA),
            renew_script: redis::Script::new(RENEW_LUA),
            epoch_script: redis::Script::new(EPOCH_LUA),
            releases: Arc::default(),
            epoch_set: std::sync::atomic::AtomicBool::new(false),
        })
    }

    fn valid(opts: &RedisOptions) -> Result<(), LimiterError> {
        if opts.prefix.is_empty() || opts.prefix.contains(['{', '}']) {
            return Err(LimiterError::Invalid(format!(
                "redis key prefix {:?} must be non-empty, no braces",
                opts.prefix
            )));
        }
        if opts.timeout.is_zero() {
            return Err(LimiterError::Invalid("redis timeout must be above zero".into()));
        }
        Ok(())
    }

    /// Round-trips a `PING` (readiness).
    pub async fn ping(&self) -> Result<(), LimiterError> {
        self.bounded("ping", async {
            let mut conn = self.conn().await?;
            redis::cmd("PING").query_async::<String>(&mut conn).await.map(drop).map_err(unavailable)
        })
        .await
    }

    fn window_key(&self, key: &str) -> String {
        format!("{}:w:{key}", self.tag)
    }
    fn gate_key(&self, key: &str) -> String {
        format!("{}:g:{key}", self.tag)
    }
    fn tokens_key(&self, key: &str) -> String {
        format!("{}:t:{key}", self.tag)
    }
    fn epoch_key(&self) -> String {
        format!("{}:epoch", self.tag)
    }

    async fn conn(&self) -> Result<ConnectionManager, LimiterError> {
        self.redis.get().await.map_err(LimiterError::Unavailable)
    }

    async fn bounded<T>(
        &self,
        what: &str,
        fut: impl Future<Output = Result<T, LimiterError>>,
    ) -> Result<T, LimiterError> {
        match tokio::time::timeout(self.opts.timeout, fut).await {
            Ok(r) => r,
            Err(_) => Err(LimiterError::Unavailable(format!("{what} timed out after {:?}", self.opts.timeout))),
        }
    }

    /// The check's `EVALSHA`, behind the queued releases' `ZREM`s in one pipeline
    /// (`redis_releases` on the order this keeps). A failed pipeline's releases are queued
    /// again. A check that times out is dropped: its releases are then lost and expire by TTL.
    async fn run_check(&self, c: &Check) -> Result<Vec<i64>, LimiterError> {
        let mut conn = self.conn().await?;
        let mut pipe = redis::pipe();
        let carried = self.releases.carry(&mut pipe, CARRY_MAX);
        let first = !self.epoch_set.load(std::sync::atomic::Ordering::Relaxed);
        if first {
            // This process holds no lease yet and the store may simply be new: set its epoch
            // where it has none, without a recovery, before the check reads it.
            pipe.hset_nx(self.epoch_key(), "epoch", format!("{}@{}", c.lease_id, c.now_ms)).ignore();
        }
        pipe.add_command(self.check_command(c));
        let sent = match pipe.query_async::<(Vec<i64>,)>(&mut conn).await {
            Err(e) if e.kind() == redis::ErrorKind::NoScriptError => {
                // Redis restarted or flushed its scripts: load it, then send the pipeline again
                // (the releases in it are idempotent).
                self.check_script.load_async(&mut conn).await.map_err(unavailable)?;
                pipe.query_async::<(Vec<i64>,)>(&mut conn).await
            }
            other => other,
        };
        match sent {
            Ok(reply) => {
                if first {
                    self.epoch_set.store(true, std::sync::atomic::Ordering::Relaxed);
                }
                Ok(reply.0)
            }
            Err(e) => {
                if let Some(carried) = carried {
                    self.releases.put_back(carried);
                }
                Err(unavailable(e))
            }
        }
    }

    fn check_command(&self, c: &Check) -> redis::Cmd {
        let keys = c.windows.len() + c.gates.len() + usize::from(c.tpm.is_some()) + 1;
        let mut cmd = redis::cmd("EVALSHA");
        cmd.arg(self.check_script.get_hash()).arg(keys);
        for w in &c.windows {
            cmd.arg(self.window_key(&w.key));
        }
        for g in &c.gates {
            cmd.arg(self.gate_key(&g.key));
        }
        if let Some(t) = &c.tpm {
            cmd.arg(self.tokens_key(&t.key));
        }
        cmd.arg(self.epoch_key());
        cmd.arg(c.now_ms)
            .arg(c.windows.len())
            .arg(c.gates.len())
            .arg(u8::from(c.tpm.is_some()))
            .arg(&*c.lease_id)
            .arg(c.lease_ttl_ms)
            .arg(u64::try_from(RECOVERY.as_millis()).unwrap_or(u64::MAX));
        for w in &c.windows {
            cmd.arg(w.limit);
        }
        for g in &c.gates {
            cmd.arg(g.limit);
        }
        if let Some(t) = &c.tpm {
            cmd.arg(t.tokens).arg(t.limit);
        }
        cmd
    }

    /// Releases queued and not yet taken by a pipeline (for tests).
    pub fn queued_releases(&self) -> usize {
        self.releases.len()
    }

    /// After a failed check with gates: release its lease behind it, in the background.
    fn compensate(&self, c: &Check) {
        let (Some(lease), Some(conn)) = (c.lease(), self.redis.connected()) else { return };
        let keys: Vec<String> = lease.keys.iter().map(|k| self.gate_key(k)).collect();
        tokio::spawn(async move {
            let mut conn = conn;
            let mut pipe = redis::pipe();
            for k in &keys {
                pipe.zrem(k, &*lease.id).ignore();
            }
            if let Ok(Err(e)) = tokio::time::timeout(COMPENSATE_TIMEOUT, pipe.query_async::<()>(&mut conn)).await {
                log::debug!("limiter: compensating release of lease {} failed: {e}", lease.id);
            }
        });
    }
}

#[async_trait]
impl LimiterStore for RedisLimiter {
    fn backend(&self) -> &'static str {
        "redis"
    }

    async fn check(&self, c: &Check) -> Result<Verdict, LimiterError> {
        c.validate()?;
        match self.bounded(CHECK_SCRIPT, self.run_check(c)).await {
            // The store answered: a recovery (4) recorded nothing, so there is nothing to undo.
            Ok(reply) => verdict(c, &reply),
            Err(e) => {
                self.compensate(c);
                Err(e)
            }
        }
    }

    async fn renew(&self, lease: &Lease, ttl_ms: u64, now_ms: i64) -> Result<Renewal, LimiterError> {
        if lease.keys.is_empty() {
            return Ok(Renewal::Renewed { expires_at_ms: super::expiry(now_ms, ttl_ms) });
        }
        let (expires_at_ms, restored) = self
            .bounded(RENEW_SCRIPT, async {
                let mut conn = self.conn().await?;
                let mut inv = self.renew_script.prepare_invoke();
                for k in &lease.keys {
                    inv.key(self.gate_key(k));
                }
                inv.arg(now_ms).arg(ttl_ms).arg(&*lease.id);
                inv.invoke_async::<(i64, i64)>(&mut conn).await.map_err(unavailable)
            })
            .await?;
        Ok(if restored > 0 { Renewal::Restored { expires_at_ms } } else { Renewal::Renewed { expires_at_ms } })
    }

    async fn epoch(&self, now_ms: i64) -> Result<Option<super::Epoch>, LimiterError> {
        let recovery = u64::try_from(RECOVERY.as_millis()).unwrap_or(u64::MAX);
        let until = now_ms.saturating_add(i64::try_from(recovery).unwrap_or(i64::MAX));
        let fresh = format!("probe:{}@{now_ms}", std::process::id());
        let id = self
            .bounded("epoch", async {
                let mut conn = self.conn().await?;
                let mut inv = self.epoch_script.prepare_invoke();
                inv.key(self.epoch_key()).arg(&fresh).arg(until);
                inv.invoke_async::<String>(&mut conn).await.map_err(unavailable)
            })
            .await?;
        Ok(Some(super::Epoch(id)))
    }

    async fn release(&self, lease: &Lease) -> Result<(), LimiterError> {
        if lease.keys.is_empty() {
            return Ok(());
        }
        self.bounded("release", async {
            let mut conn = self.conn().await?;
            let mut pipe = redis::pipe();
            for k in &lease.keys {
                pipe.zrem(self.gate_key(k), &*lease.id).ignore();
            }
            pipe.query_async::<()>(&mut conn).await.map_err(unavailable)
        })
        .await
    }

    async fn release_deferred(&self, lease: &Lease) -> Result<(), LimiterError> {
        if lease.keys.is_empty() {
            return Ok(());
        }
        let keys = lease.keys.iter().map(|k| self.gate_key(k)).collect();
        if self.releases.push(keys, lease.id.clone()) {
            // The first release starts the flusher on this runtime; it lives as long as it.
            let (releases, redis, timeout) = (self.releases.clone(), self.redis.clone(), self.opts.timeout);
            let Ok(runtime) = tokio::runtime::Handle::try_current() else {
                log::warn!("limiter: no runtime for the release flusher; queued releases wait for the next check");
                return Ok(());
            };
            runtime.spawn(releases.flush_loop(move |pipe| send_releases(redis.clone(), timeout, pipe)));
        }
        Ok(())
    }
}

/// The flusher's pipeline of queued releases, bounded by `timeout`: whether Redis answered.
async fn send_releases(redis: Arc<LazyRedis>, timeout: Duration, pipe: redis::Pipeline) -> bool {
    let sent = async {
        let mut conn = redis.get().await?;
        pipe.query_async::<()>(&mut conn).await.map_err(|e| e.to_string())
    };
    match tokio::time::timeout(timeout, sent).await {
        Ok(Ok(())) => true,
        Ok(Err(e)) => {
            log::debug!("limiter: queued lease releases not sent ({e}); they wait for the next check");
            false
        }
        Err(_) => false,
    }
}
