//! A key's own limits held for the whole fleet (`switchyard keys set-limits`), with real
//! control planes, nodes and the simulator.
#![allow(clippy::unwrap_used, clippy::expect_used)]

use std::net::SocketAddr;
use std::time::Duration;

use serde_json::{Value, json};
use switchyard_e2e::etcd::EtcdProcess;
use switchyard_e2e::gateway::*;
use switchyard_e2e::*;

fn header(r: &HttpResponse, name: &str) -> Option<String> {
    r.headers.lines().find_map(|l| {
        let (k, v) = l.split_once(':')?;
        k.trim().eq_ignore_ascii_case(name).then(|| v.trim().to_owned())
    })
}

async fn post(node: SocketAddr, key: &str, body: &Value) -> HttpResponse {
    http_request(node, "POST", "/v1/chat/completions", Some(key), Some(body.to_string().as_bytes()))
        .await
        .expect("the node answers")
}

/// Waits until a node has applied `version` and has heard from its control plane what the
/// fleet used (its `/readyz` shows the view's age once it has).
async fn wait_ready(node: SocketAddr, version: i64) {
    eventually(PATIENCE, "the node to apply the limits and hear from the fleet", || async move {
        let r = http_get(node, "/readyz", None).await?.json();
        (r["config_version"].as_i64()? >= version && r["limits_view_age_ms"].as_u64()? < 1000)
            .then_some(())
    })
    .await;
}

fn blocked_well(r: &HttpResponse, code: &str) {
    assert_eq!(r.status, 429, "{}", r.body);
    let v = r.json();
    assert_eq!(v["error"]["type"], "rate_limit_error", "{v}");
    assert_eq!(v["error"]["code"], code, "{v}");
    let retry: u64 = header(r, "retry-after").expect("Retry-After").parse().unwrap();
    assert!(retry >= 1, "{retry}");
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn sixty_rpm_hold_across_three_nodes_and_two_control_planes_on_etcd() {
    let etcd = EtcdProcess::start().await;
    let fleet = EtcdPair::start(&etcd).await;
    let (sim, cp1, cp2) = (&fleet.sim, &fleet.cp1, &fleet.cp2);
    let created = cli(&cp1.url(), &["keys", "create", "--name", "metered", "--json"]).await.json();
    let (key, id) = (created["key"].as_str().unwrap(), created["id"].as_str().unwrap());
    let set = cli(&cp2.url(), &["keys", "set-limits", id, "--rpm", "60", "--json"]).await.json();
    assert_eq!(set["limits"]["rpm"], 60, "{set}");
    let version = set["version"].as_i64().unwrap();
    // Nodes 1 and 3 follow cp1, node 2 follows cp2: the fleet's count crosses replicas.
    let mut nodes = Vec::new();
    for (i, (first, second)) in [(cp1, cp2), (cp2, cp1), (cp1, cp2)].into_iter().enumerate() {
        let node = fleet.node(&format!("node{i}"), first, second, version).await;
        wait_ready(node.addr, version).await;
        nodes.push(node);
    }

    // 300 requests, round robin over the three nodes, 15 a second for 20 s.
    let body = body(PRIMARY);
    let mut pace = tokio::time::interval(Duration::from_micros(66_667));
    let (mut admitted, mut blocked) = (0, 0);
    for i in 0..300 {
        pace.tick().await;
        let r = post(nodes[i % 3].addr, key, &body).await;
        assert_eq!(header(&r, "x-ratelimit-limit-requests").as_deref(), Some("60"), "{}", r.body);
        assert!(header(&r, "x-ratelimit-remaining-requests").is_some());
        assert!(header(&r, "x-ratelimit-reset-requests").is_some());
        match r.status {
            200 => admitted += 1,
            _ => {
                blocked_well(&r, "gateway_rate_limited");
                blocked += 1;
            }
        }
    }
    println!("{admitted} of 300 admitted, {blocked} refused");
    assert!((60..=66).contains(&admitted), "{admitted} admitted in one rolling minute");
    assert_eq!(admitted + blocked, 300);
    assert_eq!(sim_requests(sim.addr).await, admitted, "a blocked request never went upstream");
    // The control planes see the same count.
    let limits = cli(&cp2.url(), &["usage", "--limits", "--key", id, "--json"]).await.json();
    assert_eq!(limits[0]["limit"], "rpm", "{limits}");
    assert_eq!(limits[0]["used"].as_f64().unwrap() as u64, admitted, "{limits}");
}

async fn sim_requests(sim: SocketAddr) -> u64 {
    http_get(sim, "/_sim/stats", None).await.unwrap().json()["requests"].as_u64().unwrap()
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn tokens_per_minute_count_what_the_served_model_reported() {
    let gw = Gateway::start().await;
    let set = cli(&gw.cp.url(), &["keys", "set-limits", &gw.key_id, "--tpm", "20", "--json"])
        .await
        .json();
    wait_ready(gw.node.addr, set["version"].as_i64().unwrap()).await;
    // The simulator counts words: "hello" and "Hello from primary." are 4 tokens.
    let mut admitted = 0;
    loop {
        let r = post(gw.node.addr, &gw.key, &body(PRIMARY)).await;
        if r.status != 200 {
            blocked_well(&r, "gateway_rate_limited");
            assert_eq!(header(&r, "x-ratelimit-remaining-tokens").as_deref(), Some("0"));
            break;
        }
        assert_eq!(r.json()["usage"]["total_tokens"], 4);
        admitted += 1;
        assert!(admitted <= 5, "20 tokens per minute hold 5 such requests");
    }
    assert_eq!(admitted, 5);
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_nodes_metrics_show_what_a_key_used_of_its_daily_budgets() {
    let gw = Gateway::start().await;
    let set = cli(
        &gw.cp.url(),
        &[
            "keys",
            "set-limits",
            &gw.key_id,
            "--tokens-per-day",
            "40",
            "--usd-per-day",
            "1",
            "--json",
        ],
    )
    .await
    .json();
    wait_ready(gw.node.addr, set["version"].as_i64().unwrap()).await;
    // 9 requests of 4 tokens (the simulator counts words): 36 of 40, the alert's 90 %.
    for _ in 0..9 {
        let r = post(gw.node.addr, &gw.key, &body(PRIMARY)).await;
        assert_eq!(r.status, 200, "{}", r.body);
    }
    let series = |limit: &str| {
        format!("switchyard_key_budget_used_ratio{{key=\"{}\",limit=\"{limit}\"}} ", gw.key_id)
    };
    let metrics = eventually(PATIENCE, "the tokens of 9 answers in the ratio", || async {
        let m = http_get(gw.node.addr, "/metrics", None).await?.body;
        let ratio: f64 =
            m.lines().find_map(|l| l.strip_prefix(&series("tokens_per_day")))?.parse().ok()?;
        (ratio == 0.9).then_some(m)
    })
    .await;
    // The primary's price ($1 in, $2 out per Mtok): $0.000063 of $1.
    let usd: f64 = metrics
        .lines()
        .find_map(|l| l.strip_prefix(&series("usd_per_day")))
        .unwrap()
        .parse()
        .unwrap();
    assert!(usd > 0.0 && usd < 0.001, "{usd}\n{metrics}");
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_daily_budget_blocks_once_the_served_models_cost_reaches_it_failover_included() {
    let gw = Gateway::start().await;
    gw.script("primary", json!({"kind": "status", "status": 503})).await;
    // Served by the secondary ($3 in, $4 out per Mtok): 1 + 3 tokens cost $0.000015; by the
    // primary ($1, $2) they would cost $0.000007, and 8 requests would fit, not 4.
    let set = cli(
        &gw.cp.url(),
        &["keys", "set-limits", &gw.key_id, "--usd-per-day", "0.00005", "--json"],
    )
    .await
    .json();
    wait_ready(gw.node.addr, set["version"].as_i64().unwrap()).await;
    let chain = json!({"model": PRIMARY, "fallback_models": [SECONDARY],
                       "messages": [{"role": "user", "content": "hello"}]});
    let mut served = 0;
    loop {
        let r = post(gw.node.addr, &gw.key, &chain).await;
        if r.status != 200 {
            blocked_well(&r, "budget_exceeded");
            let retry: i64 = header(&r, "retry-after").unwrap().parse().unwrap();
            let until_midnight = 86_400 - (now_ms() / 1000) % 86_400;
            assert!(
                (retry - until_midnight).abs() <= 2,
                "{retry} s, midnight in {until_midnight} s"
            );
            break;
        }
        assert_eq!(r.json()["model"], SECONDARY);
        served += 1;
        assert!(served <= 4);
    }
    assert_eq!(served, 4);
    // No failover and no breaker effect: the budget's block never reached a provider.
    let upstream = gw.upstream_requests("secondary").await;
    assert_eq!(upstream, 4);
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_restarted_node_keeps_the_fleets_count_and_a_node_without_its_control_plane_keeps_enforcing()
 {
    let mut gw = Gateway::start().await;
    let set =
        cli(&gw.cp.url(), &["keys", "set-limits", &gw.key_id, "--rpm", "5", "--json"]).await.json();
    let version = set["version"].as_i64().unwrap();
    wait_ready(gw.node.addr, version).await;
    for _ in 0..3 {
        assert_eq!(post(gw.node.addr, &gw.key, &body(PRIMARY)).await.status, 200);
    }
    // The control plane has the node's window before the node goes.
    let control = gw.cp.url();
    let key_id = gw.key_id.clone();
    eventually(PATIENCE, "the control plane to hold the node's window", || {
        let (control, key_id) = (control.clone(), key_id.clone());
        async move {
            let v = cli(&control, &["usage", "--limits", "--key", &key_id, "--json"]).await.json();
            (v[0]["used"].as_f64()? >= 3.0).then_some(())
        }
    })
    .await;
    let node_dir = gw.path().join("node");
    gw.node.child.kill().await.unwrap();
    gw.node = start_node(&gw.cp.url(), &node_dir, "127.0.0.1:0", gw.path().join("node2.log")).await;
    wait_ready(gw.node.addr, version).await;
    // The new run starts from the fleet's count, not from zero: 2 more, then blocked.
    let statuses: Vec<u16> = {
        let mut s = Vec::new();
        for _ in 0..4 {
            s.push(post(gw.node.addr, &gw.key, &body(PRIMARY)).await.status);
        }
        s
    };
    assert_eq!(statuses, [200, 200, 429, 429]);

    // With its control plane gone, once its view is too old to trust, the node still holds
    // the key to its limit.
    gw.cp.child.kill().await.unwrap();
    let node = gw.node.addr;
    eventually(PATIENCE, "the node's view of the fleet to go stale", || async move {
        let r = http_get(node, "/readyz", None).await?.json();
        (r["limits_view_age_ms"].as_u64()? > 2_000).then_some(())
    })
    .await;
    let r = post(gw.node.addr, &gw.key, &body(PRIMARY)).await;
    blocked_well(&r, "gateway_rate_limited");
}

#[tokio::test]
async fn bad_limits_are_refused_naming_the_flag_and_nothing_changes() {
    let gw = Gateway::start().await;
    let control = gw.cp.url();
    for (args, says, code) in [
        (vec!["--rpm", "-5"], "--rpm", 2),
        (vec!["--rpm", "many"], "--rpm", 2),
        (vec!["--tpm", "0"], "--tpm", 2),
        (vec!["--usd-per-day", "0.1234567"], "6 decimals", 2),
        (vec!["--usd-per-day", "2e9"], "--usd-per-day", 2),
        (vec!["--clear", "--rpm", "5"], "--clear", 2),
        (vec![], "--rpm", 2),
    ] {
        let mut all = vec!["keys", "set-limits", gw.key_id.as_str()];
        all.extend(args.iter().copied());
        let out = cli(&control, &all).await;
        assert_eq!(out.code, Some(code), "{args:?}: {}", out.stderr);
        assert!(out.stderr.contains(says), "{args:?}: {}", out.stderr);
    }
    let out = cli(&control, &["keys", "set-limits", "key_nope", "--rpm", "5"]).await;
    assert_eq!(out.code, Some(1), "{}", out.stderr);
    let shown = cli(&control, &["keys", "show", &gw.key_id, "--json"]).await.json();
    assert!(shown["limits"].is_null(), "nothing stored: {shown}");
    // Lowered below what was used, a key is blocked at once, not at the next window.
    let set =
        cli(&control, &["keys", "set-limits", &gw.key_id, "--rpm", "3", "--json"]).await.json();
    wait_ready(gw.node.addr, set["version"].as_i64().unwrap()).await;
    for _ in 0..3 {
        assert_eq!(post(gw.node.addr, &gw.key, &body(PRIMARY)).await.status, 200);
    }
    let set =
        cli(&control, &["keys", "set-limits", &gw.key_id, "--rpm", "2", "--json"]).await.json();
    gw.wait_for(set["version"].as_i64().unwrap()).await;
    blocked_well(&post(gw.node.addr, &gw.key, &body(PRIMARY)).await, "gateway_rate_limited");
    let cleared =
        cli(&control, &["keys", "set-limits", &gw.key_id, "--clear", "--json"]).await.json();
    gw.wait_for(cleared["version"].as_i64().unwrap()).await;
    let r = post(gw.node.addr, &gw.key, &body(PRIMARY)).await;
    assert_eq!(r.status, 200);
    assert!(header(&r, "x-ratelimit-limit-requests").is_none(), "no limits, no headers");
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn the_official_openai_sdk_raises_rate_limit_error_with_the_gateways_headers() {
    let gw = Gateway::start().await;
    let set =
        cli(&gw.cp.url(), &["keys", "set-limits", &gw.key_id, "--rpm", "3", "--json"]).await.json();
    wait_ready(gw.node.addr, set["version"].as_i64().unwrap()).await;
    let base = format!("{}/v1", gw.node.url());
    let stdout = sdk_script("openai_sdk_limits.py", &[&base, &gw.key, PRIMARY]).await;
    let seen: Value = serde_json::from_str(stdout.trim()).unwrap();
    assert_eq!(seen["served"], 3, "{seen}");
    assert_eq!(seen["status"], 429);
    assert_eq!(seen["code"], "gateway_rate_limited");
    assert_eq!(seen["type"], "rate_limit_error");
    assert_eq!(seen["limit"], "3");
    assert_eq!(seen["remaining"], "0");
    assert!(seen["retry_after"].as_str().unwrap().parse::<u64>().unwrap() >= 1, "{seen}");
    assert!(seen["reset"].as_str().unwrap().ends_with('s'), "{seen}");
}

#[tokio::test]
async fn usage_since_a_time_counts_what_was_used_from_that_hour_on() {
    let gw = Gateway::start().await;
    for _ in 0..3 {
        assert_eq!(post(gw.node.addr, &gw.key, &body(PRIMARY)).await.status, 200);
    }
    let control = gw.cp.url();
    let key_id = gw.key_id.clone();
    let all = eventually(PATIENCE, "the usage to be reported", || {
        let (control, key_id) = (control.clone(), key_id.clone());
        async move {
            let rows = cli(&control, &["usage", "--key", &key_id, "--json"]).await.json();
            (rows[0]["requests"].as_u64()? == 3).then_some(rows)
        }
    })
    .await;
    // Everything this node run used came after an hour ago's hour.
    let since = cli(&control, &["usage", "--key", &gw.key_id, "--since", "1h", "--json"]).await;
    assert_eq!(since.json(), all);
    // Nothing came after a time to come.
    let later = cli(&control, &["usage", "--since", "2099-01-01T00:00:00Z", "--json"]).await.json();
    assert_eq!(later, json!([]));
    let bad = cli(&control, &["usage", "--since", "yesterday"]).await;
    assert_eq!(bad.code, Some(2), "{}", bad.stderr);
    assert!(bad.stderr.contains("--since") && bad.stderr.contains("RFC 3339"), "{}", bad.stderr);
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_burst_through_the_official_sdk_at_its_default_retries_completes_within_the_limit() {
    let gw = Gateway::start().await;
    let set =
        cli(&gw.cp.url(), &["keys", "set-limits", &gw.key_id, "--rpm", "3", "--json"]).await.json();
    wait_ready(gw.node.addr, set["version"].as_i64().unwrap()).await;
    // Five calls at 3 a minute: the fourth waits out the SDK's read of our Retry-After.
    let base = format!("{}/v1", gw.node.url());
    let stdout = sdk_script("openai_sdk_limits.py", &[&base, &gw.key, PRIMARY, "burst", "5"]).await;
    let seen: Value = serde_json::from_str(stdout.trim()).unwrap();
    assert_eq!(seen["failed"], json!([]), "{seen}");
    let done: Vec<f64> =
        seen["done"].as_array().unwrap().iter().map(|t| t.as_f64().unwrap()).collect();
    assert_eq!(done.len(), 5, "{seen}");
    // Never more than 3 answers in any minute: the SDK waited for room, it did not push
    // past. The node's window moves in whole seconds, the client's clock does not: a
    // minute here is 59 s.
    for (i, t) in done.iter().enumerate() {
        let in_window = done[i..].iter().filter(|u| **u < t + 59.0).count();
        assert!(in_window <= 3, "{in_window} answers within 59 s of {t} s: {done:?}");
    }
    assert!(done[3] >= 50.0, "the fourth waited for room: {done:?}");
    assert_eq!(gw.upstream_requests("primary").await, 5, "a refused call never went upstream");
}
