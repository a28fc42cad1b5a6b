//! Redelivery (`switchyard webhooks redeliver`): dead letters, or failover events still in
//! the audit log, queued again for one subscription.

use tracing::info;

use switchyard_catalog::Catalog;
use switchyard_time::now_ms;

use super::state::DeadLetter;
use crate::audit;
use crate::events::OutboxEntry;
use crate::layout::{Layout, MAX_TXN_OPS};
use crate::store::{Store, StoreError, Txn, TxnOp};

#[derive(Debug, thiserror::Error)]
pub enum RedeliverError {
    #[error("no webhook named {0:?} in the catalog")]
    UnknownWebhook(String),
    #[error("name events to redeliver, or ask for every dead letter")]
    NothingNamed,
    #[error(transparent)]
    Store(#[from] StoreError),
    #[error("stored {what} is unreadable: {reason}")]
    Corrupt { what: &'static str, reason: String },
}

/// What a redelivery queued, and the ids it found nowhere.
#[derive(Debug, Default, PartialEq, Eq)]
pub struct Redelivered {
    pub requeued: u32,
    pub not_found: Vec<String>,
}

/// Queues `event_ids` (dead letters of the subscription, or failover events in the audit
/// log), and with `all_dead` every dead letter of the subscription, for `webhook` alone.
/// A dead letter leaves the dead-letter list in the transaction that queues it again.
pub async fn redeliver(
    store: &dyn Store,
    layout: &Layout,
    catalog: &Catalog,
    webhook: &str,
    event_ids: Vec<String>,
    all_dead: bool,
) -> Result<Redelivered, RedeliverError> {
    if !catalog.webhooks.iter().any(|w| w.name == webhook) {
        return Err(RedeliverError::UnknownWebhook(webhook.to_owned()));
    }
    if event_ids.is_empty() && !all_dead {
        return Err(RedeliverError::NothingNamed);
    }
    // (entry, the dead letter's key to remove)
    let mut queue: Vec<(OutboxEntry, Option<String>)> = Vec::new();
    let mut not_found = Vec::new();
    if all_dead {
        for kv in store.list(&layout.dead_letters_prefix(webhook)).await?.kvs {
            queue.push((dead_letter(&kv.value)?.entry, Some(kv.key)));
        }
    }
    let mut audit_log = None;
    for id in event_ids {
        if queue.iter().any(|(e, _)| e.id == id) {
            continue;
        }
        let key = layout.dead_letter(webhook, &id);
        if let Some(kv) = store.get(&key).await? {
            queue.push((dead_letter(&kv.value)?.entry, Some(key)));
            continue;
        }
        // Not dead: a failover event still in the audit log can be sent again.
        if audit_log.is_none() {
            audit_log = Some(store.list(&layout.audit_prefix()).await?);
        }
        let found = audit_log
            .iter()
            .flat_map(|l| l.kvs.iter())
            .flat_map(audit::decode)
            .find(|e| e.id == id);
        match found {
            Some(event) => queue.push((OutboxEntry::from_audit(&event, now_ms()), None)),
            None => not_found.push(id),
        }
    }
    let now = now_ms();
    let requeued = u32::try_from(queue.len()).unwrap_or(u32::MAX);
    // Two operations per entry at most: its put and its dead letter's delete.
    for chunk in queue.chunks(MAX_TXN_OPS / 2) {
        let mut ops = Vec::new();
        for (entry, dead_key) in chunk {
            let mut entry = entry.clone();
            entry.only = vec![webhook.to_owned()];
            entry.enqueued_unix_ms = now;
            // A key of its own: the original entry may still wait for other subscriptions.
            let key = layout.outbox(now, &format!("{}~redeliver~{webhook}", entry.id));
            let value = serde_json::to_vec(&entry).map_err(|e| RedeliverError::Corrupt {
                what: "outbox entry",
                reason: e.to_string(),
            })?;
            ops.push(TxnOp::Put { key, value, lease: None });
            if let Some(dead_key) = dead_key {
                ops.push(TxnOp::Delete { key: dead_key.clone() });
            }
        }
        store.txn(Txn { compare: vec![], success: ops, failure: vec![] }).await?;
    }
    info!(webhook, requeued, "webhook events queued for redelivery");
    Ok(Redelivered { requeued, not_found })
}

fn dead_letter(bytes: &[u8]) -> Result<DeadLetter, RedeliverError> {
    serde_json::from_slice(bytes)
        .map_err(|e| RedeliverError::Corrupt { what: "dead letter", reason: e.to_string() })
}
