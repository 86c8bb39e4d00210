//! Request windows: per key on every route, raised by purchases, read buckets, tokens per minute.

use super::*;

#[tokio::test]
async fn per_key_window_counts_every_route_and_refuses_with_headers() {
    let mock = Mock::start();
    let gw = Gateway::start_with(&mock, with_limits("  requests_per_minute: { free: 3, core: 5, enterprise: 9 }\n"));
    let r = gw.get("/v1/models").await;
    assert_eq!(r.status, 200, "{}", r.text);
    assert_eq!(r.header("x-ratelimit-limit").as_deref(), Some("3"));
    assert_eq!(r.header("x-ratelimit-remaining").as_deref(), Some("2"));
    assert_eq!(r.header("x-ratelimit-tier").as_deref(), Some("free"));
    let reset: u64 = r.header("x-ratelimit-reset").unwrap().parse().unwrap();
    let now = jiff::Timestamp::now().as_second() as u64;
    assert!(reset > now && reset <= now + 61, "reset {reset} is a Unix second within the window (now {now})");
    let r = gw.post("/v1/chat/completions", &chat_body("chat-model", false), &[]).await;
    assert_eq!(r.status, 200, "{}", r.text);
    assert_eq!(r.header("x-ratelimit-remaining").as_deref(), Some("1"), "generation routes count too");
    // A refused request (here a 400) still spends quota.
    let bad = gw.post("/v1/chat/completions", &json!({"model": "chat-model", "messages": []}), &[]).await;
    assert_eq!(bad.status, 400);
    let r = gw.get("/v1/models").await;
    let v = r.assert_error(429, "rate_limit_exceeded");
    assert_eq!(v["error"]["type"], "rate_limit_error");
    assert_eq!(r.header("x-ratelimit-remaining").as_deref(), Some("0"), "Remaining is 0 on refusal");
    assert_eq!(r.header("x-ratelimit-limit").as_deref(), Some("3"));
    retry_after(&r);
    // Another key of the same workspace has its own window.
    let other = gw.mint_key(&gw.workspace, json!({}))["key"].as_str().unwrap().to_string();
    let r = gw.get_as("/v1/models", &[("authorization", &format!("Bearer {other}"))]).await;
    assert_eq!(r.status, 200, "{}", r.text);
}

#[tokio::test]
async fn purchases_raise_the_tier_and_custom_limits_are_clamped_to_it() {
    let mock = Mock::start();
    let gw = Gateway::start_with(&mock, with_limits("  requests_per_minute: { free: 3, core: 5, enterprise: 9 }\n"));
    let custom = gw.mint_key(&gw.workspace, json!({"rate_limit_rpm": 2}))["key"].as_str().unwrap().to_string();
    let r = gw.get_as("/v1/models", &[("authorization", &format!("Bearer {custom}"))]).await;
    assert_eq!(r.header("x-ratelimit-limit").as_deref(), Some("2"), "custom limit below the tier applies");
    let big = gw.mint_key(&gw.workspace, json!({"rate_limit_rpm": 1000}))["key"].as_str().unwrap().to_string();
    let r = gw.get_as("/v1/models", &[("authorization", &format!("Bearer {big}"))]).await;
    assert_eq!(r.header("x-ratelimit-limit").as_deref(), Some("3"), "custom limit clamped to the tier maximum");
    let ws_path = format!("/admin/v1/workspaces/{}", gw.workspace);
    let (_, w) = gw.admin("GET", &ws_path, None);
    assert_eq!((w["rate_tier"].as_str(), w["rate_tier_in_force"].as_str()), (Some("free"), Some("free")), "{w}");
    let (s, _) = gw.admin(
        "POST",
        &format!("/admin/v1/workspaces/{}/credits", gw.workspace),
        Some(json!({"amount_cents": 500, "source": "purchase"})),
    );
    assert_eq!(s, 201);
    tokio::time::sleep(std::time::Duration::from_millis(700)).await; // key cache lifetime
    let r = gw.get("/v1/models").await;
    assert_eq!(r.header("x-ratelimit-tier").as_deref(), Some("core"));
    assert_eq!(r.header("x-ratelimit-limit").as_deref(), Some("5"));
    // The admin view says both: the tier set, and the tier served since the purchase.
    let (_, w) = gw.admin("GET", &ws_path, None);
    assert_eq!((w["rate_tier"].as_str(), w["rate_tier_in_force"].as_str()), (Some("free"), Some("core")), "{w}");
}

#[tokio::test]
async fn credits_and_usage_reads_have_their_own_buckets() {
    let mock = Mock::start();
    let gw = Gateway::start_with(&mock, with_limits("  reads_per_minute: 2\n"));
    for _ in 0..2 {
        let r = gw.get("/v1/credits").await;
        assert_eq!(r.status, 200, "{}", r.text);
    }
    let r = gw.get("/v1/credits").await;
    r.assert_error(429, "rate_limit_exceeded");
    retry_after(&r);
    // GET /v1/usage has a bucket of its own (decision 112).
    for _ in 0..2 {
        let r = gw.get("/v1/usage").await;
        assert_eq!(r.status, 200, "{}", r.text);
    }
    gw.get("/v1/usage").await.assert_error(429, "rate_limit_exceeded");
    let r = gw.get("/v1/models").await;
    assert_eq!(r.status, 200, "the per-key window is not spent by the reads buckets");
}

#[tokio::test]
async fn the_per_key_window_never_asks_to_wait_more_than_sixty_seconds() {
    let mock = Mock::start();
    let gw = Gateway::start_with(&mock, with_limits("  requests_per_minute: { free: 1, core: 1, enterprise: 1 }\n"));
    assert_eq!(gw.get("/v1/models").await.status, 200);
    for path in ["/v1/models", "/v1/chat/completions"] {
        let r = if path == "/v1/models" {
            gw.get(path).await
        } else {
            gw.post(path, &chat_body("chat-model", false), &[]).await
        };
        r.assert_error(429, "rate_limit_exceeded");
        let (s, ms) = retry_after(&r);
        assert!((1..=60).contains(&s) && ms <= 60_000, "{path}: Retry-After {s} ({ms} ms) lies in 1..=60");
    }
}

#[tokio::test]
async fn workspace_tokens_per_minute_refuse_and_say_when_waiting_cannot_help() {
    let mock = Mock::start();
    let gw = Gateway::start_with(&mock, with_limits(""));
    let huge = json!({"model": "limited-model", "messages": [{"role": "user", "content": "hi"}], "max_tokens": 5000});
    let r = gw.post("/v1/chat/completions", &huge, &[]).await;
    let v = r.assert_error(429, "hosted_workspace_tpm_limit");
    assert_eq!(v["error"]["limit"], 3000);
    assert!(r.header("retry-after").is_none(), "a single request above the limit cannot succeed by waiting");
    assert_eq!(r.header("x-hosted-limit-scope").as_deref(), Some("workspace_tpm"));
    let some = json!({"model": "limited-model", "messages": [{"role": "user", "content": "hi"}], "max_tokens": 1200});
    assert_eq!(gw.post("/v1/chat/completions", &some, &[]).await.status, 200);
    assert_eq!(gw.post("/v1/chat/completions", &some, &[]).await.status, 200);
    let r = gw.post("/v1/chat/completions", &some, &[]).await;
    r.assert_error(429, "hosted_workspace_tpm_limit");
    let (s, _) = retry_after(&r);
    assert!(s <= 8);
}
