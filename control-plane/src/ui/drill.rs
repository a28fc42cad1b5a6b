//! Drills run from the console: the five scenarios of `switchyard drill`, reduced to what
//! a control plane can do by itself.
//!
//! `switchyard drill` sends its own requests through a node with the drill key's secret;
//! the control plane holds no key secrets (only their hashes), so it cannot. A console
//! drill injects the scenario's faults, only for the chosen key, and judges the traffic
//! that key sends through the chosen node while the faults are in force, from the audit
//! log: every attempt a fault touched names it (`injected`), so the drill's requests are
//! told apart from real outages. The faults end with their TTL or the "clear" button.

use switchyard_catalog::fault::{Fault, FaultKind, FaultTarget};
use switchyard_proto::node::v1::FailoverEvent;

/// How long a console drill's faults live unless cleared first.
pub const DRILL_TTL: std::time::Duration = std::time::Duration::from_secs(300);

#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum Scenario {
    PrimaryDown,
    PrimaryFlaky,
    StreamStall,
    AllDown,
    StreamCut,
}

impl Scenario {
    pub const ALL: [Scenario; 5] = [
        Scenario::PrimaryDown,
        Scenario::PrimaryFlaky,
        Scenario::StreamStall,
        Scenario::AllDown,
        Scenario::StreamCut,
    ];

    pub fn name(self) -> &'static str {
        match self {
            Scenario::PrimaryDown => "primary-down",
            Scenario::PrimaryFlaky => "primary-flaky",
            Scenario::StreamStall => "stream-stall",
            Scenario::AllDown => "all-down",
            Scenario::StreamCut => "stream-cut",
        }
    }

    pub fn parse(name: &str) -> Option<Self> {
        Self::ALL.into_iter().find(|s| s.name() == name)
    }

    /// What the scenario breaks, as the form explains it.
    pub fn describe(self) -> &'static str {
        match self {
            Scenario::PrimaryDown => "the model answers 503 to every call",
            Scenario::PrimaryFlaky => "half of the model's calls answer 503",
            Scenario::StreamStall => "the model's streams stop after 3 content chunks",
            Scenario::AllDown => "every model of the key's chain answers 503",
            Scenario::StreamCut => "the model's streams are cut off after 2 content chunks",
        }
    }

    /// The faults the scenario injects for `key_id`: on `model`, or on each model of
    /// `chain` (the model first) for `all-down`.
    pub fn faults(self, tag: &str, key_id: &str, model: &str, chain: &[String]) -> Vec<Fault> {
        let fault = |name: String, model: &str, rate: f64, kind: FaultKind| Fault {
            name,
            target: FaultTarget::Model(model.to_owned()),
            key_id: Some(key_id.to_owned()),
            rate,
            kind,
            expires_at_unix_ms: 0,
        };
        let base = format!("drill-{}-{tag}", self.name());
        let unavailable = FaultKind::Status { status: 503, retry_after_secs: None };
        match self {
            Scenario::PrimaryDown => vec![fault(base, model, 1.0, unavailable)],
            Scenario::PrimaryFlaky => vec![fault(base, model, 0.5, unavailable)],
            Scenario::StreamStall => {
                vec![fault(base, model, 1.0, FaultKind::StallAfter { chunks: 3 })]
            }
            Scenario::StreamCut => {
                vec![fault(base, model, 1.0, FaultKind::DropAfter { chunks: 2 })]
            }
            Scenario::AllDown => chain
                .iter()
                .enumerate()
                .map(|(i, m)| fault(format!("{base}-{}", i + 1), m, 1.0, unavailable.clone()))
                .collect(),
        }
    }
}

/// One drill started from the console.
#[derive(Clone, Debug)]
pub struct DrillRun {
    pub id: u64,
    pub scenario: Scenario,
    pub node_id: String,
    pub key_id: String,
    pub model: String,
    pub faults: Vec<String>,
    pub started_unix_ms: i64,
}

#[derive(Clone, Debug, PartialEq)]
pub enum Verdict {
    /// No request of the key through the node met the faults yet.
    Waiting,
    Pass(String),
    Fail(String),
}

impl Verdict {
    pub fn word(&self) -> &'static str {
        match self {
            Verdict::Waiting => "waiting",
            Verdict::Pass(_) => "pass",
            Verdict::Fail(_) => "fail",
        }
    }

    pub fn detail(&self) -> &str {
        match self {
            Verdict::Waiting => {
                "no request of this key through this node has met the drill's faults yet: send \
                 some traffic with the key (while the model's breaker on the node is open, \
                 requests skip the model and meet no fault)"
            }
            Verdict::Pass(d) | Verdict::Fail(d) => d,
        }
    }
}

impl DrillRun {
    /// Whether `event` is one of the drill's requests: the key's, through the node, since
    /// the drill started, with an attempt one of its faults touched.
    fn touched(&self, event: &FailoverEvent) -> bool {
        event.key_id == self.key_id
            && event.node_id == self.node_id
            && event.at_unix_ms >= self.started_unix_ms
            && event.attempts.iter().any(|a| self.faults.contains(&a.injected))
    }

    /// The verdict on the drill's requests among `events` (any order).
    pub fn verdict(&self, events: &[FailoverEvent]) -> Verdict {
        let mine: Vec<&FailoverEvent> = events.iter().filter(|e| self.touched(e)).collect();
        if mine.is_empty() {
            return Verdict::Waiting;
        }
        let n = mine.len();
        match self.scenario {
            Scenario::PrimaryDown | Scenario::PrimaryFlaky | Scenario::StreamStall => {
                let bad: Vec<_> = mine
                    .iter()
                    .filter(|e| {
                        e.served_model.is_empty() || e.served_model == self.model || e.status >= 400
                    })
                    .collect();
                match bad.first() {
                    None => {
                        let served: std::collections::BTreeSet<&str> =
                            mine.iter().map(|e| e.served_model.as_str()).collect();
                        let served: Vec<&str> = served.into_iter().collect();
                        Verdict::Pass(format!(
                            "{n} request(s) met the fault on {} and were answered by {}",
                            self.model,
                            served.join(", ")
                        ))
                    }
                    Some(e) => Verdict::Fail(format!(
                        "{} of {n} request(s) were not rescued: e.g. {} answered status {}{}",
                        bad.len(),
                        e.request_id_or_id(),
                        e.status,
                        if e.degraded.is_empty() {
                            String::new()
                        } else {
                            format!(" ({})", e.degraded)
                        }
                    )),
                }
            }
            Scenario::StreamCut => {
                let continued = mine
                    .iter()
                    .filter(|e| e.continued.iter().any(|c| c.outcome == "served"))
                    .count();
                if continued == n {
                    Verdict::Pass(format!("{n} cut stream(s) were continued to the end"))
                } else {
                    Verdict::Fail(format!(
                        "{} of {n} cut stream(s) were not continued to the end",
                        n - continued
                    ))
                }
            }
            Scenario::AllDown => {
                let escaped: Vec<_> = mine.iter().filter(|e| !e.served_model.is_empty()).collect();
                match escaped.first() {
                    None => {
                        let degraded = mine.iter().filter(|e| !e.degraded.is_empty()).count();
                        Verdict::Pass(format!(
                            "{n} request(s) failed on every model of the chain and got a clear \
                             answer ({degraded} degraded, {} errors)",
                            n - degraded
                        ))
                    }
                    Some(e) => Verdict::Fail(format!(
                        "{} of {n} request(s) were served although every model was down: e.g. by {}",
                        escaped.len(),
                        e.served_model
                    )),
                }
            }
        }
    }
}

trait EventId {
    fn request_id_or_id(&self) -> &str;
}

impl EventId for FailoverEvent {
    fn request_id_or_id(&self) -> &str {
        if self.request_id.is_empty() { &self.id } else { &self.request_id }
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use switchyard_proto::node::v1::{Attempt, Continuation};

    fn run(scenario: Scenario) -> DrillRun {
        DrillRun {
            id: 1,
            scenario,
            node_id: "n1".into(),
            key_id: "k1".into(),
            model: "primary".into(),
            faults: vec!["drill-x".into()],
            started_unix_ms: 1000,
        }
    }

    fn event(served: &str, status: u32, injected: &str) -> FailoverEvent {
        FailoverEvent {
            id: "e".into(),
            at_unix_ms: 2000,
            node_id: "n1".into(),
            key_id: "k1".into(),
            requested_model: "primary".into(),
            served_model: served.into(),
            status,
            attempts: vec![Attempt {
                model: "primary".into(),
                status: "failed".into(),
                reason: "server_error".into(),
                injected: injected.into(),
                ..Default::default()
            }],
            ..Default::default()
        }
    }

    #[test]
    fn primary_down_passes_when_every_touched_request_is_served_by_another_model() {
        let r = run(Scenario::PrimaryDown);
        assert_eq!(r.verdict(&[]), Verdict::Waiting);
        // Another key's, or a real outage's, events do not count.
        let mut other = event("", 502, "drill-x");
        other.key_id = "k2".into();
        assert_eq!(r.verdict(&[other, event("", 502, "")]), Verdict::Waiting);
        assert!(
            matches!(r.verdict(&[event("fallback", 200, "drill-x")]), Verdict::Pass(d) if d.contains("fallback"))
        );
        assert!(matches!(
            r.verdict(&[event("fallback", 200, "drill-x"), event("", 503, "drill-x")]),
            Verdict::Fail(_)
        ));
    }

    #[test]
    fn all_down_fails_when_a_model_escaped_the_faults() {
        let r = run(Scenario::AllDown);
        assert!(matches!(r.verdict(&[event("", 503, "drill-x")]), Verdict::Pass(_)));
        assert!(matches!(r.verdict(&[event("fallback", 200, "drill-x")]), Verdict::Fail(_)));
    }

    #[test]
    fn stream_cut_passes_only_when_each_cut_stream_was_continued() {
        let r = run(Scenario::StreamCut);
        let mut ok = event("fallback", 200, "drill-x");
        ok.continued = vec![Continuation { outcome: "served".into(), ..Default::default() }];
        assert!(matches!(r.verdict(&[ok.clone()]), Verdict::Pass(_)));
        assert!(matches!(r.verdict(&[ok, event("primary", 200, "drill-x")]), Verdict::Fail(_)));
    }

    #[test]
    fn all_down_injects_one_fault_per_model_of_the_chain_for_the_key_only() {
        let chain = vec!["a".to_owned(), "b".to_owned()];
        let faults = Scenario::AllDown.faults("t", "k1", "a", &chain);
        assert_eq!(faults.len(), 2);
        assert!(faults.iter().all(|f| f.key_id.as_deref() == Some("k1")));
        assert_eq!(faults[1].target, FaultTarget::Model("b".into()));
        assert!(Scenario::parse("primary-down").is_some() && Scenario::parse("nope").is_none());
    }
}
