//! Anthropic's Messages API wire format (`POST /v1/messages`): the request fields the
//! simulator reads, the `message` body, the SSE event sequence, and error bodies.
//!
//! Shapes follow what api.anthropic.com sends:
//! - message bodies: the Messages API reference and the "Handling stop reasons" guide
//!   (`{"id": "msg_…", "type": "message", "role": "assistant", "model", "content": [...],
//!   "stop_reason", "stop_sequence": null, "usage": {"input_tokens", "output_tokens"}}`).
//! - streams: anthropic-sdk-python's recorded `tests/lib/streaming/fixtures/basic_response.txt`
//!   and `tool_use_response.txt`: `message_start` (usage with `output_tokens: 1`),
//!   `content_block_start`, a `ping`, `content_block_delta`s (`text_delta` or
//!   `input_json_delta`), `content_block_stop`, `message_delta` (stop reason, output tokens),
//!   `message_stop`; every frame has an `event:` line naming its type.
//! - errors: the API reference's "Errors" page: `{"type": "error", "error": {"type",
//!   "message"}, "request_id"}` with one type per status ([`status_error`]); the streaming
//!   docs' `event: error` frame with `overloaded_error` for a stream that fails.
//!
//! Tool use: when the request offers `tools` and its `tool_choice` is not `none`, and the
//! conversation does not already end in a tool result, the simulated model calls a tool —
//! the one `tool_choice` names, else the first — with an input filling each required
//! property with a placeholder of its type. That is enough for a gateway's tool-call
//! translation to be tested end to end, deterministically.

use std::borrow::Cow;

use bytes::Bytes;
use serde::Deserialize;
use serde_json::{Value, json};

use crate::openai::{ApiError, tokens};
use crate::stream::StreamWire;
use crate::tool::{ToolCall, placeholder_input};

// === Requests ===

/// The parts of a Messages request the simulator acts on.
#[derive(Debug, Clone, PartialEq)]
pub struct MessagesRequest {
    pub model: String,
    pub stream: bool,
    /// Words in `system` and every text block: the simulator's token count.
    pub prompt_tokens: u64,
    /// The tool the simulated model calls, if the request lets it call one.
    pub tool_call: Option<ToolCall>,
    /// The text of a last `assistant` message: the start of the answer the model is to
    /// continue (Anthropic's prefill).
    pub prefill: Option<String>,
}

#[derive(Deserialize)]
struct RawRequest<'a> {
    #[serde(borrow, default)]
    model: Option<Cow<'a, str>>,
    #[serde(default)]
    max_tokens: Option<Value>,
    #[serde(default)]
    messages: Option<Vec<RawMessage>>,
    #[serde(default)]
    system: Option<Value>,
    #[serde(default)]
    stream: Option<bool>,
    #[serde(default)]
    tools: Option<Vec<RawTool>>,
    #[serde(default)]
    tool_choice: Option<Value>,
}

#[derive(Deserialize)]
struct RawMessage {
    #[serde(default)]
    role: Option<String>,
    #[serde(default)]
    content: Option<Value>,
}

#[derive(Deserialize)]
struct RawTool {
    name: String,
    #[serde(default)]
    input_schema: Option<Value>,
}

/// The input tokens of a `count_tokens` body (a Messages body without `max_tokens`), counted
/// as [`parse_request`] counts them.
pub fn count_tokens(body: &[u8]) -> Result<u64, ApiError> {
    let raw: RawRequest<'_> = serde_json::from_slice(body)
        .map_err(|_| invalid("There was an issue with the format or content of your request."))?;
    if raw.model.is_none() {
        return Err(invalid("model: Field required"));
    }
    let Some(messages) = raw.messages else { return Err(invalid("messages: Field required")) };
    Ok(raw.system.as_ref().map_or(0, words)
        + messages.iter().filter_map(|m| m.content.as_ref()).map(words).sum::<u64>())
}

/// Parses a Messages body, rejecting it the way Anthropic does (400
/// `invalid_request_error` naming the field, as in the API reference's example errors).
pub fn parse_request(body: &[u8]) -> Result<MessagesRequest, ApiError> {
    let raw: RawRequest<'_> = serde_json::from_slice(body)
        .map_err(|_| invalid("There was an issue with the format or content of your request."))?;
    let Some(model) = raw.model else { return Err(invalid("model: Field required")) };
    if !raw.max_tokens.as_ref().is_some_and(Value::is_u64) {
        return Err(invalid("max_tokens: Field required"));
    }
    let Some(messages) = raw.messages else { return Err(invalid("messages: Field required")) };
    if messages.is_empty() {
        return Err(invalid("messages: at least one message is required"));
    }
    let prompt_tokens = raw.system.as_ref().map_or(0, words)
        + messages.iter().filter_map(|m| m.content.as_ref()).map(words).sum::<u64>();
    let ends_in_tool_result = messages.last().and_then(|m| m.content.as_ref()).is_some_and(|c| {
        c.as_array().is_some_and(|blocks| blocks.iter().any(|b| b["type"] == "tool_result"))
    });
    let choice = raw.tool_choice.as_ref().and_then(|c| c.get("type")).and_then(Value::as_str);
    let tool_call = match (raw.tools, choice) {
        (_, Some("none")) => None,
        _ if ends_in_tool_result => None,
        (Some(tools), _) => {
            let named =
                raw.tool_choice.as_ref().and_then(|c| c.get("name")).and_then(Value::as_str);
            let tool = match named {
                Some(name) => tools.iter().find(|t| t.name == name),
                None => tools.first(),
            };
            tool.map(|t| ToolCall {
                name: t.name.clone(),
                input: placeholder_input(t.input_schema.as_ref()),
            })
        }
        (None, _) => None,
    };
    let prefill = messages
        .last()
        .filter(|m| m.role.as_deref() == Some("assistant"))
        .map(|m| m.content.as_ref().map(text_of).unwrap_or_default());
    Ok(MessagesRequest {
        model: model.into_owned(),
        stream: raw.stream.unwrap_or(false),
        prompt_tokens,
        tool_call,
        prefill,
    })
}

fn invalid(message: &'static str) -> ApiError {
    ApiError::new(400, message, "invalid_request_error")
}

/// The text of a string or of the `text` content blocks.
fn text_of(content: &Value) -> String {
    match content {
        Value::String(s) => s.clone(),
        Value::Array(blocks) => {
            blocks.iter().filter_map(|b| b.get("text").and_then(Value::as_str)).collect()
        }
        _ => String::new(),
    }
}

/// Words in a string or in the `text` of content blocks.
fn words(content: &Value) -> u64 {
    match content {
        Value::String(s) => tokens(s),
        Value::Array(blocks) => {
            blocks.iter().filter_map(|b| b.get("text").and_then(Value::as_str)).map(tokens).sum()
        }
        _ => 0,
    }
}

// === Responses ===

/// Identity shared by a message and all events of one stream.
#[derive(Debug, Clone)]
pub struct Message {
    pub id: String,
    pub model: String,
    pub prompt_tokens: u64,
}

/// `msg_` plus the simulator's unique suffix (Anthropic's ids look like `msg_01…`).
pub fn message_id(completion_id: &str) -> String {
    format!("msg_01{}", completion_id.trim_start_matches("chatcmpl-"))
}

fn tool_use_id(message_id: &str) -> String {
    format!("toolu_01{}", message_id.trim_start_matches("msg_01"))
}

impl Message {
    /// The non-streaming `message` body: text, or the tool call when there is one.
    pub fn body(&self, text: &str, tool_call: Option<&ToolCall>) -> Bytes {
        let (content, stop_reason, output) = match tool_call {
            Some(call) => (
                json!([{"type": "tool_use", "id": tool_use_id(&self.id), "name": call.name, "input": call.input}]),
                "tool_use",
                tokens(&call.input.to_string()),
            ),
            None => (json!([{"type": "text", "text": text}]), "end_turn", tokens(text)),
        };
        json_bytes(&json!({
            "id": self.id,
            "type": "message",
            "role": "assistant",
            "model": self.model,
            "content": content,
            "stop_reason": stop_reason,
            "stop_sequence": null,
            "usage": self.usage(output),
        }))
    }

    fn usage(&self, output_tokens: u64) -> Value {
        json!({
            "input_tokens": self.prompt_tokens,
            "cache_creation_input_tokens": 0,
            "cache_read_input_tokens": 0,
            "output_tokens": output_tokens,
        })
    }

    /// The stream framing for a text answer or a tool call: the stream task's pieces are the
    /// text, or the tool input's JSON cut into `input_json_delta`s.
    pub fn stream(self, tool_call: Option<&ToolCall>) -> MessageStream {
        MessageStream { message: self, tool: tool_call.cloned() }
    }
}

/// Anthropic's SSE sequence around the pieces the shared stream task sends.
pub struct MessageStream {
    message: Message,
    tool: Option<ToolCall>,
}

impl MessageStream {
    /// What the stream's pieces spell: the text, or the tool input as JSON.
    pub fn text(&self, text: String) -> String {
        match &self.tool {
            Some(call) => call.input.to_string(),
            None => text,
        }
    }
}

impl StreamWire for MessageStream {
    fn head(&self) -> Vec<Bytes> {
        let start = json!({"type": "message_start", "message": {
            "id": self.message.id, "type": "message", "role": "assistant",
            "model": self.message.model, "content": [], "stop_reason": null,
            "stop_sequence": null, "usage": self.message.usage(1)}});
        let block = match &self.tool {
            Some(call) => {
                json!({"type": "tool_use", "id": tool_use_id(&self.message.id), "name": call.name, "input": {}})
            }
            None => json!({"type": "text", "text": ""}),
        };
        vec![
            event("message_start", &start),
            event(
                "content_block_start",
                &json!({"type": "content_block_start", "index": 0, "content_block": block}),
            ),
            event("ping", &json!({"type": "ping"})),
        ]
    }

    fn content(&self, piece: &str) -> Bytes {
        let delta = match &self.tool {
            Some(_) => json!({"type": "input_json_delta", "partial_json": piece}),
            None => json!({"type": "text_delta", "text": piece}),
        };
        event(
            "content_block_delta",
            &json!({"type": "content_block_delta", "index": 0, "delta": delta}),
        )
    }

    fn error(&self, message: &str) -> Bytes {
        error_frame(message)
    }

    fn bad_frame(&self) -> Bytes {
        Bytes::from_static(MALFORMED_FRAME)
    }

    fn tail(&self, text: &str, marker: bool) -> Vec<Bytes> {
        let stop_reason = if self.tool.is_some() { "tool_use" } else { "end_turn" };
        let mut frames = vec![
            event("content_block_stop", &json!({"type": "content_block_stop", "index": 0})),
            event(
                "message_delta",
                &json!({"type": "message_delta",
                        "delta": {"stop_reason": stop_reason, "stop_sequence": null},
                        "usage": {"output_tokens": tokens(text)}}),
            ),
        ];
        if marker {
            frames.push(event("message_stop", &json!({"type": "message_stop"})));
        }
        frames
    }
}

/// The in-band error frame of a stream that fails after it started (Anthropic's streaming
/// docs, "Error events": `event: error` with an `overloaded_error`).
pub fn error_frame(message: &str) -> Bytes {
    event(
        "error",
        &json!({"type": "error", "error": {"type": "overloaded_error", "message": message}}),
    )
}

/// A stream frame whose data is not JSON.
pub const MALFORMED_FRAME: &[u8] =
    b"event: content_block_delta\ndata: {\"type\": \"content_block_delta\", \"index\": 0, \"delta\": \n\n";

// === Errors ===

/// The error body Anthropic sends for `status` (API reference, "Errors": 400
/// invalid_request_error, 401 authentication_error, 403 permission_error, 404
/// not_found_error, 413 request_too_large, 429 rate_limit_error, 500 api_error, 529
/// overloaded_error; other 4xx are invalid_request_error, other 5xx api_error). Messages are
/// the ones api.anthropic.com sends (401 "invalid x-api-key", 529 "Overloaded").
pub fn status_error(
    status: u16,
    model: &str,
    message: Option<&str>,
    retry_after: Option<u64>,
) -> ApiError {
    let (kind, text): (&'static str, Cow<'static, str>) = match status {
        400 => ("invalid_request_error", "There was an issue with the format or content of your request.".into()),
        401 => ("authentication_error", "invalid x-api-key".into()),
        403 => ("permission_error", "Your API key does not have permission to use the specified resource.".into()),
        404 => ("not_found_error", format!("model: {model}").into()),
        413 => ("request_too_large", "Request exceeds the maximum allowed number of bytes.".into()),
        429 => (
            "rate_limit_error",
            "This request would exceed the rate limit for your organization of 50 requests per minute. For details, refer to: https://docs.claude.com/en/api/rate-limits.".into(),
        ),
        529 => ("overloaded_error", "Overloaded".into()),
        s if s >= 500 => ("api_error", "Internal server error".into()),
        _ => ("invalid_request_error", "There was an issue with the format or content of your request.".into()),
    };
    let mut err = ApiError::new(status, text, kind);
    if let Some(message) = message {
        err.message = Cow::Owned(message.to_owned());
    }
    err.retry_after = match status {
        429 => Some(retry_after.unwrap_or(1)),
        _ => retry_after,
    };
    err
}

/// A prompt longer than the model's context: Anthropic's 400 `invalid_request_error`
/// "prompt is too long: N tokens > M maximum", as api.anthropic.com words it.
pub fn context_length(window: u64, prompt_tokens: u64) -> ApiError {
    ApiError::new(
        400,
        format!("prompt is too long: {prompt_tokens} tokens > {window} maximum"),
        "invalid_request_error",
    )
}

/// A model that takes no prefill: Anthropic's 400 for a conversation that ends with an
/// assistant turn, as api.anthropic.com words it for the models without prefill support.
pub fn prefill_unsupported() -> ApiError {
    ApiError::new(
        400,
        "This model does not support assistant message prefill. The conversation must end \
         with a user message.",
        "invalid_request_error",
    )
}

/// A request without a key Anthropic accepts (`x-api-key` missing or wrong).
pub fn auth_error(present: bool) -> ApiError {
    let message = if present { "invalid x-api-key" } else { "x-api-key header is required" };
    ApiError::new(401, message, "authentication_error")
}

/// A path Anthropic does not serve.
pub fn not_found(method: &str, path: &str) -> ApiError {
    ApiError::new(404, format!("Not found: {method} {path}"), "not_found_error")
}

/// Anthropic's error envelope for `err`, with the request id in the body as Anthropic does.
pub fn error_body(err: &ApiError, request_id: &str) -> Bytes {
    json_bytes(&json!({
        "type": "error",
        "error": {"type": err.kind, "message": err.message},
        "request_id": request_id,
    }))
}

// === Encoding ===

fn json_bytes(value: &Value) -> Bytes {
    // Serialising a Value into a Vec cannot fail; an empty body would show it.
    Bytes::from(serde_json::to_vec(value).unwrap_or_default())
}

fn event(name: &str, data: &Value) -> Bytes {
    let mut out = Vec::with_capacity(256);
    out.extend_from_slice(b"event: ");
    out.extend_from_slice(name.as_bytes());
    out.extend_from_slice(b"\ndata: ");
    let _ = serde_json::to_writer(&mut out, data);
    out.extend_from_slice(b"\n\n");
    Bytes::from(out)
}

#[cfg(test)]
mod tests {
    use super::*;

    fn data(frame: &Bytes) -> (String, Value) {
        let text = std::str::from_utf8(frame).unwrap();
        let (head, rest) = text.split_once('\n').unwrap();
        let data = rest.strip_prefix("data: ").unwrap().trim_end();
        (head.trim_start_matches("event: ").to_owned(), serde_json::from_str(data).unwrap())
    }

    fn message() -> Message {
        Message { id: "msg_01abc".into(), model: "claude-sim".into(), prompt_tokens: 3 }
    }

    #[test]
    fn parses_requests_and_rejects_them_as_anthropic_does() {
        let r = parse_request(
            br#"{"model":"claude-sim","max_tokens":100,"system":"be brief","messages":[{"role":"user","content":"one two"}],"stream":true}"#,
        )
        .unwrap();
        assert_eq!(
            (r.model.as_str(), r.stream, r.prompt_tokens, r.tool_call),
            ("claude-sim", true, 4, None)
        );
        let e = parse_request(br#"{"model":"m","messages":[{"role":"user","content":"x"}]}"#)
            .unwrap_err();
        assert_eq!((e.status, e.message.as_ref()), (400, "max_tokens: Field required"));
        assert_eq!(parse_request(b"{nope").unwrap_err().status, 400);
    }

    #[test]
    fn a_request_with_tools_gets_a_tool_call_until_the_tool_result_comes_back() {
        let tools = r#"[{"name":"get_weather","input_schema":{"type":"object","properties":{"location":{"type":"string"},"days":{"type":"integer"}},"required":["location","days"]}}]"#;
        let body = format!(
            r#"{{"model":"m","max_tokens":9,"tools":{tools},"messages":[{{"role":"user","content":"weather?"}}]}}"#
        );
        let call = parse_request(body.as_bytes()).unwrap().tool_call.unwrap();
        assert_eq!(
            call,
            ToolCall { name: "get_weather".into(), input: json!({"location": "sim", "days": 1}) }
        );
        let done = format!(
            r#"{{"model":"m","max_tokens":9,"tools":{tools},"messages":[{{"role":"user","content":[{{"type":"tool_result","tool_use_id":"t","content":"sunny"}}]}}]}}"#
        );
        assert_eq!(parse_request(done.as_bytes()).unwrap().tool_call, None);
        let none = format!(
            r#"{{"model":"m","max_tokens":9,"tools":{tools},"tool_choice":{{"type":"none"}},"messages":[{{"role":"user","content":"x"}}]}}"#
        );
        assert_eq!(parse_request(none.as_bytes()).unwrap().tool_call, None);
    }

    #[test]
    fn bodies_have_anthropics_shape() {
        let v: Value = serde_json::from_slice(&message().body("two words", None)).unwrap();
        assert_eq!(v["type"], "message");
        assert_eq!(v["content"], json!([{"type": "text", "text": "two words"}]));
        assert_eq!(v["stop_reason"], "end_turn");
        assert_eq!(v["usage"]["input_tokens"], 3);
        assert_eq!(v["usage"]["output_tokens"], 2);
        let call = ToolCall { name: "f".into(), input: json!({"a": "sim"}) };
        let v: Value = serde_json::from_slice(&message().body("", Some(&call))).unwrap();
        assert_eq!(v["content"][0]["type"], "tool_use");
        assert_eq!(v["content"][0]["input"], json!({"a": "sim"}));
        assert_eq!(v["stop_reason"], "tool_use");
    }

    #[test]
    fn streams_frame_every_event_with_its_name() {
        let wire = message().stream(None);
        let head: Vec<_> = wire.head().iter().map(data).collect();
        assert_eq!(head[0].0, "message_start");
        assert_eq!(head[0].1["message"]["usage"]["input_tokens"], 3);
        assert_eq!(head[1].1["content_block"], json!({"type": "text", "text": ""}));
        assert_eq!(head[2].0, "ping");
        assert_eq!(
            data(&wire.content("Hi")).1["delta"],
            json!({"type": "text_delta", "text": "Hi"})
        );
        let tail: Vec<_> = wire.tail("a b", true).iter().map(data).collect();
        let names: Vec<_> = tail.iter().map(|(n, _)| n.as_str()).collect();
        assert_eq!(names, ["content_block_stop", "message_delta", "message_stop"]);
        assert_eq!(tail[1].1["usage"]["output_tokens"], 2);
        let (name, err) = data(&error_frame("Overloaded"));
        assert_eq!((name.as_str(), &err["error"]["type"]), ("error", &json!("overloaded_error")));
    }

    #[test]
    fn error_bodies_match_anthropic() {
        for (status, kind) in [
            (400, "invalid_request_error"),
            (401, "authentication_error"),
            (403, "permission_error"),
            (404, "not_found_error"),
            (413, "request_too_large"),
            (429, "rate_limit_error"),
            (500, "api_error"),
            (503, "api_error"),
            (529, "overloaded_error"),
        ] {
            let e = status_error(status, "claude-sim", None, None);
            let v: Value = serde_json::from_slice(&error_body(&e, "req_1")).unwrap();
            assert_eq!(v["type"], "error");
            assert_eq!(v["error"]["type"], kind, "{status}");
            assert_eq!(v["request_id"], "req_1");
        }
        assert_eq!(status_error(529, "m", None, None).message, "Overloaded");
        assert_eq!(status_error(429, "m", None, None).retry_after, Some(1));
    }
}
