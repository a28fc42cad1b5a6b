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
//! exponential backoff with full jitter, dead letters after `max_age`. [`redeliver()`] queues
//! dead letters (or audit-log events) again for one subscription.

pub mod client;
pub mod deliver;
pub mod redeliver;
pub mod signing;
pub mod state;

pub use deliver::{DeliveryOptions, run};
pub use redeliver::{RedeliverError, Redelivered, redeliver};
pub use signing::{SignError, batch_id, sign, signing_key};
pub use state::{DeadLetter, PendingDelivery, SubscriptionState};

pub use crate::events::{FAILOVER, Interest, NODE_DISCONNECTED, OutboxEntry};
