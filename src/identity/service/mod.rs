//! The identity service: authentication for the request path (digest, cache, lifecycle
//! state) and the key operations of the admin API. It owns the store, the key secrets and
//! the key cache; nothing outside it sees a plaintext key except the answer that mints one.

use std::sync::Arc;

pub mod cache;

use cache::{Found, KeyCache};

use crate::identity::keys::{self, KeySecrets};
use crate::identity::lifecycle::{self, KeyOpError};
use crate::identity::{KeyRecord, KeyScope, KeyState, Principal, RateTier, Workspace};
use crate::runtime::clock::{Millis, now_ms};
use crate::store::{CopyAudit, IdentityStore, KeyPatch, RotateOpts, StoreError};

/// Why a presented key was refused.
#[derive(Debug, Clone, PartialEq, Eq)]
pub enum AuthFailure {
    /// Not of the key format, unknown, or deleted.
    Invalid,
    Expired,
    /// Revoked, or a previous key whose grace has ended.
    Deactivated,
    StoreUnavailable(String),
}

/// Options of a new key (admin API `POST /admin/v1/workspaces/{ws}/keys`).
#[derive(Debug, Clone, Default)]
pub struct NewKey {
    pub name: Option<String>,
    pub scope: Option<KeyScope>,
    pub monthly_spend_limit_cents: Option<i64>,
    pub expires_at: Option<Millis>,
    pub credits_only: bool,
    pub rate_limit_rpm: Option<i64>,
    pub created_by: Option<String>,
    /// Mint without an encrypted copy (a key from before copying existed; tests and
    /// imports only).
    pub without_copy: bool,
}

/// Who asks to copy a key.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum CopyRole {
    Owner,
    Creator,
    Member,
    Viewer,
}

impl CopyRole {
    pub fn parse(s: &str) -> Option<CopyRole> {
        match s {
            "owner" => Some(CopyRole::Owner),
            "creator" => Some(CopyRole::Creator),
            "member" => Some(CopyRole::Member),
            "viewer" => Some(CopyRole::Viewer),
            _ => None,
        }
    }
}

pub struct Identity {
    store: Arc<dyn IdentityStore>,
    secrets: KeySecrets,
    cache: KeyCache,
}

fn new_id(prefix: &str) -> String {
    format!("{prefix}{}", uuid::Uuid::new_v4().simple())
}

impl Identity {
    pub fn new(store: Arc<dyn IdentityStore>, secrets: KeySecrets, cache: KeyCache) -> Self {
        Identity { store, secrets, cache }
    }

    pub fn store(&self) -> &Arc<dyn IdentityStore> {
        &self.store
    }

    /// Authenticate a presented key at `now`.
    /// Look a presented key up (cache first; the store on a miss, counted in
    /// `tollgate_store_operations_total{store="identity",op="key_lookup"}`).
    pub async fn authenticate(&self, presented: &str) -> Result<Found, AuthFailure> {
        // Malformed keys never reach the store.
        if !keys::well_formed(presented) {
            return Err(AuthFailure::Invalid);
        }
        let digest = self.secrets.digest(presented);
        let store = self.store.clone();
        let found = self
            .cache
            .get_or_load(&digest, || {
                let d = digest.clone();
                async move {
                    let started = std::time::Instant::now();
                    let found = store.key_by_digest(&d).await;
                    crate::observe::metrics::StoreOp::record(&KEY_LOOKUP, found.is_ok(), started.elapsed());
                    found
                }
            })
            .await
            .map_err(|e| AuthFailure::StoreUnavailable(e.to_string()))?;
        let (key, ws) = found.ok_or(AuthFailure::Invalid)?;
        // The store matched on the digest; compare again in constant time so that no code
        // path returns a key whose digest differs.
        if !keys::digests_equal(&key.digest, &digest) {
            return Err(AuthFailure::Invalid);
        }
        match key.state(now_ms()) {
            KeyState::Active | KeyState::Grace => Ok((key, ws)),
            KeyState::Expired => Err(AuthFailure::Expired),
            KeyState::Revoked => Err(AuthFailure::Deactivated),
        }
    }

    pub fn principal(key: &KeyRecord, ws: &Workspace) -> Principal {
        Principal {
            workspace_id: ws.id.clone(),
            key_id: key.id.clone(),
            scope: key.scope,
            rate_tier: ws.rate_tier,
            credits_only: key.credits_only,
            monthly_spend_limit_cents: key.monthly_spend_limit_cents,
            rate_limit_rpm: key.rate_limit_rpm,
            frozen: ws.frozen.clone(),
            legacy_format: key.legacy_format(),
            plan: ws.plan,
            lifetime_purchases_cents: ws.lifetime_purchases_cents,
        }
    }

    pub async fn create_workspace(&self, name: &str, tier: RateTier) -> Result<Workspace, StoreError> {
        let ws = Workspace {
            id: uuid::Uuid::new_v4().to_string(),
            name: name.to_string(),
            rate_tier: tier,
            created_at: now_ms(),
            frozen: None,
            lifetime_purchases_cents: 0,
            plan: None,
        };
        self.store.create_workspace(&ws).await?;
        Ok(ws)
    }

    pub async fn workspace(&self, id: &str) -> Result<Option<Workspace>, StoreError> {
        self.store.workspace(id).await
    }

    fn material(&self) -> Result<(String, String, Vec<u8>), KeyOpError> {
        let plaintext = keys::generate().map_err(|e| KeyOpError::Store(e.to_string()))?;
        let digest = self.secrets.digest(&plaintext);
        let copy = self.secrets.encrypt(&plaintext).map_err(|e| KeyOpError::Store(e.to_string()))?;
        Ok((plaintext, digest, copy))
    }

    /// Mint a key; the plaintext is returned once and never stored.
    pub async fn create_key(&self, workspace_id: &str, opts: NewKey) -> Result<(KeyRecord, String), KeyOpError> {
        if self.store.workspace(workspace_id).await?.is_none() {
            return Err(KeyOpError::NotFound);
        }
        let now = now_ms();
        let (plaintext, digest, copy) = self.material()?;
        let id = new_id("key_");
        let record = KeyRecord {
            id: id.clone(),
            workspace_id: workspace_id.to_string(),
            name: opts.name,
            scope: opts.scope.unwrap_or(KeyScope::Workspace),
            digest,
            format_version: keys::CURRENT_FORMAT,
            encrypted_copy: (!opts.without_copy).then_some(copy),
            created_by: opts.created_by,
            created_at: now,
            expires_at: opts.expires_at,
            revoked_at: None,
            grace_until: None,
            rotated_from: None,
            rotation_root: id,
            credits_only: opts.credits_only,
            monthly_spend_limit_cents: opts.monthly_spend_limit_cents,
            rate_limit_rpm: opts.rate_limit_rpm,
        };
        self.store.create_key(&record, now).await?;
        Ok((record, plaintext))
    }

    pub async fn key(&self, id: &str) -> Result<Option<KeyRecord>, StoreError> {
        self.store.key(id).await
    }

    /// Rotate: (new key, its plaintext, previous key as updated).
    pub async fn rotate_key(&self, id: &str, opts: RotateOpts) -> Result<(KeyRecord, String, KeyRecord), KeyOpError> {
        let now = now_ms();
        let (plaintext, digest, copy) = self.material()?;
        let new_id = new_id("key_");
        let successor = Box::new(move |prev: &KeyRecord| Ok(lifecycle::successor(prev, new_id, digest, copy, now)));
        let (new_key, previous) = self.store.rotate_key(id, successor, opts, now).await?;
        self.cache.invalidate(&previous.digest);
        Ok((new_key, plaintext, previous))
    }

    pub async fn revoke_key(&self, id: &str) -> Result<KeyRecord, KeyOpError> {
        let k = self.store.revoke_key(id, now_ms()).await?;
        self.cache.invalidate(&k.digest);
        Ok(k)
    }

    pub async fn update_key(&self, id: &str, patch: &KeyPatch) -> Result<KeyRecord, KeyOpError> {
        let k = self.store.update_key(id, patch).await?;
        self.cache.invalidate(&k.digest);
        Ok(k)
    }

    pub async fn delete_key(&self, id: &str) -> Result<bool, KeyOpError> {
        let before = self.store.key(id).await?;
        let deleted = self.store.delete_key(id).await?;
        if let Some(k) = before {
            self.cache.invalidate(&k.digest);
        }
        Ok(deleted)
    }

    /// Copy a key's plaintext: creator and owner only, audited; keys without an encrypted
    /// copy (revoked, or from before copying existed) cannot be copied.
    pub async fn copy_key(&self, id: &str, actor: &str, role: CopyRole) -> Result<String, KeyOpError> {
        let key = self.store.key(id).await?.ok_or(KeyOpError::NotFound)?;
        let allowed = match role {
            CopyRole::Owner => true,
            CopyRole::Creator => key.created_by.as_deref() == Some(actor),
            CopyRole::Member | CopyRole::Viewer => false,
        };
        if !allowed {
            return Err(KeyOpError::CopyForbidden);
        }
        if !key.is_live(now_ms()) {
            return Err(KeyOpError::NotCopyable);
        }
        let blob = key.encrypted_copy.as_ref().ok_or(KeyOpError::NotCopyable)?;
        let plaintext = self.secrets.decrypt(blob).map_err(|_| KeyOpError::NotCopyable)?;
        let role_name = match role {
            CopyRole::Owner => "owner",
            _ => "creator",
        };
        self.store
            .record_copy(&CopyAudit {
                key_id: key.id.clone(),
                actor: actor.to_string(),
                role: role_name.into(),
                at: now_ms(),
            })
            .await?;
        Ok(plaintext)
    }
}

static KEY_LOOKUP: std::sync::LazyLock<Option<crate::observe::metrics::StoreOp>> =
    std::sync::LazyLock::new(|| crate::observe::metrics::StoreOp::new("identity", "key_lookup"));
