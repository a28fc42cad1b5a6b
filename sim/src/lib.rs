//! Simulated LLM providers with scriptable faults, for `switchyard dev`, demos, chaos drills,
//! the end-to-end tests and the load benchmark's direct target.
//!
//! One listener speaks OpenAI's chat-completions wire format (`POST /v1/chat/completions`,
//! `POST /chat/completions`, `GET /v1/models`) and, under `/_sim/`, a control API to script
//! each model's [`Behaviour`] and read [`Stats`]. The same is available in-process through
//! the [`SimServer`] returned by [`start`].
#![forbid(unsafe_code)]

use std::net::SocketAddr;
use std::path::{Path, PathBuf};

pub mod behaviour;
mod body;
pub mod openai;
mod server;

pub use behaviour::{Behaviour, Reply, Script, SequenceReply, StatusReply, StreamErrorReply};
pub use server::{ConnectionStats, LastRequest, ModelStats, SimServer, Stats, start};

#[derive(Debug, thiserror::Error)]
pub enum SimError {
    #[error("cannot listen on {addr}: {source}")]
    Listen { addr: SocketAddr, source: std::io::Error },
    #[error("cannot read script {path}: {source}")]
    ReadScript { path: PathBuf, source: std::io::Error },
    #[error("invalid script {path}: {source}")]
    InvalidScript { path: PathBuf, source: serde_json::Error },
}

/// Reads a `--script` file: a JSON object of model name → behaviour.
pub fn load_script(path: &Path) -> Result<Script, SimError> {
    let text = std::fs::read_to_string(path)
        .map_err(|source| SimError::ReadScript { path: path.to_owned(), source })?;
    serde_json::from_str(&text)
        .map_err(|source| SimError::InvalidScript { path: path.to_owned(), source })
}
