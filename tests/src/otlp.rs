//! An OTLP collector for tests, on loopback, in either protocol: the `opentelemetry-proto`
//! trace and logs services over a tonic server (OTLP/gRPC), or a hyper server taking
//! protobuf `POST`s (OTLP/HTTP, `http/protobuf`). It keeps every span and log record real
//! `switchyard` processes export, with the `service.name` of the process that sent it, and
//! (over HTTP) each request's path and headers. Tests poll it with [`crate::eventually`].

use std::convert::Infallible;
use std::net::SocketAddr;
use std::sync::{Arc, Mutex};

use http_body_util::{BodyExt, Full};
use hyper::body::{Bytes, Incoming};
use hyper::{HeaderMap, StatusCode};
use hyper_util::rt::TokioIo;

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
use prost::Message;
use tonic::{Request, Response, Status};

pub use opentelemetry_proto::tonic::trace::v1::Span as OtlpSpan;
pub use opentelemetry_proto::tonic::trace::v1::span::SpanKind;
pub use opentelemetry_proto::tonic::trace::v1::status::StatusCode as SpanStatusCode;

/// The protocol a [`Collector`] speaks; `as_str` is its `OTEL_EXPORTER_OTLP_PROTOCOL` value.
pub use switchyard_otel::Protocol;

/// One OTLP/HTTP request as it arrived.
#[derive(Clone, Debug)]
pub struct HttpExport {
    pub path: String,
    pub headers: HeaderMap,
}

/// What the collector received, each with its sender's `service.name`.
#[derive(Default)]
struct Received {
    spans: Vec<(String, OtlpSpan)>,
    logs: Vec<(String, LogRecord)>,
    http: Vec<HttpExport>,
}

#[derive(Clone, Default)]
struct Sink(Arc<Mutex<Received>>);

impl Sink {
    fn take_spans(&self, request: ExportTraceServiceRequest) {
        let mut received = self.0.lock().unwrap();
        for resource_spans in request.resource_spans {
            let service = service_name(resource_spans.resource.as_ref());
            for scope in resource_spans.scope_spans {
                received.spans.extend(scope.spans.into_iter().map(|s| (service.clone(), s)));
            }
        }
    }

    fn take_logs(&self, request: ExportLogsServiceRequest) {
        let mut received = self.0.lock().unwrap();
        for resource_logs in request.resource_logs {
            let service = service_name(resource_logs.resource.as_ref());
            for scope in resource_logs.scope_logs {
                received.logs.extend(scope.log_records.into_iter().map(|l| (service.clone(), l)));
            }
        }
    }

    /// One OTLP/HTTP request: a protobuf `POST` whose path ends in `traces` or `logs`
    /// (`/v1/traces` and `/v1/logs` unless the endpoint names a path of its own), answered
    /// as the OTLP/HTTP specification says: 200 with the protobuf response message, 415 for
    /// another content type, 400 for a body that does not decode.
    async fn http(&self, request: hyper::Request<Incoming>) -> hyper::Response<Full<Bytes>> {
        let path = request.uri().path().to_owned();
        let headers = request.headers().clone();
        let reply = |status: StatusCode, body: Vec<u8>| {
            let mut response = hyper::Response::new(Full::new(Bytes::from(body)));
            *response.status_mut() = status;
            response
                .headers_mut()
                .insert("content-type", "application/x-protobuf".parse().unwrap());
            response
        };
        if request.method() != hyper::Method::POST {
            return reply(StatusCode::METHOD_NOT_ALLOWED, Vec::new());
        }
        if headers.get("content-type").and_then(|v| v.to_str().ok())
            != Some("application/x-protobuf")
        {
            return reply(StatusCode::UNSUPPORTED_MEDIA_TYPE, Vec::new());
        }
        let Ok(body) = request.into_body().collect().await.map(|b| b.to_bytes()) else {
            return reply(StatusCode::BAD_REQUEST, Vec::new());
        };
        self.0.lock().unwrap().http.push(HttpExport { path: path.clone(), headers });
        if path.ends_with("traces") {
            match ExportTraceServiceRequest::decode(body) {
                Ok(request) => self.take_spans(request),
                Err(_) => return reply(StatusCode::BAD_REQUEST, Vec::new()),
            }
            reply(StatusCode::OK, ExportTraceServiceResponse::default().encode_to_vec())
        } else if path.ends_with("logs") {
            match ExportLogsServiceRequest::decode(body) {
                Ok(request) => self.take_logs(request),
                Err(_) => return reply(StatusCode::BAD_REQUEST, Vec::new()),
            }
            reply(StatusCode::OK, ExportLogsServiceResponse::default().encode_to_vec())
        } else {
            reply(StatusCode::NOT_FOUND, Vec::new())
        }
    }
}

#[tonic::async_trait]
impl TraceService for Sink {
    async fn export(
        &self,
        request: Request<ExportTraceServiceRequest>,
    ) -> Result<Response<ExportTraceServiceResponse>, Status> {
        self.take_spans(request.into_inner());
        Ok(Response::new(ExportTraceServiceResponse::default()))
    }
}

#[tonic::async_trait]
impl LogsService for Sink {
    async fn export(
        &self,
        request: Request<ExportLogsServiceRequest>,
    ) -> Result<Response<ExportLogsServiceResponse>, Status> {
        self.take_logs(request.into_inner());
        Ok(Response::new(ExportLogsServiceResponse::default()))
    }
}

fn service_name(resource: Option<&Resource>) -> String {
    resource.and_then(|r| str_attr(&r.attributes, "service.name")).unwrap_or_default()
}

/// A running collector; stops when dropped.
pub struct Collector {
    pub addr: SocketAddr,
    pub protocol: Protocol,
    sink: Sink,
    server: tokio::task::JoinHandle<()>,
}

impl Collector {
    /// A collector in `protocol`.
    pub async fn start_with(protocol: Protocol) -> Collector {
        match protocol {
            Protocol::Grpc => Self::start().await,
            Protocol::HttpProtobuf => Self::start_http().await,
        }
    }

    /// An OTLP/gRPC collector.
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
        Collector { addr, protocol: Protocol::Grpc, sink, server }
    }

    /// An OTLP/HTTP collector (HTTP/1.1, as the exporter speaks it to an `http` URL).
    pub async fn start_http() -> Collector {
        let listener = tokio::net::TcpListener::bind("127.0.0.1:0").await.unwrap();
        let addr = listener.local_addr().unwrap();
        let sink = Sink::default();
        let serving = sink.clone();
        let server = tokio::spawn(async move {
            // The connections end with the server: dropping the set aborts them.
            let mut connections = tokio::task::JoinSet::new();
            while let Ok((socket, _)) = listener.accept().await {
                let sink = serving.clone();
                connections.spawn(async move {
                    let service = hyper::service::service_fn(move |request| {
                        let sink = sink.clone();
                        async move { Ok::<_, Infallible>(sink.http(request).await) }
                    });
                    let _ = hyper::server::conn::http1::Builder::new()
                        .serve_connection(TokioIo::new(socket), service)
                        .await;
                });
            }
        });
        Collector { addr, protocol: Protocol::HttpProtobuf, sink, server }
    }

    /// Every OTLP/HTTP request received so far.
    pub fn http_exports(&self) -> Vec<HttpExport> {
        self.sink.0.lock().unwrap().http.clone()
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
    hex::encode(bytes)
}
