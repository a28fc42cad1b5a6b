//! Node streams: `NodeControl.Connect`, and node presence in the store.
//!
//! Each connected node gets a starting point from the [`ConfigCache`] and then every
//! update, plus a ping when nothing else was sent for a while. A stream ends when the node
//! goes quiet for longer than [`IDLE_LIMIT`] or reaches its maximum lifetime (so that nodes
//! spread over replicas again after one comes back).
//!
//! Outgoing messages are already encoded ([`EncodedControlMessage`]): a config change is
//! encoded once where it is published and the same bytes go to every stream. Each stream's
//! queue is bounded in messages and in bytes ([`Outbox`]); a node whose queue is full is
//! not buffered for: its config task drops what does not fit, waits until the node has read
//! its queue, and resyncs it from the cache (a delta, or a snapshot in chunks). A node that
//! does not read therefore holds at most its queue, and nothing it does delays the others.
//!
//! Presence: while a node is connected this replica keeps `nodes/<id>` in the store,
//! attached to the replica's lease, so that any replica can list the whole fleet and a
//! crashed replica's nodes vanish when its lease expires. One writer task per replica
//! ([`Presence`]) writes the records: the latest record of each node, batched into
//! transactions of at most [`PRESENCE_BATCH`] puts, so that a thousand nodes acking one
//! change are a few store writes, not a thousand.
//!
//! Reports: failover events and a node's counts of lost events (`events.lost`) go to the
//! audit log, breaker reports to their records ([`crate::reports`]); each is acked only once
//! written (the node holds them until then and resends them on its next stream). A report
//! that cannot be written ends the stream with `Unavailable` rather than going unacked on a
//! live stream: acks are cumulative, so a later report's ack would cover the lost one, and
//! a reconnecting node resends all it holds. Usage totals are cumulative and not acked.

use std::collections::HashMap;
use std::pin::Pin;
use std::sync::Arc;
use std::sync::atomic::{AtomicU64, AtomicUsize, Ordering};
use std::time::Duration;

use futures_util::{Stream, StreamExt};
use parking_lot::Mutex;
use serde::{Deserialize, Serialize};
use tokio::sync::{Notify, broadcast, mpsc, oneshot};
use tonic::{Request, Response, Status, Streaming};
use tracing::{debug, info, warn};

use switchyard_proto::node::encoded::{EncodedControlMessage, node_control_server::NodeControl};
use switchyard_proto::node::v1::{self as pb, control_message, node_message};

use switchyard_time::now_ms;

use crate::audit;
use crate::auth::TokenCheck;
use crate::events::{self, BreakerRecord, Interest};
use crate::fanout::{self, ConfigCache, ConfigUpdate, Start};
use crate::fleet::Fleet;
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
/// Messages a node stream's queue holds (config, pings, acks)...
const QUEUE_MESSAGES: usize = 64;
/// ...and bytes: past either, config changes are not queued and the node is resynced once
/// it has read its queue. Updates are shared bytes (encoded once for all streams), so this
/// bounds what a stream's own snapshot chunks can hold.
const QUEUE_BYTES: usize = 1024 * 1024;
/// Presence puts per store transaction (etcd's default `--max-txn-ops` is 128).
pub const PRESENCE_BATCH: usize = 128;
/// The presence writer waits this long after a write so that records coalesce: with a
/// thousand nodes acking a change, a few transactions rather than one per node.
const PRESENCE_PAUSE: Duration = Duration::from_millis(50);

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
    /// The node process's run (`Hello.boot_id`): its breaker reports are stored with it.
    #[serde(default, skip_serializing_if = "String::is_empty")]
    pub boot_id: String,
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
    /// This replica's presence records, written by one task ([`Presence::run`]).
    pub presence: Arc<Presence>,
    /// The fleet's breaker view, relayed to every node stream as it changes.
    pub fleet: Arc<Fleet>,
}

/// The `NodeControl` gRPC service; each stream runs as a task over the shared state.
pub struct NodeService(pub Arc<NodeShared>);

type ControlStream = Pin<Box<dyn Stream<Item = Result<EncodedControlMessage, Status>> + Send>>;

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
        let (out, stream) = Outbox::new();
        let service = Arc::clone(&self.0);
        tokio::spawn(async move { service.serve_node(hello, inbound, out).await });
        Ok(Response::new(stream))
    }
}

impl NodeShared {
    async fn serve_node(
        self: Arc<Self>,
        hello: pb::Hello,
        mut inbound: Streaming<pb::NodeMessage>,
        tx: Outbox,
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
            boot_id: hello.boot_id.clone(),
        };
        let stream_id = self.presence.stream_id();
        // Waited for: the breaker adoption below relies on the record being there.
        self.presence.write_now(stream_id, &record).await;
        let mut last_presence = tokio::time::Instant::now();
        // After the presence write, so that the previous replica's grace timer sees the
        // node back and leaves the records alone. Before any report of this stream is
        // read, so that what this run reports is never taken for an old run's.
        if let Err(e) = reports::adopt_breakers(
            self.store.as_ref(),
            &self.layout,
            &node_id,
            &hello.boot_id,
            self.lease,
        )
        .await
        {
            warn!(node = %node_id, error = %e, "could not adopt the node's breaker records");
        }

        let (start, updates) = self.cache.subscribe(hello.last_applied_version);
        let mut sent_version = hello.last_applied_version;
        if !send_start(&self.cache, &tx, start, &mut sent_version).await {
            return self.forget(&node_id, stream_id);
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
                                tx.fail(status).await;
                                break;
                            }
                        };
                        if changed || last_presence.elapsed() >= PRESENCE_REFRESH {
                            record.last_heartbeat_unix_ms = now_ms();
                            self.presence.write(stream_id, &record);
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
                    tx.fail(Status::unavailable("stream lifetime reached; reconnect")).await;
                    break;
                }
            }
        }
        self.forget(&node_id, stream_id);
        info!(node = %node_id, "node disconnected");
    }

    /// Sends the node every configuration change after `sent_version`, and a ping every
    /// [`PING_INTERVAL`], until the node stops reading or the feed closes. A change that
    /// does not fit the node's queue is not waited for: once the node has read its queue it
    /// is resynced from the cache, so a slow node never holds more than its queue and never
    /// makes the broadcast (shared with every other node) wait.
    async fn send_config(
        self: Arc<Self>,
        node_id: String,
        mut updates: broadcast::Receiver<Arc<ConfigUpdate>>,
        mut sent_version: Revision,
        tx: Outbox,
    ) {
        let mut ping = tokio::time::interval(PING_INTERVAL);
        // The fleet's breaker view at the stream's start, then each change, like config.
        let mut fleet = self.fleet.subscribe();
        let first = fleet.borrow_and_update().message.clone();
        if !tx.push(first).await {
            return;
        }
        loop {
            let behind = tokio::select! {
                Ok(()) = fleet.changed() => {
                    let message = fleet.borrow_and_update().message.clone();
                    match tx.try_push(message) {
                        Pushed::Queued => false,
                        // The resync below sends the view as it is then.
                        Pushed::Full => true,
                        Pushed::Closed => return,
                    }
                }
                update = updates.recv() => match update {
                    Ok(update) if update.version <= sent_version => false,
                    Ok(update) => match &update.encoded {
                        Some(message) => match tx.try_push(message.clone()) {
                            Pushed::Queued => {
                                sent_version = update.version;
                                false
                            }
                            Pushed::Full => true,
                            Pushed::Closed => return,
                        },
                        // Too large for one message: the resync sends it in chunks.
                        None => true,
                    },
                    Err(broadcast::error::RecvError::Lagged(_)) => true,
                    Err(broadcast::error::RecvError::Closed) => return,
                },
                _ = ping.tick() => {
                    let ping = pb::Ping { config_version: self.cache.revision() };
                    let msg = pb::ControlMessage { msg: Some(control_message::Msg::Ping(ping)) };
                    // A full queue already gives the node something to read.
                    if let Pushed::Closed = tx.try_push(EncodedControlMessage::new(&msg)) {
                        return;
                    }
                    false
                }
            };
            if behind {
                self.metrics.node_resyncs.inc();
                info!(node = %node_id, version = sent_version, "node stream behind; resyncing once it has read its queue");
                if !tx.wait_empty().await {
                    return;
                }
                let (start, fresh) = self.cache.subscribe(sent_version);
                updates = fresh;
                if !send_start(&self.cache, &tx, start, &mut sent_version).await {
                    return;
                }
                let view = fleet.borrow_and_update().message.clone();
                if !tx.push(view).await {
                    return;
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
        tx: &Outbox,
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
                self.on_breaker(node_id, &record.boot_id, transition, Some(&from), tx).await?;
            }
            // A probe that left the state as it was: no transition to announce.
            Some(node_message::Msg::Probed(report)) => {
                self.on_breaker(node_id, &record.boot_id, report, None, tx).await?
            }
            Some(node_message::Msg::Windows(windows)) => self.fleet.observe(node_id, windows),
            Some(node_message::Msg::Limits(usage)) => {
                let state = self.limits.on_report(node_id, usage);
                let msg = pb::ControlMessage { msg: Some(control_message::Msg::Limits(state)) };
                // A full queue means the node is slow to read: it keeps its last view.
                let _ = tx.try_push(EncodedControlMessage::new(&msg));
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
        boot_id: &str,
        report: pb::BreakerTransition,
        from: Option<&str>,
        tx: &Outbox,
    ) -> Result<(), Status> {
        let seq = report.seq;
        let breaker = BreakerRecord::from_transition(node_id, boot_id, report);
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
                tx.push(EncodedControlMessage::new(&msg)).await;
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
        tx: &Outbox,
    ) -> Result<(), Status> {
        if report.id.is_empty() {
            warn!(node = %node_id, count = report.count, "a lost-events report without an id; not recorded");
            return Ok(());
        }
        let id = report.id.clone();
        warn!(node = %node_id, count = report.count, reason = %report.reason, events = %report.events, "the node lost events; recording events.lost");
        match self.events.write(vec![events::lost_entry(report, node_id)]).await {
            Ok(_) => {
                let ack = pb::EventsLostAck { id };
                let msg = pb::ControlMessage { msg: Some(control_message::Msg::LostAck(ack)) };
                tx.push(EncodedControlMessage::new(&msg)).await;
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
        tx: &Outbox,
    ) -> Result<(), Status> {
        let events = batch.events.into_iter().map(|e| events::reported(e, node_id)).collect();
        match self.events.write(events).await {
            Ok(written) => {
                debug!(node = %node_id, seq = batch.seq, written, "failover events stored");
                let ack = pb::EventsAck { seq: batch.seq };
                let msg = pb::ControlMessage { msg: Some(control_message::Msg::EventsAck(ack)) };
                // A closed stream is noticed by the caller's next receive.
                tx.push(EncodedControlMessage::new(&msg)).await;
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

    /// Removes the presence record, unless the node has meanwhile connected again (a
    /// newer record of another stream, here or on another replica); its breaker records
    /// follow after a grace period unless it is back by then.
    fn forget(self: &Arc<Self>, node_id: &str, stream_id: u64) {
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
        self.presence.remove(stream_id, node_id);
    }
}

/// Stops a task when its owner goes.
struct AbortOnDrop(tokio::task::AbortHandle);

impl Drop for AbortOnDrop {
    fn drop(&mut self) {
        self.0.abort();
    }
}

/// Sends a starting point read lazily from the cache: a delta as one `Update` when it is
/// small, else a snapshot in chunks; both labeled with the revision the stream subscribed
/// at (see [`crate::fanout`] for why that is correct).
async fn send_start(
    cache: &ConfigCache,
    tx: &Outbox,
    start: Start,
    sent_version: &mut Revision,
) -> bool {
    let version = match start {
        Start::UpToDate => return true,
        Start::Delta { since, version, deletes } => {
            match collect_delta(cache, since, &deletes).await {
                Some(upserts) => {
                    let update = pb::Update { version, upserts, deletes };
                    let msg =
                        pb::ControlMessage { msg: Some(control_message::Msg::Update(update)) };
                    if !tx.push(EncodedControlMessage::new(&msg)).await {
                        return false;
                    }
                    *sent_version = version;
                    return true;
                }
                // Too much changed for one message: a snapshot, in chunks.
                None => version,
            }
        }
        Start::Snapshot { version } => version,
    };
    let mut after: Option<String> = None;
    loop {
        // The next chunk is read once the stream has taken the previous one (HTTP/2 still
        // buffers ahead): a thousand nodes connecting at once each hold one chunk here, not
        // a queue of them, however large the cache.
        if !tx.wait_empty().await {
            return false;
        }
        let chunk = cache.snapshot_chunk(after.as_deref());
        let snapshot = pb::Snapshot {
            version,
            resources: chunk.resources.iter().map(|(n, v)| fanout::resource(n, v)).collect(),
            last: chunk.next.is_none(),
        };
        let msg = pb::ControlMessage { msg: Some(control_message::Msg::Snapshot(snapshot)) };
        if !tx.push(EncodedControlMessage::new(&msg)).await {
            return false;
        }
        match chunk.next {
            Some(next) => after = Some(next),
            None => break,
        }
    }
    *sent_version = version;
    true
}

/// The resources changed after `since`, unless they (with `deletes`) are more than one
/// update may carry ([`fanout::MAX_MESSAGE_BYTES`], a few thousand keys): a node a little
/// behind gets what it missed, not the whole config.
async fn collect_delta(
    cache: &ConfigCache,
    since: Revision,
    deletes: &[String],
) -> Option<Vec<pb::Resource>> {
    let mut bytes: usize = deletes.iter().map(String::len).sum();
    let mut upserts = Vec::new();
    let mut after: Option<String> = None;
    loop {
        let chunk = cache.changed_since(since, after.as_deref());
        for (name, value) in &chunk.resources {
            bytes += name.len() + value.len();
            if bytes > fanout::MAX_MESSAGE_BYTES {
                return None;
            }
            upserts.push(fanout::resource(name, value));
        }
        match chunk.next {
            Some(next) => after = Some(next),
            None => return Some(upserts),
        }
        // The scan reads the whole cache, a step at a time: other streams' tasks run
        // between the steps.
        tokio::task::yield_now().await;
    }
}

/// What [`Outbox::try_push`] did.
enum Pushed {
    Queued,
    /// The queue is at its message or byte bound.
    Full,
    /// The node's stream is gone.
    Closed,
}

/// A node stream's outgoing queue, bounded in messages (the channel) and in bytes (counted
/// here, given back as the gRPC stream takes each message).
#[derive(Clone)]
struct Outbox {
    tx: mpsc::Sender<Result<EncodedControlMessage, Status>>,
    queued: Arc<Queued>,
}

struct Queued {
    bytes: AtomicUsize,
    /// Woken whenever the stream took a message.
    taken: Notify,
}

impl Outbox {
    fn new() -> (Self, ControlStream) {
        let (tx, rx) = mpsc::channel::<Result<EncodedControlMessage, Status>>(QUEUE_MESSAGES);
        let queued = Arc::new(Queued { bytes: AtomicUsize::new(0), taken: Notify::new() });
        let taken = Arc::clone(&queued);
        let stream = tokio_stream::wrappers::ReceiverStream::new(rx).map(
            move |item: Result<EncodedControlMessage, Status>| {
                if let Ok(message) = &item {
                    taken.bytes.fetch_sub(message.len(), Ordering::AcqRel);
                }
                taken.taken.notify_waiters();
                item
            },
        );
        (Self { tx, queued }, Box::pin(stream))
    }

    fn bytes(&self) -> usize {
        self.queued.bytes.load(Ordering::Acquire)
    }

    /// Queues `message` if it fits now.
    fn try_push(&self, message: EncodedControlMessage) -> Pushed {
        if self.tx.is_closed() {
            return Pushed::Closed;
        }
        let len = message.len();
        // An empty queue takes any one message, however large.
        if self.bytes() > 0 && self.bytes() + len > QUEUE_BYTES {
            return Pushed::Full;
        }
        // Counted before sending: the stream may take it (and subtract) at once.
        self.queued.bytes.fetch_add(len, Ordering::AcqRel);
        match self.tx.try_send(Ok(message)) {
            Ok(()) => Pushed::Queued,
            Err(e) => {
                self.queued.bytes.fetch_sub(len, Ordering::AcqRel);
                match e {
                    mpsc::error::TrySendError::Full(_) => Pushed::Full,
                    mpsc::error::TrySendError::Closed(_) => Pushed::Closed,
                }
            }
        }
    }

    /// Queues `message`, waiting for room; false when the stream is gone.
    async fn push(&self, message: EncodedControlMessage) -> bool {
        let len = message.len();
        if !self.wait_until(|bytes, _| bytes == 0 || bytes + len <= QUEUE_BYTES).await {
            return false;
        }
        self.queued.bytes.fetch_add(len, Ordering::AcqRel);
        if self.tx.send(Ok(message)).await.is_err() {
            self.queued.bytes.fetch_sub(len, Ordering::AcqRel);
            return false;
        }
        true
    }

    /// Waits until the node has read everything queued; false when the stream is gone.
    async fn wait_empty(&self) -> bool {
        self.wait_until(|bytes, messages| bytes == 0 && messages == 0).await
    }

    /// Ends the stream with `status` (after what is queued).
    async fn fail(&self, status: Status) {
        let _ = self.tx.send(Err(status)).await;
    }

    async fn wait_until(&self, ready: impl Fn(usize, usize) -> bool) -> bool {
        loop {
            let taken = self.queued.taken.notified();
            tokio::pin!(taken);
            // Registered before looking, so a message taken in between still wakes us.
            taken.as_mut().enable();
            if self.tx.is_closed() {
                return false;
            }
            let messages = self.tx.max_capacity() - self.tx.capacity();
            if ready(self.bytes(), messages) {
                return true;
            }
            tokio::select! {
                _ = &mut taken => {}
                _ = self.tx.closed() => return false,
            }
        }
    }
}

/// The presence records of this replica's node streams, written by one task: each node's
/// latest record, many nodes per transaction.
pub struct Presence {
    queue: Mutex<PresenceQueue>,
    wake: Notify,
    next_stream: AtomicU64,
}

#[derive(Default)]
struct PresenceQueue {
    /// Each node's newest record not yet written, and which stream wrote it.
    puts: HashMap<String, PendingPut>,
    /// Streams that ended: (node id, stream).
    removals: Vec<(String, u64)>,
}

struct PendingPut {
    stream: u64,
    record: NodeRecord,
    /// Told once the record is written (or its write failed).
    written: Vec<oneshot::Sender<()>>,
}

impl Presence {
    pub fn new() -> Arc<Self> {
        Arc::new(Self {
            queue: Mutex::new(PresenceQueue::default()),
            wake: Notify::new(),
            next_stream: AtomicU64::new(1),
        })
    }

    /// A number for a new stream: a node that reconnects here gets a new one, so that the
    /// old stream's end does not remove the new stream's record.
    fn stream_id(&self) -> u64 {
        self.next_stream.fetch_add(1, Ordering::Relaxed)
    }

    /// Queues `record` for writing, replacing any record of the node not yet written.
    fn write(&self, stream: u64, record: &NodeRecord) {
        self.enqueue(stream, record, None);
    }

    /// Queues `record` and waits until it is written (or its write failed).
    async fn write_now(&self, stream: u64, record: &NodeRecord) {
        let (done, written) = oneshot::channel();
        self.enqueue(stream, record, Some(done));
        let _ = written.await;
    }

    fn enqueue(&self, stream: u64, record: &NodeRecord, done: Option<oneshot::Sender<()>>) {
        let mut queue = self.queue.lock();
        let put = queue.puts.entry(record.node_id.clone()).or_insert_with(|| PendingPut {
            stream,
            record: record.clone(),
            written: Vec::new(),
        });
        put.stream = stream;
        put.record = record.clone();
        put.written.extend(done);
        drop(queue);
        self.wake.notify_one();
    }

    /// Removes the record `stream` wrote for `node_id`, unless another stream wrote one since.
    fn remove(&self, stream: u64, node_id: &str) {
        let mut queue = self.queue.lock();
        if queue.puts.get(node_id).is_some_and(|put| put.stream == stream) {
            queue.puts.remove(node_id);
        }
        queue.removals.push((node_id.to_owned(), stream));
        drop(queue);
        self.wake.notify_one();
    }

    /// Writes the queued records until the process ends. Puts go first in each round, then
    /// removals: a removal only deletes a record whose revision is still the one its own
    /// stream wrote (compared in the store, so a newer record from another replica stays).
    pub async fn run(self: Arc<Self>, store: Arc<dyn Store>, layout: Layout, lease: LeaseId) {
        // What this replica last wrote for each node: (stream, revision).
        let mut written: HashMap<String, (u64, Revision)> = HashMap::new();
        loop {
            let wake = self.wake.notified();
            tokio::pin!(wake);
            wake.as_mut().enable();
            let queue = std::mem::take(&mut *self.queue.lock());
            if queue.puts.is_empty() && queue.removals.is_empty() {
                wake.await;
                continue;
            }
            let puts: Vec<(String, PendingPut)> = queue.puts.into_iter().collect();
            for batch in puts.chunks(PRESENCE_BATCH) {
                let rev = put_batch(store.as_ref(), &layout, lease, batch).await;
                for (node_id, put) in batch {
                    if let Some(rev) = rev {
                        written.insert(node_id.clone(), (put.stream, rev));
                    }
                }
            }
            // The waiters learn after the whole round, without holding records meanwhile.
            drop(puts);
            for (node_id, stream) in queue.removals {
                let Some(&(owner, rev)) = written.get(&node_id) else { continue };
                if owner != stream {
                    continue;
                }
                written.remove(&node_id);
                let (store, key) = (Arc::clone(&store), layout.node(&node_id));
                // Beside the writer: a slow delete must not hold back the others' records.
                tokio::spawn(async move {
                    let txn = Txn {
                        compare: vec![Compare::mod_revision(key.clone(), rev)],
                        success: vec![TxnOp::Delete { key }],
                        failure: vec![],
                    };
                    if let Err(e) = store.txn(txn).await {
                        warn!(node = %node_id, error = %e, "could not remove node presence");
                    }
                });
            }
            tokio::time::sleep(PRESENCE_PAUSE).await;
        }
    }
}

/// Writes one transaction of presence records; its revision, or `None` when it failed
/// (the nodes' next refresh writes them again).
async fn put_batch(
    store: &dyn Store,
    layout: &Layout,
    lease: LeaseId,
    batch: &[(String, PendingPut)],
) -> Option<Revision> {
    let success = batch
        .iter()
        .filter_map(|(node_id, put)| {
            let value = serde_json::to_vec(&put.record).ok()?;
            Some(TxnOp::Put { key: layout.node(node_id), value, lease: Some(lease) })
        })
        .collect();
    match store.txn(Txn { compare: vec![], success, failure: vec![] }).await {
        Ok(result) => Some(result.revision),
        Err(e) => {
            warn!(nodes = batch.len(), error = %e, "could not record node presence");
            None
        }
    }
}

#[cfg(test)]
mod tests {
    #![allow(clippy::unwrap_used, clippy::panic)]
    use super::*;
    use crate::store::embedded::EmbeddedStore;

    fn message(len: usize) -> EncodedControlMessage {
        let ping = pb::Ping { config_version: 1 };
        let mut msg = pb::ControlMessage { msg: Some(control_message::Msg::Ping(ping)) };
        if len > 10 {
            let update = pb::Update {
                version: 1,
                upserts: vec![fanout::resource("catalog", &vec![b'x'; len])],
                deletes: vec![],
            };
            msg = pb::ControlMessage { msg: Some(control_message::Msg::Update(update)) };
        }
        EncodedControlMessage::new(&msg)
    }

    #[tokio::test]
    async fn a_queue_nobody_reads_is_full_at_its_message_bound_and_at_its_byte_bound() {
        let (out, _stream) = Outbox::new();
        for _ in 0..QUEUE_MESSAGES {
            assert!(matches!(out.try_push(message(0)), Pushed::Queued));
        }
        assert!(matches!(out.try_push(message(0)), Pushed::Full));

        let (out, _stream) = Outbox::new();
        let big = QUEUE_BYTES / 4;
        for _ in 0..3 {
            assert!(matches!(out.try_push(message(big)), Pushed::Queued));
        }
        assert!(matches!(out.try_push(message(big)), Pushed::Full));
        assert!(out.bytes() <= QUEUE_BYTES);

        // An empty queue takes one message larger than the bound (a large resource).
        let (out, _stream) = Outbox::new();
        assert!(matches!(out.try_push(message(QUEUE_BYTES * 2)), Pushed::Queued));
        assert!(matches!(out.try_push(message(0)), Pushed::Full));
    }

    #[tokio::test]
    async fn a_queue_is_empty_once_the_stream_took_everything_and_closed_when_it_is_gone() {
        let (out, mut stream) = Outbox::new();
        for _ in 0..10 {
            assert!(matches!(out.try_push(message(1_000)), Pushed::Queued));
        }
        let waiter = {
            let out = out.clone();
            tokio::spawn(async move { out.wait_empty().await })
        };
        for _ in 0..10 {
            stream.next().await.unwrap().unwrap();
        }
        assert!(waiter.await.unwrap());
        assert_eq!(out.bytes(), 0);
        drop(stream);
        assert!(matches!(out.try_push(message(0)), Pushed::Closed));
        assert!(!out.wait_empty().await);
    }

    fn record(node_id: &str, applied_version: Revision) -> NodeRecord {
        NodeRecord {
            node_id: node_id.into(),
            listen_address: "127.0.0.1:1".into(),
            applied_version,
            last_heartbeat_unix_ms: 0,
            connected_unix_ms: 0,
            control_plane: "cp".into(),
            software_version: String::new(),
            rejected: None,
            boot_id: String::new(),
        }
    }

    async fn stored(store: &dyn Store, layout: &Layout) -> Vec<NodeRecord> {
        let listing = store.list(&layout.nodes_prefix()).await.unwrap();
        listing.kvs.iter().map(|kv| serde_json::from_slice(&kv.value).unwrap()).collect()
    }

    #[tokio::test]
    async fn presence_of_many_nodes_is_written_in_few_transactions_and_removed_per_stream() {
        let dir = tempfile::tempdir().unwrap();
        let store: Arc<dyn Store> = Arc::new(EmbeddedStore::open(dir.path()).await.unwrap());
        let layout = Layout::new("/t");
        let lease = store.grant_lease(Duration::from_secs(60)).await.unwrap();
        let presence = Presence::new();
        let streams: Vec<u64> = (0..300).map(|_| presence.stream_id()).collect();
        // Queued before the writer runs: one round, 300 puts.
        for (i, stream) in streams.iter().enumerate() {
            presence.write(*stream, &record(&format!("n{i:03}"), 1));
        }
        // The same nodes again (acks of a newer version): the newest record of each is kept.
        for (i, stream) in streams.iter().enumerate() {
            presence.write(*stream, &record(&format!("n{i:03}"), 2));
        }
        let before = store.current_revision().await.unwrap();
        let writer =
            tokio::spawn(Arc::clone(&presence).run(Arc::clone(&store), layout.clone(), lease));
        presence.write_now(streams[0], &record("n000", 2)).await;
        let records = stored(store.as_ref(), &layout).await;
        assert_eq!(records.len(), 300);
        assert!(records.iter().all(|r| r.applied_version == 2));
        let writes = store.current_revision().await.unwrap() - before;
        assert!(writes <= (300 / PRESENCE_BATCH as i64) + 2, "{writes} store writes");

        // n001 reconnected (a new stream) before its old stream ended: the old stream's end
        // leaves the new record alone; n002's stream ended: its record goes.
        let again = presence.stream_id();
        presence.write_now(again, &record("n001", 3)).await;
        presence.remove(streams[1], "n001");
        presence.remove(streams[2], "n002");
        let deadline = tokio::time::Instant::now() + Duration::from_secs(10);
        loop {
            let records = stored(store.as_ref(), &layout).await;
            if !records.iter().any(|r| r.node_id == "n002") {
                let n001 = records.iter().find(|r| r.node_id == "n001").unwrap();
                assert_eq!(n001.applied_version, 3);
                assert_eq!(records.len(), 299);
                break;
            }
            assert!(tokio::time::Instant::now() < deadline, "n002's record was never removed");
            tokio::time::sleep(Duration::from_millis(10)).await;
        }
        writer.abort();
    }
}
