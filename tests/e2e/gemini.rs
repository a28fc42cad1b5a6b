//! A Gemini-kind provider in an OpenAI-shaped chain: the node translates the request to the
//! Gemini API and the answer back (docs/catalog.md, "Provider kinds"), streaming included,
//! and Google's 429 RESOURCE_EXHAUSTED / 503 UNAVAILABLE fail over as `rate_limit` /
//! `server_error` (docs/http-api.md, "Failover"). Real processes on loopback; the simulator
//! speaks Gemini at
//! `/v1beta/models/{model}:generateContent` and `:streamGenerateContent`.
#![allow(clippy::unwrap_used, clippy::expect_used)]

use serde_json::{Value, json};
use switchyard_e2e::gateway::*;

fn hello(model: &str, fallbacks: &[&str]) -> Value {
    json!({"model": model, "fallback_models": fallbacks,
           "messages": [{"role": "system", "content": "Be brief."},
                        {"role": "user", "content": "hello there"}]})
}

#[tokio::test]
async fn a_503_fails_over_to_gemini_which_answers_in_openai_shape() {
    let gw = Gateway::start().await;
    gw.script("primary", json!({"kind": "status", "status": 503})).await;
    gw.script(GEMINI_UPSTREAM, json!({"kind": "ok", "text": "Hi from Gemini."})).await;
    let mut body = hello(PRIMARY, &[GEMINI]);
    body["temperature"] = json!(1.8);
    body["max_tokens"] = json!(64);
    body["stop"] = json!("END");
    let r = gw.chat(body).await;
    assert_eq!(r.status, 200, "{}", r.body);
    let v = r.json();
    assert_eq!(v["object"], "chat.completion");
    assert_eq!(v["model"], GEMINI);
    assert!(v["id"].as_str().unwrap().starts_with("chatcmpl-"));
    assert_eq!(v["choices"][0]["message"]["role"], "assistant");
    assert_eq!(v["choices"][0]["message"]["content"], "Hi from Gemini.");
    assert_eq!(v["choices"][0]["finish_reason"], "stop");
    // The simulator counts words: "Be brief." + "hello there" in, "Hi from Gemini." out.
    assert_eq!(v["usage"]["prompt_tokens"], 4);
    assert_eq!(v["usage"]["completion_tokens"], 3);
    assert_eq!(v["usage"]["total_tokens"], 7);
    assert_eq!(
        attempts(&v),
        [triple(PRIMARY, "failed", "server_error"), triple(GEMINI, "served", "")]
    );

    // What went upstream is a GenerateContentRequest.
    let sent = gw.last_upstream_request(GEMINI_UPSTREAM).await;
    assert_eq!(sent["path"], "/v1beta/models/gemini-sim:generateContent");
    let body = &sent["body"];
    assert_eq!(body["systemInstruction"], json!({"parts": [{"text": "Be brief."}]}));
    assert_eq!(body["contents"], json!([{"role": "user", "parts": [{"text": "hello there"}]}]));
    assert_eq!(
        body["generationConfig"],
        json!({"maxOutputTokens": 64, "temperature": 1.8, "stopSequences": ["END"]}),
        "1.8 is inside Gemini's 0-2 and passes unchanged"
    );
}

#[tokio::test]
async fn a_stream_through_gemini_is_openai_chunks_ending_in_done() {
    let gw = Gateway::start().await;
    gw.script("primary", json!({"kind": "status", "status": 503})).await;
    gw.script(GEMINI_UPSTREAM, json!({"kind": "ok", "text": "one two three", "chunks": 3})).await;
    let mut body = hello(PRIMARY, &[GEMINI]);
    body["stream"] = json!(true);
    body["stream_options"] = json!({"include_usage": true});
    let s = gw.stream(body).await;
    assert_eq!(s.status, 200);
    assert_eq!(s.header("x-served-model").as_deref(), Some(GEMINI));
    assert_eq!(s.text(), "one two three");
    let chunks = s.chunks();
    for c in &chunks {
        assert_eq!(c["object"], "chat.completion.chunk", "{c}");
        assert_eq!(c["model"], GEMINI);
    }
    assert_eq!(chunks[0]["choices"][0]["delta"]["role"], "assistant");
    assert_eq!(
        attempts(&chunks[0]),
        [triple(PRIMARY, "failed", "server_error"), triple(GEMINI, "served", "")]
    );
    assert!(chunks.iter().any(|c| c["choices"][0]["finish_reason"] == "stop"));
    let usage = chunks.iter().find(|c| c["choices"] == json!([])).expect("the usage chunk");
    assert_eq!(usage["usage"]["completion_tokens"], 3);
    assert_eq!(s.frames.last().map(String::as_str), Some("[DONE]"));
    assert!(s.error_frame().is_none());
    let sent = gw.last_upstream_request(GEMINI_UPSTREAM).await;
    assert_eq!(sent["path"], "/v1beta/models/gemini-sim:streamGenerateContent");
}

#[tokio::test]
async fn a_stream_dropped_mid_way_ends_with_an_error_frame_not_done() {
    let gw = Gateway::start().await;
    gw.script(
        GEMINI_UPSTREAM,
        json!({"kind": "ok", "text": "one two three", "chunks": 3,
                                      "drop_after": 1}),
    )
    .await;
    let mut body = hello(GEMINI, &[]);
    body["stream"] = json!(true);
    let s = gw.stream(body).await;
    assert_eq!(s.status, 200);
    assert!(s.error_frame().is_some(), "{:?}", s.frames);
    assert!(!s.frames.iter().any(|f| f == "[DONE]"));
}

fn weather_request() -> Value {
    json!({"model": GEMINI, "tool_choice": "required",
           "messages": [{"role": "user", "content": "Weather in Paris?"}],
           "tools": [{"type": "function", "function": {"name": "get_weather",
               "description": "Current weather for a city",
               "parameters": {"type": "object", "additionalProperties": false,
                              "properties": {"location": {"type": "string"}},
                              "required": ["location"]}}}]})
}

#[tokio::test]
async fn a_tools_request_through_gemini_returns_tool_calls_with_json_string_arguments() {
    let gw = Gateway::start().await;
    let r = gw.chat(weather_request()).await;
    assert_eq!(r.status, 200, "{}", r.body);
    let v = r.json();
    let call = &v["choices"][0]["message"]["tool_calls"][0];
    assert_eq!(call["type"], "function");
    assert_eq!(call["function"]["name"], "get_weather");
    let arguments = call["function"]["arguments"].as_str().expect("arguments is a string");
    assert_eq!(serde_json::from_str::<Value>(arguments).unwrap(), json!({"location": "sim"}));
    let id = call["id"].as_str().unwrap();
    assert!(id.starts_with("call_"));
    assert_eq!(v["choices"][0]["finish_reason"], "tool_calls");
    let sent = gw.last_upstream_request(GEMINI_UPSTREAM).await;
    let declaration = &sent["body"]["tools"][0]["functionDeclarations"][0];
    assert_eq!(declaration["name"], "get_weather");
    assert_eq!(declaration["parameters"]["type"], "OBJECT");
    assert!(declaration["parameters"].get("additionalProperties").is_none());
    assert_eq!(sent["body"]["toolConfig"], json!({"functionCallingConfig": {"mode": "ANY"}}));

    // The tool result goes back as a functionResponse named after the call; Gemini answers.
    let mut next = weather_request();
    next["tool_choice"] = json!("auto");
    next["messages"] = json!([
        {"role": "user", "content": "Weather in Paris?"},
        {"role": "assistant", "content": null, "tool_calls": [call]},
        {"role": "tool", "tool_call_id": id, "content": "{\"temp_c\": 21}"}]);
    let r = gw.chat(next).await;
    assert_eq!(r.status, 200, "{}", r.body);
    assert_eq!(r.json()["choices"][0]["finish_reason"], "stop");
    let sent = gw.last_upstream_request(GEMINI_UPSTREAM).await;
    assert_eq!(
        sent["body"]["contents"][2],
        json!({"role": "user", "parts": [{"functionResponse": {"name": "get_weather",
                                                                "response": {"temp_c": 21}}}]})
    );

    // Streamed: one complete tool-call delta, then [DONE].
    let mut body = weather_request();
    body["stream"] = json!(true);
    let s = gw.stream(body).await;
    let delta = s
        .chunks()
        .iter()
        .map(|c| c["choices"][0]["delta"]["tool_calls"][0].clone())
        .find(|d| d["id"].is_string())
        .expect("a tool call delta");
    assert_eq!(delta["function"]["name"], "get_weather");
    let arguments = delta["function"]["arguments"].as_str().unwrap();
    assert_eq!(serde_json::from_str::<Value>(arguments).unwrap(), json!({"location": "sim"}));
    assert_eq!(s.frames.last().map(String::as_str), Some("[DONE]"));
}

#[tokio::test]
async fn a_gemini_429_fails_over_as_rate_limit_and_a_503_as_server_error() {
    let gw = Gateway::start().await;
    gw.script("secondary", json!({"kind": "ok", "text": "from the fallback"})).await;
    for (status, reason) in [(429, "rate_limit"), (503, "server_error")] {
        gw.script(GEMINI_UPSTREAM, json!({"kind": "status", "status": status})).await;
        let r = gw.chat(hello(GEMINI, &[SECONDARY])).await;
        assert_eq!(r.status, 200, "{}", r.body);
        let v = r.json();
        assert_eq!(v["choices"][0]["message"]["content"], "from the fallback");
        assert_eq!(
            attempts(&v),
            [triple(GEMINI, "failed", reason), triple(SECONDARY, "served", "")],
            "Gemini {status}"
        );
    }
    // Alone, every failure a rate limit: the node answers 429 (docs/http-api.md, "Errors").
    gw.script(GEMINI_UPSTREAM, json!({"kind": "status", "status": 429})).await;
    let r = gw.chat(hello(GEMINI, &[])).await;
    assert_eq!(r.status, 429, "{}", r.body);
    assert_eq!(r.json()["error"]["type"], "rate_limit_error");
}

#[tokio::test]
async fn a_gemini_in_band_error_before_content_fails_over() {
    let gw = Gateway::start().await;
    gw.script(GEMINI_UPSTREAM, json!({"kind": "stream_error", "after": 0})).await;
    gw.script("secondary", json!({"kind": "ok", "text": "from the fallback"})).await;
    let mut body = hello(GEMINI, &[SECONDARY]);
    body["stream"] = json!(true);
    let s = gw.stream(body).await;
    assert_eq!(s.status, 200);
    assert_eq!(s.text(), "from the fallback");
    assert_eq!(
        attempts(&s.report_chunk()),
        [triple(GEMINI, "failed", "server_error"), triple(SECONDARY, "served", "")]
    );
}

#[tokio::test]
async fn a_strict_schema_gemini_cannot_enforce_is_a_400_naming_the_model_before_any_call() {
    let gw = Gateway::start().await;
    let r = gw
        .chat(json!({
            "model": PRIMARY,
            "fallback_models": [GEMINI],
            "messages": [{"role": "user", "content": "hi"}],
            "response_format": {"type": "json_schema", "json_schema": {"name": "x", "strict": true, "schema": {
                "type": "object", "properties": {"a": {"$ref": "#/$defs/a"}}, "$defs": {"a": {"type": "string"}}
            }}}
        }))
        .await;
    assert_eq!(r.status, 400, "{}", r.body);
    let v = r.json();
    assert_eq!(v["error"]["param"], "fallback_models[0]");
    assert!(v["error"]["message"].as_str().unwrap().contains(GEMINI), "{v}");
    assert_eq!(gw.upstream_total().await, 0, "refused at validation time, not sent");
}
