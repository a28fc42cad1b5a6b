//! Gemini's endpoints on the simulator's listener: the same scripted behaviours as for
//! OpenAI, in Gemini's wire format ([`crate::gemini`]).

use super::*;
use crate::gemini::{self, GenerateRequest};

/// Google reads the key from `x-goog-api-key` or `?key=`; checked only when accepted keys
/// are set, and before the body, as for OpenAI.
fn authorize(state: &State, parts: &hyper::http::request::Parts) -> Result<(), gemini::ApiError> {
    let keys = lock(&state.keys);
    if keys.is_empty() {
        return Ok(());
    }
    let header = parts.headers.get("x-goog-api-key").and_then(|v| v.to_str().ok());
    let query = parts.uri.query().and_then(|q| query_param(q, "key"));
    match header.map(str::to_owned).or(query) {
        Some(key) if keys.iter().any(|k| *k == key.trim()) => Ok(()),
        Some(_) => Err(gemini::ApiError::invalid_key()),
        None => Err(gemini::ApiError::missing_key()),
    }
}

/// `POST /v1beta/models/{model}:generateContent` / `:streamGenerateContent`.
pub(super) async fn generate(
    state: &State,
    conn: &Arc<ConnFlags>,
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
        return Ok(error(&err, &request_id));
    }
    let request = match parsed {
        Ok(request) => request,
        Err(err) => return Ok(error(&err, &request_id)),
    };
    let default = Behaviour::default();
    let behaviour = script.as_deref().unwrap_or(&default).at(position);
    respond(state, conn, behaviour, &request, request_id).await
}

async fn respond(
    state: &State,
    conn: &Arc<ConnFlags>,
    behaviour: &Behaviour,
    request: &GenerateRequest,
    request_id: String,
) -> Result<HttpResponse, Aborted> {
    let id = state.completion_id();
    let wire = || GeminiStream {
        response_id: id.trim_start_matches("chatcmpl-").to_owned(),
        model: request.model.clone(),
        prompt_tokens: request.prompt_tokens,
    };
    match behaviour {
        Behaviour::Ok(reply) => {
            sleep_ms(reply.delay_ms).await;
            let text = reply_text(reply.text.as_deref(), &request.model);
            let w = wire();
            match (&request.call, request.stream) {
                (Some(call), true) => {
                    Ok(frames(vec![w.response().call_chunk(call, w.prompt_tokens)], &request_id))
                }
                (Some(call), false) => {
                    Ok(ok(w.response().call_body(call, w.prompt_tokens), &request_id))
                }
                (None, true) => {
                    let plan = StreamPlan::new(Box::new(w), text, reply, None);
                    Ok(stream_response(plan.spawn(), &request_id))
                }
                (None, false) => Ok(ok(w.response().body(&text, w.prompt_tokens), &request_id)),
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
            Ok(error(&err, &request_id))
        }
        Behaviour::Hang => std::future::pending().await,
        Behaviour::Reset => {
            conn.reset.store(true, Ordering::Release);
            Err(Aborted)
        }
        Behaviour::Malformed => {
            if request.stream {
                Ok(frames(vec![Bytes::from_static(gemini::MALFORMED_FRAME)], &request_id))
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
                Ok(stream_response(plan.spawn(), &request_id))
            } else {
                let err = gemini::status_error(500, &request.model, Some(message), None);
                Ok(error(&err, &request_id))
            }
        }
        Behaviour::Sequence(_) => {
            Box::pin(respond(state, conn, &Behaviour::default(), request, request_id)).await
        }
    }
}

/// Gemini's stream framing: no head, one GenerateContentResponse per piece, and a last
/// chunk with `finishReason` and the usage; the body then just ends.
struct GeminiStream {
    response_id: String,
    model: String,
    prompt_tokens: u64,
}

impl GeminiStream {
    fn response(&self) -> gemini::Response<'_> {
        gemini::Response { response_id: &self.response_id, model: &self.model }
    }
}

impl StreamWire for GeminiStream {
    fn head(&self) -> Vec<Bytes> {
        Vec::new()
    }

    fn content(&self, piece: &str) -> Bytes {
        self.response().chunk(piece, self.prompt_tokens)
    }

    fn error(&self, message: &str) -> Bytes {
        gemini::error_frame(message)
    }

    fn tail(&self, text: &str) -> Vec<Bytes> {
        vec![self.response().final_chunk(self.prompt_tokens, crate::openai::tokens(text))]
    }
}

fn ok(body: Bytes, request_id: &str) -> HttpResponse {
    let mut resp = json_response(StatusCode::OK, body);
    insert_request_id(&mut resp, request_id);
    resp
}

/// A stream of fixed frames that then ends.
fn frames(frames: Vec<Bytes>, request_id: &str) -> HttpResponse {
    let (tx, rx) = mpsc::channel(frames.len().max(1));
    for frame in frames {
        // The channel holds every frame, so these sends cannot fail for lack of room.
        let _ = tx.try_send(Chunk::Data(frame));
    }
    stream_response(SimBody::Channel(rx), request_id)
}

fn error(err: &gemini::ApiError, request_id: &str) -> HttpResponse {
    let status = StatusCode::from_u16(err.status).unwrap_or(StatusCode::INTERNAL_SERVER_ERROR);
    let mut resp = json_response(status, err.body());
    if let Some(secs) = err.retry_after
        && let Ok(value) = HeaderValue::from_str(&secs.to_string())
    {
        resp.headers_mut().insert(header::RETRY_AFTER, value);
    }
    insert_request_id(&mut resp, request_id);
    resp
}
