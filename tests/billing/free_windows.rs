//! Free windows: priced at zero inside, the ended window reported, a request priced as when it was made.

use super::*;

#[tokio::test]
async fn a_request_made_in_a_free_window_is_free_however_late_it_ends() {
    let written = std::time::Instant::now(); // the catalog's window closes 6 s after this
    let mock = Mock::start();
    let gw = Gateway::start(&mock);
    let ttft = CLOSING_FREE_WINDOW + std::time::Duration::from_secs(1);
    assert!(written.elapsed() < CLOSING_FREE_WINDOW / 2, "the gateway took too long to start for this test");
    let mut b = chat_body("closing-free-model", false);
    b["max_tokens"] = json!(10);
    let ttft_ms = ttft.as_millis().to_string();
    let r = gw.post("/v1/chat/completions", &b, &[("x-mock-tokens", "5"), ("x-mock-ttft-ms", &ttft_ms)]).await;
    assert_eq!(r.status, 200, "{}", r.text);
    assert!(written.elapsed() > CLOSING_FREE_WINDOW, "the answer ended after the window closed");
    assert_eq!(r.json()["usage"]["service"]["cost_microcents"], 0, "priced as when it was made: {}", r.text);
    tokio::time::sleep(std::time::Duration::from_millis(300)).await;
    let l = balance(&gw, &gw.workspace);
    assert_eq!((l["balance_cents"].as_i64(), l["held_cents"].as_i64()), (Some(100), Some(0)), "{l}");
    assert!(settled_costs(&l).is_empty(), "nothing charged: {l}");
}

#[tokio::test]
async fn free_window_prices_at_zero_and_recent_end_is_reported() {
    let mock = Mock::start();
    let gw = Gateway::start(&mock);
    // Inside the window: priced at zero, no hold even for a $40 ceiling.
    let r = gw.post("/v1/chat/completions", &chat_body("free-model", false), &[("x-mock-tokens", "9")]).await;
    assert_eq!(r.status, 200, "{}", r.text);
    let u = &r.json()["usage"];
    assert_eq!(u["service"]["cost_microcents"], 0);
    assert!(r.text.contains("\"cost\":0.00000000"));
    // Window closed yesterday: normal price, and the 402 says when the window ended.
    let r = gw.post("/v1/chat/completions", &chat_body("ended-free-model", false), &[]).await;
    let v = r.assert_error(402, "insufficient_credits");
    let ended = v["error"]["free_window_ended_at"].as_str().expect("free_window_ended_at");
    let ended: jiff::Timestamp = ended.parse().unwrap();
    let ago = jiff::Timestamp::now().duration_since(ended).as_secs();
    assert!((86_000..=87_000).contains(&ago), "{ago}");
    tokio::time::sleep(std::time::Duration::from_millis(200)).await;
    let l = balance(&gw, &gw.workspace);
    assert_eq!(l["balance_cents"], 100);
}
