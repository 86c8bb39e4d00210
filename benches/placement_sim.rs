//! The placement simulation of issue 15: 1,000 sessions of 10 turns over 4 replicas, placed
//! by load alone and by session affinity, with a prefix-cache model of the replicas. Prints
//! the cached-token share (of the ideal) and the load spread (max/mean in flight).
//! `cargo bench -p tollgate-app --bench placement_sim`

use tollgate::proxy::placement_sim::{SimParams, simulate};

fn main() {
    let p = SimParams::default();
    println!(
        "{} sessions x {} turns over {} replicas (capacity {} each), {} new requests per step, {} steps each",
        p.sessions, p.turns, p.replicas, p.capacity, p.arrivals_per_step, p.steps_per_request
    );
    for (name, affinity) in [("least-loaded", false), ("session affinity", true)] {
        let r = simulate(p, affinity);
        println!(
            "{name:>16}: cached share of ideal {:.1}%, load max/mean {:.3}, refused {}",
            r.cached_share_of_ideal * 100.0,
            r.load_max_over_mean,
            r.refused
        );
    }
}
