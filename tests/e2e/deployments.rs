//! Models served by several deployments (docs/catalog.md, "Deployments"): balancing, failover
//! between a model's deployments inside one attempt, session affinity, upstream concurrency
//! caps, and what `switchyard apply` refuses. Real control plane, node and simulated provider
//! processes on loopback; every deployment is the same simulator under its own upstream
//! model name, so the simulator's per-model counts tell the deployments apart.
#![allow(clippy::unwrap_used, clippy::expect_used, clippy::panic)]

use std::collections::BTreeMap;
use std::path::Path;
use std::time::Duration;

use serde_json::{Value, json};
use switchyard_e2e::gateway::*;
use switchyard_e2e::{HttpResponse, PATIENCE, cli, eventually, http_get, start_control};

/// A breaker that never opens on the few failures a test makes (so each request meets the
/// failing deployment first), and no open probes.
const NO_OPENING: &str = "breaker_policy:
  window_size: 1000
  min_requests: 1000
probe: {interval_ms: 0, open_interval_ms: 0}
";

/// A breaker that opens after two failures in a row and stays open for the whole test
/// (no open probes, a cool-down longer than any test).
const QUICK_OPENING: &str = "breaker_policy:
  window_size: 2
  min_requests: 2
  failure_rate_threshold: 1.0
  cooldown_ms: 600000
  max_cooldown_ms: 600000
probe: {interval_ms: 0, open_interval_ms: 0}
";

async fn gateway(models: &'static str, policy: &'static str) -> Gateway {
    Gateway::start_with(GatewayOptions { models, breaker_policy: policy, ..Default::default() })
        .await
}

/// Each attempt as (model, deployment, status, reason).
fn deployment_attempts(v: &Value) -> Vec<(String, String, String, String)> {
    attempt_objects(v)
        .iter()
        .map(|a| {
            let s = |k: &str| a[k].as_str().unwrap_or_default().to_owned();
            (s("model"), s("deployment"), s("status"), s("reason"))
        })
        .collect()
}

fn quad(
    model: &str,
    deployment: &str,
    status: &str,
    reason: &str,
) -> (String, String, String, String) {
    (model.to_owned(), deployment.to_owned(), status.to_owned(), reason.to_owned())
}

/// Sends `body` with `headers`, asserts a 200, and returns the response.
async fn served(gw: &Gateway, headers: &[(&str, &[u8])], body: Value) -> HttpResponse {
    let r = gw.chat_with(headers, body).await;
    assert_eq!(r.status, 200, "{}", r.body);
    r
}

/// The deployment that served a response, by its `x-served-deployment` header; checked
/// against the report's served attempt when the answer has a report (a chain of more than
/// one model).
fn served_deployment(r: &HttpResponse) -> String {
    let header = r
        .header("x-served-deployment")
        .unwrap_or_else(|| panic!("no x-served-deployment header: {}", r.headers));
    let v = r.json();
    let served: Vec<String> = attempt_objects(&v)
        .iter()
        .filter(|a| a["status"] == "served")
        .map(|a| a["deployment"].as_str().unwrap_or_default().to_owned())
        .collect();
    if v.get("secureai").is_some() {
        assert_eq!(
            served,
            std::slice::from_ref(&header),
            "the header names the served attempt's deployment: {v}"
        );
    }
    header
}

async fn metrics(gw: &Gateway) -> String {
    http_get(gw.node.addr, "/metrics", None).await.unwrap().body
}

// === Balancing ===

const WEIGHTED: &str = "  - name: dep/weighted
    deployments:
      - {provider: sim-us, upstream_model: dep-east, weight: 3, region: us}
      - {provider: sim-eu, upstream_model: dep-west}
";

#[tokio::test]
async fn weights_share_the_requests_between_deployments() {
    let gw = gateway(WEIGHTED, "").await;
    let mut by_header: BTreeMap<String, u32> = BTreeMap::new();
    for _ in 0..400 {
        let r = served(&gw, &[], body("dep/weighted")).await;
        assert_eq!(r.json()["model"], "dep/weighted", "{}", r.body);
        *by_header.entry(served_deployment(&r)).or_default() += 1;
    }
    let east = gw.upstream_requests("dep-east").await;
    let west = gw.upstream_requests("dep-west").await;
    assert_eq!(east + west, 400, "one upstream call per request: east {east}, west {west}");
    let expected: BTreeMap<String, u32> =
        [("sim-us/dep-east".to_owned(), east as u32), ("sim-eu/dep-west".to_owned(), west as u32)]
            .into_iter()
            .filter(|(_, n)| *n > 0)
            .collect();
    assert_eq!(by_header, expected, "the headers name the deployments the simulator saw");
    let east_pct = east as f64 / 4.0;
    assert!(
        (70.0..=80.0).contains(&east_pct),
        "weight 3 of 4 got {east_pct} % (east {east}, west {west})"
    );
}

const LEAST_LATENCY: &str = "  - name: dep/fastest
    deployments:
      - {provider: sim-us, upstream_model: dep-quick}
      - {provider: sim-us, upstream_model: dep-sluggish}
    balance: least_latency
";

#[tokio::test]
async fn least_latency_sends_little_to_a_deployment_five_times_slower() {
    let gw = gateway(LEAST_LATENCY, "").await;
    gw.script("dep-quick", json!({"kind": "ok", "delay_ms": 40})).await;
    gw.script("dep-sluggish", json!({"kind": "ok", "delay_ms": 200})).await;
    for _ in 0..100 {
        served(&gw, &[], body("dep/fastest")).await;
    }
    let quick = gw.upstream_requests("dep-quick").await;
    let sluggish = gw.upstream_requests("dep-sluggish").await;
    assert_eq!(quick + sluggish, 100);
    assert!(sluggish < 10, "the slow deployment got {sluggish} of 100 (the quick one {quick})");
}

// === Failover between deployments ===

const FAILING_DEPLOYMENT: &str = "  - name: dep/two
    deployments:
      - {provider: sim-us, upstream_model: dep-broken}
      - {provider: sim-us, upstream_model: dep-sound}
";

#[tokio::test]
async fn a_failing_deployment_is_covered_by_the_models_other_deployment_in_the_same_attempt() {
    let gw = gateway(FAILING_DEPLOYMENT, NO_OPENING).await;
    gw.script("dep-broken", json!({"kind": "status", "status": 503})).await;
    let chain = json!({"models": ["dep/two", SECONDARY],
        "messages": [{"role": "user", "content": "hello"}]});
    // Balancing picks either deployment first: requests until one met the broken one.
    let mut covered = None;
    for _ in 0..30 {
        let r = served(&gw, &[], chain.clone()).await;
        assert_eq!(served_deployment(&r), "sim-us/dep-sound");
        let v = r.json();
        assert_eq!(v["model"], "dep/two", "{v}");
        if gw.upstream_requests("dep-broken").await > 0 {
            covered = Some(v);
            break;
        }
        assert_eq!(
            deployment_attempts(&v),
            [quad("dep/two", "sim-us/dep-sound", "served", "")],
            "{v}"
        );
    }
    let v = covered.expect("30 requests never met the broken deployment first");
    assert_eq!(
        deployment_attempts(&v),
        [
            quad("dep/two", "sim-us/dep-broken", "failed", "server_error"),
            quad("dep/two", "sim-us/dep-sound", "served", ""),
        ],
        "{v}"
    );
    assert_eq!(
        gw.upstream_requests("secondary").await,
        0,
        "the chain's second model is never called"
    );
    // A model without deployments reports none.
    let r = served(
        &gw,
        &[],
        json!({"models": [PRIMARY, SECONDARY], "messages": [{"role": "user", "content": "hello"}]}),
    )
    .await;
    assert!(r.header("x-served-deployment").is_none(), "{}", r.headers);
    let v = r.json();
    let reported = attempt_objects(&v);
    assert!(!reported.is_empty() && reported.iter().all(|a| a.get("deployment").is_none()), "{v}");
    let m = metrics(&gw).await;
    assert!(
        m.contains(
            "switchyard_deployment_attempts_total{model=\"dep/two\",deployment=\"sim-us/dep-broken\",status=\"failed\",reason=\"server_error\"} 1"
        ),
        "{m}"
    );
}

// === Session affinity ===

const STICKY: &str = "  - name: dep/sticky
    deployments:
      - {provider: sim-us, upstream_model: dep-a}
      - {provider: sim-us, upstream_model: dep-b}
      - {provider: sim-us, upstream_model: dep-c}
";

const STICKY_UPSTREAMS: [&str; 3] = ["dep-a", "dep-b", "dep-c"];

/// Which deployments served `n` requests for `dep/sticky` with `headers` and `body_extra`
/// merged into the body, and how many each.
async fn spread(
    gw: &Gateway,
    n: u32,
    headers: &[(&str, &[u8])],
    body_extra: Value,
) -> BTreeMap<String, u32> {
    let mut body = body("dep/sticky");
    if let (Some(body), Some(extra)) = (body.as_object_mut(), body_extra.as_object()) {
        body.extend(extra.clone());
    }
    let mut by = BTreeMap::new();
    for _ in 0..n {
        let r = served(gw, headers, body.clone()).await;
        *by.entry(served_deployment(&r)).or_default() += 1;
    }
    by
}

fn only(by: &BTreeMap<String, u32>) -> String {
    assert_eq!(by.len(), 1, "all on one deployment: {by:?}");
    by.keys().next().unwrap().clone()
}

#[tokio::test]
async fn a_session_stays_on_one_deployment_and_moves_to_one_other_when_it_fails() {
    let gw = &gateway(STICKY, QUICK_OPENING).await;
    let header = &[("x-session-affinity", b"conversation-1".as_slice())];
    let first = only(&spread(gw, 50, header, json!({})).await);
    let upstream = first.strip_prefix("sim-us/").unwrap().to_owned();
    let counts: Vec<u64> = {
        let mut c = Vec::new();
        for u in STICKY_UPSTREAMS {
            c.push(gw.upstream_requests(u).await);
        }
        c
    };
    assert_eq!(counts.iter().sum::<u64>(), 50, "{counts:?}");
    assert_eq!(gw.upstream_requests(&upstream).await, 50, "{counts:?}");

    // Its deployment fails: the session's requests fail over, and its breaker opens.
    gw.script(&upstream, json!({"kind": "status", "status": 503})).await;
    let open =
        format!("switchyard_breaker_state{{provider=\"sim-us\",upstream_model=\"{upstream}\"}} 2");
    let open = &open;
    eventually(PATIENCE, "the failing deployment's breaker to open", || async move {
        served(gw, header, body("dep/sticky")).await;
        metrics(gw).await.contains(open).then_some(())
    })
    .await;
    let calls_when_open = gw.upstream_requests(&upstream).await;
    let second = only(&spread(gw, 50, header, json!({})).await);
    assert_ne!(second, first);
    assert_eq!(
        gw.upstream_requests(&upstream).await,
        calls_when_open,
        "an open deployment gets no call"
    );
}

#[tokio::test]
async fn claude_code_and_codex_session_headers_keep_a_session_on_one_deployment() {
    let gw = gateway(STICKY, "").await;
    for (name, value) in [
        ("x-claude-code-session-id", b"6f1d2c1e-claude".as_slice()),
        ("session-id", b"0199a1b2-codex".as_slice()),
        ("X-Session-Affinity", b"upper-case-name".as_slice()),
    ] {
        only(&spread(&gw, 30, &[(name, value)], json!({})).await);
    }
}

#[tokio::test]
async fn session_affinity_false_on_the_request_or_the_key_spreads_a_sessions_requests_again() {
    let gw = gateway(STICKY, "").await;
    let header = [("x-session-affinity", b"conversation-2".as_slice())];
    only(&spread(&gw, 30, &header, json!({})).await);
    let off = spread(&gw, 30, &header, json!({"redundancy": {"session_affinity": false}})).await;
    assert!(off.len() >= 2, "without affinity the weights spread them: {off:?}");
    // Without any session header they spread too.
    let none = spread(&gw, 30, &[], json!({})).await;
    assert!(none.len() >= 2, "{none:?}");

    // Off for the key: spread; a request that asks for it back sticks again.
    gw.set_defaults(&["--models", "dep/sticky", "--no-session-affinity"]).await;
    let key_off = spread(&gw, 30, &header, json!({})).await;
    assert!(key_off.len() >= 2, "the key turned affinity off: {key_off:?}");
    only(&spread(&gw, 30, &header, json!({"redundancy": {"session_affinity": true}})).await);
}

// === Upstream concurrency ===

/// `dep/capped` with the secondary as fallback: the chain's second model, never needed.
fn capped() -> Value {
    json!({"models": ["dep/capped", SECONDARY], "messages": [{"role": "user", "content": "hello"}]})
}

const CAPPED: &str = "  - name: dep/capped
    deployments:
      - {provider: sim-us, upstream_model: dep-narrow, max_concurrency: 1}
      - {provider: sim-us, upstream_model: dep-wide}
";

#[tokio::test]
async fn a_request_over_a_deployments_cap_fails_over_at_once_to_the_other_deployment() {
    let gw = &gateway(CAPPED, NO_OPENING).await;
    // A session whose first deployment is the capped one, so both requests below go there
    // first.
    let mut session = None;
    for i in 0..40 {
        let value = format!("capped-{i}");
        let r = served(gw, &[("x-session-affinity", value.as_bytes())], capped()).await;
        if served_deployment(&r) == "sim-us/dep-narrow" {
            session = Some(value);
            break;
        }
    }
    let session = session.expect("no session of 40 went to the capped deployment first");
    let header = [("x-session-affinity", session.as_bytes())];
    // Long, so that a request that waited for the cap would show as seconds of waiting.
    gw.script("dep-narrow", json!({"kind": "ok", "delay_ms": 8000})).await;
    let before = gw.upstream_requests("dep-narrow").await;

    let slow = served(gw, &header, capped());
    let second = async {
        eventually(PATIENCE, "the first request to reach the capped deployment", || async move {
            (gw.upstream_requests("dep-narrow").await > before).then_some(())
        })
        .await;
        let m = metrics(gw).await;
        let limit = "switchyard_upstream_concurrency_limit{provider=\"sim-us\",deployment=\"sim-us/dep-narrow\"} 1";
        let in_flight =
            "switchyard_upstream_in_flight{provider=\"sim-us\",deployment=\"sim-us/dep-narrow\"} 1";
        assert!(m.contains(limit) && m.contains(in_flight), "{m}");
        let started = std::time::Instant::now();
        let r = served(gw, &header, capped()).await;
        (r, started.elapsed(), m)
    };
    let (first, (r, took, _)) = tokio::join!(slow, second);
    assert_eq!(served_deployment(&first), "sim-us/dep-narrow");
    assert_eq!(served_deployment(&r), "sim-us/dep-wide");
    let v = r.json();
    assert_eq!(
        deployment_attempts(&v),
        [
            quad("dep/capped", "sim-us/dep-narrow", "failed", "rate_limit"),
            quad("dep/capped", "sim-us/dep-wide", "served", ""),
        ],
        "{v}"
    );
    assert_eq!(attempt_objects(&v)[0]["local_limit"], true, "{v}");
    // Wall time (a real node): a request that waited for the capped deployment's slot would
    // take most of the first one's 8 s; 4 s leaves a loaded machine its slack.
    assert!(took < Duration::from_secs(4), "no wait for the cap: {took:?}");
    assert_eq!(
        gw.upstream_requests("dep-narrow").await,
        before + 1,
        "the request over the cap made no upstream call"
    );
    assert_eq!(
        gw.upstream_requests("secondary").await,
        0,
        "the chain's second model is never called"
    );
    let m = metrics(gw).await;
    assert!(
        m.contains(
            "switchyard_upstream_in_flight{provider=\"sim-us\",deployment=\"sim-us/dep-narrow\"} 0"
        ),
        "{m}"
    );
}

// === What apply refuses ===

const VALID: &str = "providers:
  - name: east
    kind: openai-compatible
    base_url: http://127.0.0.1:9/v1
  - name: west
    kind: openai-compatible
    base_url: http://127.0.0.1:9/v1
    max_concurrency: 50
    adaptive: true
models:
  - name: gpt
    deployments:
      - {provider: east, upstream_model: gpt-4o, weight: 3, region: eastus}
      - {provider: west, upstream_model: gpt-4o, max_concurrency: 20, adaptive: true}
    balance: least_latency
  - name: legacy
    provider: east
    upstream_model: legacy
    max_concurrency: 5
";

fn write(dir: &Path, name: &str, text: &str) -> String {
    let path = dir.join(name);
    std::fs::write(&path, text).unwrap();
    path.display().to_string()
}

#[tokio::test]
async fn apply_refuses_bad_deployments_naming_the_path_and_stores_nothing() {
    let dir = tempfile::tempdir().unwrap();
    let store = format!("file://{}", dir.path().join("store").display());
    let cp = start_control(&store, "127.0.0.1:0", dir.path(), "cp").await;
    let applied =
        cli(&cp.url(), &["apply", "-f", &write(dir.path(), "good.yaml", VALID), "--json"]).await;
    assert!(applied.success, "{}", applied.stderr);
    let stored = cli(&cp.url(), &["catalog", "--json"]).await.json();
    assert_eq!(stored["models"][0]["deployments"][1]["max_concurrency"], 20, "{stored}");
    assert_eq!(stored["models"][0]["balance"], "least_latency", "{stored}");

    // What any refused catalog exits with.
    let unknown = VALID.replace(
        "provider: east\n    upstream_model: legacy",
        "provider: nope\n    upstream_model: legacy",
    );
    let out = cli(&cp.url(), &["apply", "-f", &write(dir.path(), "unknown.yaml", &unknown)]).await;
    assert!(!out.success && out.stderr.contains("models[1].provider"), "{}", out.stderr);
    let refused_code = out.code;

    let d1 = "{provider: west, upstream_model: gpt-4o, max_concurrency: 20, adaptive: true}";
    let cases: Vec<(&str, String, &[&str])> = vec![
        (
            "weight-zero",
            VALID.replace("weight: 3", "weight: 0"),
            &["models[0].deployments[0].weight"],
        ),
        (
            "weight-negative",
            VALID.replace("weight: 3", "weight: -1"),
            &["models[0].deployments[0].weight"],
        ),
        (
            "unknown-provider",
            VALID.replace("{provider: west,", "{provider: north,"),
            &["models[0].deployments[1].provider"],
        ),
        (
            "duplicate",
            VALID.replace(d1, "{provider: east, upstream_model: gpt-4o}"),
            &["models[0].deployments[1]"],
        ),
        (
            "balance",
            VALID.replace("balance: least_latency", "balance: fastest"),
            &["models[0].balance"],
        ),
        (
            "deployment-cap",
            VALID.replace("max_concurrency: 20", "max_concurrency: 0"),
            &["models[0].deployments[1].max_concurrency"],
        ),
        (
            "provider-cap",
            VALID.replace("max_concurrency: 50", "max_concurrency: 0"),
            &["providers[1].max_concurrency"],
        ),
        (
            "model-cap",
            VALID.replace("max_concurrency: 5\n", "max_concurrency: 0\n"),
            &["models[1].max_concurrency"],
        ),
        (
            "with-provider",
            VALID.replace("  - name: gpt\n", "  - name: gpt\n    provider: east\n"),
            &["models[0].provider", "models[0].deployments"],
        ),
        (
            "with-upstream-model",
            VALID.replace("  - name: gpt\n", "  - name: gpt\n    upstream_model: gpt-4o\n"),
            &["models[0].upstream_model", "models[0].deployments"],
        ),
        (
            "wildcard",
            VALID.replace("  - name: gpt\n", "  - name: east/*\n"),
            &["models[0].deployments"],
        ),
    ];
    for (name, yaml, paths) in cases {
        assert_ne!(yaml, VALID, "{name}: the fixture changed");
        let file = format!("{name}.yaml");
        let out = cli(&cp.url(), &["apply", "-f", &write(dir.path(), &file, &yaml)]).await;
        assert!(!out.success, "{name} was applied:\n{yaml}");
        assert_eq!(out.code, refused_code, "{name}: {}", out.stderr);
        assert!(out.stderr.contains(&file), "{name}: the error names the file: {}", out.stderr);
        assert!(
            paths.iter().any(|p| out.stderr.contains(&format!("{p}:"))),
            "{name}: the error names {paths:?}: {}",
            out.stderr
        );
        let now = cli(&cp.url(), &["catalog", "--json"]).await.json();
        assert_eq!(now, stored, "{name}: the stored catalog is unchanged");
    }
}

/// `deployments: []` is refused by its own path, not taken for a model that forgot its
/// `provider`.
#[tokio::test]
async fn an_empty_deployments_list_is_refused_naming_it() {
    let dir = tempfile::tempdir().unwrap();
    let store = format!("file://{}", dir.path().join("store").display());
    let cp = start_control(&store, "127.0.0.1:0", dir.path(), "cp").await;
    let empty = "providers:
  - {name: east, kind: openai-compatible, base_url: http://127.0.0.1:9/v1}
models:
  - name: gpt
    deployments: []
";
    let out = cli(&cp.url(), &["apply", "-f", &write(dir.path(), "empty.yaml", empty)]).await;
    assert!(!out.success, "an empty deployments list was applied");
    assert!(out.stderr.contains("models[0].deployments:"), "{}", out.stderr);
    let stored = cli(&cp.url(), &["catalog", "--json"]).await.json();
    assert_eq!(stored["models"], json!([]), "nothing was applied");
}
