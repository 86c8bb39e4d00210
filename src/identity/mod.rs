//! Identity: workspaces and their API keys. The types here are shared by the stores, the
//! auth plugin and the admin API; key material (format, digest, encrypted copy) lives in
//! `keys.rs`, and the lifecycle rules (caps, rotation, grace) as pure functions in
//! `lifecycle.rs`, so both store backends apply exactly the same decisions.

pub mod keys;
pub mod lifecycle;
pub mod service;

use serde::Serialize;

use crate::runtime::clock::Millis;

/// Rate tier of a workspace (`X-RateLimit-Tier`, `plan_tier`).
#[derive(Debug, Clone, Copy, PartialEq, Eq, Serialize)]
#[serde(rename_all = "lowercase")]
pub enum RateTier {
    Free,
    Core,
    Enterprise,
}

impl RateTier {
    pub fn parse(s: &str) -> Option<RateTier> {
        match s {
            "free" => Some(RateTier::Free),
            "core" => Some(RateTier::Core),
            "enterprise" => Some(RateTier::Enterprise),
            _ => None,
        }
    }

    pub fn as_str(self) -> &'static str {
        match self {
            RateTier::Free => "free",
            RateTier::Core => "core",
            RateTier::Enterprise => "enterprise",
        }
    }
}

#[derive(Debug, Clone, PartialEq, Eq, Serialize)]
pub struct Workspace {
    pub id: String,
    pub name: String,
    pub rate_tier: RateTier,
    pub created_at: Millis,
    /// Freeze reason (`unpaid`, `dispute`) while frozen.
    pub frozen: Option<String>,
    pub lifetime_purchases_cents: i64,
    /// The workspace's coding plan as the key lookup read it (not stored with the workspace).
    #[serde(skip)]
    pub plan: Option<PlanBrief>,
}

/// What the request path needs of a workspace's coding plan before billing runs: its tier
/// and whether it serves (the model object's plan fields, the Pro/Team token floor).
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct PlanBrief {
    pub tier: crate::money::plans::Tier,
    pub status: crate::money::plans::Status,
    pub grace_until: Option<Millis>,
    pub cancel_at: Option<Millis>,
}

impl PlanBrief {
    /// The tier, while the plan serves at `now`.
    pub fn serving_tier(&self, now: Millis) -> Option<crate::money::plans::Tier> {
        let terms = crate::money::plans::PlanTerms {
            tier: self.tier,
            status: self.status,
            started_at: 0,
            cancel_at: self.cancel_at,
            grace_until: self.grace_until,
            credits_enabled: false,
            cap_cents: None,
            pending_tier: None,
            pending_effective_at: None,
        };
        terms.serving(now).then_some(self.tier)
    }

    /// From the `plans` columns `tier, status, grace_until, cancel_at` (all null: no plan).
    pub fn from_columns(
        tier: Option<String>,
        status: Option<String>,
        grace: Option<Millis>,
        cancel: Option<Millis>,
    ) -> Option<PlanBrief> {
        Some(PlanBrief {
            tier: crate::money::plans::Tier::parse(&tier?)?,
            status: crate::money::plans::Status::parse(&status?)?,
            grace_until: grace,
            cancel_at: cancel,
        })
    }
}

/// What a key may be used for (spec "Authentication" 3 and 4).
#[derive(Debug, Clone, Copy, PartialEq, Eq, Hash, Serialize)]
#[serde(rename_all = "lowercase")]
pub enum KeyScope {
    /// A normal workspace key.
    Workspace,
    /// Legacy key scoped to one deployment.
    Deployment,
    /// Created by browser or device sign-in in the command-line tool; internal.
    Terminal,
}

impl KeyScope {
    pub fn parse(s: &str) -> Option<KeyScope> {
        match s {
            "workspace" => Some(KeyScope::Workspace),
            "deployment" => Some(KeyScope::Deployment),
            "terminal" => Some(KeyScope::Terminal),
            _ => None,
        }
    }

    pub fn as_str(self) -> &'static str {
        match self {
            KeyScope::Workspace => "workspace",
            KeyScope::Deployment => "deployment",
            KeyScope::Terminal => "terminal",
        }
    }
}

/// A stored key: never the plaintext, only its digest and (while live and copyable) an
/// encrypted copy.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct KeyRecord {
    pub id: String,
    pub workspace_id: String,
    pub name: Option<String>,
    pub scope: KeyScope,
    /// `v{format}:` + hex HMAC-SHA256 of the key under the pepper.
    pub digest: String,
    pub format_version: i32,
    /// nonce || AES-256-GCM ciphertext; erased on revocation; `None` for keys created
    /// before copying existed.
    pub encrypted_copy: Option<Vec<u8>>,
    pub created_by: Option<String>,
    pub created_at: Millis,
    pub expires_at: Option<Millis>,
    pub revoked_at: Option<Millis>,
    /// Set on the previous key of a rotation: it works until then.
    pub grace_until: Option<Millis>,
    pub rotated_from: Option<String>,
    /// First key of this key's rotation history.
    pub rotation_root: String,
    pub credits_only: bool,
    pub monthly_spend_limit_cents: Option<i64>,
    pub rate_limit_rpm: Option<i64>,
}

/// A key's state at an instant (admin `state`).
#[derive(Debug, Clone, Copy, PartialEq, Eq, Serialize)]
#[serde(rename_all = "lowercase")]
pub enum KeyState {
    Active,
    Grace,
    Revoked,
    Expired,
}

impl KeyState {
    pub fn as_str(self) -> &'static str {
        match self {
            KeyState::Active => "active",
            KeyState::Grace => "grace",
            KeyState::Revoked => "revoked",
            KeyState::Expired => "expired",
        }
    }
}

impl KeyRecord {
    /// State at `now`. Revocation wins; then expiry (401); then a grace that has ended
    /// answers like a revoked key (clarification 8).
    pub fn state(&self, now: Millis) -> KeyState {
        if self.revoked_at.is_some() {
            return KeyState::Revoked;
        }
        if self.expires_at.is_some_and(|e| now >= e) {
            return KeyState::Expired;
        }
        match self.grace_until {
            Some(g) if now >= g => KeyState::Revoked,
            Some(_) => KeyState::Grace,
            None => KeyState::Active,
        }
    }

    pub fn is_live(&self, now: Millis) -> bool {
        matches!(self.state(now), KeyState::Active | KeyState::Grace)
    }

    /// Minted under an older key format: works, but must be rotated.
    pub fn legacy_format(&self) -> bool {
        self.format_version < keys::CURRENT_FORMAT
    }
}

/// The authenticated caller, as later phases see it.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct Principal {
    pub workspace_id: String,
    pub key_id: String,
    pub scope: KeyScope,
    pub rate_tier: RateTier,
    pub credits_only: bool,
    pub monthly_spend_limit_cents: Option<i64>,
    pub rate_limit_rpm: Option<i64>,
    pub frozen: Option<String>,
    pub legacy_format: bool,
    /// The workspace's coding plan (read with the key; billing reads the full plan itself).
    pub plan: Option<PlanBrief>,
    /// Credit purchases over the workspace's life (promotional credit excluded), in cents.
    pub lifetime_purchases_cents: i64,
}

impl RateTier {
    /// The tier a workspace set to `self` is served at, given its purchases so far.
    pub fn in_force(self, lifetime_purchases_cents: i64) -> RateTier {
        match self {
            RateTier::Enterprise => RateTier::Enterprise,
            _ if lifetime_purchases_cents > 0 => RateTier::Core,
            t => t,
        }
    }
}

impl Principal {
    /// The tier in force: enterprise when so marked, else core once anything was purchased
    /// (spec "Limits": 10,000 requests a minute before the first purchase, 50,000 after).
    pub fn tier(&self) -> RateTier {
        self.rate_tier.in_force(self.lifetime_purchases_cents)
    }
}
