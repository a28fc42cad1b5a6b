//! Errors returned to API clients, and the one place that renders them: the OpenAI error
//! envelope on `/v1`, the classic `success: false` body on `/chat/completions`.

use axum::Json;
use axum::http::StatusCode;
use axum::response::{IntoResponse, Response};
use serde_json::{Value, json};

use std::time::Duration;

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
    AllFailed { status: StatusCode, message: String, attempts: Option<Vec<AttemptReport>> },
    /// The key reached one of its own limits (docs/limits.md); nothing was sent upstream.
    #[error("{}", limited_message(*limit, limits, *retry_after))]
    Limited { limit: Limit, limits: Limits, retry_after: Duration },
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
        };
        let attempts = match self {
            Self::Upstream { attempts, .. } | Self::AllFailed { attempts, .. } => {
                attempts.as_deref()
            }
            _ => None,
        };
        let body = json!({"error": {
            "message": self.to_string(), "type": kind, "param": param, "code": code,
        }});
        (body, attempts)
    }

    pub fn render(&self, flavor: Flavor) -> Response {
        let (mut body, attempts) = self.envelope();
        match flavor {
            Flavor::OpenAi => {
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
        if let Self::Limited { retry_after, .. } = self {
            // Whole seconds, rounded up: a client that waits this long finds room.
            let secs = retry_after.as_millis().div_ceil(1000).max(1);
            if let Ok(value) = axum::http::HeaderValue::from_str(&secs.to_string()) {
                response.headers_mut().insert(axum::http::header::RETRY_AFTER, value);
            }
        }
        response
    }
}
