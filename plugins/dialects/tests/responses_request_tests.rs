//! `responses_to_chat`: input forms, mapped fields, formats, tools and refusals.

use serde_json::{Value, json};

use super::support::*;
use crate::dialects::{ChatTranslation, ModelCaps, responses_to_chat, responses_to_chat_with};
use tollgate::http::error::{ErrorKind, GatewayError};

fn run(body: Value, caps: &ModelCaps) -> Result<ChatTranslation, GatewayError> {
    responses_to_chat_with(&body, caps)
}

fn with(extra: Value) -> Value {
    let mut b = json!({ "model": "m1", "input": "hi" });
    for (k, v) in extra.as_object().unwrap() {
        b[k] = v.clone();
    }
    b
}

#[test]
fn a_string_input_with_every_mapped_field() {
    let t = run(
        with(json!({
            "instructions": "be brief", "max_output_tokens": 64, "stream": true, "temperature": 0.2, "top_p": 1,
            "reasoning_effort": "low", "store": true, "truncation": "auto", "metadata": { "a": "b" },
            "parallel_tool_calls": false, "user": "u1"
        })),
        &text_model(),
    )
    .unwrap();
    assert!(t.stream);
    assert!(t.warnings.is_empty());
    assert_eq!(
        t.body,
        json!({
            "model": "m1",
            "messages": [{ "role": "system", "content": "be brief" }, { "role": "user", "content": "hi" }],
            "max_tokens": 64,
            "stream": true,
            "stream_options": { "include_usage": true },
            "temperature": 0.2,
            "top_p": 1,
            "reasoning_effort": "low",
            "parallel_tool_calls": false,
            "user": "u1",
        })
    );
}

#[test]
fn message_items_with_text_parts_and_a_stateless_tool_loop() {
    let t = run(
        with(json!({ "input": [
            { "role": "developer", "content": "rules" },
            { "type": "message", "role": "user", "content": [{ "type": "input_text", "text": "a" }, { "type": "text", "text": "b" }] },
            { "role": "assistant", "content": [{ "type": "output_text", "text": "calling" }] },
            { "type": "function_call", "call_id": "c1", "name": "f", "arguments": "{\"x\":1}" },
            { "type": "function_call", "call_id": "c2", "name": "g" },
            { "type": "reasoning", "id": "rs_1", "summary": [] },
            { "type": "function_call_output", "call_id": "c1", "output": "42" },
            { "type": "function_call_output", "call_id": "c2", "output": { "ok": true } },
            { "type": "function_call", "call_id": "c3", "name": "h", "arguments": "{}" }
        ] })),
        &text_model(),
    )
    .unwrap();
    assert_eq!(
        t.body["messages"],
        json!([
            { "role": "developer", "content": "rules" },
            { "role": "user", "content": "a\n\nb" },
            { "role": "assistant", "content": "calling", "tool_calls": [
                { "id": "c1", "type": "function", "function": { "name": "f", "arguments": "{\"x\":1}" } },
                { "id": "c2", "type": "function", "function": { "name": "g", "arguments": "{}" } }
            ] },
            { "role": "tool", "tool_call_id": "c1", "content": "42" },
            { "role": "tool", "tool_call_id": "c2", "content": "{\"ok\":true}" },
            { "role": "assistant", "content": null, "tool_calls": [
                { "id": "c3", "type": "function", "function": { "name": "h", "arguments": "{}" } }
            ] }
        ])
    );
}

#[test]
fn input_refusals_name_the_item() {
    let c = text_model();
    let input = |v: Value| run(with(json!({ "input": v })), &c);
    let mut b = with(json!({}));
    b.as_object_mut().unwrap().remove("input");
    refused(run(b, &c), ErrorKind::MissingRequiredField, "input");
    refused(input(json!([])), ErrorKind::InvalidRequest, "input");
    refused(input(json!(3)), ErrorKind::InvalidRequest, "input");
    refused(input(json!(["x"])), ErrorKind::InvalidRequest, "input[0]");
    refused(input(json!([{ "role": "robot", "content": "x" }])), ErrorKind::InvalidRequest, "input[0].role");
    refused(input(json!([{ "role": "user" }])), ErrorKind::MissingRequiredField, "input[0].content");
    refused(
        input(json!([{ "role": "user", "content": [{ "type": "input_file", "file_id": "f" }] }])),
        ErrorKind::InvalidRequest,
        "input[0].content[0]",
    );
    refused(
        input(json!([{ "role": "user", "content": [{ "type": "input_text" }] }])),
        ErrorKind::MissingRequiredField,
        "input[0].content[0].text",
    );
    refused(
        input(json!([{ "type": "function_call", "name": "f" }])),
        ErrorKind::MissingRequiredField,
        "input[0].call_id",
    );
    refused(
        input(json!([{ "type": "item_reference", "id": "x" }])),
        ErrorKind::HostedParameterNotSupported,
        "input[0]",
    );
    refused(input(json!([{ "type": "web_search_call" }])), ErrorKind::InvalidRequest, "input[0].type");
}

#[test]
fn input_images_follow_the_chat_image_rules() {
    let img = |url: &str| json!({ "input": [{ "role": "user", "content": [{ "type": "input_text", "text": "see" }, { "type": "input_image", "image_url": url }] }] });
    let t = run(with(img("data:image/png;base64,iVBORw0KGgo=")), &vision_model()).unwrap();
    assert_eq!(
        t.body["messages"][0]["content"],
        json!([{ "type": "text", "text": "see" }, { "type": "image_url", "image_url": { "url": "data:image/png;base64,iVBORw0KGgo=" } }])
    );
    refused(
        run(with(img("data:image/png;base64,iVBORw0KGgo=")), &text_model()),
        ErrorKind::HostedParameterNotSupported,
        "input",
    );
    refused(
        run(with(img("https://x/y.png")), &vision_model()),
        ErrorKind::HostedParameterNotSupported,
        "input[0].content[1]",
    );
    refused(
        run(with(img("data:image/tiff;base64,iVBORw0KGgo=")), &vision_model()),
        ErrorKind::InvalidRequest,
        "input[0].content[1]",
    );
    refused(
        run(with(img("data:image/png;base64,iVBORw0KGg")), &vision_model()),
        ErrorKind::InvalidRequest,
        "input[0].content[1]",
    );
}

#[test]
fn stateful_features_are_refused_by_name() {
    let c = text_model();
    let cases = [
        (json!({ "previous_response_id": "resp_1" }), "previous_response_id"),
        (json!({ "conversation": "conv_1" }), "conversation"),
        (json!({ "prompt": { "id": "p" } }), "prompt"),
        (json!({ "include": ["reasoning.encrypted_content"] }), "include"),
        (json!({ "reasoning": { "effort": "low" } }), "reasoning"),
        (json!({ "background": true }), "background"),
        (json!({ "tools": [{ "type": "web_search_preview" }] }), "tools[0].type"),
        (
            json!({ "tools": [{ "type": "function", "name": "f" }], "tool_choice": { "type": "file_search" } }),
            "tool_choice.type",
        ),
    ];
    for (extra, param) in cases {
        refused(run(with(extra), &c), ErrorKind::HostedParameterNotSupported, param);
    }
    // Empty or false forms ask for nothing and pass.
    for extra in [
        json!({ "include": [] }),
        json!({ "background": false }),
        json!({ "store": false }),
        json!({ "reasoning": null }),
    ] {
        assert!(run(with(extra), &c).is_ok());
    }
}

#[test]
fn text_format_wins_over_response_format_and_is_nested_for_chat() {
    let schema = json!({ "type": "object" });
    let t = run(
        with(json!({
            "text": { "format": { "type": "json_schema", "name": "answer", "schema": schema, "strict": true } },
            "response_format": { "type": "json_object" }
        })),
        &text_model(),
    )
    .unwrap();
    assert_eq!(
        t.body["response_format"],
        json!({ "type": "json_schema", "json_schema": { "name": "answer", "schema": schema, "strict": true } })
    );
    let t = run(
        with(json!({ "response_format": { "type": "json_schema", "json_schema": { "name": "x", "schema": schema } } })),
        &text_model(),
    )
    .unwrap();
    assert_eq!(
        t.body["response_format"],
        json!({ "type": "json_schema", "json_schema": { "name": "x", "schema": schema } })
    );
    let t = run(with(json!({ "text": { "format": { "type": "text" } } })), &caps(false, false, false, &[])).unwrap();
    assert_eq!(t.body["response_format"], json!({ "type": "text" }));
    refused(
        run(with(json!({ "text": { "format": { "type": "json_object" } } })), &caps(false, false, false, &[])),
        ErrorKind::HostedCapabilityNotSupported,
        "text.format",
    );
    refused(
        run(with(json!({ "response_format": { "type": "json_object" } })), &caps(false, false, false, &[])),
        ErrorKind::HostedCapabilityNotSupported,
        "response_format",
    );
    refused(
        run(with(json!({ "text": { "format": { "type": "yaml" } } })), &text_model()),
        ErrorKind::InvalidRequest,
        "text.format.type",
    );
}

#[test]
fn function_tools_pass_in_chat_form_and_flat_ones_are_nested() {
    let chat_tool = json!({ "type": "function", "function": { "name": "a", "parameters": { "type": "object" } } });
    let t = run(
        with(json!({
            "tools": [chat_tool, { "type": "function", "name": "b", "description": "d", "parameters": {}, "strict": true }],
            "tool_choice": { "type": "function", "name": "b" }
        })),
        &text_model(),
    )
    .unwrap();
    assert_eq!(
        t.body["tools"],
        json!([chat_tool, { "type": "function", "function": { "name": "b", "description": "d", "parameters": {}, "strict": true } }])
    );
    assert_eq!(t.body["tool_choice"], json!({ "type": "function", "function": { "name": "b" } }));
    let t = run(with(json!({ "tools": [chat_tool], "tool_choice": "required" })), &text_model()).unwrap();
    assert_eq!(t.body["tool_choice"], "required");
    refused(
        run(with(json!({ "tools": [chat_tool] })), &caps(false, false, true, &[])),
        ErrorKind::HostedCapabilityNotSupported,
        "tools",
    );
    refused(
        run(with(json!({ "tools": [{ "type": "function" }] })), &text_model()),
        ErrorKind::MissingRequiredField,
        "tools[0].name",
    );
}

#[test]
fn malformed_scalars_name_the_field() {
    let c = text_model();
    refused(run(with(json!({ "max_output_tokens": 0 })), &c), ErrorKind::InvalidRequest, "max_output_tokens");
    refused(run(with(json!({ "stream": 1 })), &c), ErrorKind::InvalidRequest, "stream");
    refused(run(with(json!({ "instructions": [] })), &c), ErrorKind::InvalidRequest, "instructions");
    refused(run(with(json!({ "temperature": "hot" })), &c), ErrorKind::InvalidRequest, "temperature");
}

#[test]
fn responses_to_chat_reads_a_real_catalog_entry() {
    let models = catalog_models("models:\n- id: r1\n  supported_endpoints: [responses]\n  input_modalities: [text]\n");
    let t = responses_to_chat(&with(json!({})), &models[0]).unwrap();
    assert_eq!(t.body["messages"], json!([{ "role": "user", "content": "hi" }]));
    refused(
        responses_to_chat(&with(json!({ "text": { "format": { "type": "json_object" } } })), &models[0]),
        ErrorKind::HostedCapabilityNotSupported,
        "text.format",
    );
}
