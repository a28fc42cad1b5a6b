//! How a chain is formed (docs/http-api.md, "How the chain is formed"): from `models`, from
//! `model` + `fallback_models`, or from the key's `failoverDefaults`; checked against the
//! catalog and the key's policy before any upstream call.

use std::sync::Arc;
use std::time::Duration;

use bytes::Bytes;

use switchyard_catalog::keys::MAX_CHAIN_MODELS;
use switchyard_catalog::{
    Degraded, FailoverReason, Fault, Model, ModelType, model_allowed, rest_under, wildcard_prefix,
};

use crate::chaos;
use crate::config::NodeConfig;
use crate::deployment::{Member, Pool};
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
    /// A model with `deployments`: which of them this request may use, each with its own
    /// body and faults (`body` and `faults` above are then unused).
    pub deployments: Option<Deployments>,
}

/// The deployments of an entry's model that a request may use.
#[derive(Clone, Debug)]
pub struct Deployments {
    pub pool: Arc<Pool>,
    /// As a bit set over `pool.members`: the key's regions allow them and their provider
    /// can take the request.
    pub allowed: u64,
    /// By member: the upstream body of a translating adapter, and the injected faults.
    pub bodies: Box<[Option<Bytes>]>,
    pub faults: Box<[Vec<Arc<Fault>>]>,
}

/// What one try of an attempt calls: the entry's model, or one of its deployments.
#[derive(Clone, Copy, Debug)]
pub struct Target<'a> {
    pub model: &'a Arc<Model>,
    pub body: Option<&'a Bytes>,
    pub faults: &'a [Arc<Fault>],
    /// The deployment, for a model with `deployments`.
    pub member: Option<&'a Member>,
}

impl<'a> Target<'a> {
    /// The deployment's id (`<provider>/<upstream_model>`), for a model with `deployments`.
    pub fn deployment(&self) -> Option<&'a Arc<str>> {
        self.member.map(|m| &m.id)
    }
}

impl Entry {
    /// The entry's one target, for a model without `deployments`.
    pub fn target(&self) -> Target<'_> {
        Target { model: &self.model, body: self.body.as_ref(), faults: &self.faults, member: None }
    }
}

impl Deployments {
    /// Member `i` as a target.
    pub fn target(&self, i: usize) -> Target<'_> {
        let member = &self.pool.members[i];
        Target {
            model: &member.model,
            // Empty when no member's adapter translates, or no drill is on.
            body: self.bodies.get(i).and_then(Option::as_ref),
            faults: self.faults.get(i).map_or(&[], Vec::as_slice),
            member: Some(member),
        }
    }
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
    /// The session the request names, when affinity is on for it (docs/catalog.md, "Session
    /// affinity"): it picks among a model's deployments. Set by the HTTP layer, which has
    /// the headers.
    pub session: Option<Box<str>>,
}

impl Chain {
    pub fn requested_model(&self) -> &str {
        self.entries.first().map_or("", |e| e.model.name.as_str())
    }

    /// A chain of one model with one deployment is a legacy request: no failover report.
    /// One model with several deployments it may use reports like a chain: its attempts
    /// can move between deployments.
    pub fn is_multi_model(&self) -> bool {
        match self.entries.as_slice() {
            [one] => one.deployments.as_ref().is_some_and(|d| d.allowed.count_ones() > 1),
            entries => entries.len() > 1,
        }
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
        let model = lookup(config, &s.model, &s.param)?;
        let pool = match model.deployments.is_empty() {
            true => None,
            false => config.pools.get(&model.name),
        };
        check_policy(key, config, &model, pool.map(|p| &**p), &s.model, &s.param)?;
        check_type(request, config, &model, &s, entries.first())?;
        let timeout = s
            .timeout_ms
            .or(chain_timeout)
            .map_or(DEFAULT_TIMEOUT, |ms| Duration::from_millis(ms.into()));
        let first_token_timeout = s
            .first_token_timeout_ms
            .or(chain_first_token)
            .map_or(DEFAULT_FIRST_TOKEN_TIMEOUT, |ms| Duration::from_millis(ms.into()));
        if let Some(pool) = pool {
            let deployments = deployments(request, key, config, pool, &s)?;
            entries.push(Entry {
                body: None,
                faults: Vec::new(),
                timeout,
                first_token_timeout,
                model,
                deployments: Some(deployments),
            });
            continue;
        }
        // A provider that cannot honour the request (a strict schema it has no mechanism
        // for) is refused here, before any upstream call, rather than silently ignored: its
        // translation fails, and the body translated here is the one every attempt sends.
        let body = translate(request, config, &model).map_err(|message| {
            ApiError::invalid(
                s.param.clone(),
                format!("The model `{}` cannot serve this request: {message}", model.name),
            )
        })?;
        entries.push(Entry {
            body,
            faults: chaos::matching(&config.faults, &model.name, &model.provider, &key.id),
            timeout,
            first_token_timeout,
            model,
            deployments: None,
        });
    }
    let on = request
        .redundancy
        .on
        .clone()
        .or_else(|| defaults.and_then(|d| d.on.clone()))
        .unwrap_or_else(|| FailoverReason::ALL.to_vec());
    let deadline = request.redundancy.deadline_ms.map(|ms| Duration::from_millis(ms.into()));
    // A designed answer is text: an embeddings request has no use for one.
    let degraded = match request.embeddings {
        Some(_) => None,
        None => request
            .redundancy
            .degraded
            .clone()
            .or_else(|| defaults.and_then(|d| d.degraded.clone())),
    };
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
    Ok(Chain { entries, on, deadline, degraded, output, continue_streams, session: None })
}

/// The upstream body for `model`, when its adapter translates: translated here, once, so a
/// request the provider cannot take is refused (`Err` says why) before any call.
fn translate(
    request: &ChatRequest<'_>,
    config: &NodeConfig,
    model: &Model,
) -> Result<Option<Bytes>, String> {
    match config.providers.get(&model.provider) {
        Some(provider) if provider.translates() => match provider.body(model, request) {
            Ok(body) => Ok(Some(body)),
            Err(CallError::Unsupported { message, .. }) => Err(message),
            // A bug of ours, not the client's: the attempt meets it again and the failure
            // classifier fails over to the next model.
            Err(e) => {
                tracing::error!(model = %model.name, error = %e, "translating a request failed");
                Ok(None)
            }
        },
        _ => Ok(None),
    }
}

/// The deployments of `pool` this request may use: those in the key's regions whose
/// provider can take the request, each with its body and faults. None left is the client's
/// error, named as a model that cannot serve is.
fn deployments(
    request: &ChatRequest<'_>,
    key: &Key,
    config: &NodeConfig,
    pool: &Arc<Pool>,
    spec: &EntrySpec,
) -> Result<Deployments, ApiError> {
    let regions = &key.settings.allowed_regions;
    let mut allowed = 0u64;
    let mut bodies = Vec::with_capacity(pool.members.len());
    let mut faults = Vec::with_capacity(pool.members.len());
    let mut refusal = None;
    for (i, member) in pool.members.iter().enumerate() {
        let in_region = regions.is_empty()
            || member.region.as_ref().is_some_and(|r| regions.iter().any(|a| a == r));
        let body = if in_region { translate(request, config, &member.model) } else { Ok(None) };
        match body {
            Ok(body) if in_region => {
                allowed |= 1 << i;
                bodies.push(body);
            }
            Ok(_) => bodies.push(None),
            Err(message) => {
                refusal.get_or_insert(message);
                bodies.push(None);
            }
        }
        if !config.faults.is_empty() {
            let (name, provider) = (&member.model.name, &member.model.provider);
            faults.push(chaos::matching(&config.faults, name, provider, &key.id));
        }
    }
    if allowed == 0 {
        let name = &spec.model;
        return Err(match refusal {
            Some(message) => ApiError::invalid(
                spec.param.clone(),
                format!("The model `{name}` cannot serve this request: {message}"),
            ),
            None => ApiError::ModelNotAllowed {
                message: format!(
                    "The model `{name}` has no deployment in this API key's allowed regions ({}).",
                    regions.join(", ")
                ),
                param: spec.param.clone(),
            },
        });
    }
    // Kept only when they hold something: most requests carry neither a translated body
    // nor a fault.
    if bodies.iter().all(Option::is_none) {
        bodies = Vec::new();
    }
    Ok(Deployments {
        pool: Arc::clone(pool),
        allowed,
        bodies: bodies.into(),
        faults: faults.into(),
    })
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

/// The model a chain entry names (`param`): its catalog entry, else the model under the
/// longest wildcard it falls under (docs/catalog.md, "Wildcard models"). A name under a
/// wildcard is its own model — its breaker, metric series and events — while the wildcard
/// has room for it on this node ([`crate::config::WildcardNames`]); past that it is served
/// folded into the wildcard, named as the wildcard is, its breaker the wildcard's one.
///
/// Built per request, not cached: a clone of one catalog entry costs less than a shared
/// cache's lookup and bookkeeping would, and explicit names never come here.
pub fn lookup(config: &NodeConfig, name: &str, param: &str) -> Result<Arc<Model>, ApiError> {
    if let Some(model) = config.models.get(name) {
        return Ok(Arc::clone(model));
    }
    if let Some(prefix) = wildcard_prefix(name) {
        return Err(ApiError::invalid(
            param,
            format!(
                "The model `{name}` is a wildcard: a request names one model under it, e.g. `{prefix}<model>`."
            ),
        ));
    }
    let found = config
        .wildcards
        .iter()
        .find_map(|w| Some((w, wildcard_prefix(&w.name).and_then(|p| rest_under(p, name))?)));
    let Some((wildcard, rest)) = found else {
        return Err(ApiError::ModelNotFound {
            message: format!("The model `{name}` does not exist in this gateway's catalog."),
            param: param.to_owned(),
        });
    };
    let name = if config.wildcard_names.admit(&wildcard.name, name) {
        name.to_owned()
    } else {
        wildcard.name.clone()
    };
    Ok(Arc::new(Model { name, upstream_model: rest.to_owned(), ..Model::clone(wildcard) }))
}

/// A chat request takes chat models only, an embeddings request embedding models only, all
/// of one `dimensions` (a vector from a fallback must be usable where the first model's
/// are: docs/http-api.md, "`POST /v1/embeddings`"); and each model's provider must be able
/// to take the embeddings request as it is. `first` is the chain's first entry, if this is
/// not it.
fn check_type(
    request: &ChatRequest<'_>,
    config: &NodeConfig,
    model: &Model,
    spec: &EntrySpec,
    first: Option<&Entry>,
) -> Result<(), ApiError> {
    let name = &spec.model;
    let Some(embeddings) = &request.embeddings else {
        if model.model_type == ModelType::Chat {
            return Ok(());
        }
        return Err(ApiError::invalid(
            spec.param.clone(),
            format!(
                "The model `{name}` is an embedding model (type: {}): it cannot serve a chat request.",
                model.model_type.as_str()
            ),
        ));
    };
    if model.model_type != ModelType::Embedding {
        return Err(ApiError::invalid(
            spec.param.clone(),
            format!(
                "The model `{name}` is a chat model (type: {}): it cannot serve an embeddings request.",
                model.model_type.as_str()
            ),
        ));
    }
    if let Some(first) = first
        && first.model.dimensions != model.dimensions
    {
        let dims = |d: Option<u32>| d.map_or_else(|| "unknown".to_owned(), |d| d.to_string());
        return Err(ApiError::invalid(
            spec.param.clone(),
            format!(
                "The model `{name}` makes vectors of {} dimensions and `{}` of {}: a chain fails over only between embedding models of the same dimensions.",
                dims(model.dimensions),
                first.model.name,
                dims(first.model.dimensions)
            ),
        ));
    }
    let kind = config.catalog.provider(&model.provider).map(|p| p.kind);
    match kind {
        Some(kind) => embeddings.check(model, kind, &spec.param),
        // An unconfigured provider fails the attempt, as on chat.
        None => Ok(()),
    }
}

/// The key's allow-list (for the name the client sent: a name folded into its wildcard is
/// still allowed by its own) and allowed regions, checked for every model of the chain (each
/// attempt is a full, independent call under the same policy).
fn check_policy(
    key: &Key,
    config: &NodeConfig,
    model: &Model,
    pool: Option<&Pool>,
    requested: &str,
    param: &str,
) -> Result<(), ApiError> {
    let settings = &key.settings;
    if !model_allowed(&settings.allowed_models, requested) {
        return Err(ApiError::ModelNotAllowed {
            message: format!("This API key may not use the model `{requested}`."),
            param: param.to_owned(),
        });
    }
    // A pool's regions are checked per deployment (`deployments`).
    if !settings.allowed_regions.is_empty() && pool.is_none() {
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

#[cfg(test)]
mod tests {
    use super::*;

    use crate::config::{CATALOG, Change, WILDCARD_NAMES_MAX};

    fn config() -> NodeConfig {
        let catalog = serde_json::json!({
            "providers": [{"name": "p", "kind": "openai", "base_url": "https://api.example.com/v1"}],
            "models": [
                {"name": "p/*", "provider": "p", "max_tokens": 10},
                {"name": "p/pinned", "provider": "p", "upstream_model": "pinned-2025"},
                {"name": "p/long/*", "provider": "p", "max_tokens": 20}
            ]
        });
        NodeConfig::default()
            .apply(Change::Snapshot {
                version: 1,
                resources: vec![(CATALOG.into(), serde_json::to_vec(&catalog).unwrap())],
            })
            .unwrap()
    }

    fn names(m: &Model) -> (&str, &str, Option<u32>) {
        (&m.name, &m.upstream_model, m.max_tokens)
    }

    #[test]
    fn an_explicit_entry_wins_then_the_longest_wildcard_sends_the_rest_upstream() {
        let config = config();
        assert_eq!(config.models.len(), 1, "wildcards are not in the map of names");
        let pinned = lookup(&config, "p/pinned", "model").unwrap();
        assert_eq!(names(&pinned), ("p/pinned", "pinned-2025", None));
        let long = lookup(&config, "p/long/x", "model").unwrap();
        assert_eq!(names(&long), ("p/long/x", "x", Some(20)));
        let short = lookup(&config, "p/other/x", "model").unwrap();
        assert_eq!(names(&short), ("p/other/x", "other/x", Some(10)));
    }

    #[test]
    fn a_wildcard_or_a_name_under_none_is_refused_naming_the_field() {
        let config = config();
        let ApiError::InvalidRequest { message, param, .. } =
            lookup(&config, "p/*", "fallback_models[1]").unwrap_err()
        else {
            panic!("a wildcard is a bad request")
        };
        assert_eq!(param.as_deref(), Some("fallback_models[1]"));
        assert!(message.contains("`p/*` is a wildcard") && message.contains("`p/<model>`"));
        for unknown in ["q/x", "p/", "p"] {
            assert!(
                matches!(lookup(&config, unknown, "model"), Err(ApiError::ModelNotFound { .. })),
                "{unknown}"
            );
        }
    }

    #[test]
    fn names_past_the_most_a_wildcard_tracks_are_folded_into_it() {
        let config = config();
        for i in 0..WILDCARD_NAMES_MAX {
            let m = lookup(&config, &format!("p/m{i}"), "model").unwrap();
            assert_eq!(m.name, format!("p/m{i}"));
        }
        let folded = lookup(&config, "p/one-too-many", "model").unwrap();
        assert_eq!(names(&folded), ("p/*", "one-too-many", Some(10)));
        assert!(folded.is_wildcard(), "its breaker is the wildcard's one");
        let known = lookup(&config, "p/m0", "model").unwrap();
        assert_eq!(known.name, "p/m0", "an admitted name keeps its own");
        let other = lookup(&config, "p/long/x", "model").unwrap();
        assert_eq!(other.name, "p/long/x", "each wildcard has its own room");
        // A new config version keeps what the node admitted: the series it bounds stay.
        let next = config.apply(Change::Update { version: 2, upserts: vec![], deletes: vec![] });
        let next = next.unwrap();
        assert_eq!(lookup(&next, "p/another", "model").unwrap().name, "p/*");
        let resync = next.begin_snapshot(3).finish();
        assert!(Arc::ptr_eq(&resync.wildcard_names, &config.wildcard_names));
    }
}
