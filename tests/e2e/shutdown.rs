//! End to end: how a node and a control plane stop on SIGTERM — the signal Kubernetes and
//! process supervisors send — with real processes, the simulator and a real etcd.
#![allow(clippy::unwrap_used, clippy::expect_used, clippy::panic)]

use std::net::SocketAddr;
use std::path::Path;
use std::process::{ExitStatus, Stdio};
use std::time::{Duration, Instant};

use serde_json::{Value, json};
use tokio::io::{AsyncBufReadExt, AsyncReadExt, AsyncWriteExt, BufReader};
use tokio::net::TcpStream;
use tokio::process::{Child, Command};

use switchyard_e2e::etcd::EtcdProcess;
use switchyard_e2e::fake_node::{FakeNode, failover_event};
use switchyard_e2e::gateway::{Gateway, GatewayOptions, PRIMARY, SECONDARY, stream_chat};
use switchyard_e2e::*;

/// The drain timeout the tests give nodes: long enough for every request they start.
const DRAIN: Duration = Duration::from_secs(10);

/// How soon after its last answer a draining node must have exited. Wall time (a real
/// process): a loaded machine's slack, yet half the drain timeout, which a node that
/// waited the timeout out would run into (its requests take 2 s at most).
const EXIT_AFTER_LAST_ANSWER: Duration = Duration::from_secs(5);

fn sigterm(pid: u32) {
    signal(pid, "TERM");
}

fn signal(pid: u32, name: &str) {
    let status = std::process::Command::new("kill")
        .args([&format!("-{name}"), &pid.to_string()])
        .status()
        .expect("kill runs");
    assert!(status.success(), "kill -{name} {pid} failed");
}

/// Waits for `child` to exit, at most `limit`; returns its status and how long it took.
async fn exits_within(child: &mut Child, limit: Duration, what: &str) -> (ExitStatus, Duration) {
    let started = Instant::now();
    match tokio::time::timeout(limit, child.wait()).await {
        Ok(status) => (status.unwrap(), started.elapsed()),
        Err(_) => panic!("{what} did not exit within {limit:?} of SIGTERM"),
    }
}

/// Polls the node's `/readyz` until it answers 503 `draining`.
async fn reports_draining(addr: SocketAddr) {
    eventually(PATIENCE, "/readyz to answer 503 draining", || async move {
        let r = http_get(addr, "/readyz", None).await?;
        (r.status == 503 && r.json()["reason"] == "draining").then_some(())
    })
    .await;
}

/// Waits until the simulator has received `n` requests for `upstream_model`: they are in
/// flight on the node.
async fn in_flight(gw: &Gateway, upstream_model: &str, n: u64) {
    eventually(Duration::from_secs(10), "requests to reach the upstream", || async {
        (gw.upstream_requests(upstream_model).await >= n).then_some(())
    })
    .await;
}

fn node_options(extra: Vec<&'static str>) -> GatewayOptions {
    let mut node_args = vec!["--drain-timeout", "10s"];
    node_args.extend(extra);
    GatewayOptions { node_args, ..GatewayOptions::default() }
}

fn chat_body(model: &str, fallbacks: &[&str], stream: bool) -> Vec<u8> {
    json!({"model": model, "fallback_models": fallbacks, "stream": stream,
           "messages": [{"role": "user", "content": "hello"}]})
    .to_string()
    .into_bytes()
}

/// Starts `n` chat requests on their own connections.
fn start_requests(
    addr: SocketAddr,
    key: &str,
    body: &[u8],
    n: usize,
) -> tokio::task::JoinSet<Option<HttpResponse>> {
    let mut set = tokio::task::JoinSet::new();
    for _ in 0..n {
        let (key, body) = (key.to_owned(), body.to_vec());
        set.spawn(async move {
            http_request(addr, "POST", "/v1/chat/completions", Some(&key), Some(&body)).await
        });
    }
    set
}

/// Every response, in completion order; a request that got no response at all is `None`.
async fn responses(
    mut set: tokio::task::JoinSet<Option<HttpResponse>>,
) -> Vec<Option<HttpResponse>> {
    let mut all = Vec::new();
    while let Some(r) = set.join_next().await {
        all.push(r.unwrap());
    }
    all
}

fn failed(responses: &[Option<HttpResponse>]) -> Vec<String> {
    responses
        .iter()
        .filter_map(|r| match r {
            Some(r) if r.status == 200 => None,
            Some(r) => Some(format!("{} {}", r.status, r.body)),
            None => Some("no response".to_owned()),
        })
        .collect()
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_node_under_load_finishes_every_request_in_flight_on_sigterm_and_hands_over_its_events() {
    let mut gw = Gateway::start_with(node_options(vec![])).await;
    // Every request fails over (one failover event each) to a model that takes 1.5 s.
    gw.script("primary", json!({"kind": "status", "status": 503})).await;
    gw.script("secondary", json!({"kind": "ok", "delay_ms": 1500})).await;
    let clients = 6;
    let requests =
        start_requests(gw.node.addr, &gw.key, &chat_body(PRIMARY, &[SECONDARY], false), clients);
    in_flight(&gw, "secondary", clients as u64).await;

    sigterm(gw.node.child.id().unwrap());
    reports_draining(gw.node.addr).await;
    // A request that comes during the drain is refused with a clear answer.
    let late =
        gw.chat(json!({"model": PRIMARY, "messages": [{"role": "user", "content": "hi"}]})).await;
    assert_eq!(late.status, 503, "{}", late.body);
    assert_eq!(late.json()["error"]["code"], "draining", "{}", late.body);

    let responses = responses(requests).await;
    assert_eq!(failed(&responses), Vec::<String>::new(), "every request in flight is answered");
    for r in responses.iter().flatten() {
        assert_eq!(r.json()["secureai"]["served_model"], SECONDARY, "{}", r.body);
    }
    let (status, took) = exits_within(&mut gw.node.child, PATIENCE, "the node").await;
    assert!(status.success(), "the node exits 0, not {status}; log:\n{}", gw.node.log_text());
    assert!(took < EXIT_AFTER_LAST_ANSWER, "exited {took:?} after its last answer");

    // Handed over before the node exited: the events and the usage of the drained requests
    // are stored, although usage reports otherwise go out every 5 s.
    let events = cli(&gw.cp.url(), &["events", "--json", "--key", &gw.key_id]).await;
    assert!(events.success, "{}", events.stderr);
    assert_eq!(events.stdout.lines().count(), clients, "{}", events.stdout);
    let usage = cli(&gw.cp.url(), &["usage", "--key", &gw.key_id, "--json"]).await.json();
    let row = usage
        .as_array()
        .unwrap()
        .iter()
        .find(|r| r["model"] == SECONDARY)
        .unwrap_or_else(|| panic!("no usage for {SECONDARY}: {usage}"));
    assert_eq!(row["requests"], clients, "{usage}");
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_second_ctrl_c_stops_the_node_without_finishing_the_drain() {
    let mut gw = Gateway::start_with(node_options(vec![])).await;
    // Longer than the drain timeout: a node that finished the drain would exit at its end.
    gw.script("primary", json!({"kind": "ok", "delay_ms": 30000})).await;
    let requests = start_requests(gw.node.addr, &gw.key, &chat_body(PRIMARY, &[], false), 1);
    in_flight(&gw, "primary", 1).await;
    let pid = gw.node.child.id().unwrap();
    signal(pid, "INT");
    reports_draining(gw.node.addr).await;
    signal(pid, "INT");
    // Wall time (a real process): at once, with a loaded machine's slack, against the 10 s
    // drain timeout.
    let (status, _) = exits_within(&mut gw.node.child, Duration::from_secs(5), "the node").await;
    assert_eq!(status.code(), Some(130), "{status}");
    drop(requests);
}

/// A streaming request's status and `data:` payloads.
async fn stream_request(addr: SocketAddr, key: String, body: Vec<u8>) -> (u16, Vec<String>) {
    let streamed = stream_chat(addr, &key, &body).await;
    (streamed.status, streamed.frames)
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_stream_in_flight_runs_to_its_end_on_sigterm() {
    let mut gw = Gateway::start_with(node_options(vec![])).await;
    // Ten chunks 200 ms apart: two seconds of stream.
    gw.script("primary", json!({"kind": "ok", "chunks": 10, "chunk_delay_ms": 200})).await;
    let streams = 3;
    let mut set = tokio::task::JoinSet::new();
    for _ in 0..streams {
        set.spawn(stream_request(gw.node.addr, gw.key.clone(), chat_body(PRIMARY, &[], true)));
    }
    in_flight(&gw, "primary", streams).await;

    sigterm(gw.node.child.id().unwrap());
    reports_draining(gw.node.addr).await;
    while let Some(result) = set.join_next().await {
        let (status, frames) = result.unwrap();
        assert_eq!(status, 200);
        assert_eq!(frames.last().map(String::as_str), Some("[DONE]"), "{frames:?}");
        let content = frames
            .iter()
            .filter_map(|f| serde_json::from_str::<Value>(f).ok())
            .filter(|c| c["choices"][0]["delta"]["content"].as_str().is_some_and(|t| !t.is_empty()))
            .count();
        assert_eq!(content, 10, "every chunk arrived: {frames:?}");
        assert!(!frames.iter().any(|f| f.contains("\"error\"")), "{frames:?}");
    }
    let (status, took) = exits_within(&mut gw.node.child, PATIENCE, "the node").await;
    assert!(status.success(), "the node exits 0, not {status}; log:\n{}", gw.node.log_text());
    assert!(took < EXIT_AFTER_LAST_ANSWER, "exited {took:?} after its last answer");
}

/// Starts `switchyard node` as PID 1 of a new PID namespace, as in a container without an
/// init; returns the `unshare` process, the node's PID as seen from here, and its address.
async fn start_node_as_pid_1(control: &str, dir: &Path) -> (Child, u32, SocketAddr) {
    let data = dir.join("pid1-node").display().to_string();
    let log = std::fs::File::create(dir.join("pid1-node.log")).unwrap();
    let bin = switchyard_bin().display().to_string();
    let mut child = Command::new("unshare")
        .args(["--pid", "--fork", "--kill-child", &bin, "node", "--control", control])
        .args(["--listen", "127.0.0.1:0", "--data-dir", &data, "--drain-timeout", "10s"])
        .env("RUST_LOG", "info")
        .stdin(Stdio::null())
        .stdout(Stdio::piped())
        .stderr(Stdio::from(log))
        .kill_on_drop(true)
        .spawn()
        .expect("unshare runs");
    let mut lines = BufReader::new(child.stdout.take().unwrap()).lines();
    let addr = tokio::time::timeout(Duration::from_secs(20), async {
        while let Some(line) = lines.next_line().await.unwrap() {
            if let Some((_, addr)) = line.split_once("listening on ") {
                return addr.trim().parse::<SocketAddr>().unwrap();
            }
        }
        panic!("the node in its PID namespace did not start");
    })
    .await
    .expect("the node starts");
    tokio::spawn(async move { while let Ok(Some(_)) = lines.next_line().await {} });
    let unshare = child.id().unwrap();
    let children =
        std::fs::read_to_string(format!("/proc/{unshare}/task/{unshare}/children")).unwrap();
    let pid: u32 = children.split_whitespace().next().unwrap().parse().unwrap();
    (child, pid, addr)
}

/// The process's PID inside its own (innermost) PID namespace.
fn pid_in_namespace(pid: u32) -> u32 {
    let status = std::fs::read_to_string(format!("/proc/{pid}/status")).unwrap();
    let line = status.lines().find(|l| l.starts_with("NSpid:")).unwrap();
    line.split_whitespace().last().unwrap().parse().unwrap()
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_node_running_as_pid_1_drains_and_exits_on_sigterm() {
    let gw = Gateway::start_with(node_options(vec![])).await;
    let version = node_version(gw.node.addr).await.unwrap();
    let (mut unshare, pid, addr) = start_node_as_pid_1(&gw.cp.url(), gw.path()).await;
    // PID 1 ignores every signal it has no handler for, SIGTERM included.
    assert_eq!(pid_in_namespace(pid), 1, "the node is its namespace's init");
    eventually(Duration::from_secs(10), "the PID-1 node to apply the config", || async move {
        node_version(addr).await.filter(|v| *v >= version)
    })
    .await;
    gw.script("primary", json!({"kind": "ok", "delay_ms": 1500})).await;
    let requests = start_requests(addr, &gw.key, &chat_body(PRIMARY, &[], false), 2);
    in_flight(&gw, "primary", 2).await;

    sigterm(pid);
    reports_draining(addr).await;
    assert_eq!(failed(&responses(requests).await), Vec::<String>::new());
    let (status, took) = exits_within(&mut unshare, PATIENCE, "the PID-1 node").await;
    let log = std::fs::read_to_string(gw.path().join("pid1-node.log")).unwrap_or_default();
    assert!(status.success(), "the node exits 0, not {status}; log:\n{log}");
    assert!(took < EXIT_AFTER_LAST_ANSWER, "exited {took:?} after its last answer");
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_stalled_request_body_is_cut_off_after_the_body_read_timeout() {
    let gw = Gateway::start_with(node_options(vec!["--body-read-timeout", "1s"])).await;
    // A raw socket: the point is a body that stops short of its Content-Length, which an HTTP
    // client does not send.
    let mut socket = TcpStream::connect(gw.node.addr).await.unwrap();
    let head = format!(
        "POST /v1/chat/completions HTTP/1.1\r\nHost: x\r\nAuthorization: Bearer {}\r\nContent-Type: application/json\r\nContent-Length: 1000\r\n\r\n",
        gw.key
    );
    socket.write_all(head.as_bytes()).await.unwrap();
    socket.write_all(b"{\"model\":").await.unwrap();
    let started = Instant::now();
    let mut raw = Vec::new();
    tokio::time::timeout(Duration::from_secs(10), socket.read_to_end(&mut raw))
        .await
        .expect("the node ends the exchange")
        .unwrap();
    let took = started.elapsed();
    let text = String::from_utf8_lossy(&raw);
    assert!(text.starts_with("HTTP/1.1 408"), "{text}");
    assert!(text.contains("request_timeout"), "{text}");
    assert!(took >= Duration::from_millis(900), "cut off after the timeout, not before: {took:?}");
    // Wall time (a real process): the 1 s timeout and a loaded machine's slack, against the
    // 30 s default a node that ignored the flag would wait.
    assert!(took < Duration::from_secs(5), "{took:?}");

    // A body that arrives in time is not affected by the timer.
    let r =
        gw.chat(json!({"model": PRIMARY, "messages": [{"role": "user", "content": "hi"}]})).await;
    assert_eq!(r.status, 200, "{}", r.body);
}

/// A client that sent a request's head and half its body used to hold a node's shutdown
/// until the body read timeout (30 s by default): the node now finishes the work in flight,
/// answers that request 503 `draining` and exits.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_body_still_arriving_at_sigterm_gets_503_after_the_work_in_flight_and_the_node_exits() {
    // Drain and body timeouts far beyond the bound asserted: only an answer that does not
    // wait for either passes.
    let node_args = vec!["--drain-timeout", "30s", "--body-read-timeout", "60s"];
    let mut gw =
        Gateway::start_with(GatewayOptions { node_args, ..GatewayOptions::default() }).await;
    gw.script("primary", json!({"kind": "ok", "delay_ms": 1500})).await;
    let requests = start_requests(gw.node.addr, &gw.key, &chat_body(PRIMARY, &[], false), 1);
    in_flight(&gw, "primary", 1).await;
    // A raw socket, as above: a body that stops short.
    let mut half = TcpStream::connect(gw.node.addr).await.unwrap();
    let head = format!(
        "POST /v1/chat/completions HTTP/1.1\r\nHost: x\r\nAuthorization: Bearer {}\r\nContent-Type: application/json\r\nContent-Length: 1000\r\n\r\n",
        gw.key
    );
    half.write_all(head.as_bytes()).await.unwrap();
    half.write_all(b"{\"model\":").await.unwrap();

    let stopped = Instant::now();
    sigterm(gw.node.child.id().unwrap());
    reports_draining(gw.node.addr).await;
    let mut raw = Vec::new();
    tokio::time::timeout(Duration::from_secs(10), half.read_to_end(&mut raw))
        .await
        .expect("the half-sent request is answered, not left to its body read timeout")
        .unwrap();
    let text = String::from_utf8_lossy(&raw);
    assert!(text.starts_with("HTTP/1.1 503"), "{text}");
    assert!(text.contains("\"code\":\"draining\""), "{text}");
    // The request really in flight was served, not cut.
    assert_eq!(failed(&responses(requests).await), Vec::<String>::new());
    let (status, _) = exits_within(&mut gw.node.child, Duration::from_secs(10), "the node").await;
    assert!(status.success(), "the node exits 0, not {status}; log:\n{}", gw.node.log_text());
    let took = stopped.elapsed();
    assert!(took < Duration::from_secs(10), "not held for the 30 s drain timeout: {took:?}");
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn half_open_and_idle_connections_do_not_hold_up_the_drain() {
    let mut gw = Gateway::start_with(node_options(vec![])).await;
    // Half a head (raw bytes no HTTP client sends): the header-read timeout (30 s) would hold it.
    let mut half_open = TcpStream::connect(gw.node.addr).await.unwrap();
    half_open.write_all(b"POST /v1/chat/completions HTTP/1.1\r\nHost: x\r\n").await.unwrap();
    // An idle keep-alive connection that has served a request.
    let mut idle = TcpStream::connect(gw.node.addr).await.unwrap();
    idle.write_all(b"GET /healthz HTTP/1.1\r\nHost: x\r\n\r\n").await.unwrap();
    let mut buf = vec![0u8; 1024];
    let n = idle.read(&mut buf).await.unwrap();
    assert!(String::from_utf8_lossy(&buf[..n]).starts_with("HTTP/1.1 200"));

    sigterm(gw.node.child.id().unwrap());
    let (status, took) = exits_within(&mut gw.node.child, DRAIN, "the node").await;
    assert!(status.success(), "the node exits 0, not {status}; log:\n{}", gw.node.log_text());
    // Wall time (a real process): at once, with a loaded machine's slack, against the 10 s
    // drain timeout and the 30 s header-read timeout that would hold the half-open one.
    assert!(took < Duration::from_secs(5), "the drain waited for nothing: {took:?}");
    for (name, socket) in [("half-open", &mut half_open), ("idle", &mut idle)] {
        let read = tokio::time::timeout(Duration::from_secs(5), socket.read(&mut buf)).await;
        assert!(matches!(read, Ok(Ok(0) | Err(_))), "the {name} connection is closed: {read:?}");
    }
}

/// The number of keys under the elections prefix in etcd, read through etcd's JSON gateway: each replica has one key per election it campaigns in.
async fn election_candidates(etcd: &str) -> Option<u64> {
    let addr: SocketAddr = etcd.trim_start_matches("http://").parse().ok()?;
    // base64 of "/switchyard/elections/" and of its range end "/switchyard/elections0".
    let body = br#"{"key": "L3N3aXRjaHlhcmQvZWxlY3Rpb25zLw==", "range_end": "L3N3aXRjaHlhcmQvZWxlY3Rpb25zMA==", "count_only": true}"#;
    let r = http_request(addr, "POST", "/v3/kv/range", None, Some(body)).await?;
    // etcd omits zero-valued fields.
    Some(r.json()["count"].as_str().map_or(0, |c| c.parse().unwrap_or(0)))
}

/// The control plane `switchyard nodes` on `control` says `node_id` is connected to.
async fn connected_to(control: &str, node_id: &str) -> Option<String> {
    let out = cli(control, &["nodes", "--json"]).await;
    if !out.success {
        return None;
    }
    let nodes: Value = serde_json::from_str(&out.stdout).ok()?;
    let node = nodes["nodes"].as_array()?.iter().find(|n| n["node_id"] == node_id)?;
    node["control_plane"].as_str().map(str::to_owned)
}

const CATALOG: &str = "providers:
  - name: p
    kind: openai-compatible
    base_url: http://127.0.0.1:9/v1
models:
  - name: p/m
    provider: p
    upstream_model: m
";

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_control_plane_stopped_with_sigterm_leaves_its_elections_and_its_nodes_move_to_the_other_replica()
 {
    let dir = tempfile::tempdir().unwrap();
    let etcd = EtcdProcess::start().await;
    let store = etcd.endpoint().replace("http://", "etcd://");
    let token = [("SWITCHYARD_ADMIN_TOKEN", ADMIN_TOKEN)];
    // A drain timeout far beyond the bound asserted: only a replica that does not wait it
    // out passes.
    let args = ["control", "--store", &store, "--listen", "127.0.0.1:0", "--drain-timeout", "30s"];
    let mut cp1 = Proc::start(&args, &token, dir.path().join("cp1.log")).await;
    let cp2 = Proc::start(&args, &token, dir.path().join("cp2.log")).await;
    let catalog = dir.path().join("catalog.yaml");
    std::fs::write(&catalog, CATALOG).unwrap();
    cli(&cp1.url(), &["apply", "-f", &catalog.display().to_string(), "--json"]).await.json();
    let controls = format!("{},{}", cp1.url(), cp2.url());
    let node_dir = dir.path().join("node");
    let node = start_node(&controls, &node_dir, "127.0.0.1:0", dir.path().join("node.log")).await;
    let node_id = std::fs::read_to_string(node_dir.join("node_id")).unwrap();
    let cp1_addr = cp1.addr.to_string();
    let cp2_addr = cp2.addr.to_string();
    eventually(Duration::from_secs(10), "the node to connect to cp1", || async {
        (connected_to(&cp2.url(), &node_id).await? == cp1_addr).then_some(())
    })
    .await;
    // Both replicas campaign in both elections (webhook delivery, audit retention).
    eventually(Duration::from_secs(10), "both replicas to campaign", || async {
        (election_candidates(etcd.endpoint()).await? == 4).then_some(())
    })
    .await;

    // Wall time below (real processes and etcd): at once means within a loaded machine's
    // slack, against the drain timeout and the 10 s lease of the candidacies.
    let stopped = Instant::now();
    sigterm(cp1.child.id().unwrap());
    let (status, _) =
        exits_within(&mut cp1.child, Duration::from_secs(5), "the control plane").await;
    assert!(status.success(), "cp1 exits 0, not {status}; log:\n{}", cp1.log_text());
    // Its candidacies are gone at once, not when its 10 s lease expires: cp2 leads both.
    eventually(Duration::from_secs(2), "cp1 to leave the elections", || async {
        (election_candidates(etcd.endpoint()).await? == 2).then_some(())
    })
    .await;
    assert!(stopped.elapsed() < Duration::from_secs(5), "{:?}", stopped.elapsed());

    // The node moved to cp2 and takes changes from it.
    eventually(PATIENCE, "the node to move to cp2", || async {
        (connected_to(&cp2.url(), &node_id).await? == cp2_addr).then_some(())
    })
    .await;
    let created = cli(&cp2.url(), &["keys", "create", "--name", "after", "--json"]).await.json();
    let version = created["version"].as_i64().unwrap();
    eventually(PATIENCE, "the node to apply a change made on cp2", || async {
        node_version(node.addr).await.filter(|v| *v >= version)
    })
    .await;
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_control_plane_on_the_embedded_store_ends_its_node_streams_at_once_and_frees_the_store() {
    let dir = tempfile::tempdir().unwrap();
    let store = format!("file://{}", dir.path().join("store").display());
    let token = [("SWITCHYARD_ADMIN_TOKEN", ADMIN_TOKEN)];
    let args = ["control", "--store", &store, "--listen", "127.0.0.1:0", "--drain-timeout", "10s"];
    let mut cp = Proc::start(&args, &token, dir.path().join("cp.log")).await;
    let node_dir = dir.path().join("node");
    let node = start_node(&cp.url(), &node_dir, "127.0.0.1:0", dir.path().join("node.log")).await;
    let node_id = std::fs::read_to_string(node_dir.join("node_id")).unwrap();
    eventually(Duration::from_secs(10), "the node to connect", || async {
        connected_to(&cp.url(), &node_id).await
    })
    .await;
    let mut fake = FakeNode::connect(&cp.url(), "n1").await;
    fake.send_next(vec![failover_event("evt-1", 1, "key_1")]).await;

    sigterm(cp.child.id().unwrap());
    // Node streams end at once, with a status that sends nodes elsewhere. Wall time (a real
    // process): 5 s is a loaded machine's slack, against the 10 s drain timeout.
    let ended = tokio::time::timeout(Duration::from_secs(5), async {
        loop {
            match fake.reply().await {
                Ok(Some(_)) => {}
                other => return other,
            }
        }
    })
    .await
    .expect("the node stream ends at once");
    assert_eq!(ended.unwrap_err().code(), tonic::Code::Unavailable);
    // Nothing else is open: no need to wait out the 10 s drain timeout. Wall time (a real
    // process), with a loaded machine's slack.
    let (status, _) =
        exits_within(&mut cp.child, Duration::from_secs(5), "the control plane").await;
    assert!(status.success(), "exits 0, not {status}; log:\n{}", cp.log_text());
    // Its replacement opens the same store.
    let again = start_control(&store, "127.0.0.1:0", dir.path(), "cp-again").await;
    assert_eq!(cli(&again.url(), &["nodes", "--json"]).await.code, Some(0));
    drop(node);
}

/// An `events --follow` client used to hold a stopping control plane for its whole drain
/// timeout, then die with an h2 "broken pipe" error: it now ends at once, in the CLI's
/// words, with exit status 1, and the control plane exits without waiting for it.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn an_events_follow_client_ends_at_once_in_words_when_its_control_plane_stops() {
    let dir = tempfile::tempdir().unwrap();
    let store = format!("file://{}", dir.path().join("store").display());
    let token = [("SWITCHYARD_ADMIN_TOKEN", ADMIN_TOKEN)];
    // A drain timeout far beyond what the test allows: only a stream that ends at once
    // lets the control plane exit in time.
    let args = ["control", "--store", &store, "--listen", "127.0.0.1:0", "--drain-timeout", "30s"];
    let mut cp = Proc::start(&args, &token, dir.path().join("cp.log")).await;
    let mut fake = FakeNode::connect(&cp.url(), "n1").await;
    fake.send_next(vec![failover_event("evt-1", 1, "key_1")]).await;
    let mut follower = Command::new(switchyard_bin())
        .args(["events", "--follow", "--json"])
        .env("SWITCHYARD_CONTROL", cp.url())
        .env("SWITCHYARD_ADMIN_TOKEN", ADMIN_TOKEN)
        .stdout(Stdio::piped())
        .stderr(Stdio::piped())
        .kill_on_drop(true)
        .spawn()
        .unwrap();
    let mut lines = BufReader::new(follower.stdout.take().unwrap()).lines();
    let first = tokio::time::timeout(PATIENCE, lines.next_line()).await;
    assert!(matches!(first, Ok(Ok(Some(_)))), "the follower is connected: {first:?}");
    let mut stderr = follower.stderr.take().unwrap();

    // Wall time below (real processes): 10 s leaves a loaded machine its slack against the
    // 30 s drain timeout that a follower holding the stream would run into.
    let stopped = Instant::now();
    sigterm(cp.child.id().unwrap());
    let (status, _) = exits_within(&mut follower, Duration::from_secs(10), "the follower").await;
    let mut said = String::new();
    stderr.read_to_string(&mut said).await.unwrap();
    assert_eq!(status.code(), Some(1), "{said}");
    assert_eq!(
        said.lines().collect::<Vec<_>>(),
        [
            format!(
                "error: the event stream from {} ended: this control plane is shutting down",
                cp.url()
            ),
            "hint: follow again (`switchyard events --follow`) once it is back, or on another \
             replica: --control takes a comma-separated list"
                .to_owned(),
        ],
    );
    let (status, _) =
        exits_within(&mut cp.child, Duration::from_secs(10), "the control plane").await;
    assert!(status.success(), "exits 0, not {status}; log:\n{}", cp.log_text());
    let took = stopped.elapsed();
    assert!(took < Duration::from_secs(10), "not held for the 30 s drain timeout: {took:?}");
}
