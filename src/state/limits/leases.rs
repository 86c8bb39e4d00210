//! Concurrency leases of running requests: renewed in the background while the request runs,
//! released when it ends. A request's [`Held`] lease is released by the log phase; if the
//! request is dropped without it (a panic, the shutdown grace ending) the guard's `Drop`
//! hands the lease to the keeper thread, and a crashed instance's leases expire by their TTL.
//!
//! The keeper also watches the store's epoch every [`EPOCH_PROBE`]: when it changes (the store
//! lost its data) or the store answers again after failing, every running lease is renewed at
//! once, and a renewal registers a lease again wherever it is missing (decision 202). So a
//! running request is counted again within about a second of a Redis restart, inside the
//! recovery during which gated checks wait.

use std::sync::{Arc, Mutex, OnceLock};
use std::time::Duration;

use tokio::sync::mpsc::{UnboundedReceiver, UnboundedSender, unbounded_channel};

use super::{Epoch, FallbackLimiter, Lease, Renewal};
use crate::runtime::clock::now_ms;
use crate::runtime::fast_map::FastMap;

/// How often the keeper reads the store's epoch while it holds leases.
pub const EPOCH_PROBE: Duration = Duration::from_secs(1);

/// Live leases of this instance, and the thread that renews them.
pub struct LeaseKeeper {
    store: Arc<FallbackLimiter>,
    ttl: Duration,
    live: Arc<Mutex<FastMap<Arc<str>, Arc<Lease>>>>,
    releases: OnceLock<UnboundedSender<Arc<Lease>>>,
}

impl LeaseKeeper {
    pub fn new(store: Arc<FallbackLimiter>, ttl: Duration) -> Arc<Self> {
        Arc::new(LeaseKeeper { store, ttl, live: Arc::default(), releases: OnceLock::new() })
    }

    pub fn ttl_ms(&self) -> u64 {
        u64::try_from(self.ttl.as_millis()).unwrap_or(u64::MAX)
    }

    /// Keep `lease` alive until the returned guard is released or dropped.
    pub fn hold(self: &Arc<Self>, lease: Lease) -> Held {
        self.sender(); // the renewing thread starts with the first lease
        // Shared with the renewing thread's map, not copied (nor is its id, the map's key).
        let lease = Arc::new(lease);
        self.live.lock().unwrap_or_else(|e| e.into_inner()).insert(lease.id.clone(), lease.clone());
        Held { lease: Some(lease), keeper: self.clone() }
    }

    fn forget(&self, id: &str) {
        self.live.lock().unwrap_or_else(|e| e.into_inner()).remove(id);
    }

    fn sender(&self) -> &UnboundedSender<Arc<Lease>> {
        self.releases.get_or_init(|| {
            let (tx, rx) = unbounded_channel();
            let (store, live, ttl) = (self.store.clone(), self.live.clone(), self.ttl);
            let spawned =
                std::thread::Builder::new().name("lease-keeper".into()).spawn(move || keep(store, live, ttl, rx));
            if let Err(e) = spawned {
                log::error!("lease keeper thread could not start ({e}); leases will expire by their TTL");
            }
            tx
        })
    }

    /// Leases this instance holds now (for tests and the admin read).
    pub fn live_count(&self) -> usize {
        self.live.lock().unwrap_or_else(|e| e.into_inner()).len()
    }
}

/// One request's lease.
pub struct Held {
    lease: Option<Arc<Lease>>,
    keeper: Arc<LeaseKeeper>,
}

impl Held {
    /// Free the slots (the log phase): at once for this instance's next check, without waiting
    /// for a shared store ([`super::LimiterStore::release_deferred`]). A failure is logged; the
    /// lease then expires by TTL.
    pub async fn release(mut self) {
        if let Some(lease) = self.lease.take() {
            self.keeper.forget(&lease.id);
            if let Err(e) = self.keeper.store.release_deferred(&lease).await {
                log::warn!("lease {} not released ({e}); it expires by its TTL", lease.id);
            }
        }
    }
}

impl Drop for Held {
    fn drop(&mut self) {
        if let Some(lease) = self.lease.take() {
            self.keeper.forget(&lease.id);
            let _ = self.keeper.sender().send(lease);
        }
    }
}

type LiveLeases = Arc<Mutex<FastMap<Arc<str>, Arc<Lease>>>>;

fn keep(store: Arc<FallbackLimiter>, live: LiveLeases, ttl: Duration, mut releases: UnboundedReceiver<Arc<Lease>>) {
    let Ok(rt) = tokio::runtime::Builder::new_current_thread().enable_all().build() else {
        log::error!("lease keeper runtime could not start; leases will expire by their TTL");
        return;
    };
    let ttl_ms = u64::try_from(ttl.as_millis()).unwrap_or(u64::MAX);
    rt.block_on(async move {
        let mut renew = tokio::time::interval((ttl / 3).max(Duration::from_millis(100)));
        renew.set_missed_tick_behavior(tokio::time::MissedTickBehavior::Delay);
        let mut probe = tokio::time::interval(EPOCH_PROBE);
        probe.set_missed_tick_behavior(tokio::time::MissedTickBehavior::Delay);
        let mut watch = EpochWatch::default();
        loop {
            tokio::select! {
                lease = releases.recv() => match lease {
                    Some(lease) => {
                        if let Err(e) = store.release(&lease).await {
                            log::warn!("lease {} not released ({e}); it expires by its TTL", lease.id);
                        }
                    }
                    None => return,
                },
                _ = renew.tick() => renew_all(&store, &live, ttl_ms).await,
                _ = probe.tick() => {
                    if live.lock().unwrap_or_else(|e| e.into_inner()).is_empty() {
                        continue;
                    }
                    let seen = store.epoch(now_ms()).await;
                    if watch.must_renew(seen) {
                        renew_all(&store, &live, ttl_ms).await;
                    }
                }
            }
        }
    });
}

/// What the keeper last knew of the store's epoch.
#[derive(Default)]
struct EpochWatch {
    last: Option<Epoch>,
    /// The last reading failed (the store was unreachable).
    failed: bool,
}

impl EpochWatch {
    /// Fold a reading in: whether every running lease must be renewed now (the epoch changed,
    /// or the store answers again after failing; a first reading counts as a change).
    fn must_renew(&mut self, seen: Result<Option<Epoch>, super::LimiterError>) -> bool {
        match seen {
            Ok(None) => false, // a store that never loses leases (in process)
            Ok(Some(epoch)) => {
                let changed = self.last.as_ref() != Some(&epoch) || self.failed;
                if changed && self.last.is_some() {
                    log::warn!(
                        "limiter store: new epoch {} (it lost its data) or back after failing; renewing every running lease",
                        epoch.0
                    );
                }
                self.last = Some(epoch);
                self.failed = false;
                changed
            }
            Err(e) => {
                if !self.failed {
                    log::warn!("limiter store: epoch not read ({e}); running leases are renewed once it answers");
                }
                self.failed = true;
                false
            }
        }
    }
}

fn snapshot(live: &LiveLeases) -> Vec<Arc<Lease>> {
    live.lock().unwrap_or_else(|e| e.into_inner()).values().cloned().collect()
}

/// Renew every running lease (registering again any the store lost), then release again the
/// ones whose request ended while this round ran: a renewal may have put back a lease that was
/// released just before it.
async fn renew_all(store: &FallbackLimiter, live: &LiveLeases, ttl_ms: u64) {
    let (mut restored, mut failed, mut error) = (0usize, 0usize, None);
    for lease in snapshot(live) {
        match store.renew(&lease, ttl_ms, now_ms()).await {
            Ok(Renewal::Renewed { .. }) => {}
            Ok(Renewal::Restored { .. }) => {
                restored += 1;
                let ended = !live.lock().unwrap_or_else(|e| e.into_inner()).contains_key(&lease.id);
                if ended {
                    if let Err(e) = store.release(&lease).await {
                        log::warn!("lease {} not released after its renewal ({e}); it expires by its TTL", lease.id);
                    }
                    restored -= 1;
                }
            }
            Err(e) => {
                failed += 1;
                error = Some(e);
            }
        }
    }
    if restored > 0 {
        log::warn!(
            "limiter store: {restored} running leases were missing (store restarted or lease expired) and are counted again"
        );
    }
    if let Some(e) = error {
        log::warn!("limiter store: {failed} leases not renewed: {e}");
    }
}
