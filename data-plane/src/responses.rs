//! The `/v1/responses` surface (OpenAI's Responses API, docs/responses.md): how its requests
//! join the chain and how answers leave in its shape.
//!
//! A Responses request is read by the typed translation core (`switchyard_wire`) and becomes
//! the chain's request in the unified (Chat Completions) form every adapter takes, so it is
//! served by a model of any kind through the same chain, breakers and limits as a chat
//! request. On the way out, the unified answer or stream is translated by the same core into
//! a Response object or the Responses event stream.

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
use crate::request::{ChatRequest, with_fields};

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

    /// The chain's request: the translation.
    pub fn request(&self) -> Result<ChatRequest<'_>, ApiError> {
        let mut request = ChatRequest::parse(&self.body)?;
        request.translated = true;
        Ok(request)
    }

    /// The `x-dropped-hints` of an answer `model` (of `kind`) gave, if anything was dropped:
    /// what no model takes, and the reasoning ask where the model takes none (only
    /// OpenAI-kind and Gemini models marked `reasoning` get `reasoning_effort`, Gemini's as
    /// a thinking budget).
    pub fn dropped(&self, kind: Option<ProviderKind>, model: &Model) -> Option<HeaderValue> {
        let takes_effort = matches!(
            kind,
            Some(
                ProviderKind::Openai
                    | ProviderKind::AzureOpenai
                    | ProviderKind::OpenaiCompatible
                    | ProviderKind::Gemini
            )
        );
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

fn refused(refusal: switchyard_wire::Refusal) -> ApiError {
    ApiError::invalid(refusal.field.clone(), refusal.to_string())
}

/// A completion as a Response object naming `name`, with the failover report when given.
pub fn answer(completion: &Completion, name: &str, report: Option<&RawValue>) -> Option<Vec<u8>> {
    let raw_name = serde_json::value::to_raw_value(name).ok()?;
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

/// Writes a stream's unified chunks as the Responses event stream.
pub struct Framing {
    /// The failover report, which `response.created`'s response carries as `secureai`
    /// (taken when it goes out: one `response.created` per stream).
    report: Option<Box<RawValue>>,
    decoder: chat::ChunkDecoder,
    encoder: responses::Encoder,
}

impl Framing {
    /// `model`: the served model's gateway name, which every response object carries.
    pub fn new(model: &str, report: Option<Box<RawValue>>) -> Self {
        Self {
            report,
            decoder: chat::ChunkDecoder::default(),
            encoder: responses::Encoder::new(model),
        }
    }

    /// The events one unified chunk makes (often one, sometimes none).
    pub fn chunk(&mut self, fields: &BTreeMap<String, Box<RawValue>>) -> Option<Bytes> {
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
        let mut frames = Vec::new();
        self.encoder.finish(&mut frames);
        self.join(&mut frames)
    }

    /// The `response.failed` that ends a broken answer.
    pub fn error(&mut self, message: &str, code: &str) -> Bytes {
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
        let request = translated.request().unwrap();
        assert_eq!(request.model.as_deref(), Some("gpt"));
        assert_eq!(request.fallback_models.as_ref().map(Vec::len), Some(1));
        assert!(request.translated && request.native.is_none());
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
            .chunk(&chunk(json!({"id": "c1", "choices": [{"delta": {"content": "Hi"}}]})))
            .unwrap();
        let first = String::from_utf8(first.to_vec()).unwrap();
        assert_eq!(first.matches("event: response.created").count(), 1);
        assert_eq!(first.matches("secureai").count(), 1, "{first}");
        let rest = framing.done().unwrap();
        let rest = String::from_utf8(rest.to_vec()).unwrap();
        assert!(!rest.contains("response.created") && !rest.contains("secureai"), "{rest}");
        assert!(rest.contains("event: response.completed"), "{rest}");
    }
}
