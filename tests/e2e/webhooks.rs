//! End to end: webhooks from real control planes on a real etcd to a real HTTP receiver on
//! loopback that verifies every delivery with the official Standard Webhooks library
//! (`webhook_receiver.py`, `standardwebhooks` from PyPI; `.ci/run` installs it).
//!
//! A test plays the node with a real `NodeControlClient`, so failover events and breaker
//! transitions enter through the real protocol and are acked only once stored.
#![allow(clippy::unwrap_used, clippy::expect_used, clippy::panic)]

use std::collections::BTreeSet;
use std::path::{Path, PathBuf};
use std::process::Stdio;
use std::time::{Duration, Instant};

use serde_json::Value;
use switchyard_e2e::etcd::EtcdProcess;
use switchyard_e2e::fake_node::{FakeNode, failover_event};
use switchyard_e2e::*;
use switchyard_proto::node::v1::{self as pb, node_message};
use tokio::io::{AsyncBufReadExt, BufReader};
use tokio::process::{Child, Command};
use tokio::sync::mpsc;

/// A Standard Webhooks secret (the form the official libraries take).
const SECRET: &str = "whsec_MfKQ9r8GKYqrTwjUPD8ILPZIo2LaLaSw";
const WAIT: Duration = Duration::from_secs(30);

// === the receiver ===

struct Receiver {
    child: Child,
    /// Held while the receiver is down too, so that it comes back where subscriptions point.
    port: ReservedPort,
    log: PathBuf,
}

impl Receiver {
    /// Starts the receiver on a port of its own.
    async fn start(dir: &Path) -> Receiver {
        Self::start_on(dir, ReservedPort::new()).await
    }

    /// Starts the receiver on `port` (one it had: its log survives the restart).
    async fn start_on(dir: &Path, port: ReservedPort) -> Receiver {
        let script =
            PathBuf::from(env!("CARGO_MANIFEST_DIR")).join("../tests/e2e/webhook_receiver.py");
        let log = dir.join("receiver.jsonl");
        let mut child = Command::new(python())
            .arg(&script)
            .arg(port.port().to_string())
            .arg(SECRET)
            .arg(&log)
            .stdin(Stdio::null())
            .stdout(Stdio::piped())
            .kill_on_drop(true)
            .spawn()
            .unwrap();
        let mut lines = BufReader::new(child.stdout.take().unwrap()).lines();
        let line = tokio::time::timeout(Duration::from_secs(20), lines.next_line())
            .await
            .expect("receiver did not start")
            .unwrap()
            .expect("receiver exited (is standardwebhooks installed in .venv? run .ci/run)");
        assert_eq!(line.trim(), format!("listening on {}", port.addr()), "the receiver's address");
        tokio::spawn(async move { while let Ok(Some(_)) = lines.next_line().await {} });
        Receiver { child, port, log }
    }

    fn url(&self, path: &str) -> String {
        format!("http://{}{path}", self.port.addr())
    }

    async fn stop(mut self) -> (ReservedPort, PathBuf) {
        let _ = self.child.kill().await;
        let _ = self.child.wait().await;
        (self.port, self.log.clone())
    }

    async fn answer(&self, status: u16) {
        self.mode(serde_json::json!({"status": status})).await;
    }

    async fn mode(&self, mode: Value) {
        let addr = self.port.addr();
        let body = mode.to_string();
        let r = http_request(addr, "POST", "/_mode", None, Some(body.as_bytes())).await.unwrap();
        assert_eq!(r.status, 200);
    }
}

/// Every request the receiver logged.
fn records(log: &Path) -> Vec<Value> {
    std::fs::read_to_string(log)
        .unwrap_or_default()
        .lines()
        // The last line may be half written while the receiver runs.
        .filter_map(|l| serde_json::from_str(l).ok())
        .collect()
}

/// Event payloads of the verified, accepted deliveries to `path`, one per event (a batch
/// delivery is unpacked).
fn accepted(log: &Path, path: &str) -> Vec<Value> {
    let mut out = Vec::new();
    for r in records(log) {
        if r["path"] != path || r["status"] != 200 || r["verified"] != true {
            continue;
        }
        match &r["payload"] {
            Value::Array(items) => out.extend(items.iter().cloned()),
            one => out.push(one.clone()),
        }
    }
    out
}

fn event_ids(payloads: &[Value]) -> BTreeSet<String> {
    payloads.iter().map(|p| p["data"]["event_id"].as_str().unwrap().to_owned()).collect()
}

async fn wait_for_ids(log: &Path, path: &str, want: &BTreeSet<String>, timeout: Duration) {
    let start = Instant::now();
    loop {
        let got = event_ids(&accepted(log, path));
        if want.is_subset(&got) {
            return;
        }
        if start.elapsed() > timeout {
            let missing: Vec<_> = want.difference(&got).take(10).collect();
            panic!(
                "after {timeout:?}, {} of {} events reached {path}; missing e.g. {missing:?}",
                want.intersection(&got).count(),
                want.len()
            );
        }
        // The polling interval.
        tokio::time::sleep(Duration::from_millis(50)).await;
    }
}

// === control planes ===

struct Cluster {
    dir: tempfile::TempDir,
    _etcd: EtcdProcess,
    store: String,
    /// Where each replica listens (a port of its own, read when it starts; kept after it is
    /// killed, to recognise it as the leader its election key may still name).
    addrs: [String; 2],
    cps: [Option<Proc>; 2],
    extra: Vec<String>,
}

impl Cluster {
    async fn start(extra: &[&str]) -> Cluster {
        let dir = tempfile::tempdir().unwrap();
        let etcd = EtcdProcess::start().await;
        let store = etcd.endpoint().replace("http://", "etcd://");
        let mut cluster = Cluster {
            dir,
            _etcd: etcd,
            store,
            addrs: [String::new(), String::new()],
            cps: [None, None],
            extra: extra.iter().map(|s| (*s).to_owned()).collect(),
        };
        // Either may lead: a test that cares asks which one does (`leader`).
        cluster.start_cp(0).await;
        cluster.start_cp(1).await;
        cluster
    }

    async fn start_cp(&mut self, i: usize) {
        let mut args = vec![
            "control",
            "--store",
            &self.store,
            "--listen",
            "127.0.0.1:0",
            "--webhook-min-backoff-ms",
            "100",
            "--webhook-max-backoff-ms",
            "1000",
        ];
        if !self.extra.iter().any(|a| a == "--webhook-timeout-ms") {
            args.extend(["--webhook-timeout-ms", "2000"]);
        }
        args.extend(self.extra.iter().map(String::as_str));
        let log = self.dir.path().join(format!("cp{i}-{}.log", now_ms()));
        let envs = [
            ("SWITCHYARD_ADMIN_TOKEN", ADMIN_TOKEN),
            ("WEBHOOK_SECRET", SECRET),
            ("RUST_LOG", "info,switchyard_control_plane::webhooks=debug"),
        ];
        let cp = Proc::start(&args, &envs, log).await;
        self.addrs[i] = cp.addr.to_string();
        self.cps[i] = Some(cp);
    }

    async fn kill(&mut self, i: usize) {
        if let Some(cp) = self.cps[i].take() {
            cp.kill().await;
        }
    }

    fn url(&self, i: usize) -> String {
        format!("http://{}", self.addrs[i])
    }

    /// Any live replica's URL, for admin commands.
    fn admin(&self) -> String {
        let i = self.cps.iter().position(Option::is_some).unwrap();
        self.url(i)
    }

    /// Applies the catalog; returns its version.
    async fn apply(&self, yaml: &str) -> i64 {
        let file = self.dir.path().join(format!("catalog-{}.yaml", now_ms()));
        std::fs::write(&file, yaml).unwrap();
        let out = cli(&self.admin(), &["apply", "-f", file.to_str().unwrap(), "--json"]).await;
        out.json()["version"].as_i64().unwrap()
    }

    async fn deliveries(&self, name: &str) -> Value {
        cli(&self.admin(), &["webhooks", "deliveries", name, "--json"]).await.json()
    }

    /// Waits until a replica leads the webhook election; returns its index.
    async fn leader(&self, name: &str) -> usize {
        eventually(WAIT, "a webhook leader", || async {
            let leader = self.deliveries(name).await["leader"].as_str()?.to_owned();
            self.addrs.iter().position(|a| *a == leader)
        })
        .await
    }
}

impl Drop for Cluster {
    /// A failing test shows what the control planes said.
    fn drop(&mut self) {
        if !std::thread::panicking() {
            return;
        }
        let mut logs: Vec<_> = std::fs::read_dir(self.dir.path())
            .into_iter()
            .flatten()
            .flatten()
            .map(|e| e.path())
            .filter(|p| p.extension().is_some_and(|e| e == "log"))
            .collect();
        logs.sort();
        for log in logs {
            let text = std::fs::read_to_string(&log).unwrap_or_default();
            let tail: Vec<&str> = text.lines().rev().take(40).collect();
            eprintln!("--- {} (last lines)", log.display());
            for line in tail.into_iter().rev() {
                eprintln!("{line}");
            }
        }
    }
}

fn webhook_catalog(hooks: &[(&str, &str, &str)]) -> String {
    // (name, url, extra YAML lines)
    let mut yaml = String::from("webhooks:\n");
    for (name, url, extra) in hooks {
        yaml.push_str(&format!(
            "  - name: {name}\n    url: {url}\n    secret: env:WEBHOOK_SECRET\n    internal: true\n{extra}"
        ));
    }
    yaml
}

// === a node ===

async fn send_breaker(node: &mut FakeNode, from: &str, to: &str) {
    let t = pb::BreakerTransition {
        provider: "openai".into(),
        upstream_model: "gpt-5-nano".into(),
        from: from.into(),
        to: to.into(),
        cause: "failure_rate".into(),
        at_unix_ms: now_ms(),
        failure_rate: 0.8,
        calls_in_window: 20,
        next_probe_unix_ms: now_ms() + 30_000,
        cooldown_ms: 30_000,
        ..Default::default()
    };
    node.send(node_message::Msg::Breaker(t)).await;
    // Messages on a stream are handled in order: this ack follows the breaker's write.
    node.send_next(vec![]).await;
}

/// A request that timed out on the primary and was served by the fallback, now.
fn event(id: &str, key_id: &str) -> pb::FailoverEvent {
    failover_event(id, now_ms(), key_id)
}

fn ids(prefix: &str, range: std::ops::Range<usize>) -> Vec<String> {
    range.map(|i| format!("{prefix}-{i:04}")).collect()
}

async fn send_all(node: &mut FakeNode, ids: &[String], per_batch: usize) {
    for chunk in ids.chunks(per_batch) {
        node.send_next(chunk.iter().map(|id| event(id, "key_1")).collect()).await;
    }
}

// === tests ===

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn failovers_and_breakers_arrive_signed_and_the_official_verifier_accepts_every_one() {
    let mut cluster = Cluster::start(&[]).await;
    let receiver = Receiver::start(cluster.dir.path()).await;
    let catalog = webhook_catalog(&[
        ("all", &receiver.url("/all"), "    events: [\"*\"]\n"),
        ("key2", &receiver.url("/key2"), "    events: [api:model_failover]\n    keys: [key_2]\n"),
        (
            "batched",
            &receiver.url("/batched"),
            "    events: [api:model_failover]\n    batch_max_events: 10\n",
        ),
    ]);
    let version = cluster.apply(&catalog).await;
    let leader = cluster.leader("all").await;
    // Nodes connect to the replica that does not deliver: queueing is every replica's job.
    let mut node = FakeNode::connect(&cluster.url(1 - leader), "n1").await;
    node.wait_config(version).await;
    let mut failovers = Vec::new();
    for i in 0..20 {
        failovers.push(event(&format!("ev-{i:02}"), if i % 2 == 0 { "key_1" } else { "key_2" }));
    }
    node.send_next(failovers[..10].to_vec()).await;
    node.send_next(failovers[10..].to_vec()).await;
    send_breaker(&mut node, "closed", "open").await;

    let want: BTreeSet<String> = failovers.iter().map(|e| e.id.clone()).collect();
    wait_for_ids(&receiver.log, "/batched", &want, WAIT).await;
    wait_for_ids(&receiver.log, "/all", &want, WAIT).await;
    let key2: BTreeSet<String> =
        failovers.iter().filter(|e| e.key_id == "key_2").map(|e| e.id.clone()).collect();
    wait_for_ids(&receiver.log, "/key2", &key2, WAIT).await;
    let breaker = eventually(WAIT, "the breaker.opened delivery", || async {
        accepted(&receiver.log, "/all").into_iter().find(|p| p["type"] == "breaker.opened")
    })
    .await;
    assert_eq!(breaker["data"]["provider"], "openai");
    assert_eq!(breaker["data"]["from"], "closed");
    assert_eq!(breaker["data"]["node_id"], "n1");

    // Every request the receiver saw passed the official verifier.
    let all = records(&receiver.log);
    assert!(all.iter().all(|r| r["verified"] == true), "unverified deliveries: {all:?}");
    // The per-key filter held, and batches were arrays of at most 10.
    assert_eq!(event_ids(&accepted(&receiver.log, "/key2")), key2);
    let batches: Vec<_> = all.iter().filter(|r| r["path"] == "/batched").collect();
    assert!(batches.iter().all(|r| r["payload"].as_array().is_some_and(|a| a.len() <= 10)));
    assert!(batches.len() < 20, "batching sent {} requests for 20 events", batches.len());

    // The payload: Standard Webhooks' {type, timestamp, data}, data the failover report.
    let one = accepted(&receiver.log, "/all")
        .into_iter()
        .find(|p| p["data"]["event_id"] == "ev-03")
        .unwrap();
    assert_eq!(one["type"], "api:model_failover");
    assert!(one["timestamp"].as_str().unwrap().ends_with('Z'));
    assert_eq!(one["data"]["key_id"], "key_2");
    assert_eq!(one["data"]["requested_model"], "openai/gpt-5-nano");
    assert_eq!(one["data"]["served_model"], "anthropic/claude-sonnet-4");
    assert_eq!(one["data"]["failover"]["attempts"][0]["reason"], "timeout");
    // webhook-id is the event id.
    assert!(all.iter().any(|r| r["path"] == "/all" && r["webhook_id"] == "ev-03"));

    let state = cluster.deliveries("all").await;
    assert_eq!(state["dead"], 0);
    cluster.kill(0).await;
    cluster.kill(1).await;
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_receiver_that_was_down_gets_every_event_when_it_returns() {
    let cluster = Cluster::start(&[]).await;
    let receiver = Receiver::start(cluster.dir.path()).await;
    let version = cluster
        .apply(&webhook_catalog(&[("hook", &receiver.url("/hook"), "    events: [\"*\"]\n")]))
        .await;
    cluster.leader("hook").await;
    let (port, log) = receiver.stop().await;

    let mut node = FakeNode::connect(&cluster.url(0), "n1").await;
    node.wait_config(version).await;
    let all = ids("down", 0..200);
    send_all(&mut node, &all, 20).await;
    // Down long enough for several failed attempts and backoffs.
    eventually(WAIT, "failed attempts while the receiver is down", || async {
        let state = cluster.deliveries("hook").await;
        (state["consecutive_failures"].as_u64()? >= 3).then_some(())
    })
    .await;
    let backlog = cluster.deliveries("hook").await["backlog"].as_u64().unwrap();
    assert_eq!(backlog, 200, "every event is owed while the receiver is down");

    let _receiver = Receiver::start_on(cluster.dir.path(), port).await;
    let want: BTreeSet<String> = all.into_iter().collect();
    wait_for_ids(&log, "/hook", &want, WAIT).await;
    // The failure count is in the subscription's state record, which the leader writes
    // at intervals: it may show the drained backlog before the reset count.
    let state = eventually(WAIT, "the backlog to drain and the failure count to reset", || async {
        let s = cluster.deliveries("hook").await;
        (s["backlog"] == 0 && s["consecutive_failures"] == 0).then_some(s)
    })
    .await;
    assert_eq!(state["dead"], 0);
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn when_the_leader_dies_mid_stream_the_other_replica_delivers_the_rest() {
    let mut cluster = Cluster::start(&[]).await;
    let receiver = Receiver::start(cluster.dir.path()).await;
    let version = cluster
        .apply(&webhook_catalog(&[("hook", &receiver.url("/hook"), "    events: [\"*\"]\n")]))
        .await;
    let leader = cluster.leader("hook").await;
    let other = 1 - leader;
    // The node stays on the replica that survives.
    let mut node = FakeNode::connect(&cluster.url(other), "n1").await;
    node.wait_config(version).await;
    let all = ids("kill", 0..300);
    send_all(&mut node, &all[..100], 10).await;
    let first: BTreeSet<String> = all[..20].iter().cloned().collect();
    wait_for_ids(&receiver.log, "/hook", &first, WAIT).await;

    // Killed, not stopped: its election key lives until its lease expires.
    cluster.kill(leader).await;
    send_all(&mut node, &all[100..], 10).await;

    let want: BTreeSet<String> = all.into_iter().collect();
    wait_for_ids(&receiver.log, "/hook", &want, Duration::from_secs(60)).await;
    assert_eq!(cluster.leader("hook").await, other);
    let dups = accepted(&receiver.log, "/hook").len() - want.len();
    eprintln!(
        "leader failover: {} events, {dups} delivered twice (deduplicated by webhook-id)",
        want.len()
    );
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn restarting_both_control_planes_loses_nothing_in_the_outbox() {
    let mut cluster = Cluster::start(&[]).await;
    let receiver = Receiver::start(cluster.dir.path()).await;
    let version = cluster
        .apply(&webhook_catalog(&[("hook", &receiver.url("/hook"), "    events: [\"*\"]\n")]))
        .await;
    cluster.leader("hook").await;
    let (port, log) = receiver.stop().await;
    let mut node = FakeNode::connect(&cluster.url(1), "n1").await;
    node.wait_config(version).await;
    let all = ids("restart", 0..100);
    send_all(&mut node, &all, 25).await;
    drop(node);

    cluster.kill(0).await;
    cluster.kill(1).await;
    cluster.start_cp(0).await;
    cluster.start_cp(1).await;

    let _receiver = Receiver::start_on(cluster.dir.path(), port).await;
    let want: BTreeSet<String> = all.into_iter().collect();
    wait_for_ids(&log, "/hook", &want, Duration::from_secs(60)).await;
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_receiver_failing_forever_dead_letters_after_the_age_and_redeliver_sends_them_again() {
    let cluster = Cluster::start(&["--webhook-max-age", "3s"]).await;
    let receiver = Receiver::start(cluster.dir.path()).await;
    receiver.answer(500).await;
    let version = cluster
        .apply(&webhook_catalog(&[(
            "hook",
            &receiver.url("/hook"),
            "    events: [api:model_failover]\n",
        )]))
        .await;
    cluster.leader("hook").await;
    let mut node = FakeNode::connect(&cluster.url(0), "n1").await;
    node.wait_config(version).await;
    let all = ids("dead", 0..5);
    send_all(&mut node, &all, 5).await;

    let state = eventually(WAIT, "every event dead-lettered", || async {
        let s = cluster.deliveries("hook").await;
        (s["dead"] == 5 && s["backlog"] == 0).then_some(s)
    })
    .await;
    let dead: BTreeSet<String> = state["deliveries"]
        .as_array()
        .unwrap()
        .iter()
        .filter(|d| d["state"] == "dead")
        .map(|d| d["event_id"].as_str().unwrap().to_owned())
        .collect();
    assert_eq!(dead, all.iter().cloned().collect());
    let letter = &state["deliveries"][0];
    assert!(letter["attempts"].as_u64().unwrap() >= 1);
    assert_eq!(letter["last_status"], 500);
    // The receiver got attempts (signed and verified), and answered 500 to each.
    assert!(records(&receiver.log).iter().all(|r| r["verified"] == true && r["status"] == 500));

    // People see it too.
    let human = cli(&cluster.admin(), &["webhooks", "deliveries", "hook"]).await;
    assert!(human.success, "{}", human.stderr);
    assert!(human.stdout.contains("dead 5"), "{}", human.stdout);
    assert!(human.stdout.contains("HTTP 500"), "{}", human.stdout);

    receiver.answer(200).await;
    let out = cli(&cluster.admin(), &["webhooks", "redeliver", "hook", "--all-dead", "--json"])
        .await
        .json();
    assert_eq!(out["requeued"], 5);
    wait_for_ids(&receiver.log, "/hook", &dead, WAIT).await;
    // As above, the reset failure count may show after the drained backlog.
    eventually(WAIT, "no dead letters left and the failure count reset", || async {
        let s = cluster.deliveries("hook").await;
        (s["dead"] == 0 && s["backlog"] == 0 && s["consecutive_failures"] == 0).then_some(())
    })
    .await;

    // One event by id, from the audit log, though it was delivered already.
    let out =
        cli(&cluster.admin(), &["webhooks", "redeliver", "hook", "dead-0002", "nope", "--json"])
            .await
            .json();
    assert_eq!(out["requeued"], 1);
    assert_eq!(out["not_found"][0], "nope");
    eventually(WAIT, "the redelivered event", || async {
        let n = accepted(&receiver.log, "/hook")
            .iter()
            .filter(|p| p["data"]["event_id"] == "dead-0002")
            .count();
        (n >= 2).then_some(())
    })
    .await;
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn an_event_the_receiver_refuses_with_a_4xx_is_dead_at_once_and_others_still_flow() {
    let cluster = Cluster::start(&[]).await;
    let receiver = Receiver::start(cluster.dir.path()).await;
    receiver.answer(410).await;
    let version = cluster
        .apply(&webhook_catalog(&[("hook", &receiver.url("/hook"), "    events: [\"*\"]\n")]))
        .await;
    cluster.leader("hook").await;
    let mut node = FakeNode::connect(&cluster.url(0), "n1").await;
    node.wait_config(version).await;
    send_all(&mut node, &ids("gone", 0..3), 3).await;
    let state = eventually(WAIT, "three dead letters without waiting for the age", || async {
        let s = cluster.deliveries("hook").await;
        (s["dead"] == 3).then_some(s)
    })
    .await;
    let dead: Vec<_> =
        state["deliveries"].as_array().unwrap().iter().filter(|d| d["state"] == "dead").collect();
    assert!(dead.iter().all(|d| d["last_status"] == 410), "{dead:?}");
    // A refusal is an answer, not an outage: the subscription is not backing off.
    assert_eq!(state["consecutive_failures"], 0);
    receiver.answer(200).await;
    let later: BTreeSet<String> = ids("later", 0..3).into_iter().collect();
    send_all(&mut node, &later.iter().cloned().collect::<Vec<_>>(), 3).await;
    wait_for_ids(&receiver.log, "/hook", &later, WAIT).await;
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn one_event_the_receiver_keeps_failing_does_not_hold_back_the_others() {
    let cluster = Cluster::start(&["--webhook-max-age", "3s"]).await;
    let receiver = Receiver::start(cluster.dir.path()).await;
    receiver.mode(serde_json::json!({"status": 200, "fail_ids": ["poison-0000"]})).await;
    let version = cluster
        .apply(&webhook_catalog(&[("hook", &receiver.url("/hook"), "    events: [\"*\"]\n")]))
        .await;
    cluster.leader("hook").await;
    let mut node = FakeNode::connect(&cluster.url(0), "n1").await;
    node.wait_config(version).await;
    send_all(&mut node, &ids("poison", 0..1), 1).await;
    // The poison event failed at least once before the others arrive.
    eventually(WAIT, "the poison event failing", || async {
        let s = cluster.deliveries("hook").await;
        (s["consecutive_failures"].as_u64()? >= 1).then_some(())
    })
    .await;
    let others = ids("after", 0..30);
    send_all(&mut node, &others, 10).await;
    let want: BTreeSet<String> = others.into_iter().collect();
    // Well before the poison event's 3 s age runs out.
    wait_for_ids(&receiver.log, "/hook", &want, Duration::from_secs(2)).await;
    eventually(WAIT, "the poison event dead-lettered", || async {
        let s = cluster.deliveries("hook").await;
        (s["dead"] == 1).then_some(())
    })
    .await;
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn an_endpoint_that_never_answers_does_not_delay_another_subscription() {
    let cluster = Cluster::start(&["--webhook-timeout-ms", "30000"]).await;
    let receiver = Receiver::start(cluster.dir.path()).await;
    // Accepts connections and never answers: every request runs into the timeout.
    let black_hole = tokio::net::TcpListener::bind("127.0.0.1:0").await.unwrap();
    let hole = format!("http://{}/hook", black_hole.local_addr().unwrap());
    let held = tokio::spawn(async move {
        let mut open = Vec::new();
        while let Ok((socket, _)) = black_hole.accept().await {
            open.push(socket);
        }
    });
    let version = cluster
        .apply(&webhook_catalog(&[
            ("slow", &hole, "    events: [\"*\"]\n"),
            ("fast", &receiver.url("/fast"), "    events: [\"*\"]\n"),
        ]))
        .await;
    cluster.leader("fast").await;
    let mut node = FakeNode::connect(&cluster.url(0), "n1").await;
    node.wait_config(version).await;
    let all = ids("iso", 0..100);
    let start = Instant::now();
    send_all(&mut node, &all, 10).await;
    let want: BTreeSet<String> = all.into_iter().collect();
    // Well within one request timeout (30 s here) of the slow subscription. Wall time (real
    // control planes and receiver): 15 s leaves a loaded machine its slack.
    wait_for_ids(&receiver.log, "/fast", &want, WAIT).await;
    assert!(start.elapsed() < Duration::from_secs(15), "took {:?}", start.elapsed());
    let slow = cluster.deliveries("slow").await;
    assert_eq!(slow["delivered"], 0);
    held.abort();
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_node_gone_past_the_grace_is_node_disconnected_and_one_back_in_time_is_not() {
    let cluster = Cluster::start(&["--node-grace", "1s"]).await;
    let receiver = Receiver::start(cluster.dir.path()).await;
    let version = cluster
        .apply(&webhook_catalog(&[(
            "hook",
            &receiver.url("/hook"),
            "    events: [node.disconnected, breaker.half_open, breaker.closed]\n",
        )]))
        .await;
    cluster.leader("hook").await;
    let mut gone = FakeNode::connect(&cluster.url(0), "gone").await;
    gone.wait_config(version).await;
    send_breaker(&mut gone, "open", "half_open").await;
    send_breaker(&mut gone, "half_open", "closed").await;
    let mut back = FakeNode::connect(&cluster.url(0), "back").await;
    back.wait_config(version).await;
    drop(gone);
    drop(back);
    // "back" reconnects within the grace (to the other replica), "gone" does not.
    let mut back = FakeNode::connect(&cluster.url(1), "back").await;
    back.wait_config(version).await;

    let disconnected = eventually(WAIT, "node.disconnected", || async {
        accepted(&receiver.log, "/hook").into_iter().find(|p| p["type"] == "node.disconnected")
    })
    .await;
    assert_eq!(disconnected["data"]["node_id"], "gone");
    let types: Vec<String> = accepted(&receiver.log, "/hook")
        .iter()
        .map(|p| p["type"].as_str().unwrap().to_owned())
        .collect();
    assert!(types.contains(&"breaker.half_open".to_owned()), "{types:?}");
    assert!(types.contains(&"breaker.closed".to_owned()), "{types:?}");
    // An event that must never come cannot be polled for. "back"'s grace ran out with
    // "gone"'s (they were dropped together, and "gone"'s event is in), so a wrong event for
    // it would be queued by now; this is the time its delivery would take, and more.
    tokio::time::sleep(Duration::from_secs(2)).await;
    let for_back = accepted(&receiver.log, "/hook")
        .into_iter()
        .filter(|p| p["type"] == "node.disconnected" && p["data"]["node_id"] == "back")
        .count();
    assert_eq!(for_back, 0, "a node back within the grace is not reported");
    drop(back);
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn webhooks_add_list_remove_edit_the_catalog() {
    let dir = tempfile::tempdir().unwrap();
    let store = format!("file://{}", dir.path().join("store").display());
    let cp = start_control(&store, "127.0.0.1:0", dir.path(), "cp").await;
    let url = cp.url();
    let add = cli(
        &url,
        &[
            "webhooks",
            "add",
            "oncall",
            "--url",
            "http://127.0.0.1:9/hook",
            "--events",
            "api:model_failover,breaker.opened",
            "--secret",
            "env:WEBHOOK_SECRET",
            "--keys",
            "key_1",
            "--internal",
            "--batch-max-events",
            "50",
        ],
    )
    .await;
    assert!(add.success, "{}", add.stderr);
    assert!(add.stdout.contains("+ webhooks/oncall"), "{}", add.stdout);

    let listed = cli(&url, &["webhooks", "list", "--json"]).await.json();
    assert_eq!(listed[0]["name"], "oncall");
    assert_eq!(listed[0]["events"][1], "breaker.opened");
    assert_eq!(listed[0]["secret"], "env:WEBHOOK_SECRET");
    assert_eq!(listed[0]["keys"][0], "key_1");
    assert_eq!(listed[0]["batch_max_events"], 50);

    // A private target without --internal is refused by the control plane, by field.
    let refused =
        cli(&url, &["webhooks", "add", "x", "--url", "http://10.0.0.1/h", "--events", "*"]).await;
    assert!(!refused.success);
    assert!(refused.stderr.contains("internal"), "{}", refused.stderr);
    // A literal secret is refused before anything is sent.
    let literal = cli(
        &url,
        &[
            "webhooks",
            "add",
            "y",
            "--url",
            "https://h.example.com",
            "--events",
            "*",
            "--secret",
            "hunter2",
        ],
    )
    .await;
    assert_eq!(literal.code, Some(2));
    assert!(!literal.stderr.contains("hunter2"));

    let disabled = cli(&url, &["webhooks", "disable", "oncall"]).await;
    assert!(disabled.success, "{}", disabled.stderr);
    let table = cli(&url, &["webhooks", "list"]).await;
    assert!(table.stdout.contains("disabled"), "{}", table.stdout);

    let dup = cli(
        &url,
        &["webhooks", "add", "oncall", "--url", "https://h.example.com", "--events", "*"],
    )
    .await;
    assert!(!dup.success);
    let removed = cli(&url, &["webhooks", "remove", "oncall"]).await;
    assert!(removed.success, "{}", removed.stderr);
    assert!(removed.stdout.contains("- webhooks/oncall"), "{}", removed.stdout);
    assert_eq!(cli(&url, &["webhooks", "list", "--json"]).await.json(), serde_json::json!([]));
}

// === benchmark ===

/// For the benchmark only: a minimal HTTP/1.1 keep-alive receiver that answers 204 at once
/// and logs like `webhook_receiver.py` (with `"raw": true` instead of verifying), to measure
/// the control plane rather than the Python verifier.
async fn raw_receiver(log: PathBuf) -> u16 {
    let (tx, mut rx) = mpsc::unbounded_channel::<String>();
    tokio::spawn(async move {
        use std::io::Write;
        let mut file = std::fs::File::create(&log).unwrap();
        while let Some(line) = rx.recv().await {
            file.write_all(line.as_bytes()).unwrap();
        }
    });
    let addr = http_receiver(move |path, body| {
        let body: Value = serde_json::from_slice(body).unwrap_or_default();
        let record = serde_json::json!({"path": path, "raw": true, "status": 200,
            "payload": body, "received_unix_ms": now_ms()});
        let _ = tx.send(format!("{record}\n"));
        b"HTTP/1.1 204 No Content\r\ncontent-length: 0\r\n\r\n"
    })
    .await;
    addr.port()
}

/// The store's current revision, from etcd's JSON gateway: every write transaction adds one.
async fn etcd_revision(endpoint: &str) -> i64 {
    let addr = endpoint.trim_start_matches("http://").parse().unwrap();
    let r = http_request(addr, "POST", "/v3/kv/range", None, Some(br#"{"key": "AA=="}"#))
        .await
        .unwrap();
    r.json()["header"]["revision"].as_str().unwrap().parse().unwrap()
}

/// An outage storm: `BENCH_NODES` nodes (default 4) send failover events as fast as the
/// control planes ack them for `BENCH_SECS` seconds (default 10), spread over two replicas
/// on one etcd; one subscription takes every event (`BENCH_BATCH` events per request,
/// default 1), delivered to the verifying Python receiver. Prints events/s in, events/s
/// delivered, store writes/s, and delivery lag percentiles. Run:
/// `cargo nextest run -p switchyard-cli --test webhooks --run-ignored only --no-capture bench_`
#[tokio::test(flavor = "multi_thread", worker_threads = 4)]
#[ignore = "benchmark; run on demand"]
async fn bench_outage_storm_events_to_webhooks() {
    let env = |k: &str, d: u64| std::env::var(k).ok().and_then(|v| v.parse().ok()).unwrap_or(d);
    let (nodes, secs, batch) =
        (env("BENCH_NODES", 4), env("BENCH_SECS", 10), env("BENCH_BATCH", 1));
    let cluster = Cluster::start(&["--webhook-concurrency", "16"]).await;
    let raw = std::env::var("BENCH_RECEIVER").is_ok_and(|v| v == "raw");
    let (url, log, _receiver) = if raw {
        let log = cluster.dir.path().join("raw.jsonl");
        let port = raw_receiver(log.clone()).await;
        (format!("http://127.0.0.1:{port}/bench"), log, None)
    } else {
        let receiver = Receiver::start(cluster.dir.path()).await;
        (receiver.url("/bench"), receiver.log.clone(), Some(receiver))
    };
    // Failovers only: the fake nodes' node.disconnected events would come after the run.
    let extra = if batch > 1 {
        format!("    events: [api:model_failover]\n    batch_max_events: {batch}\n")
    } else {
        "    events: [api:model_failover]\n".to_owned()
    };
    let version = cluster.apply(&webhook_catalog(&[("bench", &url, &extra)])).await;
    cluster.leader("bench").await;
    let endpoint = cluster._etcd.endpoint().to_owned();

    let rev0 = etcd_revision(&endpoint).await;
    let start = Instant::now();
    let mut tasks = Vec::new();
    for n in 0..nodes {
        let url = cluster.url((n % 2) as usize);
        tasks.push(tokio::spawn(async move {
            let mut node = FakeNode::connect(&url, &format!("bench-{n}")).await;
            node.wait_config(version).await;
            let mut sent = 0usize;
            let deadline = Instant::now() + Duration::from_secs(secs);
            while Instant::now() < deadline {
                let batch: Vec<_> =
                    (0..50).map(|i| event(&format!("b{n}-{}", sent + i), "key_1")).collect();
                node.send_next(batch).await;
                sent += 50;
            }
            sent
        }));
    }
    let mut total = 0;
    for t in tasks {
        total += t.await.unwrap();
    }
    let sending = start.elapsed();
    let rev1 = etcd_revision(&endpoint).await;

    // Polled slowly and cheaply (the test shares the machine with what it measures); the
    // finish time is the receiver's last receipt, not the poll's.
    let start_ms = now_ms() - i64::try_from(start.elapsed().as_millis()).unwrap();
    loop {
        let lines = std::fs::read_to_string(&log).map_or(0, |t| t.lines().count());
        if lines * (batch as usize) >= total && event_ids(&bench_payloads(&log, raw)).len() >= total
        {
            break;
        }
        assert!(start.elapsed() < Duration::from_secs(600), "not all of {total} delivered");
        // The polling interval (slow: see above).
        tokio::time::sleep(Duration::from_secs(1)).await;
    }
    let rev2 = etcd_revision(&endpoint).await;
    let last_ms =
        records(&log).iter().filter_map(|r| r["received_unix_ms"].as_i64()).max().unwrap();
    let total_time = Duration::from_millis((last_ms - start_ms).max(1) as u64);

    let all = records(&log);
    let unverified: Vec<_> = all.iter().filter(|r| r["verified"] != true && !raw).collect();
    assert!(
        unverified.is_empty(),
        "{} unverified, e.g. {:?}",
        unverified.len(),
        unverified.first()
    );
    let mut first_seen = std::collections::HashMap::new();
    for r in all {
        let at = r["received_unix_ms"].as_i64().unwrap();
        let items = match &r["payload"] {
            Value::Array(items) => items.clone(),
            one => vec![one.clone()],
        };
        for p in items {
            let id = p["data"]["event_id"].as_str().unwrap().to_owned();
            let lag = at - p["data"]["at_unix_ms"].as_i64().unwrap();
            first_seen.entry(id).or_insert(lag);
        }
    }
    let lags: Vec<Duration> =
        first_seen.values().map(|ms| Duration::from_millis((*ms).max(0) as u64)).collect();
    let requests = records(&log).len();
    eprintln!(
        "BENCH receiver={} nodes={nodes} batch={batch} events={total} in {:.1}s: {:.0} events/s acked from nodes; \
         delivered all in {:.1}s ({:.0} events/s, {requests} requests); \
         store writes {:.0}/s while sending, {:.0}/s overall; \
         delivery lag p50 {:?} p99 {:?} max {:?}",
        if raw { "raw" } else { "standardwebhooks" },
        sending.as_secs_f64(),
        total as f64 / sending.as_secs_f64(),
        total_time.as_secs_f64(),
        total as f64 / total_time.as_secs_f64(),
        (rev1 - rev0) as f64 / sending.as_secs_f64(),
        (rev2 - rev0) as f64 / total_time.as_secs_f64(),
        percentile(&lags, 50.0),
        percentile(&lags, 99.0),
        percentile(&lags, 100.0),
    );
}

fn bench_payloads(log: &Path, raw: bool) -> Vec<Value> {
    if !raw {
        return accepted(log, "/bench");
    }
    let mut out = Vec::new();
    for r in records(log) {
        match &r["payload"] {
            Value::Array(items) => out.extend(items.iter().cloned()),
            one => out.push(one.clone()),
        }
    }
    out
}

// === no event lost silently ===

fn lost_report(id: &str, count: u64) -> pb::EventsLost {
    pb::EventsLost {
        id: id.into(),
        count,
        reason: "spool_full".into(),
        events: "failover".into(),
        first_unix_ms: now_ms() - 1_000,
        last_unix_ms: now_ms(),
    }
}

async fn send_lost(node: &mut FakeNode, report: pb::EventsLost) {
    let id = report.id.clone();
    node.send(node_message::Msg::Lost(report)).await;
    node.wait_for("events.lost ack", |m| match m {
        pb::control_message::Msg::LostAck(ack) if ack.id == id => Some(()),
        _ => None,
    })
    .await;
}

/// `switchyard events --json`: one object per line.
async fn audit_log(control: &str) -> Vec<Value> {
    let out = cli(control, &["events", "--json", "--limit", "1000"]).await;
    assert!(out.success, "events failed: {}", out.stderr);
    out.stdout.lines().map(|l| serde_json::from_str(l).unwrap()).collect()
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_nodes_count_of_lost_events_is_one_audit_entry_and_a_webhook_even_when_resent() {
    let cluster = Cluster::start(&[]).await;
    let receiver = Receiver::start(cluster.dir.path()).await;
    let version = cluster
        .apply(&webhook_catalog(&[("lost", &receiver.url("/lost"), "    events: [events.lost]\n")]))
        .await;
    cluster.leader("lost").await;
    let report = lost_report("lost_boot1_1", 15);
    let mut node = FakeNode::connect(&cluster.url(0), "n1").await;
    node.wait_config(version).await;
    send_lost(&mut node, report.clone()).await;
    // The ack was lost (say): the node resends the same report on its next stream, to the
    // other replica.
    drop(node);
    let mut node = FakeNode::connect(&cluster.url(1), "n1").await;
    node.wait_config(version).await;
    send_lost(&mut node, report.clone()).await;

    let want: BTreeSet<String> = [report.id.clone()].into();
    wait_for_ids(&receiver.log, "/lost", &want, WAIT).await;
    let delivered = accepted(&receiver.log, "/lost");
    let one = &delivered[0];
    assert_eq!(one["type"], "events.lost");
    assert_eq!(one["data"]["count"], 15);
    assert_eq!(one["data"]["node_id"], "n1");
    assert_eq!(one["data"]["reason"], "spool_full");

    let lost: Vec<Value> = audit_log(&cluster.admin())
        .await
        .into_iter()
        .filter(|e| e["type"] == "events.lost")
        .collect();
    assert_eq!(lost.len(), 1, "a resent report is one entry: {lost:?}");
    assert_eq!((lost[0]["count"].as_u64(), lost[0]["node_id"].as_str()), (Some(15), Some("n1")));
    // Stored once, queued once: nothing more is owed, and one delivery was made.
    let state = eventually(WAIT, "the backlog to drain", || async {
        let s = cluster.deliveries("lost").await;
        (s["backlog"] == 0).then_some(s)
    })
    .await;
    assert_eq!(state["dead"], 0);
    // Delivery stays at least once (a resend after the entry was delivered and removed
    // from the outbox queues it again): receivers deduplicate by the event id.
    assert_eq!(event_ids(&accepted(&receiver.log, "/lost")), want);
}

/// Keys under `prefix` in etcd (its JSON gateway).
async fn etcd_count(store: &str, prefix: &str) -> u64 {
    use base64::Engine as _;
    let b64 = |b: &[u8]| base64::engine::general_purpose::STANDARD.encode(b);
    let mut end = prefix.as_bytes().to_vec();
    *end.last_mut().unwrap() += 1;
    let body = serde_json::json!({"key": b64(prefix.as_bytes()), "range_end": b64(&end), "count_only": true});
    let addr = store.trim_start_matches("etcd://").parse().unwrap();
    let r = http_request(addr, "POST", "/v3/kv/range", None, Some(body.to_string().as_bytes()))
        .await
        .unwrap();
    r.json()["count"].as_str().map_or(0, |c| c.parse().unwrap())
}

fn transition(from: &str, to: &str, at_unix_ms: i64, seq: u64) -> pb::BreakerTransition {
    pb::BreakerTransition {
        provider: "openai".into(),
        upstream_model: "gpt-5-nano".into(),
        from: from.into(),
        to: to.into(),
        cause: "failure_rate".into(),
        at_unix_ms,
        failure_rate: 0.8,
        calls_in_window: 20,
        cooldown_ms: 30_000,
        seq,
        ..Default::default()
    }
}

async fn send_acked(node: &mut FakeNode, t: pb::BreakerTransition) {
    let seq = t.seq;
    node.send(node_message::Msg::Breaker(t)).await;
    node.wait_for("breakers ack", |m| match m {
        pb::control_message::Msg::BreakersAck(ack) if ack.seq >= seq => Some(()),
        _ => None,
    })
    .await;
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_breaker_transition_is_acked_once_stored_and_a_resend_is_not_a_second_event() {
    let cluster = Cluster::start(&[]).await;
    let receiver = Receiver::start(cluster.dir.path()).await;
    let version = cluster
        .apply(&webhook_catalog(&[("brk", &receiver.url("/brk"), "    events: [\"*\"]\n")]))
        .await;
    cluster.leader("brk").await;
    let opened_at = now_ms();
    let mut node = FakeNode::connect(&cluster.url(0), "n1").await;
    node.wait_config(version).await;
    // Acked means stored: the record shows it before anything else is sent.
    send_acked(&mut node, transition("closed", "open", opened_at, 1)).await;
    let listed = cli(&cluster.admin(), &["breakers", "--json"]).await;
    assert!(listed.stdout.contains("\"open\""), "{}", listed.stdout);
    // Delivered, and gone from the outbox: a resend that queued it again would be sent again.
    eventually(WAIT, "breaker.opened delivered and removed from the outbox", || async {
        let delivered =
            accepted(&receiver.log, "/brk").iter().any(|p| p["type"] == "breaker.opened");
        let left = etcd_count(&cluster.store, "/switchyard/webhooks/outbox/").await;
        (delivered && left == 0).then_some(())
    })
    .await;

    // The ack did not reach the node (say): it resends the transition on a new stream.
    drop(node);
    let mut node = FakeNode::connect(&cluster.url(1), "n1").await;
    node.wait_config(version).await;
    send_acked(&mut node, transition("closed", "open", opened_at, 1)).await;
    // A later transition, queued after the resend was handled.
    send_acked(&mut node, transition("open", "half_open", opened_at + 30_000, 2)).await;

    eventually(WAIT, "the half_open delivery and an empty backlog", || async {
        let got = accepted(&receiver.log, "/brk");
        let half = got.iter().any(|p| p["type"] == "breaker.half_open");
        (half && cluster.deliveries("brk").await["backlog"] == 0).then_some(())
    })
    .await;
    let opened: Vec<Value> = accepted(&receiver.log, "/brk")
        .into_iter()
        .filter(|p| p["type"] == "breaker.opened")
        .collect();
    assert_eq!(opened.len(), 1, "the transition is one event, delivered once: {opened:?}");
}

// === a new subscription ===

async fn add_webhook(control: &str, name: &str, url: &str) {
    let args = [
        "webhooks",
        "add",
        name,
        "--url",
        url,
        "--events",
        "api:model_failover",
        "--secret",
        "env:WEBHOOK_SECRET",
        "--internal",
    ];
    let out = cli(control, &args).await;
    assert!(out.success, "webhooks add {name}: {}", out.stderr);
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_subscription_added_just_before_an_event_on_another_replica_gets_it() {
    let cluster = Cluster::start(&[]).await;
    let receiver = Receiver::start(cluster.dir.path()).await;
    let version = cluster
        .apply(&webhook_catalog(&[(
            "first",
            &receiver.url("/first"),
            "    events: [api:model_failover]\n",
        )]))
        .await;
    let leader = cluster.leader("first").await;
    // The node is on the replica that neither took the apply nor (if it can be helped)
    // delivers.
    let mut node = FakeNode::connect(&cluster.url(1 - leader), "n1").await;
    node.wait_config(version).await;
    let mut want = BTreeSet::new();
    for round in 0..3 {
        let name = format!("late{round}");
        add_webhook(&cluster.url(leader), &name, &receiver.url(&format!("/{name}"))).await;
        // At once, on the other replica: acked means stored, and queued for `name`.
        let id = format!("ev-{name}");
        node.send_next(vec![event(&id, "key_1")]).await;
        // And the catalog changes again before the leader may have looked.
        add_webhook(&cluster.url(leader), &format!("{name}-next"), &receiver.url("/next")).await;
        want.insert((format!("/{name}"), id));
    }
    for (path, id) in want {
        wait_for_ids(&receiver.log, &path, &[id].into(), WAIT).await;
    }
}

// === storms ===

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_storm_for_one_subscription_does_not_starve_another() {
    let cluster = Cluster::start(&["--webhook-timeout-ms", "30000"]).await;
    let receiver = Receiver::start(cluster.dir.path()).await;
    // The storm's subscriptions: one endpoint that never answers (its backlog only grows,
    // holding the outbox), one that takes it in batches.
    let black_hole = tokio::net::TcpListener::bind("127.0.0.1:0").await.unwrap();
    let hole = format!("http://{}/hook", black_hole.local_addr().unwrap());
    let held = tokio::spawn(async move {
        let mut open = Vec::new();
        while let Ok((socket, _)) = black_hole.accept().await {
            open.push(socket);
        }
    });
    let storm = "    events: [api:model_failover]\n    keys: [key_1]\n";
    let batched = format!("{storm}    batch_max_events: 100\n");
    let version = cluster
        .apply(&webhook_catalog(&[
            ("held", &hole, storm),
            ("storm", &receiver.url("/storm"), &batched),
            (
                "quiet",
                &receiver.url("/quiet"),
                "    events: [api:model_failover]\n    keys: [key_2]\n",
            ),
        ]))
        .await;
    cluster.leader("quiet").await;
    let mut node = FakeNode::connect(&cluster.url(0), "n1").await;
    node.wait_config(version).await;
    let mut stormed = BTreeSet::new();
    for round in 0..8 {
        let burst = ids(&format!("storm{round}"), 0..500);
        node.send_next(burst.iter().map(|id| event(id, "key_1")).collect()).await;
        stormed.extend(burst);
        // The other subscription's event, stored behind the storm so far, is delivered
        // promptly all the same.
        let quiet = format!("quiet-{round}");
        node.send_next(vec![event(&quiet, "key_2")]).await;
        wait_for_ids(&receiver.log, "/quiet", &[quiet].into(), Duration::from_secs(5)).await;
    }
    wait_for_ids(&receiver.log, "/storm", &stormed, WAIT).await;
    let held_state = cluster.deliveries("held").await;
    assert_eq!(held_state["delivered"], 0, "the black hole took nothing: {held_state}");
    assert_eq!(event_ids(&accepted(&receiver.log, "/quiet")).len(), 8, "only its own events");
    held.abort();
}
