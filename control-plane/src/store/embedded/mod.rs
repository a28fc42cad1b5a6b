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
//! The parts, lowest first: `format` (what the files hold), `state` (the versioned key
//! space, history and leases in memory), `recovery` (opening a directory), `writer` (the
//! thread that commits), `watcher` (the tasks that feed watches); this module ties them
//! into an [`EmbeddedStore`].
//!
//! Known differences from etcd:
//! - history survives a restart only for the revisions still in the log: after reopening,
//!   the compaction floor is at least the snapshot's revision + 1 (a watcher asking for
//!   older history gets [`StoreError::Compacted`] and must re-list, as it must on etcd);
//! - history is bounded to the last [`Options::retain_revisions`] revisions and to a fixed
//!   number of bytes of keys and values (`state::MAX_HISTORY_BYTES`); etcd keeps everything
//!   until someone compacts;
//! - lease TTLs are honoured to the millisecond (etcd rounds up to seconds and to a minimum);
//!   after a restart every lease gets its full TTL again, as etcd does after a leader change;
//! - a watcher that reads slower than writes arrive keeps reading from history and is cut
//!   off with [`StoreError::Compacted`] once retention passes it (see [`Options::watch_buffer`]);
//! - one fsync per write, except that transactions waiting in the queue together are
//!   committed with one (`Writer::txn_group`): write throughput is the disk's fsync rate
//!   times the writes in flight, plenty for configuration data and the audit log;
//! - one process per directory, so replicas cannot share it (election still works between
//!   tasks of that process).

mod format;
mod options;
mod recovery;
mod state;
mod watcher;
mod writer;

use std::path::Path;
use std::sync::Arc;
use std::sync::mpsc as std_mpsc;
use std::time::Duration;

use async_trait::async_trait;
use parking_lot::Mutex;
use tokio::sync::{mpsc, oneshot, watch};

pub use self::options::Options;
use self::recovery::recover;
use self::state::State;
use self::watcher::Watcher;
use self::writer::{Command, Writer};
use crate::store::api::{
    Compare, CompareOp, CompareTarget, KeyListing, KeyValue, LeaseId, Listing, Revision, Store,
    StoreError, Txn, TxnOp, TxnResult, WatchStream,
};

/// An open directory. Reads are answered from the state under its mutex; writes, leases and
/// compaction go to the writer thread and wait for its answer.
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
        let current = state.lock().revision;
        let (rev_tx, rev_rx) = watch::channel(current);
        let (cmd_tx, cmd_rx) = std_mpsc::channel();
        let writer = Writer::new(
            state.clone(),
            recovered.files,
            recovered.seq,
            recovered.log_len,
            options.clone(),
            rev_tx,
        );
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
        Ok(self.state.lock().kvs.get(key).cloned())
    }

    async fn list(&self, prefix: &str) -> Result<Listing, StoreError> {
        let st = self.state.lock();
        let kvs = st.under(prefix, prefix).map(|(_, kv)| kv.clone()).collect();
        Ok(Listing { kvs, revision: st.revision })
    }

    async fn list_keys(
        &self,
        prefix: &str,
        from: &str,
        limit: usize,
    ) -> Result<KeyListing, StoreError> {
        let st = self.state.lock();
        let keys = st.under(prefix, from).take(limit).map(|(k, _)| k.clone()).collect();
        Ok(KeyListing { keys, revision: st.revision })
    }

    async fn list_page(
        &self,
        prefix: &str,
        from: &str,
        limit: usize,
    ) -> Result<Listing, StoreError> {
        let st = self.state.lock();
        let kvs = st.under(prefix, from).take(limit).map(|(_, kv)| kv.clone()).collect();
        Ok(Listing { kvs, revision: st.revision })
    }

    async fn count(&self, prefix: &str) -> Result<(usize, Revision), StoreError> {
        let st = self.state.lock();
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
        let cursor = if from <= 0 { self.state.lock().revision + 1 } else { from };
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
        Ok(self.state.lock().revision)
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

#[cfg(test)]
mod tests {
    use super::*;

    fn put_op(key: &str, value: &str) -> TxnOp {
        TxnOp::Put { key: key.into(), value: value.as_bytes().to_vec(), lease: None }
    }

    #[tokio::test]
    async fn transactions_queued_together_commit_as_one_group_in_queue_order() {
        let dir = tempfile::tempdir().unwrap();
        let store = EmbeddedStore::open(dir.path()).await.unwrap();
        // Hold the state while every transaction is queued, so the writer cannot plan any of
        // them until all are waiting: the queue fixes their order (sent here, one after the
        // other, rather than from tasks whose order the scheduler would choose), and the
        // writer takes what waits behind the first as one group.
        let held = store.state.lock();
        let txns = vec![
            Txn { success: vec![put_op("a", "1")], ..Txn::default() },
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

        let mut results = Vec::new();
        for rx in replies {
            results.push(rx.await.unwrap());
        }
        let ok = |i: usize| *results[i].as_ref().unwrap();
        // A new store is at revision 1, as etcd is.
        assert_eq!(ok(0), TxnResult { succeeded: true, revision: 2 });
        assert_eq!(ok(1), TxnResult { succeeded: true, revision: 3 });
        assert_eq!(ok(2), TxnResult { succeeded: true, revision: 4 }, "it saw a and b");
        assert!(matches!(results[3], Err(StoreError::InvalidRequest(_))), "{:?}", results[3]);
        assert_eq!(ok(4), TxnResult { succeeded: false, revision: 4 });
        assert_eq!(ok(5), TxnResult { succeeded: true, revision: 5 });
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
}
