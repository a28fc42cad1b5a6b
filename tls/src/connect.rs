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

use crate::files::TlsError;
use crate::words;

/// Dials one `https://` URL.
#[derive(Clone)]
pub struct Connector {
    tls: TlsConnector,
    peer: Arc<str>,
    /// The CA the server's certificate was checked against, for the error text.
    trust: Option<Arc<str>>,
    server_name: ServerName<'static>,
}

impl Connector {
    /// `url` is what the operator wrote (its host is the name the certificate must be for);
    /// `trust` names the CA flag and file (`--control-ca /etc/ca.pem`), if one was given.
    pub fn new(config: Arc<ClientConfig>, url: &str, trust: Option<String>) -> Result<Self, TlsError> {
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
                TlsError::Handshake { peer: peer.clone(), reason: reason(&e, this.trust.as_deref()) }
            })?;
            Ok(TokioIo::new(Worded { inner: tls, peer: this.peer, trust: this.trust }))
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
}

impl Worded {
    fn word(&self, e: io::Error) -> io::Error {
        if words::rustls_error(&e).is_none() {
            return e;
        }
        let reason = reason(&e, self.trust.as_deref());
        io::Error::new(e.kind(), TlsError::Handshake { peer: self.peer.to_string(), reason })
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
            Poll::Ready(Err(e)) => Poll::Ready(Err(self.word(e))),
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
