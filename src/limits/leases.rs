//! Concurrency leases of running requests: renewed in the background while the request runs,
//! released when it ends. A request's [`Held`] lease is released by the log phase; if the
//! request is dropped without it (a panic, the shutdown grace ending) the guard's `Drop`
//! hands the lease to the keeper thread, and a crashed instance's leases expire by their TTL.

use std::sync::{Arc, Mutex, OnceLock};
use std::time::Duration;

use tokio::sync::mpsc::{UnboundedReceiver, UnboundedSender, unbounded_channel};

use super::{FallbackLimiter, Lease, Renewal};
use crate::clock::now_ms;
use crate::fast_map::FastMap;

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

fn keep(
    store: Arc<FallbackLimiter>,
    live: Arc<Mutex<FastMap<Arc<str>, Arc<Lease>>>>,
    ttl: Duration,
    mut releases: UnboundedReceiver<Arc<Lease>>,
) {
    let Ok(rt) = tokio::runtime::Builder::new_current_thread().enable_all().build() else {
        log::error!("lease keeper runtime could not start; leases will expire by their TTL");
        return;
    };
    let ttl_ms = u64::try_from(ttl.as_millis()).unwrap_or(u64::MAX);
    rt.block_on(async move {
        let mut tick = tokio::time::interval((ttl / 3).max(Duration::from_millis(100)));
        tick.set_missed_tick_behavior(tokio::time::MissedTickBehavior::Delay);
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
                _ = tick.tick() => {
                    let leases: Vec<Arc<Lease>> =
                        live.lock().unwrap_or_else(|e| e.into_inner()).values().cloned().collect();
                    for lease in leases {
                        match store.renew(&lease, ttl_ms, now_ms()).await {
                            Ok(Renewal::Renewed { .. }) => {}
                            Ok(Renewal::Lost) => {
                                // Released while this round ran (the request ended): not a loss.
                                let still_live =
                                    live.lock().unwrap_or_else(|e| e.into_inner()).remove(&lease.id).is_some();
                                if still_live {
                                    log::warn!("lease {} had expired before renewal; its slots were freed", lease.id);
                                }
                            }
                            Err(e) => log::warn!("lease {} not renewed: {e}", lease.id),
                        }
                    }
                }
            }
        }
    });
}
