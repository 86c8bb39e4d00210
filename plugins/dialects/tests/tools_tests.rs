//! `to_chat`: `tools` and every `tool_choice` form.

use serde_json::{Value, json};

use super::support::*;
use crate::dialects::{ModelCaps, Purpose, to_chat_with};
use tollgate::http::error::ErrorKind;

fn weather() -> Value {
    json!({ "name": "get_weather", "description": "Weather by city",
            "input_schema": { "type": "object", "properties": { "city": { "type": "string" } } },
            "strict": true, "defer_loading": false, "cache_control": { "type": "ephemeral" },
            "input_examples": [{ "city": "Paris" }] })
}

fn body(tools: Value, choice: Option<Value>) -> Value {
    let mut b =
        json!({ "model": "m", "max_tokens": 10, "messages": [{ "role": "user", "content": "hi" }], "tools": tools });
    if let Some(c) = choice {
        b["tool_choice"] = c;
    }
    b
}

fn chat(b: &Value) -> Value {
    to_chat_with(b, &text_model(), Purpose::Generate).unwrap().body
}

#[test]
fn client_tools_become_function_tools_and_ignored_keys_drop() {
    let b = chat(&body(
        json!([weather(), { "name": "noop", "type": "custom", "input_schema": { "type": "object" } }]),
        None,
    ));
    assert_eq!(
        b["tools"],
        json!([
            { "type": "function", "function": { "name": "get_weather", "description": "Weather by city",
              "parameters": { "type": "object", "properties": { "city": { "type": "string" } } } } },
            { "type": "function", "function": { "name": "noop", "parameters": { "type": "object" } } }
        ])
    );
    assert!(b.get("tool_choice").is_none());
    assert!(b.get("parallel_tool_calls").is_none());
}

#[test]
fn an_empty_tool_list_is_not_forwarded() {
    let b = chat(&body(json!([]), Some(json!({ "type": "auto" }))));
    assert!(b.get("tools").is_none());
    assert!(b.get("tool_choice").is_none());
}

#[test]
fn every_tool_choice_form_maps() {
    let cases = [
        (json!({ "type": "auto" }), json!("auto")),
        (json!({ "type": "none" }), json!("none")),
        (json!({ "type": "any" }), json!("required")),
        (
            json!({ "type": "tool", "name": "get_weather" }),
            json!({ "type": "function", "function": { "name": "get_weather" } }),
        ),
    ];
    for (choice, expected) in cases {
        let b = chat(&body(json!([weather()]), Some(choice)));
        assert_eq!(b["tool_choice"], expected);
        assert!(b.get("parallel_tool_calls").is_none());
    }
}

#[test]
fn disable_parallel_tool_use_sets_parallel_tool_calls_false() {
    let b = chat(&body(json!([weather()]), Some(json!({ "type": "auto", "disable_parallel_tool_use": true }))));
    assert_eq!(b["parallel_tool_calls"], false);
    let b = chat(&body(json!([weather()]), Some(json!({ "type": "any", "disable_parallel_tool_use": false }))));
    assert!(b.get("parallel_tool_calls").is_none());
}

#[test]
fn tool_choice_refusals_name_the_field() {
    let c = text_model();
    let run = |choice: Value| to_chat_with(&body(json!([weather()]), Some(choice)), &c, Purpose::Generate);
    refused(run(json!("auto")), ErrorKind::InvalidRequest, "tool_choice");
    refused(run(json!({ "type": "sometimes" })), ErrorKind::InvalidRequest, "tool_choice.type");
    refused(run(json!({})), ErrorKind::MissingRequiredField, "tool_choice.type");
    refused(run(json!({ "type": "tool" })), ErrorKind::MissingRequiredField, "tool_choice.name");
    refused(run(json!({ "type": "tool", "name": "other" })), ErrorKind::InvalidRequest, "tool_choice.name");
    refused(
        run(json!({ "type": "auto", "disable_parallel_tool_use": "yes" })),
        ErrorKind::InvalidRequest,
        "tool_choice.disable_parallel_tool_use",
    );
}

#[test]
fn forcing_a_tool_without_tools_is_refused_but_auto_is_dropped() {
    let c = text_model();
    let mut b = json!({ "model": "m", "max_tokens": 10, "messages": [{ "role": "user", "content": "hi" }] });
    b["tool_choice"] = json!({ "type": "any" });
    refused(to_chat_with(&b, &c, Purpose::Generate), ErrorKind::InvalidRequest, "tool_choice");
    b["tool_choice"] = json!({ "type": "none" });
    assert!(to_chat_with(&b, &c, Purpose::Generate).unwrap().body.get("tool_choice").is_none());
}

#[test]
fn vendor_server_tools_are_refused_by_type() {
    for t in ["bash_20250124", "text_editor_20250429", "web_search_20250305", "computer_20250124", "code_execution_x"] {
        let msg = refused(
            to_chat_with(&body(json!([weather(), { "type": t, "name": "x" }]), None), &text_model(), Purpose::Generate),
            ErrorKind::InvalidRequest,
            "tools[1].type",
        );
        assert!(msg.contains(t), "{msg}");
    }
}

#[test]
fn malformed_tools_name_the_field() {
    let c = text_model();
    let run = |tools: Value| to_chat_with(&body(tools, None), &c, Purpose::Generate);
    refused(run(json!({ "name": "x" })), ErrorKind::InvalidRequest, "tools");
    refused(run(json!(["x"])), ErrorKind::InvalidRequest, "tools[0]");
    refused(run(json!([{ "input_schema": {} }])), ErrorKind::MissingRequiredField, "tools[0].name");
    refused(run(json!([{ "name": "" , "input_schema": {} }])), ErrorKind::InvalidRequest, "tools[0].name");
    refused(run(json!([weather(), { "name": "x" }])), ErrorKind::MissingRequiredField, "tools[1].input_schema");
    refused(run(json!([{ "name": "x", "input_schema": "{}" }])), ErrorKind::InvalidRequest, "tools[0].input_schema");
    refused(
        run(json!([{ "name": "x", "input_schema": {}, "description": 3 }])),
        ErrorKind::InvalidRequest,
        "tools[0].description",
    );
}

#[test]
fn tools_on_a_model_without_tool_calling_are_a_missing_capability() {
    refused(
        to_chat_with(&body(json!([weather()]), None), &caps(false, false, true, &[]), Purpose::Generate),
        ErrorKind::HostedCapabilityNotSupported,
        "tools",
    );
}

#[test]
fn forcing_any_of_several_tools_is_refused_only_where_the_model_is_limited() {
    let limited = ModelCaps { forced_tool_calling_limited: true, ..text_model() };
    let noop = json!({ "name": "noop", "input_schema": { "type": "object" } });
    let any = Some(json!({ "type": "any" }));
    let run =
        |tools: Value, choice: Option<Value>, c: &ModelCaps| to_chat_with(&body(tools, choice), c, Purpose::Generate);
    refused(
        run(json!([weather(), noop.clone()]), any.clone(), &limited),
        ErrorKind::HostedCapabilityNotSupported,
        "tool_choice",
    );
    // One tool, a named tool, `auto`, or a model without the limit: forwarded.
    let one = run(json!([weather()]), any.clone(), &limited).unwrap().body;
    assert_eq!(one["tool_choice"], "required");
    let named = json!({ "type": "tool", "name": "noop" });
    let b = run(json!([weather(), noop.clone()]), Some(named), &limited).unwrap().body;
    assert_eq!(b["tool_choice"]["function"]["name"], "noop");
    let b = run(json!([weather(), noop.clone()]), Some(json!({ "type": "auto" })), &limited).unwrap().body;
    assert_eq!(b["tool_choice"], "auto");
    let b = run(json!([weather(), noop]), any, &text_model()).unwrap().body;
    assert_eq!(b["tool_choice"], "required");
}
