//! The client request parser: a `/v1/chat/completions` body → [`ChatRequest`].
//!
//! Invariants: a refused body is a 4xx naming what is wrong; an accepted one re-serialises
//! (its gateway fields written back, every other field as the bytes the client sent) and
//! re-parses to the same request; and every provider adapter either translates it into a
//! JSON body or refuses it as unsupported (never a body that is not JSON, never a panic).

use serde_json::value::RawValue;
use serde_json::{Map, Value, json};

use switchyard_catalog::Model;
use switchyard_data_plane::providers::{
    Adapter, CallError, anthropic::Anthropic, azure::Azure, gemini::Gemini, openai::OpenAi,
};
use switchyard_data_plane::request::{ChatRequest, EntrySpec, Redundancy};

pub fn check(data: &[u8]) {
    let request = match ChatRequest::parse(data) {
        Ok(request) => request,
        Err(e) => {
            let status = e.status();
            assert!(status.is_client_error(), "a refused body is a 4xx, got {status}: {e}");
            assert!(!e.to_string().is_empty(), "a refusal says why");
            return;
        }
    };
    let again = to_json(&request);
    let reparsed = match ChatRequest::parse(&again) {
        Ok(r) => r,
        Err(e) => panic!(
            "the re-serialised request does not parse ({e}): {}",
            String::from_utf8_lossy(&again)
        ),
    };
    assert_same(&request, &reparsed);
    translate(&request);
}

/// Every adapter's translation of an accepted request is JSON or a refusal.
fn translate(request: &ChatRequest<'_>) {
    let model = model();
    let adapters: [(&str, &dyn Adapter); 4] =
        [("openai", &OpenAi), ("azure", &Azure), ("anthropic", &Anthropic), ("gemini", &Gemini)];
    for (name, adapter) in adapters {
        match adapter.body(&model, request) {
            Ok(body) => {
                if let Err(e) = serde_json::from_slice::<Value>(&body) {
                    panic!("{name}: the upstream body is not JSON ({e})");
                }
            }
            Err(CallError::Unsupported { message, .. }) => {
                assert!(!message.is_empty(), "{name}: a refusal says why");
            }
            Err(e) => panic!("{name}: translating an accepted request failed: {e}"),
        }
    }
}

fn model() -> Model {
    Model {
        name: "gw/model".into(),
        provider: "p".into(),
        upstream_model: "upstream-model".into(),
        deployments: Vec::new(),
        balance: Default::default(),
        max_concurrency: None,
        adaptive: false,
        model_type: Default::default(),
        dimensions: None,
        price: None,
        stall_timeout_ms: None,
        breaker: None,
        retry: None,
        max_tokens: None,
        probe: None,
        continuation: Default::default(),
        context_window: None,
        reasoning: false,
    }
}

/// The request as a body again: the passthrough fields as raw JSON, the gateway's fields
/// written from their parsed values.
pub fn to_json(request: &ChatRequest<'_>) -> Vec<u8> {
    let mut out = Vec::new();
    out.push(b'{');
    let mut first = true;
    let mut field = |out: &mut Vec<u8>, key: &str, value: &str| {
        if !std::mem::take(&mut first) {
            out.push(b',');
        }
        out.extend_from_slice(Value::String(key.to_owned()).to_string().as_bytes());
        out.push(b':');
        out.extend_from_slice(value.as_bytes());
    };
    for (key, raw) in &request.passthrough {
        field(&mut out, key, raw.get());
    }
    if let Some(model) = &request.model {
        field(&mut out, "model", &json!(model).to_string());
    }
    if let Some(models) = &request.models {
        field(&mut out, "models", &entries(models).to_string());
    }
    if let Some(models) = &request.fallback_models {
        field(&mut out, "fallback_models", &entries(models).to_string());
    }
    if request.redundancy != Redundancy::default() {
        field(&mut out, "redundancy", &redundancy(&request.redundancy).to_string());
    }
    out.push(b'}');
    out
}

fn entries(entries: &[EntrySpec]) -> Value {
    Value::Array(
        entries
            .iter()
            .map(|e| {
                let mut o = Map::new();
                o.insert("model".into(), json!(e.model));
                if let Some(t) = e.timeout_ms {
                    o.insert("timeout_ms".into(), json!(t));
                }
                if let Some(t) = e.first_token_timeout_ms {
                    o.insert("first_token_timeout_ms".into(), json!(t));
                }
                Value::Object(o)
            })
            .collect(),
    )
}

fn redundancy(r: &Redundancy) -> Value {
    let mut o = Map::new();
    let numbers = [
        ("timeout_ms", r.timeout_ms),
        ("first_token_timeout_ms", r.first_token_timeout_ms),
        ("deadline_ms", r.deadline_ms),
        ("max_retries", r.max_retries),
    ];
    for (key, value) in numbers {
        if let Some(v) = value {
            o.insert(key.into(), json!(v));
        }
    }
    if let Some(on) = &r.on {
        o.insert("on".into(), on.iter().map(|r| r.as_str()).collect());
    }
    if let Some(d) = &r.degraded {
        let mut degraded = Map::new();
        degraded.insert("message".into(), json!(d.message));
        if d.when_all_open {
            degraded.insert("when_all_open".into(), json!(true));
        }
        o.insert("degraded".into(), Value::Object(degraded));
    }
    if let Some(b) = r.continue_streams {
        o.insert("continue_streams".into(), json!(b));
    }
    Value::Object(o)
}

fn assert_same(a: &ChatRequest<'_>, b: &ChatRequest<'_>) {
    let raw = |r: &ChatRequest<'_>| -> Vec<(String, String)> {
        r.passthrough.iter().map(|(k, v)| (k.to_string(), RawValue::get(v).to_owned())).collect()
    };
    assert_eq!(raw(a), raw(b), "passthrough fields");
    assert_eq!(a.model, b.model, "model");
    assert_eq!(a.models, b.models, "models");
    assert_eq!(a.fallback_models, b.fallback_models, "fallback_models");
    assert_eq!(a.redundancy, b.redundancy, "redundancy");
    assert_eq!(a.stream, b.stream, "stream");
    assert_eq!(a.include_usage, b.include_usage, "include_usage");
}
