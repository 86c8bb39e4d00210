//! A batch of ledger writes on SQLite: one `BEGIN IMMEDIATE` transaction (the write lock is
//! taken before anything is read, so another process on the same file cannot interleave),
//! the batch's hold rows, settled ids and workspace balances read with cached statements,
//! `ledger::plan::plan`, its rows written, one commit. What a batch saves on SQLite is the
//! per-transaction cost (a blocking task, the lock, a WAL commit writing the same balance,
//! index and hold pages again) and the per-op balance read-modify-write: each workspace row
//! is read and written once per batch.

use std::sync::{Arc, LazyLock};

use async_trait::async_trait;
use rusqlite::{Connection, OptionalExtension, params};

use crate::money::plans::decide::Funding;
use crate::runtime::clock::Millis;
use crate::store::StoreError;
use crate::store::ledger::Balance;
use crate::store::ledger::batch::LedgerWrites;
use crate::store::ledger::lease::{LeaseRow, balance_and_leases};
use crate::store::ledger::ops::{LedgerOp, OpResult};
use crate::store::ledger::plan::{HoldRow, Money, Plan, Snapshot, plan};
use crate::store::sqlite::SqliteStore;
use crate::store::sqlite::plans::{plan_of, write_counters};
use crate::store::sqlite::rows::{Chunked, immediate, int, opt_int, opt_text, text};
use tollgate_threads::give_way;

#[async_trait]
impl LedgerWrites for SqliteStore {
    async fn apply(&self, ops: Arc<[LedgerOp]>) -> Result<Vec<OpResult>, StoreError> {
        self.with_conn(move |c| {
            immediate(c, |tx| {
                let snap = snapshot(tx, &ops)?;
                give_way();
                let plan = plan(&ops, snap);
                give_way();
                write(tx, &plan)?;
                give_way();
                Ok(plan.outcomes)
            })
        })
        .await
    }

    async fn expired_holds(&self, now: Millis) -> Result<Vec<String>, StoreError> {
        self.with_conn(move |c| {
            let mut st = c.prepare_cached("SELECT request_id FROM holds WHERE state = 'open' AND expires_at <= ?1")?;
            let ids = st.query_map([now], |r| r.get(0))?.collect::<Result<_, _>>()?;
            Ok(ids)
        })
        .await
    }

    async fn balance_with_leases(&self, workspace_id: &str) -> Result<Option<(Balance, Vec<LeaseRow>)>, StoreError> {
        let ws = workspace_id.to_string();
        self.with_conn(move |c| {
            // One statement, one snapshot: a lease granted or given back between two reads
            // would count twice or not at all.
            let mut st = c.prepare_cached(
                "SELECT w.balance_cents, w.held_cents, w.carry_microcents, w.lifetime_purchases_cents, \
                        h.request_id, h.amount_cents, h.created_at \
                 FROM workspaces w LEFT JOIN holds h ON h.workspace_id = w.id AND h.state = 'open' \
                      AND substr(h.request_id, 1, 6) = 'lease_' \
                 WHERE w.id = ?1",
            )?;
            let rows = st.query_map([ws], |r| {
                let b = Balance {
                    balance_cents: r.get(0)?,
                    held_cents: r.get(1)?,
                    carry_microcents: r.get(2)?,
                    lifetime_purchases_cents: r.get(3)?,
                };
                let lease = match r.get::<_, Option<String>>(4)? {
                    Some(id) => Some(LeaseRow { id, amount_cents: r.get(5)?, created_at: r.get(6)? }),
                    None => None,
                };
                Ok((b, lease))
            })?;
            Ok(balance_and_leases(rows.collect::<Result<Vec<_>, _>>()?))
        })
        .await
    }
}

fn snapshot(tx: &Connection, ops: &[LedgerOp]) -> rusqlite::Result<Snapshot> {
    let mut snap = Snapshot::default();
    let mut wss: Vec<String> = Vec::new();
    {
        let mut hold =
            tx.prepare_cached("SELECT workspace_id, key_id, amount_cents, state, funding, value_microcents, created_at, entry_written FROM holds WHERE request_id = ?1")?;
        let mut settled =
            tx.prepare_cached("SELECT 1 FROM ledger_entries WHERE request_id = ?1 AND kind = 'settlement'")?;
        for op in ops {
            let rid = op.request_id();
            // A hold, funding or lease op names an id this process just made: its row is not
            // looked up (a duplicate still fails, on the primary key, and the batch is then
            // retried op by op, so only that op fails). A lease hold reads its lease's row.
            let existing = if op.is_fresh() { op.lease_id() } else { Some(rid) };
            if let Some(id) = existing.filter(|id| !snap.holds.contains_key(*id)) {
                let row = hold
                    .query_row([id], |r| {
                        Ok(HoldRow {
                            workspace_id: r.get(0)?,
                            key_id: r.get(1)?,
                            amount_cents: r.get(2)?,
                            state: r.get(3)?,
                            funding: Funding::parse(&r.get::<_, String>(4)?),
                            value_microcents: r.get(5)?,
                            created_at: r.get(6)?,
                            entry_written: r.get(7)?,
                        })
                    })
                    .optional()?;
                if let Some(row) = row {
                    wss.push(row.workspace_id.clone());
                    snap.holds.insert(id.to_string(), row);
                }
            }
            // A settlement turns its open hold into a settled one in the same transaction, so
            // a request whose hold is still open has no settlement entry to look for.
            let open = snap.holds.get(rid).is_some_and(|h| h.state == "open");
            if matches!(op, LedgerOp::Settle(_)) && !open && settled.query_row([rid], |_| Ok(())).optional()?.is_some()
            {
                snap.settled.insert(rid.to_string());
            }
            if let Some(ws) = op.workspace_id() {
                wss.push(ws.to_string());
            }
            give_way();
        }
    }
    let mut money = tx.prepare_cached(
        "SELECT balance_cents, held_cents, carry_microcents, leases_recalled_until FROM workspaces WHERE id = ?1",
    )?;
    for ws in wss {
        if snap.workspaces.contains_key(&ws) {
            continue;
        }
        let m = money
            .query_row([&ws], |r| {
                Ok(Money {
                    balance_cents: r.get(0)?,
                    held_cents: r.get(1)?,
                    carry_microcents: r.get(2)?,
                    leases_recalled_until: r.get(3)?,
                })
            })
            .optional()?;
        if let Some(m) = m {
            if let Some(plan) = plan_of(tx, &ws)? {
                snap.plans.insert(ws.clone(), plan);
            }
            snap.workspaces.insert(ws, m);
        }
    }
    Ok(snap)
}

static HOLDS: LazyLock<Chunked> = LazyLock::new(|| {
    Chunked::insert(
        "INSERT INTO holds (request_id, workspace_id, key_id, amount_cents, state, expires_at, created_at, funding, value_microcents)",
        9,
    )
});
static HOLD_STATE: LazyLock<Chunked> =
    LazyLock::new(|| Chunked::in_list("UPDATE holds SET state = ? WHERE request_id IN"));
static ENTRIES: LazyLock<Chunked> = LazyLock::new(|| {
    Chunked::insert(
        "INSERT INTO ledger_entries (workspace_id, kind, amount_cents, request_id, key_id, cost_microcents, created_at)",
        7,
    )
});

fn write(tx: &Connection, p: &Plan) -> rusqlite::Result<()> {
    HOLDS.run(tx, &[], &p.new_holds, |h| {
        let r = &h.row;
        [
            text(&h.request_id),
            text(&r.workspace_id),
            opt_text(&r.key_id),
            int(r.amount_cents),
            text(&r.state),
            int(h.expires_at),
            int(h.created_at),
            text(r.funding.as_str()),
            int(r.value_microcents),
        ]
    })?;
    // One statement per new state (a batch's changed holds are distinct).
    let mut states: Vec<&'static str> = p.hold_states.iter().map(|(_, s)| *s).collect();
    states.sort_unstable();
    states.dedup();
    for state in states {
        let rids: Vec<&str> = p.hold_states.iter().filter(|(_, s)| *s == state).map(|(r, _)| r.as_str()).collect();
        HOLD_STATE.run(tx, &[text(state)], &rids, |r| [text(r)])?;
    }
    // Leases that holds were placed from (one or two a batch).
    let mut resize = tx.prepare_cached("UPDATE holds SET amount_cents = ?2 WHERE request_id = ?1")?;
    for (id, amount) in &p.hold_amounts {
        resize.execute(params![id, amount])?;
        give_way();
    }
    ENTRIES.run(tx, &[], &p.entries, |e| {
        [
            text(&e.workspace_id),
            text(e.kind),
            int(e.amount_cents),
            text(&e.request_id),
            opt_text(&e.key_id),
            opt_int(e.cost_microcents),
            int(e.created_at),
        ]
    })?;
    let mut ws = tx.prepare_cached(
        "UPDATE workspaces SET balance_cents = ?2, held_cents = ?3, carry_microcents = ?4, leases_recalled_until = ?5 \
         WHERE id = ?1",
    )?;
    for (id, m) in &p.workspaces {
        ws.execute(params![id, m.balance_cents, m.held_cents, m.carry_microcents, m.leases_recalled_until])?;
        give_way();
    }
    let mut spend = tx.prepare_cached(
        "INSERT INTO key_month_spend (key_id, month, spent_microcents) VALUES (?1, ?2, ?3) \
         ON CONFLICT (key_id, month) DO UPDATE SET spent_microcents = spent_microcents + excluded.spent_microcents",
    )?;
    for (key, month, spent) in &p.key_spend {
        spend.execute(params![key, month, spent])?;
        give_way();
    }
    write_counters(tx, &p.plans)
}
