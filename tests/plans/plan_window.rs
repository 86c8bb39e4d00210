//! The plan window: the wait ending in `429 plan_window_busy`, two instances on one store, Standby capacity.

use super::*;

async fn window_wait(postgres: bool) {
    let url = if postgres { Some(pg::fresh_database().await) } else { None };
    let mock = Mock::start();
    let gw = Gateway::start_with(&mock, opts(postgres, url, plans_yaml(0.5, 4, 1)));
    let ws = gw.workspace.clone();
    set_plan(
        &gw,
        &ws,
        json!({"tier": "starter", "status": "active", "credits_after_limits": {"enabled": true, "cap_cents": null}}),
    );
    // A slow request whose estimate (40 cents) holds the whole window.
    let mut slow = chat_body("pricey-model", true);
    slow["max_tokens"] = json!(40);
    let first = gw.post("/v1/chat/completions", &slow, &[("x-mock-tokens", "2"), ("x-mock-token-delay-ms", "1500")]);
    let second = async {
        tokio::time::sleep(std::time::Duration::from_millis(300)).await;
        let started = std::time::Instant::now();
        (twenty_cents(&gw, &gw.key).await, started.elapsed())
    };
    let (first, (second, waited)) = tokio::join!(first, second);
    assert_eq!(first.status, 200);
    assert_eq!(funding(&first).as_deref(), Some("plan"));
    let v = second.assert_error(429, "plan_window_busy");
    assert_eq!(v["error"]["type"], "rate_limit_error");
    assert!(waited >= std::time::Duration::from_millis(450), "waited {waited:?} for room");
    assert!(second.header("retry-after").is_some());
    // Once the running request settles below its estimate, the window has room again.
    plan_state(&gw, &ws);
    let r = twenty_cents(&gw, &gw.key).await;
    assert_eq!(funding(&r).as_deref(), Some("plan"), "{}", r.text);
}

#[tokio::test]
async fn a_window_held_by_running_requests_waits_then_answers_plan_window_busy_on_sqlite() {
    window_wait(false).await
}

#[tokio::test]
async fn a_window_held_by_running_requests_waits_then_answers_plan_window_busy_on_postgres() {
    window_wait(true).await
}

#[tokio::test]
async fn two_instances_on_one_store_never_admit_past_a_window() {
    let url = pg::fresh_database().await;
    let mock = Mock::start();
    // Room for five 20-cent requests in a 100-cent window; no credits, no Standby, no wait.
    let yaml = "plans:\n  window_wait_seconds: 0\n  tiers:\n    starter: { five_hour_cents: 100, week_cents: 300, standby_day_cents: 0, plan_concurrency: 100, standby_concurrency: 0 }\n".to_string();
    let a = Gateway::start_with(&mock, opts(true, Some(url.clone()), yaml.clone()));
    let b = Gateway::start_with(&mock, opts(true, Some(url), yaml));
    set_plan(&a, &a.workspace, json!({"tier": "starter", "status": "active"}));
    let key = a.key.clone();
    let mut calls = Vec::new();
    for i in 0..24 {
        let gw = if i % 2 == 0 { &a } else { &b };
        calls.push(twenty_cents(gw, &key));
    }
    let replies = futures::future::join_all(calls).await;
    let plan_paid = replies.iter().filter(|r| r.status == 200 && funding(r).as_deref() == Some("plan")).count();
    for r in &replies {
        assert!(matches!(r.status, 200 | 429 | 402), "{} {}", r.status, r.text);
        if r.status == 200 {
            assert_eq!(funding(r).as_deref(), Some("plan"));
        }
    }
    let p = plan_state(&a, &a.workspace);
    assert_eq!(plan_paid, 5, "exactly the window's room, across both instances: {p}");
    assert_eq!(p["five_hour"]["used_microcents"], 100 * M, "{p}");
    assert_eq!(p["pending_microcents"]["plan"], 0);
}

#[tokio::test]
async fn standby_across_workspaces_stops_at_the_models_standby_capacity() {
    let mock = Mock::start();
    // An empty 5-hour window: every request of a serving plan goes to Standby.
    let yaml = "plans:\n  tiers:\n    starter: { five_hour_cents: 0, week_cents: 300, standby_day_cents: 300, plan_concurrency: 4, standby_concurrency: 4 }\n".to_string();
    let gw = Gateway::start_with(&mock, opts(false, None, yaml));
    set_plan(&gw, &gw.workspace, json!({"tier": "starter", "status": "active"}));
    let (other_ws, other_key) = gw.mint_workspace_key();
    set_plan(&gw, &other_ws, json!({"tier": "starter", "status": "active"}));
    // pricey-model takes one Standby request at a time (models.yaml).
    let mut slow = chat_body("pricey-model", false);
    slow["max_tokens"] = json!(5);
    let first = gw.post("/v1/chat/completions", &slow, &[("x-mock-tokens", "5"), ("x-mock-ttft-ms", "1200")]);
    let second = async {
        tokio::time::sleep(std::time::Duration::from_millis(300)).await;
        twenty_cents(&gw, &other_key).await
    };
    let (first, second) = tokio::join!(first, second);
    assert_eq!(funding(&first).as_deref(), Some("standby"), "{}", first.text);
    let v = second.assert_error(429, "hosted_standby_aggregate_limit");
    assert_eq!(v["error"]["type"], "rate_limit_error");
    assert!(second.header("retry-after").is_some());
    assert_eq!(funding(&second).as_deref(), Some("refused"));
    // The refused request left nothing behind: its Standby count and hold are gone.
    let p = plan_state(&gw, &other_ws);
    assert_eq!(
        (p["running"]["standby"].as_i64(), p["pending_microcents"]["standby"].as_i64()),
        (Some(0), Some(0)),
        "{p}"
    );
    plan_state(&gw, &gw.workspace);
    let r = twenty_cents(&gw, &other_key).await;
    assert_eq!(funding(&r).as_deref(), Some("standby"), "the slot is free again: {}", r.text);
}
