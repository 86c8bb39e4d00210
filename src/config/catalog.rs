//! `models.yaml`: the model catalog. Every field of the spec's Model object can be declared
//! per model; what is not declared is absent from `GET /v1/models` (never zero, never null
//! for unlimited), except the fields clarifications 2 and 3 publish on every model.

use std::sync::{Arc, RwLock};

use jiff::Timestamp;
use serde_json::{Map, Value, json};

use super::chat_rules::ChatRules;

/// Prices as integers: microcents per million tokens (1 USD = 100,000,000 microcents), so
/// money paths never touch floating point after the catalog is loaded.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct Pricing {
    pub input: u64,
    pub output: u64,
    /// Present only when the cached tier is active on an isolated cache.
    pub cached_input: Option<u64>,
}

/// One model of the catalog.
#[derive(Debug)]
pub struct ModelEntry {
    pub id: String,
    pub supported_endpoints: Vec<String>,
    pub tool_calling: bool,
    pub json_mode: bool,
    pub input_modalities: Vec<String>,
    pub max_output_tokens: Option<u64>,
    pub context_window: Option<u64>,
    /// `None` when the model declares no pricing (requests are then priced at zero).
    pub pricing: Option<Pricing>,
    /// `true` when cache hits are neither disclosed nor priced (`cache_isolation: shared`).
    pub shared_cache: bool,
    /// Promotional free window `[start, end)` in Unix milliseconds.
    pub free_window: Option<(i64, i64)>,
    /// Declared `reasoning_efforts`, as published (read per request by the translators).
    pub reasoning_efforts: Vec<String>,
    /// Declared per-key concurrency once the model is busy (else derived from the pool).
    pub max_concurrent_requests_per_api_key: Option<u64>,
    /// Declared tokens per minute per workspace (the model default of the lowest tier).
    pub max_tokens_per_minute_per_workspace: Option<u64>,
    /// Shared-model concurrency (else the pool's capacity).
    pub max_concurrent_requests: Option<u64>,
    /// Standby requests running at once on this model across every workspace (never
    /// published; else a quarter of the pool's capacity; `0` closes Standby on the model).
    pub max_concurrent_standby_requests: Option<u64>,
    /// Chat request rules and the tokenizer (not part of the published object).
    pub chat: ChatRules,
    /// The object of `GET /v1/models` without the availability fields.
    pub(super) object: Map<String, Value>,
    /// `Some(t)`: paused, next availability check at `t`. Changed by operators at run time.
    pub(super) paused_until: RwLock<Option<Timestamp>>,
    /// Paused or resumed through the admin API: the operator's word outlives a reload of
    /// `models.yaml` (decision 122).
    pub(super) set_by_operator: std::sync::atomic::AtomicBool,
}

impl ModelEntry {
    pub fn supports(&self, endpoint: &str) -> bool {
        self.supported_endpoints.iter().any(|e| e == endpoint)
    }

    /// The time of the next availability check while paused.
    pub fn paused_until(&self) -> Option<Timestamp> {
        *self.paused_until.read().unwrap_or_else(|e| e.into_inner())
    }

    /// An operator's pause (`Some`) or resume (`None`) through the admin API.
    pub fn set_paused_until(&self, until: Option<Timestamp>) {
        *self.paused_until.write().unwrap_or_else(|e| e.into_inner()) = until;
        self.set_by_operator.store(true, std::sync::atomic::Ordering::Relaxed);
    }

    /// Whether an operator paused or resumed this model (models.yaml no longer decides).
    pub fn operator_set(&self) -> bool {
        self.set_by_operator.load(std::sync::atomic::Ordering::Relaxed)
    }

    /// Keep the operator's pause or resume of `old` (the same model before a reload).
    pub(super) fn keep_operator_state(&self, old: &ModelEntry) {
        if old.set_by_operator.load(std::sync::atomic::Ordering::Relaxed) {
            self.set_paused_until(old.paused_until());
        }
    }

    /// The pricing in force at `now_ms`: none inside the free window (priced at zero).
    pub fn pricing_at(&self, now_ms: i64) -> Option<Pricing> {
        match self.free_window {
            Some((start, end)) if (start..end).contains(&now_ms) => None,
            _ => self.pricing,
        }
    }

    /// When the free window closed, if that was within the last seven days.
    pub fn free_window_recently_ended(&self, now_ms: i64) -> Option<i64> {
        const SEVEN_DAYS_MS: i64 = 7 * 86_400_000;
        self.free_window.map(|(_, end)| end).filter(|&end| end <= now_ms && now_ms - end <= SEVEN_DAYS_MS)
    }

    /// The model object as `GET /v1/models` lists it now.
    pub fn to_json(&self) -> Value {
        let mut obj = self.object.clone();
        match self.paused_until() {
            Some(t) => {
                obj.insert("availability".into(), json!("paused"));
                obj.insert("paused_until".into(), json!(t.to_string()));
            }
            None => {
                obj.insert("availability".into(), json!("available"));
            }
        }
        Value::Object(obj)
    }
}

/// All models, by id and alias.
#[derive(Debug, Default)]
pub struct Catalog {
    pub models: Vec<Arc<ModelEntry>>,
    pub(super) by_name: crate::runtime::fast_map::FastMap<String, usize>,
}

impl Catalog {
    /// Look a model up by id or alias (exact, case sensitive).
    pub fn get(&self, name: &str) -> Option<&Arc<ModelEntry>> {
        self.by_name.get(name).map(|&i| &self.models[i])
    }
}
