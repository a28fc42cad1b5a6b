//! Wiring of one control-plane replica: store, config cache, admin API, node streams, and
//! the shutdown on SIGTERM or SIGINT:
//! 1. the replica leaves both elections (webhook delivery, audit retention) at once, so
//!    another replica takes that work over without waiting for this one's lease to expire;
//! 2. it ends every node stream and every `events --follow` stream with `Unavailable`, so
//!    nodes move to another replica and followers learn why their stream ended (and that
//!    they may follow again elsewhere), and takes no new connections;
//! 3. it waits for the calls in flight up to the drain timeout, then returns either way
//!    (a call that does not finish must not hold the process open, and with it the store).
//!
//! The replica's lease is left to expire rather than revoked: the presence and breaker
//! records of its nodes hang on it, and a node that has not yet reconnected elsewhere
//! keeps them until the lease runs out, as after a crash.

use std::future::Future;
use std::net::SocketAddr;
use std::pin::Pin;
use std::sync::Arc;
use std::task::Poll;
use std::time::Duration;

use futures_util::Stream;
use switchyard_shutdown::ShutdownSignals;
use tokio::net::TcpListener;
use tokio::sync::watch;
use tokio::task::JoinHandle;
use tokio_stream::wrappers::TcpListenerStream;
use tonic::{Request, Response, Status, Streaming};
use tracing::{info, warn};

use switchyard_proto::admin::v1::admin_server::AdminServer;
use switchyard_proto::node::encoded::EncodedControlMessage;
use switchyard_proto::node::encoded::node_control_server::{NodeControl, NodeControlServer};
use switchyard_proto::node::v1::{self as pb};

use switchyard_tls::accept::{self, Acceptor};

use crate::admin::AdminService;
use crate::audit::{self, AuditRetention};
use crate::auth::{AdminAuth, Token, TokenCheck};
use crate::fanout::{self, ConfigCache};
use crate::faults;
use crate::fleet::{self, Fleet};
use crate::layout::Layout;
use crate::limits::{self, FleetLedger};
use crate::metrics::ControlMetrics;
use crate::nodes::{NodeService, NodeShared, Presence};
use crate::store::{self, LeaseId, Store, StoreError, election};
use crate::ui;
use crate::webhooks::{self, DeliveryOptions, Interest};

/// The replica's lease: node presence records vanish this long after a replica dies.
const LEASE_TTL: Duration = Duration::from_secs(10);
/// How long a shutdown waits for calls in flight once node streams are closed
/// (`--drain-timeout`). Admin calls take milliseconds, and node and `events --follow`
/// streams are ended at once: this bounds a call stuck on a store that does not answer.
pub const DEFAULT_DRAIN_TIMEOUT: Duration = Duration::from_secs(10);
/// Bound on each store call of the shutdown: a store that is down must not hold it up.
const STORE_CALL_LIMIT: Duration = Duration::from_secs(2);

pub struct ControlOptions {
    pub store_url: String,
    /// TLS and credentials for an `etcd://` store (its key scope is set to `prefix`).
    pub etcd: store::etcd::EtcdOptions,
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
    /// How long a shutdown waits for calls in flight once node streams are closed.
    pub drain_timeout: Duration,
    /// TLS on the gRPC listener (`--tls-cert`, `--tls-key`, `--client-ca`); plaintext
    /// without.
    pub tls: Option<Acceptor>,
    /// Serves the web console at `/ui` (`--no-ui` turns it off).
    pub ui: bool,
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
    #[error("cannot listen for shutdown signals: {0}")]
    Signal(std::io::Error),
}

type ServeFuture = Pin<Box<dyn Future<Output = Result<(), tonic::transport::Error>> + Send>>;

/// A started replica: its bound address and what runs and stops it.
pub struct Control {
    pub local_addr: SocketAddr,
    serve: ServeFuture,
    /// `true`: node streams end and the server stops accepting.
    stopping: watch::Sender<bool>,
    store: Arc<dyn Store>,
    layout: Layout,
    lease: LeaseId,
    /// The tasks that campaign in the elections.
    campaigns: Vec<JoinHandle<()>>,
    drain_timeout: Duration,
    signals: ShutdownSignals,
}

impl Control {
    /// Serves until SIGTERM or SIGINT, then shuts down as the module says.
    pub async fn run(mut self) -> Result<(), ControlError> {
        let signals = std::mem::replace(&mut self.signals, ShutdownSignals::none());
        self.run_until(signals.recv()).await
    }

    /// Serves until `shutdown` completes, then shuts down as the module says.
    pub async fn run_until(self, shutdown: impl Future<Output = ()>) -> Result<(), ControlError> {
        let mut serve = self.serve;
        tokio::select! {
            result = &mut serve => return Ok(result?),
            () = shutdown => {}
        }
        for campaign in &self.campaigns {
            campaign.abort();
        }
        for campaign in self.campaigns {
            let _ = campaign.await;
        }
        let elections = [self.layout.webhook_election(), self.layout.audit_retention_election()];
        withdraw(self.store.as_ref(), &elections, self.lease).await;
        info!("left the elections; closing node and follow streams");
        let _ = self.stopping.send(true);
        match tokio::time::timeout(self.drain_timeout, serve).await {
            Ok(result) => result?,
            Err(_) => warn!("drain timeout: closing the calls still open"),
        }
        // A campaign write already on its way when the task stopped may land after the
        // first withdrawal.
        withdraw(self.store.as_ref(), &elections, self.lease).await;
        info!("control plane stopped");
        Ok(())
    }
}

async fn withdraw(store: &dyn Store, elections: &[String], lease: LeaseId) {
    for prefix in elections {
        match tokio::time::timeout(STORE_CALL_LIMIT, election::withdraw(store, prefix, lease)).await
        {
            Ok(Ok(())) => {}
            Ok(Err(e)) => warn!(election = %prefix, error = %e, "could not leave the election"),
            Err(_) => {
                warn!(election = %prefix, "could not leave the election: the store did not answer")
            }
        }
    }
}

/// Opens the store, binds the listener and returns before serving, so callers learn the
/// bound address (port 0 picks a free one).
pub async fn start(options: ControlOptions) -> Result<Control, ControlError> {
    let etcd =
        store::etcd::EtcdOptions { key_scope: options.prefix.clone(), ..options.etcd.clone() };
    let store = store::open(&options.store_url, etcd).await?;
    start_with_store(options, store).await
}

pub async fn start_with_store(
    options: ControlOptions,
    store: Arc<dyn Store>,
) -> Result<Control, ControlError> {
    if options.admin_token.is_empty() {
        return Err(ControlError::NoAdminToken);
    }
    let signals = ShutdownSignals::register().map_err(ControlError::Signal)?;
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
    tokio::spawn(faults::run_expiry(Arc::clone(&store), layout.clone()));

    if options.join_token.is_none() {
        warn!("no SWITCHYARD_JOIN_TOKEN set: accepting nodes from loopback addresses only");
    }
    let metrics = Arc::new(ControlMetrics::new());
    let outbox = Arc::new(Interest::new(Arc::clone(&cache)));
    let fleet_limits = Arc::new(FleetLedger::new());
    tokio::spawn(limits::run(
        Arc::clone(&fleet_limits),
        Arc::clone(&store),
        layout.clone(),
        local_addr.to_string(),
        lease,
    ));
    let presence = Presence::new();
    tokio::spawn(Arc::clone(&presence).run(Arc::clone(&store), layout.clone(), lease));
    let fleet = Fleet::new();
    tokio::spawn(fleet::run(
        Arc::clone(&fleet),
        Arc::clone(&store),
        layout.clone(),
        Arc::clone(&cache),
    ));
    let nodes = NodeService(Arc::new(NodeShared {
        cache: Arc::clone(&cache),
        store: Arc::clone(&store),
        layout: layout.clone(),
        lease,
        control_plane: local_addr.to_string(),
        join: TokenCheck { join_token: options.join_token.as_deref().map(Token::new) },
        outbox: Arc::clone(&outbox),
        events: audit::EventWriter::start(
            Arc::clone(&store),
            layout.clone(),
            outbox,
            Arc::clone(&metrics),
        ),
        disconnect_grace: options.disconnect_grace,
        metrics: Arc::clone(&metrics),
        limits: fleet_limits,
        presence,
        fleet: Arc::clone(&fleet),
    }));
    let webhooks = tokio::spawn(webhooks::run(
        Arc::clone(&store),
        layout.clone(),
        Arc::clone(&cache),
        lease,
        local_addr.to_string(),
        options.webhooks,
        metrics.webhooks.clone(),
    ));
    let retention = tokio::spawn(audit::run_retention(
        Arc::clone(&store),
        layout.clone(),
        lease,
        local_addr.to_string(),
        options.audit,
    ));
    let scrape = Scrape { metrics, cache: Arc::clone(&cache) };
    let (stopping, stop) = watch::channel(false);
    let admin = AdminService::new(Arc::clone(&store), layout.clone(), cache, stop.clone(), fleet);
    // The console reads through its own handle on the same store, cache and shutdown (and
    // the same secret-index backfill: one per replica).
    let console =
        options.ui.then(|| ui::router(admin.clone(), &options.admin_token, options.tls.is_some()));
    let admin = AdminServer::with_interceptor(admin, AdminAuth(Token::new(&options.admin_token)));

    let nodes = ClosingNodeStreams { inner: nodes, stop: stop.clone() };
    info!(addr = %local_addr, tls = options.tls.is_some(), "control plane listening");
    // `/metrics` shares the gRPC port, over HTTP/1.1 too, so a scraper needs no other port.
    let mut routes = tonic::service::Routes::new(admin)
        .add_service(NodeControlServer::new(nodes))
        .into_axum_router()
        .route("/metrics", axum::routing::get(scrape_metrics).with_state(scrape));
    // The console shares the port and TLS too: its pages are plain HTTP/1.1 routes.
    if let Some(console) = console {
        routes = routes.merge(console);
    }
    let server = tonic::transport::Server::builder()
        .trace_fn(admin_span)
        .http2_keepalive_interval(Some(Duration::from_secs(10)))
        .accept_http1(true)
        .add_routes(routes.into());
    let serve: ServeFuture = match options.tls {
        None => Box::pin(
            server.serve_with_incoming_shutdown(TcpListenerStream::new(listener), stopped(stop)),
        ),
        // Handshakes run beside the accept loop; the server sees finished TLS connections.
        Some(acceptor) => Box::pin(
            server
                .serve_with_incoming_shutdown(accept::incoming(listener, acceptor), stopped(stop)),
        ),
    };
    Ok(Control {
        local_addr,
        serve,
        stopping,
        store,
        layout,
        lease,
        campaigns: vec![webhooks, retention],
        drain_timeout: options.drain_timeout,
        signals,
    })
}

/// The admin gRPC service's path prefix: its calls are the control plane's SERVER spans.
const ADMIN_PATH: &str = "/switchyard.admin.v1.Admin/";

/// A SERVER span per admin call when OpenTelemetry is on (docs/operating.md, "Traces and
/// log records"), continuing the caller's `traceparent`. Node streams live for hours and
/// are not spans; nothing at all is made when OpenTelemetry is off.
fn admin_span(request: &http::Request<()>) -> tracing::Span {
    if !switchyard_otel::enabled() {
        return tracing::Span::none();
    }
    let Some(method) = request.uri().path().strip_prefix(ADMIN_PATH) else {
        return tracing::Span::none();
    };
    // While the collector is down no span is made, and each one not made is counted.
    if !switchyard_otel::span_wanted() {
        return tracing::Span::none();
    }
    let span = tracing::info_span!(
        target: switchyard_otel::SPAN_TARGET,
        "rpc",
        otel.kind = "server",
        otel.name = format!("switchyard.admin.v1.Admin/{method}"),
        rpc.system = "grpc",
        rpc.service = "switchyard.admin.v1.Admin",
        rpc.method = method,
    );
    switchyard_otel::continue_trace(&span, request.headers());
    span
}

#[derive(Clone)]
struct Scrape {
    metrics: Arc<ControlMetrics>,
    cache: Arc<ConfigCache>,
}

async fn scrape_metrics(
    axum::extract::State(scrape): axum::extract::State<Scrape>,
    headers: axum::http::HeaderMap,
) -> axum::response::Response {
    use axum::response::IntoResponse;
    scrape.metrics.config_revision.set(scrape.cache.revision());
    scrape.metrics.config_change_revision.set(scrape.cache.latest_change());
    let accept = headers.get(axum::http::header::ACCEPT).and_then(|v| v.to_str().ok());
    let (content_type, body) = scrape.metrics.render(accept);
    ([(axum::http::header::CONTENT_TYPE, content_type)], body).into_response()
}

/// Resolves once the replica is stopping (or its [`Control`] is gone).
async fn stopped(mut stop: watch::Receiver<bool>) {
    let _ = stop.wait_for(|s| *s).await;
}

/// [`NodeService`] whose streams end with `Unavailable` when the replica stops, so that
/// each node reconnects to another replica at once.
struct ClosingNodeStreams {
    inner: NodeService,
    stop: watch::Receiver<bool>,
}

type ControlStream = Pin<Box<dyn Stream<Item = Result<EncodedControlMessage, Status>> + Send>>;

#[tonic::async_trait]
impl NodeControl for ClosingNodeStreams {
    type ConnectStream = ControlStream;

    async fn connect(
        &self,
        request: Request<Streaming<pb::NodeMessage>>,
    ) -> Result<Response<Self::ConnectStream>, Status> {
        if *self.stop.borrow() {
            return Err(shutting_down());
        }
        let mut inner = self.inner.connect(request).await?.into_inner();
        let mut stopped = Box::pin(stopped(self.stop.clone()));
        let mut ended = false;
        let stream = futures_util::stream::poll_fn(move |cx| {
            if ended {
                return Poll::Ready(None);
            }
            if stopped.as_mut().poll(cx).is_ready() {
                ended = true;
                return Poll::Ready(Some(Err(shutting_down())));
            }
            let next = inner.as_mut().poll_next(cx);
            ended = matches!(next, Poll::Ready(None));
            next
        });
        Ok(Response::new(Box::pin(stream)))
    }
}

fn shutting_down() -> Status {
    Status::unavailable("this control plane is shutting down; connect to another one")
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
