//! Placement: choose the replica of a pool that a request goes to, and hold its
//! concurrency slot until the request ends. Least loaded first (session affinity comes
//! later); at most two replicas are tried, then `hosted_model_at_capacity`.

use std::sync::Arc;
use std::sync::atomic::Ordering;

use crate::config::{Pool, Replica};

/// The most replicas one request may be offered to (spec: "every replica reached (at most
/// two) is full").
pub const MAX_TRIES: usize = 2;

/// A held concurrency slot on one replica; released on drop, whatever path the request took.
#[derive(Debug)]
pub struct Slot {
    pub index: usize,
    pub replica: Arc<Replica>,
}

impl Drop for Slot {
    fn drop(&mut self) {
        self.replica.in_flight.fetch_sub(1, Ordering::AcqRel);
    }
}

/// Why no slot was given.
#[derive(Debug, PartialEq, Eq)]
pub enum NoSlot {
    /// The replicas tried were each at their own concurrency.
    AtCapacity,
    /// Every replica was already tried (connect failures).
    Exhausted,
}

fn try_reserve(index: usize, replica: &Arc<Replica>) -> Option<Slot> {
    replica
        .in_flight
        .fetch_update(Ordering::AcqRel, Ordering::Acquire, |n| (n < replica.max_concurrency).then_some(n + 1))
        .ok()
        .map(|_| Slot { index, replica: replica.clone() })
}

/// Reserve a slot on the least-loaded replica not in `tried`, offering the request to at
/// most `MAX_TRIES` replicas in all (counting `tried`).
pub fn place(pool: &Pool, tried: &[usize]) -> Result<Slot, NoSlot> {
    let budget = MAX_TRIES.saturating_sub(tried.len());
    if budget == 0 {
        return Err(NoSlot::Exhausted);
    }
    let mut candidates: Vec<(u64, usize)> = pool
        .replicas
        .iter()
        .enumerate()
        .filter(|(i, _)| !tried.contains(i))
        .map(|(i, r)| {
            // Load as a fraction of the replica's own concurrency, scaled to integers.
            let load = u64::from(r.in_flight.load(Ordering::Acquire)) * 1_000_000 / u64::from(r.max_concurrency.max(1));
            (load, i)
        })
        .collect();
    if candidates.is_empty() {
        return Err(NoSlot::Exhausted);
    }
    candidates.sort_unstable();
    candidates.iter().take(budget).find_map(|&(_, i)| try_reserve(i, &pool.replicas[i])).ok_or(NoSlot::AtCapacity)
}

/// Requests in flight across the pool (this instance's view).
pub fn pool_in_flight(pool: &Pool) -> u32 {
    pool.replicas.iter().map(|r| r.in_flight.load(Ordering::Acquire)).sum()
}

#[cfg(test)]
mod tests {
    use super::*;
    use std::sync::atomic::AtomicU32;
    use std::time::Duration;

    fn pool(caps: &[u32]) -> Pool {
        Pool {
            model_id: "m".into(),
            upstream_model: "m".into(),
            replicas: caps
                .iter()
                .enumerate()
                .map(|(i, &c)| {
                    Arc::new(Replica {
                        addr: ([127, 0, 0, 1], 9000 + i as u16).into(),
                        authority: format!("127.0.0.1:{}", 9000 + i),
                        max_concurrency: c,
                        in_flight: AtomicU32::new(0),
                    })
                })
                .collect(),
            connect_timeout: Duration::from_secs(1),
            busy_threshold_percent: 75,
            authorization: None,
        }
    }

    #[test]
    fn least_loaded_replica_wins_and_slots_release_on_drop() {
        let p = pool(&[2, 2]);
        let a = place(&p, &[]).ok();
        let b = place(&p, &[]).ok();
        let (Some(a), Some(b)) = (a, b) else { panic!("two slots expected") };
        assert_ne!(a.index, b.index, "second request goes to the idle replica");
        assert_eq!(pool_in_flight(&p), 2);
        drop(a);
        drop(b);
        assert_eq!(pool_in_flight(&p), 0);
    }

    #[test]
    fn full_replicas_mean_at_capacity() {
        let p = pool(&[1, 1, 1]);
        let held: Vec<_> = (0..3).filter_map(|_| place(&p, &[]).ok()).collect();
        assert_eq!(held.len(), 3);
        assert_eq!(place(&p, &[]).err(), Some(NoSlot::AtCapacity));
    }

    #[test]
    fn at_most_two_replicas_are_tried() {
        let p = pool(&[1, 1, 1]);
        assert!(place(&p, &[0]).is_ok());
        assert_eq!(place(&p, &[0, 1]).err(), Some(NoSlot::Exhausted));
    }
}
