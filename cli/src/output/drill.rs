//! `drill`: one verdict per expectation, with the figures behind it.

use crate::drill::report::{DrillReport, Surface};

fn verdict(holds: Option<bool>) -> &'static str {
    match holds {
        Some(true) => "PASS",
        Some(false) => "FAIL",
        None => "N/A ",
    }
}

/// A run's duration as people read it: `30 ms` under a second (a short run printed in
/// seconds reads `0.03 s`, or `0.00 s` under 5 ms), `2.41 s` from there on.
fn took(ms: f64) -> String {
    if ms < 999.5 { format!("{ms:.0} ms") } else { format!("{:.2} s", ms / 1000.0) }
}

pub fn drill_report(r: &DrillReport) -> String {
    let mut out = String::new();
    out.push_str(&format!(
        "drill {} through {} with key {}\n",
        r.scenario.name(),
        r.node,
        r.key_id
    ));
    // Chat Completions is the default: only another surface is named.
    if r.surface != Surface::Chat {
        out.push_str(&format!("  surface:   {} ({})\n", r.surface.name(), r.surface.path()));
    }
    out.push_str(&format!("  chain:     {}\n", r.chain.join(" → ")));
    out.push_str(&format!("  faults:    {}\n", r.faults.join(", ")));
    if let Some(k) = r.cut_after {
        out.push_str(&format!("  cut:       the primary's streams after {k} content chunks\n"));
    }
    out.push_str(&format!(
        "  requests:  {} ({} at a time) in {}; latency p50 {:.1} ms, p99 {:.1} ms\n",
        r.requests,
        r.concurrency,
        took(r.took_ms),
        r.latency_ms.p50,
        r.latency_ms.p99
    ));
    out.push_str(&format!(
        "  upstream calls per request: {:.2} to the primary, {:.2} in all\n",
        r.primary_calls_per_request, r.upstream_calls_per_request
    ));
    let transitions: Vec<String> =
        r.breaker_transitions.iter().map(|(model, n)| format!("{model} {n}")).collect();
    out.push_str(&format!("  breaker state changes on the node: {}\n", transitions.join(", ")));
    out.push('\n');
    for e in &r.expectations {
        out.push_str(&format!("  {}  {}\n        {}\n", verdict(e.holds), e.expectation, e.detail));
    }
    out.push_str(&format!(
        "  {}  the drill's faults are cleared on the node\n",
        verdict(Some(r.faults_cleared))
    ));
    out.push('\n');
    let failed = r.expectations.iter().filter(|e| e.holds == Some(false)).count()
        + usize::from(!r.faults_cleared);
    if failed == 0 {
        out.push_str("every expectation holds\n");
    } else {
        out.push_str(&format!("{failed} expectation(s) do not hold\n"));
    }
    out
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn a_drill_shorter_than_a_second_prints_its_time_in_ms() {
        assert_eq!(took(30.4), "30 ms");
        assert_eq!(took(3.0), "3 ms");
        assert_eq!(took(999.4), "999 ms");
        assert_eq!(took(2_414.0), "2.41 s");
    }
}
