//! Wiring of one control-plane replica: store, config cache, admin API, node streams.

use std::net::SocketAddr;
use std::sync::Arc;
use std::time::Duration;

use tokio::net::TcpListener;
use tokio_stream::wrappers::TcpListenerStream;
use tracing::{info, warn};

use switchyard_proto::admin::v1::admin_server::AdminServer;
use switchyard_proto::node::v1::node_control_server::NodeControlServer;

use crate::admin::AdminService;
use crate::audit::{self, AuditRetention};
use crate::auth::{AdminAuth, Token, TokenCheck};
use crate::fanout::{self, ConfigCache};
use crate::layout::Layout;
use crate::nodes::{NodeService, NodeShared};
use crate::store::{self, Store, StoreError};
use crate::webhooks::{self, DeliveryOptions, Interest};

/// The replica's lease: node presence records vanish this long after a replica dies.
const LEASE_TTL: Duration = Duration::from_secs(10);

pub struct ControlOptions {
    pub store_url: String,
    pub listen: SocketAddr,
    pub prefix: String,
    pub admin_token: String,
    /// `None`: nodes are accepted from loopback only.
    pub join_token: Option<String>,
    /// Bounds on the failover-event audit log, kept by the elected replica.
    pub audit: AuditRetention,
    /// Webhook delivery, done by the elected replica.
    pub webhooks: DeliveryOptions,
    /// How long a node may be gone before `node.disconnected` (and its breakers go).
    pub disconnect_grace: Duration,
}

#[derive(Debug, thiserror::Error)]
pub enum ControlError {
    #[error(transparent)]
    Store(#[from] StoreError),
    #[error("cannot listen on {addr}: {source}")]
    Listen { addr: SocketAddr, source: std::io::Error },
    #[error("the admin token must not be empty")]
    NoAdminToken,
    #[error("gRPC server failed: {0}")]
    Serve(#[from] tonic::transport::Error),
}

/// A started replica: its bound address and the future that runs it.
pub struct Control {
    pub local_addr: SocketAddr,
    serve: std::pin::Pin<Box<dyn std::future::Future<Output = Result<(), ControlError>> + Send>>,
}

impl Control {
    pub async fn run(self) -> Result<(), ControlError> {
        self.serve.await
    }
}

/// Opens the store, binds the listener and returns before serving, so callers learn the
/// bound address (port 0 picks a free one).
pub async fn start(options: ControlOptions) -> Result<Control, ControlError> {
    let store = store::open(&options.store_url).await?;
    start_with_store(options, store).await
}

pub async fn start_with_store(
    options: ControlOptions,
    store: Arc<dyn Store>,
) -> Result<Control, ControlError> {
    if options.admin_token.is_empty() {
        return Err(ControlError::NoAdminToken);
    }
    let listener = TcpListener::bind(options.listen)
        .await
        .map_err(|source| ControlError::Listen { addr: options.listen, source })?;
    let local_addr = listener
        .local_addr()
        .map_err(|source| ControlError::Listen { addr: options.listen, source })?;
    let layout = Layout::new(&options.prefix);
    let lease = store.grant_lease(LEASE_TTL).await?;
    tokio::spawn(keep_lease(Arc::clone(&store), lease));

    let cache = ConfigCache::new();
    tokio::spawn(fanout::run(Arc::clone(&cache), Arc::clone(&store), layout.clone()));

    if options.join_token.is_none() {
        warn!("no SWITCHYARD_JOIN_TOKEN set: accepting nodes from loopback addresses only");
    }
    let outbox = Arc::new(Interest::new(Arc::clone(&cache)));
    let nodes = NodeService(Arc::new(NodeShared {
        cache: Arc::clone(&cache),
        store: Arc::clone(&store),
        layout: layout.clone(),
        lease,
        control_plane: local_addr.to_string(),
        join: TokenCheck { join_token: options.join_token.as_deref().map(Token::new) },
        outbox: Arc::clone(&outbox),
        events: audit::EventWriter::start(Arc::clone(&store), layout.clone(), outbox),
        disconnect_grace: options.disconnect_grace,
    }));
    tokio::spawn(webhooks::run(
        Arc::clone(&store),
        layout.clone(),
        Arc::clone(&cache),
        lease,
        local_addr.to_string(),
        options.webhooks,
    ));
    tokio::spawn(audit::run_retention(
        Arc::clone(&store),
        layout.clone(),
        lease,
        local_addr.to_string(),
        options.audit,
    ));
    let admin = AdminService { store, layout, cache };
    let admin = AdminServer::with_interceptor(admin, AdminAuth(Token::new(&options.admin_token)));

    info!(addr = %local_addr, "control plane listening");
    let serve = tonic::transport::Server::builder()
        .http2_keepalive_interval(Some(Duration::from_secs(10)))
        .add_service(admin)
        .add_service(NodeControlServer::new(nodes))
        .serve_with_incoming_shutdown(TcpListenerStream::new(listener), shutdown_signal());
    Ok(Control { local_addr, serve: Box::pin(async move { Ok(serve.await?) }) })
}

/// Renews the replica's lease; if the store lost it (a long outage), takes a new one is not
/// possible without rewriting records, so the process exits and its supervisor restarts it.
async fn keep_lease(store: Arc<dyn Store>, lease: store::LeaseId) {
    let mut tick = tokio::time::interval(LEASE_TTL / 3);
    loop {
        tick.tick().await;
        match store.keep_alive(lease).await {
            Ok(_) => {}
            Err(StoreError::LeaseNotFound(_)) => {
                tracing::error!(
                    "the store expired this replica's lease; exiting so that a restart re-registers"
                );
                std::process::exit(3);
            }
            Err(e) => warn!(error = %e, "lease keep-alive failed; retrying"),
        }
    }
}

async fn shutdown_signal() {
    let _ = tokio::signal::ctrl_c().await;
    info!("shutting down");
}
