//! The control plane's Prometheus metrics, at `/metrics` on its listening port (HTTP/1.1 or
//! HTTP/2 beside the gRPC services): what an operator watches to know that nodes are
//! connected and that the audit log keeps up.

use prometheus_client::metrics::counter::Counter;
use prometheus_client::metrics::gauge::Gauge;
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
}

impl ControlMetrics {
    pub fn new() -> Self {
        let mut registry = Registry::with_prefix("switchyard_control");
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
        // What OpenTelemetry export dropped: the process's one family, with no samples
        // while OpenTelemetry is off (docs/operating.md, "Traces and log records").
        registry.register(
            switchyard_otel::DROPPED_NAME,
            switchyard_otel::DROPPED_HELP,
            switchyard_otel::dropped().clone(),
        );
        Self {
            registry,
            nodes_connected,
            events_stored,
            event_write_failures,
            config_revision,
            node_resyncs,
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
