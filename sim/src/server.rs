//! The listener: connections (counted exactly), routing to one handler module per wire
//! format, and the `/_sim/` control API.
//!
//! Connections are driven one by one with hyper's HTTP/1 server so the simulator can do what a
//! router cannot: close a connection with no response (`reset`), hold one open forever
//! (`hang`, `stall_after`), and count the moment the server side sees a connection end.
//!
//! Only the paths the real APIs serve are answered; any other path gets a 404 in the error
//! shape of the API the request was meant for, as the real APIs answer it, so an adapter that
//! builds a wrong URL fails its tests instead of passing against a lenient simulator.

use std::net::SocketAddr;
use std::sync::Arc;
use std::time::Duration;

use hyper::body::Incoming;
use hyper::header::HeaderMap;
use hyper::{Method, Request};
use hyper_util::rt::TokioIo;
use tokio::net::TcpListener;
use tokio::sync::watch;

use crate::behaviour::{Behaviour, Script};
use crate::body::Aborted;
use crate::error::SimError;
use crate::gemini;

mod anthropic_http;
mod conn;
mod control;
mod gemini_http;
mod openai_http;
mod query;
mod response;
pub(crate) mod state;

use conn::{ConnFlags, CountedStream};
use response::HttpResponse;
use state::{LastRequest, State, Stats};

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
    /// `http://ADDR/v1`: what an OpenAI-compatible provider's `base_url` should be set to
    /// (Anthropic, Gemini and Azure OpenAI providers take the bare `http://ADDR`).
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
        *self.state.keys.lock() = keys;
    }

    /// Chat requests received for `model` (including ones rejected for their key).
    pub fn requests(&self, model: &str) -> u64 {
        self.state.models.lock().get(model).map_or(0, |m| m.requests)
    }

    pub fn stats(&self) -> Stats {
        self.state.stats()
    }

    /// The last chat request received for `model`.
    pub fn last_request(&self, model: &str) -> Option<LastRequest> {
        self.state.models.lock().get(model).and_then(|m| m.last.clone())
    }

    /// Forgets scripts, keys, request counters and last requests; connection counters restart
    /// from the connections open now.
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
        let conn = Arc::new(ConnFlags::default());
        let io = CountedStream::new(stream, conn.clone(), state.clone());
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

// === Routing ===

async fn handle(
    state: Arc<State>,
    conn: Arc<ConnFlags>,
    req: Request<Incoming>,
) -> Result<HttpResponse, Aborted> {
    let path = req.uri().path();
    if path.starts_with("/_sim/") {
        return Ok(control::handle(&state, req).await);
    }
    let method = req.method();
    if method == Method::POST {
        if openai_http::is_chat_path(path) {
            return openai_http::chat(&state, &conn, req).await;
        }
        if openai_http::is_responses_path(path) {
            return openai_http::responses(&state, &conn, req).await;
        }
        if path == anthropic_http::COUNT_TOKENS_PATH {
            return anthropic_http::count_tokens(&state, req).await;
        }
        if path == anthropic_http::MESSAGES_PATH {
            return anthropic_http::messages(&state, &conn, req).await;
        }
        if let Some((model, stream)) = gemini::route(path) {
            return gemini_http::generate(&state, &conn, req, model, stream).await;
        }
        if openai_http::is_embeddings_path(path) {
            return openai_http::embeddings(&state, &conn, req).await;
        }
        if let Some((model, batch)) = crate::embed::gemini_route(path) {
            return gemini_http::embed(&state, &conn, req, model, batch).await;
        }
    } else if method == Method::GET && path == "/v1/models" {
        return Ok(openai_http::models(&state, req.headers()));
    }
    Ok(not_found(&state, &req))
}

/// Which API a request that matched no route was meant for, so its 404 comes in that API's
/// error shape: Gemini by its key header, `?key=` or `v1beta` path, Anthropic by its key or
/// version header or a path ending in `/messages`, else OpenAI.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
enum Dialect {
    OpenAi,
    Anthropic,
    Gemini,
}

fn dialect(path: &str, query: Option<&str>, headers: &HeaderMap) -> Dialect {
    let gemini_key = headers.contains_key("x-goog-api-key")
        || query.is_some_and(|q| query::query_param(q, "key").is_some());
    if gemini_key || path.starts_with("/v1beta/") || path.contains(":generateContent") {
        return Dialect::Gemini;
    }
    if headers.contains_key("x-api-key")
        || headers.contains_key("anthropic-version")
        || path.ends_with("/messages")
    {
        return Dialect::Anthropic;
    }
    Dialect::OpenAi
}

fn not_found(state: &State, req: &Request<Incoming>) -> HttpResponse {
    let (method, path) = (req.method().as_str(), req.uri().path());
    match dialect(path, req.uri().query(), req.headers()) {
        Dialect::OpenAi => openai_http::not_found(state, method, path),
        Dialect::Anthropic => anthropic_http::not_found(state, method, path),
        Dialect::Gemini => gemini_http::not_found(state, method, path),
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn a_missed_route_is_answered_in_the_api_it_was_meant_for() {
        let none = HeaderMap::new();
        let with = |name: &'static str| {
            let mut headers = HeaderMap::new();
            headers.insert(name, hyper::header::HeaderValue::from_static("k"));
            headers
        };
        assert_eq!(dialect("/v1/v1/chat/completions", None, &none), Dialect::OpenAi);
        assert_eq!(dialect("/v1/v1/messages", None, &none), Dialect::Anthropic);
        assert_eq!(dialect("/v2/complete", None, &with("x-api-key")), Dialect::Anthropic);
        assert_eq!(dialect("/v1beta/v1beta/models/g", None, &none), Dialect::Gemini);
        assert_eq!(dialect("/v1/models/g:generateContent", None, &none), Dialect::Gemini);
        assert_eq!(dialect("/x", Some("key=AIza"), &none), Dialect::Gemini);
        assert_eq!(dialect("/x", None, &with("x-goog-api-key")), Dialect::Gemini);
    }
}
