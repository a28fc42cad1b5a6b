//! OpenAI's Chat Completions (`POST /v1/chat/completions`): requests, completions and
//! stream chunks, to and from the [core](crate::core) form.
//!
//! Refusals name fields as a Chat client wrote them
//! (`messages[1].tool_calls[0].function.arguments`, `choices[0].message`).

use serde::{Deserialize, Serialize};
use serde_json::value::RawValue;

use crate::Refusal;
use crate::core::{self, Event, Finish, Image, Part, Role, ToolMode, Usage};
use crate::de;

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
    stream: bool,
    #[serde(skip_serializing_if = "Option::is_none")]
    stream_options: Option<StreamOptions>,
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
    parameters: Box<RawValue>,
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
                    _ => None,
                })
                .collect(),
        )),
    }
}

/// Hints the Chat body drops, besides those the request already carries: a `top_k` (Chat
/// has no such sampling parameter), reasoning where the model takes none.
pub const HINT_TOP_K: &str = "top_k";
pub const HINT_THINKING: &str = "thinking";

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
///   (hint `thinking`).
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
                        Part::Text(_) | Part::Image(_) => rest.push(part),
                        Part::ToolCall { .. } | Part::Thinking { .. } => {}
                    }
                }
                result_images.extend(rest);
                if let Some(content) = content(&result_images) {
                    messages.push(OutMessage::new("user", Some(content)));
                }
            }
            Role::Assistant => {
                let text: String = message
                    .parts
                    .iter()
                    .filter_map(|p| match p {
                        Part::Text(t) => Some(t.as_str()),
                        _ => None,
                    })
                    .collect();
                let tool_calls: Vec<OutToolCall> = message
                    .parts
                    .iter()
                    .filter_map(|p| match p {
                        Part::ToolCall { id, name, arguments } => Some(OutToolCall {
                            id,
                            kind: "function",
                            function: OutFunctionCall { name, arguments },
                        }),
                        _ => None,
                    })
                    .collect();
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
                parameters: de::object(&tool.parameters),
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
        user: request.user.as_deref(),
        reasoning_effort,
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

    /// The events of one chunk (an SSE `data:` payload other than `[DONE]`).
    pub fn decode(&mut self, data: &[u8]) -> Result<Vec<Event>, Refusal> {
        let chunk: WireChunk = de::read(data)?;
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
            parameters: r#"{"type":"object"}"#.into(),
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
}
