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
/// subscription wants it. A probe is no state change and raises no event; nor does a
/// transition resent after a lost ack (the record already holds it).
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
    // A transition the node resends (its ack was lost) finds its record already there: it
    // is stored again, but its event is not queued a second time.
    let resent = match from {
        Some(_) => store.get(&key).await?.is_some_and(|kv| {
            serde_json::from_slice::<BreakerRecord>(&kv.value).is_ok_and(|stored| {
                stored.state == record.state && stored.since_unix_ms == record.since_unix_ms
            })
        }),
        None => false,
    };
    let entry =
        from.filter(|_| !resent).and_then(|from| OutboxEntry::breaker(record, from, now_ms()));
    // Guarded on the subscriptions' catalog revision, like failover events (see
    // `Interest`); decided again on the store's catalog if it changed meanwhile.
    for _ in 0..GUARD_ATTEMPTS {
        let (revision, webhooks) = outbox.current();
        let mut success =
            vec![TxnOp::Put { key: key.clone(), value: value.clone(), lease: Some(lease) }];
        if let Some(entry) = &entry
            && webhooks.iter().any(|w| entry.is_for(w))
        {
            success.push(entry.put(layout)?);
        }
        let compare = vec![Interest::guard(layout, revision)];
        let result = store.txn(Txn { compare, success, failure: vec![] }).await?;
        if result.succeeded {
            return Ok(result.revision);
        }
        outbox.refresh(store, layout).await?;
    }
    Err(StoreError::Unavailable("the webhook subscriptions kept changing".into()))
}

/// Tries of a write guarded on the subscriptions (each retry follows a catalog change).
const GUARD_ATTEMPTS: usize = 8;

/// A node connected here: its breaker records (written by the replica it was on before)
/// move to this replica's lease, so they live as long as this replica serves the node.
/// Records of another run of the node (`boot_id`, when both it and the record name one)
/// are removed instead: a restarted node's breakers start closed, and its old run's
/// states would otherwise stay listed as long as the node id is connected. Each record is
/// moved or removed only if unchanged since it was read.
pub async fn adopt_breakers(
    store: &dyn Store,
    layout: &Layout,
    node_id: &str,
    boot_id: &str,
    lease: LeaseId,
) -> Result<(), StoreError> {
    let listing = store.list(&layout.node_breakers_prefix(node_id)).await?;
    let ops: Vec<(Compare, TxnOp)> = listing
        .kvs
        .into_iter()
        .filter_map(|kv| {
            let compare = Compare::mod_revision(kv.key.clone(), kv.mod_revision);
            let op = if of_another_run(&kv.value, boot_id) {
                TxnOp::Delete { key: kv.key }
            } else if kv.lease != lease {
                TxnOp::Put { key: kv.key, value: kv.value.to_vec(), lease: Some(lease) }
            } else {
                return None;
            };
            Some((compare, op))
        })
        .collect();
    // One compare and one operation per record, within etcd's per-txn limit.
    for chunk in ops.chunks(MAX_TXN_OPS) {
        let (compare, success) = chunk.iter().cloned().unzip();
        store.txn(Txn { compare, success, failure: vec![] }).await?;
    }
    Ok(())
}

/// Whether a stored breaker record was reported by a run of the node other than `boot_id`.
/// Unknown on either side (a node or record older than boot ids) counts as the same run:
/// keeping a state a little too long is better than dropping an open breaker.
fn of_another_run(value: &[u8], boot_id: &str) -> bool {
    !boot_id.is_empty()
        && serde_json::from_slice::<BreakerRecord>(value)
            .is_ok_and(|r| !r.boot_id.is_empty() && r.boot_id != boot_id)
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
    let entry = OutboxEntry::node_disconnected(
        node_id,
        disconnected,
        u64::try_from(grace.as_millis()).unwrap_or(u64::MAX),
    );
    for _ in 0..GUARD_ATTEMPTS {
        let mut success =
            vec![TxnOp::DeletePrefix { prefix: layout.node_breakers_prefix(node_id) }];
        let (revision, webhooks) = outbox.current();
        if webhooks.iter().any(|w| entry.is_for(w)) {
            match entry.put(layout) {
                Ok(op) => success.push(op),
                Err(e) => warn!(node = %node_id, error = %e, "cannot encode node.disconnected"),
            }
        }
        let compare =
            vec![Compare::absent(layout.node(node_id)), Interest::guard(layout, revision)];
        let refused = match store.txn(Txn { compare, success, failure: vec![] }).await {
            Ok(result) => !result.succeeded,
            Err(e) => {
                // They still go with this replica's lease if it ever ends.
                warn!(node = %node_id, error = %e, "could not remove a gone node's breakers");
                return;
            }
        };
        // Refused because the subscriptions changed: decide again; else the node is back.
        let changed = refused && outbox.refresh(store, layout).await.unwrap_or(false);
        if !changed {
            return;
        }
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

const HOUR_MS: i64 = 3_600_000;

/// The start of the hour holding `unix_ms`.
pub fn hour(unix_ms: i64) -> i64 {
    unix_ms.div_euclid(HOUR_MS) * HOUR_MS
}

/// What a node run used from `since` (an hour start) on: its newest totals less its totals
/// at `since`, which this returns (`None`: nothing to subtract, the run reported nothing
/// before `since`). `marks` are the run's hour marks (hour start → the last report before
/// it), `latest` its newest report.
pub fn usage_since<'a>(
    latest: &'a UsageRecord,
    marks: &'a std::collections::BTreeMap<i64, UsageRecord>,
    since: i64,
) -> Option<&'a UsageRecord> {
    if latest.at_unix_ms < since {
        return Some(latest);
    }
    // The first mark after `since` holds the last report before its hour; if even that
    // report came after `since`, the run reported nothing before it.
    marks.range(since..).next().map(|(_, m)| m).filter(|m| m.at_unix_ms < since)
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
    let mut mark = None;
    let expected = match &current {
        Some(kv) => {
            let stored = serde_json::from_slice::<UsageRecord>(&kv.value).ok();
            if stored.as_ref().is_some_and(|s| s.at_unix_ms > record.at_unix_ms) {
                return Ok(false);
            }
            // The first report of a new hour keeps the totals as they stood when the hour
            // began (the last report before it): usage since an hour is the newest totals
            // less that mark.
            if let Some(stored) = stored
                && hour(stored.at_unix_ms) < hour(record.at_unix_ms)
            {
                let at =
                    layout.usage_mark(&record.node_id, &record.boot_id, hour(record.at_unix_ms));
                mark = Some(TxnOp::Put { key: at, value: kv.value.to_vec(), lease: None });
            }
            kv.mod_revision
        }
        None => 0,
    };
    let value = serde_json::to_vec(record)
        .map_err(|e| StoreError::InvalidRequest(format!("cannot encode usage: {e}")))?;
    let mut success = vec![TxnOp::Put { key, value, lease: None }];
    success.extend(mark);
    let txn = Txn {
        compare: vec![Compare::mod_revision(
            layout.usage(&record.node_id, &record.boot_id),
            expected,
        )],
        success,
        failure: vec![],
    };
    // A lost race means another write of this boot's totals won; the next report (they are
    // cumulative) settles it.
    Ok(store.txn(txn).await?.succeeded)
}

#[cfg(test)]
mod adopt_tests {
    #![allow(clippy::unwrap_used)]
    use super::*;
    use crate::store::embedded::EmbeddedStore;

    fn open_breaker(node_id: &str, model: &str, boot_id: &str) -> BreakerRecord {
        BreakerRecord {
            node_id: node_id.into(),
            provider: "p".into(),
            upstream_model: model.into(),
            state: "open".into(),
            since_unix_ms: 1,
            failure_rate: 1.0,
            calls_in_window: 4,
            next_probe_unix_ms: 2,
            cause: "failure_rate".into(),
            cooldown_ms: 30_000,
            last_probe_unix_ms: 0,
            last_probe_outcome: String::new(),
            last_probe_latency_ms: 0,
            boot_id: boot_id.into(),
        }
    }

    /// (node/model, lease) of every stored breaker record.
    async fn stored(store: &dyn Store, layout: &Layout) -> Vec<(String, LeaseId)> {
        let listing = store.list(&layout.breakers_prefix()).await.unwrap();
        listing
            .kvs
            .iter()
            .map(|kv| {
                let r: BreakerRecord = serde_json::from_slice(&kv.value).unwrap();
                (format!("{}/{}", r.node_id, r.upstream_model), kv.lease)
            })
            .collect()
    }

    #[tokio::test]
    async fn a_new_run_of_a_node_drops_its_old_runs_breakers_and_a_reconnect_of_the_same_run_keeps_them()
     {
        let dir = tempfile::tempdir().unwrap();
        let store = EmbeddedStore::open(dir.path()).await.unwrap();
        let layout = Layout::new("/t");
        let before = store.grant_lease(Duration::from_secs(60)).await.unwrap();
        let here = store.grant_lease(Duration::from_secs(60)).await.unwrap();
        // n1's run-1 reported model a; a node older than boot ids reported model b; n2 is
        // another node.
        let records = [
            open_breaker("n1", "a", "run-1"),
            open_breaker("n1", "b", ""),
            open_breaker("n2", "a", "run-1"),
        ];
        let success = records
            .iter()
            .map(|r| TxnOp::Put {
                key: layout.breaker(&r.node_id, &r.provider, &r.upstream_model),
                value: serde_json::to_vec(r).unwrap(),
                lease: Some(before),
            })
            .collect();
        store.txn(Txn { compare: vec![], success, failure: vec![] }).await.unwrap();

        // The same run reconnects here: every record of n1 stays, on this replica's lease.
        adopt_breakers(&store, &layout, "n1", "run-1", here).await.unwrap();
        let expected = [("n1/a", here), ("n1/b", here), ("n2/a", before)];
        let expected: Vec<_> = expected.iter().map(|(k, l)| ((*k).to_owned(), *l)).collect();
        assert_eq!(stored(&store, &layout).await, expected);

        // A node that names no run (older than boot ids) is taken for the same run.
        adopt_breakers(&store, &layout, "n1", "", here).await.unwrap();
        assert_eq!(stored(&store, &layout).await, expected);

        // n1 restarted: run-1's record goes; the one of unknown run and n2's stay.
        adopt_breakers(&store, &layout, "n1", "run-2", here).await.unwrap();
        let left = [("n1/b", here), ("n2/a", before)];
        let left: Vec<_> = left.iter().map(|(k, l)| ((*k).to_owned(), *l)).collect();
        assert_eq!(stored(&store, &layout).await, left);
    }
}

#[cfg(test)]
mod usage_since_tests {
    use std::collections::BTreeMap;

    use super::*;

    fn totals(at: i64, requests: u64) -> UsageRecord {
        UsageRecord {
            node_id: "n".into(),
            boot_id: "b".into(),
            at_unix_ms: at,
            entries: vec![UsageEntry {
                key_id: "k".into(),
                model: "m".into(),
                requests,
                prompt_tokens: requests,
                completion_tokens: requests,
                cost_usd: 0.0,
            }],
        }
    }

    #[test]
    fn usage_since_an_hour_is_measured_from_that_hours_mark() {
        let h = |n: i64| n * HOUR_MS;
        // Reports at 1:10 (5 requests), 2:20 (8), then nothing until 5:05 (12): marks at 2:00
        // (the 1:10 totals) and 5:00 (the 2:20 totals).
        let latest = totals(h(5) + 300_000, 12);
        let marks: BTreeMap<i64, UsageRecord> =
            [(h(2), totals(h(1) + 600_000, 5)), (h(5), totals(h(2) + 1_200_000, 8))].into();
        let base = |since| usage_since(&latest, &marks, since).map(|r| r.entries[0].requests);
        assert_eq!(base(h(2)), Some(5), "since 2:00: 12 − 5");
        assert_eq!(base(h(3)), Some(8), "since 3:00, idle until 5:05: 12 − 8");
        assert_eq!(base(h(6)), Some(12), "since after the last report: nothing");
        assert_eq!(base(h(1)), None, "its first report, at 1:10, came after 1:00: all 12 count");
        let young = totals(h(5) + 300_000, 3);
        assert_eq!(usage_since(&young, &BTreeMap::new(), h(4)).map(|r| r.at_unix_ms), None);
        assert_eq!(hour(h(3) + 1), h(3));
    }
}
