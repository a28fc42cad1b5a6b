//! # switchyard-wire: the typed translation core
//!
//! Switchyard takes requests in more than one API format and serves each with a model of any
//! provider kind. Every translation goes through one internal form, both ways:
//!
//! ```text
//!  inbound format ──parse──▶ core::Request ──write──▶ provider format
//!  inbound format ◀─write── core::Response / core::Event ◀──parse── provider format
//! ```
//!
//! ## The formats
//! - [`chat`]: OpenAI Chat Completions (`/v1/chat/completions`): requests, `chat.completion`,
//!   `chat.completion.chunk`.
//! - [`messages`]: Anthropic Messages (`/v1/messages`): requests, `message`, the event
//!   stream (`message_start` … `message_stop`), errors.
//!
//! ## The internal form
//! [`core`] holds a [`core::Request`] (system instructions, user/assistant turns made of
//! parts — text, images, tool calls, tool results, thinking —, tools, sampling, reasoning),
//! a [`core::Response`], and the [`core::Event`]s of a streamed answer. What only one format
//! has and what does not change an answer's shape is named in `Request::hints` and dropped
//! by writers of other formats; what would change the answer is refused by the parser.
//!
//! A parser validates as the format's own API does and refuses with a [`Refusal`] naming the
//! field in that format's terms (`messages[2].content[0].tool_use_id`).
//!
//! ## Adding a format
//! Add a module with the format's wire structs (serde, private), and the functions that
//! apply: `parse_request` (wire → core, with refusals naming fields in the format's terms),
//! `request_body` (core → wire), the answer both ways and a stream encoder/decoder. Use
//! [`de`]'s helpers for fields that are a string or a list and for reading a body with the
//! path of a bad field. Add snapshot tests in `tests/` pairing it with each other format.
//!
//! This crate depends on no other Switchyard crate: the data plane depends on it.

#![forbid(unsafe_code)]

pub mod chat;
pub mod core;
mod de;
pub mod messages;
mod refusal;

pub use refusal::Refusal;
