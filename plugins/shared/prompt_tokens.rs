//! Prompt tokens of a chat body: the one counter behind the chat path's context check and
//! prompt estimate (spec rule 11) and the messages `count_tokens` answer.
//!
//! Text is counted by the model's declared tokenizer, or, when none is declared, at about
//! four bytes of UTF-8 a token (`ceil(bytes / 4)` per message). Around it, the same chat
//! template overhead applies either way:
//!
//! - each message: 4 tokens of template overhead (role markers and separators);
//! - its text: string content, text parts, and each tool call's function name and arguments;
//! - each image part: a flat 1,024 tokens (image cost depends on the vision encoder, not on
//!   the base64 length);
//! - the tool definitions: their serialized JSON, counted as text;
//! - 3 tokens priming the assistant's reply.
//!
//! A tokenizer counts at most [`EXACT_BYTES`] of text per request exactly; the rest is
//! counted at the tokens-per-byte ratio measured on that part, so a 3.5 MB body costs no
//! more CPU than 256 KB (decisions.md 63).
//!
//! Billing never uses this figure when the replica reports usage.

use serde_json::Value;

use tollgate::config::PromptTokenizer;

pub const PER_MESSAGE: u64 = 4;
pub const PER_IMAGE: u64 = 1024;
pub const REPLY_PRIMER: u64 = 3;
/// Text bytes a tokenizer encodes per request (about 80 ms with the test tokenizer).
pub const EXACT_BYTES: usize = 256 * 1024;

/// Counts text with a tokenizer, or by the bytes/4 rule.
struct Counter<'a> {
    tokenizer: Option<&'a PromptTokenizer>,
    /// Bytes of the current message (the fallback rule rounds once per message).
    bytes: usize,
    tokens: u64,
    /// Bytes the tokenizer may still encode exactly.
    exact_left: usize,
    /// What was encoded exactly so far (bytes, tokens): the ratio for the rest.
    measured: (u64, u64),
}

impl Counter<'_> {
    fn text(&mut self, s: &str) {
        let Some(t) = self.tokenizer else {
            self.bytes += s.len();
            return;
        };
        let mut cut = s.len().min(self.exact_left);
        while !s.is_char_boundary(cut) {
            cut -= 1;
        }
        let (head, tail) = s.split_at(cut);
        if !head.is_empty() {
            let n = t.count(head);
            self.tokens += n;
            self.measured = (self.measured.0 + head.len() as u64, self.measured.1 + n);
            self.exact_left -= head.len();
        }
        if !tail.is_empty() {
            let (bytes, tokens) = self.measured;
            let tail = tail.len() as u64;
            self.tokens += if bytes == 0 { tail.div_ceil(4) } else { (tail * tokens).div_ceil(bytes) };
        }
    }

    fn end_message(&mut self) {
        self.tokens += (self.bytes as u64).div_ceil(4);
        self.bytes = 0;
    }
}

/// Prompt tokens of `chat_body` (a chat-completions request body).
pub fn count_prompt_tokens(chat_body: &Value, tokenizer: Option<&PromptTokenizer>) -> u64 {
    let messages = chat_body.get("messages").and_then(Value::as_array).map(Vec::as_slice).unwrap_or(&[]);
    let mut c = Counter { tokenizer, bytes: 0, tokens: REPLY_PRIMER, exact_left: EXACT_BYTES, measured: (0, 0) };
    for m in messages {
        c.tokens += PER_MESSAGE;
        match m.get("content") {
            Some(Value::String(s)) => c.text(s),
            Some(Value::Array(parts)) => {
                for p in parts {
                    match p.get("type").and_then(Value::as_str) {
                        Some("image_url" | "input_image") => c.tokens += PER_IMAGE,
                        _ => c.text(p.get("text").and_then(Value::as_str).unwrap_or("")),
                    }
                }
            }
            _ => {}
        }
        for call in m.get("tool_calls").and_then(Value::as_array).map(Vec::as_slice).unwrap_or(&[]) {
            let f = call.get("function");
            c.text(f.and_then(|f| f.get("name")).and_then(Value::as_str).unwrap_or(""));
            c.text(f.and_then(|f| f.get("arguments")).and_then(Value::as_str).unwrap_or(""));
        }
        c.end_message();
    }
    if let Some(tools) = chat_body.get("tools").filter(|t| t.as_array().is_some_and(|a| !a.is_empty())) {
        c.text(&tools.to_string());
        c.end_message();
    }
    c.tokens
}

#[cfg(test)]
mod tests {
    use super::*;
    use serde_json::json;
    use std::path::Path;

    fn tiny() -> PromptTokenizer {
        let path = Path::new(env!("CARGO_MANIFEST_DIR")).join("../tests/fixtures/tokenizers/tiny-bpe.json");
        PromptTokenizer::load(&path).unwrap_or_else(|e| panic!("{e}"))
    }

    #[test]
    fn the_fallback_rule_counts_bytes_per_message() {
        let body = json!({"messages": [{"role": "user", "content": "abcde"}]});
        assert_eq!(count_prompt_tokens(&body, None), 3 + 4 + 2);
    }

    #[test]
    fn a_tokenizer_counts_text_and_keeps_the_template_overhead() {
        let t = tiny();
        let text = "Say hello to the gateway, please.";
        let body = json!({"messages": [
            {"role": "user", "content": text},
            {"role": "user", "content": [{"type": "text", "text": text}, {"type": "image_url", "image_url": {"url": "x"}}]},
        ]});
        assert_eq!(count_prompt_tokens(&body, Some(&t)), 3 + 2 * 4 + 2 * 13 + PER_IMAGE);
        assert_ne!(count_prompt_tokens(&body, Some(&t)), count_prompt_tokens(&body, None));
    }

    #[test]
    fn text_past_the_exact_budget_is_counted_at_the_measured_ratio() {
        let t = tiny();
        let words = "gateway ".repeat(EXACT_BYTES / 8); // exactly the budget, about one token a word
        let exact = count_prompt_tokens(&json!({"messages": [{"role": "user", "content": words}]}), Some(&t));
        let doubled = json!({"messages": [{"role": "user", "content": words}, {"role": "user", "content": words}]});
        let n = count_prompt_tokens(&doubled, Some(&t));
        let expected = 2 * exact - REPLY_PRIMER;
        assert!(n.abs_diff(expected) <= 2, "{n} vs {expected}");
    }

    #[test]
    fn tool_calls_and_tool_definitions_count_with_a_tokenizer() {
        let t = tiny();
        let bare = json!({"messages": [{"role": "assistant", "content": null}]});
        let calls = json!({"messages": [{"role": "assistant", "content": null,
            "tool_calls": [{"function": {"name": "lookup", "arguments": "{\"q\": \"gateway\"}"}}]}],
            "tools": [{"type": "function", "function": {"name": "lookup"}}]});
        assert!(count_prompt_tokens(&calls, Some(&t)) > count_prompt_tokens(&bare, Some(&t)) + 5);
    }
}
