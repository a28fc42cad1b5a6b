//! How admin results look: aligned tables and key/value blocks for people, JSON for scripts,
//! one module per command.
//!
//! Renderers are pure (`-> String`) so tests can pin the format without a control plane.

use serde::Serialize;

pub mod apply;
pub mod breakers;
pub mod chaos;
pub mod drill;
pub mod events;
pub mod keys;
pub mod nodes;
mod text;
pub mod usage;
pub mod webhooks;

/// Pretty JSON with a final newline, for `--json`.
pub fn json<T: Serialize>(value: &T) -> Result<String, serde_json::Error> {
    serde_json::to_string_pretty(value).map(|mut s| {
        s.push('\n');
        s
    })
}

/// A JSON array printed an element at a time (a listing that arrives in pages), byte for
/// byte what [`json`] prints for the whole array at `indent` spaces: `[`, each element
/// pretty-printed one level deeper, `]` (or `[]` for none).
pub struct JsonArray {
    indent: usize,
    count: usize,
}

impl JsonArray {
    pub fn new(indent: usize) -> Self {
        Self { indent, count: 0 }
    }

    /// The text that adds `value` to the array.
    pub fn item<T: Serialize>(&mut self, value: &T) -> Result<String, serde_json::Error> {
        let body = serde_json::to_string_pretty(value)?;
        let pad = " ".repeat(self.indent + 2);
        let mut out = String::with_capacity(body.len() + 64);
        out.push_str(if self.count == 0 { "[\n" } else { ",\n" });
        // Strings in JSON hold no raw newline, so lines are the document's own.
        for (i, line) in body.lines().enumerate() {
            if i > 0 {
                out.push('\n');
            }
            out.push_str(&pad);
            out.push_str(line);
        }
        self.count += 1;
        Ok(out)
    }

    /// The text that closes the array (without a final newline).
    pub fn end(&self) -> String {
        if self.count == 0 { "[]".to_owned() } else { format!("\n{}]", " ".repeat(self.indent)) }
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[derive(Serialize)]
    struct Item {
        id: u32,
        tags: Vec<String>,
        nested: Option<Box<Item>>,
        text: String,
    }

    fn item(id: u32) -> Item {
        Item {
            id,
            tags: vec!["a".into(), "b".into()],
            nested: Some(Box::new(Item { id: 0, tags: vec![], nested: None, text: "x\ny".into() })),
            text: "line\nbreak \"quoted\"".into(),
        }
    }

    #[test]
    fn a_json_array_printed_by_elements_is_the_whole_array_printed_at_once() {
        for n in [0, 1, 3] {
            let items: Vec<Item> = (0..n).map(item).collect();
            let mut array = JsonArray::new(0);
            let mut text = String::new();
            for i in &items {
                text.push_str(&array.item(i).unwrap());
            }
            text.push_str(&array.end());
            text.push('\n');
            assert_eq!(text, json(&items).unwrap(), "{n} items");
        }
    }
}
