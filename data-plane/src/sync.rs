//! The node's side of the config stream: one task owns the gRPC stream to a control plane,
//! re-opens it (rotating over the configured control planes) with capped, jittered backoff,
//! and publishes each applied config. Requests never wait on it.

use std::sync::Arc;
use std::time::Duration;

use prometheus_client::metrics::gauge::Gauge;
use tokio::sync::{mpsc, watch};
use tokio_stream::wrappers::ReceiverStream;
use tonic::transport::Endpoint;
use tracing::{debug, info, warn};

use switchyard_backoff::Backoff;
use switchyard_proto::node::v1::{
    self as pb, control_message, node_control_client::NodeControlClient, node_message,
};
use switchyard_tls::connect::{ClientTls, is_https};
use switchyard_tls::files::TlsError;
use switchyard_tls::words;

use crate::breaker::{Breakers, FleetOpen, FleetView};
use crate::config::{Change, ConfigError, NodeConfig, SnapshotBuilder};
use crate::state::{Changed, NodeState};
use crate::telemetry::Telemetry;

const HEARTBEAT: Duration = Duration::from_secs(2);
/// No message (the control plane pings every 2 s) for this long: the stream is dead.
const IDLE_LIMIT: Duration = Duration::from_secs(10);
/// How often queued events and breaker transitions are sent. Events reach the audit log
/// and webhooks within a few hundred milliseconds, while in an outage storm (every
/// request a failover) a node sends a few full batches per second rather than many
/// small ones: every message and write round costs the control plane a wake-up, a
/// decode and an fsync whatever its size, and on a shared host that CPU comes out of
/// request latency (docs/BENCHMARKS.md, "Figures behind design choices").
const FLUSH_INTERVAL: Duration = Duration::from_millis(100);
/// Usage totals go to the control plane at most this often.
const USAGE_INTERVAL: Duration = Duration::from_secs(5);
const CONNECT_TIMEOUT: Duration = Duration::from_secs(2);
/// Reconnect waits: full jitter under a ceiling that doubles from 100 ms and is capped at
/// 2 s, so a node is back within seconds of a control plane returning.
const RECONNECT: Backoff = Backoff::new(Duration::from_millis(100), Duration::from_secs(2));

/// Chunks of a snapshot queued for the task applying them (each ~500 resources).
const SNAPSHOT_QUEUE: usize = 4;

/// A snapshot being received. Its chunks go to a blocking task that applies each one (see
/// [`NodeConfig::begin_snapshot`]) while the next is read off the network, so a node never
/// holds a snapshot's bytes whole and parsing overlaps receiving.
enum Receiving {
    Building {
        version: i64,
        chunks: mpsc::Sender<Vec<(String, Vec<u8>)>>,
        /// Ends once `chunks` is dropped, or at the first chunk refused.
        applied: tokio::task::JoinHandle<Result<SnapshotBuilder, ConfigError>>,
    },
    /// Not newer than the config in force: its chunks are dropped.
    Stale { version: i64 },
}

impl Receiving {
    fn version(&self) -> i64 {
        match self {
            Self::Building { version, .. } | Self::Stale { version } => *version,
        }
    }
}

pub struct SyncOptions {
    pub controls: Vec<String>,
    pub node_id: String,
    pub listen_address: String,
    pub join_token: Option<String>,
    /// TLS for `https://` control-plane URLs (`--control-ca`, and `--tls-cert`/`--tls-key`
    /// as the client certificate for mutual TLS).
    pub tls: Option<ClientTls>,
    /// Turns `true` when the node shuts down: the task hands over what it holds (see
    /// [`hand_off`]) and returns.
    pub handoff: watch::Receiver<bool>,
    pub gauges: SyncGauges,
    /// The control plane's fleet breaker view, as this task last heard it; `None` while no
    /// stream is open (a node cut off goes by its own breakers) or the fleet view is off.
    pub fleet: watch::Sender<Option<FleetView>>,
    /// The node's breakers, whose window reports go up with each flush while the fleet
    /// view is on.
    pub breakers: Breakers,
}

/// What the config stream shows at `/metrics` for the alerts (deploy/prometheus): set here,
/// where the stream opens and closes and configs are acked, because only this task knows.
#[derive(Clone, Debug, Default)]
pub struct SyncGauges {
    /// 1 while a config stream to a control plane is open.
    pub connected: Gauge,
    /// The version of the last config this node refused, until it applies a newer one; 0
    /// when none.
    pub rejected: Gauge,
}

impl SyncGauges {
    /// Keeps `rejected` true to a reply about to go to the control plane.
    fn note(&self, state: &NodeState, reply: &pb::NodeMessage) {
        if let Some(node_message::Msg::Nack(nack)) = &reply.msg {
            self.rejected.set(nack.version);
        } else if state.version() > self.rejected.get() {
            self.rejected.set(0);
        }
    }
}

#[derive(Debug, thiserror::Error)]
enum SessionError {
    #[error("invalid control-plane URL: {0}")]
    Url(String),
    #[error("cannot connect: {}", words::chain(.0))]
    Connect(#[from] tonic::transport::Error),
    #[error("{0}")]
    Tls(#[from] TlsError),
    #[error("stream failed: {}", words::chain(.0))]
    Status(#[from] tonic::Status),
    #[error("control plane went quiet")]
    Idle,
    #[error("control plane closed the stream")]
    Closed,
}

pub async fn run(options: SyncOptions, state: Arc<NodeState>, telemetry: Arc<Telemetry>) {
    // One per node process (this task runs once per process), sent in every Hello: the
    // control plane tells a restart, whose breakers start closed, from a reconnect.
    let boot_id = format!("{:016x}", rand::random::<u64>());
    let mut failures: u32 = 0;
    for endpoint in options.controls.iter().cycle() {
        let started = tokio::time::Instant::now();
        let result = session(endpoint, &options, &boot_id, &state, &telemetry).await;
        // Nobody relays the fleet's word any more: this node's own breakers decide.
        options.fleet.send_replace(None);
        telemetry.set_connected(false);
        options.gauges.connected.set(0);
        // Whatever was sent but not acked goes out again on the next stream.
        telemetry.requeue_in_flight();
        telemetry.mark_usage_dirty();
        match result {
            // Only a completed hand-off ends a session without an error.
            Ok(()) => return,
            // A refusal the TLS layer saw under the call says more than the call's error.
            Err(e) => match options.tls.as_ref().and_then(ClientTls::take_refusal) {
                Some(tls) => {
                    warn!(control = %endpoint, error = %e, tls = %tls, "config stream ended")
                }
                None => warn!(control = %endpoint, error = %e, "config stream ended"),
            },
        }
        // A stream that lived a while was healthy: start the backoff over.
        if started.elapsed() > Duration::from_secs(10) {
            failures = 0;
        }
        tokio::time::sleep(RECONNECT.delay(failures)).await;
        failures = failures.saturating_add(1);
    }
}

async fn session(
    url: &str,
    options: &SyncOptions,
    boot_id: &str,
    state: &NodeState,
    telemetry: &Telemetry,
) -> Result<(), SessionError> {
    let endpoint = Endpoint::from_shared(url.to_owned())
        .map_err(|e| SessionError::Url(e.to_string()))?
        .connect_timeout(CONNECT_TIMEOUT)
        .tcp_nodelay(true);
    let channel = match (is_https(url), &options.tls) {
        (false, _) => endpoint.connect().await?,
        (true, Some(tls)) => endpoint.connect_with_connector(tls.connector(url)?).await?,
        (true, None) => {
            return Err(SessionError::Url(format!("{url}: https:// without TLS settings")));
        }
    };
    let mut client = NodeControlClient::new(channel);
    let (tx, rx) = mpsc::channel::<pb::NodeMessage>(16);
    let hello = pb::Hello {
        node_id: options.node_id.clone(),
        last_applied_version: state.version(),
        listen_address: options.listen_address.clone(),
        software_version: env!("CARGO_PKG_VERSION").to_owned(),
        boot_id: boot_id.to_owned(),
    };
    let _ = tx.send(node_msg(node_message::Msg::Hello(hello))).await;
    let mut request = tonic::Request::new(ReceiverStream::new(rx));
    if let Some(token) = &options.join_token {
        let value = format!("Bearer {token}")
            .parse()
            .map_err(|_| SessionError::Url("join token is not a valid header value".into()))?;
        request.metadata_mut().insert("authorization", value);
    }
    let mut inbound = client.connect(request).await?.into_inner();
    telemetry.set_connected(true);
    options.gauges.connected.set(1);
    info!(control = %url, version = state.version(), "config stream open");

    let mut heartbeat = tokio::time::interval(HEARTBEAT);
    let mut usage_tick = tokio::time::interval(USAGE_INTERVAL);
    let mut limits_tick = tokio::time::interval(crate::limits::REPORT_INTERVAL);
    limits_tick.set_missed_tick_behavior(tokio::time::MissedTickBehavior::Delay);
    // Events and breaker transitions go out in batches on a short tick (the first tick is
    // immediate: anything queued while no stream was open goes out now).
    let mut flush = tokio::time::interval(FLUSH_INTERVAL);
    flush.set_missed_tick_behavior(tokio::time::MissedTickBehavior::Delay);
    let mut receiving: Option<Receiving> = None;
    let mut handoff = options.handoff.clone();
    loop {
        tokio::select! {
            // An error means the node is gone without asking: hand over all the same.
            () = handoff_requested(&mut handoff) => return hand_off(tx, inbound, telemetry).await,
            message = tokio::time::timeout(IDLE_LIMIT, inbound.message()) => {
                let message = message.map_err(|_| SessionError::Idle)??.ok_or(SessionError::Closed)?;
                let update = match message.msg {
                    Some(control_message::Msg::Snapshot(chunk)) => {
                        // Chunks of one snapshot share its version; another version starts anew.
                        let current = receiving.take().filter(|r| r.version() == chunk.version);
                        let next = current.unwrap_or_else(|| begin(state, chunk.version));
                        add_chunk(&next, chunk.resources.into_iter().map(|r| (r.name, r.value)).collect()).await;
                        if !chunk.last {
                            receiving = Some(next);
                            continue;
                        }
                        let reply = finish(state, next).await;
                        options.gauges.note(state, &reply);
                        if tx.send(reply).await.is_err() {
                            return Err(SessionError::Closed);
                        }
                        continue;
                    }
                    Some(control_message::Msg::Update(update)) => update,
                    Some(control_message::Msg::EventsAck(ack)) => {
                        telemetry.ack_events(ack.seq);
                        continue;
                    }
                    Some(control_message::Msg::BreakersAck(ack)) => {
                        telemetry.ack_breakers(ack.seq);
                        continue;
                    }
                    Some(control_message::Msg::LostAck(ack)) => {
                        telemetry.losses.ack(&ack.id);
                        continue;
                    }
                    Some(control_message::Msg::Limits(view)) => {
                        telemetry.limits.apply(view, switchyard_time::now_ms(), std::time::Instant::now());
                        forget_unlimited(state, telemetry);
                        continue;
                    }
                    Some(control_message::Msg::FleetBreakers(view)) => {
                        options.fleet.send_replace(fleet_view(view, &options.node_id));
                        continue;
                    }
                    Some(control_message::Msg::Ping(_)) | None => continue,
                };
                let reply = apply(state, update).await;
                options.gauges.note(state, &reply);
                if tx.send(reply).await.is_err() {
                    return Err(SessionError::Closed);
                }
            }
            _ = flush.tick() => {
                telemetry.refill_from_spool().await;
                let mut messages = outbound(telemetry, false);
                // Taken even with the fleet view off, so that turning it on does not send
                // what was counted before.
                let windows = options.breakers.window_reports();
                if options.fleet.borrow().is_some() && !windows.is_empty() {
                    messages.push(node_msg(node_message::Msg::Windows(window_report(windows))));
                }
                for message in messages {
                    if tx.send(message).await.is_err() {
                        return Err(SessionError::Closed);
                    }
                }
            }
            _ = limits_tick.tick() => {
                // Only while some key counted here has limits: a fleet without limits sends
                // nothing.
                let limited = state.current().is_some_and(|c| c.limited_keys > 0);
                forget_unlimited(state, telemetry);
                if let Some(report) = telemetry.limit_report(switchyard_time::now_ms(), limited)
                    && tx.send(node_msg(node_message::Msg::Limits(report))).await.is_err()
                {
                    return Err(SessionError::Closed);
                }
            }
            _ = usage_tick.tick() => {
                for message in outbound(telemetry, true) {
                    if tx.send(message).await.is_err() {
                        return Err(SessionError::Closed);
                    }
                }
            }
            _ = heartbeat.tick() => {
                let hb = pb::Heartbeat { applied_version: state.version() };
                if tx.send(node_msg(node_message::Msg::Heartbeat(hb))).await.is_err() {
                    return Err(SessionError::Closed);
                }
            }
        }
    }
}

/// Drops the counts of keys that no longer have limits (cleared, revoked, deleted), so a
/// node stops reporting them and, once no key has limits, stops reporting at all.
fn forget_unlimited(state: &NodeState, telemetry: &Telemetry) {
    let Some(config) = state.current() else { return };
    telemetry.limits.retain(|id| config.keys.get(id).is_some_and(|k| k.limited()));
}

/// Resolves once the node asks for the hand-off, or is gone without asking.
async fn handoff_requested(handoff: &mut watch::Receiver<bool>) {
    let _ = handoff.wait_for(|h| *h).await;
}

/// The node is shutting down: sends everything it holds (breaker transitions, failover
/// events, counts of lost events, usage totals), waits until the control plane has acked
/// every event, breaker report and loss report, then ends its side of the stream. The control plane handles a stream's messages in order and
/// closes its side after the last, so once it has, the usage totals are stored too.
async fn hand_off(
    tx: mpsc::Sender<pb::NodeMessage>,
    mut inbound: tonic::Streaming<pb::ControlMessage>,
    telemetry: &Telemetry,
) -> Result<(), SessionError> {
    for message in outbound(telemetry, true) {
        tx.send(message).await.map_err(|_| SessionError::Closed)?;
    }
    while telemetry.events_held() > 0
        || telemetry.breakers_held() > 0
        || telemetry.losses.unreported()
    {
        let message = tokio::time::timeout(IDLE_LIMIT, inbound.message())
            .await
            .map_err(|_| SessionError::Idle)??
            .ok_or(SessionError::Closed)?;
        match message.msg {
            Some(control_message::Msg::EventsAck(ack)) => telemetry.ack_events(ack.seq),
            Some(control_message::Msg::BreakersAck(ack)) => telemetry.ack_breakers(ack.seq),
            Some(control_message::Msg::LostAck(ack)) => telemetry.losses.ack(&ack.id),
            _ => {}
        }
        // A loss counted during the hand-off (the spool refusing a late event) is sent too.
        for report in telemetry.losses.reports_to_send() {
            tx.send(node_msg(node_message::Msg::Lost(report)))
                .await
                .map_err(|_| SessionError::Closed)?;
        }
    }
    drop(tx);
    while tokio::time::timeout(IDLE_LIMIT, inbound.message())
        .await
        .map_err(|_| SessionError::Idle)??
        .is_some()
    {}
    info!("failover events and usage handed to the control plane");
    Ok(())
}

/// Applies an update all or nothing and says so to the control plane. Versions only grow:
/// a replica that lags behind the one the node last heard from cannot roll it back.
/// (Snapshots arrive in chunks: [`begin`], [`add_chunk`], [`finish`].)
async fn apply(state: &NodeState, update: pb::Update) -> pb::NodeMessage {
    let current = state.current();
    let have = current.as_ref().map_or(0, |c| c.version);
    let version = update.version;
    if current.is_some() && version <= have {
        debug!(version, have, "ignoring config that is not newer");
        return node_msg(node_message::Msg::Ack(pb::Ack { version: have }));
    }
    let changed = Changed::Resources(
        update
            .upserts
            .iter()
            .map(|r| r.name.clone())
            .chain(update.deletes.iter().cloned())
            .collect(),
    );
    let change = Change::Update {
        version,
        upserts: update.upserts.into_iter().map(|r| (r.name, r.value)).collect(),
        deletes: update.deletes,
    };
    // Applying parses every changed resource and may read credential files: off the
    // async threads.
    let applied = tokio::task::spawn_blocking(move || match current.as_deref() {
        Some(c) => c.apply(change),
        None => NodeConfig::default().apply(change),
    })
    .await;
    let applied = match applied {
        Ok(result) => result,
        Err(e) => {
            warn!(version, error = %e, "config apply task failed");
            return node_msg(node_message::Msg::Nack(pb::Nack { version, error: e.to_string() }));
        }
    };
    match applied {
        Ok(next) => {
            state.publish(next, changed);
            debug!(version, "config applied");
            node_msg(node_message::Msg::Ack(pb::Ack { version }))
        }
        Err(e) => {
            warn!(version, error = %e, "rejected config; keeping version {have}");
            node_msg(node_message::Msg::Nack(pb::Nack { version, error: e.to_string() }))
        }
    }
}

/// The start of a snapshot at `version`: built on the config in force (whose provider pools
/// and unchanged keys it keeps), or dropped if not newer than it.
fn begin(state: &NodeState, version: i64) -> Receiving {
    let current = state.current();
    if let Some(current) = current.as_ref().filter(|c| version <= c.version) {
        debug!(version, have = current.version, "ignoring a snapshot that is not newer");
        return Receiving::Stale { version };
    }
    let mut snapshot = match current {
        Some(current) => current.begin_snapshot(version),
        None => NodeConfig::default().begin_snapshot(version),
    };
    let (chunks, mut queue) = mpsc::channel::<Vec<(String, Vec<u8>)>>(SNAPSHOT_QUEUE);
    // Parsing a chunk of keys takes milliseconds: on a blocking thread, not the runtime's.
    let applied = tokio::task::spawn_blocking(move || {
        while let Some(chunk) = queue.blocking_recv() {
            snapshot.add(chunk)?;
        }
        Ok(snapshot)
    });
    Receiving::Building { version, chunks, applied }
}

async fn add_chunk(receiving: &Receiving, resources: Vec<(String, Vec<u8>)>) {
    if let Receiving::Building { chunks, .. } = receiving {
        // Closed only once a chunk was refused: the rest are dropped, the error kept.
        let _ = chunks.send(resources).await;
    }
}

/// The snapshot's last chunk is in: publishes it, or says why not.
async fn finish(state: &NodeState, receiving: Receiving) -> pb::NodeMessage {
    let have = state.version();
    let (version, chunks, applied) = match receiving {
        Receiving::Stale { .. } => {
            return node_msg(node_message::Msg::Ack(pb::Ack { version: have }));
        }
        Receiving::Building { version, chunks, applied } => (version, chunks, applied),
    };
    drop(chunks);
    let error = match applied.await {
        // Installing the catalog may read credential files.
        Ok(Ok(snapshot)) => match tokio::task::spawn_blocking(move || snapshot.finish()).await {
            // Versions only grow, whatever arrived while the chunks did.
            Ok(_) if version <= state.version() => {
                debug!(version, have = state.version(), "a snapshot no longer newer; dropped");
                return node_msg(node_message::Msg::Ack(pb::Ack { version: state.version() }));
            }
            Ok(next) => {
                state.publish(next, Changed::All);
                debug!(version, "snapshot applied");
                return node_msg(node_message::Msg::Ack(pb::Ack { version }));
            }
            Err(e) => format!("config apply task failed: {e}"),
        },
        Ok(Err(e)) => e.to_string(),
        Err(e) => format!("config apply task failed: {e}"),
    };
    warn!(version, error = %error, "rejected config; keeping version {have}");
    node_msg(node_message::Msg::Nack(pb::Nack { version, error }))
}

/// Queued breaker transitions and probe reports, event batches, counts of lost events, and
/// with `usage` the usage totals.
fn outbound(telemetry: &Telemetry, usage: bool) -> Vec<pb::NodeMessage> {
    let mut out: Vec<pb::NodeMessage> =
        telemetry.take_breaker_reports().into_iter().map(node_msg).collect();
    while let Some(batch) = telemetry.next_event_batch() {
        out.push(node_msg(node_message::Msg::Events(batch)));
    }
    out.extend(
        telemetry
            .losses
            .reports_to_send()
            .into_iter()
            .map(|r| node_msg(node_message::Msg::Lost(r))),
    );
    if usage && let Some(report) = telemetry.usage_report(switchyard_time::now_ms()) {
        out.push(node_msg(node_message::Msg::Usage(report)));
    }
    out
}

fn window_report(windows: Vec<(String, String, u32, u32)>) -> pb::BreakerWindows {
    let windows = windows
        .into_iter()
        .map(|(provider, upstream_model, calls, failures)| pb::BreakerWindow {
            provider,
            upstream_model,
            calls,
            failures,
        })
        .collect();
    pb::BreakerWindows { windows }
}

/// The proto's fleet view as the breakers take it (`None` when the fleet view is off).
/// Times come as Unix milliseconds of the control plane's clock: `until` becomes an instant
/// of this node's, as far ahead as it was then.
fn fleet_view(view: pb::FleetBreakers, node_id: &str) -> Option<FleetView> {
    if !view.enabled {
        return None;
    }
    let (now_ms, now) = (switchyard_time::now_ms(), std::time::Instant::now());
    let open = view
        .open
        .into_iter()
        .map(|b| {
            let ahead = u64::try_from(b.until_unix_ms.saturating_sub(now_ms)).unwrap_or(0);
            let open = FleetOpen {
                since: switchyard_time::system_time(b.since_unix_ms),
                probing: b.prober == node_id,
                opened_by: b.opened_by,
                prober: b.prober,
                until: now + Duration::from_millis(ahead),
            };
            ((b.provider, b.upstream_model), open)
        })
        .collect();
    let closed = view
        .closed
        .into_iter()
        .map(|c| (c.provider, c.upstream_model, switchyard_time::system_time(c.at_unix_ms)))
        .collect();
    Some(FleetView { open, closed })
}

fn node_msg(msg: node_message::Msg) -> pb::NodeMessage {
    pb::NodeMessage { msg: Some(msg) }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn the_fleet_view_names_this_node_prober_and_keeps_the_time_left_on_this_nodes_clock() {
        let now_ms = switchyard_time::now_ms();
        let view = pb::FleetBreakers {
            enabled: true,
            open: vec![
                pb::FleetBreaker {
                    provider: "azure-east".into(),
                    upstream_model: "gpt-4o".into(),
                    since_unix_ms: now_ms - 1_000,
                    opened_by: "n2".into(),
                    prober: "n1".into(),
                    until_unix_ms: now_ms + 10_000,
                    open_on: vec!["n2".into()],
                },
                pb::FleetBreaker {
                    provider: "azure-west".into(),
                    upstream_model: "gpt-4o".into(),
                    prober: "n2".into(),
                    // Already past on the control plane's clock: over at once here.
                    until_unix_ms: now_ms - 5_000,
                    ..Default::default()
                },
            ],
            closed: vec![pb::FleetClosing {
                provider: "openai".into(),
                upstream_model: "gpt-4o".into(),
                at_unix_ms: now_ms - 2_000,
                closed_by: "n3".into(),
            }],
        };
        let before = std::time::Instant::now();
        let fleet = fleet_view(view.clone(), "n1").expect("on");
        let east = &fleet.open[&("azure-east".to_owned(), "gpt-4o".to_owned())];
        assert!(east.probing && east.prober == "n1" && east.opened_by == "n2");
        assert_eq!(switchyard_time::unix_ms(east.since), now_ms - 1_000);
        let left = east.until - before;
        assert!(left > Duration::from_millis(9_000) && left < Duration::from_millis(11_000));
        let west = &fleet.open[&("azure-west".to_owned(), "gpt-4o".to_owned())];
        assert!(!west.probing && west.until <= std::time::Instant::now());
        let (provider, _, at) = &fleet.closed[0];
        assert_eq!((provider.as_str(), switchyard_time::unix_ms(*at)), ("openai", now_ms - 2_000));
        // Another node reads the same view as not its own to probe; off is no view at all.
        assert!(!fleet_view(view.clone(), "n3").unwrap().open.values().any(|o| o.probing));
        assert!(fleet_view(pb::FleetBreakers { enabled: false, ..view }, "n1").is_none());
    }
}
