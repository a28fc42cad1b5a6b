//! OpenAI's Responses API spoken natively: a `/v1/responses` request served by an OpenAI or
//! Azure OpenAI model goes upstream as the client sent it (only `model` changes) and its
//! answer comes back as the upstream sent it, so nothing is lost on the way: built-in tools
//! and their calls, reasoning items and their encrypted content (docs/responses.md).
//! Errors are OpenAI's (`openai::parse_error`), classified as every other call's.

use std::borrow::Cow;
use std::collections::BTreeMap;

use bytes::Bytes;
use http::StatusCode;
use serde::Deserialize;
use serde_json::value::RawValue;

use switchyard_catalog::{Provider, ProviderKind};

use super::adapter::StreamDecoder;
use super::error::{CallError, UpstreamError};
use super::openai::parse_error;
use super::sse::Frame;
use super::unified::{Completion, Fields, StreamEvent, Usage};

/// The provider's Responses endpoint: `{base_url}/responses` for OpenAI (whose base URL ends
/// in `/v1`); Azure OpenAI serves it on its v1 API, `{base_url}/openai/v1/responses`, the
/// deployment named by the body's `model` (the catalog's `upstream_model`).
pub fn url(provider: &Provider) -> String {
    let base = provider.base_url.trim_end_matches('/');
    match provider.kind {
        ProviderKind::AzureOpenai => format!("{base}/openai/v1/responses"),
        _ => format!("{base}/responses"),
    }
}

/// Usage as a Response reports it.
#[derive(Clone, Copy, Default, Deserialize)]
struct WireUsage {
    #[serde(default)]
    input_tokens: u64,
    #[serde(default)]
    output_tokens: u64,
}

impl WireUsage {
    fn usage(self) -> Usage {
        Usage { prompt_tokens: self.input_tokens, completion_tokens: self.output_tokens }
    }
}

/// The fields of a Response the node reads; the rest passes as it came.
#[derive(Deserialize)]
struct Top<'a> {
    #[serde(default, borrow)]
    object: Option<Cow<'a, str>>,
    #[serde(default, borrow)]
    model: Option<&'a RawValue>,
    #[serde(default)]
    usage: Option<WireUsage>,
    #[serde(default, borrow)]
    error: Option<&'a RawValue>,
}

/// A 200 body as it came, with where its `model` is (the gateway's name replaces it) and
/// the usage it bills. A Response whose `error` is set is that error.
pub fn completion(body: &Bytes) -> Result<Completion, CallError> {
    let top: Top<'_> =
        serde_json::from_slice(body).map_err(|e| CallError::Malformed(e.to_string()))?;
    if top.object.as_deref() != Some("response") {
        return Err(CallError::Malformed("the body is not a Responses `response`".into()));
    }
    if let Some(error) = top.error.filter(|e| e.get() != "null") {
        return Err(CallError::Http {
            status: StatusCode::INTERNAL_SERVER_ERROR,
            error: response_error(error),
            retry_after: None,
        });
    }
    let start = body.as_ptr() as usize;
    let model = top.model.map(|raw| {
        let at = raw.get().as_ptr() as usize - start;
        at..at + raw.get().len()
    });
    let usage = top.usage.unwrap_or_default().usage();
    Ok(Completion::responses(Fields::Verbatim { bytes: body.clone(), model }, usage))
}

/// A Response's `error` (`{"code", "message"}`) as the upstream's error.
fn response_error(error: &RawValue) -> UpstreamError {
    #[derive(Deserialize)]
    struct Error {
        #[serde(default)]
        code: Option<String>,
        #[serde(default)]
        message: Option<String>,
    }
    let error: Error =
        serde_json::from_str(error.get()).unwrap_or(Error { code: None, message: None });
    UpstreamError {
        message: error.message.unwrap_or_else(|| "the response failed".into()),
        kind: "server_error".into(),
        code: error.code,
        param: None,
    }
}

/// A decoder for a streamed Response.
pub fn decoder() -> Box<dyn StreamDecoder> {
    Box::<EventDecoder>::default()
}

/// Passes each event on as its top-level fields (a Responses event names itself in `type`,
/// which is how the `/v1/responses` surface tells it from a chunk it must translate), and
/// reads from it what the node needs: where the answer commits, its usage, its end.
#[derive(Default)]
struct EventDecoder {
    /// `response.completed` (or `response.incomplete`) came: the answer is whole.
    finished: bool,
}

#[derive(Deserialize)]
struct Event<'a> {
    #[serde(rename = "type", borrow)]
    kind: Cow<'a, str>,
    #[serde(default, borrow)]
    delta: Option<Cow<'a, str>>,
    #[serde(default, borrow)]
    response: Option<Top<'a>>,
    #[serde(default)]
    code: Option<String>,
    #[serde(default)]
    message: Option<String>,
}

impl StreamDecoder for EventDecoder {
    fn decode(&mut self, frame: &Frame) -> Result<Vec<StreamEvent>, String> {
        let data = frame.data.trim();
        if data == "[DONE]" {
            return Ok(vec![StreamEvent::Done]);
        }
        let event: Event<'_> =
            serde_json::from_str(data).map_err(|e| format!("an event is not JSON: {e}"))?;
        match event.kind.as_ref() {
            "error" => {
                let error = UpstreamError {
                    message: event.message.unwrap_or_else(|| "the stream failed".into()),
                    kind: "server_error".into(),
                    code: event.code,
                    param: None,
                };
                return Ok(vec![StreamEvent::Error(error)]);
            }
            "response.failed" => {
                let error = event.response.and_then(|r| r.error).map_or_else(
                    || parse_error(StatusCode::INTERNAL_SERVER_ERROR, data.as_bytes()),
                    response_error,
                );
                return Ok(vec![StreamEvent::Error(error)]);
            }
            _ => {}
        }
        // The first content commits the stream (docs/responses.md, "Streaming"): a text or
        // call-arguments delta with something in it, or the end of an empty answer.
        let ends = matches!(event.kind.as_ref(), "response.completed" | "response.incomplete");
        let commits = ends
            || matches!(
                event.kind.as_ref(),
                "response.output_text.delta" | "response.function_call_arguments.delta"
            ) && event.delta.as_deref().is_some_and(|d| !d.is_empty());
        self.finished |= ends;
        let usage = event.response.and_then(|r| r.usage).map(WireUsage::usage);
        let fields: BTreeMap<String, Box<RawValue>> =
            serde_json::from_str(data).map_err(|e| format!("an event is not an object: {e}"))?;
        let chunk = StreamEvent::Chunk {
            fields,
            commits,
            usage,
            usage_only: false,
            finished: self.finished,
        };
        Ok(if ends { vec![chunk, StreamEvent::Done] } else { vec![chunk] })
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
            "event: response.created\ndata: {\"type\":\"response.created\",\"sequence_number\":0,\"response\":{\"id\":\"resp_1\",\"object\":\"response\",\"model\":\"gpt-x\",\"output\":[]}}\n\n",
            "event: response.output_item.added\ndata: {\"type\":\"response.output_item.added\",\"sequence_number\":1,\"output_index\":0,\"item\":{\"type\":\"reasoning\",\"encrypted_content\":\"enc\"}}\n\n",
            "event: response.output_text.delta\ndata: {\"type\":\"response.output_text.delta\",\"sequence_number\":2,\"delta\":\"\"}\n\n",
            "event: response.output_text.delta\ndata: {\"type\":\"response.output_text.delta\",\"sequence_number\":3,\"delta\":\"Hi\"}\n\n",
            "event: response.completed\ndata: {\"type\":\"response.completed\",\"sequence_number\":4,\"response\":{\"id\":\"resp_1\",\"object\":\"response\",\"usage\":{\"input_tokens\":7,\"output_tokens\":5}}}\n\n",
        ));
        let commits: Vec<bool> =
            events.iter().map(|e| matches!(e, StreamEvent::Chunk { commits: true, .. })).collect();
        assert_eq!(commits, [false, false, false, true, true, false]);
        let StreamEvent::Chunk { fields, .. } = &events[1] else { panic!("a chunk") };
        assert_eq!(fields["item"].get(), "{\"type\":\"reasoning\",\"encrypted_content\":\"enc\"}");
        let StreamEvent::Chunk { usage: Some(usage), finished: true, .. } = &events[4] else {
            panic!("usage and the end in response.completed")
        };
        assert_eq!((usage.prompt_tokens, usage.completion_tokens), (7, 5));
        assert!(matches!(events[5], StreamEvent::Done));
    }

    #[test]
    fn error_and_failed_events_are_the_upstreams_error() {
        let events = decode_all(concat!(
            "event: error\ndata: {\"type\":\"error\",\"code\":\"server_error\",\"message\":\"busy\",\"sequence_number\":1}\n\n",
            "event: response.failed\ndata: {\"type\":\"response.failed\",\"sequence_number\":2,\"response\":{\"object\":\"response\",\"error\":{\"code\":\"server_error\",\"message\":\"gone\"}}}\n\n",
        ));
        let [StreamEvent::Error(a), StreamEvent::Error(b)] = &events[..] else {
            panic!("{events:?}")
        };
        assert_eq!((a.message.as_str(), b.message.as_str()), ("busy", "gone"));
    }

    #[test]
    fn a_body_is_kept_whole_with_its_model_found_and_its_usage_read() {
        let body = Bytes::from_static(
            b"{\"id\":\"resp_1\",\"object\":\"response\",\"model\":\"gpt-x\",\"output\":[{\"type\":\"web_search_call\",\"id\":\"ws_1\"}],\"error\":null,\"usage\":{\"input_tokens\":3,\"output_tokens\":2}}",
        );
        let c = completion(&body).unwrap();
        assert!(c.responses);
        assert_eq!((c.usage.prompt_tokens, c.usage.completion_tokens), (3, 2));
        let name = serde_json::value::to_raw_value("gpt").unwrap();
        let out: serde_json::Value = serde_json::from_slice(&c.to_json(&name, None)).unwrap();
        assert_eq!(out["model"], "gpt");
        assert_eq!(out["output"][0]["type"], "web_search_call");
        assert!(completion(&Bytes::from_static(b"{\"choices\":[]}")).is_err());
    }

    #[test]
    fn openai_and_azure_have_their_responses_urls() {
        let provider = |kind: &str, base: &str| -> Provider {
            serde_json::from_value(serde_json::json!({"name": "p", "kind": kind, "base_url": base, "api_version": "2024-10-21"}))
                .unwrap()
        };
        assert_eq!(
            url(&provider("openai", "https://api.openai.com/v1/")),
            "https://api.openai.com/v1/responses"
        );
        assert_eq!(
            url(&provider("azure-openai", "https://contoso.openai.azure.com")),
            "https://contoso.openai.azure.com/openai/v1/responses"
        );
    }
}
