//! The model catalog: what `switchyard apply -f catalog.yaml` declares (docs/catalog.md).
//!
//! Parsing is strict (`deny_unknown_fields`: a typo fails loudly, naming the field);
//! [`Catalog::validate`] then checks what serde cannot: references between sections,
//! uniqueness, ranges.

use std::borrow::Cow;
use std::collections::BTreeMap;

use serde::{Deserialize, Serialize};

use crate::address;
use crate::credential::CredentialRef;
use crate::error::{FieldError, ValidationErrors};
use crate::keys::FailoverReason;
use crate::wildcard::{rest_under, wildcard_prefix};

pub const STALL_TIMEOUT_MS_DEFAULT: u32 = 30_000;
pub const STALL_TIMEOUT_MS_RANGE: (u32, u32) = (1_000, 600_000);

/// Event types a webhook may subscribe to (`*`: all of them).
pub const WEBHOOK_EVENTS: &[&str] = &[
    "api:model_failover",
    "api:degraded_response",
    "api:stream_continued",
    "breaker.opened",
    "breaker.half_open",
    "breaker.closed",
    "node.disconnected",
    "events.lost",
    "*",
];

#[derive(Clone, Debug, Default, PartialEq, Serialize, Deserialize)]
#[serde(deny_unknown_fields)]
pub struct Catalog {
    #[serde(default)]
    pub providers: Vec<Provider>,
    #[serde(default)]
    pub models: Vec<Model>,
    #[serde(default)]
    pub breaker_policy: BreakerPolicy,
    /// Retries inside one attempt. Absent: a failed call fails its attempt, unless a request
    /// asks for retries (`redundancy.max_retries`).
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub retry_policy: Option<RetryPolicy>,
    /// Probes of every model (docs/catalog.md, "`probe`"). Absent: no model is probed
    /// unless its own `probe` says so.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub probe: Option<ProbePolicy>,
    #[serde(default)]
    pub webhooks: Vec<Webhook>,
}

#[derive(Clone, Copy, Debug, PartialEq, Eq, Serialize, Deserialize)]
#[serde(rename_all = "kebab-case")]
pub enum ProviderKind {
    Openai,
    AzureOpenai,
    Anthropic,
    Gemini,
    OpenaiCompatible,
}

#[derive(Clone, Debug, PartialEq, Serialize, Deserialize)]
#[serde(deny_unknown_fields)]
pub struct Provider {
    pub name: String,
    pub kind: ProviderKind,
    pub base_url: String,
    /// Credential references; the first is the primary, the rest are reserves tried on an
    /// upstream 401/403.
    #[serde(default, skip_serializing_if = "Vec::is_empty")]
    pub api_keys: Vec<CredentialRef>,
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub region: Option<String>,
    /// Azure OpenAI's `api-version` query parameter (required for `azure-openai`), or
    /// Anthropic's `anthropic-version` header (default `2023-06-01`).
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub api_version: Option<String>,
    /// The most requests a node has in flight to this provider, over all its deployments
    /// (docs/catalog.md, "Upstream concurrency").
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub max_concurrency: Option<u32>,
    /// Lower the cap when the provider answers 429 or slows, raise it again as answers come
    /// back (AIMD), never above `max_concurrency`.
    #[serde(default, skip_serializing_if = "std::ops::Not::not")]
    pub adaptive: bool,
}

#[derive(Clone, Debug, PartialEq, Serialize, Deserialize)]
#[serde(deny_unknown_fields)]
pub struct Model {
    /// The gateway name clients send, e.g. `openai/gpt-5-nano`; or a wildcard, `openai/*`,
    /// that admits every `openai/<rest>` and sends `<rest>` upstream (docs/catalog.md,
    /// "Wildcard models").
    pub name: String,
    /// Where the model is served, when one deployment serves it: the other form of
    /// `deployments`. Empty on a model with `deployments`.
    #[serde(default, skip_serializing_if = "String::is_empty")]
    pub provider: String,
    /// The provider's name for the model. Required, except on a wildcard, which takes none:
    /// the rest of the requested name is the upstream model.
    #[serde(default, skip_serializing_if = "String::is_empty")]
    pub upstream_model: String,
    /// Several deployments serving this one model (docs/catalog.md, "Deployments"), in
    /// place of `provider`/`upstream_model`.
    #[serde(
        default,
        skip_serializing_if = "Vec::is_empty",
        deserialize_with = "listed_deployments"
    )]
    pub deployments: Vec<Deployment>,
    /// How an attempt picks among `deployments`.
    #[serde(default, skip_serializing_if = "Balance::is_weighted")]
    pub balance: Balance,
    /// A cap on requests in flight to this model's one deployment (the form with
    /// `provider`); each of `deployments` carries its own.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub max_concurrency: Option<u32>,
    #[serde(default, skip_serializing_if = "std::ops::Not::not")]
    pub adaptive: bool,
    /// What the model serves: chat (the default) or embeddings.
    #[serde(rename = "type", default, skip_serializing_if = "ModelType::is_chat")]
    pub model_type: ModelType,
    /// The length of an embedding model's vectors: required for `type: embedding`, refused
    /// on a chat model.
    #[serde(
        default,
        skip_serializing_if = "Option::is_none",
        deserialize_with = "positive_dimensions"
    )]
    pub dimensions: Option<u32>,
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub price: Option<Price>,
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub stall_timeout_ms: Option<u32>,
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub breaker: Option<BreakerOverride>,
    /// Per-model changes to `retry_policy` (or to its defaults, when the catalog has none:
    /// an override turns retries on for this model).
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub retry: Option<RetryOverride>,
    /// Output tokens asked for when the client sets no `max_tokens`/`max_completion_tokens`
    /// and the provider requires a value (Anthropic).
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub max_tokens: Option<u32>,
    /// Per-model changes to the catalog's `probe` (or to its defaults, when the catalog has
    /// none: an override turns probes on for this model).
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub probe: Option<ProbeOverride>,
    /// Whether the model can continue an answer another call began (docs/http-api.md,
    /// "Streaming"): the node asks it to, after a stream broke, only when `prefill`.
    #[serde(default, skip_serializing_if = "Continuation::is_none")]
    pub continuation: Continuation,
    /// The most tokens a prompt may hold for this model. After a context-length refusal a
    /// chain fails over only to a later model with a larger window (docs/http-api.md,
    /// "Failover"); a model without one is never taken for larger.
    #[serde(
        default,
        skip_serializing_if = "Option::is_none",
        deserialize_with = "positive_tokens"
    )]
    pub context_window: Option<u64>,
    /// The model takes a reasoning effort: a request's reasoning ask (Anthropic's
    /// `thinking`, OpenAI's `reasoning_effort`) reaches it in its provider's form. Without
    /// it the ask is dropped, never sent to a model that would refuse it, and named in the
    /// answer's `x-dropped-hints` (docs/messages.md). Anthropic models served a
    /// `/v1/messages` request get `thinking` as sent either way.
    #[serde(default, skip_serializing_if = "std::ops::Not::not")]
    pub reasoning: bool,
}

/// One deployment of a model: a provider and its name for the model (docs/catalog.md,
/// "Deployments").
#[derive(Clone, Debug, PartialEq, Serialize, Deserialize)]
#[serde(deny_unknown_fields)]
pub struct Deployment {
    pub provider: String,
    pub upstream_model: String,
    /// Its share of the model's requests under `balance: weighted`.
    #[serde(default = "one", skip_serializing_if = "is_one", deserialize_with = "positive_weight")]
    pub weight: u32,
    /// Where it serves from, for keys' `allowed_regions`: else its provider's region.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub region: Option<String>,
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub max_concurrency: Option<u32>,
    #[serde(default, skip_serializing_if = "std::ops::Not::not")]
    pub adaptive: bool,
}

impl Deployment {
    /// How reports, metrics and the CLI name it: `<provider>/<upstream_model>`, unique within
    /// a model (two identical deployments are refused) and the key of its breaker.
    pub fn id(&self) -> String {
        format!("{}/{}", self.provider, self.upstream_model)
    }
}

/// `deployments`: absent, or at least one. `[]` would read as absent and then be refused for
/// a missing `provider`, naming the wrong field.
fn listed_deployments<'de, D: serde::Deserializer<'de>>(d: D) -> Result<Vec<Deployment>, D::Error> {
    let listed = Vec::<Deployment>::deserialize(d)?;
    if listed.is_empty() {
        return Err(serde::de::Error::custom(
            "must list at least one deployment (or leave deployments out and name the model's provider)",
        ));
    }
    Ok(listed)
}

fn one() -> u32 {
    1
}

fn is_one(w: &u32) -> bool {
    *w == 1
}

/// The most deployments one model may list: a node keeps the set a request may use as a
/// 64-bit set, so `apply` refuses more rather than a node ignoring the rest.
pub const MAX_DEPLOYMENTS: usize = 64;

const MUST_BE_CAP: &str = "must be at least 1 (requests in flight)";
const MUST_BE_WEIGHT: &str = "must be a positive integer (a share of the model's requests)";

/// `weight`: 0 is refused by `validate`; negatives, fractions and text here, with one message.
fn positive_weight<'de, D: serde::Deserializer<'de>>(d: D) -> Result<u32, D::Error> {
    match d.deserialize_any(Positive(MUST_BE_WEIGHT))? {
        Some(v) => u32::try_from(v).map_err(|_| serde::de::Error::custom(MUST_BE_WEIGHT)),
        None => Err(serde::de::Error::custom(MUST_BE_WEIGHT)),
    }
}

/// How an attempt picks one of a model's deployments.
#[derive(Clone, Copy, Debug, Default, PartialEq, Eq, Serialize, Deserialize)]
#[serde(rename_all = "snake_case")]
pub enum Balance {
    /// In proportion to `weight`.
    #[default]
    Weighted,
    /// The cheaper of two: a decaying average of time to first byte times requests in flight.
    LeastLatency,
    /// Fewest requests in flight.
    LeastBusy,
}

impl Balance {
    pub fn is_weighted(&self) -> bool {
        *self == Balance::Weighted
    }

    pub fn as_str(self) -> &'static str {
        match self {
            Self::Weighted => "weighted",
            Self::LeastLatency => "least_latency",
            Self::LeastBusy => "least_busy",
        }
    }
}

/// What a model serves (docs/catalog.md, "`models`"): a chat surface takes only `chat`
/// models, and an `embedding` model carries its `dimensions`.
#[derive(Clone, Copy, Debug, Default, PartialEq, Eq, Serialize, Deserialize)]
#[serde(rename_all = "snake_case")]
pub enum ModelType {
    #[default]
    Chat,
    Embedding,
}

impl Model {
    /// What this model shares with the others of a chain it can fail over within.
    pub fn chain_kind(&self) -> crate::keys::ChainKind {
        match self.model_type {
            ModelType::Chat => crate::keys::ChainKind::Chat,
            ModelType::Embedding => crate::keys::ChainKind::Embedding(self.dimensions),
        }
    }
}

impl ModelType {
    pub fn is_chat(&self) -> bool {
        *self == ModelType::Chat
    }

    pub fn as_str(self) -> &'static str {
        match self {
            Self::Chat => "chat",
            Self::Embedding => "embedding",
        }
    }
}

/// How a model continues an answer: `prefill` takes the text so far as the start of its own
/// answer (a trailing assistant message, in the form its provider's API takes it).
#[derive(Clone, Copy, Debug, Default, PartialEq, Eq, Serialize, Deserialize)]
#[serde(rename_all = "snake_case")]
pub enum Continuation {
    #[default]
    None,
    Prefill,
}

impl Continuation {
    pub fn is_none(&self) -> bool {
        *self == Continuation::None
    }
}

/// `context_window`: a whole number of tokens above zero. Read by hand so that `-5`, `1.5`
/// and `"8k"` get one message saying what the field takes, as `0` does from `validate`.
fn positive_tokens<'de, D: serde::Deserializer<'de>>(d: D) -> Result<Option<u64>, D::Error> {
    d.deserialize_any(Positive(MUST_BE_TOKENS))
}

/// `dimensions`: as `context_window`, and at most `u32::MAX`.
fn positive_dimensions<'de, D: serde::Deserializer<'de>>(d: D) -> Result<Option<u32>, D::Error> {
    match d.deserialize_any(Positive(MUST_BE_DIMENSIONS))? {
        Some(v) => {
            u32::try_from(v).map(Some).map_err(|_| serde::de::Error::custom(MUST_BE_DIMENSIONS))
        }
        None => Ok(None),
    }
}

/// A whole number ≥ 0 (`validate` refuses 0 with the same message), else the message held.
struct Positive(&'static str);

impl serde::de::Visitor<'_> for Positive {
    type Value = Option<u64>;
    fn expecting(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.write_str(self.0.trim_start_matches("must be "))
    }
    fn visit_u64<E: serde::de::Error>(self, v: u64) -> Result<Self::Value, E> {
        Ok(Some(v))
    }
    fn visit_i64<E: serde::de::Error>(self, v: i64) -> Result<Self::Value, E> {
        u64::try_from(v).map(Some).map_err(|_| E::custom(self.0))
    }
    fn visit_f64<E: serde::de::Error>(self, _: f64) -> Result<Self::Value, E> {
        Err(E::custom(self.0))
    }
    fn visit_str<E: serde::de::Error>(self, _: &str) -> Result<Self::Value, E> {
        Err(E::custom(self.0))
    }
    fn visit_bool<E: serde::de::Error>(self, _: bool) -> Result<Self::Value, E> {
        Err(E::custom(self.0))
    }
    fn visit_unit<E: serde::de::Error>(self) -> Result<Self::Value, E> {
        Ok(None)
    }
    fn visit_none<E: serde::de::Error>(self) -> Result<Self::Value, E> {
        Ok(None)
    }
}

const MUST_BE_TOKENS: &str = "must be a positive integer (tokens)";
const MUST_BE_DIMENSIONS: &str = "must be a positive integer (the length of the model's vectors)";

impl Model {
    pub fn stall_timeout_ms(&self) -> u32 {
        self.stall_timeout_ms.unwrap_or(STALL_TIMEOUT_MS_DEFAULT)
    }

    /// Each deployment as a model of its own: this entry's settings with the deployment's
    /// provider, upstream model and cap (one, itself, for the form with `provider`).
    pub fn deployment_models(&self) -> Vec<Model> {
        if self.deployments.is_empty() {
            return vec![self.clone()];
        }
        self.deployments
            .iter()
            .map(|d| Model {
                provider: d.provider.clone(),
                upstream_model: d.upstream_model.clone(),
                deployments: Vec::new(),
                max_concurrency: d.max_concurrency,
                adaptive: d.adaptive,
                ..self.clone()
            })
            .collect()
    }

    /// Whether this entry is a wildcard (`openai/*`) rather than one model.
    pub fn is_wildcard(&self) -> bool {
        wildcard_prefix(&self.name).is_some()
    }

    /// The upstream model its breaker is kept under, with its provider: the upstream model,
    /// or `*` for a wildcard, whose names all share one breaker.
    pub fn breaker_upstream(&self) -> &str {
        if self.is_wildcard() { "*" } else { &self.upstream_model }
    }

    /// The model `name` names under this wildcard: this entry's settings, `name` as its
    /// gateway name, and the rest of `name` after the prefix as its upstream model (none when
    /// `name` is itself a narrower wildcard, `openrouter/anthropic/*` under `openrouter/*`).
    /// `None` when this is no wildcard or `name` is not under it.
    pub fn under(&self, name: &str) -> Option<Model> {
        let rest = wildcard_prefix(&self.name).and_then(|prefix| rest_under(prefix, name))?;
        let upstream_model = if wildcard_prefix(name).is_some() { "" } else { rest };
        Some(Model {
            name: name.to_owned(),
            upstream_model: upstream_model.to_owned(),
            ..self.clone()
        })
    }
}

/// Why `name` is not a valid model or wildcard name, if it is not: `*` only as the whole
/// last path segment after at least one other (`openai/*`, `openrouter/anthropic/*`).
fn wildcard_rule(name: &str) -> Option<&'static str> {
    if !name.contains('*') {
        return None;
    }
    let ok = wildcard_prefix(name).is_some_and(|prefix| {
        !prefix.contains('*') && prefix.split('/').rev().skip(1).all(|segment| !segment.is_empty())
    });
    (!ok).then_some(
        "`*` may only be a wildcard's whole last path segment, after at least one other \
         (e.g. openai/*)",
    )
}

/// US dollars per million tokens.
#[derive(Clone, Copy, Debug, PartialEq, Serialize, Deserialize)]
#[serde(deny_unknown_fields)]
pub struct Price {
    pub input_per_mtok: f64,
    pub output_per_mtok: f64,
}

#[derive(Clone, Copy, Debug, PartialEq, Serialize, Deserialize)]
#[serde(deny_unknown_fields, default)]
pub struct BreakerPolicy {
    /// The last N calls counted.
    pub window_size: u32,
    /// No opening on fewer calls than this.
    pub min_requests: u32,
    pub failure_rate_threshold: f64,
    pub consecutive_timeouts: u32,
    /// First open; doubles on each re-open up to `max_cooldown_ms`.
    pub cooldown_ms: u64,
    pub max_cooldown_ms: u64,
    /// Requests admitted while half-open; all must succeed for the breaker to close.
    pub half_open_probes: u32,
    /// One breaker view for the fleet: a deployment one node's breaker opens is open on
    /// every node, and one node probes it for all. `false`: each node goes by its own
    /// breakers only. Left out of the stored catalog while on, so that a catalog from
    /// before the field reads (and diffs) the same.
    #[serde(skip_serializing_if = "is_true")]
    pub fleet: bool,
}

impl Default for BreakerPolicy {
    fn default() -> Self {
        Self {
            window_size: 20,
            min_requests: 10,
            failure_rate_threshold: 0.5,
            consecutive_timeouts: 5,
            cooldown_ms: 30_000,
            max_cooldown_ms: 300_000,
            half_open_probes: 1,
            fleet: true,
        }
    }
}

/// Per-model changes to the global [`BreakerPolicy`]; unset fields inherit it.
#[derive(Clone, Copy, Debug, Default, PartialEq, Serialize, Deserialize)]
#[serde(deny_unknown_fields)]
pub struct BreakerOverride {
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub window_size: Option<u32>,
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub min_requests: Option<u32>,
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub failure_rate_threshold: Option<f64>,
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub consecutive_timeouts: Option<u32>,
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub cooldown_ms: Option<u64>,
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub max_cooldown_ms: Option<u64>,
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub half_open_probes: Option<u32>,
}

impl BreakerPolicy {
    pub fn with_override(self, o: &BreakerOverride) -> Self {
        Self {
            window_size: o.window_size.unwrap_or(self.window_size),
            min_requests: o.min_requests.unwrap_or(self.min_requests),
            failure_rate_threshold: o.failure_rate_threshold.unwrap_or(self.failure_rate_threshold),
            consecutive_timeouts: o.consecutive_timeouts.unwrap_or(self.consecutive_timeouts),
            cooldown_ms: o.cooldown_ms.unwrap_or(self.cooldown_ms),
            max_cooldown_ms: o.max_cooldown_ms.unwrap_or(self.max_cooldown_ms),
            half_open_probes: o.half_open_probes.unwrap_or(self.half_open_probes),
            // Fleet-wide by nature: no model overrides it.
            fleet: self.fleet,
        }
    }

    fn validate(&self, path: &str, errors: &mut Vec<FieldError>) {
        let mut check = |ok: bool, field: &str, what: &str| {
            if !ok {
                errors.push(FieldError::new(format!("{path}.{field}"), what.to_owned()));
            }
        };
        check((1..=1000).contains(&self.window_size), "window_size", "must be 1–1000");
        check(
            self.min_requests >= 1 && self.min_requests <= self.window_size,
            "min_requests",
            "must be at least 1 and at most window_size",
        );
        check(
            self.failure_rate_threshold > 0.0 && self.failure_rate_threshold <= 1.0,
            "failure_rate_threshold",
            "must be greater than 0 and at most 1",
        );
        check(self.consecutive_timeouts >= 1, "consecutive_timeouts", "must be at least 1");
        check((100..=3_600_000).contains(&self.cooldown_ms), "cooldown_ms", "must be 100–3600000");
        check(
            self.max_cooldown_ms >= self.cooldown_ms && self.max_cooldown_ms <= 86_400_000,
            "max_cooldown_ms",
            "must be at least cooldown_ms and at most 86400000",
        );
        check((1..=100).contains(&self.half_open_probes), "half_open_probes", "must be 1–100");
    }
}

pub const PROBE_INTERVAL_MS_RANGE: (u64, u64) = (1_000, 3_600_000);
pub const PROBE_TIMEOUT_MS_RANGE: (u64, u64) = (100, 60_000);

/// A node's probes of a model: one minimal call when the model saw no real call from the
/// node for `interval_ms`, and one every `open_interval_ms` while its breaker is open
/// (docs/catalog.md, "`probe`"); 0 turns either off. Without a `probe` anywhere, only the
/// open probes run, with these defaults.
#[derive(Clone, Copy, Debug, PartialEq, Eq, Serialize, Deserialize)]
#[serde(deny_unknown_fields, default)]
pub struct ProbePolicy {
    pub interval_ms: u64,
    /// A probe that has no answer by then counts as a timeout.
    pub timeout_ms: u64,
    /// While the breaker is open, a probe this often (jittered down by up to a fifth), in
    /// place of the cool-down; 0 turns open probing off (the cool-down then decides when a
    /// user request tests the model).
    pub open_interval_ms: u64,
}

pub const DEFAULT_OPEN_INTERVAL_MS: u64 = 5_000;

impl Default for ProbePolicy {
    fn default() -> Self {
        Self { interval_ms: 30_000, timeout_ms: 5_000, open_interval_ms: DEFAULT_OPEN_INTERVAL_MS }
    }
}

/// Per-model changes to the catalog's [`ProbePolicy`]; unset fields inherit it.
#[derive(Clone, Copy, Debug, Default, PartialEq, Eq, Serialize, Deserialize)]
#[serde(deny_unknown_fields)]
pub struct ProbeOverride {
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub interval_ms: Option<u64>,
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub timeout_ms: Option<u64>,
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub open_interval_ms: Option<u64>,
}

impl ProbePolicy {
    pub fn with_override(self, o: &ProbeOverride) -> Self {
        Self {
            interval_ms: o.interval_ms.unwrap_or(self.interval_ms),
            timeout_ms: o.timeout_ms.unwrap_or(self.timeout_ms),
            open_interval_ms: o.open_interval_ms.unwrap_or(self.open_interval_ms),
        }
    }

    fn validate(&self, path: &str, errors: &mut Vec<FieldError>) {
        let (lo, hi) = PROBE_INTERVAL_MS_RANGE;
        if self.interval_ms != 0 && !(lo..=hi).contains(&self.interval_ms) {
            errors.push(FieldError::new(
                format!("{path}.interval_ms"),
                format!("must be 0 (off) or {lo}–{hi}, got {}", self.interval_ms),
            ));
        }
        // Below the interval: a node never has two idle probes of one model in flight.
        let (lo, hi) = PROBE_TIMEOUT_MS_RANGE;
        if !(lo..=hi).contains(&self.timeout_ms)
            || (self.interval_ms != 0 && self.timeout_ms >= self.interval_ms)
        {
            errors.push(FieldError::new(
                format!("{path}.timeout_ms"),
                format!("must be {lo}–{hi} and below interval_ms, got {}", self.timeout_ms),
            ));
        }
        let (lo, hi) = PROBE_INTERVAL_MS_RANGE;
        if self.open_interval_ms != 0 && !(lo..=hi).contains(&self.open_interval_ms) {
            errors.push(FieldError::new(
                format!("{path}.open_interval_ms"),
                format!("must be 0 (off) or {lo}–{hi}, got {}", self.open_interval_ms),
            ));
        }
    }
}

impl Catalog {
    /// The probes of `model`: its own `probe` over the catalog's (or over the defaults when
    /// the catalog has none); `None` when neither is set.
    pub fn probe_for(&self, model: &Model) -> Option<ProbePolicy> {
        match (&self.probe, &model.probe) {
            (None, None) => None,
            (global, Some(o)) => Some(global.unwrap_or_default().with_override(o)),
            (Some(global), None) => Some(*global),
        }
    }

    /// Open probing of `model` (docs/catalog.md, "`probe`"): every how long, and each probe's
    /// timeout; on by default, `None` when `open_interval_ms` is 0.
    pub fn open_probe_for(&self, model: &Model) -> Option<(u64, u64)> {
        let policy = self.probe_for(model).unwrap_or_default();
        (policy.open_interval_ms > 0).then_some((policy.open_interval_ms, policy.timeout_ms))
    }
}

/// The most retries one attempt may make (`retry_policy.max_retries`, `redundancy.max_retries`).
pub const MAX_RETRIES: u32 = 5;
pub const BACKOFF_MS_RANGE: (u64, u64) = (1, 60_000);
pub const MAX_BACKOFF_MS_MAX: u64 = 300_000;
pub const MAX_RETRY_AFTER_MS_MAX: u64 = 300_000;
pub const BUDGET_MIN_PER_SEC_MAX: u32 = 10_000;

/// Retries inside one attempt: extra calls to the same model before the chain moves on.
#[derive(Clone, Debug, PartialEq, Serialize, Deserialize)]
#[serde(deny_unknown_fields, default)]
pub struct RetryPolicy {
    /// Extra upstream calls inside one attempt, 0–5.
    pub max_retries: u32,
    /// The failure classes that are retried.
    pub on: Vec<FailoverReason>,
    /// Full jitter: the wait before retry `n` (from 0) is uniform in
    /// `[0, min(max_backoff_ms, base_backoff_ms × 2^n)]`.
    pub base_backoff_ms: u64,
    pub max_backoff_ms: u64,
    /// A `Retry-After` is honoured up to this; a longer one fails over at once.
    pub max_retry_after_ms: u64,
    /// A node's retries over the last 10 s stay under this share of its upstream requests
    /// (retries not counted) ...
    pub budget_ratio: f64,
    /// ... plus this many retries per second.
    pub budget_min_per_sec: u32,
}

impl Default for RetryPolicy {
    fn default() -> Self {
        Self {
            max_retries: 1,
            on: vec![
                FailoverReason::ConnectionError,
                FailoverReason::RateLimit,
                FailoverReason::ServerError,
            ],
            base_backoff_ms: 100,
            max_backoff_ms: 2_000,
            max_retry_after_ms: 10_000,
            budget_ratio: 0.2,
            budget_min_per_sec: 10,
        }
    }
}

/// Per-model changes to the [`RetryPolicy`]; unset fields inherit it.
#[derive(Clone, Debug, Default, PartialEq, Serialize, Deserialize)]
#[serde(deny_unknown_fields)]
pub struct RetryOverride {
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub max_retries: Option<u32>,
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub on: Option<Vec<FailoverReason>>,
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub base_backoff_ms: Option<u64>,
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub max_backoff_ms: Option<u64>,
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub max_retry_after_ms: Option<u64>,
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub budget_ratio: Option<f64>,
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub budget_min_per_sec: Option<u32>,
}

impl RetryPolicy {
    pub fn with_override(&self, o: &RetryOverride) -> Self {
        Self {
            max_retries: o.max_retries.unwrap_or(self.max_retries),
            on: o.on.clone().unwrap_or_else(|| self.on.clone()),
            base_backoff_ms: o.base_backoff_ms.unwrap_or(self.base_backoff_ms),
            max_backoff_ms: o.max_backoff_ms.unwrap_or(self.max_backoff_ms),
            max_retry_after_ms: o.max_retry_after_ms.unwrap_or(self.max_retry_after_ms),
            budget_ratio: o.budget_ratio.unwrap_or(self.budget_ratio),
            budget_min_per_sec: o.budget_min_per_sec.unwrap_or(self.budget_min_per_sec),
        }
    }

    fn validate(&self, path: &str, errors: &mut Vec<FieldError>) {
        let mut check = |ok: bool, field: &str, what: String| {
            if !ok {
                errors.push(FieldError::new(format!("{path}.{field}"), what));
            }
        };
        check(
            self.max_retries <= MAX_RETRIES,
            "max_retries",
            format!("must be 0–{MAX_RETRIES}, got {}", self.max_retries),
        );
        let (lo, hi) = BACKOFF_MS_RANGE;
        check(
            (lo..=hi).contains(&self.base_backoff_ms),
            "base_backoff_ms",
            format!("must be {lo}–{hi}, got {}", self.base_backoff_ms),
        );
        check(
            self.max_backoff_ms >= self.base_backoff_ms
                && self.max_backoff_ms <= MAX_BACKOFF_MS_MAX,
            "max_backoff_ms",
            format!(
                "must be at least base_backoff_ms and at most {MAX_BACKOFF_MS_MAX}, got {}",
                self.max_backoff_ms
            ),
        );
        check(
            self.max_retry_after_ms <= MAX_RETRY_AFTER_MS_MAX,
            "max_retry_after_ms",
            format!("must be 0–{MAX_RETRY_AFTER_MS_MAX}, got {}", self.max_retry_after_ms),
        );
        check(
            self.budget_ratio.is_finite() && (0.0..=1.0).contains(&self.budget_ratio),
            "budget_ratio",
            format!("must be a number from 0 to 1, got {}", self.budget_ratio),
        );
        check(
            self.budget_min_per_sec <= BUDGET_MIN_PER_SEC_MAX,
            "budget_min_per_sec",
            format!("must be 0–{BUDGET_MIN_PER_SEC_MAX}, got {}", self.budget_min_per_sec),
        );
        for (i, reason) in self.on.iter().enumerate() {
            if self.on[..i].contains(reason) {
                errors.push(FieldError::new(
                    format!("{path}.on[{i}]"),
                    format!("{} is listed twice", reason.as_str()),
                ));
            } else if *reason == FailoverReason::InvalidOutput {
                // Retries are for a provider's passing faults; an answer that breaks the
                // request's schema moves to the next model instead (docs/catalog.md,
                // "Retries").
                errors.push(FieldError::new(
                    format!("{path}.on[{i}]"),
                    "invalid_output is never retried: it fails over to the next model",
                ));
            } else if *reason == FailoverReason::ContextLength {
                // The same prompt is as long the second time.
                errors.push(FieldError::new(
                    format!("{path}.on[{i}]"),
                    "context_length is never retried: it fails over to a model with a larger context_window",
                ));
            }
        }
    }
}

#[derive(Clone, Debug, PartialEq, Serialize, Deserialize)]
#[serde(deny_unknown_fields)]
pub struct Webhook {
    pub name: String,
    pub url: String,
    pub events: Vec<String>,
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub secret: Option<CredentialRef>,
    /// Allows private and loopback targets, which are refused otherwise (SSRF guard).
    #[serde(default, skip_serializing_if = "std::ops::Not::not")]
    pub internal: bool,
    /// Only failover events of these API key ids (empty: every key). Breaker and node
    /// events belong to no key and pass the filter.
    #[serde(default, skip_serializing_if = "Vec::is_empty")]
    pub keys: Vec<String>,
    /// A disabled subscription receives nothing and holds no events back; re-enabled, it
    /// starts with the events recorded from then on.
    #[serde(default = "enabled_default", skip_serializing_if = "is_true")]
    pub enabled: bool,
    /// Deliver up to this many events per request, as a JSON array (default: one event
    /// per request, a JSON object).
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub batch_max_events: Option<u32>,
}

/// Largest `batch_max_events`: a batch stays well under a megabyte.
pub const WEBHOOK_BATCH_MAX: u32 = 500;

fn enabled_default() -> bool {
    true
}

fn is_true(v: &bool) -> bool {
    *v
}

impl Webhook {
    /// Whether an event of `event_type`, for API key `key_id` (empty: no key), goes here.
    pub fn wants(&self, event_type: &str, key_id: &str) -> bool {
        self.enabled
            && self.events.iter().any(|e| e == "*" || e == event_type)
            && (key_id.is_empty() || self.keys.is_empty() || self.keys.iter().any(|k| k == key_id))
    }
}

impl Catalog {
    pub fn provider(&self, name: &str) -> Option<&Provider> {
        self.providers.iter().find(|p| p.name == name)
    }

    /// The entry named exactly `name` (a wildcard only by its own name, `openai/*`).
    pub fn model(&self, name: &str) -> Option<&Model> {
        self.models.iter().find(|m| m.name == name)
    }

    /// The wildcard that admits `name`: of those whose prefix `name` extends, the longest.
    pub fn wildcard_for(&self, name: &str) -> Option<&Model> {
        self.models
            .iter()
            .filter_map(|m| wildcard_prefix(&m.name).map(|prefix| (prefix, m)))
            .filter(|(prefix, _)| rest_under(prefix, name).is_some())
            .max_by_key(|(prefix, _)| prefix.len())
            .map(|(_, m)| m)
    }

    /// The model a client naming `name` gets: the entry of that name (explicit entries win
    /// over wildcards), else the concrete model under the longest matching wildcard.
    pub fn resolve(&self, name: &str) -> Option<Cow<'_, Model>> {
        if let Some(model) = self.model(name) {
            return Some(Cow::Borrowed(model));
        }
        self.wildcard_for(name).and_then(|w| w.under(name)).map(Cow::Owned)
    }

    /// [`Catalog::validate`], no URL whose credentials are still hidden (`***`) and no model
    /// of more than [`MAX_DEPLOYMENTS`] deployments: what the control plane checks after
    /// [`Catalog::restore_redacted`], before it stores a catalog.
    /// A file re-applied from `switchyard catalog` passes `validate` in the CLI, and the
    /// control plane, which holds the credentials, puts them back or refuses here.
    pub fn validate_for_store(&self) -> Result<(), ValidationErrors> {
        let mut errors = match self.validate() {
            Ok(()) => Vec::new(),
            Err(ValidationErrors(errors)) => errors,
        };
        for (i, p) in self.providers.iter().enumerate() {
            if address::is_redacted(&p.base_url) {
                errors.push(FieldError::new(
                    format!("providers[{i}].base_url"),
                    REDACTED_NOT_RESTORED,
                ));
            }
        }
        for (i, w) in self.webhooks.iter().enumerate() {
            if address::is_redacted(&w.url) {
                errors.push(FieldError::new(format!("webhooks[{i}].url"), REDACTED_NOT_RESTORED));
            }
        }
        // Here, not in `validate`: a node still takes a catalog stored before the limit
        // (and serves the first MAX_DEPLOYMENTS of such a model) rather than refusing it whole.
        for (i, m) in self.models.iter().enumerate() {
            if m.deployments.len() > MAX_DEPLOYMENTS {
                errors.push(FieldError::new(
                    format!("models[{i}].deployments"),
                    format!(
                        "{} deployments: a model lists at most {MAX_DEPLOYMENTS}",
                        m.deployments.len()
                    ),
                ));
            }
        }
        if errors.is_empty() { Ok(()) } else { Err(ValidationErrors(errors)) }
    }

    /// Every rule the catalog must meet beyond its shape, each broken one named by path. A
    /// URL with hidden credentials (`https://***@host/…`) is a valid shape here.
    pub fn validate(&self) -> Result<(), ValidationErrors> {
        let mut errors = Vec::new();
        let mut seen = BTreeMap::new();
        for (i, p) in self.providers.iter().enumerate() {
            let path = format!("providers[{i}]");
            name_rule(&p.name, &format!("{path}.name"), &mut seen, &mut errors);
            if let Err(e) = address::parse_http_url(&p.base_url) {
                errors.push(FieldError::new(format!("{path}.base_url"), e.to_string()));
            }
            if let Some(region) = &p.region
                && region.trim().is_empty()
            {
                errors.push(FieldError::new(format!("{path}.region"), "must not be empty"));
            }
            if p.max_concurrency == Some(0) {
                errors.push(FieldError::new(format!("{path}.max_concurrency"), MUST_BE_CAP));
            }
            if p.kind == ProviderKind::AzureOpenai && p.api_version.is_none() {
                errors.push(FieldError::new(
                    format!("{path}.api_version"),
                    "azure-openai providers need an api_version (e.g. 2024-10-21)",
                ));
            }
        }
        seen.clear();
        for (i, m) in self.models.iter().enumerate() {
            let path = format!("models[{i}]");
            name_rule(&m.name, &format!("{path}.name"), &mut seen, &mut errors);
            if m.deployments.is_empty() {
                if m.provider.is_empty() {
                    errors.push(FieldError::new(
                        format!("{path}.provider"),
                        "required: the provider serving the model (or a list of deployments)",
                    ));
                } else if self.provider(&m.provider).is_none() {
                    errors.push(FieldError::new(
                        format!("{path}.provider"),
                        format!("unknown provider {:?}: not in providers", m.provider),
                    ));
                }
                if m.balance != Balance::Weighted {
                    errors.push(FieldError::new(
                        format!("{path}.balance"),
                        "balances between deployments: this model has none",
                    ));
                }
            } else {
                self.validate_deployments(m, &path, &mut errors);
            }
            if m.max_concurrency == Some(0) {
                errors.push(FieldError::new(format!("{path}.max_concurrency"), MUST_BE_CAP));
            }
            if let Some(why) = wildcard_rule(&m.name) {
                errors.push(FieldError::new(format!("{path}.name"), why));
            }
            if m.is_wildcard() {
                // The upstream name is the rest of each requested name; a probe has no
                // model to call.
                if !m.upstream_model.is_empty() {
                    errors.push(FieldError::new(
                        format!("{path}.upstream_model"),
                        format!(
                            "wildcard {:?} sends the rest of each requested name upstream; \
                             leave upstream_model out",
                            m.name
                        ),
                    ));
                }
                if m.probe.is_some() {
                    errors.push(FieldError::new(
                        format!("{path}.probe"),
                        format!("wildcard {:?} names no upstream model to probe", m.name),
                    ));
                }
            } else if m.upstream_model.trim().is_empty() && m.deployments.is_empty() {
                errors.push(FieldError::new(
                    format!("{path}.upstream_model"),
                    "required: the provider's name for the model (only a wildcard leaves it out)",
                ));
            }
            match (m.model_type, m.dimensions) {
                (ModelType::Embedding, None) => errors.push(FieldError::new(
                    format!("{path}.dimensions"),
                    format!(
                        "model {:?} has type: embedding and needs dimensions (the length of its vectors)",
                        m.name
                    ),
                )),
                (ModelType::Chat, Some(_)) => errors.push(FieldError::new(
                    format!("{path}.dimensions"),
                    format!(
                        "model {:?} is a chat model (type: chat, the default): dimensions is only for type: embedding",
                        m.name
                    ),
                )),
                (ModelType::Embedding, Some(0)) => errors.push(FieldError::new(
                    format!("{path}.dimensions"),
                    format!("model {:?}: {MUST_BE_DIMENSIONS}", m.name),
                )),
                _ => {}
            }
            // Anthropic's API has no embeddings: such a model could never serve.
            if m.model_type == ModelType::Embedding
                && m.deployment_models().iter().any(|d| {
                    self.provider(&d.provider).is_some_and(|p| p.kind == ProviderKind::Anthropic)
                })
            {
                errors.push(FieldError::new(
                    format!("{path}.type"),
                    format!(
                        "model {:?} has type: embedding, but its provider {:?} is of kind anthropic, which has no embeddings API",
                        m.name, m.provider
                    ),
                ));
            }
            if let Some(price) = &m.price {
                for (field, v) in [
                    ("input_per_mtok", price.input_per_mtok),
                    ("output_per_mtok", price.output_per_mtok),
                ] {
                    if !(v.is_finite() && v >= 0.0) {
                        errors.push(FieldError::new(
                            format!("{path}.price.{field}"),
                            "must be a number ≥ 0",
                        ));
                    }
                }
            }
            if let Some(stall) = m.stall_timeout_ms {
                let (lo, hi) = STALL_TIMEOUT_MS_RANGE;
                if !(lo..=hi).contains(&stall) {
                    errors.push(FieldError::new(
                        format!("{path}.stall_timeout_ms"),
                        format!("must be {lo}–{hi}"),
                    ));
                }
            }
            if m.max_tokens == Some(0) {
                errors.push(FieldError::new(format!("{path}.max_tokens"), "must be at least 1"));
            }
            if m.context_window == Some(0) {
                errors.push(FieldError::new(format!("{path}.context_window"), MUST_BE_TOKENS));
            }
            if let Some(o) = &m.breaker {
                self.breaker_policy
                    .with_override(o)
                    .validate(&format!("{path}.breaker"), &mut errors);
            }
            if let Some(o) = &m.retry {
                self.retry_policy
                    .clone()
                    .unwrap_or_default()
                    .with_override(o)
                    .validate(&format!("{path}.retry"), &mut errors);
            }
            if let Some(o) = &m.probe {
                self.probe
                    .unwrap_or_default()
                    .with_override(o)
                    .validate(&format!("{path}.probe"), &mut errors);
            }
        }
        self.breaker_policy.validate("breaker_policy", &mut errors);
        if let Some(policy) = &self.retry_policy {
            policy.validate("retry_policy", &mut errors);
        }
        if let Some(probe) = &self.probe {
            probe.validate("probe", &mut errors);
        }
        seen.clear();
        for (i, w) in self.webhooks.iter().enumerate() {
            let path = format!("webhooks[{i}]");
            name_rule(&w.name, &format!("{path}.name"), &mut seen, &mut errors);
            if let Err(e) = address::check_webhook_url(&w.url, w.internal) {
                errors.push(FieldError::new(format!("{path}.url"), e.to_string()));
            }
            if let Some(n) = w.batch_max_events
                && !(1..=WEBHOOK_BATCH_MAX).contains(&n)
            {
                errors.push(FieldError::new(
                    format!("{path}.batch_max_events"),
                    format!("must be 1–{WEBHOOK_BATCH_MAX}"),
                ));
            }
            for (j, k) in w.keys.iter().enumerate() {
                if k.trim().is_empty() {
                    errors.push(FieldError::new(format!("{path}.keys[{j}]"), "must not be empty"));
                }
            }
            if w.events.is_empty() {
                errors.push(FieldError::new(
                    format!("{path}.events"),
                    "must name at least one event",
                ));
            }
            for (j, e) in w.events.iter().enumerate() {
                if !WEBHOOK_EVENTS.contains(&e.as_str()) {
                    errors.push(FieldError::new(
                        format!("{path}.events[{j}]"),
                        format!(
                            "unknown event {e:?}; expected one of {}",
                            WEBHOOK_EVENTS.join(", ")
                        ),
                    ));
                }
            }
        }
        if errors.is_empty() { Ok(()) } else { Err(ValidationErrors(errors)) }
    }

    /// `deployments` of model `m` at `path`: the rules of each, and of the list.
    fn validate_deployments(&self, m: &Model, path: &str, errors: &mut Vec<FieldError>) {
        if !m.provider.is_empty() || !m.upstream_model.is_empty() {
            let field = if m.provider.is_empty() { "upstream_model" } else { "provider" };
            errors.push(FieldError::new(
                format!("{path}.{field}"),
                format!(
                    "model {:?} has deployments: name its provider and upstream_model in each \
                     deployment, not on the model",
                    m.name
                ),
            ));
        }
        if m.is_wildcard() {
            errors.push(FieldError::new(
                format!("{path}.deployments"),
                format!("wildcard {:?} is served by its provider alone: no deployments", m.name),
            ));
        }
        if m.max_concurrency.is_some() || m.adaptive {
            errors.push(FieldError::new(
                format!("{path}.max_concurrency"),
                "a model with deployments caps each deployment: set max_concurrency there",
            ));
        }
        for (j, d) in m.deployments.iter().enumerate() {
            let path = format!("{path}.deployments[{j}]");
            if self.provider(&d.provider).is_none() {
                errors.push(FieldError::new(
                    format!("{path}.provider"),
                    format!("unknown provider {:?}: not in providers", d.provider),
                ));
            }
            if d.upstream_model.trim().is_empty() {
                errors.push(FieldError::new(
                    format!("{path}.upstream_model"),
                    "required: the provider's name for the model",
                ));
            }
            if d.weight == 0 {
                errors.push(FieldError::new(format!("{path}.weight"), MUST_BE_WEIGHT));
            }
            if d.max_concurrency == Some(0) {
                errors.push(FieldError::new(format!("{path}.max_concurrency"), MUST_BE_CAP));
            }
            if let Some(region) = &d.region
                && region.trim().is_empty()
            {
                errors.push(FieldError::new(format!("{path}.region"), "must not be empty"));
            }
            if let Some(first) = m.deployments[..j]
                .iter()
                .position(|e| e.provider == d.provider && e.upstream_model == d.upstream_model)
            {
                errors.push(FieldError::new(
                    path.clone(),
                    format!(
                        "the same deployment as deployments[{first}] ({}): each deployment is \
                         one provider's upstream model, listed once",
                        d.id()
                    ),
                ));
            }
        }
    }

    /// What applying `new` over `self` changes, one line per resource, in a stable order:
    /// `+ models/x` added, `- models/x` removed, `~ models/x: price, breaker` changed.
    pub fn diff(&self, new: &Catalog) -> Vec<String> {
        let mut changes = Vec::new();
        section_diff("providers", &self.providers, &new.providers, |p| &p.name, &mut changes);
        section_diff("models", &self.models, &new.models, |m| &m.name, &mut changes);
        if self.breaker_policy != new.breaker_policy {
            let fields = field_changes(&self.breaker_policy, &new.breaker_policy);
            changes.push(format!("~ breaker_policy: {}", fields.join(", ")));
        }
        match (&self.retry_policy, &new.retry_policy) {
            (None, Some(_)) => changes.push("+ retry_policy".to_owned()),
            (Some(_), None) => changes.push("- retry_policy".to_owned()),
            (Some(old), Some(new)) if old != new => {
                changes.push(format!("~ retry_policy: {}", field_changes(old, new).join(", ")))
            }
            _ => {}
        }
        match (&self.probe, &new.probe) {
            (None, Some(_)) => changes.push("+ probe".to_owned()),
            (Some(_), None) => changes.push("- probe".to_owned()),
            (Some(old), Some(new)) if old != new => {
                changes.push(format!("~ probe: {}", field_changes(old, new).join(", ")))
            }
            _ => {}
        }
        section_diff("webhooks", &self.webhooks, &new.webhooks, |w| &w.name, &mut changes);
        changes
    }

    /// The catalog as listings show it: credentials in webhook URLs replaced by `***`.
    pub fn redacted(&self) -> Catalog {
        let mut catalog = self.clone();
        for p in &mut catalog.providers {
            p.base_url = address::redact_userinfo(&p.base_url);
        }
        for w in &mut catalog.webhooks {
            w.url = address::redact_userinfo(&w.url);
        }
        catalog
    }

    /// Puts back the credentials [`Catalog::redacted`] hid, from the `stored` catalog: a
    /// webhook (provider) whose URL is the redacted form of the stored webhook's (provider's)
    /// of the same name gets the stored URL. So a catalog read, edited and applied again
    /// keeps its credentials without anyone seeing them; a redacted URL with nothing to
    /// restore from is refused by [`Catalog::validate`].
    pub fn restore_redacted(&mut self, stored: &Catalog) {
        for p in &mut self.providers {
            let old = stored.provider(&p.name).map(|o| o.base_url.as_str());
            restore(&mut p.base_url, old);
        }
        for w in &mut self.webhooks {
            let old = stored.webhooks.iter().find(|o| o.name == w.name).map(|o| o.url.as_str());
            restore(&mut w.url, old);
        }
    }
}

const REDACTED_NOT_RESTORED: &str = "its credentials were hidden (`***`) when the catalog was \
     read, and no stored entry of this name and URL holds them; write them out";

fn restore(url: &mut String, stored: Option<&str>) {
    if let Some(stored) = stored
        && address::is_redacted(url)
        && address::redact_userinfo(stored) == *url
    {
        *url = stored.to_owned();
    }
}

fn name_rule(
    name: &str,
    path: &str,
    seen: &mut BTreeMap<String, String>,
    errors: &mut Vec<FieldError>,
) {
    if name.trim().is_empty() {
        errors.push(FieldError::new(path, "must not be empty"));
    } else if let Some(first) = seen.get(name) {
        errors.push(FieldError::new(path, format!("duplicate name {name:?} (first at {first})")));
    } else {
        seen.insert(name.to_owned(), path.to_owned());
    }
}

fn section_diff<T: Serialize + PartialEq>(
    section: &str,
    old: &[T],
    new: &[T],
    name: impl Fn(&T) -> &String,
    changes: &mut Vec<String>,
) {
    let old_by_name: BTreeMap<_, _> = old.iter().map(|t| (name(t), t)).collect();
    let new_by_name: BTreeMap<_, _> = new.iter().map(|t| (name(t), t)).collect();
    for (n, item) in &new_by_name {
        match old_by_name.get(n) {
            None => changes.push(format!("+ {section}/{n}")),
            Some(before) if *before != *item => changes
                .push(format!("~ {section}/{n}: {}", field_changes(*before, *item).join(", "))),
            Some(_) => {}
        }
    }
    for n in old_by_name.keys() {
        if !new_by_name.contains_key(n) {
            changes.push(format!("- {section}/{n}"));
        }
    }
}

/// Names of the top-level fields whose values differ between two serialisations.
fn field_changes<T: Serialize>(old: &T, new: &T) -> Vec<String> {
    let (Ok(serde_json::Value::Object(a)), Ok(serde_json::Value::Object(b))) =
        (serde_json::to_value(old), serde_json::to_value(new))
    else {
        return vec!["value".to_owned()];
    };
    let mut fields: Vec<String> =
        a.keys().chain(b.keys()).filter(|k| a.get(*k) != b.get(*k)).cloned().collect();
    fields.sort();
    fields.dedup();
    fields
}

#[cfg(test)]
mod tests {
    use super::*;

    fn sample() -> Catalog {
        serde_json::from_value(serde_json::json!({
            "providers": [{"name": "openai", "kind": "openai", "base_url": "https://api.openai.com/v1",
                           "api_keys": ["env:OPENAI_API_KEY"], "region": "us"}],
            "models": [{"name": "openai/gpt-5-nano", "provider": "openai", "upstream_model": "gpt-5-nano",
                        "price": {"input_per_mtok": 0.05, "output_per_mtok": 0.4}}],
            "webhooks": [{"name": "oncall", "url": "https://hooks.example.com/x", "events": ["api:model_failover"]}]
        }))
        .unwrap()
    }

    #[test]
    fn a_valid_catalog_passes() {
        sample().validate().unwrap();
    }

    #[test]
    fn unknown_fields_are_refused_by_name() {
        let err = serde_json::from_value::<Catalog>(serde_json::json!({"modles": []})).unwrap_err();
        assert!(err.to_string().contains("modles"), "{err}");
    }

    #[test]
    fn a_model_naming_an_unknown_provider_is_refused_with_its_path() {
        let mut c = sample();
        c.models[0].provider = "nope".into();
        let err = c.validate().unwrap_err();
        assert_eq!(err.0[0].path, "models[0].provider");
    }

    fn with_deployments(model: serde_json::Value) -> Result<Catalog, String> {
        let c: Catalog = serde_json::from_value(serde_json::json!({
            "providers": [
                {"name": "east", "kind": "openai", "base_url": "https://east.example/v1", "region": "eu"},
                {"name": "west", "kind": "openai", "base_url": "https://west.example/v1",
                 "max_concurrency": 10, "adaptive": true}
            ],
            "models": [model]
        }))
        .map_err(|e| e.to_string())?;
        c.validate().map(|()| c).map_err(|e| e.to_string())
    }

    #[test]
    fn a_model_of_more_than_64_deployments_is_refused_for_the_store_but_still_read_by_nodes() {
        let c = with_deployments(
            serde_json::json!({"name": "gpt", "deployments": (0..=MAX_DEPLOYMENTS)
            .map(|i| serde_json::json!({"provider": "east", "upstream_model": format!("gpt-{i}")}))
            .collect::<Vec<_>>()}),
        )
        .unwrap();
        let err = c.validate_for_store().unwrap_err().to_string();
        assert!(
            err.contains("models[0].deployments: 65 deployments: a model lists at most 64"),
            "{err}"
        );
    }

    #[test]
    fn a_model_with_deployments_is_one_model_per_deployment_underneath() {
        let c = with_deployments(serde_json::json!({
            "name": "gpt", "balance": "least_latency",
            "deployments": [
                {"provider": "east", "upstream_model": "gpt-4o", "weight": 3, "region": "eu-west"},
                {"provider": "west", "upstream_model": "gpt-4o", "max_concurrency": 4, "adaptive": true}
            ]
        }))
        .unwrap();
        let m = &c.models[0];
        assert_eq!(m.balance, Balance::LeastLatency);
        assert_eq!(m.deployments[1].weight, 1, "weight defaults to 1");
        assert_eq!(m.deployments[0].id(), "east/gpt-4o");
        let each = m.deployment_models();
        assert_eq!((each[1].provider.as_str(), each[1].max_concurrency), ("west", Some(4)));
        assert!(each.iter().all(|d| d.name == "gpt" && d.deployments.is_empty()));
        // Written back as it was read.
        let again: Catalog = serde_json::from_value(serde_json::to_value(&c).unwrap()).unwrap();
        assert_eq!(again, c);
    }

    #[test]
    fn bad_deployments_are_refused_naming_the_path() {
        let two = |a: serde_json::Value, b: serde_json::Value| serde_json::json!({"name": "gpt", "deployments": [a, b]});
        let dep = |p: &str, w: serde_json::Value| serde_json::json!({"provider": p, "upstream_model": "gpt-4o", "weight": w});
        let cases = [
            (two(dep("east", 0.into()), dep("west", 1.into())), "models[0].deployments[0].weight"),
            (
                two(dep("east", (-2).into()), dep("west", 1.into())),
                "must be a positive integer (a share",
            ),
            (
                two(dep("east", 1.5.into()), dep("west", 1.into())),
                "must be a positive integer (a share",
            ),
            (
                two(dep("east", 1.into()), dep("nope", 1.into())),
                "models[0].deployments[1].provider: unknown provider",
            ),
            (
                two(dep("east", 1.into()), dep("east", 2.into())),
                "models[0].deployments[1]: the same deployment as deployments[0]",
            ),
            (
                serde_json::json!({"name": "gpt", "balance": "random", "deployments": [dep("east", 1.into())]}),
                "unknown variant `random`",
            ),
            (
                serde_json::json!({"name": "gpt", "provider": "east", "deployments": [dep("east", 1.into())]}),
                "models[0].provider: model \"gpt\" has deployments",
            ),
            (
                serde_json::json!({"name": "gpt", "deployments": [{"provider": "east", "upstream_model": "x", "max_concurrency": 0}]}),
                "models[0].deployments[0].max_concurrency: must be at least 1",
            ),
            (
                serde_json::json!({"name": "gpt", "deployments": []}),
                "must list at least one deployment",
            ),
        ];
        for (model, expected) in cases {
            let err = with_deployments(model.clone()).unwrap_err();
            assert!(err.contains(expected), "{model}: {err}");
        }
        let mut c = sample();
        c.providers[0].max_concurrency = Some(0);
        assert_eq!(c.validate().unwrap_err().0[0].path, "providers[0].max_concurrency");
    }

    #[test]
    fn duplicate_names_are_refused() {
        let mut c = sample();
        c.models.push(c.models[0].clone());
        let err = c.validate().unwrap_err();
        assert_eq!(err.0[0].path, "models[1].name");
    }

    #[test]
    fn private_webhook_targets_need_internal() {
        let mut c = sample();
        c.webhooks[0].url = "http://127.0.0.1:9000/hook".into();
        assert_eq!(c.validate().unwrap_err().0[0].path, "webhooks[0].url");
        c.webhooks[0].internal = true;
        c.validate().unwrap();
    }

    #[test]
    fn apply_refuses_every_form_of_a_private_webhook_target_unless_internal() {
        for url in crate::address::tests::PRIVATE_TARGETS {
            let mut c = sample();
            c.webhooks[0].url = (*url).to_owned();
            let errors = c.validate().expect_err(url).0;
            assert_eq!(errors.len(), 1, "{url}: {errors:?}");
            assert_eq!(errors[0].path, "webhooks[0].url", "{url}");
            assert!(errors[0].message.contains("internal: true"), "{url}: {}", errors[0].message);
            c.webhooks[0].internal = true;
            assert_eq!(c.validate(), Ok(()), "{url} is allowed when internal");
        }
    }

    #[test]
    fn apply_accepts_public_webhook_targets_in_any_scheme_case() {
        for url in crate::address::tests::PUBLIC_TARGETS {
            let mut c = sample();
            c.webhooks[0].url = (*url).to_owned();
            assert_eq!(c.validate(), Ok(()), "{url}");
        }
        let mut c = sample();
        c.providers[0].base_url = "HTTPS://api.openai.com/v1".into();
        assert_eq!(c.validate(), Ok(()));
        c.providers[0].base_url = "api.openai.com/v1".into();
        assert_eq!(c.validate().unwrap_err().0[0].path, "providers[0].base_url");
    }

    #[test]
    fn listings_hide_url_credentials_and_a_reapply_restores_them() {
        let mut stored = sample();
        stored.webhooks[0].url = "https://user:s3cret@hooks.example.com/x".into();
        let shown = stored.redacted();
        assert_eq!(shown.webhooks[0].url, "https://***@hooks.example.com/x");
        assert!(!serde_json::to_string(&shown).unwrap().contains("s3cret"));

        let mut edited = shown.clone();
        edited.webhooks[0].enabled = false;
        edited.restore_redacted(&stored);
        assert_eq!(edited.webhooks[0].url, stored.webhooks[0].url);
        assert_eq!(edited.validate_for_store(), Ok(()));

        // Redacted with nothing to restore from (another name, or another URL).
        let mut renamed = shown.clone();
        renamed.webhooks[0].name = "other".into();
        renamed.restore_redacted(&stored);
        assert_eq!(renamed.validate(), Ok(()), "a redacted URL is a valid shape for the CLI");
        assert_eq!(renamed.validate_for_store().unwrap_err().0[0].path, "webhooks[0].url");
        let mut moved = shown;
        moved.webhooks[0].url = "https://***@elsewhere.example.com/x".into();
        moved.restore_redacted(&stored);
        assert_eq!(moved.validate_for_store().unwrap_err().0[0].path, "webhooks[0].url");

        // Provider base URLs the same way.
        stored.providers[0].base_url = "https://proxy:pw@gw.example.com/v1".into();
        let shown = stored.redacted();
        assert_eq!(shown.providers[0].base_url, "https://***@gw.example.com/v1");
        let mut again = shown.clone();
        again.restore_redacted(&stored);
        assert_eq!(again, stored);
        let mut fresh = shown;
        fresh.restore_redacted(&Catalog::default());
        assert_eq!(fresh.validate_for_store().unwrap_err().0[0].path, "providers[0].base_url");
    }

    #[test]
    fn webhooks_filter_by_event_key_and_enabled() {
        let mut w = sample().webhooks.remove(0);
        assert!(w.wants("api:model_failover", "key_1"));
        assert!(!w.wants("breaker.opened", ""));
        w.keys = vec!["key_2".into()];
        assert!(!w.wants("api:model_failover", "key_1"));
        w.events = vec!["*".into()];
        assert!(w.wants("breaker.opened", ""));
        w.enabled = false;
        assert!(!w.wants("breaker.opened", ""));
    }

    #[test]
    fn the_fleet_breaker_view_is_on_unless_turned_off_and_stored_only_when_off() {
        let on = sample();
        assert!(on.breaker_policy.fleet);
        assert!(serde_json::to_value(&on).unwrap()["breaker_policy"].get("fleet").is_none());
        let off: Catalog = serde_json::from_value(serde_json::json!({
            "breaker_policy": {"fleet": false, "cooldown_ms": 1000}
        }))
        .unwrap();
        assert!(!off.breaker_policy.fleet);
        assert_eq!(serde_json::to_value(&off).unwrap()["breaker_policy"]["fleet"], false);
        // A model's override keeps the catalog's: the view is the fleet's, not a model's.
        let o = BreakerOverride { cooldown_ms: Some(500), ..Default::default() };
        assert!(!off.breaker_policy.with_override(&o).fleet);
        let mut new = sample();
        new.breaker_policy.fleet = false;
        assert_eq!(on.diff(&new), ["~ breaker_policy: fleet"]);
        let wrong = serde_json::from_value::<Catalog>(serde_json::json!({
            "breaker_policy": {"fleet": "yes"}
        }));
        assert!(wrong.unwrap_err().to_string().contains("invalid type"));
    }

    #[test]
    fn diff_lists_added_changed_and_removed_resources() {
        let old = sample();
        let mut new = sample();
        new.models[0].price = None;
        new.providers[0].region = Some("eu".into());
        new.webhooks.clear();
        new.breaker_policy.cooldown_ms = 1000;
        assert_eq!(
            old.diff(&new),
            [
                "~ providers/openai: region",
                "~ models/openai/gpt-5-nano: price",
                "~ breaker_policy: cooldown_ms",
                "- webhooks/oncall"
            ]
        );
        assert!(old.diff(&old).is_empty());
    }

    #[test]
    fn retry_policy_fields_left_out_take_the_defaults() {
        let c: Catalog =
            serde_json::from_value(serde_json::json!({"retry_policy": {"max_retries": 3}}))
                .unwrap();
        let policy = c.retry_policy.unwrap();
        assert_eq!(policy, RetryPolicy { max_retries: 3, ..RetryPolicy::default() });
        assert_eq!(
            policy.on,
            [
                FailoverReason::ConnectionError,
                FailoverReason::RateLimit,
                FailoverReason::ServerError
            ]
        );
        assert_eq!((policy.base_backoff_ms, policy.max_backoff_ms), (100, 2_000));
        assert_eq!(policy.max_retry_after_ms, 10_000);
        assert_eq!((policy.budget_ratio, policy.budget_min_per_sec), (0.2, 10));
        assert_eq!(sample().retry_policy, None, "no retry_policy: no retries");
    }

    #[test]
    fn retry_policy_out_of_range_is_refused_naming_each_path() {
        let mut c = sample();
        c.retry_policy = Some(RetryPolicy {
            max_retries: 9,
            base_backoff_ms: 0,
            budget_ratio: 1.5,
            on: vec![FailoverReason::Timeout, FailoverReason::Timeout],
            ..RetryPolicy::default()
        });
        let paths: Vec<_> = c.validate().unwrap_err().0.into_iter().map(|e| e.path).collect();
        assert_eq!(
            paths,
            [
                "retry_policy.max_retries",
                "retry_policy.base_backoff_ms",
                "retry_policy.budget_ratio",
                "retry_policy.on[1]"
            ]
        );
        let mut c = sample();
        c.retry_policy = Some(RetryPolicy {
            on: vec![FailoverReason::Timeout, FailoverReason::InvalidOutput],
            ..RetryPolicy::default()
        });
        let e = c.validate().unwrap_err();
        assert_eq!(e.0.iter().map(|e| e.path.as_str()).collect::<Vec<_>>(), ["retry_policy.on[1]"]);
        c.retry_policy = Some(RetryPolicy { max_retries: 5, ..RetryPolicy::default() });
        c.validate().unwrap();
    }

    #[test]
    fn a_models_retry_override_is_validated_over_the_policy_it_changes() {
        let mut c = sample();
        c.models[0].retry = Some(RetryOverride { max_backoff_ms: Some(50), ..Default::default() });
        // Below the default base_backoff_ms of 100, with no retry_policy in the catalog.
        assert_eq!(c.validate().unwrap_err().0[0].path, "models[0].retry.max_backoff_ms");
        c.retry_policy = Some(RetryPolicy { base_backoff_ms: 10, ..RetryPolicy::default() });
        c.validate().unwrap();
        c.models[0].retry = Some(RetryOverride { max_retries: Some(6), ..Default::default() });
        assert_eq!(c.validate().unwrap_err().0[0].path, "models[0].retry.max_retries");
        let unknown = serde_json::from_value::<RetryOverride>(serde_json::json!({"retries": 1}));
        assert!(unknown.unwrap_err().to_string().contains("retries"));
    }

    #[test]
    fn diff_names_retry_policy_changes() {
        let old = sample();
        let mut new = sample();
        new.retry_policy = Some(RetryPolicy::default());
        assert_eq!(old.diff(&new), ["+ retry_policy"]);
        let mut newer = new.clone();
        newer.retry_policy = Some(RetryPolicy { max_retries: 2, ..RetryPolicy::default() });
        assert_eq!(new.diff(&newer), ["~ retry_policy: max_retries"]);
        assert_eq!(new.diff(&old), ["- retry_policy"]);
    }

    #[test]
    fn probe_is_off_unless_set_and_a_models_probe_inherits_the_global_one() {
        let mut c = sample();
        assert_eq!(c.probe_for(&c.models[0]), None, "no probe anywhere: none");
        // A model's own probe over the defaults when the catalog has none.
        c.models[0].probe = Some(ProbeOverride {
            interval_ms: Some(60_000),
            timeout_ms: None,
            open_interval_ms: None,
        });
        assert_eq!(
            c.probe_for(&c.models[0]),
            Some(ProbePolicy { interval_ms: 60_000, timeout_ms: 5_000, ..ProbePolicy::default() })
        );
        // Over the catalog's, field by field.
        c.probe =
            Some(ProbePolicy { interval_ms: 10_000, timeout_ms: 2_000, ..ProbePolicy::default() });
        assert_eq!(
            c.probe_for(&c.models[0]),
            Some(ProbePolicy { interval_ms: 60_000, timeout_ms: 2_000, ..ProbePolicy::default() })
        );
        c.models[0].probe = None;
        assert_eq!(c.probe_for(&c.models[0]), c.probe);
        let parsed: Catalog =
            serde_json::from_value(serde_json::json!({"probe": {"timeout_ms": 1000}})).unwrap();
        assert_eq!(
            parsed.probe,
            Some(ProbePolicy { interval_ms: 30_000, timeout_ms: 1_000, ..ProbePolicy::default() })
        );
        let unknown = serde_json::from_value::<Catalog>(serde_json::json!({"probe": {"every": 1}}));
        assert!(unknown.unwrap_err().to_string().contains("every"));
    }

    #[test]
    fn probe_out_of_range_is_refused_naming_each_path() {
        let mut c = sample();
        c.models.push(Model { name: "second".into(), ..c.models[0].clone() });
        c.models.push(Model { name: "third".into(), ..c.models[0].clone() });
        c.probe = Some(ProbePolicy { interval_ms: 999, timeout_ms: 50, ..ProbePolicy::default() });
        c.models[2].probe = Some(ProbeOverride {
            interval_ms: Some(5_000),
            timeout_ms: Some(5_000),
            open_interval_ms: None,
        });
        let errors = c.validate().unwrap_err().0;
        let paths: Vec<_> = errors.iter().map(|e| e.path.as_str()).collect();
        assert_eq!(
            paths,
            ["models[2].probe.timeout_ms", "probe.interval_ms", "probe.timeout_ms"],
            "{errors:?}"
        );
        assert!(errors[1].message.contains("1000–3600000, got 999"), "{}", errors[1].message);
        assert!(errors[2].message.contains("below interval_ms"), "{}", errors[2].message);
        // A model's override is checked over the global it changes: 70 s is too long a
        // timeout whatever the interval.
        let mut c = sample();
        c.probe = Some(ProbePolicy {
            interval_ms: 3_600_000,
            timeout_ms: 5_000,
            ..ProbePolicy::default()
        });
        c.models[0].probe = Some(ProbeOverride {
            interval_ms: None,
            timeout_ms: Some(70_000),
            open_interval_ms: None,
        });
        assert_eq!(c.validate().unwrap_err().0[0].path, "models[0].probe.timeout_ms");
        c.models[0].probe = Some(ProbeOverride {
            interval_ms: Some(1_000),
            timeout_ms: Some(100),
            open_interval_ms: None,
        });
        c.validate().unwrap();
    }

    #[test]
    fn open_probing_is_on_by_default_and_its_interval_is_checked() {
        let mut c = sample();
        c.models.push(Model { name: "second".into(), ..c.models[0].clone() });
        assert_eq!(c.open_probe_for(&c.models[0]), Some((5_000, 5_000)), "on without a probe");
        c.probe = Some(ProbePolicy { open_interval_ms: 0, ..ProbePolicy::default() });
        assert_eq!(c.open_probe_for(&c.models[0]), None, "0 turns it off");
        c.models[1].probe =
            Some(ProbeOverride { open_interval_ms: Some(2_000), ..Default::default() });
        assert_eq!(c.open_probe_for(&c.models[1]), Some((2_000, 5_000)), "a model's own");
        c.validate().unwrap();
        c.probe = Some(ProbePolicy { open_interval_ms: 999, ..ProbePolicy::default() });
        c.models[1].probe =
            Some(ProbeOverride { open_interval_ms: Some(3_600_001), ..Default::default() });
        let paths: Vec<String> = c.validate().unwrap_err().0.into_iter().map(|e| e.path).collect();
        assert_eq!(paths, ["models[1].probe.open_interval_ms", "probe.open_interval_ms"]);
    }

    #[test]
    fn diff_names_probe_changes() {
        let old = sample();
        let mut new = sample();
        new.probe = Some(ProbePolicy::default());
        assert_eq!(old.diff(&new), ["+ probe"]);
        let mut newer = new.clone();
        newer.probe =
            Some(ProbePolicy { interval_ms: 1_000, timeout_ms: 500, ..ProbePolicy::default() });
        assert_eq!(new.diff(&newer), ["~ probe: interval_ms, timeout_ms"]);
        assert_eq!(new.diff(&old), ["- probe"]);
        let mut per_model = sample();
        per_model.models[0].probe = Some(ProbeOverride {
            interval_ms: Some(2_000),
            timeout_ms: None,
            open_interval_ms: None,
        });
        assert_eq!(old.diff(&per_model), ["~ models/openai/gpt-5-nano: probe"]);
    }

    fn with_models(models: serde_json::Value) -> Catalog {
        let mut c = sample();
        c.providers.push(serde_json::from_value(serde_json::json!({
            "name": "router", "kind": "openai-compatible", "base_url": "https://router.example.com/v1"
        })).unwrap());
        c.models = serde_json::from_value(models).unwrap();
        c
    }

    fn paths(c: &Catalog) -> Vec<String> {
        c.validate().err().map(|e| e.0.into_iter().map(|e| e.path).collect()).unwrap_or_default()
    }

    #[test]
    fn type_defaults_to_chat_and_is_written_only_when_embedding() {
        let c = sample();
        assert_eq!(c.models[0].model_type, ModelType::Chat);
        assert_eq!((c.models[0].dimensions, c.validate()), (None, Ok(())));
        let written = serde_json::to_value(&c.models[0]).unwrap();
        assert!(written.get("type").is_none() && written.get("dimensions").is_none(), "{written}");
        let c = with_models(serde_json::json!([{"name": "openai/te3", "provider": "openai",
            "upstream_model": "text-embedding-3-small", "type": "embedding", "dimensions": 1536}]));
        assert_eq!(c.validate(), Ok(()));
        let written = serde_json::to_value(&c.models[0]).unwrap();
        assert_eq!(
            (&written["type"], &written["dimensions"]),
            (&serde_json::json!("embedding"), &serde_json::json!(1536))
        );
        let bad = serde_json::from_value::<Model>(serde_json::json!({"name": "m", "provider": "p",
            "upstream_model": "u", "type": "image"}));
        assert!(bad.unwrap_err().to_string().contains("image"));
    }

    #[test]
    fn an_embedding_model_on_an_anthropic_provider_is_refused_naming_its_type() {
        let c: Catalog = serde_json::from_value(serde_json::json!({
            "providers": [{"name": "a", "kind": "anthropic", "base_url": "https://api.anthropic.com"}],
            "models": [{"name": "a/e", "provider": "a", "upstream_model": "e",
                        "type": "embedding", "dimensions": 8}]}))
        .unwrap();
        let errors = c.validate().unwrap_err().0;
        assert_eq!(errors.len(), 1, "{errors:?}");
        assert_eq!(errors[0].path, "models[0].type");
        assert!(errors[0].message.contains("\"a/e\""), "{}", errors[0].message);
    }

    #[test]
    fn an_embedding_model_needs_dimensions_and_a_chat_model_takes_none_each_named() {
        let c = with_models(serde_json::json!([
            {"name": "e", "provider": "openai", "upstream_model": "te3", "type": "embedding"},
            {"name": "c", "provider": "openai", "upstream_model": "gpt", "dimensions": 8},
            {"name": "z", "provider": "openai", "upstream_model": "te3", "type": "embedding", "dimensions": 0}
        ]));
        let errors = c.validate().unwrap_err().0;
        let got: Vec<(&str, &str)> =
            errors.iter().map(|e| (e.path.as_str(), e.message.as_str())).collect();
        assert_eq!(
            got.iter().map(|g| g.0).collect::<Vec<_>>(),
            ["models[0].dimensions", "models[1].dimensions", "models[2].dimensions"]
        );
        assert!(got[0].1.contains("\"e\"") && got[0].1.contains("type: embedding"), "{}", got[0].1);
        assert!(got[1].1.contains("\"c\"") && got[1].1.contains("chat model"), "{}", got[1].1);
        assert!(
            got[2].1.contains("\"z\"") && got[2].1.contains("positive integer"),
            "{}",
            got[2].1
        );
        for bad in [
            serde_json::json!(-3),
            serde_json::json!(1.5),
            serde_json::json!("1536"),
            serde_json::json!(5_000_000_000u64),
        ] {
            let err =
                serde_json::from_value::<Model>(serde_json::json!({"name": "m", "provider": "p",
                "upstream_model": "u", "type": "embedding", "dimensions": bad}))
                .unwrap_err();
            assert!(err.to_string().contains("must be a positive integer"), "{bad}: {err}");
        }
    }

    #[test]
    fn a_wildcard_takes_no_upstream_model_and_star_only_as_the_whole_last_segment() {
        let c = with_models(serde_json::json!([
            {"name": "openai/*", "provider": "openai"},
            {"name": "router/anthropic/*", "provider": "router"}
        ]));
        assert_eq!(c.validate(), Ok(()));
        assert!(c.models[0].is_wildcard() && !sample().models[0].is_wildcard());
        let written = serde_json::to_value(&c.models[0]).unwrap();
        assert!(written.get("upstream_model").is_none(), "written as it was: {written}");
        for name in ["*", "/*", "openai/gpt-*", "openai/*/x", "a//*", "a*/*", "openai/**"] {
            let c = with_models(serde_json::json!([{"name": name, "provider": "openai"}]));
            let errors = c.validate().unwrap_err().0;
            assert_eq!(errors[0].path, "models[0].name", "{name}: {errors:?}");
            assert!(errors[0].message.contains("whole last path segment"), "{name}");
        }
        let c = with_models(serde_json::json!([
            {"name": "openai/*", "provider": "openai", "upstream_model": "gpt-5"},
            {"name": "router/*", "provider": "router", "probe": {"interval_ms": 60000}},
            {"name": "plain", "provider": "openai"}
        ]));
        assert_eq!(
            paths(&c),
            ["models[0].upstream_model", "models[1].probe", "models[2].upstream_model"]
        );
    }

    #[test]
    fn explicit_entries_win_over_wildcards_and_the_longest_prefix_wins_between_them() {
        let c = with_models(serde_json::json!([
            {"name": "router/*", "provider": "router", "max_tokens": 100},
            {"name": "router/anthropic/*", "provider": "router", "max_tokens": 200},
            {"name": "router/anthropic/claude-x", "provider": "openai", "upstream_model": "pinned"}
        ]));
        c.validate().unwrap();
        let explicit = c.resolve("router/anthropic/claude-x").unwrap();
        assert_eq!(
            (explicit.upstream_model.as_str(), explicit.provider.as_str()),
            ("pinned", "openai")
        );
        let longest = c.resolve("router/anthropic/claude-y").unwrap();
        assert_eq!(longest.name, "router/anthropic/claude-y");
        assert_eq!((longest.upstream_model.as_str(), longest.max_tokens), ("claude-y", Some(200)));
        let short = c.resolve("router/meta/llama").unwrap();
        assert_eq!((short.upstream_model.as_str(), short.max_tokens), ("meta/llama", Some(100)));
        assert!(!short.is_wildcard() && matches!(short, Cow::Owned(_)));
        // The wildcard itself by its own name; a narrower wildcard under it stays one.
        assert!(c.resolve("router/*").unwrap().is_wildcard());
        let narrower = c.resolve("router/meta/*").unwrap();
        assert!(narrower.is_wildcard() && narrower.upstream_model.is_empty());
        for unknown in ["router/", "routers/x", "openai/gpt-5", "router"] {
            assert!(c.resolve(unknown).is_none(), "{unknown}");
        }
    }

    #[test]
    fn an_allow_list_wildcard_admits_every_name_under_it() {
        use crate::wildcard::model_allowed;
        let allowed = vec!["openai/*".to_owned(), "router/gpt".to_owned()];
        for name in ["openai/gpt-5", "openai/*", "openai/ft/*", "router/gpt"] {
            assert!(model_allowed(&allowed, name), "{name}");
        }
        for name in ["openai/", "openai", "router/gpt-5", "router/*", "anthropic/claude"] {
            assert!(!model_allowed(&allowed, name), "{name}");
        }
        assert!(model_allowed(&[], "anything"), "an empty list allows every model");
    }
}
