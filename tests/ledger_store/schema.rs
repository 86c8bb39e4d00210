//! The stored schema: a SQLite database from before migration 5, and the PostgreSQL batch lock's plan.

use super::*;

/// Decision 133 on a store that was in use before it: a hold placed by the old code (with its
/// `hold` entry) is released with the matching `hold_release` after migration 5, a new hold
/// writes no entry, and the stored balance equals the derived one at every step.
#[tokio::test]
async fn a_hold_placed_before_migration_5_is_released_with_its_entry() {
    let dir = std::env::temp_dir().join(format!("tollgate-ledger-{}", uuid::Uuid::new_v4().simple()));
    std::fs::create_dir_all(&dir).unwrap();
    let file = dir.join("l.db");
    {
        // The database as the previous release left it: migrations 1-4, a $1 balance with an
        // open 30-cent hold that wrote its entry.
        let c = rusqlite::Connection::open(&file).unwrap();
        c.execute_batch("CREATE TABLE schema_migrations (version INTEGER PRIMARY KEY, name TEXT NOT NULL, applied_at INTEGER NOT NULL)")
            .unwrap();
        for (version, name, sql) in &tollgate::store::SQLITE_MIGRATIONS[..4] {
            c.execute_batch(sql).unwrap();
            c.execute("INSERT INTO schema_migrations VALUES (?1, ?2, 0)", rusqlite::params![version, name]).unwrap();
        }
        c.execute_batch(
            "INSERT INTO workspaces (id, name, rate_tier, created_at, balance_cents, held_cents) VALUES ('w', 'w', 'free', 0, 70, 30);
             INSERT INTO ledger_entries (workspace_id, kind, source, amount_cents, created_at) VALUES ('w', 'topup', 'grant', 100, 0);
             INSERT INTO ledger_entries (workspace_id, kind, amount_cents, request_id, created_at) VALUES ('w', 'hold', -30, 'old', 1);
             INSERT INTO holds (request_id, workspace_id, amount_cents, state, expires_at, created_at) VALUES ('old', 'w', 30, 'open', 99999999999999, 1);",
        )
        .unwrap();
    }
    let s = tollgate::store::open_stores(&StoreConfig::Sqlite { path: file }).await.unwrap();
    s.identity.migrate().await.unwrap();
    let l = s.ledger.clone();
    let consistent = |b: i64| {
        let l = l.clone();
        async move {
            assert_eq!(l.balance("w").await.unwrap().unwrap().balance_cents, b);
            assert_eq!(l.derived_balance("w").await.unwrap(), b, "stored balance == derived balance");
        }
    };
    consistent(70).await;
    assert!(l.release_hold("old", now_ms()).await.unwrap());
    consistent(100).await;
    assert_eq!(
        l.place_hold("new", "w", None, 40, now_ms() + 60_000, now_ms()).await.unwrap(),
        HoldOutcome::Placed { balance_cents: 60 }
    );
    consistent(60).await;
    l.settle(&settlement("w", "new", 5_000_000)).await.unwrap();
    consistent(95).await;
    let kinds: Vec<(String, Option<String>)> =
        l.entries("w", 100).await.unwrap().into_iter().map(|e| (e.kind, e.request_id)).collect();
    let of = |rid: &str| {
        kinds.iter().filter(|(_, r)| r.as_deref() == Some(rid)).map(|(k, _)| k.as_str()).collect::<Vec<_>>()
    };
    let mut old = of("old");
    old.sort_unstable();
    assert_eq!(old, ["hold", "hold_release"], "the old hold keeps its pair of entries");
    assert_eq!(of("new"), ["settlement"], "the new hold wrote none");
    let _ = std::fs::remove_dir_all(&dir);
}

/// A ledger batch locks its workspaces through the primary key, whatever the number of
/// workspaces: the plan on a store of 20,000 must look them up (`Index Cond`), not filter the
/// table (as `id = ANY($1) OR id IN (SELECT ...)` did).
#[tokio::test]
async fn a_postgres_batch_finds_its_workspaces_by_key_not_by_scanning_them() {
    let url = pg::fresh_database().await;
    let s = tollgate::store::open_stores(&pg_config(url.clone())).await.unwrap();
    s.identity.migrate().await.unwrap();
    let (c, conn) = tokio_postgres::connect(&url, tokio_postgres::NoTls).await.unwrap();
    tokio::spawn(conn);
    c.batch_execute(
        "INSERT INTO workspaces (id, name, rate_tier, created_at) SELECT 'ws' || g, 'w', 'free', 0 FROM generate_series(1, 20000) g;
         INSERT INTO holds (request_id, workspace_id, amount_cents, state, expires_at, created_at)
             SELECT 'r' || g, 'ws' || g, 1, 'settled', 0, 0 FROM generate_series(1, 20000) g;
         ANALYZE;",
    )
    .await
    .unwrap();
    c.batch_execute(&format!("PREPARE lock_batch(TEXT[], TEXT[]) AS {}", tollgate::store::postgres_batch_lock_sql()))
        .await
        .unwrap();
    let plan: String = c
        .query("EXPLAIN EXECUTE lock_batch(ARRAY['ws5'], ARRAY['r7', 'r9'])", &[])
        .await
        .unwrap()
        .iter()
        .map(|r| r.get::<_, String>(0))
        .collect::<Vec<_>>()
        .join("\n");
    assert!(plan.contains("Index Cond: (id = ANY"), "{plan}");
    assert!(!plan.contains("Seq Scan on workspaces") && !plan.contains("Filter: ((id = ANY"), "{plan}");
    let locked = c.query("EXECUTE lock_batch(ARRAY['ws5'], ARRAY['r7', 'r9'])", &[]).await.unwrap();
    let ids: Vec<String> = locked.iter().map(|r| r.get(0)).collect();
    assert_eq!(ids, ["ws5", "ws7", "ws9"], "the named workspace and those of the hold rows, in id order");
}
