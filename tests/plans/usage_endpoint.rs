//! `GET /v1/usage` field by field, on both backends.

use super::*;

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

#[tokio::test]
async fn usage_snapshot_field_by_field_on_sqlite() {
    usage_snapshot(false).await
}

#[tokio::test]
async fn usage_snapshot_field_by_field_on_postgres() {
    usage_snapshot(true).await
}
