//! The trait each provider kind's wire format implements; `providers` dispatches to it.

use bytes::Bytes;
use http::StatusCode;
use http_body_util::Full;

use switchyard_catalog::{Model, Provider};

use super::error::{CallError, UpstreamError};
use super::secret::Secret;
use super::sse;
use super::unified::{Completion, StreamEvent};
use crate::embeddings::Embeddings;
use crate::request::ChatRequest;

/// A provider kind's wire format.
pub trait Adapter: Send + Sync {
    /// The upstream body for `model`: the attempt's one translation. A request this
    /// provider cannot take is [`CallError::Unsupported`], naming what it cannot honour.
    fn body(&self, model: &Model, request: &ChatRequest<'_>) -> Result<Bytes, CallError>;

    /// Whether [`Adapter::body`] translates into another format, and so may refuse a
    /// request: such bodies are built when the chain is formed, so a refusal comes before
    /// any upstream call; a pass-through body is built only for the attempt that sends it.
    fn translates(&self) -> bool {
        false
    }

    /// The upstream HTTP request carrying `body`, with `credential` if there is one.
    fn request(
        &self,
        provider: &Provider,
        model: &Model,
        stream: bool,
        body: Bytes,
        credential: Option<&Secret>,
    ) -> Result<http::Request<Full<Bytes>>, CallError>;

    /// [`Adapter::body`] then [`Adapter::request`]: one request looked at on its own (tests,
    /// the translation benchmark).
    fn build(
        &self,
        provider: &Provider,
        model: &Model,
        request: &ChatRequest<'_>,
        credential: Option<&Secret>,
    ) -> Result<http::Request<Full<Bytes>>, CallError> {
        let body = self.body(model, request)?;
        self.request(provider, model, request.stream, body, credential)
    }

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

    /// A 200 body in Anthropic's Messages format, for a `/v1/messages` request, when this kind
    /// speaks that format: the upstream's own body, usage read from it. `None` for kinds that
    /// answer in the unified shape, which the surface translates.
    fn messages_completion(&self, _body: &Bytes) -> Option<Result<Completion, CallError>> {
        None
    }

    /// Like [`Adapter::messages_completion`], for a stream: a decoder that passes the
    /// upstream's events on as they are.
    fn messages_decoder(&self) -> Option<Box<dyn StreamDecoder>> {
        None
    }

    /// The upstream body of an embeddings request (docs/http-api.md, "`POST /v1/embeddings`").
    /// Kinds without an embeddings API refuse it (the chain refuses such a model first).
    fn embeddings_body(
        &self,
        model: &Model,
        _request: &ChatRequest<'_>,
        _embeddings: &Embeddings,
    ) -> Result<Bytes, CallError> {
        Err(no_embeddings(model))
    }

    /// The upstream HTTP request of an embeddings call carrying `body`.
    fn embeddings_request(
        &self,
        _provider: &Provider,
        model: &Model,
        _embeddings: &Embeddings,
        _body: Bytes,
        _credential: Option<&Secret>,
    ) -> Result<http::Request<Full<Bytes>>, CallError> {
        Err(no_embeddings(model))
    }

    /// A 200 embeddings body as OpenAI's embeddings list, in a [`Completion`] (whose `model`
    /// the node replaces, as for a chat answer), usage counting the input's tokens.
    fn embeddings(&self, _body: Bytes, _embeddings: &Embeddings) -> Result<Completion, CallError> {
        Err(CallError::Malformed("this provider kind has no embeddings API".into()))
    }

    /// A decoder for one streamed response (providers whose events refer back to earlier
    /// ones, such as Anthropic's content blocks, keep that state in it).
    fn stream_decoder(&self, upstream_model: &str) -> Box<dyn StreamDecoder>;
}

fn no_embeddings(model: &Model) -> CallError {
    CallError::Unsupported {
        message: format!("the model `{}`'s provider kind has no embeddings API", model.name),
        param: None,
    }
}

/// Turns one response's SSE frames into unified events, in order.
pub trait StreamDecoder: Send {
    /// The events one frame yields (often one, sometimes none or several).
    fn decode(&mut self, frame: &sse::Frame) -> Result<Vec<StreamEvent>, String>;

    /// The events that end a stream whose answer is whole (its last chunk said `finished`)
    /// but whose body closed before the provider's end marker: what the marker would have
    /// brought (a usage chunk the decoder holds), then [`StreamEvent::Done`]. Whether the
    /// stream was whole is decided in one place for every provider, `UpstreamStream`; the
    /// decoder only says what closing it takes. Gemini has no end marker at all: every
    /// clean Gemini stream ends here.
    fn close(&mut self) -> Vec<StreamEvent> {
        vec![StreamEvent::Done]
    }
}
