//! `events`: one line per failover event, requested → served, then each attempt; and one
//! per `events.lost` entry, with the node's count of events it could not keep.

use serde::Serialize;
use switchyard_proto::node::v1 as pb;

use super::text::utc;

/// A failover event; field names follow the stored audit record.
#[derive(Debug, Serialize)]
pub struct EventView {
    pub id: String,
    pub at_unix_ms: i64,
    pub node_id: String,
    pub key_id: String,
    pub requested_model: String,
    pub served_model: String,
    /// In the stored record's form (the node proto's, proto/build.rs).
    pub attempts: Vec<pb::Attempt>,
    pub stream: bool,
    pub status: u32,
    /// Why the node sent its degraded answer instead (`api:degraded_response`); absent for
    /// a failover event.
    #[serde(skip_serializing_if = "String::is_empty")]
    pub degraded: String,
    /// The request's `x-request-id`; absent for an event from a node older than the field.
    #[serde(skip_serializing_if = "String::is_empty")]
    pub request_id: String,
    /// The API the request came through (`chat`, `messages`); absent for an event from a
    /// node older than the field and for `events.lost`.
    #[serde(skip_serializing_if = "String::is_empty")]
    pub surface: String,
    /// `api:model_failover`, `api:degraded_response`, `api:stream_continued` or
    /// `events.lost`.
    #[serde(rename = "type")]
    pub event_type: &'static str,
    /// An `api:stream_continued` entry's continuations, in order; absent for other entries.
    #[serde(skip_serializing_if = "Vec::is_empty")]
    pub continued: Vec<pb::Continuation>,
    /// An `events.lost` entry's count, reason (`memory_full`, `spool_busy`, `spool_full`,
    /// `spool_unwritable`, `unreadable`, `node_killed`, `node_killed_unacked`), which events
    /// (`failover`, `breaker`) and when the first and last were lost; absent for other
    /// entries.
    #[serde(skip_serializing_if = "Option::is_none")]
    pub count: Option<u64>,
    #[serde(skip_serializing_if = "Option::is_none")]
    pub reason: Option<String>,
    #[serde(skip_serializing_if = "Option::is_none")]
    pub events: Option<String>,
    #[serde(skip_serializing_if = "Option::is_none")]
    pub first_unix_ms: Option<i64>,
    #[serde(skip_serializing_if = "Option::is_none")]
    pub last_unix_ms: Option<i64>,
}

impl From<pb::FailoverEvent> for EventView {
    fn from(e: pb::FailoverEvent) -> Self {
        let event_type = e.event_type();
        let lost = e.lost;
        Self {
            event_type,
            count: lost.as_ref().map(|l| l.count),
            reason: lost.as_ref().map(|l| l.reason.clone()),
            events: lost.as_ref().map(|l| l.events.clone()),
            first_unix_ms: lost.as_ref().map(|l| l.first_unix_ms),
            last_unix_ms: lost.as_ref().map(|l| l.last_unix_ms),
            id: e.id,
            at_unix_ms: e.at_unix_ms,
            node_id: e.node_id,
            key_id: e.key_id,
            requested_model: e.requested_model,
            served_model: e.served_model,
            attempts: e.attempts,
            stream: e.stream,
            status: e.status,
            degraded: e.degraded,
            request_id: e.request_id,
            surface: e.surface,
            continued: e.continued,
        }
    }
}

/// An `events.lost` entry as `--json` prints it: without the request fields a failover
/// event has, so that a reader counting failover events (by their `attempts`) cannot take
/// it for one.
#[derive(Debug, Serialize)]
struct LostLine<'a> {
    #[serde(rename = "type")]
    event_type: &'static str,
    id: &'a str,
    at_unix_ms: i64,
    node_id: &'a str,
    count: u64,
    reason: &'a str,
    events: &'a str,
    first_unix_ms: i64,
    last_unix_ms: i64,
}

impl EventView {
    /// The entry as one line of `--json`.
    pub fn json(&self) -> serde_json::Result<String> {
        match self.count {
            Some(count) => serde_json::to_string(&LostLine {
                event_type: self.event_type,
                id: &self.id,
                at_unix_ms: self.at_unix_ms,
                node_id: &self.node_id,
                count,
                reason: self.reason.as_deref().unwrap_or_default(),
                events: self.events.as_deref().unwrap_or_default(),
                first_unix_ms: self.first_unix_ms.unwrap_or(self.at_unix_ms),
                last_unix_ms: self.last_unix_ms.unwrap_or(self.at_unix_ms),
            }),
            None => serde_json::to_string(self),
        }
    }
}

/// `failed(timeout 30011ms)`, `served(734ms)`, `skipped(circuit_open)`; `probe` marks an
/// attempt made through an open breaker, `injected=NAME` one a drill's fault affected.
fn attempt(a: &pb::Attempt) -> String {
    let mut detail = Vec::new();
    if !a.reason.is_empty() {
        detail.push(a.reason.clone());
    }
    if a.status != "skipped" {
        detail.push(format!("{}ms", a.latency_ms));
    }
    if a.retries > 0 {
        detail.push(format!("retries={}", a.retries));
    }
    if a.probe {
        detail.push("probe".to_owned());
    }
    if !a.injected.is_empty() {
        detail.push(format!("injected={}", a.injected));
    }
    if a.local_limit {
        detail.push("local_limit".to_owned());
    }
    let at = if a.deployment.is_empty() { String::new() } else { format!("@{}", a.deployment) };
    format!("{}{at} {}({})", a.model, a.status, detail.join(" "))
}

/// One line: when, which key, requested → served, then each attempt, and the request's id
/// last (`request_id=ID`), where a search for it finds the line.
pub fn event_line(e: &EventView) -> String {
    if let Some(count) = e.count {
        return format!(
            "{}  events.lost  node={}  {count} {} events lost ({}) from {}\n",
            utc(e.at_unix_ms),
            e.node_id,
            e.events.as_deref().unwrap_or("failover"),
            e.reason.as_deref().unwrap_or(""),
            utc(e.first_unix_ms.unwrap_or(e.at_unix_ms)),
        );
    }
    let served = if !e.degraded.is_empty() {
        format!("degraded answer ({})", e.degraded)
    } else if e.served_model.is_empty() {
        format!("none ({})", e.status)
    } else {
        e.served_model.clone()
    };
    let key = if e.key_id.is_empty() { "-" } else { &e.key_id };
    let mut attempts: Vec<String> = e.attempts.iter().map(attempt).collect();
    // A continued stream: each continuation after the attempts, as the answer went on.
    attempts.extend(e.continued.iter().map(|c| {
        format!("{} continued({} at_char={} {})", c.model, c.reason, c.at_char, c.outcome)
    }));
    let mut request_id = if e.request_id.is_empty() {
        String::new()
    } else {
        format!("  request_id={}", e.request_id)
    };
    // Chat Completions is the default surface: only another one is named.
    if !e.surface.is_empty() && e.surface != "chat" {
        request_id = format!("  surface={}{request_id}", e.surface);
    }
    format!(
        "{}  {key}  {} → {served}  {}{request_id}\n",
        utc(e.at_unix_ms),
        e.requested_model,
        attempts.join(" → ")
    )
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn an_event_reads_as_requested_served_and_each_attempt() {
        let e = EventView::from(switchyard_proto::node::v1::FailoverEvent {
            id: "ev1".into(),
            at_unix_ms: 1_796_219_557_000,
            key_id: "key_1".into(),
            requested_model: "openai/gpt-5-nano".into(),
            served_model: "anthropic/claude-sonnet-4".into(),
            attempts: vec![
                switchyard_proto::node::v1::Attempt {
                    model: "openai/gpt-5-nano".into(),
                    status: "failed".into(),
                    reason: "timeout".into(),
                    latency_ms: 30_011,
                    probe: false,
                    injected: "drill-1".into(),
                    retries: 2,
                    ..Default::default()
                },
                switchyard_proto::node::v1::Attempt {
                    model: "anthropic/claude-sonnet-4".into(),
                    status: "served".into(),
                    latency_ms: 734,
                    ..Default::default()
                },
            ],
            status: 200,
            ..Default::default()
        });
        assert_eq!(
            event_line(&e),
            "2026-12-02 13:52:37 UTC  key_1  openai/gpt-5-nano → anthropic/claude-sonnet-4  \
             openai/gpt-5-nano failed(timeout 30011ms retries=2 injected=drill-1) → \
             anthropic/claude-sonnet-4 served(734ms)\n"
        );
        assert!(serde_json::to_value(&e).unwrap().get("request_id").is_none());
        let e = EventView { request_id: "req-1".into(), ..e };
        assert!(
            event_line(&e).ends_with("served(734ms)  request_id=req-1\n"),
            "{}",
            event_line(&e)
        );
        assert_eq!(serde_json::to_value(&e).unwrap()["request_id"], "req-1");
        let json = serde_json::to_value(&e).unwrap();
        assert_eq!(json["attempts"][0]["injected"], "drill-1");
        assert!(json["attempts"][1].get("injected").is_none(), "{json}");
        assert_eq!(json["attempts"][0]["retries"], 2);
        assert!(json["attempts"][1].get("retries").is_none(), "{json}");
        assert!(json.get("count").is_none(), "{json}");
    }

    #[test]
    fn an_events_lost_entry_reads_as_its_count_and_reason() {
        let e = EventView::from(switchyard_proto::node::v1::FailoverEvent {
            id: "lost_b_1".into(),
            at_unix_ms: 1_796_219_557_000,
            node_id: "node-a".into(),
            lost: Some(Box::new(switchyard_proto::node::v1::EventsLost {
                id: "lost_b_1".into(),
                count: 15,
                reason: "spool_unwritable".into(),
                events: "failover".into(),
                first_unix_ms: 1_796_219_556_000,
                last_unix_ms: 1_796_219_557_000,
            })),
            ..Default::default()
        });
        assert_eq!(
            event_line(&e),
            "2026-12-02 13:52:37 UTC  events.lost  node=node-a  15 failover events lost \
             (spool_unwritable) from 2026-12-02 13:52:36 UTC\n"
        );
        let json: serde_json::Value = serde_json::from_str(&e.json().unwrap()).unwrap();
        assert_eq!(json["type"], "events.lost");
        assert_eq!(json["count"], 15);
        assert_eq!(json["reason"], "spool_unwritable");
        assert_eq!(json["node_id"], "node-a");
        assert!(json.get("attempts").is_none(), "no request fields: {json}");
    }
    #[test]
    fn json_and_text_lines_keep_their_form() {
        use switchyard_proto::node::v1 as pb;
        let full = pb::FailoverEvent {
            id: "ev1".into(),
            at_unix_ms: 1_796_219_557_000,
            node_id: "n1".into(),
            key_id: "key_1".into(),
            requested_model: "a".into(),
            served_model: "b".into(),
            attempts: vec![
                pb::Attempt {
                    model: "a".into(),
                    status: "failed".into(),
                    reason: "timeout".into(),
                    latency_ms: 30_011,
                    probe: true,
                    injected: "drill-1".into(),
                    retries: 2,
                    deployment: "p/up".into(),
                    local_limit: true,
                },
                pb::Attempt {
                    model: "b".into(),
                    status: "served".into(),
                    latency_ms: 734,
                    ..Default::default()
                },
                pb::Attempt {
                    model: "c".into(),
                    status: "skipped".into(),
                    reason: "circuit_open".into(),
                    ..Default::default()
                },
            ],
            stream: true,
            status: 200,
            degraded: "all_models_failed".into(),
            request_id: "req-1".into(),
            lost: None,
            continued: vec![pb::Continuation {
                model: "b".into(),
                reason: "upstream_stalled".into(),
                at_char: 120,
                outcome: "served".into(),
            }],
            surface: "messages".into(),
        };
        let plain = pb::FailoverEvent {
            degraded: String::new(),
            continued: vec![],
            surface: String::new(),
            request_id: String::new(),
            ..full.clone()
        };
        let full = EventView::from(full);
        assert_eq!(
            full.json().unwrap(),
            r#"{"id":"ev1","at_unix_ms":1796219557000,"node_id":"n1","key_id":"key_1","requested_model":"a","served_model":"b","attempts":[{"model":"a","status":"failed","reason":"timeout","latency_ms":30011,"probe":true,"injected":"drill-1","retries":2,"deployment":"p/up","local_limit":true},{"model":"b","status":"served","reason":"","latency_ms":734,"probe":false},{"model":"c","status":"skipped","reason":"circuit_open","latency_ms":0,"probe":false}],"stream":true,"status":200,"degraded":"all_models_failed","request_id":"req-1","surface":"messages","type":"api:degraded_response","continued":[{"model":"b","reason":"upstream_stalled","at_char":120,"outcome":"served"}]}"#
        );
        assert_eq!(
            event_line(&full),
            "2026-12-02 13:52:37 UTC  key_1  a → degraded answer (all_models_failed)  \
             a@p/up failed(timeout 30011ms retries=2 probe injected=drill-1 local_limit) → \
             b served(734ms) → c skipped(circuit_open) → \
             b continued(upstream_stalled at_char=120 served)  surface=messages  request_id=req-1\n"
        );
        let plain = EventView::from(plain);
        assert_eq!(
            plain.json().unwrap(),
            r#"{"id":"ev1","at_unix_ms":1796219557000,"node_id":"n1","key_id":"key_1","requested_model":"a","served_model":"b","attempts":[{"model":"a","status":"failed","reason":"timeout","latency_ms":30011,"probe":true,"injected":"drill-1","retries":2,"deployment":"p/up","local_limit":true},{"model":"b","status":"served","reason":"","latency_ms":734,"probe":false},{"model":"c","status":"skipped","reason":"circuit_open","latency_ms":0,"probe":false}],"stream":true,"status":200,"type":"api:model_failover"}"#
        );
        let lost = EventView::from(pb::FailoverEvent {
            id: "lost_b_1".into(),
            at_unix_ms: 20,
            node_id: "n1".into(),
            lost: Some(Box::new(pb::EventsLost {
                id: "lost_b_1".into(),
                count: 15,
                reason: "spool_unwritable".into(),
                events: "failover".into(),
                first_unix_ms: 10,
                last_unix_ms: 20,
            })),
            ..Default::default()
        });
        assert_eq!(
            lost.json().unwrap(),
            r#"{"type":"events.lost","id":"lost_b_1","at_unix_ms":20,"node_id":"n1","count":15,"reason":"spool_unwritable","events":"failover","first_unix_ms":10,"last_unix_ms":20}"#
        );
    }
}
