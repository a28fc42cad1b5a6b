//! The node's HTTP surface. In this version: health, readiness and the model list; the
//! completion endpoints build on the same router.

use std::sync::Arc;

use axum::extract::State;
use axum::http::{HeaderMap, StatusCode, header};
use axum::response::{IntoResponse, Response};
use axum::routing::get;
use axum::{Json, Router};
use serde_json::json;

use switchyard_catalog::ApiKeyRecord;
use switchyard_catalog::keys::hash_secret;

use crate::config::NodeConfig;
use crate::state::NodeState;

pub fn router(state: Arc<NodeState>) -> Router {
    Router::new()
        .route("/healthz", get(|| async { Json(json!({"status": "ok"})) }))
        .route("/readyz", get(readyz))
        .route("/v1/models", get(models))
        .with_state(state)
}

async fn readyz(State(state): State<Arc<NodeState>>) -> Response {
    match state.current() {
        Some(config) => {
            Json(json!({"ready": true, "config_version": config.version})).into_response()
        }
        None => (
            StatusCode::SERVICE_UNAVAILABLE,
            Json(json!({"ready": false, "reason": "no config applied yet"})),
        )
            .into_response(),
    }
}

/// The error envelope OpenAI clients parse.
pub fn openai_error(status: StatusCode, kind: &str, code: &str, message: &str) -> Response {
    let body = json!({"error": {"message": message, "type": kind, "param": null, "code": code}});
    (status, Json(body)).into_response()
}

fn not_ready() -> Response {
    openai_error(
        StatusCode::SERVICE_UNAVAILABLE,
        "server_error",
        "not_ready",
        "node has no config yet",
    )
}

/// The active key presenting `Authorization: Bearer <key>`, or the 401 to send.
#[allow(clippy::result_large_err)] // the error is the response itself, built once per refusal
pub fn authenticate(
    config: &NodeConfig,
    headers: &HeaderMap,
) -> Result<Arc<ApiKeyRecord>, Response> {
    let unauthorized = |message: &str| {
        openai_error(StatusCode::UNAUTHORIZED, "invalid_request_error", "invalid_api_key", message)
    };
    let Some(secret) = headers
        .get(header::AUTHORIZATION)
        .and_then(|v| v.to_str().ok())
        .and_then(|v| v.strip_prefix("Bearer "))
    else {
        return Err(unauthorized("Missing API key: send `Authorization: Bearer <key>`."));
    };
    match config.keys_by_hash.get(&hash_secret(secret.trim())) {
        Some(key) if key.is_active() => Ok(Arc::clone(key)),
        Some(_) => Err(unauthorized("This API key has been revoked.")),
        None => Err(unauthorized("Incorrect API key provided.")),
    }
}

async fn models(State(state): State<Arc<NodeState>>, headers: HeaderMap) -> Response {
    let Some(config) = state.current() else { return not_ready() };
    let key = match authenticate(&config, &headers) {
        Ok(key) => key,
        Err(response) => return response,
    };
    let data: Vec<_> = config
        .catalog
        .models
        .iter()
        .filter(|m| key.allowed_models.is_empty() || key.allowed_models.contains(&m.name))
        .filter(|m| {
            key.allowed_regions.is_empty()
                || config
                    .catalog
                    .provider(&m.provider)
                    .and_then(|p| p.region.as_ref())
                    .is_some_and(|r| key.allowed_regions.contains(r))
        })
        .map(|m| json!({"id": m.name, "object": "model", "created": 0, "owned_by": m.provider}))
        .collect();
    Json(json!({"object": "list", "data": data})).into_response()
}
