use serde_json::json;

use super::*;

fn param_of(msgs: Value) -> Option<String> {
    check(Some(&msgs)).err().and_then(|e| e.param)
}

fn code_of(msgs: Value) -> Option<&'static str> {
    check(Some(&msgs)).err().map(|e| e.kind.code())
}

#[test]
fn roles_are_checked_with_param() {
    let msgs = json!([{"role": "user", "content": "hi"}, {"role": "robot", "content": "x"}]);
    assert_eq!(param_of(msgs), Some("messages[1].role".to_string()));
    assert_eq!(check(None).err().map(|e| e.kind), Some(ErrorKind::MissingRequiredField));
    assert!(check(Some(&json!([]))).is_err());
    assert_eq!(param_of(json!(["hi"])), Some("messages[0]".into()));
}

#[test]
fn content_is_a_string_an_array_or_null() {
    assert!(check(Some(&json!([{"role": "user", "content": [{"type": "text", "text": "a"}]}]))).is_ok());
    assert_eq!(param_of(json!([{"role": "user", "content": 5}])), Some("messages[0].content".into()));
    assert_eq!(param_of(json!([{"role": "user", "content": [{"text": "a"}]}])), Some("messages[0].content[0]".into()));
    assert_eq!(param_of(json!([{"role": "user", "content": null}])), Some("messages[0].content".into()));
    assert_eq!(code_of(json!([{"role": "system"}])), Some("missing_required_field"));
    assert_eq!(code_of(json!([{"role": "developer", "content": {}}])), Some("invalid_request"));
}

#[test]
fn assistant_needs_content_or_tool_calls() {
    let call = json!({"id": "c1", "type": "function", "function": {"name": "f", "arguments": "{}"}});
    assert!(check(Some(&json!([{"role": "assistant", "content": null, "tool_calls": [call]}]))).is_ok());
    assert!(check(Some(&json!([{"role": "assistant", "content": ""}]))).is_ok());
    assert_eq!(
        param_of(json!([{"role": "assistant", "content": null, "tool_calls": []}])),
        Some("messages[0].content".into())
    );
    assert_eq!(param_of(json!([{"role": "assistant"}])), Some("messages[0].content".into()));
    assert_eq!(param_of(json!([{"role": "assistant", "tool_calls": {}}])), Some("messages[0].tool_calls".into()));
}

#[test]
fn tool_call_arguments_must_hold_a_json_object() {
    for bad in [json!("[1]"), json!("not json"), json!({"a": 1}), json!(null), json!("")] {
        let call = json!({"function": {"name": "f", "arguments": bad}});
        let msgs = json!([{"role": "user", "content": "q"}, {"role": "assistant", "tool_calls": [call, call]}]);
        let e = check(Some(&msgs)).err();
        assert_eq!(e.as_ref().map(|e| e.kind), Some(ErrorKind::InvalidRequest), "{bad}");
        assert_eq!(e.and_then(|e| e.param), Some("messages[1].tool_calls[0].function.arguments".into()), "{bad}");
    }
    let no_function = json!([{"role": "assistant", "tool_calls": [{"id": "x"}]}]);
    assert_eq!(param_of(no_function), Some("messages[0].tool_calls[0].function".into()));
}

#[test]
fn tool_messages_need_content_and_a_call_id() {
    assert!(check(Some(&json!([{"role": "tool", "content": "r", "tool_call_id": "c1"}]))).is_ok());
    assert_eq!(param_of(json!([{"role": "tool", "tool_call_id": "c1"}])), Some("messages[0].content".into()));
    assert_eq!(param_of(json!([{"role": "tool", "content": "r"}])), Some("messages[0].tool_call_id".into()));
    assert_eq!(code_of(json!([{"role": "tool", "content": "r", "tool_call_id": ""}])), Some("invalid_request"));
    assert_eq!(code_of(json!([{"role": "tool", "content": "r", "tool_call_id": 7}])), Some("invalid_request"));
}

fn roles(list: &[Value]) -> Vec<&str> {
    list.iter().filter_map(|m| m["role"].as_str()).collect()
}

#[test]
fn developer_becomes_system_on_every_model() {
    let mut list = vec![json!({"role": "developer", "content": "d"}), json!({"role": "user", "content": "u"})];
    assert_eq!(repair_system(&mut list, SystemMessages::Any).ok(), Some(true), "changed");
    assert_eq!(roles(&list), ["system", "user"]);
    let mut list = vec![json!({"role": "user", "content": "u"}), json!({"role": "system", "content": "s"})];
    assert_eq!(repair_system(&mut list, SystemMessages::Any).ok(), Some(false), "nothing to change");
    assert_eq!(roles(&list), ["user", "system"], "untouched where any position is accepted");
}

#[test]
fn first_only_merges_leading_and_demotes_later_system_messages() {
    let mut list = vec![
        json!({"role": "system", "content": "a"}),
        json!({"role": "developer", "content": [{"type": "text", "text": "b"}]}),
        json!({"role": "user", "content": "u"}),
        json!({"role": "system", "content": "later"}),
        json!({"role": "assistant", "content": "x"}),
    ];
    assert_eq!(repair_system(&mut list, SystemMessages::FirstOnly).ok(), Some(true));
    assert_eq!(roles(&list), ["system", "user", "user", "assistant"]);
    assert_eq!(list[0]["content"], "a\n\nb");
    assert_eq!(list[2]["content"], "later");
}

#[test]
fn impossible_repairs_name_messages() {
    let mut only_system = vec![json!({"role": "system", "content": "a"}), json!({"role": "developer", "content": "b"})];
    let e = repair_system(&mut only_system, SystemMessages::FirstOnly).err();
    assert_eq!(e.and_then(|e| e.param), Some("messages".into()));
    let mut image = vec![
        json!({"role": "system", "content": "a"}),
        json!({"role": "system", "content": [{"type": "image_url", "image_url": {"url": "data:"}}]}),
        json!({"role": "user", "content": "u"}),
    ];
    let e = repair_system(&mut image, SystemMessages::FirstOnly).err();
    assert_eq!(e.map(|e| (e.kind, e.param)), Some((ErrorKind::InvalidRequest, Some("messages".into()))));
    let mut one =
        vec![json!({"role": "system", "content": [{"type": "image_url"}]}), json!({"role": "user", "content": "u"})];
    assert_eq!(
        repair_system(&mut one, SystemMessages::FirstOnly).ok(),
        Some(false),
        "a single leading one needs no merge"
    );
    let mut demoted = vec![json!({"role": "user", "content": "u"}), json!({"role": "system", "content": "s"})];
    assert_eq!(repair_system(&mut demoted, SystemMessages::FirstOnly).ok(), Some(true), "a later one demoted");
}
