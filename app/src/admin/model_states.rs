//! Model pause and resume shared by the fleet (issue 52, decision 211). The admin API writes
//! an operator's pause or resume to the identity store, so it reaches every instance on that
//! store and outlives restarts; each instance reads the states every second and puts them in
//! force in its catalog. models.yaml decides for a model no operator has acted on.

use std::sync::{Arc, Mutex};
use std::time::Duration;

use serde_json::{Value, json};

use tollgate::config::LiveConfig;
use tollgate::runtime::clock::{Millis, iso, now_ms};
use tollgate::store::{IdentityStore, ModelState};

/// How often each instance reads the shared states: a pause sent to one instance is in force
/// on all of them within about this.
pub const POLL: Duration = Duration::from_secs(1);

/// How long startup waits for the first read before serving with models.yaml's states.
const FIRST_READ: Duration = Duration::from_secs(5);

/// This instance's view of the shared states, for `GET /admin/v1/health`.
#[derive(Default)]
struct View {
    /// When the states were last read whole.
    synced_at: Option<Millis>,
    /// The last read's failure, while reads fail.
    error: Option<String>,
    states: Vec<ModelState>,
}

/// Reads the shared states and keeps the catalog in step with them.
pub struct ModelStates {
    store: Arc<dyn IdentityStore>,
    live: Arc<LiveConfig>,
    view: Mutex<View>,
}

impl ModelStates {
    pub fn new(store: Arc<dyn IdentityStore>, live: Arc<LiveConfig>) -> Arc<Self> {
        Arc::new(ModelStates { store, live, view: Mutex::new(View::default()) })
    }

    /// Read once now, then every [`POLL`] on a thread of its own. Returns after the first
    /// read (or after a few seconds without one: the node serves and keeps trying).
    pub fn start(self: &Arc<Self>) {
        let (first_tx, first_rx) = std::sync::mpsc::channel();
        let me = self.clone();
        tollgate::runtime::background::spawn("model-states", async move {
            me.sync().await;
            let _ = first_tx.send(());
            loop {
                tokio::time::sleep(POLL).await;
                me.sync().await;
            }
        });
        if first_rx.recv_timeout(FIRST_READ).is_err() {
            log::warn!("model states: the identity store has not answered yet; serving models.yaml's states meanwhile");
        }
    }

    /// Record an operator's pause (`Some`) or resume (`None`) for the fleet, then put it in
    /// force here at once. Nothing changes anywhere when the store refuses the write.
    pub async fn set(&self, model: &str, paused_until: Option<Millis>) -> Result<(), tollgate::store::StoreError> {
        self.store.set_model_state(model, paused_until, now_ms()).await?;
        self.live.with_current(|config| {
            if let Some(entry) = config.catalog.get(model) {
                entry.set_paused_until(paused_until.and_then(timestamp));
            }
        });
        Ok(())
    }

    /// One read of the shared states, put in force in the catalog in force now.
    pub async fn sync(&self) {
        match self.store.model_states().await {
            Ok(states) => {
                // Under the reload lock: a reload in flight would otherwise copy the state
                // from before this read into the catalog it builds.
                self.live.with_current(|config| {
                    for s in &states {
                        let Some(entry) = config.catalog.get(&s.model) else { continue };
                        let want = s.paused_until.and_then(timestamp);
                        if entry.paused_until() != want || !entry.operator_set() {
                            entry.set_paused_until(want);
                            log::info!("model {}: {} (shared state)", s.model, describe(s.paused_until));
                        }
                    }
                });
                let mut view = self.view.lock().unwrap_or_else(|e| e.into_inner());
                if view.error.take().is_some() {
                    log::info!("model states: the identity store answers again");
                }
                *view = View { synced_at: Some(now_ms()), error: None, states };
            }
            Err(e) => {
                let mut view = self.view.lock().unwrap_or_else(|e| e.into_inner());
                if view.error.is_none() {
                    log::warn!("model states: read failed ({e}); the last states read stay in force");
                }
                view.error = Some(e.to_string());
            }
        }
    }

    /// This instance's view: when it last read the states, and what they were.
    pub fn health(&self) -> Value {
        let view = self.view.lock().unwrap_or_else(|e| e.into_inner());
        let models: serde_json::Map<String, Value> = view
            .states
            .iter()
            .map(|s| {
                (s.model.clone(), json!({"paused_until": s.paused_until.map(iso), "changed_at": iso(s.changed_at)}))
            })
            .collect();
        json!({
            "status": if view.error.is_some() { "stale" } else if view.synced_at.is_some() { "ok" } else { "unread" },
            "synced_at": view.synced_at.map(iso),
            "error": view.error,
            "models": models,
        })
    }
}

fn timestamp(ms: Millis) -> Option<jiff::Timestamp> {
    jiff::Timestamp::from_millisecond(ms).ok()
}

fn describe(paused_until: Option<Millis>) -> String {
    match paused_until {
        Some(t) => format!("paused until {}", iso(t)),
        None => "resumed".into(),
    }
}
