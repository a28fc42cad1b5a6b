//! The body of a `/metrics` answer, in the format the scraper asked for.
//!
//! `prometheus-client` writes OpenMetrics text, which Prometheus asks for in its `Accept`
//! header. `curl`, `promtool check metrics` and older scrapers send no such header and read
//! the Prometheus text format (version 0.0.4), which differs from OpenMetrics in three ways
//! that matter here: a counter's `HELP` and `TYPE` lines name the sample (`x_total`), not
//! the family (`x`); there is no `# UNIT` line; there is no `# EOF` terminator. Everything
//! else this crate's users register (counters, gauges, histograms, label sets) is written
//! the same way in both.
#![forbid(unsafe_code)]

use std::collections::HashSet;

use prometheus_client::registry::Registry;

pub const OPENMETRICS: &str = "application/openmetrics-text; version=1.0.0; charset=utf-8";
pub const PROMETHEUS_TEXT: &str = "text/plain; version=0.0.4; charset=utf-8";

/// The content type and body for a scraper that sent `accept` (the `Accept` header, if any).
pub fn render(registry: &Registry, accept: Option<&str>) -> (&'static str, String) {
    let mut openmetrics = String::new();
    // Writing into a String cannot fail.
    let _ = prometheus_client::encoding::text::encode(&mut openmetrics, registry);
    if wants_openmetrics(accept) {
        (OPENMETRICS, openmetrics)
    } else {
        (PROMETHEUS_TEXT, to_prometheus_text(&openmetrics))
    }
}

/// Whether the `Accept` header lists OpenMetrics text with a non-zero quality.
pub fn wants_openmetrics(accept: Option<&str>) -> bool {
    accept.is_some_and(|accept| {
        accept.split(',').any(|range| {
            let mut params = range.split(';').map(str::trim);
            let media = params.next().unwrap_or_default();
            media.eq_ignore_ascii_case("application/openmetrics-text")
                && !params.any(|p| {
                    p.strip_prefix("q=").is_some_and(|q| q.parse::<f32>().is_ok_and(|q| q <= 0.0))
                })
        })
    })
}

/// OpenMetrics text, as `prometheus-client` writes it, in the Prometheus text format.
pub fn to_prometheus_text(openmetrics: &str) -> String {
    let counters: HashSet<&str> = openmetrics
        .lines()
        .filter_map(|line| line.strip_prefix("# TYPE "))
        .filter_map(|rest| rest.split_once(' '))
        .filter(|(_, kind)| *kind == "counter")
        .map(|(family, _)| family)
        .collect();
    let mut out = String::with_capacity(openmetrics.len() + 16 * counters.len());
    for line in openmetrics.lines() {
        if line == "# EOF" || line.starts_with("# UNIT ") {
            continue;
        }
        let metadata = line
            .strip_prefix("# HELP ")
            .map(|rest| ("# HELP ", rest))
            .or_else(|| line.strip_prefix("# TYPE ").map(|rest| ("# TYPE ", rest)));
        match metadata {
            Some((prefix, rest)) => {
                let (family, tail) = rest.split_once(' ').unwrap_or((rest, ""));
                out.push_str(prefix);
                out.push_str(family);
                if counters.contains(family) {
                    out.push_str("_total");
                }
                if !tail.is_empty() {
                    out.push(' ');
                    out.push_str(tail);
                }
            }
            None => out.push_str(line),
        }
        out.push('\n');
    }
    out
}

#[cfg(test)]
mod tests {
    use super::*;
    use prometheus_client::metrics::counter::Counter;
    use prometheus_client::metrics::gauge::Gauge;
    use prometheus_client::metrics::histogram::Histogram;

    fn registry() -> Registry {
        let mut registry = Registry::with_prefix("switchyard");
        let requests = Counter::<u64>::default();
        requests.inc_by(3);
        registry.register("http_requests", "Requests", requests);
        let version = Gauge::<i64>::default();
        version.set(7);
        registry.register("config_version", "Revision", version);
        let duration = Histogram::new([0.1, 1.0]);
        duration.observe(0.5);
        registry.register("request_duration_seconds", "Duration", duration);
        registry
    }

    #[test]
    fn counters_are_named_by_their_sample_in_the_prometheus_format() {
        let (kind, body) = render(&registry(), None);
        assert_eq!(kind, PROMETHEUS_TEXT);
        assert!(body.contains("# HELP switchyard_http_requests_total Requests.\n"), "{body}");
        assert!(body.contains("# TYPE switchyard_http_requests_total counter\n"), "{body}");
        assert!(body.contains("\nswitchyard_http_requests_total 3\n"), "{body}");
        assert!(body.contains("# TYPE switchyard_config_version gauge\n"), "{body}");
        assert!(
            body.contains("# TYPE switchyard_request_duration_seconds histogram\n"),
            "histograms keep their family name: {body}"
        );
        assert!(body.contains("switchyard_request_duration_seconds_bucket{le=\"1.0\"} 1\n"));
        assert!(!body.contains("# EOF"), "{body}");
        assert!(!body.contains("# UNIT"), "{body}");
    }

    #[test]
    fn a_scraper_that_asks_for_openmetrics_gets_it_unchanged() {
        let accept = "application/openmetrics-text;version=1.0.0,application/openmetrics-text;version=0.0.1;q=0.75,text/plain;version=0.0.4;q=0.5,*/*;q=0.1";
        let (kind, body) = render(&registry(), Some(accept));
        assert_eq!(kind, OPENMETRICS);
        assert!(body.contains("# TYPE switchyard_http_requests counter\n"), "{body}");
        assert!(body.ends_with("# EOF\n"), "{body}");
    }

    #[test]
    fn only_a_listed_and_acceptable_openmetrics_range_selects_it() {
        for (accept, expected) in [
            (None, false),
            (Some("*/*"), false),
            (Some("text/plain"), false),
            (Some("application/openmetrics-text"), true),
            (Some("Application/OpenMetrics-Text; version=1.0.0"), true),
            (Some("application/openmetrics-text;q=0"), false),
            (Some("text/plain, application/openmetrics-text; q=0.5"), true),
        ] {
            assert_eq!(wants_openmetrics(accept), expected, "{accept:?}");
        }
    }
}
