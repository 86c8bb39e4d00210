use super::*;
use crate::store::ledger::ops::*;

fn hold(rid: &str, amount: i64) -> LedgerOp {
    LedgerOp::Hold {
        request_id: rid.into(),
        workspace_id: "w".into(),
        key_id: Some("k".into()),
        amount_cents: amount,
        expires_at: 10,
        now: 1,
    }
}

fn settle(rid: &str, cost: u64) -> LedgerOp {
    LedgerOp::Settle(Settlement {
        request_id: rid.into(),
        workspace_id: "w".into(),
        key_id: Some("k".into()),
        cost: Microcents(cost),
        value: Microcents(cost),
        now: 2,
        month: "2026-11".into(),
    })
}

fn snap(balance: i64) -> Snapshot {
    let mut s = Snapshot::default();
    s.workspaces.insert("w".into(), Money { balance_cents: balance, ..Money::default() });
    s
}

fn sum(p: &Plan) -> i64 {
    p.entries.iter().map(|e| e.amount_cents).sum()
}

#[test]
fn holds_apply_in_order_against_the_running_balance() {
    let ops = [hold("a", 6), hold("b", 5), hold("c", 4), hold("d", 1)];
    let p = plan(&ops, snap(10));
    let placed: Vec<bool> =
        p.outcomes.iter().map(|o| matches!(o, Ok(OpOutcome::Hold(HoldOutcome::Placed { .. })))).collect();
    assert_eq!(placed, [true, false, true, false], "b does not fit after a; c does; nothing is left for d");
    assert_eq!(p.outcomes[1], Ok(OpOutcome::Hold(HoldOutcome::Insufficient { balance_cents: 4 })));
    // b's refusal recalls leases: the open holds (a's 6) and the balance (4) could cover it.
    let recalled =
        Money { balance_cents: 0, held_cents: 10, carry_microcents: 0, leases_recalled_until: 1 + LEASE_RECALL_MS };
    assert_eq!(p.workspaces, vec![("w".to_string(), recalled)]);
    assert!(p.entries.is_empty(), "a hold is recorded by its row, not an entry (decision 133)");
    assert_eq!(p.new_holds.len(), 2);
}

#[test]
fn settlement_is_once_with_the_carry_and_a_hold_settled_in_its_batch_is_written_once() {
    let ops = [hold("a", 3), settle("a", 2_500_000), settle("a", 2_500_000), settle("b", 600_000)];
    let p = plan(&ops, snap(100));
    assert_eq!(p.outcomes[1], Ok(OpOutcome::Settle(SettleOutcome::Settled { debit_cents: 2, balance_cents: 98 })));
    assert_eq!(p.outcomes[2], Ok(OpOutcome::Settle(SettleOutcome::AlreadySettled)));
    // Half a cent carried plus 0.6: one more cent, 0.1 carried.
    assert_eq!(p.outcomes[3], Ok(OpOutcome::Settle(SettleOutcome::Settled { debit_cents: 1, balance_cents: 97 })));
    assert_eq!(
        p.workspaces[0].1,
        Money { balance_cents: 97, held_cents: 0, carry_microcents: 100_000, ..Money::default() }
    );
    assert_eq!(sum(&p), -3);
    assert_eq!(p.new_holds.len(), 1);
    assert_eq!(p.new_holds[0].row.state, "settled");
    assert!(p.hold_states.is_empty());
    assert_eq!(p.key_spend, vec![("k".to_string(), "2026-11".to_string(), 3_100_000)]);
}

#[test]
fn existing_holds_are_released_once_and_settled_requests_stay_settled() {
    let mut s = snap(50);
    s.workspaces
        .insert("w".into(), Money { balance_cents: 50, held_cents: 27, carry_microcents: 0, ..Money::default() });
    let open = |amount| HoldRow {
        workspace_id: "w".into(),
        key_id: None,
        amount_cents: amount,
        state: "open".into(),
        funding: Funding::PayAsYouGo,
        value_microcents: 0,
        created_at: 0,
        entry_written: false,
    };
    // x was placed before migration 5 and wrote a `hold` entry; y was placed after.
    s.holds.insert("x".into(), HoldRow { entry_written: true, ..open(20) });
    s.holds.insert("y".into(), open(7));
    s.holds.insert("done".into(), HoldRow { state: "settled".into(), ..open(5) });
    s.settled.insert("done".into());
    let release = |rid: &str| LedgerOp::Release { request_id: rid.into(), now: 3 };
    let ops = [release("x"), release("x"), settle("done", 9_000_000), hold("done", 1), release("nope"), release("y")];
    let p = plan(&ops, s);
    assert_eq!(p.outcomes[0], Ok(OpOutcome::Release(true)));
    assert_eq!(p.outcomes[1], Ok(OpOutcome::Release(false)));
    assert_eq!(p.outcomes[2], Ok(OpOutcome::Settle(SettleOutcome::AlreadySettled)));
    assert!(matches!(p.outcomes[3], Err(StoreError::Conflict(_))), "a request id holds once");
    assert_eq!(p.outcomes[4], Ok(OpOutcome::Release(false)));
    assert_eq!(p.outcomes[5], Ok(OpOutcome::Release(true)));
    assert_eq!(p.hold_states, vec![("x".to_string(), "released"), ("y".to_string(), "released")]);
    assert_eq!(p.workspaces[0].1, Money { balance_cents: 77, held_cents: 0, carry_microcents: 0, ..Money::default() });
    // Only the old hold had an entry to balance: the new one was never in the entries.
    assert_eq!(sum(&p), 20);
    assert_eq!(p.entries.iter().map(|e| (e.request_id.as_str(), e.kind)).collect::<Vec<_>>(), [("x", "hold_release")]);
}

#[test]
fn an_unknown_workspace_is_refused_without_writing() {
    let p = plan(&[hold("a", 1), settle("a", 1)], Snapshot::default());
    assert_eq!(p.outcomes[0], Ok(OpOutcome::Hold(HoldOutcome::Insufficient { balance_cents: 0 })));
    assert!(matches!(p.outcomes[1], Err(StoreError::Conflict(_))));
    assert!(p.entries.is_empty() && p.workspaces.is_empty() && p.new_holds.is_empty());
}

fn grant(id: &str, want: i64, min: i64) -> LedgerOp {
    LedgerOp::LeaseGrant {
        lease_id: id.into(),
        workspace_id: "w".into(),
        want_cents: want,
        min_cents: min,
        expires_at: 10,
        now: 1,
    }
}

fn lease_hold(lease: &str, rid: &str, amount: i64) -> LedgerOp {
    LedgerOp::LeaseHold {
        lease_id: lease.into(),
        request_id: rid.into(),
        workspace_id: "w".into(),
        key_id: Some("k".into()),
        amount_cents: amount,
        expires_at: 10,
        now: 1,
    }
}

#[test]
fn a_lease_takes_at_most_an_eighth_of_the_balance_and_none_with_a_plan_or_below_its_minimum() {
    let p = plan(&[grant("L", 200, 16)], snap(800));
    assert_eq!(p.outcomes[0], Ok(OpOutcome::Lease(Some(100))), "an eighth of 800");
    assert_eq!(
        p.workspaces[0].1,
        Money { balance_cents: 700, held_cents: 100, carry_microcents: 0, ..Money::default() }
    );
    assert_eq!((p.new_holds[0].request_id.as_str(), p.new_holds[0].row.amount_cents), ("L", 100));
    assert!(p.entries.is_empty(), "a lease is an open hold row: no entry");
    let p = plan(&[grant("L", 200, 16)], snap(120));
    assert_eq!(p.outcomes[0], Ok(OpOutcome::Lease(None)), "15 cents is under the minimum of 16");
    assert!(p.new_holds.is_empty() && p.workspaces.is_empty());
    let mut with_plan = snap(100_000);
    let terms = crate::money::plans::PlanTerms {
        tier: crate::money::plans::Tier::Starter,
        status: crate::money::plans::Status::Active,
        started_at: 0,
        cancel_at: None,
        grace_until: None,
        credits_enabled: false,
        cap_cents: None,
        pending_tier: None,
        pending_effective_at: None,
    };
    let record = crate::money::plans::PlanRecord { terms, counters: crate::money::plans::Counters::starting(0) };
    with_plan.plans.insert("w".into(), record);
    let p = plan(&[grant("L", 200, 16)], with_plan);
    assert_eq!(p.outcomes[0], Ok(OpOutcome::Lease(None)), "a plan's decision needs the ledger every time");
}

#[test]
fn a_hold_from_a_lease_moves_the_amount_and_the_balance_stays_the_sum_of_entries_less_open_holds() {
    let mut s = snap(700);
    s.workspaces
        .insert("w".into(), Money { balance_cents: 700, held_cents: 100, carry_microcents: 0, ..Money::default() });
    s.holds.insert(
        "L".into(),
        HoldRow {
            workspace_id: "w".into(),
            key_id: None,
            amount_cents: 100,
            state: "open".into(),
            funding: Funding::PayAsYouGo,
            value_microcents: 0,
            created_at: 0,
            entry_written: false,
        },
    );
    let ops = [lease_hold("L", "a", 30), settle("a", 20_000_000), lease_hold("L", "b", 25)];
    let p = plan(&ops, s.clone());
    assert_eq!(p.outcomes[0], Ok(OpOutcome::Hold(HoldOutcome::Placed { balance_cents: 700 })));
    // a's 30 left the lease and was settled at 20; b's 25 left the lease and is held.
    assert_eq!(
        p.workspaces[0].1,
        Money { balance_cents: 710, held_cents: 70, carry_microcents: 0, ..Money::default() }
    );
    assert_eq!(p.hold_amounts, vec![("L".to_string(), 45)]);
    let rows: Vec<_> =
        p.new_holds.iter().map(|h| (h.request_id.as_str(), h.row.amount_cents, h.row.state.as_str())).collect();
    assert_eq!(rows, [("a", 30, "settled"), ("b", 25, "open")]);
    // Stored 710 = 800 (entries before) - 20 (a's settlement) - 45 (L) - 25 (b).
    assert_eq!(800 + sum(&p) - 45 - 25, 710);
    // The lease given back in the same batch: its row is released with what was left.
    let p = plan(&[lease_hold("L", "a", 30), LedgerOp::Release { request_id: "L".into(), now: 2 }], s.clone());
    assert_eq!(p.outcomes[1], Ok(OpOutcome::Release(true)));
    assert_eq!(
        p.workspaces[0].1,
        Money { balance_cents: 770, held_cents: 30, carry_microcents: 0, ..Money::default() }
    );
    assert_eq!(p.hold_states, vec![("L".to_string(), "released")]);
    assert_eq!(p.hold_amounts, vec![("L".to_string(), 70)]);
}

#[test]
fn a_hold_from_a_lease_that_is_gone_is_written_anyway_against_the_balance() {
    // The lease expired and was swept before its hold's row came: the request is running, so
    // the hold is placed even though the balance (5) does not cover it.
    let p = plan(&[lease_hold("L", "a", 30)], snap(5));
    assert_eq!(p.outcomes[0], Ok(OpOutcome::Hold(HoldOutcome::Placed { balance_cents: -25 })));
    assert_eq!(
        p.workspaces[0].1,
        Money { balance_cents: -25, held_cents: 30, carry_microcents: 0, ..Money::default() }
    );
    assert!(p.hold_amounts.is_empty());
    let dup = plan(&[lease_hold("L", "a", 1), lease_hold("L", "a", 1)], snap(5));
    assert!(matches!(dup.outcomes[1], Err(StoreError::Conflict(_))), "a request id holds once");
}

/// Decision 191: a hold refused while the open holds could cover it stops leases for a while,
/// written once per half recall; a refusal no hold could help writes nothing.
#[test]
fn a_refusal_the_holds_could_cover_recalls_leases_and_one_nobody_could_writes_nothing() {
    let mut s = snap(30);
    s.workspaces.insert("w".into(), Money { balance_cents: 30, held_cents: 100, ..Money::default() });
    let p = plan(&[hold("big", 120), grant("L", 80, 16)], s.clone());
    assert_eq!(p.outcomes[0], Ok(OpOutcome::Hold(HoldOutcome::Insufficient { balance_cents: 30 })));
    assert_eq!(p.outcomes[1], Ok(OpOutcome::Lease(None)), "no lease while recalled");
    assert_eq!(
        p.workspaces,
        vec![("w".to_string(), Money { leases_recalled_until: 1 + LEASE_RECALL_MS, ..s.workspaces["w"] })]
    );
    assert!(p.new_holds.is_empty());
    // Refused again soon after: the recall stands, nothing is written.
    let mut again = s.clone();
    again.workspaces.get_mut("w").unwrap().leases_recalled_until = 1 + LEASE_RECALL_MS;
    let p = plan(&[hold("big", 120)], again.clone());
    assert!(p.workspaces.is_empty(), "{:?}", p.workspaces);
    // Once it has run out, a lease is granted again.
    let LedgerOp::LeaseGrant { lease_id, workspace_id, want_cents, min_cents, expires_at, .. } = grant("L", 16, 1)
    else {
        unreachable!()
    };
    let later =
        LedgerOp::LeaseGrant { lease_id, workspace_id, want_cents, min_cents, expires_at, now: 2 + LEASE_RECALL_MS };
    assert_eq!(plan(&[later], again).outcomes[0], Ok(OpOutcome::Lease(Some(3))), "an eighth of 30");
    // More than the balance and every hold: no lease keeps it, so nothing is recalled.
    let p = plan(&[hold("huge", 131)], s);
    assert_eq!(p.outcomes[0], Ok(OpOutcome::Hold(HoldOutcome::Insufficient { balance_cents: 30 })));
    assert!(p.workspaces.is_empty());
}
