//! Dialling a control plane over TLS: a connector for tonic's `Endpoint`, which checks the
//! server's certificate for the URL's host and, for mutual TLS, presents the client's.
//!
//! tonic's own TLS takes its certificates once; this one takes them from
//! [`crate::config::client_config`], whose files reload. Errors name the peer's URL and say
//! why in words ([`crate::words`]), also when the server refuses the client's certificate
//! after the handshake (TLS 1.3 tells the client on its first read).

use std::future::Future;
use std::io;
use std::pin::Pin;
use std::sync::Arc;
use std::task::{Context, Poll};

use hyper_util::rt::TokioIo;
use rustls::ClientConfig;
use rustls::pki_types::ServerName;
use tokio::io::{AsyncRead, AsyncWrite, ReadBuf};
use tokio::net::TcpStream;
use tokio_rustls::TlsConnector;
use tokio_rustls::client::TlsStream;

use crate::config;
use crate::files::{Source, TlsError};
use crate::words;

/// The connector for HTTP clients that call public endpoints (providers, webhook receivers,
/// OpenTelemetry collectors): `http://` URLs as they are, `https://` ones checked against
/// the public web's CAs, HTTP/1.1 or HTTP/2 as the server offers. `http` is the caller's
/// TCP connector, with its own timeouts and resolver; it must not enforce `http://`.
pub fn public_web<H>(http: H) -> hyper_rustls::HttpsConnector<H> {
    hyper_rustls::HttpsConnectorBuilder::new()
        .with_webpki_roots()
        .https_or_http()
        .enable_all_versions()
        .wrap_connector(http)
}

/// Whether a URL (a control plane's, an etcd member's) asks for TLS: its scheme is
/// `https`, in any case.
pub fn is_https(url: &str) -> bool {
    url.get(..8).is_some_and(|scheme| scheme.eq_ignore_ascii_case("https://"))
}

/// A client's TLS settings for dialling control planes over HTTP/2 (gRPC).
#[derive(Clone)]
pub struct ClientTls {
    config: Arc<ClientConfig>,
    trust: Option<String>,
    refusal: Refusal,
}

/// The last TLS failure seen on a connection after its handshake. With TLS 1.3 a server
/// refuses a client's certificate after the client has finished its side of the handshake:
/// the client learns it on its first read, and hyper reports that only as "connection
/// closed". This keeps the words for whoever reports the failed call.
#[derive(Clone, Default)]
struct Refusal(Arc<parking_lot::Mutex<Option<String>>>);

impl Refusal {
    fn set(&self, text: String) {
        *self.0.lock() = Some(text);
    }

    fn take(&self) -> Option<String> {
        self.0.lock().take()
    }
}

impl ClientTls {
    /// `ca`: the CA a control plane's certificate must be signed by (`--control-ca`; the
    /// public web's CAs without one); `identity`: the client's certificate for mutual TLS.
    pub fn new(ca: Option<Source>, identity: Option<(Source, Source)>) -> Result<Self, TlsError> {
        let trust = ca.as_ref().map(ToString::to_string);
        let config = config::client_config(ca, identity, &[config::H2])?;
        Ok(Self { config, trust, refusal: Refusal::default() })
    }

    /// A connector for one `https://` URL, checking the certificate for its host.
    pub fn connector(&self, url: &str) -> Result<Connector, TlsError> {
        let mut connector = Connector::new(Arc::clone(&self.config), url, self.trust.clone())?;
        connector.refusal = self.refusal.clone();
        Ok(connector)
    }

    /// Why the peer ended a connection at the TLS level since the last call, in words
    /// (`TLS handshake with URL failed: the peer requires a client certificate …`).
    pub fn take_refusal(&self) -> Option<String> {
        self.refusal.take()
    }
}

/// Dials one `https://` URL.
#[derive(Clone)]
pub struct Connector {
    tls: TlsConnector,
    peer: Arc<str>,
    /// The CA the server's certificate was checked against, for the error text.
    trust: Option<Arc<str>>,
    server_name: ServerName<'static>,
    refusal: Refusal,
}

impl Connector {
    /// `url` is what the operator wrote (its host is the name the certificate must be for);
    /// `trust` names the CA flag and file (`--control-ca /etc/ca.pem`), if one was given.
    pub fn new(
        config: Arc<ClientConfig>,
        url: &str,
        trust: Option<String>,
    ) -> Result<Self, TlsError> {
        let uri: http::Uri = url
            .parse()
            .map_err(|_| TlsError::ServerName { url: url.to_owned(), host: String::new() })?;
        let host = uri.host().unwrap_or_default();
        let host = host.trim_start_matches('[').trim_end_matches(']');
        let server_name = ServerName::try_from(host.to_owned())
            .map_err(|_| TlsError::ServerName { url: url.to_owned(), host: host.to_owned() })?;
        Ok(Self {
            tls: TlsConnector::from(config),
            peer: url.into(),
            trust: trust.map(Into::into),
            server_name,
            refusal: Refusal::default(),
        })
    }
}

type Connecting = Pin<Box<dyn Future<Output = Result<TokioIo<Worded>, TlsError>> + Send>>;

impl tower_service::Service<http::Uri> for Connector {
    type Response = TokioIo<Worded>;
    type Error = TlsError;
    type Future = Connecting;

    fn poll_ready(&mut self, _cx: &mut Context<'_>) -> Poll<Result<(), TlsError>> {
        Poll::Ready(Ok(()))
    }

    fn call(&mut self, uri: http::Uri) -> Connecting {
        let this = self.clone();
        Box::pin(async move {
            let host = uri.host().unwrap_or_default();
            let host = host.trim_start_matches('[').trim_end_matches(']').to_owned();
            let port = uri.port_u16().unwrap_or(443);
            let peer = this.peer.to_string();
            let tcp = TcpStream::connect((host.as_str(), port))
                .await
                .map_err(|source| TlsError::Connect { peer: peer.clone(), source })?;
            // The config stream's small messages (acks, heartbeats) must not wait on Nagle.
            let _ = tcp.set_nodelay(true);
            let tls = this.tls.connect(this.server_name.clone(), tcp).await.map_err(|e| {
                TlsError::Handshake {
                    peer: peer.clone(),
                    reason: reason(&e, this.trust.as_deref()),
                }
            })?;
            Ok(TokioIo::new(Worded {
                inner: tls,
                peer: this.peer,
                trust: this.trust,
                refusal: this.refusal,
            }))
        })
    }
}

fn reason(e: &io::Error, trust: Option<&str>) -> String {
    match words::rustls_error(e) {
        Some(tls) => words::describe(tls, trust),
        None => e.to_string(),
    }
}

/// A client TLS stream whose TLS errors say, in words, which peer and why.
pub struct Worded {
    inner: TlsStream<TcpStream>,
    peer: Arc<str>,
    trust: Option<Arc<str>>,
    refusal: Refusal,
}

impl Worded {
    fn word(&self, e: io::Error) -> io::Error {
        if words::rustls_error(&e).is_none() {
            return e;
        }
        let reason = reason(&e, self.trust.as_deref());
        let worded = TlsError::Handshake { peer: self.peer.to_string(), reason };
        self.refusal.set(worded.to_string());
        io::Error::new(e.kind(), worded)
    }
}

impl Worded {
    /// A write that failed because the server closed the connection may have an alert
    /// waiting to be read that says why (a refused client certificate): read it. The
    /// connection is lost either way, so whatever else is read does not matter.
    fn why_write_failed(&mut self, e: io::Error, cx: &mut Context<'_>) -> io::Error {
        let closed = matches!(
            e.kind(),
            io::ErrorKind::BrokenPipe
                | io::ErrorKind::ConnectionReset
                | io::ErrorKind::ConnectionAborted
        );
        if !closed || words::rustls_error(&e).is_some() {
            return self.word(e);
        }
        let mut scratch = [0u8; 256];
        let mut buf = ReadBuf::new(&mut scratch);
        match Pin::new(&mut self.inner).poll_read(cx, &mut buf) {
            Poll::Ready(Err(read)) if words::rustls_error(&read).is_some() => self.word(read),
            _ => e,
        }
    }
}

impl AsyncRead for Worded {
    fn poll_read(
        mut self: Pin<&mut Self>,
        cx: &mut Context<'_>,
        buf: &mut ReadBuf<'_>,
    ) -> Poll<io::Result<()>> {
        match Pin::new(&mut self.inner).poll_read(cx, buf) {
            Poll::Ready(Err(e)) => Poll::Ready(Err(self.word(e))),
            other => other,
        }
    }
}

impl AsyncWrite for Worded {
    fn poll_write(
        mut self: Pin<&mut Self>,
        cx: &mut Context<'_>,
        buf: &[u8],
    ) -> Poll<io::Result<usize>> {
        match Pin::new(&mut self.inner).poll_write(cx, buf) {
            Poll::Ready(Err(e)) => Poll::Ready(Err(self.why_write_failed(e, cx))),
            other => other,
        }
    }

    fn poll_flush(mut self: Pin<&mut Self>, cx: &mut Context<'_>) -> Poll<io::Result<()>> {
        Pin::new(&mut self.inner).poll_flush(cx)
    }

    fn poll_shutdown(mut self: Pin<&mut Self>, cx: &mut Context<'_>) -> Poll<io::Result<()>> {
        Pin::new(&mut self.inner).poll_shutdown(cx)
    }

    fn poll_write_vectored(
        mut self: Pin<&mut Self>,
        cx: &mut Context<'_>,
        bufs: &[io::IoSlice<'_>],
    ) -> Poll<io::Result<usize>> {
        Pin::new(&mut self.inner).poll_write_vectored(cx, bufs)
    }

    fn is_write_vectored(&self) -> bool {
        self.inner.is_write_vectored()
    }
}
