//! The funding order and each credits blocker, and a plan that is not paying, on both backends.

use super::*;

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
async fn a_plan_that_is_not_paying_falls_back_to_credits_and_says_so_on_sqlite() {
    not_paying(false).await
}

#[tokio::test]
async fn a_plan_that_is_not_paying_falls_back_to_credits_and_says_so_on_postgres() {
    not_paying(true).await
}
