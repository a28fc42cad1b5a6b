//! The node's HTTP front door under 10,000 random and mutated request bodies (docs/fuzzing.md):
//! every answer is a 4xx or a 2xx, never a 5xx the node made itself, and the node is alive
//! and serving at the end. Bodies start as valid chat requests for each provider kind and
//! are mutated (truncated, bytes flipped, fields of the wrong type, huge numbers, deep
//! nesting, invalid UTF-8, duplicate keys, wrong content types, …) with a seeded RNG: the
//! seed is printed, and `FUZZ_HTTP_SEED=<seed>` replays a failing run.
#![allow(clippy::unwrap_used, clippy::expect_used)]

use std::collections::BTreeMap;
use std::sync::Arc;
use std::time::{Duration, Instant};

use bytes::Bytes;
use http_body_util::{BodyExt, Full};
use hyper_util::client::legacy::Client;
use hyper_util::client::legacy::connect::HttpConnector;
use hyper_util::rt::TokioExecutor;
use rand::rngs::StdRng;
use rand::{Rng, SeedableRng};
use serde_json::{Value, json};
use switchyard_e2e::gateway::*;

const REQUESTS: usize = 10_000;
const CONCURRENCY: usize = 16;

type HttpClient = Client<HttpConnector, Full<Bytes>>;

/// One request: its body and the content type it is sent with (`None`: no header).
struct Case {
    body: Vec<u8>,
    content_type: Option<&'static str>,
    what: String,
}

#[tokio::test(flavor = "multi_thread", worker_threads = 4)]
async fn ten_thousand_mutated_bodies_get_4xx_or_2xx_and_the_node_survives() {
    let seed = std::env::var("FUZZ_HTTP_SEED")
        .ok()
        .and_then(|s| s.parse().ok())
        .unwrap_or_else(|| rand::rng().random::<u64>());
    println!("fuzz_http seed: {seed} (FUZZ_HTTP_SEED={seed} replays this run)");
    let mut gw = Gateway::start().await;
    let mut rng = StdRng::seed_from_u64(seed);
    let cases: Vec<Case> = (0..REQUESTS).map(|i| case(&mut rng, i)).collect();

    let client: HttpClient =
        Client::builder(TokioExecutor::new()).pool_max_idle_per_host(CONCURRENCY).build_http();
    let url = format!("http://{}/v1/chat/completions", gw.node.addr);
    let key = Arc::new(format!("Bearer {}", gw.key));
    let cases = Arc::new(cases);
    let next = Arc::new(std::sync::atomic::AtomicUsize::new(0));
    let started = Instant::now();
    let mut workers = Vec::new();
    for _ in 0..CONCURRENCY {
        let (client, url, key, cases, next) =
            (client.clone(), url.clone(), Arc::clone(&key), Arc::clone(&cases), Arc::clone(&next));
        workers.push(tokio::spawn(async move {
            let mut seen: Vec<(usize, u16, String)> = Vec::new();
            loop {
                let i = next.fetch_add(1, std::sync::atomic::Ordering::Relaxed);
                let Some(case) = cases.get(i) else { return seen };
                let (status, body) = send(&client, &url, &key, case).await.unwrap_or_else(|e| {
                    panic!("seed {seed}, request {i} ({}): no answer: {e}", case.what)
                });
                seen.push((i, status, body));
            }
        }));
    }
    let mut statuses: BTreeMap<u16, usize> = BTreeMap::new();
    let mut relayed = 0;
    for worker in workers {
        for (i, status, body) in worker.await.unwrap() {
            *statuses.entry(status).or_default() += 1;
            let case = &cases[i];
            let shown =
                String::from_utf8_lossy(&case.body[..case.body.len().min(300)]).into_owned();
            assert!(
                (200..300).contains(&status) || (400..600).contains(&status),
                "seed {seed}, request {i} ({}): status {status}: {body}\nbody: {shown}",
                case.what
            );
            if status >= 500 {
                assert!(
                    is_relayed_provider_failure(&body),
                    "seed {seed}, request {i} ({}): the node's own {status}: {body}\nbody: {shown}",
                    case.what
                );
                relayed += 1;
            }
        }
    }
    let took = started.elapsed();
    println!(
        "{REQUESTS} requests in {took:?}: statuses {statuses:?}, {relayed} relayed provider failures"
    );

    // Alive and serving: a valid request for each provider kind is answered.
    let exited = gw.node.child.try_wait().unwrap();
    assert!(exited.is_none(), "the node process exited: {exited:?}");
    let log = gw.node.log_text();
    assert!(!log.contains("panicked"), "the node panicked:\n{log}");
    for model in [PRIMARY, ANTHROPIC, GEMINI, AZURE] {
        let r = gw.chat(body(model)).await;
        assert_eq!(r.status, 200, "{model} after the run: {}", r.body);
    }
}

async fn send(
    client: &HttpClient,
    url: &str,
    key: &str,
    case: &Case,
) -> Result<(u16, String), String> {
    let mut request = http::Request::post(url).header(http::header::AUTHORIZATION, key);
    if let Some(content_type) = case.content_type {
        request = request.header(http::header::CONTENT_TYPE, content_type);
    }
    let request =
        request.body(Full::new(Bytes::from(case.body.clone()))).map_err(|e| e.to_string())?;
    let answer = tokio::time::timeout(Duration::from_secs(30), client.request(request))
        .await
        .map_err(|_| "no answer within 30 s".to_owned())?
        .map_err(|e| e.to_string())?;
    let status = answer.status().as_u16();
    let body = tokio::time::timeout(Duration::from_secs(30), answer.into_body().collect())
        .await
        .map_err(|_| "the body did not end within 30 s".to_owned())?
        .map_err(|e| e.to_string())?
        .to_bytes();
    Ok((status, String::from_utf8_lossy(&body).into_owned()))
}

/// A provider's failure the node passes on (docs/http-api.md, "Errors"): the chain ended
/// with every attempt failed upstream, `all_models_failed` with the attempts attached.
/// Anything else at 5xx (a panic's bare 500, `not_ready`, an unstructured body) is the
/// node's own.
fn is_relayed_provider_failure(body: &str) -> bool {
    let Ok(v) = serde_json::from_str::<Value>(body) else { return false };
    let error = &v["error"];
    error["code"] == "all_models_failed"
        && error["type"] == "server_error"
        && error["attempts"].as_array().is_some_and(|a| {
            !a.is_empty() && a.iter().all(|a| a["status"] == "failed" || a["status"] == "skipped")
        })
}

/// A valid chat body for one of the simulator's models, with some of the optional fields.
fn valid(rng: &mut StdRng) -> Value {
    let model = [PRIMARY, ANTHROPIC, GEMINI, AZURE][rng.random_range(0..4)];
    let mut body = json!({
        "model": model,
        "messages": [
            {"role": "system", "content": "be brief"},
            {"role": "user", "content": "hello"},
        ],
    });
    let extras = [
        ("stream", json!(true)),
        ("stream_options", json!({"include_usage": true})),
        ("max_tokens", json!(16)),
        ("temperature", json!(0.5)),
        ("stop", json!(["\n"])),
        ("fallback_models", json!([SECONDARY])),
        ("redundancy", json!({"timeout_ms": 5000, "on": ["server_error", "timeout"]})),
        ("response_format", json!({"type": "json_object"})),
        (
            "tools",
            json!([{"type": "function", "function": {"name": "f", "parameters": {"type": "object"}}}]),
        ),
        ("user", json!("fuzz")),
    ];
    for (key, value) in extras {
        if rng.random_bool(0.3) {
            body[key] = value;
        }
    }
    if rng.random_bool(0.2) {
        body["messages"].as_array_mut().unwrap().push(json!({
            "role": "assistant", "content": null,
            "tool_calls": [{"id": "c1", "type": "function", "function": {"name": "f", "arguments": "{}"}}],
        }));
        body["messages"]
            .as_array_mut()
            .unwrap()
            .push(json!({"role": "tool", "tool_call_id": "c1", "content": "ok"}));
    }
    body
}

fn case(rng: &mut StdRng, i: usize) -> Case {
    let mut value = valid(rng);
    let mut what = Vec::new();
    // Structural mutations first, on the JSON tree.
    for _ in 0..rng.random_range(0..3) {
        what.push(mutate_tree(rng, &mut value));
    }
    let mut body = serde_json::to_vec(&value).unwrap();
    // Then byte-level ones, on the text.
    for _ in 0..rng.random_range(0..3) {
        what.push(mutate_bytes(rng, &mut body));
    }
    let content_type = match rng.random_range(0..20) {
        0 => None,
        1 => Some("text/plain"),
        2 => Some("application/x-www-form-urlencoded"),
        3 => Some("multipart/form-data; boundary=x"),
        4 => Some("application/json; charset=latin1"),
        _ => Some("application/json"),
    };
    if let Some(ct) = content_type.filter(|ct| *ct != "application/json") {
        what.push(format!("content-type {ct}"));
    } else if content_type.is_none() {
        what.push("no content-type".into());
    }
    Case { body, content_type, what: format!("#{i}: {}", what.join(", ")) }
}

/// A JSON value of some kind, sometimes one no field expects.
fn odd_value(rng: &mut StdRng) -> Value {
    match rng.random_range(0..12) {
        0 => Value::Null,
        1 => json!(rng.random_bool(0.5)),
        2 => json!(u64::MAX),
        3 => json!(i64::MIN),
        4 => json!(f64::MAX),
        5 => json!(-0.0),
        6 => json!(""),
        7 => json!("x".repeat(rng.random_range(1..5000))),
        8 => json!([]),
        9 => json!({}),
        10 => json!([{"role": 7}, "text", null]),
        _ => json!({"nested": {"deeper": [1, 2, {"x": null}]}}),
    }
}

/// Replaces, removes or adds one field somewhere in the tree.
fn mutate_tree(rng: &mut StdRng, value: &mut Value) -> String {
    // Pick a path down a random number of levels, then change what is there.
    let mut path = String::new();
    let mut pointer = String::new();
    let mut at: &Value = value;
    for _ in 0..rng.random_range(0..4) {
        match at {
            Value::Object(map) if !map.is_empty() => {
                let key = map.keys().nth(rng.random_range(0..map.len())).cloned().unwrap();
                path.push_str(&format!(".{key}"));
                pointer.push_str(&format!("/{}", key.replace('~', "~0").replace('/', "~1")));
                at = &map[&key];
            }
            Value::Array(items) if !items.is_empty() => {
                let i = rng.random_range(0..items.len());
                path.push_str(&format!("[{i}]"));
                pointer.push_str(&format!("/{i}"));
                at = &items[i];
            }
            _ => break,
        }
    }
    let at = value.pointer_mut(&pointer).unwrap();
    match (rng.random_range(0..3), &mut *at) {
        (0, Value::Object(map)) if !map.is_empty() => {
            let key = map.keys().nth(rng.random_range(0..map.len())).cloned().unwrap();
            map.remove(&key);
            format!("removed {path}.{key}")
        }
        (1, Value::Object(map)) => {
            let key = [
                "model",
                "messages",
                "stream",
                "redundancy",
                "models",
                "n",
                "role",
                "content",
                "zz",
            ][rng.random_range(0..9)];
            map.insert(key.into(), odd_value(rng));
            format!("set {path}.{key}")
        }
        _ => {
            *at = odd_value(rng);
            format!("replaced {path}")
        }
    }
}

/// One byte-level change to the body's text.
fn mutate_bytes(rng: &mut StdRng, body: &mut Vec<u8>) -> String {
    let len = body.len();
    match rng.random_range(0..10) {
        0 if len > 0 => {
            let at = rng.random_range(0..len);
            body.truncate(at);
            format!("truncated at {at}")
        }
        1 if len > 0 => {
            for _ in 0..rng.random_range(1..8) {
                let at = rng.random_range(0..body.len());
                body[at] ^= 1 << rng.random_range(0..8);
            }
            "flipped bits".into()
        }
        2 => {
            // Invalid UTF-8 inside the first string.
            let at = body.iter().position(|b| *b == b'"').map_or(0, |p| p + 1);
            body.splice(at..at, [0xff, 0xfe, 0xc3]);
            "invalid UTF-8".into()
        }
        3 => {
            // Duplicate keys, with the duplicate of another type.
            let dup: &[u8] = [
                &br#""model":123,"#[..],
                br#""messages":"x","#,
                br#""stream":"yes","#,
                br#""model":null,"messages":[],"#,
            ][rng.random_range(0..4)];
            let at = body.iter().position(|b| *b == b'{').map_or(0, |p| p + 1);
            body.splice(at..at, dup.iter().copied());
            "duplicate keys".into()
        }
        4 => {
            // Deep nesting, inside or instead of the body.
            let depth = rng.random_range(100..20_000);
            let nested = format!("{}{}", "[".repeat(depth), "]".repeat(depth));
            if rng.random_bool(0.5) {
                *body = format!(r#"{{"model":"{PRIMARY}","messages":{nested}}}"#).into_bytes();
            } else {
                *body = nested.into_bytes();
            }
            format!("nesting {depth}")
        }
        5 => {
            let number: &[u8] = [
                &b"1e999999"[..],
                b"-1e-999999",
                b"123456789012345678901234567890123456789",
                b"-0",
                b"0.0000000000000000000000000001",
                b"NaN",
            ][rng.random_range(0..6)];
            // The first number's place, or after `"max_tokens":`.
            let at = body.iter().position(u8::is_ascii_digit);
            match at {
                Some(at) => {
                    let end = body[at..]
                        .iter()
                        .position(|b| !b.is_ascii_digit() && *b != b'.')
                        .map_or(body.len(), |e| at + e);
                    body.splice(at..end, number.iter().copied());
                }
                None => {
                    let at = body.iter().position(|b| *b == b'{').map_or(0, |p| p + 1);
                    let mut field = b"\"max_tokens\":".to_vec();
                    field.extend_from_slice(number);
                    field.push(b',');
                    body.splice(at..at, field);
                }
            }
            "huge number".into()
        }
        6 => {
            let tail: &[u8] =
                [&b"\\ud800"[..], b"\\u0000", b"\x00", b"\\", b"\"\"\""][rng.random_range(0..5)];
            let at = body.iter().rposition(|b| *b == b'"').unwrap_or(0);
            body.splice(at..at, tail.iter().copied());
            "escapes".into()
        }
        7 => {
            let n = rng.random_range(0..64);
            *body = (0..n).map(|_| rng.random::<u8>()).collect();
            "random bytes".into()
        }
        8 => {
            body.extend_from_slice(
                [&b" trailing"[..], b"{}", b"\n\n\n", b"]"][rng.random_range(0..4)],
            );
            "trailing bytes".into()
        }
        _ => {
            if len > 2 {
                let at = rng.random_range(0..len - 1);
                let end = (at + rng.random_range(1..16)).min(len);
                body.drain(at..end);
            }
            "cut out bytes".into()
        }
    }
}
