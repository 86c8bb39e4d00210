//! Holds taken from leases (decisions 187, 190, 191): exact ledgers, and two instances on one store.

use super::*;

/// Holds taken from leases (decision 187) on both backends: waves of concurrent requests,
/// funded and settled; once the leases are given back nothing stays held and the stored
/// balance is the sum of the entries and exactly the initial credit less the settled costs.
/// `leased`: the store runs group commit, so the leases must have been used.
async fn holds_from_leases_keep_the_ledger_exact(s: Stores, leased: bool) {
    let ws = workspace(&s).await;
    let l: Arc<dyn LedgerStore> = s.ledger.clone();
    l.top_up(&ws, 1_000_000, "purchase", None, now_ms()).await.unwrap();
    let mut most_leased = 0;
    for wave in 0..8 {
        let requests: Vec<_> = (0..50)
            .map(|i| {
                let (l, ws) = (l.clone(), ws.clone());
                tokio::spawn(async move {
                    let rid = format!("lq_{wave}_{i}");
                    let funded = l.fund(fund_op(&ws, &rid, 7, now_ms() + 60_000)).await.unwrap();
                    assert_eq!(funded.verdict, Ok(Funding::PayAsYouGo));
                    let settled = l.settle(&settlement(&ws, &rid, 3_300_000)).await.unwrap();
                    assert!(matches!(settled, SettleOutcome::Settled { .. }), "{settled:?}");
                })
            })
            .collect();
        for r in requests {
            r.await.unwrap();
        }
        most_leased = most_leased.max(l.leased_cents(&ws));
    }
    assert_eq!(leased, most_leased > 0, "leases used: {most_leased} cents unused at most");
    // Given back within a second of their last use.
    tokio::time::sleep(tollgate::store::ledger::lease::LEASE_USE).await;
    let mut b = l.balance(&ws).await.unwrap().unwrap();
    for _ in 0..100 {
        if b.held_cents == 0 {
            break;
        }
        tokio::time::sleep(std::time::Duration::from_millis(20)).await;
        b = l.balance(&ws).await.unwrap().unwrap();
    }
    assert_eq!(l.leased_cents(&ws), 0);
    // 400 settlements of 3.3 cents: 1,320 cents, whatever the carry's order.
    assert_eq!((b.balance_cents, b.held_cents), (1_000_000 - 1_320, 0));
    assert_eq!(l.derived_balance(&ws).await.unwrap(), b.balance_cents);
    assert!(l.expired_holds(i64::MAX).await.unwrap().is_empty(), "no hold row open, leases' included");
}

mod holds_from_leases_keep_the_ledger_exact {
    #[tokio::test(flavor = "multi_thread", worker_threads = 2)]
    async fn sqlite() {
        super::holds_from_leases_keep_the_ledger_exact(super::sqlite().await, true).await
    }
    #[tokio::test(flavor = "multi_thread", worker_threads = 2)]
    async fn postgres() {
        super::holds_from_leases_keep_the_ledger_exact(super::postgres().await, true).await
    }
    #[tokio::test(flavor = "multi_thread", worker_threads = 2)]
    async fn sqlite_unbatched() {
        super::holds_from_leases_keep_the_ledger_exact(super::sqlite_unbatched().await, false).await
    }
    #[tokio::test(flavor = "multi_thread", worker_threads = 2)]
    async fn postgres_unbatched() {
        super::holds_from_leases_keep_the_ledger_exact(super::postgres_unbatched().await, false).await
    }
}

two_instances!(another_instances_unused_lease_reads_as_balance, a_refused_hold_recalls_the_other_instances_lease);

/// Two instances on one store (decision 190): each reads the balance as if there were no
/// leases, the other instance's unused lease counted as balance (before, it showed as held
/// for up to a second); a lease row whose instance stopped renewing it (older than
/// `LEASE_LIVE`) is money nobody can spend until it is swept, so it stays held.
async fn another_instances_unused_lease_reads_as_balance(a: Stores, b: Stores) {
    use tollgate::store::ledger::ops::LedgerOp;
    let ws = workspace(&a).await;
    let (la, lb): (Arc<dyn LedgerStore>, Arc<dyn LedgerStore>) = (a.ledger.clone(), b.ledger.clone());
    la.top_up(&ws, 1_000_000, "purchase", None, now_ms()).await.unwrap();
    // Instance A admits one request through the ledger, is granted a lease, and takes five
    // more holds from it; all six stay in flight (42 cents held by requests).
    la.fund(fund_op(&ws, "two_0", 7, now_ms() + 60_000)).await.unwrap();
    for _ in 0..200 {
        if la.leased_cents(&ws) > 0 {
            break;
        }
        tokio::time::sleep(std::time::Duration::from_millis(10)).await;
    }
    assert!(la.leased_cents(&ws) > 0, "instance A holds a lease");
    for i in 1..6 {
        let funded = la.fund(fund_op(&ws, &format!("two_{i}"), 7, now_ms() + 60_000)).await.unwrap();
        assert_eq!(funded.verdict, Ok(Funding::PayAsYouGo));
    }
    let shown = async |l: &Arc<dyn LedgerStore>| l.balance_shown(&ws).await.unwrap().unwrap();
    let a_view = shown(&la).await;
    assert_eq!((a_view.balance_cents, a_view.held_cents), (1_000_000 - 42, 42), "A, from memory at once");
    // B sees A's lease row once A's lease holds are written (a settlement linger later).
    let mut b_view = shown(&lb).await;
    for _ in 0..200 {
        if b_view.held_cents == 42 {
            break;
        }
        tokio::time::sleep(std::time::Duration::from_millis(10)).await;
        b_view = shown(&lb).await;
    }
    assert!(lb.balance(&ws).await.unwrap().unwrap().held_cents > 42, "the store holds A's lease");
    assert_eq!((b_view.balance_cents, b_view.held_cents), (1_000_000 - 42, 42), "B: A's unused lease is balance");
    // A lease row of an instance that stopped ten seconds ago stays held on both.
    let now = now_ms();
    let dead = LedgerOp::LeaseGrant {
        lease_id: "lease_00000000000000000000000000000001".into(),
        workspace_id: ws.clone(),
        want_cents: 5_000,
        min_cents: 1,
        expires_at: now + 60_000,
        now: now - 10_000,
    };
    assert!(matches!(lb.submit(dead).await.unwrap(), tollgate::store::ledger::ops::OpOutcome::Lease(Some(5_000))));
    for l in [&la, &lb] {
        let v = shown(l).await;
        assert_eq!((v.balance_cents, v.held_cents), (1_000_000 - 42 - 5_000, 42 + 5_000));
    }
    // Settled, given back and swept: the audit holds.
    for i in 0..6 {
        la.settle(&settlement(&ws, &format!("two_{i}"), 7_000_000)).await.unwrap();
    }
    la.give_back_leases().await;
    lb.release_hold("lease_00000000000000000000000000000001", now_ms()).await.unwrap();
    let end = lb.balance(&ws).await.unwrap().unwrap();
    assert_eq!((end.balance_cents, end.held_cents), (1_000_000 - 42, 0));
    assert_eq!(lb.derived_balance(&ws).await.unwrap(), end.balance_cents);
    assert_eq!(lb.balance_and_unused_leases(&ws).await.unwrap(), Some((end, 0)));
}

/// Decision 191: a hold the stored balance refuses while another instance's lease keeps the
/// money it needs recalls the leases: that instance's renewal is refused, and once it has
/// given its lease back the same hold, asked again, is placed. Without the recall a busy
/// instance renews its lease for as long as it is busy, and the hold is refused throughout.
async fn a_refused_hold_recalls_the_other_instances_lease(a: Stores, b: Stores) {
    use tollgate::store::ledger::ops::{LedgerOp, OpOutcome};
    let ws = workspace(&a).await;
    let (la, lb): (Arc<dyn LedgerStore>, Arc<dyn LedgerStore>) = (a.ledger.clone(), b.ledger.clone());
    la.top_up(&ws, 10_000, "purchase", None, now_ms()).await.unwrap();
    let start = la.balance(&ws).await.unwrap().unwrap().balance_cents;
    la.fund(fund_op(&ws, "rc_0", 7, now_ms() + 60_000)).await.unwrap();
    for _ in 0..200 {
        if la.leased_cents(&ws) > 0 {
            break;
        }
        tokio::time::sleep(std::time::Duration::from_millis(10)).await;
    }
    assert_eq!(la.leased_cents(&ws), (start - 7) / 8, "instance A holds an eighth of the balance");
    // B asks for all the balance shows: the lease keeps an eighth of it from the store.
    let all = start - 7;
    let refused = lb.fund(fund_op(&ws, "rc_big", all, now_ms() + 60_000)).await.unwrap();
    assert!(matches!(refused.verdict, Err(FundRefusal::Insufficient { .. })), "{refused:?}");
    // A's next grant (its renewal) is refused while the recall stands.
    let renewal = LedgerOp::LeaseGrant {
        lease_id: "lease_00000000000000000000000000000002".into(),
        workspace_id: ws.clone(),
        want_cents: 700,
        min_cents: 1,
        expires_at: now_ms() + 60_000,
        now: now_ms(),
    };
    assert_eq!(la.submit(renewal).await.unwrap(), OpOutcome::Lease(None), "no lease while recalled");
    // A gives its lease back (at the end of its second, or now); asked again, B's hold fits.
    assert_eq!(la.give_back_leases().await, 1);
    let placed = lb.fund(fund_op(&ws, "rc_big", all, now_ms() + 60_000)).await.unwrap();
    assert_eq!(placed.verdict, Ok(Funding::PayAsYouGo));
    la.settle(&settlement(&ws, "rc_0", 7_000_000)).await.unwrap();
    lb.settle(&settlement(&ws, "rc_big", 1_000_000)).await.unwrap();
    lb.give_back_leases().await;
    let end = lb.balance(&ws).await.unwrap().unwrap();
    assert_eq!((end.balance_cents, end.held_cents), (start - 8, 0));
    assert_eq!(lb.derived_balance(&ws).await.unwrap(), end.balance_cents);
}
