//! A batch's rows in a few statements instead of one per row: multi-row `INSERT ... VALUES`
//! and `UPDATE ... WHERE request_id IN (...)`, in chunks of 32, 8 or 1 rows. A statement's
//! setup (binding, opening its table and index cursors, resetting) is then paid per chunk, and
//! each kind of statement has at most three texts in the connection's statement cache whatever
//! the batch size.

use rusqlite::types::{ToSqlOutput, Value};

const CHUNKS: [usize; 3] = [32, 8, 1];

/// The texts of one statement for each chunk size.
pub struct Chunked {
    sql: [String; 3],
}

impl Chunked {
    /// `INSERT INTO t (a, b) VALUES (?, ?), (?, ?), ...` for `head` = `INSERT INTO t (a, b)`.
    pub fn insert(head: &str, columns: usize) -> Self {
        let row = format!("({})", vec!["?"; columns].join(", "));
        Chunked { sql: CHUNKS.map(|n| format!("{head} VALUES {}", vec![row.as_str(); n].join(", "))) }
    }

    /// `{head} (?, ?, ...)`, e.g. `UPDATE t SET s = ? WHERE id IN`: one `?` per row after the
    /// head's own parameters.
    pub fn in_list(head: &str) -> Self {
        Chunked { sql: CHUNKS.map(|n| format!("{head} ({})", vec!["?"; n].join(", "))) }
    }

    /// Run the statement over `rows`, chunk by chunk, in order: `lead` binds the head's own
    /// parameters (none for an insert), `values` each row's.
    pub fn run<'r, T, I>(
        &self,
        tx: &rusqlite::Connection,
        lead: &[ToSqlOutput<'r>],
        rows: &'r [T],
        values: impl Fn(&'r T) -> I,
    ) -> rusqlite::Result<()>
    where
        I: IntoIterator<Item = ToSqlOutput<'r>>,
    {
        let mut rest = rows;
        while !rest.is_empty() {
            // The largest chunk that fits; the last size is 1, so one always does.
            let i = CHUNKS.iter().position(|&n| rest.len() >= n).unwrap_or(CHUNKS.len() - 1);
            let (chunk, tail) = rest.split_at(CHUNKS[i]);
            let mut st = tx.prepare_cached(&self.sql[i])?;
            let row_values: Vec<ToSqlOutput<'r>> = chunk.iter().flat_map(&values).collect();
            st.execute(rusqlite::params_from_iter(lead.iter().chain(row_values.iter())))?;
            // A multi-row statement steps through its rows without reaching the progress
            // handler's check, so the ledger writer may give way here (decision 194).
            tollgate_threads::give_way();
            rest = tail;
        }
        Ok(())
    }
}

/// Run `f` in a `BEGIN IMMEDIATE` transaction, committed when it succeeds and rolled back
/// when it fails or panics, as rusqlite's `Transaction` does. Both statements come from the
/// statement cache: `Transaction` parses `BEGIN` and `COMMIT` again each time (callgrind:
/// 3,063 instructions a request fewer on the ledger's path, one batch a request at c=1).
pub fn immediate<T>(
    c: &rusqlite::Connection,
    f: impl FnOnce(&rusqlite::Connection) -> rusqlite::Result<T>,
) -> rusqlite::Result<T> {
    if !c.is_autocommit() {
        // Never expected (the guard below ends every transaction this opens): say so, and do
        // not let a stray transaction swallow this one's writes.
        log::warn!("sqlite: a transaction was left open; rolling it back");
        rollback_open(c);
    }
    c.prepare_cached("BEGIN IMMEDIATE")?.execute([])?;
    let open = OpenTransaction(c);
    let done = f(c).and_then(|v| c.prepare_cached("COMMIT")?.execute([]).map(|_| v));
    drop(open); // after a commit: nothing to do; after an error: the rollback
    done
}

/// Rolls back, when dropped, a transaction still open: after an error, and while a panic in
/// the transaction's work unwinds (the connection is shared with the identity store, whose
/// writes would otherwise join a transaction nobody ends).
struct OpenTransaction<'c>(&'c rusqlite::Connection);

impl Drop for OpenTransaction<'_> {
    fn drop(&mut self) {
        rollback_open(self.0);
    }
}

fn rollback_open(c: &rusqlite::Connection) {
    if !c.is_autocommit() {
        // The caller's error (or panic) is what matters; a failed rollback is only logged.
        if let Err(e) = c.prepare_cached("ROLLBACK").and_then(|mut st| st.execute([])) {
            log::warn!("sqlite: rollback failed: {e}");
        }
    }
}

/// A text column's value, borrowed.
pub fn text(s: &str) -> ToSqlOutput<'_> {
    ToSqlOutput::from(s)
}

/// A nullable text column's value.
pub fn opt_text(s: &Option<String>) -> ToSqlOutput<'_> {
    s.as_deref().map_or(ToSqlOutput::Owned(Value::Null), ToSqlOutput::from)
}

pub fn int(v: i64) -> ToSqlOutput<'static> {
    ToSqlOutput::Owned(Value::Integer(v))
}

pub fn opt_int(v: Option<i64>) -> ToSqlOutput<'static> {
    ToSqlOutput::Owned(v.map_or(Value::Null, Value::Integer))
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn chunks_cover_every_row_in_order() {
        let mut c = rusqlite::Connection::open_in_memory().unwrap();
        c.execute_batch("CREATE TABLE t (n INTEGER, s TEXT, o TEXT)").unwrap();
        let insert = Chunked::insert("INSERT INTO t (n, s, o)", 3);
        let rows: Vec<(i64, String, Option<String>)> =
            (0..77).map(|n| (n, format!("r{n}"), (n % 2 == 0).then(|| "even".to_string()))).collect();
        let tx = c.transaction().unwrap();
        insert.run(&tx, &[], &rows, |(n, s, o)| [int(*n), text(s), opt_text(o)]).unwrap();
        // 77 rows = 2 x 32 + 1 x 8 + 5 x 1: every chunk size used.
        let update = Chunked::in_list("UPDATE t SET o = ? WHERE s IN");
        let picked: Vec<String> = (0..77).filter(|n| n % 3 == 0).map(|n| format!("r{n}")).collect();
        update.run(&tx, &[text("third")], &picked, |s| [text(s)]).unwrap();
        tx.commit().unwrap();
        let got: Vec<(i64, String, Option<String>)> = c
            .prepare("SELECT n, s, o FROM t ORDER BY rowid")
            .unwrap()
            .query_map([], |r| Ok((r.get(0)?, r.get(1)?, r.get(2)?)))
            .unwrap()
            .collect::<Result<_, _>>()
            .unwrap();
        assert_eq!(got.len(), 77, "every row inserted once");
        for (i, (n, s, o)) in got.iter().enumerate() {
            assert_eq!(*n, i as i64, "rows keep their order");
            assert_eq!(s, &format!("r{i}"));
            let want = if i % 3 == 0 {
                Some("third")
            } else if i % 2 == 0 {
                Some("even")
            } else {
                None
            };
            assert_eq!(o.as_deref(), want, "row {i}");
        }
    }

    #[test]
    fn immediate_commits_what_succeeds_and_rolls_back_what_fails() {
        let c = rusqlite::Connection::open_in_memory().unwrap();
        c.execute_batch("CREATE TABLE t (n INTEGER)").unwrap();
        let count =
            |c: &rusqlite::Connection| c.query_row("SELECT count(*) FROM t", [], |r| r.get::<_, i64>(0)).unwrap();
        immediate(&c, |c| c.execute("INSERT INTO t VALUES (1)", [])).unwrap();
        assert_eq!(count(&c), 1, "committed");
        let failed = immediate(&c, |c| {
            c.execute("INSERT INTO t VALUES (2)", [])?;
            c.execute("INSERT INTO nowhere VALUES (3)", [])
        });
        assert!(failed.is_err());
        assert!(c.is_autocommit(), "no transaction left open");
        assert_eq!(count(&c), 1, "the failed transaction's insert is rolled back");
        // A panic inside `f` rolls back too, so the connection is free for the next writer.
        let panicked = std::panic::catch_unwind(std::panic::AssertUnwindSafe(|| {
            let _ = immediate(&c, |c| -> rusqlite::Result<()> {
                c.execute("INSERT INTO t VALUES (4)", [])?;
                panic!("in the transaction");
            });
        }));
        assert!(panicked.is_err());
        assert!(c.is_autocommit(), "the panic's transaction is rolled back");
        immediate(&c, |c| c.execute("INSERT INTO t VALUES (5)", [])).unwrap();
        let all: Vec<i64> = c
            .prepare("SELECT n FROM t ORDER BY n")
            .unwrap()
            .query_map([], |r| r.get(0))
            .unwrap()
            .map(Result::unwrap)
            .collect();
        assert_eq!(all, [1, 5]);
    }
}
