//! The unified shapes every adapter translates into: an OpenAI `chat.completion`, its
//! streamed chunks, and the usage billed for them.

use std::collections::BTreeMap;
use std::sync::OnceLock;

use bytes::Bytes;
use serde_json::value::RawValue;

use super::error::UpstreamError;

/// Token counts as the upstream reported them.
#[derive(Clone, Copy, Debug, Default, PartialEq, Eq)]
pub struct Usage {
    pub prompt_tokens: u64,
    pub completion_tokens: u64,
}

/// An OpenAI-shaped `chat.completion`.
#[derive(Debug)]
pub struct Completion {
    pub fields: Fields,
    pub usage: Usage,
    /// [`Completion::finish_reasons`], read once: the call's span and the request's both
    /// carry them, and reading them scans the whole body.
    finish_reasons: OnceLock<Vec<String>>,
    /// The body is an Anthropic `message`, not a `chat.completion`: an Anthropic model's
    /// own answer to a `/v1/messages` request, passed on as it came.
    pub messages: bool,
    /// The body is an OpenAI `response`: an OpenAI model's own answer to a `/v1/responses`
    /// request, passed on as it came.
    pub responses: bool,
}

/// A completion's top-level fields.
#[derive(Debug)]
pub enum Fields {
    /// The upstream's own bytes, already in OpenAI's shape (OpenAI-compatible providers):
    /// forwarded as they came, with only the `model` value (at `model`, if present) replaced.
    Verbatim { bytes: Bytes, model: Option<std::ops::Range<usize>> },
    /// Fields an adapter built by translating another provider's answer.
    Map(BTreeMap<String, Box<RawValue>>),
}

impl Completion {
    /// A completion whose finish reasons are read when first asked for.
    pub fn new(fields: Fields, usage: Usage) -> Self {
        Self { fields, usage, finish_reasons: OnceLock::new(), messages: false, responses: false }
    }

    /// An Anthropic `message` passed on as it came (see [`Completion::messages`]).
    pub fn messages(fields: Fields, usage: Usage) -> Self {
        Self { messages: true, ..Self::new(fields, usage) }
    }

    /// An OpenAI `response` passed on as it came (see [`Completion::responses`]).
    pub fn responses(fields: Fields, usage: Usage) -> Self {
        Self { responses: true, ..Self::new(fields, usage) }
    }

    /// The body as the upstream sent it, when it is passed on verbatim.
    pub fn verbatim(&self) -> Option<&[u8]> {
        match &self.fields {
            Fields::Verbatim { bytes, .. } => Some(bytes),
            Fields::Map(_) => None,
        }
    }

    /// The completion's `choices`, raw: for a check of what the answer says (structured
    /// outputs), without building a tree of the whole body.
    pub fn choices(&self) -> Option<&RawValue> {
        #[derive(serde::Deserialize)]
        struct Top<'a> {
            #[serde(borrow)]
            choices: Option<&'a RawValue>,
        }
        match &self.fields {
            Fields::Map(map) => map.get("choices").map(|raw| &**raw),
            Fields::Verbatim { bytes, .. } => {
                serde_json::from_slice::<Top<'_>>(bytes).ok().and_then(|top| top.choices)
            }
        }
    }

    /// The model the upstream says answered (`gen_ai.response.model`), if it said.
    pub fn upstream_model(&self) -> Option<String> {
        let raw = match &self.fields {
            Fields::Map(map) => map.get("model")?.get().as_bytes(),
            Fields::Verbatim { bytes, model } => bytes.get(model.clone()?)?,
        };
        serde_json::from_slice(raw).ok()
    }

    /// Each choice's `finish_reason` (`gen_ai.response.finish_reasons`), read on first use.
    pub fn finish_reasons(&self) -> &[String] {
        #[derive(serde::Deserialize)]
        struct Choice {
            finish_reason: Option<String>,
        }
        #[derive(serde::Deserialize)]
        struct Top {
            choices: Option<Vec<Choice>>,
        }
        self.finish_reasons.get_or_init(|| {
            // One pass over the body: the choices' other fields are skipped, not kept.
            let choices = match &self.fields {
                Fields::Map(map) => map
                    .get("choices")
                    .and_then(|raw| serde_json::from_str::<Vec<Choice>>(raw.get()).ok()),
                Fields::Verbatim { bytes, .. } => {
                    serde_json::from_slice::<Top>(bytes).ok().and_then(|top| top.choices)
                }
            };
            choices.map_or_else(Vec::new, |choices| {
                choices.into_iter().filter_map(|c| c.finish_reason).collect()
            })
        })
    }

    /// The completion's JSON with `model` set to the gateway name (a JSON string) and, if
    /// given, one more top-level field.
    pub fn to_json(&self, model: &RawValue, extra: Option<(&str, &RawValue)>) -> Vec<u8> {
        match &self.fields {
            Fields::Map(map) => {
                let mut out = Vec::with_capacity(512);
                out.push(b'{');
                let mut first = true;
                let mut field = |out: &mut Vec<u8>, key: &str, value: &RawValue| {
                    if !std::mem::take(&mut first) {
                        out.push(b',');
                    }
                    let _ = serde_json::to_writer(&mut *out, key);
                    out.push(b':');
                    out.extend_from_slice(value.get().as_bytes());
                };
                field(&mut out, "model", model);
                for (key, value) in map.iter().filter(|(k, _)| *k != "model") {
                    field(&mut out, key, value);
                }
                if let Some((key, value)) = extra {
                    field(&mut out, key, value);
                }
                out.push(b'}');
                out
            }
            Fields::Verbatim { bytes, model: span } => {
                let mut out =
                    Vec::with_capacity(bytes.len() + 64 + extra.map_or(0, |(_, v)| v.get().len()));
                match span {
                    Some(span) => {
                        out.extend_from_slice(&bytes[..span.start]);
                        out.extend_from_slice(model.get().as_bytes());
                        out.extend_from_slice(&bytes[span.end..]);
                    }
                    None => {
                        // `completion` checked the body is an object with `choices`: after its
                        // `{` there is at least one field to put a comma before.
                        let open = bytes.iter().position(|b| *b == b'{').unwrap_or(0);
                        out.extend_from_slice(&bytes[..=open]);
                        out.extend_from_slice(b"\"model\":");
                        out.extend_from_slice(model.get().as_bytes());
                        out.push(b',');
                        out.extend_from_slice(&bytes[open + 1..]);
                    }
                }
                if let Some((key, value)) = extra {
                    while out.last().is_some_and(|b| b.is_ascii_whitespace()) {
                        out.pop();
                    }
                    if out.last() == Some(&b'}') {
                        out.pop();
                        out.push(b',');
                        let _ = serde_json::to_writer(&mut out, key);
                        out.push(b':');
                        out.extend_from_slice(value.get().as_bytes());
                        out.push(b'}');
                    }
                }
                out
            }
        }
    }
}

impl serde::Serialize for Fields {
    fn serialize<S: serde::Serializer>(&self, s: S) -> Result<S::Ok, S::Error> {
        match self {
            Self::Map(map) => map.serialize(s),
            Self::Verbatim { bytes, .. } => {
                let text = std::str::from_utf8(bytes).map_err(serde::ser::Error::custom)?;
                let raw: &RawValue =
                    serde_json::from_str(text).map_err(serde::ser::Error::custom)?;
                raw.serialize(s)
            }
        }
    }
}

/// One event of an upstream stream, in OpenAI's shape.
#[derive(Debug)]
pub enum StreamEvent {
    /// A `chat.completion.chunk`, top-level fields raw.
    Chunk {
        fields: BTreeMap<String, Box<RawValue>>,
        /// Carries content (text, a tool call, a refusal) or a finish reason: the point after
        /// which the serving model is locked.
        commits: bool,
        usage: Option<Usage>,
        /// No choices, only usage (OpenAI's final chunk with `include_usage`).
        usage_only: bool,
        /// Every choice begun so far has had its finish reason, by this chunk or an earlier
        /// one: the answer is whole, and an upstream that closes the body cleanly from here
        /// on ended it, end marker or not (docs/http-api.md, "Streaming").
        finished: bool,
    },
    /// The upstream's end marker.
    Done,
    /// An in-band error (`data: {"error": …}`, Anthropic's `event: error`).
    Error(UpstreamError),
}
