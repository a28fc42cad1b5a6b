//! Anthropic's Messages format spoken natively: a `/v1/messages` request served by an
//! Anthropic model goes upstream as the client sent it (only `model` changes) and its answer
//! comes back as the upstream sent it, so nothing Anthropic-only is lost on the way: thinking
//! blocks and their signatures, cache usage, citations, betas (docs/messages.md).

use std::collections::BTreeMap;

use bytes::Bytes;
use http::StatusCode;
use serde::Deserialize;
use serde_json::value::RawValue;

use switchyard_catalog::Model;

use super::error::{self, parse_error};
use crate::providers::adapter::StreamDecoder;
use crate::providers::error::CallError;
use crate::providers::sse::Frame;
use crate::providers::unified::{Completion, Fields, StreamEvent, Usage};
use crate::request::Native;

/// Usage as Anthropic reports it.
#[derive(Clone, Copy, Default, Deserialize)]
struct WireUsage {
    #[serde(default)]
    input_tokens: Option<u64>,
    #[serde(default)]
    output_tokens: Option<u64>,
    #[serde(default)]
    cache_creation_input_tokens: Option<u64>,
    #[serde(default)]
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

    /// Cache writes and reads are input too: billed as prompt tokens. Sums saturate: the
    /// counts are the upstream's, and no count it sends may wrap or panic the node (found by
    /// the `anthropic` fuzz target, docs/fuzzing.md).
    fn usage(&self) -> Usage {
        Usage {
            prompt_tokens: self
                .input_tokens
                .unwrap_or(0)
                .saturating_add(self.cache_creation_input_tokens.unwrap_or(0))
                .saturating_add(self.cache_read_input_tokens.unwrap_or(0)),
            completion_tokens: self.output_tokens.unwrap_or(0),
        }
    }
}

/// The client's body for `model`: its fields as sent, `model` the upstream's name.
pub fn body(model: &Model, native: &Native<'_>) -> Vec<u8> {
    native.body(&model.upstream_model)
}

/// A 200 body as it came, with where its `model` is (the gateway's name replaces it) and
/// the usage it bills.
pub fn completion(body: &Bytes) -> Result<Completion, CallError> {
    #[derive(Deserialize)]
    struct Top<'a> {
        #[serde(rename = "type", default)]
        kind: Option<&'a str>,
        #[serde(borrow, default)]
        model: Option<&'a RawValue>,
        #[serde(default)]
        usage: Option<WireUsage>,
    }
    let top: Top<'_> =
        serde_json::from_slice(body).map_err(|e| CallError::Malformed(e.to_string()))?;
    // An error object in a 200 (seen from proxies in front of Anthropic) is that error.
    if top.kind == Some("error") {
        return Err(error::in_ok(body));
    }
    if top.kind != Some("message") {
        return Err(CallError::Malformed("the body is not a Messages `message`".into()));
    }
    let start = body.as_ptr() as usize;
    let model = top.model.map(|raw| {
        let at = raw.get().as_ptr() as usize - start;
        at..at + raw.get().len()
    });
    let usage = top.usage.unwrap_or_default().usage();
    Ok(Completion::messages(Fields::Verbatim { bytes: body.clone(), model }, usage))
}

/// Passes each event on as its top-level fields (an Anthropic event names itself in `type`,
/// which is how the `/v1/messages` surface tells it from a chunk it must translate), and
/// reads from it what the node needs: where the answer commits, its usage, its end.
#[derive(Default)]
pub struct EventDecoder {
    usage: WireUsage,
    /// `message_delta` brought the stop reason: the answer is whole.
    stopped: bool,
}

#[derive(Deserialize)]
struct Event<'a> {
    #[serde(rename = "type")]
    kind: &'a str,
    #[serde(default)]
    message: Option<Start>,
    #[serde(default)]
    content_block: Option<Block<'a>>,
    #[serde(default, borrow)]
    delta: Option<Delta<'a>>,
    #[serde(default)]
    usage: Option<WireUsage>,
}

#[derive(Deserialize)]
struct Start {
    #[serde(default)]
    usage: Option<WireUsage>,
}

#[derive(Deserialize)]
struct Block<'a> {
    #[serde(rename = "type")]
    kind: &'a str,
}

#[derive(Deserialize)]
struct Delta<'a> {
    #[serde(default, borrow)]
    text: Option<std::borrow::Cow<'a, str>>,
    #[serde(default, borrow)]
    partial_json: Option<std::borrow::Cow<'a, str>>,
    #[serde(default, borrow)]
    thinking: Option<std::borrow::Cow<'a, str>>,
    #[serde(default)]
    stop_reason: Option<String>,
}

impl StreamDecoder for EventDecoder {
    fn decode(&mut self, frame: &Frame) -> Result<Vec<StreamEvent>, String> {
        let data = frame.data.trim();
        let event: Event<'_> =
            serde_json::from_str(data).map_err(|e| format!("an event is not JSON: {e}"))?;
        if event.kind == "error" {
            return Ok(vec![StreamEvent::Error(parse_error(StatusCode::OK, data.as_bytes()))]);
        }
        let mut usage = None;
        // The first content commits the stream (docs/messages.md, "Streaming"): a text,
        // thinking or tool-input delta with something in it, a tool call begun, or the stop
        // reason of an empty answer.
        let commits = match event.kind {
            "message_start" => {
                if let Some(u) = event.message.and_then(|m| m.usage) {
                    self.usage.update(u);
                    usage = Some(self.usage.usage());
                }
                false
            }
            "content_block_start" => event.content_block.is_some_and(|b| b.kind == "tool_use"),
            "content_block_delta" => event.delta.as_ref().is_some_and(|d| {
                [&d.text, &d.partial_json, &d.thinking]
                    .into_iter()
                    .any(|t| t.as_deref().is_some_and(|t| !t.is_empty()))
            }),
            "message_delta" => {
                if let Some(u) = event.usage {
                    self.usage.update(u);
                    usage = Some(self.usage.usage());
                }
                let stopped = event.delta.is_some_and(|d| d.stop_reason.is_some());
                self.stopped |= stopped;
                stopped
            }
            _ => false,
        };
        let fields: BTreeMap<String, Box<RawValue>> =
            serde_json::from_str(data).map_err(|e| format!("an event is not an object: {e}"))?;
        let chunk = StreamEvent::Chunk {
            fields,
            commits,
            usage,
            usage_only: false,
            finished: self.stopped,
        };
        Ok(if event.kind == "message_stop" { vec![chunk, StreamEvent::Done] } else { vec![chunk] })
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    fn decode_all(text: &str) -> Vec<StreamEvent> {
        let mut decoder = EventDecoder::default();
        text.split("\n\n")
            .filter(|f| !f.trim().is_empty())
            .flat_map(|f| {
                let (event, data) = f.split_once('\n').unwrap();
                let frame = Frame {
                    event: Some(event.trim_start_matches("event: ").to_owned()),
                    data: data.trim_start_matches("data: ").to_owned(),
                };
                decoder.decode(&frame).unwrap()
            })
            .collect()
    }

    #[test]
    fn events_pass_as_they_came_and_commit_at_the_first_content() {
        let events = decode_all(concat!(
            "event: message_start\ndata: {\"type\":\"message_start\",\"message\":{\"id\":\"m1\",\"model\":\"claude-x\",\"content\":[],\"usage\":{\"input_tokens\":7,\"output_tokens\":1}}}\n\n",
            "event: content_block_start\ndata: {\"type\":\"content_block_start\",\"index\":0,\"content_block\":{\"type\":\"thinking\",\"thinking\":\"\"}}\n\n",
            "event: content_block_delta\ndata: {\"type\":\"content_block_delta\",\"index\":0,\"delta\":{\"type\":\"thinking_delta\",\"thinking\":\"hmm\"}}\n\n",
            "event: content_block_delta\ndata: {\"type\":\"content_block_delta\",\"index\":0,\"delta\":{\"type\":\"signature_delta\",\"signature\":\"sig\"}}\n\n",
            "event: message_delta\ndata: {\"type\":\"message_delta\",\"delta\":{\"stop_reason\":\"end_turn\"},\"usage\":{\"output_tokens\":5}}\n\n",
            "event: message_stop\ndata: {\"type\":\"message_stop\"}\n\n",
        ));
        let commits: Vec<bool> =
            events.iter().map(|e| matches!(e, StreamEvent::Chunk { commits: true, .. })).collect();
        assert_eq!(commits, [false, false, true, false, true, false, false]);
        let StreamEvent::Chunk { fields, .. } = &events[3] else { panic!("a chunk") };
        assert_eq!(fields["delta"].get(), "{\"type\":\"signature_delta\",\"signature\":\"sig\"}");
        let StreamEvent::Chunk { usage: Some(usage), finished: true, .. } = &events[4] else {
            panic!("usage and the end in message_delta")
        };
        assert_eq!((usage.prompt_tokens, usage.completion_tokens), (7, 5));
        assert!(matches!(events[6], StreamEvent::Done));
    }

    #[test]
    fn an_error_event_is_the_upstreams_error() {
        let events = decode_all(
            "event: error\ndata: {\"type\":\"error\",\"error\":{\"type\":\"overloaded_error\",\"message\":\"busy\"}}\n\n",
        );
        let [StreamEvent::Error(e)] = &events[..] else { panic!("{events:?}") };
        assert_eq!(e.message, "busy");
    }

    #[test]
    fn a_body_is_kept_whole_with_its_model_found_and_its_usage_read() {
        let body = Bytes::from_static(
            b"{\"id\":\"m1\",\"type\":\"message\",\"model\":\"claude-x\",\"content\":[{\"type\":\"thinking\",\"thinking\":\"t\",\"signature\":\"s\"}],\"usage\":{\"input_tokens\":3,\"cache_read_input_tokens\":4,\"output_tokens\":2}}",
        );
        let c = completion(&body).unwrap();
        assert_eq!((c.usage.prompt_tokens, c.usage.completion_tokens), (7, 2));
        let name = serde_json::value::to_raw_value("claude").unwrap();
        let out: serde_json::Value = serde_json::from_slice(&c.to_json(&name, None)).unwrap();
        assert_eq!(out["model"], "claude");
        assert_eq!(out["content"][0]["signature"], "s");
        assert!(completion(&Bytes::from_static(b"{\"choices\":[]}")).is_err());
    }
}
