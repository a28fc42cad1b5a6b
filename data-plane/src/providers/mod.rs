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
use http::{HeaderValue, StatusCode, header};
use http_body_util::{BodyExt, Full, Limited};
use hyper_util::client::legacy::Client;
use hyper_util::client::legacy::connect::HttpConnector;
use hyper_util::rt::TokioExecutor;
use tracing::warn;

use switchyard_catalog::{Fault, FaultKind, Model, Provider, ProviderKind};
use switchyard_tls::words;

use crate::chaos::{self, Cut, Injector};
use crate::embeddings::Embeddings;
use crate::failure;
use crate::request::{ChatRequest, Format};
use crate::request_id;

pub mod adapter;
pub mod anthropic;
pub mod azure;
pub mod error;
pub mod gemini;
pub mod openai;
pub mod responses;
pub mod secret;
pub mod sse;
pub mod stream;
pub mod translated;
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

/// The client's Anthropic beta flags, sent on to Anthropic providers.
const ANTHROPIC_BETA: http::HeaderName = http::HeaderName::from_static("anthropic-beta");

/// A call made for a request that arrived on Anthropic's Messages surface: a provider that
/// speaks that format answers in it, as the upstream sent it (docs/messages.md).
#[derive(Clone, Copy, Debug, Default)]
pub struct MessagesCall<'r> {
    /// The client's `anthropic-beta` header.
    pub beta: Option<&'r HeaderValue>,
}

/// A call for a request sent as the client wrote it, in a format the provider speaks itself
/// ([`crate::request::Native`]): its answer comes back as the upstream sent it.
#[derive(Clone, Copy, Debug)]
pub enum NativeCall<'r> {
    /// Anthropic's Messages API; a provider of another kind answers in the unified shape.
    Messages(MessagesCall<'r>),
    /// OpenAI's Responses API, at `{base}/responses` (docs/responses.md); made only to
    /// providers that serve it ([`ProviderRuntime::native_call`]).
    Responses,
}

pub type HttpsClient = Client<hyper_rustls::HttpsConnector<HttpConnector>, Full<Bytes>>;

/// A 2xx answer with its body unread: the upstream's, or one an injected fault made.
enum Answer {
    Upstream(http::Response<hyper::body::Incoming>),
    Injected(Bytes),
}

/// What one upstream exchange carries besides its body and credential.
#[derive(Clone, Copy)]
struct Exchange<'a> {
    model: &'a Model,
    stream: bool,
    request_id: Option<&'a HeaderValue>,
    native: Option<NativeCall<'a>>,
    /// An embeddings call, to the provider's embeddings endpoint.
    embeddings: Option<&'a Embeddings>,
    fault: Option<&'a Fault>,
}

/// A provider as this node uses it: its definition, resolved credentials, its connection pool.
pub struct ProviderRuntime {
    pub def: Provider,
    /// Primary first, then reserves; a reference that cannot be resolved is kept as its error.
    credentials: Vec<Result<Secret, String>>,
    client: HttpsClient,
    adapter: Box<dyn Adapter>,
    /// The credentials `base_url` carried, as a header: the URL the client is handed has
    /// none, since its connection pool logs URLs (marked sensitive, so no log shows it).
    basic_auth: Option<HeaderValue>,
}

impl fmt::Debug for ProviderRuntime {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.debug_struct("ProviderRuntime").field("name", &self.def.name).finish_non_exhaustive()
    }
}

impl ProviderRuntime {
    /// Resolves credentials (blocking: a file read) and builds the pool. Call off the
    /// request path, when config is applied.
    pub fn new(mut def: Provider) -> Self {
        let (base_url, userinfo) = switchyard_catalog::address::split_userinfo(&def.base_url);
        def.base_url = base_url;
        let basic_auth = userinfo.and_then(|(user, password)| {
            use base64::Engine as _;
            let encoded =
                base64::engine::general_purpose::STANDARD.encode(format!("{user}:{password}"));
            let mut value = HeaderValue::from_str(&format!("Basic {encoded}")).ok()?;
            value.set_sensitive(true);
            Some(value)
        });
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
        Self { def, credentials, client: build_client(), adapter, basic_auth }
    }

    /// The upstream body of one attempt (see [`Adapter::body`]); a `/v1/responses` request
    /// to a provider that serves OpenAI's Responses API is its body as the client sent it.
    pub fn body(&self, model: &Model, request: &ChatRequest<'_>) -> Result<Bytes, CallError> {
        if let Some(embeddings) = &request.embeddings {
            return self.adapter.embeddings_body(model, request, embeddings);
        }
        if let Some(native) = request.native.as_ref().filter(|n| self.serves(n.format)) {
            return Ok(Bytes::from(native.body(&model.upstream_model)));
        }
        self.adapter.body(model, request)
    }

    /// Whether this provider's kind takes OpenAI's Responses API: OpenAI and Azure OpenAI do;
    /// OpenAI-compatible servers often have no `/responses`, so they are sent the Chat
    /// translation (docs/responses.md, "Per provider kind").
    pub fn serves_responses(&self) -> bool {
        matches!(self.def.kind, ProviderKind::Openai | ProviderKind::AzureOpenai)
    }

    /// Whether this provider is sent a request in `format` as the client wrote it (Messages
    /// bodies are the Anthropic adapter's to take or translate).
    fn serves(&self, format: Format) -> bool {
        format == Format::Responses && self.serves_responses()
    }

    /// What a call for `request` owes its surface: `Some` for a `/v1/messages` request, and
    /// for a `/v1/responses` request this provider serves natively.
    pub fn native_call<'r>(&self, request: &'r ChatRequest<'_>) -> Option<NativeCall<'r>> {
        let native = request.native.as_ref()?;
        match native.format {
            Format::Messages => {
                Some(NativeCall::Messages(MessagesCall { beta: native.beta.as_ref() }))
            }
            Format::Responses => self.serves_responses().then_some(NativeCall::Responses),
        }
    }

    /// See [`Adapter::translates`].
    pub fn translates(&self) -> bool {
        self.adapter.translates()
    }

    /// One attempt's upstream call with its translated `body`; the caller bounds it in time.
    /// `request_id`, the client request's id, goes upstream as `x-request-id` (a probe has
    /// none). `injector` says whether an injected fault touches the call, and keeps the ones
    /// that did.
    pub async fn complete(
        &self,
        model: &Model,
        body: Bytes,
        request_id: Option<&HeaderValue>,
        native: Option<NativeCall<'_>>,
        injector: &mut Injector<'_>,
    ) -> Result<Completion, CallError> {
        let fault = injector.draw(false);
        let exchange =
            Exchange { model, stream: false, request_id, native, embeddings: None, fault };
        let body = match self.respond(exchange, body).await? {
            Answer::Upstream(response) => read_body(response).await?,
            Answer::Injected(body) => body,
        };
        match native {
            Some(NativeCall::Messages(_)) => {
                if let Some(native) = self.adapter.messages_completion(&body) {
                    return native;
                }
            }
            Some(NativeCall::Responses) => return responses::completion(&body),
            None => {}
        }
        self.adapter.completion_bytes(body)
    }

    /// One attempt's embeddings call with its `body`, as [`ProviderRuntime::complete`] makes a
    /// chat call: the same credentials, faults and error reading; the answer in OpenAI's
    /// embeddings list shape.
    pub async fn embed(
        &self,
        model: &Model,
        body: Bytes,
        embeddings: &Embeddings,
        request_id: Option<&HeaderValue>,
        injector: &mut Injector<'_>,
    ) -> Result<Completion, CallError> {
        let fault = injector.draw(false);
        let exchange = Exchange {
            model,
            stream: false,
            request_id,
            native: None,
            embeddings: Some(embeddings),
            fault,
        };
        let body = match self.respond(exchange, body).await? {
            Answer::Upstream(response) => read_body(response).await?,
            Answer::Injected(body) => body,
        };
        self.adapter.embeddings(body, embeddings)
    }

    /// Opens a streamed call; returns once the upstream answered 2xx (an error status is
    /// read whole and returned as the call's error).
    pub async fn open_stream(
        &self,
        model: &Model,
        body: Bytes,
        request_id: Option<&HeaderValue>,
        native: Option<NativeCall<'_>>,
        injector: &mut Injector<'_>,
    ) -> Result<UpstreamStream, CallError> {
        let fault = injector.draw(true);
        let exchange =
            Exchange { model, stream: true, request_id, native, embeddings: None, fault };
        let source = match self.respond(exchange, body).await? {
            Answer::Upstream(response) => stream::Source::Upstream(response.into_body()),
            Answer::Injected(body) => stream::Source::Injected(Some(body)),
        };
        let decoder = match native {
            Some(NativeCall::Messages(_)) => self.adapter.messages_decoder(),
            Some(NativeCall::Responses) => Some(responses::decoder()),
            None => None,
        };
        let decoder = decoder.unwrap_or_else(|| self.adapter.stream_decoder(&model.upstream_model));
        let mut upstream = UpstreamStream::new(source, decoder);
        if let Some(cut) = fault.and_then(Cut::of) {
            upstream.cut(cut);
        }
        Ok(upstream)
    }

    /// Anthropic's `count_tokens` for a Messages `body` (the client's, `model` the upstream's
    /// name): the upstream's JSON answer. Sent once with the primary credential; it is no
    /// completion, so no breaker, retry or fault touches it.
    pub async fn count_tokens(
        &self,
        model: &Model,
        body: Bytes,
        messages: MessagesCall<'_>,
    ) -> Result<Bytes, CallError> {
        let credential = self.credentials.iter().find_map(|c| c.as_ref().ok());
        let mut upstream = self.adapter.request(&self.def, model, false, body, credential)?;
        let mut parts = upstream.uri().clone().into_parts();
        let path = parts.path_and_query.as_ref().map_or("", |p| p.path());
        parts.path_and_query = Some(
            format!("{path}/count_tokens")
                .parse()
                .map_err(|e: http::uri::InvalidUri| CallError::Transport(e.to_string()))?,
        );
        *upstream.uri_mut() = http::Uri::from_parts(parts)
            .map_err(|e| CallError::Transport(format!("the count_tokens URL: {e}")))?;
        if let Some(beta) = messages.beta {
            upstream.headers_mut().insert(ANTHROPIC_BETA, beta.clone());
        }
        if let Some(basic) = &self.basic_auth
            && !upstream.headers().contains_key(header::AUTHORIZATION)
        {
            upstream.headers_mut().insert(header::AUTHORIZATION, basic.clone());
        }
        let response = self
            .client
            .request(upstream)
            .await
            .map_err(|e| CallError::Transport(words::chain(&e)))?;
        let status = response.status();
        let body = read_body(response).await?;
        if status.is_success() { Ok(body) } else { Err(self.http_error(status, &body, None)) }
    }

    /// Sends with the primary credential and, when the provider refuses it, with each
    /// reserve in order before the call counts as failed; returns a 2xx answer with its
    /// body unread.
    async fn respond(&self, exchange: Exchange<'_>, body: Bytes) -> Result<Answer, CallError> {
        if let Some(Fault { kind: FaultKind::Delay { ms }, .. }) = exchange.fault {
            tokio::time::sleep(Duration::from_millis(*ms)).await;
        }
        if self.credentials.is_empty() {
            return self.send(exchange, body, None).await;
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
            match self.send(exchange, body.clone(), Some(secret)).await {
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
        exchange: Exchange<'_>,
        body: Bytes,
        credential: Option<&Secret>,
    ) -> Result<Answer, CallError> {
        let Exchange { model, stream, request_id, native, embeddings, fault } = exchange;
        let mut upstream = match embeddings {
            Some(embeddings) => {
                self.adapter.embeddings_request(&self.def, model, embeddings, body, credential)?
            }
            None => self.adapter.request(&self.def, model, stream, body, credential)?,
        };
        // The client's betas go to the kind they are for; other kinds would refuse them.
        if self.def.kind == ProviderKind::Anthropic
            && let Some(NativeCall::Messages(MessagesCall { beta: Some(beta) })) = native
        {
            upstream.headers_mut().insert(ANTHROPIC_BETA, beta.clone());
        }
        // The same provider, its Responses endpoint: headers and credential as for Chat.
        if let Some(NativeCall::Responses) = native {
            *upstream.uri_mut() = responses::url(&self.def)
                .parse()
                .map_err(|e: http::uri::InvalidUri| CallError::Transport(e.to_string()))?;
        }
        // A provider's own credential, where it sends one as `Authorization`, wins.
        if let Some(basic) = &self.basic_auth
            && !upstream.headers().contains_key(header::AUTHORIZATION)
        {
            upstream.headers_mut().insert(header::AUTHORIZATION, basic.clone());
        }
        // Set here, not by each adapter: every provider kind gets it, and a provider's support
        // can trace one request from the client's logs (docs/http-api.md, "Response headers").
        if let Some(id) = request_id {
            upstream.headers_mut().insert(request_id::HEADER, id.clone());
        }
        // The call's CLIENT span, when OpenTelemetry is on: the upstream continues the trace.
        switchyard_otel::inject(upstream.headers_mut());
        if let Some(fault) = fault
            && let Some(answer) = self.injected_answer(fault, model, stream).await
        {
            return answer;
        }
        let response = self
            .client
            .request(upstream)
            .await
            .map_err(|e| CallError::Transport(words::chain(&e)))?;
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
    Client::builder(TokioExecutor::new())
        .pool_idle_timeout(POOL_IDLE_TIMEOUT)
        .pool_max_idle_per_host(1024)
        .build(switchyard_tls::connect::public_web(http))
}

#[cfg(test)]
mod tests {
    //! Injected faults at the upstream call, against a real HTTP upstream on loopback where
    //! the call is made: each fault kind, and the real parsing and classification after it.

    use std::sync::Arc;
    use std::sync::atomic::{AtomicUsize, Ordering};
    use std::time::Instant;

    use serde_json::json;
    use switchyard_catalog::FaultTarget;

    use super::*;
    use crate::failure::{Failure, Verdict, classify};

    fn fault(kind: FaultKind) -> Arc<Fault> {
        Arc::new(Fault {
            name: "drill".into(),
            target: FaultTarget::Model("m".into()),
            key_id: None,
            rate: 1.0,
            kind,
            expires_at_unix_ms: 0,
        })
    }

    fn runtime(kind: &str, base_url: &str) -> ProviderRuntime {
        ProviderRuntime::new(
            serde_json::from_value(json!({
                "name": "p", "kind": kind, "base_url": base_url, "api_version": "2024-10-21"
            }))
            .unwrap(),
        )
    }

    #[test]
    fn a_base_urls_credentials_go_in_a_sensitive_header_not_in_the_url_the_client_logs() {
        let rt = runtime("openai-compatible", "http://urluser:url%20pass@127.0.0.1:9/v1");
        assert_eq!(rt.def.base_url, "http://127.0.0.1:9/v1");
        let basic = rt.basic_auth.as_ref().expect("a Basic header");
        assert!(basic.is_sensitive());
        // base64("urluser:url pass")
        assert_eq!(basic.to_str().unwrap(), "Basic dXJsdXNlcjp1cmwgcGFzcw==");
        assert!(runtime("openai", "https://api.openai.com/v1").basic_auth.is_none());
    }

    #[test]
    fn a_responses_request_goes_as_sent_to_openai_and_azure_and_translated_to_the_rest() {
        let original = br#"{"model":"m","fallback_models":["n"],"input":"hi","tools":[{"type":"web_search"}],"store":false}"#;
        let translated = crate::responses::Translated::of(original).unwrap();
        let request = translated.request(original).unwrap();
        for kind in ["openai", "azure-openai"] {
            let rt = runtime(kind, "http://127.0.0.1:9/v1");
            assert!(matches!(rt.native_call(&request), Some(NativeCall::Responses)), "{kind}");
            let body: serde_json::Value =
                serde_json::from_slice(&rt.body(&model(), &request).unwrap()).unwrap();
            let expected = json!({"model": "up", "input": "hi", "tools": [{"type": "web_search"}], "store": false});
            assert_eq!(body, expected, "{kind}");
        }
        let rt = runtime("openai-compatible", "http://127.0.0.1:9/v1");
        assert!(rt.native_call(&request).is_none());
        let body: serde_json::Value =
            serde_json::from_slice(&rt.body(&model(), &request).unwrap()).unwrap();
        assert!(body.get("messages").is_some() && body.get("input").is_none(), "{body}");
    }

    fn model() -> Model {
        serde_json::from_value(json!({"name": "m", "provider": "p", "upstream_model": "up"}))
            .unwrap()
    }

    const CHUNKS: [&str; 5] = ["one ", "two ", "three ", "four ", "five"];

    /// An OpenAI-style upstream on loopback that counts the requests it receives: a plain
    /// completion, or a stream of a role chunk, five content chunks and `[DONE]`.
    struct Upstream {
        url: String,
        requests: Arc<AtomicUsize>,
    }

    async fn upstream() -> Upstream {
        use axum::routing::post;
        let requests = Arc::new(AtomicUsize::new(0));
        let counter = Arc::clone(&requests);
        let app = axum::Router::new().route(
            "/v1/chat/completions",
            post(move |body: String| {
                let counter = Arc::clone(&counter);
                async move {
                    counter.fetch_add(1, Ordering::SeqCst);
                    if body.contains("\"stream\":true") {
                        let chunk = |delta: serde_json::Value| {
                            let c = json!({"id": "c1", "object": "chat.completion.chunk", "created": 1,
                                "model": "up", "choices": [{"index": 0, "delta": delta, "finish_reason": null}]});
                            format!("data: {c}\n\n")
                        };
                        let mut sse = chunk(json!({"role": "assistant", "content": ""}));
                        for text in CHUNKS {
                            sse.push_str(&chunk(json!({"content": text})));
                        }
                        sse.push_str("data: [DONE]\n\n");
                        ([(header::CONTENT_TYPE, "text/event-stream")], sse)
                    } else {
                        let c = json!({"id": "c1", "object": "chat.completion", "created": 1, "model": "up",
                            "choices": [{"index": 0, "message": {"role": "assistant", "content": "hi"}, "finish_reason": "stop"}],
                            "usage": {"prompt_tokens": 1, "completion_tokens": 1, "total_tokens": 2}});
                        ([(header::CONTENT_TYPE, "application/json")], c.to_string())
                    }
                }
            }),
        );
        let listener = tokio::net::TcpListener::bind("127.0.0.1:0").await.unwrap();
        let addr = listener.local_addr().unwrap();
        tokio::spawn(async move { axum::serve(listener, app).await });
        Upstream { url: format!("http://{addr}/v1"), requests }
    }

    fn plain() -> Bytes {
        Bytes::from_static(br#"{"model":"up","messages":[{"role":"user","content":"hi"}]}"#)
    }

    fn streamed() -> Bytes {
        Bytes::from_static(
            br#"{"model":"up","messages":[{"role":"user","content":"hi"}],"stream":true}"#,
        )
    }

    /// What the chain makes of a failure: for a failover its reason, breaker outcome and
    /// code; for a stop its status and the upstream's error class.
    fn verdict(e: CallError) -> String {
        match classify(Failure::Call(e)) {
            Verdict::Failover { reason, breaker, code } => {
                format!("failover {} {breaker:?} {}", reason.as_str(), code.as_str())
            }
            Verdict::Stop { status, error, .. } => {
                format!("stop {status} {} {:?}", error.kind, error.code)
            }
        }
    }

    #[tokio::test]
    async fn an_injected_status_is_classified_like_the_providers_real_error_body() {
        // Real bodies, as the providers document and send them.
        let table: &[(&str, u16, &str)] = &[
            (
                "openai",
                429,
                r#"{"error":{"message":"Rate limit reached for gpt-4o in organization org-abc on requests per min (RPM): Limit 500, Used 500, Requested 1. Please try again in 120ms.","type":"requests","param":null,"code":"rate_limit_exceeded"}}"#,
            ),
            (
                "openai",
                500,
                r#"{"error":{"message":"The server had an error while processing your request. Sorry about that!","type":"server_error","param":null,"code":null}}"#,
            ),
            (
                "openai",
                503,
                r#"{"error":{"message":"The engine is currently overloaded, please try again later","type":"server_error","param":null,"code":null}}"#,
            ),
            (
                "openai",
                401,
                r#"{"error":{"message":"Incorrect API key provided: sk-abc***wxyz.","type":"invalid_request_error","param":null,"code":"invalid_api_key"}}"#,
            ),
            (
                "openai",
                404,
                r#"{"error":{"message":"The model `gpt-9` does not exist or you do not have access to it.","type":"invalid_request_error","param":null,"code":"model_not_found"}}"#,
            ),
            (
                "openai-compatible",
                503,
                r#"{"error":{"message":"overloaded","type":"server_error","param":null,"code":null}}"#,
            ),
            (
                "azure-openai",
                429,
                r#"{"error":{"code":"429","message":"Requests to the ChatCompletions_Create Operation under Azure OpenAI API version 2024-10-21 have exceeded call rate limit of your current OpenAI S0 pricing tier. Please retry after 2 seconds."}}"#,
            ),
            (
                "azure-openai",
                500,
                r#"{"error":{"code":"InternalServerError","message":"Backend returned unexpected response. Please contact Microsoft for help."}}"#,
            ),
            (
                "azure-openai",
                404,
                r#"{"error":{"code":"DeploymentNotFound","message":"The API deployment for this resource does not exist."}}"#,
            ),
            (
                "anthropic",
                529,
                r#"{"type":"error","error":{"type":"overloaded_error","message":"Overloaded"}}"#,
            ),
            (
                "anthropic",
                429,
                r#"{"type":"error","error":{"type":"rate_limit_error","message":"Number of request tokens has exceeded your per-minute rate limit"}}"#,
            ),
            (
                "anthropic",
                500,
                r#"{"type":"error","error":{"type":"api_error","message":"Internal server error"}}"#,
            ),
            (
                "anthropic",
                400,
                r#"{"type":"error","error":{"type":"invalid_request_error","message":"messages: at least one message is required"}}"#,
            ),
            (
                "anthropic",
                401,
                r#"{"type":"error","error":{"type":"authentication_error","message":"invalid x-api-key"}}"#,
            ),
            (
                "gemini",
                429,
                r#"{"error":{"code":429,"message":"You exceeded your current quota, please check your plan and billing details.","status":"RESOURCE_EXHAUSTED"}}"#,
            ),
            (
                "gemini",
                503,
                r#"{"error":{"code":503,"message":"The model is overloaded. Please try again later.","status":"UNAVAILABLE"}}"#,
            ),
            (
                "gemini",
                500,
                r#"{"error":{"code":500,"message":"An internal error has occurred.","status":"INTERNAL"}}"#,
            ),
            (
                "gemini",
                400,
                r#"{"error":{"code":400,"message":"Request contains an invalid argument.","status":"INVALID_ARGUMENT"}}"#,
            ),
            (
                "gemini",
                403,
                r#"{"error":{"code":403,"message":"The caller does not have permission","status":"PERMISSION_DENIED"}}"#,
            ),
        ];
        for (kind, status, real) in table {
            // Nothing listens there: an injected status never reaches the network.
            let provider = runtime(kind, "http://127.0.0.1:9/v1");
            let faults = [fault(FaultKind::Status { status: *status, retry_after_secs: None })];
            for stream in [false, true] {
                let mut injector = Injector::new(&faults);
                let injected = if stream {
                    provider
                        .open_stream(&model(), streamed(), None, None, &mut injector)
                        .await
                        .err()
                } else {
                    provider.complete(&model(), plain(), None, None, &mut injector).await.err()
                };
                let injected = injected.unwrap_or_else(|| panic!("{kind} {status}: no error"));
                let code = StatusCode::from_u16(*status).unwrap();
                let real = provider.http_error(code, real.as_bytes(), None);
                assert_eq!(verdict(injected), verdict(real), "{kind} {status} stream={stream}");
                assert_eq!(injector.first().map(|f| f.name.as_str()), Some("drill"));
            }
        }
    }

    #[tokio::test]
    async fn an_injected_status_carries_its_retry_after() {
        let provider = runtime("anthropic", "http://127.0.0.1:9");
        let faults = [fault(FaultKind::Status { status: 429, retry_after_secs: Some(7) })];
        let e = provider
            .complete(&model(), plain(), None, None, &mut Injector::new(&faults))
            .await
            .err();
        let Some(CallError::Http { status, error, retry_after }) = e else { panic!("{e:?}") };
        assert_eq!(status, StatusCode::TOO_MANY_REQUESTS);
        assert_eq!(error.code.as_deref(), Some("rate_limit_error"));
        assert_eq!(retry_after, Some(Duration::from_secs(7)));
    }

    #[tokio::test]
    async fn an_injected_529_is_anthropics_overloaded_error_and_a_server_error() {
        let provider = runtime("anthropic", "http://127.0.0.1:9");
        let faults = [fault(FaultKind::Status { status: 529, retry_after_secs: None })];
        let e = provider
            .complete(&model(), plain(), None, None, &mut Injector::new(&faults))
            .await
            .unwrap_err();
        let CallError::Http { error, .. } = &e else { panic!("{e:?}") };
        assert_eq!(error.code.as_deref(), Some("overloaded_error"));
        assert_eq!(verdict(e), "failover server_error Some(Failure) upstream_server_error");
    }

    #[tokio::test]
    async fn reset_is_a_connection_error_without_a_call() {
        let up = upstream().await;
        let provider = runtime("openai", &up.url);
        let faults = [fault(FaultKind::Reset)];
        let e = provider
            .complete(&model(), plain(), None, None, &mut Injector::new(&faults))
            .await
            .unwrap_err();
        assert_eq!(
            verdict(e),
            "failover connection_error Some(Failure) upstream_connection_failed"
        );
        let e = provider
            .open_stream(&model(), streamed(), None, None, &mut Injector::new(&faults))
            .await
            .err();
        assert_eq!(
            verdict(e.unwrap()),
            "failover connection_error Some(Failure) upstream_connection_failed"
        );
        assert_eq!(up.requests.load(Ordering::SeqCst), 0);
    }

    #[tokio::test]
    async fn malformed_is_a_200_the_adapters_own_parser_refuses() {
        let faults = [fault(FaultKind::Malformed)];
        for kind in ["openai", "openai-compatible", "azure-openai", "anthropic", "gemini"] {
            let provider = runtime(kind, "http://127.0.0.1:9/v1");
            let e =
                provider.complete(&model(), plain(), None, None, &mut Injector::new(&faults)).await;
            let e = e.err().unwrap_or_else(|| panic!("{kind}: parsed"));
            assert!(matches!(e, CallError::Malformed(_)), "{kind}: {e:?}");
            assert_eq!(verdict(e), "failover server_error Some(Failure) upstream_malformed");
            let mut stream = provider
                .open_stream(&model(), streamed(), None, None, &mut Injector::new(&faults))
                .await
                .unwrap_or_else(|e| panic!("{kind}: the head is a 200: {e:?}"));
            let first = stream.next().await;
            assert!(matches!(first, Some(Err(StreamError::Malformed(_)))), "{kind}: {first:?}");
        }
    }

    #[tokio::test]
    async fn hang_never_answers_so_the_attempts_timeout_fires() {
        let up = upstream().await;
        let provider = runtime("openai", &up.url);
        let faults = [fault(FaultKind::Hang)];
        let wait = Duration::from_millis(300);
        let model = model();
        let mut injector = Injector::new(&faults);
        let plain_call = provider.complete(&model, plain(), None, None, &mut injector);
        assert!(tokio::time::timeout(wait, plain_call).await.is_err(), "answered");
        let mut injector = Injector::new(&faults);
        let stream_call = provider.open_stream(&model, streamed(), None, None, &mut injector);
        assert!(tokio::time::timeout(wait, stream_call).await.is_err(), "answered");
        assert_eq!(injector.first().map(|f| f.name.as_str()), Some("drill"));
        assert_eq!(up.requests.load(Ordering::SeqCst), 0);
    }

    #[tokio::test]
    async fn delay_waits_then_makes_the_real_call() {
        let up = upstream().await;
        let provider = runtime("openai", &up.url);
        let faults = [fault(FaultKind::Delay { ms: 300 })];
        let started = Instant::now();
        let completion = provider
            .complete(&model(), plain(), None, None, &mut Injector::new(&faults))
            .await
            .unwrap();
        assert!(started.elapsed() >= Duration::from_millis(300), "{:?}", started.elapsed());
        assert_eq!(completion.usage.completion_tokens, 1);
        assert_eq!(up.requests.load(Ordering::SeqCst), 1);
    }

    async fn content_before_the_cut(stream: &mut UpstreamStream) -> Vec<String> {
        let mut texts = Vec::new();
        loop {
            let next = tokio::time::timeout(Duration::from_millis(300), stream.next()).await;
            match next {
                Ok(Some(Ok(StreamEvent::Chunk { fields, commits: true, .. }))) => {
                    let choices: serde_json::Value =
                        serde_json::from_str(fields["choices"].get()).unwrap();
                    texts.push(choices[0]["delta"]["content"].as_str().unwrap().to_owned());
                }
                Ok(Some(Ok(StreamEvent::Done))) => {
                    texts.push("[DONE]".into());
                    return texts;
                }
                Ok(Some(Ok(_))) => {}
                // The caller sees what ended it.
                other => {
                    texts.push(format!("{other:?}"));
                    return texts;
                }
            }
        }
    }

    #[tokio::test]
    async fn stall_after_k_chunks_keeps_the_stream_open_and_silent() {
        let up = upstream().await;
        let provider = runtime("openai", &up.url);
        let faults = [fault(FaultKind::StallAfter { chunks: 3 })];
        let mut stream = provider
            .open_stream(&model(), streamed(), None, None, &mut Injector::new(&faults))
            .await
            .unwrap();
        let got = content_before_the_cut(&mut stream).await;
        assert_eq!(got[..3], ["one ", "two ", "three "]);
        assert!(got[3].starts_with("Err(Elapsed"), "the reader's timeout ended it: {got:?}");
        assert_eq!(up.requests.load(Ordering::SeqCst), 1, "the real call was made");
    }

    #[tokio::test]
    async fn drop_after_k_chunks_breaks_the_connection() {
        let up = upstream().await;
        let provider = runtime("openai", &up.url);
        let faults = [fault(FaultKind::DropAfter { chunks: 2 })];
        let mut stream = provider
            .open_stream(&model(), streamed(), None, None, &mut Injector::new(&faults))
            .await
            .unwrap();
        let got = content_before_the_cut(&mut stream).await;
        assert_eq!(got[..2], ["one ", "two "]);
        assert!(got[2].contains("Connection") && got[2].contains("drill"), "{got:?}");
        assert!(stream.next().await.is_none(), "nothing after the drop");
    }

    #[tokio::test]
    async fn a_stream_fault_leaves_a_plain_call_alone() {
        let up = upstream().await;
        let provider = runtime("openai", &up.url);
        let faults = [fault(FaultKind::DropAfter { chunks: 0 })];
        let mut injector = Injector::new(&faults);
        assert!(provider.complete(&model(), plain(), None, None, &mut injector).await.is_ok());
        assert!(injector.first().is_none());
    }

    #[tokio::test]
    async fn a_fault_at_rate_zero_never_touches_a_call() {
        let up = upstream().await;
        let provider = runtime("openai", &up.url);
        let mut never = (*fault(FaultKind::Reset)).clone();
        never.rate = 0.0;
        let faults = [Arc::new(never)];
        let mut injector = Injector::new(&faults);
        for _ in 0..20 {
            assert!(provider.complete(&model(), plain(), None, None, &mut injector).await.is_ok());
        }
        assert!(injector.first().is_none());
        assert_eq!(up.requests.load(Ordering::SeqCst), 20);
    }

    #[tokio::test]
    async fn the_request_id_goes_upstream_as_x_request_id_for_every_provider_kind() {
        use std::sync::Mutex;
        let seen = Arc::new(Mutex::new(Vec::new()));
        let record = Arc::clone(&seen);
        let app = axum::Router::new().fallback(move |headers: http::HeaderMap| {
            let record = Arc::clone(&record);
            async move {
                let id = headers.get("x-request-id").map(|v| v.to_str().unwrap().to_owned());
                record.lock().unwrap().push(id);
                StatusCode::SERVICE_UNAVAILABLE
            }
        });
        let listener = tokio::net::TcpListener::bind("127.0.0.1:0").await.unwrap();
        let url = format!("http://{}", listener.local_addr().unwrap());
        tokio::spawn(async move { axum::serve(listener, app).await });
        let id = HeaderValue::from_static("req-1");
        for kind in ["openai", "azure-openai", "anthropic", "gemini"] {
            let provider = runtime(kind, &url);
            let (model, mut injector) = (model(), Injector::default());
            let call = provider.complete(&model, plain(), Some(&id), None, &mut injector).await;
            assert!(call.is_err(), "{kind}: the upstream answers 503");
        }
        let probe = provider_without_id(&url).await;
        assert!(probe.is_err());
        let seen = seen.lock().unwrap().clone();
        let expected = [Some("req-1"); 4].map(|s| s.map(str::to_owned));
        assert_eq!(seen[..4], expected, "{seen:?}");
        assert_eq!(seen[4], None, "a call without a request (a probe) sends none");
    }

    async fn provider_without_id(url: &str) -> Result<Completion, CallError> {
        runtime("openai", url)
            .complete(&model(), plain(), None, None, &mut Injector::default())
            .await
    }

    #[tokio::test]
    async fn without_faults_the_stream_is_the_upstreams_whole() {
        let up = upstream().await;
        let provider = runtime("openai", &up.url);
        let mut stream = provider
            .open_stream(&model(), streamed(), None, None, &mut Injector::default())
            .await
            .unwrap();
        let got = content_before_the_cut(&mut stream).await;
        assert_eq!(got[..5], CHUNKS);
        assert_eq!(got[5], "[DONE]", "{got:?}");
    }
}
