//! Wiring of one data-plane node: persisted config, config stream, HTTP listener.

use std::net::SocketAddr;
use std::path::PathBuf;
use std::sync::Arc;
use std::time::Duration;

use tokio::net::TcpListener;
use tracing::info;

use crate::breaker::Breakers;
use crate::executor::Executor;
use crate::http::App;
use crate::metrics::Metrics;
use crate::state::NodeState;
use crate::sync::{self, SyncOptions};
use crate::telemetry::Telemetry;
use crate::{http, persist, serve};

pub struct NodeOptions {
    pub controls: Vec<String>,
    pub listen: SocketAddr,
    pub data_dir: Option<PathBuf>,
    pub node_id: Option<String>,
    pub join_token: Option<String>,
    pub max_body_bytes: usize,
    /// A client that takes longer to send a request's head is disconnected; the clock also
    /// runs while a keep-alive connection waits for its next request.
    pub header_read_timeout: Duration,
}

#[derive(Debug, thiserror::Error)]
pub enum NodeError {
    #[error("cannot listen on {addr}: {source}")]
    Listen { addr: SocketAddr, source: std::io::Error },
    #[error("data dir {dir}: {source}")]
    DataDir { dir: PathBuf, source: std::io::Error },
    #[error("no control-plane URL given")]
    NoControl,
    #[error("HTTP server failed: {0}")]
    Serve(std::io::Error),
}

pub struct Node {
    pub local_addr: SocketAddr,
    pub node_id: String,
    listener: TcpListener,
    router: axum::Router,
    header_read_timeout: Duration,
}

impl Node {
    pub async fn run(self) -> Result<(), NodeError> {
        let shutdown = async {
            let _ = tokio::signal::ctrl_c().await;
        };
        serve::serve(self.listener, self.router, self.header_read_timeout, shutdown)
            .await
            .map_err(NodeError::Serve)
    }
}

pub async fn start(options: NodeOptions) -> Result<Node, NodeError> {
    if options.controls.is_empty() {
        return Err(NodeError::NoControl);
    }
    let data_dir_err = |dir: &PathBuf| {
        let dir = dir.clone();
        move |source| NodeError::DataDir { dir, source }
    };
    let mut initial = None;
    let mut node_id = options.node_id.clone();
    if let Some(dir) = &options.data_dir {
        tokio::fs::create_dir_all(dir).await.map_err(data_dir_err(dir))?;
        initial = persist::load(dir).await;
        if node_id.is_none() {
            node_id = Some(persistent_node_id(dir).await.map_err(data_dir_err(dir))?);
        }
    }
    let node_id = node_id.unwrap_or_else(random_node_id);
    if let Some(config) = &initial {
        info!(
            version = config.version,
            "serving last-known-good config until a control plane answers"
        );
    }
    let state = NodeState::new(initial);
    if let Some(dir) = options.data_dir.clone() {
        tokio::spawn(persist::run(dir, state.subscribe()));
    }

    let listener = TcpListener::bind(options.listen)
        .await
        .map_err(|source| NodeError::Listen { addr: options.listen, source })?;
    let local_addr = listener
        .local_addr()
        .map_err(|source| NodeError::Listen { addr: options.listen, source })?;
    let sync_options = SyncOptions {
        controls: options.controls,
        node_id: node_id.clone(),
        listen_address: local_addr.to_string(),
        join_token: options.join_token,
    };
    let metrics = Arc::new(Metrics::new());
    let telemetry = Arc::new(Telemetry::new(node_id.clone(), metrics.events_dropped.clone()));
    tokio::spawn(sync::run(sync_options, state.clone(), Arc::clone(&telemetry)));
    let app = Arc::new(App {
        state,
        executor: Executor { breakers: Breakers::new(), telemetry, metrics },
        max_body_bytes: options.max_body_bytes,
    });
    info!(addr = %local_addr, node = %node_id, "node listening");
    Ok(Node {
        local_addr,
        node_id,
        listener,
        router: http::router(app),
        header_read_timeout: options.header_read_timeout,
    })
}

fn random_node_id() -> String {
    format!("node-{:08x}", rand::random::<u32>())
}

/// A node keeps its id across restarts, so `switchyard nodes` shows one row per machine.
async fn persistent_node_id(dir: &std::path::Path) -> std::io::Result<String> {
    let file = dir.join("node_id");
    match tokio::fs::read_to_string(&file).await {
        Ok(id) if !id.trim().is_empty() => Ok(id.trim().to_owned()),
        Ok(_) | Err(_) => {
            let id = random_node_id();
            tokio::fs::write(&file, &id).await?;
            Ok(id)
        }
    }
}
