//! OpenTelemetry traces and log records (docs/operating.md, "Traces and log records"), from
//! real control plane, node and simulator processes to an OTLP collector in the test, over
//! OTLP/HTTP (the default) and over gRPC: one failover request is one SERVER span and two
//! CLIENT spans in the client's trace, with the GenAI attributes and the failover reason, the
//! upstream sees each call's own span as its `traceparent`, and the failover event arrives as
//! a log record in the same trace. Each signal can go to its own endpoint in its own protocol,
//! with the configured headers. A bad endpoint, protocol, header list or timeout stops the
//! process; a collector that is down, never answers or speaks the other protocol costs
//! requests nothing and the drops are counted.
#![allow(clippy::unwrap_used, clippy::expect_used)]

use std::time::{Duration, Instant};

use serde_json::json;
use switchyard_e2e::gateway::*;
use switchyard_e2e::otlp::*;
use switchyard_e2e::{eventually, http_get, switchyard_bin};

fn msg() -> serde_json::Value {
    json!([{"role": "user", "content": "hello there"}])
}

/// Exports every 50 ms instead of the specification's seconds, so a test waits little.
/// No protocol: the default, OTLP/HTTP.
fn otel_env(endpoint: String) -> Vec<(&'static str, String)> {
    vec![
        ("OTEL_EXPORTER_OTLP_ENDPOINT", endpoint),
        ("OTEL_BSP_SCHEDULE_DELAY", "50".into()),
        ("OTEL_BLRP_SCHEDULE_DELAY", "50".into()),
    ]
}

/// [`otel_env`] for `collector`, naming its protocol only when it is not the default.
fn collector_env(collector: &Collector) -> Vec<(&'static str, String)> {
    let mut env = otel_env(collector.endpoint());
    if collector.protocol == Protocol::Grpc {
        env.push(("OTEL_EXPORTER_OTLP_PROTOCOL", "grpc".into()));
    }
    env
}

/// A fresh id of `hex_len` hex digits (at most 32), never all zeros: the clock's
/// nanoseconds and the process id.
fn fresh_id(hex_len: usize) -> String {
    let nanos = std::time::SystemTime::now().duration_since(std::time::UNIX_EPOCH).unwrap();
    let id = format!("{:032x}", nanos.as_nanos() | (u128::from(std::process::id()) << 96) | 1);
    id[32 - hex_len..].to_owned()
}

#[tokio::test]
async fn over_http_protobuf_the_default_a_failover_request_is_three_spans_with_the_genai_attributes_and_a_log_record()
 {
    let collector = Collector::start_http().await;
    let gw = failover_is_exported(&collector).await;
    // Each signal went to its own path of the endpoint, as protobuf.
    let paths: std::collections::BTreeSet<String> =
        collector.http_exports().into_iter().map(|e| e.path).collect();
    assert_eq!(paths, ["/v1/logs".to_owned(), "/v1/traces".to_owned()].into(), "{paths:?}");
    // The start-up line names the protocol, and that it is the default.
    let log = gw.node.log_text();
    let line = log.lines().find(|l| l.contains("OpenTelemetry export on")).unwrap_or_default();
    assert!(line.contains("http/protobuf") && line.contains("default"), "{log}");
    assert!(line.contains(&format!("http://{}/v1/", collector.addr)), "{line}");
}

#[tokio::test]
async fn over_grpc_a_failover_request_is_three_spans_with_the_genai_attributes_and_a_log_record() {
    let collector = Collector::start().await;
    let gw = failover_is_exported(&collector).await;
    let log = gw.node.log_text();
    let line = log.lines().find(|l| l.contains("OpenTelemetry export on")).unwrap_or_default();
    assert!(line.contains("grpc") && line.contains("OTEL_EXPORTER_OTLP_PROTOCOL"), "{log}");
}

/// One failover request through a gateway exporting to `collector`: one SERVER span and two
/// CLIENT spans in the client's trace with the GenAI attributes, the failover log record in
/// the same trace, and the control plane's admin spans.
async fn failover_is_exported(collector: &Collector) -> Gateway {
    let gw = Gateway::start_with(GatewayOptions {
        env: collector_env(collector),
        ..GatewayOptions::default()
    })
    .await;
    gw.script("primary", json!({"kind": "status", "status": 503})).await;

    let (trace_id, client_span_id) = (fresh_id(32), fresh_id(16));
    let traceparent = format!("00-{trace_id}-{client_span_id}-01");
    let r = gw
        .chat_with(
            &[("traceparent", traceparent.as_bytes())],
            json!({"model": PRIMARY, "fallback_models": [SECONDARY], "messages": msg()}),
        )
        .await;
    assert_eq!(r.status, 200, "{}", r.body);
    assert_eq!(r.json()["model"], SECONDARY);

    let in_trace = |spans: Vec<(String, OtlpSpan)>| {
        spans.into_iter().filter(|(_, s)| hex(&s.trace_id) == trace_id).collect::<Vec<_>>()
    };
    let spans = eventually(Duration::from_secs(20), "the request's three spans", || {
        let spans = in_trace(collector.spans());
        async move { (spans.len() >= 3).then_some(spans) }
    })
    .await;
    let of_kind = |kind: SpanKind| {
        spans.iter().filter(move |(_, s)| s.kind == kind as i32).map(|(service, s)| (service, s))
    };
    let servers: Vec<_> = of_kind(SpanKind::Server).collect();
    let mut clients: Vec<_> = of_kind(SpanKind::Client).map(|(_, s)| s).collect();
    assert_eq!((servers.len(), clients.len(), spans.len()), (1, 2, 3), "{spans:#?}");
    let (service, server) = servers[0];
    assert_eq!(service, "switchyard-node");

    // The server span continues the client's trace, under the client's span.
    assert_eq!(hex(&server.parent_span_id), client_span_id);
    assert_eq!(server.name, format!("chat {PRIMARY}"));
    let a = &server.attributes;
    assert_eq!(str_attr(a, "gen_ai.operation.name").as_deref(), Some("chat"));
    assert_eq!(str_attr(a, "gen_ai.request.model").as_deref(), Some(PRIMARY));
    assert_eq!(str_attr(a, "gen_ai.response.model").as_deref(), Some(SECONDARY));
    assert_eq!(str_attr(a, "gen_ai.provider.name").as_deref(), Some("openai"));
    assert_eq!(int_attr(a, "http.response.status_code"), Some(200));
    assert_eq!(bool_attr(a, "switchyard.failover.occurred"), Some(true));
    assert_eq!(str_attr(a, "switchyard.key.id").as_deref(), Some(gw.key_id.as_str()));
    let (input, output) =
        (int_attr(a, "gen_ai.usage.input_tokens"), int_attr(a, "gen_ai.usage.output_tokens"));
    assert!(input.unwrap() > 0 && output.unwrap() > 0, "{a:?}");
    assert_eq!(strings_attr(a, "gen_ai.response.finish_reasons"), Some(vec!["stop".into()]));

    // Each upstream call is a client span under the server span, in chain order.
    clients.sort_by_key(|s| int_attr(&s.attributes, "switchyard.attempt.index"));
    let sim_port = i64::from(gw.sim.addr.port());
    for (index, (client, upstream)) in clients.iter().zip(["primary", "secondary"]).enumerate() {
        let a = &client.attributes;
        assert_eq!(client.parent_span_id, server.span_id, "{upstream}");
        assert_eq!(client.name, format!("chat {upstream}"));
        assert_eq!(int_attr(a, "switchyard.attempt.index"), Some(index as i64));
        assert_eq!(str_attr(a, "gen_ai.operation.name").as_deref(), Some("chat"));
        assert_eq!(str_attr(a, "gen_ai.request.model").as_deref(), Some(upstream));
        assert_eq!(str_attr(a, "gen_ai.provider.name").as_deref(), Some("openai"));
        assert_eq!(str_attr(a, "server.address").as_deref(), Some("127.0.0.1"));
        assert_eq!(int_attr(a, "server.port"), Some(sim_port));
        // The upstream got this call's own span as its parent.
        let sent = gw.last_upstream_request(upstream).await;
        let expected = format!("00-{trace_id}-{}-01", hex(&client.span_id));
        assert_eq!(sent["headers"]["traceparent"], json!(expected), "{upstream}");
    }
    let (failed, served) = (&clients[0].attributes, &clients[1].attributes);
    assert_eq!(str_attr(failed, "error.type").as_deref(), Some("server_error"));
    assert_eq!(str_attr(failed, "switchyard.failover.reason").as_deref(), Some("server_error"));
    let error = SpanStatusCode::Error as i32;
    assert_eq!(clients[0].status.as_ref().map(|s| s.code), Some(error));
    assert_eq!(str_attr(served, "error.type"), None);
    assert_eq!(str_attr(served, "gen_ai.response.model").as_deref(), Some("secondary"));
    assert_eq!(int_attr(served, "gen_ai.usage.input_tokens"), input);
    assert_eq!(strings_attr(served, "gen_ai.response.finish_reasons"), Some(vec!["stop".into()]));

    // The failover event, as a log record in the request's trace.
    let (service, record) = eventually(Duration::from_secs(20), "the failover log record", || {
        let found = collector
            .logs()
            .into_iter()
            .find(|(_, l)| l.event_name == "api:model_failover" && hex(&l.trace_id) == trace_id);
        async move { found }
    })
    .await;
    assert_eq!(service, "switchyard-node");
    assert_eq!(record.span_id, server.span_id, "emitted inside the server span");
    let a = &record.attributes;
    assert_eq!(str_attr(a, "switchyard.failover.reason").as_deref(), Some("server_error"));
    assert_eq!(str_attr(a, "gen_ai.request.model").as_deref(), Some(PRIMARY));
    assert_eq!(str_attr(a, "gen_ai.response.model").as_deref(), Some(SECONDARY));
    assert_eq!(str_attr(a, "switchyard.key.id").as_deref(), Some(gw.key_id.as_str()));
    assert_eq!(str_attr(a, "switchyard.request_id"), r.header("x-request-id"));
    assert_eq!(int_attr(a, "http.response.status_code"), Some(200));

    // The control plane's admin calls (the harness applied a catalog and created a key).
    eventually(Duration::from_secs(20), "the control plane's ApplyCatalog span", || {
        let found = collector.spans().into_iter().any(|(service, s)| {
            service == "switchyard-control"
                && s.kind == SpanKind::Server as i32
                && s.name == "switchyard.admin.v1.Admin/ApplyCatalog"
                && str_attr(&s.attributes, "rpc.system").as_deref() == Some("grpc")
        });
        async move { found.then_some(()) }
    })
    .await;
    gw
}

#[tokio::test]
async fn each_signal_goes_to_its_own_endpoint_in_its_own_protocol_with_the_headers() {
    let http = Collector::start_http().await;
    let grpc = Collector::start().await;
    let env = vec![
        // A signal's own endpoint is used as it is: no `/v1/traces` appended.
        ("OTEL_EXPORTER_OTLP_TRACES_ENDPOINT", format!("http://{}/custom/traces", http.addr)),
        ("OTEL_EXPORTER_OTLP_LOGS_ENDPOINT", grpc.endpoint()),
        ("OTEL_EXPORTER_OTLP_LOGS_PROTOCOL", "grpc".into()),
        // Percent-encoded, as the specification's list format has it.
        ("OTEL_EXPORTER_OTLP_HEADERS", "x-api-key=s3cr%3Dt%2C1, x-tenant=blue".into()),
        ("OTEL_BSP_SCHEDULE_DELAY", "50".into()),
        ("OTEL_BLRP_SCHEDULE_DELAY", "50".into()),
    ];
    let gw = Gateway::start_with(GatewayOptions { env, ..GatewayOptions::default() }).await;
    gw.script("primary", json!({"kind": "status", "status": 503})).await;
    let r =
        gw.chat(json!({"model": PRIMARY, "fallback_models": [SECONDARY], "messages": msg()})).await;
    assert_eq!(r.status, 200, "{}", r.body);

    let node_spans = || {
        let spans = http.spans().into_iter().filter(|(s, _)| s == "switchyard-node").count();
        async move { (spans >= 3).then_some(spans) }
    };
    eventually(Duration::from_secs(20), "the node's spans over OTLP/HTTP", node_spans).await;
    eventually(Duration::from_secs(20), "the failover log record over gRPC", || {
        let found = grpc.logs().into_iter().any(|(_, l)| l.event_name == "api:model_failover");
        async move { found.then_some(()) }
    })
    .await;
    assert!(http.logs().is_empty(), "log records go to their own endpoint only");
    assert!(grpc.spans().is_empty(), "spans go to their own endpoint only");
    let exports = http.http_exports();
    for export in &exports {
        assert_eq!(export.path, "/custom/traces");
        let header = |name| export.headers.get(name).and_then(|v| v.to_str().ok());
        assert_eq!(header("x-api-key"), Some("s3cr=t,1"), "percent-decoded");
        assert_eq!(header("x-tenant"), Some("blue"));
        assert_eq!(header("content-type"), Some("application/x-protobuf"));
    }
    // The start-up lines name the headers, never their values.
    let log = gw.node.log_text();
    assert!(log.contains("x-api-key,x-tenant"), "{log}");
    assert!(!log.contains("s3cr"), "{log}");
}

#[tokio::test]
async fn a_bad_otlp_variable_stops_the_process_naming_the_variable() {
    let cases: &[(&str, &str)] = &[
        ("OTEL_EXPORTER_OTLP_ENDPOINT", "collector:4317 please"),
        ("OTEL_EXPORTER_OTLP_PROTOCOL", "http/json"),
        ("OTEL_EXPORTER_OTLP_TRACES_PROTOCOL", "grcp"),
        ("OTEL_EXPORTER_OTLP_HEADERS", "authorization=Bearer%2secret"),
        ("OTEL_EXPORTER_OTLP_LOGS_HEADERS", "just-a-secret"),
        ("OTEL_EXPORTER_OTLP_TIMEOUT", "10s"),
        ("OTEL_EXPORTER_OTLP_TRACES_TIMEOUT", "soon"),
        // gRPC export has no TLS: an https collector is refused rather than never reached.
        ("OTEL_EXPORTER_OTLP_PROTOCOL", "grpc"),
    ];
    for &(var, value) in cases {
        for command in [
            &["node", "--control", "http://127.0.0.1:9", "--listen", "127.0.0.1:0"][..],
            &["control", "--store", "file:///nonexistent-otel-test", "--listen", "127.0.0.1:0"][..],
        ] {
            let mut process = tokio::process::Command::new(switchyard_bin());
            process.args(command).env("SWITCHYARD_ADMIN_TOKEN", "0123456789abcdef0123");
            // The variable the error names: the endpoint's, for an https one over gRPC.
            let named = match (var, value) {
                ("OTEL_EXPORTER_OTLP_PROTOCOL", "grpc") => {
                    process.env("OTEL_EXPORTER_OTLP_ENDPOINT", "https://127.0.0.1:9");
                    "OTEL_EXPORTER_OTLP_ENDPOINT"
                }
                ("OTEL_EXPORTER_OTLP_ENDPOINT", _) => var,
                _ => {
                    process.env("OTEL_EXPORTER_OTLP_ENDPOINT", "http://127.0.0.1:9");
                    var
                }
            };
            let out = process.env(var, value).output().await.unwrap();
            let stderr = String::from_utf8_lossy(&out.stderr);
            assert!(!out.status.success(), "{var}={value} {command:?} started: {stderr}");
            assert!(stderr.contains(&format!("{named}: ")), "{var} {command:?}: {stderr}");
            assert!(!stderr.contains("secret"), "a header's value is never printed: {stderr}");
            assert!(String::from_utf8_lossy(&out.stdout).is_empty(), "nothing listened");
        }
    }
}

/// The sample of `series` (name and labels, as written) on `/metrics` at `addr`.
async fn sample_at(addr: std::net::SocketAddr, series: &str) -> Option<f64> {
    let metrics = http_get(addr, "/metrics", None).await?.body;
    metrics.lines().find_map(|l| l.strip_prefix(series)?.strip_prefix(' ')?.parse().ok())
}

async fn node_sample(gw: &Gateway, series: &str) -> Option<f64> {
    sample_at(gw.node.addr, series).await
}

/// `promtool check metrics` passes `/metrics` at `addr` (Debian's `prometheus` package;
/// `.ci/run` installs it).
async fn promtool_passes(addr: std::net::SocketAddr) {
    let text = http_get(addr, "/metrics", None).await.unwrap().body;
    let (ok, said) = switchyard_e2e::promtool(&text).await;
    assert!(ok, "promtool: {said}\n{text}");
}

#[tokio::test]
async fn with_the_collector_down_requests_are_served_and_the_failed_exports_counted() {
    // A port nothing listens on: every export is refused. Spans go out in batches of two
    // as soon as two wait, and otherwise only once a minute: after the first refusal the
    // span exporter stays paused for the rest of the test.
    let closed = std::net::TcpListener::bind("127.0.0.1:0").unwrap().local_addr().unwrap();
    let mut env = otel_env(format!("http://{closed}"));
    env.push(("OTEL_BSP_MAX_EXPORT_BATCH_SIZE", "2".into()));
    env.push(("OTEL_BSP_SCHEDULE_DELAY", "60000".into()));
    let gw = Gateway::start_with(GatewayOptions { env, ..GatewayOptions::default() }).await;
    gw.script("primary", json!({"kind": "status", "status": 503})).await;
    for _ in 0..3 {
        let r = gw
            .chat(json!({"model": PRIMARY, "fallback_models": [SECONDARY], "messages": msg()}))
            .await;
        assert_eq!(r.status, 200, "{}", r.body);
    }
    for signal in ["spans", "logs"] {
        let series =
            format!(r#"switchyard_otel_dropped_total{{signal="{signal}",reason="export_failed"}}"#);
        eventually(Duration::from_secs(20), &format!("{series} to count"), || {
            let series = series.clone();
            let gw = &gw;
            async move { node_sample(gw, &series).await.filter(|n| *n > 0.0) }
        })
        .await;
    }
    // Refused, the exporter waits before it tries again (1 s, doubling, and here until its
    // next wake a minute on), and meanwhile the node makes no spans: each request's server
    // and client span is counted as not made, when the request is served.
    let down = r#"switchyard_otel_dropped_total{signal="spans",reason="collector_down"}"#;
    let before = node_sample(&gw, down).await.unwrap_or(0.0);
    for _ in 0..10 {
        let r = gw.chat(json!({"model": SECONDARY, "messages": msg()})).await;
        assert_eq!(r.status, 200, "{}", r.body);
    }
    let not_made = node_sample(&gw, down).await.unwrap_or(0.0) - before;
    assert_eq!(not_made, 20.0, "ten requests' server and client spans, counted as not made");
    // The control plane's admin calls (the harness's catalog and key) were spans too.
    let series = r#"switchyard_control_otel_dropped_total{signal="spans",reason="export_failed"}"#;
    eventually(Duration::from_secs(20), "the control plane to count its failed exports", || {
        let addr = gw.cp.addr;
        async move { sample_at(addr, series).await.filter(|n| *n > 0.0) }
    })
    .await;
    promtool_passes(gw.node.addr).await;
    promtool_passes(gw.cp.addr).await;
}

#[tokio::test]
async fn a_grpc_collector_named_without_a_protocol_gets_nothing_the_requests_are_served_and_the_failures_counted()
 {
    // A deployment written when gRPC was the default: the endpoint is the collector's gRPC
    // listener and no protocol is set, so the node now speaks OTLP/HTTP to it.
    spoken_to_in_the_wrong_protocol(Collector::start().await, None).await;
}

#[tokio::test]
async fn an_http_collector_spoken_to_over_grpc_gets_nothing_the_requests_are_served_and_the_failures_counted()
 {
    spoken_to_in_the_wrong_protocol(Collector::start_http().await, Some("grpc")).await;
}

#[tokio::test]
async fn an_endpoint_on_the_other_protocols_port_is_warned_about_at_start_naming_the_variable() {
    // Only the start-up lines are read: whether anything listens on these ports is no matter.
    for (endpoint, protocol, suggested) in [
        ("http://127.0.0.1:4317", None, "OTEL_EXPORTER_OTLP_PROTOCOL=grpc"),
        ("http://127.0.0.1:4318", Some("grpc"), "OTEL_EXPORTER_OTLP_PROTOCOL=http/protobuf"),
    ] {
        let mut env = otel_env(endpoint.into());
        if let Some(protocol) = protocol {
            env.push(("OTEL_EXPORTER_OTLP_PROTOCOL", protocol.into()));
        }
        let gw = Gateway::start_with(GatewayOptions { env, ..GatewayOptions::default() }).await;
        for (process, log) in [("node", gw.node.log_text()), ("control", gw.cp.log_text())] {
            let warned: Vec<&str> =
                log.lines().filter(|l| l.contains("WARN") && l.contains(suggested)).collect();
            // One warning per signal the process exports.
            assert_eq!(warned.len(), 2, "{process} {endpoint}: {log}");
        }
    }
}

/// A collector that does not speak the protocol the node exports in: every request is
/// served, the collector receives nothing, each signal's failed exports are counted on
/// `/metrics`, and the log says export fails.
async fn spoken_to_in_the_wrong_protocol(collector: Collector, protocol: Option<&str>) {
    let mut env = otel_env(collector.endpoint());
    if let Some(protocol) = protocol {
        env.push(("OTEL_EXPORTER_OTLP_PROTOCOL", protocol.into()));
    }
    let gw = Gateway::start_with(GatewayOptions { env, ..GatewayOptions::default() }).await;
    gw.script("primary", json!({"kind": "status", "status": 503})).await;
    let r =
        gw.chat(json!({"model": PRIMARY, "fallback_models": [SECONDARY], "messages": msg()})).await;
    assert_eq!(r.status, 200, "{}", r.body);
    for signal in ["spans", "logs"] {
        let series =
            format!(r#"switchyard_otel_dropped_total{{signal="{signal}",reason="export_failed"}}"#);
        eventually(Duration::from_secs(20), &format!("{series} to count"), || {
            let series = series.clone();
            let gw = &gw;
            async move { node_sample(gw, &series).await.filter(|n| *n > 0.0) }
        })
        .await;
    }
    assert!(collector.spans().is_empty(), "{:?}", collector.spans());
    assert!(collector.logs().is_empty(), "{:?}", collector.logs());
    let log = gw.node.log_text();
    assert!(log.contains("OpenTelemetry export failed"), "{log}");
    // The node keeps serving while its exports fail.
    let r = gw.chat(json!({"model": SECONDARY, "messages": msg()})).await;
    assert_eq!(r.status, 200, "{}", r.body);
}

#[tokio::test]
async fn with_a_collector_that_never_answers_requests_do_not_wait_and_the_full_queue_is_counted() {
    // Takes connections and never answers: the first export waits for the exporter's timeout
    // (a minute), and the queue of two fills behind it.
    let silent = tokio::net::TcpListener::bind("127.0.0.1:0").await.unwrap();
    let addr = silent.local_addr().unwrap();
    let holder = tokio::spawn(async move {
        let mut held = Vec::new();
        while let Ok((socket, _)) = silent.accept().await {
            held.push(socket);
        }
    });
    let mut env = otel_env(format!("http://{addr}"));
    env.push(("OTEL_BSP_MAX_QUEUE_SIZE", "2".into()));
    env.push(("OTEL_EXPORTER_OTLP_TIMEOUT", "60000".into()));
    let gw = Gateway::start_with(GatewayOptions { env, ..GatewayOptions::default() }).await;
    let started = Instant::now();
    for _ in 0..10 {
        let r = gw.chat(json!({"model": PRIMARY, "messages": msg()})).await;
        assert_eq!(r.status, 200, "{}", r.body);
    }
    // Ten requests to a simulator that answers at once, far from the export's minute. Wall
    // time (a real node), with a loaded machine's slack.
    assert!(started.elapsed() < Duration::from_secs(20), "{:?}", started.elapsed());
    let series = r#"switchyard_otel_dropped_total{signal="spans",reason="queue_full"}"#;
    let dropped = eventually(Duration::from_secs(20), "spans dropped on a full queue", || async {
        node_sample(&gw, series).await.filter(|n| *n > 0.0)
    })
    .await;
    // Twenty spans made (a server and a client span per request); at most two wait in the
    // queue and two more in the stuck export.
    assert!(dropped >= 16.0, "{dropped} dropped");
    holder.abort();
}

#[tokio::test]
async fn spans_and_log_records_still_queued_are_sent_over_grpc_when_the_node_stops() {
    queued_are_sent_at_stop(Protocol::Grpc).await;
}

#[tokio::test]
async fn spans_and_log_records_still_queued_are_sent_over_http_when_the_node_stops() {
    queued_are_sent_at_stop(Protocol::HttpProtobuf).await;
}

async fn queued_are_sent_at_stop(protocol: Protocol) {
    let collector = Collector::start_with(protocol).await;
    // Batches would wait an hour: only the stop can send them.
    let mut env = collector_env(&collector);
    env.retain(|(k, _)| !k.ends_with("_SCHEDULE_DELAY"));
    env.push(("OTEL_BSP_SCHEDULE_DELAY", "3600000".into()));
    env.push(("OTEL_BLRP_SCHEDULE_DELAY", "3600000".into()));
    let mut gw = Gateway::start_with(GatewayOptions { env, ..GatewayOptions::default() }).await;
    gw.script("primary", json!({"kind": "status", "status": 503})).await;
    let r =
        gw.chat(json!({"model": PRIMARY, "fallback_models": [SECONDARY], "messages": msg()})).await;
    assert_eq!(r.status, 200, "{}", r.body);
    let node_spans =
        || collector.spans().into_iter().filter(|(s, _)| s == "switchyard-node").count();
    assert_eq!(node_spans(), 0, "nothing is sent before a batch is due");

    let pid = gw.node.child.id().unwrap();
    let killed = std::process::Command::new("kill").args(["-TERM", &pid.to_string()]).status();
    assert!(killed.unwrap().success());
    let status = tokio::time::timeout(Duration::from_secs(30), gw.node.child.wait()).await;
    assert!(status.unwrap().unwrap().success(), "the node stops cleanly");
    assert_eq!(node_spans(), 3, "the server span and both client spans");
    let records = collector.logs();
    assert!(records.iter().any(|(_, l)| l.event_name == "api:model_failover"), "{records:?}");
}

#[tokio::test]
async fn a_messages_request_is_a_chat_operation_on_its_own_route_and_its_failover_record_names_the_surface()
 {
    let collector = Collector::start_http().await;
    let gw = Gateway::start_with(GatewayOptions {
        env: collector_env(&collector),
        ..GatewayOptions::default()
    })
    .await;
    gw.script("primary", json!({"kind": "status", "status": 503})).await;
    let trace_id = fresh_id(32);
    let traceparent = format!("00-{trace_id}-{}-01", fresh_id(16));
    let body = json!({"model": PRIMARY, "fallback_models": [SECONDARY], "max_tokens": 64,
                      "messages": [{"role": "user", "content": "hello there"}]})
    .to_string();
    let r = switchyard_e2e::http_request_with(
        gw.node.addr,
        "POST",
        "/v1/messages",
        Some(&gw.key),
        &[("traceparent", traceparent.as_bytes())],
        Some(body.as_bytes()),
    )
    .await
    .unwrap();
    assert_eq!(r.status, 200, "{}", r.body);
    assert_eq!(r.json()["type"], "message");

    let server = eventually(Duration::from_secs(20), "the request's server span", || {
        let found = collector
            .spans()
            .into_iter()
            .map(|(_, s)| s)
            .find(|s| hex(&s.trace_id) == trace_id && s.kind == SpanKind::Server as i32);
        async move { found }
    })
    .await;
    let a = &server.attributes;
    assert_eq!(server.name, format!("chat {PRIMARY}"));
    assert_eq!(str_attr(a, "gen_ai.operation.name").as_deref(), Some("chat"));
    assert_eq!(str_attr(a, "http.route").as_deref(), Some("/v1/messages"));
    assert_eq!(str_attr(a, "gen_ai.response.model").as_deref(), Some(SECONDARY));

    let (_, record) = eventually(Duration::from_secs(20), "the failover log record", || {
        let found = collector
            .logs()
            .into_iter()
            .find(|(_, l)| l.event_name == "api:model_failover" && hex(&l.trace_id) == trace_id);
        async move { found }
    })
    .await;
    assert_eq!(str_attr(&record.attributes, "switchyard.surface").as_deref(), Some("messages"));
}
