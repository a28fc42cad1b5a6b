//! The one count of what OpenTelemetry export lost: each server registers it in its own
//! `/metrics` registry (`switchyard_otel_dropped_total` on a node,
//! `switchyard_control_otel_dropped_total` on a control plane).

use std::sync::OnceLock;

use prometheus_client::encoding::EncodeLabelSet;
use prometheus_client::metrics::counter::Counter;
use prometheus_client::metrics::family::Family;

pub const NAME: &str = "otel_dropped";
pub const HELP: &str = "Spans and log records not exported: the export queue was full (a slow or absent collector), the collector did not take a batch, or it had just refused one and was not tried again yet";

#[derive(Clone, Debug, Hash, PartialEq, Eq, EncodeLabelSet)]
pub struct DroppedLabels {
    /// `spans` or `logs`.
    pub signal: &'static str,
    /// `queue_full`, `export_failed`, or `collector_down` (not made, or dropped unsent,
    /// while the exporter waits before trying a collector that refused the last batch
    /// again).
    pub reason: &'static str,
}

/// The process's one family: every clone counts into the same samples.
pub fn dropped() -> &'static Family<DroppedLabels, Counter> {
    static DROPPED: OnceLock<Family<DroppedLabels, Counter>> = OnceLock::new();
    DROPPED.get_or_init(Family::default)
}

/// The counter of one signal and reason.
pub fn counter(signal: &'static str, reason: &'static str) -> Counter {
    dropped().get_or_create(&DroppedLabels { signal, reason }).clone()
}
