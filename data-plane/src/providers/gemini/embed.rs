//! Gemini's embeddings: `POST {base_url}/v1beta/models/{model}:embedContent` for one input,
//! `:batchEmbedContents` for several (Gemini API reference, "Embeddings"), each text one
//! content of one part; `dimensions` → `outputDimensionality`. The answer's vectors become
//! OpenAI's embeddings list, in input order.

use bytes::Bytes;
use serde::{Deserialize, Serialize};

use switchyard_catalog::Model;

use crate::embeddings::{Embeddings, Input, List};
use crate::providers::error::CallError;
use crate::providers::unified::{Completion, Fields, Usage};

#[derive(Serialize)]
#[serde(rename_all = "camelCase")]
struct EmbedContentRequest<'a> {
    /// Each request of a batch names its model (`models/{model}`); a single one need not.
    #[serde(skip_serializing_if = "Option::is_none")]
    model: Option<&'a str>,
    content: Content<'a>,
    #[serde(skip_serializing_if = "Option::is_none")]
    output_dimensionality: Option<u32>,
}

#[derive(Serialize)]
struct Content<'a> {
    parts: [Part<'a>; 1],
}

#[derive(Serialize)]
struct Part<'a> {
    text: &'a str,
}

#[derive(Serialize)]
struct BatchEmbedContentsRequest<'a> {
    requests: Vec<EmbedContentRequest<'a>>,
}

#[derive(Deserialize)]
struct EmbedResponse {
    /// `embedContent`'s answer.
    embedding: Option<ContentEmbedding>,
    /// `batchEmbedContents`'s answer.
    embeddings: Option<Vec<ContentEmbedding>>,
}

#[derive(Deserialize)]
struct ContentEmbedding {
    values: Vec<f32>,
}

/// The upstream model's path segment, as `request` names it.
fn upstream(model: &Model) -> &str {
    model.upstream_model.trim_start_matches("models/")
}

/// Whether the call goes to `:batchEmbedContents`.
fn batched(embeddings: &Embeddings) -> bool {
    embeddings.input.len() != 1
}

/// The method the call's URL ends in.
pub fn method(embeddings: &Embeddings) -> &'static str {
    if batched(embeddings) { "batchEmbedContents" } else { "embedContent" }
}

pub fn body(model: &Model, embeddings: &Embeddings) -> Result<Bytes, CallError> {
    let Input::Text(texts) = &embeddings.input else {
        return Err(CallError::Unsupported {
            message: "Gemini embeds text only, not token ids".into(),
            param: Some("input".into()),
        });
    };
    let name = format!("models/{}", upstream(model));
    let one = |text| EmbedContentRequest {
        model: None,
        content: Content { parts: [Part { text }] },
        output_dimensionality: embeddings.dimensions,
    };
    let body = if batched(embeddings) {
        let requests =
            texts.iter().map(|t| EmbedContentRequest { model: Some(&name), ..one(t) }).collect();
        serde_json::to_vec(&BatchEmbedContentsRequest { requests })
    } else {
        serde_json::to_vec(&one(texts.first().map_or("", String::as_str)))
    };
    body.map(Bytes::from).map_err(CallError::Encode)
}

/// Gemini's answer as OpenAI's list: `model` the upstream's, usage the input's estimate (an
/// embeddings answer from Gemini reports no token count).
pub fn answer(body: &[u8], model: &str, embeddings: &Embeddings) -> Result<Completion, CallError> {
    let response: EmbedResponse = serde_json::from_slice(body)
        .map_err(|e| CallError::Malformed(format!("not an embeddings answer: {e}")))?;
    let vectors: Vec<Vec<f32>> = match (response.embedding, response.embeddings) {
        (_, Some(many)) => many.into_iter().map(|e| e.values).collect(),
        (Some(one), None) => vec![one.values],
        (None, None) => {
            return Err(CallError::Malformed(
                "no `embedding` or `embeddings` in the answer".into(),
            ));
        }
    };
    if vectors.len() != embeddings.input.len() {
        return Err(CallError::Malformed(format!(
            "{} vectors for {} inputs",
            vectors.len(),
            embeddings.input.len()
        )));
    }
    let prompt_tokens = embeddings.input.estimated_tokens();
    let list = List::of(vectors, embeddings.base64, model, prompt_tokens);
    let bytes = serde_json::to_vec(&list).map_err(CallError::Encode)?;
    let usage = Usage { prompt_tokens, completion_tokens: 0 };
    // Built here, so its `model` is where the serializer put it: found again by the same
    // reader OpenAI's answers go through.
    let model_at = locate_model(&bytes);
    Ok(Completion::new(Fields::Verbatim { bytes: Bytes::from(bytes), model: model_at }, usage))
}

fn locate_model(body: &[u8]) -> Option<std::ops::Range<usize>> {
    #[derive(Deserialize)]
    struct Top<'a> {
        #[serde(borrow)]
        model: Option<&'a serde_json::value::RawValue>,
    }
    let top: Top<'_> = serde_json::from_slice(body).ok()?;
    let raw = top.model?;
    let at = raw.get().as_ptr() as usize - body.as_ptr() as usize;
    Some(at..at + raw.get().len())
}

#[cfg(test)]
mod tests {
    use super::*;

    fn model() -> Model {
        serde_json::from_value(serde_json::json!({"name": "g/e", "provider": "g",
            "upstream_model": "gemini-embedding-001", "type": "embedding", "dimensions": 3}))
        .unwrap()
    }

    fn asked(input: Input, dimensions: Option<u32>) -> Embeddings {
        Embeddings { input, dimensions, base64: false }
    }

    #[test]
    fn one_text_is_an_embed_content_and_several_a_batch_naming_the_model() {
        let one = asked(Input::Text(vec!["hi".into()]), Some(3));
        assert_eq!(method(&one), "embedContent");
        let sent: serde_json::Value =
            serde_json::from_slice(&body(&model(), &one).unwrap()).unwrap();
        assert_eq!(
            sent,
            serde_json::json!({"content": {"parts": [{"text": "hi"}]}, "outputDimensionality": 3})
        );
        let two = asked(Input::Text(vec!["a".into(), "b".into()]), None);
        assert_eq!(method(&two), "batchEmbedContents");
        let sent: serde_json::Value =
            serde_json::from_slice(&body(&model(), &two).unwrap()).unwrap();
        assert_eq!(
            sent,
            serde_json::json!({"requests": [
                {"model": "models/gemini-embedding-001", "content": {"parts": [{"text": "a"}]}},
                {"model": "models/gemini-embedding-001", "content": {"parts": [{"text": "b"}]}}
            ]})
        );
        let tokens = asked(Input::Tokens(vec![vec![1]]), None);
        assert!(matches!(body(&model(), &tokens), Err(CallError::Unsupported { .. })));
    }

    #[test]
    fn the_answer_is_openais_list_in_input_order() {
        let two = asked(Input::Text(vec!["abcd".into(), "efghi".into()]), None);
        let answer = answer(
            br#"{"embeddings":[{"values":[0.1,0.2]},{"values":[0.3,0.4]}]}"#,
            "gemini-embedding-001",
            &two,
        )
        .unwrap();
        assert_eq!(answer.usage.prompt_tokens, 3);
        let name = serde_json::value::to_raw_value("g/e").unwrap();
        let out: serde_json::Value = serde_json::from_slice(&answer.to_json(&name, None)).unwrap();
        assert_eq!(out["object"], "list");
        assert_eq!(out["model"], "g/e");
        assert_eq!(out["data"][1]["index"], 1);
        assert_eq!(out["data"][1]["object"], "embedding");
        assert_eq!(out["data"][1]["embedding"][0].as_f64().map(|f| (f * 10.0).round()), Some(3.0));
        assert_eq!(out["usage"], serde_json::json!({"prompt_tokens": 3, "total_tokens": 3}));
        let one = asked(Input::Text(vec!["x".into()]), None);
        assert!(super::answer(br#"{"embedding":{"values":[1.0]}}"#, "m", &one).is_ok());
        assert!(matches!(
            super::answer(br#"{"embedding":{"values":[1.0]}}"#, "m", &two),
            Err(CallError::Malformed(_))
        ));
    }
}
