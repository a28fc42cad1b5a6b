//! The node's HTTP surface: a request reads top to bottom here — auth, body, parse, chain,
//! executor, response — and every error leaves through [`ApiError::render`].

use std::sync::Arc;
use std::time::Instant;

use switchyard_time::now_ms;

use axum::body::Body;
use axum::extract::{Path, State};
use axum::http::{HeaderMap, HeaderValue, StatusCode, header};
use axum::response::{IntoResponse, Response};
use axum::routing::{get, post};
use axum::{Json, Router};
use opentelemetry::context::FutureExt as _;
use serde_json::json;
use tracing::{Instrument, debug_span};

use switchyard_catalog::Model;
use switchyard_catalog::keys::secret_digest;
use switchyard_proto::node::v1 as pb;

pub use crate::app::App;
use crate::app::{SERVED_DEPLOYMENT, model_headers, raw, record_usage};
use crate::chain::{self, Chain};
use crate::config::NodeConfig;
use crate::degraded::{self, Answer, Reason};
use crate::error::{ApiError, Flavor};
use crate::executor::Output;
use crate::keys::Key;
use crate::limits::Decision;
use crate::loss::SpoolState;
use crate::messages;
use crate::metrics::{EndpointLabels, RequestLabels, gen_ai_provider_name};
use crate::otel;
use crate::providers::Completion;
use crate::report::{AttemptReport, Failover, FailoverReport, failover_occurred};
use crate::request::ChatRequest;
use crate::request_id;
use crate::responses;
use crate::stream::Rescue;

/// The translation of a request that arrived on another surface than Chat Completions.
enum Surface {
    Messages(messages::Translated),
    Responses(responses::Translated),
}

/// One request on its way through the node, from its head on: what each step of it reads.
struct Inbound<'a> {
    app: &'a Arc<App>,
    headers: &'a HeaderMap,
    /// The endpoint it came to, which shapes its answer and errors.
    flavor: Flavor,
    /// Its `x-request-id`, as sent or made here.
    id: &'a HeaderValue,
    started: Instant,
}

/// Request bodies above this are refused with 413 (configurable with `--max-body-bytes`).
pub const DEFAULT_MAX_BODY_BYTES: usize = 4 * 1024 * 1024;
/// How long a client may take to send a request's head, or keep an idle connection open
/// (configurable with `--header-read-timeout`).
pub const DEFAULT_HEADER_READ_TIMEOUT: std::time::Duration = std::time::Duration::from_secs(30);

/// The Anthropic SDKs' credential header.
const X_API_KEY: header::HeaderName = header::HeaderName::from_static("x-api-key");

pub fn router(app: Arc<App>) -> Router {
    Router::new()
        .route("/healthz", get(|| async { Json(json!({"status": "ok"})) }))
        .route("/readyz", get(readyz))
        .route("/v1/models", get(|s, h| models(s, h, None)))
        .route("/v1/models/{*id}", get(|s, Path(id): Path<String>, h| models(s, h, Some(id))))
        .route("/metrics", get(metrics))
        .route("/v1/chat/completions", post(|s, r| chat(s, r, Flavor::OpenAi)))
        .route("/chat/completions", post(|s, r| chat(s, r, Flavor::Classic)))
        .route("/v1/messages", post(|s, r| chat(s, r, Flavor::Anthropic)))
        .route("/v1/messages/count_tokens", post(count_tokens))
        .route("/v1/responses", post(|s, r| chat(s, r, Flavor::Responses)))
        .route("/v1/embeddings", post(|s, r| chat(s, r, Flavor::Embeddings)))
        // Claude Code asks `HEAD /` before its first call; a GET answers it too.
        .route("/", get(|| async { Json(json!({"service": "switchyard"})) }))
        .fallback(|s, m, u| unknown_url(s, m, u, StatusCode::NOT_FOUND))
        .method_not_allowed_fallback(|s, m, u| unknown_url(s, m, u, StatusCode::METHOD_NOT_ALLOWED))
        .with_state(app)
}

/// A path the node has no endpoint for (or not with this method): the OpenAI error shape,
/// naming both, so an SDK user reads more than "Error code: 404"; counted in
/// `switchyard_http_requests_total{endpoint="unknown"}`.
async fn unknown_url(
    State(app): State<Arc<App>>,
    method: http::Method,
    uri: http::Uri,
    status: StatusCode,
) -> Response {
    app.services
        .metrics
        .requests
        .get_or_create(&RequestLabels { endpoint: "unknown", status: status.as_u16() })
        .inc();
    let path = uri.path().to_owned();
    ApiError::UnknownUrl { status, method, path }.render(Flavor::OpenAi)
}

async fn metrics(State(app): State<Arc<App>>, headers: HeaderMap) -> Response {
    app.services.metrics.config_version.set(app.state.version());
    let held = app.services.telemetry.events_held();
    app.services.metrics.events_held.set(i64::try_from(held).unwrap_or(i64::MAX));
    let accept = headers.get(header::ACCEPT).and_then(|v| v.to_str().ok());
    let (content_type, body) = app.services.metrics.render(accept);
    ([(header::CONTENT_TYPE, content_type)], body).into_response()
}

async fn readyz(State(app): State<Arc<App>>) -> Response {
    if app.state.is_draining() {
        return (
            StatusCode::SERVICE_UNAVAILABLE,
            Json(json!({"ready": false, "reason": "draining"})),
        )
            .into_response();
    }
    match app.state.current() {
        Some(config) => {
            let mut body = json!({"ready": true, "config_version": config.version});
            // Still ready when events are being lost: serving matters more than auditing,
            // and the loss is counted and reported (docs/operating.md, "No event lost
            // silently").
            let losses = &app.services.telemetry.losses;
            let (spool, lost) = (losses.spool(), losses.total());
            if spool != SpoolState::None || lost > 0 {
                body["event_spool"] = json!({"state": spool.as_str(), "lost": lost});
            }
            if config.limited_keys > 0 {
                // How fresh this node's view of the fleet's use of limited keys is
                // (docs/limits.md); null until the first view arrives.
                let age = app.services.limits.view_age(Instant::now());
                body["limits_view_age_ms"] = json!(age.map(|a| a.as_millis() as u64));
            }
            Json(body).into_response()
        }
        None => (
            StatusCode::SERVICE_UNAVAILABLE,
            Json(json!({"ready": false, "reason": "no config applied yet"})),
        )
            .into_response(),
    }
}

/// The active key presenting `Authorization: Bearer <key>`, or `x-api-key: <key>` as the
/// Anthropic SDKs and Claude Code send it.
pub fn authenticate(config: &NodeConfig, headers: &HeaderMap) -> Result<Arc<Key>, ApiError> {
    let bearer =
        headers.get(header::AUTHORIZATION).and_then(|v| v.to_str().ok()).and_then(bearer_token);
    let Some(secret) = bearer.or_else(|| headers.get(X_API_KEY).and_then(|v| v.to_str().ok()))
    else {
        return Err(ApiError::Unauthorized(
            "Missing API key: send `Authorization: Bearer <key>` (or `x-api-key: <key>`).",
        ));
    };
    match config.keys_by_hash.get(&secret_digest(secret.trim())) {
        Some(key) if key.is_active() => Ok(Arc::clone(key)),
        Some(_) => Err(ApiError::Unauthorized("This API key has been revoked.")),
        None => Err(ApiError::Unauthorized("Incorrect API key provided.")),
    }
}

/// The token of a `Bearer` credential. The scheme is case-insensitive (RFC 9110 §11.1):
/// `bearer KEY` and `BEARER KEY` are the same credential as `Bearer KEY`.
fn bearer_token(value: &str) -> Option<&str> {
    let (scheme, token) = value.split_once(' ')?;
    scheme.eq_ignore_ascii_case("bearer").then_some(token)
}

/// `GET /v1/models` (`id`: none) and `GET /v1/models/{id}`, answered by [`crate::models`].
async fn models(State(app): State<Arc<App>>, headers: HeaderMap, id: Option<String>) -> Response {
    let Some(config) = app.state.current() else {
        return ApiError::NotReady.render(Flavor::OpenAi);
    };
    let key = match authenticate(&config, &headers) {
        Ok(key) => key,
        Err(e) => return e.render(Flavor::OpenAi),
    };
    match id {
        None => crate::models::list(&config, &key),
        Some(id) => crate::models::one(&config, &key, &id),
    }
}

async fn chat(
    State(app): State<Arc<App>>,
    request: axum::extract::Request,
    flavor: Flavor,
) -> Response {
    // The request taken whole, not through a `HeaderMap` extractor, which would clone the headers.
    let (parts, body) = request.into_parts();
    let headers = parts.headers;
    let id = request_id::of(&headers);
    let endpoint = match flavor {
        Flavor::OpenAi => "/v1/chat/completions",
        Flavor::Classic => "/chat/completions",
        Flavor::Anthropic => "/v1/messages",
        Flavor::Responses => "/v1/responses",
        Flavor::Embeddings => "/v1/embeddings",
    };
    // A debug span, free unless enabled (`RUST_LOG=switchyard_data_plane=debug`), so the
    // request path pays nothing for spans nobody collects.
    let span = debug_span!(
        "request",
        endpoint = ?flavor,
        request_id = id.to_str().unwrap_or_default(),
        key = tracing::field::Empty
    );
    // With OpenTelemetry on, also the request's SERVER span, as an OpenTelemetry context
    // current while the request is served: the upstream calls' CLIENT spans and the failover
    // log records find it there.
    let server = otel::server_span(endpoint, &headers, id.to_str().unwrap_or_default());
    let served = async move {
        let started = Instant::now();
        let inbound = Inbound { app: &app, headers: &headers, flavor, id: &id, started };
        let (mut response, error) = match handle(&inbound, body).await {
            Ok(response) => (response, None),
            Err(e) => (e.render(flavor), Some(e.label())),
        };
        otel::finished(otel::current().as_ref(), response.status().as_u16(), error);
        response.headers_mut().insert(request_id::HEADER, id);
        let metrics = &app.services.metrics;
        metrics
            .requests
            .get_or_create(&RequestLabels { endpoint, status: response.status().as_u16() })
            .inc();
        metrics
            .request_duration
            .get_or_create(&EndpointLabels { endpoint })
            .observe(started.elapsed().as_secs_f64());
        response
    }
    .instrument(span);
    // Two awaits rather than a wrapper on both paths: without OpenTelemetry the request's
    // future is polled as it was before spans were made on the OpenTelemetry API. The span
    // ends when the context is dropped, with the request.
    match server {
        Some(cx) => served.with_context(cx).await,
        None => served.await,
    }
}

async fn handle(inbound: &Inbound<'_>, body: Body) -> Result<Response, ApiError> {
    let Inbound { app, headers, flavor, .. } = *inbound;
    let config = app.state.current().ok_or(ApiError::NotReady)?;
    // The key is checked before the body is read or validated.
    let key = authenticate(&config, headers)?;
    tracing::Span::current().record("key", &*key.id);
    otel::key(otel::current().as_ref(), &key.id);
    // The key's own limits are decided here, from counts the node holds: no network call,
    // and before anything else is done for the request (docs/limits.md).
    let Some(limits) = key.settings.limits.as_ref().filter(|l| !l.is_empty()) else {
        return serve_admitted(inbound, &config, &key, body).await;
    };
    let decision = app.services.limits.admit(&key.id, limits, now_ms(), Instant::now());
    let (mut response, rate) = match decision {
        Decision::Admitted(rate) => {
            let response = serve_admitted(inbound, &config, &key, body).await;
            (response.unwrap_or_else(|e| e.render(flavor)), rate)
        }
        Decision::Blocked { limit, retry_after, headers: rate } => {
            app.services.metrics.limit_blocked(&key.id, limit.as_str()).inc();
            (ApiError::Limited { limit, limits: *limits, retry_after }.render(flavor), rate)
        }
    };
    rate.write(response.headers_mut());
    Ok(response)
}

/// The whole request body, up to `limit` bytes. Only the limit makes a 413: a client that
/// reset the connection mid-body sent nothing too large.
async fn read_body(body: Body, limit: usize) -> Result<bytes::Bytes, ApiError> {
    axum::body::to_bytes(body, limit).await.map_err(|e| {
        let too_large = std::error::Error::source(&e)
            .is_some_and(|s| s.is::<http_body_util::LengthLimitError>());
        if too_large {
            ApiError::PayloadTooLarge { limit }
        } else {
            tracing::debug!(error = %e, "the request body broke off before its end");
            ApiError::BodyIncomplete(e.to_string())
        }
    })
}

/// The request once its key is known and admitted: body, chain, executor, answer.
async fn serve_admitted(
    inbound: &Inbound<'_>,
    config: &Arc<NodeConfig>,
    key: &Arc<Key>,
    body: Body,
) -> Result<Response, ApiError> {
    let Inbound { app, headers, flavor, id, started } = *inbound;
    let (config, key) = (Arc::clone(config), Arc::clone(key));
    let bytes = read_body(body, app.max_body_bytes).await?;
    // A `/v1/messages` or `/v1/responses` body is translated into the unified form, its
    // original kept beside it for the kinds that speak it (Anthropic; OpenAI, Azure OpenAI).
    let surface = match flavor {
        Flavor::Anthropic => Some(Surface::Messages(messages::Translated::of(&bytes)?)),
        Flavor::Responses => Some(Surface::Responses(responses::Translated::of(&bytes)?)),
        Flavor::OpenAi | Flavor::Classic | Flavor::Embeddings => None,
    };
    let request = match &surface {
        Some(Surface::Messages(translated)) => translated.request(&bytes, headers)?,
        Some(Surface::Responses(translated)) => translated.request(&bytes)?,
        None if flavor == Flavor::Embeddings => ChatRequest::embeddings(&bytes)?,
        None => ChatRequest::parse(&bytes)?,
    };
    let mut chain = chain::resolve(&request, &key, &config)?;
    let affinity = request
        .redundancy
        .session_affinity
        .or_else(|| key.settings.failover_defaults.as_ref().and_then(|d| d.session_affinity))
        .unwrap_or(true);
    if affinity {
        chain.session = crate::deployment::session_key(headers).map(Into::into);
    }
    // The SERVER span when OpenTelemetry is on; otherwise no context is looked up at all.
    let cx = otel::current();
    let span = cx.as_ref();
    otel::requested(span, chain.requested_model());
    let outcome = app.executor.run(&chain, &request, &config, id).await;
    if let Err(failed) = &outcome
        && let Some(degraded) = &chain.degraded
        && failed.error.is_all_models_failed()
    {
        let reason =
            if failed.all_open { Reason::AllBreakersOpen } else { Reason::AllModelsFailed };
        app.services.metrics.degraded(chain.requested_model(), reason.as_str()).inc();
        let mut event = failover_event(
            inbound,
            request.stream,
            &key,
            &chain,
            &failed.attempts,
            degraded::MODEL.to_owned(),
            200,
        );
        event.degraded = reason.as_str().to_owned();
        otel::failover_log(&event);
        app.services.telemetry.push_event(event);
        // Never billed: no model served, so no usage is recorded.
        return Ok(degraded::respond(Answer {
            message: &degraded.message,
            reason,
            requested_model: chain.requested_model(),
            attempts: &failed.attempts,
            stream: request.stream,
            flavor,
        }));
    }
    let attempts = match &outcome {
        Ok(served) => &served.attempts,
        Err(failed) => &failed.attempts,
    };
    if span.is_some()
        && let Some(fault) = attempts.iter().find_map(|a| a.injected.as_deref())
    {
        otel::injected(span, fault);
    }
    if chain.is_multi_model() && failover_occurred(attempts) {
        let (served_model, status) = match &outcome {
            Ok(s) => (s.model.name.clone(), 200),
            Err(f) => (String::new(), u32::from(f.error.status().as_u16())),
        };
        app.services
            .metrics
            .model(chain.requested_model())
            .failover(&served_model, flavor.surface());
        let event =
            failover_event(inbound, request.stream, &key, &chain, attempts, served_model, status);
        otel::failover_log(&event);
        app.services.telemetry.push_event(event);
    }
    let metrics = &app.services.metrics;
    let served = match outcome {
        Ok(served) => served,
        Err(failed) => {
            let provider = chain.entries.first().map_or("", |e| gen_ai_provider(&config, &e.model));
            let seconds = started.elapsed().as_secs_f64();
            metrics.gen_ai_failed(chain.requested_model(), provider, failed.error.label(), seconds);
            return Err(failed.error);
        }
    };
    tracing::debug!(served = %served.model.name, deployment = ?served.deployment, "served");
    let deployment = served.deployment.as_deref().and_then(|d| HeaderValue::from_str(d).ok());
    let gen_ai = metrics.gen_ai(chain.requested_model(), &served.model.name, || {
        gen_ai_provider(&config, &served.model)
    });
    if span.is_some() {
        let provider = gen_ai_provider(&config, &served.model);
        otel::served(span, provider, &served.model.name, failover_occurred(&served.attempts));
    }
    let kind = config.catalog.provider(&served.model.provider).map(|p| p.kind);
    let dropped = match &surface {
        Some(Surface::Responses(translated)) => translated.dropped(kind, &served.model),
        _ => messages::dropped_hints(&request, kind, &served.model),
    };
    let mut response = match served.output {
        Output::Completion(completion) => {
            otel::answered(span, &completion);
            record_usage(app, &key.id, &served.model, completion.usage);
            gen_ai.tokens(completion.usage.prompt_tokens, completion.usage.completion_tokens);
            gen_ai.duration.observe(started.elapsed().as_secs_f64());
            render_completion(completion, served.model, served.attempts, &chain, flavor)
        }
        Output::Stream(stream) => {
            // The executor commits to a stream once its first content chunk has arrived,
            // which goes out with the response head.
            gen_ai.time_to_first_token.observe(started.elapsed().as_secs_f64());
            // A stream that breaks after its first token is continued when the chain allows
            // it and a model from the serving one on can (docs/http-api.md, "Streaming"); a
            // Messages stream ends with an `error` event instead (docs/messages.md).
            // A Responses stream is continued from its translation, a chat request like any,
            // unless an OpenAI model sent its own events: those end with `response.failed`.
            let body = match &surface {
                None => Some(bytes.clone()),
                Some(Surface::Responses(_)) if responses::native(kind) => None,
                Some(Surface::Responses(translated)) => Some(translated.body.clone()),
                Some(Surface::Messages(_)) => None,
            };
            let rescue = if let Some(body) = body.filter(|_| chain.continue_streams) {
                let deadline = chain.deadline.map(|d| started + d);
                Rescue::of(body, Arc::clone(&config), &chain.entries, &served.model, deadline)
            } else {
                None
            };
            crate::stream::respond(
                app,
                *stream,
                crate::stream::Context {
                    key_id: key.id.to_string(),
                    request_id: id.clone(),
                    model: served.model,
                    report: report(&chain, &served.attempts),
                    multi: chain.is_multi_model(),
                    include_usage: request.include_usage,
                    flavor,
                    gen_ai,
                    started,
                    rescue,
                },
            )
        }
    };
    if let Some(dropped) = dropped {
        response.headers_mut().insert(messages::DROPPED_HINTS, dropped);
    }
    if let Some(deployment) = deployment {
        response.headers_mut().insert(SERVED_DEPLOYMENT, deployment);
    }
    Ok(response)
}

/// `POST /v1/messages/count_tokens`: answered by the chain's first Anthropic model, else
/// estimated by the translation core and marked `"estimated": true`; never a completion
/// call (docs/messages.md).
async fn count_tokens(State(app): State<Arc<App>>, request: axum::extract::Request) -> Response {
    let (parts, body) = request.into_parts();
    let id = request_id::of(&parts.headers);
    let mut response =
        count(&app, &parts.headers, body).await.unwrap_or_else(|e| e.render(Flavor::Anthropic));
    response.headers_mut().insert(request_id::HEADER, id);
    let endpoint = "/v1/messages/count_tokens";
    app.services
        .metrics
        .requests
        .get_or_create(&RequestLabels { endpoint, status: response.status().as_u16() })
        .inc();
    response
}

async fn count(app: &Arc<App>, headers: &HeaderMap, body: Body) -> Result<Response, ApiError> {
    let config = app.state.current().ok_or(ApiError::NotReady)?;
    let key = authenticate(&config, headers)?;
    let bytes = read_body(body, app.max_body_bytes).await?;
    let counted = messages::Counted::of(&bytes)?;
    let request = counted.translated.request(&bytes, headers)?;
    let chain = chain::resolve(&request, &key, &config)?;
    let anthropic = chain.entries.iter().find_map(|entry| {
        let provider = config.providers.get(&entry.model.provider)?;
        (provider.def.kind == switchyard_catalog::ProviderKind::Anthropic)
            .then_some((provider, &entry.model))
    });
    if let (Some((provider, model)), Some(native)) = (anthropic, &request.native) {
        let body = bytes::Bytes::from(crate::providers::anthropic::native::body(model, native));
        let call = crate::providers::MessagesCall { beta: native.beta.as_ref() };
        match provider.count_tokens(model, body, call).await {
            Ok(answer) => {
                return Ok(([(header::CONTENT_TYPE, "application/json")], answer).into_response());
            }
            // The count is advice: an estimate serves where the upstream could not.
            Err(e) => {
                tracing::info!(model = %model.name, error = %e, "count_tokens upstream failed; estimating")
            }
        }
    }
    Ok(Json(json!({"input_tokens": counted.estimate, "estimated": true})).into_response())
}

/// `gen_ai.provider.name` of the provider serving `model`.
fn gen_ai_provider(config: &NodeConfig, model: &Model) -> &'static str {
    config.catalog.provider(&model.provider).map_or("", |p| gen_ai_provider_name(p.kind))
}

/// The failover report of a chain whose last attempt served.
fn report(chain: &Chain, attempts: &[AttemptReport]) -> FailoverReport {
    let served_model = attempts.last().map(|a| a.model.clone()).unwrap_or_default();
    FailoverReport {
        requested_model: chain.requested_model().to_owned(),
        served_model,
        failover: Failover { occurred: failover_occurred(attempts), attempts: attempts.to_vec() },
    }
}

/// The failover event of a request whose chain failed over (or, on a degraded answer,
/// failed).
fn failover_event(
    inbound: &Inbound<'_>,
    stream: bool,
    key: &Key,
    chain: &Chain,
    attempts: &[AttemptReport],
    served_model: String,
    status: u32,
) -> pb::FailoverEvent {
    let Inbound { app, flavor, id, .. } = *inbound;
    pb::FailoverEvent {
        id: format!("evt_{:016x}{:016x}", rand::random::<u64>(), rand::random::<u64>()),
        at_unix_ms: switchyard_time::now_ms(),
        node_id: app.services.telemetry.node_id.clone(),
        key_id: key.id.to_string(),
        requested_model: chain.requested_model().to_owned(),
        served_model,
        attempts: attempts.iter().map(AttemptReport::to_pb).collect(),
        stream,
        status,
        degraded: String::new(),
        // Valid ids are visible ASCII, so this is the id as sent.
        request_id: id.to_str().unwrap_or_default().to_owned(),
        // Only the admin listing sets it.
        lost: None,
        continued: vec![],
        surface: flavor.surface().to_owned(),
    }
}

fn render_completion(
    completion: Completion,
    model: Arc<Model>,
    attempts: Vec<AttemptReport>,
    chain: &Chain,
    flavor: Flavor,
) -> Response {
    let report = report(chain, &attempts);
    // The response names the model that served, by its gateway name.
    let body = raw(&model.name).and_then(|name| match flavor {
        Flavor::Anthropic => {
            let secureai = if chain.is_multi_model() { raw(&report) } else { None };
            messages::answer(&completion, &model.name, secureai.as_deref())
        }
        Flavor::OpenAi | Flavor::Embeddings => Some({
            let secureai = if chain.is_multi_model() { raw(&report) } else { None };
            completion.to_json(&name, secureai.as_deref().map(|r| ("secureai", r)))
        }),
        Flavor::Responses => {
            let secureai = if chain.is_multi_model() { raw(&report) } else { None };
            responses::answer(&completion, &model.name, secureai.as_deref())
        }
        Flavor::Classic => Some({
            let metadata = if chain.is_multi_model() {
                json!(report)
            } else {
                json!({"requested_model": report.requested_model, "served_model": report.served_model})
            };
            let mut out = b"{\"success\":true,\"data\":".to_vec();
            out.extend_from_slice(&completion.to_json(&name, None));
            out.extend_from_slice(b",\"metadata\":");
            let _ = serde_json::to_writer(&mut out, &metadata);
            out.push(b'}');
            out
        }),
    });
    match body {
        Some(body) => {
            let mut response = ([(header::CONTENT_TYPE, "application/json")], body).into_response();
            // Clients that drop unknown body fields (LangChain, the Vercel AI SDK) see a
            // failover only here (docs/clients.md); a single model adds nothing to `model`.
            // An embeddings answer always names them: a vector is only comparable with
            // vectors of the model that made it.
            if chain.is_multi_model() || flavor == Flavor::Embeddings {
                let (served, requested) = (&report.served_model, chain.requested_model());
                model_headers(response.headers_mut(), served, requested);
            }
            response
        }
        None => ApiError::Internal.render(flavor),
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[tokio::test]
    async fn a_body_that_breaks_off_is_a_400_and_only_one_past_the_limit_a_413() {
        let broken = futures_util::stream::iter([
            Ok(bytes::Bytes::from_static(b"{\"model\":")),
            Err(std::io::Error::new(std::io::ErrorKind::ConnectionReset, "reset by peer")),
        ]);
        let e = read_body(Body::from_stream(broken), 1024).await.unwrap_err();
        assert_eq!((e.status(), e.label()), (StatusCode::BAD_REQUEST, "body_incomplete"), "{e}");
        let e = read_body(Body::from(vec![b'x'; 2048]), 1024).await.unwrap_err();
        assert_eq!(e.status(), StatusCode::PAYLOAD_TOO_LARGE);
        assert_eq!(read_body(Body::from("{}"), 1024).await.unwrap(), "{}");
    }

    #[test]
    fn the_bearer_scheme_is_case_insensitive() {
        for value in ["Bearer sk-1", "bearer sk-1", "BEARER sk-1", "bEaReR sk-1"] {
            assert_eq!(bearer_token(value), Some("sk-1"), "{value}");
        }
    }

    #[test]
    fn the_failover_event_names_the_fault_that_touched_an_attempt() {
        use crate::report::AttemptStatus;
        let services = crate::services::Services::new(
            Arc::new(crate::telemetry::Telemetry::new("n1".into(), Default::default())),
            Arc::new(crate::metrics::Metrics::new()),
            crate::breaker::Breakers::new(),
        );
        let app = Arc::new(App::new(crate::state::NodeState::new(None), services, 1));
        let key = Key {
            id: "k1".into(),
            digest: [0; 32],
            status: switchyard_catalog::KeyStatus::Active,
            settings: Default::default(),
        };
        let chain = Chain {
            entries: Vec::new(),
            on: Vec::new(),
            deadline: None,
            degraded: None,
            output: None,
            continue_streams: true,
            session: None,
        };
        let attempt = |model: &str, status, injected: Option<&str>| AttemptReport {
            model: model.into(),
            status,
            reason: None,
            latency_ms: 1,
            retries: 0,
            probe: false,
            injected: injected.map(Into::into),
            deployment: None,
            local_limit: false,
        };
        let attempts = [
            attempt("a", AttemptStatus::Failed, Some("drill")),
            attempt("b", AttemptStatus::Served, None),
        ];
        let (headers, id) = (HeaderMap::new(), HeaderValue::from_static("req-1"));
        let inbound = Inbound {
            app: &app,
            headers: &headers,
            flavor: Flavor::OpenAi,
            id: &id,
            started: Instant::now(),
        };
        let event = failover_event(&inbound, false, &key, &chain, &attempts, "b".into(), 200);
        assert_eq!(event.request_id, "req-1");
        assert_eq!(event.attempts[0].injected, "drill");
        assert_eq!(event.attempts[1].injected, "");
        let report = serde_json::to_value(&attempts).unwrap();
        assert_eq!(report[0]["injected"], "drill");
        assert!(report[1].get("injected").is_none(), "absent when no fault touched it");
    }

    #[test]
    fn other_schemes_and_bare_tokens_are_not_bearer_credentials() {
        for value in ["Basic c2stMQ==", "sk-1", "Bearersk-1", ""] {
            assert_eq!(bearer_token(value), None, "{value}");
        }
    }
}
