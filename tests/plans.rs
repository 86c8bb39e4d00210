//! Coding plans through the running gateway, on both ledger backends: the funding order
//! (plan until the 5-hour window fills, then credits after limits, Standby, and
//! `402 plan_limit_reached` with its body), each credits blocker, the window wait ending in
//! `429 plan_window_busy`, credits-only keys, the funding headers on all three dialects,
//! plan-paid usage, `GET /v1/usage` field by field, and two instances on one store never
//! admitting past a window.
#![allow(clippy::unwrap_used, clippy::expect_used, clippy::panic)]

mod common;

use common::*;
use serde_json::{Value, json};

const M: i64 = 1_000_000;

/// Starter: a 40-cent 5-hour window, a 300-cent week, 30 cents of Standby a day.
fn plans_yaml(wait_seconds: f64, plan_concurrency: u32, standby_concurrency: u32) -> String {
    format!(
        "plans:\n  window_wait_seconds: {wait_seconds}\n  tiers:\n    starter: {{ five_hour_cents: 40, week_cents: 300, standby_day_cents: 30, plan_concurrency: {plan_concurrency}, standby_concurrency: {standby_concurrency} }}\n"
    )
}

fn opts(postgres: bool, url: Option<String>, yaml: String) -> Opts {
    Opts { postgres_url: if postgres { url } else { None }, extra_yaml: yaml, ..Opts::default() }
}

fn set_plan(gw: &Gateway, ws: &str, body: Value) -> Value {
    let (s, v) = gw.admin("PUT", &format!("/admin/v1/workspaces/{ws}/plan"), Some(body));
    assert_eq!(s, 200, "{v}");
    v
}

/// 20 output tokens of `pricey-model` (a cent each): a 20-cent request, estimate and usage.
async fn twenty_cents(gw: &Gateway, key: &str) -> Reply {
    let mut b = chat_body("pricey-model", false);
    b["max_tokens"] = json!(20);
    let auth = format!("Bearer {key}");
    gw.post_as("/v1/chat/completions", &b, &[("authorization", &auth), ("x-mock-tokens", "20")]).await
}

fn funding(r: &Reply) -> Option<String> {
    r.header("x-service-funding")
}

fn ledger(gw: &Gateway, ws: &str) -> Value {
    let deadline = std::time::Instant::now() + std::time::Duration::from_secs(5);
    loop {
        let (s, v) = gw.admin("GET", &format!("/admin/v1/workspaces/{ws}/ledger"), None);
        assert_eq!(s, 200, "{v}");
        assert_eq!(v["check"]["consistent"], true, "{v}");
        if v["held_cents"] == 0 || std::time::Instant::now() > deadline {
            return v;
        }
        std::thread::sleep(std::time::Duration::from_millis(50));
    }
}

/// The plan as the admin API shows it, once no plan request is running.
fn plan_state(gw: &Gateway, ws: &str) -> Value {
    let deadline = std::time::Instant::now() + std::time::Duration::from_secs(5);
    loop {
        let (s, v) = gw.admin("GET", &format!("/admin/v1/workspaces/{ws}/plan"), None);
        assert_eq!(s, 200, "{v}");
        let idle = v["running"]["plan"] == 0 && v["running"]["standby"] == 0;
        if idle || std::time::Instant::now() > deadline {
            return v;
        }
        std::thread::sleep(std::time::Duration::from_millis(50));
    }
}

async fn funding_order(postgres: bool) {
    let url = if postgres { Some(pg::fresh_database().await) } else { None };
    let mock = Mock::start();
    let gw = Gateway::start_with(&mock, opts(postgres, url, plans_yaml(0.2, 4, 1)));
    let (ws, key) = (gw.workspace.clone(), gw.key.clone());

    // No plan: pay-as-you-go, no funding headers.
    let r = twenty_cents(&gw, &key).await;
    assert_eq!(r.status, 200, "{}", r.text);
    assert_eq!(funding(&r), None);
    assert_eq!(ledger(&gw, &ws)["balance_cents"], 80);

    set_plan(&gw, &ws, json!({"tier": "starter", "status": "active"}));
    // The plan pays: cost 0, the value metered, the balance untouched.
    let r = twenty_cents(&gw, &key).await;
    assert_eq!(r.status, 200, "{}", r.text);
    assert_eq!(funding(&r).as_deref(), Some("plan"));
    assert_eq!(r.header("x-service-plan").as_deref(), Some("starter"));
    assert_eq!(r.header("x-service-plan-5h-used-percent").as_deref(), Some("0"), "admission state");
    let resets: i64 = r.header("x-service-plan-5h-resets-at").unwrap().parse().unwrap();
    let now = jiff::Timestamp::now().as_second();
    assert!((now + 5 * 3600 - 5..=now + 5 * 3600 + 1).contains(&resets), "{resets} vs {now}");
    assert_eq!(r.header("x-service-plan-week-used-percent").as_deref(), Some("0"));
    assert!(r.header("x-service-plan-week-resets-at").is_some());
    let u = &r.json()["usage"];
    assert_eq!(u["cost"].as_f64(), Some(0.0), "{u}");
    assert_eq!(u["service"]["cost_microcents"], 0);
    assert_eq!(u["service"]["plan_value_microcents"], 20 * M);
    assert_eq!(u["service"]["paid_from"], "plan");
    assert_eq!(ledger(&gw, &ws)["balance_cents"], 80, "a plan-paid request leaves the balance alone");

    let r = twenty_cents(&gw, &key).await;
    assert_eq!(funding(&r).as_deref(), Some("plan"));
    assert_eq!(r.header("x-service-plan-5h-used-percent").as_deref(), Some("50"));
    let p = plan_state(&gw, &ws);
    assert_eq!(p["five_hour"]["used_microcents"], 40 * M, "{p}");

    // The window is full, credits after limits are off: Standby pays.
    let r = twenty_cents(&gw, &key).await;
    assert_eq!(r.status, 200, "{}", r.text);
    assert_eq!(funding(&r).as_deref(), Some("standby"));
    assert_eq!(r.header("x-service-plan-5h-used-percent").as_deref(), Some("100"));
    assert_eq!(r.json()["usage"]["service"]["paid_from"], "standby");
    assert_eq!(r.json()["usage"]["service"]["plan_value_microcents"], 20 * M);
    plan_state(&gw, &ws); // its Standby slot is free again
    let r = twenty_cents(&gw, &key).await;
    assert_eq!(funding(&r).as_deref(), Some("standby"), "20 of 30 cents used: room left");

    // Standby's day is used up too: refused, with every field.
    plan_state(&gw, &ws);
    let r = twenty_cents(&gw, &key).await;
    let v = r.assert_error(402, "plan_limit_reached");
    let e = &v["error"];
    assert_eq!(e["type"], "permission_error");
    assert_eq!(e["limit"], "five_hour");
    assert!(e["resets_at"].as_str().unwrap().ends_with('Z'));
    assert_eq!(e["tier"], "starter");
    assert_eq!(e["used_microcents"], 40 * M);
    assert_eq!(e["limit_microcents"], 40 * M);
    assert_eq!(e["pending_microcents"], 0);
    assert!(e["standby_resets_at"].as_str().unwrap().ends_with("T00:00:00Z"));
    assert_eq!(e["standby_blocker"], "exhausted");
    let c = &e["credits"];
    assert_eq!(c["enabled"], false);
    assert_eq!(c["cap_cents"], Value::Null);
    assert_eq!(c["balance_cents"], 80);
    assert_eq!(c["month_spent_microcents"], 0);
    assert_eq!(c["pending_max_holds_microcents"], 0);
    assert_eq!(c["blocker"], "disabled");
    let fixes: Vec<&str> = e["fixes"].as_array().unwrap().iter().map(|f| f["code"].as_str().unwrap()).collect();
    assert!(fixes.contains(&"enable_credits") && fixes.contains(&"ask_owner"), "{fixes:?}");
    assert!(e["fixes"][0]["label"].is_string());
    assert_eq!(r.header("x-should-retry").as_deref(), Some("false"));
    assert_eq!(funding(&r).as_deref(), Some("refused"));
    assert!(r.header("retry-after").is_none());

    // Credits after limits, capped at 30 cents: one 20-cent request fits, the next does not.
    set_plan(
        &gw,
        &ws,
        json!({"tier": "starter", "status": "active", "credits_after_limits": {"enabled": true, "cap_cents": 30}}),
    );
    let r = twenty_cents(&gw, &key).await;
    assert_eq!(r.status, 200, "{}", r.text);
    assert_eq!(funding(&r).as_deref(), Some("credits"));
    let u = &r.json()["usage"];
    assert_eq!(u["service"]["cost_microcents"], 20 * M);
    assert!(u["service"].get("paid_from").is_none(), "credit-funded usage has no paid_from: {u}");
    assert_eq!(ledger(&gw, &ws)["balance_cents"], 60);
    let r = twenty_cents(&gw, &key).await;
    let e = r.assert_error(402, "plan_limit_reached");
    assert_eq!(e["error"]["credits"]["blocker"], "cap");
    assert_eq!(e["error"]["credits"]["month_spent_microcents"], 20 * M);

    // No cap, but this key's monthly limit is reached: only credits after limits are blocked.
    set_plan(
        &gw,
        &ws,
        json!({"tier": "starter", "status": "active", "credits_after_limits": {"enabled": true, "cap_cents": null}}),
    );
    let limited = gw.mint_key(&ws, json!({"monthly_spend_limit_cents": 100, "credits_only": true}));
    let (limited_id, limited_key) = (limited["id"].as_str().unwrap(), limited["key"].as_str().unwrap());
    gw.admin(
        "POST",
        &format!("/admin/v1/workspaces/{ws}/credits"),
        Some(json!({"amount_cents": 1000, "source": "purchase"})),
    );
    let mut b = chat_body("pricey-model", false);
    b["max_tokens"] = json!(100);
    let auth = format!("Bearer {limited_key}");
    let r = gw.post_as("/v1/chat/completions", &b, &[("authorization", &auth), ("x-mock-tokens", "100")]).await;
    assert_eq!(r.status, 200, "a credits-only key pays as it goes: {}", r.text);
    assert_eq!(funding(&r), None, "credits-only keys skip the plan and its headers");
    ledger(&gw, &ws);
    let (s, _) = gw.admin("PATCH", &format!("/admin/v1/keys/{limited_id}"), Some(json!({"credits_only": false})));
    assert_eq!(s, 200);
    let r = twenty_cents(&gw, limited_key).await;
    let e = r.assert_error(402, "plan_limit_reached");
    assert_eq!(e["error"]["credits"]["blocker"], "key_limit");
    // Another key of the workspace still gets credits after limits.
    let r = twenty_cents(&gw, &key).await;
    assert_eq!(funding(&r).as_deref(), Some("credits"), "{}", r.text);

    // A negative balance blocks credits after limits: a prompt far above its estimate.
    let big = gw.mint_key(&ws, json!({"credits_only": true}));
    let auth = format!("Bearer {}", big["key"].as_str().unwrap());
    let mut b = chat_body("shared-cache-model", false);
    b["max_tokens"] = json!(1);
    let r =
        gw.post_as("/v1/chat/completions", &b, &[("authorization", &auth), ("x-mock-prompt-tokens", "20000000")]).await;
    assert_eq!(r.status, 200, "{}", r.text);
    let balance = ledger(&gw, &ws)["balance_cents"].as_i64().unwrap();
    assert!(balance < 0, "{balance}");
    let r = twenty_cents(&gw, &key).await;
    let e = r.assert_error(402, "plan_limit_reached");
    assert_eq!(e["error"]["credits"]["blocker"], "balance_negative");
    assert_eq!(e["error"]["credits"]["balance_cents"], balance);
}

#[tokio::test]
async fn funding_order_and_blockers_on_sqlite() {
    funding_order(false).await
}

#[tokio::test]
async fn funding_order_and_blockers_on_postgres() {
    funding_order(true).await
}

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

async fn dialect_headers(postgres: bool) {
    let url = if postgres { Some(pg::fresh_database().await) } else { None };
    let mock = Mock::start();
    let gw = Gateway::start_with(&mock, opts(postgres, url, plans_yaml(0.2, 4, 1)));
    set_plan(&gw, &gw.workspace, json!({"tier": "starter", "status": "active"}));
    let msg = json!({"model": "chat-model", "max_tokens": 50, "messages": [{"role": "user", "content": "hi"}]});
    let r = gw.post("/v1/messages", &msg, &[("anthropic-version", "2023-06-01")]).await;
    assert_eq!(r.status, 200, "{}", r.text);
    assert_eq!(funding(&r).as_deref(), Some("plan"));
    assert_eq!(r.header("x-service-plan").as_deref(), Some("starter"));
    let u = &r.json()["usage"];
    assert_eq!(u["cost"].as_f64(), Some(0.0), "{u}");
    assert_eq!(u["service"]["cost_microcents"], 0);
    assert_eq!(u["service"]["paid_from"], "plan");
    assert!(u["service"]["plan_value_microcents"].as_i64().unwrap() > 0);
    // The streamed message_delta carries it too.
    let mut streamed = msg.clone();
    streamed["stream"] = json!(true);
    let r = gw.post("/v1/messages", &streamed, &[("anthropic-version", "2023-06-01")]).await;
    assert_eq!(funding(&r).as_deref(), Some("plan"));
    let delta = r.sse_data().into_iter().find(|d| d.contains("\"message_delta\"")).expect("message_delta");
    let delta: Value = serde_json::from_str(&delta).unwrap();
    assert_eq!(delta["usage"]["service"]["paid_from"], "plan", "{delta}");

    let resp = json!({"model": "chat-model", "input": "hi", "max_output_tokens": 50});
    let r = gw.post("/v1/responses", &resp, &[]).await;
    assert_eq!(r.status, 200, "{}", r.text);
    assert_eq!(funding(&r).as_deref(), Some("plan"));
    let u = &r.json()["usage"];
    assert_eq!(u["service"]["paid_from"], "plan", "{u}");
    assert_eq!(u["service"]["cost_microcents"], 0);

    // A streamed chat answer's usage frame says the plan paid.
    let mut b = chat_body("chat-model", true);
    b["stream_options"] = json!({"include_usage": true});
    let r = gw.post("/v1/chat/completions", &b, &[]).await;
    assert_eq!(funding(&r).as_deref(), Some("plan"));
    let usage = r.sse_data().into_iter().rev().find(|d| d.contains("\"usage\"")).expect("a usage frame");
    let usage: Value = serde_json::from_str(&usage).unwrap();
    assert_eq!(usage["usage"]["service"]["paid_from"], "plan", "{usage}");
    assert_eq!(usage["usage"]["service"]["cost_microcents"], 0);

    // A promotional zero-price request makes no funding decision.
    let r = gw.post("/v1/chat/completions", &chat_body("free-model", false), &[]).await;
    assert_eq!(r.status, 200, "{}", r.text);
    assert_eq!(funding(&r), None, "free window: no funding headers");

    // count_tokens is not billed and carries no funding decision.
    let r = gw.post("/v1/messages/count_tokens", &msg, &[("anthropic-version", "2023-06-01")]).await;
    assert_eq!(r.status, 200, "{}", r.text);
    assert_eq!(funding(&r), None);
}

#[tokio::test]
async fn messages_routes_answer_a_plan_limit_as_billing_error() {
    let mock = Mock::start();
    let gw = Gateway::start_with(&mock, opts(false, None, plans_yaml(0.2, 4, 0)));
    set_plan(&gw, &gw.workspace, json!({"tier": "starter", "status": "active"}));
    // Fill the window on the chat route, then ask on the messages route.
    assert_eq!(funding(&twenty_cents(&gw, &gw.key).await).as_deref(), Some("plan"));
    assert_eq!(funding(&twenty_cents(&gw, &gw.key).await).as_deref(), Some("plan"));
    plan_state(&gw, &gw.workspace);
    let msg = json!({"model": "chat-model", "max_tokens": 50, "messages": [{"role": "user", "content": "hi"}]});
    let r = gw.post("/v1/messages", &msg, &[("anthropic-version", "2023-06-01")]).await;
    assert_eq!(r.status, 402, "{}", r.text);
    let v = r.json();
    assert_eq!(v["type"], "error");
    assert_eq!(v["error"]["type"], "billing_error");
    let m = v["error"]["message"].as_str().unwrap();
    assert!(m.contains("5-hour limit") && m.contains("Standby"), "self-contained: {m}");
    assert_eq!(funding(&r).as_deref(), Some("refused"));
}

async fn usage_snapshot(postgres: bool) {
    let url = if postgres { Some(pg::fresh_database().await) } else { None };
    let mock = Mock::start();
    let gw = Gateway::start_with(&mock, opts(postgres, url, plans_yaml(0.2, 4, 1)));
    // No plan yet: current is null.
    let r = gw.get("/v1/usage").await;
    assert_eq!(r.status, 200, "{}", r.text);
    assert_eq!(r.header("cache-control").as_deref(), Some("no-store"));
    let v = r.json();
    assert_eq!(v["workspace_id"], gw.workspace.as_str());
    assert_eq!(v["covers"], json!(["chat", "embeddings", "rerank"]));
    assert_eq!(v["order"], json!(["plan", "credits", "standby", "refused"]));
    assert_eq!(v["coding_plan"]["availability"], "available");
    assert!(v["coding_plan"]["observed_at"].is_string());
    assert_eq!(v["coding_plan"]["current"], Value::Null);

    set_plan(
        &gw,
        &gw.workspace,
        json!({"tier": "starter", "status": "active", "credits_after_limits": {"enabled": true, "cap_cents": 500}}),
    );
    let c = gw.get("/v1/usage").await.json()["coding_plan"]["current"].clone();
    assert_eq!(c["tier"], "starter");
    assert_eq!(c["interval"], "month");
    assert_eq!(c["status"], "active");
    assert_eq!(c["tile_state"], "active");
    assert_eq!(c["serving"], true);
    assert_eq!(c["price_cents"], 1000);
    assert_eq!(c["cancel_at"], Value::Null);
    assert!(c["renews_at"].is_string());
    assert_eq!(c["five_hour_limit_microcents"], 40 * M);
    assert_eq!(c["plan_blocked_until"], Value::Null);
    assert_eq!(c["five_hour"], Value::Null, "no plan request has started the clock");
    assert_eq!(c["week"]["used_microcents"], 0);
    assert_eq!(c["week"]["limit_microcents"], 300 * M);
    assert_eq!(c["standby_day"]["limit_microcents"], 30 * M);
    assert!(c["standby_day"]["resets_at"].as_str().unwrap().ends_with("T00:00:00Z"));
    assert_eq!(c["included_month"]["used_microcents"], 0);
    assert_eq!(c["pending_change"], Value::Null);
    assert_eq!(c["credits"]["enabled"], true);
    assert_eq!(c["credits"]["cap_cents"], 500);
    assert_eq!(c["credits"]["balance_cents"], 100);
    assert_eq!(c["funding"], Value::Null);
    assert_eq!(c["predicted_funding"], "plan");
    assert_eq!(c["remedy_code"], Value::Null);
    assert_eq!(c["billing_frozen"], false);
    assert_eq!(c["copy"]["actual"], Value::Null);
    assert!(c["copy"]["summary"].is_string() && c["copy"]["policy"].is_string());

    assert_eq!(funding(&twenty_cents(&gw, &gw.key).await).as_deref(), Some("plan"));
    assert_eq!(funding(&twenty_cents(&gw, &gw.key).await).as_deref(), Some("plan"));
    plan_state(&gw, &gw.workspace);
    let c = gw.get("/v1/usage").await.json()["coding_plan"]["current"].clone();
    assert_eq!(c["five_hour"]["used_microcents"], 40 * M);
    assert_eq!(c["five_hour"]["used_percent"], 100);
    assert!(c["five_hour"]["starts_at"].is_string() && c["five_hour"]["resets_at"].is_string());
    assert_eq!(c["week"]["used_percent"], 13, "40 of 300 cents");
    assert_eq!(c["included_month"]["used_microcents"], 40 * M);
    assert_eq!(c["plan_blocked_until"], c["five_hour"]["resets_at"]);
    assert_eq!(c["tile_state"], "limited");
    assert_eq!(c["predicted_funding"], "credits");

    // A frozen account refuses every request: that is the prediction too (decision 168).
    let ws = gw.workspace.clone();
    let (s, _) = gw.admin("POST", &format!("/admin/v1/workspaces/{ws}/freeze"), Some(json!({"reason": "unpaid"})));
    assert_eq!(s, 200);
    let deadline = std::time::Instant::now() + std::time::Duration::from_secs(5);
    let c = loop {
        let c = gw.get("/v1/usage").await.json()["coding_plan"]["current"].clone();
        if c["billing_frozen"] == true || std::time::Instant::now() > deadline {
            break c;
        }
        tokio::time::sleep(std::time::Duration::from_millis(100)).await;
    };
    assert_eq!(c["billing_frozen"], true, "{c}");
    assert_eq!(c["predicted_funding"], "refused", "{c}");
    assert_eq!((c["remedy_code"].clone(), c["resumes_at"].clone()), (Value::Null, Value::Null), "{c}");
    twenty_cents(&gw, &gw.key).await.assert_error(402, "account_frozen");
    gw.admin("POST", &format!("/admin/v1/workspaces/{ws}/unfreeze"), None);

    // Wrong method, and keys that may not read it.
    let r = gw.post("/v1/usage", &json!({}), &[]).await;
    r.assert_error(405, "method_not_allowed");
    assert_eq!(r.header("allow").as_deref(), Some("GET"));
    let scoped = gw.mint_key(&gw.workspace, json!({"scope": "deployment"}));
    let r = gw.get_as("/v1/usage", &[("authorization", &format!("Bearer {}", scoped["key"].as_str().unwrap()))]).await;
    r.assert_error(403, "usage_scope_violation");
}

async fn not_paying(postgres: bool) {
    let url = if postgres { Some(pg::fresh_database().await) } else { None };
    let mock = Mock::start();
    let gw = Gateway::start_with(&mock, opts(postgres, url, plans_yaml(0.2, 4, 1)));
    set_plan(&gw, &gw.workspace, json!({"tier": "pro", "status": "unpaid"}));
    let r = twenty_cents(&gw, &gw.key).await;
    assert_eq!(r.status, 200, "{}", r.text);
    assert_eq!(funding(&r), None, "a non-serving plan makes no funding decision");
    let mut b = chat_body("pricey-model", false);
    b["max_tokens"] = json!(500);
    let r = gw.post("/v1/chat/completions", &b, &[]).await;
    let v = r.assert_error(402, "insufficient_credits");
    let m = v["error"]["message"].as_str().unwrap();
    assert!(m.contains("pro coding plan is not paying (unpaid)"), "{m}");
    let c = gw.get("/v1/usage").await.json()["coding_plan"]["current"].clone();
    assert_eq!(c["serving"], false);
    assert_eq!(c["tile_state"], "ended");
    assert_eq!(c["predicted_funding"], Value::Null);
    assert_eq!(c["renews_at"], Value::Null);
    // Clearing the plan.
    let (s, _) = gw.admin("DELETE", &format!("/admin/v1/workspaces/{}/plan", gw.workspace), None);
    assert_eq!(s, 200);
    assert_eq!(gw.get("/v1/usage").await.json()["coding_plan"]["current"], Value::Null);
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
async fn the_model_object_shows_plan_concurrency_and_the_pro_token_floor_only_while_the_plan_serves() {
    let mock = Mock::start();
    let gw = Gateway::start_with(
        &mock,
        Opts { limits: Some(String::new()), extra_yaml: plans_yaml(0.2, 3, 1), ..Opts::default() },
    );
    let model = |v: &Value, id: &str| v["data"].as_array().unwrap().iter().find(|m| m["id"] == id).cloned().unwrap();
    let m = gw.get("/v1/models/chat-model").await.json();
    assert!(m.get("max_concurrent_plan_requests_per_workspace").is_none(), "{m}");
    assert!(m.get("max_concurrent_standby_requests_per_workspace").is_none());
    assert_eq!(m["max_tokens_per_minute_per_workspace"], 1_000_000);

    set_plan(&gw, &gw.workspace, json!({"tier": "starter", "status": "active"}));
    tokio::time::sleep(std::time::Duration::from_millis(700)).await; // key cache lifetime
    let list = gw.get("/v1/models").await.json();
    let m = model(&list, "chat-model");
    assert_eq!(m["max_concurrent_plan_requests_per_workspace"], 3, "{m}");
    assert_eq!(m["max_concurrent_standby_requests_per_workspace"], 1);
    assert_eq!(m["max_tokens_per_minute_per_workspace"], 1_000_000, "starter has no token floor");
    assert!(model(&list, "embed-model").get("max_concurrent_plan_requests_per_workspace").is_none(), "unpriced");
    let embed = model(&list, "priced-embed-model");
    assert_eq!(embed["max_concurrent_plan_requests_per_workspace"], 3, "embeddings are covered: {embed}");
    assert!(embed.get("max_concurrent_standby_requests_per_workspace").is_none(), "Standby's field: chat models");
    assert!(model(&list, "dead-model").get("max_concurrent_plan_requests_per_workspace").is_none(), "unpriced");

    set_plan(&gw, &gw.workspace, json!({"tier": "pro", "status": "active"}));
    tokio::time::sleep(std::time::Duration::from_millis(700)).await;
    let m = gw.get("/v1/models/chat-model").await.json();
    assert_eq!(m["max_tokens_per_minute_per_workspace"], 20_000_000, "the Pro floor: {m}");
    assert_eq!(m["max_concurrent_plan_requests_per_workspace"], 4, "pro's default");

    set_plan(&gw, &gw.workspace, json!({"tier": "pro", "status": "disputed"}));
    tokio::time::sleep(std::time::Duration::from_millis(700)).await;
    let m = gw.get("/v1/models/chat-model").await.json();
    assert!(m.get("max_concurrent_plan_requests_per_workspace").is_none(), "a plan that does not serve: {m}");
    assert_eq!(m["max_tokens_per_minute_per_workspace"], 1_000_000);
}

#[tokio::test]
async fn a_serving_plan_pays_for_embeddings_and_meters_their_usage() {
    let mock = Mock::start();
    let gw = Gateway::start_with(&mock, opts(false, None, plans_yaml(0.2, 4, 1)));
    set_plan(&gw, &gw.workspace, json!({"tier": "starter", "status": "active"}));
    // priced-embed-model: input a cent a token; the replica reports 6 tokens.
    let b = json!({"model": "priced-embed-model", "input": "hello"});
    let r = gw.post("/v1/embeddings", &b, &[("x-mock-prompt-tokens", "6")]).await;
    assert_eq!(r.status, 200, "{}", r.text);
    assert_eq!(funding(&r).as_deref(), Some("plan"), "embeddings are a covered category");
    assert_eq!(r.json()["object"], "list", "the answer is forwarded as the replica wrote it");
    let p = plan_state(&gw, &gw.workspace);
    assert_eq!(p["five_hour"]["used_microcents"], 6 * M, "the reported usage is metered: {p}");
    assert_eq!(ledger(&gw, &gw.workspace)["balance_cents"], 100, "the balance is untouched");
}

#[tokio::test]
async fn an_idempotent_replay_keeps_the_original_funding_receipt_and_meters_once() {
    let mock = Mock::start();
    let gw = Gateway::start_with(&mock, opts(false, None, plans_yaml(0.2, 4, 1)));
    set_plan(&gw, &gw.workspace, json!({"tier": "starter", "status": "active"}));
    let mut b = chat_body("pricey-model", false);
    b["max_tokens"] = json!(10);
    let key = [("idempotency-key", "plan-replay-1"), ("x-mock-tokens", "10")];
    let first = gw.post("/v1/chat/completions", &b, &key).await;
    assert_eq!(first.status, 200, "{}", first.text);
    assert_eq!(funding(&first).as_deref(), Some("plan"));
    // Another request moves the window on.
    assert_eq!(funding(&twenty_cents(&gw, &gw.key).await).as_deref(), Some("plan"));
    plan_state(&gw, &gw.workspace);
    let replay = gw.post("/v1/chat/completions", &b, &key).await;
    assert_eq!(replay.status, 200, "{}", replay.text);
    assert_eq!(replay.header("x-service-idempotent-replay").as_deref(), Some("true"));
    for h in ["x-service-funding", "x-service-plan", "x-service-plan-5h-used-percent", "x-service-plan-5h-resets-at"] {
        assert_eq!(replay.header(h), first.header(h), "{h}: the original receipt");
    }
    assert_eq!(replay.json()["usage"]["service"]["paid_from"], "plan");
    let p = plan_state(&gw, &gw.workspace);
    assert_eq!(p["five_hour"]["used_microcents"], 30 * M, "10 + 20 cents: the replay metered nothing: {p}");
    // On the Responses route only `X-Service-Idempotent-Replay` survives (decision 178).
    let rb = json!({"model": "chat-model", "input": "hi", "max_output_tokens": 10});
    let key = [("idempotency-key", "plan-replay-responses"), ("x-mock-tokens", "10")];
    let first = gw.post("/v1/responses", &rb, &key).await;
    assert_eq!((first.status, funding(&first).as_deref()), (200, Some("plan")), "{}", first.text);
    let replay = gw.post("/v1/responses", &rb, &key).await;
    assert_eq!(replay.status, 200, "{}", replay.text);
    assert_eq!(replay.header("x-service-idempotent-replay").as_deref(), Some("true"));
    assert_eq!(replay.json(), first.json(), "the same Responses object");
    for h in
        ["x-service-funding", "x-service-plan", "x-service-plan-5h-used-percent", "x-service-plan-week-used-percent"]
    {
        assert!(replay.header(h).is_none(), "{h} does not survive a Responses replay");
    }
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

#[tokio::test]
async fn a_window_held_by_running_requests_waits_then_answers_plan_window_busy_on_sqlite() {
    window_wait(false).await
}

#[tokio::test]
async fn a_window_held_by_running_requests_waits_then_answers_plan_window_busy_on_postgres() {
    window_wait(true).await
}

#[tokio::test]
async fn funding_headers_and_plan_paid_usage_on_messages_and_responses_on_sqlite() {
    dialect_headers(false).await
}

#[tokio::test]
async fn funding_headers_and_plan_paid_usage_on_messages_and_responses_on_postgres() {
    dialect_headers(true).await
}

#[tokio::test]
async fn usage_snapshot_field_by_field_on_sqlite() {
    usage_snapshot(false).await
}

#[tokio::test]
async fn usage_snapshot_field_by_field_on_postgres() {
    usage_snapshot(true).await
}

#[tokio::test]
async fn a_plan_that_is_not_paying_falls_back_to_credits_and_says_so_on_sqlite() {
    not_paying(false).await
}

#[tokio::test]
async fn a_plan_that_is_not_paying_falls_back_to_credits_and_says_so_on_postgres() {
    not_paying(true).await
}
