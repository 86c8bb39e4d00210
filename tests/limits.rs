//! Rate limit layers through the gateway (spec "Limits", "Rate limit layers", 429/503 codes,
//! "Retry rules"), on the embedded in-process limiter. The Redis-backed runs (two instances,
//! outage, killed instance) are in `tests/limits_redis.rs`.
#![allow(clippy::unwrap_used, clippy::expect_used, clippy::panic)]

mod common;

use common::{Gateway, Mock, Opts, Reply, chat_body};
use serde_json::json;

fn with_limits(lines: &str) -> Opts {
    Opts { limits: Some(lines.to_string()), ..Opts::default() }
}

fn slow_chat(model: &str) -> serde_json::Value {
    chat_body(model, false)
}

const SLOW: [(&str, &str); 1] = [("x-mock-ttft-ms", "1500")];

fn retry_after(r: &Reply) -> (u64, u64) {
    let s: u64 = r.header("retry-after").expect("Retry-After").parse().unwrap();
    let ms: u64 = r.header("retry-after-ms").expect("Retry-After-Ms").parse().unwrap();
    assert!(s >= 1 && s == ms.div_ceil(1000), "Retry-After {s} is Retry-After-Ms {ms} rounded up");
    (s, ms)
}

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
async fn connection_gate_budgets_unrecognized_credentials_and_trusts_good_keys() {
    let mock = Mock::start();
    let gw = Gateway::start_with(&mock, with_limits("  connection_gate: { per_address_per_minute: 3 }\n"));
    let r = gw.get("/v1/models").await;
    assert_eq!(r.status, 200, "a new key is counted once, then trusted: {}", r.text);
    let bad = [("authorization", "Bearer rp_0000000000000000000000000000000000000000")];
    for _ in 0..2 {
        assert_eq!(gw.get_as("/v1/models", &bad).await.status, 401);
    }
    let r = gw.get_as("/v1/models", &bad).await;
    r.assert_error(429, "rate_limit_exceeded");
    assert!(r.header("x-ratelimit-limit").is_none() && r.header("x-ratelimit-remaining").is_none(), "no X-RateLimit-*");
    retry_after(&r);
    let r = gw.get_as("/v1/models", &[]).await;
    r.assert_error(429, "rate_limit_exceeded"); // a missing key is unrecognized too
    let r = gw.get("/v1/models").await;
    assert_eq!(r.status, 200, "a key that succeeded bypasses the gate: {}", r.text);
}

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

#[tokio::test]
async fn model_object_publishes_the_values_in_force() {
    let mock = Mock::start();
    let gw = Gateway::start_with(&mock, with_limits(""));
    let m = gw.get("/v1/models/limited-model").await.json();
    assert_eq!(m["max_concurrent_requests_per_api_key"], 1);
    assert_eq!(m["max_tokens_per_minute_per_workspace"], 3000);
    let chat = gw.get("/v1/models/chat-model").await.json();
    assert_eq!(chat["max_concurrent_requests_per_api_key"], 8);
    let credit = |cents: i64| {
        let (s, b) = gw.admin(
            "POST",
            &format!("/admin/v1/workspaces/{}/credits", gw.workspace),
            Some(json!({"amount_cents": cents, "source": "purchase"})),
        );
        assert_eq!(s, 201, "{b}");
    };
    credit(5_000);
    tokio::time::sleep(std::time::Duration::from_millis(700)).await;
    let m = gw.get("/v1/models/limited-model").await.json();
    assert_eq!(m["max_tokens_per_minute_per_workspace"], 20_000_000, "$50 of purchases: at least 20 million");
    credit(15_000);
    tokio::time::sleep(std::time::Duration::from_millis(700)).await;
    let m = gw.get("/v1/models/limited-model").await.json();
    assert!(m.get("max_tokens_per_minute_per_workspace").is_none(), "$200: no practical limit: {m}");
    let list = gw.get("/v1/models").await.json();
    let listed = list["data"].as_array().unwrap().iter().find(|m| m["id"] == "limited-model").unwrap().clone();
    assert_eq!(listed["max_concurrent_requests_per_api_key"], m["max_concurrent_requests_per_api_key"]);
    // The limit in force is the one admission applies: a 5000-token request now passes.
    let huge = json!({"model": "limited-model", "messages": [{"role": "user", "content": "hi"}], "max_tokens": 5000});
    assert_eq!(gw.post("/v1/chat/completions", &huge, &[]).await.status, 200);
}

#[tokio::test]
async fn no_limiter_store_means_limiter_unavailable() {
    let mock = Mock::start();
    let gw = Gateway::start_with(&mock, with_limits("  store: { backend: none }\n"));
    let r = gw.get("/v1/models").await;
    r.assert_error(503, "limiter_unavailable");
    let s: u64 = r.header("retry-after").unwrap().parse().unwrap();
    assert!((1..=4).contains(&s), "randomized 1-4 s, got {s}");
    let r = gw.post("/v1/chat/completions", &chat_body("chat-model", false), &[]).await;
    r.assert_error(503, "limiter_unavailable");
}

#[tokio::test]
async fn messages_route_refusals_use_the_messages_envelope() {
    let mock = Mock::start();
    let gw = Gateway::start_with(&mock, with_limits(""));
    let body = json!({"model": "limited-model", "max_tokens": 5000, "messages": [{"role": "user", "content": "hi"}]});
    let r =
        gw.post_as("/v1/messages", &body, &[("x-api-key", gw.key.as_str()), ("anthropic-version", "2023-06-01")]).await;
    assert_eq!(r.status, 429, "{}", r.text);
    let v = r.json();
    assert_eq!(v["type"], "error");
    assert_eq!(v["error"]["type"], "rate_limit_error");
    assert_eq!(r.header("x-hosted-limit-scope").as_deref(), Some("workspace_tpm"));
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

fn check_config(dir: &std::path::Path, limits: &str) -> String {
    std::fs::write(dir.join("tollgate.yaml"), format!("listen: 127.0.0.1:1\nlimits:\n{limits}")).unwrap();
    let out = std::process::Command::new(env!("CARGO_BIN_EXE_tollgate"))
        .args(["check-config", "--config"])
        .arg(dir.join("tollgate.yaml"))
        .output()
        .unwrap();
    assert!(!out.status.success(), "bad limits must be refused: {limits}");
    String::from_utf8_lossy(&out.stderr).into_owned()
}

#[test]
fn bad_limit_values_are_refused_with_their_field_path() {
    let dir = std::env::temp_dir().join(format!("tollgate-badlimits-{}", std::process::id()));
    std::fs::create_dir_all(&dir).unwrap();
    std::fs::write(dir.join("models.yaml"), "models:\n  - id: a\n    supported_endpoints: [chat_completions]\n")
        .unwrap();
    std::fs::write(dir.join("upstreams.yaml"), "pools: {}\n").unwrap();
    let err = check_config(&dir, "  requests_per_minute: { free: -5, core: 1, enterprise: 1 }\n");
    assert!(err.contains("tollgate.yaml: limits.requests_per_minute.free:"), "{err}");
    let err = check_config(&dir, "  reads_per_minute: lots\n");
    assert!(err.contains("tollgate.yaml: limits.reads_per_minute:"), "{err}");
    let err = check_config(
        &dir,
        "  reads_per_minute: 0\n  workspace_concurrency: { free: 0, core: 1, enterprise: 1 }\n  store: { backend: redis, url: \"http://x\" }\n",
    );
    for path in ["limits.reads_per_minute", "limits.workspace_concurrency.free", "limits.store.url"] {
        assert!(err.contains(&format!("tollgate.yaml: {path}:")), "{path} listed: {err}");
    }
    // Limits without authentication would limit nothing: refused.
    let err = check_config(
        &dir,
        "  reads_per_minute: 5
plugins:
  - name: limits
",
    );
    assert!(err.contains("plugins[0].name: `limits` counts per API key and needs `auth`"), "{err}");
    let _ = std::fs::remove_dir_all(&dir);
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
