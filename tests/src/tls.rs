//! HTTPS from the test's side: a rustls client of its own (not Switchyard's TLS code) that
//! trusts one CA file, for nodes whose listener serves TLS.

use std::net::SocketAddr;
use std::path::Path;
use std::sync::Arc;

use rustls::pki_types::pem::PemObject;
use rustls::pki_types::{CertificateDer, ServerName};

use crate::{HttpResponse, http_send, read_response};

/// A TLS connection to `addr` for the name `host`, trusting `ca`, offering `alpn`; the
/// negotiated protocol comes back with it. `Err` says why the handshake failed.
pub async fn connect(
    addr: SocketAddr,
    host: &str,
    ca: &Path,
    alpn: &[&[u8]],
) -> Result<(tokio_rustls::client::TlsStream<tokio::net::TcpStream>, Option<Vec<u8>>), String> {
    let mut roots = rustls::RootCertStore::empty();
    for cert in CertificateDer::pem_file_iter(ca).map_err(|e| e.to_string())? {
        roots.add(cert.map_err(|e| e.to_string())?).map_err(|e| e.to_string())?;
    }
    let provider = Arc::new(rustls::crypto::ring::default_provider());
    let mut config = rustls::ClientConfig::builder_with_provider(provider)
        .with_safe_default_protocol_versions()
        .map_err(|e| e.to_string())?
        .with_root_certificates(roots)
        .with_no_client_auth();
    config.alpn_protocols = alpn.iter().map(|p| p.to_vec()).collect();
    let tcp = tokio::net::TcpStream::connect(addr).await.map_err(|e| e.to_string())?;
    let name = ServerName::try_from(host.to_owned()).map_err(|e| e.to_string())?;
    let tls = tokio_rustls::TlsConnector::from(Arc::new(config))
        .connect(name, tcp)
        .await
        .map_err(|e| e.to_string())?;
    let alpn = tls.get_ref().1.alpn_protocol().map(<[u8]>::to_vec);
    Ok((tls, alpn))
}

/// An HTTP/1.1 request over TLS (ALPN `http/1.1`) to a node at `addr` known as `localhost`.
pub async fn https_request(
    addr: SocketAddr,
    ca: &Path,
    method: &str,
    path: &str,
    bearer: Option<&str>,
    body: Option<&[u8]>,
) -> Option<HttpResponse> {
    let (tls, _) = connect(addr, "localhost", ca, &[b"http/1.1"]).await.ok()?;
    read_response(http_send(tls, addr, method, path, bearer, &[], body).await?).await
}

/// The config version an HTTPS node reports on /readyz (`None`: not ready or not answering).
pub async fn https_node_version(addr: SocketAddr, ca: &Path) -> Option<i64> {
    let response = https_request(addr, ca, "GET", "/readyz", None, None).await?;
    if response.status != 200 {
        return None;
    }
    response.json()["config_version"].as_i64()
}
