//! The config cache every node stream of this replica reads from.
//!
//! One task watches the store's `config/` prefix and keeps the resources, with the revision
//! that last changed each, in memory; each store revision becomes one [`ConfigUpdate`] on a
//! broadcast channel. A node that connects gets a consistent starting point (a full snapshot,
//! or only what changed since its own version when the cache still remembers the deletes
//! since then) and then every later update, with no gap: subscribing and reading the cache
//! happen under the same lock that publishing takes.

use std::collections::BTreeMap;
use std::sync::{Arc, RwLock};
use std::time::Duration;

use tokio::sync::broadcast;
use tracing::{info, warn};

use switchyard_backoff::Backoff;

use crate::layout::Layout;
use crate::store::{EventKind, Revision, Store, StoreError};

/// Waits between attempts to list and watch the store again after a failure.
const RECONNECT: Backoff = Backoff::new(Duration::from_millis(100), Duration::from_secs(2));
/// Deletes remembered for delta resyncs; past this, nodes that are further behind get a full snapshot.
const MAX_TOMBSTONES: usize = 10_000;
/// Updates buffered per node stream; a node that falls further behind is resynced.
const BROADCAST_CAPACITY: usize = 1024;

#[derive(Debug)]
pub struct ConfigUpdate {
    pub version: Revision,
    pub upserts: Vec<(String, Arc<[u8]>)>,
    pub deletes: Vec<String>,
}

/// Where a node stream starts.
pub enum Start {
    Snapshot {
        version: Revision,
        resources: Vec<(String, Arc<[u8]>)>,
    },
    Delta(ConfigUpdate),
    /// The node is at or ahead of this replica: nothing to send until the cache moves on.
    UpToDate,
}

#[derive(Default)]
struct State {
    revision: Revision,
    /// Revision of the newest change to any resource, for node lag.
    latest_change: Revision,
    resources: BTreeMap<String, (Arc<[u8]>, Revision)>,
    tombstones: BTreeMap<String, Revision>,
    /// Deletes at or below this revision may have been forgotten.
    tombstone_floor: Revision,
}

pub struct ConfigCache {
    state: RwLock<State>,
    updates: broadcast::Sender<Arc<ConfigUpdate>>,
    ready: tokio::sync::watch::Sender<bool>,
}

impl ConfigCache {
    pub fn new() -> Arc<Self> {
        let (updates, _) = broadcast::channel(BROADCAST_CAPACITY);
        let (ready, _) = tokio::sync::watch::channel(false);
        Arc::new(Self { state: RwLock::new(State::default()), updates, ready })
    }

    /// Waits until the cache holds the store's config (the first listing is in).
    pub async fn wait_ready(&self) {
        let mut rx = self.ready.subscribe();
        let _ = rx.wait_for(|ready| *ready).await;
    }

    pub fn revision(&self) -> Revision {
        self.read().revision
    }

    pub fn latest_change(&self) -> Revision {
        self.read().latest_change
    }

    /// The starting point for a node at `node_version`, and the updates after it.
    pub fn subscribe(
        &self,
        node_version: Revision,
    ) -> (Start, broadcast::Receiver<Arc<ConfigUpdate>>) {
        let state = self.read();
        let rx = self.updates.subscribe();
        (start_for(&state, node_version), rx)
    }

    /// Like [`Self::subscribe`]'s start, for a stream that lagged behind the broadcast.
    pub fn resync(&self, node_version: Revision) -> Start {
        start_for(&self.read(), node_version)
    }

    /// One resource (a name below `config/`) and the revision that last changed it.
    pub fn resource(&self, name: &str) -> Option<(Arc<[u8]>, Revision)> {
        self.read().resources.get(name).map(|(value, rev)| (Arc::clone(value), *rev))
    }

    fn read(&self) -> std::sync::RwLockReadGuard<'_, State> {
        // A poisoned lock means a panic mid-update elsewhere; the data is still the last
        // consistent state because updates are built before the lock is taken.
        self.state.read().unwrap_or_else(|e| e.into_inner())
    }

    fn publish(&self, update: ConfigUpdate) {
        let mut state = self.state.write().unwrap_or_else(|e| e.into_inner());
        for (name, value) in &update.upserts {
            state.tombstones.remove(name);
            state.resources.insert(name.clone(), (value.clone(), update.version));
        }
        for name in &update.deletes {
            state.resources.remove(name);
            state.tombstones.insert(name.clone(), update.version);
        }
        while state.tombstones.len() > MAX_TOMBSTONES {
            let oldest =
                state.tombstones.iter().min_by_key(|(_, rev)| **rev).map(|(n, r)| (n.clone(), *r));
            if let Some((name, rev)) = oldest {
                state.tombstones.remove(&name);
                state.tombstone_floor = state.tombstone_floor.max(rev);
            }
        }
        state.revision = state.revision.max(update.version);
        if !update.upserts.is_empty() || !update.deletes.is_empty() {
            state.latest_change = state.latest_change.max(update.version);
        }
        // Sent under the lock so that a subscriber sees each update exactly once.
        let _ = self.updates.send(Arc::new(update));
    }

    /// Replaces the whole cache from a fresh listing, publishing the difference as one update.
    fn reload(&self, revision: Revision, listing: BTreeMap<String, (Arc<[u8]>, Revision)>) {
        let state = self.read();
        let upserts = listing
            .iter()
            .filter(|(name, (_, rev))| state.resources.get(*name).is_none_or(|(_, old)| old != rev))
            .map(|(name, (value, _))| (name.clone(), value.clone()))
            .collect();
        let deletes =
            state.resources.keys().filter(|n| !listing.contains_key(*n)).cloned().collect();
        let first = state.revision == 0;
        drop(state);
        if first {
            let mut state = self.state.write().unwrap_or_else(|e| e.into_inner());
            state.latest_change = listing.values().map(|(_, rev)| *rev).max().unwrap_or(0);
            state.resources = listing;
            state.revision = revision;
            state.tombstone_floor = revision;
        } else {
            self.publish(ConfigUpdate { version: revision, upserts, deletes });
            let mut state = self.state.write().unwrap_or_else(|e| e.into_inner());
            // Deletes that happened while the watch was down are not individually known.
            state.tombstone_floor = revision;
        }
    }
}

fn start_for(state: &State, node_version: Revision) -> Start {
    if node_version >= state.revision && node_version > 0 {
        return Start::UpToDate;
    }
    if node_version > 0 && node_version >= state.tombstone_floor {
        let upserts = state
            .resources
            .iter()
            .filter(|(_, (_, rev))| *rev > node_version)
            .map(|(name, (value, _))| (name.clone(), value.clone()))
            .collect();
        let deletes = state
            .tombstones
            .iter()
            .filter(|(_, rev)| **rev > node_version)
            .map(|(name, _)| name.clone())
            .collect();
        return Start::Delta(ConfigUpdate { version: state.revision, upserts, deletes });
    }
    Start::Snapshot {
        version: state.revision,
        resources: state.resources.iter().map(|(n, (v, _))| (n.clone(), v.clone())).collect(),
    }
}

/// Keeps `cache` in step with the store until the process ends. Survives store outages:
/// after any watch error it lists again and publishes the difference.
pub async fn run(cache: Arc<ConfigCache>, store: Arc<dyn Store>, layout: Layout) {
    let prefix = layout.config_prefix();
    // Never reset: a store that lists but keeps breaking the watch must not be listed in
    // full (every key of the fleet) at the shortest wait forever.
    let mut failures = 0;
    loop {
        match follow(&cache, store.as_ref(), &layout, &prefix).await {
            Ok(()) => warn!("config watch ended; listing again"),
            Err(e) => warn!(error = %e, "config watch failed; listing again"),
        }
        tokio::time::sleep(RECONNECT.delay(failures)).await;
        failures = failures.saturating_add(1);
    }
}

async fn follow(
    cache: &ConfigCache,
    store: &dyn Store,
    layout: &Layout,
    prefix: &str,
) -> Result<(), StoreError> {
    let listing = store.list(prefix).await?;
    let resources = listing
        .kvs
        .into_iter()
        .filter_map(|kv| {
            let name = layout.resource_name(&kv.key)?.to_owned();
            Some((name, (Arc::<[u8]>::from(&kv.value[..]), kv.mod_revision)))
        })
        .collect();
    cache.reload(listing.revision, resources);
    cache.ready.send_replace(true);
    info!(revision = listing.revision, "config cache loaded");
    let mut watch = store.watch(prefix, listing.revision + 1).await?;
    while let Some(batch) = watch.next().await {
        let batch = batch?;
        // Split the batch by revision: each store revision is one version for the nodes.
        let mut by_revision: BTreeMap<Revision, ConfigUpdate> = BTreeMap::new();
        for event in batch.events {
            let Some(name) = layout.resource_name(&event.kv.key) else { continue };
            let rev = event.kv.mod_revision;
            let update = by_revision.entry(rev).or_insert_with(|| ConfigUpdate {
                version: rev,
                upserts: Vec::new(),
                deletes: Vec::new(),
            });
            match event.kind {
                EventKind::Put => {
                    update.upserts.push((name.to_owned(), Arc::from(&event.kv.value[..])))
                }
                EventKind::Delete => update.deletes.push(name.to_owned()),
            }
        }
        for update in by_revision.into_values() {
            cache.publish(update);
        }
    }
    Ok(())
}
