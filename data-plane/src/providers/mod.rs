//! Upstream providers: one pooled HTTP client per provider, credentials resolved on the
//! node, and a wire-format adapter per provider kind behind one trait, dispatched here.
//!
//! The unified request is the client's OpenAI-shaped body ([`ChatRequest`]); the unified
//! response is an OpenAI `chat.completion` ([`Completion`]). Adapters translate both ways;
//! the types they share live in the modules below them (`adapter`, `unified`, `error`,
//! `secret`, `stream`, `sse`), never here.

use std::fmt;
use std::time::{Duration, SystemTime};

use bytes::Bytes;
use http::{StatusCode, header};
use http_body_util::{BodyExt, Full, Limited};
use hyper_util::client::legacy::Client;
use hyper_util::client::legacy::connect::HttpConnector;
use hyper_util::rt::TokioExecutor;
use tracing::warn;

use switchyard_catalog::{Fault, FaultKind, Model, Provider, ProviderKind};

use crate::chaos::{self, Cut, Injector};
use crate::failure;
use crate::request::ChatRequest;

pub mod adapter;
pub mod anthropic;
pub mod azure;
pub mod error;
pub mod gemini;
pub mod openai;
pub mod secret;
pub mod sse;
pub mod stream;
pub mod unified;

pub use adapter::{Adapter, StreamDecoder};
pub use error::{CallError, StreamError, UpstreamError};
pub use secret::Secret;
pub use stream::UpstreamStream;
pub use unified::{Completion, Fields, StreamEvent, Usage};

const CONNECT_TIMEOUT: Duration = Duration::from_secs(5);
const POOL_IDLE_TIMEOUT: Duration = Duration::from_secs(90);
/// Upstream bodies larger than this are refused (a completion is kilobytes).
const MAX_RESPONSE_BYTES: usize = 16 * 1024 * 1024;

pub type HttpsClient = Client<hyper_rustls::HttpsConnector<HttpConnector>, Full<Bytes>>;

/// A 2xx answer with its body unread: the upstream's, or one an injected fault made.
enum Answer {
    Upstream(http::Response<hyper::body::Incoming>),
    Injected(Bytes),
}

/// A provider as this node uses it: its definition, resolved credentials, its connection pool.
pub struct ProviderRuntime {
    pub def: Provider,
    /// Primary first, then reserves; a reference that cannot be resolved is kept as its error.
    credentials: Vec<Result<Secret, String>>,
    client: HttpsClient,
    adapter: Box<dyn Adapter>,
}

impl fmt::Debug for ProviderRuntime {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.debug_struct("ProviderRuntime").field("name", &self.def.name).finish_non_exhaustive()
    }
}

impl ProviderRuntime {
    /// Resolves credentials (blocking: a file read) and builds the pool. Call off the
    /// request path, when config is applied.
    pub fn new(def: Provider) -> Self {
        let credentials = def
            .api_keys
            .iter()
            .map(|r| {
                r.resolve().map(|s| Secret::new(&s)).map_err(|e| {
                    warn!(provider = %def.name, credential = %r, error = %e, "credential unavailable");
                    e.to_string()
                })
            })
            .collect();
        let adapter: Box<dyn Adapter> = match def.kind {
            ProviderKind::Openai | ProviderKind::OpenaiCompatible => Box::new(openai::OpenAi),
            ProviderKind::AzureOpenai => Box::new(azure::Azure),
            ProviderKind::Anthropic => Box::new(anthropic::Anthropic),
            ProviderKind::Gemini => Box::new(gemini::Gemini),
        };
        Self { def, credentials, client: build_client(), adapter }
    }

    /// The upstream body of one attempt (see [`Adapter::body`]).
    pub fn body(&self, model: &Model, request: &ChatRequest<'_>) -> Result<Bytes, CallError> {
        self.adapter.body(model, request)
    }

    /// See [`Adapter::translates`].
    pub fn translates(&self) -> bool {
        self.adapter.translates()
    }

    /// One attempt's upstream call with its translated `body`; the caller bounds it in time.
    /// `injector` says whether an injected fault touches the call, and keeps the ones that did.
    pub async fn complete(
        &self,
        model: &Model,
        body: Bytes,
        injector: &mut Injector<'_>,
    ) -> Result<Completion, CallError> {
        let fault = injector.draw(false);
        let body = match self.respond(model, false, body, fault).await? {
            Answer::Upstream(response) => read_body(response).await?,
            Answer::Injected(body) => body,
        };
        self.adapter.completion_bytes(body)
    }

    /// Opens a streamed call; returns once the upstream answered 2xx (an error status is
    /// read whole and returned as the call's error).
    pub async fn open_stream(
        &self,
        model: &Model,
        body: Bytes,
        injector: &mut Injector<'_>,
    ) -> Result<UpstreamStream, CallError> {
        let fault = injector.draw(true);
        let source = match self.respond(model, true, body, fault).await? {
            Answer::Upstream(response) => stream::Source::Upstream(response.into_body()),
            Answer::Injected(body) => stream::Source::Injected(Some(body)),
        };
        let mut upstream =
            UpstreamStream::new(source, self.adapter.stream_decoder(&model.upstream_model));
        if let Some(cut) = fault.and_then(Cut::of) {
            upstream.cut(cut);
        }
        Ok(upstream)
    }

    /// Sends with the primary credential and, when the provider refuses it, with each
    /// reserve in order before the call counts as failed; returns a 2xx answer with its
    /// body unread.
    async fn respond(
        &self,
        model: &Model,
        stream: bool,
        body: Bytes,
        fault: Option<&Fault>,
    ) -> Result<Answer, CallError> {
        if let Some(Fault { kind: FaultKind::Delay { ms }, .. }) = fault {
            tokio::time::sleep(Duration::from_millis(*ms)).await;
        }
        if self.credentials.is_empty() {
            return self.send(model, stream, body, None, fault).await;
        }
        let mut last = CallError::NoCredential("no credential resolved".into());
        for credential in &self.credentials {
            let secret = match credential {
                Ok(secret) => secret,
                Err(reason) => {
                    last = CallError::NoCredential(reason.clone());
                    continue;
                }
            };
            match self.send(model, stream, body.clone(), Some(secret), fault).await {
                Err(e @ CallError::Http { status, .. }) if failure::refuses_credential(status) => {
                    warn!(provider = %self.def.name, %status, "provider refused a credential; trying the next");
                    last = e;
                }
                other => return other,
            }
        }
        Err(last)
    }

    /// One HTTP exchange. An injected fault that stands for the upstream's answer replaces
    /// the network exchange only: the request is built, and the answer parsed, as always.
    async fn send(
        &self,
        model: &Model,
        stream: bool,
        body: Bytes,
        credential: Option<&Secret>,
        fault: Option<&Fault>,
    ) -> Result<Answer, CallError> {
        let upstream = self.adapter.request(&self.def, model, stream, body, credential)?;
        if let Some(fault) = fault
            && let Some(answer) = self.injected_answer(fault, model, stream).await
        {
            return answer;
        }
        let response = self
            .client
            .request(upstream)
            .await
            .map_err(|e| CallError::Transport(error::error_chain(&e)))?;
        let status = response.status();
        if status.is_success() {
            return Ok(Answer::Upstream(response));
        }
        let retry_after = response
            .headers()
            .get(header::RETRY_AFTER)
            .and_then(|v| v.to_str().ok())
            .and_then(|v| switchyard_time::retry_after(v, SystemTime::now()));
        let body = read_body(response).await?;
        Err(self.http_error(status, &body, retry_after))
    }

    /// An error status with its body, as the adapter reads it.
    fn http_error(
        &self,
        status: StatusCode,
        body: &[u8],
        retry_after: Option<Duration>,
    ) -> CallError {
        let error = self.adapter.error(status, body);
        let status = self.adapter.status(status, &error);
        CallError::Http { status, error, retry_after }
    }

    /// What the upstream answers under an injected fault that stands for its answer; `None`
    /// for faults that let the real exchange happen (a delay, a stream cut short later).
    async fn injected_answer(
        &self,
        fault: &Fault,
        model: &Model,
        stream: bool,
    ) -> Option<Result<Answer, CallError>> {
        Some(match &fault.kind {
            FaultKind::Delay { .. }
            | FaultKind::StallAfter { .. }
            | FaultKind::DropAfter { .. } => {
                return None;
            }
            FaultKind::Status { status, retry_after_secs } => {
                let status = StatusCode::from_u16(*status).unwrap_or(StatusCode::BAD_GATEWAY);
                let body = chaos::error_body(self.def.kind, status.as_u16(), &model.upstream_model);
                let retry_after = retry_after_secs.map(Duration::from_secs);
                Err(self.http_error(status, &body, retry_after))
            }
            FaultKind::Reset => Err(CallError::Transport(chaos::reset_message(fault))),
            FaultKind::Malformed => Ok(Answer::Injected(Bytes::from_static(
                chaos::malformed_body(self.def.kind, stream),
            ))),
            // The attempt's timeout (or a stream's first-token timeout) ends the wait.
            FaultKind::Hang => std::future::pending().await,
        })
    }
}

async fn read_body(response: http::Response<hyper::body::Incoming>) -> Result<Bytes, CallError> {
    Ok(Limited::new(response.into_body(), MAX_RESPONSE_BYTES)
        .collect()
        .await
        .map_err(|e| CallError::Transport(format!("reading the response body: {e}")))?
        .to_bytes())
}

fn build_client() -> HttpsClient {
    let mut http = HttpConnector::new();
    http.enforce_http(false);
    http.set_connect_timeout(Some(CONNECT_TIMEOUT));
    http.set_nodelay(true);
    let https = hyper_rustls::HttpsConnectorBuilder::new()
        .with_webpki_roots()
        .https_or_http()
        .enable_all_versions()
        .wrap_connector(http);
    Client::builder(TokioExecutor::new())
        .pool_idle_timeout(POOL_IDLE_TIMEOUT)
        .pool_max_idle_per_host(1024)
        .build(https)
}
