//! Concurrency: per key while the model is busy, shared model and workspace gates, large prompts shed.

use super::*;

/// `n` requests of the gateway's key, the i-th sent `i * 300` ms after the first.
async fn staggered(gw: &Gateway, body: &serde_json::Value, n: u64) -> Vec<Reply> {
    let calls = (0..n).map(|i| async move {
        tokio::time::sleep(std::time::Duration::from_millis(300 * i)).await;
        gw.post("/v1/chat/completions", body, &SLOW).await
    });
    futures::future::join_all(calls).await
}

#[tokio::test]
async fn per_key_concurrency_applies_only_while_the_model_is_busy() {
    // limited-model: pool capacity 4, busy at 3 in flight when a request arrives
    // (clarification 5), per key 1 once busy, shared 3.
    let mock = Mock::start();
    let gw = Gateway::start_with(&mock, with_limits(""));
    let r = staggered(&gw, &slow_chat("limited-model"), 4).await;
    for (i, r) in r.iter().take(3).enumerate() {
        assert_eq!(r.status, 200, "{i} in flight of 4 is not busy: spare capacity admits the key: {}", r.text);
    }
    let r3 = &r[3];
    let v = r3.assert_error(429, "hosted_per_key_concurrency_limit");
    assert_eq!(v["error"]["limit"], 1);
    assert_eq!(r3.header("x-hosted-limit-scope").as_deref(), Some("per_key_concurrency"));
    assert_eq!(r3.header("x-hosted-limit-value").as_deref(), Some("1"));
    let (s, ms) = retry_after(r3);
    assert!(s <= 8 && ms <= 8_000, "admission estimates are capped at 8 s");
    // The slots were released: the next request is admitted.
    let r = gw.post("/v1/chat/completions", &chat_body("limited-model", false), &[]).await;
    assert_eq!(r.status, 200, "{}", r.text);
}

#[tokio::test]
async fn busy_means_three_quarters_of_the_pool_in_flight_when_the_request_arrives() {
    // busy-model: a pool of capacity 2 (busy at 2 in flight), 1 per key once busy, no
    // shared limit declared.
    let mock = Mock::start();
    let gw = Gateway::start_with(&mock, with_limits(""));
    let r = staggered(&gw, &slow_chat("busy-model"), 3).await;
    assert_eq!(r[0].status, 200, "{}", r[0].text);
    assert_eq!(r[1].status, 200, "1 of 2 in flight (50%) is not busy: {}", r[1].text);
    let v = r[2].assert_error(429, "hosted_per_key_concurrency_limit");
    assert_eq!(v["error"]["limit"], 1, "2 of 2 in flight is busy");
}

#[tokio::test]
async fn a_full_pool_without_a_shared_limit_is_at_capacity_not_a_shared_limit() {
    // busy-model declares no `max_concurrent_requests`: the default cap is the pool's
    // capacity (2), and reaching it reads as placement capacity (clarification 17).
    let mock = Mock::start();
    let gw = Gateway::start_with(&mock, with_limits(""));
    let keys: Vec<String> = (0..3).map(|_| format!("Bearer {}", gw.mint_workspace_key().1)).collect();
    let body = slow_chat("busy-model");
    let calls = keys.iter().enumerate().map(|(i, bearer)| {
        let body = &body;
        let gw = &gw;
        async move {
            tokio::time::sleep(std::time::Duration::from_millis(300 * i as u64)).await;
            gw.post_as("/v1/chat/completions", body, &[("authorization", bearer.as_str()), SLOW[0]]).await
        }
    });
    let r = futures::future::join_all(calls).await;
    assert_eq!((r[0].status, r[1].status), (200, 200), "{} {}", r[0].text, r[1].text);
    let v = r[2].assert_error(429, "hosted_model_at_capacity");
    assert!(v["error"].get("limit").is_none(), "no limit field: {v}");
    assert!(r[2].header("x-hosted-limit-scope").is_none() && r[2].header("x-hosted-limit-value").is_none());
    retry_after(&r[2]);
}

#[tokio::test]
async fn shared_model_and_workspace_gates_refuse_in_order() {
    let mock = Mock::start();
    let gw = Gateway::start_with(&mock, with_limits("  workspace_concurrency: { free: 2, core: 2, enterprise: 2 }\n"));
    let body = slow_chat("limited-model");
    let (ws2, key2) = gw.mint_workspace_key();
    let key3 = gw.mint_workspace_key().1;
    let bearer = |k: &str| format!("Bearer {k}");
    let (b1, b2, b3) = (gw.bearer(), bearer(&key2), bearer(&key3));
    let b4 = bearer(gw.mint_key(&ws2, json!({}))["key"].as_str().unwrap());
    let first = async {
        let h = [("authorization", b1.as_str()), SLOW[0]];
        tokio::join!(gw.post_as("/v1/chat/completions", &body, &h), async {
            tokio::time::sleep(std::time::Duration::from_millis(150)).await;
            gw.post_as("/v1/chat/completions", &body, &[("authorization", b2.as_str()), SLOW[0]]).await
        })
    };
    let later = async {
        tokio::time::sleep(std::time::Duration::from_millis(400)).await;
        // Workspace 1 has one in flight; a second key of it is fine until the workspace's 2.
        let third_headers = [("authorization", b3.as_str()), SLOW[0]];
        let third = gw.post_as("/v1/chat/completions", &body, &third_headers);
        let fourth = async {
            tokio::time::sleep(std::time::Duration::from_millis(200)).await;
            // A fourth key: the per-key gate passes, the shared-model gate is full.
            gw.post_as("/v1/chat/completions", &body, &[("authorization", b4.as_str())]).await
        };
        tokio::join!(third, fourth)
    };
    let ((r1, r2), (r3, r4)) = tokio::join!(first, later);
    assert_eq!((r1.status, r2.status, r3.status), (200, 200, 200), "{} {} {}", r1.text, r2.text, r3.text);
    let v = r4.assert_error(429, "hosted_shared_model_concurrency_limit");
    assert_eq!(v["error"]["limit"], 3);
    assert_eq!(r4.header("x-hosted-limit-scope").as_deref(), Some("shared_model_concurrency"));
    retry_after(&r4);

    // Workspace concurrency: two in flight in one workspace, the third is refused.
    let h = [("authorization", b2.as_str()), ("x-mock-ttft-ms", "1000")];
    let slow = chat_body("chat-model", false);
    let (x, y, z) = tokio::join!(
        gw.post_as("/v1/chat/completions", &slow, &h),
        gw.post_as("/v1/chat/completions", &slow, &h),
        async {
            tokio::time::sleep(std::time::Duration::from_millis(300)).await;
            gw.post_as("/v1/chat/completions", &slow, &[("authorization", b2.as_str())]).await
        }
    );
    assert_eq!((x.status, y.status), (200, 200));
    let v = z.assert_error(429, "hosted_workspace_concurrency_limit");
    assert_eq!(v["error"]["limit"], 2);
    assert_eq!(z.header("x-hosted-limit-scope").as_deref(), Some("workspace_concurrency"));
}

#[tokio::test]
async fn large_prompts_are_shed_first_near_full_concurrency() {
    let mock = Mock::start();
    let gw = Gateway::start_with(&mock, with_limits("  large_prompt_tokens: 100\n  large_prompt_shed_percent: 34\n"));
    let big = json!({"model": "limited-model", "messages": [{"role": "user", "content": "x".repeat(2_000)}]});
    let r = gw.post("/v1/chat/completions", &big, &[]).await;
    assert_eq!(r.status, 200, "an idle model takes a large prompt: {}", r.text);
    let other = gw.mint_workspace_key().1;
    let auth = format!("Bearer {other}");
    let small = chat_body("limited-model", false);
    let held_headers = [("authorization", auth.as_str()), SLOW[0]];
    let (held, shed) = tokio::join!(gw.post_as("/v1/chat/completions", &small, &held_headers), async {
        tokio::time::sleep(std::time::Duration::from_millis(300)).await;
        gw.post("/v1/chat/completions", &big, &[]).await
    });
    assert_eq!(held.status, 200);
    let v = shed.assert_error(429, "hosted_saturated_large_prompt");
    assert_eq!(v["error"]["limit"], 1, "34% of the shared limit of 3");
    assert_eq!(shed.header("x-hosted-limit-scope").as_deref(), Some("large_prompt"));
}

#[tokio::test]
async fn a_running_request_keeps_its_slot_beyond_the_lease_time() {
    let mock = Mock::start();
    let opts = with_limits("  lease_ttl_seconds: 1\n  workspace_concurrency: { free: 1, core: 1, enterprise: 1 }\n");
    let gw = Gateway::start_with(&mock, opts);
    let body = chat_body("chat-model", false);
    let (long, probe) = tokio::join!(gw.post("/v1/chat/completions", &body, &[("x-mock-ttft-ms", "3000")]), async {
        tokio::time::sleep(std::time::Duration::from_millis(2_200)).await;
        gw.post("/v1/chat/completions", &body, &[]).await
    });
    assert_eq!(long.status, 200);
    probe.assert_error(429, "hosted_workspace_concurrency_limit");
    assert_eq!(gw.post("/v1/chat/completions", &body, &[]).await.status, 200, "released when it ended");
}

#[tokio::test]
async fn the_forwarded_routes_take_an_admission_slot_too() {
    let mock = Mock::start();
    let gw = Gateway::start_with(&mock, with_limits("  workspace_concurrency: { free: 1, core: 1, enterprise: 1 }\n"));
    let embed = json!({"model": "embed-model", "input": "hello"});
    let (slow, refused) = tokio::join!(gw.post("/v1/embeddings", &embed, &[("x-mock-ttft-ms", "1000")]), async {
        tokio::time::sleep(std::time::Duration::from_millis(300)).await;
        gw.post("/v1/embeddings", &embed, &[]).await
    });
    assert_eq!(slow.status, 200, "{}", slow.text);
    let v = refused.assert_error(429, "hosted_workspace_concurrency_limit");
    assert_eq!(v["error"]["limit"], 1);
    // The slot is released when the request ends.
    assert_eq!(gw.post("/v1/embeddings", &embed, &[]).await.status, 200);
}
