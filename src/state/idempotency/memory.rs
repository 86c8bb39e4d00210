//! Idempotency records in this process: the embedded default for one node. Expired entries
//! are dropped when met and swept when the map grows, so memory holds the records of the last
//! 24 hours, and never more than [`MAX_BYTES`] of them (issue 49): past it the records that
//! expire soonest go first, and a retry of one of those runs again. Several nodes, or a
//! guarantee for every record of the day, need the Redis store.

use std::collections::HashMap;
use std::sync::Mutex;
use std::time::{Duration, Instant};

use async_trait::async_trait;

use super::{Begin, IdempotencyStore, RecordsError, is_lock, lock_value};

/// Most bytes of keys and records kept (a record is at most about 1 MiB).
pub const MAX_BYTES: usize = 256 * 1024 * 1024;

#[derive(Default)]
pub struct InProcessRecords {
    state: Mutex<Records>,
}

#[derive(Default)]
struct Records {
    map: HashMap<String, (Vec<u8>, Instant)>,
    /// Bytes of the keys and values in `map`.
    bytes: usize,
}

impl Records {
    fn size(key: &str, value: &[u8]) -> usize {
        key.len() + value.len()
    }

    /// The live value under `key` (an expired one is removed).
    fn live(&mut self, key: &str, now: Instant) -> Option<&mut (Vec<u8>, Instant)> {
        if self.map.get(key).is_some_and(|(_, exp)| *exp <= now) {
            self.remove(key);
        }
        self.map.get_mut(key)
    }

    fn insert(&mut self, key: &str, value: Vec<u8>, exp: Instant) {
        self.bytes += Self::size(key, &value);
        if let Some((old, _)) = self.map.insert(key.to_string(), (value, exp)) {
            self.bytes -= Self::size(key, &old);
        }
    }

    fn remove(&mut self, key: &str) {
        if let Some((old, _)) = self.map.remove(key) {
            self.bytes -= Self::size(key, &old);
        }
    }

    /// Drop expired records; then, while above `max` bytes, the ones that expire soonest.
    fn sweep(&mut self, now: Instant, max: usize) {
        self.map.retain(|_, (_, exp)| *exp > now);
        self.bytes = self.map.iter().map(|(k, (v, _))| Self::size(k, v)).sum();
        if self.bytes <= max {
            return;
        }
        let mut by_expiry: Vec<(Instant, String)> = self.map.iter().map(|(k, (_, exp))| (*exp, k.clone())).collect();
        by_expiry.sort_unstable();
        for (_, key) in by_expiry {
            if self.bytes <= max * 3 / 4 {
                break;
            }
            self.remove(&key);
        }
        log::warn!("idempotency records above {max} bytes in this process: the soonest to expire were dropped");
    }
}

impl InProcessRecords {
    pub fn new() -> Self {
        Self::default()
    }

    fn with<T>(&self, f: impl FnOnce(&mut Records, Instant) -> T) -> T {
        let now = Instant::now();
        let mut records = self.state.lock().unwrap_or_else(|p| p.into_inner());
        let len = records.map.len();
        if (len > 4096 && len.is_power_of_two()) || records.bytes > MAX_BYTES {
            records.sweep(now, MAX_BYTES);
        }
        f(&mut records, now)
    }
}

fn after(now: Instant, ms: u64) -> Instant {
    now + Duration::from_millis(ms)
}

#[async_trait]
impl IdempotencyStore for InProcessRecords {
    fn backend(&self) -> &'static str {
        "in_process"
    }

    async fn begin(&self, key: &str, lock: &str, lock_ms: u64) -> Result<Begin, RecordsError> {
        Ok(self.with(|r, now| match r.live(key, now) {
            Some((v, _)) if is_lock(v) => Begin::Running,
            Some((v, _)) => Begin::Settled(v.clone()),
            None => {
                r.insert(key, lock_value(lock), after(now, lock_ms));
                Begin::Started
            }
        }))
    }

    async fn renew(&self, key: &str, lock: &str, lock_ms: u64) -> Result<bool, RecordsError> {
        Ok(self.with(|r, now| match r.live(key, now) {
            Some((v, exp)) if *v == lock_value(lock) => {
                *exp = after(now, lock_ms);
                true
            }
            _ => false,
        }))
    }

    async fn settle(&self, key: &str, lock: &str, record: &[u8], keep_ms: u64) -> Result<bool, RecordsError> {
        Ok(self.with(|r, now| match r.live(key, now) {
            Some(entry) if entry.0 == lock_value(lock) => {
                r.insert(key, record.to_vec(), after(now, keep_ms));
                true
            }
            _ => false,
        }))
    }

    async fn release(&self, key: &str, lock: &str) -> Result<(), RecordsError> {
        self.with(|r, now| {
            if r.live(key, now).is_some_and(|(v, _)| *v == lock_value(lock)) {
                r.remove(key);
            }
        });
        Ok(())
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    /// Issue 49: the records' bytes are counted exactly and bounded; past the bound the
    /// records that expire soonest leave first.
    #[test]
    fn records_are_bounded_by_bytes_and_the_soonest_to_expire_leave_first() {
        let mut r = Records::default();
        let now = Instant::now();
        for i in 0..100u64 {
            r.insert(&format!("k{i:03}"), vec![0u8; 1_000], now + Duration::from_secs(i + 1));
        }
        assert_eq!(r.bytes, 100 * 1_004);
        r.insert("k000", vec![0u8; 10], now + Duration::from_secs(1));
        assert_eq!(r.bytes, 99 * 1_004 + 14, "a replaced value is counted once");
        r.sweep(now, 50_000);
        assert!(r.bytes <= 50_000 * 3 / 4, "{}", r.bytes);
        assert!(r.map.contains_key("k099") && !r.map.contains_key("k001"), "the latest to expire stay");
        r.sweep(now + Duration::from_secs(1_000), 50_000);
        assert_eq!((r.map.len(), r.bytes), (0, 0), "expired records are swept");
    }
}
