//! The scenarios, one at a time: each fault under streaming load, then the report and the checks.

use super::*;

/// One scenario at a time: each already loads both cores.
static ONE_AT_A_TIME: tokio::sync::Mutex<()> = tokio::sync::Mutex::const_new(());

/// Run `fault` under load on `f`, then report and check.
async fn run(name: &str, f: &mut Fleet, leaves: usize, mocks_in_flight: &[&Mock], fault: impl AsyncFnOnce(&mut Fleet)) {
    let _one = ONE_AT_A_TIME.lock().await;
    let sz = size();
    let stop = Arc::new(AtomicBool::new(false));
    let fault_at = Arc::new(Mutex::new(None));
    let (tally, tasks) = clients(f, sz.clients, leaves, stop.clone(), fault_at.clone());
    tokio::time::sleep(sz.before).await;
    *fault_at.lock().unwrap() = Some(Instant::now());
    let faulted = Instant::now();
    fault(f).await;
    tokio::time::sleep(sz.after).await;
    stop.store(true, Ordering::SeqCst);
    for t in tasks {
        t.await.unwrap();
    }
    let (requests, recover_ms, outcomes, hung) = {
        let t = tally.lock().unwrap();
        let recover_ms = t.recovered_at.map(|at| at.saturating_duration_since(faulted).as_millis());
        (t.outcomes.values().sum::<usize>(), recover_ms, format!("{:?}", t.outcomes), t.hung)
    };
    // During the scenario, the replicas never saw more of the workspace's requests at once than
    // its limit (measured where clients do not leave: a left stream's replica request ends a
    // moment after its slot is freed).
    let mut limits = Ok(String::new());
    for m in mocks_in_flight {
        let seen = m.stats().await["max_in_flight"].as_u64().unwrap_or(0);
        if seen > LIMIT {
            limits = Err(format!("a replica saw {seen} requests at once, limit {LIMIT}"));
        }
    }
    let limits = match limits {
        Ok(_) => limits_after(f).await,
        e => e,
    };
    let audit = audit(f).await;
    let show = |r: &Result<String, String>| match r {
        Ok(s) => format!("pass ({s})"),
        Err(s) => format!("FAIL ({s})"),
    };
    eprintln!(
        "chaos: scenario={name} requests={requests} outcomes={outcomes} hung={hung} recover_ms={} audit={} limits={}",
        recover_ms.map_or("never".to_string(), |m| m.to_string()),
        show(&audit),
        show(&limits)
    );
    assert_eq!(hung, 0, "{name}: requests hung: {outcomes}");
    assert!(recover_ms.is_some(), "{name}: no request succeeded after the fault: {outcomes}");
    assert!(audit.is_ok() && limits.is_ok(), "{name}: audit {audit:?}, limits {limits:?}");
    for g in &f.gateways {
        assert!(!g.log().contains("panicked"), "{name}: a gateway panicked: {}", g.log());
    }
}

#[tokio::test(flavor = "multi_thread", worker_threads = 4)]
async fn an_instance_killed_mid_stream() {
    let mock = Mock::start();
    let mut f = fleet(&[&mock], "").await;
    run("instance_sigkill", &mut f, 0, &[], async |f: &mut Fleet| {
        f.alive[0].store(false, Ordering::SeqCst);
        f.gateways[0].kill();
    })
    .await;
}

#[tokio::test(flavor = "multi_thread", worker_threads = 4)]
async fn redis_restarted_under_streaming_load() {
    let mock = Mock::start();
    let mut f = fleet(&[&mock], "").await;
    run("redis_restart", &mut f, 0, &[&mock], async |f: &mut Fleet| {
        let port = f.redis.port;
        f.redis.kill();
        tokio::time::sleep(size().outage).await;
        f.redis = RedisChild::start(port).await;
    })
    .await;
}

#[tokio::test(flavor = "multi_thread", worker_threads = 4)]
async fn postgres_restarted_under_load() {
    let mock = Mock::start();
    let mut f = fleet(&[&mock], "").await;
    run("postgres_restart", &mut f, 0, &[&mock], async |f: &mut Fleet| {
        f.pg_switch.off();
        tokio::time::sleep(size().outage).await;
        f.pg_switch.on();
    })
    .await;
}

#[tokio::test(flavor = "multi_thread", worker_threads = 4)]
async fn a_replica_killed_and_another_frozen_mid_stream() {
    let (dying, freezing, healthy) = (Mock::start(), Mock::start(), Mock::start());
    let checks = "    health_check: { path: /health, interval_ms: 500, timeout_ms: 300, unhealthy_after: 2, healthy_after: 2 }\n";
    let mut f = fleet(&[&healthy, &dying, &freezing], checks).await;
    let dying = Arc::new(Mutex::new(Some(dying)));
    let frozen = Arc::new(freezing);
    let (d, z) = (dying.clone(), frozen.clone());
    run("replica_kill_and_freeze", &mut f, 0, &[], async move |_f: &mut Fleet| {
        drop(d.lock().unwrap().take()); // SIGKILL: its streams are cut mid-way
        z.signal(libc::SIGSTOP);
        // The frozen replica's streams end with the response budget's error frame.
        tokio::time::sleep(Duration::from_secs(RESPONSE_SECONDS + 2)).await;
    })
    .await;
    frozen.signal(libc::SIGCONT);
}

#[tokio::test(flavor = "multi_thread", worker_threads = 4)]
async fn clients_leaving_mid_stream() {
    let mock = Mock::start();
    let mut f = fleet(&[&mock], "").await;
    let leaving = size().clients / 2;
    run("clients_leaving", &mut f, leaving, &[], async |_f: &mut Fleet| {}).await;
}
