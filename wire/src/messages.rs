//! Anthropic's Messages API (`POST /v1/messages`): requests, answers, stream events and
//! errors, to and from the [core] form.
//!
//! Refusals name fields as a Messages client wrote them (`messages[3].content[0].tool_use_id`).

use std::collections::HashSet;

use serde::Deserialize;
use serde::Serialize;
use serde::de::IgnoredAny;
use serde_json::value::RawValue;

use crate::Refusal;
use crate::core::{
    self, Effort, Event, Finish, Image, Message, Part, Reasoning, Role, Tool, ToolChoice, ToolMode,
    Usage,
};
use crate::de::{self, OneOrList};
pub use crate::sse::Frame;

// === Request: wire types ===

/// The body of `POST /v1/messages` ("Create a Message"). Unknown fields, and the gateway's
/// own (`model`, `models`, `fallback_models`, `redundancy`), are not read here.
#[derive(Deserialize)]
struct WireRequest {
    max_tokens: Option<u32>,
    messages: Option<Vec<WireMessage>>,
    system: Option<OneOrList<WireBlock>>,
    tools: Option<Vec<WireTool>>,
    tool_choice: Option<WireToolChoice>,
    stop_sequences: Option<Vec<String>>,
    temperature: Option<f64>,
    top_p: Option<f64>,
    top_k: Option<u32>,
    stream: Option<bool>,
    metadata: Option<WireMetadata>,
    thinking: Option<WireThinking>,
    output_config: Option<WireOutputConfig>,
    context_management: Option<IgnoredAny>,
    service_tier: Option<IgnoredAny>,
    container: Option<IgnoredAny>,
    mcp_servers: Option<IgnoredAny>,
}

#[derive(Deserialize)]
struct WireMessage {
    role: WireRole,
    content: OneOrList<WireBlock>,
}

#[derive(Deserialize, Clone, Copy, PartialEq, Eq)]
#[serde(rename_all = "lowercase")]
enum WireRole {
    User,
    Assistant,
    /// Instructions in the middle of a conversation, as Claude Code sends them (after the
    /// first message, text only).
    System,
}

/// A content block of any type; which fields it needs depends on `type`, checked when it is
/// converted (so a missing field is named with the block's path).
#[derive(Deserialize)]
struct WireBlock {
    #[serde(rename = "type")]
    kind: String,
    text: Option<String>,
    source: Option<WireSource>,
    id: Option<String>,
    name: Option<String>,
    input: Option<Box<RawValue>>,
    tool_use_id: Option<String>,
    content: Option<OneOrList<WireBlock>>,
    is_error: Option<bool>,
    thinking: Option<String>,
    signature: Option<String>,
    cache_control: Option<IgnoredAny>,
    citations: Option<IgnoredAny>,
}

/// An image's source. Every field is optional so that a block of a type the gateway does
/// not take (a `document`, whose source has other fields) is refused for its `type`.
#[derive(Deserialize)]
struct WireSource {
    #[serde(rename = "type")]
    kind: Option<String>,
    media_type: Option<String>,
    data: Option<String>,
    url: Option<String>,
}

#[derive(Deserialize)]
struct WireTool {
    #[serde(rename = "type")]
    kind: Option<String>,
    name: Option<String>,
    description: Option<String>,
    input_schema: Option<Box<RawValue>>,
    cache_control: Option<IgnoredAny>,
}

#[derive(Deserialize)]
struct WireToolChoice {
    #[serde(rename = "type")]
    kind: String,
    name: Option<String>,
    disable_parallel_tool_use: Option<bool>,
}

#[derive(Deserialize)]
struct WireMetadata {
    user_id: Option<String>,
}

#[derive(Deserialize)]
struct WireThinking {
    #[serde(rename = "type")]
    kind: String,
    budget_tokens: Option<u32>,
}

#[derive(Deserialize)]
struct WireOutputConfig {
    effort: Option<String>,
    format: Option<IgnoredAny>,
}

/// Anthropic's smallest thinking budget.
pub const MIN_THINKING_BUDGET: u32 = 1024;

/// The image types Anthropic takes.
const MEDIA_TYPES: [&str; 4] = ["image/jpeg", "image/png", "image/gif", "image/webp"];

// === Request: parsing ===

/// Reads a Messages request into the core form, validating it as Anthropic does; every
/// refusal names the field in Messages terms.
pub fn parse_request(body: &[u8]) -> Result<core::Request, Refusal> {
    let wire: WireRequest = de::read(body)?;
    let mut request = core::Request::default();

    let max_tokens = wire.max_tokens.ok_or_else(|| Refusal::at("max_tokens", "field required"))?;
    if max_tokens == 0 {
        return Err(Refusal::at("max_tokens", "must be at least 1"));
    }
    request.max_tokens = Some(max_tokens);

    match wire.system {
        None => {}
        Some(OneOrList::One(text)) => request.system.push(text),
        Some(OneOrList::List(blocks)) => {
            for (i, block) in blocks.into_iter().enumerate() {
                if block.kind != "text" {
                    return Err(Refusal::at(
                        format!("system[{i}].type"),
                        format!("system blocks must be `text` blocks, not `{}`", block.kind),
                    ));
                }
                if block.cache_control.is_some() {
                    request.hint("cache_control");
                }
                let text = block
                    .text
                    .ok_or_else(|| Refusal::at(format!("system[{i}].text"), "field required"))?;
                request.system.push(text);
            }
        }
    }

    let messages = wire.messages.ok_or_else(|| Refusal::at("messages", "field required"))?;
    if messages.is_empty() {
        return Err(Refusal::at("messages", "at least one message is required"));
    }
    let mut call_ids = HashSet::new();
    let last = messages.len() - 1;
    for (i, message) in messages.into_iter().enumerate() {
        let role = match message.role {
            WireRole::User => Role::User,
            WireRole::Assistant => Role::Assistant,
            WireRole::System if i > 0 => {
                system_message(&mut request, message.content, i)?;
                continue;
            }
            WireRole::System => {
                return Err(Refusal::at(
                    "messages[0].role",
                    "the first message must use the `user` role",
                ));
            }
        };
        if i == 0 && role != Role::User {
            return Err(Refusal::at(
                "messages[0].role",
                "the first message must use the `user` role",
            ));
        }
        let parts = message_parts(&mut request, message.content, role, i, &mut call_ids)?;
        // Only the final assistant turn (a prefill) may be empty, as Anthropic requires.
        if parts.is_empty() && !(i == last && role == Role::Assistant) {
            return Err(Refusal::at(
                format!("messages[{i}].content"),
                "all messages must have non-empty content except for the optional final assistant message",
            ));
        }
        // Anthropic takes consecutive turns of one role and reads them as one: merge them.
        match request.messages.last_mut() {
            Some(previous) if previous.role == role => previous.parts.extend(parts),
            _ => request.messages.push(Message { role, parts }),
        }
    }

    if let Some(tools) = wire.tools {
        for (i, tool) in tools.into_iter().enumerate() {
            let tool = read_tool(&mut request, tool, i)?;
            request.tools.push(tool);
        }
    }

    if let Some(choice) = wire.tool_choice {
        let mode = match choice.kind.as_str() {
            "auto" => ToolMode::Auto,
            "any" => ToolMode::Any,
            "none" => ToolMode::None,
            "tool" => {
                let name =
                    choice.name.ok_or_else(|| Refusal::at("tool_choice.name", "field required"))?;
                if !request.tools.iter().any(|t| t.name == name) {
                    return Err(Refusal::at(
                        "tool_choice.name",
                        format!("no tool named `{name}` is in `tools`"),
                    ));
                }
                ToolMode::Tool(name)
            }
            other => {
                return Err(Refusal::at(
                    "tool_choice.type",
                    format!("must be one of `auto`, `any`, `tool`, `none`, not `{other}`"),
                ));
            }
        };
        request.tool_choice = Some(ToolChoice {
            mode,
            parallel: choice.disable_parallel_tool_use.map(|disable| !disable),
        });
    }

    if let Some(stop) = wire.stop_sequences {
        request.stop = stop;
    }
    if let Some(t) = wire.temperature {
        if !(0.0..=1.0).contains(&t) {
            return Err(Refusal::at("temperature", "must be between 0 and 1"));
        }
        request.temperature = Some(t);
    }
    if let Some(p) = wire.top_p {
        if !(0.0..=1.0).contains(&p) {
            return Err(Refusal::at("top_p", "must be between 0 and 1"));
        }
        request.top_p = Some(p);
    }
    request.top_k = wire.top_k;
    request.stream = wire.stream.unwrap_or(false);
    request.user = wire.metadata.and_then(|m| m.user_id);

    let effort = match &wire.output_config {
        Some(config) => {
            if config.format.is_some() {
                request.hint("output_config");
            }
            match config.effort.as_deref() {
                None => None,
                Some("low") => Some(Effort::Low),
                Some("medium") => Some(Effort::Medium),
                // `max` is above `high`; the formats the core translates to stop at high.
                Some("high" | "max") => Some(Effort::High),
                Some(other) => {
                    return Err(Refusal::at(
                        "output_config.effort",
                        format!("must be one of `low`, `medium`, `high`, `max`, not `{other}`"),
                    ));
                }
            }
        }
        None => None,
    };
    if let Some(thinking) = wire.thinking {
        request.reasoning = match thinking.kind.as_str() {
            "enabled" => {
                let budget = thinking
                    .budget_tokens
                    .ok_or_else(|| Refusal::at("thinking.budget_tokens", "field required"))?;
                if budget < MIN_THINKING_BUDGET {
                    return Err(Refusal::at(
                        "thinking.budget_tokens",
                        format!("must be at least {MIN_THINKING_BUDGET}"),
                    ));
                }
                Some(Reasoning::Budget(budget))
            }
            // Adaptive thinking: the model chooses how much; `output_config.effort` steers it
            // (Anthropic's default effort is high).
            "adaptive" => Some(Reasoning::Effort(effort.unwrap_or(Effort::High))),
            "disabled" => None,
            other => {
                return Err(Refusal::at(
                    "thinking.type",
                    format!("must be one of `enabled`, `adaptive`, `disabled`, not `{other}`"),
                ));
            }
        };
    } else if let Some(effort) = effort {
        request.reasoning = Some(Reasoning::Effort(effort));
    }

    if wire.context_management.is_some() {
        request.hint("context_management");
    }
    if wire.service_tier.is_some() {
        request.hint("service_tier");
    }
    if wire.container.is_some() {
        request.hint("container");
    }
    if wire.mcp_servers.is_some() {
        request.hint("mcp_servers");
    }
    Ok(request)
}

/// A `system` message after the first: its text joins the request's instructions, in order
/// (the core keeps instructions apart from the turns; a format that has no mid-conversation
/// instructions could not place it anyway).
fn system_message(
    request: &mut core::Request,
    content: OneOrList<WireBlock>,
    i: usize,
) -> Result<(), Refusal> {
    let blocks = match content {
        OneOrList::One(text) => {
            request.system.push(text);
            return Ok(());
        }
        OneOrList::List(blocks) => blocks,
    };
    for (j, block) in blocks.into_iter().enumerate() {
        let at = format!("messages[{i}].content[{j}]");
        if block.kind != "text" {
            return Err(Refusal::at(
                format!("{at}.type"),
                format!("a `system` message takes `text` blocks only, not `{}`", block.kind),
            ));
        }
        if block.cache_control.is_some() {
            request.hint("cache_control");
        }
        let text = block.text.ok_or_else(|| Refusal::at(format!("{at}.text"), "field required"))?;
        request.system.push(text);
    }
    Ok(())
}

fn message_parts(
    request: &mut core::Request,
    content: OneOrList<WireBlock>,
    role: Role,
    i: usize,
    call_ids: &mut HashSet<String>,
) -> Result<Vec<Part>, Refusal> {
    let blocks = match content {
        OneOrList::One(text) => return Ok(vec![Part::Text(text)]),
        OneOrList::List(blocks) => blocks,
    };
    let mut parts = Vec::with_capacity(blocks.len());
    for (j, block) in blocks.into_iter().enumerate() {
        let at = format!("messages[{i}].content[{j}]");
        if block.cache_control.is_some() {
            request.hint("cache_control");
        }
        if block.citations.is_some() {
            request.hint("citations");
        }
        let only = |wanted: Role| {
            if role == wanted {
                Ok(())
            } else {
                Err(Refusal::at(
                    format!("{at}.type"),
                    format!(
                        "`{}` blocks are allowed only in `{}` messages",
                        block.kind,
                        if wanted == Role::User { "user" } else { "assistant" }
                    ),
                ))
            }
        };
        let part = match block.kind.as_str() {
            "text" => Part::Text(required(block.text, &at, "text")?),
            "image" => {
                only(Role::User)?;
                Part::Image(image(block.source, &at)?)
            }
            "tool_use" => {
                only(Role::Assistant)?;
                let id = required(block.id, &at, "id")?;
                let name = required(block.name, &at, "name")?;
                let input = block
                    .input
                    .ok_or_else(|| Refusal::at(format!("{at}.input"), "field required"))?;
                if !input.get().trim_start().starts_with('{') {
                    return Err(Refusal::at(format!("{at}.input"), "must be a JSON object"));
                }
                call_ids.insert(id.clone());
                Part::ToolCall { id, name, arguments: de::text(input) }
            }
            "tool_result" => {
                only(Role::User)?;
                let call_id = required(block.tool_use_id, &at, "tool_use_id")?;
                if !call_ids.contains(&call_id) {
                    return Err(Refusal::at(
                        format!("{at}.tool_use_id"),
                        format!("`{call_id}` matches no `tool_use` block in an earlier message"),
                    ));
                }
                let content = match block.content {
                    None => Vec::new(),
                    Some(OneOrList::One(text)) => vec![Part::Text(text)],
                    Some(OneOrList::List(inner)) => {
                        let mut content = Vec::with_capacity(inner.len());
                        for (k, item) in inner.into_iter().enumerate() {
                            let at = format!("{at}.content[{k}]");
                            if item.cache_control.is_some() {
                                request.hint("cache_control");
                            }
                            content.push(match item.kind.as_str() {
                                "text" => Part::Text(required(item.text, &at, "text")?),
                                "image" => Part::Image(image(item.source, &at)?),
                                other => {
                                    return Err(Refusal::at(
                                        format!("{at}.type"),
                                        format!(
                                            "a tool result holds `text` and `image` blocks, not `{other}`"
                                        ),
                                    ));
                                }
                            });
                        }
                        content
                    }
                };
                Part::ToolResult { call_id, content, is_error: block.is_error.unwrap_or(false) }
            }
            "thinking" => {
                only(Role::Assistant)?;
                Part::Thinking {
                    text: required(block.thinking, &at, "thinking")?,
                    signature: block.signature,
                }
            }
            // Thinking the provider encrypted: only Anthropic can read it back, and the core
            // has no place for it.
            "redacted_thinking" => {
                only(Role::Assistant)?;
                request.hint("redacted_thinking");
                continue;
            }
            other => {
                return Err(Refusal::at(
                    format!("{at}.type"),
                    format!(
                        "unknown content block type `{other}`: the gateway takes `text`, `image`, `tool_use`, `tool_result`, `thinking` and `redacted_thinking`"
                    ),
                ));
            }
        };
        parts.push(part);
    }
    Ok(parts)
}

fn required(value: Option<String>, at: &str, name: &str) -> Result<String, Refusal> {
    value.ok_or_else(|| Refusal::at(format!("{at}.{name}"), "field required"))
}

fn image(source: Option<WireSource>, at: &str) -> Result<Image, Refusal> {
    let source = source.ok_or_else(|| Refusal::at(format!("{at}.source"), "field required"))?;
    let kind =
        source.kind.ok_or_else(|| Refusal::at(format!("{at}.source.type"), "field required"))?;
    match kind.as_str() {
        "base64" => {
            let media_type = source
                .media_type
                .ok_or_else(|| Refusal::at(format!("{at}.source.media_type"), "field required"))?;
            if !MEDIA_TYPES.contains(&media_type.as_str()) {
                return Err(Refusal::at(
                    format!("{at}.source.media_type"),
                    format!(
                        "must be one of `image/jpeg`, `image/png`, `image/gif`, `image/webp`, not `{media_type}`"
                    ),
                ));
            }
            let data = source
                .data
                .ok_or_else(|| Refusal::at(format!("{at}.source.data"), "field required"))?;
            Ok(Image::Base64 { media_type, data })
        }
        "url" => {
            let url = source
                .url
                .ok_or_else(|| Refusal::at(format!("{at}.source.url"), "field required"))?;
            if !(url.starts_with("https://") || url.starts_with("http://")) {
                return Err(Refusal::at(format!("{at}.source.url"), "must be an http(s) URL"));
            }
            Ok(Image::Url(url))
        }
        other => Err(Refusal::at(
            format!("{at}.source.type"),
            format!("must be `base64` or `url`, not `{other}`"),
        )),
    }
}

/// A custom tool's name, as Anthropic requires: 1–128 of `a-z A-Z 0-9 _ -`.
fn valid_tool_name(name: &str) -> bool {
    (1..=128).contains(&name.len())
        && name.bytes().all(|b| b.is_ascii_alphanumeric() || b == b'_' || b == b'-')
}

fn read_tool(request: &mut core::Request, tool: WireTool, i: usize) -> Result<Tool, Refusal> {
    if let Some(kind) = tool.kind.as_deref()
        && kind != "custom"
    {
        return Err(Refusal::at(
            format!("tools[{i}].type"),
            format!(
                "the gateway takes custom tools (with `input_schema`), not the server tool `{kind}`"
            ),
        ));
    }
    if tool.cache_control.is_some() {
        request.hint("cache_control");
    }
    let name =
        tool.name.ok_or_else(|| Refusal::at(format!("tools[{i}].name"), "field required"))?;
    if !valid_tool_name(&name) {
        return Err(Refusal::at(
            format!("tools[{i}].name"),
            "must be 1 to 128 letters, digits, `_` or `-`",
        ));
    }
    let schema = tool
        .input_schema
        .ok_or_else(|| Refusal::at(format!("tools[{i}].input_schema"), "field required"))?;
    if !schema.get().trim_start().starts_with('{') {
        return Err(Refusal::at(
            format!("tools[{i}].input_schema"),
            "must be a JSON schema object",
        ));
    }
    Ok(Tool { name, description: tool.description, parameters: schema.into() })
}

// === Request: writing ===

#[derive(Serialize)]
struct OutRequest<'a> {
    model: &'a str,
    max_tokens: u32,
    #[serde(skip_serializing_if = "Option::is_none")]
    system: Option<OutSystem<'a>>,
    messages: Vec<OutTurn<'a>>,
    #[serde(skip_serializing_if = "Vec::is_empty")]
    tools: Vec<OutTool<'a>>,
    #[serde(skip_serializing_if = "Option::is_none")]
    tool_choice: Option<OutToolChoice<'a>>,
    #[serde(skip_serializing_if = "<[_]>::is_empty")]
    stop_sequences: &'a [String],
    #[serde(skip_serializing_if = "Option::is_none")]
    temperature: Option<f64>,
    #[serde(skip_serializing_if = "Option::is_none")]
    top_p: Option<f64>,
    #[serde(skip_serializing_if = "Option::is_none")]
    top_k: Option<u32>,
    #[serde(skip_serializing_if = "Option::is_none")]
    metadata: Option<OutMetadata<'a>>,
    #[serde(skip_serializing_if = "Option::is_none")]
    thinking: Option<OutThinking>,
    stream: bool,
}

#[derive(Serialize)]
#[serde(untagged)]
enum OutSystem<'a> {
    Text(&'a str),
    Blocks(Vec<OutBlock<'a>>),
}

#[derive(Serialize)]
struct OutTurn<'a> {
    role: &'static str,
    content: OutTurnContent<'a>,
}

#[derive(Serialize)]
#[serde(untagged)]
enum OutTurnContent<'a> {
    Text(&'a str),
    Blocks(Vec<OutInBlock<'a>>),
}

/// A content block of a request (what a client sends, as opposed to [`OutBlock`], what a
/// model answers).
#[derive(Serialize)]
#[serde(tag = "type", rename_all = "snake_case")]
enum OutInBlock<'a> {
    Text {
        text: &'a str,
    },
    Image {
        source: OutSource<'a>,
    },
    ToolUse {
        id: &'a str,
        name: &'a str,
        input: Box<RawValue>,
    },
    ToolResult {
        tool_use_id: &'a str,
        content: OutResultContent<'a>,
        #[serde(skip_serializing_if = "std::ops::Not::not")]
        is_error: bool,
    },
    Thinking {
        thinking: &'a str,
        signature: &'a str,
    },
}

/// A tool result's content: one text as the plain string a client would write (Chat's tool
/// messages are text), else blocks.
#[derive(Serialize)]
#[serde(untagged)]
enum OutResultContent<'a> {
    Text(&'a str),
    Blocks(Vec<OutInBlock<'a>>),
}

#[derive(Serialize)]
#[serde(tag = "type", rename_all = "snake_case")]
enum OutSource<'a> {
    Base64 { media_type: &'a str, data: &'a str },
    Url { url: &'a str },
}

#[derive(Serialize)]
struct OutTool<'a> {
    name: &'a str,
    #[serde(skip_serializing_if = "Option::is_none")]
    description: Option<&'a str>,
    input_schema: &'a RawValue,
}

#[derive(Serialize)]
struct OutToolChoice<'a> {
    #[serde(rename = "type")]
    kind: &'static str,
    #[serde(skip_serializing_if = "Option::is_none")]
    name: Option<&'a str>,
    #[serde(skip_serializing_if = "Option::is_none")]
    disable_parallel_tool_use: Option<bool>,
}

#[derive(Serialize)]
struct OutMetadata<'a> {
    user_id: &'a str,
}

#[derive(Serialize)]
struct OutThinking {
    #[serde(rename = "type")]
    kind: &'static str,
    budget_tokens: u32,
}

/// Thinking budgets for an effort, where a request names an effort and Anthropic takes a
/// budget.
fn budget(effort: Effort) -> u32 {
    match effort {
        Effort::Low => 2048,
        Effort::Medium => 8192,
        Effort::High => 16384,
    }
}

fn in_block(part: &Part) -> Option<OutInBlock<'_>> {
    Some(match part {
        // Anthropic refuses empty text blocks.
        Part::Text(text) if text.is_empty() => return None,
        Part::Text(text) => OutInBlock::Text { text },
        Part::Image(Image::Url(url)) => OutInBlock::Image { source: OutSource::Url { url } },
        Part::Image(Image::Base64 { media_type, data }) => {
            OutInBlock::Image { source: OutSource::Base64 { media_type, data } }
        }
        Part::ToolCall { id, name, arguments } => {
            OutInBlock::ToolUse { id, name, input: de::object(arguments) }
        }
        Part::ToolResult { call_id, content, is_error } => OutInBlock::ToolResult {
            tool_use_id: call_id,
            content: match content.as_slice() {
                [Part::Text(text)] => OutResultContent::Text(text),
                _ => OutResultContent::Blocks(content.iter().filter_map(in_block).collect()),
            },
            is_error: *is_error,
        },
        // Anthropic takes back only the thinking it signed.
        Part::Thinking { text, signature: Some(signature) } => {
            OutInBlock::Thinking { thinking: text, signature }
        }
        Part::Thinking { .. } => return None,
        // Refused by `request_body` before any block is made.
        Part::Audio { .. } | Part::File(_) => return None,
    })
}

/// The first part Anthropic cannot take in any form: audio, a document, a `gs://` URL.
fn unsupported_media(request: &core::Request) -> Result<(), Refusal> {
    for (i, message) in request.messages.iter().enumerate() {
        for (j, part) in message.parts.iter().enumerate() {
            let what = match part {
                Part::Audio { .. } => "audio",
                Part::File(_) => "files",
                Part::Image(Image::Url(url)) if url.starts_with("gs://") => "gs:// image URLs",
                _ => continue,
            };
            return Err(Refusal::at(
                format!("messages[{i}].parts[{j}]"),
                format!("the provider Anthropic takes no {what}"),
            ));
        }
    }
    Ok(())
}

/// The core request as an Anthropic Messages body for `upstream_model`.
///
/// - `max_tokens`: the request's, else `default_max_tokens` (Anthropic requires one);
/// - `system`: a string when it is one entry, else text blocks;
/// - a user turn's tool results come first in it (Anthropic requires it); empty text
///   blocks and turns left empty are dropped; thinking without a signature is dropped;
/// - `temperature` is capped into Anthropic's 0–1;
/// - `reasoning` becomes `thinking` (an effort as a budget of 2,048, 8,192 or 16,384
///   tokens), kept below `max_tokens` as Anthropic requires, and left out when `max_tokens`
///   leaves no room for the smallest budget; with thinking on, Anthropic takes no
///   `temperature` or `top_k`, so they are left out. A caller serving a model without
///   extended thinking clears `reasoning` first.
///
/// Refused: a tool call whose arguments are not a JSON object
/// (`messages[i].parts[j].arguments`, in core terms: the parsers refuse it first).
pub fn request_body(
    request: &core::Request,
    upstream_model: &str,
    default_max_tokens: u32,
) -> Result<Vec<u8>, Refusal> {
    unsupported_media(request)?;
    let max_tokens = request.max_tokens.unwrap_or(default_max_tokens).max(1);
    let system = match request.system.as_slice() {
        [] => None,
        [one] => Some(OutSystem::Text(one)),
        many => Some(OutSystem::Blocks(many.iter().map(|text| OutBlock::Text { text }).collect())),
    };
    let mut messages = Vec::with_capacity(request.messages.len());
    for (i, message) in request.messages.iter().enumerate() {
        for (j, part) in message.parts.iter().enumerate() {
            if let Part::ToolCall { arguments, .. } = part
                && !arguments.trim().is_empty()
                && !serde_json::from_str::<&RawValue>(arguments)
                    .is_ok_and(|raw| raw.get().starts_with('{'))
            {
                return Err(Refusal::at(
                    format!("messages[{i}].parts[{j}].arguments"),
                    "a tool call's arguments must be a JSON object",
                ));
            }
        }
        let (role, mut blocks): (&'static str, Vec<OutInBlock>) = match message.role {
            Role::User => ("user", message.parts.iter().filter_map(in_block).collect()),
            Role::Assistant => ("assistant", message.parts.iter().filter_map(in_block).collect()),
        };
        if message.role == Role::User {
            // Stable: results keep their order, and so does the rest.
            blocks.sort_by_key(|b| !matches!(b, OutInBlock::ToolResult { .. }));
        }
        if blocks.is_empty() {
            continue;
        }
        let content = match blocks.as_slice() {
            // A lone text block goes as the plain string a client would write.
            [OutInBlock::Text { text }] => OutTurnContent::Text(text),
            _ => OutTurnContent::Blocks(blocks),
        };
        messages.push(OutTurn { role, content });
    }
    let tools: Vec<OutTool> = request
        .tools
        .iter()
        .map(|tool| OutTool {
            name: &tool.name,
            description: tool.description.as_deref(),
            input_schema: tool.parameters.raw(),
        })
        .collect();
    // Anthropic refuses a `tool_choice` without tools.
    let tool_choice = request.tool_choice.as_ref().filter(|_| !tools.is_empty()).map(|choice| {
        let (kind, name) = match &choice.mode {
            ToolMode::Auto => ("auto", None),
            ToolMode::None => ("none", None),
            ToolMode::Any => ("any", None),
            ToolMode::Tool(name) => ("tool", Some(name.as_str())),
        };
        OutToolChoice {
            kind,
            name,
            // `none` takes no such field.
            disable_parallel_tool_use: choice.parallel.filter(|_| kind != "none").map(|p| !p),
        }
    });
    let thinking = request.reasoning.and_then(|reasoning| {
        let wanted = match reasoning {
            Reasoning::Budget(budget) => budget,
            Reasoning::Effort(effort) => budget(effort),
        };
        let budget = wanted.max(MIN_THINKING_BUDGET).min(max_tokens.saturating_sub(1));
        (budget >= MIN_THINKING_BUDGET)
            .then_some(OutThinking { kind: "enabled", budget_tokens: budget })
    });
    let body = OutRequest {
        model: upstream_model,
        max_tokens,
        system,
        messages,
        tools,
        tool_choice,
        stop_sequences: &request.stop,
        temperature: request.temperature.filter(|_| thinking.is_none()).map(|t| t.clamp(0.0, 1.0)),
        top_p: request.top_p,
        top_k: request.top_k.filter(|_| thinking.is_none()),
        metadata: request.user.as_deref().map(|user_id| OutMetadata { user_id }),
        thinking,
        stream: request.stream,
    };
    Ok(de::to_vec(&body))
}

// === Response: reading ===

#[derive(Deserialize)]
struct WireResponse {
    #[serde(rename = "type")]
    kind: Option<String>,
    #[serde(default)]
    id: String,
    #[serde(default)]
    model: String,
    /// Required in an answer (an answer without it is not a `message`); a stream's
    /// `message_start` carries it empty.
    content: Option<Vec<WireOutBlock>>,
    stop_reason: Option<String>,
    stop_sequence: Option<String>,
    usage: Option<WireUsage>,
    error: Option<WireError>,
}

/// A block of an answer (or of a stream's `content_block_start`).
#[derive(Deserialize)]
struct WireOutBlock {
    #[serde(rename = "type")]
    kind: String,
    text: Option<String>,
    id: Option<String>,
    name: Option<String>,
    input: Option<Box<RawValue>>,
    thinking: Option<String>,
    signature: Option<String>,
}

#[derive(Deserialize, Clone, Copy, Default)]
struct WireUsage {
    input_tokens: Option<u64>,
    output_tokens: Option<u64>,
    cache_creation_input_tokens: Option<u64>,
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

    /// The core counts cached input as input; sums saturate (the counts are the
    /// upstream's, and none may wrap).
    fn core(self) -> Usage {
        Usage {
            input_tokens: self
                .input_tokens
                .unwrap_or(0)
                .saturating_add(self.cache_creation_input_tokens.unwrap_or(0))
                .saturating_add(self.cache_read_input_tokens.unwrap_or(0)),
            output_tokens: self.output_tokens.unwrap_or(0),
            cache_read_tokens: self.cache_read_input_tokens,
            cache_write_tokens: self.cache_creation_input_tokens,
        }
    }
}

#[derive(Deserialize)]
struct WireError {
    #[serde(rename = "type", default)]
    kind: String,
    #[serde(default)]
    message: String,
}

/// An error Anthropic sent: its `error.type` and message.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct ApiError {
    pub kind: String,
    pub message: String,
}

/// An Anthropic error body (`{"type":"error","error":{...}}`, also a stream's `error`
/// event), if the body is one.
pub fn parse_error(body: &[u8]) -> Option<ApiError> {
    #[derive(Deserialize)]
    struct Body {
        error: WireError,
    }
    serde_json::from_slice::<Body>(body)
        .ok()
        .map(|b| ApiError { kind: b.error.kind, message: b.error.message })
}

/// Anthropic's `stop_reason` as a finish (`pause_turn` and anything newer read as a stop).
pub fn finish(stop_reason: Option<&str>, stop_sequence: Option<String>) -> Finish {
    match stop_reason {
        Some("max_tokens" | "model_context_window_exceeded") => Finish::Length,
        Some("tool_use") => Finish::ToolCalls,
        Some("stop_sequence") => Finish::StopSequence(stop_sequence),
        Some("refusal") => Finish::Refusal,
        _ => Finish::Stop,
    }
}

/// An Anthropic `message` as a core answer. Blocks the core has no place for (redacted
/// thinking, server tool blocks) are left out. An error body is refused as `error`.
pub fn parse_response(body: &[u8]) -> Result<core::Response, Refusal> {
    let wire: WireResponse = de::read(body)?;
    if wire.kind.as_deref() == Some("error") || wire.error.is_some() {
        let error = wire.error.unwrap_or(WireError { kind: String::new(), message: String::new() });
        return Err(Refusal::at(
            "error",
            format!("the answer is an error ({}): {}", error.kind, error.message),
        ));
    }
    let content = wire.content.ok_or_else(|| Refusal::at("content", "field required"))?;
    let mut parts = Vec::with_capacity(content.len());
    for (i, block) in content.into_iter().enumerate() {
        let at = format!("content[{i}]");
        match block.kind.as_str() {
            "text" => parts.push(Part::Text(required(block.text, &at, "text")?)),
            "tool_use" => parts.push(Part::ToolCall {
                id: required(block.id, &at, "id")?,
                name: required(block.name, &at, "name")?,
                arguments: block.input.map_or_else(|| "{}".to_owned(), de::text),
            }),
            "thinking" => parts.push(Part::Thinking {
                text: required(block.thinking, &at, "thinking")?,
                signature: block.signature,
            }),
            _ => {}
        }
    }
    Ok(core::Response {
        id: wire.id,
        model: wire.model,
        parts,
        finish: finish(wire.stop_reason.as_deref(), wire.stop_sequence),
        usage: wire.usage.unwrap_or_default().core(),
    })
}

// === Streams: reading ===

#[derive(Deserialize)]
struct WireEvent {
    message: Option<WireResponse>,
    index: Option<u32>,
    content_block: Option<WireOutBlock>,
    delta: Option<WireEventDelta>,
    usage: Option<WireUsage>,
    error: Option<WireError>,
}

#[derive(Deserialize)]
struct WireEventDelta {
    #[serde(rename = "type")]
    kind: Option<String>,
    text: Option<String>,
    thinking: Option<String>,
    signature: Option<String>,
    partial_json: Option<String>,
    stop_reason: Option<String>,
    stop_sequence: Option<String>,
}

/// Anthropic's stream events → core events. Tool calls are numbered in the order they
/// start (their core `index`), whatever their block index.
#[derive(Default)]
pub struct Decoder {
    usage: WireUsage,
    /// The core index of each tool call, by block index.
    tools: Vec<(u32, u32)>,
}

impl Decoder {
    pub fn new() -> Self {
        Self::default()
    }

    /// The events of one SSE event (its `event:` name and `data:` payload). `ping`,
    /// `content_block_stop`, `message_stop` and event types Anthropic may add carry none; an
    /// `error` event is refused as `error`, with Anthropic's type and message
    /// ([`parse_error`] reads them apart).
    pub fn decode(&mut self, event: &str, data: &[u8]) -> Result<Vec<Event>, Refusal> {
        let mut events = Vec::new();
        match event {
            "message_start"
            | "content_block_start"
            | "content_block_delta"
            | "message_delta"
            | "error" => {}
            _ => return Ok(events),
        }
        let wire: WireEvent = de::read(data)?;
        match event {
            "message_start" => {
                let message =
                    wire.message.ok_or_else(|| Refusal::at("message", "field required"))?;
                if let Some(usage) = message.usage {
                    self.usage.update(usage);
                }
                events.push(Event::Start { id: message.id, model: message.model });
            }
            "content_block_start" => {
                let index = wire.index.ok_or_else(|| Refusal::at("index", "field required"))?;
                let block = wire
                    .content_block
                    .ok_or_else(|| Refusal::at("content_block", "field required"))?;
                match block.kind.as_str() {
                    "text" => {
                        if let Some(text) = block.text.filter(|t| !t.is_empty()) {
                            events.push(Event::TextDelta(text));
                        }
                    }
                    "thinking" => {
                        if let Some(text) = block.thinking.filter(|t| !t.is_empty()) {
                            events.push(Event::ThinkingDelta { text, signature: None });
                        }
                    }
                    "tool_use" => {
                        let call = self.tools.len() as u32;
                        self.tools.push((index, call));
                        events.push(Event::ToolCallStart {
                            index: call,
                            id: required(block.id, "content_block", "id")?,
                            name: required(block.name, "content_block", "name")?,
                        });
                        // A start normally carries `input: {}` and the arguments follow as
                        // deltas; a non-empty input is the whole arguments.
                        if let Some(input) = block.input
                            && input.get() != "{}"
                        {
                            events.push(Event::ToolCallDelta {
                                index: call,
                                arguments: de::text(input),
                            });
                        }
                    }
                    _ => {}
                }
            }
            "content_block_delta" => {
                let index = wire.index.ok_or_else(|| Refusal::at("index", "field required"))?;
                let delta = wire.delta.ok_or_else(|| Refusal::at("delta", "field required"))?;
                match delta.kind.as_deref() {
                    Some("text_delta") => {
                        if let Some(text) = delta.text.filter(|t| !t.is_empty()) {
                            events.push(Event::TextDelta(text));
                        }
                    }
                    Some("thinking_delta") => events.push(Event::ThinkingDelta {
                        text: delta.thinking.unwrap_or_default(),
                        signature: None,
                    }),
                    Some("signature_delta") => events.push(Event::ThinkingDelta {
                        text: String::new(),
                        signature: delta.signature,
                    }),
                    Some("input_json_delta") => {
                        let call = self
                            .tools
                            .iter()
                            .find(|(block, _)| *block == index)
                            .map(|(_, call)| *call)
                            .ok_or_else(|| {
                                Refusal::at(
                                    "index",
                                    "an input_json_delta for a block that is not a tool_use",
                                )
                            })?;
                        if let Some(arguments) = delta.partial_json.filter(|a| !a.is_empty()) {
                            events.push(Event::ToolCallDelta { index: call, arguments });
                        }
                    }
                    // citations_delta and newer kinds have no core form.
                    _ => {}
                }
            }
            "message_delta" => {
                if let Some(usage) = wire.usage {
                    self.usage.update(usage);
                }
                if let Some(delta) = wire.delta
                    && delta.stop_reason.is_some()
                {
                    events.push(Event::Finish(finish(
                        delta.stop_reason.as_deref(),
                        delta.stop_sequence,
                    )));
                }
                events.push(Event::Usage(self.usage.core()));
            }
            _ => {
                let error =
                    wire.error.unwrap_or(WireError { kind: String::new(), message: String::new() });
                return Err(Refusal::at(
                    "error",
                    format!("the stream ended in an error ({}): {}", error.kind, error.message),
                ));
            }
        }
        Ok(events)
    }
}

// === Response: writing ===

#[derive(Serialize)]
#[serde(tag = "type", rename_all = "snake_case")]
enum OutBlock<'a> {
    Text { text: &'a str },
    ToolUse { id: &'a str, name: &'a str, input: Box<RawValue> },
    Thinking { thinking: &'a str, signature: &'a str },
}

#[derive(Serialize)]
struct OutUsage {
    input_tokens: u64,
    output_tokens: u64,
    #[serde(skip_serializing_if = "Option::is_none")]
    cache_creation_input_tokens: Option<u64>,
    #[serde(skip_serializing_if = "Option::is_none")]
    cache_read_input_tokens: Option<u64>,
}

impl OutUsage {
    /// Anthropic's `input_tokens` does not count the cache; the core's does.
    fn of(usage: &Usage) -> Self {
        let cached = usage
            .cache_read_tokens
            .unwrap_or(0)
            .saturating_add(usage.cache_write_tokens.unwrap_or(0));
        OutUsage {
            input_tokens: usage.input_tokens.saturating_sub(cached),
            output_tokens: usage.output_tokens,
            cache_creation_input_tokens: usage.cache_write_tokens,
            cache_read_input_tokens: usage.cache_read_tokens,
        }
    }
}

#[derive(Serialize)]
struct OutMessage<'a> {
    id: &'a str,
    #[serde(rename = "type")]
    kind: &'static str,
    role: &'static str,
    content: Vec<OutBlock<'a>>,
    model: &'a str,
    stop_reason: Option<&'static str>,
    stop_sequence: Option<&'a str>,
    usage: OutUsage,
}

/// Anthropic's `stop_reason` for a finish.
pub fn stop_reason(finish: &Finish) -> &'static str {
    match finish {
        Finish::Stop => "end_turn",
        Finish::Length => "max_tokens",
        Finish::ToolCalls => "tool_use",
        Finish::StopSequence(_) => "stop_sequence",
        Finish::ContentFilter | Finish::Refusal => "refusal",
    }
}

fn stop_sequence(finish: &Finish) -> Option<&str> {
    match finish {
        Finish::StopSequence(Some(sequence)) => Some(sequence),
        _ => None,
    }
}

fn out_blocks(parts: &[Part]) -> Vec<OutBlock<'_>> {
    parts
        .iter()
        .filter_map(|part| match part {
            // Anthropic never answers with an empty text block.
            Part::Text(text) if !text.is_empty() => Some(OutBlock::Text { text }),
            Part::ToolCall { id, name, arguments } => {
                Some(OutBlock::ToolUse { id, name, input: de::object(arguments) })
            }
            Part::Thinking { text, signature } => Some(OutBlock::Thinking {
                thinking: text,
                signature: signature.as_deref().unwrap_or(""),
            }),
            _ => None,
        })
        .collect()
}

/// A whole answer as an Anthropic `message` object, with `model` as its model.
pub fn response_body(response: &core::Response, model: &str) -> Vec<u8> {
    de::to_vec(&OutMessage {
        id: &response.id,
        kind: "message",
        role: "assistant",
        content: out_blocks(&response.parts),
        model,
        stop_reason: Some(stop_reason(&response.finish)),
        stop_sequence: stop_sequence(&response.finish),
        usage: OutUsage::of(&response.usage),
    })
}

// === Errors ===

/// Anthropic's `error.type` for an HTTP status.
pub fn error_type(status: u16) -> &'static str {
    match status {
        400 => "invalid_request_error",
        401 => "authentication_error",
        403 => "permission_error",
        404 => "not_found_error",
        413 => "request_too_large",
        429 => "rate_limit_error",
        529 => "overloaded_error",
        500..=599 => "api_error",
        _ => "invalid_request_error",
    }
}

#[derive(Serialize)]
struct OutError<'a> {
    #[serde(rename = "type")]
    kind: &'static str,
    error: OutErrorBody<'a>,
}

#[derive(Serialize)]
struct OutErrorBody<'a> {
    #[serde(rename = "type")]
    kind: &'static str,
    message: &'a str,
}

/// An error in Anthropic's shape: `{"type":"error","error":{"type":...,"message":...}}`,
/// the type from [`error_type`]. (The gateway adds its own fields, such as `attempts`.)
pub fn error_body(status: u16, message: &str) -> Vec<u8> {
    de::to_vec(&OutError {
        kind: "error",
        error: OutErrorBody { kind: error_type(status), message },
    })
}

// === Streams: writing ===

#[derive(Clone, Copy, PartialEq, Eq)]
enum Open {
    Text,
    Thinking,
    Tool(u32),
}

#[derive(Serialize)]
struct OutStart<'a> {
    #[serde(rename = "type")]
    kind: &'static str,
    message: OutMessage<'a>,
}

#[derive(Serialize)]
struct OutBlockStart<'a> {
    #[serde(rename = "type")]
    kind: &'static str,
    index: u32,
    content_block: OutStartBlock<'a>,
}

#[derive(Serialize)]
#[serde(tag = "type", rename_all = "snake_case")]
enum OutStartBlock<'a> {
    Text {
        text: &'static str,
    },
    /// As Anthropic starts one: empty, with an empty `signature` that a `signature_delta`
    /// fills in.
    Thinking {
        thinking: &'static str,
        signature: &'static str,
    },
    ToolUse {
        id: &'a str,
        name: &'a str,
        input: Box<RawValue>,
    },
}

#[derive(Serialize)]
struct OutBlockDelta<'a> {
    #[serde(rename = "type")]
    kind: &'static str,
    index: u32,
    delta: OutDelta<'a>,
}

#[derive(Serialize)]
#[serde(tag = "type")]
enum OutDelta<'a> {
    #[serde(rename = "text_delta")]
    Text { text: &'a str },
    #[serde(rename = "thinking_delta")]
    Thinking { thinking: &'a str },
    #[serde(rename = "signature_delta")]
    Signature { signature: &'a str },
    #[serde(rename = "input_json_delta")]
    InputJson { partial_json: &'a str },
}

#[derive(Serialize)]
struct OutIndex {
    #[serde(rename = "type")]
    kind: &'static str,
    index: u32,
}

#[derive(Serialize)]
struct OutMessageDelta<'a> {
    #[serde(rename = "type")]
    kind: &'static str,
    delta: OutStop<'a>,
    usage: OutUsage,
}

#[derive(Serialize)]
struct OutStop<'a> {
    stop_reason: &'static str,
    stop_sequence: Option<&'a str>,
}

#[derive(Serialize)]
struct OutType {
    #[serde(rename = "type")]
    kind: &'static str,
}

/// Core events → Anthropic's stream: `message_start`, `ping`, per block
/// `content_block_start` / `content_block_delta`s / `content_block_stop`, then
/// `message_delta` (stop reason and usage) and `message_stop` from [`Encoder::finish`].
///
/// The finish and the usage are held until `finish()`: OpenAI sends usage after its finish
/// reason, and Anthropic's `message_delta` carries both.
pub struct Encoder {
    model: String,
    started: bool,
    finished: bool,
    /// The open block: its kind and its index.
    open: Option<(Open, u32)>,
    next_index: u32,
    /// Block index of each tool call, by the call's core index.
    tools: Vec<(u32, u32)>,
    finish: Option<Finish>,
    usage: Option<Usage>,
}

impl Encoder {
    pub fn new(model: &str) -> Self {
        Encoder {
            model: model.to_owned(),
            started: false,
            finished: false,
            open: None,
            next_index: 0,
            tools: Vec::new(),
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
                let index = self.open_block(Open::Text, out);
                out.push(delta(index, OutDelta::Text { text: &text }));
            }
            Event::ThinkingDelta { text, signature } => {
                let index = self.open_block(Open::Thinking, out);
                if !text.is_empty() {
                    out.push(delta(index, OutDelta::Thinking { thinking: &text }));
                }
                if let Some(signature) = &signature {
                    out.push(delta(index, OutDelta::Signature { signature }));
                }
            }
            Event::ToolCallStart { index, id, name } => {
                self.start("", out);
                self.close(out);
                let block = self.next_index;
                self.next_index += 1;
                self.tools.push((index, block));
                self.open = Some((Open::Tool(index), block));
                out.push(Frame::new(
                    "content_block_start",
                    &OutBlockStart {
                        kind: "content_block_start",
                        index: block,
                        content_block: OutStartBlock::ToolUse {
                            id: &id,
                            name: &name,
                            input: de::empty_object(),
                        },
                    },
                ));
            }
            Event::ToolCallDelta { index, arguments } => {
                if arguments.is_empty() {
                    return;
                }
                // A delta for a call whose block is closed (a provider interleaving
                // parallel calls) still names that call's block: clients append it by index.
                let block = match self.tools.iter().find(|(call, _)| *call == index) {
                    Some((_, block)) => *block,
                    None => {
                        self.push(
                            Event::ToolCallStart { index, id: String::new(), name: String::new() },
                            out,
                        );
                        self.next_index - 1
                    }
                };
                out.push(delta(block, OutDelta::InputJson { partial_json: &arguments }));
            }
            Event::Finish(finish) => self.finish = Some(finish),
            Event::Usage(usage) => self.usage = Some(usage),
        }
    }

    /// Ends the stream: closes the open block, then `message_delta` and `message_stop`.
    pub fn finish(&mut self, out: &mut Vec<Frame>) {
        if self.finished {
            return;
        }
        self.start("", out);
        self.close(out);
        self.finished = true;
        let finish = self.finish.take().unwrap_or(Finish::Stop);
        let usage = self.usage.unwrap_or_default();
        out.push(Frame::new(
            "message_delta",
            &OutMessageDelta {
                kind: "message_delta",
                delta: OutStop {
                    stop_reason: stop_reason(&finish),
                    stop_sequence: stop_sequence(&finish),
                },
                usage: OutUsage::of(&usage),
            },
        ));
        out.push(Frame::new("message_stop", &OutType { kind: "message_stop" }));
    }

    /// `message_start` (and a `ping`, as Anthropic sends), once.
    fn start(&mut self, id: &str, out: &mut Vec<Frame>) {
        if self.started {
            return;
        }
        self.started = true;
        out.push(Frame::new(
            "message_start",
            &OutStart {
                kind: "message_start",
                message: OutMessage {
                    id,
                    kind: "message",
                    role: "assistant",
                    content: Vec::new(),
                    model: &self.model,
                    stop_reason: None,
                    stop_sequence: None,
                    // The usage comes at the end (in `message_delta`): OpenAI-kind providers
                    // report it last.
                    usage: OutUsage::of(&self.usage.unwrap_or_default()),
                },
            },
        ));
        out.push(Frame::new("ping", &OutType { kind: "ping" }));
    }

    /// The index of an open block of this kind, opening one (and closing another) if needed.
    fn open_block(&mut self, kind: Open, out: &mut Vec<Frame>) -> u32 {
        self.start("", out);
        if let Some((open, index)) = self.open
            && open == kind
        {
            return index;
        }
        self.close(out);
        let index = self.next_index;
        self.next_index += 1;
        self.open = Some((kind, index));
        let content_block = match kind {
            Open::Thinking => OutStartBlock::Thinking { thinking: "", signature: "" },
            _ => OutStartBlock::Text { text: "" },
        };
        out.push(Frame::new(
            "content_block_start",
            &OutBlockStart { kind: "content_block_start", index, content_block },
        ));
        index
    }

    fn close(&mut self, out: &mut Vec<Frame>) {
        if let Some((_, index)) = self.open.take() {
            out.push(Frame::new(
                "content_block_stop",
                &OutIndex { kind: "content_block_stop", index },
            ));
        }
    }
}

fn delta(index: u32, delta: OutDelta<'_>) -> Frame {
    Frame::new("content_block_delta", &OutBlockDelta { kind: "content_block_delta", index, delta })
}

#[cfg(test)]
mod tests {
    use serde_json::{Value, json};

    use super::*;

    fn parse(body: Value) -> Result<core::Request, Refusal> {
        parse_request(body.to_string().as_bytes())
    }

    fn refused(body: Value) -> Refusal {
        match parse(body) {
            Err(refusal) => refusal,
            Ok(request) => panic!("accepted: {request:?}"),
        }
    }

    fn with(extra: Value) -> Value {
        let mut body = json!({"model": "m", "max_tokens": 100, "messages": [{"role": "user", "content": "hi"}]});
        if let (Some(body), Some(extra)) = (body.as_object_mut(), extra.as_object()) {
            for (k, v) in extra {
                body.insert(k.clone(), v.clone());
            }
        }
        body
    }

    /// Asserts the refusal names `field` both as its field and in its message.
    #[track_caller]
    fn assert_refuses(body: Value, field: &str) {
        let refusal = refused(body);
        assert_eq!(refusal.field, field, "{refusal:?}");
        assert!(refusal.message.contains(&format!("`{field}`")), "{refusal:?}");
        assert_eq!(refusal.to_string(), refusal.message);
    }

    fn tool_turns() -> Vec<Value> {
        vec![
            json!({"role": "user", "content": "weather?"}),
            json!({"role": "assistant", "content": [
                {"type": "tool_use", "id": "toolu_1", "name": "get_weather", "input": {"city": "Paris"}}]}),
        ]
    }

    #[test]
    fn a_plain_request_reads_into_the_core_form() {
        let request = parse(with(json!({
            "system": "be brief", "stop_sequences": ["END"], "temperature": 0.5, "top_p": 0.9,
            "top_k": 40, "stream": true, "metadata": {"user_id": "u-1"}
        })))
        .unwrap();
        assert_eq!(request.system, vec!["be brief"]);
        assert_eq!(
            request.messages,
            vec![Message { role: Role::User, parts: vec![Part::Text("hi".into())] }]
        );
        assert_eq!(request.max_tokens, Some(100));
        assert_eq!(request.stop, vec!["END"]);
        assert_eq!(request.temperature, Some(0.5));
        assert_eq!(request.top_p, Some(0.9));
        assert_eq!(request.top_k, Some(40));
        assert!(request.stream);
        assert_eq!(request.user.as_deref(), Some("u-1"));
        assert!(request.hints.is_empty());
    }

    #[test]
    fn the_gateways_own_fields_and_unknown_top_level_fields_are_ignored() {
        let request = parse(with(json!({
            "models": ["a", "b"], "fallback_models": ["c"], "redundancy": {"timeout_ms": 5},
            "something_new": {"x": 1}
        })))
        .unwrap();
        assert_eq!(request.messages.len(), 1);
        assert!(request.hints.is_empty());
    }

    #[test]
    fn every_refusal_names_its_field_in_messages_terms() {
        let user = |content: Value| json!({"role": "user", "content": content});
        assert_refuses(json!({"messages": [user(json!("hi"))]}), "max_tokens");
        assert_refuses(with(json!({"max_tokens": 0})), "max_tokens");
        assert_refuses(with(json!({"max_tokens": "many"})), "max_tokens");
        assert_refuses(json!({"max_tokens": 5}), "messages");
        assert_refuses(with(json!({"messages": "hi"})), "messages");
        assert_refuses(with(json!({"messages": []})), "messages");
        assert_refuses(
            with(json!({"messages": [{"role": "system", "content": "x"}]})),
            "messages[0].role",
        );
        assert_refuses(
            with(json!({"messages": [{"role": "user", "content": 5}]})),
            "messages[0].content",
        );
        assert_refuses(with(json!({"messages": [user(json!([]))]})), "messages[0].content");
        assert_refuses(
            with(json!({"messages": [user(json!("a")), {"role": "assistant", "content": "b"},
                user(json!([{"type": "text", "text": "c"}, {"type": "video", "url": "x"}]))]})),
            "messages[2].content[1].type",
        );
        assert_refuses(
            with(json!({"messages": [user(json!([{"type": "text"}]))]})),
            "messages[0].content[0].text",
        );
        assert_refuses(
            with(json!({"messages": [user(json!([{"type": "text", "text": 7}]))]})),
            "messages[0].content[0].text",
        );
        let mut turns = tool_turns();
        turns.push(user(
            json!([{"type": "tool_result", "tool_use_id": "toolu_1", "content": "ok"}]),
        ));
        turns.push(json!({"role": "assistant", "content": "fine"}));
        turns
            .push(user(json!([{"type": "tool_result", "tool_use_id": "toolu_9", "content": "?"}])));
        assert_refuses(with(json!({"messages": turns})), "messages[4].content[0].tool_use_id");
        let mut turns = tool_turns();
        turns[1] = json!({"role": "assistant", "content": [
            {"type": "tool_use", "id": "toolu_1", "name": "get_weather", "input": "Paris"}]});
        assert_refuses(with(json!({"messages": turns})), "messages[1].content[0].input");
        assert_refuses(
            with(json!({"messages": [user(json!("a")), {"role": "assistant", "content": [
                {"type": "tool_result", "tool_use_id": "x", "content": "?"}]}]})),
            "messages[1].content[0].type",
        );
        assert_refuses(
            with(
                json!({"messages": [user(json!([{"type": "tool_use", "id": "a", "name": "b", "input": {}}]))]}),
            ),
            "messages[0].content[0].type",
        );
        let mut turns = tool_turns();
        turns.push(user(json!([{"type": "tool_result", "tool_use_id": "toolu_1", "content": [{"type": "document"}]}])));
        assert_refuses(with(json!({"messages": turns})), "messages[2].content[0].content[0].type");
        assert_refuses(
            with(
                json!({"messages": [user(json!([{"type": "image", "source": {"type": "base64", "media_type": "image/bmp", "data": "AA=="}}]))]}),
            ),
            "messages[0].content[0].source.media_type",
        );
        assert_refuses(
            with(
                json!({"messages": [user(json!([{"type": "image", "source": {"type": "file", "file_id": "f"}}]))]}),
            ),
            "messages[0].content[0].source.type",
        );
        assert_refuses(
            with(
                json!({"messages": [user(json!([{"type": "image", "source": {"type": "url", "url": "ftp://x/a.png"}}]))]}),
            ),
            "messages[0].content[0].source.url",
        );
        assert_refuses(with(json!({"system": [{"type": "image"}]})), "system[0].type");
        assert_refuses(with(json!({"system": 5})), "system");
        assert_refuses(with(json!({"tool_choice": {"type": "some"}})), "tool_choice.type");
        assert_refuses(with(json!({"tool_choice": {"type": "tool"}})), "tool_choice.name");
        assert_refuses(
            with(json!({"tool_choice": {"type": "tool", "name": "nope"}})),
            "tool_choice.name",
        );
        assert_refuses(with(json!({"stop_sequences": "END"})), "stop_sequences");
        assert_refuses(with(json!({"stop_sequences": ["a", 1]})), "stop_sequences[1]");
        assert_refuses(with(json!({"temperature": 1.5})), "temperature");
        assert_refuses(with(json!({"temperature": -0.1})), "temperature");
        assert_refuses(with(json!({"top_p": 2})), "top_p");
        assert_refuses(with(json!({"top_k": -1})), "top_k");
        assert_refuses(with(json!({"stream": "yes"})), "stream");
        assert_refuses(with(json!({"metadata": {"user_id": 5}})), "metadata.user_id");
        assert_refuses(with(json!({"thinking": {"type": "enabled"}})), "thinking.budget_tokens");
        assert_refuses(
            with(json!({"thinking": {"type": "enabled", "budget_tokens": 1000}})),
            "thinking.budget_tokens",
        );
        assert_refuses(with(json!({"thinking": {"type": "sometimes"}})), "thinking.type");
        assert_refuses(
            with(json!({"output_config": {"effort": "extreme"}})),
            "output_config.effort",
        );
        assert_refuses(
            with(json!({"tools": [{"type": "web_search_20250305", "name": "web_search"}]})),
            "tools[0].type",
        );
        assert_refuses(
            with(
                json!({"tools": [{"name": "ok", "input_schema": {}}, {"name": "bad name", "input_schema": {}}]}),
            ),
            "tools[1].name",
        );
        assert_refuses(with(json!({"tools": [{"name": "t"}]})), "tools[0].input_schema");
        assert_refuses(
            with(json!({"tools": [{"name": "t", "input_schema": []}]})),
            "tools[0].input_schema",
        );
    }

    #[test]
    fn a_body_that_is_not_a_json_object_is_refused_as_the_body() {
        assert_eq!(parse_request(b"{\"max_tokens\": 1,").unwrap_err().field, "body");
        assert_eq!(parse_request(b"[1]").unwrap_err().field, "body");
        assert_eq!(parse_request(b"{} x").unwrap_err().field, "body");
    }

    #[test]
    fn the_first_message_must_be_the_users() {
        assert_refuses(
            with(
                json!({"messages": [{"role": "assistant", "content": "hello"}, {"role": "user", "content": "hi"}]}),
            ),
            "messages[0].role",
        );
    }

    #[test]
    fn consecutive_turns_of_one_role_are_merged_and_a_final_assistant_turn_may_be_empty() {
        let request = parse(with(json!({"messages": [
            {"role": "user", "content": "a"},
            {"role": "user", "content": [{"type": "text", "text": "b"}]},
            {"role": "assistant", "content": "c"},
            {"role": "assistant", "content": "d"},
            {"role": "user", "content": "e"},
            {"role": "assistant", "content": []},
        ]})))
        .unwrap();
        let roles: Vec<(Role, usize)> =
            request.messages.iter().map(|m| (m.role, m.parts.len())).collect();
        assert_eq!(
            roles,
            vec![(Role::User, 2), (Role::Assistant, 2), (Role::User, 1), (Role::Assistant, 0)]
        );
    }

    #[test]
    fn a_system_message_after_the_first_joins_the_instructions_in_order() {
        // Claude Code sends one between user turns when it offers its Agent tool.
        let request = parse(with(json!({"system": "first", "messages": [
            {"role": "user", "content": "a"},
            {"role": "system", "content": "agent types: x"},
            {"role": "user", "content": [{"type": "text", "text": "b"}]},
        ]})))
        .unwrap();
        assert_eq!(request.system, vec!["first".to_owned(), "agent types: x".to_owned()]);
        let roles: Vec<(Role, usize)> =
            request.messages.iter().map(|m| (m.role, m.parts.len())).collect();
        assert_eq!(roles, vec![(Role::User, 2)]);
        assert_refuses(
            with(json!({"messages": [{"role": "user", "content": "a"},
                {"role": "system", "content": [{"type": "image"}]}]})),
            "messages[1].content[0].type",
        );
    }

    #[test]
    fn tool_use_and_tool_result_become_calls_and_results() {
        let mut turns = tool_turns();
        turns.push(json!({"role": "user", "content": [
            {"type": "tool_result", "tool_use_id": "toolu_1", "is_error": true,
             "content": [{"type": "text", "text": "no such city"},
                         {"type": "image", "source": {"type": "url", "url": "https://x/a.png"}}]},
            {"type": "text", "text": "try again"}]}));
        let request = parse(with(json!({"messages": turns}))).unwrap();
        assert_eq!(
            request.messages[1].parts,
            vec![Part::ToolCall {
                id: "toolu_1".into(),
                name: "get_weather".into(),
                arguments: r#"{"city":"Paris"}"#.into()
            }]
        );
        assert_eq!(
            request.messages[2].parts,
            vec![
                Part::ToolResult {
                    call_id: "toolu_1".into(),
                    content: vec![
                        Part::Text("no such city".into()),
                        Part::Image(Image::Url("https://x/a.png".into()))
                    ],
                    is_error: true
                },
                Part::Text("try again".into())
            ]
        );
    }

    #[test]
    fn hints_name_each_provider_only_field_once_in_the_order_seen() {
        let request = parse(with(json!({
            "system": [{"type": "text", "text": "a", "cache_control": {"type": "ephemeral"}},
                       {"type": "text", "text": "b", "cache_control": {"type": "ephemeral"}}],
            "messages": [{"role": "user", "content": [
                {"type": "text", "text": "hi", "cache_control": {"type": "ephemeral"}}]},
                {"role": "assistant", "content": [{"type": "redacted_thinking", "data": "xyz"}, {"type": "text", "text": "ok"}]},
                {"role": "user", "content": "more"}],
            "tools": [{"name": "t", "input_schema": {"type": "object"}, "cache_control": {"type": "ephemeral"}}],
            "context_management": {"edits": []},
            "service_tier": "auto",
            "output_config": {"format": {"type": "json_schema", "schema": {}}}
        })))
        .unwrap();
        assert_eq!(
            request.hints,
            vec![
                "cache_control",
                "redacted_thinking",
                "output_config",
                "context_management",
                "service_tier"
            ]
        );
        // The redacted block is dropped; the text after it stays.
        assert_eq!(request.messages[1].parts, vec![Part::Text("ok".into())]);
    }

    #[test]
    fn thinking_maps_to_reasoning() {
        let reasoning = |extra: Value| parse(with(extra)).unwrap().reasoning;
        assert_eq!(
            reasoning(json!({"thinking": {"type": "enabled", "budget_tokens": 31999}})),
            Some(Reasoning::Budget(31999))
        );
        assert_eq!(
            reasoning(
                json!({"thinking": {"type": "adaptive"}, "output_config": {"effort": "low"}})
            ),
            Some(Reasoning::Effort(Effort::Low))
        );
        assert_eq!(
            reasoning(
                json!({"thinking": {"type": "adaptive"}, "output_config": {"effort": "max"}})
            ),
            Some(Reasoning::Effort(Effort::High))
        );
        assert_eq!(
            reasoning(json!({"thinking": {"type": "adaptive"}})),
            Some(Reasoning::Effort(Effort::High))
        );
        assert_eq!(
            reasoning(json!({"output_config": {"effort": "medium"}})),
            Some(Reasoning::Effort(Effort::Medium))
        );
        assert_eq!(
            reasoning(
                json!({"thinking": {"type": "disabled"}, "output_config": {"effort": "medium"}})
            ),
            None
        );
        assert_eq!(reasoning(json!({})), None);
    }

    #[test]
    fn tool_choice_maps_with_parallel_as_the_inverse_of_disable_parallel_tool_use() {
        let tools = json!([{"name": "get_weather", "description": "d", "input_schema": {"type": "object"}}]);
        let choice =
            |c: Value| parse(with(json!({"tools": tools, "tool_choice": c}))).unwrap().tool_choice;
        assert_eq!(
            choice(json!({"type": "auto"})),
            Some(ToolChoice { mode: ToolMode::Auto, parallel: None })
        );
        assert_eq!(
            choice(json!({"type": "any", "disable_parallel_tool_use": true})),
            Some(ToolChoice { mode: ToolMode::Any, parallel: Some(false) })
        );
        assert_eq!(
            choice(json!({"type": "tool", "name": "get_weather"})),
            Some(ToolChoice { mode: ToolMode::Tool("get_weather".into()), parallel: None })
        );
        assert_eq!(
            choice(json!({"type": "none"})),
            Some(ToolChoice { mode: ToolMode::None, parallel: None })
        );
        let request = parse(with(json!({"tools": tools}))).unwrap();
        assert_eq!(
            request.tools,
            vec![Tool {
                name: "get_weather".into(),
                description: Some("d".into()),
                parameters: core::RawJson::new(r#"{"type":"object"}"#.into()).unwrap()
            }]
        );
    }

    fn user_turn(parts: Vec<Part>) -> Message {
        Message { role: Role::User, parts }
    }

    #[test]
    fn a_core_request_becomes_a_messages_body() {
        let request = core::Request {
            system: vec!["only".into()],
            messages: vec![
                user_turn(vec![Part::Text("hi".into())]),
                Message {
                    role: Role::Assistant,
                    parts: vec![
                        Part::Thinking { text: "unsigned".into(), signature: None },
                        Part::Thinking { text: "signed".into(), signature: Some("sig".into()) },
                        Part::Text(String::new()),
                        Part::ToolCall {
                            id: "call_1".into(),
                            name: "get".into(),
                            arguments: r#"{"a":1}"#.into(),
                        },
                    ],
                },
                user_turn(vec![
                    Part::Text("and".into()),
                    Part::ToolResult {
                        call_id: "call_1".into(),
                        is_error: true,
                        content: vec![
                            Part::Text("bad".into()),
                            Part::Image(Image::Base64 {
                                media_type: "image/png".into(),
                                data: "iVBO".into(),
                            }),
                        ],
                    },
                ]),
                Message { role: Role::Assistant, parts: vec![Part::Text(String::new())] },
            ],
            tools: vec![Tool {
                name: "get".into(),
                description: Some("d".into()),
                parameters: core::RawJson::new(r#"{"type":"object"}"#.into()).unwrap(),
            }],
            tool_choice: Some(ToolChoice {
                mode: ToolMode::Tool("get".into()),
                parallel: Some(false),
            }),
            temperature: Some(1.7),
            top_p: Some(0.9),
            top_k: Some(3),
            stop: vec!["END".into()],
            user: Some("u".into()),
            stream: true,
            ..core::Request::default()
        };
        assert_eq!(
            body(&request_body(&request, "claude-x", 4096).unwrap()),
            json!({
                "model": "claude-x", "max_tokens": 4096, "system": "only",
                "messages": [
                    {"role": "user", "content": "hi"},
                    {"role": "assistant", "content": [
                        {"type": "thinking", "thinking": "signed", "signature": "sig"},
                        {"type": "tool_use", "id": "call_1", "name": "get", "input": {"a": 1}}]},
                    {"role": "user", "content": [
                        {"type": "tool_result", "tool_use_id": "call_1", "is_error": true, "content": [
                            {"type": "text", "text": "bad"},
                            {"type": "image", "source": {"type": "base64", "media_type": "image/png", "data": "iVBO"}}]},
                        {"type": "text", "text": "and"}]}
                ],
                "tools": [{"name": "get", "description": "d", "input_schema": {"type": "object"}}],
                "tool_choice": {"type": "tool", "name": "get", "disable_parallel_tool_use": true},
                "stop_sequences": ["END"], "temperature": 1.0, "top_p": 0.9, "top_k": 3,
                "metadata": {"user_id": "u"}, "stream": true
            })
        );
    }

    #[test]
    fn reasoning_becomes_a_thinking_budget_below_max_tokens() {
        let thinking = |reasoning: Reasoning, max_tokens: Option<u32>| {
            let request = core::Request {
                messages: vec![user_turn(vec![Part::Text("hi".into())])],
                reasoning: Some(reasoning),
                max_tokens,
                temperature: Some(0.5),
                top_k: Some(5),
                system: vec!["a".into(), "b".into()],
                ..core::Request::default()
            };
            body(&request_body(&request, "m", 4096).unwrap())
        };
        let b = thinking(Reasoning::Budget(31999), Some(64000));
        assert_eq!(b["thinking"], json!({"type": "enabled", "budget_tokens": 31999}));
        // Anthropic takes no temperature or top_k with thinking on.
        assert!(b.get("temperature").is_none() && b.get("top_k").is_none());
        assert_eq!(
            b["system"],
            json!([{"type": "text", "text": "a"}, {"type": "text", "text": "b"}])
        );
        assert_eq!(
            thinking(Reasoning::Effort(Effort::Medium), None)["thinking"]["budget_tokens"],
            4095
        );
        assert_eq!(
            thinking(Reasoning::Effort(Effort::Low), Some(10000))["thinking"]["budget_tokens"],
            2048
        );
        let b = thinking(Reasoning::Effort(Effort::High), Some(1024));
        assert!(b.get("thinking").is_none());
        assert_eq!(b["temperature"], 0.5);
    }

    #[test]
    fn a_tool_call_whose_arguments_are_not_an_object_is_refused() {
        let request = core::Request {
            messages: vec![
                user_turn(vec![Part::Text("hi".into())]),
                Message {
                    role: Role::Assistant,
                    parts: vec![
                        Part::Text("x".into()),
                        Part::ToolCall {
                            id: "c".into(),
                            name: "n".into(),
                            arguments: "[1]".into(),
                        },
                    ],
                },
            ],
            ..core::Request::default()
        };
        assert_eq!(
            request_body(&request, "m", 1).unwrap_err().field,
            "messages[1].parts[1].arguments"
        );
    }

    #[test]
    fn a_message_reads_into_a_response_with_cached_input_counted() {
        let message = json!({
            "id": "msg_1", "type": "message", "role": "assistant", "model": "claude-x",
            "content": [
                {"type": "thinking", "thinking": "hmm", "signature": "sig"},
                {"type": "redacted_thinking", "data": "zzz"},
                {"type": "text", "text": "Let me check."},
                {"type": "tool_use", "id": "toolu_1", "name": "get", "input": {"city": "Paris"}}
            ],
            "stop_reason": "tool_use", "stop_sequence": null,
            "usage": {"input_tokens": 10, "cache_creation_input_tokens": 5, "cache_read_input_tokens": 20, "output_tokens": 7}
        });
        assert_eq!(
            parse_response(message.to_string().as_bytes()).unwrap(),
            core::Response {
                id: "msg_1".into(),
                model: "claude-x".into(),
                parts: vec![
                    Part::Thinking { text: "hmm".into(), signature: Some("sig".into()) },
                    Part::Text("Let me check.".into()),
                    Part::ToolCall {
                        id: "toolu_1".into(),
                        name: "get".into(),
                        arguments: r#"{"city":"Paris"}"#.into()
                    },
                ],
                finish: Finish::ToolCalls,
                usage: Usage {
                    input_tokens: 35,
                    output_tokens: 7,
                    cache_read_tokens: Some(20),
                    cache_write_tokens: Some(5)
                },
            }
        );
        let stopped = json!({"id": "m", "content": [], "stop_reason": "stop_sequence", "stop_sequence": "END"});
        assert_eq!(
            parse_response(stopped.to_string().as_bytes()).unwrap().finish,
            Finish::StopSequence(Some("END".into()))
        );
        let error =
            br#"{"type":"error","error":{"type":"overloaded_error","message":"Overloaded"}}"#;
        let refusal = parse_response(error).unwrap_err();
        assert_eq!(refusal.field, "error");
        assert!(refusal.message.contains("overloaded_error"));
        assert_eq!(
            parse_error(error),
            Some(ApiError { kind: "overloaded_error".into(), message: "Overloaded".into() })
        );
        assert_eq!(parse_error(b"{}"), None);
        assert_eq!(
            parse_response(br#"{"content": [{"type": "text"}]}"#).unwrap_err().field,
            "content[0].text"
        );
    }

    #[test]
    fn stop_reasons_map_to_finishes() {
        assert_eq!(finish(Some("end_turn"), None), Finish::Stop);
        assert_eq!(finish(Some("pause_turn"), None), Finish::Stop);
        assert_eq!(finish(Some("max_tokens"), None), Finish::Length);
        assert_eq!(finish(Some("model_context_window_exceeded"), None), Finish::Length);
        assert_eq!(finish(Some("tool_use"), None), Finish::ToolCalls);
        assert_eq!(finish(Some("refusal"), None), Finish::Refusal);
        assert_eq!(finish(None, None), Finish::Stop);
    }

    #[test]
    fn an_event_stream_decodes_into_core_events() {
        let stream = [
            (
                "message_start",
                json!({"type": "message_start", "message": {"id": "msg_1", "type": "message", "role": "assistant",
                "content": [], "model": "claude-x", "stop_reason": null, "stop_sequence": null,
                "usage": {"input_tokens": 25, "cache_read_input_tokens": 5, "output_tokens": 1}}}),
            ),
            ("ping", json!({"type": "ping"})),
            (
                "content_block_start",
                json!({"type": "content_block_start", "index": 0, "content_block": {"type": "thinking", "thinking": ""}}),
            ),
            (
                "content_block_delta",
                json!({"type": "content_block_delta", "index": 0, "delta": {"type": "thinking_delta", "thinking": "hmm"}}),
            ),
            (
                "content_block_delta",
                json!({"type": "content_block_delta", "index": 0, "delta": {"type": "signature_delta", "signature": "sig"}}),
            ),
            ("content_block_stop", json!({"type": "content_block_stop", "index": 0})),
            (
                "content_block_start",
                json!({"type": "content_block_start", "index": 1, "content_block": {"type": "text", "text": ""}}),
            ),
            (
                "content_block_delta",
                json!({"type": "content_block_delta", "index": 1, "delta": {"type": "text_delta", "text": "Hi"}}),
            ),
            ("content_block_stop", json!({"type": "content_block_stop", "index": 1})),
            (
                "content_block_start",
                json!({"type": "content_block_start", "index": 2, "content_block": {"type": "tool_use", "id": "toolu_1", "name": "get", "input": {}}}),
            ),
            (
                "content_block_delta",
                json!({"type": "content_block_delta", "index": 2, "delta": {"type": "input_json_delta", "partial_json": ""}}),
            ),
            (
                "content_block_delta",
                json!({"type": "content_block_delta", "index": 2, "delta": {"type": "input_json_delta", "partial_json": "{\"a\":1}"}}),
            ),
            ("content_block_stop", json!({"type": "content_block_stop", "index": 2})),
            (
                "message_delta",
                json!({"type": "message_delta", "delta": {"stop_reason": "tool_use", "stop_sequence": null}, "usage": {"output_tokens": 30}}),
            ),
            ("message_stop", json!({"type": "message_stop"})),
            ("something_new", json!({"type": "something_new"})),
        ];
        let mut decoder = Decoder::new();
        let events: Vec<Event> = stream
            .iter()
            .flat_map(|(event, data)| decoder.decode(event, data.to_string().as_bytes()).unwrap())
            .collect();
        assert_eq!(
            events,
            vec![
                Event::Start { id: "msg_1".into(), model: "claude-x".into() },
                Event::ThinkingDelta { text: "hmm".into(), signature: None },
                Event::ThinkingDelta { text: String::new(), signature: Some("sig".into()) },
                Event::TextDelta("Hi".into()),
                Event::ToolCallStart { index: 0, id: "toolu_1".into(), name: "get".into() },
                Event::ToolCallDelta { index: 0, arguments: r#"{"a":1}"#.into() },
                Event::Finish(Finish::ToolCalls),
                Event::Usage(Usage {
                    input_tokens: 30,
                    output_tokens: 30,
                    cache_read_tokens: Some(5),
                    cache_write_tokens: None
                }),
            ]
        );
    }

    #[test]
    fn an_error_event_is_refused_and_bad_events_name_their_field() {
        let mut decoder = Decoder::new();
        let error =
            br#"{"type":"error","error":{"type":"overloaded_error","message":"Overloaded"}}"#;
        let refusal = decoder.decode("error", error).unwrap_err();
        assert_eq!(refusal.field, "error");
        assert!(
            refusal.message.contains("overloaded_error") && refusal.message.contains("Overloaded")
        );
        assert_eq!(decoder.decode("message_start", b"{}").unwrap_err().field, "message");
        assert_eq!(
            decoder
                .decode(
                    "content_block_delta",
                    br#"{"index": 0, "delta": {"type": "input_json_delta", "partial_json": "{"}}"#
                )
                .unwrap_err()
                .field,
            "index"
        );
        assert_eq!(
            decoder.decode("content_block_start", br#"{"index": "x"}"#).unwrap_err().field,
            "index"
        );
    }

    fn body(bytes: &[u8]) -> Value {
        serde_json::from_slice(bytes).unwrap()
    }

    #[test]
    fn a_response_becomes_a_message_with_anthropics_usage_and_stop_reason() {
        let response = core::Response {
            id: "chatcmpl-1".into(),
            model: "gpt-4o-2024".into(),
            parts: vec![
                Part::Thinking { text: "hmm".into(), signature: None },
                Part::Text("Let me look.".into()),
                Part::Text(String::new()),
                Part::ToolCall {
                    id: "call_1".into(),
                    name: "get".into(),
                    arguments: r#"{"a":1}"#.into(),
                },
                Part::ToolCall {
                    id: "call_2".into(),
                    name: "cut".into(),
                    arguments: r#"{"a":"#.into(),
                },
            ],
            finish: Finish::ToolCalls,
            usage: Usage {
                input_tokens: 100,
                output_tokens: 20,
                cache_read_tokens: Some(30),
                cache_write_tokens: None,
            },
        };
        assert_eq!(
            body(&response_body(&response, "gpt-4o")),
            json!({
                "id": "chatcmpl-1", "type": "message", "role": "assistant",
                "content": [
                    {"type": "thinking", "thinking": "hmm", "signature": ""},
                    {"type": "text", "text": "Let me look."},
                    {"type": "tool_use", "id": "call_1", "name": "get", "input": {"a": 1}},
                    {"type": "tool_use", "id": "call_2", "name": "cut", "input": {}}
                ],
                "model": "gpt-4o", "stop_reason": "tool_use", "stop_sequence": null,
                "usage": {"input_tokens": 70, "output_tokens": 20, "cache_read_input_tokens": 30}
            })
        );
        let stopped = core::Response {
            finish: Finish::StopSequence(Some("END".into())),
            parts: vec![],
            usage: Usage::default(),
            ..response
        };
        let b = body(&response_body(&stopped, "m"));
        assert_eq!(b["stop_reason"], "stop_sequence");
        assert_eq!(b["stop_sequence"], "END");
        assert_eq!(b["content"], json!([]));
        assert_eq!(b["usage"], json!({"input_tokens": 0, "output_tokens": 0}));
    }

    #[test]
    fn finishes_map_to_stop_reasons() {
        assert_eq!(stop_reason(&Finish::Stop), "end_turn");
        assert_eq!(stop_reason(&Finish::Length), "max_tokens");
        assert_eq!(stop_reason(&Finish::ToolCalls), "tool_use");
        assert_eq!(stop_reason(&Finish::StopSequence(None)), "stop_sequence");
        assert_eq!(stop_reason(&Finish::ContentFilter), "refusal");
        assert_eq!(stop_reason(&Finish::Refusal), "refusal");
    }

    #[test]
    fn error_types_follow_anthropics_status_mapping() {
        let cases = [
            (400, "invalid_request_error"),
            (401, "authentication_error"),
            (403, "permission_error"),
            (404, "not_found_error"),
            (413, "request_too_large"),
            (429, "rate_limit_error"),
            (500, "api_error"),
            (529, "overloaded_error"),
            (503, "api_error"),
            (422, "invalid_request_error"),
        ];
        for (status, kind) in cases {
            assert_eq!(error_type(status), kind, "{status}");
        }
        assert_eq!(
            body(&error_body(529, "Overloaded")),
            json!({"type": "error", "error": {"type": "overloaded_error", "message": "Overloaded"}})
        );
    }

    fn encode(events: Vec<Event>) -> Vec<(String, Value)> {
        let mut encoder = Encoder::new("served");
        let mut out = Vec::new();
        for event in events {
            encoder.push(event, &mut out);
        }
        encoder.finish(&mut out);
        // A second finish adds nothing.
        encoder.finish(&mut out);
        out.iter()
            .map(|f| {
                let text = String::from_utf8(f.to_bytes()).unwrap();
                assert!(
                    text.starts_with(&format!("event: {}\ndata: ", f.event))
                        && text.ends_with("\n\n")
                );
                (f.event.to_string(), body(&f.data))
            })
            .collect()
    }

    #[test]
    fn a_text_stream_is_anthropics_event_sequence_with_usage_held_until_finish() {
        let frames = encode(vec![
            Event::Start { id: "chatcmpl-1".into(), model: "gpt-4o".into() },
            Event::TextDelta("Hel".into()),
            Event::TextDelta(String::new()),
            Event::TextDelta("lo".into()),
            Event::Finish(Finish::Stop),
            Event::Usage(Usage { input_tokens: 12, output_tokens: 2, ..Usage::default() }),
        ]);
        let expected = vec![
            (
                "message_start",
                json!({"type": "message_start", "message": {
                "id": "chatcmpl-1", "type": "message", "role": "assistant", "content": [],
                "model": "served", "stop_reason": null, "stop_sequence": null,
                "usage": {"input_tokens": 0, "output_tokens": 0}}}),
            ),
            ("ping", json!({"type": "ping"})),
            (
                "content_block_start",
                json!({"type": "content_block_start", "index": 0, "content_block": {"type": "text", "text": ""}}),
            ),
            (
                "content_block_delta",
                json!({"type": "content_block_delta", "index": 0, "delta": {"type": "text_delta", "text": "Hel"}}),
            ),
            (
                "content_block_delta",
                json!({"type": "content_block_delta", "index": 0, "delta": {"type": "text_delta", "text": "lo"}}),
            ),
            ("content_block_stop", json!({"type": "content_block_stop", "index": 0})),
            (
                "message_delta",
                json!({"type": "message_delta", "delta": {"stop_reason": "end_turn", "stop_sequence": null},
                "usage": {"input_tokens": 12, "output_tokens": 2}}),
            ),
            ("message_stop", json!({"type": "message_stop"})),
        ];
        let expected: Vec<(String, Value)> =
            expected.into_iter().map(|(e, v)| (e.to_string(), v)).collect();
        assert_eq!(frames, expected);
    }

    #[test]
    fn thinking_and_tool_calls_stream_as_their_own_blocks() {
        let frames = encode(vec![
            Event::Start { id: "m1".into(), model: "x".into() },
            Event::ThinkingDelta { text: "think".into(), signature: None },
            Event::ThinkingDelta { text: String::new(), signature: Some("sig".into()) },
            Event::TextDelta("Sure.".into()),
            Event::ToolCallStart { index: 0, id: "call_1".into(), name: "get".into() },
            Event::ToolCallDelta { index: 0, arguments: "{\"a\":".into() },
            Event::ToolCallDelta { index: 0, arguments: "1}".into() },
            Event::ToolCallStart { index: 1, id: "call_2".into(), name: "put".into() },
            // A late delta for the first call names its (closed) block.
            Event::ToolCallDelta { index: 0, arguments: " ".into() },
            Event::Finish(Finish::ToolCalls),
        ]);
        let summary: Vec<String> = frames
            .iter()
            .map(|(event, data)| match event.as_str() {
                "content_block_start" => {
                    format!("start {} {}", data["index"], data["content_block"])
                }
                "content_block_delta" => format!("delta {} {}", data["index"], data["delta"]),
                "content_block_stop" => format!("stop {}", data["index"]),
                "message_delta" => format!("message_delta {}", data["delta"]["stop_reason"]),
                other => other.to_string(),
            })
            .collect();
        assert_eq!(
            summary,
            vec![
                "message_start",
                "ping",
                r#"start 0 {"signature":"","thinking":"","type":"thinking"}"#,
                r#"delta 0 {"thinking":"think","type":"thinking_delta"}"#,
                r#"delta 0 {"signature":"sig","type":"signature_delta"}"#,
                "stop 0",
                r#"start 1 {"text":"","type":"text"}"#,
                r#"delta 1 {"text":"Sure.","type":"text_delta"}"#,
                "stop 1",
                r#"start 2 {"id":"call_1","input":{},"name":"get","type":"tool_use"}"#,
                r#"delta 2 {"partial_json":"{\"a\":","type":"input_json_delta"}"#,
                r#"delta 2 {"partial_json":"1}","type":"input_json_delta"}"#,
                "stop 2",
                r#"start 3 {"id":"call_2","input":{},"name":"put","type":"tool_use"}"#,
                r#"delta 2 {"partial_json":" ","type":"input_json_delta"}"#,
                "stop 3",
                r#"message_delta "tool_use""#,
                "message_stop",
            ]
        );
    }

    #[test]
    fn a_stream_with_no_events_still_starts_and_ends() {
        let events: Vec<String> = encode(vec![]).into_iter().map(|(e, _)| e).collect();
        assert_eq!(events, vec!["message_start", "ping", "message_delta", "message_stop"]);
    }
}
