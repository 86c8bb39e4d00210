//! The `count_tokens` estimate for a translated (chat) request body.
//!
//! No tokenizer is declared for any model, so the answer is an estimate by a fixed,
//! documented rule (about four bytes of UTF-8 a token, the same ratio the chat path uses
//! for its prompt estimate), plus what chat templates add around each message:
//!
//! - each message: 4 tokens of template overhead (role markers and separators);
//! - its text: `ceil(bytes / 4)` over string content, text parts, and each tool call's
//!   function name and arguments;
//! - each image part: a flat 1,024 tokens (image cost depends on the vision encoder, not on
//!   the base64 length);
//! - the tool definitions: `ceil(bytes of the serialized tools array / 4)`;
//! - 3 tokens priming the assistant's reply.
//!
//! Billing never uses this figure: usage is always the replica's own count.

use serde_json::Value;

const PER_MESSAGE: u64 = 4;
const PER_IMAGE: u64 = 1024;
const REPLY_PRIMER: u64 = 3;

fn text_tokens(bytes: usize) -> u64 {
    (bytes as u64).div_ceil(4)
}

/// Estimated prompt tokens of `chat_body` (the output of `to_chat` or `responses_to_chat`).
pub fn estimate_input_tokens(chat_body: &Value) -> u64 {
    let messages = chat_body.get("messages").and_then(Value::as_array).map(Vec::as_slice).unwrap_or(&[]);
    let mut total = REPLY_PRIMER;
    for m in messages {
        total += PER_MESSAGE;
        let mut bytes = 0usize;
        match m.get("content") {
            Some(Value::String(s)) => bytes += s.len(),
            Some(Value::Array(parts)) => {
                for p in parts {
                    match p.get("type").and_then(Value::as_str) {
                        Some("image_url" | "input_image") => total += PER_IMAGE,
                        _ => bytes += p.get("text").and_then(Value::as_str).map_or(0, str::len),
                    }
                }
            }
            _ => {}
        }
        for call in m.get("tool_calls").and_then(Value::as_array).map(Vec::as_slice).unwrap_or(&[]) {
            let f = call.get("function");
            bytes += f.and_then(|f| f.get("name")).and_then(Value::as_str).map_or(0, str::len);
            bytes += f.and_then(|f| f.get("arguments")).and_then(Value::as_str).map_or(0, str::len);
        }
        total += text_tokens(bytes);
    }
    if let Some(tools) = chat_body.get("tools").filter(|t| t.as_array().is_some_and(|a| !a.is_empty())) {
        total += text_tokens(tools.to_string().len());
    }
    total
}
