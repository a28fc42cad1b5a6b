//! Paged listings (`keys list`, `nodes`, `ListKeys`/`ListNodes`) against a real control
//! plane on the embedded store, seeded with more records than one page holds.
#![allow(clippy::unwrap_used, clippy::expect_used)]

use std::path::Path;

use switchyard_catalog::keys::hash_secret;
use switchyard_catalog::{ApiKeyRecord, KeyStatus};
use switchyard_control_plane::layout::Layout;
use switchyard_control_plane::nodes::{NodeRecord, Rejected};
use switchyard_control_plane::store::embedded::EmbeddedStore;
use switchyard_control_plane::store::{Store, Txn, TxnOp};
use switchyard_e2e::*;
use switchyard_proto::admin::v1 as pb;

const KEYS: usize = 2_500;
const NODES: usize = 2_100;

/// The ids of the seeded keys, in the order listings give them.
fn key_id(i: usize) -> String {
    format!("key_seed{i:06}")
}

fn secret(i: usize) -> String {
    format!("sy-seeded-secret-{i:06}")
}

/// Key `i` is revoked when `i % 5 == 0`; named `team-a-…` when even, else `team-b-…`.
fn key_record(i: usize) -> ApiKeyRecord {
    ApiKeyRecord {
        id: key_id(i),
        name: format!("team-{}-{i}", if i.is_multiple_of(2) { "a" } else { "b" }),
        created_unix_ms: 1_700_000_000_000,
        updated_unix_ms: 1_700_000_000_000,
        status: if i.is_multiple_of(5) { KeyStatus::Revoked } else { KeyStatus::Active },
        secret_sha256: hash_secret(&secret(i)),
        secret_hint: secret(i)[secret(i).len() - 4..].to_owned(),
        failover_defaults: None,
        allowed_models: vec![],
        allowed_regions: vec![],
        limits: None,
    }
}

/// Node `i` is on `cp-b` when `i % 3 == 0` (else `cp-a`), last heard from an hour ago when
/// `i % 7 == 0` (else now), and rejected a version when `i % 100 == 0`.
fn node_record(i: usize, now: i64) -> NodeRecord {
    NodeRecord {
        node_id: format!("node-{i:05}"),
        listen_address: format!("10.0.{}.{}:8080", i / 256, i % 256),
        applied_version: 1,
        last_heartbeat_unix_ms: if i.is_multiple_of(7) { now - 3_600_000 } else { now },
        connected_unix_ms: now - 60_000,
        control_plane: if i.is_multiple_of(3) { "cp-b" } else { "cp-a" }.to_owned(),
        software_version: "0.1.0".into(),
        rejected: i
            .is_multiple_of(100)
            .then(|| Rejected { version: 2, error: "bad config".into() }),
        boot_id: String::new(),
    }
}

/// Writes the keys (as releases before the secret index did: no index entries) and node
/// presence records straight into the store, 128 to a transaction, then closes it.
async fn seed(dir: &Path) -> String {
    seed_counts(dir, KEYS, NODES).await
}

async fn seed_counts(dir: &Path, keys: usize, nodes: usize) -> String {
    let store_dir = dir.join("store");
    let store = EmbeddedStore::open(&store_dir).await.unwrap();
    let layout = Layout::new("/switchyard/");
    let now = switchyard_time::now_ms();
    let mut puts: Vec<TxnOp> = (0..keys)
        .map(|i| TxnOp::Put {
            key: layout.key(&key_id(i)),
            value: serde_json::to_vec(&key_record(i)).unwrap(),
            lease: None,
        })
        .collect();
    puts.extend((0..nodes).map(|i| TxnOp::Put {
        key: layout.node(&format!("node-{i:05}")),
        value: serde_json::to_vec(&node_record(i, now)).unwrap(),
        lease: None,
    }));
    for chunk in puts.chunks(128) {
        store.txn(Txn { success: chunk.to_vec(), ..Txn::default() }).await.unwrap();
    }
    store.close().await;
    format!("file://{}", store_dir.display())
}

async fn seeded_control(dir: &Path) -> Proc {
    let store = seed(dir).await;
    start_control(&store, "127.0.0.1:0", dir, "cp").await
}

fn ids(listed: &serde_json::Value, field: &str) -> Vec<String> {
    listed.as_array().unwrap().iter().map(|k| k[field].as_str().unwrap().to_owned()).collect()
}

/// The token `--limit` printed on stderr to continue with.
fn continue_token(stderr: &str) -> String {
    let (_, token) = stderr.split_once("--page-token ").unwrap_or_else(|| panic!("{stderr}"));
    token.trim().to_owned()
}

#[tokio::test]
async fn keys_list_prints_every_key_once_in_order_across_pages() {
    let dir = tempfile::tempdir().unwrap();
    let cp = seeded_control(dir.path()).await;
    let all: Vec<String> = (0..KEYS).map(key_id).collect();

    let listed = cli(&cp.url(), &["keys", "list", "--json"]).await;
    assert!(listed.stderr.is_empty(), "nothing to continue: {}", listed.stderr);
    assert_eq!(ids(&listed.json(), "id"), all, "one valid JSON array of every key, in order");

    let table = cli(&cp.url(), &["keys", "list"]).await;
    assert!(table.success, "{}", table.stderr);
    let lines: Vec<&str> = table.stdout.lines().collect();
    assert!(lines[0].starts_with("ID "), "one header: {}", lines[0]);
    assert_eq!(lines.iter().filter(|l| l.starts_with("ID ")).count(), 1);
    let rows: Vec<String> =
        lines[1..].iter().map(|l| l.split_whitespace().next().unwrap().to_owned()).collect();
    assert_eq!(rows, all, "a row per key, in order");
}

#[tokio::test]
async fn keys_list_limit_stops_where_page_token_continues() {
    let dir = tempfile::tempdir().unwrap();
    let cp = seeded_control(dir.path()).await;
    let all: Vec<String> = (0..KEYS).map(key_id).collect();

    let first = cli(&cp.url(), &["keys", "list", "--json", "--limit", "1200"]).await;
    assert_eq!(ids(&first.json(), "id"), all[..1200]);
    let token = continue_token(&first.stderr);
    let rest = cli(&cp.url(), &["keys", "list", "--json", "--page-token", &token]).await;
    assert_eq!(ids(&rest.json(), "id"), all[1200..], "the rest, nothing twice");
    assert!(rest.stderr.is_empty(), "{}", rest.stderr);

    let one = cli(&cp.url(), &["keys", "list", "--limit", "1"]).await;
    assert!(one.success, "{}", one.stderr);
    assert_eq!(one.stdout.lines().count(), 2, "a header and one row: {}", one.stdout);
}

#[tokio::test]
async fn keys_list_filters_by_status_name_and_id_prefix() {
    let dir = tempfile::tempdir().unwrap();
    let cp = seeded_control(dir.path()).await;
    let url = cp.url();

    let revoked = cli(&url, &["keys", "list", "--json", "--status", "revoked"]).await.json();
    let expected: Vec<String> = (0..KEYS).filter(|i| i % 5 == 0).map(key_id).collect();
    assert_eq!(ids(&revoked, "id"), expected);
    assert!(revoked.as_array().unwrap().iter().all(|k| k["status"] == "revoked"));

    let args = ["keys", "list", "--json", "--status", "active", "--name-prefix", "team-b-"];
    let active_b = cli(&url, &args).await.json();
    let expected: Vec<String> =
        (0..KEYS).filter(|i| i % 5 != 0 && i % 2 == 1).map(key_id).collect();
    assert_eq!(ids(&active_b, "id"), expected);

    let by_id = cli(&url, &["keys", "list", "--json", "--id-prefix", "key_seed0012"]).await.json();
    let expected: Vec<String> = (1200..1300).map(key_id).collect();
    assert_eq!(ids(&by_id, "id"), expected);

    let none = cli(&url, &["keys", "list", "--name-prefix", "nobody"]).await;
    assert_eq!(none.stdout, "no keys\n");
    let none = cli(&url, &["keys", "list", "--json", "--name-prefix", "nobody"]).await;
    assert_eq!(none.stdout, "[]\n");
}

#[tokio::test]
async fn bad_listing_flags_are_refused_naming_the_flag() {
    let dir = tempfile::tempdir().unwrap();
    let cp = seeded_control(dir.path()).await;
    let url = cp.url();
    for (args, flag) in [
        (&["keys", "list", "--limit", "0"][..], "--limit"),
        (&["keys", "list", "--limit", "many"][..], "--limit"),
        (&["keys", "list", "--status", "expired"][..], "--status"),
        (&["keys", "list", "--name-prefix", ""][..], "--name-prefix"),
        (&["keys", "list", "--page-token", "not a token"][..], "--page-token"),
        (&["nodes", "--limit", "0"][..], "--limit"),
        (&["nodes", "--stale", "soon"][..], "--stale"),
        (&["nodes", "--control-plane", ""][..], "--control-plane"),
    ] {
        let out = cli(&url, args).await;
        assert_eq!(out.code, Some(2), "{args:?}: {}", out.stderr);
        assert!(out.stderr.contains(flag), "{args:?} names {flag}: {}", out.stderr);
        assert!(out.stdout.is_empty(), "{args:?}: {}", out.stdout);
    }
    // Well-formed but not a token of this listing: the control plane refuses it.
    let nodes_token = cli(&url, &["nodes", "--json", "--limit", "1"]).await;
    let token = continue_token(&nodes_token.stderr);
    let out = cli(&url, &["keys", "list", "--page-token", &token]).await;
    assert_eq!(out.code, Some(1), "{}", out.stderr);
    assert!(out.stderr.contains("page_token"), "{}", out.stderr);
}

async fn admin_client(url: &str) -> pb::admin_client::AdminClient<tonic::transport::Channel> {
    let channel =
        tonic::transport::Endpoint::from_shared(url.to_owned()).unwrap().connect().await.unwrap();
    pb::admin_client::AdminClient::new(channel)
}

fn authed<T>(message: T) -> tonic::Request<T> {
    let mut request = tonic::Request::new(message);
    let value = format!("Bearer {ADMIN_TOKEN}").parse().unwrap();
    request.metadata_mut().insert("authorization", value);
    request
}

#[tokio::test]
async fn a_client_from_before_paging_still_gets_every_key_and_node_in_one_answer() {
    let dir = tempfile::tempdir().unwrap();
    let cp = seeded_control(dir.path()).await;
    let mut client = admin_client(&cp.url()).await;
    let reply = client.list_keys(authed(pb::ListKeysRequest::default())).await.unwrap();
    let reply = reply.into_inner();
    assert_eq!(reply.keys.len(), KEYS);
    assert!(reply.next_page_token.is_empty());
    let reply = client.list_nodes(authed(pb::ListNodesRequest::default())).await.unwrap();
    assert_eq!(reply.into_inner().nodes.len(), NODES);

    // A paged request gets at most the server's page, whatever it asks for.
    let request = pb::ListKeysRequest { limit: 100_000, ..Default::default() };
    let reply = client.list_keys(authed(request)).await.unwrap().into_inner();
    assert_eq!(reply.keys.len(), 1_000);
    assert!(!reply.next_page_token.is_empty());
}

#[tokio::test]
async fn a_key_stored_before_the_index_is_found_by_its_secret() {
    let dir = tempfile::tempdir().unwrap();
    let cp = seeded_control(dir.path()).await;
    let mut client = admin_client(&cp.url()).await;
    for i in [0, 1_777, KEYS - 1] {
        let request =
            pb::ListKeysRequest { secret_sha256: hash_secret(&secret(i)), ..Default::default() };
        let keys = client.list_keys(authed(request)).await.unwrap().into_inner().keys;
        let found: Vec<&str> = keys.iter().map(|k| k.id.as_str()).collect();
        assert_eq!(found, [key_id(i).as_str()]);
    }
    let request =
        pb::ListKeysRequest { secret_sha256: hash_secret("sy-nobody"), ..Default::default() };
    assert!(client.list_keys(authed(request)).await.unwrap().into_inner().keys.is_empty());
}

#[tokio::test]
async fn nodes_pages_through_every_node_and_filters() {
    let dir = tempfile::tempdir().unwrap();
    let cp = seeded_control(dir.path()).await;
    let url = cp.url();
    let all: Vec<String> = (0..NODES).map(|i| format!("node-{i:05}")).collect();

    let listed = cli(&url, &["nodes", "--json"]).await.json();
    assert!(listed["config_version"].as_i64().is_some(), "{}", listed["config_version"]);
    assert_eq!(ids(&listed["nodes"], "node_id"), all, "every node once, in order");

    let first = cli(&url, &["nodes", "--json", "--limit", "1500"]).await;
    assert_eq!(ids(&first.json()["nodes"], "node_id"), all[..1500]);
    let token = continue_token(&first.stderr);
    let rest = cli(&url, &["nodes", "--json", "--page-token", &token]).await.json();
    assert_eq!(ids(&rest["nodes"], "node_id"), all[1500..]);

    let on_b = cli(&url, &["nodes", "--json", "--control-plane", "cp-b"]).await.json();
    let expected: Vec<String> =
        (0..NODES).filter(|i| i % 3 == 0).map(|i| format!("node-{i:05}")).collect();
    assert_eq!(ids(&on_b["nodes"], "node_id"), expected);

    let stale_rejected = cli(&url, &["nodes", "--json", "--stale", "30m", "--rejected"]).await;
    let expected: Vec<String> =
        (0..NODES).filter(|i| i % 700 == 0).map(|i| format!("node-{i:05}")).collect();
    assert_eq!(ids(&stale_rejected.json()["nodes"], "node_id"), expected);

    let table = cli(&url, &["nodes", "--rejected"]).await;
    assert!(table.success, "{}", table.stderr);
    assert_eq!(table.stdout.lines().filter(|l| l.starts_with("NODE ")).count(), 1);
    assert_eq!(table.stdout.lines().filter(|l| l.contains("rejected version 2")).count(), 21);

    let none = cli(&url, &["nodes", "--control-plane", "cp-z"]).await;
    assert!(none.stdout.starts_with("no nodes (config version"), "{}", none.stdout);
}

/// A measurement, not a check of behaviour (so not run by default): the time and peak RSS
/// of `keys list --json > /dev/null` over `SWITCHYARD_MEASURE_KEYS` keys (default 100,000)
/// seeded straight into the store. `cargo nextest run -p switchyard-cli --test paging
/// --run-ignored only --no-capture`; the binary is whatever profile built it.
#[tokio::test]
#[ignore = "a measurement: run it on purpose"]
async fn measure_keys_list_json_over_many_keys() {
    let count: usize = std::env::var("SWITCHYARD_MEASURE_KEYS")
        .ok()
        .and_then(|v| v.parse().ok())
        .unwrap_or(100_000);
    let dir = tempfile::tempdir().unwrap();
    let started = std::time::Instant::now();
    let store = seed_counts(dir.path(), count, 0).await;
    eprintln!("seeded {count} keys in {:.1} s", started.elapsed().as_secs_f64());
    let cp = start_control(&store, "127.0.0.1:0", dir.path(), "cp").await;
    let out = tokio::process::Command::new("/usr/bin/time")
        .arg("-f")
        .arg("elapsed_s=%e max_rss_kib=%M")
        .arg(switchyard_bin())
        .args(["keys", "list", "--json"])
        .env("SWITCHYARD_CONTROL", cp.url())
        .env("SWITCHYARD_ADMIN_TOKEN", ADMIN_TOKEN)
        .stdout(std::process::Stdio::null())
        .output()
        .await
        .unwrap();
    let stderr = String::from_utf8_lossy(&out.stderr);
    assert!(out.status.success(), "{stderr}");
    eprintln!("keys list --json > /dev/null over {count} keys: {}", stderr.trim());
    // The same listing, counted, so the measurement is of a complete answer.
    let listed = cli(&cp.url(), &["keys", "list", "--json"]).await.json();
    assert_eq!(listed.as_array().unwrap().len(), count);
}
