//! # switchyard-wire: the typed translation core
//!
//! Switchyard takes requests in more than one API format and serves each with a model of any
//! provider kind. Every translation goes through one internal form, both ways:
//!
//! ```text
//!  client format ──parse_request──▶ core::Request ──request_body──▶ provider format
//!  client format ◀──response_body── core::Response ◀──parse_response── provider format
//!  client stream ◀──Encoder──────── core::Event ◀──Decoder────────── provider stream
//! ```
//!
//! ## The formats
//! - [`chat`]: OpenAI Chat Completions (`/v1/chat/completions`), both as a client format and
//!   as a provider format: requests, `chat.completion`, `chat.completion.chunk`.
//! - [`messages`]: Anthropic Messages (`/v1/messages`), both ways too: requests, `message`,
//!   the event stream (`message_start` … `message_stop`), errors and Anthropic's status
//!   mapping.
//! - [`responses`]: OpenAI Responses (`/v1/responses`), a client format only: requests into
//!   the core (stateless: the whole conversation in `input`), Response objects and the
//!   Responses event stream (`response.created` … `response.completed`) out of it.
//! - [`gemini`]: Google Gemini (`generateContent`), a provider format only: request bodies
//!   from the core; answers, stream frames and errors into it.
//!
//! Each module keeps its wire structs private (serde types shaped as the API documents
//! them) and offers functions named after the direction: `parse_*` reads a body into the
//! core, `*_body` writes one from it, an `Encoder` writes a stream and a `Decoder` reads one.
//!
//! ## The internal form
//! [`core`] holds a [`core::Request`] (system instructions, user/assistant turns made of
//! [`core::Part`]s — text, images, tool calls, tool results, thinking —, tools, sampling,
//! reasoning), a [`core::Response`], and the [`core::Event`]s of a streamed answer, plus
//! [`core::estimate_tokens`]. Counts follow OpenAI: `Usage::input_tokens` includes cached
//! input (Anthropic's writer subtracts it again).
//!
//! What the core does not carry is handled one of two ways:
//! - a **hint** that does not change the answer's shape (Anthropic's `cache_control`,
//!   `context_management`; Chat's `seed`) is named in [`core::Request::hints`] and dropped
//!   by writers of other formats, which return the hints they dropped so the caller can say
//!   so (a response header);
//! - what would change the answer and has no place in another format is refused by the
//!   parser with a [`Refusal`] naming the field in the client's own terms
//!   (`messages[2].content[0].tool_use_id`), the way the format's own API would refuse it.
//!
//! ## Adding a format
//! 1. A module with the format's wire structs (private, serde) and the functions that apply:
//!    `parse_request` (validating as that API does, refusals naming fields in its terms),
//!    `request_body`, the answer both ways, and a stream `Encoder`/`Decoder`.
//! 2. Read bodies with `de::read` (a bad field's path is kept) and fields that are a string
//!    or a list with `de::OneOrList`; write with borrowed `Serialize` structs.
//! 3. Map only through the core: the new module never names another format's module.
//! 4. Snapshot tests in `tests/snapshots.rs` pairing it with each other format, both
//!    directions (plain, streaming, tools with a result round trip, images, errors).
//!
//! ## Snapshots
//! Reviewed JSON snapshots live in `tests/snapshots/`. A changed translation fails the test
//! with a diff (and writes nothing under `CI=true`); to accept it, run
//! `INSTA_UPDATE=always cargo nextest run -p switchyard-wire --test snapshots`, review
//! `git diff`, and commit the snapshots with the change.
//!
//! This crate depends on no other Switchyard crate: the data plane depends on it.

#![forbid(unsafe_code)]

pub mod chat;
pub mod core;
mod de;
pub mod gemini;
pub mod messages;
mod refusal;
pub mod responses;
mod sse;

pub use refusal::Refusal;
