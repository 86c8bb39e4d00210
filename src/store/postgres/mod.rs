//! PostgreSQL backend (production), on `tokio-postgres` with a `deadpool` pool.
//!
//! Pingora gives each service its own tokio runtime, and a pooled connection's I/O task
//! lives on the runtime that opened it; so every database call runs on one dedicated store
//! runtime that lives as long as the process. Multi-row changes lock the workspace row
//! (`SELECT ... FOR UPDATE`), so key caps hold across gateway instances.

pub(crate) mod ledger;
pub mod ledger_batch;
mod ledger_columns;
pub(crate) mod plans;
pub(crate) mod pool;

use async_trait::async_trait;
use deadpool_postgres::GenericClient;
use tokio_postgres::Row;

use crate::identity::lifecycle::{self, KeyOpError};
use crate::identity::{KeyRecord, KeyScope, PlanBrief, RateTier, Workspace};
use crate::runtime::clock::Millis;
use crate::store::postgres::pool::ko;
pub use crate::store::postgres::pool::{CALL_TIMEOUT, PostgresStore};
use crate::store::{CopyAudit, IdentityStore, KeyPatch, POSTGRES_MIGRATIONS, RotateOpts, StoreError, Successor};

const KEY_COLUMNS: &str = "id, workspace_id, name, scope, digest, format_version, encrypted_copy, created_by, \
     created_at, expires_at, revoked_at, grace_until, rotated_from, rotation_root, credits_only, \
     monthly_spend_limit_cents, rate_limit_rpm";
const WS_COLUMNS: &str = "id, name, rate_tier, created_at, frozen, lifetime_purchases_cents";

fn key_from_row(r: &Row, at: usize) -> Result<KeyRecord, tokio_postgres::Error> {
    let scope: String = r.try_get(at + 3)?;
    Ok(KeyRecord {
        id: r.try_get(at)?,
        workspace_id: r.try_get(at + 1)?,
        name: r.try_get(at + 2)?,
        scope: KeyScope::parse(&scope).unwrap_or(KeyScope::Workspace),
        digest: r.try_get(at + 4)?,
        format_version: r.try_get(at + 5)?,
        encrypted_copy: r.try_get(at + 6)?,
        created_by: r.try_get(at + 7)?,
        created_at: r.try_get(at + 8)?,
        expires_at: r.try_get(at + 9)?,
        revoked_at: r.try_get(at + 10)?,
        grace_until: r.try_get(at + 11)?,
        rotated_from: r.try_get(at + 12)?,
        rotation_root: r.try_get(at + 13)?,
        credits_only: r.try_get(at + 14)?,
        monthly_spend_limit_cents: r.try_get(at + 15)?,
        rate_limit_rpm: r.try_get(at + 16)?,
    })
}

fn ws_from_row(r: &Row, at: usize) -> Result<Workspace, tokio_postgres::Error> {
    let tier: String = r.try_get(at + 2)?;
    Ok(Workspace {
        id: r.try_get(at)?,
        name: r.try_get(at + 1)?,
        rate_tier: RateTier::parse(&tier).unwrap_or(RateTier::Free),
        created_at: r.try_get(at + 3)?,
        frozen: r.try_get(at + 4)?,
        lifetime_purchases_cents: r.try_get(at + 5)?,
        plan: None,
    })
}

async fn insert_key(c: &impl GenericClient, k: &KeyRecord) -> Result<u64, tokio_postgres::Error> {
    c.execute(
        &format!(
            "INSERT INTO api_keys ({KEY_COLUMNS}) VALUES ($1,$2,$3,$4,$5,$6,$7,$8,$9,$10,$11,$12,$13,$14,$15,$16,$17)"
        ),
        &[
            &k.id,
            &k.workspace_id,
            &k.name,
            &k.scope.as_str(),
            &k.digest,
            &k.format_version,
            &k.encrypted_copy,
            &k.created_by,
            &k.created_at,
            &k.expires_at,
            &k.revoked_at,
            &k.grace_until,
            &k.rotated_from,
            &k.rotation_root,
            &k.credits_only,
            &k.monthly_spend_limit_cents,
            &k.rate_limit_rpm,
        ],
    )
    .await
}

async fn get_key(c: &impl GenericClient, id: &str) -> Result<Option<KeyRecord>, tokio_postgres::Error> {
    match c.query_opt(&format!("SELECT {KEY_COLUMNS} FROM api_keys WHERE id = $1"), &[&id]).await? {
        Some(r) => key_from_row(&r, 0).map(Some),
        None => Ok(None),
    }
}

async fn scope_keys(
    c: &impl GenericClient,
    ws: &str,
    scope: KeyScope,
) -> Result<Vec<KeyRecord>, tokio_postgres::Error> {
    let rows = c
        .query(
            &format!("SELECT {KEY_COLUMNS} FROM api_keys WHERE workspace_id = $1 AND scope = $2"),
            &[&ws, &scope.as_str()],
        )
        .await?;
    rows.iter().map(|r| key_from_row(r, 0)).collect()
}

/// Lock the workspace row for the rest of the transaction.
async fn lock_workspace(c: &impl GenericClient, ws: &str) -> Result<(), KeyOpError> {
    c.query_opt("SELECT id FROM workspaces WHERE id = $1 FOR UPDATE", &[&ws])
        .await
        .map_err(ko)?
        .ok_or(KeyOpError::NotFound)
        .map(|_| ())
}

#[async_trait]
impl IdentityStore for PostgresStore {
    fn backend(&self) -> &'static str {
        "postgres"
    }

    async fn migrate(&self) -> Result<(), StoreError> {
        self.with_client(|mut c| async move {
            let tx = c.transaction().await?;
            // One migrating instance at a time.
            tx.execute("SELECT pg_advisory_xact_lock(7242001)", &[]).await?;
            tx.batch_execute(
                "CREATE TABLE IF NOT EXISTS schema_migrations (version BIGINT PRIMARY KEY, name TEXT NOT NULL, applied_at BIGINT NOT NULL)",
            )
            .await?;
            for (version, name, sql) in POSTGRES_MIGRATIONS {
                let done = tx.query_opt("SELECT version FROM schema_migrations WHERE version = $1", &[version]).await?;
                if done.is_none() {
                    tx.batch_execute(sql).await?;
                    tx.execute(
                        "INSERT INTO schema_migrations (version, name, applied_at) VALUES ($1, $2, $3)",
                        &[version, name, &crate::runtime::clock::now_ms()],
                    )
                    .await?;
                }
            }
            tx.commit().await
        })
        .await
    }

    async fn ping(&self) -> Result<(), StoreError> {
        self.with_client(|c| async move { c.execute("SELECT 1", &[]).await.map(|_| ()) }).await
    }

    async fn create_workspace(&self, ws: &Workspace) -> Result<(), StoreError> {
        let ws = ws.clone();
        self.with_client(move |c| async move {
            c.execute(
                &format!("INSERT INTO workspaces ({WS_COLUMNS}) VALUES ($1,$2,$3,$4,$5,$6)"),
                &[&ws.id, &ws.name, &ws.rate_tier.as_str(), &ws.created_at, &ws.frozen, &ws.lifetime_purchases_cents],
            )
            .await
            .map(|_| ())
        })
        .await
    }

    async fn workspace(&self, id: &str) -> Result<Option<Workspace>, StoreError> {
        let id = id.to_string();
        self.with_client(move |c| async move {
            match c.query_opt(&format!("SELECT {WS_COLUMNS} FROM workspaces WHERE id = $1"), &[&id]).await? {
                Some(r) => ws_from_row(&r, 0).map(Some),
                None => Ok(None),
            }
        })
        .await
    }

    async fn create_key(&self, key: &KeyRecord, now: Millis) -> Result<(), KeyOpError> {
        let key = key.clone();
        self.run(move |mut c| async move {
            let tx = c.transaction().await.map_err(ko)?;
            lock_workspace(&tx, &key.workspace_id).await?;
            let existing = scope_keys(&tx, &key.workspace_id, key.scope).await.map_err(ko)?;
            lifecycle::check_create(&existing, now)?;
            insert_key(&tx, &key).await.map_err(ko)?;
            tx.commit().await.map_err(ko)
        })
        .await
    }

    async fn key(&self, id: &str) -> Result<Option<KeyRecord>, StoreError> {
        let id = id.to_string();
        self.with_client(move |c| async move { get_key(&c, &id).await }).await
    }

    async fn key_by_digest(&self, digest: &str) -> Result<Option<(KeyRecord, Workspace)>, StoreError> {
        let digest = digest.to_string();
        self.with_client(move |c| async move {
            let kcols: Vec<String> = KEY_COLUMNS.split(", ").map(|col| format!("k.{col}")).collect();
            let wcols: Vec<String> = WS_COLUMNS.split(", ").map(|col| format!("w.{col}")).collect();
            let sql = format!(
                "SELECT {}, {}, p.tier, p.status, p.grace_until, p.cancel_at FROM api_keys k \
                 JOIN workspaces w ON w.id = k.workspace_id LEFT JOIN plans p ON p.workspace_id = w.id \
                 WHERE k.digest = $1",
                kcols.join(", "),
                wcols.join(", ")
            );
            let st = c.prepare_cached(&sql).await?;
            match c.query_opt(&st, &[&digest]).await? {
                Some(r) => {
                    let mut ws = ws_from_row(&r, 17)?;
                    ws.plan = PlanBrief::from_columns(r.try_get(23)?, r.try_get(24)?, r.try_get(25)?, r.try_get(26)?);
                    Ok(Some((key_from_row(&r, 0)?, ws)))
                }
                None => Ok(None),
            }
        })
        .await
    }

    async fn rotate_key(
        &self,
        id: &str,
        successor: Successor,
        opts: RotateOpts,
        now: Millis,
    ) -> Result<(KeyRecord, KeyRecord), KeyOpError> {
        let id = id.to_string();
        self.run(move |mut c| async move {
            let tx = c.transaction().await.map_err(ko)?;
            let first = get_key(&tx, &id).await.map_err(ko)?.ok_or(KeyOpError::NotFound)?;
            lock_workspace(&tx, &first.workspace_id).await?;
            let target = get_key(&tx, &id).await.map_err(ko)?.ok_or(KeyOpError::NotFound)?;
            let keys = scope_keys(&tx, &target.workspace_id, target.scope).await.map_err(ko)?;
            let plan = lifecycle::plan_rotation(&target, &keys, now, opts.revoke_previous_immediately, opts.grace_ms)?;
            let new_key = successor(&target)?;
            insert_key(&tx, &new_key).await.map_err(ko)?;
            for old in &plan.revoke {
                tx.execute("UPDATE api_keys SET revoked_at = $2, encrypted_copy = NULL WHERE id = $1", &[old, &now])
                    .await
                    .map_err(ko)?;
            }
            if plan.revoke_previous {
                tx.execute(
                    "UPDATE api_keys SET revoked_at = $2, encrypted_copy = NULL WHERE id = $1",
                    &[&target.id, &now],
                )
                .await
                .map_err(ko)?;
            } else {
                tx.execute(
                    "UPDATE api_keys SET grace_until = $2 WHERE id = $1",
                    &[&target.id, &plan.previous_grace_until],
                )
                .await
                .map_err(ko)?;
            }
            let previous = get_key(&tx, &target.id).await.map_err(ko)?.ok_or(KeyOpError::NotFound)?;
            tx.commit().await.map_err(ko)?;
            Ok((new_key, previous))
        })
        .await
    }

    async fn revoke_key(&self, id: &str, now: Millis) -> Result<KeyRecord, KeyOpError> {
        let id = id.to_string();
        self.run(move |c| async move {
            let n = c
                .execute(
                    "UPDATE api_keys SET revoked_at = COALESCE(revoked_at, $2), encrypted_copy = NULL WHERE id = $1",
                    &[&id, &now],
                )
                .await
                .map_err(ko)?;
            if n == 0 {
                return Err(KeyOpError::NotFound);
            }
            get_key(&c, &id).await.map_err(ko)?.ok_or(KeyOpError::NotFound)
        })
        .await
    }

    async fn update_key(&self, id: &str, patch: &KeyPatch) -> Result<KeyRecord, KeyOpError> {
        let id = id.to_string();
        let p = patch.clone();
        self.run(move |mut c| async move {
            let tx = c.transaction().await.map_err(ko)?;
            let current = get_key(&tx, &id).await.map_err(ko)?.ok_or(KeyOpError::NotFound)?;
            lifecycle::check_expiry_change(&current, p.expires_at, crate::runtime::clock::now_ms())?;
            if let Some(v) = p.monthly_spend_limit_cents {
                tx.execute("UPDATE api_keys SET monthly_spend_limit_cents = $2 WHERE id = $1", &[&id, &v])
                    .await
                    .map_err(ko)?;
            }
            if let Some(v) = p.credits_only {
                tx.execute("UPDATE api_keys SET credits_only = $2 WHERE id = $1", &[&id, &v]).await.map_err(ko)?;
            }
            if let Some(v) = p.rate_limit_rpm {
                tx.execute("UPDATE api_keys SET rate_limit_rpm = $2 WHERE id = $1", &[&id, &v]).await.map_err(ko)?;
            }
            if let Some(v) = p.expires_at {
                tx.execute("UPDATE api_keys SET expires_at = $2 WHERE id = $1", &[&id, &v]).await.map_err(ko)?;
            }
            let k = get_key(&tx, &id).await.map_err(ko)?.ok_or(KeyOpError::NotFound)?;
            tx.commit().await.map_err(ko)?;
            Ok(k)
        })
        .await
    }

    async fn erase_dead_copies(&self, now: Millis) -> Result<u64, StoreError> {
        self.with_client(move |c| async move {
            c.execute(
                "UPDATE api_keys SET encrypted_copy = NULL WHERE encrypted_copy IS NOT NULL \
                 AND (grace_until <= $1 OR expires_at <= $1)",
                &[&now],
            )
            .await
        })
        .await
    }

    async fn delete_key(&self, id: &str) -> Result<bool, StoreError> {
        let id = id.to_string();
        self.with_client(move |c| async move {
            c.execute("DELETE FROM api_keys WHERE id = $1", &[&id]).await.map(|n| n > 0)
        })
        .await
    }

    async fn record_copy(&self, a: &CopyAudit) -> Result<(), StoreError> {
        let a = a.clone();
        self.with_client(move |c| async move {
            c.execute(
                "INSERT INTO key_copy_audit (key_id, actor, role, at) VALUES ($1, $2, $3, $4)",
                &[&a.key_id, &a.actor, &a.role, &a.at],
            )
            .await
            .map(|_| ())
        })
        .await
    }

    async fn copy_audit(&self, key_id: &str) -> Result<Vec<CopyAudit>, StoreError> {
        let key_id = key_id.to_string();
        self.with_client(move |c| async move {
            let rows = c
                .query("SELECT key_id, actor, role, at FROM key_copy_audit WHERE key_id = $1 ORDER BY id", &[&key_id])
                .await?;
            rows.iter()
                .map(|r| {
                    Ok(CopyAudit {
                        key_id: r.try_get(0)?,
                        actor: r.try_get(1)?,
                        role: r.try_get(2)?,
                        at: r.try_get(3)?,
                    })
                })
                .collect()
        })
        .await
    }

    async fn set_model_state(&self, model: &str, paused_until: Option<Millis>, now: Millis) -> Result<(), StoreError> {
        let model = model.to_string();
        self.with_client(move |c| async move {
            c.execute(
                "INSERT INTO model_states (model, paused_until, changed_at) VALUES ($1, $2, $3) \
                 ON CONFLICT (model) DO UPDATE SET paused_until = excluded.paused_until, changed_at = excluded.changed_at",
                &[&model, &paused_until, &now],
            )
            .await
            .map(|_| ())
        })
        .await
    }

    async fn model_states(&self) -> Result<Vec<crate::store::ModelState>, StoreError> {
        self.with_client(|c| async move {
            let rows = c.query("SELECT model, paused_until, changed_at FROM model_states", &[]).await?;
            rows.iter()
                .map(|r| {
                    Ok(crate::store::ModelState {
                        model: r.try_get(0)?,
                        paused_until: r.try_get(1)?,
                        changed_at: r.try_get(2)?,
                    })
                })
                .collect()
        })
        .await
    }
}
