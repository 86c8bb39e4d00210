//! Shared by the store benches.

/// A database of its own (`name`, recreated) on the server of `DATABASE_URL`; `None` when the
/// server is not reachable (the bench then says which rows it did not measure).
pub fn bench_database(rt: &tokio::runtime::Runtime, name: &str) -> Option<String> {
    let url = std::env::var("DATABASE_URL").unwrap_or_else(|_| "postgres://postgres@127.0.0.1:5432/postgres".into());
    let (base, _) = url.rsplit_once('/')?;
    rt.block_on(async {
        let (client, conn) = tokio_postgres::connect(&url, tokio_postgres::NoTls).await.ok()?;
        tokio::spawn(conn);
        client.batch_execute(&format!("DROP DATABASE IF EXISTS {name} WITH (FORCE)")).await.ok()?;
        client.batch_execute(&format!("CREATE DATABASE {name}")).await.ok()?;
        Some(format!("{base}/{name}"))
    })
}
