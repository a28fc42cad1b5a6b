//! OpenAI's Chat Completions (`POST /v1/chat/completions`): requests, completions and
//! stream chunks, to and from the [core] form.
//!
//! Refusals name fields as a Chat client wrote them
//! (`messages[1].tool_calls[0].function.arguments`, `choices[0].message`).

use std::collections::HashSet;

use serde::de::IgnoredAny;
use serde::{Deserialize, Serialize};
use serde_json::value::RawValue;

use crate::Refusal;
use crate::core::{
    self, Effort, Event, Finish, Format, Image, Message, Part, RawJson, Reasoning, Role, Tool,
    ToolChoice, ToolMode, Usage,
};
use crate::de::{self, OneOrList, OneOrObject};

// === Request: reading ===

/// The body of `POST /v1/chat/completions`. Unknown fields, and the gateway's own (`model`,
/// `models`, `fallback_models`, `redundancy`), are not read here.
#[derive(Deserialize)]
struct WireRequest {
    messages: Option<Vec<WireMessage>>,
    tools: Option<Vec<WireTool>>,
    tool_choice: Option<OneOrObject<WireNamedChoice>>,
    parallel_tool_calls: Option<bool>,
    max_completion_tokens: Option<u32>,
    max_tokens: Option<u32>,
    temperature: Option<f64>,
    top_p: Option<f64>,
    stop: Option<OneOrList<String>>,
    stream: Option<bool>,
    user: Option<String>,
    reasoning_effort: Option<String>,
    n: Option<u32>,
    response_format: Option<WireResponseFormat>,
    seed: Option<i64>,
    frequency_penalty: Option<f64>,
    presence_penalty: Option<f64>,
    // Fields the core does not carry: named in `hints` when present.
    logit_bias: Option<IgnoredAny>,
    logprobs: Option<IgnoredAny>,
    top_logprobs: Option<IgnoredAny>,
    service_tier: Option<IgnoredAny>,
    store: Option<IgnoredAny>,
    metadata: Option<IgnoredAny>,
    prediction: Option<IgnoredAny>,
    modalities: Option<IgnoredAny>,
    audio: Option<IgnoredAny>,
    web_search_options: Option<IgnoredAny>,
}

/// `response_format`: `{"type": "text" | "json_object" | "json_schema", "json_schema"}`.
#[derive(Deserialize)]
struct WireResponseFormat {
    #[serde(rename = "type")]
    kind: String,
    json_schema: Option<WireJsonSchema>,
}

#[derive(Deserialize)]
struct WireJsonSchema {
    name: Option<String>,
    description: Option<String>,
    schema: Option<Box<RawValue>>,
    strict: Option<bool>,
}

#[derive(Deserialize)]
struct WireMessage {
    role: String,
    content: Option<OneOrList<WirePart>>,
    tool_calls: Option<Vec<WireToolCall>>,
    tool_call_id: Option<String>,
}

#[derive(Deserialize)]
struct WirePart {
    #[serde(rename = "type")]
    kind: String,
    text: Option<String>,
    refusal: Option<String>,
    image_url: Option<WireImageUrl>,
    input_audio: Option<WireAudio>,
    file: Option<WireFile>,
}

#[derive(Deserialize)]
struct WireAudio {
    data: String,
    format: String,
}

#[derive(Deserialize)]
struct WireFile {
    file_data: Option<String>,
}

#[derive(Deserialize)]
struct WireImageUrl {
    url: String,
}

#[derive(Deserialize)]
struct WireTool {
    #[serde(rename = "type")]
    kind: String,
    function: Option<WireFunction>,
}

#[derive(Deserialize)]
struct WireFunction {
    name: String,
    description: Option<String>,
    parameters: Option<Box<RawValue>>,
}

#[derive(Deserialize)]
struct WireNamedChoice {
    #[serde(rename = "type")]
    kind: String,
    function: Option<WireName>,
}

#[derive(Deserialize)]
struct WireName {
    name: String,
}

/// OpenAI's sampling temperature range.
const MAX_TEMPERATURE: f64 = 2.0;

/// Reads a Chat request into the core form; refusals name fields in Chat terms.
///
/// - `system` and `developer` messages, wherever they are, become `system` entries;
/// - `tool` messages become tool results in a user turn; consecutive user turns (and tool
///   results) merge into one, as the core keeps turns alternating;
/// - `max_completion_tokens` (else the legacy `max_tokens`) becomes `max_tokens`;
/// - `parallel_tool_calls` without a `tool_choice` is a `tool_choice` of `auto`;
/// - `reasoning_effort` becomes an effort (`minimal` reads as low);
/// - `response_format` becomes the format (`text` is none; a `json_schema` without a schema
///   asks only for JSON, as a `json_object`); `seed` and the penalties are carried;
/// - fields the core has no place for (`n`, `logprobs`, ...) are
///   named in `hints` for the caller to honour or refuse for the model that serves.
pub fn parse_request(body: &[u8]) -> Result<core::Request, Refusal> {
    let wire: WireRequest = de::read(body)?;
    let mut request = core::Request::default();
    let messages = wire.messages.ok_or_else(|| Refusal::at("messages", "field required"))?;
    if messages.is_empty() {
        return Err(Refusal::at("messages", "at least one message is required"));
    }
    let mut call_ids = HashSet::new();
    for (i, message) in messages.into_iter().enumerate() {
        let at = format!("messages[{i}]");
        let (role, parts) = match message.role.as_str() {
            "system" | "developer" => {
                let text = text_only(message.content, &at)?;
                if !text.is_empty() {
                    request.system.push(text);
                }
                continue;
            }
            "user" => (Role::User, user_parts(message.content, &at)?),
            "assistant" => {
                let mut parts = Vec::new();
                let text = text_only(message.content, &at)?;
                if !text.is_empty() {
                    parts.push(Part::Text(text));
                }
                for (j, call) in message.tool_calls.unwrap_or_default().into_iter().enumerate() {
                    let at = format!("{at}.tool_calls[{j}]");
                    let id =
                        call.id.ok_or_else(|| Refusal::at(format!("{at}.id"), "field required"))?;
                    let function = call
                        .function
                        .ok_or_else(|| Refusal::at(format!("{at}.function"), "field required"))?;
                    let name = function.name.ok_or_else(|| {
                        Refusal::at(format!("{at}.function.name"), "field required")
                    })?;
                    let arguments = arguments(function.arguments, &at)?;
                    call_ids.insert(id.clone());
                    parts.push(Part::ToolCall { id, name, arguments });
                }
                (Role::Assistant, parts)
            }
            "tool" => {
                let call_id = message
                    .tool_call_id
                    .ok_or_else(|| Refusal::at(format!("{at}.tool_call_id"), "field required"))?;
                if !call_ids.contains(&call_id) {
                    return Err(Refusal::at(
                        format!("{at}.tool_call_id"),
                        format!(
                            "`{call_id}` matches no `tool_calls` id in an earlier assistant message"
                        ),
                    ));
                }
                let text = text_only(message.content, &at)?;
                (
                    Role::User,
                    vec![Part::ToolResult {
                        call_id,
                        content: vec![Part::Text(text)],
                        is_error: false,
                    }],
                )
            }
            other => {
                return Err(Refusal::at(
                    format!("{at}.role"),
                    format!(
                        "must be one of `system`, `developer`, `user`, `assistant`, `tool`, not `{other}`"
                    ),
                ));
            }
        };
        if parts.is_empty() {
            continue;
        }
        match request.messages.last_mut() {
            Some(previous) if previous.role == role => previous.parts.extend(parts),
            _ => request.messages.push(Message { role, parts }),
        }
    }

    for (i, tool) in wire.tools.unwrap_or_default().into_iter().enumerate() {
        if tool.kind != "function" {
            return Err(Refusal::at(
                format!("tools[{i}].type"),
                format!("the gateway takes `function` tools, not `{}`", tool.kind),
            ));
        }
        let function = tool
            .function
            .ok_or_else(|| Refusal::at(format!("tools[{i}].function"), "field required"))?;
        request.tools.push(Tool {
            name: function.name,
            description: function.description,
            // A function without parameters takes none: an empty object schema.
            parameters: match function.parameters.map(RawJson::from) {
                None => RawJson::from(de::empty_object_schema()),
                Some(schema) if schema.is_object() => schema,
                Some(_) => {
                    return Err(Refusal::at(
                        format!("tools[{i}].function.parameters"),
                        "must be a JSON schema object",
                    ));
                }
            },
        });
    }

    let mode = match wire.tool_choice {
        None => None,
        Some(OneOrObject::One(mode)) => Some(match mode.as_str() {
            "auto" => ToolMode::Auto,
            "none" => ToolMode::None,
            "required" => ToolMode::Any,
            other => {
                return Err(Refusal::at(
                    "tool_choice",
                    format!("must be `auto`, `none`, `required` or a function, not `{other}`"),
                ));
            }
        }),
        Some(OneOrObject::Object(named)) => {
            if named.kind != "function" {
                return Err(Refusal::at(
                    "tool_choice.type",
                    format!("must be `function`, not `{}`", named.kind),
                ));
            }
            let name = named
                .function
                .ok_or_else(|| Refusal::at("tool_choice.function", "field required"))?
                .name;
            if !request.tools.iter().any(|t| t.name == name) {
                return Err(Refusal::at(
                    "tool_choice.function.name",
                    format!("no tool named `{name}` is in `tools`"),
                ));
            }
            Some(ToolMode::Tool(name))
        }
    };
    request.tool_choice = match (mode, wire.parallel_tool_calls) {
        (None, None) => None,
        (mode, parallel) => Some(ToolChoice { mode: mode.unwrap_or(ToolMode::Auto), parallel }),
    };

    request.max_tokens = wire.max_completion_tokens.or(wire.max_tokens);
    if let Some(t) = wire.temperature {
        if !(0.0..=MAX_TEMPERATURE).contains(&t) {
            return Err(Refusal::at("temperature", "must be between 0 and 2"));
        }
        request.temperature = Some(t);
    }
    if let Some(p) = wire.top_p {
        if !(0.0..=1.0).contains(&p) {
            return Err(Refusal::at("top_p", "must be between 0 and 1"));
        }
        request.top_p = Some(p);
    }
    request.stop = match wire.stop {
        None => Vec::new(),
        Some(OneOrList::One(stop)) => vec![stop],
        Some(OneOrList::List(stop)) => stop,
    };
    request.stream = wire.stream.unwrap_or(false);
    request.user = wire.user;
    request.reasoning = match wire.reasoning_effort.as_deref() {
        None | Some("none") => None,
        Some("minimal" | "low") => Some(Reasoning::Effort(Effort::Low)),
        Some("medium") => Some(Reasoning::Effort(Effort::Medium)),
        Some("high" | "xhigh") => Some(Reasoning::Effort(Effort::High)),
        Some(other) => {
            return Err(Refusal::at(
                "reasoning_effort",
                format!("must be one of `minimal`, `low`, `medium`, `high`, not `{other}`"),
            ));
        }
    };
    if wire.n.is_some_and(|n| n != 1) {
        request.hint("n");
    }
    request.seed = wire.seed;
    request.presence_penalty = wire.presence_penalty;
    request.frequency_penalty = wire.frequency_penalty;
    request.format = match wire.response_format {
        None => None,
        Some(format) => read_format(format)?,
    };
    let present: [(&'static str, bool); 10] = [
        ("logit_bias", wire.logit_bias.is_some()),
        ("logprobs", wire.logprobs.is_some()),
        ("top_logprobs", wire.top_logprobs.is_some()),
        ("service_tier", wire.service_tier.is_some()),
        ("store", wire.store.is_some()),
        ("metadata", wire.metadata.is_some()),
        ("prediction", wire.prediction.is_some()),
        ("modalities", wire.modalities.is_some()),
        ("audio", wire.audio.is_some()),
        ("web_search_options", wire.web_search_options.is_some()),
    ];
    for (hint, seen) in present {
        if seen {
            request.hint(hint);
        }
    }
    Ok(request)
}

/// `response_format` as the core's format; `text` is none.
fn read_format(format: WireResponseFormat) -> Result<Option<Format>, Refusal> {
    match format.kind.as_str() {
        "text" => Ok(None),
        "json_object" => Ok(Some(Format::JsonObject)),
        "json_schema" => {
            let Some(spec) = format.json_schema else { return Ok(Some(Format::JsonObject)) };
            let Some(schema) = spec.schema else { return Ok(Some(Format::JsonObject)) };
            Ok(Some(Format::JsonSchema {
                name: spec.name.unwrap_or_default(),
                description: spec.description,
                schema: RawJson::from(schema),
                strict: spec.strict,
            }))
        }
        other => Err(Refusal::at(
            "response_format.type",
            format!("must be `text`, `json_object` or `json_schema`, not `{other}`"),
        )),
    }
}

/// A call's arguments: JSON text (an empty string reads as `{}`, as OpenAI models sometimes
/// send for a call without arguments); anything else is refused, since formats that carry
/// arguments as an object could not send it.
fn arguments(arguments: Option<String>, at: &str) -> Result<String, Refusal> {
    let arguments = arguments.unwrap_or_default();
    if arguments.trim().is_empty() {
        return Ok("{}".to_owned());
    }
    match serde_json::from_str::<&RawValue>(&arguments) {
        Ok(raw) if raw.get().starts_with('{') => Ok(arguments),
        _ => Err(Refusal::at(
            format!("{at}.function.arguments"),
            "must be a JSON object in a string",
        )),
    }
}

/// The text of a string content or of text (and refusal) parts, joined.
fn text_only(content: Option<OneOrList<WirePart>>, at: &str) -> Result<String, Refusal> {
    match content {
        None => Ok(String::new()),
        Some(OneOrList::One(text)) => Ok(text),
        Some(OneOrList::List(parts)) => {
            let mut text = String::new();
            for (j, part) in parts.into_iter().enumerate() {
                let piece = match part.kind.as_str() {
                    "text" => part.text,
                    "refusal" => part.refusal,
                    other => {
                        return Err(Refusal::at(
                            format!("{at}.content[{j}].type"),
                            format!("this message takes `text` parts, not `{other}`"),
                        ));
                    }
                };
                let piece = piece.ok_or_else(|| {
                    Refusal::at(format!("{at}.content[{j}].{}", part.kind), "field required")
                })?;
                text.push_str(&piece);
            }
            Ok(text)
        }
    }
}

fn user_parts(content: Option<OneOrList<WirePart>>, at: &str) -> Result<Vec<Part>, Refusal> {
    let parts = match content {
        None => return Err(Refusal::at(format!("{at}.content"), "field required")),
        Some(OneOrList::One(text)) => return Ok(vec![Part::Text(text)]),
        Some(OneOrList::List(parts)) => parts,
    };
    let mut out = Vec::with_capacity(parts.len());
    for (j, part) in parts.into_iter().enumerate() {
        let at = format!("{at}.content[{j}]");
        out.push(match part.kind.as_str() {
            "text" => Part::Text(
                part.text.ok_or_else(|| Refusal::at(format!("{at}.text"), "field required"))?,
            ),
            "image_url" => {
                let url = part
                    .image_url
                    .ok_or_else(|| Refusal::at(format!("{at}.image_url"), "field required"))?
                    .url;
                Part::Image(read_image_url(url, &format!("{at}.image_url.url"))?)
            }
            "input_audio" => {
                let audio = part
                    .input_audio
                    .ok_or_else(|| Refusal::at(format!("{at}.input_audio"), "field required"))?;
                Part::Audio { format: audio.format, data: audio.data }
            }
            "file" => {
                let at = format!("{at}.file.file_data");
                let data = part.file.and_then(|f| f.file_data).ok_or_else(|| {
                    Refusal::at(
                        &at,
                        "the gateway takes files only inline, as file_data (a data: URL); file_id refers to OpenAI's storage",
                    )
                })?;
                Part::File(read_image_url(data, &at)?)
            }
            other => {
                return Err(Refusal::at(
                    format!("{at}.type"),
                    format!(
                        "the gateway takes `text`, `image_url`, `input_audio` and `file` parts, not `{other}`"
                    ),
                ));
            }
        });
    }
    Ok(out)
}

/// `data:<media type>;base64,<data>` → base64 image; http(s) and `gs://` URLs as they are
/// (the provider's writer refuses what its provider cannot fetch).
fn read_image_url(url: String, at: &str) -> Result<Image, Refusal> {
    if let Some(rest) = url.strip_prefix("data:") {
        let (meta, data) = rest
            .split_once(',')
            .ok_or_else(|| Refusal::at(at, "a data: URL needs a `,` before its data"))?;
        let media_type = meta
            .strip_suffix(";base64")
            .ok_or_else(|| Refusal::at(at, "image data: URLs must be base64"))?;
        return Ok(Image::Base64 { media_type: media_type.to_owned(), data: data.to_owned() });
    }
    if url.starts_with("https://") || url.starts_with("http://") || url.starts_with("gs://") {
        return Ok(Image::Url(url));
    }
    Err(Refusal::at(at, "image URLs must be data:, http(s): or gs:// URLs"))
}

// === Request: writing ===

#[derive(Serialize)]
struct OutRequest<'a> {
    messages: Vec<OutMessage<'a>>,
    #[serde(skip_serializing_if = "Vec::is_empty")]
    tools: Vec<OutTool<'a>>,
    #[serde(skip_serializing_if = "Option::is_none")]
    tool_choice: Option<OutToolChoice<'a>>,
    #[serde(skip_serializing_if = "Option::is_none")]
    parallel_tool_calls: Option<bool>,
    #[serde(skip_serializing_if = "Option::is_none")]
    max_completion_tokens: Option<u32>,
    #[serde(skip_serializing_if = "Option::is_none")]
    temperature: Option<f64>,
    #[serde(skip_serializing_if = "Option::is_none")]
    top_p: Option<f64>,
    #[serde(skip_serializing_if = "<[_]>::is_empty")]
    stop: &'a [String],
    #[serde(skip_serializing_if = "Option::is_none")]
    user: Option<&'a str>,
    #[serde(skip_serializing_if = "Option::is_none")]
    reasoning_effort: Option<&'static str>,
    #[serde(skip_serializing_if = "Option::is_none")]
    response_format: Option<OutResponseFormat<'a>>,
    #[serde(skip_serializing_if = "Option::is_none")]
    seed: Option<i64>,
    #[serde(skip_serializing_if = "Option::is_none")]
    presence_penalty: Option<f64>,
    #[serde(skip_serializing_if = "Option::is_none")]
    frequency_penalty: Option<f64>,
    stream: bool,
    #[serde(skip_serializing_if = "Option::is_none")]
    stream_options: Option<StreamOptions>,
}

#[derive(Serialize)]
#[serde(tag = "type", rename_all = "snake_case")]
enum OutResponseFormat<'a> {
    JsonObject,
    JsonSchema { json_schema: OutJsonSchema<'a> },
}

#[derive(Serialize)]
struct OutJsonSchema<'a> {
    name: &'a str,
    #[serde(skip_serializing_if = "Option::is_none")]
    description: Option<&'a str>,
    schema: &'a RawValue,
    #[serde(skip_serializing_if = "Option::is_none")]
    strict: Option<bool>,
}

impl<'a> OutResponseFormat<'a> {
    fn of(format: &'a Format) -> Self {
        match format {
            Format::JsonObject => OutResponseFormat::JsonObject,
            Format::JsonSchema { name, description, schema, strict } => {
                OutResponseFormat::JsonSchema {
                    json_schema: OutJsonSchema {
                        name,
                        description: description.as_deref(),
                        schema: schema.raw(),
                        strict: *strict,
                    },
                }
            }
        }
    }
}

#[derive(Serialize)]
struct StreamOptions {
    include_usage: bool,
}

#[derive(Serialize)]
struct OutMessage<'a> {
    role: &'static str,
    /// `null` only on an assistant message that carries only tool calls.
    content: Option<OutContent<'a>>,
    #[serde(skip_serializing_if = "Option::is_none")]
    tool_call_id: Option<&'a str>,
    #[serde(skip_serializing_if = "Vec::is_empty")]
    tool_calls: Vec<OutToolCall<'a>>,
}

impl<'a> OutMessage<'a> {
    fn new(role: &'static str, content: Option<OutContent<'a>>) -> Self {
        OutMessage { role, content, tool_call_id: None, tool_calls: Vec::new() }
    }
}

#[derive(Serialize)]
#[serde(untagged)]
enum OutContent<'a> {
    Text(String),
    Parts(Vec<OutPart<'a>>),
}

#[derive(Serialize)]
#[serde(tag = "type", rename_all = "snake_case")]
enum OutPart<'a> {
    Text { text: &'a str },
    ImageUrl { image_url: OutImageUrl },
    InputAudio { input_audio: OutAudio<'a> },
    File { file: OutFile },
}

#[derive(Serialize)]
struct OutAudio<'a> {
    data: &'a str,
    format: &'a str,
}

#[derive(Serialize)]
struct OutFile {
    file_data: String,
}

#[derive(Serialize)]
struct OutImageUrl {
    url: String,
}

#[derive(Serialize)]
struct OutToolCall<'a> {
    id: &'a str,
    #[serde(rename = "type")]
    kind: &'static str,
    function: OutFunctionCall<'a>,
}

#[derive(Serialize)]
struct OutFunctionCall<'a> {
    name: &'a str,
    arguments: &'a str,
}

#[derive(Serialize)]
struct OutTool<'a> {
    #[serde(rename = "type")]
    kind: &'static str,
    function: OutFunction<'a>,
}

#[derive(Serialize)]
struct OutFunction<'a> {
    name: &'a str,
    #[serde(skip_serializing_if = "Option::is_none")]
    description: Option<&'a str>,
    parameters: &'a RawValue,
}

#[derive(Serialize)]
#[serde(untagged)]
enum OutToolChoice<'a> {
    Mode(&'static str),
    Function {
        #[serde(rename = "type")]
        kind: &'static str,
        function: OutName<'a>,
    },
}

#[derive(Serialize)]
struct OutName<'a> {
    name: &'a str,
}

/// An assistant's text parts joined, and its tool calls as Chat `tool_calls` (other parts
/// have no place in an assistant message).
fn text_and_calls(parts: &[Part]) -> (String, Vec<OutToolCall<'_>>) {
    let mut text = String::new();
    let mut calls = Vec::new();
    for part in parts {
        match part {
            Part::Text(t) => text.push_str(t),
            Part::ToolCall { id, name, arguments } => calls.push(OutToolCall {
                id,
                kind: "function",
                function: OutFunctionCall { name, arguments },
            }),
            _ => {}
        }
    }
    (text, calls)
}

/// An image as Chat's `image_url.url`: http(s) URLs as they are, base64 as a `data:` URL.
fn image_url(image: &Image) -> String {
    match image {
        Image::Url(url) => url.clone(),
        Image::Base64 { media_type, data } => format!("data:{media_type};base64,{data}"),
    }
}

/// Text and image parts as Chat content: a plain string when it is one text, else parts.
fn content<'a>(parts: &[&'a Part]) -> Option<OutContent<'a>> {
    match parts {
        [] => None,
        [Part::Text(text)] => Some(OutContent::Text(text.clone())),
        _ => Some(OutContent::Parts(
            parts
                .iter()
                .filter_map(|part| match part {
                    Part::Text(text) => Some(OutPart::Text { text }),
                    Part::Image(image) => {
                        Some(OutPart::ImageUrl { image_url: OutImageUrl { url: image_url(image) } })
                    }
                    Part::Audio { format, data } => {
                        Some(OutPart::InputAudio { input_audio: OutAudio { data, format } })
                    }
                    Part::File(file) => {
                        Some(OutPart::File { file: OutFile { file_data: image_url(file) } })
                    }
                    _ => None,
                })
                .collect(),
        )),
    }
}

/// Hints the Chat body drops, besides those the request already carries: a `top_k` (Chat
/// has no such sampling parameter), reasoning where the model takes none, a `user` longer
/// than OpenAI takes.
pub const HINT_TOP_K: &str = "top_k";
pub const HINT_THINKING: &str = "thinking";
pub const HINT_USER: &str = "user";

/// The longest `user` OpenAI accepts (characters); a longer one (Claude Code's
/// `metadata.user_id` is a JSON object in a string) is refused by OpenAI with a 400, so it
/// is not sent.
pub const MAX_USER_CHARS: usize = 64;

/// The core request as an OpenAI Chat body without `model` (the caller adds the upstream
/// model), and every hint this translation drops (the request's own and its own ones).
///
/// - `system` becomes one `system` message first, its entries joined by a blank line (some
///   OpenAI-compatible servers take one system message only);
/// - a user turn's tool results become `tool` messages (their text joined), placed before
///   the rest of the turn as Chat requires (tool messages follow the assistant's calls);
///   images in tool results, which a `tool` message cannot hold, follow in a user message;
/// - assistant tool calls become `tool_calls`; thinking parts are dropped (Chat has no
///   place for them in a request);
/// - `reasoning` becomes `reasoning_effort` when `reasoning_allowed`, else it is dropped
///   (hint `thinking`);
/// - `user` is sent when it has at most [`MAX_USER_CHARS`] characters, else dropped (hint
///   `user`);
/// - `format` becomes `response_format` (`json_object`, or `json_schema` with the schema as
///   sent).
pub fn request_body(
    request: &core::Request,
    reasoning_allowed: bool,
) -> (Vec<u8>, Vec<&'static str>) {
    let mut hints = request.hints.clone();
    let mut hint = |h: &'static str| {
        if !hints.contains(&h) {
            hints.push(h);
        }
    };
    let mut messages = Vec::with_capacity(request.messages.len() + 1);
    if !request.system.is_empty() {
        messages
            .push(OutMessage::new("system", Some(OutContent::Text(request.system.join("\n\n")))));
    }
    for message in &request.messages {
        match message.role {
            Role::User => {
                let mut rest: Vec<&Part> = Vec::new();
                let mut result_images: Vec<&Part> = Vec::new();
                for part in &message.parts {
                    match part {
                        Part::ToolResult { call_id, content, .. } => {
                            let text: Vec<&str> = content
                                .iter()
                                .filter_map(|p| match p {
                                    Part::Text(t) => Some(t.as_str()),
                                    _ => None,
                                })
                                .collect();
                            result_images
                                .extend(content.iter().filter(|p| matches!(p, Part::Image(_))));
                            let mut tool =
                                OutMessage::new("tool", Some(OutContent::Text(text.join("\n"))));
                            tool.tool_call_id = Some(call_id);
                            messages.push(tool);
                        }
                        Part::Text(_) | Part::Image(_) | Part::Audio { .. } | Part::File(_) => {
                            rest.push(part)
                        }
                        Part::ToolCall { .. } | Part::Thinking { .. } => {}
                    }
                }
                result_images.extend(rest);
                if let Some(content) = content(&result_images) {
                    messages.push(OutMessage::new("user", Some(content)));
                }
            }
            Role::Assistant => {
                let (text, tool_calls) = text_and_calls(&message.parts);
                if text.is_empty() && tool_calls.is_empty() {
                    continue;
                }
                let mut out = OutMessage::new(
                    "assistant",
                    (!text.is_empty()).then_some(OutContent::Text(text)),
                );
                out.tool_calls = tool_calls;
                messages.push(out);
            }
        }
    }
    let tools: Vec<OutTool> = request
        .tools
        .iter()
        .map(|tool| OutTool {
            kind: "function",
            function: OutFunction {
                name: &tool.name,
                description: tool.description.as_deref(),
                parameters: tool.parameters.raw(),
            },
        })
        .collect();
    let tool_choice = request.tool_choice.as_ref().map(|choice| match &choice.mode {
        ToolMode::Auto => OutToolChoice::Mode("auto"),
        ToolMode::None => OutToolChoice::Mode("none"),
        ToolMode::Any => OutToolChoice::Mode("required"),
        ToolMode::Tool(name) => {
            OutToolChoice::Function { kind: "function", function: OutName { name } }
        }
    });
    // OpenAI refuses `parallel_tool_calls` in a request without tools.
    let parallel_tool_calls =
        request.tool_choice.as_ref().and_then(|c| c.parallel).filter(|_| !tools.is_empty());
    let user = match request.user.as_deref() {
        Some(user) if user.chars().count() > MAX_USER_CHARS => {
            hint(HINT_USER);
            None
        }
        user => user,
    };
    if request.top_k.is_some() {
        hint(HINT_TOP_K);
    }
    let reasoning_effort = match request.reasoning {
        Some(reasoning) if reasoning_allowed => Some(reasoning.effort().as_str()),
        Some(_) => {
            hint(HINT_THINKING);
            None
        }
        None => None,
    };
    let body = OutRequest {
        messages,
        tools,
        tool_choice,
        parallel_tool_calls,
        max_completion_tokens: request.max_tokens,
        temperature: request.temperature,
        top_p: request.top_p,
        stop: &request.stop,
        user,
        reasoning_effort,
        response_format: request.format.as_ref().map(OutResponseFormat::of),
        seed: request.seed,
        presence_penalty: request.presence_penalty,
        frequency_penalty: request.frequency_penalty,
        stream: request.stream,
        stream_options: request.stream.then_some(StreamOptions { include_usage: true }),
    };
    (de::to_vec(&body), hints)
}

// === Completions: reading ===

#[derive(Deserialize)]
struct WireCompletion {
    #[serde(default)]
    id: String,
    #[serde(default)]
    model: String,
    choices: Option<Vec<WireChoice>>,
    usage: Option<WireUsage>,
    error: Option<WireError>,
}

#[derive(Deserialize)]
struct WireError {
    #[serde(default)]
    message: String,
    #[serde(rename = "type", default)]
    kind: Option<String>,
    #[serde(default)]
    code: Option<serde_json::Value>,
}

/// An error an OpenAI-compatible API sent: `error.type`, `error.code` (a string, or a number
/// some compatible servers send, as text) and the message.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct ApiError {
    pub kind: Option<String>,
    pub code: Option<String>,
    pub message: String,
}

impl From<WireError> for ApiError {
    fn from(error: WireError) -> Self {
        ApiError {
            kind: error.kind,
            code: error.code.and_then(|code| match code {
                serde_json::Value::String(code) => Some(code),
                serde_json::Value::Null => None,
                other => Some(other.to_string()),
            }),
            message: error.message,
        }
    }
}

/// OpenAI's error envelope `{"error": {"message", "type", "param", "code"}}`, if the body is
/// one (an error status's body, or an error frame in a stream).
pub fn parse_error(body: &[u8]) -> Option<ApiError> {
    #[derive(Deserialize)]
    struct Body {
        error: WireError,
    }
    serde_json::from_slice::<Body>(body).ok().map(|b| b.error.into())
}

fn error_refusal(error: WireError, what: &str) -> Refusal {
    let error = ApiError::from(error);
    let kind = error.code.or(error.kind).unwrap_or_default();
    Refusal::at("error", format!("{what} is an error ({kind}): {}", error.message))
}

#[derive(Deserialize)]
struct WireChoice {
    message: Option<WireResponseMessage>,
    finish_reason: Option<String>,
}

#[derive(Deserialize)]
struct WireResponseMessage {
    content: Option<String>,
    refusal: Option<String>,
    /// Reasoning text as DeepSeek, vLLM and others return it.
    reasoning_content: Option<String>,
    tool_calls: Option<Vec<WireToolCall>>,
}

#[derive(Deserialize)]
struct WireToolCall {
    #[serde(default)]
    index: Option<u32>,
    id: Option<String>,
    function: Option<WireFunctionCall>,
}

#[derive(Deserialize)]
struct WireFunctionCall {
    name: Option<String>,
    arguments: Option<String>,
}

#[derive(Deserialize, Clone, Copy)]
struct WireUsage {
    #[serde(default)]
    prompt_tokens: u64,
    #[serde(default)]
    completion_tokens: u64,
    prompt_tokens_details: Option<WireUsageDetails>,
}

#[derive(Deserialize, Clone, Copy)]
struct WireUsageDetails {
    cached_tokens: Option<u64>,
}

impl WireUsage {
    fn core(self) -> Usage {
        Usage {
            input_tokens: self.prompt_tokens,
            output_tokens: self.completion_tokens,
            cache_read_tokens: self.prompt_tokens_details.and_then(|d| d.cached_tokens),
            cache_write_tokens: None,
        }
    }
}

/// Chat's `finish_reason` as a finish (`function_call` is the legacy name of `tool_calls`;
/// anything newer reads as a plain stop).
pub fn finish(reason: &str) -> Finish {
    match reason {
        "length" => Finish::Length,
        "tool_calls" | "function_call" => Finish::ToolCalls,
        "content_filter" => Finish::ContentFilter,
        _ => Finish::Stop,
    }
}

/// A `chat.completion` (the first choice) as a core answer.
pub fn parse_completion(body: &[u8]) -> Result<core::Response, Refusal> {
    let wire: WireCompletion = de::read(body)?;
    if let Some(error) = wire.error {
        return Err(error_refusal(error, "the answer"));
    }
    let choice = wire
        .choices
        .and_then(|choices| choices.into_iter().next())
        .ok_or_else(|| Refusal::at("choices", "the completion has no choice"))?;
    let message =
        choice.message.ok_or_else(|| Refusal::at("choices[0].message", "field required"))?;
    let mut parts = Vec::new();
    if let Some(text) = message.reasoning_content.filter(|t| !t.is_empty()) {
        parts.push(Part::Thinking { text, signature: None });
    }
    if let Some(text) = message.content.filter(|t| !t.is_empty()) {
        parts.push(Part::Text(text));
    }
    let refused = message.refusal.is_some();
    if let Some(text) = message.refusal {
        parts.push(Part::Text(text));
    }
    for (k, call) in message.tool_calls.unwrap_or_default().into_iter().enumerate() {
        let at = format!("choices[0].message.tool_calls[{k}]");
        let function =
            call.function.ok_or_else(|| Refusal::at(format!("{at}.function"), "field required"))?;
        parts.push(Part::ToolCall {
            id: call.id.ok_or_else(|| Refusal::at(format!("{at}.id"), "field required"))?,
            name: function
                .name
                .ok_or_else(|| Refusal::at(format!("{at}.function.name"), "field required"))?,
            arguments: function.arguments.unwrap_or_default(),
        });
    }
    let finish = if refused {
        Finish::Refusal
    } else {
        finish(choice.finish_reason.as_deref().unwrap_or("stop"))
    };
    Ok(core::Response {
        id: wire.id,
        model: wire.model,
        parts,
        finish,
        usage: wire.usage.map(WireUsage::core).unwrap_or_default(),
    })
}

// === Stream chunks: reading ===

#[derive(Deserialize)]
struct WireChunk {
    #[serde(default)]
    id: String,
    #[serde(default)]
    model: String,
    #[serde(default)]
    choices: Vec<WireChunkChoice>,
    usage: Option<WireUsage>,
    error: Option<WireError>,
}

#[derive(Deserialize)]
struct WireChunkChoice {
    delta: Option<WireDelta>,
    finish_reason: Option<String>,
}

#[derive(Deserialize)]
struct WireDelta {
    content: Option<String>,
    refusal: Option<String>,
    reasoning_content: Option<String>,
    tool_calls: Option<Vec<WireToolCall>>,
}

/// One stream's `chat.completion.chunk`s → core events. `Start` comes once, from the first
/// chunk with an id (Azure's first chunk, with content-filter results only, has none).
#[derive(Default)]
pub struct ChunkDecoder {
    started: bool,
}

impl ChunkDecoder {
    pub fn new() -> Self {
        Self::default()
    }

    /// The events of one chunk (an SSE `data:` payload other than `[DONE]`). An error frame
    /// (`{"error": {...}}`) is refused as `error`; [`parse_error`] reads it apart.
    pub fn decode(&mut self, data: &[u8]) -> Result<Vec<Event>, Refusal> {
        let chunk: WireChunk = de::read(data)?;
        if let Some(error) = chunk.error {
            return Err(error_refusal(error, "the stream's frame"));
        }
        let mut events = Vec::new();
        if !self.started && !chunk.id.is_empty() {
            self.started = true;
            events.push(Event::Start { id: chunk.id, model: chunk.model });
        }
        // One choice is asked for (`n` is 1); the first is the answer.
        if let Some(choice) = chunk.choices.into_iter().next() {
            if let Some(delta) = choice.delta {
                if let Some(text) = delta.reasoning_content.filter(|t| !t.is_empty()) {
                    events.push(Event::ThinkingDelta { text, signature: None });
                }
                if let Some(text) = delta.content.filter(|t| !t.is_empty()) {
                    events.push(Event::TextDelta(text));
                }
                if let Some(text) = delta.refusal.filter(|t| !t.is_empty()) {
                    events.push(Event::TextDelta(text));
                }
                for (k, call) in delta.tool_calls.unwrap_or_default().into_iter().enumerate() {
                    let index = call.index.unwrap_or(k as u32);
                    let (name, arguments) = match call.function {
                        Some(f) => (f.name, f.arguments),
                        None => (None, None),
                    };
                    if call.id.is_some() || name.is_some() {
                        events.push(Event::ToolCallStart {
                            index,
                            id: call.id.unwrap_or_default(),
                            name: name.unwrap_or_default(),
                        });
                    }
                    if let Some(arguments) = arguments.filter(|a| !a.is_empty()) {
                        events.push(Event::ToolCallDelta { index, arguments });
                    }
                }
            }
            if let Some(reason) = choice.finish_reason {
                events.push(Event::Finish(finish(&reason)));
            }
        }
        if let Some(usage) = chunk.usage {
            events.push(Event::Usage(usage.core()));
        }
        Ok(events)
    }
}

// === Completions and chunks: writing ===

#[derive(Serialize)]
struct OutCompletion<'a> {
    id: &'a str,
    object: &'static str,
    created: u64,
    model: &'a str,
    choices: [OutChoice<'a>; 1],
    usage: OutUsage,
}

#[derive(Serialize)]
struct OutChoice<'a> {
    index: u32,
    message: OutAnswer<'a>,
    logprobs: Option<()>,
    finish_reason: &'static str,
}

#[derive(Serialize)]
struct OutAnswer<'a> {
    role: &'static str,
    content: Option<String>,
    refusal: Option<()>,
    #[serde(skip_serializing_if = "Vec::is_empty")]
    tool_calls: Vec<OutToolCall<'a>>,
}

#[derive(Serialize)]
struct OutUsage {
    prompt_tokens: u64,
    completion_tokens: u64,
    total_tokens: u64,
    prompt_tokens_details: OutUsageDetails,
}

#[derive(Serialize)]
struct OutUsageDetails {
    cached_tokens: u64,
}

impl OutUsage {
    fn of(usage: &Usage) -> Self {
        OutUsage {
            prompt_tokens: usage.input_tokens,
            completion_tokens: usage.output_tokens,
            total_tokens: usage.input_tokens.saturating_add(usage.output_tokens),
            prompt_tokens_details: OutUsageDetails {
                cached_tokens: usage.cache_read_tokens.unwrap_or(0),
            },
        }
    }
}

/// A finish as Chat's `finish_reason` (a stop sequence is a `stop`; a refusal reads as
/// `content_filter`, as Chat has no other word for it).
pub fn finish_reason(finish: &Finish) -> &'static str {
    match finish {
        Finish::Stop | Finish::StopSequence(_) => "stop",
        Finish::Length => "length",
        Finish::ToolCalls => "tool_calls",
        Finish::ContentFilter | Finish::Refusal => "content_filter",
    }
}

/// Seconds since the Unix epoch, for `created`.
fn now() -> u64 {
    std::time::SystemTime::now().duration_since(std::time::UNIX_EPOCH).map_or(0, |d| d.as_secs())
}

/// A whole answer as a `chat.completion`, with `model` as its model and the time now as
/// `created`. Text parts are joined as `content`; thinking is left out (a completion has no
/// place for it).
pub fn completion_body(response: &core::Response, model: &str) -> Vec<u8> {
    completion_body_at(response, model, now())
}

/// [`completion_body`] with `created` given.
pub fn completion_body_at(response: &core::Response, model: &str, created: u64) -> Vec<u8> {
    let (text, tool_calls) = text_and_calls(&response.parts);
    de::to_vec(&OutCompletion {
        id: &response.id,
        object: "chat.completion",
        created,
        model,
        choices: [OutChoice {
            index: 0,
            message: OutAnswer {
                role: "assistant",
                content: (!text.is_empty() || tool_calls.is_empty()).then_some(text),
                refusal: None,
                tool_calls,
            },
            logprobs: None,
            finish_reason: finish_reason(&response.finish),
        }],
        usage: OutUsage::of(&response.usage),
    })
}

#[derive(Serialize)]
struct OutChunk<'a> {
    id: &'a str,
    object: &'static str,
    created: u64,
    model: &'a str,
    choices: Vec<OutChunkChoice<'a>>,
    #[serde(skip_serializing_if = "Option::is_none")]
    usage: Option<OutUsage>,
}

#[derive(Serialize)]
struct OutChunkChoice<'a> {
    index: u32,
    delta: OutDelta<'a>,
    logprobs: Option<()>,
    finish_reason: Option<&'static str>,
}

#[derive(Serialize, Default)]
struct OutDelta<'a> {
    #[serde(skip_serializing_if = "Option::is_none")]
    role: Option<&'static str>,
    #[serde(skip_serializing_if = "Option::is_none")]
    content: Option<&'a str>,
    #[serde(skip_serializing_if = "Vec::is_empty")]
    tool_calls: Vec<OutToolCallDelta<'a>>,
}

#[derive(Serialize)]
struct OutToolCallDelta<'a> {
    index: u32,
    #[serde(skip_serializing_if = "Option::is_none")]
    id: Option<&'a str>,
    #[serde(rename = "type", skip_serializing_if = "Option::is_none")]
    kind: Option<&'static str>,
    function: OutFunctionDelta<'a>,
}

#[derive(Serialize)]
struct OutFunctionDelta<'a> {
    #[serde(skip_serializing_if = "Option::is_none")]
    name: Option<&'a str>,
    arguments: &'a str,
}

/// The `data:` payload that ends a Chat stream.
pub const DONE: &[u8] = b"[DONE]";

/// Core events → `chat.completion.chunk` payloads (each one SSE `data:`; the caller ends
/// the stream with [`DONE`]). `Start` gives the role chunk; thinking is left out, as in a
/// completion; `Usage` becomes the final usage chunk (empty `choices`) when the client
/// asked for it (`stream_options.include_usage`).
pub struct Encoder {
    id: String,
    model: String,
    created: u64,
    include_usage: bool,
}

impl Encoder {
    pub fn new(model: &str, include_usage: bool) -> Self {
        Self::at(model, include_usage, now())
    }

    /// An encoder with `created` given.
    pub fn at(model: &str, include_usage: bool, created: u64) -> Self {
        Encoder { id: String::new(), model: model.to_owned(), created, include_usage }
    }

    pub fn push(&mut self, event: Event, out: &mut Vec<Vec<u8>>) {
        let (delta, finish_reason) = match &event {
            Event::Start { id, .. } => {
                self.id.clone_from(id);
                (
                    OutDelta { role: Some("assistant"), content: Some(""), ..OutDelta::default() },
                    None,
                )
            }
            Event::TextDelta(text) if !text.is_empty() => {
                (OutDelta { content: Some(text), ..OutDelta::default() }, None)
            }
            Event::ToolCallStart { index, id, name } => (
                OutDelta {
                    tool_calls: vec![OutToolCallDelta {
                        index: *index,
                        id: Some(id),
                        kind: Some("function"),
                        function: OutFunctionDelta { name: Some(name), arguments: "" },
                    }],
                    ..OutDelta::default()
                },
                None,
            ),
            Event::ToolCallDelta { index, arguments } => (
                OutDelta {
                    tool_calls: vec![OutToolCallDelta {
                        index: *index,
                        id: None,
                        kind: None,
                        function: OutFunctionDelta { name: None, arguments },
                    }],
                    ..OutDelta::default()
                },
                None,
            ),
            Event::Finish(finish) => (OutDelta::default(), Some(finish_reason(finish))),
            Event::Usage(usage) => {
                if self.include_usage {
                    out.push(de::to_vec(&OutChunk {
                        id: &self.id,
                        object: "chat.completion.chunk",
                        created: self.created,
                        model: &self.model,
                        choices: Vec::new(),
                        usage: Some(OutUsage::of(usage)),
                    }));
                }
                return;
            }
            Event::TextDelta(_) | Event::ThinkingDelta { .. } => return,
        };
        out.push(de::to_vec(&OutChunk {
            id: &self.id,
            object: "chat.completion.chunk",
            created: self.created,
            model: &self.model,
            choices: vec![OutChunkChoice { index: 0, delta, logprobs: None, finish_reason }],
            usage: None,
        }));
    }
}

#[cfg(test)]
mod tests {
    use serde_json::{Value, json};

    use super::*;
    use crate::core::{Effort, Message, Reasoning, Request, Tool, ToolChoice};

    fn body(bytes: &[u8]) -> Value {
        serde_json::from_slice(bytes).unwrap()
    }

    fn user(parts: Vec<Part>) -> Message {
        Message { role: Role::User, parts }
    }

    fn assistant(parts: Vec<Part>) -> Message {
        Message { role: Role::Assistant, parts }
    }

    fn parse(body: Value) -> Result<Request, Refusal> {
        parse_request(body.to_string().as_bytes())
    }

    #[track_caller]
    fn assert_refuses(body: Value, field: &str) {
        match parse(body) {
            Ok(request) => panic!("accepted: {request:?}"),
            Err(refusal) => {
                assert_eq!(refusal.field, field, "{refusal:?}");
                assert!(refusal.message.contains(&format!("`{field}`")), "{refusal:?}");
            }
        }
    }

    fn chat(extra: Value) -> Value {
        let mut body = json!({"model": "m", "messages": [{"role": "user", "content": "hi"}]});
        if let (Some(body), Some(extra)) = (body.as_object_mut(), extra.as_object()) {
            for (k, v) in extra {
                body.insert(k.clone(), v.clone());
            }
        }
        body
    }

    fn called() -> Value {
        json!({"role": "assistant", "content": null, "tool_calls": [
            {"id": "call_1", "type": "function", "function": {"name": "get", "arguments": "{\"a\":1}"}}]})
    }

    #[test]
    fn a_chat_request_reads_into_the_core_form() {
        let request = parse(chat(json!({
            "messages": [
                {"role": "system", "content": "sys"},
                {"role": "developer", "content": [{"type": "text", "text": "dev"}]},
                {"role": "user", "content": [{"type": "text", "text": "look"},
                    {"type": "image_url", "image_url": {"url": "data:image/png;base64,iVBO", "detail": "high"}}]},
                called(),
                {"role": "tool", "tool_call_id": "call_1", "content": "42"},
                {"role": "user", "content": "thanks"}
            ],
            "tools": [{"type": "function", "function": {"name": "get", "parameters": {"type": "object"}}},
                      {"type": "function", "function": {"name": "none"}}],
            "tool_choice": "required", "parallel_tool_calls": false,
            "max_tokens": 10, "max_completion_tokens": 20, "temperature": 1.5, "top_p": 0.5,
            "stop": "END", "stream": true, "stream_options": {"include_usage": true},
            "user": "u", "reasoning_effort": "minimal", "seed": 1, "response_format": {"type": "json_object"}
        })))
        .unwrap();
        assert_eq!(request.system, vec!["sys", "dev"]);
        assert_eq!(
            request.messages,
            vec![
                user(vec![
                    Part::Text("look".into()),
                    Part::Image(Image::Base64 {
                        media_type: "image/png".into(),
                        data: "iVBO".into()
                    })
                ]),
                assistant(vec![Part::ToolCall {
                    id: "call_1".into(),
                    name: "get".into(),
                    arguments: r#"{"a":1}"#.into()
                }]),
                user(vec![
                    Part::ToolResult {
                        call_id: "call_1".into(),
                        content: vec![Part::Text("42".into())],
                        is_error: false
                    },
                    Part::Text("thanks".into())
                ]),
            ]
        );
        assert_eq!(request.tools[1].parameters.get(), r#"{"type":"object","properties":{}}"#);
        assert_eq!(
            request.tool_choice,
            Some(ToolChoice { mode: ToolMode::Any, parallel: Some(false) })
        );
        assert_eq!(request.max_tokens, Some(20));
        assert_eq!(request.temperature, Some(1.5));
        assert_eq!(request.stop, vec!["END"]);
        assert!(request.stream);
        assert_eq!(request.user.as_deref(), Some("u"));
        assert_eq!(request.reasoning, Some(Reasoning::Effort(Effort::Low)));
        assert_eq!(request.seed, Some(1));
        assert_eq!(request.format, Some(Format::JsonObject));
        assert!(request.hints.is_empty(), "{:?}", request.hints);
    }

    #[test]
    fn parallel_tool_calls_alone_is_an_auto_choice_and_max_tokens_is_the_fallback() {
        let request = parse(chat(json!({"parallel_tool_calls": true, "max_tokens": 7}))).unwrap();
        assert_eq!(
            request.tool_choice,
            Some(ToolChoice { mode: ToolMode::Auto, parallel: Some(true) })
        );
        assert_eq!(request.max_tokens, Some(7));
        let request =
            parse(chat(json!({"tools": [{"type": "function", "function": {"name": "get"}}],
            "tool_choice": {"type": "function", "function": {"name": "get"}}})))
            .unwrap();
        assert_eq!(
            request.tool_choice,
            Some(ToolChoice { mode: ToolMode::Tool("get".into()), parallel: None })
        );
    }

    #[test]
    fn every_chat_refusal_names_its_field_in_chat_terms() {
        assert_refuses(json!({"model": "m"}), "messages");
        assert_refuses(chat(json!({"messages": {}})), "messages");
        assert_refuses(chat(json!({"messages": []})), "messages");
        assert_refuses(
            chat(json!({"messages": [{"role": "function", "content": "x"}]})),
            "messages[0].role",
        );
        assert_refuses(chat(json!({"messages": [{"role": "user"}]})), "messages[0].content");
        assert_refuses(
            chat(
                json!({"messages": [{"role": "user", "content": [{"type": "video_url", "video_url": {}}]}]}),
            ),
            "messages[0].content[0].type",
        );
        assert_refuses(
            chat(
                json!({"messages": [{"role": "user", "content": [{"type": "input_audio", "input_audio": {}}]}]}),
            ),
            "messages[0].content[0].input_audio.data",
        );
        assert_refuses(
            chat(
                json!({"messages": [{"role": "user", "content": [{"type": "file", "file": {"file_id": "file-1"}}]}]}),
            ),
            "messages[0].content[0].file.file_data",
        );
        assert_refuses(
            chat(
                json!({"messages": [{"role": "user", "content": [{"type": "image_url", "image_url": {"url": "file:///etc/passwd"}}]}]}),
            ),
            "messages[0].content[0].image_url.url",
        );
        assert_refuses(
            chat(
                json!({"messages": [{"role": "user", "content": [{"type": "image_url", "image_url": {"url": "data:image/png,abc"}}]}]}),
            ),
            "messages[0].content[0].image_url.url",
        );
        assert_refuses(
            chat(
                json!({"messages": [{"role": "system", "content": [{"type": "image_url", "image_url": {"url": "https://x"}}]}]}),
            ),
            "messages[0].content[0].type",
        );
        let mut bad = called();
        bad["tool_calls"][0]["function"]["arguments"] = json!("{\"a\":");
        assert_refuses(
            chat(json!({"messages": [{"role": "user", "content": "hi"}, bad]})),
            "messages[1].tool_calls[0].function.arguments",
        );
        let mut bad = called();
        bad["tool_calls"][0]["function"]["arguments"] = json!("[1]");
        assert_refuses(
            chat(json!({"messages": [{"role": "user", "content": "hi"}, bad]})),
            "messages[1].tool_calls[0].function.arguments",
        );
        let mut bad = called();
        bad["tool_calls"][0]["id"] = Value::Null;
        assert_refuses(
            chat(json!({"messages": [{"role": "user", "content": "hi"}, bad]})),
            "messages[1].tool_calls[0].id",
        );
        assert_refuses(
            chat(json!({"messages": [{"role": "user", "content": "hi"}, called(),
                {"role": "tool", "tool_call_id": "call_2", "content": "?"}]})),
            "messages[2].tool_call_id",
        );
        assert_refuses(
            chat(
                json!({"messages": [{"role": "user", "content": "hi"}, called(), {"role": "tool", "content": "?"}]}),
            ),
            "messages[2].tool_call_id",
        );
        assert_refuses(chat(json!({"tools": [{"type": "custom", "custom": {}}]})), "tools[0].type");
        assert_refuses(chat(json!({"tools": [{"type": "function"}]})), "tools[0].function");
        assert_refuses(
            chat(
                json!({"tools": [{"type": "function", "function": {"name": "f", "parameters": []}}]}),
            ),
            "tools[0].function.parameters",
        );
        // A missing field is named itself, not the object that lacks it.
        assert_refuses(
            chat(json!({"tools": [{"type": "function", "function": {}}]})),
            "tools[0].function.name",
        );
        assert_refuses(chat(json!({"tool_choice": "sometimes"})), "tool_choice");
        assert_refuses(
            chat(json!({"tool_choice": {"type": "function", "function": {"name": "x"}}})),
            "tool_choice.function.name",
        );
        assert_refuses(chat(json!({"tool_choice": {"type": "allowed_tools"}})), "tool_choice.type");
        // An error inside the object form keeps its path.
        assert_refuses(
            chat(json!({"tool_choice": {"type": "function", "function": {}}})),
            "tool_choice.function.name",
        );
        assert_refuses(
            chat(json!({"tool_choice": {"type": "function", "function": {"name": 7}}})),
            "tool_choice.function.name",
        );
        assert_refuses(chat(json!({"tool_choice": 3})), "tool_choice");
        assert_refuses(chat(json!({"temperature": 2.5})), "temperature");
        assert_refuses(chat(json!({"top_p": -1})), "top_p");
        assert_refuses(chat(json!({"stop": 5})), "stop");
        assert_refuses(chat(json!({"max_completion_tokens": -5})), "max_completion_tokens");
        assert_refuses(chat(json!({"reasoning_effort": "max"})), "reasoning_effort");
        assert_refuses(chat(json!({"stream": 1})), "stream");
    }

    #[test]
    fn an_empty_arguments_string_reads_as_an_empty_object() {
        let mut call = called();
        call["tool_calls"][0]["function"]["arguments"] = json!("");
        let request =
            parse(chat(json!({"messages": [{"role": "user", "content": "hi"}, call]}))).unwrap();
        assert_eq!(
            request.messages[1].parts,
            vec![Part::ToolCall {
                id: "call_1".into(),
                name: "get".into(),
                arguments: "{}".into()
            }]
        );
    }

    #[test]
    fn a_response_becomes_a_chat_completion() {
        let response = core::Response {
            id: "msg_1".into(),
            model: "claude".into(),
            parts: vec![
                Part::Thinking { text: "hmm".into(), signature: Some("s".into()) },
                Part::Text("a".into()),
                Part::Text("b".into()),
                Part::ToolCall {
                    id: "toolu_1".into(),
                    name: "get".into(),
                    arguments: r#"{"a":1}"#.into(),
                },
            ],
            finish: Finish::ToolCalls,
            usage: Usage {
                input_tokens: 10,
                output_tokens: 2,
                cache_read_tokens: Some(3),
                cache_write_tokens: Some(1),
            },
        };
        assert_eq!(
            body(&completion_body_at(&response, "served", 7)),
            json!({"id": "msg_1", "object": "chat.completion", "created": 7, "model": "served",
                "choices": [{"index": 0, "message": {"role": "assistant", "content": "ab", "refusal": null,
                    "tool_calls": [{"id": "toolu_1", "type": "function", "function": {"name": "get", "arguments": "{\"a\":1}"}}]},
                    "logprobs": null, "finish_reason": "tool_calls"}],
                "usage": {"prompt_tokens": 10, "completion_tokens": 2, "total_tokens": 12,
                          "prompt_tokens_details": {"cached_tokens": 3}}})
        );
        let only_calls =
            core::Response { parts: vec![response.parts[3].clone()], ..response.clone() };
        assert_eq!(
            body(&completion_body_at(&only_calls, "s", 0))["choices"][0]["message"]["content"],
            Value::Null
        );
        let empty = core::Response { parts: vec![], finish: Finish::Refusal, ..response };
        let b = body(&completion_body(&empty, "s"));
        assert_eq!(b["choices"][0]["message"]["content"], "");
        assert_eq!(b["choices"][0]["finish_reason"], "content_filter");
        assert!(b["created"].as_u64().unwrap() > 1_700_000_000);
    }

    #[test]
    fn finishes_map_to_finish_reasons() {
        assert_eq!(finish_reason(&Finish::Stop), "stop");
        assert_eq!(finish_reason(&Finish::StopSequence(Some("x".into()))), "stop");
        assert_eq!(finish_reason(&Finish::Length), "length");
        assert_eq!(finish_reason(&Finish::ToolCalls), "tool_calls");
        assert_eq!(finish_reason(&Finish::ContentFilter), "content_filter");
        assert_eq!(finish_reason(&Finish::Refusal), "content_filter");
    }

    #[test]
    fn events_become_chunks_with_usage_only_when_asked() {
        let events = vec![
            Event::Start { id: "msg_1".into(), model: "claude".into() },
            Event::ThinkingDelta { text: "hmm".into(), signature: None },
            Event::TextDelta("Hi".into()),
            Event::TextDelta(String::new()),
            Event::ToolCallStart { index: 0, id: "toolu_1".into(), name: "get".into() },
            Event::ToolCallDelta { index: 0, arguments: "{}".into() },
            Event::Finish(Finish::ToolCalls),
            Event::Usage(Usage { input_tokens: 5, output_tokens: 1, ..Usage::default() }),
        ];
        let run = |include_usage: bool| {
            let mut encoder = Encoder::at("served", include_usage, 9);
            let mut out = Vec::new();
            for event in events.clone() {
                encoder.push(event, &mut out);
            }
            out.iter().map(|c| body(c)).collect::<Vec<Value>>()
        };
        let chunks = run(true);
        let head = |delta: Value, finish: Value| {
            json!({"id": "msg_1", "object": "chat.completion.chunk", "created": 9,
            "model": "served", "choices": [{"index": 0, "delta": delta, "logprobs": null, "finish_reason": finish}]})
        };
        assert_eq!(
            chunks,
            vec![
                head(json!({"role": "assistant", "content": ""}), Value::Null),
                head(json!({"content": "Hi"}), Value::Null),
                head(
                    json!({"tool_calls": [{"index": 0, "id": "toolu_1", "type": "function", "function": {"name": "get", "arguments": ""}}]}),
                    Value::Null
                ),
                head(
                    json!({"tool_calls": [{"index": 0, "function": {"arguments": "{}"}}]}),
                    Value::Null
                ),
                head(json!({}), json!("tool_calls")),
                json!({"id": "msg_1", "object": "chat.completion.chunk", "created": 9, "model": "served", "choices": [],
                    "usage": {"prompt_tokens": 5, "completion_tokens": 1, "total_tokens": 6, "prompt_tokens_details": {"cached_tokens": 0}}}),
            ]
        );
        assert_eq!(run(false).len(), chunks.len() - 1);
    }

    #[test]
    fn a_request_becomes_a_chat_body_without_model() {
        let request = Request {
            system: vec!["one".into(), "two".into()],
            messages: vec![user(vec![Part::Text("hi".into())])],
            max_tokens: Some(64),
            temperature: Some(0.2),
            top_p: Some(0.9),
            stop: vec!["END".into()],
            user: Some("u-1".into()),
            ..Request::default()
        };
        let (bytes, hints) = request_body(&request, false);
        assert_eq!(
            body(&bytes),
            json!({
                "messages": [{"role": "system", "content": "one\n\ntwo"}, {"role": "user", "content": "hi"}],
                "max_completion_tokens": 64, "temperature": 0.2, "top_p": 0.9, "stop": ["END"],
                "user": "u-1", "stream": false
            })
        );
        assert!(hints.is_empty());
    }

    #[test]
    fn tool_calls_results_and_images_take_chats_places() {
        let request = Request {
            messages: vec![
                user(vec![
                    Part::Text("look".into()),
                    Part::Image(Image::Base64 {
                        media_type: "image/png".into(),
                        data: "iVBO".into(),
                    }),
                ]),
                assistant(vec![
                    Part::Thinking { text: "hmm".into(), signature: Some("s".into()) },
                    Part::Text("Checking.".into()),
                    Part::ToolCall {
                        id: "toolu_1".into(),
                        name: "get".into(),
                        arguments: r#"{"a":1}"#.into(),
                    },
                    Part::ToolCall {
                        id: "toolu_2".into(),
                        name: "get".into(),
                        arguments: r#"{"a":2}"#.into(),
                    },
                ]),
                user(vec![
                    Part::Text("and then?".into()),
                    Part::ToolResult {
                        call_id: "toolu_1".into(),
                        content: vec![Part::Text("one".into()), Part::Text("more".into())],
                        is_error: false,
                    },
                    Part::ToolResult {
                        call_id: "toolu_2".into(),
                        content: vec![Part::Image(Image::Url("https://x/a.png".into()))],
                        is_error: true,
                    },
                ]),
                assistant(vec![Part::ToolCall {
                    id: "toolu_3".into(),
                    name: "get".into(),
                    arguments: "{}".into(),
                }]),
            ],
            ..Request::default()
        };
        let (bytes, _) = request_body(&request, false);
        assert_eq!(
            body(&bytes)["messages"],
            json!([
                {"role": "user", "content": [
                    {"type": "text", "text": "look"},
                    {"type": "image_url", "image_url": {"url": "data:image/png;base64,iVBO"}}]},
                {"role": "assistant", "content": "Checking.", "tool_calls": [
                    {"id": "toolu_1", "type": "function", "function": {"name": "get", "arguments": "{\"a\":1}"}},
                    {"id": "toolu_2", "type": "function", "function": {"name": "get", "arguments": "{\"a\":2}"}}]},
                {"role": "tool", "tool_call_id": "toolu_1", "content": "one\nmore"},
                {"role": "tool", "tool_call_id": "toolu_2", "content": ""},
                {"role": "user", "content": [
                    {"type": "image_url", "image_url": {"url": "https://x/a.png"}},
                    {"type": "text", "text": "and then?"}]},
                {"role": "assistant", "content": null, "tool_calls": [
                    {"id": "toolu_3", "type": "function", "function": {"name": "get", "arguments": "{}"}}]}
            ])
        );
    }

    #[test]
    fn tools_and_tool_choice_map_to_functions() {
        let tools = vec![Tool {
            name: "get".into(),
            description: None,
            parameters: RawJson::new(r#"{"type":"object"}"#.into()).unwrap(),
        }];
        let choice = |mode: ToolMode, parallel: Option<bool>, tools: Vec<Tool>| {
            let request = Request {
                tools,
                tool_choice: Some(ToolChoice { mode, parallel }),
                ..Request::default()
            };
            let b = body(&request_body(&request, false).0);
            (b["tool_choice"].clone(), b["parallel_tool_calls"].clone(), b["tools"].clone())
        };
        let (c, p, t) = choice(ToolMode::Auto, Some(false), tools.clone());
        assert_eq!((c, p), (json!("auto"), json!(false)));
        assert_eq!(
            t,
            json!([{"type": "function", "function": {"name": "get", "parameters": {"type": "object"}}}])
        );
        assert_eq!(choice(ToolMode::None, None, tools.clone()).0, json!("none"));
        assert_eq!(choice(ToolMode::Any, None, tools.clone()).0, json!("required"));
        assert_eq!(
            choice(ToolMode::Tool("get".into()), None, tools.clone()).0,
            json!({"type": "function", "function": {"name": "get"}})
        );
        // No `parallel_tool_calls` without tools: OpenAI refuses it.
        assert_eq!(choice(ToolMode::Auto, Some(true), vec![]).1, Value::Null);
    }

    #[test]
    fn streaming_asks_for_usage() {
        let request = Request { stream: true, ..Request::default() };
        let b = body(&request_body(&request, false).0);
        assert_eq!(b["stream"], true);
        assert_eq!(b["stream_options"], json!({"include_usage": true}));
    }

    #[test]
    fn reasoning_becomes_an_effort_only_where_allowed_else_a_dropped_hint() {
        let request = Request {
            reasoning: Some(Reasoning::Budget(31999)),
            top_k: Some(5),
            hints: vec!["cache_control", "context_management"],
            ..Request::default()
        };
        let (bytes, hints) = request_body(&request, true);
        assert_eq!(body(&bytes)["reasoning_effort"], "high");
        assert!(body(&bytes).get("top_k").is_none());
        assert_eq!(hints, vec!["cache_control", "context_management", "top_k"]);
        let (bytes, hints) = request_body(&request, false);
        assert!(body(&bytes).get("reasoning_effort").is_none());
        assert_eq!(hints, vec!["cache_control", "context_management", "top_k", "thinking"]);
        let long = Request { user: Some("u".repeat(MAX_USER_CHARS + 1)), ..Request::default() };
        let (bytes, hints) = request_body(&long, false);
        assert!(body(&bytes).get("user").is_none());
        assert_eq!(hints, vec!["user"]);
        let fits = Request { user: Some("é".repeat(MAX_USER_CHARS)), ..Request::default() };
        assert_eq!(body(&request_body(&fits, false).0)["user"], "é".repeat(MAX_USER_CHARS));
        let low = Request { reasoning: Some(Reasoning::Effort(Effort::Low)), ..Request::default() };
        assert_eq!(body(&request_body(&low, true).0)["reasoning_effort"], "low");
    }

    #[test]
    fn a_completion_reads_into_a_response() {
        let completion = json!({
            "id": "chatcmpl-1", "object": "chat.completion", "created": 1, "model": "gpt-4o-2024",
            "choices": [{"index": 0, "message": {"role": "assistant", "content": "Hi", "refusal": null,
                "tool_calls": [{"id": "call_1", "type": "function", "function": {"name": "get", "arguments": "{\"a\":1}"}}]},
                "finish_reason": "tool_calls"}],
            "usage": {"prompt_tokens": 10, "completion_tokens": 3, "total_tokens": 13,
                      "prompt_tokens_details": {"cached_tokens": 4}}
        });
        let response = parse_completion(completion.to_string().as_bytes()).unwrap();
        assert_eq!(
            response,
            core::Response {
                id: "chatcmpl-1".into(),
                model: "gpt-4o-2024".into(),
                parts: vec![
                    Part::Text("Hi".into()),
                    Part::ToolCall {
                        id: "call_1".into(),
                        name: "get".into(),
                        arguments: r#"{"a":1}"#.into()
                    }
                ],
                finish: Finish::ToolCalls,
                usage: Usage {
                    input_tokens: 10,
                    output_tokens: 3,
                    cache_read_tokens: Some(4),
                    cache_write_tokens: None
                },
            }
        );
    }

    #[test]
    fn a_refusal_or_reasoning_in_a_completion_is_kept() {
        let completion = json!({"id": "c", "model": "m", "choices": [{"message": {"content": null,
            "reasoning_content": "why", "refusal": "I can't"}, "finish_reason": "stop"}]});
        let response = parse_completion(completion.to_string().as_bytes()).unwrap();
        assert_eq!(
            response.parts,
            vec![
                Part::Thinking { text: "why".into(), signature: None },
                Part::Text("I can't".into())
            ]
        );
        assert_eq!(response.finish, Finish::Refusal);
        assert_eq!(response.usage, Usage::default());
    }

    #[test]
    fn a_completion_without_an_answer_is_refused_naming_the_field() {
        let refusal = parse_completion(br#"{"id": "c", "choices": []}"#).unwrap_err();
        assert_eq!(refusal.field, "choices");
        let refusal = parse_completion(br#"{"choices": [{"finish_reason": "stop"}]}"#).unwrap_err();
        assert_eq!(refusal.field, "choices[0].message");
        let refusal = parse_completion(
            br#"{"choices": [{"message": {"tool_calls": [{"id": "x", "function": {"arguments": "{}"}}]}}]}"#,
        )
        .unwrap_err();
        assert_eq!(refusal.field, "choices[0].message.tool_calls[0].function.name");
        assert!(refusal.message.contains("`choices[0].message.tool_calls[0].function.name`"));
        let refusal =
            parse_completion(br#"{"choices": [{"message": {"content": 5}}]}"#).unwrap_err();
        assert_eq!(refusal.field, "choices[0].message.content");
    }

    #[test]
    fn finish_reasons_map_to_finishes() {
        assert_eq!(finish("stop"), Finish::Stop);
        assert_eq!(finish("length"), Finish::Length);
        assert_eq!(finish("tool_calls"), Finish::ToolCalls);
        assert_eq!(finish("function_call"), Finish::ToolCalls);
        assert_eq!(finish("content_filter"), Finish::ContentFilter);
        assert_eq!(finish("something_new"), Finish::Stop);
    }

    #[test]
    fn a_chunk_stream_decodes_into_events_with_one_start() {
        let chunks = [
            // Azure's first chunk: content-filter results, no id, no choices.
            json!({"id": "", "object": "", "model": "", "choices": [], "prompt_filter_results": []}),
            json!({"id": "chatcmpl-1", "object": "chat.completion.chunk", "model": "gpt-4o",
                   "choices": [{"index": 0, "delta": {"role": "assistant", "content": ""}, "finish_reason": null}]}),
            json!({"id": "chatcmpl-1", "model": "gpt-4o", "choices": [{"index": 0, "delta": {"content": "Hi"}}]}),
            json!({"id": "chatcmpl-1", "model": "gpt-4o", "choices": [{"index": 0, "delta": {"tool_calls": [
                {"index": 0, "id": "call_1", "type": "function", "function": {"name": "get", "arguments": ""}}]}}]}),
            json!({"id": "chatcmpl-1", "model": "gpt-4o", "choices": [{"index": 0, "delta": {"tool_calls": [
                {"index": 0, "function": {"arguments": "{\"a\":1}"}}]}}]}),
            json!({"id": "chatcmpl-1", "model": "gpt-4o", "choices": [{"index": 0, "delta": {}, "finish_reason": "tool_calls"}]}),
            json!({"id": "chatcmpl-1", "model": "gpt-4o", "choices": [],
                   "usage": {"prompt_tokens": 9, "completion_tokens": 5, "total_tokens": 14}}),
        ];
        let mut decoder = ChunkDecoder::new();
        let events: Vec<Event> =
            chunks.iter().flat_map(|c| decoder.decode(c.to_string().as_bytes()).unwrap()).collect();
        assert_eq!(
            events,
            vec![
                Event::Start { id: "chatcmpl-1".into(), model: "gpt-4o".into() },
                Event::TextDelta("Hi".into()),
                Event::ToolCallStart { index: 0, id: "call_1".into(), name: "get".into() },
                Event::ToolCallDelta { index: 0, arguments: r#"{"a":1}"#.into() },
                Event::Finish(Finish::ToolCalls),
                Event::Usage(Usage { input_tokens: 9, output_tokens: 5, ..Usage::default() }),
            ]
        );
    }

    #[test]
    fn a_chunk_that_is_not_a_chunk_is_refused_naming_the_field() {
        let mut decoder = ChunkDecoder::new();
        assert_eq!(decoder.decode(b"[DONE]").unwrap_err().field, "body");
        assert_eq!(decoder.decode(br#"{"choices": 5}"#).unwrap_err().field, "choices");
        assert_eq!(
            decoder
                .decode(br#"{"choices": [{"delta": {"tool_calls": [{"index": "x"}]}}]}"#)
                .unwrap_err()
                .field,
            "choices[0].delta.tool_calls[0].index"
        );
    }

    #[test]
    fn an_error_envelope_is_refused_as_error_and_read_by_parse_error() {
        let error = br#"{"error": {"message": "Rate limit reached", "type": "requests", "param": null, "code": "rate_limit_exceeded"}}"#;
        let refusal = parse_completion(error).unwrap_err();
        assert_eq!(refusal.field, "error");
        assert_eq!(
            refusal.message,
            "`error`: the answer is an error (rate_limit_exceeded): Rate limit reached"
        );
        let refusal = ChunkDecoder::new().decode(error).unwrap_err();
        assert_eq!(refusal.field, "error");
        assert_eq!(
            refusal.message,
            "`error`: the stream's frame is an error (rate_limit_exceeded): Rate limit reached"
        );
        assert_eq!(
            parse_error(error),
            Some(ApiError {
                kind: Some("requests".into()),
                code: Some("rate_limit_exceeded".into()),
                message: "Rate limit reached".into(),
            })
        );
        // Some OpenAI-compatible servers send a numeric code.
        assert_eq!(
            parse_error(br#"{"error": {"message": "busy", "code": 503}}"#),
            Some(ApiError { kind: None, code: Some("503".into()), message: "busy".into() })
        );
        assert_eq!(parse_error(b"{}"), None);
        assert_eq!(parse_error(br#"{"id": "chatcmpl-1", "choices": []}"#), None);
    }
}
