//! Upstream providers: one pooled HTTP client per provider, credentials resolved on the
//! node, and a wire-format adapter per provider kind behind one trait.
//!
//! The unified request is the client's OpenAI-shaped body ([`ChatRequest`]); the unified
//! response is an OpenAI `chat.completion` ([`Completion`]). Adapters translate both ways.

use std::collections::BTreeMap;
use std::fmt;
use std::sync::Arc;
use std::time::Duration;

use bytes::Bytes;
use http::StatusCode;
use http_body_util::{BodyExt, Full, Limited};
use hyper_util::client::legacy::Client;
use hyper_util::client::legacy::connect::HttpConnector;
use hyper_util::rt::TokioExecutor;
use serde_json::value::RawValue;
use tracing::warn;

use switchyard_catalog::{FailoverReason, Model, Provider, ProviderKind};

use crate::request::ChatRequest;

pub mod anthropic;
pub mod azure;
pub mod gemini;
pub mod openai;
pub mod sse;

const CONNECT_TIMEOUT: Duration = Duration::from_secs(5);
const POOL_IDLE_TIMEOUT: Duration = Duration::from_secs(90);
/// Upstream bodies larger than this are refused (a completion is kilobytes).
const MAX_RESPONSE_BYTES: usize = 16 * 1024 * 1024;

pub type HttpsClient = Client<hyper_rustls::HttpsConnector<HttpConnector>, Full<Bytes>>;

/// A provider secret. Never printed: `Debug` and `Display` show only that it is there.
#[derive(Clone)]
pub struct Secret(Arc<str>);

impl Secret {
    pub fn expose(&self) -> &str {
        &self.0
    }
}

impl fmt::Debug for Secret {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.write_str("Secret(..)")
    }
}

/// Token counts as the upstream reported them.
#[derive(Clone, Copy, Debug, Default, PartialEq, Eq)]
pub struct Usage {
    pub prompt_tokens: u64,
    pub completion_tokens: u64,
}

/// An OpenAI-shaped `chat.completion`.
#[derive(Debug)]
pub struct Completion {
    pub fields: Fields,
    pub usage: Usage,
}

/// A completion's top-level fields.
#[derive(Debug)]
pub enum Fields {
    /// The upstream's own bytes, already in OpenAI's shape (OpenAI-compatible providers):
    /// forwarded as they came, with only the `model` value (at `model`, if present) replaced.
    Verbatim { bytes: Bytes, model: Option<std::ops::Range<usize>> },
    /// Fields an adapter built by translating another provider's answer.
    Map(BTreeMap<String, Box<RawValue>>),
}

impl Completion {
    /// The completion's JSON with `model` set to the gateway name (a JSON string) and, if
    /// given, one more top-level field.
    pub fn to_json(&self, model: &RawValue, extra: Option<(&str, &RawValue)>) -> Vec<u8> {
        match &self.fields {
            Fields::Map(map) => {
                let mut out = Vec::with_capacity(512);
                out.push(b'{');
                let mut first = true;
                let mut field = |out: &mut Vec<u8>, key: &str, value: &RawValue| {
                    if !std::mem::take(&mut first) {
                        out.push(b',');
                    }
                    let _ = serde_json::to_writer(&mut *out, key);
                    out.push(b':');
                    out.extend_from_slice(value.get().as_bytes());
                };
                field(&mut out, "model", model);
                for (key, value) in map.iter().filter(|(k, _)| *k != "model") {
                    field(&mut out, key, value);
                }
                if let Some((key, value)) = extra {
                    field(&mut out, key, value);
                }
                out.push(b'}');
                out
            }
            Fields::Verbatim { bytes, model: span } => {
                let mut out =
                    Vec::with_capacity(bytes.len() + 64 + extra.map_or(0, |(_, v)| v.get().len()));
                match span {
                    Some(span) => {
                        out.extend_from_slice(&bytes[..span.start]);
                        out.extend_from_slice(model.get().as_bytes());
                        out.extend_from_slice(&bytes[span.end..]);
                    }
                    None => {
                        // `completion` checked the body is an object with `choices`: after its
                        // `{` there is at least one field to put a comma before.
                        let open = bytes.iter().position(|b| *b == b'{').unwrap_or(0);
                        out.extend_from_slice(&bytes[..=open]);
                        out.extend_from_slice(b"\"model\":");
                        out.extend_from_slice(model.get().as_bytes());
                        out.push(b',');
                        out.extend_from_slice(&bytes[open + 1..]);
                    }
                }
                if let Some((key, value)) = extra {
                    while out.last().is_some_and(|b| b.is_ascii_whitespace()) {
                        out.pop();
                    }
                    if out.last() == Some(&b'}') {
                        out.pop();
                        out.push(b',');
                        let _ = serde_json::to_writer(&mut out, key);
                        out.push(b':');
                        out.extend_from_slice(value.get().as_bytes());
                        out.push(b'}');
                    }
                }
                out
            }
        }
    }
}

impl serde::Serialize for Fields {
    fn serialize<S: serde::Serializer>(&self, s: S) -> Result<S::Ok, S::Error> {
        match self {
            Self::Map(map) => map.serialize(s),
            Self::Verbatim { bytes, .. } => {
                let text = std::str::from_utf8(bytes).map_err(serde::ser::Error::custom)?;
                let raw: &RawValue =
                    serde_json::from_str(text).map_err(serde::ser::Error::custom)?;
                raw.serialize(s)
            }
        }
    }
}

/// The upstream's own error, as its body described it.
#[derive(Clone, Debug, Default)]
pub struct UpstreamError {
    pub message: String,
    pub kind: String,
    pub code: Option<String>,
    pub param: Option<String>,
}

/// How one upstream call failed, before classification.
#[derive(Debug)]
pub enum CallError {
    /// No HTTP response: refused, reset, DNS, TLS, a body cut short.
    Connection(String),
    /// An HTTP error status.
    Status { status: StatusCode, error: UpstreamError },
    /// A 200 whose body is not a completion.
    Malformed(String),
    /// The provider has no usable credential on this node (a missing env var or file).
    NoCredential(String),
}

/// What a failed call means for the chain: fail over (if the reason is in `on`), or stop
/// and hand the upstream's answer to the client.
#[derive(Debug)]
pub enum Classified {
    Failover(FailoverReason),
    ClientError { status: StatusCode, error: UpstreamError },
}

impl CallError {
    /// The one place that classifies upstream failures (DESIGN §1 "Failover triggers").
    pub fn classify(&self) -> Classified {
        match self {
            Self::Connection(_) => Classified::Failover(FailoverReason::ConnectionError),
            Self::Status { status, .. } if *status == StatusCode::TOO_MANY_REQUESTS => {
                Classified::Failover(FailoverReason::RateLimit)
            }
            Self::Status { status, .. } if status.is_server_error() => {
                Classified::Failover(FailoverReason::ServerError)
            }
            // An upstream 401/403 (after every reserve credential) is the gateway's own
            // credential failing, not the client's fault: the next provider may serve.
            Self::Status { status, .. }
                if *status == StatusCode::UNAUTHORIZED || *status == StatusCode::FORBIDDEN =>
            {
                Classified::Failover(FailoverReason::ServerError)
            }
            Self::Status { status, error } => {
                Classified::ClientError { status: *status, error: error.clone() }
            }
            Self::Malformed(_) | Self::NoCredential(_) => {
                Classified::Failover(FailoverReason::ServerError)
            }
        }
    }
}

impl fmt::Display for CallError {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        match self {
            Self::Connection(e) => write!(f, "connection failed: {e}"),
            Self::Status { status, error } => write!(f, "HTTP {status}: {}", error.message),
            Self::Malformed(e) => write!(f, "malformed response: {e}"),
            Self::NoCredential(e) => write!(f, "no usable credential: {e}"),
        }
    }
}

/// One event of an upstream stream, in OpenAI's shape.
#[derive(Debug)]
pub enum StreamEvent {
    /// A `chat.completion.chunk`, top-level fields raw.
    Chunk {
        fields: BTreeMap<String, Box<RawValue>>,
        /// Carries content (text, a tool call, a refusal) or a finish reason: the point after
        /// which the serving model is locked.
        commits: bool,
        usage: Option<Usage>,
        /// No choices, only usage (OpenAI's final chunk with `include_usage`).
        usage_only: bool,
    },
    /// The upstream's end marker.
    Done,
    /// An in-band error (`data: {"error": …}`, Anthropic's `event: error`).
    Error(UpstreamError),
}

/// How reading an upstream stream failed.
#[derive(Debug)]
pub enum StreamError {
    /// The connection broke, or the stream ended mid-event or without its end marker.
    Connection(String),
    /// A frame that is not what the provider's format says.
    Malformed(String),
}

impl fmt::Display for StreamError {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        match self {
            Self::Connection(e) => write!(f, "upstream stream broke: {e}"),
            Self::Malformed(e) => write!(f, "malformed upstream stream: {e}"),
        }
    }
}

/// A provider kind's wire format.
pub trait Adapter: Send + Sync {
    /// The upstream HTTP request for one attempt.
    fn request(
        &self,
        provider: &Provider,
        model: &Model,
        request: &ChatRequest<'_>,
        credential: Option<&Secret>,
    ) -> Result<http::Request<Full<Bytes>>, CallError>;

    /// A 200 body as a unified completion.
    fn completion(&self, body: &[u8]) -> Result<Completion, CallError>;

    /// Like [`Adapter::completion`], given the body as received (an adapter that forwards
    /// it verbatim keeps it without a copy).
    fn completion_bytes(&self, body: Bytes) -> Result<Completion, CallError> {
        self.completion(&body)
    }

    /// An error body as the upstream's error.
    fn error(&self, status: StatusCode, body: &[u8]) -> UpstreamError;

    /// The status an error is classified by: the HTTP status, unless the provider reports a
    /// failing credential with another one (Gemini answers a bad key with 400).
    fn status(&self, status: StatusCode, _error: &UpstreamError) -> StatusCode {
        status
    }

    /// A decoder for one streamed response (providers whose events refer back to earlier
    /// ones, such as Anthropic's content blocks, keep that state in it).
    fn stream_decoder(&self, upstream_model: &str) -> Box<dyn StreamDecoder>;

    /// Refuses, before any upstream call, a request this provider cannot honour (a strict
    /// `json_schema` it has no mechanism for). The message names what is unsupported.
    fn supports(&self, _request: &ChatRequest<'_>) -> Result<(), String> {
        Ok(())
    }
}

/// Turns one response's SSE frames into unified events, in order.
pub trait StreamDecoder: Send {
    /// The events one frame yields (often one, sometimes none or several).
    fn decode(&mut self, frame: &sse::Frame) -> Result<Vec<StreamEvent>, String>;

    /// The body ended cleanly between events: the events that close the stream if it is
    /// complete, `None` if an end marker was still due. Providers with an in-band end
    /// marker keep the default; Gemini's stream ends with the body after its finishReason.
    fn finish(&mut self) -> Option<Vec<StreamEvent>> {
        None
    }
}

/// A streamed upstream response whose head was 200: events as they arrive.
pub struct UpstreamStream {
    body: hyper::body::Incoming,
    parser: sse::Parser,
    decoder: Box<dyn StreamDecoder>,
    /// Events decoded from a frame but not handed out yet.
    ready: std::collections::VecDeque<StreamEvent>,
    ended: bool,
}

impl UpstreamStream {
    /// The next event; `None` once the body ended cleanly after its end marker.
    pub async fn next(&mut self) -> Option<Result<StreamEvent, StreamError>> {
        loop {
            if let Some(event) = self.ready.pop_front() {
                return Some(Ok(event));
            }
            match self.parser.next_frame() {
                Err(e) => return Some(Err(StreamError::Malformed(e.to_string()))),
                Ok(Some(frame)) => match self.decoder.decode(&frame) {
                    Ok(events) => {
                        self.ready.extend(events);
                        continue;
                    }
                    Err(e) => return Some(Err(StreamError::Malformed(e))),
                },
                Ok(None) => {}
            }
            if self.ended {
                return None;
            }
            match self.body.frame().await {
                None => {
                    self.ended = true;
                    if self.parser.has_partial() {
                        return Some(Err(StreamError::Connection(
                            "the stream ended mid-event".into(),
                        )));
                    }
                    if let Some(events) = self.decoder.finish() {
                        self.ready.extend(events);
                        continue;
                    }
                    return Some(Err(StreamError::Connection(
                        "the upstream closed the stream before its end marker".into(),
                    )));
                }
                Some(Err(e)) => {
                    self.ended = true;
                    return Some(Err(StreamError::Connection(error_chain(&e))));
                }
                Some(Ok(frame)) => {
                    if let Ok(data) = frame.into_data()
                        && let Err(e) = self.parser.push(&data)
                    {
                        return Some(Err(StreamError::Malformed(e.to_string())));
                    }
                }
            }
        }
    }
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
                r.resolve().map(|s| Secret(s.into())).map_err(|e| {
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

    /// See [`Adapter::supports`].
    pub fn supports(&self, request: &ChatRequest<'_>) -> Result<(), String> {
        self.adapter.supports(request)
    }

    /// One attempt's upstream call; the caller bounds it in time.
    pub async fn complete(
        &self,
        model: &Model,
        request: &ChatRequest<'_>,
    ) -> Result<Completion, CallError> {
        let response = self.respond(model, request).await?;
        let body = read_body(response).await?;
        self.adapter.completion_bytes(body)
    }

    /// Opens a streamed call; returns once the upstream answered 2xx (an error status is
    /// read whole and returned as the call's error).
    pub async fn open_stream(
        &self,
        model: &Model,
        request: &ChatRequest<'_>,
    ) -> Result<UpstreamStream, CallError> {
        let response = self.respond(model, request).await?;
        Ok(UpstreamStream {
            body: response.into_body(),
            parser: sse::Parser::default(),
            decoder: self.adapter.stream_decoder(&model.upstream_model),
            ready: std::collections::VecDeque::new(),
            ended: false,
        })
    }

    /// Sends with the primary credential and, on 401/403, with each reserve in order before
    /// the call counts as failed; returns a 2xx response with its body unread.
    async fn respond(
        &self,
        model: &Model,
        request: &ChatRequest<'_>,
    ) -> Result<http::Response<hyper::body::Incoming>, CallError> {
        if self.credentials.is_empty() {
            return self.send(model, request, None).await;
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
            match self.send(model, request, Some(secret)).await {
                Err(CallError::Status { status, error })
                    if status == StatusCode::UNAUTHORIZED || status == StatusCode::FORBIDDEN =>
                {
                    warn!(provider = %self.def.name, %status, "provider refused a credential; trying the next");
                    last = CallError::Status { status, error };
                }
                other => return other,
            }
        }
        Err(last)
    }

    async fn send(
        &self,
        model: &Model,
        request: &ChatRequest<'_>,
        credential: Option<&Secret>,
    ) -> Result<http::Response<hyper::body::Incoming>, CallError> {
        let upstream = self.adapter.request(&self.def, model, request, credential)?;
        let response = self
            .client
            .request(upstream)
            .await
            .map_err(|e| CallError::Connection(error_chain(&e)))?;
        let status = response.status();
        if status.is_success() {
            return Ok(response);
        }
        let body = read_body(response).await?;
        let error = self.adapter.error(status, &body);
        let status = self.adapter.status(status, &error);
        Err(CallError::Status { status, error })
    }
}

async fn read_body(response: http::Response<hyper::body::Incoming>) -> Result<Bytes, CallError> {
    Ok(Limited::new(response.into_body(), MAX_RESPONSE_BYTES)
        .collect()
        .await
        .map_err(|e| CallError::Connection(format!("reading the response body: {e}")))?
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

/// A transport error with its causes ("connection refused"), which hyper keeps in `source`.
fn error_chain(e: &dyn std::error::Error) -> String {
    let mut text = e.to_string();
    let mut source = e.source();
    while let Some(cause) = source {
        text.push_str(": ");
        text.push_str(&cause.to_string());
        source = cause.source();
    }
    text
}
