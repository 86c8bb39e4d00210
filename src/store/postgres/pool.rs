//! The PostgreSQL connection pools and how a store call runs, bounded by the call timeout
//! (`identity.store.call_timeout_ms`, [`CALL_TIMEOUT`] by default): on a
//! dedicated store runtime (Pingora gives each service its own tokio runtime, and a pooled
//! connection's I/O task lives on the runtime that opened it), except the ledger writer's
//! batches, which run on its own thread with connections of its own (decision 151).

use std::future::Future;
use std::sync::{Arc, OnceLock};
use std::time::Duration;

use deadpool_postgres::{Hook, Manager, ManagerConfig, Pool, RecyclingMethod, Runtime};
use tokio_postgres::NoTls;

use crate::identity::lifecycle::KeyOpError;
use crate::store::{IdentityStore, StoreError};

pub use crate::store::settings::CALL_TIMEOUT;

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
    pub(in crate::store) pool: Pool,
    pub(in crate::store) rt: tokio::runtime::Handle,
    /// The ledger writer's own connections, used only on its thread, so their I/O runs there
    /// and a batch needs no other thread (decision 151). They connect on first use.
    pub(in crate::store) writer: Pool,
    /// Bound on each call, waiting for a pooled connection included.
    call_timeout: Duration,
}

pub(in crate::store) fn pg(e: tokio_postgres::Error) -> StoreError {
    if let Some(db) = e.as_db_error() {
        if db.code().code().starts_with("23") {
            return StoreError::Conflict(db.message().to_string());
        }
    }
    StoreError::Unavailable(e.to_string())
}

pub(in crate::store) fn ko(e: tokio_postgres::Error) -> KeyOpError {
    KeyOpError::from(pg(e))
}

/// Set on every pooled connection. The store's statements are prepared once per connection
/// and run thousands of times with array parameters (`= ANY($1)`, `unnest`). For those,
/// PostgreSQL's estimate of a custom plan, which sees the arrays' lengths, nearly always beats
/// the generic plan's, so it planned every execution again: about half of its CPU per
/// gateway request (decision 143).
///
/// A generic plan is made on the statistics of that moment and kept until they change. Autovacuum
/// analyses a new table once it has about 50 rows; a plan made on those statistics scans the
/// table, and goes on scanning it while it grows by thousands of rows a second, until the next
/// analysis a minute or more later. Every hold lookup then compared each array element with
/// every row (decision 147). Every statement of the store finds its rows by an index, so
/// sequential scans are off for its connections; a statement with no index to use still scans.
///
/// A server that refuses a setting (plan caching before PostgreSQL 12) keeps its own choice;
/// that is logged.
const PLANNING: [&str; 2] = ["SET plan_cache_mode = force_generic_plan", "SET enable_seqscan = off"];

/// The writer runs one batch at a time; a second connection stands by for a broken one.
const WRITER_CONNECTIONS: usize = 2;

/// A pool of at most `max` connections, each set up with [`PLANNING`]. Connects on first use,
/// and a connection's I/O task runs on the runtime that opened it.
fn new_pool(
    cfg: tokio_postgres::Config,
    max: usize,
    timeout: Duration,
    tls: Option<&Arc<pingora::tls::ClientConfig>>,
) -> Result<Pool, StoreError> {
    let recycling = ManagerConfig { recycling_method: RecyclingMethod::Fast };
    let mgr = match tls {
        Some(tls) => {
            Manager::from_config(cfg, tokio_postgres_rustls::MakeRustlsConnect::new((**tls).clone()), recycling)
        }
        None => Manager::from_config(cfg, NoTls, recycling),
    };
    Pool::builder(mgr)
        .post_create(Hook::async_fn(|client, _| {
            Box::pin(async move {
                for setting in PLANNING {
                    if let Err(e) = client.batch_execute(setting).await {
                        log::warn!(
                            "PostgreSQL refused `{setting}` ({e}); statements are planned as the server decides"
                        );
                    }
                }
                Ok(())
            })
        }))
        .max_size(max)
        .runtime(Runtime::Tokio1)
        .wait_timeout(Some(timeout))
        .create_timeout(Some(timeout))
        .recycle_timeout(Some(timeout))
        .build()
        .map_err(|e| StoreError::Unavailable(format!("pool: {e}")))
}

/// An error with its causes: "error performing TLS handshake" alone does not say that the
/// server's certificate was refused, its source does.
fn causes(e: &dyn std::error::Error) -> String {
    let mut text = e.to_string();
    let mut source = e.source();
    while let Some(s) = source {
        let more = s.to_string();
        if !text.contains(&more) {
            text = format!("{text}: {more}");
        }
        source = s.source();
    }
    text
}

impl PostgresStore {
    pub async fn connect(url: &str) -> Result<PostgresStore, StoreError> {
        Self::connect_with(url, CALL_TIMEOUT).await
    }

    /// Connect with each call bounded by `call_timeout`.
    pub async fn connect_with(url: &str, call_timeout: Duration) -> Result<PostgresStore, StoreError> {
        Self::connect_tls(url, call_timeout, None).await
    }

    /// Connect over TLS when `tls` is given (required then, whatever the URL's `sslmode`: a
    /// server that refuses TLS is not used in the clear), each call bounded by `call_timeout`.
    pub async fn connect_tls(
        url: &str,
        call_timeout: Duration,
        tls: Option<&crate::store::tls::StoreTls>,
    ) -> Result<PostgresStore, StoreError> {
        let mut cfg: tokio_postgres::Config =
            url.parse().map_err(|e| StoreError::Unavailable(format!("bad PostgreSQL URL: {e}")))?;
        let tls = match tls {
            Some(t) => {
                cfg.ssl_mode(tokio_postgres::config::SslMode::Require);
                Some(t.client_config().map_err(|e| StoreError::Unavailable(format!("TLS settings: {e}")))?)
            }
            None => None,
        };
        let rt = store_runtime()?.handle().clone();
        let writer = new_pool(cfg.clone(), WRITER_CONNECTIONS, call_timeout, tls.as_ref())?;
        let pool = rt
            .spawn(async move { new_pool(cfg, 16, call_timeout, tls.as_ref()) })
            .await
            .map_err(|e| StoreError::Unavailable(e.to_string()))??;
        let store = PostgresStore { pool, rt, writer, call_timeout };
        store.ping().await?;
        Ok(store)
    }

    /// Run `f` with a pooled client on the store runtime, bounded by the call timeout.
    pub(in crate::store) async fn run<T, F, Fut>(&self, f: F) -> Result<T, KeyOpError>
    where
        T: Send + 'static,
        F: FnOnce(deadpool_postgres::Object) -> Fut + Send + 'static,
        Fut: Future<Output = Result<T, KeyOpError>> + Send + 'static,
    {
        let (pool, call_timeout) = (self.pool.clone(), self.call_timeout);
        self.rt
            .spawn(async move {
                let work = async {
                    let client = pool.get().await.map_err(|e| KeyOpError::Store(format!("pool: {}", causes(&e))))?;
                    f(client).await
                };
                tokio::time::timeout(call_timeout, work)
                    .await
                    .unwrap_or_else(|_| Err(KeyOpError::Store("PostgreSQL did not answer in time".into())))
            })
            .await
            .map_err(|e| KeyOpError::Store(format!("store task failed: {e}")))?
    }

    /// Run `f` with one of the ledger writer's own clients, here on the writer's thread,
    /// bounded by the call timeout (decision 151).
    pub(in crate::store) async fn on_writer<T, F, Fut>(&self, f: F) -> Result<T, StoreError>
    where
        F: FnOnce(deadpool_postgres::Object) -> Fut,
        Fut: Future<Output = Result<T, tokio_postgres::Error>>,
    {
        let work = async {
            let client =
                self.writer.get().await.map_err(|e| StoreError::Unavailable(format!("pool: {}", causes(&e))))?;
            f(client).await.map_err(pg)
        };
        tokio::time::timeout(self.call_timeout, work)
            .await
            .unwrap_or_else(|_| Err(StoreError::Unavailable("PostgreSQL did not answer in time".into())))
    }

    /// Run `f` with a pooled client (reads and write transactions alike), with store errors
    /// as `StoreError`: a constraint the statement broke stays a `Conflict` (as on the ledger
    /// writer's thread), so a duplicate request id fails as one here too.
    pub(in crate::store) async fn with_client<T, F, Fut>(&self, f: F) -> Result<T, StoreError>
    where
        T: Send + 'static,
        F: FnOnce(deadpool_postgres::Object) -> Fut + Send + 'static,
        Fut: Future<Output = Result<T, tokio_postgres::Error>> + Send + 'static,
    {
        let outcome = self.run(move |c| async move { Ok(f(c).await.map_err(pg)) }).await;
        outcome.unwrap_or_else(|e| match e {
            KeyOpError::Store(m) => Err(StoreError::Unavailable(m)),
            other => Err(StoreError::Unavailable(other.to_string())),
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
            let show = || {
                store.with_client(|c| async move {
                    let mode = c.query_one("SHOW plan_cache_mode", &[]).await?.get::<_, String>(0);
                    let seqscan = c.query_one("SHOW enable_seqscan", &[]).await?.get::<_, String>(0);
                    Ok((mode, seqscan))
                })
            };
            let (a, b) = tokio::join!(show(), show());
            for settings in [a.unwrap(), b.unwrap()] {
                assert_eq!(settings, ("force_generic_plan".to_string(), "off".to_string()));
            }
        });
    }

    /// Decision 147: a generic plan made on a small table's statistics still finds rows by the
    /// key (without the setting it is a sequential scan, kept as the table grows).
    #[test]
    fn a_plan_made_on_a_small_tables_statistics_looks_rows_up_by_key() {
        let url =
            std::env::var("DATABASE_URL").unwrap_or_else(|_| "postgres://postgres@127.0.0.1:5432/postgres".into());
        let rt = tokio::runtime::Builder::new_current_thread().enable_all().build().unwrap();
        let plan = rt.block_on(async {
            let store = PostgresStore::connect(&url)
                .await
                .unwrap_or_else(|e| panic!("PostgreSQL at {url}: {e} (start it with scripts/services.sh)"));
            store
                .with_client(|c| async move {
                    // A temporary table is the connection's own: nothing else sees or plans it.
                    c.batch_execute(
                        "CREATE TEMP TABLE plan_probe (request_id TEXT PRIMARY KEY, state TEXT NOT NULL);
                         INSERT INTO plan_probe SELECT 'r' || g, 'open' FROM generate_series(1, 60) g;
                         ANALYZE plan_probe;
                         PREPARE plan_probe_q(TEXT[]) AS SELECT state FROM plan_probe WHERE request_id = ANY($1)",
                    )
                    .await?;
                    let rows = c.query("EXPLAIN EXECUTE plan_probe_q(ARRAY['a', 'b'])", &[]).await?;
                    c.batch_execute("DEALLOCATE plan_probe_q; DROP TABLE plan_probe").await?;
                    Ok(rows.iter().map(|r| r.get::<_, String>(0)).collect::<Vec<_>>().join("\n"))
                })
                .await
                .unwrap()
        });
        assert!(plan.contains("plan_probe_pkey") && !plan.contains("Seq Scan"), "plan:\n{plan}");
    }

    /// Decision 151: the ledger writer's batches run on its own connections, opened on its
    /// thread (none of the store's pool is needed for them).
    #[test]
    fn the_ledger_writer_runs_its_batches_on_its_own_connections() {
        use crate::store::IdentityStore;
        use crate::store::ledger::RequestLedger;
        let url =
            std::env::var("DATABASE_URL").unwrap_or_else(|_| "postgres://postgres@127.0.0.1:5432/postgres".into());
        let db = format!("tollgate_t_writer_{}_{}", std::process::id(), crate::runtime::clock::now_ms());
        let rt = tokio::runtime::Builder::new_current_thread().enable_all().build().unwrap();
        rt.block_on(async {
            let server = PostgresStore::connect(&url)
                .await
                .unwrap_or_else(|e| panic!("PostgreSQL at {url}: {e} (start it with scripts/services.sh)"));
            let create = format!("CREATE DATABASE {db}");
            server.with_client(move |c| async move { c.batch_execute(&create).await }).await.unwrap();
            let base = url.rsplit_once('/').map_or(url.as_str(), |(b, _)| b);
            let store = std::sync::Arc::new(PostgresStore::connect(&format!("{base}/{db}")).await.unwrap());
            store.migrate().await.unwrap();
            assert_eq!(store.writer.status().size, 0, "nothing opened the writer's connections yet");
            let ledger = crate::store::ledger::batch::BatchedLedger::new(store.clone()).unwrap();
            assert!(!ledger.release_hold("no-such-request", crate::runtime::clock::now_ms()).await.unwrap());
            assert_eq!(store.writer.status().size, 1, "the batch ran on the writer's own connection");
        });
    }
}
