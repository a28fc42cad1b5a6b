//! Node streams: `NodeControl.Connect`, and node presence in the store.
//!
//! Each connected node gets a starting point from the [`ConfigCache`] and then every
//! update, plus a ping when nothing else was sent for a while. A stream ends when the node
//! goes quiet for longer than [`IDLE_LIMIT`] or reaches its maximum lifetime (so that nodes
//! spread over replicas again after one comes back).
//!
//! Presence: while a node is connected this replica keeps `nodes/<id>` in the store,
//! attached to the replica's lease, so that any replica can list the whole fleet and a
//! crashed replica's nodes vanish when its lease expires.
//!
//! Reports: failover events and a node's counts of lost events (`events.lost`) go to the
//! audit log, breaker reports to their records ([`crate::reports`]); each is acked only once
//! written (the node holds them until then and resends them on its next stream). A report
//! that cannot be written ends the stream with `Unavailable` rather than going unacked on a
//! live stream: acks are cumulative, so a later report's ack would cover the lost one, and
//! a reconnecting node resends all it holds. Usage totals are cumulative and not acked.

use std::pin::Pin;
use std::sync::Arc;
use std::time::Duration;

use futures_util::Stream;
use serde::{Deserialize, Serialize};
use tokio::sync::{broadcast, mpsc};
use tonic::{Request, Response, Status, Streaming};
use tracing::{debug, info, warn};

use switchyard_proto::node::v1::{
    self as pb, control_message, node_control_server::NodeControl, node_message,
};

use switchyard_time::now_ms;

use crate::audit;
use crate::auth::TokenCheck;
use crate::events::{AuditEvent, BreakerRecord, Interest};
use crate::fanout::{ConfigCache, ConfigUpdate, Start};
use crate::layout::Layout;
use crate::limits::FleetLedger;
use crate::metrics::ControlMetrics;
use crate::reports::{self, UsageRecord};
use crate::store::{Compare, LeaseId, Revision, Store, Txn, TxnOp};

pub const PING_INTERVAL: Duration = Duration::from_secs(2);
/// A node that sends nothing (it heartbeats every 2 s) for this long is considered gone.
pub const IDLE_LIMIT: Duration = Duration::from_secs(10);
/// Streams end after this long (±20 %), so nodes rebalance across replicas.
pub const MAX_LIFETIME: Duration = Duration::from_secs(15 * 60);
/// Presence records are rewritten at most this often unless the applied version changed.
const PRESENCE_REFRESH: Duration = Duration::from_secs(5);
/// Resources per snapshot chunk, keeping each message far below gRPC's 4 MiB default.
const SNAPSHOT_CHUNK: usize = 500;

/// What `switchyard nodes` shows, as stored under `nodes/<id>`.
#[derive(Clone, Debug, Serialize, Deserialize)]
pub struct NodeRecord {
    pub node_id: String,
    pub listen_address: String,
    pub applied_version: Revision,
    pub last_heartbeat_unix_ms: i64,
    pub connected_unix_ms: i64,
    pub control_plane: String,
    #[serde(default)]
    pub software_version: String,
    /// The last version the node NACKed, until it applies a newer one: the node then kept
    /// its previous config, and `switchyard nodes` says so.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub rejected: Option<Rejected>,
}

#[derive(Clone, Debug, Serialize, Deserialize)]
pub struct Rejected {
    pub version: Revision,
    pub error: String,
}

pub struct NodeShared {
    pub cache: Arc<ConfigCache>,
    pub store: Arc<dyn Store>,
    pub layout: Layout,
    pub lease: LeaseId,
    /// This replica's address, shown in `switchyard nodes`.
    pub control_plane: String,
    pub join: TokenCheck,
    /// Which events webhooks subscribe to (events nobody wants are not queued).
    pub outbox: Arc<Interest>,
    /// Failover events of every stream go through one group-committing writer.
    pub events: audit::EventWriter,
    /// How long a node may be gone before its breakers are forgotten and
    /// `node.disconnected` is sent.
    pub disconnect_grace: Duration,
    pub metrics: Arc<ControlMetrics>,
    /// The fleet's limit windows; a node's report is answered with what the others used.
    pub limits: Arc<FleetLedger>,
}

/// The `NodeControl` gRPC service; each stream runs as a task over the shared state.
pub struct NodeService(pub Arc<NodeShared>);

type ControlStream = Pin<Box<dyn Stream<Item = Result<pb::ControlMessage, Status>> + Send>>;

#[tonic::async_trait]
impl NodeControl for NodeService {
    type ConnectStream = ControlStream;

    async fn connect(
        &self,
        request: Request<Streaming<pb::NodeMessage>>,
    ) -> Result<Response<Self::ConnectStream>, Status> {
        self.0.join.check_node(&request)?;
        let mut inbound = request.into_inner();
        let hello = match tokio::time::timeout(IDLE_LIMIT, inbound.message()).await {
            Ok(Ok(Some(pb::NodeMessage { msg: Some(node_message::Msg::Hello(hello)) }))) => hello,
            Ok(Ok(_)) => return Err(Status::invalid_argument("the first message must be Hello")),
            Ok(Err(status)) => return Err(status),
            Err(_) => return Err(Status::deadline_exceeded("no Hello within the idle limit")),
        };
        if hello.node_id.is_empty() {
            return Err(Status::invalid_argument("Hello.node_id must not be empty"));
        }
        self.0.cache.wait_ready().await;
        let (tx, rx) = mpsc::channel(64);
        let service = Arc::clone(&self.0);
        tokio::spawn(async move { service.serve_node(hello, inbound, tx).await });
        let stream = tokio_stream::wrappers::ReceiverStream::new(rx);
        Ok(Response::new(Box::pin(stream)))
    }
}

impl NodeShared {
    async fn serve_node(
        self: Arc<Self>,
        hello: pb::Hello,
        mut inbound: Streaming<pb::NodeMessage>,
        tx: mpsc::Sender<Result<pb::ControlMessage, Status>>,
    ) {
        let node_id = hello.node_id.clone();
        info!(node = %node_id, version = hello.last_applied_version, "node connected");
        let _connected = self.metrics.node_connected();
        let connected = now_ms();
        let mut record = NodeRecord {
            node_id: node_id.clone(),
            listen_address: hello.listen_address.clone(),
            applied_version: hello.last_applied_version,
            last_heartbeat_unix_ms: connected,
            connected_unix_ms: connected,
            control_plane: self.control_plane.clone(),
            software_version: hello.software_version.clone(),
            rejected: None,
        };
        let mut presence_rev = self.write_presence(&record).await;
        let mut last_presence = tokio::time::Instant::now();
        // After the presence write, so that the previous replica's grace timer sees the
        // node back and leaves the records alone.
        if let Err(e) =
            reports::adopt_breakers(self.store.as_ref(), &self.layout, &node_id, self.lease).await
        {
            warn!(node = %node_id, error = %e, "could not adopt the node's breaker records");
        }

        let (start, updates) = self.cache.subscribe(hello.last_applied_version);
        let mut sent_version = hello.last_applied_version;
        if !send_start(&tx, start, &mut sent_version).await {
            return self.forget(&node_id, presence_rev).await;
        }
        // Configuration goes out from a task of its own: a store write the node's reports
        // wait for (a storm's events, an etcd election) must not hold back a key revoked
        // meanwhile.
        let config = tokio::spawn(Arc::clone(&self).send_config(
            node_id.clone(),
            updates,
            sent_version,
            tx.clone(),
        ));
        let _stop_config = AbortOnDrop(config.abort_handle());
        tokio::pin!(config);

        let lifetime = MAX_LIFETIME.mul_f64(0.8 + 0.4 * rand::random::<f64>());
        let end_of_life = tokio::time::sleep(lifetime);
        tokio::pin!(end_of_life);
        let mut idle_deadline = tokio::time::Instant::now() + IDLE_LIMIT;
        loop {
            tokio::select! {
                // The node stopped reading, or the configuration feed closed.
                _ = &mut config => break,
                message = inbound.message() => match message {
                    Ok(Some(message)) => {
                        idle_deadline = tokio::time::Instant::now() + IDLE_LIMIT;
                        let changed = match self.on_message(&node_id, message, &mut record, &tx).await {
                            Ok(changed) => changed,
                            Err(status) => {
                                let _ = tx.send(Err(status)).await;
                                break;
                            }
                        };
                        if changed || last_presence.elapsed() >= PRESENCE_REFRESH {
                            record.last_heartbeat_unix_ms = now_ms();
                            presence_rev = self.write_presence(&record).await;
                            last_presence = tokio::time::Instant::now();
                        }
                    }
                    Ok(None) => break,
                    Err(status) => {
                        debug!(node = %node_id, %status, "node stream error");
                        break;
                    }
                },
                _ = tokio::time::sleep_until(idle_deadline) => {
                    warn!(node = %node_id, "node went quiet; closing its stream");
                    break;
                }
                _ = &mut end_of_life => {
                    debug!(node = %node_id, "stream reached its lifetime; asking the node to reconnect");
                    let _ = tx.send(Err(Status::unavailable("stream lifetime reached; reconnect"))).await;
                    break;
                }
            }
        }
        self.forget(&node_id, presence_rev).await;
        info!(node = %node_id, "node disconnected");
    }

    /// Sends the node every configuration change after `sent_version`, and a ping every
    /// [`PING_INTERVAL`], until the node stops reading or the feed closes.
    async fn send_config(
        self: Arc<Self>,
        node_id: String,
        mut updates: broadcast::Receiver<Arc<ConfigUpdate>>,
        mut sent_version: Revision,
        tx: mpsc::Sender<Result<pb::ControlMessage, Status>>,
    ) {
        let mut ping = tokio::time::interval(PING_INTERVAL);
        loop {
            tokio::select! {
                update = updates.recv() => match update {
                    Ok(update) => {
                        if update.version > sent_version && !send_update(&tx, &update, &mut sent_version).await {
                            return;
                        }
                    }
                    Err(broadcast::error::RecvError::Lagged(n)) => {
                        warn!(node = %node_id, missed = n, "node stream lagged; resyncing");
                        if !send_start(&tx, self.cache.resync(sent_version), &mut sent_version).await {
                            return;
                        }
                    }
                    Err(broadcast::error::RecvError::Closed) => return,
                },
                _ = ping.tick() => {
                    let ping = pb::Ping { config_version: self.cache.revision() };
                    let msg = pb::ControlMessage { msg: Some(control_message::Msg::Ping(ping)) };
                    if tx.send(Ok(msg)).await.is_err() {
                        return;
                    }
                }
            }
        }
    }

    /// Returns whether the node's applied version changed; an error ends the stream.
    async fn on_message(
        &self,
        node_id: &str,
        message: pb::NodeMessage,
        record: &mut NodeRecord,
        tx: &mpsc::Sender<Result<pb::ControlMessage, Status>>,
    ) -> Result<bool, Status> {
        let before = record.applied_version;
        match message.msg {
            Some(node_message::Msg::Ack(ack)) => {
                record.applied_version = record.applied_version.max(ack.version);
                if record.rejected.as_ref().is_some_and(|r| r.version <= record.applied_version) {
                    record.rejected = None;
                }
            }
            Some(node_message::Msg::Nack(nack)) => {
                warn!(node = %node_id, version = nack.version, error = %nack.error, "node rejected config");
                record.rejected = Some(Rejected { version: nack.version, error: nack.error });
                return Ok(true);
            }
            Some(node_message::Msg::Heartbeat(hb)) => {
                record.applied_version = record.applied_version.max(hb.applied_version);
            }
            Some(node_message::Msg::Events(batch)) => self.on_events(node_id, batch, tx).await?,
            Some(node_message::Msg::Lost(report)) => self.on_lost(node_id, report, tx).await?,
            Some(node_message::Msg::Breaker(transition)) => {
                let from = transition.from.clone();
                self.on_breaker(node_id, transition, Some(&from), tx).await?;
            }
            // A probe that left the state as it was: no transition to announce.
            Some(node_message::Msg::Probed(report)) => {
                self.on_breaker(node_id, report, None, tx).await?
            }
            Some(node_message::Msg::Limits(usage)) => {
                let state = self.limits.on_report(node_id, usage);
                let msg = pb::ControlMessage { msg: Some(control_message::Msg::Limits(state)) };
                // A full queue means the node is slow to read: it keeps its last view.
                let _ = tx.try_send(Ok(msg));
            }
            Some(node_message::Msg::Usage(report)) => {
                if report.boot_id.is_empty() {
                    warn!(node = %node_id, "usage report without a boot id; ignored");
                } else {
                    let usage = UsageRecord::from_report(node_id, report);
                    // Totals are cumulative: the next report makes up for a lost write.
                    if let Err(e) =
                        reports::record_usage(self.store.as_ref(), &self.layout, &usage).await
                    {
                        warn!(node = %node_id, error = %e, "could not record a usage report");
                    }
                }
            }
            Some(node_message::Msg::Hello(_)) | None => {}
        }
        Ok(record.applied_version != before)
    }

    /// Stores a node's breaker as its report says it is now (`from`: the state a transition
    /// left; `None` for a probe's report), then acks the report's `seq`.
    async fn on_breaker(
        &self,
        node_id: &str,
        report: pb::BreakerTransition,
        from: Option<&str>,
        tx: &mpsc::Sender<Result<pb::ControlMessage, Status>>,
    ) -> Result<(), Status> {
        let seq = report.seq;
        let breaker = BreakerRecord::from_transition(node_id, report);
        debug!(node = %node_id, provider = %breaker.provider, model = %breaker.upstream_model, state = %breaker.state, probe = from.is_none(), seq, "breaker report");
        let written = reports::record_breaker(
            self.store.as_ref(),
            &self.layout,
            self.lease,
            &breaker,
            from,
            &self.outbox,
        )
        .await;
        match written {
            Ok(_) if seq > 0 => {
                let ack = pb::BreakersAck { seq };
                let msg = pb::ControlMessage { msg: Some(control_message::Msg::BreakersAck(ack)) };
                // A closed stream is noticed by the caller's next receive.
                let _ = tx.send(Ok(msg)).await;
                Ok(())
            }
            Ok(_) => Ok(()),
            // A node older than acks does not resend: its next report of the breaker
            // corrects the record (not the event).
            Err(e) if seq == 0 => {
                warn!(node = %node_id, error = %e, "could not record a breaker report");
                Ok(())
            }
            Err(e) => {
                warn!(node = %node_id, seq, error = %e, "could not record a breaker report; closing the stream so the node resends");
                Err(Status::unavailable(format!(
                    "breaker report {seq} was not stored ({e}); reconnect and resend"
                )))
            }
        }
    }

    /// Stores a node's count of lost events as an `events.lost` audit entry (queued for the
    /// webhooks that want it, in the same transaction), then acks it.
    async fn on_lost(
        &self,
        node_id: &str,
        report: pb::EventsLost,
        tx: &mpsc::Sender<Result<pb::ControlMessage, Status>>,
    ) -> Result<(), Status> {
        if report.id.is_empty() {
            warn!(node = %node_id, count = report.count, "a lost-events report without an id; not recorded");
            return Ok(());
        }
        let id = report.id.clone();
        warn!(node = %node_id, count = report.count, reason = %report.reason, events = %report.events, "the node lost events; recording events.lost");
        match self.events.write(vec![AuditEvent::from_lost(report, node_id)]).await {
            Ok(_) => {
                let ack = pb::EventsLostAck { id };
                let msg = pb::ControlMessage { msg: Some(control_message::Msg::LostAck(ack)) };
                let _ = tx.send(Ok(msg)).await;
                Ok(())
            }
            Err(e) => {
                warn!(node = %node_id, id = %id, error = %e, "could not store events.lost; closing the stream so the node resends");
                Err(Status::unavailable(format!(
                    "lost-events report {id} was not stored ({e}); reconnect and resend"
                )))
            }
        }
    }

    /// Writes the batch to the audit log, then acks it.
    async fn on_events(
        &self,
        node_id: &str,
        batch: pb::FailoverEvents,
        tx: &mpsc::Sender<Result<pb::ControlMessage, Status>>,
    ) -> Result<(), Status> {
        let events = batch.events.into_iter().map(|e| AuditEvent::from_pb(e, node_id)).collect();
        match self.events.write(events).await {
            Ok(written) => {
                debug!(node = %node_id, seq = batch.seq, written, "failover events stored");
                let ack = pb::EventsAck { seq: batch.seq };
                let msg = pb::ControlMessage { msg: Some(control_message::Msg::EventsAck(ack)) };
                // A closed stream is noticed by the caller's next receive.
                let _ = tx.send(Ok(msg)).await;
                Ok(())
            }
            Err(e) => {
                warn!(node = %node_id, seq = batch.seq, error = %e, "could not store failover events; closing the stream so the node resends");
                Err(Status::unavailable(format!(
                    "failover events batch {} was not stored ({e}); reconnect and resend",
                    batch.seq
                )))
            }
        }
    }

    /// Writes the presence record; returns its revision (0 when the write failed).
    async fn write_presence(&self, record: &NodeRecord) -> Revision {
        let value = match serde_json::to_vec(record) {
            Ok(v) => v,
            Err(_) => return 0,
        };
        match self.store.put(&self.layout.node(&record.node_id), value, Some(self.lease)).await {
            Ok(rev) => rev,
            Err(e) => {
                warn!(node = %record.node_id, error = %e, "could not record node presence");
                0
            }
        }
    }

    /// Removes the presence record, unless the node has meanwhile connected elsewhere
    /// (another replica's write changed the record's revision); its breaker records follow
    /// after a grace period unless it is back by then.
    async fn forget(self: &Arc<Self>, node_id: &str, presence_rev: Revision) {
        self.limits.ended(node_id);
        let (this, id) = (Arc::clone(self), node_id.to_owned());
        tokio::spawn(async move {
            reports::forget_breakers_later(
                this.store.as_ref(),
                &this.layout,
                &id,
                this.disconnect_grace,
                &this.outbox,
            )
            .await
        });
        if presence_rev == 0 {
            return;
        }
        let key = self.layout.node(node_id);
        let txn = Txn {
            compare: vec![Compare::mod_revision(key.clone(), presence_rev)],
            success: vec![TxnOp::Delete { key }],
            failure: vec![],
        };
        if let Err(e) = self.store.txn(txn).await {
            warn!(node = %node_id, error = %e, "could not remove node presence");
        }
    }
}

/// Stops a task when its owner goes.
struct AbortOnDrop(tokio::task::AbortHandle);

impl Drop for AbortOnDrop {
    fn drop(&mut self) {
        self.0.abort();
    }
}

async fn send_start(
    tx: &mpsc::Sender<Result<pb::ControlMessage, Status>>,
    start: Start,
    sent_version: &mut Revision,
) -> bool {
    match start {
        Start::UpToDate => true,
        Start::Delta(update) => send_update(tx, &update, sent_version).await,
        Start::Snapshot { version, resources } => {
            let mut chunks: Vec<Vec<pb::Resource>> = resources
                .chunks(SNAPSHOT_CHUNK)
                .map(|chunk| chunk.iter().map(|(n, v)| resource(n, v)).collect())
                .collect();
            if chunks.is_empty() {
                chunks.push(Vec::new());
            }
            let count = chunks.len();
            for (i, resources) in chunks.into_iter().enumerate() {
                let snapshot = pb::Snapshot { version, resources, last: i + 1 == count };
                let msg =
                    pb::ControlMessage { msg: Some(control_message::Msg::Snapshot(snapshot)) };
                if tx.send(Ok(msg)).await.is_err() {
                    return false;
                }
            }
            *sent_version = version;
            true
        }
    }
}

async fn send_update(
    tx: &mpsc::Sender<Result<pb::ControlMessage, Status>>,
    update: &ConfigUpdate,
    sent_version: &mut Revision,
) -> bool {
    let msg = pb::Update {
        version: update.version,
        upserts: update.upserts.iter().map(|(n, v)| resource(n, v)).collect(),
        deletes: update.deletes.clone(),
    };
    *sent_version = update.version;
    tx.send(Ok(pb::ControlMessage { msg: Some(control_message::Msg::Update(msg)) })).await.is_ok()
}

fn resource(name: &str, value: &[u8]) -> pb::Resource {
    pb::Resource { name: name.to_owned(), value: value.to_vec() }
}
