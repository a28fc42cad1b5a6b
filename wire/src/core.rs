//! The one internal form every inbound surface produces and every provider format consumes:
//! a request, an answer, and the events of a streamed answer.
//!
//! It holds what the formats share and nothing only one of them has. What a format carries
//! that has no place here and does not change the answer's shape (Anthropic's
//! `cache_control`, `context_management`, ...) is named in [`Request::hints`], so the caller
//! can say what was dropped; what would change the answer is refused by the parser instead.

use serde::Serialize;
use serde_json::value::RawValue;

/// A request for one answer.
#[derive(Debug, Clone, PartialEq, Default, Serialize)]
pub struct Request {
    /// System (and developer) instructions, in order.
    pub system: Vec<String>,
    /// User and assistant turns; tool results are parts of user turns.
    pub messages: Vec<Message>,
    pub tools: Vec<Tool>,
    pub tool_choice: Option<ToolChoice>,
    pub max_tokens: Option<u32>,
    pub temperature: Option<f64>,
    pub top_p: Option<f64>,
    pub top_k: Option<u32>,
    pub stop: Vec<String>,
    /// Sampling seed, penalties for tokens already present and for their frequency (Chat's
    /// names); formats without them (Messages) drop them.
    #[serde(skip_serializing_if = "Option::is_none")]
    pub seed: Option<i64>,
    #[serde(skip_serializing_if = "Option::is_none")]
    pub presence_penalty: Option<f64>,
    #[serde(skip_serializing_if = "Option::is_none")]
    pub frequency_penalty: Option<f64>,
    pub stream: bool,
    /// Who the end user is: Messages' `metadata.user_id`, Chat's `user`.
    pub user: Option<String>,
    pub reasoning: Option<Reasoning>,
    /// The shape the answer's text must take (structured outputs), where the client's format
    /// asks for one (Responses' `text.format`, Chat's `response_format`); `None`: free text.
    #[serde(skip_serializing_if = "Option::is_none")]
    pub format: Option<Format>,
    /// Provider-only hints seen in the request that a translation to another format drops
    /// (`cache_control`, `context_management`, ...), each once, in the order first seen.
    pub hints: Vec<&'static str>,
}

impl Request {
    /// Notes a hint, once.
    pub fn hint(&mut self, hint: &'static str) {
        if !self.hints.contains(&hint) {
            self.hints.push(hint);
        }
    }
}

/// A user or assistant turn.
#[derive(Debug, Clone, PartialEq, Serialize)]
pub struct Message {
    pub role: Role,
    pub parts: Vec<Part>,
}

#[derive(Debug, Clone, Copy, PartialEq, Eq, Serialize)]
pub enum Role {
    User,
    Assistant,
}

/// One piece of a turn or of an answer.
#[derive(Debug, Clone, PartialEq, Serialize)]
pub enum Part {
    Text(String),
    Image(Image),
    /// Audio (Chat's `input_audio`): base64 `data` in `format` (`wav`, `mp3`). Only Gemini
    /// takes it; other writers refuse it.
    Audio {
        format: String,
        data: String,
    },
    /// A document (Chat's `file`: a PDF, ...) in either of an image's forms. Only Gemini
    /// takes it; other writers refuse it.
    File(Image),
    /// A call the assistant made; `arguments` is JSON text (an object).
    ToolCall {
        id: String,
        name: String,
        arguments: String,
    },
    /// The answer to a call, sent back in a user turn; `content` holds text and images.
    ToolResult {
        call_id: String,
        content: Vec<Part>,
        is_error: bool,
    },
    /// The model's reasoning; `signature` is Anthropic's proof that it was not altered.
    Thinking {
        text: String,
        signature: Option<String>,
    },
}

#[derive(Debug, Clone, PartialEq, Eq, Serialize)]
pub enum Image {
    /// An http(s) URL the provider fetches (or a Gemini Files API or `gs://` URI).
    Url(String),
    /// The image's bytes, base64-encoded, and their media type (`image/png`).
    Base64 { media_type: String, data: String },
}

/// A function the model may call.
#[derive(Debug, Clone, PartialEq, Eq, Serialize)]
pub struct Tool {
    pub name: String,
    pub description: Option<String>,
    /// The JSON schema of the arguments (an object), passed on unchanged.
    pub parameters: RawJson,
}

/// JSON text known to be valid — read by a parser, or checked by [`RawJson::new`] — and
/// written out as it is, without being parsed again.
#[derive(Debug, Clone)]
pub struct RawJson(Box<RawValue>);

impl RawJson {
    /// Checks that `text` is JSON.
    pub fn new(text: String) -> Result<Self, serde_json::Error> {
        RawValue::from_string(text).map(Self)
    }

    /// `{}`.
    pub fn empty_object() -> Self {
        Self(crate::de::empty_object())
    }

    /// The JSON text.
    pub fn get(&self) -> &str {
        self.0.get()
    }

    pub fn raw(&self) -> &RawValue {
        &self.0
    }

    /// Whether the JSON is an object.
    pub fn is_object(&self) -> bool {
        self.get().trim_start().starts_with('{')
    }
}

impl From<Box<RawValue>> for RawJson {
    fn from(raw: Box<RawValue>) -> Self {
        Self(raw)
    }
}

/// Two values are equal when their texts are (as sent: `{"a":1}` is not `{ "a": 1 }`).
impl PartialEq for RawJson {
    fn eq(&self, other: &Self) -> bool {
        self.get() == other.get()
    }
}

impl Eq for RawJson {}

impl Serialize for RawJson {
    fn serialize<S: serde::Serializer>(&self, serializer: S) -> Result<S::Ok, S::Error> {
        self.0.serialize(serializer)
    }
}

/// Which tools the model may or must call.
#[derive(Debug, Clone, PartialEq, Eq, Serialize)]
pub struct ToolChoice {
    pub mode: ToolMode,
    /// Whether the model may call several tools at once (`None`: the provider's default).
    pub parallel: Option<bool>,
}

#[derive(Debug, Clone, PartialEq, Eq, Serialize)]
pub enum ToolMode {
    /// The model decides.
    Auto,
    /// No tool call.
    None,
    /// At least one tool call, of any tool.
    Any,
    /// A call of this tool.
    Tool(String),
}

/// The shape an answer's text must take.
#[derive(Debug, Clone, PartialEq, Eq, Serialize)]
pub enum Format {
    /// A JSON object, any.
    JsonObject,
    /// JSON valid against `schema`, passed on unchanged.
    JsonSchema { name: String, description: Option<String>, schema: RawJson, strict: Option<bool> },
}

/// How much the model reasons before it answers.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Serialize)]
pub enum Reasoning {
    Effort(Effort),
    /// A budget of reasoning tokens (Anthropic's `thinking.budget_tokens`).
    Budget(u32),
}

#[derive(Debug, Clone, Copy, PartialEq, Eq, Serialize)]
pub enum Effort {
    Low,
    Medium,
    High,
}

impl Effort {
    pub fn as_str(self) -> &'static str {
        match self {
            Effort::Low => "low",
            Effort::Medium => "medium",
            Effort::High => "high",
        }
    }
}

impl Reasoning {
    /// The effort a budget amounts to, for formats that take only an effort: low up to
    /// 2,048 tokens, medium up to 16,384, high above.
    pub fn effort(self) -> Effort {
        match self {
            Reasoning::Effort(effort) => effort,
            Reasoning::Budget(0..=2048) => Effort::Low,
            Reasoning::Budget(2049..=16384) => Effort::Medium,
            Reasoning::Budget(_) => Effort::High,
        }
    }
}

/// A whole answer.
#[derive(Debug, Clone, PartialEq, Serialize)]
pub struct Response {
    pub id: String,
    pub model: String,
    pub parts: Vec<Part>,
    pub finish: Finish,
    pub usage: Usage,
}

/// Why the answer ended.
#[derive(Debug, Clone, PartialEq, Eq, Serialize)]
pub enum Finish {
    Stop,
    Length,
    ToolCalls,
    ContentFilter,
    /// One of the request's stop sequences was generated (which one, where known).
    StopSequence(Option<String>),
    /// The model declined to answer.
    Refusal,
}

/// Tokens an answer cost.
///
/// `input_tokens` is all input, cached or not (OpenAI's `prompt_tokens`); the cache counts
/// say how much of it was read from or written to the provider's prompt cache. (Anthropic
/// counts its `input_tokens` without the cache: its writer subtracts them.)
#[derive(Debug, Clone, Copy, PartialEq, Eq, Default, Serialize)]
pub struct Usage {
    pub input_tokens: u64,
    pub output_tokens: u64,
    pub cache_read_tokens: Option<u64>,
    pub cache_write_tokens: Option<u64>,
}

/// One event of a streamed answer, in the order the answer is made.
#[derive(Debug, Clone, PartialEq, Serialize)]
pub enum Event {
    Start {
        id: String,
        model: String,
    },
    TextDelta(String),
    ThinkingDelta {
        text: String,
        signature: Option<String>,
    },
    /// A tool call begins; `index` tells its later deltas apart from other calls'.
    ToolCallStart {
        index: u32,
        id: String,
        name: String,
    },
    /// More of a call's arguments (a piece of JSON text).
    ToolCallDelta {
        index: u32,
        arguments: String,
    },
    Finish(Finish),
    Usage(Usage),
}

/// Tokens each image counts for: Anthropic's upper bound for one image (about 1,600
/// tokens for an image of 1.15 megapixels, larger ones are scaled down).
pub const IMAGE_TOKENS: u64 = 1600;

/// An estimate of a request's input tokens, for answers that need a count without asking a
/// provider (`count_tokens` when no Anthropic model is in the chain).
///
/// The heuristic: one token per 4 characters (rounded up) of all text the model reads —
/// system instructions, text parts, thinking, tool calls (name and arguments), tool
/// results, and tools (name, description and schema) — plus [`IMAGE_TOKENS`] per image.
/// English prose runs about 4 characters a token with the GPT and Claude tokenizers; code
/// and JSON run denser, so the estimate errs low for them.
pub fn estimate_tokens(request: &Request) -> u64 {
    let mut chars: u64 = 0;
    let mut images: u64 = 0;
    let mut count = |text: &str| chars = chars.saturating_add(text.chars().count() as u64);
    for text in &request.system {
        count(text);
    }
    fn walk(parts: &[Part], count: &mut dyn FnMut(&str), images: &mut u64) {
        for part in parts {
            match part {
                Part::Text(text) => count(text),
                // Audio and documents are counted as an image: no better guess without
                // decoding them.
                Part::Image(_) | Part::Audio { .. } | Part::File(_) => {
                    *images = images.saturating_add(1)
                }
                Part::ToolCall { name, arguments, .. } => {
                    count(name);
                    count(arguments);
                }
                Part::ToolResult { content, .. } => walk(content, count, images),
                Part::Thinking { text, .. } => count(text),
            }
        }
    }
    for message in &request.messages {
        walk(&message.parts, &mut count, &mut images);
    }
    for tool in &request.tools {
        count(&tool.name);
        if let Some(description) = &tool.description {
            count(description);
        }
        count(tool.parameters.get());
    }
    chars.div_ceil(4).saturating_add(images.saturating_mul(IMAGE_TOKENS))
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn estimate_tokens_counts_four_characters_a_token_over_all_text_and_schemas() {
        let request = Request {
            system: vec!["abcd".into()], // 4
            messages: vec![Message {
                role: Role::User,
                parts: vec![
                    Part::Text("héllo".into()), // 5 characters, not 6 bytes
                    Part::ToolResult {
                        call_id: "c".into(),
                        content: vec![Part::Text("xyz".into())], // 3
                        is_error: false,
                    },
                ],
            }],
            tools: vec![Tool {
                name: "get".into(),                                     // 3
                description: Some("d".into()),                          // 1
                parameters: RawJson::new(r#"{"a":1}"#.into()).unwrap(), // 7
            }],
            ..Request::default()
        };
        // 23 characters → 6 tokens, rounded up.
        assert_eq!(estimate_tokens(&request), 6);
    }

    #[test]
    fn estimate_tokens_counts_each_image_as_the_anthropic_upper_bound() {
        let request = Request {
            messages: vec![Message {
                role: Role::User,
                parts: vec![
                    Part::Image(Image::Url("https://example.com/a.png".into())),
                    Part::Text("a".into()),
                ],
            }],
            ..Request::default()
        };
        assert_eq!(estimate_tokens(&request), 1 + IMAGE_TOKENS);
        assert_eq!(estimate_tokens(&Request::default()), 0);
    }

    #[test]
    fn a_budget_maps_to_an_effort_at_2048_and_16384() {
        assert_eq!(Reasoning::Budget(2048).effort(), Effort::Low);
        assert_eq!(Reasoning::Budget(2049).effort(), Effort::Medium);
        assert_eq!(Reasoning::Budget(16384).effort(), Effort::Medium);
        assert_eq!(Reasoning::Budget(16385).effort(), Effort::High);
        assert_eq!(Reasoning::Effort(Effort::Low).effort(), Effort::Low);
    }
}
