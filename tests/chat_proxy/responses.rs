//! The response normalisation: the Usage object and its cost, shared cache hits, reasoning kept off content.

use super::*;

#[tokio::test]
async fn non_streaming_usage_object_and_cost_with_cached_tier() {
    let mock = Mock::start();
    let gw = Gateway::start(&mock);
    let r = gw
        .post(
            "/v1/chat/completions",
            &chat_body("chat-model", false),
            &[("x-mock-prompt-tokens", "1000"), ("x-mock-cached-tokens", "400"), ("x-mock-tokens", "100")],
        )
        .await;
    assert_eq!(r.status, 200, "{}", r.text);
    let v = r.json();
    assert_eq!(v["object"], "chat.completion");
    assert_eq!(v["model"], "chat-model", "the catalog id, not the upstream name");
    let u = &v["usage"];
    assert_eq!(u["prompt_tokens"], 1000);
    assert_eq!(u["completion_tokens"], 100);
    assert_eq!(u["total_tokens"], 1100);
    assert_eq!(u["prompt_tokens_details"]["cached_tokens"], 400);
    assert_eq!(u["service"]["cached_input_tokens"], 400);
    // 600 x $0.10 + 400 x $0.05 + 100 x $0.30 per Mtok = 11,000 microcents.
    assert_eq!(u["service"]["cost_microcents"], 11_000);
    assert!(r.text.contains("\"cost\":0.00011000"), "eight decimals: {}", r.text);
    assert!(u["service"].get("output_token_accounting").is_none());
    assert!(r.header("content-length").is_none() || r.header("transfer-encoding").is_none());
}

#[tokio::test]
async fn shared_cache_hits_are_reported_zero_and_priced_uncached() {
    let mock = Mock::start();
    let gw = Gateway::start(&mock);
    let r = gw
        .post(
            "/v1/chat/completions",
            &chat_body("shared-cache-model", false),
            &[("x-mock-prompt-tokens", "1000"), ("x-mock-cached-tokens", "400"), ("x-mock-tokens", "10")],
        )
        .await;
    let u = &r.json()["usage"];
    assert_eq!(u["prompt_tokens_details"]["cached_tokens"], 0);
    // 1000 x $1 + 10 x $2 per Mtok = 102,000 microcents.
    assert_eq!(u["service"]["cost_microcents"], 102_000);
}

#[tokio::test]
async fn reasoning_is_never_on_content_and_no_answer_is_annotated() {
    let mock = Mock::start();
    let gw = Gateway::start(&mock);
    let mut b = chat_body("chat-model", false);
    b["max_tokens"] = json!(4);
    // All four tokens are reasoning: the budget ran out before any answer.
    let r = gw.post("/v1/chat/completions", &b, &[("x-mock-reasoning", "10"), ("x-mock-tokens", "10")]).await;
    let v = r.json();
    let choice = &v["choices"][0];
    assert!(choice["message"]["reasoning"].as_str().unwrap().starts_with("think0"));
    assert!(choice["message"].get("reasoning_content").is_none());
    assert!(choice["message"]["content"].is_null());
    assert_eq!(choice["finish_reason"], "length");
    assert_eq!(choice["service"]["output_status"]["code"], "generation_limit_reached_before_answer");
    let acc = &v["usage"]["service"]["output_token_accounting"];
    assert_eq!(acc["visible_answer_tokens"], 0);
    assert_eq!(acc["non_answer_completion_tokens"], 4);
    assert_eq!(acc["sources"]["visible_answer_tokens"], "proxy_classified");
    assert_eq!(acc["sources"]["non_answer_completion_tokens"], "provider_reported");

    // With an answer: no output_status, reasoning separate from content.
    let r = gw
        .post(
            "/v1/chat/completions",
            &chat_body("chat-model", false),
            &[("x-mock-reasoning", "2"), ("x-mock-tokens", "5")],
        )
        .await;
    let v = r.json();
    assert_eq!(v["choices"][0]["message"]["reasoning"], "think0 think1 ");
    assert_eq!(v["choices"][0]["message"]["content"], "tok2 tok3 tok4 ");
    assert!(v["choices"][0].get("service").is_none());

    // A tool call is an answer.
    let r =
        gw.post("/v1/chat/completions", &chat_body("chat-model", false), &[("x-mock-tool-call", "get_weather")]).await;
    let v = r.json();
    assert_eq!(v["choices"][0]["finish_reason"], "tool_calls");
    assert!(v["choices"][0].get("service").is_none());
}
