//! The `/v1/embeddings` surface's request and answer (OpenAI's embeddings API,
//! docs/http-api.md, "`POST /v1/embeddings`"): the body read and checked, each refusal naming
//! its field, before any upstream call; and the answer's vectors put in the encoding the
//! client asked for.
//!
//! Below the providers: each adapter reads [`Embeddings`] to build its upstream call, and an
//! adapter that translates (Gemini) builds the OpenAI list shape with [`List`].

use std::borrow::Cow;

use base64::Engine as _;
use serde::{Deserialize, Serialize};
use serde_json::value::RawValue;

use switchyard_catalog::{Model, ProviderKind};

use crate::error::ApiError;

/// The most inputs one OpenAI (or Azure OpenAI, or OpenAI-compatible) embeddings call takes,
/// as OpenAI documents it for `input`.
pub const OPENAI_MAX_INPUTS: usize = 2048;
/// The most requests one Gemini `batchEmbedContents` call takes.
pub const GEMINI_MAX_INPUTS: usize = 100;

/// What an embeddings request asks, read from its body.
#[derive(Clone, Debug, PartialEq)]
pub struct Embeddings {
    pub input: Input,
    /// The length the client wants its vectors cut to.
    pub dimensions: Option<u32>,
    /// The client asked for base64 (little-endian `f32`s) rather than arrays of floats.
    pub base64: bool,
}

/// `input`: text, or token ids (which only OpenAI-format providers take).
#[derive(Clone, Debug, PartialEq)]
pub enum Input {
    /// A string (one input) or a list of strings.
    Text(Vec<String>),
    /// A token array (one input) or a list of token arrays.
    Tokens(Vec<Vec<u32>>),
}

impl Input {
    /// How many vectors the answer holds.
    pub fn len(&self) -> usize {
        match self {
            Self::Text(texts) => texts.len(),
            Self::Tokens(tokens) => tokens.len(),
        }
    }

    pub fn is_empty(&self) -> bool {
        self.len() == 0
    }

    /// The input's tokens: counted for token arrays, estimated for text (a token per four
    /// bytes, the usual rule for English), for providers whose answer carries no count.
    pub fn estimated_tokens(&self) -> u64 {
        match self {
            Self::Text(texts) => texts.iter().map(|t| t.len().div_ceil(4) as u64).sum(),
            Self::Tokens(tokens) => tokens.iter().map(|t| t.len() as u64).sum(),
        }
    }
}

/// The fields an embeddings body may carry: OpenAI's, then the gateway's own chain fields
/// (read again, with the chat surface's rules, by [`crate::request::ChatRequest`]).
/// Anything else is refused by name: a misspelt `dimension` must not pass unnoticed.
#[derive(Deserialize)]
#[serde(deny_unknown_fields)]
struct Body<'a> {
    #[serde(borrow, default)]
    input: Option<&'a RawValue>,
    #[serde(borrow, default)]
    dimensions: Option<&'a RawValue>,
    #[serde(borrow, default)]
    encoding_format: Option<&'a RawValue>,
    #[serde(borrow, default)]
    user: Option<&'a RawValue>,
    #[serde(borrow, default, rename = "model")]
    _model: Option<&'a RawValue>,
    #[serde(borrow, default, rename = "models")]
    _models: Option<&'a RawValue>,
    #[serde(borrow, default, rename = "fallback_models")]
    _fallback_models: Option<&'a RawValue>,
    #[serde(borrow, default, rename = "redundancy")]
    _redundancy: Option<&'a RawValue>,
}

/// One element of a list `input`: a string or a token array.
#[derive(Deserialize)]
#[serde(untagged)]
enum Item<'a> {
    #[serde(borrow)]
    Text(Cow<'a, str>),
    Token(u32),
    Tokens(Vec<u32>),
}

const INPUT_SHAPE: &str = "input must be a string, an array of strings, an array of token ids, or an array of token-id arrays";

impl Embeddings {
    /// Reads an embeddings body; each refusal names the field in OpenAI's terms.
    pub fn parse(body: &[u8]) -> Result<Self, ApiError> {
        let fields: Body<'_> = serde_json::from_slice(body).map_err(|e| {
            let message = e.to_string();
            // serde names an unknown field `unknown field `x`, expected one of …`.
            match message.strip_prefix("unknown field `").and_then(|r| r.split_once('`')) {
                Some((name, _)) => ApiError::invalid(
                    name,
                    format!("`{name}` is not a field of an embeddings request (OpenAI's: model, input, dimensions, encoding_format, user; the gateway's: models, fallback_models, redundancy)"),
                ),
                None => ApiError::invalid(
                    "body",
                    format!("We could not parse the JSON body of your request ({message}). The body must be a JSON object."),
                ),
            }
        })?;
        let input = input(fields.input)?;
        let dimensions = match fields.dimensions.map(|raw| raw.get()) {
            None | Some("null") => None,
            Some(raw) => match serde_json::from_str::<i64>(raw) {
                Ok(n) if n > 0 => Some(u32::try_from(n).map_err(|_| {
                    ApiError::invalid("dimensions", format!("dimensions is {n}: too large"))
                })?),
                _ => {
                    return Err(ApiError::invalid(
                        "dimensions",
                        format!("dimensions must be a positive integer, got {raw}"),
                    ));
                }
            },
        };
        let base64 = match fields.encoding_format.map(|raw| raw.get()) {
            None | Some("null") | Some("\"float\"") => false,
            Some("\"base64\"") => true,
            Some(other) => {
                return Err(ApiError::invalid(
                    "encoding_format",
                    format!("encoding_format must be \"float\" or \"base64\", got {other}"),
                ));
            }
        };
        if let Some(user) = fields.user
            && serde_json::from_str::<Option<String>>(user.get()).is_err()
        {
            return Err(ApiError::invalid("user", "user must be a string"));
        }
        Ok(Self { input, dimensions, base64 })
    }

    /// Whether `model` (served by a provider of `kind`) can take this request: its
    /// `dimensions` within the model's, its token arrays (OpenAI formats only), its batch
    /// within the provider's (refused, not split: one request is one upstream call, and one
    /// failover decision). `param` names the chain entry.
    pub fn check(&self, model: &Model, kind: ProviderKind, param: &str) -> Result<(), ApiError> {
        if let (Some(asked), Some(has)) = (self.dimensions, model.dimensions)
            && asked > has
        {
            return Err(ApiError::invalid(
                "dimensions",
                format!(
                    "dimensions is {asked}, but the model `{}` makes vectors of {has}: ask for at most {has}",
                    model.name
                ),
            ));
        }
        let most = match kind {
            ProviderKind::Gemini => {
                if matches!(self.input, Input::Tokens(_)) {
                    return Err(ApiError::invalid(
                        "input",
                        format!(
                            "the model `{}` (a Gemini model) takes text only: send input as strings, not token ids",
                            model.name
                        ),
                    ));
                }
                GEMINI_MAX_INPUTS
            }
            ProviderKind::Openai | ProviderKind::AzureOpenai | ProviderKind::OpenaiCompatible => {
                OPENAI_MAX_INPUTS
            }
            ProviderKind::Anthropic => {
                return Err(ApiError::invalid(
                    param,
                    format!(
                        "The model `{}` is served by an Anthropic provider, which has no embeddings API.",
                        model.name
                    ),
                ));
            }
        };
        if self.input.len() > most {
            return Err(ApiError::invalid(
                "input",
                format!(
                    "input holds {} items; the model `{}` takes at most {most} in one request: send them in several requests",
                    self.input.len(),
                    model.name
                ),
            ));
        }
        Ok(())
    }
}

fn input(raw: Option<&RawValue>) -> Result<Input, ApiError> {
    let Some(raw) = raw.filter(|r| r.get() != "null") else {
        return Err(ApiError::invalid("input", "input is required"));
    };
    if let Ok(text) = serde_json::from_str::<Cow<'_, str>>(raw.get()) {
        if text.is_empty() {
            return Err(ApiError::invalid("input", "input must not be an empty string"));
        }
        return Ok(Input::Text(vec![text.into_owned()]));
    }
    let items: Vec<Item<'_>> = serde_json::from_str(raw.get())
        .map_err(|_| ApiError::invalid("input", INPUT_SHAPE.to_owned()))?;
    if items.is_empty() {
        return Err(ApiError::invalid("input", "input must not be an empty array"));
    }
    match &items[0] {
        Item::Text(_) => {
            let mut texts = Vec::with_capacity(items.len());
            for (i, item) in items.into_iter().enumerate() {
                match item {
                    Item::Text(t) if t.is_empty() => {
                        return Err(ApiError::invalid(
                            format!("input[{i}]"),
                            format!("input[{i}] is an empty string"),
                        ));
                    }
                    Item::Text(t) => texts.push(t.into_owned()),
                    _ => return Err(mixed(i)),
                }
            }
            Ok(Input::Text(texts))
        }
        Item::Token(_) => {
            let mut tokens = Vec::with_capacity(items.len());
            for (i, item) in items.into_iter().enumerate() {
                match item {
                    Item::Token(t) => tokens.push(t),
                    _ => return Err(mixed(i)),
                }
            }
            Ok(Input::Tokens(vec![tokens]))
        }
        Item::Tokens(_) => {
            let mut lists = Vec::with_capacity(items.len());
            for (i, item) in items.into_iter().enumerate() {
                match item {
                    Item::Tokens(t) if t.is_empty() => {
                        return Err(ApiError::invalid(
                            format!("input[{i}]"),
                            format!("input[{i}] is an empty token array"),
                        ));
                    }
                    Item::Tokens(t) => lists.push(t),
                    _ => return Err(mixed(i)),
                }
            }
            Ok(Input::Tokens(lists))
        }
    }
}

fn mixed(i: usize) -> ApiError {
    ApiError::invalid(
        format!("input[{i}]"),
        format!("input[{i}] is not like input[0]: {INPUT_SHAPE}, not a mix"),
    )
}

// === The answer ===

/// OpenAI's embeddings answer, as an adapter that translates builds it and as the node reads
/// it back to change the vectors' encoding.
#[derive(Debug, Serialize, Deserialize)]
pub struct List<'a> {
    pub object: Cow<'a, str>,
    pub data: Vec<Datum<'a>>,
    #[serde(borrow, default, skip_serializing_if = "Option::is_none")]
    pub model: Option<Cow<'a, str>>,
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub usage: Option<ListUsage>,
}

#[derive(Debug, Serialize, Deserialize)]
pub struct Datum<'a> {
    pub object: Cow<'a, str>,
    pub index: u32,
    #[serde(borrow)]
    pub embedding: Vector<'a>,
}

/// A vector as floats, or as base64 of little-endian `f32`s (OpenAI's `encoding_format`).
#[derive(Debug, Serialize, Deserialize)]
#[serde(untagged)]
pub enum Vector<'a> {
    Floats(Vec<f32>),
    #[serde(borrow)]
    Base64(Cow<'a, str>),
}

#[derive(Clone, Copy, Debug, Default, Serialize, Deserialize)]
pub struct ListUsage {
    #[serde(default)]
    pub prompt_tokens: u64,
    #[serde(default)]
    pub total_tokens: u64,
}

impl<'a> List<'a> {
    /// An answer of these vectors, in order, as floats or (`base64`) in OpenAI's base64.
    pub fn of(vectors: Vec<Vec<f32>>, base64: bool, model: &'a str, prompt_tokens: u64) -> Self {
        let data = vectors
            .into_iter()
            .enumerate()
            .map(|(i, values)| Datum {
                object: Cow::Borrowed("embedding"),
                index: i as u32,
                embedding: match base64 {
                    true => Vector::Base64(Cow::Owned(encode(&values))),
                    false => Vector::Floats(values),
                },
            })
            .collect();
        Self {
            object: Cow::Borrowed("list"),
            data,
            model: Some(Cow::Borrowed(model)),
            usage: Some(ListUsage { prompt_tokens, total_tokens: prompt_tokens }),
        }
    }
}

/// The `data` of an answer whose vectors are not yet in the encoding the client asked for:
/// floats made base64 of little-endian `f32`s (as OpenAI encodes them), or base64 made floats.
/// `None` when every vector already is (the answer then passes as it came).
pub fn reencoded(data: &RawValue, base64: bool) -> Result<Option<Box<RawValue>>, String> {
    let mut data: Vec<Datum<'_>> =
        serde_json::from_str(data.get()).map_err(|e| format!("`data`: {e}"))?;
    let mut changed = false;
    for datum in &mut data {
        let vector = match (&datum.embedding, base64) {
            (Vector::Floats(floats), true) => Vector::Base64(Cow::Owned(encode(floats))),
            (Vector::Base64(text), false) => Vector::Floats(decode(text)?),
            _ => continue,
        };
        datum.embedding = vector;
        changed = true;
    }
    if !changed {
        return Ok(None);
    }
    serde_json::value::to_raw_value(&data).map(Some).map_err(|e| e.to_string())
}

fn encode(floats: &[f32]) -> String {
    let bytes: Vec<u8> = floats.iter().flat_map(|f| f.to_le_bytes()).collect();
    base64::engine::general_purpose::STANDARD.encode(bytes)
}

fn decode(text: &str) -> Result<Vec<f32>, String> {
    let bytes = base64::engine::general_purpose::STANDARD
        .decode(text)
        .map_err(|e| format!("a base64 vector: {e}"))?;
    if bytes.len() % 4 != 0 {
        return Err(format!("a base64 vector of {} bytes is not whole f32s", bytes.len()));
    }
    Ok(bytes.chunks_exact(4).map(|c| f32::from_le_bytes([c[0], c[1], c[2], c[3]])).collect())
}

#[cfg(test)]
mod tests {
    use super::*;

    fn param(body: &str) -> String {
        match Embeddings::parse(body.as_bytes()) {
            Err(ApiError::InvalidRequest { param: Some(p), .. }) => p,
            other => panic!("{body}: {other:?}"),
        }
    }

    #[test]
    fn input_is_a_string_a_list_of_strings_or_token_arrays() {
        let read = |input: &str| {
            Embeddings::parse(format!(r#"{{"model":"e","input":{input}}}"#).as_bytes())
                .unwrap()
                .input
        };
        assert_eq!(read(r#""hi""#), Input::Text(vec!["hi".into()]));
        assert_eq!(read(r#"["a","b\u00e9"]"#), Input::Text(vec!["a".into(), "bé".into()]));
        assert_eq!(read("[1,2,3]"), Input::Tokens(vec![vec![1, 2, 3]]));
        assert_eq!(read("[[1],[2,3]]"), Input::Tokens(vec![vec![1], vec![2, 3]]));
    }

    #[test]
    fn bad_input_is_refused_naming_the_field_or_the_item() {
        assert_eq!(param(r#"{"model":"e"}"#), "input");
        assert_eq!(param(r#"{"model":"e","input":""}"#), "input");
        assert_eq!(param(r#"{"model":"e","input":[]}"#), "input");
        assert_eq!(param(r#"{"model":"e","input":["a","b","c",""]}"#), "input[3]");
        assert_eq!(param(r#"{"model":"e","input":[[1],[]]}"#), "input[1]");
        assert_eq!(param(r#"{"model":"e","input":["a",1]}"#), "input[1]");
        assert_eq!(param(r#"{"model":"e","input":{"text":"a"}}"#), "input");
        assert_eq!(param(r#"{"model":"e","input":[-1]}"#), "input");
    }

    #[test]
    fn dimensions_encoding_and_unknown_fields_are_refused_by_name() {
        for bad in ["0", "-3", "1.5", "\"8\""] {
            assert_eq!(param(&format!(r#"{{"input":"a","dimensions":{bad}}}"#)), "dimensions");
        }
        assert_eq!(param(r#"{"input":"a","encoding_format":"int8"}"#), "encoding_format");
        assert_eq!(param(r#"{"input":"a","dimension":8}"#), "dimension");
        assert_eq!(param(r#"{"input":"a","user":7}"#), "user");
        let ok = Embeddings::parse(
            br#"{"model":"e","input":"a","dimensions":8,"encoding_format":"base64","user":"u","fallback_models":["f"]}"#,
        )
        .unwrap();
        assert_eq!((ok.dimensions, ok.base64), (Some(8), true));
    }

    fn model(dimensions: u32) -> Model {
        serde_json::from_value(serde_json::json!({"name": "g/e", "provider": "g",
            "upstream_model": "e", "type": "embedding", "dimensions": dimensions}))
        .unwrap()
    }

    #[test]
    fn a_provider_refuses_what_it_cannot_take_before_any_call() {
        let tokens = Embeddings::parse(br#"{"input":[1,2]}"#).unwrap();
        let e = tokens.check(&model(8), ProviderKind::Gemini, "model").unwrap_err();
        assert!(matches!(&e, ApiError::InvalidRequest { param: Some(p), .. } if p == "input"));
        assert!(tokens.check(&model(8), ProviderKind::Openai, "model").is_ok());
        let many = Embeddings {
            input: Input::Text(vec!["x".into(); GEMINI_MAX_INPUTS + 1]),
            dimensions: None,
            base64: false,
        };
        assert!(many.check(&model(8), ProviderKind::Gemini, "model").is_err());
        assert!(many.check(&model(8), ProviderKind::OpenaiCompatible, "model").is_ok());
        let wide = Embeddings { dimensions: Some(9), ..many };
        let e = wide.check(&model(8), ProviderKind::Openai, "model").unwrap_err();
        assert!(matches!(&e, ApiError::InvalidRequest { param: Some(p), .. } if p == "dimensions"));
    }

    #[test]
    fn floats_become_little_endian_f32_base64_and_back() {
        let data = serde_json::value::to_raw_value(&serde_json::json!([
            {"object": "embedding", "index": 0, "embedding": [1.0, -0.5]}
        ]))
        .unwrap();
        let encoded = reencoded(&data, true).unwrap().unwrap();
        let items: Vec<Datum<'_>> = serde_json::from_str(encoded.get()).unwrap();
        let Vector::Base64(text) = &items[0].embedding else { panic!("{encoded}") };
        // 1.0f32 = 00 00 80 3f, -0.5f32 = 00 00 00 bf
        assert_eq!(text, "AACAPwAAAL8=");
        assert!(reencoded(&encoded, true).unwrap().is_none(), "already base64");
        let back = reencoded(&encoded, false).unwrap().unwrap();
        let items: Vec<Datum<'_>> = serde_json::from_str(back.get()).unwrap();
        assert!(matches!(&items[0].embedding, Vector::Floats(f) if f == &[1.0, -0.5]));
    }
}
