//! The `/v1/messages` surface (Anthropic's Messages API, docs/messages.md): how its requests
//! join the chain and how answers leave in its shape.
//!
//! A Messages request is read by the typed translation core (`switchyard_wire`) and becomes
//! the chain's request in the unified form every adapter takes; the body as sent is kept
//! beside it ([`Native`]) for Anthropic models, which get it unchanged. On the way out, an
//! Anthropic model's answer passes as it came; any other kind's, in the unified shape, is
//! translated by the same core into a Messages answer or event stream.

use std::collections::BTreeMap;

use bytes::Bytes;
use http::{HeaderMap, HeaderName, HeaderValue};
use serde_json::value::RawValue;
use serde_json::{Value, json};

use switchyard_catalog::{Model, ProviderKind};
use switchyard_wire::core::Event;
use switchyard_wire::{chat, messages};

use crate::error::{ApiError, anthropic_error_type};
use crate::providers::Completion;
use crate::request::{ChatRequest, Native, with_fields};

/// Names the request's hints the serving model could not take (docs/messages.md).
pub const DROPPED_HINTS: HeaderName = HeaderName::from_static("x-dropped-hints");

/// The client's Anthropic beta flags.
const ANTHROPIC_BETA: HeaderName = HeaderName::from_static("anthropic-beta");

/// The gateway's own fields a Messages body may carry beside Anthropic's.
const GATEWAY_FIELDS: [&str; 4] = ["model", "models", "fallback_models", "redundancy"];

/// A Messages body read: its translation in the unified form, which the chain's request
/// borrows from, and what [`Native`] needs to keep the original.
pub struct Translated {
    /// A Chat Completions body with the gateway's fields as the client sent them.
    pub body: Vec<u8>,
    hints: Vec<&'static str>,
    reasoning: bool,
}

impl Translated {
    /// Reads a Messages body; a refusal names the field in Messages terms.
    pub fn of(body: &[u8]) -> Result<Self, ApiError> {
        let request = messages::parse_request(body).map_err(refused)?;
        // Every kind but Anthropic gets the unified form; whether a model takes the reasoning
        // ask is the adapter's to decide, per model (`reasoning` in the catalog).
        let (unified, _) = chat::request_body(&request, true);
        let gateway: BTreeMap<&str, &RawValue> = serde_json::from_slice(body).map_err(|e| {
            ApiError::invalid("body", format!("the body is not a JSON object ({e})"))
        })?;
        let format = response_format(gateway.get("output_config").copied())?;
        let body = with_fields(
            unified,
            GATEWAY_FIELDS
                .iter()
                .filter_map(|name| gateway.get(name).map(|v| (*name, *v)))
                .chain(format.as_deref().map(|f| ("response_format", f))),
        );
        let mut hints = request.hints;
        // A JSON schema every kind is asked for (as Chat's `response_format`) is no hint:
        // no model drops it, and `invalid_output` checks the answer against it.
        if format.is_some() {
            hints.retain(|hint| *hint != "output_config");
        }
        Ok(Self { body, hints, reasoning: request.reasoning.is_some() })
    }

    /// The chain's request: the translation, with the original body kept for Anthropic models.
    pub fn request<'a>(
        &'a self,
        original: &'a [u8],
        headers: &HeaderMap,
    ) -> Result<ChatRequest<'a>, ApiError> {
        let mut request = ChatRequest::parse(&self.body)?;
        let beta = headers.get(ANTHROPIC_BETA).cloned();
        request.native =
            Some(Native::messages(original, beta, self.hints.clone(), self.reasoning)?);
        request.translated = true;
        Ok(request)
    }
}

/// A `count_tokens` body: a Messages body without `max_tokens`, read as one, and the core's
/// estimate of its input tokens.
pub struct Counted {
    pub translated: Translated,
    pub estimate: u64,
}

impl Counted {
    pub fn of(body: &[u8]) -> Result<Self, ApiError> {
        let fields: BTreeMap<&str, &RawValue> = serde_json::from_slice(body).map_err(|e| {
            ApiError::invalid("body", format!("the body is not a JSON object ({e})"))
        })?;
        // `count_tokens` takes no `max_tokens`; the reader wants one, and the count ignores it.
        let one = serde_json::value::to_raw_value(&1).map_err(|_| ApiError::Internal)?;
        let with_max = match fields.contains_key("max_tokens") {
            true => body.to_vec(),
            false => with_fields(body.to_vec(), std::iter::once(("max_tokens", &*one))),
        };
        let request = messages::parse_request(&with_max).map_err(refused)?;
        let estimate = switchyard_wire::core::estimate_tokens(&request);
        Ok(Self { translated: Translated::of(&with_max)?, estimate })
    }
}

/// `output_config.format` (Anthropic's structured outputs) as Chat's `response_format`, when
/// it asks for a JSON schema.
fn response_format(output_config: Option<&RawValue>) -> Result<Option<Box<RawValue>>, ApiError> {
    #[derive(serde::Deserialize)]
    struct OutputConfig<'a> {
        #[serde(borrow)]
        format: Option<Format<'a>>,
    }
    #[derive(serde::Deserialize)]
    struct Format<'a> {
        #[serde(rename = "type")]
        kind: std::borrow::Cow<'a, str>,
        #[serde(borrow)]
        schema: Option<&'a RawValue>,
    }
    #[derive(serde::Serialize)]
    struct ResponseFormat<'a> {
        #[serde(rename = "type")]
        kind: &'static str,
        json_schema: JsonSchema<'a>,
    }
    #[derive(serde::Serialize)]
    struct JsonSchema<'a> {
        name: &'static str,
        schema: &'a RawValue,
    }
    let Some(raw) = output_config else { return Ok(None) };
    let config: OutputConfig<'_> = serde_json::from_str(raw.get())
        .map_err(|e| ApiError::invalid("output_config", format!("not readable ({e})")))?;
    let Some(Format { kind, schema: Some(schema) }) = config.format else { return Ok(None) };
    if kind != "json_schema" {
        return Ok(None);
    }
    let format =
        ResponseFormat { kind: "json_schema", json_schema: JsonSchema { name: "output", schema } };
    serde_json::value::to_raw_value(&format).map(Some).map_err(|_| ApiError::Internal)
}

fn refused(refusal: switchyard_wire::Refusal) -> ApiError {
    ApiError::invalid(refusal.field.clone(), refusal.to_string())
}

/// The `x-dropped-hints` of an answer `model` (of `kind`) gave, if any were dropped.
pub fn dropped_hints(
    request: &ChatRequest<'_>,
    kind: Option<ProviderKind>,
    model: &Model,
) -> Option<HeaderValue> {
    let native = request.native.as_ref()?;
    let dropped = native.dropped(kind?, model.reasoning);
    (!dropped.is_empty()).then(|| HeaderValue::from_str(&dropped.join(", ")).ok()).flatten()
}

/// A completion as a Messages answer named `name`, with the failover report when given.
pub fn answer(completion: &Completion, name: &str, report: Option<&RawValue>) -> Option<Vec<u8>> {
    let raw_name = serde_json::value::to_raw_value(name).ok()?;
    let extra = report.map(|r| ("secureai", r));
    if completion.messages {
        return Some(completion.to_json(&raw_name, extra));
    }
    let unified = completion.to_json(&raw_name, None);
    let response = chat::parse_completion(&unified).ok()?;
    let mut body = messages::response_body(&response, name);
    if let Some((key, value)) = extra {
        body = with_fields(body, std::iter::once((key, value)));
    }
    Some(body)
}

/// A designed (degraded) answer in the Messages shape: a plain message, or its stream.
pub fn degraded(text: &str, model: &str, report: &Value, stream: bool) -> Vec<u8> {
    let id = format!("msg_degraded_{:016x}", rand::random::<u64>());
    let answer = switchyard_wire::core::Response {
        id: id.clone(),
        model: model.to_owned(),
        parts: vec![switchyard_wire::core::Part::Text(text.to_owned())],
        finish: switchyard_wire::core::Finish::Stop,
        usage: switchyard_wire::core::Usage::default(),
    };
    if !stream {
        let body = messages::response_body(&answer, model);
        let report = serde_json::value::to_raw_value(report).ok();
        return with_fields(body, report.as_deref().map(|r| ("secureai", r)).into_iter());
    }
    let mut encoder = messages::Encoder::new(model);
    let mut frames = Vec::new();
    encoder.push(Event::Start { id, model: model.to_owned() }, &mut frames);
    encoder.push(Event::TextDelta(text.to_owned()), &mut frames);
    encoder.push(Event::Finish(switchyard_wire::core::Finish::Stop), &mut frames);
    encoder.finish(&mut frames);
    frames.iter().flat_map(|f| f.to_bytes()).collect()
}

/// Writes a stream's events as a Messages stream: an Anthropic model's events as they came
/// (each names itself in `type`), any other kind's unified chunks translated.
pub struct Framing {
    /// The served model's gateway name, which `message_start` carries.
    model: String,
    /// The failover report, which `message_start`'s message carries as `secureai`.
    report: Option<Box<RawValue>>,
    decoder: chat::ChunkDecoder,
    encoder: messages::Encoder,
    /// The stream passed an Anthropic model's events on.
    native: bool,
    /// `message_stop` went out.
    stopped: bool,
}

impl Framing {
    pub fn new(model: &str, report: Option<Box<RawValue>>) -> Self {
        Self {
            model: model.to_owned(),
            report,
            decoder: chat::ChunkDecoder::default(),
            encoder: messages::Encoder::new(model),
            native: false,
            stopped: false,
        }
    }

    /// The frames one event of the stream makes (often one, sometimes none).
    pub fn chunk(&mut self, fields: &mut BTreeMap<String, Box<RawValue>>) -> Option<Bytes> {
        if let Some(kind) =
            fields.get("type").and_then(|t| serde_json::from_str::<&str>(t.get()).ok())
        {
            let kind = kind.to_owned();
            self.native = true;
            match kind.as_str() {
                "message_start" => self.start(fields),
                "message_stop" => self.stopped = true,
                _ => {}
            }
            let data = serde_json::to_vec(fields).ok()?;
            return Some(frame(&kind, &data));
        }
        let data = serde_json::to_vec(fields).ok()?;
        let events = self.decoder.decode(&data).ok()?;
        let mut frames = Vec::new();
        for event in events {
            self.encoder.push(event, &mut frames);
        }
        if let Some(report) = &self.report
            && let Some(start) = frames.iter_mut().find(|f| f.event == "message_start")
            && let Ok(mut fields) =
                serde_json::from_slice::<BTreeMap<String, Box<RawValue>>>(&start.data)
        {
            with_report(&mut fields, report);
            start.data = serde_json::to_vec(&fields).unwrap_or_else(|_| start.data.clone());
        }
        join(&frames)
    }

    /// The frames that end a whole answer.
    pub fn done(&mut self) -> Option<Bytes> {
        if self.native {
            // An upstream that closed after its stop reason without `message_stop`.
            return (!std::mem::replace(&mut self.stopped, true))
                .then(|| frame("message_stop", b"{\"type\":\"message_stop\"}"));
        }
        let mut frames = Vec::new();
        self.encoder.finish(&mut frames);
        join(&frames)
    }

    /// The `error` event that ends a broken answer.
    pub fn error(&self, status: http::StatusCode, message: &str, code: &str) -> Bytes {
        let body = json!({"type": "error", "error": {
            "type": anthropic_error_type(status), "message": message, "code": code,
        }});
        frame("error", body.to_string().as_bytes())
    }

    /// `message_start` names the served model by its gateway name, and carries the report.
    fn start(&self, fields: &mut BTreeMap<String, Box<RawValue>>) {
        let Some(message) = fields.get("message") else { return };
        let Ok(mut message) =
            serde_json::from_str::<BTreeMap<String, Box<RawValue>>>(message.get())
        else {
            return;
        };
        if let Ok(name) = serde_json::value::to_raw_value(&self.model) {
            message.insert("model".into(), name);
        }
        if let Some(report) = &self.report {
            message.insert("secureai".into(), report.clone());
        }
        if let Ok(raw) = serde_json::value::to_raw_value(&message) {
            fields.insert("message".into(), raw);
        }
    }
}

/// Puts the report in a `message_start` event's message.
fn with_report(fields: &mut BTreeMap<String, Box<RawValue>>, report: &RawValue) {
    let Some(message) = fields.get("message") else { return };
    let Ok(mut message) = serde_json::from_str::<BTreeMap<String, Box<RawValue>>>(message.get())
    else {
        return;
    };
    message.insert("secureai".into(), report.to_owned());
    if let Ok(raw) = serde_json::value::to_raw_value(&message) {
        fields.insert("message".into(), raw);
    }
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

fn join(frames: &[messages::Frame]) -> Option<Bytes> {
    (!frames.is_empty())
        .then(|| Bytes::from(frames.iter().flat_map(|f| f.to_bytes()).collect::<Vec<u8>>()))
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn the_gateway_fields_ride_with_the_translation() {
        let body = br#"{"model":"claude","fallback_models":["gpt"],"max_tokens":10,"system":"be brief","messages":[{"role":"user","content":"hi"}]}"#;
        let translated = Translated::of(body).unwrap();
        let request = translated.request(body, &HeaderMap::new()).unwrap();
        assert_eq!(request.model.as_deref(), Some("claude"));
        assert_eq!(request.fallback_models.as_ref().map(Vec::len), Some(1));
        let messages: Value = serde_json::from_str(request.passthrough["messages"].get()).unwrap();
        assert_eq!(messages[0]["role"], "system");
        let native = request.native.unwrap();
        assert!(native.fields.contains_key("system") && !native.fields.contains_key("model"));
    }

    #[test]
    fn a_refusal_names_the_field_in_messages_terms() {
        let e =
            Translated::of(br#"{"model":"claude","messages":[{"role":"user","content":"hi"}]}"#)
                .err()
                .unwrap();
        assert!(
            matches!(&e, ApiError::InvalidRequest { param: Some(p), .. } if p == "max_tokens"),
            "{e:?}"
        );
    }

    #[test]
    fn a_json_schema_output_config_becomes_the_chains_response_format_and_no_hint() {
        let body = br#"{"model":"claude","max_tokens":10,"messages":[{"role":"user","content":"hi"}],"output_config":{"format":{"type":"json_schema","schema":{"type":"object"}}}}"#;
        let translated = Translated::of(body).unwrap();
        assert!(translated.hints.is_empty(), "{:?}", translated.hints);
        let request = translated.request(body, &HeaderMap::new()).unwrap();
        let format: Value =
            serde_json::from_str(request.passthrough["response_format"].get()).unwrap();
        assert_eq!(
            format,
            json!({"type": "json_schema",
                   "json_schema": {"name": "output", "schema": {"type": "object"}}})
        );
    }

    #[test]
    fn with_fields_appends_to_an_object() {
        let v = serde_json::value::to_raw_value(&json!(["a"])).unwrap();
        assert_eq!(with_fields(b"{}".to_vec(), [("m", &*v)].into_iter()), br#"{"m":["a"]}"#);
        assert_eq!(
            with_fields(b"{\"x\":1} ".to_vec(), [("m", &*v)].into_iter()),
            br#"{"x":1,"m":["a"]}"#
        );
    }
}
