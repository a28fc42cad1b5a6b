//! What a translation refuses: the field, named in the terms of the format being read or
//! written, and a sentence for the client.

/// A request or answer a translation cannot take, naming the field that made it so.
///
/// `field` is the path in the format's own terms (`messages[2].content[0].tool_use_id` in a
/// Messages request, `messages[1].tool_calls[0].function.arguments` in a Chat request);
/// `message` is the whole sentence for the client and names the field itself, so the
/// `Display` of a refusal is just its message.
#[derive(Debug, Clone, PartialEq, Eq, thiserror::Error)]
#[error("{message}")]
pub struct Refusal {
    pub field: String,
    pub message: String,
}

impl Refusal {
    /// A refusal of `field` whose message is "`field`: what".
    pub fn at(field: impl Into<String>, what: impl std::fmt::Display) -> Self {
        let field = field.into();
        let message = format!("`{field}`: {what}");
        Self { field, message }
    }

    /// A serde error met while reading a body, at the path serde_path_to_error tracked.
    pub(crate) fn from_serde(err: serde_path_to_error::Error<serde_json::Error>) -> Self {
        let path = err.path().to_string();
        let inner = err.into_inner();
        // serde_json's Display appends " at line L column C", which names no field and
        // means nothing to a client that sent the body from an SDK.
        let text = inner.to_string();
        let what = match text.rfind(" at line ") {
            Some(cut) => text[..cut].to_string(),
            None => text,
        };
        if inner.is_syntax() || inner.is_eof() {
            return Self::at("body", format!("the body is not valid JSON ({what})"));
        }
        // A missing field is named itself, not the object that lacks it.
        if let Some(name) =
            what.strip_prefix("missing field `").and_then(|rest| rest.strip_suffix('`'))
        {
            let field = if path == "." { name.to_owned() } else { format!("{path}.{name}") };
            return Self::at(field, "field required");
        }
        // `.` is the path of the body itself (a body that is not a JSON object).
        let field = if path == "." { "body".to_string() } else { path };
        Self::at(field, what)
    }
}
