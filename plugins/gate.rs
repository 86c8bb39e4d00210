//! The connection gate (spec "Rate limit layers" (1)): before the credential is looked up,
//! requests whose credential is not known good spend from a per-source-address budget and a
//! service-wide one. A refusal is `429 rate_limit_exceeded` without `X-RateLimit-*` headers.
//!
//! A credential that authenticated is trusted on this instance for `trusted_key_minutes`
//! (at most 15) after its last success and is not counted; with a healthy store that is "stops
//! counting a key once it succeeds", and during a store outage the same budgets are applied in
//! memory by the fallback limiter while trusted keys bypass them. Credentials are remembered
//! only as keyed 64-bit hashes (random key per process), never as text.

use std::collections::HashMap;
use std::hash::{BuildHasher, RandomState};
use std::sync::{Arc, Mutex};

use async_trait::async_trait;
use pingora::proxy::Session;

use tollgate::config::GateSettings;
use tollgate::http::error::{ErrorKind, GatewayError};
use tollgate::proxy::ctx::RequestCtx;
use tollgate::proxy::plugin::{Flow, Plugin};
use tollgate::runtime::clock::now_ms;
use tollgate::state::limits::{Check, FallbackLimiter, Verdict, WindowLimit};

/// Before authentication (500) reads the key store.
pub const GATE_PRIORITY: i16 = 600;
/// Trusted credentials remembered per instance; beyond it expired entries are dropped first.
const MAX_TRUSTED: usize = 100_000;

pub struct ConnectionGate {
    settings: GateSettings,
    store: Arc<FallbackLimiter>,
    hasher: RandomState,
    /// Credential hash -> last successful authentication (ms).
    trusted: Mutex<HashMap<u64, i64>>,
}

/// The hash of the credential this request presented.
struct Credential(u64);

impl ConnectionGate {
    pub fn new(settings: GateSettings, store: Arc<FallbackLimiter>) -> Self {
        ConnectionGate { settings, store, hasher: RandomState::new(), trusted: Mutex::default() }
    }

    fn trusted_for_ms(&self) -> i64 {
        i64::try_from(self.settings.trusted_for.as_millis()).unwrap_or(i64::MAX)
    }

    fn is_trusted(&self, credential: u64, now: i64) -> bool {
        let trusted = self.trusted.lock().unwrap_or_else(|e| e.into_inner());
        trusted.get(&credential).is_some_and(|&at| now.saturating_sub(at) < self.trusted_for_ms())
    }

    fn trust(&self, credential: u64, now: i64) {
        let mut trusted = self.trusted.lock().unwrap_or_else(|e| e.into_inner());
        if trusted.len() >= MAX_TRUSTED && !trusted.contains_key(&credential) {
            let horizon = self.trusted_for_ms();
            trusted.retain(|_, at| now.saturating_sub(*at) < horizon);
            if trusted.len() >= MAX_TRUSTED {
                trusted.clear();
            }
        }
        trusted.insert(credential, now);
    }
}

/// The client's address: the TCP peer, or the client a trusted proxy names (issue 52).
fn source_address(cx: &RequestCtx) -> String {
    cx.client_ip.map_or_else(|| "unknown".into(), |ip| ip.to_string())
}

#[async_trait]
impl Plugin for ConnectionGate {
    fn name(&self) -> &'static str {
        "connection_gate"
    }

    fn priority(&self) -> i16 {
        GATE_PRIORITY
    }

    async fn on_request_headers(&self, s: &mut Session, cx: &mut RequestCtx) -> Result<Flow, GatewayError> {
        let Some(route) = cx.route else { return Ok(Flow::Continue) };
        let now = now_ms();
        if let Some(key) = crate::auth::presented_key(s, route) {
            let credential = self.hasher.hash_one(key);
            cx.ext.insert(Credential(credential));
            if self.is_trusted(credential, now) {
                return Ok(Flow::Continue);
            }
        }
        let check = Check::windows_only(
            now,
            vec![
                WindowLimit {
                    key: format!("gate:a:{}", source_address(cx)),
                    limit: self.settings.per_address_per_minute,
                },
                WindowLimit { key: "gate:service".into(), limit: self.settings.service_per_minute },
            ],
        );
        match self.store.check(&check).await {
            Ok(outcome) => match outcome.verdict {
                Verdict::Admitted { .. } => Ok(Flow::Continue),
                Verdict::WindowRefused { retry_after_ms, .. } => Err(super::limits::gate_refused(retry_after_ms)),
                other => Err(GatewayError::internal(format!("unexpected gate verdict {other:?}"))),
            },
            Err(e) => {
                log::warn!("{}: connection gate could not evaluate: {e}", cx.request_id);
                Err(GatewayError::new(ErrorKind::LimiterUnavailable, "The connection gate could not be evaluated."))
            }
        }
    }

    async fn on_log(&self, cx: &mut RequestCtx) {
        if let (Some(_), Some(Credential(c))) = (cx.principal.as_ref(), cx.ext.get::<Credential>()) {
            self.trust(*c, now_ms());
        }
    }
}
