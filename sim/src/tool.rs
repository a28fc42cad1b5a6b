//! The tool call a simulated model makes, in any format: which tool, and an input that
//! fills each required property of its schema.

use serde_json::{Value, json};

#[derive(Debug, Clone, PartialEq)]
pub struct ToolCall {
    pub name: String,
    pub input: Value,
}

/// Each required property of a JSON Schema object, set to a value of its type.
pub(crate) fn placeholder_input(schema: Option<&Value>) -> Value {
    let mut input = serde_json::Map::new();
    let Some(schema) = schema else { return Value::Object(input) };
    let required = schema.get("required").and_then(Value::as_array).cloned().unwrap_or_default();
    for name in required.iter().filter_map(Value::as_str) {
        let kind = schema.pointer(&format!("/properties/{name}/type")).and_then(Value::as_str);
        let value = match kind {
            Some("integer" | "number") => json!(1),
            Some("boolean") => json!(true),
            Some("array") => json!([]),
            Some("object") => json!({}),
            _ => json!("sim"),
        };
        input.insert(name.to_owned(), value);
    }
    Value::Object(input)
}
