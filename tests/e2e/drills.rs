//! The five drills (`switchyard drill`) run against real processes: the simulator behind
//! real nodes and control planes. Each test checks the drill's own verdicts and, apart from
//! them, what the simulator, the nodes and the control plane saw, so a drill that judged
//! wrongly would fail here too.
#![allow(clippy::unwrap_used, clippy::expect_used)]

use std::process::Stdio;
use std::time::Duration;

use serde_json::{Value, json};
use switchyard_e2e::etcd::EtcdProcess;
use switchyard_e2e::gateway::*;
use switchyard_e2e::*;
use tokio::process::Command;

/// Runs `switchyard drill ARGS --json` against `control`.
async fn drill(control: &str, args: &[&str]) -> CliOutput {
    let mut all = vec!["drill"];
    all.extend_from_slice(args);
    all.push("--json");
    cli(control, &all).await
}

fn drill_args<'a>(scenario: &'a str, gw: &'a Gateway, node: &'a str) -> Vec<&'a str> {
    vec![scenario, "--node", node, "--key", &gw.key]
}

/// Every expectation of a drill's report, as (id, holds).
fn verdicts(report: &Value) -> Vec<(String, Option<bool>)> {
    report["expectations"]
        .as_array()
        .unwrap()
        .iter()
        .map(|e| (e["id"].as_str().unwrap().to_owned(), e["holds"].as_bool()))
        .collect()
}

fn all_hold(report: &Value, ids: &[&str]) {
    let found = verdicts(report);
    let want: Vec<(String, Option<bool>)> =
        ids.iter().map(|id| ((*id).to_owned(), Some(true))).collect();
    assert_eq!(found, want, "{report:#}");
    assert_eq!(report["faults_cleared"], true, "{report:#}");
    assert_eq!(report["passed"], true, "{report:#}");
}

async fn faults_in_force(control: &str) -> Vec<Value> {
    cli(control, &["chaos", "list", "--json"]).await.json().as_array().unwrap().clone()
}

/// A counter of the node's `/metrics`, summed over the series whose line holds `needle`.
async fn metric(node: std::net::SocketAddr, name: &str, needle: &str) -> f64 {
    let text = http_get(node, "/metrics", None).await.unwrap().body;
    text.lines()
        .filter(|l| l.starts_with(name) && l.contains(needle))
        .filter_map(|l| l.rsplit_once(' ')?.1.parse::<f64>().ok())
        .sum()
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn primary_down_on_etcd_opens_the_breaker_within_one_window_then_the_next_model_serves_without_primary_calls()
 {
    let etcd = EtcdProcess::start().await;
    let fleet = EtcdPair::start(&etcd).await;
    let (sim, cp1, cp2) = (&fleet.sim, &fleet.cp1, &fleet.cp2);
    let created = cli(&cp1.url(), &["keys", "create", "--name", "drill", "--json"]).await.json();
    let key = created["key"].as_str().unwrap().to_owned();
    let version = created["version"].as_i64().unwrap();
    // Each node follows a different replica first: the fault the drill stores through cp2
    // reaches node 1 through cp1 and etcd.
    let node1 = fleet.node("node1", cp1, cp2, version).await;
    let node2 = fleet.node("node2", cp2, cp1, version).await;

    let out = drill(
        &cp2.url(),
        &[
            "primary-down",
            "--node",
            &node1.url(),
            "--key",
            &key,
            "--model",
            PRIMARY,
            "--fallback-models",
            SECONDARY,
        ],
    )
    .await;
    let report = out.json();
    all_hold(
        &report,
        &[
            "breaker_opened_within_one_window",
            "no_primary_call_once_open",
            "served_by_the_next_model",
        ],
    );
    assert_eq!(report["chain"], json!([PRIMARY, SECONDARY]));
    let requests = report["requests"].as_u64().unwrap();
    assert_eq!(requests, 40);

    // What the node saw, apart from the drill's judgement: the fault answered every primary
    // call (the simulator got only the request before the drill), at most one window of
    // them (20 by default, plus the 3 others in flight), and the breaker opened once.
    let fault = report["faults"][0].as_str().unwrap().to_owned();
    let injected =
        metric(node1.addr, "switchyard_injected_faults_total", &format!(r#"fault="{fault}""#))
            .await;
    let primary_calls = report["primary_calls_per_request"].as_f64().unwrap() * requests as f64;
    assert_eq!(injected, primary_calls.round(), "{report:#}");
    assert!((1.0..=23.0).contains(&injected), "{injected} primary calls");
    let stats = http_get(sim.addr, "/_sim/stats", None).await.unwrap().json();
    assert_eq!(stats["models"]["primary"]["requests"], 1, "only the pre-drill request: {stats}");
    assert_eq!(stats["models"]["secondary"]["requests"], requests, "{stats}");
    let opened = metric(node1.addr, "switchyard_breaker_transitions_total", r#"to="open""#).await;
    assert_eq!(opened, 1.0);

    // The fault is gone from the store and from both nodes. The breaker it opened on node 1
    // was open for the whole fleet (docs/operating.md, "The fleet's breaker view"), so node 2
    // serves the primary again once the fleet's prober has found it healthy: within one
    // open-probe interval (5 s) and the relay. Wall time (real nodes' probes and heartbeats),
    // with 10 s to spare for a loaded machine.
    assert_eq!(faults_in_force(&cp1.url()).await, Vec::<Value>::new());
    let deadline = std::time::Instant::now() + std::time::Duration::from_secs(15);
    loop {
        let v = http_request(
            node2.addr,
            "POST",
            "/v1/chat/completions",
            Some(&key),
            Some(body(PRIMARY).to_string().as_bytes()),
        )
        .await
        .unwrap()
        .json();
        if v["model"] == PRIMARY {
            break;
        }
        assert!(std::time::Instant::now() < deadline, "node 2 never served the primary: {v}");
        tokio::time::sleep(std::time::Duration::from_millis(200)).await;
    }
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn primary_flaky_serves_every_request_without_flapping_and_reports_the_extra_cost() {
    let gw = Gateway::start().await;
    let node = gw.node.url();
    let mut args = drill_args("primary-flaky", &gw, &node);
    args.extend(["--model", PRIMARY, "--fallback-models", SECONDARY, "--requests", "60"]);
    let report = drill(&gw.cp.url(), &args).await.json();
    all_hold(&report, &["every_request_served", "no_flapping"]);

    // The cost, checked against the node and the simulator: every primary call was either
    // answered by the fault or reached the simulator (less the one before the drill).
    let fault = report["faults"][0].as_str().unwrap().to_owned();
    let injected =
        metric(gw.node.addr, "switchyard_injected_faults_total", &format!(r#"fault="{fault}""#))
            .await;
    let reached = gw.upstream_requests("primary").await as f64 - 1.0;
    let requests = report["requests"].as_f64().unwrap();
    let primary_calls = report["primary_calls_per_request"].as_f64().unwrap() * requests;
    assert_eq!(injected + reached, primary_calls.round(), "{report:#}");
    assert!(injected >= 1.0, "half the primary's calls fail: {injected}");
    let all_calls = report["upstream_calls_per_request"].as_f64().unwrap();
    assert!(all_calls > 1.0, "a flaky primary costs extra calls: {all_calls}");
    let transitions = report["breaker_transitions"][PRIMARY].as_u64().unwrap();
    assert!(transitions <= 3, "{transitions} transitions in a drill shorter than the cool-down");
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn stream_stall_ends_every_stream_with_an_error_frame_within_the_stall_timeout_and_closes_the_upstream_connection()
 {
    let gw = Gateway::start().await;
    // 20 chunks 100 ms apart: the upstream is still sending when the node gives up on the
    // stalled stream, so only closing the connection stops it.
    gw.script(
        "stally",
        json!({"kind": "ok", "text": "a b c d e f g h i j k l m n o p q r s t",
                                "chunks": 20, "chunk_delay_ms": 100}),
    )
    .await;
    let before = http_get(gw.sim.addr, "/_sim/stats", None).await.unwrap().json();
    let closed_before = before["connections"]["closed"].as_u64().unwrap();
    let node = gw.node.url();
    let mut args = drill_args("stream-stall", &gw, &node);
    args.extend(["--model", STALLY, "--requests", "4", "--concurrency", "2"]);
    let report = drill(&gw.cp.url(), &args).await.json();
    all_hold(
        &report,
        &["every_stream_ends_with_an_error_frame", "error_frame_within_stall_timeout"],
    );
    // The catalog gives the model stall_timeout_ms 1000: each stream waited it out, no more.
    // Wall time (a real node): 5 s of slack for a loaded machine, against the default 30 s
    // a node that missed the model's stall timeout would wait.
    let p50 = report["latency_ms"]["p50"].as_f64().unwrap();
    assert!((1000.0..6000.0).contains(&p50), "p50 {p50} ms");

    // Every stalled stream's upstream connection was closed by the node while the
    // simulator was still sending (it would have finished 2 s in), not left open or pooled.
    // A connection left open or pooled (kept 90 s when idle) outlasts this wait by far.
    let addr = gw.sim.addr;
    let stats = eventually(
        Duration::from_secs(10),
        "the stalled streams' upstream connections to close",
        || async move {
            let stats = http_get(addr, "/_sim/stats", None).await?.json();
            (stats["connections"]["closed"].as_u64()? >= closed_before + 4).then_some(stats)
        },
    )
    .await;
    assert_eq!(
        stats["models"]["stally"]["requests"], 5,
        "the pre-drill request and 4 streams: {stats}"
    );
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn all_down_answers_every_request_within_3s_and_a_model_outside_the_chain_keeps_serving() {
    let gw = Gateway::start().await;
    let node = gw.node.url();
    let mut args = drill_args("all-down", &gw, &node);
    args.extend(["--model", PRIMARY, "--fallback-models", SECONDARY]);
    let report = drill(&gw.cp.url(), &args).await.json();
    all_hold(&report, &["answered_within_3s", "a_model_outside_the_chain_serves"]);
    assert_eq!(report["faults"].as_array().unwrap().len(), 2, "one fault per model of the chain");
    // The report's own figure agrees with its verdict (the drill's 3 s is its rule, judged
    // by the drill on the real node's answers).
    assert!(report["latency_ms"]["p99"].as_f64().unwrap() < 3000.0);
    // The model outside the chain is the catalog's next one, and it really served: once
    // before the drill and five times during it.
    let detail = report["expectations"][1]["expectation"].as_str().unwrap();
    assert!(detail.contains(TERTIARY), "{detail}");
    assert_eq!(gw.upstream_requests("tertiary").await, 6);
    // The chain's models were never called during the drill: the faults answered.
    assert_eq!(gw.upstream_requests("primary").await, 1);
    assert_eq!(gw.upstream_requests("secondary").await, 0);
}

/// A breaker's state on the node: 0 closed, 1 half-open, 2 open.
async fn breaker_state(node: std::net::SocketAddr, upstream_model: &str) -> f64 {
    metric(node, "switchyard_breaker_state", &format!(r#"upstream_model="{upstream_model}""#)).await
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn all_down_then_primary_down_passes_twice_in_a_row_and_every_recovered_model_is_back_within_one_probe_interval()
 {
    let gw = Gateway::start().await;
    let node = gw.node.url();
    let chain = ["--model", PRIMARY, "--fallback-models", SECONDARY];
    for round in 0..2 {
        let mut args = drill_args("all-down", &gw, &node);
        args.extend(chain);
        let report = drill(&gw.cp.url(), &args).await.json();
        all_hold(&report, &["answered_within_3s", "a_model_outside_the_chain_serves"]);
        // It left both breakers open: every model of the chain failed a window of calls.
        for model in ["primary", "secondary"] {
            assert_eq!(breaker_state(gw.node.addr, model).await, 2.0, "round {round}: {model}");
        }
        if round == 1 {
            // No request at all: the node's own probes find both recovered within one open
            // probe interval (5 s by default) and a prober tick. Wall time (a real node's
            // probes): 5 s to spare for a loaded machine, and still well below the 30 s
            // cool-down after which requests, not probes, would test the models.
            eventually(Duration::from_secs(10), "both breakers closed by probes", || async {
                let primary = breaker_state(gw.node.addr, "primary").await;
                let secondary = breaker_state(gw.node.addr, "secondary").await;
                (primary == 0.0 && secondary == 0.0).then_some(())
            })
            .await;
        }
        // Straight after (round 0) or after the probes (round 1): the healthy fallback serves
        // every request while the primary is down, none fails on a breaker left open.
        let mut args = drill_args("primary-down", &gw, &node);
        args.extend(chain);
        let report = drill(&gw.cp.url(), &args).await.json();
        all_hold(
            &report,
            &[
                "breaker_opened_within_one_window",
                "no_primary_call_once_open",
                "served_by_the_next_model",
            ],
        );
    }
}

#[tokio::test]
async fn a_drill_refuses_a_node_that_is_down_a_wrong_key_or_a_chain_it_cannot_drill_before_injecting()
 {
    let gw = Gateway::start().await;
    let node = gw.node.url();
    let control = gw.cp.url();
    let cases: Vec<(Vec<&str>, &str)> = vec![
        (
            vec![
                "primary-down",
                "--node",
                "http://127.0.0.1:9",
                "--key",
                &gw.key,
                "--model",
                PRIMARY,
                "--fallback-models",
                SECONDARY,
            ],
            "does not answer",
        ),
        (
            vec![
                "primary-down",
                "--node",
                &node,
                "--key",
                "sy-not-a-key-of-this-fleet",
                "--model",
                PRIMARY,
                "--fallback-models",
                SECONDARY,
            ],
            "--key: the control plane knows no active API key",
        ),
        (
            vec!["primary-down", "--node", &node, "--key", &gw.key, "--model", PRIMARY],
            "needs a chain of two or more models",
        ),
        (
            vec!["all-down", "--node", &node, "--key", &gw.key, "--model", "sim/nope"],
            "--model \"sim/nope\": not in the catalog",
        ),
        (
            vec![
                "primary-down",
                "--node",
                &node,
                "--key",
                &gw.key,
                "--model",
                PRIMARY,
                "--fallback-models",
                "sim/nope",
            ],
            "--fallback-models: \"sim/nope\" is not in the catalog",
        ),
    ];
    for (args, says) in cases {
        let out = drill(&control, &args).await;
        assert_eq!(out.code, Some(1), "{args:?}: {}", out.stderr);
        assert!(out.stderr.contains(says), "{args:?}: {}", out.stderr);
        assert_eq!(faults_in_force(&control).await, Vec::<Value>::new(), "{args:?} injected");
    }
    for bad in [["--requests", "0"], ["--concurrency", "0"]] {
        let mut args = drill_args("primary-down", &gw, &node);
        args.extend(["--model", PRIMARY]);
        args.extend(bad);
        let out = drill(&control, &args).await;
        assert_eq!(out.code, Some(2), "{bad:?}: {}", out.stderr);
        assert!(out.stderr.contains(bad[0]), "{bad:?}: {}", out.stderr);
    }
    let out = drill(
        &control,
        &["primary-down", "--node", "127.0.0.1:1", "--key", &gw.key, "--model", PRIMARY],
    )
    .await;
    assert_eq!(out.code, Some(2), "{}", out.stderr);
    assert!(out.stderr.contains("--node"), "{}", out.stderr);
    assert_eq!(gw.upstream_total().await, 0, "a refused drill sends nothing upstream");
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn an_interrupted_drill_clears_its_fault_and_exits_130() {
    let gw = Gateway::start().await;
    let node = gw.node.url();
    let mut child = Command::new(switchyard_bin())
        .args(["drill", "stream-stall", "--node", &node, "--key", &gw.key, "--model", STALLY])
        .env("SWITCHYARD_CONTROL", gw.cp.url())
        .env("SWITCHYARD_ADMIN_TOKEN", ADMIN_TOKEN)
        .stdout(Stdio::null())
        .stderr(Stdio::piped())
        .kill_on_drop(true)
        .spawn()
        .unwrap();
    let control = gw.cp.url();
    eventually(PATIENCE, "the drill to inject its fault", || {
        let control = control.clone();
        async move { (!faults_in_force(&control).await.is_empty()).then_some(()) }
    })
    .await;
    let pid = child.id().unwrap().to_string();
    assert!(std::process::Command::new("kill").args(["-INT", &pid]).status().unwrap().success());
    let status =
        tokio::time::timeout(PATIENCE, child.wait()).await.expect("the drill exits").unwrap();
    assert_eq!(status.code(), Some(130));
    assert_eq!(faults_in_force(&control).await, Vec::<Value>::new());
    // And the node no longer applies it: a stream from the model runs to its end.
    let s = gw
        .stream(json!({"model": STALLY, "stream": true, "messages": [{"role": "user", "content": "hi"}]}))
        .await;
    assert!(s.error_frame().is_none(), "{:?}", s.frames);
}

/// What both continuing models answer: the same text, so the stream is whole byte for byte
/// whichever of them the node asks to continue it.
const CUT_TEXT: &str = "one two three four five six seven eight nine ten";

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn stream_cut_ends_every_stream_whole_with_one_continuation() {
    let gw = Gateway::start().await;
    for upstream in ["continues", "continues-too"] {
        gw.script(upstream, json!({"kind": "ok", "text": CUT_TEXT, "chunks": 5})).await;
    }
    let node = gw.node.url();
    let mut args = drill_args("stream-cut", &gw, &node);
    args.extend(["--model", CONTINUES, "--fallback-models", CONTINUES_TOO]);
    let report = drill(&gw.cp.url(), &args).await.json();
    all_hold(
        &report,
        &["every_stream_ends_complete", "one_continuation_each", "text_equals_a_healthy_stream"],
    );
    // 5 pieces: a cut after 3 would leave 2 and the finish chunk, which the same fault
    // (counting the finish chunk) cuts again; the drill cuts after 4, so each continuation
    // (1 piece and the finish) ends the answer.
    assert_eq!(report["cut_after"], 4, "{report:#}");
    assert_eq!(report["requests"], 8);
    // One stream at a time: each cut (a failure of the primary's call) is followed by its
    // continuation (a success), so the primary's failure rate stays under half and its
    // breaker (the default policy) never opens during the drill.
    assert_eq!(report["concurrency"], 1);
    assert_eq!(report["breaker_transitions"][CONTINUES], 0, "{report:#}");
    let whole = report["expectations"][2]["detail"].as_str().unwrap();
    assert_eq!(whole, format!("8 of 8 equal the {} bytes", CUT_TEXT.len()));

    // What the node and the simulator saw, apart from the drill's judgement: one
    // continuation per stream, and one upstream call for each of them on top of the plain
    // request and the two healthy streams before the fault and the eight cut streams.
    let continued = metric(gw.node.addr, "switchyard_stream_continuations_total", "").await;
    assert_eq!(continued, 8.0);
    let calls =
        gw.upstream_requests("continues").await + gw.upstream_requests("continues-too").await;
    assert_eq!(calls, 1 + 2 + 8 + 8);
    // The last call was a continuation: the delivered text as a final assistant message.
    let last =
        http_get(gw.sim.addr, "/_sim/last_request?model=continues", None).await.unwrap().json();
    let messages = last["body"]["messages"].as_array().unwrap();
    let prefill = messages.last().unwrap();
    assert_eq!(prefill["role"], "assistant", "{last:#}");
    assert!(CUT_TEXT.starts_with(prefill["content"].as_str().unwrap()), "{last:#}");
    assert_eq!(faults_in_force(&gw.cp.url()).await, Vec::<Value>::new());
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn stream_cut_refuses_a_chain_that_no_model_can_continue_before_injecting() {
    let gw = Gateway::start().await;
    let node = gw.node.url();
    let mut args = drill_args("stream-cut", &gw, &node);
    args.extend(["--model", PRIMARY, "--fallback-models", SECONDARY]);
    let out = drill(&gw.cp.url(), &args).await;
    assert_eq!(out.code, Some(1), "{}", out.stderr);
    assert!(
        out.stderr.contains(&format!("none of {PRIMARY}, {SECONDARY} has `continuation: prefill`")),
        "{}",
        out.stderr
    );
    assert_eq!(faults_in_force(&gw.cp.url()).await, Vec::<Value>::new());
    assert_eq!(gw.upstream_total().await, 0, "a refused drill sends nothing upstream");

    // --cut-after belongs to stream-cut alone: a usage mistake.
    let mut args = drill_args("stream-stall", &gw, &node);
    args.extend(["--model", STALLY, "--cut-after", "2"]);
    let out = drill(&gw.cp.url(), &args).await;
    assert_eq!(out.code, Some(2), "{}", out.stderr);
    assert!(out.stderr.contains("--cut-after goes with stream-cut"), "{}", out.stderr);
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn drills_run_through_the_messages_surface_as_an_anthropic_client_sends_them() {
    let gw = Gateway::start().await;
    let node = gw.node.url();
    let mut args = drill_args("primary-down", &gw, &node);
    args.extend(["--surface", "messages", "--model", PRIMARY, "--fallback-models", SECONDARY]);
    let report = drill(&gw.cp.url(), &args).await.json();
    all_hold(
        &report,
        &[
            "breaker_opened_within_one_window",
            "no_primary_call_once_open",
            "served_by_the_next_model",
        ],
    );
    assert_eq!(report["surface"], "messages", "{report:#}");
    // The requests really came through /v1/messages: the node counts their failovers under
    // that surface, and none under Chat Completions.
    let messages =
        metric(gw.node.addr, "switchyard_failovers_total", r#"surface="messages""#).await;
    assert_eq!(messages, report["requests"].as_f64().unwrap(), "every request failed over");
    assert_eq!(metric(gw.node.addr, "switchyard_failovers_total", r#"surface="chat""#).await, 0.0);

    // A stalled Messages stream ends with Anthropic's `error` event, which the drill reads.
    let mut args = drill_args("stream-stall", &gw, &node);
    args.extend(["--surface", "messages", "--model", STALLY, "--requests", "2"]);
    let report = drill(&gw.cp.url(), &args).await.json();
    all_hold(
        &report,
        &["every_stream_ends_with_an_error_frame", "error_frame_within_stall_timeout"],
    );
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn drills_run_through_the_responses_surface_as_an_openai_client_sends_them() {
    let gw = Gateway::start().await;
    let node = gw.node.url();
    let mut args = drill_args("primary-down", &gw, &node);
    args.extend(["--surface", "responses", "--model", PRIMARY, "--fallback-models", SECONDARY]);
    let report = drill(&gw.cp.url(), &args).await.json();
    all_hold(
        &report,
        &[
            "breaker_opened_within_one_window",
            "no_primary_call_once_open",
            "served_by_the_next_model",
        ],
    );
    assert_eq!(report["surface"], "responses", "{report:#}");
    let responses =
        metric(gw.node.addr, "switchyard_failovers_total", r#"surface="responses""#).await;
    assert_eq!(responses, report["requests"].as_f64().unwrap(), "every request failed over");
    assert_eq!(metric(gw.node.addr, "switchyard_failovers_total", r#"surface="chat""#).await, 0.0);

    // A stalled Responses stream ends with `response.failed`, which the drill reads.
    let mut args = drill_args("stream-stall", &gw, &node);
    args.extend(["--surface", "responses", "--model", STALLY, "--requests", "2"]);
    let report = drill(&gw.cp.url(), &args).await.json();
    all_hold(
        &report,
        &["every_stream_ends_with_an_error_frame", "error_frame_within_stall_timeout"],
    );

    // stream-cut counts continuations by a report Responses streams do not carry.
    let mut args = drill_args("stream-cut", &gw, &node);
    args.extend(["--surface", "responses", "--model", PRIMARY]);
    let out = drill(&gw.cp.url(), &args).await;
    assert_eq!(out.code, Some(2), "{}", out.stderr);
    assert!(out.stderr.contains("--surface responses"), "{}", out.stderr);
    assert_eq!(faults_in_force(&gw.cp.url()).await, Vec::<Value>::new());
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn stream_cut_through_the_messages_surface_is_a_usage_mistake_that_injects_nothing() {
    let gw = Gateway::start().await;
    let node = gw.node.url();
    let mut args = drill_args("stream-cut", &gw, &node);
    args.extend(["--surface", "messages", "--model", PRIMARY]);
    let out = drill(&gw.cp.url(), &args).await;
    assert_eq!(out.code, Some(2), "{}", out.stderr);
    assert!(out.stderr.contains("--surface messages"), "{}", out.stderr);
    assert_eq!(faults_in_force(&gw.cp.url()).await, Vec::<Value>::new());
}
