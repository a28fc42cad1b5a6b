//! One accepted TCP connection: counted when hyper lets go of it, and closed with an RST when
//! a handler scripted a `reset`.

use std::io;
use std::pin::Pin;
use std::sync::Arc;
use std::sync::atomic::{AtomicBool, Ordering};
use std::task::{Context, Poll};
use std::time::Duration;

use tokio::io::{AsyncRead, AsyncWrite, ReadBuf};
use tokio::net::TcpStream;

use super::state::State;

/// Per-connection flags a handler sets for the socket's close.
#[derive(Default)]
pub struct ConnFlags {
    /// Close with an RST instead of a FIN.
    reset: AtomicBool,
}

impl ConnFlags {
    /// The connection ends with an RST once the handler gives it up.
    pub fn reset_on_close(&self) {
        self.reset.store(true, Ordering::Release);
    }
}

/// The TCP stream, counting its close when hyper lets go of it (EOF, error, reset, shutdown).
pub struct CountedStream {
    stream: TcpStream,
    conn: Arc<ConnFlags>,
    state: Arc<State>,
}

impl CountedStream {
    /// Counts the connection as opened; dropping the stream counts it as closed.
    pub fn new(stream: TcpStream, conn: Arc<ConnFlags>, state: Arc<State>) -> Self {
        state.connection_opened();
        CountedStream { stream, conn, state }
    }
}

impl Drop for CountedStream {
    fn drop(&mut self) {
        if self.conn.reset.load(Ordering::Acquire) {
            // SO_LINGER 0 makes close() send an RST: the nearest thing to a provider's
            // connection reset. Tokio deprecates set_linger because a *non-zero* linger blocks
            // the thread on close; a zero linger returns at once.
            #[allow(deprecated)]
            let _ = self.stream.set_linger(Some(Duration::ZERO));
        }
        self.state.connection_closed();
    }
}

impl AsyncRead for CountedStream {
    fn poll_read(
        self: Pin<&mut Self>,
        cx: &mut Context<'_>,
        buf: &mut ReadBuf<'_>,
    ) -> Poll<io::Result<()>> {
        Pin::new(&mut self.get_mut().stream).poll_read(cx, buf)
    }
}

impl AsyncWrite for CountedStream {
    fn poll_write(
        self: Pin<&mut Self>,
        cx: &mut Context<'_>,
        buf: &[u8],
    ) -> Poll<io::Result<usize>> {
        Pin::new(&mut self.get_mut().stream).poll_write(cx, buf)
    }

    fn poll_write_vectored(
        self: Pin<&mut Self>,
        cx: &mut Context<'_>,
        bufs: &[io::IoSlice<'_>],
    ) -> Poll<io::Result<usize>> {
        Pin::new(&mut self.get_mut().stream).poll_write_vectored(cx, bufs)
    }

    fn is_write_vectored(&self) -> bool {
        self.stream.is_write_vectored()
    }

    fn poll_flush(self: Pin<&mut Self>, cx: &mut Context<'_>) -> Poll<io::Result<()>> {
        Pin::new(&mut self.get_mut().stream).poll_flush(cx)
    }

    fn poll_shutdown(self: Pin<&mut Self>, cx: &mut Context<'_>) -> Poll<io::Result<()>> {
        Pin::new(&mut self.get_mut().stream).poll_shutdown(cx)
    }
}
