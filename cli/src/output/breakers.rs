//! `breakers`: every node's circuit breakers, when each next probes and how its last probe
//! went; and the fleet's view (the deployments open for every node, who opened each, which
//! node probes it).

use serde::Serialize;
use switchyard_proto::admin::v1 as pb;
use switchyard_proto::node::BreakerState;
use switchyard_proto::node::v1 as node_pb;

use super::text::{Table, ago};

#[derive(Debug, Serialize)]
pub struct BreakerView {
    pub node_id: String,
    pub provider: String,
    pub upstream_model: String,
    pub state: String,
    pub since_unix_ms: i64,
    pub failure_rate: f64,
    pub next_probe_unix_ms: i64,
    pub cause: String,
    pub cooldown_ms: u64,
    /// `null` when the node never probed this breaker (no `probe` for its model).
    pub last_probe: Option<LastProbe>,
}

#[derive(Debug, Serialize)]
pub struct LastProbe {
    /// When the probe started.
    pub at_unix_ms: i64,
    /// `success`, `failure`, `timeout`, or `error` (the gateway could not make the call).
    pub outcome: String,
    pub latency_ms: u64,
}

impl From<pb::Breaker> for BreakerView {
    fn from(b: pb::Breaker) -> Self {
        Self {
            node_id: b.node_id,
            provider: b.provider,
            upstream_model: b.upstream_model,
            state: b.state,
            since_unix_ms: b.since_unix_ms,
            failure_rate: b.failure_rate,
            next_probe_unix_ms: b.next_probe_unix_ms,
            cause: b.cause,
            cooldown_ms: b.cooldown_ms,
            last_probe: (b.last_probe_unix_ms > 0).then_some(LastProbe {
                at_unix_ms: b.last_probe_unix_ms,
                outcome: b.last_probe_outcome,
                latency_ms: b.last_probe_latency_ms,
            }),
        }
    }
}

/// The fleet's breaker view (`switchyard breakers --fleet --json`).
#[derive(Debug, Serialize)]
pub struct FleetView {
    /// `false` when `breaker_policy.fleet` is off: each node goes by its own breakers.
    pub enabled: bool,
    pub open: Vec<FleetOpenView>,
}

/// One deployment open for the fleet.
#[derive(Debug, Serialize)]
pub struct FleetOpenView {
    /// `<provider>/<upstream_model>`.
    pub deployment: String,
    pub provider: String,
    pub upstream_model: String,
    /// Always `open (fleet)`: listed only while open.
    pub state: &'static str,
    pub since_unix_ms: i64,
    pub opened_by: String,
    /// The node that probes it for the fleet; `null` while no node is connected.
    pub prober: Option<String>,
    /// Nodes whose own breaker of it is open or half-open.
    pub open_on: Vec<String>,
    /// Open for every node until then, unless the prober reports sooner.
    pub until_unix_ms: i64,
}

impl FleetView {
    pub fn from_reply(enabled: bool, open: Vec<node_pb::FleetBreaker>) -> Self {
        let open = open
            .into_iter()
            .map(|b| FleetOpenView {
                deployment: format!("{}/{}", b.provider, b.upstream_model),
                provider: b.provider,
                upstream_model: b.upstream_model,
                state: "open (fleet)",
                since_unix_ms: b.since_unix_ms,
                opened_by: b.opened_by,
                prober: (!b.prober.is_empty()).then_some(b.prober),
                open_on: b.open_on,
                until_unix_ms: b.until_unix_ms,
            })
            .collect();
        Self { enabled, open }
    }
}

/// The fleet's view: one row per deployment open for every node.
pub fn fleet_table(fleet: &FleetView, now_ms: i64) -> String {
    if !fleet.enabled {
        return "fleet: off (breaker_policy.fleet: false): each node goes by its own breakers\n"
            .to_owned();
    }
    if fleet.open.is_empty() {
        return "fleet: no deployment open\n".to_owned();
    }
    let mut t =
        Table::new(["DEPLOYMENT", "FLEET STATE", "SINCE", "OPENED BY", "PROBER", "OPEN ON"]);
    for b in &fleet.open {
        t.row(vec![
            b.deployment.clone(),
            b.state.to_owned(),
            ago(b.since_unix_ms, now_ms),
            b.opened_by.clone(),
            b.prober.clone().unwrap_or_else(|| "-".to_owned()),
            if b.open_on.is_empty() { "-".to_owned() } else { b.open_on.join(",") },
        ]);
    }
    t.render()
}

/// `failure 12ms, 3s ago`; `-` when never probed.
fn last_probe(probe: Option<&LastProbe>, now_ms: i64) -> String {
    match probe {
        None => "-".to_owned(),
        Some(p) => format!("{} {}ms, {}", p.outcome, p.latency_ms, ago(p.at_unix_ms, now_ms)),
    }
}

/// The failure rate of the window that led to the breaker's last change: `62%`; `-` for a
/// closed breaker, whose window the node cleared on closing (the rate it reported is the
/// window before, which no longer counts).
fn failure_rate(b: &BreakerView) -> String {
    if b.state == BreakerState::Closed.as_str() {
        "-".to_owned()
    } else {
        format!("{:.0}%", b.failure_rate * 100.0)
    }
}

/// `in 12s`, `due` once passed; `-` when no probe is scheduled (the breaker is not open).
fn next_probe(unix_ms: i64, now_ms: i64) -> String {
    if unix_ms <= 0 {
        return "-".to_owned();
    }
    let ms = unix_ms - now_ms;
    if ms <= 0 {
        return "due".to_owned();
    }
    // Rounded up: "in 0s" for a probe still ahead would read as due.
    let secs = (ms + 999) / 1000;
    match secs {
        0..120 => format!("in {secs}s"),
        120..7200 => format!("in {}m", secs / 60),
        _ => format!("in {}h", secs / 3600),
    }
}

pub fn breakers_table(breakers: &[BreakerView], now_ms: i64) -> String {
    if breakers.is_empty() {
        return "no breakers reported\n".to_owned();
    }
    let mut t = Table::new([
        "NODE",
        "PROVIDER",
        "MODEL",
        "STATE",
        "SINCE",
        "FAILURE RATE",
        "NEXT PROBE",
        "LAST PROBE",
    ]);
    for b in breakers {
        let state =
            if b.cause.is_empty() { b.state.clone() } else { format!("{} ({})", b.state, b.cause) };
        t.row(vec![
            b.node_id.clone(),
            b.provider.clone(),
            b.upstream_model.clone(),
            state,
            ago(b.since_unix_ms, now_ms),
            failure_rate(b),
            next_probe(b.next_probe_unix_ms, now_ms),
            last_probe(b.last_probe.as_ref(), now_ms),
        ]);
    }
    t.render()
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn the_fleet_view_shows_each_open_deployment_its_opener_and_prober() {
        let fleet = FleetView::from_reply(
            true,
            vec![node_pb::FleetBreaker {
                provider: "azure-east".into(),
                upstream_model: "gpt-4o".into(),
                since_unix_ms: 5_000,
                opened_by: "n2".into(),
                prober: "n2".into(),
                until_unix_ms: 40_000,
                open_on: vec!["n2".into(), "n3".into()],
            }],
        );
        let text = fleet_table(&fleet, 10_000);
        let lines: Vec<&str> = text.lines().collect();
        assert_eq!(
            lines,
            [
                "DEPLOYMENT         FLEET STATE   SINCE   OPENED BY  PROBER  OPEN ON",
                "azure-east/gpt-4o  open (fleet)  5s ago  n2         n2      n2,n3",
            ]
        );
        let json = serde_json::to_value(&fleet).unwrap();
        assert_eq!(json["open"][0]["prober"], "n2");
        assert_eq!(json["open"][0]["deployment"], "azure-east/gpt-4o");
        // No node connected: nobody probes.
        let orphan = FleetView::from_reply(
            true,
            vec![node_pb::FleetBreaker { opened_by: "n2".into(), ..Default::default() }],
        );
        assert!(serde_json::to_value(&orphan).unwrap()["open"][0]["prober"].is_null());
        assert!(fleet_table(&orphan, 10_000).lines().nth(1).unwrap().contains(" -"));
        assert_eq!(
            fleet_table(&FleetView::from_reply(true, vec![]), 0),
            "fleet: no deployment open\n"
        );
        assert!(fleet_table(&FleetView::from_reply(false, vec![]), 0).starts_with("fleet: off"));
    }

    #[test]
    fn a_node_that_goes_by_the_fleet_shows_open_fleet() {
        let b = BreakerView::from(pb::Breaker {
            node_id: "n3".into(),
            provider: "azure-east".into(),
            upstream_model: "gpt-4o".into(),
            state: "open".into(),
            cause: "fleet".into(),
            since_unix_ms: 5_000,
            ..Default::default()
        });
        let text = breakers_table(&[b], 10_000);
        assert!(text.lines().nth(1).unwrap().contains("open (fleet)"), "{text}");
    }

    #[test]
    fn breakers_show_rate_and_time_to_the_next_probe() {
        let b = BreakerView::from(pb::Breaker {
            node_id: "n1".into(),
            provider: "openai".into(),
            upstream_model: "gpt-5-nano".into(),
            state: "open".into(),
            since_unix_ms: 5_000,
            failure_rate: 0.625,
            next_probe_unix_ms: 40_000,
            cause: "failure_rate".into(),
            cooldown_ms: 30_000,
            ..Default::default()
        });
        let text = breakers_table(&[b], 10_000);
        let lines: Vec<&str> = text.lines().collect();
        assert_eq!(
            lines[0],
            "NODE  PROVIDER  MODEL       STATE                SINCE   FAILURE RATE  NEXT PROBE  LAST PROBE"
        );
        assert_eq!(
            lines[1],
            "n1    openai    gpt-5-nano  open (failure_rate)  5s ago  62%           in 30s      -"
        );
    }

    #[test]
    fn a_closed_breaker_shows_no_failure_rate_from_the_window_before_it_closed() {
        let closed = BreakerView::from(pb::Breaker {
            node_id: "n1".into(),
            provider: "openai".into(),
            upstream_model: "gpt-5-nano".into(),
            state: "closed".into(),
            since_unix_ms: 5_000,
            // What the node reports on closing: the window that led there, then cleared.
            failure_rate: 1.0,
            cause: "probe_succeeded".into(),
            ..Default::default()
        });
        let text = breakers_table(std::slice::from_ref(&closed), 10_000);
        let row = text.lines().nth(1).unwrap();
        assert_eq!(
            row,
            "n1    openai    gpt-5-nano  closed (probe_succeeded)  5s ago  -             -           -"
        );
        // JSON keeps the reported figure for scripts.
        assert_eq!(serde_json::to_value(&closed).unwrap()["failure_rate"], 1.0);
    }

    #[test]
    fn breakers_show_the_last_probe_in_the_table_and_in_json() {
        let b = BreakerView::from(pb::Breaker {
            node_id: "n1".into(),
            provider: "openai".into(),
            upstream_model: "gpt-5-nano".into(),
            state: "open".into(),
            since_unix_ms: 5_000,
            cause: "probe_failed".into(),
            next_probe_unix_ms: 40_000,
            last_probe_unix_ms: 7_000,
            last_probe_outcome: "failure".into(),
            last_probe_latency_ms: 12,
            ..Default::default()
        });
        let text = breakers_table(std::slice::from_ref(&b), 10_000);
        let row = text.lines().nth(1).unwrap();
        assert!(row.ends_with("in 30s      failure 12ms, 3s ago"), "{row}");
        let json = serde_json::to_value(&b).unwrap();
        assert_eq!(
            json["last_probe"],
            serde_json::json!({"at_unix_ms": 7_000, "outcome": "failure", "latency_ms": 12})
        );
        let never = BreakerView::from(pb::Breaker::default());
        assert!(serde_json::to_value(&never).unwrap()["last_probe"].is_null());
    }
}
