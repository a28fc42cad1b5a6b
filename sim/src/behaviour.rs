//! What a simulated model does with a request: the script types.
//!
//! A behaviour is plain JSON tagged by `kind`, so the same value is accepted by the control
//! API, a `--script` file and the library (`SimServer::set`).

use std::collections::BTreeMap;

use serde::{Deserialize, Serialize};

/// The content pieces an `ok` stream sends when `chunks` is not given.
pub const DEFAULT_CHUNKS: u32 = 5;

/// A script: model name → behaviour (the format of `switchyard sim --script FILE`).
pub type Script = BTreeMap<String, Behaviour>;

/// One model's scripted behaviour. A model never scripted behaves as `Ok(Reply::default())`.
#[derive(Debug, Clone, PartialEq, Serialize, Deserialize)]
#[serde(tag = "kind", rename_all = "snake_case")]
pub enum Behaviour {
    /// Answer (a `chat.completion`, or a `chat.completion.chunk` stream when `stream: true`).
    Ok(Reply),
    /// Answer with the provider's real error body for `status`.
    Status(StatusReply),
    /// Read the request, then never answer; the connection stays open.
    Hang,
    /// Close the connection without a response (an RST: SO_LINGER 0).
    Reset,
    /// `200` with a body that is not valid JSON (or, when streaming, a frame that is not).
    Malformed,
    /// Stream `after` content chunks, then an in-band `data: {"error": …}` frame.
    /// A non-streaming request gets a `500` with `message` instead.
    StreamError(StreamErrorReply),
    /// Step `i` for the `i`-th request since this was set, then `then` for every later one.
    Sequence(SequenceReply),
}

impl Default for Behaviour {
    fn default() -> Self {
        Behaviour::Ok(Reply::default())
    }
}

impl Behaviour {
    /// The behaviour for the request at position `n` (0-based) since this script was set:
    /// sequences are flattened, including sequences nested in steps.
    pub fn at(&self, n: u64) -> &Behaviour {
        match self {
            Behaviour::Sequence(seq) => {
                let step = usize::try_from(n).ok().and_then(|i| seq.steps.get(i));
                match step {
                    // A nested sequence as a step is one request: its own first step.
                    Some(step) => step.at(0),
                    None => {
                        let past = n.saturating_sub(seq.steps.len() as u64);
                        seq.then.at(past)
                    }
                }
            }
            other => other,
        }
    }
}

/// `{"kind": "ok", …}`: a successful answer.
#[derive(Debug, Clone, PartialEq, Serialize, Deserialize)]
#[serde(default, deny_unknown_fields)]
pub struct Reply {
    /// The assistant's content; `None` answers `"Hello from <model>."`.
    pub text: Option<String>,
    /// Wait before the response head is sent.
    pub delay_ms: u64,
    /// Streaming: how many content chunks the text is cut into.
    pub chunks: u32,
    /// Streaming: wait between the role chunk and the first content chunk.
    pub first_token_delay_ms: u64,
    /// Streaming: wait between content chunks.
    pub chunk_delay_ms: u64,
    /// Streaming: send this many content chunks, then nothing more (connection kept open).
    pub stall_after: Option<u32>,
    /// Streaming: send this many content chunks, then close the connection abruptly (the
    /// chunked body never ends properly).
    pub drop_after: Option<u32>,
    /// Streaming: send the finish reason (and the usage, where the wire format sends it)
    /// and end the body cleanly without the end marker (OpenAI's `data: [DONE]`,
    /// Anthropic's `message_stop`; Gemini's streams have none anyway).
    pub no_done: bool,
    /// Streaming: after this many content chunks, one `data:` line that is not JSON, then
    /// the rest of the answer as usual.
    pub bad_frame_after: Option<u32>,
    /// The model's context, in the simulator's tokens (words): a request whose prompt has
    /// more gets the provider's own context-length refusal (a 400) instead of the answer.
    pub context_window: Option<u64>,
    /// A request that ends in an assistant message (a prefill: "continue this answer") gets
    /// the provider's 400 for it instead of the answer, whatever else is scripted, as models
    /// and servers without prefill support answer it.
    pub rejects_prefill: bool,
    /// OpenAI's format: a request offering `tools` (with a `tool_choice` other than `none`,
    /// and not ending in a `tool` message) gets a call of the named or the first tool, its
    /// arguments a placeholder of each required property, as the Anthropic and Gemini
    /// formats always answer. Off by default: tests that send tools to check what passes
    /// through still get text.
    pub call_tools: bool,
}

impl Default for Reply {
    fn default() -> Self {
        Reply {
            text: None,
            delay_ms: 0,
            chunks: DEFAULT_CHUNKS,
            first_token_delay_ms: 0,
            chunk_delay_ms: 0,
            stall_after: None,
            drop_after: None,
            no_done: false,
            bad_frame_after: None,
            context_window: None,
            rejects_prefill: false,
            call_tools: false,
        }
    }
}

impl Reply {
    /// The model's `context_window` when a prompt of `prompt_tokens` is longer.
    pub fn too_long(&self, prompt_tokens: u64) -> Option<u64> {
        self.context_window.filter(|window| prompt_tokens > *window)
    }
}

impl Reply {
    /// A reply with this text and no delays.
    pub fn text(text: impl Into<String>) -> Self {
        Reply { text: Some(text.into()), ..Reply::default() }
    }
}

/// What a request's trailing assistant message (a prefill) makes of an answer: the byte
/// offset the answer continues from, when the prefill is a prefix of it (the model carries
/// on from there); 0 (the whole answer, as usual) when there is none or it is not a prefix.
pub fn continues_at(answer: &str, prefill: Option<&str>) -> usize {
    prefill.filter(|p| answer.starts_with(p)).map_or(0, str::len)
}

/// `{"kind": "status", "status": 429, …}`: an error response.
#[derive(Debug, Clone, PartialEq, Serialize, Deserialize)]
#[serde(deny_unknown_fields)]
pub struct StatusReply {
    #[serde(deserialize_with = "http_status")]
    pub status: u16,
    #[serde(default)]
    pub delay_ms: u64,
    /// Replaces the provider's message for that status.
    #[serde(default)]
    pub message: Option<String>,
    /// 429/503: the `retry-after` header in seconds (429 sends 1 when not given).
    #[serde(default)]
    pub retry_after: Option<u64>,
}

impl StatusReply {
    pub fn new(status: u16) -> Self {
        StatusReply { status, delay_ms: 0, message: None, retry_after: None }
    }
}

/// A status a response line can carry; anything else would be served as something else.
fn http_status<'de, D: serde::Deserializer<'de>>(d: D) -> Result<u16, D::Error> {
    let status = u16::deserialize(d)?;
    if (100..=599).contains(&status) {
        Ok(status)
    } else {
        Err(serde::de::Error::custom(format!("status {status} is not an HTTP status (100-599)")))
    }
}

/// `{"kind": "stream_error", "after": 2, "message": "…"}`.
#[derive(Debug, Clone, PartialEq, Serialize, Deserialize)]
#[serde(deny_unknown_fields)]
pub struct StreamErrorReply {
    #[serde(default)]
    pub after: u32,
    #[serde(default)]
    pub message: Option<String>,
}

/// `{"kind": "sequence", "steps": [...], "then": {...}}`; `then` defaults to `ok`.
#[derive(Debug, Clone, PartialEq, Serialize, Deserialize)]
#[serde(deny_unknown_fields)]
pub struct SequenceReply {
    pub steps: Vec<Behaviour>,
    #[serde(default)]
    pub then: Box<Behaviour>,
}

/// Waits a scripted delay (none for 0).
pub(crate) async fn sleep_ms(ms: u64) {
    if ms > 0 {
        tokio::time::sleep(std::time::Duration::from_millis(ms)).await;
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    fn parse(json: &str) -> Behaviour {
        serde_json::from_str(json).unwrap()
    }

    #[test]
    fn ok_fields_default() {
        assert_eq!(parse(r#"{"kind":"ok"}"#), Behaviour::default());
        let b = parse(r#"{"kind":"ok","text":"hi","chunks":2,"stall_after":1}"#);
        let Behaviour::Ok(r) = b else { panic!("not ok") };
        assert_eq!((r.text.as_deref(), r.chunks, r.stall_after), (Some("hi"), 2, Some(1)));
        assert!(!r.rejects_prefill);
        let b = parse(r#"{"kind":"ok","rejects_prefill":true}"#);
        assert!(matches!(b, Behaviour::Ok(r) if r.rejects_prefill));
    }

    #[test]
    fn a_prefill_continues_the_answer_only_when_it_is_a_prefix_of_it() {
        assert_eq!(continues_at("Hello from m.", Some("Hello fr")), 8);
        assert_eq!(continues_at("Hello from m.", Some("Bonjour")), 0);
        assert_eq!(continues_at("Hello from m.", None), 0);
        assert_eq!(continues_at("héllo", Some("hé")), "hé".len());
    }

    #[test]
    fn unknown_fields_and_kinds_are_rejected() {
        assert!(serde_json::from_str::<Behaviour>(r#"{"kind":"ok","txt":"x"}"#).is_err());
        assert!(serde_json::from_str::<Behaviour>(r#"{"kind":"status"}"#).is_err());
        assert!(serde_json::from_str::<Behaviour>(r#"{"kind":"explode"}"#).is_err());
        assert!(serde_json::from_str::<Behaviour>(r#"{"kind":"status","status":1000}"#).is_err());
    }

    #[test]
    fn sequence_steps_then_recovers() {
        let b = parse(
            r#"{"kind":"sequence","steps":[{"kind":"status","status":503},{"kind":"reset"}],
                "then":{"kind":"ok","text":"back"}}"#,
        );
        assert!(matches!(b.at(0), Behaviour::Status(s) if s.status == 503));
        assert_eq!(b.at(1), &Behaviour::Reset);
        assert_eq!(b.at(2), &Behaviour::Ok(Reply::text("back")));
        assert_eq!(b.at(99), &Behaviour::Ok(Reply::text("back")));
        let default_then = parse(r#"{"kind":"sequence","steps":[{"kind":"hang"}]}"#);
        assert_eq!(default_then.at(1), &Behaviour::default());
    }

    #[test]
    fn round_trips() {
        let b = Behaviour::Sequence(SequenceReply {
            steps: vec![Behaviour::Status(StatusReply::new(429)), Behaviour::Malformed],
            then: Box::new(Behaviour::StreamError(StreamErrorReply { after: 2, message: None })),
        });
        let json = serde_json::to_string(&b).unwrap();
        assert_eq!(serde_json::from_str::<Behaviour>(&json).unwrap(), b);
    }
}
