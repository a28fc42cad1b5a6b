//! Google's Gemini API (`models/{model}:generateContent`, `:streamGenerateContent?alt=sse`):
//! request bodies from the [core] form, and answers, stream frames and errors
//! into it. Gemini is a provider format only (no client sends it), so there is no
//! `parse_request`.
//!
//! Gemini has no tool call ids: a call's id is made from the response's `responseId` and the
//! call's position, and carries Gemini's `thoughtSignature` after [`SIGNATURE_SEPARATOR`]
//! (Gemini 3 refuses a later turn whose calls lack their signatures, and clients round-trip
//! only the id). The signature is written in base64's URL-safe alphabet without padding, so
//! the id stays within the letters, digits, `_` and `-` that Anthropic's tool ids allow.

use std::borrow::Cow;
use std::collections::HashMap;

use serde::{Deserialize, Serialize};
use serde_json::value::RawValue;

use crate::Refusal;
use crate::core::{
    self, Effort, Event, Finish, Format, Image, Part, Reasoning, Role, ToolMode, Usage,
};
use crate::de;

pub mod schema;

/// Between a tool call's id and the thought signature it carries.
pub const SIGNATURE_SEPARATOR: &str = "__thought__";

/// The placeholder Google documents ("Thought signatures") for function calls Gemini did not
/// make (history from another provider before a failover).
pub const SKIP_SIGNATURE: &str = "skip_thought_signature_validator";

/// Gemini's sampling temperature range is 0–2.
const MAX_TEMPERATURE: f64 = 2.0;

// === Request: writing ===

#[derive(Serialize)]
#[serde(rename_all = "camelCase")]
struct OutRequest<'a> {
    #[serde(skip_serializing_if = "Option::is_none")]
    system_instruction: Option<OutContent<'a>>,
    contents: Vec<OutContent<'a>>,
    #[serde(skip_serializing_if = "Vec::is_empty")]
    tools: Vec<OutTools<'a>>,
    #[serde(skip_serializing_if = "Option::is_none")]
    tool_config: Option<OutToolConfig<'a>>,
    #[serde(skip_serializing_if = "OutGenerationConfig::is_empty")]
    generation_config: OutGenerationConfig<'a>,
}

#[derive(Serialize)]
struct OutContent<'a> {
    #[serde(skip_serializing_if = "Option::is_none")]
    role: Option<&'static str>,
    parts: Vec<OutPart<'a>>,
}

#[derive(Serialize)]
#[serde(rename_all = "camelCase")]
enum OutPart<'a> {
    Text(&'a str),
    InlineData {
        #[serde(rename = "mimeType")]
        mime_type: Cow<'a, str>,
        data: &'a str,
    },
    FileData {
        #[serde(rename = "fileUri")]
        file_uri: &'a str,
    },
    FunctionResponse {
        name: &'a str,
        response: OutResponse<'a>,
    },
    /// A call with its signature beside it: `{"functionCall": {...}, "thoughtSignature": ...}`.
    #[serde(untagged)]
    FunctionCall {
        #[serde(rename = "functionCall")]
        function_call: OutCall<'a>,
        #[serde(rename = "thoughtSignature", skip_serializing_if = "Option::is_none")]
        thought_signature: Option<String>,
    },
}

#[derive(Serialize)]
struct OutCall<'a> {
    name: &'a str,
    args: Box<RawValue>,
}

/// A tool result: a JSON object as it is, anything else under `output` (as JSON where it
/// is JSON), an error's text under `error` (Google's FunctionResponse reference names
/// `output` and `error` as the keys it reads).
#[derive(Serialize)]
#[serde(untagged)]
enum OutResponse<'a> {
    Object(Box<RawValue>),
    Output { output: OutValue<'a> },
    Error { error: Cow<'a, str> },
}

#[derive(Serialize)]
#[serde(untagged)]
enum OutValue<'a> {
    Json(Box<RawValue>),
    Text(Cow<'a, str>),
}

impl<'a> OutResponse<'a> {
    fn of(text: Cow<'a, str>, is_error: bool) -> Self {
        if is_error {
            return OutResponse::Error { error: text };
        }
        match serde_json::from_str::<Box<RawValue>>(&text) {
            Ok(json) if json.get().starts_with('{') => OutResponse::Object(json),
            Ok(json) => OutResponse::Output { output: OutValue::Json(json) },
            Err(_) => OutResponse::Output { output: OutValue::Text(text) },
        }
    }
}

#[derive(Serialize)]
#[serde(rename_all = "camelCase")]
struct OutTools<'a> {
    function_declarations: Vec<OutDeclaration<'a>>,
}

#[derive(Serialize)]
#[serde(rename_all = "camelCase")]
struct OutDeclaration<'a> {
    name: &'a str,
    #[serde(skip_serializing_if = "Option::is_none")]
    description: Option<&'a str>,
    /// The schema in Gemini's OpenAPI 3.0 subset ([`schema::sanitize`]: tool schemas are
    /// best effort); none for a function without parameters, since Gemini refuses an
    /// `OBJECT` without properties.
    #[serde(skip_serializing_if = "Option::is_none")]
    parameters: Option<serde_json::Value>,
}

/// A tool's parameters in Gemini's subset, or none when they declare no property.
fn parameters(schema: &core::RawJson) -> Option<serde_json::Value> {
    let schema: serde_json::Value = serde_json::from_str(schema.get()).ok()?;
    if !schema.is_object() {
        return None;
    }
    let sanitized = schema::sanitize(&schema, "#", &mut Vec::new());
    let empty_object = sanitized.get("type").and_then(serde_json::Value::as_str) == Some("OBJECT")
        && sanitized
            .get("properties")
            .and_then(serde_json::Value::as_object)
            .is_none_or(|p| p.is_empty());
    (!empty_object).then_some(sanitized)
}

#[derive(Serialize)]
#[serde(rename_all = "camelCase")]
struct OutToolConfig<'a> {
    function_calling_config: OutCallingConfig<'a>,
}

#[derive(Serialize)]
#[serde(rename_all = "camelCase")]
struct OutCallingConfig<'a> {
    mode: &'static str,
    #[serde(skip_serializing_if = "Option::is_none")]
    allowed_function_names: Option<[&'a str; 1]>,
}

#[derive(Serialize)]
#[serde(rename_all = "camelCase")]
struct OutGenerationConfig<'a> {
    #[serde(skip_serializing_if = "Option::is_none")]
    max_output_tokens: Option<u32>,
    #[serde(skip_serializing_if = "Option::is_none")]
    temperature: Option<f64>,
    #[serde(skip_serializing_if = "Option::is_none")]
    top_p: Option<f64>,
    #[serde(skip_serializing_if = "Option::is_none")]
    top_k: Option<u32>,
    #[serde(skip_serializing_if = "<[_]>::is_empty")]
    stop_sequences: &'a [String],
    #[serde(skip_serializing_if = "Option::is_none")]
    presence_penalty: Option<f64>,
    #[serde(skip_serializing_if = "Option::is_none")]
    frequency_penalty: Option<f64>,
    #[serde(skip_serializing_if = "Option::is_none")]
    seed: Option<i64>,
    #[serde(skip_serializing_if = "Option::is_none")]
    candidate_count: Option<u32>,
    #[serde(skip_serializing_if = "Option::is_none")]
    response_mime_type: Option<&'static str>,
    /// In Gemini's OpenAPI 3.0 subset ([`schema::sanitize`]).
    #[serde(skip_serializing_if = "Option::is_none")]
    response_schema: Option<serde_json::Value>,
    #[serde(skip_serializing_if = "Option::is_none")]
    thinking_config: Option<OutThinking>,
}

impl OutGenerationConfig<'_> {
    /// Nothing set: the config is left out, as Gemini's defaults apply anyway.
    fn is_empty(&self) -> bool {
        self.max_output_tokens.is_none()
            && self.temperature.is_none()
            && self.top_p.is_none()
            && self.top_k.is_none()
            && self.stop_sequences.is_empty()
            && self.presence_penalty.is_none()
            && self.frequency_penalty.is_none()
            && self.seed.is_none()
            && self.candidate_count.is_none()
            && self.response_mime_type.is_none()
            && self.response_schema.is_none()
            && self.thinking_config.is_none()
    }
}

/// The format as `responseMimeType` and `responseSchema`. A strict schema that uses what
/// Gemini's subset cannot express is refused: strict is a promise Gemini could not keep
/// (a schema that is not strict loses what the subset lacks).
fn response_format(
    format: Option<&Format>,
) -> Result<(Option<&'static str>, Option<serde_json::Value>), Refusal> {
    let Some(format) = format else { return Ok((None, None)) };
    let Format::JsonSchema { schema, strict, .. } = format else {
        return Ok((Some("application/json"), None));
    };
    let schema: serde_json::Value = serde_json::from_str(schema.get()).map_err(|e| {
        Refusal::at("response_format.json_schema.schema", format!("not JSON ({e})"))
    })?;
    let mut lost = Vec::new();
    let sanitized = schema::sanitize(&schema, "#", &mut lost);
    if strict.unwrap_or(false) && !lost.is_empty() {
        return Err(Refusal {
            field: "response_format.json_schema".into(),
            message: format!(
                "The Gemini provider cannot enforce this strict JSON schema: {} not in Gemini's schema subset (OpenAPI 3.0 Schema). Drop strict, or simplify the schema.",
                lost.join(", ")
            ),
        });
    }
    Ok((Some("application/json"), Some(sanitized)))
}

#[derive(Serialize)]
#[serde(rename_all = "camelCase")]
struct OutThinking {
    thinking_budget: u32,
}

/// The largest thinking budget every Gemini 2.5 model takes (Flash and Flash-Lite stop at
/// 24,576; Pro at 32,768): a larger budget is clamped to it rather than refused by Gemini.
pub const MAX_THINKING_BUDGET: u32 = 24576;

/// Thinking budgets for an effort, where a request names an effort.
fn budget(effort: Effort) -> u32 {
    match effort {
        Effort::Low => 1024,
        Effort::Medium => 8192,
        Effort::High => 24576,
    }
}

/// A tool call id's own part and its thought signature (back in standard base64), if any.
fn split_id(id: &str) -> (&str, Option<String>) {
    match id.split_once(SIGNATURE_SEPARATOR) {
        Some((id, signature)) => (id, Some(from_url_safe(signature))),
        None => (id, None),
    }
}

fn to_url_safe(signature: &str) -> String {
    signature
        .trim_end_matches('=')
        .chars()
        .map(|c| match c {
            '+' => '-',
            '/' => '_',
            c => c,
        })
        .collect()
}

fn from_url_safe(signature: &str) -> String {
    let mut out: String = signature
        .chars()
        .map(|c| match c {
            '-' => '+',
            '_' => '/',
            c => c,
        })
        .collect();
    while !out.len().is_multiple_of(4) {
        out.push('=');
    }
    out
}

/// The core request as a `GenerateContentRequest` (the model goes in the URL).
///
/// - `system` → `systemInstruction`; user turns → role `user`, assistant → `model`;
/// - images and files: base64 → `inlineData`; audio → `inlineData` (`audio/<format>`); Gemini Files API and `gs://` URIs → `fileData`; other
///   URLs are refused (Gemini does not fetch them, and fetching on the node would make it an
///   open proxy);
/// - tool calls → `functionCall` parts (with their thought signature, or Google's
///   placeholder on a turn's first call that has none); tool results → `functionResponse`
///   parts named after the earlier call with that id (text that is a JSON object as it is,
///   other text under `output`, as JSON where it is JSON; `{"error": text}` for an error
///   result); thinking parts are dropped;
/// - tools → one `functionDeclarations` tool, parameters in Gemini's schema subset;
/// - `max_tokens` (else `default_max_tokens`, else none) → `maxOutputTokens`; `candidates`
///   above 1 → `candidateCount`; `temperature` clamped
///   into 0–2; `top_p`, `top_k`, `stop`, `seed` and the penalties; `format` →
///   `responseMimeType` and `responseSchema` (a strict schema Gemini's subset cannot
///   express is refused as `response_format.json_schema`); `reasoning` → `thinkingConfig.thinkingBudget` (an
///   effort as 1,024, 8,192 or 24,576 tokens, at most [`MAX_THINKING_BUDGET`]); `user` and
///   `parallel` have no Gemini equivalent.
///
/// Refusals name fields in core terms (`messages[i].parts[j]`): the parsers have already
/// checked what a client wrote.
pub fn request_body(
    request: &core::Request,
    default_max_tokens: Option<u32>,
    candidates: Option<u32>,
) -> Result<Vec<u8>, Refusal> {
    let system_instruction = (!request.system.is_empty()).then(|| OutContent {
        role: None,
        parts: request.system.iter().map(|text| OutPart::Text(text)).collect(),
    });
    let mut names: HashMap<&str, &str> = HashMap::new();
    let mut contents: Vec<OutContent> = Vec::with_capacity(request.messages.len());
    for (i, message) in request.messages.iter().enumerate() {
        let mut parts = Vec::with_capacity(message.parts.len());
        let mut first_call = true;
        for (j, part) in message.parts.iter().enumerate() {
            let at = || format!("messages[{i}].parts[{j}]");
            match part {
                Part::Text(text) if text.is_empty() => {}
                Part::Text(text) => parts.push(OutPart::Text(text)),
                Part::Image(image) | Part::File(image) => parts.push(media(image, &at())?),
                Part::Audio { format, data } => parts.push(OutPart::InlineData {
                    mime_type: Cow::Owned(format!("audio/{format}")),
                    data,
                }),
                Part::ToolCall { id, name, arguments } => {
                    names.insert(id, name);
                    let (_, signature) = split_id(id);
                    let thought_signature = match signature {
                        Some(signature) => Some(signature),
                        None if first_call => Some(SKIP_SIGNATURE.to_owned()),
                        None => None,
                    };
                    first_call = false;
                    parts.push(OutPart::FunctionCall {
                        function_call: OutCall { name, args: de::object(arguments) },
                        thought_signature,
                    });
                }
                Part::ToolResult { call_id, content, is_error } => {
                    let name = names.get(call_id.as_str()).ok_or_else(|| {
                        Refusal::at(
                            format!("{}.call_id", at()),
                            format!(
                                "`{call_id}` matches no earlier tool call; Gemini names a tool result by its function"
                            ),
                        )
                    })?;
                    let mut texts = content.iter().filter_map(|p| match p {
                        Part::Text(t) => Some(t.as_str()),
                        _ => None,
                    });
                    let text = match (texts.next(), texts.next()) {
                        (None, _) => Cow::Borrowed(""),
                        (Some(one), None) => Cow::Borrowed(one),
                        (Some(first), Some(second)) => {
                            let mut all = format!("{first}{second}");
                            all.extend(texts);
                            Cow::Owned(all)
                        }
                    };
                    parts.push(OutPart::FunctionResponse {
                        name,
                        response: OutResponse::of(text, *is_error),
                    });
                    // Images a tool returned follow as parts of the same turn.
                    for image in content.iter().filter_map(|p| match p {
                        Part::Image(image) => Some(image),
                        _ => None,
                    }) {
                        parts.push(media(image, &at())?);
                    }
                }
                Part::Thinking { .. } => {}
            }
        }
        // Gemini refuses a content without parts.
        if parts.is_empty() {
            continue;
        }
        let role = match message.role {
            Role::User => "user",
            Role::Assistant => "model",
        };
        match contents.last_mut() {
            Some(last) if last.role == Some(role) => last.parts.extend(parts),
            _ => contents.push(OutContent { role: Some(role), parts }),
        }
    }
    let declarations: Vec<OutDeclaration> = request
        .tools
        .iter()
        .map(|tool| OutDeclaration {
            name: &tool.name,
            description: tool.description.as_deref(),
            parameters: parameters(&tool.parameters),
        })
        .collect();
    let tool_config =
        request.tool_choice.as_ref().filter(|_| !declarations.is_empty()).map(|choice| {
            let (mode, allowed_function_names) = match &choice.mode {
                ToolMode::Auto => ("AUTO", None),
                ToolMode::None => ("NONE", None),
                ToolMode::Any => ("ANY", None),
                ToolMode::Tool(name) => ("ANY", Some([name.as_str()])),
            };
            OutToolConfig {
                function_calling_config: OutCallingConfig { mode, allowed_function_names },
            }
        });
    let (response_mime_type, response_schema) = response_format(request.format.as_ref())?;
    let body = OutRequest {
        system_instruction,
        contents,
        tools: if declarations.is_empty() {
            Vec::new()
        } else {
            vec![OutTools { function_declarations: declarations }]
        },
        tool_config,
        generation_config: OutGenerationConfig {
            max_output_tokens: request.max_tokens.or(default_max_tokens),
            temperature: request.temperature.map(|t| t.clamp(0.0, MAX_TEMPERATURE)),
            top_p: request.top_p,
            top_k: request.top_k,
            stop_sequences: &request.stop,
            presence_penalty: request.presence_penalty,
            frequency_penalty: request.frequency_penalty,
            seed: request.seed,
            candidate_count: candidates.filter(|n| *n > 1),
            response_mime_type,
            response_schema,
            thinking_config: request.reasoning.map(|reasoning| OutThinking {
                thinking_budget: match reasoning {
                    Reasoning::Budget(budget) => budget,
                    Reasoning::Effort(effort) => budget(effort),
                }
                .min(MAX_THINKING_BUDGET),
            }),
        },
    };
    Ok(de::to_vec(&body))
}

fn media<'a>(image: &'a Image, at: &str) -> Result<OutPart<'a>, Refusal> {
    match image {
        Image::Base64 { media_type, data } => Ok(OutPart::InlineData {
            mime_type: Cow::Borrowed(if media_type.is_empty() {
                "application/octet-stream"
            } else {
                media_type
            }),
            data,
        }),
        Image::Url(url)
            if url.starts_with("gs://")
                || url.starts_with("https://generativelanguage.googleapis.com/") =>
        {
            Ok(OutPart::FileData { file_uri: url })
        }
        Image::Url(_) => Err(Refusal::at(
            at,
            "Gemini does not fetch image URLs: send the image as base64 (or a Gemini Files API URI)",
        )),
    }
}

// === Answers: reading ===

#[derive(Deserialize)]
#[serde(rename_all = "camelCase")]
struct WireResponse {
    #[serde(default)]
    candidates: Vec<WireCandidate>,
    prompt_feedback: Option<WireFeedback>,
    usage_metadata: Option<WireUsage>,
    model_version: Option<String>,
    response_id: Option<String>,
    error: Option<WireError>,
}

#[derive(Deserialize)]
#[serde(rename_all = "camelCase")]
struct WireCandidate {
    content: Option<WireContent>,
    finish_reason: Option<String>,
}

#[derive(Deserialize)]
struct WireContent {
    #[serde(default)]
    parts: Vec<WirePart>,
}

#[derive(Deserialize)]
#[serde(rename_all = "camelCase")]
struct WirePart {
    text: Option<String>,
    /// A thought summary, not answer text.
    #[serde(default)]
    thought: bool,
    function_call: Option<WireCall>,
    thought_signature: Option<String>,
}

#[derive(Deserialize)]
struct WireCall {
    id: Option<String>,
    name: String,
    args: Option<Box<RawValue>>,
}

#[derive(Deserialize)]
#[serde(rename_all = "camelCase")]
struct WireFeedback {
    block_reason: Option<String>,
    block_reason_message: Option<String>,
}

#[derive(Deserialize, Clone, Copy, Default)]
#[serde(rename_all = "camelCase", default)]
struct WireUsage {
    prompt_token_count: u64,
    candidates_token_count: u64,
    thoughts_token_count: u64,
    cached_content_token_count: Option<u64>,
}

impl WireUsage {
    /// Thinking tokens are billed as output (as OpenAI counts reasoning tokens); sums
    /// saturate.
    fn core(self) -> Usage {
        Usage {
            input_tokens: self.prompt_token_count,
            output_tokens: self.candidates_token_count.saturating_add(self.thoughts_token_count),
            cache_read_tokens: self.cached_content_token_count,
            cache_write_tokens: None,
        }
    }
}

#[derive(Deserialize)]
struct WireError {
    #[serde(default)]
    code: u16,
    #[serde(default)]
    message: String,
    #[serde(default)]
    status: String,
}

/// An error Google sent: the HTTP code, Google's `status` (`RESOURCE_EXHAUSTED`) and the
/// message.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct ApiError {
    pub code: u16,
    pub status: String,
    pub message: String,
}

/// Google's error envelope `{"error": {"code", "message", "status"}}`, also as the
/// one-element array `streamGenerateContent` sends without `alt=sse`.
pub fn parse_error(body: &[u8]) -> Option<ApiError> {
    #[derive(Deserialize)]
    struct Body {
        error: WireError,
    }
    #[derive(Deserialize)]
    #[serde(untagged)]
    enum OneOrArray {
        // The array first: serde reads a struct from a sequence too (its fields in order),
        // and would take `[{"error": …}]` as a `Body` with an empty error.
        Array([Body; 1]),
        One(Body),
    }
    let body = match serde_json::from_slice::<OneOrArray>(body).ok()? {
        OneOrArray::One(body) | OneOrArray::Array([body]) => body,
    };
    Some(ApiError { code: body.error.code, status: body.error.status, message: body.error.message })
}

/// Gemini's `finishReason` as a finish: a stop with calls made is a `ToolCalls`; the safety
/// family a `ContentFilter`; `MALFORMED_FUNCTION_CALL`, `OTHER` and newer reasons a stop.
pub fn finish(reason: &str, called: bool) -> Finish {
    match reason {
        "MAX_TOKENS" => Finish::Length,
        "SAFETY"
        | "RECITATION"
        | "BLOCKLIST"
        | "PROHIBITED_CONTENT"
        | "SPII"
        | "IMAGE_SAFETY"
        | "IMAGE_PROHIBITED_CONTENT"
        | "IMAGE_RECITATION" => Finish::ContentFilter,
        _ if called => Finish::ToolCalls,
        _ => Finish::Stop,
    }
}

/// The id of the `n`th call of an answer: Gemini's own when it gives one, else made from the
/// response id; with the thought signature after [`SIGNATURE_SEPARATOR`].
fn call_id(own: Option<String>, response_id: &str, n: u32, signature: Option<&str>) -> String {
    let mut id = match own.filter(|id| !id.is_empty()) {
        Some(id) => id,
        None if response_id.is_empty() => format!("call_{n}"),
        None => format!("call_{response_id}_{n}"),
    };
    if let Some(signature) = signature.filter(|s| !s.is_empty()) {
        id.push_str(SIGNATURE_SEPARATOR);
        id.push_str(&to_url_safe(signature));
    }
    id
}

/// A prompt Gemini refused (`promptFeedback.blockReason` and no candidates).
fn blocked(feedback: Option<WireFeedback>) -> Refusal {
    match feedback.and_then(|f| f.block_reason.map(|r| (r, f.block_reason_message))) {
        Some((reason, message)) => Refusal::at(
            "promptFeedback.blockReason",
            match message.filter(|m| !m.is_empty()) {
                Some(message) => format!("Gemini blocked the prompt ({reason}): {message}"),
                None => format!("Gemini blocked the prompt ({reason})"),
            },
        ),
        None => Refusal::at("candidates", "the answer has no candidate"),
    }
}

fn error_refusal(error: WireError) -> Refusal {
    Refusal::at(
        "error",
        format!("the answer is an error ({} {}): {}", error.code, error.status, error.message),
    )
}

/// The parts of a candidate, numbering its calls from `calls`.
fn parts(content: Option<WireContent>, response_id: &str, calls: &mut u32) -> Vec<Part> {
    let mut out = Vec::new();
    for part in content.map(|c| c.parts).unwrap_or_default() {
        if let Some(call) = part.function_call {
            out.push(Part::ToolCall {
                id: call_id(call.id, response_id, *calls, part.thought_signature.as_deref()),
                name: call.name,
                arguments: call.args.map_or_else(|| "{}".to_owned(), de::text),
            });
            *calls += 1;
        } else if let Some(text) = part.text.filter(|t| !t.is_empty()) {
            out.push(if part.thought {
                Part::Thinking { text, signature: part.thought_signature }
            } else {
                Part::Text(text)
            });
        }
    }
    out
}

/// A `GenerateContentResponse` (its first candidate) as a core answer. A blocked prompt is
/// refused as `promptFeedback.blockReason`, an error body as `error`.
pub fn parse_response(body: &[u8]) -> Result<core::Response, Refusal> {
    let wire: WireResponse = de::read(body)?;
    if let Some(error) = wire.error {
        return Err(error_refusal(error));
    }
    let id = wire.response_id.unwrap_or_default();
    let Some(candidate) = wire.candidates.into_iter().next() else {
        return Err(blocked(wire.prompt_feedback));
    };
    let mut calls = 0;
    let parts = parts(candidate.content, &id, &mut calls);
    Ok(core::Response {
        finish: finish(candidate.finish_reason.as_deref().unwrap_or("STOP"), calls > 0),
        id,
        model: wire.model_version.unwrap_or_default(),
        parts,
        usage: wire.usage_metadata.unwrap_or_default().core(),
    })
}

// === Streams: reading ===

/// `streamGenerateContent?alt=sse` frames (each a whole `GenerateContentResponse`) → core
/// events. Each call arrives whole, as a `ToolCallStart` and one `ToolCallDelta`. The usage
/// is emitted once, after the finish. Gemini ends a stream by ending the body: whether the
/// answer was whole is [`Decoder::finished`].
#[derive(Default)]
pub struct Decoder {
    id: Option<String>,
    calls: u32,
    finished: bool,
}

impl Decoder {
    pub fn new() -> Self {
        Self::default()
    }

    /// Whether a `finishReason` has come (the stream is whole if it ends now).
    pub fn finished(&self) -> bool {
        self.finished
    }

    /// The events of one `data:` frame. An error frame is refused as `error`; a blocked
    /// prompt as `promptFeedback.blockReason`.
    pub fn decode(&mut self, data: &[u8]) -> Result<Vec<Event>, Refusal> {
        let wire: WireResponse = de::read(data)?;
        if let Some(error) = wire.error {
            return Err(error_refusal(error));
        }
        let mut events = Vec::new();
        if self.id.is_none() {
            let id = wire.response_id.clone().unwrap_or_default();
            events.push(Event::Start {
                id: id.clone(),
                model: wire.model_version.clone().unwrap_or_default(),
            });
            self.id = Some(id);
        }
        let Some(candidate) = wire.candidates.into_iter().next() else {
            if self.calls == 0 && !self.finished && wire.prompt_feedback.is_some() {
                return Err(blocked(wire.prompt_feedback));
            }
            return Ok(events);
        };
        let id = self.id.clone().unwrap_or_default();
        for part in parts(candidate.content, &id, &mut self.calls) {
            match part {
                Part::Text(text) => events.push(Event::TextDelta(text)),
                Part::Thinking { text, signature } => {
                    events.push(Event::ThinkingDelta { text, signature })
                }
                Part::ToolCall { id, name, arguments } => {
                    let index = self.calls.saturating_sub(1);
                    events.push(Event::ToolCallStart { index, id, name });
                    events.push(Event::ToolCallDelta { index, arguments });
                }
                Part::Image(_) | Part::Audio { .. } | Part::File(_) | Part::ToolResult { .. } => {}
            }
        }
        if let Some(reason) = candidate.finish_reason
            && !self.finished
        {
            self.finished = true;
            events.push(Event::Finish(finish(&reason, self.calls > 0)));
            events.push(Event::Usage(wire.usage_metadata.unwrap_or_default().core()));
        }
        Ok(events)
    }
}

#[cfg(test)]
mod tests {
    use serde_json::{Value, json};

    use super::*;
    use crate::core::{Message, Request, Tool, ToolChoice};

    fn body(bytes: &[u8]) -> Value {
        serde_json::from_slice(bytes).unwrap()
    }

    fn turn(role: Role, parts: Vec<Part>) -> Message {
        Message { role, parts }
    }

    #[test]
    fn a_core_request_becomes_a_generate_content_request() {
        let signature = "CiQB+/a=";
        let signed_id = call_id(None, "resp1", 0, Some(signature));
        assert_eq!(signed_id, "call_resp1_0__thought__CiQB-_a");
        let request = Request {
            system: vec!["be brief".into(), "be kind".into()],
            messages: vec![
                turn(
                    Role::User,
                    vec![
                        Part::Text("look".into()),
                        Part::Image(Image::Base64 {
                            media_type: "image/png".into(),
                            data: "iVBO".into(),
                        }),
                        Part::Image(Image::Url("gs://bucket/a.png".into())),
                    ],
                ),
                turn(
                    Role::Assistant,
                    vec![
                        Part::Thinking { text: "hmm".into(), signature: None },
                        Part::ToolCall {
                            id: signed_id.clone(),
                            name: "get".into(),
                            arguments: r#"{"a":1}"#.into(),
                        },
                        Part::ToolCall {
                            id: "toolu_2".into(),
                            name: "put".into(),
                            arguments: "{}".into(),
                        },
                    ],
                ),
                turn(
                    Role::User,
                    vec![
                        Part::ToolResult {
                            call_id: signed_id,
                            content: vec![Part::Text("one".into())],
                            is_error: false,
                        },
                        Part::ToolResult {
                            call_id: "toolu_2".into(),
                            content: vec![Part::Text("no".into())],
                            is_error: true,
                        },
                    ],
                ),
                turn(
                    Role::Assistant,
                    vec![Part::ToolCall {
                        id: "toolu_3".into(),
                        name: "get".into(),
                        arguments: "{}".into(),
                    }],
                ),
                turn(Role::Assistant, vec![Part::Text(String::new())]),
            ],
            tools: vec![Tool {
                name: "get".into(),
                description: Some("d".into()),
                parameters: core::RawJson::new(
                    r#"{"type":"object","additionalProperties":false}"#.into(),
                )
                .unwrap(),
            }],
            tool_choice: Some(ToolChoice {
                mode: ToolMode::Tool("get".into()),
                parallel: Some(false),
            }),
            temperature: Some(2.5),
            top_k: Some(4),
            stop: vec!["END".into()],
            reasoning: Some(Reasoning::Effort(Effort::Medium)),
            user: Some("u".into()),
            ..Request::default()
        };
        assert_eq!(
            body(&request_body(&request, Some(8192), None).unwrap()),
            json!({
                "systemInstruction": {"parts": [{"text": "be brief"}, {"text": "be kind"}]},
                "contents": [
                    {"role": "user", "parts": [
                        {"text": "look"},
                        {"inlineData": {"mimeType": "image/png", "data": "iVBO"}},
                        {"fileData": {"fileUri": "gs://bucket/a.png"}}]},
                    {"role": "model", "parts": [
                        {"functionCall": {"name": "get", "args": {"a": 1}}, "thoughtSignature": signature},
                        {"functionCall": {"name": "put", "args": {}}}]},
                    {"role": "user", "parts": [
                        {"functionResponse": {"name": "get", "response": {"output": "one"}}},
                        {"functionResponse": {"name": "put", "response": {"error": "no"}}}]},
                    {"role": "model", "parts": [
                        {"functionCall": {"name": "get", "args": {}}, "thoughtSignature": SKIP_SIGNATURE}]}
                ],
                "tools": [{"functionDeclarations": [{"name": "get", "description": "d"}]}],
                "toolConfig": {"functionCallingConfig": {"mode": "ANY", "allowedFunctionNames": ["get"]}},
                "generationConfig": {"maxOutputTokens": 8192, "temperature": 2.0, "topK": 4,
                    "stopSequences": ["END"], "thinkingConfig": {"thinkingBudget": 8192}}
            })
        );
    }

    #[test]
    fn audio_files_json_tool_results_and_candidates_take_gemini_shapes() {
        let request = Request {
            messages: vec![
                turn(
                    Role::User,
                    vec![
                        Part::Audio { format: "wav".into(), data: "UklG".into() },
                        Part::File(Image::Base64 {
                            media_type: "application/pdf".into(),
                            data: "JVBE".into(),
                        }),
                        Part::File(Image::Base64 { media_type: String::new(), data: "AA".into() }),
                    ],
                ),
                turn(
                    Role::Assistant,
                    vec![
                        Part::ToolCall { id: "a".into(), name: "f".into(), arguments: "{}".into() },
                        Part::ToolCall { id: "b".into(), name: "g".into(), arguments: "{}".into() },
                        Part::ToolCall { id: "c".into(), name: "h".into(), arguments: "{}".into() },
                    ],
                ),
                turn(
                    Role::User,
                    vec![
                        Part::ToolResult {
                            call_id: "a".into(),
                            content: vec![Part::Text(r#"{"temp_c": "#.into()), Part::Text("21}".into())],
                            is_error: false,
                        },
                        Part::ToolResult {
                            call_id: "b".into(),
                            content: vec![Part::Text("[1,2]".into())],
                            is_error: false,
                        },
                        Part::ToolResult {
                            call_id: "c".into(),
                            content: vec![Part::Text("sunny".into())],
                            is_error: false,
                        },
                    ],
                ),
            ],
            tools: vec![Tool {
                name: "f".into(),
                description: None,
                parameters: core::RawJson::new(
                    r#"{"type":"object","properties":{"a":{"type":"string"}},"additionalProperties":false}"#.into(),
                )
                .unwrap(),
            }],
            ..Request::default()
        };
        let sent = body(&request_body(&request, None, Some(2)).unwrap());
        assert_eq!(
            sent["contents"][0]["parts"],
            json!([{"inlineData": {"mimeType": "audio/wav", "data": "UklG"}},
                   {"inlineData": {"mimeType": "application/pdf", "data": "JVBE"}},
                   {"inlineData": {"mimeType": "application/octet-stream", "data": "AA"}}])
        );
        assert_eq!(
            sent["contents"][2]["parts"],
            json!([{"functionResponse": {"name": "f", "response": {"temp_c": 21}}},
                   {"functionResponse": {"name": "g", "response": {"output": [1, 2]}}},
                   {"functionResponse": {"name": "h", "response": {"output": "sunny"}}}])
        );
        assert_eq!(
            sent["tools"][0]["functionDeclarations"][0]["parameters"],
            json!({"type": "OBJECT", "properties": {"a": {"type": "STRING"}}})
        );
        assert_eq!(sent["generationConfig"], json!({"candidateCount": 2}), "no maxOutputTokens");
        let one = body(&request_body(&request, None, Some(1)).unwrap());
        assert!(one.get("generationConfig").is_none(), "one candidate is the default");
    }

    #[test]
    fn seed_penalties_and_a_format_go_into_the_generation_config() {
        let schema = r#"{"type":"object","properties":{"a":{"type":["string","null"]}},"additionalProperties":false}"#;
        let request = Request {
            messages: vec![turn(Role::User, vec![Part::Text("hi".into())])],
            seed: Some(7),
            presence_penalty: Some(0.5),
            frequency_penalty: Some(-0.5),
            format: Some(Format::JsonSchema {
                name: "x".into(),
                description: None,
                schema: core::RawJson::new(schema.into()).unwrap(),
                strict: Some(true),
            }),
            ..Request::default()
        };
        assert_eq!(
            body(&request_body(&request, Some(10), None).unwrap())["generationConfig"],
            json!({"maxOutputTokens": 10, "presencePenalty": 0.5, "frequencyPenalty": -0.5,
                "seed": 7, "responseMimeType": "application/json",
                "responseSchema": {"type": "OBJECT",
                    "properties": {"a": {"type": "STRING", "nullable": true}}}})
        );
        let object = Request { format: Some(Format::JsonObject), ..request.clone() };
        let config =
            body(&request_body(&object, Some(10), None).unwrap())["generationConfig"].clone();
        assert_eq!(config["responseMimeType"], "application/json");
        assert!(config.get("responseSchema").is_none());
        let refs = r##"{"type":"object","properties":{"a":{"$ref":"#/$defs/a"}},"$defs":{"a":{"type":"string"}}}"##;
        let strict = |strict| Request {
            format: Some(Format::JsonSchema {
                name: "x".into(),
                description: None,
                schema: core::RawJson::new(refs.into()).unwrap(),
                strict: Some(strict),
            }),
            ..Request::default()
        };
        let refusal = request_body(&strict(true), Some(10), None).unwrap_err();
        assert_eq!(refusal.field, "response_format.json_schema");
        assert!(refusal.message.starts_with("The Gemini provider cannot enforce"), "{refusal:?}");
        assert!(
            request_body(&strict(false), Some(10), None).is_ok(),
            "best effort when not strict"
        );
    }

    #[test]
    fn what_gemini_cannot_take_is_refused_naming_the_core_field() {
        let web = Request {
            messages: vec![turn(
                Role::User,
                vec![Part::Text("a".into()), Part::Image(Image::Url("https://x/a.png".into()))],
            )],
            ..Request::default()
        };
        assert_eq!(request_body(&web, Some(1), None).unwrap_err().field, "messages[0].parts[1]");
        let orphan = Request {
            messages: vec![turn(
                Role::User,
                vec![Part::ToolResult { call_id: "c".into(), content: vec![], is_error: false }],
            )],
            ..Request::default()
        };
        let refusal = request_body(&orphan, Some(1), None).unwrap_err();
        assert_eq!(refusal.field, "messages[0].parts[0].call_id");
        assert!(refusal.message.contains("`messages[0].parts[0].call_id`"));
    }

    #[test]
    fn a_signature_survives_the_round_trip_through_an_id() {
        for signature in ["CiQB+/a=", "abc=", "ab==", "a+b/cd=="] {
            let id = call_id(None, "r", 1, Some(signature));
            assert!(
                id.bytes().all(|b| b.is_ascii_alphanumeric() || b == b'_' || b == b'-'),
                "{id}"
            );
            let (own, back) = split_id(&id);
            assert_eq!(own, "call_r_1");
            let padded = format!(
                "{}{}",
                signature.trim_end_matches('='),
                "=".repeat((4 - signature.trim_end_matches('=').len() % 4) % 4)
            );
            assert_eq!(back.as_deref(), Some(padded.as_str()));
        }
        assert_eq!(split_id("toolu_1"), ("toolu_1", None));
    }

    #[test]
    fn a_response_reads_into_the_core_form() {
        let response = json!({
            "candidates": [{"content": {"role": "model", "parts": [
                {"text": "planning", "thought": true, "thoughtSignature": "sig"},
                {"text": "Let me check."},
                {"functionCall": {"name": "get", "args": {"a": 1}}, "thoughtSignature": "Q+/="},
                {"functionCall": {"id": "own", "name": "put"}}]},
                "finishReason": "STOP", "index": 0}],
            "usageMetadata": {"promptTokenCount": 10, "candidatesTokenCount": 5, "thoughtsTokenCount": 7,
                "cachedContentTokenCount": 4, "totalTokenCount": 22},
            "modelVersion": "gemini-2.5-flash", "responseId": "resp1"
        });
        assert_eq!(
            parse_response(response.to_string().as_bytes()).unwrap(),
            core::Response {
                id: "resp1".into(),
                model: "gemini-2.5-flash".into(),
                parts: vec![
                    Part::Thinking { text: "planning".into(), signature: Some("sig".into()) },
                    Part::Text("Let me check.".into()),
                    Part::ToolCall {
                        id: "call_resp1_0__thought__Q-_".into(),
                        name: "get".into(),
                        arguments: r#"{"a":1}"#.into()
                    },
                    Part::ToolCall { id: "own".into(), name: "put".into(), arguments: "{}".into() },
                ],
                finish: Finish::ToolCalls,
                usage: Usage {
                    input_tokens: 10,
                    output_tokens: 12,
                    cache_read_tokens: Some(4),
                    cache_write_tokens: None
                },
            }
        );
    }

    #[test]
    fn a_blocked_prompt_or_an_error_is_refused_by_name() {
        let blocked = br#"{"promptFeedback": {"blockReason": "SAFETY"}, "usageMetadata": {"promptTokenCount": 3}}"#;
        let refusal = parse_response(blocked).unwrap_err();
        assert_eq!(refusal.field, "promptFeedback.blockReason");
        assert!(refusal.message.contains("SAFETY"));
        assert_eq!(parse_response(br#"{"candidates": []}"#).unwrap_err().field, "candidates");
        let error = br#"{"error": {"code": 429, "message": "Resource has been exhausted", "status": "RESOURCE_EXHAUSTED"}}"#;
        assert_eq!(parse_response(error).unwrap_err().field, "error");
        let expected = ApiError {
            code: 429,
            status: "RESOURCE_EXHAUSTED".into(),
            message: "Resource has been exhausted".into(),
        };
        assert_eq!(parse_error(error), Some(expected.clone()));
        let array = format!("[{}]", String::from_utf8_lossy(error));
        assert_eq!(parse_error(array.as_bytes()), Some(expected));
        assert_eq!(parse_error(b"{}"), None);
    }

    #[test]
    fn finish_reasons_map_to_finishes() {
        assert_eq!(finish("STOP", false), Finish::Stop);
        assert_eq!(finish("STOP", true), Finish::ToolCalls);
        assert_eq!(finish("MAX_TOKENS", true), Finish::Length);
        assert_eq!(finish("SAFETY", false), Finish::ContentFilter);
        assert_eq!(finish("MALFORMED_FUNCTION_CALL", false), Finish::Stop);
    }

    #[test]
    fn a_stream_decodes_into_events_with_usage_after_the_finish() {
        let frames = [
            json!({"candidates": [{"content": {"role": "model", "parts": [{"text": "Hel"}]}}],
                "usageMetadata": {"promptTokenCount": 9}, "modelVersion": "gemini-2.5-flash", "responseId": "r1"}),
            json!({"candidates": [{"content": {"role": "model", "parts": [{"text": "lo"},
                {"functionCall": {"name": "get", "args": {"a": 1}}}]}, "finishReason": "STOP"}],
                "usageMetadata": {"promptTokenCount": 9, "candidatesTokenCount": 3}, "responseId": "r1"}),
            json!({"candidates": [], "usageMetadata": {"promptTokenCount": 9, "candidatesTokenCount": 4}, "responseId": "r1"}),
        ];
        let mut decoder = Decoder::new();
        assert!(!decoder.finished());
        let events: Vec<Event> =
            frames.iter().flat_map(|f| decoder.decode(f.to_string().as_bytes()).unwrap()).collect();
        assert!(decoder.finished());
        assert_eq!(
            events,
            vec![
                Event::Start { id: "r1".into(), model: "gemini-2.5-flash".into() },
                Event::TextDelta("Hel".into()),
                Event::TextDelta("lo".into()),
                Event::ToolCallStart { index: 0, id: "call_r1_0".into(), name: "get".into() },
                Event::ToolCallDelta { index: 0, arguments: r#"{"a":1}"#.into() },
                Event::Finish(Finish::ToolCalls),
                Event::Usage(Usage { input_tokens: 9, output_tokens: 3, ..Usage::default() }),
            ]
        );
        let mut decoder = Decoder::new();
        let error =
            br#"{"error": {"code": 503, "message": "overloaded", "status": "UNAVAILABLE"}}"#;
        assert_eq!(decoder.decode(error).unwrap_err().field, "error");
        let mut decoder = Decoder::new();
        assert_eq!(
            decoder.decode(br#"{"promptFeedback": {"blockReason": "OTHER"}}"#).unwrap_err().field,
            "promptFeedback.blockReason"
        );
    }
}
