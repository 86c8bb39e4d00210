//! The PostgreSQL connection pool and the one way every store call runs: on a dedicated
//! store runtime (Pingora gives each service its own tokio runtime, and a pooled connection's
//! I/O task lives on the runtime that opened it), bounded by `CALL_TIMEOUT`.

use std::future::Future;
use std::sync::OnceLock;
use std::time::Duration;

use deadpool_postgres::{Manager, ManagerConfig, Pool, RecyclingMethod, Runtime};
use tokio_postgres::NoTls;

use super::{IdentityStore, StoreError};
use crate::identity::lifecycle::KeyOpError;

/// Longest a single store call may take before it counts as unavailable.
const CALL_TIMEOUT: Duration = Duration::from_secs(5);

fn store_runtime() -> Result<&'static tokio::runtime::Runtime, StoreError> {
    static RT: OnceLock<Result<tokio::runtime::Runtime, String>> = OnceLock::new();
    RT.get_or_init(|| {
        tokio::runtime::Builder::new_multi_thread()
            .worker_threads(1)
            .thread_name("tollgate-store")
            .enable_all()
            .build()
            .map_err(|e| e.to_string())
    })
    .as_ref()
    .map_err(|e| StoreError::Unavailable(format!("store runtime: {e}")))
}

pub struct PostgresStore {
    pub(super) pool: Pool,
    pub(super) rt: tokio::runtime::Handle,
}

pub(super) fn pg(e: tokio_postgres::Error) -> StoreError {
    if let Some(db) = e.as_db_error() {
        if db.code().code().starts_with("23") {
            return StoreError::Conflict(db.message().to_string());
        }
    }
    StoreError::Unavailable(e.to_string())
}

pub(super) fn ko(e: tokio_postgres::Error) -> KeyOpError {
    KeyOpError::from(pg(e))
}

impl PostgresStore {
    pub async fn connect(url: &str) -> Result<PostgresStore, StoreError> {
        let cfg: tokio_postgres::Config =
            url.parse().map_err(|e| StoreError::Unavailable(format!("bad PostgreSQL URL: {e}")))?;
        let rt = store_runtime()?.handle().clone();
        let pool = rt
            .spawn(async move {
                let mgr = Manager::from_config(cfg, NoTls, ManagerConfig { recycling_method: RecyclingMethod::Fast });
                Pool::builder(mgr)
                    .max_size(16)
                    .runtime(Runtime::Tokio1)
                    .wait_timeout(Some(CALL_TIMEOUT))
                    .create_timeout(Some(CALL_TIMEOUT))
                    .recycle_timeout(Some(CALL_TIMEOUT))
                    .build()
            })
            .await
            .map_err(|e| StoreError::Unavailable(e.to_string()))?
            .map_err(|e| StoreError::Unavailable(format!("pool: {e}")))?;
        let store = PostgresStore { pool, rt };
        store.ping().await?;
        Ok(store)
    }

    /// Run `f` with a pooled client on the store runtime, bounded by `CALL_TIMEOUT`.
    pub(super) async fn run<T, F, Fut>(&self, f: F) -> Result<T, KeyOpError>
    where
        T: Send + 'static,
        F: FnOnce(deadpool_postgres::Object) -> Fut + Send + 'static,
        Fut: Future<Output = Result<T, KeyOpError>> + Send + 'static,
    {
        let pool = self.pool.clone();
        self.rt
            .spawn(async move {
                let work = async {
                    let client = pool.get().await.map_err(|e| KeyOpError::Store(format!("pool: {e}")))?;
                    f(client).await
                };
                tokio::time::timeout(CALL_TIMEOUT, work)
                    .await
                    .unwrap_or_else(|_| Err(KeyOpError::Store("PostgreSQL did not answer in time".into())))
            })
            .await
            .map_err(|e| KeyOpError::Store(format!("store task failed: {e}")))?
    }

    /// Run `f` with a pooled client (reads and write transactions alike), with store errors
    /// as `StoreError`.
    pub(super) async fn with_client<T, F, Fut>(&self, f: F) -> Result<T, StoreError>
    where
        T: Send + 'static,
        F: FnOnce(deadpool_postgres::Object) -> Fut + Send + 'static,
        Fut: Future<Output = Result<T, tokio_postgres::Error>> + Send + 'static,
    {
        self.run(move |c| async move { f(c).await.map_err(ko) }).await.map_err(|e| match e {
            KeyOpError::Store(m) => StoreError::Unavailable(m),
            other => StoreError::Unavailable(other.to_string()),
        })
    }
}
