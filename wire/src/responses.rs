//! OpenAI's Responses API (`POST /v1/responses`): requests into the [core] form, and answers
//! and their event streams out of it. A client format only: no provider is spoken to in it.
//!
//! The gateway is stateless: a request carries the whole conversation in `input` (as Codex
//! and the Agents SDK send it with `store: false`); `previous_response_id` is refused.
//! Refusals name fields as a Responses client wrote them (`input[2].call_id`).

use std::collections::HashSet;

use serde::Deserialize;
use serde::Serialize;
use serde::de::IgnoredAny;
use serde_json::value::RawValue;

use crate::Refusal;
use crate::core::{
    self, Effort, Event, Finish, Format, Image, Message, Part, Reasoning, Role, Tool, ToolChoice,
    ToolMode, Usage,
};
use crate::de::{self, OneOrList, OneOrObject};
pub use crate::sse::Frame;

// === Request: wire types ===

/// The body of `POST /v1/responses` ("Create a model response"). Unknown fields, the
/// gateway's own (`model`, `models`, `fallback_models`, `redundancy`), and those accepted
/// without effect on the answer (`metadata`, `store`, `include`, `prompt_cache_key`,
/// `client_metadata`, `truncation`) are not read here.
#[derive(Deserialize)]
struct WireRequest {
    input: Option<OneOrList<WireItem>>,
    instructions: Option<String>,
    tools: Option<Vec<WireTool>>,
    tool_choice: Option<OneOrObject<WireToolChoice>>,
    parallel_tool_calls: Option<bool>,
    /// Signed, so that a negative count is refused for its value, not its type.
    max_output_tokens: Option<i64>,
    temperature: Option<f64>,
    top_p: Option<f64>,
    text: Option<WireText>,
    reasoning: Option<WireReasoning>,
    stream: Option<bool>,
    user: Option<String>,
    safety_identifier: Option<String>,
    previous_response_id: Option<String>,
    conversation: Option<IgnoredAny>,
    background: Option<bool>,
    service_tier: Option<IgnoredAny>,
    prompt: Option<IgnoredAny>,
}

/// An `input` item of any type; which fields it needs depends on `type`, checked when it is
/// converted (so a missing field is named with the item's path). A message may leave out
/// `type` (the SDKs' "easy input message").
#[derive(Deserialize)]
struct WireItem {
    #[serde(rename = "type")]
    kind: Option<String>,
    role: Option<String>,
    content: Option<OneOrList<WireContent>>,
    call_id: Option<String>,
    name: Option<String>,
    arguments: Option<String>,
    output: Option<OneOrList<WireContent>>,
    /// An `additional_tools` item's tools.
    tools: Option<Vec<WireTool>>,
}

#[derive(Deserialize)]
struct WireContent {
    #[serde(rename = "type")]
    kind: String,
    text: Option<String>,
    refusal: Option<String>,
    image_url: Option<String>,
    file_id: Option<IgnoredAny>,
}

/// A tool of any type: `function` tools are read; a `namespace` holds more tools (Codex
/// groups an MCP server's tools in one); the built-in types have no core form.
#[derive(Deserialize)]
struct WireTool {
    #[serde(rename = "type")]
    kind: String,
    name: Option<String>,
    description: Option<String>,
    parameters: Option<Box<RawValue>>,
    tools: Option<Vec<WireTool>>,
}

#[derive(Deserialize)]
struct WireToolChoice {
    #[serde(rename = "type")]
    kind: String,
    name: Option<String>,
}

#[derive(Deserialize)]
struct WireText {
    format: Option<WireFormat>,
}

#[derive(Deserialize)]
struct WireFormat {
    #[serde(rename = "type")]
    kind: String,
    name: Option<String>,
    description: Option<String>,
    schema: Option<Box<RawValue>>,
    strict: Option<bool>,
}

#[derive(Deserialize)]
struct WireReasoning {
    effort: Option<String>,
}

/// OpenAI's sampling temperature range.
const MAX_TEMPERATURE: f64 = 2.0;

/// What a refused `previous_response_id` (or `conversation`) is told.
const STATELESS: &str =
    "Switchyard is stateless: send the whole conversation in `input`, with `store: false`";

// === Request: parsing ===

/// Reads a Responses request into the core form, validating it as OpenAI does; every
/// refusal names the field in Responses terms.
///
/// - `instructions` and `system`/`developer` messages become system entries, in order;
/// - `message` items become turns (consecutive ones of a role merge); `function_call`
///   items are assistant tool calls, `function_call_output` items the user turn's tool
///   results, whose `call_id` must name a call earlier in `input`;
/// - `reasoning` items (the provider's encrypted reasoning) are dropped (hint
///   `reasoning_items`), as no other model can read them;
/// - `function` tools are tools, a `namespace`'s function tools too, and those of
///   `additional_tools` items in `input` (Codex's way), each name once; built-in tools
///   (`web_search`, `custom`, `tool_search`, ...) are dropped, each named as a hint;
/// - `text.format` becomes the core's format; `reasoning.effort` an effort (`minimal` reads
///   as low, `xhigh` as high, `none` as no reasoning).
pub fn parse_request(body: &[u8]) -> Result<core::Request, Refusal> {
    let wire: WireRequest = de::read(body)?;
    let mut request = core::Request::default();

    if wire.previous_response_id.is_some() {
        return Err(Refusal::at("previous_response_id", STATELESS));
    }
    if wire.conversation.is_some() {
        return Err(Refusal::at("conversation", STATELESS));
    }
    if wire.background == Some(true) {
        return Err(Refusal::at(
            "background",
            "Switchyard keeps no responses to poll later: send the request without `background`",
        ));
    }

    if let Some(instructions) = wire.instructions {
        request.system.push(instructions);
    }
    match wire.input.ok_or_else(|| Refusal::at("input", "field required"))? {
        OneOrList::One(text) => {
            request.messages.push(Message { role: Role::User, parts: vec![Part::Text(text)] })
        }
        OneOrList::List(items) => read_items(&mut request, items)?,
    }
    if request.messages.is_empty() {
        return Err(Refusal::at("input", "at least one message or function call is required"));
    }

    if let Some(tools) = wire.tools {
        for (i, tool) in tools.into_iter().enumerate() {
            read_tool(&mut request, tool, &format!("tools[{i}]"))?;
        }
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
                    format!("must be one of `auto`, `none`, `required`, not `{other}`"),
                ));
            }
        }),
        Some(OneOrObject::Object(choice)) if choice.kind == "function" => {
            let name =
                choice.name.ok_or_else(|| Refusal::at("tool_choice.name", "field required"))?;
            if !request.tools.iter().any(|t| t.name == name) {
                return Err(Refusal::at(
                    "tool_choice.name",
                    format!("no function tool named `{name}` is in `tools`"),
                ));
            }
            Some(ToolMode::Tool(name))
        }
        // A choice of a built-in tool (or of `allowed_tools`): the model decides instead.
        Some(OneOrObject::Object(_)) => {
            request.hint("tool_choice");
            None
        }
    };
    request.tool_choice = match (mode, wire.parallel_tool_calls) {
        (Some(mode), parallel) => Some(ToolChoice { mode, parallel }),
        (None, Some(parallel)) => {
            Some(ToolChoice { mode: ToolMode::Auto, parallel: Some(parallel) })
        }
        (None, None) => None,
    };

    if let Some(max) = wire.max_output_tokens {
        if max < 1 {
            return Err(Refusal::at("max_output_tokens", "must be at least 1"));
        }
        request.max_tokens = Some(u32::try_from(max).unwrap_or(u32::MAX));
    }
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
    if let Some(format) = wire.text.and_then(|t| t.format) {
        request.format = read_format(format)?;
    }
    if let Some(effort) = wire.reasoning.and_then(|r| r.effort) {
        request.reasoning = match effort.as_str() {
            "none" => None,
            "minimal" | "low" => Some(Reasoning::Effort(Effort::Low)),
            "medium" => Some(Reasoning::Effort(Effort::Medium)),
            "high" | "xhigh" => Some(Reasoning::Effort(Effort::High)),
            other => {
                return Err(Refusal::at(
                    "reasoning.effort",
                    format!(
                        "must be one of `none`, `minimal`, `low`, `medium`, `high`, `xhigh`, not `{other}`"
                    ),
                ));
            }
        };
    }
    request.stream = wire.stream.unwrap_or(false);
    request.user = wire.user.or(wire.safety_identifier);
    if wire.service_tier.is_some() {
        request.hint("service_tier");
    }
    if wire.prompt.is_some() {
        request.hint("prompt");
    }
    Ok(request)
}

fn read_items(request: &mut core::Request, items: Vec<WireItem>) -> Result<(), Refusal> {
    let mut call_ids = HashSet::new();
    for (i, item) in items.into_iter().enumerate() {
        let at = format!("input[{i}]");
        let kind = match (item.kind.as_deref(), &item.role) {
            (Some(kind), _) => kind,
            (None, Some(_)) => "message",
            (None, None) => return Err(Refusal::at(format!("{at}.type"), "field required")),
        };
        let (role, part) = match kind {
            "message" => {
                message(request, item, &at)?;
                continue;
            }
            "function_call" => {
                let call_id = required(item.call_id, &at, "call_id")?;
                let name = required(item.name, &at, "name")?;
                let arguments = required(item.arguments, &at, "arguments")?;
                call_ids.insert(call_id.clone());
                (Role::Assistant, Part::ToolCall { id: call_id, name, arguments })
            }
            "function_call_output" => {
                let call_id = required(item.call_id, &at, "call_id")?;
                if !call_ids.contains(&call_id) {
                    return Err(Refusal::at(
                        format!("{at}.call_id"),
                        format!("`{call_id}` matches no `function_call` item earlier in `input`"),
                    ));
                }
                let output = item
                    .output
                    .ok_or_else(|| Refusal::at(format!("{at}.output"), "field required"))?;
                let content = match output {
                    OneOrList::One(text) => vec![Part::Text(text)],
                    OneOrList::List(parts) => content_parts(parts, &format!("{at}.output"))?,
                };
                (Role::User, Part::ToolResult { call_id, content, is_error: false })
            }
            // Tools offered in `input` rather than in `tools`, as Codex sends them (and again
            // in each replayed turn): they join `tools`, once per name.
            "additional_tools" => {
                for (k, tool) in item.tools.unwrap_or_default().into_iter().enumerate() {
                    read_tool(request, tool, &format!("{at}.tools[{k}]"))?;
                }
                continue;
            }
            // The provider's own reasoning, encrypted for it: no other model can read it.
            "reasoning" => {
                request.hint("reasoning_items");
                continue;
            }
            other => {
                return Err(Refusal::at(
                    format!("{at}.type"),
                    format!(
                        "unknown input item type `{other}`: the gateway takes `message`, `function_call`, `function_call_output`, `additional_tools` and `reasoning`"
                    ),
                ));
            }
        };
        push(request, role, vec![part]);
    }
    Ok(())
}

/// A `message` item: a turn, or instructions (`system`, `developer`).
fn message(request: &mut core::Request, item: WireItem, at: &str) -> Result<(), Refusal> {
    let role = item.role.ok_or_else(|| Refusal::at(format!("{at}.role"), "field required"))?;
    let content =
        item.content.ok_or_else(|| Refusal::at(format!("{at}.content"), "field required"))?;
    let parts = match content {
        OneOrList::One(text) => vec![Part::Text(text)],
        OneOrList::List(parts) => content_parts(parts, &format!("{at}.content"))?,
    };
    let role = match role.as_str() {
        "user" => Role::User,
        "assistant" => Role::Assistant,
        "system" | "developer" => {
            for (j, part) in parts.into_iter().enumerate() {
                match part {
                    Part::Text(text) => request.system.push(text),
                    _ => {
                        return Err(Refusal::at(
                            format!("{at}.content[{j}].type"),
                            format!("a `{role}` message takes text only"),
                        ));
                    }
                }
            }
            return Ok(());
        }
        other => {
            return Err(Refusal::at(
                format!("{at}.role"),
                format!("must be one of `user`, `assistant`, `system`, `developer`, not `{other}`"),
            ));
        }
    };
    push(request, role, parts);
    Ok(())
}

/// Adds parts to the conversation: to the last turn when it is of the same role (the core
/// keeps turns alternating), else as a new turn.
fn push(request: &mut core::Request, role: Role, parts: Vec<Part>) {
    match request.messages.last_mut() {
        Some(last) if last.role == role => last.parts.extend(parts),
        _ => request.messages.push(Message { role, parts }),
    }
}

fn content_parts(parts: Vec<WireContent>, at: &str) -> Result<Vec<Part>, Refusal> {
    let mut out = Vec::with_capacity(parts.len());
    for (j, part) in parts.into_iter().enumerate() {
        let at = format!("{at}[{j}]");
        out.push(match part.kind.as_str() {
            "input_text" | "output_text" => Part::Text(required(part.text, &at, "text")?),
            "refusal" => Part::Text(required(part.refusal, &at, "refusal")?),
            "input_image" => {
                if part.image_url.is_none() && part.file_id.is_some() {
                    return Err(Refusal::at(
                        format!("{at}.file_id"),
                        "Switchyard keeps no files: send the image as `image_url` (an http(s) or data: URL)",
                    ));
                }
                Part::Image(image(required(part.image_url, &at, "image_url")?, &at)?)
            }
            other => {
                return Err(Refusal::at(
                    format!("{at}.type"),
                    format!(
                        "unknown content type `{other}`: the gateway takes `input_text`, `output_text`, `refusal` and `input_image`"
                    ),
                ));
            }
        });
    }
    Ok(out)
}

/// An `image_url`: an http(s) URL as it is, a `data:` URL as its bytes.
fn image(url: String, at: &str) -> Result<Image, Refusal> {
    if let Some(rest) = url.strip_prefix("data:") {
        if let Some((media_type, data)) = rest.split_once(";base64,") {
            return Ok(Image::Base64 { media_type: media_type.to_owned(), data: data.to_owned() });
        }
        return Err(Refusal::at(format!("{at}.image_url"), "a data: URL must be base64"));
    }
    if url.starts_with("https://") || url.starts_with("http://") {
        return Ok(Image::Url(url));
    }
    Err(Refusal::at(format!("{at}.image_url"), "must be an http(s) or data: URL"))
}

fn required<T>(value: Option<T>, at: &str, name: &str) -> Result<T, Refusal> {
    value.ok_or_else(|| Refusal::at(format!("{at}.{name}"), "field required"))
}

/// The hint a built-in tool type is dropped as (hints are named once, by type).
fn builtin(kind: &str) -> &'static str {
    match kind {
        "web_search" => "web_search",
        "web_search_preview" => "web_search_preview",
        "file_search" => "file_search",
        "code_interpreter" => "code_interpreter",
        "computer_use_preview" => "computer_use_preview",
        "image_generation" => "image_generation",
        "mcp" => "mcp",
        "local_shell" => "local_shell",
        "shell" => "shell",
        "apply_patch" => "apply_patch",
        "custom" => "custom",
        "tool_search" => "tool_search",
        _ => "tools",
    }
}

fn read_tool(request: &mut core::Request, tool: WireTool, at: &str) -> Result<(), Refusal> {
    match tool.kind.as_str() {
        "function" => {
            let name = required(tool.name, at, "name")?;
            let parameters = match tool.parameters {
                Some(schema) if schema.get().trim_start().starts_with('{') => schema.into(),
                Some(schema) if schema.get() == "null" => de::empty_object_schema().into(),
                Some(_) => {
                    return Err(Refusal::at(
                        format!("{at}.parameters"),
                        "must be a JSON schema object",
                    ));
                }
                None => de::empty_object_schema().into(),
            };
            if !request.tools.iter().any(|t| t.name == name) {
                request.tools.push(Tool { name, description: tool.description, parameters });
            }
        }
        "namespace" => {
            for (k, inner) in tool.tools.unwrap_or_default().into_iter().enumerate() {
                read_tool(request, inner, &format!("{at}.tools[{k}]"))?;
            }
        }
        other => request.hint(builtin(other)),
    }
    Ok(())
}

fn read_format(format: WireFormat) -> Result<Option<Format>, Refusal> {
    match format.kind.as_str() {
        "text" => Ok(None),
        "json_object" => Ok(Some(Format::JsonObject)),
        "json_schema" => {
            let name =
                format.name.ok_or_else(|| Refusal::at("text.format.name", "field required"))?;
            let schema =
                format.schema.ok_or_else(|| Refusal::at("text.format.schema", "field required"))?;
            if !schema.get().trim_start().starts_with('{') {
                return Err(Refusal::at("text.format.schema", "must be a JSON schema object"));
            }
            Ok(Some(Format::JsonSchema {
                name,
                description: format.description,
                schema: schema.into(),
                strict: format.strict,
            }))
        }
        other => Err(Refusal::at(
            "text.format.type",
            format!("must be one of `text`, `json_schema`, `json_object`, not `{other}`"),
        )),
    }
}

// === Response: writing ===

/// A Response object, whole (an answer) or as a stream's events carry it.
#[derive(Serialize)]
struct OutResponse<'a> {
    id: &'a str,
    object: &'static str,
    created_at: u64,
    status: &'static str,
    error: Option<OutError<'a>>,
    incomplete_details: Option<OutIncomplete>,
    model: &'a str,
    output: Vec<OutItem<'a>>,
    parallel_tool_calls: bool,
    tool_choice: &'static str,
    tools: [(); 0],
    store: bool,
    usage: Option<OutUsage>,
}

#[derive(Serialize)]
struct OutError<'a> {
    code: &'a str,
    message: &'a str,
}

#[derive(Serialize)]
struct OutIncomplete {
    reason: &'static str,
}

#[derive(Serialize)]
#[serde(tag = "type", rename_all = "snake_case")]
enum OutItem<'a> {
    Message {
        id: &'a str,
        status: &'static str,
        role: &'static str,
        content: Vec<OutText<'a>>,
    },
    FunctionCall {
        id: &'a str,
        call_id: &'a str,
        name: &'a str,
        arguments: &'a str,
        status: &'static str,
    },
}

/// An `output_text` content part.
#[derive(Serialize)]
struct OutText<'a> {
    #[serde(rename = "type")]
    kind: &'static str,
    text: &'a str,
    annotations: [(); 0],
}

impl<'a> OutText<'a> {
    fn new(text: &'a str) -> Self {
        OutText { kind: "output_text", text, annotations: [] }
    }
}

#[derive(Serialize)]
struct OutUsage {
    input_tokens: u64,
    input_tokens_details: OutInputDetails,
    output_tokens: u64,
    output_tokens_details: OutOutputDetails,
    total_tokens: u64,
}

#[derive(Serialize)]
struct OutInputDetails {
    cached_tokens: u64,
}

#[derive(Serialize)]
struct OutOutputDetails {
    reasoning_tokens: u64,
}

impl OutUsage {
    fn of(usage: &Usage) -> Self {
        OutUsage {
            input_tokens: usage.input_tokens,
            input_tokens_details: OutInputDetails {
                cached_tokens: usage.cache_read_tokens.unwrap_or(0),
            },
            output_tokens: usage.output_tokens,
            output_tokens_details: OutOutputDetails { reasoning_tokens: 0 },
            total_tokens: usage.input_tokens.saturating_add(usage.output_tokens),
        }
    }
}

/// A response's `status` and `incomplete_details` for a finish: an answer cut at
/// `max_output_tokens` or by a content filter is `incomplete`, as OpenAI reports it.
fn status(finish: &Finish) -> (&'static str, Option<OutIncomplete>) {
    match finish {
        Finish::Length => ("incomplete", Some(OutIncomplete { reason: "max_output_tokens" })),
        Finish::ContentFilter => ("incomplete", Some(OutIncomplete { reason: "content_filter" })),
        Finish::Stop | Finish::ToolCalls | Finish::StopSequence(_) | Finish::Refusal => {
            ("completed", None)
        }
    }
}

/// The response id for an upstream answer's id: `resp_` and its letters and digits.
pub fn response_id(upstream: &str) -> String {
    let tail: String = upstream.chars().filter(char::is_ascii_alphanumeric).collect();
    let tail = tail.strip_prefix("chatcmpl").or_else(|| tail.strip_prefix("msg")).unwrap_or(&tail);
    if tail.is_empty() { "resp_switchyard".to_owned() } else { format!("resp_{tail}") }
}

/// An output item's id: `prefix_` and the response id's tail, and its place in `output`.
fn item_id(prefix: &str, response: &str, index: usize) -> String {
    let tail = response.strip_prefix("resp_").unwrap_or(response);
    format!("{prefix}_{tail}_{index}")
}

/// Seconds since the Unix epoch, for `created_at`.
fn now() -> u64 {
    std::time::SystemTime::now().duration_since(std::time::UNIX_EPOCH).map_or(0, |d| d.as_secs())
}

/// A whole answer as a Response object, with `model` as its model and the time now as
/// `created_at`: its text parts (in order, between tool calls) as `message` items with one
/// `output_text` each, its tool calls as `function_call` items; thinking is left out (its
/// `reasoning` items are the provider's to encrypt).
pub fn response_body(response: &core::Response, model: &str) -> Vec<u8> {
    response_body_at(response, model, now())
}

/// [`response_body`] with `created_at` given.
pub fn response_body_at(response: &core::Response, model: &str, created: u64) -> Vec<u8> {
    let id = response_id(&response.id);
    let (status, incomplete_details) = status(&response.finish);
    let items = items(&id, &response.parts);
    let item_status = if status == "completed" { "completed" } else { "incomplete" };
    let output = items.iter().map(|item| item.out(item_status)).collect();
    de::to_vec(&OutResponse {
        id: &id,
        object: "response",
        created_at: created,
        status,
        error: None,
        incomplete_details,
        model,
        output,
        parallel_tool_calls: true,
        tool_choice: "auto",
        tools: [],
        store: false,
        usage: Some(OutUsage::of(&response.usage)),
    })
}

/// An answer's parts as output items: consecutive text parts make one `message`, each tool
/// call a `function_call`; thinking has no item.
fn items(response_id: &str, parts: &[Part]) -> Vec<Item> {
    let mut items: Vec<Item> = Vec::new();
    for part in parts {
        match part {
            Part::Text(text) if text.is_empty() => {}
            Part::Text(text) => match items.last_mut() {
                Some(Item::Message { text: all, .. }) => all.push_str(text),
                _ => {
                    let id = item_id("msg", response_id, items.len());
                    items.push(Item::Message { id, text: text.clone() });
                }
            },
            Part::ToolCall { id, name, arguments } => items.push(Item::Call {
                index: 0,
                id: format!("fc_{id}"),
                call_id: id.clone(),
                name: name.clone(),
                arguments: arguments.clone(),
            }),
            Part::Image(_)
            | Part::Audio { .. }
            | Part::File(_)
            | Part::ToolResult { .. }
            | Part::Thinking { .. } => {}
        }
    }
    items
}

// === Streams: writing ===

#[derive(Serialize)]
struct OutEvent<T: Serialize> {
    #[serde(rename = "type")]
    kind: &'static str,
    sequence_number: u64,
    #[serde(flatten)]
    body: T,
}

#[derive(Serialize)]
struct OutResponseEvent<'a> {
    response: OutResponse<'a>,
}

#[derive(Serialize)]
struct OutItemEvent<'a> {
    output_index: usize,
    item: OutItem<'a>,
}

#[derive(Serialize)]
struct OutPartEvent<'a> {
    item_id: &'a str,
    output_index: usize,
    content_index: u32,
    part: OutText<'a>,
}

#[derive(Serialize)]
struct OutTextDelta<'a> {
    item_id: &'a str,
    output_index: usize,
    content_index: u32,
    delta: &'a str,
    logprobs: [(); 0],
}

#[derive(Serialize)]
struct OutTextDone<'a> {
    item_id: &'a str,
    output_index: usize,
    content_index: u32,
    text: &'a str,
    logprobs: [(); 0],
}

#[derive(Serialize)]
struct OutArgumentsDelta<'a> {
    item_id: &'a str,
    output_index: usize,
    delta: &'a str,
}

#[derive(Serialize)]
struct OutArgumentsDone<'a> {
    item_id: &'a str,
    output_index: usize,
    name: &'a str,
    arguments: &'a str,
}

/// An output item as the stream builds it.
enum Item {
    Message {
        id: String,
        text: String,
    },
    /// `index`: the call's core index, which a stream's deltas name it by.
    Call {
        index: u32,
        id: String,
        call_id: String,
        name: String,
        arguments: String,
    },
}

impl Item {
    fn out(&self, status: &'static str) -> OutItem<'_> {
        match self {
            Item::Message { id, text } => OutItem::Message {
                id,
                status,
                role: "assistant",
                // An item just added has no content part yet.
                content: if status == "in_progress" {
                    Vec::new()
                } else {
                    vec![OutText::new(text)]
                },
            },
            Item::Call { id, call_id, name, arguments, .. } => OutItem::FunctionCall {
                id,
                call_id,
                name,
                arguments: if status == "in_progress" { "" } else { arguments },
                status,
            },
        }
    }
}

/// Core events → the Responses event sequence: `response.created` and
/// `response.in_progress` first; for text, `response.output_item.added`,
/// `response.content_part.added`, `response.output_text.delta`s, then
/// `response.output_text.done`, `response.content_part.done` and `response.output_item.done`;
/// for a tool call, `response.output_item.added`, `response.function_call_arguments.delta`s,
/// `response.function_call_arguments.done` and `response.output_item.done`; at the end
/// `response.completed` (`response.incomplete` for an answer cut short) with the whole
/// response and its usage, from [`Encoder::finish`], or `response.failed` from
/// [`Encoder::fail`]. Every event carries its `type` and a `sequence_number` counting from 0.
///
/// One `response.created` per stream, whatever comes: a second `Start` (a continuation's)
/// adds nothing. Thinking has no event here (it is left out, as in a whole answer).
pub struct Encoder {
    model: String,
    created: u64,
    id: String,
    sequence: u64,
    started: bool,
    finished: bool,
    items: Vec<Item>,
    /// Which of `items` is open (taking deltas).
    open: Option<usize>,
    finish: Option<Finish>,
    usage: Option<Usage>,
}

impl Encoder {
    pub fn new(model: &str) -> Self {
        Self::at(model, now())
    }

    /// An encoder whose response was created at `created` (seconds since the epoch).
    pub fn at(model: &str, created: u64) -> Self {
        Encoder {
            model: model.to_owned(),
            created,
            id: String::new(),
            sequence: 0,
            started: false,
            finished: false,
            items: Vec::new(),
            open: None,
            finish: None,
            usage: None,
        }
    }

    pub fn push(&mut self, event: Event, out: &mut Vec<Frame>) {
        if self.finished {
            return;
        }
        match event {
            Event::Start { id, .. } => self.start(&id, out),
            Event::TextDelta(text) => {
                if text.is_empty() {
                    return;
                }
                self.start("", out);
                let at = match self.open {
                    Some(at) if matches!(self.items[at], Item::Message { .. }) => at,
                    _ => {
                        self.close(out);
                        let at = self.items.len();
                        let id = item_id("msg", &self.id, at);
                        self.items.push(Item::Message { id, text: String::new() });
                        self.open = Some(at);
                        self.added(at, out);
                        let Item::Message { id, .. } = &self.items[at] else { return };
                        let part = OutPartEvent {
                            item_id: id,
                            output_index: at,
                            content_index: 0,
                            part: OutText::new(""),
                        };
                        let frame = event_frame("response.content_part.added", self.sequence, part);
                        self.sequence += 1;
                        out.push(frame);
                        at
                    }
                };
                let Item::Message { id, text: all } = &mut self.items[at] else { return };
                all.push_str(&text);
                let delta = OutTextDelta {
                    item_id: id,
                    output_index: at,
                    content_index: 0,
                    delta: &text,
                    logprobs: [],
                };
                out.push(event_frame("response.output_text.delta", self.sequence, delta));
                self.sequence += 1;
            }
            Event::ThinkingDelta { .. } => {}
            Event::ToolCallStart { index, id, name } => {
                self.start("", out);
                self.close(out);
                let at = self.items.len();
                let item = format!(
                    "fc_{}",
                    if id.is_empty() { item_id("call", &self.id, at) } else { id.clone() }
                );
                self.items.push(Item::Call {
                    index,
                    id: item,
                    call_id: id,
                    name,
                    arguments: String::new(),
                });
                self.open = Some(at);
                self.added(at, out);
            }
            Event::ToolCallDelta { index, arguments } => {
                if arguments.is_empty() {
                    return;
                }
                let found = self
                    .items
                    .iter()
                    .position(|item| matches!(item, Item::Call { index: i, .. } if *i == index));
                let at = match found {
                    Some(at) => at,
                    None => {
                        self.push(
                            Event::ToolCallStart { index, id: String::new(), name: String::new() },
                            out,
                        );
                        self.items.len() - 1
                    }
                };
                let Item::Call { id, arguments: all, .. } = &mut self.items[at] else { return };
                all.push_str(&arguments);
                let delta = OutArgumentsDelta { item_id: id, output_index: at, delta: &arguments };
                out.push(event_frame(
                    "response.function_call_arguments.delta",
                    self.sequence,
                    delta,
                ));
                self.sequence += 1;
            }
            Event::Finish(finish) => self.finish = Some(finish),
            Event::Usage(usage) => self.usage = Some(usage),
        }
    }

    /// Ends the stream: closes the open item, then `response.completed` (or
    /// `response.incomplete`) with the whole response.
    pub fn finish(&mut self, out: &mut Vec<Frame>) {
        if self.finished {
            return;
        }
        self.start("", out);
        self.close(out);
        self.finished = true;
        let finish = self.finish.take().unwrap_or(Finish::Stop);
        let (status, incomplete_details) = status(&finish);
        let kind = if status == "completed" { "response.completed" } else { "response.incomplete" };
        let item_status = if status == "completed" { "completed" } else { "incomplete" };
        let usage = self.usage.unwrap_or_default();
        let mut response = self.response(status, item_status);
        response.incomplete_details = incomplete_details;
        response.usage = Some(OutUsage::of(&usage));
        let frame = event_frame(kind, self.sequence, OutResponseEvent { response });
        self.sequence += 1;
        out.push(frame);
    }

    /// Ends a stream that broke: `response.failed`, with what was sent so far as its output
    /// and the error's `code` and `message`.
    pub fn fail(&mut self, code: &str, message: &str, out: &mut Vec<Frame>) {
        if self.finished {
            return;
        }
        self.start("", out);
        self.finished = true;
        let mut response = self.response("failed", "incomplete");
        response.error = Some(OutError { code, message });
        let frame = event_frame("response.failed", self.sequence, OutResponseEvent { response });
        self.sequence += 1;
        out.push(frame);
    }

    /// The response as it stands, every item with `item_status`.
    fn response(&self, status: &'static str, item_status: &'static str) -> OutResponse<'_> {
        OutResponse {
            id: &self.id,
            object: "response",
            created_at: self.created,
            status,
            error: None,
            incomplete_details: None,
            model: &self.model,
            output: self.items.iter().map(|item| item.out(item_status)).collect(),
            parallel_tool_calls: true,
            tool_choice: "auto",
            tools: [],
            store: false,
            usage: None,
        }
    }

    /// `response.created` and `response.in_progress`, once.
    fn start(&mut self, id: &str, out: &mut Vec<Frame>) {
        if self.started {
            return;
        }
        self.started = true;
        self.id = response_id(id);
        for kind in ["response.created", "response.in_progress"] {
            let response = self.response("in_progress", "in_progress");
            let frame = event_frame(kind, self.sequence, OutResponseEvent { response });
            self.sequence += 1;
            out.push(frame);
        }
    }

    /// `response.output_item.added` for item `at`.
    fn added(&mut self, at: usize, out: &mut Vec<Frame>) {
        let item = OutItemEvent { output_index: at, item: self.items[at].out("in_progress") };
        let frame = event_frame("response.output_item.added", self.sequence, item);
        self.sequence += 1;
        out.push(frame);
    }

    /// Closes the open item: its `.done` events.
    fn close(&mut self, out: &mut Vec<Frame>) {
        let Some(at) = self.open.take() else { return };
        let mut seq = self.sequence;
        let mut next = || {
            seq += 1;
            seq - 1
        };
        match &self.items[at] {
            Item::Message { id, text } => {
                let done = OutTextDone {
                    item_id: id,
                    output_index: at,
                    content_index: 0,
                    text,
                    logprobs: [],
                };
                out.push(event_frame("response.output_text.done", next(), done));
                let part = OutPartEvent {
                    item_id: id,
                    output_index: at,
                    content_index: 0,
                    part: OutText::new(text),
                };
                out.push(event_frame("response.content_part.done", next(), part));
            }
            Item::Call { id, name, arguments, .. } => {
                let done = OutArgumentsDone { item_id: id, output_index: at, name, arguments };
                out.push(event_frame("response.function_call_arguments.done", next(), done));
            }
        }
        let item = OutItemEvent { output_index: at, item: self.items[at].out("completed") };
        out.push(event_frame("response.output_item.done", next(), item));
        self.sequence = seq;
    }
}

fn event_frame<T: Serialize>(kind: &'static str, sequence_number: u64, body: T) -> Frame {
    Frame::new(kind, &OutEvent { kind, sequence_number, body })
}

#[cfg(test)]
mod tests {
    use super::*;

    fn parse(body: &str) -> Result<core::Request, Refusal> {
        parse_request(body.as_bytes())
    }

    #[test]
    fn stateful_fields_are_refused_naming_them() {
        let field = |body: &str| parse(body).unwrap_err().field;
        assert_eq!(field(r#"{"input":"hi","conversation":"conv_1"}"#), "conversation");
        assert_eq!(field(r#"{"input":"hi","background":true}"#), "background");
        // Sent as null (as some SDKs do), they are absent.
        let request = parse(
            r#"{"input":"hi","previous_response_id":null,"conversation":null,"background":false}"#,
        );
        assert!(request.is_ok(), "{request:?}");
    }

    #[test]
    fn instructions_and_developer_messages_are_system_entries_in_order() {
        let request = parse(
            r#"{"instructions":"a","input":[{"role":"developer","content":"b"},
            {"type":"message","role":"system","content":[{"type":"input_text","text":"c"}]},
            {"role":"user","content":"hi"}]}"#,
        )
        .unwrap();
        assert_eq!(request.system, ["a", "b", "c"]);
        assert_eq!(request.messages.len(), 1);
    }

    #[test]
    fn reasoning_efforts_map_and_none_asks_for_none() {
        let effort = |e: &str| {
            parse(&format!(r#"{{"input":"hi","reasoning":{{"effort":"{e}"}}}}"#)).unwrap().reasoning
        };
        assert_eq!(effort("minimal"), Some(Reasoning::Effort(Effort::Low)));
        assert_eq!(effort("medium"), Some(Reasoning::Effort(Effort::Medium)));
        assert_eq!(effort("xhigh"), Some(Reasoning::Effort(Effort::High)));
        assert_eq!(effort("none"), None);
    }

    #[test]
    fn a_choice_of_a_built_in_tool_is_a_dropped_hint_and_parallel_alone_is_auto() {
        let request = parse(
            r#"{"input":"hi","tool_choice":{"type":"web_search"},"parallel_tool_calls":false}"#,
        )
        .unwrap();
        assert_eq!(request.hints, ["tool_choice"]);
        assert_eq!(
            request.tool_choice,
            Some(ToolChoice { mode: ToolMode::Auto, parallel: Some(false) })
        );
    }

    #[test]
    fn an_item_without_type_or_role_is_refused_at_its_type() {
        let refusal = parse(r#"{"input":[{"content":"hi"}]}"#).unwrap_err();
        assert_eq!(refusal.field, "input[0].type");
        let refusal = parse(r#"{"input":[{"role":"tool","content":"hi"}]}"#).unwrap_err();
        assert_eq!(refusal.field, "input[0].role");
        let refusal = parse(r#"{"input":[]}"#).unwrap_err();
        assert_eq!(refusal.field, "input");
    }

    #[test]
    fn response_ids_keep_the_upstream_ids_letters() {
        assert_eq!(response_id("chatcmpl-B9MBs8"), "resp_B9MBs8");
        assert_eq!(response_id("msg_01Aq9"), "resp_01Aq9");
        assert_eq!(response_id(""), "resp_switchyard");
    }
}
