//! Wiring of one data-plane node: persisted config, config stream, HTTP listener, and
//! the shutdown on SIGTERM or SIGINT: `/readyz` turns 503, requests and streams in flight
//! finish (up to the drain timeout), failover events and usage go to the control plane
//! (or, with none connected, at once to the spool), and [`Node::run`] returns. The prober
//! (`probe`) runs beside the server until the drain; the custody task ([`crate::custody`])
//! until the events are handed over.

use std::future::Future;
use std::net::SocketAddr;
use std::path::PathBuf;
use std::sync::Arc;
use std::time::Duration;

use switchyard_shutdown::ShutdownSignals;
use tokio::net::TcpListener;
use tokio::sync::watch;
use tokio::task::JoinHandle;
use tracing::{info, warn};

use switchyard_tls::accept::Acceptor;
use switchyard_tls::connect::ClientTls;

use crate::breaker::Breakers;
use crate::http::App;
use crate::loss::{self, SpoolState};
use crate::metrics::Metrics;
use crate::serve::ServeOptions;
use crate::services::Services;
use crate::spool::Spool;
use crate::state::NodeState;
use crate::sync::{self, SyncGauges, SyncOptions};
use crate::telemetry::Telemetry;
use crate::{custody, http, persist, probe, serve};

/// The hand-off of failover events after a drain gets what is left of the drain timeout,
/// and at least this: a drain that used all of it still gives a reachable control plane
/// time to store what the node holds.
const MIN_HANDOFF: Duration = Duration::from_secs(2);

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
    /// A client that takes longer to send a request's body, counted from its head, gets 408.
    pub body_read_timeout: Duration,
    /// How long a shutdown waits for requests and streams in flight.
    pub drain_timeout: Duration,
    /// Bound of the failover-event spool in `data_dir` (no spool without a data dir).
    pub event_spool_max_bytes: u64,
    /// Failover events held in memory at most.
    pub event_buffer_events: usize,
    /// TLS for `https://` control-plane URLs (`--control-ca`; `--tls-cert`/`--tls-key` as
    /// the client certificate for mutual TLS).
    pub control_tls: Option<ClientTls>,
    /// TLS on the HTTP listener (`--tls-cert`, `--tls-key`): HTTPS, HTTP/1.1 and HTTP/2.
    pub listen_tls: Option<Acceptor>,
}

#[derive(Debug, thiserror::Error)]
pub enum NodeError {
    #[error("cannot listen on {addr}: {source}")]
    Listen { addr: SocketAddr, source: std::io::Error },
    #[error("data dir {dir}: {source}")]
    DataDir { dir: PathBuf, source: std::io::Error },
    #[error(transparent)]
    DataDirLock(#[from] crate::dir_lock::LockError),
    #[error("no control-plane URL given")]
    NoControl,
    #[error("HTTP server failed: {0}")]
    Serve(std::io::Error),
    #[error("cannot listen for shutdown signals: {0}")]
    Signal(std::io::Error),
}

pub struct Node {
    pub local_addr: SocketAddr,
    pub node_id: String,
    data_dir: Option<PathBuf>,
    /// Held until the node is dropped: no second node starts on the same data dir.
    _dir_lock: Option<crate::dir_lock::DirLock>,
    listener: TcpListener,
    tls: Option<Acceptor>,
    router: axum::Router,
    serve: ServeOptions,
    state: Arc<NodeState>,
    telemetry: Arc<Telemetry>,
    handoff: watch::Sender<bool>,
    sync: JoinHandle<()>,
    /// Stops by itself once the node drains; aborted after the drain in any case.
    prober: JoinHandle<()>,
    /// The custody task (with a data dir) and what stops it.
    custody: Option<(watch::Sender<bool>, JoinHandle<()>)>,
    signals: ShutdownSignals,
}

impl Node {
    /// Serves until SIGTERM or SIGINT, then drains and returns.
    pub async fn run(mut self) -> Result<(), NodeError> {
        let signals = std::mem::replace(&mut self.signals, ShutdownSignals::none());
        self.run_until(signals.recv()).await
    }

    /// Serves until `shutdown` completes, then drains: `/readyz` turns 503, requests and
    /// streams in flight finish (up to the drain timeout), and what the node holds for the
    /// control plane is handed over.
    pub async fn run_until(mut self, shutdown: impl Future<Output = ()>) -> Result<(), NodeError> {
        let state = Arc::clone(&self.state);
        let shutdown = async move {
            shutdown.await;
            state.start_draining();
        };
        let drained =
            serve::serve_listener(self.listener, self.tls, self.router, self.serve, shutdown)
                .await
                .map_err(NodeError::Serve)?;
        self.prober.abort();
        let budget = self.serve.drain_timeout.saturating_sub(drained.started.elapsed());
        let _ = self.handoff.send(true);
        // With no control plane connected there is nobody to wait for: the events go to the
        // spool now rather than after the rest of the drain timeout (which a supervisor's
        // stop may not give). One that connects meanwhile gets them from the next start.
        let handed = if self.telemetry.connected() {
            tokio::time::timeout(budget.max(MIN_HANDOFF), &mut self.sync).await.is_ok()
        } else {
            false
        };
        self.telemetry.abort_between_refills(&self.sync).await;
        if !handed {
            // Gone for good before what it held is spooled (a completed task is not awaited
            // twice).
            let _ = (&mut self.sync).await;
        }
        if let Some((stop, task)) = self.custody.take() {
            let _ = stop.send(true);
            let _ = task.await;
        }
        if handed {
            info!(cut_off = drained.cut_off, "node stopped");
        } else {
            match self.telemetry.spool_held().await {
                Ok(events) if self.telemetry.has_spool() => warn!(
                    events,
                    "no control plane took the hand-off: the failover events held are \
                     spooled for the next start; the usage since the last report is lost"
                ),
                Ok(_) => warn!(
                    events = self.telemetry.drop_held(),
                    "no control plane took the hand-off: the failover events held (no \
                     spool to keep them in) are lost and counted, and the usage since the \
                     last report is lost"
                ),
                Err(e) => warn!(
                    error = %e,
                    "no control plane took the hand-off and the failover events held could \
                     not be spooled: they are lost, and counted"
                ),
            }
            if let Err(e) = self.telemetry.sync_spool().await {
                warn!(error = %e, "could not sync the event spool to disk");
            }
        }
        // Counts of lost events no control plane acked: kept for the next start.
        let unacked = self.telemetry.losses.unacked();
        match &self.data_dir {
            Some(dir) => {
                let (dir, reports) = (dir.clone(), unacked.clone());
                // Nothing is in memory only any more: a clean stop clears the count of events
                // at risk (after the losses are saved, so that a kill between counts nothing
                // twice and nothing silently).
                let saved = tokio::task::spawn_blocking(move || {
                    loss::save(&dir, &reports)?;
                    loss::clear_at_risk(&dir)
                })
                .await
                .map_err(|e| std::io::Error::other(e.to_string()))
                .and_then(|r| r);
                match saved {
                    Ok(()) if !unacked.is_empty() => warn!(
                        reports = unacked.len(),
                        "counts of lost events not yet recorded by a control plane are kept \
                         for the next start"
                    ),
                    Ok(()) => {}
                    Err(e) => warn!(
                        error = %e,
                        lost = unacked.iter().map(|r| r.count).sum::<u64>(),
                        "could not keep the counts of lost events for the next start"
                    ),
                }
            }
            None if !unacked.is_empty() => warn!(
                lost = unacked.iter().map(|r| r.count).sum::<u64>(),
                "no control plane recorded these lost events, and without --data-dir their \
                 count is only in this log"
            ),
            None => {}
        }
        Ok(())
    }
}

pub async fn start(options: NodeOptions) -> Result<Node, NodeError> {
    if options.controls.is_empty() {
        return Err(NodeError::NoControl);
    }
    let signals = ShutdownSignals::register().map_err(NodeError::Signal)?;
    let data_dir_err = |dir: &PathBuf| {
        let dir = dir.clone();
        move |source| NodeError::DataDir { dir, source }
    };
    let mut initial = None;
    let mut persisted = None;
    let mut node_id = options.node_id.clone();
    let mut dir_lock = None;
    if let Some(dir) = &options.data_dir {
        tokio::fs::create_dir_all(dir).await.map_err(data_dir_err(dir))?;
        // Before anything in it is read: a node already running there owns it all.
        dir_lock = Some(crate::dir_lock::DirLock::acquire(dir)?);
        if let Some(loaded) = persist::load(dir).await {
            let (config, files) = loaded.into_parts();
            initial = Some(config);
            persisted = Some(files);
        }
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
        tokio::spawn(persist::run(dir, Arc::clone(&state), persisted));
    }

    let listener = TcpListener::bind(options.listen)
        .await
        .map_err(|source| NodeError::Listen { addr: options.listen, source })?;
    let local_addr = listener
        .local_addr()
        .map_err(|source| NodeError::Listen { addr: options.listen, source })?;
    let (handoff, handoff_rx) = watch::channel(false);
    // The config stream hears the fleet's breaker view; the prober lays it over the breakers.
    let (fleet, fleet_view) = watch::channel(None);
    let breakers = Breakers::new();
    let mut metrics = Metrics::new();
    let sync_options = SyncOptions {
        controls: options.controls,
        node_id: node_id.clone(),
        listen_address: local_addr.to_string(),
        join_token: options.join_token,
        tls: options.control_tls,
        handoff: handoff_rx,
        gauges: SyncGauges {
            connected: metrics.config_stream_connected.clone(),
            rejected: metrics.config_rejected_version.clone(),
        },
        fleet,
        breakers: breakers.clone(),
    };
    let mut telemetry = Telemetry::new(node_id.clone(), metrics.events_dropped.clone())
        .with_max_events(options.event_buffer_events);
    if let Some(dir) = options.data_dir.clone() {
        let losses = Arc::clone(&telemetry.losses);
        match tokio::task::spawn_blocking(move || restore_losses(&dir, &losses)).await {
            Ok(Ok(())) => {}
            Ok(Err(e)) => warn!(error = %e, "cannot read the kept counts of lost events"),
            Err(e) => warn!(error = %e, "cannot read the kept counts of lost events"),
        }
    }
    if let Some(dir) = &options.data_dir {
        let spool_dir = dir.join("event-spool");
        let (max, lost, bytes) = (
            options.event_spool_max_bytes,
            Arc::clone(&telemetry.losses),
            metrics.event_spool_bytes.clone(),
        );
        let opened = tokio::task::spawn_blocking(move || Spool::open(&spool_dir, max, lost, bytes))
            .await
            .map_err(|e| std::io::Error::other(e.to_string()))
            .and_then(|opened| opened);
        match opened {
            Ok(opened) => {
                if opened.records > 0 {
                    info!(
                        events = opened.records,
                        "failover events spooled by an earlier run will be sent"
                    );
                }
                telemetry = telemetry.with_spool(opened.spool, opened.records);
            }
            // Serving matters more than auditing (docs/operating.md, "No event lost
            // silently"): the node serves, holds what fits in memory, and counts the rest.
            Err(e) => {
                telemetry.losses.set_spool(SpoolState::Unwritable);
                warn!(
                    dir = %dir.join("event-spool").display(),
                    error = %e,
                    "cannot open the event spool: serving without it; failover events beyond \
                     --event-buffer-events are counted as lost while no control plane takes them"
                );
            }
        }
    }
    let telemetry = Arc::new(telemetry);
    metrics.watch_budgets(Arc::clone(&telemetry.limits));
    let metrics = Arc::new(metrics);
    let sync = tokio::spawn(sync::run(sync_options, state.clone(), Arc::clone(&telemetry)));
    let custody = options.data_dir.clone().map(|dir| {
        let (stop, stopped) = watch::channel(false);
        (stop, tokio::spawn(custody::run(Arc::clone(&telemetry), dir, stopped)))
    });
    let services = Services::new(Arc::clone(&telemetry), metrics, breakers);
    let app = Arc::new(App::new(Arc::clone(&state), services, options.max_body_bytes));
    let prober = tokio::spawn(probe::run(Arc::clone(&app), fleet_view));
    info!(addr = %local_addr, node = %node_id, tls = options.listen_tls.is_some(), "node listening");
    Ok(Node {
        local_addr,
        node_id,
        data_dir: options.data_dir.clone(),
        _dir_lock: dir_lock,
        listener,
        tls: options.listen_tls,
        router: http::router(app),
        serve: ServeOptions {
            header_read_timeout: options.header_read_timeout,
            body_read_timeout: options.body_read_timeout,
            drain_timeout: options.drain_timeout,
        },
        state,
        telemetry,
        handoff,
        sync,
        prober,
        custody,
        signals,
    })
}

/// Takes in hand the counts of lost events an earlier run kept, and turns the events it
/// left at risk (held in memory only when it ended without stopping) into a counted loss;
/// both are saved again at once, so that another kill before a control plane acks them
/// keeps them. Blocks on the disk.
fn restore_losses(dir: &std::path::Path, losses: &loss::Losses) -> std::io::Result<()> {
    let reports = loss::load(dir)?;
    if !reports.is_empty() {
        info!(reports = reports.len(), "counts of lost events an earlier run kept will be sent");
        losses.restore(reports);
    }
    let killed = loss::take_at_risk(dir)?;
    if killed != loss::AtRiskCount::default() {
        warn!(
            unsent = killed.unsent,
            unacked = killed.unacked,
            "the last run ended without stopping (killed?) while it held failover events in \
             memory only: they are lost, counted, and reported as events.lost (node_killed; \
             node_killed_unacked for those a control plane had and had not acked: it may \
             have stored some)"
        );
        losses.lose(loss::Lost::Failover, loss::Reason::NodeKilled, killed.unsent);
        losses.lose(loss::Lost::Failover, loss::Reason::NodeKilledUnacked, killed.unacked);
        loss::save(dir, &losses.unacked())?;
    }
    // Saved as a loss first: a kill between the two counts the events twice rather than
    // not at all.
    loss::clear_at_risk(dir)
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
