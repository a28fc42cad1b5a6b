//! One chain across three providers — OpenAI-compatible → Anthropic → Gemini, all
//! simulated — where each failure reason moves to the next provider and the client gets the
//! same OpenAI shape whoever serves (docs/catalog.md, "Provider kinds"), plain and
//! streaming, with tool calls.
#![allow(clippy::unwrap_used, clippy::expect_used)]

use std::collections::BTreeSet;

use serde_json::{Value, json};
use switchyard_e2e::gateway::*;

fn chain(extra: Value) -> Value {
    let mut body = json!({"models": [PRIMARY, ANTHROPIC, GEMINI],
                          "messages": [{"role": "system", "content": "Be brief."},
                                       {"role": "user", "content": "What is the weather in Paris?"}]});
    for (k, v) in extra.as_object().unwrap() {
        body[k] = v.clone();
    }
    body
}

fn weather_tool() -> Value {
    json!([{"type": "function", "function": {"name": "get_weather", "description": "Current weather",
        "parameters": {"type": "object", "properties": {"city": {"type": "string"}}, "required": ["city"]}}}])
}

/// The keys a client relies on, recursively for the message: equal across providers.
fn shape(v: &Value) -> (BTreeSet<String>, BTreeSet<String>) {
    let top = v.as_object().unwrap().keys().filter(|k| *k != "secureai").cloned().collect();
    let message = v["choices"][0]["message"].as_object().unwrap().keys().cloned().collect();
    (top, message)
}

#[tokio::test]
async fn each_failure_reason_moves_to_the_next_provider_and_the_shape_stays_openais() {
    let gw = Gateway::start().await;
    // Served by each provider alone, for the reference shapes.
    let mut shapes = Vec::new();
    for model in [PRIMARY, ANTHROPIC, GEMINI] {
        let r =
            gw.chat(json!({"model": model, "messages": [{"role": "user", "content": "hi"}]})).await;
        assert_eq!(r.status, 200, "{model}: {}", r.body);
        let v = r.json();
        assert_eq!(v["object"], "chat.completion");
        assert_eq!(v["model"], model);
        for key in ["id", "object", "created", "model", "choices", "usage"] {
            assert!(v.get(key).is_some(), "{model} answer lacks {key}: {v}");
        }
        shapes.push(shape(&v).1);
    }
    assert!(shapes.iter().all(|s| s.contains("role") && s.contains("content")), "{shapes:?}");

    gw.script("primary", json!({"kind": "status", "status": 503})).await;
    gw.script(ANTHROPIC_UPSTREAM, json!({"kind": "status", "status": 429})).await;
    let r = gw.chat(chain(json!({}))).await;
    assert_eq!(r.status, 200, "{}", r.body);
    let v = r.json();
    assert_eq!(v["model"], GEMINI);
    assert_eq!(
        attempts(&v),
        [
            triple(PRIMARY, "failed", "server_error"),
            triple(ANTHROPIC, "failed", "rate_limit"),
            triple(GEMINI, "served", "")
        ]
    );

    gw.script("primary", json!({"kind": "hang"})).await;
    gw.script(ANTHROPIC_UPSTREAM, json!({"kind": "reset"})).await;
    let r = gw.chat(chain(json!({"redundancy": {"timeout_ms": 1000}}))).await;
    let v = r.json();
    assert_eq!(
        attempts(&v),
        [
            triple(PRIMARY, "failed", "timeout"),
            triple(ANTHROPIC, "failed", "connection_error"),
            triple(GEMINI, "served", "")
        ]
    );
}

#[tokio::test]
async fn tool_calls_come_back_in_openai_form_from_every_provider_plain_and_streaming() {
    let gw = Gateway::start().await;
    gw.script("primary", json!({"kind": "status", "status": 500})).await;
    for (anthropic, served) in
        [(json!({"kind": "ok"}), ANTHROPIC), (json!({"kind": "status", "status": 529}), GEMINI)]
    {
        gw.script(ANTHROPIC_UPSTREAM, anthropic).await;
        let r = gw.chat(chain(json!({"tools": weather_tool()}))).await;
        assert_eq!(r.status, 200, "{}", r.body);
        let v = r.json();
        assert_eq!(v["model"], served);
        let call = &v["choices"][0]["message"]["tool_calls"][0];
        assert_eq!(call["type"], "function", "{v}");
        assert_eq!(call["function"]["name"], "get_weather");
        let args: Value =
            serde_json::from_str(call["function"]["arguments"].as_str().unwrap()).unwrap();
        assert!(
            args["city"].is_string(),
            "arguments are a JSON string of the tool's input: {args}"
        );
        assert_eq!(v["choices"][0]["finish_reason"], "tool_calls");

        let s = gw.stream(chain(json!({"tools": weather_tool(), "stream": true}))).await;
        assert_eq!(s.frames.last().map(String::as_str), Some("[DONE]"), "{:?}", s.frames);
        let chunks = s.chunks();
        assert!(
            chunks.iter().all(|c| c["object"] == "chat.completion.chunk" && c["model"] == served)
        );
        let arguments: String = chunks
            .iter()
            .filter_map(|c| {
                c["choices"][0]["delta"]["tool_calls"][0]["function"]["arguments"].as_str()
            })
            .collect();
        let args: Value =
            serde_json::from_str(&arguments).unwrap_or_else(|e| panic!("{e}: {arguments}"));
        assert!(args["city"].is_string(), "{args}");
    }
}

#[tokio::test]
async fn the_official_openai_sdk_parses_every_providers_answer() {
    let gw = Gateway::start().await;
    let script = r#"
import json, sys, openai
base_url, key = sys.argv[1:3]
client = openai.OpenAI(base_url=base_url, api_key=key, max_retries=0)
tools = [{"type": "function", "function": {"name": "get_weather", "parameters": {"type": "object", "properties": {"city": {"type": "string"}}, "required": ["city"]}}}]
for model in sys.argv[3:]:
    r = client.chat.completions.create(model=model, messages=[{"role": "user", "content": "hi"}])
    assert r.model == model and r.choices[0].message.content, r
    if model != sys.argv[3]:  # the OpenAI-compatible simulator answers tools requests with text
        t = client.chat.completions.create(model=model, messages=[{"role": "user", "content": "weather?"}], tools=tools)
        call = t.choices[0].message.tool_calls[0]
        assert call.function.name == "get_weather" and isinstance(json.loads(call.function.arguments), dict), t
    text = "".join(c.choices[0].delta.content or "" for c in client.chat.completions.create(
        model=model, messages=[{"role": "user", "content": "hi"}], stream=True) if c.choices)
    assert text, model
    print(json.dumps({"model": model, "ok": True}))
"#;
    let out = tokio::process::Command::new(switchyard_e2e::python())
        .arg("-c")
        .arg(script)
        .arg(format!("{}/v1", gw.node.url()))
        .arg(&gw.key)
        .args([PRIMARY, ANTHROPIC, GEMINI])
        .env_remove("OPENAI_API_KEY")
        .env_remove("OPENAI_BASE_URL")
        .output()
        .await
        .unwrap();
    let stdout = String::from_utf8_lossy(&out.stdout);
    assert!(out.status.success(), "{stdout}\n{}", String::from_utf8_lossy(&out.stderr));
    assert_eq!(stdout.lines().count(), 3, "{stdout}");
}

#[tokio::test]
async fn azure_openai_is_called_at_its_deployment_url_and_answers_in_openai_shape() {
    let gw = Gateway::start().await;
    gw.script("primary", json!({"kind": "status", "status": 503})).await;
    let r = gw.chat(json!({"model": PRIMARY, "fallback_models": [AZURE], "messages": [{"role": "user", "content": "hi"}]})).await;
    assert_eq!(r.status, 200, "{}", r.body);
    let v = r.json();
    assert_eq!(v["model"], AZURE);
    assert_eq!(
        attempts(&v),
        [triple(PRIMARY, "failed", "server_error"), triple(AZURE, "served", "")]
    );
    let last = gw.last_upstream_request(AZURE_DEPLOYMENT).await;
    // The simulator records the path without its query; the api-version query and the
    // api-key header are checked in providers::azure's unit tests.
    assert_eq!(last["path"], "/openai/deployments/azure-deployment/chat/completions", "{last}");
    let s = gw.stream(json!({"model": AZURE, "stream": true, "messages": [{"role": "user", "content": "hi"}]})).await;
    assert_eq!(s.frames.last().map(String::as_str), Some("[DONE]"));
    assert!(!s.text().is_empty());
}
