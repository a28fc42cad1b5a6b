//! Webhooks: signed, durable, at-least-once delivery of failover, breaker and node events
//! to the catalog's `webhooks` subscriptions, from the elected leader among the replicas.
//!
//! ## Store layout (below the prefix)
//! - `webhooks/outbox/<at_unix_ms, 13 digits>-<event id>`: one [`OutboxEntry`] per event,
//!   not per subscription. It is written in the same transaction as the event's audit
//!   entry (failovers, before the node's batch is acked) or breaker record (transitions),
//!   so an event is stored for delivery exactly when it is stored at all. One entry per
//!   event keeps the ack path's writes independent of the number of subscriptions, and the
//!   fan-out happens at delivery against the subscriptions as they are then: a
//!   subscription added later starts with the events after it, one removed or disabled
//!   stops holding events back, a changed filter applies to what is not yet delivered.
//!   A resent event rewrites its entry in place (same key, same create revision), so it is
//!   not queued twice while it waits.
//! - `webhooks/state/<subscription>`: [`SubscriptionState`], the delivery state the leader
//!   keeps per subscription: a cursor (every outbox entry created at or below this store
//!   revision is done for the subscription), the events being retried with their attempts
//!   and last status, the subscription's backoff. Written at most every
//!   [`deliver::PERSIST_INTERVAL`] per subscription, fenced on leadership, so a new leader
//!   resumes where the old one left off (re-sending at most what the old one delivered
//!   since its last write: receivers deduplicate by `webhook-id`).
//! - `webhooks/dead/<subscription>/<event id>`: [`DeadLetter`]s, events given up on.
//!
//! Outbox entries are deleted by the leader once every subscription's cursor has passed
//! them, so the outbox holds only what some subscription still owes.
//!
//! ## Delivery
//! See [`deliver`]: per-subscription workers, bounded concurrency, request timeout,
//! exponential backoff with full jitter, dead letters after `max_age`.

use std::sync::{Arc, Mutex};

use base64::Engine as _;
use hmac::{Hmac, Mac};
use serde::{Deserialize, Serialize};
use serde_json::json;
use sha2::{Digest, Sha256};

use switchyard_catalog::{Catalog, Webhook};
use switchyard_time::{now_ms, rfc3339_ms};

use crate::audit::AuditEvent;
use crate::fanout::ConfigCache;
use crate::layout::{self, Layout};
use crate::reports::BreakerRecord;
use crate::store::{Revision, StoreError, TxnOp};

pub mod client;
pub mod deliver;

pub use deliver::{DeliveryOptions, run};

pub const FAILOVER: &str = "api:model_failover";
pub const NODE_DISCONNECTED: &str = "node.disconnected";

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
    pub fn failover(event: &AuditEvent, now_ms: i64) -> Self {
        let attempts: Vec<_> = event
            .attempts
            .iter()
            .map(|a| {
                let mut v =
                    json!({"model": a.model, "status": a.status, "latency_ms": a.latency_ms});
                if !a.reason.is_empty() {
                    v["reason"] = json!(a.reason);
                }
                if a.probe {
                    v["probe"] = json!(true);
                }
                v
            })
            .collect();
        Self {
            id: event.id.clone(),
            event_type: FAILOVER.to_owned(),
            at_unix_ms: event.at_unix_ms,
            enqueued_unix_ms: now_ms,
            key_id: event.key_id.clone(),
            data: json!({
                "event_id": event.id,
                "key_id": event.key_id,
                "node_id": event.node_id,
                "requested_model": event.requested_model,
                "served_model": event.served_model,
                "failover": {"occurred": true, "attempts": attempts},
                "stream": event.stream,
                "status": event.status,
                "at_unix_ms": event.at_unix_ms,
            }),
            only: vec![],
        }
    }

    /// `None` for a state this release does not know.
    pub fn breaker(record: &BreakerRecord, from: &str, now_ms: i64) -> Option<Self> {
        let event_type = match record.state.as_str() {
            "open" => "breaker.opened",
            "half_open" => "breaker.half_open",
            "closed" => "breaker.closed",
            _ => return None,
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
        let id = format!("brk_{}", hex(&digest[..12]));
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
        let id = format!("nod_{}", hex(&digest[..12]));
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

/// Per-subscription delivery state, stored under `webhooks/state/<name>`.
#[derive(Clone, Debug, Default, PartialEq, Serialize, Deserialize)]
pub struct SubscriptionState {
    /// Every outbox entry created at or below this revision is done (delivered, dead, or
    /// not for this subscription).
    pub cursor: Revision,
    #[serde(default)]
    pub delivered: u64,
    #[serde(default)]
    pub dead: u64,
    /// Failed attempts in a row; 0 when the endpoint last answered 2xx.
    #[serde(default)]
    pub consecutive_failures: u32,
    /// Nothing is sent before this (backoff after a failure, or the endpoint's Retry-After).
    #[serde(default)]
    pub next_attempt_unix_ms: i64,
    #[serde(default)]
    pub last_status: u16,
    #[serde(default)]
    pub last_error: String,
    #[serde(default)]
    pub last_attempt_unix_ms: i64,
    #[serde(default)]
    pub last_success_unix_ms: i64,
    /// Events that failed at least once and are still owed.
    #[serde(default)]
    pub pending: Vec<PendingDelivery>,
}

#[derive(Clone, Debug, PartialEq, Serialize, Deserialize)]
pub struct PendingDelivery {
    pub event_id: String,
    /// The outbox entry's create revision and key.
    pub revision: Revision,
    #[serde(default)]
    pub key: String,
    pub attempts: u32,
    #[serde(default)]
    pub last_status: u16,
    #[serde(default)]
    pub last_error: String,
}

/// An event given up on, under `webhooks/dead/<name>/<event id>`.
#[derive(Clone, Debug, PartialEq, Serialize, Deserialize)]
pub struct DeadLetter {
    pub entry: OutboxEntry,
    pub attempts: u32,
    #[serde(default)]
    pub last_status: u16,
    #[serde(default)]
    pub last_error: String,
    pub dead_unix_ms: i64,
}

/// Which events some subscription wants, from this replica's config cache, so that events
/// nobody subscribed to cost no outbox write. The catalog is parsed once per revision.
pub struct Interest {
    cache: Arc<ConfigCache>,
    memo: Mutex<(Revision, Arc<Vec<Webhook>>)>,
}

impl Interest {
    pub fn new(cache: Arc<ConfigCache>) -> Self {
        Self { cache, memo: Mutex::new((-1, Arc::new(Vec::new()))) }
    }

    pub fn webhooks(&self) -> Arc<Vec<Webhook>> {
        let (bytes, revision) = match self.cache.resource(layout::CATALOG) {
            Some((bytes, revision)) => (Some(bytes), revision),
            None => (None, 0),
        };
        let mut memo = self.memo.lock().unwrap_or_else(|e| e.into_inner());
        if memo.0 != revision {
            let webhooks = bytes
                .and_then(|b| serde_json::from_slice::<Catalog>(&b).ok())
                .map(|c| c.webhooks)
                .unwrap_or_default();
            *memo = (revision, Arc::new(webhooks));
        }
        Arc::clone(&memo.1)
    }

    pub fn wants(&self, entry: &OutboxEntry) -> bool {
        self.webhooks().iter().any(|w| entry.is_for(w))
    }
}

// === signing ===

#[derive(Debug, thiserror::Error)]
pub enum SignError {
    // The secret is never echoed.
    #[error("the secret starts with whsec_ but the rest is not base64")]
    BadWhsec,
    #[error("the secret is empty")]
    Empty,
}

/// The HMAC key of a secret: a `whsec_<base64>` secret (the Standard Webhooks form, which
/// the official verifier libraries take) is base64-decoded; any other is used as its bytes.
pub fn signing_key(secret: &str) -> Result<Vec<u8>, SignError> {
    let key = match secret.strip_prefix("whsec_") {
        Some(b64) => {
            // The libraries accept unpadded base64 too.
            let engine = base64::engine::GeneralPurpose::new(
                &base64::alphabet::STANDARD,
                base64::engine::GeneralPurposeConfig::new()
                    .with_decode_padding_mode(base64::engine::DecodePaddingMode::Indifferent),
            );
            engine.decode(b64.trim()).map_err(|_| SignError::BadWhsec)?
        }
        None => secret.as_bytes().to_vec(),
    };
    if key.is_empty() { Err(SignError::Empty) } else { Ok(key) }
}

/// `v1,<base64 HMAC-SHA256 of "{id}.{timestamp}.{body}">`.
pub fn sign(key: &[u8], id: &str, timestamp_secs: i64, body: &[u8]) -> String {
    // HMAC takes keys of any length; the error case cannot happen.
    let Ok(mut mac) = Hmac::<Sha256>::new_from_slice(key) else {
        return String::new();
    };
    mac.update(id.as_bytes());
    mac.update(b".");
    mac.update(timestamp_secs.to_string().as_bytes());
    mac.update(b".");
    mac.update(body);
    format!("v1,{}", base64::engine::general_purpose::STANDARD.encode(mac.finalize().into_bytes()))
}

fn hex(bytes: &[u8]) -> String {
    bytes.iter().map(|b| format!("{b:02x}")).collect()
}

/// The id of a batch delivery, derived from its members so that a batch formed differently
/// (after a leader change) never shares an id with one a receiver already deduplicated.
pub fn batch_id(ids: &[&str]) -> String {
    let digest = Sha256::digest(ids.join("\n").as_bytes());
    format!("batch_{}", hex(&digest[..12]))
}

#[cfg(test)]
mod tests {
    #![allow(clippy::unwrap_used)]
    use super::*;

    #[test]
    fn signs_like_the_standard_webhooks_reference() {
        // The test vector of the Standard Webhooks specification's libraries.
        let key = signing_key("whsec_MfKQ9r8GKYqrTwjUPD8ILPZIo2LaLaSw").unwrap();
        let body = br#"{"test": 2432232314}"#;
        assert_eq!(
            sign(&key, "msg_p5jXN8AQM9LWM0D4loKWxJek", 1614265330, body),
            "v1,g0hM9SsE+OTPJTGt/tmIKtSyZlE3uFJELVlNIOLJ1OE="
        );
    }

    #[test]
    fn whsec_secrets_may_be_unpadded_and_raw_secrets_are_bytes() {
        assert_eq!(signing_key("whsec_YWJj").unwrap(), b"abc");
        assert_eq!(signing_key("whsec_YWI").unwrap(), b"ab");
        assert_eq!(signing_key("plain").unwrap(), b"plain");
        assert!(signing_key("whsec_!!").is_err());
        assert!(signing_key("").is_err());
    }

    #[test]
    fn batch_ids_depend_on_every_member() {
        assert_ne!(batch_id(&["a", "b"]), batch_id(&["a"]));
        assert_eq!(batch_id(&["a", "b"]), batch_id(&["a", "b"]));
    }
}
