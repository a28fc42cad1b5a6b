//! Prometheus metrics at `/metrics` (OpenMetrics or Prometheus text, as the scraper asks). Names carry their unit; labels are
//! low-cardinality: endpoint, status class, gateway model names, providers, reasons.

use prometheus_client::encoding::EncodeLabelSet;
use prometheus_client::metrics::counter::Counter;
use prometheus_client::metrics::family::Family;
use prometheus_client::metrics::gauge::Gauge;
use prometheus_client::metrics::histogram::Histogram;
use prometheus_client::registry::Registry;

use switchyard_catalog::ProviderKind;

#[derive(Clone, Debug, Hash, PartialEq, Eq, EncodeLabelSet)]
pub struct RequestLabels {
    pub endpoint: &'static str,
    pub status: u16,
}

#[derive(Clone, Debug, Hash, PartialEq, Eq, EncodeLabelSet)]
pub struct EndpointLabels {
    pub endpoint: &'static str,
}

#[derive(Clone, Debug, Hash, PartialEq, Eq, EncodeLabelSet)]
pub struct AttemptLabels {
    pub model: String,
    pub status: &'static str,
    pub reason: &'static str,
}

#[derive(Clone, Debug, Hash, PartialEq, Eq, EncodeLabelSet)]
pub struct ModelLabels {
    pub model: String,
}

#[derive(Clone, Debug, Hash, PartialEq, Eq, EncodeLabelSet)]
pub struct FailoverLabels {
    pub requested_model: String,
    pub served_model: String,
    /// The API the request came through: `chat` (Chat Completions) or `messages`.
    pub surface: &'static str,
}

#[derive(Clone, Debug, Hash, PartialEq, Eq, EncodeLabelSet)]
pub struct BreakerLabels {
    pub provider: String,
    pub upstream_model: String,
}

/// A deployment (`<provider>/<upstream_model>`) of a provider, or the provider as a whole
/// (`deployment=""`).
#[derive(Clone, Debug, Hash, PartialEq, Eq, EncodeLabelSet)]
pub struct UpstreamLabels {
    pub provider: String,
    pub deployment: String,
}

#[derive(Clone, Debug, Hash, PartialEq, Eq, EncodeLabelSet)]
pub struct DeploymentAttemptLabels {
    pub model: String,
    pub deployment: String,
    pub status: &'static str,
    pub reason: &'static str,
}

#[derive(Clone, Debug, Hash, PartialEq, Eq, EncodeLabelSet)]
pub struct TransitionLabels {
    pub provider: String,
    pub upstream_model: String,
    pub to: &'static str,
}

#[derive(Clone, Debug, Hash, PartialEq, Eq, EncodeLabelSet)]
pub struct ProbeLabels {
    pub provider: String,
    pub upstream_model: String,
    /// `success`, `failure`, `timeout` or `error`.
    pub outcome: &'static str,
}

#[derive(Clone, Debug, Hash, PartialEq, Eq, EncodeLabelSet)]
pub struct RetryLabels {
    pub provider: String,
    pub model: String,
    pub reason: &'static str,
}

#[derive(Clone, Debug, Hash, PartialEq, Eq, EncodeLabelSet)]
pub struct ProviderModelLabels {
    pub provider: String,
    pub model: String,
}

#[derive(Clone, Debug, Hash, PartialEq, Eq, EncodeLabelSet)]
pub struct InjectedLabels {
    /// The fault's name, as `switchyard chaos list` shows it.
    pub fault: String,
    pub model: String,
    /// The fault's kind as the CLI flag spells it (`status`, `delay-ms`, `hang`, …).
    pub kind: &'static str,
}

#[derive(Clone, Debug, Hash, PartialEq, Eq, EncodeLabelSet)]
pub struct LimitLabels {
    /// The API key's id (never its secret).
    pub key: String,
    /// `rpm`, `tpm`, `tokens_per_day` or `usd_per_day`.
    pub limit: &'static str,
}

#[derive(Clone, Debug, Hash, PartialEq, Eq, EncodeLabelSet)]
pub struct InvalidOutputLabels {
    pub model: String,
    /// `not_json`, `truncated` (cut at the token limit, its JSON broken) or `schema`.
    pub kind: &'static str,
}

#[derive(Clone, Debug, Hash, PartialEq, Eq, EncodeLabelSet)]
pub struct ContinuationLabels {
    /// The model asked to continue the answer.
    pub model: String,
    /// `served` (it finished the answer), `broken` (it broke too), `refused` (it would not
    /// take the prefill), `failed` (its call failed), `skipped` (its breaker was open).
    pub outcome: &'static str,
}

#[derive(Clone, Debug, Hash, PartialEq, Eq, EncodeLabelSet)]
pub struct DegradedLabels {
    /// The chain's first model.
    pub model: String,
    /// `all_models_failed` or `all_breakers_open`.
    pub reason: &'static str,
}

/// The OpenTelemetry GenAI semantic conventions' attributes, as Prometheus labels (dots
/// become underscores, as OpenTelemetry's Prometheus exporter writes them).
#[derive(Clone, Debug, Hash, PartialEq, Eq, EncodeLabelSet)]
pub struct GenAiLabels {
    pub gen_ai_operation_name: &'static str,
    pub gen_ai_provider_name: &'static str,
    pub gen_ai_request_model: String,
    /// The model that served; empty when none did.
    pub gen_ai_response_model: String,
    /// Why the request failed (the error code the client got); empty when it was served.
    pub error_type: &'static str,
}

#[derive(Clone, Debug, Hash, PartialEq, Eq, EncodeLabelSet)]
pub struct GenAiTokenLabels {
    pub gen_ai_operation_name: &'static str,
    pub gen_ai_provider_name: &'static str,
    pub gen_ai_request_model: String,
    pub gen_ai_response_model: String,
    /// `input` or `output`.
    pub gen_ai_token_type: &'static str,
}

/// Bucket boundaries the GenAI semantic conventions advise for `gen_ai.server.request.duration`
/// (seconds), so that dashboards built for the conventions read these histograms as they are.
const REQUEST_DURATION_BUCKETS: [f64; 14] =
    [0.01, 0.02, 0.04, 0.08, 0.16, 0.32, 0.64, 1.28, 2.56, 5.12, 10.24, 20.48, 40.96, 81.92];
/// … for `gen_ai.server.time_to_first_token` (seconds).
const TTFT_BUCKETS: [f64; 16] =
    [0.001, 0.005, 0.01, 0.02, 0.04, 0.06, 0.08, 0.1, 0.25, 0.5, 0.75, 1.0, 2.5, 5.0, 7.5, 10.0];
/// … for `gen_ai.client.token.usage` (tokens).
const TOKEN_BUCKETS: [f64; 14] = [
    1.0, 4.0, 16.0, 64.0, 256.0, 1024.0, 4096.0, 16384.0, 65536.0, 262144.0, 1048576.0, 4194304.0,
    16777216.0, 67108864.0,
];

fn request_duration_histogram() -> Histogram {
    Histogram::new(REQUEST_DURATION_BUCKETS)
}

fn ttft_histogram() -> Histogram {
    Histogram::new(TTFT_BUCKETS)
}

fn token_histogram() -> Histogram {
    Histogram::new(TOKEN_BUCKETS)
}

/// `gen_ai.provider.name` for a provider kind: the conventions' well-known values; an
/// OpenAI-compatible provider speaks OpenAI's format, which is what the attribute tells apart.
pub fn gen_ai_provider_name(kind: ProviderKind) -> &'static str {
    match kind {
        ProviderKind::Openai | ProviderKind::OpenaiCompatible => "openai",
        ProviderKind::AzureOpenai => "azure.ai.openai",
        ProviderKind::Anthropic => "anthropic",
        ProviderKind::Gemini => "gcp.gemini",
    }
}

/// The GenAI series of one (requested model, served model) pair, resolved once: a served
/// request then observes histograms without building label sets.
pub struct GenAiSeries {
    pub duration: Histogram,
    pub time_to_first_token: Histogram,
    input_tokens: Histogram,
    output_tokens: Histogram,
}

impl GenAiSeries {
    pub fn tokens(&self, input: u64, output: u64) {
        self.input_tokens.observe(input as f64);
        self.output_tokens.observe(output as f64);
    }
}

type GenAiCache = parking_lot::RwLock<
    std::collections::HashMap<
        String,
        std::collections::HashMap<String, std::sync::Arc<GenAiSeries>>,
    >,
>;

/// One model's attempt metrics, resolved once: the request path then increments counters
/// without building (and allocating) label sets.
pub struct ModelMetrics {
    served: Counter,
    skipped: Counter,
    /// Passed over after a context-length refusal (reason `context_window`).
    skipped_window: Counter,
    /// By reason, in [`ModelMetrics::REASONS`] order.
    failed: Vec<Counter>,
    pub duration: Histogram,
    /// Failovers of requests that asked for this model, by the model that served ("" when
    /// none did).
    failovers_to: parking_lot::RwLock<std::collections::HashMap<(String, &'static str), Counter>>,
    failovers: Family<FailoverLabels, Counter>,
    name: String,
}

impl ModelMetrics {
    /// Counts a failover of a request for this model that came through `surface`, served by
    /// `served` ("" when none was).
    pub fn failover(&self, served: &str, surface: &'static str) {
        let key = (served.to_owned(), surface);
        if let Some(c) = self.failovers_to.read().get(&key) {
            c.inc();
            return;
        }
        let counter = self
            .failovers
            .get_or_create(&FailoverLabels {
                requested_model: self.name.clone(),
                served_model: served.to_owned(),
                surface,
            })
            .clone();
        counter.inc();
        self.failovers_to.write().insert(key, counter);
    }

    const REASONS: [&'static str; 8] = [
        "connection_error",
        "server_error",
        "rate_limit",
        "timeout",
        "client_error",
        "deadline_exceeded",
        "invalid_output",
        "context_length",
    ];

    /// The counter for one attempt outcome (`reason` as in the failover report).
    pub fn attempt(&self, status: &str, reason: &str) -> &Counter {
        match status {
            "served" => &self.served,
            "skipped" if reason == "context_window" => &self.skipped_window,
            "skipped" => &self.skipped,
            _ => Self::REASONS
                .iter()
                .position(|r| *r == reason)
                .and_then(|i| self.failed.get(i))
                .unwrap_or(&self.skipped),
        }
    }
}

pub struct Metrics {
    registry: Registry,
    models: parking_lot::RwLock<std::collections::HashMap<String, std::sync::Arc<ModelMetrics>>>,
    pub requests: Family<RequestLabels, Counter>,
    pub request_duration: Family<EndpointLabels, Histogram>,
    pub attempts: Family<AttemptLabels, Counter>,
    pub attempt_duration: Family<ModelLabels, Histogram>,
    pub failovers: Family<FailoverLabels, Counter>,
    /// 0 closed, 1 half-open, 2 open.
    pub breaker_state: Family<BreakerLabels, Gauge>,
    pub breaker_transitions: Family<TransitionLabels, Counter>,
    /// Requests in flight per deployment of a model with `deployments`, and per capped
    /// deployment or provider (docs/catalog.md, "Upstream concurrency").
    pub upstream_in_flight: Family<UpstreamLabels, Gauge>,
    /// The cap in force (`max_concurrency`, or below it while `adaptive` backs off).
    pub upstream_concurrency_limit: Family<UpstreamLabels, Gauge>,
    /// Attempts on models with `deployments`, per deployment tried.
    pub deployment_attempts: Family<DeploymentAttemptLabels, Counter>,
    /// The prober's calls (docs/catalog.md, "`probe`"), by outcome. Probes are not user
    /// attempts: they are counted here and in `probe_duration`, never in
    /// `upstream_attempts`.
    pub probes: Family<ProbeLabels, Counter>,
    pub probe_duration: Family<BreakerLabels, Histogram>,
    /// Retries inside an attempt, by the failure that caused them.
    pub retries: Family<RetryLabels, Counter>,
    /// Retries the node's retry budget refused (the attempt failed over instead).
    pub retry_budget_refusals: Family<ProviderModelLabels, Counter>,
    /// Upstream calls an injected fault touched. A counter of its own rather than a label on
    /// `upstream_attempts`: that family's series are resolved once per model so that the
    /// request path builds no label set, and a drill's calls are counted here only while a
    /// drill runs, by the fault's name.
    pub injected_faults: Family<InjectedLabels, Counter>,
    pub degraded_responses: Family<DegradedLabels, Counter>,
    pub limit_blocks: Family<LimitLabels, Counter>,
    /// Answers that broke their request's `response_format`, by model and how. Apart from
    /// `upstream_attempts` (which counts them too, reason `invalid_output`) for the `kind`,
    /// and created only when one happens: most nodes never see one.
    pub invalid_outputs: Family<InvalidOutputLabels, Counter>,
    /// Frames of upstream streams that did not parse and were skipped, by model. Created
    /// only when one happens.
    pub malformed_frames: Family<ModelLabels, Counter>,
    /// Continuations of streams that broke after content reached the client, by the model
    /// asked and how it went. Created only when one happens.
    pub stream_continuations: Family<ContinuationLabels, Counter>,
    /// When each model's last warning about such frames was logged: at most one a minute.
    malformed_warned: parking_lot::Mutex<std::collections::HashMap<String, std::time::Instant>>,
    pub events_dropped: Counter,
    /// Failover events held in memory for the control plane (queued or awaiting its ack).
    pub events_held: Gauge,
    /// Bytes of failover events in the spool on disk.
    pub event_spool_bytes: Gauge,
    pub config_version: Gauge,
    /// `gen_ai_server_request_duration_seconds`: request to last byte, by requested and
    /// served model (served) or error type (failed).
    pub gen_ai_duration: Family<GenAiLabels, Histogram>,
    /// `gen_ai_server_time_to_first_token_seconds`: request to the first content chunk of a
    /// stream.
    pub gen_ai_ttft: Family<GenAiLabels, Histogram>,
    /// `gen_ai_client_token_usage`: tokens the served model reported, by type.
    pub gen_ai_tokens: Family<GenAiTokenLabels, Histogram>,
    gen_ai: GenAiCache,
    /// 1 while the config stream to a control plane is open (set by the sync task).
    pub config_stream_connected: Gauge,
    /// The version of the last config this node refused (NACKed), until it applies a newer
    /// one; 0 when none.
    pub config_rejected_version: Gauge,
}

/// The least time between two warnings about one model's malformed frames.
const MALFORMED_WARNING_EVERY: std::time::Duration = std::time::Duration::from_secs(60);

fn latency_histogram() -> Histogram {
    // 0.5 ms … ~65 s: gateway overhead at the low end, slow completions at the high end.
    Histogram::new(prometheus_client::metrics::histogram::exponential_buckets(0.0005, 2.0, 18))
}

impl Metrics {
    pub fn new() -> Self {
        let mut root = Registry::default();
        let registry = root.sub_registry_with_prefix("switchyard");
        let requests = Family::<RequestLabels, Counter>::default();
        registry.register(
            "http_requests",
            "Chat-completion requests by endpoint and HTTP status",
            requests.clone(),
        );
        let request_duration = Family::<EndpointLabels, Histogram>::new_with_constructor(
            latency_histogram as fn() -> Histogram,
        );
        registry.register(
            "http_request_duration_seconds",
            "Time from request to response headers",
            request_duration.clone(),
        );
        let attempts = Family::<AttemptLabels, Counter>::default();
        registry.register(
            "upstream_attempts",
            "Upstream attempts by model, status and reason",
            attempts.clone(),
        );
        let attempt_duration = Family::<ModelLabels, Histogram>::new_with_constructor(
            latency_histogram as fn() -> Histogram,
        );
        registry.register(
            "upstream_attempt_duration_seconds",
            "Duration of each upstream attempt",
            attempt_duration.clone(),
        );
        let failovers = Family::<FailoverLabels, Counter>::default();
        registry.register(
            "failovers",
            "Requests that moved past their first model",
            failovers.clone(),
        );
        let breaker_state = Family::<BreakerLabels, Gauge>::default();
        registry.register(
            "breaker_state",
            "Circuit breaker state: 0 closed, 1 half-open, 2 open",
            breaker_state.clone(),
        );
        let upstream_in_flight = Family::<UpstreamLabels, Gauge>::default();
        registry.register(
            "upstream_in_flight",
            "Requests in flight to a deployment (or, deployment=\"\", a provider)",
            upstream_in_flight.clone(),
        );
        let upstream_concurrency_limit = Family::<UpstreamLabels, Gauge>::default();
        registry.register(
            "upstream_concurrency_limit",
            "The cap on requests in flight to a deployment or provider now in force",
            upstream_concurrency_limit.clone(),
        );
        let deployment_attempts = Family::<DeploymentAttemptLabels, Counter>::default();
        registry.register(
            "deployment_attempts",
            "Attempts on models with deployments, by deployment, status and reason",
            deployment_attempts.clone(),
        );
        let breaker_transitions = Family::<TransitionLabels, Counter>::default();
        registry.register(
            "breaker_transitions",
            "Circuit breaker state changes",
            breaker_transitions.clone(),
        );
        let probes = Family::<ProbeLabels, Counter>::default();
        registry.register(
            "probes",
            "Probes of idle or half-open models (catalog probe), by provider, upstream model and outcome",
            probes.clone(),
        );
        let probe_duration = Family::<BreakerLabels, Histogram>::new_with_constructor(
            latency_histogram as fn() -> Histogram,
        );
        registry.register(
            "probe_duration_seconds",
            "Duration of each probe",
            probe_duration.clone(),
        );
        let retries = Family::<RetryLabels, Counter>::default();
        registry.register(
            "upstream_retries",
            "Retries of an upstream call inside one attempt, by provider, model and the failure retried",
            retries.clone(),
        );
        let retry_budget_refusals = Family::<ProviderModelLabels, Counter>::default();
        registry.register(
            "retry_budget_refusals",
            "Retries refused because the node's retry budget was spent",
            retry_budget_refusals.clone(),
        );
        let injected_faults = Family::<InjectedLabels, Counter>::default();
        registry.register(
            "injected_faults",
            "Upstream calls touched by an injected fault (switchyard chaos), by fault, model and kind",
            injected_faults.clone(),
        );
        let degraded_responses = Family::<DegradedLabels, Counter>::default();
        registry.register(
            "degraded_responses",
            "Designed degraded answers sent because no model could serve, by requested model and reason",
            degraded_responses.clone(),
        );
        let limit_blocks = Family::<LimitLabels, Counter>::default();
        registry.register(
            "limit_blocks",
            "Requests refused with 429 because their key reached one of its own limits",
            limit_blocks.clone(),
        );
        let invalid_outputs = Family::<InvalidOutputLabels, Counter>::default();
        registry.register(
            "invalid_outputs",
            "Answers whose content was not JSON valid against the request's response_format (invalid_output), by model and kind",
            invalid_outputs.clone(),
        );
        let malformed_frames = Family::<ModelLabels, Counter>::default();
        registry.register(
            "upstream_malformed_frames",
            "Frames of upstream streams that did not parse (a data line that is not JSON) and were skipped, by model",
            malformed_frames.clone(),
        );
        let stream_continuations = Family::<ContinuationLabels, Counter>::default();
        registry.register(
            "stream_continuations",
            "Continuations of streams that broke after content reached the client, by the model asked and outcome (served, broken, refused, failed, skipped)",
            stream_continuations.clone(),
        );
        let events_dropped = Counter::default();
        registry.register(
            "failover_events_dropped",
            "Failover events lost (memory full without a spool, the spool busy, full, unwritable or unreadable), each also reported as events.lost",
            events_dropped.clone(),
        );
        let events_held = Gauge::default();
        registry.register(
            "failover_events_held",
            "Failover events held in memory for the control plane, queued or awaiting its ack",
            events_held.clone(),
        );
        let event_spool_bytes = Gauge::default();
        registry.register(
            "failover_event_spool_bytes",
            "Bytes of failover events kept on disk until a control plane takes them",
            event_spool_bytes.clone(),
        );
        let config_version = Gauge::default();
        registry.register(
            "config_version",
            "Store revision of the applied config",
            config_version.clone(),
        );
        let config_stream_connected = Gauge::default();
        registry.register(
            "config_stream_connected",
            "1 while the config stream to a control plane is open, 0 while the node is cut off from every control plane",
            config_stream_connected.clone(),
        );
        let config_rejected_version = Gauge::default();
        registry.register(
            "config_rejected_version",
            "Store revision of the last config this node refused (NACKed) until it applies a newer one; 0 when none",
            config_rejected_version.clone(),
        );
        switchyard_tls::expiry::register(registry);
        // The GenAI semantic conventions' names, without the `switchyard_` prefix, so that
        // dashboards and alerts written for them work unchanged.
        let gen_ai_duration = Family::<GenAiLabels, Histogram>::new_with_constructor(
            request_duration_histogram as fn() -> Histogram,
        );
        root.register(
            "gen_ai_server_request_duration_seconds",
            "GenAI request duration: from the request to the answer's last byte",
            gen_ai_duration.clone(),
        );
        let gen_ai_ttft = Family::<GenAiLabels, Histogram>::new_with_constructor(
            ttft_histogram as fn() -> Histogram,
        );
        root.register(
            "gen_ai_server_time_to_first_token_seconds",
            "Time from a streaming request to its first content chunk",
            gen_ai_ttft.clone(),
        );
        let gen_ai_tokens = Family::<GenAiTokenLabels, Histogram>::new_with_constructor(
            token_histogram as fn() -> Histogram,
        );
        root.register(
            "gen_ai_client_token_usage",
            "Input and output tokens the serving model reported, per request",
            gen_ai_tokens.clone(),
        );
        // What OpenTelemetry export dropped: the process's one family, with no samples
        // while OpenTelemetry is off (docs/operating.md, "Traces and log records").
        root.sub_registry_with_prefix("switchyard").register(
            switchyard_otel::DROPPED_NAME,
            switchyard_otel::DROPPED_HELP,
            switchyard_otel::dropped().clone(),
        );
        Self {
            registry: root,
            models: Default::default(),
            requests,
            request_duration,
            attempts,
            attempt_duration,
            failovers,
            breaker_state,
            breaker_transitions,
            upstream_in_flight,
            upstream_concurrency_limit,
            deployment_attempts,
            probes,
            probe_duration,
            retries,
            retry_budget_refusals,
            injected_faults,
            degraded_responses,
            limit_blocks,
            invalid_outputs,
            malformed_frames,
            stream_continuations,
            malformed_warned: Default::default(),
            events_dropped,
            events_held,
            event_spool_bytes,
            config_version,
            gen_ai_duration,
            gen_ai_ttft,
            gen_ai_tokens,
            gen_ai: Default::default(),
            config_stream_connected,
            config_rejected_version,
        }
    }

    /// Shows what keys used of their daily budgets (`switchyard_key_budget_used_ratio`), read
    /// from the node's ledger at each scrape.
    pub fn watch_budgets(&mut self, ledger: std::sync::Arc<crate::limits::Ledger>) {
        self.registry
            .sub_registry_with_prefix("switchyard")
            .register_collector(Box::new(crate::limits::BudgetCollector(ledger)));
    }

    /// The counter of requests of `key` refused on `limit`.
    pub fn limit_blocked(&self, key: &str, limit: &'static str) -> Counter {
        self.limit_blocks.get_or_create(&LimitLabels { key: key.to_owned(), limit }).clone()
    }

    /// The degraded answers counter for a chain starting at `model`. Not pre-resolved: a
    /// degraded answer is rare, and its cost is one map lookup.
    pub fn degraded(&self, model: &str, reason: &'static str) -> Counter {
        self.degraded_responses
            .get_or_create(&DegradedLabels { model: model.to_owned(), reason })
            .clone()
    }

    /// The invalid outputs counter of `model` for `kind`. Not pre-resolved: only requests
    /// that opted into `invalid_output` and got a wrong answer pay the lookup.
    pub fn invalid_output(&self, model: &str, kind: &'static str) -> Counter {
        self.invalid_outputs
            .get_or_create(&InvalidOutputLabels { model: model.to_owned(), kind })
            .clone()
    }

    /// Counts `n` frames of a `model` stream that did not parse; true when a warning about
    /// them is due at `now` (the first, then at most one a minute per model, so that a
    /// provider sending junk in every stream cannot flood the log).
    pub fn malformed_frames(&self, model: &str, n: u32, now: std::time::Instant) -> bool {
        self.malformed_frames
            .get_or_create(&ModelLabels { model: model.to_owned() })
            .inc_by(u64::from(n));
        let mut warned = self.malformed_warned.lock();
        match warned.get_mut(model) {
            Some(last) if now.saturating_duration_since(*last) < MALFORMED_WARNING_EVERY => false,
            Some(last) => {
                *last = now;
                true
            }
            None => {
                warned.insert(model.to_owned(), now);
                true
            }
        }
    }

    /// The GenAI series of requests for `requested` served by `served`; `provider` names
    /// the served model's provider and is called only the first time a pair is seen.
    pub fn gen_ai(
        &self,
        requested: &str,
        served: &str,
        provider: impl FnOnce() -> &'static str,
    ) -> std::sync::Arc<GenAiSeries> {
        if let Some(series) =
            self.gen_ai.read().get(requested).and_then(|by_served| by_served.get(served))
        {
            return std::sync::Arc::clone(series);
        }
        let gen_ai_provider_name = provider();
        let labels = GenAiLabels {
            gen_ai_operation_name: "chat",
            gen_ai_provider_name,
            gen_ai_request_model: requested.to_owned(),
            gen_ai_response_model: served.to_owned(),
            error_type: "",
        };
        let tokens = |gen_ai_token_type| {
            self.gen_ai_tokens
                .get_or_create(&GenAiTokenLabels {
                    gen_ai_operation_name: "chat",
                    gen_ai_provider_name,
                    gen_ai_request_model: requested.to_owned(),
                    gen_ai_response_model: served.to_owned(),
                    gen_ai_token_type,
                })
                .clone()
        };
        let built = std::sync::Arc::new(GenAiSeries {
            duration: self.gen_ai_duration.get_or_create(&labels).clone(),
            time_to_first_token: self.gen_ai_ttft.get_or_create(&labels).clone(),
            input_tokens: tokens("input"),
            output_tokens: tokens("output"),
        });
        let mut cache = self.gen_ai.write();
        let by_served = match cache.get_mut(requested) {
            Some(by_served) => by_served,
            None => cache.entry(requested.to_owned()).or_default(),
        };
        std::sync::Arc::clone(by_served.entry(served.to_owned()).or_insert(built))
    }

    /// A request for `requested` that no model served, answered with `error_type`.
    /// `provider` is the requested model's.
    pub fn gen_ai_failed(
        &self,
        requested: &str,
        provider: &'static str,
        error_type: &'static str,
        seconds: f64,
    ) {
        self.gen_ai_duration
            .get_or_create(&GenAiLabels {
                gen_ai_operation_name: "chat",
                gen_ai_provider_name: provider,
                gen_ai_request_model: requested.to_owned(),
                gen_ai_response_model: String::new(),
                error_type,
            })
            .observe(seconds);
    }

    /// The metrics of the model named `model`, created on first use.
    pub fn model(&self, model: &str) -> std::sync::Arc<ModelMetrics> {
        if let Some(m) = self.models.read().get(model) {
            return std::sync::Arc::clone(m);
        }
        let counter = |status: &'static str, reason: &'static str| {
            self.attempts
                .get_or_create(&AttemptLabels { model: model.to_owned(), status, reason })
                .clone()
        };
        let built = std::sync::Arc::new(ModelMetrics {
            served: counter("served", ""),
            skipped: counter("skipped", "circuit_open"),
            skipped_window: counter("skipped", "context_window"),
            failed: ModelMetrics::REASONS.iter().map(|r| counter("failed", r)).collect(),
            duration: self
                .attempt_duration
                .get_or_create(&ModelLabels { model: model.to_owned() })
                .clone(),
            failovers_to: Default::default(),
            failovers: self.failovers.clone(),
            name: model.to_owned(),
        });
        let mut models = self.models.write();
        std::sync::Arc::clone(models.entry(model.to_owned()).or_insert(built))
    }

    /// The content type and body of a `/metrics` answer to a scraper that sent `accept`.
    pub fn render(&self, accept: Option<&str>) -> (&'static str, String) {
        switchyard_exposition::render(&self.registry, accept)
    }
}

impl Default for Metrics {
    fn default() -> Self {
        Self::new()
    }
}

#[cfg(test)]
mod tests {
    use std::time::{Duration, Instant};

    use super::*;

    #[test]
    fn malformed_frames_are_all_counted_and_warned_of_at_most_once_a_minute_per_model() {
        let metrics = Metrics::new();
        let t0 = Instant::now();
        assert!(metrics.malformed_frames("a", 2, t0), "the first warns");
        assert!(!metrics.malformed_frames("a", 1, t0 + Duration::from_secs(59)));
        assert!(metrics.malformed_frames("b", 1, t0 + Duration::from_secs(1)), "per model");
        assert!(metrics.malformed_frames("a", 1, t0 + Duration::from_secs(60)));
        let count = |m: &str| {
            metrics.malformed_frames.get_or_create(&ModelLabels { model: m.into() }).get()
        };
        assert_eq!((count("a"), count("b")), (4, 1));
        let (_, text) = metrics.render(None);
        assert!(
            text.contains(r#"switchyard_upstream_malformed_frames_total{model="a"} 4"#),
            "{text}"
        );
    }
}
