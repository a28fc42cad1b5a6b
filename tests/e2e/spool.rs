//! A node keeps failover events it cannot hand to a control plane: stopped while no control
//! plane answers, it spools them in its `--data-dir`, and the next start delivers every
//! one. Real control plane, node and simulator processes on loopback.
#![allow(clippy::unwrap_used, clippy::expect_used)]

use std::time::Duration;

use serde_json::{Value, json};
use switchyard_e2e::gateway::*;
use switchyard_e2e::{cli, eventually, start_control, start_node};

/// `switchyard events --json --limit N`: one object per line.
async fn events(control: &str) -> Vec<Value> {
    let out = cli(control, &["events", "--json", "--limit", "1000"]).await;
    assert!(out.success, "events failed: {}", out.stderr);
    out.stdout.lines().map(|l| serde_json::from_str(l).unwrap()).collect()
}

fn spool_files(node_dir: &std::path::Path) -> usize {
    std::fs::read_dir(node_dir.join("event-spool")).map_or(0, |d| d.count())
}

#[tokio::test]
async fn failover_events_survive_an_absent_control_plane_and_a_node_restart() {
    const REQUESTS: usize = 25;
    let gw = Gateway::start_with(GatewayOptions {
        node_args: vec!["--drain-timeout", "1s"],
        ..GatewayOptions::default()
    })
    .await;
    gw.script("primary", json!({"kind": "status", "status": 503})).await;
    let store = format!("file://{}", gw.path().join("store").display());
    let node_dir = gw.path().join("node");
    let Gateway { dir, sim, cp, mut node, key_id, key, node_port, .. } = gw;
    let _keep = (sim, node_port);
    cp.kill().await;

    // Every request fails over while no control plane takes the events.
    let body = json!({"model": PRIMARY, "fallback_models": [SECONDARY],
        "messages": [{"role": "user", "content": "hi"}]});
    for _ in 0..REQUESTS {
        let r = switchyard_e2e::http_request(
            node.addr,
            "POST",
            "/v1/chat/completions",
            Some(&key),
            Some(body.to_string().as_bytes()),
        )
        .await
        .unwrap();
        assert_eq!(r.status, 200, "{}", r.body);
    }

    // Stopped: the hand-off finds no control plane, so the events go to the spool.
    let pid = node.child.id().unwrap();
    let status = std::process::Command::new("kill").args(["-TERM", &pid.to_string()]).status();
    assert!(status.unwrap().success());
    let exited = tokio::time::timeout(Duration::from_secs(20), node.child.wait()).await;
    assert!(exited.expect("the node exits after its hand-off budget").unwrap().success());
    assert!(node.log_text().contains("spooled for the next start"), "{}", node.log_text());
    assert!(spool_files(&node_dir) > 0, "the spool holds the events");

    // A control plane comes back, then the node: every event reaches the audit log.
    let cp = start_control(&store, "127.0.0.1:0", dir.path(), "cp2").await;
    let node = start_node(&cp.url(), &node_dir, "127.0.0.1:0", dir.path().join("node2.log")).await;
    let delivered = eventually(Duration::from_secs(20), "every spooled event stored", || async {
        let mine: Vec<Value> = events(&cp.url())
            .await
            .into_iter()
            .filter(|e| e["key_id"] == key_id.as_str())
            .collect();
        (mine.len() >= REQUESTS).then_some(mine)
    })
    .await;
    assert_eq!(delivered.len(), REQUESTS, "each event once: {delivered:?}");
    for event in &delivered {
        assert_eq!(event["requested_model"], PRIMARY, "{event}");
        assert_eq!(event["served_model"], SECONDARY, "{event}");
    }
    eventually(Duration::from_secs(10), "the spool drained and its files removed", || async {
        (spool_files(&node_dir) == 0).then_some(())
    })
    .await;
    drop(node);
}

/// `switchyard_failover_events_dropped_total` from the node's `/metrics`.
async fn dropped(node: &switchyard_e2e::Proc) -> Option<u64> {
    let metrics = switchyard_e2e::http_get(node.addr, "/metrics", None).await?;
    metrics.body.lines().find_map(|l| {
        l.strip_prefix("switchyard_failover_events_dropped_total ")?.trim().parse().ok()
    })
}

#[tokio::test]
async fn an_unwritable_spool_keeps_the_node_serving_counts_each_lost_event_and_the_control_plane_records_them()
 {
    const REQUESTS: u64 = 20;
    const BUFFER: u64 = 5;
    let gw = Gateway::start().await;
    gw.script("primary", json!({"kind": "status", "status": 503})).await;
    let store = format!("file://{}", gw.path().join("store").display());
    let node_dir = gw.path().join("node");
    let Gateway { dir, sim, cp, node, key_id, key, .. } = gw;
    // The node restarts on its last-known-good config: wait until it is on disk.
    eventually(Duration::from_secs(10), "the node's config persisted", || async {
        node_dir.join("config.base").exists().then_some(())
    })
    .await;
    node.kill().await;
    cp.kill().await;

    // A regular file where the spool's directory should be: even root cannot write there.
    let spool = node_dir.join("event-spool");
    if spool.exists() {
        std::fs::remove_dir_all(&spool).unwrap();
    }
    std::fs::write(&spool, b"not a directory").unwrap();
    // The control plane comes back later, at this address.
    let cp_port = switchyard_e2e::ReservedPort::new();
    let cp_url = format!("http://{}", cp_port.addr());
    let data = node_dir.display().to_string();
    let buffer = BUFFER.to_string();
    let node = switchyard_e2e::Proc::start(
        &[
            "node",
            "--control",
            &cp_url,
            "--listen",
            "127.0.0.1:0",
            "--data-dir",
            &data,
            "--event-buffer-events",
            &buffer,
        ],
        &[],
        dir.path().join("node2.log"),
    )
    .await;
    let addr = node.addr;
    eventually(Duration::from_secs(10), "the node ready on its last-known-good config", || {
        switchyard_e2e::node_version(addr)
    })
    .await;
    assert!(node.log_text().contains("cannot open the event spool"), "{}", node.log_text());

    // Every request fails over and is served while no control plane takes the events.
    let body = json!({"model": PRIMARY, "fallback_models": [SECONDARY],
        "messages": [{"role": "user", "content": "hi"}]});
    for _ in 0..REQUESTS {
        let r = switchyard_e2e::http_request(
            addr,
            "POST",
            "/v1/chat/completions",
            Some(&key),
            Some(body.to_string().as_bytes()),
        )
        .await
        .unwrap();
        assert_eq!(r.status, 200, "{}", r.body);
    }
    let lost = REQUESTS - BUFFER;

    // Counted, said in /readyz (still ready) and in the metrics and the log.
    let ready = switchyard_e2e::http_get(addr, "/readyz", None).await.unwrap();
    assert_eq!(ready.status, 200, "{}", ready.body);
    assert_eq!(
        ready.json()["event_spool"],
        json!({"state": "unwritable", "lost": lost}),
        "{}",
        ready.body
    );
    assert_eq!(dropped(&node).await, Some(lost));
    assert!(node.log_text().contains("events lost"), "{}", node.log_text());

    // The control plane is back: the events held and the count of the lost are stored.
    let cp = start_control(&store, &cp_port.addr().to_string(), dir.path(), "cp2").await;
    let (failovers, lost_entries) =
        eventually(Duration::from_secs(20), "the held events and events.lost stored", || async {
            let all = events(&cp.url()).await;
            let failovers = all.iter().filter(|e| e["key_id"] == key_id.as_str()).count() as u64;
            let lost: Vec<Value> = all.into_iter().filter(|e| e["type"] == "events.lost").collect();
            (failovers == BUFFER && !lost.is_empty()).then_some((failovers, lost))
        })
        .await;
    assert_eq!(lost_entries.len(), 1, "one report: {lost_entries:?}");
    let entry = &lost_entries[0];
    assert_eq!(entry["count"], lost, "{entry}");
    assert_eq!(entry["reason"], "spool_unwritable", "{entry}");
    assert_eq!(entry["events"], "failover", "{entry}");
    let node_id = std::fs::read_to_string(node_dir.join("node_id")).unwrap();
    assert_eq!(entry["node_id"], node_id.trim(), "{entry}");
    // Nothing went silently: stored + counted lost = failovers served.
    assert_eq!(failovers + entry["count"].as_u64().unwrap(), REQUESTS);
    // Still ready, and the count stays what it was.
    let ready = switchyard_e2e::http_get(addr, "/readyz", None).await.unwrap();
    assert_eq!((ready.status, ready.json()["event_spool"]["lost"].as_u64()), (200, Some(lost)));
    drop((sim, node, cp));
}

#[tokio::test]
async fn a_node_stopped_before_any_control_plane_recorded_its_losses_reports_them_after_its_restart()
 {
    const REQUESTS: u64 = 12;
    let gw = Gateway::start().await;
    gw.script("primary", json!({"kind": "status", "status": 503})).await;
    let store = format!("file://{}", gw.path().join("store").display());
    let node_dir = gw.path().join("node");
    let Gateway { dir, sim, cp, node, key, .. } = gw;
    eventually(Duration::from_secs(10), "the node's config persisted", || async {
        node_dir.join("config.base").exists().then_some(())
    })
    .await;
    node.kill().await;
    cp.kill().await;
    let spool = node_dir.join("event-spool");
    if spool.exists() {
        std::fs::remove_dir_all(&spool).unwrap();
    }
    std::fs::write(&spool, b"not a directory").unwrap();
    let cp_port = switchyard_e2e::ReservedPort::new();
    let cp_url = format!("http://{}", cp_port.addr());
    let data = node_dir.display().to_string();
    let args = [
        "node",
        "--control",
        &cp_url,
        "--listen",
        "127.0.0.1:0",
        "--data-dir",
        &data,
        "--event-buffer-events",
        "4",
        "--drain-timeout",
        "1s",
    ];
    let mut node = switchyard_e2e::Proc::start(&args, &[], dir.path().join("node2.log")).await;
    let addr = node.addr;
    eventually(Duration::from_secs(10), "the node ready", || switchyard_e2e::node_version(addr))
        .await;
    let body = json!({"model": PRIMARY, "fallback_models": [SECONDARY],
        "messages": [{"role": "user", "content": "hi"}]});
    for _ in 0..REQUESTS {
        let r = switchyard_e2e::http_request(
            addr,
            "POST",
            "/v1/chat/completions",
            Some(&key),
            Some(body.to_string().as_bytes()),
        )
        .await
        .unwrap();
        assert_eq!(r.status, 200, "{}", r.body);
    }

    // Stopped with no control plane: the 4 held are lost too (no spool), and every count
    // is kept in the data dir.
    let pid = node.child.id().unwrap();
    let status = std::process::Command::new("kill").args(["-TERM", &pid.to_string()]).status();
    assert!(status.unwrap().success());
    let exited = tokio::time::timeout(Duration::from_secs(20), node.child.wait()).await;
    assert!(exited.expect("the node exits after its hand-off budget").unwrap().success());
    assert!(node_dir.join("events-lost").exists(), "{}", node.log_text());

    let node = switchyard_e2e::Proc::start(&args, &[], dir.path().join("node3.log")).await;
    // Read before it listens.
    assert!(
        node.log_text().contains("counts of lost events an earlier run kept will be sent"),
        "{}",
        node.log_text()
    );
    let cp = start_control(&store, &cp_port.addr().to_string(), dir.path(), "cp2").await;
    let counted = eventually(Duration::from_secs(20), "events.lost stored", || async {
        let lost: u64 = events(&cp.url())
            .await
            .iter()
            .filter(|e| e["type"] == "events.lost")
            .map(|e| e["count"].as_u64().unwrap())
            .sum();
        (lost >= REQUESTS).then_some(lost)
    })
    .await;
    let stored =
        events(&cp.url()).await.iter().filter(|e| e["type"] == "api:model_failover").count();
    // Nothing went silently: stored + counted lost = failovers served.
    assert_eq!((stored as u64, counted), (0, REQUESTS));
    drop((sim, node, cp));
}
