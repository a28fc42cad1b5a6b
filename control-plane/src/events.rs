//! The events the control plane records and delivers, and their names: failover events
//! as the audit log stores them, breaker transitions as nodes report them, and the outbox
//! entry every webhook delivery is made from. The modules that write events (`audit`,
//! `reports`, `nodes`) and the ones that read them (`admin`, `webhooks`) all sit above
//! this one.

use std::sync::Arc;

use parking_lot::Mutex;
use serde::{Deserialize, Serialize};
use serde_json::json;
use sha2::{Digest, Sha256};

use switchyard_catalog::{Catalog, Webhook};
use switchyard_proto::admin::v1 as admin_pb;
use switchyard_proto::node::BreakerState;
use switchyard_proto::node::v1 as pb;
use switchyard_time::{now_ms, rfc3339_ms};

use crate::fanout::ConfigCache;
use crate::layout::{self, Layout};
use crate::store::{Compare, Revision, Store, StoreError, TxnOp};

// === event types ===

pub use switchyard_proto::node::event_types::{DEGRADED, EVENTS_LOST, FAILOVER, STREAM_CONTINUED};
pub const BREAKER_OPENED: &str = "breaker.opened";
pub const BREAKER_HALF_OPEN: &str = "breaker.half_open";
pub const BREAKER_CLOSED: &str = "breaker.closed";
/// A node stayed away longer than its grace period.
pub const NODE_DISCONNECTED: &str = "node.disconnected";

// === failover events ===

/// One entry of the audit log: a failover event as the node reported it, or with `lost` a
/// node's count of events it discarded (`events.lost`, the request fields then empty). Its
/// stored JSON is the node proto's message in the form proto/build.rs gives it, so a new
/// field of the event is added in the .proto alone. Unknown fields are tolerated, so a log
/// written by a newer release still reads.
pub type AuditEvent = pb::FailoverEvent;

/// The event as reported by `node_id`: an event that names no node gets the stream's.
pub fn reported(mut event: pb::FailoverEvent, node_id: &str) -> AuditEvent {
    if event.node_id.is_empty() {
        node_id.clone_into(&mut event.node_id);
    }
    // A node reports losses in messages of their own, never inside an event.
    event.lost = None;
    event
}

/// A node's loss report as an audit entry. Its time is the last loss's (the node's clock),
/// which a resend carries unchanged: the entry's key is the same each time.
pub fn lost_entry(report: pb::EventsLost, node_id: &str) -> AuditEvent {
    AuditEvent {
        id: report.id.clone(),
        at_unix_ms: report.last_unix_ms,
        node_id: node_id.to_owned(),
        lost: Some(Box::new(report)),
        ..AuditEvent::default()
    }
}

/// An entry as read back from the store: the id of its `lost` report, stored once as the
/// entry's own, filled in again.
pub fn restored(mut event: AuditEvent) -> AuditEvent {
    if let Some(lost) = event.lost.as_mut() {
        lost.id.clone_from(&event.id);
    }
    event
}

/// An attempt as webhook payloads show it: the reason only when there is one, `probe` only
/// when set; without the deployment and the local cap, which the payloads never carried.
#[derive(Serialize)]
struct WebhookAttempt<'a> {
    model: &'a String,
    status: &'a String,
    latency_ms: u64,
    #[serde(skip_serializing_if = "String::is_empty")]
    reason: &'a String,
    #[serde(skip_serializing_if = "std::ops::Not::not")]
    probe: bool,
    /// A drill must never read as an outage: the fault is named.
    #[serde(skip_serializing_if = "String::is_empty")]
    injected: &'a String,
    #[serde(skip_serializing_if = "is_zero")]
    retries: u32,
}

impl<'a> From<&'a pb::Attempt> for WebhookAttempt<'a> {
    fn from(a: &'a pb::Attempt) -> Self {
        Self {
            model: &a.model,
            status: &a.status,
            latency_ms: a.latency_ms,
            reason: &a.reason,
            probe: a.probe,
            injected: &a.injected,
            retries: a.retries,
        }
    }
}

fn is_zero(n: &u32) -> bool {
    *n == 0
}

// === breaker transitions ===

/// One node's breaker for one (provider, upstream model), as `switchyard breakers` shows it.
#[derive(Clone, Debug, PartialEq, Serialize, Deserialize)]
pub struct BreakerRecord {
    pub node_id: String,
    pub provider: String,
    pub upstream_model: String,
    /// `closed`, `open` or `half_open` ([`BreakerState`]).
    pub state: String,
    pub since_unix_ms: i64,
    pub failure_rate: f64,
    #[serde(default)]
    pub calls_in_window: u32,
    /// 0 unless open.
    #[serde(default)]
    pub next_probe_unix_ms: i64,
    #[serde(default)]
    pub cause: String,
    #[serde(default)]
    pub cooldown_ms: u64,
    /// The node's last probe of the breaker; 0 and empty when it never probed it.
    #[serde(default)]
    pub last_probe_unix_ms: i64,
    #[serde(default)]
    pub last_probe_outcome: String,
    #[serde(default)]
    pub last_probe_latency_ms: u64,
    /// The node run that reported it (`Hello.boot_id`); empty from nodes older than that
    /// field. A new run of the node drops the records of the old one.
    #[serde(default, skip_serializing_if = "String::is_empty")]
    pub boot_id: String,
}

impl BreakerRecord {
    pub fn from_transition(node_id: &str, boot_id: &str, t: pb::BreakerTransition) -> Self {
        Self {
            node_id: node_id.to_owned(),
            boot_id: boot_id.to_owned(),
            provider: t.provider,
            upstream_model: t.upstream_model,
            state: t.to,
            since_unix_ms: t.at_unix_ms,
            failure_rate: t.failure_rate,
            calls_in_window: t.calls_in_window,
            next_probe_unix_ms: t.next_probe_unix_ms,
            cause: t.cause,
            cooldown_ms: t.cooldown_ms,
            last_probe_unix_ms: t.last_probe_unix_ms,
            last_probe_outcome: t.last_probe_outcome,
            last_probe_latency_ms: t.last_probe_latency_ms,
        }
    }
}

impl From<BreakerRecord> for admin_pb::Breaker {
    /// The record as `ListBreakers` answers it.
    fn from(b: BreakerRecord) -> Self {
        Self {
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
        }
    }
}

// === the outbox ===

/// One event waiting for delivery, as stored in the outbox (JSON).
#[derive(Clone, Debug, PartialEq, Serialize, Deserialize)]
pub struct OutboxEntry {
    /// The event id: the `webhook-id` of its deliveries, stable across retries.
    pub id: String,
    #[serde(rename = "type")]
    pub event_type: String,
    /// When the event happened (the node's clock for failovers and breakers).
    pub at_unix_ms: i64,
    /// When the control plane stored it; the dead-letter age counts from here.
    pub enqueued_unix_ms: i64,
    /// The API key of a failover event (empty for breaker and node events).
    #[serde(default)]
    pub key_id: String,
    /// The payload's `data`.
    pub data: serde_json::Value,
    /// A redelivery: only these subscriptions get it.
    #[serde(default, skip_serializing_if = "Vec::is_empty")]
    pub only: Vec<String>,
}

impl OutboxEntry {
    /// The webhook event of an audit entry: a failover (or degraded answer), or an
    /// `events.lost` count.
    pub fn from_audit(event: &AuditEvent, now_ms: i64) -> Self {
        match &event.lost {
            Some(lost) => Self::lost(event, lost, now_ms),
            None => Self::failover(event, now_ms),
        }
    }

    fn lost(event: &AuditEvent, lost: &pb::EventsLost, now_ms: i64) -> Self {
        Self {
            id: event.id.clone(),
            event_type: EVENTS_LOST.to_owned(),
            at_unix_ms: event.at_unix_ms,
            enqueued_unix_ms: now_ms,
            key_id: String::new(),
            data: json!({
                "event_id": event.id,
                "node_id": event.node_id,
                "count": lost.count,
                "reason": lost.reason,
                "events": lost.events,
                "first_unix_ms": lost.first_unix_ms,
                "last_unix_ms": lost.last_unix_ms,
                "at_unix_ms": event.at_unix_ms,
            }),
            only: vec![],
        }
    }

    pub fn failover(event: &AuditEvent, now_ms: i64) -> Self {
        let attempts: Vec<WebhookAttempt<'_>> =
            event.attempts.iter().map(WebhookAttempt::from).collect();
        let mut data = json!({
            "event_id": event.id,
            "key_id": event.key_id,
            "node_id": event.node_id,
            "requested_model": event.requested_model,
            "served_model": event.served_model,
            "failover": {"occurred": true, "attempts": attempts},
            "stream": event.stream,
            "status": event.status,
            "at_unix_ms": event.at_unix_ms,
        });
        if !event.degraded.is_empty() {
            data["degraded"] = json!({"reason": event.degraded});
        }
        if !event.continued.is_empty() {
            data["continued"] = json!(event.continued);
        }
        // Events from nodes older than the field came through Chat Completions.
        data["surface"] = json!(if event.surface.is_empty() { "chat" } else { &event.surface });
        // The id the client got back: a receiver finds the request in the client's logs.
        if !event.request_id.is_empty() {
            data["request_id"] = json!(event.request_id);
        }
        Self {
            id: event.id.clone(),
            event_type: event.event_type().to_owned(),
            at_unix_ms: event.at_unix_ms,
            enqueued_unix_ms: now_ms,
            key_id: event.key_id.clone(),
            data,
            only: vec![],
        }
    }

    /// `None` for a state this release does not know.
    pub fn breaker(record: &BreakerRecord, from: &str, now_ms: i64) -> Option<Self> {
        let event_type = match BreakerState::parse(&record.state)? {
            BreakerState::Open => BREAKER_OPENED,
            BreakerState::HalfOpen => BREAKER_HALF_OPEN,
            BreakerState::Closed => BREAKER_CLOSED,
        };
        // Deterministic, so that a transition written twice is one event to receivers.
        let digest = Sha256::digest(
            format!(
                "{}\n{}\n{}\n{}\n{}",
                record.node_id,
                record.provider,
                record.upstream_model,
                record.state,
                record.since_unix_ms
            )
            .as_bytes(),
        );
        let id = digest_id("brk", &digest);
        Some(Self {
            data: json!({
                "event_id": id,
                "node_id": record.node_id,
                "provider": record.provider,
                "upstream_model": record.upstream_model,
                "from": from,
                "to": record.state,
                "cause": record.cause,
                "failure_rate": record.failure_rate,
                "calls_in_window": record.calls_in_window,
                "next_probe_unix_ms": record.next_probe_unix_ms,
                "cooldown_ms": record.cooldown_ms,
                "at_unix_ms": record.since_unix_ms,
            }),
            id,
            event_type: event_type.to_owned(),
            at_unix_ms: record.since_unix_ms,
            enqueued_unix_ms: now_ms,
            key_id: String::new(),
            only: vec![],
        })
    }

    pub fn node_disconnected(node_id: &str, disconnected_unix_ms: i64, grace_ms: u64) -> Self {
        let digest = Sha256::digest(format!("{node_id}\n{disconnected_unix_ms}").as_bytes());
        let id = digest_id("nod", &digest);
        let now = now_ms();
        Self {
            data: json!({
                "event_id": id,
                "node_id": node_id,
                "disconnected_unix_ms": disconnected_unix_ms,
                "grace_ms": grace_ms,
            }),
            id,
            event_type: NODE_DISCONNECTED.to_owned(),
            at_unix_ms: disconnected_unix_ms,
            enqueued_unix_ms: now,
            key_id: String::new(),
            only: vec![],
        }
    }

    /// Whether `webhook` gets this entry.
    pub fn is_for(&self, webhook: &Webhook) -> bool {
        if !self.only.is_empty() {
            return webhook.enabled && self.only.contains(&webhook.name);
        }
        webhook.wants(&self.event_type, &self.key_id)
    }

    /// The write that queues this entry.
    pub fn put(&self, layout: &Layout) -> Result<TxnOp, StoreError> {
        let value = serde_json::to_vec(self)
            .map_err(|e| StoreError::InvalidRequest(format!("cannot encode outbox entry: {e}")))?;
        Ok(TxnOp::Put { key: layout.outbox(self.at_unix_ms, &self.id), value, lease: None })
    }

    /// A Standard Webhooks payload: `{type, timestamp, data}`.
    pub fn payload(&self) -> serde_json::Value {
        json!({"type": self.event_type, "timestamp": rfc3339_ms(self.at_unix_ms), "data": self.data})
    }
}

// === who wants what ===

/// Which events some subscription wants, so that events nobody subscribed to cost no
/// outbox write. Read from this replica's config cache (the catalog parsed once per
/// revision), which may lag the store by a moment: so every write that decides on it is
/// guarded ([`Interest::guard`]) by the catalog's revision it was decided at, and a write
/// whose guard fails (a subscription changed meanwhile) is decided again on the catalog
/// read from the store ([`Interest::refresh`]). An event stored after a subscription was
/// added is therefore always queued for it (docs/webhooks.md, "A new subscription").
pub struct Interest {
    cache: Arc<ConfigCache>,
    memo: Mutex<Memo>,
}

struct Memo {
    /// The config cache's revision of the catalog that `webhooks` was last taken from.
    cache_revision: Revision,
    /// The catalog's revision in the store that `webhooks` holds: the cache's, or a newer
    /// one read by [`Interest::refresh`] while the cache lags.
    revision: Revision,
    webhooks: Arc<Vec<Webhook>>,
}

/// A catalog's subscriptions as stored (`None`: no catalog); an unreadable one has none
/// (its apply was refused, so only a store edited by hand holds one).
fn parse_webhooks(bytes: Option<&[u8]>) -> Vec<Webhook> {
    bytes
        .and_then(|b| serde_json::from_slice::<Catalog>(b).ok())
        .map(|c| c.webhooks)
        .unwrap_or_default()
}

impl Interest {
    pub fn new(cache: Arc<ConfigCache>) -> Self {
        let memo = Memo { cache_revision: -1, revision: -1, webhooks: Arc::new(Vec::new()) };
        Self { cache, memo: Mutex::new(memo) }
    }

    /// The subscriptions, and the catalog revision they are of (for [`Interest::guard`]).
    pub fn current(&self) -> (Revision, Arc<Vec<Webhook>>) {
        let (bytes, revision) = match self.cache.resource(layout::CATALOG) {
            Some((bytes, revision)) => (Some(bytes), revision),
            None => (None, 0),
        };
        let mut memo = self.memo.lock();
        if memo.cache_revision != revision {
            let webhooks = parse_webhooks(bytes.as_deref());
            *memo = Memo { cache_revision: revision, revision, webhooks: Arc::new(webhooks) };
        }
        (memo.revision, Arc::clone(&memo.webhooks))
    }

    pub fn webhooks(&self) -> Arc<Vec<Webhook>> {
        self.current().1
    }

    pub fn wants(&self, entry: &OutboxEntry) -> bool {
        self.webhooks().iter().any(|w| entry.is_for(w))
    }

    /// The compare that holds a write to the subscriptions of catalog `revision`: it fails
    /// if the catalog changed since.
    pub fn guard(layout: &Layout, revision: Revision) -> Compare {
        Compare::mod_revision(layout.catalog(), revision)
    }

    /// A guarded write failed: takes the subscriptions from the store's catalog until the
    /// config cache moves on. Returns whether they are of another revision than before (if
    /// not, the guard was not what failed).
    pub async fn refresh(&self, store: &dyn Store, layout: &Layout) -> Result<bool, StoreError> {
        let kv = store.get(&layout.catalog()).await?;
        let revision = kv.as_ref().map_or(0, |kv| kv.mod_revision);
        let webhooks = parse_webhooks(kv.as_ref().map(|kv| &kv.value[..]));
        let mut memo = self.memo.lock();
        let changed = memo.revision != revision;
        memo.revision = revision;
        memo.webhooks = Arc::new(webhooks);
        Ok(changed)
    }
}

// === batches ===

/// A stored value holding one entry (a JSON object, as written before batched storage and
/// still by single writes) or a batch of them (a JSON array).
pub fn decode_entries<T: serde::de::DeserializeOwned>(value: &[u8]) -> serde_json::Result<Vec<T>> {
    if value.iter().find(|b| !b.is_ascii_whitespace()) == Some(&b'[') {
        serde_json::from_slice(value)
    } else {
        serde_json::from_slice(value).map(|one| vec![one])
    }
}

/// A JSON array of already encoded entries.
pub fn encode_batch(entries: &[Vec<u8>]) -> Vec<u8> {
    let mut out = Vec::with_capacity(2 + entries.iter().map(|e| e.len() + 1).sum::<usize>());
    out.push(b'[');
    for (i, entry) in entries.iter().enumerate() {
        if i > 0 {
            out.push(b',');
        }
        out.extend_from_slice(entry);
    }
    out.push(b']');
    out
}

/// A batch's id, derived from the ids of its events: a batch stored again whole (a node
/// resending what was stored but not acked) is written under the same key.
pub fn batch_id<'a>(event_ids: impl Iterator<Item = &'a str>) -> String {
    let mut ids: Vec<&str> = event_ids.collect();
    ids.sort_unstable();
    let mut hasher = Sha256::new();
    for id in ids {
        hasher.update(id.as_bytes());
        hasher.update(b"\n");
    }
    digest_id("", &hasher.finalize()).trim_start_matches('_').to_owned()
}

/// `<prefix>_<hex of the digest's first 12 bytes>`: an id derived from what identifies an
/// event, so that the same event written twice is one event to receivers.
pub fn digest_id(prefix: &str, digest: &[u8]) -> String {
    let id = &digest[..digest.len().min(12)];
    format!("{prefix}_{}", hex::encode(id))
}

#[cfg(test)]
mod tests {
    #![allow(clippy::unwrap_used)]
    use super::*;

    #[test]
    fn events_round_trip_through_the_stored_json() {
        let pb_event = pb::FailoverEvent {
            id: "ev1".into(),
            at_unix_ms: 5,
            node_id: String::new(),
            key_id: "key_1".into(),
            requested_model: "a".into(),
            served_model: "b".into(),
            attempts: vec![pb::Attempt {
                model: "a".into(),
                status: "failed".into(),
                reason: "timeout".into(),
                latency_ms: 30_011,
                probe: false,
                injected: "drill-1".into(),
                retries: 2,
                deployment: "p/up".into(),
                local_limit: true,
            }],
            stream: true,
            status: 200,
            degraded: String::new(),
            request_id: "req-1".into(),
            lost: None,
            continued: vec![],
            surface: String::new(),
        };
        let event = reported(pb_event.clone(), "n1");
        assert_eq!(event.request_id, "req-1");
        assert_eq!(event.node_id, "n1");
        let back: AuditEvent =
            serde_json::from_slice(&serde_json::to_vec(&event).unwrap()).unwrap();
        assert_eq!(restored(back), pb::FailoverEvent { node_id: "n1".into(), ..pb_event });
    }

    #[test]
    fn an_injected_attempt_names_its_fault_and_a_real_one_says_nothing() {
        let attempt = |model: &str, injected: &str| pb::Attempt {
            model: model.into(),
            status: "failed".into(),
            reason: "server_error".into(),
            latency_ms: 3,
            probe: false,
            injected: injected.into(),
            retries: u32::from(!injected.is_empty()),
            deployment: String::new(),
            local_limit: false,
        };
        let event = AuditEvent {
            id: "ev1".into(),
            at_unix_ms: 5,
            node_id: "n1".into(),
            key_id: "key_1".into(),
            requested_model: "a".into(),
            served_model: "b".into(),
            attempts: vec![attempt("a", "drill-1"), attempt("b", "")],
            stream: false,
            status: 200,
            degraded: String::new(),
            request_id: String::new(),
            lost: None,
            continued: vec![],
            surface: String::new(),
        };
        let stored = serde_json::to_value(&event).unwrap();
        assert_eq!(stored["attempts"][0]["injected"], "drill-1");
        assert!(stored["attempts"][1].get("injected").is_none(), "{stored}");
        assert_eq!(stored["attempts"][0]["retries"], 1);
        assert!(stored["attempts"][1].get("retries").is_none(), "{stored}");
        // A record written before the field existed still reads.
        let mut old = stored.clone();
        old["attempts"][0].as_object_mut().unwrap().remove("injected");
        let read: AuditEvent = serde_json::from_value(old).unwrap();
        assert_eq!(read.attempts[0].injected, "");

        let data = OutboxEntry::failover(&event, 6).payload()["data"].clone();
        let attempts = &data["failover"]["attempts"];
        assert_eq!(attempts[0]["injected"], "drill-1");
        assert!(attempts[1].get("injected").is_none(), "{data}");
        assert_eq!(attempts[0]["retries"], 1);
        assert!(attempts[1].get("retries").is_none(), "{data}");
    }

    #[test]
    fn the_request_id_is_stored_and_delivered_when_the_node_sent_one() {
        let mut event = reported(
            pb::FailoverEvent { id: "ev1".into(), key_id: "k".into(), ..Default::default() },
            "n1",
        );
        assert!(serde_json::to_value(&event).unwrap().get("request_id").is_none());
        assert!(OutboxEntry::failover(&event, 1).data.get("request_id").is_none());
        event.request_id = "req-7".into();
        let stored = serde_json::to_value(&event).unwrap();
        assert_eq!(stored["request_id"], "req-7");
        assert_eq!(OutboxEntry::failover(&event, 1).data["request_id"], "req-7");
        let read: AuditEvent = serde_json::from_value(stored).unwrap();
        assert_eq!(read.request_id, "req-7");
    }

    #[test]
    fn a_degraded_answer_is_its_own_event_type_and_names_its_reason() {
        let mut event = reported(
            pb::FailoverEvent { id: "ev1".into(), key_id: "k".into(), ..Default::default() },
            "n1",
        );
        assert_eq!(OutboxEntry::failover(&event, 1).event_type, FAILOVER);
        assert!(OutboxEntry::failover(&event, 1).data.get("degraded").is_none());
        assert!(serde_json::to_value(&event).unwrap().get("degraded").is_none());
        event.degraded = "all_breakers_open".into();
        let entry = OutboxEntry::failover(&event, 1);
        assert_eq!(entry.event_type, DEGRADED);
        assert_eq!(entry.data["degraded"]["reason"], "all_breakers_open");
        assert_eq!(serde_json::to_value(&event).unwrap()["degraded"], "all_breakers_open");
    }

    #[test]
    fn a_loss_report_is_an_events_lost_entry_and_webhook_event() {
        let report = pb::EventsLost {
            id: "lost_b_1".into(),
            count: 15,
            reason: "spool_unwritable".into(),
            events: "failover".into(),
            first_unix_ms: 10,
            last_unix_ms: 20,
        };
        let event = lost_entry(report.clone(), "n1");
        assert_eq!((event.event_type(), event.at_unix_ms), (EVENTS_LOST, 20));
        let stored: AuditEvent =
            serde_json::from_slice(&serde_json::to_vec(&event).unwrap()).unwrap();
        assert_eq!(restored(stored.clone()).lost, Some(Box::new(report)));
        let entry = OutboxEntry::from_audit(&stored, 30);
        assert_eq!(entry.event_type, EVENTS_LOST);
        assert_eq!(entry.data["count"], 15);
        assert_eq!(entry.data["node_id"], "n1");
        assert_eq!(entry.data["reason"], "spool_unwritable");
    }

    #[test]
    fn payloads_carry_rfc3339_timestamps() {
        let entry = OutboxEntry::node_disconnected("n1", 1_796_219_557_123, 30_000);
        assert_eq!(entry.event_type, NODE_DISCONNECTED);
        assert_eq!(entry.payload()["timestamp"], "2026-12-02T13:52:37.123Z");
        assert!(entry.id.starts_with("nod_") && entry.id.len() == 4 + 24, "{}", entry.id);
    }

    #[test]
    fn every_event_type_is_one_the_catalog_accepts() {
        for t in [
            FAILOVER,
            DEGRADED,
            BREAKER_OPENED,
            BREAKER_HALF_OPEN,
            BREAKER_CLOSED,
            NODE_DISCONNECTED,
            EVENTS_LOST,
        ] {
            assert!(switchyard_catalog::catalog::WEBHOOK_EVENTS.contains(&t), "{t}");
        }
    }
    /// Audit records as this release and the ones before it write them: every field set, an
    /// `events.lost` entry, and one from before the optional fields existed.
    const STORED_FULL: &str = r#"{"id":"ev1","at_unix_ms":1796219557000,"node_id":"n1","key_id":"key_1","requested_model":"a","served_model":"b","attempts":[{"model":"a","status":"failed","reason":"timeout","latency_ms":30011,"probe":true,"injected":"drill-1","retries":2,"deployment":"p/up","local_limit":true},{"model":"b","status":"served","reason":"","latency_ms":734,"probe":false}],"stream":true,"status":200,"degraded":"all_models_failed","request_id":"req-1","continued":[{"model":"b","reason":"upstream_stalled","at_char":120,"outcome":"served"}],"surface":"messages"}"#;
    const STORED_LOST: &str = r#"{"id":"lost_b_1","at_unix_ms":20,"node_id":"n1","key_id":"","requested_model":"","served_model":"","attempts":[],"stream":false,"status":0,"lost":{"count":15,"reason":"spool_unwritable","events":"failover","first_unix_ms":10,"last_unix_ms":20}}"#;
    const STORED_OLD: &str = r#"{"id":"ev0","at_unix_ms":3,"node_id":"n0","key_id":"k","requested_model":"a","attempts":[{"model":"a","status":"failed"}]}"#;

    #[test]
    fn stored_records_read_and_write_back_byte_for_byte() {
        for stored in [STORED_FULL, STORED_LOST] {
            let event: AuditEvent = serde_json::from_str(stored).unwrap();
            assert_eq!(serde_json::to_string(&event).unwrap(), stored);
        }
        let old: AuditEvent = serde_json::from_str(STORED_OLD).unwrap();
        assert_eq!((old.served_model.as_str(), old.status, old.stream), ("", 0, false));
        assert_eq!((old.attempts[0].reason.as_str(), old.attempts[0].latency_ms), ("", 0));
        assert_eq!(
            serde_json::to_string(&old).unwrap(),
            r#"{"id":"ev0","at_unix_ms":3,"node_id":"n0","key_id":"k","requested_model":"a","served_model":"","attempts":[{"model":"a","status":"failed","reason":"","latency_ms":0,"probe":false}],"stream":false,"status":0}"#
        );
        // What a record must hold: a request's id and model; a loss entry's whole count.
        let without = |field: &str| STORED_FULL.replace(&format!(r#""{field}":"#), r#""x":"#);
        for field in ["id", "at_unix_ms", "node_id", "key_id", "requested_model"] {
            assert!(serde_json::from_str::<AuditEvent>(&without(field)).is_err(), "{field}");
        }
        let lost = STORED_LOST.replace(r#""count":"#, r#""x":"#);
        assert!(serde_json::from_str::<AuditEvent>(&lost).is_err());
    }

    #[test]
    fn webhook_payloads_keep_their_form() {
        let full: AuditEvent = serde_json::from_str(STORED_FULL).unwrap();
        assert_eq!(
            serde_json::to_string(&OutboxEntry::from_audit(&full, 6).payload()).unwrap(),
            r#"{"data":{"at_unix_ms":1796219557000,"continued":[{"at_char":120,"model":"b","outcome":"served","reason":"upstream_stalled"}],"degraded":{"reason":"all_models_failed"},"event_id":"ev1","failover":{"attempts":[{"injected":"drill-1","latency_ms":30011,"model":"a","probe":true,"reason":"timeout","retries":2,"status":"failed"},{"latency_ms":734,"model":"b","status":"served"}],"occurred":true},"key_id":"key_1","node_id":"n1","request_id":"req-1","requested_model":"a","served_model":"b","status":200,"stream":true,"surface":"messages"},"timestamp":"2026-12-02T13:52:37.000Z","type":"api:degraded_response"}"#
        );
        let lost: AuditEvent = serde_json::from_str(STORED_LOST).unwrap();
        assert_eq!(
            serde_json::to_string(&OutboxEntry::from_audit(&lost, 6)).unwrap(),
            r#"{"id":"lost_b_1","type":"events.lost","at_unix_ms":20,"enqueued_unix_ms":6,"key_id":"","data":{"at_unix_ms":20,"count":15,"event_id":"lost_b_1","events":"failover","first_unix_ms":10,"last_unix_ms":20,"node_id":"n1","reason":"spool_unwritable"}}"#
        );
    }
}
