//! Anthropic's endpoint on the simulator's listener (`POST /v1/messages`): the scripted
//! behaviours in Anthropic's wire format ([`crate::anthropic`]).

use std::borrow::Cow;
use std::sync::atomic::Ordering;

use bytes::Bytes;
use http_body_util::BodyExt;
use hyper::body::Incoming;
use hyper::header::HeaderMap;
use hyper::{Request, StatusCode};

use super::conn::ConnFlags;
use super::response::{
    HttpResponse, insert_header, json_response, reply_text, status, stream_response,
};
use super::state::State;
use crate::anthropic::{self, MessagesRequest};
use crate::behaviour::{Behaviour, DEFAULT_CHUNKS, Reply, continues_at, sleep_ms};
use crate::body::Aborted;
use crate::openai::{self, ApiError};
use crate::stream::{self, StreamPlan, StreamWire};

/// Anthropic names its request id header `request-id`.
const REQUEST_ID: &str = "request-id";

pub const MESSAGES_PATH: &str = "/v1/messages";
pub const COUNT_TOKENS_PATH: &str = "/v1/messages/count_tokens";

/// A path (or a method on `/v1/messages`) Anthropic does not serve: its `not_found_error`.
pub fn not_found(state: &State, method: &str, path: &str) -> HttpResponse {
    error_response(&anthropic::not_found(method, path), &state.request_id())
}

/// Anthropic authenticates with `x-api-key` (checked, as for OpenAI, only when accepted keys
/// are set, and before the body).
fn authorize(state: &State, headers: &HeaderMap) -> Result<(), ApiError> {
    let keys = state.keys.lock();
    if keys.is_empty() {
        return Ok(());
    }
    match headers.get("x-api-key").and_then(|v| v.to_str().ok()) {
        Some(key) if keys.iter().any(|k| k == key.trim()) => Ok(()),
        present => Err(anthropic::auth_error(present.is_some())),
    }
}

/// `POST /v1/messages`.
pub async fn messages(
    state: &State,
    conn: &ConnFlags,
    req: Request<Incoming>,
) -> Result<HttpResponse, Aborted> {
    let (parts, body) = req.into_parts();
    let body = body.collect().await.map_err(|_| Aborted)?.to_bytes();
    state.requests.fetch_add(1, Ordering::Relaxed);
    let request_id = state.request_id();
    let parsed = anthropic::parse_request(&body);
    let model = match &parsed {
        Ok(request) => Some(Cow::Borrowed(request.model.as_str())),
        Err(_) => openai::request_model(&body).map(Cow::Owned),
    };
    let authorized = authorize(state, &parts.headers);
    let step = model
        .map(|model| state.take_step(model, &parts, &body, authorized.is_ok() && parsed.is_ok()));
    if let Err(err) = authorized {
        return Ok(error_response(&err, &request_id));
    }
    let request = match parsed {
        Ok(request) => request,
        Err(err) => return Ok(error_response(&err, &request_id)),
    };
    let default = Behaviour::default();
    let (script, position) = step.unwrap_or((None, 0));
    let behaviour = script.as_deref().unwrap_or(&default).at(position);
    respond(state, conn, behaviour, &request, request_id).await
}

/// `POST /v1/messages/count_tokens`: `{"input_tokens": N}`, counted as the simulated model
/// counts a prompt; not a completion (no script step is taken, `/_sim/stats` counts it apart).
pub async fn count_tokens(state: &State, req: Request<Incoming>) -> Result<HttpResponse, Aborted> {
    let (parts, body) = req.into_parts();
    let body = body.collect().await.map_err(|_| Aborted)?.to_bytes();
    state.token_counts.fetch_add(1, Ordering::Relaxed);
    let request_id = state.request_id();
    if let Err(err) = authorize(state, &parts.headers) {
        return Ok(error_response(&err, &request_id));
    }
    match anthropic::count_tokens(&body) {
        Ok(tokens) => {
            let body = serde_json::json!({"input_tokens": tokens}).to_string();
            Ok(ok(Bytes::from(body), &request_id))
        }
        Err(err) => Ok(error_response(&err, &request_id)),
    }
}

/// A scripted behaviour in Anthropic's wire format (the same behaviours as for OpenAI).
async fn respond(
    state: &State,
    conn: &ConnFlags,
    behaviour: &Behaviour,
    request: &MessagesRequest,
    request_id: String,
) -> Result<HttpResponse, Aborted> {
    let message = || anthropic::Message {
        id: anthropic::message_id(&state.completion_id()),
        model: request.model.clone(),
        prompt_tokens: request.prompt_tokens,
    };
    let tool_call = request.tool_call.as_ref();
    match behaviour {
        Behaviour::Ok(reply) => {
            if reply.rejects_prefill && request.prefill.is_some() {
                return Ok(error_response(&anthropic::prefill_unsupported(), &request_id));
            }
            sleep_ms(reply.delay_ms).await;
            if let Some(window) = reply.too_long(request.prompt_tokens) {
                let err = anthropic::context_length(window, request.prompt_tokens);
                return Ok(error_response(&err, &request_id));
            }
            let text = reply_text(reply.text.as_deref(), &request.model);
            // A tool call is not text a prefill can be the start of.
            let skip = match tool_call {
                Some(_) => 0,
                None => continues_at(&text, request.prefill.as_deref()),
            };
            if request.stream {
                let wire = message().stream(tool_call);
                let text = wire.text(text);
                let plan = StreamPlan::new(Box::new(wire), text, reply, None).continuing(skip);
                Ok(stream_response(plan.spawn(), REQUEST_ID, &request_id))
            } else {
                let rest = text.get(skip..).unwrap_or_default();
                Ok(ok(message().body(rest, tool_call), &request_id))
            }
        }
        Behaviour::Status(status) => {
            sleep_ms(status.delay_ms).await;
            let err = anthropic::status_error(
                status.status,
                &request.model,
                status.message.as_deref(),
                status.retry_after,
            );
            Ok(error_response(&err, &request_id))
        }
        Behaviour::Hang => std::future::pending().await,
        Behaviour::Reset => {
            conn.reset_on_close();
            Err(Aborted)
        }
        Behaviour::Malformed => {
            if request.stream {
                let mut frames = message().stream(None).head();
                frames.push(Bytes::from_static(anthropic::MALFORMED_FRAME));
                Ok(stream_response(stream::fixed(frames), REQUEST_ID, &request_id))
            } else {
                Ok(ok(Bytes::from_static(openai::MALFORMED_BODY), &request_id))
            }
        }
        Behaviour::StreamError(e) => {
            // Anthropic's in-band failure is an overload; its HTTP form is a 529.
            let text = e.message.as_deref().unwrap_or("Overloaded");
            if request.stream {
                let reply = Reply { chunks: DEFAULT_CHUNKS.max(e.after), ..Reply::default() };
                let wire = message().stream(None);
                let body = reply_text(None, &request.model);
                let plan =
                    StreamPlan::new(Box::new(wire), body, &reply, Some((e.after, text.to_owned())));
                Ok(stream_response(plan.spawn(), REQUEST_ID, &request_id))
            } else {
                let err = anthropic::status_error(529, &request.model, Some(text), None);
                Ok(error_response(&err, &request_id))
            }
        }
        Behaviour::Sequence(_) => {
            Box::pin(respond(state, conn, &Behaviour::default(), request, request_id)).await
        }
    }
}

fn ok(body: Bytes, request_id: &str) -> HttpResponse {
    let mut resp = json_response(StatusCode::OK, body);
    insert_header(&mut resp, REQUEST_ID, request_id);
    resp
}

fn error_response(err: &ApiError, request_id: &str) -> HttpResponse {
    let mut resp = json_response(status(err.status), anthropic::error_body(err, request_id));
    if let Some(secs) = err.retry_after {
        insert_header(&mut resp, "retry-after", &secs.to_string());
    }
    insert_header(&mut resp, REQUEST_ID, request_id);
    resp
}
