//! A whole chat answer as a Messages response (read as the chat path reads it), `stop_reason`
//! and the thinking signature.

use serde_json::{Value, json};

use super::support::*;
use crate::dialects::{MessagesStream, sign_thinking, stop_reason, verify_thinking};

fn from_chat(chat: &Value, model_id: &str, key: &[u8]) -> Value {
    whole(&MessagesStream::new(model_id, key), chat)
}

fn chat(message: Value, finish: &str) -> Value {
    json!({
        "id": "chatcmpl-xyz", "object": "chat.completion", "created": 1700000000, "model": "m1",
        "choices": [{ "index": 0, "message": message, "finish_reason": finish }],
        "usage": chat_usage(120, 20, 35),
    })
}

#[test]
fn a_full_answer_keeps_thinking_text_tool_use_order() {
    let message = json!({
        "role": "assistant", "content": "Let me check.", "reasoning": "The user wants weather.",
        "tool_calls": [
            { "id": "call_1", "type": "function", "function": { "name": "get_weather", "arguments": "{\"city\":\"Paris\"}" } },
            { "id": "call_2", "type": "function", "function": { "name": "noop", "arguments": "" } }
        ]
    });
    let r = from_chat(&chat(message, "tool_calls"), "m1", KEY);
    assert_eq!(
        r,
        json!({
            "id": "msg_xyz",
            "type": "message",
            "role": "assistant",
            "content": [
                { "type": "thinking", "thinking": "The user wants weather.", "signature": sign_thinking(KEY, "The user wants weather.") },
                { "type": "text", "text": "Let me check." },
                { "type": "tool_use", "id": "call_1", "name": "get_weather", "input": { "city": "Paris" } },
                { "type": "tool_use", "id": "call_2", "name": "noop", "input": {} }
            ],
            "model": "m1",
            "stop_reason": "tool_use",
            "stop_sequence": null,
            "usage": { "input_tokens": 100, "output_tokens": 35, "cache_read_input_tokens": 20, "cache_creation_input_tokens": 0 }
        })
    );
}

#[test]
fn a_plain_answer_has_one_text_block_and_end_turn() {
    let r = from_chat(
        &chat(json!({ "role": "assistant", "content": "Hello", "reasoning": null }), "stop"),
        "alias-id",
        KEY,
    );
    assert_eq!(r["content"], json!([{ "type": "text", "text": "Hello" }]));
    assert_eq!(r["stop_reason"], "end_turn");
    assert_eq!(r["model"], "alias-id");
    assert_eq!(r["usage"].as_object().unwrap().len(), 4);
}

#[test]
fn an_answer_cut_short_while_reasoning_has_only_thinking_and_max_tokens() {
    let r = from_chat(&chat(json!({ "role": "assistant", "content": "", "reasoning": "so far" }), "length"), "m1", KEY);
    assert_eq!(r["content"].as_array().unwrap().len(), 1);
    assert_eq!(r["content"][0]["type"], "thinking");
    assert_eq!(r["stop_reason"], "max_tokens");
}

#[test]
fn stop_reasons_map_from_finish_reasons() {
    assert_eq!(stop_reason(Some("stop"), false), json!("end_turn"));
    assert_eq!(stop_reason(Some("length"), false), json!("max_tokens"));
    assert_eq!(stop_reason(Some("tool_calls"), false), json!("tool_use"));
    assert_eq!(stop_reason(Some("tool_calls"), true), json!("tool_use"));
    // A turn with tool calls ends in tool_use even when the replica said `stop`...
    assert_eq!(stop_reason(Some("stop"), true), json!("tool_use"));
    // ...unless it was cut short.
    assert_eq!(stop_reason(Some("length"), true), json!("max_tokens"));
    assert_eq!(stop_reason(Some("content_filter"), false), Value::Null);
    assert_eq!(stop_reason(None, false), Value::Null);
}

#[test]
fn ids_come_from_the_chat_id_or_are_fresh() {
    let mut c = chat(json!({ "role": "assistant", "content": "x" }), "stop");
    c["id"] = json!("abc-1");
    assert_eq!(from_chat(&c, "m", KEY)["id"], "msg_abc-1");
    c.as_object_mut().unwrap().remove("id");
    let id = from_chat(&c, "m", KEY)["id"].as_str().unwrap().to_string();
    assert!(id.starts_with("msg_") && id.len() == 36, "{id}");
    let mut c = chat(
        json!({ "role": "assistant", "tool_calls": [{ "function": { "name": "t", "arguments": "{}" } }] }),
        "tool_calls",
    );
    let tid = from_chat(&c, "m", KEY)["content"][0]["id"].as_str().unwrap().to_string();
    assert!(tid.starts_with("toolu_"), "{tid}");
    c["choices"][0]["message"]["tool_calls"][0]["function"]["arguments"] = json!("{\"a\": [1");
    assert_eq!(from_chat(&c, "m", KEY)["content"][0]["input"], json!({}));
}

#[test]
fn usage_without_a_report_is_zero_and_cached_never_exceeds_prompt() {
    let mut c = chat(json!({ "role": "assistant", "content": "x" }), "stop");
    c.as_object_mut().unwrap().remove("usage");
    assert_eq!(
        from_chat(&c, "m", KEY)["usage"],
        json!({ "input_tokens": 0, "output_tokens": 0, "cache_read_input_tokens": 0, "cache_creation_input_tokens": 0 })
    );
    c["usage"] = json!({ "prompt_tokens": 5, "completion_tokens": 1, "prompt_tokens_details": { "cached_tokens": 9 } });
    let u = &from_chat(&c, "m", KEY)["usage"];
    assert_eq!((u["input_tokens"].clone(), u["cache_read_input_tokens"].clone()), (json!(0), json!(5)));
}

#[test]
fn signatures_verify_only_for_the_same_text_and_key() {
    let s = sign_thinking(KEY, "reasoning text");
    assert_eq!(s.len(), 64);
    assert!(s.bytes().all(|b| b.is_ascii_hexdigit() && !b.is_ascii_uppercase()));
    assert!(verify_thinking(KEY, "reasoning text", &s));
    assert!(!verify_thinking(KEY, "reasoning text!", &s));
    assert!(!verify_thinking(b"other key", "reasoning text", &s));
    assert!(!verify_thinking(KEY, "reasoning text", &s[..62]));
    assert!(!verify_thinking(KEY, "reasoning text", "zz"));
    assert!(!verify_thinking(KEY, "reasoning text", ""));
    // HMAC-SHA256 test vector (RFC 4231, case 2).
    assert_eq!(
        sign_thinking(b"Jefe", "what do ya want for nothing?"),
        "5bdcc146bf60754e6a042426089575c75a003f089d2739839dec58b964ec3843"
    );
}
