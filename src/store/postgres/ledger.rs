//! The ledger on PostgreSQL. Holds, settlements and releases are batches of one through
//! `postgres/ledger/batch.rs` (the composition root batches them for real, `ledger/batch.rs`),
//! so the money rules exist once (`ledger::plan::plan`); top-ups, reads and the credit expiry
//! are here. Every write locks the workspace row first.

use crate::money::plans::{PlanRecord, PlanTerms};
use crate::runtime::clock::Millis;
use crate::store::StoreError;
use crate::store::ledger::batch::{LedgerWrites, apply_one};
use crate::store::ledger::ops::{LedgerOp, OpResult};
use crate::store::ledger::{Balance, LedgerAdmin, LedgerEntry, LedgerReads, LiveTopUp, RequestLedger, expiring_credit};
use crate::store::postgres::PostgresStore;
use async_trait::async_trait;

#[async_trait]
impl RequestLedger for PostgresStore {
    async fn submit(&self, op: LedgerOp) -> OpResult {
        apply_one(self, op).await
    }
}

#[async_trait]
impl LedgerReads for PostgresStore {
    async fn balance(&self, workspace_id: &str) -> Result<Option<Balance>, StoreError> {
        let ws = workspace_id.to_string();
        self.with_client(move |c| async move {
            let row = c
                .query_opt(
                    "SELECT balance_cents, held_cents, carry_microcents, lifetime_purchases_cents FROM workspaces WHERE id = $1",
                    &[&ws],
                )
                .await?;
            row.map(|r| {
                Ok(Balance {
                    balance_cents: r.try_get(0)?,
                    held_cents: r.try_get(1)?,
                    carry_microcents: r.try_get(2)?,
                    lifetime_purchases_cents: r.try_get(3)?,
                })
            })
            .transpose()
        })
        .await
    }

    async fn plan(&self, workspace_id: &str) -> Result<Option<PlanRecord>, StoreError> {
        self.read_plan(workspace_id).await
    }

    async fn entries(&self, workspace_id: &str, limit: i64) -> Result<Vec<LedgerEntry>, StoreError> {
        let ws = workspace_id.to_string();
        self.with_client(move |c| async move {
            let rows = c
                .query(
                    "SELECT id, kind, source, amount_cents, request_id, cost_microcents, expires_at, created_at \
                     FROM ledger_entries WHERE workspace_id = $1 ORDER BY id DESC LIMIT $2",
                    &[&ws, &limit],
                )
                .await?;
            rows.iter()
                .map(|r| {
                    Ok(LedgerEntry {
                        id: r.try_get(0)?,
                        kind: r.try_get(1)?,
                        source: r.try_get(2)?,
                        amount_cents: r.try_get(3)?,
                        request_id: r.try_get(4)?,
                        cost_microcents: r.try_get(5)?,
                        expires_at: r.try_get(6)?,
                        created_at: r.try_get(7)?,
                    })
                })
                .collect()
        })
        .await
    }

    async fn derived_balance(&self, workspace_id: &str) -> Result<i64, StoreError> {
        let ws = workspace_id.to_string();
        self.with_client(move |c| async move {
            c.query_one(
                "SELECT ((SELECT COALESCE(SUM(amount_cents), 0) FROM ledger_entries WHERE workspace_id = $1) \
                 - (SELECT COALESCE(SUM(amount_cents), 0) FROM holds \
                    WHERE workspace_id = $1 AND state = 'open' AND NOT entry_written))::BIGINT",
                &[&ws],
            )
            .await?
            .try_get(0)
        })
        .await
    }

    async fn spent_since(&self, workspace_id: &str, since: Millis) -> Result<i64, StoreError> {
        let ws = workspace_id.to_string();
        self.with_client(move |c| async move {
            c.query_one(
                "SELECT COALESCE(-SUM(amount_cents), 0)::BIGINT FROM ledger_entries \
                 WHERE workspace_id = $1 AND kind = 'settlement' AND created_at >= $2",
                &[&ws, &since],
            )
            .await?
            .try_get(0)
        })
        .await
    }

    async fn key_month_spend(&self, key_id: &str, month: &str) -> Result<i64, StoreError> {
        let (key, month) = (key_id.to_string(), month.to_string());
        self.with_client(move |c| async move {
            let row = c
                .query_opt(
                    "SELECT spent_microcents FROM key_month_spend WHERE key_id = $1 AND month = $2",
                    &[&key, &month],
                )
                .await?;
            row.map(|r| r.try_get(0)).transpose().map(|v| v.unwrap_or(0))
        })
        .await
    }
}

#[async_trait]
impl LedgerAdmin for PostgresStore {
    async fn top_up(
        &self,
        workspace_id: &str,
        amount_cents: i64,
        source: &str,
        expires_at: Option<Millis>,
        now: Millis,
    ) -> Result<(i64, i64), StoreError> {
        let (ws, source) = (workspace_id.to_string(), source.to_string());
        self.with_client(move |mut c| async move {
            let tx = c.transaction().await?;
            let purchase = if source == "purchase" { amount_cents } else { 0 };
            let row = tx
                .query_one(
                    "UPDATE workspaces SET balance_cents = balance_cents + $2, \
                     lifetime_purchases_cents = lifetime_purchases_cents + $3 WHERE id = $1 RETURNING balance_cents",
                    &[&ws, &amount_cents, &purchase],
                )
                .await?;
            let entry = tx
                .query_one(
                    "INSERT INTO ledger_entries (workspace_id, kind, source, amount_cents, expires_at, created_at) \
                     VALUES ($1, 'topup', $2, $3, $4, $5) RETURNING id",
                    &[&ws, &source, &amount_cents, &expires_at, &now],
                )
                .await?;
            tx.commit().await?;
            Ok((entry.try_get(0)?, row.try_get(0)?))
        })
        .await
    }

    async fn set_plan(
        &self,
        workspace_id: &str,
        terms: &PlanTerms,
        now: Millis,
    ) -> Result<Option<PlanRecord>, StoreError> {
        self.write_plan(workspace_id, terms, now).await
    }

    async fn clear_plan(&self, workspace_id: &str) -> Result<bool, StoreError> {
        self.delete_plan(workspace_id).await
    }

    async fn expired_holds(&self, now: Millis) -> Result<Vec<String>, StoreError> {
        LedgerWrites::expired_holds(self, now).await
    }

    async fn set_frozen(&self, workspace_id: &str, reason: Option<&str>) -> Result<bool, StoreError> {
        let (ws, reason) = (workspace_id.to_string(), reason.map(str::to_string));
        self.with_client(move |c| async move {
            c.execute("UPDATE workspaces SET frozen = $2 WHERE id = $1", &[&ws, &reason]).await.map(|n| n > 0)
        })
        .await
    }

    async fn sweep_expired_credit(&self, now: Millis) -> Result<Vec<(String, i64)>, StoreError> {
        self.with_client(move |mut c| async move {
            let due: Vec<String> = c
                .query(
                    "SELECT DISTINCT workspace_id FROM ledger_entries \
                     WHERE kind = 'topup' AND expired_at IS NULL AND expires_at <= $1",
                    &[&now],
                )
                .await?
                .iter()
                .map(|r| r.try_get(0))
                .collect::<Result<_, _>>()?;
            let mut removed = Vec::new();
            for ws in due {
                let tx = c.transaction().await?;
                // The workspace row lock orders this against holds and settlements.
                let balance: i64 =
                    tx.query_one("SELECT balance_cents FROM workspaces WHERE id = $1 FOR UPDATE", &[&ws]).await?.try_get(0)?;
                let live: Vec<LiveTopUp> = tx
                    .query(
                        "SELECT id, amount_cents, expires_at FROM ledger_entries \
                         WHERE workspace_id = $1 AND kind = 'topup' AND expired_at IS NULL",
                        &[&ws],
                    )
                    .await?
                    .iter()
                    .map(|r| Ok((r.try_get(0)?, r.try_get(1)?, r.try_get(2)?)))
                    .collect::<Result<_, tokio_postgres::Error>>()?;
                let (cents, swept) = expiring_credit(balance, &live, now);
                if !swept.is_empty() {
                    tx.execute("UPDATE ledger_entries SET expired_at = $2 WHERE id = ANY($1)", &[&swept, &now]).await?;
                }
                if cents > 0 {
                    tx.execute("UPDATE workspaces SET balance_cents = balance_cents - $2 WHERE id = $1", &[&ws, &cents])
                        .await?;
                    tx.execute(
                        "INSERT INTO ledger_entries (workspace_id, kind, amount_cents, created_at) VALUES ($1, 'expiry', $2, $3)",
                        &[&ws, &-cents, &now],
                    )
                    .await?;
                    removed.push((ws, cents));
                }
                tx.commit().await?;
            }
            Ok(removed)
        })
        .await
    }
}
