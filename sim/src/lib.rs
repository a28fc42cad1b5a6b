//! Simulated LLM providers with scriptable faults, for `switchyard dev`, demos, chaos drills,
//! the end-to-end tests and the load benchmark's direct target.
//!
//! One listener speaks OpenAI's chat-completions, Anthropic's Messages and Gemini's
//! generateContent wire formats and, under `/_sim/`, a control API; the same controls are methods on the [`SimServer`]
//! returned by [`start`].
//!
//! Provider endpoints:
//! - `POST /v1/chat/completions` (and Azure OpenAI's
//!   `/openai/deployments/{name}/chat/completions`): answers per the request's `model` as
//!   scripted; `"stream": true` gets `chat.completion.chunk` SSE frames. A reply with
//!   `call_tools` answers a request offering `tools` with a tool call (see [`openai`]).
//! - `POST /v1/responses` (and Azure OpenAI's `/openai/v1/responses`): the same behaviours
//!   as a Responses `response` object or event stream ([`responses`]).
//! - `GET /v1/models`: every model scripted or seen, in OpenAI's list format.
//! - With accepted keys set, a request without `Authorization: Bearer <accepted key>` gets
//!   OpenAI's 401 (checked first, as OpenAI does; the request is still counted and kept).
//! - `POST /v1/messages`: the same scripted behaviours in Anthropic's Messages format
//!   (`message` bodies, `message_start` … `message_stop` SSE events with a `ping`, Anthropic's
//!   error bodies — a scripted 529 is `overloaded_error` — and `stream_error` as an
//!   `event: error` frame with `overloaded_error`); a request offering `tools` gets a
//!   `tool_use` answer (see [`anthropic`]). With accepted keys set, `x-api-key` must be one.
//! - `POST /v1beta/models/{model}:generateContent` and `:streamGenerateContent`: the same
//!   behaviours in Gemini's format, the model taken from the path (GenerateContentResponse
//!   bodies, one per SSE frame when streaming, no `[DONE]`; Google's error bodies); a request
//!   declaring functions gets a `functionCall` (see [`gemini`]). With accepted keys set,
//!   `x-goog-api-key` (or `?key=`) must be one: none is Google's 403, a wrong one its 400
//!   `API_KEY_INVALID`.
//! - `POST /v1/embeddings` (and Azure OpenAI's `/openai/deployments/{name}/embeddings`),
//!   `POST /v1beta/models/{model}:embedContent` and `:batchEmbedContents`: the same scripted
//!   behaviours (an `ok` answers a deterministic vector per model and input, of the request's
//!   dimensions, else the reply's `dimensions`, else 8; see [`embed`]).
//! - A request whose last message is the assistant's (Anthropic: `assistant`; Gemini: a
//!   `model` content) continues an answer (a prefill): when its text is a prefix of what the
//!   model would answer, only the rest is sent (streamed: the whole answer cut into its
//!   `chunks` pieces, then the rest of the piece the prefill ends in and the later pieces;
//!   usage counts the rest only); otherwise the whole answer. A reply with `rejects_prefill`
//!   answers such a request with the provider's 400 instead.
//! - Any other path is a 404, as the real APIs answer it, in the error shape of the API the
//!   request was meant for (told by its key header or path): OpenAI's `Invalid URL (POST
//!   /v1/v1/chat/completions)`, Anthropic's `not_found_error`, Google's `NOT_FOUND`. A
//!   provider `base_url` that doubles `/v1` fails instead of passing.
//!
//! Control API (JSON in and out; model names may contain `/`, raw or as `%2F`):
//! - `PUT /_sim/models/{model}` body [`Behaviour`]; `GET` reads it, `DELETE` unscripts it.
//! - `POST /_sim/script` body `{"model": "...", "behaviour": {...}}` or `{"<model>": {...}, ...}`.
//! - `PUT /_sim/keys` body `["k1", ...]` (`[]` accepts any request); `GET /_sim/keys`.
//! - `GET /_sim/stats` → [`Stats`]: `{"models": {"<model>": {"requests": N}},
//!   "connections": {"opened": N, "closed": N, "open": N}, "requests": N, "token_counts": N}`.
//! - `GET /_sim/last_request?model=<m>` → `{"model", "path", "headers": {...}, "body": <json>}`
//!   or 404 when that model has had no request.
//! - `POST /_sim/reset`: scripts, keys, request counters and last requests are forgotten;
//!   connection counters restart from the connections open now.
//!
//! Setting a model's behaviour restarts its sequence. Control calls answer 204 (or 400 with
//! `{"error": "..."}` naming the bad field).
#![forbid(unsafe_code)]

use std::path::Path;

pub mod anthropic;
pub mod behaviour;
mod body;
pub mod embed;
mod error;
pub mod gemini;
pub mod openai;
pub mod responses;
mod server;
mod stream;
pub mod tool;

pub use behaviour::{Behaviour, Reply, Script, SequenceReply, StatusReply, StreamErrorReply};
pub use error::SimError;
pub use server::state::{ConnectionStats, LastRequest, ModelStats, Stats};
pub use server::{SimServer, start};

/// Reads a `--script` file: a JSON object of model name → behaviour.
pub fn load_script(path: &Path) -> Result<Script, SimError> {
    let text = std::fs::read_to_string(path)
        .map_err(|source| SimError::ReadScript { path: path.to_owned(), source })?;
    serde_json::from_str(&text)
        .map_err(|source| SimError::InvalidScript { path: path.to_owned(), source })
}
