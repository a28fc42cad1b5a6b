//! The long-running subcommands: `control`, `node` and `dev`.

use std::net::SocketAddr;
use std::path::PathBuf;

use clap::Args;

#[derive(Debug, thiserror::Error)]
pub enum ServeError {
    #[error("{0}")]
    Config(String),
}

#[derive(Debug, Args)]
pub struct ControlArgs {
    /// Where keys, catalog and node presence live: etcd://host:2379[,host:2379] or file://DIR.
    #[arg(long, env = "SWITCHYARD_STORE")]
    pub store: String,
    /// Address of the gRPC listener (admin API and node streams).
    #[arg(long, default_value = "127.0.0.1:7400", env = "SWITCHYARD_LISTEN")]
    pub listen: SocketAddr,
    /// Key prefix in the store.
    #[arg(long, default_value = "/switchyard/")]
    pub prefix: String,
    /// File holding the admin token (instead of SWITCHYARD_ADMIN_TOKEN).
    #[arg(long)]
    pub admin_token_file: Option<PathBuf>,
    /// File holding the node join token (instead of SWITCHYARD_JOIN_TOKEN).
    #[arg(long)]
    pub join_token_file: Option<PathBuf>,
}

#[derive(Debug, Args)]
pub struct NodeArgs {
    /// Control-plane URL(s), comma-separated; the node fails over between them.
    #[arg(long, env = "SWITCHYARD_CONTROL", default_value = "http://127.0.0.1:7400")]
    pub control: String,
    /// Address of the HTTP listener.
    #[arg(long, default_value = "127.0.0.1:8080")]
    pub listen: SocketAddr,
    /// Keeps the node's identity and last-known-good config.
    #[arg(long)]
    pub data_dir: Option<PathBuf>,
    /// Stable node id (default: generated once and kept in --data-dir).
    #[arg(long)]
    pub node_id: Option<String>,
    /// File holding the join token (instead of SWITCHYARD_JOIN_TOKEN).
    #[arg(long)]
    pub join_token_file: Option<PathBuf>,
}

#[derive(Debug, Args)]
pub struct DevArgs {
    /// Directory for the embedded store and the node's data (default: a temporary one).
    #[arg(long)]
    pub data_dir: Option<PathBuf>,
    #[arg(long, default_value = "127.0.0.1:7400")]
    pub control_listen: SocketAddr,
    #[arg(long, default_value = "127.0.0.1:8080")]
    pub listen: SocketAddr,
}

pub async fn control(_args: ControlArgs) -> Result<(), ServeError> {
    Err(ServeError::Config("not yet built".into()))
}

pub async fn node(_args: NodeArgs) -> Result<(), ServeError> {
    Err(ServeError::Config("not yet built".into()))
}

pub async fn dev(_args: DevArgs) -> Result<(), ServeError> {
    Err(ServeError::Config("not yet built".into()))
}
