//! OpenAI's chat-completions wire format: the request fields the simulator reads, the
//! `chat.completion` body, `chat.completion.chunk` SSE frames, and error bodies.
//!
//! Shapes follow what api.openai.com sends (and the openai-python/openai-node types):
//! - completion and chunk bodies: the `stream: False` / `stream: True` samples in
//!   lanqian528/openai_format_proxy `response.md` (role chunk with `content: ""`, content
//!   chunks with only `content` in the delta, a final chunk with `delta: {}` and
//!   `finish_reason: "stop"`, `logprobs: null` throughout), and OpenAI's documented
//!   `stream_options.include_usage`: every chunk then carries `"usage": null` and one extra
//!   chunk with `"choices": []` carries the usage before `data: [DONE]`.
//! - error bodies: the `{"error": {"message", "type", "param", "code"}}` envelope, with the
//!   per-status texts cited at [`status_error`].
//!
//! Nothing here knows about sockets or scripts (the HTTP handling is `server::openai_http`), so
//! `anthropic.rs`/`gemini.rs` can sit beside it.

use std::borrow::Cow;

use bytes::Bytes;
use serde::{Deserialize, Serialize};
use serde_json::Value;

use crate::stream::StreamWire;
use crate::tool::{ToolCall, placeholder_input};

/// A fixed fingerprint: real responses carry one, and clients sometimes log or require it.
const SYSTEM_FINGERPRINT: &str = "fp_5151sim0d1";

// === Requests ===

/// The parts of a chat-completions request the simulator acts on.
#[derive(Debug, Clone, PartialEq)]
pub struct ChatRequest {
    pub model: String,
    pub stream: bool,
    pub include_usage: bool,
    /// Deterministic stand-in for a tokenizer: whitespace-separated words in all messages.
    pub prompt_tokens: u64,
    /// The text of a last message from the assistant: the start of the answer the client
    /// asks the model to continue (a prefill).
    pub prefill: Option<String>,
    /// The tool a reply with `call_tools` calls, if the request lets the model call one.
    pub tool_call: Option<ToolCall>,
}

#[derive(Deserialize)]
struct RawRequest<'a> {
    #[serde(borrow, default)]
    model: Option<Cow<'a, str>>,
    #[serde(default)]
    messages: Option<Vec<RawMessage>>,
    #[serde(default)]
    stream: Option<bool>,
    #[serde(default)]
    stream_options: Option<RawStreamOptions>,
    #[serde(default)]
    tools: Option<Vec<RawTool>>,
    #[serde(default)]
    tool_choice: Option<Value>,
}

#[derive(Deserialize)]
struct RawTool {
    #[serde(default)]
    function: Option<RawFunction>,
}

#[derive(Deserialize)]
struct RawFunction {
    name: String,
    #[serde(default)]
    parameters: Option<Value>,
}

#[derive(Deserialize)]
struct RawMessage {
    #[serde(default)]
    role: Option<String>,
    #[serde(default)]
    content: Option<RawContent>,
}

#[derive(Deserialize)]
#[serde(untagged)]
enum RawContent {
    Text(String),
    Parts(Vec<RawPart>),
    Other(serde::de::IgnoredAny),
}

#[derive(Deserialize)]
struct RawPart {
    #[serde(default)]
    text: Option<String>,
}

#[derive(Deserialize)]
struct RawStreamOptions {
    #[serde(default)]
    include_usage: bool,
}

/// The model named by a request body, if it is JSON with a string `model`; used to attribute
/// a request to a model before (or even when) the full parse fails.
pub fn request_model(body: &[u8]) -> Option<String> {
    #[derive(Deserialize)]
    struct ModelOnly<'a> {
        #[serde(borrow)]
        model: Option<Cow<'a, str>>,
    }
    let parsed: ModelOnly<'_> = serde_json::from_slice(body).ok()?;
    parsed.model.map(Cow::into_owned)
}

/// Parses a chat-completions body, rejecting it the way OpenAI does.
pub fn parse_request(body: &[u8]) -> Result<ChatRequest, ApiError> {
    let raw: RawRequest<'_> = serde_json::from_slice(body).map_err(|_| ApiError::invalid_json())?;
    let Some(model) = raw.model else {
        return Err(ApiError::new(
            400,
            "you must provide a model parameter",
            "invalid_request_error",
        ));
    };
    let Some(messages) = raw.messages else {
        return Err(ApiError::new(
            400,
            "Missing required parameter: 'messages'.",
            "invalid_request_error",
        )
        .param("messages")
        .code("missing_required_parameter"));
    };
    let prompt_tokens = messages
        .iter()
        .map(|m| match &m.content {
            Some(RawContent::Text(t)) => tokens(t),
            Some(RawContent::Parts(parts)) => {
                parts.iter().filter_map(|p| p.text.as_deref()).map(tokens).sum()
            }
            Some(RawContent::Other(_)) | None => 0,
        })
        .sum();
    let prefill = messages.last().filter(|m| m.role.as_deref() == Some("assistant")).map(|m| {
        match &m.content {
            Some(RawContent::Text(t)) => t.clone(),
            Some(RawContent::Parts(parts)) => {
                parts.iter().filter_map(|p| p.text.as_deref()).collect()
            }
            Some(RawContent::Other(_)) | None => String::new(),
        }
    });
    let ends_in_tool_result = messages.last().is_some_and(|m| m.role.as_deref() == Some("tool"));
    let tool_call = match (raw.tools, raw.tool_choice) {
        (_, Some(Value::String(choice))) if choice == "none" => None,
        _ if ends_in_tool_result => None,
        (Some(tools), choice) => {
            let named =
                choice.as_ref().and_then(|c| c.pointer("/function/name")).and_then(Value::as_str);
            let mut functions = tools.iter().filter_map(|t| t.function.as_ref());
            let function = match named {
                Some(name) => functions.find(|f| f.name == name),
                None => functions.next(),
            };
            function.map(|f| ToolCall {
                name: f.name.clone(),
                input: placeholder_input(f.parameters.as_ref()),
            })
        }
        (None, _) => None,
    };
    Ok(ChatRequest {
        model: model.into_owned(),
        stream: raw.stream.unwrap_or(false),
        include_usage: raw.stream_options.is_some_and(|o| o.include_usage),
        prompt_tokens,
        prefill,
        tool_call,
    })
}

/// The simulator's token count: words, so tests can predict usage exactly.
pub fn tokens(text: &str) -> u64 {
    text.split_whitespace().count() as u64
}

// === Responses ===

/// Identity shared by a completion and all chunks of one stream.
#[derive(Debug, Clone)]
pub struct Completion<'a> {
    pub id: &'a str,
    pub created: u64,
    pub model: &'a str,
}

#[derive(Serialize)]
struct Usage {
    prompt_tokens: u64,
    completion_tokens: u64,
    total_tokens: u64,
    prompt_tokens_details: PromptDetails,
    completion_tokens_details: CompletionDetails,
}

#[derive(Serialize)]
struct PromptDetails {
    cached_tokens: u64,
    audio_tokens: u64,
}

#[derive(Serialize)]
struct CompletionDetails {
    reasoning_tokens: u64,
    audio_tokens: u64,
    accepted_prediction_tokens: u64,
    rejected_prediction_tokens: u64,
}

impl Usage {
    fn new(prompt_tokens: u64, completion_tokens: u64) -> Self {
        Usage {
            prompt_tokens,
            completion_tokens,
            total_tokens: prompt_tokens + completion_tokens,
            prompt_tokens_details: PromptDetails { cached_tokens: 0, audio_tokens: 0 },
            completion_tokens_details: CompletionDetails {
                reasoning_tokens: 0,
                audio_tokens: 0,
                accepted_prediction_tokens: 0,
                rejected_prediction_tokens: 0,
            },
        }
    }
}

#[derive(Serialize)]
struct CompletionBody<'a> {
    id: &'a str,
    object: &'static str,
    created: u64,
    model: &'a str,
    choices: [Choice<'a>; 1],
    usage: Usage,
    service_tier: &'static str,
    system_fingerprint: &'static str,
}

#[derive(Serialize)]
struct Choice<'a> {
    index: u32,
    message: Message<'a>,
    logprobs: Option<()>,
    finish_reason: &'static str,
}

#[derive(Serialize)]
struct Message<'a> {
    role: &'static str,
    /// `null` beside tool calls, as OpenAI sends it.
    content: Option<&'a str>,
    refusal: Option<()>,
    annotations: [(); 0],
    #[serde(skip_serializing_if = "Option::is_none")]
    tool_calls: Option<[OutToolCall<'a>; 1]>,
}

#[derive(Serialize)]
struct OutToolCall<'a> {
    id: &'a str,
    #[serde(rename = "type")]
    kind: &'static str,
    function: OutFunction<'a>,
}

#[derive(Serialize)]
struct OutFunction<'a> {
    name: &'a str,
    arguments: &'a str,
}

/// A piece of a streamed tool call: the first names the call, the others add arguments.
#[derive(Serialize)]
struct DeltaToolCall<'a> {
    index: u32,
    #[serde(skip_serializing_if = "Option::is_none")]
    id: Option<&'a str>,
    #[serde(rename = "type", skip_serializing_if = "Option::is_none")]
    kind: Option<&'static str>,
    function: DeltaFunction<'a>,
}

#[derive(Serialize)]
struct DeltaFunction<'a> {
    #[serde(skip_serializing_if = "Option::is_none")]
    name: Option<&'a str>,
    arguments: &'a str,
}

/// A tool call's id: `call_` and the completion's unique suffix (OpenAI's look like `call_…`).
pub fn tool_call_id(completion_id: &str) -> String {
    format!("call_{}", completion_id.trim_start_matches("chatcmpl-"))
}

#[derive(Serialize)]
struct ChunkBody<'a> {
    id: &'a str,
    object: &'static str,
    created: u64,
    model: &'a str,
    service_tier: &'static str,
    system_fingerprint: &'static str,
    choices: &'a [ChunkChoice<'a>],
    // Present (as null) on every chunk only when the client asked for usage, as OpenAI does.
    #[serde(skip_serializing_if = "UsageField::is_absent")]
    usage: UsageField,
}

enum UsageField {
    Absent,
    Null,
    Some(Usage),
}

impl UsageField {
    fn is_absent(&self) -> bool {
        matches!(self, UsageField::Absent)
    }
}

impl Serialize for UsageField {
    fn serialize<S: serde::Serializer>(&self, s: S) -> Result<S::Ok, S::Error> {
        match self {
            UsageField::Absent | UsageField::Null => s.serialize_none(),
            UsageField::Some(u) => u.serialize(s),
        }
    }
}

#[derive(Serialize)]
struct ChunkChoice<'a> {
    index: u32,
    delta: Delta<'a>,
    logprobs: Option<()>,
    finish_reason: Option<&'static str>,
}

#[derive(Serialize)]
struct Delta<'a> {
    #[serde(skip_serializing_if = "Option::is_none")]
    role: Option<&'static str>,
    #[serde(skip_serializing_if = "Option::is_none")]
    content: Option<&'a str>,
    // OpenAI sends `refusal: null` alongside the role in the first chunk: `Some(None)`.
    #[serde(skip_serializing_if = "Option::is_none")]
    refusal: Option<Option<()>>,
    #[serde(skip_serializing_if = "Option::is_none")]
    tool_calls: Option<[DeltaToolCall<'a>; 1]>,
}

impl Completion<'_> {
    /// The non-streaming `chat.completion` body.
    pub fn body(&self, text: &str, prompt_tokens: u64) -> Bytes {
        self.answer(Some(text), None, prompt_tokens)
    }

    /// The non-streaming `chat.completion` body of a call of `call`'s tool.
    pub fn tool_call_body(&self, call: &ToolCall, prompt_tokens: u64) -> Bytes {
        let id = tool_call_id(self.id);
        let arguments = call.input.to_string();
        let tool_call = OutToolCall {
            id: &id,
            kind: "function",
            function: OutFunction { name: &call.name, arguments: &arguments },
        };
        self.answer(None, Some(tool_call), prompt_tokens)
    }

    fn answer(
        &self,
        text: Option<&str>,
        call: Option<OutToolCall<'_>>,
        prompt_tokens: u64,
    ) -> Bytes {
        let completion_tokens = match (&call, text) {
            (Some(call), _) => tokens(call.function.arguments),
            (None, text) => text.map_or(0, tokens),
        };
        let finish_reason = if call.is_some() { "tool_calls" } else { "stop" };
        let body = CompletionBody {
            id: self.id,
            object: "chat.completion",
            created: self.created,
            model: self.model,
            choices: [Choice {
                index: 0,
                message: Message {
                    role: "assistant",
                    content: text,
                    refusal: None,
                    annotations: [],
                    tool_calls: call.map(|c| [c]),
                },
                logprobs: None,
                finish_reason,
            }],
            usage: Usage::new(prompt_tokens, completion_tokens),
            service_tier: "default",
            system_fingerprint: SYSTEM_FINGERPRINT,
        };
        json_bytes(&body)
    }

    fn chunk(&self, choice: Option<ChunkChoice<'_>>, usage: UsageField) -> Bytes {
        let choices: &[ChunkChoice<'_>] = match &choice {
            Some(c) => std::slice::from_ref(c),
            None => &[],
        };
        sse_frame(&ChunkBody {
            id: self.id,
            object: "chat.completion.chunk",
            created: self.created,
            model: self.model,
            service_tier: "default",
            system_fingerprint: SYSTEM_FINGERPRINT,
            choices,
            usage,
        })
    }

    fn usage_null(include_usage: bool) -> UsageField {
        if include_usage { UsageField::Null } else { UsageField::Absent }
    }

    /// The first frame: the assistant role with empty content.
    pub fn role_chunk(&self, include_usage: bool) -> Bytes {
        let delta = Delta {
            role: Some("assistant"),
            content: Some(""),
            refusal: Some(None),
            tool_calls: None,
        };
        let choice = ChunkChoice { index: 0, delta, logprobs: None, finish_reason: None };
        self.chunk(Some(choice), Self::usage_null(include_usage))
    }

    /// One content piece.
    pub fn content_chunk(&self, piece: &str, include_usage: bool) -> Bytes {
        let delta = Delta { role: None, content: Some(piece), refusal: None, tool_calls: None };
        let choice = ChunkChoice { index: 0, delta, logprobs: None, finish_reason: None };
        self.chunk(Some(choice), Self::usage_null(include_usage))
    }

    /// The frame carrying `finish_reason: "stop"` and an empty delta.
    pub fn finish_chunk(&self, include_usage: bool) -> Bytes {
        self.finish_chunk_for("stop", include_usage)
    }

    fn finish_chunk_for(&self, reason: &'static str, include_usage: bool) -> Bytes {
        let delta = Delta { role: None, content: None, refusal: None, tool_calls: None };
        let choice = ChunkChoice { index: 0, delta, logprobs: None, finish_reason: Some(reason) };
        self.chunk(Some(choice), Self::usage_null(include_usage))
    }

    /// A piece of a streamed tool call: the first (`name` given) opens the call with its id.
    fn tool_call_chunk(&self, name: Option<&str>, arguments: &str, include_usage: bool) -> Bytes {
        let id = name.map(|_| tool_call_id(self.id));
        let call = DeltaToolCall {
            index: 0,
            id: id.as_deref(),
            kind: name.map(|_| "function"),
            function: DeltaFunction { name, arguments },
        };
        let delta = Delta { role: None, content: None, refusal: None, tool_calls: Some([call]) };
        let choice = ChunkChoice { index: 0, delta, logprobs: None, finish_reason: None };
        self.chunk(Some(choice), Self::usage_null(include_usage))
    }

    /// `stream_options.include_usage`: the extra chunk with `choices: []`.
    pub fn usage_chunk(&self, prompt_tokens: u64, completion_tokens: u64) -> Bytes {
        self.chunk(None, UsageField::Some(Usage::new(prompt_tokens, completion_tokens)))
    }
}

/// OpenAI's `chat.completion.chunk` framing around the pieces the shared stream task sends.
pub struct CompletionStream {
    id: String,
    created: u64,
    model: String,
    include_usage: bool,
    prompt_tokens: u64,
    /// The tool the stream calls: its pieces are then the arguments' JSON.
    tool: Option<ToolCall>,
}

impl CompletionStream {
    pub fn new(completion: &Completion<'_>, request: &ChatRequest) -> Self {
        CompletionStream {
            id: completion.id.to_owned(),
            created: completion.created,
            model: completion.model.to_owned(),
            include_usage: request.include_usage,
            prompt_tokens: request.prompt_tokens,
            tool: None,
        }
    }

    /// The stream calls `call`'s tool instead of answering in text.
    pub fn calling(mut self, call: Option<&ToolCall>) -> Self {
        self.tool = call.cloned();
        self
    }

    /// What the stream's pieces spell: the text, or the tool's arguments as JSON.
    pub fn text(&self, text: String) -> String {
        match &self.tool {
            Some(call) => call.input.to_string(),
            None => text,
        }
    }

    fn completion(&self) -> Completion<'_> {
        Completion { id: &self.id, created: self.created, model: &self.model }
    }
}

impl StreamWire for CompletionStream {
    fn head(&self) -> Vec<Bytes> {
        let completion = self.completion();
        let mut frames = vec![completion.role_chunk(self.include_usage)];
        if let Some(call) = &self.tool {
            frames.push(completion.tool_call_chunk(Some(&call.name), "", self.include_usage));
        }
        frames
    }

    fn content(&self, piece: &str) -> Bytes {
        match self.tool {
            Some(_) => self.completion().tool_call_chunk(None, piece, self.include_usage),
            None => self.completion().content_chunk(piece, self.include_usage),
        }
    }

    fn error(&self, message: &str) -> Bytes {
        error_frame(message)
    }

    fn bad_frame(&self) -> Bytes {
        Bytes::from_static(MALFORMED_FRAME)
    }

    fn tail(&self, text: &str, marker: bool) -> Vec<Bytes> {
        let completion = self.completion();
        let reason = if self.tool.is_some() { "tool_calls" } else { "stop" };
        let mut frames = vec![completion.finish_chunk_for(reason, self.include_usage)];
        if self.include_usage {
            frames.push(completion.usage_chunk(self.prompt_tokens, tokens(text)));
        }
        if marker {
            frames.push(Bytes::from_static(DONE));
        }
        frames
    }
}

/// The stream terminator.
pub const DONE: &[u8] = b"data: [DONE]\n\n";

/// A `200` body that is not JSON: what a proxy or a truncated upstream can hand back.
pub const MALFORMED_BODY: &[u8] =
    b"{\"id\": \"chatcmpl-malformed\", \"object\": \"chat.completion\", \"choices\": [{";

/// A stream frame whose data is not JSON.
pub const MALFORMED_FRAME: &[u8] =
    b"data: {\"id\": \"chatcmpl-malformed\", \"choices\": [{\"delta\": \n\n";

/// The in-band error frame OpenAI sends when a stream fails after it started (openai-python's
/// `Stream.__stream__` raises `APIError` for a data frame with an `error` key).
pub fn error_frame(message: &str) -> Bytes {
    let err = ApiError::new(500, message.to_owned(), "server_error");
    sse_frame(&ErrorEnvelope { error: err.inner() })
}

/// `GET /v1/models`: OpenAI's list format.
pub fn models_list<'a>(models: impl Iterator<Item = &'a str>, created: u64) -> Bytes {
    #[derive(Serialize)]
    struct Model<'a> {
        id: &'a str,
        object: &'static str,
        created: u64,
        owned_by: &'static str,
    }
    #[derive(Serialize)]
    struct List<'a> {
        object: &'static str,
        data: Vec<Model<'a>>,
    }
    let data = models
        .map(|id| Model { id, object: "model", created, owned_by: "switchyard-sim" })
        .collect();
    json_bytes(&List { object: "list", data })
}

// === Errors ===

/// An error response: status, OpenAI error envelope, and an optional `retry-after`.
#[derive(Debug, Clone, PartialEq)]
pub struct ApiError {
    pub status: u16,
    pub message: Cow<'static, str>,
    pub kind: Cow<'static, str>,
    pub param: Option<&'static str>,
    pub code: Value,
    pub retry_after: Option<u64>,
}

#[derive(Serialize)]
struct ErrorEnvelope<'a> {
    error: ErrorInner<'a>,
}

#[derive(Serialize)]
struct ErrorInner<'a> {
    message: &'a str,
    #[serde(rename = "type")]
    kind: &'a str,
    param: Option<&'a str>,
    code: &'a Value,
}

impl ApiError {
    pub fn new(
        status: u16,
        message: impl Into<Cow<'static, str>>,
        kind: impl Into<Cow<'static, str>>,
    ) -> Self {
        ApiError {
            status,
            message: message.into(),
            kind: kind.into(),
            param: None,
            code: Value::Null,
            retry_after: None,
        }
    }

    pub fn param(mut self, param: &'static str) -> Self {
        self.param = Some(param);
        self
    }

    pub fn code(mut self, code: impl Into<Value>) -> Self {
        self.code = code.into();
        self
    }

    fn inner(&self) -> ErrorInner<'_> {
        ErrorInner { message: &self.message, kind: &self.kind, param: self.param, code: &self.code }
    }

    /// Headers that go with the body: `retry-after` when set and, for a 429, OpenAI's
    /// `x-ratelimit-*-requests` trio matching the message (limit 3, none left, reset at
    /// `retry-after`), for clients that read those instead of `retry-after`.
    pub fn headers(&self) -> Vec<(&'static str, String)> {
        let mut headers = Vec::new();
        if let Some(secs) = self.retry_after {
            headers.push(("retry-after", secs.to_string()));
            if self.status == 429 {
                headers.push(("x-ratelimit-limit-requests", "3".to_owned()));
                headers.push(("x-ratelimit-remaining-requests", "0".to_owned()));
                headers.push(("x-ratelimit-reset-requests", format!("{secs}s")));
            }
        }
        headers
    }

    /// The JSON body.
    pub fn body(&self) -> Bytes {
        json_bytes(&ErrorEnvelope { error: self.inner() })
    }

    /// A body that is not valid JSON (OpenAI's own text for it).
    pub fn invalid_json() -> Self {
        ApiError::new(
            400,
            "We could not parse the JSON body of your request. (HINT: This likely means you aren't \
             using your HTTP library correctly. The OpenAI API expects a JSON payload, but what was \
             sent was not valid JSON. If you have trouble figuring out how to fix this, please \
             contact us through our help center at help.openai.com.)",
            "invalid_request_error",
        )
    }

    /// A prompt longer than the model's context: OpenAI's 400 `context_length_exceeded`
    /// (its "Error codes" guide; the message as api.openai.com words it).
    pub fn context_length(window: u64, prompt_tokens: u64) -> Self {
        ApiError::new(
            400,
            format!(
                "This model's maximum context length is {window} tokens. However, your messages \
                 resulted in {prompt_tokens} tokens. Please reduce the length of the messages."
            ),
            "invalid_request_error",
        )
        .param("messages")
        .code("context_length_exceeded")
    }

    /// A server without prefill support refusing the continuation fields (OpenAI's own 400
    /// for a body field it does not take: "Unrecognized request argument supplied: …",
    /// `invalid_request_error`, param and code null).
    pub fn prefill_unsupported() -> Self {
        ApiError::new(
            400,
            "Unrecognized request argument supplied: continue_final_message",
            "invalid_request_error",
        )
    }

    /// A path OpenAI does not serve.
    pub fn invalid_url(method: &str, path: &str) -> Self {
        ApiError::new(404, format!("Invalid URL ({method} {path})"), "invalid_request_error")
    }

    /// No `Authorization: Bearer …` at all.
    pub fn missing_key() -> Self {
        ApiError::new(
            401,
            "You didn't provide an API key. You need to provide your API key in an Authorization \
             header using Bearer auth (i.e. Authorization: Bearer YOUR_KEY), or as the password \
             field (with blank username) if you're accessing the API from your browser and are \
             prompted for a username and password. You can obtain an API key from \
             https://platform.openai.com/account/api-keys.",
            "invalid_request_error",
        )
    }

    /// A key the simulator does not accept, masked like OpenAI masks it.
    pub fn incorrect_key(key: &str) -> Self {
        // Source: the 401 body quoted in chatanywhere/GPT_API_free#62 and popjane/free_chatgpt_api#3:
        // {"message": "Incorrect API key provided: sk-VKMIs***…wjh3. You can find your API key at
        // https://platform.openai.com/account/api-keys.", "type": "invalid_request_error",
        // "param": null, "code": "invalid_api_key"}
        ApiError::new(
            401,
            format!(
                "Incorrect API key provided: {}. You can find your API key at \
                 https://platform.openai.com/account/api-keys.",
                mask_key(key)
            ),
            "invalid_request_error",
        )
        .code("invalid_api_key")
    }
}

/// The real error for a scripted `status`: the body OpenAI sends for it.
///
/// Sources (bodies as quoted from api.openai.com in public issue threads):
/// - 401: chatanywhere/GPT_API_free#62 (`invalid_request_error`, code `invalid_api_key`).
/// - 404: openai/openai-agents-python#458: "The model `…` does not exist or you do not have
///   access to it.", `invalid_request_error`, code `model_not_found`.
/// - 429: feder-cr/invisible_playwright_mcp#249, OpenBMB/ChatDev#26: "Rate limit reached for
///   `<model>` in organization `<org>` on requests per min (RPM): Limit 3, Used 3,
///   Requested 1. Please try again in 20s. Visit
///   `https://platform.openai.com/account/rate-limits` to learn more.", type `requests`, code `rate_limit_exceeded`.
/// - 500: acheong08/ChatGPT#607: "The server experienced an error while processing your
///   request. Sorry about that! …", type `server_error`, code null.
/// - 503: waylaidwanderer/node-chatgpt-api#34: "That model is currently overloaded with other
///   requests. … (Please include the request ID … in your message.)", `server_error`, code null.
/// - 403: OpenAI's region block, `request_forbidden` / `unsupported_country_region_territory`.
/// - 502: Cloudflare in front of OpenAI: `cf_bad_gateway` with a numeric code.
pub fn status_error(
    status: u16,
    model: &str,
    message: Option<&str>,
    api_key: Option<&str>,
    request_id: &str,
    retry_after: Option<u64>,
) -> ApiError {
    let mut err = match status {
        401 => match api_key {
            Some(key) => ApiError::incorrect_key(key),
            None => ApiError::missing_key(),
        },
        403 => {
            ApiError::new(403, "Country, region, or territory not supported", "request_forbidden")
                .code("unsupported_country_region_territory")
        }
        404 => ApiError::new(
            404,
            format!("The model `{model}` does not exist or you do not have access to it."),
            "invalid_request_error",
        )
        .code("model_not_found"),
        429 => {
            let wait = retry_after.unwrap_or(1);
            ApiError::new(
                429,
                format!(
                    "Rate limit reached for {model} in organization org-switchyardsim on requests \
                     per min (RPM): Limit 3, Used 3, Requested 1. Please try again in {wait}s. \
                     Visit https://platform.openai.com/account/rate-limits to learn more."
                ),
                "requests",
            )
            .code("rate_limit_exceeded")
        }
        500 => ApiError::new(
            500,
            "The server experienced an error while processing your request. Sorry about that! \
             You can retry your request, or contact us through our help center at \
             help.openai.com if the error persists.",
            "server_error",
        ),
        502 => ApiError::new(502, "Bad gateway.", "cf_bad_gateway").code(502),
        503 => ApiError::new(
            503,
            format!(
                "That model is currently overloaded with other requests. You can retry your \
                 request, or contact us through our help center at help.openai.com if the error \
                 persists. (Please include the request ID {request_id} in your message.)"
            ),
            "server_error",
        ),
        s if s >= 500 => ApiError::new(
            s,
            "The server had an error while processing your request.",
            "server_error",
        ),
        s => ApiError::new(s, "Invalid request.", "invalid_request_error"),
    };
    err.status = status;
    if let Some(message) = message {
        err.message = Cow::Owned(message.to_owned());
    }
    // Only 429 carries retry-after by default; a 503 gets one when the script asks for it.
    err.retry_after = match status {
        429 => Some(retry_after.unwrap_or(1)),
        _ => retry_after,
    };
    err
}

/// `sk-abcdef…wxyz` → `sk-abc***…wxyz`: the first 6 and last 4 characters, as OpenAI shows it.
fn mask_key(key: &str) -> String {
    let chars: Vec<char> = key.chars().collect();
    if chars.len() <= 10 {
        return "*".repeat(chars.len());
    }
    let head: String = chars[..6].iter().collect();
    let tail: String = chars[chars.len() - 4..].iter().collect();
    format!("{head}{}{tail}", "*".repeat(chars.len() - 10))
}

// === Encoding ===

fn json_bytes<T: Serialize>(value: &T) -> Bytes {
    let mut out = Vec::with_capacity(512);
    // Serialising these plain structs into a Vec cannot fail; an empty body would show it.
    let _ = serde_json::to_writer(&mut out, value);
    Bytes::from(out)
}

fn sse_frame<T: Serialize>(value: &T) -> Bytes {
    let mut out = Vec::with_capacity(384);
    out.extend_from_slice(b"data: ");
    let _ = serde_json::to_writer(&mut out, value);
    out.extend_from_slice(b"\n\n");
    Bytes::from(out)
}

#[cfg(test)]
mod tests {
    use super::*;

    fn json(b: &[u8]) -> Value {
        serde_json::from_slice(b).unwrap()
    }

    const C: Completion<'static> = Completion { id: "chatcmpl-x", created: 7, model: "m/1" };

    #[test]
    fn completion_has_openai_shape() {
        let v = json(&C.body("two words", 3));
        assert_eq!(v["object"], "chat.completion");
        assert_eq!(v["model"], "m/1");
        assert_eq!(v["choices"][0]["message"]["role"], "assistant");
        assert_eq!(v["choices"][0]["message"]["content"], "two words");
        assert_eq!(v["choices"][0]["finish_reason"], "stop");
        assert_eq!(v["usage"]["prompt_tokens"], 3);
        assert_eq!(v["usage"]["completion_tokens"], 2);
        assert_eq!(v["usage"]["total_tokens"], 5);
    }

    fn frame(b: &[u8]) -> Value {
        let s = std::str::from_utf8(b).unwrap();
        json(s.strip_prefix("data: ").unwrap().strip_suffix("\n\n").unwrap().as_bytes())
    }

    #[test]
    fn chunks_have_openai_shape() {
        let role = frame(&C.role_chunk(false));
        assert_eq!(role["object"], "chat.completion.chunk");
        assert_eq!(role["choices"][0]["delta"]["role"], "assistant");
        assert_eq!(role["choices"][0]["delta"]["content"], "");
        assert!(role["choices"][0]["finish_reason"].is_null());
        assert!(role.get("usage").is_none());
        let piece = frame(&C.content_chunk("Hi", true));
        assert_eq!(piece["choices"][0]["delta"], serde_json::json!({"content": "Hi"}));
        assert!(piece["usage"].is_null() && piece.get("usage").is_some());
        let fin = frame(&C.finish_chunk(false));
        assert_eq!(fin["choices"][0]["delta"], serde_json::json!({}));
        assert_eq!(fin["choices"][0]["finish_reason"], "stop");
        let usage = frame(&C.usage_chunk(2, 3));
        assert_eq!(usage["choices"], serde_json::json!([]));
        assert_eq!(usage["usage"]["total_tokens"], 5);
    }

    #[test]
    fn error_bodies_match_openai() {
        let e = status_error(429, "gpt-x", None, None, "req_1", None);
        let v = json(&e.body());
        assert_eq!(v["error"]["type"], "requests");
        assert_eq!(v["error"]["code"], "rate_limit_exceeded");
        assert!(v["error"]["param"].is_null());
        assert_eq!(e.retry_after, Some(1));
        let v = json(&status_error(404, "gpt-x", None, None, "r", None).body());
        assert_eq!(v["error"]["code"], "model_not_found");
        assert_eq!(v["error"]["type"], "invalid_request_error");
        let v = json(&status_error(401, "m", None, Some("sk-abcdefghijklmnop"), "r", None).body());
        assert_eq!(v["error"]["code"], "invalid_api_key");
        assert!(v["error"]["message"].as_str().unwrap().contains("sk-abc*********mnop"));
        let v = json(&status_error(503, "m", None, None, "req_9", None).body());
        assert_eq!(v["error"]["type"], "server_error");
        assert!(
            v["error"]["message"]
                .as_str()
                .unwrap()
                .starts_with("That model is currently overloaded")
        );
        let v = json(&status_error(500, "m", Some("boom"), None, "r", None).body());
        assert_eq!(
            v["error"],
            serde_json::json!({"message": "boom", "type": "server_error", "param": null, "code": null})
        );
    }

    #[test]
    fn parses_requests_and_rejects_bad_ones() {
        let r = parse_request(
            br#"{"model":"a/b","messages":[{"role":"user","content":"one two three"},
            {"role":"user","content":[{"type":"text","text":"four"}]}],"stream":true,
            "stream_options":{"include_usage":true}}"#,
        )
        .unwrap();
        assert_eq!(
            r,
            ChatRequest {
                model: "a/b".into(),
                stream: true,
                include_usage: true,
                prompt_tokens: 4,
                prefill: None,
                tool_call: None,
            }
        );
        assert_eq!(parse_request(b"{nope").unwrap_err().status, 400);
        assert_eq!(parse_request(br#"{"model":"m"}"#).unwrap_err().param, Some("messages"));
        assert_eq!(request_model(br#"{"model":"x"}"#).as_deref(), Some("x"));
    }
}
