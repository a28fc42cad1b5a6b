//! The OTLP exporters of one signal's [`Export`]: gRPC on the workspace's tonic, or
//! OTLP/HTTP (`http/protobuf`) through a hyper client with the workspace's rustls, the same
//! client stack the node calls providers with (no reqwest, no second TLS library).
//!
//! The endpoint, protocol and timeout are set here from the checked settings; the exporter
//! reads the headers from the same variables itself (the settings only checked them).

use hyper_util::client::legacy::connect::HttpConnector;
use opentelemetry_http::hyper::HyperClient;
use opentelemetry_otlp::{WithExportConfig, WithHttpConfig, WithTonicConfig};

use crate::settings::{Export, OtelError, Protocol};

/// The span exporter `export` asks for.
pub fn spans(export: &Export) -> Result<opentelemetry_otlp::SpanExporter, OtelError> {
    let builder = opentelemetry_otlp::SpanExporter::builder();
    match export.protocol {
        Protocol::Grpc => grpc(builder.with_tonic(), export).build(),
        Protocol::HttpProtobuf => http(builder.with_http(), export).build(),
    }
    .map_err(|e| OtelError::Exporter { signal: "trace", why: e.to_string() })
}

/// The log record exporter `export` asks for.
pub fn logs(export: &Export) -> Result<opentelemetry_otlp::LogExporter, OtelError> {
    let builder = opentelemetry_otlp::LogExporter::builder();
    match export.protocol {
        Protocol::Grpc => grpc(builder.with_tonic(), export).build(),
        Protocol::HttpProtobuf => http(builder.with_http(), export).build(),
    }
    .map_err(|e| OtelError::Exporter { signal: "logs", why: e.to_string() })
}

fn grpc<B: WithExportConfig + WithTonicConfig>(builder: B, export: &Export) -> B {
    builder.with_endpoint(export.endpoint.clone()).with_timeout(export.timeout)
}

fn http<B: WithExportConfig + WithHttpConfig>(builder: B, export: &Export) -> B {
    builder
        .with_protocol(opentelemetry_otlp::Protocol::HttpBinary)
        .with_endpoint(export.endpoint.clone())
        .with_timeout(export.timeout)
        .with_http_client(client(export))
}

/// One pooled client per signal; the timeout bounds each request, the response body
/// included.
fn client(export: &Export) -> HyperClient<hyper_rustls::HttpsConnector<HttpConnector>> {
    let mut http = HttpConnector::new();
    // The connector below decides between http and https by the URL's scheme.
    http.enforce_http(false);
    http.set_nodelay(true);
    HyperClient::new(switchyard_tls::connect::public_web(http), export.timeout, None)
}
