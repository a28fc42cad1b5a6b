//! Where things live in the store, below one prefix (`/switchyard/` by default).
//!
//! `config/` holds everything nodes receive (the node stream watches only it);
//! `nodes/` holds node presence, kept apart so heartbeats never wake config watchers.
//! What nodes report lives beside it, also outside `config/`:
//! - `audit/<at_unix_ms, 13 digits>-<event id>`: failover events, so key order is time order
//!   and a redelivered event lands on its own key again;
//! - `breakers/<node>/<provider>/<upstream model>`: each node's current breaker states;
//! - `usage/<node>/<boot id>`: each node process's cumulative usage totals;
//! - `webhooks/outbox/…`, `webhooks/state/<subscription>`, `webhooks/dead/<subscription>/…`:
//!   webhook events waiting for delivery, each subscription's delivery state, dead letters
//!   (see [`crate::webhooks`]);
//! - `key_secrets/<sha256 hex>` → key id: the index `ListKeys{secret_sha256}` reads, written
//!   with each key (and `key_secrets_complete` once keys from before it are indexed too);
//! - `elections/<name>/`: leader elections for work one replica does (audit retention,
//!   webhook delivery).
//!
//! Segments that come from nodes are escaped (`%` → `%25`, `/` → `%2F`), so that a node id
//! holding a `/` cannot reach into another node's records.

#[derive(Clone, Debug)]
pub struct Layout {
    prefix: String,
}

/// The most operations one store transaction may hold: etcd's default `--max-txn-ops`,
/// which both store backends enforce. Writers split larger batches by it.
pub const MAX_TXN_OPS: usize = 128;

/// The resource name of the catalog below `config/`.
pub const CATALOG: &str = "catalog";
/// The resource-name prefix of API keys below `config/`.
pub const KEYS: &str = "keys/";
/// The resource-name prefix of injected faults below `config/`; each is kept under a lease
/// of its TTL (see [`crate::faults`]).
pub const FAULTS: &str = "faults/";

impl Layout {
    pub fn new(prefix: &str) -> Self {
        let mut prefix = prefix.to_owned();
        if !prefix.ends_with('/') {
            prefix.push('/');
        }
        Self { prefix }
    }

    pub fn config_prefix(&self) -> String {
        format!("{}config/", self.prefix)
    }

    pub fn catalog(&self) -> String {
        format!("{}config/{CATALOG}", self.prefix)
    }

    pub fn keys_prefix(&self) -> String {
        format!("{}config/{KEYS}", self.prefix)
    }

    pub fn key(&self, id: &str) -> String {
        format!("{}config/{KEYS}{id}", self.prefix)
    }

    /// The index from a key's secret hash to its id (`key_secrets/<sha256 hex>` → id),
    /// written in the transaction that writes the key: `ListKeys{secret_sha256}` reads one
    /// entry instead of every key. Outside `config/`, so nodes never receive it.
    pub fn key_secrets_prefix(&self) -> String {
        format!("{}key_secrets/", self.prefix)
    }

    pub fn key_secret(&self, sha256_hex: &str) -> String {
        format!("{}key_secrets/{sha256_hex}", self.prefix)
    }

    /// Present once every stored key has its index entry (written by the first lookup that
    /// missed and read every key): from then on a miss is an answer, not a reason to scan.
    pub fn key_secrets_complete(&self) -> String {
        format!("{}key_secrets_complete", self.prefix)
    }

    pub fn faults_prefix(&self) -> String {
        format!("{}config/{FAULTS}", self.prefix)
    }

    /// Fault names are `[A-Za-z0-9._-]` (checked before anything is stored), so they need
    /// no escaping.
    pub fn fault(&self, name: &str) -> String {
        format!("{}config/{FAULTS}{name}", self.prefix)
    }

    pub fn nodes_prefix(&self) -> String {
        format!("{}nodes/", self.prefix)
    }

    pub fn node(&self, id: &str) -> String {
        format!("{}nodes/{id}", self.prefix)
    }

    pub fn audit_prefix(&self) -> String {
        format!("{}audit/", self.prefix)
    }

    /// One event, as releases before batched storage wrote it (still read). Zero-padded to
    /// 13 digits (good until the year 2286), so keys sort by time.
    pub fn audit(&self, at_unix_ms: i64, event_id: &str) -> String {
        format!("{}audit/{:013}-{}", self.prefix, at_unix_ms.max(0), escape(event_id))
    }

    /// A batch of `count` events, the newest at `newest_unix_ms` (`<newest, 13 digits>-batch_<id>_<count>`).
    pub fn audit_batch(&self, newest_unix_ms: i64, batch_id: &str, count: usize) -> String {
        format!("{}audit/{}", self.prefix, batch_name(newest_unix_ms, batch_id, count))
    }

    /// What retention leaves of a batch it cut through: named like a batch, with `t` after
    /// the count, so that readers of the watch know its events are not new
    /// ([`batch_trimmed`]).
    pub fn audit_batch_trimmed(&self, newest_unix_ms: i64, batch_id: &str, count: usize) -> String {
        format!("{}t", self.audit_batch(newest_unix_ms, batch_id, count))
    }

    pub fn breakers_prefix(&self) -> String {
        format!("{}breakers/", self.prefix)
    }

    pub fn node_breakers_prefix(&self, node_id: &str) -> String {
        format!("{}breakers/{}/", self.prefix, escape(node_id))
    }

    pub fn breaker(&self, node_id: &str, provider: &str, upstream_model: &str) -> String {
        format!(
            "{}breakers/{}/{}/{}",
            self.prefix,
            escape(node_id),
            escape(provider),
            escape(upstream_model)
        )
    }

    /// Each replica's view of its nodes' limit windows (docs/limits.md), under its lease.
    pub fn limits_prefix(&self) -> String {
        format!("{}limits/", self.prefix)
    }

    pub fn limits(&self, replica: &str) -> String {
        format!("{}limits/{}", self.prefix, escape(replica))
    }

    /// A node run's cumulative usage as it stood at the start of an hour, for usage since a
    /// time (`switchyard usage --since`).
    pub fn usage_marks_prefix(&self) -> String {
        format!("{}usage_marks/", self.prefix)
    }

    pub fn usage_mark(&self, node_id: &str, boot_id: &str, hour_unix_ms: i64) -> String {
        format!(
            "{}usage_marks/{}/{}/{:013}",
            self.prefix,
            escape(node_id),
            escape(boot_id),
            hour_unix_ms.max(0)
        )
    }

    pub fn usage_prefix(&self) -> String {
        format!("{}usage/", self.prefix)
    }

    pub fn usage(&self, node_id: &str, boot_id: &str) -> String {
        format!("{}usage/{}/{}", self.prefix, escape(node_id), escape(boot_id))
    }

    /// Webhook events waiting for delivery, keyed like the audit log (a resent event
    /// rewrites its entry in place). Delivery order is the entries' create revision.
    pub fn outbox_prefix(&self) -> String {
        format!("{}webhooks/outbox/", self.prefix)
    }

    pub fn outbox(&self, at_unix_ms: i64, event_id: &str) -> String {
        format!("{}webhooks/outbox/{:013}-{}", self.prefix, at_unix_ms.max(0), escape(event_id))
    }

    /// A batch of `count` outbox entries (`<newest, 13 digits>-batch_<id>_<count>`).
    pub fn outbox_batch(&self, newest_unix_ms: i64, batch_id: &str, count: usize) -> String {
        format!("{}webhooks/outbox/{}", self.prefix, batch_name(newest_unix_ms, batch_id, count))
    }

    /// One subscription's delivery state (cursor, failing attempts).
    pub fn webhook_state_prefix(&self) -> String {
        format!("{}webhooks/state/", self.prefix)
    }

    pub fn webhook_state(&self, name: &str) -> String {
        format!("{}webhooks/state/{}", self.prefix, escape(name))
    }

    pub fn dead_letters_prefix(&self, name: &str) -> String {
        format!("{}webhooks/dead/{}/", self.prefix, escape(name))
    }

    pub fn dead_letter(&self, name: &str, event_id: &str) -> String {
        format!("{}webhooks/dead/{}/{}", self.prefix, escape(name), escape(event_id))
    }

    /// The election whose leader delivers webhooks.
    pub fn webhook_election(&self) -> String {
        format!("{}elections/webhooks", self.prefix)
    }

    /// The election whose leader prunes the audit log.
    pub fn audit_retention_election(&self) -> String {
        format!("{}elections/audit-retention", self.prefix)
    }

    /// The resource name nodes see for a store key under `config/`.
    pub fn resource_name<'k>(&self, key: &'k str) -> Option<&'k str> {
        key.strip_prefix(&self.prefix)?.strip_prefix("config/")
    }
}

/// `<newest 13 digits>-batch_<id>_<count>`: keys of batches sort by their newest event's
/// time, like single events' keys, and say how many events they hold, so that the audit
/// log's retention counts events from its keys alone. `batch_id` is 24 hex digits.
fn batch_name(newest_unix_ms: i64, batch_id: &str, count: usize) -> String {
    format!("{:013}-batch_{batch_id}_{count}", newest_unix_ms.max(0))
}

/// A batch key's count part (`<count>` or `<count>t`), `None` for a single event's key.
fn batch_count(key: &str) -> Option<&str> {
    let name = key.rsplit('/').next().unwrap_or(key);
    let batch = name.split_once('-').and_then(|(_, rest)| rest.strip_prefix("batch_"))?;
    let (id, count) = batch.split_once('_')?;
    let digits = count.strip_suffix('t').unwrap_or(count);
    let valid = id.len() == 24
        && id.bytes().all(|b| b.is_ascii_hexdigit())
        && !digits.is_empty()
        && digits.bytes().all(|b| b.is_ascii_digit());
    valid.then_some(count)
}

/// How many events the audit or outbox value at `key` holds: a batch's count, else 1.
pub fn events_in_key(key: &str) -> usize {
    batch_count(key)
        .and_then(|count| count.strip_suffix('t').unwrap_or(count).parse().ok())
        .unwrap_or(1)
}

/// Whether `key` is what retention left of a batch (its events were stored before).
pub fn batch_trimmed(key: &str) -> bool {
    batch_count(key).is_some_and(|count| count.ends_with('t'))
}

/// One key segment from outside (node id, provider, model, event id).
fn escape(segment: &str) -> String {
    segment.replace('%', "%25").replace('/', "%2F")
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn audit_keys_sort_by_time() {
        let l = Layout::new("/s");
        assert_eq!(l.audit(734, "ev1"), "/s/audit/0000000000734-ev1");
        assert!(l.audit(9_999, "z") < l.audit(10_000, "a"));
        assert!(l.audit(1, "e").starts_with(&l.audit_prefix()));
        let batch = l.audit_batch(734, "0123456789abcdef01234567", 500);
        assert_eq!(batch, "/s/audit/0000000000734-batch_0123456789abcdef01234567_500");
        assert!(batch < l.audit(735, "a") && batch > l.audit(733, "z"));
        assert_eq!(events_in_key(&batch), 500);
        assert_eq!(events_in_key(&l.audit(734, "ev1")), 1);
        assert_eq!(events_in_key(&l.audit(734, "batch_x_7")), 1, "an event id is one event");
        assert_eq!(events_in_key(&l.outbox_batch(1, "0123456789abcdef01234567", 3)), 3);
        let trimmed = l.audit_batch_trimmed(734, "0123456789abcdef01234567", 42);
        assert_eq!((events_in_key(&trimmed), batch_trimmed(&trimmed)), (42, true));
        assert!(!batch_trimmed(&batch) && !batch_trimmed(&l.audit(1, "batch_x_7t")));
    }

    #[test]
    fn node_segments_cannot_reach_into_other_nodes() {
        let l = Layout::new("/s/");
        assert_eq!(l.breaker("n1", "openai", "org/model"), "/s/breakers/n1/openai/org%2Fmodel");
        assert!(!l.breaker("a/b", "p", "m").starts_with(&l.node_breakers_prefix("a")));
        assert_eq!(l.usage("n%1", "boot"), "/s/usage/n%251/boot");
    }
}
