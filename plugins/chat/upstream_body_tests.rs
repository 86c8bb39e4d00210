use super::*;

/// The body as the rules leave it when they change nothing: the text's own parse.
fn parsed(text: &str) -> Map<String, Value> {
    serde_json::from_str(text).unwrap()
}

fn from_text(text: &str, body: &Map<String, Value>, stream: bool, changed: Changed) -> String {
    let out = from_client_text(text.as_bytes(), body, "served-name", stream, changed).expect("an object");
    String::from_utf8(out).unwrap()
}

fn as_value(text: &str) -> Value {
    serde_json::from_str(text).unwrap_or_else(|e| panic!("{e}: {text}"))
}

/// Whatever the text's form, the replica reads the same body as the serialized one.
fn same_as_serialized(text: &str, body: &Map<String, Value>, stream: bool, changed: Changed) -> String {
    let written = from_text(text, body, stream, changed);
    let serialized = serialize(body.clone(), "served-name", stream).unwrap();
    assert_eq!(as_value(&written), serde_json::from_slice::<Value>(&serialized).unwrap(), "{text}");
    written
}

#[test]
fn untouched_members_go_as_the_client_wrote_them() {
    let text = r#"{ "temperature" : 1.0, "model":"catalog-id", "user": "caf\u00e9",
        "messages": [ {"role":"user","content":"hi"} ], "x_unknown": {"a": 1}, "seed": 12345678901234567890 }"#;
    let written = same_as_serialized(text, &parsed(text), false, Changed::default());
    assert!(written.starts_with(r#"{"model":"served-name","temperature":1.0,"user":"caf\u00e9","#), "{written}");
    assert!(written.contains(r#""messages":[ {"role":"user","content":"hi"} ]"#), "copied as sent: {written}");
    assert!(written.contains(r#""seed":12345678901234567890"#), "digits kept: {written}");
    assert!(!written.contains("x_unknown") && !written.contains("catalog-id"), "{written}");
}

#[test]
fn of_a_repeated_member_the_last_is_sent() {
    let text = r#"{"model":"m","n":1,"messages":[],"n":2,"stream":false}"#;
    let written = same_as_serialized(text, &parsed(text), false, Changed::default());
    assert_eq!(written, r#"{"model":"served-name","messages":[],"n":2}"#);
}

#[test]
fn many_repeats_send_the_last_once() {
    let repeats: String = (0..50_000).map(|k| format!(r#""n":{},"x":{k},"#, k % 4)).collect();
    let text = format!(r#"{{"model":"m",{repeats}"messages":[]}}"#);
    let written = same_as_serialized(&text, &parsed(&text), false, Changed::default());
    assert_eq!(written, r#"{"model":"served-name","n":3,"messages":[]}"#);
}

#[test]
fn a_stream_always_asks_for_usage_once() {
    let text = r#"{"model":"m","stream":true,"stream_options":{"include_usage":false},"messages":[]}"#;
    let written = same_as_serialized(text, &parsed(text), true, Changed::default());
    assert_eq!(
        written,
        r#"{"model":"served-name","messages":[],"stream":true,"stream_options":{"include_usage":true}}"#
    );
}

#[test]
fn members_a_rule_changed_are_written_from_the_body() {
    let text = r#"{"model":"m","messages":[{"role":"developer","content":"d"}],"max_tokens":900,"reasoning_effort":null,
        "response_format":{"type":"json_schema","json_schema":{"schema":{"minimum":5,"maximum":1}}}}"#;
    let mut body = parsed(text);
    body["messages"][0]["role"] = json!("system");
    body.insert("max_tokens".into(), json!(100));
    body.insert("reasoning_effort".into(), json!("low"));
    body["response_format"]["json_schema"]["schema"] = json!({});
    let changed = Changed { messages: true, effort: true, ceilings: true };
    let written = same_as_serialized(text, &body, false, changed);
    for part in [r#""role":"system""#, r#""max_tokens":100"#, r#""reasoning_effort":"low""#, r#""schema":{}"#] {
        assert!(written.contains(part), "{part} in {written}");
    }
    // Told nothing changed, the client's own text goes: the flags are what select the body.
    let unchanged = from_text(text, &body, false, Changed::default());
    assert!(unchanged.contains(r#""max_tokens":900"#) && unchanged.contains(r#""role":"developer""#), "{unchanged}");
}

#[test]
fn an_effort_put_in_place_of_an_omitted_one_is_added() {
    let text = r#"{"model":"m","messages":[]}"#;
    let mut body = parsed(text);
    body.insert("reasoning_effort".into(), json!("medium"));
    let written = same_as_serialized(text, &body, false, Changed { effort: true, ..Changed::default() });
    assert_eq!(written, r#"{"model":"served-name","messages":[],"reasoning_effort":"medium"}"#);
}

#[test]
fn text_that_is_not_an_object_is_not_written() {
    let body = Map::new();
    // An escaped member name (never seen from a client) is left to the serializer.
    for text in ["[1,2]", "not json", "\"s\"", r#"{"model":"m","\u006e":1}"#] {
        assert!(from_client_text(text.as_bytes(), &body, "u", false, Changed::default()).is_none(), "{text}");
    }
}
