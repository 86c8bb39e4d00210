//! Plans on PostgreSQL: read, set and clear a workspace's plan. Setting takes the workspace
//! row lock first, like every money write, so it never interleaves with a batch that is
//! metering the same plan.

use crate::money::plans::{Counters, PlanRecord, PlanTerms};
use crate::runtime::clock::Millis;
use crate::store::StoreError;
use crate::store::plan_rows::{
    COUNTER_COLUMNS, PlanRow, TERMS_COLUMNS, all_columns, counter_values, read_plan, term_values,
};
use crate::store::postgres::PostgresStore;

impl PlanRow for tokio_postgres::Row {
    fn text(&self, i: usize) -> Result<Option<String>, String> {
        self.try_get(i).map_err(|e| e.to_string())
    }

    fn int(&self, i: usize) -> Result<Option<i64>, String> {
        self.try_get(i).map_err(|e| e.to_string())
    }

    fn flag(&self, i: usize) -> Result<bool, String> {
        self.try_get::<_, Option<bool>>(i).map(|v| v.unwrap_or(false)).map_err(|e| e.to_string())
    }
}

fn unavailable(msg: String) -> StoreError {
    StoreError::Unavailable(msg)
}

impl PostgresStore {
    pub(in crate::store) async fn read_plan(&self, workspace_id: &str) -> Result<Option<PlanRecord>, StoreError> {
        let ws = workspace_id.to_string();
        let row = self
            .with_client(move |c| async move {
                let sql = format!("SELECT {} FROM plans WHERE workspace_id = $1", all_columns());
                c.query_opt(&sql, &[&ws]).await
            })
            .await?;
        row.map(|r| read_plan(&r, 0)).transpose().map_err(unavailable)
    }

    pub(in crate::store) async fn write_plan(
        &self,
        workspace_id: &str,
        terms: &PlanTerms,
        now: Millis,
    ) -> Result<Option<PlanRecord>, StoreError> {
        let (ws, terms) = (workspace_id.to_string(), terms.clone());
        let row = self
            .with_client(move |mut c| async move {
                let tx = c.transaction().await?;
                if tx.query_opt("SELECT 1 FROM workspaces WHERE id = $1 FOR UPDATE", &[&ws]).await?.is_none() {
                    return Ok(None);
                }
                let t = term_values(&terms);
                let fresh = counter_values(&Counters::starting(now));
                let sql = format!(
                    "INSERT INTO plans (workspace_id, {TERMS_COLUMNS}, updated_at, {}) VALUES ($1, $2, $3, $4, $5, $6, \
                     $7, $8, $9, $10, $11, NULL, 0, $12, 0, $13, 0, $14, 0, $15, 0, 0, 0, 0, 0, 0) \
                     ON CONFLICT (workspace_id) DO UPDATE SET tier = $2, status = $3, started_at = $4, cancel_at = $5, \
                     grace_until = $6, credits_enabled = $7, cap_cents = $8, pending_tier = $9, \
                     pending_effective_at = $10, updated_at = $11 RETURNING {}",
                    COUNTER_COLUMNS.join(", "),
                    all_columns()
                );
                let row = tx
                    .query_one(
                        &sql,
                        &[
                            &ws,
                            &t.tier,
                            &t.status,
                            &t.started_at,
                            &t.cancel_at,
                            &t.grace_until,
                            &t.credits_enabled,
                            &t.cap_cents,
                            &t.pending_tier,
                            &t.pending_effective_at,
                            &now,
                            &fresh[2],
                            &fresh[4],
                            &fresh[6],
                            &fresh[8],
                        ],
                    )
                    .await?;
                tx.commit().await?;
                Ok(Some(row))
            })
            .await?;
        row.map(|r| read_plan(&r, 0)).transpose().map_err(unavailable)
    }

    pub(in crate::store) async fn delete_plan(&self, workspace_id: &str) -> Result<bool, StoreError> {
        let ws = workspace_id.to_string();
        self.with_client(move |mut c| async move {
            let tx = c.transaction().await?;
            tx.query_opt("SELECT 1 FROM workspaces WHERE id = $1 FOR UPDATE", &[&ws]).await?;
            let n = tx.execute("DELETE FROM plans WHERE workspace_id = $1", &[&ws]).await?;
            tx.commit().await?;
            Ok(n > 0)
        })
        .await
    }
}
