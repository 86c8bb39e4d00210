//! Rule 7: JSON schemas the replica compiles into guided decoding (`tools[].function.parameters`,
//! legacy `functions[].parameters`, `response_format.json_schema.schema`). An unsatisfiable
//! bound pair is removed; an empty `enum` or an invalid `pattern` is refused naming its path.
//! Patterns are checked with `fancy-regex`, which accepts lookarounds and backreferences as
//! JSON Schema's ECMA-262 patterns do (decisions.md 60). Nesting is bounded (`MAX_DEPTH`).

use serde_json::{Map, Value};

use tollgate::http::error::{ErrorKind, GatewayError};

/// Schema levels walked; deeper is refused (decisions.md 60).
pub const MAX_DEPTH: usize = 64;
/// Compiled size allowed for one pattern (bytes), so a pattern cannot make us build a huge
/// automaton.
const PATTERN_SIZE_LIMIT: usize = 1 << 20;

/// Keywords whose value is a map of name -> schema.
const MAP_KEYWORDS: &[&str] = &["properties", "patternProperties", "$defs", "definitions", "dependentSchemas"];
/// Keywords whose value is one schema (or, for `items`/`additionalItems`, a list of them).
const ONE_KEYWORDS: &[&str] = &[
    "additionalProperties",
    "items",
    "additionalItems",
    "contains",
    "not",
    "if",
    "then",
    "else",
    "propertyNames",
    "unevaluatedItems",
    "unevaluatedProperties",
];
/// Keywords whose value is a list of schemas.
const LIST_KEYWORDS: &[&str] = &["allOf", "anyOf", "oneOf", "prefixItems"];

/// (lower, upper, both inclusive): the pair is unsatisfiable when lower > upper (inclusive)
/// or lower >= upper (either side exclusive).
const BOUND_PAIRS: &[(&str, &str, bool)] = &[
    ("minimum", "maximum", true),
    ("exclusiveMinimum", "exclusiveMaximum", false),
    ("minimum", "exclusiveMaximum", false),
    ("exclusiveMinimum", "maximum", false),
    ("minItems", "maxItems", true),
    ("minLength", "maxLength", true),
    ("minProperties", "maxProperties", true),
];

fn refuse(path: String, message: String) -> GatewayError {
    GatewayError::new(ErrorKind::HostedParameterNotSupported, message).with_param(path)
}

/// Sanitise every schema of the request body in place.
pub fn sanitize_body(body: &mut Map<String, Value>) -> Result<(), GatewayError> {
    if let Some(Value::Array(tools)) = body.get_mut("tools") {
        for (i, t) in tools.iter_mut().enumerate() {
            if let Some(s) = t.pointer_mut("/function/parameters") {
                sanitize(s, format!("tools[{i}].function.parameters"), 0)?;
            }
        }
    }
    if let Some(Value::Array(functions)) = body.get_mut("functions") {
        for (i, f) in functions.iter_mut().enumerate() {
            if let Some(s) = f.get_mut("parameters") {
                sanitize(s, format!("functions[{i}].parameters"), 0)?;
            }
        }
    }
    if let Some(format) = body.get_mut("response_format")
        && format.get("type").and_then(Value::as_str) == Some("json_schema")
        && let Some(s) = format.pointer_mut("/json_schema/schema")
    {
        sanitize(s, "response_format.json_schema.schema".into(), 0)?;
    }
    Ok(())
}

/// Sanitise one schema node at `path`, recursing through the subschema keywords only (so a
/// property *named* `pattern` is a schema, not a regular expression).
pub fn sanitize(node: &mut Value, path: String, depth: usize) -> Result<(), GatewayError> {
    let Value::Object(o) = node else { return Ok(()) };
    if depth >= MAX_DEPTH {
        return Err(refuse(path, format!("Schemas nested deeper than {MAX_DEPTH} levels are not supported.")));
    }
    if o.get("enum").and_then(Value::as_array).is_some_and(Vec::is_empty) {
        return Err(refuse(format!("{path}.enum"), format!("`{path}.enum` is empty: no value could match it.")));
    }
    if let Some(Value::String(p)) = o.get("pattern")
        && let Err(e) = fancy_regex::RegexBuilder::new(p).delegate_size_limit(PATTERN_SIZE_LIMIT).build()
    {
        let e = tollgate::http::text::truncate(&e.to_string(), 200).to_string();
        return Err(refuse(
            format!("{path}.pattern"),
            format!("`{path}.pattern` is not a valid regular expression: {e}"),
        ));
    }
    remove_unsatisfiable_bounds(o);
    for kw in MAP_KEYWORDS {
        if let Some(Value::Object(map)) = o.get_mut(*kw) {
            for (name, sub) in map.iter_mut() {
                sanitize(sub, format!("{path}.{kw}.{name}"), depth + 1)?;
            }
        }
    }
    for kw in ONE_KEYWORDS.iter().chain(LIST_KEYWORDS) {
        match o.get_mut(*kw) {
            Some(Value::Array(list)) => {
                for (n, sub) in list.iter_mut().enumerate() {
                    sanitize(sub, format!("{path}.{kw}[{n}]"), depth + 1)?;
                }
            }
            Some(sub @ Value::Object(_)) => sanitize(sub, format!("{path}.{kw}"), depth + 1)?,
            _ => {}
        }
    }
    Ok(())
}

fn remove_unsatisfiable_bounds(o: &mut Map<String, Value>) {
    let num = |o: &Map<String, Value>, k: &str| o.get(k).and_then(Value::as_f64);
    let mut doomed: Vec<&str> = Vec::new();
    for &(lo, hi, inclusive) in BOUND_PAIRS {
        if let (Some(l), Some(h)) = (num(o, lo), num(o, hi)) {
            if if inclusive { l > h } else { l >= h } {
                doomed.extend([lo, hi]);
            }
        }
    }
    for k in doomed {
        o.remove(k);
    }
}

#[cfg(test)]
#[path = "schema_tests.rs"]
mod tests;
