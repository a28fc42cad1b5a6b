//! Azure OpenAI: OpenAI's wire format at a deployment URL,
//! `{base_url}/openai/deployments/{deployment}/chat/completions?api-version=…`, with the
//! key in an `api-key` header. The catalog's `upstream_model` is the deployment name and
//! the provider's `api_version` the API version (Azure OpenAI REST reference, "Chat
//! completions").

use bytes::Bytes;
use http::{StatusCode, header};
use http_body_util::Full;

use switchyard_catalog::{Model, Provider};

use super::adapter::{Adapter, StreamDecoder};
use super::error::{CallError, UpstreamError};
use super::openai;
use super::secret::Secret;
use super::sse::Frame;
use super::unified::{Completion, StreamEvent};
use crate::embeddings::Embeddings;
use crate::request::ChatRequest;

pub struct Azure;

/// Used only if a catalog written before `api_version` was required reaches a node.
const FALLBACK_API_VERSION: &str = "2024-10-21";

impl Adapter for Azure {
    fn body(&self, model: &Model, request: &ChatRequest<'_>) -> Result<Bytes, CallError> {
        Ok(Bytes::from(openai::body(model, request)))
    }

    fn request(
        &self,
        provider: &Provider,
        model: &Model,
        _stream: bool,
        body: Bytes,
        credential: Option<&Secret>,
    ) -> Result<http::Request<Full<Bytes>>, CallError> {
        deployment_request(provider, model, "chat/completions", body, credential)
    }

    fn completion(&self, body: &[u8]) -> Result<Completion, CallError> {
        openai::OpenAi.completion(body)
    }

    fn error(&self, status: StatusCode, body: &[u8]) -> UpstreamError {
        openai::parse_error(status, body)
    }

    fn stream_decoder(&self, _upstream_model: &str) -> Box<dyn StreamDecoder> {
        Box::new(AzureChunks::default())
    }

    fn embeddings_body(
        &self,
        model: &Model,
        request: &ChatRequest<'_>,
        _embeddings: &Embeddings,
    ) -> Result<Bytes, CallError> {
        Ok(Bytes::from(openai::body(model, request)))
    }

    /// `{base_url}/openai/deployments/{deployment}/embeddings?api-version=…` (Azure OpenAI
    /// REST reference, "Embeddings").
    fn embeddings_request(
        &self,
        provider: &Provider,
        model: &Model,
        _embeddings: &Embeddings,
        body: Bytes,
        credential: Option<&Secret>,
    ) -> Result<http::Request<Full<Bytes>>, CallError> {
        deployment_request(provider, model, "embeddings", body, credential)
    }

    fn embeddings(&self, body: Bytes, embeddings: &Embeddings) -> Result<Completion, CallError> {
        openai::embeddings_answer(body, embeddings)
    }
}

/// A POST to one of the deployment's operations (`chat/completions`, `embeddings`).
fn deployment_request(
    provider: &Provider,
    model: &Model,
    operation: &str,
    body: Bytes,
    credential: Option<&Secret>,
) -> Result<http::Request<Full<Bytes>>, CallError> {
    let url = format!(
        "{}/openai/deployments/{}/{operation}?api-version={}",
        provider.base_url.trim_end_matches('/'),
        model.upstream_model,
        provider.api_version.as_deref().unwrap_or(FALLBACK_API_VERSION),
    );
    let mut builder = http::Request::post(url)
        .header(header::CONTENT_TYPE, "application/json")
        .header(header::ACCEPT, "application/json");
    if let Some(secret) = credential {
        builder = builder.header("api-key", secret.expose());
    }
    builder.body(Full::new(body)).map_err(CallError::Build)
}

#[derive(Default)]
struct AzureChunks(openai::Choices);

impl StreamDecoder for AzureChunks {
    fn decode(&mut self, frame: &Frame) -> Result<Vec<StreamEvent>, String> {
        // Azure sends a first chunk with empty `choices` and only `prompt_filter_results`;
        // it carries nothing for the client.
        let event = openai::decode_chunk(frame, &mut self.0)?;
        Ok(match event {
            Some(StreamEvent::Chunk { ref fields, usage: None, .. })
                if fields.get("choices").is_some_and(|c| c.get() == "[]") =>
            {
                Vec::new()
            }
            other => other.into_iter().collect(),
        })
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    fn provider() -> Provider {
        serde_json::from_value(serde_json::json!({
            "name": "azure", "kind": "azure-openai", "base_url": "https://contoso.openai.azure.com/",
            "api_version": "2024-10-21"
        }))
        .unwrap()
    }

    fn model() -> Model {
        serde_json::from_value(serde_json::json!({
            "name": "azure/gpt-4o", "provider": "azure", "upstream_model": "gpt4o-prod"
        }))
        .unwrap()
    }

    #[test]
    fn requests_go_to_the_deployment_url_with_an_api_key_header() {
        let req = ChatRequest::parse(
            br#"{"model":"azure/gpt-4o","messages":[{"role":"user","content":"hi"}]}"#,
        )
        .unwrap();
        let secret = Secret::new("k-123");
        let built = Azure.build(&provider(), &model(), &req, Some(&secret)).unwrap();
        assert_eq!(
            built.uri().to_string(),
            "https://contoso.openai.azure.com/openai/deployments/gpt4o-prod/chat/completions?api-version=2024-10-21"
        );
        assert_eq!(built.headers()["api-key"], "k-123");
        assert!(built.headers().get(header::AUTHORIZATION).is_none());
    }

    #[test]
    fn embeddings_go_to_the_deployments_embeddings_path() {
        let request =
            ChatRequest::embeddings(br#"{"model":"azure/te3","input":["a","b"]}"#).unwrap();
        let embeddings = request.embeddings.clone().unwrap();
        let body = Azure.embeddings_body(&model(), &request, &embeddings).unwrap();
        let built = Azure
            .embeddings_request(&provider(), &model(), &embeddings, body, Some(&Secret::new("k")))
            .unwrap();
        assert_eq!(
            built.uri().to_string(),
            "https://contoso.openai.azure.com/openai/deployments/gpt4o-prod/embeddings?api-version=2024-10-21"
        );
        assert_eq!(built.headers()["api-key"], "k");
    }

    #[test]
    fn the_prompt_filter_chunk_is_dropped() {
        // Azure's first streamed chunk: empty id/object/model, `choices: []`, only the prompt's
        // filter results. Shape as documented in MicrosoftDocs/azure-ai-docs,
        // articles/ai-foundry/openai/concepts/content-streaming.md, and as recorded in the
        // Azure OpenAI JS SDK's chat-completion-chunk fixtures.
        let frame = Frame {
            event: None,
            data: r#"{"choices":[],"created":0,"id":"","model":"","object":"","prompt_filter_results":[{"prompt_index":0,"content_filter_results":{}}]}"#.into(),
        };
        assert!(AzureChunks::default().decode(&frame).unwrap().is_empty());
    }
}
