//! The official `openai` Python SDK against a real node's `/v1/responses`
//! (docs/responses.md): plain, streamed, a function call with its output round trip, each
//! served after a failover by an OpenAI-kind model and by an Anthropic-kind model, with what
//! the serving provider got checked at the simulator; a failover before the commit point
//! that the client never sees, a break after it, the failed chain, and the refusals.
//! `.ci/run` installs the SDK into `.venv` (tests/e2e/responses_sdk.py drives it).
#![allow(clippy::unwrap_used, clippy::expect_used)]

use serde_json::{Value, json};
use switchyard_e2e::gateway::*;
use switchyard_e2e::{HttpResponse, PATIENCE, cli, eventually, sdk_script};

/// The instructions tests/e2e/responses_sdk.py sends.
const INSTRUCTIONS: &str = "You are the e2e check of the Switchyard gateway.";

/// A chain of two models whose first fails, and the fallback that serves.
struct Serving {
    primary: &'static str,
    primary_upstream: &'static str,
    /// The primary's scripted failure: an OpenAI-kind 503, or Anthropic's 529.
    failure: u16,
    fallback: &'static str,
    fallback_upstream: &'static str,
    /// The fallback is of the Anthropic kind (it gets a Messages body); else of the OpenAI
    /// kind (it gets Chat Completions).
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

    /// Runs one check of tests/e2e/responses_sdk.py over this chain; what it printed.
    async fn sdk(&self, gw: &Gateway, check: &str) -> Value {
        sdk(gw, check, self.primary, self.fallback).await
    }

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

    /// The fallback's provider got the instructions in its own form, the gateway's fields
    /// left out, under its upstream model name.
    async fn assert_upstream_plain(&self, gw: &Gateway, stream: bool) -> Value {
        let (path, body) = self.upstream(gw).await;
        assert_eq!(body["model"], self.fallback_upstream, "{body}");
        assert!(body.get("fallback_models").is_none(), "gateway fields stay at the node: {body}");
        assert_eq!(body["stream"].as_bool().unwrap_or(false), stream, "{body}");
        if self.anthropic {
            assert_eq!(path, "/v1/messages", "{body}");
            assert_eq!(body["system"], INSTRUCTIONS, "{body}");
        } else {
            assert!(path.ends_with("/chat/completions"), "{path}");
            let system = json!({"role": "system", "content": INSTRUCTIONS});
            assert_eq!(body["messages"][0], system, "{body}");
            assert_eq!(body["messages"][1]["role"], "user", "{body}");
        }
        assert_eq!(gw.upstream_requests(self.primary_upstream).await, 1, "primary tried once");
        body
    }
}

async fn sdk(gw: &Gateway, check: &str, primary: &str, fallback: &str) -> Value {
    let out =
        sdk_script("responses_sdk.py", &[&gw.node.url(), &gw.key, check, primary, fallback]).await;
    serde_json::from_str(out.trim()).unwrap_or_else(|e| panic!("{e}: {out}"))
}

/// The text of an OpenAI message's `content`: a string or text parts.
fn text(content: &Value) -> String {
    match content {
        Value::String(s) => s.clone(),
        Value::Array(parts) => parts.iter().filter_map(|p| p["text"].as_str()).collect(),
        _ => String::new(),
    }
}

async fn responses(gw: &Gateway, body: Value) -> HttpResponse {
    gw.post("/v1/responses", Some(&gw.key), body.to_string().as_bytes()).await
}

/// The events of an SSE body: each `event:` name with its `data:`.
fn sse_events(r: &HttpResponse) -> Vec<(String, Value)> {
    r.body
        .split("\n\n")
        .filter_map(|frame| {
            let event = frame.lines().find_map(|l| l.strip_prefix("event: "))?;
            let data = frame.lines().find_map(|l| l.strip_prefix("data: "))?;
            Some((event.to_owned(), serde_json::from_str(data).ok()?))
        })
        .collect()
}

fn names(events: &[(String, Value)]) -> Vec<&str> {
    events.iter().map(|(n, _)| n.as_str()).collect()
}

fn streamed_text(events: &[(String, Value)]) -> String {
    events
        .iter()
        .filter(|(n, _)| n == "response.output_text.delta")
        .filter_map(|(_, d)| d["delta"].as_str())
        .collect()
}

// === Plain ===

async fn plain(serving: Serving) {
    let gw = serving.gateway().await;
    let out = serving.sdk(&gw, "plain").await;
    serving.assert_failed_over(&out);
    assert_eq!(out["text"], serving.canned(), "{out}");
    assert_eq!(out["dropped_hints"], Value::Null, "nothing to drop: {out}");
    let body = serving.assert_upstream_plain(&gw, false).await;
    let max = if serving.anthropic { "max_tokens" } else { "max_completion_tokens" };
    assert_eq!(body[max], 64, "max_output_tokens reaches the model: {body}");
}

#[tokio::test]
async fn the_openai_sdk_gets_a_plain_response_from_an_openai_fallback() {
    plain(BY_OPENAI).await;
}

#[tokio::test]
async fn the_openai_sdk_gets_a_plain_response_from_an_anthropic_fallback() {
    plain(BY_ANTHROPIC).await;
}

#[tokio::test]
async fn a_failover_through_responses_is_an_event_labelled_with_its_surface() {
    let serving = BY_OPENAI;
    let gw = serving.gateway().await;
    let out = serving.sdk(&gw, "plain").await;
    let event = eventually(PATIENCE, "the api:model_failover event", || async {
        let out = cli(&gw.cp.url(), &["events", "--json"]).await;
        out.stdout
            .lines()
            .filter_map(|l| serde_json::from_str::<Value>(l).ok())
            .find(|e| e["type"] == "api:model_failover")
    })
    .await;
    assert_eq!(event["surface"], "responses", "{event}");
    assert_eq!(event["served_model"], serving.fallback, "{event}");
    assert_eq!(event["request_id"], out["request_id"], "{event}");
    let metrics = switchyard_e2e::http_get(gw.node.addr, "/metrics", None).await.unwrap().body;
    assert!(
        metrics.lines().any(|l| l.contains("surface=\"responses\"") && !l.starts_with('#')),
        "the failover is counted under its surface:\n{metrics}"
    );
}

// === Streaming ===

async fn stream(serving: Serving) {
    let gw = serving.gateway().await;
    let out = serving.sdk(&gw, "stream").await;
    assert_eq!(out["text"], serving.canned(), "{out}");
    assert_eq!(out["status"], "completed", "{out}");
    assert_eq!(out["created"], 1, "one response.created: {out}");
    // The report rides in `response.created`'s response.
    serving.assert_failed_over(&out);
    serving.assert_upstream_plain(&gw, true).await;
}

#[tokio::test]
async fn the_openai_sdk_streams_a_response_from_an_openai_fallback() {
    stream(BY_OPENAI).await;
}

#[tokio::test]
async fn the_openai_sdk_streams_a_response_from_an_anthropic_fallback() {
    stream(BY_ANTHROPIC).await;
}

#[tokio::test]
async fn the_sdks_stream_helper_builds_the_response_it_streamed() {
    let serving = BY_OPENAI;
    let gw = serving.gateway().await;
    let out = serving.sdk(&gw, "stream_helper").await;
    assert_eq!(out["text"], serving.canned(), "{out}");
    assert_eq!(out["model"], serving.fallback, "{out}");
    assert_eq!(out["status"], "completed", "{out}");
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_stream_failing_before_its_first_content_fails_over_with_one_response_created() {
    let gw = Gateway::start().await;
    // The primary's stream opens, then fails in-band before any content: the commit point
    // is not reached, so the fallback answers and the client sees one stream.
    gw.script("primary", json!({"kind": "stream_error", "after": 0})).await;
    let out = sdk(&gw, "stream", PRIMARY, SECONDARY).await;
    assert_eq!(out["created"], 1, "{out}");
    assert_eq!(out["text"], "Hello from secondary.", "{out}");
    assert_eq!(out["model"], SECONDARY, "{out}");
    assert_eq!(out["served_header"], SECONDARY, "{out}");
    assert_eq!(out["secureai"]["failover"]["attempts"][0]["status"], "failed", "{out}");
    assert_eq!(gw.upstream_requests("primary").await, 1);
    assert_eq!(gw.upstream_requests("secondary").await, 1);
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_stream_breaking_after_its_first_content_ends_with_response_failed() {
    let gw = Gateway::start().await;
    gw.script("primary", json!({"kind": "ok", "chunks": 5, "drop_after": 2})).await;
    let request = json!({"model": PRIMARY, "fallback_models": [SECONDARY], "input": "Say hello",
        "stream": true});
    let r = responses(&gw, request).await;
    assert_eq!(r.status, 200, "{}", r.body);
    let events = sse_events(&r);
    let names = names(&events);
    assert_eq!(names.iter().filter(|n| **n == "response.created").count(), 1, "{}", r.body);
    assert!(!streamed_text(&events).is_empty(), "content came before the break: {}", r.body);
    let (last, failed) = events.last().unwrap();
    assert_eq!(last, "response.failed", "{}", r.body);
    assert_eq!(failed["response"]["status"], "failed", "{failed}");
    assert!(failed["response"]["error"]["code"].as_str().is_some_and(|c| !c.is_empty()));
    assert!(!names.contains(&"response.completed"), "{}", r.body);
    assert_eq!(gw.upstream_requests("secondary").await, 0, "no second model after the commit");
}

// === A function call and its output ===

#[tokio::test]
async fn a_function_call_and_its_output_round_trip_through_an_openai_fallback() {
    let serving = BY_OPENAI;
    let gw = serving.gateway().await;
    // The simulated OpenAI model calls the tool it is offered (until it gets the result).
    gw.script(serving.fallback_upstream, json!({"kind": "ok", "call_tools": true})).await;
    let out = serving.sdk(&gw, "tools").await;
    assert_eq!(out["first_tool"], "get_weather", "{out}");
    assert_eq!(out["first_arguments"], json!({"city": "sim"}), "{out}");
    serving.assert_failed_over(&out);
    assert_eq!(out["text"], serving.canned(), "{out}");
    // The second call, as OpenAI takes it: the tool as a function, the call as the
    // assistant's tool_calls, its output as a `tool` message.
    let (_, body) = serving.upstream(&gw).await;
    assert_eq!(body["tools"][0]["type"], "function", "{body}");
    assert_eq!(body["tools"][0]["function"]["name"], "get_weather", "{body}");
    assert_eq!(body["tools"][0]["function"]["parameters"]["required"], json!(["city"]), "{body}");
    let id = out["call_id"].as_str().unwrap();
    let turns = body["messages"].as_array().unwrap();
    let roles: Vec<&str> = turns.iter().map(|m| m["role"].as_str().unwrap_or_default()).collect();
    assert_eq!(roles, ["system", "user", "assistant", "tool"], "{body}");
    let call = &turns[2]["tool_calls"][0];
    assert_eq!(call["id"], id, "{body}");
    assert_eq!(call["function"]["name"], "get_weather", "{body}");
    assert_eq!(turns[3]["tool_call_id"], id, "{body}");
    assert_eq!(text(&turns[3]["content"]), "sunny, 21 degrees", "{body}");
}

#[tokio::test]
async fn a_function_call_and_its_output_round_trip_through_an_anthropic_fallback() {
    let serving = BY_ANTHROPIC;
    let gw = serving.gateway().await;
    let out = serving.sdk(&gw, "tools").await;
    // The simulated Anthropic model calls the tool it was offered, with a placeholder input.
    assert_eq!(out["first_tool"], "get_weather", "{out}");
    assert_eq!(out["first_arguments"], json!({"city": "sim"}), "{out}");
    serving.assert_failed_over(&out);
    assert_eq!(out["text"], serving.canned(), "{out}");
    // The second call, as Anthropic takes it: the tool, the tool_use and its tool_result.
    let (_, body) = serving.upstream(&gw).await;
    assert_eq!(body["system"], INSTRUCTIONS, "{body}");
    assert_eq!(body["tools"][0]["name"], "get_weather", "{body}");
    let id = out["call_id"].as_str().unwrap();
    let turns = body["messages"].as_array().unwrap();
    assert_eq!(turns.len(), 3, "{body}");
    assert_eq!(turns[1]["role"], "assistant", "{body}");
    let tool_use = turns[1]["content"]
        .as_array()
        .and_then(|blocks| blocks.iter().find(|b| b["type"] == "tool_use"))
        .unwrap_or_else(|| panic!("no tool_use: {body}"));
    assert_eq!(tool_use["id"], id, "{body}");
    assert_eq!(turns[2]["content"][0]["type"], "tool_result", "{body}");
    assert_eq!(turns[2]["content"][0]["tool_use_id"], id, "{body}");
}

// === Errors ===

#[tokio::test]
async fn a_failed_chain_raises_once_at_the_sdks_default_retries() {
    let serving = BY_OPENAI;
    let gw = serving.gateway().await;
    gw.script(serving.fallback_upstream, json!({"kind": "status", "status": 503})).await;
    let out = serving.sdk(&gw, "chain_failed").await;
    assert_eq!(out["class"], "InternalServerError", "{out}");
    assert_eq!(out["status"], 502, "{out}");
    assert_eq!(out["should_retry"], "false", "{out}");
    assert_eq!(out["code"], "all_models_failed", "{out}");
    let attempts = out["error"]["attempts"].as_array().unwrap_or_else(|| panic!("{out}"));
    assert_eq!(attempts.len(), 2, "{out}");
    // At its default two retries the SDK sent the chain once: `x-should-retry: false`.
    assert_eq!(gw.upstream_requests(serving.primary_upstream).await, 1);
    assert_eq!(gw.upstream_requests(serving.fallback_upstream).await, 1);
}

#[tokio::test]
async fn previous_response_id_raises_bad_request_naming_it() {
    let gw = Gateway::start().await;
    let out = sdk(&gw, "previous_response_id", PRIMARY, SECONDARY).await;
    assert_eq!(out["status"], 400, "{out}");
    assert_eq!(out["param"], "previous_response_id", "{out}");
    assert!(out["message"].as_str().unwrap().contains("stateless"), "{out}");
    assert_eq!(gw.upstream_total().await, 0, "refused before any upstream call");
}

#[tokio::test]
async fn bad_input_is_refused_naming_the_field_with_nothing_sent_upstream() {
    let gw = Gateway::start().await;
    let user = json!({"role": "user", "content": "hi"});
    let call =
        json!({"type": "function_call", "call_id": "call_1", "name": "f", "arguments": "{}"});
    let cases = [
        (json!({"input": [user, {"type": "item_reference", "id": "msg_1"}]}), "input[1].type"),
        (
            json!({"input": [user, call, {"type": "function_call_output", "call_id": "call_9", "output": "x"}]}),
            "input[2].call_id",
        ),
        (json!({"input": "hi", "max_output_tokens": 0}), "max_output_tokens"),
        (json!({"input": "hi", "text": {"format": {"type": "grammar"}}}), "text.format.type"),
        (json!({"input": "hi", "previous_response_id": "resp_1"}), "previous_response_id"),
    ];
    for (mut body, param) in cases {
        body["model"] = json!(PRIMARY);
        let r = responses(&gw, body).await;
        assert_eq!(r.status, 400, "{param}: {}", r.body);
        let error = &r.json()["error"];
        assert_eq!(error["param"], param, "{}", r.body);
        assert_eq!(error["type"], "invalid_request_error", "{}", r.body);
        assert!(error["message"].as_str().unwrap().contains(param), "{}", r.body);
    }
    assert_eq!(gw.upstream_total().await, 0, "nothing reached a provider");
}

#[tokio::test]
async fn built_in_tools_are_dropped_and_named_not_refused() {
    let gw = Gateway::start().await;
    // Codex offers some tools in an `additional_tools` input item; they join `tools`.
    let input = json!([{"type": "additional_tools", "tools": [{"type": "function",
            "name": "update_plan", "parameters": {"type": "object", "properties": {}}}]},
        {"type": "message", "role": "user", "content": [{"type": "input_text", "text": "hi"}]}]);
    let body = json!({"model": SECONDARY, "input": input,
        "tools": [{"type": "web_search"}, {"type": "custom", "name": "apply_patch"},
            {"type": "namespace", "name": "mcp__docs", "tools": [
                {"type": "function", "name": "mcp__docs__search", "parameters": {"type": "object", "properties": {}}}]}]});
    let r = responses(&gw, body).await;
    assert_eq!(r.status, 200, "{}", r.body);
    assert_eq!(r.header("x-dropped-hints").as_deref(), Some("web_search, custom"), "{}", r.body);
    let sent = gw.last_upstream_request("secondary").await;
    let tools = sent["body"]["tools"].as_array().unwrap();
    let names: Vec<&str> =
        tools.iter().map(|t| t["function"]["name"].as_str().unwrap_or_default()).collect();
    assert_eq!(names, ["update_plan", "mcp__docs__search"], "{sent}");
}

// === The chain's other rules, on this surface ===

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_degraded_answer_comes_in_the_responses_shape_plain_and_streamed() {
    let gw = Gateway::start().await;
    for upstream in ["primary", "secondary"] {
        gw.script(upstream, json!({"kind": "status", "status": 503})).await;
    }
    let mut request = json!({"model": PRIMARY, "fallback_models": [SECONDARY], "input": "Hello",
        "redundancy": {"degraded": {"message": "Back in a minute."}}});

    let r = responses(&gw, request.clone()).await;
    assert_eq!(r.status, 200, "{}", r.body);
    assert_eq!(r.header("x-switchyard-degraded").as_deref(), Some("true"));
    let v = r.json();
    assert_eq!(v["object"], "response", "{v}");
    assert_eq!(v["status"], "completed", "{v}");
    assert_eq!(v["model"], "switchyard/degraded", "{v}");
    assert_eq!(v["output"][0]["content"][0]["text"], "Back in a minute.", "{v}");
    assert_eq!(v["secureai"]["degraded"]["reason"], "all_models_failed", "{v}");

    request["stream"] = json!(true);
    let r = responses(&gw, request).await;
    assert_eq!(r.status, 200, "{}", r.body);
    let events = sse_events(&r);
    assert_eq!(names(&events).first(), Some(&"response.created"), "{}", r.body);
    assert_eq!(names(&events).last(), Some(&"response.completed"), "{}", r.body);
    assert_eq!(events[0].1["response"]["model"], "switchyard/degraded", "{}", r.body);
    let report = &events[0].1["response"]["secureai"];
    assert_eq!(report["degraded"]["reason"], "all_models_failed", "{}", r.body);
    assert_eq!(streamed_text(&events), "Back in a minute.");
}

#[tokio::test]
async fn a_json_schema_text_format_fails_over_on_invalid_output() {
    let gw = Gateway::start().await;
    let valid = r#"{"name": "Ada", "age": 36}"#;
    gw.script("primary", json!({"kind": "ok", "text": "Sure! Ada is 36."})).await;
    gw.script("secondary", json!({"kind": "ok", "text": valid})).await;
    let schema = json!({"type": "object",
        "properties": {"name": {"type": "string"}, "age": {"type": "integer"}},
        "required": ["name", "age"], "additionalProperties": false});
    let request = json!({"model": PRIMARY, "fallback_models": [SECONDARY], "input": "Who?",
        "text": {"format": {"type": "json_schema", "name": "person", "strict": true, "schema": schema}},
        "redundancy": {"on": ["server_error", "invalid_output"]}});
    let r = responses(&gw, request).await;
    assert_eq!(r.status, 200, "{}", r.body);
    let v = r.json();
    assert_eq!(v["model"], SECONDARY, "{v}");
    assert_eq!(v["output"][0]["content"][0]["text"], valid, "{v}");
    assert_eq!(
        attempts(&v),
        [triple(PRIMARY, "failed", "invalid_output"), triple(SECONDARY, "served", "")],
        "{v}"
    );
    // The model was asked for the schema in its own terms.
    let sent = gw.last_upstream_request("secondary").await["body"].clone();
    assert_eq!(sent["response_format"]["type"], "json_schema", "{sent}");
    assert_eq!(sent["response_format"]["json_schema"]["schema"], schema, "{sent}");
}

/// The answer the continuation test's models give, cut into five pieces by the simulator.
const ANSWER: &str = "The quick brown fox jumps over the lazy dog, twice.";

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_stream_cut_after_its_commit_is_continued_and_the_client_reads_one_response() {
    let gw = Gateway::start().await;
    // Two models that can continue an answer (`continuation: prefill`).
    let models = "  - name: cont/a
    provider: sim-us
    upstream_model: cont-a
    continuation: prefill
  - name: cont/b
    provider: sim-us
    upstream_model: cont-b
    continuation: prefill
";
    let yaml = catalog_yaml(&gw.sim.url(), &GatewayOptions::default()).replacen(
        "models:\n",
        &format!("models:\n{models}"),
        1,
    );
    let file = gw.dir.path().join("continuation.yaml");
    std::fs::write(&file, yaml).unwrap();
    let out = gw.admin(&["apply", "-f", &file.display().to_string(), "--json"]).await;
    assert!(out.success, "{}", out.stderr);
    gw.wait_for(out.json()["version"].as_i64().unwrap()).await;
    // cont/a breaks after two chunks once, then answers whole; the continuation gets the rest.
    let once = json!({"kind": "sequence",
        "steps": [{"kind": "ok", "text": ANSWER, "drop_after": 2}],
        "then": {"kind": "ok", "text": ANSWER}});
    gw.script("cont-a", once).await;
    gw.script("cont-b", json!({"kind": "ok", "text": ANSWER})).await;

    let request = json!({"models": ["cont/a", "cont/b"], "input": "Say it.", "stream": true});
    let r = responses(&gw, request).await;
    assert_eq!(r.status, 200, "{}", r.body);
    let events = sse_events(&r);
    let names = names(&events);
    assert_eq!(names.iter().filter(|n| **n == "response.created").count(), 1, "{}", r.body);
    assert_eq!(names.last(), Some(&"response.completed"), "{}", r.body);
    assert_eq!(streamed_text(&events), ANSWER, "{}", r.body);
    let (_, completed) = events.last().unwrap();
    assert_eq!(completed["response"]["output"][0]["content"][0]["text"], ANSWER, "{completed}");
    // The continuation asked for the rest: the translated request, the text so far last.
    let last = gw.last_upstream_request("cont-a").await["body"].clone();
    let messages = last["messages"].as_array().unwrap();
    assert_eq!(messages.last().unwrap()["role"], "assistant", "{last}");
    assert_eq!(gw.upstream_requests("cont-a").await, 2, "the break, then the continuation");
    assert_eq!(gw.upstream_requests("cont-b").await, 0, "the fallback was not needed");
}

#[tokio::test]
async fn a_gemini_model_serves_a_response_too() {
    let gw = Gateway::start().await;
    let request = json!({"model": GEMINI, "instructions": INSTRUCTIONS, "input": "Say hello"});
    let r = responses(&gw, request).await;
    assert_eq!(r.status, 200, "{}", r.body);
    let v = r.json();
    assert_eq!(v["model"], GEMINI, "{v}");
    assert_eq!(v["output"][0]["content"][0]["text"], "Hello from gemini-sim.", "{v}");
    let sent = gw.last_upstream_request(GEMINI_UPSTREAM).await;
    assert!(sent["path"].as_str().unwrap().contains("generateContent"), "{sent}");
    assert!(sent["body"]["systemInstruction"].to_string().contains(INSTRUCTIONS), "{sent}");
}

// === OpenAI-kind models: the body as sent, the answer as it came ===

/// A request shaped as Codex sends it: built-in, namespace and function tools, a reasoning
/// item with its encrypted content, `include`, `store: false`.
fn codex_shaped(model: &str, fallback: &[&str], stream: bool) -> Value {
    json!({"model": model, "fallback_models": fallback, "instructions": INSTRUCTIONS,
        "input": [
            {"type": "message", "role": "user", "content": [{"type": "input_text", "text": "Say hello"}]},
            {"type": "reasoning", "id": "rs_1", "summary": [], "encrypted_content": "gAAAA-opaque"},
            {"type": "message", "role": "user", "content": [{"type": "input_text", "text": "Again"}]}],
        "tools": [{"type": "web_search"},
            {"type": "namespace", "name": "mcp__docs", "description": "Docs", "tools": [
                {"type": "function", "name": "mcp__docs__search", "parameters": {"type": "object", "properties": {}}}]},
            {"type": "function", "name": "shell", "strict": false,
                "parameters": {"type": "object", "properties": {"cmd": {"type": "string"}}}}],
        "tool_choice": "auto", "parallel_tool_calls": true,
        "reasoning": {"effort": "medium", "summary": "auto"},
        "include": ["reasoning.encrypted_content"], "store": false, "stream": stream,
        "prompt_cache_key": "session-1"})
}

/// What the OpenAI-kind provider must get for `sent`: the same body, but `model` its
/// upstream name and the gateway's fields left out.
fn as_sent_upstream(mut sent: Value) -> Value {
    let fields = sent.as_object_mut().unwrap();
    fields.remove("fallback_models");
    fields.insert("model".into(), json!(OPENAI_UPSTREAM));
    sent
}

#[tokio::test]
async fn a_codex_shaped_request_reaches_an_openai_model_unchanged_and_is_answered() {
    let gw = Gateway::start().await;
    let request = codex_shaped(OPENAI, &[], false);
    let r = responses(&gw, request.clone()).await;
    assert_eq!(r.status, 200, "{}", r.body);
    assert_eq!(r.header("x-dropped-hints"), None, "nothing is dropped: {}", r.body);
    let v = r.json();
    assert_eq!((v["object"].as_str(), v["model"].as_str()), (Some("response"), Some(OPENAI)));
    assert_eq!(v["output"][0]["content"][0]["text"], "Hello from gpt-sim.", "{v}");
    let sent = gw.last_upstream_request(OPENAI_UPSTREAM).await;
    assert_eq!(sent["path"], "/v1/responses", "{sent}");
    assert_eq!(sent["body"], as_sent_upstream(request), "the body as the client sent it");
}

#[tokio::test]
async fn an_openai_model_failing_over_to_anthropic_drops_the_built_in_tools_and_names_them() {
    let gw = Gateway::start().await;
    gw.script(OPENAI_UPSTREAM, json!({"kind": "status", "status": 503})).await;
    let r = responses(&gw, codex_shaped(OPENAI, &[ANTHROPIC], false)).await;
    assert_eq!(r.status, 200, "{}", r.body);
    let v = r.json();
    assert_eq!(v["model"], ANTHROPIC, "{v}");
    assert_eq!(v["secureai"]["failover"]["attempts"][0]["status"], "failed", "{v}");
    let dropped = r.header("x-dropped-hints").unwrap_or_default();
    assert!(dropped.split(", ").any(|h| h == "web_search"), "{dropped}");
    assert_eq!(gw.upstream_requests(OPENAI_UPSTREAM).await, 1, "the primary was tried once");
    let sent = gw.last_upstream_request(ANTHROPIC_UPSTREAM).await;
    assert_eq!(sent["path"], "/v1/messages", "{sent}");
    let tools: Vec<&str> = sent["body"]["tools"]
        .as_array()
        .unwrap()
        .iter()
        .map(|t| t["name"].as_str().unwrap_or_default())
        .collect();
    assert_eq!(tools, ["mcp__docs__search", "shell"], "{sent}");
}

#[tokio::test]
async fn an_openai_models_stream_passes_as_it_came_under_the_gateway_name() {
    let gw = Gateway::start().await;
    let request = codex_shaped(OPENAI, &[], true);
    let r = responses(&gw, request.clone()).await;
    assert_eq!(r.status, 200, "{}", r.body);
    let events = sse_events(&r);
    for (i, (name, data)) in events.iter().enumerate() {
        assert_eq!(data["type"], name.as_str(), "{}", r.body);
        assert_eq!(data["sequence_number"], i as u64, "the upstream's numbering: {}", r.body);
    }
    let names = names(&events);
    assert_eq!(names.first(), Some(&"response.created"), "{}", r.body);
    assert_eq!(names.last(), Some(&"response.completed"), "{}", r.body);
    assert_eq!(streamed_text(&events), "Hello from gpt-sim.", "{}", r.body);
    for (_, data) in events.iter().filter(|(_, d)| d.get("response").is_some()) {
        assert_eq!(data["response"]["model"], OPENAI, "{data}");
    }
    let sent = gw.last_upstream_request(OPENAI_UPSTREAM).await;
    assert_eq!(sent["body"], as_sent_upstream(request));
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn an_openai_models_stream_failing_before_its_first_content_fails_over_with_one_response_created()
 {
    let gw = Gateway::start().await;
    // The stream opens (its response.created sent), then fails in-band before any text.
    gw.script(OPENAI_UPSTREAM, json!({"kind": "stream_error", "after": 0})).await;
    let r = responses(&gw, codex_shaped(OPENAI, &[SECONDARY], true)).await;
    assert_eq!(r.status, 200, "{}", r.body);
    let events = sse_events(&r);
    let created: Vec<&Value> =
        events.iter().filter(|(n, _)| n == "response.created").map(|(_, d)| d).collect();
    assert_eq!(created.len(), 1, "{}", r.body);
    assert_eq!(created[0]["response"]["model"], SECONDARY, "{}", r.body);
    assert_eq!(streamed_text(&events), "Hello from secondary.", "{}", r.body);
    assert_eq!(names(&events).last(), Some(&"response.completed"), "{}", r.body);
    assert_eq!(gw.upstream_requests(OPENAI_UPSTREAM).await, 1);
    assert_eq!(gw.upstream_requests("secondary").await, 1);
}

#[tokio::test]
async fn an_openai_models_stream_breaking_after_its_first_content_ends_with_response_failed() {
    let gw = Gateway::start().await;
    gw.script(OPENAI_UPSTREAM, json!({"kind": "ok", "chunks": 5, "drop_after": 2})).await;
    let r = responses(&gw, codex_shaped(OPENAI, &[SECONDARY], true)).await;
    assert_eq!(r.status, 200, "{}", r.body);
    let events = sse_events(&r);
    assert!(!streamed_text(&events).is_empty(), "content came before the break: {}", r.body);
    let (last, failed) = events.last().unwrap();
    assert_eq!(last, "response.failed", "{}", r.body);
    assert_eq!(failed["response"]["status"], "failed", "{failed}");
    assert_eq!(failed["response"]["model"], OPENAI, "{failed}");
    let before = events[events.len() - 2].1["sequence_number"].as_u64().unwrap();
    assert_eq!(failed["sequence_number"].as_u64(), Some(before + 1), "{}", r.body);
    assert_eq!(gw.upstream_requests("secondary").await, 0, "no second model after the commit");
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn the_openai_sdk_reads_an_openai_kind_fallbacks_own_answers_plain_and_streamed() {
    let gw = Gateway::start().await;
    gw.script("primary", json!({"kind": "status", "status": 503})).await;
    for check in ["plain", "stream", "stream_helper"] {
        let out = sdk(&gw, check, PRIMARY, OPENAI).await;
        assert_eq!(out["text"], "Hello from gpt-sim.", "{check}: {out}");
        assert_eq!(out["model"], OPENAI, "{check}: {out}");
        if check != "stream_helper" {
            assert_eq!(out["served_header"], OPENAI, "{check}: {out}");
            assert_eq!(out["dropped_hints"], Value::Null, "{check}: {out}");
            assert_eq!(out["secureai"]["served_model"], OPENAI, "{check}: {out}");
        }
        let sent = gw.last_upstream_request(OPENAI_UPSTREAM).await;
        assert_eq!(sent["path"], "/v1/responses", "{check}: {sent}");
        assert_eq!(sent["body"]["instructions"], INSTRUCTIONS, "{check}: {sent}");
        assert!(sent["body"].get("fallback_models").is_none(), "{check}: {sent}");
        if check == "stream" {
            assert_eq!(out["created"], 1, "{out}");
        }
    }
}

#[tokio::test]
async fn an_azure_openai_model_gets_the_body_as_sent_on_its_v1_responses_path() {
    let gw = Gateway::start().await;
    let request = codex_shaped(AZURE, &[], false);
    let r = responses(&gw, request.clone()).await;
    assert_eq!(r.status, 200, "{}", r.body);
    assert_eq!(r.header("x-dropped-hints"), None, "{}", r.body);
    assert_eq!(r.json()["model"], AZURE, "{}", r.body);
    let sent = gw.last_upstream_request(AZURE_DEPLOYMENT).await;
    assert_eq!(sent["path"], "/openai/v1/responses", "{sent}");
    let mut expected = request;
    expected["model"] = json!(AZURE_DEPLOYMENT);
    expected.as_object_mut().unwrap().remove("fallback_models");
    assert_eq!(sent["body"], expected, "the deployment is the body's model");
}
