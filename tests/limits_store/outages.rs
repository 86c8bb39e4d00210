//! The outage fallback against a redis-server child that the test stalls, kills and restarts.

use super::*;

#[derive(Default)]
struct Traffic {
    shared: AtomicUsize,
    local: AtomicUsize,
    unavailable: AtomicUsize,
    slowest_ms: AtomicU64,
}

/// Poll until both gateways count in the shared store again.
async fn until_shared(gateways: &[Arc<FallbackLimiter>], within: Duration) {
    let deadline = Instant::now() + within;
    for f in gateways {
        loop {
            let out = f.check(&windows(now_ms(), vec![window(&uniq("probe"), 10)])).await.unwrap();
            if out.counting == Counting::Shared {
                break;
            }
            assert!(Instant::now() < deadline, "shared counting did not resume within {within:?}");
            tokio::time::sleep(Duration::from_millis(50)).await;
        }
    }
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn an_outage_counts_locally_without_hanging_and_shared_counting_resumes() {
    const BOUND: Duration = Duration::from_millis(1_500);
    let mut server = RedisChild::start(RedisChild::free_port()).await;
    let opts =
        || RedisOptions { prefix: "tollgate".into(), timeout: Duration::from_millis(300), ..RedisOptions::default() };
    let fb = FallbackOptions { retry_shared_after_ms: 200 };
    let gateway = || Arc::new(FallbackLimiter::new(Arc::new(RedisLimiter::new(&server.url(), opts()).unwrap()), fb));
    let gateways = [gateway(), gateway()];
    until_shared(&gateways, Duration::from_secs(5)).await;

    // Healthy: one window across both gateways.
    let k = uniq("key");
    let shared = |f: usize, limit: u64| {
        let (f, k) = (gateways[f].clone(), k.clone());
        async move { f.check(&windows(now_ms(), vec![window(&k, limit)])).await.unwrap() }
    };
    for f in [0, 1, 0, 1] {
        let out = shared(f, 4).await;
        assert_eq!(out.counting, Counting::Shared);
        assert!(matches!(out.verdict, Verdict::Admitted { .. }));
    }
    assert!(matches!(shared(0, 4).await.verdict, Verdict::WindowRefused { .. }));

    // Traffic from both gateways through every phase: windows-only and gated checks, each timed.
    let stop = Arc::new(AtomicBool::new(false));
    let traffic = Arc::new(Traffic::default());
    let gate_key = uniq("model");
    let mut tasks = Vec::new();
    for i in 0..8 {
        let (f, stop, traffic, gate_key) = (gateways[i % 2].clone(), stop.clone(), traffic.clone(), gate_key.clone());
        tasks.push(tokio::spawn(async move {
            let key = uniq("key");
            while !stop.load(Ordering::SeqCst) {
                let c = if i < 4 {
                    windows(now_ms(), vec![window(&key, 1_000_000)])
                } else {
                    let lease = uuid::Uuid::new_v4().to_string();
                    Check { lease_ttl_ms: 60_000, ..gates(now_ms(), &lease, vec![gate("m", &gate_key, 1_000_000)]) }
                };
                let started = Instant::now();
                let out = f.check(&c).await;
                traffic.slowest_ms.fetch_max(started.elapsed().as_millis() as u64, Ordering::SeqCst);
                match out {
                    Ok(Outcome { counting: Counting::Shared, verdict: Verdict::Admitted { lease, .. } }) => {
                        traffic.shared.fetch_add(1, Ordering::SeqCst);
                        if let Some(lease) = lease {
                            // A failed release leaves the lease to its TTL; the end check allows none.
                            while f.release(&lease).await.is_err() {
                                tokio::time::sleep(Duration::from_millis(50)).await;
                            }
                        }
                    }
                    Ok(Outcome { counting: Counting::Local, verdict: Verdict::Admitted { .. } }) => {
                        traffic.local.fetch_add(1, Ordering::SeqCst);
                    }
                    Err(LimiterError::Unavailable(_) | LimiterError::Recovering { .. }) => {
                        _ = traffic.unavailable.fetch_add(1, Ordering::SeqCst)
                    }
                    other => panic!("unexpected {other:?}"),
                }
                tokio::time::sleep(Duration::from_millis(5)).await;
            }
        }));
    }
    tokio::time::sleep(Duration::from_millis(300)).await;

    // (1) The store hangs (SIGSTOP): calls time out and count locally; gated calls are refused.
    let raw = RedisLimiter::new(&server.url(), opts()).unwrap();
    raw.ping().await.unwrap();
    let ghost = uniq("ws");
    let one = |lease: &str| gates(now_ms(), lease, vec![gate("workspace", &ghost, 1)]);
    server.signal(libc::SIGSTOP);
    let started = Instant::now();
    assert!(matches!(raw.check(&one("stalled")).await, Err(LimiterError::Unavailable(_))));
    assert!(started.elapsed() < BOUND);
    tokio::time::sleep(Duration::from_millis(1_000)).await;
    let out = gateways[0].check(&windows(now_ms(), vec![window(&uniq("key"), 5)])).await.unwrap();
    assert_eq!(out.counting, Counting::Local);
    server.signal(libc::SIGCONT);
    until_shared(&gateways, Duration::from_secs(5)).await;
    // The stalled check ran when the store woke up; its lease was released right behind it.
    let deadline = Instant::now() + Duration::from_secs(3);
    loop {
        match raw.check(&one(&uuid::Uuid::new_v4().to_string())).await.unwrap() {
            Verdict::Admitted { .. } => break,
            v => assert!(Instant::now() < deadline, "the stalled check's lease is still held: {v:?}"),
        }
        tokio::time::sleep(Duration::from_millis(50)).await;
    }

    // (2) The store dies (SIGKILL): a fresh key gets exactly its limit in this server's window.
    server.kill();
    tokio::time::sleep(Duration::from_millis(500)).await;
    let (k2, now) = (uniq("key"), now_ms());
    for i in 0..4 {
        let out = gateways[1].check(&windows(now, vec![window(&k2, 3)])).await.unwrap();
        assert_eq!(out.counting, Counting::Local);
        assert_eq!(matches!(out.verdict, Verdict::Admitted { .. }), i < 3, "{out:?}");
    }
    let g = gates(now, "x", vec![gate("m", &gate_key, 10)]);
    assert!(matches!(gateways[1].check(&g).await, Err(LimiterError::Unavailable(_))));
    tokio::time::sleep(Duration::from_millis(700)).await;

    // (3) The store is back (empty: no persistence): shared counting resumes on both gateways.
    let port = server.port;
    let _server = RedisChild::start(port).await;
    until_shared(&gateways, Duration::from_secs(10)).await;
    tokio::time::sleep(Duration::from_millis(300)).await;
    stop.store(true, Ordering::SeqCst);
    for task in tasks {
        task.await.unwrap();
    }
    let k3 = uniq("key");
    for (f, admitted) in [(0, true), (1, true), (0, false)] {
        let out = gateways[f].check(&windows(now_ms(), vec![window(&k3, 2)])).await.unwrap();
        assert_eq!((out.counting, matches!(out.verdict, Verdict::Admitted { .. })), (Counting::Shared, admitted));
    }

    let t = &traffic;
    let (shared, local, unavailable) =
        (t.shared.load(Ordering::SeqCst), t.local.load(Ordering::SeqCst), t.unavailable.load(Ordering::SeqCst));
    let slowest = Duration::from_millis(t.slowest_ms.load(Ordering::SeqCst));
    eprintln!("outage traffic: {shared} shared, {local} local, {unavailable} unavailable, slowest call {slowest:?}");
    assert!(shared > 0 && local > 0 && unavailable > 0);
    assert!(slowest < BOUND, "a call took {slowest:?}");
}

/// Decision 202 (issue 48): Redis restarted without persistence loses every gate set. The
/// running requests' leases are registered again by their keepers, and no gated check is
/// admitted before they are: two gateways hold 3 of a gate's 4 slots, Redis restarts, and
/// from then on exactly one more is admitted, never four.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn after_a_store_restart_running_leases_count_again_before_anything_is_admitted() {
    use tollgate::state::limits::LeaseKeeper;
    let port = RedisChild::free_port();
    let mut server = RedisChild::start(port).await;
    let opts =
        || RedisOptions { prefix: "tollgate".into(), timeout: Duration::from_millis(300), ..RedisOptions::default() };
    let fb = FallbackOptions { retry_shared_after_ms: 200 };
    let gateway = || Arc::new(FallbackLimiter::new(Arc::new(RedisLimiter::new(&server.url(), opts()).unwrap()), fb));
    let gateways = [gateway(), gateway()];
    let keepers = gateways.clone().map(|g| LeaseKeeper::new(g, Duration::from_secs(30)));
    let ws = uniq("ws");
    let one = |id: &str| Check { lease_ttl_ms: 30_000, ..gates(now_ms(), id, vec![gate("workspace", &ws, 4)]) };
    let mut running = Vec::new();
    for (i, id) in ["a", "b", "c"].into_iter().enumerate() {
        let out = gateways[i % 2].check(&one(id)).await.unwrap();
        let Verdict::Admitted { lease: Some(lease), .. } = out.verdict else { panic!("{out:?}") };
        running.push(keepers[i % 2].hold(lease));
    }
    // Let each keeper read the store's epoch once before the restart.
    tokio::time::sleep(Duration::from_millis(1_500)).await;
    server.kill();
    let _server = RedisChild::start(port).await;
    let restarted = Instant::now();
    // From the restart on: a gated check is either refused (recovering, or the gate full) or
    // admitted while the three running leases count; at most one is admitted in all.
    let mut admitted = Vec::new();
    let mut recovering = 0;
    while restarted.elapsed() < Duration::from_secs(8) {
        let id = uuid::Uuid::new_v4().to_string();
        match gateways[admitted.len() % 2].check(&one(&id)).await {
            Ok(Outcome { verdict: Verdict::Admitted { lease: Some(l), gates_in_use, .. }, .. }) => {
                assert_eq!(gates_in_use, vec![4], "admitted beside the three running requests");
                admitted.push(l);
            }
            Ok(Outcome { verdict: Verdict::GateRefused { in_use, .. }, .. }) => assert!(in_use >= 4, "{in_use}"),
            Err(LimiterError::Recovering { retry_after_ms }) => {
                assert!(retry_after_ms <= 3_000);
                recovering += 1;
            }
            Err(LimiterError::Unavailable(_)) => {} // reconnecting
            other => panic!("unexpected {other:?}"),
        }
        tokio::time::sleep(Duration::from_millis(50)).await;
    }
    assert!(recovering > 0, "gated checks waited for the recovery");
    assert_eq!(admitted.len(), 1, "one slot was free: {admitted:?}");
    for held in running {
        held.release().await;
    }
}
