//! WAL checkpoints off the write path (decision 130). SQLite's automatic checkpoint runs
//! inside the commit that crosses 1,000 WAL pages: that commit copies the pages into the
//! database file and fsyncs it, and every hold queued behind it waits (the embedded store's
//! p99). Instead the store's connection never checkpoints, and a thread of its own with its
//! own connection runs a PASSIVE checkpoint every second: in WAL mode a checkpoint does not
//! block writers, so commits go on while it copies and syncs.

use std::path::Path;
use std::sync::{Mutex, Weak};
use std::time::Duration;

use rusqlite::Connection;

const EVERY: Duration = Duration::from_secs(1);

/// Turn the automatic checkpoint off on `main` and start the checkpointer for `path`; it
/// stops when the store (the last strong handle of `store`) is dropped.
pub(super) fn start(path: &Path, main: &Connection, store: Weak<Mutex<Connection>>) -> rusqlite::Result<()> {
    let checkpointer = Connection::open(path)?;
    checkpointer.busy_timeout(Duration::from_secs(5))?;
    main.pragma_update(None, "wal_autocheckpoint", 0)?;
    let spawned = std::thread::Builder::new().name("sqlite-checkpoint".into()).spawn(move || {
        while store.strong_count() > 0 {
            std::thread::sleep(EVERY);
            if let Err(e) = checkpointer.query_row("PRAGMA wal_checkpoint(PASSIVE)", [], |_| Ok(())) {
                log::warn!("SQLite checkpoint failed: {e}");
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
