//! How admin results look: aligned tables and key/value blocks for people, JSON for scripts.
//!
//! Renderers are pure (`-> String`) so tests can pin the format without a control plane.

use serde::Serialize;
use switchyard_proto::admin::v1 as pb;

/// A plain text table: columns padded to their widest cell, two spaces apart.
pub struct Table {
    rows: Vec<Vec<String>>,
}

impl Table {
    pub fn new<const N: usize>(headers: [&str; N]) -> Self {
        Self { rows: vec![headers.iter().map(|h| (*h).to_owned()).collect()] }
    }

    pub fn row(&mut self, cells: Vec<String>) {
        self.rows.push(cells);
    }

    pub fn render(&self) -> String {
        let columns = self.rows.iter().map(Vec::len).max().unwrap_or(0);
        let mut widths = vec![0; columns];
        for row in &self.rows {
            for (i, cell) in row.iter().enumerate() {
                widths[i] = widths[i].max(cell.chars().count());
            }
        }
        let mut out = String::new();
        for row in &self.rows {
            let mut line = String::new();
            for (i, cell) in row.iter().enumerate() {
                if i > 0 {
                    line.push_str("  ");
                }
                line.push_str(cell);
                line.extend(std::iter::repeat_n(' ', widths[i] - cell.chars().count()));
            }
            // Padding of the last column is invisible but breaks `diff` and copy/paste.
            out.push_str(line.trim_end());
            out.push('\n');
        }
        out
    }
}

/// `3s ago`, `5m ago`, `2h ago`, `4d ago`; `never` for an unset (0) timestamp.
pub fn ago(unix_ms: i64, now_ms: i64) -> String {
    if unix_ms <= 0 {
        return "never".to_owned();
    }
    // A clock slightly ahead of ours is "just now", not a negative age.
    let secs = (now_ms - unix_ms).max(0) / 1000;
    match secs {
        0..60 => format!("{secs}s ago"),
        60..3600 => format!("{}m ago", secs / 60),
        3600..86_400 => format!("{}h ago", secs / 3600),
        _ => format!("{}d ago", secs / 86_400),
    }
}

/// `2026-12-02 13:52:37 UTC`.
pub fn utc(unix_ms: i64) -> String {
    let t = switchyard_catalog::time::Utc::from_unix_ms(unix_ms);
    format!(
        "{:04}-{:02}-{:02} {:02}:{:02}:{:02} UTC",
        t.year, t.month, t.day, t.hour, t.minute, t.second
    )
}

pub fn now_ms() -> i64 {
    std::time::SystemTime::now()
        .duration_since(std::time::UNIX_EPOCH)
        .map_or(0, |d| i64::try_from(d.as_millis()).unwrap_or(i64::MAX))
}

pub fn json<T: Serialize>(value: &T) -> Result<String, serde_json::Error> {
    serde_json::to_string_pretty(value).map(|mut s| {
        s.push('\n');
        s
    })
}

// === keys ===

/// A key as scripts see it; field names follow the catalog's `ApiKeyRecord`.
#[derive(Debug, Serialize)]
pub struct KeyView {
    pub id: String,
    pub name: String,
    pub status: String,
    pub secret_hint: String,
    pub created_unix_ms: i64,
    pub updated_unix_ms: i64,
    #[serde(rename = "failoverDefaults")]
    pub failover_defaults: Option<DefaultsView>,
    pub allowed_models: Vec<String>,
    pub allowed_regions: Vec<String>,
}

#[derive(Debug, Serialize)]
pub struct DefaultsView {
    pub models: Vec<String>,
    pub timeout_ms: Option<u32>,
    pub first_token_timeout_ms: Option<u32>,
    /// Empty on the wire means all four triggers; scripts get the list spelled out.
    pub on: Vec<String>,
}

impl From<pb::ApiKey> for KeyView {
    fn from(k: pb::ApiKey) -> Self {
        Self {
            id: k.id,
            name: k.name,
            status: k.status,
            secret_hint: k.secret_hint,
            created_unix_ms: k.created_unix_ms,
            updated_unix_ms: k.updated_unix_ms,
            failover_defaults: k.failover_defaults.map(|d| DefaultsView {
                models: d.models,
                timeout_ms: d.timeout_ms,
                first_token_timeout_ms: d.first_token_timeout_ms,
                on: if d.on.is_empty() {
                    switchyard_catalog::FailoverReason::ALL
                        .iter()
                        .map(|r| r.as_str().to_owned())
                        .collect()
                } else {
                    d.on
                },
            }),
            allowed_models: k.allowed_models,
            allowed_regions: k.allowed_regions,
        }
    }
}

/// What `keys create --json` and `keys rotate --json` print: the key's fields, plus the
/// secret as `key` (DESIGN §4) and the server's warnings.
#[derive(Debug, Serialize)]
pub struct KeySecretView {
    #[serde(flatten)]
    pub key: KeyView,
    #[serde(rename = "key")]
    pub secret: String,
    pub warnings: Vec<String>,
    /// Store revision of the write: a node whose applied version reaches it has the key.
    pub version: i64,
}

#[derive(Debug, Serialize)]
pub struct KeyWithWarnings {
    #[serde(flatten)]
    pub key: KeyView,
    pub warnings: Vec<String>,
    /// Store revision of the write; 0 for reads.
    pub version: i64,
}

fn hint(secret_hint: &str) -> String {
    if secret_hint.is_empty() { "-".to_owned() } else { format!("sy-…{secret_hint}") }
}

fn chain(d: &DefaultsView) -> String {
    d.models.join(" → ")
}

fn list_or(items: &[String], empty: &str) -> String {
    if items.is_empty() { empty.to_owned() } else { items.join(", ") }
}

pub fn keys_table(keys: &[KeyView], now_ms: i64) -> String {
    if keys.is_empty() {
        return "no keys\n".to_owned();
    }
    let mut t = Table::new(["ID", "NAME", "STATUS", "SECRET", "DEFAULT CHAIN", "CREATED"]);
    for k in keys {
        t.row(vec![
            k.id.clone(),
            k.name.clone(),
            k.status.clone(),
            hint(&k.secret_hint),
            k.failover_defaults.as_ref().map_or_else(|| "-".to_owned(), chain),
            ago(k.created_unix_ms, now_ms),
        ]);
    }
    t.render()
}

pub fn key_details(k: &KeyView, now_ms: i64) -> String {
    let mut rows: Vec<(&str, String)> = vec![
        ("id", k.id.clone()),
        ("name", k.name.clone()),
        ("status", k.status.clone()),
        ("secret", hint(&k.secret_hint)),
        ("created", format!("{} ({})", utc(k.created_unix_ms), ago(k.created_unix_ms, now_ms))),
    ];
    if k.updated_unix_ms > 0 {
        let when = format!("{} ({})", utc(k.updated_unix_ms), ago(k.updated_unix_ms, now_ms));
        rows.push(("updated", when));
    }
    match &k.failover_defaults {
        None => rows.push(("default chain", "none (requests name their models)".to_owned())),
        Some(d) => {
            rows.push(("default chain", chain(d)));
            let ms =
                |v: Option<u32>, default: &str| v.map_or(default.to_owned(), |v| format!("{v} ms"));
            rows.push(("timeout", ms(d.timeout_ms, "default (60000 ms)")));
            rows.push(("first token timeout", ms(d.first_token_timeout_ms, "default (10000 ms)")));
            rows.push(("fails over on", d.on.join(", ")));
        }
    }
    rows.push(("allowed models", list_or(&k.allowed_models, "all")));
    rows.push(("allowed regions", list_or(&k.allowed_regions, "all")));
    let width = rows.iter().map(|(label, _)| label.len()).max().unwrap_or(0) + 1;
    rows.iter().map(|(label, value)| format!("{:width$} {value}\n", format!("{label}:"))).collect()
}

/// The one time a secret is shown: it says so, because only its hash is kept.
pub fn key_secret(verb: &str, k: &KeyView, secret: &str) -> String {
    format!(
        "{verb} key {} ({})\n\n    {secret}\n\nThis secret will not be shown again: store it now. \
         Only its SHA-256 is kept.\n",
        k.id, k.name
    )
}

// === nodes ===

#[derive(Debug, Serialize)]
pub struct NodeView {
    pub node_id: String,
    pub listen_address: String,
    pub applied_version: i64,
    pub lag: i64,
    pub last_heartbeat_unix_ms: i64,
    pub control_plane: String,
    pub software_version: String,
    pub connected_unix_ms: i64,
    /// The last version the node refused, and why (`null` when it applied everything).
    pub rejected: Option<RejectedView>,
}

#[derive(Debug, Serialize)]
pub struct RejectedView {
    pub version: i64,
    pub error: String,
}

#[derive(Debug, Serialize)]
pub struct NodesView {
    pub config_version: i64,
    pub nodes: Vec<NodeView>,
}

impl From<pb::ListNodesResponse> for NodesView {
    fn from(r: pb::ListNodesResponse) -> Self {
        let nodes = r
            .nodes
            .into_iter()
            .map(|n| NodeView {
                node_id: n.node_id,
                listen_address: n.listen_address,
                applied_version: n.applied_version,
                lag: n.lag,
                last_heartbeat_unix_ms: n.last_heartbeat_unix_ms,
                control_plane: n.control_plane,
                software_version: n.software_version,
                connected_unix_ms: n.connected_unix_ms,
                rejected: (n.rejected_version > 0).then_some(RejectedView {
                    version: n.rejected_version,
                    error: n.rejected_error,
                }),
            })
            .collect();
        Self { config_version: r.config_version, nodes }
    }
}

pub fn nodes_table(v: &NodesView, now_ms: i64) -> String {
    if v.nodes.is_empty() {
        return format!("no nodes (config version {})\n", v.config_version);
    }
    let mut t = Table::new(["NODE", "LISTEN", "VERSION", "LAG", "LAST HEARTBEAT", "CONTROL PLANE"]);
    for n in &v.nodes {
        t.row(vec![
            n.node_id.clone(),
            n.listen_address.clone(),
            n.applied_version.to_string(),
            n.lag.to_string(),
            ago(n.last_heartbeat_unix_ms, now_ms),
            n.control_plane.clone(),
        ]);
    }
    let mut out = t.render();
    // Rejections below the table: an error message would stretch every row's columns.
    for n in &v.nodes {
        if let Some(r) = &n.rejected {
            out.push_str(&format!("{} rejected version {}: {}\n", n.node_id, r.version, r.error));
        }
    }
    out
}

// === breakers ===

#[derive(Debug, Serialize)]
pub struct BreakerView {
    pub node_id: String,
    pub provider: String,
    pub upstream_model: String,
    pub state: String,
    pub since_unix_ms: i64,
    pub failure_rate: f64,
    pub next_probe_unix_ms: i64,
    pub cause: String,
    pub cooldown_ms: u64,
}

impl From<pb::Breaker> for BreakerView {
    fn from(b: pb::Breaker) -> Self {
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
        }
    }
}

/// `in 12s`, `due` once passed; `-` when no probe is scheduled (the breaker is not open).
fn next_probe(unix_ms: i64, now_ms: i64) -> String {
    if unix_ms <= 0 {
        return "-".to_owned();
    }
    let ms = unix_ms - now_ms;
    if ms <= 0 {
        return "due".to_owned();
    }
    // Rounded up: "in 0s" for a probe still ahead would read as due.
    let secs = (ms + 999) / 1000;
    match secs {
        0..120 => format!("in {secs}s"),
        120..7200 => format!("in {}m", secs / 60),
        _ => format!("in {}h", secs / 3600),
    }
}

pub fn breakers_table(breakers: &[BreakerView], now_ms: i64) -> String {
    if breakers.is_empty() {
        return "no breakers reported\n".to_owned();
    }
    let mut t =
        Table::new(["NODE", "PROVIDER", "MODEL", "STATE", "SINCE", "FAILURE RATE", "NEXT PROBE"]);
    for b in breakers {
        let state =
            if b.cause.is_empty() { b.state.clone() } else { format!("{} ({})", b.state, b.cause) };
        t.row(vec![
            b.node_id.clone(),
            b.provider.clone(),
            b.upstream_model.clone(),
            state,
            ago(b.since_unix_ms, now_ms),
            format!("{:.0}%", b.failure_rate * 100.0),
            next_probe(b.next_probe_unix_ms, now_ms),
        ]);
    }
    t.render()
}

// === events ===

#[derive(Debug, Serialize)]
pub struct AttemptView {
    pub model: String,
    pub status: String,
    pub reason: String,
    pub latency_ms: u64,
    pub probe: bool,
}

/// A failover event; field names follow the stored audit record.
#[derive(Debug, Serialize)]
pub struct EventView {
    pub id: String,
    pub at_unix_ms: i64,
    pub node_id: String,
    pub key_id: String,
    pub requested_model: String,
    pub served_model: String,
    pub attempts: Vec<AttemptView>,
    pub stream: bool,
    pub status: u32,
}

impl From<switchyard_proto::node::v1::FailoverEvent> for EventView {
    fn from(e: switchyard_proto::node::v1::FailoverEvent) -> Self {
        Self {
            id: e.id,
            at_unix_ms: e.at_unix_ms,
            node_id: e.node_id,
            key_id: e.key_id,
            requested_model: e.requested_model,
            served_model: e.served_model,
            attempts: e
                .attempts
                .into_iter()
                .map(|a| AttemptView {
                    model: a.model,
                    status: a.status,
                    reason: a.reason,
                    latency_ms: a.latency_ms,
                    probe: a.probe,
                })
                .collect(),
            stream: e.stream,
            status: e.status,
        }
    }
}

/// `failed(timeout 30011ms)`, `served(734ms)`, `skipped(circuit_open)`; `probe` marks an
/// attempt made through an open breaker.
fn attempt(a: &AttemptView) -> String {
    let mut detail = Vec::new();
    if !a.reason.is_empty() {
        detail.push(a.reason.clone());
    }
    if a.status != "skipped" {
        detail.push(format!("{}ms", a.latency_ms));
    }
    if a.probe {
        detail.push("probe".to_owned());
    }
    format!("{} {}({})", a.model, a.status, detail.join(" "))
}

/// One line: when, which key, requested → served, then each attempt.
pub fn event_line(e: &EventView) -> String {
    let served = if e.served_model.is_empty() {
        format!("none ({})", e.status)
    } else {
        e.served_model.clone()
    };
    let key = if e.key_id.is_empty() { "-" } else { &e.key_id };
    let attempts: Vec<String> = e.attempts.iter().map(attempt).collect();
    format!(
        "{}  {key}  {} → {served}  {}\n",
        utc(e.at_unix_ms),
        e.requested_model,
        attempts.join(" → ")
    )
}

// === usage ===

#[derive(Debug, Serialize)]
pub struct UsageView {
    pub key_id: String,
    pub model: String,
    pub requests: u64,
    pub prompt_tokens: u64,
    pub completion_tokens: u64,
    pub cost_usd: f64,
}

impl From<pb::UsageRow> for UsageView {
    fn from(r: pb::UsageRow) -> Self {
        Self {
            key_id: r.key_id,
            model: r.model,
            requests: r.requests,
            prompt_tokens: r.prompt_tokens,
            completion_tokens: r.completion_tokens,
            cost_usd: r.cost_usd,
        }
    }
}

pub fn usage_table(rows: &[UsageView]) -> String {
    if rows.is_empty() {
        return "no usage recorded\n".to_owned();
    }
    let mut t =
        Table::new(["KEY", "MODEL", "REQUESTS", "PROMPT TOKENS", "COMPLETION TOKENS", "COST USD"]);
    for r in rows {
        t.row(vec![
            r.key_id.clone(),
            r.model.clone(),
            r.requests.to_string(),
            r.prompt_tokens.to_string(),
            r.completion_tokens.to_string(),
            // Nano models cost fractions of a cent per request.
            format!("{:.6}", r.cost_usd),
        ]);
    }
    t.render()
}

// === apply ===

#[derive(Debug, Serialize)]
pub struct ApplyView {
    pub changes: Vec<String>,
    pub applied: bool,
    pub dry_run: bool,
    pub version: i64,
}

pub fn apply_result(v: &ApplyView) -> String {
    let mut out: String = v.changes.iter().map(|c| format!("{c}\n")).collect();
    if v.changes.is_empty() {
        out.push_str("no changes\n");
    }
    if v.dry_run {
        out.push_str("dry run: nothing was applied\n");
    } else if v.applied {
        out.push_str(&format!("applied: catalog version {}\n", v.version));
    }
    out
}

// === webhooks ===

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

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn table_columns_are_aligned_without_trailing_spaces() {
        let mut t = Table::new(["ID", "NAME", "CHAIN"]);
        t.row(vec!["k1".into(), "a-long-name".into(), "a → b".into()]);
        t.row(vec!["key-22".into(), "x".into(), "-".into()]);
        assert_eq!(
            t.render(),
            "ID      NAME         CHAIN\n\
             k1      a-long-name  a → b\n\
             key-22  x            -\n"
        );
    }

    #[test]
    fn ages_read_as_people_say_them() {
        let now = 1_000_000_000;
        assert_eq!(ago(now - 3_400, now), "3s ago");
        assert_eq!(ago(now - 125_000, now), "2m ago");
        assert_eq!(ago(now - 7_200_000, now), "2h ago");
        assert_eq!(ago(now - 3 * 86_400_000, now), "3d ago");
        assert_eq!(ago(now + 5_000, now), "0s ago");
        assert_eq!(ago(0, now), "never");
    }

    #[test]
    fn utc_timestamps_are_calendar_dates() {
        assert_eq!(utc(0), "1970-01-01 00:00:00 UTC");
        assert_eq!(utc(951_782_400_000), "2000-02-29 00:00:00 UTC");
        assert_eq!(utc(1_796_219_557_000), "2026-12-02 13:52:37 UTC");
    }

    fn key() -> KeyView {
        KeyView::from(pb::ApiKey {
            id: "key_1".into(),
            name: "app".into(),
            created_unix_ms: 1_000,
            status: "active".into(),
            secret_hint: "wxyz".into(),
            failover_defaults: Some(pb::FailoverDefaults {
                models: vec!["a".into(), "b".into()],
                timeout_ms: Some(20_000),
                first_token_timeout_ms: None,
                on: vec![],
            }),
            allowed_models: vec![],
            allowed_regions: vec!["eu".into()],
            updated_unix_ms: 0,
        })
    }

    #[test]
    fn created_key_json_carries_id_name_and_secret() {
        let v = KeySecretView {
            key: key(),
            secret: "sy-secret".into(),
            warnings: vec!["w".into()],
            version: 9,
        };
        let j: serde_json::Value = serde_json::from_str(&json(&v).unwrap()).unwrap();
        assert_eq!(j["id"], "key_1");
        assert_eq!(j["name"], "app");
        assert_eq!(j["key"], "sy-secret");
        assert_eq!(j["warnings"][0], "w");
        assert_eq!(j["failoverDefaults"]["on"].as_array().unwrap().len(), 4);
    }

    #[test]
    fn a_shown_secret_says_it_will_not_be_shown_again() {
        let text = key_secret("Created", &key(), "sy-secret");
        assert!(text.contains("sy-secret") && text.contains("will not be shown again"), "{text}");
    }

    #[test]
    fn key_listing_shows_hint_and_chain_never_the_secret() {
        let text = keys_table(&[key()], 61_000);
        assert!(text.contains("sy-…wxyz") && text.contains("a → b") && text.contains("1m ago"));
        let details = key_details(&key(), 61_000);
        assert!(details.contains("timeout:             20000 ms"), "{details}");
        assert!(details.contains("allowed regions:     eu"), "{details}");
    }

    #[test]
    fn nodes_table_shows_heartbeat_age() {
        let v = NodesView::from(pb::ListNodesResponse {
            nodes: vec![pb::Node {
                node_id: "n1".into(),
                listen_address: "10.0.0.1:8080".into(),
                applied_version: 41,
                lag: 1,
                last_heartbeat_unix_ms: 7_000,
                control_plane: "cp-a".into(),
                ..Default::default()
            }],
            config_version: 42,
        });
        let text = nodes_table(&v, 10_000);
        let lines: Vec<&str> = text.lines().collect();
        assert_eq!(lines[0], "NODE  LISTEN         VERSION  LAG  LAST HEARTBEAT  CONTROL PLANE");
        assert_eq!(lines[1], "n1    10.0.0.1:8080  41       1    3s ago          cp-a");
    }

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
             openai/gpt-5-nano failed(timeout 30011ms) → anthropic/claude-sonnet-4 served(734ms)\n"
        );
    }

    #[test]
    fn breakers_show_rate_and_time_to_the_next_probe() {
        let b = BreakerView::from(pb::Breaker {
            node_id: "n1".into(),
            provider: "openai".into(),
            upstream_model: "gpt-5-nano".into(),
            state: "open".into(),
            since_unix_ms: 5_000,
            failure_rate: 0.625,
            next_probe_unix_ms: 40_000,
            cause: "failure_rate".into(),
            cooldown_ms: 30_000,
        });
        let text = breakers_table(&[b], 10_000);
        let lines: Vec<&str> = text.lines().collect();
        assert_eq!(
            lines[0],
            "NODE  PROVIDER  MODEL       STATE                SINCE   FAILURE RATE  NEXT PROBE"
        );
        assert_eq!(
            lines[1],
            "n1    openai    gpt-5-nano  open (failure_rate)  5s ago  62%           in 30s"
        );
    }

    #[test]
    fn usage_table_lists_cost_to_the_micro_dollar() {
        let rows = [UsageView::from(pb::UsageRow {
            key_id: "key_1".into(),
            model: "m".into(),
            requests: 3,
            prompt_tokens: 30,
            completion_tokens: 12,
            cost_usd: 0.0000063,
        })];
        let text = usage_table(&rows);
        assert!(
            text.ends_with("key_1  m      3         30             12                 0.000006\n"),
            "{text}"
        );
    }

    #[test]
    fn apply_says_no_changes_and_dry_run() {
        let v = ApplyView { changes: vec![], applied: false, dry_run: true, version: 0 };
        assert_eq!(apply_result(&v), "no changes\ndry run: nothing was applied\n");
        let v = ApplyView {
            changes: vec!["+ models/x".into(), "- webhooks/oncall".into()],
            applied: true,
            dry_run: false,
            version: 7,
        };
        assert_eq!(apply_result(&v), "+ models/x\n- webhooks/oncall\napplied: catalog version 7\n");
    }
}
