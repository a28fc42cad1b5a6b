//! A node's end of the config stream, for tests that drive a real control plane through its
//! real protocol: Hello sent, heartbeats every second, messages sent and replies read by the
//! test. Nothing of the control plane is mocked; this stands in for the node only.

use std::time::Duration;

use switchyard_proto::node::v1::{
    self as pb, control_message, node_control_client::NodeControlClient, node_message,
};
use tokio::sync::mpsc;

use crate::PATIENCE as WAIT;

pub struct FakeNode {
    tx: mpsc::Sender<pb::NodeMessage>,
    replies: tonic::Streaming<pb::ControlMessage>,
    heartbeat: tokio::task::JoinHandle<()>,
    /// The last events batch number [`FakeNode::send_next`] used.
    seq: u64,
}

pub fn msg(m: node_message::Msg) -> pb::NodeMessage {
    pb::NodeMessage { msg: Some(m) }
}

impl FakeNode {
    pub async fn connect(control: &str, node_id: &str) -> FakeNode {
        // `NodeControlClient::connect` is shadowed by the `Connect` rpc's method.
        let channel = tonic::transport::Endpoint::from_shared(control.to_owned())
            .unwrap()
            .connect()
            .await
            .unwrap();
        let mut client = NodeControlClient::new(channel);
        let (tx, rx) = mpsc::channel(16);
        let hello = pb::Hello {
            node_id: node_id.into(),
            last_applied_version: 0,
            listen_address: "127.0.0.1:1".into(),
            software_version: "e2e".into(),
            boot_id: String::new(),
        };
        tx.send(msg(node_message::Msg::Hello(hello))).await.unwrap();
        let replies = client
            .connect(tokio_stream::wrappers::ReceiverStream::new(rx))
            .await
            .unwrap()
            .into_inner();
        let beats = tx.clone();
        let heartbeat = tokio::spawn(async move {
            loop {
                // Pacing: a real node's heartbeat period.
                tokio::time::sleep(Duration::from_secs(1)).await;
                let hb = pb::Heartbeat { applied_version: 0 };
                if beats.send(msg(node_message::Msg::Heartbeat(hb))).await.is_err() {
                    return;
                }
            }
        });
        FakeNode { tx, replies, heartbeat, seq: 0 }
    }

    /// The next message from the control plane (`Err` when the stream failed).
    pub async fn reply(&mut self) -> Result<Option<pb::ControlMessage>, tonic::Status> {
        self.replies.message().await
    }

    pub async fn send(&self, m: node_message::Msg) {
        self.tx.send(msg(m)).await.unwrap();
    }

    /// Sends batch `seq` and waits for its ack (acked means stored).
    pub async fn send_events(&mut self, seq: u64, events: Vec<pb::FailoverEvent>) {
        self.send(node_message::Msg::Events(pb::FailoverEvents { seq, events })).await;
        self.wait_ack(seq).await;
    }

    /// Sends the next batch in sequence and waits for its ack.
    pub async fn send_next(&mut self, events: Vec<pb::FailoverEvent>) {
        self.seq += 1;
        let seq = self.seq;
        self.send_events(seq, events).await;
    }

    pub async fn wait_ack(&mut self, seq: u64) {
        let acked = tokio::time::timeout(WAIT, async {
            loop {
                let reply = self.replies.message().await.unwrap().expect("stream ended");
                if let Some(control_message::Msg::EventsAck(ack)) = reply.msg
                    && ack.seq == seq
                {
                    return;
                }
            }
        })
        .await;
        assert!(acked.is_ok(), "no ack for events batch {seq}");
    }

    /// Waits for the first reply `pick` takes, skipping the others (pings, config).
    pub async fn wait_for<T>(
        &mut self,
        what: &str,
        mut pick: impl FnMut(control_message::Msg) -> Option<T>,
    ) -> T {
        let found = tokio::time::timeout(WAIT, async {
            loop {
                let reply = self.replies.message().await.unwrap().expect("stream ended");
                if let Some(found) = reply.msg.and_then(&mut pick) {
                    return found;
                }
            }
        })
        .await;
        found.unwrap_or_else(|_| panic!("no {what} from the control plane"))
    }

    /// Messages on one stream are handled in order: once an (empty) events batch is acked,
    /// everything sent before it has been stored.
    pub async fn barrier(&mut self, seq: u64) {
        self.send_events(seq, vec![]).await;
    }

    /// Waits until the replica serving this node has config `version`.
    pub async fn wait_config(&mut self, version: i64) {
        let seen = tokio::time::timeout(WAIT, async {
            loop {
                let reply = self.replies.message().await.unwrap().expect("stream ended");
                let v = match reply.msg {
                    Some(control_message::Msg::Snapshot(s)) => s.version,
                    Some(control_message::Msg::Update(u)) => u.version,
                    Some(control_message::Msg::Ping(p)) => p.config_version,
                    _ => 0,
                };
                if v >= version {
                    return;
                }
            }
        })
        .await;
        assert!(seen.is_ok(), "the node's replica never reached config version {version}");
    }
}

impl Drop for FakeNode {
    fn drop(&mut self) {
        self.heartbeat.abort();
    }
}

/// A request that timed out on `openai/gpt-5-nano` and was served by Claude.
pub fn failover_event(id: &str, at_unix_ms: i64, key_id: &str) -> pb::FailoverEvent {
    let attempt = |model: &str, status: &str, reason: &str, latency_ms| pb::Attempt {
        model: model.into(),
        status: status.into(),
        reason: reason.into(),
        latency_ms,
        ..Default::default()
    };
    pb::FailoverEvent {
        id: id.into(),
        at_unix_ms,
        node_id: "n1".into(),
        key_id: key_id.into(),
        requested_model: "openai/gpt-5-nano".into(),
        served_model: "anthropic/claude-sonnet-4".into(),
        attempts: vec![
            attempt("openai/gpt-5-nano", "failed", "timeout", 30_011),
            attempt("anthropic/claude-sonnet-4", "served", "", 734),
        ],
        stream: false,
        status: 200,
        ..Default::default()
    }
}
