//! OpenAI's endpoints on the simulator's listener (`POST /v1/chat/completions`, Azure
//! OpenAI's `POST /openai/deployments/{name}/chat/completions`, `POST /v1/responses` and
//! Azure's `POST /openai/v1/responses`, `GET /v1/models`): the scripted behaviours in OpenAI's
//! wire formats ([`crate::openai`], [`crate::responses`]).

use std::borrow::Cow;
use std::sync::atomic::Ordering;

use bytes::Bytes;
use http_body_util::BodyExt;
use hyper::body::Incoming;
use hyper::header::{self, HeaderMap};
use hyper::{Request, StatusCode};

use super::conn::ConnFlags;
use super::response::{
    HttpResponse, insert_header, json_response, reply_text, status, stream_response,
};
use super::state::State;
use crate::behaviour::{Behaviour, DEFAULT_CHUNKS, Reply, StatusReply, continues_at, sleep_ms};
use crate::body::Aborted;
use crate::embed;
use crate::openai::{self, ApiError, ChatRequest, Completion, CompletionStream};
use crate::responses::{self, ResponsesRequest};
use crate::stream::{self, StreamPlan, StreamWire};

/// OpenAI's request id header.
const REQUEST_ID: &str = "x-request-id";

/// Whether `path` is a chat-completions endpoint: OpenAI's, or an Azure deployment's.
pub fn is_chat_path(path: &str) -> bool {
    path == "/v1/chat/completions"
        || path
            .strip_prefix("/openai/deployments/")
            .and_then(|rest| rest.strip_suffix("/chat/completions"))
            .is_some_and(|deployment| !deployment.is_empty() && !deployment.contains('/'))
}

/// Whether `path` is an embeddings endpoint: OpenAI's, or an Azure deployment's.
pub fn is_embeddings_path(path: &str) -> bool {
    path == "/v1/embeddings"
        || path
            .strip_prefix("/openai/deployments/")
            .and_then(|rest| rest.strip_suffix("/embeddings"))
            .is_some_and(|deployment| !deployment.is_empty() && !deployment.contains('/'))
}

/// `POST /v1/embeddings`: the model's scripted behaviour, an `ok` answering vectors
/// ([`crate::embed`]).
pub async fn embeddings(
    state: &State,
    conn: &ConnFlags,
    req: Request<Incoming>,
) -> Result<HttpResponse, Aborted> {
    let (parts, body) = req.into_parts();
    let body = body.collect().await.map_err(|_| Aborted)?.to_bytes();
    state.requests.fetch_add(1, Ordering::Relaxed);
    let request_id = state.request_id();
    let parsed = embed::parse_openai(&body);
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
    let api_key = bearer(&parts.headers);
    let failed = |status: &StatusReply| {
        openai::status_error(
            status.status,
            &request.model,
            status.message.as_deref(),
            api_key,
            &request_id,
            status.retry_after,
        )
    };
    match behaviour {
        Behaviour::Ok(reply) => {
            sleep_ms(reply.delay_ms).await;
            Ok(ok(embed::openai_body(&request, reply.dimensions), &request_id))
        }
        Behaviour::Status(status) => {
            sleep_ms(status.delay_ms).await;
            Ok(error_response(&failed(status), &request_id))
        }
        Behaviour::Hang => std::future::pending().await,
        Behaviour::Reset => {
            conn.reset_on_close();
            Err(Aborted)
        }
        Behaviour::Malformed => Ok(ok(Bytes::from_static(openai::MALFORMED_BODY), &request_id)),
        // An embeddings answer is never streamed: a stream error is the 500 a plain call gets.
        Behaviour::StreamError(e) => {
            let status = StatusReply { message: e.message.clone(), ..StatusReply::new(500) };
            Ok(error_response(&failed(&status), &request_id))
        }
        Behaviour::Sequence(_) => Ok(ok(embed::openai_body(&request, None), &request_id)),
    }
}

/// Whether `path` is a Responses endpoint: OpenAI's, or Azure OpenAI's v1 API's.
pub fn is_responses_path(path: &str) -> bool {
    path == "/v1/responses" || path == "/openai/v1/responses"
}

/// `GET /v1/models`: every model scripted or seen, in OpenAI's list format.
pub fn models(state: &State, headers: &HeaderMap) -> HttpResponse {
    state.requests.fetch_add(1, Ordering::Relaxed);
    if let Err(err) = authorize(state, headers) {
        return error_response(&err, &state.request_id());
    }
    let names: Vec<String> = {
        let models = state.models.lock();
        let mut names: Vec<String> = models.keys().cloned().collect();
        names.sort();
        names
    };
    json_response(
        StatusCode::OK,
        openai::models_list(names.iter().map(String::as_str), state.started),
    )
}

/// A path OpenAI does not serve: its 404 `Invalid URL (METHOD PATH)`.
pub fn not_found(state: &State, method: &str, path: &str) -> HttpResponse {
    error_response(&ApiError::invalid_url(method, path), &state.request_id())
}

fn bearer(headers: &HeaderMap) -> Option<&str> {
    let value = headers.get(header::AUTHORIZATION)?.to_str().ok()?;
    let (scheme, key) = value.split_once(' ')?;
    scheme.eq_ignore_ascii_case("bearer").then(|| key.trim())
}

fn authorize(state: &State, headers: &HeaderMap) -> Result<(), ApiError> {
    let keys = state.keys.lock();
    if keys.is_empty() {
        return Ok(());
    }
    match bearer(headers) {
        Some(key) if keys.iter().any(|k| k == key) => Ok(()),
        Some(key) => Err(ApiError::incorrect_key(key)),
        None => Err(ApiError::missing_key()),
    }
}

/// `POST /v1/chat/completions`.
pub async fn chat(
    state: &State,
    conn: &ConnFlags,
    req: Request<Incoming>,
) -> Result<HttpResponse, Aborted> {
    let (parts, body) = req.into_parts();
    // A client that goes away mid-body ends the connection; there is nobody to answer.
    let body = body.collect().await.map_err(|_| Aborted)?.to_bytes();
    state.requests.fetch_add(1, Ordering::Relaxed);
    let request_id = state.request_id();
    let parsed = openai::parse_request(&body);
    // A body that fails validation is still attributed to its model when it names one.
    let model = match &parsed {
        Ok(request) => Some(Cow::Borrowed(request.model.as_str())),
        Err(_) => openai::request_model(&body).map(Cow::Owned),
    };
    let authorized = authorize(state, &parts.headers);

    let step = model
        .map(|model| state.take_step(model, &parts, &body, authorized.is_ok() && parsed.is_ok()));
    // OpenAI checks the key before it looks at the body.
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
    let api_key = bearer(&parts.headers);
    respond(state, conn, behaviour, &request, api_key, request_id).await
}

/// `POST /v1/responses`: the same scripted behaviours as chat, as a `response` object or the
/// Responses event stream.
pub async fn responses(
    state: &State,
    conn: &ConnFlags,
    req: Request<Incoming>,
) -> Result<HttpResponse, Aborted> {
    let (parts, body) = req.into_parts();
    let body = body.collect().await.map_err(|_| Aborted)?.to_bytes();
    state.requests.fetch_add(1, Ordering::Relaxed);
    let request_id = state.request_id();
    let parsed = responses::parse_request(&body);
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
    let api_key = bearer(&parts.headers);
    respond_responses(state, conn, behaviour, &request, api_key, request_id).await
}

async fn respond_responses(
    state: &State,
    conn: &ConnFlags,
    behaviour: &Behaviour,
    request: &ResponsesRequest,
    api_key: Option<&str>,
    request_id: String,
) -> Result<HttpResponse, Aborted> {
    let response = || responses::Response {
        id: responses::response_id(&state.completion_id()),
        created: switchyard_time::now_secs(),
        model: request.model.clone(),
        prompt_tokens: request.prompt_tokens,
    };
    let error = |status: &StatusReply| {
        openai::status_error(
            status.status,
            &request.model,
            status.message.as_deref(),
            api_key,
            &request_id,
            status.retry_after,
        )
    };
    match behaviour {
        Behaviour::Ok(reply) => {
            sleep_ms(reply.delay_ms).await;
            if let Some(window) = reply.too_long(request.prompt_tokens) {
                let err = ApiError::context_length(window, request.prompt_tokens);
                return Ok(error_response(&err, &request_id));
            }
            let text = reply_text(reply.text.as_deref(), &request.model);
            if request.stream {
                let plan = StreamPlan::new(Box::new(response().stream()), text, reply, None);
                Ok(stream_response(plan.spawn(), REQUEST_ID, &request_id))
            } else {
                Ok(ok(response().body(&text), &request_id))
            }
        }
        Behaviour::Status(status) => {
            sleep_ms(status.delay_ms).await;
            Ok(error_response(&error(status), &request_id))
        }
        Behaviour::Hang => std::future::pending().await,
        Behaviour::Reset => {
            conn.reset_on_close();
            Err(Aborted)
        }
        Behaviour::Malformed => {
            if request.stream {
                let mut frames = response().stream().head();
                frames.push(Bytes::from_static(responses::MALFORMED_FRAME));
                Ok(stream_response(stream::fixed(frames), REQUEST_ID, &request_id))
            } else {
                Ok(ok(Bytes::from_static(openai::MALFORMED_BODY), &request_id))
            }
        }
        Behaviour::StreamError(e) => {
            let message = e.message.as_deref().unwrap_or(
                "The server had an error while processing your request. Sorry about that!",
            );
            if request.stream {
                let text = reply_text(None, &request.model);
                let reply = Reply { chunks: DEFAULT_CHUNKS.max(e.after), ..Reply::default() };
                let wire = Box::new(response().stream());
                let plan = StreamPlan::new(wire, text, &reply, Some((e.after, message.to_owned())));
                Ok(stream_response(plan.spawn(), REQUEST_ID, &request_id))
            } else {
                let status =
                    StatusReply { message: Some(message.to_owned()), ..StatusReply::new(500) };
                Ok(error_response(&error(&status), &request_id))
            }
        }
        Behaviour::Sequence(_) => {
            let default = Behaviour::default();
            Box::pin(respond_responses(state, conn, &default, request, api_key, request_id)).await
        }
    }
}

async fn respond(
    state: &State,
    conn: &ConnFlags,
    behaviour: &Behaviour,
    request: &ChatRequest,
    api_key: Option<&str>,
    request_id: String,
) -> Result<HttpResponse, Aborted> {
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
            let tool_call = request.tool_call.as_ref().filter(|_| reply.call_tools);
            // A tool call is not text a prefill can be the start of.
            let skip = match tool_call {
                Some(_) => 0,
                None => continues_at(&text, request.prefill.as_deref()),
            };
            let id = state.completion_id();
            let completion =
                Completion { id: &id, created: switchyard_time::now_secs(), model: &request.model };
            if request.stream {
                let wire = CompletionStream::new(&completion, request).calling(tool_call);
                let text = wire.text(text);
                let plan = StreamPlan::new(Box::new(wire), text, reply, None).continuing(skip);
                Ok(stream_response(plan.spawn(), REQUEST_ID, &request_id))
            } else if let Some(call) = tool_call {
                Ok(ok(completion.tool_call_body(call, request.prompt_tokens), &request_id))
            } else {
                let rest = text.get(skip..).unwrap_or_default();
                Ok(ok(completion.body(rest, request.prompt_tokens), &request_id))
            }
        }
        Behaviour::Status(status) => {
            sleep_ms(status.delay_ms).await;
            let err = scripted_error(status, request, api_key, &request_id);
            Ok(error_response(&err, &request_id))
        }
        Behaviour::Hang => std::future::pending().await,
        Behaviour::Reset => {
            conn.reset_on_close();
            // hyper closes a connection whose service fails, writing nothing.
            Err(Aborted)
        }
        Behaviour::Malformed => {
            if request.stream {
                let id = state.completion_id();
                let completion = Completion {
                    id: &id,
                    created: switchyard_time::now_secs(),
                    model: &request.model,
                };
                let frames = vec![
                    completion.role_chunk(request.include_usage),
                    Bytes::from_static(openai::MALFORMED_FRAME),
                ];
                Ok(stream_response(stream::fixed(frames), REQUEST_ID, &request_id))
            } else {
                Ok(ok(Bytes::from_static(openai::MALFORMED_BODY), &request_id))
            }
        }
        Behaviour::StreamError(e) => {
            let message = e.message.as_deref().unwrap_or(
                "The server had an error while processing your request. Sorry about that!",
            );
            if request.stream {
                let id = state.completion_id();
                let completion = Completion {
                    id: &id,
                    created: switchyard_time::now_secs(),
                    model: &request.model,
                };
                let text = reply_text(None, &request.model);
                let reply = Reply { chunks: DEFAULT_CHUNKS.max(e.after), ..Reply::default() };
                let wire = CompletionStream::new(&completion, request);
                let plan = StreamPlan::new(
                    Box::new(wire),
                    text,
                    &reply,
                    Some((e.after, message.to_owned())),
                );
                Ok(stream_response(plan.spawn(), REQUEST_ID, &request_id))
            } else {
                let status =
                    StatusReply { message: Some(message.to_owned()), ..StatusReply::new(500) };
                let err = scripted_error(&status, request, api_key, &request_id);
                Ok(error_response(&err, &request_id))
            }
        }
        // `Behaviour::at` never yields a sequence; answer as an unscripted model would.
        Behaviour::Sequence(_) => {
            Box::pin(respond(state, conn, &Behaviour::default(), request, api_key, request_id))
                .await
        }
    }
}

fn scripted_error(
    status: &StatusReply,
    request: &ChatRequest,
    api_key: Option<&str>,
    request_id: &str,
) -> ApiError {
    openai::status_error(
        status.status,
        &request.model,
        status.message.as_deref(),
        api_key,
        request_id,
        status.retry_after,
    )
}

fn ok(body: Bytes, request_id: &str) -> HttpResponse {
    let mut resp = json_response(StatusCode::OK, body);
    insert_header(&mut resp, REQUEST_ID, request_id);
    resp
}

fn error_response(err: &ApiError, request_id: &str) -> HttpResponse {
    let mut resp = json_response(status(err.status), err.body());
    for (name, value) in err.headers() {
        insert_header(&mut resp, name, &value);
    }
    insert_header(&mut resp, REQUEST_ID, request_id);
    resp
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn chat_paths_are_openais_and_azure_deployments() {
        assert!(is_chat_path("/v1/chat/completions"));
        assert!(is_chat_path("/openai/deployments/gpt-4o/chat/completions"));
        assert!(!is_chat_path("/chat/completions"));
        assert!(!is_chat_path("/v1/v1/chat/completions"));
        assert!(!is_chat_path("/openai/deployments//chat/completions"));
        assert!(!is_chat_path("/openai/deployments/a/b/chat/completions"));
    }

    #[test]
    fn responses_paths_are_openais_and_azures_v1() {
        assert!(is_responses_path("/v1/responses"));
        assert!(is_responses_path("/openai/v1/responses"));
        assert!(!is_responses_path("/responses"));
    }
}
