//! The admin service's state and what every resource's calls share: its errors and how
//! they become gRPC statuses, the catalog read, stored JSON decoded.

use std::ops::ControlFlow;
use std::sync::Arc;
use std::sync::atomic::AtomicBool;

use tonic::Status;

use switchyard_catalog::{ApiKeyRecord, Catalog, FieldError, ValidationErrors};

use crate::fanout::ConfigCache;
use crate::faults::FaultError;
use crate::layout::Layout;
use crate::paging::PagingError;
use crate::store::{Revision, Store, StoreError};

#[derive(Debug, thiserror::Error)]
pub enum AdminError {
    #[error("{0}")]
    Invalid(#[from] ValidationErrors),
    #[error("{0}")]
    NotFound(String),
    #[error("{0}")]
    Conflict(String),
    #[error("{0}")]
    AlreadyExists(String),
    #[error("{0}")]
    FailedPrecondition(String),
    #[error(transparent)]
    Store(#[from] StoreError),
    #[error("stored {what} is unreadable: {reason}")]
    Corrupt { what: String, reason: String },
}

impl From<AdminError> for Status {
    fn from(e: AdminError) -> Self {
        let message = e.to_string();
        match e {
            AdminError::Invalid(_) => Status::invalid_argument(message),
            AdminError::NotFound(_) => Status::not_found(message),
            AdminError::Conflict(_) => Status::aborted(message),
            AdminError::AlreadyExists(_) => Status::already_exists(message),
            AdminError::FailedPrecondition(_) => Status::failed_precondition(message),
            AdminError::Store(_) => Status::unavailable(message),
            AdminError::Corrupt { .. } => Status::internal(message),
        }
    }
}

impl From<FaultError> for AdminError {
    fn from(e: FaultError) -> Self {
        match e {
            FaultError::Invalid(errors) => Self::Invalid(errors),
            FaultError::Duplicate(_) => Self::AlreadyExists(e.to_string()),
            FaultError::NotFound(_) => Self::NotFound(e.to_string()),
            FaultError::Store(e) => Self::Store(e),
            FaultError::Corrupt { what, reason } => Self::Corrupt { what: what.into(), reason },
        }
    }
}

impl From<PagingError> for AdminError {
    fn from(e: PagingError) -> Self {
        match e {
            PagingError::BadToken(_) => invalid("page_token", e.to_string()),
            PagingError::TooLarge { .. } => Self::FailedPrecondition(e.to_string()),
            PagingError::Store(e) => Self::Store(e),
        }
    }
}

pub(super) fn invalid(path: &str, message: impl Into<String>) -> AdminError {
    AdminError::Invalid(ValidationErrors(vec![FieldError::new(path, message)]))
}

#[derive(Clone)]
pub struct AdminService {
    pub store: Arc<dyn Store>,
    pub layout: Layout,
    pub cache: Arc<ConfigCache>,
    /// Turns `true` when the replica shuts down: `events --follow` streams end then, with
    /// a status saying so, rather than holding the shutdown until its drain timeout.
    pub stopping: tokio::sync::watch::Receiver<bool>,
    /// The fleet's breaker view, for `ListBreakers`.
    pub fleet: Arc<crate::fleet::Fleet>,
    /// Whether this service (and its clones) is filling in the secret index already
    /// (`spawn_backfill`): one backfill at a time per service, not per process, so that two
    /// services in one process (tests) do not wait on each other's.
    pub(super) backfilling: Arc<AtomicBool>,
}

impl AdminService {
    pub fn new(
        store: Arc<dyn Store>,
        layout: Layout,
        cache: Arc<ConfigCache>,
        stopping: tokio::sync::watch::Receiver<bool>,
        fleet: Arc<crate::fleet::Fleet>,
    ) -> Self {
        Self { store, layout, cache, stopping, fleet, backfilling: Arc::default() }
    }

    pub(super) async fn load_catalog(&self) -> Result<(Catalog, Revision), AdminError> {
        match self.store.get(&self.layout.catalog()).await? {
            None => Ok((Catalog::default(), 0)),
            Some(kv) => Ok((decode(&kv.value, "catalog")?, kv.mod_revision)),
        }
    }
}

/// Keys read at a time by [`AdminService::scan_keys`].
pub(super) const KEYS_SLICE: usize = 1_000;

impl AdminService {
    /// Every stored API key, read a slice of [`KEYS_SLICE`] at a time and handed to `visit`
    /// until it breaks: the scans that look for a few keys (the limited ones, the ones a
    /// catalog change would break) never hold a million keys in memory.
    pub(super) async fn scan_keys(
        &self,
        mut visit: impl FnMut(ApiKeyRecord) -> ControlFlow<()>,
    ) -> Result<(), AdminError> {
        let prefix = self.layout.keys_prefix();
        let mut from = prefix.clone();
        loop {
            let slice = self.store.list_page(&prefix, &from, KEYS_SLICE).await?;
            let Some(last) = slice.kvs.last() else { return Ok(()) };
            from = format!("{}\0", last.key);
            for kv in &slice.kvs {
                if visit(decode(&kv.value, "API key")?).is_break() {
                    return Ok(());
                }
            }
        }
    }
}

pub(super) fn decode<T: serde::de::DeserializeOwned>(
    bytes: &[u8],
    what: &str,
) -> Result<T, AdminError> {
    serde_json::from_slice(bytes)
        .map_err(|e| AdminError::Corrupt { what: what.into(), reason: e.to_string() })
}

/// A service on an embedded store, for the resources' tests.
#[cfg(test)]
pub(super) mod testing {
    #![allow(clippy::unwrap_used)]
    use super::*;
    use crate::store::embedded::EmbeddedStore;

    pub async fn service(dir: &std::path::Path) -> AdminService {
        let store: Arc<dyn Store> = Arc::new(EmbeddedStore::open(dir).await.unwrap());
        let (_, stopping) = tokio::sync::watch::channel(false);
        AdminService::new(
            store,
            Layout::new("/t"),
            ConfigCache::new(),
            stopping,
            crate::fleet::Fleet::new(),
        )
    }
}
