use super::*;

proptest::proptest! {
    /// The opener count only skips the scan where the scan would say "not deeper".
    #[test]
    fn deeper_than_agrees_with_the_scan(
        text in "[{}\\[\\]\"\\\\a,:]{0,300}",
        limit in 0usize..120,
    ) {
        proptest::prop_assert_eq!(deeper_than(&text, limit), nesting(&text) > limit);
    }
}

fn pricing(input: u64, output: u64, cached: Option<u64>) -> Pricing {
    Pricing { input, output, cached_input: cached }
}

#[test]
fn cost_uses_uncached_cached_and_output_rates() {
    // $0.10 / $0.30 / cached $0.05 per Mtok, in microcents per Mtok.
    let p = pricing(10_000_000, 30_000_000, Some(5_000_000));
    // 1000 prompt (400 cached), 100 completion:
    // 600*10 + 400*5 + 100*30 = 6000 + 2000 + 3000 = 11000 microcents.
    assert_eq!(cost_microcents(Some(&p), 1000, 400, 100), Microcents(11_000));
    // No cached tier: cached tokens billed at the input rate.
    let q = pricing(10_000_000, 30_000_000, None);
    assert_eq!(cost_microcents(Some(&q), 1000, 400, 100), Microcents(13_000));
    assert_eq!(cost_microcents(None, 1000, 0, 100), Microcents(0));
}

#[test]
fn sub_microcent_costs_round_half_up() {
    let p = pricing(150_000, 0, None); // $0.0015 per Mtok = 0.15 microcents per token
    assert_eq!(cost_microcents(Some(&p), 3, 0, 0), Microcents(0)); // 0.45
    assert_eq!(cost_microcents(Some(&p), 4, 0, 0), Microcents(1)); // 0.6
    assert_eq!(cost_microcents(Some(&p), 10, 0, 0), Microcents(2)); // 1.5
}

#[test]
fn a_usage_report_read_from_its_text_prices_as_its_value_does() {
    let dir = std::env::temp_dir().join(format!("tollgate-usage-{}", uuid::Uuid::new_v4().simple()));
    let _ = std::fs::create_dir_all(&dir);
    let models = "models:\n  - id: m\n    supported_endpoints: [chat_completions]\n    pricing: { input: 0.10, output: 0.30 }\n    cached_input_price: 0.05\n    cache_isolation: isolated\n";
    let _ = std::fs::write(dir.join("tollgate.yaml"), "threads: 1\n");
    let _ = std::fs::write(dir.join("models.yaml"), models);
    let _ = std::fs::write(dir.join("upstreams.yaml"), "pools: {}\n");
    let config = crate::config::load(&dir.join("tollgate.yaml"));
    let _ = std::fs::remove_dir_all(&dir);
    let model = match config.map(|c| c.catalog.models.into_iter().next()) {
        Ok(Some(m)) => m,
        other => panic!("fixture catalog: {:?}", other.err()),
    };
    assert!(model.pricing_at(0).is_some_and(|p| p.cached_input.is_some()), "a priced model with a cached tier");
    let reports = [
        r#"{"prompt_tokens":100,"completion_tokens":20,"total_tokens":120}"#,
        r#"{"prompt_tokens":100,"completion_tokens":20,"prompt_tokens_details":{"cached_tokens":40}}"#,
        r#"{"prompt_tokens":100,"completion_tokens":20,"prompt_tokens_details":{"cached_tokens":400}}"#,
        r#"{"prompt_tokens":100,"completion_tokens":0}"#,
        r#"{"prompt_tokens":100}"#,
        r#"{"completion_tokens":20}"#,
        r#"{"prompt_tokens":"100","completion_tokens":20}"#,
        r#"{"prompt_tokens":100.0,"completion_tokens":20}"#,
        r#"{"prompt_tokens":1e2,"completion_tokens":20}"#,
        r#"{"prompt_tokens":-0,"completion_tokens":20}"#,
        r#"{"prompt_tokens":-5,"completion_tokens":20}"#,
        r#"{"prompt_tokens":18446744073709551616,"completion_tokens":20}"#,
        r#"{"prompt_tokens":100,"completion_tokens":null,"total_tokens":7}"#,
        r#"{"prompt_tokens":100,"completion_tokens":{"a":1},"total_tokens":[1]}"#,
        r#"{"prompt_tokens":100,"completion_tokens":20,"prompt_tokens_details":null}"#,
        r#"{"prompt_tokens":100,"completion_tokens":20,"prompt_tokens_details":5}"#,
        r#"{"prompt_tokens":100,"completion_tokens":20,"prompt_tokens_details":{"cached_tokens":1,"cached_tokens":30}}"#,
        r#"{"prompt_tokens":1,"prompt_tokens":100,"completion_tokens":20}"#,
        r#"{ "prompt_tokens" : 100 , "completion_tokens" : 20 , "extra": {"x": [1, 2]} }"#,
        r#"[100, 20]"#,
        r#"[100, 20, 120, null]"#,
        r#"  {"prompt_tokens":100,"completion_tokens":20,"s":"{[\"}"}"#,
        r#"7"#,
        r#"null"#,
    ];
    let deep = format!(r#"{{"prompt_tokens":100,"completion_tokens":20,"x":{}1{}}}"#, "[".repeat(130), "]".repeat(130));
    let reports = reports.iter().map(|r| r.to_string()).chain([deep]);
    for r in reports {
        let r = r.as_str();
        // The general reading: a `Value` (too deep a report is none), then its members.
        let general = serde_json::from_str::<Value>(r)
            .ok()
            .and_then(|value| from_provider(&value, &model, 0))
            .map(|f| (f.prompt_tokens, f.cached_tokens, f.completion_tokens, f.total_tokens, f.cost));
        let text = from_provider_text(r, &model, 0, Ceilings::default())
            .map(|f| (f.prompt_tokens, f.cached_tokens, f.completion_tokens, f.total_tokens, f.cost));
        assert_eq!(text, general, "{r}");
    }
    assert!(
        from_provider_text(r#"{"prompt_tokens":100,"completion_tokens":20}"#, &model, 0, Ceilings::default()).is_some()
    );
    // A report above what the request allowed is believed only up to it (decision 180).
    let bounded = Ceilings { prompt: Some(1_000), completion: Some(50) };
    let f = from_provider_text(r#"{"prompt_tokens":100,"completion_tokens":1000000000000}"#, &model, 0, bounded);
    let f = f.unwrap_or_else(|| panic!("priced"));
    assert_eq!((f.prompt_tokens, f.completion_tokens, f.total_tokens), (100, 50, 150));
    let honest = from_provider_text(r#"{"prompt_tokens":100,"completion_tokens":50}"#, &model, 0, Ceilings::default());
    assert_eq!(Some(f.cost), honest.map(|h| h.cost), "priced as the ceiling's count");
    let f = from_provider_text(
        r#"{"prompt_tokens":900000,"completion_tokens":5,"prompt_tokens_details":{"cached_tokens":900000}}"#,
        &model,
        0,
        bounded,
    );
    assert_eq!(f.map(|f| (f.prompt_tokens, f.cached_tokens)), Some((1_000, 1_000)));
    // A forwarded answer's input is at most a token per byte of the request, plus 1,024.
    let claimed: Value = serde_json::json!({"prompt_tokens": 1_000_000_000_000u64});
    assert_eq!(from_forwarded(&model, 0, Some(&claimed), 100).prompt_tokens, 1_424);
    let honest: Value = serde_json::json!({"prompt_tokens": 90});
    assert_eq!(from_forwarded(&model, 0, Some(&honest), 100).prompt_tokens, 90);
}

#[test]
fn dollars_have_eight_decimals() {
    assert_eq!(dollars(0), "0.00000000");
    assert_eq!(dollars(1_234), "0.00001234");
    assert_eq!(dollars(250_000_001), "2.50000001");
}

#[test]
fn usage_object_is_valid_json_with_every_field() {
    let u = UsageFigures {
        prompt_tokens: 10,
        completion_tokens: 5,
        total_tokens: 15,
        cached_tokens: 4,
        cost: Microcents(1_234),
        basis: UsageBasis::ProviderReported,
        paid: None,
    };
    let v: Value = serde_json::from_str(&render_chat_usage(&u, true)).unwrap_or_default();
    assert_eq!(v["prompt_tokens_details"]["cached_tokens"], 4);
    assert_eq!(v["service"]["cached_input_tokens"], 4);
    assert_eq!(v["service"]["cost_microcents"], 1234);
    assert_eq!(v["cost"].as_f64(), Some(0.00001234));
    assert_eq!(v["service"]["output_token_accounting"]["non_answer_completion_tokens"], 5);
    let plain: Value = serde_json::from_str(&render_chat_usage(&u, false)).unwrap_or_default();
    assert!(plain["service"].get("output_token_accounting").is_none());
    // The exact text clients get: member order included.
    let paid = UsageFigures { cost: Microcents(1_200_000_000), ..u }.paid_by(Some(PaidFrom::Plan));
    assert_eq!(
        render_chat_usage(&paid, true),
        concat!(
            r#"{"prompt_tokens":10,"completion_tokens":5,"total_tokens":15,"#,
            r#""prompt_tokens_details":{"cached_tokens":4},"cost":0.00000000,"#,
            r#""service":{"cost_microcents":0,"cached_input_tokens":4,"#,
            r#""plan_value_microcents":1200000000,"paid_from":"plan","#,
            r#""output_token_accounting":{"visible_answer_tokens":0,"non_answer_completion_tokens":5,"#,
            r#""sources":{"visible_answer_tokens":"proxy_classified","non_answer_completion_tokens":"provider_reported"}}}}"#
        )
    );
    assert_eq!(Microcents(1_200_000_007).dollars(), "12.00000007");
    assert_eq!(Microcents(0).dollars(), "0.00000000");
}
