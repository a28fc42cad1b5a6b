//! A real etcd cluster loses members while the gateway serves: three etcd processes on
//! loopback with TLS on client and peer URLs (client certificates required) and
//! authentication on, two control planes reaching them as a user limited to Switchyard's
//! prefix, two nodes, and a client sending chat requests that all fail over (so every one
//! produces a failover event to store).
//!
//! - The leader is killed: admin writes go on after an election, changes reach both nodes,
//!   failover events keep being stored.
//! - A second member is killed: writes fail with an error that names the lost quorum, and
//!   the nodes keep serving from the config they have.
//! - Both come back: writes succeed again, changes reach the nodes and the events held
//!   meanwhile are stored, without restarting any Switchyard process. Nothing is lost:
//!   events stored + losses counted = failovers served.
#![allow(clippy::unwrap_used, clippy::expect_used, clippy::panic)]

use std::net::SocketAddr;
use std::sync::Arc;
use std::sync::atomic::{AtomicBool, AtomicU64, Ordering};
use std::time::{Duration, Instant};

use serde_json::{Value, json};
use switchyard_e2e::etcd::{AuthSetup, ClusterOptions, EtcdCluster, TlsFiles};
use switchyard_e2e::gateway::*;
use switchyard_e2e::pki::Ca;
use switchyard_e2e::{
    ADMIN_TOKEN, PATIENCE, Proc, cli, eventually, http_request, node_version, start_sim,
};

const ETCD_USER: &str = "switchyard";
const ETCD_PASSWORD: &str = "etcd-password-e2e-7c1d0b";
const ROOT_PASSWORD: &str = "etcd-root-password-e2e-4a9f";

/// A control plane on the cluster, over TLS with a client certificate, as `switchyard`.
async fn start_control(cluster: &EtcdCluster, ca: &Ca, dir: &std::path::Path, name: &str) -> Proc {
    let client = ca.leaf(&format!("{name}-client"), &["localhost"]);
    let store = cluster.store_url();
    let (ca_path, cert, key) = (
        ca.cert_path().display().to_string(),
        client.cert.display().to_string(),
        client.key.display().to_string(),
    );
    Proc::start(
        &[
            "control",
            "--store",
            &store,
            "--listen",
            "127.0.0.1:0",
            "--etcd-ca",
            &ca_path,
            "--etcd-cert",
            &cert,
            "--etcd-key",
            &key,
        ],
        &[
            ("SWITCHYARD_ADMIN_TOKEN", ADMIN_TOKEN),
            ("SWITCHYARD_ETCD_USER", ETCD_USER),
            ("SWITCHYARD_ETCD_PASSWORD", ETCD_PASSWORD),
        ],
        dir.join(format!("{name}.log")),
    )
    .await
}

/// Failover events stored for `key_id`, and the losses counted in `events.lost` entries.
async fn stored_events(control: &str, key_id: &str) -> Option<(u64, u64)> {
    let out = cli(control, &["events", "--json", "--limit", "1000000"]).await;
    if !out.success {
        return None;
    }
    let (mut failovers, mut lost) = (0, 0);
    for line in out.stdout.lines() {
        let event: Value = serde_json::from_str(line).unwrap();
        if event["type"] == "events.lost" {
            lost += event["count"].as_u64().unwrap_or(0);
        } else if event["key_id"] == key_id {
            failovers += 1;
        }
    }
    Some((failovers, lost))
}

/// `keys create` through `control`: the new config version, or the CLI's error.
async fn create_key(control: &str, name: &str) -> Result<i64, String> {
    let out = cli(control, &["keys", "create", "--name", name, "--json"]).await;
    if out.success { Ok(out.json()["version"].as_i64().unwrap()) } else { Err(out.stderr) }
}

async fn wait_for_version(nodes: &[SocketAddr], version: i64, what: &str) {
    for &addr in nodes {
        eventually(
            PATIENCE,
            what,
            || async move { node_version(addr).await.filter(|v| *v >= version) },
        )
        .await;
    }
}

/// Chat requests in a loop, alternating between the nodes, each failing over from the
/// primary (scripted to answer 503) to the secondary.
struct Traffic {
    served: Arc<AtomicU64>,
    failed: Arc<AtomicU64>,
    stop: Arc<AtomicBool>,
    task: tokio::task::JoinHandle<()>,
}

impl Traffic {
    fn start(nodes: Vec<SocketAddr>, key: String) -> Self {
        let served = Arc::new(AtomicU64::new(0));
        let failed = Arc::new(AtomicU64::new(0));
        let stop = Arc::new(AtomicBool::new(false));
        let (s, f, halt) = (Arc::clone(&served), Arc::clone(&failed), Arc::clone(&stop));
        let body = json!({"model": PRIMARY, "fallback_models": [SECONDARY],
            "messages": [{"role": "user", "content": "hi"}]})
        .to_string();
        let task = tokio::spawn(async move {
            let mut i = 0usize;
            while !halt.load(Ordering::Relaxed) {
                let node = nodes[i % nodes.len()];
                i += 1;
                let response = http_request(
                    node,
                    "POST",
                    "/v1/chat/completions",
                    Some(&key),
                    Some(body.as_bytes()),
                )
                .await;
                match response {
                    Some(r) if r.status == 200 && r.json()["model"] == SECONDARY => {
                        s.fetch_add(1, Ordering::Relaxed);
                    }
                    _ => {
                        f.fetch_add(1, Ordering::Relaxed);
                    }
                }
                // Paces the client at a few dozen requests a second on a shared machine.
                tokio::time::sleep(Duration::from_millis(20)).await;
            }
        });
        Self { served, failed, stop, task }
    }

    fn served(&self) -> u64 {
        self.served.load(Ordering::Relaxed)
    }

    fn failed(&self) -> u64 {
        self.failed.load(Ordering::Relaxed)
    }

    async fn stop(self) -> (u64, u64) {
        self.stop.store(true, Ordering::Relaxed);
        let (served, failed) = (Arc::clone(&self.served), Arc::clone(&self.failed));
        self.task.await.unwrap();
        (served.load(Ordering::Relaxed), failed.load(Ordering::Relaxed))
    }
}

/// Auth on, with the control plane's user limited to its prefix.
fn auth_setup() -> AuthSetup {
    AuthSetup {
        root_password: ROOT_PASSWORD.into(),
        user: ETCD_USER.into(),
        password: ETCD_PASSWORD.into(),
        prefix: "/switchyard/".into(),
    }
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_three_member_etcd_cluster_loses_its_leader_then_quorum_and_recovers_with_nothing_lost() {
    let ca = Ca::new("etcd cluster test CA");
    let member = ca.leaf("etcd-member", &["localhost", "127.0.0.1"]);
    let tls = TlsFiles { ca: ca.cert_path().to_owned(), cert: member.cert, key: member.key };
    let mut cluster =
        EtcdCluster::start(ClusterOptions { tls: Some(tls), ..ClusterOptions::default() }).await;
    cluster.enable_auth(&auth_setup()).await;

    let dir = tempfile::tempdir().unwrap();
    let sim = start_sim(dir.path().join("sim.log")).await;
    let cp1 = start_control(&cluster, &ca, dir.path(), "cp1").await;
    let cp2 = start_control(&cluster, &ca, dir.path(), "cp2").await;
    let catalog = dir.path().join("catalog.yaml");
    std::fs::write(&catalog, catalog_yaml(&sim.url(), &GatewayOptions::default())).unwrap();
    cli(&cp1.url(), &["apply", "-f", &catalog.display().to_string(), "--json"]).await.json();
    let created = cli(&cp1.url(), &["keys", "create", "--name", "traffic", "--json"]).await.json();
    let key = created["key"].as_str().unwrap().to_owned();
    let key_id = created["id"].as_str().unwrap().to_owned();
    let version = created["version"].as_i64().unwrap();

    // Two nodes, each preferring another control plane.
    let mut nodes = Vec::new();
    for (name, first, second) in [("node-a", &cp1, &cp2), ("node-b", &cp2, &cp1)] {
        let node = switchyard_e2e::start_node(
            &format!("{},{}", first.url(), second.url()),
            &dir.path().join(name),
            "127.0.0.1:0",
            dir.path().join(format!("{name}.log")),
        )
        .await;
        nodes.push(node);
    }
    let addrs: Vec<SocketAddr> = nodes.iter().map(|n| n.addr).collect();
    wait_for_version(&addrs, version, "both nodes to apply the catalog and key").await;

    let script = json!({"model": "primary", "behaviour": {"kind": "status", "status": 503}});
    let r =
        http_request(sim.addr, "POST", "/_sim/script", None, Some(script.to_string().as_bytes()))
            .await
            .unwrap();
    assert!(r.status < 300, "{}", r.body);
    let traffic = Traffic::start(addrs.clone(), key);
    let (cp1_url, cp2_url) = (cp1.url(), cp2.url());
    let key_id = key_id.as_str();
    eventually(PATIENCE, "failover events stored with the whole cluster up", || async {
        stored_events(&cp1_url, key_id).await.filter(|(stored, _)| *stored >= 20)
    })
    .await;

    // --- The leader dies. ---
    let leader = cluster.leader().await.expect("the cluster has a leader");
    let (stored_before, _) = stored_events(&cp1_url, key_id).await.unwrap();
    let killed = Instant::now();
    cluster.kill(leader).await;
    let mut attempts = 0;
    let version = loop {
        attempts += 1;
        match create_key(&cp2_url, "after-leader-loss").await {
            Ok(version) => break version,
            Err(e) => {
                assert!(killed.elapsed() < PATIENCE, "writes did not resume: {e}");
                println!("write attempt {attempts} after the leader's death failed: {e}");
            }
        }
    };
    let write_resumed = killed.elapsed();
    let new_leader = cluster.leader().await.expect("the two members left elected a leader");
    assert_ne!(new_leader, leader);
    // The election (election timeout 500 ms) plus one write; bounded well below the
    // control plane's own limit on waiting for a leader plus a loaded machine's slack.
    assert!(write_resumed < Duration::from_secs(8), "writes resumed after {write_resumed:?}");
    wait_for_version(&addrs, version, "a key created after the leader's death to reach both nodes")
        .await;
    let config_reached = killed.elapsed();
    // Below etcd's own request timeout (5 s + 2 election timeouts = 6 s), which an event
    // write forwarded to the dead leader would otherwise wait out, holding up its stream.
    assert!(config_reached < Duration::from_secs(5), "the change took {config_reached:?}");
    eventually(PATIENCE, "failover events stored after the leader's death", || async {
        stored_events(&cp2_url, key_id).await.filter(|(stored, _)| *stored >= stored_before + 20)
    })
    .await;
    println!(
        "leader {} killed: a write succeeded after {write_resumed:?} ({attempts} attempt(s)); \
         the change was on both nodes after {config_reached:?}; new leader {}",
        cluster.name(leader),
        cluster.name(new_leader)
    );

    // --- The new leader dies too: no quorum. ---
    let second = new_leader;
    let served_before = traffic.served();
    cluster.kill(second).await;
    let lost_at = Instant::now();
    let refused = create_key(&cp1_url, "without-quorum").await.expect_err("a write without quorum");
    let refused_after = lost_at.elapsed();
    assert!(refused.contains("quorum"), "the error names the lost quorum: {refused}");
    assert!(refused.contains("1 of 3 members reachable"), "{refused}");
    assert!(!refused.contains(ETCD_PASSWORD), "{refused}");
    println!("quorum lost: a write failed after {refused_after:?} with: {}", refused.trim());
    // Another write through the other replica, after the first: the same clear error.
    let refused = create_key(&cp2_url, "without-quorum-2").await.expect_err("no quorum");
    assert!(refused.contains("quorum"), "{refused}");
    // The nodes keep serving from the config they have.
    eventually(PATIENCE, "the nodes to serve 30 more requests without quorum", || async {
        (traffic.served() >= served_before + 30).then_some(())
    })
    .await;
    assert_eq!(traffic.failed(), 0, "every request was served");
    for &addr in &addrs {
        let ready = switchyard_e2e::http_get(addr, "/readyz", None).await.unwrap();
        assert_eq!(ready.status, 200, "a node without etcd quorum stays ready: {}", ready.body);
    }

    // --- Both come back; nothing restarts on Switchyard's side. ---
    let outage = lost_at.elapsed();
    cluster.restart(leader);
    cluster.restart(second);
    let restarted = Instant::now();
    cluster.wait_healthy(leader).await;
    cluster.wait_healthy(second).await;
    let healthy_after = restarted.elapsed();
    let version = eventually(PATIENCE, "writes to succeed again", || async {
        create_key(&cp1_url, "after-recovery").await.ok()
    })
    .await;
    let writes_back = restarted.elapsed();
    wait_for_version(&addrs, version, "a key created after the recovery to reach both nodes").await;
    let version = create_key(&cp2_url, "after-recovery-2").await.expect("writes through cp2 too");
    wait_for_version(&addrs, version, "a key created through cp2 to reach both nodes").await;
    println!(
        "members back after a {outage:?} outage: healthy after {healthy_after:?}, writes after \
         {writes_back:?}"
    );

    let (served, failed) = traffic.stop().await;
    assert_eq!(failed, 0, "every request was served");
    let drained = Instant::now();
    let (stored, lost) =
        eventually(PATIENCE, "every failover event stored or counted lost", || async {
            stored_events(&cp1_url, key_id).await.filter(|(stored, lost)| stored + lost >= served)
        })
        .await;
    println!(
        "served {served} failovers; stored {stored} events, {lost} counted lost; drained \
         {:?} after the traffic stopped",
        drained.elapsed()
    );
    assert_eq!(stored + lost, served, "nothing lost silently, nothing stored twice");
    // A few hundred events fit in a node's memory while etcd has no quorum: none is lost.
    assert_eq!(lost, 0, "no failover event lost");

    // The etcd password appears in no process's output.
    for process in [&cp1, &cp2, &nodes[0], &nodes[1]] {
        let log = process.log_text() + &process.stdout_text();
        assert!(!log.contains(ETCD_PASSWORD), "{} shows the password", process.log.display());
    }
    drop((sim, nodes, cp1, cp2));
}

/// `switchyard control` with the given etcd flags and environment, expected to refuse to
/// start: its exit code and stderr.
async fn refused_start(store: &str, flags: &[&str], env: &[(&str, &str)]) -> (Option<i32>, String) {
    let mut command = tokio::process::Command::new(switchyard_e2e::switchyard_bin());
    command
        .args(["control", "--store", store, "--listen", "127.0.0.1:0"])
        .args(flags)
        .env("SWITCHYARD_ADMIN_TOKEN", ADMIN_TOKEN)
        .env_remove("SWITCHYARD_ETCD_USER")
        .env_remove("SWITCHYARD_ETCD_PASSWORD")
        .envs(env.iter().copied())
        .kill_on_drop(true);
    let out = tokio::time::timeout(PATIENCE, command.output())
        .await
        .expect("the control plane gives up rather than wait")
        .unwrap();
    assert!(!out.status.success(), "started: {}", String::from_utf8_lossy(&out.stdout));
    (out.status.code(), String::from_utf8_lossy(&out.stderr).into_owned())
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn the_control_plane_refuses_to_start_on_bad_etcd_tls_files_or_credentials_and_says_why() {
    let ca = Ca::new("etcd test CA");
    let member = ca.leaf("etcd-member", &["localhost", "127.0.0.1"]);
    let client = ca.leaf("cp-client", &["localhost"]);
    let tls = TlsFiles { ca: ca.cert_path().to_owned(), cert: member.cert, key: member.key };
    let mut cluster = EtcdCluster::start(ClusterOptions {
        members: 1,
        tls: Some(tls),
        heartbeat_ms: 10,
        election_ms: 100,
        ..ClusterOptions::default()
    })
    .await;
    cluster.enable_auth(&auth_setup()).await;
    let store = cluster.store_url();
    let path = |p: &std::path::Path| p.display().to_string();
    let (ca_path, cert, key) = (path(ca.cert_path()), path(&client.cert), path(&client.key));
    let good_flags = ["--etcd-ca", &ca_path, "--etcd-cert", &cert, "--etcd-key", &key];
    let wrong = "wrong-etcd-password-31b7";

    // A wrong password: refused by etcd, reported with the user's name only.
    let (code, stderr) = refused_start(
        &store,
        &good_flags,
        &[("SWITCHYARD_ETCD_USER", ETCD_USER), ("SWITCHYARD_ETCD_PASSWORD", wrong)],
    )
    .await;
    assert_eq!(code, Some(1), "{stderr}");
    assert!(stderr.contains("etcd authentication failed for user \"switchyard\""), "{stderr}");
    assert!(!stderr.contains(wrong), "{stderr}");

    // A user without a password.
    let (_, stderr) =
        refused_start(&store, &good_flags, &[("SWITCHYARD_ETCD_USER", ETCD_USER)]).await;
    assert!(stderr.contains("SWITCHYARD_ETCD_PASSWORD is not"), "{stderr}");

    // A CA file that is no certificate; a key file that does not exist.
    let garbage = ca.dir().join("garbage.pem");
    std::fs::write(&garbage, "not a certificate").unwrap();
    let garbage = path(&garbage);
    let creds = [("SWITCHYARD_ETCD_USER", ETCD_USER), ("SWITCHYARD_ETCD_PASSWORD", ETCD_PASSWORD)];
    let flags = ["--etcd-ca", &garbage, "--etcd-cert", &cert, "--etcd-key", &key];
    let mut refusals = Vec::new();
    let (code, stderr) = refused_start(&store, &flags, &creds).await;
    assert_eq!(code, Some(1), "{stderr}");
    assert!(stderr.contains(&format!("--etcd-ca {garbage}")), "{stderr}");
    refusals.push(stderr);
    let missing = path(&ca.dir().join("missing-key.pem"));
    let flags = ["--etcd-ca", &ca_path, "--etcd-cert", &cert, "--etcd-key", &missing];
    let (_, stderr) = refused_start(&store, &flags, &creds).await;
    assert!(stderr.contains(&format!("--etcd-key {missing}")), "{stderr}");
    refusals.push(stderr);

    // A CA that did not sign the member's certificate: the error names the endpoint.
    let other = Ca::new("another CA");
    let other_ca = path(other.cert_path());
    let flags = ["--etcd-ca", &other_ca, "--etcd-cert", &cert, "--etcd-key", &key];
    let (_, stderr) = refused_start(&store, &flags, &creds).await;
    let endpoint = &cluster.endpoints()[0];
    assert!(stderr.contains(endpoint.as_str()) && stderr.contains("certificate"), "{stderr}");
    refusals.push(stderr);
    // These ran with the real password set: none of them shows it.
    for stderr in &refusals {
        assert!(!stderr.contains(ETCD_PASSWORD), "{stderr}");
    }

    // With every part right, it starts and serves admin calls as the limited user.
    let dir = tempfile::tempdir().unwrap();
    let cp = start_control(&cluster, &ca, dir.path(), "cp").await;
    let created = cli(&cp.url(), &["keys", "create", "--name", "k", "--json"]).await.json();
    assert!(created["version"].as_i64().unwrap() > 0);
}
