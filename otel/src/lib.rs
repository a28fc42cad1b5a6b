//! OpenTelemetry for Switchyard's servers (docs/operating.md, "Traces and log records"):
//! off unless an OTLP endpoint is set in the standard `OTEL_*` variables; then spans of the
//! target [`SPAN_TARGET`] become OTLP spans, [`emit_log`] sends log records, both exported
//! over gRPC by one task per signal, off the request path, with every dropped record
//! counted ([`dropped`]).
//!
//! Both planes use it; neither imports the other. `settings` reads the environment,
//! `dropped` holds the drop counter, `batch` the export queues, `context` what the request
//! path calls.
#![forbid(unsafe_code)]

mod batch;
mod context;
mod dropped;
mod settings;

use opentelemetry::trace::TracerProvider as _;
use opentelemetry_sdk::Resource;
use opentelemetry_sdk::logs::{LogExporter as _, SdkLoggerProvider};
use opentelemetry_sdk::trace::{SdkTracerProvider, SpanExporter as _};
use tracing_subscriber::Layer;
use tracing_subscriber::filter::Targets;
use tracing_subscriber::registry::LookupSpan;

pub use context::{SPAN_TARGET, continue_trace, emit_log, enabled, inject, rename};
pub use dropped::{DroppedLabels, HELP as DROPPED_HELP, NAME as DROPPED_NAME, dropped};
pub use opentelemetry::logs::AnyValue;
pub use opentelemetry::{Array, StringValue, Value};
pub use settings::{Batching, ENDPOINT, OtelError, Settings};
pub use tracing_opentelemetry::OpenTelemetrySpanExt;

/// The instrumentation scope of every span and log record.
const SCOPE: &str = "switchyard";

/// The exporters of a running process; [`Otel::shutdown`] sends what is still queued.
pub struct Otel {
    tracer: SdkTracerProvider,
    logger: SdkLoggerProvider,
}

/// Reads the standard variables: `None` when OpenTelemetry is off, an error naming the
/// variable when one is wrong. `default_service_name` is `service.name` unless the
/// environment names one.
pub fn settings_from_env(
    default_service_name: &'static str,
) -> Result<Option<Settings>, OtelError> {
    Settings::from_env(default_service_name, |name| std::env::var(name).ok())
}

/// Builds the exporters and starts their tasks; call inside the Tokio runtime, before the
/// server starts.
pub fn init(settings: &Settings) -> Result<Otel, OtelError> {
    let mut resource = Resource::builder();
    if let Some(name) = settings.default_service_name {
        resource = resource.with_service_name(name);
    }
    let resource = resource.build();

    let mut spans = opentelemetry_otlp::SpanExporter::builder()
        .with_tonic()
        .build()
        .map_err(|e| OtelError::Exporter { signal: "trace", why: e.to_string() })?;
    spans.set_resource(&resource);
    let spans = batch::Queue::start("spans", settings.spans, batch::Spans(spans));
    let tracer = SdkTracerProvider::builder()
        .with_resource(resource.clone())
        .with_span_processor(batch::SpanQueue(spans))
        .build();

    let mut logs = opentelemetry_otlp::LogExporter::builder()
        .with_tonic()
        .build()
        .map_err(|e| OtelError::Exporter { signal: "logs", why: e.to_string() })?;
    logs.set_resource(&resource);
    let logs = batch::Queue::start("logs", settings.logs, batch::Logs(logs));
    let logger = SdkLoggerProvider::builder()
        .with_resource(resource)
        .with_log_processor(batch::LogQueue(logs))
        .build();

    use opentelemetry::logs::LoggerProvider as _;
    context::install(logger.logger(SCOPE));
    // The counters exist from the start, so a scrape shows 0 rather than nothing.
    for signal in ["spans", "logs"] {
        for reason in ["queue_full", "export_failed"] {
            dropped::counter(signal, reason);
        }
    }
    Ok(Otel { tracer, logger })
}

impl Otel {
    /// The `tracing` layer that turns spans of [`SPAN_TARGET`] (and only those) into
    /// OpenTelemetry spans.
    pub fn layer<S>(&self) -> impl Layer<S> + use<S>
    where
        S: tracing::Subscriber + for<'span> LookupSpan<'span>,
    {
        tracing_opentelemetry::layer()
            .with_tracer(self.tracer.tracer(SCOPE))
            .with_location(false)
            .with_threads(false)
            .with_tracked_inactivity(false)
            .with_level(false)
            .with_target(false)
            .with_filter(Targets::new().with_target(SPAN_TARGET, tracing::Level::TRACE))
    }

    /// Exports what is still queued, waiting at most a few seconds. Blocks: call it from a
    /// blocking thread (`spawn_blocking`), not from a runtime worker.
    pub fn shutdown(self) {
        if let Err(e) = self.tracer.shutdown() {
            tracing::warn!(error = %e, "OpenTelemetry spans not all exported at exit");
        }
        if let Err(e) = self.logger.shutdown() {
            tracing::warn!(error = %e, "OpenTelemetry log records not all exported at exit");
        }
    }
}
