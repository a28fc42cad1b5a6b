//! The simulator's start-up errors: binding the listener and reading a script file.

use std::net::SocketAddr;
use std::path::PathBuf;

#[derive(Debug, thiserror::Error)]
pub enum SimError {
    #[error("cannot listen on {addr}: {source}")]
    Listen { addr: SocketAddr, source: std::io::Error },
    #[error("cannot read script {path}: {source}")]
    ReadScript { path: PathBuf, source: std::io::Error },
    #[error("invalid script {path}: {source}")]
    InvalidScript { path: PathBuf, source: serde_json::Error },
}
