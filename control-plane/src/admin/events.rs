//! `ListEvents`: the newest entries of the failover-event audit log, then (`follow`) each
//! new one as it is stored.

use std::sync::Arc;

use tonic::{Request, Response, Status};

use switchyard_proto::admin::v1 as pb;

use super::service::{AdminError, AdminService};
use crate::audit;
use crate::events::AuditEvent;
use crate::store::{Revision, Store, StoreError};

/// What `ListEvents` answers: the events, one message each.
pub type EventStream = std::pin::Pin<
    Box<
        dyn futures_util::Stream<Item = Result<switchyard_proto::node::v1::FailoverEvent, Status>>
            + Send,
    >,
>;

/// Events `ListEvents` sends first when the request names no limit.
const DEFAULT_EVENTS_LIMIT: usize = 100;
/// Event ids an `events --follow` remembers to list a twice-stored event once.
const FOLLOW_SEEN: usize = 100_000;

/// How a replica that is shutting down ends an `events --follow` stream: `Unavailable`,
/// which the CLI reports as the control plane going away, with where to follow again.
fn replica_stopping() -> Status {
    Status::unavailable("this control plane is shutting down")
}

/// Whether the replica started shutting down (`false` once its sender is gone: it never will).
async fn stopping_now(stopping: &mut tokio::sync::watch::Receiver<bool>) -> bool {
    stopping.wait_for(|s| *s).await.is_ok()
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

pub(super) async fn list_events(
    admin: &AdminService,
    request: Request<pb::ListEventsRequest>,
) -> Result<Response<EventStream>, Status> {
    let request = request.into_inner();
    let limit = match request.limit {
        0 => DEFAULT_EVENTS_LIMIT,
        n => n as usize,
    };
    let key_id = request.key_id;
    let wanted = move |e: &AuditEvent| key_id.is_empty() || e.key_id == key_id;
    let (store, prefix) = (Arc::clone(&admin.store), admin.layout.audit_prefix());
    let mut stopping = admin.stopping.clone();
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
            if tx.send(Ok(event)).await.is_err() {
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
                            if tx.send(Ok(event)).await.is_err() {
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

#[cfg(test)]
mod tests {
    #![allow(clippy::unwrap_used)]
    use super::*;
    use crate::admin::service::testing;
    use crate::layout::Layout;

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
        let admin = testing::service(dir.path()).await;
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
}
