//! The PostgreSQL connection pool and the one way every store call runs: on a dedicated
//! store runtime (Pingora gives each service its own tokio runtime, and a pooled connection's
//! I/O task lives on the runtime that opened it), bounded by `CALL_TIMEOUT`.

use std::future::Future;
use std::sync::OnceLock;
use std::time::Duration;

use deadpool_postgres::{Hook, Manager, ManagerConfig, Pool, RecyclingMethod, Runtime};
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

/// Set on every pooled connection. The store's statements are prepared once per connection
/// and run thousands of times with array parameters (`= ANY($1)`, `unnest`). For those,
/// PostgreSQL's estimate of a custom plan, which sees the arrays' lengths, nearly always beats
/// the generic plan's, so it planned every execution again: about half of its CPU per
/// gateway request (decision 143). A server that refuses the setting (before PostgreSQL 12)
/// keeps its own choice; that is logged.
const GENERIC_PLANS: &str = "SET plan_cache_mode = force_generic_plan";

impl PostgresStore {
    pub async fn connect(url: &str) -> Result<PostgresStore, StoreError> {
        let cfg: tokio_postgres::Config =
            url.parse().map_err(|e| StoreError::Unavailable(format!("bad PostgreSQL URL: {e}")))?;
        let rt = store_runtime()?.handle().clone();
        let pool = rt
            .spawn(async move {
                let mgr = Manager::from_config(cfg, NoTls, ManagerConfig { recycling_method: RecyclingMethod::Fast });
                Pool::builder(mgr)
                    .post_create(Hook::async_fn(|client, _| {
                        Box::pin(async move {
                            if let Err(e) = client.batch_execute(GENERIC_PLANS).await {
                                log::warn!("PostgreSQL refused `{GENERIC_PLANS}` ({e}); statements are planned as the server decides");
                            }
                            Ok(())
                        })
                    }))
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

#[cfg(test)]
mod tests {
    use super::*;

    /// Against the local server (`DATABASE_URL`), like `tests/ledger_store.rs`: never skipped.
    #[test]
    fn every_pooled_connection_plans_generically() {
        let url =
            std::env::var("DATABASE_URL").unwrap_or_else(|_| "postgres://postgres@127.0.0.1:5432/postgres".into());
        let rt = tokio::runtime::Builder::new_current_thread().enable_all().build().unwrap();
        rt.block_on(async {
            let store = PostgresStore::connect(&url)
                .await
                .unwrap_or_else(|e| panic!("PostgreSQL at {url}: {e} (start it with scripts/services.sh)"));
            // Two connections at once, so the second is a new one too.
            let show = || store.with_client(|c| async move { c.query_one("SHOW plan_cache_mode", &[]).await });
            let (a, b) = tokio::join!(show(), show());
            for row in [a.unwrap(), b.unwrap()] {
                assert_eq!(row.get::<_, String>(0), "force_generic_plan");
            }
        });
    }
}
