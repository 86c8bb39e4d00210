//! The in-process limiter: the embedded default for one node, with exactly the semantics of
//! the Redis script (same one-second buckets, same lease rules), behind one mutex that is never
//! held across an await.
//!
//! `pingora-limits` is not used here: its `Rate` and `Inflight` are count-min sketches (hash
//! collisions over-count), read their own `Instant` clock (a check carries `now_ms`, which the
//! tests drive and the `X-RateLimit-Reset` header needs), cannot say when the oldest request
//! leaves a window, and `Inflight` guards cannot express leases that expire or are renewed by id.

use std::sync::{Arc, Mutex, MutexGuard};

use async_trait::async_trait;

use super::buckets::{SecondBuckets, leaves_at_ms, second_of};
use super::{ADMISSION_RETRY_CAP_MS, Check, Lease, LimiterError, LimiterStore, Renewal, Verdict, WindowState, expiry};
use crate::runtime::fast_map::FastMap;

/// Idle keys are dropped by a sweep at most this often.
const SWEEP_EVERY_MS: i64 = 10_000;

#[derive(Debug, Default)]
pub struct InProcessLimiter {
    state: Mutex<State>,
}

#[derive(Debug, Default)]
struct State {
    windows: FastMap<String, SecondBuckets>,
    gates: FastMap<String, LeaseSet>,
    tokens: FastMap<String, SecondBuckets>,
    last_sweep_ms: i64,
}

/// The live leases of one gate, by id (shared with the lease, not copied). `earliest` is at
/// most every lease's expiry, so while the clock is before it no lease has expired and a check
/// needs no scan; once it passes, one scan purges the expired leases and makes it exact again.
/// Leases are renewed long before they expire, so that is about once per lease TTL, where an
/// ordered index paid a tree insert and a removal (and a string allocation each) on every
/// admission and release.
#[derive(Debug)]
struct LeaseSet {
    by_id: FastMap<Arc<str>, i64>,
    earliest: i64,
}

impl Default for LeaseSet {
    fn default() -> Self {
        LeaseSet { by_id: FastMap::default(), earliest: i64::MAX }
    }
}

impl LeaseSet {
    /// Drop the leases expired at `now_ms` (alive while `now_ms < expiry`).
    fn purge(&mut self, now_ms: i64) {
        if now_ms < self.earliest {
            return;
        }
        self.by_id.retain(|_, exp| *exp > now_ms);
        self.earliest = self.oldest().unwrap_or(i64::MAX);
    }

    /// The first expiry among the leases (a scan: only a refusal's `Retry-After` asks).
    fn oldest(&self) -> Option<i64> {
        self.by_id.values().copied().min()
    }

    fn live(&self, id: &str, now_ms: i64) -> bool {
        self.by_id.get(id).is_some_and(|&exp| exp > now_ms)
    }

    fn put(&mut self, id: &Arc<str>, exp: i64) {
        match self.by_id.get_mut(&**id) {
            Some(e) => *e = exp,
            None => {
                self.by_id.insert(id.clone(), exp);
            }
        }
        self.earliest = self.earliest.min(exp);
    }

    fn remove(&mut self, id: &str) {
        self.by_id.remove(id);
    }
}

impl InProcessLimiter {
    pub fn new() -> Self {
        Self::default()
    }

    fn lock(&self) -> MutexGuard<'_, State> {
        // Every change below completes before the guard drops, so a poisoned lock still holds
        // consistent state.
        self.state.lock().unwrap_or_else(|e| e.into_inner())
    }
}

/// Count `n` at `now_ms` in the buckets of `key`, created on first use (looked up first, so
/// the key is copied only then).
fn add_to(map: &mut FastMap<String, SecondBuckets>, key: &str, now_ms: i64, n: u64) {
    match map.get_mut(key) {
        Some(b) => b.add(now_ms, n),
        None => map.entry(key.to_string()).or_default().add(now_ms, n),
    }
}

impl State {
    fn sweep(&mut self, now_ms: i64) {
        if now_ms - self.last_sweep_ms < SWEEP_EVERY_MS {
            return;
        }
        self.last_sweep_ms = now_ms;
        self.windows.retain(|_, b| {
            b.trim(now_ms);
            !b.is_empty()
        });
        self.tokens.retain(|_, b| {
            b.trim(now_ms);
            !b.is_empty()
        });
        self.gates.retain(|_, s| {
            s.purge(now_ms);
            !s.by_id.is_empty()
        });
    }

    fn check(&mut self, c: &Check) -> Verdict {
        let now = c.now_ms;
        self.sweep(now);
        // (1) Windows, in order. Each state is what it will be once this request is counted.
        let cur = second_of(now);
        let mut windows = Vec::with_capacity(c.windows.len());
        for (index, w) in c.windows.iter().enumerate() {
            let (n, oldest, wait) = match self.windows.get_mut(&w.key) {
                Some(b) => {
                    let n = b.trim(now);
                    (n, b.oldest(), b.wait_for((n + 1).saturating_sub(w.limit), now))
                }
                None => (0, None, u64::try_from(leaves_at_ms(second_of(now)) - now).unwrap_or(0)),
            };
            if n + 1 > w.limit {
                let state = WindowState { limit: w.limit, remaining: 0, reset_at_ms: now + wait as i64 };
                return Verdict::WindowRefused { index, state, retry_after_ms: wait };
            }
            let oldest = oldest.map_or(cur, |o| o.min(cur));
            windows.push(WindowState {
                limit: w.limit,
                remaining: w.limit - (n + 1),
                reset_at_ms: leaves_at_ms(oldest),
            });
        }
        // (2) Gates, in order.
        let mut gates_in_use = Vec::with_capacity(c.gates.len());
        for (index, g) in c.gates.iter().enumerate() {
            let (n, held, oldest) = match self.gates.get_mut(&g.key) {
                Some(s) => {
                    s.purge(now);
                    (s.by_id.len() as u64, s.live(&c.lease_id, now), s.oldest())
                }
                None => (0, false, None),
            };
            if held {
                gates_in_use.push(n);
            } else if n >= g.limit {
                let wait = oldest.map_or(ADMISSION_RETRY_CAP_MS, |e| u64::try_from(e - now).unwrap_or(0));
                return Verdict::GateRefused { index, in_use: n, retry_after_ms: wait.min(ADMISSION_RETRY_CAP_MS) };
            } else {
                gates_in_use.push(n + 1);
            }
        }
        // (3) Tokens per minute.
        if let Some(t) = &c.tpm {
            let (used, wait) = match self.tokens.get_mut(&t.key) {
                Some(b) => {
                    let used = b.trim(now);
                    (used, b.wait_for(used.saturating_add(t.tokens).saturating_sub(t.limit), now))
                }
                None => (0, 0),
            };
            if t.tokens > t.limit {
                return Verdict::TokensRefused { used, limit: t.limit, retry_after_ms: 0, never: true };
            }
            if used.saturating_add(t.tokens) > t.limit {
                let retry_after_ms = wait.min(ADMISSION_RETRY_CAP_MS);
                return Verdict::TokensRefused { used, limit: t.limit, retry_after_ms, never: false };
            }
        }
        // Everything passed: record.
        for w in &c.windows {
            add_to(&mut self.windows, &w.key, now, 1);
        }
        let lease = c.lease();
        if let Some(l) = &lease {
            for key in &l.keys {
                match self.gates.get_mut(key.as_str()) {
                    Some(set) => set.put(&l.id, l.expires_at_ms),
                    None => self.gates.entry(key.clone()).or_default().put(&l.id, l.expires_at_ms),
                }
            }
        }
        if let Some(t) = &c.tpm {
            add_to(&mut self.tokens, &t.key, now, t.tokens);
        }
        Verdict::Admitted { windows, gates_in_use, lease }
    }

    /// As the Redis script: a lease missing or expired on a gate is put back there (the
    /// request is still running; here that happens only when renewal stalled past the TTL).
    fn renew(&mut self, lease: &Lease, ttl_ms: u64, now_ms: i64) -> Renewal {
        let live = lease.keys.iter().all(|k| self.gates.get(k).is_some_and(|s| s.live(&lease.id, now_ms)));
        let exp = expiry(now_ms, ttl_ms);
        for key in &lease.keys {
            self.gates.entry(key.clone()).or_default().put(&lease.id, exp);
        }
        if live { Renewal::Renewed { expires_at_ms: exp } } else { Renewal::Restored { expires_at_ms: exp } }
    }

    fn release(&mut self, lease: &Lease) {
        for key in &lease.keys {
            if let Some(s) = self.gates.get_mut(key) {
                s.remove(&lease.id);
            }
        }
    }
}

#[async_trait]
impl LimiterStore for InProcessLimiter {
    fn backend(&self) -> &'static str {
        "in-process"
    }

    async fn check(&self, c: &Check) -> Result<Verdict, LimiterError> {
        c.validate()?;
        Ok(self.lock().check(c))
    }

    async fn renew(&self, lease: &Lease, ttl_ms: u64, now_ms: i64) -> Result<Renewal, LimiterError> {
        Ok(self.lock().renew(lease, ttl_ms, now_ms))
    }

    async fn release(&self, lease: &Lease) -> Result<(), LimiterError> {
        self.lock().release(lease);
        Ok(())
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::state::limits::{ConcurrencyGate, TokenBudget, WindowLimit};

    #[test]
    fn a_gate_counts_only_unexpired_leases_and_scans_only_past_its_bound() {
        let mut s = LeaseSet::default();
        s.put(&"a".into(), 100);
        s.put(&"b".into(), 200);
        s.put(&"c".into(), 300);
        s.remove("a");
        assert_eq!(s.earliest, 100, "a removal leaves the bound stale (still below every expiry)");
        s.purge(150);
        assert_eq!((s.by_id.len(), s.earliest), (2, 200), "past the bound: one scan, nothing expired, bound exact");
        s.put(&"b".into(), 400);
        assert_eq!(s.earliest, 200, "a renewal keeps the bound below every expiry");
        s.purge(250);
        assert_eq!((s.by_id.len(), s.earliest), (2, 300));
        s.purge(300);
        assert!(s.live("b", 300) && !s.live("c", 300), "c expired at 300");
        assert_eq!((s.by_id.len(), s.oldest()), (1, Some(400)));
        s.put(&"d".into(), 50);
        s.purge(60);
        assert!(!s.by_id.contains_key("d"), "an earlier expiry lowers the bound, so it is purged on time");
        assert_eq!(s.by_id.len(), 1);
    }

    #[test]
    fn idle_keys_are_swept() {
        let mut st = State::default();
        let c = Check {
            now_ms: 1_000_000,
            windows: vec![WindowLimit { key: "k".into(), limit: 10 }],
            gates: vec![ConcurrencyGate { scope: "m", key: "g".into(), limit: 10 }],
            tpm: Some(TokenBudget { key: "t".into(), tokens: 5, limit: 10 }),
            lease_id: "r".into(),
            lease_ttl_ms: 30_000,
        };
        assert!(matches!(st.check(&c), Verdict::Admitted { .. }));
        assert_eq!((st.windows.len(), st.gates.len(), st.tokens.len()), (1, 1, 1));
        // 61 s later everything has left its window and the lease has expired.
        let later = Check { windows: vec![], gates: vec![], tpm: None, now_ms: 1_061_000, ..c };
        assert!(matches!(st.check(&later), Verdict::Admitted { .. }));
        assert_eq!((st.windows.len(), st.gates.len(), st.tokens.len()), (0, 0, 0));
    }
}
