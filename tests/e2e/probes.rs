//! Probes (docs/catalog.md, "`probe`"): real control plane, node and simulated provider
//! processes on loopback. An idle model is probed with a one-token call that no key is billed
//! for; an open breaker is probed when due while user requests are skipped, stays open on a
//! failing probe and closes on a succeeding one; `switchyard breakers` shows the last probe.
#![allow(clippy::unwrap_used, clippy::expect_used)]

use serde_json::{Value, json};
use switchyard_e2e::gateway::*;
use switchyard_e2e::{PATIENCE, cli, eventually, http_get, promtool};

/// Every model probed each second.
const IDLE: &str = "probe:
  interval_ms: 1000
  timeout_ms: 500
";

/// Opens on two failures in a row and half-opens after half a second; idle probes are far
/// off, so the probes seen are the breaker's.
const DUE: &str = "breaker_policy:
  window_size: 2
  min_requests: 2
  failure_rate_threshold: 0.5
  consecutive_timeouts: 5
  cooldown_ms: 500
  max_cooldown_ms: 1000
  half_open_probes: 1
probe:
  interval_ms: 3600000
  timeout_ms: 1000
  open_interval_ms: 1000
";

fn msg() -> Value {
    json!([{"role": "user", "content": "hello"}])
}

/// `switchyard breakers --json`, the row of (provider, upstream model).
async fn breaker(gw: &Gateway, provider: &str, upstream_model: &str) -> Option<Value> {
    let listed = cli(&gw.cp.url(), &["breakers", "--json"]).await.json();
    listed
        .as_array()?
        .iter()
        .find(|b| b["provider"] == provider && b["upstream_model"] == upstream_model)
        .cloned()
}

/// The node's `switchyard_probes_total` of one (provider, upstream model, outcome).
async fn probes(gw: &Gateway, provider: &str, upstream_model: &str, outcome: &str) -> u64 {
    let metrics = http_get(gw.node.addr, "/metrics", None).await.unwrap().body;
    let series = format!(
        "switchyard_probes_total{{provider=\"{provider}\",upstream_model=\"{upstream_model}\",outcome=\"{outcome}\"}} "
    );
    metrics
        .lines()
        .find_map(|l| l.strip_prefix(&series)?.parse::<f64>().ok())
        .map_or(0, |v| v as u64)
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn an_idle_model_is_probed_with_one_token_and_billed_to_no_key() {
    let gw =
        Gateway::start_with(GatewayOptions { breaker_policy: IDLE, ..Default::default() }).await;
    // No request ever names the primary; the prober calls it all the same.
    eventually(PATIENCE, "the primary to be probed", || async {
        (probes(&gw, "sim-us", "primary", "success").await >= 1).then_some(())
    })
    .await;
    assert!(gw.upstream_requests("primary").await >= 1);
    let sent = gw.last_upstream_request("primary").await;
    assert_eq!(sent["body"]["max_tokens"], 1, "{sent}");
    assert_eq!(sent["body"]["messages"], json!([{"role": "user", "content": "ping"}]), "{sent}");

    // Every wire format the simulator serves answers a one-token probe.
    for (provider, upstream) in [
        ("sim-anthropic", ANTHROPIC_UPSTREAM),
        ("sim-gemini", GEMINI_UPSTREAM),
        ("sim-azure", AZURE_DEPLOYMENT),
        ("sim-eu", "eu-model"),
    ] {
        let row = eventually(PATIENCE, "a successful probe in switchyard breakers", || async {
            breaker(&gw, provider, upstream)
                .await
                .filter(|b| b["last_probe"]["outcome"] == "success")
        })
        .await;
        assert_eq!(row["state"], "closed", "{row}");
        assert!(row["last_probe"]["at_unix_ms"].as_i64().unwrap() > 0, "{row}");
    }
    let anthropic = gw.last_upstream_request(ANTHROPIC_UPSTREAM).await;
    assert_eq!(anthropic["body"]["max_tokens"], 1, "{anthropic}");
    let gemini = gw.last_upstream_request(GEMINI_UPSTREAM).await;
    assert_eq!(gemini["body"]["generationConfig"]["maxOutputTokens"], 1, "{gemini}");

    // One real request, so that a usage report is sure to have followed the probes: it is
    // the only usage there is.
    let served = gw.chat(json!({"model": SECONDARY, "messages": msg()})).await;
    assert_eq!(served.status, 200, "{}", served.body);
    let rows = eventually(PATIENCE, "the request's usage", || async {
        let rows = cli(&gw.cp.url(), &["usage", "--json"]).await.json();
        (!rows.as_array().unwrap().is_empty()).then_some(rows)
    })
    .await;
    let rows = rows.as_array().unwrap();
    assert_eq!(rows.len(), 1, "probes are billed to no key: {rows:?}");
    assert_eq!(
        (rows[0]["model"].as_str(), rows[0]["requests"].as_u64()),
        (Some(SECONDARY), Some(1))
    );

    // The probe families pass promtool, with samples in them.
    let metrics = http_get(gw.node.addr, "/metrics", None).await.unwrap().body;
    assert!(metrics.contains("switchyard_probe_duration_seconds_count{"), "{metrics}");
    let (ok, said) = promtool(&metrics).await;
    assert!(ok && said.trim().is_empty(), "promtool: {said}\n{metrics}");
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn an_open_breaker_is_probed_when_due_and_user_requests_are_never_its_test() {
    let gw =
        Gateway::start_with(GatewayOptions { breaker_policy: DUE, ..Default::default() }).await;
    gw.script("primary", json!({"kind": "status", "status": 503})).await;
    let chain = json!({"model": PRIMARY, "fallback_models": [SECONDARY], "messages": msg()});
    for _ in 0..2 {
        let r = gw.chat(chain.clone()).await;
        assert_eq!(r.status, 200, "{}", r.body);
    }
    // Opened; probed once the cool-down passed; the probe failed, so it is open again.
    let row = eventually(PATIENCE, "a failed probe of the open primary", || async {
        breaker(&gw, "sim-us", "primary")
            .await
            .filter(|b| b["state"] == "open" && b["last_probe"]["outcome"] == "failure")
    })
    .await;
    assert_eq!(row["cause"], "probe_failed", "{row}");

    // Meanwhile, over several cool-downs, user requests skip it: it is never their test.
    let started = std::time::Instant::now();
    while started.elapsed() < std::time::Duration::from_millis(2_500) {
        let r = gw.chat(chain.clone()).await;
        assert_eq!(r.status, 200, "{}", r.body);
        assert_eq!(
            attempts(&r.json()),
            [triple(PRIMARY, "skipped", "circuit_open"), triple(SECONDARY, "served", "")],
            "{}",
            r.body
        );
        // Pacing, not waiting for anything: requests spread over the cool-downs.
        tokio::time::sleep(std::time::Duration::from_millis(100)).await;
    }
    // The primary alone: skipped, nothing forced through, named in the error.
    let alone = gw.chat(json!({"model": PRIMARY, "messages": msg()})).await;
    assert_eq!(alone.status, 502, "{}", alone.body);
    assert!(alone.body.contains("circuit_open"), "{}", alone.body);
    // Every call the primary received since the two failures was a probe.
    let probed = probes(&gw, "sim-us", "primary", "failure").await;
    assert!(probed >= 2, "probed on each cool-down: {probed}");
    eventually(PATIENCE, "the primary's calls to be the two failures and the probes", || async {
        let calls = gw.upstream_requests("primary").await;
        let probes = probes(&gw, "sim-us", "primary", "failure").await
            + probes(&gw, "sim-us", "primary", "success").await;
        (calls == 2 + probes).then_some(())
    })
    .await;

    // The upstream recovers: the next probe closes the breaker and requests flow again.
    gw.script("primary", json!({"kind": "ok"})).await;
    let row = eventually(PATIENCE, "a successful probe to close the primary", || async {
        breaker(&gw, "sim-us", "primary").await.filter(|b| b["state"] == "closed")
    })
    .await;
    assert_eq!(row["last_probe"]["outcome"], "success", "{row}");
    assert_eq!(row["cause"], "probe_succeeded", "{row}");
    assert!(row["last_probe"]["latency_ms"].is_u64(), "{row}");
    let r = gw.chat(chain).await;
    assert_eq!(r.status, 200, "{}", r.body);
    assert_eq!(r.json()["model"], PRIMARY, "{}", r.body);
    let table = cli(&gw.cp.url(), &["breakers"]).await.stdout;
    let line = table.lines().find(|l| l.contains("primary")).unwrap();
    assert!(line.contains("success "), "{table}");
}

#[tokio::test]
async fn an_out_of_range_probe_is_refused_by_apply_naming_the_path_and_one_in_range_is_a_change() {
    let gw = Gateway::start().await;
    let options = GatewayOptions {
        breaker_policy: "probe:\n  interval_ms: 500\n  timeout_ms: 5000\n",
        ..Default::default()
    };
    let file = gw.path().join("probes.yaml");
    std::fs::write(&file, catalog_yaml(&gw.sim.url(), &options)).unwrap();
    let out = cli(&gw.cp.url(), &["apply", "-f", &file.display().to_string()]).await;
    assert!(!out.success, "{}", out.stdout);
    assert!(out.stderr.contains("probes.yaml"), "{}", out.stderr);
    assert!(out.stderr.contains("probe.interval_ms"), "{}", out.stderr);
    assert!(out.stderr.contains("1000–3600000, got 500"), "{}", out.stderr);
    assert!(out.stderr.contains("probe.timeout_ms"), "{}", out.stderr);
    let stored = cli(&gw.cp.url(), &["catalog", "--json"]).await.json();
    assert!(stored.get("probe").is_none(), "nothing was applied: {stored}");

    // A model's own probe, by its path in the file.
    let yaml = catalog_yaml(&gw.sim.url(), &GatewayOptions::default()).replacen(
        "    upstream_model: secondary\n",
        "    upstream_model: secondary\n    probe: {timeout_ms: 70000}\n",
        1,
    );
    std::fs::write(&file, yaml).unwrap();
    let out = cli(&gw.cp.url(), &["apply", "-f", &file.display().to_string()]).await;
    assert!(!out.success, "{}", out.stdout);
    assert!(out.stderr.contains("models[1].probe.timeout_ms"), "{}", out.stderr);
    let stored = cli(&gw.cp.url(), &["catalog", "--json"]).await.json();
    assert!(stored["models"][1].get("probe").is_none(), "nothing was applied: {stored}");

    // In range, it is applied, and apply names the change like any other.
    for (probe, change) in [
        ("probe:\n  interval_ms: 60000\n", "+ probe"),
        ("probe:\n  interval_ms: 50000\n", "~ probe: interval_ms"),
    ] {
        let options = GatewayOptions { breaker_policy: probe, ..Default::default() };
        std::fs::write(&file, catalog_yaml(&gw.sim.url(), &options)).unwrap();
        let out = cli(&gw.cp.url(), &["apply", "-f", &file.display().to_string()]).await;
        assert!(out.success, "{}", out.stderr);
        assert!(out.stdout.contains(change), "{}", out.stdout);
    }
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_primary_down_for_30s_is_back_within_one_probe_interval_of_recovering_and_no_user_request_tested_it()
 {
    use std::time::{Duration, Instant};
    // The default breaker policy and no `probe:` block: open probing is on by default.
    let gw = Gateway::start().await;
    gw.script("primary", json!({"kind": "status", "status": 503})).await;
    let chain = json!({"model": PRIMARY, "fallback_models": [SECONDARY], "messages": msg()});
    let started = Instant::now();
    let every = Duration::from_secs(1);
    let down_for = Duration::from_secs(30);
    // The primary's calls once its breaker opened were all probes.
    let mut opened_with = None;
    let mut n = 0u32;
    while started.elapsed() < down_for {
        let r = gw.chat(chain.clone()).await;
        assert_eq!(r.status, 200, "{}", r.body);
        let first = attempts(&r.json())[0].clone();
        if first == triple(PRIMARY, "skipped", "circuit_open") {
            opened_with.get_or_insert(gw.upstream_requests("primary").await);
        } else {
            assert!(opened_with.is_none(), "a user request reached the open primary: {}", r.body);
        }
        n += 1;
        tokio::time::sleep_until((started + every * n).into()).await;
    }
    let failed_before_opening = opened_with.expect("the breaker opened while the primary was down");
    let probes = probes(&gw, "sim-us", "primary", "failure").await;
    assert!(probes >= 3, "probed every 5 s while open: {probes}");
    assert_eq!(
        gw.upstream_requests("primary").await,
        failed_before_opening + probes,
        "after opening, the primary's only calls were probes"
    );

    // It recovers. One request a second: the first one sent a probe interval (5 s) and a
    // request period after the recovery is served by it, and every one after. Wall time (a
    // real node's probes): 2 s more are a loaded machine's slack, far below the 30 s
    // cool-down that would apply if no probe closed the breaker.
    gw.script("primary", json!({"kind": "ok"})).await;
    let recovered = Instant::now();
    let mut first_served = None;
    let slack = Duration::from_secs(2);
    while recovered.elapsed() < Duration::from_secs(5) + every * 2 + slack {
        let r = gw.chat(chain.clone()).await;
        let served_by = r.json()["model"].clone();
        if served_by == PRIMARY {
            first_served.get_or_insert(recovered.elapsed());
        } else if recovered.elapsed() >= Duration::from_secs(5) + every + slack {
            panic!("{:?} after recovering, still not the primary: {}", recovered.elapsed(), r.body);
        } else {
            assert!(first_served.is_none(), "the primary closed, then was skipped again");
        }
        n += 1;
        tokio::time::sleep_until((started + every * n).into()).await;
    }
    assert!(first_served.is_some());
}
