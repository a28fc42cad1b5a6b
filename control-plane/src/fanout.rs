//! The config cache every node stream of this replica reads from.
//!
//! One task watches the store's `config/` prefix and keeps the resources, with the revision
//! that last changed each, in memory; each store revision becomes one [`ConfigUpdate`] on a
//! broadcast channel, encoded once as the message every node receives. A node that connects
//! gets a starting point (a full snapshot, or only what changed since its own version when
//! the cache still remembers the deletes since then) and then every later update, with no
//! gap: subscribing happens under the same lock that publishing takes.
//!
//! Starting points are read lazily, a chunk at a time under the read lock, so that a
//! connecting node does not copy the whole cache. They are labeled with the revision `R0`
//! at which the stream subscribed: a chunk read later may already hold a newer value, and
//! every change after `R0` is sent again after the starting point; upserts and deletes are
//! idempotent, so the node ends at the same state.

use std::collections::BTreeMap;
use std::ops::Bound;
use std::sync::Arc;
use std::time::Duration;

use parking_lot::RwLock;
use tokio::sync::broadcast;
use tracing::{info, warn};

use switchyard_backoff::Backoff;
use switchyard_proto::node::encoded::EncodedControlMessage;
use switchyard_proto::node::v1::{self as pb, control_message};

use crate::layout::Layout;
use crate::store::{EventKind, Revision, Store, StoreError};

/// Waits between attempts to list and watch the store again after a failure.
const RECONNECT: Backoff = Backoff::new(Duration::from_millis(100), Duration::from_secs(2));
/// Deletes remembered for delta resyncs; past this, nodes that are further behind get a full snapshot.
const MAX_TOMBSTONES: usize = 10_000;
/// Updates the broadcast keeps; a node stream further behind is resynced. Shared by all
/// streams (a lagging receiver holds no copy), so this bounds memory per replica, not per node.
const BROADCAST_CAPACITY: usize = 1024;
/// An update whose encoding is larger than this is not sent as one message: nodes resync
/// from the cache in chunks instead (far below gRPC's 4 MiB default message limit).
pub const MAX_MESSAGE_BYTES: usize = 1024 * 1024;
/// A chunk of a starting point holds at most this many resources...
pub const CHUNK_RESOURCES: usize = 500;
/// ...and stops growing past this many bytes of values (one resource always fits).
pub const CHUNK_BYTES: usize = 256 * 1024;
/// Resources looked at per read-lock hold while collecting a delta.
const SCAN_STEP: usize = 4096;

/// One store revision's changes to the config, as published to node streams.
#[derive(Debug)]
pub struct ConfigUpdate {
    pub version: Revision,
    /// The `Update` message every node receives, encoded once; `None` when it is larger
    /// than [`MAX_MESSAGE_BYTES`]: streams then resync from the cache in chunks.
    pub encoded: Option<EncodedControlMessage>,
}

/// Where a node stream starts; both starting points are read from the cache afterwards
/// ([`ConfigCache::snapshot_chunk`], [`ConfigCache::changed_since`]).
#[derive(Debug)]
pub enum Start {
    /// Every resource, labeled `version`.
    Snapshot { version: Revision },
    /// What changed after `since`, labeled `version`: the deletes are known now, the
    /// upserts are collected from the cache.
    Delta { since: Revision, version: Revision, deletes: Vec<String> },
    /// The node is at or ahead of this replica: nothing to send until the cache moves on.
    UpToDate,
}

/// A chunk of resources read from the cache, and where the next one starts.
pub struct Chunk {
    pub resources: Vec<(String, Arc<[u8]>)>,
    /// The name to continue after; `None` when the chunk reached the end.
    pub next: Option<String>,
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
        self.state.read().revision
    }

    pub fn latest_change(&self) -> Revision {
        self.state.read().latest_change
    }

    /// The starting point for a node at `node_version`, and the updates after it.
    pub fn subscribe(
        &self,
        node_version: Revision,
    ) -> (Start, broadcast::Receiver<Arc<ConfigUpdate>>) {
        let state = self.state.read();
        let rx = self.updates.subscribe();
        (start_for(&state, node_version), rx)
    }

    /// Up to [`CHUNK_RESOURCES`] resources (and about [`CHUNK_BYTES`]) in name order, after
    /// `after` (from the first when `None`).
    pub fn snapshot_chunk(&self, after: Option<&str>) -> Chunk {
        let state = self.state.read();
        let mut resources = Vec::new();
        let mut bytes = 0;
        let mut range = state.resources.range::<str, _>(lower(after));
        for (name, (value, _)) in range.by_ref() {
            bytes += name.len() + value.len();
            resources.push((name.clone(), Arc::clone(value)));
            if resources.len() >= CHUNK_RESOURCES || bytes >= CHUNK_BYTES {
                break;
            }
        }
        let next = match range.next() {
            Some(_) => resources.last().map(|(name, _)| name.clone()),
            None => None,
        };
        Chunk { resources, next }
    }

    /// Resources changed after revision `since`, looking at up to [`SCAN_STEP`] resources
    /// after `after`; `next` says where to continue.
    pub fn changed_since(&self, since: Revision, after: Option<&str>) -> Chunk {
        let state = self.state.read();
        let mut resources = Vec::new();
        let mut last = None;
        let mut range = state.resources.range::<str, _>(lower(after));
        for (name, (value, rev)) in range.by_ref().take(SCAN_STEP) {
            if *rev > since {
                resources.push((name.clone(), Arc::clone(value)));
            }
            last = Some(name);
        }
        let next = match range.next() {
            Some(_) => last.cloned(),
            None => None,
        };
        Chunk { resources, next }
    }

    /// One resource (a name below `config/`) and the revision that last changed it.
    pub fn resource(&self, name: &str) -> Option<(Arc<[u8]>, Revision)> {
        self.state.read().resources.get(name).map(|(value, rev)| (Arc::clone(value), *rev))
    }

    fn publish(&self, version: Revision, upserts: Vec<(String, Arc<[u8]>)>, deletes: Vec<String>) {
        // Encoded before the lock is taken, once for every node stream.
        let encoded = encode_update(version, &upserts, &deletes);
        let mut state = self.state.write();
        let changed = !upserts.is_empty() || !deletes.is_empty();
        for (name, value) in upserts {
            state.tombstones.remove(&name);
            state.resources.insert(name, (value, version));
        }
        for name in deletes {
            state.resources.remove(&name);
            state.tombstones.insert(name, version);
        }
        while state.tombstones.len() > MAX_TOMBSTONES {
            let oldest =
                state.tombstones.iter().min_by_key(|(_, rev)| **rev).map(|(n, r)| (n.clone(), *r));
            if let Some((name, rev)) = oldest {
                state.tombstones.remove(&name);
                state.tombstone_floor = state.tombstone_floor.max(rev);
            }
        }
        state.revision = state.revision.max(version);
        if changed {
            state.latest_change = state.latest_change.max(version);
        }
        // Sent under the lock so that a subscriber sees each update exactly once.
        let _ = self.updates.send(Arc::new(ConfigUpdate { version, encoded }));
    }

    /// Replaces the whole cache from a fresh listing, publishing the difference as one update.
    fn reload(&self, revision: Revision, listing: BTreeMap<String, (Arc<[u8]>, Revision)>) {
        let state = self.state.read();
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
            let mut state = self.state.write();
            state.latest_change = listing.values().map(|(_, rev)| *rev).max().unwrap_or(0);
            state.resources = listing;
            state.revision = revision;
            state.tombstone_floor = revision;
        } else {
            self.publish(revision, upserts, deletes);
            let mut state = self.state.write();
            // Deletes that happened while the watch was down are not individually known.
            state.tombstone_floor = revision;
        }
    }
}

fn lower(after: Option<&str>) -> (Bound<&str>, Bound<&str>) {
    match after {
        Some(name) => (Bound::Excluded(name), Bound::Unbounded),
        None => (Bound::Unbounded, Bound::Unbounded),
    }
}

/// The `Update` message for these changes, unless it is too large to send as one.
fn encode_update(
    version: Revision,
    upserts: &[(String, Arc<[u8]>)],
    deletes: &[String],
) -> Option<EncodedControlMessage> {
    let size: usize = upserts.iter().map(|(n, v)| n.len() + v.len()).sum::<usize>()
        + deletes.iter().map(String::len).sum::<usize>();
    if size > MAX_MESSAGE_BYTES {
        return None;
    }
    let update = pb::Update {
        version,
        upserts: upserts.iter().map(|(n, v)| resource(n, v)).collect(),
        deletes: deletes.to_vec(),
    };
    let encoded = EncodedControlMessage::new(&pb::ControlMessage {
        msg: Some(control_message::Msg::Update(update)),
    });
    (encoded.len() <= MAX_MESSAGE_BYTES).then_some(encoded)
}

pub fn resource(name: &str, value: &[u8]) -> pb::Resource {
    pb::Resource { name: name.to_owned(), value: value.to_vec() }
}

fn start_for(state: &State, node_version: Revision) -> Start {
    if node_version >= state.revision && node_version > 0 {
        return Start::UpToDate;
    }
    if node_version > 0 && node_version >= state.tombstone_floor {
        let deletes = state
            .tombstones
            .iter()
            .filter(|(_, rev)| **rev > node_version)
            .map(|(name, _)| name.clone())
            .collect();
        return Start::Delta { since: node_version, version: state.revision, deletes };
    }
    Start::Snapshot { version: state.revision }
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
        type Changes = (Vec<(String, Arc<[u8]>)>, Vec<String>);
        let mut by_revision: BTreeMap<Revision, Changes> = BTreeMap::new();
        for event in batch.events {
            let Some(name) = layout.resource_name(&event.kv.key) else { continue };
            let (upserts, deletes) = by_revision.entry(event.kv.mod_revision).or_default();
            match event.kind {
                EventKind::Put => upserts.push((name.to_owned(), Arc::from(&event.kv.value[..]))),
                EventKind::Delete => deletes.push(name.to_owned()),
            }
        }
        for (version, (upserts, deletes)) in by_revision {
            cache.publish(version, upserts, deletes);
        }
    }
    Ok(())
}

#[cfg(test)]
mod tests {
    #![allow(clippy::unwrap_used, clippy::panic)]
    use prost::Message;

    use super::*;

    fn value(len: usize) -> Arc<[u8]> {
        Arc::from(vec![b'x'; len])
    }

    /// A cache at revision 1 with `count` resources `keys/NNNNN` of `len` bytes each.
    fn cache_with(count: usize, len: usize) -> Arc<ConfigCache> {
        let cache = ConfigCache::new();
        let listing = (0..count)
            .map(|i| (format!("keys/{i:05}"), (value(len), 1)))
            .collect::<BTreeMap<_, _>>();
        cache.reload(1, listing);
        cache
    }

    fn read_all(cache: &ConfigCache) -> Vec<Chunk> {
        let mut all = Vec::new();
        let mut after: Option<String> = None;
        loop {
            let chunk = cache.snapshot_chunk(after.as_deref());
            let next = chunk.next.clone();
            all.push(chunk);
            match next {
                Some(next) => after = Some(next),
                None => return all,
            }
        }
    }

    #[test]
    fn a_snapshot_is_read_in_bounded_chunks_that_cover_every_resource_once() {
        let cache = cache_with(1_234, 10);
        let chunks = read_all(&cache);
        assert!(chunks.iter().all(|c| c.resources.len() <= CHUNK_RESOURCES));
        let names: Vec<&str> =
            chunks.iter().flat_map(|c| c.resources.iter().map(|(n, _)| n.as_str())).collect();
        let expected: Vec<String> = (0..1_234).map(|i| format!("keys/{i:05}")).collect();
        assert_eq!(names, expected);

        // Large values: the byte bound cuts chunks short of the resource bound.
        let cache = cache_with(40, 100_000);
        let chunks = read_all(&cache);
        assert!(chunks.iter().all(|c| c.resources.len() <= CHUNK_BYTES / 100_000 + 1));
        for chunk in &chunks {
            let bytes: usize = chunk.resources.iter().map(|(n, v)| n.len() + v.len()).sum();
            assert!(bytes < CHUNK_BYTES + 100_100, "a chunk of {bytes} bytes");
        }
        assert_eq!(chunks.iter().map(|c| c.resources.len()).sum::<usize>(), 40);

        let empty = ConfigCache::new();
        let only = empty.snapshot_chunk(None);
        assert!(only.resources.is_empty() && only.next.is_none());
    }

    #[test]
    fn a_snapshot_chunk_read_after_a_change_sees_the_change_and_the_change_is_still_broadcast() {
        let cache = cache_with(1_000, 10);
        let (start, mut rx) = cache.subscribe(0);
        let Start::Snapshot { version: 1 } = start else { panic!("{start:?}") };
        let first = cache.snapshot_chunk(None);
        cache.publish(2, vec![("keys/00999".into(), value(3))], vec!["keys/00998".into()]);
        let rest = cache.snapshot_chunk(first.next.as_deref());
        assert!(rest.resources.iter().any(|(n, v)| n == "keys/00999" && v.len() == 3));
        assert!(!rest.resources.iter().any(|(n, _)| n == "keys/00998"));
        // The change after the snapshot's revision still reaches the stream.
        let update = rx.try_recv().unwrap();
        assert_eq!(update.version, 2);
    }

    #[test]
    fn an_update_is_encoded_once_as_the_nodes_message_unless_it_is_too_large() {
        let cache = cache_with(3, 10);
        let mut rx = cache.updates.subscribe();
        cache.publish(2, vec![("keys/a".into(), value(5))], vec!["keys/00000".into()]);
        let update = rx.try_recv().unwrap();
        let encoded = update.encoded.as_ref().unwrap();
        let message = pb::ControlMessage::decode(encoded.as_bytes()).unwrap();
        let Some(control_message::Msg::Update(u)) = message.msg else { panic!("{message:?}") };
        assert_eq!(
            (u.version, u.upserts[0].name.as_str(), &u.deletes[..]),
            (2, "keys/a", &["keys/00000".to_owned()][..])
        );

        cache.publish(3, vec![("catalog".into(), value(MAX_MESSAGE_BYTES + 1))], vec![]);
        let update = rx.try_recv().unwrap();
        assert_eq!(update.version, 3);
        assert!(update.encoded.is_none(), "a message over the limit is left to a resync");
        assert_eq!(cache.resource("catalog").unwrap().0.len(), MAX_MESSAGE_BYTES + 1);
    }

    #[test]
    fn a_delta_start_names_the_deletes_and_the_scan_finds_only_newer_resources() {
        let cache = cache_with(10_000, 1);
        cache.publish(2, vec![("keys/09000".into(), value(2))], vec!["keys/00001".into()]);
        cache.publish(3, vec![("keys/00005".into(), value(2))], vec![]);
        let (start, _rx) = cache.subscribe(1);
        let Start::Delta { since: 1, version: 3, deletes } = start else { panic!("{start:?}") };
        assert_eq!(deletes, ["keys/00001"]);
        let mut changed = Vec::new();
        let mut after: Option<String> = None;
        loop {
            let chunk = cache.changed_since(1, after.as_deref());
            changed.extend(chunk.resources.into_iter().map(|(n, _)| n));
            match chunk.next {
                Some(next) => after = Some(next),
                None => break,
            }
        }
        assert_eq!(changed, ["keys/00005", "keys/09000"]);
        assert!(matches!(cache.subscribe(3).0, Start::UpToDate));
    }
}
