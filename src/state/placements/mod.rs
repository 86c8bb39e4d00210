//! Where established sessions are placed: the replica a session runs on, kept while it is
//! used and forgotten after `budgets.session_affinity_idle_ttl_seconds` of idleness. Shared
//! by every gateway instance when the limiter store is Redis (one round trip per placed
//! request), in process on one node. Only the affinity key (a hash) is stored, never an
//! identity. A store that fails is a missed preference, never a refused request: placement
//! then falls back to rendezvous hashing (decision 118).

pub mod memory;
pub mod redis;

use async_trait::async_trait;

pub use memory::InProcessPlacements;
pub use redis::RedisPlacements;

/// A session's stored placement.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct Placed {
    /// The replica's configured `host:port`.
    pub replica: String,
    /// Requests in a row that could not run there (a spill that persists moves the session).
    pub spills: u32,
}

impl Placed {
    fn encode(&self) -> String {
        format!("{}|{}", self.spills, self.replica)
    }

    fn decode(s: &str) -> Option<Placed> {
        let (spills, replica) = s.split_once('|')?;
        Some(Placed { replica: replica.to_string(), spills: spills.parse().ok()? })
    }
}

#[derive(Debug, Clone, PartialEq, Eq)]
pub struct StoreDown(pub String);

impl std::fmt::Display for StoreDown {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        write!(f, "placement store unavailable: {}", self.0)
    }
}

#[async_trait]
pub trait PlacementStore: Send + Sync {
    /// The session's placement, its idle time reset to `ttl_ms` when found.
    async fn get(&self, key: u64, ttl_ms: u64) -> Result<Option<Placed>, StoreDown>;
    /// Store the session's placement for `ttl_ms` of idleness.
    async fn set(&self, key: u64, placed: &Placed, ttl_ms: u64) -> Result<(), StoreDown>;
}

/// Requests in a row away from a session's replica after which the session moves to where
/// they ran (decision 118).
pub const SPILLS_TO_MOVE: u32 = 3;

/// What to store after a request with `key` ran on `ran_on`, given what was stored before
/// (`None`: a new session) and whether it ran on its preferred replica. `None`: nothing to
/// write (the read already refreshed the idle time).
pub fn next(stored: Option<&Placed>, preferred: &str, ran_on: &str) -> Option<Placed> {
    match stored {
        None => Some(Placed { replica: ran_on.to_string(), spills: 0 }),
        Some(p) if ran_on == p.replica => (p.spills > 0).then(|| Placed { replica: p.replica.clone(), spills: 0 }),
        Some(p) if p.replica != preferred => {
            // Its stored replica left the pool: it lives where it ran now.
            Some(Placed { replica: ran_on.to_string(), spills: 0 })
        }
        Some(p) if p.spills + 1 >= SPILLS_TO_MOVE => Some(Placed { replica: ran_on.to_string(), spills: 0 }),
        Some(p) => Some(Placed { replica: p.replica.clone(), spills: p.spills + 1 }),
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    fn at(r: &str, spills: u32) -> Placed {
        Placed { replica: r.into(), spills }
    }

    #[test]
    fn a_session_is_kept_and_moves_only_after_spills_in_a_row() {
        assert_eq!(next(None, "a", "a"), Some(at("a", 0)), "a new session is stored where it ran");
        assert_eq!(next(Some(&at("a", 0)), "a", "a"), None, "home: the read refreshed it");
        assert_eq!(next(Some(&at("a", 0)), "a", "b"), Some(at("a", 1)));
        assert_eq!(next(Some(&at("a", 1)), "a", "a"), Some(at("a", 0)), "back home: the streak ends");
        assert_eq!(next(Some(&at("a", 1)), "a", "b"), Some(at("a", 2)));
        assert_eq!(next(Some(&at("a", 2)), "a", "c"), Some(at("c", 0)), "the third spill in a row moves it");
        assert_eq!(next(Some(&at("gone", 0)), "a", "a"), Some(at("a", 0)), "its replica left the pool");
        assert_eq!(Placed::decode(&at("10.0.0.1:80", 2).encode()), Some(at("10.0.0.1:80", 2)));
    }
}
