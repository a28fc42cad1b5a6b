//! Errors returned to API clients, and the one place that renders them: the OpenAI error
//! envelope on `/v1`, the classic `success: false` body on `/chat/completions`, and the
//! headers that tell a client's retry logic what to do (docs/http-api.md, "Errors").

use std::time::{Duration, Instant};

use axum::Json;
use axum::http::{HeaderName, HeaderValue, StatusCode, header};
use axum::response::{IntoResponse, Response};
use serde_json::{Value, json};

use switchyard_catalog::Limits;

use crate::limits::Limit;
use crate::report::AttemptReport;

/// Which endpoint's body shape a response takes.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum Flavor {
    /// `/v1/chat/completions`: OpenAI-compatible.
    OpenAi,
    /// `/chat/completions`: `{"success", "data" | "error", "metadata"}`.
    Classic,
    /// `/v1/messages`: Anthropic's Messages API (docs/messages.md).
    Anthropic,
    /// `/v1/responses`: OpenAI's Responses API (docs/responses.md); errors in OpenAI's shape.
    Responses,
    /// `/v1/embeddings`: OpenAI's embeddings API, its errors in OpenAI's shape.
    Embeddings,
}

impl Flavor {
    /// The API surface a request came through, as metrics and events name it.
    pub fn surface(self) -> &'static str {
        match self {
            Self::OpenAi | Self::Classic => "chat",
            Self::Anthropic => "messages",
            Self::Responses => "responses",
            Self::Embeddings => "embeddings",
        }
    }

    /// The body field a multi-model answer's failover report rides in.
    pub fn report_field(self) -> &'static str {
        match self {
            Self::OpenAi | Self::Anthropic | Self::Responses | Self::Embeddings => "secureai",
            Self::Classic => "metadata",
        }
    }
}

/// Anthropic's `error.type` for an HTTP status, as its API maps them. A failed chain (502)
/// and a node that cannot take requests now (503) read as `overloaded_error`: the SDKs and
/// Claude Code treat that as "try later", which is what they mean.
pub fn anthropic_error_type(status: StatusCode) -> &'static str {
    match status.as_u16() {
        401 => "authentication_error",
        403 => "permission_error",
        404 => "not_found_error",
        413 => "request_too_large",
        429 => "rate_limit_error",
        502 | 503 | 529 => "overloaded_error",
        500..=599 => "api_error",
        _ => "invalid_request_error",
    }
}

#[derive(Debug, thiserror::Error)]
pub enum ApiError {
    /// The client's request is wrong; `param` names the field.
    #[error("{message}")]
    InvalidRequest { message: String, param: Option<String>, code: Option<&'static str> },
    #[error("{message}")]
    ModelNotFound { message: String, param: String },
    #[error("{message}")]
    ModelNotAllowed { message: String, param: String },
    #[error("{0}")]
    Unauthorized(&'static str),
    #[error("request body is larger than {limit} bytes")]
    PayloadTooLarge { limit: usize },
    #[error("node has no config yet")]
    NotReady,
    /// The node is shutting down and takes no new requests; another node can serve them.
    #[error("this node is shutting down; send the request to another node")]
    Draining,
    /// The request body did not arrive in full within `--body-read-timeout` of its head.
    #[error("the request body did not arrive within {} ms", after.as_millis())]
    BodyTimeout { after: std::time::Duration },
    /// A non-retryable error from the upstream (the client's own 4xx), passed on as is.
    #[error("{message}")]
    Upstream {
        status: StatusCode,
        message: String,
        kind: String,
        code: Option<String>,
        param: Option<String>,
        attempts: Option<Vec<AttemptReport>>,
    },
    /// Every attempt failed (or the chain ended on a reason outside `on`).
    #[error("{message}")]
    AllFailed {
        status: StatusCode,
        message: String,
        attempts: Option<Vec<AttemptReport>>,
        /// On a 429: the soonest any upstream said, with `Retry-After`, it would take calls
        /// again; `None` when none said.
        retry_at: Option<Instant>,
    },
    /// The key reached one of its own limits (docs/limits.md); nothing was sent upstream.
    #[error("{}", limited_message(*limit, limits, *retry_after))]
    Limited { limit: Limit, limits: Limits, retry_after: Duration },
    /// The request body stopped arriving before its end (the client reset the connection,
    /// or sent less than its `Content-Length`): not a body that was too large.
    #[error("the request body did not arrive whole: {0}")]
    BodyIncomplete(String),
    /// The node could not encode its own answer (a bug): never reported as a failed chain.
    #[error("the gateway could not encode its answer")]
    Internal,
    /// No endpoint at this path (404), or not with this method (405).
    #[error("{}", unknown_url_message(*status, method, path))]
    UnknownUrl { status: StatusCode, method: http::Method, path: String },
}

fn unknown_url_message(status: StatusCode, method: &http::Method, path: &str) -> String {
    if status == StatusCode::METHOD_NOT_ALLOWED {
        format!("{path} does not take {method} requests (docs/http-api.md lists the endpoints).")
    } else {
        format!("Unknown URL: {method} {path} (docs/http-api.md lists the endpoints).")
    }
}

fn limited_message(limit: Limit, limits: &Limits, retry_after: Duration) -> String {
    let (what, value) = match limit {
        Limit::Rpm => ("requests per minute", limits.rpm.map(|v| v.to_string())),
        Limit::Tpm => ("tokens per minute", limits.tpm.map(|v| v.to_string())),
        Limit::TokensPerDay => ("tokens per day", limits.tokens_per_day.map(|v| v.to_string())),
        Limit::UsdPerDay => ("US dollars per day", limits.usd_per_day.map(|v| v.to_string())),
    };
    format!(
        "This API key reached its limit of {} {what} (the gateway's, for the whole fleet); \
         retry after {} s.",
        value.unwrap_or_default(),
        retry_after.as_secs().max(1)
    )
}

/// `wait` in whole seconds, rounded up, so a client never comes back early.
fn whole_seconds(wait: Duration) -> u64 {
    wait.as_secs() + u64::from(wait.subsec_nanos() > 0)
}

/// The OpenAI SDKs' own header: `false` makes them raise at once instead of retrying.
pub const SHOULD_RETRY: HeaderName = HeaderName::from_static("x-should-retry");

/// `Retry-After` of an all-rate-limited 429 when no upstream sent one (docs/http-api.md,
/// "Errors"): the shortest wait the header can say and still slow a client down.
pub const DEFAULT_RETRY_AFTER: Duration = Duration::from_secs(1);

impl ApiError {
    pub fn invalid(param: impl Into<String>, message: impl Into<String>) -> Self {
        Self::InvalidRequest { message: message.into(), param: Some(param.into()), code: None }
    }

    pub fn status(&self) -> StatusCode {
        match self {
            Self::InvalidRequest { .. } | Self::ModelNotFound { .. } => StatusCode::BAD_REQUEST,
            Self::ModelNotAllowed { .. } => StatusCode::FORBIDDEN,
            Self::Unauthorized(_) => StatusCode::UNAUTHORIZED,
            Self::PayloadTooLarge { .. } => StatusCode::PAYLOAD_TOO_LARGE,
            Self::NotReady | Self::Draining => StatusCode::SERVICE_UNAVAILABLE,
            Self::BodyTimeout { .. } => StatusCode::REQUEST_TIMEOUT,
            Self::Upstream { status, .. } | Self::AllFailed { status, .. } => *status,
            Self::Limited { .. } => StatusCode::TOO_MANY_REQUESTS,
            Self::UnknownUrl { status, .. } => *status,
            Self::BodyIncomplete(_) => StatusCode::BAD_REQUEST,
            Self::Internal => StatusCode::INTERNAL_SERVER_ERROR,
        }
    }

    /// The chain ended in `all_models_failed` (429 or 502): where a degraded answer, when
    /// the key or request has one, replaces the error.
    pub fn is_all_models_failed(&self) -> bool {
        matches!(self, Self::AllFailed { status, .. }
            if *status == StatusCode::TOO_MANY_REQUESTS || *status == StatusCode::BAD_GATEWAY)
    }

    /// A short label for metrics.
    pub fn label(&self) -> &'static str {
        match self {
            Self::InvalidRequest { .. } => "invalid_request",
            Self::ModelNotFound { .. } => "model_not_found",
            Self::ModelNotAllowed { .. } => "model_not_allowed",
            Self::Unauthorized(_) => "unauthorized",
            Self::PayloadTooLarge { .. } => "payload_too_large",
            Self::NotReady => "not_ready",
            Self::Draining => "draining",
            Self::BodyTimeout { .. } => "request_timeout",
            Self::Upstream { .. } => "upstream_client_error",
            Self::AllFailed { .. } => "all_models_failed",
            Self::Limited { limit, .. } => limit.code(),
            Self::UnknownUrl { .. } => "unknown_url",
            Self::BodyIncomplete(_) => "body_incomplete",
            Self::Internal => "internal_error",
        }
    }

    fn envelope(&self) -> (Value, Option<&[AttemptReport]>) {
        let (kind, code, param): (&str, Option<&str>, Option<&str>) = match self {
            Self::InvalidRequest { param, code, .. } => {
                ("invalid_request_error", *code, param.as_deref())
            }
            Self::ModelNotFound { param, .. } => {
                ("invalid_request_error", Some("model_not_found"), Some(param))
            }
            Self::ModelNotAllowed { param, .. } => {
                ("invalid_request_error", Some("model_not_allowed"), Some(param))
            }
            Self::Unauthorized(_) => ("invalid_request_error", Some("invalid_api_key"), None),
            Self::PayloadTooLarge { .. } => {
                ("invalid_request_error", Some("request_too_large"), None)
            }
            Self::NotReady => ("server_error", Some("not_ready"), None),
            Self::Draining => ("server_error", Some("draining"), None),
            Self::BodyTimeout { .. } => ("invalid_request_error", Some("request_timeout"), None),
            Self::Upstream { kind, code, param, .. } => {
                (kind.as_str(), code.as_deref(), param.as_deref())
            }
            Self::AllFailed { status, .. } => {
                let kind = if *status == StatusCode::TOO_MANY_REQUESTS {
                    "rate_limit_error"
                } else {
                    "server_error"
                };
                (kind, Some("all_models_failed"), None)
            }
            Self::Limited { limit, .. } => ("rate_limit_error", Some(limit.code()), None),
            Self::UnknownUrl { status, .. } if *status == StatusCode::METHOD_NOT_ALLOWED => {
                ("invalid_request_error", Some("method_not_allowed"), None)
            }
            Self::UnknownUrl { .. } => ("not_found_error", Some("unknown_url"), None),
            Self::BodyIncomplete(_) => ("invalid_request_error", Some("body_incomplete"), None),
            Self::Internal => ("server_error", Some("internal_error"), None),
        };
        let attempts = match self {
            Self::Upstream { attempts, .. } | Self::AllFailed { attempts, .. } => {
                attempts.as_deref()
            }
            _ => None,
        };
        let mut body = json!({"error": {
            "message": self.to_string(), "type": kind, "param": param, "code": code,
        }});
        // The OpenAI SDKs keep only `error` of an error body: the attempts go there too.
        if let Some(attempts) = attempts {
            body["error"]["attempts"] = json!(attempts);
        }
        (body, attempts)
    }

    /// What a client's retry logic should do with this error. A failed chain already tried
    /// every model it had, each under its retry policy: the same request again at once
    /// would fail the same way, so the SDKs are told not to (`x-should-retry: false`). An
    /// all-rate-limited chain says when it could serve (`Retry-After`, whole seconds,
    /// rounded up so a client never comes back early).
    fn retry_headers(&self, now: Instant) -> Option<(HeaderName, HeaderValue)> {
        match self {
            Self::AllFailed { status: StatusCode::BAD_GATEWAY, .. } => {
                Some((SHOULD_RETRY, HeaderValue::from_static("false")))
            }
            Self::AllFailed { status: StatusCode::TOO_MANY_REQUESTS, retry_at, .. } => {
                let wait =
                    retry_at.map_or(DEFAULT_RETRY_AFTER, |at| at.saturating_duration_since(now));
                Some((header::RETRY_AFTER, HeaderValue::from(whole_seconds(wait))))
            }
            // At least a second: a client that waits this long finds room.
            Self::Limited { retry_after, .. } => {
                Some((header::RETRY_AFTER, HeaderValue::from(whole_seconds(*retry_after).max(1))))
            }
            _ => None,
        }
    }

    pub fn render(&self, flavor: Flavor) -> Response {
        let (mut body, attempts) = self.envelope();
        match flavor {
            Flavor::OpenAi | Flavor::Responses | Flavor::Embeddings => {
                if let Some(attempts) = attempts {
                    body["secureai"] = json!({"attempts": attempts});
                }
            }
            Flavor::Anthropic => {
                // Anthropic's envelope; the gateway's own code and the attempts stay under
                // `error`, which is what the Anthropic SDKs keep of an error body.
                let mut error = json!({
                    "type": anthropic_error_type(self.status()),
                    "message": self.to_string(),
                });
                for field in ["code", "param", "attempts"] {
                    if let Some(value) = body["error"].get(field).filter(|v| !v.is_null()) {
                        error[field] = value.clone();
                    }
                }
                body = json!({"type": "error", "error": error});
                if let Some(attempts) = attempts {
                    body["secureai"] = json!({"attempts": attempts});
                }
            }
            Flavor::Classic => {
                let headline = match self {
                    Self::AllFailed { attempts: Some(_), .. } => "All model attempts failed",
                    _ => "Request failed",
                };
                let mut classic = json!({
                    "success": false,
                    "error": headline,
                    "message": self.to_string(),
                    "code": body["error"]["code"],
                    "param": body["error"]["param"],
                });
                if let Some(attempts) = attempts {
                    classic["attempts"] = json!(attempts);
                }
                body = classic;
            }
        }
        let mut response = (self.status(), Json(body)).into_response();
        if let Some((name, value)) = self.retry_headers(Instant::now()) {
            response.headers_mut().insert(name, value);
        }
        response
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::report::{AttemptReason, AttemptStatus};
    use switchyard_catalog::FailoverReason;

    fn failed(status: StatusCode, retry_at: Option<Instant>) -> ApiError {
        let attempt = AttemptReport {
            model: "a".into(),
            status: AttemptStatus::Failed,
            reason: Some(AttemptReason::Failover(FailoverReason::ServerError)),
            latency_ms: 1,
            retries: 0,
            probe: false,
            injected: None,
            deployment: None,
            local_limit: false,
        };
        ApiError::AllFailed { status, message: "m".into(), attempts: Some(vec![attempt]), retry_at }
    }

    #[test]
    fn an_answer_the_node_cannot_encode_is_an_internal_error_not_a_failed_chain() {
        let e = ApiError::Internal;
        assert_eq!((e.status(), e.label()), (StatusCode::INTERNAL_SERVER_ERROR, "internal_error"));
        assert!(!e.is_all_models_failed(), "no degraded answer replaces it");
        let (body, attempts) = e.envelope();
        assert_eq!(
            (&body["error"]["type"], &body["error"]["code"]),
            (&json!("server_error"), &json!("internal_error"))
        );
        assert!(attempts.is_none());
        assert_eq!(e.retry_headers(Instant::now()), None);
        let anthropic = e.render(Flavor::Anthropic);
        assert_eq!(anthropic.status(), StatusCode::INTERNAL_SERVER_ERROR);
    }

    #[test]
    fn the_attempts_of_a_failed_chain_are_under_error_too() {
        let (body, _) = failed(StatusCode::BAD_GATEWAY, None).envelope();
        assert_eq!(body["error"]["attempts"][0]["model"], "a", "{body}");
        assert_eq!(body["error"]["code"], "all_models_failed");
        let (body, _) = ApiError::NotReady.envelope();
        assert!(body["error"].get("attempts").is_none(), "{body}");
    }

    #[test]
    fn a_failed_chain_is_not_to_be_retried_and_a_rate_limited_one_says_when() {
        let now = Instant::now();
        let header = |e: ApiError| {
            e.retry_headers(now).map(|(n, v)| format!("{n}: {}", v.to_str().unwrap()))
        };
        let bad_gateway = header(failed(StatusCode::BAD_GATEWAY, None));
        assert_eq!(bad_gateway.as_deref(), Some("x-should-retry: false"));
        let soon = Some(now + Duration::from_millis(2_001));
        let rate_limited = header(failed(StatusCode::TOO_MANY_REQUESTS, soon));
        assert_eq!(rate_limited.as_deref(), Some("retry-after: 3"), "rounded up");
        let exact =
            header(failed(StatusCode::TOO_MANY_REQUESTS, Some(now + Duration::from_secs(2))));
        assert_eq!(exact.as_deref(), Some("retry-after: 2"));
        let unsaid = header(failed(StatusCode::TOO_MANY_REQUESTS, None));
        assert_eq!(unsaid.as_deref(), Some("retry-after: 1"), "DEFAULT_RETRY_AFTER");
        let past =
            header(failed(StatusCode::TOO_MANY_REQUESTS, now.checked_sub(Duration::from_secs(1))));
        assert_eq!(past.as_deref(), Some("retry-after: 0"));
        assert_eq!(header(ApiError::Draining), None);
        assert_eq!(header(failed(StatusCode::INTERNAL_SERVER_ERROR, None)), None);
    }
}
