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
