//! `GET /v1/models` and `GET /v1/models/{id}` (docs/http-api.md, "`GET /v1/models` and `GET
//! /v1/models/{id}`"), for a key `http` authenticated: the models it may use, in OpenAI's
//! model-object shape with each model's `type` (and an embedding model's `dimensions`).
//! Wildcards are listed as written; a name under one is looked up as the model it names.

use axum::Json;
use axum::http::StatusCode;
use axum::response::{IntoResponse, Response};
use serde_json::{Value, json};

use switchyard_catalog::{Model, model_allowed};

use crate::config::NodeConfig;
use crate::error::{ApiError, Flavor};
use crate::keys::Key;

/// Every catalog entry the key may use, in catalog order, then the names its allow-list
/// holds that are no entry but fall under a wildcard (`openai/gpt-5` under `openai/*`).
pub fn list(config: &NodeConfig, key: &Key) -> Response {
    let allowed = &key.settings.allowed_models;
    let entries = config
        .catalog
        .models
        .iter()
        .filter(|m| model_allowed(allowed, &m.name))
        .map(std::borrow::Cow::Borrowed);
    let under_wildcards = allowed
        .iter()
        .filter(|name| config.catalog.model(name).is_none())
        .filter_map(|name| config.catalog.resolve(name));
    let data: Vec<Value> = entries
        .chain(under_wildcards)
        .filter(|m| in_region(config, key, &m.provider))
        .map(|m| object(&m))
        .collect();
    Json(json!({"object": "list", "data": data})).into_response()
}

/// One model by its id, which holds `/` (the route is a catch-all): a catalog entry (a
/// wildcard by its own name), or the model a name under a wildcard names. An id the catalog
/// does not serve, or the key may not use, is the same 404: a key learns nothing of models
/// kept from it.
pub fn one(config: &NodeConfig, key: &Key, id: &str) -> Response {
    match config.catalog.resolve(id) {
        Some(model)
            if model_allowed(&key.settings.allowed_models, id)
                && in_region(config, key, &model.provider) =>
        {
            Json(object(&model)).into_response()
        }
        _ => not_found(id),
    }
}

fn object(model: &Model) -> Value {
    let mut object = json!({
        "id": model.name,
        "object": "model",
        "created": 0,
        "owned_by": model.provider,
        "type": model.model_type.as_str(),
    });
    if let Some(dimensions) = model.dimensions {
        object["dimensions"] = json!(dimensions);
    }
    object
}

/// Whether the key's allowed regions (none: every region) hold `provider`'s.
fn in_region(config: &NodeConfig, key: &Key, provider: &str) -> bool {
    let allowed = &key.settings.allowed_regions;
    allowed.is_empty()
        || config
            .catalog
            .provider(provider)
            .and_then(|p| p.region.as_ref())
            .is_some_and(|r| allowed.contains(r))
}

/// OpenAI's answer to retrieving a model that is not there: 404, `model_not_found`, in the
/// error shape every other refusal has. (A chat request naming an unknown model stays a 400,
/// as it always was here.)
fn not_found(id: &str) -> Response {
    let error = ApiError::ModelNotFound {
        message: format!("The model `{id}` does not exist or you do not have access to it."),
        param: "model".to_owned(),
    };
    let mut response = error.render(Flavor::OpenAi);
    *response.status_mut() = StatusCode::NOT_FOUND;
    response
}
