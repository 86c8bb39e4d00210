//! Idempotency records in this process: the embedded default for one node. Expired entries
//! are dropped when met and swept when the map grows, so memory is bounded by the records of
//! the last 24 hours.

use std::collections::HashMap;
use std::sync::Mutex;
use std::time::{Duration, Instant};

use async_trait::async_trait;

use super::{Begin, IdempotencyStore, RecordsError, is_lock, lock_value};

#[derive(Default)]
pub struct InProcessRecords {
    map: Mutex<HashMap<String, (Vec<u8>, Instant)>>,
}

impl InProcessRecords {
    pub fn new() -> Self {
        Self::default()
    }

    fn with<T>(&self, f: impl FnOnce(&mut HashMap<String, (Vec<u8>, Instant)>, Instant) -> T) -> T {
        let now = Instant::now();
        let mut map = self.map.lock().unwrap_or_else(|p| p.into_inner());
        if map.len() > 4096 && map.len().is_power_of_two() {
            map.retain(|_, (_, exp)| *exp > now);
        }
        f(&mut map, now)
    }
}

fn after(now: Instant, ms: u64) -> Instant {
    now + Duration::from_millis(ms)
}

/// The live value under `key` (an expired one is removed).
fn live<'m>(
    map: &'m mut HashMap<String, (Vec<u8>, Instant)>,
    key: &str,
    now: Instant,
) -> Option<&'m mut (Vec<u8>, Instant)> {
    if map.get(key).is_some_and(|(_, exp)| *exp <= now) {
        map.remove(key);
    }
    map.get_mut(key)
}

#[async_trait]
impl IdempotencyStore for InProcessRecords {
    fn backend(&self) -> &'static str {
        "in_process"
    }

    async fn begin(&self, key: &str, lock: &str, lock_ms: u64) -> Result<Begin, RecordsError> {
        Ok(self.with(|map, now| match live(map, key, now) {
            Some((v, _)) if is_lock(v) => Begin::Running,
            Some((v, _)) => Begin::Settled(v.clone()),
            None => {
                map.insert(key.to_string(), (lock_value(lock), after(now, lock_ms)));
                Begin::Started
            }
        }))
    }

    async fn renew(&self, key: &str, lock: &str, lock_ms: u64) -> Result<bool, RecordsError> {
        Ok(self.with(|map, now| match live(map, key, now) {
            Some((v, exp)) if *v == lock_value(lock) => {
                *exp = after(now, lock_ms);
                true
            }
            _ => false,
        }))
    }

    async fn settle(&self, key: &str, lock: &str, record: &[u8], keep_ms: u64) -> Result<bool, RecordsError> {
        Ok(self.with(|map, now| match live(map, key, now) {
            Some(entry) if entry.0 == lock_value(lock) => {
                *entry = (record.to_vec(), after(now, keep_ms));
                true
            }
            _ => false,
        }))
    }

    async fn release(&self, key: &str, lock: &str) -> Result<(), RecordsError> {
        self.with(|map, now| {
            if live(map, key, now).is_some_and(|(v, _)| *v == lock_value(lock)) {
                map.remove(key);
            }
        });
        Ok(())
    }
}
