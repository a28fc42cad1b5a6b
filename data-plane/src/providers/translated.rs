//! What the adapters that translate through the wire core (Anthropic, Gemini) share: the
//! Chat fields the core leaves to them, refusals as call errors, and the core's answers and
//! stream events in the unified shape the pipeline reads.
//!
//! The request itself is read into the core once per request ([`ChatRequest::core`]); the
//! format rules live in `switchyard_wire`, the gateway's policy (defaults from the catalog,
//! what a provider refuses) in each adapter.

use std::borrow::Cow;
use std::collections::BTreeMap;

use serde::Deserialize;
use serde_json::value::RawValue;
use switchyard_wire::core::{self, Event};
use switchyard_wire::{Refusal, chat};

use super::error::CallError;
use super::unified::{Completion, Fields, StreamEvent, Usage};
use crate::request::ChatRequest;

/// A refusal of the request, naming the field (`CallError::Unsupported`: the client's 400,
/// before any upstream call).
pub fn unsupported(refusal: &Refusal) -> CallError {
    CallError::Unsupported { message: refusal.message.clone(), param: Some(refusal.field.clone()) }
}

/// The request in the core's form, or its refusal.
pub fn core<'r>(request: &'r ChatRequest<'_>) -> Result<&'r core::Request, CallError> {
    request.core().map_err(unsupported)
}

/// A Chat field the core only names as a hint, read for the adapter to honour or refuse;
/// `null` reads as absent.
pub fn field<'r, T: Deserialize<'r>>(
    request: &'r ChatRequest<'_>,
    name: &str,
) -> Result<Option<T>, CallError> {
    match request.passthrough.get(name) {
        None => Ok(None),
        Some(raw) => serde_json::from_str::<Option<T>>(raw.get())
            .map_err(|e| unsupported(&Refusal::at(name, strip_position(&e.to_string())))),
    }
}

/// One content part of a Chat message, as much as naming it in Chat terms needs.
#[derive(Deserialize)]
pub struct ChatPart {
    #[serde(rename = "type", default)]
    pub kind: String,
    image_url: Option<ChatUrl>,
    file: Option<ChatFile>,
}

#[derive(Deserialize)]
struct ChatUrl {
    url: Option<String>,
}

#[derive(Deserialize)]
struct ChatFile {
    file_data: Option<String>,
}

impl ChatPart {
    /// The part's URL (`image_url.url`, `file.file_data`) and its field below the part.
    pub fn url(&self) -> Option<(&'static str, &str)> {
        if let Some(url) = self.image_url.as_ref().and_then(|i| i.url.as_deref()) {
            return Some(("image_url.url", url));
        }
        self.file.as_ref().and_then(|f| f.file_data.as_deref()).map(|data| ("file.file_data", data))
    }
}

#[derive(Deserialize)]
struct ChatMessage {
    content: Option<Box<RawValue>>,
}

/// The first content part of the Chat request's messages that `pick` names a field of, as
/// (`messages[i].content[j].<field>`, the part's type): the writers name core parts
/// (`messages[i].parts[j]`), whose indexes are not the client's, so an adapter that wants
/// a refusal in Chat terms finds the part again. Only for a request being refused.
pub fn chat_part(
    request: &ChatRequest<'_>,
    pick: impl Fn(&ChatPart) -> Option<&'static str>,
) -> Option<(String, String)> {
    let messages: Vec<ChatMessage> =
        serde_json::from_str(request.passthrough.get("messages")?.get()).ok()?;
    for (i, message) in messages.iter().enumerate() {
        let Some(content) = &message.content else { continue };
        let Ok(parts) = serde_json::from_str::<Vec<ChatPart>>(content.get()) else { continue };
        for (j, part) in parts.iter().enumerate() {
            if let Some(field) = pick(part) {
                return Some((format!("messages[{i}].content[{j}].{field}"), part.kind.clone()));
            }
        }
    }
    None
}

/// serde_json's " at line L column C" names no field and means nothing to a client.
fn strip_position(text: &str) -> &str {
    text.rfind(" at line ").map_or(text, |cut| &text[..cut])
}

/// Chat's `response_format`.
#[derive(Deserialize)]
pub struct ResponseFormat<'a> {
    #[serde(rename = "type", borrow)]
    pub kind: Cow<'a, str>,
    #[serde(borrow)]
    pub json_schema: Option<JsonSchema<'a>>,
}

/// `response_format.json_schema`.
#[derive(Deserialize)]
pub struct JsonSchema<'a> {
    #[serde(borrow)]
    pub name: Option<Cow<'a, str>>,
    #[serde(borrow)]
    pub schema: Option<&'a RawValue>,
    pub strict: Option<bool>,
}

impl ResponseFormat<'_> {
    /// Whether it asks for a schema with `strict: true`.
    pub fn strict(&self) -> bool {
        self.kind == "json_schema"
            && self.json_schema.as_ref().and_then(|s| s.strict).unwrap_or(false)
    }
}

/// Core usage as the pipeline bills it: cached input is input.
pub fn usage(usage: &core::Usage) -> Usage {
    Usage { prompt_tokens: usage.input_tokens, completion_tokens: usage.output_tokens }
}

/// A written chunk or completion's top-level fields, raw.
fn top_level(json: &[u8]) -> Result<BTreeMap<String, Box<RawValue>>, String> {
    serde_json::from_slice(json).map_err(|e| e.to_string())
}

/// A core answer as a unified `chat.completion`.
pub fn completion(response: &core::Response) -> Result<Completion, CallError> {
    let body = chat::completion_body(response, &response.model);
    let fields = top_level(&body).map_err(CallError::Malformed)?;
    Ok(Completion::new(Fields::Map(fields), usage(&response.usage)))
}

/// One stream's core events as unified chunks, written by the core's Chat encoder.
///
/// The start is the role chunk (it commits nothing); text, tool calls and the finish reason
/// commit; thinking has no chunk. Usage is held for the usage-only chunk the stream ends
/// with ([`Chunks::usage_chunk`]), since providers report it in pieces.
pub struct Chunks {
    encoder: chat::Encoder,
    usage: core::Usage,
    /// The finish reason came: the answer is whole.
    finished: bool,
    written: Vec<Vec<u8>>,
}

impl Chunks {
    pub fn new(upstream_model: &str) -> Self {
        Self {
            encoder: chat::Encoder::new(upstream_model, true),
            usage: core::Usage::default(),
            finished: false,
            written: Vec::new(),
        }
    }

    pub fn finished(&self) -> bool {
        self.finished
    }

    /// The chunks `event` makes, appended to `out`.
    pub fn push(&mut self, event: Event, out: &mut Vec<StreamEvent>) -> Result<(), String> {
        let commits = match &event {
            Event::Start { model, .. } => {
                // The upstream names the model that answered; chunks carry that name.
                if !model.is_empty() {
                    self.encoder = chat::Encoder::new(model, true);
                }
                false
            }
            Event::Usage(usage) => {
                self.usage = *usage;
                return Ok(());
            }
            Event::Finish(_) => {
                self.finished = true;
                true
            }
            Event::TextDelta(_)
            | Event::ThinkingDelta { .. }
            | Event::ToolCallStart { .. }
            | Event::ToolCallDelta { .. } => true,
        };
        self.encoder.push(event, &mut self.written);
        for chunk in self.written.drain(..) {
            out.push(StreamEvent::Chunk {
                fields: top_level(&chunk)?,
                commits,
                usage: None,
                usage_only: false,
                finished: self.finished,
            });
        }
        Ok(())
    }

    /// The usage-only chunk (empty `choices`) with the last usage reported.
    pub fn usage_chunk(&mut self) -> Result<StreamEvent, String> {
        self.encoder.push(Event::Usage(self.usage), &mut self.written);
        let fields = match self.written.pop() {
            Some(chunk) => top_level(&chunk)?,
            None => return Err("the encoder wrote no usage chunk".into()),
        };
        self.written.clear();
        Ok(StreamEvent::Chunk {
            fields,
            commits: false,
            usage: Some(usage(&self.usage)),
            usage_only: true,
            finished: self.finished,
        })
    }
}
