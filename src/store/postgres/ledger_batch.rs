//! A batch of ledger writes on PostgreSQL, in one transaction of two round trips whatever
//! its size (decision 129): begin, lock the workspace rows the batch touches (in id order, so
//! two gateway instances never deadlock) and read the batch's hold rows, settled request ids
//! and plans, all sent together; then write the plan of `ledger::plan::plan` in ONE statement of
//! `unnest` arrays (holds, hold states, entries, balances, key month spend) and commit, sent
//! together. Every change of a hold
//! or a balance takes the workspace row lock first (holds, settlements, releases and the
//! sweeper all come through here; top-ups and the credit expiry lock it too), so what the
//! batch read under the lock is what it writes over.

use std::sync::Arc;

use async_trait::async_trait;
use tokio_postgres::types::ToSql;

use crate::money::plans::decide::Funding;
use crate::runtime::clock::Millis;
use crate::store::StoreError;
use crate::store::ledger::Balance;
use crate::store::ledger::batch::LedgerWrites;
use crate::store::ledger::lease::{LeaseRow, balance_and_leases};
use crate::store::ledger::ops::{LedgerOp, OpResult};
use crate::store::ledger::plan::{HoldRow, Money, Snapshot, plan};
use crate::store::plan_rows::{all_columns, read_plan};
use crate::store::postgres::PostgresStore;
use crate::store::postgres::ledger_columns::Columns;

/// The batch's workspaces: those its ops name and those of its hold rows, as ONE array, so the
/// primary key finds them. Written as `id = ANY($1) OR id IN (SELECT ...)`, PostgreSQL
/// filtered every row of `workspaces` against the two (18 ms a batch at 100,000 workspaces).
const BATCH_WORKSPACES: &str = "$1::TEXT[] || ARRAY(SELECT workspace_id FROM holds WHERE request_id = ANY($2))";

/// The statement that locks a batch's workspaces (`$1`: workspace ids, `$2`: request ids).
pub fn lock_sql() -> &'static str {
    static SQL: std::sync::OnceLock<String> = std::sync::OnceLock::new();
    SQL.get_or_init(|| {
        format!(
            "SELECT id, balance_cents, held_cents, carry_microcents, leases_recalled_until FROM workspaces \
             WHERE id = ANY({BATCH_WORKSPACES}) ORDER BY id FOR UPDATE"
        )
    })
}

/// The locked workspaces' plans (the same set as [`lock_sql`]). A statement of its own, sent after
/// the lock and so run once it is held: joined
/// into the locking query, a row of `plans` would be read from the snapshot taken before the
/// wait for the lock (PostgreSQL re-fetches only the locked table's rows), and a plan
/// counted by the other gateway's batch would be missed.
fn plans_sql() -> &'static str {
    static SQL: std::sync::OnceLock<String> = std::sync::OnceLock::new();
    SQL.get_or_init(|| {
        format!("SELECT workspace_id, {} FROM plans WHERE workspace_id = ANY({BATCH_WORKSPACES})", all_columns())
    })
}
const HOLDS: &str = "SELECT request_id, workspace_id, key_id, amount_cents, state, funding, value_microcents, \
     created_at, entry_written FROM holds WHERE request_id = ANY($1)";
const SETTLED: &str = "SELECT request_id FROM ledger_entries WHERE kind = 'settlement' AND request_id = ANY($1)";
/// The batch's one write statement. Each `UPDATE ... FROM unnest(...)` also names its rows
/// with `= ANY(...)` on the key: joined only to the unnested arrays, PostgreSQL could hash
/// them and scan the whole table on every batch (decision 146); the key condition finds the
/// rows through the primary key at any size.
const WRITE: &str = "WITH \
     nh AS (INSERT INTO holds (request_id, workspace_id, key_id, amount_cents, state, expires_at, created_at, funding, value_microcents) \
            SELECT * FROM unnest($1::TEXT[], $2::TEXT[], $3::TEXT[], $4::BIGINT[], $5::TEXT[], $6::BIGINT[], $7::BIGINT[], $24::TEXT[], $25::BIGINT[])), \
     pc AS (UPDATE plans SET five_hour_start = u.c0, five_hour_used = u.c1, week_start = u.c2, week_used = u.c3, \
            day_start = u.c4, standby_used = u.c5, period_start = u.c6, period_used = u.c7, credits_month_start = u.c8, \
            credits_spent = u.c9, plan_pending = u.c10, standby_pending = u.c11, credits_pending = u.c12, \
            plan_running = u.c13, standby_running = u.c14 \
            FROM unnest($26::TEXT[], $27::BIGINT[], $28::BIGINT[], $29::BIGINT[], $30::BIGINT[], $31::BIGINT[], $32::BIGINT[], \
                        $33::BIGINT[], $34::BIGINT[], $35::BIGINT[], $36::BIGINT[], $37::BIGINT[], $38::BIGINT[], $39::BIGINT[], \
                        $40::BIGINT[], $41::BIGINT[]) AS u(ws, c0, c1, c2, c3, c4, c5, c6, c7, c8, c9, c10, c11, c12, c13, c14) \
            WHERE plans.workspace_id = ANY($26::TEXT[]) AND plans.workspace_id = u.ws), \
     hs AS (UPDATE holds SET state = u.state, amount_cents = COALESCE(u.amount, holds.amount_cents) \
            FROM unnest($8::TEXT[], $9::TEXT[], $42::BIGINT[]) AS u(rid, state, amount) \
            WHERE holds.request_id = ANY($8::TEXT[]) AND holds.request_id = u.rid), \
     le AS (INSERT INTO ledger_entries (workspace_id, kind, amount_cents, request_id, key_id, cost_microcents, created_at) \
            SELECT w, k, a, r, key, c, t \
            FROM unnest($10::TEXT[], $11::TEXT[], $12::BIGINT[], $13::TEXT[], $14::TEXT[], $15::BIGINT[], $16::BIGINT[]) \
            WITH ORDINALITY AS e(w, k, a, r, key, c, t, n) ORDER BY n), \
     ws AS (UPDATE workspaces SET balance_cents = u.b, held_cents = u.h, carry_microcents = u.c, leases_recalled_until = u.r \
            FROM unnest($17::TEXT[], $18::BIGINT[], $19::BIGINT[], $20::BIGINT[], $43::BIGINT[]) AS u(id, b, h, c, r) \
            WHERE workspaces.id = ANY($17::TEXT[]) AND workspaces.id = u.id) \
     INSERT INTO key_month_spend (key_id, month, spent_microcents) \
     SELECT * FROM unnest($21::TEXT[], $22::TEXT[], $23::BIGINT[]) \
     ON CONFLICT (key_id, month) DO UPDATE SET spent_microcents = key_month_spend.spent_microcents + EXCLUDED.spent_microcents";

struct Statements {
    lock: tokio_postgres::Statement,
    holds: tokio_postgres::Statement,
    settled: tokio_postgres::Statement,
    plans: tokio_postgres::Statement,
    write: tokio_postgres::Statement,
}

/// The batch's transaction in two round trips (decision 129): `BEGIN`, the lock and the three
/// reads are sent together (tokio-postgres sends a request when its future is first polled,
/// and `try_join!` polls them in order the first time), then the write and `COMMIT`.
async fn apply_in_transaction(
    c: &tokio_postgres::Client,
    st: &Statements,
    ops: &[LedgerOp],
) -> Result<Vec<OpResult>, tokio_postgres::Error> {
    // The hold rows that can exist: those of requests made earlier (settlements, releases)
    // and the leases that lease holds are placed from. A hold, funding or lease op names an
    // id this process just made, so it is not looked up (as on SQLite): a duplicate still
    // fails, on the primary key, and the batch is then retried op by op.
    let rids: Vec<&str> = ops
        .iter()
        .filter(|o| !o.is_fresh())
        .map(LedgerOp::request_id)
        .chain(ops.iter().filter_map(LedgerOp::lease_id))
        .collect();
    let settles: Vec<&str> =
        ops.iter().filter(|o| matches!(o, LedgerOp::Settle(_))).map(LedgerOp::request_id).collect();
    let mut wss: Vec<&str> = ops.iter().filter_map(LedgerOp::workspace_id).collect();
    wss.sort_unstable();
    wss.dedup();
    let by_workspace: [&(dyn ToSql + Sync); 2] = [&wss, &rids];
    let by_request: [&(dyn ToSql + Sync); 1] = [&rids];
    let by_settlement: [&(dyn ToSql + Sync); 1] = [&settles];
    let ((), lock_rows, hold_rows, settled_rows, plan_rows) = tokio::try_join!(
        c.batch_execute("BEGIN"),
        c.query(&st.lock, &by_workspace),
        c.query(&st.holds, &by_request),
        c.query(&st.settled, &by_settlement),
        c.query(&st.plans, &by_workspace)
    )?;
    let mut snap = Snapshot::default();
    for r in lock_rows {
        let money = Money {
            balance_cents: r.try_get(1)?,
            held_cents: r.try_get(2)?,
            carry_microcents: r.try_get(3)?,
            leases_recalled_until: r.try_get(4)?,
        };
        snap.workspaces.insert(r.try_get(0)?, money);
    }
    for r in plan_rows {
        match read_plan(&r, 1) {
            Ok(plan) => {
                snap.plans.insert(r.try_get(0)?, plan);
            }
            // Nothing is written: the transaction is rolled back.
            Err(e) => {
                c.batch_execute("ROLLBACK").await?;
                return Ok(ops.iter().map(|_| Err(StoreError::Unavailable(e.clone()))).collect());
            }
        }
    }
    for r in hold_rows {
        let row = HoldRow {
            workspace_id: r.try_get(1)?,
            key_id: r.try_get(2)?,
            amount_cents: r.try_get(3)?,
            state: r.try_get(4)?,
            funding: Funding::parse(r.try_get(5)?),
            value_microcents: r.try_get(6)?,
            created_at: r.try_get(7)?,
            entry_written: r.try_get(8)?,
        };
        snap.holds.insert(r.try_get(0)?, row);
    }
    for r in settled_rows {
        snap.settled.insert(r.try_get(0)?);
    }
    let plan = plan(ops, snap);
    let nothing = plan.entries.is_empty() && plan.workspaces.is_empty() && plan.new_holds.is_empty();
    if nothing && plan.plans.is_empty() && plan.hold_states.is_empty() && plan.hold_amounts.is_empty() {
        c.batch_execute("COMMIT").await?;
    } else {
        let columns = Columns::of(&plan);
        let params = columns.params();
        tokio::try_join!(c.execute(&st.write, &params), c.batch_execute("COMMIT"))?;
    }
    Ok(plan.outcomes)
}

/// A pooled connection inside the batch's transaction, which is opened with a plain `BEGIN`
/// (pipelined, decision 129) and so has no rollback of its own when its future is dropped.
/// Dropped before [`InTransaction::done`] (the call timed out), the connection leaves the pool
/// and closes, and PostgreSQL rolls the transaction back: it never goes back to the pool
/// still open, holding the workspace row lock for whoever takes it next.
struct InTransaction(Option<deadpool_postgres::Object>);

impl InTransaction {
    /// The transaction is over (committed or rolled back): back to the pool.
    fn done(mut self) {
        self.0.take();
    }
}

impl Drop for InTransaction {
    fn drop(&mut self) {
        if let Some(c) = self.0.take() {
            drop(deadpool_postgres::Object::take(c));
        }
    }
}

/// One batch in one transaction on `c`.
async fn apply_on(c: deadpool_postgres::Object, ops: Arc<[LedgerOp]>) -> Result<Vec<OpResult>, tokio_postgres::Error> {
    let (lock, holds, settled, plans, write) = tokio::try_join!(
        c.prepare_cached(lock_sql()),
        c.prepare_cached(HOLDS),
        c.prepare_cached(SETTLED),
        c.prepare_cached(plans_sql()),
        c.prepare_cached(WRITE)
    )?;
    let statements = Statements { lock, holds, settled, plans, write };
    let conn = InTransaction(Some(c));
    let Some(c) = conn.0.as_ref() else { return Ok(Vec::new()) };
    let outcome = apply_in_transaction(c, &statements, &ops).await;
    if outcome.is_err() {
        // An aborted or half-sent transaction must not go back to the pool open.
        let _ = c.batch_execute("ROLLBACK").await;
    }
    conn.done();
    outcome
}

#[async_trait]
impl LedgerWrites for PostgresStore {
    /// On the writer's thread, with its own connections (decision 151); elsewhere on the store
    /// runtime.
    async fn apply(&self, ops: Arc<[LedgerOp]>) -> Result<Vec<OpResult>, StoreError> {
        if crate::store::ledger::batch::on_writer_thread() {
            return self.on_writer(|c| apply_on(c, ops)).await;
        }
        self.with_client(move |c| apply_on(c, ops)).await
    }

    fn needs_io(&self) -> bool {
        true
    }

    async fn expired_holds(&self, now: Millis) -> Result<Vec<String>, StoreError> {
        self.with_client(move |c| async move {
            let st = c.prepare_cached("SELECT request_id FROM holds WHERE state = 'open' AND expires_at <= $1").await?;
            c.query(&st, &[&now]).await?.iter().map(|r| r.try_get(0)).collect()
        })
        .await
    }

    async fn balance_with_leases(&self, workspace_id: &str) -> Result<Option<(Balance, Vec<LeaseRow>)>, StoreError> {
        let ws = workspace_id.to_string();
        self.with_client(move |c| async move {
            // One statement, one snapshot: a lease granted or given back between two reads
            // would count twice or not at all.
            let st = c
                .prepare_cached(
                    "SELECT w.balance_cents, w.held_cents, w.carry_microcents, w.lifetime_purchases_cents, \
                            h.request_id, h.amount_cents, h.created_at \
                     FROM workspaces w LEFT JOIN holds h ON h.workspace_id = w.id AND h.state = 'open' \
                          AND left(h.request_id, 6) = 'lease_' \
                     WHERE w.id = $1",
                )
                .await?;
            let rows = c.query(&st, &[&ws]).await?;
            let rows = rows
                .iter()
                .map(|r| {
                    let b = Balance {
                        balance_cents: r.try_get(0)?,
                        held_cents: r.try_get(1)?,
                        carry_microcents: r.try_get(2)?,
                        lifetime_purchases_cents: r.try_get(3)?,
                    };
                    let lease = match r.try_get::<_, Option<String>>(4)? {
                        Some(id) => Some(LeaseRow { id, amount_cents: r.try_get(5)?, created_at: r.try_get(6)? }),
                        None => None,
                    };
                    Ok((b, lease))
                })
                .collect::<Result<Vec<_>, tokio_postgres::Error>>()?;
            Ok(balance_and_leases(rows))
        })
        .await
    }
}
