//! The leader's delivery loop.
//!
//! Every replica campaigns in the `elections/webhooks` election; the leader alone delivers.
//! It keeps the outbox in memory (a listing, then a watch from the listing's revision) in
//! create-revision order, and runs one worker task per subscription:
//!
//! - A worker owns its subscription's [`SubscriptionState`] and its own queue of the
//!   entries past its cursor that the subscription wants (each new entry of the shared view
//!   is looked at once), so its work follows its own events, not the outbox's size: a storm
//!   for one subscription does not starve another. It sends the queued entries, up to
//!   `concurrency` requests at once (each one event, or up to `batch_max_events` as a JSON
//!   array), each bounded by the request timeout, over the subscription's own connection
//!   pool. A slow or dead endpoint only ever holds its own worker.
//! - The cursor moves over the contiguous prefix of entries that are done (delivered, dead,
//!   or not for this subscription); entries delivered beyond it are remembered in memory.
//! - A failed attempt (timeout, connection error, 408, 429, 5xx) puts the whole
//!   subscription into backoff: exponential from `min_backoff`, capped at `max_backoff`,
//!   full jitter, and never shorter than the endpoint's `Retry-After`. While it is failing
//!   the worker sends one request at a time (a probe, preferring events that have not
//!   failed yet), so a dead endpoint gets one request per backoff period, not one per
//!   event, and one event it keeps rejecting does not hold back the rest; the first 2xx
//!   resumes full speed.
//! - After each failed attempt, every owed event older than `max_age` (counted from when
//!   the control plane stored it) becomes a dead letter; any other answer (a 4xx: the
//!   receiver refused that event) makes a dead letter at once. Dead letters are kept
//!   until an admin redelivers them (`switchyard webhooks redeliver`).
//! - State is written at most every [`PERSIST_INTERVAL`] per subscription; every write the
//!   leader makes is fenced on its leadership, so a deposed leader writes nothing.
//!
//! The leader also deletes outbox entries every cursor has passed, at most
//! [`GC_MAX_TXNS`] transactions per [`GC_INTERVAL`].

use std::collections::{BTreeMap, BTreeSet, HashMap, HashSet};
use std::sync::Arc;
use std::sync::atomic::{AtomicI64, Ordering};
use std::time::Duration;

use bytes::Bytes;
use parking_lot::RwLock;
use tokio::sync::watch;
use tokio::task::JoinSet;
use tokio::time::Instant;
use tracing::{debug, info, warn};

use switchyard_backoff::Backoff;
use switchyard_catalog::{Catalog, Webhook};
use switchyard_time::now_ms;

use super::client::{self, Outcome, WebhookClient};
use super::signing::{batch_id, signing_key};
use super::state::{DeadLetter, PendingDelivery, SubscriptionState};
use crate::events::{OutboxEntry, decode_entries};
use crate::fanout::ConfigCache;
use crate::layout::{self, Layout, MAX_TXN_OPS};
use crate::metrics::{DeliveryOutcome, SubscriptionMetrics, WebhookMetrics};
use crate::store::election::{self, Leadership};
use crate::store::{
    Compare, CompareOp, CompareTarget, EventKind, LeaseId, Listing, Revision, Store, StoreError,
    Txn, TxnOp, WatchBatch,
};

/// How often a subscription's state is written at most.
pub const PERSIST_INTERVAL: Duration = Duration::from_millis(250);
/// How often delivered entries are deleted from the outbox.
pub const GC_INTERVAL: Duration = Duration::from_secs(1);
/// Delete transactions per GC pass, bounding the leader's store writes.
pub const GC_MAX_TXNS: usize = 8;
/// How often the leader looks for catalog changes in its config cache.
const CATALOG_POLL: Duration = Duration::from_millis(200);
/// Owed entries a worker looks at past its cursor; bounds what it remembers as done.
const WINDOW: usize = 2000;
/// Pending (failed at least once) events recorded in the stored state.
const MAX_PENDING_RECORDED: usize = 100;
const RETRY_DELAY: Duration = Duration::from_secs(2);

/// `--webhook-*` flags of `switchyard control`.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub struct DeliveryOptions {
    /// Owed events older than this become dead letters once the endpoint fails again.
    pub max_age: Duration,
    /// One request's time limit (connect, send, answer).
    pub timeout: Duration,
    /// Requests in flight per subscription.
    pub concurrency: usize,
    pub min_backoff: Duration,
    pub max_backoff: Duration,
}

impl Default for DeliveryOptions {
    fn default() -> Self {
        Self {
            max_age: Duration::from_secs(24 * 3600),
            timeout: Duration::from_secs(10),
            concurrency: 8,
            min_backoff: Duration::from_millis(500),
            max_backoff: Duration::from_secs(60),
        }
    }
}

/// Campaigns for the webhook election with the replica's `lease` and delivers while
/// leading. Runs for the life of the replica.
pub async fn run(
    store: Arc<dyn Store>,
    layout: Layout,
    cache: Arc<ConfigCache>,
    lease: LeaseId,
    candidate: String,
    options: DeliveryOptions,
    metrics: WebhookMetrics,
) {
    let election = layout.webhook_election();
    loop {
        let leadership =
            match election::campaign(Arc::clone(&store), &election, &candidate, lease).await {
                Ok(leadership) => leadership,
                Err(e) => {
                    warn!(error = %e, "webhooks: campaign failed; retrying");
                    tokio::time::sleep(RETRY_DELAY).await;
                    continue;
                }
            };
        info!("webhooks: this replica delivers webhooks");
        tokio::select! {
            result = lead(Arc::clone(&store), &layout, &cache, &leadership, options, &metrics) => {
                if let Err(e) = result {
                    warn!(error = %e, "webhook delivery stopped; campaigning again");
                }
            }
            lost = leadership.lost() => match lost {
                Ok(()) => info!("webhooks: leadership lost"),
                Err(e) => warn!(error = %e, "webhooks: cannot watch leadership"),
            },
        }
        let _ = leadership.resign().await;
        tokio::time::sleep(RETRY_DELAY).await;
    }
}

// === the outbox in memory ===

/// An outbox entry's place in delivery order: its create revision, then its key (one
/// transaction creates many entries at one revision). An entry of a batch value is keyed
/// `<batch key>#<index>`; a single entry by its key.
type Slot = (Revision, String);

/// The first slot after every entry created at or below `revision`.
fn after(revision: Revision) -> Slot {
    (revision + 1, String::new())
}

struct Queued {
    /// The store key of the value holding the entry (deleted once every entry it holds
    /// is done: they share its create revision, so cursors pass them together).
    key: String,
    entry: OutboxEntry,
}

#[derive(Default)]
struct OutboxView {
    /// Counts reloads: a worker's queue built from an earlier view is built again.
    epoch: u64,
    by_rev: BTreeMap<Slot, Arc<Queued>>,
    /// Store key → its create revision and its entries' slot keys.
    rev_of: HashMap<String, (Revision, Vec<String>)>,
    /// Every outbox change at or below this revision is in the view.
    horizon: Revision,
}

impl OutboxView {
    fn upsert(&mut self, key: &str, create_revision: Revision, value: &[u8]) {
        let batch = value.iter().find(|b| !b.is_ascii_whitespace()) == Some(&b'[');
        let entries = match decode_entries::<OutboxEntry>(value) {
            Ok(entries) => entries,
            Err(e) => {
                warn!(key, error = %e, "unreadable outbox entry; skipped");
                return;
            }
        };
        self.remove(key);
        let mut slots = Vec::with_capacity(entries.len());
        for (i, entry) in entries.into_iter().enumerate() {
            let slot = if batch { format!("{key}#{i:05}") } else { key.to_owned() };
            self.by_rev.insert(
                (create_revision, slot.clone()),
                Arc::new(Queued { key: key.to_owned(), entry }),
            );
            slots.push(slot);
        }
        self.rev_of.insert(key.to_owned(), (create_revision, slots));
    }

    fn remove(&mut self, key: &str) {
        if let Some((rev, slots)) = self.rev_of.remove(key) {
            for slot in slots {
                self.by_rev.remove(&(rev, slot));
            }
        }
    }
}

struct Shared {
    store: Arc<dyn Store>,
    layout: Layout,
    options: DeliveryOptions,
    /// Holds on every leader write: the leader's election key is still ours.
    fence: Compare,
    outbox: RwLock<OutboxView>,
    /// The view's horizon, to wake workers.
    changed: watch::Sender<Revision>,
    metrics: WebhookMetrics,
}

impl Shared {
    fn reload(&self, listing: &Listing) {
        let mut view = OutboxView::default();
        for kv in &listing.kvs {
            view.upsert(&kv.key, kv.create_revision, &kv.value);
        }
        view.horizon = listing.revision;
        let mut current = self.outbox.write();
        view.epoch = current.epoch + 1;
        *current = view;
        drop(current);
        self.changed.send_replace(listing.revision);
    }

    fn apply(&self, batch: &WatchBatch) {
        let horizon = {
            let mut view = self.outbox.write();
            for e in &batch.events {
                view.horizon = view.horizon.max(e.kv.mod_revision);
                match e.kind {
                    EventKind::Put => view.upsert(&e.kv.key, e.kv.create_revision, &e.kv.value),
                    EventKind::Delete => view.remove(&e.kv.key),
                }
            }
            view.horizon
        };
        self.changed.send_replace(horizon);
    }

    /// A fenced transaction; `Ok(false)` when this replica no longer leads.
    async fn write(&self, success: Vec<TxnOp>) -> Result<bool, StoreError> {
        let txn = Txn { compare: vec![self.fence.clone()], success, failure: vec![] };
        Ok(self.store.txn(txn).await?.succeeded)
    }
}

struct AbortOnDrop(tokio::task::JoinHandle<()>);

impl Drop for AbortOnDrop {
    fn drop(&mut self) {
        self.0.abort();
    }
}

struct WorkerHandle {
    webhook: Webhook,
    config: watch::Sender<Arc<SubConfig>>,
    /// The worker's cursor, for outbox GC.
    cursor: Arc<AtomicI64>,
    _task: AbortOnDrop,
}

/// A subscription as its worker uses it. The signing key is resolved from the
/// subscription's secret reference here, once per catalog change, and never logged.
struct SubConfig {
    webhook: Webhook,
    /// `Ok(None)`: no secret configured, deliveries go unsigned.
    key: Result<Option<Vec<u8>>, String>,
    client: WebhookClient,
}

impl SubConfig {
    fn new(webhook: Webhook) -> Self {
        let key = match &webhook.secret {
            None => {
                warn!(webhook = %webhook.name, "webhook has no secret; its deliveries are unsigned");
                Ok(None)
            }
            Some(reference) => reference
                .resolve()
                .map_err(|e| format!("secret {reference}: {e}"))
                .and_then(|s| signing_key(&s).map_err(|e| format!("secret {reference}: {e}")))
                .map(Some),
        };
        if let Err(e) = &key {
            warn!(webhook = %webhook.name, error = %e, "cannot sign deliveries; holding its events");
        }
        let client = client::build(webhook.internal);
        Self { webhook, key, client }
    }
}

/// The leader's loop: the outbox view, one worker per subscription, outbox GC.
async fn lead(
    store: Arc<dyn Store>,
    layout: &Layout,
    cache: &ConfigCache,
    leadership: &Leadership,
    options: DeliveryOptions,
    metrics: &WebhookMetrics,
) -> Result<(), StoreError> {
    let prefix = layout.outbox_prefix();
    let fence = Compare {
        key: leadership.key().to_owned(),
        op: CompareOp::Equal,
        target: CompareTarget::CreateRevision(leadership.revision()),
    };
    let listing = store.list(&prefix).await?;
    let (changed, _) = watch::channel(listing.revision);
    let shared = Arc::new(Shared {
        store: Arc::clone(&store),
        layout: layout.clone(),
        options,
        fence,
        outbox: RwLock::new(OutboxView::default()),
        changed,
        metrics: metrics.clone(),
    });
    shared.reload(&listing);
    let mut watch = store.watch(&prefix, listing.revision + 1).await?;
    let mut states: HashMap<String, SubscriptionState> = HashMap::new();
    for kv in store.list(&layout.webhook_state_prefix()).await?.kvs {
        match serde_json::from_slice::<SubscriptionState>(&kv.value) {
            Ok(state) => {
                let name = kv.key.trim_start_matches(&layout.webhook_state_prefix()).to_owned();
                states.insert(unescape(&name), state);
            }
            Err(e) => {
                warn!(key = %kv.key, error = %e, "unreadable webhook state; starting it afresh")
            }
        }
    }
    info!(outbox = listing.kvs.len(), "webhooks: outbox loaded");

    let mut workers: HashMap<String, WorkerHandle> = HashMap::new();
    let mut catalog_rev: Revision = -1;
    // GC goes by the workers' cursors: it must not run before the workers of the catalog's
    // subscriptions exist, or it would take every entry for nobody's. So the config cache
    // must hold the store's catalog, and a catalog must have been read, first.
    let mut synced = false;
    cache.wait_ready().await;
    let mut poll = tokio::time::interval(CATALOG_POLL);
    let mut gc = tokio::time::interval_at(Instant::now() + GC_INTERVAL, GC_INTERVAL);
    loop {
        tokio::select! {
            batch = watch.next() => match batch {
                Some(Ok(batch)) => shared.apply(&batch),
                other => {
                    if let Some(Err(e)) = other {
                        debug!(error = %e, "outbox watch interrupted; listing again");
                    }
                    let listing = store.list(&prefix).await?;
                    shared.reload(&listing);
                    watch = store.watch(&prefix, listing.revision + 1).await?;
                }
            },
            _ = poll.tick() => {
                let (webhooks, revision) = match cache.resource(layout::CATALOG) {
                    Some((bytes, revision)) if revision != catalog_rev => {
                        match serde_json::from_slice::<Catalog>(&bytes) {
                            Ok(catalog) => (catalog.webhooks, revision),
                            Err(e) => {
                                warn!(error = %e, "webhooks: unreadable catalog; keeping the subscriptions as they were");
                                catalog_rev = revision;
                                continue;
                            }
                        }
                    }
                    None if catalog_rev != 0 => (Vec::new(), 0),
                    _ => continue,
                };
                catalog_rev = revision;
                sync_workers(&shared, &mut workers, &mut states, webhooks, revision).await?;
                synced = true;
            }
            _ = gc.tick(), if synced => collect_garbage(&shared, &workers, catalog_rev).await?,
        }
    }
}

/// Starts, reconfigures and stops workers to match the catalog's subscriptions.
async fn sync_workers(
    shared: &Arc<Shared>,
    workers: &mut HashMap<String, WorkerHandle>,
    states: &mut HashMap<String, SubscriptionState>,
    webhooks: Vec<Webhook>,
    catalog_rev: Revision,
) -> Result<(), StoreError> {
    let names: HashSet<String> = webhooks.iter().map(|w| w.name.clone()).collect();
    let gone: Vec<String> = workers.keys().filter(|n| !names.contains(*n)).cloned().collect();
    for name in gone {
        workers.remove(&name);
        info!(webhook = %name, "webhook removed; its delivery state goes (dead letters stay)");
        if !shared.write(vec![TxnOp::Delete { key: shared.layout.webhook_state(&name) }]).await? {
            return Err(StoreError::LeaseNotFound(0));
        }
    }
    // States of subscriptions removed while no leader ran.
    let stale: Vec<String> = states.keys().filter(|n| !names.contains(*n)).cloned().collect();
    for name in stale {
        states.remove(&name);
        if !shared.write(vec![TxnOp::Delete { key: shared.layout.webhook_state(&name) }]).await? {
            return Err(StoreError::LeaseNotFound(0));
        }
    }
    for webhook in webhooks {
        if let Some(worker) = workers.get_mut(&webhook.name) {
            if worker.webhook != webhook {
                worker.webhook = webhook.clone();
                worker.config.send_replace(Arc::new(SubConfig::new(webhook)));
            }
            continue;
        }
        // A subscription seen for the first time starts where the apply that added it put
        // its state (the revision of the catalog before it: docs/webhooks.md, "A new
        // subscription"), so events stored while this leader's cache lagged are not
        // skipped; with no state stored (a catalog written by other means), with the events
        // stored after the catalog that holds it.
        let state = match states.remove(&webhook.name) {
            Some(state) => state,
            None => match shared.store.get(&shared.layout.webhook_state(&webhook.name)).await? {
                Some(kv) => {
                    serde_json::from_slice::<SubscriptionState>(&kv.value).unwrap_or_else(|_| {
                        SubscriptionState { cursor: catalog_rev, ..Default::default() }
                    })
                }
                None => SubscriptionState { cursor: catalog_rev, ..Default::default() },
            },
        };
        let (config, config_rx) = watch::channel(Arc::new(SubConfig::new(webhook.clone())));
        let cursor = Arc::new(AtomicI64::new(state.cursor));
        let worker = Worker::new(
            webhook.name.clone(),
            Arc::clone(shared),
            config_rx,
            Arc::clone(&cursor),
            state,
        );
        let name = webhook.name.clone();
        let task = tokio::spawn(async move {
            if let Err(e) = worker.run().await {
                warn!(webhook = %name, error = %e, "webhook worker stopped");
            }
        });
        workers.insert(
            webhook.name.clone(),
            WorkerHandle { webhook, config, cursor, _task: AbortOnDrop(task) },
        );
    }
    Ok(())
}

/// Deletes outbox entries every subscription is done with. `catalog_rev` is the catalog
/// revision the workers reflect: while the store holds a newer catalog, a subscription
/// added there may have no worker yet, and its cursor (stored by the apply that added it)
/// may be behind every worker's, so nothing is deleted until the workers catch up; each
/// delete is guarded on the catalog being the one checked.
async fn collect_garbage(
    shared: &Shared,
    workers: &HashMap<String, WorkerHandle>,
    catalog_rev: Revision,
) -> Result<(), StoreError> {
    let catalog_key = shared.layout.catalog();
    let stored = shared.store.get(&catalog_key).await?.map_or(0, |kv| kv.mod_revision);
    if stored > catalog_rev {
        return Ok(());
    }
    let guard = Compare::mod_revision(catalog_key, stored);
    let keys: Vec<String> = {
        let view = shared.outbox.read();
        let floor = workers
            .values()
            .map(|w| w.cursor.load(Ordering::Acquire))
            .min()
            .unwrap_or(view.horizon)
            .min(view.horizon);
        // A batch's entries are adjacent (one revision, one key prefix): one delete each.
        let mut keys: Vec<String> = Vec::new();
        for (_, q) in view.by_rev.range(..after(floor)) {
            if keys.last() != Some(&q.key) {
                if keys.len() == GC_MAX_TXNS * MAX_TXN_OPS {
                    break;
                }
                keys.push(q.key.clone());
            }
        }
        keys
    };
    for chunk in keys.chunks(MAX_TXN_OPS) {
        let success = chunk.iter().map(|key| TxnOp::Delete { key: key.clone() }).collect();
        let compare = vec![shared.fence.clone(), guard.clone()];
        // Refused: the catalog changed (the next pass, after the workers caught up, takes
        // it), or this replica no longer leads (its leadership watch ends the loop).
        if !shared.store.txn(Txn { compare, success, failure: vec![] }).await?.succeeded {
            return Ok(());
        }
        let mut view = shared.outbox.write();
        for key in chunk {
            view.remove(key);
        }
    }
    if !keys.is_empty() {
        debug!(deleted = keys.len(), "webhooks: delivered entries removed from the outbox");
    }
    Ok(())
}

// === one subscription ===

type Job = (Vec<Slot>, Outcome);

struct Worker {
    name: String,
    shared: Arc<Shared>,
    config: watch::Receiver<Arc<SubConfig>>,
    cursor_out: Arc<AtomicI64>,
    state: SubscriptionState,
    /// This subscription's own queue: the outbox entries past its cursor that it wants
    /// (and any in flight), taken from the shared view as they arrive. The worker's work
    /// is proportional to its own events, never to the whole outbox: a storm queued for
    /// another subscription (or one held by another's slow endpoint) costs it only the
    /// one look at each new entry (docs/webhooks.md, "Delivery").
    queue: BTreeMap<Slot, Arc<Queued>>,
    /// The view's entries up to this slot have been sorted into `queue`, under `epoch`
    /// and the subscription `filter` (a change of either builds the queue again).
    scanned: Option<Slot>,
    epoch: u64,
    filter: Option<Webhook>,
    /// The view's horizon when `queue` was last brought up to date.
    horizon: Revision,
    /// Entries past the cursor that are done.
    done: BTreeSet<Slot>,
    /// Entries that failed at least once.
    failed: BTreeMap<Slot, PendingDelivery>,
    in_flight: HashSet<Slot>,
    backoff_until: Instant,
    dirty: bool,
    last_persist: Instant,
    metrics: SubscriptionMetrics,
}

impl Worker {
    fn new(
        name: String,
        shared: Arc<Shared>,
        config: watch::Receiver<Arc<SubConfig>>,
        cursor_out: Arc<AtomicI64>,
        state: SubscriptionState,
    ) -> Self {
        let wait = u64::try_from(state.next_attempt_unix_ms - now_ms()).unwrap_or(0);
        let failed =
            state.pending.iter().map(|p| ((p.revision, p.key.clone()), p.clone())).collect();
        let metrics = shared.metrics.subscription(&name);
        Self {
            metrics,
            name,
            shared,
            config,
            cursor_out,
            horizon: state.cursor,
            state,
            queue: BTreeMap::new(),
            scanned: None,
            epoch: 0,
            filter: None,
            done: BTreeSet::new(),
            failed,
            in_flight: HashSet::new(),
            backoff_until: Instant::now() + Duration::from_millis(wait),
            dirty: true,
            last_persist: Instant::now() - PERSIST_INTERVAL,
        }
    }

    async fn run(mut self) -> Result<(), StoreError> {
        let mut changed = self.shared.changed.subscribe();
        let mut jobs: JoinSet<Job> = JoinSet::new();
        loop {
            let config = Arc::clone(&self.config.borrow_and_update());
            self.advance(&config.webhook);
            // What is queued past the cursor less what is done there (what is done is
            // queued): counted without a walk of the queue, which a storm makes long.
            self.metrics.queue_depth(self.queue.len().saturating_sub(self.done.len()));
            if config.webhook.enabled {
                self.start_jobs(&config, &mut jobs);
            }
            if self.dirty
                && self.last_persist.elapsed() >= PERSIST_INTERVAL
                && !self.persist().await?
            {
                return Ok(());
            }
            let now = Instant::now();
            let mut wake = now + Duration::from_secs(1);
            if self.dirty {
                wake = wake.min(self.last_persist + PERSIST_INTERVAL);
            }
            if self.backoff_until > now {
                wake = wake.min(self.backoff_until);
            }
            tokio::select! {
                joined = jobs.join_next(), if !jobs.is_empty() => match joined {
                    Some(Ok((revs, outcome))) => {
                        if !self.on_outcome(&config, revs, outcome).await? {
                            return Ok(());
                        }
                    }
                    // A delivery task cannot panic by design; if one did, what it carried
                    // is sent again.
                    _ => self.in_flight.clear(),
                },
                _ = changed.changed() => {}
                result = self.config.changed() => if result.is_err() {
                    return Ok(());
                },
                _ = tokio::time::sleep_until(wake) => {}
            }
        }
    }

    /// Brings the subscription's queue up to date with the shared view: looks once at each
    /// entry that arrived since the last call, keeping those it wants. A reloaded view or a
    /// changed subscription builds the queue again from the cursor (entries in flight
    /// stay, whatever the filter now says, until their outcome is known).
    fn sync_queue(&mut self, webhook: &Webhook) {
        let view = self.shared.outbox.read();
        if view.epoch != self.epoch || self.filter.as_ref() != Some(webhook) {
            self.queue.retain(|slot, _| self.in_flight.contains(slot));
            self.scanned = None;
            self.epoch = view.epoch;
            self.filter = Some(webhook.clone());
        }
        let from = match &self.scanned {
            Some(slot) => std::ops::Bound::Excluded(slot.clone()),
            None => std::ops::Bound::Included(after(self.state.cursor)),
        };
        for (slot, queued) in view.by_rev.range((from, std::ops::Bound::Unbounded)) {
            if webhook.enabled && queued.entry.is_for(webhook) {
                self.queue.insert(slot.clone(), Arc::clone(queued));
            }
            self.scanned = Some(slot.clone());
        }
        self.horizon = view.horizon;
    }

    /// Moves the cursor over the done, and the unwanted, entries at its head. The cursor is
    /// a revision: blocked by an entry created at revision B, it stops at B - 1 (every
    /// entry before that one in the order was passed, and revisions without entries are
    /// nothing to wait for).
    fn advance(&mut self, webhook: &Webhook) {
        self.sync_queue(webhook);
        let mut cursor = self.state.cursor;
        if !webhook.enabled {
            cursor = cursor.max(self.horizon);
            self.failed.clear();
        } else {
            // The queue holds what this subscription wants, and what was in flight when its
            // filter changed: such an entry holds the cursor only while still in flight.
            let blocked = self.queue.range(after(cursor)..).find(|(slot, queued)| {
                !self.done.contains(*slot)
                    && (self.in_flight.contains(*slot) || queued.entry.is_for(webhook))
            });
            cursor = match blocked {
                Some((slot, _)) => cursor.max(slot.0 - 1),
                None => cursor.max(self.horizon),
            };
        }
        if cursor != self.state.cursor {
            self.state.cursor = cursor;
            self.queue = self.queue.split_off(&after(cursor));
            self.done = self.done.split_off(&after(cursor));
            self.failed = self.failed.split_off(&after(cursor));
            self.cursor_out.store(cursor, Ordering::Release);
            self.dirty = true;
        }
    }

    /// Owed entries past the cursor that are not in flight, oldest first, up to `max`.
    fn owed(&self, webhook: &Webhook, max: usize) -> Vec<(Slot, Arc<Queued>)> {
        self.queue
            .range(after(self.state.cursor)..)
            .filter(|(slot, q)| {
                !self.done.contains(*slot)
                    && !self.in_flight.contains(*slot)
                    && q.entry.is_for(webhook)
            })
            .take(max.min(WINDOW))
            .map(|(slot, q)| (slot.clone(), Arc::clone(q)))
            .collect()
    }

    fn start_jobs(&mut self, config: &Arc<SubConfig>, jobs: &mut JoinSet<Job>) {
        if Instant::now() < self.backoff_until {
            return;
        }
        // A failing endpoint gets one request at a time until it answers 2xx again.
        let limit = if self.state.consecutive_failures > 0 {
            1
        } else {
            self.shared.options.concurrency.max(1)
        };
        if jobs.len() >= limit {
            return;
        }
        let batch = config.webhook.batch_max_events.unwrap_or(1).max(1) as usize;
        let want = (limit - jobs.len()) * batch;
        let probing = self.state.consecutive_failures > 0;
        let mut ready =
            self.owed(&config.webhook, if probing { want + self.failed.len() } else { want });
        if probing {
            // Probe with events that have not failed yet, so that one event the endpoint
            // keeps rejecting cannot hold back all the others; it is tried again with the
            // next full round, after a probe succeeded. (A stable sort keeps the order.)
            ready.sort_by_key(|(slot, _)| self.failed.contains_key(slot));
            ready.truncate(want);
        }
        for group in ready.chunks(batch) {
            let revs: Vec<Slot> = group.iter().map(|(slot, _)| slot.clone()).collect();
            self.in_flight.extend(revs.iter().cloned());
            let config = Arc::clone(config);
            let timeout = self.shared.options.timeout;
            let duration = self.metrics.duration.clone();
            let (id, body) = if batch == 1 {
                let entry = &group[0].1.entry;
                (entry.id.clone(), serde_json::to_vec(&entry.payload()))
            } else {
                let ids: Vec<&str> = group.iter().map(|(_, q)| q.entry.id.as_str()).collect();
                let payloads: Vec<_> = group.iter().map(|(_, q)| q.entry.payload()).collect();
                (batch_id(&ids), serde_json::to_vec(&payloads))
            };
            jobs.spawn(async move {
                let body = match body {
                    Ok(body) => Bytes::from(body),
                    Err(e) => {
                        return (
                            revs,
                            Outcome::Refused { status: 0, error: format!("cannot encode: {e}") },
                        );
                    }
                };
                let key = match &config.key {
                    Ok(key) => key.as_deref(),
                    Err(e) => {
                        return (
                            revs,
                            Outcome::Retry { status: 0, error: e.clone(), retry_after: None },
                        );
                    }
                };
                let request = client::Request {
                    url: &config.webhook.url,
                    internal: config.webhook.internal,
                    id: &id,
                    signing_key: key,
                    body,
                    timeout,
                };
                let sent = Instant::now();
                let outcome = client::send(&config.client, request).await;
                duration.observe(sent.elapsed().as_secs_f64());
                (revs, outcome)
            });
        }
    }

    /// Returns `false` when this replica no longer leads.
    async fn on_outcome(
        &mut self,
        config: &SubConfig,
        revs: Vec<Slot>,
        outcome: Outcome,
    ) -> Result<bool, StoreError> {
        for rev in &revs {
            self.in_flight.remove(rev);
        }
        let now = now_ms();
        self.state.last_attempt_unix_ms = now;
        self.dirty = true;
        self.metrics.attempt(match outcome {
            Outcome::Delivered { .. } => DeliveryOutcome::Delivered,
            Outcome::Retry { .. } => DeliveryOutcome::Failed,
            Outcome::Refused { .. } => DeliveryOutcome::Refused,
        });
        match outcome {
            Outcome::Delivered { status } => {
                for rev in revs {
                    self.failed.remove(&rev);
                    self.done.insert(rev);
                    self.state.delivered += 1;
                }
                self.state.consecutive_failures = 0;
                self.state.next_attempt_unix_ms = 0;
                self.state.last_status = status;
                self.state.last_error.clear();
                self.state.last_success_unix_ms = now;
                self.backoff_until = Instant::now();
                Ok(true)
            }
            Outcome::Retry { status, error, retry_after } => {
                debug!(webhook = %self.name, status, %error, "webhook delivery failed; backing off");
                self.note_failure(&revs, status, &error);
                self.state.consecutive_failures = self.state.consecutive_failures.saturating_add(1);
                let delay =
                    backoff(&self.shared.options, self.state.consecutive_failures, retry_after);
                self.backoff_until = Instant::now() + delay;
                self.state.next_attempt_unix_ms =
                    now + i64::try_from(delay.as_millis()).unwrap_or(i64::MAX);
                self.state.last_status = status;
                self.state.last_error = error;
                self.expire(&config.webhook).await
            }
            Outcome::Refused { status, error } => {
                warn!(webhook = %self.name, status, %error, "webhook receiver refused an event; dead-lettered");
                self.note_failure(&revs, status, &error);
                self.state.last_status = status;
                self.state.last_error = error;
                let refused: Vec<_> = revs
                    .into_iter()
                    .filter_map(|slot| {
                        let queued = Arc::clone(self.queue.get(&slot)?);
                        Some((slot, queued))
                    })
                    .collect();
                self.dead_letter(refused).await
            }
        }
    }

    fn note_failure(&mut self, revs: &[Slot], status: u16, error: &str) {
        for slot in revs {
            let event_id = self.queue.get(slot).map(|q| q.entry.id.clone()).unwrap_or_default();
            let pending = self.failed.entry(slot.clone()).or_insert_with(|| PendingDelivery {
                event_id,
                revision: slot.0,
                key: slot.1.clone(),
                attempts: 0,
                last_status: 0,
                last_error: String::new(),
            });
            pending.attempts += 1;
            pending.last_status = status;
            pending.last_error = error.to_owned();
        }
    }

    /// Dead-letters every owed entry older than `max_age` (not those in flight).
    async fn expire(&mut self, webhook: &Webhook) -> Result<bool, StoreError> {
        let max_age = i64::try_from(self.shared.options.max_age.as_millis()).unwrap_or(i64::MAX);
        let cutoff = now_ms().saturating_sub(max_age);
        let expired: Vec<_> = self
            .owed(webhook, WINDOW)
            .into_iter()
            .filter(|(_, q)| q.entry.enqueued_unix_ms < cutoff)
            .collect();
        self.dead_letter(expired).await
    }

    async fn dead_letter(&mut self, entries: Vec<(Slot, Arc<Queued>)>) -> Result<bool, StoreError> {
        if entries.is_empty() {
            return Ok(true);
        }
        let now = now_ms();
        for chunk in entries.chunks(MAX_TXN_OPS / 2) {
            let mut ops = Vec::with_capacity(chunk.len());
            for (rev, queued) in chunk {
                let pending = self.failed.get(rev);
                let letter = DeadLetter {
                    entry: queued.entry.clone(),
                    attempts: pending.map_or(0, |p| p.attempts),
                    last_status: pending.map_or(self.state.last_status, |p| p.last_status),
                    last_error: pending
                        .map_or_else(|| self.state.last_error.clone(), |p| p.last_error.clone()),
                    dead_unix_ms: now,
                };
                let value = serde_json::to_vec(&letter).map_err(|e| {
                    StoreError::InvalidRequest(format!("cannot encode dead letter: {e}"))
                })?;
                let key = self.shared.layout.dead_letter(&self.name, &queued.entry.id);
                ops.push(TxnOp::Put { key, value, lease: None });
            }
            match self.shared.write(ops).await {
                Ok(true) => {}
                Ok(false) => return Ok(false),
                // They stay owed and are dead-lettered after the next failure.
                Err(e) => {
                    warn!(webhook = %self.name, error = %e, "could not store dead letters; will retry");
                    return Ok(true);
                }
            }
            for (slot, _) in chunk {
                self.failed.remove(slot);
                self.done.insert(slot.clone());
                self.state.dead += 1;
            }
            self.metrics.dead_lettered(chunk.len());
            warn!(webhook = %self.name, count = chunk.len(), "webhook events dead-lettered");
        }
        self.dirty = true;
        Ok(true)
    }

    /// Writes the state; `Ok(false)` when this replica no longer leads. A store error is
    /// logged and the write tried again later.
    async fn persist(&mut self) -> Result<bool, StoreError> {
        self.state.pending = self.failed.values().take(MAX_PENDING_RECORDED).cloned().collect();
        let value = serde_json::to_vec(&self.state)
            .map_err(|e| StoreError::InvalidRequest(format!("cannot encode webhook state: {e}")))?;
        let key = self.shared.layout.webhook_state(&self.name);
        self.last_persist = Instant::now();
        match self.shared.write(vec![TxnOp::Put { key, value, lease: None }]).await {
            Ok(true) => {
                self.dirty = false;
                Ok(true)
            }
            Ok(false) => Ok(false),
            Err(e) => {
                warn!(webhook = %self.name, error = %e, "could not store webhook state; will retry");
                Ok(true)
            }
        }
    }
}

/// The wait after the `failures`-th failure in a row: the shared exponential backoff with
/// full jitter between `min_backoff` and `max_backoff`, but never shorter than the
/// endpoint's `Retry-After` (which the client caps at an hour).
fn backoff(options: &DeliveryOptions, failures: u32, retry_after: Option<Duration>) -> Duration {
    let jittered =
        Backoff::new(options.min_backoff, options.max_backoff).delay(failures.saturating_sub(1));
    jittered.max(retry_after.unwrap_or_default())
}

/// Inverse of the layout's escaping of one key segment.
fn unescape(segment: &str) -> String {
    segment.replace("%2F", "/").replace("%25", "%")
}

#[cfg(test)]
mod tests {
    #![allow(clippy::unwrap_used)]
    use super::*;

    #[test]
    fn backoff_grows_is_capped_and_honours_retry_after() {
        let o = DeliveryOptions {
            min_backoff: Duration::from_millis(100),
            max_backoff: Duration::from_secs(2),
            ..Default::default()
        };
        let mut first: Vec<Duration> = Vec::new();
        for _ in 0..200 {
            first.push(backoff(&o, 1, None));
            assert!(backoff(&o, 4, None) <= Duration::from_millis(800));
            assert!(backoff(&o, 30, None) <= Duration::from_secs(2));
            assert_eq!(
                backoff(&o, 1, Some(Duration::from_secs(5))),
                Duration::from_secs(5),
                "a Retry-After above the backoff's ceiling wins"
            );
            assert!(backoff(&o, 30, Some(Duration::from_millis(1))) <= Duration::from_secs(2));
        }
        assert!(first.iter().all(|d| *d <= Duration::from_millis(100)));
        let distinct: BTreeSet<_> = first.iter().collect();
        assert!(distinct.len() > 50, "full jitter spreads the waits: {distinct:?}");
    }

    fn webhook() -> Webhook {
        serde_json::from_value(serde_json::json!({
            "name": "w", "url": "https://h.example.com", "events": ["*"]
        }))
        .unwrap_or_else(|e| panic!("{e}"))
    }

    pub(super) fn entry(id: &str) -> OutboxEntry {
        OutboxEntry {
            id: id.into(),
            event_type: "api:model_failover".into(),
            at_unix_ms: 1,
            enqueued_unix_ms: 1,
            key_id: String::new(),
            data: serde_json::Value::Null,
            only: vec![],
        }
    }

    #[tokio::test]
    async fn the_cursor_passes_a_revision_only_when_all_its_entries_are_done() {
        let dir = tempfile::tempdir().unwrap_or_else(|e| panic!("{e}"));
        let store: Arc<dyn Store> = Arc::new(
            crate::store::embedded::EmbeddedStore::open(dir.path())
                .await
                .unwrap_or_else(|e| panic!("{e}")),
        );
        let (changed, _) = watch::channel(0);
        let shared = Arc::new(Shared {
            store,
            layout: Layout::new("/t/"),
            options: DeliveryOptions::default(),
            fence: Compare::absent("/t/none"),
            outbox: RwLock::new(OutboxView::default()),
            changed,
            metrics: WebhookMetrics::default(),
        });
        {
            let mut view = shared.outbox.write();
            for (rev, key) in [(5, "a"), (5, "b"), (7, "c")] {
                let value = serde_json::to_vec(&entry(key)).unwrap_or_default();
                view.upsert(key, rev, &value);
            }
            view.horizon = 9;
        }
        let (_tx, rx) = watch::channel(Arc::new(SubConfig::new(webhook())));
        let state = SubscriptionState { cursor: 2, ..Default::default() };
        let mut worker =
            Worker::new("w".into(), Arc::clone(&shared), rx, Arc::new(AtomicI64::new(2)), state);
        let w = webhook();
        worker.advance(&w);
        assert_eq!(worker.state.cursor, 4, "nothing done: up to just before the first entry");
        worker.done.insert((5, "b".into()));
        worker.advance(&w);
        assert_eq!(worker.state.cursor, 4, "one of revision 5's two entries is not done");
        worker.done.insert((5, "a".into()));
        worker.advance(&w);
        assert_eq!(worker.state.cursor, 6);
        assert!(worker.done.is_empty(), "what the cursor passed is forgotten");
        worker.in_flight.insert((7, "c".into()));
        let mut not_wanted = webhook();
        not_wanted.events = vec!["breaker.opened".into()];
        worker.advance(&not_wanted);
        assert_eq!(worker.state.cursor, 6, "an entry in flight holds the cursor even if unwanted");
        worker.in_flight.clear();
        worker.advance(&not_wanted);
        assert_eq!(worker.state.cursor, 9, "unwanted entries are passed, up to the horizon");
    }

    #[test]
    fn unescape_reverses_the_layout() {
        assert_eq!(unescape("a%2Fb%25c"), "a/b%c");
    }
}

#[cfg(test)]
mod batch_tests {
    #![allow(clippy::unwrap_used)]
    use super::tests::entry;
    use super::*;

    #[test]
    fn a_batch_value_is_one_slot_per_entry_and_goes_whole() {
        let mut view = OutboxView::default();
        let batch = serde_json::to_vec(&[entry("a"), entry("b"), entry("c")]).unwrap();
        view.upsert("/o/1-batch", 7, &batch);
        view.upsert("/o/2-single", 8, &serde_json::to_vec(&entry("d")).unwrap());
        let slots: Vec<(Revision, String, String)> = view
            .by_rev
            .iter()
            .map(|((rev, slot), q)| (*rev, slot.clone(), q.entry.id.clone()))
            .collect();
        assert_eq!(
            slots,
            [
                (7, "/o/1-batch#00000".to_owned(), "a".to_owned()),
                (7, "/o/1-batch#00001".to_owned(), "b".to_owned()),
                (7, "/o/1-batch#00002".to_owned(), "c".to_owned()),
                (8, "/o/2-single".to_owned(), "d".to_owned()),
            ]
        );
        assert!(view.by_rev.values().take(3).all(|q| q.key == "/o/1-batch"));
        // Rewritten in place (a resend): the same slots, not more.
        view.upsert("/o/1-batch", 7, &batch);
        assert_eq!(view.by_rev.len(), 4);
        view.remove("/o/1-batch");
        assert_eq!(view.by_rev.len(), 1, "the batch's entries go with its key");
    }
}

#[cfg(test)]
mod queue_tests {
    #![allow(clippy::unwrap_used)]
    use super::*;

    fn entry(id: &str, key_id: &str) -> OutboxEntry {
        OutboxEntry {
            id: id.into(),
            event_type: "api:model_failover".into(),
            at_unix_ms: 1,
            enqueued_unix_ms: now_ms(),
            key_id: key_id.into(),
            data: serde_json::Value::Null,
            only: vec![],
        }
    }

    fn webhook(key: &str) -> Webhook {
        serde_json::from_value(serde_json::json!({
            "name": key, "url": "https://h.example.com", "events": ["*"], "keys": [key]
        }))
        .unwrap()
    }

    #[tokio::test]
    async fn a_subscription_queues_only_its_own_events_however_large_the_outbox() {
        let dir = tempfile::tempdir().unwrap();
        let store: Arc<dyn Store> =
            Arc::new(crate::store::embedded::EmbeddedStore::open(dir.path()).await.unwrap());
        let (changed, _) = watch::channel(0);
        let shared = Arc::new(Shared {
            store,
            layout: Layout::new("/t/"),
            options: DeliveryOptions::default(),
            fence: Compare::absent("/t/none"),
            outbox: RwLock::new(OutboxView::default()),
            changed,
            metrics: WebhookMetrics::default(),
        });
        let put = |rev: Revision, entries: Vec<OutboxEntry>| {
            let mut view = shared.outbox.write();
            view.upsert(&format!("/o/{rev}"), rev, &serde_json::to_vec(&entries).unwrap());
            view.horizon = rev;
        };
        let quiet = webhook("key_2");
        let (_tx, rx) = watch::channel(Arc::new(SubConfig::new(quiet.clone())));
        let mut worker = Worker::new(
            "quiet".into(),
            Arc::clone(&shared),
            rx,
            Arc::new(AtomicI64::new(1)),
            SubscriptionState { cursor: 1, ..Default::default() },
        );
        // A storm of another subscription's events, with one of ours in the middle, then
        // more storm.
        put(2, (0..5_000).map(|i| entry(&format!("s{i}"), "key_1")).collect());
        put(3, vec![entry("mine", "key_2")]);
        worker.in_flight.insert((3, "/o/3#00000".into()));
        worker.advance(&quiet);
        put(4, (0..5_000).map(|i| entry(&format!("t{i}"), "key_1")).collect());
        worker.advance(&quiet);
        assert_eq!(worker.queue.len(), 1, "only its own event is queued");
        assert_eq!(worker.state.cursor, 2, "held by its event in flight, past the storm before it");
        // Delivered: the cursor passes the storm behind it too, without a look at it again.
        worker.in_flight.clear();
        worker.done.insert((3, "/o/3#00000".into()));
        worker.advance(&quiet);
        assert_eq!(worker.state.cursor, 4);
        assert!(worker.queue.is_empty());
        assert!(worker.owed(&quiet, 100).is_empty());
    }
}
