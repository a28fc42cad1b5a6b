//! The etcd store: the [`Store`] trait over etcd's v3 gRPC API, with the client generated
//! from our own copy of etcd's protos (`switchyard_proto::etcd`).
//!
//! Several endpoints are used in order, not balanced: requests go to the current endpoint
//! until it fails at the transport level, then to the next one. (tonic's `balance_list`
//! keeps routing requests to a dead member and fails them, so it is not used.) Every member
//! of an etcd cluster serves linearizable reads and writes, so which one answers does not
//! matter. A failed request moves to the next endpoint at once when that cannot apply it
//! twice: reads, watches, lease grants and keep-alives always; writes only when the
//! connection was never established (nothing was sent). Otherwise the error is returned and
//! the next call uses the next endpoint.
//!
//! Known differences from the embedded store: etcd rounds lease TTLs up to whole seconds
//! and to its minimum; it keeps history until someone calls [`Store::compact`].

use std::future::Future;
use std::sync::Arc;
use std::sync::atomic::{AtomicUsize, Ordering};
use std::time::Duration;

use async_trait::async_trait;
use switchyard_proto::etcd as pb;
use switchyard_proto::etcd::kv_client::KvClient;
use switchyard_proto::etcd::lease_client::LeaseClient;
use switchyard_proto::etcd::watch_client::WatchClient;
use tokio::sync::mpsc;
use tokio_stream::wrappers::ReceiverStream;
use tonic::transport::{Channel, Endpoint};

use super::api::{
    Compare, CompareOp, CompareTarget, EventKind, KeyListing, KeyValue, LeaseId, Listing, Revision,
    Store, StoreError, Txn, TxnOp, TxnResult, WatchBatch, WatchEvent, WatchStream,
};

const CONNECT_TIMEOUT: Duration = Duration::from_secs(3);
/// Bound on every call: etcd answers in milliseconds when it has a leader, and a caller is
/// better served by an error than by waiting out an election forever.
const REQUEST_TIMEOUT: Duration = Duration::from_secs(10);
/// Keys per page when listing, so a prefix with 100,000+ keys never needs one huge message.
const LIST_PAGE: i64 = 1000;
/// The largest response the client decodes (tonic's default is 4 MiB). A page of the audit
/// log holds batches of up to 1 MiB each; a page larger than this is asked for again in
/// fewer keys ([`EtcdStore::list`]).
const MAX_RESPONSE_BYTES: usize = 16 * 1024 * 1024;
const WATCH_BUFFER: usize = 64;

#[derive(Clone)]
pub struct EtcdStore {
    endpoints: Arc<Endpoints>,
}

struct Endpoints {
    /// `(url, lazily connected channel)`, in the order given.
    channels: Vec<(String, Channel)>,
    current: AtomicUsize,
}

/// Whether a request may be sent again after an ambiguous failure.
#[derive(Clone, Copy, PartialEq, Eq)]
enum Retry {
    Always,
    /// Only if it never left this process.
    IfNotSent,
}

// === impl EtcdStore ===

impl EtcdStore {
    /// Connects to `endpoints` (`http://host:port`) and checks that one of them answers.
    pub async fn connect(endpoints: &[String]) -> Result<Self, StoreError> {
        if endpoints.is_empty() {
            return Err(StoreError::InvalidUrl {
                url: String::new(),
                reason: "no etcd endpoint".into(),
            });
        }
        let mut channels = Vec::with_capacity(endpoints.len());
        for url in endpoints {
            let channel = Endpoint::from_shared(url.clone())
                .map_err(|e| StoreError::InvalidUrl { url: url.clone(), reason: e.to_string() })?
                .connect_timeout(CONNECT_TIMEOUT)
                .tcp_nodelay(true)
                // Notices a dead member (e.g. a partitioned host) on long-lived watch streams.
                .http2_keep_alive_interval(Duration::from_secs(10))
                .keep_alive_timeout(Duration::from_secs(5))
                .keep_alive_while_idle(true)
                .connect_lazy();
            channels.push((url.clone(), channel));
        }
        let store =
            Self { endpoints: Arc::new(Endpoints { channels, current: AtomicUsize::new(0) }) };
        store.current_revision().await?;
        Ok(store)
    }

    /// Runs `attempt` on the current endpoint, moving on to the next ones as `retry` allows.
    async fn call<T, F, Fut>(&self, what: &str, retry: Retry, attempt: F) -> Result<T, StoreError>
    where
        F: Fn(Channel) -> Fut,
        Fut: Future<Output = Result<T, tonic::Status>>,
    {
        let endpoints = &self.endpoints;
        let count = endpoints.channels.len();
        let mut failures = Vec::new();
        for _ in 0..count {
            let index = endpoints.current.load(Ordering::Relaxed) % count;
            let (url, channel) = &endpoints.channels[index];
            let (error, sent) =
                match tokio::time::timeout(REQUEST_TIMEOUT, attempt(channel.clone())).await {
                    Ok(Ok(response)) => return Ok(response),
                    Ok(Err(status)) if !is_transport_failure(&status) => {
                        return Err(status_error(what, &status));
                    }
                    Ok(Err(status)) => {
                        let sent = !is_connect_failure(&status);
                        (status_error(what, &status), sent)
                    }
                    Err(_) => (
                        StoreError::Unavailable(format!(
                            "etcd {what} timed out after {REQUEST_TIMEOUT:?}"
                        )),
                        true,
                    ),
                };
            // Another caller may have moved on already; don't skip a healthy endpoint.
            let _ = endpoints.current.compare_exchange(
                index,
                (index + 1) % count,
                Ordering::Relaxed,
                Ordering::Relaxed,
            );
            failures.push(match &error {
                StoreError::Unavailable(message) => format!("{url}: {message}"),
                other => format!("{url}: {other}"),
            });
            if sent && retry == Retry::IfNotSent {
                return Err(error);
            }
        }
        Err(StoreError::Unavailable(format!("no etcd endpoint answered: {}", failures.join("; "))))
    }

    async fn range(
        &self,
        what: &str,
        request: pb::RangeRequest,
    ) -> Result<pb::RangeResponse, StoreError> {
        self.call(what, Retry::Always, |channel| {
            let request = request.clone();
            async move {
                KvClient::new(channel)
                    .max_decoding_message_size(MAX_RESPONSE_BYTES)
                    .range(request)
                    .await
                    .map(tonic::Response::into_inner)
            }
        })
        .await
    }
}

#[async_trait]
impl Store for EtcdStore {
    async fn get(&self, key: &str) -> Result<Option<KeyValue>, StoreError> {
        let request = pb::RangeRequest { key: key.as_bytes().to_vec(), ..Default::default() };
        let response = self.range("get", request).await?;
        response.kvs.into_iter().next().map(from_pb_kv).transpose()
    }

    async fn list(&self, prefix: &str) -> Result<Listing, StoreError> {
        let (mut key, range_end) = prefix_range(prefix);
        let mut kvs = Vec::new();
        // Later pages are read at the first page's revision, so the listing is one snapshot.
        let mut revision = 0;
        let mut limit = LIST_PAGE;
        loop {
            let request = pb::RangeRequest {
                key: key.clone(),
                range_end: range_end.clone(),
                limit,
                revision,
                ..Default::default()
            };
            let page = match self.range("list", request).await {
                // Large values (batches of events): the same page again, in fewer keys.
                Err(StoreError::ResponseTooLarge(_)) if limit > 1 => {
                    limit = (limit / 8).max(1);
                    continue;
                }
                page => page?,
            };
            if revision == 0 {
                revision = header_revision(page.header.as_ref());
            }
            let more = page.more;
            let mut last = None;
            for kv in page.kvs {
                last = Some(kv.key.clone());
                kvs.push(from_pb_kv(kv)?);
            }
            match last {
                Some(mut last) if more => {
                    last.push(0);
                    key = last;
                }
                _ => break,
            }
        }
        Ok(Listing { kvs, revision })
    }

    async fn list_keys(
        &self,
        prefix: &str,
        from: &str,
        limit: usize,
    ) -> Result<KeyListing, StoreError> {
        if limit == 0 {
            // etcd reads limit 0 as "no limit".
            return Ok(KeyListing { keys: Vec::new(), revision: self.current_revision().await? });
        }
        let (start, range_end) = prefix_range(prefix);
        let start =
            if from.as_bytes() > start.as_slice() { from.as_bytes().to_vec() } else { start };
        let request = pb::RangeRequest {
            key: start,
            range_end,
            limit: i64::try_from(limit).unwrap_or(i64::MAX),
            keys_only: true,
            ..Default::default()
        };
        let response = self.range("list keys", request).await?;
        let keys = response.kvs.into_iter().map(|kv| utf8_key(kv.key)).collect::<Result<_, _>>()?;
        Ok(KeyListing { keys, revision: header_revision(response.header.as_ref()) })
    }

    async fn count(&self, prefix: &str) -> Result<(usize, Revision), StoreError> {
        let (key, range_end) = prefix_range(prefix);
        let request = pb::RangeRequest { key, range_end, count_only: true, ..Default::default() };
        let response = self.range("count", request).await?;
        Ok((
            usize::try_from(response.count).unwrap_or(0),
            header_revision(response.header.as_ref()),
        ))
    }

    async fn put(
        &self,
        key: &str,
        value: Vec<u8>,
        lease: Option<LeaseId>,
    ) -> Result<Revision, StoreError> {
        let lease = lease.unwrap_or(0);
        let request = pb::PutRequest { key: key.as_bytes().to_vec(), value, lease, prev_kv: false };
        let response = self
            .call("put", Retry::IfNotSent, |channel| {
                let request = request.clone();
                async move { KvClient::new(channel).put(request).await.map(tonic::Response::into_inner) }
            })
            .await
            .map_err(|e| lease_error(e, lease))?;
        Ok(header_revision(response.header.as_ref()))
    }

    async fn delete(&self, key: &str) -> Result<bool, StoreError> {
        let request = pb::DeleteRangeRequest { key: key.as_bytes().to_vec(), ..Default::default() };
        let response = self
            .call("delete", Retry::IfNotSent, |channel| {
                let request = request.clone();
                async move {
                    KvClient::new(channel)
                        .delete_range(request)
                        .await
                        .map(tonic::Response::into_inner)
                }
            })
            .await?;
        Ok(response.deleted > 0)
    }

    async fn txn(&self, txn: Txn) -> Result<TxnResult, StoreError> {
        txn.check_ranges()?;
        let first_lease = txn
            .success
            .iter()
            .chain(&txn.failure)
            .find_map(|op| match op {
                TxnOp::Put { lease: Some(l), .. } if *l != 0 => Some(*l),
                _ => None,
            })
            .unwrap_or(0);
        let request = pb::TxnRequest {
            compare: txn.compare.into_iter().map(to_pb_compare).collect(),
            success: txn.success.into_iter().map(to_pb_op).collect(),
            failure: txn.failure.into_iter().map(to_pb_op).collect(),
        };
        let response = self
            .call("txn", Retry::IfNotSent, |channel| {
                let request = request.clone();
                async move { KvClient::new(channel).txn(request).await.map(tonic::Response::into_inner) }
            })
            .await
            .map_err(|e| lease_error(e, first_lease))?;
        Ok(TxnResult {
            succeeded: response.succeeded,
            revision: header_revision(response.header.as_ref()),
        })
    }

    async fn watch(&self, prefix: &str, from: Revision) -> Result<WatchStream, StoreError> {
        let (key, range_end) = prefix_range(prefix);
        let create = pb::WatchRequest {
            request_union: Some(pb::watch_request::RequestUnion::CreateRequest(
                pb::WatchCreateRequest {
                    key,
                    range_end,
                    start_revision: from.max(0),
                    ..Default::default()
                },
            )),
        };
        // Returning only once etcd confirmed the watch guarantees that a write made after
        // `watch()` returns is seen, as with the embedded store.
        let (requests, mut inbound, first) = self
            .call("watch", Retry::Always, |channel| {
                let create = create.clone();
                async move {
                    let (requests, request_rx) = mpsc::channel(1);
                    requests
                        .send(create)
                        .await
                        .map_err(|_| tonic::Status::internal("watch request dropped"))?;
                    let mut inbound = WatchClient::new(channel)
                        .watch(ReceiverStream::new(request_rx))
                        .await?
                        .into_inner();
                    match inbound.message().await? {
                        Some(first) => Ok((requests, inbound, first)),
                        None => Err(tonic::Status::unavailable("etcd closed the watch stream")),
                    }
                }
            })
            .await?;

        let (tx, rx) = mpsc::channel(WATCH_BUFFER);
        tokio::spawn(async move {
            // The request half must stay open: etcd ends the watch when the client stops sending.
            let _requests = requests;
            let mut next = Some(first);
            loop {
                let response = match next.take() {
                    Some(response) => response,
                    None => {
                        let message = tokio::select! {
                            message = inbound.message() => message,
                            () = tx.closed() => return,
                        };
                        match message {
                            Ok(Some(response)) => response,
                            Ok(None) => {
                                let closed =
                                    StoreError::Unavailable("etcd closed the watch stream".into());
                                let _ = tx.send(Err(closed)).await;
                                return;
                            }
                            Err(status) => {
                                let _ = tx.send(Err(status_error("watch", &status))).await;
                                return;
                            }
                        }
                    }
                };
                if response.compact_revision != 0 {
                    let compact_revision = response.compact_revision;
                    let _ = tx.send(Err(StoreError::Compacted { compact_revision })).await;
                    return;
                }
                if response.canceled {
                    let reason = format!("etcd canceled the watch: {}", response.cancel_reason);
                    let _ = tx.send(Err(StoreError::Unavailable(reason))).await;
                    return;
                }
                if response.events.is_empty() {
                    continue;
                }
                let events =
                    response.events.into_iter().map(from_pb_event).collect::<Result<Vec<_>, _>>();
                let item = events.map(|events| WatchBatch { events });
                let failed = item.is_err();
                if tx.send(item).await.is_err() || failed {
                    return;
                }
            }
        });
        Ok(WatchStream::new(rx))
    }

    async fn compact(&self, revision: Revision) -> Result<(), StoreError> {
        let request = pb::CompactionRequest { revision, physical: false };
        // Compaction is idempotent, so it can always be sent again.
        let result = self
            .call("compact", Retry::Always, |channel| async move {
                KvClient::new(channel).compact(request).await.map(tonic::Response::into_inner)
            })
            .await;
        match result {
            // Compacting again at or below the floor is a no-op, as in the embedded store.
            Ok(_) | Err(StoreError::Compacted { .. }) => Ok(()),
            Err(e) => Err(e),
        }
    }

    async fn current_revision(&self) -> Result<Revision, StoreError> {
        let request =
            pb::RangeRequest { key: vec![0], limit: 1, count_only: true, ..Default::default() };
        let response = self.range("range", request).await?;
        Ok(header_revision(response.header.as_ref()))
    }

    async fn grant_lease(&self, ttl: Duration) -> Result<LeaseId, StoreError> {
        let mut seconds = i64::try_from(ttl.as_secs()).unwrap_or(i64::MAX);
        if ttl.subsec_nanos() > 0 {
            seconds = seconds.saturating_add(1);
        }
        let request = pb::LeaseGrantRequest { ttl: seconds.max(1), id: 0 };
        // A grant sent twice leaves one unused lease behind, which expires on its own.
        let response = self
            .call("lease grant", Retry::Always, |channel| async move {
                LeaseClient::new(channel)
                    .lease_grant(request)
                    .await
                    .map(tonic::Response::into_inner)
            })
            .await?;
        if !response.error.is_empty() {
            return Err(StoreError::Unavailable(format!(
                "etcd refused the lease: {}",
                response.error
            )));
        }
        Ok(response.id)
    }

    async fn keep_alive(&self, id: LeaseId) -> Result<Duration, StoreError> {
        // One short stream per renewal: callers renew every few seconds at most, and this
        // keeps no background state to clean up.
        let response = self
            .call("lease keep-alive", Retry::Always, |channel| async move {
                let (requests, request_rx) = mpsc::channel(1);
                requests
                    .send(pb::LeaseKeepAliveRequest { id })
                    .await
                    .map_err(|_| tonic::Status::internal("keep-alive request dropped"))?;
                let mut inbound = LeaseClient::new(channel)
                    .lease_keep_alive(ReceiverStream::new(request_rx))
                    .await?
                    .into_inner();
                let response = inbound.message().await?;
                drop(requests);
                response
                    .ok_or_else(|| tonic::Status::unavailable("etcd closed the keep-alive stream"))
            })
            .await
            .map_err(|e| lease_error(e, id))?;
        if response.ttl <= 0 {
            return Err(StoreError::LeaseNotFound(id));
        }
        Ok(Duration::from_secs(u64::try_from(response.ttl).unwrap_or(0)))
    }

    async fn revoke_lease(&self, id: LeaseId) -> Result<(), StoreError> {
        // Revoking twice is harmless: the second attempt reports the lease as not found.
        self.call("lease revoke", Retry::Always, |channel| async move {
            LeaseClient::new(channel)
                .lease_revoke(pb::LeaseRevokeRequest { id })
                .await
                .map(tonic::Response::into_inner)
        })
        .await
        .map_err(|e| lease_error(e, id))?;
        Ok(())
    }
}

// === Conversions ===

/// Failures of the connection rather than answers from etcd (whose own errors, even those
/// with code `Unavailable`, carry an `etcdserver:` or `mvcc:` message).
fn is_transport_failure(status: &tonic::Status) -> bool {
    let message = status.message();
    matches!(
        status.code(),
        tonic::Code::Unavailable | tonic::Code::Unknown | tonic::Code::Cancelled
    ) && !message.starts_with("etcdserver:")
        && !message.starts_with("mvcc:")
}

/// The status's message followed by its causes (a transport error's message alone is just
/// "tcp connect error"; the cause says "Connection refused").
fn describe(status: &tonic::Status) -> String {
    let mut chain = status.message().to_owned();
    let mut source = std::error::Error::source(status);
    while let Some(cause) = source {
        let text = cause.to_string();
        if !chain.contains(&text) {
            chain.push_str(": ");
            chain.push_str(&text);
        }
        source = cause.source();
    }
    chain
}

/// The connection could not be set up, so the request was certainly not sent.
fn is_connect_failure(status: &tonic::Status) -> bool {
    let chain = describe(status).to_ascii_lowercase();
    chain.contains("connect error")
        || chain.contains("connection refused")
        || chain.contains("error trying to connect")
}

/// etcd reports its domain errors as gRPC statuses with fixed messages (rpctypes in etcd's
/// source); the ones the trait names get their own variant.
fn status_error(what: &str, status: &tonic::Status) -> StoreError {
    let message = status.message();
    if message.contains("required revision has been compacted") {
        // The floor itself is not in the message; 0 says "unknown".
        return StoreError::Compacted { compact_revision: 0 };
    }
    if message.contains("lease not found") {
        return StoreError::LeaseNotFound(0);
    }
    if status.code() == tonic::Code::OutOfRange && message.contains("message length too large") {
        return StoreError::ResponseTooLarge(format!("etcd {what}: {message}"));
    }
    if status.code() == tonic::Code::InvalidArgument || message.contains("future revision") {
        return StoreError::InvalidRequest(format!("etcd refused the {what}: {message}"));
    }
    StoreError::Unavailable(format!(
        "etcd {what} failed ({:?}): {}",
        status.code(),
        describe(status)
    ))
}

/// Fills in the lease a `LeaseNotFound` from [`status_error`] is about.
fn lease_error(error: StoreError, lease: LeaseId) -> StoreError {
    match error {
        StoreError::LeaseNotFound(_) => StoreError::LeaseNotFound(lease),
        other => other,
    }
}

fn header_revision(header: Option<&pb::ResponseHeader>) -> Revision {
    header.map_or(0, |h| h.revision)
}

/// etcd's prefix convention: the range `[prefix, prefix with its last byte + 1)`; the
/// empty prefix is every key (`"\0"` to `"\0"`).
fn prefix_range(prefix: &str) -> (Vec<u8>, Vec<u8>) {
    let mut end = prefix.as_bytes().to_vec();
    while let Some(last) = end.pop() {
        if last < 0xff {
            end.push(last + 1);
            return (prefix.as_bytes().to_vec(), end);
        }
    }
    let key = if prefix.is_empty() { vec![0] } else { prefix.as_bytes().to_vec() };
    (key, vec![0])
}

fn utf8_key(key: Vec<u8>) -> Result<String, StoreError> {
    String::from_utf8(key)
        .map_err(|_| StoreError::Corrupt("etcd returned a key that is not UTF-8".into()))
}

fn from_pb_kv(kv: pb::KeyValue) -> Result<KeyValue, StoreError> {
    Ok(KeyValue {
        key: utf8_key(kv.key)?,
        value: kv.value.into(),
        create_revision: kv.create_revision,
        mod_revision: kv.mod_revision,
        version: kv.version,
        lease: kv.lease,
    })
}

fn from_pb_event(event: pb::Event) -> Result<WatchEvent, StoreError> {
    let kind = if event.r#type == pb::event::EventType::Delete as i32 {
        EventKind::Delete
    } else {
        EventKind::Put
    };
    let kv = event
        .kv
        .ok_or_else(|| StoreError::Corrupt("etcd sent a watch event without a key".into()))?;
    Ok(WatchEvent { kind, kv: from_pb_kv(kv)? })
}

fn to_pb_compare(compare: Compare) -> pb::Compare {
    use pb::compare::{CompareResult, CompareTarget as Target, TargetUnion};
    let result = match compare.op {
        CompareOp::Equal => CompareResult::Equal,
        CompareOp::NotEqual => CompareResult::NotEqual,
        CompareOp::Greater => CompareResult::Greater,
        CompareOp::Less => CompareResult::Less,
    };
    let (target, union) = match compare.target {
        CompareTarget::Version(v) => (Target::Version, TargetUnion::Version(v)),
        CompareTarget::CreateRevision(r) => (Target::Create, TargetUnion::CreateRevision(r)),
        CompareTarget::ModRevision(r) => (Target::Mod, TargetUnion::ModRevision(r)),
        CompareTarget::Value(v) => (Target::Value, TargetUnion::Value(v)),
    };
    pb::Compare {
        result: result as i32,
        target: target as i32,
        key: compare.key.into_bytes(),
        target_union: Some(union),
    }
}

fn to_pb_op(op: TxnOp) -> pb::RequestOp {
    use pb::request_op::Request;
    let request = match op {
        TxnOp::Put { key, value, lease } => Request::RequestPut(pb::PutRequest {
            key: key.into_bytes(),
            value,
            lease: lease.unwrap_or(0),
            prev_kv: false,
        }),
        TxnOp::Delete { key } => Request::RequestDeleteRange(pb::DeleteRangeRequest {
            key: key.into_bytes(),
            ..Default::default()
        }),
        TxnOp::DeletePrefix { prefix } => {
            let (key, range_end) = prefix_range(&prefix);
            Request::RequestDeleteRange(pb::DeleteRangeRequest { key, range_end, prev_kv: false })
        }
        TxnOp::DeleteRange { start, end } => Request::RequestDeleteRange(pb::DeleteRangeRequest {
            key: start.into_bytes(),
            range_end: end.into_bytes(),
            prev_kv: false,
        }),
    };
    pb::RequestOp { request: Some(request) }
}

#[cfg(test)]
mod tests {
    use super::prefix_range;

    #[test]
    fn prefix_range_increments_the_last_byte() {
        assert_eq!(prefix_range("a/"), (b"a/".to_vec(), b"a0".to_vec()));
        assert_eq!(prefix_range(""), (vec![0], vec![0]));
    }
}
