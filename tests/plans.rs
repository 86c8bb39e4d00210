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

#[path = "plans/across_routes.rs"]
mod across_routes;
#[path = "plans/funding_order.rs"]
mod funding_order;
#[path = "plans/plan_window.rs"]
mod plan_window;
#[path = "plans/usage_endpoint.rs"]
mod usage_endpoint;
