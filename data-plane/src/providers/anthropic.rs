//! Anthropic's Messages API (`POST {base_url}/v1/messages`, headers `x-api-key` and
//! `anthropic-version`), translated both ways from and to OpenAI's chat completions.
//!
//! Request (OpenAI → Anthropic):
//! - `system`/`developer` messages, wherever they are, become the top-level `system` (a
//!   string, or text blocks when there are several): Anthropic has no system role in
//!   `messages`.
//! - `max_tokens` is required by Anthropic: the request's `max_tokens`, else its
//!   `max_completion_tokens`, else the catalog model's `max_tokens`, else
//!   [`DEFAULT_MAX_TOKENS`].
//! - `temperature` is capped into Anthropic's 0–1 (1.8 is sent as 1.0; docs/catalog.md,
//!   "Provider kinds"); `top_p` as is;
//!   `stop` (string or array) → `stop_sequences`; `user` → `metadata.user_id`.
//! - function `tools` → `{name, description, input_schema}`; `tool_choice` auto/none/required/
//!   {function} → `{type: auto|none|any|tool}`; `parallel_tool_calls: false` →
//!   `disable_parallel_tool_use`.
//! - assistant `tool_calls` → `tool_use` blocks (the arguments string parsed into `input`);
//!   `tool` messages → `tool_result` blocks in a user message. Consecutive messages of one
//!   role are merged into one turn, so consecutive tool results share one user message and a
//!   user's text after them follows the results, as Anthropic requires.
//! - `image_url` parts: `data:` URLs → a base64 source, http(s) URLs → a url source.
//! - `response_format`: Anthropic has no JSON mode. `json_schema` with `strict: true` is
//!   refused by [`Adapter::body`] (a guarantee we cannot give); `json_object` and
//!   non-strict `json_schema` become an instruction appended to `system` (with the schema),
//!   the best-effort equivalent; clients that need a guarantee ask for `strict`.
//!
//! Refused by [`Adapter::body`] (the client would silently get less than it asked for):
//! `n` > 1, `logprobs: true`, `top_logprobs` > 0, strict `json_schema`, tools that are not
//! functions, content parts other than text and images, the legacy `function` role.
//! Dropped silently (sampling hints and bookkeeping with no Anthropic equivalent, which do
//! not change the answer's shape): `frequency_penalty`, `presence_penalty`, `seed`,
//! `logit_bias`, `service_tier`, `store`, `metadata`, `prediction`, `reasoning_effort`,
//! `modalities: ["text"]`, `stream_options` (usage is always asked for), tools' `strict`,
//! message `name`s.
//!
//! Response (Anthropic → OpenAI): `chat.completion` with text blocks joined as `content`,
//! `tool_use` blocks as `tool_calls` (input serialised back into a JSON string), finish
//! reasons mapped ([`finish_reason`]), usage with cache reads/writes counted as prompt
//! tokens. Thinking blocks are not exposed (chat completions have no place for them).
//! Streams: Anthropic's events become `chat.completion.chunk`s ([`MessageDecoder`]).
//! Errors: `{"type":"error","error":{"type","message"}}` → [`UpstreamError`] with the OpenAI
//! error type as `kind` and Anthropic's own type kept as `code` ([`parse_error`]).

use std::collections::{BTreeMap, HashMap};

use bytes::Bytes;
use http::{StatusCode, header};
use http_body_util::Full;
use serde::{Deserialize, Serialize};
use serde_json::value::RawValue;
use serde_json::{Value, json};

use switchyard_catalog::{Model, Provider};

use super::adapter::{Adapter, StreamDecoder};
use super::error::{CONTEXT_LENGTH_EXCEEDED, CallError, UpstreamError};
use super::secret::Secret;
use super::sse::Frame;
use super::unified::{Completion, Fields, StreamEvent, Usage};
use crate::request::ChatRequest;

pub mod native;

/// Output tokens asked for when neither the request nor the catalog sets a limit. Anthropic
/// requires one; 4096 is the largest every current Claude model accepts.
pub const DEFAULT_MAX_TOKENS: u64 = 4096;

/// The `anthropic-version` header when the provider sets no `api_version` (the only stable
/// version of the Messages API).
pub const DEFAULT_VERSION: &str = "2023-06-01";

/// Anthropic's sampling temperature range is 0–1 (OpenAI's is 0–2).
const MAX_TEMPERATURE: f64 = 1.0;

pub struct Anthropic;

impl Adapter for Anthropic {
    fn body(&self, model: &Model, request: &ChatRequest<'_>) -> Result<Bytes, CallError> {
        if let Some(native) = &request.native {
            return Ok(Bytes::from(native::body(model, native)));
        }
        let unsupported = |message| CallError::Unsupported { message, param: None };
        refusals(request).map_err(unsupported)?;
        let fields = client_fields(request).map_err(unsupported)?;
        // `translate` itself refuses content it cannot carry (audio, files, unknown roles).
        let body = translate(&model.upstream_model, model.max_tokens, &fields, request.stream)
            .map_err(unsupported)?;
        serde_json::to_vec(&body).map(Bytes::from).map_err(CallError::Encode)
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

/// The request features Anthropic has no equivalent for, checked without translating.
fn refusals(request: &ChatRequest<'_>) -> Result<(), String> {
    {
        let get = |name: &str| {
            request
                .passthrough
                .get(name)
                .and_then(|raw| serde_json::from_str::<Value>(raw.get()).ok())
        };
        if let Some(n) = get("n").and_then(|v| v.as_u64())
            && n > 1
        {
            return Err(format!(
                "The provider Anthropic returns one choice per request; `n` = {n} is not supported by this model."
            ));
        }
        if get("logprobs").and_then(|v| v.as_bool()) == Some(true)
            || get("top_logprobs").and_then(|v| v.as_u64()).is_some_and(|n| n > 0)
        {
            return Err("The provider Anthropic does not return log probabilities; `logprobs` is not supported by this model.".into());
        }
        if let Some(format) = get("response_format")
            && format.get("type").and_then(Value::as_str) == Some("json_schema")
            && format.pointer("/json_schema/strict").and_then(Value::as_bool) == Some(true)
        {
            return Err("The provider Anthropic has no strict structured-output mode; `response_format` json_schema with `strict: true` is not supported by this model (send `strict: false` for a best-effort JSON answer).".into());
        }
        if let Some(Value::Array(tools)) = get("tools")
            && let Some(other) = tools
                .iter()
                .filter_map(|t| t.get("type").and_then(Value::as_str))
                .find(|kind| *kind != "function")
        {
            return Err(format!(
                "The provider Anthropic supports only function tools; a `{other}` tool is not supported by this model."
            ));
        }
        Ok(())
    }
}

// === Request ===

/// The Messages API request body (Anthropic API reference, "Create a Message"), borrowing
/// from the client's request where it can.
#[derive(Serialize)]
struct MessagesRequest<'a> {
    model: &'a str,
    max_tokens: u64,
    #[serde(skip_serializing_if = "Option::is_none")]
    system: Option<System>,
    messages: Vec<Value>,
    #[serde(skip_serializing_if = "Option::is_none")]
    temperature: Option<f64>,
    #[serde(skip_serializing_if = "Option::is_none")]
    top_p: Option<f64>,
    #[serde(skip_serializing_if = "Option::is_none")]
    stop_sequences: Option<StopSequences<'a>>,
    #[serde(skip_serializing_if = "Option::is_none")]
    metadata: Option<Metadata<'a>>,
    #[serde(skip_serializing_if = "Option::is_none")]
    tools: Option<Vec<Value>>,
    #[serde(skip_serializing_if = "Option::is_none")]
    tool_choice: Option<ToolChoice<'a>>,
    #[serde(skip_serializing_if = "std::ops::Not::not")]
    stream: bool,
}

/// `system`: a string, or text blocks when the client sent several system messages.
#[derive(Serialize)]
#[serde(untagged)]
enum System {
    Text(String),
    Blocks(Vec<TextBlock>),
}

#[derive(Serialize)]
struct TextBlock {
    #[serde(rename = "type")]
    kind: &'static str,
    text: String,
}

/// OpenAI's `stop` is a string or an array; Anthropic's `stop_sequences` always an array.
#[derive(Serialize)]
#[serde(untagged)]
enum StopSequences<'a> {
    One([&'a str; 1]),
    Many(&'a [Value]),
}

#[derive(Serialize)]
struct Metadata<'a> {
    user_id: &'a str,
}

#[derive(Serialize)]
struct ToolChoice<'a> {
    /// `auto`, `none`, `any` (OpenAI's `required`) or `tool` (a named function).
    #[serde(rename = "type")]
    kind: &'static str,
    #[serde(skip_serializing_if = "Option::is_none")]
    name: Option<&'a str>,
    #[serde(skip_serializing_if = "std::ops::Not::not")]
    disable_parallel_tool_use: bool,
}

/// The client's top-level fields as JSON values, keyed by name.
type ClientFields<'a> = BTreeMap<&'a str, Value>;

fn client_fields<'a>(request: &'a ChatRequest<'_>) -> Result<ClientFields<'a>, String> {
    request
        .passthrough
        .iter()
        .map(|(k, raw)| {
            serde_json::from_str::<Value>(raw.get())
                .map(|v| (k.as_ref(), v))
                .map_err(|e| format!("{k}: {e}"))
        })
        .collect()
}

/// The Anthropic request body for an OpenAI-shaped request.
fn translate<'a>(
    upstream_model: &'a str,
    model_max_tokens: Option<u32>,
    fields: &'a ClientFields<'_>,
    stream: bool,
) -> Result<MessagesRequest<'a>, String> {
    let get = |name: &str| fields.get(name).filter(|v| !v.is_null());

    let max_tokens = get("max_tokens")
        .or_else(|| get("max_completion_tokens"))
        .and_then(Value::as_u64)
        .or(model_max_tokens.map(u64::from))
        .unwrap_or(DEFAULT_MAX_TOKENS);

    let (mut system, messages) = match get("messages") {
        Some(Value::Array(messages)) => messages_to_anthropic(messages)?,
        _ => return Err("messages must be an array".into()),
    };
    if let Some(instruction) = get("response_format").and_then(json_instruction) {
        system.push(instruction);
    }
    let system = match system.len() {
        0 => None,
        1 => Some(System::Text(system.remove(0))),
        _ => Some(System::Blocks(
            system.into_iter().map(|text| TextBlock { kind: "text", text }).collect(),
        )),
    };

    let stop_sequences = match get("stop") {
        Some(Value::String(s)) => Some(StopSequences::One([s.as_str()])),
        Some(Value::Array(list)) if !list.is_empty() => Some(StopSequences::Many(list)),
        _ => None,
    };
    let metadata = match get("user") {
        Some(Value::String(user)) => Some(Metadata { user_id: user }),
        _ => None,
    };
    let tools = match get("tools") {
        Some(Value::Array(tools)) if !tools.is_empty() => {
            Some(tools.iter().map(tool_to_anthropic).collect::<Result<Vec<_>, _>>()?)
        }
        _ => None,
    };
    let mut tool_choice = None;
    if tools.is_some() {
        let choice = |kind| ToolChoice { kind, name: None, disable_parallel_tool_use: false };
        tool_choice = match get("tool_choice") {
            None => None,
            Some(Value::String(s)) => Some(match s.as_str() {
                "auto" => choice("auto"),
                "none" => choice("none"),
                "required" => choice("any"),
                other => return Err(format!("tool_choice: unknown value {other:?}")),
            }),
            Some(v) => match v.pointer("/function/name").and_then(Value::as_str) {
                Some(name) => Some(ToolChoice { name: Some(name), ..choice("tool") }),
                None => return Err("tool_choice must be auto, none, required or a function".into()),
            },
        };
        if get("parallel_tool_calls").and_then(Value::as_bool) == Some(false) {
            let c = tool_choice.get_or_insert_with(|| choice("auto"));
            c.disable_parallel_tool_use = c.kind != "none";
        }
    }
    Ok(MessagesRequest {
        model: upstream_model,
        max_tokens,
        system,
        messages,
        temperature: get("temperature")
            .and_then(Value::as_f64)
            .map(|t| t.clamp(0.0, MAX_TEMPERATURE)),
        top_p: get("top_p").and_then(Value::as_f64),
        stop_sequences,
        metadata,
        tools,
        tool_choice,
        stream,
    })
}

/// The system instruction that stands in for OpenAI's JSON modes.
fn json_instruction(format: &Value) -> Option<String> {
    match format.get("type").and_then(Value::as_str)? {
        "json_object" => Some(
            "Respond with a single valid JSON object and nothing else: no prose, no code fences."
                .into(),
        ),
        "json_schema" => {
            let spec = format.get("json_schema");
            let schema = spec.and_then(|s| s.get("schema")).cloned().unwrap_or(json!({}));
            let name = spec.and_then(|s| s.get("name")).and_then(Value::as_str);
            let named = name.map(|n| format!(" (`{n}`)")).unwrap_or_default();
            Some(format!(
                "Respond with a single valid JSON value and nothing else (no prose, no code fences) that conforms to this JSON Schema{named}: {schema}"
            ))
        }
        _ => None,
    }
}

/// System texts, and the conversation as Anthropic turns.
fn messages_to_anthropic(messages: &[Value]) -> Result<(Vec<String>, Vec<Value>), String> {
    let mut system = Vec::new();
    let mut turns: Vec<(&'static str, Vec<Value>)> = Vec::new();
    for (i, message) in messages.iter().enumerate() {
        let role = message.get("role").and_then(Value::as_str).unwrap_or_default();
        let content = message.get("content").filter(|c| !c.is_null());
        let (role, blocks) = match role {
            "system" | "developer" => {
                let text = text_of(content).map_err(|e| format!("messages[{i}].content: {e}"))?;
                if !text.is_empty() {
                    system.push(text);
                }
                continue;
            }
            "user" => {
                ("user", user_blocks(content).map_err(|e| format!("messages[{i}].content: {e}"))?)
            }
            "assistant" => {
                ("assistant", assistant_blocks(message).map_err(|e| format!("messages[{i}]: {e}"))?)
            }
            "tool" => {
                let id = message.get("tool_call_id").and_then(Value::as_str).unwrap_or_default();
                let result = match content {
                    Some(Value::String(s)) => Value::String(s.clone()),
                    Some(Value::Array(_)) => Value::String(
                        text_of(content).map_err(|e| format!("messages[{i}].content: {e}"))?,
                    ),
                    _ => Value::String(String::new()),
                };
                ("user", vec![json!({"type": "tool_result", "tool_use_id": id, "content": result})])
            }
            other => {
                return Err(format!(
                    "messages[{i}].role {other:?} is not supported by the provider Anthropic"
                ));
            }
        };
        if blocks.is_empty() {
            continue;
        }
        // Anthropic wants one turn per role change: tool results of one assistant turn in one
        // user message, before any text the user adds.
        match turns.last_mut() {
            Some((last, existing)) if *last == role => existing.extend(blocks),
            _ => turns.push((role, blocks)),
        }
    }
    let messages = turns
        .into_iter()
        .map(|(role, blocks)| {
            // A lone text block is sent as the plain string the client wrote.
            let content = match blocks.as_slice() {
                [only] if only["type"] == "text" => only["text"].clone(),
                _ => Value::Array(blocks),
            };
            json!({"role": role, "content": content})
        })
        .collect();
    Ok((system, messages))
}

/// The text of a string content or of an array of text parts.
fn text_of(content: Option<&Value>) -> Result<String, String> {
    match content {
        None => Ok(String::new()),
        Some(Value::String(s)) => Ok(s.clone()),
        Some(Value::Array(parts)) => {
            let mut text = String::new();
            for part in parts {
                match part.get("type").and_then(Value::as_str) {
                    Some("text") => text.push_str(part["text"].as_str().unwrap_or_default()),
                    other => return Err(format!("a {other:?} part is not supported here")),
                }
            }
            Ok(text)
        }
        Some(_) => Err("must be a string or an array of parts".into()),
    }
}

fn user_blocks(content: Option<&Value>) -> Result<Vec<Value>, String> {
    match content {
        None => Ok(Vec::new()),
        Some(Value::String(s)) => Ok(vec![json!({"type": "text", "text": s})]),
        Some(Value::Array(parts)) => parts.iter().map(part_to_block).collect(),
        Some(_) => Err("must be a string or an array of parts".into()),
    }
}

fn part_to_block(part: &Value) -> Result<Value, String> {
    match part.get("type").and_then(Value::as_str) {
        Some("text") => {
            Ok(json!({"type": "text", "text": part["text"].as_str().unwrap_or_default()}))
        }
        Some("image_url") => {
            let url = part
                .pointer("/image_url/url")
                .or_else(|| part.get("image_url"))
                .and_then(Value::as_str)
                .ok_or("an image_url part needs image_url.url")?;
            image_block(url)
        }
        other => {
            Err(format!("a {other:?} content part is not supported by the provider Anthropic"))
        }
    }
}

/// `data:image/png;base64,…` → a base64 source; `https://…` → a url source.
fn image_block(url: &str) -> Result<Value, String> {
    if let Some(rest) = url.strip_prefix("data:") {
        let (meta, data) = rest.split_once(',').ok_or("a data: URL without data")?;
        let media_type = meta.strip_suffix(";base64").ok_or("image data: URLs must be base64")?;
        return Ok(
            json!({"type": "image", "source": {"type": "base64", "media_type": media_type, "data": data}}),
        );
    }
    if url.starts_with("https://") || url.starts_with("http://") {
        return Ok(json!({"type": "image", "source": {"type": "url", "url": url}}));
    }
    Err("image URLs must be data: or http(s): URLs".into())
}

fn assistant_blocks(message: &Value) -> Result<Vec<Value>, String> {
    let content = message.get("content").filter(|c| !c.is_null());
    let mut blocks = Vec::new();
    let text = text_of(content).map_err(|e| format!("content: {e}"))?;
    if !text.is_empty() {
        blocks.push(json!({"type": "text", "text": text}));
    }
    if let Some(Value::Array(calls)) = message.get("tool_calls") {
        for (j, call) in calls.iter().enumerate() {
            let arguments =
                call.pointer("/function/arguments").and_then(Value::as_str).unwrap_or("");
            let input: Value = if arguments.trim().is_empty() {
                json!({})
            } else {
                serde_json::from_str(arguments)
                    .map_err(|e| format!("tool_calls[{j}].function.arguments is not JSON: {e}"))?
            };
            blocks.push(json!({
                "type": "tool_use",
                "id": call.get("id").and_then(Value::as_str).unwrap_or_default(),
                "name": call.pointer("/function/name").and_then(Value::as_str).unwrap_or_default(),
                "input": input,
            }));
        }
    }
    Ok(blocks)
}

fn tool_to_anthropic(tool: &Value) -> Result<Value, String> {
    let function = tool.get("function").ok_or("a tool needs a function")?;
    let name =
        function.get("name").and_then(Value::as_str).ok_or("a tool function needs a name")?;
    let mut out = json!({
        "name": name,
        // Anthropic requires a schema; a function without parameters takes an empty object.
        "input_schema": function
            .get("parameters")
            .filter(|p| !p.is_null())
            .cloned()
            .unwrap_or_else(|| json!({"type": "object", "properties": {}})),
    });
    if let Some(description) = function.get("description").and_then(Value::as_str) {
        out["description"] = Value::String(description.to_owned());
    }
    Ok(out)
}

// === Response ===

#[derive(Deserialize)]
struct WireMessage {
    #[serde(default)]
    id: String,
    #[serde(default)]
    model: String,
    #[serde(default)]
    content: Vec<WireBlock>,
    #[serde(default)]
    stop_reason: Option<String>,
    #[serde(default)]
    usage: WireUsage,
}

#[derive(Deserialize)]
struct WireBlock {
    #[serde(rename = "type")]
    kind: String,
    #[serde(default)]
    text: Option<String>,
    #[serde(default)]
    id: Option<String>,
    #[serde(default)]
    name: Option<String>,
    #[serde(default)]
    input: Option<Value>,
}

#[derive(Clone, Copy, Default, Deserialize)]
struct WireUsage {
    #[serde(default)]
    input_tokens: Option<u64>,
    #[serde(default)]
    output_tokens: Option<u64>,
    #[serde(default)]
    cache_creation_input_tokens: Option<u64>,
    #[serde(default)]
    cache_read_input_tokens: Option<u64>,
}

impl WireUsage {
    /// Later reports (a stream's `message_delta`) replace what they carry.
    fn update(&mut self, later: WireUsage) {
        self.input_tokens = later.input_tokens.or(self.input_tokens);
        self.output_tokens = later.output_tokens.or(self.output_tokens);
        self.cache_creation_input_tokens =
            later.cache_creation_input_tokens.or(self.cache_creation_input_tokens);
        self.cache_read_input_tokens =
            later.cache_read_input_tokens.or(self.cache_read_input_tokens);
    }

    /// Cache writes and reads are input too: billed as prompt tokens. Sums saturate: the
    /// counts are the upstream's, and no count it sends may wrap or panic the node (found by
    /// the `anthropic` fuzz target, docs/fuzzing.md).
    fn usage(&self) -> Usage {
        Usage {
            prompt_tokens: self
                .input_tokens
                .unwrap_or(0)
                .saturating_add(self.cache_creation_input_tokens.unwrap_or(0))
                .saturating_add(self.cache_read_input_tokens.unwrap_or(0)),
            completion_tokens: self.output_tokens.unwrap_or(0),
        }
    }

    fn openai(&self) -> Value {
        let u = self.usage();
        json!({
            "prompt_tokens": u.prompt_tokens,
            "completion_tokens": u.completion_tokens,
            "total_tokens": u.prompt_tokens.saturating_add(u.completion_tokens),
            "prompt_tokens_details": {"cached_tokens": self.cache_read_input_tokens.unwrap_or(0)},
        })
    }
}

/// Anthropic's `stop_reason` as OpenAI's `finish_reason`.
pub fn finish_reason(stop_reason: Option<&str>) -> &'static str {
    match stop_reason {
        Some("max_tokens" | "model_context_window_exceeded") => "length",
        Some("tool_use") => "tool_calls",
        Some("refusal") => "content_filter",
        // end_turn, stop_sequence, pause_turn, and anything newer.
        _ => "stop",
    }
}

fn completion(body: &[u8]) -> Result<Completion, CallError> {
    let value: Value =
        serde_json::from_slice(body).map_err(|e| CallError::Malformed(e.to_string()))?;
    // An error object in a 200 (seen from proxies in front of Anthropic) is that error.
    if value.get("type").and_then(Value::as_str) == Some("error") {
        let error = parse_error(StatusCode::OK, body);
        let status = error.code.as_deref().map_or(StatusCode::INTERNAL_SERVER_ERROR, status_of);
        return Err(CallError::http(status, error));
    }
    if value.get("content").is_none() {
        return Err(CallError::Malformed("no `content` in the message".into()));
    }
    let message: WireMessage =
        serde_json::from_value(value).map_err(|e| CallError::Malformed(e.to_string()))?;
    let mut text = String::new();
    let mut tool_calls = Vec::new();
    for block in &message.content {
        match block.kind.as_str() {
            "text" => text.push_str(block.text.as_deref().unwrap_or_default()),
            "tool_use" => tool_calls.push(json!({
                "id": block.id.as_deref().unwrap_or_default(),
                "type": "function",
                "function": {
                    "name": block.name.as_deref().unwrap_or_default(),
                    "arguments": arguments(block.input.as_ref()),
                },
            })),
            // Thinking and server-tool blocks have no place in a chat completion.
            _ => {}
        }
    }
    let mut reply = json!({"role": "assistant", "content": null, "refusal": null});
    if !text.is_empty() || tool_calls.is_empty() {
        reply["content"] = Value::String(text);
    }
    if !tool_calls.is_empty() {
        reply["tool_calls"] = Value::Array(tool_calls);
    }
    let fields = [
        ("id", json!(message.id)),
        ("object", json!("chat.completion")),
        ("created", json!(switchyard_time::now_secs())),
        ("model", json!(message.model)),
        (
            "choices",
            json!([{
                "index": 0,
                "message": reply,
                "logprobs": null,
                "finish_reason": finish_reason(message.stop_reason.as_deref()),
            }]),
        ),
        ("usage", message.usage.openai()),
    ];
    Ok(Completion::new(Fields::Map(raw_fields(fields)?), message.usage.usage()))
}

/// A tool's input as OpenAI's arguments string.
fn arguments(input: Option<&Value>) -> String {
    match input {
        None | Some(Value::Null) => "{}".to_owned(),
        Some(v) => v.to_string(),
    }
}

fn raw_fields<const N: usize>(
    fields: [(&str, Value); N],
) -> Result<BTreeMap<String, Box<RawValue>>, CallError> {
    fields
        .into_iter()
        .map(|(k, v)| {
            serde_json::value::to_raw_value(&v)
                .map(|raw| (k.to_owned(), raw))
                .map_err(|e| CallError::Malformed(e.to_string()))
        })
        .collect()
}

// === Errors ===

#[derive(Deserialize)]
struct ErrorBody {
    error: ErrorDetail,
}

#[derive(Deserialize)]
struct ErrorDetail {
    #[serde(rename = "type", default)]
    kind: Option<String>,
    #[serde(default)]
    message: String,
}

/// Anthropic's error body `{"type":"error","error":{"type","message"},"request_id"}` (API
/// reference, "Errors"). `kind` is the OpenAI error type the same failure has there (what
/// OpenAI clients and the in-band classifier understand); `code` keeps Anthropic's type.
/// Anything else becomes a generic message for its status (raw bodies are not shown).
pub fn parse_error(status: StatusCode, body: &[u8]) -> UpstreamError {
    match serde_json::from_slice::<ErrorBody>(body) {
        Ok(ErrorBody { error }) => {
            let anthropic = error.kind.unwrap_or_default();
            // Anthropic's refusal of a prompt longer than the model's context is a 400
            // `invalid_request_error` whose message says "prompt is too long: N tokens > M
            // maximum" (its API reference, "Errors"; the messages quoted by SDK users).
            let code = if anthropic == "invalid_request_error"
                && error.message.to_ascii_lowercase().starts_with("prompt is too long")
            {
                Some(CONTEXT_LENGTH_EXCEEDED.to_owned())
            } else {
                (!anthropic.is_empty()).then_some(anthropic.clone())
            };
            UpstreamError {
                kind: openai_kind(&anthropic, status).to_owned(),
                message: error.message,
                code,
                param: None,
            }
        }
        Err(_) => UpstreamError {
            message: format!("The upstream provider returned HTTP {}.", status.as_u16()),
            kind: openai_kind("", status).to_owned(),
            code: None,
            param: None,
        },
    }
}

/// Anthropic's error types (API reference, "Errors": 400 invalid_request_error, 401
/// authentication_error, 403 permission_error, 404 not_found_error, 413 request_too_large,
/// 429 rate_limit_error, 500 api_error, 529 overloaded_error) as OpenAI's. Authentication
/// and permission keep their names: they are the gateway's credential failing, and must not
/// read as the client's `invalid_request_error`.
fn openai_kind(anthropic: &str, status: StatusCode) -> &'static str {
    match anthropic {
        "invalid_request_error" | "not_found_error" | "request_too_large" => {
            "invalid_request_error"
        }
        "authentication_error" => "authentication_error",
        "permission_error" => "permission_error",
        "rate_limit_error" => "rate_limit_error",
        "api_error" | "overloaded_error" | "timeout_error" => "server_error",
        _ if status.is_server_error() || status == StatusCode::OK => "server_error",
        _ if status == StatusCode::TOO_MANY_REQUESTS => "rate_limit_error",
        _ => "invalid_request_error",
    }
}

/// The HTTP status Anthropic sends with an error type, for errors that arrive in a 200.
fn status_of(anthropic: &str) -> StatusCode {
    let code = match anthropic {
        "invalid_request_error" => 400,
        "authentication_error" => 401,
        "permission_error" => 403,
        "not_found_error" => 404,
        "request_too_large" => 413,
        "rate_limit_error" => 429,
        "overloaded_error" => 529,
        _ => 500,
    };
    StatusCode::from_u16(code).unwrap_or(StatusCode::INTERNAL_SERVER_ERROR)
}

// === Streaming ===

/// Anthropic's stream events as OpenAI chunks. Content blocks are announced by index and
/// referred to by it afterwards, so the decoder remembers which blocks are tool calls and
/// which OpenAI `tool_calls[].index` each got.
pub struct MessageDecoder {
    id: String,
    model: String,
    created: u64,
    usage: WireUsage,
    /// Anthropic content-block index → OpenAI tool-call index.
    tools: HashMap<u64, u64>,
    role_sent: bool,
    /// `message_delta` brought the stop reason: the answer is whole.
    stopped: bool,
}

#[derive(Deserialize)]
struct WireEvent {
    #[serde(rename = "type", default)]
    kind: Option<String>,
    #[serde(default)]
    message: Option<StartMessage>,
    #[serde(default)]
    index: Option<u64>,
    #[serde(default)]
    content_block: Option<WireBlock>,
    #[serde(default)]
    delta: Option<WireDelta>,
    #[serde(default)]
    usage: Option<WireUsage>,
}

#[derive(Deserialize)]
struct StartMessage {
    #[serde(default)]
    id: Option<String>,
    #[serde(default)]
    model: Option<String>,
    #[serde(default)]
    usage: Option<WireUsage>,
}

#[derive(Deserialize)]
struct WireDelta {
    #[serde(rename = "type", default)]
    kind: Option<String>,
    #[serde(default)]
    text: Option<String>,
    #[serde(default)]
    partial_json: Option<String>,
    #[serde(default)]
    stop_reason: Option<String>,
}

impl MessageDecoder {
    pub fn new(upstream_model: &str) -> Self {
        Self {
            id: String::new(),
            model: upstream_model.to_owned(),
            created: switchyard_time::now_secs(),
            usage: WireUsage::default(),
            tools: HashMap::new(),
            role_sent: false,
            stopped: false,
        }
    }

    /// One chunk with a single choice whose delta is `delta`.
    fn chunk(
        &mut self,
        mut delta: Value,
        finish: Option<&str>,
        commits: bool,
    ) -> Result<StreamEvent, String> {
        if !self.role_sent {
            // OpenAI's first chunk names the role; clients (the SDKs' stream accumulators)
            // read it from there.
            self.role_sent = true;
            delta["role"] = json!("assistant");
        }
        let fields = [
            ("id", json!(self.id)),
            ("object", json!("chat.completion.chunk")),
            ("created", json!(self.created)),
            ("model", json!(self.model)),
            (
                "choices",
                json!([{"index": 0, "delta": delta, "logprobs": null, "finish_reason": finish}]),
            ),
        ];
        let fields = raw_fields(fields).map_err(|e| e.to_string())?;
        let finished = self.stopped;
        Ok(StreamEvent::Chunk { fields, commits, usage: None, usage_only: false, finished })
    }

    fn usage_chunk(&self) -> Result<StreamEvent, String> {
        let fields = [
            ("id", json!(self.id)),
            ("object", json!("chat.completion.chunk")),
            ("created", json!(self.created)),
            ("model", json!(self.model)),
            ("choices", json!([])),
            ("usage", self.usage.openai()),
        ];
        let fields = raw_fields(fields).map_err(|e| e.to_string())?;
        Ok(StreamEvent::Chunk {
            fields,
            commits: false,
            usage: Some(self.usage.usage()),
            usage_only: true,
            finished: self.stopped,
        })
    }
}

impl StreamDecoder for MessageDecoder {
    fn decode(&mut self, frame: &Frame) -> Result<Vec<StreamEvent>, String> {
        let event: WireEvent = serde_json::from_str(frame.data.trim())
            .map_err(|e| format!("an event is not JSON: {e}"))?;
        let kind = event.kind.as_deref().or(frame.event.as_deref()).unwrap_or_default();
        Ok(match kind {
            "message_start" => {
                if let Some(message) = event.message {
                    if let Some(id) = message.id {
                        self.id = id;
                    }
                    if let Some(model) = message.model {
                        self.model = model;
                    }
                    if let Some(usage) = message.usage {
                        self.usage.update(usage);
                    }
                }
                vec![self.chunk(json!({"content": ""}), None, false)?]
            }
            "content_block_start" => {
                let index = event.index.unwrap_or(0);
                match event.content_block {
                    Some(block) if block.kind == "tool_use" => {
                        let ordinal = self.tools.len() as u64;
                        self.tools.insert(index, ordinal);
                        let call = json!({
                            "index": ordinal,
                            "id": block.id.unwrap_or_default(),
                            "type": "function",
                            "function": {"name": block.name.unwrap_or_default(), "arguments": ""},
                        });
                        vec![self.chunk(json!({"tool_calls": [call]}), None, true)?]
                    }
                    Some(block) if block.kind == "text" => {
                        match block.text.filter(|t| !t.is_empty()) {
                            Some(text) => vec![self.chunk(json!({"content": text}), None, true)?],
                            None => Vec::new(),
                        }
                    }
                    _ => Vec::new(),
                }
            }
            "content_block_delta" => {
                let index = event.index.unwrap_or(0);
                let Some(delta) = event.delta else { return Ok(Vec::new()) };
                match delta.kind.as_deref() {
                    Some("text_delta") => match delta.text.filter(|t| !t.is_empty()) {
                        Some(text) => vec![self.chunk(json!({"content": text}), None, true)?],
                        None => Vec::new(),
                    },
                    Some("input_json_delta") => {
                        let partial = delta.partial_json.unwrap_or_default();
                        match self.tools.get(&index).copied() {
                            Some(ordinal) if !partial.is_empty() => {
                                let call =
                                    json!({"index": ordinal, "function": {"arguments": partial}});
                                vec![self.chunk(json!({"tool_calls": [call]}), None, true)?]
                            }
                            _ => Vec::new(),
                        }
                    }
                    // thinking, signature and citation deltas have no chat-completion form.
                    _ => Vec::new(),
                }
            }
            "message_delta" => {
                if let Some(usage) = event.usage {
                    self.usage.update(usage);
                }
                match event.delta.and_then(|d| d.stop_reason) {
                    Some(reason) => {
                        self.stopped = true;
                        vec![self.chunk(json!({}), Some(finish_reason(Some(&reason))), true)?]
                    }
                    None => Vec::new(),
                }
            }
            "message_stop" => vec![self.usage_chunk()?, StreamEvent::Done],
            "error" => vec![StreamEvent::Error(parse_error(StatusCode::OK, frame.data.as_bytes()))],
            // ping, content_block_stop, and event types added later (Anthropic's streaming
            // docs ask clients to ignore unknown events).
            _ => Vec::new(),
        })
    }

    /// `message_stop` did not come after the stop reason: what it brings, the usage chunk
    /// and the end.
    fn close(&mut self) -> Vec<StreamEvent> {
        self.usage_chunk().into_iter().chain([StreamEvent::Done]).collect()
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::failure::{Failure, Verdict, classify};
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
        assert_eq!(refused(json!({"n": 1, "logprobs": false, "seed": 1, "user": "u"})), None);
        assert_eq!(
            sent(json!({"messages": msgs, "user": "u-1"}))["metadata"],
            json!({"user_id": "u-1"})
        );
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
        assert_eq!(finish_reason(Some("end_turn")), "stop");
        assert_eq!(finish_reason(Some("stop_sequence")), "stop");
        assert_eq!(finish_reason(Some("max_tokens")), "length");
        assert_eq!(finish_reason(Some("tool_use")), "tool_calls");
        assert_eq!(finish_reason(Some("refusal")), "content_filter");
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
