//! docs/http-api.md, clause by clause, for non-streaming requests: real control plane,
//! node and simulated provider processes on loopback.
#![allow(clippy::unwrap_used, clippy::expect_used)]

use std::time::{Duration, Instant};

use serde_json::json;
use switchyard_e2e::gateway::*;

fn msg() -> serde_json::Value {
    json!([{"role": "user", "content": "hello"}])
}

// === How a chain is formed ===

#[tokio::test]
async fn models_list_is_the_chain_and_overrides_model() {
    let gw = Gateway::start().await;
    gw.script("primary", json!({"kind": "status", "status": 503})).await;
    let r = gw
        .chat(json!({"model": TERTIARY, "models": [PRIMARY, SECONDARY], "messages": msg()}))
        .await;
    assert_eq!(r.status, 200, "{}", r.body);
    let v = r.json();
    assert_eq!(v["model"], SECONDARY);
    assert_eq!(v["secureai"]["requested_model"], PRIMARY);
    assert_eq!(v["secureai"]["served_model"], SECONDARY);
    assert_eq!(v["secureai"]["failover"]["occurred"], true);
    assert_eq!(
        attempts(&v),
        [triple(PRIMARY, "failed", "server_error"), triple(SECONDARY, "served", "")]
    );
    assert_eq!(gw.upstream_requests("tertiary").await, 0, "`model` is overridden by `models`");
}

#[tokio::test]
async fn model_with_fallback_models_forms_the_chain_in_order() {
    let gw = Gateway::start().await;
    gw.script("primary", json!({"kind": "status", "status": 500})).await;
    gw.script("secondary", json!({"kind": "status", "status": 502})).await;
    let r = gw
        .chat(
            json!({"model": PRIMARY, "fallback_models": [SECONDARY, TERTIARY], "messages": msg()}),
        )
        .await;
    assert_eq!(r.status, 200, "{}", r.body);
    let v = r.json();
    assert_eq!(v["model"], TERTIARY);
    assert_eq!(
        attempts(&v),
        [
            triple(PRIMARY, "failed", "server_error"),
            triple(SECONDARY, "failed", "server_error"),
            triple(TERTIARY, "served", "")
        ]
    );
    for a in v["secureai"]["failover"]["attempts"].as_array().unwrap() {
        assert!(a["latency_ms"].is_u64(), "latency_ms on every attempt: {a}");
    }
}

#[tokio::test]
async fn model_alone_starts_the_keys_default_chain_at_its_position() {
    let gw = Gateway::start().await;
    gw.set_defaults(&["--models", &format!("{PRIMARY},{SECONDARY},{TERTIARY}")]).await;
    gw.script("secondary", json!({"kind": "status", "status": 503})).await;
    let r = gw.chat(body(SECONDARY)).await;
    assert_eq!(r.status, 200, "{}", r.body);
    let v = r.json();
    assert_eq!(
        attempts(&v),
        [triple(SECONDARY, "failed", "server_error"), triple(TERTIARY, "served", "")]
    );
    assert_eq!(
        gw.upstream_requests("primary").await,
        0,
        "the chain starts at the requested model's position"
    );
}

#[tokio::test]
async fn model_alone_outside_the_defaults_is_a_single_attempt_without_report() {
    let gw = Gateway::start().await;
    gw.set_defaults(&["--models", &format!("{PRIMARY},{SECONDARY}")]).await;
    let r = gw.chat(body(TERTIARY)).await;
    assert_eq!(r.status, 200, "{}", r.body);
    let v = r.json();
    assert_eq!(v["model"], TERTIARY);
    assert!(v.get("secureai").is_none(), "a single-model request gets no failover report: {v}");
    assert_eq!(v["object"], "chat.completion");
}

#[tokio::test]
async fn duplicate_models_are_dropped_before_counting() {
    let gw = Gateway::start().await;
    gw.script("primary", json!({"kind": "status", "status": 503})).await;
    let r = gw
        .chat(json!({"models": [PRIMARY, PRIMARY, SECONDARY, PRIMARY, TERTIARY, SECONDARY], "messages": msg()}))
        .await;
    assert_eq!(r.status, 200, "{}", r.body);
    assert_eq!(
        attempts(&r.json()),
        [triple(PRIMARY, "failed", "server_error"), triple(SECONDARY, "served", "")]
    );
    assert_eq!(gw.upstream_requests("primary").await, 1, "a duplicate is not tried twice");
}

#[tokio::test]
async fn more_than_three_distinct_models_is_a_400_naming_models() {
    let gw = Gateway::start().await;
    let r = gw
        .chat(json!({"models": [PRIMARY, SECONDARY, TERTIARY, EU_MODEL], "messages": msg()}))
        .await;
    assert_eq!(r.status, 400, "{}", r.body);
    assert_eq!(r.json()["error"]["param"], "models");
    let r = gw.chat(json!({"model": PRIMARY, "fallback_models": [SECONDARY, TERTIARY, EU_MODEL], "messages": msg()})).await;
    assert_eq!(r.status, 400, "{}", r.body);
    assert_eq!(gw.upstream_total().await, 0, "never silently truncated, never sent");
}

#[tokio::test]
async fn models_together_with_fallback_models_is_a_400() {
    let gw = Gateway::start().await;
    let r = gw
        .chat(json!({"models": [PRIMARY], "fallback_models": [SECONDARY], "messages": msg()}))
        .await;
    assert_eq!(r.status, 400, "{}", r.body);
    assert_eq!(r.json()["error"]["param"], "fallback_models");
    assert_eq!(gw.upstream_total().await, 0);
}

#[tokio::test]
async fn entry_timeouts_override_chain_wide_ones_for_that_attempt() {
    let gw = Gateway::start().await;
    gw.script("primary", json!({"kind": "hang"})).await;
    let started = Instant::now();
    let r = gw
        .chat(json!({
            "models": [{"model": PRIMARY, "timeout_ms": 1000}, SECONDARY],
            "redundancy": {"timeout_ms": 30000},
            "messages": msg()
        }))
        .await;
    assert_eq!(r.status, 200, "{}", r.body);
    let v = r.json();
    assert_eq!(
        attempts(&v),
        [triple(PRIMARY, "failed", "timeout"), triple(SECONDARY, "served", "")]
    );
    // Wall time: a real node times out a real hung upstream. The bounds only have to tell
    // the entry's 1 s from the chain's 30 s, so they leave a loaded machine many seconds.
    let first = v["secureai"]["failover"]["attempts"][0]["latency_ms"].as_u64().unwrap();
    assert!(
        (1000..10_000).contains(&first),
        "the entry's 1000 ms applied, not the chain's 30 s: {first}"
    );
    let took = started.elapsed();
    assert!(took < Duration::from_secs(15), "the chain's 30 s applied: {took:?}");
}

#[tokio::test]
async fn an_unknown_model_is_a_400_model_not_found_before_any_upstream_call() {
    let gw = Gateway::start().await;
    let r = gw.chat(json!({"models": [PRIMARY, "sim/nope"], "messages": msg()})).await;
    assert_eq!(r.status, 400, "{}", r.body);
    let v = r.json();
    assert_eq!(v["error"]["code"], "model_not_found");
    assert_eq!(v["error"]["param"], "models[1]");
    assert!(v["error"]["message"].as_str().unwrap().contains("sim/nope"));
    assert_eq!(gw.upstream_total().await, 0);
}

#[tokio::test]
async fn a_model_the_key_may_not_use_is_a_403_before_any_upstream_call() {
    let gw = Gateway::start().await;
    let limited = gw.create_key(&["--allowed-models", &format!("{PRIMARY},{SECONDARY}")]).await;
    let r = gw
        .post(
            "/v1/chat/completions",
            Some(&limited),
            json!({"models": [PRIMARY, TERTIARY], "messages": msg()}).to_string().as_bytes(),
        )
        .await;
    assert_eq!(r.status, 403, "{}", r.body);
    assert_eq!(r.json()["error"]["param"], "models[1]");
    assert!(r.body.contains(TERTIARY));
    let us_only = gw.create_key(&["--allowed-regions", "us"]).await;
    let r = gw
        .post(
            "/v1/chat/completions",
            Some(&us_only),
            json!({"model": PRIMARY, "fallback_models": [EU_MODEL], "messages": msg()})
                .to_string()
                .as_bytes(),
        )
        .await;
    assert_eq!(r.status, 403, "a model in another region is refused: {}", r.body);
    assert_eq!(gw.upstream_total().await, 0);
}

// === Chain-wide options ===

#[tokio::test]
async fn redundancy_values_out_of_range_are_400s_naming_the_field() {
    let gw = Gateway::start().await;
    for (redundancy, param) in [
        (json!({"timeout_ms": 999}), "redundancy.timeout_ms"),
        (json!({"timeout_ms": 300001}), "redundancy.timeout_ms"),
        (json!({"first_token_timeout_ms": 499}), "redundancy.first_token_timeout_ms"),
        (json!({"first_token_timeout_ms": 60001}), "redundancy.first_token_timeout_ms"),
        (json!({"deadline_ms": 10}), "redundancy.deadline_ms"),
        (json!({"on": ["server_error", "bad_gateway"]}), "redundancy.on[1]"),
        (json!({"on": "timeout"}), "redundancy.on"),
        (json!({"retries": 3}), "redundancy.retries"),
    ] {
        let r =
            gw.chat(json!({"model": PRIMARY, "redundancy": redundancy, "messages": msg()})).await;
        assert_eq!(r.status, 400, "{redundancy}: {}", r.body);
        assert_eq!(r.json()["error"]["param"], param, "{redundancy}");
    }
    assert_eq!(gw.upstream_total().await, 0);
}

#[tokio::test]
async fn a_failure_whose_reason_is_not_in_on_ends_the_chain() {
    let gw = Gateway::start().await;
    gw.script("primary", json!({"kind": "status", "status": 503})).await;
    let r = gw
        .chat(json!({"models": [PRIMARY, SECONDARY], "redundancy": {"on": ["timeout", "rate_limit"]}, "messages": msg()}))
        .await;
    assert_eq!(r.status, 502, "{}", r.body);
    let v = r.json();
    assert_eq!(v["error"]["code"], "all_models_failed");
    assert_eq!(attempts(&v), [triple(PRIMARY, "failed", "server_error")]);
    assert_eq!(gw.upstream_requests("secondary").await, 0);
}

#[tokio::test]
async fn the_deadline_bounds_the_whole_chain() {
    let gw = Gateway::start().await;
    gw.script("primary", json!({"kind": "hang"})).await;
    gw.script("secondary", json!({"kind": "hang"})).await;
    let started = Instant::now();
    let r = gw
        .chat(json!({
            "models": [PRIMARY, SECONDARY, TERTIARY],
            "redundancy": {"timeout_ms": 1000, "deadline_ms": 2500},
            "messages": msg()
        }))
        .await;
    let took = started.elapsed();
    assert_eq!(r.status, 502, "{}", r.body);
    // Two 1 s attempts leave 0.5 s, less than the fair minimum: the third is not started.
    assert_eq!(
        attempts(&r.json()),
        [triple(PRIMARY, "failed", "timeout"), triple(SECONDARY, "failed", "timeout")]
    );
    assert_eq!(gw.upstream_requests("tertiary").await, 0);
    // Wall time (a real node and simulator): the answer is not held past the deadline. The
    // attempts above show the third model was never started; 3.5 s past the 2.5 s deadline
    // is a loaded machine's slack and still far below an answer that waited for anything.
    assert!(took < Duration::from_millis(2500 + 3500), "the chain kept to its deadline: {took:?}");
}

// === Failover triggers ===

async fn fails_over_on(behaviour: serde_json::Value, reason: &str) {
    let gw = Gateway::start().await;
    gw.script("primary", behaviour).await;
    let r = gw
        .chat(json!({"model": PRIMARY, "fallback_models": [SECONDARY], "redundancy": {"timeout_ms": 1000}, "messages": msg()}))
        .await;
    assert_eq!(r.status, 200, "{}", r.body);
    assert_eq!(
        attempts(&r.json()),
        [triple(PRIMARY, "failed", reason), triple(SECONDARY, "served", "")]
    );
}

#[tokio::test]
async fn fails_over_on_server_error() {
    fails_over_on(json!({"kind": "status", "status": 503}), "server_error").await;
}

#[tokio::test]
async fn fails_over_on_rate_limit() {
    fails_over_on(json!({"kind": "status", "status": 429}), "rate_limit").await;
}

#[tokio::test]
async fn fails_over_on_connection_reset() {
    fails_over_on(json!({"kind": "reset"}), "connection_error").await;
}

#[tokio::test]
async fn fails_over_on_connection_refused() {
    let gw = Gateway::start().await;
    let r = gw
        .chat(json!({"model": "nowhere/model", "fallback_models": [SECONDARY], "messages": msg()}))
        .await;
    assert_eq!(r.status, 200, "{}", r.body);
    assert_eq!(
        attempts(&r.json()),
        [triple("nowhere/model", "failed", "connection_error"), triple(SECONDARY, "served", "")]
    );
}

#[tokio::test]
async fn fails_over_on_timeout() {
    fails_over_on(json!({"kind": "hang"}), "timeout").await;
}

#[tokio::test]
async fn fails_over_on_a_malformed_upstream_body_as_server_error() {
    fails_over_on(json!({"kind": "malformed"}), "server_error").await;
}

#[tokio::test]
async fn the_clients_own_4xx_from_upstream_is_returned_at_once_without_failover() {
    let gw = Gateway::start().await;
    gw.script("primary", json!({"kind": "status", "status": 400, "message": "max_tokens is too large for this model"})).await;
    let r =
        gw.chat(json!({"model": PRIMARY, "fallback_models": [SECONDARY], "messages": msg()})).await;
    assert_eq!(r.status, 400, "{}", r.body);
    let v = r.json();
    assert_eq!(v["error"]["message"], "max_tokens is too large for this model");
    assert_eq!(v["error"]["type"], "invalid_request_error");
    assert_eq!(
        gw.upstream_requests("secondary").await,
        0,
        "never fail over on the client's own mistake"
    );
}

/// Ten words: longer than the 8-token windows, shorter than `CTX_LARGE`'s 100.
fn long_prompt() -> serde_json::Value {
    json!([{"role": "user", "content": "one two three four five six seven eight nine ten"}])
}

#[tokio::test]
async fn a_context_length_refusal_fails_over_to_the_first_larger_window_skipping_smaller_ones() {
    let gw = Gateway::start().await;
    // The simulator's models refuse what their scripted window cannot hold, each in its
    // provider's own shape (OpenAI's `context_length_exceeded`, Anthropic's "prompt is too
    // long", Gemini's input token count past the maximum).
    let refuse = json!({"kind": "ok", "context_window": 8});
    gw.script("ctx-smaller", json!({"kind": "ok", "context_window": 4})).await;
    gw.script("ctx-large", json!({"kind": "ok", "text": "the large model read it all"})).await;
    for (first, upstream) in
        [(CTX_SMALL, "ctx-small"), (ANTHROPIC, ANTHROPIC_UPSTREAM), (GEMINI, GEMINI_UPSTREAM)]
    {
        gw.script(upstream, refuse.clone()).await;
        let large_before = gw.upstream_requests("ctx-large").await;
        let r = gw
            .chat(json!({"models": [first, CTX_SMALLER, CTX_LARGE], "messages": long_prompt()}))
            .await;
        assert_eq!(r.status, 200, "{first}: {}", r.body);
        let v = r.json();
        assert_eq!(v["model"], CTX_LARGE, "{first}");
        assert_eq!(v["choices"][0]["message"]["content"], "the large model read it all");
        assert_eq!(
            attempts(&v),
            [
                triple(first, "failed", "context_length"),
                triple(CTX_SMALLER, "skipped", "context_window"),
                triple(CTX_LARGE, "served", ""),
            ],
            "{first}"
        );
        assert_eq!(gw.upstream_requests(upstream).await, 1, "{first}: one attempt, no retry");
        assert_eq!(gw.upstream_requests("ctx-large").await, large_before + 1);
    }
    assert_eq!(gw.upstream_requests("ctx-smaller").await, 0, "a smaller window is never called");
}

#[tokio::test]
async fn a_context_length_refusal_with_no_larger_window_after_it_is_the_400_at_once() {
    let gw = Gateway::start().await;
    gw.script("ctx-small", json!({"kind": "ok", "context_window": 8})).await;
    // ctx-smaller (4) is not larger; SECONDARY declares no window, so it is not either.
    let r = gw
        .chat(json!({"models": [CTX_SMALL, CTX_SMALLER, SECONDARY], "messages": long_prompt()}))
        .await;
    assert_eq!(r.status, 400, "{}", r.body);
    let v = r.json();
    assert_eq!(v["error"]["code"], "context_length_exceeded");
    assert_eq!(v["error"]["type"], "invalid_request_error");
    assert!(
        v["error"]["message"]
            .as_str()
            .unwrap()
            .starts_with("This model's maximum context length is 8"),
        "the upstream's own message: {v}"
    );
    assert_eq!(attempts(&v["error"]), [triple(CTX_SMALL, "failed", "context_length")]);
    assert_eq!(gw.upstream_requests("ctx-small").await, 1, "one attempt");
    assert_eq!(gw.upstream_requests("ctx-smaller").await, 0);
    assert_eq!(gw.upstream_requests("secondary").await, 0);

    // Without `context_length` in `on`, a larger window is not tried either.
    let r = gw
        .chat(json!({"models": [CTX_SMALL, CTX_LARGE], "messages": long_prompt(),
                     "redundancy": {"on": ["server_error"]}}))
        .await;
    assert_eq!(r.status, 400, "{}", r.body);
    assert_eq!(gw.upstream_requests("ctx-large").await, 0);
}

#[tokio::test]
async fn an_upstream_401_tries_the_providers_reserve_credential() {
    let gw = Gateway::start_with(GatewayOptions {
        api_keys: r#"["env:SIM_PRIMARY_KEY", "env:SIM_RESERVE_KEY"]"#,
        node_env: vec![("SIM_PRIMARY_KEY", "sk-expired"), ("SIM_RESERVE_KEY", "sk-reserve")],
        ..GatewayOptions::default()
    })
    .await;
    let r = switchyard_e2e::http_request(
        gw.sim.addr,
        "PUT",
        "/_sim/keys",
        None,
        Some(br#"["sk-reserve"]"#),
    )
    .await
    .unwrap();
    assert!(r.status < 300);
    let res =
        gw.chat(json!({"model": PRIMARY, "fallback_models": [SECONDARY], "messages": msg()})).await;
    assert_eq!(res.status, 200, "{}", res.body);
    let v = res.json();
    assert_eq!(v["model"], PRIMARY, "served by the same model, with its reserve credential");
    assert_eq!(attempts(&v), [triple(PRIMARY, "served", "")]);
    let last = gw.last_upstream_request("primary").await;
    assert_eq!(last["headers"]["authorization"], "Bearer sk-reserve", "{last}");
    assert!(!res.body.contains("sk-"), "no credential reaches the client");
}

// === What comes back ===

#[tokio::test]
async fn the_classic_endpoint_wraps_the_completion_with_success_and_metadata() {
    let gw = Gateway::start().await;
    gw.script("primary", json!({"kind": "status", "status": 503})).await;
    let r = gw
        .classic(json!({"model": PRIMARY, "fallback_models": [SECONDARY], "messages": msg()}))
        .await;
    assert_eq!(r.status, 200, "{}", r.body);
    let v = r.json();
    assert_eq!(v["success"], true);
    assert_eq!(v["data"]["object"], "chat.completion");
    assert_eq!(v["data"]["model"], SECONDARY);
    assert_eq!(v["metadata"]["served_model"], SECONDARY);
    assert_eq!(v["metadata"]["requested_model"], PRIMARY);
    assert_eq!(v["metadata"]["failover"]["occurred"], true);
    assert!(v["data"].get("secureai").is_none());
}

#[tokio::test]
async fn all_attempts_rate_limited_is_a_429() {
    let gw = Gateway::start().await;
    gw.script("primary", json!({"kind": "status", "status": 429})).await;
    gw.script("secondary", json!({"kind": "status", "status": 429})).await;
    let r = gw.chat(json!({"models": [PRIMARY, SECONDARY], "messages": msg()})).await;
    assert_eq!(r.status, 429, "{}", r.body);
    let v = r.json();
    assert_eq!(v["error"]["code"], "all_models_failed");
    assert_eq!(
        v["error"]["message"],
        format!("All 2 model attempt(s) failed (last: {SECONDARY} — rate_limit)")
    );
    assert_eq!(attempts(&v).len(), 2, "attempts under secureai.attempts: {v}");
}

#[tokio::test]
async fn all_attempts_failed_for_mixed_reasons_is_a_502_with_the_specs_bodies() {
    let gw = Gateway::start().await;
    gw.script("primary", json!({"kind": "status", "status": 429})).await;
    gw.script("secondary", json!({"kind": "reset"})).await;
    gw.script("tertiary", json!({"kind": "status", "status": 500})).await;
    let body = json!({"models": [PRIMARY, SECONDARY, TERTIARY], "messages": msg()});
    let r = gw.chat(body.clone()).await;
    assert_eq!(r.status, 502, "{}", r.body);
    let v = r.json();
    assert_eq!(v["error"]["code"], "all_models_failed");
    assert_eq!(
        v["error"]["message"],
        format!("All 3 model attempt(s) failed (last: {TERTIARY} — server_error)")
    );
    assert_eq!(
        attempts(&v),
        [
            triple(PRIMARY, "failed", "rate_limit"),
            triple(SECONDARY, "failed", "connection_error"),
            triple(TERTIARY, "failed", "server_error")
        ]
    );
    let c = gw.classic(body).await;
    assert_eq!(c.status, 502);
    let cv = c.json();
    assert_eq!(cv["success"], false);
    assert_eq!(cv["error"], "All model attempts failed");
    assert_eq!(
        cv["message"],
        format!("All 3 model attempt(s) failed (last: {TERTIARY} — server_error)")
    );
    assert_eq!(cv["attempts"].as_array().unwrap().len(), 3);
}

#[tokio::test]
async fn a_failed_single_model_request_gets_the_status_rule_without_a_report() {
    let gw = Gateway::start().await;
    gw.script("primary", json!({"kind": "status", "status": 429})).await;
    let r = gw.chat(body(PRIMARY)).await;
    assert_eq!(r.status, 429, "{}", r.body);
    let v = r.json();
    assert!(v.get("secureai").is_none(), "{v}");
    assert!(v["error"]["message"].is_string());
    gw.script("primary", json!({"kind": "status", "status": 503})).await;
    assert_eq!(gw.chat(body(PRIMARY)).await.status, 502);
}

#[tokio::test]
async fn every_other_openai_field_passes_through_untouched() {
    let gw = Gateway::start().await;
    let sent = json!({
        "model": PRIMARY,
        "fallback_models": [SECONDARY],
        "redundancy": {"timeout_ms": 20000},
        "messages": [{"role": "system", "content": "be brief"}, {"role": "user", "content": "héllo"}],
        "temperature": 0.25,
        "max_completion_tokens": 77,
        "tools": [{"type": "function", "function": {"name": "lookup", "parameters": {"type": "object"}}}],
        "user": "customer-42",
        "metadata": {"trace": "abc"},
        "seed": 7
    });
    assert_eq!(gw.chat(sent.clone()).await.status, 200);
    let upstream = gw.last_upstream_request("primary").await["body"].clone();
    let mut expected = sent;
    let obj = expected.as_object_mut().unwrap();
    obj.remove("fallback_models");
    obj.remove("redundancy");
    obj.insert("model".into(), json!("primary"));
    assert_eq!(
        upstream, expected,
        "the upstream got the client's fields, the upstream model name, nothing of ours"
    );
}

// === Circuit breakers ===

/// [`BREAKER_OF_FOUR`] with the node's probes off: a user request is the half-open test.
const BREAKER_UNPROBED: &str = "breaker_policy:
  window_size: 4
  min_requests: 4
  failure_rate_threshold: 0.5
  consecutive_timeouts: 5
  cooldown_ms: 1500
  max_cooldown_ms: 6000
  half_open_probes: 1
probe:
  interval_ms: 0
  open_interval_ms: 0
";

/// A counter of the node's `/metrics`, summed over the series whose line holds `needle`.
async fn node_counter(gw: &Gateway, name: &str, needle: &str) -> u64 {
    let text = switchyard_e2e::http_get(gw.node.addr, "/metrics", None).await.unwrap().body;
    text.lines()
        .filter(|l| l.starts_with(name) && l.contains(needle))
        .filter_map(|l| l.rsplit_once(' ')?.1.parse::<f64>().ok())
        .sum::<f64>() as u64
}

#[tokio::test]
async fn an_open_breaker_skips_its_entry_then_the_nodes_probe_closes_it_when_the_primary_recovers()
{
    let gw = Gateway::start_with(GatewayOptions {
        breaker_policy: BREAKER_OF_FOUR,
        ..GatewayOptions::default()
    })
    .await;
    gw.script("primary", json!({"kind": "status", "status": 503})).await;
    let req = json!({"model": PRIMARY, "fallback_models": [SECONDARY], "messages": msg()});
    for _ in 0..4 {
        assert_eq!(gw.chat(req.clone()).await.status, 200);
    }
    let seen = gw.upstream_requests("primary").await;
    assert_eq!(seen, 4);
    // Open: the primary gets no more requests and the report says so.
    for _ in 0..5 {
        let v = gw.chat(req.clone()).await.json();
        assert_eq!(
            attempts(&v),
            [triple(PRIMARY, "skipped", "circuit_open"), triple(SECONDARY, "served", "")]
        );
    }
    assert_eq!(gw.upstream_requests("primary").await, seen, "no network call while open");
    let breakers = switchyard_e2e::eventually(
        switchyard_e2e::PATIENCE,
        "switchyard breakers to show it open",
        || async {
            let out = switchyard_e2e::cli(&gw.cp.url(), &["breakers", "--json"]).await;
            let list = serde_json::from_str::<serde_json::Value>(&out.stdout).ok()?;
            let open = list
                .as_array()?
                .iter()
                .find(|b| b["upstream_model"] == "primary" && b["state"] == "open")?
                .clone();
            Some(open)
        },
    )
    .await;
    assert_eq!(breakers["provider"], "sim-us");
    assert!(breakers["next_probe_unix_ms"].as_i64().unwrap() > 0, "{breakers}");
    let metrics = switchyard_e2e::http_get(gw.node.addr, "/metrics", None).await.unwrap().body;
    assert!(
        metrics
            .contains("switchyard_breaker_state{provider=\"sim-us\",upstream_model=\"primary\"} 2"),
        "{metrics}"
    );
    assert!(
        metrics.contains("switchyard_upstream_attempts_total{model=\"sim/primary\",status=\"skipped\",reason=\"circuit_open\"} 5"),
        "{metrics}"
    );
    assert!(
        metrics.contains(
            "switchyard_failovers_total{requested_model=\"sim/primary\",served_model=\"sim/secondary\",surface=\"chat\"} 9"
        ),
        "four failed + five skipped, all served by the fallback: {metrics}"
    );

    // The primary recovers: the node's own probe (every 5 s by default while open) finds it,
    // and closes the breaker; no user request was its test.
    gw.script("primary", json!({"kind": "ok"})).await;
    switchyard_e2e::eventually(
        switchyard_e2e::PATIENCE,
        "a probe to close the breaker",
        || async {
            let out = switchyard_e2e::cli(&gw.cp.url(), &["breakers", "--json"]).await;
            let list = serde_json::from_str::<serde_json::Value>(&out.stdout).ok()?;
            list.as_array()?
                .iter()
                .any(|b| b["upstream_model"] == "primary" && b["state"] == "closed")
                .then_some(())
        },
    )
    .await;
    for _ in 0..4 {
        let v = gw.chat(req.clone()).await.json();
        assert_eq!(attempts(&v), [triple(PRIMARY, "served", "")], "closed again: {v}");
    }
    let probes = node_counter(&gw, "switchyard_probes_total", r#"upstream_model="primary""#).await;
    assert!(probes >= 1, "closed by a probe");
    assert_eq!(gw.upstream_requests("primary").await, seen + probes + 4);
}

#[tokio::test]
async fn with_probes_off_an_open_breaker_lets_a_user_request_test_it_after_the_cooldown() {
    let gw = Gateway::start_with(GatewayOptions {
        breaker_policy: BREAKER_UNPROBED,
        ..GatewayOptions::default()
    })
    .await;
    gw.script("primary", json!({"kind": "status", "status": 503})).await;
    let req = json!({"model": PRIMARY, "fallback_models": [SECONDARY], "messages": msg()});
    for _ in 0..4 {
        assert_eq!(gw.chat(req.clone()).await.status, 200);
    }
    let seen = gw.upstream_requests("primary").await;
    let v = gw.chat(req.clone()).await.json();
    assert_eq!(
        attempts(&v),
        [triple(PRIMARY, "skipped", "circuit_open"), triple(SECONDARY, "served", "")]
    );
    let breakers = switchyard_e2e::eventually(
        switchyard_e2e::PATIENCE,
        "switchyard breakers to show it open",
        || async {
            let out = switchyard_e2e::cli(&gw.cp.url(), &["breakers", "--json"]).await;
            let list = serde_json::from_str::<serde_json::Value>(&out.stdout).ok()?;
            list.as_array()?
                .iter()
                .find(|b| b["upstream_model"] == "primary" && b["state"] == "open")
                .cloned()
        },
    )
    .await;
    // After the cool-down a user request goes through as the half-open test; the primary
    // has recovered, so it closes.
    gw.script("primary", json!({"kind": "ok"})).await;
    let next_probe = breakers["next_probe_unix_ms"].as_i64().unwrap();
    switchyard_e2e::eventually(
        switchyard_e2e::PATIENCE,
        "the cool-down to end at the breaker's next_probe_unix_ms",
        || async { (switchyard_e2e::now_ms() > next_probe).then_some(()) },
    )
    .await;
    let v = gw.chat(req.clone()).await.json();
    assert_eq!(attempts(&v), [triple(PRIMARY, "served", "")], "{v}");
    for _ in 0..3 {
        let v = gw.chat(req.clone()).await.json();
        assert_eq!(v["model"], PRIMARY, "closed again");
    }
    assert_eq!(gw.upstream_requests("primary").await, seen + 4);
    assert_eq!(node_counter(&gw, "switchyard_probes_total", "primary").await, 0, "no probe");
}

#[tokio::test]
async fn with_probes_off_and_every_breaker_open_each_entry_is_forced_soonest_first_and_a_healthy_one_serves()
 {
    // A cool-down far longer than the test: every forced probe comes before it ends.
    let gw = Gateway::start_with(GatewayOptions {
        breaker_policy: "breaker_policy: {window_size: 4, min_requests: 4, cooldown_ms: 20000, max_cooldown_ms: 60000}
probe: {interval_ms: 0, open_interval_ms: 0}
",
        ..GatewayOptions::default()
    })
    .await;
    gw.script("primary", json!({"kind": "status", "status": 503})).await;
    gw.script("secondary", json!({"kind": "status", "status": 503})).await;
    let req = json!({"models": [PRIMARY, SECONDARY], "messages": msg()});
    for _ in 0..4 {
        assert_eq!(gw.chat(req.clone()).await.status, 502);
    }
    let before = gw.upstream_total().await;
    let r = gw.chat(req.clone()).await;
    assert_eq!(r.status, 502, "{}", r.body);
    let list = r.json()["secureai"]["attempts"].clone();
    let probes: Vec<_> = list.as_array().unwrap().iter().filter(|a| a["probe"] == true).collect();
    assert_eq!(probes.len(), 2, "each open entry was probed once: {list}");
    assert_eq!(gw.upstream_total().await, before + 2, "one network call per entry");
    // Failed forced probes never lengthen a cool-down: both are open on their first one.
    let r = gw.chat(req.clone()).await;
    assert_eq!(r.status, 502, "{}", r.body);
    let open = switchyard_e2e::eventually(
        switchyard_e2e::PATIENCE,
        "both breakers open after their probes",
        || async {
            let out = switchyard_e2e::cli(&gw.cp.url(), &["breakers", "--json"]).await;
            let list = serde_json::from_str::<serde_json::Value>(&out.stdout).ok()?;
            let open: Vec<_> = list
                .as_array()?
                .iter()
                .filter(|b| b["state"] == "open" && b["cause"] == "probe_failed")
                .cloned()
                .collect();
            (open.len() == 2).then_some(open)
        },
    )
    .await;
    for b in open {
        assert_eq!(b["cooldown_ms"], 20000, "{b}");
    }

    // The fallback recovers while the primary stays down: it serves at once, as a probe,
    // although the primary's breaker is due first.
    gw.script("secondary", json!({"kind": "ok"})).await;
    let v = gw.chat(req.clone()).await.json();
    assert_eq!(v["model"], SECONDARY, "{v}");
    assert_eq!(v["secureai"]["failover"]["attempts"][1]["probe"], true, "{v}");
    // And closed: the next request is served by it without a probe.
    let v = gw.chat(req.clone()).await.json();
    assert_eq!(
        attempts(&v),
        [triple(PRIMARY, "skipped", "circuit_open"), triple(SECONDARY, "served", "")],
        "{v}"
    );
}

// === Auth and bad input ===

#[tokio::test]
async fn missing_unknown_and_revoked_keys_get_401_invalid_api_key() {
    let gw = Gateway::start().await;
    let body = switchyard_e2e::gateway::body(PRIMARY).to_string();
    for key in [None, Some("sy-not-a-key")] {
        let r = gw.post("/v1/chat/completions", key, body.as_bytes()).await;
        assert_eq!(r.status, 401, "{}", r.body);
        assert_eq!(r.json()["error"]["code"], "invalid_api_key");
    }
    let revoked = cli_revoke(&gw).await;
    let r = gw.post("/v1/chat/completions", Some(&revoked), body.as_bytes()).await;
    assert_eq!(r.status, 401);
    // The key is checked before the body: garbage with no key is still a 401.
    assert_eq!(gw.post("/v1/chat/completions", None, b"{{{").await.status, 401);
    assert_eq!(gw.upstream_total().await, 0);
}

async fn cli_revoke(gw: &Gateway) -> String {
    let out = switchyard_e2e::cli(&gw.cp.url(), &["keys", "create", "--name", "gone", "--json"])
        .await
        .json();
    let id = out["id"].as_str().unwrap();
    let revoked = switchyard_e2e::cli(&gw.cp.url(), &["keys", "revoke", id, "--json"]).await.json();
    gw.wait_for(revoked["version"].as_i64().unwrap()).await;
    out["key"].as_str().unwrap().to_owned()
}

#[tokio::test]
async fn bad_input_gets_a_clear_4xx_naming_the_field_and_no_upstream_call() {
    let gw = Gateway::start().await;
    let cases: Vec<(Vec<u8>, u16, serde_json::Value)> = vec![
        (b"{\"model\": \"sim/primary\", \"messages\": [".to_vec(), 400, json!(null)),
        (b"\"just a string\"".to_vec(), 400, json!(null)),
        (json!({"model": 42, "messages": msg()}).to_string().into_bytes(), 400, json!("model")),
        (
            json!({"model": PRIMARY, "messages": "hi"}).to_string().into_bytes(),
            400,
            json!("messages"),
        ),
        (
            json!({"model": PRIMARY, "messages": []}).to_string().into_bytes(),
            400,
            json!("messages"),
        ),
        (
            json!({"model": PRIMARY, "messages": msg(), "stream": "yes"}).to_string().into_bytes(),
            400,
            json!("stream"),
        ),
        (
            json!({"model": PRIMARY, "messages": msg(), "redundancy": {"timeout": 5}})
                .to_string()
                .into_bytes(),
            400,
            json!("redundancy.timeout"),
        ),
        (json!({"messages": msg()}).to_string().into_bytes(), 400, json!("model")),
    ];
    for (body, status, param) in cases {
        let r = gw.post("/v1/chat/completions", Some(&gw.key), &body).await;
        assert_eq!(r.status, status, "{}: {}", String::from_utf8_lossy(&body), r.body);
        let v = r.json();
        assert_eq!(v["error"]["param"], param, "{}", r.body);
        assert!(!v["error"]["message"].as_str().unwrap().is_empty());
    }
    let huge = json!({"model": PRIMARY, "messages": [{"role": "user", "content": "x".repeat(5 * 1024 * 1024)}]}).to_string();
    let r = gw.post("/v1/chat/completions", Some(&gw.key), huge.as_bytes()).await;
    assert_eq!(r.status, 413, "{}", &r.body[..r.body.len().min(300)]);
    assert_eq!(gw.upstream_total().await, 0, "nothing bad reached the provider");
}

#[tokio::test]
async fn the_models_endpoint_lists_what_the_key_may_use() {
    let gw = Gateway::start().await;
    let limited = gw.create_key(&["--allowed-models", PRIMARY]).await;
    let r = switchyard_e2e::http_get(gw.node.addr, "/v1/models", Some(&limited)).await.unwrap();
    assert_eq!(r.status, 200);
    let v = r.json();
    assert_eq!(v["object"], "list");
    let ids: Vec<_> = v["data"]
        .as_array()
        .unwrap()
        .iter()
        .map(|m| m["id"].as_str().unwrap().to_owned())
        .collect();
    assert_eq!(ids, [PRIMARY]);
}

// === Operations ===

#[tokio::test]
async fn a_stalled_request_head_is_cut_off_by_the_header_read_timeout_a_slow_answer_is_not() {
    use tokio::io::{AsyncReadExt, AsyncWriteExt};
    let gw = Gateway::start_with(GatewayOptions {
        node_args: vec!["--header-read-timeout", "300ms"],
        ..GatewayOptions::default()
    })
    .await;
    // A raw socket: half a request head, which no HTTP client sends.
    let mut slow = tokio::net::TcpStream::connect(gw.node.addr).await.unwrap();
    slow.write_all(b"POST /v1/chat/completions HTTP/1.1\r\nHost: node\r\n").await.unwrap();
    let sent_at = Instant::now();
    // Whatever the node says before closing, the connection must end: read to EOF.
    let mut rest = Vec::new();
    let read = tokio::time::timeout(Duration::from_secs(10), slow.read_to_end(&mut rest)).await;
    assert!(read.is_ok(), "the node still holds the half-sent request after 10 s");
    assert!(sent_at.elapsed() >= Duration::from_millis(250), "closed before the timeout");
    // A client that sends its request promptly is served as usual, also when the answer
    // takes longer than the timeout: the clock runs only while a head is awaited.
    gw.script("primary", json!({"kind": "ok", "delay_ms": 800})).await;
    let r = gw.chat(body(PRIMARY)).await;
    assert_eq!(r.status, 200, "{}", r.body);
    assert_eq!(gw.upstream_total().await, 1, "the half-sent request never reached a provider");
}

#[tokio::test]
async fn a_node_stopped_with_ctrl_c_finishes_the_request_in_flight_then_exits() {
    // Held, so that once the node is gone no other process can be listening there.
    let mut gw =
        Gateway::start_with(GatewayOptions { hold_node_port: true, ..GatewayOptions::default() })
            .await;
    gw.script("primary", json!({"kind": "ok", "delay_ms": 1500})).await;
    let addr = gw.node.addr;
    let key = gw.key.clone();
    let in_flight = tokio::spawn(async move {
        let body = json!({"model": PRIMARY, "messages": msg()}).to_string();
        switchyard_e2e::http_request(
            addr,
            "POST",
            "/v1/chat/completions",
            Some(&key),
            Some(body.as_bytes()),
        )
        .await
    });
    switchyard_e2e::eventually(
        switchyard_e2e::PATIENCE,
        "the request to reach the simulator",
        || async { (gw.upstream_requests("primary").await > 0).then_some(()) },
    )
    .await;
    let pid = gw.node.child.id().unwrap().to_string();
    let signalled = std::process::Command::new("kill").args(["-INT", &pid]).status().unwrap();
    assert!(signalled.success());
    let stopped_at = Instant::now();

    let r = in_flight.await.unwrap().expect("the in-flight request got a response");
    assert_eq!(r.status, 200, "{}", r.body);
    assert_eq!(r.json()["model"], PRIMARY);
    // Wall time (a real process): 5 s is a loaded machine's slack, against the 30 s drain
    // timeout a node that waited it out would take.
    let exit = tokio::time::timeout(Duration::from_secs(5), gw.node.child.wait())
        .await
        .expect("the node exits once its last request is answered")
        .unwrap();
    assert!(exit.success(), "{exit:?}");
    assert!(stopped_at.elapsed() >= Duration::from_millis(500), "it waited for the request");
    assert!(
        tokio::net::TcpStream::connect(addr).await.is_err(),
        "no new connection is accepted after the stop"
    );
}

#[tokio::test]
async fn server_logs_written_to_a_file_carry_no_colour_codes() {
    let gw = Gateway::start().await;
    gw.script("primary", json!({"kind": "status", "status": 503})).await;
    let r =
        gw.chat(json!({"model": PRIMARY, "fallback_models": [SECONDARY], "messages": msg()})).await;
    assert_eq!(r.status, 200, "{}", r.body);
    // Each server's stderr is a file here, as under systemd or Kubernetes.
    for (name, log) in [("node", gw.node.log_text()), ("control plane", gw.cp.log_text())] {
        assert!(!log.trim().is_empty(), "the {name} logged nothing");
        assert!(!log.contains('\u{1b}'), "escape codes in the {name}'s log:\n{log}");
    }
}
