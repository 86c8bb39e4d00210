//! The test catalog (`models.yaml`), with free windows placed around the current time.

/// `closing-free-model`'s free window closes this long after the catalog is written.
pub const CLOSING_FREE_WINDOW: std::time::Duration = std::time::Duration::from_secs(6);

/// The test catalog, with free windows placed around the current time.
pub fn models_yaml() -> String {
    let now = jiff::Timestamp::now();
    let day = jiff::SignedDuration::from_hours(24);
    format!(
        "{MODELS_YAML}  - id: free-model\n    supported_endpoints: [chat_completions]\n    max_output_tokens: 4096\n    pricing: {{ input: 0, output: 10000 }}\n    free_window: {{ starts_at: \"{}\", ends_at: \"{}\" }}\n  - id: ended-free-model\n    supported_endpoints: [chat_completions]\n    max_output_tokens: 4096\n    pricing: {{ input: 0, output: 10000 }}\n    free_window: {{ starts_at: \"{}\", ends_at: \"{}\" }}\n  - id: closing-free-model\n    supported_endpoints: [chat_completions]\n    max_output_tokens: 4096\n    pricing: {{ input: 0, output: 10000 }}\n    free_window: {{ starts_at: \"{}\", ends_at: \"{}\" }}\n",
        now - day,
        now + day,
        now - day * 3,
        now - day,
        now - day,
        now + CLOSING_FREE_WINDOW,
    ) + &chat_rules_models_yaml()
}

/// Models for the chat request rules (`tests/chat_rules.rs`): one with every per-model rule
/// and a small window, one with image input and the test tokenizer.
pub fn chat_rules_models_yaml() -> String {
    let tokenizer = concat!(env!("CARGO_MANIFEST_DIR"), "/../tests/fixtures/tokenizers/tiny-bpe.json");
    format!(
        "  - id: rules-model\n    supported_endpoints: [chat_completions, messages]\n    json_mode: true\n    reasoning_efforts: [none, low, medium, high]\n    context_window: 300\n    system_message: first_only\n    json_format_effort: none\n    json_format_refused_efforts: [low, medium, high]\n    refused_efforts: [minimal]\n  - id: vision-model\n    supported_endpoints: [chat_completions, messages]\n    tool_calling: true\n    forced_tool_calling: limited\n    json_mode: true\n    input_modalities: [text, image]\n    context_window: 4096\n    tokenizer: \"{tokenizer}\"\n"
    )
}

pub const MODELS_YAML: &str = r#"
models:
  - id: chat-model
    aliases: [org/Chat-Model-7B]
    display_name: Chat Model
    created: 1700000000
    supported_endpoints: [chat_completions, responses, messages]
    tool_calling: true
    json_mode: true
    max_output_tokens: 4096
    context_window: 32768
    pricing: { input: 0.10, output: 0.30 }
    cached_input_price: 0.05
    cache_isolation: isolated
    cache_tiers: [gpu, host_ram]
    cache_retention: best_effort
    max_concurrent_requests_per_api_key: 8
    max_tokens_per_minute_per_workspace: 1000000
  - id: shared-cache-model
    supported_endpoints: [chat_completions]
    pricing: { input: 1.00, output: 2.00 }
    cached_input_price: 0.50
    cache_isolation: shared
  - id: embed-model
    modality: embedding
    supported_endpoints: [embeddings]
  - id: priced-embed-model
    modality: embedding
    supported_endpoints: [embeddings]
    pricing: { input: 10000, output: 0 }
  - id: priced-rerank-model
    modality: rerank
    supported_endpoints: [rerank]
    pricing: { input: 10000, output: 0 }
  - id: paused-model
    supported_endpoints: [chat_completions]
    availability: paused
    paused_until: "2099-01-01T00:00:00Z"
  - id: pricey-model
    supported_endpoints: [chat_completions]
    max_output_tokens: 4096
    pricing: { input: 0, output: 10000 }
    max_concurrent_standby_requests: 1
  - id: stream-model
    supported_endpoints: [chat_completions]
    pricing: { input: 0, output: 1.0 }
  - id: tiny-pool-model
    supported_endpoints: [chat_completions]
    pricing: { input: 0.10, output: 0.30 }
  - id: dead-model
    supported_endpoints: [chat_completions]
  - id: unserved-model
    supported_endpoints: [chat_completions]
  - id: limited-model
    supported_endpoints: [chat_completions, messages]
    max_concurrent_requests_per_api_key: 1
    max_concurrent_requests: 3
    max_tokens_per_minute_per_workspace: 3000
  - id: busy-model
    supported_endpoints: [chat_completions]
    max_concurrent_requests_per_api_key: 1
"#;
