//! The `count_tokens` estimate for a translated (chat) request body: the chat path's own
//! prompt counter (`plugins/shared/prompt_tokens.rs`), so both answers agree.

use serde_json::Value;

use crate::shared::prompt_tokens::count_prompt_tokens;

/// Estimated prompt tokens of `chat_body` by the documented bytes/4 rule (no tokenizer).
pub fn estimate_input_tokens(chat_body: &Value) -> u64 {
    count_prompt_tokens(chat_body, None)
}
