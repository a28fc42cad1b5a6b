//! Retries inside one attempt (docs/catalog.md "Retries"), behaviour by behaviour: real
//! control plane, node and simulated provider processes on loopback.
#![allow(clippy::unwrap_used, clippy::expect_used)]

use std::time::{Duration, Instant};

use serde_json::{Value, json};
use switchyard_e2e::gateway::*;
use switchyard_e2e::{PATIENCE, cli, eventually, http_get};

/// Short waits, so the tests spend their time on the behaviour, not on backoff.
const POLICY: &str = "retry_policy:
  max_retries: 2
  base_backoff_ms: 10
  max_backoff_ms: 50
";

fn msg() -> Value {
    json!([{"role": "user", "content": "hello"}])
}

fn chain(models: &[&str]) -> Value {
    json!({"models": models, "messages": msg()})
}

/// `steps` in order, then a good answer.
fn fails_then_ok(steps: &[Value]) -> Value {
    json!({"kind": "sequence", "steps": steps, "then": {"kind": "ok"}})
}

fn status(code: u16) -> Value {
    json!({"kind": "status", "status": code})
}

fn rate_limited(retry_after_secs: u64) -> Value {
    json!({"kind": "status", "status": 429, "retry_after": retry_after_secs})
}

async fn gateway(extra: &'static str) -> Gateway {
    Gateway::start_with(GatewayOptions { breaker_policy: extra, ..GatewayOptions::default() }).await
}

async fn metrics(gw: &Gateway) -> String {
    http_get(gw.node.addr, "/metrics", None).await.unwrap().body
}

// === A retry serves from the same model ===

#[tokio::test]
async fn a_503_then_success_is_served_by_the_same_model_with_one_retry() {
    let gw = gateway(POLICY).await;
    gw.script("primary", fails_then_ok(&[status(503)])).await;
    let r = gw.chat(chain(&[PRIMARY, SECONDARY])).await;
    assert_eq!(r.status, 200, "{}", r.body);
    let v = r.json();
    assert_eq!(v["model"], PRIMARY);
    assert_eq!(attempts(&v), [triple(PRIMARY, "served", "")], "{v}");
    let attempt = &attempt_objects(&v)[0];
    assert_eq!(attempt["retries"], 1, "{attempt}");
    assert_eq!(gw.upstream_requests("primary").await, 2);
    assert_eq!(gw.upstream_requests("secondary").await, 0, "no failover");
    let m = metrics(&gw).await;
    assert!(
        m.contains(
            "switchyard_upstream_retries_total{provider=\"sim-us\",model=\"sim/primary\",reason=\"server_error\"} 1"
        ),
        "{m}"
    );
}

#[tokio::test]
async fn a_stream_is_retried_before_its_first_token() {
    let gw = gateway(POLICY).await;
    gw.script("primary", fails_then_ok(&[status(502)])).await;
    let mut body = chain(&[PRIMARY, SECONDARY]);
    body["stream"] = json!(true);
    let s = gw.stream(body).await;
    assert_eq!(s.status, 200, "{:?}", s.frames);
    assert_eq!(s.header("x-served-model").as_deref(), Some(PRIMARY));
    assert!(!s.text().is_empty());
    assert!(s.error_frame().is_none(), "{:?}", s.frames);
    let report = s.chunks().into_iter().find(|c| c.get("secureai").is_some()).unwrap();
    assert_eq!(attempts(&report), [triple(PRIMARY, "served", "")], "{report}");
    assert_eq!(attempt_objects(&report)[0]["retries"], 1, "{report}");
    assert_eq!(gw.upstream_requests("primary").await, 2);
    assert_eq!(gw.upstream_requests("secondary").await, 0);
}

#[tokio::test]
async fn a_stream_that_breaks_after_its_first_token_is_not_retried() {
    let gw = gateway(POLICY).await;
    gw.script(
        "primary",
        json!({"kind": "ok", "text": "one two three four", "chunks": 4, "drop_after": 2}),
    )
    .await;
    let mut body = chain(&[PRIMARY, SECONDARY]);
    body["stream"] = json!(true);
    let s = gw.stream(body).await;
    assert_eq!(s.status, 200);
    assert!(!s.text().is_empty(), "content reached the client: {:?}", s.frames);
    assert!(s.error_frame().is_some(), "the break is an error frame: {:?}", s.frames);
    assert_eq!(gw.upstream_requests("primary").await, 1, "no second call once content was sent");
    assert_eq!(gw.upstream_requests("secondary").await, 0);
}

#[tokio::test]
async fn without_a_retry_policy_only_a_request_that_asks_is_retried() {
    let gw = Gateway::start().await;
    gw.script("primary", fails_then_ok(&[status(503)])).await;
    let v = gw.chat(chain(&[PRIMARY, SECONDARY])).await.json();
    assert_eq!(
        attempts(&v),
        [triple(PRIMARY, "failed", "server_error"), triple(SECONDARY, "served", "")],
        "a failed call fails its attempt: {v}"
    );
    assert!(attempt_objects(&v)[0].get("retries").is_none(), "no retries, no field: {v}");
    assert_eq!(gw.upstream_requests("primary").await, 1);

    gw.script("primary", fails_then_ok(&[status(503)])).await;
    let mut body = chain(&[PRIMARY, SECONDARY]);
    body["redundancy"] = json!({"max_retries": 1});
    let v = gw.chat(body).await.json();
    assert_eq!(attempts(&v), [triple(PRIMARY, "served", "")], "{v}");
    assert_eq!(attempt_objects(&v)[0]["retries"], 1);
}

#[tokio::test]
async fn a_models_retry_override_turns_retries_on_for_that_model_only() {
    let gw = Gateway::start().await;
    let options = GatewayOptions::default();
    let yaml = catalog_yaml(&gw.sim.url(), &options).replace(
        "    upstream_model: primary\n",
        "    upstream_model: primary\n    retry: {max_retries: 1, base_backoff_ms: 1, max_backoff_ms: 5}\n",
    );
    let file = gw.path().join("override.yaml");
    std::fs::write(&file, yaml).unwrap();
    let applied = cli(&gw.cp.url(), &["apply", "-f", &file.display().to_string(), "--json"]).await;
    gw.wait_for(applied.json()["version"].as_i64().unwrap()).await;

    gw.script("primary", fails_then_ok(&[status(503)])).await;
    gw.script("secondary", fails_then_ok(&[status(503)])).await;
    let v = gw.chat(chain(&[PRIMARY, TERTIARY])).await.json();
    assert_eq!(attempts(&v), [triple(PRIMARY, "served", "")], "{v}");
    assert_eq!(attempt_objects(&v)[0]["retries"], 1);
    let v = gw.chat(chain(&[SECONDARY, TERTIARY])).await.json();
    assert_eq!(
        attempts(&v),
        [triple(SECONDARY, "failed", "server_error"), triple(TERTIARY, "served", "")],
        "{v}"
    );
    assert_eq!(gw.upstream_requests("secondary").await, 1);
}

// === Retry-After ===

#[tokio::test]
async fn a_retry_after_within_max_retry_after_ms_is_waited_for() {
    let gw = gateway(POLICY).await;
    gw.script("primary", fails_then_ok(&[rate_limited(1)])).await;
    let started = Instant::now();
    let v = gw.chat(chain(&[PRIMARY, SECONDARY])).await.json();
    let took = started.elapsed();
    assert_eq!(attempts(&v), [triple(PRIMARY, "served", "")], "{v}");
    let attempt = &attempt_objects(&v)[0];
    assert_eq!(attempt["retries"], 1);
    assert!(took >= Duration::from_secs(1), "the 1 s the upstream asked for: {took:?}");
    assert!(
        attempt["latency_ms"].as_u64().unwrap() >= 1000,
        "latency_ms covers both calls and the wait: {attempt}"
    );
}

#[tokio::test]
async fn a_retry_after_beyond_max_retry_after_ms_fails_over_at_once_without_a_retry() {
    let gw = gateway(
        "retry_policy:
  max_retries: 2
  max_retry_after_ms: 1000
",
    )
    .await;
    gw.script("primary", fails_then_ok(&[rate_limited(5)])).await;
    let started = Instant::now();
    let v = gw.chat(chain(&[PRIMARY, SECONDARY])).await.json();
    let took = started.elapsed();
    assert_eq!(
        attempts(&v),
        [triple(PRIMARY, "failed", "rate_limit"), triple(SECONDARY, "served", "")],
        "{v}"
    );
    assert!(attempt_objects(&v)[0].get("retries").is_none(), "{v}");
    assert_eq!(gw.upstream_requests("primary").await, 1);
    // Wall time (a real node): waiting on the refused Retry-After would take its 5 s; 4 s
    // leaves a loaded machine its slack.
    assert!(took < Duration::from_secs(4), "no waiting on a refused Retry-After: {took:?}");
}

#[tokio::test]
async fn a_wait_that_does_not_fit_the_deadline_fails_over_now() {
    let gw = gateway(POLICY).await;
    gw.script("primary", fails_then_ok(&[rate_limited(4)])).await;
    let mut body = chain(&[PRIMARY, SECONDARY]);
    // 4 s of Retry-After plus a fair minimum of 1 s for the call is more than is left.
    body["redundancy"] = json!({"deadline_ms": 4500});
    let started = Instant::now();
    let v = gw.chat(body).await.json();
    let took = started.elapsed();
    assert_eq!(
        attempts(&v),
        [triple(PRIMARY, "failed", "rate_limit"), triple(SECONDARY, "served", "")],
        "{v}"
    );
    assert_eq!(gw.upstream_requests("primary").await, 1);
    // Wall time (a real node): waiting would take the 4 s asked for; 3 s leaves a loaded
    // machine its slack.
    assert!(took < Duration::from_secs(3), "failed over without waiting: {took:?}");
}

// === What is not retried ===

#[tokio::test]
async fn no_retry_when_the_reason_is_not_in_on() {
    let gw = gateway(
        "retry_policy:
  max_retries: 2
  on: [rate_limit]
  base_backoff_ms: 1
  max_backoff_ms: 5
",
    )
    .await;
    gw.script("primary", fails_then_ok(&[status(503)])).await;
    let v = gw.chat(chain(&[PRIMARY, SECONDARY])).await.json();
    assert_eq!(
        attempts(&v),
        [triple(PRIMARY, "failed", "server_error"), triple(SECONDARY, "served", "")],
        "{v}"
    );
    assert_eq!(gw.upstream_requests("primary").await, 1, "server_error is not in on");
}

#[tokio::test]
async fn every_call_counts_in_the_breaker_and_an_open_breaker_is_never_retried_into() {
    let gw = gateway(
        "retry_policy:
  max_retries: 5
  base_backoff_ms: 1
  max_backoff_ms: 5
breaker_policy:
  window_size: 2
  min_requests: 2
  failure_rate_threshold: 0.5
  cooldown_ms: 60000
  max_cooldown_ms: 60000
",
    )
    .await;
    gw.script("primary", status(503)).await;
    let v = gw.chat(chain(&[PRIMARY, SECONDARY])).await.json();
    assert_eq!(
        attempts(&v),
        [triple(PRIMARY, "failed", "server_error"), triple(SECONDARY, "served", "")],
        "{v}"
    );
    // The first call and its retry fill the breaker's window of two: it opens, and the
    // remaining four retries are not made.
    assert_eq!(attempt_objects(&v)[0]["retries"], 1, "{v}");
    assert_eq!(gw.upstream_requests("primary").await, 2);
    let v = gw.chat(chain(&[PRIMARY, SECONDARY])).await.json();
    assert_eq!(
        attempts(&v),
        [triple(PRIMARY, "skipped", "circuit_open"), triple(SECONDARY, "served", "")],
        "{v}"
    );
    assert_eq!(gw.upstream_requests("primary").await, 2);
}

#[tokio::test]
async fn the_budget_caps_a_retry_storm() {
    let gw = gateway(
        "retry_policy:
  max_retries: 5
  base_backoff_ms: 1
  max_backoff_ms: 5
  budget_ratio: 0.1
  budget_min_per_sec: 1
breaker_policy:
  window_size: 1000
  min_requests: 1000
",
    )
    .await;
    gw.script("primary", status(503)).await;
    const BURST: u64 = 60;
    let started = Instant::now();
    let requests: Vec<_> = (0..BURST)
        .map(|_| {
            let (addr, key) = (gw.node.addr, gw.key.clone());
            let body = body(PRIMARY).to_string();
            tokio::spawn(async move {
                switchyard_e2e::http_request(
                    addr,
                    "POST",
                    "/v1/chat/completions",
                    Some(&key),
                    Some(body.as_bytes()),
                )
                .await
                .unwrap()
                .status
            })
        })
        .collect();
    for r in requests {
        assert_eq!(r.await.unwrap(), 502);
    }
    let windows = 1 + started.elapsed().as_secs() / 10;
    let calls = gw.upstream_requests("primary").await;
    // 10 % of the requests, plus 1 retry a second for each second of the 10 s window.
    let bound = BURST + BURST / 10 + 10 * windows;
    assert!(calls <= bound, "{calls} upstream calls for {BURST} requests, at most {bound}");
    assert!(calls > BURST, "the floor still allows some retries: {calls}");
    assert!(calls < BURST * 6, "without the budget there would be {}", BURST * 6);
    let m = metrics(&gw).await;
    let refusals = m
        .lines()
        .find(|l| l.starts_with("switchyard_retry_budget_refusals_total{"))
        .and_then(|l| l.rsplit(' ').next()?.parse::<u64>().ok())
        .unwrap_or(0);
    assert!(refusals > 0, "{m}");
}

#[tokio::test]
async fn a_request_that_fails_over_earns_no_more_retry_budget_than_one_that_does_not() {
    // Floor 0 and ratio 0.5: over BURST requests, at most BURST / 2 retries. Were the budget
    // grown by attempts, each request's second attempt would earn the failing model as many
    // retries again.
    let gw = gateway(
        "retry_policy:
  max_retries: 5
  base_backoff_ms: 1
  max_backoff_ms: 2
  budget_ratio: 0.5
  budget_min_per_sec: 0
breaker_policy:
  window_size: 1000
  min_requests: 1000
",
    )
    .await;
    gw.script("primary", status(503)).await;
    const BURST: u64 = 20;
    for _ in 0..BURST {
        let v = gw.chat(chain(&[PRIMARY, SECONDARY])).await.json();
        assert_eq!(v["model"], SECONDARY, "{v}");
    }
    let calls = gw.upstream_requests("primary").await;
    assert!(calls <= BURST + BURST / 2, "{calls} calls to the failing model for {BURST} requests");
    assert!(calls > BURST, "half a retry per request is allowed: {calls}");
}

#[tokio::test]
async fn the_failover_event_carries_each_attempts_retries() {
    let gw = gateway(POLICY).await;
    gw.script("primary", status(503)).await;
    let v = gw.chat(chain(&[PRIMARY, SECONDARY])).await.json();
    assert_eq!(attempt_objects(&v)[0]["retries"], 2, "{v}");
    let control = gw.cp.url();
    let events = eventually(Duration::from_secs(10), "the failover event stored", || {
        let control = control.clone();
        async move {
            let out = cli(&control, &["events", "--json"]).await;
            let events: Vec<Value> =
                out.stdout.lines().filter_map(|l| serde_json::from_str(l).ok()).collect();
            (!events.is_empty()).then_some(events)
        }
    })
    .await;
    let attempts = &events[0]["attempts"];
    assert_eq!(attempts[0]["model"], PRIMARY, "{attempts}");
    assert_eq!(attempts[0]["retries"], 2, "{attempts}");
    assert!(attempts[1].get("retries").is_none(), "none for the served attempt: {attempts}");
}

// === The client goes away ===

#[tokio::test]
async fn a_client_disconnect_cancels_the_backoff() {
    use tokio::io::AsyncWriteExt;
    let gw = gateway(POLICY).await;
    gw.script("primary", fails_then_ok(&[rate_limited(2)])).await;
    let payload = body(PRIMARY).to_string();
    // A raw socket: the test closes the connection under the node, before any answer, at
    // the moment it chooses.
    let mut socket = tokio::net::TcpStream::connect(gw.node.addr).await.unwrap();
    let head = format!(
        "POST /v1/chat/completions HTTP/1.1\r\nHost: x\r\nAuthorization: Bearer {}\r\nContent-Type: application/json\r\nContent-Length: {}\r\n\r\n",
        gw.key,
        payload.len()
    );
    socket.write_all(head.as_bytes()).await.unwrap();
    socket.write_all(payload.as_bytes()).await.unwrap();
    eventually(PATIENCE, "the first call to reach the upstream", || async {
        (gw.upstream_requests("primary").await == 1).then_some(())
    })
    .await;
    // The node now waits the 2 s the upstream asked for; the client leaves.
    drop(socket);
    // Nothing to poll for: the proof is a retry that never comes. Wait past the moment it
    // would have been made.
    tokio::time::sleep(Duration::from_millis(3000)).await;
    assert_eq!(gw.upstream_requests("primary").await, 1, "the backoff ended with the client");
    assert!(!metrics(&gw).await.contains("switchyard_upstream_retries_total{"));
}

// === Bad input ===

#[tokio::test]
async fn redundancy_max_retries_out_of_range_is_a_400_naming_the_field() {
    let gw = gateway(POLICY).await;
    for bad in [json!(6), json!(-1), json!("2")] {
        let mut body = chain(&[PRIMARY, SECONDARY]);
        body["redundancy"] = json!({"max_retries": bad});
        let r = gw.chat(body).await;
        assert_eq!(r.status, 400, "{}", r.body);
        let v = r.json();
        assert_eq!(v["error"]["param"], "redundancy.max_retries", "{v}");
        assert!(v["error"]["message"].as_str().unwrap().contains("0 to 5"), "{v}");
    }
    assert_eq!(gw.upstream_total().await, 0, "refused before any upstream call");
}

#[tokio::test]
async fn a_catalog_with_retry_policy_max_retries_9_is_refused_by_apply_naming_the_path() {
    let gw = Gateway::start().await;
    let options = GatewayOptions {
        breaker_policy: "retry_policy:\n  max_retries: 9\n",
        ..Default::default()
    };
    let file = gw.path().join("retries.yaml");
    std::fs::write(&file, catalog_yaml(&gw.sim.url(), &options)).unwrap();
    let out = cli(&gw.cp.url(), &["apply", "-f", &file.display().to_string()]).await;
    assert!(!out.success, "{}", out.stdout);
    assert!(out.stderr.contains("retries.yaml"), "{}", out.stderr);
    assert!(out.stderr.contains("retry_policy.max_retries"), "{}", out.stderr);
    assert!(out.stderr.contains("0–5"), "{}", out.stderr);
    let stored = cli(&gw.cp.url(), &["catalog", "--json"]).await.json();
    assert!(stored.get("retry_policy").is_none(), "nothing was applied: {stored}");
}
