//! The `/v1/responses` surface (OpenAI's Responses API, docs/responses.md): how its requests
//! join the chain and how answers leave in its shape.
//!
//! A Responses request is read by the typed translation core (`switchyard_wire`) and becomes
//! the chain's request in the unified (Chat Completions) form every adapter takes, so it is
//! served by a model of any kind through the same chain, breakers and limits as a chat
//! request; the body as sent is kept beside it ([`Native`]) for OpenAI and Azure OpenAI
//! models, which get it unchanged. On the way out, such a model's answer passes as it came
//! (its `model` the gateway's name); any other kind's, in the unified shape, is translated by
//! the same core into a Response object or the Responses event stream.

use std::collections::BTreeMap;

use bytes::Bytes;
use http::HeaderValue;
use serde::Serialize;
use serde_json::value::RawValue;

use switchyard_catalog::{Model, ProviderKind};
use switchyard_wire::core::{self, Event};
use switchyard_wire::{chat, responses};

use crate::error::ApiError;
use crate::providers::Completion;
use crate::request::{ChatRequest, Native, with_fields};

/// The gateway's own fields a Responses body may carry beside OpenAI's.
const GATEWAY_FIELDS: [&str; 4] = ["model", "models", "fallback_models", "redundancy"];

/// What a model that takes no reasoning drops of a request that asks for it.
const HINT_REASONING: &str = "reasoning";

/// A Responses body read: its translation in the unified form, which the chain's request
/// borrows from, and what was dropped on the way.
pub struct Translated {
    /// A Chat Completions body with the gateway's fields as the client sent them (shared:
    /// a stream's continuation asks with it too).
    pub body: Bytes,
    /// What the translation dropped for every model (built-in tools, reasoning items, ...).
    hints: Vec<&'static str>,
    reasoning: bool,
}

impl Translated {
    /// Reads a Responses body; a refusal names the field in Responses terms.
    pub fn of(body: &[u8]) -> Result<Self, ApiError> {
        let request = responses::parse_request(body).map_err(refused)?;
        // Reasoning is asked for in the unified form; whether a model takes it is the
        // adapter's to decide, per model (`reasoning` in the catalog).
        let (unified, hints) = chat::request_body(&request, true);
        let gateway: BTreeMap<&str, &RawValue> = serde_json::from_slice(body).map_err(|e| {
            ApiError::invalid("body", format!("the body is not a JSON object ({e})"))
        })?;
        let body = with_fields(
            unified,
            GATEWAY_FIELDS.iter().filter_map(|name| gateway.get(name).map(|v| (*name, *v))),
        );
        Ok(Self { body: Bytes::from(body), hints, reasoning: request.reasoning.is_some() })
    }

    /// The chain's request: the translation, with the original body kept for the models
    /// that take it as it is.
    pub fn request<'a>(&'a self, original: &'a [u8]) -> Result<ChatRequest<'a>, ApiError> {
        let mut request = ChatRequest::parse(&self.body)?;
        request.native = Some(Native::responses(original)?);
        request.translated = true;
        Ok(request)
    }

    /// The `x-dropped-hints` of an answer `model` (of `kind`) gave, if anything was dropped:
    /// nothing where the model got the body as sent ([`native`]); otherwise what the
    /// translation drops, and the reasoning ask where the model takes none (only
    /// OpenAI-compatible and Gemini models marked `reasoning` get `reasoning_effort`,
    /// Gemini's as a thinking budget).
    pub fn dropped(&self, kind: Option<ProviderKind>, model: &Model) -> Option<HeaderValue> {
        if native(kind) {
            return None;
        }
        let takes_effort =
            matches!(kind, Some(ProviderKind::OpenaiCompatible | ProviderKind::Gemini));
        let mut dropped = self.hints.clone();
        if self.reasoning
            && !(takes_effort && model.reasoning)
            && !dropped.contains(&HINT_REASONING)
        {
            dropped.push(HINT_REASONING);
        }
        (!dropped.is_empty()).then(|| HeaderValue::from_str(&dropped.join(", ")).ok()).flatten()
    }
}

/// Whether a model of `kind` is sent a Responses body as the client sent it, and answers
/// in the Responses shape itself (`ProviderRuntime::serves_responses`).
pub fn native(kind: Option<ProviderKind>) -> bool {
    matches!(kind, Some(ProviderKind::Openai | ProviderKind::AzureOpenai))
}

fn refused(refusal: switchyard_wire::Refusal) -> ApiError {
    ApiError::invalid(refusal.field.clone(), refusal.to_string())
}

/// A completion as a Response object naming `name`, with the failover report when given.
pub fn answer(completion: &Completion, name: &str, report: Option<&RawValue>) -> Option<Vec<u8>> {
    let raw_name = serde_json::value::to_raw_value(name).ok()?;
    if completion.responses {
        return Some(completion.to_json(&raw_name, report.map(|r| ("secureai", r))));
    }
    let unified = completion.to_json(&raw_name, None);
    let response = chat::parse_completion(&unified).ok()?;
    let body = responses::response_body(&response, name);
    Some(with_fields(body, report.map(|r| ("secureai", r)).into_iter()))
}

/// A designed (degraded) answer in the Responses shape: a Response object, or its stream.
pub fn degraded(text: &str, model: &str, report: &RawValue, stream: bool) -> Vec<u8> {
    let id = format!("degraded{:016x}", rand::random::<u64>());
    if !stream {
        let answer = core::Response {
            id,
            model: model.to_owned(),
            parts: vec![core::Part::Text(text.to_owned())],
            finish: core::Finish::Stop,
            usage: core::Usage::default(),
        };
        let body = responses::response_body(&answer, model);
        return with_fields(body, std::iter::once(("secureai", report)));
    }
    let mut framing = Framing::new(model, Some(report.to_owned()));
    let mut frames = Vec::new();
    framing.encoder.push(Event::Start { id, model: model.to_owned() }, &mut frames);
    framing.encoder.push(Event::TextDelta(text.to_owned()), &mut frames);
    framing.encoder.push(Event::Finish(core::Finish::Stop), &mut frames);
    framing.encoder.finish(&mut frames);
    framing.join(&mut frames).map(|b| b.to_vec()).unwrap_or_default()
}

/// Writes a stream's events as the Responses event stream: an OpenAI model's events as they
/// came (each names itself in `type`), any other kind's unified chunks translated.
pub struct Framing {
    /// The served model's gateway name, which every response object carries.
    model: String,
    /// The failover report, which `response.created`'s response carries as `secureai`
    /// (taken when it goes out: one `response.created` per stream).
    report: Option<Box<RawValue>>,
    decoder: chat::ChunkDecoder,
    encoder: responses::Encoder,
    /// The upstream's own events, when it speaks the Responses API: its response's id and
    /// the last `sequence_number` passed on, for a `response.failed` of the node's own.
    native: Option<(String, u64)>,
    /// The upstream's `response.completed` (or `response.incomplete`) went out.
    ended: bool,
}

impl Framing {
    /// `model`: the served model's gateway name, which every response object carries.
    pub fn new(model: &str, report: Option<Box<RawValue>>) -> Self {
        Self {
            model: model.to_owned(),
            report,
            decoder: chat::ChunkDecoder::default(),
            encoder: responses::Encoder::new(model),
            native: None,
            ended: false,
        }
    }

    /// The events one unified chunk makes (often one, sometimes none), or an upstream
    /// Responses event passed on.
    pub fn chunk(&mut self, fields: &mut BTreeMap<String, Box<RawValue>>) -> Option<Bytes> {
        if let Some(kind) =
            fields.get("type").and_then(|t| serde_json::from_str::<String>(t.get()).ok())
        {
            return self.pass(&kind, fields);
        }
        let data = serde_json::to_vec(fields).ok()?;
        let events = self.decoder.decode(&data).ok()?;
        let mut frames = Vec::new();
        for event in events {
            self.encoder.push(event, &mut frames);
        }
        self.join(&mut frames)
    }

    /// The events that end a whole answer (`response.completed`).
    pub fn done(&mut self) -> Option<Bytes> {
        if self.native.is_some() {
            // The upstream's own end went out (an end without one is a broken stream).
            return None;
        }
        let mut frames = Vec::new();
        self.encoder.finish(&mut frames);
        self.join(&mut frames)
    }

    /// The `response.failed` that ends a broken answer.
    pub fn error(&mut self, message: &str, code: &str) -> Bytes {
        if let Some((id, sequence)) = &self.native {
            if self.ended {
                return Bytes::new();
            }
            let failed = Failed {
                kind: "response.failed",
                sequence_number: sequence + 1,
                response: FailedResponse {
                    id,
                    object: "response",
                    status: "failed",
                    model: &self.model,
                    error: FailedError { code, message },
                },
            };
            let data = serde_json::to_vec(&failed).unwrap_or_default();
            return frame("response.failed", &data);
        }
        let mut frames = Vec::new();
        self.encoder.fail(code, message, &mut frames);
        self.join(&mut frames).unwrap_or_default()
    }

    fn join(&mut self, frames: &mut [responses::Frame]) -> Option<Bytes> {
        if frames.is_empty() {
            return None;
        }
        if let Some(created) = frames.iter_mut().find(|f| f.event == "response.created")
            && let Some(report) = self.report.take()
        {
            with_report(created, report);
        }
        Some(Bytes::from(frames.iter().flat_map(|f| f.to_bytes()).collect::<Vec<u8>>()))
    }
}

impl Framing {
    /// An upstream Responses event, passed on: events that carry the response object name
    /// the served model by its gateway name, and `response.created` carries the report.
    fn pass(&mut self, kind: &str, fields: &mut BTreeMap<String, Box<RawValue>>) -> Option<Bytes> {
        let sequence = fields
            .get("sequence_number")
            .and_then(|n| serde_json::from_str::<u64>(n.get()).ok())
            .unwrap_or_default();
        let native = self.native.get_or_insert_with(|| (String::new(), 0));
        native.1 = sequence;
        if let Some(raw) = fields.get("response")
            && let Ok(mut response) =
                serde_json::from_str::<BTreeMap<String, Box<RawValue>>>(raw.get())
        {
            if let Some(id) = response.get("id").and_then(|id| serde_json::from_str(id.get()).ok())
            {
                native.0 = id;
            }
            if let Ok(name) = serde_json::value::to_raw_value(&self.model) {
                response.insert("model".into(), name);
            }
            if kind == "response.created"
                && let Some(report) = self.report.take()
            {
                response.insert("secureai".into(), report);
            }
            if let Ok(raw) = serde_json::value::to_raw_value(&response) {
                fields.insert("response".into(), raw);
            }
        }
        self.ended |= matches!(kind, "response.completed" | "response.incomplete");
        let data = serde_json::to_vec(fields).ok()?;
        Some(frame(kind, &data))
    }
}

/// The `response.failed` of a native stream that broke after it committed.
#[derive(Serialize)]
struct Failed<'a> {
    #[serde(rename = "type")]
    kind: &'static str,
    sequence_number: u64,
    response: FailedResponse<'a>,
}

#[derive(Serialize)]
struct FailedResponse<'a> {
    id: &'a str,
    object: &'static str,
    status: &'static str,
    model: &'a str,
    error: FailedError<'a>,
}

#[derive(Serialize)]
struct FailedError<'a> {
    code: &'a str,
    message: &'a str,
}

fn frame(event: &str, data: &[u8]) -> Bytes {
    let mut out = Vec::with_capacity(event.len() + data.len() + 16);
    out.extend_from_slice(b"event: ");
    out.extend_from_slice(event.as_bytes());
    out.extend_from_slice(b"\ndata: ");
    out.extend_from_slice(data);
    out.extend_from_slice(b"\n\n");
    Bytes::from(out)
}

/// Puts the report in a `response.created` event's response, as `secureai`.
fn with_report(frame: &mut responses::Frame, report: Box<RawValue>) {
    #[derive(serde::Deserialize, Serialize)]
    struct Created<'a> {
        #[serde(rename = "type")]
        kind: &'a str,
        sequence_number: u64,
        #[serde(borrow)]
        response: BTreeMap<&'a str, &'a RawValue>,
    }
    let Ok(mut created) = serde_json::from_slice::<Created>(&frame.data) else { return };
    created.response.insert("secureai", &report);
    if let Ok(data) = serde_json::to_vec(&created) {
        frame.data = data;
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use serde_json::{Value, json};

    #[test]
    fn the_gateway_fields_ride_with_the_translation() {
        let body = br#"{"model":"gpt","fallback_models":["claude"],"instructions":"be brief","input":"hi","text":{"format":{"type":"json_object"}}}"#;
        let translated = Translated::of(body).unwrap();
        let request = translated.request(body).unwrap();
        assert_eq!(request.model.as_deref(), Some("gpt"));
        assert_eq!(request.fallback_models.as_ref().map(Vec::len), Some(1));
        assert!(request.translated);
        let native = request.native.as_ref().unwrap();
        assert!(native.fields.contains_key("input") && !native.fields.contains_key("model"));
        assert!(!native.fields.contains_key("fallback_models"));
        let messages: Value = serde_json::from_str(request.passthrough["messages"].get()).unwrap();
        assert_eq!(messages[0], json!({"role": "system", "content": "be brief"}));
        let format: Value =
            serde_json::from_str(request.passthrough["response_format"].get()).unwrap();
        assert_eq!(format, json!({"type": "json_object"}));
    }

    #[test]
    fn a_refusal_names_the_field_in_responses_terms() {
        let e = Translated::of(br#"{"model":"gpt","input":"hi","previous_response_id":"resp_1"}"#)
            .err()
            .unwrap();
        assert!(
            matches!(&e, ApiError::InvalidRequest { param: Some(p), .. } if p == "previous_response_id"),
            "{e:?}"
        );
    }

    #[test]
    fn the_report_rides_once_in_response_created() {
        let report = serde_json::value::to_raw_value(&json!({"served_model": "b"})).unwrap();
        let mut framing = Framing::new("b", Some(report));
        let chunk =
            |v: Value| serde_json::from_value::<BTreeMap<String, Box<RawValue>>>(v).unwrap();
        let first = framing
            .chunk(&mut chunk(json!({"id": "c1", "choices": [{"delta": {"content": "Hi"}}]})))
            .unwrap();
        let first = String::from_utf8(first.to_vec()).unwrap();
        assert_eq!(first.matches("event: response.created").count(), 1);
        assert_eq!(first.matches("secureai").count(), 1, "{first}");
        let rest = framing.done().unwrap();
        let rest = String::from_utf8(rest.to_vec()).unwrap();
        assert!(!rest.contains("response.created") && !rest.contains("secureai"), "{rest}");
        assert!(rest.contains("event: response.completed"), "{rest}");
    }

    #[test]
    fn an_upstream_responses_events_pass_with_the_gateway_name_and_one_report() {
        let report = serde_json::value::to_raw_value(&json!({"served_model": "gpt"})).unwrap();
        let mut framing = Framing::new("gpt", Some(report));
        let event =
            |v: Value| serde_json::from_value::<BTreeMap<String, Box<RawValue>>>(v).unwrap();
        let created = framing
            .chunk(&mut event(json!({"type": "response.created", "sequence_number": 0,
                "response": {"id": "resp_1", "object": "response", "model": "gpt-up"}})))
            .unwrap();
        let created = String::from_utf8(created.to_vec()).unwrap();
        assert!(created.starts_with("event: response.created\n"), "{created}");
        let data: Value =
            serde_json::from_str(created.lines().nth(1).unwrap().strip_prefix("data: ").unwrap())
                .unwrap();
        assert_eq!(data["response"]["model"], "gpt");
        assert_eq!(data["response"]["secureai"]["served_model"], "gpt");
        let item = json!({"type": "response.output_item.added", "sequence_number": 1,
            "item": {"type": "reasoning", "encrypted_content": "enc"}});
        let added = framing.chunk(&mut event(item.clone())).unwrap();
        let added = String::from_utf8(added.to_vec()).unwrap();
        let data: Value =
            serde_json::from_str(added.lines().nth(1).unwrap().strip_prefix("data: ").unwrap())
                .unwrap();
        assert_eq!(data, item, "passed as it came");
        assert_eq!(framing.done(), None, "the upstream's own end is the end");
        let failed = String::from_utf8(framing.error("broke", "upstream_error").to_vec()).unwrap();
        let data: Value =
            serde_json::from_str(failed.lines().nth(1).unwrap().strip_prefix("data: ").unwrap())
                .unwrap();
        assert_eq!(data["type"], "response.failed");
        assert_eq!(
            (data["sequence_number"].as_u64(), data["response"]["id"].as_str()),
            (Some(2), Some("resp_1"))
        );
        assert_eq!(data["response"]["error"]["code"], "upstream_error");
    }
}
