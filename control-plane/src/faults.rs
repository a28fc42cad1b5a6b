//! Injected faults (`switchyard chaos`) in the store.
//!
//! A fault is a config resource, `config/faults/<name>`, so the config stream takes it to
//! every node as it takes the catalog (an upsert of `faults/<name>`), and its end as a
//! delete. Each one is written under a store lease of its own TTL: when the lease ends the
//! store deletes it, and a forgotten drill cannot outlive [`MAX_TTL`].
//!
//! A lease alone is not a precise clock, though: etcd rounds a TTL up to whole seconds and
//! to its minimum (a 1 s fault would live 2 s), and both stores give every lease its full
//! TTL again after a restart or a leader change. So every replica also runs
//! [`run_expiry`], which deletes each fault when its `expires_at_unix_ms` passes; whichever
//! comes first ends it.

use std::sync::Arc;
use std::time::Duration;

use tracing::{info, warn};

use switchyard_backoff::Backoff;
use switchyard_catalog::fault::{Fault, FaultTarget, MAX_TTL, MIN_TTL, NAME_RULE, is_valid_name};
use switchyard_catalog::{Catalog, FieldError, ValidationErrors};
use switchyard_time::{format_duration, now_ms, rfc3339_ms};

use crate::layout::Layout;
use crate::store::{Compare, KeyValue, LeaseId, Revision, Store, StoreError, Txn, TxnOp};

/// Waits between attempts to list and watch the faults again after a store failure.
const RECONNECT: Backoff = Backoff::new(Duration::from_millis(100), Duration::from_secs(2));
/// The expiry task lists the faults again at least this often, whatever it is waiting
/// for: a wall clock that jumped must not leave a fault in force for long.
const RELIST: Duration = Duration::from_secs(60);

#[derive(Debug, thiserror::Error)]
pub enum FaultError {
    /// Field paths are the CLI's flags without their dashes (`rate`, `model`, `ttl`).
    #[error("{0}")]
    Invalid(#[from] ValidationErrors),
    #[error("name: a fault named {0:?} is in force; clear it first or choose another name")]
    Duplicate(String),
    #[error("no fault named {0:?} is in force")]
    NotFound(String),
    #[error(transparent)]
    Store(#[from] StoreError),
    #[error("stored {what} is unreadable: {reason}")]
    Corrupt { what: &'static str, reason: String },
}

fn invalid(path: &str, message: impl Into<String>) -> FaultError {
    FaultError::Invalid(ValidationErrors(vec![FieldError::new(path, message)]))
}

/// Stores `fault` for `ttl`, if it is valid, names a model or provider of the stored
/// catalog and an existing key, and no fault of that name is in force; else stores nothing.
/// Returns the fault as stored (with its expiry) and the revision of the write.
pub async fn inject(
    store: &dyn Store,
    layout: &Layout,
    mut fault: Fault,
    ttl: Duration,
) -> Result<(Fault, Revision), FaultError> {
    let mut errors = fault.validate().err().map(|e| e.0).unwrap_or_default();
    if !(MIN_TTL..=MAX_TTL).contains(&ttl) {
        errors.push(FieldError::new(
            "ttl",
            format!(
                "must be between {} and {}, not {}",
                format_duration(MIN_TTL),
                format_duration(MAX_TTL),
                format_duration(ttl)
            ),
        ));
    }
    errors.extend(check_names(store, layout, &fault).await?);
    if !errors.is_empty() {
        return Err(ValidationErrors(errors).into());
    }

    let key = layout.fault(&fault.name);
    fault.expires_at_unix_ms =
        now_ms().saturating_add(i64::try_from(ttl.as_millis()).unwrap_or(i64::MAX));
    let value = serde_json::to_vec(&fault)
        .map_err(|e| FaultError::Corrupt { what: "fault", reason: e.to_string() })?;
    // Granted after the expiry was computed, so the lease never ends a fault early.
    let lease = store.grant_lease(ttl).await?;
    let written = store
        .txn(Txn {
            compare: vec![Compare::absent(key.clone())],
            success: vec![TxnOp::Put { key, value, lease: Some(lease) }],
            failure: vec![],
        })
        .await;
    match written {
        Ok(result) if result.succeeded => {
            info!(
                fault = %fault.name,
                kind = fault.kind.flag(),
                expires = %rfc3339_ms(fault.expires_at_unix_ms),
                "fault injected"
            );
            Ok((fault, result.revision))
        }
        Ok(_) => {
            release(store, lease).await;
            Err(FaultError::Duplicate(fault.name))
        }
        Err(e) => {
            release(store, lease).await;
            Err(e.into())
        }
    }
}

/// What only the store can tell: that the target is in the catalog and the key exists.
async fn check_names(
    store: &dyn Store,
    layout: &Layout,
    fault: &Fault,
) -> Result<Vec<FieldError>, FaultError> {
    let mut errors = Vec::new();
    let catalog: Catalog = match store.get(&layout.catalog()).await? {
        Some(kv) => serde_json::from_slice(&kv.value)
            .map_err(|e| FaultError::Corrupt { what: "catalog", reason: e.to_string() })?,
        None => Catalog::default(),
    };
    match &fault.target {
        // An empty name is `validate`'s to report.
        FaultTarget::Model(m) if !m.trim().is_empty() && catalog.resolve(m).is_none() => errors
            .push(FieldError::new("model", format!("unknown model {m:?}: not in the catalog"))),
        FaultTarget::Provider(p) if !p.trim().is_empty() && catalog.provider(p).is_none() => errors
            .push(FieldError::new(
                "provider",
                format!("unknown provider {p:?}: not in the catalog"),
            )),
        _ => {}
    }
    match fault.key_id.as_deref() {
        None => {}
        Some("") => errors.push(FieldError::new("key", "must not be empty")),
        Some(id) => {
            // A key id is a store key segment; one that could reach elsewhere is unknown.
            let exists = !id.contains('/') && store.get(&layout.key(id)).await?.is_some();
            if !exists {
                errors.push(FieldError::new("key", format!("unknown API key id {id:?}")));
            }
        }
    }
    Ok(errors)
}

/// The faults in force, sorted by name. One whose expiry passed but that the store still
/// holds (it is being deleted) is left out.
pub async fn list(store: &dyn Store, layout: &Layout) -> Result<Vec<Fault>, FaultError> {
    let listing = store.list(&layout.faults_prefix()).await?;
    let now = now_ms();
    Ok(listing
        .kvs
        .iter()
        .filter_map(|kv| match serde_json::from_slice::<Fault>(&kv.value) {
            Ok(fault) => Some(fault),
            Err(e) => {
                // Only a hand-written key reads so; `clear --all` still removes it.
                warn!(key = %kv.key, error = %e, "unreadable fault; not listed");
                None
            }
        })
        .filter(|f| f.expires_at_unix_ms > now)
        .collect())
}

/// Ends the fault `name`; returns the revision of the delete.
pub async fn clear(store: &dyn Store, layout: &Layout, name: &str) -> Result<Revision, FaultError> {
    if !is_valid_name(name) {
        return Err(invalid("name", NAME_RULE));
    }
    let key = layout.fault(name);
    let Some(kv) = store.get(&key).await? else {
        return Err(FaultError::NotFound(name.to_owned()));
    };
    let result = store
        .txn(Txn { compare: vec![], success: vec![TxnOp::Delete { key }], failure: vec![] })
        .await?;
    release(store, kv.lease).await;
    info!(fault = %name, "fault cleared");
    Ok(result.revision)
}

/// Ends every fault, in one write; returns their names and the revision of the delete
/// (0 when there were none).
pub async fn clear_all(
    store: &dyn Store,
    layout: &Layout,
) -> Result<(Vec<String>, Revision), FaultError> {
    let prefix = layout.faults_prefix();
    let listing = store.list(&prefix).await?;
    if listing.kvs.is_empty() {
        return Ok((Vec::new(), 0));
    }
    let result = store
        .txn(Txn {
            compare: vec![],
            success: vec![TxnOp::DeletePrefix { prefix: prefix.clone() }],
            failure: vec![],
        })
        .await?;
    let mut names = Vec::new();
    for kv in &listing.kvs {
        release(store, kv.lease).await;
        names.extend(kv.key.strip_prefix(&prefix).map(str::to_owned));
    }
    info!(faults = names.len(), "every fault cleared");
    Ok((names, result.revision))
}

/// Revokes a fault's lease once the fault is gone, so no lease outlives it. Best effort:
/// a lease that is already gone is what was wanted, and one left behind ends with its TTL.
async fn release(store: &dyn Store, lease: LeaseId) {
    if lease == 0 {
        return;
    }
    match store.revoke_lease(lease).await {
        Ok(()) | Err(StoreError::LeaseNotFound(_)) => {}
        Err(e) => {
            warn!(lease, error = %e, "could not revoke a fault's lease; it ends with its TTL")
        }
    }
}

// === expiry ===

/// Deletes each fault when its expiry passes, until the process ends. Every replica runs
/// it: the delete is conditional on the fault being the one that was read, so two replicas
/// (or a replica and the lease) ending the same fault do no harm.
pub async fn run_expiry(store: Arc<dyn Store>, layout: Layout) {
    let mut failures = 0;
    loop {
        match expire(store.as_ref(), &layout).await {
            Ok(()) => warn!("fault watch ended; listing again"),
            Err(e) => warn!(error = %e, "fault expiry failed; listing again"),
        }
        tokio::time::sleep(RECONNECT.delay(failures)).await;
        failures = failures.saturating_add(1);
    }
}

/// Lists the faults, ends the expired ones, then waits for the next expiry or any change
/// to the faults, and starts over.
async fn expire(store: &dyn Store, layout: &Layout) -> Result<(), StoreError> {
    let prefix = layout.faults_prefix();
    loop {
        let listing = store.list(&prefix).await?;
        let now = now_ms();
        let mut next = now.saturating_add(RELIST.as_millis() as i64);
        for kv in &listing.kvs {
            // An unreadable fault is left to its lease.
            let Ok(fault) = serde_json::from_slice::<Fault>(&kv.value) else { continue };
            if fault.expires_at_unix_ms <= now {
                end(store, kv).await?;
            } else {
                next = next.min(fault.expires_at_unix_ms);
            }
        }
        let mut watch = store.watch(&prefix, listing.revision + 1).await?;
        let wait = Duration::from_millis(u64::try_from(next - now).unwrap_or(0));
        tokio::select! {
            () = tokio::time::sleep(wait) => {}
            batch = watch.next() => match batch {
                Some(Ok(_)) => {}
                Some(Err(e)) => return Err(e),
                None => return Ok(()),
            },
        }
    }
}

/// Deletes an expired fault unless it changed since it was read (cleared, or injected
/// again under the same name), then revokes its lease.
async fn end(store: &dyn Store, kv: &KeyValue) -> Result<(), StoreError> {
    let result = store
        .txn(Txn {
            compare: vec![Compare::mod_revision(kv.key.clone(), kv.mod_revision)],
            success: vec![TxnOp::Delete { key: kv.key.clone() }],
            failure: vec![],
        })
        .await?;
    if result.succeeded {
        info!(key = %kv.key, "fault expired");
        release(store, kv.lease).await;
    }
    Ok(())
}

#[cfg(test)]
mod tests {
    #![allow(clippy::unwrap_used, clippy::panic)]
    use std::time::Instant;

    use switchyard_catalog::fault::{DEFAULT_TTL, FaultKind};

    use super::*;
    use switchyard_proto::node::v1 as pb;

    use crate::fanout::{self, ConfigCache, Start};
    use crate::store::embedded::EmbeddedStore;

    const CATALOG: &str = r#"{
        "providers": [{"name": "openai", "kind": "openai", "base_url": "https://api.openai.com/v1"}],
        "models": [{"name": "openai/gpt-5-nano", "provider": "openai", "upstream_model": "gpt-5-nano"}]
    }"#;

    async fn store(dir: &std::path::Path) -> (Arc<dyn Store>, Layout) {
        let store: Arc<dyn Store> = Arc::new(EmbeddedStore::open(dir).await.unwrap());
        let layout = Layout::new("/t");
        let catalog: Catalog = serde_json::from_str(CATALOG).unwrap();
        store.put(&layout.catalog(), serde_json::to_vec(&catalog).unwrap(), None).await.unwrap();
        store.put(&layout.key("key_a"), b"{}".to_vec(), None).await.unwrap();
        (store, layout)
    }

    /// The `Update` message a node receives for `update`.
    fn decode_update(update: &fanout::ConfigUpdate) -> pb::Update {
        use prost::Message;
        let encoded = update.encoded.as_ref().expect("a small update is encoded");
        match pb::ControlMessage::decode(encoded.as_bytes()).unwrap().msg {
            Some(pb::control_message::Msg::Update(update)) => update,
            other => panic!("not an update: {other:?}"),
        }
    }

    fn fault(name: &str) -> Fault {
        Fault {
            name: name.into(),
            target: FaultTarget::Model("openai/gpt-5-nano".into()),
            key_id: None,
            rate: 1.0,
            kind: FaultKind::Status { status: 503, retry_after_secs: None },
            expires_at_unix_ms: 0,
        }
    }

    fn paths(e: FaultError) -> Vec<String> {
        match e {
            FaultError::Invalid(errors) => errors.0.into_iter().map(|e| e.path).collect(),
            other => panic!("expected a validation error, got {other}"),
        }
    }

    /// Polls `check` every 10 ms until it holds; panics after `limit`.
    async fn within(limit: Duration, what: &str, mut check: impl AsyncFnMut() -> bool) -> Duration {
        let start = Instant::now();
        while !check().await {
            assert!(start.elapsed() < limit, "{what}: not within {limit:?}");
            tokio::time::sleep(Duration::from_millis(10)).await;
        }
        start.elapsed()
    }

    #[tokio::test]
    async fn an_injected_fault_is_stored_under_a_lease_of_its_ttl_and_listed() {
        let dir = tempfile::tempdir().unwrap();
        let (store, layout) = store(dir.path()).await;
        let before = now_ms();
        let (stored, version) =
            inject(store.as_ref(), &layout, fault("drill"), Duration::from_secs(600))
                .await
                .unwrap();
        assert!(stored.expires_at_unix_ms >= before + 600_000, "{stored:?}");
        let kv = store.get(&layout.fault("drill")).await.unwrap().unwrap();
        assert_eq!(kv.mod_revision, version);
        assert_ne!(kv.lease, 0, "a fault is kept under a lease");
        assert!(store.keep_alive(kv.lease).await.unwrap() >= Duration::from_secs(600));
        assert_eq!(serde_json::from_slice::<Fault>(&kv.value).unwrap(), stored);
        assert_eq!(list(store.as_ref(), &layout).await.unwrap(), [stored]);
    }

    #[tokio::test]
    async fn a_taken_name_is_refused_and_the_fault_in_force_stays() {
        let dir = tempfile::tempdir().unwrap();
        let (store, layout) = store(dir.path()).await;
        let (first, _) =
            inject(store.as_ref(), &layout, fault("drill"), DEFAULT_TTL).await.unwrap();
        let mut second = fault("drill");
        second.kind = FaultKind::Hang;
        let err = inject(store.as_ref(), &layout, second, DEFAULT_TTL).await.unwrap_err();
        assert!(matches!(err, FaultError::Duplicate(ref n) if n == "drill"), "{err}");
        assert!(err.to_string().starts_with("name: "), "{err}");
        assert_eq!(list(store.as_ref(), &layout).await.unwrap(), [first]);
    }

    #[tokio::test]
    async fn bad_input_names_the_flag_and_stores_nothing() {
        let dir = tempfile::tempdir().unwrap();
        let (store, layout) = store(dir.path()).await;
        let cases: Vec<(Fault, Duration, &str)> = vec![
            (Fault { rate: 1.5, ..fault("a") }, DEFAULT_TTL, "rate"),
            (Fault { rate: -0.1, ..fault("a") }, DEFAULT_TTL, "rate"),
            (fault("a"), Duration::from_millis(999), "ttl"),
            (fault("a"), MAX_TTL + Duration::from_secs(1), "ttl"),
            (
                Fault { target: FaultTarget::Model("nope/x".into()), ..fault("a") },
                DEFAULT_TTL,
                "model",
            ),
            (
                Fault { target: FaultTarget::Provider("nope".into()), ..fault("a") },
                DEFAULT_TTL,
                "provider",
            ),
            (Fault { key_id: Some("key_zz".into()), ..fault("a") }, DEFAULT_TTL, "key"),
            (Fault { key_id: Some("../catalog".into()), ..fault("a") }, DEFAULT_TTL, "key"),
            (fault("bad name"), DEFAULT_TTL, "name"),
        ];
        for (f, ttl, flag) in cases {
            let err = inject(store.as_ref(), &layout, f.clone(), ttl).await.unwrap_err();
            assert_eq!(paths(err), [flag], "{f:?} for {ttl:?}");
        }
        assert!(store.list(&layout.faults_prefix()).await.unwrap().kvs.is_empty());
        // Known names pass: a provider target and an existing key.
        let ok = Fault {
            target: FaultTarget::Provider("openai".into()),
            key_id: Some("key_a".into()),
            ..fault("ok")
        };
        assert!(inject(store.as_ref(), &layout, ok, MIN_TTL).await.is_ok());
    }

    #[tokio::test]
    async fn clear_deletes_the_fault_and_revokes_its_lease() {
        let dir = tempfile::tempdir().unwrap();
        let (store, layout) = store(dir.path()).await;
        let (_, injected) =
            inject(store.as_ref(), &layout, fault("drill"), DEFAULT_TTL).await.unwrap();
        let lease = store.get(&layout.fault("drill")).await.unwrap().unwrap().lease;
        let version = clear(store.as_ref(), &layout, "drill").await.unwrap();
        assert!(version > injected);
        assert!(store.get(&layout.fault("drill")).await.unwrap().is_none());
        assert!(matches!(store.keep_alive(lease).await, Err(StoreError::LeaseNotFound(_))));
        let err = clear(store.as_ref(), &layout, "drill").await.unwrap_err();
        assert!(matches!(err, FaultError::NotFound(_)), "{err}");
        // The name is free again.
        assert!(inject(store.as_ref(), &layout, fault("drill"), DEFAULT_TTL).await.is_ok());
    }

    #[tokio::test]
    async fn clear_all_ends_every_fault_in_one_write() {
        let dir = tempfile::tempdir().unwrap();
        let (store, layout) = store(dir.path()).await;
        assert_eq!(clear_all(store.as_ref(), &layout).await.unwrap(), (vec![], 0));
        for name in ["a", "b", "c"] {
            inject(store.as_ref(), &layout, fault(name), DEFAULT_TTL).await.unwrap();
        }
        let (names, version) = clear_all(store.as_ref(), &layout).await.unwrap();
        assert_eq!(names, ["a", "b", "c"]);
        assert_eq!(version, store.current_revision().await.unwrap());
        assert!(list(store.as_ref(), &layout).await.unwrap().is_empty());
        // The catalog and keys beside the faults are untouched.
        assert!(store.get(&layout.catalog()).await.unwrap().is_some());
        assert!(store.get(&layout.key("key_a")).await.unwrap().is_some());
    }

    #[tokio::test]
    async fn the_lease_alone_deletes_a_fault_once_its_ttl_is_up() {
        let dir = tempfile::tempdir().unwrap();
        let (store, layout) = store(dir.path()).await;
        let start = Instant::now();
        inject(store.as_ref(), &layout, fault("short"), MIN_TTL).await.unwrap();
        let key = layout.fault("short");
        // Wall time: the embedded store expires leases on its own thread by the real clock
        // (every 250 ms), which tokio's paused clock does not drive. The limit tells a lease
        // that expired from one that never does, with a loaded machine's slack; how soon a
        // fault's end reaches every node is measured by `switchyard-bench chaos`.
        within(MIN_TTL + Duration::from_secs(5), "the lease to delete the fault", async || {
            store.get(&key).await.unwrap().is_none()
        })
        .await;
        let lived = start.elapsed();
        assert!(lived >= MIN_TTL, "gone after {lived:?}, before its TTL");
    }

    #[tokio::test]
    async fn expiry_ends_a_fault_whose_lease_outlives_it() {
        // As after a restart, which gives every lease its full TTL again.
        let dir = tempfile::tempdir().unwrap();
        let (store, layout) = store(dir.path()).await;
        let lease = store.grant_lease(Duration::from_secs(600)).await.unwrap();
        let expires = now_ms() + 300;
        let f = Fault { expires_at_unix_ms: expires, ..fault("restarted") };
        let key = layout.fault("restarted");
        store.put(&key, serde_json::to_vec(&f).unwrap(), Some(lease)).await.unwrap();
        let task = tokio::spawn(run_expiry(Arc::clone(&store), layout.clone()));
        // Wall time: expiry is judged by the wall clock the fault's `expires_at_unix_ms` is
        // written in, and the store runs on its own thread. The limit tells an end at the
        // expiry from one left to the lease (10 minutes) or the next relisting (a minute),
        // with a loaded machine's slack.
        within(Duration::from_secs(5), "the expiry task to end the fault", async || {
            store.get(&key).await.unwrap().is_none()
        })
        .await;
        let late = now_ms() - expires;
        assert!(late >= 0, "ended {} ms before its expiry", -late);
        // The task revokes the lease right after the delete, so poll for it.
        within(Duration::from_secs(5), "the expiry task to revoke the fault's lease", async || {
            matches!(store.keep_alive(lease).await, Err(StoreError::LeaseNotFound(_)))
        })
        .await;
        task.abort();
    }

    #[tokio::test]
    async fn nodes_receive_a_fault_as_config_and_its_expiry_as_a_delete() {
        let dir = tempfile::tempdir().unwrap();
        let (store, layout) = store(dir.path()).await;
        let cache = ConfigCache::new();
        let follower =
            tokio::spawn(fanout::run(Arc::clone(&cache), Arc::clone(&store), layout.clone()));
        cache.wait_ready().await;
        let (start, mut updates) = cache.subscribe(0);
        let Start::Snapshot { .. } = start else { panic!("a new node gets a snapshot") };
        let snapshot = cache.snapshot_chunk(None);
        assert!(snapshot.resources.iter().all(|(name, _)| !name.starts_with("faults/")));

        let (stored, version) =
            inject(store.as_ref(), &layout, fault("drill"), MIN_TTL).await.unwrap();
        let update =
            tokio::time::timeout(Duration::from_secs(5), updates.recv()).await.unwrap().unwrap();
        assert_eq!(update.version, version);
        let update = decode_update(&update);
        assert_eq!(update.upserts.len(), 1);
        assert_eq!(update.upserts[0].name, "faults/drill");
        assert_eq!(serde_json::from_slice::<Fault>(&update.upserts[0].value).unwrap(), stored);

        // Wall time (the store's own thread ends the lease): the limit tells a delete that
        // reaches the stream from one that never does, with a loaded machine's slack. How
        // soon it does is a figure of `switchyard-bench chaos` ("TTL end → gone from every
        // node"), on a release build.
        let update =
            tokio::time::timeout(Duration::from_secs(5), updates.recv()).await.unwrap().unwrap();
        assert_eq!(decode_update(&update).deletes, ["faults/drill"]);
        follower.abort();
    }
}
