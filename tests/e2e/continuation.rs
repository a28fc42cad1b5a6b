//! Streams that break after content reached the client are continued (docs/http-api.md,
//! "Streaming"): real control plane, node and simulator processes on loopback, the
//! simulator scripting each break, and the official OpenAI Python SDK reading a rescued
//! stream.
#![allow(clippy::unwrap_used, clippy::expect_used)]

use serde_json::{Value, json};
use switchyard_e2e::gateway::*;
use switchyard_e2e::*;

/// The answer every model of these tests gives, cut into five pieces by the simulator.
const ANSWER: &str = "The quick brown fox jumps over the lazy dog, twice.";

/// Models that can continue an answer (`continuation: prefill`) and one that cannot, all on
/// the simulator's OpenAI-compatible provider.
const MODELS: &str = "  - name: cont/a
    provider: sim-us
    upstream_model: cont-a
    continuation: prefill
  - name: cont/b
    provider: sim-us
    upstream_model: cont-b
    continuation: prefill
  - name: cont/none
    provider: sim-us
    upstream_model: cont-none
  - name: cont/stally
    provider: sim-us
    upstream_model: cont-stally
    stall_timeout_ms: 1000
    continuation: prefill
  - name: cont/claude
    provider: sim-anthropic
    upstream_model: cont-claude
    max_tokens: 512
    continuation: prefill
";

/// A gateway whose catalog has [`MODELS`] too, every one answering [`ANSWER`].
async fn gateway() -> Gateway {
    let gw = Gateway::start().await;
    let yaml = catalog_yaml(&gw.sim.url(), &GatewayOptions::default()).replacen(
        "models:\n",
        &format!("models:\n{MODELS}"),
        1,
    );
    let file = gw.dir.path().join("continuation.yaml");
    std::fs::write(&file, yaml).unwrap();
    let out = gw.admin(&["apply", "-f", &file.display().to_string(), "--json"]).await;
    assert!(out.success, "{}", out.stderr);
    gw.wait_for(out.json()["version"].as_i64().unwrap()).await;
    for m in ["cont-a", "cont-b", "cont-none", "cont-stally", "cont-claude"] {
        gw.script(m, json!({"kind": "ok", "text": ANSWER})).await;
    }
    gw
}

fn ask(models: &[&str]) -> Value {
    json!({"models": models, "stream": true, "messages": [{"role": "user", "content": "Say it."}]})
}

/// Breaks once with `first`, then answers whole: the continuation call gets the rest.
fn once(first: Value) -> Value {
    json!({"kind": "sequence", "steps": [first], "then": {"kind": "ok", "text": ANSWER}})
}

/// The node's report of a rescued stream: the `secureai` of its last chunk.
fn final_report(s: &Streamed) -> Value {
    let last = s.chunks().into_iter().last().expect("chunks");
    assert_eq!(last["choices"], json!([]), "the report chunk has no choices: {last}");
    last["secureai"].clone()
}

async fn continuations(gw: &Gateway, model: &str, outcome: &str) -> f64 {
    let text = http_get(gw.node.addr, "/metrics", None).await.unwrap().body;
    text.lines()
        .filter(|l| l.starts_with("switchyard_stream_continuations_total{"))
        .filter(|l| {
            l.contains(&format!(r#"model="{model}""#))
                && l.contains(&format!(r#"outcome="{outcome}""#))
        })
        .filter_map(|l| l.rsplit_once(' ')?.1.parse::<f64>().ok())
        .sum()
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_stream_cut_after_two_chunks_is_continued_by_the_same_model_and_the_client_reads_the_whole_answer()
 {
    let gw = gateway().await;
    gw.script("cont-a", once(json!({"kind": "ok", "text": ANSWER, "drop_after": 2}))).await;
    let s = gw.stream(ask(&["cont/a", "cont/b"])).await;
    assert_eq!(s.status, 200);
    assert!(s.error_frame().is_none(), "{:?}", s.frames);
    assert_eq!(s.frames.last().map(String::as_str), Some("[DONE]"));
    assert_eq!(s.text(), ANSWER, "{:?}", s.frames);
    let report = final_report(&s);
    let continued = report["continued"].as_array().unwrap();
    assert_eq!(continued.len(), 1, "{report}");
    assert_eq!(continued[0]["model"], "cont/a");
    assert_eq!(continued[0]["reason"], "upstream_disconnected");
    assert_eq!(continued[0]["outcome"], "served");
    let at = continued[0]["at_char"].as_u64().unwrap() as usize;
    assert!(at > 0 && at < ANSWER.len(), "{report}");
    assert_eq!(report["served_model"], "cont/a");
    // The continuation asked for the rest: the original request, the text so far last.
    let last = gw.last_upstream_request("cont-a").await["body"].clone();
    let messages = last["messages"].as_array().unwrap();
    assert_eq!(messages.last().unwrap()["role"], "assistant", "{last}");
    assert_eq!(messages.last().unwrap()["content"], &ANSWER[..at], "{last}");
    assert_eq!(last["continue_final_message"], true, "{last}");
    assert_eq!(gw.upstream_requests("cont-b").await, 0, "the fallback was not needed");
    assert_eq!(continuations(&gw, "cont/a", "served").await, 1.0);
    // The audit log has it as api:stream_continued.
    let events = eventually(PATIENCE, "the api:stream_continued event", || async {
        let out = cli(&gw.cp.url(), &["events", "--json"]).await;
        out.stdout
            .lines()
            .filter_map(|l| serde_json::from_str::<Value>(l).ok())
            .find(|e| e["type"] == "api:stream_continued")
    })
    .await;
    assert_eq!(events["continued"][0]["model"], "cont/a", "{events}");
    assert_eq!(events["served_model"], "cont/a", "{events}");
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_primary_that_cannot_continue_is_finished_by_the_fallback_with_prefill() {
    let gw = gateway().await;
    gw.script("cont-none", json!({"kind": "ok", "text": ANSWER, "drop_after": 3})).await;
    let s = gw.stream(ask(&["cont/none", "cont/b"])).await;
    assert!(s.error_frame().is_none(), "{:?}", s.frames);
    assert_eq!(s.text(), ANSWER, "{:?}", s.frames);
    let report = final_report(&s);
    assert_eq!(report["continued"][0]["model"], "cont/b", "{report}");
    assert_eq!(report["served_model"], "cont/b", "{report}");
    assert_eq!(gw.upstream_requests("cont-none").await, 1, "never asked to continue");
    // Every chunk after the break names the model that sent it.
    let models: Vec<Value> = s.chunks().iter().map(|c| c["model"].clone()).collect();
    assert_eq!(models.first(), Some(&json!("cont/none")));
    assert_eq!(models.last(), Some(&json!("cont/b")));
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_stall_is_continued_by_the_next_model_never_the_stalled_one() {
    let gw = gateway().await;
    gw.script("cont-stally", json!({"kind": "ok", "text": ANSWER, "stall_after": 2})).await;
    let s = gw.stream(ask(&["cont/stally", "cont/b"])).await;
    assert!(s.error_frame().is_none(), "{:?}", s.frames);
    assert_eq!(s.text(), ANSWER);
    let report = final_report(&s);
    assert_eq!(report["continued"][0]["model"], "cont/b", "{report}");
    assert_eq!(report["continued"][0]["reason"], "stream_stalled", "{report}");
    assert_eq!(gw.upstream_requests("cont-stally").await, 1, "a silent route stays silent");
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_fallback_that_refuses_the_prefill_is_skipped_and_the_error_is_the_original_break() {
    let gw = gateway().await;
    gw.script("cont-none", json!({"kind": "ok", "text": ANSWER, "drop_after": 2})).await;
    gw.script("cont-b", json!({"kind": "ok", "text": ANSWER, "rejects_prefill": true})).await;
    let s = gw.stream(ask(&["cont/none", "cont/b"])).await;
    let error = s.error_frame().expect("no model could continue: an error frame");
    assert_eq!(error["error"]["code"], "upstream_disconnected", "{error}");
    assert_eq!(gw.upstream_requests("cont-b").await, 1, "it was asked once");
    assert_eq!(continuations(&gw, "cont/b", "refused").await, 1.0);
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn with_continue_streams_false_a_break_ends_with_an_error_frame_as_before() {
    let gw = gateway().await;
    gw.script("cont-a", json!({"kind": "ok", "text": ANSWER, "drop_after": 2})).await;
    let mut body = ask(&["cont/a", "cont/b"]);
    body["redundancy"] = json!({"continue_streams": false});
    let s = gw.stream(body).await;
    let error = s.error_frame().expect("an error frame");
    assert_eq!(error["error"]["code"], "upstream_disconnected", "{error}");
    assert_eq!(gw.upstream_requests("cont-a").await, 1);
    assert_eq!(gw.upstream_requests("cont-b").await, 0);
    // Not a boolean: 400 naming it.
    let mut bad = ask(&["cont/a"]);
    bad["redundancy"] = json!({"continue_streams": "no"});
    let r = gw.chat(bad).await;
    assert_eq!(r.status, 400, "{}", r.body);
    assert_eq!(r.json()["error"]["param"], "redundancy.continue_streams", "{}", r.body);
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn the_official_openai_python_sdk_reads_a_rescued_stream_whole_without_an_exception() {
    let gw = gateway().await;
    gw.script("cont-a", once(json!({"kind": "ok", "text": ANSWER, "drop_after": 2}))).await;
    let script = concat!(env!("CARGO_MANIFEST_DIR"), "/../tests/e2e/openai_sdk_continued.py");
    let out = sdk_script(script, &[&gw.node.url(), &gw.key, "cont/a", "cont/b"]).await;
    let v: Value = serde_json::from_str(out.trim()).unwrap_or_else(|e| panic!("{e}: {out}"));
    assert_eq!(v["text"], ANSWER, "{v}");
    assert_eq!(v["continued"][0]["model"], "cont/a", "{v}");
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_break_inside_a_tool_calls_arguments_ends_with_an_error_frame_and_is_not_continued() {
    let gw = gateway().await;
    // The Anthropic simulator streams the tool's input JSON in pieces: cut after two of them.
    gw.script("cont-claude", json!({"kind": "ok", "text": ANSWER, "drop_after": 2})).await;
    let mut body = ask(&["cont/claude", "cont/b"]);
    body["tools"] = json!([{"type": "function", "function": {"name": "get_weather",
        "parameters": {"type": "object", "properties": {"city": {"type": "string"}},
                       "required": ["city"]}}}]);
    let s = gw.stream(body).await;
    let args: String = s
        .chunks()
        .iter()
        .filter_map(|c| {
            c["choices"][0]["delta"]["tool_calls"][0]["function"]["arguments"]
                .as_str()
                .map(str::to_owned)
        })
        .collect();
    assert!(!args.is_empty(), "part of the arguments reached the client: {:?}", s.frames);
    let error = s.error_frame().expect("an error frame");
    assert_eq!(error["error"]["code"], "upstream_disconnected", "{error}");
    assert_eq!(gw.upstream_requests("cont-claude").await, 1, "not asked to continue");
    assert_eq!(gw.upstream_requests("cont-b").await, 0, "nor the fallback");
    assert_eq!(continuations(&gw, "cont/claude", "served").await, 0.0);
}
