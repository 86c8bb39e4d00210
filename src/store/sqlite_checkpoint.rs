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

use std::path::Path;
use std::sync::atomic::{AtomicBool, Ordering};
use std::sync::{Arc, Mutex, Weak};
use std::time::Duration;

use rusqlite::Connection;

const EVERY: Duration = Duration::from_secs(1);
/// Frames in the WAL that make the writer finish a checkpoint (SQLite's own automatic
/// checkpoint threshold: about 4 MB of pages).
pub(super) const LAG_FRAMES: i64 = 1_000;
/// A WAL left larger than this by a burst is truncated to it when SQLite starts it over.
pub(super) const WAL_SIZE_LIMIT: i64 = 64 << 20;

/// Set by the checkpoint thread when it could not catch up with the writes; taken by the
/// store's connection after a write.
#[derive(Default)]
pub(super) struct Lag(AtomicBool);

impl Lag {
    /// If the thread fell behind, checkpoint on `c` (the connection that writes, after its
    /// transaction): what the thread copied is not copied again, so this copies the frames
    /// written since, and syncs. A busy checkpoint (another process's) is asked for again.
    pub(super) fn finish(&self, c: &Connection) {
        if !self.0.load(Ordering::Relaxed) || !self.0.swap(false, Ordering::Relaxed) {
            return;
        }
        match passive_checkpoint(c) {
            Ok(p) if p.busy => self.0.store(true, Ordering::Relaxed),
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

fn passive_checkpoint(c: &Connection) -> rusqlite::Result<Progress> {
    c.query_row("PRAGMA wal_checkpoint(PASSIVE)", [], |r| {
        Ok(Progress { busy: r.get::<_, i64>(0)? != 0, log: r.get(1)?, done: r.get(2)? })
    })
}

/// Turn the automatic checkpoint off on `main` and start the checkpointer for `path`; it
/// stops when the store (the last strong handle of `store`) is dropped.
pub(super) fn start(
    path: &Path,
    main: &Connection,
    store: Weak<Mutex<Connection>>,
    lag: Arc<Lag>,
) -> rusqlite::Result<()> {
    let checkpointer = Connection::open(path)?;
    checkpointer.busy_timeout(Duration::from_secs(5))?;
    main.pragma_update(None, "wal_autocheckpoint", 0)?;
    main.pragma_update(None, "journal_size_limit", WAL_SIZE_LIMIT)?;
    let spawned = std::thread::Builder::new().name("sqlite-checkpoint".into()).spawn(move || {
        while store.strong_count() > 0 {
            std::thread::sleep(EVERY);
            match passive_checkpoint(&checkpointer) {
                // `log` is the WAL's length when this checkpoint began (writes go on while it
                // copies, so `done` reaching it says nothing about the WAL now): a WAL this
                // long since it last started over means the writes outrun the thread.
                Ok(p) if p.log > LAG_FRAMES => lag.0.store(true, Ordering::Relaxed),
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
    use super::super::sqlite::SqliteStore;
    use std::time::Instant;

    /// Salt-1 of the WAL header: SQLite changes it each time it starts the WAL over.
    fn wal_salt(db: &std::path::Path) -> [u8; 4] {
        let wal = std::fs::read(db.with_extension("db-wal")).unwrap_or_default();
        wal.get(16..20).map_or([0; 4], |s| [s[0], s[1], s[2], s[3]])
    }

    #[tokio::test(flavor = "multi_thread", worker_threads = 2)]
    async fn sustained_writes_start_the_wal_over_instead_of_growing_it() {
        let dir = std::env::temp_dir().join(format!("tollgate-wal-{}", uuid::Uuid::new_v4().simple()));
        let db = dir.join("w.db");
        let store = SqliteStore::open(&db).unwrap();
        store.with_conn(|c| c.execute_batch("CREATE TABLE t (x BLOB)")).await.unwrap();
        let first = wal_salt(&db);
        // Writes back to back for longer than two of the checkpoint thread's rounds: its
        // PASSIVE checkpoint alone never catches up with them.
        let (started, mut commits) = (Instant::now(), 0u64);
        while started.elapsed() < super::EVERY * 5 / 2 {
            store
                .with_conn(|c| c.execute("INSERT INTO t (x) VALUES (randomblob(3000))", []).map(|_| ()))
                .await
                .unwrap();
            commits += 1;
        }
        assert!(commits > 2 * super::LAG_FRAMES as u64, "too few writes to outrun the checkpoint: {commits}");
        assert_ne!(wal_salt(&db), first, "the WAL was never started over ({commits} commits)");
        let rows: i64 = store.with_conn(|c| c.query_row("SELECT count(*) FROM t", [], |r| r.get(0))).await.unwrap();
        assert_eq!(rows as u64, commits, "every committed row is still there");
        let _ = std::fs::remove_dir_all(&dir);
    }
}
