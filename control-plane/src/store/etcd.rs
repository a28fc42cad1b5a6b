//! The etcd store: the [`Store`] trait over etcd's v3 gRPC API, with the client generated
//! from our own copy of etcd's protos (`switchyard_proto::etcd`).
//!
//! Several endpoints are load-balanced by one tonic channel (`Channel::balance_list`): a
//! request goes to any endpoint that is connected, and endpoints that fail are retried in
//! the background. Every member of an etcd cluster serves linearizable reads and writes, so
//! which one answers does not matter.
//!
//! Knowing differences from the embedded store: etcd rounds lease TTLs up to whole seconds
//! and to its minimum; it rejects a transaction that touches one key twice; it keeps history
//! until someone calls [`Store::compact`].

use std::future::Future;
use std::time::Duration;

use async_trait::async_trait;
use switchyard_proto::etcd as pb;
use switchyard_proto::etcd::kv_client::KvClient;
use switchyard_proto::etcd::lease_client::LeaseClient;
use switchyard_proto::etcd::watch_client::WatchClient;
use tokio::sync::mpsc;
use tokio_stream::wrappers::ReceiverStream;
use tonic::transport::{Channel, Endpoint};

use super::{
    CompareOp, CompareTarget, EventKind, KeyValue, LeaseId, Listing, Revision, Store, StoreError,
    Txn, TxnOp, TxnResult, WatchBatch, WatchEvent, WatchStream,
};

const CONNECT_TIMEOUT: Duration = Duration::from_secs(3);
/// Bound on every unary call: etcd answers in milliseconds when it has a leader, and a
/// caller is better served by an error than by waiting out an election forever.
const REQUEST_TIMEOUT: Duration = Duration::from_secs(10);
/// Keys per page when listing, so a prefix with 100,000+ keys never needs one huge message.
const LIST_PAGE: i64 = 1000;
const WATCH_BUFFER: usize = 64;

#[derive(Clone)]
pub struct EtcdStore {
    kv: KvClient<Channel>,
    watch: WatchClient<Channel>,
    lease: LeaseClient<Channel>,
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
        let mut list = Vec::with_capacity(endpoints.len());
        for url in endpoints {
            let endpoint = Endpoint::from_shared(url.clone())
                .map_err(|e| StoreError::InvalidUrl { url: url.clone(), reason: e.to_string() })?
                .connect_timeout(CONNECT_TIMEOUT)
                .tcp_nodelay(true)
                // Notices a dead member (e.g. a partitioned host) on long-lived watch streams.
                .http2_keep_alive_interval(Duration::from_secs(10))
                .keep_alive_timeout(Duration::from_secs(5))
                .keep_alive_while_idle(true);
            list.push(endpoint);
        }
        let channel = Channel::balance_list(list.into_iter());
        let store = Self {
            kv: KvClient::new(channel.clone()),
            watch: WatchClient::new(channel.clone()),
            lease: LeaseClient::new(channel),
        };
        store.current_revision().await.map_err(|e| {
            StoreError::Unavailable(format!(
                "no etcd endpoint of {} answered: {e}",
                endpoints.join(",")
            ))
        })?;
        Ok(store)
    }

    async fn range_page(
        &self,
        key: Vec<u8>,
        range_end: Vec<u8>,
        revision: Revision,
    ) -> Result<pb::RangeResponse, StoreError> {
        let mut kv = self.kv.clone();
        let request =
            pb::RangeRequest { key, range_end, limit: LIST_PAGE, revision, ..Default::default() };
        call("range", kv.range(request)).await
    }
}

#[async_trait]
impl Store for EtcdStore {
    async fn get(&self, key: &str) -> Result<Option<KeyValue>, StoreError> {
        let mut kv = self.kv.clone();
        let request = pb::RangeRequest { key: key.as_bytes().to_vec(), ..Default::default() };
        let response = call("get", kv.range(request)).await?;
        response.kvs.into_iter().next().map(from_pb_kv).transpose()
    }

    async fn list(&self, prefix: &str) -> Result<Listing, StoreError> {
        let (mut key, range_end) = prefix_range(prefix);
        let mut kvs = Vec::new();
        // Later pages are read at the first page's revision, so the listing is one snapshot.
        let mut revision = 0;
        loop {
            let page = self.range_page(key, range_end.clone(), revision).await?;
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

    async fn put(
        &self,
        key: &str,
        value: Vec<u8>,
        lease: Option<LeaseId>,
    ) -> Result<Revision, StoreError> {
        let mut kv = self.kv.clone();
        let lease = lease.unwrap_or(0);
        let request = pb::PutRequest { key: key.as_bytes().to_vec(), value, lease, prev_kv: false };
        let response = call("put", kv.put(request)).await.map_err(|e| lease_error(e, lease))?;
        Ok(header_revision(response.header.as_ref()))
    }

    async fn delete(&self, key: &str) -> Result<bool, StoreError> {
        let mut kv = self.kv.clone();
        let request = pb::DeleteRangeRequest { key: key.as_bytes().to_vec(), ..Default::default() };
        Ok(call("delete", kv.delete_range(request)).await?.deleted > 0)
    }

    async fn txn(&self, txn: Txn) -> Result<TxnResult, StoreError> {
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
        let mut kv = self.kv.clone();
        let response =
            call("txn", kv.txn(request)).await.map_err(|e| lease_error(e, first_lease))?;
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
        let (requests, request_rx) = mpsc::channel(1);
        requests
            .send(create)
            .await
            .map_err(|_| StoreError::Unavailable("etcd watch request dropped".into()))?;
        let mut client = self.watch.clone();
        let mut inbound = call("watch", client.watch(ReceiverStream::new(request_rx))).await?;

        let (tx, rx) = mpsc::channel(WATCH_BUFFER);
        // Returning only once etcd confirmed the watch guarantees that a write made after
        // `watch()` returns is seen, as with the embedded store.
        let first = match tokio::time::timeout(REQUEST_TIMEOUT, inbound.message()).await {
            Err(_) => {
                return Err(StoreError::Unavailable(
                    "etcd did not confirm the watch in time".into(),
                ));
            }
            Ok(Err(status)) => return Err(status_error("watch", &status)),
            Ok(Ok(None)) => {
                return Err(StoreError::Unavailable("etcd closed the watch stream".into()));
            }
            Ok(Ok(Some(first))) => first,
        };
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
                                let _ = tx
                                    .send(Err(StoreError::Unavailable(
                                        "etcd closed the watch stream".into(),
                                    )))
                                    .await;
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
                let batch =
                    response.events.into_iter().map(from_pb_event).collect::<Result<Vec<_>, _>>();
                let item = batch.map(|events| WatchBatch { events });
                let failed = item.is_err();
                if tx.send(item).await.is_err() || failed {
                    return;
                }
            }
        });
        Ok(WatchStream::new(rx))
    }

    async fn compact(&self, revision: Revision) -> Result<(), StoreError> {
        let mut kv = self.kv.clone();
        match call("compact", kv.compact(pb::CompactionRequest { revision, physical: false })).await
        {
            Ok(_) => Ok(()),
            // Compacting again at or below the floor is a no-op, as in the embedded store.
            Err(StoreError::Compacted { .. }) => Ok(()),
            Err(e) => Err(e),
        }
    }

    async fn current_revision(&self) -> Result<Revision, StoreError> {
        let mut kv = self.kv.clone();
        let request =
            pb::RangeRequest { key: vec![0], limit: 1, count_only: true, ..Default::default() };
        let response = call("range", kv.range(request)).await?;
        Ok(header_revision(response.header.as_ref()))
    }

    async fn grant_lease(&self, ttl: Duration) -> Result<LeaseId, StoreError> {
        let mut seconds = i64::try_from(ttl.as_secs()).unwrap_or(i64::MAX);
        if ttl.subsec_nanos() > 0 {
            seconds = seconds.saturating_add(1);
        }
        let mut lease = self.lease.clone();
        let request = pb::LeaseGrantRequest { ttl: seconds.max(1), id: 0 };
        let response = call("lease grant", lease.lease_grant(request)).await?;
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
        let (requests, request_rx) = mpsc::channel(1);
        requests
            .send(pb::LeaseKeepAliveRequest { id })
            .await
            .map_err(|_| StoreError::Unavailable("etcd keep-alive request dropped".into()))?;
        let mut lease = self.lease.clone();
        let mut inbound =
            call("lease keep-alive", lease.lease_keep_alive(ReceiverStream::new(request_rx)))
                .await
                .map_err(|e| lease_error(e, id))?;
        let response = match tokio::time::timeout(REQUEST_TIMEOUT, inbound.message()).await {
            Err(_) => return Err(StoreError::Unavailable("etcd keep-alive timed out".into())),
            Ok(Err(status)) => {
                return Err(lease_error(status_error("lease keep-alive", &status), id));
            }
            Ok(Ok(None)) => {
                return Err(StoreError::Unavailable("etcd closed the keep-alive stream".into()));
            }
            Ok(Ok(Some(response))) => response,
        };
        drop(requests);
        if response.ttl <= 0 {
            return Err(StoreError::LeaseNotFound(id));
        }
        Ok(Duration::from_secs(u64::try_from(response.ttl).unwrap_or(0)))
    }

    async fn revoke_lease(&self, id: LeaseId) -> Result<(), StoreError> {
        let mut lease = self.lease.clone();
        call("lease revoke", lease.lease_revoke(pb::LeaseRevokeRequest { id }))
            .await
            .map_err(|e| lease_error(e, id))?;
        Ok(())
    }
}

// === Conversions ===

async fn call<T>(
    what: &str,
    request: impl Future<Output = Result<tonic::Response<T>, tonic::Status>>,
) -> Result<T, StoreError> {
    match tokio::time::timeout(REQUEST_TIMEOUT, request).await {
        Err(_) => {
            Err(StoreError::Unavailable(format!("etcd {what} timed out after {REQUEST_TIMEOUT:?}")))
        }
        Ok(Err(status)) => Err(status_error(what, &status)),
        Ok(Ok(response)) => Ok(response.into_inner()),
    }
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
    if status.code() == tonic::Code::InvalidArgument || message.contains("future revision") {
        return StoreError::InvalidRequest(format!("etcd refused the {what}: {message}"));
    }
    StoreError::Unavailable(format!("etcd {what} failed ({:?}): {message}", status.code()))
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

fn from_pb_kv(kv: pb::KeyValue) -> Result<KeyValue, StoreError> {
    let key = String::from_utf8(kv.key)
        .map_err(|_| StoreError::Corrupt("etcd returned a key that is not UTF-8".into()))?;
    Ok(KeyValue {
        key,
        value: kv.value,
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

fn to_pb_compare(compare: super::Compare) -> pb::Compare {
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
