//! Continuing an answer whose stream broke after content reached the client
//! (docs/http-api.md, "Streaming"): what a stream keeps of what it delivered, whether that
//! can be continued, and the request that asks a model to continue it.
//!
//! The request is the client's own, with the text already delivered as a final assistant
//! message (a "prefill"): a model whose catalog entry says `continuation: prefill` takes it
//! as the start of its answer and sends only the rest. OpenAI-compatible servers spell the
//! prefill in more than one way; both spellings go with the message (vLLM's
//! `continue_final_message`, Mistral's `prefix: true`). Anthropic's Messages API and Gemini
//! take a trailing assistant (model) turn as it is, through their adapters' translation.

use std::collections::BTreeMap;

use serde::Deserialize;
use serde::de::IgnoredAny;
use serde_json::value::RawValue;
use serde_json::{Map, Value};

use switchyard_catalog::ProviderKind;

/// The most bytes of delivered chunks a stream keeps for a continuation: about a quarter of
/// a million words of text. A stream whose answer grows past it is no longer continued (a
/// break past that point ends it with an error frame, as with continuation off), and what
/// it kept is freed at once.
pub const KEEP_MAX_BYTES: usize = 1 << 20;

/// The `choices` of every chunk a stream delivered, kept raw: parsed only if it breaks, so
/// a stream that ends well pays a copy per chunk and nothing more.
#[derive(Debug, Default)]
pub struct Delivered {
    choices: Vec<Box<RawValue>>,
    bytes: usize,
    /// Past [`KEEP_MAX_BYTES`]: nothing is kept any more, and nothing can be continued.
    overflowed: bool,
}

impl Delivered {
    /// Keeps the `choices` of one chunk the client was sent.
    pub fn keep(&mut self, fields: &BTreeMap<String, Box<RawValue>>) {
        if self.overflowed {
            return;
        }
        let Some(choices) = fields.get("choices") else { return };
        self.bytes += choices.get().len();
        if self.bytes > KEEP_MAX_BYTES {
            self.overflowed = true;
            self.choices = Vec::new();
            return;
        }
        self.choices.push(choices.clone());
    }

    /// Bytes held, for the memory bound.
    pub fn bytes(&self) -> usize {
        if self.overflowed { 0 } else { self.bytes }
    }

    /// The answer's text so far, if it can be continued: one choice, text only, no finish
    /// reason yet. A tool call's arguments, a refusal or a second choice cannot be continued
    /// by a prefill, and an answer that finished needs nothing.
    pub fn text(&self) -> Option<String> {
        if self.overflowed {
            return None;
        }
        let mut text = String::new();
        for raw in &self.choices {
            let choices: Vec<ChoiceDelta> = serde_json::from_str(raw.get()).ok()?;
            for choice in choices {
                if choice.index != 0 || choice.finish_reason.is_some() {
                    return None;
                }
                let Some(delta) = choice.delta else { continue };
                if delta.tool_calls.is_some()
                    || delta.function_call.is_some()
                    || delta.refusal.is_some()
                {
                    return None;
                }
                if let Some(content) = delta.content {
                    text.push_str(&content);
                }
            }
        }
        Some(text)
    }
}

#[derive(Deserialize)]
struct ChoiceDelta {
    #[serde(default)]
    index: u32,
    #[serde(default)]
    delta: Option<Delta>,
    #[serde(default)]
    finish_reason: Option<String>,
}

#[derive(Deserialize)]
struct Delta {
    #[serde(default)]
    content: Option<String>,
    #[serde(default)]
    tool_calls: Option<IgnoredAny>,
    #[serde(default)]
    function_call: Option<IgnoredAny>,
    #[serde(default)]
    refusal: Option<String>,
}

#[derive(Debug, thiserror::Error)]
pub enum BodyError {
    #[error("the request body is not a JSON object")]
    NotAnObject,
    #[error("the request has no `messages` list")]
    NoMessages,
    #[error("the request body does not parse: {0}")]
    Json(#[from] serde_json::Error),
}

/// What a prefill may hold for a model of `kind`, and what it leaves out: Anthropic's
/// Messages API refuses a final assistant message that ends in whitespace, so that whitespace
/// is left out of the prefill and taken off the start of the continuation (which, from the
/// shorter text, most often begins with it again).
pub fn prefill(text: &str, kind: ProviderKind) -> (&str, &str) {
    if kind == ProviderKind::Anthropic {
        let kept = text.trim_end();
        (kept, &text[kept.len()..])
    } else {
        (text, "")
    }
}

/// The first new text of a continuation, without the part of `held` (whitespace left out of
/// the prefill, which the client has already) it starts with.
pub fn without_held<'a>(content: &'a str, held: &str) -> &'a str {
    let common = content.bytes().zip(held.bytes()).take_while(|(a, b)| a == b).count();
    // Whitespace is ASCII here, so `common` falls on a character boundary.
    content.get(common..).unwrap_or(content)
}

/// The client's request `original` with `text` as the start of the answer, for a model of
/// `kind`: the body a continuation call is built from (its model's adapter then translates
/// it like any request). `text` is what [`prefill`] kept.
pub fn body(original: &[u8], text: &str, kind: ProviderKind) -> Result<Vec<u8>, BodyError> {
    let Value::Object(mut request) = serde_json::from_slice::<Value>(original)? else {
        return Err(BodyError::NotAnObject);
    };
    let Some(Value::Array(messages)) = request.get_mut("messages") else {
        return Err(BodyError::NoMessages);
    };
    let mut prefill = Map::new();
    prefill.insert("role".into(), Value::from("assistant"));
    prefill.insert("content".into(), Value::from(text));
    if kind == ProviderKind::OpenaiCompatible {
        prefill.insert("prefix".into(), Value::Bool(true));
    }
    messages.push(Value::Object(prefill));
    if kind == ProviderKind::OpenaiCompatible {
        request.insert("continue_final_message".into(), Value::Bool(true));
        request.insert("add_generation_prompt".into(), Value::Bool(false));
    }
    request.insert("stream".into(), Value::Bool(true));
    Ok(serde_json::to_vec(&request)?)
}

#[cfg(test)]
mod tests {
    #![allow(clippy::unwrap_used)]
    use serde_json::json;

    use super::*;

    fn chunk(choices: Value) -> BTreeMap<String, Box<RawValue>> {
        let mut fields = BTreeMap::new();
        fields.insert("id".to_owned(), serde_json::value::to_raw_value(&json!("c1")).unwrap());
        fields.insert("choices".to_owned(), serde_json::value::to_raw_value(&choices).unwrap());
        fields
    }

    fn delivered(chunks: &[Value]) -> Delivered {
        let mut d = Delivered::default();
        for c in chunks {
            d.keep(&chunk(c.clone()));
        }
        d
    }

    #[test]
    fn the_text_delivered_is_the_content_of_choice_0_in_order() {
        let d = delivered(&[
            json!([{"index": 0, "delta": {"role": "assistant", "content": ""}, "finish_reason": null}]),
            json!([{"index": 0, "delta": {"content": "Hello "}, "finish_reason": null}]),
            json!([{"index": 0, "delta": {"content": "wörld"}, "finish_reason": null}]),
            json!([]),
        ]);
        assert_eq!(d.text().as_deref(), Some("Hello wörld"));
    }

    #[test]
    fn a_tool_call_a_refusal_a_second_choice_or_a_finished_answer_is_not_continued() {
        let text = json!([{"index": 0, "delta": {"content": "Hi"}}]);
        for last in [
            json!([{"index": 0, "delta": {"tool_calls": [{"index": 0, "function": {"arguments": "{\"a\""}}]}}]),
            json!([{"index": 0, "delta": {"refusal": "no"}}]),
            json!([{"index": 1, "delta": {"content": "other"}}]),
            json!([{"index": 0, "delta": {}, "finish_reason": "stop"}]),
        ] {
            assert_eq!(delivered(&[text.clone(), last.clone()]).text(), None, "{last}");
        }
    }

    #[test]
    fn past_the_bound_nothing_is_kept_and_nothing_continued() {
        let piece = "x".repeat(64 * 1024);
        let mut d = Delivered::default();
        for _ in 0..15 {
            d.keep(&chunk(json!([{"index": 0, "delta": {"content": piece}}])));
        }
        assert!(d.text().is_some() && d.bytes() <= KEEP_MAX_BYTES);
        for _ in 0..2 {
            d.keep(&chunk(json!([{"index": 0, "delta": {"content": piece}}])));
        }
        assert_eq!((d.text(), d.bytes()), (None, 0));
    }

    #[test]
    fn an_anthropic_prefill_leaves_its_trailing_whitespace_out_and_the_continuation_drops_it() {
        assert_eq!(prefill("The quick ", ProviderKind::Anthropic), ("The quick", " "));
        assert_eq!(prefill("The quick ", ProviderKind::OpenaiCompatible), ("The quick ", ""));
        assert_eq!(without_held(" brown fox", " "), "brown fox");
        assert_eq!(without_held("brown fox", " "), "brown fox");
        assert_eq!(without_held("\n\nNext", "\n"), "\nNext");
    }

    #[test]
    fn the_continuation_request_ends_with_the_text_as_an_assistant_message() {
        let original = br#"{"model":"m","messages":[{"role":"user","content":"Hi"}],"stream":true,"temperature":0.2}"#;
        let plain: Value =
            serde_json::from_slice(&body(original, "Hello wo", ProviderKind::Anthropic).unwrap())
                .unwrap();
        assert_eq!(
            plain["messages"],
            json!([{"role": "user", "content": "Hi"}, {"role": "assistant", "content": "Hello wo"}])
        );
        assert_eq!(
            (plain["temperature"].clone(), plain["stream"].clone()),
            (json!(0.2), json!(true))
        );
        assert!(plain.get("continue_final_message").is_none());
        // OpenAI-compatible servers get both spellings of "continue this message".
        let compatible: Value = serde_json::from_slice(
            &body(original, "Hello wo", ProviderKind::OpenaiCompatible).unwrap(),
        )
        .unwrap();
        assert_eq!(compatible["messages"][1]["prefix"], true);
        assert_eq!(compatible["continue_final_message"], true);
        assert_eq!(compatible["add_generation_prompt"], false);
        assert!(matches!(body(b"[]", "x", ProviderKind::Openai), Err(BodyError::NotAnObject)));
    }
}
