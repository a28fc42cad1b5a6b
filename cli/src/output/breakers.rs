//! `breakers`: every node's circuit breakers and when each next probes.

use serde::Serialize;
use switchyard_proto::admin::v1 as pb;

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
        }
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
    let mut t =
        Table::new(["NODE", "PROVIDER", "MODEL", "STATE", "SINCE", "FAILURE RATE", "NEXT PROBE"]);
    for b in breakers {
        let state =
            if b.cause.is_empty() { b.state.clone() } else { format!("{} ({})", b.state, b.cause) };
        t.row(vec![
            b.node_id.clone(),
            b.provider.clone(),
            b.upstream_model.clone(),
            state,
            ago(b.since_unix_ms, now_ms),
            format!("{:.0}%", b.failure_rate * 100.0),
            next_probe(b.next_probe_unix_ms, now_ms),
        ]);
    }
    t.render()
}

#[cfg(test)]
mod tests {
    use super::*;

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
        });
        let text = breakers_table(&[b], 10_000);
        let lines: Vec<&str> = text.lines().collect();
        assert_eq!(
            lines[0],
            "NODE  PROVIDER  MODEL       STATE                SINCE   FAILURE RATE  NEXT PROBE"
        );
        assert_eq!(
            lines[1],
            "n1    openai    gpt-5-nano  open (failure_rate)  5s ago  62%           in 30s"
        );
    }
}
