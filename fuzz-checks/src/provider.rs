//! Each provider adapter's decoders: a 200 body → a completion, an error body → the
//! upstream's error, and a streamed body (through the SSE parser) → unified stream events.
//!
//! Input layout: the first byte picks what the rest is fed to (even: a completion body and
//! an error body; odd: a streamed body). Invariants: no panic; an accepted completion
//! renders as a JSON object whose `model` is the gateway's name and which keeps `choices`;
//! every streamed chunk renders as a JSON object. Decoding stops at an end marker or an
//! in-band error, where the stream reader stops.

use std::collections::BTreeMap;

use bytes::Bytes;
use http::StatusCode;
use serde_json::Value;
use serde_json::value::RawValue;

use switchyard_data_plane::providers::sse::Parser;
use switchyard_data_plane::providers::{
    Adapter, CallError, Completion, StreamEvent, anthropic::Anthropic, azure::Azure,
    gemini::Gemini, openai::OpenAi,
};

/// OpenAI's format, through both adapters that speak it (OpenAI and Azure OpenAI).
pub fn openai(data: &[u8]) {
    check(&OpenAi, data);
    check(&Azure, data);
}

pub fn anthropic(data: &[u8]) {
    check(&Anthropic, data);
}

pub fn gemini(data: &[u8]) {
    check(&Gemini, data);
}

fn check(adapter: &dyn Adapter, data: &[u8]) {
    let Some((&mode, body)) = data.split_first() else { return };
    if mode % 2 == 0 {
        completion(adapter, body);
        let error = adapter.error(StatusCode::INTERNAL_SERVER_ERROR, body);
        let _ = adapter.status(StatusCode::BAD_REQUEST, &error);
    } else {
        stream(adapter, body);
    }
}

const GATEWAY_MODEL: &str = "gw/model";

fn completion(adapter: &dyn Adapter, body: &[u8]) {
    let completion = match adapter.completion_bytes(Bytes::copy_from_slice(body)) {
        Ok(c) => c,
        Err(CallError::Malformed(why)) => {
            assert!(!why.is_empty(), "a refusal says why");
            return;
        }
        // An error a provider reports in a 200 body is the upstream's error.
        Err(CallError::Http { .. }) => return,
        Err(e) => panic!("a 200 body is a completion or malformed, got {e}"),
    };
    let _ = completion.finish_reasons();
    let _ = completion.upstream_model();
    let _ = completion.choices();
    let model = raw(&Value::String(GATEWAY_MODEL.into()));
    let extra = raw(&serde_json::json!({"attempts": []}));
    for extra in [None, Some(("switchyard", &*extra))] {
        let out = completion.to_json(&model, extra);
        let object = json_object(&out, "the rendered completion");
        let model_out = object.get("model").map(|raw| raw.get());
        assert_eq!(model_out, Some(model.get()), "model is the gateway's");
        assert!(object.contains_key("choices"), "choices kept");
        if extra.is_some() {
            assert!(object.contains_key("switchyard"), "the extra field is added");
        }
    }
    render_fields(&completion);
}

fn render_fields(completion: &Completion) {
    if let Err(e) = serde_json::to_vec(&completion.fields) {
        panic!("the completion's fields do not serialise: {e}");
    }
}

fn stream(adapter: &dyn Adapter, body: &[u8]) {
    let mut parser = Parser::default();
    let mut decoder = adapter.stream_decoder("upstream-model");
    if parser.push(body).is_err() {
        return;
    }
    let mut ended = false;
    let mut finished = false;
    loop {
        let frame = match parser.next_frame() {
            Ok(Some(frame)) => frame,
            Ok(None) => break,
            Err(_) => return,
        };
        let events = match decoder.decode(&frame) {
            Ok(events) => events,
            Err(why) => {
                // The stream reader skips such a frame and reads on.
                assert!(!why.is_empty(), "a refusal says why");
                continue;
            }
        };
        for event in &events {
            check_event(event);
            if let StreamEvent::Chunk { finished: f, .. } = event {
                finished = *f;
            }
            if matches!(event, StreamEvent::Done | StreamEvent::Error(_)) {
                ended = true;
            }
        }
        if ended {
            // The stream reader stops at the end marker or an in-band error.
            return;
        }
    }
    // The body ended after every choice's finish reason: the reader closes the stream.
    if finished {
        decoder.close().iter().for_each(check_event);
    }
}

fn check_event(event: &StreamEvent) {
    if let StreamEvent::Chunk { fields, .. } = event {
        let mut out = Vec::new();
        out.push(b'{');
        for (i, (key, value)) in fields.iter().enumerate() {
            if i > 0 {
                out.push(b',');
            }
            out.extend_from_slice(Value::String(key.clone()).to_string().as_bytes());
            out.push(b':');
            out.extend_from_slice(value.get().as_bytes());
        }
        out.push(b'}');
        json_object(&out, "a streamed chunk");
        let _ = serde_json::to_string(&fields.iter().collect::<BTreeMap<_, _>>());
    }
}

fn raw(value: &Value) -> Box<RawValue> {
    match serde_json::value::to_raw_value(value) {
        Ok(raw) => raw,
        Err(e) => panic!("a JSON value is raw JSON: {e}"),
    }
}

/// `bytes` as a JSON object, its values raw. Raw, not a `Value` tree: JSON's grammar has no
/// limit on numbers, and an upstream's `1e400` is forwarded as it came (a tree would refuse
/// it as out of `f64`'s range; the `openai` target's first finding was that check, not the
/// node, being wrong).
fn json_object(bytes: &[u8], what: &str) -> BTreeMap<String, Box<RawValue>> {
    match serde_json::from_slice::<BTreeMap<String, Box<RawValue>>>(bytes) {
        Ok(map) => map,
        Err(e) => panic!("{what} is not a JSON object ({e}): {}", String::from_utf8_lossy(bytes)),
    }
}
