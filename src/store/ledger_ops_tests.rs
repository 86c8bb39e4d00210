use super::*;

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
    assert_eq!(p.workspaces, vec![("w".to_string(), Money { balance_cents: 0, held_cents: 10, carry_microcents: 0 })]);
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
    assert_eq!(p.workspaces[0].1, Money { balance_cents: 97, held_cents: 0, carry_microcents: 100_000 });
    assert_eq!(sum(&p), -3);
    assert_eq!(p.new_holds.len(), 1);
    assert_eq!(p.new_holds[0].row.state, "settled");
    assert!(p.hold_states.is_empty());
    assert_eq!(p.key_spend, vec![("k".to_string(), "2026-11".to_string(), 3_100_000)]);
}

#[test]
fn existing_holds_are_released_once_and_settled_requests_stay_settled() {
    let mut s = snap(50);
    s.workspaces.insert("w".into(), Money { balance_cents: 50, held_cents: 27, carry_microcents: 0 });
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
    assert_eq!(p.workspaces[0].1, Money { balance_cents: 77, held_cents: 0, carry_microcents: 0 });
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
