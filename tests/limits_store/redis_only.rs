//! Redis only: a check carrying the queued releases, and v1 and v2 gateways sharing a window.

use super::*;

/// On Redis a check sends the releases queued before it and clears them once Redis answers.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_redis_check_carries_the_queued_releases() {
    let r = RedisLimiter::new(
        &redis_url(),
        RedisOptions { prefix: "tollgate-test".into(), timeout: Duration::from_secs(5), ..RedisOptions::default() },
    )
    .unwrap();
    let (g1, g2) = (uniq("key"), uniq("ws"));
    let t = t0();
    let two = |id: &str| gates(t, id, vec![gate("per_key", &g1, 1), gate("workspace", &g2, 1)]);
    let (x, _) = admitted_lease(r.check(&two("x")).await.unwrap());
    r.release_deferred(&x).await.unwrap();
    let (_, in_use) = admitted_lease(r.check(&two("y")).await.unwrap());
    assert_eq!((in_use, r.queued_releases()), (vec![1, 1], 0));
}

/// Decision 149: during a rolling upgrade a v1 gateway (the script as it shipped, kept as a
/// fixture) and a v2 gateway share a window's hash and both count it exactly: v1 takes v2's
/// summary fields for stale seconds and deletes them, and v2 then reads the hash whole.
#[tokio::test]
async fn a_v1_gateway_and_a_v2_gateway_count_one_window_exactly() {
    let url = redis_url();
    let v2 = RedisLimiter::new(
        &url,
        RedisOptions { prefix: "tollgate-test".into(), timeout: Duration::from_secs(5), ..RedisOptions::default() },
    )
    .unwrap();
    let v1 = redis::Script::new(include_str!("../fixtures/tollgate_check_v1.lua"));
    let mut conn = redis::Client::open(url.as_str()).unwrap().get_multiplexed_async_connection().await.unwrap();
    let k = uniq("key");
    let t = t0();
    let five = |now: i64| windows(now, vec![window(&k, 5)]);
    for i in 0..2 {
        admitted_windows(v2.check(&five(t + i * 1000)).await.unwrap());
    }
    // v1 counts v2's two requests and records a third.
    let v1_check = |now: i64| {
        let mut inv = v1.prepare_invoke();
        inv.key(format!("{{tollgate-test}}:w:{k}")).arg(now).arg(1).arg(0).arg(0).arg("v1-lease").arg(10_000).arg(5);
        inv
    };
    let reply: Vec<i64> = v1_check(t + 2000).invoke_async(&mut conn).await.unwrap();
    assert_eq!(reply, vec![0, 2, t / 1000]);
    // v2 counts all three, then v1 counts v2's fourth.
    let w = admitted_windows(v2.check(&five(t + 3000)).await.unwrap());
    assert_eq!(w[0].remaining, 1);
    let reply: Vec<i64> = v1_check(t + 4000).invoke_async(&mut conn).await.unwrap();
    assert_eq!(reply[..2], [0, 4]);
    // Full at five, for both.
    assert!(matches!(v2.check(&five(t + 5000)).await.unwrap(), Verdict::WindowRefused { .. }));
    let reply: Vec<i64> = v1_check(t + 5000).invoke_async(&mut conn).await.unwrap();
    assert_eq!(reply[0], 1);
    // Once the first second has left, each counts the four left.
    let w = admitted_windows(v2.check(&five(t + 61_000)).await.unwrap());
    assert_eq!(w[0].remaining, 0);
}
