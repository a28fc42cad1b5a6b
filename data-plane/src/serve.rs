//! The node's HTTP server: accept loop, per-connection read limits, graceful drain. HTTP/1.1
//! in plaintext; with TLS (`--tls-cert`, `--tls-key`) HTTP/1.1 or HTTP/2, as the client's
//! ALPN chooses.
//!
//! Built from hyper's HTTP/1 connection and hyper-util's [`GracefulShutdown`] rather than
//! `axum::serve`, which offers neither a header-read timeout nor a hook per connection.
//!
//! A connection's life:
//! - with TLS, its handshake must be done within `header_read_timeout`; it runs in the
//!   connection's task, so a slow one holds up no other client;
//! - its request head must arrive within `header_read_timeout` (hyper's own timer), which
//!   also bounds how long an idle keep-alive connection stays open;
//! - each request body must arrive within `body_read_timeout` of its head, or the request
//!   is answered 408 (a client that sends `Content-Length: 1000`, ten bytes and then
//!   nothing would otherwise hold a task and a socket for as long as it likes);
//! - once draining, a connection finishes the request it is serving and closes; one that
//!   is idle or has only part of its first head closes at once (hyper alone would wait for
//!   the rest of that head, up to the header-read timeout);
//! - a request whose body is still arriving when the drain starts is served if the body
//!   completes while other work is in flight; once requests waiting for their bodies are
//!   all that is left, each is answered 503 `draining` (closing its connection), so a
//!   client that sent half a body holds the shutdown no longer than the work that was
//!   really in flight ([`Flight`]).
//!
//! While draining, the listener stays open so that load balancers probing the node see
//! `/readyz` answer 503. A connection accepted during the drain carries one request:
//! `/readyz`, `/healthz` and `/metrics` are answered as usual, anything else gets 503
//! `draining` at once (clients retry it elsewhere), and such connections are never waited
//! for.

use std::convert::Infallible;
use std::future::Future;
use std::io;
use std::net::SocketAddr;
use std::pin::{Pin, pin};
use std::sync::Arc;
use std::sync::atomic::{AtomicBool, AtomicUsize, Ordering};
use std::task::{Context, Poll};
use std::time::Duration;

use axum::Router;
use axum::body::Body;
use axum::http::{Request, header};
use axum::response::Response;
use bytes::Bytes;
use hyper::body::{Body as HttpBody, Frame, Incoming, SizeHint};
use hyper::server::conn::{http1, http2};
use hyper::service::{Service, service_fn};
use hyper_util::rt::{TokioExecutor, TokioIo, TokioTimer};
use hyper_util::server::graceful::{GracefulShutdown, Watcher};
use hyper_util::service::TowerToHyperService;
use switchyard_tls::accept::{Accepted, Acceptor, is_per_connection};
use tokio::net::{TcpListener, TcpStream};
use tokio::sync::{Notify, watch};
use tokio::time::{Instant, Sleep};
use tracing::{debug, error, info, warn};

use crate::error::{ApiError, Flavor};
use crate::request_id;
use crate::wake::Repoll;

/// How often an idle HTTP/2 client is pinged, and how long its answer may take.
const H2_PING_INTERVAL: std::time::Duration = std::time::Duration::from_secs(20);

/// Pause after an accept error that is not about one connection (out of file descriptors,
/// say), so the loop does not spin while the condition lasts.
const ACCEPT_ERROR_PAUSE: Duration = Duration::from_secs(1);

/// How long a client may take to send a request body once its head is in (configurable
/// with `--body-read-timeout`). A body of the largest size accepted by default (4 MiB)
/// arrives in this time at a little over 1 Mbit/s, and the chat bodies real clients send
/// are kilobytes; what takes longer is a stalled or hostile client holding a task and a
/// socket. The same bound as the head's, for the same reason.
pub const DEFAULT_BODY_READ_TIMEOUT: Duration = Duration::from_secs(30);
/// How long a shutdown waits for requests and streams in flight (`--drain-timeout`); also
/// Kubernetes' default grace period between SIGTERM and SIGKILL.
pub const DEFAULT_DRAIN_TIMEOUT: Duration = Duration::from_secs(30);

#[derive(Clone, Copy, Debug)]
pub struct ServeOptions {
    /// Longest a client may take to send a request head; also the idle keep-alive limit.
    pub header_read_timeout: Duration,
    /// Longest a client may take to send a request body, counted from its head.
    pub body_read_timeout: Duration,
    /// Longest the drain waits for requests in flight before closing their connections.
    pub drain_timeout: Duration,
}

/// How a drain ended.
#[derive(Clone, Copy, Debug)]
pub struct Drained {
    /// When the shutdown signal arrived.
    pub started: Instant,
    /// Connections still serving a request when `drain_timeout` ran out (closed then).
    pub cut_off: usize,
}

/// Serves `router` on `listener` (over TLS with `tls`) until `shutdown` completes, then
/// drains: stops taking new requests, lets every request in flight finish (up to
/// `drain_timeout`) and returns.
pub async fn serve_listener(
    listener: TcpListener,
    tls: Option<Acceptor>,
    router: Router,
    options: ServeOptions,
    shutdown: impl Future<Output = ()>,
) -> io::Result<Drained> {
    let graceful = GracefulShutdown::new();
    // Every connection task holds a receiver: `true` starts the drain, and dropping the
    // sender (when this function returns) closes whatever is still open.
    let (draining, drain_rx) = watch::channel(false);
    let flight = Arc::new(Flight::default());
    let mut shutdown = pin!(shutdown);
    loop {
        tokio::select! {
            tcp = accept(&listener) => serve_connection(tcp, tls.as_ref(), &router, options, &graceful, drain_rx.clone(), &flight),
            () = &mut shutdown => break,
        }
    }
    drop(drain_rx);
    let started = Instant::now();
    let _ = draining.send(true);
    info!(connections = draining.receiver_count(), "draining: finishing requests in flight");
    let deadline = started + options.drain_timeout;
    let mut finished = pin!(graceful.shutdown());
    let mut released = false;
    loop {
        // Registered before looking, so a change in between still wakes the loop.
        let changed = flight.changed.notified();
        let mut changed = pin!(changed);
        changed.as_mut().enable();
        if !released && let Some(waiting) = flight.only_waiting_left() {
            debug!(waiting, "draining: answering 503 to requests whose body has not arrived");
            flight.release.send_replace(true);
            released = true;
        }
        tokio::select! {
            () = &mut finished => return Ok(Drained { started, cut_off: 0 }),
            () = tokio::time::sleep_until(deadline) => {
                let cut_off = draining.receiver_count();
                warn!(cut_off, "drain timeout: closing connections still serving a request");
                return Ok(Drained { started, cut_off });
            }
            tcp = accept(&listener) => serve_while_draining(tcp, tls.as_ref(), &router, options),
            () = changed, if !released => {}
        }
    }
}

/// The requests this server is handling, and how many of them wait for body bytes that have
/// not come: what a drain needs to tell work in flight from clients that stopped sending.
#[derive(Default)]
struct Flight {
    /// Requests from their head to the end (or drop) of their response body.
    requests: AtomicUsize,
    /// Of those, the ones whose handler waits for the rest of their body.
    waiting: AtomicUsize,
    /// Told whenever either count changes (one waiter: the drain loop).
    changed: Notify,
    /// Set by the drain once only waiting requests are left: each then answers 503.
    release: watch::Sender<bool>,
}

impl Flight {
    /// How many requests wait for their bodies, when they are every request left.
    fn only_waiting_left(&self) -> Option<usize> {
        // Read apart, the two may be a moment out of step (a body that just arrived still
        // counted as awaited): the others waiting are then answered a little early, with
        // the answer they would have got once that request was done.
        let waiting = self.waiting.load(Ordering::Acquire);
        (waiting > 0 && self.requests.load(Ordering::Acquire) <= waiting).then_some(waiting)
    }

    fn count(self: &Arc<Self>, counter: fn(&Self) -> &AtomicUsize) -> Counted {
        counter(self).fetch_add(1, Ordering::AcqRel);
        self.changed.notify_one();
        Counted { flight: Arc::clone(self), counter }
    }
}

/// One request (or one wait for a body) counted in [`Flight`] until dropped.
struct Counted {
    flight: Arc<Flight>,
    counter: fn(&Flight) -> &AtomicUsize,
}

impl Drop for Counted {
    fn drop(&mut self) {
        (self.counter)(&self.flight).fetch_sub(1, Ordering::AcqRel);
        self.flight.changed.notify_one();
    }
}

/// The next client connection and its address; errors that concern only one connection
/// are skipped.
async fn accept(listener: &TcpListener) -> (TcpStream, SocketAddr) {
    loop {
        match listener.accept().await {
            Ok((tcp, peer)) => {
                // Without TCP_NODELAY a stream's small SSE writes can be held back by
                // Nagle's algorithm until the client ACKs the previous one, and clients
                // delay their ACKs.
                let _ = tcp.set_nodelay(true);
                return (tcp, peer);
            }
            Err(e) if is_per_connection(&e) => {}
            Err(e) => {
                error!(error = %e, "accepting a connection failed; pausing");
                tokio::time::sleep(ACCEPT_ERROR_PAUSE).await;
            }
        }
    }
}

/// A client connection, in plaintext or over TLS.
enum Conn {
    Plain(TcpStream),
    /// Boxed: a TLS session's buffers are kilobytes, a plain connection's a few words.
    Tls(Box<Accepted>),
}

impl Conn {
    /// The connection once its handshake (if any) is done; `None` if that failed (the
    /// acceptor logs why).
    async fn open(tcp: TcpStream, peer: SocketAddr, tls: Option<Acceptor>) -> Option<Self> {
        match tls {
            None => Some(Self::Plain(tcp)),
            Some(acceptor) => {
                acceptor.handshake(tcp, peer).await.map(|tls| Self::Tls(Box::new(tls)))
            }
        }
    }

    /// Serves the connection's requests: over HTTP/2 if the TLS client chose it, else over
    /// HTTP/1.1. `keep_alive: false` closes an HTTP/1.1 connection after one request.
    async fn serve_requests<S>(
        self,
        options: ServeOptions,
        service: S,
        watcher: Option<Watcher>,
        keep_alive: bool,
    ) -> Result<(), hyper::Error>
    where
        S: hyper::service::Service<Request<Incoming>, Response = Response, Error = Infallible>
            + Clone
            + Send
            + 'static,
        S::Future: Send + 'static,
    {
        match self {
            Self::Tls(tls) if tls.is_h2() => {
                // Pings find a peer that went away without closing (HTTP/1.1's header-read
                // timeout has no HTTP/2 counterpart); a drain ends the connection with GOAWAY.
                let conn = http2::Builder::new(TokioExecutor::new())
                    .timer(TokioTimer::new())
                    .keep_alive_interval(Some(H2_PING_INTERVAL))
                    .keep_alive_timeout(H2_PING_INTERVAL)
                    .serve_connection(TokioIo::new(tls), service);
                watched(conn, watcher).await
            }
            Self::Tls(tls) => {
                let conn =
                    http1_builder(options, keep_alive).serve_connection(TokioIo::new(tls), service);
                watched(conn, watcher).await
            }
            Self::Plain(tcp) => {
                let conn =
                    http1_builder(options, keep_alive).serve_connection(TokioIo::new(tcp), service);
                watched(conn, watcher).await
            }
        }
    }
}

/// `conn` under the drain's watch, if it is to be waited for.
async fn watched<C>(conn: C, watcher: Option<Watcher>) -> Result<(), hyper::Error>
where
    C: hyper_util::server::graceful::GracefulConnection<Error = hyper::Error>,
{
    match watcher {
        Some(watcher) => watcher.watch(conn).await,
        None => conn.await,
    }
}

fn http1_builder(options: ServeOptions, keep_alive: bool) -> http1::Builder {
    let mut builder = http1::Builder::new();
    // A client that opens connections and trickles their heads (or sends nothing) would
    // otherwise hold a task and a socket each for as long as it likes.
    builder
        .timer(TokioTimer::new())
        .header_read_timeout(options.header_read_timeout)
        .keep_alive(keep_alive);
    builder
}

fn serve_connection(
    (tcp, peer): (TcpStream, SocketAddr),
    tls: Option<&Acceptor>,
    router: &Router,
    options: ServeOptions,
    graceful: &GracefulShutdown,
    mut draining: watch::Receiver<bool>,
    flight: &Arc<Flight>,
) {
    // Set when the connection's first request head is complete: from then on hyper knows
    // what to finish; before, a drain may close the connection at once.
    let started = Arc::new(AtomicBool::new(false));
    let service = {
        let started = Arc::clone(&started);
        let service = TowerToHyperService::new(router.clone());
        let flight = Arc::clone(flight);
        service_fn(move |request: Request<Incoming>| {
            started.store(true, Ordering::Relaxed);
            respond(service.clone(), request, options.body_read_timeout, Arc::clone(&flight))
        })
    };
    let watcher = graceful.watcher();
    let tls = tls.cloned();
    tokio::spawn(async move {
        // Under `Repoll`: the wake-up a connection gives itself on each request body
        // (crate::wake) is answered in this poll instead of unparking another worker.
        let conn = Repoll::new(async move {
            let conn = Conn::open(tcp, peer, tls).await?;
            Some(conn.serve_requests(options, service, Some(watcher), true).await)
        });
        tokio::select! {
            result = conn => {
                if let Some(Err(e)) = result {
                    debug!(error = %e, "client connection ended with an error");
                }
            }
            () = closable(&mut draining, &started) => {}
        }
    });
}

/// Resolves when the connection may be closed without losing a request: once the drain
/// starts if it never completed a request head, or when the drain gives up on it.
async fn closable(draining: &mut watch::Receiver<bool>, started: &AtomicBool) {
    if draining.wait_for(|d| *d).await.is_err() {
        return;
    }
    if !started.load(Ordering::Relaxed) {
        debug!("draining: closing a connection that has not sent a whole request head");
        return;
    }
    // Until the sender goes: the drain is over (or gave up).
    while draining.changed().await.is_ok() {}
}

/// A connection accepted while draining: one request, answered at once.
fn serve_while_draining(
    (tcp, peer): (TcpStream, SocketAddr),
    tls: Option<&Acceptor>,
    router: &Router,
    options: ServeOptions,
) {
    let service = TowerToHyperService::new(router.clone());
    let service = service_fn(move |request: Request<Incoming>| {
        let service = service.clone();
        async move {
            let mut request = request;
            let id = request_id::ensure(request.headers_mut());
            let mut response = match request.uri().path() {
                "/readyz" | "/healthz" | "/metrics" => service.call(request).await?,
                path => ApiError::Draining.render(flavor_of(path)),
            };
            response.headers_mut().entry(request_id::HEADER).or_insert(id);
            Ok::<_, Infallible>(response)
        }
    });
    let tls = tls.cloned();
    tokio::spawn(async move {
        let Some(conn) = Conn::open(tcp, peer, tls).await else { return };
        if let Err(e) = conn.serve_requests(options, service, None, false).await {
            debug!(error = %e, "client connection ended with an error");
        }
    });
}

fn flavor_of(path: &str) -> Flavor {
    if path.starts_with("/v1/") { Flavor::OpenAi } else { Flavor::Classic }
}

/// Runs the router on `request`, answering 408 instead if the request body is not in
/// within `body_read_timeout` of the head, or 503 if the server drains and nothing but
/// such waits is left ([`Flight`]). The timer is armed only while the handler waits for
/// body bytes that have not come: a body that arrives with its head costs nothing. Every
/// answer carries the request's id (docs/http-api.md, "Response headers"), set on the
/// request first so the handler reads the same one.
async fn respond(
    service: TowerToHyperService<Router>,
    mut request: Request<Incoming>,
    body_read_timeout: Duration,
    flight: Arc<Flight>,
) -> Result<Response, Infallible> {
    let counted = flight.count(|f| &f.requests);
    let id = request_id::ensure(request.headers_mut());
    let mut response = respond_in_time(service, request, body_read_timeout, &flight).await?;
    response.headers_mut().entry(request_id::HEADER).or_insert(id);
    // Counted until its body is sent: a stream in flight is work in flight.
    Ok(response.map(|inner| Body::new(CountedBody { inner, _counted: counted })))
}

async fn respond_in_time(
    service: TowerToHyperService<Router>,
    request: Request<Incoming>,
    body_read_timeout: Duration,
    flight: &Arc<Flight>,
) -> Result<Response, Infallible> {
    let deadline = Instant::now() + body_read_timeout;
    let flavor = flavor_of(request.uri().path());
    let received = Arc::new(AtomicBool::new(request.body().is_end_stream()));
    let request =
        request.map(|inner| Body::new(TimedBody { inner, received: Arc::clone(&received) }));
    let mut handler = pin!(service.call(request));
    // While the body is awaited: its timer, its place in `waiting`, the drain's release.
    let mut wait: Option<BodyWait> = None;
    std::future::poll_fn(|cx| {
        if let Poll::Ready(response) = handler.as_mut().poll(cx) {
            return Poll::Ready(response);
        }
        if received.load(Ordering::Acquire) {
            wait = None;
            return Poll::Pending;
        }
        let wait = wait.get_or_insert_with(|| BodyWait::new(deadline, flight));
        let mut response = match wait.poll(cx) {
            Poll::Pending => return Poll::Pending,
            Poll::Ready(BodyWaitEnd::TimedOut) => {
                debug!("request body not received in time; answering 408");
                ApiError::BodyTimeout { after: body_read_timeout }.render(flavor)
            }
            Poll::Ready(BodyWaitEnd::Released) => {
                debug!("draining: request body still not received; answering 503");
                ApiError::Draining.render(flavor)
            }
        };
        // The rest of the body may still come: the connection cannot carry another request.
        response
            .headers_mut()
            .insert(header::CONNECTION, header::HeaderValue::from_static("close"));
        Poll::Ready(Ok(response))
    })
    .await
}

/// A handler's wait for the rest of its request body.
struct BodyWait {
    timer: Pin<Box<Sleep>>,
    /// Resolves once the drain releases the requests still waiting for their bodies.
    released: Pin<Box<dyn Future<Output = ()> + Send>>,
    _counted: Counted,
}

enum BodyWaitEnd {
    TimedOut,
    Released,
}

impl BodyWait {
    fn new(deadline: Instant, flight: &Arc<Flight>) -> Self {
        let mut release = flight.release.subscribe();
        let released = Box::pin(async move {
            // Every request holds the sender (in the Flight): it cannot go while this waits.
            if release.wait_for(|r| *r).await.is_err() {
                std::future::pending::<()>().await;
            }
        });
        Self {
            timer: Box::pin(tokio::time::sleep_until(deadline)),
            released,
            _counted: flight.count(|f| &f.waiting),
        }
    }

    fn poll(&mut self, cx: &mut Context<'_>) -> Poll<BodyWaitEnd> {
        if self.released.as_mut().poll(cx).is_ready() {
            return Poll::Ready(BodyWaitEnd::Released);
        }
        self.timer.as_mut().poll(cx).map(|()| BodyWaitEnd::TimedOut)
    }
}

/// A response body that keeps its request counted in [`Flight`] until it is sent or dropped.
struct CountedBody {
    inner: Body,
    _counted: Counted,
}

impl HttpBody for CountedBody {
    type Data = Bytes;
    type Error = axum::Error;

    fn poll_frame(
        mut self: Pin<&mut Self>,
        cx: &mut Context<'_>,
    ) -> Poll<Option<Result<Frame<Bytes>, axum::Error>>> {
        Pin::new(&mut self.inner).poll_frame(cx)
    }

    fn is_end_stream(&self) -> bool {
        self.inner.is_end_stream()
    }

    fn size_hint(&self) -> SizeHint {
        self.inner.size_hint()
    }
}

/// A request body that says when it has been read to its end, or dropped unread.
struct TimedBody {
    inner: Incoming,
    received: Arc<AtomicBool>,
}

impl HttpBody for TimedBody {
    type Data = Bytes;
    type Error = hyper::Error;

    fn poll_frame(
        mut self: Pin<&mut Self>,
        cx: &mut Context<'_>,
    ) -> Poll<Option<Result<Frame<Bytes>, hyper::Error>>> {
        let frame = Pin::new(&mut self.inner).poll_frame(cx);
        if matches!(frame, Poll::Ready(None | Some(Err(_)))) || self.inner.is_end_stream() {
            self.received.store(true, Ordering::Release);
        }
        frame
    }

    fn is_end_stream(&self) -> bool {
        self.inner.is_end_stream()
    }

    fn size_hint(&self) -> SizeHint {
        self.inner.size_hint()
    }
}

impl Drop for TimedBody {
    /// A handler that answers without reading the body (401, 413) is not waiting for it.
    fn drop(&mut self) {
        self.received.store(true, Ordering::Release);
    }
}

#[cfg(test)]
mod tests {
    #![allow(clippy::unwrap_used)]
    use std::net::SocketAddr;

    use axum::routing::{get, post};
    use tokio::io::{AsyncReadExt, AsyncWriteExt};
    use tokio::sync::oneshot;

    use super::*;

    fn options() -> ServeOptions {
        ServeOptions {
            header_read_timeout: Duration::from_secs(30),
            body_read_timeout: Duration::from_millis(200),
            drain_timeout: Duration::from_secs(5),
        }
    }

    /// Serves `router` on a loopback port until the returned sender fires or is dropped.
    async fn start(
        router: Router,
    ) -> (SocketAddr, oneshot::Sender<()>, tokio::task::JoinHandle<io::Result<Drained>>) {
        let listener = TcpListener::bind("127.0.0.1:0").await.unwrap();
        let addr = listener.local_addr().unwrap();
        let (stop, stopped) = oneshot::channel::<()>();
        let server = tokio::spawn(serve_listener(listener, None, router, options(), async {
            let _ = stopped.await;
        }));
        (addr, stop, server)
    }

    #[tokio::test]
    async fn a_drain_finishes_the_request_in_flight_and_closes_a_half_open_connection_at_once() {
        let (entered, handler_entered) = oneshot::channel::<()>();
        let entered = Arc::new(std::sync::Mutex::new(Some(entered)));
        let router = Router::new().route(
            "/slow",
            get(move || async move {
                if let Some(tx) = entered.lock().unwrap().take() {
                    let _ = tx.send(());
                }
                tokio::time::sleep(Duration::from_millis(300)).await;
                "done"
            }),
        );
        let (addr, stop, server) = start(router).await;
        // Half a head first: its connection task (tasks run in order on this test's one
        // thread) has read it by the time the other request reaches its handler.
        let mut half_open = TcpStream::connect(addr).await.unwrap();
        half_open.write_all(b"GET /slow HTTP/1.1\r\nHo").await.unwrap();
        let mut busy = TcpStream::connect(addr).await.unwrap();
        busy.write_all(b"GET /slow HTTP/1.1\r\nHost: x\r\n\r\n").await.unwrap();
        handler_entered.await.unwrap();

        stop.send(()).unwrap();
        let mut buf = [0u8; 64];
        let read = tokio::time::timeout(Duration::from_secs(1), half_open.read(&mut buf)).await;
        assert!(matches!(read, Ok(Ok(0) | Err(_))), "the half-open connection is closed: {read:?}");
        let mut response = Vec::new();
        busy.read_to_end(&mut response).await.unwrap();
        let response = String::from_utf8_lossy(&response);
        assert!(response.starts_with("HTTP/1.1 200"), "{response}");
        assert!(response.ends_with("done"), "{response}");
        let drained = server.await.unwrap().unwrap();
        assert_eq!(drained.cut_off, 0);
    }

    #[tokio::test]
    async fn a_body_still_arriving_at_a_drain_is_answered_503_once_the_work_in_flight_is_done() {
        let (entered, handler_entered) = oneshot::channel::<()>();
        let entered = Arc::new(std::sync::Mutex::new(Some(entered)));
        let (finish, finished) = oneshot::channel::<()>();
        let finished = Arc::new(tokio::sync::Mutex::new(Some(finished)));
        let (reading, handler_reading) = oneshot::channel::<()>();
        let reading = Arc::new(std::sync::Mutex::new(Some(reading)));
        let router = Router::new()
            .route(
                "/slow",
                get(move || async move {
                    if let Some(tx) = entered.lock().unwrap().take() {
                        let _ = tx.send(());
                    }
                    if let Some(rx) = finished.lock().await.take() {
                        let _ = rx.await;
                    }
                    "done"
                }),
            )
            .route(
                "/v1/echo",
                post(move |request: Request<Body>| async move {
                    if let Some(tx) = reading.lock().unwrap().take() {
                        let _ = tx.send(());
                    }
                    let body = axum::body::to_bytes(request.into_body(), usize::MAX).await;
                    format!("{} bytes", body.map(|b| b.len()).unwrap_or(0))
                }),
            );
        // A body read timeout far beyond the test: only the drain can end the wait.
        let listener = TcpListener::bind("127.0.0.1:0").await.unwrap();
        let addr = listener.local_addr().unwrap();
        let (stop, stopped) = oneshot::channel::<()>();
        let options = ServeOptions { body_read_timeout: Duration::from_secs(3600), ..options() };
        let server = tokio::spawn(serve_listener(listener, None, router, options, async {
            let _ = stopped.await;
        }));
        let mut busy = TcpStream::connect(addr).await.unwrap();
        busy.write_all(b"GET /slow HTTP/1.1\r\nHost: x\r\n\r\n").await.unwrap();
        handler_entered.await.unwrap();
        let mut half = TcpStream::connect(addr).await.unwrap();
        half.write_all(b"POST /v1/echo HTTP/1.1\r\nHost: x\r\nContent-Length: 1000\r\n\r\n{\"a\"")
            .await
            .unwrap();
        handler_reading.await.unwrap();

        stop.send(()).unwrap();
        // While the slow request is in flight the half-sent body may still come: no answer.
        let mut buf = [0u8; 64];
        let early = tokio::time::timeout(Duration::from_millis(300), half.read(&mut buf)).await;
        assert!(early.is_err(), "answered while work was in flight: {early:?}");

        finish.send(()).unwrap();
        let mut response = Vec::new();
        busy.read_to_end(&mut response).await.unwrap();
        assert!(String::from_utf8_lossy(&response).ends_with("done"));
        let mut response = Vec::new();
        tokio::time::timeout(Duration::from_secs(5), half.read_to_end(&mut response))
            .await
            .expect("answered once the work in flight is done")
            .unwrap();
        let response = String::from_utf8_lossy(&response);
        assert!(response.starts_with("HTTP/1.1 503"), "{response}");
        assert!(response.contains("\"draining\""), "{response}");
        assert!(response.contains("connection: close"), "{response}");
        let drained = server.await.unwrap().unwrap();
        assert_eq!(drained.cut_off, 0);
    }

    #[tokio::test]
    async fn a_body_that_stalls_after_the_head_is_answered_408_and_one_in_time_is_served() {
        let router = Router::new()
            .route("/v1/echo", post(|body: Bytes| async move { format!("{} bytes", body.len()) }));
        let (addr, _stop, _server) = start(router).await;
        let mut stalled = TcpStream::connect(addr).await.unwrap();
        stalled
            .write_all(
                b"POST /v1/echo HTTP/1.1\r\nHost: x\r\nContent-Length: 1000\r\n\r\n0123456789",
            )
            .await
            .unwrap();
        let mut response = Vec::new();
        tokio::time::timeout(Duration::from_secs(2), stalled.read_to_end(&mut response))
            .await
            .unwrap()
            .unwrap();
        let response = String::from_utf8_lossy(&response);
        assert!(response.starts_with("HTTP/1.1 408"), "{response}");
        assert!(response.contains("request_timeout"), "{response}");
        assert!(response.contains("x-request-id: "), "even a 408 carries its id: {response}");

        let mut in_time = TcpStream::connect(addr).await.unwrap();
        in_time
            .write_all(b"POST /v1/echo HTTP/1.1\r\nHost: x\r\nContent-Length: 4\r\nConnection: close\r\n\r\n")
            .await
            .unwrap();
        // Not a wait for a condition: the body comes apart from its head, so the timer is
        // armed, and within the 200 ms it allows.
        tokio::time::sleep(Duration::from_millis(100)).await;
        in_time.write_all(b"abcd").await.unwrap();
        let mut response = Vec::new();
        in_time.read_to_end(&mut response).await.unwrap();
        let response = String::from_utf8_lossy(&response);
        assert!(response.starts_with("HTTP/1.1 200"), "{response}");
        assert!(response.ends_with("4 bytes"), "{response}");
    }

    /// One GET on a fresh connection; the response's `x-request-id` and body.
    async fn get_id(addr: SocketAddr, sent: Option<&str>) -> (String, String) {
        let mut conn = TcpStream::connect(addr).await.unwrap();
        let header = sent.map(|id| format!("x-request-id: {id}\r\n")).unwrap_or_default();
        let head = format!("GET /v1/id HTTP/1.1\r\nHost: x\r\n{header}Connection: close\r\n\r\n");
        conn.write_all(head.as_bytes()).await.unwrap();
        let mut response = Vec::new();
        conn.read_to_end(&mut response).await.unwrap();
        let response = String::from_utf8_lossy(&response).into_owned();
        let (head, body) = response.split_once("\r\n\r\n").unwrap();
        let id = head.lines().find_map(|l| l.strip_prefix("x-request-id: ")).unwrap_or_default();
        (id.to_owned(), body.to_owned())
    }

    #[tokio::test]
    async fn every_answer_carries_the_request_id_the_handler_read() {
        let router = Router::new().route(
            "/v1/id",
            get(|headers: axum::http::HeaderMap| async move {
                let id = headers.get(request_id::HEADER).unwrap();
                id.to_str().unwrap().to_owned()
            }),
        );
        let (addr, _stop, _server) = start(router).await;
        assert_eq!(get_id(addr, Some("req-1")).await, ("req-1".into(), "req-1".into()));
        for sent in [None, Some("two words")] {
            let (id, seen) = get_id(addr, sent).await;
            assert_eq!(id.len(), 32, "{sent:?}: {id}");
            assert_eq!(seen, id, "the handler read the id the client got");
        }
    }
}
