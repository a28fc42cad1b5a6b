//! The audit log of failover events (`api:model_failover`), as nodes report them.
//!
//! Each event is stored under `audit/<at_unix_ms>-<event id>` (see [`Layout::audit`]): key
//! order is time order, and a batch the node resends (it holds events until acked) writes
//! the same keys again instead of adding copies. A rewrite bumps the key's `version`, so
//! readers of the watch treat only a key's first write (`version == 1`) as a new event.
//!
//! Retention (at most [`AuditRetention::max_entries`] entries, none older than
//! [`AuditRetention::max_age`]) runs on one replica, the leader of an election over the
//! replicas' leases: the leader watches the log, so it prunes as soon as the count bound is
//! passed, and sweeps for age every [`PRUNE_INTERVAL`].

use std::sync::Arc;
use std::time::Duration;

use tracing::{debug, info, warn};

use switchyard_time::now_ms;

use crate::events::{AuditEvent, Interest, OutboxEntry};
use crate::layout::{Layout, MAX_TXN_OPS};
use crate::metrics::ControlMetrics;
use crate::store::election::{self, Leadership};
use crate::store::{
    Compare, CompareOp, CompareTarget, EventKind, KeyValue, LeaseId, Revision, Store, StoreError,
    Txn, TxnOp,
};

/// Bytes of event JSON per transaction, well under etcd's default 1.5 MiB request limit:
/// a batch etcd refused would be resent, and refused, forever.
const MAX_TXN_BYTES: usize = 1024 * 1024;
/// How often the leader sweeps the log for entries past the age bound.
pub const PRUNE_INTERVAL: Duration = Duration::from_secs(30);
/// After a prune, the next one waits at least this long, so a flood of events costs one
/// listing per second rather than one per batch.
const PRUNE_DEBOUNCE: Duration = Duration::from_secs(1);
/// Pause before campaigning again after the store failed us.
const RETRY_DELAY: Duration = Duration::from_secs(2);

/// Bounds on the audit log (`--audit-max-entries`, `--audit-max-age`).
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub struct AuditRetention {
    pub max_entries: usize,
    pub max_age: Duration,
}

impl Default for AuditRetention {
    fn default() -> Self {
        Self { max_entries: 100_000, max_age: Duration::from_secs(7 * 86_400) }
    }
}

/// Guarded writes retried after the subscriptions changed under them, at most: each retry
/// follows an apply of the catalog, so more means a catalog changing faster than events
/// are stored.
const MAX_GUARD_RETRIES: usize = 8;

/// Writes every event durably, in transactions of at most [`MAX_TXN_OPS`] operations and
/// about `MAX_TXN_BYTES`. With `outbox`, an event some webhook subscribes to is queued
/// for delivery in the same transaction as its audit entry, so that an acked event is
/// always both recorded and queued; each transaction is guarded on the catalog revision
/// its subscriptions were read at, and one whose guard fails is decided again on the
/// store's catalog ([`Interest::refresh`]), so no subscription in the store when the
/// event is written misses it. Events without an id are skipped (they could not be
/// deduplicated on redelivery); an event repeated within the batch is written once (etcd
/// refuses a txn writing a key twice). Returns how many events were written.
pub async fn write_events(
    store: &dyn Store,
    layout: &Layout,
    events: Vec<AuditEvent>,
    outbox: Option<&Interest>,
) -> Result<usize, StoreError> {
    let mut seen = std::collections::HashSet::new();
    let events: Vec<AuditEvent> = events
        .into_iter()
        .filter(|event| {
            if event.id.is_empty() {
                warn!(node = %event.node_id, "failover event without an id; not recorded");
                return false;
            }
            seen.insert(layout.audit(event.at_unix_ms, &event.id))
        })
        .collect();
    let written = events.len();
    let mut pending: Vec<&AuditEvent> = events.iter().collect();
    for _ in 0..=MAX_GUARD_RETRIES {
        let (txns, members) = event_txns(layout, &pending, outbox)?;
        // Sent together: the keys are distinct, so order does not matter, and the embedded
        // store commits transactions that arrive together with one fsync (etcd pipelines
        // them).
        let results =
            futures_util::future::try_join_all(txns.into_iter().map(|txn| store.txn(txn))).await?;
        let refused: Vec<&AuditEvent> = results
            .iter()
            .zip(members)
            .filter(|(result, _)| !result.succeeded)
            .flat_map(|(_, events)| events)
            .collect();
        if refused.is_empty() {
            return Ok(written);
        }
        let Some(outbox) = outbox else { break };
        debug!(
            events = refused.len(),
            "the subscriptions changed under an event write; deciding again"
        );
        outbox.refresh(store, layout).await?;
        pending = refused;
    }
    Err(StoreError::Unavailable(
        "the webhook subscriptions kept changing while events were stored".into(),
    ))
}

/// The transactions that write `events` (and their outbox entries), each with the events
/// it holds.
#[allow(clippy::type_complexity)]
fn event_txns<'e>(
    layout: &Layout,
    events: &[&'e AuditEvent],
    outbox: Option<&Interest>,
) -> Result<(Vec<Txn>, Vec<Vec<&'e AuditEvent>>), StoreError> {
    let now = now_ms();
    // Read once per batch: in an outage storm a batch holds thousands of events, and most
    // installs subscribe no webhook, so no outbox entry is built just to be thrown away.
    let (revision, webhooks) = match outbox {
        Some(outbox) => {
            let (revision, webhooks) = outbox.current();
            (Some(revision), Some(webhooks).filter(|w| !w.is_empty()))
        }
        None => (None, None),
    };
    let guard: Vec<Compare> = revision.map(|r| Interest::guard(layout, r)).into_iter().collect();
    let mut txns = Vec::new();
    let mut members = Vec::new();
    let mut txn = Txn { compare: guard.clone(), ..Txn::default() };
    let mut held = Vec::new();
    let mut bytes = 0;
    for &event in events {
        let key = layout.audit(event.at_unix_ms, &event.id);
        let value = serde_json::to_vec(event)
            .map_err(|e| StoreError::InvalidRequest(format!("cannot encode event: {e}")))?;
        // The writes of one event: its audit entry, and its outbox entry if wanted.
        let mut group = vec![TxnOp::Put { key, value, lease: None }];
        if let Some(webhooks) = &webhooks
            && webhooks.iter().any(|w| w.wants(event.event_type(), &event.key_id))
        {
            group.push(OutboxEntry::from_audit(event, now).put(layout)?);
        }
        let size: usize = group.iter().map(op_size).sum();
        if !txn.success.is_empty()
            && (txn.success.len() + group.len() > MAX_TXN_OPS || bytes + size > MAX_TXN_BYTES)
        {
            txns.push(std::mem::replace(
                &mut txn,
                Txn { compare: guard.clone(), ..Txn::default() },
            ));
            members.push(std::mem::take(&mut held));
            bytes = 0;
        }
        bytes += size;
        txn.success.extend(group);
        held.push(event);
    }
    if !txn.success.is_empty() {
        txns.push(txn);
        members.push(held);
    }
    Ok((txns, members))
}

/// Writes the event batches of every node stream on this replica as a group ("group
/// commit"): one round of transactions at a time, taking every batch that arrived while the
/// previous round was being written, and rounds at least [`MIN_WRITE_INTERVAL`] apart. In an
/// outage storm, when every request fails over on every node, the store then sees a bounded
/// number of transactions per second (about `1 / MIN_WRITE_INTERVAL`, plus one per
/// [`MAX_TXN_OPS`] operations), however many nodes and batches there are; each batch is
/// still acked only after the transaction holding it succeeded.
#[derive(Clone)]
pub struct EventWriter {
    tx: tokio::sync::mpsc::Sender<WriteRequest>,
}

/// Rounds of event writes are at least this far apart: a round costs an fsync and a wake-up
/// of every watcher of the store. A node stream's next batch waits for the next round, so
/// this also caps one node's stored events per second (see the node's `EVENTS_PER_BATCH`).
pub const MIN_WRITE_INTERVAL: Duration = Duration::from_millis(5);
/// Events taken into one round at most; the rest wait for the next.
const MAX_ROUND_EVENTS: usize = 4096;

struct WriteRequest {
    events: Vec<AuditEvent>,
    done: tokio::sync::oneshot::Sender<Result<usize, StoreError>>,
}

impl EventWriter {
    pub fn start(
        store: Arc<dyn Store>,
        layout: Layout,
        outbox: Arc<Interest>,
        metrics: Arc<ControlMetrics>,
    ) -> Self {
        let (tx, mut rx) = tokio::sync::mpsc::channel::<WriteRequest>(1024);
        tokio::spawn(async move {
            while let Some(first) = rx.recv().await {
                let started = tokio::time::Instant::now();
                let mut requests = vec![first];
                let mut count = requests[0].events.len();
                while count < MAX_ROUND_EVENTS {
                    match rx.try_recv() {
                        Ok(r) => {
                            count += r.events.len();
                            requests.push(r);
                        }
                        Err(_) => break,
                    }
                }
                let mut events = Vec::with_capacity(count);
                let mut counts = Vec::with_capacity(requests.len());
                let mut replies = Vec::with_capacity(requests.len());
                for r in requests {
                    counts.push(r.events.iter().filter(|e| !e.id.is_empty()).count());
                    events.extend(r.events);
                    replies.push(r.done);
                }
                let result = write_events(store.as_ref(), &layout, events, Some(&outbox)).await;
                let stored: usize = counts.iter().sum();
                match &result {
                    Ok(_) => metrics.events_stored.inc_by(stored as u64),
                    Err(_) => metrics.event_write_failures.inc_by(stored as u64),
                };
                for (done, n) in replies.into_iter().zip(counts) {
                    let reply = match &result {
                        Ok(_) => Ok(n),
                        Err(e) => Err(StoreError::Unavailable(e.to_string())),
                    };
                    let _ = done.send(reply);
                }
                tokio::time::sleep_until(started + MIN_WRITE_INTERVAL).await;
            }
        });
        Self { tx }
    }

    /// Returns once the events are durably written (with their outbox entries).
    pub async fn write(&self, events: Vec<AuditEvent>) -> Result<usize, StoreError> {
        let (done, reply) = tokio::sync::oneshot::channel();
        self.tx
            .send(WriteRequest { events, done })
            .await
            .map_err(|_| StoreError::Unavailable("the event writer stopped".into()))?;
        reply.await.map_err(|_| StoreError::Unavailable("the event writer stopped".into()))?
    }
}

fn op_size(op: &TxnOp) -> usize {
    match op {
        TxnOp::Put { key, value, .. } => key.len() + value.len(),
        TxnOp::Delete { key } => key.len(),
        TxnOp::DeletePrefix { prefix } => prefix.len(),
        TxnOp::DeleteRange { start, end } => start.len() + end.len(),
    }
}

/// Decodes a stored event; `None` (with a warning) for one this release cannot read.
pub fn decode(kv: &KeyValue) -> Option<AuditEvent> {
    match serde_json::from_slice(&kv.value) {
        Ok(event) => Some(event),
        Err(e) => {
            warn!(key = %kv.key, error = %e, "unreadable audit entry; skipped");
            None
        }
    }
}

/// Whether a watched put is an event's first write rather than a redelivery's rewrite.
pub fn is_new(kind: EventKind, kv: &KeyValue) -> bool {
    kind == EventKind::Put && kv.version == 1
}

// === retention ===

/// Campaigns for the audit-retention election with the replica's `lease` and, while
/// leading, keeps the log within `retention`. Runs for the life of the replica.
pub async fn run_retention(
    store: Arc<dyn Store>,
    layout: Layout,
    lease: LeaseId,
    candidate: String,
    retention: AuditRetention,
) {
    let election = layout.audit_retention_election();
    loop {
        let leadership =
            match election::campaign(Arc::clone(&store), &election, &candidate, lease).await {
                Ok(leadership) => leadership,
                Err(e) => {
                    warn!(error = %e, "audit retention: campaign failed; retrying");
                    tokio::time::sleep(RETRY_DELAY).await;
                    continue;
                }
            };
        info!("audit retention: this replica prunes the audit log");
        tokio::select! {
            result = lead(store.as_ref(), &layout, &leadership, retention) => {
                if let Err(e) = result {
                    warn!(error = %e, "audit retention stopped; campaigning again");
                }
            }
            lost = leadership.lost() => {
                match lost {
                    Ok(()) => info!("audit retention: leadership lost"),
                    Err(e) => warn!(error = %e, "audit retention: cannot watch leadership"),
                }
            }
        }
        // Leaving the queue lets another replica take over at once; if our lease is gone
        // the key went with it and this fails harmlessly.
        let _ = leadership.resign().await;
        tokio::time::sleep(RETRY_DELAY).await;
    }
}

/// The leader's loop: prune now, then whenever the watched count passes the bound (at most
/// once per [`PRUNE_DEBOUNCE`]) and on every age sweep.
async fn lead(
    store: &dyn Store,
    layout: &Layout,
    leadership: &Leadership,
    retention: AuditRetention,
) -> Result<(), StoreError> {
    let prefix = layout.audit_prefix();
    let (mut count, revision) = prune(store, layout, leadership, retention, None).await?;
    let mut watch = store.watch(&prefix, revision + 1).await?;
    let mut sweep = tokio::time::interval(PRUNE_INTERVAL);
    sweep.reset();
    let mut next_allowed = tokio::time::Instant::now() + PRUNE_DEBOUNCE;
    loop {
        let over = count > retention.max_entries;
        // The watched count drives the prunes of a flood; the sweeps (and a broken watch)
        // count afresh, which also corrects the few puts a prune's own listing missed.
        let known = tokio::select! {
            batch = watch.next() => match batch {
                Some(Ok(batch)) => {
                    for e in &batch.events {
                        match e.kind {
                            EventKind::Put if e.kv.version == 1 => count += 1,
                            EventKind::Delete => count = count.saturating_sub(1),
                            EventKind::Put => {}
                        }
                    }
                    continue;
                }
                // Compacted history or a broken watch: re-count from a fresh listing.
                Some(Err(e)) => {
                    debug!(error = %e, "audit watch interrupted; re-counting");
                    None
                }
                None => {
                    debug!("audit watch ended; re-counting");
                    None
                }
            },
            _ = sweep.tick() => None,
            _ = tokio::time::sleep_until(next_allowed), if over => Some(count),
        };
        let (remaining, revision) = prune(store, layout, leadership, retention, known).await?;
        count = remaining;
        watch = store.watch(&prefix, revision + 1).await?;
        next_allowed = tokio::time::Instant::now() + PRUNE_DEBOUNCE;
    }
}

/// Keys read per listing while pruning.
const PRUNE_PAGE: usize = 1000;

/// Deletes entries older than the age bound and the oldest beyond the count bound. Returns
/// the entries left and the revision of the last delete (or of the listing, when nothing
/// goes). Only keys are read, a page at a time: in an outage storm this runs every second
/// on a full log. Keys sort by time, so what goes is the log's first keys: each page's
/// doomed keys go as one key range, one transaction per page where a delete per key took
/// one per 128 entries (on etcd a Raft round each). A range per page, not one for the
/// whole prune, keeps each revision's delete events, which every watcher of the log
/// receives in one message, at a page's worth. Each delete is fenced on this replica still
/// leading, so a deposed leader cannot prune on stale knowledge. A key written into a
/// range after the listing (a node resending an old batch) goes with it: it is older than
/// every entry kept. `known` is the number of entries when the caller has been counting
/// them (from the watch); otherwise they are counted here, which on the embedded store
/// means walking every key of the log.
async fn prune(
    store: &dyn Store,
    layout: &Layout,
    leadership: &Leadership,
    retention: AuditRetention,
    known: Option<usize>,
) -> Result<(usize, Revision), StoreError> {
    let prefix = layout.audit_prefix();
    let total = match known {
        Some(n) => n,
        None => store.count(&prefix).await?.0,
    };
    let mut page = store.list_keys(&prefix, &prefix, PRUNE_PAGE).await?;
    let mut revision = page.revision;
    let cutoff =
        now_ms().saturating_sub(i64::try_from(retention.max_age.as_millis()).unwrap_or(i64::MAX));
    let too_old = layout.audit(cutoff, "");
    // Everything before `too_old`, and the first `total - max` keys.
    let excess = total.saturating_sub(retention.max_entries);
    let fence = Compare {
        key: leadership.key().to_owned(),
        op: CompareOp::Equal,
        target: CompareTarget::CreateRevision(leadership.revision()),
    };
    let mut doomed = 0_usize;
    let mut start = prefix.clone();
    loop {
        let before = doomed;
        let mut last = None;
        for key in page.keys {
            if doomed >= excess && key >= too_old {
                break;
            }
            doomed += 1;
            last = Some(key);
        }
        let Some(last) = last else { break };
        // `last` plus the smallest suffix: the range ends just after it.
        let end = format!("{last}\0");
        let delete = TxnOp::DeleteRange { start, end: end.clone() };
        let txn = Txn { compare: vec![fence.clone()], success: vec![delete], failure: vec![] };
        let result = store.txn(txn).await?;
        if !result.succeeded {
            return Err(StoreError::LeaseNotFound(leadership.lease()));
        }
        revision = result.revision;
        // Read on only past a full page that was doomed to the last key.
        if doomed - before < PRUNE_PAGE {
            break;
        }
        page = store.list_keys(&prefix, &end, PRUNE_PAGE).await?;
        start = end;
    }
    if doomed == 0 {
        return Ok((total, revision));
    }
    let kept = total.saturating_sub(doomed);
    info!(pruned = doomed, kept, "audit log pruned");
    Ok((kept, revision))
}

#[cfg(test)]
mod tests {
    #![allow(clippy::unwrap_used)]
    use super::*;

    fn event(id: &str) -> AuditEvent {
        AuditEvent {
            id: id.into(),
            at_unix_ms: now_ms(),
            node_id: "n".into(),
            key_id: "k".into(),
            requested_model: "a".into(),
            served_model: "b".into(),
            attempts: vec![],
            stream: false,
            status: 200,
            degraded: String::new(),
            request_id: String::new(),
            lost: None,
        }
    }

    #[tokio::test]
    async fn an_event_is_queued_for_a_subscription_the_replicas_cache_has_not_seen_yet() {
        use crate::store::embedded::EmbeddedStore;
        let dir = tempfile::tempdir().unwrap();
        let store: Arc<dyn Store> = Arc::new(EmbeddedStore::open(dir.path()).await.unwrap());
        let layout = Layout::new("/t");
        // A cache that never hears of the catalog: the most a replica can lag.
        let interest = Interest::new(crate::fanout::ConfigCache::new());
        assert_eq!(
            write_events(store.as_ref(), &layout, vec![event("ev1")], Some(&interest))
                .await
                .unwrap(),
            1
        );
        assert_eq!(
            store.count(&layout.outbox_prefix()).await.unwrap().0,
            0,
            "nobody subscribed yet"
        );

        let catalog = serde_json::json!({"webhooks": [{"name": "hook", "url": "http://127.0.0.1:1/", "events": ["*"], "internal": true}]});
        store.put(&layout.catalog(), serde_json::to_vec(&catalog).unwrap(), None).await.unwrap();
        let events = vec![event("ev2"), event("ev3")];
        assert_eq!(
            write_events(store.as_ref(), &layout, events, Some(&interest)).await.unwrap(),
            2
        );
        let queued = store.list(&layout.outbox_prefix()).await.unwrap().kvs;
        let ids: Vec<String> = queued
            .iter()
            .map(|kv| serde_json::from_slice::<OutboxEntry>(&kv.value).unwrap().id)
            .collect();
        assert_eq!(ids, ["ev2", "ev3"], "both queued for the new subscription");
        assert_eq!(store.count(&layout.audit_prefix()).await.unwrap().0, 3, "each stored once");

        // Removed: the next event is decided on the store's catalog again.
        store.put(&layout.catalog(), b"{}".to_vec(), None).await.unwrap();
        write_events(store.as_ref(), &layout, vec![event("ev4")], Some(&interest)).await.unwrap();
        assert_eq!(store.count(&layout.outbox_prefix()).await.unwrap().0, 2);
    }

    #[tokio::test]
    async fn prune_reads_page_after_page_until_both_bounds_hold() {
        use crate::store::embedded::EmbeddedStore;
        let dir = tempfile::tempdir().unwrap();
        let store: Arc<dyn Store> = Arc::new(EmbeddedStore::open(dir.path()).await.unwrap());
        let layout = Layout::new("/t");
        let now = now_ms();
        // 2,600 entries (more than two pages), the 1,300 oldest past an age bound of 60 s.
        let events: Vec<AuditEvent> = (0..2_600_i64)
            .map(|i| {
                let age_ms = if i < 1_300 { 3_600_000 } else { 0 };
                AuditEvent {
                    id: format!("ev{i:05}"),
                    at_unix_ms: now - age_ms - 10_000 + i,
                    node_id: "n".into(),
                    key_id: "k".into(),
                    requested_model: "a".into(),
                    served_model: "b".into(),
                    attempts: vec![],
                    stream: false,
                    status: 200,
                    degraded: String::new(),
                    request_id: String::new(),
                    lost: None,
                }
            })
            .collect();
        assert_eq!(write_events(store.as_ref(), &layout, events, None).await.unwrap(), 2_600);
        let lease = store.grant_lease(Duration::from_secs(60)).await.unwrap();
        let election = layout.audit_retention_election();
        let leadership =
            election::campaign(Arc::clone(&store), &election, "me", lease).await.unwrap();
        let by_age = AuditRetention { max_entries: 1_000_000, max_age: Duration::from_secs(60) };
        let before = store.current_revision().await.unwrap();
        let (kept, revision) =
            prune(store.as_ref(), &layout, &leadership, by_age, None).await.unwrap();
        assert_eq!(kept, 1_300, "the old half went, over two pages");
        assert_eq!(revision, before + 2, "one transaction per page of keys");
        let oldest =
            store.list_keys(&layout.audit_prefix(), &layout.audit_prefix(), 1).await.unwrap();
        assert!(oldest.keys[0].ends_with("ev01300"), "{:?}", oldest.keys);

        let by_count = AuditRetention { max_entries: 100, max_age: Duration::from_secs(60) };
        // A count the caller kept (from the watch) is trusted, not recounted.
        let (kept, _) =
            prune(store.as_ref(), &layout, &leadership, by_count, Some(200)).await.unwrap();
        assert_eq!(kept, 100);
        assert_eq!(store.count(&layout.audit_prefix()).await.unwrap().0, 1_200, "100 went");
        let (kept, _) = prune(store.as_ref(), &layout, &leadership, by_count, None).await.unwrap();
        assert_eq!(kept, 100, "the oldest beyond the count went, over two pages");
        let left = store.list(&layout.audit_prefix()).await.unwrap().kvs;
        let ids: Vec<String> = left.iter().map(|kv| decode(kv).unwrap().id).collect();
        let newest: Vec<String> = (2_500..2_600).map(|i| format!("ev{i:05}")).collect();
        assert_eq!(ids, newest, "the newest 100 are kept, in order");

        // Within both bounds, nothing more goes.
        let retention = AuditRetention { max_entries: 100, max_age: Duration::from_secs(3_600) };
        assert_eq!(
            prune(store.as_ref(), &layout, &leadership, retention, None).await.unwrap().0,
            100
        );

        // Only the age bound: every entry is past 1 ms... once a moment has passed.
        tokio::time::sleep(Duration::from_millis(20)).await;
        let retention =
            AuditRetention { max_entries: 1_000_000, max_age: Duration::from_millis(1) };
        assert_eq!(
            prune(store.as_ref(), &layout, &leadership, retention, None).await.unwrap().0,
            0
        );
    }
}
