//! Leader election over any [`Store`], so work that must happen once (webhook delivery)
//! runs on one control-plane replica.
//!
//! The classic etcd recipe (etcd's `concurrency.Election`):
//! 1. each candidate writes `<prefix>/<lease as 16 hex digits>` with its lease, if absent;
//! 2. the candidate whose key has the lowest `create_revision` is the leader;
//! 3. every other candidate watches only the key just ahead of it and re-checks when that
//!    key is deleted (resignation, lease revoked or expired), so a change wakes one waiter
//!    instead of the whole queue.
//!
//! Leadership lasts as long as the candidate's lease: the holder must keep the lease alive,
//! and should stop leader-only work when [`Leadership::lost`] resolves.

use std::sync::Arc;

use super::api::{
    Compare, CompareOp, CompareTarget, EventKind, KeyValue, LeaseId, Revision, Store, StoreError,
    Txn, TxnOp,
};

/// Held by the elected leader.
pub struct Leadership {
    store: Arc<dyn Store>,
    key: String,
    create_revision: Revision,
    lease: LeaseId,
}

/// Blocks until `candidate` leads the election under `election_prefix`; `lease` must be
/// kept alive by the caller. Fails with [`StoreError::LeaseNotFound`] if the candidate's key
/// disappears while it waits (its lease expired or was revoked).
pub async fn campaign(
    store: Arc<dyn Store>,
    election_prefix: &str,
    candidate: &str,
    lease: LeaseId,
) -> Result<Leadership, StoreError> {
    let prefix = format!("{}/", election_prefix.trim_end_matches('/'));
    let key = format!("{prefix}{lease:016x}");
    let txn = Txn {
        compare: vec![Compare::absent(key.clone())],
        success: vec![TxnOp::Put {
            key: key.clone(),
            value: candidate.as_bytes().to_vec(),
            lease: Some(lease),
        }],
        failure: vec![],
    };
    store.txn(txn).await?;
    // A retry of an earlier campaign with the same lease keeps its place in the queue.
    let create_revision = match store.get(&key).await? {
        Some(kv) => kv.create_revision,
        None => return Err(StoreError::LeaseNotFound(lease)),
    };

    loop {
        let listing = store.list(&prefix).await?;
        if !listing.kvs.iter().any(|kv| kv.key == key && kv.create_revision == create_revision) {
            return Err(StoreError::LeaseNotFound(lease));
        }
        let ahead = listing
            .kvs
            .iter()
            .filter(|kv| kv.create_revision < create_revision)
            .max_by_key(|kv| kv.create_revision);
        let Some(ahead) = ahead else {
            return Ok(Leadership { store, key, create_revision, lease });
        };
        // Watching our own key too notices a lost lease while still in line.
        let from = listing.revision + 1;
        tokio::select! {
            ahead_gone = wait_for_delete(store.as_ref(), &ahead.key, from) => {
                ahead_gone?;
            }
            own_gone = wait_for_delete(store.as_ref(), &key, from) => {
                if own_gone? {
                    return Err(StoreError::LeaseNotFound(lease));
                }
            }
        }
    }
}

/// The current leader's key and value under `election_prefix`, if any.
pub async fn leader(
    store: &dyn Store,
    election_prefix: &str,
) -> Result<Option<KeyValue>, StoreError> {
    let prefix = format!("{}/", election_prefix.trim_end_matches('/'));
    Ok(store.list(&prefix).await?.kvs.into_iter().min_by_key(|kv| kv.create_revision))
}

/// Withdraws the candidate campaigning with `lease` under `election_prefix`, leader or
/// still in line, so that the next one leads at once instead of when the lease expires.
/// The caller first stops whatever would campaign again.
pub async fn withdraw(
    store: &dyn Store,
    election_prefix: &str,
    lease: LeaseId,
) -> Result<(), StoreError> {
    let key = format!("{}/{lease:016x}", election_prefix.trim_end_matches('/'));
    store.delete(&key).await?;
    Ok(())
}

/// Returns `true` once `key` is deleted at or after `from`, `false` when the history needed to
/// tell was compacted (the caller re-reads the key). Keys under one election prefix have a
/// fixed length, so watching `key` as a prefix matches only `key`.
async fn wait_for_delete(store: &dyn Store, key: &str, from: Revision) -> Result<bool, StoreError> {
    let mut watch = store.watch(key, from).await?;
    loop {
        match watch.next().await {
            Some(Ok(batch)) => {
                if batch.events.iter().any(|e| e.kind == EventKind::Delete && e.kv.key == key) {
                    return Ok(true);
                }
            }
            Some(Err(StoreError::Compacted { .. })) => return Ok(false),
            Some(Err(e)) => return Err(e),
            None => return Err(StoreError::Unavailable("election watch ended".into())),
        }
    }
}

// === impl Leadership ===

impl Leadership {
    /// The leader's key (`<prefix>/<lease hex>`).
    pub fn key(&self) -> &str {
        &self.key
    }

    /// The revision at which this candidate joined; it only grows from one leader to the
    /// next, so it can fence writes made on the leader's behalf.
    pub fn revision(&self) -> Revision {
        self.create_revision
    }

    pub fn lease(&self) -> LeaseId {
        self.lease
    }

    /// Whether the leader's key still exists (the lease is alive and nobody resigned).
    pub async fn is_leader(&self) -> Result<bool, StoreError> {
        Ok(self
            .store
            .get(&self.key)
            .await?
            .is_some_and(|kv| kv.create_revision == self.create_revision))
    }

    /// Resolves when leadership is lost: the key was deleted (lease expired or revoked, or
    /// someone resigned it).
    pub async fn lost(&self) -> Result<(), StoreError> {
        loop {
            let revision = self.store.current_revision().await?;
            if !self.is_leader().await? {
                return Ok(());
            }
            wait_for_delete(self.store.as_ref(), &self.key, revision + 1).await?;
        }
    }

    /// Steps down by deleting the key (only if it is still this candidate's); the next
    /// candidate in line becomes leader. The lease itself is left to the caller.
    pub async fn resign(self) -> Result<(), StoreError> {
        let txn = Txn {
            compare: vec![Compare {
                key: self.key.clone(),
                op: CompareOp::Equal,
                target: CompareTarget::CreateRevision(self.create_revision),
            }],
            success: vec![TxnOp::Delete { key: self.key.clone() }],
            failure: vec![],
        };
        self.store.txn(txn).await?;
        Ok(())
    }
}
