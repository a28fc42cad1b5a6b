//! The store's API: the [`Store`] trait both backends implement and the types it speaks.
//!
//! It lives below the backends and the module that picks one (`store/mod.rs` re-exports it),
//! so each backend depends on the contract and nothing depends back on a backend.

use std::time::Duration;

use async_trait::async_trait;
use bytes::Bytes;
use tokio::sync::mpsc;

pub type Revision = i64;
pub type LeaseId = i64;

#[derive(Clone, Debug, PartialEq, Eq)]
pub struct KeyValue {
    pub key: String,
    /// Shared, not copied: the embedded store hands the same bytes to its index, its watch
    /// history and every watcher.
    pub value: Bytes,
    pub create_revision: Revision,
    pub mod_revision: Revision,
    /// Number of writes since the key was (re)created; 1 after the first put.
    pub version: i64,
    /// 0 when the key has no lease.
    pub lease: LeaseId,
}

/// Keys under a prefix, sorted by key, as of `revision`.
#[derive(Clone, Debug, Default)]
pub struct Listing {
    pub kvs: Vec<KeyValue>,
    pub revision: Revision,
}

/// Keys without their values: see [`Store::list_keys`].
#[derive(Clone, Debug, Default, PartialEq, Eq)]
pub struct KeyListing {
    pub keys: Vec<String>,
    pub revision: Revision,
}

#[derive(Clone, Debug, PartialEq, Eq)]
pub struct Compare {
    pub key: String,
    pub op: CompareOp,
    pub target: CompareTarget,
}

#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum CompareOp {
    Equal,
    NotEqual,
    Greater,
    Less,
}

#[derive(Clone, Debug, PartialEq, Eq)]
pub enum CompareTarget {
    Version(i64),
    CreateRevision(Revision),
    ModRevision(Revision),
    Value(Vec<u8>),
}

impl Compare {
    /// True when the key does not exist (etcd's `create_revision == 0`).
    pub fn absent(key: impl Into<String>) -> Self {
        Self { key: key.into(), op: CompareOp::Equal, target: CompareTarget::CreateRevision(0) }
    }

    /// True when the key was last written at `revision` (0: the key does not exist).
    pub fn mod_revision(key: impl Into<String>, revision: Revision) -> Self {
        Self { key: key.into(), op: CompareOp::Equal, target: CompareTarget::ModRevision(revision) }
    }
}

/// One write of a transaction. `DeleteRange` deletes every key `k` with `start <= k < end`
/// (etcd's `DeleteRange` with a `range_end`): one operation however many keys it removes,
/// where a `Delete` per key takes a transaction per 128 of them.
#[derive(Clone, Debug, PartialEq, Eq)]
pub enum TxnOp {
    Put { key: String, value: Vec<u8>, lease: Option<LeaseId> },
    Delete { key: String },
    DeletePrefix { prefix: String },
    DeleteRange { start: String, end: String },
}

/// If every comparison holds, `success` runs, else `failure`; atomically, at one revision.
#[derive(Clone, Debug, Default, PartialEq, Eq)]
pub struct Txn {
    pub compare: Vec<Compare>,
    pub success: Vec<TxnOp>,
    pub failure: Vec<TxnOp>,
}

impl Txn {
    /// Refuses a `DeleteRange` whose `end` is not past its `start`, or whose `start` is
    /// empty, in both backends alike: etcd reads an `end` of `"\0"` as "every key from
    /// `start` on", which no caller means, and refuses an empty key itself.
    pub fn check_ranges(&self) -> Result<(), StoreError> {
        for op in self.success.iter().chain(&self.failure) {
            if let TxnOp::DeleteRange { start, end } = op
                && (start.is_empty() || start >= end)
            {
                return Err(StoreError::InvalidRequest(format!(
                    "empty key range [{start:?}, {end:?})"
                )));
            }
        }
        Ok(())
    }
}

#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub struct TxnResult {
    pub succeeded: bool,
    /// The store's revision after the transaction.
    pub revision: Revision,
}

#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum EventKind {
    Put,
    Delete,
}

#[derive(Clone, Debug, PartialEq, Eq)]
pub struct WatchEvent {
    pub kind: EventKind,
    /// For a delete: the key, with `mod_revision` the revision of the delete and an empty value.
    pub kv: KeyValue,
}

/// Changes of one or more whole revisions, in revision order.
#[derive(Clone, Debug, PartialEq, Eq)]
pub struct WatchBatch {
    pub events: Vec<WatchEvent>,
}

/// A live watch. Dropping it cancels the watch.
pub struct WatchStream {
    rx: mpsc::Receiver<Result<WatchBatch, StoreError>>,
}

impl WatchStream {
    pub fn new(rx: mpsc::Receiver<Result<WatchBatch, StoreError>>) -> Self {
        Self { rx }
    }

    /// The next batch; `None` when the watch ended (after an error, or the store closed).
    pub async fn next(&mut self) -> Option<Result<WatchBatch, StoreError>> {
        self.rx.recv().await
    }
}

#[derive(Debug, thiserror::Error)]
pub enum StoreError {
    #[error("requested revision was compacted; the oldest available is {compact_revision}")]
    Compacted { compact_revision: Revision },
    #[error("lease {0:x} not found or expired")]
    LeaseNotFound(LeaseId),
    #[error("store unavailable: {0}")]
    Unavailable(String),
    /// etcd answered, but with more than the client takes in one response: a listing asks
    /// again for fewer keys (etcd pages by count, not by bytes).
    #[error("store response too large: {0}")]
    ResponseTooLarge(String),
    #[error("store data is corrupt: {0}")]
    Corrupt(String),
    /// A request etcd would refuse (a txn writing one key twice or with too many operations,
    /// compaction to a future revision); the embedded store refuses the same ones.
    #[error("invalid store request: {0}")]
    InvalidRequest(String),
    /// A majority of etcd's members is unreachable or no leader could be elected: writes
    /// (and linearizable reads) fail until it is back. The message counts the members.
    #[error("store unavailable: {0}")]
    NoQuorum(String),
    /// etcd refused the credentials (`SWITCHYARD_ETCD_USER`); never holds the password.
    #[error("etcd authentication failed for user {user:?}: {reason}")]
    AuthFailed { user: String, reason: String },
    /// The etcd user's role does not cover a key the store needs.
    #[error("store access denied: {0}")]
    PermissionDenied(String),
    /// A TLS file given for etcd (`--etcd-ca`, `--etcd-cert`, `--etcd-key`) is unusable;
    /// the message starts with the flag and the file.
    #[error("{0}")]
    TlsFile(String),
    #[error("invalid store address {url:?}: {reason}")]
    InvalidUrl { url: String, reason: String },
    /// I/O on the embedded store's directory failed; names the (absolute) directory, which
    /// an error from the OS alone ("Permission denied") does not.
    #[error("store directory {}: {source}", dir.display())]
    Directory { dir: std::path::PathBuf, source: std::io::Error },
    #[error("store I/O error: {0}")]
    Io(#[from] std::io::Error),
}

#[async_trait]
pub trait Store: Send + Sync + 'static {
    async fn get(&self, key: &str) -> Result<Option<KeyValue>, StoreError>;
    async fn list(&self, prefix: &str) -> Result<Listing, StoreError>;
    /// The first `limit` keys under `prefix` that sort at or after `from` (pass `prefix` for
    /// the start), in key order, without their values. Cheap where `list` is not: the audit
    /// log's retention trims the oldest of 100,000 entries without reading them.
    async fn list_keys(
        &self,
        prefix: &str,
        from: &str,
        limit: usize,
    ) -> Result<KeyListing, StoreError>;
    /// Like [`Store::list_keys`] but with values: at most `limit` keys under `prefix` from
    /// `from` on, in key order. A backend may return fewer (etcd, when `limit` values are
    /// more than one response carries), but at least one when any is left; callers page on
    /// from the last key. For the admin API's paged listings, which must not read a million
    /// keys to answer a page.
    async fn list_page(
        &self,
        prefix: &str,
        from: &str,
        limit: usize,
    ) -> Result<Listing, StoreError>;
    /// How many keys there are under `prefix`, and the revision counted at.
    async fn count(&self, prefix: &str) -> Result<(usize, Revision), StoreError>;
    /// Returns the revision of the write.
    async fn put(
        &self,
        key: &str,
        value: Vec<u8>,
        lease: Option<LeaseId>,
    ) -> Result<Revision, StoreError>;
    /// Returns whether the key existed.
    async fn delete(&self, key: &str) -> Result<bool, StoreError>;
    async fn txn(&self, txn: Txn) -> Result<TxnResult, StoreError>;
    /// Changes to keys under `prefix` from revision `from` on (0: from now on).
    async fn watch(&self, prefix: &str, from: Revision) -> Result<WatchStream, StoreError>;
    /// Forgets history before `revision`.
    async fn compact(&self, revision: Revision) -> Result<(), StoreError>;
    async fn current_revision(&self) -> Result<Revision, StoreError>;
    /// The store may round `ttl` up to its minimum (etcd's is a few seconds).
    async fn grant_lease(&self, ttl: Duration) -> Result<LeaseId, StoreError>;
    /// Renews the lease to its full TTL and returns that TTL.
    async fn keep_alive(&self, lease: LeaseId) -> Result<Duration, StoreError>;
    async fn revoke_lease(&self, lease: LeaseId) -> Result<(), StoreError>;
}
