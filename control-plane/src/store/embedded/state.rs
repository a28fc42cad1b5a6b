//! The store's state in memory, versioned as etcd's MVCC store is: the key space at the
//! current revision, the recent history watchers read from, and the leases.
//!
//! Everything here is synchronous and free of I/O so that the writer thread can plan a
//! change against the state, make it durable, and only then apply it; replay after a
//! restart applies the same records through the same code, so [`State::apply`] must be
//! deterministic.

use std::collections::{BTreeMap, BTreeSet, HashMap, VecDeque};
use std::ops::Bound;
use std::time::{Duration, Instant};

use bytes::Bytes;

use super::format::{Change, Record, Snapshot, StoredKv, StoredLease};
use crate::store::api::{
    Compare, CompareOp, CompareTarget, EventKind, KeyValue, LeaseId, Revision, StoreError, Txn,
    TxnOp, WatchEvent,
};

/// etcd's `MaxLeaseTTL`.
pub(super) const MAX_LEASE_TTL: Duration = Duration::from_secs(9_000_000_000);
/// etcd's default `--max-txn-ops`.
const MAX_TXN_OPS: usize = 128;
/// History is also bounded in bytes, because a bound in revisions alone does not bound
/// memory: in an outage storm every revision is a transaction of up to `MAX_TXN_OPS` audit
/// entries, far larger than an ordinary write. The bound still leaves watchers several
/// seconds of history to catch up from during such a storm.
pub(super) const MAX_HISTORY_BYTES: usize = 64 * 1024 * 1024;

#[derive(Default)]
pub(super) struct State {
    pub(super) revision: Revision,
    /// The oldest revision a watch may start from; history holds every revision from here on.
    pub(super) floor: Revision,
    pub(super) kvs: BTreeMap<String, KeyValue>,
    /// One entry per revision, ascending; every revision changed at least one key.
    pub(super) history: VecDeque<(Revision, Vec<WatchEvent>)>,
    /// [`history_size`] of everything in `history`.
    history_bytes: usize,
    pub(super) leases: HashMap<LeaseId, LeaseState>,
}

pub(super) struct LeaseState {
    pub(super) ttl: Duration,
    pub(super) deadline: Instant,
    keys: BTreeSet<String>,
}

pub(super) fn deadline(now: Instant, ttl: Duration) -> Instant {
    // Only a hand-edited file can hold a TTL past MAX_LEASE_TTL; such a lease never expires.
    now.checked_add(ttl).unwrap_or(now + MAX_LEASE_TTL)
}

impl State {
    pub(super) fn empty() -> Self {
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

    /// The entries under `prefix` from key `from` on (from the prefix's start when `from`
    /// sorts before it), in key order.
    pub(super) fn under<'a>(
        &'a self,
        prefix: &'a str,
        from: &'a str,
    ) -> impl Iterator<Item = (&'a String, &'a KeyValue)> + 'a {
        let start = from.max(prefix);
        self.kvs
            .range::<str, _>((Bound::Included(start), Bound::Unbounded))
            .take_while(move |(k, _)| k.starts_with(prefix))
    }

    /// Resolves a transaction into concrete single-key changes without touching the state.
    pub(super) fn plan_txn(&self, txn: Txn) -> Result<(bool, Vec<Change>), StoreError> {
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
    pub(super) fn apply(&mut self, record: Record, now: Instant, retain: usize) {
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

// === Snapshots ===

impl State {
    /// The state a snapshot holds, with every lease given its full TTL from `now` (deadlines
    /// are not persisted). History before the snapshot is not kept on disk.
    pub(super) fn from_snapshot(snap: Snapshot, now: Instant) -> Self {
        let mut state = Self::empty();
        state.revision = snap.revision;
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
        state
    }

    /// A copy of the key space, the leases and the revision counter, as of log sequence
    /// number `seq`. Values are shared, not copied.
    pub(super) fn snapshot(&self, seq: u64) -> Snapshot {
        Snapshot {
            seq,
            revision: self.revision,
            floor: self.floor,
            kvs: self
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
            leases: self
                .leases
                .iter()
                .map(|(id, l)| StoredLease {
                    id: *id,
                    ttl_ms: u64::try_from(l.ttl.as_millis()).unwrap_or(u64::MAX),
                })
                .collect(),
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

#[cfg(test)]
mod tests {
    use super::*;

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
}
