//! Anthropic's Messages API (`POST {base_url}/v1/messages`, headers `x-api-key` and
//! `anthropic-version`), for requests in OpenAI's chat-completion shape: translated both ways
//! through the wire core (`switchyard_wire::messages`), which holds the format's rules.
//!
//! Request (Chat → core → Messages), with what the gateway adds for Anthropic:
//! - `max_tokens` is required by Anthropic: the request's `max_completion_tokens` (else its
//!   `max_tokens`), else the catalog model's `max_tokens`, else [`DEFAULT_MAX_TOKENS`];
//! - `temperature` is capped into Anthropic's 0–1 (1.8 is sent as 1.0; docs/catalog.md,
//!   "Provider kinds");
//! - `reasoning_effort` becomes `thinking` for a model with `reasoning` in the catalog, and
//!   is dropped for any other;
//! - `response_format`: Anthropic has no JSON mode. `json_schema` with `strict: true` is
//!   refused (a guarantee we cannot give); `json_object` and non-strict `json_schema`
//!   become an instruction appended to `system` (with the schema), the best-effort
//!   equivalent; clients that need a guarantee ask for `strict`.
//!
//! Refused by [`Adapter::body`], naming the field (the client would silently get less than
//! it asked for): `n` > 1, `logprobs: true`, `top_logprobs` > 0, strict `json_schema`, and
//! whatever the core refuses (tools that are not functions, content parts other than text
//! and images, the legacy `function` role, a call's arguments that are not a JSON object).
//! Dropped silently (sampling hints and bookkeeping with no Anthropic equivalent, which do
//! not change the answer's shape): `frequency_penalty`, `presence_penalty`, `seed`,
//! `logit_bias`, `service_tier`, `store`, `metadata`, `prediction`, `modalities`,
//! `stream_options` (usage is always reported), tools' `strict`, message `name`s.
//!
//! Response (Messages → core → Chat): a `chat.completion` with text joined as `content`,
//! tool calls with their input as a JSON string, finish reasons mapped, usage with cache
//! reads and writes counted as prompt tokens; thinking is not exposed (a chat completion has
//! no place for it). Streams: [`MessageDecoder`]. Errors: `{"type":"error","error":{"type",
//! "message"}}` → [`UpstreamError`] with the OpenAI error type as `kind` and Anthropic's own
//! type kept as `code` ([`parse_error`]).

use std::borrow::Cow;

use bytes::Bytes;
use http::{StatusCode, header};
use http_body_util::Full;
use serde::Deserialize;

use switchyard_catalog::{Model, Provider};
use switchyard_wire::messages;

use super::adapter::{Adapter, StreamDecoder};
use super::error::{CallError, UpstreamError};
use super::secret::Secret;
use super::sse::Frame;
use super::translated::{self, Chunks, ResponseFormat};
use super::unified::{Completion, StreamEvent};
use crate::request::{ChatRequest, Format};

mod error;
pub mod native;

use error::parse_error;

/// Output tokens asked for when neither the request nor the catalog sets a limit. Anthropic
/// requires one; 4096 is the largest every current Claude model accepts.
pub const DEFAULT_MAX_TOKENS: u32 = 4096;

/// The `anthropic-version` header when the provider sets no `api_version` (the only stable
/// version of the Messages API).
pub const DEFAULT_VERSION: &str = "2023-06-01";

pub struct Anthropic;

impl Adapter for Anthropic {
    fn body(&self, model: &Model, request: &ChatRequest<'_>) -> Result<Bytes, CallError> {
        if let Some(native) = request.native.as_ref().filter(|n| n.format == Format::Messages) {
            return Ok(Bytes::from(native::body(model, native)));
        }
        let core = translated::core(request)?;
        let instruction = refusals(request)?;
        // The core is the client's; what this provider gets besides (or without) is added to
        // a copy, made only when there is something to change.
        let drop_reasoning = core.reasoning.is_some() && !model.reasoning;
        let core = match (instruction, drop_reasoning) {
            (None, false) => Cow::Borrowed(core),
            (instruction, _) => {
                let mut core = core.clone();
                core.system.extend(instruction);
                if drop_reasoning {
                    core.reasoning = None;
                }
                Cow::Owned(core)
            }
        };
        let max_tokens = model.max_tokens.unwrap_or(DEFAULT_MAX_TOKENS);
        messages::request_body(&core, &model.upstream_model, max_tokens).map(Bytes::from).map_err(
            |refusal| match unsupported_media(request) {
                Some(error) if refusal.field.starts_with("messages[") => error,
                _ => translated::unsupported(&refusal),
            },
        )
    }

    fn translates(&self) -> bool {
        true
    }

    fn request(
        &self,
        provider: &Provider,
        _model: &Model,
        stream: bool,
        body: Bytes,
        credential: Option<&Secret>,
    ) -> Result<http::Request<Full<Bytes>>, CallError> {
        let base = provider.base_url.trim_end_matches('/');
        // The catalog convention is the bare host; tolerate a base URL that already ends in
        // `/v1` (the OpenAI habit) rather than calling `/v1/v1/messages`.
        let base = base.strip_suffix("/v1").unwrap_or(base);
        let mut builder = http::Request::post(format!("{base}/v1/messages"))
            .header(header::CONTENT_TYPE, "application/json")
            .header(header::ACCEPT, if stream { "text/event-stream" } else { "application/json" })
            .header(
                "anthropic-version",
                provider.api_version.as_deref().unwrap_or(DEFAULT_VERSION),
            );
        if let Some(secret) = credential {
            builder = builder.header("x-api-key", secret.expose());
        }
        builder.body(Full::new(body)).map_err(CallError::Build)
    }

    fn completion(&self, body: &[u8]) -> Result<Completion, CallError> {
        completion(body)
    }

    fn error(&self, status: StatusCode, body: &[u8]) -> UpstreamError {
        parse_error(status, body)
    }

    fn stream_decoder(&self, upstream_model: &str) -> Box<dyn StreamDecoder> {
        Box::new(MessageDecoder::new(upstream_model))
    }

    fn messages_completion(&self, body: &Bytes) -> Option<Result<Completion, CallError>> {
        Some(native::completion(body))
    }

    fn messages_decoder(&self) -> Option<Box<dyn StreamDecoder>> {
        Some(Box::<native::EventDecoder>::default())
    }
}

// === Request ===

/// Refuses what Anthropic has no equivalent for among the Chat fields the core leaves to
/// the adapter; returns the system instruction that stands in for a JSON mode, if any.
/// A content part Anthropic cannot take (audio, a file, a `gs://` image), named in Chat
/// terms as the gateway named it before such parts reached the core (the writer names core
/// parts, whose indexes are not the client's).
fn unsupported_media(request: &ChatRequest<'_>) -> Option<CallError> {
    let (at, kind) = translated::chat_part(request, |part| match part.kind.as_str() {
        "input_audio" | "file" => Some("type"),
        _ => part.url().filter(|(_, url)| url.starts_with("gs://")).map(|(field, _)| field),
    })?;
    let what = if at.ends_with(".type") {
        format!("the provider Anthropic takes `text` and `image_url` parts, not `{kind}`")
    } else {
        "image URLs must be data: or http(s): URLs".to_owned()
    };
    Some(CallError::Unsupported { message: format!("`{at}`: {what}"), param: Some(at) })
}

fn refusals(request: &ChatRequest<'_>) -> Result<Option<String>, CallError> {
    let refuse = |param: &str, what: String| CallError::Unsupported {
        message: format!("`{param}`: {what}"),
        param: Some(param.to_owned()),
    };
    if let Some(n) = translated::field::<u64>(request, "n")?
        && n > 1
    {
        return Err(refuse(
            "n",
            format!(
                "the provider Anthropic returns one choice per request; {n} choices are not supported by this model."
            ),
        ));
    }
    for (name, asked) in [
        ("logprobs", translated::field::<bool>(request, "logprobs")? == Some(true)),
        ("top_logprobs", translated::field::<u64>(request, "top_logprobs")?.is_some_and(|n| n > 0)),
    ] {
        if asked {
            return Err(refuse(
                name,
                "the provider Anthropic does not return log probabilities; logprobs are not supported by this model.".into(),
            ));
        }
    }
    let Some(format) = translated::field::<ResponseFormat<'_>>(request, "response_format")? else {
        return Ok(None);
    };
    if format.strict() {
        return Err(refuse(
            "response_format.json_schema.strict",
            "the provider Anthropic has no strict structured-output mode; a json_schema with `strict: true` is not supported by this model (send `strict: false` for a best-effort JSON answer).".into(),
        ));
    }
    Ok(json_instruction(&format))
}

/// The system instruction that stands in for OpenAI's JSON modes.
fn json_instruction(format: &ResponseFormat<'_>) -> Option<String> {
    match format.kind.as_ref() {
        "json_object" => Some(
            "Respond with a single valid JSON object and nothing else: no prose, no code fences."
                .into(),
        ),
        "json_schema" => {
            let spec = format.json_schema.as_ref();
            let schema = spec.and_then(|s| s.schema).map_or("{}", |s| s.get());
            let named = spec
                .and_then(|s| s.name.as_deref())
                .map(|n| format!(" (`{n}`)"))
                .unwrap_or_default();
            Some(format!(
                "Respond with a single valid JSON value and nothing else (no prose, no code fences) that conforms to this JSON Schema{named}: {schema}"
            ))
        }
        _ => None,
    }
}

// === Response ===

fn completion(body: &[u8]) -> Result<Completion, CallError> {
    match messages::parse_response(body) {
        Ok(response) => translated::completion(&response),
        // An error object in a 200 (seen from proxies in front of Anthropic) is that error.
        Err(refusal) if refusal.field == "error" => Err(error::in_ok(body)),
        Err(refusal) => Err(CallError::Malformed(refusal.message)),
    }
}

// === Streaming ===

/// Anthropic's stream events as OpenAI chunks: read into core events by the wire's
/// decoder (which keeps which content blocks are tool calls), written as chunks by
/// [`Chunks`]. `message_stop` ends the stream with the usage chunk.
pub struct MessageDecoder {
    decoder: messages::Decoder,
    chunks: Chunks,
}

impl MessageDecoder {
    pub fn new(upstream_model: &str) -> Self {
        Self { decoder: messages::Decoder::new(), chunks: Chunks::new(upstream_model) }
    }
}

/// The event's name: the frame's `event:`, else the `type` its data names (both are sent;
/// proxies have dropped the first).
fn event_name(frame: &Frame) -> Result<Cow<'_, str>, String> {
    if let Some(event) = &frame.event {
        return Ok(Cow::Borrowed(event));
    }
    #[derive(Deserialize)]
    struct Typed<'a> {
        #[serde(rename = "type", borrow)]
        kind: Option<Cow<'a, str>>,
    }
    let typed: Typed<'_> = serde_json::from_str(frame.data.trim())
        .map_err(|e| format!("an event is not JSON: {e}"))?;
    Ok(typed.kind.unwrap_or_default())
}

impl StreamDecoder for MessageDecoder {
    fn decode(&mut self, frame: &Frame) -> Result<Vec<StreamEvent>, String> {
        let event = event_name(frame)?;
        match event.as_ref() {
            "message_stop" => return Ok(vec![self.chunks.usage_chunk()?, StreamEvent::Done]),
            "error" => {
                return Ok(vec![StreamEvent::Error(parse_error(
                    StatusCode::OK,
                    frame.data.as_bytes(),
                ))]);
            }
            _ => {}
        }
        let events = self
            .decoder
            .decode(&event, frame.data.trim().as_bytes())
            .map_err(|refusal| refusal.message)?;
        let mut out = Vec::with_capacity(events.len());
        for event in events {
            self.chunks.push(event, &mut out)?;
        }
        Ok(out)
    }

    /// `message_stop` did not come after the stop reason: what it brings, the usage chunk
    /// and the end.
    fn close(&mut self) -> Vec<StreamEvent> {
        self.chunks.usage_chunk().into_iter().chain([StreamEvent::Done]).collect()
    }
}

#[cfg(test)]
mod tests {
    use serde_json::value::RawValue;
    use serde_json::{Value, json};

    use super::*;
    use crate::failure::{Failure, Verdict, classify};
    use crate::providers::unified::Usage;
    use switchyard_catalog::FailoverReason;

    /// Token counts near `u64::MAX` (as a fuzzer or a broken upstream sends them) saturate
    /// instead of panicking in debug builds and wrapping in release ones.
    #[test]
    fn huge_usage_counts_saturate() {
        let max = u64::MAX;
        let body = json!({
            "id": "msg", "type": "message", "role": "assistant", "model": "claude",
            "content": [{"type": "text", "text": "hi"}], "stop_reason": "end_turn",
            "usage": {"input_tokens": max, "output_tokens": max,
                      "cache_creation_input_tokens": max, "cache_read_input_tokens": 1},
        });
        let completion = Anthropic.completion(body.to_string().as_bytes()).unwrap();
        assert_eq!(completion.usage, Usage { prompt_tokens: max, completion_tokens: max });
        let out = completion.to_json(&RawValue::from_string("\"m\"".into()).unwrap(), None);
        let v: Value = serde_json::from_slice(&out).unwrap();
        assert_eq!(v["usage"]["total_tokens"], json!(max));

        let mut decoder = MessageDecoder::new("claude");
        let start = json!({"type": "message_start", "message": {"id": "m", "usage":
            {"input_tokens": max, "cache_read_input_tokens": max, "output_tokens": max}}});
        let frame = |data: &Value| Frame { event: None, data: data.to_string() };
        decoder.decode(&frame(&start)).unwrap();
        let delta = json!({"type": "message_delta", "delta": {"stop_reason": "end_turn"},
            "usage": {"output_tokens": max}});
        decoder.decode(&frame(&delta)).unwrap();
        let events = decoder.decode(&frame(&json!({"type": "message_stop"}))).unwrap();
        let usage = events.iter().find_map(|e| match e {
            StreamEvent::Chunk { usage: Some(u), .. } => Some(*u),
            _ => None,
        });
        assert_eq!(usage, Some(Usage { prompt_tokens: max, completion_tokens: max }));
    }

    fn provider(api_version: Option<&str>) -> Provider {
        serde_json::from_value(json!({
            "name": "anthropic", "kind": "anthropic", "base_url": "https://api.anthropic.com/",
            "api_version": api_version,
        }))
        .unwrap()
    }

    fn model(max_tokens: Option<u32>) -> Model {
        serde_json::from_value(json!({
            "name": "anthropic/claude", "provider": "anthropic",
            "upstream_model": "claude-sonnet-4-20250514", "max_tokens": max_tokens,
        }))
        .unwrap()
    }

    fn req(body: Value) -> ChatRequest<'static> {
        ChatRequest::parse(Box::leak(body.to_string().into_bytes().into_boxed_slice())).unwrap()
    }

    fn sent(body: Value) -> Value {
        sent_with(body, None)
    }

    fn sent_with(body: Value, max_tokens: Option<u32>) -> Value {
        let built = Anthropic.build(&provider(None), &model(max_tokens), &req(body), None).unwrap();
        let bytes = futures_util::FutureExt::now_or_never(http_body_util::BodyExt::collect(
            built.into_body(),
        ))
        .unwrap()
        .unwrap()
        .to_bytes();
        serde_json::from_slice(&bytes).unwrap()
    }

    #[test]
    fn requests_go_to_v1_messages_with_the_anthropic_headers() {
        let secret = Secret::new("sk-ant-1");
        let body =
            json!({"model": "anthropic/claude", "messages": [{"role": "user", "content": "hi"}]});
        let built = Anthropic
            .build(&provider(None), &model(None), &req(body.clone()), Some(&secret))
            .unwrap();
        assert_eq!(built.uri().to_string(), "https://api.anthropic.com/v1/messages");
        assert_eq!(built.headers()["x-api-key"], "sk-ant-1");
        assert_eq!(built.headers()["anthropic-version"], DEFAULT_VERSION);
        assert_eq!(built.headers()[header::CONTENT_TYPE], "application/json");
        assert!(built.headers().get(header::AUTHORIZATION).is_none());
        let built =
            Anthropic.build(&provider(Some("2024-01-01")), &model(None), &req(body), None).unwrap();
        assert_eq!(built.headers()["anthropic-version"], "2024-01-01");
    }

    #[test]
    fn system_and_developer_messages_become_the_top_level_system() {
        let one = sent(json!({"messages": [
            {"role": "system", "content": "You are terse."},
            {"role": "user", "content": "hi"}]}));
        assert_eq!(one["system"], "You are terse.");
        assert_eq!(one["messages"], json!([{"role": "user", "content": "hi"}]));
        assert_eq!(one["model"], "claude-sonnet-4-20250514");
        let two = sent(json!({"messages": [
            {"role": "developer", "content": [{"type": "text", "text": "Rule one."}]},
            {"role": "user", "content": "hi"},
            {"role": "system", "content": "Rule two."}]}));
        assert_eq!(
            two["system"],
            json!([{"type": "text", "text": "Rule one."}, {"type": "text", "text": "Rule two."}])
        );
        assert_eq!(two["messages"].as_array().unwrap().len(), 1);
    }

    #[test]
    fn max_tokens_comes_from_the_request_then_the_catalog_then_the_default() {
        let msgs = json!([{"role": "user", "content": "hi"}]);
        assert_eq!(sent(json!({"messages": msgs}))["max_tokens"], DEFAULT_MAX_TOKENS);
        assert_eq!(sent_with(json!({"messages": msgs}), Some(1000))["max_tokens"], 1000);
        assert_eq!(
            sent_with(json!({"messages": msgs, "max_tokens": 50}), Some(1000))["max_tokens"],
            50
        );
        assert_eq!(
            sent_with(json!({"messages": msgs, "max_completion_tokens": 70}), Some(1000))["max_tokens"],
            70
        );
    }

    #[test]
    fn temperature_is_capped_into_anthropics_range_and_stop_becomes_stop_sequences() {
        let msgs = json!([{"role": "user", "content": "hi"}]);
        let b = sent(json!({"messages": msgs, "temperature": 1.8, "top_p": 0.9, "stop": "END"}));
        assert_eq!(b["temperature"], 1.0);
        assert_eq!(b["top_p"], 0.9);
        assert_eq!(b["stop_sequences"], json!(["END"]));
        let b = sent(
            json!({"messages": msgs, "temperature": 0.3, "stop": ["a", "b"], "seed": 4, "presence_penalty": 1}),
        );
        assert_eq!(b["temperature"], 0.3);
        assert_eq!(b["stop_sequences"], json!(["a", "b"]));
        assert!(b.get("seed").is_none() && b.get("presence_penalty").is_none());
    }

    #[test]
    fn tools_and_tool_choice_are_translated() {
        // The tool is the get_weather example of Anthropic's tool-use docs and
        // anthropic-sdk-python examples/tools_stream.py, written the OpenAI way.
        let params = json!({"type": "object", "properties": {"location": {"type": "string", "description": "The city and state, e.g. San Francisco, CA"}}, "required": ["location"]});
        let tools = json!([{"type": "function", "function": {"name": "get_weather", "description": "Get the weather at a specific location", "parameters": params}},
                           {"type": "function", "function": {"name": "now"}}]);
        let msgs = json!([{"role": "user", "content": "What is the weather in SF?"}]);
        let b = sent(json!({"messages": msgs, "tools": tools, "tool_choice": "required"}));
        assert_eq!(
            b["tools"],
            json!([{"name": "get_weather", "description": "Get the weather at a specific location", "input_schema": params},
                   {"name": "now", "input_schema": {"type": "object", "properties": {}}}])
        );
        assert_eq!(b["tool_choice"], json!({"type": "any"}));
        let choice = |c: Value| {
            sent(json!({"messages": msgs, "tools": tools, "tool_choice": c}))["tool_choice"].clone()
        };
        assert_eq!(choice(json!("auto")), json!({"type": "auto"}));
        assert_eq!(choice(json!("none")), json!({"type": "none"}));
        assert_eq!(
            choice(json!({"type": "function", "function": {"name": "get_weather"}})),
            json!({"type": "tool", "name": "get_weather"})
        );
        let b = sent(json!({"messages": msgs, "tools": tools, "parallel_tool_calls": false}));
        assert_eq!(b["tool_choice"], json!({"type": "auto", "disable_parallel_tool_use": true}));
    }

    #[test]
    fn tool_calls_and_tool_results_become_tool_use_and_merged_tool_result_blocks() {
        let b = sent(json!({"messages": [
            {"role": "user", "content": "Weather in Paris and Rome?"},
            {"role": "assistant", "content": null, "tool_calls": [
                {"id": "toolu_01A", "type": "function", "function": {"name": "get_weather", "arguments": "{\"location\":\"Paris\"}"}},
                {"id": "toolu_01B", "type": "function", "function": {"name": "get_weather", "arguments": "{\"location\":\"Rome\"}"}}]},
            {"role": "tool", "tool_call_id": "toolu_01A", "content": "15 C"},
            {"role": "tool", "tool_call_id": "toolu_01B", "content": [{"type": "text", "text": "21 C"}]},
            {"role": "user", "content": "Thanks, which is warmer?"}]}));
        assert_eq!(
            b["messages"],
            json!([
                {"role": "user", "content": "Weather in Paris and Rome?"},
                {"role": "assistant", "content": [
                    {"type": "tool_use", "id": "toolu_01A", "name": "get_weather", "input": {"location": "Paris"}},
                    {"type": "tool_use", "id": "toolu_01B", "name": "get_weather", "input": {"location": "Rome"}}]},
                {"role": "user", "content": [
                    {"type": "tool_result", "tool_use_id": "toolu_01A", "content": "15 C"},
                    {"type": "tool_result", "tool_use_id": "toolu_01B", "content": "21 C"},
                    {"type": "text", "text": "Thanks, which is warmer?"}]}])
        );
    }

    #[test]
    fn image_parts_become_base64_or_url_sources() {
        let b = sent(json!({"messages": [{"role": "user", "content": [
            {"type": "text", "text": "What is in these?"},
            {"type": "image_url", "image_url": {"url": "data:image/png;base64,iVBORw0KGgo="}},
            {"type": "image_url", "image_url": {"url": "https://upload.wikimedia.org/a.jpg", "detail": "high"}}]}]}));
        assert_eq!(
            b["messages"][0]["content"],
            json!([
                {"type": "text", "text": "What is in these?"},
                {"type": "image", "source": {"type": "base64", "media_type": "image/png", "data": "iVBORw0KGgo="}},
                {"type": "image", "source": {"type": "url", "url": "https://upload.wikimedia.org/a.jpg"}}])
        );
    }

    #[test]
    fn json_modes_become_a_system_instruction_and_strict_schemas_are_refused() {
        let msgs =
            json!([{"role": "system", "content": "Be exact."}, {"role": "user", "content": "hi"}]);
        let b = sent(json!({"messages": msgs, "response_format": {"type": "json_object"}}));
        assert_eq!(b["system"][0]["text"], "Be exact.");
        assert!(b["system"][1]["text"].as_str().unwrap().contains("valid JSON object"));
        assert!(b.get("response_format").is_none());
        let schema = json!({"type": "object", "properties": {"answer": {"type": "string"}}});
        let b = sent(json!({"messages": [{"role": "user", "content": "hi"}],
            "response_format": {"type": "json_schema", "json_schema": {"name": "reply", "schema": schema, "strict": false}}}));
        let system = b["system"].as_str().unwrap();
        assert!(system.contains("`reply`") && system.contains(&schema.to_string()), "{system}");

        let strict = req(json!({"messages": msgs,
            "response_format": {"type": "json_schema", "json_schema": {"name": "reply", "schema": schema, "strict": true}}}));
        let refused = Anthropic.body(&model(None), &strict).unwrap_err();
        let message = refused.to_string();
        assert!(message.contains("Anthropic") && message.contains("strict"), "{message}");
        // The refusal is the client's 400, before any network call.
        assert!(
            matches!(classify(Failure::Call(refused)), Verdict::Stop { status, .. } if status == StatusCode::BAD_REQUEST)
        );
    }

    #[test]
    fn what_anthropic_cannot_honour_is_refused_by_name() {
        let msgs = json!([{"role": "user", "content": "hi"}]);
        let refused = |extra: Value| {
            let mut body = json!({"messages": msgs});
            for (k, v) in extra.as_object().unwrap() {
                body[k] = v.clone();
            }
            Anthropic.body(&model(None), &req(body)).err().map(|e| e.to_string())
        };
        assert!(refused(json!({"n": 2})).unwrap().contains("`n`"));
        assert!(refused(json!({"logprobs": true})).unwrap().contains("logprobs"));
        assert!(
            refused(json!({"tools": [{"type": "custom", "custom": {"name": "x"}}]}))
                .unwrap()
                .contains("custom")
        );
        assert!(refused(json!({"messages": [{"role": "user", "content": [{"type": "input_audio", "input_audio": {}}]}]})).is_some());
        // Audio, files and gs:// images reach the core (Gemini takes them) and are refused
        // here in Chat terms, at the client's indexes (the system message counts).
        for (part, field) in [
            (
                json!({"type": "input_audio", "input_audio": {"data": "UklG", "format": "wav"}}),
                "messages[1].content[1].type",
            ),
            (
                json!({"type": "file", "file": {"file_data": "data:application/pdf;base64,JVBE"}}),
                "messages[1].content[1].type",
            ),
            (
                json!({"type": "image_url", "image_url": {"url": "gs://bucket/a.png"}}),
                "messages[1].content[1].image_url.url",
            ),
        ] {
            let body = json!({"messages": [{"role": "system", "content": "s"},
                {"role": "user", "content": [{"type": "text", "text": "look"}, part]}]});
            match Anthropic.body(&model(None), &req(body)) {
                Err(CallError::Unsupported { param, message }) => {
                    assert_eq!(param.as_deref(), Some(field), "{message}");
                    assert!(message.starts_with(&format!("`{field}`")), "{message}");
                }
                other => panic!("expected a refusal of {field}, got {other:?}"),
            }
        }
        assert_eq!(refused(json!({"n": 1, "logprobs": false, "seed": 1, "user": "u"})), None);
        assert_eq!(
            sent(json!({"messages": msgs, "user": "u-1"}))["metadata"],
            json!({"user_id": "u-1"})
        );
    }

    #[test]
    fn a_refusal_names_the_field_in_chat_terms() {
        let body = json!({"messages": [
            {"role": "user", "content": "hi"},
            {"role": "assistant", "tool_calls": [{"id": "t1", "type": "function",
                "function": {"name": "get", "arguments": "[1]"}}]}]});
        let Err(CallError::Unsupported { message, param }) =
            Anthropic.body(&model(None), &req(body))
        else {
            panic!("not refused")
        };
        assert_eq!(param.as_deref(), Some("messages[1].tool_calls[0].function.arguments"));
        assert!(message.contains("`messages[1].tool_calls[0].function.arguments`"), "{message}");
        let Err(CallError::Unsupported { param, .. }) = Anthropic.body(
            &model(None),
            &req(json!({"messages": [{"role": "user", "content": "hi"}], "n": 3})),
        ) else {
            panic!("not refused")
        };
        assert_eq!(param.as_deref(), Some("n"));
    }

    #[test]
    fn reasoning_effort_becomes_thinking_only_for_a_reasoning_model() {
        let body = json!({"messages": [{"role": "user", "content": "hi"}],
            "reasoning_effort": "low", "temperature": 0.5, "max_tokens": 8000});
        let plain = sent(body.clone());
        assert!(plain.get("thinking").is_none(), "{plain}");
        assert_eq!(plain["temperature"], 0.5);
        let mut reasoning = model(None);
        reasoning.reasoning = true;
        let built = Anthropic.body(&reasoning, &req(body)).unwrap();
        let b: Value = serde_json::from_slice(&built).unwrap();
        assert_eq!(b["thinking"], json!({"type": "enabled", "budget_tokens": 2048}));
        // Anthropic takes no temperature with thinking on.
        assert!(b.get("temperature").is_none(), "{b}");
    }

    #[test]
    fn a_text_message_becomes_a_chat_completion() {
        // The example response of Anthropic's "Handling stop reasons" guide
        // (https://platform.claude.com/docs/en/build-with-claude/handling-stop-reasons), with
        // the model field every Messages API response carries.
        let body = br#"{"id":"msg_01234","type":"message","role":"assistant","model":"claude-sonnet-4-20250514","content":[{"type":"text","text":"Here's the answer to your question..."}],"stop_reason":"end_turn","stop_sequence":null,"usage":{"input_tokens":100,"output_tokens":50}}"#;
        let c = Anthropic.completion(body).unwrap();
        let v: Value = serde_json::to_value(&c.fields).unwrap();
        assert_eq!(v["object"], "chat.completion");
        assert_eq!(v["id"], "msg_01234");
        assert_eq!(v["choices"][0]["message"]["role"], "assistant");
        assert_eq!(v["choices"][0]["message"]["content"], "Here's the answer to your question...");
        assert!(v["choices"][0]["message"].get("tool_calls").is_none());
        assert_eq!(v["choices"][0]["finish_reason"], "stop");
        assert_eq!(v["usage"]["prompt_tokens"], 100);
        assert_eq!(v["usage"]["completion_tokens"], 50);
        assert_eq!(v["usage"]["total_tokens"], 150);
        assert_eq!(c.usage, Usage { prompt_tokens: 100, completion_tokens: 50 });
    }

    #[test]
    fn a_tool_use_message_becomes_tool_calls_with_json_string_arguments() {
        // The message anthropic-sdk-python accumulates from its recorded stream
        // tests/lib/streaming/fixtures/tool_use_response.txt (ids, text, input and usage
        // as recorded there).
        let body = br#"{"id":"msg_019Q1hrJbZG26Fb9BQhrkHEr","type":"message","role":"assistant","model":"claude-sonnet-4-20250514","content":[{"type":"text","text":"I'll check the current weather in Paris for you."},{"type":"tool_use","id":"toolu_01NRLabsLyVHZPKxbKvkfSMn","name":"get_weather","caller":{"type":"direct"},"input":{"location":"Paris"}}],"stop_reason":"tool_use","stop_sequence":null,"usage":{"input_tokens":377,"cache_creation_input_tokens":0,"cache_read_input_tokens":0,"output_tokens":65,"service_tier":"standard"}}"#;
        let c = Anthropic.completion(body).unwrap();
        let v: Value = serde_json::to_value(&c.fields).unwrap();
        let message = &v["choices"][0]["message"];
        assert_eq!(message["content"], "I'll check the current weather in Paris for you.");
        assert_eq!(
            message["tool_calls"],
            json!([{"id": "toolu_01NRLabsLyVHZPKxbKvkfSMn", "type": "function",
                    "function": {"name": "get_weather", "arguments": "{\"location\":\"Paris\"}"}}])
        );
        assert_eq!(v["choices"][0]["finish_reason"], "tool_calls");
        assert_eq!(c.usage, Usage { prompt_tokens: 377, completion_tokens: 65 });
    }

    #[test]
    fn stop_reasons_map_to_finish_reasons() {
        let finish = |stop_reason: &str| {
            let body = json!({"id": "msg", "type": "message", "role": "assistant", "model": "claude",
                "content": [{"type": "text", "text": "hi"}], "stop_reason": stop_reason,
                "usage": {"input_tokens": 1, "output_tokens": 1}});
            let c = Anthropic.completion(body.to_string().as_bytes()).unwrap();
            c.finish_reasons()[0].clone()
        };
        assert_eq!(finish("end_turn"), "stop");
        assert_eq!(finish("stop_sequence"), "stop");
        assert_eq!(finish("max_tokens"), "length");
        assert_eq!(finish("tool_use"), "tool_calls");
        assert_eq!(finish("refusal"), "content_filter");
    }

    /// Frames of a recorded SSE body, as the node's parser yields them.
    fn frames(text: &str) -> Vec<Frame> {
        let mut parser = super::super::sse::Parser::default();
        parser.push(text.as_bytes()).unwrap();
        parser.push(b"\n\n").unwrap();
        std::iter::from_fn(|| parser.next_frame().unwrap()).collect()
    }

    fn decode_all(text: &str) -> Vec<StreamEvent> {
        let mut decoder = MessageDecoder::new("claude-x");
        frames(text).iter().flat_map(|f| decoder.decode(f).unwrap()).collect()
    }

    fn chunk_json(event: &StreamEvent) -> Value {
        match event {
            StreamEvent::Chunk { fields, .. } => serde_json::to_value(fields).unwrap(),
            other => panic!("not a chunk: {other:?}"),
        }
    }

    // anthropic-sdk-python tests/lib/streaming/fixtures/basic_response.txt, verbatim.
    const BASIC_STREAM: &str = "event: message_start\ndata: {\"type\":\"message_start\",\"message\":{\"id\":\"msg_4QpJur2dWWDjF6C758FbBw5vm12BaVipnK\",\"type\":\"message\",\"role\":\"assistant\",\"content\":[],\"model\":\"claude-3-opus-latest\",\"stop_reason\":null,\"stop_sequence\":null,\"usage\":{\"input_tokens\":11,\"output_tokens\":1}}}\n\nevent: content_block_start\ndata: {\"type\":\"content_block_start\",\"index\":0,\"content_block\":{\"type\":\"text\",\"text\":\"\"}}\n\nevent: ping\ndata: {\"type\": \"ping\"}\n\nevent: content_block_delta\ndata: {\"type\":\"content_block_delta\",\"index\":0,\"delta\":{\"type\":\"text_delta\",\"text\":\"Hello\"}}\n\nevent: content_block_delta\ndata: {\"type\":\"content_block_delta\",\"index\":0,\"delta\":{\"type\":\"text_delta\",\"text\":\" there\"}}\n\nevent: content_block_delta\ndata: {\"type\":\"content_block_delta\",\"index\":0,\"delta\":{\"type\":\"text_delta\",\"text\":\"!\"}}\n\nevent: content_block_stop\ndata: {\"type\":\"content_block_stop\",\"index\":0}\n\nevent: message_delta\ndata: {\"type\":\"message_delta\",\"delta\":{\"stop_reason\":\"end_turn\",\"stop_sequence\":null},\"usage\":{\"output_tokens\":6}}\n\nevent: message_stop\ndata: {\"type\":\"message_stop\"}";

    // anthropic-sdk-python tests/lib/streaming/fixtures/tool_use_response.txt, verbatim.
    const TOOL_STREAM: &str = "event: message_start\ndata: {\"type\":\"message_start\",\"message\":{\"id\":\"msg_019Q1hrJbZG26Fb9BQhrkHEr\",\"type\":\"message\",\"role\":\"assistant\",\"model\":\"claude-sonnet-4-20250514\",\"content\":[],\"stop_reason\":null,\"stop_sequence\":null,\"usage\":{\"input_tokens\":377,\"cache_creation_input_tokens\":0,\"cache_read_input_tokens\":0,\"output_tokens\":1,\"service_tier\":\"standard\"}}}\n\nevent: content_block_start\ndata: {\"type\":\"content_block_start\",\"index\":0,\"content_block\":{\"type\":\"text\",\"text\":\"\"}}\n\nevent: ping\ndata: {\"type\": \"ping\"}\n\nevent: content_block_delta\ndata: {\"type\":\"content_block_delta\",\"index\":0,\"delta\":{\"type\":\"text_delta\",\"text\":\"I\"}}\n\nevent: content_block_delta\ndata: {\"type\":\"content_block_delta\",\"index\":0,\"delta\":{\"type\":\"text_delta\",\"text\":\"'ll check the current weather in Paris for you.\"}}\n\nevent: content_block_stop\ndata: {\"type\":\"content_block_stop\",\"index\":0}\n\nevent: content_block_start\ndata: {\"type\":\"content_block_start\",\"index\":1,\"content_block\":{\"type\":\"tool_use\",\"id\":\"toolu_01NRLabsLyVHZPKxbKvkfSMn\",\"name\":\"get_weather\",\"caller\":{\"type\":\"direct\"},\"input\":{}}}\n\nevent: content_block_delta\ndata: {\"type\":\"content_block_delta\",\"index\":1,\"delta\":{\"type\":\"input_json_delta\",\"partial_json\":\"\"}}\n\nevent: content_block_delta\ndata: {\"type\":\"content_block_delta\",\"index\":1,\"delta\":{\"type\":\"input_json_delta\",\"partial_json\":\"{\\\"locati\"}}\n\nevent: content_block_delta\ndata: {\"type\":\"content_block_delta\",\"index\":1,\"delta\":{\"type\":\"input_json_delta\",\"partial_json\":\"on\\\": \\\"P\"}}\n\nevent: content_block_delta\ndata: {\"type\":\"content_block_delta\",\"index\":1,\"delta\":{\"type\":\"input_json_delta\",\"partial_json\":\"ar\"}}\n\nevent: content_block_delta\ndata: {\"type\":\"content_block_delta\",\"index\":1,\"delta\":{\"type\":\"input_json_delta\",\"partial_json\":\"is\\\"}\"}}\n\nevent: content_block_stop\ndata: {\"type\":\"content_block_stop\",\"index\":1}\n\nevent: message_delta\ndata: {\"type\":\"message_delta\",\"delta\":{\"stop_reason\":\"tool_use\",\"stop_sequence\":null},\"usage\":{\"output_tokens\":65}}\n\nevent: message_stop\ndata: {\"type\":\"message_stop\"}";

    #[test]
    fn a_text_stream_becomes_openai_chunks_ending_in_usage_and_done() {
        let events = decode_all(BASIC_STREAM);
        // role, 3 text deltas, finish, usage, done (ping and block start/stop yield nothing).
        assert_eq!(events.len(), 7, "{events:?}");
        let first = chunk_json(&events[0]);
        assert_eq!(first["object"], "chat.completion.chunk");
        assert_eq!(first["id"], "msg_4QpJur2dWWDjF6C758FbBw5vm12BaVipnK");
        assert_eq!(first["choices"][0]["delta"], json!({"role": "assistant", "content": ""}));
        assert!(matches!(events[0], StreamEvent::Chunk { commits: false, .. }));
        let text: String = events[1..4]
            .iter()
            .map(|e| chunk_json(e)["choices"][0]["delta"]["content"].as_str().unwrap().to_owned())
            .collect();
        assert_eq!(text, "Hello there!");
        assert!(matches!(events[1], StreamEvent::Chunk { commits: true, .. }));
        let finish = chunk_json(&events[4]);
        assert_eq!(finish["choices"][0]["finish_reason"], "stop");
        assert_eq!(finish["choices"][0]["delta"], json!({}));
        match &events[5] {
            StreamEvent::Chunk { fields, usage, usage_only, .. } => {
                assert!(*usage_only);
                assert_eq!(*usage, Some(Usage { prompt_tokens: 11, completion_tokens: 6 }));
                assert_eq!(fields["choices"].get(), "[]");
                let u: Value = serde_json::from_str(fields["usage"].get()).unwrap();
                assert_eq!(u["total_tokens"], 17);
            }
            other => panic!("expected the usage chunk, got {other:?}"),
        }
        assert!(matches!(events[6], StreamEvent::Done));
    }

    #[test]
    fn a_tool_use_stream_becomes_tool_call_deltas() {
        let events = decode_all(TOOL_STREAM);
        let chunks: Vec<Value> = events
            .iter()
            .filter(|e| matches!(e, StreamEvent::Chunk { usage_only: false, .. }))
            .map(chunk_json)
            .collect();
        let deltas: Vec<&Value> = chunks.iter().map(|c| &c["choices"][0]["delta"]).collect();
        assert_eq!(deltas[0]["role"], "assistant");
        let start = deltas.iter().find(|d| d["tool_calls"][0]["id"].is_string()).unwrap();
        assert_eq!(
            start["tool_calls"],
            json!([{"index": 0, "id": "toolu_01NRLabsLyVHZPKxbKvkfSMn", "type": "function",
                    "function": {"name": "get_weather", "arguments": ""}}])
        );
        let arguments: String = deltas
            .iter()
            .filter_map(|d| d["tool_calls"][0]["function"]["arguments"].as_str())
            .collect();
        assert_eq!(arguments, "{\"location\": \"Paris\"}");
        let text: String = deltas.iter().filter_map(|d| d["content"].as_str()).collect();
        assert_eq!(text, "I'll check the current weather in Paris for you.");
        assert_eq!(chunks.last().unwrap()["choices"][0]["finish_reason"], "tool_calls");
        assert!(matches!(
            events[events.len() - 2],
            StreamEvent::Chunk {
                usage: Some(Usage { prompt_tokens: 377, completion_tokens: 65 }),
                ..
            }
        ));
        assert!(matches!(events.last(), Some(StreamEvent::Done)));
    }

    #[test]
    fn an_in_band_overloaded_error_is_an_error_event_that_fails_over_as_server_error() {
        // The `event: error` frame of Anthropic's streaming docs ("Error events":
        // https://docs.anthropic.com/en/docs/build-with-claude/streaming#error-events).
        let text = "event: error\ndata: {\"type\": \"error\", \"error\": {\"type\": \"overloaded_error\", \"message\": \"Overloaded\"}}";
        let events = decode_all(text);
        let [StreamEvent::Error(e)] = events.as_slice() else { panic!("{events:?}") };
        assert_eq!(e.kind, "server_error");
        assert_eq!(e.code.as_deref(), Some("overloaded_error"));
        assert_eq!(e.message, "Overloaded");
    }

    #[test]
    fn every_anthropic_error_class_keeps_its_message_and_classifies() {
        // The error types and statuses of Anthropic's API reference, "Errors"
        // (https://docs.anthropic.com/en/api/errors), in its error shape (there:
        // {"type":"error","error":{"type":"not_found_error","message":"The requested resource
        // could not be found."},"request_id":"req_011CSHoEeqs5C35K2UUqR7Fy"}).
        let cases: [(u16, &str, &str, Option<FailoverReason>); 8] = [
            (400, "invalid_request_error", "invalid_request_error", None),
            (
                401,
                "authentication_error",
                "authentication_error",
                Some(FailoverReason::ServerError),
            ),
            (403, "permission_error", "permission_error", Some(FailoverReason::ServerError)),
            (404, "not_found_error", "invalid_request_error", None),
            (413, "request_too_large", "invalid_request_error", None),
            (429, "rate_limit_error", "rate_limit_error", Some(FailoverReason::RateLimit)),
            (500, "api_error", "server_error", Some(FailoverReason::ServerError)),
            (529, "overloaded_error", "server_error", Some(FailoverReason::ServerError)),
        ];
        for (code, anthropic, openai, failover) in cases {
            let status = StatusCode::from_u16(code).unwrap();
            let body = format!(
                r#"{{"type":"error","error":{{"type":"{anthropic}","message":"message for {anthropic}"}},"request_id":"req_011CSHoEeqs5C35K2UUqR7Fy"}}"#
            );
            let error = Anthropic.error(status, body.as_bytes());
            assert_eq!(error.kind, openai, "{anthropic}");
            assert_eq!(error.code.as_deref(), Some(anthropic));
            assert_eq!(error.message, format!("message for {anthropic}"));
            let classified = classify(Failure::Call(CallError::http(status, error)));
            match (classified, failover) {
                (Verdict::Failover { reason, .. }, Some(want)) => {
                    assert_eq!(reason, want, "{anthropic}")
                }
                (Verdict::Stop { status: got, .. }, None) => assert_eq!(got, status),
                (other, want) => panic!("{anthropic}: {other:?}, wanted {want:?}"),
            }
        }
        let e = Anthropic.error(StatusCode::from_u16(529).unwrap(), b"<html>overloaded</html>");
        assert_eq!(e.kind, "server_error");
        assert!(!e.message.contains("html"));
    }

    #[test]
    fn a_prompt_too_long_is_recognised_as_a_context_length_refusal() {
        // The body api.anthropic.com sends (as quoted in SDK users' reports).
        let body = br#"{"type":"error","error":{"type":"invalid_request_error","message":"prompt is too long: 208310 tokens > 200000 maximum"},"request_id":"req_011CVQe1dLrGNMJyE1ghG1av"}"#;
        let error = Anthropic.error(StatusCode::BAD_REQUEST, body);
        assert!(error.is_context_length(), "{error:?}");
        assert_eq!(error.kind, "invalid_request_error");
        assert!(error.message.starts_with("prompt is too long"));
        let other = br#"{"type":"error","error":{"type":"invalid_request_error","message":"max_tokens: Field required"}}"#;
        assert!(!Anthropic.error(StatusCode::BAD_REQUEST, other).is_context_length());
    }

    #[test]
    fn an_error_object_in_a_200_is_that_error() {
        let body =
            br#"{"type":"error","error":{"type":"overloaded_error","message":"Overloaded"}}"#;
        let err = Anthropic.completion(body).unwrap_err();
        assert!(matches!(
            classify(Failure::Call(err)),
            Verdict::Failover { reason: FailoverReason::ServerError, .. }
        ));
    }
}
