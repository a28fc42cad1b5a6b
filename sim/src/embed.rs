//! Embeddings in OpenAI's format (`POST /v1/embeddings`, Azure's
//! `/openai/deployments/{name}/embeddings`) and Gemini's (`:embedContent`,
//! `:batchEmbedContents`): requests read as the real APIs read them, and a deterministic
//! vector per (model, input), so a test can tell which model made it and compare it across
//! calls.
//!
//! A vector has the request's `dimensions` (Gemini: `outputDimensionality`), else the
//! scripted reply's `dimensions`, else [`DEFAULT_DIMENSIONS`]. Vectors are always floats: the
//! simulator ignores `encoding_format`, as some OpenAI-compatible servers do, so the gateway's
//! own base64 encoding is what a client gets.

use std::borrow::Cow;

use bytes::Bytes;
use serde::{Deserialize, Serialize};

use crate::{gemini, openai};

/// A vector's length when neither the request nor the script says.
pub const DEFAULT_DIMENSIONS: u32 = 8;

/// What an embeddings request asks, in either format.
#[derive(Debug, Clone, PartialEq)]
pub struct EmbedRequest {
    pub model: String,
    /// Each input, as the key its vector is made from (token arrays as their ids).
    pub inputs: Vec<String>,
    pub dimensions: Option<u32>,
    /// Whitespace-separated words in every text, or token ids (the simulator's tokenizer).
    pub prompt_tokens: u64,
}

impl EmbedRequest {
    /// The answer's vectors, one per input.
    pub fn vectors(&self, scripted: Option<u32>) -> Vec<Vec<f32>> {
        let dims = self.dimensions.or(scripted).unwrap_or(DEFAULT_DIMENSIONS);
        self.inputs.iter().map(|input| vector(&self.model, input, dims)).collect()
    }
}

/// A unit-length vector of `dims` floats from (model, input): the same pair always gives the
/// same vector.
pub fn vector(model: &str, input: &str, dims: u32) -> Vec<f32> {
    // FNV-1a over both, then splitmix64 per component.
    let mut seed: u64 = 0xcbf2_9ce4_8422_2325;
    for b in model.bytes().chain([0]).chain(input.bytes()) {
        seed = (seed ^ u64::from(b)).wrapping_mul(0x0100_0000_01b3);
    }
    let mut values: Vec<f32> = (0..u64::from(dims))
        .map(|i| {
            let mut z = seed.wrapping_add(i.wrapping_mul(0x9e37_79b9_7f4a_7c15));
            z = (z ^ (z >> 30)).wrapping_mul(0xbf58_476d_1ce4_e5b9);
            z = (z ^ (z >> 27)).wrapping_mul(0x94d0_49bb_1331_11eb);
            z ^= z >> 31;
            (z >> 11) as f32 / (1u64 << 53) as f32 * 2.0 - 1.0
        })
        .collect();
    let norm = values.iter().map(|v| v * v).sum::<f32>().sqrt();
    if norm > 0.0 {
        values.iter_mut().for_each(|v| *v /= norm);
    }
    values
}

// === OpenAI ===

#[derive(Deserialize)]
struct RawOpenAi<'a> {
    #[serde(borrow)]
    model: Option<Cow<'a, str>>,
    input: Option<OpenAiInput>,
    dimensions: Option<i64>,
}

#[derive(Deserialize)]
#[serde(untagged)]
enum OpenAiInput {
    One(String),
    Many(Vec<String>),
    Tokens(Vec<u32>),
    TokenLists(Vec<Vec<u32>>),
}

/// Reads an OpenAI embeddings body, refusing it as OpenAI does.
pub fn parse_openai(body: &[u8]) -> Result<EmbedRequest, openai::ApiError> {
    let invalid = |message: &'static str, param: &'static str| {
        openai::ApiError::new(400, message, "invalid_request_error").param(param)
    };
    let raw: RawOpenAi<'_> = serde_json::from_slice(body).map_err(|_| {
        invalid("'$.input' is invalid. Please check the API reference: https://platform.openai.com/docs/api-reference.", "input")
    })?;
    let Some(model) = raw.model else {
        return Err(invalid("you must provide a model parameter", "model"));
    };
    let words = |t: &str| t.split_whitespace().count() as u64;
    let (inputs, prompt_tokens) = match raw.input {
        None => return Err(invalid("'input' is a required property", "input")),
        Some(OpenAiInput::One(t)) => {
            let n = words(&t);
            (vec![t], n)
        }
        Some(OpenAiInput::Many(ts)) => {
            let n = ts.iter().map(|t| words(t)).sum();
            (ts, n)
        }
        Some(OpenAiInput::Tokens(ids)) => (vec![ids_key(&ids)], ids.len() as u64),
        Some(OpenAiInput::TokenLists(lists)) => {
            let n = lists.iter().map(|l| l.len() as u64).sum();
            (lists.iter().map(|l| ids_key(l)).collect(), n)
        }
    };
    if inputs.is_empty() || inputs.iter().any(String::is_empty) {
        return Err(invalid(
            "'$.input' is invalid. Please check the API reference: https://platform.openai.com/docs/api-reference.",
            "input",
        ));
    }
    let dimensions = match raw.dimensions {
        None => None,
        Some(d) if d > 0 => u32::try_from(d).ok(),
        Some(_) => {
            return Err(invalid(
                "Invalid value for 'dimensions': must be at least 1.",
                "dimensions",
            ));
        }
    };
    Ok(EmbedRequest { model: model.into_owned(), inputs, dimensions, prompt_tokens })
}

fn ids_key(ids: &[u32]) -> String {
    ids.iter().map(u32::to_string).collect::<Vec<_>>().join(" ")
}

#[derive(Serialize)]
struct OpenAiList<'a> {
    object: &'static str,
    data: Vec<OpenAiDatum>,
    model: &'a str,
    usage: OpenAiUsage,
}

#[derive(Serialize)]
struct OpenAiDatum {
    object: &'static str,
    index: usize,
    embedding: Vec<f32>,
}

#[derive(Serialize)]
struct OpenAiUsage {
    prompt_tokens: u64,
    total_tokens: u64,
}

/// OpenAI's embeddings list for `request`.
pub fn openai_body(request: &EmbedRequest, scripted: Option<u32>) -> Bytes {
    let data = request
        .vectors(scripted)
        .into_iter()
        .enumerate()
        .map(|(index, embedding)| OpenAiDatum { object: "embedding", index, embedding })
        .collect();
    let usage =
        OpenAiUsage { prompt_tokens: request.prompt_tokens, total_tokens: request.prompt_tokens };
    let list = OpenAiList { object: "list", data, model: &request.model, usage };
    Bytes::from(serde_json::to_vec(&list).unwrap_or_default())
}

// === Gemini ===

/// `(model, batch)` for a Gemini embeddings path.
pub fn gemini_route(path: &str) -> Option<(String, bool)> {
    let rest = path.strip_prefix("/v1beta/models/")?;
    let (model, method) = rest.rsplit_once(':')?;
    let batch = match method {
        "embedContent" => false,
        "batchEmbedContents" => true,
        _ => return None,
    };
    (!model.is_empty()).then(|| (model.to_owned(), batch))
}

#[derive(Deserialize)]
#[serde(rename_all = "camelCase")]
struct RawEmbedContent {
    content: Option<RawContent>,
    output_dimensionality: Option<u32>,
}

#[derive(Deserialize)]
struct RawContent {
    #[serde(default)]
    parts: Vec<RawPart>,
}

#[derive(Deserialize)]
struct RawPart {
    text: Option<String>,
}

#[derive(Deserialize)]
struct RawBatch {
    requests: Option<Vec<RawEmbedContent>>,
}

/// Reads a Gemini `embedContent` (`batch`: `batchEmbedContents`) body, refusing it as Google
/// does.
pub fn parse_gemini(
    model: &str,
    batch: bool,
    body: &[u8],
) -> Result<EmbedRequest, gemini::ApiError> {
    let bad_json =
        || gemini::ApiError::new(400, "Invalid JSON payload received. Unexpected token.".into());
    let requests = if batch {
        let raw: RawBatch = serde_json::from_slice(body).map_err(|_| bad_json())?;
        match raw.requests {
            Some(r) if !r.is_empty() => r,
            _ => {
                return Err(gemini::ApiError::new(
                    400,
                    "* BatchEmbedContentsRequest.requests: requests is not specified\n".into(),
                ));
            }
        }
    } else {
        vec![serde_json::from_slice::<RawEmbedContent>(body).map_err(|_| bad_json())?]
    };
    let mut inputs = Vec::with_capacity(requests.len());
    let mut dimensions = None;
    for request in requests {
        let text: String = request
            .content
            .map(|c| c.parts.into_iter().filter_map(|p| p.text).collect())
            .unwrap_or_default();
        if text.is_empty() {
            return Err(gemini::ApiError::new(
                400,
                "* EmbedContentRequest.content: contains an empty Part.\n".into(),
            ));
        }
        dimensions = dimensions.or(request.output_dimensionality);
        inputs.push(text);
    }
    let prompt_tokens = inputs.iter().map(|t| t.split_whitespace().count() as u64).sum();
    Ok(EmbedRequest { model: model.to_owned(), inputs, dimensions, prompt_tokens })
}

#[derive(Serialize)]
struct GeminiEmbedding {
    values: Vec<f32>,
}

#[derive(Serialize)]
struct GeminiOne {
    embedding: GeminiEmbedding,
}

#[derive(Serialize)]
struct GeminiBatch {
    embeddings: Vec<GeminiEmbedding>,
}

/// Gemini's answer for `request`: `{"embedding": …}`, or `{"embeddings": […]}` for a batch.
pub fn gemini_body(request: &EmbedRequest, batch: bool, scripted: Option<u32>) -> Bytes {
    let mut embeddings: Vec<GeminiEmbedding> =
        request.vectors(scripted).into_iter().map(|values| GeminiEmbedding { values }).collect();
    let body = match (batch, embeddings.pop()) {
        (false, Some(embedding)) if embeddings.is_empty() => {
            serde_json::to_vec(&GeminiOne { embedding })
        }
        (_, last) => {
            embeddings.extend(last);
            serde_json::to_vec(&GeminiBatch { embeddings })
        }
    };
    Bytes::from(body.unwrap_or_default())
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn a_vector_is_the_same_for_the_same_model_and_input_and_unit_length() {
        let a = vector("m", "hello", 8);
        assert_eq!(a, vector("m", "hello", 8));
        assert_ne!(a, vector("n", "hello", 8));
        assert_ne!(a, vector("m", "hellO", 8));
        let norm: f32 = a.iter().map(|v| v * v).sum();
        assert!((norm - 1.0).abs() < 1e-5, "{norm}");
    }

    #[test]
    fn openai_input_in_every_form_and_dimensions_asked() {
        let r = parse_openai(br#"{"model":"e","input":["a b","c"],"dimensions":4}"#).unwrap();
        assert_eq!((r.inputs.len(), r.prompt_tokens, r.dimensions), (2, 3, Some(4)));
        let body: serde_json::Value = serde_json::from_slice(&openai_body(&r, None)).unwrap();
        assert_eq!(body["data"][1]["embedding"].as_array().unwrap().len(), 4);
        assert_eq!(body["usage"]["prompt_tokens"], 3);
        let r = parse_openai(br#"{"model":"e","input":[[1,2],[3]]}"#).unwrap();
        assert_eq!(r.inputs, ["1 2", "3"]);
        let one = parse_openai(br#"{"model":"e","input":"x"}"#).unwrap();
        let body: serde_json::Value = serde_json::from_slice(&openai_body(&one, Some(5))).unwrap();
        assert_eq!(body["data"][0]["embedding"].as_array().unwrap().len(), 5);
        assert_eq!(parse_openai(br#"{"model":"e","input":[]}"#).unwrap_err().param, Some("input"));
    }

    #[test]
    fn gemini_one_and_batch() {
        assert_eq!(gemini_route("/v1beta/models/g:embedContent"), Some(("g".into(), false)));
        assert_eq!(gemini_route("/v1beta/models/g:batchEmbedContents"), Some(("g".into(), true)));
        assert_eq!(gemini_route("/v1beta/models/g:generateContent"), None);
        let one = parse_gemini(
            "g",
            false,
            br#"{"content":{"parts":[{"text":"hi"}]},"outputDimensionality":3}"#,
        )
        .unwrap();
        let body: serde_json::Value =
            serde_json::from_slice(&gemini_body(&one, false, None)).unwrap();
        assert_eq!(body["embedding"]["values"].as_array().unwrap().len(), 3);
        let two = parse_gemini("g", true, br#"{"requests":[{"model":"models/g","content":{"parts":[{"text":"a"}]}},{"model":"models/g","content":{"parts":[{"text":"b"}]}}]}"#).unwrap();
        let body: serde_json::Value =
            serde_json::from_slice(&gemini_body(&two, true, None)).unwrap();
        assert_eq!(body["embeddings"].as_array().unwrap().len(), 2);
        assert_eq!(body["embeddings"][0]["values"].as_array().unwrap().len(), 8);
    }
}
