//! docs/http-api.md, "Streaming": failover only before the first content token, a locked
//! model after it, honest error frames; real processes on loopback.
#![allow(clippy::unwrap_used, clippy::expect_used)]

use std::time::{Duration, Instant};

use serde_json::json;
use switchyard_e2e::gateway::*;

fn streaming(model: &str, fallbacks: &[&str]) -> serde_json::Value {
    json!({"model": model, "fallback_models": fallbacks, "stream": true,
           "messages": [{"role": "user", "content": "hello"}]})
}

fn assert_every_chunk_names(s: &Streamed, model: &str) {
    for c in s.chunks() {
        if c.get("error").is_none() {
            assert_eq!(c["model"], model, "every chunk names the served model: {c}");
        }
    }
}

#[tokio::test]
async fn fails_over_on_first_token_timeout_without_leaking_the_slow_models_text() {
    let gw = Gateway::start().await;
    gw.script(
        "primary",
        json!({"kind": "ok", "text": "PRIMARY TEXT", "first_token_delay_ms": 10000}),
    )
    .await;
    gw.script("secondary", json!({"kind": "ok", "text": "fallback answer"})).await;
    let mut body = streaming(PRIMARY, &[SECONDARY]);
    body["redundancy"] = json!({"first_token_timeout_ms": 800});
    let s = gw.stream(body).await;
    assert_eq!(s.status, 200);
    assert_eq!(s.text(), "fallback answer");
    assert!(
        !s.frames.iter().any(|f| f.contains("PRIMARY")),
        "nothing of the failed attempt reaches the client"
    );
    assert_eq!(s.header("x-served-model").as_deref(), Some(SECONDARY));
    assert_eq!(s.header("x-requested-model").as_deref(), Some(PRIMARY));
    assert_every_chunk_names(&s, SECONDARY);
    let report = s.report_chunk();
    assert_eq!(
        attempts(&report),
        [triple(PRIMARY, "failed", "timeout"), triple(SECONDARY, "served", "")],
        "the report rides in the first chunk with content: {report}"
    );
    assert_eq!(s.frames.last().map(String::as_str), Some("[DONE]"));
    // Wall time (a real node and simulator): the 800 ms timeout and a loaded machine's
    // slack, against the primary's 10 s to its first token.
    assert!(
        s.took < Duration::from_secs(5),
        "failed over at the first-token timeout: {:?}",
        s.took
    );
}

#[tokio::test]
async fn the_report_is_in_the_first_chunk_that_carries_content() {
    let gw = Gateway::start().await;
    gw.script("primary", json!({"kind": "status", "status": 503})).await;
    let s = gw.stream(streaming(PRIMARY, &[SECONDARY])).await;
    let first_content = s
        .chunks()
        .into_iter()
        .find(|c| c["choices"][0]["delta"]["content"].as_str().is_some_and(|t| !t.is_empty()))
        .unwrap();
    assert_eq!(first_content["secureai"]["served_model"], SECONDARY, "{first_content}");
    assert_eq!(s.report_chunk(), first_content, "and in no other chunk");
}

async fn fails_over_before_the_stream_on(behaviour: serde_json::Value, reason: &str) {
    let gw = Gateway::start().await;
    gw.script("primary", behaviour).await;
    gw.script("secondary", json!({"kind": "ok", "text": "from the fallback"})).await;
    let s = gw.stream(streaming(PRIMARY, &[SECONDARY])).await;
    assert_eq!(s.status, 200);
    assert_eq!(s.text(), "from the fallback");
    assert_eq!(
        attempts(&s.report_chunk()),
        [triple(PRIMARY, "failed", reason), triple(SECONDARY, "served", "")]
    );
}

#[tokio::test]
async fn streams_fail_over_on_a_5xx_before_the_stream() {
    fails_over_before_the_stream_on(json!({"kind": "status", "status": 500}), "server_error").await;
}

#[tokio::test]
async fn streams_fail_over_on_a_429_before_the_stream() {
    fails_over_before_the_stream_on(json!({"kind": "status", "status": 429}), "rate_limit").await;
}

#[tokio::test]
async fn streams_fail_over_on_a_connection_error_before_the_stream() {
    fails_over_before_the_stream_on(json!({"kind": "reset"}), "connection_error").await;
}

#[tokio::test]
async fn an_in_band_error_before_any_content_is_a_failed_attempt() {
    fails_over_before_the_stream_on(
        json!({"kind": "stream_error", "after": 0, "message": "overloaded"}),
        "server_error",
    )
    .await;
}

#[tokio::test]
async fn a_drop_after_the_first_token_ends_with_an_error_frame_and_no_failover() {
    let gw = Gateway::start().await;
    gw.script(
        "primary",
        json!({"kind": "ok", "text": "one two three four five six", "chunks": 6, "drop_after": 2}),
    )
    .await;
    gw.script("secondary", json!({"kind": "ok", "text": "SECOND MODEL"})).await;
    let s = gw.stream(streaming(PRIMARY, &[SECONDARY])).await;
    assert_eq!(s.status, 200);
    let error = s.error_frame().expect("an error frame");
    assert!(
        error["error"]["message"].is_string()
            && error["error"]["type"].is_string()
            && error["error"]["code"].is_string(),
        "{error}"
    );
    assert!(!s.text().contains("SECOND"), "no second model's text spliced in: {}", s.text());
    assert!(!s.text().is_empty(), "the first tokens were delivered");
    assert_ne!(s.frames.last().map(String::as_str), Some("[DONE]"));
    assert_eq!(
        gw.upstream_requests("secondary").await,
        0,
        "the model is locked after the first token"
    );
    assert_every_chunk_names(&s, PRIMARY);
}

#[tokio::test]
async fn a_stall_after_k_chunks_ends_with_an_error_frame_within_the_stall_timeout() {
    let gw = Gateway::start().await;
    gw.script("stally", json!({"kind": "ok", "chunks": 5, "stall_after": 2})).await;
    let started = Instant::now();
    let s = gw.stream(streaming(STALLY, &[])).await;
    let took = started.elapsed();
    let error = s.error_frame().expect("an error frame, not a hang");
    assert_eq!(error["error"]["code"], "stream_stalled", "{error}");
    assert!(took >= Duration::from_millis(1000), "waited the model's stall_timeout_ms: {took:?}");
    // Wall time (a real node and simulator): a node that missed the model's stall timeout
    // would wait the default 30 s, so 4 s past it is a loaded machine's slack.
    assert!(
        took < Duration::from_millis(1000 + 4000),
        "ended within stall timeout + margin: {took:?}"
    );
}

#[tokio::test]
async fn timeout_ms_bounds_the_whole_streamed_attempt() {
    let gw = Gateway::start().await;
    // 20 s of stream, far longer than the attempt's timeout.
    let text = "word ".repeat(100);
    gw.script("primary", json!({"kind": "ok", "text": text, "chunks": 100, "chunk_delay_ms": 200}))
        .await;
    let mut body = streaming(PRIMARY, &[]);
    body["redundancy"] = json!({"timeout_ms": 1500});
    let s = gw.stream(body).await;
    let error = s.error_frame().expect("the attempt's timeout ends the stream");
    assert_eq!(error["error"]["code"], "timeout", "{error}");
    // Wall time (a real node and simulator): the 1.5 s timeout and a loaded machine's slack.
    assert!(s.took < Duration::from_millis(1500 + 3500), "{:?}", s.took);
}

#[tokio::test]
async fn include_usage_adds_the_final_usage_chunk_and_only_then() {
    let gw = Gateway::start().await;
    let mut body = streaming(PRIMARY, &[]);
    body["stream_options"] = json!({"include_usage": true});
    let s = gw.stream(body).await;
    let last = s.chunks().pop().unwrap();
    assert_eq!(last["choices"], json!([]), "{last}");
    assert!(last["usage"]["completion_tokens"].as_u64().unwrap() > 0, "{last}");
    assert_eq!(last["model"], PRIMARY);
    let plain = gw.stream(streaming(PRIMARY, &[])).await;
    assert!(plain.chunks().iter().all(|c| c.get("usage").is_none()), "no usage unless asked");
    assert_eq!(plain.frames.last().map(String::as_str), Some("[DONE]"));
}

#[tokio::test]
async fn a_client_that_disconnects_closes_the_upstream_connection_at_once() {
    use tokio::io::{AsyncReadExt, AsyncWriteExt};
    let gw = Gateway::start().await;
    // 30 s of stream: an upstream read to its end would close only then.
    let text = "word ".repeat(600);
    gw.script("primary", json!({"kind": "ok", "text": text, "chunks": 600, "chunk_delay_ms": 50}))
        .await;
    let before = switchyard_e2e::http_get(gw.sim.addr, "/_sim/stats", None).await.unwrap().json();
    let closed_before = before["connections"]["closed"].as_u64().unwrap();
    let payload = streaming(PRIMARY, &[]).to_string();
    // A raw socket: the test reads the answer's first bytes and closes the connection under
    // the node mid-stream, at the moment it chooses.
    let mut socket = tokio::net::TcpStream::connect(gw.node.addr).await.unwrap();
    let head = format!(
        "POST /v1/chat/completions HTTP/1.1\r\nHost: x\r\nAuthorization: Bearer {}\r\nContent-Type: application/json\r\nContent-Length: {}\r\n\r\n",
        gw.key,
        payload.len()
    );
    socket.write_all(head.as_bytes()).await.unwrap();
    socket.write_all(payload.as_bytes()).await.unwrap();
    let mut buf = vec![0u8; 4096];
    let n = socket.read(&mut buf).await.unwrap();
    assert!(String::from_utf8_lossy(&buf[..n]).contains("200 OK"));
    switchyard_e2e::eventually(
        switchyard_e2e::PATIENCE,
        "the simulator to count the upstream stream as open",
        || async {
            let open = switchyard_e2e::http_get(gw.sim.addr, "/_sim/stats", None).await?.json();
            (open["connections"]["open"].as_u64()? >= 1).then_some(())
        },
    )
    .await;
    drop(socket);
    let gone = Instant::now();
    // Wall time (a real node and simulator): 5 s is a loaded machine's slack, against the
    // 30 s of a stream read to its end.
    switchyard_e2e::eventually(
        Duration::from_secs(5),
        "the simulator to see its connection closed",
        || async {
            let stats = switchyard_e2e::http_get(gw.sim.addr, "/_sim/stats", None).await?.json();
            (stats["connections"]["closed"].as_u64()? > closed_before).then_some(())
        },
    )
    .await;
    println!("upstream connection closed {:?} after the client left", gone.elapsed());
}

#[tokio::test]
async fn the_official_openai_python_sdk_streams_and_raises_on_a_mid_stream_drop() {
    let gw = Gateway::start().await;
    gw.script("primary", json!({"kind": "status", "status": 503})).await;
    gw.script("secondary", json!({"kind": "ok", "text": "streamed fallback text"})).await;
    gw.script("tertiary", json!({"kind": "ok", "text": "alpha beta gamma delta epsilon", "chunks": 5, "drop_after": 2})).await;
    let script = std::path::PathBuf::from(env!("CARGO_MANIFEST_DIR"))
        .join("../tests/e2e/openai_sdk_stream.py");
    let out = tokio::process::Command::new(switchyard_e2e::python())
        .arg(&script)
        .arg(format!("{}/v1", gw.node.url()))
        .arg(&gw.key)
        .args([PRIMARY, SECONDARY, TERTIARY])
        .env_remove("OPENAI_API_KEY")
        .env_remove("OPENAI_BASE_URL")
        .output()
        .await
        .unwrap();
    let stdout = String::from_utf8_lossy(&out.stdout);
    assert!(
        out.status.success(),
        "SDK check failed:\n{stdout}\n{}",
        String::from_utf8_lossy(&out.stderr)
    );
    assert_eq!(stdout.lines().count(), 2, "{stdout}");
}

/// The value of the node's `/metrics` sample written exactly as `series`.
async fn node_metric(gw: &Gateway, series: &str) -> Option<f64> {
    let metrics = switchyard_e2e::http_get(gw.node.addr, "/metrics", None).await?.body;
    metrics.lines().find_map(|l| l.strip_prefix(series)?.strip_prefix(' ')?.parse().ok())
}

fn output_tokens(model: &str, kind: &str) -> String {
    format!(
        "gen_ai_client_token_usage_sum{{gen_ai_operation_name=\"chat\",gen_ai_provider_name=\"openai\",\
         gen_ai_request_model=\"{model}\",gen_ai_response_model=\"{model}\",gen_ai_token_type=\"{kind}\"}}"
    )
}

#[tokio::test]
async fn a_stream_closed_after_its_finish_reason_and_usage_without_done_ends_with_the_nodes_done() {
    let gw = Gateway::start().await;
    // Six words in two chunks: the upstream's usage (6) differs from the node's fallback
    // count of content chunks (2), so the metric below tells which was recorded.
    gw.script(
        "primary",
        json!({"kind": "ok", "text": "one two three four five six", "chunks": 2, "no_done": true}),
    )
    .await;
    let s = gw.stream(streaming(PRIMARY, &[])).await;
    assert_eq!(s.status, 200);
    assert_eq!(s.text(), "one two three four five six");
    assert!(s.error_frame().is_none(), "a clean end is an end: {:?}", s.frames);
    assert_eq!(s.frames.last().map(String::as_str), Some("[DONE]"), "{:?}", s.frames);
    assert_eq!(s.frames.iter().filter(|f| *f == "[DONE]").count(), 1);
    let tokens = output_tokens(PRIMARY, "output");
    switchyard_e2e::eventually(
        switchyard_e2e::PATIENCE,
        "the upstream's usage recorded",
        || async { (node_metric(&gw, &tokens).await? == 6.0).then_some(()) },
    )
    .await;

    // Azure OpenAI's stream is OpenAI's; Anthropic's form of the same is `message_delta`
    // with the stop reason and usage, then the body ends without `message_stop`.
    for (model, upstream) in [(AZURE, AZURE_DEPLOYMENT), (ANTHROPIC, ANTHROPIC_UPSTREAM)] {
        gw.script(upstream, json!({"kind": "ok", "text": "bonjour le monde", "no_done": true}))
            .await;
        let s = gw.stream(streaming(model, &[])).await;
        assert_eq!(s.text(), "bonjour le monde", "{model}");
        assert!(s.error_frame().is_none(), "{model}: {:?}", s.frames);
        assert_eq!(s.frames.last().map(String::as_str), Some("[DONE]"), "{model}: {:?}", s.frames);
    }

    // Cut before the finish reason, it is still a broken stream.
    gw.script("primary", json!({"kind": "ok", "chunks": 4, "drop_after": 2})).await;
    let s = gw.stream(streaming(PRIMARY, &[])).await;
    assert!(s.error_frame().is_some(), "{:?}", s.frames);
}

#[tokio::test]
async fn a_frame_that_does_not_parse_mid_stream_is_skipped_counted_and_reported() {
    let gw = Gateway::start().await;
    gw.script(
        "primary",
        json!({"kind": "ok", "text": "alpha beta gamma delta", "chunks": 4, "bad_frame_after": 2}),
    )
    .await;
    let s = gw.stream(streaming(PRIMARY, &[SECONDARY])).await;
    assert_eq!(s.status, 200);
    assert_eq!(s.text(), "alpha beta gamma delta", "the whole answer: {:?}", s.frames);
    assert!(s.error_frame().is_none(), "{:?}", s.frames);
    assert_eq!(s.header("x-served-model").as_deref(), Some(PRIMARY), "no failover for it");
    let chunks = s.chunks();
    let last = chunks.last().unwrap();
    assert_eq!(last["secureai"]["skipped_frames"], 1, "the last chunk before [DONE]: {last}");
    assert_eq!(last["model"], PRIMARY);
    assert_eq!(last["choices"], json!([]));
    assert_eq!((&last["id"], &last["created"]), (&chunks[0]["id"], &chunks[0]["created"]));
    assert_eq!(s.frames.last().map(String::as_str), Some("[DONE]"));
    let series = format!("switchyard_upstream_malformed_frames_total{{model=\"{PRIMARY}\"}}");
    assert_eq!(node_metric(&gw, &series).await, Some(1.0));

    // A stream made only of such frames is a failed attempt: the chain moves on.
    gw.script("primary", json!({"kind": "malformed"})).await;
    gw.script("secondary", json!({"kind": "ok", "text": "from the fallback"})).await;
    let s = gw.stream(streaming(PRIMARY, &[SECONDARY])).await;
    assert_eq!(s.text(), "from the fallback");
    assert_eq!(
        attempts(&s.report_chunk()),
        [triple(PRIMARY, "failed", "server_error"), triple(SECONDARY, "served", "")]
    );
}

#[tokio::test]
async fn the_official_openai_python_sdk_reads_a_stream_without_done_and_one_with_a_bad_frame_whole()
{
    let gw = Gateway::start().await;
    gw.script(
        "primary",
        json!({"kind": "ok", "text": "one two three four five six", "chunks": 2, "no_done": true}),
    )
    .await;
    gw.script(
        "secondary",
        json!({"kind": "ok", "text": "alpha beta gamma", "chunks": 3, "bad_frame_after": 1}),
    )
    .await;
    let url = format!("{}/v1", gw.node.url());
    let stdout = switchyard_e2e::sdk_script(
        "openai_sdk_stream_ends.py",
        &[&url, &gw.key, PRIMARY, SECONDARY],
    )
    .await;
    let checks: Vec<serde_json::Value> =
        stdout.lines().map(|l| serde_json::from_str(l).unwrap()).collect();
    assert_eq!(checks.len(), 2, "{stdout}");
    assert_eq!(checks[0]["text"], "one two three four five six");
    // The prompt is six words: the simulator's usage, as the upstream sent it.
    assert_eq!(checks[0]["usage"], json!({"prompt_tokens": 6, "completion_tokens": 6}));
    assert_eq!(checks[1]["text"], "alpha beta gamma", "the whole answer reached the SDK");
    assert_eq!(checks[1]["skipped_frames"], 1);
    let tokens = output_tokens(PRIMARY, "output");
    switchyard_e2e::eventually(switchyard_e2e::PATIENCE, "the usage recorded", || async {
        (node_metric(&gw, &tokens).await? == 6.0).then_some(())
    })
    .await;
    let series = format!("switchyard_upstream_malformed_frames_total{{model=\"{SECONDARY}\"}}");
    assert_eq!(node_metric(&gw, &series).await, Some(1.0));
}
