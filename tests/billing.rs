//! Billing through the running gateway: the signup grant, `GET /v1/credits`, the 402s with
//! their fields, holds released on every failure before output, settlement equal to the
//! usage the client saw, cut-short streams, and 200 concurrent requests against a small
//! balance on both backends (the other store rules run on both in ledger_store.rs).
#![allow(clippy::unwrap_used, clippy::expect_used, clippy::panic)]

mod common;

use common::*;
use serde_json::{Value, json};

fn balance(gw: &Gateway, ws: &str) -> Value {
    let (s, v) = gw.admin("GET", &format!("/admin/v1/workspaces/{ws}/ledger"), None);
    assert_eq!(s, 200, "{v}");
    assert_eq!(v["check"]["consistent"], true, "stored balance == sum of entries: {v}");
    v
}

fn top_up(gw: &Gateway, ws: &str, cents: i64) {
    let (s, v) = gw.admin(
        "POST",
        &format!("/admin/v1/workspaces/{ws}/credits"),
        Some(json!({"amount_cents": cents, "source": "purchase"})),
    );
    assert_eq!(s, 201, "{v}");
}

/// The costs of the ledger's settlement entries, in entry order.
fn settled_costs(l: &Value) -> Vec<i64> {
    let entries = l["entries"].as_array().map(Vec::as_slice).unwrap_or_default();
    entries.iter().filter(|e| e["kind"] == "settlement").filter_map(|e| e["cost_microcents"].as_i64()).collect()
}

#[tokio::test]
async fn credits_object_and_signup_grant() {
    let mock = Mock::start();
    let gw = Gateway::start(&mock);
    let r = gw.get("/v1/credits").await;
    assert_eq!(r.status, 200, "{}", r.text);
    assert_eq!(r.header("cache-control").as_deref(), Some("no-store"));
    let v = r.json();
    assert_eq!(v["object"], "credits");
    assert_eq!(v["workspace_id"], gw.workspace.as_str());
    assert_eq!(v["balance_cents"], 100, "the $1 signup grant");
    assert_eq!(v["held_cents"], 0);
    assert_eq!(v["available_cents"], 100);
    assert_eq!(v["currency"], "usd");
    assert!(v["period"]["start"].as_str().unwrap().ends_with("-01T00:00:00Z"));
    assert_eq!(v["period"]["spent_cents"], 0);
    assert_eq!(
        v["spend_cap"],
        json!({"limit_cents": null, "hard": false, "used_cents": null, "remaining_cents": null, "gates_inference": false})
    );
    assert_eq!(v["plan_tier"], "free");
    assert!(v["as_of"].is_string());
    assert!(v.get("coding_plan").is_none());
    let r = gw.post("/v1/credits", &json!({}), &[]).await;
    r.assert_error(405, "method_not_allowed");
    assert_eq!(r.header("allow").as_deref(), Some("GET"));
}

#[path = "billing/free_windows.rs"]
mod free_windows;
#[path = "billing/holds.rs"]
mod holds;
#[path = "billing/instances.rs"]
mod instances;
#[path = "billing/refusals.rs"]
mod refusals;
#[path = "billing/settlement.rs"]
mod settlement;
