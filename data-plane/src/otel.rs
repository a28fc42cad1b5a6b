//! The node's OpenTelemetry spans and log records (docs/operating.md, "Traces and log
//! records"): a SERVER span per chat request, a CLIENT span per upstream call, both with the
//! GenAI semantic conventions and Switchyard's `switchyard.*` attributes, and each failover
//! event as a log record in its request's trace. Nothing here is made unless
//! [`switchyard_otel::enabled`].
//!
//! The spans are made on the OpenTelemetry API, not as `tracing` spans: a span is an
//! OpenTelemetry [`Context`] holding it, run with the request (or the call) as its current
//! context (`opentelemetry::context::FutureExt::with_context`), which is how the upstream
//! call's `traceparent` and the failover log record find it. Every function here takes the
//! span's context as an `Option`: `None` when OpenTelemetry is off, so the request path only
//! pays the `enabled()` load.

use http::HeaderMap;
use opentelemetry::trace::{SpanBuilder, SpanKind, Status, TraceContextExt};
use opentelemetry::{Context, KeyValue};

use switchyard_catalog::{Model, Provider};
use switchyard_otel::{AnyValue, Array, StringValue, Value};
use switchyard_proto::node::v1 as pb;

use crate::metrics::gen_ai_provider_name;
use crate::providers::unified::Completion;

/// The event name of a failover event's log record.
pub const FAILOVER_EVENT: &str = "api:model_failover";

pub use switchyard_otel::enabled;

/// The span of the current OpenTelemetry context (the request's SERVER span on the request
/// path) when OpenTelemetry is on; `None`, looked up at no cost, otherwise. While the
/// collector is down the request has no span of its own, and the context's is empty.
pub fn current() -> Option<Context> {
    enabled().then(Context::current)
}

/// The SERVER span of one chat request on `route`, continuing the client's `traceparent`.
/// Its name is `chat` until the request's model is known, then `chat {model}` ([`requested`]).
/// `None` when OpenTelemetry is off.
pub fn server_span(route: &'static str, headers: &HeaderMap, request_id: &str) -> Option<Context> {
    if !switchyard_otel::span_wanted() {
        return None;
    }
    let builder = SpanBuilder::from_name("chat").with_kind(SpanKind::Server).with_attributes([
        KeyValue::new("gen_ai.operation.name", "chat"),
        KeyValue::new("http.request.method", "POST"),
        KeyValue::new("http.route", route),
        KeyValue::new("switchyard.request_id", request_id.to_owned()),
    ]);
    switchyard_otel::start(builder, &switchyard_otel::parent_of(headers))
}

/// The key the request was made with.
pub fn key(cx: Option<&Context>, key_id: &str) {
    if let Some(cx) = cx {
        cx.span().set_attribute(KeyValue::new("switchyard.key.id", key_id.to_owned()));
    }
}

/// The model the client asked for (the chain's first).
pub fn requested(cx: Option<&Context>, model: &str) {
    let Some(cx) = cx else { return };
    let span = cx.span();
    span.update_name(format!("chat {model}"));
    span.set_attribute(KeyValue::new("gen_ai.request.model", model.to_owned()));
}

/// The model that served (its gateway name), its provider and what it answered.
pub fn served(cx: Option<&Context>, provider: &'static str, model: &str, failover: bool) {
    let Some(cx) = cx else { return };
    let span = cx.span();
    span.set_attribute(KeyValue::new("gen_ai.response.model", model.to_owned()));
    if !provider.is_empty() {
        span.set_attribute(KeyValue::new("gen_ai.provider.name", provider));
    }
    span.set_attribute(KeyValue::new("switchyard.failover.occurred", failover));
}

/// A completion's usage and finish reasons, on a server or client span.
pub fn answered(cx: Option<&Context>, completion: &Completion) {
    let Some(cx) = cx else { return };
    let span = cx.span();
    let usage = completion.usage;
    span.set_attribute(KeyValue::new(
        "gen_ai.usage.input_tokens",
        i64::try_from(usage.prompt_tokens).unwrap_or(i64::MAX),
    ));
    span.set_attribute(KeyValue::new(
        "gen_ai.usage.output_tokens",
        i64::try_from(usage.completion_tokens).unwrap_or(i64::MAX),
    ));
    let reasons: Vec<StringValue> =
        completion.finish_reasons().iter().cloned().map(StringValue::from).collect();
    if !reasons.is_empty() {
        span.set_attribute(KeyValue::new(
            "gen_ai.response.finish_reasons",
            Value::Array(Array::String(reasons)),
        ));
    }
}

/// The HTTP status the request was answered with; a 5xx marks the span as an error, of
/// `error_type` (the OpenAI error's type) when given.
pub fn finished(cx: Option<&Context>, status: u16, error_type: Option<&str>) {
    let Some(cx) = cx else { return };
    let span = cx.span();
    span.set_attribute(KeyValue::new("http.response.status_code", i64::from(status)));
    if let Some(error_type) = error_type {
        span.set_attribute(KeyValue::new("error.type", error_type.to_owned()));
    }
    if status >= 500 {
        // No description, as before: `error.type` says what failed.
        span.set_status(Status::error(""));
    }
}

/// The CLIENT span of one upstream call: the `retry`th call of attempt `index` (the chain
/// entry), to `model` at `provider` (looked up only when the span is made), a child of the
/// current context's span (the request's). `None` when OpenTelemetry is off or paused.
pub fn client_span<'a>(
    model: &Model,
    provider: impl FnOnce() -> Option<&'a Provider>,
    index: usize,
    retry: u32,
) -> Option<Context> {
    if !switchyard_otel::span_wanted() {
        return None;
    }
    let provider = provider();
    let mut attributes = Vec::with_capacity(9);
    attributes.extend([
        KeyValue::new("gen_ai.operation.name", "chat"),
        KeyValue::new("gen_ai.request.model", model.upstream_model.clone()),
        KeyValue::new("switchyard.model", model.name.clone()),
        KeyValue::new("switchyard.attempt.index", i64::try_from(index).unwrap_or(i64::MAX)),
        KeyValue::new("switchyard.attempt.retry", i64::from(retry)),
    ]);
    if let Some(provider) = provider {
        attributes.push(KeyValue::new("gen_ai.provider.name", gen_ai_provider_name(provider.kind)));
        if let Ok(uri) = provider.base_url.parse::<http::Uri>() {
            if let Some(host) = uri.host() {
                attributes.push(KeyValue::new(
                    "server.address",
                    host.trim_matches(['[', ']']).to_owned(),
                ));
            }
            let port = uri.port_u16().or(match uri.scheme_str() {
                Some("https") => Some(443),
                Some("http") => Some(80),
                _ => None,
            });
            if let Some(port) = port {
                attributes.push(KeyValue::new("server.port", i64::from(port)));
            }
        }
    }
    let builder = SpanBuilder::from_name(format!("chat {}", model.upstream_model))
        .with_kind(SpanKind::Client)
        .with_attributes(attributes);
    Context::map_current(|parent| switchyard_otel::start(builder, parent))
}

/// A call that answered: the model the upstream says it is and, for a completion, what it
/// answered.
pub fn call_answered(cx: Option<&Context>, completion: Option<&Completion>) {
    let (Some(cx), Some(completion)) = (cx, completion) else { return };
    if let Some(model) = completion.upstream_model() {
        cx.span().set_attribute(KeyValue::new("gen_ai.response.model", model));
    }
    answered(Some(cx), completion);
}

/// A call that failed: `error_type` is the failover reason when the chain may move on
/// (then also `switchyard.failover.reason`), else the upstream's HTTP status.
pub fn call_failed(cx: Option<&Context>, error_type: &str, failover: bool) {
    let Some(cx) = cx else { return };
    let span = cx.span();
    span.set_attribute(KeyValue::new("error.type", error_type.to_owned()));
    if failover {
        span.set_attribute(KeyValue::new("switchyard.failover.reason", error_type.to_owned()));
    }
    span.set_status(Status::error(""));
}

/// An injected fault (`switchyard chaos`, drills) touched the call or the request.
pub fn injected(cx: Option<&Context>, fault: &str) {
    if let Some(cx) = cx {
        cx.span().set_attribute(KeyValue::new("switchyard.injected", fault.to_owned()));
    }
}

/// Sends a failover event as a log record, in the trace of the current OpenTelemetry
/// context's span (the request's).
pub fn failover_log(event: &pb::FailoverEvent) {
    if !switchyard_otel::logs_enabled() {
        return;
    }
    let first_reason =
        event.attempts.iter().find(|a| !a.reason.is_empty()).map_or("", |a| a.reason.as_str());
    let served = if event.served_model.is_empty() { "no model" } else { &event.served_model };
    let body =
        format!("failover on {}: {} served ({})", event.requested_model, served, first_reason);
    let attempts: Vec<AnyValue> = event
        .attempts
        .iter()
        .map(|a| {
            let mut fields = vec![
                ("model", AnyValue::from(a.model.clone())),
                ("status", AnyValue::from(a.status.clone())),
                ("latency_ms", AnyValue::from(i64::try_from(a.latency_ms).unwrap_or(i64::MAX))),
                ("retries", AnyValue::from(i64::from(a.retries))),
            ];
            if !a.reason.is_empty() {
                fields.push(("reason", AnyValue::from(a.reason.clone())));
            }
            if !a.injected.is_empty() {
                fields.push(("injected", AnyValue::from(a.injected.clone())));
            }
            if a.probe {
                fields.push(("probe", AnyValue::from(true)));
            }
            AnyValue::Map(Box::new(fields.into_iter().map(|(k, v)| (k.into(), v)).collect()))
        })
        .collect();
    let mut attributes = vec![
        ("switchyard.event.id", AnyValue::from(event.id.clone())),
        ("switchyard.node.id", AnyValue::from(event.node_id.clone())),
        ("switchyard.key.id", AnyValue::from(event.key_id.clone())),
        ("switchyard.request_id", AnyValue::from(event.request_id.clone())),
        ("gen_ai.request.model", AnyValue::from(event.requested_model.clone())),
        ("gen_ai.response.model", AnyValue::from(event.served_model.clone())),
        ("switchyard.failover.reason", AnyValue::from(first_reason.to_owned())),
        ("http.response.status_code", AnyValue::from(i64::from(event.status))),
        ("switchyard.stream", AnyValue::from(event.stream)),
        ("switchyard.surface", AnyValue::from(event.surface.clone())),
        ("switchyard.attempts", AnyValue::ListAny(Box::new(attempts))),
    ];
    if !event.degraded.is_empty() {
        attributes.push(("switchyard.degraded", AnyValue::from(event.degraded.clone())));
    }
    if let Some(fault) = event.attempts.iter().find(|a| !a.injected.is_empty()) {
        attributes.push(("switchyard.injected", AnyValue::from(fault.injected.clone())));
    }
    switchyard_otel::emit_log(FAILOVER_EVENT, body, attributes);
}
