//! Simulated LLM providers (to be written).
#![forbid(unsafe_code)]

use std::net::SocketAddr;

#[derive(Debug, thiserror::Error)]
pub enum SimError {
    #[error("cannot listen on {addr}: {source}")]
    Listen { addr: SocketAddr, source: std::io::Error },
}

/// A running simulator.
pub struct SimServer {
    pub local_addr: SocketAddr,
}

pub async fn start(addr: SocketAddr) -> Result<SimServer, SimError> {
    let listener = tokio::net::TcpListener::bind(addr)
        .await
        .map_err(|source| SimError::Listen { addr, source })?;
    let local_addr = listener.local_addr().map_err(|source| SimError::Listen { addr, source })?;
    Ok(SimServer { local_addr })
}
