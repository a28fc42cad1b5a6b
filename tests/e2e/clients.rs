//! docs/clients.md and docs/http-api.md, "Response headers" and "Errors": what real clients
//! need to see a failover — the attempts where the OpenAI SDKs keep them, headers their
//! retry logic obeys, the served model in headers for clients that drop unknown fields, one
//! request id from the client to the provider and the failover event, the report once in a
//! stream. Real processes on loopback.
#![allow(clippy::unwrap_used, clippy::expect_used)]

use std::time::Duration;

use serde_json::{Value, json};
use switchyard_e2e::gateway::*;
use switchyard_e2e::{HttpResponse, cli, eventually};

fn chain(models: &[&str]) -> Value {
    json!({"models": models, "messages": [{"role": "user", "content": "hello"}]})
}

async fn all_down(gw: &Gateway) {
    for model in ["primary", "secondary"] {
        gw.script(model, json!({"kind": "status", "status": 503})).await;
    }
}

/// A 32-digit lowercase hex id: one the node made.
fn is_generated(id: &str) -> bool {
    id.len() == 32 && id.bytes().all(|b| b.is_ascii_digit() || (b'a'..=b'f').contains(&b))
}

fn request_id(r: &HttpResponse) -> String {
    r.header("x-request-id").unwrap_or_else(|| panic!("no x-request-id:\n{}", r.headers))
}

async fn upstream_request_id(gw: &Gateway, model: &str) -> Value {
    gw.last_upstream_request(model).await["headers"]["x-request-id"].clone()
}

// === 1. The attempts where the OpenAI SDKs keep them ===

#[tokio::test]
async fn an_all_models_failed_502_carries_its_attempts_under_error_too() {
    let gw = Gateway::start().await;
    all_down(&gw).await;
    let r = gw.chat(chain(&[PRIMARY, SECONDARY])).await;
    assert_eq!(r.status, 502, "{}", r.body);
    let v = r.json();
    assert_eq!(v["error"]["code"], "all_models_failed", "{v}");
    let in_error = &v["error"]["attempts"];
    assert_eq!(in_error.as_array().map(Vec::len), Some(2), "{v}");
    assert_eq!(in_error[0]["model"], PRIMARY, "{v}");
    assert_eq!(in_error[1]["reason"], "server_error", "{v}");
    assert_eq!(in_error, &v["secureai"]["attempts"], "the same attempts, kept where they were");

    let classic = gw.classic(chain(&[PRIMARY, SECONDARY])).await.json();
    assert_eq!(classic["attempts"].as_array().map(Vec::len), Some(2), "{classic}");
    assert!(classic.get("secureai").is_none(), "{classic}");
}

// === 2. Headers a client's retry logic obeys ===

#[tokio::test]
async fn a_failed_chain_tells_sdks_not_to_send_it_again() {
    let gw = Gateway::start().await;
    all_down(&gw).await;
    let r = gw.chat(chain(&[PRIMARY, SECONDARY])).await;
    assert_eq!(r.status, 502, "{}", r.body);
    assert_eq!(r.header("x-should-retry").as_deref(), Some("false"), "{}", r.headers);
    assert_eq!(r.header("retry-after"), None, "{}", r.headers);
}

#[tokio::test]
async fn an_all_rate_limited_429_says_retry_after_the_smallest_wait_a_provider_gave() {
    let gw = Gateway::start().await;
    gw.script("primary", json!({"kind": "status", "status": 429, "retry_after": 7})).await;
    gw.script("secondary", json!({"kind": "status", "status": 429, "retry_after": 3})).await;
    gw.script("tertiary", json!({"kind": "status", "status": 429, "retry_after": 5})).await;
    let r = gw.chat(chain(&[PRIMARY, SECONDARY, TERTIARY])).await;
    assert_eq!(r.status, 429, "{}", r.body);
    assert_eq!(r.json()["error"]["type"], "rate_limit_error", "{}", r.body);
    assert_eq!(r.header("retry-after").as_deref(), Some("3"), "{}", r.headers);
    assert_eq!(r.header("x-should-retry"), None, "a 429 may be retried, after the wait");
}

// === 3. The served model in headers ===

#[tokio::test]
async fn a_plain_failover_answer_names_the_served_and_requested_models_in_headers() {
    let gw = Gateway::start().await;
    gw.script("primary", json!({"kind": "status", "status": 503})).await;
    let r = gw.chat(chain(&[PRIMARY, SECONDARY])).await;
    assert_eq!(r.status, 200, "{}", r.body);
    assert_eq!(r.header("x-served-model").as_deref(), Some(SECONDARY), "{}", r.headers);
    assert_eq!(r.header("x-requested-model").as_deref(), Some(PRIMARY), "{}", r.headers);

    // A chain of one gets no report, in the body or in headers.
    let single = gw.chat(body(SECONDARY)).await;
    assert_eq!(single.status, 200, "{}", single.body);
    assert_eq!(single.header("x-served-model"), None, "{}", single.headers);
}

// === 4. One request id, from the client to the provider and the event ===

#[tokio::test]
async fn the_clients_request_id_is_echoed_and_sent_upstream() {
    let gw = Gateway::start().await;
    let id = "req_0f8e2a1c-6b3d.4e5f:9a7b/1c2d";
    let r = gw.chat_with(&[("x-request-id", id.as_bytes())], body(PRIMARY)).await;
    assert_eq!(r.status, 200, "{}", r.body);
    assert_eq!(request_id(&r), id);
    assert_eq!(upstream_request_id(&gw, "primary").await, id);
}

#[tokio::test]
async fn a_request_without_an_id_gets_one_on_every_answer_errors_included() {
    let gw = Gateway::start().await;
    let r = gw.chat(body(PRIMARY)).await;
    assert_eq!(r.status, 200, "{}", r.body);
    let id = request_id(&r);
    assert!(is_generated(&id), "{id}");
    assert_eq!(upstream_request_id(&gw, "primary").await, id.as_str(), "the provider got it");
    assert_ne!(request_id(&gw.chat(body(PRIMARY)).await), id, "each request has its own");

    let unauthenticated = gw.post("/v1/chat/completions", None, b"{}").await;
    assert_eq!(unauthenticated.status, 401);
    assert!(is_generated(&request_id(&unauthenticated)));
    let invalid = gw.chat(json!({"messages": []})).await;
    assert_eq!(invalid.status, 400);
    assert!(is_generated(&request_id(&invalid)));
    all_down(&gw).await;
    let failed = gw.chat_with(&[("x-request-id", b"failed-1")], chain(&[PRIMARY, SECONDARY])).await;
    assert_eq!(failed.status, 502);
    assert_eq!(request_id(&failed), "failed-1");
    let mut designed = chain(&[PRIMARY, SECONDARY]);
    designed["redundancy"] = json!({"degraded": {"message": "Back soon."}});
    let degraded = gw.chat(designed).await;
    assert_eq!(
        degraded.header("x-switchyard-degraded").as_deref(),
        Some("true"),
        "{}",
        degraded.body
    );
    assert!(is_generated(&request_id(&degraded)), "a degraded answer carries one too");
    assert_eq!(degraded.header("x-served-model").as_deref(), Some("switchyard/degraded"));
    assert_eq!(degraded.header("x-requested-model").as_deref(), Some(PRIMARY));
    let streamed = gw
        .stream(json!({"model": TERTIARY, "stream": true,
        "messages": [{"role": "user", "content": "hello"}]}))
        .await;
    assert_eq!(streamed.status, 200);
    assert!(streamed.header("x-request-id").as_deref().is_some_and(is_generated));
}

#[tokio::test]
async fn a_malformed_request_id_is_refused_and_replaced() {
    let gw = Gateway::start().await;
    let too_long = "a".repeat(129);
    let malformed: [&[u8]; 4] = [b"two words", b"tab\there", too_long.as_bytes(), b"caf\xc3\xa9"];
    for sent in malformed {
        let r = gw.chat_with(&[("x-request-id", sent)], body(PRIMARY)).await;
        assert_eq!(r.status, 200, "{}", r.body);
        let id = request_id(&r);
        assert!(is_generated(&id), "{sent:?} replaced: {id}");
        assert_eq!(upstream_request_id(&gw, "primary").await, id.as_str(), "{sent:?}");
    }
    let longest = "b".repeat(128);
    let r = gw.chat_with(&[("x-request-id", longest.as_bytes())], body(PRIMARY)).await;
    assert_eq!(request_id(&r), longest, "128 visible characters are kept");
}

#[tokio::test]
async fn the_failover_event_carries_the_request_id() {
    let gw = Gateway::start().await;
    gw.script("primary", json!({"kind": "status", "status": 503})).await;
    let r = gw.chat_with(&[("x-request-id", b"evt-req-42")], chain(&[PRIMARY, SECONDARY])).await;
    assert_eq!(r.status, 200, "{}", r.body);
    let control = gw.cp.url();
    let event = eventually(Duration::from_secs(10), "the failover event stored", || {
        let control = control.clone();
        async move {
            let out = cli(&control, &["events", "--json"]).await;
            out.stdout.lines().find_map(|l| serde_json::from_str::<Value>(l).ok())
        }
    })
    .await;
    assert_eq!(event["request_id"], "evt-req-42", "{event}");
    let text = cli(&gw.cp.url(), &["events"]).await;
    assert!(text.stdout.contains("request_id=evt-req-42"), "{}", text.stdout);
}

// === 5. The report once in a stream ===

#[tokio::test]
async fn a_streamed_failover_carries_its_report_in_exactly_one_chunk_the_first_with_content() {
    let gw = Gateway::start().await;
    gw.script("primary", json!({"kind": "status", "status": 503})).await;
    gw.script("secondary", json!({"kind": "ok", "text": "one two three"})).await;
    let mut request = chain(&[PRIMARY, SECONDARY]);
    request["stream"] = json!(true);
    let s = gw.stream(request).await;
    assert_eq!(s.status, 200);
    assert_eq!(s.text(), "one two three");
    let chunks = s.chunks();
    let carriers: Vec<usize> =
        (0..chunks.len()).filter(|i| chunks[*i].get("secureai").is_some()).collect();
    assert_eq!(carriers.len(), 1, "the report once: {chunks:?}");
    let first_content = chunks
        .iter()
        .position(|c| c["choices"][0]["delta"]["content"].as_str().is_some_and(|t| !t.is_empty()));
    assert_eq!(Some(carriers[0]), first_content, "{chunks:?}");
    assert_eq!(
        attempts(&chunks[carriers[0]]),
        [triple(PRIMARY, "failed", "server_error"), triple(SECONDARY, "served", "")]
    );
    assert_eq!(s.header("x-served-model").as_deref(), Some(SECONDARY));
}

// === The official OpenAI Python SDK, at its default retries ===

#[tokio::test]
async fn the_openai_python_sdk_at_default_retries_tries_a_failed_chain_once() {
    let gw = Gateway::start().await;
    all_down(&gw).await;
    let base = format!("{}/v1", gw.node.url());
    let stdout =
        switchyard_e2e::sdk_script("clients_sdk.py", &[&base, &gw.key, PRIMARY, SECONDARY]).await;
    let seen: Value = serde_json::from_str(stdout.trim()).unwrap();
    assert_eq!(seen["status"], 502, "{seen}");
    assert_eq!(seen["max_retries"], 2, "the SDK's default: {seen}");
    assert_eq!(seen["attempts"], json!([[PRIMARY, "failed"], [SECONDARY, "failed"]]), "{seen}");
    assert!(seen["request_id"].as_str().is_some_and(is_generated), "{seen}");
    assert_eq!(gw.upstream_requests("primary").await, 1, "one request per model");
    assert_eq!(gw.upstream_requests("secondary").await, 1, "one request per model");
}
