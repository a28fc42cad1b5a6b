//! `chaos`: the faults in force, what an inject stored, what a clear ended.

use std::time::Duration;

use serde::Serialize;
use switchyard_catalog::fault::{Fault, FaultKind, FaultTarget};
use switchyard_time::format_duration;

use super::text::{Table, utc};

/// What `chaos inject --json` prints: the fault as stored (the shape nodes receive) and the
/// store revision of the write.
#[derive(Debug, Serialize)]
pub struct InjectedView {
    #[serde(flatten)]
    pub fault: Fault,
    /// A node whose applied version (`switchyard nodes`) reaches it has the fault.
    pub version: i64,
}

/// One entry of `chaos list --json`: the fault as stored, and how long it has left.
#[derive(Debug, Serialize)]
pub struct FaultView {
    #[serde(flatten)]
    pub fault: Fault,
    pub expires_in_ms: i64,
}

impl FaultView {
    pub fn new(fault: Fault, now_ms: i64) -> Self {
        let expires_in_ms = (fault.expires_at_unix_ms - now_ms).max(0);
        Self { fault, expires_in_ms }
    }
}

/// What `chaos clear --json` prints.
#[derive(Debug, Serialize)]
pub struct ClearedView {
    pub cleared: Vec<String>,
    /// Store revision of the delete; 0 when nothing was in force.
    pub version: i64,
}

/// `model sim/primary`, `provider openai`.
fn target(t: &FaultTarget) -> String {
    match t {
        FaultTarget::Model(m) => format!("model {m}"),
        FaultTarget::Provider(p) => format!("provider {p}"),
    }
}

/// The kind as its flags spell it: `status 503 retry-after 2`, `delay-ms 500`, `hang`.
fn kind(k: &FaultKind) -> String {
    match k {
        FaultKind::Status { status, retry_after_secs: None } => format!("status {status}"),
        FaultKind::Status { status, retry_after_secs: Some(s) } => {
            format!("status {status} retry-after {s}")
        }
        FaultKind::Delay { ms } => format!("delay-ms {ms}"),
        FaultKind::StallAfter { chunks } | FaultKind::DropAfter { chunks } => {
            format!("{} {chunks}", k.flag())
        }
        FaultKind::Hang | FaultKind::Reset | FaultKind::Malformed => k.flag().to_owned(),
    }
}

/// Whole seconds left, as people say them (`9m 58s`); `0s` once it is due.
fn left(expires_at_unix_ms: i64, now_ms: i64) -> String {
    let secs = u64::try_from((expires_at_unix_ms - now_ms).max(0) / 1000).unwrap_or(0);
    if secs == 0 { "0s".to_owned() } else { format_duration(Duration::from_secs(secs)) }
}

/// `every call` or `50% of calls`.
fn rate(rate: f64) -> String {
    // Rounded to a hundredth of a percent: 0.07 × 100 is 7.000000000000001 in binary.
    let percent = (rate * 10_000.0).round() / 100.0;
    if rate >= 1.0 { "every call".to_owned() } else { format!("{percent}% of calls") }
}

pub fn faults_table(faults: &[Fault], now_ms: i64) -> String {
    if faults.is_empty() {
        return "no faults in force\n".to_owned();
    }
    let mut t = Table::new(["NAME", "TARGET", "KEY", "KIND", "RATE", "EXPIRES IN"]);
    for f in faults {
        t.row(vec![
            f.name.clone(),
            target(&f.target),
            f.key_id.clone().unwrap_or_else(|| "-".to_owned()),
            kind(&f.kind),
            f.rate.to_string(),
            left(f.expires_at_unix_ms, now_ms),
        ]);
    }
    t.render()
}

pub fn injected(v: &InjectedView, now_ms: i64) -> String {
    let f = &v.fault;
    let key = f.key_id.as_ref().map(|k| format!(" of key {k}")).unwrap_or_default();
    format!(
        "injected {}: {} on {}{key}, {}; ends in {} ({})\nversion {}\n",
        f.name,
        kind(&f.kind),
        target(&f.target),
        rate(f.rate),
        left(f.expires_at_unix_ms, now_ms),
        utc(f.expires_at_unix_ms),
        v.version
    )
}

pub fn cleared(v: &ClearedView) -> String {
    match v.cleared.as_slice() {
        [] => "no faults were in force\n".to_owned(),
        [one] => format!("cleared {one}\nversion {}\n", v.version),
        many => {
            format!("cleared {} faults: {}\nversion {}\n", many.len(), many.join(", "), v.version)
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    const NOW: i64 = 1_796_219_557_000;

    fn fault(name: &str, target: FaultTarget, kind: FaultKind) -> Fault {
        Fault {
            name: name.into(),
            target,
            key_id: None,
            rate: 1.0,
            kind,
            expires_at_unix_ms: NOW + 598_400,
        }
    }

    #[test]
    fn the_table_shows_target_key_kind_rate_and_time_left() {
        let mut flaky = fault(
            "flaky",
            FaultTarget::Provider("openai".into()),
            FaultKind::Status { status: 503, retry_after_secs: Some(2) },
        );
        flaky.rate = 0.5;
        flaky.key_id = Some("key_a".into());
        let stall = fault(
            "stall",
            FaultTarget::Model("sim/primary".into()),
            FaultKind::StallAfter { chunks: 3 },
        );
        assert_eq!(
            faults_table(&[flaky, stall], NOW),
            "NAME   TARGET             KEY    KIND                      RATE  EXPIRES IN\n\
             flaky  provider openai    key_a  status 503 retry-after 2  0.5   9m 58s\n\
             stall  model sim/primary  -      stall-after 3             1     9m 58s\n"
        );
        assert_eq!(faults_table(&[], NOW), "no faults in force\n");
    }

    #[test]
    fn every_kind_reads_as_its_flags() {
        let cases = [
            (FaultKind::Delay { ms: 500 }, "delay-ms 500"),
            (FaultKind::Hang, "hang"),
            (FaultKind::Reset, "reset"),
            (FaultKind::Malformed, "malformed"),
            (FaultKind::DropAfter { chunks: 1 }, "drop-after 1"),
            (FaultKind::Status { status: 429, retry_after_secs: None }, "status 429"),
        ];
        for (k, text) in cases {
            assert_eq!(kind(&k), text);
        }
    }

    #[test]
    fn an_inject_says_what_it_stored_and_until_when() {
        let mut f = fault("drill", FaultTarget::Model("sim/primary".into()), FaultKind::Hang);
        f.rate = 0.25;
        f.key_id = Some("key_a".into());
        let text = injected(&InjectedView { fault: f, version: 42 }, NOW);
        assert_eq!(
            text,
            "injected drill: hang on model sim/primary of key key_a, 25% of calls; \
             ends in 9m 58s (2026-12-02 14:02:35 UTC)\nversion 42\n"
        );
    }

    #[test]
    fn list_json_is_the_stored_shape_with_the_time_left() {
        let f = fault("drill", FaultTarget::Model("m".into()), FaultKind::Reset);
        let json = serde_json::to_value(FaultView::new(f, NOW)).unwrap();
        assert_eq!(json["target"]["model"], "m");
        assert_eq!(json["kind"]["type"], "reset");
        assert_eq!(json["expires_in_ms"], 598_400);
        assert!(json.get("key_id").is_none());
    }

    #[test]
    fn a_clear_names_what_it_ended() {
        let v = |names: &[&str]| ClearedView {
            cleared: names.iter().map(|n| (*n).to_owned()).collect(),
            version: 7,
        };
        assert_eq!(cleared(&v(&[])), "no faults were in force\n");
        assert_eq!(cleared(&v(&["a"])), "cleared a\nversion 7\n");
        assert_eq!(cleared(&v(&["a", "b"])), "cleared 2 faults: a, b\nversion 7\n");
    }
}
