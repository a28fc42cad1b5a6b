//! An OTLP collector for tests: the `opentelemetry-proto` trace and logs services over a
//! tonic server on loopback, keeping every span and log record real `switchyard` processes
//! export, with the `service.name` of the process that sent it. Tests poll it with
//! [`crate::eventually`].

use std::net::SocketAddr;
use std::sync::{Arc, Mutex};

use opentelemetry_proto::tonic::collector::logs::v1::logs_service_server::{
    LogsService, LogsServiceServer,
};
use opentelemetry_proto::tonic::collector::logs::v1::{
    ExportLogsServiceRequest, ExportLogsServiceResponse,
};
use opentelemetry_proto::tonic::collector::trace::v1::trace_service_server::{
    TraceService, TraceServiceServer,
};
use opentelemetry_proto::tonic::collector::trace::v1::{
    ExportTraceServiceRequest, ExportTraceServiceResponse,
};
use opentelemetry_proto::tonic::common::v1::any_value::Value;
use opentelemetry_proto::tonic::common::v1::{AnyValue, KeyValue};
use opentelemetry_proto::tonic::logs::v1::LogRecord;
use opentelemetry_proto::tonic::resource::v1::Resource;
use tonic::{Request, Response, Status};

pub use opentelemetry_proto::tonic::trace::v1::Span as OtlpSpan;
pub use opentelemetry_proto::tonic::trace::v1::span::SpanKind;
pub use opentelemetry_proto::tonic::trace::v1::status::StatusCode as SpanStatusCode;

/// What the collector received, each with its sender's `service.name`.
#[derive(Default)]
struct Received {
    spans: Vec<(String, OtlpSpan)>,
    logs: Vec<(String, LogRecord)>,
}

#[derive(Clone, Default)]
struct Sink(Arc<Mutex<Received>>);

#[tonic::async_trait]
impl TraceService for Sink {
    async fn export(
        &self,
        request: Request<ExportTraceServiceRequest>,
    ) -> Result<Response<ExportTraceServiceResponse>, Status> {
        let mut received = self.0.lock().unwrap();
        for resource_spans in request.into_inner().resource_spans {
            let service = service_name(resource_spans.resource.as_ref());
            for scope in resource_spans.scope_spans {
                received.spans.extend(scope.spans.into_iter().map(|s| (service.clone(), s)));
            }
        }
        Ok(Response::new(ExportTraceServiceResponse::default()))
    }
}

#[tonic::async_trait]
impl LogsService for Sink {
    async fn export(
        &self,
        request: Request<ExportLogsServiceRequest>,
    ) -> Result<Response<ExportLogsServiceResponse>, Status> {
        let mut received = self.0.lock().unwrap();
        for resource_logs in request.into_inner().resource_logs {
            let service = service_name(resource_logs.resource.as_ref());
            for scope in resource_logs.scope_logs {
                received.logs.extend(scope.log_records.into_iter().map(|l| (service.clone(), l)));
            }
        }
        Ok(Response::new(ExportLogsServiceResponse::default()))
    }
}

fn service_name(resource: Option<&Resource>) -> String {
    resource.and_then(|r| str_attr(&r.attributes, "service.name")).unwrap_or_default()
}

/// A running collector; stops when dropped.
pub struct Collector {
    pub addr: SocketAddr,
    sink: Sink,
    server: tokio::task::JoinHandle<()>,
}

impl Collector {
    pub async fn start() -> Collector {
        let listener = tokio::net::TcpListener::bind("127.0.0.1:0").await.unwrap();
        let addr = listener.local_addr().unwrap();
        let sink = Sink::default();
        let router = tonic::transport::Server::builder()
            .add_service(TraceServiceServer::new(sink.clone()))
            .add_service(LogsServiceServer::new(sink.clone()));
        let server = tokio::spawn(async move {
            let incoming = tokio_stream::wrappers::TcpListenerStream::new(listener);
            let _ = router.serve_with_incoming(incoming).await;
        });
        Collector { addr, sink, server }
    }

    /// The value for `OTEL_EXPORTER_OTLP_ENDPOINT`.
    pub fn endpoint(&self) -> String {
        format!("http://{}", self.addr)
    }

    /// Every span received so far, with its sender's `service.name`.
    pub fn spans(&self) -> Vec<(String, OtlpSpan)> {
        self.sink.0.lock().unwrap().spans.clone()
    }

    /// Every log record received so far, with its sender's `service.name`.
    pub fn logs(&self) -> Vec<(String, LogRecord)> {
        self.sink.0.lock().unwrap().logs.clone()
    }
}

impl Drop for Collector {
    fn drop(&mut self) {
        self.server.abort();
    }
}

/// An attribute's value.
pub fn attr<'a>(attributes: &'a [KeyValue], key: &str) -> Option<&'a Value> {
    attributes.iter().find(|kv| kv.key == key)?.value.as_ref()?.value.as_ref()
}

pub fn str_attr(attributes: &[KeyValue], key: &str) -> Option<String> {
    match attr(attributes, key)? {
        Value::StringValue(s) => Some(s.clone()),
        _ => None,
    }
}

pub fn int_attr(attributes: &[KeyValue], key: &str) -> Option<i64> {
    match attr(attributes, key)? {
        Value::IntValue(n) => Some(*n),
        _ => None,
    }
}

pub fn bool_attr(attributes: &[KeyValue], key: &str) -> Option<bool> {
    match attr(attributes, key)? {
        Value::BoolValue(b) => Some(*b),
        _ => None,
    }
}

/// A string-array attribute (e.g. `gen_ai.response.finish_reasons`).
pub fn strings_attr(attributes: &[KeyValue], key: &str) -> Option<Vec<String>> {
    match attr(attributes, key)? {
        Value::ArrayValue(array) => array
            .values
            .iter()
            .map(|v: &AnyValue| match v.value.as_ref()? {
                Value::StringValue(s) => Some(s.clone()),
                _ => None,
            })
            .collect(),
        _ => None,
    }
}

/// Bytes as lower-case hex, as ids are written in a `traceparent`.
pub fn hex(bytes: &[u8]) -> String {
    bytes.iter().map(|b| format!("{b:02x}")).collect()
}
