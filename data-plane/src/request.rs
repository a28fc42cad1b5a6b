//! The client's chat-completion request: the gateway's own fields parsed and validated
//! (each error names its field), every other field kept as raw JSON and forwarded untouched.

use std::borrow::Cow;
use std::collections::BTreeMap;
use std::sync::OnceLock;

use serde_json::Value;
use serde_json::value::RawValue;

use switchyard_catalog::catalog::MAX_RETRIES;
use switchyard_catalog::keys::{FIRST_TOKEN_TIMEOUT_MS_RANGE, TIMEOUT_MS_RANGE};
use switchyard_catalog::{Degraded, FailoverReason};

use crate::embeddings::Embeddings;
use crate::error::ApiError;
use crate::structured;

pub const DEADLINE_MS_RANGE: (u32, u32) = (1_000, 600_000);

/// Fields that steer the gateway and are not sent upstream.
const GATEWAY_FIELDS: [&str; 4] = ["model", "models", "fallback_models", "redundancy"];

/// Borrows from the request body: the client's fields are forwarded as the bytes it sent,
/// never copied (a prompt can be megabytes).
#[derive(Debug)]
pub struct ChatRequest<'a> {
    /// Every top-level field but the gateway's own, as the client sent it.
    pub passthrough: BTreeMap<FieldName<'a>, &'a RawValue>,
    pub model: Option<String>,
    pub models: Option<Vec<EntrySpec>>,
    pub fallback_models: Option<Vec<EntrySpec>>,
    pub redundancy: Redundancy,
    pub stream: bool,
    pub include_usage: bool,
    /// The request as it arrived on another surface than Chat Completions; `None` on
    /// `/v1/chat/completions`. The fields above are then its translation, which every
    /// provider kind but the surface's own is sent.
    pub native: Option<Native<'a>>,
    /// The fields above are a translation from another surface (`/v1/messages`,
    /// `/v1/responses`): what the client asked for in its own terms, so a field a model
    /// cannot take (`reasoning_effort`) is left out for it rather than refused.
    pub translated: bool,
    /// The body as the client sent it (on `/v1/messages`, its Chat translation).
    body: &'a [u8],
    /// The body read into the translation core, on first use: only adapters that translate
    /// into another format ask for it, so a chain of OpenAI-kind models never pays for it,
    /// and a chain of several translating models reads it once.
    core: OnceLock<Result<switchyard_wire::core::Request, switchyard_wire::Refusal>>,
    /// What an `/v1/embeddings` request asks (docs/http-api.md, "`POST /v1/embeddings`"):
    /// its chain then takes embedding models only, and each adapter makes an embeddings
    /// call. `None` on the chat surfaces.
    pub embeddings: Option<Embeddings>,
}

/// A request as the client sent it on a surface some provider kind speaks itself: a
/// `/v1/messages` request goes to an Anthropic model as it is, with only `model` changed, so
/// nothing Anthropic-only (`cache_control`, `thinking` and its signatures,
/// `context_management`) is lost on the way (docs/messages.md); a `/v1/responses` request
/// likewise to an OpenAI or Azure OpenAI model, built-in tools, reasoning items and all
/// (docs/responses.md).
#[derive(Debug)]
pub struct Native<'a> {
    /// The API the body is written for.
    pub format: Format,
    /// Every top-level field but `model` and the gateway's own, as the client sent it.
    pub fields: BTreeMap<FieldName<'a>, &'a RawValue>,
    /// The client's `anthropic-beta` header, passed to Anthropic providers only.
    pub beta: Option<http::HeaderValue>,
    /// Hints in the request that only Anthropic models take (`cache_control`, …): named in
    /// the answer's `x-dropped-hints` when another kind serves.
    pub hints: Vec<&'static str>,
    /// The request asks for reasoning (`thinking`).
    pub reasoning: bool,
}

/// The API a [`Native`] body is written for.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum Format {
    /// Anthropic's Messages API (`/v1/messages`).
    Messages,
    /// OpenAI's Responses API (`/v1/responses`).
    Responses,
}

impl<'a> Native<'a> {
    /// The fields of a Messages body, borrowed from it.
    pub fn messages(
        body: &'a [u8],
        beta: Option<http::HeaderValue>,
        hints: Vec<&'static str>,
        reasoning: bool,
    ) -> Result<Self, ApiError> {
        let fields = native_fields(body)?;
        Ok(Self { format: Format::Messages, fields, beta, hints, reasoning })
    }

    /// The fields of a Responses body, borrowed from it. What other kinds drop of it is the
    /// surface's to say (`responses::Translated::dropped`).
    pub fn responses(body: &'a [u8]) -> Result<Self, ApiError> {
        let fields = native_fields(body)?;
        Ok(Self {
            format: Format::Responses,
            fields,
            beta: None,
            hints: Vec::new(),
            reasoning: false,
        })
    }

    /// The client's body for `upstream_model`: its fields as sent, `model` the upstream's
    /// name.
    pub fn body(&self, upstream_model: &str) -> Vec<u8> {
        let mut out = Vec::with_capacity(
            64 + self.fields.values().map(|v| v.get().len() + 24).sum::<usize>(),
        );
        out.extend_from_slice(b"{\"model\":");
        // Serialising a &str into a Vec cannot fail.
        let _ = serde_json::to_writer(&mut out, upstream_model);
        for (key, value) in &self.fields {
            out.push(b',');
            let _ = serde_json::to_writer(&mut out, key);
            out.push(b':');
            out.extend_from_slice(value.get().as_bytes());
        }
        out.push(b'}');
        out
    }

    /// The hints dropped when a model of `kind` serves.
    pub fn dropped(
        &self,
        kind: switchyard_catalog::ProviderKind,
        model_reasons: bool,
    ) -> Vec<&'static str> {
        if kind == switchyard_catalog::ProviderKind::Anthropic {
            return Vec::new();
        }
        let mut dropped = self.hints.clone();
        if self.reasoning && !model_reasons {
            dropped.push("thinking");
        }
        if self.beta.is_some() {
            dropped.push("anthropic-beta");
        }
        dropped
    }
}

/// A body's top-level fields but `model` and the gateway's own, borrowed from it.
fn native_fields(body: &[u8]) -> Result<BTreeMap<FieldName<'_>, &RawValue>, ApiError> {
    let mut fields = serde_json::from_slice::<BorrowedKeys<'_>>(body)
        .map(|f| f.0)
        .map_err(|e| ApiError::invalid("body", format!("the body is not a JSON object ({e})")))?;
    for name in GATEWAY_FIELDS {
        fields.remove(name);
    }
    Ok(fields)
}

/// A top-level field name, borrowed from the body unless it has escapes (a JSON object key
/// may legally be written `"\u006dodel"`), so parsing a request allocates no key strings.
pub type FieldName<'a> = Cow<'a, str>;

/// Deserializes a [`FieldName`], borrowing when the input allows it (serde's own `Cow`
/// impl always copies).
struct BorrowedKeys<'a>(BTreeMap<FieldName<'a>, &'a RawValue>);

impl<'de> serde::Deserialize<'de> for BorrowedKeys<'de> {
    fn deserialize<D: serde::Deserializer<'de>>(d: D) -> Result<Self, D::Error> {
        struct Fields;
        impl<'de> serde::de::Visitor<'de> for Fields {
            type Value = BorrowedKeys<'de>;
            fn expecting(&self, f: &mut std::fmt::Formatter) -> std::fmt::Result {
                f.write_str("a JSON object")
            }
            fn visit_map<A: serde::de::MapAccess<'de>>(
                self,
                mut map: A,
            ) -> Result<Self::Value, A::Error> {
                let mut out = BTreeMap::new();
                while let Some(Key(key)) = map.next_key()? {
                    out.insert(key, map.next_value()?);
                }
                Ok(BorrowedKeys(out))
            }
        }
        d.deserialize_map(Fields)
    }
}

struct Key<'a>(FieldName<'a>);

impl<'de> serde::Deserialize<'de> for Key<'de> {
    fn deserialize<D: serde::Deserializer<'de>>(d: D) -> Result<Self, D::Error> {
        struct Name;
        impl<'de> serde::de::Visitor<'de> for Name {
            type Value = Key<'de>;
            fn expecting(&self, f: &mut std::fmt::Formatter) -> std::fmt::Result {
                f.write_str("a field name")
            }
            fn visit_borrowed_str<E: serde::de::Error>(
                self,
                v: &'de str,
            ) -> Result<Self::Value, E> {
                Ok(Key(Cow::Borrowed(v)))
            }
            fn visit_str<E: serde::de::Error>(self, v: &str) -> Result<Self::Value, E> {
                Ok(Key(Cow::Owned(v.to_owned())))
            }
        }
        d.deserialize_str(Name)
    }
}

/// One chain entry as the client wrote it: a name, or an object with per-attempt timeouts.
#[derive(Clone, Debug, PartialEq, Eq)]
pub struct EntrySpec {
    pub model: String,
    pub timeout_ms: Option<u32>,
    pub first_token_timeout_ms: Option<u32>,
    /// Where the entry was in the request (`models[1]`), for error messages.
    pub param: String,
}

#[derive(Clone, Debug, Default, PartialEq, Eq)]
pub struct Redundancy {
    pub timeout_ms: Option<u32>,
    pub first_token_timeout_ms: Option<u32>,
    pub on: Option<Vec<FailoverReason>>,
    pub deadline_ms: Option<u32>,
    /// Retries inside each attempt, over the catalog's `retry_policy`.
    pub max_retries: Option<u32>,
    /// The designed answer when no model can serve; replaces the key's.
    pub degraded: Option<Degraded>,
    /// Continue a stream that breaks after its first token; replaces the key's.
    pub continue_streams: Option<bool>,
    /// Send a request that names a session to the session's deployment; replaces the key's.
    pub session_affinity: Option<bool>,
}

impl<'a> ChatRequest<'a> {
    pub fn parse(body: &'a [u8]) -> Result<Self, ApiError> {
        Self::read(body, None)
    }

    /// An `/v1/embeddings` body: OpenAI's embeddings fields checked, the gateway's chain
    /// fields read as on chat; nothing of a chat request (`messages`, `stream`) applies.
    pub fn embeddings(body: &'a [u8]) -> Result<Self, ApiError> {
        let embeddings = Embeddings::parse(body)?;
        Self::read(body, Some(embeddings))
    }

    fn read(body: &'a [u8], embeddings: Option<Embeddings>) -> Result<Self, ApiError> {
        let fields: BTreeMap<FieldName<'a>, &'a RawValue> =
            serde_json::from_slice::<BorrowedKeys<'a>>(body).map(|f| f.0).map_err(|e| ApiError::InvalidRequest {
                message: format!(
                    "We could not parse the JSON body of your request ({e}). The body must be a JSON object."
                ),
                param: None,
                code: None,
            })?;
        let value = |name: &str| -> Result<Option<Value>, ApiError> {
            fields
                .get(name)
                .map(|raw| serde_json::from_str::<Value>(raw.get()))
                .transpose()
                .map_err(|e| ApiError::invalid(name, format!("{name}: {e}")))
        };

        let model = match value("model")? {
            None | Some(Value::Null) => None,
            Some(Value::String(s)) if !s.trim().is_empty() => Some(s),
            Some(_) => return Err(ApiError::invalid("model", "model must be a non-empty string")),
        };
        let models = value("models")?.map(|v| entries(v, "models")).transpose()?;
        let fallback_models =
            value("fallback_models")?.map(|v| entries(v, "fallback_models")).transpose()?;
        let redundancy = match value("redundancy")? {
            None | Some(Value::Null) => Redundancy::default(),
            Some(v) => redundancy(v)?,
        };
        if embeddings.is_none() {
            check_messages(fields.get("messages").map(|raw| raw.get()))?;
        }
        let stream = match value("stream")? {
            None | Some(Value::Null) => false,
            Some(Value::Bool(b)) => b,
            Some(_) => return Err(ApiError::invalid("stream", "stream must be a boolean")),
        };
        let include_usage = match value("stream_options")? {
            None | Some(Value::Null) => false,
            Some(Value::Object(o)) => match o.get("include_usage") {
                None | Some(Value::Null) => false,
                Some(Value::Bool(b)) => *b,
                Some(_) => {
                    return Err(ApiError::invalid(
                        "stream_options.include_usage",
                        "stream_options.include_usage must be a boolean",
                    ));
                }
            },
            Some(_) => {
                return Err(ApiError::invalid(
                    "stream_options",
                    "stream_options must be an object",
                ));
            }
        };
        // `invalid_output` judges answers against the response_format: asked for without
        // one, it could never apply, which is the client's mistake to hear about. The key's
        // `failoverDefaults.on` may hold it: it applies to the key's requests that have one.
        if redundancy.on.as_ref().is_some_and(|on| on.contains(&FailoverReason::InvalidOutput)) {
            let format = structured::kind(fields.get("response_format").copied())
                .map_err(|e| ApiError::invalid(e.param(), e.to_string()))?;
            if format.is_none() {
                return Err(ApiError::invalid(
                    "redundancy.on",
                    "redundancy.on: invalid_output needs a response_format of type json_schema or json_object, whose answers it checks",
                ));
            }
        }
        let mut passthrough = fields;
        for name in GATEWAY_FIELDS {
            passthrough.remove(name);
        }
        Ok(Self {
            passthrough,
            model,
            models,
            fallback_models,
            redundancy,
            stream,
            include_usage,
            native: None,
            translated: false,
            body,
            core: OnceLock::new(),
            embeddings,
        })
    }

    /// The request in the translation core's form, read on first use; a refusal names the
    /// field in Chat terms (`messages[1].tool_calls[0].function.arguments`).
    pub fn core(&self) -> Result<&switchyard_wire::core::Request, &switchyard_wire::Refusal> {
        self.core.get_or_init(|| switchyard_wire::chat::parse_request(self.body)).as_ref()
    }
}

/// Checks the shape of `messages` without building a tree of it: each message is read as
/// raw JSON and only its `role` is looked at (a prompt can be megabytes; this is the
/// request path).
fn check_messages(messages: Option<&str>) -> Result<(), ApiError> {
    let not_array = || ApiError::invalid("messages", "messages is required and must be an array");
    let messages: Vec<&RawValue> =
        serde_json::from_str(messages.ok_or_else(not_array)?).map_err(|_| not_array())?;
    if messages.is_empty() {
        return Err(ApiError::invalid("messages", "messages must contain at least one message"));
    }
    for (i, m) in messages.iter().enumerate() {
        match serde_json::from_str::<RoleProbe>(m.get()) {
            Ok(RoleProbe { role: Some(_) }) => {}
            Ok(RoleProbe { role: None }) | Err(_) if m.get().trim_start().starts_with('{') => {
                return Err(ApiError::invalid(
                    format!("messages[{i}].role"),
                    format!("messages[{i}].role is required and must be a string"),
                ));
            }
            _ => {
                return Err(ApiError::invalid(
                    format!("messages[{i}]"),
                    format!("messages[{i}] must be an object"),
                ));
            }
        }
    }
    Ok(())
}

#[derive(serde::Deserialize)]
struct RoleProbe<'a> {
    #[serde(borrow, default)]
    role: Option<std::borrow::Cow<'a, str>>,
}

fn entries(value: Value, field: &str) -> Result<Vec<EntrySpec>, ApiError> {
    let Value::Array(items) = value else {
        return Err(ApiError::invalid(field, format!("{field} must be an array of model names")));
    };
    // An empty `fallback_models` just means no fallbacks; an empty `models` names no model.
    if items.is_empty() && field == "models" {
        return Err(ApiError::invalid(field, format!("{field} must not be empty")));
    }
    items.into_iter().enumerate().map(|(i, item)| entry(item, &format!("{field}[{i}]"))).collect()
}

fn entry(item: Value, param: &str) -> Result<EntrySpec, ApiError> {
    match item {
        Value::String(model) if !model.trim().is_empty() => Ok(EntrySpec {
            model,
            timeout_ms: None,
            first_token_timeout_ms: None,
            param: param.into(),
        }),
        Value::Object(map) => {
            let mut spec = EntrySpec {
                model: String::new(),
                timeout_ms: None,
                first_token_timeout_ms: None,
                param: param.into(),
            };
            for (key, v) in map {
                let path = format!("{param}.{key}");
                match key.as_str() {
                    "model" => match v {
                        Value::String(m) if !m.trim().is_empty() => spec.model = m,
                        _ => {
                            return Err(ApiError::invalid(
                                path.clone(),
                                format!("{path} must be a non-empty string"),
                            ));
                        }
                    },
                    "timeout_ms" => spec.timeout_ms = Some(ranged(&v, &path, TIMEOUT_MS_RANGE)?),
                    "first_token_timeout_ms" => {
                        spec.first_token_timeout_ms =
                            Some(ranged(&v, &path, FIRST_TOKEN_TIMEOUT_MS_RANGE)?)
                    }
                    _ => {
                        return Err(ApiError::invalid(
                            path.clone(),
                            format!(
                                "unknown field {path}; expected model, timeout_ms, first_token_timeout_ms"
                            ),
                        ));
                    }
                }
            }
            if spec.model.is_empty() {
                let path = format!("{param}.model");
                return Err(ApiError::invalid(path.clone(), format!("{path} is required")));
            }
            Ok(spec)
        }
        _ => Err(ApiError::invalid(
            param,
            format!("{param} must be a model name or an object with a model"),
        )),
    }
}

fn redundancy(value: Value) -> Result<Redundancy, ApiError> {
    let Value::Object(map) = value else {
        return Err(ApiError::invalid("redundancy", "redundancy must be an object"));
    };
    let mut r = Redundancy::default();
    for (key, v) in map {
        let path = format!("redundancy.{key}");
        match key.as_str() {
            "timeout_ms" => r.timeout_ms = Some(ranged(&v, &path, TIMEOUT_MS_RANGE)?),
            "first_token_timeout_ms" => {
                r.first_token_timeout_ms = Some(ranged(&v, &path, FIRST_TOKEN_TIMEOUT_MS_RANGE)?)
            }
            "deadline_ms" => r.deadline_ms = Some(ranged(&v, &path, DEADLINE_MS_RANGE)?),
            "max_retries" => r.max_retries = Some(ranged(&v, &path, (0, MAX_RETRIES))?),
            "degraded" => r.degraded = Some(degraded(v)?),
            "continue_streams" => match v {
                Value::Bool(b) => r.continue_streams = Some(b),
                _ => {
                    return Err(ApiError::invalid(
                        path,
                        "redundancy.continue_streams must be a boolean",
                    ));
                }
            },
            "session_affinity" => match v {
                Value::Bool(b) => r.session_affinity = Some(b),
                _ => {
                    return Err(ApiError::invalid(
                        path,
                        "redundancy.session_affinity must be a boolean",
                    ));
                }
            },
            "on" => {
                let Value::Array(items) = v else {
                    return Err(ApiError::invalid(
                        path,
                        "redundancy.on must be an array of triggers",
                    ));
                };
                let mut on = Vec::new();
                for (i, item) in items.iter().enumerate() {
                    match item.as_str().and_then(FailoverReason::parse) {
                        Some(reason) => on.push(reason),
                        None => {
                            return Err(ApiError::invalid(
                                format!("redundancy.on[{i}]"),
                                format!(
                                    "redundancy.on[{i}]: unknown trigger {item}; expected {}",
                                    FailoverReason::accepted_list()
                                ),
                            ));
                        }
                    }
                }
                r.on = Some(on);
            }
            _ => {
                return Err(ApiError::invalid(
                    path.clone(),
                    format!(
                        "unknown field {path}; expected timeout_ms, first_token_timeout_ms, on, deadline_ms, max_retries, degraded, continue_streams, session_affinity"
                    ),
                ));
            }
        }
    }
    Ok(r)
}

/// `redundancy.degraded`: `{"message": "...", "when_all_open": true}`.
fn degraded(value: Value) -> Result<Degraded, ApiError> {
    const PATH: &str = "redundancy.degraded";
    let Value::Object(map) = value else {
        return Err(ApiError::invalid(PATH, format!("{PATH} must be an object with a message")));
    };
    let mut message = None;
    let mut when_all_open = false;
    for (key, v) in map {
        let path = format!("{PATH}.{key}");
        match (key.as_str(), v) {
            ("message", Value::String(text)) => {
                if let Some(why) = Degraded::check_message(&text) {
                    return Err(ApiError::invalid(path.clone(), format!("{path}: {why}")));
                }
                message = Some(text);
            }
            ("message", _) => {
                return Err(ApiError::invalid(path.clone(), format!("{path} must be a string")));
            }
            ("when_all_open", Value::Bool(b)) => when_all_open = b,
            ("when_all_open", _) => {
                return Err(ApiError::invalid(path.clone(), format!("{path} must be a boolean")));
            }
            _ => {
                return Err(ApiError::invalid(
                    path.clone(),
                    format!("unknown field {path}; expected message, when_all_open"),
                ));
            }
        }
    }
    let message = message.ok_or_else(|| {
        ApiError::invalid(format!("{PATH}.message"), format!("{PATH}.message is required"))
    })?;
    Ok(Degraded { message, when_all_open })
}

fn ranged(v: &Value, path: &str, (lo, hi): (u32, u32)) -> Result<u32, ApiError> {
    match v.as_u64() {
        Some(n) if (u64::from(lo)..=u64::from(hi)).contains(&n) => Ok(n as u32),
        _ => Err(ApiError::invalid(path, format!("{path} must be an integer from {lo} to {hi}"))),
    }
}

/// `body`, a JSON object, with `fields` added at its end.
pub fn with_fields<'v>(
    mut body: Vec<u8>,
    fields: impl Iterator<Item = (&'v str, &'v RawValue)>,
) -> Vec<u8> {
    while body.last().is_some_and(|b| b.is_ascii_whitespace()) {
        body.pop();
    }
    if body.last() != Some(&b'}') {
        return body;
    }
    body.pop();
    let mut empty = body.last() == Some(&b'{');
    for (key, value) in fields {
        if !std::mem::take(&mut empty) {
            body.push(b',');
        }
        let _ = serde_json::to_writer(&mut body, key);
        body.push(b':');
        body.extend_from_slice(value.get().as_bytes());
    }
    body.push(b'}');
    body
}

#[cfg(test)]
mod tests {
    use super::*;

    fn param(body: &str) -> Option<String> {
        match ChatRequest::parse(body.as_bytes()) {
            Err(ApiError::InvalidRequest { param, .. }) => param,
            other => panic!("expected a 400, got {other:?}"),
        }
    }

    const MSG: &str = r#""messages":[{"role":"user","content":"hi"}]"#;

    #[test]
    fn gateway_fields_are_taken_out_and_the_rest_passes_through() {
        let body = format!(
            r#"{{"model":"a","fallback_models":["b"],"redundancy":{{"timeout_ms":2000}},"temperature":0.3,"user":"u1",{MSG}}}"#
        );
        let r = ChatRequest::parse(body.as_bytes()).unwrap();
        assert_eq!(r.model.as_deref(), Some("a"));
        assert_eq!(r.fallback_models.unwrap()[0].model, "b");
        assert_eq!(r.redundancy.timeout_ms, Some(2000));
        let keys: Vec<_> = r.passthrough.keys().cloned().collect();
        assert_eq!(keys, ["messages", "temperature", "user"]);
        assert_eq!(r.passthrough["temperature"].get(), "0.3");
    }

    #[test]
    fn field_names_with_escapes_are_read_like_any_other() {
        let body = r#"{"\u006dodel":"a","t\u0065mperature":0.5,"messages":[{"role":"user","content":"hi"}]}"#;
        let r = ChatRequest::parse(body.as_bytes()).unwrap();
        assert_eq!(r.model.as_deref(), Some("a"));
        assert_eq!(r.passthrough["temperature"].get(), "0.5");
    }

    #[test]
    fn a_degraded_answer_is_read_and_each_bad_field_is_named() {
        let body = format!(
            r#"{{"model":"a","redundancy":{{"degraded":{{"message":"Down.","when_all_open":true}}}},{MSG}}}"#
        );
        let r = ChatRequest::parse(body.as_bytes()).unwrap();
        let d = r.redundancy.degraded.unwrap();
        assert_eq!((d.message.as_str(), d.when_all_open), ("Down.", true));
        let long = "x".repeat(4097);
        for (degraded, named) in [
            (r#"{"message":""}"#.to_owned(), "redundancy.degraded.message"),
            (format!(r#"{{"message":"{long}"}}"#), "redundancy.degraded.message"),
            (r#"{"message":5}"#.to_owned(), "redundancy.degraded.message"),
            (r#"{"when_all_open":true}"#.to_owned(), "redundancy.degraded.message"),
            (
                r#"{"message":"m","when_all_open":"yes"}"#.to_owned(),
                "redundancy.degraded.when_all_open",
            ),
            (r#"{"message":"m","colour":"red"}"#.to_owned(), "redundancy.degraded.colour"),
            (r#""m""#.to_owned(), "redundancy.degraded"),
        ] {
            let body = format!(r#"{{"model":"a","redundancy":{{"degraded":{degraded}}},{MSG}}}"#);
            assert_eq!(param(&body).as_deref(), Some(named), "{degraded}");
        }
    }

    #[test]
    fn malformed_json_is_a_400_without_param() {
        assert_eq!(param("{not json"), None);
        assert_eq!(param("[1,2]"), None);
    }

    #[test]
    fn each_bad_field_is_named() {
        assert_eq!(param(&format!(r#"{{"model":5,{MSG}}}"#)).as_deref(), Some("model"));
        assert_eq!(param(r#"{"model":"a","messages":[]}"#).as_deref(), Some("messages"));
        assert_eq!(param(r#"{"model":"a"}"#).as_deref(), Some("messages"));
        assert_eq!(
            param(r#"{"model":"a","messages":[{"content":"x"}]}"#).as_deref(),
            Some("messages[0].role")
        );
        assert_eq!(
            param(&format!(r#"{{"model":"a","stream":"yes",{MSG}}}"#)).as_deref(),
            Some("stream")
        );
        assert_eq!(
            param(&format!(r#"{{"model":"a","redundancy":{{"timeout_ms":10}},{MSG}}}"#)).as_deref(),
            Some("redundancy.timeout_ms")
        );
        assert_eq!(
            param(&format!(
                r#"{{"model":"a","redundancy":{{"first_token_timeout_ms":100}},{MSG}}}"#
            ))
            .as_deref(),
            Some("redundancy.first_token_timeout_ms")
        );
        assert_eq!(
            param(&format!(r#"{{"model":"a","redundancy":{{"on":["timeout","oops"]}},{MSG}}}"#))
                .as_deref(),
            Some("redundancy.on[1]")
        );
        assert_eq!(
            param(&format!(r#"{{"model":"a","redundancy":{{"retries":2}},{MSG}}}"#)).as_deref(),
            Some("redundancy.retries")
        );
        assert_eq!(
            param(&format!(r#"{{"models":["a",{{"model":"b","timeout_ms":5}}],{MSG}}}"#))
                .as_deref(),
            Some("models[1].timeout_ms")
        );
        assert_eq!(
            param(&format!(r#"{{"models":[{{"timeout_ms":5000}}],{MSG}}}"#)).as_deref(),
            Some("models[0].model")
        );
    }

    #[test]
    fn invalid_output_in_on_needs_a_json_response_format() {
        let body = |rest: &str| {
            format!(
                r#"{{"model":"a","redundancy":{{"on":["timeout","invalid_output"]}}{rest},{MSG}}}"#
            )
        };
        for format in [
            r#","response_format":{"type":"json_object"}"#,
            r#","response_format":{"type":"json_schema","json_schema":{"name":"x","schema":{"type":"object"}}}"#,
        ] {
            let body = body(format);
            let r = ChatRequest::parse(body.as_bytes()).unwrap();
            assert_eq!(
                r.redundancy.on,
                Some(vec![FailoverReason::Timeout, FailoverReason::InvalidOutput])
            );
            assert!(r.passthrough.contains_key("response_format"), "still sent upstream");
        }
        for format in ["", r#","response_format":{"type":"text"}"#, r#","response_format":null"#] {
            match ChatRequest::parse(body(format).as_bytes()) {
                Err(ApiError::InvalidRequest { param, message, .. }) => {
                    assert_eq!(param.as_deref(), Some("redundancy.on"), "{format}");
                    assert!(message.contains("response_format"), "{message}");
                }
                other => panic!("{format}: expected a 400, got {other:?}"),
            }
        }
        assert_eq!(
            param(&body(r#","response_format":"json""#)).as_deref(),
            Some("response_format")
        );
        // The schema itself is compiled, once, when the chain is formed.
        assert!(
            ChatRequest::parse(body(r#","response_format":{"type":"json_schema"}"#).as_bytes())
                .is_ok()
        );
        // Without invalid_output the response_format is not looked at: forwarded as it is.
        let plain = format!(r#"{{"model":"a","response_format":"json",{MSG}}}"#);
        assert!(ChatRequest::parse(plain.as_bytes()).is_ok());
        let unknown = format!(r#"{{"model":"a","redundancy":{{"on":["bad_json"]}},{MSG}}}"#);
        match ChatRequest::parse(unknown.as_bytes()) {
            Err(ApiError::InvalidRequest { message, .. }) => {
                assert!(message.contains("context_length or invalid_output"), "{message}")
            }
            other => panic!("{other:?}"),
        }
    }

    #[test]
    fn max_retries_is_read_and_checked_against_its_range() {
        let parse = |n: &str| {
            ChatRequest::parse(
                format!(r#"{{"model":"a","redundancy":{{"max_retries":{n}}},{MSG}}}"#).as_bytes(),
            )
            .map(|r| r.redundancy.max_retries)
        };
        assert_eq!(parse("0").unwrap(), Some(0));
        assert_eq!(parse("5").unwrap(), Some(5));
        for bad in ["6", "-1", "1.5", "\"2\""] {
            match parse(bad) {
                Err(ApiError::InvalidRequest { param, message, .. }) => {
                    assert_eq!(param.as_deref(), Some("redundancy.max_retries"), "{bad}");
                    assert!(message.contains("from 0 to 5"), "{message}");
                }
                other => panic!("{bad}: expected a 400, got {other:?}"),
            }
        }
    }

    #[test]
    fn entry_objects_carry_per_attempt_timeouts() {
        let body = format!(
            r#"{{"models":["a",{{"model":"b","timeout_ms":5000,"first_token_timeout_ms":800}}],{MSG}}}"#
        );
        let r = ChatRequest::parse(body.as_bytes()).unwrap();
        let models = r.models.unwrap();
        assert_eq!(models[1].timeout_ms, Some(5000));
        assert_eq!(models[1].first_token_timeout_ms, Some(800));
        assert_eq!(models[1].param, "models[1]");
    }
}
