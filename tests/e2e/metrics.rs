//! `/metrics` on a real node and control plane: the output passes `promtool check metrics`
//! (Debian's `prometheus` package; `.ci/run` installs it), the GenAI histograms carry the
//! semantic conventions' names, labels and buckets, a scraper that asks for OpenMetrics
//! gets it, and a real Prometheus raises deploy/prometheus/alerts.yaml's alerts from them.
#![allow(clippy::unwrap_used, clippy::expect_used)]

use std::net::SocketAddr;
use std::time::Duration;

use serde_json::json;
use switchyard_e2e::gateway::*;
use switchyard_e2e::{PATIENCE, ReservedPort, eventually, http_get, http_request_with, promtool};

/// A GET of `/metrics` with an `Accept` header: (content type, body).
async fn scrape_accepting(addr: SocketAddr, accept: &str) -> (String, String) {
    let response =
        http_request_with(addr, "GET", "/metrics", None, &[("accept", accept.as_bytes())], None)
            .await
            .expect("/metrics answers");
    (response.header("content-type").unwrap_or_default(), response.body)
}

async fn scrape(addr: SocketAddr) -> String {
    let response = http_get(addr, "/metrics", None).await.expect("/metrics answers");
    assert_eq!(response.status, 200, "{}", response.body);
    assert!(
        response.headers.to_ascii_lowercase().contains("content-type: text/plain; version=0.0.4"),
        "without an Accept header, the Prometheus text format: {}",
        response.headers
    );
    response.body
}

/// The value of the sample written exactly as `series` (name and labels).
fn sample(metrics: &str, series: &str) -> Option<f64> {
    metrics.lines().find_map(|l| l.strip_prefix(series)?.strip_prefix(' ')?.parse().ok())
}

fn gen_ai(name: &str, requested: &str, served: &str, error: &str, suffix: &str) -> String {
    format!(
        "{name}{suffix}{{gen_ai_operation_name=\"chat\",gen_ai_provider_name=\"openai\",\
         gen_ai_request_model=\"{requested}\",gen_ai_response_model=\"{served}\",\
         error_type=\"{error}\"}}"
    )
}

/// A `_bucket` series: prometheus-client writes `le` first.
fn with_le(series: &str, le: &str) -> String {
    series.replacen('{', &format!("{{le=\"{le}\","), 1)
}

fn tokens(requested: &str, served: &str, kind: &str, suffix: &str) -> String {
    format!(
        "gen_ai_client_token_usage{suffix}{{gen_ai_operation_name=\"chat\",\
         gen_ai_provider_name=\"openai\",gen_ai_request_model=\"{requested}\",\
         gen_ai_response_model=\"{served}\",gen_ai_token_type=\"{kind}\"}}"
    )
}

/// Served, failed-over, streamed and failed requests, so that every family has samples.
async fn traffic(gw: &Gateway) -> serde_json::Value {
    gw.script("primary", json!({"kind": "status", "status": 503})).await;
    let failover = gw
        .chat(json!({"model": PRIMARY, "fallback_models": [SECONDARY], "messages": [{"role": "user", "content": "hi"}]}))
        .await;
    assert_eq!(failover.status, 200, "{}", failover.body);
    let streamed = gw
        .stream(json!({"model": SECONDARY, "stream": true, "messages": [{"role": "user", "content": "hi"}]}))
        .await;
    assert!(streamed.text().contains("secondary"), "{}", streamed.text());
    assert!(streamed.error_frame().is_none(), "{:?}", streamed.error_frame());
    gw.script("tertiary", json!({"kind": "status", "status": 503})).await;
    let failed = gw
        .chat(json!({"model": TERTIARY, "fallback_models": [PRIMARY], "messages": [{"role": "user", "content": "hi"}]}))
        .await;
    assert_eq!(failed.status, 502, "{}", failed.body);
    failover.json()
}

#[tokio::test]
async fn node_and_control_plane_metrics_pass_promtool() {
    let gw = Gateway::start().await;
    traffic(&gw).await;
    let node = scrape(gw.node.addr).await;
    let (ok, said) = promtool(&node).await;
    assert!(ok && said.trim().is_empty(), "promtool on the node's /metrics: {said}\n{node}");
    let control = scrape(gw.cp.addr).await;
    let (ok, said) = promtool(&control).await;
    assert!(
        ok && said.trim().is_empty(),
        "promtool on the control plane's /metrics: {said}\n{control}"
    );
}

#[tokio::test]
async fn promtool_in_this_harness_refuses_what_it_should() {
    // The check above can only fail if promtool reads what it is given: a counter whose
    // TYPE line names the family, as OpenMetrics writes it, is not the Prometheus format.
    let openmetrics =
        "# HELP x_requests Requests.\n# TYPE x_requests counter\nx_requests_total 1\n";
    let (ok, said) = promtool(openmetrics).await;
    assert!(!ok || !said.trim().is_empty(), "promtool accepted OpenMetrics naming: {said}");
}

#[tokio::test]
async fn the_node_exports_the_gen_ai_histograms_with_the_conventions_buckets() {
    let gw = Gateway::start().await;
    let answer = traffic(&gw).await;
    let m = scrape(gw.node.addr).await;

    // The failed-over request: requested the primary, served by the secondary.
    let duration = "gen_ai_server_request_duration_seconds";
    let count = gen_ai(duration, PRIMARY, SECONDARY, "", "_count");
    assert_eq!(sample(&m, &count), Some(1.0), "{count} in\n{m}");
    for le in ["0.01", "81.92", "+Inf"] {
        let bucket = with_le(&gen_ai(duration, PRIMARY, SECONDARY, "", "_bucket"), le);
        assert!(sample(&m, &bucket).is_some(), "the conventions' bucket {le}: {bucket} in\n{m}");
    }
    let input = answer["usage"]["prompt_tokens"].as_f64().unwrap();
    let output = answer["usage"]["completion_tokens"].as_f64().unwrap();
    assert_eq!(sample(&m, &tokens(PRIMARY, SECONDARY, "input", "_sum")), Some(input), "{m}");
    assert_eq!(sample(&m, &tokens(PRIMARY, SECONDARY, "output", "_sum")), Some(output), "{m}");
    let bucket = with_le(&tokens(PRIMARY, SECONDARY, "input", "_bucket"), "67108864.0");
    assert_eq!(sample(&m, &bucket), Some(1.0), "{bucket} in\n{m}");

    // The stream: its time to first token, and its duration once it ended.
    let ttft =
        gen_ai("gen_ai_server_time_to_first_token_seconds", SECONDARY, SECONDARY, "", "_count");
    assert_eq!(sample(&m, &ttft), Some(1.0), "{ttft} in\n{m}");
    let ttft_bucket =
        gen_ai("gen_ai_server_time_to_first_token_seconds", SECONDARY, SECONDARY, "", "_bucket");
    let ttft_bucket = with_le(&ttft_bucket, "0.001");
    assert!(sample(&m, &ttft_bucket).is_some(), "{ttft_bucket} in\n{m}");
    let streamed = gen_ai(duration, SECONDARY, SECONDARY, "", "_count");
    assert_eq!(sample(&m, &streamed), Some(1.0), "{streamed} in\n{m}");

    // The request no model served: by the error the client got.
    let failed = gen_ai(duration, TERTIARY, "", "all_models_failed", "_count");
    assert_eq!(sample(&m, &failed), Some(1.0), "{failed} in\n{m}");
}

#[tokio::test]
async fn a_scraper_that_asks_for_openmetrics_gets_openmetrics() {
    let gw = Gateway::start().await;
    let accept = "application/openmetrics-text;version=1.0.0,text/plain;version=0.0.4;q=0.5";
    for addr in [gw.node.addr, gw.cp.addr] {
        let (content_type, body) = scrape_accepting(addr, accept).await;
        assert!(content_type.starts_with("application/openmetrics-text"), "{addr}: {content_type}");
        assert!(body.ends_with("# EOF\n"), "{addr}: {body}");
    }
}

#[tokio::test]
async fn the_control_plane_counts_connected_nodes_and_stored_events() {
    let gw = Gateway::start().await;
    let m = scrape(gw.cp.addr).await;
    assert_eq!(sample(&m, "switchyard_control_nodes_connected"), Some(1.0), "{m}");
    assert!(sample(&m, "switchyard_control_config_revision").is_some_and(|v| v > 0.0), "{m}");
    traffic(&gw).await;
    eventually(Duration::from_secs(10), "two failover events stored", || async {
        let m = scrape(gw.cp.addr).await;
        (sample(&m, "switchyard_control_failover_events_stored_total") == Some(2.0)).then_some(())
    })
    .await;

    let node = gw.node;
    node.kill().await;
    eventually(Duration::from_secs(10), "the node's stream counted as closed", || async {
        let m = scrape(gw.cp.addr).await;
        (sample(&m, "switchyard_control_nodes_connected") == Some(0.0)).then_some(())
    })
    .await;
}

/// The metric families a node exposes, by their `# TYPE` lines, with the sample names each
/// family writes (`_total`, `_bucket`, `_sum`, `_count`).
fn sample_names(metrics: &str) -> std::collections::BTreeSet<String> {
    let mut names = std::collections::BTreeSet::new();
    for line in metrics.lines() {
        if let Some(rest) = line.strip_prefix("# TYPE ") {
            let mut parts = rest.split_whitespace();
            let (Some(name), Some(kind)) = (parts.next(), parts.next()) else { continue };
            match kind {
                // The Prometheus text format names a counter's family with its `_total`;
                // OpenMetrics without it.
                "counter" => {
                    names.insert(format!("{}_total", name.trim_end_matches("_total")));
                }
                "histogram" => {
                    for suffix in ["_bucket", "_sum", "_count"] {
                        names.insert(format!("{name}{suffix}"));
                    }
                }
                _ => {
                    names.insert(name.to_owned());
                }
            }
        }
    }
    names
}

#[tokio::test]
async fn every_query_of_the_grafana_dashboard_is_valid_promql_over_metrics_a_node_exposes() {
    let path = std::path::PathBuf::from(env!("CARGO_MANIFEST_DIR"))
        .join("../deploy/grafana/switchyard.json");
    let dashboard: serde_json::Value =
        serde_json::from_str(&std::fs::read_to_string(&path).unwrap()).unwrap();
    let exprs: Vec<String> = dashboard["panels"]
        .as_array()
        .unwrap()
        .iter()
        .flat_map(|p| p["targets"].as_array().unwrap().iter())
        .map(|t| t["expr"].as_str().unwrap().to_owned())
        .collect();
    assert!(exprs.len() >= 14, "{exprs:?}");

    // Grafana's variables as it would fill them, then every query as a recording rule:
    // `promtool check rules` parses each one as Prometheus does.
    let rules: Vec<serde_json::Value> = exprs
        .iter()
        .enumerate()
        .map(|(i, e)| {
            let e = e.replace("$__rate_interval", "1m").replace("$instance", ".*");
            json!({"record": format!("dashboard:query_{i}"), "expr": e})
        })
        .collect();
    let dir = tempfile::tempdir().unwrap();
    let file = dir.path().join("rules.yml");
    let yaml = json!({"groups": [{"name": "dashboard", "rules": rules}]});
    std::fs::write(&file, yaml.to_string()).unwrap();
    let out = tokio::process::Command::new("promtool")
        .args(["check", "rules"])
        .arg(&file)
        .output()
        .await
        .expect("promtool (Debian's prometheus package; .ci/run installs it)");
    assert!(
        out.status.success(),
        "promtool check rules: {}{}",
        String::from_utf8_lossy(&out.stdout),
        String::from_utf8_lossy(&out.stderr)
    );

    // Every metric a query names is one a node exposes (a family shows in `/metrics` once it
    // has a sample) or one the metrics table of docs/operating.md promises.
    let gw = Gateway::start().await;
    traffic(&gw).await;
    let exposed = sample_names(&scrape(gw.node.addr).await);
    let docs = std::fs::read_to_string(
        std::path::PathBuf::from(env!("CARGO_MANIFEST_DIR")).join("../docs/operating.md"),
    )
    .unwrap();
    for e in &exprs {
        for word in e.split(|c: char| !(c.is_ascii_alphanumeric() || c == '_')) {
            let metric = ["switchyard_", "gen_ai_server_", "gen_ai_client_"];
            if !metric.iter().any(|p| word.starts_with(p)) {
                continue;
            }
            let family = word.trim_end_matches("_bucket");
            let documented = docs.contains(&format!("| `{family}` |"));
            assert!(
                exposed.contains(word) || documented,
                "the dashboard queries {word}, which a node neither exposes nor documents: {e}"
            );
        }
    }
    assert!(exposed.contains("switchyard_upstream_attempts_total"), "{exposed:?}");
}

#[tokio::test]
async fn the_control_plane_exports_webhook_delivery_metrics_per_subscription_never_its_url() {
    let gw = Gateway::start().await;
    // 204 to `/up…`, 503 to anything else.
    let receiver = switchyard_e2e::http_receiver(|path, _| {
        if path.starts_with("/up") {
            b"HTTP/1.1 204 No Content\r\ncontent-length: 0\r\n\r\n"
        } else {
            b"HTTP/1.1 503 Service Unavailable\r\ncontent-length: 0\r\n\r\n"
        }
    })
    .await;
    // A token in the URL, as some receivers take it: it must not reach the metrics.
    for name in ["up", "down"] {
        let url = format!("http://{receiver}/{name}?token=url-secret-0123");
        let args = ["webhooks", "add", name, "--url", &url, "--events", "*", "--internal"];
        let out = gw.admin(&args).await;
        assert!(out.success, "webhooks add {name}: {}", out.stderr);
    }
    // Two failover events (one served by the fallback, one that failed on every model).
    traffic(&gw).await;
    let series = |name: &str, labels: &str| format!("switchyard_webhook_{name}{{{labels}}}");
    let m = eventually(Duration::from_secs(20), "both subscriptions' deliveries counted", || {
        let series = &series;
        async move {
            let m = scrape(gw.cp.addr).await;
            let delivered =
                series("delivery_attempts_total", r#"webhook="up",outcome="delivered""#);
            let failed = series("delivery_attempts_total", r#"webhook="down",outcome="failed""#);
            let settled = sample(&m, &delivered)? >= 2.0
                && sample(&m, &failed)? >= 1.0
                && sample(&m, &series("queue_depth", r#"webhook="up""#))? == 0.0
                && sample(&m, &series("queue_depth", r#"webhook="down""#))? == 2.0;
            settled.then_some(m)
        }
    })
    .await;
    let refused = series("delivery_attempts_total", r#"webhook="up",outcome="refused""#);
    assert_eq!(sample(&m, &refused), Some(0.0), "{m}");
    let timed = series("delivery_duration_seconds_count", r#"webhook="down""#);
    assert!(sample(&m, &timed).is_some_and(|n| n >= 1.0), "{m}");
    assert_eq!(sample(&m, &series("dead_letters_total", r#"webhook="down""#)), Some(0.0), "{m}");
    assert!(!m.contains("url-secret-0123"), "a URL's token in the metrics: {m}");
    assert!(!m.contains(&receiver.to_string()), "a URL in the metrics: {m}");
    let (ok, said) = promtool(&m).await;
    assert!(ok, "promtool on the control plane's /metrics: {said}\n{m}");
}

/// The metric names a PromQL expression reads (those of Switchyard and the GenAI
/// conventions).
fn metric_words(expr: &str) -> Vec<&str> {
    let prefixes = ["switchyard_", "gen_ai_server_", "gen_ai_client_"];
    expr.split(|c: char| !(c.is_ascii_alphanumeric() || c == '_'))
        .filter(|w| prefixes.iter().any(|p| w.starts_with(p)))
        .collect()
}

#[tokio::test]
async fn every_alert_reads_metrics_a_node_or_control_plane_exposes_or_the_docs_promise() {
    let path = std::path::PathBuf::from(env!("CARGO_MANIFEST_DIR"))
        .join("../deploy/prometheus/alerts.yaml");
    let rules: serde_yaml_ng::Value =
        serde_yaml_ng::from_str(&std::fs::read_to_string(&path).unwrap()).unwrap();
    let exprs: Vec<(String, String)> = rules["groups"]
        .as_sequence()
        .unwrap()
        .iter()
        .flat_map(|g| g["rules"].as_sequence().unwrap().iter())
        .map(|r| (r["alert"].as_str().unwrap().to_owned(), r["expr"].as_str().unwrap().to_owned()))
        .collect();
    assert_eq!(exprs.len(), 9, "{exprs:?}");

    let gw = Gateway::start().await;
    traffic(&gw).await;
    let mut exposed = sample_names(&scrape(gw.node.addr).await);
    exposed.extend(sample_names(&scrape(gw.cp.addr).await));
    // What every node and control plane shows from its start, TLS or not, traffic or not.
    for always in [
        "switchyard_config_version",
        "switchyard_config_stream_connected",
        "switchyard_config_rejected_version",
        "switchyard_failover_events_dropped_total",
        "switchyard_control_config_change_revision",
    ] {
        assert!(exposed.contains(always), "{always} is not exposed: {exposed:?}");
    }
    let docs = std::fs::read_to_string(
        std::path::PathBuf::from(env!("CARGO_MANIFEST_DIR")).join("../docs/operating.md"),
    )
    .unwrap();
    for (alert, expr) in &exprs {
        for word in metric_words(expr) {
            // A family shows in `/metrics` once it has a sample: the certificates' only with
            // TLS, the budgets' only for keys with one.
            let family = word.trim_end_matches("_count");
            let documented = docs.contains(&format!("| `{family}` |"))
                || docs.contains(&format!("| `{word}` |"));
            assert!(
                exposed.contains(word) || documented,
                "{alert} reads {word}, which neither a node nor a control plane exposes nor the docs document"
            );
        }
        // Every alert has its runbook section.
        assert!(
            docs.contains(&format!("#### {alert}")),
            "no runbook for {alert} in docs/operating.md"
        );
    }
}

#[tokio::test]
async fn a_node_shows_its_config_stream_and_its_version_reaches_the_newest_change() {
    let gw = Gateway::start().await;
    eventually(Duration::from_secs(10), "the node up to date with the newest change", || async {
        let node = scrape(gw.node.addr).await;
        let control = scrape(gw.cp.addr).await;
        let newest = sample(&control, "switchyard_control_config_change_revision")?;
        let applied = sample(&node, "switchyard_config_version")?;
        (newest > 0.0
            && applied >= newest
            && sample(&node, "switchyard_config_stream_connected") == Some(1.0)
            && sample(&node, "switchyard_config_rejected_version") == Some(0.0))
        .then_some(())
    })
    .await;

    gw.cp.kill().await;
    eventually(Duration::from_secs(15), "the node to show its stream closed", || async {
        let node = scrape(gw.node.addr).await;
        (sample(&node, "switchyard_config_stream_connected") == Some(0.0)).then_some(())
    })
    .await;
}

/// The alerts Prometheus has now (`/api/v1/alerts`): (alert name, state, labels).
async fn prometheus_alerts(
    prometheus: SocketAddr,
) -> Option<Vec<(String, String, serde_json::Value)>> {
    let response = http_get(prometheus, "/api/v1/alerts", None).await?;
    let alerts = response.json()["data"]["alerts"].as_array()?.clone();
    Some(
        alerts
            .into_iter()
            .map(|a| {
                let name = a["labels"]["alertname"].as_str().unwrap_or_default().to_owned();
                let state = a["state"].as_str().unwrap_or_default().to_owned();
                (name, state, a["labels"].clone())
            })
            .collect(),
    )
}

/// The `label` of each alert named `name` in `state`, sorted.
fn alerting(
    alerts: &[(String, String, serde_json::Value)],
    name: &str,
    state: &str,
    label: &str,
) -> Vec<String> {
    let mut values: Vec<String> = alerts
        .iter()
        .filter(|(n, s, _)| n == name && s == state)
        .map(|(_, _, labels)| labels[label].as_str().unwrap_or_default().to_owned())
        .collect();
    values.sort();
    values
}

#[tokio::test]
async fn a_real_prometheus_raises_the_alerts_from_a_live_node_and_control_plane() {
    // alerts_test.yaml feeds the rules series written by hand; here Prometheus (the server of
    // Debian's `prometheus` package, beside promtool) scrapes the processes every second and
    // evaluates deploy/prometheus/alerts.yaml as shipped, so a query that does not match the
    // labels the processes really write shows up.
    let gw = Gateway::start_with(GatewayOptions {
        // Two failed calls open a breaker, so that the traffic below opens some.
        breaker_policy: "breaker_policy: {window_size: 2, min_requests: 2, cooldown_ms: 60000}\n",
        ..GatewayOptions::default()
    })
    .await;
    let rules = std::path::PathBuf::from(env!("CARGO_MANIFEST_DIR"))
        .join("../deploy/prometheus/alerts.yaml")
        .canonicalize()
        .unwrap();
    let dir = gw.dir.path().join("prometheus");
    std::fs::create_dir_all(&dir).unwrap();
    let config = dir.join("prometheus.yml");
    std::fs::write(
        &config,
        format!(
            "global: {{scrape_interval: 1s, evaluation_interval: 1s}}\n\
             rule_files: ['{}']\n\
             scrape_configs:\n  - job_name: switchyard\n    static_configs: [{{targets: ['{}', '{}']}}]\n",
            rules.display(),
            gw.node.addr,
            gw.cp.addr
        ),
    )
    .unwrap();
    let port = ReservedPort::new();
    let log = dir.join("prometheus.log");
    let _prometheus = tokio::process::Command::new("prometheus")
        .arg(format!("--config.file={}", config.display()))
        .arg(format!("--storage.tsdb.path={}", dir.join("data").display()))
        .arg(format!("--web.listen-address={}", port.addr()))
        .stdin(std::process::Stdio::null())
        .stdout(std::process::Stdio::null())
        .stderr(std::fs::File::create(&log).unwrap())
        .kill_on_drop(true)
        .spawn()
        .expect("prometheus (Debian's prometheus package; .ci/run installs it)");
    let prometheus = port.addr();
    let log_text = || std::fs::read_to_string(&log).unwrap_or_default();

    // A counter's first sample is no increase: the series exist, and are scraped, before the
    // traffic that the rates see.
    traffic(&gw).await;
    eventually(PATIENCE, "Prometheus to scrape the node's failovers", || async {
        let r =
            http_get(prometheus, "/api/v1/query?query=switchyard_failovers_total", None).await?;
        (!r.json()["data"]["result"].as_array()?.is_empty()).then_some(())
    })
    .await;
    traffic(&gw).await;
    // The failover-ratio alert pages only for a model asked for at least 3 times a minute
    // (15 requests in its 5-minute window): primary is sent twice that many, tertiary's two
    // requests stay under the floor.
    for _ in 0..30 {
        let r = gw
            .chat(json!({"model": PRIMARY, "fallback_models": [SECONDARY], "messages": [{"role": "user", "content": "hi"}]}))
            .await;
        assert_eq!(r.status, 200, "{}", r.body);
    }
    let open: Vec<String> = scrape(gw.node.addr)
        .await
        .lines()
        .filter_map(|l| l.strip_prefix("switchyard_breaker_state{")?.split_once("} "))
        .filter(|(_, value)| value.parse::<f64>().is_ok_and(|v| v > 0.0))
        .filter_map(|(labels, _)| {
            let model = labels.split("upstream_model=\"").nth(1)?.split('"').next()?;
            Some(model.to_owned())
        })
        .collect();
    assert!(open.iter().any(|m| m == "primary"), "primary's breaker is not open: {open:?}");

    // The failover ratio and the open breakers wait out their `for` (pending); answers no
    // model gave page at once (firing). Everything else stays silent on a healthy fleet.
    let alerts = eventually(PATIENCE, "the failover, breaker and all-failed alerts", || async {
        let alerts = prometheus_alerts(prometheus).await?;
        let ratio = alerting(&alerts, "SwitchyardFailoverRatioHigh", "pending", "model");
        let failed = alerting(&alerts, "SwitchyardAllModelsFailed", "firing", "model");
        let breakers = alerting(&alerts, "SwitchyardBreakerOpen", "pending", "upstream_model");
        (ratio == [PRIMARY] && failed == [TERTIARY] && breakers.len() == open.len())
            .then_some(alerts)
    })
    .await;
    let mut breakers = alerting(&alerts, "SwitchyardBreakerOpen", "pending", "upstream_model");
    let mut expected = open.clone();
    breakers.sort();
    expected.sort();
    assert_eq!(breakers, expected, "{alerts:?}");
    let names: std::collections::BTreeSet<&str> =
        alerts.iter().map(|(name, _, _)| name.as_str()).collect();
    assert_eq!(
        names,
        ["SwitchyardAllModelsFailed", "SwitchyardBreakerOpen", "SwitchyardFailoverRatioHigh"]
            .into(),
        "{alerts:?}\n{}",
        log_text()
    );

    // Without its control plane, the node's stream closes.
    gw.cp.kill().await;
    let node = gw.node.addr.to_string();
    eventually(PATIENCE, "the node's control-plane alert", || async {
        let alerts = prometheus_alerts(prometheus).await?;
        let cut_off = alerting(&alerts, "SwitchyardControlPlaneUnreachable", "pending", "instance");
        (cut_off == [node.as_str()]).then_some(())
    })
    .await;
}
