//! The listener: connections (counted exactly), routing, the `/_sim/` control API, stats.
//!
//! Connections are driven one by one with hyper's HTTP/1 server so the simulator can do what a
//! router cannot: close a connection with no response (`reset`), hold one open forever
//! (`hang`, `stall_after`), and count the moment the server side sees a connection end.

use std::borrow::Cow;
use std::collections::{BTreeMap, HashMap};
use std::io;
use std::net::SocketAddr;
use std::pin::Pin;
use std::sync::atomic::{AtomicBool, AtomicU64, Ordering};
use std::sync::{Arc, Mutex, MutexGuard};
use std::task::{Context, Poll};
use std::time::{Duration, SystemTime, UNIX_EPOCH};

use bytes::Bytes;
use http_body_util::BodyExt;
use hyper::body::Incoming;
use hyper::header::{self, HeaderMap, HeaderValue};
use hyper::{Method, Request, Response, StatusCode};
use hyper_util::rt::TokioIo;
use serde::{Deserialize, Serialize};
use serde_json::Value;
use tokio::io::{AsyncRead, AsyncWrite, ReadBuf};
use tokio::net::{TcpListener, TcpStream};
use tokio::sync::{mpsc, watch};

use crate::SimError;
use crate::anthropic::{self, MessagesRequest};
use crate::behaviour::{Behaviour, DEFAULT_CHUNKS, Reply, Script, StatusReply};
use crate::body::{Aborted, Chunk, SimBody};
use crate::openai::{self, ApiError, ChatRequest, Completion};

mod gemini_http;

// === Public handle ===

/// A running simulator. Dropping it stops the listener and closes its connections.
pub struct SimServer {
    pub local_addr: SocketAddr,
    state: Arc<State>,
    shutdown: watch::Sender<bool>,
}

/// Binds `addr` and serves in the background until the returned handle is dropped.
pub async fn start(addr: SocketAddr) -> Result<SimServer, SimError> {
    let listener =
        TcpListener::bind(addr).await.map_err(|source| SimError::Listen { addr, source })?;
    let local_addr = listener.local_addr().map_err(|source| SimError::Listen { addr, source })?;
    let state = Arc::new(State::new());
    let (shutdown, stop) = watch::channel(false);
    tokio::spawn(accept_loop(listener, state.clone(), stop));
    tracing::info!(%local_addr, "simulator listening");
    Ok(SimServer { local_addr, state, shutdown })
}

impl SimServer {
    /// `http://ADDR/v1`: what a provider's `base_url` should be set to.
    pub fn base_url(&self) -> String {
        format!("http://{}/v1", self.local_addr)
    }

    /// Scripts `model`; a sequence starts again from its first step.
    pub fn set(&self, model: impl Into<String>, behaviour: Behaviour) {
        self.state.set(model.into(), behaviour);
    }

    /// Scripts every model in `script`.
    pub fn set_script(&self, script: Script) {
        for (model, behaviour) in script {
            self.state.set(model, behaviour);
        }
    }

    /// `model` answers `ok` again.
    pub fn unset(&self, model: &str) {
        self.state.unset(model);
    }

    /// Only these bearer keys are accepted; empty accepts any request.
    pub fn set_keys(&self, keys: Vec<String>) {
        *lock(&self.state.keys) = keys;
    }

    /// Chat requests received for `model` (including ones rejected for their key).
    pub fn requests(&self, model: &str) -> u64 {
        lock(&self.state.models).get(model).map_or(0, |m| m.requests)
    }

    pub fn stats(&self) -> Stats {
        self.state.stats()
    }

    /// The last chat request received for `model`.
    pub fn last_request(&self, model: &str) -> Option<LastRequest> {
        lock(&self.state.models).get(model).and_then(|m| m.last.clone())
    }

    /// Forgets scripts, keys, request counters and last requests (see [`State::reset`]).
    pub fn reset(&self) {
        self.state.reset();
    }

    /// Stops serving now (the same as dropping the handle).
    pub fn shutdown(self) {}
}

impl Drop for SimServer {
    fn drop(&mut self) {
        let _ = self.shutdown.send(true);
    }
}

/// `GET /_sim/stats`.
#[derive(Debug, Clone, Default, PartialEq, Eq, Serialize, Deserialize)]
pub struct Stats {
    pub models: BTreeMap<String, ModelStats>,
    pub connections: ConnectionStats,
    /// Provider requests of any model (chat completions and model lists).
    pub requests: u64,
}

#[derive(Debug, Clone, Copy, Default, PartialEq, Eq, Serialize, Deserialize)]
pub struct ModelStats {
    pub requests: u64,
}

#[derive(Debug, Clone, Copy, Default, PartialEq, Eq, Serialize, Deserialize)]
pub struct ConnectionStats {
    pub opened: u64,
    pub closed: u64,
    pub open: u64,
}

/// A request as the simulator received it, for tests that check what the gateway forwarded.
///
/// Kept as received (cheap reference-counted clones of hyper's buffers) and turned into
/// strings or JSON only when asked: the benchmark should not pay for inspection.
#[derive(Debug, Clone)]
pub struct LastRequest {
    uri: hyper::Uri,
    headers: HeaderMap,
    body: Bytes,
}

impl LastRequest {
    pub fn path(&self) -> &str {
        self.uri.path()
    }

    /// A header's value (names are case-insensitive); repeated headers joined with ", ".
    pub fn header(&self, name: &str) -> Option<String> {
        let mut values = self.headers.get_all(name).iter();
        let first = String::from_utf8_lossy(values.next()?.as_bytes()).into_owned();
        Some(values.fold(first, |mut joined, v| {
            joined.push_str(", ");
            joined.push_str(&String::from_utf8_lossy(v.as_bytes()));
            joined
        }))
    }

    /// All headers: lower-case names, repeated headers joined with ", ".
    pub fn headers(&self) -> BTreeMap<String, String> {
        self.headers
            .keys()
            .filter_map(|name| Some((name.as_str().to_owned(), self.header(name.as_str())?)))
            .collect()
    }

    pub fn body(&self) -> &Bytes {
        &self.body
    }

    /// The body as JSON, or as a JSON string when it is not JSON.
    pub fn body_json(&self) -> Value {
        serde_json::from_slice(&self.body)
            .unwrap_or_else(|_| Value::String(String::from_utf8_lossy(&self.body).into_owned()))
    }
}

// === Shared state ===

struct State {
    models: Mutex<HashMap<String, ModelState>>,
    keys: Mutex<Vec<String>>,
    connections: Mutex<ConnectionStats>,
    requests: AtomicU64,
    next_id: AtomicU64,
    started: u64,
}

#[derive(Default)]
struct ModelState {
    script: Option<Arc<Behaviour>>,
    /// Requests served under the current script: the index into a sequence.
    position: u64,
    requests: u64,
    last: Option<LastRequest>,
}

/// A poisoned lock only means a panic elsewhere; the counters inside are still usable.
fn lock<T>(m: &Mutex<T>) -> MutexGuard<'_, T> {
    m.lock().unwrap_or_else(|e| e.into_inner())
}

impl State {
    fn new() -> Self {
        State {
            models: Mutex::new(HashMap::new()),
            keys: Mutex::new(Vec::new()),
            connections: Mutex::new(ConnectionStats::default()),
            requests: AtomicU64::new(0),
            next_id: AtomicU64::new(1),
            started: unix_now(),
        }
    }

    fn set(&self, model: String, behaviour: Behaviour) {
        let mut models = lock(&self.models);
        let entry = models.entry(model).or_default();
        entry.script = Some(Arc::new(behaviour));
        entry.position = 0;
    }

    fn unset(&self, model: &str) {
        if let Some(entry) = lock(&self.models).get_mut(model) {
            entry.script = None;
            entry.position = 0;
        }
    }

    fn behaviour(&self, model: &str) -> Behaviour {
        lock(&self.models).get(model).and_then(|m| m.script.as_deref().cloned()).unwrap_or_default()
    }

    /// Clears scripts, keys and request counters. Connection counters restart from the
    /// connections open now (`opened = open`, `closed = 0`), so `open` stays true.
    fn reset(&self) {
        lock(&self.models).clear();
        lock(&self.keys).clear();
        self.requests.store(0, Ordering::Relaxed);
        let mut conns = lock(&self.connections);
        *conns = ConnectionStats { opened: conns.open, closed: 0, open: conns.open };
    }

    fn stats(&self) -> Stats {
        let models = lock(&self.models)
            .iter()
            .filter(|(_, m)| m.requests > 0 || m.script.is_some())
            .map(|(name, m)| (name.clone(), ModelStats { requests: m.requests }))
            .collect();
        Stats {
            models,
            connections: *lock(&self.connections),
            requests: self.requests.load(Ordering::Relaxed),
        }
    }

    fn connection_opened(&self) {
        let mut c = lock(&self.connections);
        c.opened += 1;
        c.open += 1;
    }

    fn connection_closed(&self) {
        let mut c = lock(&self.connections);
        c.closed += 1;
        c.open = c.open.saturating_sub(1);
    }

    /// `chatcmpl-` plus 29 base-62 characters, like OpenAI's, unique within this process.
    fn completion_id(&self) -> String {
        let n = self.next_id.fetch_add(1, Ordering::Relaxed);
        let mut id = String::with_capacity(38);
        id.push_str("chatcmpl-");
        // 10 base-62 digits use 60 of a u64's 64 bits: three words make the 29 characters.
        push_base62(&mut id, splitmix(n ^ self.started), 10);
        push_base62(&mut id, splitmix(n.wrapping_add(1 << 40)), 10);
        push_base62(&mut id, splitmix(n.wrapping_add(2 << 40)), 9);
        id
    }

    /// One lock: counts and remembers a provider request for `model` and, when `advance`
    /// (key and body were good), takes its next scripted step.
    fn take_step(
        &self,
        model: Cow<'_, str>,
        parts: &hyper::http::request::Parts,
        body: &Bytes,
        advance: bool,
    ) -> (Option<Arc<Behaviour>>, u64) {
        let mut models = lock(&self.models);
        let entry = match models.get_mut(&*model) {
            Some(entry) => entry,
            None => models.entry(model.into_owned()).or_default(),
        };
        entry.requests += 1;
        entry.last = Some(LastRequest {
            uri: parts.uri.clone(),
            headers: parts.headers.clone(),
            body: body.clone(),
        });
        let script = entry.script.clone();
        let position = entry.position;
        if advance {
            entry.position += 1;
        }
        (script, position)
    }

    fn request_id(&self) -> String {
        let n = self.next_id.fetch_add(1, Ordering::Relaxed);
        format!("req_{:016x}{:016x}", splitmix(n), splitmix(n ^ self.started))
    }
}

fn splitmix(mut x: u64) -> u64 {
    x = x.wrapping_add(0x9e37_79b9_7f4a_7c15);
    x = (x ^ (x >> 30)).wrapping_mul(0xbf58_476d_1ce4_e5b9);
    x = (x ^ (x >> 27)).wrapping_mul(0x94d0_49bb_1331_11eb);
    x ^ (x >> 31)
}

fn push_base62(out: &mut String, mut x: u64, len: usize) {
    const ALPHABET: &[u8; 62] = b"0123456789ABCDEFGHIJKLMNOPQRSTUVWXYZabcdefghijklmnopqrstuvwxyz";
    for _ in 0..len {
        out.push(char::from(ALPHABET[(x % 62) as usize]));
        x /= 62;
    }
}

fn unix_now() -> u64 {
    SystemTime::now().duration_since(UNIX_EPOCH).map_or(0, |d| d.as_secs())
}

// === Connections ===

async fn accept_loop(listener: TcpListener, state: Arc<State>, mut stop: watch::Receiver<bool>) {
    loop {
        let accepted = tokio::select! {
            accepted = listener.accept() => accepted,
            _ = stop.changed() => return,
        };
        let stream = match accepted {
            Ok((stream, _peer)) => stream,
            Err(error) => {
                // EMFILE and friends: back off instead of spinning on the error.
                tracing::warn!(%error, "simulator accept failed");
                tokio::time::sleep(Duration::from_millis(20)).await;
                continue;
            }
        };
        let _ = stream.set_nodelay(true);
        state.connection_opened();
        let conn = Arc::new(ConnFlags::default());
        let io = CountedStream { stream, conn: conn.clone(), state: state.clone() };
        tokio::spawn(serve_connection(io, conn, state.clone(), stop.clone()));
    }
}

async fn serve_connection(
    io: CountedStream,
    conn: Arc<ConnFlags>,
    state: Arc<State>,
    mut stop: watch::Receiver<bool>,
) {
    let service = hyper::service::service_fn(move |req| handle(state.clone(), conn.clone(), req));
    let mut builder = hyper::server::conn::http1::Builder::new();
    // No timer is configured, so no header timeout: a test may open a connection and wait.
    builder.keep_alive(true).header_read_timeout(None);
    let connection = builder.serve_connection(TokioIo::new(io), service);
    tokio::select! {
        result = connection => {
            if let Err(error) = result {
                tracing::debug!(%error, "simulator connection ended with an error");
            }
        }
        _ = stop.changed() => {}
    }
    // `io` is dropped with the connection future: that closes the socket and counts it.
}

/// Per-connection flags a handler sets for the socket's close.
#[derive(Default)]
struct ConnFlags {
    /// Close with an RST instead of a FIN.
    reset: AtomicBool,
}

/// The TCP stream, counting its close when hyper lets go of it (EOF, error, reset, shutdown).
struct CountedStream {
    stream: TcpStream,
    conn: Arc<ConnFlags>,
    state: Arc<State>,
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

// === Routing ===

type HttpResponse = Response<SimBody>;

async fn handle(
    state: Arc<State>,
    conn: Arc<ConnFlags>,
    req: Request<Incoming>,
) -> Result<HttpResponse, Aborted> {
    let path = req.uri().path();
    if path.starts_with("/_sim/") {
        return Ok(control(&state, req).await);
    }
    let method = req.method().clone();
    if path == "/v1/messages" {
        if method == Method::POST {
            return messages(&state, &conn, req).await;
        }
        let err = anthropic::not_found(method.as_str(), path);
        return Ok(anthropic_error_response(&err, &state.request_id()));
    }
    if let Some((model, stream)) = crate::gemini::route(path) {
        if method == Method::POST {
            return gemini_http::generate(&state, &conn, req, model, stream).await;
        }
    } else if path.ends_with("/chat/completions") {
        if method == Method::POST {
            return chat(&state, &conn, req).await;
        }
    } else if (path == "/v1/models" || path == "/models") && method == Method::GET {
        state.requests.fetch_add(1, Ordering::Relaxed);
        if let Err(err) = authorize(&state, req.headers()) {
            return Ok(error_response(&err, &state.request_id()));
        }
        return Ok(models(&state));
    }
    let err = ApiError::invalid_url(method.as_str(), path);
    Ok(error_response(&err, &state.request_id()))
}

fn models(state: &State) -> HttpResponse {
    let names: Vec<String> = {
        let models = lock(&state.models);
        let mut names: Vec<String> = models.keys().cloned().collect();
        names.sort();
        names
    };
    json_response(
        StatusCode::OK,
        openai::models_list(names.iter().map(String::as_str), state.started),
    )
}

fn bearer(headers: &HeaderMap) -> Option<&str> {
    let value = headers.get(header::AUTHORIZATION)?.to_str().ok()?;
    let (scheme, key) = value.split_once(' ')?;
    scheme.eq_ignore_ascii_case("bearer").then(|| key.trim())
}

fn authorize(state: &State, headers: &HeaderMap) -> Result<(), ApiError> {
    let keys = lock(&state.keys);
    if keys.is_empty() {
        return Ok(());
    }
    match bearer(headers) {
        Some(key) if keys.iter().any(|k| k == key) => Ok(()),
        Some(key) => Err(ApiError::incorrect_key(key)),
        None => Err(ApiError::missing_key()),
    }
}

// === Chat completions ===

async fn chat(
    state: &State,
    conn: &Arc<ConnFlags>,
    req: Request<Incoming>,
) -> Result<HttpResponse, Aborted> {
    let (parts, body) = req.into_parts();
    // A client that goes away mid-body ends the connection; there is nobody to answer.
    let body = body.collect().await.map_err(|_| Aborted)?.to_bytes();
    state.requests.fetch_add(1, Ordering::Relaxed);
    let request_id = state.request_id();
    let parsed = openai::parse_request(&body);
    // A body that fails validation is still attributed to its model when it names one.
    let model = match &parsed {
        Ok(request) => Some(Cow::Borrowed(request.model.as_str())),
        Err(_) => openai::request_model(&body).map(Cow::Owned),
    };
    let authorized = authorize(state, &parts.headers);

    let step = model
        .map(|model| state.take_step(model, &parts, &body, authorized.is_ok() && parsed.is_ok()));
    // OpenAI checks the key before it looks at the body.
    if let Err(err) = authorized {
        return Ok(error_response(&err, &request_id));
    }
    let request = match parsed {
        Ok(request) => request,
        Err(err) => return Ok(error_response(&err, &request_id)),
    };
    let default = Behaviour::default();
    let (script, position) = step.unwrap_or((None, 0));
    let behaviour = script.as_deref().unwrap_or(&default).at(position);
    let api_key = bearer(&parts.headers);
    respond(state, conn, behaviour, &request, api_key, request_id).await
}

async fn respond(
    state: &State,
    conn: &Arc<ConnFlags>,
    behaviour: &Behaviour,
    request: &ChatRequest,
    api_key: Option<&str>,
    request_id: String,
) -> Result<HttpResponse, Aborted> {
    match behaviour {
        Behaviour::Ok(reply) => {
            sleep_ms(reply.delay_ms).await;
            let text = reply_text(reply.text.as_deref(), &request.model);
            let id = state.completion_id();
            let completion = Completion { id: &id, created: unix_now(), model: &request.model };
            if request.stream {
                let wire = OpenAiStream::new(&completion, request);
                let plan = StreamPlan::new(Box::new(wire), text, reply, None);
                Ok(stream_response(plan.spawn(), &request_id))
            } else {
                let mut resp =
                    json_response(StatusCode::OK, completion.body(&text, request.prompt_tokens));
                insert_request_id(&mut resp, &request_id);
                Ok(resp)
            }
        }
        Behaviour::Status(status) => {
            sleep_ms(status.delay_ms).await;
            let err = scripted_error(status, request, api_key, &request_id);
            Ok(error_response(&err, &request_id))
        }
        Behaviour::Hang => std::future::pending().await,
        Behaviour::Reset => {
            conn.reset.store(true, Ordering::Release);
            // hyper closes a connection whose service fails, writing nothing.
            Err(Aborted)
        }
        Behaviour::Malformed => {
            if request.stream {
                let (tx, rx) = mpsc::channel(2);
                let id = state.completion_id();
                let completion = Completion { id: &id, created: unix_now(), model: &request.model };
                let role = completion.role_chunk(request.include_usage);
                // Capacity 2 holds both frames, so these sends cannot fail for lack of room.
                let _ = tx.try_send(Chunk::Data(role));
                let _ = tx.try_send(Chunk::Data(Bytes::from_static(openai::MALFORMED_FRAME)));
                Ok(stream_response(SimBody::Channel(rx), &request_id))
            } else {
                let mut resp =
                    json_response(StatusCode::OK, Bytes::from_static(openai::MALFORMED_BODY));
                insert_request_id(&mut resp, &request_id);
                Ok(resp)
            }
        }
        Behaviour::StreamError(e) => {
            let message = e.message.as_deref().unwrap_or(
                "The server had an error while processing your request. Sorry about that!",
            );
            if request.stream {
                let id = state.completion_id();
                let completion = Completion { id: &id, created: unix_now(), model: &request.model };
                let text = reply_text(None, &request.model);
                let reply = Reply { chunks: DEFAULT_CHUNKS.max(e.after), ..Reply::default() };
                let wire = OpenAiStream::new(&completion, request);
                let plan = StreamPlan::new(
                    Box::new(wire),
                    text,
                    &reply,
                    Some((e.after, message.to_owned())),
                );
                Ok(stream_response(plan.spawn(), &request_id))
            } else {
                let status =
                    StatusReply { message: Some(message.to_owned()), ..StatusReply::new(500) };
                let err = scripted_error(&status, request, api_key, &request_id);
                Ok(error_response(&err, &request_id))
            }
        }
        // `Behaviour::at` never yields a sequence; answer as an unscripted model would.
        Behaviour::Sequence(_) => {
            Box::pin(respond(state, conn, &Behaviour::default(), request, api_key, request_id))
                .await
        }
    }
}

fn scripted_error(
    status: &StatusReply,
    request: &ChatRequest,
    api_key: Option<&str>,
    request_id: &str,
) -> ApiError {
    openai::status_error(
        status.status,
        &request.model,
        status.message.as_deref(),
        api_key,
        request_id,
        status.retry_after,
    )
}

// === Anthropic messages ===

/// Anthropic authenticates with `x-api-key` (checked, as for OpenAI, only when accepted keys
/// are set, and before the body).
fn authorize_anthropic(state: &State, headers: &HeaderMap) -> Result<(), ApiError> {
    let keys = lock(&state.keys);
    if keys.is_empty() {
        return Ok(());
    }
    match headers.get("x-api-key").and_then(|v| v.to_str().ok()) {
        Some(key) if keys.iter().any(|k| k == key.trim()) => Ok(()),
        present => Err(anthropic::auth_error(present.is_some())),
    }
}

async fn messages(
    state: &State,
    conn: &Arc<ConnFlags>,
    req: Request<Incoming>,
) -> Result<HttpResponse, Aborted> {
    let (parts, body) = req.into_parts();
    let body = body.collect().await.map_err(|_| Aborted)?.to_bytes();
    state.requests.fetch_add(1, Ordering::Relaxed);
    let request_id = state.request_id();
    let parsed = anthropic::parse_request(&body);
    let model = match &parsed {
        Ok(request) => Some(Cow::Borrowed(request.model.as_str())),
        Err(_) => openai::request_model(&body).map(Cow::Owned),
    };
    let authorized = authorize_anthropic(state, &parts.headers);
    let step = model
        .map(|model| state.take_step(model, &parts, &body, authorized.is_ok() && parsed.is_ok()));
    if let Err(err) = authorized {
        return Ok(anthropic_error_response(&err, &request_id));
    }
    let request = match parsed {
        Ok(request) => request,
        Err(err) => return Ok(anthropic_error_response(&err, &request_id)),
    };
    let default = Behaviour::default();
    let (script, position) = step.unwrap_or((None, 0));
    let behaviour = script.as_deref().unwrap_or(&default).at(position);
    respond_messages(state, conn, behaviour, &request, request_id).await
}

/// A scripted behaviour in Anthropic's wire format (the same behaviours as for OpenAI).
async fn respond_messages(
    state: &State,
    conn: &Arc<ConnFlags>,
    behaviour: &Behaviour,
    request: &MessagesRequest,
    request_id: String,
) -> Result<HttpResponse, Aborted> {
    let message = || anthropic::Message {
        id: anthropic::message_id(&state.completion_id()),
        model: request.model.clone(),
        prompt_tokens: request.prompt_tokens,
    };
    let tool_call = request.tool_call.as_ref();
    match behaviour {
        Behaviour::Ok(reply) => {
            sleep_ms(reply.delay_ms).await;
            let text = reply_text(reply.text.as_deref(), &request.model);
            if request.stream {
                let wire = message().stream(tool_call);
                let text = wire.text(text);
                let plan = StreamPlan::new(Box::new(wire), text, reply, None);
                Ok(anthropic_stream_response(plan.spawn(), &request_id))
            } else {
                let mut resp = json_response(StatusCode::OK, message().body(&text, tool_call));
                insert_anthropic_request_id(&mut resp, &request_id);
                Ok(resp)
            }
        }
        Behaviour::Status(status) => {
            sleep_ms(status.delay_ms).await;
            let err = anthropic::status_error(
                status.status,
                &request.model,
                status.message.as_deref(),
                status.retry_after,
            );
            Ok(anthropic_error_response(&err, &request_id))
        }
        Behaviour::Hang => std::future::pending().await,
        Behaviour::Reset => {
            conn.reset.store(true, Ordering::Release);
            Err(Aborted)
        }
        Behaviour::Malformed => {
            if request.stream {
                let (tx, rx) = mpsc::channel(4);
                // Capacity 4 holds every frame, so these sends cannot fail for lack of room.
                for frame in message().stream(None).head() {
                    let _ = tx.try_send(Chunk::Data(frame));
                }
                let _ = tx.try_send(Chunk::Data(Bytes::from_static(anthropic::MALFORMED_FRAME)));
                Ok(anthropic_stream_response(SimBody::Channel(rx), &request_id))
            } else {
                let mut resp =
                    json_response(StatusCode::OK, Bytes::from_static(openai::MALFORMED_BODY));
                insert_anthropic_request_id(&mut resp, &request_id);
                Ok(resp)
            }
        }
        Behaviour::StreamError(e) => {
            // Anthropic's in-band failure is an overload; its HTTP form is a 529.
            let text = e.message.as_deref().unwrap_or("Overloaded");
            if request.stream {
                let reply = Reply { chunks: DEFAULT_CHUNKS.max(e.after), ..Reply::default() };
                let wire = message().stream(None);
                let body = reply_text(None, &request.model);
                let plan =
                    StreamPlan::new(Box::new(wire), body, &reply, Some((e.after, text.to_owned())));
                Ok(anthropic_stream_response(plan.spawn(), &request_id))
            } else {
                let err = anthropic::status_error(529, &request.model, Some(text), None);
                Ok(anthropic_error_response(&err, &request_id))
            }
        }
        Behaviour::Sequence(_) => {
            Box::pin(respond_messages(state, conn, &Behaviour::default(), request, request_id))
                .await
        }
    }
}

fn anthropic_error_response(err: &ApiError, request_id: &str) -> HttpResponse {
    let status = StatusCode::from_u16(err.status).unwrap_or(StatusCode::INTERNAL_SERVER_ERROR);
    let mut resp = json_response(status, anthropic::error_body(err, request_id));
    if let Some(secs) = err.retry_after
        && let Ok(value) = HeaderValue::from_str(&secs.to_string())
    {
        resp.headers_mut().insert("retry-after", value);
    }
    insert_anthropic_request_id(&mut resp, request_id);
    resp
}

fn anthropic_stream_response(body: SimBody, request_id: &str) -> HttpResponse {
    let mut resp = stream_response(body, request_id);
    insert_anthropic_request_id(&mut resp, request_id);
    resp
}

/// Anthropic names its request id header `request-id`.
fn insert_anthropic_request_id(resp: &mut HttpResponse, request_id: &str) {
    if let Ok(value) = HeaderValue::from_str(request_id) {
        resp.headers_mut().insert("request-id", value);
    }
}

fn reply_text(text: Option<&str>, model: &str) -> String {
    match text {
        Some(text) => text.to_owned(),
        None => format!("Hello from {model}."),
    }
}

async fn sleep_ms(ms: u64) {
    if ms > 0 {
        tokio::time::sleep(Duration::from_millis(ms)).await;
    }
}

/// `text` cut into exactly `n` contiguous pieces of near-equal character counts (some empty
/// when the text is shorter than `n`), so the concatenation is always the text.
pub(crate) fn pieces(text: &str, n: u32) -> Vec<&str> {
    let n = n.max(1) as usize;
    let bounds: Vec<usize> =
        text.char_indices().map(|(i, _)| i).chain(std::iter::once(text.len())).collect();
    let chars = bounds.len() - 1;
    (0..n)
        .map(|i| {
            let start = bounds[i * chars / n];
            let end = bounds[(i + 1) * chars / n];
            &text[start..end]
        })
        .collect()
}

// === Streaming ===

/// One provider's stream framing around the content pieces; the pacing and the faults
/// (stall, drop, in-band error after K pieces) are the stream task's, the same for every
/// provider.
pub(crate) trait StreamWire: Send + 'static {
    /// The frames before the first content piece.
    fn head(&self) -> Vec<Bytes>;
    /// One content piece.
    fn content(&self, piece: &str) -> Bytes;
    /// The in-band error frame of a stream that fails after it started.
    fn error(&self, message: &str) -> Bytes;
    /// The frames after the last piece (`text` is the whole content), ending the stream.
    fn tail(&self, text: &str) -> Vec<Bytes>;
}

/// OpenAI's `chat.completion.chunk` framing.
struct OpenAiStream {
    id: String,
    created: u64,
    model: String,
    include_usage: bool,
    prompt_tokens: u64,
}

impl OpenAiStream {
    fn new(completion: &Completion<'_>, request: &ChatRequest) -> Self {
        OpenAiStream {
            id: completion.id.to_owned(),
            created: completion.created,
            model: completion.model.to_owned(),
            include_usage: request.include_usage,
            prompt_tokens: request.prompt_tokens,
        }
    }

    fn completion(&self) -> Completion<'_> {
        Completion { id: &self.id, created: self.created, model: &self.model }
    }
}

impl StreamWire for OpenAiStream {
    fn head(&self) -> Vec<Bytes> {
        vec![self.completion().role_chunk(self.include_usage)]
    }

    fn content(&self, piece: &str) -> Bytes {
        self.completion().content_chunk(piece, self.include_usage)
    }

    fn error(&self, message: &str) -> Bytes {
        openai::error_frame(message)
    }

    fn tail(&self, text: &str) -> Vec<Bytes> {
        let completion = self.completion();
        let mut frames = vec![completion.finish_chunk(self.include_usage)];
        if self.include_usage {
            frames.push(completion.usage_chunk(self.prompt_tokens, openai::tokens(text)));
        }
        frames.push(Bytes::from_static(openai::DONE));
        frames
    }
}

/// Everything a stream task needs, owned, so it outlives the handler.
struct StreamPlan {
    wire: Box<dyn StreamWire>,
    text: String,
    chunks: u32,
    first_token_delay_ms: u64,
    chunk_delay_ms: u64,
    stall_after: Option<u32>,
    drop_after: Option<u32>,
    error_after: Option<(u32, String)>,
}

impl StreamPlan {
    fn new(
        wire: Box<dyn StreamWire>,
        text: String,
        reply: &Reply,
        error_after: Option<(u32, String)>,
    ) -> Self {
        StreamPlan {
            wire,
            text,
            chunks: reply.chunks,
            first_token_delay_ms: reply.first_token_delay_ms,
            chunk_delay_ms: reply.chunk_delay_ms,
            stall_after: reply.stall_after,
            drop_after: reply.drop_after,
            error_after,
        }
    }

    fn spawn(self) -> SimBody {
        // A small buffer: the task runs ahead of the socket by a few frames at most, and a
        // client that stops reading stops the task through back-pressure.
        let (tx, rx) = mpsc::channel(4);
        tokio::spawn(async move {
            // Err means the body was dropped (client gone): nothing left to do.
            let _ = self.run(&tx).await;
        });
        SimBody::Channel(rx)
    }

    async fn run(self, tx: &mpsc::Sender<Chunk>) -> Result<(), Gone> {
        for frame in self.wire.head() {
            send(tx, frame).await?;
        }
        let pieces = pieces(&self.text, self.chunks);
        for i in 0..=pieces.len() {
            let sent = u32::try_from(i).unwrap_or(u32::MAX);
            let last = i == pieces.len();
            // A fault "after K chunks" with K past the end happens after the last chunk.
            let due = |k: Option<u32>| k.is_some_and(|k| k == sent || (last && k > sent));
            if due(self.stall_after) {
                tx.closed().await;
                return Err(Gone);
            }
            if due(self.drop_after) {
                // hyper drops its unflushed output when a body fails, so let it take and flush
                // what was sent first: the client must see exactly K chunks, then the drop.
                while tx.capacity() < tx.max_capacity() {
                    if tx.is_closed() {
                        return Err(Gone);
                    }
                    tokio::time::sleep(Duration::from_millis(1)).await;
                }
                tokio::time::sleep(Duration::from_millis(20)).await;
                // A FIN, not an RST: an RST would make the client's kernel discard chunks it
                // has not read yet. The chunked body still ends without its terminator, which
                // clients report as a connection closed mid-message.
                let _ = tx.send(Chunk::Abort).await;
                return Ok(());
            }
            if let Some((_, message)) = self.error_after.as_ref().filter(|(k, _)| due(Some(*k))) {
                return send(tx, self.wire.error(message)).await;
            }
            if last {
                break;
            }
            sleep_ms(if i == 0 { self.first_token_delay_ms } else { self.chunk_delay_ms }).await;
            send(tx, self.wire.content(pieces[i])).await?;
        }
        for frame in self.wire.tail(&self.text) {
            send(tx, frame).await?;
        }
        Ok(())
    }
}

struct Gone;

async fn send(tx: &mpsc::Sender<Chunk>, bytes: Bytes) -> Result<(), Gone> {
    tx.send(Chunk::Data(bytes)).await.map_err(|_| Gone)
}

// === Responses ===

fn json_response(status: StatusCode, body: Bytes) -> HttpResponse {
    let mut resp = Response::new(SimBody::full(body));
    *resp.status_mut() = status;
    resp.headers_mut().insert(header::CONTENT_TYPE, HeaderValue::from_static("application/json"));
    resp
}

fn stream_response(body: SimBody, request_id: &str) -> HttpResponse {
    let mut resp = Response::new(body);
    let headers = resp.headers_mut();
    headers
        .insert(header::CONTENT_TYPE, HeaderValue::from_static("text/event-stream; charset=utf-8"));
    headers.insert(header::CACHE_CONTROL, HeaderValue::from_static("no-cache"));
    insert_request_id(&mut resp, request_id);
    resp
}

fn insert_request_id(resp: &mut HttpResponse, request_id: &str) {
    if let Ok(value) = HeaderValue::from_str(request_id) {
        resp.headers_mut().insert("x-request-id", value);
    }
}

fn error_response(err: &ApiError, request_id: &str) -> HttpResponse {
    let status = StatusCode::from_u16(err.status).unwrap_or(StatusCode::INTERNAL_SERVER_ERROR);
    let mut resp = json_response(status, err.body());
    for (name, value) in err.headers() {
        if let Ok(value) = HeaderValue::from_str(&value) {
            resp.headers_mut().insert(name, value);
        }
    }
    insert_request_id(&mut resp, request_id);
    resp
}

// === Control API (`/_sim/`) ===

#[derive(Deserialize)]
#[serde(deny_unknown_fields)]
struct ScriptOne {
    model: String,
    behaviour: Behaviour,
}

#[derive(Deserialize)]
#[serde(untagged)]
enum ScriptBody {
    One(ScriptOne),
    Many(Script),
}

async fn control(state: &State, req: Request<Incoming>) -> HttpResponse {
    let method = req.method().clone();
    let path = req.uri().path().to_owned();
    let query = req.uri().query().map(str::to_owned);
    let body = match req.into_body().collect().await {
        Ok(collected) => collected.to_bytes(),
        Err(_) => return control_error(StatusCode::BAD_REQUEST, "could not read the request body"),
    };
    let route = path.trim_start_matches("/_sim/");
    match (&method, route) {
        (&Method::GET, "stats") => json_value(StatusCode::OK, &state.stats()),
        (&Method::POST, "reset") => {
            state.reset();
            no_content()
        }
        (&Method::PUT, "keys") => match serde_json::from_slice::<Vec<String>>(&body) {
            Ok(keys) => {
                *lock(&state.keys) = keys;
                no_content()
            }
            Err(e) => control_error(StatusCode::BAD_REQUEST, &format!("keys: {e}")),
        },
        (&Method::GET, "keys") => json_value(StatusCode::OK, &*lock(&state.keys)),
        (&Method::POST, "script") => match serde_json::from_slice::<ScriptBody>(&body) {
            Ok(ScriptBody::One(one)) => {
                state.set(one.model, one.behaviour);
                no_content()
            }
            Ok(ScriptBody::Many(script)) => {
                for (model, behaviour) in script {
                    state.set(model, behaviour);
                }
                no_content()
            }
            // The untagged error says nothing useful; name what each form expects.
            Err(_) => match serde_json::from_slice::<ScriptOne>(&body) {
                Err(e) => control_error(
                    StatusCode::BAD_REQUEST,
                    &format!(
                        "expected {{\"model\": ..., \"behaviour\": {{\"kind\": ...}}}} or a map of model to behaviour: {e}"
                    ),
                ),
                Ok(_) => control_error(StatusCode::BAD_REQUEST, "invalid script"),
            },
        },
        (&Method::GET, "last_request") => {
            let Some(model) = query.as_deref().and_then(|q| query_param(q, "model")) else {
                return control_error(StatusCode::BAD_REQUEST, "last_request needs ?model=<model>");
            };
            let last = lock(&state.models).get(&model).and_then(|m| m.last.clone());
            match last {
                Some(last) => json_value(
                    StatusCode::OK,
                    &serde_json::json!({
                        "model": model,
                        "path": last.path(),
                        "headers": last.headers(),
                        "body": last.body_json(),
                    }),
                ),
                None => control_error(
                    StatusCode::NOT_FOUND,
                    &format!("no request seen for model {model:?}"),
                ),
            }
        }
        (method, route) if route.starts_with("models/") => {
            let model = percent_decode(&route["models/".len()..]);
            if model.is_empty() {
                return control_error(StatusCode::BAD_REQUEST, "missing model name");
            }
            match *method {
                Method::PUT | Method::POST => match serde_json::from_slice::<Behaviour>(&body) {
                    Ok(behaviour) => {
                        state.set(model, behaviour);
                        no_content()
                    }
                    Err(e) => control_error(StatusCode::BAD_REQUEST, &format!("behaviour: {e}")),
                },
                Method::GET => json_value(StatusCode::OK, &state.behaviour(&model)),
                Method::DELETE => {
                    state.unset(&model);
                    no_content()
                }
                _ => control_error(StatusCode::METHOD_NOT_ALLOWED, "use PUT, GET or DELETE"),
            }
        }
        _ => control_error(StatusCode::NOT_FOUND, &format!("no control route {method} {path}")),
    }
}

fn json_value<T: Serialize + ?Sized>(status: StatusCode, value: &T) -> HttpResponse {
    let body = serde_json::to_vec(value).unwrap_or_default();
    json_response(status, Bytes::from(body))
}

fn no_content() -> HttpResponse {
    let mut resp = Response::new(SimBody::empty());
    *resp.status_mut() = StatusCode::NO_CONTENT;
    resp
}

fn control_error(status: StatusCode, message: &str) -> HttpResponse {
    json_value(status, &serde_json::json!({ "error": message }))
}

fn query_param(query: &str, name: &str) -> Option<String> {
    query.split('&').find_map(|pair| {
        let (key, value) = pair.split_once('=').unwrap_or((pair, ""));
        (percent_decode(key) == name).then(|| percent_decode(value))
    })
}

/// `%2F` → `/` and `+` → space: model names carry slashes and get encoded by some clients.
fn percent_decode(s: &str) -> String {
    let bytes = s.as_bytes();
    let mut out = Vec::with_capacity(bytes.len());
    let mut i = 0;
    while i < bytes.len() {
        match bytes[i] {
            b'%' if i + 2 < bytes.len() => {
                match std::str::from_utf8(&bytes[i + 1..i + 3])
                    .ok()
                    .and_then(|h| u8::from_str_radix(h, 16).ok())
                {
                    Some(b) => {
                        out.push(b);
                        i += 3;
                        continue;
                    }
                    None => out.push(b'%'),
                }
            }
            b'+' => out.push(b' '),
            b => out.push(b),
        }
        i += 1;
    }
    String::from_utf8_lossy(&out).into_owned()
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn pieces_cover_the_text_exactly() {
        let p = pieces("Hello from m.", 5);
        assert_eq!(p.len(), 5);
        assert_eq!(p.concat(), "Hello from m.");
        let p = pieces("héé", 5);
        assert_eq!((p.len(), p.concat()), (5, "héé".to_owned()));
        assert_eq!(pieces("", 3), vec!["", "", ""]);
    }

    #[test]
    fn decodes_query_and_paths() {
        assert_eq!(
            query_param("a=1&model=openai%2Fgpt-4o", "model").as_deref(),
            Some("openai/gpt-4o")
        );
        assert_eq!(percent_decode("x%2"), "x%2");
        assert_eq!(percent_decode("a%zz"), "a%zz");
    }

    #[test]
    fn ids_look_like_openai_ids() {
        let state = State::new();
        let (a, b) = (state.completion_id(), state.completion_id());
        assert!(a.starts_with("chatcmpl-") && a.len() == 38 && a != b);
    }
}
