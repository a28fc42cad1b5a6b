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

use std::path::{Path, PathBuf};
use std::sync::Arc;

pub use api::{
    Compare, CompareOp, CompareTarget, EventKind, KeyListing, KeyValue, LeaseId, Listing, Revision,
    Store, StoreError, Txn, TxnOp, TxnResult, WatchBatch, WatchEvent, WatchStream,
};

/// Opens the store named by `url`: `etcd://host:port[,host:port…]` or `file://DIR`. An etcd
/// endpoint without a scheme is `https://` when `etcd.tls` is set, else `http://`; one may
/// also be written with its scheme (`etcd://https://host:2379,https://host2:2379`).
pub async fn open(url: &str, etcd: etcd::EtcdOptions) -> Result<Arc<dyn Store>, StoreError> {
    if let Some(endpoints) = url.strip_prefix("etcd://") {
        let scheme = if etcd.tls.is_some() { "https" } else { "http" };
        let endpoints: Vec<String> = endpoints
            .split(',')
            .map(str::trim)
            .filter(|e| !e.is_empty())
            .map(|e| {
                let plain = e.get(..7).is_some_and(|s| s.eq_ignore_ascii_case("http://"));
                if plain || switchyard_tls::connect::is_https(e) {
                    e.to_owned()
                } else {
                    format!("{scheme}://{e}")
                }
            })
            .collect();
        if endpoints.is_empty() {
            return Err(StoreError::InvalidUrl {
                url: url.into(),
                reason: "no etcd endpoint".into(),
            });
        }
        Ok(Arc::new(etcd::EtcdStore::connect_with(&endpoints, etcd).await?))
    } else if let Some(dir) = url.strip_prefix("file://") {
        if etcd.tls.is_some() || etcd.credentials.is_some() {
            return Err(StoreError::InvalidUrl {
                url: url.into(),
                reason: "etcd TLS or credentials are set but the store is not etcd://".into(),
            });
        }
        let dir = store_dir(url, dir)?;
        Ok(Arc::new(embedded::EmbeddedStore::open(&dir).await?))
    } else {
        Err(StoreError::InvalidUrl {
            url: url.into(),
            reason: "expected etcd://host:port[,host:port] or file://DIR".into(),
        })
    }
}

/// The absolute directory of a `file://DIR` store. A relative `DIR` (`file://data/store`)
/// is accepted, since scripts use it, but resolved here, once, against the working
/// directory and logged: the process may change directory later, and an operator reading
/// an error or the log must see which directory was meant.
fn store_dir(url: &str, dir: &str) -> Result<PathBuf, StoreError> {
    if dir.is_empty() {
        return Err(StoreError::InvalidUrl {
            url: url.into(),
            reason: "no directory after file:// (file:///absolute/dir, or file://dir relative \
                     to the working directory)"
                .into(),
        });
    }
    let given = Path::new(dir);
    if given.is_absolute() {
        return Ok(given.to_path_buf());
    }
    let absolute = std::path::absolute(given).map_err(|e| StoreError::InvalidUrl {
        url: url.into(),
        reason: format!("cannot resolve the relative directory {dir:?}: {e}"),
    })?;
    tracing::info!(
        url,
        dir = %absolute.display(),
        "the store directory is relative: resolved against the working directory"
    );
    Ok(absolute)
}

#[cfg(test)]
mod tests {
    use super::*;

    /// `target` as a path relative to the working directory (`../../tmp/…`), so a test can
    /// name a temporary directory the way a script names `file://data/store`.
    fn relative_to_cwd(target: &Path) -> PathBuf {
        // `..` is resolved by the kernel against the physical directory, so count its parts.
        let cwd = std::env::current_dir().unwrap().canonicalize().unwrap();
        let target = target.canonicalize().unwrap();
        let mut relative = PathBuf::new();
        for _ in cwd.components().skip(1) {
            relative.push("..");
        }
        relative.join(target.strip_prefix("/").unwrap())
    }

    #[test]
    fn a_relative_file_url_resolves_against_the_working_directory() {
        let dir = store_dir("file://data/store", "data/store").unwrap();
        assert!(dir.is_absolute(), "{}", dir.display());
        assert_eq!(dir, std::env::current_dir().unwrap().join("data/store"));
    }

    #[test]
    fn an_absolute_file_url_is_used_as_given() {
        let dir = store_dir("file:///var/lib/switchyard", "/var/lib/switchyard").unwrap();
        assert_eq!(dir, Path::new("/var/lib/switchyard"));
    }

    #[tokio::test]
    async fn a_file_url_without_a_directory_is_refused_clearly() {
        match open("file://", etcd::EtcdOptions::default()).await {
            Err(e @ StoreError::InvalidUrl { .. }) => {
                let message = e.to_string();
                assert!(message.contains("\"file://\""), "{message}");
                assert!(message.contains("no directory"), "{message}");
            }
            Err(other) => panic!("expected InvalidUrl, got {other}"),
            Ok(_) => panic!("opened a store with no directory"),
        }
    }

    #[tokio::test]
    async fn a_relative_file_url_opens_the_store_in_the_directory_it_resolves_to() {
        let tmp = tempfile::tempdir().unwrap();
        let relative = relative_to_cwd(tmp.path()).join("store");
        assert!(relative.is_relative());
        let store = open(&format!("file://{}", relative.display()), etcd::EtcdOptions::default())
            .await
            .unwrap();
        store.put("k", b"v".to_vec(), None).await.unwrap();
        assert!(tmp.path().join("store").join("LOCK").is_file());
        let log = std::fs::read_to_string(tmp.path().join("store").join("wal.jsonl")).unwrap();
        assert!(log.contains("\"key\":\"k\""), "{log}");
    }

    #[tokio::test]
    async fn an_error_opening_a_relative_store_names_the_absolute_directory() {
        let tmp = tempfile::tempdir().unwrap();
        // A file where the store's parent directory should be: the directory cannot be made.
        std::fs::write(tmp.path().join("blocker"), b"").unwrap();
        let relative = relative_to_cwd(tmp.path()).join("blocker").join("store");
        let absolute = std::env::current_dir().unwrap().join(&relative);
        match open(&format!("file://{}", relative.display()), etcd::EtcdOptions::default()).await {
            Err(e @ StoreError::Directory { .. }) => {
                let message = e.to_string();
                assert!(message.contains(&absolute.display().to_string()), "{message}");
            }
            Err(other) => panic!("expected a Directory error, got {other}"),
            Ok(_) => panic!("opened a store below a regular file"),
        }
    }
}
