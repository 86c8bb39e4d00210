//! PostgreSQL for tests: `DATABASE_URL` (default the local server), one fresh database per
//! test so runs never see each other's rows. Never skipped: an unreachable server fails the
//! test with a message saying how to start it.
#![allow(dead_code, clippy::unwrap_used, clippy::expect_used, clippy::panic)]

pub fn database_url() -> String {
    std::env::var("DATABASE_URL").unwrap_or_else(|_| "postgres://postgres@127.0.0.1:5432/postgres".into())
}

/// `url` with its database name replaced.
fn with_db(url: &str, db: &str) -> String {
    let (base, _) = url.rsplit_once('/').expect("DATABASE_URL ends in /<database>");
    let query = url.split_once('?').map(|(_, q)| format!("?{q}")).unwrap_or_default();
    format!("{base}/{db}{query}")
}

/// Create an empty database and return its URL.
pub async fn fresh_database() -> String {
    use std::sync::atomic::{AtomicUsize, Ordering};
    static N: AtomicUsize = AtomicUsize::new(0);
    let url = database_url();
    let (client, conn) = tokio_postgres::connect(&url, tokio_postgres::NoTls).await.unwrap_or_else(|e| {
        panic!("PostgreSQL is not reachable at {url} ({e}); start it with scripts/services.sh or set DATABASE_URL")
    });
    tokio::spawn(conn);
    let name = format!("tollgate_t_{}_{}", std::process::id(), N.fetch_add(1, Ordering::SeqCst));
    client.batch_execute(&format!("DROP DATABASE IF EXISTS {name}")).await.unwrap();
    client.batch_execute(&format!("CREATE DATABASE {name}")).await.unwrap();
    with_db(&url, &name)
}
