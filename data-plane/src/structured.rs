//! Structured outputs (docs/http-api.md, "Structured outputs"): what a request's
//! `response_format` asks of an answer, compiled at most once per request (and kept for the
//! next requests that send the same one), and whether an answer's content gives it. Used only when `invalid_output` is in the chain's `on`; the request
//! path of every other request never reaches this module.
//!
//! Schemas are JSON Schema draft 2020-12, the dialect of OpenAI's structured outputs, with
//! the formats OpenAI's subset names (`date-time`, `email`, `uuid`, …) checked as it checks
//! them. References resolve only inside the request's own schema (`#/$defs/…`): the node
//! never fetches a schema from elsewhere.

use std::borrow::Cow;
use std::collections::HashMap;
use std::sync::Arc;

use parking_lot::RwLock;
use serde::Deserialize;
use serde::de::IgnoredAny;
use serde_json::Value;
use serde_json::value::RawValue;

/// Where a request's schema is, as `error.param` names it.
pub const SCHEMA_PARAM: &str = "response_format.json_schema.schema";

/// What a `response_format` asks for, when it asks for JSON.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum Kind {
    /// `{"type": "json_object"}`: any JSON.
    JsonObject,
    /// `{"type": "json_schema", …}`: JSON valid against the schema, when it has one.
    JsonSchema,
}

/// A `response_format` the node cannot check answers against: the client's 400, naming the
/// field.
#[derive(Debug, thiserror::Error)]
pub enum FormatError {
    #[error("{param} {message}")]
    Shape { param: &'static str, message: &'static str },
    #[error("{SCHEMA_PARAM} is not a valid JSON Schema (draft 2020-12): {message}")]
    Schema { message: String },
}

impl FormatError {
    /// The field the error names (`error.param`).
    pub fn param(&self) -> &'static str {
        match self {
            Self::Shape { param, .. } => param,
            Self::Schema { .. } => SCHEMA_PARAM,
        }
    }
}

/// Why an answer is not what its `response_format` asked for.
#[derive(Debug, thiserror::Error)]
pub enum Invalid {
    #[error("choices[{choice}]: the content is not JSON ({error})")]
    NotJson { choice: usize, error: String },
    #[error(
        "choices[{choice}]: the answer was cut at its token limit (finish_reason length) and its JSON is incomplete ({error})"
    )]
    Truncated { choice: usize, error: String },
    #[error("choices[{choice}]: the content does not match the schema at `{at}`: {message}")]
    Schema { choice: usize, at: String, message: String },
    /// The completion has no readable `choices` (an adapter checked it is a completion).
    #[error("the answer's choices cannot be read: {0}")]
    Unreadable(String),
}

impl Invalid {
    /// The `kind` label of `switchyard_invalid_outputs_total`.
    pub fn kind(&self) -> &'static str {
        match self {
            Self::NotJson { .. } | Self::Unreadable(_) => "not_json",
            Self::Truncated { .. } => "truncated",
            Self::Schema { .. } => "schema",
        }
    }
}

/// What a `response_format` asks for, shallowly: `None` when it asks for no JSON (absent,
/// `text`). Reads only `type`, so a request can be judged without compiling its schema.
pub fn kind(response_format: Option<&RawValue>) -> Result<Option<Kind>, FormatError> {
    #[derive(Deserialize)]
    struct Typed<'a> {
        #[serde(borrow, rename = "type")]
        kind: Option<Cow<'a, str>>,
    }
    let Some(raw) = response_format else { return Ok(None) };
    if raw.get() == "null" {
        return Ok(None);
    }
    let typed: Typed<'_> = serde_json::from_str(raw.get()).map_err(|_| FormatError::Shape {
        param: "response_format",
        message: "must be an object with a string type",
    })?;
    match typed.kind.as_deref() {
        Some("json_object") => Ok(Some(Kind::JsonObject)),
        Some("json_schema") => Ok(Some(Kind::JsonSchema)),
        Some(_) => Ok(None),
        None => Err(FormatError::Shape {
            param: "response_format.type",
            message: "is required and must be a string",
        }),
    }
}

/// A request's `response_format`, compiled: built once when its chain is formed and shared
/// by every attempt of the request.
#[derive(Debug)]
pub struct OutputCheck {
    schema: Option<jsonschema::Validator>,
}

impl OutputCheck {
    /// Compiles `response_format`: `None` when it asks for no JSON.
    pub fn compile(response_format: Option<&RawValue>) -> Result<Option<Self>, FormatError> {
        match kind(response_format)? {
            None => Ok(None),
            Some(Kind::JsonObject) => Ok(Some(Self { schema: None })),
            Some(Kind::JsonSchema) => {
                let schema = response_format.map(|raw| schema_of(raw.get())).transpose()?;
                Ok(Some(Self { schema: schema.flatten().map(build).transpose()? }))
            }
        }
    }

    /// Whether a completion's `choices` give what the request asked for: every choice's
    /// content JSON, valid against the schema. A choice that calls tools or refuses carries
    /// no content to check, and passes (the client's SDK reads those as they are).
    pub fn check(&self, choices: Option<&RawValue>) -> Result<(), Invalid> {
        let choices = choices.ok_or_else(|| Invalid::Unreadable("no choices".into()))?;
        let choices: Vec<Choice<'_>> =
            serde_json::from_str(choices.get()).map_err(|e| Invalid::Unreadable(e.to_string()))?;
        if choices.is_empty() {
            return Err(Invalid::Unreadable("no choices".into()));
        }
        for (choice, c) in choices.iter().enumerate() {
            let message = c.message.as_ref();
            let calls_tools = c.finish_reason.as_deref() == Some("tool_calls")
                || message.is_some_and(|m| m.tool_calls.is_some());
            let refuses = message.is_some_and(|m| m.refusal.is_some());
            let content = message.and_then(|m| m.content.as_deref());
            let content = match content {
                Some(content) => content,
                None if calls_tools || refuses => continue,
                None => {
                    return Err(Invalid::NotJson {
                        choice,
                        error: "the message has no content".into(),
                    });
                }
            };
            self.check_content(choice, content, c.finish_reason.as_deref() == Some("length"))?;
        }
        Ok(())
    }

    /// [`OutputCheck::check`] for an Anthropic `message`, a Messages answer passed on as it
    /// came: its text blocks, joined, are the content. An answer that calls a tool or
    /// refuses carries none to check, and passes.
    pub fn check_message(&self, message: Option<&[u8]>) -> Result<(), Invalid> {
        #[derive(Deserialize)]
        struct Message<'a> {
            #[serde(borrow, default)]
            content: Vec<Block<'a>>,
            #[serde(borrow, default)]
            stop_reason: Option<Cow<'a, str>>,
        }
        #[derive(Deserialize)]
        struct Block<'a> {
            #[serde(borrow, rename = "type")]
            kind: Cow<'a, str>,
            #[serde(borrow, default)]
            text: Option<Cow<'a, str>>,
        }
        let message = message.ok_or_else(|| Invalid::Unreadable("no message".into()))?;
        let message: Message<'_> =
            serde_json::from_slice(message).map_err(|e| Invalid::Unreadable(e.to_string()))?;
        if matches!(message.stop_reason.as_deref(), Some("tool_use" | "refusal")) {
            return Ok(());
        }
        let text: String = message
            .content
            .iter()
            .filter(|b| b.kind == "text")
            .filter_map(|b| b.text.as_deref())
            .collect();
        self.check_content(0, &text, message.stop_reason.as_deref() == Some("max_tokens"))
    }

    /// [`OutputCheck::check`] for an OpenAI `response`, a Responses answer passed on as it
    /// came: its messages' `output_text` parts, joined, are the content. An answer that calls
    /// a tool or refuses carries none to check, and passes.
    pub fn check_response(&self, response: Option<&[u8]>) -> Result<(), Invalid> {
        #[derive(Deserialize)]
        struct Response<'a> {
            #[serde(borrow, default)]
            output: Vec<Item<'a>>,
            #[serde(borrow, default)]
            status: Option<Cow<'a, str>>,
        }
        #[derive(Deserialize)]
        struct Item<'a> {
            #[serde(borrow, rename = "type")]
            kind: Cow<'a, str>,
            #[serde(borrow, default)]
            content: Vec<Part<'a>>,
        }
        #[derive(Deserialize)]
        struct Part<'a> {
            #[serde(borrow, rename = "type")]
            kind: Cow<'a, str>,
            #[serde(borrow, default)]
            text: Option<Cow<'a, str>>,
        }
        let response = response.ok_or_else(|| Invalid::Unreadable("no response".into()))?;
        let response: Response<'_> =
            serde_json::from_slice(response).map_err(|e| Invalid::Unreadable(e.to_string()))?;
        let parts = || {
            response.output.iter().filter(|i| i.kind == "message").flat_map(|i| i.content.iter())
        };
        let calls_tools = response.output.iter().any(|i| i.kind.ends_with("_call"));
        if calls_tools || parts().any(|p| p.kind == "refusal") {
            return Ok(());
        }
        let text: String =
            parts().filter(|p| p.kind == "output_text").filter_map(|p| p.text.as_deref()).collect();
        self.check_content(0, &text, response.status.as_deref() == Some("incomplete"))
    }

    /// One answer's `content`: JSON, valid against the schema; `truncated` when the model
    /// ran out of tokens, so unparsable JSON is named as cut short.
    fn check_content(&self, choice: usize, content: &str, truncated: bool) -> Result<(), Invalid> {
        let value: Value = match serde_json::from_str(content) {
            Ok(value) => value,
            Err(e) if truncated => return Err(Invalid::Truncated { choice, error: e.to_string() }),
            Err(e) => return Err(Invalid::NotJson { choice, error: e.to_string() }),
        };
        if let Some(schema) = &self.schema
            && let Err(e) = schema.validate(&value)
        {
            return Err(Invalid::Schema {
                choice,
                at: e.instance_path().to_string(),
                message: e.to_string(),
            });
        }
        Ok(())
    }
}

/// The most compiled `response_format`s a node keeps, and the longest one it keeps.
const KEPT: usize = 256;
const KEPT_MAX_BYTES: usize = 16 * 1024;

/// The node's compiled `response_format`s, by their exact text, shared by every request
/// and config version: an app sends the same schema with every request, and compiling one
/// costs several times what checking an answer does (docs/BENCHMARKS.md, "Structured
/// output validation"). Bounded: past [`KEPT`] it starts again empty, and a format longer
/// than [`KEPT_MAX_BYTES`] is compiled for its request alone.
#[derive(Debug, Default)]
pub struct Compiled {
    kept: RwLock<HashMap<Box<str>, Arc<OutputCheck>>>,
}

impl Compiled {
    /// The request's compiled `response_format` (`None` when it asks for no JSON): kept
    /// from an earlier request with the same text, else compiled now. An error is the
    /// client's 400 and is never kept.
    pub fn get(
        &self,
        response_format: Option<&RawValue>,
    ) -> Result<Option<Arc<OutputCheck>>, FormatError> {
        let Some(raw) = response_format else { return Ok(None) };
        let text = raw.get();
        let keep = text.len() <= KEPT_MAX_BYTES;
        if keep && let Some(check) = self.kept.read().get(text) {
            return Ok(Some(Arc::clone(check)));
        }
        let Some(check) = OutputCheck::compile(Some(raw))?.map(Arc::new) else { return Ok(None) };
        if keep {
            let mut kept = self.kept.write();
            if kept.len() >= KEPT {
                kept.clear();
            }
            kept.insert(text.into(), Arc::clone(&check));
        }
        Ok(Some(check))
    }
}

/// `response_format.json_schema.schema`, if the request gives one (OpenAI's API makes it
/// optional: then any JSON will do).
fn schema_of(response_format: &str) -> Result<Option<Value>, FormatError> {
    #[derive(Deserialize)]
    struct Format {
        json_schema: Option<Value>,
    }
    let format: Format = serde_json::from_str(response_format).map_err(|_| FormatError::Shape {
        param: "response_format",
        message: "must be an object",
    })?;
    match format.json_schema {
        None | Some(Value::Null) => Err(FormatError::Shape {
            param: "response_format.json_schema",
            message: "is required when type is json_schema",
        }),
        Some(Value::Object(mut map)) => Ok(map.remove("schema").filter(|s| !s.is_null())),
        Some(_) => Err(FormatError::Shape {
            param: "response_format.json_schema",
            message: "must be an object",
        }),
    }
}

fn build(schema: Value) -> Result<jsonschema::Validator, FormatError> {
    #[cfg(test)]
    tests::COMPILED.with(|n| n.set(n.get() + 1));
    jsonschema::draft202012::options()
        .offline()
        .should_validate_formats(true)
        .build(&schema)
        .map_err(|e| {
            let at = e.instance_path().to_string();
            let message = if at.is_empty() { e.to_string() } else { format!("at `{at}`: {e}") };
            FormatError::Schema { message }
        })
}

#[derive(Deserialize)]
struct Choice<'a> {
    #[serde(borrow, default)]
    message: Option<Message<'a>>,
    #[serde(borrow, default)]
    finish_reason: Option<Cow<'a, str>>,
}

#[derive(Deserialize)]
struct Message<'a> {
    #[serde(borrow, default)]
    content: Option<Cow<'a, str>>,
    #[serde(default)]
    refusal: Option<IgnoredAny>,
    #[serde(default)]
    tool_calls: Option<IgnoredAny>,
}

#[cfg(test)]
pub(crate) mod tests {
    use std::cell::Cell;

    use serde_json::json;

    use super::*;

    thread_local! {
        /// Schemas compiled on this thread: a test's runtime runs on one thread.
        pub(crate) static COMPILED: Cell<usize> = const { Cell::new(0) };
    }

    pub(crate) fn compiled() -> usize {
        COMPILED.with(Cell::get)
    }

    fn raw(v: Value) -> Box<RawValue> {
        RawValue::from_string(v.to_string()).unwrap()
    }

    fn schema_format(schema: Value) -> Box<RawValue> {
        raw(json!({"type": "json_schema",
                   "json_schema": {"name": "person", "strict": true, "schema": schema}}))
    }

    fn person() -> Value {
        json!({"type": "object",
               "properties": {"name": {"type": "string"}, "age": {"type": "integer"},
                              "born": {"type": "string", "format": "date"},
                              "tags": {"type": "array", "items": {"$ref": "#/$defs/tag"}}},
               "required": ["name", "age"], "additionalProperties": false,
               "$defs": {"tag": {"type": "string", "enum": ["a", "b"]}}})
    }

    fn choices(content: Value, finish_reason: &str) -> Box<RawValue> {
        raw(json!([{"index": 0, "message": {"role": "assistant", "content": content},
                    "finish_reason": finish_reason}]))
    }

    fn check(format: &RawValue, content: Value, finish_reason: &str) -> Result<(), Invalid> {
        let check = OutputCheck::compile(Some(format)).unwrap().unwrap();
        check.check(Some(&choices(content, finish_reason)))
    }

    #[test]
    fn a_format_is_compiled_once_for_every_request_that_sends_it() {
        let cache = Compiled::default();
        let before = compiled();
        let format = schema_format(person());
        let first = cache.get(Some(&format)).unwrap().unwrap();
        let again = cache.get(Some(&format)).unwrap().unwrap();
        assert!(Arc::ptr_eq(&first, &again));
        assert_eq!(compiled() - before, 1);
        let other = schema_format(json!({"type": "object"}));
        cache.get(Some(&other)).unwrap().unwrap();
        assert_eq!(compiled() - before, 2);
        assert!(cache.get(Some(&raw(json!({"type": "text"})))).unwrap().is_none());
        assert!(cache.get(None).unwrap().is_none());
        // An invalid schema is refused every time, never kept.
        let bad = schema_format(json!({"type": "objekt"}));
        assert!(cache.get(Some(&bad)).is_err());
        assert!(cache.get(Some(&bad)).is_err());
    }

    #[test]
    fn the_kept_formats_are_bounded() {
        let cache = Compiled::default();
        let format = |i: usize| schema_format(json!({"type": "object", "title": format!("s{i}")}));
        for i in 0..KEPT {
            cache.get(Some(&format(i))).unwrap();
        }
        assert_eq!(cache.kept.read().len(), KEPT);
        cache.get(Some(&format(KEPT))).unwrap();
        assert_eq!(cache.kept.read().len(), 1, "started again, empty");
        let long = schema_format(json!({"type": "object", "title": "x".repeat(KEPT_MAX_BYTES)}));
        cache.get(Some(&long)).unwrap();
        assert_eq!(cache.kept.read().len(), 1, "a long format is not kept");
    }

    #[test]
    fn only_json_formats_are_checked() {
        assert_eq!(kind(None).unwrap(), None);
        assert_eq!(kind(Some(&raw(json!(null)))).unwrap(), None);
        assert_eq!(kind(Some(&raw(json!({"type": "text"})))).unwrap(), None);
        assert_eq!(
            kind(Some(&raw(json!({"type": "json_object"})))).unwrap(),
            Some(Kind::JsonObject)
        );
        assert_eq!(kind(Some(&schema_format(person()))).unwrap(), Some(Kind::JsonSchema));
        assert!(OutputCheck::compile(Some(&raw(json!({"type": "text"})))).unwrap().is_none());
    }

    #[test]
    fn a_malformed_response_format_names_its_field() {
        let param = |v: Value| OutputCheck::compile(Some(&raw(v))).unwrap_err().param();
        assert_eq!(param(json!("json")), "response_format");
        assert_eq!(param(json!({"type": 5})), "response_format");
        assert_eq!(param(json!({"json_schema": {}})), "response_format.type");
        assert_eq!(param(json!({"type": "json_schema"})), "response_format.json_schema");
        assert_eq!(
            param(json!({"type": "json_schema", "json_schema": "x"})),
            "response_format.json_schema"
        );
    }

    #[test]
    fn an_invalid_schema_is_refused_naming_the_schema() {
        for schema in [
            json!({"type": "objekt"}),
            json!({"type": "object", "properties": {"a": {"type": 5}}}),
            json!({"type": "object", "required": "name"}),
            json!({"type": "string", "pattern": "(unclosed"}),
            json!(7),
            // Only the request's own schema: nothing is fetched.
            json!({"$ref": "https://example.com/schema.json"}),
        ] {
            let e = OutputCheck::compile(Some(&schema_format(schema.clone()))).unwrap_err();
            assert_eq!(e.param(), SCHEMA_PARAM, "{schema}");
            assert!(e.to_string().starts_with(SCHEMA_PARAM), "{e}");
        }
        let e =
            OutputCheck::compile(Some(&schema_format(json!({"properties": {"a": {"type": 5}}}))))
                .unwrap_err();
        assert!(e.to_string().contains("/properties/a/type"), "{e}");
    }

    #[test]
    fn a_json_schema_without_a_schema_wants_any_json() {
        let format = raw(json!({"type": "json_schema", "json_schema": {"name": "x"}}));
        assert!(check(&format, json!("[1, 2]"), "stop").is_ok());
        assert!(matches!(check(&format, json!("nope"), "stop"), Err(Invalid::NotJson { .. })));
    }

    #[test]
    fn answers_are_judged_against_the_schema() {
        let format = schema_format(person());
        let ok = json!({"name": "Ada", "age": 36, "born": "1815-12-10", "tags": ["a"]}).to_string();
        assert!(check(&format, json!(ok), "stop").is_ok());
        assert!(check(&format, json!(" {\"name\": \"Ada\", \"age\": 36}\n"), "stop").is_ok());

        let invalid = |content: Value| check(&format, json!(content.to_string()), "stop");
        for (content, at) in [
            (json!({"name": "Ada"}), ""),
            (json!({"name": "Ada", "age": "36"}), "/age"),
            (json!({"name": "Ada", "age": 36, "extra": true}), ""),
            (json!({"name": "Ada", "age": 36, "tags": ["c"]}), "/tags/0"),
            (json!({"name": "Ada", "age": 36, "born": "10 Dec 1815"}), "/born"),
            (json!([1, 2]), ""),
        ] {
            match invalid(content.clone()) {
                Err(Invalid::Schema { choice: 0, at: got, .. }) => assert_eq!(got, at, "{content}"),
                other => panic!("{content}: {other:?}"),
            }
        }
        let e = check(&format, json!("Sure! Here is the JSON: {\"name\": \"Ada\"}"), "stop");
        assert!(matches!(e, Err(Invalid::NotJson { choice: 0, .. })), "{e:?}");
        assert_eq!(e.unwrap_err().kind(), "not_json");
    }

    #[test]
    fn a_truncated_answer_that_breaks_the_json_is_invalid() {
        let format = schema_format(person());
        let cut = r#"{"name": "Ada", "age": 3"#;
        let e = check(&format, json!(cut), "length").unwrap_err();
        assert!(matches!(e, Invalid::Truncated { choice: 0, .. }), "{e:?}");
        assert_eq!(e.kind(), "truncated");
        let json_object = raw(json!({"type": "json_object"}));
        let e =
            check(&json_object, json!(r#"{"summary": "The quick brown"#), "length").unwrap_err();
        assert_eq!(e.kind(), "truncated");
        // Cut where the JSON happens to be whole: judged like any answer.
        assert!(check(&format, json!(r#"{"name": "Ada", "age": 3}"#), "length").is_ok());
    }

    #[test]
    fn an_anthropic_message_is_judged_by_its_text_blocks() {
        let check = OutputCheck::compile(Some(&schema_format(person()))).unwrap().unwrap();
        let message = |content: Value, stop: &str| {
            json!({"type": "message", "role": "assistant", "content": content,
                   "stop_reason": stop})
            .to_string()
        };
        let split = json!([{"type": "text", "text": "{\"name\": \"Ada\", "},
                           {"type": "text", "text": "\"age\": 36}"}]);
        assert!(check.check_message(Some(message(split, "end_turn").as_bytes())).is_ok());
        let prose = json!([{"type": "text", "text": "Ada is 36."}]);
        let e = check.check_message(Some(message(prose, "end_turn").as_bytes())).unwrap_err();
        assert_eq!(e.kind(), "not_json");
        let off = json!([{"type": "text", "text": "{\"name\": \"Ada\"}"}]);
        let e = check.check_message(Some(message(off, "end_turn").as_bytes())).unwrap_err();
        assert_eq!(e.kind(), "schema");
        let cut = json!([{"type": "text", "text": "{\"name\": \"Ada\", \"ag"}]);
        let e = check.check_message(Some(message(cut, "max_tokens").as_bytes())).unwrap_err();
        assert_eq!(e.kind(), "truncated");
        // A tool call carries no answer to judge.
        let tool = json!([{"type": "tool_use", "id": "t", "name": "f", "input": {}}]);
        assert!(check.check_message(Some(message(tool, "tool_use").as_bytes())).is_ok());
        assert!(check.check_message(None).is_err());
    }

    #[test]
    fn json_object_wants_json_content() {
        let format = raw(json!({"type": "json_object"}));
        assert!(check(&format, json!(r#"{"a": 1}"#), "stop").is_ok());
        assert!(matches!(
            check(&format, json!("Hello there."), "stop"),
            Err(Invalid::NotJson { .. })
        ));
        assert!(matches!(check(&format, json!(null), "stop"), Err(Invalid::NotJson { .. })));
    }

    #[test]
    fn every_choice_is_checked_and_tool_calls_and_refusals_pass() {
        let check = OutputCheck::compile(Some(&schema_format(person()))).unwrap().unwrap();
        let two = raw(json!([
            {"index": 0, "message": {"content": "{\"name\": \"A\", \"age\": 1}"}, "finish_reason": "stop"},
            {"index": 1, "message": {"content": "{\"name\": \"B\"}"}, "finish_reason": "stop"}]));
        assert!(matches!(check.check(Some(&two)), Err(Invalid::Schema { choice: 1, .. })));
        let tools = raw(json!([{"index": 0, "message": {"content": null,
            "tool_calls": [{"id": "t", "type": "function", "function": {"name": "f", "arguments": "{}"}}]},
            "finish_reason": "tool_calls"}]));
        assert!(check.check(Some(&tools)).is_ok());
        let refusal = raw(json!([{"index": 0, "message": {"content": null,
            "refusal": "I can't help with that."}, "finish_reason": "stop"}]));
        assert!(check.check(Some(&refusal)).is_ok());
        assert!(matches!(check.check(Some(&raw(json!([])))), Err(Invalid::Unreadable(_))));
        assert!(matches!(check.check(None), Err(Invalid::Unreadable(_))));
    }

    #[test]
    fn a_responses_answer_is_judged_by_its_output_text_and_calls_pass() {
        let check = OutputCheck::compile(Some(&schema_format(person()))).unwrap().unwrap();
        let response = |output: Value| {
            serde_json::to_vec(
                &json!({"object": "response", "status": "completed", "output": output}),
            )
            .unwrap()
        };
        let text = |t: &str| {
            json!([{"type": "reasoning", "summary": []},
                {"type": "message", "content": [{"type": "output_text", "text": t}]}])
        };
        let good = response(text("{\"name\": \"A\", \"age\": 1}"));
        assert!(check.check_response(Some(&good)).is_ok());
        let bad = response(text("{\"name\": \"A\"}"));
        assert!(matches!(check.check_response(Some(&bad)), Err(Invalid::Schema { .. })));
        let call = response(json!([{"type": "function_call", "name": "f", "arguments": "{}"}]));
        assert!(check.check_response(Some(&call)).is_ok());
        assert!(matches!(check.check_response(None), Err(Invalid::Unreadable(_))));
    }
}
