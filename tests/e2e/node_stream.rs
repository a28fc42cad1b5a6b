//! End to end: what nodes report on their stream (failover events, breaker transitions,
//! usage) reaching the audit log, `switchyard breakers`, `events` and `usage`.
//!
//! A test plays the node with a real `NodeControlClient` against a real control-plane
//! process, so it drives the control plane through its real protocol and store.
#![allow(clippy::unwrap_used, clippy::expect_used, clippy::panic)]

use std::path::Path;
use std::process::Stdio;
use std::time::Duration;

use serde_json::Value;
use switchyard_e2e::etcd::EtcdProcess;
use switchyard_e2e::fake_node::{FakeNode, failover_event as event};
use switchyard_e2e::gateway::{self, Gateway};
use switchyard_e2e::*;
use switchyard_proto::node::v1::{self as pb, control_message, node_message};
use tokio::io::{AsyncBufReadExt, BufReader};

const WAIT: Duration = PATIENCE;

/// A control plane on `store` with extra flags (`--audit-max-entries 5`).
async fn control(store: &str, dir: &Path, name: &str, extra: &[&str]) -> Proc {
    let mut args = vec!["control", "--store", store, "--listen", "127.0.0.1:0"];
    args.extend_from_slice(extra);
    Proc::start(&args, &[("SWITCHYARD_ADMIN_TOKEN", ADMIN_TOKEN)], dir.join(format!("{name}.log")))
        .await
}

fn file_store(dir: &Path) -> String {
    format!("file://{}", dir.join("store").display())
}

/// `switchyard events --json ARGS`, one object per line.
async fn events_json(control: &str, args: &[&str]) -> Vec<Value> {
    let mut all = vec!["events", "--json"];
    all.extend_from_slice(args);
    let out = cli(control, &all).await;
    assert!(out.success, "events failed: {}", out.stderr);
    out.stdout.lines().map(|l| serde_json::from_str(l).unwrap()).collect()
}

fn ids(events: &[Value]) -> Vec<String> {
    events.iter().map(|e| e["id"].as_str().unwrap().to_owned()).collect()
}

fn usage_row<'a>(rows: &'a Value, key: &str, model: &str) -> Option<&'a Value> {
    rows.as_array()?.iter().find(|r| r["key_id"] == key && r["model"] == model)
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn failover_events_are_acked_once_in_the_audit_log_and_resends_are_not_duplicated() {
    let dir = tempfile::tempdir().unwrap();
    let cp = control(&file_store(dir.path()), dir.path(), "cp", &[]).await;
    let mut node = FakeNode::connect(&cp.url(), "n1").await;
    let t = now_ms() - 10_000;
    let batch = vec![
        event("ev-a", t, "key_1"),
        event("ev-b", t + 1, "key_2"),
        event("ev-c", t + 2, "key_1"),
    ];

    node.send_events(1, batch.clone()).await;
    // Acked means stored: the log shows the batch at once, oldest first.
    let listed = events_json(&cp.url(), &[]).await;
    assert_eq!(ids(&listed), ["ev-a", "ev-b", "ev-c"]);
    assert_eq!(listed[0]["key_id"], "key_1");
    assert_eq!(listed[0]["served_model"], "anthropic/claude-sonnet-4");
    assert_eq!(listed[0]["attempts"][0]["reason"], "timeout");

    // The node resends what it holds until acked (a lost ack): no copies.
    node.send_events(1, batch.clone()).await;
    node.send_events(2, vec![batch[1].clone(), batch[1].clone()]).await;
    assert_eq!(ids(&events_json(&cp.url(), &[]).await), ["ev-a", "ev-b", "ev-c"]);

    assert_eq!(ids(&events_json(&cp.url(), &["--key", "key_1"]).await), ["ev-a", "ev-c"]);
    assert_eq!(ids(&events_json(&cp.url(), &["--limit", "2"]).await), ["ev-b", "ev-c"]);

    let human = cli(&cp.url(), &["events"]).await;
    assert!(human.success, "{}", human.stderr);
    let first = human.stdout.lines().next().unwrap();
    assert!(first.contains("key_1  openai/gpt-5-nano → anthropic/claude-sonnet-4"), "{first}");
    assert!(
        first.ends_with(
            "openai/gpt-5-nano failed(timeout 30011ms) → anthropic/claude-sonnet-4 served(734ms)"
        ),
        "{first}"
    );
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn events_follow_streams_events_written_after_it_started_once_each() {
    let dir = tempfile::tempdir().unwrap();
    let cp = control(&file_store(dir.path()), dir.path(), "cp", &[]).await;
    let mut node = FakeNode::connect(&cp.url(), "n1").await;
    node.send_events(1, vec![event("old", now_ms() - 5_000, "key_1")]).await;

    let mut follower = tokio::process::Command::new(switchyard_bin())
        .args(["events", "--follow", "--json"])
        .env("SWITCHYARD_CONTROL", cp.url())
        .env("SWITCHYARD_ADMIN_TOKEN", ADMIN_TOKEN)
        .stdout(Stdio::piped())
        .kill_on_drop(true)
        .spawn()
        .unwrap();
    let mut lines = BufReader::new(follower.stdout.take().unwrap()).lines();
    let mut next_id = async || {
        let line = tokio::time::timeout(WAIT, lines.next_line()).await.unwrap().unwrap().unwrap();
        serde_json::from_str::<Value>(&line).unwrap()["id"].as_str().unwrap().to_owned()
    };
    assert_eq!(next_id().await, "old");

    let new = event("new", now_ms(), "key_1");
    node.send_events(2, vec![new.clone()]).await;
    assert_eq!(next_id().await, "new");
    // A resend rewrites the same record; followers must not see it twice.
    node.send_events(3, vec![new]).await;
    node.send_events(4, vec![event("newer", now_ms(), "key_2")]).await;
    assert_eq!(next_id().await, "newer");
    follower.kill().await.unwrap();
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn retention_keeps_only_the_newest_max_entries() {
    let dir = tempfile::tempdir().unwrap();
    let cp =
        control(&file_store(dir.path()), dir.path(), "cp", &["--audit-max-entries", "5"]).await;
    let mut node = FakeNode::connect(&cp.url(), "n1").await;
    // More than one transaction's worth (128 ops), in one batch.
    let t = now_ms() - 60_000;
    let batch: Vec<_> = (0..300).map(|i| event(&format!("ev{i:03}"), t + i, "key_1")).collect();
    node.send_events(1, batch).await;

    let kept = eventually(WAIT, "the audit log pruned to 5 entries", || async {
        let listed = events_json(&cp.url(), &["--limit", "1000"]).await;
        (listed.len() == 5).then_some(listed)
    })
    .await;
    assert_eq!(ids(&kept), ["ev295", "ev296", "ev297", "ev298", "ev299"]);
    assert!(cp.log_text().contains("audit log pruned"), "{}", cp.log_text());
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn events_older_than_the_max_age_are_pruned() {
    let dir = tempfile::tempdir().unwrap();
    let cp = control(&file_store(dir.path()), dir.path(), "cp", &["--audit-max-age", "1h"]).await;
    let mut node = FakeNode::connect(&cp.url(), "n1").await;
    let now = now_ms();
    node.send_events(1, vec![event("stale", now - 2 * 3_600_000, "k"), event("fresh", now, "k")])
        .await;
    // The age sweep runs every 30 s on the leader; a new leader sweeps at once. The killed
    // replica's election key lives until its lease (10 s) expires.
    drop(node);
    cp.kill().await;
    let cp =
        control(&file_store(dir.path()), dir.path(), "cp-again", &["--audit-max-age", "1h"]).await;
    eventually(Duration::from_secs(30), "the stale event pruned", || async {
        (ids(&events_json(&cp.url(), &[]).await) == ["fresh"]).then_some(())
    })
    .await;
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn breaker_transitions_show_in_switchyard_breakers() {
    let dir = tempfile::tempdir().unwrap();
    let cp = control(&file_store(dir.path()), dir.path(), "cp", &[]).await;
    let mut node = FakeNode::connect(&cp.url(), "n1").await;
    let now = now_ms();
    let open = pb::BreakerTransition {
        provider: "openai".into(),
        upstream_model: "gpt-5-nano".into(),
        from: "closed".into(),
        to: "open".into(),
        cause: "failure_rate".into(),
        at_unix_ms: now,
        failure_rate: 0.6,
        calls_in_window: 20,
        next_probe_unix_ms: now + 30_000,
        cooldown_ms: 30_000,
        ..Default::default()
    };
    node.send(node_message::Msg::Breaker(open.clone())).await;
    let other = pb::BreakerTransition {
        provider: "anthropic".into(),
        upstream_model: "claude-sonnet-4".into(),
        to: "half_open".into(),
        cause: "cooldown_elapsed".into(),
        next_probe_unix_ms: 0,
        ..open.clone()
    };
    node.send(node_message::Msg::Breaker(other)).await;
    node.barrier(1).await;

    let listed = cli(&cp.url(), &["breakers", "--json"]).await.json();
    let breakers = listed.as_array().unwrap();
    assert_eq!(breakers.len(), 2, "{listed}");
    let b = breakers.iter().find(|b| b["provider"] == "openai").unwrap();
    assert_eq!(b["node_id"], "n1");
    assert_eq!(b["upstream_model"], "gpt-5-nano");
    assert_eq!(b["state"], "open");
    assert_eq!(b["failure_rate"], 0.6);
    assert_eq!(b["next_probe_unix_ms"], now + 30_000);

    let table = cli(&cp.url(), &["breakers"]).await;
    assert!(table.stdout.starts_with("NODE  PROVIDER"), "{}", table.stdout);
    assert!(table.stdout.contains("FAILURE RATE  NEXT PROBE"), "{}", table.stdout);
    let row = table.stdout.lines().find(|l| l.contains("gpt-5-nano")).unwrap();
    assert!(
        row.contains("open (failure_rate)") && row.contains("60%") && row.contains("in "),
        "{row}"
    );

    // The newest transition is the state shown.
    let closed = pb::BreakerTransition {
        from: "half_open".into(),
        to: "closed".into(),
        cause: "probe_succeeded".into(),
        at_unix_ms: now + 31_000,
        failure_rate: 0.0,
        next_probe_unix_ms: 0,
        ..open
    };
    node.send(node_message::Msg::Breaker(closed.clone())).await;
    node.barrier(2).await;
    let listed = cli(&cp.url(), &["breakers", "--json"]).await.json();
    let b = listed.as_array().unwrap().iter().find(|b| b["provider"] == "openai").unwrap().clone();
    assert_eq!(
        (b["state"].as_str(), b["since_unix_ms"].as_i64()),
        (Some("closed"), Some(now + 31_000))
    );
    assert!(b["last_probe"].is_null(), "never probed: {b}");

    // A probe that left the breaker closed is reported alone and shows as its last probe.
    let probed = pb::BreakerTransition {
        from: "closed".into(),
        last_probe_unix_ms: now + 40_000,
        last_probe_outcome: "success".into(),
        last_probe_latency_ms: 12,
        ..closed
    };
    node.send(node_message::Msg::Probed(probed)).await;
    node.barrier(3).await;
    let listed = cli(&cp.url(), &["breakers", "--json"]).await.json();
    let b = listed.as_array().unwrap().iter().find(|b| b["provider"] == "openai").unwrap().clone();
    assert_eq!(b["state"], "closed");
    assert_eq!(b["since_unix_ms"], now + 31_000);
    assert_eq!(
        b["last_probe"],
        serde_json::json!({"at_unix_ms": now + 40_000, "outcome": "success", "latency_ms": 12})
    );
    let table = cli(&cp.url(), &["breakers"]).await;
    assert!(
        table.stdout.lines().next().unwrap().ends_with("NEXT PROBE  LAST PROBE"),
        "{}",
        table.stdout
    );
}

fn usage(boot_id: &str, at_unix_ms: i64, entries: &[(&str, &str, u64)]) -> node_message::Msg {
    node_message::Msg::Usage(pb::UsageReport {
        boot_id: boot_id.into(),
        at_unix_ms,
        entries: entries
            .iter()
            .map(|(key, model, requests)| pb::UsageEntry {
                key_id: (*key).into(),
                model: (*model).into(),
                requests: *requests,
                prompt_tokens: requests * 10,
                completion_tokens: requests * 4,
                cost_usd: *requests as f64 * 0.001,
            })
            .collect(),
    })
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn usage_sums_nodes_and_boots_and_resent_reports_do_not_double_count() {
    let dir = tempfile::tempdir().unwrap();
    let cp = control(&file_store(dir.path()), dir.path(), "cp", &[]).await;
    let mut n1 = FakeNode::connect(&cp.url(), "n1").await;
    let mut n2 = FakeNode::connect(&cp.url(), "n2").await;
    let t = now_ms();
    let nano = "openai/gpt-5-nano";
    n1.send(usage("boot-1", t, &[("key_1", nano, 3)])).await;
    // Resent, then superseded by a newer total of the same boot.
    n1.send(usage("boot-1", t, &[("key_1", nano, 3)])).await;
    n1.send(usage("boot-1", t + 1_000, &[("key_1", nano, 4)])).await;
    // A report that overtook nothing but arrives late must not roll the total back.
    n1.send(usage("boot-1", t + 500, &[("key_1", nano, 1)])).await;
    // The node restarted: a new boot's totals add to the old one's.
    n1.send(usage("boot-2", t + 2_000, &[("key_1", nano, 1)])).await;
    n2.send(usage("boot-x", t, &[("key_1", nano, 2), ("key_2", "anthropic/claude-sonnet-4", 5)]))
        .await;
    n1.barrier(1).await;
    n2.barrier(1).await;

    let rows = cli(&cp.url(), &["usage", "--json"]).await.json();
    assert_eq!(rows.as_array().unwrap().len(), 2, "{rows}");
    let row = usage_row(&rows, "key_1", nano).unwrap();
    assert_eq!(row["requests"], 7, "{rows}");
    assert_eq!(row["prompt_tokens"], 70);
    assert_eq!(row["completion_tokens"], 28);
    assert!((row["cost_usd"].as_f64().unwrap() - 0.007).abs() < 1e-9);

    let only = cli(&cp.url(), &["usage", "--key", "key_2", "--json"]).await.json();
    assert_eq!(only.as_array().unwrap().len(), 1, "{only}");
    assert_eq!(usage_row(&only, "key_2", "anthropic/claude-sonnet-4").unwrap()["requests"], 5);

    let table = cli(&cp.url(), &["usage"]).await;
    let lines: Vec<&str> = table.stdout.lines().collect();
    assert_eq!(
        lines[0],
        "KEY    MODEL                      REQUESTS  PROMPT TOKENS  COMPLETION TOKENS  COST USD"
    );
    assert!(
        lines[1].starts_with("key_1  openai/gpt-5-nano") && lines[1].ends_with("0.007000"),
        "{}",
        lines[1]
    );
}

/// The same reports through etcd: its transaction limit, its watch and its leases.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn reports_work_on_etcd() {
    let dir = tempfile::tempdir().unwrap();
    let etcd = EtcdProcess::start().await;
    let store = etcd.endpoint().replace("http://", "etcd://");
    let cp = control(&store, dir.path(), "cp", &["--audit-max-entries", "150"]).await;
    let mut node = FakeNode::connect(&cp.url(), "n1").await;
    let t = now_ms() - 60_000;
    let batch: Vec<_> = (0..200).map(|i| event(&format!("ev{i:03}"), t + i, "key_1")).collect();
    node.send_events(1, batch.clone()).await;
    node.send_events(2, batch).await;
    let kept = eventually(WAIT, "the audit log pruned to 150 entries", || async {
        let listed = events_json(&cp.url(), &["--limit", "1000"]).await;
        (listed.len() == 150).then_some(listed)
    })
    .await;
    assert_eq!(ids(&kept)[0], "ev050");

    let transition = pb::BreakerTransition {
        provider: "openai".into(),
        upstream_model: "gpt-5-nano".into(),
        from: "closed".into(),
        to: "open".into(),
        cause: "consecutive_timeouts".into(),
        at_unix_ms: now_ms(),
        failure_rate: 0.25,
        calls_in_window: 12,
        next_probe_unix_ms: now_ms() + 10_000,
        cooldown_ms: 10_000,
        ..Default::default()
    };
    node.send(node_message::Msg::Breaker(transition)).await;
    node.send(usage("boot-1", now_ms(), &[("key_1", "openai/gpt-5-nano", 2)])).await;
    node.send(usage("boot-1", now_ms(), &[("key_1", "openai/gpt-5-nano", 2)])).await;
    node.barrier(3).await;
    let breakers = cli(&cp.url(), &["breakers", "--json"]).await.json();
    assert_eq!(breakers[0]["state"], "open", "{breakers}");
    let rows = cli(&cp.url(), &["usage", "--json"]).await.json();
    assert_eq!(usage_row(&rows, "key_1", "openai/gpt-5-nano").unwrap()["requests"], 2);
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_batch_that_cannot_be_stored_is_not_acked_and_the_stream_ends_for_a_resend() {
    let dir = tempfile::tempdir().unwrap();
    let mut etcd = EtcdProcess::start().await;
    let store = etcd.endpoint().replace("http://", "etcd://");
    let cp = control(&store, dir.path(), "cp", &[]).await;
    let mut node = FakeNode::connect(&cp.url(), "n1").await;
    node.send_events(1, vec![event("stored", now_ms(), "key_1")]).await;

    etcd.stop().await;
    node.send(node_message::Msg::Events(pb::FailoverEvents {
        seq: 2,
        events: vec![event("lost", now_ms(), "key_1")],
    }))
    .await;
    let ended = tokio::time::timeout(Duration::from_secs(30), async {
        loop {
            match node.reply().await {
                Ok(Some(pb::ControlMessage {
                    msg: Some(control_message::Msg::EventsAck(ack)),
                })) => {
                    panic!("batch {} acked although the store is down", ack.seq)
                }
                Ok(Some(_)) => {}
                Ok(None) => panic!("stream ended without an error"),
                Err(status) => return status,
            }
        }
    })
    .await
    .expect("the stream should end once the write fails");
    assert_eq!(ended.code(), tonic::Code::Unavailable, "{ended:?}");
    assert!(ended.message().contains("batch 2 was not stored"), "{ended:?}");
    drop(cp);
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_batch_larger_than_one_etcd_request_is_stored() {
    let dir = tempfile::tempdir().unwrap();
    let etcd = EtcdProcess::start().await;
    let store = etcd.endpoint().replace("http://", "etcd://");
    let cp = control(&store, dir.path(), "cp", &[]).await;
    let mut node = FakeNode::connect(&cp.url(), "n1").await;
    // 60 events of ~40 KB: 2.4 MB, past etcd's 1.5 MiB request limit, under 128 ops.
    let t = now_ms();
    let batch: Vec<_> = (0..60)
        .map(|i| {
            let mut e = event(&format!("big{i:02}"), t + i, "key_1");
            e.attempts[0].reason = "x".repeat(40_000);
            e
        })
        .collect();
    node.send_events(1, batch).await;
    assert_eq!(events_json(&cp.url(), &[]).await.len(), 60);
}

/// Both halves together: a real node fails over against the simulator, and what it reports
/// reaches `switchyard events` and `switchyard usage`.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_real_nodes_failover_reaches_events_and_usage() {
    let gw = Gateway::start().await;
    gw.script("primary", serde_json::json!({"kind": "status", "status": 503})).await;
    let mut body = gateway::body(gateway::PRIMARY);
    body["fallback_models"] = serde_json::json!([gateway::SECONDARY]);
    let r = gw.chat(body).await;
    assert_eq!(r.status, 200, "{}", r.body);

    let url = gw.cp.url();
    let listed = eventually(WAIT, "the failover in the audit log", || async {
        let listed = events_json(&url, &[]).await;
        (!listed.is_empty()).then_some(listed)
    })
    .await;
    let e = &listed[0];
    assert_eq!(e["key_id"], gw.key_id.as_str(), "{e}");
    assert_eq!(e["requested_model"], gateway::PRIMARY, "{e}");
    assert_eq!(e["served_model"], gateway::SECONDARY, "{e}");
    assert_eq!(e["attempts"][0]["reason"], "server_error", "{e}");

    // Usage goes out every 5 s.
    let rows = eventually(Duration::from_secs(15), "the node's usage report", || async {
        let rows = cli(&url, &["usage", "--key", &gw.key_id, "--json"]).await.json();
        usage_row(&rows, &gw.key_id, gateway::SECONDARY).is_some().then_some(rows)
    })
    .await;
    assert_eq!(usage_row(&rows, &gw.key_id, gateway::SECONDARY).unwrap()["requests"], 1, "{rows}");
}
