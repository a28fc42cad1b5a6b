//! Degraded answers end to end: a key's or a request's designed answer when no model of the
//! chain can serve, with real processes and the simulator behind them.
#![allow(clippy::unwrap_used, clippy::expect_used)]

use std::path::PathBuf;
use std::process::Stdio;
use std::time::Instant;

use serde_json::{Value, json};
use switchyard_e2e::gateway::*;
use switchyard_e2e::*;
use tokio::io::{AsyncBufReadExt, BufReader};
use tokio::process::Command;

const MESSAGE: &str = "Summaries are unavailable right now; your text is saved.";
const SECRET: &str = "whsec_MfKQ9r8GKYqrTwjUPD8ILPZIo2LaLaSw";

fn chain_body() -> Value {
    json!({"model": PRIMARY, "fallback_models": [SECONDARY],
           "messages": [{"role": "user", "content": "summarise this"}]})
}

fn header(r: &HttpResponse, name: &str) -> Option<String> {
    r.headers.lines().find_map(|l| {
        let (k, v) = l.split_once(':')?;
        k.trim().eq_ignore_ascii_case(name).then(|| v.trim().to_owned())
    })
}

async fn down(gw: &Gateway) {
    gw.script("primary", json!({"kind": "status", "status": 503})).await;
    gw.script("secondary", json!({"kind": "status", "status": 500})).await;
}

fn reasons(report: &Value) -> Vec<(String, String)> {
    report["failover"]["attempts"]
        .as_array()
        .unwrap()
        .iter()
        .map(|a| {
            (a["status"].as_str().unwrap().to_owned(), a["reason"].as_str().unwrap().to_owned())
        })
        .collect()
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn after_every_attempt_fails_the_keys_degraded_answer_comes_plain_streamed_and_classic_and_is_never_billed()
 {
    let gw = Gateway::start().await;
    down(&gw).await;
    // Without a degraded answer the 502 of docs/http-api.md, "Errors", stands.
    let r = gw.chat(chain_body()).await;
    assert_eq!(r.status, 502, "{}", r.body);
    assert_eq!(r.json()["error"]["code"], "all_models_failed");

    let set = cli(
        &gw.cp.url(),
        &["keys", "set-defaults", &gw.key_id, "--degraded-message", MESSAGE, "--json"],
    )
    .await
    .json();
    assert_eq!(set["failoverDefaults"]["degraded"]["message"], MESSAGE, "{set}");
    assert_eq!(set["failoverDefaults"]["models"], json!([]), "a key may carry only the answer");
    gw.wait_for(set["version"].as_i64().unwrap()).await;

    let r = gw.chat(chain_body()).await;
    assert_eq!(r.status, 200, "{}", r.body);
    assert_eq!(header(&r, "x-switchyard-degraded").as_deref(), Some("true"));
    let v = r.json();
    assert_eq!(v["object"], "chat.completion");
    assert_eq!(v["model"], "switchyard/degraded");
    assert_eq!(v["choices"][0]["message"]["content"], MESSAGE);
    assert_eq!(v["choices"][0]["finish_reason"], "stop");
    assert_eq!(v["usage"]["total_tokens"], 0);
    assert_eq!(v["secureai"]["degraded"]["reason"], "all_models_failed");
    assert_eq!(v["secureai"]["requested_model"], PRIMARY);
    assert_eq!(
        reasons(&v["secureai"]),
        [
            ("failed".to_owned(), "server_error".to_owned()),
            ("failed".into(), "server_error".into())
        ]
    );

    let mut streamed = chain_body();
    streamed["stream"] = json!(true);
    let s = gw.stream(streamed).await;
    assert_eq!(s.status, 200);
    assert_eq!(s.header("x-switchyard-degraded").as_deref(), Some("true"));
    assert_eq!(s.frames.last().map(String::as_str), Some("[DONE]"), "{:?}", s.frames);
    let chunks = s.chunks();
    assert_eq!(chunks.len(), 1, "one content chunk, then [DONE]: {:?}", s.frames);
    assert_eq!(chunks[0]["choices"][0]["delta"]["content"], MESSAGE);
    assert_eq!(chunks[0]["model"], "switchyard/degraded");
    assert_eq!(chunks[0]["secureai"]["degraded"]["reason"], "all_models_failed");

    let r = gw.classic(chain_body()).await;
    assert_eq!(r.status, 200, "{}", r.body);
    let v = r.json();
    assert_eq!(v["success"], true);
    assert_eq!(v["data"]["choices"][0]["message"]["content"], MESSAGE);
    assert_eq!(v["metadata"]["degraded"]["reason"], "all_models_failed");
    assert!(v["data"].get("secureai").is_none(), "{v}");

    // A request's own answer replaces the key's.
    let mut own = chain_body();
    own["redundancy"] = json!({"degraded": {"message": "Try again in a minute."}});
    let v = gw.chat(own).await.json();
    assert_eq!(v["choices"][0]["message"]["content"], "Try again in a minute.");

    // Never billed: once a real answer's usage has reached the control plane, it is the
    // only usage there is.
    gw.script("secondary", json!({"kind": "ok"})).await;
    assert_eq!(gw.chat(chain_body()).await.json()["model"], SECONDARY);
    let control = gw.cp.url();
    let key_id = gw.key_id.clone();
    let rows = eventually(PATIENCE, "the served request's usage to be reported", || {
        let (control, key_id) = (control.clone(), key_id.clone());
        async move {
            let rows = cli(&control, &["usage", "--key", &key_id, "--json"]).await.json();
            let rows = rows.as_array()?.clone();
            (!rows.is_empty()).then_some(rows)
        }
    })
    .await;
    assert_eq!(rows.len(), 1, "{rows:?}");
    assert_eq!(rows[0]["model"], SECONDARY);
    assert_eq!(rows[0]["requests"], 1);
    let metrics = http_get(gw.node.addr, "/metrics", None).await.unwrap().body;
    let degraded: f64 = metrics
        .lines()
        .filter(|l| l.starts_with("switchyard_degraded_responses_total{"))
        .filter(|l| l.contains(r#"reason="all_models_failed""#))
        .map(|l| l.rsplit_once(' ').unwrap().1.parse::<f64>().unwrap())
        .sum();
    assert_eq!(degraded, 4.0, "{metrics}");
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn when_every_breaker_is_open_the_answer_comes_at_once_without_an_upstream_call() {
    let gw = Gateway::start_with(GatewayOptions {
        breaker_policy: "breaker_policy: {window_size: 2, min_requests: 2, cooldown_ms: 60000}\n",
        ..Default::default()
    })
    .await;
    down(&gw).await;
    let mut body = chain_body();
    body["redundancy"] = json!({"degraded": {"message": MESSAGE, "when_all_open": true}});
    // Two failing requests open both breakers; they are answered degraded too.
    for _ in 0..2 {
        let v = gw.chat(body.clone()).await.json();
        assert_eq!(v["secureai"]["degraded"]["reason"], "all_models_failed", "{v}");
    }
    let calls = gw.upstream_total().await;
    let bucket = |text: &str| -> f64 {
        text.lines()
            .find(|l| {
                l.starts_with("switchyard_http_request_duration_seconds_bucket{")
                    && l.contains(r#"endpoint="/v1/chat/completions""#)
                    && l.contains(r#"le="0.256""#)
            })
            .and_then(|l| l.rsplit_once(' ')?.1.parse().ok())
            .unwrap_or(0.0)
    };
    let before = bucket(&http_get(gw.node.addr, "/metrics", None).await.unwrap().body);
    let started = Instant::now();
    let r = gw.chat(body.clone()).await;
    let took = started.elapsed();
    assert_eq!(r.status, 200, "{}", r.body);
    let v = r.json();
    assert_eq!(v["secureai"]["degraded"]["reason"], "all_breakers_open", "{v}");
    assert_eq!(
        reasons(&v["secureai"]),
        [
            ("skipped".to_owned(), "circuit_open".to_owned()),
            ("skipped".into(), "circuit_open".into())
        ]
    );
    assert_eq!(gw.upstream_total().await, calls, "no upstream call, not even a probe");
    // At the node: the request's time, from its head to the answer's, fell in the 256 ms
    // bucket of the request-duration histogram. Wall time in a real process: a loaded
    // machine keeps that bound, and an answer that waited for a probe or an upstream timeout
    // would take seconds. What the node itself costs per request is measured by
    // `switchyard-bench` on a release build (docs/BENCHMARKS.md).
    let after = bucket(&http_get(gw.node.addr, "/metrics", None).await.unwrap().body);
    assert_eq!(after - before, 1.0, "the node answered within 256 ms (client saw {took:?})");

    // Without when_all_open the chain ends as all_models_failed, still without a call: the
    // node's own probes, not this request, test the open models.
    body["redundancy"]["degraded"]["when_all_open"] = json!(false);
    let v = gw.chat(body).await.json();
    assert_eq!(v["secureai"]["degraded"]["reason"], "all_models_failed", "{v}");
    assert_eq!(gw.upstream_total().await, calls, "no forced probe: {v}");
}

/// The official Standard Webhooks receiver of the webhook tests, on a port of its own.
async fn receiver(dir: &std::path::Path) -> (tokio::process::Child, String, PathBuf) {
    let script = PathBuf::from(env!("CARGO_MANIFEST_DIR")).join("../tests/e2e/webhook_receiver.py");
    let log = dir.join("receiver.jsonl");
    let mut child = Command::new(python())
        .arg(&script)
        .arg("0")
        .arg(SECRET)
        .arg(&log)
        .stdin(Stdio::null())
        .stdout(Stdio::piped())
        .kill_on_drop(true)
        .spawn()
        .unwrap();
    let mut lines = BufReader::new(child.stdout.take().unwrap()).lines();
    let line = tokio::time::timeout(PATIENCE, lines.next_line())
        .await
        .expect("the receiver starts")
        .unwrap()
        .expect("the receiver runs (is standardwebhooks in .venv? run .ci/run)");
    let addr = line.trim().strip_prefix("listening on ").unwrap().to_owned();
    tokio::spawn(async move { while let Ok(Some(_)) = lines.next_line().await {} });
    (child, addr, log)
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_degraded_answer_is_an_api_degraded_response_event_in_the_audit_log_and_at_a_webhook() {
    let dir = tempfile::tempdir().unwrap();
    let (_receiver, addr, log) = receiver(dir.path()).await;
    let sim = start_sim(dir.path().join("sim.log")).await;
    let cp = Proc::start(
        &[
            "control",
            "--store",
            &format!("file://{}", dir.path().join("store").display()),
            "--listen",
            "127.0.0.1:0",
        ],
        &[("SWITCHYARD_ADMIN_TOKEN", ADMIN_TOKEN), ("WEBHOOK_SECRET", SECRET)],
        dir.path().join("cp.log"),
    )
    .await;
    // Two subscriptions: only the one that asked for degraded answers gets this one.
    let hooks = format!(
        "webhooks:\n  - name: degraded\n    url: http://{addr}/degraded\n    secret: env:WEBHOOK_SECRET\n    internal: true\n    events: [\"api:degraded_response\"]\n  - name: failovers\n    url: http://{addr}/failovers\n    secret: env:WEBHOOK_SECRET\n    internal: true\n    events: [\"api:model_failover\"]\n"
    );
    let catalog = dir.path().join("catalog.yaml");
    let options =
        GatewayOptions { breaker_policy: Box::leak(hooks.into_boxed_str()), ..Default::default() };
    std::fs::write(&catalog, catalog_yaml(&sim.url(), &options)).unwrap();
    cli(&cp.url(), &["apply", "-f", &catalog.display().to_string(), "--json"]).await.json();
    let created = cli(&cp.url(), &["keys", "create", "--name", "e2e", "--json"]).await.json();
    let key_id = created["id"].as_str().unwrap().to_owned();
    let set =
        cli(&cp.url(), &["keys", "set-defaults", &key_id, "--degraded-message", MESSAGE, "--json"])
            .await
            .json();
    let node =
        start_node(&cp.url(), &dir.path().join("node"), "127.0.0.1:0", dir.path().join("node.log"))
            .await;
    let version = set["version"].as_i64().unwrap();
    let node_addr = node.addr;
    eventually(PATIENCE, "the node to apply the key", || async move {
        node_version(node_addr).await.filter(|v| *v >= version)
    })
    .await;
    for (model, behaviour) in [("primary", 503), ("secondary", 500)] {
        let body = json!({"model": model, "behaviour": {"kind": "status", "status": behaviour}});
        http_request(sim.addr, "POST", "/_sim/script", None, Some(body.to_string().as_bytes()))
            .await
            .unwrap();
    }
    let key = created["key"].as_str().unwrap();
    let r = http_request(
        node.addr,
        "POST",
        "/v1/chat/completions",
        Some(key),
        Some(chain_body().to_string().as_bytes()),
    )
    .await
    .unwrap();
    assert_eq!(r.json()["model"], "switchyard/degraded", "{}", r.body);

    let control = cp.url();
    let event = eventually(PATIENCE, "the event in the audit log", || {
        let control = control.clone();
        async move {
            let events = cli(&control, &["events", "--json"]).await;
            let events: Vec<Value> =
                events.stdout.lines().filter_map(|l| serde_json::from_str(l).ok()).collect();
            let flat: Vec<Value> = events
                .into_iter()
                .flat_map(|v| match v {
                    Value::Array(items) => items,
                    one => vec![one],
                })
                .collect();
            flat.into_iter().find(|e| e["degraded"] == "all_models_failed")
        }
    })
    .await;
    assert_eq!(event["key_id"], key_id);
    assert_eq!(event["requested_model"], PRIMARY);
    assert_eq!(event["served_model"], "switchyard/degraded");
    assert_eq!(event["attempts"].as_array().unwrap().len(), 2, "{event}");

    let log_for = log.clone();
    let payload = eventually(PATIENCE, "the webhook delivery", || {
        let log = log_for.clone();
        async move {
            std::fs::read_to_string(&log)
                .unwrap_or_default()
                .lines()
                .filter_map(|l| serde_json::from_str::<Value>(l).ok())
                .find(|r| r["path"] == "/degraded" && r["verified"] == true && r["status"] == 200)
                .map(|r| r["payload"].clone())
        }
    })
    .await;
    assert_eq!(payload["type"], "api:degraded_response", "{payload}");
    assert_eq!(payload["data"]["degraded"]["reason"], "all_models_failed");
    assert_eq!(payload["data"]["key_id"], key_id);
    assert_eq!(payload["data"]["requested_model"], PRIMARY);
    let to_failovers = std::fs::read_to_string(&log)
        .unwrap_or_default()
        .lines()
        .filter(|l| l.contains("\"/failovers\""))
        .count();
    assert_eq!(to_failovers, 0, "a degraded answer is not an api:model_failover");
}

#[tokio::test]
async fn a_bad_degraded_answer_is_refused_naming_the_field_and_nothing_changes() {
    let gw = Gateway::start().await;
    let long = "x".repeat(4097);
    for message in ["", long.as_str()] {
        let out =
            cli(&gw.cp.url(), &["keys", "set-defaults", &gw.key_id, "--degraded-message", message])
                .await;
        assert_eq!(out.code, Some(1), "{}", out.stderr);
        assert!(out.stderr.contains("failoverDefaults.degraded.message"), "{}", out.stderr);
    }
    let out =
        cli(&gw.cp.url(), &["keys", "set-defaults", &gw.key_id, "--degraded-when-all-open"]).await;
    assert_eq!(out.code, Some(2), "{}", out.stderr);
    assert!(out.stderr.contains("--degraded-message"), "{}", out.stderr);
    let shown = cli(&gw.cp.url(), &["keys", "show", &gw.key_id, "--json"]).await.json();
    assert!(shown["failoverDefaults"].is_null(), "nothing stored: {shown}");

    for (degraded, named) in [
        (json!({"message": ""}), "redundancy.degraded.message"),
        (json!({"message": "m", "when_all_open": "yes"}), "redundancy.degraded.when_all_open"),
        (json!({"message": "m", "tone": "calm"}), "redundancy.degraded.tone"),
    ] {
        let mut body = chain_body();
        body["redundancy"] = json!({"degraded": degraded});
        let r = gw.chat(body).await;
        assert_eq!(r.status, 400, "{}", r.body);
        assert_eq!(r.json()["error"]["param"], named);
    }
    assert_eq!(gw.upstream_total().await, 0, "refused before any upstream call");
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn the_all_down_drill_reports_the_keys_degraded_answers() {
    let gw = Gateway::start().await;
    let set = cli(
        &gw.cp.url(),
        &[
            "keys",
            "set-defaults",
            &gw.key_id,
            "--models",
            &format!("{PRIMARY},{SECONDARY}"),
            "--degraded-message",
            MESSAGE,
            "--json",
        ],
    )
    .await
    .json();
    gw.wait_for(set["version"].as_i64().unwrap()).await;
    let report = cli(
        &gw.cp.url(),
        &[
            "drill",
            "all-down",
            "--node",
            &gw.node.url(),
            "--key",
            &gw.key,
            "--model",
            PRIMARY,
            "--json",
        ],
    )
    .await
    .json();
    assert_eq!(report["passed"], true, "{report:#}");
    assert_eq!(report["chain"], json!([PRIMARY, SECONDARY]), "the key's default chain");
    let detail = report["expectations"][0]["detail"].as_str().unwrap();
    let requests = report["requests"].as_u64().unwrap();
    assert!(detail.contains(&format!("{requests} degraded")), "{detail}");
    assert!(detail.contains(&format!("200 degraded ×{requests}")), "{detail}");
}
