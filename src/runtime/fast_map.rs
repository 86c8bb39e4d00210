//! Hash maps on the request path whose keys the gateway makes or the operator configures
//! (limiter windows and leases, the key cache, the catalog, pools, admission readings, the
//! ledger batch's plan). They hash with foldhash, seeded at random per process like std's maps,
//! instead of std's SipHash-1-3: the same maps for a fraction of the hashing (decision 138).
//! Maps keyed by values a client picks freely (the connection gate's addresses, session
//! placements) keep std's hasher.

pub type FastMap<K, V> = std::collections::HashMap<K, V, foldhash::fast::RandomState>;
pub type FastSet<K> = std::collections::HashSet<K, foldhash::fast::RandomState>;
