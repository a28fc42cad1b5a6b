//! Gemini's wire format (to be written).

use bytes::Bytes;
use http::StatusCode;
use http_body_util::Full;

use switchyard_catalog::{Model, Provider};

use super::sse::Frame;
use super::{Adapter, CallError, Completion, Secret, StreamDecoder, StreamEvent, UpstreamError};
use crate::request::ChatRequest;

pub struct Gemini;

impl Adapter for Gemini {
    fn request(
        &self,
        _provider: &Provider,
        _model: &Model,
        _request: &ChatRequest,
        _credential: Option<&Secret>,
    ) -> Result<http::Request<Full<Bytes>>, CallError> {
        Err(CallError::NoCredential("the gemini adapter is not built yet".into()))
    }

    fn completion(&self, _body: &[u8]) -> Result<Completion, CallError> {
        Err(CallError::Malformed("the gemini adapter is not built yet".into()))
    }

    fn error(&self, _status: StatusCode, _body: &[u8]) -> UpstreamError {
        UpstreamError::default()
    }

    fn stream_decoder(&self, _upstream_model: &str) -> Box<dyn StreamDecoder> {
        Box::new(NotBuilt)
    }
}

struct NotBuilt;

impl StreamDecoder for NotBuilt {
    fn decode(&mut self, _frame: &Frame) -> Result<Vec<StreamEvent>, String> {
        Err("the gemini adapter is not built yet".into())
    }
}
