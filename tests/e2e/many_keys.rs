//! End to end: a node takes a store of thousands of keys — a snapshot of several chunks,
//! applied as they arrive — serves them, writes one key change to its last-known-good as an
//! appended line, and restarts from those files with no control plane.
#![allow(clippy::unwrap_used, clippy::expect_used)]

use switchyard_catalog::keys::hash_secret;
use switchyard_catalog::{ApiKeyRecord, FailoverDefaults, KeyStatus};
use switchyard_control_plane::layout::Layout;
use switchyard_control_plane::store::{self, Txn, TxnOp};
use switchyard_e2e::*;

/// Four chunks of the control plane's 500 resources and a part of a fifth.
const KEYS: usize = 2_100;

const CATALOG: &str = "providers:\n  - name: sim\n    kind: openai-compatible\n    base_url: http://127.0.0.1:9/v1\n    region: us\nmodels:\n  - name: primary\n    provider: sim\n    upstream_model: primary\n  - name: secondary\n    provider: sim\n    upstream_model: secondary\n";

fn secret(i: usize) -> String {
    format!("sy-many{i:05}-{:0>24}", i * 7919)
}

/// Writes the keys straight into the store, as the control plane's admin API would have
/// (the same layout and record). Every tenth key is revoked.
async fn seed(store_url: &str) -> i64 {
    let store = store::open(store_url, Default::default()).await.unwrap();
    let layout = Layout::new("/switchyard/");
    let mut batch = Vec::new();
    for i in 0..KEYS {
        let id = format!("key_many{i:05}");
        let secret = secret(i);
        let record = ApiKeyRecord {
            id: id.clone(),
            name: format!("tenant-{i}"),
            created_unix_ms: 1,
            updated_unix_ms: 1,
            status: if i % 10 == 3 { KeyStatus::Revoked } else { KeyStatus::Active },
            secret_sha256: hash_secret(&secret),
            secret_hint: secret[secret.len() - 4..].to_owned(),
            // Two kinds of settings: shared between the keys that have the same.
            failover_defaults: Some(FailoverDefaults {
                models: if i % 2 == 0 { vec!["primary".into()] } else { vec!["secondary".into()] },
                ..Default::default()
            }),
            allowed_models: if i % 2 == 0 { vec![] } else { vec!["secondary".into()] },
            allowed_regions: vec![],
            limits: None,
        };
        let value = serde_json::to_vec(&record).unwrap();
        batch.push(TxnOp::Put { key: layout.key(&id), value, lease: None });
        if batch.len() == 128 || i + 1 == KEYS {
            let txn = Txn { compare: vec![], success: std::mem::take(&mut batch), failure: vec![] };
            store.txn(txn).await.unwrap();
        }
    }
    store.list(&layout.config_prefix()).await.unwrap().revision
}

async fn models(node: &Proc, secret: &str) -> (u16, serde_json::Value) {
    let r = http_get(node.addr, "/v1/models", Some(secret)).await.unwrap();
    (r.status, serde_json::from_str(&r.body).unwrap_or_default())
}

fn model_ids(body: &serde_json::Value) -> Vec<String> {
    body["data"].as_array().map_or(vec![], |d| {
        d.iter().map(|m| m["id"].as_str().unwrap_or_default().to_owned()).collect()
    })
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn thousands_of_keys_arrive_in_chunks_persist_a_change_as_one_line_and_serve_after_a_restart()
{
    let dir = tempfile::tempdir().unwrap();
    let store_url = format!("file://{}", dir.path().join("store").display());
    // The catalog through the admin API; then the control plane goes while keys are seeded.
    let cp = start_control(&store_url, "127.0.0.1:0", dir.path(), "control-0").await;
    let catalog = dir.path().join("catalog.yaml");
    std::fs::write(&catalog, CATALOG).unwrap();
    let control = format!("http://{}", cp.addr);
    let applied = cli(&control, &["apply", "-f", &catalog.display().to_string()]).await;
    assert!(applied.success, "{}", applied.stderr);
    cp.kill().await;
    let seeded = seed(&store_url).await;

    let cp = start_control(&store_url, "127.0.0.1:0", dir.path(), "control-1").await;
    let control = format!("http://{}", cp.addr);
    let node_dir = dir.path().join("node");
    let node = start_node(&control, &node_dir, "127.0.0.1:0", dir.path().join("node.log")).await;
    eventually(PATIENCE, "the node at the seeded version", || async {
        node_version(node.addr).await.filter(|v| *v >= seeded)
    })
    .await;
    // Keys from every chunk, with their own settings; revoked ones refused.
    for i in [0, 499, 500, 1001, 1999, KEYS - 1] {
        let (status, body) = models(&node, &secret(i)).await;
        assert_eq!(status, 200, "key {i}");
        let expected = if i % 2 == 0 { vec!["primary", "secondary"] } else { vec!["secondary"] };
        assert_eq!(model_ids(&body), expected, "key {i}'s allowed models");
    }
    assert_eq!(models(&node, &secret(13)).await.0, 401, "a revoked key");
    assert_eq!(models(&node, "sy-not-a-key").await.0, 401);

    // The snapshot is written whole once; a change after it is one appended line.
    eventually(PATIENCE, "the snapshot on disk", || async {
        node_dir.join("config.base").exists().then_some(())
    })
    .await;
    let base = std::fs::read(node_dir.join("config.base")).unwrap();
    assert!(base.len() > KEYS * 100, "the base holds every key: {} bytes", base.len());
    let revoked = cli(&control, &["keys", "revoke", "key_many00042", "--json"]).await.json();
    let version = revoked["version"].as_i64().unwrap();
    eventually(PATIENCE, "the revocation at the node", || async {
        (models(&node, &secret(42)).await.0 == 401).then_some(())
    })
    .await;
    let log = eventually(PATIENCE, "the change in the log", || async {
        let log = std::fs::read_to_string(node_dir.join("config.log")).ok()?;
        log.contains(&format!("{{\"version\":{version},")).then_some(log)
    })
    .await;
    assert!(log.len() < 1024, "one key change appended {} bytes: {log}", log.len());
    let after = std::fs::read(node_dir.join("config.base")).unwrap();
    assert!(after == base, "the base was not rewritten");

    // No control plane: the node restarts from its base and log.
    cp.kill().await;
    node.kill().await;
    let node = start_node(&control, &node_dir, "127.0.0.1:0", dir.path().join("node-2.log")).await;
    let restarted = eventually(PATIENCE, "the restarted node ready", || async {
        node_version(node.addr).await
    })
    .await;
    assert_eq!(restarted, version);
    assert_eq!(models(&node, &secret(42)).await.0, 401, "the change survived the restart");
    assert_eq!(models(&node, &secret(13)).await.0, 401);
    for i in [0, 1001, KEYS - 1] {
        assert_eq!(models(&node, &secret(i)).await.0, 200, "key {i} after the restart");
    }
}
