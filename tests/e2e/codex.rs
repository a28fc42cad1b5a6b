//! The Codex CLI (`@openai/codex`, which speaks only the Responses API) through a real node
//! in front of `switchyard sim` (docs/clients.md): `codex exec` with a `CODEX_HOME` whose
//! model provider is the node, the key's chain failing over from a broken primary to an
//! OpenAI-compatible and to an Anthropic-kind fallback (each sent a translation), and to an
//! OpenAI-kind one (sent Codex's request as it was), and the answer Codex printed checked.
//! `.ci/run` installs Codex into `.tools/codex` (`SWITCHYARD_CODEX` names another binary).
#![allow(clippy::unwrap_used, clippy::expect_used)]

use std::process::Output;
use std::time::Duration;

use serde_json::{Value, json};
use switchyard_e2e::gateway::*;
use switchyard_e2e::{PATIENCE, cli, eventually};

/// Runs `codex exec` against the node with the key's default chain; Codex cannot add the
/// gateway's body fields, so the chain is the key's `failoverDefaults`.
async fn codex(gw: &Gateway, model: &str) -> Output {
    let home = gw.path().join("codex-home");
    let work = gw.path().join("codex-work");
    std::fs::create_dir_all(&home).unwrap();
    std::fs::create_dir_all(&work).unwrap();
    let config = format!(
        r#"model = "{model}"
model_provider = "switchyard"

[model_providers.switchyard]
name = "Switchyard"
base_url = "{}/v1"
wire_api = "responses"
env_key = "SWITCHYARD_KEY"

[features]
plugins = false

[analytics]
enabled = false
"#,
        gw.node.url()
    );
    std::fs::write(home.join("config.toml"), config).unwrap();
    let run = tokio::process::Command::new(switchyard_e2e::codex())
        .args(["exec", "--skip-git-repo-check", "--sandbox", "read-only", "Say hello"])
        .current_dir(&work)
        .env_clear()
        .env("PATH", std::env::var_os("PATH").unwrap_or_default())
        .env("HOME", &home)
        .env("CODEX_HOME", &home)
        .env("SWITCHYARD_KEY", &gw.key)
        .stdin(std::process::Stdio::null())
        .kill_on_drop(true)
        .output();
    tokio::time::timeout(Duration::from_secs(120), run)
        .await
        .expect("codex exec ended within 120 s")
        .expect("codex runs")
}

/// The answer Codex printed, after asserting it exited 0.
fn printed(out: &Output) -> String {
    let stdout = String::from_utf8_lossy(&out.stdout).trim().to_owned();
    assert!(
        out.status.success(),
        "codex exec failed ({}):\n{stdout}\n{}",
        out.status,
        String::from_utf8_lossy(&out.stderr)
    );
    stdout
}

/// The node's first `api:model_failover` event.
async fn failover_event(gw: &Gateway) -> Value {
    eventually(PATIENCE, "the api:model_failover event", || async {
        let out = cli(&gw.cp.url(), &["events", "--json"]).await;
        out.stdout
            .lines()
            .filter_map(|l| serde_json::from_str::<Value>(l).ok())
            .find(|e| e["type"] == "api:model_failover")
    })
    .await
}

#[tokio::test]
async fn codex_answers_through_a_failover_to_an_openai_model() {
    let gw = Gateway::start().await;
    gw.script("primary", json!({"kind": "status", "status": 503})).await;
    gw.set_defaults(&["--models", &format!("{PRIMARY},{SECONDARY}")]).await;
    let out = codex(&gw, PRIMARY).await;
    assert!(printed(&out).ends_with("Hello from secondary."), "{}", printed(&out));
    // What Codex sent reached the fallback as Chat Completions: its instructions as the
    // system message, its function tools (built-in ones dropped), the prompt last.
    let sent = gw.last_upstream_request("secondary").await["body"].clone();
    let messages = sent["messages"].as_array().unwrap();
    assert_eq!(messages[0]["role"], "system", "{sent}");
    assert!(messages[0]["content"].as_str().is_some_and(|s| s.contains("Codex")), "{sent}");
    let last = messages.last().unwrap();
    assert_eq!(last["role"], "user", "{sent}");
    assert!(last["content"].to_string().contains("Say hello"), "{sent}");
    let tools = sent["tools"].as_array().unwrap_or_else(|| panic!("no tools: {sent}"));
    assert!(!tools.is_empty() && tools.iter().all(|t| t["type"] == "function"), "{sent}");
    assert_eq!(sent["stream"], true, "{sent}");
    assert!(gw.upstream_requests("primary").await >= 1);
    let event = failover_event(&gw).await;
    assert_eq!(event["surface"], "responses", "{event}");
    assert_eq!(event["served_model"], SECONDARY, "{event}");
}

#[tokio::test]
async fn codex_answers_through_a_failover_to_an_anthropic_model() {
    let gw = Gateway::start().await;
    gw.script("primary", json!({"kind": "status", "status": 503})).await;
    gw.set_defaults(&["--models", &format!("{PRIMARY},{ANTHROPIC}")]).await;
    let out = codex(&gw, PRIMARY).await;
    // The simulated Anthropic model calls the first tool it is offered with a placeholder
    // argument; Codex runs it, sends its output back, and gets the canned answer.
    assert!(printed(&out).ends_with("Hello from claude-sim."), "{}", printed(&out));
    let sent = gw.last_upstream_request(ANTHROPIC_UPSTREAM).await["body"].clone();
    assert!(sent["system"].to_string().contains("Codex"), "{sent}");
    let turns = sent["messages"].as_array().unwrap();
    let last = turns.last().unwrap();
    assert_eq!(last["role"], "user", "{sent}");
    assert!(
        last["content"].as_array().is_some_and(|b| b.iter().any(|b| b["type"] == "tool_result")),
        "the tool's output came back as a tool_result: {sent}"
    );
    assert_eq!(gw.upstream_requests(ANTHROPIC_UPSTREAM).await, 2, "the call, then the answer");
    let event = failover_event(&gw).await;
    assert_eq!(event["surface"], "responses", "{event}");
    assert_eq!(event["served_model"], ANTHROPIC, "{event}");
}

#[tokio::test]
async fn codex_answers_through_a_failover_to_an_openai_kind_model_that_gets_its_request_as_sent() {
    let gw = Gateway::start().await;
    gw.script("primary", json!({"kind": "status", "status": 503})).await;
    gw.set_defaults(&["--models", &format!("{PRIMARY},{OPENAI}")]).await;
    let out = codex(&gw, PRIMARY).await;
    assert!(printed(&out).ends_with("Hello from gpt-sim."), "{}", printed(&out));
    // What Codex sent reached the OpenAI-kind fallback on its Responses API as Codex wrote
    // it: its input items and every tool, built-in ones included, `store: false`.
    let last = gw.last_upstream_request(OPENAI_UPSTREAM).await;
    assert_eq!(last["path"], "/v1/responses", "{last}");
    let sent = &last["body"];
    assert_eq!(sent["model"], OPENAI_UPSTREAM, "{sent}");
    assert_eq!(sent["store"], false, "{sent}");
    assert_eq!(sent["stream"], true, "{sent}");
    assert!(sent["input"].to_string().contains("Say hello"), "{sent}");
    let tools = sent["tools"].as_array().unwrap_or_else(|| panic!("no tools: {sent}"));
    assert!(tools.iter().any(|t| t["type"] != "function"), "built-in tools as sent: {sent}");
    let event = failover_event(&gw).await;
    assert_eq!(event["surface"], "responses", "{event}");
    assert_eq!(event["served_model"], OPENAI, "{event}");
}
