//! A node keeps failover events it cannot hand to a control plane: stopped while no control
//! plane answers, it spools them in its `--data-dir`, and the next start delivers every
//! one. Real control plane, node and simulator processes on loopback.
#![allow(clippy::unwrap_used, clippy::expect_used)]

use std::time::Duration;

use serde_json::{Value, json};
use switchyard_e2e::gateway::*;
use switchyard_e2e::{PATIENCE, cli, eventually, start_control, start_node};

/// `switchyard events --json --limit N`: one object per line.
async fn events(control: &str) -> Vec<Value> {
    let out = cli(control, &["events", "--json", "--limit", "100000"]).await;
    assert!(out.success, "events failed: {}", out.stderr);
    out.stdout.lines().map(|l| serde_json::from_str(l).unwrap()).collect()
}

fn spool_files(node_dir: &std::path::Path) -> usize {
    std::fs::read_dir(node_dir.join("event-spool")).map_or(0, |d| d.count())
}

/// The node restarts on its last-known-good config: waits until it is on disk.
async fn config_persisted(node_dir: &std::path::Path) {
    eventually(Duration::from_secs(10), "the node's config persisted", || async {
        node_dir.join("config.base").exists().then_some(())
    })
    .await;
}

/// A regular file where the spool's directory should be: even root cannot write there.
fn make_spool_unwritable(node_dir: &std::path::Path) {
    let spool = node_dir.join("event-spool");
    if spool.exists() {
        std::fs::remove_dir_all(&spool).unwrap();
    }
    std::fs::write(&spool, b"not a directory").unwrap();
}

#[tokio::test]
async fn failover_events_survive_an_absent_control_plane_and_a_node_restart() {
    const REQUESTS: usize = 25;
    // Long: with no control plane connected the node must not wait it out.
    let drain = Duration::from_secs(30);
    let gw = Gateway::start_with(GatewayOptions {
        node_args: vec!["--drain-timeout", "30s"],
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
    switchyard_e2e::gateway::fail_over(node.addr, &key, REQUESTS as u64).await;

    // Stopped: no control plane is connected, so the events go to the spool and the node
    // exits once its requests are done (none here), not after the drain timeout.
    let pid = node.child.id().unwrap();
    let stopped = std::time::Instant::now();
    let status = std::process::Command::new("kill").args(["-TERM", &pid.to_string()]).status();
    assert!(status.unwrap().success());
    let exited = tokio::time::timeout(drain, node.child.wait()).await;
    assert!(exited.expect("the node exits before its drain timeout").unwrap().success());
    let took = stopped.elapsed();
    assert!(took < drain / 3, "exited {took:?} after SIGTERM, as if waiting for the drain timeout");
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

/// A gateway whose primary fails (every chat request fails over), taken apart once its
/// node has its config on disk: node and control plane stopped, a control plane to come
/// back on `cp_port` (where the node's `args` look for one).
struct Outage {
    dir: tempfile::TempDir,
    /// Serves the chat requests; held for the test's length.
    _sim: switchyard_e2e::Proc,
    store: String,
    node_dir: std::path::PathBuf,
    key: String,
    key_id: String,
    cp_port: switchyard_e2e::ReservedPort,
}

impl Outage {
    async fn start() -> Outage {
        let gw = Gateway::start().await;
        gw.script("primary", json!({"kind": "status", "status": 503})).await;
        let store = format!("file://{}", gw.path().join("store").display());
        let node_dir = gw.path().join("node");
        let Gateway { dir, sim, cp, node, key_id, key, .. } = gw;
        config_persisted(&node_dir).await;
        node.kill().await;
        cp.kill().await;
        let cp_port = switchyard_e2e::ReservedPort::new();
        Outage { dir, _sim: sim, store, node_dir, key, key_id, cp_port }
    }

    /// `switchyard node` on the data dir, following the control plane of `cp_port`.
    fn args<'a>(&self, cp_url: &'a str, data: &'a str, extra: &[&'a str]) -> Vec<&'a str> {
        let mut args = vec!["node", "--control", cp_url, "--listen", "127.0.0.1:0"];
        args.extend(["--data-dir", data]);
        args.extend_from_slice(extra);
        args
    }

    fn cp_url(&self) -> String {
        format!("http://{}", self.cp_port.addr())
    }

    /// Starts a node with `args` and waits until it serves its last-known-good config.
    async fn node(&self, args: &[&str], log: &str) -> switchyard_e2e::Proc {
        let node = switchyard_e2e::Proc::start(args, &[], self.dir.path().join(log)).await;
        let addr = node.addr;
        eventually(Duration::from_secs(10), "the node ready", || {
            switchyard_e2e::node_version(addr)
        })
        .await;
        node
    }

    async fn control_plane(&self, name: &str) -> switchyard_e2e::Proc {
        start_control(&self.store, &self.cp_port.addr().to_string(), self.dir.path(), name).await
    }
}

/// Failover events in the spool's files on disk: records of `.events` files (a length
/// prefix each) and what `.sealed` files say they hold.
fn spooled_on_disk(node_dir: &std::path::Path) -> u64 {
    let Ok(files) = std::fs::read_dir(node_dir.join("event-spool")) else { return 0 };
    let mut records = 0;
    for file in files {
        let path = file.unwrap().path();
        let Ok(bytes) = std::fs::read(&path) else { continue };
        match path.extension().and_then(|x| x.to_str()) {
            Some("events") => {
                let mut at = 0;
                while let Some(len) = bytes.get(at..at + 4) {
                    let len = u32::from_le_bytes(len.try_into().unwrap()) as usize;
                    if at + 4 + len > bytes.len() {
                        break;
                    }
                    records += 1;
                    at += 4 + len;
                }
            }
            Some("sealed") => {
                records += u64::from(u32::from_le_bytes(bytes[4..8].try_into().unwrap()));
            }
            _ => {}
        }
    }
    records
}

fn sigkill(child: &tokio::process::Child) {
    let pid = child.id().unwrap().to_string();
    let status = std::process::Command::new("kill").args(["-KILL", &pid]).status();
    assert!(status.unwrap().success());
}

/// The request ids of the failover events stored for `key_id`, and the count of the failover
/// events `events.lost` entries say were lost: (certainly, sent and maybe stored).
async fn request_ids_and_lost(
    control: &str,
    key_id: &str,
) -> (std::collections::HashSet<String>, (usize, usize)) {
    let all = events(control).await;
    let ids = all
        .iter()
        .filter(|e| e["key_id"] == key_id && e["type"] == "api:model_failover")
        .map(|e| e["request_id"].as_str().unwrap().to_owned())
        .collect();
    let lost = |maybe_stored: bool| {
        all.iter()
            .filter(|e| e["type"] == "events.lost" && e["events"] == "failover")
            .filter(|e| (e["reason"] == "node_killed_unacked") == maybe_stored)
            .map(|e| e["count"].as_u64().unwrap() as usize)
            .sum()
    };
    (ids, (lost(false), lost(true)))
}

/// The failover events stored for `key_id` (each once) and the `events.lost` entries.
async fn stored_and_lost(control: &str, key_id: &str) -> (u64, Vec<Value>) {
    let all = events(control).await;
    let mut ids: Vec<&str> = all
        .iter()
        .filter(|e| e["key_id"] == key_id && e["type"] == "api:model_failover")
        .map(|e| e["id"].as_str().unwrap())
        .collect();
    ids.sort_unstable();
    ids.dedup();
    let lost = all.iter().filter(|e| e["type"] == "events.lost").cloned().collect();
    (ids.len() as u64, lost)
}

/// The issue: a node held unacknowledged failover events in memory and wrote them to its
/// spool only at the end of its drain, so a SIGKILL (an OOM kill, a supervisor's short
/// stop) while no control plane was there lost them all, with no `events.lost` entry. Now
/// they are on disk within a second, and a restart with a control plane delivers each one.
#[tokio::test]
async fn failover_events_are_not_lost_silently_when_a_node_is_killed_while_its_control_plane_is_away()
 {
    const REQUESTS: u64 = 50;
    let gw = Gateway::start().await;
    gw.script("primary", json!({"kind": "status", "status": 503})).await;
    let store = format!("file://{}", gw.path().join("store").display());
    let node_dir = gw.path().join("node");
    let Gateway { dir, sim, cp, mut node, key_id, key, .. } = gw;
    config_persisted(&node_dir).await;
    cp.kill().await;

    switchyard_e2e::gateway::fail_over(node.addr, &key, REQUESTS).await;
    // With no control plane connected, every event reaches the spool's files within a tick
    // (250 ms); the bound for any event is a second.
    eventually(Duration::from_secs(5), "every event in the spool on disk", || async {
        (spooled_on_disk(&node_dir) == REQUESTS).then_some(())
    })
    .await;
    sigkill(&node.child);
    assert!(!node.child.wait().await.unwrap().success());

    // A control plane, then the node on the same data dir: every event arrives, and no loss
    // is reported because there was none.
    let cp = start_control(&store, "127.0.0.1:0", dir.path(), "cp2").await;
    let node = start_node(&cp.url(), &node_dir, "127.0.0.1:0", dir.path().join("node2.log")).await;
    let stored = eventually(Duration::from_secs(20), "every spooled event stored", || async {
        let (stored, _) = stored_and_lost(&cp.url(), &key_id).await;
        (stored >= REQUESTS).then_some(stored)
    })
    .await;
    assert_eq!(stored, REQUESTS);
    let (_, lost) = stored_and_lost(&cp.url(), &key_id).await;
    assert_eq!(lost, Vec::<Value>::new(), "nothing was lost");
    eventually(Duration::from_secs(10), "the spool drained", || async {
        (spool_files(&node_dir) == 0).then_some(())
    })
    .await;
    drop((sim, node));
}

/// The events a node holds in memory only (here: its spool cannot be written) are what a
/// kill takes with it; the node records how many every tick, and its next start reports
/// them as counted `events.lost` (`node_killed`).
#[tokio::test]
async fn events_a_killed_node_held_in_memory_only_are_counted_lost_by_its_next_start() {
    const REQUESTS: u64 = 12;
    let outage = Outage::start().await;
    let Outage { node_dir, key, key_id, .. } = &outage;
    make_spool_unwritable(node_dir);
    let (cp_url, data) = (outage.cp_url(), node_dir.display().to_string());
    let args = outage.args(&cp_url, &data, &[]);
    let mut node = outage.node(&args, "node2.log").await;
    switchyard_e2e::gateway::fail_over(node.addr, key, REQUESTS).await;
    let at_risk = node_dir.join("events-at-risk");
    eventually(PATIENCE, "the count of events at risk recorded", || async {
        // Never sent, sent and not acked.
        let text = std::fs::read_to_string(&at_risk).ok()?;
        (text.split_whitespace().collect::<Vec<_>>() == [REQUESTS.to_string().as_str(), "0"])
            .then_some(())
    })
    .await;
    sigkill(&node.child);
    let _ = node.child.wait().await;

    let node = switchyard_e2e::Proc::start(&args, &[], outage.dir.path().join("node3.log")).await;
    assert!(node.log_text().contains("node_killed"), "{}", node.log_text());
    let cp = outage.control_plane("cp2").await;
    let lost = eventually(Duration::from_secs(20), "events.lost stored", || async {
        let (_, lost) = stored_and_lost(&cp.url(), key_id).await;
        (!lost.is_empty()).then_some(lost)
    })
    .await;
    assert_eq!(lost.len(), 1, "{lost:?}");
    assert_eq!(lost[0]["reason"], "node_killed", "{}", lost[0]);
    assert_eq!(lost[0]["events"], "failover", "{}", lost[0]);
    assert_eq!(lost[0]["count"], REQUESTS, "{}", lost[0]);
    // Nothing went silently: stored + counted lost = failovers served.
    let (stored, _) = stored_and_lost(&cp.url(), key_id).await;
    assert_eq!(stored, 0);
    // Counted once: the record was cleared, and this run holds nothing.
    let record = std::fs::read_to_string(&at_risk).unwrap_or_default();
    assert!(record.split_whitespace().all(|n| n == "0"), "{record}");
    drop((node, cp, outage));
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
    let outage = Outage::start().await;
    let Outage { node_dir, key, key_id, .. } = &outage;
    make_spool_unwritable(node_dir);
    // The control plane comes back later, at `cp_port`.
    let (cp_url, data) = (outage.cp_url(), node_dir.display().to_string());
    let buffer = BUFFER.to_string();
    let node = outage
        .node(&outage.args(&cp_url, &data, &["--event-buffer-events", &buffer]), "node2.log")
        .await;
    let addr = node.addr;
    assert!(node.log_text().contains("cannot open the event spool"), "{}", node.log_text());

    // Every request fails over and is served while no control plane takes the events.
    switchyard_e2e::gateway::fail_over(addr, key, REQUESTS).await;
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
    let cp = outage.control_plane("cp2").await;
    let (failovers, lost_entries) =
        eventually(Duration::from_secs(20), "the held events and events.lost stored", || async {
            let all = events(&cp.url()).await;
            let failovers = all.iter().filter(|e| e["key_id"] == key_id.as_str()).count() as u64;
            let lost: Vec<Value> = all.into_iter().filter(|e| e["type"] == "events.lost").collect();
            // The node reports its count as it grows (a busy machine may see it in more
            // than one report): every lost event is in one of them.
            let counted: u64 = lost.iter().filter_map(|e| e["count"].as_u64()).sum();
            (failovers == BUFFER && counted == REQUESTS - BUFFER).then_some((failovers, lost))
        })
        .await;
    let entry = &lost_entries[0];
    let counted: u64 = lost_entries.iter().filter_map(|e| e["count"].as_u64()).sum();
    assert_eq!(counted, lost, "{lost_entries:?}");
    assert_eq!(entry["reason"], "spool_unwritable", "{entry}");
    assert_eq!(entry["events"], "failover", "{entry}");
    let node_id = std::fs::read_to_string(node_dir.join("node_id")).unwrap();
    assert_eq!(entry["node_id"], node_id.trim(), "{entry}");
    // Nothing went silently: stored + counted lost = failovers served.
    assert_eq!(failovers + counted, REQUESTS);
    // Still ready, and the count stays what it was.
    let ready = switchyard_e2e::http_get(addr, "/readyz", None).await.unwrap();
    assert_eq!((ready.status, ready.json()["event_spool"]["lost"].as_u64()), (200, Some(lost)));
    drop((node, cp, outage));
}

#[tokio::test]
async fn a_node_stopped_before_any_control_plane_recorded_its_losses_reports_them_after_its_restart()
 {
    const REQUESTS: u64 = 12;
    let outage = Outage::start().await;
    let Outage { node_dir, key, .. } = &outage;
    make_spool_unwritable(node_dir);
    let (cp_url, data) = (outage.cp_url(), node_dir.display().to_string());
    let args =
        outage.args(&cp_url, &data, &["--event-buffer-events", "4", "--drain-timeout", "1s"]);
    let mut node = outage.node(&args, "node2.log").await;
    let addr = node.addr;
    switchyard_e2e::gateway::fail_over(addr, key, REQUESTS).await;

    // Stopped with no control plane: the 4 held are lost too (no spool), and every count
    // is kept in the data dir.
    let pid = node.child.id().unwrap();
    let status = std::process::Command::new("kill").args(["-TERM", &pid.to_string()]).status();
    assert!(status.unwrap().success());
    let exited = tokio::time::timeout(Duration::from_secs(20), node.child.wait()).await;
    assert!(exited.expect("the node exits after its hand-off budget").unwrap().success());
    assert!(node_dir.join("events-lost").exists(), "{}", node.log_text());

    let node = switchyard_e2e::Proc::start(&args, &[], outage.dir.path().join("node3.log")).await;
    // Read before it listens.
    assert!(
        node.log_text().contains("counts of lost events an earlier run kept will be sent"),
        "{}",
        node.log_text()
    );
    let cp = outage.control_plane("cp2").await;
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
    drop((node, cp, outage));
}

/// Measures what a kill at a random moment loses: 20 times (the
/// `SPOOL_KILLS` variable overrides), a node with no control plane takes a failover storm
/// (every request fails over) from `CLIENTS` clients, is SIGKILLed at a random moment of
/// it, and restarts with a control plane, which gets what it kept. Compares the failovers
/// the clients saw served with the events stored plus those counted in `events.lost`, and
/// prints the figures. Minutes long: `cargo nextest run --test spool --run-ignored only
/// measure_kills_under_a_failover_storm --no-capture`. `SPOOL_KILLS_CONTROL=up` keeps a
/// control plane up during the storms instead, for the figures of a connected node.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
#[ignore = "a measurement, minutes long"]
async fn measure_kills_under_a_failover_storm_with_the_control_plane_down() {
    use std::sync::Arc;
    use std::sync::atomic::{AtomicBool, Ordering};
    const CLIENTS: usize = 4;
    let kills: usize = std::env::var("SPOOL_KILLS").ok().and_then(|k| k.parse().ok()).unwrap_or(20);
    let control_up = std::env::var("SPOOL_KILLS_CONTROL").is_ok_and(|v| v == "up");

    let outage = Outage::start().await;
    let Outage { node_dir, key, key_id, .. } = &outage;
    let (cp_url, data) = (outage.cp_url(), node_dir.display().to_string());
    let args = outage.args(&cp_url, &data, &[]);
    let body = json!({"model": PRIMARY, "fallback_models": [SECONDARY],
        "messages": [{"role": "user", "content": "hi"}]})
    .to_string();

    // Every request carries its own id (`x-request-id`), which its event carries: the
    // figures are by request, not only by count.
    let mut stored = std::collections::HashSet::<String>::new();
    let (mut served_total, mut in_flight_total, mut kept_total, mut missing_total) = (0, 0, 0, 0);
    // Counted in events.lost: certainly lost, and sent but not acked (maybe stored).
    let mut lost_total = (0, 0);
    let mut missing_per_kill = Vec::new();
    println!(
        "kill  after_ms  served  missing  counted_lost  counted_unacked  in_flight  in_flight_kept"
    );
    for round in 0..kills {
        // With `SPOOL_KILLS_CONTROL=up`, a control plane takes the events during the storm.
        let mut cp = match control_up {
            true => Some(outage.control_plane("cp").await),
            false => None,
        };
        let mut node = outage.node(&args, &format!("n{round}.log")).await;
        let addr = node.addr;
        // The storm: each client sends one request after another until the node is gone.
        let killing = Arc::new(AtomicBool::new(false));
        let mut clients = tokio::task::JoinSet::new();
        for client in 0..CLIENTS {
            let killing = Arc::clone(&killing);
            let (key, body) = (key.clone(), body.clone());
            clients.spawn(async move {
                let (mut served, mut in_flight) = (Vec::new(), Vec::new());
                for n in 0.. {
                    if killing.load(Ordering::SeqCst) {
                        break;
                    }
                    let id = format!("m{round}-{client}-{n}");
                    let r = switchyard_e2e::http_request_with(
                        addr,
                        "POST",
                        "/v1/chat/completions",
                        Some(&key),
                        &[("x-request-id", id.as_bytes())],
                        Some(body.as_bytes()),
                    )
                    .await;
                    match r {
                        Some(r) if r.status == 200 => served.push(id),
                        Some(r) => panic!("{} {}", r.status, r.body),
                        // Sent before the kill and unanswered: its event may or may not exist.
                        None => in_flight.push(id),
                    }
                }
                (served, in_flight)
            });
        }
        // A random moment 0.3–1.8 s into the storm.
        let nanos = std::time::SystemTime::now()
            .duration_since(std::time::UNIX_EPOCH)
            .unwrap()
            .subsec_nanos();
        let after = Duration::from_millis(300 + u64::from(nanos % 1_500));
        tokio::time::sleep(after).await;
        killing.store(true, Ordering::SeqCst);
        sigkill(&node.child);
        let _ = node.child.wait().await;
        let (mut served, mut in_flight) = (Vec::new(), Vec::new());
        while let Some(result) = clients.join_next().await {
            let (s, f) = result.unwrap();
            served.extend(s);
            in_flight.extend(f);
        }

        // A control plane, and the node again: what it kept arrives, or is counted.
        let cp = match cp.take() {
            Some(cp) => cp,
            None => outage.control_plane("cp").await,
        };
        let mut node = outage.node(&args, &format!("r{round}.log")).await;
        let started = std::time::Instant::now();
        let mut last = (usize::MAX, (0, 0), std::time::Instant::now());
        let (ids, lost) = loop {
            let (ids, lost) = request_ids_and_lost(&cp.url(), key_id).await;
            if (ids.len(), lost) != (last.0, last.1) {
                last = (ids.len(), lost, std::time::Instant::now());
            }
            let all_there = served.iter().all(|id| ids.contains(id));
            let settled = spool_files(node_dir) == 0 && last.2.elapsed() > Duration::from_secs(2);
            if all_there || settled || started.elapsed() > Duration::from_secs(60) {
                break (ids, lost);
            }
            tokio::time::sleep(Duration::from_millis(200)).await;
        };
        let missing = served.iter().filter(|id| !ids.contains(*id)).count();
        let kept = in_flight.iter().filter(|id| ids.contains(*id)).count();
        let counted = (lost.0 - lost_total.0, lost.1 - lost_total.1);
        println!(
            "{round:>4}  {:>8}  {:>6}  {missing:>7}  {:>12}  {:>15}  {:>9}  {kept:>14}",
            after.as_millis(),
            served.len(),
            counted.0,
            counted.1,
            in_flight.len(),
        );
        served_total += served.len();
        in_flight_total += in_flight.len();
        kept_total += kept;
        missing_total += missing;
        missing_per_kill.push(missing);
        lost_total = lost;
        stored = ids;
        // A clean stop with the control plane there, then the control plane goes.
        let pid = node.child.id().unwrap().to_string();
        assert!(
            std::process::Command::new("kill").args(["-TERM", &pid]).status().unwrap().success()
        );
        let _ = tokio::time::timeout(Duration::from_secs(30), node.child.wait()).await;
        cp.kill().await;
    }
    let worst = missing_per_kill.iter().max().copied().unwrap_or(0);
    let without = missing_per_kill.iter().filter(|m| **m == 0).count();
    println!(
        "{kills} kills: {served_total} failovers served; {} stored, {missing_total} missing \
         ({without} kills missing none, at most {worst} in one); counted in events.lost: {} \
         never sent (node_killed), {} sent and not acked (node_killed_unacked, maybe stored); \
         {in_flight_total} requests unanswered at a kill, {kept_total} of their events stored",
        served_total - missing_total,
        lost_total.0,
        lost_total.1,
    );
    assert_eq!(
        stored.len(),
        served_total - missing_total + kept_total,
        "every stored event is one of a request sent"
    );
    drop(outage);
}
