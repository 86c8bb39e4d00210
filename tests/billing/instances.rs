//! Two instances on one store: one balance while one holds a lease, and a stalled instance's lease.

use super::*;

/// Two gateways on one store (decision 190): while one takes its requests' holds from a lease,
/// both show the same balance, and `held_cents` counts only the running requests (before, the
/// other showed the lease's unused part as held). A request the shown balance covers but the
/// stored one does not, because the busy instance's lease keeps the difference, is served by
/// the other instance (decision 191): its refusal recalls the leases, the busy instance gives
/// its lease back instead of renewing it, and the hold asked again finds the money (before,
/// a 402 while the busy instance kept renewing).
#[tokio::test]
async fn two_instances_show_one_balance_while_one_holds_a_lease() {
    let mock = Mock::start();
    let gw1 = Gateway::start(&mock);
    let gw2 = Gateway::start_in(&mock, Opts::default(), gw1.dir.clone());
    let ws = gw1.workspace.clone();
    top_up(&gw1, &ws, 4_300); // 4,400 cents with the signup grant
    let leased = |gw: &Gateway| balance(gw, &ws)["leased_cents"].as_i64().unwrap();
    // pricey-model: a cent per output token, a 10-cent hold for max_tokens 10.
    let mut small = chat_body("pricey-model", false);
    small["max_tokens"] = json!(10);
    let r = gw1.post("/v1/chat/completions", &small, &[("x-mock-tokens", "1")]).await;
    assert_eq!(r.status, 200, "{}", r.text);
    for _ in 0..100 {
        if leased(&gw1) > 0 {
            break;
        }
        std::thread::sleep(std::time::Duration::from_millis(10));
    }
    assert_eq!(leased(&gw1), 548, "gw1 leased an eighth of the 4,390 cents its first hold left");
    // Two slow streams on gw1, their holds taken from the lease (3 s each).
    let mut slow = small.clone();
    slow["stream"] = json!(true);
    let streams: Vec<_> = (0..2)
        .map(|_| {
            let (url, bearer, body) = (gw1.url("/v1/chat/completions"), gw1.bearer(), slow.clone());
            tokio::spawn(async move {
                let r = reqwest::Client::new()
                    .post(url)
                    .header("authorization", bearer)
                    .header("x-mock-tokens", "10")
                    .header("x-mock-token-delay-ms", "300")
                    .json(&body)
                    .send()
                    .await
                    .unwrap();
                r.text().await.unwrap()
            })
        })
        .collect();
    tokio::time::sleep(std::time::Duration::from_millis(200)).await;
    let auth = gw1.bearer();
    let credits = |gw: &Gateway| {
        let (url, auth) = (gw.url("/v1/credits"), auth.clone());
        async move {
            let r = reqwest::Client::new().get(url).header("authorization", auth).send().await.unwrap();
            r.json::<Value>().await.unwrap()
        }
    };
    let (on1, on2) = (credits(&gw1).await, credits(&gw2).await);
    assert_eq!((on1["balance_cents"].as_i64(), on1["held_cents"].as_i64()), (Some(4_379), Some(20)), "{on1}");
    assert_eq!((on2["balance_cents"].as_i64(), on2["held_cents"].as_i64()), (Some(4_379), Some(20)), "{on2}");
    // gw1 stays busy: a request every 20 ms, each asking its lease for a hold, so a lease
    // past three quarters of its second is renewed unless the ledger refuses the grant.
    let busy = std::sync::Arc::new(std::sync::atomic::AtomicBool::new(true));
    let looping = {
        let (url, bearer, body, busy) = (gw1.url("/v1/chat/completions"), gw1.bearer(), small.clone(), busy.clone());
        tokio::spawn(async move {
            let client = reqwest::Client::new();
            let mut served = 0;
            while busy.load(std::sync::atomic::Ordering::Relaxed) {
                let r = client.post(&url).header("authorization", &bearer).header("x-mock-tokens", "1");
                let r = r.json(&body).send().await.unwrap();
                served += i32::from(r.status() == 200);
                r.bytes().await.unwrap();
                tokio::time::sleep(std::time::Duration::from_millis(20)).await;
            }
            served
        })
    };
    tokio::time::sleep(std::time::Duration::from_millis(300)).await;
    assert!(leased(&gw1) > 0, "gw1 holds a lease while busy");
    // 4,096 cents fit the balance shown, not what gw1's lease leaves in the store.
    let mut big = chat_body("pricey-model", false);
    big["max_tokens"] = json!(4_096);
    let r = gw2.post_as("/v1/chat/completions", &big, &[("authorization", &auth), ("x-mock-tokens", "5")]).await;
    assert_eq!(r.status, 200, "served once gw1 gave its lease back: {}", r.text);
    busy.store(false, std::sync::atomic::Ordering::Relaxed);
    assert!(looping.await.unwrap() > 10, "gw1 served its requests throughout");
    for s in streams {
        assert!(s.await.unwrap().contains("[DONE]"));
    }
    // Every request settled at its usage; nothing stays held once gw1's lease is back.
    let deadline = std::time::Instant::now() + std::time::Duration::from_secs(5);
    let l = loop {
        let l = balance(&gw2, &ws);
        if l["held_cents"] == 0 || std::time::Instant::now() > deadline {
            break l;
        }
        std::thread::sleep(std::time::Duration::from_millis(100));
    };
    let cents: i64 = settled_costs(&l).iter().sum::<i64>() / 1_000_000;
    assert_eq!((l["held_cents"].as_i64(), l["balance_cents"].as_i64()), (Some(0), Some(4_400 - cents)), "{l}");
}

/// Decision 191's wait ends where a stalled instance's lease stops counting: a lease row older
/// than two seconds (`LEASE_LIVE`) belongs to an instance that is not renewing it, nobody can
/// spend it until it is swept, and the balance shown no longer includes it. A request refused
/// for money that lease keeps waits for it to go stale, then gets a 402 naming the balance
/// without it; it never waits for the stopped instance.
#[tokio::test]
async fn a_stalled_instances_lease_ends_the_wait_with_a_402() {
    let mock = Mock::start();
    let gw1 = Gateway::start(&mock);
    let gw2 = Gateway::start_in(&mock, Opts::default(), gw1.dir.clone());
    let ws = gw1.workspace.clone();
    top_up(&gw1, &ws, 4_300); // 4,400 cents with the signup grant
    let mut small = chat_body("pricey-model", false);
    small["max_tokens"] = json!(10);
    let r = gw1.post("/v1/chat/completions", &small, &[("x-mock-tokens", "1")]).await;
    assert_eq!(r.status, 200, "{}", r.text);
    // gw1 holds its lease (548 cents, an eighth of 4,390) and the request is settled.
    for _ in 0..100 {
        let l = balance(&gw2, &ws);
        if balance(&gw1, &ws)["leased_cents"] == 548 && settled_costs(&l) == vec![1_000_000] {
            break;
        }
        std::thread::sleep(std::time::Duration::from_millis(10));
    }
    assert_eq!(balance(&gw1, &ws)["leased_cents"], 548);
    assert_eq!(unsafe { libc::kill(gw1.pid() as i32, libc::SIGSTOP) }, 0);
    // 4,096 cents: covered by the 4,399 shown while the lease is live, not by the 3,851 stored.
    let mut big = chat_body("pricey-model", false);
    big["max_tokens"] = json!(4_096);
    let r = gw2.post_as("/v1/chat/completions", &big, &[("authorization", &gw1.bearer())]).await;
    assert_eq!(unsafe { libc::kill(gw1.pid() as i32, libc::SIGCONT) }, 0);
    let v = r.assert_error(402, "insufficient_credits");
    assert_eq!(
        (v["error"]["required_cents"].as_i64(), v["error"]["current_balance_cents"].as_i64()),
        (Some(4_096), Some(3_851)),
        "the stale lease is not shown as balance: {v}"
    );
    let message = v["error"]["message"].as_str().unwrap();
    assert!(message.contains("add at least 245 cents"), "{message}");
}
