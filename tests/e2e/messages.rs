//! The official `anthropic` Python SDK against a real node's `/v1/messages`
//! (docs/messages.md): plain, streamed (`messages.stream`), tools with a tool_result round
//! trip, `count_tokens`, and the errors; each served after a failover by an Anthropic-kind
//! model and by an OpenAI-kind model, with what the serving provider got checked at the
//! simulator. `.ci/run` installs the SDK into `.venv` (tests/e2e/anthropic_sdk.py drives it).
#![allow(clippy::unwrap_used, clippy::expect_used)]

use serde_json::{Value, json};
use switchyard_e2e::gateway::*;
use switchyard_e2e::{PATIENCE, cli, eventually, sdk_script};

/// The system prompt tests/e2e/anthropic_sdk.py sends.
const SYSTEM: &str = "You are the e2e check of the Switchyard gateway.";

/// A chain of two models whose first fails, and the fallback that serves.
struct Serving {
    primary: &'static str,
    primary_upstream: &'static str,
    /// The primary's scripted failure: an OpenAI-kind 503, or Anthropic's 529 `overloaded_error`.
    failure: u16,
    fallback: &'static str,
    fallback_upstream: &'static str,
    /// The fallback is of the Anthropic kind (it gets the Messages body as sent); else of the
    /// OpenAI kind (it gets the request translated to Chat Completions).
    anthropic: bool,
}

/// An OpenAI-kind primary failing with 503, an Anthropic-kind model serving.
const BY_ANTHROPIC: Serving = Serving {
    primary: PRIMARY,
    primary_upstream: "primary",
    failure: 503,
    fallback: ANTHROPIC,
    fallback_upstream: ANTHROPIC_UPSTREAM,
    anthropic: true,
};

/// An Anthropic-kind primary failing with 529, an OpenAI-kind model serving.
const BY_OPENAI: Serving = Serving {
    primary: ANTHROPIC,
    primary_upstream: ANTHROPIC_UPSTREAM,
    failure: 529,
    fallback: SECONDARY,
    fallback_upstream: "secondary",
    anthropic: false,
};

impl Serving {
    /// A gateway whose primary fails as scripted.
    async fn gateway(&self) -> Gateway {
        let gw = Gateway::start().await;
        gw.script(self.primary_upstream, json!({"kind": "status", "status": self.failure})).await;
        gw
    }

    /// Runs one check of tests/e2e/anthropic_sdk.py over this chain; what it printed.
    async fn sdk(&self, gw: &Gateway, check: &str) -> Value {
        let out = sdk_script(
            "anthropic_sdk.py",
            &[&gw.node.url(), &gw.key, check, self.primary, self.fallback],
        )
        .await;
        serde_json::from_str(out.trim()).unwrap_or_else(|e| panic!("{e}: {out}"))
    }

    /// The simulator's canned answer from the fallback.
    fn canned(&self) -> String {
        format!("Hello from {}.", self.fallback_upstream)
    }

    /// The last request the fallback's provider got: its path and its body.
    async fn upstream(&self, gw: &Gateway) -> (String, Value) {
        let last = gw.last_upstream_request(self.fallback_upstream).await;
        (last["path"].as_str().unwrap_or_default().to_owned(), last["body"].clone())
    }

    /// The answer names the fallback, in the body and the headers, with the failover report.
    fn assert_failed_over(&self, out: &Value) {
        assert_eq!(out["model"], self.fallback, "{out}");
        assert_eq!(out["served_header"], self.fallback, "{out}");
        assert_eq!(out["requested_header"], self.primary, "{out}");
        assert!(out["request_id"].as_str().is_some_and(|id| !id.is_empty()), "{out}");
        assert_eq!(out["secureai"]["served_model"], self.fallback, "{out}");
        assert_eq!(out["secureai"]["failover"]["occurred"], true, "{out}");
        assert_eq!(
            attempts(out),
            vec![
                triple(self.primary, "failed", "server_error"),
                triple(self.fallback, "served", ""),
            ],
            "{out}"
        );
    }

    /// The fallback's provider got the system prompt in its own form, the gateway's fields
    /// left out, under its upstream model name.
    async fn assert_upstream_plain(&self, gw: &Gateway, stream: bool) -> Value {
        let (path, body) = self.upstream(gw).await;
        assert_eq!(body["model"], self.fallback_upstream, "{body}");
        assert!(body.get("fallback_models").is_none(), "gateway fields stay at the node: {body}");
        assert_eq!(body["stream"].as_bool().unwrap_or(false), stream, "{body}");
        if self.anthropic {
            assert_eq!(path, "/v1/messages", "{body}");
            assert_eq!(body["system"], SYSTEM, "{body}");
            assert_eq!(body["max_tokens"], 64, "{body}");
        } else {
            assert!(path.ends_with("/chat/completions"), "{path}");
            assert_eq!(body["messages"][0], json!({"role": "system", "content": SYSTEM}), "{body}");
            assert_eq!(body["messages"][1]["role"], "user", "{body}");
            assert!(body.get("system").is_none(), "{body}");
        }
        assert_eq!(
            gw.upstream_requests(self.primary_upstream).await,
            1,
            "the primary was tried once"
        );
        body
    }
}

/// The text of an OpenAI message's `content`: a string or text parts.
fn text(content: &Value) -> String {
    match content {
        Value::String(s) => s.clone(),
        Value::Array(parts) => parts.iter().filter_map(|p| p["text"].as_str()).collect(),
        _ => String::new(),
    }
}

// === Plain ===

async fn plain(serving: Serving) {
    let gw = serving.gateway().await;
    let out = serving.sdk(&gw, "plain").await;
    serving.assert_failed_over(&out);
    assert_eq!(out["text"], serving.canned(), "{out}");
    assert_eq!(out["dropped_hints"], Value::Null, "nothing to drop: {out}");
    serving.assert_upstream_plain(&gw, false).await;
    // The failover is an event like any other.
    let event = failover_event(&gw).await;
    assert_eq!(event["served_model"], serving.fallback, "{event}");
    assert_eq!(event["request_id"], out["request_id"], "{event}");
}

/// The first `api:model_failover` event stored.
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
async fn a_failover_through_messages_is_an_event_labelled_with_its_surface() {
    let serving = BY_OPENAI;
    let gw = serving.gateway().await;
    serving.sdk(&gw, "plain").await;
    let event = failover_event(&gw).await;
    assert_eq!(
        event["surface"], "messages",
        "the event names the surface it came through: {event}"
    );
}

#[tokio::test]
async fn the_anthropic_sdk_gets_a_plain_message_from_an_anthropic_fallback() {
    plain(BY_ANTHROPIC).await;
}

#[tokio::test]
async fn the_anthropic_sdk_gets_a_plain_message_from_an_openai_fallback() {
    plain(BY_OPENAI).await;
}

// === Streaming ===

async fn stream(serving: Serving) {
    let gw = serving.gateway().await;
    let out = serving.sdk(&gw, "stream").await;
    // `messages.stream`: the text as it streamed, and the final message the SDK built from
    // the events (the script checks they agree), named after the served model.
    assert_eq!(out["text"], serving.canned(), "{out}");
    assert_eq!(out["stop_reason"], "end_turn", "{out}");
    // The report rides in `message_start`'s message, which the SDK's final message keeps.
    serving.assert_failed_over(&out);
    serving.assert_upstream_plain(&gw, true).await;
}

#[tokio::test]
async fn the_anthropic_sdk_streams_a_message_from_an_anthropic_fallback() {
    stream(BY_ANTHROPIC).await;
}

#[tokio::test]
async fn the_anthropic_sdk_streams_a_message_from_an_openai_fallback() {
    stream(BY_OPENAI).await;
}

// === Tools and a tool_result round trip ===

#[tokio::test]
async fn a_tool_call_and_its_result_round_trip_through_an_anthropic_fallback() {
    let serving = BY_ANTHROPIC;
    let gw = serving.gateway().await;
    let out = serving.sdk(&gw, "tools").await;
    // The simulated Anthropic model calls the tool it was offered, with a placeholder input.
    assert_eq!(out["first_stop_reason"], "tool_use", "{out}");
    assert_eq!(out["first_tool"], "get_weather", "{out}");
    assert_eq!(out["first_input"], json!({"city": "sim"}), "{out}");
    serving.assert_failed_over(&out);
    assert_eq!(out["text"], serving.canned(), "{out}");
    // The second call, as Anthropic takes it: the tool, the tool_use and its tool_result.
    let (_, body) = serving.upstream(&gw).await;
    assert_eq!(body["system"], SYSTEM, "{body}");
    assert_eq!(body["tools"][0]["name"], "get_weather", "{body}");
    assert_eq!(body["tools"][0]["input_schema"]["required"], json!(["city"]), "{body}");
    let id = out["tool_use_id"].as_str().unwrap();
    let turns = body["messages"].as_array().unwrap();
    assert_eq!(turns.len(), 3, "{body}");
    assert_eq!(turns[1]["role"], "assistant", "{body}");
    assert_eq!(turns[1]["content"][0]["type"], "tool_use", "{body}");
    assert_eq!(turns[1]["content"][0]["id"], id, "{body}");
    assert_eq!(turns[2]["role"], "user", "{body}");
    assert_eq!(
        turns[2]["content"][0],
        json!({"type": "tool_result", "tool_use_id": id, "content": "sunny, 21 degrees"}),
        "{body}"
    );
}

#[tokio::test]
async fn a_tool_call_and_its_result_round_trip_through_an_openai_fallback() {
    let serving = BY_OPENAI;
    let gw = serving.gateway().await;
    // The simulated OpenAI model calls the tool it is offered (until it gets the result).
    gw.script(serving.fallback_upstream, json!({"kind": "ok", "call_tools": true})).await;
    let out = serving.sdk(&gw, "tools").await;
    // Its `tool_calls` answer comes back as Anthropic's tool_use block.
    assert_eq!(out["first_stop_reason"], "tool_use", "{out}");
    assert_eq!(out["first_tool"], "get_weather", "{out}");
    assert_eq!(out["first_input"], json!({"city": "sim"}), "{out}");
    serving.assert_failed_over(&out);
    assert_eq!(out["text"], serving.canned(), "{out}");
    // The second call, as OpenAI takes it: the tool as a function, the tool_use as the
    // assistant's tool_calls, the tool_result as a `tool` message.
    let (_, body) = serving.upstream(&gw).await;
    assert_eq!(body["tools"][0]["type"], "function", "{body}");
    assert_eq!(body["tools"][0]["function"]["name"], "get_weather", "{body}");
    assert_eq!(body["tools"][0]["function"]["parameters"]["required"], json!(["city"]), "{body}");
    let id = out["tool_use_id"].as_str().unwrap();
    let turns = body["messages"].as_array().unwrap();
    let roles: Vec<&str> = turns.iter().map(|m| m["role"].as_str().unwrap_or_default()).collect();
    assert_eq!(roles, ["system", "user", "assistant", "tool"], "{body}");
    assert_eq!(text(&turns[0]["content"]), SYSTEM, "{body}");
    let call = &turns[2]["tool_calls"][0];
    assert_eq!(call["id"], id, "{body}");
    assert_eq!(call["type"], "function", "{body}");
    assert_eq!(call["function"]["name"], "get_weather", "{body}");
    let arguments: Value =
        serde_json::from_str(call["function"]["arguments"].as_str().unwrap()).unwrap();
    assert_eq!(arguments, json!({"city": "sim"}), "{body}");
    assert_eq!(turns[3]["tool_call_id"], id, "{body}");
    assert_eq!(text(&turns[3]["content"]), "sunny, 21 degrees", "{body}");
}

#[tokio::test]
async fn a_streamed_tool_call_from_an_openai_fallback_is_a_tool_use_block() {
    let serving = BY_OPENAI;
    let gw = serving.gateway().await;
    gw.script(serving.fallback_upstream, json!({"kind": "ok", "call_tools": true})).await;
    // The script checks that the input_json_delta pieces spell the final message's input.
    let out = serving.sdk(&gw, "stream_tools").await;
    assert_eq!(out["stop_reason"], "tool_use", "{out}");
    assert_eq!(out["tool"], "get_weather", "{out}");
    assert_eq!(out["input"], json!({"city": "sim"}), "{out}");
    assert!(out["tool_use_id"].as_str().is_some_and(|id| !id.is_empty()), "{out}");
    serving.assert_failed_over(&out);
    let body = serving.assert_upstream_plain(&gw, true).await;
    assert_eq!(body["tools"][0]["function"]["name"], "get_weather", "{body}");
}

// === count_tokens ===

#[tokio::test]
async fn count_tokens_is_forwarded_to_the_chains_first_anthropic_model() {
    let serving = BY_ANTHROPIC;
    let gw = serving.gateway().await;
    let out = serving.sdk(&gw, "count_tokens").await;
    // The simulator counts words: 9 in the system prompt, 4 in the message.
    assert_eq!(out["input_tokens"], 13, "{out}");
    assert_eq!(out["estimated"], Value::Null, "a provider's count is not an estimate: {out}");
    let stats = switchyard_e2e::http_get(gw.sim.addr, "/_sim/stats", None).await.unwrap().json();
    assert_eq!(stats["token_counts"], 1, "{stats}");
    assert_eq!(stats["requests"], 0, "never a completion call: {stats}");
}

#[tokio::test]
async fn count_tokens_without_an_anthropic_model_is_an_estimate_marked_as_one() {
    let gw = Gateway::start().await;
    let out = sdk_script(
        "anthropic_sdk.py",
        &[&gw.node.url(), &gw.key, "count_tokens", PRIMARY, SECONDARY],
    )
    .await;
    let out: Value = serde_json::from_str(out.trim()).unwrap();
    assert!(out["input_tokens"].as_u64().is_some_and(|n| n > 0), "{out}");
    assert_eq!(out["estimated"], true, "{out}");
    let stats = switchyard_e2e::http_get(gw.sim.addr, "/_sim/stats", None).await.unwrap().json();
    assert_eq!(stats["requests"], 0, "never a completion call: {stats}");
    assert_eq!(stats["token_counts"].as_u64().unwrap_or(0), 0, "{stats}");
}

// === Errors ===

async fn missing_max_tokens(serving: Serving) {
    let gw = serving.gateway().await;
    let out = serving.sdk(&gw, "missing_max_tokens").await;
    // The script checked the SDK raised BadRequestError with the field in the message.
    assert_eq!(out["status"], 400, "{out}");
    assert_eq!(gw.upstream_total().await, 0, "a bad body is refused before any upstream call");
}

#[tokio::test]
async fn a_body_without_max_tokens_raises_bad_request_naming_the_field() {
    missing_max_tokens(BY_ANTHROPIC).await;
    missing_max_tokens(BY_OPENAI).await;
}

async fn chain_failed(serving: Serving, fallback_failure: u16) {
    let gw = serving.gateway().await;
    gw.script(serving.fallback_upstream, json!({"kind": "status", "status": fallback_failure}))
        .await;
    let out = serving.sdk(&gw, "chain_failed").await;
    assert_eq!(out["class"], "InternalServerError", "{out}");
    assert_eq!(out["status"], 502, "{out}");
    assert_eq!(out["should_retry"], "false", "{out}");
    assert_eq!(out["error"]["type"], "overloaded_error", "{out}");
    let attempts: Vec<(&str, &str, &str)> = out["error"]["attempts"]
        .as_array()
        .unwrap_or_else(|| panic!("no error.attempts: {out}"))
        .iter()
        .map(|a| {
            (
                a["model"].as_str().unwrap_or_default(),
                a["status"].as_str().unwrap_or_default(),
                a["reason"].as_str().unwrap_or_default(),
            )
        })
        .collect();
    assert_eq!(
        attempts,
        [(serving.primary, "failed", "server_error"), (serving.fallback, "failed", "server_error")],
        "{out}"
    );
    // At its default two retries the SDK sent the chain once: `x-should-retry: false`.
    assert_eq!(gw.upstream_requests(serving.primary_upstream).await, 1);
    assert_eq!(gw.upstream_requests(serving.fallback_upstream).await, 1);
}

#[tokio::test]
async fn a_failed_chain_raises_once_with_its_attempts_under_error_through_anthropic() {
    chain_failed(BY_ANTHROPIC, 529).await;
}

#[tokio::test]
async fn a_failed_chain_raises_once_with_its_attempts_under_error_through_openai() {
    chain_failed(BY_OPENAI, 503).await;
}
