//! `invalid_output`, the opt-in failover reason (docs/http-api.md, "Structured outputs"): a
//! non-streaming answer that is not JSON valid against the request's `response_format` fails
//! over to the next model, never opening a breaker; real control plane, node and simulated
//! provider processes on loopback.
#![allow(clippy::unwrap_used, clippy::expect_used)]

use serde_json::{Value, json};
use switchyard_e2e::gateway::*;
use switchyard_e2e::{http_get, promtool};

/// A breaker that opens after four calls in its window at a 50 % failure rate, and a retry
/// policy that retries every reason it may twice: were invalid output counted against the
/// breaker or retried, these tests would see it.
const POLICIES: &str = "breaker_policy:
  window_size: 4
  min_requests: 4
  failure_rate_threshold: 0.5
  consecutive_timeouts: 5
  cooldown_ms: 60000
  max_cooldown_ms: 60000
  half_open_probes: 1
retry_policy:
  max_retries: 2
  base_backoff_ms: 10
  max_backoff_ms: 50
";

fn person_schema() -> Value {
    json!({"type": "object",
           "properties": {"name": {"type": "string"}, "age": {"type": "integer"}},
           "required": ["name", "age"], "additionalProperties": false})
}

fn json_schema_format() -> Value {
    json!({"type": "json_schema",
           "json_schema": {"name": "person", "strict": true, "schema": person_schema()}})
}

fn ok(text: &str) -> Value {
    json!({"kind": "ok", "text": text})
}

fn content(response: &Value) -> &str {
    response["choices"][0]["message"]["content"].as_str().unwrap_or_default()
}

async fn gateway() -> Gateway {
    Gateway::start_with(GatewayOptions { breaker_policy: POLICIES, ..Default::default() }).await
}

async fn metrics(gw: &Gateway) -> String {
    http_get(gw.node.addr, "/metrics", None).await.unwrap().body
}

/// The value of the sample written exactly as `series`, 0 when absent.
fn sample(metrics: &str, series: &str) -> f64 {
    metrics.lines().find_map(|l| l.strip_prefix(series)?.trim().parse().ok()).unwrap_or(0.0)
}

#[tokio::test]
async fn non_json_then_off_schema_then_valid_json_is_served_by_the_third_with_breakers_closed() {
    let gw = gateway().await;
    gw.script("primary", ok("Sure! Ada is 36.")).await;
    gw.script("secondary", ok(r#"{"name": "Ada", "age": "thirty-six"}"#)).await;
    let valid = r#"{"name": "Ada", "age": 36}"#;
    gw.script("tertiary", ok(valid)).await;
    let request = json!({"models": ALL_MODELS, "messages": [{"role": "user", "content": "Who?"}],
        "response_format": json_schema_format(),
        "redundancy": {"on": ["server_error", "invalid_output"]}});

    // More requests than the breaker's window: a breaker charged for invalid output would
    // open on the fourth, and the primary would be skipped from then on.
    for round in 0..6 {
        let r = gw.chat(request.clone()).await;
        assert_eq!(r.status, 200, "round {round}: {}", r.body);
        let v = r.json();
        assert_eq!(v["model"], TERTIARY, "round {round}");
        assert_eq!(content(&v), valid);
        assert_eq!(
            attempts(&v),
            [
                triple(PRIMARY, "failed", "invalid_output"),
                triple(SECONDARY, "failed", "invalid_output"),
                triple(TERTIARY, "served", ""),
            ],
            "round {round}"
        );
    }
    // One call per attempt: invalid output is never retried.
    for upstream in ["primary", "secondary", "tertiary"] {
        assert_eq!(gw.upstream_requests(upstream).await, 6, "{upstream}");
    }
    let m = metrics(&gw).await;
    for upstream in ["primary", "secondary", "tertiary"] {
        let state = format!(
            "switchyard_breaker_state{{provider=\"sim-us\",upstream_model=\"{upstream}\"}}"
        );
        assert_eq!(sample(&m, &state), 0.0, "{upstream}'s breaker is closed:\n{m}");
    }
    assert!(!m.contains("to=\"open\""), "no breaker ever opened:\n{m}");
    assert_eq!(
        sample(
            &m,
            &format!("switchyard_invalid_outputs_total{{model=\"{PRIMARY}\",kind=\"not_json\"}}")
        ),
        6.0,
        "{m}"
    );
    assert_eq!(
        sample(
            &m,
            &format!("switchyard_invalid_outputs_total{{model=\"{SECONDARY}\",kind=\"schema\"}}")
        ),
        6.0,
        "{m}"
    );
    assert_eq!(
        sample(
            &m,
            &format!(
                "switchyard_upstream_attempts_total{{model=\"{PRIMARY}\",status=\"failed\",reason=\"invalid_output\"}}"
            )
        ),
        6.0,
        "{m}"
    );
    let (passed, said) = promtool(&m).await;
    assert!(passed, "promtool check metrics:\n{said}");
}

#[tokio::test]
async fn without_invalid_output_in_on_the_first_answer_is_returned_as_is() {
    let gw = gateway().await;
    let prose = "Sure! Ada is 36.";
    gw.script("primary", ok(prose)).await;
    let r = gw
        .chat(json!({"models": [PRIMARY, SECONDARY],
            "messages": [{"role": "user", "content": "Who?"}],
            "response_format": json_schema_format()}))
        .await;
    assert_eq!(r.status, 200, "{}", r.body);
    let v = r.json();
    assert_eq!(v["model"], PRIMARY);
    assert_eq!(content(&v), prose);
    assert_eq!(gw.upstream_requests("secondary").await, 0);
}

#[tokio::test]
async fn json_object_with_non_json_content_fails_over() {
    let gw = gateway().await;
    gw.script("primary", ok("Here is your JSON: {\"ok\": true}")).await;
    gw.script("secondary", ok(r#"{"ok": true}"#)).await;
    let request = json!({"model": PRIMARY, "fallback_models": [SECONDARY],
        "messages": [{"role": "user", "content": "JSON please"}],
        "response_format": {"type": "json_object"},
        "redundancy": {"on": ["invalid_output"]}});
    let r = gw.chat(request.clone()).await;
    assert_eq!(r.status, 200, "{}", r.body);
    let v = r.json();
    assert_eq!(v["model"], SECONDARY);
    assert_eq!(content(&v), r#"{"ok": true}"#);
    let want = [triple(PRIMARY, "failed", "invalid_output"), triple(SECONDARY, "served", "")];
    assert_eq!(attempts(&v), want);
    // The classic endpoint reports the same under metadata.
    let r = gw.classic(request).await;
    assert_eq!(r.status, 200, "{}", r.body);
    assert_eq!(attempts(&r.json()), want);
}

#[tokio::test]
async fn the_openai_sdks_parse_gets_a_valid_object_through_a_chain_whose_first_model_breaks_the_json()
 {
    let gw = gateway().await;
    // Cut mid-object, as an answer stopped at its token limit is.
    gw.script("primary", ok(r#"{"name": "Ada", "age"#)).await;
    gw.script("secondary", ok(r#"{"name": "Ada", "age": 36}"#)).await;
    let base = format!("{}/v1", gw.node.url());
    let stdout =
        switchyard_e2e::sdk_script("invalid_output_sdk.py", &[&base, &gw.key, PRIMARY, SECONDARY])
            .await;
    let parsed: Value = serde_json::from_str(stdout.lines().last().unwrap()).unwrap();
    assert_eq!(parsed["parsed"], json!({"name": "Ada", "age": 36}), "{stdout}");
    assert_eq!(parsed["model"], SECONDARY);
    assert_eq!(parsed["reasons"], json!(["invalid_output", null]));
    // The schema the SDK sent is what the node checked against, and went upstream as sent.
    let sent = gw.last_upstream_request("secondary").await;
    assert_eq!(sent["body"]["response_format"]["type"], "json_schema", "{sent}");
}

#[tokio::test]
async fn invalid_output_without_a_json_response_format_and_an_invalid_schema_are_400s_before_any_call()
 {
    let gw = gateway().await;
    let messages = json!([{"role": "user", "content": "x"}]);
    for format in [None, Some(json!({"type": "text"}))] {
        let mut request = json!({"models": [PRIMARY, SECONDARY], "messages": messages,
            "redundancy": {"on": ["timeout", "invalid_output"]}});
        if let Some(format) = &format {
            request["response_format"] = format.clone();
        }
        let r = gw.chat(request).await;
        assert_eq!(r.status, 400, "{format:?}: {}", r.body);
        let e = &r.json()["error"];
        assert_eq!(e["param"], "redundancy.on", "{e}");
        assert_eq!(e["type"], "invalid_request_error");
        assert!(e["message"].as_str().unwrap().contains("response_format"), "{e}");
    }
    for schema in [
        json!({"type": "objekt"}),
        json!({"type": "object", "properties": {"age": {"type": 5}}}),
        json!({"type": "object", "required": "name"}),
    ] {
        let r = gw
            .chat(json!({"models": [PRIMARY, SECONDARY], "messages": messages,
                "response_format": {"type": "json_schema",
                                    "json_schema": {"name": "x", "schema": schema}},
                "redundancy": {"on": ["invalid_output"]}}))
            .await;
        assert_eq!(r.status, 400, "{schema}: {}", r.body);
        let e = &r.json()["error"];
        assert_eq!(e["param"], "response_format.json_schema.schema", "{e}");
    }
    // The classic endpoint names the field too.
    let r = gw
        .classic(json!({"model": PRIMARY, "messages": messages,
            "redundancy": {"on": ["invalid_output"]}}))
        .await;
    assert_eq!(r.status, 400, "{}", r.body);
    assert_eq!(r.json()["param"], "redundancy.on");
    assert_eq!(gw.upstream_total().await, 0, "refused before any upstream call");
}

#[tokio::test]
async fn a_keys_default_on_with_invalid_output_checks_only_requests_with_a_json_response_format() {
    let gw = gateway().await;
    gw.set_defaults(&[
        "--models",
        &format!("{PRIMARY},{SECONDARY}"),
        "--on",
        "server_error,invalid_output",
    ])
    .await;
    let prose = "Sure! Ada is 36.";
    gw.script("primary", ok(prose)).await;
    gw.script("secondary", ok(r#"{"name": "Ada", "age": 36}"#)).await;
    let messages = json!([{"role": "user", "content": "Who?"}]);

    // No response_format: nothing to check, and no 400 for the key's own `on`.
    let r = gw.chat(json!({"model": PRIMARY, "messages": messages})).await;
    assert_eq!(r.status, 200, "{}", r.body);
    assert_eq!(content(&r.json()), prose);

    let r = gw
        .chat(json!({"model": PRIMARY, "messages": messages,
            "response_format": json_schema_format()}))
        .await;
    assert_eq!(r.status, 200, "{}", r.body);
    let v = r.json();
    assert_eq!(v["model"], SECONDARY);
    assert_eq!(
        attempts(&v),
        [triple(PRIMARY, "failed", "invalid_output"), triple(SECONDARY, "served", "")]
    );
}

#[tokio::test]
async fn streams_are_not_validated() {
    let gw = gateway().await;
    let prose = "Sure! Ada is 36.";
    gw.script("primary", ok(prose)).await;
    let s = gw
        .stream(json!({"models": [PRIMARY, SECONDARY], "stream": true,
            "messages": [{"role": "user", "content": "Who?"}],
            "response_format": json_schema_format(),
            "redundancy": {"on": ["invalid_output"]}}))
        .await;
    assert_eq!(s.status, 200);
    assert_eq!(s.header("x-served-model").as_deref(), Some(PRIMARY));
    assert_eq!(s.text(), prose);
    assert_eq!(gw.upstream_requests("secondary").await, 0);
}
