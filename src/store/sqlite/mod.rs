//! SQLite backend: the embedded default, one file under `data/`. One connection behind a
//! mutex, used from blocking tasks; `BEGIN IMMEDIATE` takes the write lock before a
//! multi-row change reads what it decides on, so caps hold across processes too.

pub(crate) mod checkpoint;
pub(crate) mod keys;
pub(crate) mod ledger;
pub(crate) mod ledger_batch;
pub(crate) mod plans;
pub(crate) mod rows;

use std::path::Path;
use std::sync::{Arc, Mutex};

use async_trait::async_trait;
use rusqlite::{Connection, OptionalExtension, TransactionBehavior, params};

use crate::identity::lifecycle::{self, KeyOpError};
use crate::identity::{KeyRecord, PlanBrief, Workspace};
use crate::runtime::clock::Millis;
use crate::store::sqlite::keys::{KEY_COLUMNS, get_key, insert_key, key_from_row, scope_keys, ws_from_row};
use crate::store::{CopyAudit, IdentityStore, KeyPatch, RotateOpts, SQLITE_MIGRATIONS, StoreError, Successor};

/// SQLite virtual machine steps between two checks whether to give way (a few microseconds).
const GIVE_WAY_STEPS: std::ffi::c_int = 1_000;

pub struct SqliteStore {
    conn: Arc<Mutex<Connection>>,
    /// The checkpoint thread fell behind the writes: the connection finishes a checkpoint.
    lag: Arc<crate::store::sqlite::checkpoint::Lag>,
}

fn unavailable(e: impl std::fmt::Display) -> StoreError {
    StoreError::Unavailable(e.to_string())
}

fn db_err(e: rusqlite::Error) -> StoreError {
    match e {
        rusqlite::Error::SqliteFailure(f, m) if f.code == rusqlite::ErrorCode::ConstraintViolation => {
            StoreError::Conflict(m.unwrap_or_else(|| "constraint".into()))
        }
        other => unavailable(other),
    }
}

impl SqliteStore {
    /// Open (creating) the database file; its folder is created too.
    pub fn open(path: &Path) -> Result<SqliteStore, StoreError> {
        SqliteStore::open_with(path, crate::store::sqlite::checkpoint::Lag::default())
    }

    /// [`SqliteStore::open`] with the checkpoint thread's bounds given (tests).
    pub(super) fn open_with(
        path: &Path,
        lag: crate::store::sqlite::checkpoint::Lag,
    ) -> Result<SqliteStore, StoreError> {
        if let Some(dir) = path.parent().filter(|d| !d.as_os_str().is_empty()) {
            std::fs::create_dir_all(dir).map_err(unavailable)?;
        }
        // A new file is the owner's alone (0600): it holds key digests, encrypted key copies and
        // the ledger. SQLite gives its `-wal` and `-shm` the file's mode; an existing file
        // keeps the mode its operator gave it (decision 169).
        #[cfg(unix)]
        {
            use std::os::unix::fs::OpenOptionsExt;
            match std::fs::OpenOptions::new().write(true).create_new(true).mode(0o600).open(path) {
                Ok(_) => {}
                Err(e) if e.kind() == std::io::ErrorKind::AlreadyExists => {}
                Err(e) => return Err(unavailable(e)),
            }
        }
        let conn = Connection::open(path).map_err(unavailable)?;
        // WAL with `synchronous = NORMAL`: a commit does not wait for an fsync (the WAL is
        // synced at checkpoints), so a crash of the process loses nothing and the database is
        // never corrupt; only a power loss may roll back the last commits (decision 45).
        // 1 KiB pages for a new file (an existing one keeps its size): a ledger commit writes
        // every page it touched to the WAL, whole and checksummed, and the rows are small.
        // Before `journal_mode = WAL`, whose switch writes the header and so fixes the size.
        conn.execute_batch(
            "PRAGMA page_size = 1024; PRAGMA journal_mode = WAL; PRAGMA synchronous = NORMAL; PRAGMA foreign_keys = ON; PRAGMA busy_timeout = 5000;",
        )
        .map_err(unavailable)?;
        // Every hot-path statement stays compiled (the default cache of 16 is smaller than
        // the identity and ledger statements together).
        conn.set_prepared_statement_cache_capacity(128);
        // A long batch gives way to request threads on its core between steps of its
        // statements (on the ledger writer only: elsewhere `give_way` does nothing).
        conn.progress_handler(
            GIVE_WAY_STEPS,
            Some(|| {
                tollgate_threads::give_way();
                false
            }),
        );
        let conn = Arc::new(Mutex::new(conn));
        let lag = Arc::new(lag);
        {
            let main = conn.lock().unwrap_or_else(|e| e.into_inner());
            crate::store::sqlite::checkpoint::start(path, &main, Arc::downgrade(&conn), lag.clone())
                .map_err(unavailable)?;
        }
        Ok(SqliteStore { conn, lag })
    }

    /// Run `f` on the connection in a blocking task; on the ledger writer's own thread, inline.
    async fn with<T: Send + 'static>(
        &self,
        f: impl FnOnce(&mut Connection) -> Result<T, KeyOpError> + Send + 'static,
    ) -> Result<T, KeyOpError> {
        self.run(f, |m| KeyOpError::Store(format!("store task failed: {m}"))).await
    }

    /// Run `f` on the connection (reads and write transactions alike), off the request's
    /// thread, with store errors as `StoreError` (a constraint violation stays a `Conflict`,
    /// which the ledger's group commit answers by retrying the batch op by op).
    pub(super) async fn with_conn<T: Send + 'static>(
        &self,
        f: impl FnOnce(&mut Connection) -> rusqlite::Result<T> + Send + 'static,
    ) -> Result<T, StoreError> {
        self.run(move |c| f(c).map_err(db_err), |m| StoreError::Unavailable(format!("store task failed: {m}"))).await
    }

    async fn run<T: Send + 'static, E: Send + 'static>(
        &self,
        f: impl FnOnce(&mut Connection) -> Result<T, E> + Send + 'static,
        failed: impl FnOnce(String) -> E,
    ) -> Result<T, E> {
        if crate::store::ledger::batch::on_writer_thread() {
            let mut c = self.conn.lock().unwrap_or_else(|e| e.into_inner());
            let out = f(&mut c);
            self.lag.finish(&c);
            return out;
        }
        let (conn, lag) = (self.conn.clone(), self.lag.clone());
        tokio::task::spawn_blocking(move || {
            let mut c = conn.lock().unwrap_or_else(|e| e.into_inner());
            let out = f(&mut c);
            lag.finish(&c);
            out
        })
        .await
        .map_err(|e| failed(e.to_string()))?
    }
}

fn ko(e: rusqlite::Error) -> KeyOpError {
    KeyOpError::from(db_err(e))
}

#[async_trait]
impl IdentityStore for SqliteStore {
    fn backend(&self) -> &'static str {
        "sqlite"
    }

    async fn migrate(&self) -> Result<(), StoreError> {
        self.with_conn(|c| {
            let tx = c.transaction_with_behavior(TransactionBehavior::Immediate)?;
            tx.execute_batch(
                "CREATE TABLE IF NOT EXISTS schema_migrations (version INTEGER PRIMARY KEY, name TEXT NOT NULL, applied_at INTEGER NOT NULL)",
            )?;
            for (version, name, sql) in SQLITE_MIGRATIONS {
                let done: Option<i64> = tx
                    .query_row("SELECT version FROM schema_migrations WHERE version = ?1", [version], |r| r.get(0))
                    .optional()?;
                if done.is_none() {
                    tx.execute_batch(sql)?;
                    tx.execute(
                        "INSERT INTO schema_migrations (version, name, applied_at) VALUES (?1, ?2, ?3)",
                        params![version, name, crate::runtime::clock::now_ms()],
                    )?;
                }
            }
            tx.commit()
        })
        .await
    }

    async fn ping(&self) -> Result<(), StoreError> {
        self.with_conn(|c| c.query_row("SELECT 1", [], |_| Ok(()))).await
    }

    async fn create_workspace(&self, ws: &Workspace) -> Result<(), StoreError> {
        let ws = ws.clone();
        self.with_conn(move |c| {
            c.execute(
                "INSERT INTO workspaces (id, name, rate_tier, created_at, frozen, lifetime_purchases_cents) VALUES (?1,?2,?3,?4,?5,?6)",
                params![ws.id, ws.name, ws.rate_tier.as_str(), ws.created_at, ws.frozen, ws.lifetime_purchases_cents],
            )
            .map(|_| ())
        })
        .await
    }

    async fn workspace(&self, id: &str) -> Result<Option<Workspace>, StoreError> {
        let id = id.to_string();
        self.with_conn(move |c| {
            c.query_row(
                "SELECT id, name, rate_tier, created_at, frozen, lifetime_purchases_cents FROM workspaces WHERE id = ?1",
                [id],
                |r| ws_from_row(r, 0),
            )
            .optional()
        })
        .await
    }

    async fn create_key(&self, key: &KeyRecord, now: Millis) -> Result<(), KeyOpError> {
        let key = key.clone();
        self.with(move |c| {
            let tx = c.transaction_with_behavior(TransactionBehavior::Immediate).map_err(ko)?;
            let existing = scope_keys(&tx, &key.workspace_id, key.scope).map_err(ko)?;
            lifecycle::check_create(&existing, now)?;
            insert_key(&tx, &key).map_err(ko)?;
            tx.commit().map_err(ko)
        })
        .await
    }

    async fn key(&self, id: &str) -> Result<Option<KeyRecord>, StoreError> {
        let id = id.to_string();
        self.with_conn(move |c| get_key(c, &id)).await
    }

    async fn key_by_digest(&self, digest: &str) -> Result<Option<(KeyRecord, Workspace)>, StoreError> {
        let digest = digest.to_string();
        self.with_conn(move |c| {
            let cols: String = KEY_COLUMNS.split(", ").map(|col| format!("k.{col}")).collect::<Vec<_>>().join(", ");
            c.prepare_cached(&format!(
                "SELECT {cols}, w.id, w.name, w.rate_tier, w.created_at, w.frozen, w.lifetime_purchases_cents, \
                 p.tier, p.status, p.grace_until, p.cancel_at \
                 FROM api_keys k JOIN workspaces w ON w.id = k.workspace_id \
                 LEFT JOIN plans p ON p.workspace_id = w.id WHERE k.digest = ?1"
            ))?
            .query_row([digest], |r| {
                let mut ws = ws_from_row(r, 17)?;
                ws.plan = PlanBrief::from_columns(r.get(23)?, r.get(24)?, r.get(25)?, r.get(26)?);
                Ok((key_from_row(r)?, ws))
            })
            .optional()
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
        self.with(move |c| {
            let tx = c.transaction_with_behavior(TransactionBehavior::Immediate).map_err(ko)?;
            let target = get_key(&tx, &id).map_err(ko)?.ok_or(KeyOpError::NotFound)?;
            let keys = scope_keys(&tx, &target.workspace_id, target.scope).map_err(ko)?;
            let plan = lifecycle::plan_rotation(&target, &keys, now, opts.revoke_previous_immediately, opts.grace_ms)?;
            let new_key = successor(&target)?;
            insert_key(&tx, &new_key).map_err(ko)?;
            for old in &plan.revoke {
                tx.execute(
                    "UPDATE api_keys SET revoked_at = ?2, encrypted_copy = NULL WHERE id = ?1",
                    params![old, now],
                )
                .map_err(ko)?;
            }
            if plan.revoke_previous {
                tx.execute(
                    "UPDATE api_keys SET revoked_at = ?2, encrypted_copy = NULL WHERE id = ?1",
                    params![target.id, now],
                )
                .map_err(ko)?;
            } else {
                tx.execute(
                    "UPDATE api_keys SET grace_until = ?2 WHERE id = ?1",
                    params![target.id, plan.previous_grace_until],
                )
                .map_err(ko)?;
            }
            let previous = get_key(&tx, &target.id).map_err(ko)?.ok_or(KeyOpError::NotFound)?;
            tx.commit().map_err(ko)?;
            Ok((new_key, previous))
        })
        .await
    }

    async fn revoke_key(&self, id: &str, now: Millis) -> Result<KeyRecord, KeyOpError> {
        let id = id.to_string();
        self.with(move |c| {
            let tx = c.transaction_with_behavior(TransactionBehavior::Immediate).map_err(ko)?;
            get_key(&tx, &id).map_err(ko)?.ok_or(KeyOpError::NotFound)?;
            tx.execute(
                "UPDATE api_keys SET revoked_at = COALESCE(revoked_at, ?2), encrypted_copy = NULL WHERE id = ?1",
                params![id, now],
            )
            .map_err(ko)?;
            let k = get_key(&tx, &id).map_err(ko)?.ok_or(KeyOpError::NotFound)?;
            tx.commit().map_err(ko)?;
            Ok(k)
        })
        .await
    }

    async fn update_key(&self, id: &str, patch: &KeyPatch) -> Result<KeyRecord, KeyOpError> {
        let id = id.to_string();
        let p = patch.clone();
        self.with(move |c| {
            let tx = c.transaction_with_behavior(TransactionBehavior::Immediate).map_err(ko)?;
            let current = get_key(&tx, &id).map_err(ko)?.ok_or(KeyOpError::NotFound)?;
            lifecycle::check_expiry_change(&current, p.expires_at, crate::runtime::clock::now_ms())?;
            if let Some(v) = p.monthly_spend_limit_cents {
                tx.execute("UPDATE api_keys SET monthly_spend_limit_cents = ?2 WHERE id = ?1", params![id, v])
                    .map_err(ko)?;
            }
            if let Some(v) = p.credits_only {
                tx.execute("UPDATE api_keys SET credits_only = ?2 WHERE id = ?1", params![id, v]).map_err(ko)?;
            }
            if let Some(v) = p.rate_limit_rpm {
                tx.execute("UPDATE api_keys SET rate_limit_rpm = ?2 WHERE id = ?1", params![id, v]).map_err(ko)?;
            }
            if let Some(v) = p.expires_at {
                tx.execute("UPDATE api_keys SET expires_at = ?2 WHERE id = ?1", params![id, v]).map_err(ko)?;
            }
            let k = get_key(&tx, &id).map_err(ko)?.ok_or(KeyOpError::NotFound)?;
            tx.commit().map_err(ko)?;
            Ok(k)
        })
        .await
    }

    async fn erase_dead_copies(&self, now: Millis) -> Result<u64, StoreError> {
        self.with_conn(move |c| {
            c.execute(
                "UPDATE api_keys SET encrypted_copy = NULL WHERE encrypted_copy IS NOT NULL \
                 AND (grace_until <= ?1 OR expires_at <= ?1)",
                [now],
            )
            .map(|n| n as u64)
        })
        .await
    }

    async fn delete_key(&self, id: &str) -> Result<bool, StoreError> {
        let id = id.to_string();
        self.with_conn(move |c| c.execute("DELETE FROM api_keys WHERE id = ?1", [id]).map(|n| n > 0)).await
    }

    async fn record_copy(&self, a: &CopyAudit) -> Result<(), StoreError> {
        let a = a.clone();
        self.with_conn(move |c| {
            c.execute(
                "INSERT INTO key_copy_audit (key_id, actor, role, at) VALUES (?1, ?2, ?3, ?4)",
                params![a.key_id, a.actor, a.role, a.at],
            )
            .map(|_| ())
        })
        .await
    }

    async fn copy_audit(&self, key_id: &str) -> Result<Vec<CopyAudit>, StoreError> {
        let key_id = key_id.to_string();
        self.with_conn(move |c| {
            let mut st =
                c.prepare("SELECT key_id, actor, role, at FROM key_copy_audit WHERE key_id = ?1 ORDER BY id")?;
            let rows = st.query_map([key_id], |r| {
                Ok(CopyAudit { key_id: r.get(0)?, actor: r.get(1)?, role: r.get(2)?, at: r.get(3)? })
            })?;
            rows.collect()
        })
        .await
    }

    async fn set_model_state(&self, model: &str, paused_until: Option<Millis>, now: Millis) -> Result<(), StoreError> {
        let model = model.to_string();
        self.with_conn(move |c| {
            c.execute(
                "INSERT INTO model_states (model, paused_until, changed_at) VALUES (?1, ?2, ?3) \
                 ON CONFLICT (model) DO UPDATE SET paused_until = excluded.paused_until, changed_at = excluded.changed_at",
                params![model, paused_until, now],
            )
            .map(|_| ())
        })
        .await
    }

    async fn model_states(&self) -> Result<Vec<crate::store::ModelState>, StoreError> {
        self.with_conn(|c| {
            let mut st = c.prepare_cached("SELECT model, paused_until, changed_at FROM model_states")?;
            let rows = st.query_map([], |r| {
                Ok(crate::store::ModelState { model: r.get(0)?, paused_until: r.get(1)?, changed_at: r.get(2)? })
            })?;
            rows.collect()
        })
        .await
    }
}

#[cfg(test)]
mod tests;
