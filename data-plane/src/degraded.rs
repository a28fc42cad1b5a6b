//! The degraded answer (docs/http-api.md, "Degraded answers"): when no model of a chain can
//! serve and the key or the request designed an answer for that moment, the client gets it
//! as an ordinary completion, labelled as what it is — never a spinner followed by a generic
//! error, never a weaker answer passed off as the model's.

use axum::http::{HeaderName, HeaderValue, StatusCode, header};
use axum::response::{IntoResponse, Response};
use serde_json::{Value, json};

use crate::error::Flavor;
use crate::report::AttemptReport;

/// The `model` of every degraded answer.
pub const MODEL: &str = "switchyard/degraded";
/// Set to `true` on every degraded answer, so a client can tell without parsing the body.
pub const HEADER: HeaderName = HeaderName::from_static("x-switchyard-degraded");

#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum Reason {
    /// Every model was tried (or skipped) and none served.
    AllModelsFailed,
    /// Every model's breaker was open and none due for a probe; nothing was tried
    /// (`when_all_open`).
    AllBreakersOpen,
}

impl Reason {
    pub fn as_str(self) -> &'static str {
        match self {
            Reason::AllModelsFailed => "all_models_failed",
            Reason::AllBreakersOpen => "all_breakers_open",
        }
    }
}

pub struct Answer<'a> {
    pub message: &'a str,
    pub reason: Reason,
    pub requested_model: &'a str,
    pub attempts: &'a [AttemptReport],
    pub stream: bool,
    pub flavor: Flavor,
}

/// The report every degraded answer carries (`secureai` on `/v1`, `metadata` on the classic
/// endpoint): which model was asked for, why the answer is degraded, what each attempt did.
fn report(a: &Answer<'_>) -> Value {
    json!({
        "requested_model": a.requested_model,
        "served_model": MODEL,
        "degraded": {"reason": a.reason.as_str()},
        "failover": {"occurred": true, "attempts": a.attempts},
    })
}

pub fn respond(a: Answer<'_>) -> Response {
    let id = format!("chatcmpl-degraded-{:016x}", rand::random::<u64>());
    let created = switchyard_time::now_ms() / 1000;
    let mut response = if a.stream {
        // One content chunk that also ends the answer, then the stream's end.
        let mut chunk = json!({
            "id": id, "object": "chat.completion.chunk", "created": created, "model": MODEL,
            "choices": [{"index": 0, "delta": {"role": "assistant", "content": a.message},
                         "finish_reason": "stop"}],
        });
        // Where each endpoint's streams carry the report.
        let field = a.flavor.report_field();
        chunk[field] = report(&a);
        let body = match a.flavor {
            Flavor::Anthropic => {
                let frames = crate::messages::degraded(a.message, MODEL, &report(&a), true);
                String::from_utf8_lossy(&frames).into_owned()
            }
            Flavor::Responses => {
                let report = serde_json::value::to_raw_value(&report(&a)).unwrap_or_default();
                let frames = crate::responses::degraded(a.message, MODEL, &report, true);
                String::from_utf8_lossy(&frames).into_owned()
            }
            Flavor::OpenAi | Flavor::Classic | Flavor::Embeddings => {
                format!("data: {chunk}\n\ndata: [DONE]\n\n")
            }
        };
        let mut response = (StatusCode::OK, body).into_response();
        let headers = response.headers_mut();
        headers.insert(header::CONTENT_TYPE, HeaderValue::from_static("text/event-stream"));
        headers.insert(header::CACHE_CONTROL, HeaderValue::from_static("no-cache"));
        response
    } else {
        let completion = || {
            json!({
                "id": id, "object": "chat.completion", "created": created, "model": MODEL,
                "choices": [{"index": 0, "message": {"role": "assistant", "content": a.message},
                             "finish_reason": "stop"}],
                "usage": {"prompt_tokens": 0, "completion_tokens": 0, "total_tokens": 0},
            })
        };
        match a.flavor {
            // An embeddings chain has no degraded answer (`chain::resolve`): never here.
            Flavor::OpenAi | Flavor::Embeddings => {
                let mut body = completion();
                body["secureai"] = report(&a);
                axum::Json(body).into_response()
            }
            Flavor::Classic => {
                let body = json!({"success": true, "data": completion(), "metadata": report(&a)});
                axum::Json(body).into_response()
            }
            Flavor::Anthropic => {
                let body = crate::messages::degraded(a.message, MODEL, &report(&a), false);
                ([(header::CONTENT_TYPE, "application/json")], body).into_response()
            }
            Flavor::Responses => {
                let report = serde_json::value::to_raw_value(&report(&a)).unwrap_or_default();
                let body = crate::responses::degraded(a.message, MODEL, &report, false);
                ([(header::CONTENT_TYPE, "application/json")], body).into_response()
            }
        }
    };
    // Plain or streamed, the answer names what served in its headers as a stream does, for
    // clients that keep no unknown body field (docs/clients.md).
    let headers = response.headers_mut();
    headers.insert(HEADER, HeaderValue::from_static("true"));
    headers.insert("x-served-model", HeaderValue::from_static(MODEL));
    if let Ok(requested) = HeaderValue::from_str(a.requested_model) {
        headers.insert("x-requested-model", requested);
    }
    response
}
