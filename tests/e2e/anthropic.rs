//! An Anthropic-kind provider in an OpenAI-shaped chain: the node translates the request to
//! Anthropic's Messages API and the answer back (docs/catalog.md, "Provider kinds"),
//! streaming included, and an Anthropic 529 `overloaded_error` fails over as `server_error`
//! (docs/http-api.md, "Failover"). Real processes on loopback; the simulator speaks
//! Anthropic at `/v1/messages`.
#![allow(clippy::unwrap_used, clippy::expect_used)]

use serde_json::{Value, json};
use switchyard_e2e::gateway::*;

fn hello(model: &str, fallbacks: &[&str]) -> Value {
    json!({"model": model, "fallback_models": fallbacks,
           "messages": [{"role": "system", "content": "Be brief."},
                        {"role": "user", "content": "hello there"}]})
}

#[tokio::test]
async fn a_503_fails_over_to_anthropic_which_answers_in_openai_shape() {
    let gw = Gateway::start().await;
    gw.script("primary", json!({"kind": "status", "status": 503})).await;
    gw.script(ANTHROPIC_UPSTREAM, json!({"kind": "ok", "text": "Hi from Claude."})).await;
    let mut body = hello(PRIMARY, &[ANTHROPIC]);
    body["temperature"] = json!(1.8);
    let r = gw.chat(body).await;
    assert_eq!(r.status, 200, "{}", r.body);
    let v = r.json();
    assert_eq!(v["object"], "chat.completion");
    assert_eq!(v["model"], ANTHROPIC);
    assert_eq!(v["choices"][0]["message"]["role"], "assistant");
    assert_eq!(v["choices"][0]["message"]["content"], "Hi from Claude.");
    assert_eq!(v["choices"][0]["finish_reason"], "stop");
    // The simulator counts words: "Be brief." + "hello there" in, "Hi from Claude." out.
    assert_eq!(v["usage"]["prompt_tokens"], 4);
    assert_eq!(v["usage"]["completion_tokens"], 3);
    assert_eq!(v["usage"]["total_tokens"], 7);
    assert_eq!(
        attempts(&v),
        [triple(PRIMARY, "failed", "server_error"), triple(ANTHROPIC, "served", "")]
    );

    // What went upstream is an Anthropic Messages request.
    let sent = gw.last_upstream_request(ANTHROPIC_UPSTREAM).await;
    assert_eq!(sent["path"], "/v1/messages");
    assert_eq!(sent["headers"]["anthropic-version"], "2023-06-01");
    let body = &sent["body"];
    assert_eq!(body["model"], ANTHROPIC_UPSTREAM);
    assert_eq!(body["system"], "Be brief.");
    assert_eq!(body["messages"], json!([{"role": "user", "content": "hello there"}]));
    assert_eq!(body["max_tokens"], 512, "the catalog's max_tokens when the client sets none");
    assert_eq!(body["temperature"], 1.0, "capped into Anthropic's 0-1");
}

#[tokio::test]
async fn a_stream_through_anthropic_is_openai_chunks_ending_in_done() {
    let gw = Gateway::start().await;
    gw.script("primary", json!({"kind": "status", "status": 503})).await;
    gw.script(ANTHROPIC_UPSTREAM, json!({"kind": "ok", "text": "one two three", "chunks": 3}))
        .await;
    let mut body = hello(PRIMARY, &[ANTHROPIC]);
    body["stream"] = json!(true);
    body["stream_options"] = json!({"include_usage": true});
    let s = gw.stream(body).await;
    assert_eq!(s.status, 200);
    assert_eq!(s.header("x-served-model").as_deref(), Some(ANTHROPIC));
    assert_eq!(s.text(), "one two three");
    let chunks = s.chunks();
    for c in &chunks {
        assert_eq!(c["object"], "chat.completion.chunk", "{c}");
        assert_eq!(c["model"], ANTHROPIC);
    }
    assert_eq!(chunks[0]["choices"][0]["delta"]["role"], "assistant");
    assert_eq!(
        attempts(&s.report_chunk()),
        [triple(PRIMARY, "failed", "server_error"), triple(ANTHROPIC, "served", "")]
    );
    assert!(chunks.iter().any(|c| c["choices"][0]["finish_reason"] == "stop"));
    let usage = chunks.iter().find(|c| c["choices"] == json!([])).expect("the usage chunk");
    assert_eq!(usage["usage"]["completion_tokens"], 3);
    assert_eq!(s.frames.last().map(String::as_str), Some("[DONE]"));
    assert!(s.error_frame().is_none());
}

fn weather_request() -> Value {
    json!({"model": ANTHROPIC, "tool_choice": "required",
           "messages": [{"role": "user", "content": "Weather in Paris?"}],
           "tools": [{"type": "function", "function": {"name": "get_weather",
               "description": "Current weather for a city",
               "parameters": {"type": "object", "properties": {"location": {"type": "string"}},
                              "required": ["location"]}}}]})
}

#[tokio::test]
async fn a_tools_request_through_anthropic_returns_tool_calls_with_json_string_arguments() {
    let gw = Gateway::start().await;
    let r = gw.chat(weather_request()).await;
    assert_eq!(r.status, 200, "{}", r.body);
    let v = r.json();
    let call = &v["choices"][0]["message"]["tool_calls"][0];
    assert_eq!(call["type"], "function");
    assert_eq!(call["function"]["name"], "get_weather");
    let arguments = call["function"]["arguments"].as_str().expect("arguments is a string");
    assert_eq!(serde_json::from_str::<Value>(arguments).unwrap(), json!({"location": "sim"}));
    assert!(call["id"].as_str().unwrap().starts_with("toolu_"));
    assert_eq!(v["choices"][0]["finish_reason"], "tool_calls");
    let sent = gw.last_upstream_request(ANTHROPIC_UPSTREAM).await;
    assert_eq!(sent["body"]["tools"][0]["input_schema"]["required"], json!(["location"]));
    assert_eq!(sent["body"]["tool_choice"], json!({"type": "any"}));

    // Streamed: a tool-call delta with id and name, then the arguments in pieces.
    let mut body = weather_request();
    body["stream"] = json!(true);
    let s = gw.stream(body).await;
    let deltas: Vec<Value> =
        s.chunks().iter().map(|c| c["choices"][0]["delta"]["tool_calls"][0].clone()).collect();
    let start = deltas.iter().find(|d| d["id"].is_string()).expect("a tool call starts");
    assert_eq!(start["function"]["name"], "get_weather");
    let streamed: String =
        deltas.iter().filter_map(|d| d["function"]["arguments"].as_str()).collect();
    assert_eq!(serde_json::from_str::<Value>(&streamed).unwrap(), json!({"location": "sim"}));
    assert_eq!(s.frames.last().map(String::as_str), Some("[DONE]"));
}

#[tokio::test]
async fn an_anthropic_529_fails_over_as_server_error() {
    let gw = Gateway::start().await;
    gw.script(ANTHROPIC_UPSTREAM, json!({"kind": "status", "status": 529})).await;
    gw.script("secondary", json!({"kind": "ok", "text": "from the fallback"})).await;
    let r = gw.chat(hello(ANTHROPIC, &[SECONDARY])).await;
    assert_eq!(r.status, 200, "{}", r.body);
    let v = r.json();
    assert_eq!(v["choices"][0]["message"]["content"], "from the fallback");
    assert_eq!(
        attempts(&v),
        [triple(ANTHROPIC, "failed", "server_error"), triple(SECONDARY, "served", "")]
    );
}

#[tokio::test]
async fn an_in_band_overloaded_error_before_content_fails_over_as_server_error() {
    let gw = Gateway::start().await;
    gw.script(ANTHROPIC_UPSTREAM, json!({"kind": "stream_error", "after": 0})).await;
    gw.script("secondary", json!({"kind": "ok", "text": "from the fallback"})).await;
    let mut body = hello(ANTHROPIC, &[SECONDARY]);
    body["stream"] = json!(true);
    let s = gw.stream(body).await;
    assert_eq!(s.status, 200);
    assert_eq!(s.text(), "from the fallback");
    assert_eq!(
        attempts(&s.report_chunk()),
        [triple(ANTHROPIC, "failed", "server_error"), triple(SECONDARY, "served", "")]
    );
}

/// Runs one of the SDK scripts beside this file against the node; its stdout lines.
async fn sdk(gw: &Gateway, script: &str, models: &[&str]) -> Vec<String> {
    let url = format!("{}/v1", gw.node.url());
    let mut args = vec![url.as_str(), gw.key.as_str()];
    args.extend_from_slice(models);
    switchyard_e2e::sdk_script(script, &args).await.lines().map(str::to_owned).collect()
}

#[tokio::test]
async fn the_official_openai_python_sdk_reads_anthropic_answers_plain_and_streamed() {
    let gw = Gateway::start().await;
    gw.script("primary", json!({"kind": "status", "status": 503})).await;
    gw.script(ANTHROPIC_UPSTREAM, json!({"kind": "ok", "text": "streamed fallback text"})).await;
    gw.script(
        "tertiary",
        json!({"kind": "ok", "text": "alpha beta gamma delta epsilon", "chunks": 5, "drop_after": 2}),
    )
    .await;
    let plain = sdk(&gw, "openai_sdk.py", &[PRIMARY, ANTHROPIC]).await;
    assert_eq!(plain.len(), 3, "{plain:?}");
    let streamed = sdk(&gw, "openai_sdk_stream.py", &[PRIMARY, ANTHROPIC, TERTIARY]).await;
    assert_eq!(streamed.len(), 2, "{streamed:?}");
}
