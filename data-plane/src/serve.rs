//! The node's HTTP/1 accept loop: one task per client connection, graceful shutdown.
//!
//! This is what `axum::serve` does, with two differences that are the reason it exists:
//! each connection's task runs under [`Repoll`], which spares it the thread wake-up it
//! would otherwise cause itself on every request (see [`crate::wake`]), and connections are
//! served by hyper's HTTP/1 server directly, the only protocol the node speaks to clients.

use std::future::Future;
use std::io;
use std::time::Duration;

use axum::Router;
use hyper::server::conn::http1;
use hyper_util::rt::{TokioIo, TokioTimer};
use hyper_util::service::TowerToHyperService;
use tokio::net::TcpListener;
use tokio::sync::watch;
use tracing::{debug, error};

use crate::wake::Repoll;

/// Pause after an accept error that is not about one connection (out of file descriptors,
/// say), so the loop does not spin while the condition lasts.
const ACCEPT_ERROR_PAUSE: Duration = Duration::from_secs(1);

/// Serves `router` on `listener`, closing connections whose request head does not arrive
/// within `header_read_timeout`, until `shutdown` completes, then stops accepting, lets
/// every connection finish the request it is serving, and returns once all have closed.
pub async fn serve(
    listener: TcpListener,
    router: Router,
    header_read_timeout: Duration,
    shutdown: impl Future<Output = ()>,
) -> io::Result<()> {
    // Connections watch `stop` for the shutdown signal; `done` closes when the last
    // connection drops its receiver.
    let (stop, _) = watch::channel(false);
    let (done, _) = watch::channel(());
    let mut shutdown = std::pin::pin!(shutdown);
    loop {
        let tcp = tokio::select! {
            accepted = listener.accept() => match accepted {
                Ok((tcp, _)) => tcp,
                Err(e) if is_per_connection(&e) => continue,
                Err(e) => {
                    error!(error = %e, "accepting a connection failed; pausing");
                    tokio::time::sleep(ACCEPT_ERROR_PAUSE).await;
                    continue;
                }
            },
            () = &mut shutdown => break,
        };
        // Without TCP_NODELAY a stream's small SSE writes can be held back by Nagle's
        // algorithm until the client ACKs the previous one, and clients delay their ACKs.
        let _ = tcp.set_nodelay(true);
        let service = TowerToHyperService::new(router.clone());
        let mut stop = stop.subscribe();
        let done = done.subscribe();
        tokio::spawn(Repoll::new(async move {
            // A client that opens connections and trickles their heads (or sends nothing)
            // would otherwise hold a task and a socket each for as long as it likes.
            let conn = http1::Builder::new()
                .timer(TokioTimer::new())
                .header_read_timeout(header_read_timeout)
                .serve_connection(TokioIo::new(tcp), service);
            let mut conn = std::pin::pin!(conn);
            let result = tokio::select! {
                result = conn.as_mut() => result,
                _ = stop.changed() => {
                    conn.as_mut().graceful_shutdown();
                    conn.await
                }
            };
            if let Err(e) = result {
                debug!(error = %e, "client connection ended with an error");
            }
            drop(done);
        }));
    }
    drop(listener);
    let _ = stop.send(true);
    done.closed().await;
    Ok(())
}

/// Errors that concern only the connection being accepted; the next accept may succeed.
fn is_per_connection(e: &io::Error) -> bool {
    matches!(
        e.kind(),
        io::ErrorKind::ConnectionRefused
            | io::ErrorKind::ConnectionAborted
            | io::ErrorKind::ConnectionReset
    )
}
