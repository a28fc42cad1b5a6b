//! Many lean nodes in one process, for tests and benchmarks of one control plane serving a
//! fleet: each node has its own connection and its own `NodeControl.Connect` stream, says
//! Hello, acks every config version it receives in full (as a real node does once it has
//! applied it), heartbeats, and notes when each version arrived. A node can stop reading
//! its stream ([`FleetNode::pause`]) and read again later ([`FleetNode::resume`]).
//!
//! Used by the e2e tests and `switchyard-bench fleet`; it never panics, so a benchmark gets
//! an error it can report.

use std::sync::Arc;
use std::sync::atomic::{AtomicI64, AtomicU64, Ordering};

use parking_lot::Mutex;
use std::time::{Duration, Instant};

use switchyard_proto::node::v1::{
    self as pb, control_message, node_control_client::NodeControlClient, node_message,
};
use tokio::sync::{mpsc, watch};
use tokio::task::JoinHandle;

/// A real node's heartbeat period.
const HEARTBEAT: Duration = Duration::from_secs(2);
/// The node's HTTP/2 receive window per stream: small, so that a paused node's stream backs
/// up into the control plane's queue after a few dozen kilobytes rather than megabytes.
const STREAM_WINDOW: u32 = 16 * 1024;

pub struct FleetNode {
    pub id: String,
    state: Arc<NodeState>,
    reading: watch::Sender<bool>,
    tasks: [JoinHandle<()>; 2],
}

#[derive(Default)]
struct NodeState {
    /// The newest config version received in full (an update, or a snapshot's last chunk).
    version: AtomicI64,
    /// Each config version received in full and when, in order.
    received: Mutex<Vec<(i64, Instant)>>,
    /// Complete snapshots received.
    snapshots: AtomicU64,
    /// Updates received.
    updates: AtomicU64,
    /// Why the stream ended, once it has.
    ended: Mutex<Option<String>>,
}

fn msg(m: node_message::Msg) -> pb::NodeMessage {
    pb::NodeMessage { msg: Some(m) }
}

impl FleetNode {
    /// Connects node `id` to the control plane at `control` (`http://…`) and waits until
    /// its stream is open.
    pub async fn connect(control: &str, id: &str) -> Result<FleetNode, String> {
        let channel = tonic::transport::Endpoint::from_shared(control.to_owned())
            .map_err(|e| format!("{control}: {e}"))?
            .initial_stream_window_size(Some(STREAM_WINDOW))
            .connect()
            .await
            .map_err(|e| format!("node {id}: cannot connect to {control}: {e}"))?;
        let mut client = NodeControlClient::new(channel);
        let (tx, rx) = mpsc::channel(16);
        let hello = pb::Hello {
            node_id: id.into(),
            last_applied_version: 0,
            listen_address: "127.0.0.1:1".into(),
            software_version: "fleet".into(),
            boot_id: String::new(),
        };
        tx.send(msg(node_message::Msg::Hello(hello)))
            .await
            .map_err(|_| format!("node {id}: the request stream closed"))?;
        let mut replies = client
            .connect(tokio_stream::wrappers::ReceiverStream::new(rx))
            .await
            .map_err(|e| format!("node {id}: Connect refused: {e}"))?
            .into_inner();
        let state = Arc::new(NodeState::default());
        let (reading, mut may_read) = watch::channel(true);

        let (acks, node) = (tx.clone(), Arc::clone(&state));
        let reader = tokio::spawn(async move {
            loop {
                if may_read.wait_for(|r| *r).await.is_err() {
                    return;
                }
                let reply = match replies.message().await {
                    Ok(Some(reply)) => reply,
                    Ok(None) => {
                        node.end("the control plane ended the stream".into());
                        return;
                    }
                    Err(status) => {
                        node.end(format!("stream failed: {status}"));
                        return;
                    }
                };
                let version = match reply.msg {
                    Some(control_message::Msg::Update(update)) => {
                        node.updates.fetch_add(1, Ordering::Relaxed);
                        update.version
                    }
                    Some(control_message::Msg::Snapshot(chunk)) => {
                        if !chunk.last {
                            continue;
                        }
                        node.snapshots.fetch_add(1, Ordering::Relaxed);
                        chunk.version
                    }
                    _ => continue,
                };
                node.received(version);
                let ack = pb::Ack { version };
                if acks.send(msg(node_message::Msg::Ack(ack))).await.is_err() {
                    return;
                }
            }
        });
        let (beats, node) = (tx, Arc::clone(&state));
        let heartbeat = tokio::spawn(async move {
            loop {
                tokio::time::sleep(HEARTBEAT).await;
                let hb = pb::Heartbeat { applied_version: node.version.load(Ordering::Acquire) };
                if beats.send(msg(node_message::Msg::Heartbeat(hb))).await.is_err() {
                    return;
                }
            }
        });
        Ok(FleetNode { id: id.to_owned(), state, reading, tasks: [reader, heartbeat] })
    }

    /// The newest config version this node has received in full.
    pub fn version(&self) -> i64 {
        self.state.version.load(Ordering::Acquire)
    }

    /// When this node first had a version at or past `version`.
    pub fn reached(&self, version: i64) -> Option<Instant> {
        let received = self.state.received.lock();
        received.iter().find(|(v, _)| *v >= version).map(|(_, at)| *at)
    }

    /// Config messages received in full: (complete snapshots, updates).
    pub fn messages(&self) -> (u64, u64) {
        (self.state.snapshots.load(Ordering::Relaxed), self.state.updates.load(Ordering::Relaxed))
    }

    /// Why the stream ended (`None` while it is open).
    pub fn ended(&self) -> Option<String> {
        self.state.ended.lock().clone()
    }

    /// Stops reading the stream (heartbeats go on): the control plane's writes back up.
    pub fn pause(&self) {
        self.reading.send_replace(false);
    }

    pub fn resume(&self) {
        self.reading.send_replace(true);
    }
}

impl NodeState {
    fn received(&self, version: i64) {
        self.version.fetch_max(version, Ordering::AcqRel);
        self.received.lock().push((version, Instant::now()));
    }

    fn end(&self, why: String) {
        *self.ended.lock() = Some(why);
    }
}

impl Drop for FleetNode {
    fn drop(&mut self) {
        for task in &self.tasks {
            task.abort();
        }
    }
}

/// Connects `count` nodes `PREFIX-0000`… to `control`, `parallel` at a time.
pub async fn connect_fleet(
    control: &str,
    prefix: &str,
    count: usize,
    parallel: usize,
) -> Result<Vec<FleetNode>, String> {
    let mut nodes = Vec::with_capacity(count);
    let mut pending = tokio::task::JoinSet::new();
    let mut next = 0;
    while nodes.len() < count {
        while next < count && pending.len() < parallel.max(1) {
            let (control, id) = (control.to_owned(), format!("{prefix}-{next:04}"));
            pending.spawn(async move { (next, FleetNode::connect(&control, &id).await) });
            next += 1;
        }
        match pending.join_next().await {
            Some(Ok((i, Ok(node)))) => nodes.push((i, node)),
            Some(Ok((_, Err(e)))) => return Err(e),
            Some(Err(e)) => return Err(format!("a node's connect task failed: {e}")),
            None => break,
        }
    }
    nodes.sort_by_key(|(i, _)| *i);
    Ok(nodes.into_iter().map(|(_, node)| node).collect())
}

/// Waits until every node has a version at or past `version`; `Err` names how many have
/// not after `timeout`.
pub async fn wait_all(nodes: &[FleetNode], version: i64, timeout: Duration) -> Result<(), String> {
    let deadline = Instant::now() + timeout;
    loop {
        let behind = nodes.iter().filter(|n| n.version() < version).count();
        if behind == 0 {
            return Ok(());
        }
        if Instant::now() > deadline {
            let ended = nodes.iter().filter_map(FleetNode::ended).next();
            return Err(format!(
                "{behind} of {} nodes did not reach version {version} within {timeout:?}{}",
                nodes.len(),
                ended.map(|why| format!(" (a stream ended: {why})")).unwrap_or_default()
            ));
        }
        // The polling interval: well below the latencies measured.
        tokio::time::sleep(Duration::from_millis(2)).await;
    }
}

/// The time from `since` until the last of `nodes` reached `version` (`None` if one has not).
pub fn time_to_all(nodes: &[FleetNode], version: i64, since: Instant) -> Option<Duration> {
    let mut last = since;
    for node in nodes {
        last = last.max(node.reached(version)?);
    }
    Some(last.duration_since(since))
}
