use serde_json::json;

use super::*;

fn run(mut schema: Value) -> Result<Value, GatewayError> {
    sanitize(&mut schema, "s".into(), 0).map(|()| schema)
}

#[test]
fn unsatisfiable_pairs_go_and_satisfiable_ones_stay() {
    let out = run(json!({"type": "object", "properties": {
        "a": {"type": "number", "minimum": 5, "maximum": 1},
        "b": {"type": "number", "minimum": 1, "maximum": 5},
        "c": {"type": "number", "exclusiveMinimum": 3, "exclusiveMaximum": 3},
        "d": {"type": "array", "minItems": 4, "maxItems": 2, "items": {"type": "string", "minLength": 9, "maxLength": 1}},
        "e": {"type": "object", "minProperties": 3, "maxProperties": 2},
        "f": {"type": "number", "minimum": 3, "maximum": 3},
        "g": {"type": "number", "minimum": 3, "exclusiveMaximum": 3},
    }}))
    .unwrap_or_default();
    let p = &out["properties"];
    assert_eq!(p["a"], json!({"type": "number"}));
    assert_eq!(p["b"], json!({"type": "number", "minimum": 1, "maximum": 5}));
    assert_eq!(p["c"], json!({"type": "number"}));
    assert_eq!(p["d"], json!({"type": "array", "items": {"type": "string"}}));
    assert_eq!(p["e"], json!({"type": "object"}));
    assert_eq!(p["f"], json!({"type": "number", "minimum": 3, "maximum": 3}), "a closed point range is satisfiable");
    assert_eq!(p["g"], json!({"type": "number"}));
}

#[test]
fn empty_enum_and_bad_pattern_name_their_path() {
    let e = run(json!({"properties": {"x": {"enum": []}}})).err();
    assert_eq!(
        e.map(|e| (e.kind, e.param)),
        Some((ErrorKind::HostedParameterNotSupported, Some("s.properties.x.enum".into())))
    );
    let e = run(json!({"anyOf": [{"type": "string"}, {"items": {"pattern": "(unclosed"}}]})).err();
    assert_eq!(e.and_then(|e| e.param), Some("s.anyOf[1].items.pattern".into()));
}

#[test]
fn lookarounds_are_valid_patterns_and_names_are_not_keywords() {
    assert!(run(json!({"pattern": "^(?=.*[0-9])[a-z0-9]+$"})).is_ok());
    assert!(run(json!({"pattern": "(a)\\1"})).is_ok());
    // A property called `pattern` is a schema, not a regular expression.
    assert!(run(json!({"properties": {"pattern": {"type": "string"}, "enum": {"type": "string"}}})).is_ok());
}

#[test]
fn nesting_is_bounded() {
    let mut deep = json!({"type": "string"});
    for _ in 0..MAX_DEPTH {
        deep = json!({"items": deep});
    }
    let e = run(deep).err();
    assert_eq!(e.map(|e| e.kind), Some(ErrorKind::HostedParameterNotSupported));
    let mut ok = json!({"type": "string"});
    for _ in 0..MAX_DEPTH - 1 {
        ok = json!({"items": ok});
    }
    assert!(run(ok).is_ok());
}

#[test]
fn every_schema_of_the_body_is_walked() {
    let mut body = json!({
        "tools": [{"type": "function", "function": {"name": "f", "parameters": {"minimum": 2, "maximum": 1}}},
                  {"type": "function", "function": {"name": "g", "parameters": {"properties": {"x": {"pattern": "["}}}}}],
    });
    let e = body.as_object_mut().map(sanitize_body);
    assert_eq!(
        e.and_then(|r| r.err()).and_then(|e| e.param),
        Some("tools[1].function.parameters.properties.x.pattern".into())
    );
    assert_eq!(body["tools"][0]["function"]["parameters"], json!({}));
    let mut body =
        json!({"response_format": {"type": "json_schema", "json_schema": {"name": "o", "schema": {"enum": []}}}});
    let e = body.as_object_mut().map(sanitize_body);
    assert_eq!(e.and_then(|r| r.err()).and_then(|e| e.param), Some("response_format.json_schema.schema.enum".into()));
}
