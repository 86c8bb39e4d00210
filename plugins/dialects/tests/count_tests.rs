//! `estimate_input_tokens`: the documented rule, term by term.

use serde_json::json;

use super::support::*;
use crate::dialects::{Purpose, estimate_input_tokens, to_chat_with};

#[test]
fn an_empty_body_costs_the_reply_primer() {
    assert_eq!(estimate_input_tokens(&json!({})), 3);
    assert_eq!(estimate_input_tokens(&json!({ "messages": [] })), 3);
}

#[test]
fn each_message_adds_overhead_and_text_rounds_up_per_message() {
    // 3 + (4 + ceil(5/4)=2) + (4 + ceil(8/4)=2) = 15
    let body =
        json!({ "messages": [{ "role": "user", "content": "hello" }, { "role": "assistant", "content": "12345678" }] });
    assert_eq!(estimate_input_tokens(&body), 15);
    // Multi-byte text counts bytes: "é" is 2 bytes -> 1 token.
    assert_eq!(estimate_input_tokens(&json!({ "messages": [{ "role": "user", "content": "é" }] })), 3 + 4 + 1);
}

#[test]
fn parts_tool_calls_images_and_tools_are_counted() {
    let body = json!({
        "messages": [
            { "role": "user", "content": [
                { "type": "text", "text": "abcd" },
                { "type": "image_url", "image_url": { "url": "data:image/png;base64,AAAA" } },
                { "type": "text", "text": "efgh" }
            ] },
            { "role": "assistant", "content": null, "tool_calls": [
                { "id": "c", "type": "function", "function": { "name": "abc", "arguments": "{\"a\":1}" } }
            ] },
            { "role": "tool", "tool_call_id": "c", "content": "ok" }
        ],
        "tools": [{ "type": "function", "function": { "name": "abc" } }]
    });
    let tools_bytes = json!([{ "type": "function", "function": { "name": "abc" } }]).to_string().len() as u64;
    // user: 4 + 1024 + ceil(8/4)=2; assistant: 4 + ceil((3+7)/4)=3; tool: 4 + 1; primer 3.
    let expected = 3 + (4 + 1024 + 2) + (4 + 3) + (4 + 1) + tools_bytes.div_ceil(4);
    assert_eq!(estimate_input_tokens(&body), expected);
}

#[test]
fn it_estimates_a_translated_messages_request() {
    let body = json!({ "model": "m", "system": "sys!", "messages": [{ "role": "user", "content": "count me" }] });
    let t = to_chat_with(&body, &text_model(), Purpose::CountTokens).unwrap();
    // 3 + (4 + 1) + (4 + 2)
    assert_eq!(estimate_input_tokens(&t.body), 14);
}
