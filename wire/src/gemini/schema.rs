//! JSON Schema → Gemini's `Schema` (an OpenAPI 3.0 subset), for `responseSchema` and tool
//! parameters: what the subset expresses is carried over, what it cannot is reported so a
//! strict schema can be refused rather than silently loosened.

use serde_json::{Map, Value, json};

/// Keywords of Gemini's `Schema` copied as they are.
const KEPT: [&str; 16] = [
    "title",
    "description",
    "nullable",
    "required",
    "minItems",
    "maxItems",
    "minProperties",
    "maxProperties",
    "minLength",
    "maxLength",
    "pattern",
    "minimum",
    "maximum",
    "default",
    "example",
    "propertyOrdering",
];

/// Keywords dropped without loss: annotations, or (`additionalProperties: false`) what
/// Gemini does anyway — it generates only the declared properties.
const DROPPED: [&str; 10] = [
    "$schema",
    "$id",
    "$comment",
    "strict",
    "deprecated",
    "readOnly",
    "writeOnly",
    "contentEncoding",
    "contentMediaType",
    "examples",
];

/// The `format`s Gemini's Schema documents; others are dropped (in JSON Schema `format` is
/// an annotation unless a validator opts in, so nothing is promised by it).
const FORMATS: [&str; 6] = ["date-time", "enum", "float", "double", "int32", "int64"];

/// A JSON schema in Gemini's `Schema` subset (OpenAPI 3.0): type names upper-cased,
/// `["T", "null"]` → `T` + `nullable`, `const` → a one-value `enum`, `oneOf` → `anyOf`,
/// `examples` → `example`. What the subset cannot express (`$ref`/`$defs`, `allOf`, `not`,
/// `if`/`then`/`else`, `patternProperties`, open `additionalProperties`, tuple `items`,
/// `uniqueItems`, `multipleOf`, exclusive bounds, non-string enums, exclusive `oneOf`…) is
/// dropped and its location pushed to `lost`.
pub fn sanitize(schema: &Value, path: &str, lost: &mut Vec<String>) -> Value {
    let Value::Object(map) = schema else {
        return schema.clone();
    };
    let mut out = Map::new();
    for (key, value) in map {
        let here = format!("{path}/{key}");
        match key.as_str() {
            "type" => match value {
                Value::String(t) => {
                    out.insert("type".into(), json!(t.to_ascii_uppercase()));
                }
                Value::Array(types) => {
                    let named: Vec<&str> = types.iter().filter_map(Value::as_str).collect();
                    let non_null: Vec<&str> =
                        named.iter().copied().filter(|t| *t != "null").collect();
                    if named.len() != non_null.len() {
                        out.insert("nullable".into(), json!(true));
                    }
                    match non_null.as_slice() {
                        [one] => {
                            out.insert("type".into(), json!(one.to_ascii_uppercase()));
                        }
                        _ => lost.push(format!("`type` {value} at {path}")),
                    }
                }
                _ => lost.push(format!("`type` at {path}")),
            },
            "properties" => {
                let Value::Object(props) = value else {
                    lost.push(format!("`properties` at {path}"));
                    continue;
                };
                let props: Map<String, Value> = props
                    .iter()
                    .map(|(name, s)| (name.clone(), sanitize(s, &format!("{here}/{name}"), lost)))
                    .collect();
                out.insert("properties".into(), Value::Object(props));
            }
            "items" if value.is_object() => {
                out.insert("items".into(), sanitize(value, &here, lost));
            }
            "anyOf" | "oneOf" => {
                let Value::Array(options) = value else {
                    lost.push(format!("`{key}` at {path}"));
                    continue;
                };
                if key == "oneOf" {
                    // anyOf is the nearest Gemini has; exactly-one is not enforced.
                    lost.push(format!("`oneOf` at {path}"));
                }
                let options: Vec<Value> = options
                    .iter()
                    .enumerate()
                    .map(|(i, s)| sanitize(s, &format!("{here}/{i}"), lost))
                    .collect();
                out.insert("anyOf".into(), Value::Array(options));
            }
            "enum" => match value {
                Value::Array(values) if values.iter().all(Value::is_string) => {
                    out.insert("enum".into(), value.clone());
                }
                _ => lost.push(format!("a non-string `enum` at {path}")),
            },
            "const" => match value {
                Value::String(_) => {
                    out.insert("enum".into(), json!([value]));
                }
                _ => lost.push(format!("a non-string `const` at {path}")),
            },
            "format" => {
                if value.as_str().is_some_and(|f| FORMATS.contains(&f)) {
                    out.insert("format".into(), value.clone());
                }
            }
            "additionalProperties" if value == &Value::Bool(false) => {}
            "examples" => {
                if let Some(first) = value.as_array().and_then(|e| e.first()) {
                    out.entry("example").or_insert_with(|| first.clone());
                }
            }
            k if KEPT.contains(&k) => {
                out.insert(key.clone(), value.clone());
            }
            k if DROPPED.contains(&k) => {}
            _ => lost.push(format!("`{key}` at {path}")),
        }
    }
    Value::Object(out)
}

#[cfg(test)]
mod tests {
    use super::*;

    fn sanitized(schema: Value) -> (Value, Vec<String>) {
        let mut lost = Vec::new();
        let out = sanitize(&schema, "#", &mut lost);
        (out, lost)
    }

    #[test]
    fn types_are_upper_cased_and_a_null_union_becomes_nullable() {
        let (out, lost) = sanitized(json!({"type": "object", "properties": {
            "a": {"type": ["string", "null"]}, "b": {"type": "array", "items": {"type": "integer"}}}}));
        assert!(lost.is_empty(), "{lost:?}");
        assert_eq!(
            out,
            json!({"type": "OBJECT", "properties": {
                "a": {"type": "STRING", "nullable": true},
                "b": {"type": "ARRAY", "items": {"type": "INTEGER"}}}})
        );
    }

    #[test]
    fn const_becomes_an_enum_and_one_of_becomes_any_of_with_a_loss() {
        let (out, lost) = sanitized(json!({"oneOf": [{"const": "x"}, {"type": "string"}]}));
        assert_eq!(out, json!({"anyOf": [{"enum": ["x"]}, {"type": "STRING"}]}));
        assert_eq!(lost, ["`oneOf` at #"]);
    }

    #[test]
    fn what_the_subset_cannot_express_is_dropped_and_named_by_location() {
        let (out, lost) = sanitized(json!({"type": "object", "additionalProperties": false,
            "$schema": "x", "properties": {"n": {"type": "number", "multipleOf": 5}},
            "$defs": {"d": {}}}));
        assert_eq!(out, json!({"type": "OBJECT", "properties": {"n": {"type": "NUMBER"}}}));
        assert_eq!(lost, ["`$defs` at #", "`multipleOf` at #/properties/n"]);
    }

    #[test]
    fn only_documented_formats_are_kept() {
        let (out, lost) = sanitized(json!({"type": "string", "format": "email"}));
        assert_eq!(out, json!({"type": "STRING"}));
        assert!(lost.is_empty());
        let (out, _) = sanitized(json!({"type": "string", "format": "date-time"}));
        assert_eq!(out["format"], "date-time");
    }
}
