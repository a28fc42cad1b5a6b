//! What a node owns once and every request, stream and probe uses: its telemetry (failover
//! events, usage, the event spool), the keys' limits, the metrics, the registry of circuit
//! breakers and the counts of requests in flight per deployment. Below `executor`, `stream`,
//! `probe` and `http`, so none of them reaches into another for these.

use std::sync::Arc;

use switchyard_catalog::{BreakerPolicy, Model};
use switchyard_proto::node::v1 as pb;

use crate::breaker::{Breaker, Breakers, LastProbe, Snapshot, State, Transition};
use crate::config::NodeConfig;
use crate::deployment::Loads;
use crate::limits::Ledger;
use crate::metrics::{BreakerLabels, Metrics, TransitionLabels};
use crate::telemetry::Telemetry;

pub struct Services {
    /// Failover events, usage and breaker reports for the control plane, and the spool
    /// that keeps the events it cannot take yet.
    pub telemetry: Arc<Telemetry>,
    /// Every limited key's counts and the fleet's (the one `telemetry` reports from).
    pub limits: Arc<Ledger>,
    pub metrics: Arc<Metrics>,
    /// One breaker per (provider, upstream model), shared with the config stream, which
    /// lays the fleet's view over them.
    pub breakers: Breakers,
    /// Requests in flight per deployment and provider, and their caps.
    pub loads: Loads,
}

impl Services {
    pub fn new(telemetry: Arc<Telemetry>, metrics: Arc<Metrics>, breakers: Breakers) -> Self {
        Self {
            limits: Arc::clone(&telemetry.limits),
            loads: Loads::new(Arc::clone(&metrics)),
            telemetry,
            metrics,
            breakers,
        }
    }

    /// The breaker of `model`'s (provider, upstream model), with the catalog's policy and
    /// the model's override in force.
    pub fn breaker(&self, config: &NodeConfig, model: &Model) -> Arc<Breaker> {
        let policy: BreakerPolicy = match &model.breaker {
            Some(o) => config.catalog.breaker_policy.with_override(o),
            None => config.catalog.breaker_policy,
        };
        // Names folded into their wildcard (chain::lookup) share its one breaker.
        self.breakers.get(&model.provider, model.breaker_upstream(), policy)
    }

    /// Logs a breaker transition, updates its metrics and queues it for the control plane.
    pub fn report_transition(&self, transition: Option<Transition>) {
        let Some(t) = transition else { return };
        let state = match t.to {
            State::Closed => 0,
            State::HalfOpen => 1,
            State::Open => 2,
        };
        self.metrics
            .breaker_state
            .get_or_create(&BreakerLabels {
                provider: t.provider.clone(),
                upstream_model: t.upstream_model.clone(),
            })
            .set(state);
        self.metrics
            .breaker_transitions
            .get_or_create(&TransitionLabels {
                provider: t.provider.clone(),
                upstream_model: t.upstream_model.clone(),
                to: t.to.as_str(),
            })
            .inc();
        tracing::info!(
            provider = %t.provider, model = %t.upstream_model,
            from = t.from.as_str(), to = t.to.as_str(), cause = t.cause.as_str(),
            "circuit breaker changed state"
        );
        let (last_probe_unix_ms, last_probe_outcome, last_probe_latency_ms) =
            last_probe_fields(t.last_probe);
        self.telemetry.push_transition(pb::BreakerTransition {
            provider: t.provider,
            upstream_model: t.upstream_model,
            from: t.from.as_str().to_owned(),
            to: t.to.as_str().to_owned(),
            cause: t.cause.as_str().to_owned(),
            at_unix_ms: switchyard_time::unix_ms(t.at),
            failure_rate: t.failure_rate,
            calls_in_window: t.calls_in_window,
            next_probe_unix_ms: t.next_probe.map_or(0, switchyard_time::unix_ms),
            cooldown_ms: t.cooldown.as_millis() as u64,
            last_probe_unix_ms,
            last_probe_outcome,
            last_probe_latency_ms,
            // Numbered by the telemetry queue.
            seq: 0,
        });
    }

    /// Queues a breaker for the control plane as it is after a probe that changed nothing
    /// of its state (`probed` in the node proto): its last probe shows in `switchyard
    /// breakers`.
    pub fn report_probed(&self, s: Snapshot) {
        let (last_probe_unix_ms, last_probe_outcome, last_probe_latency_ms) =
            last_probe_fields(s.last_probe);
        self.telemetry.push_probed(pb::BreakerTransition {
            provider: s.provider,
            upstream_model: s.upstream_model,
            from: s.state.as_str().to_owned(),
            to: s.state.as_str().to_owned(),
            cause: s.cause.map_or("", |c| c.as_str()).to_owned(),
            at_unix_ms: switchyard_time::unix_ms(s.since),
            failure_rate: s.failure_rate,
            calls_in_window: s.calls_in_window,
            next_probe_unix_ms: s.next_probe.map_or(0, switchyard_time::unix_ms),
            cooldown_ms: s.cooldown.as_millis() as u64,
            last_probe_unix_ms,
            last_probe_outcome,
            last_probe_latency_ms,
            // Numbered by the telemetry queue.
            seq: 0,
        });
    }
}

/// A breaker's last probe as the node proto carries it: 0 and empty when never probed.
fn last_probe_fields(probe: Option<LastProbe>) -> (i64, String, u64) {
    probe.map_or((0, String::new(), 0), |p| {
        (
            switchyard_time::unix_ms(p.at),
            p.outcome.as_str().to_owned(),
            p.latency.as_millis() as u64,
        )
    })
}
