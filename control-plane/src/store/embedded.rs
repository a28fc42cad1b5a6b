//! The embedded store: etcd's semantics in one directory, for `switchyard dev` and
//! single-machine installs.
//!
//! Layout of the directory:
//! - `LOCK`: held with an exclusive OS lock for as long as the store is open, so a second
//!   process opening the same directory fails at once instead of corrupting the log;
//! - `snapshot.json`: the whole key space, the leases and the revision counter as of log
//!   sequence number `seq`, replaced atomically (write temp, fsync, rename, fsync dir);
//! - `wal.jsonl`: one JSON record per line after the snapshot, each fsynced before the call
//!   that wrote it returns. When it grows past [`Options::log_rewrite_bytes`] a new snapshot
//!   is written and the log truncated; records at or below the snapshot's `seq` are skipped
//!   on replay, so a crash between the two steps is harmless.
//!
//! One writer thread owns the files and is the only code that mutates the state. It plans a
//! change against the current state, makes the record durable, and only then applies it, so
//! readers (which take the state's mutex briefly, never across I/O) never see a write that
//! a crash could still lose.
//!
//! Known differences from etcd:
//! - history survives a restart only for the revisions still in the log: after reopening,
//!   the compaction floor is at least the snapshot's revision + 1 (a watcher asking for
//!   older history gets [`StoreError::Compacted`] and must re-list, as it must on etcd);
//! - history is bounded to the last [`Options::retain_revisions`] revisions and to about
//!   [`MAX_HISTORY_BYTES`] of keys and values (etcd keeps
//!   everything until someone compacts);
//! - lease TTLs are honoured to the millisecond (etcd rounds up to seconds and to a minimum);
//!   after a restart every lease gets its full TTL again, as etcd does after a leader change;
//! - a watcher that reads slower than writes arrive keeps reading from history and is cut
//!   off with [`StoreError::Compacted`] once retention passes it (see [`Options::watch_buffer`]);
//! - one fsync per write, except that transactions waiting in the queue together are
//!   committed with one (`Writer::txn_group`): write throughput is the disk's fsync rate
//!   times the writes in flight, plenty for configuration data and the audit log;
//! - one process per directory, so replicas cannot share it (election still works between
//!   tasks of that process).

use std::collections::{BTreeMap, BTreeSet, HashMap, HashSet, VecDeque};
use std::fs::{File, OpenOptions};
use std::io::{BufRead, BufReader, Write};
use std::ops::Bound;
use std::path::{Path, PathBuf};
use std::sync::mpsc as std_mpsc;
use std::sync::{Arc, Mutex, MutexGuard};
use std::time::{Duration, Instant};

use async_trait::async_trait;
use bytes::Bytes;
use rand::{Rng, SeedableRng};
use serde::{Deserialize, Serialize};
use tokio::sync::{mpsc, oneshot, watch};

use super::{
    Compare, CompareOp, CompareTarget, EventKind, KeyListing, KeyValue, LeaseId, Listing, Revision,
    Store, StoreError, Txn, TxnOp, TxnResult, WatchBatch, WatchEvent, WatchStream,
};

const LOCK_FILE: &str = "LOCK";
const SNAPSHOT_FILE: &str = "snapshot.json";
const SNAPSHOT_TMP_FILE: &str = "snapshot.json.tmp";
const LOG_FILE: &str = "wal.jsonl";

/// How often the writer thread looks for expired leases.
const EXPIRY_TICK: Duration = Duration::from_millis(250);
/// A process that just dropped its store releases the lock a moment later (its writer
/// thread finishes the last fsync first); waiting this long spares a reopen in the same
/// process a spurious "in use" error while a real second process still fails fast.
const LOCK_WAIT: Duration = Duration::from_secs(2);
/// etcd's `MaxLeaseTTL`.
const MAX_LEASE_TTL: Duration = Duration::from_secs(9_000_000_000);
/// etcd's default `--max-txn-ops`.
const MAX_TXN_OPS: usize = 128;
/// The writer keeps its log-line buffer between records up to this capacity.
const MAX_KEPT_LINE: usize = 1024 * 1024;
/// History is also bounded in bytes: in an outage storm every revision is a transaction
/// of 128 audit entries, and 10,000 such revisions held ~600 MB. At this bound a storm of
/// 20,000 failovers/s still leaves watchers several seconds of history to catch up from.
const MAX_HISTORY_BYTES: usize = 64 * 1024 * 1024;
/// Transactions committed with one fsync at most (see `Writer::txn_group`).
const MAX_GROUP: usize = 64;
/// Most revisions a watcher copies out of history per lock acquisition.
const WATCH_CHUNK: usize = 256;

/// Tunables; [`Default`] is what `file://DIR` uses.
#[derive(Clone, Debug)]
pub struct Options {
    /// Revisions of history kept for watchers; older ones are compacted automatically.
    pub retain_revisions: usize,
    /// Log size that triggers a snapshot rewrite and log truncation.
    pub log_rewrite_bytes: u64,
    /// Batches buffered per watcher. A watcher that does not keep up is not dropped for
    /// that alone: it reads on from history at its own pace, and only when automatic
    /// retention passes its position does its stream yield [`StoreError::Compacted`] and
    /// end (memory stays bounded by this buffer plus the shared history).
    pub watch_buffer: usize,
}

impl Default for Options {
    fn default() -> Self {
        Self { retain_revisions: 10_000, log_rewrite_bytes: 64 * 1024 * 1024, watch_buffer: 64 }
    }
}

pub struct EmbeddedStore {
    state: Arc<Mutex<State>>,
    commands: std_mpsc::Sender<Command>,
    /// Bumped by the writer after every applied revision; watchers wait on it. Dropped with
    /// the writer thread, which ends every watch.
    revisions: watch::Receiver<Revision>,
    watch_buffer: usize,
}

// === impl EmbeddedStore ===

impl EmbeddedStore {
    pub async fn open(dir: &Path) -> Result<Self, StoreError> {
        Self::open_with(dir, Options::default()).await
    }

    pub async fn open_with(dir: &Path, options: Options) -> Result<Self, StoreError> {
        let dir = dir.to_path_buf();
        let opts = options.clone();
        let recovered =
            tokio::task::spawn_blocking(move || recover(&dir, &opts)).await.map_err(|e| {
                StoreError::Unavailable(format!("embedded store recovery task failed: {e}"))
            })??;
        let state = Arc::new(Mutex::new(recovered.state));
        let current = lock(&state).revision;
        let (rev_tx, rev_rx) = watch::channel(current);
        let (cmd_tx, cmd_rx) = std_mpsc::channel();
        let writer = Writer {
            state: state.clone(),
            files: recovered.files,
            seq: recovered.seq,
            log_len: recovered.log_len,
            options: options.clone(),
            revisions: rev_tx,
            rng: rand::rngs::StdRng::from_os_rng(),
            failed: None,
            line: Vec::new(),
        };
        std::thread::Builder::new()
            .name("embedded-store-writer".into())
            .spawn(move || writer.run(cmd_rx))?;
        Ok(Self {
            state,
            commands: cmd_tx,
            revisions: rev_rx,
            watch_buffer: options.watch_buffer.max(1),
        })
    }

    /// Stops the writer and releases the directory lock before returning, so the directory
    /// can be reopened at once. Dropping the store does the same, just without waiting.
    pub async fn close(self) {
        let (tx, rx) = oneshot::channel();
        if self.commands.send(Command::Close(tx)).is_ok() {
            let _ = rx.await;
        }
    }

    async fn request<T>(
        &self,
        make: impl FnOnce(oneshot::Sender<Result<T, StoreError>>) -> Command,
    ) -> Result<T, StoreError> {
        let (tx, rx) = oneshot::channel();
        // The queue is unbounded but every caller waits for its reply, so it never holds more
        // than one command per concurrent caller.
        self.commands.send(make(tx)).map_err(|_| closed())?;
        rx.await.map_err(|_| closed())?
    }
}

fn closed() -> StoreError {
    StoreError::Unavailable("the embedded store is closed".into())
}

#[async_trait]
impl Store for EmbeddedStore {
    async fn get(&self, key: &str) -> Result<Option<KeyValue>, StoreError> {
        Ok(lock(&self.state).kvs.get(key).cloned())
    }

    async fn list(&self, prefix: &str) -> Result<Listing, StoreError> {
        let st = lock(&self.state);
        let kvs = st.under(prefix, prefix).map(|(_, kv)| kv.clone()).collect();
        Ok(Listing { kvs, revision: st.revision })
    }

    async fn list_keys(
        &self,
        prefix: &str,
        from: &str,
        limit: usize,
    ) -> Result<KeyListing, StoreError> {
        let st = lock(&self.state);
        let keys = st.under(prefix, from).take(limit).map(|(k, _)| k.clone()).collect();
        Ok(KeyListing { keys, revision: st.revision })
    }

    async fn count(&self, prefix: &str) -> Result<(usize, Revision), StoreError> {
        let st = lock(&self.state);
        Ok((st.under(prefix, prefix).count(), st.revision))
    }

    async fn put(
        &self,
        key: &str,
        value: Vec<u8>,
        lease: Option<LeaseId>,
    ) -> Result<Revision, StoreError> {
        let txn =
            Txn { success: vec![TxnOp::Put { key: key.into(), value, lease }], ..Txn::default() };
        Ok(self.txn(txn).await?.revision)
    }

    async fn delete(&self, key: &str) -> Result<bool, StoreError> {
        let txn = Txn {
            compare: vec![Compare {
                key: key.into(),
                op: CompareOp::Greater,
                target: CompareTarget::Version(0),
            }],
            success: vec![TxnOp::Delete { key: key.into() }],
            failure: vec![],
        };
        Ok(self.txn(txn).await?.succeeded)
    }

    async fn txn(&self, txn: Txn) -> Result<TxnResult, StoreError> {
        self.request(|reply| Command::Txn(txn, reply)).await
    }

    async fn watch(&self, prefix: &str, from: Revision) -> Result<WatchStream, StoreError> {
        let cursor = if from <= 0 { lock(&self.state).revision + 1 } else { from };
        let (tx, rx) = mpsc::channel(self.watch_buffer);
        let watcher = Watcher {
            state: self.state.clone(),
            revisions: self.revisions.clone(),
            prefix: prefix.to_owned(),
            cursor,
            tx,
        };
        tokio::spawn(watcher.run());
        Ok(WatchStream::new(rx))
    }

    async fn compact(&self, revision: Revision) -> Result<(), StoreError> {
        self.request(|reply| Command::Compact(revision, reply)).await
    }

    async fn current_revision(&self) -> Result<Revision, StoreError> {
        Ok(lock(&self.state).revision)
    }

    async fn grant_lease(&self, ttl: Duration) -> Result<LeaseId, StoreError> {
        self.request(|reply| Command::Grant(ttl, reply)).await
    }

    async fn keep_alive(&self, lease: LeaseId) -> Result<Duration, StoreError> {
        self.request(|reply| Command::KeepAlive(lease, reply)).await
    }

    async fn revoke_lease(&self, lease: LeaseId) -> Result<(), StoreError> {
        self.request(|reply| Command::Revoke(lease, reply)).await
    }
}

// === State ===

#[derive(Default)]
struct State {
    revision: Revision,
    /// The oldest revision a watch may start from; history holds every revision from here on.
    floor: Revision,
    kvs: BTreeMap<String, KeyValue>,
    /// One entry per revision, ascending; every revision changed at least one key.
    history: VecDeque<(Revision, Vec<WatchEvent>)>,
    /// [`history_size`] of everything in `history`.
    history_bytes: usize,
    leases: HashMap<LeaseId, LeaseState>,
}

struct LeaseState {
    ttl: Duration,
    deadline: Instant,
    keys: BTreeSet<String>,
}

fn deadline(now: Instant, ttl: Duration) -> Instant {
    // Only a hand-edited file can hold a TTL past MAX_LEASE_TTL; such a lease never expires.
    now.checked_add(ttl).unwrap_or(now + MAX_LEASE_TTL)
}

fn lock(state: &Mutex<State>) -> MutexGuard<'_, State> {
    // The state is only mutated by `apply`, which does not panic midway on valid records; a
    // poisoned lock therefore still guards consistent data.
    state.lock().unwrap_or_else(|poisoned| poisoned.into_inner())
}

impl State {
    fn empty() -> Self {
        // etcd starts an empty key space at revision 1; the first write is revision 2.
        Self { revision: 1, floor: 1, ..Self::default() }
    }

    fn holds(&self, c: &Compare) -> bool {
        let kv = self.kvs.get(&c.key);
        let num = |actual: i64, target: i64| match c.op {
            CompareOp::Equal => actual == target,
            CompareOp::NotEqual => actual != target,
            CompareOp::Greater => actual > target,
            CompareOp::Less => actual < target,
        };
        match &c.target {
            CompareTarget::Version(v) => num(kv.map_or(0, |kv| kv.version), *v),
            CompareTarget::CreateRevision(r) => num(kv.map_or(0, |kv| kv.create_revision), *r),
            CompareTarget::ModRevision(r) => num(kv.map_or(0, |kv| kv.mod_revision), *r),
            // etcd: a value comparison against a missing key is false whatever the operator.
            CompareTarget::Value(v) => kv.is_some_and(|kv| match c.op {
                CompareOp::Equal => kv.value == *v,
                CompareOp::NotEqual => kv.value != *v,
                CompareOp::Greater => kv.value > *v,
                CompareOp::Less => kv.value < *v,
            }),
        }
    }

    /// Resolves a transaction into concrete single-key changes without touching the state.
    /// The entries under `prefix` from key `from` on (from the prefix's start when `from`
    /// sorts before it), in key order.
    fn under<'a>(
        &'a self,
        prefix: &'a str,
        from: &'a str,
    ) -> impl Iterator<Item = (&'a String, &'a KeyValue)> + 'a {
        let start = from.max(prefix);
        self.kvs
            .range::<str, _>((std::ops::Bound::Included(start), std::ops::Bound::Unbounded))
            .take_while(move |(k, _)| k.starts_with(prefix))
    }

    fn plan_txn(&self, txn: Txn) -> Result<(bool, Vec<Change>), StoreError> {
        validate(&txn)?;
        let succeeded = txn.compare.iter().all(|c| self.holds(c));
        let ops = if succeeded { txn.success } else { txn.failure };
        // Keys deleted by earlier ops of this transaction. Puts need no such record:
        // `validate` refuses a branch that puts a key and also deletes it or puts it twice,
        // so keys and values move into the plan without a copy.
        let mut deleted: BTreeSet<String> = BTreeSet::new();
        let mut changes = Vec::with_capacity(ops.len());
        for op in ops {
            match op {
                TxnOp::Put { key, value, lease } => {
                    let lease = lease.unwrap_or(0);
                    if lease != 0 && !self.leases.contains_key(&lease) {
                        return Err(StoreError::LeaseNotFound(lease));
                    }
                    changes.push(Change::Put { key, value: Bytes::from(value), lease });
                }
                TxnOp::Delete { key } => {
                    if self.kvs.contains_key(&key) && deleted.insert(key.clone()) {
                        changes.push(Change::Delete { key });
                    }
                }
                TxnOp::DeletePrefix { prefix } => {
                    let keys = self.under(&prefix, &prefix).map(|(k, _)| k);
                    delete_each(keys, &mut deleted, &mut changes);
                }
                TxnOp::DeleteRange { start, end } => {
                    let keys = self.kvs.range::<str, _>(key_range(&start, &end)).map(|(k, _)| k);
                    delete_each(keys, &mut deleted, &mut changes);
                }
            }
        }
        Ok((succeeded, changes))
    }

    /// Applies a durable record. Also used for replay, so it must be deterministic.
    fn apply(&mut self, record: Record, now: Instant, retain: usize) {
        match record {
            Record::Commit { changes } => self.commit(changes, retain),
            Record::Grant { id, ttl_ms } => {
                let ttl = Duration::from_millis(ttl_ms);
                self.leases.insert(
                    id,
                    LeaseState { ttl, deadline: deadline(now, ttl), keys: BTreeSet::new() },
                );
            }
            Record::Revoke { id } => {
                if let Some(lease) = self.leases.remove(&id) {
                    let changes: Vec<Change> = lease
                        .keys
                        .into_iter()
                        .filter(|k| self.kvs.get(k).is_some_and(|kv| kv.lease == id))
                        .map(|key| Change::Delete { key })
                        .collect();
                    self.commit(changes, retain);
                }
            }
            Record::Compact { revision } => self.compact_to(revision),
        }
    }

    fn commit(&mut self, changes: Vec<Change>, retain: usize) {
        if changes.is_empty() {
            return;
        }
        let rev = self.revision + 1;
        let mut events = Vec::with_capacity(changes.len());
        for change in changes {
            match change {
                Change::Put { key, value, lease } => {
                    let previous = self.kvs.get(&key);
                    let (create_revision, version, old_lease) = previous
                        .map_or((rev, 1, 0), |kv| (kv.create_revision, kv.version + 1, kv.lease));
                    if old_lease != 0
                        && old_lease != lease
                        && let Some(l) = self.leases.get_mut(&old_lease)
                    {
                        l.keys.remove(&key);
                    }
                    if lease != 0
                        && let Some(l) = self.leases.get_mut(&lease)
                    {
                        l.keys.insert(key.clone());
                    }
                    let kv =
                        KeyValue { key, value, create_revision, mod_revision: rev, version, lease };
                    self.kvs.insert(kv.key.clone(), kv.clone());
                    events.push(WatchEvent { kind: EventKind::Put, kv });
                }
                Change::Delete { key } => {
                    if let Some(old) = self.kvs.remove(&key) {
                        if old.lease != 0
                            && let Some(l) = self.leases.get_mut(&old.lease)
                        {
                            l.keys.remove(&key);
                        }
                        events
                            .push(WatchEvent { kind: EventKind::Delete, kv: tombstone(key, rev) });
                    }
                }
            }
        }
        if events.is_empty() {
            return;
        }
        self.revision = rev;
        self.history_bytes += history_size(&events);
        self.history.push_back((rev, events));
        while self.history.len() > retain.max(1)
            || (self.history_bytes > MAX_HISTORY_BYTES && self.history.len() > 1)
        {
            if let Some((oldest, events)) = self.history.pop_front() {
                self.history_bytes = self.history_bytes.saturating_sub(history_size(&events));
                self.floor = self.floor.max(oldest + 1);
            }
        }
    }

    fn compact_to(&mut self, revision: Revision) {
        if revision <= self.floor {
            return;
        }
        self.floor = revision;
        while self.history.front().is_some_and(|(r, _)| *r < revision) {
            if let Some((_, events)) = self.history.pop_front() {
                self.history_bytes = self.history_bytes.saturating_sub(history_size(&events));
            }
        }
    }
}

/// What one revision's events hold in memory, roughly: keys and values plus a fixed
/// overhead per event.
fn history_size(events: &[WatchEvent]) -> usize {
    events.iter().map(|e| e.kv.key.len() + e.kv.value.len() + 64).sum()
}

/// Refuses what etcd refuses (its `--max-txn-ops` default and its duplicate-key check), so
/// a transaction that works in `switchyard dev` also works against etcd.
fn validate(txn: &Txn) -> Result<(), StoreError> {
    txn.check_ranges()?;
    if [txn.compare.len(), txn.success.len(), txn.failure.len()].iter().any(|n| *n > MAX_TXN_OPS) {
        return Err(StoreError::InvalidRequest(format!(
            "too many operations in a transaction (at most {MAX_TXN_OPS} comparisons and per branch)"
        )));
    }
    for branch in [&txn.success, &txn.failure] {
        let mut puts = BTreeSet::new();
        for op in branch {
            if let TxnOp::Put { key, .. } = op {
                if key.is_empty() {
                    return Err(StoreError::InvalidRequest("empty key".into()));
                }
                if !puts.insert(key.as_str()) {
                    return Err(duplicate_key(key));
                }
            }
        }
        for op in branch {
            match op {
                TxnOp::Delete { key } if puts.contains(key.as_str()) => {
                    return Err(duplicate_key(key));
                }
                TxnOp::DeletePrefix { prefix } => {
                    if let Some(key) = puts.iter().find(|k| k.starts_with(prefix.as_str())) {
                        return Err(duplicate_key(key));
                    }
                }
                TxnOp::DeleteRange { start, end } => {
                    if let Some(key) = puts.range::<str, _>(key_range(start, end)).next() {
                        return Err(duplicate_key(key));
                    }
                }
                _ => {}
            }
        }
    }
    Ok(())
}

/// Plans the delete of each of `keys` not already deleted by this transaction.
fn delete_each<'a>(
    keys: impl Iterator<Item = &'a String>,
    deleted: &mut BTreeSet<String>,
    changes: &mut Vec<Change>,
) {
    for key in keys {
        if deleted.insert(key.clone()) {
            changes.push(Change::Delete { key: key.clone() });
        }
    }
}

/// `[start, end)` as a range over string keys.
fn key_range<'a>(start: &'a str, end: &'a str) -> (Bound<&'a str>, Bound<&'a str>) {
    (Bound::Included(start), Bound::Excluded(end))
}

fn duplicate_key(key: &str) -> StoreError {
    StoreError::InvalidRequest(format!("transaction writes key {key:?} more than once"))
}

fn tombstone(key: String, revision: Revision) -> KeyValue {
    // etcd's delete events carry only the key and the revision of the delete.
    KeyValue {
        key,
        value: Bytes::new(),
        create_revision: 0,
        mod_revision: revision,
        version: 0,
        lease: 0,
    }
}

// === On-disk records ===

#[derive(Serialize, Deserialize)]
struct LogEntry {
    seq: u64,
    record: Record,
}

#[derive(Clone, Debug, Serialize, Deserialize)]
#[serde(tag = "op", rename_all = "snake_case", try_from = "wire::Record")]
enum Record {
    /// One revision: every change of one transaction.
    Commit {
        changes: Vec<Change>,
    },
    Grant {
        id: LeaseId,
        ttl_ms: u64,
    },
    /// Removes the lease and deletes its keys at a new revision.
    Revoke {
        id: LeaseId,
    },
    Compact {
        revision: Revision,
    },
}

impl Change {
    fn key(&self) -> &str {
        match self {
            Change::Put { key, .. } | Change::Delete { key } => key,
        }
    }
}

#[derive(Clone, Debug, Serialize)]
#[serde(tag = "kind", rename_all = "snake_case")]
enum Change {
    Put {
        key: String,
        #[serde(with = "value_encoding")]
        value: Bytes,
        lease: LeaseId,
    },
    Delete {
        key: String,
    },
}

/// Records as read back. serde reads an internally tagged enum by buffering it first, and a
/// buffered value can no longer be taken verbatim, as a `{"json": ...}` value must be: so a
/// record is read into plain structs, whose fields serde_json hands over as they are parsed.
mod wire {
    use bytes::Bytes;
    use serde::Deserialize;

    use super::{LeaseId, Revision, value_encoding};

    #[derive(Deserialize)]
    pub struct Record {
        op: String,
        #[serde(default)]
        changes: Vec<Change>,
        id: Option<LeaseId>,
        ttl_ms: Option<u64>,
        revision: Option<Revision>,
    }

    #[derive(Deserialize)]
    pub struct Change {
        kind: String,
        key: String,
        #[serde(default, deserialize_with = "value_encoding::deserialize_some")]
        value: Option<Bytes>,
        #[serde(default)]
        lease: LeaseId,
    }

    fn missing(field: &str, op: &str) -> String {
        format!("a {op} record without {field}")
    }

    impl TryFrom<Record> for super::Record {
        type Error = String;

        fn try_from(r: Record) -> Result<Self, String> {
            let op = r.op.as_str();
            Ok(match op {
                "commit" => super::Record::Commit {
                    changes: r
                        .changes
                        .into_iter()
                        .map(super::Change::try_from)
                        .collect::<Result<_, _>>()?,
                },
                "grant" => super::Record::Grant {
                    id: r.id.ok_or_else(|| missing("id", op))?,
                    ttl_ms: r.ttl_ms.ok_or_else(|| missing("ttl_ms", op))?,
                },
                "revoke" => super::Record::Revoke { id: r.id.ok_or_else(|| missing("id", op))? },
                "compact" => super::Record::Compact {
                    revision: r.revision.ok_or_else(|| missing("revision", op))?,
                },
                other => return Err(format!("unknown record op {other:?}")),
            })
        }
    }

    impl TryFrom<Change> for super::Change {
        type Error = String;

        fn try_from(c: Change) -> Result<Self, String> {
            match c.kind.as_str() {
                "put" => Ok(super::Change::Put {
                    key: c.key,
                    value: c.value.ok_or_else(|| missing("value", "put"))?,
                    lease: c.lease,
                }),
                "delete" => Ok(super::Change::Delete { key: c.key }),
                other => Err(format!("unknown change kind {other:?}")),
            }
        }
    }
}

#[derive(Serialize, Deserialize)]
struct Snapshot {
    seq: u64,
    revision: Revision,
    floor: Revision,
    kvs: Vec<StoredKv>,
    leases: Vec<StoredLease>,
}

#[derive(Serialize, Deserialize)]
struct StoredKv {
    key: String,
    #[serde(with = "value_encoding")]
    value: Bytes,
    create_revision: Revision,
    mod_revision: Revision,
    version: i64,
    lease: LeaseId,
}

#[derive(Serialize, Deserialize)]
struct StoredLease {
    id: LeaseId,
    ttl_ms: u64,
}

/// Values are arbitrary bytes, but nearly all are JSON documents. A value that is one
/// compact JSON document is written as itself, `{"json": ...}`: checking it is cheaper than
/// escaping it into a string, and in an outage storm the audit log's event documents are
/// most of what the writer thread encodes. Any other UTF-8 value is written as
/// `{"text": "..."}`, anything else as `{"hex": "..."}`. Earlier releases wrote `text` and
/// `hex` values, or a bare hex string, all still read, so their directories open unchanged.
mod value_encoding {
    use bytes::Bytes;
    use serde::de::{self, Deserializer, MapAccess, Visitor};
    use serde::ser::{SerializeMap, Serializer};
    use serde_json::value::RawValue;

    /// `bytes` as a JSON document that re-encodes to exactly the same bytes: no whitespace
    /// around it (the parser would drop it) and no line break in it (the log is one record
    /// per line).
    fn as_document(bytes: &[u8]) -> Option<&RawValue> {
        let raw: &RawValue = serde_json::from_slice(bytes).ok()?;
        (raw.get().len() == bytes.len() && !bytes.contains(&b'\n')).then_some(raw)
    }

    pub fn serialize<S: Serializer>(bytes: &Bytes, s: S) -> Result<S::Ok, S::Error> {
        let mut map = s.serialize_map(Some(1))?;
        if let Some(document) = as_document(bytes) {
            map.serialize_entry("json", document)?;
        } else {
            match std::str::from_utf8(bytes) {
                Ok(text) => map.serialize_entry("text", text)?,
                Err(_) => map.serialize_entry("hex", &to_hex(bytes))?,
            }
        }
        map.end()
    }

    pub fn deserialize<'de, D: Deserializer<'de>>(d: D) -> Result<Bytes, D::Error> {
        d.deserialize_any(Value)
    }

    pub fn deserialize_some<'de, D: Deserializer<'de>>(d: D) -> Result<Option<Bytes>, D::Error> {
        deserialize(d).map(Some)
    }

    struct Value;

    impl<'de> Visitor<'de> for Value {
        type Value = Bytes;

        fn expecting(&self, f: &mut std::fmt::Formatter) -> std::fmt::Result {
            f.write_str("a value: {\"json\": ...}, {\"text\": ...}, {\"hex\": ...} or a hex string")
        }

        /// The earliest releases' form.
        fn visit_str<E: de::Error>(self, hex: &str) -> Result<Bytes, E> {
            from_hex(hex)
        }

        fn visit_map<A: MapAccess<'de>>(self, mut map: A) -> Result<Bytes, A::Error> {
            let value = match map.next_key::<std::borrow::Cow<'de, str>>()?.as_deref() {
                Some("json") => {
                    let document: Box<RawValue> = map.next_value()?;
                    Bytes::from(String::from(Box::<str>::from(document)))
                }
                Some("text") => Bytes::from(map.next_value::<String>()?),
                Some("hex") => from_hex(&map.next_value::<std::borrow::Cow<'de, str>>()?)?,
                Some(other) => {
                    return Err(de::Error::unknown_field(other, &["json", "text", "hex"]));
                }
                None => return Err(de::Error::missing_field("json")),
            };
            if map.next_key::<de::IgnoredAny>()?.is_some() {
                return Err(de::Error::custom("a value has exactly one of json, text or hex"));
            }
            Ok(value)
        }
    }

    fn to_hex(bytes: &[u8]) -> String {
        const DIGITS: &[u8; 16] = b"0123456789abcdef";
        let mut out = String::with_capacity(bytes.len() * 2);
        for b in bytes {
            out.push(char::from(DIGITS[usize::from(b >> 4)]));
            out.push(char::from(DIGITS[usize::from(b & 0xf)]));
        }
        out
    }

    fn from_hex<E: de::Error>(s: &str) -> Result<Bytes, E> {
        if !s.len().is_multiple_of(2) {
            return Err(E::custom("odd-length hex value"));
        }
        (0..s.len())
            .step_by(2)
            .map(|i| {
                s.get(i..i + 2)
                    .and_then(|pair| u8::from_str_radix(pair, 16).ok())
                    .ok_or_else(|| E::custom("invalid hex value"))
            })
            .collect::<Result<Vec<u8>, E>>()
            .map(Bytes::from)
    }
}

// === Recovery ===

struct Files {
    dir: PathBuf,
    log: File,
    /// Held (and locked) for as long as the writer lives.
    _lock: File,
}

struct Recovered {
    state: State,
    files: Files,
    seq: u64,
    log_len: u64,
}

fn recover(dir: &Path, options: &Options) -> Result<Recovered, StoreError> {
    std::fs::create_dir_all(dir)?;
    let lock_file = acquire_lock(dir)?;
    let now = Instant::now();

    let mut state = State::empty();
    let mut seq = 0;
    let snapshot_path = dir.join(SNAPSHOT_FILE);
    if snapshot_path.exists() {
        let bytes = std::fs::read(&snapshot_path)?;
        let snap: Snapshot = serde_json::from_slice(&bytes)
            .map_err(|e| StoreError::Corrupt(format!("{}: {e}", snapshot_path.display())))?;
        seq = snap.seq;
        state.revision = snap.revision;
        // History before the snapshot is not kept on disk.
        state.floor = snap.floor.max(snap.revision + 1);
        for l in snap.leases {
            let ttl = Duration::from_millis(l.ttl_ms);
            state.leases.insert(
                l.id,
                LeaseState { ttl, deadline: deadline(now, ttl), keys: BTreeSet::new() },
            );
        }
        for kv in snap.kvs {
            if kv.lease != 0
                && let Some(l) = state.leases.get_mut(&kv.lease)
            {
                l.keys.insert(kv.key.clone());
            }
            state.kvs.insert(
                kv.key.clone(),
                KeyValue {
                    key: kv.key,
                    value: kv.value,
                    create_revision: kv.create_revision,
                    mod_revision: kv.mod_revision,
                    version: kv.version,
                    lease: kv.lease,
                },
            );
        }
    }

    let log_path = dir.join(LOG_FILE);
    let mut log_len = 0u64;
    if log_path.exists() {
        let mut reader = BufReader::new(File::open(&log_path)?);
        let mut line = Vec::new();
        loop {
            line.clear();
            let n = reader.read_until(b'\n', &mut line)?;
            if n == 0 {
                break;
            }
            if line.last() != Some(&b'\n') {
                // A torn final line is a write that never returned to its caller: drop it.
                tracing::warn!(path = %log_path.display(), "dropping torn last record of the embedded store log");
                break;
            }
            let entry: LogEntry = serde_json::from_slice(&line).map_err(|e| {
                StoreError::Corrupt(format!("{} at byte {log_len}: {e}", log_path.display()))
            })?;
            if entry.seq > seq {
                state.apply(entry.record, now, options.retain_revisions);
                seq = entry.seq;
            }
            log_len += n as u64;
        }
    }
    let log = OpenOptions::new().create(true).append(true).open(&log_path)?;
    if log.metadata()?.len() != log_len {
        log.set_len(log_len)?;
        log.sync_all()?;
    }
    sync_dir(dir)?;
    Ok(Recovered {
        state,
        files: Files { dir: dir.to_path_buf(), log, _lock: lock_file },
        seq,
        log_len,
    })
}

// The lock is what keeps two processes from interleaving writes to one log.
fn acquire_lock(dir: &Path) -> Result<File, StoreError> {
    let path = dir.join(LOCK_FILE);
    let file = OpenOptions::new().create(true).truncate(false).write(true).open(&path)?;
    let started = Instant::now();
    loop {
        match file.try_lock() {
            Ok(()) => return Ok(file),
            Err(std::fs::TryLockError::WouldBlock) if started.elapsed() < LOCK_WAIT => {
                std::thread::sleep(Duration::from_millis(20));
            }
            Err(std::fs::TryLockError::WouldBlock) => {
                return Err(StoreError::Unavailable(format!(
                    "store directory {} is in use by another process (lock held on {})",
                    dir.display(),
                    path.display()
                )));
            }
            Err(std::fs::TryLockError::Error(e)) => return Err(e.into()),
        }
    }
}

fn sync_dir(dir: &Path) -> Result<(), StoreError> {
    File::open(dir)?.sync_all()?;
    Ok(())
}

// === Writer thread ===

type TxnReply = oneshot::Sender<Result<TxnResult, StoreError>>;

enum Command {
    Txn(Txn, TxnReply),
    Grant(Duration, oneshot::Sender<Result<LeaseId, StoreError>>),
    KeepAlive(LeaseId, oneshot::Sender<Result<Duration, StoreError>>),
    Revoke(LeaseId, oneshot::Sender<Result<(), StoreError>>),
    Compact(Revision, oneshot::Sender<Result<(), StoreError>>),
    Close(oneshot::Sender<()>),
}

/// A transaction of a group commit, planned and waiting for the group's fsync.
struct Planned {
    reply: TxnReply,
    succeeded: bool,
    changes: Vec<Change>,
}

/// Whether `txn` compares or changes a key in `written` (or deletes a prefix holding one).
fn touches(txn: &Txn, written: &HashSet<String>) -> bool {
    txn.compare.iter().any(|c| written.contains(&c.key))
        || txn.success.iter().chain(&txn.failure).any(|op| match op {
            TxnOp::Put { key, .. } | TxnOp::Delete { key } => written.contains(key),
            TxnOp::DeletePrefix { prefix } => {
                written.iter().any(|k| k.starts_with(prefix.as_str()))
            }
            TxnOp::DeleteRange { start, end } => {
                written.iter().any(|k| start.as_str() <= k.as_str() && k.as_str() < end.as_str())
            }
        })
}

struct Writer {
    state: Arc<Mutex<State>>,
    files: Files,
    seq: u64,
    log_len: u64,
    options: Options,
    revisions: watch::Sender<Revision>,
    rng: rand::rngs::StdRng,
    /// After a failed write the log may end in a partial record; refusing further writes
    /// keeps what is on disk replayable.
    failed: Option<String>,
    /// The log line being encoded, reused from record to record.
    line: Vec<u8>,
}

impl Writer {
    fn run(mut self, commands: std_mpsc::Receiver<Command>) {
        let mut last_expiry = Instant::now();
        // A command taken from the queue while gathering a group commit, handled next.
        let mut next = None;
        loop {
            let command = match next.take() {
                Some(command) => Ok(command),
                None => commands.recv_timeout(EXPIRY_TICK),
            };
            match command {
                Ok(Command::Close(done)) => {
                    drop(self);
                    let _ = done.send(());
                    return;
                }
                Ok(command) => next = self.handle(command, &commands),
                Err(std_mpsc::RecvTimeoutError::Timeout) => {}
                Err(std_mpsc::RecvTimeoutError::Disconnected) => return,
            }
            if last_expiry.elapsed() >= EXPIRY_TICK {
                last_expiry = Instant::now();
                self.expire_leases();
            }
        }
    }

    /// Commits `txn` together with the transactions queued behind it, with one write and
    /// one fsync for all of them ("group commit"): in an outage storm the audit log arrives
    /// as several transactions at once (etcd's limit of 128 operations each), and an fsync
    /// per transaction was the largest single cost of the control plane. Transactions are
    /// planned in queue order against the state before the group; one that touches a key an
    /// earlier member writes ends the group there, so every plan is the one it would have
    /// had alone. Returns the first queued command that is not a transaction.
    fn txn_group(
        &mut self,
        txn: Txn,
        reply: TxnReply,
        commands: &std_mpsc::Receiver<Command>,
    ) -> Option<Command> {
        let mut queued = vec![(txn, reply)];
        let mut rest = None;
        while queued.len() < MAX_GROUP {
            match commands.try_recv() {
                Ok(Command::Txn(txn, reply)) => queued.push((txn, reply)),
                Ok(other) => {
                    rest = Some(other);
                    break;
                }
                Err(_) => break,
            }
        }
        let mut group: Vec<Planned> = Vec::with_capacity(queued.len());
        // A lone transaction cannot conflict with anything: no key set to build.
        let track = queued.len() > 1;
        let mut written: HashSet<String> = HashSet::new();
        for (txn, reply) in queued {
            if !written.is_empty() && touches(&txn, &written) {
                self.commit_group(std::mem::take(&mut group));
                written.clear();
            }
            match lock(&self.state).plan_txn(txn) {
                Ok((succeeded, changes)) => {
                    if track {
                        written.extend(changes.iter().map(|c| c.key().to_owned()));
                    }
                    group.push(Planned { reply, succeeded, changes });
                }
                Err(e) => {
                    let _ = reply.send(Err(e));
                }
            }
        }
        self.commit_group(group);
        rest
    }

    /// Makes the planned transactions durable with one fsync, applies them in order and
    /// answers each with the revision its own commit reached.
    fn commit_group(&mut self, group: Vec<Planned>) {
        if group.is_empty() {
            return;
        }
        let mut replies = Vec::with_capacity(group.len());
        let mut records = Vec::with_capacity(group.len());
        for planned in group {
            // A transaction that changes nothing reports the revision it saw.
            let writes = !planned.changes.is_empty();
            replies.push((planned.reply, planned.succeeded, records.len() + usize::from(writes)));
            if writes {
                records.push(Record::Commit { changes: planned.changes });
            }
        }
        let start = lock(&self.state).revision;
        match self.write_records(records) {
            Ok(revisions) => {
                for (reply, succeeded, applied) in replies {
                    // `applied` counts this transaction's own record, if it has one.
                    let revision = applied.checked_sub(1).and_then(|i| revisions.get(i)).copied();
                    let revision = revision.unwrap_or(start);
                    let _ = reply.send(Ok(TxnResult { succeeded, revision }));
                }
            }
            // Nothing of the group was applied; each member learns why (a lone transaction
            // gets the error itself, as before group commits).
            Err(e) => {
                let message = e.to_string();
                let mut lone = (replies.len() == 1).then_some(e);
                for (reply, _, _) in replies {
                    let e = lone.take().unwrap_or_else(|| StoreError::Unavailable(message.clone()));
                    let _ = reply.send(Err(e));
                }
            }
        }
    }

    /// Carries out `command`; returns a command taken from the queue meanwhile (see
    /// [`Self::txn_group`]), to be handled next.
    fn handle(
        &mut self,
        command: Command,
        commands: &std_mpsc::Receiver<Command>,
    ) -> Option<Command> {
        match command {
            Command::Txn(txn, reply) => return self.txn_group(txn, reply, commands),
            Command::Grant(ttl, reply) => {
                let _ = reply.send(self.grant(ttl));
            }
            Command::KeepAlive(id, reply) => {
                let _ = reply.send(self.keep_alive(id));
            }
            Command::Revoke(id, reply) => {
                let _ = reply.send(self.revoke(id));
            }
            Command::Compact(revision, reply) => {
                let _ = reply.send(self.compact(revision));
            }
            Command::Close(_) => {}
        }
        None
    }

    fn grant(&mut self, ttl: Duration) -> Result<LeaseId, StoreError> {
        if ttl > MAX_LEASE_TTL {
            return Err(StoreError::InvalidRequest(format!(
                "lease TTL {ttl:?} is longer than the maximum {MAX_LEASE_TTL:?}"
            )));
        }
        let ttl_ms = u64::try_from(ttl.as_millis()).unwrap_or(u64::MAX).max(1);
        let id = {
            let st = lock(&self.state);
            loop {
                // etcd lease IDs are positive; 0 means "no lease".
                let id = self.rng.random::<i64>() & i64::MAX;
                if id != 0 && !st.leases.contains_key(&id) {
                    break id;
                }
            }
        };
        self.write(Record::Grant { id, ttl_ms })?;
        Ok(id)
    }

    fn keep_alive(&mut self, id: LeaseId) -> Result<Duration, StoreError> {
        // Deadlines are not persisted (a restart renews every lease), so this needs no write.
        let mut st = lock(&self.state);
        let now = Instant::now();
        match st.leases.get_mut(&id) {
            Some(lease) if lease.deadline > now => {
                lease.deadline = deadline(now, lease.ttl);
                Ok(lease.ttl)
            }
            _ => Err(StoreError::LeaseNotFound(id)),
        }
    }

    fn revoke(&mut self, id: LeaseId) -> Result<(), StoreError> {
        if !lock(&self.state).leases.contains_key(&id) {
            return Err(StoreError::LeaseNotFound(id));
        }
        self.write(Record::Revoke { id })
    }

    fn compact(&mut self, revision: Revision) -> Result<(), StoreError> {
        let (current, floor) = {
            let st = lock(&self.state);
            (st.revision, st.floor)
        };
        if revision > current {
            return Err(StoreError::InvalidRequest(format!(
                "cannot compact to revision {revision}: the store is at revision {current}"
            )));
        }
        if revision <= floor {
            return Ok(());
        }
        self.write(Record::Compact { revision })
    }

    fn expire_leases(&mut self) {
        let now = Instant::now();
        let expired: Vec<LeaseId> = lock(&self.state)
            .leases
            .iter()
            .filter(|(_, l)| l.deadline <= now)
            .map(|(id, _)| *id)
            .collect();
        for id in expired {
            if let Err(e) = self.write(Record::Revoke { id }) {
                tracing::error!(error = %e, lease = id, "embedded store could not expire a lease");
                return;
            }
        }
    }

    /// Makes `record` durable, then applies it and wakes the watchers.
    fn write(&mut self, record: Record) -> Result<(), StoreError> {
        self.write_records(vec![record]).map(|_| ())
    }

    /// Makes `records` durable with one write and one fsync, then applies them in order and
    /// wakes the watchers. Returns the store's revision after each record.
    fn write_records(&mut self, records: Vec<Record>) -> Result<Vec<Revision>, StoreError> {
        // A group of transactions that all changed nothing: no fsync for an empty write.
        if records.is_empty() {
            return Ok(Vec::new());
        }
        if let Some(reason) = &self.failed {
            return Err(StoreError::Unavailable(format!(
                "embedded store stopped accepting writes: {reason}"
            )));
        }
        let entries: Vec<LogEntry> = records
            .into_iter()
            .zip(self.seq + 1..)
            .map(|(record, seq)| LogEntry { seq, record })
            .collect();
        let mut line = std::mem::take(&mut self.line);
        line.clear();
        for entry in &entries {
            serde_json::to_writer(&mut line, entry)
                .map_err(|e| StoreError::Corrupt(format!("encoding a record: {e}")))?;
            line.push(b'\n');
        }
        let written = self.files.log.write_all(&line).and_then(|()| self.files.log.sync_data());
        let line_len = line.len() as u64;
        // Kept for the next record, unless one huge record would pin its size for good.
        if line.capacity() <= MAX_KEPT_LINE {
            self.line = line;
        }
        if let Err(e) = written {
            self.failed = Some(e.to_string());
            return Err(e.into());
        }
        self.log_len += line_len;
        let mut revisions = Vec::with_capacity(entries.len());
        {
            let mut st = lock(&self.state);
            let now = Instant::now();
            for entry in entries {
                self.seq = entry.seq;
                st.apply(entry.record, now, self.options.retain_revisions);
                revisions.push(st.revision);
            }
        }
        if let Some(revision) = revisions.last() {
            self.revisions.send_replace(*revision);
        }
        if self.log_len > self.options.log_rewrite_bytes
            && let Err(e) = self.rewrite()
        {
            // The records themselves are durable in the log; only the rewrite failed.
            tracing::error!(error = %e, "embedded store could not rewrite its snapshot");
        }
        Ok(revisions)
    }

    fn rewrite(&mut self) -> Result<(), StoreError> {
        // Copied under the lock, encoded outside it: readers wait for a copy, not for JSON.
        let snapshot = {
            let st = lock(&self.state);
            Snapshot {
                seq: self.seq,
                revision: st.revision,
                floor: st.floor,
                kvs: st
                    .kvs
                    .values()
                    .map(|kv| StoredKv {
                        key: kv.key.clone(),
                        value: kv.value.clone(),
                        create_revision: kv.create_revision,
                        mod_revision: kv.mod_revision,
                        version: kv.version,
                        lease: kv.lease,
                    })
                    .collect(),
                leases: st
                    .leases
                    .iter()
                    .map(|(id, l)| StoredLease {
                        id: *id,
                        ttl_ms: u64::try_from(l.ttl.as_millis()).unwrap_or(u64::MAX),
                    })
                    .collect(),
            }
        };
        // Streamed to the file: a snapshot of a full audit log is tens of MB, which as one
        // buffer would be allocated, page-faulted in and freed on every rewrite.
        let tmp = self.files.dir.join(SNAPSHOT_TMP_FILE);
        let mut out = std::io::BufWriter::with_capacity(256 * 1024, File::create(&tmp)?);
        serde_json::to_writer(&mut out, &snapshot)
            .map_err(|e| StoreError::Corrupt(format!("encoding the snapshot: {e}")))?;
        drop(snapshot);
        let file = out.into_inner().map_err(|e| e.into_error())?;
        file.sync_all()?;
        drop(file);
        std::fs::rename(&tmp, self.files.dir.join(SNAPSHOT_FILE))?;
        sync_dir(&self.files.dir)?;
        // Records up to `seq` are in the snapshot now; should this truncate not happen, replay
        // skips them by their sequence number.
        self.files.log.set_len(0)?;
        self.files.log.sync_all()?;
        self.log_len = 0;
        Ok(())
    }
}

// === Watchers ===

struct Watcher {
    state: Arc<Mutex<State>>,
    revisions: watch::Receiver<Revision>,
    prefix: String,
    /// The next revision this watcher has not yet looked at.
    cursor: Revision,
    tx: mpsc::Sender<Result<WatchBatch, StoreError>>,
}

impl Watcher {
    async fn run(mut self) {
        loop {
            self.revisions.borrow_and_update();
            let gathered = {
                let st = lock(&self.state);
                if self.cursor < st.floor {
                    Err(st.floor)
                } else {
                    let start = st.history.partition_point(|(r, _)| *r < self.cursor);
                    let mut batches = Vec::new();
                    for (rev, events) in st.history.range(start..).take(WATCH_CHUNK) {
                        let events: Vec<WatchEvent> = events
                            .iter()
                            .filter(|e| e.kv.key.starts_with(&self.prefix))
                            .cloned()
                            .collect();
                        if !events.is_empty() {
                            batches.push(WatchBatch { events });
                        }
                        self.cursor = rev + 1;
                    }
                    Ok((batches, self.cursor > st.revision))
                }
            };
            let (batches, caught_up) = match gathered {
                Ok(gathered) => gathered,
                Err(compact_revision) => {
                    let _ = self.tx.send(Err(StoreError::Compacted { compact_revision })).await;
                    return;
                }
            };
            for batch in batches {
                if self.tx.send(Ok(batch)).await.is_err() {
                    return;
                }
            }
            if caught_up {
                tokio::select! {
                    changed = self.revisions.changed() => if changed.is_err() { return },
                    () = self.tx.closed() => return,
                }
            }
        }
    }
}

#[cfg(test)]
#[allow(clippy::unwrap_used)]
mod tests {
    use super::*;

    fn put_op(key: &str, value: &str) -> TxnOp {
        TxnOp::Put { key: key.into(), value: value.as_bytes().to_vec(), lease: None }
    }

    #[tokio::test]
    #[allow(clippy::await_holding_lock)] // holding the writer back is the point
    async fn transactions_queued_together_commit_as_one_group_in_queue_order() {
        let dir = tempfile::tempdir().unwrap();
        let store = Arc::new(EmbeddedStore::open(dir.path()).await.unwrap());
        // Hold the state while the first transaction reaches the writer, so the writer waits
        // to plan it and the rest queue up behind it: they are then taken as one group.
        let held = lock(&store.state);
        let first = tokio::spawn({
            let store = Arc::clone(&store);
            async move { store.put("a", b"1".to_vec(), None).await }
        });
        tokio::time::sleep(Duration::from_millis(50)).await;
        let txns = vec![
            Txn { success: vec![put_op("b", "1")], ..Txn::default() },
            // Depends on `a` and `b`, both written just before it: planned after they commit.
            Txn {
                compare: vec![
                    Compare {
                        key: "a".into(),
                        op: CompareOp::Equal,
                        target: CompareTarget::Version(1),
                    },
                    Compare {
                        key: "b".into(),
                        op: CompareOp::Equal,
                        target: CompareTarget::Version(1),
                    },
                ],
                success: vec![put_op("b", "2")],
                failure: vec![put_op("failed", "yes")],
            },
            // Invalid: refused alone, the others go on.
            Txn { success: vec![put_op("c", "1"), put_op("c", "2")], ..Txn::default() },
            // Changes nothing: reports the revision it saw.
            Txn { compare: vec![Compare::absent("a")], ..Txn::default() },
            Txn { success: vec![put_op("d", "1")], ..Txn::default() },
        ];
        let mut replies = Vec::new();
        for txn in txns {
            let (tx, rx) = oneshot::channel();
            store.commands.send(Command::Txn(txn, tx)).unwrap();
            replies.push(rx);
        }
        drop(held);

        // A new store is at revision 1, as etcd is.
        assert_eq!(first.await.unwrap().unwrap(), 2);
        let mut results = Vec::new();
        for rx in replies {
            results.push(rx.await.unwrap());
        }
        let ok = |i: usize| *results[i].as_ref().unwrap();
        assert_eq!(ok(0), TxnResult { succeeded: true, revision: 3 });
        assert_eq!(ok(1), TxnResult { succeeded: true, revision: 4 }, "it saw a and b");
        assert!(matches!(results[2], Err(StoreError::InvalidRequest(_))), "{:?}", results[2]);
        assert_eq!(ok(3), TxnResult { succeeded: false, revision: 4 });
        assert_eq!(ok(4), TxnResult { succeeded: true, revision: 5 });
        assert_eq!(&store.get("b").await.unwrap().unwrap().value[..], b"2");
        assert!(store.get("failed").await.unwrap().is_none());
        assert!(store.get("c").await.unwrap().is_none());

        // The log replays to the same state.
        drop(store);
        let reopened = EmbeddedStore::open(dir.path()).await.unwrap();
        assert_eq!(reopened.current_revision().await.unwrap(), 5);
        let keys = reopened.list_keys("", "", 10).await.unwrap().keys;
        assert_eq!(keys, ["a", "b", "d"]);
    }

    #[test]
    fn a_transaction_touching_a_key_written_earlier_in_the_group_ends_the_group() {
        let written: HashSet<String> = ["audit/1".to_owned()].into();
        let put = |key: &str| Txn { success: vec![put_op(key, "x")], ..Txn::default() };
        assert!(!touches(&put("audit/2"), &written));
        assert!(touches(&put("audit/1"), &written));
        let compare = Txn { compare: vec![Compare::absent("audit/1")], ..Txn::default() };
        assert!(touches(&compare, &written));
        let in_failure =
            Txn { failure: vec![TxnOp::Delete { key: "audit/1".into() }], ..Txn::default() };
        assert!(touches(&in_failure, &written));
        let prefix = Txn {
            success: vec![TxnOp::DeletePrefix { prefix: "audit/".into() }],
            ..Txn::default()
        };
        assert!(touches(&prefix, &written));
        let other_prefix =
            Txn { success: vec![TxnOp::DeletePrefix { prefix: "keys/".into() }], ..Txn::default() };
        assert!(!touches(&other_prefix, &written));
    }

    #[test]
    fn a_delete_after_a_prefix_delete_of_the_same_key_is_a_no_op() {
        let mut st = State::empty();
        st.apply(
            Record::Commit {
                changes: vec![Change::Put { key: "a/1".into(), value: Bytes::new(), lease: 0 }],
            },
            Instant::now(),
            10,
        );
        let txn = Txn {
            success: vec![
                TxnOp::DeletePrefix { prefix: "a/".into() },
                TxnOp::Delete { key: "a/1".into() },
                TxnOp::Put { key: "b/1".into(), value: vec![1], lease: None },
            ],
            ..Txn::default()
        };
        let (ok, changes) = st.plan_txn(txn.clone()).unwrap();
        assert!(ok);
        // delete a/1, put b/1: the second delete of a/1 finds nothing.
        assert_eq!(changes.len(), 2);
    }

    #[test]
    fn history_is_bounded_in_bytes_as_well_as_in_revisions() {
        let mut st = State::empty();
        let value = vec![b'x'; 1024 * 1024];
        for i in 0..100 {
            let put =
                Change::Put { key: format!("k/{i}"), value: Bytes::from(value.clone()), lease: 0 };
            st.apply(Record::Commit { changes: vec![put] }, Instant::now(), 10_000);
        }
        assert!(st.history_bytes <= MAX_HISTORY_BYTES, "{} bytes held", st.history_bytes);
        assert_eq!(
            st.history_bytes,
            st.history.iter().map(|(_, e)| history_size(e)).sum::<usize>()
        );
        // The oldest revisions went, and a watch from them now reports compaction.
        assert!(st.history.len() < 100 && st.history.len() >= 60, "{} kept", st.history.len());
        assert_eq!(st.floor, st.history.front().unwrap().0);
        assert_eq!(st.kvs.len(), 100, "only history is bounded, never the data");
    }

    #[test]
    fn json_documents_are_written_as_themselves_other_text_as_text_and_bytes_as_hex() {
        let line = |value: &[u8]| {
            let entry = LogEntry {
                seq: 1,
                record: Record::Commit {
                    changes: vec![Change::Put {
                        key: "k".into(),
                        value: Bytes::copy_from_slice(value),
                        lease: 0,
                    }],
                },
            };
            serde_json::to_string(&entry).unwrap()
        };
        let cases: [(&[u8], &str); 5] = [
            (br#"{"a":"b\n","n":[1,2]}"#, r#""value":{"json":{"a":"b\n","n":[1,2]}}"#),
            // Whitespace around a document would be lost, a line break inside would split
            // the record: both stay text, byte for byte.
            (b" {\"a\":1}", r#""value":{"text":" {\"a\":1}"}"#),
            (b"{\n\"a\": 1\n}", r#""value":{"text":"{\n\"a\": 1\n}"}"#),
            (b"plain text", r#""value":{"text":"plain text"}"#),
            (&[0xff, 0x00], r#""value":{"hex":"ff00"}"#),
        ];
        for (value, expected) in cases {
            let line = line(value);
            assert!(line.contains(expected), "{line}");
            assert!(!line.contains('\n'), "{line}");
            let back: LogEntry = serde_json::from_str(&line).unwrap();
            let Record::Commit { changes } = &back.record else { panic!("{line}") };
            let [Change::Put { value: read, .. }] = changes.as_slice() else { panic!("{line}") };
            assert_eq!(&read[..], value, "{line}");
            assert_eq!(serde_json::to_string(&back).unwrap(), line);
        }
    }

    /// A directory written before values were stored as text (every value a bare hex
    /// string, in the snapshot and in the log) still opens with every value intact.
    #[tokio::test]
    async fn a_directory_written_with_hex_values_still_opens() {
        let dir = tempfile::tempdir().unwrap();
        let hex = |s: &str| s.bytes().map(|b| format!("{b:02x}")).collect::<String>();
        std::fs::write(
            dir.path().join(SNAPSHOT_FILE),
            format!(
                r#"{{"seq":1,"revision":2,"floor":0,"kvs":[{{"key":"a","value":"{}","create_revision":2,"mod_revision":2,"version":1,"lease":0}}],"leases":[]}}"#,
                hex(r#"{"x":1}"#)
            ),
        )
        .unwrap();
        std::fs::write(
            dir.path().join(LOG_FILE),
            format!(
                "{}\n",
                format_args!(
                    r#"{{"seq":2,"record":{{"op":"commit","changes":[{{"kind":"put","key":"b","value":"{}","lease":0}}]}}}}"#,
                    hex("plain text")
                )
            ),
        )
        .unwrap();
        let store = EmbeddedStore::open(dir.path()).await.unwrap();
        assert_eq!(&store.get("a").await.unwrap().unwrap().value[..], br#"{"x":1}"#);
        assert_eq!(&store.get("b").await.unwrap().unwrap().value[..], b"plain text");
        // New writes go on in the new form and the mixed log replays.
        store.put("c", vec![0xfe], None).await.unwrap();
        store.close().await;
        let store = EmbeddedStore::open(dir.path()).await.unwrap();
        assert_eq!(&store.get("b").await.unwrap().unwrap().value[..], b"plain text");
        assert_eq!(&store.get("c").await.unwrap().unwrap().value[..], [0xfe]);
    }
}
