//! What nodes report besides config acks: breaker states and usage totals, as stored.
//!
//! Breakers: `breakers/<node>/<provider>/<upstream model>` holds the state the node last
//! reported, attached to the lease of the replica serving the node (like its presence), so a
//! crashed replica's records vanish with it. When a node's stream ends its records stay for
//! [`BREAKER_GRACE`]: nodes reconnect every [`crate::nodes::MAX_LIFETIME`] and on replica
//! restarts, and an open breaker must not disappear from `switchyard breakers` because its
//! node moved. The replica the node reconnects to re-attaches them to its own lease; if the
//! node has not come back (no presence record anywhere) when the grace ends, they go.
//!
//! Usage: `usage/<node>/<boot id>` holds the newest cumulative report of one node process.
//! Reports are totals since the process started, so replacing the record never counts a
//! request twice, whether a report was resent or its ack lost.

use std::time::Duration;

use serde::{Deserialize, Serialize};
use tracing::warn;

use switchyard_proto::node::v1 as pb;

use switchyard_time::now_ms;

use crate::events::{BreakerRecord, Interest, OutboxEntry};
use crate::layout::{Layout, MAX_TXN_OPS};
use crate::store::{Compare, LeaseId, Revision, Store, StoreError, Txn, TxnOp};

/// How long a disconnected node's breaker records outlive its stream.
pub const BREAKER_GRACE: Duration = Duration::from_secs(30);

/// A node's breaker state changed (`from` is the state it left), or a probe left it as it
/// was (`from` is `None`): store it under the replica's lease, with a transition's webhook
/// event (`breaker.opened|half_open|closed`) in the same transaction when some
/// subscription wants it. A probe is no state change and raises no event.
pub async fn record_breaker(
    store: &dyn Store,
    layout: &Layout,
    lease: LeaseId,
    record: &BreakerRecord,
    from: Option<&str>,
    outbox: &Interest,
) -> Result<Revision, StoreError> {
    let key = layout.breaker(&record.node_id, &record.provider, &record.upstream_model);
    let value = serde_json::to_vec(record)
        .map_err(|e| StoreError::InvalidRequest(format!("cannot encode breaker: {e}")))?;
    let mut success = vec![TxnOp::Put { key, value, lease: Some(lease) }];
    if let Some(from) = from
        && let Some(entry) = OutboxEntry::breaker(record, from, now_ms())
        && outbox.wants(&entry)
    {
        success.push(entry.put(layout)?);
    }
    Ok(store.txn(Txn { compare: vec![], success, failure: vec![] }).await?.revision)
}

/// A node connected here: its breaker records (written by the replica it was on before)
/// move to this replica's lease, so they live as long as this replica serves the node.
/// Each record is moved only if unchanged since it was read.
pub async fn adopt_breakers(
    store: &dyn Store,
    layout: &Layout,
    node_id: &str,
    lease: LeaseId,
) -> Result<(), StoreError> {
    let listing = store.list(&layout.node_breakers_prefix(node_id)).await?;
    let stale: Vec<_> = listing.kvs.into_iter().filter(|kv| kv.lease != lease).collect();
    // One compare and one put per record, within etcd's per-txn limit.
    for chunk in stale.chunks(MAX_TXN_OPS) {
        let txn = Txn {
            compare: chunk
                .iter()
                .map(|kv| Compare::mod_revision(kv.key.clone(), kv.mod_revision))
                .collect(),
            success: chunk
                .iter()
                .map(|kv| TxnOp::Put {
                    key: kv.key.clone(),
                    value: kv.value.to_vec(),
                    lease: Some(lease),
                })
                .collect(),
            failure: vec![],
        };
        store.txn(txn).await?;
    }
    Ok(())
}

/// After `grace` ([`BREAKER_GRACE`] by default), removes the node's breaker records unless
/// the node is connected again somewhere (its presence record exists); in the same
/// transaction, queues a `node.disconnected` event if a subscription wants one. If this
/// replica dies during the grace, the records go with its lease and the event is not sent.
pub async fn forget_breakers_later(
    store: &dyn Store,
    layout: &Layout,
    node_id: &str,
    grace: Duration,
    outbox: &Interest,
) {
    let disconnected = now_ms();
    tokio::time::sleep(grace).await;
    let mut success = vec![TxnOp::DeletePrefix { prefix: layout.node_breakers_prefix(node_id) }];
    let entry = OutboxEntry::node_disconnected(
        node_id,
        disconnected,
        u64::try_from(grace.as_millis()).unwrap_or(u64::MAX),
    );
    if outbox.wants(&entry) {
        match entry.put(layout) {
            Ok(op) => success.push(op),
            Err(e) => warn!(node = %node_id, error = %e, "cannot encode node.disconnected"),
        }
    }
    let txn =
        Txn { compare: vec![Compare::absent(layout.node(node_id))], success, failure: vec![] };
    if let Err(e) = store.txn(txn).await {
        // They still go with this replica's lease if it ever ends.
        warn!(node = %node_id, error = %e, "could not remove a gone node's breakers");
    }
}

/// The newest cumulative usage report of one node process.
#[derive(Clone, Debug, PartialEq, Serialize, Deserialize)]
pub struct UsageRecord {
    pub node_id: String,
    pub boot_id: String,
    pub at_unix_ms: i64,
    pub entries: Vec<UsageEntry>,
}

#[derive(Clone, Debug, PartialEq, Serialize, Deserialize)]
pub struct UsageEntry {
    pub key_id: String,
    pub model: String,
    pub requests: u64,
    pub prompt_tokens: u64,
    pub completion_tokens: u64,
    pub cost_usd: f64,
}

impl UsageRecord {
    pub fn from_report(node_id: &str, r: pb::UsageReport) -> Self {
        Self {
            node_id: node_id.to_owned(),
            boot_id: r.boot_id,
            at_unix_ms: r.at_unix_ms,
            entries: r
                .entries
                .into_iter()
                .map(|e| UsageEntry {
                    key_id: e.key_id,
                    model: e.model,
                    requests: e.requests,
                    prompt_tokens: e.prompt_tokens,
                    completion_tokens: e.completion_tokens,
                    cost_usd: e.cost_usd,
                })
                .collect(),
        }
    }
}

/// Stores the report unless a newer one of the same boot is already there (a report that
/// overtook this one on a reconnect). Returns whether it was stored.
pub async fn record_usage(
    store: &dyn Store,
    layout: &Layout,
    record: &UsageRecord,
) -> Result<bool, StoreError> {
    let key = layout.usage(&record.node_id, &record.boot_id);
    let current = store.get(&key).await?;
    let expected = match &current {
        Some(kv) => {
            let newer = serde_json::from_slice::<UsageRecord>(&kv.value)
                .is_ok_and(|stored| stored.at_unix_ms > record.at_unix_ms);
            if newer {
                return Ok(false);
            }
            kv.mod_revision
        }
        None => 0,
    };
    let value = serde_json::to_vec(record)
        .map_err(|e| StoreError::InvalidRequest(format!("cannot encode usage: {e}")))?;
    let txn = Txn {
        compare: vec![Compare::mod_revision(key.clone(), expected)],
        success: vec![TxnOp::Put { key, value, lease: None }],
        failure: vec![],
    };
    // A lost race means another write of this boot's totals won; the next report (they are
    // cumulative) settles it.
    Ok(store.txn(txn).await?.succeeded)
}
