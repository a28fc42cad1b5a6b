//! `webhooks list` and `webhooks deliveries`.

use serde::Serialize;
use switchyard_proto::admin::v1 as pb;

use super::text::{Table, ago, list_or, utc};

pub fn webhooks_table(webhooks: &[switchyard_catalog::Webhook]) -> String {
    if webhooks.is_empty() {
        return "no webhooks\n".to_owned();
    }
    let mut t = Table::new(["NAME", "URL", "EVENTS", "KEYS", "SECRET", "STATE", "OPTIONS"]);
    for w in webhooks {
        let mut options = Vec::new();
        if w.internal {
            options.push("internal".to_owned());
        }
        if let Some(n) = w.batch_max_events {
            options.push(format!("batch≤{n}"));
        }
        t.row(vec![
            w.name.clone(),
            w.url.clone(),
            w.events.join(","),
            list_or(&w.keys, "all"),
            w.secret.as_ref().map_or_else(|| "none (unsigned)".to_owned(), ToString::to_string),
            if w.enabled { "enabled" } else { "disabled" }.to_owned(),
            if options.is_empty() { "-".to_owned() } else { options.join(",") },
        ]);
    }
    t.render()
}

#[derive(Debug, Serialize)]
pub struct DeliveryView {
    pub event_id: String,
    #[serde(rename = "type")]
    pub event_type: String,
    pub at_unix_ms: i64,
    pub state: String,
    pub attempts: u32,
    pub last_status: u32,
    pub last_error: String,
    pub dead_unix_ms: i64,
    pub key_id: String,
}

#[derive(Debug, Serialize)]
pub struct DeliveriesView {
    pub webhook: String,
    pub subscribed: bool,
    pub backlog: u64,
    pub delivered: u64,
    pub dead: u64,
    pub consecutive_failures: u32,
    pub next_attempt_unix_ms: i64,
    pub last_status: u32,
    pub last_error: String,
    pub last_success_unix_ms: i64,
    pub last_attempt_unix_ms: i64,
    pub leader: String,
    pub deliveries: Vec<DeliveryView>,
}

impl From<pb::ListDeliveriesResponse> for DeliveriesView {
    fn from(r: pb::ListDeliveriesResponse) -> Self {
        Self {
            webhook: r.webhook,
            subscribed: r.subscribed,
            backlog: r.backlog,
            delivered: r.delivered,
            dead: r.dead,
            consecutive_failures: r.consecutive_failures,
            next_attempt_unix_ms: r.next_attempt_unix_ms,
            last_status: r.last_status,
            last_error: r.last_error,
            last_success_unix_ms: r.last_success_unix_ms,
            last_attempt_unix_ms: r.last_attempt_unix_ms,
            leader: r.leader,
            deliveries: r
                .deliveries
                .into_iter()
                .map(|d| DeliveryView {
                    event_id: d.event_id,
                    event_type: d.event_type,
                    at_unix_ms: d.at_unix_ms,
                    state: d.state,
                    attempts: d.attempts,
                    last_status: d.last_status,
                    last_error: d.last_error,
                    dead_unix_ms: d.dead_unix_ms,
                    key_id: d.key_id,
                })
                .collect(),
        }
    }
}

fn last_answer(status: u32, error: &str) -> String {
    match (status, error.is_empty()) {
        (0, true) => "-".to_owned(),
        (0, false) => error.to_owned(),
        (s, _) => format!("HTTP {s}"),
    }
}

pub fn deliveries(v: &DeliveriesView, now_ms: i64) -> String {
    let mut out = format!("webhook {}", v.webhook);
    if !v.subscribed {
        out.push_str(" (no longer in the catalog)");
    }
    out.push('\n');
    let health = if v.consecutive_failures == 0 {
        "healthy".to_owned()
    } else {
        let retry = if v.next_attempt_unix_ms > now_ms {
            format!(", next attempt in {}s", (v.next_attempt_unix_ms - now_ms + 999) / 1000)
        } else {
            String::new()
        };
        format!(
            "failing: {} attempt(s) in a row, last {}{retry}",
            v.consecutive_failures,
            last_answer(v.last_status, &v.last_error)
        )
    };
    out.push_str(&format!(
        "  backlog {}  delivered {}  dead {}  {health}\n  last success {}  delivering replica {}\n",
        v.backlog,
        v.delivered,
        v.dead,
        ago(v.last_success_unix_ms, now_ms),
        if v.leader.is_empty() { "none" } else { &v.leader }
    ));
    if v.deliveries.is_empty() {
        return out;
    }
    out.push('\n');
    let mut t = Table::new(["EVENT", "TYPE", "AT", "STATE", "ATTEMPTS", "LAST ANSWER"]);
    for d in &v.deliveries {
        t.row(vec![
            d.event_id.clone(),
            d.event_type.clone(),
            utc(d.at_unix_ms),
            d.state.clone(),
            d.attempts.to_string(),
            last_answer(d.last_status, &d.last_error),
        ]);
    }
    out.push_str(&t.render());
    out
}
