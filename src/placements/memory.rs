//! Session placements in this process (one node): a map with idle deadlines, bounded.

use std::collections::HashMap;
use std::sync::Mutex;

use async_trait::async_trait;

use super::{Placed, PlacementStore, StoreDown};
use crate::clock::now_ms;

/// Sessions kept at most; past it, expired ones are dropped, then the oldest deadlines.
const MAX_SESSIONS: usize = 1_000_000;

#[derive(Default)]
pub struct InProcessPlacements {
    map: Mutex<HashMap<u64, (Placed, i64)>>,
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
        if map.len() >= MAX_SESSIONS && !map.contains_key(&key) {
            let now = now_ms();
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
