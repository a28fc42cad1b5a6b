//! The server side of handshakes: each accepted connection's handshake runs in its own task
//! (a client that never finishes one must not hold up the next), bounded in time, and
//! refused handshakes are logged with the peer's address and the reason — at most
//! [`LOGGED_PER_MINUTE`] a minute, so a scanner cannot flood the log.

use std::io;
use std::net::SocketAddr;
use std::pin::Pin;
use std::sync::Arc;
use std::task::{Context, Poll};
use std::time::{Duration, Instant};

use parking_lot::Mutex;
use rustls::ServerConfig;
use tokio::io::{AsyncRead, AsyncWrite, ReadBuf};
use tokio::net::{TcpListener, TcpStream};
use tokio::sync::mpsc;
use tokio_rustls::TlsAcceptor;
use tokio_rustls::server::TlsStream;
use tokio_stream::wrappers::ReceiverStream;
use tracing::{debug, warn};

use crate::words;

pub const LOGGED_PER_MINUTE: u32 = 10;
const WINDOW: Duration = Duration::from_secs(60);
/// Pause after an accept error that is not about one connection (out of file descriptors).
const ACCEPT_ERROR_PAUSE: Duration = Duration::from_secs(1);

/// Handshakes for one listener.
#[derive(Clone)]
pub struct Acceptor {
    tls: TlsAcceptor,
    timeout: Duration,
    /// The CA clients' certificates are checked against (`--client-ca FILE`), for the log.
    trust: Option<Arc<str>>,
    refusals: Arc<Refusals>,
}

impl Acceptor {
    pub fn new(config: Arc<ServerConfig>, timeout: Duration, trust: Option<String>) -> Self {
        Self {
            tls: TlsAcceptor::from(config),
            timeout,
            trust: trust.map(Into::into),
            refusals: Arc::new(Refusals::default()),
        }
    }

    /// The connection once the handshake is done; `None` (logged) if it failed.
    pub async fn handshake(&self, tcp: TcpStream, peer: SocketAddr) -> Option<Accepted> {
        let accept = self.tls.accept(tcp).into_fallible();
        let reason = match tokio::time::timeout(self.timeout, accept).await {
            Ok(Ok(stream)) => return Some(Accepted { stream, peer }),
            Ok(Err((e, tcp))) => match words::rustls_error(&e) {
                Some(tls) => {
                    tokio::spawn(linger(tcp));
                    words::describe(tls, self.trust.as_deref())
                }
                // The client went away mid-handshake: nothing it needs to be told.
                None => {
                    debug!(peer = %peer, error = %e, "TLS handshake ended early");
                    return None;
                }
            },
            Err(_) => format!("no TLS handshake within {:?}", self.timeout),
        };
        self.refusals.log(peer, &reason);
        None
    }
}

/// How long a refused connection is kept half-open for the client to read the alert.
const LINGER: Duration = Duration::from_secs(1);

/// Closes a refused connection so that the client reads why. The alert has been written;
/// closing at once with the client's next bytes unread would make the kernel answer them
/// with a reset, which can discard the alert before the client reads it (with TLS 1.3 a
/// client sends its first request before it learns its certificate was refused). So: send
/// our end's FIN, read and drop what the client still sends until it closes, for at most
/// [`LINGER`].
async fn linger(mut tcp: TcpStream) {
    use tokio::io::{AsyncReadExt, AsyncWriteExt};
    let _ = tcp.shutdown().await;
    let mut sink = [0u8; 1024];
    let _ = tokio::time::timeout(LINGER, async {
        while matches!(tcp.read(&mut sink).await, Ok(n) if n > 0) {}
    })
    .await;
}

/// A connection whose handshake is done, as a gRPC server takes it.
pub struct Accepted {
    stream: TlsStream<TcpStream>,
    peer: SocketAddr,
}

impl Accepted {
    /// Whether the client chose HTTP/2 (ALPN `h2`).
    pub fn is_h2(&self) -> bool {
        self.stream.get_ref().1.alpn_protocol() == Some(crate::config::H2)
    }
}

impl tonic::transport::server::Connected for Accepted {
    type ConnectInfo = tonic::transport::server::TcpConnectInfo;

    /// The peer's address, which the join-token check reads (loopback may join without one).
    fn connect_info(&self) -> Self::ConnectInfo {
        tonic::transport::server::TcpConnectInfo {
            local_addr: self.stream.get_ref().0.local_addr().ok(),
            remote_addr: Some(self.peer),
        }
    }
}

impl AsyncRead for Accepted {
    fn poll_read(
        mut self: Pin<&mut Self>,
        cx: &mut Context<'_>,
        buf: &mut ReadBuf<'_>,
    ) -> Poll<io::Result<()>> {
        Pin::new(&mut self.stream).poll_read(cx, buf)
    }
}

impl AsyncWrite for Accepted {
    fn poll_write(
        mut self: Pin<&mut Self>,
        cx: &mut Context<'_>,
        buf: &[u8],
    ) -> Poll<io::Result<usize>> {
        Pin::new(&mut self.stream).poll_write(cx, buf)
    }

    fn poll_flush(mut self: Pin<&mut Self>, cx: &mut Context<'_>) -> Poll<io::Result<()>> {
        Pin::new(&mut self.stream).poll_flush(cx)
    }

    fn poll_shutdown(mut self: Pin<&mut Self>, cx: &mut Context<'_>) -> Poll<io::Result<()>> {
        Pin::new(&mut self.stream).poll_shutdown(cx)
    }

    fn poll_write_vectored(
        mut self: Pin<&mut Self>,
        cx: &mut Context<'_>,
        bufs: &[io::IoSlice<'_>],
    ) -> Poll<io::Result<usize>> {
        Pin::new(&mut self.stream).poll_write_vectored(cx, bufs)
    }

    fn is_write_vectored(&self) -> bool {
        self.stream.is_write_vectored()
    }
}

/// Accepted connections of `listener`, handshaken, for a server that takes a stream of
/// connections (tonic's `serve_with_incoming`). The listener closes when the stream is
/// dropped.
pub fn incoming(listener: TcpListener, acceptor: Acceptor) -> ReceiverStream<io::Result<Accepted>> {
    let (tx, rx) = mpsc::channel(64);
    tokio::spawn(async move {
        loop {
            let accepted = tokio::select! {
                accepted = listener.accept() => accepted,
                () = tx.closed() => return,
            };
            let (tcp, peer) = match accepted {
                Ok(pair) => pair,
                Err(e) if is_per_connection(&e) => continue,
                Err(e) => {
                    warn!(error = %e, "accepting a connection failed; pausing");
                    tokio::time::sleep(ACCEPT_ERROR_PAUSE).await;
                    continue;
                }
            };
            let _ = tcp.set_nodelay(true);
            let (acceptor, tx) = (acceptor.clone(), tx.clone());
            tokio::spawn(async move {
                if let Some(tls) = acceptor.handshake(tcp, peer).await {
                    let _ = tx.send(Ok(tls)).await;
                }
            });
        }
    });
    ReceiverStream::new(rx)
}

/// Errors that concern only the connection being accepted; the next accept may succeed.
pub fn is_per_connection(e: &io::Error) -> bool {
    matches!(
        e.kind(),
        io::ErrorKind::ConnectionRefused
            | io::ErrorKind::ConnectionAborted
            | io::ErrorKind::ConnectionReset
    )
}

/// The log of refused handshakes, bounded per minute.
#[derive(Default)]
struct Refusals(Mutex<Window>);

struct Window {
    started: Instant,
    logged: u32,
    unlogged: u64,
}

impl Default for Window {
    fn default() -> Self {
        Self { started: Instant::now(), logged: 0, unlogged: 0 }
    }
}

impl Refusals {
    fn log(&self, peer: SocketAddr, reason: &str) {
        let mut window = self.0.lock();
        if window.started.elapsed() >= WINDOW {
            if window.unlogged > 0 {
                warn!(
                    count = window.unlogged,
                    "more TLS handshakes were refused and not logged in the last minute"
                );
            }
            *window = Window::default();
        }
        if window.logged < LOGGED_PER_MINUTE {
            window.logged += 1;
            warn!(peer = %peer, reason, "refused a TLS handshake");
        } else {
            window.unlogged += 1;
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn refusals_are_logged_at_most_ten_a_minute_and_the_rest_counted() {
        let refusals = Refusals::default();
        let peer = SocketAddr::from(([127, 0, 0, 1], 1234));
        for _ in 0..15 {
            refusals.log(peer, "no client certificate presented");
        }
        let window = refusals.0.lock();
        assert_eq!((window.logged, window.unlogged), (LOGGED_PER_MINUTE, 5));
    }
}
