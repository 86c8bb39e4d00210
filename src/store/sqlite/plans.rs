//! Plans on SQLite: read, set and clear a workspace's plan (each in one `BEGIN IMMEDIATE`
//! transaction), and the batch's plan reads and counter writes.

use std::sync::LazyLock;

use rusqlite::{Connection, OptionalExtension, TransactionBehavior, params};

use crate::money::plans::{Counters, PlanRecord, PlanTerms};
use crate::runtime::clock::Millis;
use crate::store::StoreError;
use crate::store::plan_rows::{COUNTER_COLUMNS, PlanRow, all_columns, counter_values, read_plan, term_values};
use crate::store::sqlite::SqliteStore;

impl PlanRow for rusqlite::Row<'_> {
    fn text(&self, i: usize) -> Result<Option<String>, String> {
        self.get(i).map_err(|e| e.to_string())
    }

    fn int(&self, i: usize) -> Result<Option<i64>, String> {
        self.get(i).map_err(|e| e.to_string())
    }

    fn flag(&self, i: usize) -> Result<bool, String> {
        self.get::<_, i64>(i).map(|v| v != 0).map_err(|e| e.to_string())
    }
}

fn conversion(msg: String) -> rusqlite::Error {
    rusqlite::Error::ToSqlConversionFailure(Box::new(std::io::Error::other(msg)))
}

/// The workspace's plan, in the current transaction or connection.
pub(in crate::store) fn plan_of(c: &Connection, ws: &str) -> rusqlite::Result<Option<PlanRecord>> {
    static SQL: LazyLock<String> =
        LazyLock::new(|| format!("SELECT {} FROM plans WHERE workspace_id = ?1", all_columns()));
    let mut st = c.prepare_cached(&SQL)?;
    let row = st.query_row([ws], |r| Ok(read_plan(r, 0))).optional()?;
    row.transpose().map_err(conversion)
}

/// Write the counters of the plans a batch changed.
pub(in crate::store) fn write_counters(c: &Connection, plans: &[(String, Counters)]) -> rusqlite::Result<()> {
    if plans.is_empty() {
        return Ok(());
    }
    static SQL: LazyLock<String> = LazyLock::new(|| {
        let sets: Vec<String> =
            COUNTER_COLUMNS.iter().enumerate().map(|(i, col)| format!("{col} = ?{}", i + 2)).collect();
        format!("UPDATE plans SET {} WHERE workspace_id = ?1", sets.join(", "))
    });
    let mut st = c.prepare_cached(&SQL)?;
    for (ws, counters) in plans {
        let v = counter_values(counters);
        st.execute(params![
            ws, v[0], v[1], v[2], v[3], v[4], v[5], v[6], v[7], v[8], v[9], v[10], v[11], v[12], v[13], v[14]
        ])?;
    }
    Ok(())
}

impl SqliteStore {
    pub(in crate::store) async fn read_plan(&self, workspace_id: &str) -> Result<Option<PlanRecord>, StoreError> {
        let ws = workspace_id.to_string();
        self.with_conn(move |c| plan_of(c, &ws)).await
    }

    pub(in crate::store) async fn write_plan(
        &self,
        workspace_id: &str,
        terms: &PlanTerms,
        now: Millis,
    ) -> Result<Option<PlanRecord>, StoreError> {
        let (ws, terms) = (workspace_id.to_string(), terms.clone());
        self.with_conn(move |c| {
            let tx = c.transaction_with_behavior(TransactionBehavior::Immediate)?;
            let exists = tx.prepare_cached("SELECT 1 FROM workspaces WHERE id = ?1")?.exists([&ws])?;
            if !exists {
                return Ok(None);
            }
            let t = term_values(&terms);
            let fresh = counter_values(&Counters::starting(now));
            // Terms are replaced; an existing plan keeps its counters.
            tx.prepare_cached(&format!(
                "INSERT INTO plans (workspace_id, {}, updated_at, {}) VALUES (?1, ?2, ?3, ?4, ?5, ?6, ?7, ?8, ?9, \
                 ?10, ?11, NULL, 0, ?12, 0, ?13, 0, ?14, 0, ?15, 0, 0, 0, 0, 0, 0) \
                 ON CONFLICT (workspace_id) DO UPDATE SET tier = ?2, status = ?3, started_at = ?4, cancel_at = ?5, \
                 grace_until = ?6, credits_enabled = ?7, cap_cents = ?8, pending_tier = ?9, \
                 pending_effective_at = ?10, updated_at = ?11",
                crate::store::plan_rows::TERMS_COLUMNS,
                COUNTER_COLUMNS.join(", ")
            ))?
            .execute(params![
                ws,
                t.tier,
                t.status,
                t.started_at,
                t.cancel_at,
                t.grace_until,
                t.credits_enabled,
                t.cap_cents,
                t.pending_tier,
                t.pending_effective_at,
                now,
                fresh[2],
                fresh[4],
                fresh[6],
                fresh[8]
            ])?;
            let plan = plan_of(&tx, &ws)?;
            tx.commit()?;
            Ok(plan)
        })
        .await
    }

    pub(in crate::store) async fn delete_plan(&self, workspace_id: &str) -> Result<bool, StoreError> {
        let ws = workspace_id.to_string();
        self.with_conn(move |c| {
            let n = c.prepare_cached("DELETE FROM plans WHERE workspace_id = ?1")?.execute([ws])?;
            Ok(n > 0)
        })
        .await
    }
}
