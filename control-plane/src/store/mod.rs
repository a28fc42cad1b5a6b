//! The revisioned key-value store behind the control plane.
//!
//! One trait, two backends: [`etcd`] for production (several control planes may share one
//! cluster) and [`embedded`] for `switchyard dev` and single-machine installs. Both follow
//! etcd's semantics, which the conformance suite (`tests/store_conformance.rs`) pins down:
//!
//! - every write transaction increments one store-wide revision; a key remembers the
//!   revision that created it, the one that last changed it, and how many times it changed;
//! - a missing key compares as version/create/mod revision 0 (and never equals any value);
//! - a watch from revision R delivers every change at R or later, in revision order, all
//!   changes of one revision in the same batch; asking for history that compaction removed
//!   yields [`StoreError::Compacted`] as the stream's first item;
//! - a key written with a lease disappears (as a delete at a new revision) when the lease
//!   expires or is revoked.

mod api;
pub mod election;
pub mod embedded;
pub mod etcd;

pub use api::{
    Compare, CompareOp, CompareTarget, EventKind, KeyListing, KeyValue, LeaseId, Listing, Revision,
    Store, StoreError, Txn, TxnOp, TxnResult, WatchBatch, WatchEvent, WatchStream,
};

/// Opens the store named by `url`: `etcd://host:port[,host:port…]` or `file://DIR`.
pub async fn open(url: &str) -> Result<std::sync::Arc<dyn Store>, StoreError> {
    if let Some(endpoints) = url.strip_prefix("etcd://") {
        let endpoints: Vec<String> =
            endpoints.split(',').filter(|e| !e.is_empty()).map(|e| format!("http://{e}")).collect();
        if endpoints.is_empty() {
            return Err(StoreError::InvalidUrl {
                url: url.into(),
                reason: "no etcd endpoint".into(),
            });
        }
        Ok(std::sync::Arc::new(etcd::EtcdStore::connect(&endpoints).await?))
    } else if let Some(dir) = url.strip_prefix("file://") {
        if dir.is_empty() {
            return Err(StoreError::InvalidUrl { url: url.into(), reason: "no directory".into() });
        }
        Ok(std::sync::Arc::new(embedded::EmbeddedStore::open(std::path::Path::new(dir)).await?))
    } else {
        Err(StoreError::InvalidUrl {
            url: url.into(),
            reason: "expected etcd://host:port[,host:port] or file://DIR".into(),
        })
    }
}
