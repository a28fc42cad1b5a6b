//! The request path's side: whether OpenTelemetry is on, spans started straight on the
//! OpenTelemetry API, a client's W3C `traceparent` continued, the current context put on an
//! outgoing request, a log record sent in the current trace. Everything here is one relaxed
//! atomic load when OpenTelemetry is off.
//!
//! The node's request path uses the OpenTelemetry API directly ([`start`], [`parent_of`],
//! the current [`Context`]): a `tracing` span per request and per upstream call, turned into
//! an OpenTelemetry span by `tracing-opentelemetry`, costs far more CPU than the span itself
//! (the layered subscriber's bookkeeping, field visitors, extensions). The control plane's
//! admin calls, few and off the data path, keep `tracing` spans ([`continue_trace`],
//! `Otel::layer`).

use std::sync::OnceLock;
use std::sync::atomic::{AtomicBool, Ordering};
use std::time::SystemTime;

use http::{HeaderMap, HeaderName, HeaderValue};
use opentelemetry::Context;
use opentelemetry::logs::{AnyValue, LogRecord, Logger, Severity};
use opentelemetry::propagation::{Extractor, Injector, TextMapPropagator};
use opentelemetry::trace::{SpanBuilder, TraceContextExt, Tracer};
use opentelemetry_sdk::logs::SdkLogger;
use opentelemetry_sdk::propagation::TraceContextPropagator;
use opentelemetry_sdk::trace::SdkTracer;
use prometheus_client::metrics::counter::Counter;
use tracing_opentelemetry::OpenTelemetrySpanExt;

use crate::dropped::counter;

/// The target of the `tracing` spans that become OpenTelemetry spans (the control plane's):
/// only these reach the exporter, and the log output leaves them out.
pub const SPAN_TARGET: &str = "switchyard_otel::spans";

static ENABLED: AtomicBool = AtomicBool::new(false);
static LOGGER: OnceLock<SdkLogger> = OnceLock::new();
static TRACER: OnceLock<SdkTracer> = OnceLock::new();

/// Spans' and log records' exporters, while they wait out a collector that refused their
/// last batch ([`crate::batch`]): everything made meanwhile would be dropped unexported, so
/// the request path makes none and counts each one it did not make as dropped
/// (`collector_down`). A node whose collector is down pays for nothing it cannot deliver.
pub(crate) static SPANS: Pause = Pause::new("spans");
pub(crate) static LOGS: Pause = Pause::new("logs");

pub(crate) struct Pause {
    paused: AtomicBool,
    signal: &'static str,
    dropped: OnceLock<Counter>,
}

impl Pause {
    pub(crate) const fn new(signal: &'static str) -> Self {
        Self { paused: AtomicBool::new(false), signal, dropped: OnceLock::new() }
    }

    pub(crate) fn set(&self, paused: bool) {
        self.paused.store(paused, Ordering::Release);
    }

    pub(crate) fn is_paused(&self) -> bool {
        self.paused.load(Ordering::Acquire)
    }

    /// One record of this signal not made (or dropped) while paused.
    pub(crate) fn count(&self) {
        self.dropped.get_or_init(|| counter(self.signal, "collector_down")).inc();
    }
}

/// Whether this process exports spans: callers look for a current span, or make one (with
/// [`span_wanted`]), only then, so the request path pays nothing for them when it does not.
pub fn enabled() -> bool {
    ENABLED.load(Ordering::Relaxed)
}

/// Whether to make a span now: [`enabled`], and the exporter not waiting for the collector
/// to come back. A span not made because the collector is down is counted as dropped; a
/// span made before the pause keeps taking attributes. Call it once per span the caller
/// would make.
pub fn span_wanted() -> bool {
    if !ENABLED.load(Ordering::Relaxed) {
        return false;
    }
    if SPANS.is_paused() {
        SPANS.count();
        return false;
    }
    true
}

/// Whether this process exports log records ([`emit_log`] does nothing otherwise).
pub fn logs_enabled() -> bool {
    LOGGER.get().is_some()
}

pub(crate) fn install(tracer: Option<SdkTracer>, logger: Option<SdkLogger>) {
    if let Some(logger) = logger {
        let _ = LOGGER.set(logger);
    }
    let traces = tracer.is_some();
    if let Some(tracer) = tracer {
        // Once per process: a second `init` (tests) keeps the first tracer.
        let _ = TRACER.set(tracer);
    }
    ENABLED.store(traces, Ordering::Relaxed);
}

/// Starts a span from `builder` (its name, kind and attributes) as a child of `parent`'s
/// span, or of none, and returns `parent` with it as its span: the span ends when the last
/// clone of that context is dropped. `None` when this process exports no spans.
pub fn start(builder: SpanBuilder, parent: &Context) -> Option<Context> {
    let tracer = TRACER.get()?;
    let span = tracer.build_with_context(builder, parent);
    Some(parent.with_span(span))
}

/// The context of a request's `traceparent` (and `tracestate`), to be its span's parent when
/// it carries a valid one; otherwise an empty context, and the span starts a trace.
pub fn parent_of(headers: &HeaderMap) -> Context {
    TraceContextPropagator::new().extract_with_context(&Context::new(), &Headers(headers))
}

/// Makes `span` (not yet entered) continue the trace of the request's `traceparent` (and
/// `tracestate`), when it carries a valid one; otherwise `span` starts a trace.
pub fn continue_trace(span: &tracing::Span, headers: &HeaderMap) {
    if !enabled() {
        return;
    }
    let parent = TraceContextPropagator::new().extract(&Headers(headers));
    if parent.span().span_context().is_valid() {
        // Fails only for a span that is disabled or already started: then it keeps its own.
        let _ = span.set_parent(parent);
    }
}

/// Puts the current OpenTelemetry context's span on an outgoing request as `traceparent`
/// (and `tracestate`), so the upstream's own traces join the caller's.
pub fn inject(headers: &mut HeaderMap) {
    if !enabled() {
        return;
    }
    Context::map_current(|cx| {
        if cx.span().span_context().is_valid() {
            TraceContextPropagator::new().inject_context(cx, &mut HeadersMut(headers));
        }
    });
}

/// Sends one log record named `event_name`, in the trace of the current OpenTelemetry
/// context's span.
pub fn emit_log(event_name: &'static str, body: String, attributes: Vec<(&'static str, AnyValue)>) {
    let Some(logger) = LOGGER.get() else { return };
    if LOGS.is_paused() {
        LOGS.count();
        return;
    }
    let mut record = logger.create_log_record();
    record.set_event_name(event_name);
    record.set_timestamp(SystemTime::now());
    record.set_severity_number(Severity::Info);
    record.set_severity_text("INFO");
    record.set_body(AnyValue::from(body));
    record.add_attributes(attributes);
    Context::map_current(|cx| {
        let span = cx.span();
        let sc = span.span_context();
        if sc.is_valid() {
            record.set_trace_context(sc.trace_id(), sc.span_id(), Some(sc.trace_flags()));
        }
    });
    logger.emit(record);
}

struct Headers<'a>(&'a HeaderMap);

impl Extractor for Headers<'_> {
    fn get(&self, key: &str) -> Option<&str> {
        self.0.get(key).and_then(|v| v.to_str().ok())
    }

    fn keys(&self) -> Vec<&str> {
        self.0.keys().map(HeaderName::as_str).collect()
    }
}

struct HeadersMut<'a>(&'a mut HeaderMap);

impl Injector for HeadersMut<'_> {
    fn set(&mut self, key: &str, value: String) {
        if let (Ok(name), Ok(value)) =
            (HeaderName::from_bytes(key.as_bytes()), HeaderValue::from_str(&value))
        {
            self.0.insert(name, value);
        }
    }
}
