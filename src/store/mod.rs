//! Stores behind traits, with real backends: SQLite (the embedded default, a file under
//! `data/`) and PostgreSQL (production). One test suite runs against both. Schemas are
//! versioned SQL files in `migrations/<backend>/`, applied by `tollgate migrate` and at
//! `serve` start when configured to.

pub mod ledger;
pub mod plan_rows;
pub mod postgres;
pub mod settings;
pub mod sqlite;
pub mod tls;
pub use postgres::ledger_batch::lock_sql as postgres_batch_lock_sql;
pub use settings::{StoreConfig, redact_url};

use std::sync::Arc;

use async_trait::async_trait;

use crate::identity::lifecycle::KeyOpError;
use crate::identity::{KeyRecord, Workspace};
use crate::runtime::clock::Millis;

/// A store failure: nothing was changed.
#[derive(Debug, Clone, PartialEq, Eq)]
pub enum StoreError {
    /// The store could not be reached or failed mid-operation.
    Unavailable(String),
    /// A uniqueness or reference rule refused the write.
    Conflict(String),
    /// The store is reachable but writes wait longer than the instance allows; nothing was
    /// written and a retry shortly may succeed (the ledger sheds holds this way).
    Busy(String),
    /// The op never reached the store (the ledger's queue is full, or its writer stopped):
    /// nothing was written, and nothing will be.
    NotQueued(String),
}

impl std::fmt::Display for StoreError {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        match self {
            StoreError::Unavailable(m) | StoreError::NotQueued(m) => write!(f, "store unavailable: {m}"),
            StoreError::Conflict(m) => write!(f, "conflict: {m}"),
            StoreError::Busy(m) => write!(f, "store busy: {m}"),
        }
    }
}

impl From<StoreError> for KeyOpError {
    fn from(e: StoreError) -> Self {
        match e {
            StoreError::Unavailable(m) | StoreError::Conflict(m) | StoreError::Busy(m) | StoreError::NotQueued(m) => {
                KeyOpError::Store(m)
            }
        }
    }
}

/// Builds the new key of a rotation from the previous one (read under the store's lock).
pub type Successor = Box<dyn FnOnce(&KeyRecord) -> Result<KeyRecord, KeyOpError> + Send>;

#[derive(Debug, Clone, Copy, Default)]
pub struct RotateOpts {
    pub revoke_previous_immediately: bool,
    pub grace_ms: Option<Millis>,
}

/// Changes to a key's settings; `Some(None)` clears an optional value.
#[derive(Debug, Clone, Default)]
pub struct KeyPatch {
    pub monthly_spend_limit_cents: Option<Option<i64>>,
    pub credits_only: Option<bool>,
    pub rate_limit_rpm: Option<Option<i64>>,
    pub expires_at: Option<Option<Millis>>,
}

#[derive(Debug, Clone, PartialEq, Eq)]
pub struct CopyAudit {
    pub key_id: String,
    pub actor: String,
    pub role: String,
    pub at: Millis,
}

/// Workspaces and keys. Every multi-row change is one transaction, serialized per
/// workspace, so concurrent admin calls on several gateway instances cannot break the caps.
#[async_trait]
pub trait IdentityStore: Send + Sync {
    fn backend(&self) -> &'static str;
    /// Apply the migrations not yet applied.
    async fn migrate(&self) -> Result<(), StoreError>;
    async fn ping(&self) -> Result<(), StoreError>;

    async fn create_workspace(&self, ws: &Workspace) -> Result<(), StoreError>;
    async fn workspace(&self, id: &str) -> Result<Option<Workspace>, StoreError>;

    /// Insert `key` unless its scope already has the maximum of live keys at `now`.
    async fn create_key(&self, key: &KeyRecord, now: Millis) -> Result<(), KeyOpError>;
    async fn key(&self, id: &str) -> Result<Option<KeyRecord>, StoreError>;
    /// The key whose digest is `digest`, with its workspace (the auth hot path on a miss).
    async fn key_by_digest(&self, digest: &str) -> Result<Option<(KeyRecord, Workspace)>, StoreError>;
    /// Rotate `id`: returns (new key, previous key as updated).
    async fn rotate_key(
        &self,
        id: &str,
        successor: Successor,
        opts: RotateOpts,
        now: Millis,
    ) -> Result<(KeyRecord, KeyRecord), KeyOpError>;
    /// Revoke (ends any grace) and erase the encrypted copy.
    async fn revoke_key(&self, id: &str, now: Millis) -> Result<KeyRecord, KeyOpError>;
    async fn update_key(&self, id: &str, patch: &KeyPatch) -> Result<KeyRecord, KeyOpError>;
    /// Erase the encrypted copies of keys that can never work again at `now` (a rotation
    /// grace that ended, an expiry that passed): what revocation erases (decision 172).
    /// Returns how many copies were erased.
    async fn erase_dead_copies(&self, now: Millis) -> Result<u64, StoreError>;
    /// Permanent deletion: the key becomes unknown. `false` when there was no such key.
    async fn delete_key(&self, id: &str) -> Result<bool, StoreError>;

    async fn record_copy(&self, audit: &CopyAudit) -> Result<(), StoreError>;
    async fn copy_audit(&self, key_id: &str) -> Result<Vec<CopyAudit>, StoreError>;

    /// Record an operator's pause (`Some(until)`) or resume (`None`) of `model`: the state
    /// every instance on this store serves (issue 52).
    async fn set_model_state(&self, model: &str, paused_until: Option<Millis>, now: Millis) -> Result<(), StoreError>;
    /// Every model state an operator set, in no particular order.
    async fn model_states(&self) -> Result<Vec<ModelState>, StoreError>;
}

/// An operator's last pause or resume of one model.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct ModelState {
    pub model: String,
    /// `Some`: paused until then; `None`: resumed.
    pub paused_until: Option<Millis>,
    pub changed_at: Millis,
}

/// Embedded migrations per backend: (version, name, SQL).
pub type Migration = (i64, &'static str, &'static str);

pub const SQLITE_MIGRATIONS: &[Migration] = &[
    (1, "identity", include_str!("../../migrations/sqlite/001_identity.sql")),
    (2, "ledger", include_str!("../../migrations/sqlite/002_ledger.sql")),
    (3, "credit_expiry", include_str!("../../migrations/sqlite/003_credit_expiry.sql")),
    (4, "plans", include_str!("../../migrations/sqlite/004_plans.sql")),
    (5, "hold_entries", include_str!("../../migrations/sqlite/005_hold_entries.sql")),
    (6, "lease_recall", include_str!("../../migrations/sqlite/006_lease_recall.sql")),
    (7, "model_states", include_str!("../../migrations/sqlite/007_model_states.sql")),
];
pub const POSTGRES_MIGRATIONS: &[Migration] = &[
    (1, "identity", include_str!("../../migrations/postgres/001_identity.sql")),
    (2, "ledger", include_str!("../../migrations/postgres/002_ledger.sql")),
    (3, "credit_expiry", include_str!("../../migrations/postgres/003_credit_expiry.sql")),
    (4, "plans", include_str!("../../migrations/postgres/004_plans.sql")),
    (5, "hold_entries", include_str!("../../migrations/postgres/005_hold_entries.sql")),
    (6, "lease_recall", include_str!("../../migrations/postgres/006_lease_recall.sql")),
    (7, "ledger_rows_unreferenced", include_str!("../../migrations/postgres/007_ledger_rows_unreferenced.sql")),
    (8, "model_states", include_str!("../../migrations/postgres/008_model_states.sql")),
];

/// The stores of one backend: the same database serves identity and the ledger.
#[derive(Clone)]
pub struct Stores {
    pub identity: Arc<dyn IdentityStore>,
    pub ledger: Arc<dyn ledger::LedgerStore>,
}

/// Open the configured backend (the one place that picks one). Credentials in the URL are
/// never logged. The ledger of either backend is wrapped in group commit
/// (`ledger::batch::BatchedLedger`: holds and settlements of many requests per transaction).
pub async fn open_stores(config: &StoreConfig) -> Result<Stores, StoreError> {
    open_stores_tuned(config, ledger::batch::MAX_HOLD_WAIT).await
}

/// [`open_stores`] with the ledger shedding holds while its writes wait longer than
/// `max_hold_wait` (`billing.ledger_max_wait_ms`, decision 131).
pub async fn open_stores_tuned(config: &StoreConfig, max_hold_wait: std::time::Duration) -> Result<Stores, StoreError> {
    let tuned = |l: ledger::batch::BatchedLedger| Arc::new(l.with_max_hold_wait(max_hold_wait));
    match config {
        StoreConfig::Sqlite { path } => {
            let s = Arc::new(sqlite::SqliteStore::open(path)?);
            Ok(Stores { identity: s.clone(), ledger: tuned(ledger::batch::BatchedLedger::new(s)?) })
        }
        StoreConfig::Postgres { url, call_timeout, tls } => {
            let s = Arc::new(postgres::PostgresStore::connect_tls(url, *call_timeout, tls.as_ref()).await?);
            Ok(Stores { identity: s.clone(), ledger: tuned(ledger::batch::BatchedLedger::new(s)?) })
        }
    }
}

/// The backend's own stores, without group commit (each ledger write its own transaction):
/// for tests and benches that compare the two.
pub async fn open_stores_unbatched(config: &StoreConfig) -> Result<Stores, StoreError> {
    match config {
        StoreConfig::Sqlite { path } => {
            let s = Arc::new(sqlite::SqliteStore::open(path)?);
            Ok(Stores { identity: s.clone(), ledger: s })
        }
        StoreConfig::Postgres { url, call_timeout, tls } => {
            let s = Arc::new(postgres::PostgresStore::connect_tls(url, *call_timeout, tls.as_ref()).await?);
            Ok(Stores { identity: s.clone(), ledger: s })
        }
    }
}

/// The identity store of the configured backend.
pub async fn open(config: &StoreConfig) -> Result<Arc<dyn IdentityStore>, StoreError> {
    Ok(open_stores(config).await?.identity)
}
