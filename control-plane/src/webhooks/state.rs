//! What the delivery leader stores per subscription: its cursor and retries
//! (`webhooks/state/<subscription>`), and the events it gave up on
//! (`webhooks/dead/<subscription>/<event id>`).

use serde::{Deserialize, Serialize};

use crate::events::OutboxEntry;
use crate::store::Revision;

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
