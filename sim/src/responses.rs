//! OpenAI's Responses API wire format (`POST /v1/responses`, Azure OpenAI's
//! `POST /openai/v1/responses`): the request fields the simulator reads, the `response`
//! object, the SSE event sequence. Errors are OpenAI's (`crate::openai::ApiError`).
//!
//! Shapes follow the Responses API reference: a `response` object (`{"id": "resp_…",
//! "object": "response", "created_at", "status", "model", "output": [{"type": "message",
//! "role": "assistant", "content": [{"type": "output_text", "text", "annotations"}]}],
//! "usage": {"input_tokens", "output_tokens", "total_tokens"}, "error": null}`); a stream of
//! events each named by an `event:` line and its `type`, with a `sequence_number` from 0:
//! `response.created`, `response.in_progress`, `response.output_item.added`,
//! `response.content_part.added`, `response.output_text.delta`s, `response.output_text.done`,
//! `response.content_part.done`, `response.output_item.done`, `response.completed`; an
//! `error` event for a stream that fails after it started. The simulated model answers text
//! (its built-in and function tools are only read, never called).

use std::borrow::Cow;
use std::sync::atomic::{AtomicU64, Ordering};

use bytes::Bytes;
use serde::{Deserialize, Serialize};
use serde_json::value::RawValue;

use crate::openai::{ApiError, tokens};
use crate::stream::StreamWire;

// === Requests ===

/// The parts of a Responses request the simulator acts on.
#[derive(Debug, Clone, PartialEq)]
pub struct ResponsesRequest {
    pub model: String,
    pub stream: bool,
    /// Words in `instructions` and every text of `input`: the simulator's token count.
    pub prompt_tokens: u64,
}

#[derive(Deserialize)]
struct RawRequest<'a> {
    #[serde(borrow, default)]
    model: Option<Cow<'a, str>>,
    #[serde(borrow, default)]
    input: Option<&'a RawValue>,
    #[serde(borrow, default)]
    instructions: Option<Cow<'a, str>>,
    #[serde(default)]
    stream: Option<bool>,
}

/// One `input` item: its `content`, a string or parts with `text`.
#[derive(Deserialize)]
struct RawItem<'a> {
    #[serde(borrow, default)]
    content: Option<RawContent<'a>>,
}

#[derive(Deserialize)]
#[serde(untagged)]
enum RawContent<'a> {
    Text(#[serde(borrow)] Cow<'a, str>),
    Parts(#[serde(borrow)] Vec<RawPart<'a>>),
}

#[derive(Deserialize)]
struct RawPart<'a> {
    #[serde(borrow, default)]
    text: Option<Cow<'a, str>>,
}

/// Parses a Responses body, rejecting it the way OpenAI does.
pub fn parse_request(body: &[u8]) -> Result<ResponsesRequest, ApiError> {
    let raw: RawRequest<'_> = serde_json::from_slice(body).map_err(|_| ApiError::invalid_json())?;
    let Some(model) = raw.model else {
        return Err(ApiError::new(
            400,
            "Missing required parameter: 'model'.",
            "invalid_request_error",
        )
        .param("model")
        .code("missing_required_parameter"));
    };
    let Some(input) = raw.input else {
        return Err(ApiError::new(
            400,
            "Missing required parameter: 'input'.",
            "invalid_request_error",
        )
        .param("input")
        .code("missing_required_parameter"));
    };
    let input_tokens = match serde_json::from_str::<Cow<'_, str>>(input.get()) {
        Ok(text) => tokens(&text),
        Err(_) => {
            let items: Vec<RawItem<'_>> = serde_json::from_str(input.get()).map_err(|_| {
                ApiError::new(400, "Invalid type for 'input'.", "invalid_request_error")
                    .param("input")
                    .code("invalid_type")
            })?;
            items
                .iter()
                .map(|item| match &item.content {
                    Some(RawContent::Text(t)) => tokens(t),
                    Some(RawContent::Parts(parts)) => {
                        parts.iter().filter_map(|p| p.text.as_deref()).map(tokens).sum()
                    }
                    None => 0,
                })
                .sum()
        }
    };
    Ok(ResponsesRequest {
        model: model.into_owned(),
        stream: raw.stream.unwrap_or(false),
        prompt_tokens: input_tokens + raw.instructions.as_deref().map_or(0, tokens),
    })
}

// === Responses ===

/// `resp_` plus the simulator's unique suffix.
pub fn response_id(completion_id: &str) -> String {
    format!("resp_{}", completion_id.trim_start_matches("chatcmpl-"))
}

/// Identity shared by a response and all events of its stream.
#[derive(Debug, Clone)]
pub struct Response {
    pub id: String,
    pub created: u64,
    pub model: String,
    pub prompt_tokens: u64,
}

#[derive(Serialize)]
struct OutResponse<'a> {
    id: &'a str,
    object: &'static str,
    created_at: u64,
    status: &'static str,
    model: &'a str,
    output: Vec<OutItem<'a>>,
    usage: Option<OutUsage>,
    error: Option<()>,
}

#[derive(Serialize)]
struct OutItem<'a> {
    #[serde(rename = "type")]
    kind: &'static str,
    id: &'a str,
    status: &'static str,
    role: &'static str,
    content: Vec<OutText<'a>>,
}

#[derive(Serialize)]
struct OutText<'a> {
    #[serde(rename = "type")]
    kind: &'static str,
    text: &'a str,
    annotations: [(); 0],
}

impl<'a> OutText<'a> {
    fn new(text: &'a str) -> Self {
        Self { kind: "output_text", text, annotations: [] }
    }
}

#[derive(Serialize)]
struct OutUsage {
    input_tokens: u64,
    output_tokens: u64,
    total_tokens: u64,
}

impl Response {
    fn item_id(&self) -> String {
        format!("msg_{}", self.id.trim_start_matches("resp_"))
    }

    fn object<'a>(&'a self, item: &'a str, text: Option<&'a str>) -> OutResponse<'a> {
        let output = text.map(|text| OutItem {
            kind: "message",
            id: item,
            status: "completed",
            role: "assistant",
            content: vec![OutText::new(text)],
        });
        let usage = text.map(|text| OutUsage {
            input_tokens: self.prompt_tokens,
            output_tokens: tokens(text),
            total_tokens: self.prompt_tokens + tokens(text),
        });
        OutResponse {
            id: &self.id,
            object: "response",
            created_at: self.created,
            status: if text.is_some() { "completed" } else { "in_progress" },
            model: &self.model,
            output: output.into_iter().collect(),
            usage,
            error: None,
        }
    }

    /// The non-streaming `response` body.
    pub fn body(&self, text: &str) -> Bytes {
        let item = self.item_id();
        json_bytes(&self.object(&item, Some(text)))
    }

    /// The stream framing for a text answer.
    pub fn stream(self) -> ResponseStream {
        ResponseStream { item: self.item_id(), response: self, sequence: AtomicU64::new(0) }
    }
}

/// The Responses event sequence around the pieces the shared stream task sends.
pub struct ResponseStream {
    response: Response,
    item: String,
    /// The next event's `sequence_number`.
    sequence: AtomicU64,
}

#[derive(Serialize)]
struct Event<'a, T: Serialize> {
    #[serde(rename = "type")]
    kind: &'a str,
    sequence_number: u64,
    #[serde(flatten)]
    fields: T,
}

#[derive(Serialize)]
struct WithResponse<'a> {
    response: OutResponse<'a>,
}

#[derive(Serialize)]
struct WithItem<'a> {
    output_index: u32,
    item: OutItem<'a>,
}

#[derive(Serialize)]
struct WithPart<'a> {
    item_id: &'a str,
    output_index: u32,
    content_index: u32,
    part: OutText<'a>,
}

#[derive(Serialize)]
struct WithDelta<'a> {
    item_id: &'a str,
    output_index: u32,
    content_index: u32,
    delta: &'a str,
    logprobs: [(); 0],
}

#[derive(Serialize)]
struct WithText<'a> {
    item_id: &'a str,
    output_index: u32,
    content_index: u32,
    text: &'a str,
    logprobs: [(); 0],
}

#[derive(Serialize)]
struct WithError<'a> {
    code: &'static str,
    message: &'a str,
    param: Option<()>,
}

impl ResponseStream {
    fn event<T: Serialize>(&self, kind: &str, fields: T) -> Bytes {
        let sequence_number = self.sequence.fetch_add(1, Ordering::Relaxed);
        event(kind, &Event { kind, sequence_number, fields })
    }

    fn item<'a>(&'a self, status: &'static str, text: Option<&'a str>) -> WithItem<'a> {
        WithItem {
            output_index: 0,
            item: OutItem {
                kind: "message",
                id: &self.item,
                status,
                role: "assistant",
                content: text.map(OutText::new).into_iter().collect(),
            },
        }
    }

    fn part<'a>(&'a self, text: &'a str) -> WithPart<'a> {
        WithPart {
            item_id: &self.item,
            output_index: 0,
            content_index: 0,
            part: OutText::new(text),
        }
    }
}

impl StreamWire for ResponseStream {
    fn head(&self) -> Vec<Bytes> {
        let started = || WithResponse { response: self.response.object(&self.item, None) };
        vec![
            self.event("response.created", started()),
            self.event("response.in_progress", started()),
            self.event("response.output_item.added", self.item("in_progress", None)),
            self.event("response.content_part.added", self.part("")),
        ]
    }

    fn content(&self, piece: &str) -> Bytes {
        let delta = WithDelta {
            item_id: &self.item,
            output_index: 0,
            content_index: 0,
            delta: piece,
            logprobs: [],
        };
        self.event("response.output_text.delta", delta)
    }

    fn error(&self, message: &str) -> Bytes {
        self.event("error", WithError { code: "server_error", message, param: None })
    }

    fn bad_frame(&self) -> Bytes {
        Bytes::from_static(MALFORMED_FRAME)
    }

    fn tail(&self, text: &str, marker: bool) -> Vec<Bytes> {
        let done =
            WithText { item_id: &self.item, output_index: 0, content_index: 0, text, logprobs: [] };
        let mut frames = vec![
            self.event("response.output_text.done", done),
            self.event("response.content_part.done", self.part(text)),
            self.event("response.output_item.done", self.item("completed", Some(text))),
        ];
        if marker {
            let completed = WithResponse { response: self.response.object(&self.item, Some(text)) };
            frames.push(self.event("response.completed", completed));
        }
        frames
    }
}

/// A stream event whose data is not JSON.
pub const MALFORMED_FRAME: &[u8] =
    b"event: response.output_text.delta\ndata: {\"type\": \"response.output_text.delta\", \"delta\": \n\n";

// === Encoding ===

fn json_bytes<T: Serialize>(value: &T) -> Bytes {
    // Serialising these structs into a Vec cannot fail; an empty body would show it.
    Bytes::from(serde_json::to_vec(value).unwrap_or_default())
}

fn event<T: Serialize>(name: &str, data: &T) -> Bytes {
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
    use serde_json::Value;

    use super::*;

    fn response() -> Response {
        Response { id: "resp_1".into(), created: 1, model: "gpt-sim".into(), prompt_tokens: 3 }
    }

    #[test]
    fn parses_requests_and_rejects_them_as_openai_does() {
        let r = parse_request(
            br#"{"model":"m","instructions":"be brief","input":[{"role":"user","content":[{"type":"input_text","text":"hi there"}]},{"type":"reasoning","encrypted_content":"x"}],"tools":[{"type":"web_search"}],"stream":true}"#,
        )
        .unwrap();
        assert_eq!((r.model.as_str(), r.stream, r.prompt_tokens), ("m", true, 4));
        assert_eq!(parse_request(br#"{"model":"m","input":"a b c"}"#).unwrap().prompt_tokens, 3);
        assert_eq!(parse_request(br#"{"input":"x"}"#).unwrap_err().status, 400);
        assert_eq!(parse_request(br#"{"model":"m"}"#).unwrap_err().status, 400);
    }

    #[test]
    fn bodies_have_the_response_shape() {
        let body: Value = serde_json::from_slice(&response().body("Hi there")).unwrap();
        assert_eq!(body["object"], "response");
        assert_eq!(body["status"], "completed");
        assert_eq!(body["output"][0]["content"][0]["text"], "Hi there");
        assert_eq!(body["usage"]["output_tokens"], 2);
    }

    #[test]
    fn streams_name_every_event_and_count_them() {
        let wire = response().stream();
        let mut frames = wire.head();
        frames.push(wire.content("Hi"));
        frames.extend(wire.tail("Hi", true));
        let events: Vec<(String, Value)> = frames
            .iter()
            .map(|f| {
                let text = std::str::from_utf8(f).unwrap();
                let (event, data) = text.trim_end().split_once('\n').unwrap();
                let name = event.strip_prefix("event: ").unwrap().to_owned();
                (name, serde_json::from_str(data.strip_prefix("data: ").unwrap()).unwrap())
            })
            .collect();
        for (i, (name, data)) in events.iter().enumerate() {
            assert_eq!(data["type"], name.as_str());
            assert_eq!(data["sequence_number"], i as u64);
        }
        let names: Vec<&str> = events.iter().map(|(n, _)| n.as_str()).collect();
        assert_eq!(names[0], "response.created");
        assert_eq!(names[4], "response.output_text.delta");
        assert_eq!(names.last(), Some(&"response.completed"));
        assert_eq!(events.last().unwrap().1["response"]["usage"]["input_tokens"], 3);
    }
}
