//! The 402s with their fields, frozen workspaces, key spending limits, and holds released on failure.

use super::*;

#[tokio::test]
async fn insufficient_credits_402_has_its_fields_and_reaches_no_replica() {
    let mock = Mock::start();
    let gw = Gateway::start(&mock);
    // 4096 output tokens at $10,000 per Mtok: a $40.96 hold against a $1 balance.
    let r = gw.post("/v1/chat/completions", &chat_body("pricey-model", false), &[]).await;
    let v = r.assert_error(402, "insufficient_credits");
    assert_eq!(v["error"]["type"], "permission_error");
    assert_eq!(v["error"]["required_cents"], 4096);
    assert_eq!(v["error"]["current_balance_cents"], 100);
    assert_eq!(v["error"]["topup_url"], "https://pay.example.com/top-up");
    assert!(v["error"].get("free_window_ended_at").is_none());
    assert!(r.header("retry-after").is_none());
    assert_eq!(mock.stats().await["requests"], 0);
    // A smaller ceiling fits: the hold follows max_tokens.
    let mut b = chat_body("pricey-model", false);
    b["max_tokens"] = json!(50);
    let r = gw.post("/v1/chat/completions", &b, &[("x-mock-tokens", "5")]).await;
    assert_eq!(r.status, 200, "{}", r.text);
    let u = &r.json()["usage"];
    assert_eq!(u["service"]["cost_microcents"], 5_000_000, "5 tokens at a cent each");
    // The settlement commits just after the answer (decision 128).
    let l = gw.settled_ledger();
    assert_eq!(l["balance_cents"], 95);
    assert_eq!(l["held_cents"], 0);
}

#[tokio::test]
async fn every_failure_before_output_releases_the_hold() {
    let mock = Mock::start();
    let gw = Gateway::start(&mock);
    let mut b = chat_body("pricey-model", false);
    b["max_tokens"] = json!(10);
    for headers in [vec![("x-mock-status", "500")], vec![("x-mock-status", "400")], vec![("x-mock-abort-after", "0")]] {
        let r = gw.post("/v1/chat/completions", &b, &headers).await;
        assert_ne!(r.status, 200, "{headers:?}");
    }
    let r = gw.post("/v1/chat/completions", &chat_body("dead-model", false), &[]).await;
    assert_eq!(r.status, 503);
    // Settlement runs in the log phase, just after the answer went out.
    tokio::time::sleep(std::time::Duration::from_millis(300)).await;
    // A refusal after the hold would have been placed (client error from the replica) and
    // the paused model: nothing charged, nothing held.
    let l = balance(&gw, &gw.workspace);
    assert_eq!((l["balance_cents"].as_i64(), l["held_cents"].as_i64()), (Some(100), Some(0)), "{l}");
    let kinds: Vec<&str> = l["entries"].as_array().unwrap().iter().map(|e| e["kind"].as_str().unwrap()).collect();
    assert!(!kinds.contains(&"settlement"), "{kinds:?}");
}

#[tokio::test]
async fn frozen_workspaces_and_key_spending_limits() {
    let mock = Mock::start();
    let gw = Gateway::start(&mock);
    let ws = gw.workspace.clone();
    let (s, _) = gw.admin("POST", &format!("/admin/v1/workspaces/{ws}/freeze"), Some(json!({"reason": "dispute"})));
    assert_eq!(s, 200);
    tokio::time::sleep(std::time::Duration::from_millis(600)).await; // key cache freshness
    let r = gw.post("/v1/chat/completions", &chat_body("chat-model", false), &[]).await;
    let v = r.assert_error(402, "account_frozen");
    assert!(v["error"]["message"].as_str().unwrap().contains("dispute"));
    top_up(&gw, &ws, 1000);
    tokio::time::sleep(std::time::Duration::from_millis(600)).await;
    gw.post("/v1/chat/completions", &chat_body("chat-model", false), &[]).await.assert_error(402, "account_frozen");
    gw.admin("POST", &format!("/admin/v1/workspaces/{ws}/unfreeze"), None);
    tokio::time::sleep(std::time::Duration::from_millis(600)).await;
    assert_eq!(gw.post("/v1/chat/completions", &chat_body("chat-model", false), &[]).await.status, 200);

    // A key limited to $1.00 a month: 20 tokens of pricey-model cost 20 cents a request.
    let limited = gw.mint_key(&ws, json!({"monthly_spend_limit_cents": 100}));
    let bearer = format!("Bearer {}", limited["key"].as_str().unwrap());
    let mut b = chat_body("pricey-model", false);
    b["max_tokens"] = json!(20);
    let mut ok = 0;
    let refusal = loop {
        let r = gw.post_as("/v1/chat/completions", &b, &[("authorization", &bearer), ("x-mock-tokens", "20")]).await;
        if r.status != 200 {
            break r;
        }
        ok += 1;
        assert!(ok <= 5, "the limit must stop the key");
        // Settlement lands in the log phase, after the answer: let it land.
        tokio::time::sleep(std::time::Duration::from_millis(100)).await;
    };
    assert_eq!(ok, 5);
    let v = refusal.assert_error(402, "spend_limit_reached");
    assert_eq!(v["error"]["limit_cents"], 100);
    assert_eq!(v["error"]["spent_cents"], 100);
    assert!(v["error"]["resets_at"].as_str().unwrap().ends_with("-01T00:00:00Z"));
    // Other keys and the balance are unaffected.
    assert_eq!(gw.post("/v1/chat/completions", &b, &[("x-mock-tokens", "20")]).await.status, 200);
}
