//! The admin API (`switchyard.admin.v1.Admin`): catalog and API keys in the store, the
//! fleet as the nodes' presence records show it, what nodes report (breaker states, the
//! failover-event audit log, usage totals), and injected faults ([`crate::faults`]).
//!
//! Every write is a compare-and-swap on the revision that was read, so two admins (or two
//! replicas) racing on one resource never lose an update silently: the loser gets `Aborted`.

use std::collections::BTreeMap;
use std::sync::Arc;
use std::time::Duration;

use rand::Rng;
use tonic::{Request, Response, Status};
use tracing::info;

use switchyard_catalog::fault::{DEFAULT_TTL, Fault};
use switchyard_catalog::keys::{SECRET_PREFIX, hash_secret};
use switchyard_catalog::{
    ApiKeyRecord, Catalog, Degraded, FailoverDefaults, FailoverReason, FieldError, KeyStatus,
    Limits, ValidationErrors,
};
use switchyard_proto::admin::v1::{self as pb, admin_server::Admin};

use switchyard_time::now_ms;

use crate::audit;
use crate::events::{AuditEvent, BreakerRecord, OutboxEntry, decode_entries};
use crate::fanout::ConfigCache;
use crate::faults::{self, FaultError};
use crate::layout::Layout;
use crate::limits;
use crate::nodes::NodeRecord;
use crate::paging::{self, PagingError};
use crate::reports::{self, UsageRecord};
use crate::store::{Compare, Revision, Store, StoreError, Txn, TxnOp};
use crate::webhooks::{self, DeadLetter, RedeliverError, SubscriptionState};

/// Events `ListEvents` sends first when the request names no limit.
const DEFAULT_EVENTS_LIMIT: usize = 100;
/// Event ids an `events --follow` remembers to list a twice-stored event once.
const FOLLOW_SEEN: usize = 100_000;

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

/// Whether this process is filling in the secret index already ([`AdminService::backfill_secret_index`]).
static BACKFILLING: std::sync::atomic::AtomicBool = std::sync::atomic::AtomicBool::new(false);

fn invalid(path: &str, message: impl Into<String>) -> AdminError {
    AdminError::Invalid(ValidationErrors(vec![FieldError::new(path, message)]))
}

pub struct AdminService {
    pub store: Arc<dyn Store>,
    pub layout: Layout,
    pub cache: Arc<ConfigCache>,
    /// Turns `true` when the replica shuts down: `events --follow` streams end then, with
    /// a status saying so, rather than holding the shutdown until its drain timeout.
    pub stopping: tokio::sync::watch::Receiver<bool>,
    /// The fleet's breaker view, for `ListBreakers`.
    pub fleet: Arc<crate::fleet::Fleet>,
}

/// How a replica that is shutting down ends an `events --follow` stream: `Unavailable`,
/// which the CLI reports as the control plane going away, with where to follow again.
fn replica_stopping() -> Status {
    Status::unavailable("this control plane is shutting down")
}

/// Each connected node treats a deployment open for the fleet as open: its row says so
/// (state `open`, cause `fleet`: `open (fleet)` in the table) unless its own breaker of it
/// is open or half-open already. The prober's own breaker opens as it starts probing.
fn with_fleet(
    breakers: &mut Vec<pb::Breaker>,
    open: &[switchyard_proto::node::v1::FleetBreaker],
    nodes: &std::collections::BTreeSet<String>,
) {
    for deployment in open {
        for node in nodes {
            let own = breakers.iter_mut().find(|b| {
                &b.node_id == node
                    && b.provider == deployment.provider
                    && b.upstream_model == deployment.upstream_model
            });
            let row = match own {
                Some(b) if b.state == "open" || b.state == "half_open" => continue,
                Some(b) => b,
                None => {
                    breakers.push(pb::Breaker {
                        node_id: node.clone(),
                        provider: deployment.provider.clone(),
                        upstream_model: deployment.upstream_model.clone(),
                        ..Default::default()
                    });
                    let Some(row) = breakers.last_mut() else { continue };
                    row
                }
            };
            row.state = "open".to_owned();
            row.cause = "fleet".to_owned();
            row.since_unix_ms = deployment.since_unix_ms;
            row.next_probe_unix_ms = 0;
        }
    }
}

/// Whether the replica started shutting down (`false` once its sender is gone: it never will).
async fn stopping_now(stopping: &mut tokio::sync::watch::Receiver<bool>) -> bool {
    stopping.wait_for(|s| *s).await.is_ok()
}

// === impl AdminService ===

impl AdminService {
    async fn load_catalog(&self) -> Result<(Catalog, Revision), AdminError> {
        match self.store.get(&self.layout.catalog()).await? {
            None => Ok((Catalog::default(), 0)),
            Some(kv) => Ok((decode(&kv.value, "catalog")?, kv.mod_revision)),
        }
    }

    async fn load_key(&self, id: &str) -> Result<(ApiKeyRecord, Revision), AdminError> {
        if id.is_empty() {
            return Err(invalid("id", "must not be empty"));
        }
        let kv = self
            .store
            .get(&self.layout.key(id))
            .await?
            .ok_or_else(|| AdminError::NotFound(format!("no API key with id {id:?}")))?;
        Ok((decode(&kv.value, "API key")?, kv.mod_revision))
    }

    /// Stores `record` if the key is still at `expected` (0: does not exist yet), with its
    /// secret-index entry in the same transaction; `previous_sha256` is the secret hash it
    /// had (a rotation's old one, whose entry goes).
    async fn save_key(
        &self,
        record: &ApiKeyRecord,
        expected: Revision,
        previous_sha256: Option<&str>,
    ) -> Result<Revision, AdminError> {
        let key = self.layout.key(&record.id);
        let value = serde_json::to_vec(record)
            .map_err(|e| AdminError::Corrupt { what: "API key".into(), reason: e.to_string() })?;
        let mut success = vec![
            TxnOp::Put { key: key.clone(), value, lease: None },
            TxnOp::Put {
                key: self.layout.key_secret(&record.secret_sha256),
                value: record.id.clone().into_bytes(),
                lease: None,
            },
        ];
        if let Some(old) = previous_sha256.filter(|old| *old != record.secret_sha256) {
            success.push(TxnOp::Delete { key: self.layout.key_secret(old) });
        }
        let result = self
            .store
            .txn(Txn {
                compare: vec![Compare::mod_revision(key.clone(), expected)],
                success,
                failure: vec![],
            })
            .await?;
        if result.succeeded {
            Ok(result.revision)
        } else {
            Err(AdminError::Conflict(format!(
                "API key {} changed while this request ran; try again",
                record.id
            )))
        }
    }

    /// Checks a key's defaults and allow-lists against the catalog.
    async fn check_key_settings(
        &self,
        defaults: Option<pb::FailoverDefaults>,
        allowed_models: &[String],
        allowed_regions: &[String],
    ) -> Result<(Option<FailoverDefaults>, Vec<String>), AdminError> {
        let (catalog, _) = self.load_catalog().await?;
        let mut errors = Vec::new();
        // A name the catalog serves: an entry (a wildcard too, by its own name), or a name
        // under a wildcard (`openai/gpt-5`, a narrower `openai/ft/*`).
        for (i, model) in allowed_models.iter().enumerate() {
            if catalog.resolve(model).is_none() {
                errors.push(FieldError::new(
                    format!("allowed_models[{i}]"),
                    format!("unknown model {model:?}: not in the catalog nor under a wildcard"),
                ));
            }
        }
        for (i, region) in allowed_regions.iter().enumerate() {
            if region.trim().is_empty() {
                errors.push(FieldError::new(format!("allowed_regions[{i}]"), "must not be empty"));
            }
        }
        let normalized = match defaults {
            None => None,
            Some(d) => match defaults_from_pb(d) {
                Err(e) => {
                    errors.extend(e.0);
                    None
                }
                Ok(d) => match d.normalize(|m| catalog.resolve(m).is_some()) {
                    Ok(ok) => match ok.0.check_kinds(|m| Some(catalog.resolve(m)?.chain_kind())) {
                        Ok(()) => Some(ok),
                        Err(e) => {
                            errors.push(e);
                            None
                        }
                    },
                    Err(e) => {
                        errors.extend(e.0);
                        None
                    }
                },
            },
        };
        if !errors.is_empty() {
            return Err(ValidationErrors(errors).into());
        }
        Ok(match normalized {
            Some((d, warnings)) => (Some(d), warnings),
            None => (None, Vec::new()),
        })
    }
}

/// Audit-log entries read from the store at once. A batch is up to 1 MiB, but the embedded
/// store shares its values rather than copying them, and etcd answers a page too large for
/// one response with fewer entries.
const EVENTS_SLICE: usize = 64;

/// An event ordered by time, then id: the order `events` lists them in.
struct ByTime(AuditEvent);

impl PartialEq for ByTime {
    fn eq(&self, other: &Self) -> bool {
        self.cmp(other) == std::cmp::Ordering::Equal
    }
}

impl Eq for ByTime {}

impl PartialOrd for ByTime {
    fn partial_cmp(&self, other: &Self) -> Option<std::cmp::Ordering> {
        Some(self.cmp(other))
    }
}

impl Ord for ByTime {
    fn cmp(&self, other: &Self) -> std::cmp::Ordering {
        (self.0.at_unix_ms, &self.0.id).cmp(&(other.0.at_unix_ms, &other.0.id))
    }
}

/// The newest `limit` events that `wanted` keeps, gathered while the audit log is read a
/// slice at a time: memory holds `limit` events and one slice, not the log. An event
/// stored twice (a node resent it in another batch after a lost ack) is kept once. With
/// `follow`, the ids of the newest events read (up to [`FOLLOW_SEEN`]) are remembered too,
/// so the watch that follows skips events the listing already covered.
struct Newest<F> {
    limit: usize,
    heap: std::collections::BinaryHeap<std::cmp::Reverse<ByTime>>,
    in_heap: std::collections::HashSet<String>,
    seen: Option<std::collections::HashSet<String>>,
    wanted: F,
}

impl<F: Fn(&AuditEvent) -> bool> Newest<F> {
    fn new(limit: usize, follow: bool, wanted: F) -> Self {
        Self {
            limit,
            heap: std::collections::BinaryHeap::with_capacity(limit.min(100_000) + 1),
            in_heap: std::collections::HashSet::new(),
            seen: follow.then(std::collections::HashSet::new),
            wanted,
        }
    }

    fn add(&mut self, kvs: &[crate::store::KeyValue]) {
        for kv in kvs {
            for event in audit::decode(kv) {
                if !(self.wanted)(&event) {
                    continue;
                }
                if let Some(seen) = self.seen.as_mut() {
                    // Bounded: the log is read oldest first, so what stays is the newest.
                    if seen.len() >= FOLLOW_SEEN {
                        seen.clear();
                    }
                    seen.insert(event.id.clone());
                }
                if self.limit == 0 || self.in_heap.contains(&event.id) {
                    continue;
                }
                self.in_heap.insert(event.id.clone());
                self.heap.push(std::cmp::Reverse(ByTime(event)));
                if self.heap.len() > self.limit
                    && let Some(std::cmp::Reverse(ByTime(oldest))) = self.heap.pop()
                {
                    self.in_heap.remove(&oldest.id);
                }
            }
        }
    }

    /// The events in time order, the ids to skip when following, and the filter.
    fn finish(self) -> (Vec<AuditEvent>, std::collections::HashSet<String>, F) {
        let events: Vec<AuditEvent> =
            self.heap.into_sorted_vec().into_iter().rev().map(|r| r.0.0).collect();
        let mut seen = self.seen.unwrap_or_default();
        seen.extend(events.iter().map(|e| e.id.clone()));
        (events, seen, self.wanted)
    }
}

/// Reads the audit log a slice at a time into [`Newest`]; returns it and the store revision
/// a follower's watch starts after (taken before the first slice, so that nothing written
/// while the log is read is missed: what both the read and the watch see is sent once).
async fn read_newest<F: Fn(&AuditEvent) -> bool + Send + 'static>(
    store: &dyn Store,
    prefix: &str,
    mut newest: Newest<F>,
) -> Result<(Newest<F>, Revision), Status> {
    let revision = store.current_revision().await.map_err(AdminError::from)?;
    let mut from = prefix.to_owned();
    loop {
        let slice = store.list_page(prefix, &from, EVENTS_SLICE).await.map_err(AdminError::from)?;
        let Some(last) = slice.kvs.last() else { return Ok((newest, revision)) };
        from = format!("{}\0", last.key);
        // Decoding a storm's batches takes CPU: off the runtime's workers, which keep
        // serving nodes and other calls.
        let added = tokio::task::spawn_blocking(move || {
            newest.add(&slice.kvs);
            newest
        });
        newest = added.await.map_err(|_| Status::internal("listing the audit log failed"))?;
    }
}

#[tonic::async_trait]
impl Admin for AdminService {
    type ListEventsStream = std::pin::Pin<
        Box<
            dyn futures_util::Stream<
                    Item = Result<switchyard_proto::node::v1::FailoverEvent, Status>,
                > + Send,
        >,
    >;

    async fn list_breakers(
        &self,
        _request: Request<pb::ListBreakersRequest>,
    ) -> Result<Response<pb::ListBreakersResponse>, Status> {
        let listing =
            self.store.list(&self.layout.breakers_prefix()).await.map_err(AdminError::from)?;
        let mut breakers: Vec<pb::Breaker> = listing
            .kvs
            .iter()
            .filter_map(|kv| serde_json::from_slice::<BreakerRecord>(&kv.value).ok())
            .map(|b| pb::Breaker {
                node_id: b.node_id,
                provider: b.provider,
                upstream_model: b.upstream_model,
                state: b.state,
                since_unix_ms: b.since_unix_ms,
                failure_rate: b.failure_rate,
                next_probe_unix_ms: b.next_probe_unix_ms,
                cause: b.cause,
                cooldown_ms: b.cooldown_ms,
                last_probe_unix_ms: b.last_probe_unix_ms,
                last_probe_outcome: b.last_probe_outcome,
                last_probe_latency_ms: b.last_probe_latency_ms,
            })
            .collect();
        let fleet = self.fleet.current();
        with_fleet(&mut breakers, &fleet.view.open, &fleet.nodes);
        // By node, provider, model: the order the table shows.
        breakers.sort_by(|a, b| {
            (&a.node_id, &a.provider, &a.upstream_model).cmp(&(
                &b.node_id,
                &b.provider,
                &b.upstream_model,
            ))
        });
        Ok(Response::new(pb::ListBreakersResponse {
            breakers,
            fleet: fleet.view.open.clone(),
            fleet_enabled: fleet.view.enabled,
        }))
    }

    async fn list_events(
        &self,
        request: Request<pb::ListEventsRequest>,
    ) -> Result<Response<Self::ListEventsStream>, Status> {
        let request = request.into_inner();
        let limit = match request.limit {
            0 => DEFAULT_EVENTS_LIMIT,
            n => n as usize,
        };
        let key_id = request.key_id;
        let wanted = move |e: &AuditEvent| key_id.is_empty() || e.key_id == key_id;
        let (store, prefix) = (Arc::clone(&self.store), self.layout.audit_prefix());
        let mut stopping = self.stopping.clone();
        let (tx, rx) = tokio::sync::mpsc::channel(64);
        // The listing is read in the task, after the answer's headers have gone: a client
        // asking for millions of events (a count after a storm) waits for the first one
        // without its request timing out, and an error reaches it as the stream's end.
        tokio::spawn(async move {
            let fail = |e: StoreError| Err(Status::from(AdminError::from(e)));
            let newest = Newest::new(limit, request.follow, wanted);
            let (newest, revision) = match read_newest(store.as_ref(), &prefix, newest).await {
                Ok(read) => read,
                Err(status) => {
                    let _ = tx.send(Err(status)).await;
                    return;
                }
            };
            let (first, mut seen, wanted) = newest.finish();
            // Watch before sending, so that a follower misses nothing written meanwhile.
            let watch = if request.follow {
                match store.watch(&prefix, revision + 1).await {
                    Ok(watch) => Some(watch),
                    Err(e) => {
                        let _ = tx.send(fail(e)).await;
                        return;
                    }
                }
            } else {
                None
            };
            for event in first {
                if tx.send(Ok(event.to_pb())).await.is_err() {
                    return;
                }
            }
            let Some(mut watch) = watch else { return };
            loop {
                tokio::select! {
                    // The client went away: stop watching.
                    _ = tx.closed() => return,
                    // An end the client can tell from a failure, and re-open elsewhere.
                    // (A replica whose sender is gone is not stopping: the branch is off.)
                    true = stopping_now(&mut stopping) => {
                        let _ = tx.send(Err(replica_stopping())).await;
                        return;
                    }
                    batch = watch.next() => match batch {
                        Some(Ok(batch)) => {
                            let new: Vec<AuditEvent> = batch
                                .events
                                .iter()
                                .filter(|e| audit::is_new(e.kind, &e.kv))
                                .flat_map(|e| audit::decode(&e.kv))
                                .filter(|e| wanted(e) && seen.insert(e.id.clone()))
                                .collect();
                            // Bounded: a duplicate arrives within a node's reconnect.
                            if seen.len() > FOLLOW_SEEN {
                                seen.clear();
                            }
                            for event in new {
                                if tx.send(Ok(event.to_pb())).await.is_err() {
                                    return;
                                }
                            }
                        }
                        Some(Err(e)) => {
                            let _ = tx.send(Err(Status::from(AdminError::from(e)))).await;
                            return;
                        }
                        None => {
                            let _ = tx.send(Err(Status::unavailable("the store ended the watch; follow again"))).await;
                            return;
                        }
                    },
                }
            }
        });
        Ok(Response::new(Box::pin(tokio_stream::wrappers::ReceiverStream::new(rx))))
    }

    async fn get_usage(
        &self,
        request: Request<pb::GetUsageRequest>,
    ) -> Result<Response<pb::GetUsageResponse>, Status> {
        let request = request.into_inner();
        let key_id = request.key_id;
        let listing =
            self.store.list(&self.layout.usage_prefix()).await.map_err(AdminError::from)?;
        // Usage since a time: each run's totals less its mark at the hour `since` falls in.
        let since = (request.since_unix_ms > 0).then(|| reports::hour(request.since_unix_ms));
        let mut marks: std::collections::HashMap<(String, String), BTreeMap<i64, UsageRecord>> =
            std::collections::HashMap::new();
        if since.is_some() {
            let listing = self
                .store
                .list(&self.layout.usage_marks_prefix())
                .await
                .map_err(AdminError::from)?;
            for kv in &listing.kvs {
                let hour = kv.key.rsplit('/').next().and_then(|h| h.parse::<i64>().ok());
                let (Some(hour), Ok(mark)) =
                    (hour, serde_json::from_slice::<UsageRecord>(&kv.value))
                else {
                    continue;
                };
                marks
                    .entry((mark.node_id.clone(), mark.boot_id.clone()))
                    .or_default()
                    .insert(hour, mark);
            }
        }
        let none = BTreeMap::new();
        let mut totals: BTreeMap<(String, String), pb::UsageRow> = BTreeMap::new();
        for kv in &listing.kvs {
            let Ok(record) = serde_json::from_slice::<UsageRecord>(&kv.value) else {
                tracing::warn!(key = %kv.key, "unreadable usage record; skipped");
                continue;
            };
            let baseline = since.and_then(|since| {
                let run = marks.get(&(record.node_id.clone(), record.boot_id.clone()));
                reports::usage_since(&record, run.unwrap_or(&none), since)
            });
            let before = |key: &str, model: &str| {
                baseline
                    .and_then(|b| b.entries.iter().find(|e| e.key_id == key && e.model == model))
            };
            for e in &record.entries {
                if !key_id.is_empty() && e.key_id != key_id {
                    continue;
                }
                let old = before(&e.key_id, &e.model);
                let requests = e.requests.saturating_sub(old.map_or(0, |o| o.requests));
                if requests == 0 && old.is_some() {
                    continue;
                }
                let row = totals.entry((e.key_id.clone(), e.model.clone())).or_insert_with(|| {
                    pb::UsageRow {
                        key_id: e.key_id.clone(),
                        model: e.model.clone(),
                        ..Default::default()
                    }
                });
                row.requests += requests;
                row.prompt_tokens +=
                    e.prompt_tokens.saturating_sub(old.map_or(0, |o| o.prompt_tokens));
                row.completion_tokens +=
                    e.completion_tokens.saturating_sub(old.map_or(0, |o| o.completion_tokens));
                row.cost_usd += (e.cost_usd - old.map_or(0.0, |o| o.cost_usd)).max(0.0);
            }
        }
        let limits = self.limit_status(&key_id).await?;
        Ok(Response::new(pb::GetUsageResponse { rows: totals.into_values().collect(), limits }))
    }

    async fn apply_catalog(
        &self,
        request: Request<pb::ApplyCatalogRequest>,
    ) -> Result<Response<pb::ApplyCatalogResponse>, Status> {
        let request = request.into_inner();
        let deserializer = &mut serde_json::Deserializer::from_str(&request.catalog_json);
        let mut new: Catalog = serde_path_to_error::deserialize(deserializer).map_err(|e| {
            let path = e.path().to_string();
            AdminError::from(ValidationErrors(vec![FieldError::new(
                path,
                e.into_inner().to_string(),
            )]))
        })?;
        let (old, old_rev) = self.load_catalog().await?;
        new.restore_redacted(&old);
        new.validate_for_store().map_err(AdminError::from)?;
        if let Some(expected) = request.expected_version
            && expected != old_rev
        {
            return Err(AdminError::Conflict(format!(
                "the catalog changed since it was read (version {expected}, now {old_rev}); nothing was applied, try again"
            ))
            .into());
        }
        // A change that makes a key's default chain mix chat and embedding models, or
        // dimensions, is refused naming the key: no key is left with a chain no request can
        // use (docs/catalog.md, "`models`").
        let broken = self.keys_broken_by(&old, &new).await?;
        if !broken.is_empty() {
            return Err(AdminError::from(ValidationErrors(broken)).into());
        }
        let changes = old.diff(&new);
        if request.dry_run || changes.is_empty() {
            return Ok(Response::new(pb::ApplyCatalogResponse {
                changes,
                applied: false,
                version: 0,
            }));
        }
        let key = self.layout.catalog();
        let value = serde_json::to_vec(&new)
            .map_err(|e| AdminError::Corrupt { what: "catalog".into(), reason: e.to_string() })?;
        let mut success = vec![TxnOp::Put { key: key.clone(), value, lease: None }];
        // A new subscription's delivery starts at the catalog before it: every event stored
        // after this apply is queued for it (writers guard on the catalog's revision), and
        // this cursor makes the delivery leader take them all, however late its own cache
        // sees the subscription (docs/webhooks.md, "A new subscription").
        // (Within one transaction's operations; more new subscriptions at once start, as
        // before, after the catalog their leader first sees.)
        let added = new.webhooks.iter().filter(|w| !old.webhooks.iter().any(|o| o.name == w.name));
        for webhook in added.take(crate::layout::MAX_TXN_OPS - 1) {
            let state = SubscriptionState { cursor: old_rev, ..Default::default() };
            let value = serde_json::to_vec(&state).map_err(|e| AdminError::Corrupt {
                what: "webhook state".into(),
                reason: e.to_string(),
            })?;
            success.push(TxnOp::Put {
                key: self.layout.webhook_state(&webhook.name),
                value,
                lease: None,
            });
        }
        let result = self
            .store
            .txn(Txn {
                compare: vec![Compare::mod_revision(key.clone(), old_rev)],
                success,
                failure: vec![],
            })
            .await
            .map_err(AdminError::from)?;
        if !result.succeeded {
            return Err(AdminError::Conflict(
                "the catalog changed while this apply ran; nothing was applied, try again".into(),
            )
            .into());
        }
        info!(version = result.revision, changes = changes.len(), "catalog applied");
        Ok(Response::new(pb::ApplyCatalogResponse {
            changes,
            applied: true,
            version: result.revision,
        }))
    }

    async fn get_catalog(
        &self,
        _request: Request<pb::GetCatalogRequest>,
    ) -> Result<Response<pb::GetCatalogResponse>, Status> {
        let (catalog, version) = self.load_catalog().await?;
        // Credentials in webhook URLs are not shown; an apply of what was read puts them
        // back (`Catalog::restore_redacted`).
        let catalog_json = serde_json::to_string(&catalog.redacted())
            .map_err(|e| AdminError::Corrupt { what: "catalog".into(), reason: e.to_string() })?;
        Ok(Response::new(pb::GetCatalogResponse { catalog_json, version }))
    }

    async fn create_key(
        &self,
        request: Request<pb::CreateKeyRequest>,
    ) -> Result<Response<pb::KeySecretResponse>, Status> {
        let request = request.into_inner();
        let name = request.name.trim().to_owned();
        if name.is_empty() {
            return Err(invalid("name", "must not be empty").into());
        }
        let (failover_defaults, warnings) = self
            .check_key_settings(
                request.failover_defaults,
                &request.allowed_models,
                &request.allowed_regions,
            )
            .await?;
        let secret = new_secret();
        let now = now_ms();
        let record = ApiKeyRecord {
            id: new_key_id(),
            name,
            created_unix_ms: now,
            updated_unix_ms: now,
            status: KeyStatus::Active,
            secret_sha256: hash_secret(&secret),
            secret_hint: hint(&secret),
            failover_defaults,
            allowed_models: request.allowed_models,
            allowed_regions: request.allowed_regions,
            limits: None,
        };
        let version = self.save_key(&record, 0, None).await?;
        info!(key = %record.id, "API key created");
        Ok(Response::new(pb::KeySecretResponse {
            key: Some(key_to_pb(&record)),
            secret,
            warnings,
            version,
        }))
    }

    async fn list_keys(
        &self,
        request: Request<pb::ListKeysRequest>,
    ) -> Result<Response<pb::ListKeysResponse>, Status> {
        let request = request.into_inner();
        let status = match request.status.as_str() {
            "" => None,
            "active" => Some(KeyStatus::Active),
            "revoked" => Some(KeyStatus::Revoked),
            other => {
                let message = format!("{other:?} is not a key status; expected active or revoked");
                return Err(invalid("status", message).into());
            }
        };
        if !request.secret_sha256.is_empty() {
            // At most one key: the filters still apply; there is nothing to page.
            let wanted = request.secret_sha256.to_ascii_lowercase();
            let found = self.key_by_secret(&wanted).await?;
            let keys = found
                .iter()
                .filter(|r| {
                    status.is_none_or(|s| r.status == s)
                        && r.name.starts_with(request.name_prefix.as_str())
                        && r.id.starts_with(request.id_prefix.as_str())
                })
                .map(key_to_pb)
                .collect();
            return Ok(Response::new(pb::ListKeysResponse {
                keys,
                next_page_token: String::new(),
            }));
        }
        let mode = paging::mode(paging::Listing::Keys, request.limit, &request.page_token)
            .map_err(AdminError::from)?;
        let name_prefix = request.name_prefix;
        let page = paging::scan(
            self.store.as_ref(),
            paging::Listing::Keys,
            &self.layout.keys_prefix(),
            &request.id_prefix,
            &mode,
            |kv| {
                let record: ApiKeyRecord = decode(&kv.value, "API key")?;
                let wanted = status.is_none_or(|s| record.status == s)
                    && record.name.starts_with(name_prefix.as_str());
                Ok::<_, AdminError>(wanted.then(|| key_to_pb(&record)))
            },
            prost::Message::encoded_len,
        )
        .await?;
        Ok(Response::new(pb::ListKeysResponse {
            keys: page.items,
            next_page_token: page.next_token,
        }))
    }

    async fn get_key(
        &self,
        request: Request<pb::KeyIdRequest>,
    ) -> Result<Response<pb::KeyResponse>, Status> {
        let (record, _) = self.load_key(&request.into_inner().id).await?;
        Ok(Response::new(pb::KeyResponse {
            key: Some(key_to_pb(&record)),
            warnings: vec![],
            version: 0,
        }))
    }

    async fn revoke_key(
        &self,
        request: Request<pb::KeyIdRequest>,
    ) -> Result<Response<pb::KeyResponse>, Status> {
        let (mut record, rev) = self.load_key(&request.into_inner().id).await?;
        if record.status == KeyStatus::Revoked {
            return Ok(Response::new(pb::KeyResponse {
                key: Some(key_to_pb(&record)),
                warnings: vec!["key was already revoked".into()],
                version: 0,
            }));
        }
        record.status = KeyStatus::Revoked;
        record.updated_unix_ms = now_ms();
        let version = self.save_key(&record, rev, None).await?;
        info!(key = %record.id, "API key revoked");
        Ok(Response::new(pb::KeyResponse {
            key: Some(key_to_pb(&record)),
            warnings: vec![],
            version,
        }))
    }

    async fn rotate_key(
        &self,
        request: Request<pb::KeyIdRequest>,
    ) -> Result<Response<pb::KeySecretResponse>, Status> {
        let (mut record, rev) = self.load_key(&request.into_inner().id).await?;
        if record.status == KeyStatus::Revoked {
            return Err(AdminError::FailedPrecondition(format!(
                "API key {} is revoked; create a new key instead",
                record.id
            ))
            .into());
        }
        let secret = new_secret();
        let previous = std::mem::replace(&mut record.secret_sha256, hash_secret(&secret));
        record.secret_hint = hint(&secret);
        record.updated_unix_ms = now_ms();
        let version = self.save_key(&record, rev, Some(&previous)).await?;
        info!(key = %record.id, "API key rotated");
        Ok(Response::new(pb::KeySecretResponse {
            key: Some(key_to_pb(&record)),
            secret,
            warnings: vec![],
            version,
        }))
    }

    async fn set_key_defaults(
        &self,
        request: Request<pb::SetKeyDefaultsRequest>,
    ) -> Result<Response<pb::KeyResponse>, Status> {
        let request = request.into_inner();
        let (mut record, rev) = self.load_key(&request.id).await?;
        let (defaults, warnings) =
            self.check_key_settings(request.failover_defaults, &[], &[]).await?;
        record.failover_defaults = defaults;
        record.updated_unix_ms = now_ms();
        let version = self.save_key(&record, rev, None).await?;
        info!(key = %record.id, "API key defaults set");
        Ok(Response::new(pb::KeyResponse { key: Some(key_to_pb(&record)), warnings, version }))
    }

    async fn set_key_limits(
        &self,
        request: Request<pb::SetKeyLimitsRequest>,
    ) -> Result<Response<pb::KeyResponse>, Status> {
        let request = request.into_inner();
        let limits = request.limits.map(|l| Limits {
            rpm: l.rpm,
            tpm: l.tpm,
            tokens_per_day: l.tokens_per_day,
            usd_per_day: l.usd_per_day,
        });
        if let Some(limits) = &limits {
            limits.validate().map_err(AdminError::from)?;
        }
        let (mut record, rev) = self.load_key(&request.id).await?;
        record.limits = limits.filter(|l| !l.is_empty());
        record.updated_unix_ms = now_ms();
        let version = self.save_key(&record, rev, None).await?;
        info!(key = %record.id, "API key limits set");
        Ok(Response::new(pb::KeyResponse {
            key: Some(key_to_pb(&record)),
            warnings: vec![],
            version,
        }))
    }

    async fn list_deliveries(
        &self,
        request: Request<pb::ListDeliveriesRequest>,
    ) -> Result<Response<pb::ListDeliveriesResponse>, Status> {
        let request = request.into_inner();
        let name = request.webhook;
        if name.is_empty() {
            return Err(invalid("webhook", "must not be empty").into());
        }
        let limit = match request.limit {
            0 => 100,
            n => n as usize,
        };
        let (catalog, _) = self.load_catalog().await?;
        let webhook = catalog.webhooks.iter().find(|w| w.name == name);
        let state: SubscriptionState = match self
            .store
            .get(&self.layout.webhook_state(&name))
            .await
            .map_err(AdminError::from)?
        {
            Some(kv) => decode(&kv.value, "webhook state")?,
            None => SubscriptionState::default(),
        };
        let dead = self
            .store
            .list(&self.layout.dead_letters_prefix(&name))
            .await
            .map_err(AdminError::from)?;
        if webhook.is_none() && dead.kvs.is_empty() && state == SubscriptionState::default() {
            return Err(AdminError::NotFound(format!(
                "no webhook named {name:?} (and no deliveries recorded for one)"
            ))
            .into());
        }
        let mut deliveries = Vec::new();
        let mut backlog = 0u64;
        if let Some(webhook) = webhook {
            let outbox =
                self.store.list(&self.layout.outbox_prefix()).await.map_err(AdminError::from)?;
            let mut owed: Vec<(Revision, OutboxEntry)> = outbox
                .kvs
                .iter()
                .filter(|kv| kv.create_revision > state.cursor)
                .flat_map(|kv| {
                    let entries = decode_entries::<OutboxEntry>(&kv.value).unwrap_or_default();
                    entries.into_iter().map(move |e| (kv.create_revision, e))
                })
                .filter(|(_, e)| e.is_for(webhook))
                .collect();
            owed.sort_by_key(|(rev, _)| *rev);
            backlog = owed.len() as u64;
            for (rev, entry) in owed.into_iter().take(limit) {
                let pending =
                    state.pending.iter().find(|p| p.revision == rev && p.event_id == entry.id);
                deliveries.push(pb::WebhookDelivery {
                    event_id: entry.id,
                    event_type: entry.event_type,
                    at_unix_ms: entry.at_unix_ms,
                    state: "pending".into(),
                    attempts: pending.map_or(0, |p| p.attempts),
                    last_status: pending.map_or(0, |p| u32::from(p.last_status)),
                    last_error: pending.map(|p| p.last_error.clone()).unwrap_or_default(),
                    dead_unix_ms: 0,
                    key_id: entry.key_id,
                });
            }
        }
        for kv in dead.kvs.iter().take(limit) {
            let letter: DeadLetter = decode(&kv.value, "dead letter")?;
            deliveries.push(pb::WebhookDelivery {
                event_id: letter.entry.id,
                event_type: letter.entry.event_type,
                at_unix_ms: letter.entry.at_unix_ms,
                state: "dead".into(),
                attempts: letter.attempts,
                last_status: u32::from(letter.last_status),
                last_error: letter.last_error,
                dead_unix_ms: letter.dead_unix_ms,
                key_id: letter.entry.key_id,
            });
        }
        let leader =
            crate::store::election::leader(self.store.as_ref(), &self.layout.webhook_election())
                .await
                .map_err(AdminError::from)?
                .map(|kv| String::from_utf8_lossy(&kv.value).into_owned())
                .unwrap_or_default();
        Ok(Response::new(pb::ListDeliveriesResponse {
            webhook: name,
            subscribed: webhook.is_some(),
            backlog,
            delivered: state.delivered,
            dead: dead.kvs.len() as u64,
            consecutive_failures: state.consecutive_failures,
            next_attempt_unix_ms: state.next_attempt_unix_ms,
            last_status: u32::from(state.last_status),
            last_error: state.last_error,
            last_success_unix_ms: state.last_success_unix_ms,
            last_attempt_unix_ms: state.last_attempt_unix_ms,
            leader,
            deliveries,
        }))
    }

    async fn redeliver(
        &self,
        request: Request<pb::RedeliverRequest>,
    ) -> Result<Response<pb::RedeliverResponse>, Status> {
        let request = request.into_inner();
        let (catalog, _) = self.load_catalog().await?;
        let done = webhooks::redeliver(
            self.store.as_ref(),
            &self.layout,
            &catalog,
            &request.webhook,
            request.event_ids,
            request.all_dead,
        )
        .await
        .map_err(|e| match e {
            RedeliverError::UnknownWebhook(_) => AdminError::NotFound(e.to_string()),
            RedeliverError::NothingNamed => invalid("event_ids", e.to_string()),
            RedeliverError::Store(e) => AdminError::Store(e),
            RedeliverError::Corrupt { what, reason } => {
                AdminError::Corrupt { what: what.to_owned(), reason }
            }
        })?;
        Ok(Response::new(pb::RedeliverResponse {
            requeued: done.requeued,
            not_found: done.not_found,
        }))
    }

    async fn inject_fault(
        &self,
        request: Request<pb::InjectFaultRequest>,
    ) -> Result<Response<pb::InjectFaultResponse>, Status> {
        let request = request.into_inner();
        let deserializer = &mut serde_json::Deserializer::from_str(&request.fault_json);
        let fault: Fault = serde_path_to_error::deserialize(deserializer).map_err(|e| {
            let path = e.path().to_string();
            AdminError::from(ValidationErrors(vec![FieldError::new(
                path,
                e.into_inner().to_string(),
            )]))
        })?;
        let ttl = match request.ttl_ms {
            0 => DEFAULT_TTL,
            ms => Duration::from_millis(ms),
        };
        let (fault, version) = faults::inject(self.store.as_ref(), &self.layout, fault, ttl)
            .await
            .map_err(AdminError::from)?;
        let fault_json = serde_json::to_string(&fault)
            .map_err(|e| AdminError::Corrupt { what: "fault".into(), reason: e.to_string() })?;
        Ok(Response::new(pb::InjectFaultResponse { fault_json, version }))
    }

    async fn list_faults(
        &self,
        _request: Request<pb::ListFaultsRequest>,
    ) -> Result<Response<pb::ListFaultsResponse>, Status> {
        let listed =
            faults::list(self.store.as_ref(), &self.layout).await.map_err(AdminError::from)?;
        let faults_json =
            listed
                .iter()
                .map(serde_json::to_string)
                .collect::<Result<Vec<_>, _>>()
                .map_err(|e| AdminError::Corrupt { what: "fault".into(), reason: e.to_string() })?;
        Ok(Response::new(pb::ListFaultsResponse { faults_json }))
    }

    async fn clear_faults(
        &self,
        request: Request<pb::ClearFaultsRequest>,
    ) -> Result<Response<pb::ClearFaultsResponse>, Status> {
        let request = request.into_inner();
        let (cleared, version) = match (request.all, request.name.is_empty()) {
            (true, true) => faults::clear_all(self.store.as_ref(), &self.layout).await,
            (false, false) => faults::clear(self.store.as_ref(), &self.layout, &request.name)
                .await
                .map(|version| (vec![request.name], version)),
            (true, false) => return Err(invalid("name", "give a name or all, not both").into()),
            (false, true) => return Err(invalid("name", "name a fault, or ask for all").into()),
        }
        .map_err(AdminError::from)?;
        Ok(Response::new(pb::ClearFaultsResponse { cleared, version }))
    }

    async fn list_nodes(
        &self,
        request: Request<pb::ListNodesRequest>,
    ) -> Result<Response<pb::ListNodesResponse>, Status> {
        let request = request.into_inner();
        let mode = paging::mode(paging::Listing::Nodes, request.limit, &request.page_token)
            .map_err(AdminError::from)?;
        let config_version = self.cache.latest_change();
        let stale_for = i64::try_from(request.stale_for_ms).unwrap_or(i64::MAX);
        let now = now_ms();
        let page = paging::scan(
            self.store.as_ref(),
            paging::Listing::Nodes,
            &self.layout.nodes_prefix(),
            "",
            &mode,
            |kv| {
                // An unreadable record (a node of another version mid-upgrade) is left out,
                // as before paging.
                let Ok(n) = serde_json::from_slice::<NodeRecord>(&kv.value) else {
                    return Ok::<_, AdminError>(None);
                };
                let wanted = (request.control_plane.is_empty()
                    || n.control_plane == request.control_plane)
                    && (stale_for == 0
                        || now.saturating_sub(n.last_heartbeat_unix_ms) >= stale_for)
                    && (!request.rejected_only || n.rejected.is_some());
                Ok(wanted.then(|| pb::Node {
                    lag: (config_version - n.applied_version).max(0),
                    node_id: n.node_id,
                    listen_address: n.listen_address,
                    applied_version: n.applied_version,
                    last_heartbeat_unix_ms: n.last_heartbeat_unix_ms,
                    control_plane: n.control_plane,
                    software_version: n.software_version,
                    connected_unix_ms: n.connected_unix_ms,
                    rejected_version: n.rejected.as_ref().map_or(0, |r| r.version),
                    rejected_error: n.rejected.map(|r| r.error).unwrap_or_default(),
                }))
            },
            prost::Message::encoded_len,
        )
        .await?;
        Ok(Response::new(pb::ListNodesResponse {
            nodes: page.items,
            config_version,
            next_page_token: page.next_token,
        }))
    }
}

impl AdminService {
    /// The key whose secret hashes to `sha256` (lower-case hex), from the secret index.
    /// Keys stored before the index existed have no entry: until one lookup has filled the
    /// index in (and marked it complete), a miss reads the keys a slice at a time.
    async fn key_by_secret(&self, sha256: &str) -> Result<Option<ApiKeyRecord>, AdminError> {
        // Not a SHA-256: no key has it (and it must not reach into other store keys).
        if sha256.len() != 64 || !sha256.bytes().all(|b| b.is_ascii_hexdigit()) {
            return Ok(None);
        }
        if let Some(entry) = self.store.get(&self.layout.key_secret(sha256)).await? {
            let id = String::from_utf8_lossy(&entry.value);
            if let Some(kv) = self.store.get(&self.layout.key(&id)).await? {
                let record: ApiKeyRecord = decode(&kv.value, "API key")?;
                // An entry left by a race with a rotation names a key whose secret moved on.
                if record.secret_sha256 == sha256 {
                    return Ok(Some(record));
                }
            }
        }
        if self.store.get(&self.layout.key_secrets_complete()).await?.is_some() {
            return Ok(None);
        }
        self.spawn_backfill();
        let mut mode = paging::Mode::Paged { limit: 1, after: None };
        loop {
            let page = paging::scan(
                self.store.as_ref(),
                paging::Listing::Keys,
                &self.layout.keys_prefix(),
                "",
                &mode,
                |kv| {
                    let record: ApiKeyRecord = decode(&kv.value, "API key")?;
                    Ok::<_, AdminError>((record.secret_sha256 == sha256).then_some(record))
                },
                |_| 0,
            )
            .await?;
            if let Some(found) = page.items.into_iter().next() {
                return Ok(Some(found));
            }
            if page.next_token.is_empty() {
                return Ok(None);
            }
            let after = paging::decode_token(paging::Listing::Keys, &page.next_token)?;
            mode = paging::Mode::Paged { limit: 1, after: Some(after) };
        }
    }

    /// Writes the secret-index entry of every stored key, then the mark that the index is
    /// complete; in the background, once per process at a time. Entries are written
    /// unconditionally: an entry maps a hash to the key that had it, so writing it twice,
    /// or after a rotation moved the key on, is harmless (lookups check the key's hash).
    fn spawn_backfill(&self) {
        use std::sync::atomic::Ordering;
        if BACKFILLING.swap(true, Ordering::AcqRel) {
            return;
        }
        let (store, layout) = (Arc::clone(&self.store), self.layout.clone());
        tokio::spawn(async move {
            let result = backfill_secret_index(store.as_ref(), &layout).await;
            BACKFILLING.store(false, Ordering::Release);
            match result {
                Ok(keys) => info!(keys, "secret index of API keys complete"),
                Err(e) => {
                    tracing::warn!(error = %e, "filling in the secret index of API keys failed; the next lookup that misses tries again")
                }
            }
        });
    }

    /// Every limited key's use of each of its limits, fleet-wide, from what the replicas
    /// published a moment ago.
    async fn limit_status(&self, key_id: &str) -> Result<Vec<pb::LimitStatus>, AdminError> {
        let limited = self.limited_keys(key_id).await?;
        let fleet = limits::fleet_totals(self.store.as_ref(), &self.layout).await?;
        let now = now_ms();
        let now_s = now.div_euclid(1000);
        let midnight = (now_s.div_euclid(86_400) + 1) * 86_400_000;
        let mut out = Vec::new();
        for record in limited {
            let Some(l) = record.limits else { continue };
            let used = fleet.get(&record.id).cloned().unwrap_or_default();
            // The window has room again when its oldest counted second leaves it.
            let oldest = used.seconds.keys().next().map_or(0, |s| (s + 60) * 1000);
            let status = |limit: &str, value: f64, used: f64, reset: i64| pb::LimitStatus {
                key_id: record.id.clone(),
                limit: limit.to_owned(),
                value,
                used,
                reset_unix_ms: if used > 0.0 { reset } else { 0 },
            };
            if let Some(v) = l.rpm {
                out.push(status("rpm", v as f64, used.requests() as f64, oldest));
            }
            if let Some(v) = l.tpm {
                out.push(status("tpm", v as f64, used.tokens() as f64, oldest));
            }
            if let Some(v) = l.tokens_per_day {
                out.push(status("tokens_per_day", v as f64, used.day_tokens as f64, midnight));
            }
            if let Some(v) = l.usd_per_day {
                out.push(status("usd_per_day", v, used.day_micro_usd as f64 / 1e6, midnight));
            }
        }
        Ok(out)
    }
}

impl AdminService {
    /// The keys with limits (`key_id`: that key only, read on its own). All keys are read a
    /// slice at a time and only the limited ones kept: a fleet of a million keys is not
    /// held in memory to find its few limited ones.
    async fn limited_keys(&self, key_id: &str) -> Result<Vec<ApiKeyRecord>, AdminError> {
        if !key_id.is_empty() {
            let Some(kv) = self.store.get(&self.layout.key(key_id)).await? else {
                return Ok(Vec::new());
            };
            let record: ApiKeyRecord = decode(&kv.value, "API key")?;
            return Ok(record.limits.is_some().then_some(record).into_iter().collect());
        }
        let prefix = self.layout.keys_prefix();
        let mut from = prefix.clone();
        let mut limited = Vec::new();
        loop {
            let slice = self.store.list_page(&prefix, &from, LIMITS_SLICE).await?;
            let Some(last) = slice.kvs.last() else { break };
            from = format!("{}\0", last.key);
            for kv in &slice.kvs {
                let record: ApiKeyRecord = decode(&kv.value, "API key")?;
                if record.limits.is_some() {
                    limited.push(record);
                }
            }
        }
        Ok(limited)
    }
}

impl AdminService {
    /// The keys whose `failoverDefaults` chain `new` would make mix model kinds or
    /// dimensions, each as the error that names it (at most [`BROKEN_SHOWN`]). Keys are
    /// read only when some name's kind changes, a slice at a time.
    async fn keys_broken_by(
        &self,
        old: &Catalog,
        new: &Catalog,
    ) -> Result<Vec<FieldError>, AdminError> {
        let kind = |c: &Catalog, name: &str| c.resolve(name).map(|m| m.chain_kind());
        let changed = old.models.iter().chain(&new.models).any(|m| {
            switchyard_catalog::wildcard_prefix(&m.name).is_none()
                && kind(old, &m.name).is_some()
                && kind(old, &m.name) != kind(new, &m.name)
        });
        if !changed {
            return Ok(Vec::new());
        }
        let prefix = self.layout.keys_prefix();
        let mut from = prefix.clone();
        let mut broken = Vec::new();
        loop {
            let slice = self.store.list_page(&prefix, &from, LIMITS_SLICE).await?;
            let Some(last) = slice.kvs.last() else { break };
            from = format!("{}\0", last.key);
            for kv in &slice.kvs {
                let record: ApiKeyRecord = decode(&kv.value, "API key")?;
                let Some(defaults) = &record.failover_defaults else { continue };
                if record.status != KeyStatus::Active {
                    continue;
                }
                if let Err(e) = defaults.check_kinds(|m| kind(new, m)) {
                    broken.push(FieldError::new(
                        format!("key {} ({}): {}", record.id, record.name, e.path),
                        format!(
                            "{} after this change; change the key's defaults first (switchyard keys set-defaults {})",
                            e.message, record.id
                        ),
                    ));
                    if broken.len() == BROKEN_SHOWN {
                        return Ok(broken);
                    }
                }
            }
        }
        Ok(broken)
    }
}

/// The most keys a refused apply names.
const BROKEN_SHOWN: usize = 10;

/// Keys read at a time while looking for the limited ones.
const LIMITS_SLICE: usize = 1_000;

async fn backfill_secret_index(store: &dyn Store, layout: &Layout) -> Result<usize, AdminError> {
    let prefix = layout.keys_prefix();
    let mut from = prefix.clone();
    let mut count = 0;
    loop {
        let slice = store.list_page(&prefix, &from, crate::layout::MAX_TXN_OPS).await?;
        let Some(last) = slice.kvs.last() else { break };
        from = format!("{}\0", last.key);
        let mut success = Vec::with_capacity(slice.kvs.len());
        for kv in &slice.kvs {
            let record: ApiKeyRecord = decode(&kv.value, "API key")?;
            success.push(TxnOp::Put {
                key: layout.key_secret(&record.secret_sha256),
                value: record.id.into_bytes(),
                lease: None,
            });
        }
        count += success.len();
        store.txn(Txn { success, ..Txn::default() }).await?;
    }
    store.put(&layout.key_secrets_complete(), b"1".to_vec(), None).await?;
    Ok(count)
}

fn decode<T: serde::de::DeserializeOwned>(bytes: &[u8], what: &str) -> Result<T, AdminError> {
    serde_json::from_slice(bytes)
        .map_err(|e| AdminError::Corrupt { what: what.into(), reason: e.to_string() })
}

fn defaults_from_pb(d: pb::FailoverDefaults) -> Result<FailoverDefaults, ValidationErrors> {
    let mut errors = Vec::new();
    let mut on = Vec::new();
    for (i, text) in d.on.iter().enumerate() {
        match FailoverReason::parse(text) {
            Some(reason) => on.push(reason),
            None => errors.push(FieldError::new(
                format!("failoverDefaults.on[{i}]"),
                format!("unknown trigger {text:?}; expected {}", FailoverReason::accepted_list()),
            )),
        }
    }
    if !errors.is_empty() {
        return Err(ValidationErrors(errors));
    }
    Ok(FailoverDefaults {
        models: d.models,
        timeout_ms: d.timeout_ms,
        first_token_timeout_ms: d.first_token_timeout_ms,
        on: if on.is_empty() { None } else { Some(on) },
        degraded: d
            .degraded
            .map(|d| Degraded { message: d.message, when_all_open: d.when_all_open }),
        continue_streams: d.continue_streams,
    })
}

pub fn key_to_pb(r: &ApiKeyRecord) -> pb::ApiKey {
    pb::ApiKey {
        id: r.id.clone(),
        name: r.name.clone(),
        created_unix_ms: r.created_unix_ms,
        updated_unix_ms: r.updated_unix_ms,
        status: r.status.as_str().to_owned(),
        secret_hint: r.secret_hint.clone(),
        failover_defaults: r.failover_defaults.as_ref().map(|d| pb::FailoverDefaults {
            models: d.models.clone(),
            timeout_ms: d.timeout_ms,
            first_token_timeout_ms: d.first_token_timeout_ms,
            on: d.on.iter().flatten().map(|r| r.as_str().to_owned()).collect(),
            degraded: d.degraded.as_ref().map(|d| pb::Degraded {
                message: d.message.clone(),
                when_all_open: d.when_all_open,
            }),
            continue_streams: d.continue_streams,
        }),
        allowed_models: r.allowed_models.clone(),
        allowed_regions: r.allowed_regions.clone(),
        limits: r.limits.map(|l| pb::KeyLimits {
            rpm: l.rpm,
            tpm: l.tpm,
            tokens_per_day: l.tokens_per_day,
            usd_per_day: l.usd_per_day,
        }),
    }
}

const ALPHANUMERIC: &[u8] = b"ABCDEFGHIJKLMNOPQRSTUVWXYZabcdefghijklmnopqrstuvwxyz0123456789";

fn random_text(len: usize) -> String {
    let mut rng = rand::rng();
    (0..len).map(|_| char::from(ALPHANUMERIC[rng.random_range(0..ALPHANUMERIC.len())])).collect()
}

/// `sy-` and 40 alphanumerics: about 238 bits from the OS-seeded CSPRNG.
fn new_secret() -> String {
    format!("{SECRET_PREFIX}{}", random_text(40))
}

fn new_key_id() -> String {
    format!("key_{}", random_text(16).to_ascii_lowercase())
}

fn hint(secret: &str) -> String {
    secret.chars().rev().take(4).collect::<Vec<_>>().into_iter().rev().collect()
}

#[cfg(test)]
mod tests {
    #![allow(clippy::unwrap_used)]
    use super::*;
    use crate::store::embedded::EmbeddedStore;

    async fn service(dir: &std::path::Path) -> AdminService {
        let store: Arc<dyn Store> = Arc::new(EmbeddedStore::open(dir).await.unwrap());
        let (_, stopping) = tokio::sync::watch::channel(false);
        AdminService {
            store,
            layout: Layout::new("/t"),
            cache: ConfigCache::new(),
            stopping,
            fleet: crate::fleet::Fleet::new(),
        }
    }

    fn catalog_with_webhook(url: &str) -> String {
        serde_json::json!({
            "webhooks": [{"name": "oncall", "url": url, "events": ["*"]}]
        })
        .to_string()
    }

    async fn apply(admin: &AdminService, json: String) -> Result<pb::ApplyCatalogResponse, Status> {
        let request = pb::ApplyCatalogRequest { catalog_json: json, ..Default::default() };
        admin.apply_catalog(Request::new(request)).await.map(Response::into_inner)
    }

    async fn read(admin: &AdminService) -> String {
        let reply = admin.get_catalog(Request::new(pb::GetCatalogRequest {})).await.unwrap();
        reply.into_inner().catalog_json
    }

    #[test]
    fn defaults_take_invalid_output_in_on_and_name_an_unknown_trigger() {
        let pb_defaults = |on: &[&str]| pb::FailoverDefaults {
            models: vec!["a".into()],
            on: on.iter().map(|s| (*s).to_owned()).collect(),
            ..Default::default()
        };
        let d = defaults_from_pb(pb_defaults(&["timeout", "invalid_output"])).unwrap();
        assert_eq!(d.on, Some(vec![FailoverReason::Timeout, FailoverReason::InvalidOutput]));
        let e = defaults_from_pb(pb_defaults(&["timeout", "bad_json"])).unwrap_err();
        assert_eq!(e.0[0].path, "failoverDefaults.on[1]");
        assert!(e.0[0].message.contains("context_length or invalid_output"), "{}", e.0[0].message);
    }

    #[tokio::test]
    async fn listings_redact_webhook_url_credentials_and_keep_them_stored() {
        let dir = tempfile::tempdir().unwrap();
        let admin = service(dir.path()).await;
        let url = "https://alice:s3cret@hooks.example.com/x";
        assert!(apply(&admin, catalog_with_webhook(url)).await.unwrap().applied);

        let shown = read(&admin).await;
        assert!(!shown.contains("s3cret") && !shown.contains("alice"), "{shown}");
        assert!(shown.contains("https://***@hooks.example.com/x"), "{shown}");

        // What was read, applied again (as `webhooks enable` and friends do), changes
        // nothing: the stored URL keeps its credentials.
        let again = apply(&admin, shown).await.unwrap();
        assert!(again.changes.is_empty(), "{:?}", again.changes);
        let (stored, _) = admin.load_catalog().await.unwrap();
        assert_eq!(stored.webhooks[0].url, url);
    }

    #[tokio::test]
    async fn limit_status_finds_the_limited_keys_among_slices_of_many() {
        let dir = tempfile::tempdir().unwrap();
        let admin = service(dir.path()).await;
        // More than two slices of keys, three of them limited, spread over the slices.
        let mut ops = Vec::new();
        for i in 0..(2 * LIMITS_SLICE + 10) {
            let limits = [3, LIMITS_SLICE + 1, 2 * LIMITS_SLICE + 9]
                .contains(&i)
                .then_some(switchyard_catalog::Limits { rpm: Some(60), ..Default::default() });
            let record = ApiKeyRecord {
                id: format!("key_{i:05}"),
                name: "n".into(),
                created_unix_ms: 1,
                updated_unix_ms: 1,
                status: KeyStatus::Active,
                secret_sha256: hash_secret(&format!("s{i}")),
                secret_hint: "abcd".into(),
                failover_defaults: None,
                allowed_models: vec![],
                allowed_regions: vec![],
                limits,
            };
            let value = serde_json::to_vec(&record).unwrap();
            ops.push(TxnOp::Put { key: admin.layout.key(&record.id), value, lease: None });
            if ops.len() == 128 {
                admin
                    .store
                    .txn(Txn { success: std::mem::take(&mut ops), ..Txn::default() })
                    .await
                    .unwrap();
            }
        }
        admin.store.txn(Txn { success: ops, ..Txn::default() }).await.unwrap();
        let ids =
            |rows: Vec<pb::LimitStatus>| rows.into_iter().map(|r| r.key_id).collect::<Vec<_>>();
        assert_eq!(
            ids(admin.limit_status("").await.unwrap()),
            ["key_00003", "key_01001", "key_02009"]
        );
        assert_eq!(ids(admin.limit_status("key_01001").await.unwrap()), ["key_01001"]);
        assert!(admin.limit_status("key_00004").await.unwrap().is_empty(), "no limits");
        assert!(admin.limit_status("key_nope").await.unwrap().is_empty(), "no such key");
    }

    async fn create(admin: &AdminService, name: &str) -> pb::KeySecretResponse {
        let request = pb::CreateKeyRequest { name: name.into(), ..Default::default() };
        admin.create_key(Request::new(request)).await.unwrap().into_inner()
    }

    async fn by_secret(admin: &AdminService, secret: &str) -> Vec<String> {
        let request =
            pb::ListKeysRequest { secret_sha256: hash_secret(secret), ..Default::default() };
        let reply = admin.list_keys(Request::new(request)).await.unwrap().into_inner();
        reply.keys.into_iter().map(|k| k.id).collect()
    }

    #[tokio::test]
    async fn a_key_is_found_by_its_secret_through_the_index_and_a_rotation_moves_the_entry() {
        let dir = tempfile::tempdir().unwrap();
        let admin = service(dir.path()).await;
        let created = create(&admin, "app").await;
        let id = created.key.unwrap().id;
        let index = admin.layout.key_secret(&hash_secret(&created.secret));
        let entry = admin.store.get(&index).await.unwrap().unwrap();
        assert_eq!(entry.value.as_ref(), id.as_bytes(), "written with the key");
        assert_eq!(by_secret(&admin, &created.secret).await, std::slice::from_ref(&id));

        let rotated =
            admin.rotate_key(Request::new(pb::KeyIdRequest { id: id.clone() })).await.unwrap();
        let new_secret = rotated.into_inner().secret;
        assert!(admin.store.get(&index).await.unwrap().is_none(), "the old entry goes");
        // The index is complete (every key was written with its entry), so a miss is final.
        admin.store.put(&admin.layout.key_secrets_complete(), b"1".to_vec(), None).await.unwrap();
        assert!(by_secret(&admin, &created.secret).await.is_empty());
        assert_eq!(by_secret(&admin, &new_secret).await, std::slice::from_ref(&id));
        assert!(by_secret(&admin, "not-a-secret").await.is_empty());
        // The listing's filters apply to the key found by its secret too.
        let filtered = |status: &str, name_prefix: &str| pb::ListKeysRequest {
            secret_sha256: hash_secret(&new_secret),
            status: status.into(),
            name_prefix: name_prefix.into(),
            ..Default::default()
        };
        for (request, found) in [
            (filtered("active", "ap"), true),
            (filtered("revoked", ""), false),
            (filtered("", "other"), false),
        ] {
            let reply = admin.list_keys(Request::new(request)).await.unwrap().into_inner();
            assert_eq!(reply.keys.len(), usize::from(found));
        }
        let bad = filtered("gone", "");
        let e = admin.list_keys(Request::new(bad)).await.unwrap_err();
        assert!(e.message().contains("status"), "{e:?}");
    }

    #[tokio::test]
    async fn a_key_stored_before_the_index_is_found_and_the_index_filled_in() {
        let dir = tempfile::tempdir().unwrap();
        let admin = service(dir.path()).await;
        let created = create(&admin, "new").await;
        // A key as releases before the index stored it: no entry.
        let old = ApiKeyRecord {
            id: "key_old".into(),
            name: "old".into(),
            created_unix_ms: 1,
            updated_unix_ms: 1,
            status: KeyStatus::Active,
            secret_sha256: hash_secret("sy-old-secret"),
            secret_hint: "cret".into(),
            failover_defaults: None,
            allowed_models: vec![],
            allowed_regions: vec![],
            limits: None,
        };
        let value = serde_json::to_vec(&old).unwrap();
        admin.store.put(&admin.layout.key("key_old"), value, None).await.unwrap();

        assert_eq!(by_secret(&admin, "sy-old-secret").await, ["key_old"]);
        let complete = admin.layout.key_secrets_complete();
        let store = Arc::clone(&admin.store);
        for _ in 0..500 {
            if store.get(&complete).await.unwrap().is_some() {
                break;
            }
            tokio::time::sleep(Duration::from_millis(10)).await;
        }
        assert!(store.get(&complete).await.unwrap().is_some(), "the backfill finished");
        let entry = store.get(&admin.layout.key_secret(&old.secret_sha256)).await.unwrap();
        assert_eq!(entry.unwrap().value.as_ref(), b"key_old");
        assert_eq!(by_secret(&admin, "sy-old-secret").await, ["key_old"]);
        assert_eq!(by_secret(&admin, &created.secret).await.len(), 1);
    }

    #[tokio::test]
    async fn list_keys_filters_by_status_name_and_id_prefix_and_refuses_a_bad_status() {
        let dir = tempfile::tempdir().unwrap();
        let admin = service(dir.path()).await;
        let mut ids = Vec::new();
        for name in ["team-a", "team-b", "other"] {
            ids.push(create(&admin, name).await.key.unwrap().id);
        }
        admin.revoke_key(Request::new(pb::KeyIdRequest { id: ids[1].clone() })).await.unwrap();
        let list = |request: pb::ListKeysRequest| {
            let admin = &admin;
            async move {
                let reply = admin.list_keys(Request::new(request)).await.unwrap().into_inner();
                let mut names: Vec<String> = reply.keys.into_iter().map(|k| k.name).collect();
                names.sort();
                (names, reply.next_page_token)
            }
        };
        let all = list(pb::ListKeysRequest::default()).await;
        assert_eq!(all, (vec!["other".into(), "team-a".into(), "team-b".into()], String::new()));
        let active = pb::ListKeysRequest { status: "active".into(), ..Default::default() };
        assert_eq!(list(active).await.0, ["other", "team-a"]);
        let revoked_team = pb::ListKeysRequest {
            status: "revoked".into(),
            name_prefix: "team".into(),
            limit: 10,
            ..Default::default()
        };
        assert_eq!(list(revoked_team).await.0, ["team-b"]);
        let by_id = pb::ListKeysRequest { id_prefix: ids[2].clone(), ..Default::default() };
        assert_eq!(list(by_id).await.0, ["other"]);
        let bad = pb::ListKeysRequest { status: "expired".into(), ..Default::default() };
        let status = admin.list_keys(Request::new(bad)).await.unwrap_err();
        assert_eq!(status.code(), tonic::Code::InvalidArgument);
        assert!(status.message().starts_with("status: "), "{}", status.message());
        let bad = pb::ListKeysRequest { page_token: "nonsense".into(), ..Default::default() };
        let status = admin.list_keys(Request::new(bad)).await.unwrap_err();
        assert_eq!(status.code(), tonic::Code::InvalidArgument);
        assert!(status.message().starts_with("page_token: "), "{}", status.message());
    }

    fn event(id: &str, at: i64, key: &str) -> AuditEvent {
        AuditEvent {
            id: id.into(),
            at_unix_ms: at,
            node_id: "n".into(),
            key_id: key.into(),
            requested_model: "m".into(),
            served_model: String::new(),
            attempts: vec![],
            stream: false,
            status: 0,
            degraded: String::new(),
            request_id: String::new(),
            lost: None,
            continued: vec![],
            surface: String::new(),
        }
    }

    /// 300 batches of 10 events (more than a slice), times interleaved across batches, one
    /// batch stored twice under another key, events of two keys.
    async fn audit_log(store: &dyn Store, layout: &Layout) {
        for b in 0..300i64 {
            let events: Vec<Vec<u8>> = (0..10)
                .map(|i| {
                    let at = b * 10 + i;
                    let key = if at % 3 == 0 { "key_a" } else { "key_b" };
                    serde_json::to_vec(&event(&format!("e{at:05}"), at, key)).unwrap()
                })
                .collect();
            let value = crate::events::encode_batch(&events);
            let newest = b * 10 + 9;
            store
                .put(&layout.audit_batch(newest, &format!("b{b}"), 10), value.clone(), None)
                .await
                .unwrap();
            if b == 299 {
                store.put(&layout.audit_batch(newest + 1, "again", 10), value, None).await.unwrap();
            }
        }
    }

    #[tokio::test]
    async fn the_newest_events_are_read_a_slice_at_a_time_once_each_in_time_order() {
        let dir = tempfile::tempdir().unwrap();
        let admin = service(dir.path()).await;
        audit_log(admin.store.as_ref(), &admin.layout).await;
        let prefix = admin.layout.audit_prefix();

        let newest = Newest::new(25, false, |_: &AuditEvent| true);
        let (newest, _) = read_newest(admin.store.as_ref(), &prefix, newest).await.unwrap();
        let (events, seen, _) = newest.finish();
        let ids: Vec<String> = events.iter().map(|e| e.id.clone()).collect();
        let expected: Vec<String> = (2_975..3_000).map(|at| format!("e{at:05}")).collect();
        assert_eq!(ids, expected, "the newest 25, oldest first, the twice-stored batch once");
        assert_eq!(seen.len(), 25, "without follow only what was sent is remembered");

        let only_a = |e: &AuditEvent| e.key_id == "key_a";
        let (newest, _) =
            read_newest(admin.store.as_ref(), &prefix, Newest::new(4, true, only_a)).await.unwrap();
        let (events, seen, _) = newest.finish();
        let ats: Vec<i64> = events.iter().map(|e| e.at_unix_ms).collect();
        assert_eq!(ats, [2_988, 2_991, 2_994, 2_997]);
        assert_eq!(seen.len(), 1_000, "following: every listed id of key_a, to skip in the watch");
    }

    #[tokio::test]
    async fn apply_refuses_private_webhook_targets_in_every_form() {
        let dir = tempfile::tempdir().unwrap();
        let admin = service(dir.path()).await;
        for url in [
            "http://x@127.0.0.1:9000/hook",
            "http://2130706433:9000/",
            "http://0x7f000001:9000/",
            "http://127.1:9000/",
            "http://[::ffff:127.0.0.1]:9000/",
            "http://[::7f00:1]:9000/",
            "http://[64:ff9b::7f00:1]:9000/",
            "http://198.18.0.1/",
            "http://224.0.0.1/",
        ] {
            let status = apply(&admin, catalog_with_webhook(url)).await.unwrap_err();
            assert_eq!(status.code(), tonic::Code::InvalidArgument, "{url}");
            assert!(
                status.message().starts_with("webhooks[0].url:"),
                "{url}: {}",
                status.message()
            );
        }
        let upper = apply(&admin, catalog_with_webhook("HTTP://hooks.example.com/x")).await;
        assert!(upper.is_ok_and(|r| r.applied), "an upper-case scheme is http");
    }
}
