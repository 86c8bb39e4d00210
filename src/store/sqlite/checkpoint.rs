//! WAL checkpoints off the write path (decision 130). SQLite's automatic checkpoint runs
//! inside the commit that crosses 1,000 WAL pages: that commit copies the pages into the
//! database file and fsyncs it, and every hold queued behind it waits (the embedded store's
//! p99). Instead the store's connection never checkpoints, and a thread of its own with its
//! own connection runs a PASSIVE checkpoint every second: in WAL mode a checkpoint does not
//! block writers, so commits go on while it copies and syncs.
//!
//! Under sustained writes that checkpoint never catches up: commits land while it copies,
//! and SQLite only starts the WAL over once every frame in it is in the database file. The
//! WAL then grew without bound (565 MB in ten seconds at saturation, decision 141). So when
//! the thread finds more than [`LAG_FRAMES`] frames in the WAL, it asks the store's own
//! connection to finish the job after its next write ([`Lag::finish`]): the writer is the
//! only one writing, so that checkpoint copies the few frames since the thread's and
//! completes, and the next commit starts the WAL over.
//!
//! When more than one process writes the file (two instances on one SQLite file, or the old
//! and the new process of an upgrade), no writer is ever alone and that checkpoint cannot
//! complete either. So past [`HARD_FRAMES`] the thread runs a RESTART checkpoint, which waits
//! (up to its busy timeout) for the writer of the moment to commit, makes the others wait
//! while it copies what is left, and starts the WAL over itself: a pause for the writers
//! (the two-instance ledger load test's p99 went from 32 to 50 ms) instead of a WAL that
//! grows by gigabytes (3.3 GB in that 60-second test).

use std::path::Path;
use std::sync::atomic::{AtomicBool, Ordering};
use std::sync::{Arc, Mutex, Weak};
use std::time::Duration;

use rusqlite::Connection;

const EVERY: Duration = Duration::from_secs(1);
/// Frames in the WAL that make the writer finish a checkpoint (SQLite's own automatic
/// checkpoint threshold: about 1 MB of the 1 KiB pages of a file made since decision 184,
/// 4 MB of 4 KiB pages).
const LAG_FRAMES: i64 = 1_000;
/// Frames in the WAL past which the thread starts it over even if writers must wait for it
/// (about 32 MB of 1 KiB pages, 128 MB of 4 KiB pages).
const HARD_FRAMES: i64 = 32 * LAG_FRAMES;
/// A WAL left larger than this by a burst is truncated to it when SQLite starts it over.
const WAL_SIZE_LIMIT: i64 = 64 << 20;

/// The checkpoint thread's bound, and its request that the store's connection finish a
/// checkpoint (set when it could not catch up with the writes; taken after a write).
pub(in crate::store) struct Lag {
    behind: AtomicBool,
    /// Frames past which the thread starts the WAL over itself ([`HARD_FRAMES`]).
    restart_past: i64,
}

impl Default for Lag {
    fn default() -> Lag {
        Lag { behind: AtomicBool::new(false), restart_past: HARD_FRAMES }
    }
}

impl Lag {
    /// If the thread fell behind, checkpoint on `c` (the connection that writes, after its
    /// transaction): what the thread copied is not copied again, so this copies the frames
    /// written since, and syncs. A busy checkpoint (another process's) is asked for again.
    pub(in crate::store) fn finish(&self, c: &Connection) {
        if !self.behind.load(Ordering::Relaxed) || !self.behind.swap(false, Ordering::Relaxed) {
            return;
        }
        match checkpoint(c, "PASSIVE") {
            Ok(p) if p.busy => self.behind.store(true, Ordering::Relaxed),
            Ok(p) => log::debug!("SQLite checkpoint finished by the writer: {} of {} frames", p.done, p.log),
            Err(e) => log::warn!("SQLite checkpoint on the store's connection failed: {e}"),
        }
    }
}

/// What `PRAGMA wal_checkpoint` reports.
struct Progress {
    busy: bool,
    /// Frames in the WAL.
    log: i64,
    /// Of those, frames now in the database file.
    done: i64,
}

/// `mode`: PASSIVE (copy what no reader needs, wait for nobody) or RESTART (wait for the
/// writers, copy everything, start the WAL over).
fn checkpoint(c: &Connection, mode: &str) -> rusqlite::Result<Progress> {
    c.query_row(&format!("PRAGMA wal_checkpoint({mode})"), [], |r| {
        Ok(Progress { busy: r.get::<_, i64>(0)? != 0, log: r.get(1)?, done: r.get(2)? })
    })
}

/// Turn the automatic checkpoint off on `main` and start the checkpointer for `path`; it
/// stops when the store (the last strong handle of `store`) is dropped.
pub(in crate::store) fn start(
    path: &Path,
    main: &Connection,
    store: Weak<Mutex<Connection>>,
    lag: Arc<Lag>,
) -> rusqlite::Result<()> {
    let checkpointer = Connection::open(path)?;
    checkpointer.busy_timeout(Duration::from_secs(5))?;
    // The RESTART runs on this connection: it truncates the WAL it starts over, too.
    checkpointer.pragma_update(None, "journal_size_limit", WAL_SIZE_LIMIT)?;
    main.pragma_update(None, "wal_autocheckpoint", 0)?;
    main.pragma_update(None, "journal_size_limit", WAL_SIZE_LIMIT)?;
    let spawned = std::thread::Builder::new().name("sqlite-checkpoint".into()).spawn(move || {
        while store.strong_count() > 0 {
            std::thread::sleep(EVERY);
            match checkpoint(&checkpointer, "PASSIVE") {
                // `log` is the WAL's length when this checkpoint began (writes go on while it
                // copies, so `done` reaching it says nothing about the WAL now): a WAL this
                // long since it last started over means the writes outrun the thread.
                Ok(p) if p.log > lag.restart_past => match checkpoint(&checkpointer, "RESTART") {
                    Ok(r) if !r.busy => log::debug!("SQLite WAL of {} frames started over", p.log),
                    Ok(_) => log::warn!("SQLite WAL of {} frames: writers kept it busy past the timeout", p.log),
                    Err(e) => log::warn!("SQLite checkpoint (RESTART) failed: {e}"),
                },
                Ok(p) if p.log > LAG_FRAMES => lag.behind.store(true, Ordering::Relaxed),
                Ok(_) => {}
                Err(e) => log::warn!("SQLite checkpoint failed: {e}"),
            }
        }
    });
    if let Err(e) = spawned {
        // Without the thread, checkpoints stay automatic.
        log::warn!("SQLite checkpoint thread: {e}; checkpoints stay in the commits");
        main.pragma_update(None, "wal_autocheckpoint", 1000)?;
    }
    Ok(())
}

#[cfg(test)]
mod tests {
    use crate::store::sqlite::SqliteStore;
    use std::io::Read;
    use std::sync::Arc;
    use std::sync::atomic::{AtomicU64, Ordering};

    /// Salt-1 of the WAL header: SQLite changes it each time it starts the WAL over.
    fn wal_salt(db: &std::path::Path) -> [u8; 4] {
        let mut head = [0u8; 20];
        let read = std::fs::File::open(db.with_extension("db-wal")).and_then(|mut f| f.read_exact(&mut head));
        if read.is_err() {
            return [0; 4];
        }
        [head[16], head[17], head[18], head[19]]
    }

    /// Commit one page-sized row at a time through each of `stores`, back to back, until
    /// the WAL has been started over or `cap` commits were made; the commits made, and
    /// whether it was started over.
    async fn write_until_the_wal_starts_over(
        db: &std::path::Path,
        stores: &[Arc<SqliteStore>],
        cap: u64,
    ) -> (u64, bool) {
        let first = wal_salt(db);
        let commits = Arc::new(AtomicU64::new(0));
        let tasks: Vec<_> = stores
            .iter()
            .map(|s| {
                let (s, commits, db) = (s.clone(), commits.clone(), db.to_path_buf());
                tokio::spawn(async move {
                    loop {
                        // 64 transactions per call, so the commits follow each other closely.
                        s.with_conn(|c| {
                            for _ in 0..64 {
                                c.execute("INSERT INTO t (x) VALUES (randomblob(3000))", [])?;
                            }
                            Ok(())
                        })
                        .await
                        .unwrap();
                        let n = commits.fetch_add(64, Ordering::Relaxed) + 64;
                        if n >= cap || (n % 4096 == 0 && wal_salt(&db) != first) {
                            return;
                        }
                    }
                })
            })
            .collect();
        for t in tasks {
            t.await.unwrap();
        }
        (commits.load(Ordering::Relaxed), wal_salt(db) != first)
    }

    async fn store_with_table(db: &std::path::Path, lag: super::Lag) -> Arc<SqliteStore> {
        let s = Arc::new(SqliteStore::open_with(db, lag).unwrap());
        s.with_conn(|c| c.execute_batch("CREATE TABLE IF NOT EXISTS t (x BLOB)")).await.unwrap();
        s
    }

    #[tokio::test(flavor = "multi_thread", worker_threads = 2)]
    async fn sustained_writes_start_the_wal_over_instead_of_growing_it() {
        let dir = std::env::temp_dir().join(format!("tollgate-wal-{}", uuid::Uuid::new_v4().simple()));
        let db = dir.join("w.db");
        // The thread's own RESTART is off: this is the writer finishing the checkpoint.
        let never = super::Lag { restart_past: i64::MAX, ..super::Lag::default() };
        let store = store_with_table(&db, never).await;
        // Back-to-back writes: the thread's PASSIVE checkpoint alone never catches up with
        // them, so without the writer finishing it the WAL grows to the cap.
        let (commits, restarted) =
            write_until_the_wal_starts_over(&db, std::slice::from_ref(&store), 100 * super::LAG_FRAMES as u64).await;
        assert!(restarted, "the WAL was never started over ({commits} commits)");
        let rows: i64 = store.with_conn(|c| c.query_row("SELECT count(*) FROM t", [], |r| r.get(0))).await.unwrap();
        assert_eq!(rows as u64, commits, "every committed row is still there");
        let _ = std::fs::remove_dir_all(&dir);
    }

    /// Two stores on one file, as two instances (or an upgrade's old and new process) are:
    /// neither writer is ever alone, and the WAL is still started over.
    #[tokio::test(flavor = "multi_thread", worker_threads = 2)]
    async fn two_writers_on_one_file_still_start_the_wal_over() {
        let dir = std::env::temp_dir().join(format!("tollgate-wal-{}", uuid::Uuid::new_v4().simple()));
        let db = dir.join("w.db");
        let (a, b) =
            (store_with_table(&db, super::Lag::default()).await, store_with_table(&db, super::Lag::default()).await);
        let (commits, restarted) =
            write_until_the_wal_starts_over(&db, &[a, b.clone()], 5 * super::HARD_FRAMES as u64).await;
        assert!(restarted, "the WAL was never started over ({commits} commits)");
        let rows: i64 = b.with_conn(|c| c.query_row("SELECT count(*) FROM t", [], |r| r.get(0))).await.unwrap();
        assert_eq!(rows as u64, commits, "every committed row is still there");
        let _ = std::fs::remove_dir_all(&dir);
    }
}
