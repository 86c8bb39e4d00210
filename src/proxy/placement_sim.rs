//! A placement simulation (issue 15): conversations of several turns over a pool, placed by
//! the real `placement::place_for` either by load alone or by their session key, with a
//! prefix-cache model of the replicas (a turn's prompt is cached up to the previous turn's
//! prompt when that turn ran on the same replica). Reports the cached-token share against the
//! ideal (every later turn hitting) and the load spread (max/mean in flight per replica).
//! Deterministic: a seeded generator, no clock. `benches/placement_sim.rs` prints it.

use std::sync::Arc;
use std::time::Duration;

use crate::config::{Pool, Replica};
use crate::proxy::placement::place_for;

#[derive(Debug, Clone, Copy, PartialEq)]
pub struct SimReport {
    /// Cached prompt tokens / cached tokens if every later turn found its prefix.
    pub cached_share_of_ideal: f64,
    /// Mean over time steps of (busiest replica's in-flight / mean in-flight).
    pub load_max_over_mean: f64,
    /// Requests refused because every replica offered was full.
    pub refused: u64,
}

#[derive(Debug, Clone, Copy)]
pub struct SimParams {
    pub sessions: usize,
    pub turns: usize,
    pub replicas: usize,
    pub capacity: u32,
    /// New requests per time step, and how many steps each runs.
    pub arrivals_per_step: usize,
    pub steps_per_request: usize,
    /// Prompt tokens added per turn.
    pub tokens_per_turn: u64,
    pub seed: u64,
}

impl Default for SimParams {
    fn default() -> Self {
        SimParams {
            sessions: 1_000,
            turns: 10,
            replicas: 4,
            capacity: 64,
            arrivals_per_step: 40,
            steps_per_request: 5,
            tokens_per_turn: 500,
            seed: 7,
        }
    }
}

/// A pool of `n` replicas (`10.0.0.1:8000`, `:8001`, ...) of `capacity` slots each.
pub fn uniform_pool(n: usize, capacity: u32) -> Pool {
    Pool {
        model_id: "sim".into(),
        upstream_model: "sim".into(),
        replicas: (0..n)
            .map(|i| {
                Arc::new(Replica {
                    addr: ([10, 0, 0, 1], 8000 + i as u16).into(),
                    authority: format!("10.0.0.1:{}", 8000 + i),
                    max_concurrency: capacity,
                    state: Default::default(),
                })
            })
            .collect(),
        connect_timeout: Duration::from_secs(1),
        idle_connection: Duration::from_secs(4),
        busy_threshold_percent: 75,
        authorization: None,
        health_check: None,
        tls: None,
        eject_after_failures: 3,
        first_byte_timeout: Duration::from_secs(30),
    }
}

/// Run the simulation; `affinity` places by each session's key, else by load alone.
pub fn simulate(p: SimParams, affinity: bool) -> SimReport {
    let pool = uniform_pool(p.replicas, p.capacity);
    let mut rng = p.seed.max(1);
    let mut next = move || {
        rng ^= rng << 13;
        rng ^= rng >> 7;
        rng ^= rng << 17;
        rng
    };
    // Each session's next turn and the replica its last turn ran on.
    let mut turn = vec![0usize; p.sessions];
    let mut last = vec![None::<usize>; p.sessions];
    let keys: Vec<u64> =
        (0..p.sessions).map(|s| crate::http::session::key("sim-ws", "generic", &format!("s{s}"))).collect();
    let mut waiting: Vec<usize> = (0..p.sessions).collect();
    // (ends at step, session, slot): a session's next turn waits for its previous one.
    let mut running: Vec<(usize, usize, crate::proxy::placement::Slot)> = Vec::new();
    let (mut cached, mut ideal, mut refused) = (0u64, 0u64, 0u64);
    let (mut spread_sum, mut spread_n) = (0.0, 0u64);
    let mut step = 0usize;
    while !waiting.is_empty() || !running.is_empty() {
        running.retain(|(end, s, _)| {
            let done = *end <= step;
            if done && turn[*s] < p.turns {
                waiting.push(*s);
            }
            !done
        });
        for _ in 0..p.arrivals_per_step {
            if waiting.is_empty() {
                break;
            }
            let pick = (next() % waiting.len() as u64) as usize;
            let s = waiting.swap_remove(pick);
            let key = affinity.then_some(keys[s]);
            match place_for(&pool, &[], key) {
                Ok((slot, _)) => {
                    let t = turn[s] as u64;
                    if t > 0 {
                        ideal += t * p.tokens_per_turn;
                        if last[s] == Some(slot.index) {
                            cached += t * p.tokens_per_turn;
                        }
                    }
                    last[s] = Some(slot.index);
                    turn[s] += 1;
                    running.push((step + p.steps_per_request, s, slot));
                }
                Err(_) => {
                    refused += 1;
                    waiting.push(s);
                }
            }
        }
        let loads: Vec<f64> = pool.replicas.iter().map(|r| f64::from(r.in_flight())).collect();
        let mean = loads.iter().sum::<f64>() / loads.len() as f64;
        if mean >= 1.0 {
            spread_sum += loads.iter().copied().fold(0.0, f64::max) / mean;
            spread_n += 1;
        }
        step += 1;
    }
    SimReport {
        cached_share_of_ideal: if ideal == 0 { 0.0 } else { cached as f64 / ideal as f64 },
        load_max_over_mean: if spread_n == 0 { 0.0 } else { spread_sum / spread_n as f64 },
        refused,
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn affinity_keeps_prefixes_warm_and_load_even() {
        let p = SimParams::default();
        let load = simulate(p, false);
        let sticky = simulate(p, true);
        assert!(sticky.cached_share_of_ideal >= 0.90, "{sticky:?}");
        assert!(sticky.load_max_over_mean <= 1.25, "{sticky:?}");
        assert!(load.cached_share_of_ideal < 0.5, "least-loaded scatters conversations: {load:?}");
        assert_eq!((load.refused, sticky.refused), (0, 0));
    }
}
