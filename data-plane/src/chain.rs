//! How a chain is formed (docs/http-api.md, "How the chain is formed"): from `models`, from
//! `model` + `fallback_models`, or from the key's `failoverDefaults`; checked against the
//! catalog and the key's policy before any upstream call.

use std::time::Duration;

use bytes::Bytes;

use switchyard_catalog::keys::MAX_CHAIN_MODELS;
use switchyard_catalog::{Degraded, FailoverReason, Fault, Model};

use crate::chaos;
use crate::config::NodeConfig;
use crate::error::ApiError;
use crate::keys::Key;
use crate::providers::CallError;
use crate::request::{ChatRequest, EntrySpec};
use crate::structured::OutputCheck;

pub const DEFAULT_TIMEOUT: Duration = Duration::from_millis(60_000);
pub const DEFAULT_FIRST_TOKEN_TIMEOUT: Duration = Duration::from_millis(10_000);

#[derive(Clone, Debug)]
pub struct Entry {
    pub model: std::sync::Arc<Model>,
    /// Bounds the whole attempt, a stream's body included.
    pub timeout: Duration,
    pub first_token_timeout: Duration,
    /// The upstream body, when the model's adapter translates: translated here, once, so a
    /// request the provider cannot take is refused before any call. `None` for
    /// pass-through adapters, whose body is built by the attempt that sends it.
    pub body: Option<Bytes>,
    /// The injected faults that match this entry's calls (its model or provider, and the
    /// request's key); empty unless a drill is on.
    pub faults: Vec<std::sync::Arc<Fault>>,
}

#[derive(Clone, Debug)]
pub struct Chain {
    pub entries: Vec<Entry>,
    /// Failure classes that fail over.
    pub on: Vec<FailoverReason>,
    /// One budget across every attempt, when the client set `redundancy.deadline_ms`.
    pub deadline: Option<Duration>,
    /// The designed answer when no model can serve: the request's, else the key's.
    pub degraded: Option<Degraded>,
    /// The request's `response_format`, compiled (or kept from an earlier request) once for
    /// every attempt, when answers are checked against it: `on` holds `invalid_output`, the request is not a stream and its
    /// `response_format` asks for JSON (docs/http-api.md, "Structured outputs").
    pub output: Option<std::sync::Arc<OutputCheck>>,
    /// Continue a committed stream that breaks (docs/http-api.md, "Streaming"): the
    /// request's `redundancy.continue_streams`, else the key's, else on.
    pub continue_streams: bool,
}

impl Chain {
    pub fn requested_model(&self) -> &str {
        self.entries.first().map_or("", |e| e.model.name.as_str())
    }

    /// A chain of one is a legacy request: no failover report.
    pub fn is_multi_model(&self) -> bool {
        self.entries.len() > 1
    }

    pub fn fails_over_on(&self, reason: FailoverReason) -> bool {
        self.on.contains(&reason)
    }
}

pub fn resolve(
    request: &ChatRequest<'_>,
    key: &Key,
    config: &NodeConfig,
) -> Result<Chain, ApiError> {
    let (specs, count_param) = match (&request.models, &request.model, &request.fallback_models) {
        (Some(_), _, Some(_)) => {
            return Err(ApiError::invalid(
                "fallback_models",
                "models and fallback_models cannot be combined in one request",
            ));
        }
        (Some(models), _, None) => (models.clone(), "models"),
        (None, Some(model), Some(fallbacks)) => {
            let mut specs = vec![spec(model, "model")];
            specs.extend(fallbacks.iter().cloned());
            (specs, "fallback_models")
        }
        (None, Some(model), None) => (from_defaults(model, key), "model"),
        (None, None, _) => {
            return Err(ApiError::invalid("model", "you must provide a model parameter"));
        }
    };

    // Duplicates are dropped, first occurrence kept, before counting (never truncated).
    let mut distinct: Vec<EntrySpec> = Vec::with_capacity(specs.len());
    for s in specs {
        if !distinct.iter().any(|d| d.model == s.model) {
            distinct.push(s);
        }
    }
    if distinct.len() > MAX_CHAIN_MODELS {
        return Err(ApiError::invalid(
            count_param,
            format!(
                "a chain holds at most {MAX_CHAIN_MODELS} distinct models; this request names {}",
                distinct.len()
            ),
        ));
    }

    let defaults = key.settings.failover_defaults.as_ref();
    let chain_timeout = request.redundancy.timeout_ms.or(defaults.and_then(|d| d.timeout_ms));
    let chain_first_token = request
        .redundancy
        .first_token_timeout_ms
        .or(defaults.and_then(|d| d.first_token_timeout_ms));
    let mut entries = Vec::with_capacity(distinct.len());
    for s in distinct {
        let model =
            config.models.get(&s.model).cloned().ok_or_else(|| ApiError::ModelNotFound {
                message: format!(
                    "The model `{}` does not exist in this gateway's catalog.",
                    s.model
                ),
                param: s.param.clone(),
            })?;
        check_policy(key, config, &model, &s.param)?;
        // A provider that cannot honour the request (a strict schema it has no mechanism
        // for) is refused here, before any upstream call, rather than silently ignored: its
        // translation fails, and the body translated here is the one every attempt sends.
        let body = match config.providers.get(&model.provider) {
            Some(provider) if provider.translates() => match provider.body(&model, request) {
                Ok(body) => Some(body),
                Err(CallError::Unsupported { message, .. }) => {
                    return Err(ApiError::invalid(
                        s.param.clone(),
                        format!("The model `{}` cannot serve this request: {message}", model.name),
                    ));
                }
                // A bug of ours, not the client's: the attempt meets it again and the
                // failure classifier fails over to the next model.
                Err(e) => {
                    tracing::error!(model = %model.name, error = %e, "translating a request failed");
                    None
                }
            },
            _ => None,
        };
        entries.push(Entry {
            body,
            faults: chaos::matching(&config.faults, &model.name, &model.provider, &key.id),
            timeout: s
                .timeout_ms
                .or(chain_timeout)
                .map_or(DEFAULT_TIMEOUT, |ms| Duration::from_millis(ms.into())),
            first_token_timeout: s
                .first_token_timeout_ms
                .or(chain_first_token)
                .map_or(DEFAULT_FIRST_TOKEN_TIMEOUT, |ms| Duration::from_millis(ms.into())),
            model,
        });
    }
    let on = request
        .redundancy
        .on
        .clone()
        .or_else(|| defaults.and_then(|d| d.on.clone()))
        .unwrap_or_else(|| FailoverReason::ALL.to_vec());
    let deadline = request.redundancy.deadline_ms.map(|ms| Duration::from_millis(ms.into()));
    let degraded =
        request.redundancy.degraded.clone().or_else(|| defaults.and_then(|d| d.degraded.clone()));
    // Streams are not checked: their content reaches the client as it comes.
    let output = if on.contains(&FailoverReason::InvalidOutput) && !request.stream {
        config
            .schemas
            .get(request.passthrough.get("response_format").copied())
            .map_err(|e| ApiError::invalid(e.param(), e.to_string()))?
    } else {
        None
    };
    let continue_streams = request
        .redundancy
        .continue_streams
        .or_else(|| defaults.and_then(|d| d.continue_streams))
        .unwrap_or(true);
    Ok(Chain { entries, on, deadline, degraded, output, continue_streams })
}

fn spec(model: &str, param: &str) -> EntrySpec {
    EntrySpec {
        model: model.to_owned(),
        timeout_ms: None,
        first_token_timeout_ms: None,
        param: param.to_owned(),
    }
}

/// `model` alone: the key's default chain from `model`'s position on, else a single attempt.
fn from_defaults(model: &str, key: &Key) -> Vec<EntrySpec> {
    let defaults =
        key.settings.failover_defaults.as_ref().map(|d| d.models.as_slice()).unwrap_or(&[]);
    match defaults.iter().position(|m| m == model) {
        Some(pos) => defaults[pos..].iter().map(|m| spec(m, "model")).collect(),
        None => vec![spec(model, "model")],
    }
}

/// The key's allow-list and allowed regions, checked for every model of the chain (each
/// attempt is a full, independent call under the same policy).
fn check_policy(
    key: &Key,
    config: &NodeConfig,
    model: &Model,
    param: &str,
) -> Result<(), ApiError> {
    let settings = &key.settings;
    if !settings.allowed_models.is_empty() && !settings.allowed_models.contains(&model.name) {
        return Err(ApiError::ModelNotAllowed {
            message: format!("This API key may not use the model `{}`.", model.name),
            param: param.to_owned(),
        });
    }
    if !settings.allowed_regions.is_empty() {
        let region = config.catalog.provider(&model.provider).and_then(|p| p.region.as_deref());
        if !region.is_some_and(|r| settings.allowed_regions.iter().any(|a| a == r)) {
            return Err(ApiError::ModelNotAllowed {
                message: format!(
                    "The model `{}` is served from region {}, outside this API key's allowed regions ({}).",
                    model.name,
                    region.unwrap_or("(none)"),
                    settings.allowed_regions.join(", ")
                ),
                param: param.to_owned(),
            });
        }
    }
    Ok(())
}
