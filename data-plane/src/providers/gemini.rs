//! Google's Gemini API (the Generative Language API, `v1beta`):
//! `POST {base_url}/v1beta/models/{model}:generateContent`, or
//! `:streamGenerateContent?alt=sse` for a stream, with the key in `x-goog-api-key`.
//! (Gemini API reference, "Generating content"; `base_url` is the bare host, e.g.
//! `https://generativelanguage.googleapis.com`.)
//!
//! The request is read into the wire core once ([`ChatRequest::core`]) and written by
//! [`switchyard_wire::gemini::request_body`], which documents the mapping: system and
//! developer messages → `systemInstruction`; turns → `contents` (consecutive turns of one role
//! merged); images, `input_audio` and `file` parts → `inlineData` (or `fileData` for Gemini
//! Files API and `gs://` URIs); tool calls and results → `functionCall` / `functionResponse`;
//! tools → `functionDeclarations` in Gemini's schema subset; `response_format` →
//! `responseMimeType` / `responseSchema` (a *strict* schema the subset cannot express is
//! refused); sampling fields → `generationConfig`. What the core leaves to the adapter:
//! - `n` → `candidateCount` (the answer side reads several candidates as several choices);
//! - the catalog's `max_tokens` when the client sets none;
//! - `reasoning_effort` → `thinkingConfig` only for a model the catalog marks `reasoning`,
//!   else dropped (docs/catalog.md);
//! - http(s) media URLs are **refused**, named in Chat terms: Gemini does not fetch
//!   arbitrary URLs, and fetching them on the node would make it an open proxy with
//!   unbounded latency inside the attempt's budget.
//!
//! Ignored (no Gemini equivalent): `parallel_tool_calls`, `logit_bias`, `user`, `store`,
//! `metadata`, `service_tier`, `logprobs`, `stream_options`.
//!
//! Gemini's stream has no end marker: the decoder counts a clean end of body after every
//! candidate's `finishReason` as the end ([`StreamDecoder::finish`]) and emits the last
//! `usageMetadata` as OpenAI's usage-only chunk, then `Done`.

use std::borrow::Cow;
use std::collections::{BTreeMap, BTreeSet};

use bytes::Bytes;
use http::{StatusCode, header};
use http_body_util::Full;
use serde::Deserialize;
use serde_json::value::RawValue;
use serde_json::{Map, Value, json};

use switchyard_catalog::{Model, Provider};

use super::adapter::{Adapter, StreamDecoder};
use super::error::{CONTEXT_LENGTH_EXCEEDED, CallError, UpstreamError};
use super::secret::Secret;
use super::sse::Frame;
use super::translated;
use super::unified::{Completion, Fields, StreamEvent, Usage};

mod embed;
use crate::embeddings::Embeddings;
use crate::request::ChatRequest;

pub struct Gemini;

const API_KEY_HEADER: &str = "x-goog-api-key";

/// A tool call id carries Gemini's thought signature after this separator: Gemini 2.5+/3
/// return a `thoughtSignature` on function call parts and Gemini 3 refuses a later turn whose
/// function calls lack it, while OpenAI clients round-trip only the id.
use switchyard_wire::gemini::SIGNATURE_SEPARATOR;

impl Adapter for Gemini {
    fn body(&self, model: &Model, request: &ChatRequest<'_>) -> Result<Bytes, CallError> {
        body(model, request)
    }

    fn translates(&self) -> bool {
        true
    }

    fn request(
        &self,
        provider: &Provider,
        model: &Model,
        stream: bool,
        body: Bytes,
        credential: Option<&Secret>,
    ) -> Result<http::Request<Full<Bytes>>, CallError> {
        let upstream = model.upstream_model.trim_start_matches("models/");
        let base = provider.base_url.trim_end_matches('/');
        let (url, accept) = if stream {
            (
                format!("{base}/v1beta/models/{upstream}:streamGenerateContent?alt=sse"),
                "text/event-stream",
            )
        } else {
            (format!("{base}/v1beta/models/{upstream}:generateContent"), "application/json")
        };
        let mut builder = http::Request::post(url)
            .header(header::CONTENT_TYPE, "application/json")
            .header(header::ACCEPT, accept);
        if let Some(secret) = credential {
            builder = builder.header(API_KEY_HEADER, secret.expose());
        }
        builder.body(Full::new(body)).map_err(CallError::Build)
    }

    fn embeddings_body(
        &self,
        model: &Model,
        _request: &ChatRequest<'_>,
        embeddings: &Embeddings,
    ) -> Result<Bytes, CallError> {
        embed::body(model, embeddings)
    }

    fn embeddings_request(
        &self,
        provider: &Provider,
        model: &Model,
        embeddings: &Embeddings,
        body: Bytes,
        credential: Option<&Secret>,
    ) -> Result<http::Request<Full<Bytes>>, CallError> {
        let upstream = model.upstream_model.trim_start_matches("models/");
        let base = provider.base_url.trim_end_matches('/');
        let url = format!("{base}/v1beta/models/{upstream}:{}", embed::method(embeddings));
        let mut builder = http::Request::post(url)
            .header(header::CONTENT_TYPE, "application/json")
            .header(header::ACCEPT, "application/json");
        if let Some(secret) = credential {
            builder = builder.header(API_KEY_HEADER, secret.expose());
        }
        builder.body(Full::new(body)).map_err(CallError::Build)
    }

    fn embeddings(&self, body: Bytes, embeddings: &Embeddings) -> Result<Completion, CallError> {
        embed::answer(&body, "", embeddings)
    }

    fn completion(&self, body: &[u8]) -> Result<Completion, CallError> {
        let response: WireResponse = serde_json::from_slice(body)
            .map_err(|e| CallError::Malformed(format!("not a GenerateContentResponse: {e}")))?;
        completion(response)
    }

    fn error(&self, status: StatusCode, body: &[u8]) -> UpstreamError {
        parse_error(status, body)
    }

    fn status(&self, status: StatusCode, error: &UpstreamError) -> StatusCode {
        // Google answers a bad key with 400 INVALID_ARGUMENT (reason API_KEY_INVALID): it is
        // the gateway's credential failing, so reserves are tried and the chain may go on.
        if error.code.as_deref() == Some("API_KEY_INVALID") {
            StatusCode::UNAUTHORIZED
        } else {
            status
        }
    }

    fn stream_decoder(&self, upstream_model: &str) -> Box<dyn StreamDecoder> {
        Box::new(GeminiStream::new(upstream_model))
    }
}

// === Request ===

/// The request through the core ([`switchyard_wire::gemini::request_body`]), with what the
/// core leaves to the adapter: `n` (→ `candidateCount`), the catalog's `max_tokens`, and
/// reasoning only for a model the catalog marks `reasoning` (docs/catalog.md).
fn body(model: &Model, request: &ChatRequest<'_>) -> Result<Bytes, CallError> {
    let core = translated::core(request)?;
    let candidates = translated::field::<u32>(request, "n")?;
    let core = if core.reasoning.is_some() && !model.reasoning {
        let mut core = core.clone();
        core.reasoning = None;
        Cow::Owned(core)
    } else {
        Cow::Borrowed(core)
    };
    switchyard_wire::gemini::request_body(&core, model.max_tokens, candidates)
        .map(Bytes::from)
        .map_err(|refusal| match unfetchable(request) {
            Some(error) if refusal.field.starts_with("messages[") => error,
            _ => translated::unsupported(&refusal),
        })
}

/// A media URL Gemini cannot take, named in Chat terms (the writer names core parts): Gemini
/// does not fetch arbitrary URLs, and fetching them on the node would make it an open proxy
/// with unbounded latency inside the attempt's budget.
fn unfetchable(request: &ChatRequest<'_>) -> Option<CallError> {
    let gemini_hosted = |url: &str| {
        url.starts_with("data:")
            || url.starts_with("gs://")
            || url.starts_with("https://generativelanguage.googleapis.com/")
    };
    let (at, _) = translated::chat_part(request, |part| {
        part.url().filter(|(_, url)| !gemini_hosted(url)).map(|(field, _)| field)
    })?;
    Some(CallError::Unsupported {
        message: format!(
            "{at}: the Gemini provider does not fetch URLs; send the media inline as a base64 data: URL (data:image/png;base64,…) or as a Gemini Files API URI"
        ),
        param: Some(at),
    })
}

// === Response ===

#[derive(Debug, Default, Deserialize)]
#[serde(rename_all = "camelCase")]
struct WireResponse {
    #[serde(default)]
    candidates: Vec<WireCandidate>,
    #[serde(default)]
    prompt_feedback: Option<PromptFeedback>,
    #[serde(default)]
    usage_metadata: Option<UsageMetadata>,
    #[serde(default)]
    model_version: Option<String>,
    #[serde(default)]
    response_id: Option<String>,
}

#[derive(Debug, Deserialize)]
#[serde(rename_all = "camelCase")]
struct WireCandidate {
    #[serde(default)]
    content: Option<WireContent>,
    #[serde(default)]
    finish_reason: Option<String>,
    #[serde(default)]
    index: Option<u32>,
}

#[derive(Debug, Deserialize)]
struct WireContent {
    #[serde(default)]
    parts: Vec<WirePart>,
}

#[derive(Debug, Deserialize)]
#[serde(rename_all = "camelCase")]
struct WirePart {
    #[serde(default)]
    text: Option<String>,
    /// A thought summary, not answer text.
    #[serde(default)]
    thought: bool,
    #[serde(default)]
    function_call: Option<WireCall>,
    #[serde(default)]
    thought_signature: Option<String>,
}

#[derive(Debug, Deserialize)]
struct WireCall {
    name: String,
    #[serde(default)]
    args: Option<Value>,
}

#[derive(Debug, Deserialize)]
#[serde(rename_all = "camelCase")]
struct PromptFeedback {
    #[serde(default)]
    block_reason: Option<String>,
    #[serde(default)]
    block_reason_message: Option<String>,
}

#[derive(Debug, Clone, Copy, Default, Deserialize)]
#[serde(rename_all = "camelCase", default)]
struct UsageMetadata {
    prompt_token_count: u64,
    candidates_token_count: u64,
    thoughts_token_count: u64,
    cached_content_token_count: u64,
    total_token_count: Option<u64>,
}

impl UsageMetadata {
    /// Thinking tokens are billed as output, as OpenAI counts reasoning tokens. Sums
    /// saturate: no count the upstream sends may wrap or panic the node (found by the
    /// `gemini` fuzz target, docs/fuzzing.md).
    fn usage(&self) -> Usage {
        Usage {
            prompt_tokens: self.prompt_token_count,
            completion_tokens: self
                .candidates_token_count
                .saturating_add(self.thoughts_token_count),
        }
    }

    fn json(&self) -> Value {
        let usage = self.usage();
        json!({
            "prompt_tokens": usage.prompt_tokens,
            "completion_tokens": usage.completion_tokens,
            "total_tokens": self
                .total_token_count
                .unwrap_or(usage.prompt_tokens.saturating_add(usage.completion_tokens)),
            "prompt_tokens_details": {"cached_tokens": self.cached_content_token_count},
            "completion_tokens_details": {"reasoning_tokens": self.thoughts_token_count},
        })
    }
}

/// OpenAI's finish reason for Gemini's. MALFORMED_FUNCTION_CALL, OTHER and the like have
/// no OpenAI counterpart and end as `stop`.
fn finish_reason(reason: &str, called: bool) -> &'static str {
    match reason {
        "MAX_TOKENS" => "length",
        "SAFETY"
        | "RECITATION"
        | "BLOCKLIST"
        | "PROHIBITED_CONTENT"
        | "SPII"
        | "IMAGE_SAFETY"
        | "IMAGE_PROHIBITED_CONTENT"
        | "IMAGE_RECITATION" => "content_filter",
        _ if called => "tool_calls",
        _ => "stop",
    }
}

/// A prompt Gemini refused to answer (`promptFeedback.blockReason`, no candidates): the
/// client's request is at fault, so it is a 400 and no other model is tried.
fn blocked(feedback: Option<&PromptFeedback>) -> Option<UpstreamError> {
    let feedback = feedback?;
    let reason = feedback.block_reason.as_deref()?;
    let mut message = format!("Gemini blocked the prompt (blockReason {reason})");
    if let Some(detail) = feedback.block_reason_message.as_deref().filter(|m| !m.is_empty()) {
        message.push_str(": ");
        message.push_str(detail);
    } else {
        message.push('.');
    }
    Some(UpstreamError {
        message,
        kind: "invalid_request_error".into(),
        code: Some("content_filter".into()),
        param: Some("messages".into()),
    })
}

/// `call_<random>`, plus the thought signature when Gemini gave one.
fn call_id(signature: Option<&str>) -> String {
    let mut id = format!("call_{:016x}{:08x}", rand::random::<u64>(), rand::random::<u32>());
    if let Some(signature) = signature.filter(|s| !s.is_empty()) {
        id.push_str(SIGNATURE_SEPARATOR);
        id.push_str(signature);
    }
    id
}

/// One candidate's answer text and OpenAI tool calls (`index` set when streaming).
fn answer(content: Option<&WireContent>, streaming_from: Option<u32>) -> (String, Vec<Value>) {
    let mut text = String::new();
    let mut calls = Vec::new();
    for part in content.map(|c| c.parts.as_slice()).unwrap_or_default() {
        if let Some(call) = &part.function_call {
            let args = call.args.clone().unwrap_or_else(|| json!({}));
            let mut value = json!({
                "id": call_id(part.thought_signature.as_deref()),
                "type": "function",
                "function": {"name": call.name, "arguments": args.to_string()},
            });
            if let Some(first) = streaming_from {
                let index = first + u32::try_from(calls.len()).unwrap_or(u32::MAX);
                value["index"] = json!(index);
            }
            calls.push(value);
        } else if let Some(t) = &part.text
            && !part.thought
        {
            text.push_str(t);
        }
    }
    (text, calls)
}

fn completion_id(response_id: Option<&str>) -> String {
    match response_id {
        Some(id) if !id.is_empty() => format!("chatcmpl-{id}"),
        _ => format!("chatcmpl-{:016x}{:016x}", rand::random::<u64>(), rand::random::<u64>()),
    }
}

fn raw_fields(value: Value) -> Result<BTreeMap<String, Box<RawValue>>, String> {
    let Value::Object(map) = value else { return Err("not an object".into()) };
    map.into_iter()
        .map(|(k, v)| serde_json::value::to_raw_value(&v).map(|raw| (k, raw)))
        .collect::<Result<_, _>>()
        .map_err(|e| e.to_string())
}

fn completion(response: WireResponse) -> Result<Completion, CallError> {
    if response.candidates.is_empty() {
        return Err(match blocked(response.prompt_feedback.as_ref()) {
            Some(error) => CallError::http(StatusCode::BAD_REQUEST, error),
            None => CallError::Malformed("a GenerateContentResponse without candidates".into()),
        });
    }
    let choices: Vec<Value> = response
        .candidates
        .iter()
        .enumerate()
        .map(|(i, candidate)| {
            let (text, calls) = answer(candidate.content.as_ref(), None);
            let reason = candidate.finish_reason.as_deref().unwrap_or("STOP");
            let mut message = json!({
                "role": "assistant",
                "content": if text.is_empty() && !calls.is_empty() { Value::Null } else { json!(text) },
                "refusal": null,
            });
            if !calls.is_empty() {
                message["tool_calls"] = Value::Array(calls.clone());
            }
            json!({
                "index": candidate.index.unwrap_or(i as u32),
                "message": message,
                "logprobs": null,
                "finish_reason": finish_reason(reason, !calls.is_empty()),
            })
        })
        .collect();
    let usage = response.usage_metadata.unwrap_or_default();
    let body = json!({
        "id": completion_id(response.response_id.as_deref()),
        "object": "chat.completion",
        "created": switchyard_time::now_secs(),
        "model": response.model_version.as_deref().unwrap_or("gemini"),
        "choices": choices,
        "usage": usage.json(),
    });
    let fields = raw_fields(body).map_err(CallError::Malformed)?;
    Ok(Completion::new(Fields::Map(fields), usage.usage()))
}

// === Stream ===

/// One streamed response: each `data:` frame is a whole GenerateContentResponse.
struct GeminiStream {
    id: Option<String>,
    created: u64,
    model: String,
    /// Candidates that have had their first chunk (with the assistant role).
    started: BTreeSet<u32>,
    finished: BTreeSet<u32>,
    /// Tool calls sent so far per candidate: the next call's `index`.
    calls: BTreeMap<u32, u32>,
    usage: Option<UsageMetadata>,
}

impl GeminiStream {
    fn new(upstream_model: &str) -> Self {
        Self {
            id: None,
            created: switchyard_time::now_secs(),
            model: upstream_model.to_owned(),
            started: BTreeSet::new(),
            finished: BTreeSet::new(),
            calls: BTreeMap::new(),
            usage: None,
        }
    }

    fn chunk(&self, choices: Vec<Value>) -> Value {
        json!({
            "id": self.id.as_deref().unwrap_or("chatcmpl-gemini"),
            "object": "chat.completion.chunk",
            "created": self.created,
            "model": self.model,
            "choices": choices,
        })
    }
}

impl StreamDecoder for GeminiStream {
    fn decode(&mut self, frame: &Frame) -> Result<Vec<StreamEvent>, String> {
        let data = frame.data.trim();
        let value: Value =
            serde_json::from_str(data).map_err(|e| format!("a frame is not JSON: {e}"))?;
        if value.get("error").is_some() {
            let error = parse_error(StatusCode::INTERNAL_SERVER_ERROR, data.as_bytes());
            return Ok(vec![StreamEvent::Error(error)]);
        }
        let response: WireResponse = serde_json::from_value(value)
            .map_err(|e| format!("a frame is not a GenerateContentResponse: {e}"))?;
        if self.id.is_none() {
            self.id = Some(completion_id(response.response_id.as_deref()));
        }
        if let Some(usage) = response.usage_metadata {
            self.usage = Some(usage);
        }
        if response.candidates.is_empty() {
            return Ok(blocked(response.prompt_feedback.as_ref())
                .map(StreamEvent::Error)
                .into_iter()
                .collect());
        }
        let mut commits = false;
        let mut choices = Vec::new();
        for (i, candidate) in response.candidates.iter().enumerate() {
            let index = candidate.index.unwrap_or(i as u32);
            let first_call = self.calls.get(&index).copied().unwrap_or(0);
            let (text, calls) = answer(candidate.content.as_ref(), Some(first_call));
            let called = first_call > 0 || !calls.is_empty();
            let mut delta = Map::new();
            if self.started.insert(index) {
                delta.insert("role".into(), json!("assistant"));
                delta.insert("content".into(), json!(text));
            } else if !text.is_empty() {
                delta.insert("content".into(), json!(text));
            }
            commits |= !text.is_empty() || !calls.is_empty();
            if !calls.is_empty() {
                let sent = u32::try_from(calls.len()).unwrap_or(u32::MAX);
                self.calls.insert(index, first_call.saturating_add(sent));
                delta.insert("tool_calls".into(), Value::Array(calls));
            }
            let finish = candidate.finish_reason.as_deref().map(|r| finish_reason(r, called));
            if finish.is_some() {
                commits = true;
                self.finished.insert(index);
            }
            choices.push(json!({
                "index": index,
                "delta": delta,
                "logprobs": null,
                "finish_reason": finish,
            }));
        }
        let fields = raw_fields(self.chunk(choices))?;
        // Gemini ends a stream by ending the body; it is whole only if every candidate
        // finished (else the connection broke between chunks).
        let finished = !self.started.is_empty() && self.started == self.finished;
        Ok(vec![StreamEvent::Chunk { fields, commits, usage: None, usage_only: false, finished }])
    }

    fn close(&mut self) -> Vec<StreamEvent> {
        let mut events = Vec::new();
        if let Some(usage) = self.usage {
            let mut chunk = self.chunk(Vec::new());
            chunk["usage"] = usage.json();
            if let Ok(fields) = raw_fields(chunk) {
                events.push(StreamEvent::Chunk {
                    fields,
                    commits: false,
                    usage: Some(usage.usage()),
                    usage_only: true,
                    finished: true,
                });
            }
        }
        events.push(StreamEvent::Done);
        events
    }
}

// === Errors ===

#[derive(Deserialize)]
struct ErrorBody {
    error: GoogleError,
}

#[derive(Deserialize)]
struct GoogleError {
    #[serde(default)]
    message: String,
    #[serde(default)]
    status: Option<String>,
    #[serde(default)]
    details: Vec<Value>,
}

/// Google's error envelope `{"error": {"code", "message", "status", "details"}}` (also as a
/// one-element array, as `streamGenerateContent` without `alt=sse` sends it), with the
/// message kept, the type mapped to OpenAI's and `code` the Google status.
pub fn parse_error(status: StatusCode, body: &[u8]) -> UpstreamError {
    let parsed = serde_json::from_slice::<ErrorBody>(body).ok().or_else(|| {
        serde_json::from_slice::<Vec<ErrorBody>>(body).ok().and_then(|v| v.into_iter().next())
    });
    let Some(ErrorBody { error }) = parsed else {
        return UpstreamError {
            message: format!("The upstream provider returned HTTP {}.", status.as_u16()),
            kind: kind(None, status).into(),
            code: None,
            param: None,
        };
    };
    let key_invalid = error
        .details
        .iter()
        .any(|d| d.get("reason").and_then(Value::as_str) == Some("API_KEY_INVALID"));
    // Gemini refuses a prompt longer than the model's context with 400 INVALID_ARGUMENT "The
    // input token count (N) exceeds the maximum number of tokens allowed (M)." (as quoted
    // from generativelanguage.googleapis.com in the gemini-cli and python-genai issues).
    let too_long = error.status.as_deref() == Some("INVALID_ARGUMENT") && {
        let message = error.message.to_ascii_lowercase();
        message.contains("input token count") && message.contains("exceeds the maximum")
    };
    let code = if key_invalid {
        Some("API_KEY_INVALID".to_owned())
    } else if too_long {
        Some(CONTEXT_LENGTH_EXCEEDED.to_owned())
    } else {
        error.status.clone()
    };
    UpstreamError {
        kind: if key_invalid {
            "authentication_error".into()
        } else {
            kind(error.status.as_deref(), status).into()
        },
        message: error.message,
        code,
        param: None,
    }
}

/// OpenAI's error type for a Google status (Gemini API "Troubleshooting" error table),
/// else for the HTTP status.
fn kind(google: Option<&str>, status: StatusCode) -> &'static str {
    match google {
        Some("INVALID_ARGUMENT" | "FAILED_PRECONDITION" | "OUT_OF_RANGE" | "NOT_FOUND") => {
            "invalid_request_error"
        }
        Some("UNAUTHENTICATED") => "authentication_error",
        Some("PERMISSION_DENIED") => "permission_error",
        // OpenAI's type for a requests-per-minute limit.
        Some("RESOURCE_EXHAUSTED") => "requests",
        Some("INTERNAL" | "UNAVAILABLE" | "DEADLINE_EXCEEDED" | "UNKNOWN") => "server_error",
        _ => match status.as_u16() {
            401 => "authentication_error",
            403 => "permission_error",
            429 => "requests",
            s if s >= 500 => "server_error",
            _ => "invalid_request_error",
        },
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::failure::{Failure, Verdict, classify};

    /// Token counts near `u64::MAX` saturate instead of panicking (debug) or wrapping
    /// (release).
    #[test]
    fn huge_usage_counts_saturate() {
        let max = u64::MAX;
        let body = json!({
            "candidates": [{"content": {"parts": [{"text": "hi"}], "role": "model"},
                            "finishReason": "STOP", "index": 0}],
            "usageMetadata": {"promptTokenCount": max, "candidatesTokenCount": max,
                              "thoughtsTokenCount": max},
        });
        let completion = Gemini.completion(body.to_string().as_bytes()).unwrap();
        assert_eq!(completion.usage, Usage { prompt_tokens: max, completion_tokens: max });
        let out = completion.to_json(&RawValue::from_string("\"m\"".into()).unwrap(), None);
        let v: Value = serde_json::from_slice(&out).unwrap();
        assert_eq!(v["usage"]["total_tokens"], json!(max));
    }

    fn provider() -> Provider {
        serde_json::from_value(json!({
            "name": "gemini", "kind": "gemini",
            "base_url": "https://generativelanguage.googleapis.com/"
        }))
        .unwrap()
    }

    fn model(max_tokens: Option<u32>) -> Model {
        serde_json::from_value(json!({
            "name": "google/gemini-2.5-flash", "provider": "gemini",
            "upstream_model": "gemini-2.5-flash", "max_tokens": max_tokens
        }))
        .unwrap()
    }

    fn translate(request: Value) -> Value {
        try_translate(request).unwrap()
    }

    fn try_translate(request: Value) -> Result<Value, CallError> {
        let text = request.to_string();
        let req = ChatRequest::parse(text.as_bytes()).unwrap();
        body(&model(None), &req).map(|b| serde_json::from_slice(&b).unwrap())
    }

    /// A refusal's message and field.
    fn unsupported(error: &CallError) -> (&str, Option<&str>) {
        match error {
            CallError::Unsupported { message, param } => (message, param.as_deref()),
            other => panic!("expected a refusal, got {other:?}"),
        }
    }

    fn parse(request: Value) -> ChatRequest<'static> {
        ChatRequest::parse(Box::leak(request.to_string().into_bytes().into_boxed_slice())).unwrap()
    }

    fn fields(c: &impl serde::Serialize) -> Value {
        serde_json::to_value(c).unwrap()
    }

    fn frame(data: &str) -> Frame {
        Frame { event: None, data: data.into() }
    }

    fn chunk(event: &StreamEvent) -> (Value, bool) {
        match event {
            StreamEvent::Chunk { fields: f, commits, .. } => (fields(f), *commits),
            other => panic!("expected a chunk, got {other:?}"),
        }
    }

    #[test]
    fn requests_go_to_generate_content_with_the_key_header() {
        let req = parse(json!({"model": "m", "messages": [{"role": "user", "content": "hi"}]}));
        let secret = Secret::new("AIza-test");
        let built = Gemini.build(&provider(), &model(None), &req, Some(&secret)).unwrap();
        assert_eq!(
            built.uri().to_string(),
            "https://generativelanguage.googleapis.com/v1beta/models/gemini-2.5-flash:generateContent"
        );
        assert_eq!(built.headers()["x-goog-api-key"], "AIza-test");
        assert!(built.headers().get(header::AUTHORIZATION).is_none());

        let req = parse(
            json!({"model": "m", "stream": true, "messages": [{"role": "user", "content": "hi"}]}),
        );
        let built = Gemini.build(&provider(), &model(None), &req, Some(&secret)).unwrap();
        assert_eq!(
            built.uri().to_string(),
            "https://generativelanguage.googleapis.com/v1beta/models/gemini-2.5-flash:streamGenerateContent?alt=sse"
        );
    }

    #[test]
    fn system_messages_become_the_system_instruction_and_roles_map() {
        // Target shape: Gemini API reference, "Text generation" → "System instructions"
        // (https://ai.google.dev/gemini-api/docs/text-generation#system-instructions).
        let sent = translate(json!({"model": "m", "messages": [
            {"role": "system", "content": "You are a cat."},
            {"role": "developer", "content": [{"type": "text", "text": "Your name is Neko."}]},
            {"role": "user", "content": "Hello there"},
            {"role": "assistant", "content": "Meow."},
            {"role": "user", "content": "Again"}
        ]}));
        assert_eq!(
            sent,
            json!({
                "systemInstruction": {"parts": [{"text": "You are a cat."}, {"text": "Your name is Neko."}]},
                "contents": [
                    {"role": "user", "parts": [{"text": "Hello there"}]},
                    {"role": "model", "parts": [{"text": "Meow."}]},
                    {"role": "user", "parts": [{"text": "Again"}]}
                ]
            })
        );
    }

    #[test]
    fn max_tokens_temperature_top_p_stop_and_n_map_to_generation_config() {
        // Field names: Gemini API reference, GenerationConfig
        // (https://ai.google.dev/api/generate-content#v1beta.GenerationConfig).
        let sent = translate(json!({"model": "m", "messages": [{"role": "user", "content": "x"}],
            "max_tokens": 100, "max_completion_tokens": 256, "temperature": 1.8, "top_p": 0.9,
            "stop": ["END", "STOP"], "n": 2, "seed": 7}));
        assert_eq!(
            sent["generationConfig"],
            json!({"maxOutputTokens": 256, "temperature": 1.8, "topP": 0.9,
                   "stopSequences": ["END", "STOP"], "candidateCount": 2, "seed": 7})
        );
        let sent = translate(json!({"model": "m", "messages": [{"role": "user", "content": "x"}],
            "max_tokens": 100, "temperature": 2.0, "stop": "END"}));
        assert_eq!(
            sent["generationConfig"],
            json!({"maxOutputTokens": 100, "temperature": 2.0, "stopSequences": ["END"]})
        );
        // Outside Chat's own 0–2 the request is refused, as for every translated provider.
        let hot =
            try_translate(json!({"model": "m", "messages": [{"role": "user", "content": "x"}],
            "temperature": 3.5}))
            .unwrap_err();
        assert_eq!(unsupported(&hot).1, Some("temperature"));
        // Without a client value the catalog's max_tokens applies.
        let req = parse(json!({"model": "m", "messages": [{"role": "user", "content": "x"}]}));
        let sent: Value = serde_json::from_slice(&body(&model(Some(512)), &req).unwrap()).unwrap();
        assert_eq!(sent["generationConfig"], json!({"maxOutputTokens": 512}));
    }

    #[test]
    fn tools_and_tool_choice_become_function_declarations_and_tool_config() {
        // Target shape: Gemini API "Function calling" guide, REST example
        // (https://ai.google.dev/gemini-api/docs/function-calling): tools[].functionDeclarations
        // and toolConfig.functionCallingConfig {mode, allowedFunctionNames}.
        let tools = json!([
            {"type": "function", "function": {"name": "get_weather", "description": "Weather",
              "strict": true, "parameters": {"$schema": "http://json-schema.org/draft-07/schema#",
                "type": "object", "additionalProperties": false, "required": ["city"],
                "properties": {"city": {"type": "string", "format": "email"},
                               "unit": {"type": ["string", "null"], "enum": ["c", "f"]}}}}},
            {"type": "function", "function": {"name": "now", "parameters": {"type": "object", "properties": {}}}}
        ]);
        let sent = translate(json!({"model": "m", "messages": [{"role": "user", "content": "x"}],
            "tools": tools, "tool_choice": {"type": "function", "function": {"name": "get_weather"}}}));
        assert_eq!(
            sent["tools"],
            json!([{"functionDeclarations": [
                {"name": "get_weather", "description": "Weather", "parameters": {
                    "type": "OBJECT", "required": ["city"], "properties": {
                        "city": {"type": "STRING"},
                        "unit": {"type": "STRING", "nullable": true, "enum": ["c", "f"]}}}},
                {"name": "now"}
            ]}])
        );
        assert_eq!(
            sent["toolConfig"],
            json!({"functionCallingConfig": {"mode": "ANY", "allowedFunctionNames": ["get_weather"]}})
        );
        for (choice, mode) in [("auto", "AUTO"), ("none", "NONE"), ("required", "ANY")] {
            let sent =
                translate(json!({"model": "m", "messages": [{"role": "user", "content": "x"}],
                "tools": tools, "tool_choice": choice}));
            assert_eq!(sent["toolConfig"]["functionCallingConfig"]["mode"], mode);
        }
    }

    #[test]
    fn tool_calls_and_tool_results_become_function_call_and_response_parts() {
        // Target shape: the "Function calling" guide's multi-turn REST example: a model turn
        // with functionCall {name, args}, then a user turn with functionResponse {name, response}.
        let sent = translate(json!({"model": "m", "messages": [
            {"role": "user", "content": "Weather in Paris and London?"},
            {"role": "assistant", "content": null, "tool_calls": [
                {"id": "call_1__thought__c2lnbmF0dXJl", "type": "function",
                 "function": {"name": "get_weather", "arguments": "{\"city\":\"Paris\"}"}},
                {"id": "call_2", "type": "function",
                 "function": {"name": "get_weather", "arguments": "{\"city\":\"London\"}"}}]},
            {"role": "tool", "tool_call_id": "call_1__thought__c2lnbmF0dXJl", "content": "{\"temp\": 21}"},
            {"role": "tool", "tool_call_id": "call_2", "content": "rainy"}
        ]}));
        assert_eq!(
            sent["contents"],
            json!([
                {"role": "user", "parts": [{"text": "Weather in Paris and London?"}]},
                {"role": "model", "parts": [
                    {"functionCall": {"name": "get_weather", "args": {"city": "Paris"}},
                     "thoughtSignature": "c2lnbmF0dXJl"},
                    {"functionCall": {"name": "get_weather", "args": {"city": "London"}}}]},
                {"role": "user", "parts": [
                    {"functionResponse": {"name": "get_weather", "response": {"temp": 21}}},
                    {"functionResponse": {"name": "get_weather", "response": {"output": "rainy"}}}]}
            ])
        );
        // History from another provider carries no signature: the first call gets Google's
        // documented placeholder.
        let sent = translate(json!({"model": "m", "messages": [
            {"role": "user", "content": "x"},
            {"role": "assistant", "tool_calls": [{"id": "toolu_1", "type": "function",
                 "function": {"name": "f", "arguments": "{}"}}]},
            {"role": "tool", "tool_call_id": "toolu_1", "content": "[1,2]"}
        ]}));
        assert_eq!(
            sent["contents"][1]["parts"][0]["thoughtSignature"],
            switchyard_wire::gemini::SKIP_SIGNATURE
        );
        assert_eq!(
            sent["contents"][2]["parts"][0]["functionResponse"]["response"],
            json!({"output": [1, 2]})
        );
        let orphan = try_translate(json!({"model": "m", "messages": [
            {"role": "user", "content": "x"}, {"role": "tool", "tool_call_id": "nope", "content": "1"}]}))
        .unwrap_err();
        assert_eq!(unsupported(&orphan).1, Some("messages[1].tool_call_id"));
    }

    #[test]
    fn audio_and_files_go_inline_and_a_file_id_is_refused() {
        // Target shape: Gemini API "Audio understanding" and "Document understanding",
        // inline data REST examples: inlineData {mimeType, data}.
        let sent = translate(json!({"model": "m", "messages": [{"role": "user", "content": [
            {"type": "input_audio", "input_audio": {"data": "UklGRg==", "format": "wav"}},
            {"type": "file", "file": {"file_data": "data:application/pdf;base64,JVBERi0=", "filename": "a.pdf"}}
        ]}]}));
        assert_eq!(
            sent["contents"][0]["parts"],
            json!([
                {"inlineData": {"mimeType": "audio/wav", "data": "UklGRg=="}},
                {"inlineData": {"mimeType": "application/pdf", "data": "JVBERi0="}}
            ])
        );
        let refused =
            try_translate(json!({"model": "m", "messages": [{"role": "user", "content": [
            {"type": "file", "file": {"file_id": "file-abc"}}]}]}))
            .unwrap_err();
        assert_eq!(unsupported(&refused).1, Some("messages[0].content[0].file.file_data"));
        let web = try_translate(json!({"model": "m", "messages": [{"role": "user", "content": [
            {"type": "text", "text": "read"},
            {"type": "file", "file": {"file_data": "https://example.com/a.pdf"}}]}]}))
        .unwrap_err();
        assert_eq!(unsupported(&web).1, Some("messages[0].content[1].file.file_data"));
    }

    #[test]
    fn reasoning_effort_becomes_a_thinking_budget_only_for_a_reasoning_model() {
        let body = json!({"model": "m", "messages": [{"role": "user", "content": "x"}],
            "reasoning_effort": "medium"});
        assert!(translate(body.clone()).get("generationConfig").is_none(), "dropped");
        let mut reasoning = model(None);
        reasoning.reasoning = true;
        let req = parse(body);
        let sent: Value = serde_json::from_slice(&Gemini.body(&reasoning, &req).unwrap()).unwrap();
        assert_eq!(sent["generationConfig"], json!({"thinkingConfig": {"thinkingBudget": 8192}}));
    }

    #[test]
    fn data_url_images_go_inline_and_web_urls_are_refused() {
        // Target shape: Gemini API "Image understanding", inline image data REST example
        // (https://ai.google.dev/gemini-api/docs/image-understanding): inlineData {mimeType, data}.
        let sent = translate(json!({"model": "m", "messages": [{"role": "user", "content": [
            {"type": "text", "text": "Caption this image."},
            {"type": "image_url", "image_url": {"url": "data:image/jpeg;base64,/9j/4AAQSkZJRg==", "detail": "low"}},
            {"type": "image_url", "image_url": {"url": "https://generativelanguage.googleapis.com/v1beta/files/abc-123"}}
        ]}]}));
        assert_eq!(
            sent["contents"][0]["parts"],
            json!([
                {"text": "Caption this image."},
                {"inlineData": {"mimeType": "image/jpeg", "data": "/9j/4AAQSkZJRg=="}},
                {"fileData": {"fileUri": "https://generativelanguage.googleapis.com/v1beta/files/abc-123"}}
            ])
        );
        let refused =
            try_translate(json!({"model": "m", "messages": [{"role": "user", "content": [
            {"type": "image_url", "image_url": {"url": "https://example.com/cat.png"}}]}]}))
            .unwrap_err();
        assert_eq!(unsupported(&refused).1, Some("messages[0].content[0].image_url.url"));
        assert!(unsupported(&refused).0.contains("data: URL"), "{}", unsupported(&refused).0);
    }

    #[test]
    fn response_format_maps_to_response_mime_type_and_schema() {
        // Target shape: Gemini API "Structured output" REST example
        // (https://ai.google.dev/gemini-api/docs/structured-output): generationConfig
        // {responseMimeType: "application/json", responseSchema: {type: ARRAY, items: …}}.
        let sent = translate(json!({"model": "m", "messages": [{"role": "user", "content": "x"}],
            "response_format": {"type": "json_object"}}));
        assert_eq!(sent["generationConfig"], json!({"responseMimeType": "application/json"}));
        let schema = json!({"type": "object", "additionalProperties": false,
            "properties": {"recipe_name": {"type": "string"}, "rating": {"const": "good"},
                           "ingredients": {"type": "array", "items": {"type": "string"}}},
            "required": ["recipe_name", "ingredients"]});
        let request = json!({"model": "m", "messages": [{"role": "user", "content": "x"}],
            "response_format": {"type": "json_schema",
                "json_schema": {"name": "recipe", "strict": true, "schema": schema}}});
        assert!(Gemini.body(&model(None), &parse(request.clone())).is_ok());
        assert_eq!(
            translate(request)["generationConfig"],
            json!({"responseMimeType": "application/json", "responseSchema": {"type": "OBJECT",
                "properties": {"recipe_name": {"type": "STRING"}, "rating": {"enum": ["good"]},
                               "ingredients": {"type": "ARRAY", "items": {"type": "STRING"}}},
                "required": ["recipe_name", "ingredients"]}})
        );
    }

    #[test]
    fn a_strict_schema_gemini_cannot_express_is_refused_naming_the_provider() {
        let schema = json!({"type": "object", "$defs": {"n": {"type": "string"}},
            "properties": {"a": {"$ref": "#/$defs/n"}, "b": {"type": "integer", "multipleOf": 5}}});
        let strict = json!({"model": "m", "messages": [{"role": "user", "content": "x"}],
            "response_format": {"type": "json_schema",
                "json_schema": {"name": "s", "strict": true, "schema": schema}}});
        let message = Gemini.body(&model(None), &parse(strict.clone())).unwrap_err().to_string();
        assert!(message.contains("Gemini provider"), "{message}");
        assert!(message.contains("`$ref` at #/properties/a"), "{message}");
        assert!(message.contains("`multipleOf` at #/properties/b"), "{message}");
        // The refusal is the client's 400 naming the field, not a failover.
        let req = parse(strict);
        match Gemini.build(&provider(), &model(None), &req, None) {
            Err(e @ CallError::Unsupported { .. }) => {
                let verdict = classify(Failure::Call(e));
                assert!(
                    matches!(&verdict, Verdict::Stop { status: StatusCode::BAD_REQUEST, error, .. }
                        if error.param.as_deref() == Some("response_format.json_schema")),
                    "{verdict:?}"
                );
            }
            other => panic!("expected a refusal, got {other:?}"),
        }
        // Not strict: best effort, what cannot be expressed is dropped.
        let loose = json!({"model": "m", "messages": [{"role": "user", "content": "x"}],
            "response_format": {"type": "json_schema",
                "json_schema": {"name": "s", "schema": schema}}});
        assert!(Gemini.body(&model(None), &parse(loose.clone())).is_ok());
        assert_eq!(
            translate(loose)["generationConfig"]["responseSchema"],
            json!({"type": "OBJECT", "properties": {"a": {}, "b": {"type": "INTEGER"}}})
        );
    }

    #[test]
    fn a_text_response_has_the_openai_shape() {
        // Fixture: googleapis/js-genai test/unit/models_test.ts, `mockGenerateContentResponse`
        // (read via the indexed fork wavybaby5280/js-genai_wavy).
        let body = br#"{"candidates":[{"content":{"parts":[{"text":"The"}],"role":"model"},
            "finishReason":"STOP","index":0}],
            "usageMetadata":{"promptTokenCount":8,"candidatesTokenCount":1,"totalTokenCount":9}}"#;
        let c = Gemini.completion(body).unwrap();
        let v = fields(&c.fields);
        assert_eq!(v["object"], "chat.completion");
        assert!(v["id"].as_str().unwrap().starts_with("chatcmpl-"));
        assert_eq!(
            v["choices"],
            json!([{"index": 0, "message": {"role": "assistant", "content": "The", "refusal": null},
                    "logprobs": null, "finish_reason": "stop"}])
        );
        assert_eq!(v["usage"]["prompt_tokens"], 8);
        assert_eq!(v["usage"]["completion_tokens"], 1);
        assert_eq!(v["usage"]["total_tokens"], 9);
        assert_eq!(c.usage, Usage { prompt_tokens: 8, completion_tokens: 1 });
    }

    #[test]
    fn a_function_call_response_becomes_tool_calls_with_json_string_arguments() {
        // Fixture: googleapis/js-genai test/unit/models_test.ts,
        // `mockGenerateContentResponseWithFunctionCall` (two calls, the second without args).
        let body = br#"{"candidates":[{"content":{"parts":[
            {"functionCall":{"name":"print","args":{"text":"Hello World","color":"red"}}},
            {"functionCall":{"name":"beep"}}],"role":"model"},"finishReason":"STOP","index":0}],
            "usageMetadata":{"promptTokenCount":8,"candidatesTokenCount":1,"totalTokenCount":9}}"#;
        let v = fields(&Gemini.completion(body).unwrap().fields);
        let choice = &v["choices"][0];
        assert_eq!(choice["finish_reason"], "tool_calls");
        assert!(choice["message"]["content"].is_null());
        let calls = choice["message"]["tool_calls"].as_array().unwrap();
        assert_eq!(calls.len(), 2);
        assert!(calls[0]["id"].as_str().unwrap().starts_with("call_"));
        assert_ne!(calls[0]["id"], calls[1]["id"]);
        assert_eq!(calls[0]["type"], "function");
        assert_eq!(calls[0]["function"]["name"], "print");
        let args: Value =
            serde_json::from_str(calls[0]["function"]["arguments"].as_str().unwrap()).unwrap();
        assert_eq!(args, json!({"text": "Hello World", "color": "red"}));
        assert_eq!(calls[1]["function"]["arguments"], "{}");
    }

    #[test]
    fn finish_reasons_map_to_openai() {
        for (gemini, openai) in [
            ("STOP", "stop"),
            ("MAX_TOKENS", "length"),
            ("SAFETY", "content_filter"),
            ("RECITATION", "content_filter"),
            ("BLOCKLIST", "content_filter"),
            ("PROHIBITED_CONTENT", "content_filter"),
            ("SPII", "content_filter"),
            ("OTHER", "stop"),
        ] {
            assert_eq!(finish_reason(gemini, false), openai, "{gemini}");
        }
    }

    #[test]
    fn a_blocked_prompt_is_a_non_retryable_400_saying_why() {
        // Fixture: a blocked prompt per the Gemini API reference, GenerateContentResponse
        // ("promptFeedback … only happens when no candidates were generated", BlockReason
        // enum; https://ai.google.dev/api/generate-content#v1beta.GenerateContentResponse).
        let body = br#"{"promptFeedback":{"blockReason":"SAFETY","safetyRatings":[
            {"category":"HARM_CATEGORY_DANGEROUS_CONTENT","probability":"HIGH"}]},
            "usageMetadata":{"promptTokenCount":9,"totalTokenCount":9},"modelVersion":"gemini-2.5-flash"}"#;
        let e = Gemini.completion(body).unwrap_err();
        match classify(Failure::Call(e)) {
            Verdict::Stop { status, error, .. } => {
                assert_eq!(status, StatusCode::BAD_REQUEST);
                assert!(error.message.contains("Gemini blocked the prompt"), "{}", error.message);
                assert!(error.message.contains("SAFETY"));
                assert_eq!(error.kind, "invalid_request_error");
            }
            other => panic!("expected a client error, got {other:?}"),
        }
        // Streaming: the first (only) frame carries it; an in-band invalid_request_error.
        let mut decoder = GeminiStream::new("gemini-2.5-flash");
        let events = decoder.decode(&frame(std::str::from_utf8(body).unwrap())).unwrap();
        assert!(
            matches!(&events[..], [StreamEvent::Error(e)] if e.kind == "invalid_request_error")
        );
    }

    #[test]
    fn a_stream_becomes_openai_chunks_then_usage_then_done() {
        // Fixture: a recorded `streamGenerateContent?alt=sse` response of
        // gemini-3.1-flash-lite-preview (GeneralBots/gb `out.txt`, commit 144c4b0, at
        // alm.pragmatismo.com.br): text chunks without finishReason, then an empty text part
        // with a thoughtSignature, finishReason STOP and the full usageMetadata.
        let frames = [
            r#"{"candidates": [{"content": {"role": "model","parts": [{"text": "Hello!"}]}}],"usageMetadata": {"trafficType": "ON_DEMAND"},"modelVersion": "gemini-3.1-flash-lite-preview","createTime": "2026-03-10T14:54:45.066123Z","responseId": "tTCwacuEBMvnitYP06qsgQY"}"#,
            r#"{"candidates": [{"content": {"role": "model","parts": [{"text": " How can I help you today"}]}}],"usageMetadata": {"trafficType": "ON_DEMAND"},"modelVersion": "gemini-3.1-flash-lite-preview","createTime": "2026-03-10T14:54:45.066123Z","responseId": "tTCwacuEBMvnitYP06qsgQY"}"#,
            r#"{"candidates": [{"content": {"role": "model","parts": [{"text": "?"}]}}],"usageMetadata": {"trafficType": "ON_DEMAND"},"modelVersion": "gemini-3.1-flash-lite-preview","createTime": "2026-03-10T14:54:45.066123Z","responseId": "tTCwacuEBMvnitYP06qsgQY"}"#,
            r#"{"candidates": [{"content": {"role": "model","parts": [{"text": "","thoughtSignature": "AY89a18iOcFus5wr5bW5xN6zZ4aUiCyhgmg6HE2YjtYDV/dwZ5oZlZHeTmiUKv34qq0="}]},"finishReason": "STOP"}],"usageMetadata": {"promptTokenCount": 1,"candidatesTokenCount": 9,"totalTokenCount": 10,"trafficType": "ON_DEMAND","promptTokensDetails": [{"modality": "TEXT","tokenCount": 1}],"candidatesTokensDetails": [{"modality": "TEXT","tokenCount": 9}]},"modelVersion": "gemini-3.1-flash-lite-preview","createTime": "2026-03-10T14:54:45.066123Z","responseId": "tTCwacuEBMvnitYP06qsgQY"}"#,
        ];
        let mut decoder = Gemini.stream_decoder("gemini-3.1-flash-lite-preview");
        let mut chunks = Vec::new();
        let mut finished = Vec::new();
        for f in frames {
            let events = decoder.decode(&frame(f)).unwrap();
            assert_eq!(events.len(), 1);
            chunks.push(chunk(&events[0]));
            finished.push(matches!(events[0], StreamEvent::Chunk { finished: true, .. }));
        }
        assert_eq!(finished, [false, false, false, true], "whole once STOP came");
        let (first, commits) = &chunks[0];
        assert!(*commits);
        assert_eq!(first["object"], "chat.completion.chunk");
        assert_eq!(first["id"], "chatcmpl-tTCwacuEBMvnitYP06qsgQY");
        assert_eq!(first["choices"][0]["delta"], json!({"role": "assistant", "content": "Hello!"}));
        assert!(first["choices"][0]["finish_reason"].is_null());
        assert_eq!(
            chunks[1].0["choices"][0]["delta"],
            json!({"content": " How can I help you today"})
        );
        assert!(
            chunks.iter().all(|(c, _)| c["id"] == first["id"] && c["created"] == first["created"])
        );
        let (last, commits) = &chunks[3];
        assert!(*commits);
        assert_eq!(last["choices"][0]["delta"], json!({}));
        assert_eq!(last["choices"][0]["finish_reason"], "stop");
        // The body ends: the usage-only chunk, then the end marker.
        let end = decoder.close();
        match &end[..] {
            [
                StreamEvent::Chunk {
                    fields: f,
                    usage: Some(u),
                    usage_only: true,
                    commits: false,
                    ..
                },
                StreamEvent::Done,
            ] => {
                assert_eq!(*u, Usage { prompt_tokens: 1, completion_tokens: 9 });
                let v = fields(f);
                assert_eq!(v["choices"], json!([]));
                assert_eq!(v["usage"]["total_tokens"], 10);
            }
            other => panic!("expected usage then Done, got {other:?}"),
        }
    }

    #[test]
    fn a_stream_cut_before_its_finish_reason_is_not_complete() {
        let mut decoder = GeminiStream::new("g");
        let events = decoder
            .decode(&frame(
                r#"{"candidates":[{"content":{"role":"model","parts":[{"text":"Hel"}]}}]}"#,
            ))
            .unwrap();
        assert!(matches!(events[..], [StreamEvent::Chunk { finished: false, .. }]));
    }

    #[test]
    fn a_streamed_function_call_is_one_complete_tool_calls_delta() {
        // Fixture: the js-genai function call response above, as one SSE frame (Gemini
        // streams a functionCall part whole, never split across frames).
        let mut decoder = GeminiStream::new("gemini-2.5-flash");
        let events = decoder
            .decode(&frame(
                r#"{"candidates":[{"content":{"parts":[{"functionCall":{"name":"print","args":{"text":"Hello World","color":"red"}},"thoughtSignature":"c2ln"},{"functionCall":{"name":"beep"}}],"role":"model"},"finishReason":"STOP","index":0}],"usageMetadata":{"promptTokenCount":8,"candidatesTokenCount":1,"totalTokenCount":9}}"#,
            ))
            .unwrap();
        let (c, commits) = chunk(&events[0]);
        assert!(commits);
        let delta = &c["choices"][0]["delta"];
        assert_eq!(delta["role"], "assistant");
        let calls = delta["tool_calls"].as_array().unwrap();
        assert_eq!((calls[0]["index"].clone(), calls[1]["index"].clone()), (json!(0), json!(1)));
        assert!(calls[0]["id"].as_str().unwrap().ends_with("__thought__c2ln"));
        assert_eq!(calls[0]["function"]["arguments"], r#"{"color":"red","text":"Hello World"}"#);
        assert_eq!(c["choices"][0]["finish_reason"], "tool_calls");
    }

    #[test]
    fn an_in_band_stream_error_is_an_error_event() {
        let mut decoder = GeminiStream::new("g");
        let events = decoder
            .decode(&frame(r#"{"error":{"code":503,"message":"The model is overloaded. Please try again later.","status":"UNAVAILABLE"}}"#))
            .unwrap();
        assert!(matches!(&events[..], [StreamEvent::Error(e)] if e.kind == "server_error"));
    }

    #[test]
    fn an_input_token_count_past_the_maximum_is_a_context_length_refusal() {
        // The body generativelanguage.googleapis.com sends (as quoted in gemini-cli issues).
        let body = br#"{"error":{"code":400,"message":"The input token count (1200293) exceeds the maximum number of tokens allowed (1048576).","status":"INVALID_ARGUMENT"}}"#;
        let error = Gemini.error(StatusCode::BAD_REQUEST, body);
        assert!(error.is_context_length(), "{error:?}");
        assert_eq!(error.kind, "invalid_request_error");
        let other = br#"{"error":{"code":400,"message":"Request contains an invalid argument.","status":"INVALID_ARGUMENT"}}"#;
        let other = Gemini.error(StatusCode::BAD_REQUEST, other);
        assert_eq!(other.code.as_deref(), Some("INVALID_ARGUMENT"));
    }

    #[test]
    fn every_google_error_class_maps_to_openai_and_keeps_its_message() {
        // Status/code pairs: Gemini API "Troubleshooting", backend error codes table
        // (https://ai.google.dev/gemini-api/docs/troubleshooting). Messages as the API sends
        // them (quoted in public reports, e.g. the 503 text in google-gemini issue threads).
        let cases = [
            (
                400,
                "INVALID_ARGUMENT",
                "Invalid JSON payload received. Unknown name \"foo\": Cannot find field.",
                "invalid_request_error",
            ),
            (
                400,
                "FAILED_PRECONDITION",
                "User location is not supported for the API use.",
                "invalid_request_error",
            ),
            (
                403,
                "PERMISSION_DENIED",
                "Method doesn't allow unregistered callers (callers without established identity). Please use API Key or other form of API consumer identity to call this API.",
                "permission_error",
            ),
            (
                404,
                "NOT_FOUND",
                "models/gemini-0.9 is not found for API version v1beta, or is not supported for generateContent.",
                "invalid_request_error",
            ),
            (
                429,
                "RESOURCE_EXHAUSTED",
                "You exceeded your current quota, please check your plan and billing details.",
                "requests",
            ),
            (
                500,
                "INTERNAL",
                "An internal error has occurred. Please retry or report in https://developers.generativeai.google/guide/troubleshooting",
                "server_error",
            ),
            (
                503,
                "UNAVAILABLE",
                "The model is overloaded. Please try again later.",
                "server_error",
            ),
            (504, "DEADLINE_EXCEEDED", "The request timed out. Please try again.", "server_error"),
        ];
        for (status, google, message, kind) in cases {
            let body = json!({"error": {"code": status, "message": message, "status": google}});
            let status = StatusCode::from_u16(status).unwrap();
            let e = Gemini.error(status, body.to_string().as_bytes());
            assert_eq!((e.kind.as_str(), e.code.as_deref()), (kind, Some(google)), "{google}");
            assert_eq!(e.message, message);
            assert_eq!(Gemini.status(status, &e), status);
        }
        let non_json = Gemini.error(StatusCode::BAD_GATEWAY, b"<html>proxy</html>");
        assert_eq!(non_json.kind, "server_error");
        assert!(!non_json.message.contains("proxy"));
    }

    #[test]
    fn a_bad_key_counts_as_the_gateway_credential_failing() {
        // Fixture: the API_KEY_INVALID body from Google's error docs (generateContent API),
        // as quoted at https://www.developersdigest.tech/errors/api/gemini-api.
        let body = br#"{"error": {"code": 400, "message": "API key not valid. Please pass a valid API key.", "status": "INVALID_ARGUMENT", "details": [{"@type": "type.googleapis.com/google.rpc.ErrorInfo", "reason": "API_KEY_INVALID", "domain": "googleapis.com", "metadata": {"service": "generativelanguage.googleapis.com"}}, {"@type": "type.googleapis.com/google.rpc.LocalizedMessage", "locale": "en-US", "message": "API key not valid. Please pass a valid API key."}]}}"#;
        let e = Gemini.error(StatusCode::BAD_REQUEST, body);
        assert_eq!(e.code.as_deref(), Some("API_KEY_INVALID"));
        assert_eq!(Gemini.status(StatusCode::BAD_REQUEST, &e), StatusCode::UNAUTHORIZED);
    }
}
