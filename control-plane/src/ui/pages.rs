//! What each console page shows, read from the admin API's service in process.

use std::collections::{BTreeMap, BTreeSet};
use std::fmt::Write as _;

use axum::body::Bytes;
use futures_util::StreamExt;
use switchyard_proto::admin::v1 as pb;
use switchyard_proto::admin::v1::admin_server::Admin;
use switchyard_proto::node::BreakerState;
use switchyard_proto::node::v1::FailoverEvent;
use switchyard_time::now_ms;
use tonic::{Request, Status};

use super::drill::{DRILL_TTL, DrillRun, Scenario};
use super::html::{age, esc, table, time};
use crate::admin::AdminService;
use crate::faults;

/// Rows a listing page shows at most (the CLI pages through more).
const PAGE_ROWS: u32 = 500;
/// Failover events the live page starts with.
const LIVE_ROWS: u32 = 50;
/// Events a drill's verdict is judged from, newest first.
const DRILL_EVENTS: u32 = 2000;
/// Breaker transitions the breakers page lists.
const RECENT_TRANSITIONS: usize = 20;

pub fn login(problem: Option<&str>) -> String {
    let problem = problem
        .map(|p| format!("<p class=\"error\" role=\"alert\" id=\"login-error\">{}</p>", esc(p)))
        .unwrap_or_default();
    format!(
        "{problem}<form method=\"post\" action=\"/ui/login\" class=\"login\">\
         <label for=\"token\">Admin token</label>\
         <input id=\"token\" name=\"token\" type=\"password\" autocomplete=\"current-password\" required autofocus>\
         <button type=\"submit\">Sign in</button></form>\
         <p class=\"hint\">The control plane's admin token (<code>SWITCHYARD_ADMIN_TOKEN</code>). It is kept in \
         a cookie scripts cannot read, and sent to this control plane only.</p>"
    )
}

// === fleet ===

pub async fn fleet(admin: &AdminService) -> Result<String, Status> {
    let reply = admin
        .list_nodes(Request::new(pb::ListNodesRequest { limit: PAGE_ROWS, ..Default::default() }))
        .await?
        .into_inner();
    let now = now_ms();
    let rows: Vec<Vec<String>> = reply
        .nodes
        .iter()
        .map(|n| {
            let rejected = if n.rejected_version > 0 {
                format!("v{}: {}", n.rejected_version, esc(&n.rejected_error))
            } else {
                "none".into()
            };
            vec![
                esc(&n.node_id),
                esc(&n.listen_address),
                esc(&n.software_version),
                format!("v{}", n.applied_version),
                n.lag.to_string(),
                rejected,
                age(now, n.last_heartbeat_unix_ms),
                time(n.connected_unix_ms),
                esc(&n.control_plane),
            ]
        })
        .collect();
    let more = if reply.next_page_token.is_empty() {
        String::new()
    } else {
        format!("<p>The first {PAGE_ROWS} nodes; <code>switchyard nodes</code> lists them all.</p>")
    };
    Ok(format!(
        "<p>Config version <strong id=\"config-version\">v{}</strong>; {} node(s) connected.</p>\
         <div data-refresh=\"nodes\">{}</div>{more}",
        reply.config_version,
        reply.nodes.len(),
        table(
            "nodes",
            "Nodes, their config versions (ack) and last heartbeat",
            &[
                "Node",
                "Address",
                "Version",
                "Applied config",
                "Lag",
                "Rejected (NACK)",
                "Heartbeat age",
                "Connected",
                "Control plane"
            ],
            &rows,
            "No node is connected.",
        )
    ))
}

// === breakers ===

/// The gateway models served by each (provider, upstream model), from the catalog.
async fn models_by_deployment(
    admin: &AdminService,
) -> Result<BTreeMap<(String, String), Vec<String>>, Status> {
    let catalog = admin.get_catalog(Request::new(pb::GetCatalogRequest {})).await?.into_inner();
    let value: serde_json::Value = serde_json::from_str(&catalog.catalog_json).unwrap_or_default();
    let mut out: BTreeMap<(String, String), Vec<String>> = BTreeMap::new();
    let text =
        |v: &serde_json::Value, k: &str| v.get(k).and_then(|s| s.as_str()).unwrap_or("").to_owned();
    for model in value.get("models").and_then(|m| m.as_array()).into_iter().flatten() {
        let name = text(model, "name");
        let deployments = model.get("deployments").and_then(|d| d.as_array());
        match deployments {
            Some(ds) => {
                for d in ds {
                    out.entry((text(d, "provider"), text(d, "upstream_model")))
                        .or_default()
                        .push(name.clone());
                }
            }
            None => out
                .entry((text(model, "provider"), text(model, "upstream_model")))
                .or_default()
                .push(name),
        }
    }
    Ok(out)
}

fn state_cell(state: &str) -> String {
    format!("<span class=\"state state-{0}\">{0}</span>", esc(state))
}

pub async fn breakers(admin: &AdminService) -> Result<String, Status> {
    let listed = admin.list_breakers(Request::new(pb::ListBreakersRequest {})).await?.into_inner();
    let breakers = listed.breakers;
    // Deployments open for the whole fleet (docs/operating.md, "The fleet's breaker view").
    let open_for_fleet: BTreeMap<(String, String), _> =
        listed.fleet.iter().map(|f| ((f.provider.clone(), f.upstream_model.clone()), f)).collect();
    let models = models_by_deployment(admin).await.unwrap_or_default();
    let now = now_ms();
    // The fleet's view of a deployment: open when any node holds it open (every node then
    // skips it), half-open while one probes it, closed otherwise.
    let mut fleet: BTreeMap<(String, String), (usize, usize, usize)> = BTreeMap::new();
    for key in open_for_fleet.keys() {
        fleet.entry(key.clone()).or_default();
    }
    for b in &breakers {
        let e = fleet.entry((b.provider.clone(), b.upstream_model.clone())).or_default();
        e.0 += 1;
        match BreakerState::parse(&b.state) {
            Some(BreakerState::Open) => e.1 += 1,
            Some(BreakerState::HalfOpen) => e.2 += 1,
            _ => {}
        }
    }
    let fleet_rows: Vec<Vec<String>> = fleet
        .iter()
        .map(|((provider, upstream), (nodes, open, half))| {
            let shared = open_for_fleet.get(&(provider.clone(), upstream.clone()));
            let state = if shared.is_some() {
                "open (fleet)"
            } else if *open > 0 {
                BreakerState::Open.as_str()
            } else if *half > 0 {
                BreakerState::HalfOpen.as_str()
            } else {
                BreakerState::Closed.as_str()
            };
            let served = models
                .get(&(provider.clone(), upstream.clone()))
                .map(|m| m.join(", "))
                .unwrap_or_default();
            vec![
                esc(&served),
                format!("{} / {}", esc(provider), esc(upstream)),
                state_cell(state),
                format!("{open} open, {half} half-open of {nodes} reporting"),
                shared.map_or_else(
                    || "—".to_owned(),
                    |f| format!("{} ({} ago)", esc(&f.opened_by), age(now, f.since_unix_ms)),
                ),
                shared.map_or_else(|| "—".to_owned(), |f| esc(&f.prober)),
            ]
        })
        .collect();
    let node_rows: Vec<Vec<String>> = breakers
        .iter()
        .map(|b| {
            vec![
                esc(&b.node_id),
                format!("{} / {}", esc(&b.provider), esc(&b.upstream_model)),
                state_cell(&b.state),
                format!("{} ({} ago)", time(b.since_unix_ms), age(now, b.since_unix_ms)),
                format!("{:.0} %", b.failure_rate * 100.0),
                esc(&b.cause),
                if b.state == BreakerState::Open.as_str() {
                    time(b.next_probe_unix_ms)
                } else {
                    "—".into()
                },
                if b.last_probe_unix_ms > 0 {
                    format!(
                        "{} {} ({} ms)",
                        time(b.last_probe_unix_ms),
                        esc(&b.last_probe_outcome),
                        b.last_probe_latency_ms
                    )
                } else {
                    "never".into()
                },
            ]
        })
        .collect();
    let mut recent: Vec<&pb::Breaker> = breakers.iter().filter(|b| b.since_unix_ms > 0).collect();
    recent.sort_by_key(|b| std::cmp::Reverse(b.since_unix_ms));
    let recent_rows: Vec<Vec<String>> = recent
        .iter()
        .take(RECENT_TRANSITIONS)
        .map(|b| {
            vec![
                time(b.since_unix_ms),
                esc(&b.node_id),
                format!("{} / {}", esc(&b.provider), esc(&b.upstream_model)),
                state_cell(&b.state),
                esc(&b.cause),
            ]
        })
        .collect();
    Ok(format!(
        "<div data-refresh=\"breakers\">{}{}{}</div>",
        table(
            "fleet-breakers",
            "The fleet's view, per model and deployment",
            &["Models", "Deployment", "Fleet state", "Nodes", "Opened by", "Prober"],
            &fleet_rows,
            "No breaker reported yet."
        ),
        table(
            "node-breakers",
            "Each node's breakers",
            &[
                "Node",
                "Deployment",
                "State",
                "Since",
                "Failure rate",
                "Cause",
                "Next probe",
                "Last probe"
            ],
            &node_rows,
            "No breaker reported yet."
        ),
        table(
            "transitions",
            "Recent transitions (each breaker's latest)",
            &["At", "Node", "Deployment", "To", "Cause"],
            &recent_rows,
            "No transition yet."
        ),
    ))
}

// === failovers, live ===

/// The event's kind as its webhook names it, without the `api:` prefix.
fn kind(e: &FailoverEvent) -> &'static str {
    let event_type = e.event_type();
    event_type.strip_prefix("api:").unwrap_or(event_type)
}

/// One audit-log event as plain-text table cells (escaped by whoever renders them).
pub fn event_cells(e: &FailoverEvent) -> Vec<String> {
    let attempts = e
        .attempts
        .iter()
        .map(|a| {
            let mut s = format!("{} {}", a.model, a.status);
            if !a.reason.is_empty() {
                let _ = write!(s, " ({})", a.reason);
            }
            if !a.injected.is_empty() {
                let _ = write!(s, " [fault {}]", a.injected);
            }
            s
        })
        .collect::<Vec<_>>()
        .join(" → ");
    let continued = e
        .continued
        .iter()
        .map(|c| format!("{} at char {}: {} ({})", c.model, c.at_char, c.outcome, c.reason))
        .collect::<Vec<_>>()
        .join("; ");
    let lost = e.lost.as_ref().map(|l| format!("{} lost ({})", l.count, l.reason));
    vec![
        switchyard_time::rfc3339_ms(e.at_unix_ms),
        kind(e).to_owned(),
        e.node_id.clone(),
        e.key_id.clone(),
        e.requested_model.clone(),
        if e.served_model.is_empty() { "—".into() } else { e.served_model.clone() },
        if e.status == 0 { String::new() } else { e.status.to_string() },
        lost.unwrap_or(attempts),
        continued,
    ]
}

const EVENT_HEAD: [&str; 9] =
    ["At", "Event", "Node", "Key", "Requested", "Served", "Status", "Attempts", "Continued"];

pub async fn live(admin: &AdminService) -> Result<String, Status> {
    let events = read_events(admin, LIVE_ROWS, "").await?;
    let rows: Vec<Vec<String>> =
        events.iter().rev().map(|e| event_cells(e).iter().map(|c| esc(c)).collect()).collect();
    let mut t = table(
        "events",
        "Failovers, degraded answers and continued streams, newest first",
        &EVENT_HEAD,
        &rows,
        "No failover yet.",
    );
    // Each row carries its event id, so the stream adds only events not shown yet.
    for e in events.iter().rev() {
        t = t.replacen(
            "<tr><td>",
            &format!("<tr data-id=\"{}\" class=\"row\"><td>", esc(&e.id)),
            1,
        );
    }
    Ok(format!(
        "<p id=\"live-status\" role=\"status\" aria-live=\"polite\" data-stream=\"/ui/live/stream\">\
         New events appear at the top as they arrive (with JavaScript); without it, reload the page.</p>{t}"
    ))
}

/// The newest `limit` events (of `key_id`, or all), oldest first.
async fn read_events(
    admin: &AdminService,
    limit: u32,
    key_id: &str,
) -> Result<Vec<FailoverEvent>, Status> {
    let mut stream = admin
        .list_events(Request::new(pb::ListEventsRequest {
            limit,
            follow: false,
            key_id: key_id.to_owned(),
        }))
        .await?
        .into_inner();
    let mut events = Vec::new();
    while let Some(event) = stream.next().await {
        events.push(event?);
    }
    Ok(events)
}

pub async fn follow_events(
    admin: &AdminService,
) -> Result<<AdminService as Admin>::ListEventsStream, Status> {
    // The newest few come first: the page has them already and the script skips them by
    // id, but one written between the page and the stream is not lost.
    Ok(admin
        .list_events(Request::new(pb::ListEventsRequest {
            limit: 10,
            follow: true,
            key_id: String::new(),
        }))
        .await?
        .into_inner())
}

pub fn sse_event(e: &FailoverEvent) -> Bytes {
    let data = serde_json::json!({"id": e.id, "cells": event_cells(e)});
    // JSON has no raw newline, so one `data:` line carries it.
    Bytes::from(format!("event: failover\ndata: {data}\n\n"))
}

// === drills ===

/// A problem with one field of the drill form.
pub type FieldProblems = Vec<(String, String)>;

const DRILL_FIELDS: [&str; 5] = ["csrf", "scenario", "node", "key", "model"];

pub async fn drills(
    admin: &AdminService,
    csrf: &str,
    runs: &[DrillRun],
    retry: Option<(&[(String, String)], &FieldProblems)>,
) -> Result<String, Status> {
    let nodes = admin
        .list_nodes(Request::new(pb::ListNodesRequest { limit: PAGE_ROWS, ..Default::default() }))
        .await?
        .into_inner()
        .nodes;
    let keys = admin
        .list_keys(Request::new(pb::ListKeysRequest {
            limit: PAGE_ROWS,
            status: "active".into(),
            ..Default::default()
        }))
        .await?
        .into_inner()
        .keys;
    let models: BTreeSet<String> =
        models_by_deployment(admin).await?.into_values().flatten().collect();
    let faults =
        admin.list_faults(Request::new(pb::ListFaultsRequest {})).await?.into_inner().faults_json;

    let typed =
        |name: &str| retry.and_then(|(f, _)| super::form::field(f, name)).unwrap_or("").to_owned();
    let mut out = String::new();
    if let Some((_, problems)) = retry {
        out.push_str("<div class=\"error\" role=\"alert\" id=\"form-errors\"><p>The drill was not started:</p><ul>");
        for (field, problem) in problems.iter() {
            let _ = write!(out, "<li><strong>{}</strong>: {}</li>", esc(field), esc(problem));
        }
        out.push_str("</ul></div>");
    }
    let select = |name: &str, label: &str, options: Vec<(String, String)>| {
        let chosen = typed(name);
        let mut s = format!(
            "<label for=\"drill-{name}\">{label}</label><select id=\"drill-{name}\" name=\"{name}\" required><option value=\"\">choose…</option>"
        );
        for (value, text) in options {
            let sel = if value == chosen { " selected" } else { "" };
            let _ = write!(s, "<option value=\"{}\"{sel}>{}</option>", esc(&value), esc(&text));
        }
        s.push_str("</select>");
        s
    };
    let _ = write!(
        out,
        "<form method=\"post\" action=\"/ui/drills\" class=\"drill\" id=\"drill-form\">\
         <input type=\"hidden\" name=\"csrf\" value=\"{}\">{}{}{}{}\
         <p class=\"hint\">The drill injects its faults for {} (or until cleared), only for the key's calls; \
         its verdict is judged from that key's requests through that node, as the audit log records them.</p>\
         <button type=\"submit\">Run drill</button></form>",
        esc(csrf),
        select(
            "scenario",
            "Scenario",
            Scenario::ALL
                .iter()
                .map(|s| (s.name().to_owned(), format!("{}: {}", s.name(), s.describe())))
                .collect()
        ),
        select(
            "node",
            "Node",
            nodes
                .iter()
                .map(|n| (n.node_id.clone(), format!("{} ({})", n.node_id, n.listen_address)))
                .collect()
        ),
        select(
            "key",
            "API key",
            keys.iter().map(|k| (k.id.clone(), format!("{} ({})", k.name, k.id))).collect()
        ),
        select(
            "model",
            "Model (the chain's first)",
            models.iter().map(|m| (m.clone(), m.clone())).collect()
        ),
        switchyard_time::format_duration(DRILL_TTL),
    );

    let fault_rows: Vec<Vec<String>> = faults
        .iter()
        .filter_map(|f| serde_json::from_str::<switchyard_catalog::fault::Fault>(f).ok())
        .map(|f| {
            let target = match &f.target {
                switchyard_catalog::fault::FaultTarget::Model(m) => format!("model {m}"),
                switchyard_catalog::fault::FaultTarget::Provider(p) => format!("provider {p}"),
            };
            vec![
                esc(&f.name),
                esc(&target),
                esc(f.key_id.as_deref().unwrap_or("every key")),
                esc(f.kind.flag()),
                format!("{:.0} %", f.rate * 100.0),
                time(f.expires_at_unix_ms),
                format!(
                    "<form method=\"post\" action=\"/ui/drills/clear\"><input type=\"hidden\" name=\"csrf\" value=\"{}\">\
                     <input type=\"hidden\" name=\"name\" value=\"{}\"><button type=\"submit\" aria-label=\"Clear fault {}\">Clear</button></form>",
                    esc(csrf), esc(&f.name), esc(&f.name)
                ),
            ]
        })
        .collect();
    out.push_str("<h2>Faults in force</h2>");
    out.push_str(&table(
        "faults",
        "Injected faults (drills and switchyard chaos)",
        &["Name", "Target", "Key", "Kind", "Rate", "Expires", "Action"],
        &fault_rows,
        "No fault is in force.",
    ));
    if !fault_rows.is_empty() {
        let _ = write!(
            out,
            "<form method=\"post\" action=\"/ui/drills/clear\"><input type=\"hidden\" name=\"csrf\" value=\"{}\">\
             <input type=\"hidden\" name=\"all\" value=\"1\"><button type=\"submit\" id=\"clear-all\">Clear all faults</button></form>",
            esc(csrf)
        );
    }
    let run_rows: Vec<Vec<String>> = runs
        .iter()
        .map(|r| {
            vec![
                format!("<a href=\"/ui/drills/run?id={}\">#{}</a>", r.id, r.id),
                esc(r.scenario.name()),
                esc(&r.node_id),
                esc(&r.key_id),
                esc(&r.model),
                time(r.started_unix_ms),
            ]
        })
        .collect();
    out.push_str("<h2>Drills run from this control plane</h2>");
    out.push_str(&table(
        "drills",
        "Drills, newest first",
        &["Drill", "Scenario", "Node", "Key", "Model", "Started"],
        &run_rows,
        "No drill yet.",
    ));
    Ok(out)
}

/// Starts the drill the form asks for, or names each field that is missing, unknown or
/// wrong (and starts nothing).
pub async fn start_drill(
    admin: &AdminService,
    fields: &[(String, String)],
    id: u64,
) -> Result<DrillRun, FieldProblems> {
    let mut problems: FieldProblems = Vec::new();
    for (name, _) in fields {
        if !DRILL_FIELDS.contains(&name.as_str()) && !problems.iter().any(|(n, _)| n == name) {
            problems.push((name.clone(), "unknown field".into()));
        }
    }
    let value = |name: &str| super::form::field(fields, name).map(str::trim).unwrap_or("");
    let missing = |name: &str, problems: &mut FieldProblems| {
        let v = value(name);
        if v.is_empty() {
            problems.push((name.to_owned(), "missing: choose one".into()));
        }
        v.to_owned()
    };
    let scenario = missing("scenario", &mut problems);
    let node = missing("node", &mut problems);
    let key = missing("key", &mut problems);
    let model = missing("model", &mut problems);
    let scenario_kind = Scenario::parse(&scenario);
    if !scenario.is_empty() && scenario_kind.is_none() {
        let names: Vec<&str> = Scenario::ALL.iter().map(|s| s.name()).collect();
        problems
            .push(("scenario".into(), format!("unknown scenario; one of {}", names.join(", "))));
    }
    let unavailable = |e: Status| {
        vec![("form".to_owned(), format!("the control plane could not check it: {}", e.message()))]
    };
    if !node.is_empty() {
        let nodes = admin
            .list_nodes(Request::new(pb::ListNodesRequest::default()))
            .await
            .map_err(unavailable)?
            .into_inner()
            .nodes;
        if !nodes.iter().any(|n| n.node_id == node) {
            problems.push(("node".into(), "no connected node has this id".into()));
        }
    }
    let mut chain = vec![model.clone()];
    if !key.is_empty() {
        match admin.get_key(Request::new(pb::KeyIdRequest { id: key.clone() })).await {
            Ok(reply) => {
                let k = reply.into_inner().key.unwrap_or_default();
                if k.status != "active" {
                    problems.push(("key".into(), format!("the key is {}", k.status)));
                }
                for m in k.failover_defaults.map(|d| d.models).unwrap_or_default() {
                    if !chain.contains(&m) {
                        chain.push(m);
                    }
                }
            }
            Err(s) if s.code() == tonic::Code::NotFound => {
                problems.push(("key".into(), "no key has this id".into()))
            }
            Err(s) => return Err(unavailable(s)),
        }
    }
    if !model.is_empty() {
        let models: BTreeSet<String> = models_by_deployment(admin)
            .await
            .map_err(unavailable)?
            .into_values()
            .flatten()
            .collect();
        if !models.contains(&model) {
            problems.push(("model".into(), "not a model of the catalog".into()));
        }
    }
    let Some(scenario) = scenario_kind.filter(|_| problems.is_empty()) else {
        return Err(problems);
    };
    if matches!(scenario, Scenario::PrimaryDown | Scenario::PrimaryFlaky) && chain.len() < 2 {
        return Err(vec![(
            "key".into(),
            format!(
                "{} needs a chain of two models or more: the key's failoverDefaults name no model after {model}",
                scenario.name()
            ),
        )]);
    }
    let tag = format!("{:06x}", rand::random::<u32>() & 0xff_ffff);
    let started_unix_ms = now_ms();
    let mut injected = Vec::new();
    for fault in scenario.faults(&tag, &key, &model, &chain) {
        match faults::inject(admin.store.as_ref(), &admin.layout, fault, DRILL_TTL).await {
            Ok((fault, _)) => injected.push(fault.name),
            Err(e) => {
                // A drill half injected is no drill: what landed is taken back.
                for name in &injected {
                    let _ = faults::clear(admin.store.as_ref(), &admin.layout, name).await;
                }
                return Err(vec![("fault".into(), e.to_string())]);
            }
        }
    }
    Ok(DrillRun {
        id,
        scenario,
        node_id: node,
        key_id: key,
        model,
        faults: injected,
        started_unix_ms,
    })
}

pub async fn drill_run(admin: &AdminService, csrf: &str, run: &DrillRun) -> Result<String, Status> {
    let events = read_events(admin, DRILL_EVENTS, &run.key_id).await?;
    let verdict = run.verdict(&events);
    let mine = events
        .iter()
        .rev()
        .filter(|e| e.node_id == run.node_id && e.at_unix_ms >= run.started_unix_ms)
        .filter(|e| e.attempts.iter().any(|a| run.faults.contains(&a.injected)))
        .take(LIVE_ROWS as usize)
        .map(|e| event_cells(e).iter().map(|c| esc(c)).collect())
        .collect::<Vec<Vec<String>>>();
    let faults = run
        .faults
        .iter()
        .map(|f| format!("<input type=\"hidden\" name=\"name\" value=\"{}\">", esc(f)))
        .collect::<String>();
    Ok(format!(
        "<h2>Drill #{id}: {scenario}</h2>\
         <dl><dt>Scenario</dt><dd>{scenario}: {describe}</dd><dt>Node</dt><dd>{node}</dd><dt>Key</dt><dd>{key}</dd>\
         <dt>Model</dt><dd>{model}</dd><dt>Faults</dt><dd>{fault_names}</dd><dt>Started</dt><dd>{started}</dd></dl>\
         <div data-refresh=\"verdict\" id=\"verdict-box\"><p id=\"verdict\" class=\"verdict verdict-{word}\" role=\"status\" aria-live=\"polite\">\
         Verdict: <strong>{word}</strong> — {detail}</p>{table}</div>\
         <form method=\"post\" action=\"/ui/drills/clear\"><input type=\"hidden\" name=\"csrf\" value=\"{csrf}\">{faults}\
         <input type=\"hidden\" name=\"back\" value=\"/ui/drills/run?id={id}\">\
         <button type=\"submit\" id=\"clear-drill\">Clear this drill's faults</button></form>\
         <p><a href=\"/ui/drills\">All drills</a></p>",
        id = run.id,
        scenario = esc(run.scenario.name()),
        describe = esc(run.scenario.describe()),
        node = esc(&run.node_id),
        key = esc(&run.key_id),
        model = esc(&run.model),
        fault_names = esc(&run.faults.join(", ")),
        started = time(run.started_unix_ms),
        word = verdict.word(),
        detail = esc(verdict.detail()),
        table = table(
            "drill-events",
            "The drill's requests, newest first",
            &EVENT_HEAD,
            &mine,
            "None yet."
        ),
        csrf = esc(csrf),
    ))
}

pub async fn clear_faults(admin: &AdminService, names: &[String], all: bool) -> Result<(), String> {
    if all {
        return faults::clear_all(admin.store.as_ref(), &admin.layout)
            .await
            .map(|_| ())
            .map_err(|e| e.to_string());
    }
    if names.is_empty() {
        return Err("name: name a fault to clear".into());
    }
    for name in names {
        match faults::clear(admin.store.as_ref(), &admin.layout, name).await {
            // Its TTL ended already: nothing left to clear.
            Ok(_) | Err(faults::FaultError::NotFound(_)) => {}
            Err(e) => return Err(e.to_string()),
        }
    }
    Ok(())
}

// === keys ===

pub async fn keys(admin: &AdminService) -> Result<String, Status> {
    let reply = admin
        .list_keys(Request::new(pb::ListKeysRequest { limit: PAGE_ROWS, ..Default::default() }))
        .await?
        .into_inner();
    let usage = admin.get_usage(Request::new(pb::GetUsageRequest::default())).await?.into_inner();
    let opt = |v: Option<u64>| v.map_or("—".to_owned(), |v| v.to_string());
    // No secret, and not even its hint: the page is for limits and usage.
    let key_rows: Vec<Vec<String>> = reply
        .keys
        .iter()
        .map(|k| {
            let limits = k.limits.unwrap_or_default();
            vec![
                esc(&k.id),
                esc(&k.name),
                esc(&k.status),
                time(k.created_unix_ms),
                esc(&k.failover_defaults.as_ref().map(|d| d.models.join(", ")).unwrap_or_default()),
                esc(&k.allowed_models.join(", ")),
                opt(limits.rpm),
                opt(limits.tpm),
                opt(limits.tokens_per_day),
                limits.usd_per_day.map_or("—".to_owned(), |v| format!("{v:.2}")),
            ]
        })
        .collect();
    let usage_rows: Vec<Vec<String>> = usage
        .rows
        .iter()
        .map(|r| {
            vec![
                esc(&r.key_id),
                esc(&r.model),
                r.requests.to_string(),
                r.prompt_tokens.to_string(),
                r.completion_tokens.to_string(),
                format!("{:.4}", r.cost_usd),
            ]
        })
        .collect();
    let limit_rows: Vec<Vec<String>> = usage
        .limits
        .iter()
        .map(|l| {
            vec![
                esc(&l.key_id),
                esc(&l.limit),
                format!("{}", l.value),
                format!("{}", l.used),
                time(l.reset_unix_ms),
            ]
        })
        .collect();
    Ok(format!(
        "{}{}{}",
        table(
            "keys",
            "API keys (no secrets)",
            &[
                "Id",
                "Name",
                "Status",
                "Created",
                "Failover models",
                "Allowed models",
                "RPM",
                "TPM",
                "Tokens/day",
                "USD/day"
            ],
            &key_rows,
            "No key yet."
        ),
        table(
            "usage",
            "Usage per key and model (fleet-wide)",
            &["Key", "Model", "Requests", "Prompt tokens", "Completion tokens", "Cost (USD)"],
            &usage_rows,
            "No usage reported yet."
        ),
        table(
            "limits",
            "Limited keys against their limits",
            &["Key", "Limit", "Value", "Used", "Resets"],
            &limit_rows,
            "No key has limits."
        ),
    ))
}

// === webhooks ===

pub async fn webhooks(admin: &AdminService) -> Result<String, Status> {
    let catalog = admin.get_catalog(Request::new(pb::GetCatalogRequest {})).await?.into_inner();
    let value: serde_json::Value = serde_json::from_str(&catalog.catalog_json).unwrap_or_default();
    let names: Vec<String> = value
        .get("webhooks")
        .and_then(|w| w.as_array())
        .into_iter()
        .flatten()
        .filter_map(|w| w.get("name").and_then(|n| n.as_str()).map(str::to_owned))
        .collect();
    if names.is_empty() {
        return Ok("<p>The catalog has no webhook.</p>".into());
    }
    let mut summary = Vec::new();
    let mut out = String::new();
    for name in &names {
        let d = admin
            .list_deliveries(Request::new(pb::ListDeliveriesRequest {
                webhook: name.clone(),
                limit: 20,
            }))
            .await?
            .into_inner();
        summary.push(vec![
            esc(&d.webhook),
            d.backlog.to_string(),
            d.delivered.to_string(),
            d.dead.to_string(),
            d.consecutive_failures.to_string(),
            if d.last_status == 0 { "—".into() } else { d.last_status.to_string() },
            esc(&d.last_error),
            time(d.last_success_unix_ms),
            esc(&d.leader),
        ]);
        let rows: Vec<Vec<String>> = d
            .deliveries
            .iter()
            .map(|x| {
                vec![
                    esc(&x.event_id),
                    esc(&x.event_type),
                    time(x.at_unix_ms),
                    esc(&x.state),
                    x.attempts.to_string(),
                    if x.last_status == 0 { "—".into() } else { x.last_status.to_string() },
                    esc(&x.last_error),
                ]
            })
            .collect();
        out.push_str(&table(
            &format!("deliveries-{name}"),
            &format!("Recent deliveries to {name} (pending and dead letters)"),
            &["Event", "Type", "At", "State", "Attempts", "Last status", "Last error"],
            &rows,
            "Nothing pending or dead.",
        ));
    }
    Ok(format!(
        "{}{out}",
        table(
            "webhooks",
            "Webhooks",
            &[
                "Webhook",
                "Backlog",
                "Delivered",
                "Dead",
                "Failures in a row",
                "Last status",
                "Last error",
                "Last success",
                "Delivering replica"
            ],
            &summary,
            ""
        )
    ))
}
