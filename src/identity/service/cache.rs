//! The key cache that keeps authentication off the database on the hot path.
//!
//! A found key is trusted for `fresh` (500 ms by default), so a revocation or deletion made
//! through any gateway instance takes effect on every instance within a second while the
//! store is healthy. An unknown digest is remembered for `negative` so a flood of bad keys
//! does not reach the database. During a store outage a found key keeps answering from the
//! cache for up to `stale_limit` (the spec's "about 30 seconds"). Entries past any use (an
//! unknown digest past `negative`, a key past `stale_limit`) are swept every few seconds, so
//! a flood of bad keys does not hold memory until the cache is full (issue 49).

use std::future::Future;
use std::sync::{Arc, RwLock};
use std::time::{Duration, Instant};

use crate::identity::{KeyRecord, Workspace};
use crate::runtime::fast_map::FastMap;
use crate::store::StoreError;

pub type Found = (Arc<KeyRecord>, Arc<Workspace>);

#[derive(Clone)]
struct Entry {
    found: Option<Found>,
    at: Instant,
}

pub struct KeyCache {
    map: RwLock<FastMap<String, Entry>>,
    fresh: Duration,
    negative: Duration,
    stale_limit: Duration,
    max_entries: usize,
    /// When the last sweep ran.
    swept: std::sync::Mutex<Instant>,
}

/// Expired entries are swept at most this often (on the next write).
const SWEEP_EVERY: Duration = Duration::from_secs(5);

impl Default for KeyCache {
    fn default() -> Self {
        KeyCache::new(Duration::from_millis(500), Duration::from_secs(5), Duration::from_secs(30), 100_000)
    }
}

impl KeyCache {
    pub fn new(fresh: Duration, negative: Duration, stale_limit: Duration, max_entries: usize) -> Self {
        KeyCache {
            map: RwLock::new(FastMap::default()),
            fresh,
            negative,
            stale_limit,
            max_entries,
            swept: std::sync::Mutex::new(Instant::now()),
        }
    }

    fn cached(&self, digest: &str) -> Option<Entry> {
        self.map.read().unwrap_or_else(|e| e.into_inner()).get(digest).cloned()
    }

    /// The key for `digest`: from the cache while fresh, else from `load`.
    pub async fn get_or_load<F, Fut>(&self, digest: &str, load: F) -> Result<Option<Found>, StoreError>
    where
        F: FnOnce() -> Fut,
        Fut: Future<Output = Result<Option<(KeyRecord, Workspace)>, StoreError>>,
    {
        let prior = self.cached(digest);
        if let Some(e) = &prior {
            let ttl = if e.found.is_some() { self.fresh } else { self.negative };
            if e.at.elapsed() < ttl {
                return Ok(e.found.clone());
            }
        }
        match load().await {
            Ok(found) => {
                let found = found.map(|(k, w)| (Arc::new(k), Arc::new(w)));
                self.put(digest, found.clone());
                Ok(found)
            }
            Err(err) => match prior {
                Some(Entry { found: Some(f), at }) if at.elapsed() < self.stale_limit => {
                    log::warn!("key store unavailable, answering from a cached key: {err}");
                    Ok(Some(f))
                }
                _ => Err(err),
            },
        }
    }

    fn put(&self, digest: &str, found: Option<Found>) {
        let mut map = self.map.write().unwrap_or_else(|e| e.into_inner());
        let due = {
            let mut swept = self.swept.lock().unwrap_or_else(|e| e.into_inner());
            let due = swept.elapsed() >= SWEEP_EVERY;
            if due {
                *swept = Instant::now();
            }
            due
        };
        if due {
            // Nothing older than these is ever answered from the cache.
            let (negative, stale) = (self.negative, self.stale_limit.max(self.fresh));
            map.retain(|_, e| e.at.elapsed() < if e.found.is_some() { stale } else { negative });
            if map.capacity() > 4 * map.len().max(1024) {
                map.shrink_to_fit();
            }
        }
        if map.len() >= self.max_entries {
            // Unknown digests go first; a full cache of real keys starts over.
            map.retain(|_, e| e.found.is_some());
            if map.len() >= self.max_entries {
                map.clear();
            }
        }
        map.insert(digest.to_string(), Entry { found, at: Instant::now() });
    }

    /// Forget a digest at once (this instance changed the key).
    pub fn invalidate(&self, digest: &str) {
        self.map.write().unwrap_or_else(|e| e.into_inner()).remove(digest);
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::identity::{KeyScope, RateTier};
    use std::sync::atomic::{AtomicUsize, Ordering};

    fn record() -> (KeyRecord, Workspace) {
        let k = KeyRecord {
            id: "k".into(),
            workspace_id: "w".into(),
            name: None,
            scope: KeyScope::Workspace,
            digest: "v1:d".into(),
            format_version: 1,
            encrypted_copy: None,
            created_by: None,
            created_at: 0,
            expires_at: None,
            revoked_at: None,
            grace_until: None,
            rotated_from: None,
            rotation_root: "k".into(),
            credits_only: false,
            monthly_spend_limit_cents: None,
            rate_limit_rpm: None,
        };
        let w = Workspace {
            id: "w".into(),
            name: "n".into(),
            rate_tier: RateTier::Free,
            created_at: 0,
            frozen: None,
            lifetime_purchases_cents: 0,
            plan: None,
        };
        (k, w)
    }

    #[tokio::test]
    async fn fresh_hits_skip_the_store_and_stale_entries_reload() {
        let cache = KeyCache::new(Duration::from_millis(50), Duration::from_millis(50), Duration::from_secs(30), 10);
        let loads = AtomicUsize::new(0);
        for _ in 0..3 {
            let r = cache
                .get_or_load("d", || async {
                    loads.fetch_add(1, Ordering::SeqCst);
                    Ok(Some(record()))
                })
                .await;
            assert!(r.unwrap().is_some());
        }
        assert_eq!(loads.load(Ordering::SeqCst), 1);
        tokio::time::sleep(Duration::from_millis(60)).await;
        let r = cache.get_or_load("d", || async { Ok(None) }).await;
        assert!(r.unwrap().is_none(), "a deletion is seen once the entry is no longer fresh");
    }

    #[tokio::test]
    async fn outage_answers_from_cache_only_within_the_stale_limit() {
        let cache = KeyCache::new(Duration::from_millis(1), Duration::from_millis(1), Duration::from_millis(80), 10);
        cache.get_or_load("d", || async { Ok(Some(record())) }).await.unwrap();
        tokio::time::sleep(Duration::from_millis(5)).await;
        let down = || async { Err(StoreError::Unavailable("down".into())) };
        assert!(cache.get_or_load("d", down).await.unwrap().is_some());
        tokio::time::sleep(Duration::from_millis(100)).await;
        assert!(cache.get_or_load("d", down).await.is_err());
        // Unknown digests are not served from cache during an outage.
        assert!(cache.get_or_load("unknown", down).await.is_err());
    }

    /// Issue 49: a flood of unknown digests leaves the cache once their negative time passed,
    /// not when the cache is full.
    #[tokio::test]
    async fn entries_past_their_use_are_swept_on_time() {
        let cache =
            KeyCache::new(Duration::from_millis(1), Duration::from_millis(1), Duration::from_millis(10), 100_000);
        for i in 0..1_000 {
            cache.get_or_load(&format!("bad{i}"), || async { Ok(None) }).await.unwrap();
        }
        cache.get_or_load("good", || async { Ok(Some(record())) }).await.unwrap();
        tokio::time::sleep(Duration::from_millis(20)).await;
        *cache.swept.lock().unwrap() = Instant::now() - SWEEP_EVERY;
        cache.get_or_load("next", || async { Ok(None) }).await.unwrap();
        assert_eq!(cache.map.read().unwrap().len(), 1, "only the entry just written is left");
    }

    #[tokio::test]
    async fn unknown_keys_are_cached_negatively() {
        let cache = KeyCache::default();
        let loads = AtomicUsize::new(0);
        for _ in 0..5 {
            let r = cache
                .get_or_load("bad", || async {
                    loads.fetch_add(1, Ordering::SeqCst);
                    Ok(None)
                })
                .await;
            assert!(r.unwrap().is_none());
        }
        assert_eq!(loads.load(Ordering::SeqCst), 1);
    }
}
