//! A batch's plan as the column arrays of the one `unnest` write statement
//! (`ledger/batch.rs`): one array per column, in the statement's parameter order.

use tokio_postgres::types::ToSql;

use crate::store::ledger::plan::Plan;
use crate::store::plan_rows::counter_values;

/// The plan as the columns of `WRITE` (one array per column).
#[derive(Default)]
pub(super) struct Columns<'a> {
    h_rid: Vec<&'a str>,
    h_ws: Vec<&'a str>,
    h_key: Vec<Option<&'a str>>,
    h_amount: Vec<i64>,
    h_state: Vec<&'a str>,
    h_expires: Vec<i64>,
    h_created: Vec<i64>,
    s_rid: Vec<&'a str>,
    s_state: Vec<&'a str>,
    /// A lease's new amount; `None` leaves the row's.
    s_amount: Vec<Option<i64>>,
    e_ws: Vec<&'a str>,
    e_kind: Vec<&'a str>,
    e_amount: Vec<i64>,
    e_rid: Vec<&'a str>,
    e_key: Vec<Option<&'a str>>,
    e_cost: Vec<Option<i64>>,
    e_created: Vec<i64>,
    w_id: Vec<&'a str>,
    w_balance: Vec<i64>,
    w_held: Vec<i64>,
    w_carry: Vec<i64>,
    w_recalled: Vec<i64>,
    k_key: Vec<&'a str>,
    k_month: Vec<&'a str>,
    k_spent: Vec<i64>,
    h_funding: Vec<&'a str>,
    h_value: Vec<i64>,
    p_ws: Vec<&'a str>,
    p_counters: [Vec<Option<i64>>; 15],
}

impl<'a> Columns<'a> {
    pub(super) fn of(p: &'a Plan) -> Columns<'a> {
        let mut c = Columns::default();
        for h in &p.new_holds {
            c.h_rid.push(&h.request_id);
            c.h_ws.push(&h.row.workspace_id);
            c.h_key.push(h.row.key_id.as_deref());
            c.h_amount.push(h.row.amount_cents);
            c.h_state.push(&h.row.state);
            c.h_expires.push(h.expires_at);
            c.h_created.push(h.created_at);
            c.h_funding.push(h.row.funding.as_str());
            c.h_value.push(h.row.value_microcents);
        }
        for (ws, counters) in &p.plans {
            c.p_ws.push(ws);
            for (col, v) in c.p_counters.iter_mut().zip(counter_values(counters)) {
                col.push(v);
            }
        }
        // One row per hold in the one UPDATE (two CTEs updating one row would keep only one
        // change): its new state and, for a lease, its new amount.
        let amount_of = |rid: &str| p.hold_amounts.iter().find(|(id, _)| id == rid).map(|(_, a)| *a);
        for (rid, state) in &p.hold_states {
            c.s_rid.push(rid);
            c.s_state.push(state);
            c.s_amount.push(amount_of(rid));
        }
        for (rid, amount) in p.hold_amounts.iter().filter(|(id, _)| !p.hold_states.iter().any(|(r, _)| r == id)) {
            c.s_rid.push(rid);
            c.s_state.push("open");
            c.s_amount.push(Some(*amount));
        }
        for e in &p.entries {
            c.e_ws.push(&e.workspace_id);
            c.e_kind.push(e.kind);
            c.e_amount.push(e.amount_cents);
            c.e_rid.push(&e.request_id);
            c.e_key.push(e.key_id.as_deref());
            c.e_cost.push(e.cost_microcents);
            c.e_created.push(e.created_at);
        }
        for (id, m) in &p.workspaces {
            c.w_id.push(id);
            c.w_balance.push(m.balance_cents);
            c.w_held.push(m.held_cents);
            c.w_carry.push(m.carry_microcents);
            c.w_recalled.push(m.leases_recalled_until);
        }
        for (key, month, spent) in &p.key_spend {
            c.k_key.push(key);
            c.k_month.push(month);
            c.k_spent.push(*spent);
        }
        c
    }

    pub(super) fn params(&self) -> [&(dyn ToSql + Sync); 43] {
        let pc = &self.p_counters;
        [
            &self.h_rid,
            &self.h_ws,
            &self.h_key,
            &self.h_amount,
            &self.h_state,
            &self.h_expires,
            &self.h_created,
            &self.s_rid,
            &self.s_state,
            &self.e_ws,
            &self.e_kind,
            &self.e_amount,
            &self.e_rid,
            &self.e_key,
            &self.e_cost,
            &self.e_created,
            &self.w_id,
            &self.w_balance,
            &self.w_held,
            &self.w_carry,
            &self.k_key,
            &self.k_month,
            &self.k_spent,
            &self.h_funding,
            &self.h_value,
            &self.p_ws,
            &pc[0],
            &pc[1],
            &pc[2],
            &pc[3],
            &pc[4],
            &pc[5],
            &pc[6],
            &pc[7],
            &pc[8],
            &pc[9],
            &pc[10],
            &pc[11],
            &pc[12],
            &pc[13],
            &pc[14],
            &self.s_amount,
            &self.w_recalled,
        ]
    }
}
