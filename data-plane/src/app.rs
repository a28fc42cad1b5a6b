//! What every request of a node shares: its config, the node's services (telemetry,
//! limits, metrics, breakers), its executor; and the helpers both the plain and the
//! streaming response use. Below `http` and `stream`, so neither reaches into the other.

use std::sync::Arc;

use http::{HeaderMap, HeaderName, HeaderValue};
use serde_json::value::RawValue;

use switchyard_catalog::Model;

use crate::executor::Executor;
use crate::providers::Usage;
use crate::services::Services;
use crate::state::NodeState;

pub struct App {
    pub state: Arc<NodeState>,
    /// What the node owns: telemetry, limits, metrics, breakers, loads.
    pub services: Arc<Services>,
    /// Runs each request's chain, on those services.
    pub executor: Executor,
    pub max_body_bytes: usize,
}

impl App {
    pub fn new(state: Arc<NodeState>, services: Services, max_body_bytes: usize) -> Self {
        let services = Arc::new(services);
        let executor = Executor::new(Arc::clone(&services));
        Self { state, services, executor, max_body_bytes }
    }
}

/// Usage is billed to the model that served, at the catalog's prices.
pub fn record_usage(app: &App, key_id: &str, model: &Model, usage: Usage) {
    let cost = model.price.map_or(0.0, |p| {
        (usage.prompt_tokens as f64 * p.input_per_mtok
            + usage.completion_tokens as f64 * p.output_per_mtok)
            / 1_000_000.0
    });
    let services = &app.services;
    services.telemetry.record_usage(
        key_id,
        &model.name,
        usage.prompt_tokens,
        usage.completion_tokens,
        cost,
    );
    // A key's limits count what the model that served used (docs/limits.md). The counts
    // are the upstream's: a sum that would overflow saturates rather than panic or wrap.
    services.limits.record(
        key_id,
        usage.prompt_tokens.saturating_add(usage.completion_tokens),
        (cost * 1e6).round() as u64,
        switchyard_time::now_ms(),
    );
}

/// A value as raw JSON, to splice into a response without building a tree.
pub fn raw(value: &impl serde::Serialize) -> Option<Box<RawValue>> {
    serde_json::value::to_raw_value(value).ok()
}

pub const SERVED_MODEL: HeaderName = HeaderName::from_static("x-served-model");
pub const REQUESTED_MODEL: HeaderName = HeaderName::from_static("x-requested-model");
/// The deployment that served, on an answer of a model with `deployments` (docs/catalog.md,
/// "Deployments").
pub const SERVED_DEPLOYMENT: HeaderName = HeaderName::from_static("x-served-deployment");

/// `x-served-model` and `x-requested-model` (docs/http-api.md, "Response headers"), on every
/// stream and on a plain answer of a chain of more than one model; a name that is not a
/// valid header value is left out.
pub fn model_headers(headers: &mut HeaderMap, served: &str, requested: &str) {
    if let Ok(v) = HeaderValue::from_str(served) {
        headers.insert(SERVED_MODEL, v);
    }
    if let Ok(v) = HeaderValue::from_str(requested) {
        headers.insert(REQUESTED_MODEL, v);
    }
}
