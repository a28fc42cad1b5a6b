//! The node's OpenTelemetry spans and log records (docs/operating.md, "Traces and log
//! records"): a SERVER span per chat request, a CLIENT span per upstream call, both with the
//! GenAI semantic conventions and Switchyard's `switchyard.*` attributes, and each failover
//! event as a log record in its request's trace. Nothing here is made unless
//! [`switchyard_otel::enabled`]: the request path keeps its debug spans otherwise.

use http::HeaderMap;
use tracing::Span;
use tracing::field::Empty;

use switchyard_catalog::{Model, Provider};
use switchyard_otel::{AnyValue, Array, OpenTelemetrySpanExt, SPAN_TARGET, StringValue, Value};
use switchyard_proto::node::v1 as pb;

use crate::metrics::gen_ai_provider_name;
use crate::providers::unified::Completion;

/// The event name of a failover event's log record.
pub const FAILOVER_EVENT: &str = "api:model_failover";

pub use switchyard_otel::enabled;

/// Whether `span` is an OpenTelemetry span (not the debug span of a node without it).
fn live(span: &Span) -> bool {
    enabled() && !span.is_disabled()
}

/// The SERVER span of one chat request on `route`, continuing the client's `traceparent`.
/// Its name is `chat` until the request's model is known, then `chat {model}` ([`requested`]).
pub fn server_span(route: &'static str, headers: &HeaderMap, request_id: &str) -> Span {
    let span = tracing::info_span!(
        target: SPAN_TARGET,
        "chat",
        otel.kind = "server",
        otel.status_code = Empty,
        gen_ai.operation.name = "chat",
        http.request.method = "POST",
        http.route = route,
        http.response.status_code = Empty,
        error.type = Empty,
        switchyard.request_id = request_id,
        switchyard.key.id = Empty,
    );
    switchyard_otel::continue_trace(&span, headers);
    span
}

/// The model the client asked for (the chain's first).
pub fn requested(span: &Span, model: &str) {
    if !live(span) {
        return;
    }
    switchyard_otel::rename(span, format!("chat {model}"));
    span.set_attribute("gen_ai.request.model", model.to_owned());
}

/// The model that served (its gateway name), its provider and what it answered.
pub fn served(span: &Span, provider: &'static str, model: &str, failover: bool) {
    if !live(span) {
        return;
    }
    span.set_attribute("gen_ai.response.model", model.to_owned());
    if !provider.is_empty() {
        span.set_attribute("gen_ai.provider.name", provider);
    }
    span.set_attribute("switchyard.failover.occurred", failover);
}

/// A completion's usage and finish reasons, on a server or client span.
pub fn answered(span: &Span, completion: &Completion) {
    if !live(span) {
        return;
    }
    let usage = completion.usage;
    span.set_attribute(
        "gen_ai.usage.input_tokens",
        i64::try_from(usage.prompt_tokens).unwrap_or(i64::MAX),
    );
    span.set_attribute(
        "gen_ai.usage.output_tokens",
        i64::try_from(usage.completion_tokens).unwrap_or(i64::MAX),
    );
    let reasons: Vec<StringValue> =
        completion.finish_reasons().into_iter().map(StringValue::from).collect();
    if !reasons.is_empty() {
        span.set_attribute("gen_ai.response.finish_reasons", Value::Array(Array::String(reasons)));
    }
}

/// The HTTP status the request was answered with; a 5xx marks the span as an error, of
/// `error_type` (the OpenAI error's type) when given.
pub fn finished(span: &Span, status: u16, error_type: Option<&str>) {
    if !live(span) {
        return;
    }
    span.record("http.response.status_code", i64::from(status));
    if let Some(error_type) = error_type {
        span.record("error.type", error_type);
    }
    if status >= 500 {
        span.record("otel.status_code", "error");
    }
}

/// The CLIENT span of one upstream call: the `retry`th call of attempt `index` (the chain
/// entry), to `model` at `provider`.
pub fn client_span(model: &Model, provider: Option<&Provider>, index: usize, retry: u32) -> Span {
    let span = tracing::info_span!(
        target: SPAN_TARGET,
        "chat",
        otel.kind = "client",
        otel.name = format!("chat {}", model.upstream_model),
        otel.status_code = Empty,
        gen_ai.operation.name = "chat",
        gen_ai.request.model = model.upstream_model.as_str(),
        error.type = Empty,
        switchyard.model = model.name.as_str(),
        switchyard.attempt.index = index as i64,
        switchyard.attempt.retry = i64::from(retry),
        switchyard.failover.reason = Empty,
    );
    if let Some(provider) = provider {
        span.set_attribute("gen_ai.provider.name", gen_ai_provider_name(provider.kind));
        if let Ok(uri) = provider.base_url.parse::<http::Uri>() {
            if let Some(host) = uri.host() {
                span.set_attribute("server.address", host.trim_matches(['[', ']']).to_owned());
            }
            let port = uri.port_u16().or(match uri.scheme_str() {
                Some("https") => Some(443),
                Some("http") => Some(80),
                _ => None,
            });
            if let Some(port) = port {
                span.set_attribute("server.port", i64::from(port));
            }
        }
    }
    span
}

/// A call that answered: the model the upstream says it is and, for a completion, what it
/// answered.
pub fn call_answered(span: &Span, completion: Option<&Completion>) {
    if !live(span) {
        return;
    }
    if let Some(completion) = completion {
        if let Some(model) = completion.upstream_model() {
            span.set_attribute("gen_ai.response.model", model);
        }
        answered(span, completion);
    }
}

/// A call that failed: `error_type` is the failover reason when the chain may move on
/// (then also `switchyard.failover.reason`), else the upstream's HTTP status.
pub fn call_failed(span: &Span, error_type: &str, failover: bool) {
    if !live(span) {
        return;
    }
    span.record("error.type", error_type);
    if failover {
        span.record("switchyard.failover.reason", error_type);
    }
    span.record("otel.status_code", "error");
}

/// An injected fault (`switchyard chaos`, drills) touched the call or the request.
pub fn injected(span: &Span, fault: &str) {
    if !live(span) {
        return;
    }
    span.set_attribute("switchyard.injected", fault.to_owned());
}

/// Sends a failover event as a log record, in the trace of the current span (the request's).
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
