//! The limit values in force for one caller on one model: read by the admission gates and
//! by the model object of `GET /v1/models`, so what is published is what is enforced.

use std::sync::Arc;
use std::sync::atomic::{AtomicI64, AtomicU64, Ordering};

use tollgate::config::{LimitSettings, ModelEntry, Pool};
use tollgate::identity::{Principal, RateTier};

/// Lifetime purchases (cents) from which tokens per minute rise to at least 20 million.
const TPM_MIDDLE_TIER_CENTS: i64 = 5_000;
/// Lifetime purchases (cents) from which tokens per minute have no practical limit.
const TPM_TOP_TIER_CENTS: i64 = 20_000;
const TPM_MIDDLE_TIER_FLOOR: u64 = 20_000_000;
/// Pro and Team plans: at least 20 million tokens per minute per model while serving (spec
/// "Limits", coding plan token floor).
const PLAN_TOKEN_FLOOR: u64 = 20_000_000;

/// How long this instance trusts the model's shared in-flight count read at its last
/// admission when deciding whether the model is busy (decision 37).
pub const BUSY_READING_TTL_MS: i64 = 2_000;

#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct InForce {
    /// Requests per minute for the key (tier default, or its custom limit clamped to it).
    pub requests_per_minute: u64,
    /// Per-key concurrency once the model is busy.
    pub per_key_concurrency: u64,
    pub workspace_concurrency: u64,
    /// Shared-model concurrency across every instance: the model's declared
    /// `max_concurrent_requests`, else the pool's capacity.
    pub shared_concurrency: u64,
    /// `shared_concurrency` is a configured shared limit (refused as
    /// `hosted_shared_model_concurrency_limit`); otherwise it is the pool's capacity, and a full
    /// pool reads as `hosted_model_at_capacity` (clarification 17).
    pub shared_declared: bool,
    /// In-flight count at which the model is busy (clarification 5).
    pub busy_at: u64,
    /// Tokens per minute per workspace on this model; `None`: no practical limit.
    pub tokens_per_minute: Option<u64>,
}

/// The requests-per-minute limit of a key: its tier's, or its own custom limit when lower.
pub fn requests_per_minute(settings: &LimitSettings, p: &Principal) -> u64 {
    let tier_max = settings.requests_per_minute.get(p.tier());
    match p.rate_limit_rpm.and_then(|r| u64::try_from(r).ok()).filter(|&r| r > 0) {
        Some(custom) => custom.min(tier_max),
        None => tier_max,
    }
}

pub fn in_force(settings: &LimitSettings, model: &ModelEntry, pool: &Pool, p: &Principal) -> InForce {
    let capacity = u64::from(pool.capacity()).max(1);
    let per_key = model.max_concurrent_requests_per_api_key.unwrap_or(match p.tier() {
        // Spec "Limits": a quarter of capacity before the first purchase, most of it after.
        RateTier::Free => (capacity / 4).max(1),
        RateTier::Core | RateTier::Enterprise => (capacity * 3 / 4).max(1),
    });
    let tokens_per_minute = model.max_tokens_per_minute_per_workspace.and_then(|default| {
        let bought = p.lifetime_purchases_cents;
        let plan_floor = p
            .plan
            .and_then(|b| b.serving_tier(tollgate::runtime::clock::now_ms()))
            .is_some_and(|t| matches!(t, tollgate::money::plans::Tier::Pro | tollgate::money::plans::Tier::Team));
        if p.tier() == RateTier::Enterprise || bought >= TPM_TOP_TIER_CENTS {
            None
        } else if plan_floor {
            Some(default.max(PLAN_TOKEN_FLOOR))
        } else if bought >= TPM_MIDDLE_TIER_CENTS {
            Some(default.max(TPM_MIDDLE_TIER_FLOOR))
        } else {
            Some(default)
        }
    });
    InForce {
        requests_per_minute: requests_per_minute(settings, p),
        per_key_concurrency: per_key,
        workspace_concurrency: settings.workspace_concurrency.get(p.tier()),
        shared_concurrency: model.max_concurrent_requests.unwrap_or(capacity),
        shared_declared: model.max_concurrent_requests.is_some(),
        busy_at: (capacity * u64::from(pool.busy_threshold_percent)).div_ceil(100).max(1),
        tokens_per_minute,
    }
}

/// The shared in-flight count of each model as the last admission on this instance saw it.
/// Models added by a reload get their reading at their first admission.
#[derive(Default)]
pub struct BusyReadings {
    by_model: std::sync::RwLock<tollgate::runtime::fast_map::FastMap<String, Arc<Reading>>>,
}

#[derive(Default)]
struct Reading {
    count: AtomicU64,
    at: AtomicI64,
}

impl BusyReadings {
    pub fn new<'a>(models: impl Iterator<Item = &'a str>) -> Self {
        let readings = BusyReadings::default();
        for m in models {
            readings.reading(m);
        }
        readings
    }

    fn get(&self, model: &str) -> Option<Arc<Reading>> {
        self.by_model.read().unwrap_or_else(|e| e.into_inner()).get(model).cloned()
    }

    fn reading(&self, model: &str) -> Arc<Reading> {
        if let Some(r) = self.get(model) {
            return r;
        }
        let mut map = self.by_model.write().unwrap_or_else(|e| e.into_inner());
        map.entry(model.to_string())
            .or_insert_with(|| Arc::new(Reading { count: AtomicU64::new(0), at: AtomicI64::new(i64::MIN) }))
            .clone()
    }

    pub fn record(&self, model: &str, in_flight: u64, now_ms: i64) {
        let r = self.reading(model);
        r.count.store(in_flight, Ordering::Relaxed);
        r.at.store(now_ms, Ordering::Relaxed);
    }

    /// Busy when the requests in flight as the request arrives (the last reading, not older
    /// than [`BUSY_READING_TTL_MS`]; it counts the request admitted then) are at or above
    /// `busy_at` (clarification 5: the arriving request itself does not count). Without a fresh
    /// reading the model counts as not busy: spare capacity admits more, and the admission's
    /// reply brings a fresh reading.
    pub fn is_busy(&self, model: &str, busy_at: u64, now_ms: i64) -> bool {
        self.get(model).is_some_and(|r| {
            now_ms.saturating_sub(r.at.load(Ordering::Relaxed)) <= BUSY_READING_TTL_MS
                && r.count.load(Ordering::Relaxed) >= busy_at
        })
    }

    /// A request admitted on this instance ended: it no longer counts in the reading.
    pub fn ended(&self, model: &str) {
        if let Some(r) = self.get(model) {
            let _ = r.count.fetch_update(Ordering::Relaxed, Ordering::Relaxed, |c| Some(c.saturating_sub(1)));
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    fn principal(tier: RateTier, bought: i64, custom: Option<i64>) -> Principal {
        Principal {
            workspace_id: "ws".into(),
            key_id: "k".into(),
            scope: tollgate::identity::KeyScope::Workspace,
            rate_tier: tier,
            credits_only: false,
            monthly_spend_limit_cents: None,
            rate_limit_rpm: custom,
            frozen: None,
            legacy_format: false,
            lifetime_purchases_cents: bought,
            plan: None,
        }
    }

    fn settings() -> LimitSettings {
        LimitSettings::default()
    }

    #[test]
    fn request_limits_follow_the_tier_and_clamp_custom_limits() {
        let s = settings();
        assert_eq!(requests_per_minute(&s, &principal(RateTier::Free, 0, None)), 10_000);
        assert_eq!(requests_per_minute(&s, &principal(RateTier::Free, 500, None)), 50_000, "purchase lifts the tier");
        assert_eq!(requests_per_minute(&s, &principal(RateTier::Enterprise, 0, None)), 200_000);
        assert_eq!(requests_per_minute(&s, &principal(RateTier::Free, 0, Some(5))), 5);
        assert_eq!(requests_per_minute(&s, &principal(RateTier::Free, 0, Some(1_000_000))), 10_000, "clamped");
    }

    #[test]
    fn busy_readings_expire() {
        let b = BusyReadings::new(["m"].into_iter());
        assert!(!b.is_busy("m", 3, 0), "no reading: not busy");
        b.record("m", 2, 1_000);
        assert!(b.is_busy("m", 2, 1_500), "2 in flight reaches 2 (75% of a pool of 2)");
        assert!(!b.is_busy("m", 3, 1_500), "the arriving request does not count");
        assert!(!b.is_busy("m", 2, 1_000 + BUSY_READING_TTL_MS + 1), "stale reading");
        b.ended("m");
        assert!(!b.is_busy("m", 2, 1_500), "one ended: 1 in flight");
    }
}
