//! Placement: choose the replica of a pool that a request goes to, and hold its
//! concurrency slot until the request ends. A request with an affinity key (its session or
//! its opening messages, `session.rs`) prefers the replica that rendezvous hashing gives the
//! key, so every gateway instance agrees without sharing state and adding or removing a
//! replica moves only the sessions it takes or held; when that replica is full or failed,
//! the request spills to the least-loaded other one. Without a key: least loaded first. At
//! most two replicas are tried, then `hosted_model_at_capacity`.

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
        self.replica.state.in_flight.fetch_sub(1, Ordering::AcqRel);
    }
}

/// Why no slot was given.
#[derive(Debug, PartialEq, Eq)]
pub enum NoSlot {
    /// The replicas tried were each at their own concurrency.
    AtCapacity,
    /// Every replica was already tried (connect failures).
    Exhausted,
    /// Every replica not yet tried is ejected after connect failures (passive health).
    Unhealthy,
}

/// How long an ejected replica gets no new request (decisions 121 and 204).
pub const EJECT_MS: i64 = 10_000;

/// How a replica failed a request (passive health, decision 204).
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Fault {
    /// It refused the connection: nothing listens there now.
    Refused,
    /// The connection did not open in time.
    ConnectTimeout,
    /// A streamed request's response header did not come in time.
    NoHeader,
    /// A stream's first token did not come within the first-token budget.
    NoFirstToken,
    /// It closed or reset the connection before its answer ended.
    Reset,
    /// It answered with a 5xx status.
    ServerError,
}

impl Fault {
    /// The metric label and log word.
    pub fn name(self) -> &'static str {
        match self {
            Fault::Refused => "refused",
            Fault::ConnectTimeout => "connect_timeout",
            Fault::NoHeader => "no_header",
            Fault::NoFirstToken => "no_first_token",
            Fault::Reset => "reset",
            Fault::ServerError => "server_error",
        }
    }
}

fn try_reserve(index: usize, replica: &Arc<Replica>) -> Option<Slot> {
    replica
        .state
        .in_flight
        .fetch_update(Ordering::AcqRel, Ordering::Acquire, |n| (n < replica.max_concurrency).then_some(n + 1))
        .ok()
        .map(|_| Slot { index, replica: replica.clone() })
}

/// Reserve a slot on the least-loaded replica not in `tried`, offering the request to at
/// most `MAX_TRIES` replicas in all (counting `tried`).
pub fn place(pool: &Pool, tried: &[usize]) -> Result<Slot, NoSlot> {
    place_for(pool, tried, None).map(|(slot, _)| slot)
}

/// A stable 64-bit mix (splitmix64's finalizer): the same on every instance and run.
fn mix(mut z: u64) -> u64 {
    z = (z ^ (z >> 30)).wrapping_mul(0xbf58_476d_1ce4_e5b9);
    z = (z ^ (z >> 27)).wrapping_mul(0x94d0_49bb_1331_11eb);
    z ^ (z >> 31)
}

/// A replica's name as a number (FNV-1a of its configured `host:port`).
fn replica_id(r: &Replica) -> u64 {
    r.authority.bytes().fold(0xcbf2_9ce4_8422_2325, |h, b| (h ^ u64::from(b)).wrapping_mul(0x0100_0000_01b3))
}

/// The replica rendezvous hashing gives `key`: the highest score of key and replica.
pub fn preferred(pool: &Pool, key: u64) -> Option<usize> {
    pool.replicas.iter().enumerate().max_by_key(|(_, r)| mix(key ^ replica_id(r))).map(|(i, _)| i)
}

/// Reserve a slot, preferring `key`'s replica when given; the flag says the request spilled
/// (it had a preferred replica and went elsewhere).
pub fn place_for(pool: &Pool, tried: &[usize], key: Option<u64>) -> Result<(Slot, bool), NoSlot> {
    place_home(pool, tried, key.and_then(|k| preferred(pool, k)))
}

/// Reserve a slot, preferring replica `home` when given (a session's stored replica, or its
/// rendezvous one); the flag says the request spilled.
pub fn place_home(pool: &Pool, tried: &[usize], home: Option<usize>) -> Result<(Slot, bool), NoSlot> {
    let budget = MAX_TRIES.saturating_sub(tried.len());
    if budget == 0 {
        return Err(NoSlot::Exhausted);
    }
    let now = crate::runtime::clock::now_ms();
    let home = home.filter(|&h| h < pool.replicas.len());
    if let Some(h) = home.filter(|&h| !tried.contains(&h) && pool.replicas[h].up(now)) {
        if let Some(slot) = try_reserve(h, &pool.replicas[h]) {
            return Ok((slot, false));
        }
        // Full: the one other replica this request may still be offered to.
        let mut others = tried.to_vec();
        others.push(h);
        let other = least_loaded(pool, &others, budget - 1, now);
        return other.map(|slot| (slot, true)).map_err(|e| if e == NoSlot::Unhealthy { NoSlot::AtCapacity } else { e });
    }
    least_loaded(pool, tried, budget, now).map(|slot| (slot, home.is_some()))
}

fn least_loaded(pool: &Pool, skip: &[usize], budget: usize, now: i64) -> Result<Slot, NoSlot> {
    if budget == 0 {
        return Err(NoSlot::AtCapacity);
    }
    let untried = pool.replicas.iter().enumerate().filter(|(i, _)| !skip.contains(i));
    if untried.clone().next().is_some() && untried.clone().all(|(_, r)| !r.up(now)) {
        return Err(NoSlot::Unhealthy);
    }
    let mut candidates: Vec<(u64, usize)> = untried
        .filter(|(_, r)| r.up(now))
        .map(|(i, r)| {
            // Load as a fraction of the replica's own concurrency, scaled to integers.
            let load = u64::from(r.in_flight()) * 1_000_000 / u64::from(r.max_concurrency.max(1));
            (load, i)
        })
        .collect();
    if candidates.is_empty() {
        return Err(NoSlot::Exhausted);
    }
    candidates.sort_unstable();
    candidates.iter().take(budget).find_map(|&(_, i)| try_reserve(i, &pool.replicas[i])).ok_or(NoSlot::AtCapacity)
}

/// The replica answered (any status a live server gives): its failure streak ends.
pub fn answered(replica: &Replica) {
    if replica.state.failures.load(Ordering::Relaxed) != 0 {
        replica.state.failures.store(0, Ordering::Relaxed);
    }
}

/// Passive health (decision 204): a replica that refused a connection gets no new request for
/// [`EJECT_MS`] at once; one that timed out, reset or answered 5xx after
/// `pool.eject_after_failures` such failures in a row (an answer in between starts the count
/// again), unless it is the pool's last replica in service: a burst that overflowed its accept
/// queue, or requests whose content makes it fail, are not a dead server, and ejecting the
/// last one would refuse every request of the pool (the active checks take out a dead one).
/// Returns whether it was ejected.
pub fn failed(pool: &Pool, replica: &Replica, fault: Fault, request_id: &str) -> bool {
    let streak = replica.state.failures.fetch_add(1, Ordering::Relaxed).saturating_add(1);
    let now = crate::runtime::clock::now_ms();
    let eject = fault == Fault::Refused
        || (streak >= pool.eject_after_failures
            && pool.replicas.iter().any(|r| !std::ptr::eq(&**r, replica) && r.up(now)));
    if !eject {
        log::info!(
            "{request_id}: replica {} of {} failed ({}, {streak} in a row)",
            replica.authority,
            pool.model_id,
            fault.name()
        );
        return false;
    }
    replica.state.ejected_until_ms.store(now + EJECT_MS, Ordering::Relaxed);
    replica.state.failures.store(0, Ordering::Relaxed);
    crate::observe::metrics::replica_ejected(&pool.model_id, &replica.authority, fault.name());
    log::warn!(
        "{request_id}: replica {} of {} ejected for {} s ({}, {streak} failure(s) in a row)",
        replica.authority,
        pool.model_id,
        EJECT_MS / 1000,
        fault.name()
    );
    true
}

/// Requests in flight across the pool (this instance's view).
pub fn pool_in_flight(pool: &Pool) -> u32 {
    pool.replicas.iter().map(|r| r.in_flight()).sum()
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::proxy::placement_sim::uniform_pool;

    #[test]
    fn least_loaded_replica_wins_and_slots_release_on_drop() {
        let p = uniform_pool(2, 2);
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
        let p = uniform_pool(3, 1);
        let held: Vec<_> = (0..3).filter_map(|_| place(&p, &[]).ok()).collect();
        assert_eq!(held.len(), 3);
        assert_eq!(place(&p, &[]).err(), Some(NoSlot::AtCapacity));
    }

    #[test]
    fn a_key_prefers_its_replica_and_spills_to_the_least_loaded_other() {
        let p = uniform_pool(3, 1);
        let key = 42;
        let home = preferred(&p, key).unwrap_or(0);
        let (first, spilled) = place_for(&p, &[], Some(key)).ok().unwrap();
        assert_eq!((first.index, spilled), (home, false));
        let (second, spilled) = place_for(&p, &[], Some(key)).ok().unwrap();
        assert!(spilled && second.index != home, "the home replica is full: served elsewhere");
        drop(first);
        let (again, spilled) = place_for(&p, &[], Some(key)).ok().unwrap();
        assert_eq!((again.index, spilled), (home, false), "back home once it has room");
        // A connect failure on the home replica: the retry goes elsewhere.
        drop(again);
        let (retry, spilled) = place_for(&p, &[home], Some(key)).ok().unwrap();
        assert!(spilled && retry.index != home);
    }

    #[test]
    fn rendezvous_moves_only_the_keys_of_a_removed_replica() {
        let three = uniform_pool(3, 8);
        let mut two = uniform_pool(3, 8);
        two.replicas.remove(2);
        let mut moved = 0;
        for key in 0..3_000u64 {
            let before = preferred(&three, key).unwrap_or(0);
            let after = preferred(&two, key).unwrap_or(0);
            if before != 2 {
                assert_eq!(before, after, "key {key} moved without its replica going");
            } else {
                moved += 1;
            }
        }
        assert!((800..1_200).contains(&moved), "about a third of the keys were on the removed replica: {moved}");
    }

    #[test]
    fn ejected_replicas_get_no_new_requests_and_come_back() {
        let p = uniform_pool(2, 4);
        let now = crate::runtime::clock::now_ms();
        p.replicas[0].state.ejected_until_ms.store(now + 60_000, Ordering::Relaxed);
        for _ in 0..3 {
            assert_eq!(place(&p, &[]).ok().map(|s| s.index), Some(1), "only the healthy replica");
        }
        let home = preferred(&p, 5).unwrap_or(0);
        p.replicas[home].state.ejected_until_ms.store(now + 60_000, Ordering::Relaxed);
        p.replicas[1 - home].state.ejected_until_ms.store(0, Ordering::Relaxed);
        let (slot, spilled) = place_for(&p, &[], Some(5)).ok().unwrap();
        assert!(spilled && slot.index != home, "an ejected home is skipped");
        p.replicas[1 - home].state.ejected_until_ms.store(now + 60_000, Ordering::Relaxed);
        assert_eq!(place(&p, &[]).err(), Some(NoSlot::Unhealthy), "no healthy replica: answered at once");
        p.replicas[0].state.ejected_until_ms.store(now - 1, Ordering::Relaxed);
        assert_eq!(place(&p, &[]).ok().map(|s| s.index), Some(0), "back once its ejection ends");
    }

    #[test]
    fn consecutive_failures_eject_an_answer_resets_the_count_and_the_last_replica_is_spared() {
        let p = uniform_pool(2, 4);
        let (a, b) = (&p.replicas[0], &p.replicas[1]);
        assert!(!failed(&p, a, Fault::Reset, "r"));
        assert!(!failed(&p, a, Fault::ServerError, "r"));
        answered(a);
        assert!(!failed(&p, a, Fault::NoHeader, "r"));
        assert!(!failed(&p, a, Fault::Reset, "r"));
        assert!(a.up(crate::runtime::clock::now_ms()), "two in a row after an answer: still in service");
        assert!(failed(&p, a, Fault::ConnectTimeout, "r"), "the third in a row ejects");
        assert!(!a.up(crate::runtime::clock::now_ms()));
        // `b` is now the last replica in service: timeouts and 5xx never take it out...
        for fault in [Fault::ConnectTimeout, Fault::ServerError, Fault::Reset, Fault::NoHeader] {
            for _ in 0..5 {
                assert!(!failed(&p, b, fault, "r"));
            }
        }
        assert!(b.up(crate::runtime::clock::now_ms()));
        // ...a refused connection does, at once.
        answered(b);
        assert!(failed(&p, b, Fault::Refused, "r"));
        assert_eq!(place(&p, &[]).err(), Some(NoSlot::Unhealthy));
    }

    #[test]
    fn at_most_two_replicas_are_tried() {
        let p = uniform_pool(3, 1);
        assert!(place(&p, &[0]).is_ok());
        assert_eq!(place(&p, &[0, 1]).err(), Some(NoSlot::Exhausted));
    }
}
