//! The ledger on SQLite: each change is one `BEGIN IMMEDIATE` transaction (the write lock is
//! taken before anything is read), so holds and settlements never race. Holds, settlements
//! and releases are batches of one through `sqlite/ledger/batch.rs` (the composition root
//! batches them for real, `ledger/batch.rs`), so the money rules exist once
//! (`ledger::plan::plan`); top-ups, reads and the credit expiry are here.

use async_trait::async_trait;
use rusqlite::{OptionalExtension, TransactionBehavior, params};

use crate::money::plans::{PlanRecord, PlanTerms};
use crate::runtime::clock::Millis;
use crate::store::StoreError;
use crate::store::ledger::batch::{LedgerWrites, apply_one};
use crate::store::ledger::ops::{LedgerOp, OpResult};
use crate::store::ledger::{Balance, LedgerAdmin, LedgerEntry, LedgerReads, LiveTopUp, RequestLedger, expiring_credit};
use crate::store::sqlite::SqliteStore;

#[async_trait]
impl RequestLedger for SqliteStore {
    async fn submit(&self, op: LedgerOp) -> OpResult {
        apply_one(self, op).await
    }
}

#[async_trait]
impl LedgerReads for SqliteStore {
    async fn balance(&self, workspace_id: &str) -> Result<Option<Balance>, StoreError> {
        let ws = workspace_id.to_string();
        self.with_conn(move |c| {
            c.prepare_cached("SELECT balance_cents, held_cents, carry_microcents, lifetime_purchases_cents FROM workspaces WHERE id = ?1")?.query_row([ws],
                |r| {
                    Ok(Balance {
                        balance_cents: r.get(0)?,
                        held_cents: r.get(1)?,
                        carry_microcents: r.get(2)?,
                        lifetime_purchases_cents: r.get(3)?,
                    })
                },
            )
            .optional()
        })
        .await
    }

    async fn plan(&self, workspace_id: &str) -> Result<Option<PlanRecord>, StoreError> {
        self.read_plan(workspace_id).await
    }

    async fn entries(&self, workspace_id: &str, limit: i64) -> Result<Vec<LedgerEntry>, StoreError> {
        let ws = workspace_id.to_string();
        self.with_conn(move |c| {
            let mut st = c.prepare(
                "SELECT id, kind, source, amount_cents, request_id, cost_microcents, expires_at, created_at \
                 FROM ledger_entries WHERE workspace_id = ?1 ORDER BY id DESC LIMIT ?2",
            )?;
            let rows = st.query_map(params![ws, limit], |r| {
                Ok(LedgerEntry {
                    id: r.get(0)?,
                    kind: r.get(1)?,
                    source: r.get(2)?,
                    amount_cents: r.get(3)?,
                    request_id: r.get(4)?,
                    cost_microcents: r.get(5)?,
                    expires_at: r.get(6)?,
                    created_at: r.get(7)?,
                })
            })?;
            rows.collect()
        })
        .await
    }

    async fn derived_balance(&self, workspace_id: &str) -> Result<i64, StoreError> {
        let ws = workspace_id.to_string();
        self.with_conn(move |c| {
            c.prepare_cached(
                "SELECT (SELECT COALESCE(SUM(amount_cents), 0) FROM ledger_entries WHERE workspace_id = ?1) \
                 - (SELECT COALESCE(SUM(amount_cents), 0) FROM holds \
                    WHERE workspace_id = ?1 AND state = 'open' AND entry_written = 0)",
            )?
            .query_row([ws], |r| r.get(0))
        })
        .await
    }

    async fn spent_since(&self, workspace_id: &str, since: Millis) -> Result<i64, StoreError> {
        let ws = workspace_id.to_string();
        self.with_conn(move |c| {
            c.prepare_cached(
                "SELECT COALESCE(-SUM(amount_cents), 0) FROM ledger_entries \
                 WHERE workspace_id = ?1 AND kind = 'settlement' AND created_at >= ?2",
            )?
            .query_row(params![ws, since], |r| r.get(0))
        })
        .await
    }

    async fn key_month_spend(&self, key_id: &str, month: &str) -> Result<i64, StoreError> {
        let (key, month) = (key_id.to_string(), month.to_string());
        self.with_conn(move |c| {
            c.prepare_cached("SELECT spent_microcents FROM key_month_spend WHERE key_id = ?1 AND month = ?2")?
                .query_row(params![key, month], |r| r.get(0))
                .optional()
                .map(|v| v.unwrap_or(0))
        })
        .await
    }
}

#[async_trait]
impl LedgerAdmin for SqliteStore {
    async fn top_up(
        &self,
        workspace_id: &str,
        amount_cents: i64,
        source: &str,
        expires_at: Option<Millis>,
        now: Millis,
    ) -> Result<(i64, i64), StoreError> {
        let (ws, source) = (workspace_id.to_string(), source.to_string());
        self.with_conn(move |c| {
            let tx = c.transaction_with_behavior(TransactionBehavior::Immediate)?;
            let purchase = if source == "purchase" { amount_cents } else { 0 };
            tx.prepare_cached(
                "UPDATE workspaces SET balance_cents = balance_cents + ?2, \
                 lifetime_purchases_cents = lifetime_purchases_cents + ?3 WHERE id = ?1",
            )?
            .execute(params![ws, amount_cents, purchase])?;
            tx.prepare_cached(
                "INSERT INTO ledger_entries (workspace_id, kind, source, amount_cents, expires_at, created_at) \
                 VALUES (?1, 'topup', ?2, ?3, ?4, ?5)",
            )?
            .execute(params![ws, source, amount_cents, expires_at, now])?;
            let id = tx.last_insert_rowid();
            let balance: i64 = tx
                .prepare_cached("SELECT balance_cents FROM workspaces WHERE id = ?1")?
                .query_row([&ws], |r| r.get(0))?;
            tx.commit()?;
            Ok((id, balance))
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
        self.with_conn(move |c| {
            c.prepare_cached("UPDATE workspaces SET frozen = ?2 WHERE id = ?1")?
                .execute(params![ws, reason])
                .map(|n| n > 0)
        })
        .await
    }

    async fn sweep_expired_credit(&self, now: Millis) -> Result<Vec<(String, i64)>, StoreError> {
        self.with_conn(move |c| {
            let due: Vec<String> = {
                let mut st = c.prepare(
                    "SELECT DISTINCT workspace_id FROM ledger_entries \
                     WHERE kind = 'topup' AND expired_at IS NULL AND expires_at <= ?1",
                )?;
                st.query_map([now], |r| r.get(0))?.collect::<Result<_, _>>()?
            };
            let mut removed = Vec::new();
            for ws in due {
                let tx = c.transaction_with_behavior(TransactionBehavior::Immediate)?;
                let balance: i64 =
                    tx.prepare_cached("SELECT balance_cents FROM workspaces WHERE id = ?1")?.query_row([&ws], |r| r.get(0))?;
                let live: Vec<LiveTopUp> = {
                    let mut st = tx.prepare(
                        "SELECT id, amount_cents, expires_at FROM ledger_entries \
                         WHERE workspace_id = ?1 AND kind = 'topup' AND expired_at IS NULL",
                    )?;
                    st.query_map([&ws], |r| Ok((r.get(0)?, r.get(1)?, r.get(2)?)))?.collect::<Result<_, _>>()?
                };
                let (cents, swept) = expiring_credit(balance, &live, now);
                for id in &swept {
                    tx.prepare_cached("UPDATE ledger_entries SET expired_at = ?2 WHERE id = ?1")?.execute(params![id, now])?;
                }
                if cents > 0 {
                    tx.prepare_cached("UPDATE workspaces SET balance_cents = balance_cents - ?2 WHERE id = ?1")?.execute(params![ws, cents])?;
                    tx.prepare_cached("INSERT INTO ledger_entries (workspace_id, kind, amount_cents, created_at) VALUES (?1, 'expiry', ?2, ?3)")?.execute(params![ws, -cents, now],
                    )?;
                    removed.push((ws, cents));
                }
                tx.commit()?;
            }
            Ok(removed)
        })
        .await
    }
}
