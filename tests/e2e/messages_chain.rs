//! The chain's rules on `/v1/messages` (docs/messages.md), over raw HTTP against real node,
//! control plane and simulator processes: a degraded answer in Anthropic's shape, plain and
//! streamed; a stream that fails before its first content delta fails over unseen, one that
//! breaks after it ends with Anthropic's `error` event; a first-token timeout fails over; the
//! key's token limit counts what the served model reported and refuses in Anthropic's shape.
#![allow(clippy::unwrap_used, clippy::expect_used)]

use serde_json::{Value, json};
use switchyard_e2e::gateway::*;
use switchyard_e2e::{HttpResponse, cli};

async fn messages(gw: &Gateway, body: Value) -> HttpResponse {
    gw.post("/v1/messages", Some(&gw.key), body.to_string().as_bytes()).await
}

fn body(model: &str, fallback: &[&str]) -> Value {
    json!({"model": model, "fallback_models": fallback, "max_tokens": 64,
           "messages": [{"role": "user", "content": "hello"}]})
}

/// A streamed answer's events, as (event name, data).
fn sse_events(r: &HttpResponse) -> Vec<(String, Value)> {
    r.body
        .split("\n\n")
        .filter_map(|frame| {
            let event = frame.lines().find_map(|l| l.strip_prefix("event: "))?;
            let data = frame.lines().find_map(|l| l.strip_prefix("data: "))?;
            Some((event.to_owned(), serde_json::from_str(data).unwrap_or(Value::Null)))
        })
        .collect()
}

fn names(events: &[(String, Value)]) -> Vec<&str> {
    events.iter().map(|(name, _)| name.as_str()).collect()
}

fn streamed_text(events: &[(String, Value)]) -> String {
    events
        .iter()
        .filter(|(name, _)| name == "content_block_delta")
        .filter_map(|(_, data)| data["delta"]["text"].as_str())
        .collect()
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_degraded_answer_comes_in_the_messages_shape_plain_and_streamed() {
    let gw = Gateway::start().await;
    for upstream in ["primary", "secondary"] {
        gw.script(upstream, json!({"kind": "status", "status": 503})).await;
    }
    let mut request = body(PRIMARY, &[SECONDARY]);
    request["redundancy"] = json!({"degraded": {"message": "Back in a minute."}});

    let r = messages(&gw, request.clone()).await;
    assert_eq!(r.status, 200, "{}", r.body);
    assert_eq!(r.header("x-switchyard-degraded").as_deref(), Some("true"));
    let v = r.json();
    assert_eq!(v["type"], "message", "{v}");
    assert_eq!(v["role"], "assistant", "{v}");
    assert_eq!(v["model"], "switchyard/degraded", "{v}");
    assert_eq!(v["content"], json!([{"type": "text", "text": "Back in a minute."}]), "{v}");
    assert_eq!(v["stop_reason"], "end_turn", "{v}");
    assert_eq!(v["secureai"]["degraded"]["reason"], "all_models_failed", "{v}");

    request["stream"] = json!(true);
    let r = messages(&gw, request).await;
    assert_eq!(r.status, 200, "{}", r.body);
    let events = sse_events(&r);
    assert_eq!(names(&events).first(), Some(&"message_start"), "{}", r.body);
    assert_eq!(names(&events).last(), Some(&"message_stop"), "{}", r.body);
    assert_eq!(events[0].1["message"]["model"], "switchyard/degraded", "{}", r.body);
    assert_eq!(streamed_text(&events), "Back in a minute.");
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_stream_failing_before_its_first_content_fails_over_unseen_and_one_breaking_after_ends_with_an_error_event()
 {
    let gw = Gateway::start().await;
    // Before the commit point: the primary's 503 is never seen; the fallback's stream is
    // the client's only one.
    gw.script("primary", json!({"kind": "status", "status": 503})).await;
    let mut request = body(PRIMARY, &[SECONDARY]);
    request["stream"] = json!(true);
    let r = messages(&gw, request.clone()).await;
    assert_eq!(r.status, 200, "{}", r.body);
    assert_eq!(r.header("x-served-model").as_deref(), Some(SECONDARY));
    let events = sse_events(&r);
    assert_eq!(names(&events).iter().filter(|n| **n == "message_start").count(), 1);
    assert_eq!(events[0].1["message"]["model"], SECONDARY, "{}", r.body);
    assert_eq!(streamed_text(&events), "Hello from secondary.");
    assert_eq!(names(&events).last(), Some(&"message_stop"), "{}", r.body);

    // After it: the answer the client has begun is not replaced; an Anthropic `error` event
    // ends it, and no `message_stop` follows.
    gw.script("primary", json!({"kind": "ok", "chunks": 5, "drop_after": 2})).await;
    let r = messages(&gw, request).await;
    assert_eq!(r.status, 200, "{}", r.body);
    let events = sse_events(&r);
    let (last, error) = events.last().unwrap();
    assert_eq!(last, "error", "{}", r.body);
    assert_eq!(error["type"], "error", "{error}");
    assert!(error["error"]["type"].as_str().is_some_and(|t| t.ends_with("_error")), "{error}");
    assert!(!streamed_text(&events).is_empty(), "content came before the break: {}", r.body);
    assert!(!names(&events).contains(&"message_stop"), "{}", r.body);
    assert_eq!(gw.upstream_requests("secondary").await, 1, "no second model after the commit");
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_first_token_timeout_on_a_messages_stream_fails_over() {
    let gw = Gateway::start().await;
    gw.script("primary", json!({"kind": "ok", "first_token_delay_ms": 5000})).await;
    let mut request = body(PRIMARY, &[SECONDARY]);
    request["stream"] = json!(true);
    request["redundancy"] = json!({"first_token_timeout_ms": 500});
    let r = messages(&gw, request).await;
    assert_eq!(r.status, 200, "{}", r.body);
    let events = sse_events(&r);
    let start = &events[0].1["message"];
    assert_eq!(start["model"], SECONDARY, "{}", r.body);
    let attempts = &start["secureai"]["failover"]["attempts"];
    assert_eq!(attempts[0]["reason"], "timeout", "{}", r.body);
    assert_eq!(streamed_text(&events), "Hello from secondary.");
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_keys_token_limit_counts_what_the_served_model_reported_and_refuses_in_anthropics_shape()
{
    let gw = Gateway::start().await;
    let set = cli(&gw.cp.url(), &["keys", "set-limits", &gw.key_id, "--tpm", "20", "--json"])
        .await
        .json();
    gw.wait_for(set["version"].as_i64().unwrap()).await;
    // The simulator counts words: "hello" in and "Hello from primary." out are 4 tokens.
    let mut admitted = 0;
    loop {
        let r = messages(&gw, body(PRIMARY, &[])).await;
        if r.status != 200 {
            assert_eq!(r.status, 429, "{}", r.body);
            let v = r.json();
            assert_eq!(v["type"], "error", "{v}");
            assert_eq!(v["error"]["type"], "rate_limit_error", "{v}");
            assert_eq!(v["error"]["code"], "gateway_rate_limited", "{v}");
            assert!(r.header("retry-after").is_some(), "{}", r.headers);
            break;
        }
        let usage = &r.json()["usage"];
        assert_eq!(
            (usage["input_tokens"].as_u64(), usage["output_tokens"].as_u64()),
            (Some(1), Some(3))
        );
        admitted += 1;
        assert!(admitted <= 5, "20 tokens per minute hold 5 such requests");
    }
    assert_eq!(admitted, 5);
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn an_anthropic_answer_that_breaks_the_asked_json_schema_fails_over_to_a_model_asked_for_the_same_schema()
 {
    let gw = Gateway::start().await;
    gw.script(ANTHROPIC_UPSTREAM, json!({"kind": "ok", "text": "Ada is 36."})).await;
    gw.script("secondary", json!({"kind": "ok", "text": r#"{"name": "Ada", "age": 36}"#})).await;
    let schema = json!({"type": "object", "required": ["name", "age"],
                        "properties": {"name": {"type": "string"}, "age": {"type": "integer"}}});
    let mut request = body(ANTHROPIC, &[SECONDARY]);
    request["output_config"] = json!({"format": {"type": "json_schema", "schema": schema}});
    request["redundancy"] = json!({"on": ["invalid_output"]});

    let r = messages(&gw, request).await;
    assert_eq!(r.status, 200, "{}", r.body);
    assert_eq!(r.header("x-dropped-hints"), None, "the schema is no hint: {}", r.body);
    let v = r.json();
    assert_eq!(v["model"], SECONDARY, "{v}");
    assert_eq!(v["content"][0]["text"], r#"{"name": "Ada", "age": 36}"#, "{v}");
    let attempts = &v["secureai"]["failover"]["attempts"];
    assert_eq!(attempts[0]["model"], ANTHROPIC, "{v}");
    assert_eq!(attempts[0]["reason"], "invalid_output", "{v}");
    // The Anthropic model got its own output_config; the OpenAI-kind one, the same schema
    // as Chat's response_format.
    let native = gw.last_upstream_request(ANTHROPIC_UPSTREAM).await;
    assert_eq!(native["body"]["output_config"]["format"]["schema"], schema, "{native}");
    let sent = gw.last_upstream_request("secondary").await;
    assert_eq!(sent["body"]["response_format"]["json_schema"]["schema"], schema, "{sent}");
}
