//! `to_chat`: top-level fields, tools, tool_choice, thinking and output_config.

use serde_json::{Value, json};

use super::support::*;
use crate::dialects::{
    ChatTranslation, ModelCaps, Purpose, WARN_EFFORT_CLAMPED, WARN_THINKING_NOT_DISABLED, to_chat, to_chat_with,
};
use tollgate::http::error::ErrorKind;

fn base() -> Value {
    json!({ "model": "m1", "max_tokens": 100, "messages": [{ "role": "user", "content": "hi" }] })
}

fn with(extra: Value) -> Value {
    let mut b = base();
    for (k, v) in extra.as_object().unwrap() {
        b[k] = v.clone();
    }
    b
}

fn ok(body: &Value, caps: &ModelCaps) -> ChatTranslation {
    to_chat_with(body, caps, Purpose::Generate).unwrap()
}

#[test]
fn minimal_request_translates_exactly() {
    let t = ok(&base(), &text_model());
    assert_eq!(
        t,
        ChatTranslation {
            body: json!({ "model": "m1", "max_tokens": 100, "messages": [{ "role": "user", "content": "hi" }] }),
            warnings: vec![],
            stream: false,
        }
    );
}

#[test]
fn every_mapped_field_lands_in_its_chat_field() {
    let body = with(json!({
        "system": "be brief",
        "stream": true,
        "stop_sequences": ["END", "STOP"],
        "temperature": 0.5,
        "top_p": 0.9,
        "metadata": { "user_id": "u-42", "other": 1 },
        "top_k": 40, "cache_control": { "type": "ephemeral" }, "service_tier": "auto", "container": "c",
        "mcp_servers": [], "context_management": {}, "inference_geo": "us", "speed": "fast",
        "something_new": { "x": 1 }
    }));
    let t = ok(&body, &text_model());
    assert!(t.stream);
    assert_eq!(
        t.body,
        json!({
            "model": "m1",
            "max_tokens": 100,
            "messages": [{ "role": "system", "content": "be brief" }, { "role": "user", "content": "hi" }],
            "stream": true,
            "stream_options": { "include_usage": true },
            "stop": ["END", "STOP"],
            "temperature": 0.5,
            "top_p": 0.9,
            "user": "u-42",
        })
    );
}

#[test]
fn max_tokens_is_required_and_at_least_one() {
    let mut b = base();
    b.as_object_mut().unwrap().remove("max_tokens");
    refused(to_chat_with(&b, &text_model(), Purpose::Generate), ErrorKind::MissingRequiredField, "max_tokens");
    b["max_tokens"] = Value::Null;
    refused(to_chat_with(&b, &text_model(), Purpose::Generate), ErrorKind::MissingRequiredField, "max_tokens");
    for bad in [json!(0), json!(-1), json!(1.5), json!("10")] {
        b["max_tokens"] = bad;
        refused(to_chat_with(&b, &text_model(), Purpose::Generate), ErrorKind::InvalidRequest, "max_tokens");
    }
    b["max_tokens"] = json!(1);
    assert_eq!(ok(&b, &text_model()).body["max_tokens"], 1);
}

#[test]
fn count_tokens_makes_max_tokens_optional_and_never_streams() {
    let mut b = with(json!({ "stream": true }));
    b.as_object_mut().unwrap().remove("max_tokens");
    let t = to_chat_with(&b, &text_model(), Purpose::CountTokens).unwrap();
    assert!(!t.stream);
    assert_eq!(t.body, json!({ "model": "m1", "messages": [{ "role": "user", "content": "hi" }] }));
    // Still checked when given.
    b["max_tokens"] = json!(0);
    refused(to_chat_with(&b, &text_model(), Purpose::CountTokens), ErrorKind::InvalidRequest, "max_tokens");
}

#[test]
fn malformed_top_level_fields_name_themselves() {
    let caps = text_model();
    let cases = [
        (json!({ "stream": "yes" }), "stream"),
        (json!({ "stop_sequences": "END" }), "stop_sequences"),
        (json!({ "stop_sequences": ["a", 1] }), "stop_sequences[1]"),
        (json!({ "temperature": "hot" }), "temperature"),
        (json!({ "top_p": [] }), "top_p"),
        (json!({ "metadata": "x" }), "metadata"),
        (json!({ "metadata": { "user_id": 7 } }), "metadata.user_id"),
        (json!({ "system": 5 }), "system"),
        (json!({ "system": [{ "type": "image" }] }), "system[0]"),
        (json!({ "thinking": "on" }), "thinking"),
        (json!({ "thinking": { "type": "sometimes" } }), "thinking.type"),
        (json!({ "output_config": { "effort": "extreme" } }), "output_config.effort"),
        (json!({ "output_config": { "format": { "type": "regex" } } }), "output_config.format.type"),
    ];
    for (extra, param) in cases {
        refused(to_chat_with(&with(extra), &caps, Purpose::Generate), ErrorKind::InvalidRequest, param);
    }
    refused(
        to_chat_with(&with(json!({ "thinking": {} })), &caps, Purpose::Generate),
        ErrorKind::MissingRequiredField,
        "thinking.type",
    );
    refused(
        to_chat_with(
            &with(json!({ "output_config": { "format": { "type": "json_schema" } } })),
            &caps,
            Purpose::Generate,
        ),
        ErrorKind::MissingRequiredField,
        "output_config.format.schema",
    );
    let e = to_chat_with(&json!([1]), &caps, Purpose::Generate).unwrap_err();
    assert_eq!((e.kind, e.param), (ErrorKind::InvalidRequest, None));
}

#[test]
fn system_blocks_join_and_ignore_cache_control() {
    let b = with(json!({ "system": [
        { "type": "text", "text": "one", "cache_control": { "type": "ephemeral" } },
        { "type": "text", "text": "two" }
    ] }));
    assert_eq!(ok(&b, &text_model()).body["messages"][0], json!({ "role": "system", "content": "one\n\ntwo" }));
    // An empty system says nothing.
    let b = with(json!({ "system": "" }));
    assert_eq!(ok(&b, &text_model()).body["messages"].as_array().unwrap().len(), 1);
}

#[test]
fn empty_stop_sequences_are_not_forwarded() {
    assert!(ok(&with(json!({ "stop_sequences": [] })), &text_model()).body.get("stop").is_none());
}

#[test]
fn thinking_enabled_and_adaptive_send_nothing_and_budget_is_ignored() {
    let caps = caps(false, false, false, &["low", "high"]);
    for t in ["enabled", "adaptive"] {
        let r = ok(&with(json!({ "thinking": { "type": t, "budget_tokens": 2048 } })), &caps);
        assert!(r.body.get("reasoning_effort").is_none());
        assert!(r.warnings.is_empty());
    }
}

#[test]
fn thinking_disabled_turns_reasoning_off_where_declared() {
    let r = ok(&with(json!({ "thinking": { "type": "disabled" } })), &caps(false, false, false, &["none", "high"]));
    assert_eq!(r.body["reasoning_effort"], "none");
    assert!(r.warnings.is_empty());
    // It wins over an effort.
    let b = with(json!({ "thinking": { "type": "disabled" }, "output_config": { "effort": "high" } }));
    assert_eq!(ok(&b, &caps(false, false, false, &["none", "high"])).body["reasoning_effort"], "none");
}

#[test]
fn thinking_disabled_on_a_model_that_cannot_is_ignored_with_a_warning() {
    let r = ok(&with(json!({ "thinking": { "type": "disabled" } })), &caps(false, false, false, &["low", "high"]));
    assert!(r.body.get("reasoning_effort").is_none());
    assert_eq!(r.warnings, vec![WARN_THINKING_NOT_DISABLED.to_string()]);
    assert_eq!(WARN_THINKING_NOT_DISABLED, "thinking cannot be disabled on this model");
    // The effort then applies.
    let b = with(json!({ "thinking": { "type": "disabled" }, "output_config": { "effort": "low" } }));
    assert_eq!(ok(&b, &caps(false, false, false, &["low", "high"])).body["reasoning_effort"], "low");
}

#[test]
fn thinking_disabled_without_declared_efforts_sends_nothing() {
    let r = ok(&with(json!({ "thinking": { "type": "disabled" } })), &text_model());
    assert!(r.body.get("reasoning_effort").is_none());
    assert!(r.warnings.is_empty());
}

#[test]
fn output_effort_is_clamped_with_a_warning() {
    let c = caps(false, false, false, &["low", "medium", "high"]);
    let r = ok(&with(json!({ "output_config": { "effort": "max" } })), &c);
    assert_eq!(r.body["reasoning_effort"], "high");
    assert_eq!(r.warnings, vec![WARN_EFFORT_CLAMPED.to_string()]);
    assert_eq!(WARN_EFFORT_CLAMPED, "reasoning_effort_clamped");
    let r = ok(&with(json!({ "output_config": { "effort": "medium" } })), &c);
    assert_eq!((r.body["reasoning_effort"].clone(), r.warnings.len()), (json!("medium"), 0));
    // Nothing declared: passed as given.
    let r = ok(&with(json!({ "output_config": { "effort": "xhigh" } })), &text_model());
    assert_eq!((r.body["reasoning_effort"].clone(), r.warnings.len()), (json!("xhigh"), 0));
}

#[test]
fn both_warnings_can_be_raised_together() {
    let b = with(json!({ "thinking": { "type": "disabled" }, "output_config": { "effort": "none" } }));
    let r = ok(&b, &caps(false, false, false, &["low", "high"]));
    assert_eq!(r.body["reasoning_effort"], "low");
    assert_eq!(r.warnings, vec![WARN_THINKING_NOT_DISABLED.to_string(), WARN_EFFORT_CLAMPED.to_string()]);
}

#[test]
fn json_schema_format_becomes_response_format() {
    let schema = json!({ "type": "object", "properties": { "a": { "type": "string" } } });
    let r =
        ok(&with(json!({ "output_config": { "format": { "type": "json_schema", "schema": schema } } })), &text_model());
    assert_eq!(
        r.body["response_format"],
        json!({ "type": "json_schema", "json_schema": { "name": "output", "schema": schema } })
    );
    let e = to_chat_with(
        &with(json!({ "output_config": { "format": { "type": "json_schema", "schema": {} } } })),
        &caps(false, true, false, &[]),
        Purpose::Generate,
    );
    refused(e, ErrorKind::HostedCapabilityNotSupported, "output_config.format");
}

#[test]
fn to_chat_reads_a_real_catalog_entry() {
    let models =
        catalog_models("models:\n- id: r1\n  supported_endpoints: [messages]\n  reasoning_efforts: [low, high]\n");
    let b = with(json!({ "thinking": { "type": "disabled" }, "output_config": { "effort": "medium" } }));
    let r = to_chat(&b, &models[0], Purpose::Generate).unwrap();
    assert_eq!(r.body["reasoning_effort"], "low");
    assert_eq!(r.warnings, vec![WARN_THINKING_NOT_DISABLED.to_string(), WARN_EFFORT_CLAMPED.to_string()]);
    // No tool calling declared: tools are a missing capability.
    let b = with(json!({ "tools": [{ "name": "t", "input_schema": { "type": "object" } }] }));
    refused(to_chat(&b, &models[0], Purpose::Generate), ErrorKind::HostedCapabilityNotSupported, "tools");
}
