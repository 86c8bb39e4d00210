//! `to_chat`: messages, turn merging and every content block.

use serde_json::{Value, json};

use super::support::*;
use crate::dialects::{ModelCaps, Purpose, to_chat_with};
use tollgate::http::error::{ErrorKind, GatewayError};

const PNG: &str = "iVBORw0KGgo=";

fn run(messages: Value, caps: &ModelCaps) -> Result<Value, GatewayError> {
    let b = json!({ "model": "m", "max_tokens": 10, "messages": messages });
    to_chat_with(&b, caps, Purpose::Generate).map(|t| t.body["messages"].clone())
}

fn image(media: &str, data: &str) -> Value {
    json!({ "type": "image", "source": { "type": "base64", "media_type": media, "data": data } })
}

fn tool_use(id: &str) -> Value {
    json!({ "type": "tool_use", "id": id, "name": "get_weather", "input": { "city": "Paris" } })
}

#[test]
fn consecutive_same_role_messages_merge_into_one_turn() {
    let m = run(
        json!([
            { "role": "user", "content": "a" },
            { "role": "user", "content": [{ "type": "text", "text": "b" }, { "type": "text", "text": "c" }] },
            { "role": "assistant", "content": "d" },
            { "role": "assistant", "content": [{ "type": "text", "text": "e" }] },
            { "role": "user", "content": "f" }
        ]),
        &text_model(),
    )
    .unwrap();
    assert_eq!(
        m,
        json!([
            { "role": "user", "content": "a\n\nb\n\nc" },
            { "role": "assistant", "content": "d\n\ne" },
            { "role": "user", "content": "f" }
        ])
    );
}

#[test]
fn a_system_message_inside_messages_keeps_its_position() {
    let m = run(
        json!([
            { "role": "user", "content": "a" },
            { "role": "system", "content": "rules" },
            { "role": "system", "content": [{ "type": "text", "text": "more" }] },
            { "role": "user", "content": "b" }
        ]),
        &text_model(),
    )
    .unwrap();
    assert_eq!(
        m,
        json!([
            { "role": "user", "content": "a" },
            { "role": "system", "content": "rules\n\nmore" },
            { "role": "user", "content": "b" }
        ])
    );
    refused(
        run(
            json!([{ "role": "user", "content": "a" }, { "role": "system", "content": [image("image/png", PNG)] }]),
            &vision_model(),
        ),
        ErrorKind::InvalidRequest,
        "messages[1].content[0]",
    );
}

#[test]
fn messages_need_a_user_or_assistant_message() {
    refused(run(json!([]), &text_model()), ErrorKind::InvalidRequest, "messages");
    refused(run(json!([{ "role": "system", "content": "x" }]), &text_model()), ErrorKind::InvalidRequest, "messages");
    refused(run(json!("hi"), &text_model()), ErrorKind::InvalidRequest, "messages");
    let b = json!({ "model": "m", "max_tokens": 10 });
    refused(to_chat_with(&b, &text_model(), Purpose::Generate), ErrorKind::MissingRequiredField, "messages");
    // A lone assistant message is a conversation too (prefill).
    assert!(run(json!([{ "role": "assistant", "content": "x" }]), &text_model()).is_ok());
}

#[test]
fn malformed_messages_name_the_message() {
    let c = text_model();
    refused(run(json!(["hi"]), &c), ErrorKind::InvalidRequest, "messages[0]");
    refused(run(json!([{ "content": "x" }]), &c), ErrorKind::MissingRequiredField, "messages[0].role");
    refused(
        run(json!([{ "role": "user", "content": "x" }, { "role": "tool", "content": "x" }]), &c),
        ErrorKind::InvalidRequest,
        "messages[1].role",
    );
    refused(run(json!([{ "role": "user" }]), &c), ErrorKind::MissingRequiredField, "messages[0].content");
    refused(run(json!([{ "role": "user", "content": 3 }]), &c), ErrorKind::InvalidRequest, "messages[0].content");
    refused(
        run(json!([{ "role": "user", "content": ["x"] }]), &c),
        ErrorKind::InvalidRequest,
        "messages[0].content[0]",
    );
    refused(
        run(json!([{ "role": "user", "content": [{ "text": "x" }] }]), &c),
        ErrorKind::MissingRequiredField,
        "messages[0].content[0].type",
    );
    refused(
        run(json!([{ "role": "user", "content": [{ "type": "text" }] }]), &c),
        ErrorKind::MissingRequiredField,
        "messages[0].content[0].text",
    );
    refused(
        run(json!([{ "role": "user", "content": [{ "type": "text", "text": 1 }] }]), &c),
        ErrorKind::InvalidRequest,
        "messages[0].content[0].text",
    );
}

#[test]
fn base64_images_become_data_url_parts_in_order() {
    let m = run(
        json!([{ "role": "user", "content": [
            { "type": "text", "text": "look" }, image("image/png", PNG), image("image/webp", "QUJD")
        ] }]),
        &vision_model(),
    )
    .unwrap();
    assert_eq!(
        m,
        json!([{ "role": "user", "content": [
            { "type": "text", "text": "look" },
            { "type": "image_url", "image_url": { "url": format!("data:image/png;base64,{PNG}") } },
            { "type": "image_url", "image_url": { "url": "data:image/webp;base64,QUJD" } }
        ] }])
    );
    for media in ["image/jpeg", "image/gif"] {
        assert!(run(json!([{ "role": "user", "content": [image(media, PNG)] }]), &vision_model()).is_ok());
    }
}

#[test]
fn image_refusals_name_the_block() {
    let c = vision_model();
    let one = |block: Value| {
        run(
            json!([{ "role": "user", "content": "a" }, { "role": "assistant", "content": "b" },
                                         { "role": "user", "content": [{ "type": "text", "text": "x" }, block] }]),
            &c,
        )
    };
    let at = "messages[2].content[1]";
    let url = json!({ "type": "image", "source": { "type": "url", "url": "https://x/y.png" } });
    let msg = refused(one(url), ErrorKind::InvalidRequest, at);
    assert!(msg.contains("`url`"), "{msg}");
    refused(
        one(json!({ "type": "image", "source": { "type": "file", "file_id": "f" } })),
        ErrorKind::InvalidRequest,
        at,
    );
    refused(one(json!({ "type": "image" })), ErrorKind::InvalidRequest, at);
    refused(one(image("image/bmp", PNG)), ErrorKind::InvalidRequest, at);
    refused(one(image("image/png", "not base64!")), ErrorKind::InvalidRequest, at);
    refused(one(image("image/png", "iVBORw0KGgo")), ErrorKind::InvalidRequest, at); // truncated
    refused(one(image("image/png", "")), ErrorKind::InvalidRequest, at);
}

#[test]
fn images_on_a_text_only_model_are_a_hosted_parameter_refusal_on_messages() {
    refused(
        run(json!([{ "role": "user", "content": [image("image/png", PNG)] }]), &text_model()),
        ErrorKind::HostedParameterNotSupported,
        "messages",
    );
}

#[test]
fn the_ninth_image_is_refused() {
    let eight: Vec<Value> = (0..8).map(|_| image("image/png", PNG)).collect();
    assert!(run(json!([{ "role": "user", "content": eight }]), &vision_model()).is_ok());
    let mut nine = eight.clone();
    nine.push(image("image/png", PNG));
    refused(
        run(json!([{ "role": "user", "content": nine }]), &vision_model()),
        ErrorKind::InvalidRequest,
        "messages[0].content[8]",
    );
}

#[test]
fn tool_use_and_tool_result_become_tool_calls_and_tool_messages() {
    let m = run(
        json!([
            { "role": "user", "content": "weather?" },
            { "role": "assistant", "content": [
                { "type": "thinking", "thinking": "hmm", "signature": "anything" },
                { "type": "redacted_thinking", "data": "xyz" },
                { "type": "text", "text": "checking" }, tool_use("call_1"),
                { "type": "tool_use", "id": "call_2", "name": "noop" }
            ] },
            { "role": "user", "content": [
                { "type": "tool_result", "tool_use_id": "call_1", "content": "sunny" },
                { "type": "tool_result", "tool_use_id": "call_2", "content": [{ "type": "text", "text": "a" }, { "type": "text", "text": "b" }] },
                { "type": "text", "text": "thanks" }
            ] }
        ]),
        &text_model(),
    )
    .unwrap();
    assert_eq!(
        m,
        json!([
            { "role": "user", "content": "weather?" },
            { "role": "assistant", "content": "checking", "tool_calls": [
                { "id": "call_1", "type": "function", "function": { "name": "get_weather", "arguments": "{\"city\":\"Paris\"}" } },
                { "id": "call_2", "type": "function", "function": { "name": "noop", "arguments": "{}" } }
            ] },
            { "role": "tool", "tool_call_id": "call_1", "content": "sunny" },
            { "role": "tool", "tool_call_id": "call_2", "content": "a\n\nb" },
            { "role": "user", "content": "thanks" }
        ])
    );
}

#[test]
fn an_assistant_turn_of_only_tool_calls_has_null_content_and_thinking_only_is_empty() {
    let m = run(
        json!([{ "role": "user", "content": "x" }, { "role": "assistant", "content": [tool_use("c1")] },
               { "role": "user", "content": [{ "type": "tool_result", "tool_use_id": "c1" }] },
               { "role": "assistant", "content": [{ "type": "thinking", "thinking": "t", "signature": "s" }] }]),
        &text_model(),
    )
    .unwrap();
    assert_eq!(m[1]["content"], Value::Null);
    // A user turn of only tool results adds no empty user message.
    assert_eq!(m[2], json!({ "role": "tool", "tool_call_id": "c1", "content": "" }));
    assert_eq!(m[3], json!({ "role": "assistant", "content": "" }));
    assert_eq!(m.as_array().unwrap().len(), 4);
}

#[test]
fn is_error_is_carried_in_the_text_and_result_images_follow_in_the_user_message() {
    let m = run(
        json!([{ "role": "user", "content": "x" }, { "role": "assistant", "content": [tool_use("c1"), tool_use("c2")] },
               { "role": "user", "content": [
                   { "type": "tool_result", "tool_use_id": "c1", "is_error": true, "content": "timeout" },
                   { "type": "tool_result", "tool_use_id": "c2", "content": [{ "type": "text", "text": "chart" }, image("image/png", PNG)] }
               ] }]),
        &vision_model(),
    )
    .unwrap();
    assert_eq!(m[2], json!({ "role": "tool", "tool_call_id": "c1", "content": "Error: timeout" }));
    assert_eq!(m[3], json!({ "role": "tool", "tool_call_id": "c2", "content": "chart" }));
    assert_eq!(
        m[4],
        json!({ "role": "user", "content": [{ "type": "image_url", "image_url": { "url": format!("data:image/png;base64,{PNG}") } }] })
    );
}

#[test]
fn merged_user_turns_put_all_tool_results_first() {
    let m = run(
        json!([{ "role": "user", "content": "x" }, { "role": "assistant", "content": [tool_use("c1")] },
               { "role": "user", "content": [{ "type": "tool_result", "tool_use_id": "c1", "content": "r" }, { "type": "text", "text": "a" }] },
               { "role": "user", "content": "b" }]),
        &text_model(),
    )
    .unwrap();
    assert_eq!(m[2], json!({ "role": "tool", "tool_call_id": "c1", "content": "r" }));
    assert_eq!(m[3], json!({ "role": "user", "content": "a\n\nb" }));
}

#[test]
fn tool_result_after_another_block_of_its_message_is_refused() {
    let msgs = json!([{ "role": "user", "content": "x" }, { "role": "assistant", "content": [tool_use("c1")] },
                      { "role": "user", "content": [{ "type": "text", "text": "a" }, { "type": "tool_result", "tool_use_id": "c1" }] }]);
    refused(run(msgs, &text_model()), ErrorKind::InvalidRequest, "messages[2].content[1]");
}

#[test]
fn tool_result_must_answer_an_earlier_tool_use() {
    let msgs = json!([{ "role": "user", "content": [{ "type": "tool_result", "tool_use_id": "nope" }] }]);
    refused(run(msgs, &text_model()), ErrorKind::InvalidRequest, "messages[0].content[0].tool_use_id");
    let msgs = json!([{ "role": "user", "content": "x" }, { "role": "assistant", "content": "y" },
                      { "role": "user", "content": [{ "type": "tool_result" }] }]);
    refused(run(msgs, &text_model()), ErrorKind::MissingRequiredField, "messages[2].content[0].tool_use_id");
}

#[test]
fn malformed_tool_blocks_name_the_field() {
    let c = text_model();
    let asst = |block: Value| {
        run(json!([{ "role": "user", "content": "x" }, { "role": "assistant", "content": [block] }]), &c)
    };
    refused(
        asst(json!({ "type": "tool_use", "name": "n" })),
        ErrorKind::MissingRequiredField,
        "messages[1].content[0].id",
    );
    refused(
        asst(json!({ "type": "tool_use", "id": "i" })),
        ErrorKind::MissingRequiredField,
        "messages[1].content[0].name",
    );
    refused(
        asst(json!({ "type": "tool_use", "id": "i", "name": "n", "input": "{}" })),
        ErrorKind::InvalidRequest,
        "messages[1].content[0].input",
    );
    let res = |content: Value| {
        run(
            json!([{ "role": "user", "content": "x" }, { "role": "assistant", "content": [tool_use("c1")] },
                                          { "role": "user", "content": [{ "type": "tool_result", "tool_use_id": "c1", "content": content }] }]),
            &c,
        )
    };
    refused(res(json!(5)), ErrorKind::InvalidRequest, "messages[2].content[0].content");
    refused(res(json!([{ "type": "document" }])), ErrorKind::InvalidRequest, "messages[2].content[0].content[0]");
}

#[test]
fn blocks_in_the_wrong_role_are_refused() {
    let c = vision_model();
    refused(
        run(json!([{ "role": "user", "content": [tool_use("c1")] }]), &c),
        ErrorKind::InvalidRequest,
        "messages[0].content[0]",
    );
    refused(
        run(json!([{ "role": "user", "content": [{ "type": "thinking", "thinking": "t" }] }]), &c),
        ErrorKind::InvalidRequest,
        "messages[0].content[0]",
    );
    refused(
        run(
            json!([{ "role": "user", "content": "x" }, { "role": "assistant", "content": [image("image/png", PNG)] }]),
            &c,
        ),
        ErrorKind::InvalidRequest,
        "messages[1].content[0]",
    );
}

#[test]
fn document_and_unknown_blocks_are_refused_by_type() {
    for t in ["document", "search_result", "server_tool_use", "web_search_tool_result", "container_upload"] {
        let msg = refused(
            run(
                json!([{ "role": "user", "content": [{ "type": "text", "text": "a" }, { "type": t }] }]),
                &vision_model(),
            ),
            ErrorKind::InvalidRequest,
            "messages[0].content[1]",
        );
        assert!(msg.contains(&format!("`{t}`")), "{msg}");
    }
}
