//! Prometheus metrics at `/metrics` (OpenMetrics text). Names carry their unit; labels are
//! low-cardinality: endpoint, status class, gateway model names, providers, reasons.

use prometheus_client::encoding::EncodeLabelSet;
use prometheus_client::metrics::counter::Counter;
use prometheus_client::metrics::family::Family;
use prometheus_client::metrics::gauge::Gauge;
use prometheus_client::metrics::histogram::Histogram;
use prometheus_client::registry::Registry;

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
}

#[derive(Clone, Debug, Hash, PartialEq, Eq, EncodeLabelSet)]
pub struct BreakerLabels {
    pub provider: String,
    pub upstream_model: String,
}

#[derive(Clone, Debug, Hash, PartialEq, Eq, EncodeLabelSet)]
pub struct TransitionLabels {
    pub provider: String,
    pub upstream_model: String,
    pub to: &'static str,
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

/// One model's attempt metrics, resolved once: the request path then increments counters
/// without building (and allocating) label sets.
pub struct ModelMetrics {
    served: Counter,
    skipped: Counter,
    /// By reason, in [`ModelMetrics::REASONS`] order.
    failed: Vec<Counter>,
    pub duration: Histogram,
    /// Failovers of requests that asked for this model, by the model that served ("" when
    /// none did).
    failovers_to: std::sync::RwLock<std::collections::HashMap<String, Counter>>,
    failovers: Family<FailoverLabels, Counter>,
    name: String,
}

impl ModelMetrics {
    /// Counts a failover of a request for this model, served by `served` ("" when none was).
    pub fn failover(&self, served: &str) {
        if let Some(c) = self.failovers_to.read().unwrap_or_else(|e| e.into_inner()).get(served) {
            c.inc();
            return;
        }
        let counter = self
            .failovers
            .get_or_create(&FailoverLabels {
                requested_model: self.name.clone(),
                served_model: served.to_owned(),
            })
            .clone();
        counter.inc();
        self.failovers_to
            .write()
            .unwrap_or_else(|e| e.into_inner())
            .insert(served.to_owned(), counter);
    }

    const REASONS: [&'static str; 6] = [
        "connection_error",
        "server_error",
        "rate_limit",
        "timeout",
        "client_error",
        "deadline_exceeded",
    ];

    /// The counter for one attempt outcome (`reason` as in the failover report).
    pub fn attempt(&self, status: &str, reason: &str) -> &Counter {
        match status {
            "served" => &self.served,
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
    models: std::sync::RwLock<std::collections::HashMap<String, std::sync::Arc<ModelMetrics>>>,
    pub requests: Family<RequestLabels, Counter>,
    pub request_duration: Family<EndpointLabels, Histogram>,
    pub attempts: Family<AttemptLabels, Counter>,
    pub attempt_duration: Family<ModelLabels, Histogram>,
    pub failovers: Family<FailoverLabels, Counter>,
    /// 0 closed, 1 half-open, 2 open.
    pub breaker_state: Family<BreakerLabels, Gauge>,
    pub breaker_transitions: Family<TransitionLabels, Counter>,
    /// Retries inside an attempt, by the failure that caused them.
    pub retries: Family<RetryLabels, Counter>,
    /// Retries the node's retry budget refused (the attempt failed over instead).
    pub retry_budget_refusals: Family<ProviderModelLabels, Counter>,
    /// Upstream calls an injected fault touched. A counter of its own rather than a label on
    /// `upstream_attempts`: that family's series are resolved once per model so that the
    /// request path builds no label set, and a drill's calls are counted here only while a
    /// drill runs, by the fault's name.
    pub injected_faults: Family<InjectedLabels, Counter>,
    pub events_dropped: Counter,
    pub config_version: Gauge,
}

fn latency_histogram() -> Histogram {
    // 0.5 ms … ~65 s: gateway overhead at the low end, slow completions at the high end.
    Histogram::new(prometheus_client::metrics::histogram::exponential_buckets(0.0005, 2.0, 18))
}

impl Metrics {
    pub fn new() -> Self {
        let mut registry = Registry::with_prefix("switchyard");
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
        let breaker_transitions = Family::<TransitionLabels, Counter>::default();
        registry.register(
            "breaker_transitions",
            "Circuit breaker state changes",
            breaker_transitions.clone(),
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
        let events_dropped = Counter::default();
        registry.register(
            "failover_events_dropped",
            "Failover events dropped because the node's buffer was full",
            events_dropped.clone(),
        );
        let config_version = Gauge::default();
        registry.register(
            "config_version",
            "Store revision of the applied config",
            config_version.clone(),
        );
        Self {
            registry,
            models: Default::default(),
            requests,
            request_duration,
            attempts,
            attempt_duration,
            failovers,
            breaker_state,
            breaker_transitions,
            retries,
            retry_budget_refusals,
            injected_faults,
            events_dropped,
            config_version,
        }
    }

    /// The metrics of the model named `model`, created on first use.
    pub fn model(&self, model: &str) -> std::sync::Arc<ModelMetrics> {
        if let Some(m) = self.models.read().unwrap_or_else(|e| e.into_inner()).get(model) {
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
            failed: ModelMetrics::REASONS.iter().map(|r| counter("failed", r)).collect(),
            duration: self
                .attempt_duration
                .get_or_create(&ModelLabels { model: model.to_owned() })
                .clone(),
            failovers_to: Default::default(),
            failovers: self.failovers.clone(),
            name: model.to_owned(),
        });
        let mut models = self.models.write().unwrap_or_else(|e| e.into_inner());
        std::sync::Arc::clone(models.entry(model.to_owned()).or_insert(built))
    }

    pub fn render(&self) -> String {
        let mut out = String::new();
        // Writing into a String cannot fail.
        let _ = prometheus_client::encoding::text::encode(&mut out, &self.registry);
        out
    }
}

impl Default for Metrics {
    fn default() -> Self {
        Self::new()
    }
}
