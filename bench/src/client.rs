//! The bench's HTTP/1.1 client: keep-alive connections and one-off requests for setup,
//! checks and statistics.

use std::net::SocketAddr;
use std::sync::Arc;

use bytes::Bytes;
use http_body_util::{BodyExt, Full};
use hyper::client::conn::http1::SendRequest;
use hyper::{Request, header};
use hyper_util::rt::TokioIo;
use rustls::pki_types::pem::PemObject;
use rustls::pki_types::{CertificateDer, ServerName};
use serde_json::Value;
use tokio::net::TcpStream;

use crate::error::Result;

/// A keep-alive HTTP/1.1 connection to `addr`, with Nagle off as a client under load wants.
pub async fn connect(addr: SocketAddr) -> Result<SendRequest<Full<Bytes>>> {
    let stream = TcpStream::connect(addr).await.map_err(|e| format!("connect {addr}: {e}"))?;
    stream.set_nodelay(true).map_err(|e| format!("nodelay: {e}"))?;
    let (sender, conn) = hyper::client::conn::http1::handshake(TokioIo::new(stream))
        .await
        .map_err(|e| format!("handshake {addr}: {e}"))?;
    // The connection task ends when its sender is dropped.
    tokio::spawn(async move {
        let _ = conn.await;
    });
    Ok(sender)
}

/// TLS to a node's HTTPS listener (`tls-cost`): a client config trusting the bench's CA,
/// offering HTTP/1.1 only, and the name the certificate is for.
#[derive(Clone)]
pub struct Tls {
    pub config: Arc<rustls::ClientConfig>,
    pub name: ServerName<'static>,
}

impl Tls {
    /// Trusts the CA certificate(s) in `ca` (PEM) for `name`.
    pub fn new(ca: &std::path::Path, name: &str) -> Result<Self> {
        let mut roots = rustls::RootCertStore::empty();
        let certs =
            CertificateDer::pem_file_iter(ca).map_err(|e| format!("{}: {e}", ca.display()))?;
        for cert in certs {
            let cert = cert.map_err(|e| format!("{}: {e}", ca.display()))?;
            roots.add(cert).map_err(|e| format!("{}: {e}", ca.display()))?;
        }
        let provider = Arc::new(rustls::crypto::ring::default_provider());
        let mut config = rustls::ClientConfig::builder_with_provider(provider)
            .with_safe_default_protocol_versions()
            .map_err(|e| format!("TLS: {e}"))?
            .with_root_certificates(roots)
            .with_no_client_auth();
        config.alpn_protocols = vec![b"http/1.1".to_vec()];
        let name = ServerName::try_from(name.to_owned()).map_err(|e| format!("{name}: {e}"))?;
        Ok(Self { config: Arc::new(config), name })
    }
}

/// [`connect`] over TLS: the handshake is paid here, before any measured request.
pub async fn connect_tls(addr: SocketAddr, tls: &Tls) -> Result<SendRequest<Full<Bytes>>> {
    let stream = TcpStream::connect(addr).await.map_err(|e| format!("connect {addr}: {e}"))?;
    stream.set_nodelay(true).map_err(|e| format!("nodelay: {e}"))?;
    let stream = tokio_rustls::TlsConnector::from(Arc::clone(&tls.config))
        .connect(tls.name.clone(), stream)
        .await
        .map_err(|e| format!("TLS handshake with {addr}: {e}"))?;
    let (sender, conn) = hyper::client::conn::http1::handshake(TokioIo::new(stream))
        .await
        .map_err(|e| format!("handshake {addr}: {e}"))?;
    tokio::spawn(async move {
        let _ = conn.await;
    });
    Ok(sender)
}

/// One request on a fresh connection (setup and stats only, never in a measured loop).
pub async fn http(
    addr: SocketAddr,
    method: &str,
    path: &str,
    auth: Option<&str>,
    body: Option<String>,
) -> Result<(u16, Value)> {
    let mut sender = connect(addr).await?;
    let mut req = Request::builder()
        .method(method)
        .uri(path)
        .header(header::HOST, addr.to_string())
        .header(header::CONTENT_TYPE, "application/json");
    if let Some(key) = auth {
        req = req.header(header::AUTHORIZATION, format!("Bearer {key}"));
    }
    let req = req
        .body(Full::new(Bytes::from(body.unwrap_or_default())))
        .map_err(|e| format!("request: {e}"))?;
    let resp = sender.send_request(req).await.map_err(|e| format!("{method} {path}: {e}"))?;
    let status = resp.status().as_u16();
    let bytes =
        resp.into_body().collect().await.map_err(|e| format!("{method} {path}: {e}"))?.to_bytes();
    Ok((status, serde_json::from_slice(&bytes).unwrap_or(Value::Null)))
}

/// One `POST` on a fresh connection with `headers` beside `Host` and `Content-Type`: the
/// status, the response's headers and its whole body, unparsed (a stream's events too).
/// Setup and checks only, never in a measured loop.
pub async fn post(
    addr: SocketAddr,
    path: &str,
    headers: &[(&str, &str)],
    body: Bytes,
) -> Result<(u16, hyper::HeaderMap, Bytes)> {
    let mut sender = connect(addr).await?;
    let mut req = Request::post(path)
        .header(header::HOST, addr.to_string())
        .header(header::CONTENT_TYPE, "application/json");
    for (name, value) in headers {
        req = req.header(*name, *value);
    }
    let req = req.body(Full::new(body)).map_err(|e| format!("request: {e}"))?;
    let resp = sender.send_request(req).await.map_err(|e| format!("POST {path}: {e}"))?;
    let (parts, body) = resp.into_parts();
    let bytes = body.collect().await.map_err(|e| format!("POST {path}: {e}"))?.to_bytes();
    Ok((parts.status.as_u16(), parts.headers, bytes))
}

/// The node's Prometheus text (not JSON, so not through [`http`]).
pub async fn metrics_text(addr: SocketAddr) -> Result<String> {
    let mut sender = connect(addr).await?;
    let req = Request::get("/metrics")
        .header(header::HOST, addr.to_string())
        .body(Full::new(Bytes::new()))
        .map_err(|e| format!("request: {e}"))?;
    let resp = sender.send_request(req).await.map_err(|e| format!("GET /metrics: {e}"))?;
    let body = resp.into_body().collect().await.map_err(|e| format!("GET /metrics: {e}"))?;
    Ok(String::from_utf8_lossy(&body.to_bytes()).into_owned())
}

/// Opens `n` keep-alive HTTP/1.1 connections to `addr`, one after another.
pub async fn connect_many(addr: SocketAddr, n: usize) -> Result<Vec<SendRequest<Full<Bytes>>>> {
    let mut conns = Vec::with_capacity(n);
    for _ in 0..n {
        conns.push(connect(addr).await?);
    }
    Ok(conns)
}

/// `GET path` on an open keep-alive connection: the status only (the body is drained).
pub async fn get_status(
    sender: &mut SendRequest<Full<Bytes>>,
    host: &str,
    path: &str,
    auth: Option<&str>,
) -> Result<u16> {
    sender.ready().await.map_err(|e| format!("connection lost: {e}"))?;
    let mut req = Request::get(path).header(header::HOST, host);
    if let Some(key) = auth {
        req = req.header(header::AUTHORIZATION, format!("Bearer {key}"));
    }
    let req = req.body(Full::new(Bytes::new())).map_err(|e| format!("request: {e}"))?;
    let resp = sender.send_request(req).await.map_err(|e| format!("GET {path}: {e}"))?;
    let status = resp.status().as_u16();
    resp.into_body().collect().await.map_err(|e| format!("GET {path}: {e}"))?;
    Ok(status)
}
