//! Anthropic's errors, read for both the translated and the native path: its error body as
//! an [`UpstreamError`] in OpenAI's terms, and the status an error type has when it arrives
//! in a 200.

use http::StatusCode;
use switchyard_wire::messages;

use crate::providers::error::{CONTEXT_LENGTH_EXCEEDED, CallError, UpstreamError};

/// Anthropic's error body `{"type":"error","error":{"type","message"},"request_id"}` (API
/// reference, "Errors"). `kind` is the OpenAI error type the same failure has there (what
/// OpenAI clients and the in-band classifier understand); `code` keeps Anthropic's type.
/// Anything else becomes a generic message for its status (raw bodies are not shown).
pub fn parse_error(status: StatusCode, body: &[u8]) -> UpstreamError {
    match messages::parse_error(body) {
        Some(error) => {
            // Anthropic's refusal of a prompt longer than the model's context is a 400
            // `invalid_request_error` whose message says "prompt is too long: N tokens > M
            // maximum" (its API reference, "Errors"; the messages quoted by SDK users).
            let code = if error.kind == "invalid_request_error"
                && error.message.to_ascii_lowercase().starts_with("prompt is too long")
            {
                Some(CONTEXT_LENGTH_EXCEEDED.to_owned())
            } else {
                (!error.kind.is_empty()).then(|| error.kind.clone())
            };
            UpstreamError {
                kind: openai_kind(&error.kind, status).to_owned(),
                message: error.message,
                code,
                param: None,
            }
        }
        None => UpstreamError {
            message: format!("The upstream provider returned HTTP {}.", status.as_u16()),
            kind: openai_kind("", status).to_owned(),
            code: None,
            param: None,
        },
    }
}

/// Anthropic's error types (API reference, "Errors": 400 invalid_request_error, 401
/// authentication_error, 403 permission_error, 404 not_found_error, 413 request_too_large,
/// 429 rate_limit_error, 500 api_error, 529 overloaded_error) as OpenAI's. Authentication
/// and permission keep their names: they are the gateway's credential failing, and must not
/// read as the client's `invalid_request_error`.
fn openai_kind(anthropic: &str, status: StatusCode) -> &'static str {
    match anthropic {
        "invalid_request_error" | "not_found_error" | "request_too_large" => {
            "invalid_request_error"
        }
        "authentication_error" => "authentication_error",
        "permission_error" => "permission_error",
        "rate_limit_error" => "rate_limit_error",
        "api_error" | "overloaded_error" | "timeout_error" => "server_error",
        _ if status.is_server_error() || status == StatusCode::OK => "server_error",
        _ if status == StatusCode::TOO_MANY_REQUESTS => "rate_limit_error",
        _ => "invalid_request_error",
    }
}

/// The HTTP status Anthropic sends with an error type, for errors that arrive in a 200.
fn status_of(anthropic: &str) -> StatusCode {
    let code = match anthropic {
        "invalid_request_error" => 400,
        "authentication_error" => 401,
        "permission_error" => 403,
        "not_found_error" => 404,
        "request_too_large" => 413,
        "rate_limit_error" => 429,
        "overloaded_error" => 529,
        _ => 500,
    };
    StatusCode::from_u16(code).unwrap_or(StatusCode::INTERNAL_SERVER_ERROR)
}

/// An error object in a 200 (seen from proxies in front of Anthropic): the error its type
/// names, with the status Anthropic sends it with.
pub fn in_ok(body: &[u8]) -> CallError {
    let error = parse_error(StatusCode::OK, body);
    let status = error.code.as_deref().map_or(StatusCode::INTERNAL_SERVER_ERROR, status_of);
    CallError::http(status, error)
}
