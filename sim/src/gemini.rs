//! Google's Gemini API wire format (Generative Language API `v1beta`): the request fields the
//! simulator reads, `GenerateContentResponse` bodies and SSE chunks, and Google's error bodies.
//!
//! Endpoints: `POST /v1beta/models/{model}:generateContent` and
//! `POST /v1beta/models/{model}:streamGenerateContent?alt=sse`; the model is in the path, the
//! key in `x-goog-api-key` (or `?key=`).
//!
//! Shapes follow what generativelanguage.googleapis.com sends:
//! - responses: the Gemini API reference ("GenerateContentResponse") and googleapis/js-genai
//!   `test/unit/models_test.ts`: `candidates[{content{parts, role: "model"}, finishReason,
//!   index}]`, `usageMetadata{promptTokenCount, candidatesTokenCount, totalTokenCount}`,
//!   `modelVersion`, `responseId`.
//! - streams: a recorded `alt=sse` stream (GeneralBots/gb `out.txt`): one whole
//!   GenerateContentResponse per `data:` frame, text chunks without `finishReason`, then a
//!   chunk with an empty text part, `finishReason: "STOP"` and the full usage. No `[DONE]`:
//!   the stream ends with the body.
//! - errors: `{"error": {"code", "message", "status", "details"}}`, status names and HTTP
//!   codes per the Gemini API "Troubleshooting" table; texts cited at [`status_error`].
//!
//! Function calling: a request that declares functions (and does not set mode `NONE`) while
//! its last turn is not a function response is answered with a call of its first allowed
//! function, arguments filled in from the declared required parameters — a model that always
//! uses the tool it is given, so tests can follow the whole tool loop.

use bytes::Bytes;
use serde::Deserialize;
use serde_json::{Map, Value, json};

use crate::openai::tokens;
use crate::stream::StreamWire;

/// `(model, stream)` for a Gemini endpoint path.
pub fn route(path: &str) -> Option<(String, bool)> {
    let rest = path.strip_prefix("/v1beta/models/")?;
    let (model, method) = rest.rsplit_once(':')?;
    let stream = match method {
        "generateContent" => false,
        "streamGenerateContent" => true,
        _ => return None,
    };
    (!model.is_empty()).then(|| (model.to_owned(), stream))
}

// === Requests ===

/// The parts of a generateContent request the simulator acts on.
#[derive(Debug, Clone, PartialEq)]
pub struct GenerateRequest {
    pub model: String,
    pub stream: bool,
    /// Whitespace-separated words in every text part (the simulator's tokenizer).
    pub prompt_tokens: u64,
    /// The function the simulated model calls, if the request offers one (module docs).
    pub call: Option<FunctionCall>,
    /// The text of a last content with role `model`: the start of the answer the model is
    /// to continue (a prefill).
    pub prefill: Option<String>,
}

#[derive(Debug, Clone, PartialEq)]
pub struct FunctionCall {
    pub name: String,
    pub args: Value,
}

#[derive(Deserialize)]
#[serde(rename_all = "camelCase")]
struct RawRequest {
    #[serde(default)]
    contents: Option<Vec<RawContent>>,
    #[serde(default)]
    system_instruction: Option<RawContent>,
    #[serde(default)]
    tools: Vec<RawTool>,
    #[serde(default)]
    tool_config: Option<Value>,
}

#[derive(Deserialize)]
struct RawContent {
    #[serde(default)]
    role: Option<String>,
    #[serde(default)]
    parts: Vec<Value>,
}

#[derive(Deserialize)]
#[serde(rename_all = "camelCase")]
struct RawTool {
    #[serde(default)]
    function_declarations: Vec<Value>,
}

/// Parses a generateContent body, rejecting it the way Google does.
pub fn parse_request(model: &str, stream: bool, body: &[u8]) -> Result<GenerateRequest, ApiError> {
    let raw: RawRequest = serde_json::from_slice(body).map_err(|_| {
        ApiError::new(400, "Invalid JSON payload received. Unexpected token.".to_owned())
    })?;
    let Some(contents) = raw.contents.filter(|c| !c.is_empty()) else {
        return Err(ApiError::new(
            400,
            "* GenerateContentRequest.contents: contents is not specified\n".to_owned(),
        ));
    };
    let words = |c: &RawContent| -> u64 {
        c.parts.iter().filter_map(|p| p.get("text").and_then(Value::as_str)).map(tokens).sum()
    };
    let prompt_tokens =
        contents.iter().map(words).sum::<u64>() + raw.system_instruction.as_ref().map_or(0, words);
    let answered = contents
        .last()
        .is_some_and(|c| c.parts.iter().any(|p| p.get("functionResponse").is_some()));
    let call = if answered { None } else { function_call(&raw.tools, raw.tool_config.as_ref()) };
    let prefill = contents
        .last()
        .filter(|c| c.role.as_deref() == Some("model"))
        .map(|c| c.parts.iter().filter_map(|p| p.get("text").and_then(Value::as_str)).collect());
    Ok(GenerateRequest { model: model.to_owned(), stream, prompt_tokens, call, prefill })
}

fn function_call(tools: &[RawTool], config: Option<&Value>) -> Option<FunctionCall> {
    let config = config.and_then(|c| c.get("functionCallingConfig"));
    if config.and_then(|c| c.get("mode")).and_then(Value::as_str) == Some("NONE") {
        return None;
    }
    let allowed = config
        .and_then(|c| c.get("allowedFunctionNames"))
        .and_then(Value::as_array)
        .and_then(|names| names.first())
        .and_then(Value::as_str);
    let declarations = tools.iter().flat_map(|t| t.function_declarations.iter());
    let declaration = declarations
        .filter(|d| d.get("name").and_then(Value::as_str).is_some())
        .find(|d| allowed.is_none_or(|a| d.get("name").and_then(Value::as_str) == Some(a)))?;
    let name = declaration.get("name").and_then(Value::as_str)?.to_owned();
    let parameters = declaration.get("parameters");
    let properties = parameters.and_then(|p| p.get("properties")).and_then(Value::as_object);
    let mut args = Map::new();
    for required in parameters
        .and_then(|p| p.get("required"))
        .and_then(Value::as_array)
        .into_iter()
        .flatten()
        .filter_map(Value::as_str)
    {
        let kind = properties
            .and_then(|p| p.get(required))
            .and_then(|s| s.get("type"))
            .and_then(Value::as_str)
            .unwrap_or("STRING");
        let value = match kind.to_ascii_uppercase().as_str() {
            "INTEGER" | "NUMBER" => json!(1),
            "BOOLEAN" => json!(true),
            "ARRAY" => json!([]),
            "OBJECT" => json!({}),
            _ => json!("sim"),
        };
        args.insert(required.to_owned(), value);
    }
    Some(FunctionCall { name, args: Value::Object(args) })
}

// === Responses ===

/// Identity shared by a response and all chunks of one stream.
#[derive(Debug, Clone)]
pub struct Response<'a> {
    pub response_id: &'a str,
    pub model: &'a str,
}

fn usage(prompt: u64, candidates: Option<u64>) -> Value {
    let mut usage = json!({
        "promptTokenCount": prompt,
        "totalTokenCount": prompt + candidates.unwrap_or(0),
        "promptTokensDetails": [{"modality": "TEXT", "tokenCount": prompt}],
    });
    if let Some(c) = candidates {
        usage["candidatesTokenCount"] = json!(c);
    }
    usage
}

impl Response<'_> {
    fn envelope(&self, parts: Value, finish: bool, usage: Value) -> Value {
        let mut candidate = json!({"content": {"parts": parts, "role": "model"}, "index": 0});
        if finish {
            candidate["finishReason"] = json!("STOP");
        }
        json!({
            "candidates": [candidate],
            "usageMetadata": usage,
            "modelVersion": self.model,
            "responseId": self.response_id,
        })
    }

    /// The non-streaming body answering with `text`.
    pub fn body(&self, text: &str, prompt_tokens: u64) -> Bytes {
        let body = self.envelope(
            json!([{ "text": text }]),
            true,
            usage(prompt_tokens, Some(tokens(text))),
        );
        Bytes::from(body.to_string())
    }

    /// The non-streaming body answering with a function call.
    pub fn call_body(&self, call: &FunctionCall, prompt_tokens: u64) -> Bytes {
        Bytes::from(self.call_value(call, prompt_tokens).to_string())
    }

    fn call_value(&self, call: &FunctionCall, prompt_tokens: u64) -> Value {
        let part = json!({"functionCall": {"name": call.name, "args": call.args}});
        self.envelope(json!([part]), true, usage(prompt_tokens, Some(1)))
    }

    /// One streamed text piece.
    pub fn chunk(&self, piece: &str, prompt_tokens: u64) -> Bytes {
        sse(&self.envelope(json!([{ "text": piece }]), false, usage(prompt_tokens, None)))
    }

    /// The last frame of a text stream: an empty part, `finishReason` and the full usage.
    pub fn final_chunk(&self, prompt_tokens: u64, completion_tokens: u64) -> Bytes {
        let usage = usage(prompt_tokens, Some(completion_tokens));
        sse(&self.envelope(json!([{ "text": "" }]), true, usage))
    }

    /// A streamed function call: one whole frame (Gemini does not split calls).
    pub fn call_chunk(&self, call: &FunctionCall, prompt_tokens: u64) -> Bytes {
        sse(&self.call_value(call, prompt_tokens))
    }
}

/// Gemini's stream framing: no head, one GenerateContentResponse per piece, and a last
/// chunk with `finishReason` and the usage; the body then just ends.
pub struct ResponseStream {
    pub response_id: String,
    pub model: String,
    pub prompt_tokens: u64,
}

impl ResponseStream {
    pub fn response(&self) -> Response<'_> {
        Response { response_id: &self.response_id, model: &self.model }
    }
}

impl StreamWire for ResponseStream {
    fn head(&self) -> Vec<Bytes> {
        Vec::new()
    }

    fn content(&self, piece: &str) -> Bytes {
        self.response().chunk(piece, self.prompt_tokens)
    }

    fn error(&self, message: &str) -> Bytes {
        error_frame(message)
    }

    fn bad_frame(&self) -> Bytes {
        Bytes::from_static(MALFORMED_FRAME)
    }

    /// Gemini's stream has no end marker: the body ends after the last chunk either way.
    fn tail(&self, text: &str, _marker: bool) -> Vec<Bytes> {
        vec![self.response().final_chunk(self.prompt_tokens, tokens(text))]
    }
}

/// The in-band error frame of a stream that fails after it started.
pub fn error_frame(message: &str) -> Bytes {
    let err = ApiError::new(500, message.to_owned());
    let mut out = b"data: ".to_vec();
    out.extend_from_slice(&err.body());
    out.extend_from_slice(b"\r\n\r\n");
    Bytes::from(out)
}

/// A `200` body that is not JSON.
pub const MALFORMED_BODY: &[u8] = b"{\"candidates\": [{\"content\": {\"parts\": [{\"text\": \"Hel";

/// A stream frame whose data is not JSON.
pub const MALFORMED_FRAME: &[u8] = b"data: {\"candidates\": [{\"content\": {\"parts\": [\r\n\r\n";

/// Google frames SSE events with CRLF.
fn sse(value: &Value) -> Bytes {
    Bytes::from(format!("data: {value}\r\n\r\n"))
}

// === Errors ===

/// An error response: HTTP status, Google's error body, and an optional `retry-after`.
#[derive(Debug, Clone, PartialEq)]
pub struct ApiError {
    pub status: u16,
    pub message: String,
    pub details: Vec<Value>,
    pub retry_after: Option<u64>,
}

impl ApiError {
    pub fn new(status: u16, message: String) -> Self {
        ApiError { status, message, details: Vec::new(), retry_after: None }
    }

    /// The canonical status name Google pairs with an HTTP status.
    pub fn google_status(&self) -> &'static str {
        match self.status {
            400 => "INVALID_ARGUMENT",
            401 => "UNAUTHENTICATED",
            403 => "PERMISSION_DENIED",
            404 => "NOT_FOUND",
            409 => "ABORTED",
            429 => "RESOURCE_EXHAUSTED",
            499 => "CANCELLED",
            501 => "NOT_IMPLEMENTED",
            503 => "UNAVAILABLE",
            504 => "DEADLINE_EXCEEDED",
            s if s >= 500 => "INTERNAL",
            _ => "FAILED_PRECONDITION",
        }
    }

    pub fn body(&self) -> Bytes {
        let mut error = json!({
            "code": self.status,
            "message": self.message,
            "status": self.google_status(),
        });
        if !self.details.is_empty() {
            error["details"] = Value::Array(self.details.clone());
        }
        Bytes::from(json!({ "error": error }).to_string())
    }

    /// A prompt longer than the model's context: Google's 400 INVALID_ARGUMENT, worded as
    /// generativelanguage.googleapis.com words it.
    pub fn context_length(window: u64, prompt_tokens: u64) -> Self {
        ApiError::new(
            400,
            format!(
                "The input token count ({prompt_tokens}) exceeds the maximum number of tokens \
                 allowed ({window})."
            ),
        )
    }

    /// A model that takes no trailing `model` turn as the start of its answer: Google's 400
    /// INVALID_ARGUMENT for a conversation that does not end with a user turn.
    pub fn prefill_unsupported() -> Self {
        ApiError::new(
            400,
            "Please ensure that the conversation ends with a user turn: this model does not \
             continue a model turn."
                .to_owned(),
        )
    }

    /// No key at all (Google's answer to an unauthenticated call).
    pub fn missing_key() -> Self {
        ApiError::new(
            403,
            "Method doesn't allow unregistered callers (callers without established identity). \
             Please use API Key or other form of API consumer identity to call this API."
                .to_owned(),
        )
    }

    /// A path or method Google does not serve (its JSON APIs answer an unknown method with
    /// `NOT_FOUND` in the usual envelope).
    pub fn not_found(method: &str, path: &str) -> Self {
        ApiError::new(404, format!("Method not found: {method} {path}"))
    }

    /// A key the simulator does not accept: Google answers 400 with reason API_KEY_INVALID
    /// (the body quoted in Google's error docs for the generateContent API).
    pub fn invalid_key() -> Self {
        let message = "API key not valid. Please pass a valid API key.";
        let mut err = ApiError::new(400, message.to_owned());
        err.details = vec![
            json!({"@type": "type.googleapis.com/google.rpc.ErrorInfo", "reason": "API_KEY_INVALID",
                   "domain": "googleapis.com",
                   "metadata": {"service": "generativelanguage.googleapis.com"}}),
            json!({"@type": "type.googleapis.com/google.rpc.LocalizedMessage", "locale": "en-US",
                   "message": message}),
        ];
        err
    }
}

/// The real error for a scripted `status`: the body Gemini sends for it.
///
/// Sources (messages as generativelanguage.googleapis.com sends them, quoted in public
/// reports and SDK tests; status names per ai.google.dev/gemini-api/docs/troubleshooting):
/// - 400 INVALID_ARGUMENT: "Request contains an invalid argument."
/// - 403 PERMISSION_DENIED: "The caller does not have permission".
/// - 404 NOT_FOUND: "models/… is not found for API version v1beta, or is not supported for
///   generateContent. Call ListModels to see the list of available models and their
///   supported methods."
/// - 429 RESOURCE_EXHAUSTED: "You exceeded your current quota, please check your plan and
///   billing details. …", with QuotaFailure and RetryInfo details.
/// - 500 INTERNAL: "An internal error has occurred. Please retry or report in
///   `https://developers.generativeai.google/guide/troubleshooting`".
/// - 503 UNAVAILABLE: "The model is overloaded. Please try again later."
/// - 504 DEADLINE_EXCEEDED: "The request timed out. Please try again."
pub fn status_error(
    status: u16,
    model: &str,
    message: Option<&str>,
    retry_after: Option<u64>,
) -> ApiError {
    let text = match status {
        400 => "Request contains an invalid argument.".to_owned(),
        401 => "Request had invalid authentication credentials. Expected OAuth 2 access token, \
                login cookie or other valid authentication credential."
            .to_owned(),
        403 => "The caller does not have permission".to_owned(),
        404 => format!(
            "models/{model} is not found for API version v1beta, or is not supported for \
             generateContent. Call ListModels to see the list of available models and their \
             supported methods."
        ),
        429 => "You exceeded your current quota, please check your plan and billing details. \
                For more information on this error, head to: \
                https://ai.google.dev/gemini-api/docs/rate-limits."
            .to_owned(),
        500 => "An internal error has occurred. Please retry or report in \
                https://developers.generativeai.google/guide/troubleshooting"
            .to_owned(),
        503 => "The model is overloaded. Please try again later.".to_owned(),
        504 => "The request timed out. Please try again.".to_owned(),
        s if s >= 500 => "The service encountered an error.".to_owned(),
        _ => "Precondition check failed.".to_owned(),
    };
    let mut err = ApiError::new(status, message.map_or(text, str::to_owned));
    if status == 429 {
        let wait = retry_after.unwrap_or(1);
        err.details = vec![
            json!({"@type": "type.googleapis.com/google.rpc.QuotaFailure", "violations": [{
                "quotaMetric": "generativelanguage.googleapis.com/generate_content_free_tier_requests",
                "quotaId": "GenerateRequestsPerMinutePerProjectPerModel-FreeTier",
                "quotaDimensions": {"location": "global", "model": model},
                "quotaValue": "10"}]}),
            json!({"@type": "type.googleapis.com/google.rpc.RetryInfo", "retryDelay": format!("{wait}s")}),
        ];
    }
    // Google puts the wait in RetryInfo, not a header; a script may still ask for one.
    err.retry_after = retry_after;
    err
}

#[cfg(test)]
mod tests {
    use super::*;

    fn json(b: &[u8]) -> Value {
        serde_json::from_slice(b).unwrap()
    }

    fn frame(b: &[u8]) -> Value {
        let s = std::str::from_utf8(b).unwrap();
        json(s.strip_prefix("data: ").unwrap().strip_suffix("\r\n\r\n").unwrap().as_bytes())
    }

    const R: Response<'static> = Response { response_id: "resp-1", model: "gemini-sim" };

    #[test]
    fn routes_name_the_model_and_the_method() {
        assert_eq!(
            route("/v1beta/models/gemini-sim:generateContent"),
            Some(("gemini-sim".into(), false))
        );
        assert_eq!(
            route("/v1beta/models/gemini-2.5-flash:streamGenerateContent"),
            Some(("gemini-2.5-flash".into(), true))
        );
        assert_eq!(route("/v1beta/models/x:countTokens"), None);
        assert_eq!(route("/v1/chat/completions"), None);
    }

    #[test]
    fn bodies_and_chunks_have_gemini_shape() {
        let v = json(&R.body("two words", 3));
        assert_eq!(v["candidates"][0]["content"]["role"], "model");
        assert_eq!(v["candidates"][0]["content"]["parts"][0]["text"], "two words");
        assert_eq!(v["candidates"][0]["finishReason"], "STOP");
        assert_eq!(v["usageMetadata"]["candidatesTokenCount"], 2);
        assert_eq!(v["usageMetadata"]["totalTokenCount"], 5);
        let c = frame(&R.chunk("Hi", 3));
        assert!(c["candidates"][0].get("finishReason").is_none());
        let f = frame(&R.final_chunk(3, 2));
        assert_eq!(f["candidates"][0]["finishReason"], "STOP");
        assert_eq!(f["responseId"], "resp-1");
    }

    #[test]
    fn a_request_with_tools_gets_a_function_call() {
        let body = br#"{"contents":[{"role":"user","parts":[{"text":"weather in Paris"}]}],
            "tools":[{"functionDeclarations":[{"name":"get_weather","parameters":{"type":"OBJECT",
              "properties":{"city":{"type":"STRING"},"days":{"type":"INTEGER"}},"required":["city","days"]}}]}]}"#;
        let r = parse_request("m", false, body).unwrap();
        assert_eq!(r.prompt_tokens, 3);
        assert_eq!(
            r.call,
            Some(FunctionCall {
                name: "get_weather".into(),
                args: json!({"city": "sim", "days": 1})
            })
        );
        let v = json(&R.call_body(r.call.as_ref().unwrap(), 3));
        assert_eq!(
            v["candidates"][0]["content"]["parts"][0]["functionCall"]["name"],
            "get_weather"
        );
        let answered = br#"{"contents":[{"role":"user","parts":[{"functionResponse":{"name":"get_weather","response":{}}}]}],
            "tools":[{"functionDeclarations":[{"name":"get_weather"}]}]}"#;
        assert_eq!(parse_request("m", false, answered).unwrap().call, None);
        let none = br#"{"contents":[{"parts":[{"text":"x"}]}],"tools":[{"functionDeclarations":[{"name":"f"}]}],
            "toolConfig":{"functionCallingConfig":{"mode":"NONE"}}}"#;
        assert_eq!(parse_request("m", false, none).unwrap().call, None);
    }

    #[test]
    fn bad_requests_are_refused_like_google() {
        assert_eq!(parse_request("m", false, b"{nope").unwrap_err().status, 400);
        let e = parse_request("m", false, b"{}").unwrap_err();
        assert!(e.message.contains("contents is not specified"));
    }

    #[test]
    fn error_bodies_match_google() {
        let v = json(&status_error(429, "gemini-sim", None, None).body());
        assert_eq!(v["error"]["code"], 429);
        assert_eq!(v["error"]["status"], "RESOURCE_EXHAUSTED");
        assert_eq!(v["error"]["details"][1]["retryDelay"], "1s");
        let v = json(&status_error(503, "m", None, None).body());
        assert_eq!(v["error"]["status"], "UNAVAILABLE");
        assert_eq!(v["error"]["message"], "The model is overloaded. Please try again later.");
        let v = json(&status_error(404, "gemini-x", None, None).body());
        assert!(
            v["error"]["message"].as_str().unwrap().starts_with("models/gemini-x is not found")
        );
        let v = json(&ApiError::invalid_key().body());
        assert_eq!(v["error"]["details"][0]["reason"], "API_KEY_INVALID");
        assert_eq!(ApiError::missing_key().status, 403);
        let v = json(&status_error(500, "m", Some("boom"), None).body());
        assert_eq!(v["error"], json!({"code": 500, "message": "boom", "status": "INTERNAL"}));
    }
}
