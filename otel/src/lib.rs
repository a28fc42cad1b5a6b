//! OpenTelemetry for Switchyard's servers (docs/operating.md, "Traces and log records"):
//! off unless an OTLP endpoint is set in the standard `OTEL_*` variables; then spans started
//! with [`start`] and `tracing` spans of the target [`SPAN_TARGET`] become OTLP spans,
//! [`emit_log`] sends log records, both exported over OTLP/HTTP (`http/protobuf`, the
//! specification's default) or gRPC by one task per signal, off the request path, with every
//! dropped record counted ([`dropped`]).
//!
//! Both planes use it; neither imports the other. `settings` reads the environment,
//! `exporter` builds the OTLP exporters, `dropped` holds the drop counter, `batch` the
//! export queues, `context` what the request path calls.
#![forbid(unsafe_code)]

mod batch;
mod context;
mod dropped;
mod exporter;
mod settings;

use opentelemetry::trace::TracerProvider as _;
use opentelemetry_sdk::Resource;
use opentelemetry_sdk::logs::{LogExporter as _, SdkLoggerProvider};
use opentelemetry_sdk::trace::{SdkTracerProvider, SpanExporter as _};
use tracing_subscriber::Layer;
use tracing_subscriber::filter::Targets;
use tracing_subscriber::registry::LookupSpan;

pub use context::{
    SPAN_TARGET, continue_trace, emit_log, enabled, inject, logs_enabled, parent_of, span_wanted,
    start,
};
pub use dropped::{DroppedLabels, HELP as DROPPED_HELP, NAME as DROPPED_NAME, dropped};
pub use opentelemetry::logs::AnyValue;
pub use opentelemetry::{Array, StringValue, Value};
pub use settings::{Batching, ENDPOINT, Export, OtelError, Protocol, Settings};
pub use tracing_opentelemetry::OpenTelemetrySpanExt;

/// The instrumentation scope of every span and log record.
const SCOPE: &str = "switchyard";

/// The exporters of a running process; [`Otel::shutdown`] sends what is still queued.
pub struct Otel {
    tracer: Option<SdkTracerProvider>,
    logger: Option<SdkLoggerProvider>,
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

    let tracer = if let Some(export) = &settings.traces {
        let mut spans = exporter::spans(export)?;
        spans.set_resource(&resource);
        let spans = batch::Queue::start(
            "spans",
            settings.span_batches,
            batch::Spans(spans),
            &context::SPANS,
        );
        let provider = SdkTracerProvider::builder()
            .with_resource(resource.clone())
            .with_span_processor(batch::SpanQueue(spans))
            .build();
        Some(provider)
    } else {
        None
    };

    let logger = if let Some(export) = &settings.logs {
        let mut logs = exporter::logs(export)?;
        logs.set_resource(&resource);
        let logs =
            batch::Queue::start("logs", settings.log_batches, batch::Logs(logs), &context::LOGS);
        Some(
            SdkLoggerProvider::builder()
                .with_resource(resource)
                .with_log_processor(batch::LogQueue(logs))
                .build(),
        )
    } else {
        None
    };

    use opentelemetry::logs::LoggerProvider as _;
    context::install(
        tracer.as_ref().map(|t| t.tracer(SCOPE)),
        logger.as_ref().map(|l| l.logger(SCOPE)),
    );
    // The counters of what is exported exist from the start, so a scrape shows 0 rather
    // than nothing.
    for (signal, on) in [("spans", settings.traces.is_some()), ("logs", settings.logs.is_some())] {
        for reason in ["queue_full", "export_failed", "collector_down"] {
            if on {
                dropped::counter(signal, reason);
            }
        }
    }
    Ok(Otel { tracer, logger })
}

/// Says in the log, once the log output is set up, where each signal goes and how: the
/// protocol (and whether it is the default), the endpoint, the timeout and the names of the
/// headers, never their values. The default protocol is `http/protobuf` (the
/// specification's), where it used to be gRPC: an endpoint on the OTLP/gRPC port 4317 with
/// no protocol set (or on 4318 with `grpc`) is very likely a collector spoken to in the
/// wrong protocol, and gets a warning saying which variable to set.
pub fn announce(settings: &Settings) {
    for (signal, export) in [("traces", &settings.traces), ("logs", &settings.logs)] {
        let Some(export) = export else { continue };
        let protocol = export.protocol.as_str();
        let protocol_from = export.protocol_var.unwrap_or("default");
        tracing::info!(
            signal, protocol, protocol_from, endpoint = %export.endpoint_shown(),
            timeout_ms = export.timeout.as_millis() as u64,
            headers = %export.header_names.join(","),
            "OpenTelemetry export on"
        );
        if let Some(other) = export.port_suggests_other_protocol() {
            let other = other.as_str();
            tracing::warn!(
                signal, protocol, endpoint = %export.endpoint_shown(),
                "the endpoint's port is the one collectors take OTLP {other} on, but the protocol is {protocol} ({protocol_from}); if the collector expects {other} there, set OTEL_EXPORTER_OTLP_PROTOCOL={other}"
            );
        }
    }
}

impl Otel {
    /// The `tracing` layer that turns spans of [`SPAN_TARGET`] (and only those) into
    /// OpenTelemetry spans: the control plane's admin calls. The node makes its spans with
    /// [`start`] and needs no layer.
    pub fn layer<S>(&self) -> Option<impl Layer<S> + use<S>>
    where
        S: tracing::Subscriber + for<'span> LookupSpan<'span>,
    {
        let tracer = self.tracer.as_ref()?.tracer(SCOPE);
        let layer = tracing_opentelemetry::layer()
            .with_tracer(tracer)
            .with_location(false)
            .with_threads(false)
            .with_tracked_inactivity(false)
            .with_level(false)
            .with_target(false)
            .with_filter(Targets::new().with_target(SPAN_TARGET, tracing::Level::TRACE));
        Some(layer)
    }

    /// Exports what is still queued, waiting at most a few seconds. Blocks: call it from a
    /// blocking thread (`spawn_blocking`), not from a runtime worker.
    pub fn shutdown(self) {
        if let Some(Err(e)) = self.tracer.map(|t| t.shutdown()) {
            tracing::warn!(error = %e, "OpenTelemetry spans not all exported at exit");
        }
        if let Some(Err(e)) = self.logger.map(|l| l.shutdown()) {
            tracing::warn!(error = %e, "OpenTelemetry log records not all exported at exit");
        }
    }
}
