//! Session placements in this process (one node): a map with idle deadlines, bounded in size
//! and swept of expired sessions every [`SWEEP_EVERY_MS`] (issue 49: they were dropped only
//! once the map was full, so a burst of sessions stayed in memory).

use std::collections::HashMap;
use std::sync::Mutex;

use async_trait::async_trait;

use super::{Placed, PlacementStore, StoreDown};
use crate::runtime::clock::now_ms;

/// Sessions kept at most (about 100 bytes each: some 10 MB); past it, expired ones are
/// dropped, then the oldest deadlines. A placement is a preference: a forgotten session is
/// placed by hashing again, most often on the same replica.
pub const MAX_SESSIONS: usize = 100_000;
/// Expired sessions are swept at most this often (on the next write).
pub const SWEEP_EVERY_MS: i64 = 10_000;

#[derive(Default)]
pub struct InProcessPlacements {
    map: Mutex<HashMap<u64, (Placed, i64)>>,
    last_sweep_ms: std::sync::atomic::AtomicI64,
}

impl InProcessPlacements {
    pub fn new() -> Self {
        Self::default()
    }
}

fn deadline(ttl_ms: u64) -> i64 {
    now_ms().saturating_add(i64::try_from(ttl_ms).unwrap_or(i64::MAX))
}

#[async_trait]
impl PlacementStore for InProcessPlacements {
    async fn get(&self, key: u64, ttl_ms: u64) -> Result<Option<Placed>, StoreDown> {
        let mut map = self.map.lock().unwrap_or_else(|e| e.into_inner());
        let now = now_ms();
        match map.get_mut(&key) {
            Some((p, until)) if *until > now => {
                *until = deadline(ttl_ms);
                Ok(Some(p.clone()))
            }
            Some(_) => {
                map.remove(&key);
                Ok(None)
            }
            None => Ok(None),
        }
    }

    async fn set(&self, key: u64, placed: &Placed, ttl_ms: u64) -> Result<(), StoreDown> {
        let mut map = self.map.lock().unwrap_or_else(|e| e.into_inner());
        let now = now_ms();
        let last = self.last_sweep_ms.load(std::sync::atomic::Ordering::Relaxed);
        if now.saturating_sub(last) >= SWEEP_EVERY_MS {
            self.last_sweep_ms.store(now, std::sync::atomic::Ordering::Relaxed);
            map.retain(|_, (_, until)| *until > now);
            // A map that emptied gives its memory back.
            if map.capacity() > 4 * map.len().max(1024) {
                map.shrink_to_fit();
            }
        }
        if map.len() >= MAX_SESSIONS && !map.contains_key(&key) {
            map.retain(|_, (_, until)| *until > now);
            if map.len() >= MAX_SESSIONS {
                if let Some(oldest) = map.iter().min_by_key(|(_, (_, until))| *until).map(|(k, _)| *k) {
                    map.remove(&oldest);
                }
            }
        }
        map.insert(key, (placed.clone(), deadline(ttl_ms)));
        Ok(())
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    fn placed() -> Placed {
        Placed { replica: "10.0.0.1:8000".into(), spills: 0 }
    }

    /// Issue 49: expired sessions leave on time, not only when the map is full.
    #[tokio::test]
    async fn expired_sessions_are_swept_on_time_and_the_map_is_bounded() {
        let s = InProcessPlacements::new();
        for k in 0..1_000 {
            s.set(k, &placed(), 1).await.unwrap();
        }
        tokio::time::sleep(std::time::Duration::from_millis(5)).await;
        // The next write after the sweep interval drops every expired session.
        s.last_sweep_ms.store(now_ms() - SWEEP_EVERY_MS, std::sync::atomic::Ordering::Relaxed);
        s.set(5_000, &placed(), 60_000).await.unwrap();
        assert_eq!(s.map.lock().unwrap().len(), 1);
        // Never more than the bound: a full map of live sessions gives up its oldest.
        for k in 0..MAX_SESSIONS as u64 {
            s.set(k + 10_000, &placed(), 60_000).await.unwrap();
        }
        s.set(1, &placed(), 60_000).await.unwrap();
        assert_eq!(s.map.lock().unwrap().len(), MAX_SESSIONS);
    }
}
