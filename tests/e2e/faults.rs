//! Injected faults (`switchyard chaos`) applied by a real node at its upstream call, with the
//! simulator behind it: the fault resource is written into etcd under `config/faults/NAME`,
//! the way the control plane stores it, and reaches the node like any config.
#![allow(clippy::unwrap_used, clippy::expect_used)]

use std::net::SocketAddr;
use std::time::{Duration, Instant};

use serde_json::{Value, json};
use switchyard_e2e::etcd::EtcdProcess;
use switchyard_e2e::gateway::*;
use switchyard_e2e::*;

const PREFIX: &str = "/switchyard/config/faults/";

/// A gateway like [`Gateway::start`], with its control plane on a real etcd.
async fn gateway_on_etcd(etcd: &EtcdProcess) -> Gateway {
    let dir = tempfile::tempdir().unwrap();
    let sim = start_sim(dir.path().join("sim.log")).await;
    let store = etcd.endpoint().replace("http://", "etcd://");
    let cp = start_control(&store, "127.0.0.1:0", dir.path(), "cp").await;
    let catalog = dir.path().join("catalog.yaml");
    std::fs::write(&catalog, catalog_yaml(&sim.url(), &GatewayOptions::default())).unwrap();
    let applied =
        cli(&cp.url(), &["apply", "-f", &catalog.display().to_string(), "--json"]).await.json();
    let created = cli(&cp.url(), &["keys", "create", "--name", "e2e", "--json"]).await.json();
    let version = created["version"].as_i64().unwrap().max(applied["version"].as_i64().unwrap());
    let node =
        start_node(&cp.url(), &dir.path().join("node"), "127.0.0.1:0", dir.path().join("node.log"))
            .await;
    let gw = Gateway {
        key: created["key"].as_str().unwrap().to_owned(),
        key_id: created["id"].as_str().unwrap().to_owned(),
        dir,
        sim,
        control: cp.url(),
        cp,
        node,
        node_port: None,
        admin_env: vec![("SWITCHYARD_ADMIN_TOKEN", ADMIN_TOKEN.to_owned())],
        node_ca: None,
    };
    gw.wait_for(version).await;
    gw
}

fn etcd_addr(etcd: &EtcdProcess) -> SocketAddr {
    etcd.endpoint().trim_start_matches("http://").parse().unwrap()
}

fn base64(bytes: &[u8]) -> String {
    const ALPHABET: &[u8] = b"ABCDEFGHIJKLMNOPQRSTUVWXYZabcdefghijklmnopqrstuvwxyz0123456789+/";
    let mut out = String::new();
    for chunk in bytes.chunks(3) {
        let n = chunk.iter().enumerate().fold(0u32, |n, (i, b)| n | u32::from(*b) << (16 - 8 * i));
        for i in 0..4 {
            if i <= chunk.len() {
                out.push(ALPHABET[(n >> (18 - 6 * i) & 63) as usize] as char);
            } else {
                out.push('=');
            }
        }
    }
    out
}

/// One call to etcd's JSON gateway; returns the store revision it produced.
async fn etcd_call(etcd: &EtcdProcess, path: &str, body: Value) -> i64 {
    let r = http_request(etcd_addr(etcd), "POST", path, None, Some(body.to_string().as_bytes()))
        .await
        .expect("etcd answers");
    assert_eq!(r.status, 200, "{path}: {}", r.body);
    r.json()["header"]["revision"].as_str().unwrap().parse().unwrap()
}

/// Stores a fault as the control plane does, and waits until the node applied it.
async fn inject(gw: &Gateway, etcd: &EtcdProcess, name: &str, model: &str, kind: Value) {
    let fault = json!({"name": name, "target": {"model": model}, "rate": 1.0, "kind": kind,
                       "expires_at_unix_ms": now_ms() + 600_000});
    let key = format!("{PREFIX}{name}");
    let body =
        json!({"key": base64(key.as_bytes()), "value": base64(fault.to_string().as_bytes())});
    let revision = etcd_call(etcd, "/v3/kv/put", body).await;
    gw.wait_for(revision).await;
}

fn injected_of(response: &Value) -> Vec<Option<String>> {
    response["secureai"]["failover"]["attempts"]
        .as_array()
        .unwrap()
        .iter()
        .map(|a| a["injected"].as_str().map(str::to_owned))
        .collect()
}

#[tokio::test]
async fn a_503_fault_fails_over_touches_only_its_model_and_ends_when_removed() {
    let etcd = EtcdProcess::start().await;
    let gw = gateway_on_etcd(&etcd).await;
    inject(&gw, &etcd, "primary-down", PRIMARY, json!({"type": "status", "status": 503})).await;
    let failover = json!({"model": PRIMARY, "fallback_models": [SECONDARY],
                          "messages": [{"role": "user", "content": "hello"}]});

    let r = gw.chat(failover.clone()).await;
    assert_eq!(r.status, 200, "{}", r.body);
    let v = r.json();
    assert_eq!(v["model"], SECONDARY);
    assert_eq!(
        attempts(&v),
        [triple(PRIMARY, "failed", "server_error"), triple(SECONDARY, "served", "")]
    );
    assert_eq!(injected_of(&v), [Some("primary-down".to_owned()), None], "{v}");
    assert_eq!(gw.upstream_requests("primary").await, 0, "the fault answered for the upstream");
    let metrics = http_get(gw.node.addr, "/metrics", None).await.unwrap().body;
    assert!(
        metrics.lines().any(|l| l.starts_with("switchyard_injected_faults_total{")
            && l.contains(r#"fault="primary-down""#)
            && l.contains(&format!(r#"model="{PRIMARY}""#))
            && l.contains(r#"kind="status""#)
            && l.ends_with(" 1")),
        "{metrics}"
    );

    // A fault on another model leaves this one alone.
    let other = json!({"model": TERTIARY, "fallback_models": [SECONDARY],
                       "messages": [{"role": "user", "content": "hello"}]});
    let v = gw.chat(other).await.json();
    assert_eq!(v["model"], TERTIARY, "{v}");
    assert_eq!(injected_of(&v), [None]);

    // Removing the resource ends the fault: once the node has the change, the primary
    // serves again. How fast a cleared fault leaves every node (within 1 s at p99) is a
    // figure of `switchyard-bench chaos` on a release build (docs/BENCHMARKS.md), not of a
    // debug build beside other tests.
    let key = format!("{PREFIX}primary-down");
    let revision =
        etcd_call(&etcd, "/v3/kv/deleterange", json!({"key": base64(key.as_bytes())})).await;
    gw.wait_for(revision).await;
    let v = gw.chat(failover).await.json();
    assert_eq!(v["model"], PRIMARY, "{v}");
    assert_eq!(gw.upstream_requests("primary").await, 1);
}

#[tokio::test]
async fn stall_after_3_chunks_ends_the_stream_with_an_error_frame_within_the_stall_timeout() {
    let etcd = EtcdProcess::start().await;
    let gw = gateway_on_etcd(&etcd).await;
    gw.script("stally", json!({"kind": "ok", "text": "a b c d e f g h", "chunks": 8})).await;
    inject(&gw, &etcd, "stream-stall", STALLY, json!({"type": "stall_after", "chunks": 3})).await;
    let started = Instant::now();
    let s = gw
        .stream(json!({"model": STALLY, "stream": true,
                       "messages": [{"role": "user", "content": "hello"}]}))
        .await;
    let took = started.elapsed();
    assert_eq!(s.status, 200);
    let error = s.error_frame().expect("an error frame, not a hang");
    assert_eq!(error["error"]["code"], "stream_stalled", "{error}");
    let content = s
        .chunks()
        .iter()
        .filter(|c| c["choices"][0]["delta"]["content"].as_str().is_some_and(|t| !t.is_empty()))
        .count();
    assert_eq!(content, 3, "three content chunks, then silence: {:?}", s.frames);
    // The catalog gives the model stall_timeout_ms 1000. Wall time (a real node and
    // simulator): a node that missed the model's stall timeout would wait the default 30 s,
    // so 4 s past it is a loaded machine's slack.
    assert!(took < Duration::from_millis(1000 + 4000), "ended after {took:?}");
    assert!(took >= Duration::from_millis(1000), "waited the stall timeout: {took:?}");
}
