//! The control plane's Prometheus metrics, at `/metrics` on its listening port (HTTP/1.1 or
//! HTTP/2 beside the gRPC services): what an operator watches to know that nodes are
//! connected, that the audit log keeps up and that webhooks are delivered.

use prometheus_client::encoding::EncodeLabelSet;
use prometheus_client::metrics::counter::Counter;
use prometheus_client::metrics::family::Family;
use prometheus_client::metrics::gauge::Gauge;
use prometheus_client::metrics::histogram::{Histogram, exponential_buckets};
use prometheus_client::registry::Registry;

pub struct ControlMetrics {
    registry: Registry,
    /// Node streams open on this replica.
    pub nodes_connected: Gauge,
    /// Failover events this replica stored in the audit log.
    pub events_stored: Counter,
    /// Failover events whose store write failed (the node keeps them and sends them again).
    pub event_write_failures: Counter,
    /// The store revision this replica's config cache has reached.
    pub config_revision: Gauge,
    /// Node streams resynced because the node fell behind (its queue was full).
    pub node_resyncs: Counter,
    /// Webhook delivery (`switchyard_webhook_*`), by the replica that leads it.
    pub webhooks: WebhookMetrics,
    /// The store revision of the newest config change: a node whose `config_version` is
    /// below it lacks that change (the stale-config alert compares the two).
    pub config_change_revision: Gauge,
}

impl ControlMetrics {
    pub fn new() -> Self {
        let mut root = Registry::default();
        let webhooks = WebhookMetrics::default();
        webhooks.register(root.sub_registry_with_prefix("switchyard_webhook"));
        // The same name as on a node (not under `switchyard_control`): one alert for both.
        switchyard_tls::expiry::register(root.sub_registry_with_prefix("switchyard"));
        let registry = root.sub_registry_with_prefix("switchyard_control");
        let nodes_connected = Gauge::default();
        registry.register(
            "nodes_connected",
            "Node streams open on this control-plane replica",
            nodes_connected.clone(),
        );
        let events_stored = Counter::default();
        registry.register(
            "failover_events_stored",
            "Failover events this replica stored in the audit log",
            events_stored.clone(),
        );
        let event_write_failures = Counter::default();
        registry.register(
            "failover_event_write_failures",
            "Failover events whose audit-log write failed; their node holds them and sends them again",
            event_write_failures.clone(),
        );
        let config_revision = Gauge::default();
        registry.register(
            "config_revision",
            "Store revision this replica's config cache has reached",
            config_revision.clone(),
        );
        let node_resyncs = Counter::default();
        registry.register(
            "node_resyncs",
            "Node streams resynced from the config cache because the node read too slowly to queue a change",
            node_resyncs.clone(),
        );
        let config_change_revision = Gauge::default();
        registry.register(
            "config_change_revision",
            "Store revision of the newest change to the config; a node whose switchyard_config_version is below it lacks that change",
            config_change_revision.clone(),
        );
        // What OpenTelemetry export dropped: the process's one family, with no samples
        // while OpenTelemetry is off (docs/operating.md, "Traces and log records").
        registry.register(
            switchyard_otel::DROPPED_NAME,
            switchyard_otel::DROPPED_HELP,
            switchyard_otel::dropped().clone(),
        );
        Self {
            registry: root,
            nodes_connected,
            events_stored,
            event_write_failures,
            config_revision,
            node_resyncs,
            webhooks,
            config_change_revision,
        }
    }

    /// Counts a node stream as open until the returned guard is dropped, however the
    /// stream ends.
    pub fn node_connected(&self) -> Connected {
        self.nodes_connected.inc();
        Connected(self.nodes_connected.clone())
    }

    /// The content type and body of a `/metrics` answer to a scraper that sent `accept`.
    pub fn render(&self, accept: Option<&str>) -> (&'static str, String) {
        switchyard_exposition::render(&self.registry, accept)
    }
}

// === webhook delivery ===

/// Webhook delivery, per subscription. Series are labelled with the subscription's name
/// (the catalog's `webhooks[].name`), never its URL, which may carry a token. Only the
/// elected replica delivers: another replica's series stand still, and a subscription's
/// queue gauge goes when this replica stops delivering for it.
#[derive(Clone)]
pub struct WebhookMetrics {
    attempts: Family<AttemptLabels, Counter>,
    duration: Family<WebhookLabels, Histogram, fn() -> Histogram>,
    queued: Family<WebhookLabels, Gauge>,
    dead_letters: Family<WebhookLabels, Counter>,
}

#[derive(Clone, Debug, Hash, PartialEq, Eq, EncodeLabelSet)]
struct WebhookLabels {
    webhook: String,
}

#[derive(Clone, Debug, Hash, PartialEq, Eq, EncodeLabelSet)]
struct AttemptLabels {
    webhook: String,
    /// `delivered`, `failed` or `refused` ([`DeliveryOutcome`]).
    outcome: &'static str,
}

/// How one delivery request ended (docs/webhooks.md, "Delivery").
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum DeliveryOutcome {
    /// 2xx.
    Delivered,
    /// Timeout, connection error, 408, 429, 5xx (or no request: its secret cannot be
    /// resolved): retried after a backoff.
    Failed,
    /// Any other answer: the events go to the dead letters.
    Refused,
}

impl DeliveryOutcome {
    const ALL: [Self; 3] = [Self::Delivered, Self::Failed, Self::Refused];

    fn label(self) -> &'static str {
        match self {
            Self::Delivered => "delivered",
            Self::Failed => "failed",
            Self::Refused => "refused",
        }
    }
}

/// 5 ms … ~41 s: a receiver on the same network at the low end, the request timeout
/// (10 s by default, `--webhook-timeout-ms`) at the high end.
fn delivery_histogram() -> Histogram {
    Histogram::new(exponential_buckets(0.005, 2.0, 14))
}

impl Default for WebhookMetrics {
    fn default() -> Self {
        Self {
            attempts: Family::default(),
            duration: Family::new_with_constructor(delivery_histogram as fn() -> Histogram),
            queued: Family::default(),
            dead_letters: Family::default(),
        }
    }
}

impl WebhookMetrics {
    fn register(&self, registry: &mut Registry) {
        registry.register(
            "delivery_attempts",
            "Webhook delivery requests by subscription and outcome (delivered, failed, refused)",
            self.attempts.clone(),
        );
        registry.register(
            "delivery_duration_seconds",
            "Time from sending a webhook delivery request to its answer (or its failure)",
            self.duration.clone(),
        );
        registry.register(
            "queue_depth",
            "Events a webhook subscription still owes on the delivering replica",
            self.queued.clone(),
        );
        registry.register(
            "dead_letters",
            "Webhook events given up on (refused, or older than --webhook-max-age)",
            self.dead_letters.clone(),
        );
    }

    /// The series of one subscription, for its delivery worker.
    pub fn subscription(&self, name: &str) -> SubscriptionMetrics {
        let label = WebhookLabels { webhook: name.to_owned() };
        // Every outcome's series from the start: a rate over a series that appears with its
        // first failure misses that failure.
        let attempts = DeliveryOutcome::ALL.map(|outcome| {
            let labels = AttemptLabels { webhook: name.to_owned(), outcome: outcome.label() };
            self.attempts.get_or_create(&labels).clone()
        });
        SubscriptionMetrics {
            attempts,
            duration: self.duration.get_or_create(&label).clone(),
            dead_letters: self.dead_letters.get_or_create(&label).clone(),
            queued: self.queued.clone(),
            label,
        }
    }
}

/// One subscription's delivery series, resolved once. Dropped (its worker stopped: the
/// subscription removed, or leadership lost), its queue gauge goes with it.
pub struct SubscriptionMetrics {
    /// In [`DeliveryOutcome::ALL`] order.
    attempts: [Counter; 3],
    pub duration: Histogram,
    dead_letters: Counter,
    queued: Family<WebhookLabels, Gauge>,
    label: WebhookLabels,
}

impl SubscriptionMetrics {
    pub fn attempt(&self, outcome: DeliveryOutcome) {
        let [delivered, failed, refused] = &self.attempts;
        match outcome {
            DeliveryOutcome::Delivered => delivered,
            DeliveryOutcome::Failed => failed,
            DeliveryOutcome::Refused => refused,
        }
        .inc();
    }

    pub fn dead_lettered(&self, events: usize) {
        self.dead_letters.inc_by(events as u64);
    }

    /// Looked up each time rather than held: a stopped worker of the same subscription
    /// may remove the series after this one set it, and the next update brings it back.
    pub fn queue_depth(&self, events: usize) {
        self.queued.get_or_create(&self.label).set(i64::try_from(events).unwrap_or(i64::MAX));
    }
}

impl Drop for SubscriptionMetrics {
    fn drop(&mut self) {
        self.queued.remove(&self.label);
    }
}

pub struct Connected(Gauge);

impl Drop for Connected {
    fn drop(&mut self) {
        self.0.dec();
    }
}

impl Default for ControlMetrics {
    fn default() -> Self {
        Self::new()
    }
}

#[cfg(test)]
mod tests {
    #![allow(clippy::unwrap_used)]
    use super::*;

    #[test]
    fn webhook_delivery_series_are_per_subscription_and_its_queue_goes_with_its_worker() {
        let metrics = ControlMetrics::new();
        let sub = metrics.webhooks.subscription("oncall");
        sub.attempt(DeliveryOutcome::Delivered);
        sub.attempt(DeliveryOutcome::Failed);
        sub.attempt(DeliveryOutcome::Failed);
        sub.duration.observe(0.02);
        sub.dead_lettered(3);
        sub.queue_depth(7);
        let (_, text) = metrics.render(None);
        for line in [
            "switchyard_webhook_delivery_attempts_total{webhook=\"oncall\",outcome=\"delivered\"} 1",
            "switchyard_webhook_delivery_attempts_total{webhook=\"oncall\",outcome=\"failed\"} 2",
            "switchyard_webhook_delivery_attempts_total{webhook=\"oncall\",outcome=\"refused\"} 0",
            "switchyard_webhook_delivery_duration_seconds_count{webhook=\"oncall\"} 1",
            "switchyard_webhook_dead_letters_total{webhook=\"oncall\"} 3",
            "switchyard_webhook_queue_depth{webhook=\"oncall\"} 7",
            "switchyard_control_nodes_connected 0",
        ] {
            assert!(text.lines().any(|l| l == line), "no {line:?} in:\n{text}");
        }
        drop(sub);
        let (_, text) = metrics.render(None);
        assert!(!text.contains("switchyard_webhook_queue_depth{"), "{text}");
        assert!(text.contains("switchyard_webhook_dead_letters_total{webhook=\"oncall\"} 3"));
    }
}
