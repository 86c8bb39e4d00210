//! Idempotency records: the store contract behind `Idempotency-Key`, and its backends.
//!
//! A record belongs to one (API key, idempotency key) pair (clarification 6) and is either a
//! lock held by the request that runs under the key (with a TTL the running request renews,
//! so a gateway that dies frees it) or the settled outcome, kept 24 hours. It is a trait
//! because one node keeps records in process ([`InProcessRecords`]) while a fleet of gateways
//! must see each other's ([`RedisRecords`]); one test suite runs against both. The first call
//! of a keyed request, [`IdempotencyStore::begin`], is one round trip: it takes the lock or
//! returns what is there, atomically.
//!
//! Values are opaque bytes to the store: the plugin decides what a settled record holds.

mod memory;
mod redis;

use async_trait::async_trait;

pub use memory::InProcessRecords;
pub use redis::RedisRecords;

/// What `begin` found under a key.
#[derive(Debug, Clone, PartialEq, Eq)]
pub enum Begin {
    /// Nothing was there: the lock is now this request's.
    Started,
    /// Another request holds the lock (it runs now).
    Running,
    /// The settled record.
    Settled(Vec<u8>),
}

#[derive(Debug, Clone, PartialEq, Eq)]
pub enum RecordsError {
    /// The store could not answer in time (down, unreachable, timed out, or failed).
    Unavailable(String),
}

impl std::fmt::Display for RecordsError {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        match self {
            RecordsError::Unavailable(m) => write!(f, "idempotency store unavailable: {m}"),
        }
    }
}

impl std::error::Error for RecordsError {}

/// Records under `key` strings the caller builds (they carry the API key's scope).
/// `lock` is the running request's token: only its holder renews, settles or releases it.
#[async_trait]
pub trait IdempotencyStore: Send + Sync {
    fn backend(&self) -> &'static str;
    /// Take the lock (TTL `lock_ms`) if nothing is under `key`, else say what is there.
    async fn begin(&self, key: &str, lock: &str, lock_ms: u64) -> Result<Begin, RecordsError>;
    /// Push the lock's expiry to `lock_ms` from now; `false` when the lock is no longer held.
    async fn renew(&self, key: &str, lock: &str, lock_ms: u64) -> Result<bool, RecordsError>;
    /// Replace the held lock by the settled `record`, kept `keep_ms`; `false` when the lock
    /// was no longer held (then nothing is written).
    async fn settle(&self, key: &str, lock: &str, record: &[u8], keep_ms: u64) -> Result<bool, RecordsError>;
    /// Drop the lock, so a retry runs normally. Idempotent.
    async fn release(&self, key: &str, lock: &str) -> Result<(), RecordsError>;
}

/// "Off" (no limiter store configured): every call errors, so a request carrying the header
/// answers `503 idempotency_unavailable` rather than running unprotected.
#[derive(Debug, Default, Clone, Copy)]
pub struct DisabledRecords;

#[async_trait]
impl IdempotencyStore for DisabledRecords {
    fn backend(&self) -> &'static str {
        "disabled"
    }
    async fn begin(&self, _: &str, _: &str, _: u64) -> Result<Begin, RecordsError> {
        Err(RecordsError::Unavailable("no limiter store is configured".into()))
    }
    async fn renew(&self, _: &str, _: &str, _: u64) -> Result<bool, RecordsError> {
        Err(RecordsError::Unavailable("no limiter store is configured".into()))
    }
    async fn settle(&self, _: &str, _: &str, _: &[u8], _: u64) -> Result<bool, RecordsError> {
        Err(RecordsError::Unavailable("no limiter store is configured".into()))
    }
    async fn release(&self, _: &str, _: &str) -> Result<(), RecordsError> {
        Err(RecordsError::Unavailable("no limiter store is configured".into()))
    }
}

/// The value stored while a request holds the lock: a marker and its token. A settled record
/// never starts with this marker (the plugin writes JSON objects).
fn lock_value(lock: &str) -> Vec<u8> {
    let mut v = b"\x00lock:".to_vec();
    v.extend_from_slice(lock.as_bytes());
    v
}

fn is_lock(value: &[u8]) -> bool {
    value.starts_with(b"\x00lock:")
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn locks_are_told_apart_from_records() {
        assert!(is_lock(&lock_value("abc")));
        assert!(!is_lock(br#"{"s":1}"#));
        assert_ne!(lock_value("a"), lock_value("b"));
    }
}
