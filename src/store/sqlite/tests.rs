use super::SqliteStore;

async fn page_size(s: &SqliteStore) -> i64 {
    s.with_conn(|c| c.query_row("PRAGMA page_size", [], |r| r.get(0))).await.unwrap()
}

/// Decision 184: a new file gets 1 KiB pages; a file made before keeps its own size.
#[tokio::test]
async fn a_new_file_has_small_pages_and_an_old_one_keeps_its_own() {
    let dir = std::env::temp_dir().join(format!("tollgate-pages-{}", uuid::Uuid::new_v4().simple()));
    let new = SqliteStore::open(&dir.join("new.db")).unwrap();
    new.with_conn(|c| c.execute_batch("CREATE TABLE t (x INTEGER)")).await.unwrap();
    assert_eq!(page_size(&new).await, 1024);

    let old_path = dir.join("old.db");
    let old = rusqlite::Connection::open(&old_path).unwrap();
    old.execute_batch("PRAGMA page_size = 4096; CREATE TABLE t (x INTEGER); INSERT INTO t VALUES (7);").unwrap();
    drop(old);
    let old = SqliteStore::open(&old_path).unwrap();
    assert_eq!(page_size(&old).await, 4096);
    let x: i64 = old.with_conn(|c| c.query_row("SELECT x FROM t", [], |r| r.get(0))).await.unwrap();
    assert_eq!(x, 7, "the old file still reads");
    let _ = std::fs::remove_dir_all(&dir);
}
