//! Claude Code through a real node (docs/clients.md, "Claude Code"): `claude -p` with
//! `ANTHROPIC_BASE_URL` at the node and a Switchyard key, the chain from the key's
//! `failoverDefaults`, the primary failing and the fallback serving — an Anthropic-kind and
//! an OpenAI-kind fallback. `.ci/run` installs Claude Code into `.tools/npm`; without it
//! these tests fail and say how to install it.
#![allow(clippy::unwrap_used, clippy::expect_used)]

use std::process::Output;
use std::time::Duration;

use serde_json::{Value, json};
use switchyard_e2e::gateway::*;
use switchyard_e2e::{PATIENCE, cli, eventually, http_request_with};

const PROMPT: &str = "say hi";

/// Runs `claude -p PROMPT --model MODEL` against the node, offline and in a throwaway home.
///
/// `--tools Read` offers one tool: the simulated Anthropic model (and an OpenAI one scripted
/// with `call_tools`) calls the first tool it is offered, and Read (of the placeholder path
/// `sim`, which does not exist) comes back as an error tool_result, so the run is one real
/// tool round trip and ends in the canned text.
/// Claude Code's default first tool, Agent, would start sub-agents against the simulator.
/// `CLAUDE_CODE_MAX_RETRIES=0`: a failing node fails the test at once instead of after
/// Claude Code's own ten retries.
async fn claude(gw: &Gateway, model: &str) -> Output {
    let home = gw.path().join("claude-home");
    let work = gw.path().join("claude-work");
    std::fs::create_dir_all(&home).unwrap();
    std::fs::create_dir_all(&work).unwrap();
    let run = tokio::process::Command::new(switchyard_e2e::claude())
        .args(["-p", PROMPT, "--model", model, "--tools", "Read", "--max-turns", "4"])
        .current_dir(&work)
        .env_clear()
        .env("PATH", std::env::var_os("PATH").unwrap_or_default())
        .env("HOME", &home)
        .env("ANTHROPIC_BASE_URL", gw.node.url())
        .env("ANTHROPIC_API_KEY", &gw.key)
        .env("CLAUDE_CODE_DISABLE_NONESSENTIAL_TRAFFIC", "1")
        .env("DISABLE_TELEMETRY", "1")
        .env("DISABLE_AUTOUPDATER", "1")
        .env("CLAUDE_CODE_MAX_RETRIES", "0")
        .kill_on_drop(true)
        .output();
    tokio::time::timeout(Duration::from_secs(120), run)
        .await
        .expect("claude -p ended within 120 s")
        .expect("claude runs")
}

/// The answer Claude Code printed, after asserting it exited 0.
fn printed(out: &Output) -> String {
    let stdout = String::from_utf8_lossy(&out.stdout).trim().to_owned();
    assert!(
        out.status.success(),
        "claude -p failed ({}):\n{stdout}\n{}",
        out.status,
        String::from_utf8_lossy(&out.stderr)
    );
    stdout
}

/// The node's `api:model_failover` events for this gateway's requests, once `n` are stored.
async fn failover_events(gw: &Gateway, n: usize) -> Vec<Value> {
    eventually(PATIENCE, "the api:model_failover events", || async {
        let out = cli(&gw.cp.url(), &["events", "--json"]).await;
        let events: Vec<Value> = out
            .stdout
            .lines()
            .filter_map(|l| serde_json::from_str::<Value>(l).ok())
            .filter(|e| e["type"] == "api:model_failover")
            .collect();
        (events.len() >= n).then_some(events)
    })
    .await
}

#[tokio::test]
async fn claude_code_answers_through_a_failover_to_an_anthropic_model() {
    let gw = Gateway::start().await;
    gw.script("primary", json!({"kind": "status", "status": 503})).await;
    gw.set_defaults(&["--models", &format!("{PRIMARY},{ANTHROPIC}")]).await;

    let out = claude(&gw, PRIMARY).await;
    assert_eq!(printed(&out), format!("Hello from {ANTHROPIC_UPSTREAM}."));

    // Two calls, each failed over: the one that called Read, and the one with its result.
    assert_eq!(gw.upstream_requests("primary").await, 2);
    assert_eq!(gw.upstream_requests(ANTHROPIC_UPSTREAM).await, 2);
    let last = gw.last_upstream_request(ANTHROPIC_UPSTREAM).await;
    let body = &last["body"];
    // An Anthropic model gets what Claude Code sent, under its upstream name: the system
    // blocks with their cache hints, the tools, thinking, and Claude Code's beta flags.
    assert_eq!(body["model"], ANTHROPIC_UPSTREAM, "{body}");
    assert_eq!(body["stream"], true, "{body}");
    let system = body["system"].as_array().unwrap_or_else(|| panic!("system blocks: {body}"));
    assert!(system.iter().any(|b| b.get("cache_control").is_some()), "{body}");
    assert!(
        system.iter().any(|b| b["text"].as_str().is_some_and(|t| t.contains("Claude"))),
        "{body}"
    );
    let tools: Vec<&str> =
        body["tools"].as_array().unwrap().iter().filter_map(|t| t["name"].as_str()).collect();
    assert_eq!(tools, ["Read"], "{body}");
    assert!(body.get("thinking").is_some(), "{body}");
    assert!(body["metadata"]["user_id"].is_string(), "{body}");
    let beta = last["headers"]["anthropic-beta"].as_str().unwrap_or_default();
    assert!(beta.contains("claude-code-"), "anthropic-beta passed on: {last}");
    // The round trip: Read called by the model, its (error) result sent back.
    let turns = body["messages"].as_array().unwrap();
    let call = turns
        .iter()
        .flat_map(|m| m["content"].as_array().into_iter().flatten())
        .find(|b| b["type"] == "tool_use")
        .unwrap_or_else(|| panic!("no tool_use: {body}"));
    assert_eq!(call["name"], "Read", "{body}");
    let result = turns.last().unwrap()["content"]
        .as_array()
        .and_then(|blocks| blocks.iter().find(|b| b["type"] == "tool_result"))
        .unwrap_or_else(|| panic!("the last turn has no tool_result: {body}"));
    assert_eq!(result["tool_use_id"], call["id"], "{body}");

    // The node reported both failovers.
    let events = failover_events(&gw, 2).await;
    for event in &events {
        assert_eq!(event["requested_model"], PRIMARY, "{event}");
        assert_eq!(event["served_model"], ANTHROPIC, "{event}");
    }
}

#[tokio::test]
async fn claude_code_answers_through_a_failover_to_an_openai_model() {
    let gw = Gateway::start().await;
    gw.script(ANTHROPIC_UPSTREAM, json!({"kind": "status", "status": 529})).await;
    // The simulated OpenAI model calls the tool it is offered, as the Anthropic one does.
    gw.script("secondary", json!({"kind": "ok", "call_tools": true})).await;
    gw.set_defaults(&["--models", &format!("{ANTHROPIC},{SECONDARY}")]).await;

    let out = claude(&gw, ANTHROPIC).await;
    assert_eq!(printed(&out), "Hello from secondary.");

    // Two calls, each failed over: the one that called Read, and the one with its result.
    assert_eq!(gw.upstream_requests(ANTHROPIC_UPSTREAM).await, 2);
    assert_eq!(gw.upstream_requests("secondary").await, 2);
    let last = gw.last_upstream_request("secondary").await;
    let body = &last["body"];
    // Translated to Chat Completions: the system blocks as a system message, the tools as
    // functions, and no Anthropic-only hint left.
    assert!(last["path"].as_str().unwrap_or_default().ends_with("/chat/completions"), "{last}");
    assert_eq!(body["model"], "secondary", "{body}");
    assert_eq!(body["stream"], true, "{body}");
    let first = &body["messages"][0];
    assert!(matches!(first["role"].as_str(), Some("system" | "developer")), "{body}");
    assert!(first.to_string().contains("Claude"), "{body}");
    assert_eq!(body["tools"][0]["type"], "function", "{body}");
    assert_eq!(body["tools"][0]["function"]["name"], "Read", "{body}");
    for hint in ["cache_control", "context_management", "\"thinking\"", "anthropic-beta"] {
        assert!(!last.to_string().contains(hint), "{hint} reached an OpenAI model: {last}");
    }
    // The round trip: the model's tool_calls reached Claude Code as a tool_use, which it
    // ran and sent back; they come back to the model as its tool_calls and a `tool` message.
    let turns = body["messages"].as_array().unwrap();
    let call = turns
        .iter()
        .find_map(|m| m["tool_calls"].get(0))
        .unwrap_or_else(|| panic!("no assistant tool_calls: {body}"));
    assert_eq!(call["function"]["name"], "Read", "{body}");
    let last_turn = turns.last().unwrap();
    assert_eq!(last_turn["role"], "tool", "{body}");
    assert_eq!(last_turn["tool_call_id"], call["id"], "{body}");

    let events = failover_events(&gw, 2).await;
    for event in &events {
        assert_eq!(event["requested_model"], ANTHROPIC, "{event}");
        assert_eq!(event["served_model"], SECONDARY, "{event}");
    }
}

/// What Claude Code 2.1.197 sends (recorded against a recorder, docs/clients.md), cut down:
/// three system blocks with `cache_control`, `thinking` adaptive with
/// `output_config.effort`, `context_management`, `metadata.user_id` as a JSON string. Sent
/// by hand where the real client cannot be steered: with its default tools it starts
/// sub-agents against the simulator, and it shows no response header.
fn claude_code_body(model: &str) -> Value {
    json!({
        "model": model,
        "max_tokens": 32000,
        "stream": true,
        "system": [
            {"type": "text", "text": "x-anthropic-billing-header: cc_version=2.1.197; cc_entrypoint=sdk-cli;"},
            {"type": "text", "text": "You are a Claude agent, built on Anthropic's Claude Agent SDK.",
             "cache_control": {"type": "ephemeral"}},
            {"type": "text", "text": "You are an interactive agent.", "cache_control": {"type": "ephemeral"}}
        ],
        "messages": [
            {"role": "user", "content": [
                {"type": "text", "text": "<system-reminder>today</system-reminder>"},
                {"type": "text", "text": "say hi", "cache_control": {"type": "ephemeral"}}
            ]}
        ],
        "tools": [{"name": "Read", "description": "Reads a file.", "input_schema": {
            "type": "object", "properties": {"file_path": {"type": "string"}}, "required": ["file_path"]}}],
        "tool_choice": {"type": "none"},
        "metadata": {"user_id": "{\"device_id\":\"d\",\"account_uuid\":\"\",\"session_id\":\"s\"}"},
        "thinking": {"type": "adaptive"},
        "output_config": {"effort": "high"},
        "context_management": {"edits": [{"type": "clear_thinking_20251015", "keep": "all"}]}
    })
}

/// Claude Code's beta flags (2.1.197, its default tools).
const BETA: &[u8] = b"claude-code-20250219,interleaved-thinking-2025-05-14,context-management-2025-06-27,prompt-caching-scope-2026-01-05,mid-conversation-system-2026-04-07,effort-2025-11-24";

/// POSTs `body` as Claude Code does: `?beta=true`, `x-api-key`, its version and beta headers.
async fn as_claude_code(gw: &Gateway, body: &Value) -> switchyard_e2e::HttpResponse {
    let body = body.to_string();
    http_request_with(
        gw.node.addr,
        "POST",
        "/v1/messages?beta=true",
        None,
        &[
            ("x-api-key", gw.key.as_bytes()),
            ("anthropic-version", b"2023-06-01"),
            ("anthropic-beta", BETA),
        ],
        Some(body.as_bytes()),
    )
    .await
    .unwrap()
}

/// The text of a Messages event stream's `text_delta`s.
fn streamed_text(body: &str) -> String {
    body.lines()
        .filter_map(|l| l.strip_prefix("data:"))
        .filter_map(|d| serde_json::from_str::<Value>(d.trim()).ok())
        .filter(|e| e["type"] == "content_block_delta")
        .filter_map(|e| e["delta"]["text"].as_str().map(str::to_owned))
        .collect()
}

#[tokio::test]
async fn claude_codes_hints_reach_an_anthropic_model_and_are_named_when_an_openai_model_drops_them()
{
    let gw = Gateway::start().await;

    let r = as_claude_code(&gw, &claude_code_body(ANTHROPIC)).await;
    assert_eq!(r.status, 200, "{}", r.body);
    assert_eq!(streamed_text(&r.body), format!("Hello from {ANTHROPIC_UPSTREAM}."), "{}", r.body);
    assert_eq!(r.header("x-dropped-hints"), None, "an Anthropic model takes every hint");
    let last = gw.last_upstream_request(ANTHROPIC_UPSTREAM).await;
    for hint in ["cache_control", "context_management", "thinking", "output_config"] {
        assert!(last["body"].to_string().contains(hint), "{hint} not passed on: {last}");
    }
    assert_eq!(last["headers"]["anthropic-beta"].as_str().map(str::as_bytes), Some(BETA), "{last}");

    let r = as_claude_code(&gw, &claude_code_body(SECONDARY)).await;
    assert_eq!(r.status, 200, "{}", r.body);
    assert_eq!(streamed_text(&r.body), "Hello from secondary.", "{}", r.body);
    let dropped =
        r.header("x-dropped-hints").unwrap_or_else(|| panic!("no x-dropped-hints:\n{}", r.headers));
    let mut dropped: Vec<&str> = dropped.split(',').map(str::trim).collect();
    dropped.sort_unstable();
    // The test catalog's `sim/secondary` does not reason: the thinking ask is dropped too.
    assert_eq!(dropped, ["anthropic-beta", "cache_control", "context_management", "thinking"]);
    let last = gw.last_upstream_request("secondary").await;
    for hint in [
        "cache_control",
        "context_management",
        "\"thinking\"",
        "reasoning_effort",
        "anthropic-beta",
    ] {
        assert!(!last.to_string().contains(hint), "{hint} reached an OpenAI model: {last}");
    }
    assert_eq!(last["body"]["user"], claude_code_body(SECONDARY)["metadata"]["user_id"], "{last}");
}

#[tokio::test]
async fn claude_codes_default_request_with_a_mid_conversation_system_message_is_served() {
    // With its default tools (the Agent tool among them) Claude Code adds a message of role
    // `system` after the user's, under its `mid-conversation-system` beta.
    let gw = Gateway::start().await;
    for (model, upstream) in [(ANTHROPIC, ANTHROPIC_UPSTREAM), (SECONDARY, "secondary")] {
        let mut body = claude_code_body(model);
        body["messages"].as_array_mut().unwrap().push(
            json!({"role": "system", "content": "Available agent types for the Agent tool: general-purpose"}),
        );
        let r = as_claude_code(&gw, &body).await;
        assert_eq!(r.status, 200, "{model}: {}", r.body);
        assert_eq!(
            streamed_text(&r.body),
            format!("Hello from {upstream}."),
            "{model}: {}",
            r.body
        );
        let last = gw.last_upstream_request(upstream).await;
        assert!(
            last["body"].to_string().contains("Available agent types"),
            "{model}: the mid-conversation system message was lost: {last}"
        );
    }
}
