//! The connection gate, the model object, a missing limiter store, the messages envelope, config refusals.

use super::*;

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
