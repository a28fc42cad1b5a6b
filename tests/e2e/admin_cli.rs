//! The admin CLI against a real control plane on the embedded store.
#![allow(clippy::unwrap_used, clippy::expect_used)]

use std::path::Path;

use switchyard_e2e::*;

const CATALOG: &str = r#"
providers:
  - name: openai
    kind: openai
    base_url: https://api.openai.com/v1
    api_keys: ["env:OPENAI_API_KEY", "env:OPENAI_API_KEY_RESERVE"]
    region: us
models:
  - name: openai/gpt-5-nano
    provider: openai
    upstream_model: gpt-5-nano
    price: {input_per_mtok: 0.05, output_per_mtok: 0.40}
  - name: openai/gpt-5-mini
    provider: openai
    upstream_model: gpt-5-mini
    breaker: {cooldown_ms: 10000}
breaker_policy:
  window_size: 20
  min_requests: 10
  failure_rate_threshold: 0.5
  consecutive_timeouts: 5
  cooldown_ms: 30000
  max_cooldown_ms: 300000
  half_open_probes: 1
webhooks:
  - name: oncall
    url: https://hooks.example.com/switchyard
    events: ["api:model_failover", "breaker.opened"]
    secret: "env:WEBHOOK_SECRET"
"#;

fn write(dir: &Path, name: &str, text: &str) -> String {
    let path = dir.join(name);
    std::fs::write(&path, text).unwrap();
    path.display().to_string()
}

async fn control(dir: &Path) -> Proc {
    let store = format!("file://{}", dir.join("store").display());
    start_control(&store, "127.0.0.1:0", dir, "cp").await
}

#[tokio::test]
async fn apply_twice_changes_nothing_the_second_time() {
    let dir = tempfile::tempdir().unwrap();
    let cp = control(dir.path()).await;
    let file = write(dir.path(), "catalog.yaml", CATALOG);
    let first = cli(&cp.url(), &["apply", "-f", &file, "--json"]).await.json();
    assert_eq!(first["applied"], true);
    assert!(
        first["changes"].as_array().unwrap().iter().any(|c| c == "+ models/openai/gpt-5-nano"),
        "{first}"
    );
    let second = cli(&cp.url(), &["apply", "-f", &file, "--json"]).await.json();
    assert_eq!(second["applied"], false, "{second}");
    assert_eq!(second["changes"], serde_json::json!([]));
}

#[tokio::test]
async fn dry_run_shows_the_diff_and_applies_nothing() {
    let dir = tempfile::tempdir().unwrap();
    let cp = control(dir.path()).await;
    cli(&cp.url(), &["apply", "-f", &write(dir.path(), "c.yaml", CATALOG)]).await;
    let changed = CATALOG.replace("upstream_model: gpt-5-mini", "upstream_model: gpt-5-mini-2025");
    let file = write(dir.path(), "changed.yaml", &changed);
    let dry = cli(&cp.url(), &["apply", "-f", &file, "--dry-run", "--json"]).await.json();
    assert_eq!(dry["applied"], false);
    assert_eq!(dry["changes"], serde_json::json!(["~ models/openai/gpt-5-mini: upstream_model"]));
    let human = cli(&cp.url(), &["apply", "-f", &file, "--dry-run"]).await;
    assert!(
        human.stdout.contains("~ models/openai/gpt-5-mini: upstream_model"),
        "{}",
        human.stdout
    );
    let stored = cli(&cp.url(), &["catalog", "--json"]).await.json();
    assert_eq!(stored["models"][1]["upstream_model"], "gpt-5-mini", "dry run stored nothing");
}

#[tokio::test]
async fn catalog_output_round_trips_through_apply() {
    let dir = tempfile::tempdir().unwrap();
    let cp = control(dir.path()).await;
    cli(&cp.url(), &["apply", "-f", &write(dir.path(), "c.yaml", CATALOG)]).await;
    for format in [&["catalog"][..], &["catalog", "--json"][..]] {
        let out = cli(&cp.url(), format).await;
        assert!(out.success, "{}", out.stderr);
        let file = write(dir.path(), "exported", &out.stdout);
        let again = cli(&cp.url(), &["apply", "-f", &file, "--json"]).await.json();
        assert_eq!(
            again["changes"],
            serde_json::json!([]),
            "{format:?} output re-applied changes something"
        );
    }
}

/// `switchyard catalog` hides credentials in URLs; applying its output again keeps the stored
/// ones (the control plane puts them back), and a hidden URL it cannot restore is refused.
#[tokio::test]
async fn catalog_output_with_hidden_url_credentials_round_trips_through_apply() {
    let dir = tempfile::tempdir().unwrap();
    let cp = control(dir.path()).await;
    let with_credentials = CATALOG.replace(
        "https://hooks.example.com/switchyard",
        "https://user:s3cret@hooks.example.com/switchyard",
    );
    let applied =
        cli(&cp.url(), &["apply", "-f", &write(dir.path(), "c.yaml", &with_credentials)]).await;
    assert!(applied.success, "{}", applied.stderr);
    let out = cli(&cp.url(), &["catalog"]).await;
    assert!(!out.stdout.contains("s3cret"), "{}", out.stdout);
    assert!(out.stdout.contains("https://***@hooks.example.com/switchyard"), "{}", out.stdout);
    let file = write(dir.path(), "exported", &out.stdout);
    let again = cli(&cp.url(), &["apply", "-f", &file, "--json"]).await;
    assert!(again.success, "{}", again.stderr);
    assert_eq!(again.json()["changes"], serde_json::json!([]), "the credentials were kept");

    let elsewhere = out.stdout.replace("hooks.example.com", "other.example.com");
    let refused = cli(&cp.url(), &["apply", "-f", &write(dir.path(), "moved", &elsewhere)]).await;
    assert!(!refused.success);
    assert!(refused.stderr.contains("webhooks[0].url"), "{}", refused.stderr);
}

#[tokio::test]
async fn an_invalid_catalog_names_file_path_and_field_and_applies_nothing() {
    let dir = tempfile::tempdir().unwrap();
    let cp = control(dir.path()).await;
    let bad = CATALOG.replace(
        "provider: openai\n    upstream_model: gpt-5-mini",
        "provider: nope\n    upstream_model: gpt-5-mini",
    );
    let file = write(dir.path(), "bad.yaml", &bad);
    let out = cli(&cp.url(), &["apply", "-f", &file]).await;
    assert!(!out.success);
    assert!(out.stderr.contains("bad.yaml"), "{}", out.stderr);
    assert!(out.stderr.contains("models[1].provider"), "{}", out.stderr);
    let typo = CATALOG.replace("upstream_model: gpt-5-nano", "upstream_modle: gpt-5-nano");
    let out = cli(&cp.url(), &["apply", "-f", &write(dir.path(), "typo.yaml", &typo)]).await;
    assert!(!out.success);
    assert!(
        out.stderr.contains("typo.yaml") && out.stderr.contains("upstream_modle"),
        "{}",
        out.stderr
    );
    let secret = CATALOG.replace("env:OPENAI_API_KEY_RESERVE", "sk-live-123456");
    let out = cli(&cp.url(), &["apply", "-f", &write(dir.path(), "secret.yaml", &secret)]).await;
    assert!(!out.success);
    assert!(
        !out.stderr.contains("sk-live-123456"),
        "a pasted secret is never echoed: {}",
        out.stderr
    );
    let stored = cli(&cp.url(), &["catalog", "--json"]).await.json();
    assert_eq!(stored["models"], serde_json::json!([]), "nothing was applied");
}

#[tokio::test]
async fn a_context_window_that_is_not_a_positive_integer_is_refused_by_its_path_and_stores_nothing()
{
    let dir = tempfile::tempdir().unwrap();
    let cp = control(dir.path()).await;
    for (value, file) in [("0", "zero.yaml"), ("-8000", "negative.yaml"), ("8k", "text.yaml")] {
        let bad = CATALOG.replace(
            "upstream_model: gpt-5-mini",
            &format!("upstream_model: gpt-5-mini\n    context_window: {value}"),
        );
        assert!(bad.contains("context_window"), "the fixture changed");
        let out = cli(&cp.url(), &["apply", "-f", &write(dir.path(), file, &bad)]).await;
        assert!(!out.success, "{value}");
        assert!(
            out.stderr.contains(file)
                && out.stderr.contains("models[1].context_window")
                && out.stderr.contains("must be a positive integer (tokens)"),
            "{value}: {}",
            out.stderr
        );
    }
    let stored = cli(&cp.url(), &["catalog", "--json"]).await.json();
    assert_eq!(stored["models"], serde_json::json!([]), "nothing was applied");
    let good = CATALOG.replace(
        "upstream_model: gpt-5-mini",
        "upstream_model: gpt-5-mini\n    context_window: 400000",
    );
    let out = cli(&cp.url(), &["apply", "-f", &write(dir.path(), "good.yaml", &good)]).await;
    assert!(out.success, "{}", out.stderr);
    let stored = cli(&cp.url(), &["catalog", "--json"]).await.json();
    assert_eq!(stored["models"][1]["context_window"], 400000);
}

#[tokio::test]
async fn a_key_secret_is_shown_once_and_stored_only_as_a_hash() {
    let dir = tempfile::tempdir().unwrap();
    let cp = control(dir.path()).await;
    let created = cli(&cp.url(), &["keys", "create", "--name", "ci", "--json"]).await.json();
    let secret = created["key"].as_str().unwrap().to_owned();
    let id = created["id"].as_str().unwrap().to_owned();
    assert!(secret.len() >= 3 + 22, "at least 128 bits of secret: {secret}");
    for args in [
        &["keys", "list", "--json"][..],
        &["keys", "show", &id, "--json"][..],
        &["keys", "list"][..],
    ] {
        let out = cli(&cp.url(), args).await;
        assert!(out.success, "{}", out.stderr);
        assert!(!out.stdout.contains(&secret), "{args:?} shows the secret");
    }
    cp.kill().await;
    // Nothing in the store's files holds the secret.
    for entry in walk(&dir.path().join("store")) {
        let bytes = std::fs::read(&entry).unwrap();
        assert!(
            !String::from_utf8_lossy(&bytes).contains(&secret),
            "{} holds the secret",
            entry.display()
        );
    }
    let rotated_cp = control(dir.path()).await;
    let rotated = cli(&rotated_cp.url(), &["keys", "rotate", &id, "--json"]).await.json();
    assert_ne!(rotated["key"].as_str().unwrap(), secret);
}

fn walk(dir: &Path) -> Vec<std::path::PathBuf> {
    let mut files = Vec::new();
    for entry in std::fs::read_dir(dir).unwrap() {
        let path = entry.unwrap().path();
        if path.is_dir() { files.extend(walk(&path)) } else { files.push(path) }
    }
    files
}

#[tokio::test]
async fn failover_defaults_naming_an_unknown_model_are_refused() {
    let dir = tempfile::tempdir().unwrap();
    let cp = control(dir.path()).await;
    cli(&cp.url(), &["apply", "-f", &write(dir.path(), "c.yaml", CATALOG)]).await;
    let out = cli(
        &cp.url(),
        &["keys", "create", "--name", "x", "--default-models", "openai/gpt-5-nano,openai/nope"],
    )
    .await;
    assert!(!out.success);
    assert!(out.stderr.contains("openai/nope"), "{}", out.stderr);
    let listed = cli(&cp.url(), &["keys", "list", "--json"]).await.json();
    assert_eq!(listed.as_array().map(Vec::len).unwrap_or(0), 0, "no key was created: {listed}");
}

#[tokio::test]
async fn failover_defaults_are_clamped_into_range_when_saved() {
    let dir = tempfile::tempdir().unwrap();
    let cp = control(dir.path()).await;
    cli(&cp.url(), &["apply", "-f", &write(dir.path(), "c.yaml", CATALOG)]).await;
    let created = cli(&cp.url(), &["keys", "create", "--name", "x", "--json"]).await.json();
    let id = created["id"].as_str().unwrap();
    let set = cli(
        &cp.url(),
        &[
            "keys",
            "set-defaults",
            id,
            "--models",
            "openai/gpt-5-nano,openai/gpt-5-mini,openai/gpt-5-nano",
            "--timeout-ms",
            "999999",
            "--first-token-timeout-ms",
            "10",
            "--json",
        ],
    )
    .await
    .json();
    let d = &set["failoverDefaults"];
    assert_eq!(d["models"], serde_json::json!(["openai/gpt-5-nano", "openai/gpt-5-mini"]));
    assert_eq!(d["timeout_ms"], 300000);
    assert_eq!(d["first_token_timeout_ms"], 500);
    assert_eq!(set["warnings"].as_array().unwrap().len(), 2, "{set}");
    let four = cli(&cp.url(), &["keys", "set-defaults", id, "--models", "a,b,c,d"]).await;
    assert!(!four.success && four.stderr.contains("models"), "{}", four.stderr);
}

#[tokio::test]
async fn the_embedded_store_keeps_keys_across_a_control_plane_restart() {
    let dir = tempfile::tempdir().unwrap();
    let cp = control(dir.path()).await;
    let created = cli(&cp.url(), &["keys", "create", "--name", "durable", "--json"]).await.json();
    cp.kill().await;
    let cp = control(dir.path()).await;
    let shown =
        cli(&cp.url(), &["keys", "show", created["id"].as_str().unwrap(), "--json"]).await.json();
    assert_eq!(shown["name"], "durable");
}
