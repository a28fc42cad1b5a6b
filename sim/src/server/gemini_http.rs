//! Gemini's endpoints on the simulator's listener
//! (`POST /v1beta/models/{model}:generateContent` and `:streamGenerateContent`): the scripted
//! behaviours in Gemini's wire format ([`crate::gemini`]).

use std::borrow::Cow;
use std::sync::atomic::Ordering;

use bytes::Bytes;
use http_body_util::BodyExt;
use hyper::body::Incoming;
use hyper::{Request, StatusCode};

use super::conn::ConnFlags;
use super::query::query_param;
use super::response::{
    HttpResponse, insert_header, json_response, reply_text, status, stream_response,
};
use super::state::State;
use crate::behaviour::{Behaviour, DEFAULT_CHUNKS, Reply, continues_at, sleep_ms};
use crate::body::Aborted;
use crate::embed;
use crate::gemini::{self, ApiError, GenerateRequest, ResponseStream};
use crate::stream::{self, StreamPlan};

const REQUEST_ID: &str = "x-request-id";

/// A path Google does not serve, in Google's error envelope.
pub fn not_found(state: &State, method: &str, path: &str) -> HttpResponse {
    error_response(&ApiError::not_found(method, path), &state.request_id())
}

/// Google reads the key from `x-goog-api-key` or `?key=`; checked only when accepted keys
/// are set, and before the body, as for OpenAI.
fn authorize(state: &State, parts: &hyper::http::request::Parts) -> Result<(), ApiError> {
    let keys = state.keys.lock();
    if keys.is_empty() {
        return Ok(());
    }
    let header = parts.headers.get("x-goog-api-key").and_then(|v| v.to_str().ok());
    let query = parts.uri.query().and_then(|q| query_param(q, "key"));
    match header.map(str::to_owned).or(query) {
        Some(key) if keys.iter().any(|k| *k == key.trim()) => Ok(()),
        Some(_) => Err(ApiError::invalid_key()),
        None => Err(ApiError::missing_key()),
    }
}

/// `POST /v1beta/models/{model}:generateContent` / `:streamGenerateContent`.
pub async fn generate(
    state: &State,
    conn: &ConnFlags,
    req: Request<Incoming>,
    model: String,
    stream: bool,
) -> Result<HttpResponse, Aborted> {
    let (parts, body) = req.into_parts();
    let body = body.collect().await.map_err(|_| Aborted)?.to_bytes();
    state.requests.fetch_add(1, Ordering::Relaxed);
    let request_id = state.request_id();
    let parsed = gemini::parse_request(&model, stream, &body);
    let authorized = authorize(state, &parts);
    let advance = authorized.is_ok() && parsed.is_ok();
    let (script, position) = state.take_step(Cow::Borrowed(&model), &parts, &body, advance);
    if let Err(err) = authorized {
        return Ok(error_response(&err, &request_id));
    }
    let request = match parsed {
        Ok(request) => request,
        Err(err) => return Ok(error_response(&err, &request_id)),
    };
    let default = Behaviour::default();
    let behaviour = script.as_deref().unwrap_or(&default).at(position);
    respond(state, conn, behaviour, &request, request_id).await
}

/// `POST /v1beta/models/{model}:embedContent` / `:batchEmbedContents`: the model's scripted
/// behaviour, an `ok` answering vectors ([`crate::embed`]).
pub async fn embed(
    state: &State,
    conn: &ConnFlags,
    req: Request<Incoming>,
    model: String,
    batch: bool,
) -> Result<HttpResponse, Aborted> {
    let (parts, body) = req.into_parts();
    let body = body.collect().await.map_err(|_| Aborted)?.to_bytes();
    state.requests.fetch_add(1, Ordering::Relaxed);
    let request_id = state.request_id();
    let parsed = embed::parse_gemini(&model, batch, &body);
    let authorized = authorize(state, &parts);
    let advance = authorized.is_ok() && parsed.is_ok();
    let (script, position) = state.take_step(Cow::Borrowed(&model), &parts, &body, advance);
    if let Err(err) = authorized {
        return Ok(error_response(&err, &request_id));
    }
    let request = match parsed {
        Ok(request) => request,
        Err(err) => return Ok(error_response(&err, &request_id)),
    };
    let default = Behaviour::default();
    let behaviour = script.as_deref().unwrap_or(&default).at(position);
    match behaviour {
        Behaviour::Ok(reply) => {
            sleep_ms(reply.delay_ms).await;
            Ok(ok(embed::gemini_body(&request, batch, reply.dimensions), &request_id))
        }
        Behaviour::Status(status) => {
            sleep_ms(status.delay_ms).await;
            let err = gemini::status_error(
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
        Behaviour::Malformed => Ok(ok(Bytes::from_static(gemini::MALFORMED_BODY), &request_id)),
        Behaviour::StreamError(e) => {
            let message = e.message.as_deref().unwrap_or("An internal error has occurred.");
            let err = gemini::status_error(500, &request.model, Some(message), None);
            Ok(error_response(&err, &request_id))
        }
        Behaviour::Sequence(_) => Ok(ok(embed::gemini_body(&request, batch, None), &request_id)),
    }
}

async fn respond(
    state: &State,
    conn: &ConnFlags,
    behaviour: &Behaviour,
    request: &GenerateRequest,
    request_id: String,
) -> Result<HttpResponse, Aborted> {
    let id = state.completion_id();
    let wire = || ResponseStream {
        response_id: id.trim_start_matches("chatcmpl-").to_owned(),
        model: request.model.clone(),
        prompt_tokens: request.prompt_tokens,
    };
    match behaviour {
        Behaviour::Ok(reply) => {
            if reply.rejects_prefill && request.prefill.is_some() {
                return Ok(error_response(&ApiError::prefill_unsupported(), &request_id));
            }
            sleep_ms(reply.delay_ms).await;
            if let Some(window) = reply.too_long(request.prompt_tokens) {
                let err = ApiError::context_length(window, request.prompt_tokens);
                return Ok(error_response(&err, &request_id));
            }
            let text = reply_text(reply.text.as_deref(), &request.model);
            let skip = continues_at(&text, request.prefill.as_deref());
            let w = wire();
            match (&request.call, request.stream) {
                (Some(call), true) => {
                    let frames = vec![w.response().call_chunk(call, w.prompt_tokens)];
                    Ok(stream_response(stream::fixed(frames), REQUEST_ID, &request_id))
                }
                (Some(call), false) => {
                    Ok(ok(w.response().call_body(call, w.prompt_tokens), &request_id))
                }
                (None, true) => {
                    let plan = StreamPlan::new(Box::new(w), text, reply, None).continuing(skip);
                    Ok(stream_response(plan.spawn(), REQUEST_ID, &request_id))
                }
                (None, false) => {
                    let rest = text.get(skip..).unwrap_or_default();
                    Ok(ok(w.response().body(rest, w.prompt_tokens), &request_id))
                }
            }
        }
        Behaviour::Status(status) => {
            sleep_ms(status.delay_ms).await;
            let err = gemini::status_error(
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
                let frames = vec![Bytes::from_static(gemini::MALFORMED_FRAME)];
                Ok(stream_response(stream::fixed(frames), REQUEST_ID, &request_id))
            } else {
                Ok(ok(Bytes::from_static(gemini::MALFORMED_BODY), &request_id))
            }
        }
        Behaviour::StreamError(e) => {
            let message = e.message.as_deref().unwrap_or(
                "An internal error has occurred. Please retry or report in \
                 https://developers.generativeai.google/guide/troubleshooting",
            );
            if request.stream {
                let reply = Reply { chunks: DEFAULT_CHUNKS.max(e.after), ..Reply::default() };
                let text = reply_text(None, &request.model);
                let plan = StreamPlan::new(
                    Box::new(wire()),
                    text,
                    &reply,
                    Some((e.after, message.to_owned())),
                );
                Ok(stream_response(plan.spawn(), REQUEST_ID, &request_id))
            } else {
                let err = gemini::status_error(500, &request.model, Some(message), None);
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
    let mut resp = json_response(status(err.status), err.body());
    if let Some(secs) = err.retry_after {
        insert_header(&mut resp, "retry-after", &secs.to_string());
    }
    insert_header(&mut resp, REQUEST_ID, request_id);
    resp
}
