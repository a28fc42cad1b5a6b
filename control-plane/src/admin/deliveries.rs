//! `ListDeliveries` and `Redeliver`: a webhook subscription's delivery state, what it still
//! owes and its dead letters; queuing events again.

use tonic::{Request, Response, Status};

use switchyard_proto::admin::v1 as pb;

use super::service::{AdminError, AdminService, decode, invalid};
use crate::events::{OutboxEntry, decode_entries};
use crate::store::Revision;
use crate::webhooks::{self, DeadLetter, RedeliverError, SubscriptionState};

pub(super) async fn list_deliveries(
    admin: &AdminService,
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
    let (catalog, _) = admin.load_catalog().await?;
    let webhook = catalog.webhooks.iter().find(|w| w.name == name);
    let state: SubscriptionState = match admin
        .store
        .get(&admin.layout.webhook_state(&name))
        .await
        .map_err(AdminError::from)?
    {
        Some(kv) => decode(&kv.value, "webhook state")?,
        None => SubscriptionState::default(),
    };
    let dead = admin
        .store
        .list(&admin.layout.dead_letters_prefix(&name))
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
            admin.store.list(&admin.layout.outbox_prefix()).await.map_err(AdminError::from)?;
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
        crate::store::election::leader(admin.store.as_ref(), &admin.layout.webhook_election())
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

pub(super) async fn redeliver(
    admin: &AdminService,
    request: Request<pb::RedeliverRequest>,
) -> Result<Response<pb::RedeliverResponse>, Status> {
    let request = request.into_inner();
    let (catalog, _) = admin.load_catalog().await?;
    let done = webhooks::redeliver(
        admin.store.as_ref(),
        &admin.layout,
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
    Ok(Response::new(pb::RedeliverResponse { requeued: done.requeued, not_found: done.not_found }))
}
