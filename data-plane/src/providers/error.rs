//! How an upstream call fails, as facts; what each failure means for the chain, the breaker
//! and the client is decided in one place, `crate::failure`.

use std::time::Duration;

use http::StatusCode;

/// The upstream's own error, as its body described it.
#[derive(Clone, Debug, Default, PartialEq, Eq)]
pub struct UpstreamError {
    pub message: String,
    pub kind: String,
    pub code: Option<String>,
    pub param: Option<String>,
}

/// The code every adapter gives a provider's refusal of a prompt longer than the model's
/// context (OpenAI's own code for it), so that one rule in `crate::failure` reads them all.
pub const CONTEXT_LENGTH_EXCEEDED: &str = "context_length_exceeded";

impl UpstreamError {
    /// The provider refused the prompt as longer than the model's context.
    pub fn is_context_length(&self) -> bool {
        self.code.as_deref() == Some(CONTEXT_LENGTH_EXCEEDED)
    }
}

/// How one upstream call failed.
#[derive(Debug, thiserror::Error)]
pub enum CallError {
    /// A request this provider cannot take (a feature it has no equivalent for), found
    /// while translating it, before any call. `param` names the field when it is known.
    #[error("{message}")]
    Unsupported { message: String, param: Option<String> },
    /// The translated body could not be encoded: a gateway bug, not the upstream's fault.
    #[error("encoding the request body: {0}")]
    Encode(#[source] serde_json::Error),
    /// The HTTP request could not be built from the catalog's URL and the credential.
    #[error("building the request: {0}")]
    Build(#[source] http::Error),
    /// No HTTP answer: refused, reset, DNS, TLS, a body cut short.
    #[error("connection failed: {0}")]
    Transport(String),
    /// No answer within the attempt's time.
    #[error("no answer within {0:?}")]
    Timeout(Duration),
    /// A 2xx whose body is not what the provider's format says.
    #[error("malformed response: {0}")]
    Malformed(String),
    /// An HTTP error status (or an error the provider reports in a 2xx body, under the
    /// status it means), with the wait its `Retry-After` asked for.
    #[error("HTTP {status}: {}", error.message)]
    Http { status: StatusCode, error: UpstreamError, retry_after: Option<Duration> },
    /// The provider has no usable credential on this node (a missing env var or file).
    #[error("no usable credential: {0}")]
    NoCredential(String),
}

impl CallError {
    /// An error status with no `Retry-After`.
    pub fn http(status: StatusCode, error: UpstreamError) -> Self {
        Self::Http { status, error, retry_after: None }
    }
}

/// How reading an upstream stream failed.
#[derive(Debug, thiserror::Error)]
pub enum StreamError {
    /// The connection broke, or the stream ended before its finish reason.
    #[error("upstream stream broke: {0}")]
    Connection(String),
    /// The stream cannot be read as the provider's format (an event past the size limit), or
    /// it ended unfinished after frames that did not parse.
    #[error("malformed upstream stream: {0}")]
    Malformed(String),
}
