//! OpenAI's Chat Completions wire format (`POST {base_url}/chat/completions`), also spoken
//! by OpenAI-compatible servers (vLLM, Mistral and the like). The client's body already is
//! this format: only `model` changes, every other field passes through byte for byte.

use std::collections::BTreeMap;

use bytes::Bytes;
use http::{StatusCode, header};
use http_body_util::Full;
use serde::Deserialize;
use serde_json::value::RawValue;

use switchyard_catalog::{Model, Provider};

use super::adapter::{Adapter, StreamDecoder};
use super::error::{CONTEXT_LENGTH_EXCEEDED, CallError, UpstreamError};
use super::secret::Secret;
use super::sse::Frame;
use super::unified::{Completion, Fields, StreamEvent, Usage};
use crate::embeddings::Embeddings;
use crate::request::ChatRequest;

pub struct OpenAi;

impl Adapter for OpenAi {
    fn body(&self, model: &Model, request: &ChatRequest<'_>) -> Result<Bytes, CallError> {
        Ok(Bytes::from(body(model, request)))
    }

    fn request(
        &self,
        provider: &Provider,
        _model: &Model,
        _stream: bool,
        body: Bytes,
        credential: Option<&Secret>,
    ) -> Result<http::Request<Full<Bytes>>, CallError> {
        let url = format!("{}/chat/completions", provider.base_url.trim_end_matches('/'));
        let mut builder = http::Request::post(url)
            .header(header::CONTENT_TYPE, "application/json")
            .header(header::ACCEPT, "application/json");
        if let Some(secret) = credential {
            builder = builder.header(header::AUTHORIZATION, format!("Bearer {}", secret.expose()));
        }
        builder.body(Full::new(body)).map_err(CallError::Build)
    }

    fn completion(&self, body: &[u8]) -> Result<Completion, CallError> {
        self.completion_bytes(Bytes::copy_from_slice(body))
    }

    fn completion_bytes(&self, body: Bytes) -> Result<Completion, CallError> {
        // Borrowed parse: only the tree of top-level fields is built; the body itself is
        // forwarded as received, with the `model` value swapped.
        let (model, usage) = {
            let fields: BTreeMap<&str, &RawValue> =
                serde_json::from_slice(&body).map_err(|e| CallError::Malformed(e.to_string()))?;
            if !fields.contains_key("choices") {
                return Err(CallError::Malformed("no `choices` in the completion".into()));
            }
            let start = body.as_ptr() as usize;
            let model = fields.get("model").map(|raw| {
                let at = raw.get().as_ptr() as usize - start;
                at..at + raw.get().len()
            });
            let usage = fields
                .get("usage")
                .and_then(|raw| serde_json::from_str::<WireUsage>(raw.get()).ok())
                .map(|u| Usage {
                    prompt_tokens: u.prompt_tokens,
                    completion_tokens: u.completion_tokens,
                })
                .unwrap_or_default();
            (model, usage)
        };
        Ok(Completion::new(Fields::Verbatim { bytes: body, model }, usage))
    }

    fn error(&self, status: StatusCode, body: &[u8]) -> UpstreamError {
        parse_error(status, body)
    }

    fn stream_decoder(&self, _upstream_model: &str) -> Box<dyn StreamDecoder> {
        Box::new(ChunkDecoder::default())
    }

    /// OpenAI's embeddings body is the client's, `model` swapped, as for chat.
    fn embeddings_body(
        &self,
        model: &Model,
        request: &ChatRequest<'_>,
        _embeddings: &Embeddings,
    ) -> Result<Bytes, CallError> {
        Ok(Bytes::from(body(model, request)))
    }

    fn embeddings_request(
        &self,
        provider: &Provider,
        _model: &Model,
        _embeddings: &Embeddings,
        body: Bytes,
        credential: Option<&Secret>,
    ) -> Result<http::Request<Full<Bytes>>, CallError> {
        let url = format!("{}/embeddings", provider.base_url.trim_end_matches('/'));
        let mut builder = http::Request::post(url)
            .header(header::CONTENT_TYPE, "application/json")
            .header(header::ACCEPT, "application/json");
        if let Some(secret) = credential {
            builder = builder.header(header::AUTHORIZATION, format!("Bearer {}", secret.expose()));
        }
        builder.body(Full::new(body)).map_err(CallError::Build)
    }

    fn embeddings(&self, body: Bytes, embeddings: &Embeddings) -> Result<Completion, CallError> {
        embeddings_answer(body, embeddings)
    }
}

/// An OpenAI-format embeddings answer, kept as it came (`model` swapped later); a server that
/// reports no usage is billed the input's estimate.
pub fn embeddings_answer(body: Bytes, embeddings: &Embeddings) -> Result<Completion, CallError> {
    #[derive(Deserialize)]
    struct Top<'a> {
        #[serde(borrow)]
        data: Option<&'a RawValue>,
        #[serde(borrow)]
        model: Option<&'a RawValue>,
        usage: Option<WireUsage>,
    }
    let (model, prompt_tokens) = {
        let top: Top<'_> = serde_json::from_slice(&body)
            .map_err(|e| CallError::Malformed(format!("not an embeddings list: {e}")))?;
        let count = match top.data {
            Some(data) => serde_json::from_str::<Vec<serde::de::IgnoredAny>>(data.get())
                .map_err(|e| CallError::Malformed(format!("`data`: {e}")))?
                .len(),
            None => return Err(CallError::Malformed("no `data` in the embeddings list".into())),
        };
        if count != embeddings.input.len() {
            return Err(CallError::Malformed(format!(
                "{count} vectors for {} inputs",
                embeddings.input.len()
            )));
        }
        let start = body.as_ptr() as usize;
        let model = top.model.map(|raw| {
            let at = raw.get().as_ptr() as usize - start;
            at..at + raw.get().len()
        });
        let tokens = top
            .usage
            .map(|u| u.prompt_tokens)
            .filter(|t| *t > 0)
            .unwrap_or_else(|| embeddings.input.estimated_tokens());
        (model, tokens)
    };
    let usage = Usage { prompt_tokens, completion_tokens: 0 };
    // Asked for base64, a server that answered floats (one that ignores `encoding_format`)
    // has its vectors encoded here, as OpenAI encodes them; floats pass as they came.
    if embeddings.base64 {
        let mut fields: BTreeMap<String, Box<RawValue>> = serde_json::from_slice(&body)
            .map_err(|e| CallError::Malformed(format!("not an embeddings list: {e}")))?;
        if let Some(data) = fields.get("data")
            && let Some(encoded) =
                crate::embeddings::reencoded(data, true).map_err(CallError::Malformed)?
        {
            fields.insert("data".into(), encoded);
            return Ok(Completion::new(Fields::Map(fields), usage));
        }
    }
    Ok(Completion::new(Fields::Verbatim { bytes: body, model }, usage))
}

/// OpenAI chunks are already in the unified shape; the decoder only follows which choices
/// have finished.
#[derive(Default)]
struct ChunkDecoder(Choices);

impl StreamDecoder for ChunkDecoder {
    fn decode(&mut self, frame: &Frame) -> Result<Vec<StreamEvent>, String> {
        Ok(decode_chunk(frame, &mut self.0)?.into_iter().collect())
    }
}

/// Which of a stream's choices have begun and which have had their finish reason, one bit
/// per choice `index` (an index past 63 shares the last bit: `n` that large is not served).
#[derive(Clone, Copy, Debug, Default)]
pub struct Choices {
    begun: u64,
    finished: u64,
}

impl Choices {
    fn bit(index: Option<u32>) -> u64 {
        1 << index.unwrap_or(0).min(63)
    }

    /// Every choice begun so far has finished.
    pub fn all_finished(&self) -> bool {
        self.begun != 0 && self.begun & !self.finished == 0
    }
}

/// One OpenAI SSE frame as a unified event (shared with providers that speak OpenAI's
/// stream format, e.g. Azure OpenAI); `choices` follows the stream's finish reasons.
pub fn decode_chunk(frame: &Frame, choices: &mut Choices) -> Result<Option<StreamEvent>, String> {
    {
        let data = frame.data.trim();
        if data == "[DONE]" {
            return Ok(Some(StreamEvent::Done));
        }
        let fields: BTreeMap<String, Box<RawValue>> =
            serde_json::from_str(data).map_err(|e| format!("a frame is not JSON: {e}"))?;
        if fields.contains_key("error") {
            return Ok(Some(StreamEvent::Error(parse_error(
                StatusCode::INTERNAL_SERVER_ERROR,
                data.as_bytes(),
            ))));
        }
        let probes: Vec<ChoiceProbe> = match fields.get("choices") {
            Some(raw) => serde_json::from_str(raw.get()).map_err(|e| format!("`choices`: {e}"))?,
            None => Vec::new(),
        };
        for probe in &probes {
            let bit = Choices::bit(probe.index);
            choices.begun |= bit;
            if probe.finish_reason.is_some() {
                choices.finished |= bit;
            }
        }
        let commits = probes.iter().any(ChoiceProbe::commits);
        let usage = fields
            .get("usage")
            .and_then(|raw| serde_json::from_str::<Option<WireUsage>>(raw.get()).ok().flatten())
            .map(|u| Usage {
                prompt_tokens: u.prompt_tokens,
                completion_tokens: u.completion_tokens,
            });
        let usage_only = probes.is_empty() && usage.is_some();
        let finished = choices.all_finished();
        Ok(Some(StreamEvent::Chunk { fields, commits, usage, usage_only, finished }))
    }
}

/// Just enough of a chunk's choice to know whether it carries content or ends its choice.
#[derive(Deserialize)]
struct ChoiceProbe {
    #[serde(default)]
    index: Option<u32>,
    #[serde(default)]
    delta: Option<DeltaProbe>,
    #[serde(default)]
    finish_reason: Option<String>,
}

#[derive(Deserialize)]
struct DeltaProbe {
    #[serde(default)]
    content: Option<String>,
    #[serde(default)]
    tool_calls: Option<serde::de::IgnoredAny>,
    #[serde(default)]
    refusal: Option<String>,
}

impl ChoiceProbe {
    fn commits(&self) -> bool {
        self.finish_reason.is_some()
            || self.delta.as_ref().is_some_and(|d| {
                d.content.as_deref().is_some_and(|c| !c.is_empty())
                    || d.tool_calls.is_some()
                    || d.refusal.as_deref().is_some_and(|r| !r.is_empty())
            })
    }
}

#[derive(Deserialize)]
struct WireUsage {
    #[serde(default)]
    prompt_tokens: u64,
    #[serde(default)]
    completion_tokens: u64,
}

#[derive(Deserialize)]
struct ErrorBody {
    error: ErrorDetail,
}

#[derive(Deserialize)]
struct ErrorDetail {
    #[serde(default)]
    message: String,
    #[serde(default, rename = "type")]
    kind: Option<String>,
    #[serde(default)]
    code: Option<serde_json::Value>,
    #[serde(default)]
    param: Option<String>,
}

/// OpenAI's error envelope `{"error": {"message", "type", "param", "code"}}`; anything else
/// becomes a generic message for its status (raw bodies are not shown to clients).
pub fn parse_error(status: StatusCode, body: &[u8]) -> UpstreamError {
    match serde_json::from_slice::<ErrorBody>(body) {
        Ok(ErrorBody { error }) => {
            let code = error.code.map(|c| match c {
                serde_json::Value::String(s) => s,
                other => other.to_string(),
            });
            // OpenAI codes it `context_length_exceeded`; OpenAI-compatible servers that keep
            // the envelope often leave the code out and keep OpenAI's message ("This model's
            // maximum context length is N tokens. However, ...").
            let too_long = code.is_none()
                && status == StatusCode::BAD_REQUEST
                && error.message.contains("maximum context length");
            UpstreamError {
                message: error.message,
                kind: error.kind.unwrap_or_else(|| default_kind(status).to_owned()),
                code: if too_long { Some(CONTEXT_LENGTH_EXCEEDED.to_owned()) } else { code },
                param: error.param,
            }
        }
        Err(_) => UpstreamError {
            message: format!("The upstream provider returned HTTP {}.", status.as_u16()),
            kind: default_kind(status).to_owned(),
            code: None,
            param: None,
        },
    }
}

fn default_kind(status: StatusCode) -> &'static str {
    if status.is_server_error() { "server_error" } else { "invalid_request_error" }
}

/// The client's body with `model` set to the upstream name.
pub fn body(model: &Model, request: &ChatRequest<'_>) -> Vec<u8> {
    let upstream_model = &model.upstream_model;
    // A request translated from another surface asks for reasoning in this format's terms;
    // a model the catalog does not mark `reasoning` would refuse the field (docs/messages.md).
    let drop_reasoning = request.translated && !model.reasoning;
    let mut out = Vec::with_capacity(
        256 + request.passthrough.values().map(|v| v.get().len() + 24).sum::<usize>(),
    );
    out.extend_from_slice(b"{\"model\":");
    // Serialising a &str into a Vec cannot fail.
    let _ = serde_json::to_writer(&mut out, upstream_model);
    if request.stream {
        // Always ask for the final usage chunk: usage is billed to the model that served.
        // The client sees it only if it asked (the node strips it otherwise).
        let mut options = request
            .passthrough
            .get("stream_options")
            .and_then(|raw| {
                serde_json::from_str::<serde_json::Map<String, serde_json::Value>>(raw.get()).ok()
            })
            .unwrap_or_default();
        options.insert("include_usage".into(), serde_json::Value::Bool(true));
        out.extend_from_slice(b",\"stream_options\":");
        let _ = serde_json::to_writer(&mut out, &options);
    }
    for (key, value) in &request.passthrough {
        if (request.stream && key == "stream_options")
            || (drop_reasoning && key == "reasoning_effort")
        {
            continue;
        }
        out.push(b',');
        let _ = serde_json::to_writer(&mut out, key);
        out.push(b':');
        out.extend_from_slice(value.get().as_bytes());
    }
    out.push(b'}');
    out
}

#[cfg(test)]
mod tests {
    use super::*;

    fn asked(body: &[u8]) -> Embeddings {
        Embeddings::parse(body).unwrap()
    }

    /// OpenAI's embeddings answer, as its API reference shows it.
    const LIST: &[u8] = br#"{"object":"list","data":[{"object":"embedding","index":0,"embedding":[1.0,-0.5]}],"model":"text-embedding-3-small","usage":{"prompt_tokens":5,"total_tokens":5}}"#;

    #[test]
    fn an_embeddings_answer_passes_as_it_came_named_by_the_gateway() {
        let answer =
            embeddings_answer(Bytes::from_static(LIST), &asked(br#"{"input":"a"}"#)).unwrap();
        assert_eq!(answer.usage, Usage { prompt_tokens: 5, completion_tokens: 0 });
        let name = serde_json::value::to_raw_value("openai/te3").unwrap();
        let out: serde_json::Value = serde_json::from_slice(&answer.to_json(&name, None)).unwrap();
        assert_eq!(out["model"], "openai/te3");
        assert_eq!(out["data"][0]["embedding"], serde_json::json!([1.0, -0.5]));
    }

    #[test]
    fn floats_answered_to_a_base64_ask_are_encoded_and_a_short_answer_is_malformed() {
        let base64 = asked(br#"{"input":"a","encoding_format":"base64"}"#);
        let answer = embeddings_answer(Bytes::from_static(LIST), &base64).unwrap();
        let name = serde_json::value::to_raw_value("openai/te3").unwrap();
        let out: serde_json::Value = serde_json::from_slice(&answer.to_json(&name, None)).unwrap();
        assert_eq!(out["data"][0]["embedding"], "AACAPwAAAL8=");
        assert_eq!(out["model"], "openai/te3");
        let two = asked(br#"{"input":["a","b"]}"#);
        let short = embeddings_answer(Bytes::from_static(LIST), &two);
        assert!(matches!(short, Err(CallError::Malformed(_))), "{short:?}");
    }

    #[test]
    fn embeddings_go_to_the_providers_embeddings_path() {
        let provider: Provider = serde_json::from_value(serde_json::json!({
            "name": "o", "kind": "openai", "base_url": "https://api.openai.com/v1/"}))
        .unwrap();
        let model: Model = serde_json::from_value(serde_json::json!({
            "name": "o/te3", "provider": "o", "upstream_model": "text-embedding-3-small",
            "type": "embedding", "dimensions": 1536}))
        .unwrap();
        let body = br#"{"model":"o/te3","input":"a","fallback_models":["x"]}"#;
        let request = ChatRequest::embeddings(body).unwrap();
        let embeddings = request.embeddings.clone().unwrap();
        let sent = OpenAi.embeddings_body(&model, &request, &embeddings).unwrap();
        assert_eq!(&sent[..], br#"{"model":"text-embedding-3-small","input":"a"}"#);
        let built = OpenAi.embeddings_request(&provider, &model, &embeddings, sent, None).unwrap();
        assert_eq!(built.uri().to_string(), "https://api.openai.com/v1/embeddings");
    }

    #[test]
    fn the_body_keeps_every_client_field_and_swaps_the_model() {
        let req = ChatRequest::parse(
            br#"{"model":"openai/gpt-5-nano","fallback_models":["x"],"messages":[{"role":"user","content":"h\u00e9"}],"temperature":0.2,"tools":[{"type":"function"}]}"#,
        )
        .unwrap();
        let model: Model = serde_json::from_value(serde_json::json!({
            "name": "openai/gpt-5-nano", "provider": "openai", "upstream_model": "gpt-5-nano",
        }))
        .unwrap();
        let sent: serde_json::Value = serde_json::from_slice(&body(&model, &req)).unwrap();
        assert_eq!(
            sent,
            serde_json::json!({"model":"gpt-5-nano","messages":[{"role":"user","content":"hé"}],"temperature":0.2,"tools":[{"type":"function"}]})
        );
    }

    #[test]
    fn a_completion_is_forwarded_verbatim_with_the_model_swapped_and_the_report_added() {
        let body = Bytes::from_static(
            b"{\"id\":\"c1\",\"model\":\"gpt-5-nano-2025\",\"choices\":[{\"message\":{\"content\":\"hi\"}}],\"usage\":{\"prompt_tokens\":3,\"completion_tokens\":1}} \n",
        );
        let c = OpenAi.completion_bytes(body).unwrap();
        assert_eq!(c.usage, Usage { prompt_tokens: 3, completion_tokens: 1 });
        let name = serde_json::value::to_raw_value("openai/gpt-5-nano").unwrap();
        let report =
            serde_json::value::to_raw_value(&serde_json::json!({"served_model": "x"})).unwrap();
        let out: serde_json::Value =
            serde_json::from_slice(&c.to_json(&name, Some(("secureai", &report)))).unwrap();
        assert_eq!(out["model"], "openai/gpt-5-nano");
        assert_eq!(out["secureai"]["served_model"], "x");
        assert_eq!(out["choices"][0]["message"]["content"], "hi");
        assert_eq!(out["id"], "c1");

        // A compatible server that leaves `model` out still gets one.
        let bare = OpenAi.completion_bytes(Bytes::from_static(b"{\"choices\":[]}")).unwrap();
        let out: serde_json::Value = serde_json::from_slice(&bare.to_json(&name, None)).unwrap();
        assert_eq!(out, serde_json::json!({"model": "openai/gpt-5-nano", "choices": []}));
    }

    #[test]
    fn a_completion_names_the_upstreams_model_and_its_finish_reasons_for_traces() {
        let body = Bytes::from_static(
            b"{\"model\":\"gpt-5-nano-2025\",\"choices\":[{\"finish_reason\":\"stop\"},{\"finish_reason\":\"length\"},{}]}",
        );
        let c = OpenAi.completion_bytes(body).unwrap();
        assert_eq!(c.upstream_model().as_deref(), Some("gpt-5-nano-2025"));
        assert_eq!(c.finish_reasons(), ["stop", "length"]);
        let bare = OpenAi.completion_bytes(Bytes::from_static(b"{\"choices\":[]}")).unwrap();
        assert_eq!((bare.upstream_model(), bare.finish_reasons()), (None, &[][..]));
    }

    #[test]
    fn openai_error_bodies_keep_message_type_and_code() {
        // Shape from OpenAI's API reference ("Error codes") and openai-python's APIError.
        let e = parse_error(
            StatusCode::BAD_REQUEST,
            br#"{"error":{"message":"This model's maximum context length is 8192 tokens.","type":"invalid_request_error","param":"messages","code":"context_length_exceeded"}}"#,
        );
        assert_eq!(e.kind, "invalid_request_error");
        assert_eq!(e.code.as_deref(), Some("context_length_exceeded"));
        assert_eq!(e.param.as_deref(), Some("messages"));
    }

    #[test]
    fn a_compatible_servers_context_length_message_without_a_code_is_recognised() {
        let e = parse_error(
            StatusCode::BAD_REQUEST,
            br#"{"error":{"message":"This model's maximum context length is 4096 tokens. However, you requested 5000 tokens.","type":"BadRequestError","param":null}}"#,
        );
        assert!(e.is_context_length(), "{e:?}");
        let openai = parse_error(
            StatusCode::BAD_REQUEST,
            br#"{"error":{"message":"x","type":"invalid_request_error","param":"messages","code":"context_length_exceeded"}}"#,
        );
        assert!(openai.is_context_length());
        let other = parse_error(
            StatusCode::BAD_REQUEST,
            br#"{"error":{"message":"Invalid value for 'temperature'.","type":"invalid_request_error"}}"#,
        );
        assert!(!other.is_context_length());
    }

    #[test]
    fn a_non_json_error_body_is_not_shown_raw() {
        let e = parse_error(StatusCode::BAD_GATEWAY, b"<html>nginx</html>");
        assert!(!e.message.contains("nginx"));
        assert_eq!(e.kind, "server_error");
    }
}
