//! Providers with a wire format of their own in an OpenAI-shaped chain, one suite run per
//! provider: the node translates the request to Anthropic's Messages API or to the Gemini
//! API and the answer back (docs/catalog.md, "Provider kinds"), streaming and tool calls
//! included, and each provider's overload and rate-limit answers fail over with the reason
//! they mean (docs/http-api.md, "Failover"): Anthropic's 529 `overloaded_error` as
//! `server_error`, Google's 429 RESOURCE_EXHAUSTED / 503 UNAVAILABLE as `rate_limit` /
//! `server_error`. Real processes on loopback; the simulator speaks Anthropic at
//! `/v1/messages` and Gemini at `/v1beta/models/{model}:generateContent` and
//! `:streamGenerateContent`.
//!
//! What both providers must do is written once (the functions below, run for each by
//! `native_suite!`); what only one does (its request mapping, its tool-call ids, Gemini's
//! tool results and schema refusals, the Python SDK over Anthropic) is in that provider's
//! own module.
#![allow(clippy::unwrap_used, clippy::expect_used)]

use serde_json::{Value, json};
use switchyard_e2e::gateway::*;

/// One provider kind under test, and what differs in what it is sent and answers.
struct Native {
    /// The catalog's model on this provider, and the upstream model the simulator scripts.
    model: &'static str,
    upstream: &'static str,
    /// The plain answer's text, and request fields beyond `hello`'s that the plain request
    /// sets, with the checks of what went upstream for it.
    greeting: &'static str,
    plain_fields: fn(&mut Value),
    plain_upstream: fn(&Value),
    plain_answer: fn(&Value),
    /// Checks of a stream's chunks and of what went upstream for it, beyond the shared ones.
    stream_extra: fn(&[Value], &Value),
    /// The `parameters` of the weather tool.
    tool_parameters: fn() -> Value,
    /// Checks of the tool call answered, of what went upstream for it, and of the streamed
    /// tool-call deltas.
    tool_call: fn(&Value, &Value),
    tool_deltas: fn(&[Value]),
    /// Upstream statuses and the failover reason each must be reported as.
    failovers: &'static [(u16, &'static str)],
}

const ANTHROPIC_NATIVE: Native = Native {
    model: ANTHROPIC,
    upstream: ANTHROPIC_UPSTREAM,
    greeting: "Hi from Claude.",
    plain_fields: |_| {},
    plain_upstream: |sent| {
        // What went upstream is an Anthropic Messages request.
        assert_eq!(sent["path"], "/v1/messages");
        assert_eq!(sent["headers"]["anthropic-version"], "2023-06-01");
        let body = &sent["body"];
        assert_eq!(body["model"], ANTHROPIC_UPSTREAM);
        assert_eq!(body["system"], "Be brief.");
        assert_eq!(body["messages"], json!([{"role": "user", "content": "hello there"}]));
        assert_eq!(body["max_tokens"], 512, "the catalog's max_tokens when the client sets none");
        assert_eq!(body["temperature"], 1.0, "capped into Anthropic's 0-1");
    },
    plain_answer: |_| {},
    stream_extra: |_, _| {},
    tool_parameters: || {
        json!({"type": "object", "properties": {"location": {"type": "string"}},
               "required": ["location"]})
    },
    tool_call: |call, sent| {
        assert!(call["id"].as_str().unwrap().starts_with("toolu_"));
        assert_eq!(sent["body"]["tools"][0]["input_schema"]["required"], json!(["location"]));
        assert_eq!(sent["body"]["tool_choice"], json!({"type": "any"}));
    },
    tool_deltas: |deltas| {
        // A tool-call delta with id and name, then the arguments in pieces.
        let start = deltas.iter().find(|d| d["id"].is_string()).expect("a tool call starts");
        assert_eq!(start["function"]["name"], "get_weather");
    },
    failovers: &[(529, "server_error")],
};

const GEMINI_NATIVE: Native = Native {
    model: GEMINI,
    upstream: GEMINI_UPSTREAM,
    greeting: "Hi from Gemini.",
    plain_fields: |body| {
        body["max_tokens"] = json!(64);
        body["stop"] = json!("END");
    },
    plain_upstream: |sent| {
        // What went upstream is a GenerateContentRequest.
        assert_eq!(sent["path"], "/v1beta/models/gemini-sim:generateContent");
        let body = &sent["body"];
        assert_eq!(body["systemInstruction"], json!({"parts": [{"text": "Be brief."}]}));
        assert_eq!(body["contents"], json!([{"role": "user", "parts": [{"text": "hello there"}]}]));
        assert_eq!(
            body["generationConfig"],
            json!({"maxOutputTokens": 64, "temperature": 1.8, "stopSequences": ["END"]}),
            "1.8 is inside Gemini's 0-2 and passes unchanged"
        );
    },
    plain_answer: |v| assert!(v["id"].as_str().unwrap().starts_with("chatcmpl-")),
    stream_extra: |chunks, sent| {
        // The first chunk already has content, so it carries the report.
        assert_eq!(
            attempts(&chunks[0]),
            [triple(PRIMARY, "failed", "server_error"), triple(GEMINI, "served", "")]
        );
        assert_eq!(sent["path"], "/v1beta/models/gemini-sim:streamGenerateContent");
    },
    tool_parameters: || {
        json!({"type": "object", "additionalProperties": false,
               "properties": {"location": {"type": "string"}},
               "required": ["location"]})
    },
    tool_call: |call, sent| {
        assert!(call["id"].as_str().unwrap().starts_with("call_"));
        let declaration = &sent["body"]["tools"][0]["functionDeclarations"][0];
        assert_eq!(declaration["name"], "get_weather");
        assert_eq!(declaration["parameters"]["type"], "OBJECT");
        assert!(declaration["parameters"].get("additionalProperties").is_none());
        assert_eq!(sent["body"]["toolConfig"], json!({"functionCallingConfig": {"mode": "ANY"}}));
    },
    tool_deltas: |deltas| {
        // One complete tool-call delta.
        let delta = deltas.iter().find(|d| d["id"].is_string()).expect("a tool call delta");
        assert_eq!(delta["function"]["name"], "get_weather");
        let arguments = delta["function"]["arguments"].as_str().unwrap();
        assert_eq!(serde_json::from_str::<Value>(arguments).unwrap(), json!({"location": "sim"}));
    },
    failovers: &[(429, "rate_limit"), (503, "server_error")],
};

fn hello(model: &str, fallbacks: &[&str]) -> Value {
    json!({"model": model, "fallback_models": fallbacks,
           "messages": [{"role": "system", "content": "Be brief."},
                        {"role": "user", "content": "hello there"}]})
}

fn weather_request(p: &Native) -> Value {
    json!({"model": p.model, "tool_choice": "required",
           "messages": [{"role": "user", "content": "Weather in Paris?"}],
           "tools": [{"type": "function", "function": {"name": "get_weather",
               "description": "Current weather for a city",
               "parameters": (p.tool_parameters)()}}]})
}

// === What every native provider does ===

async fn a_503_fails_over_to_it_and_it_answers_in_openai_shape(p: &Native) {
    let gw = Gateway::start().await;
    gw.script("primary", json!({"kind": "status", "status": 503})).await;
    gw.script(p.upstream, json!({"kind": "ok", "text": p.greeting})).await;
    let mut body = hello(PRIMARY, &[p.model]);
    body["temperature"] = json!(1.8);
    (p.plain_fields)(&mut body);
    let r = gw.chat(body).await;
    assert_eq!(r.status, 200, "{}", r.body);
    let v = r.json();
    assert_eq!(v["object"], "chat.completion");
    assert_eq!(v["model"], p.model);
    (p.plain_answer)(&v);
    assert_eq!(v["choices"][0]["message"]["role"], "assistant");
    assert_eq!(v["choices"][0]["message"]["content"], p.greeting);
    assert_eq!(v["choices"][0]["finish_reason"], "stop");
    // The simulator counts words: "Be brief." + "hello there" in, the greeting (3) out.
    assert_eq!(v["usage"]["prompt_tokens"], 4);
    assert_eq!(v["usage"]["completion_tokens"], 3);
    assert_eq!(v["usage"]["total_tokens"], 7);
    assert_eq!(
        attempts(&v),
        [triple(PRIMARY, "failed", "server_error"), triple(p.model, "served", "")]
    );
    (p.plain_upstream)(&gw.last_upstream_request(p.upstream).await);
}

async fn a_stream_through_it_is_openai_chunks_ending_in_done(p: &Native) {
    let gw = Gateway::start().await;
    gw.script("primary", json!({"kind": "status", "status": 503})).await;
    gw.script(p.upstream, json!({"kind": "ok", "text": "one two three", "chunks": 3})).await;
    let mut body = hello(PRIMARY, &[p.model]);
    body["stream"] = json!(true);
    body["stream_options"] = json!({"include_usage": true});
    let s = gw.stream(body).await;
    assert_eq!(s.status, 200);
    assert_eq!(s.header("x-served-model").as_deref(), Some(p.model));
    assert_eq!(s.text(), "one two three");
    let chunks = s.chunks();
    for c in &chunks {
        assert_eq!(c["object"], "chat.completion.chunk", "{c}");
        assert_eq!(c["model"], p.model);
    }
    assert_eq!(chunks[0]["choices"][0]["delta"]["role"], "assistant");
    assert_eq!(
        attempts(&s.report_chunk()),
        [triple(PRIMARY, "failed", "server_error"), triple(p.model, "served", "")]
    );
    assert!(chunks.iter().any(|c| c["choices"][0]["finish_reason"] == "stop"));
    let usage = chunks.iter().find(|c| c["choices"] == json!([])).expect("the usage chunk");
    assert_eq!(usage["usage"]["completion_tokens"], 3);
    assert_eq!(s.frames.last().map(String::as_str), Some("[DONE]"));
    assert!(s.error_frame().is_none());
    (p.stream_extra)(&chunks, &gw.last_upstream_request(p.upstream).await);
}

async fn a_tools_request_returns_tool_calls_with_json_string_arguments(p: &Native) {
    let gw = Gateway::start().await;
    let r = gw.chat(weather_request(p)).await;
    assert_eq!(r.status, 200, "{}", r.body);
    let v = r.json();
    let call = &v["choices"][0]["message"]["tool_calls"][0];
    assert_eq!(call["type"], "function");
    assert_eq!(call["function"]["name"], "get_weather");
    let arguments = call["function"]["arguments"].as_str().expect("arguments is a string");
    assert_eq!(serde_json::from_str::<Value>(arguments).unwrap(), json!({"location": "sim"}));
    assert_eq!(v["choices"][0]["finish_reason"], "tool_calls");
    (p.tool_call)(call, &gw.last_upstream_request(p.upstream).await);

    // Streamed: the arguments, whatever pieces they come in, then [DONE].
    let mut body = weather_request(p);
    body["stream"] = json!(true);
    let s = gw.stream(body).await;
    let deltas: Vec<Value> =
        s.chunks().iter().map(|c| c["choices"][0]["delta"]["tool_calls"][0].clone()).collect();
    (p.tool_deltas)(&deltas);
    let streamed: String =
        deltas.iter().filter_map(|d| d["function"]["arguments"].as_str()).collect();
    assert_eq!(serde_json::from_str::<Value>(&streamed).unwrap(), json!({"location": "sim"}));
    assert_eq!(s.frames.last().map(String::as_str), Some("[DONE]"));
}

async fn its_overload_and_rate_limit_answers_fail_over_with_their_reasons(p: &Native) {
    let gw = Gateway::start().await;
    gw.script("secondary", json!({"kind": "ok", "text": "from the fallback"})).await;
    for &(status, reason) in p.failovers {
        gw.script(p.upstream, json!({"kind": "status", "status": status})).await;
        let r = gw.chat(hello(p.model, &[SECONDARY])).await;
        assert_eq!(r.status, 200, "{}", r.body);
        let v = r.json();
        assert_eq!(v["choices"][0]["message"]["content"], "from the fallback");
        assert_eq!(
            attempts(&v),
            [triple(p.model, "failed", reason), triple(SECONDARY, "served", "")],
            "{} {status}",
            p.model
        );
    }
}

async fn an_in_band_error_before_content_fails_over_as_server_error(p: &Native) {
    let gw = Gateway::start().await;
    gw.script(p.upstream, json!({"kind": "stream_error", "after": 0})).await;
    gw.script("secondary", json!({"kind": "ok", "text": "from the fallback"})).await;
    let mut body = hello(p.model, &[SECONDARY]);
    body["stream"] = json!(true);
    let s = gw.stream(body).await;
    assert_eq!(s.status, 200);
    assert_eq!(s.text(), "from the fallback");
    assert_eq!(
        attempts(&s.report_chunk()),
        [triple(p.model, "failed", "server_error"), triple(SECONDARY, "served", "")]
    );
}

/// The shared cases as tests of one provider, in a module named after it.
macro_rules! native_suite {
    ($provider:ident, $native:expr) => {
        mod $provider {
            #[tokio::test]
            async fn a_503_fails_over_to_it_and_it_answers_in_openai_shape() {
                super::a_503_fails_over_to_it_and_it_answers_in_openai_shape(&$native).await;
            }

            #[tokio::test]
            async fn a_stream_through_it_is_openai_chunks_ending_in_done() {
                super::a_stream_through_it_is_openai_chunks_ending_in_done(&$native).await;
            }

            #[tokio::test]
            async fn a_tools_request_returns_tool_calls_with_json_string_arguments() {
                super::a_tools_request_returns_tool_calls_with_json_string_arguments(&$native)
                    .await;
            }

            #[tokio::test]
            async fn its_overload_and_rate_limit_answers_fail_over_with_their_reasons() {
                super::its_overload_and_rate_limit_answers_fail_over_with_their_reasons(&$native)
                    .await;
            }

            #[tokio::test]
            async fn an_in_band_error_before_content_fails_over_as_server_error() {
                super::an_in_band_error_before_content_fails_over_as_server_error(&$native).await;
            }
        }
    };
}

native_suite!(anthropic, super::ANTHROPIC_NATIVE);
native_suite!(gemini, super::GEMINI_NATIVE);

// === What only one of them does ===

mod anthropic_only {
    use super::*;

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
        gw.script(ANTHROPIC_UPSTREAM, json!({"kind": "ok", "text": "streamed fallback text"}))
            .await;
        gw.script(
            "tertiary",
            json!({"kind": "ok", "text": "alpha beta gamma delta epsilon", "chunks": 5,
                   "drop_after": 2}),
        )
        .await;
        let plain = sdk(&gw, "openai_sdk.py", &[PRIMARY, ANTHROPIC]).await;
        assert_eq!(plain.len(), 3, "{plain:?}");
        let streamed = sdk(&gw, "openai_sdk_stream.py", &[PRIMARY, ANTHROPIC, TERTIARY]).await;
        assert_eq!(streamed.len(), 2, "{streamed:?}");
    }
}

mod gemini_only {
    use super::*;

    #[tokio::test]
    async fn a_stream_dropped_mid_way_ends_with_an_error_frame_not_done() {
        let gw = Gateway::start().await;
        gw.script(
            GEMINI_UPSTREAM,
            json!({"kind": "ok", "text": "one two three", "chunks": 3, "drop_after": 1}),
        )
        .await;
        let mut body = hello(GEMINI, &[]);
        body["stream"] = json!(true);
        let s = gw.stream(body).await;
        assert_eq!(s.status, 200);
        assert!(s.error_frame().is_some(), "{:?}", s.frames);
        assert!(!s.frames.iter().any(|f| f == "[DONE]"));
    }

    #[tokio::test]
    async fn a_tool_result_goes_back_as_a_function_response_named_after_the_call() {
        let gw = Gateway::start().await;
        let r = gw.chat(weather_request(&GEMINI_NATIVE)).await;
        assert_eq!(r.status, 200, "{}", r.body);
        let call = r.json()["choices"][0]["message"]["tool_calls"][0].clone();
        let id = call["id"].as_str().unwrap().to_owned();
        // The tool result goes back as a functionResponse named after the call; Gemini answers.
        let mut next = weather_request(&GEMINI_NATIVE);
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
    }

    #[tokio::test]
    async fn alone_and_rate_limited_the_node_answers_429() {
        let gw = Gateway::start().await;
        // Alone, every failure a rate limit: the node answers 429 (docs/http-api.md, "Errors").
        gw.script(GEMINI_UPSTREAM, json!({"kind": "status", "status": 429})).await;
        let r = gw.chat(hello(GEMINI, &[])).await;
        assert_eq!(r.status, 429, "{}", r.body);
        assert_eq!(r.json()["error"]["type"], "rate_limit_error");
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
}
