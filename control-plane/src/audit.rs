//! The audit log of failover events (`api:model_failover`, `api:degraded_response`) and
//! of nodes' counts of lost events (`events.lost`), as nodes report them.
//!
//! ## On the store
//!
//! Events are stored in batches, one store value per batch (one per write transaction of
//! the group-committing [`EventWriter`], up to about `MAX_TXN_BYTES`, far below etcd's
//! 1.5 MiB request limit), so that a storm costs the store one put per ~1 MiB of events
//! rather than one key per event:
//!
//! - key `audit/<newest at_unix_ms, 13 digits>-batch_<id>_<count>` ([`Layout::audit_batch`]):
//!   key order is the order of the batches' newest events, and the key says how many events
//!   the value holds, so retention counts events from keys alone
//!   ([`crate::layout::events_in_key`]). `<id>` is 24 hex digits of a SHA-256 over the
//!   batch's sorted event ids ([`crate::events::batch_id`]).
//! - value: a JSON array of [`AuditEvent`] objects (unknown fields tolerated).
//! - the webhook outbox likewise: `webhooks/outbox/<newest>-batch_<id>_<count>` holding a
//!   JSON array of the batch's [`OutboxEntry`]s that some subscription wants, written in
//!   the same transaction.
//!
//! Values written before batches (`audit/<at_unix_ms>-<event id>`, one JSON object) and
//! single outbox entries (breaker and node events, redeliveries) are read alike
//! ([`crate::events::decode_entries`]).
//!
//! Deduplication: a node holds events until acked and may resend them. A batch resent
//! whole gets the same id, so the same key is written again; a rewrite bumps the key's
//! `version`, and readers of the watch treat only a key's first write (`version == 1`) as
//! new. A resent event that lands in a batch of other composition (its ack was lost and a
//! round mixed it with other events) is stored twice; readers deduplicate by event id
//! (`switchyard events`), and webhook receivers by `webhook-id`, as at-least-once delivery
//! asks of them anyway.
//!
//! Retention (at most [`AuditRetention::max_entries`] events, none older than
//! [`AuditRetention::max_age`]) deletes whole batches from the front of the log (a batch
//! whose newest event is past the age, or that the count bound passes entirely), and
//! rewrites the one batch a bound cuts through without its dropped events, under a key
//! marked `t` after its count ([`Layout::audit_batch_trimmed`]) so that watchers do not
//! take its events for new ones. An old event in
//! a batch further on (a node's spool drained long after) goes when its batch does. It runs
//! on one replica, the leader of an election over the
//! replicas' leases: the leader watches the log, so it prunes as soon as the count bound is
//! passed, and sweeps for age every [`PRUNE_INTERVAL`].

use std::sync::Arc;
use std::time::Duration;

use tracing::{debug, info, warn};

use switchyard_time::now_ms;

use crate::events::{
    AuditEvent, Interest, OutboxEntry, batch_id, decode_entries, encode_batch, restored,
};
use crate::layout::{Layout, batch_trimmed, events_in_key};
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

/// Writes every event durably, in transactions of about `MAX_TXN_BYTES`, each one audit
/// batch and one outbox batch (see the module doc). With `outbox`, an event some webhook subscribes to is queued
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
    // Keyed as `Layout::audit` keys an event (its time, floored at 0, and its id), without
    // formatting a key per event: a storm's round holds thousands.
    let mut seen = std::collections::HashSet::with_capacity(events.len());
    let keep: Vec<bool> = events
        .iter()
        .map(|event| {
            if event.id.is_empty() {
                warn!(node = %event.node_id, "failover event without an id; not recorded");
                return false;
            }
            seen.insert((event.at_unix_ms.max(0), event.id.as_str()))
        })
        .collect();
    drop(seen);
    let mut keep = keep.into_iter();
    let events: Vec<AuditEvent> =
        events.into_iter().filter(|_| keep.next().unwrap_or(false)).collect();
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
    let mut batch = Batch::default();
    // One buffer for every event's JSON, reused: the batch copies it into its own array.
    let mut audit = Vec::with_capacity(512);
    for &event in events {
        audit.clear();
        serde_json::to_writer(&mut audit, event)
            .map_err(|e| StoreError::InvalidRequest(format!("cannot encode event: {e}")))?;
        let wanted = webhooks
            .as_ref()
            .is_some_and(|w| w.iter().any(|w| w.wants(event.event_type(), &event.key_id)));
        let outbox = if wanted {
            let entry = OutboxEntry::from_audit(event, now);
            Some(serde_json::to_vec(&entry).map_err(|e| {
                StoreError::InvalidRequest(format!("cannot encode outbox entry: {e}"))
            })?)
        } else {
            None
        };
        let size = audit.len() + outbox.as_ref().map_or(0, Vec::len) + 2;
        if !batch.events.is_empty() && batch.bytes + size > MAX_TXN_BYTES {
            let (txn, held) = std::mem::take(&mut batch).into_txn(layout, &guard);
            txns.push(txn);
            members.push(held);
        }
        batch.bytes += size;
        batch.newest = batch.newest.max(event.at_unix_ms);
        batch.audit.push(if batch.audit.is_empty() { b'[' } else { b',' });
        batch.audit.extend_from_slice(&audit);
        if let Some(outbox) = outbox {
            batch.outbox.push(outbox);
            batch.outbox_ids.push(event.id.as_str());
        }
        batch.events.push(event);
    }
    if !batch.events.is_empty() {
        let (txn, held) = batch.into_txn(layout, &guard);
        txns.push(txn);
        members.push(held);
    }
    Ok((txns, members))
}

/// The events of one transaction, encoded.
#[derive(Default)]
struct Batch<'e> {
    events: Vec<&'e AuditEvent>,
    /// The JSON array of the events' entries as it is built: `[` and the entries so far,
    /// comma-separated, without the closing `]`.
    audit: Vec<u8>,
    outbox: Vec<Vec<u8>>,
    outbox_ids: Vec<&'e str>,
    newest: i64,
    bytes: usize,
}

impl<'e> Batch<'e> {
    /// One put of the audit batch, and one of the outbox batch if any event is wanted.
    fn into_txn(mut self, layout: &Layout, guard: &[Compare]) -> (Txn, Vec<&'e AuditEvent>) {
        let id = batch_id(self.events.iter().map(|e| e.id.as_str()));
        let key = layout.audit_batch(self.newest, &id, self.events.len());
        self.audit.push(b']');
        let mut success = vec![TxnOp::Put { key, value: self.audit, lease: None }];
        if !self.outbox.is_empty() {
            let id = batch_id(self.outbox_ids.into_iter());
            let key = layout.outbox_batch(self.newest, &id, self.outbox.len());
            success.push(TxnOp::Put { key, value: encode_batch(&self.outbox), lease: None });
        }
        (Txn { compare: guard.to_vec(), success, failure: vec![] }, self.events)
    }
}

/// Writes the event batches of every node stream on this replica as a group ("group
/// commit"): one round of transactions at a time, taking every batch that arrived while the
/// previous round was being written, and rounds at least [`MIN_WRITE_INTERVAL`] apart. In an
/// outage storm, when every request fails over on every node, the store then sees a bounded
/// number of transactions per second (about `1 / MIN_WRITE_INTERVAL`, plus one per
/// `MAX_TXN_BYTES` of events), however many nodes and batches there are; each batch is
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
                // The metric counts failover events; an `events.lost` entry is a count of
                // events that never arrived.
                let mut stored = 0;
                for r in requests {
                    counts.push(r.events.iter().filter(|e| !e.id.is_empty()).count());
                    stored +=
                        r.events.iter().filter(|e| !e.id.is_empty() && e.lost.is_none()).count();
                    events.extend(r.events);
                    replies.push(r.done);
                }
                let result = write_events(store.as_ref(), &layout, events, Some(&outbox)).await;
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

/// Decodes a stored value (a batch, or one event as older releases wrote it); none (with
/// a warning) for one this release cannot read.
pub fn decode(kv: &KeyValue) -> Vec<AuditEvent> {
    match decode_entries(&kv.value) {
        Ok(events) => events.into_iter().map(restored).collect(),
        Err(e) => {
            warn!(key = %kv.key, error = %e, "unreadable audit entry; skipped");
            Vec::new()
        }
    }
}

/// Whether a watched put holds new events: its key's first write (a rewrite is a node's
/// resend), and not what retention left of a batch.
pub fn is_new(kind: EventKind, kv: &KeyValue) -> bool {
    kind == EventKind::Put && kv.version == 1 && !batch_trimmed(&kv.key)
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
                            EventKind::Put if e.kv.version == 1 => count += events_in_key(&e.kv.key),
                            EventKind::Delete => count = count.saturating_sub(events_in_key(&e.kv.key)),
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

/// Events in the log, from its keys (a batch's key says how many it holds).
async fn count_events(store: &dyn Store, prefix: &str) -> Result<usize, StoreError> {
    let mut total = 0;
    let mut start = prefix.to_owned();
    loop {
        let page = store.list_keys(prefix, &start, PRUNE_PAGE).await?;
        let full = page.keys.len() == PRUNE_PAGE;
        total += page.keys.iter().map(|k| events_in_key(k)).sum::<usize>();
        match page.keys.last() {
            Some(last) if full => start = format!("{last}\0"),
            _ => return Ok(total),
        }
    }
}

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
        None => count_events(store, &prefix).await?,
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
    // The first key not wholly doomed, when it may hold some doomed events.
    let mut boundary = None;
    loop {
        let mut doomed_keys = 0;
        let mut last = None;
        for key in page.keys {
            let n = events_in_key(&key);
            // A key before `too_old` holds only events past the age (its time is its
            // newest event's); otherwise a key goes whole only if the count allows.
            if key >= too_old && doomed + n > excess {
                boundary = Some(key);
                break;
            }
            doomed += n;
            doomed_keys += 1;
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
        if doomed_keys < PRUNE_PAGE {
            break;
        }
        page = store.list_keys(&prefix, &end, PRUNE_PAGE).await?;
        start = end;
    }
    if let Some(key) = boundary
        && let Some((trimmed, rev)) =
            trim(store, layout, &fence, &key, excess.saturating_sub(doomed), cutoff).await?
    {
        doomed += trimmed;
        revision = rev;
    }
    if doomed == 0 {
        return Ok((total, revision));
    }
    let kept = total.saturating_sub(doomed);
    info!(pruned = doomed, kept, "audit log pruned");
    Ok((kept, revision))
}

/// The batch at `key` holds some events retention drops: its `excess` oldest and those
/// older than `cutoff`. It is replaced by a batch of the rest (a new key: its count and
/// id change), fenced like every prune. Returns how many went, and the revision.
async fn trim(
    store: &dyn Store,
    layout: &Layout,
    fence: &Compare,
    key: &str,
    excess: usize,
    cutoff: i64,
) -> Result<Option<(usize, Revision)>, StoreError> {
    let Some(kv) = store.get(key).await? else { return Ok(None) };
    let mut events = decode(&kv);
    let before = events.len();
    events.sort_by(|a, b| (a.at_unix_ms, &a.id).cmp(&(b.at_unix_ms, &b.id)));
    let events: Vec<AuditEvent> =
        events.into_iter().skip(excess).filter(|e| e.at_unix_ms >= cutoff).collect();
    let gone = before - events.len();
    if gone == 0 {
        return Ok(None);
    }
    let mut success = vec![TxnOp::Delete { key: key.to_owned() }];
    if !events.is_empty() {
        let encoded = events
            .iter()
            .map(serde_json::to_vec)
            .collect::<Result<Vec<_>, _>>()
            .map_err(|e| StoreError::InvalidRequest(format!("cannot encode event: {e}")))?;
        let newest = events.iter().map(|e| e.at_unix_ms).max().unwrap_or(cutoff);
        let id = batch_id(events.iter().map(|e| e.id.as_str()));
        let key = layout.audit_batch_trimmed(newest, &id, events.len());
        success.push(TxnOp::Put { key, value: encode_batch(&encoded), lease: None });
    }
    // Unchanged since read: a node's resend rewriting it meanwhile is not undone.
    let compare = vec![fence.clone(), Compare::mod_revision(key, kv.mod_revision)];
    let result = store.txn(Txn { compare, success, failure: vec![] }).await?;
    Ok(result.succeeded.then_some((gone, result.revision)))
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
            continued: vec![],
            surface: String::new(),
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
            .flat_map(|kv| decode_entries::<OutboxEntry>(&kv.value).unwrap())
            .map(|e| e.id)
            .collect();
        assert_eq!(ids, ["ev2", "ev3"], "both queued for the new subscription");
        assert_eq!(
            count_events(store.as_ref(), &layout.audit_prefix()).await.unwrap(),
            3,
            "each stored once"
        );

        // Removed: the next event is decided on the store's catalog again.
        store.put(&layout.catalog(), b"{}".to_vec(), None).await.unwrap();
        write_events(store.as_ref(), &layout, vec![event("ev4")], Some(&interest)).await.unwrap();
        assert_eq!(count_events(store.as_ref(), &layout.outbox_prefix()).await.unwrap(), 2);
    }

    #[tokio::test]
    async fn events_are_stored_one_value_per_batch_and_pruned_by_their_count() {
        use crate::store::embedded::EmbeddedStore;
        let dir = tempfile::tempdir().unwrap();
        let store: Arc<dyn Store> = Arc::new(EmbeddedStore::open(dir.path()).await.unwrap());
        let layout = Layout::new("/t");
        let cache = crate::fanout::ConfigCache::new();
        let interest = Interest::new(cache);
        let catalog = serde_json::json!({"webhooks": [{"name": "hook", "url": "http://127.0.0.1:1/", "events": ["api:model_failover"], "internal": true}]});
        store.put(&layout.catalog(), serde_json::to_vec(&catalog).unwrap(), None).await.unwrap();
        let mut last = Vec::new();
        for b in 0..10 {
            let events: Vec<AuditEvent> =
                (0..100).map(|i| event(&format!("ev{b}-{i:03}"))).collect();
            last = events.clone();
            write_events(store.as_ref(), &layout, events, Some(&interest)).await.unwrap();
        }
        let audit = store.list(&layout.audit_prefix()).await.unwrap().kvs;
        assert_eq!(audit.len(), 10, "one value per batch");
        assert!(audit.iter().all(|kv| events_in_key(&kv.key) == 100), "{}", audit[0].key);
        assert_eq!(audit.iter().map(|kv| decode(kv).len()).sum::<usize>(), 1_000);
        let outbox = store.list(&layout.outbox_prefix()).await.unwrap().kvs;
        assert_eq!(outbox.len(), 10, "the outbox likewise");
        let entries: Vec<OutboxEntry> = decode_entries(&outbox[0].value).unwrap();
        assert_eq!(entries.len(), 100);

        // A node resending a batch whole writes the same key: still 1,000 events.
        write_events(store.as_ref(), &layout, last, None).await.unwrap();
        assert_eq!(count_events(store.as_ref(), &layout.audit_prefix()).await.unwrap(), 1_000);

        let lease = store.grant_lease(Duration::from_secs(60)).await.unwrap();
        let election = layout.audit_retention_election();
        let leadership =
            election::campaign(Arc::clone(&store), &election, "me", lease).await.unwrap();
        let retention = AuditRetention { max_entries: 350, max_age: Duration::from_secs(3_600) };
        let (kept, _) = prune(store.as_ref(), &layout, &leadership, retention, None).await.unwrap();
        // Batches go whole, oldest first, and the one the bound cuts through is trimmed.
        assert_eq!(kept, 350);
        assert_eq!(count_events(store.as_ref(), &layout.audit_prefix()).await.unwrap(), 350);
        let left = store.list(&layout.audit_prefix()).await.unwrap().kvs;
        assert_eq!(left.len(), 4);
        assert!(batch_trimmed(&left[0].key), "{}", left[0].key);
        assert!(!is_new(EventKind::Put, &left[0]), "its events are not new to a follower");
        let mut first: Vec<String> = decode(&left[0]).into_iter().map(|e| e.id).collect();
        first.sort();
        assert_eq!((first.len(), first[0].as_str()), (50, "ev6-050"), "the newest 50 of it");
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
                    ..event("")
                }
            })
            .collect();
        // One key per event, as releases before batched storage wrote them (still read and
        // pruned): enough keys for several pages.
        for chunk in events.chunks(crate::layout::MAX_TXN_OPS) {
            let success = chunk
                .iter()
                .map(|e| TxnOp::Put {
                    key: layout.audit(e.at_unix_ms, &e.id),
                    value: serde_json::to_vec(e).unwrap(),
                    lease: None,
                })
                .collect();
            store.txn(Txn { compare: vec![], success, failure: vec![] }).await.unwrap();
        }
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
        let ids: Vec<String> = left.iter().map(|kv| decode(kv)[0].id.clone()).collect();
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
