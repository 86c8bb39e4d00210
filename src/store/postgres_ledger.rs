//! The ledger on PostgreSQL. A hold is one statement (one round trip): the conditional
//! balance update, the hold row and its entry, chained in CTEs. Settlement locks the
//! workspace row for its transaction.

use async_trait::async_trait;
use deadpool_postgres::GenericClient;

use super::StoreError;
use super::ledger::{
    Balance, HoldOutcome, LedgerEntry, LedgerStore, LiveTopUp, SettleOutcome, Settlement, expiring_credit,
};
use super::postgres::PostgresStore;
use crate::clock::Millis;

/// Release the request's open hold into `state`, crediting it back. `false` if none open.
async fn release_open_hold(
    c: &impl GenericClient,
    request_id: &str,
    state: &str,
    now: Millis,
) -> Result<bool, tokio_postgres::Error> {
    let row = c
        .query_opt(
            "UPDATE holds SET state = $2 WHERE request_id = $1 AND state = 'open' RETURNING workspace_id, key_id, amount_cents",
            &[&request_id, &state],
        )
        .await?;
    let Some(row) = row else { return Ok(false) };
    let (ws, key, amount): (String, Option<String>, i64) = (row.try_get(0)?, row.try_get(1)?, row.try_get(2)?);
    c.execute(
        "UPDATE workspaces SET balance_cents = balance_cents + $2, held_cents = held_cents - $2 WHERE id = $1",
        &[&ws, &amount],
    )
    .await?;
    c.execute(
        "INSERT INTO ledger_entries (workspace_id, kind, amount_cents, request_id, key_id, created_at) \
         VALUES ($1, 'hold_release', $2, $3, $4, $5)",
        &[&ws, &amount, &request_id, &key, &now],
    )
    .await?;
    Ok(true)
}

#[async_trait]
impl LedgerStore for PostgresStore {
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

    async fn place_hold(
        &self,
        request_id: &str,
        workspace_id: &str,
        key_id: Option<&str>,
        amount_cents: i64,
        expires_at: Millis,
        now: Millis,
    ) -> Result<HoldOutcome, StoreError> {
        let (rid, ws, key) = (request_id.to_string(), workspace_id.to_string(), key_id.map(str::to_string));
        self.with_client(move |c| async move {
            let st = c
                .prepare_cached(
                    "WITH w AS (UPDATE workspaces SET balance_cents = balance_cents - $3, held_cents = held_cents + $3 \
                                WHERE id = $2 AND balance_cents >= $3 RETURNING balance_cents), \
                          h AS (INSERT INTO holds (request_id, workspace_id, key_id, amount_cents, state, expires_at, created_at) \
                                SELECT $1, $2, $4, $3, 'open', $5, $6 FROM w RETURNING request_id), \
                          e AS (INSERT INTO ledger_entries (workspace_id, kind, amount_cents, request_id, key_id, created_at) \
                                SELECT $2, 'hold', -$3::BIGINT, $1, $4, $6 FROM w RETURNING id) \
                     SELECT (SELECT balance_cents FROM w), (SELECT balance_cents FROM workspaces WHERE id = $2)",
                )
                .await?;
            let row = c.query_one(&st, &[&rid, &ws, &amount_cents, &key, &expires_at, &now]).await?;
            let after: Option<i64> = row.try_get(0)?;
            let before: Option<i64> = row.try_get(1)?;
            Ok(match after {
                Some(b) => HoldOutcome::Placed { balance_cents: b },
                None => HoldOutcome::Insufficient { balance_cents: before.unwrap_or(0) },
            })
        })
        .await
    }

    async fn settle(&self, s: &Settlement) -> Result<SettleOutcome, StoreError> {
        let s = s.clone();
        self.with_client(move |c| async move {
            // One statement, one round trip: lock the workspace row, release the hold, debit
            // whole cents with the carry, write both entries and the key's month spend. A
            // second settlement of the request finds its entry and changes nothing; two racing
            // ones are told apart by the unique (request_id, kind) index.
            let st = c
                .prepare_cached(
                    "WITH c AS (SELECT carry_microcents FROM workspaces WHERE id = $2 FOR UPDATE), \
                          d AS (SELECT (carry_microcents + $3) / 1000000 AS debit, \
                                       (carry_microcents + $3) % 1000000 AS carry FROM c \
                                WHERE NOT EXISTS (SELECT 1 FROM ledger_entries WHERE request_id = $1 AND kind = 'settlement')), \
                          h AS (UPDATE holds SET state = 'settled' \
                                WHERE request_id = $1 AND state = 'open' AND EXISTS (SELECT 1 FROM d) \
                                RETURNING key_id, amount_cents), \
                          w AS (UPDATE workspaces SET \
                                  balance_cents = balance_cents + COALESCE((SELECT amount_cents FROM h), 0) - d.debit, \
                                  held_cents = held_cents - COALESCE((SELECT amount_cents FROM h), 0), \
                                  carry_microcents = d.carry \
                                FROM d WHERE id = $2 RETURNING balance_cents), \
                          r AS (INSERT INTO ledger_entries (workspace_id, kind, amount_cents, request_id, key_id, created_at) \
                                SELECT $2, 'hold_release', amount_cents, $1, key_id, $6 FROM h), \
                          e AS (INSERT INTO ledger_entries \
                                  (workspace_id, kind, amount_cents, request_id, key_id, cost_microcents, created_at) \
                                SELECT $2, 'settlement', -debit, $1, $4, $3, $6 FROM d), \
                          k AS (INSERT INTO key_month_spend (key_id, month, spent_microcents) \
                                SELECT $4, $5, $3 FROM d WHERE $4::TEXT IS NOT NULL \
                                ON CONFLICT (key_id, month) DO UPDATE \
                                SET spent_microcents = key_month_spend.spent_microcents + EXCLUDED.spent_microcents) \
                     SELECT (SELECT debit FROM d), (SELECT balance_cents FROM w), EXISTS (SELECT 1 FROM c)",
                )
                .await?;
            // The debit rule of `money::debit_with_carry`, as integer SQL on the locked row.
            let cost = s.cost.as_i64();
            let params: [&(dyn tokio_postgres::types::ToSql + Sync); 6] =
                [&s.request_id, &s.workspace_id, &cost, &s.key_id, &s.month, &s.now];
            let row = match c.query_one(&st, &params).await {
                Ok(row) => row,
                Err(e) if e.code() == Some(&tokio_postgres::error::SqlState::UNIQUE_VIOLATION) => {
                    return Ok(Some(SettleOutcome::AlreadySettled));
                }
                Err(e) => return Err(e),
            };
            let debit: Option<i64> = row.try_get(0)?;
            let balance: Option<i64> = row.try_get(1)?;
            let workspace_found: bool = row.try_get(2)?;
            Ok(match (debit, balance) {
                (Some(debit_cents), Some(balance_cents)) => Some(SettleOutcome::Settled { debit_cents, balance_cents }),
                _ if workspace_found => Some(SettleOutcome::AlreadySettled),
                _ => None,
            })
        })
        .await?
        .ok_or_else(|| StoreError::Conflict("settlement for a workspace that does not exist".into()))
    }

    async fn release_hold(&self, request_id: &str, now: Millis) -> Result<bool, StoreError> {
        let rid = request_id.to_string();
        self.with_client(move |mut c| async move {
            let tx = c.transaction().await?;
            let released = release_open_hold(&tx, &rid, "released", now).await?;
            tx.commit().await?;
            Ok(released)
        })
        .await
    }

    async fn sweep_expired_holds(&self, now: Millis) -> Result<Vec<String>, StoreError> {
        self.with_client(move |mut c| async move {
            let tx = c.transaction().await?;
            let rows = tx
                .query(
                    "SELECT request_id FROM holds WHERE state = 'open' AND expires_at <= $1 FOR UPDATE SKIP LOCKED",
                    &[&now],
                )
                .await?;
            let mut ids = Vec::new();
            for r in rows {
                let id: String = r.try_get(0)?;
                if release_open_hold(&tx, &id, "released", now).await? {
                    ids.push(id);
                }
            }
            tx.commit().await?;
            Ok(ids)
        })
        .await
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
                "SELECT COALESCE(SUM(amount_cents), 0)::BIGINT FROM ledger_entries WHERE workspace_id = $1",
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
