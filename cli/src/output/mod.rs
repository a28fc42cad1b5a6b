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
