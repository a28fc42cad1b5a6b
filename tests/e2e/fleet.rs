//! End to end: one control plane serving a fleet (docs/BENCHMARKS.md, "A thousand nodes on
//! one control plane") — a thousand real node streams from one test process
//! (switchyard-test-support's `node_fleet`) against one real `switchyard control` process. Every node
//! receives a key change; a group of nodes that stop reading fall behind, are resynced once
//! they read again, and meanwhile do not delay the others; the control plane's memory stays
//! bounded; `switchyard nodes` lists the fleet.
#![allow(clippy::unwrap_used, clippy::expect_used, clippy::panic)]

use std::time::{Duration, Instant};

use switchyard_e2e::node_fleet::{connect_fleet, time_to_all, wait_all};
use switchyard_e2e::*;
use switchyard_proto::admin::v1::{self as admin, admin_client::AdminClient};
use tonic::transport::Channel;

/// Nodes in the fleet; a debug build connects them in a few seconds.
const NODES: usize = 1_000;
/// Nodes that stop reading their stream.
const SLOW: usize = 100;
/// What the control plane may hold at most (VmHWM) with the whole fleet connected and the
/// slow group stalled: the scale goal is under 2 GiB at a thousand nodes (docs/BENCHMARKS.md,
/// "The goals, and what they mean").
const MAX_RSS_MIB: u64 = 1024;

struct Admin(AdminClient<Channel>);

impl Admin {
    async fn connect(cp: &Proc) -> Admin {
        let channel =
            tonic::transport::Endpoint::from_shared(cp.url()).unwrap().connect().await.unwrap();
        Admin(AdminClient::new(channel))
    }

    /// Creates a key; returns the store revision of the write.
    async fn create_key(&mut self, name: &str) -> i64 {
        let mut request = tonic::Request::new(admin::CreateKeyRequest {
            name: name.into(),
            ..Default::default()
        });
        let bearer = format!("Bearer {ADMIN_TOKEN}").parse().unwrap();
        request.metadata_mut().insert("authorization", bearer);
        self.0.create_key(request).await.unwrap().into_inner().version
    }

    /// Applies a catalog of `models` models named for `round` (about 100 bytes each): a
    /// large change; returns its store revision.
    async fn apply_catalog(&mut self, round: usize, models: usize) -> i64 {
        let models: Vec<serde_json::Value> = (0..models)
            .map(|i| {
                serde_json::json!({
                    "name": format!("sim/model-{round}-{i:04}"),
                    "provider": "sim",
                    "upstream_model": format!("upstream-{i:04}"),
                })
            })
            .collect();
        let catalog = serde_json::json!({
            "providers": [{
                "name": "sim",
                "kind": "openai-compatible",
                "base_url": "http://127.0.0.1:9/v1",
                "region": "us",
            }],
            "models": models,
        });
        let mut request = tonic::Request::new(admin::ApplyCatalogRequest {
            catalog_json: catalog.to_string(),
            ..Default::default()
        });
        let bearer = format!("Bearer {ADMIN_TOKEN}").parse().unwrap();
        request.metadata_mut().insert("authorization", bearer);
        let applied = self.0.apply_catalog(request).await.unwrap().into_inner();
        assert!(applied.applied, "catalog {round} not applied: {:?}", applied.changes);
        applied.version
    }
}

/// A `/proc/PID/status` field of the control plane, in MiB.
fn status_mib(cp: &Proc, field: &str) -> u64 {
    let pid = cp.child.id().unwrap();
    let status = std::fs::read_to_string(format!("/proc/{pid}/status")).unwrap();
    let kib: u64 = status
        .lines()
        .find_map(|l| l.strip_prefix(field).and_then(|r| r.strip_prefix(':')))
        .and_then(|v| v.trim().trim_end_matches("kB").trim().parse().ok())
        .unwrap();
    kib / 1024
}

/// The control plane's count of node streams resynced because their node fell behind.
async fn resyncs(cp: &Proc) -> u64 {
    let metrics = http_get(cp.addr, "/metrics", None).await.unwrap();
    metrics
        .body
        .lines()
        .find_map(|l| l.strip_prefix("switchyard_control_node_resyncs_total "))
        .and_then(|v| v.trim().parse().ok())
        .unwrap()
}

async fn listed_nodes(cp: &Proc) -> Vec<serde_json::Value> {
    let out = cli(&cp.url(), &["nodes", "--json"]).await;
    assert!(out.success, "nodes failed: {}", out.stderr);
    out.json()["nodes"].as_array().unwrap().clone()
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_thousand_nodes_get_each_change_and_slow_ones_are_resynced_without_delaying_the_others() {
    // A connection per node here and in the control plane, and room for the rest.
    ensure_open_files(NODES as u64 + 512);
    let dir = tempfile::tempdir().unwrap();
    let store = format!("file://{}", dir.path().join("store").display());
    let cp = start_control(&store, "127.0.0.1:0", dir.path(), "cp").await;
    let mut admin = Admin::connect(&cp).await;
    let first = admin.create_key("before-the-fleet").await;

    let started = Instant::now();
    let nodes = connect_fleet(&cp.url(), "n", NODES, 64).await.unwrap();
    wait_all(&nodes, first, PATIENCE).await.unwrap();
    eprintln!("{NODES} nodes connected with the config in {:?}", started.elapsed());
    assert!(nodes.iter().all(|n| n.messages().0 == 1), "each node started from one snapshot");

    // One key change reaches every node.
    let sent = Instant::now();
    let version = admin.create_key("for-everyone").await;
    wait_all(&nodes, version, PATIENCE).await.unwrap();
    let everyone = time_to_all(&nodes, version, sent).unwrap();
    eprintln!("a key change reached all {NODES} nodes in {everyone:?}");

    // Presence: every node is listed with the version it acked (written in batches).
    let listed = eventually(PATIENCE, "every node listed at the change's version", || async {
        let listed = listed_nodes(&cp).await;
        (listed.len() == NODES
            && listed.iter().all(|n| n["applied_version"].as_i64() >= Some(version)))
        .then_some(listed)
    })
    .await;
    assert_eq!(listed.len(), NODES);

    // A group stops reading. Changes go on (key creations, then large catalogs so that
    // the slow streams reach their queue bound in a few changes) until each slow stream has
    // fallen behind: every change still reaches every fast node while the slow ones are
    // stalled at an older version.
    let (slow, fast) = nodes.split_at(SLOW);
    for node in slow {
        node.pause();
    }
    let resyncs_before = resyncs(&cp).await;
    let mut fast_times = Vec::new();
    let mut versions = Vec::new();
    while resyncs(&cp).await < resyncs_before + SLOW as u64 {
        let round = versions.len();
        assert!(round < 200, "the slow nodes never fell behind after {round} changes");
        let sent = Instant::now();
        let version = if round < 10 {
            admin.create_key(&format!("while-slow-{round}")).await
        } else {
            admin.apply_catalog(round, 1_000).await
        };
        versions.push(version);
        wait_all(fast, version, PATIENCE).await.unwrap();
        fast_times.push(time_to_all(fast, version, sent).unwrap());
    }
    let last = *versions.last().unwrap();
    // A paused node may still take the one message it was already waiting for.
    let stalled = slow.iter().filter(|n| n.version() < last).count();
    assert_eq!(stalled, SLOW, "every paused node is behind while it does not read");
    let changes = versions.len();
    let p50 = percentile(&fast_times, 50.0);
    let p99 = percentile(&fast_times, 99.0);
    eprintln!(
        "{changes} changes while {SLOW} nodes did not read: all {} fast nodes had each in p50 {p50:?}, p99 {p99:?}",
        fast.len()
    );
    // A fan-out that waited on the stalled streams would show here as the stalled nodes'
    // idle limit (10 s) or never; a debug build on a busy host takes well under a second.
    assert!(p99 < Duration::from_secs(5), "the fast nodes waited: p99 {p99:?}");

    // Bounded: what the control plane holds with the slow group stalled.
    let (rss, hwm) = (status_mib(&cp, "VmRSS"), status_mib(&cp, "VmHWM"));
    eprintln!("control plane: VmRSS {rss} MiB, VmHWM {hwm} MiB");
    assert!(hwm < MAX_RSS_MIB, "the control plane grew to {hwm} MiB");

    // Reading again, the slow nodes are resynced: they reach the last version without
    // having been sent every change (a delta covers what they missed).
    let resumed = Instant::now();
    for node in slow {
        node.resume();
    }
    wait_all(slow, last, PATIENCE).await.unwrap();
    eprintln!("the slow nodes caught up {:?} after reading again", resumed.elapsed());
    // Each slow stream was resynced (the control plane says so, naming the node), not
    // buffered for: it fell behind with its queue full and read the rest from the cache.
    let log = cp.log_text();
    for node in slow {
        let resynced = log.lines().any(|l| {
            l.contains("node stream behind; resyncing") && l.contains(&format!("node={} ", node.id))
        });
        assert!(resynced, "node {} was not resynced", node.id);
        assert!(node.ended().is_none(), "node {}'s stream ended: {:?}", node.id, node.ended());
    }
    let next = admin.create_key("after-the-resync").await;
    wait_all(&nodes, next, PATIENCE).await.unwrap();

    // A node that goes away vanishes from the listing.
    let mut nodes = nodes;
    let gone: Vec<String> = nodes.drain(..10).map(|n| n.id.clone()).collect();
    let listed = eventually(PATIENCE, "the disconnected nodes no longer listed", || async {
        let listed = listed_nodes(&cp).await;
        (listed.len() == NODES - gone.len()).then_some(listed)
    })
    .await;
    assert!(listed.iter().all(|n| !gone.iter().any(|g| n["node_id"] == g.as_str())));
}
