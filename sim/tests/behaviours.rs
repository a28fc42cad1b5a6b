//! Every behaviour over real loopback HTTP: a hyper client for well-formed exchanges, raw
//! TCP where the point is what happens to the socket.
#![allow(clippy::unwrap_used, clippy::expect_used)]

use std::net::SocketAddr;
use std::time::{Duration, Instant};

use bytes::Bytes;
use http_body_util::{BodyExt, Full};
use hyper::body::Incoming;
use hyper::{HeaderMap, Request, Response, StatusCode};
use hyper_util::rt::TokioIo;
use serde_json::{Value, json};
use tokio::io::{AsyncReadExt, AsyncWriteExt};
use tokio::net::TcpStream;

use switchyard_sim::{Behaviour, Reply, SimServer, StatusReply, start};

async fn sim() -> SimServer {
    start("127.0.0.1:0".parse().unwrap()).await.unwrap()
}

struct Client {
    sender: hyper::client::conn::http1::SendRequest<Full<Bytes>>,
}

impl Client {
    async fn connect(addr: SocketAddr) -> Client {
        let stream = TcpStream::connect(addr).await.unwrap();
        let (sender, conn) =
            hyper::client::conn::http1::handshake(TokioIo::new(stream)).await.unwrap();
        tokio::spawn(async move {
            let _ = conn.await;
        });
        Client { sender }
    }

    async fn send(
        &mut self,
        method: &str,
        path: &str,
        body: Option<Value>,
        headers: &[(&str, &str)],
    ) -> Response<Incoming> {
        let mut req = Request::builder().method(method).uri(path).header("host", "sim");
        for (k, v) in headers {
            req = req.header(*k, *v);
        }
        let body = body.map(|b| Bytes::from(serde_json::to_vec(&b).unwrap())).unwrap_or_default();
        if !body.is_empty() {
            req = req.header("content-type", "application/json");
        }
        self.sender.ready().await.unwrap();
        self.sender.send_request(req.body(Full::new(body)).unwrap()).await.unwrap()
    }
}

/// One request on a fresh connection: status, headers, whole body.
async fn call(
    addr: SocketAddr,
    method: &str,
    path: &str,
    body: Option<Value>,
    headers: &[(&str, &str)],
) -> (StatusCode, HeaderMap, Bytes) {
    let resp = Client::connect(addr).await.send(method, path, body, headers).await;
    let (parts, body) = resp.into_parts();
    (parts.status, parts.headers, body.collect().await.unwrap().to_bytes())
}

async fn chat(addr: SocketAddr, model: &str) -> (StatusCode, HeaderMap, Value) {
    let (status, headers, body) =
        call(addr, "POST", "/v1/chat/completions", Some(request(model, false)), &[]).await;
    (status, headers, serde_json::from_slice(&body).unwrap_or(Value::Null))
}

fn request(model: &str, stream: bool) -> Value {
    json!({"model": model, "messages": [{"role": "user", "content": "say hi to me"}], "stream": stream,
           "stream_options": {"include_usage": true}})
}

fn raw_request(model: &str, stream: bool) -> Vec<u8> {
    let body = serde_json::to_vec(&request(model, stream)).unwrap();
    let mut req = format!(
        "POST /v1/chat/completions HTTP/1.1\r\nhost: sim\r\ncontent-type: application/json\r\ncontent-length: {}\r\n\r\n",
        body.len()
    )
    .into_bytes();
    req.extend_from_slice(&body);
    req
}

/// SSE `data:` payloads from a streaming response, until the body ends or errors.
async fn events(resp: Response<Incoming>) -> (Vec<String>, bool) {
    let mut body = resp.into_body();
    let mut buf = String::new();
    let mut failed = false;
    while let Some(frame) = body.frame().await {
        match frame {
            Ok(frame) => buf.push_str(std::str::from_utf8(frame.data_ref().unwrap()).unwrap()),
            Err(_) => {
                failed = true;
                break;
            }
        }
    }
    let data = buf
        .split("\n\n")
        .filter(|e| !e.is_empty())
        .map(|e| e.strip_prefix("data: ").unwrap().to_owned())
        .collect();
    (data, failed)
}

fn content(events: &[String]) -> Vec<String> {
    events
        .iter()
        .filter_map(|e| serde_json::from_str::<Value>(e).ok())
        .filter_map(|v| v["choices"][0]["delta"]["content"].as_str().map(str::to_owned))
        .filter(|c| !c.is_empty())
        .collect()
}

/// How long [`eventually`] waits for what takes milliseconds on an idle machine (a close
/// to be counted): generous, as the machine may be busy, and paid in full only on failure.
const PATIENCE: Duration = Duration::from_secs(10);

async fn eventually(what: &str, within: Duration, mut check: impl FnMut() -> bool) {
    let start = Instant::now();
    while !check() {
        assert!(start.elapsed() < within, "{what} not within {within:?}");
        tokio::time::sleep(Duration::from_millis(10)).await;
    }
}

// === Non-streaming ===

#[tokio::test]
async fn unscripted_model_answers_a_chat_completion() {
    let sim = sim().await;
    let (status, headers, v) = chat(sim.local_addr, "openai/gpt-4o").await;
    assert_eq!(status, 200);
    assert_eq!(headers["content-type"], "application/json");
    assert!(v["id"].as_str().unwrap().starts_with("chatcmpl-"));
    assert_eq!(v["object"], "chat.completion");
    assert!(v["created"].as_u64().unwrap() > 1_700_000_000);
    assert_eq!(v["model"], "openai/gpt-4o");
    assert_eq!(
        v["choices"][0]["message"],
        json!({"role": "assistant", "content": "Hello from openai/gpt-4o.", "refusal": null, "annotations": []})
    );
    assert_eq!(v["choices"][0]["finish_reason"], "stop");
    assert_eq!(v["usage"]["prompt_tokens"], 4);
    assert_eq!(v["usage"]["completion_tokens"], 3);
    assert_eq!(v["usage"]["total_tokens"], 7);
    assert_eq!(sim.requests("openai/gpt-4o"), 1);
}

#[tokio::test]
async fn the_models_list_is_served_and_unserved_paths_are_openais_404() {
    let sim = sim().await;
    sim.set("m", Behaviour::Ok(Reply::text("custom")));
    let (status, _, body) = call(sim.local_addr, "GET", "/v1/models", None, &[]).await;
    assert_eq!(status, 200);
    let v: Value = serde_json::from_slice(&body).unwrap();
    assert_eq!(v["object"], "list");
    assert_eq!(v["data"][0]["id"], "m");
    let (status, _, body) = call(sim.local_addr, "GET", "/v1/nope", None, &[]).await;
    assert_eq!(status, 404);
    let v: Value = serde_json::from_slice(&body).unwrap();
    assert_eq!(v["error"]["message"], "Invalid URL (GET /v1/nope)");
}

/// api.openai.com serves chat completions only under `/v1`: a base URL without it, or with
/// it twice (`…/v1/v1`), gets OpenAI's own 404, so an adapter that builds such a URL fails.
#[tokio::test]
async fn chat_completions_off_the_real_path_get_openais_404() {
    let sim = sim().await;
    sim.set("m", Behaviour::Ok(Reply::text("custom")));
    for path in ["/chat/completions", "/v1/v1/chat/completions", "/api/v1/chat/completions"] {
        let (status, _, body) =
            call(sim.local_addr, "POST", path, Some(request("m", false)), &[]).await;
        assert_eq!(status, 404, "{path}");
        let v: Value = serde_json::from_slice(&body).unwrap();
        assert_eq!(v["error"]["message"], format!("Invalid URL (POST {path})"), "{path}");
        assert_eq!(v["error"]["type"], "invalid_request_error");
    }
    assert_eq!(call(sim.local_addr, "GET", "/models", None, &[]).await.0, 404);
    assert_eq!(sim.requests("m"), 0, "a request to a wrong path reaches no model");
    let (status, _, body) =
        call(sim.local_addr, "POST", "/v1/chat/completions", Some(request("m", false)), &[]).await;
    assert_eq!(status, 200);
    let v: Value = serde_json::from_slice(&body).unwrap();
    assert_eq!(v["choices"][0]["message"]["content"], "custom");
}

/// Azure OpenAI's deployment path is the one other chat-completions path served.
#[tokio::test]
async fn azure_deployment_paths_are_served() {
    let sim = sim().await;
    let path = "/openai/deployments/gpt-4o/chat/completions?api-version=2024-10-21";
    let (status, _, _) = call(sim.local_addr, "POST", path, Some(request("m", false)), &[]).await;
    assert_eq!(status, 200);
    assert_eq!(
        sim.last_request("m").unwrap().path(),
        "/openai/deployments/gpt-4o/chat/completions"
    );
}

#[tokio::test]
async fn scripted_statuses_send_openai_error_bodies() {
    let sim = sim().await;
    let cases: [(u16, &str, Value); 6] = [
        (400, "invalid_request_error", Value::Null),
        (401, "invalid_request_error", Value::Null),
        (404, "invalid_request_error", json!("model_not_found")),
        (429, "requests", json!("rate_limit_exceeded")),
        (500, "server_error", Value::Null),
        (503, "server_error", Value::Null),
    ];
    for (status, kind, code) in cases {
        let model = format!("err/{status}");
        sim.set(&model, Behaviour::Status(StatusReply::new(status)));
        let (got, headers, v) = chat(sim.local_addr, &model).await;
        assert_eq!(got.as_u16(), status);
        let error = v["error"].as_object().unwrap();
        assert_eq!(
            error.keys().collect::<Vec<_>>(),
            ["code", "message", "param", "type"],
            "{status}"
        );
        assert_eq!(error["type"], kind, "{status}");
        assert_eq!(error["code"], code, "{status}");
        assert!(error["param"].is_null());
        assert_eq!(headers.contains_key("retry-after"), status == 429, "{status}");
    }
    let (_, headers, v) = chat(sim.local_addr, "err/429").await;
    assert_eq!(headers["retry-after"], "1");
    assert_eq!(headers["x-ratelimit-remaining-requests"], "0");
    assert_eq!(headers["x-ratelimit-reset-requests"], "1s");
    assert!(v["error"]["message"].as_str().unwrap().starts_with("Rate limit reached for err/429"));
    sim.set(
        "custom",
        Behaviour::Status(StatusReply {
            message: Some("nope".into()),
            retry_after: Some(7),
            ..StatusReply::new(503)
        }),
    );
    let (_, headers, v) = chat(sim.local_addr, "custom").await;
    assert_eq!(
        (v["error"]["message"].as_str(), headers["retry-after"].to_str().unwrap()),
        (Some("nope"), "7")
    );
}

#[tokio::test]
async fn invalid_requests_get_400() {
    let sim = sim().await;
    let (status, _, body) =
        call(sim.local_addr, "POST", "/v1/chat/completions", Some(json!({"model": "m"})), &[])
            .await;
    assert_eq!(status, 400);
    let v: Value = serde_json::from_slice(&body).unwrap();
    assert_eq!(v["error"]["param"], "messages");
}

#[tokio::test]
async fn delay_holds_the_answer() {
    let sim = sim().await;
    sim.set("slow", Behaviour::Ok(Reply { delay_ms: 300, ..Reply::default() }));
    let start = Instant::now();
    let (status, _, _) = chat(sim.local_addr, "slow").await;
    assert_eq!(status, 200);
    assert!(start.elapsed() >= Duration::from_millis(300));
}

#[tokio::test]
async fn malformed_is_200_with_a_body_that_is_not_json() {
    let sim = sim().await;
    sim.set("bad", Behaviour::Malformed);
    let (status, _, body) =
        call(sim.local_addr, "POST", "/v1/chat/completions", Some(request("bad", false)), &[])
            .await;
    assert_eq!(status, 200);
    assert!(serde_json::from_slice::<Value>(&body).is_err());
}

#[tokio::test]
async fn sequence_fails_then_recovers_and_restarts_when_set_again() {
    let sim = sim().await;
    let script: Behaviour = serde_json::from_value(json!({"kind": "sequence",
        "steps": [{"kind": "status", "status": 503}, {"kind": "status", "status": 429}],
        "then": {"kind": "ok", "text": "recovered"}}))
    .unwrap();
    sim.set("flaky", script.clone());
    let statuses: Vec<u16> = {
        let mut out = Vec::new();
        for _ in 0..4 {
            out.push(chat(sim.local_addr, "flaky").await.0.as_u16());
        }
        out
    };
    assert_eq!(statuses, [503, 429, 200, 200]);
    sim.set("flaky", script);
    assert_eq!(chat(sim.local_addr, "flaky").await.0, 503);
    assert_eq!(sim.requests("flaky"), 5);
}

// === Connection faults ===

#[tokio::test]
async fn reset_closes_the_connection_without_a_response() {
    let sim = sim().await;
    sim.set("rst", Behaviour::Reset);
    let mut stream = TcpStream::connect(sim.local_addr).await.unwrap();
    stream.write_all(&raw_request("rst", false)).await.unwrap();
    let mut buf = Vec::new();
    let read =
        tokio::time::timeout(Duration::from_secs(2), stream.read_to_end(&mut buf)).await.unwrap();
    assert!(buf.is_empty(), "got {:?}", String::from_utf8_lossy(&buf));
    // SO_LINGER 0 turns the close into an RST, which the reader sees as a reset.
    assert_eq!(read.unwrap_err().kind(), std::io::ErrorKind::ConnectionReset);
    eventually("close counted", PATIENCE, || sim.stats().connections.closed == 1).await;
}

#[tokio::test]
async fn hang_keeps_the_connection_open_until_the_client_leaves() {
    let sim = sim().await;
    sim.set("hang", Behaviour::Hang);
    let mut stream = TcpStream::connect(sim.local_addr).await.unwrap();
    stream.write_all(&raw_request("hang", false)).await.unwrap();
    let mut buf = [0u8; 64];
    assert!(
        tokio::time::timeout(Duration::from_millis(300), stream.read(&mut buf)).await.is_err(),
        "hang answered"
    );
    assert_eq!(sim.requests("hang"), 1);
    let conns = sim.stats().connections;
    assert_eq!((conns.opened, conns.open), (1, 1));
    drop(stream);
    eventually("close seen", PATIENCE, || sim.stats().connections.closed == 1).await;
    assert_eq!(sim.stats().connections.open, 0);
}

#[tokio::test]
async fn keep_alive_serves_many_requests_on_one_connection() {
    let sim = sim().await;
    let mut client = Client::connect(sim.local_addr).await;
    for _ in 0..3 {
        let resp =
            client.send("POST", "/v1/chat/completions", Some(request("m", false)), &[]).await;
        assert_eq!(resp.status(), 200);
        resp.into_body().collect().await.unwrap();
    }
    assert_eq!(sim.stats().connections.opened, 1);
    assert_eq!(sim.stats().requests, 3);
    drop(client);
    eventually("close seen", PATIENCE, || sim.stats().connections.open == 0).await;
}

// === Streaming ===

#[tokio::test]
async fn stream_sends_openai_chunks_usage_and_done() {
    let sim = sim().await;
    sim.set(
        "s",
        Behaviour::Ok(Reply {
            text: Some("one two three four".into()),
            chunks: 3,
            ..Reply::default()
        }),
    );
    let resp = Client::connect(sim.local_addr)
        .await
        .send("POST", "/v1/chat/completions", Some(request("s", true)), &[])
        .await;
    assert_eq!(resp.status(), 200);
    assert_eq!(resp.headers()["content-type"], "text/event-stream; charset=utf-8");
    let (events, failed) = events(resp).await;
    assert!(!failed);
    // role, 3 content pieces, finish, usage, [DONE]
    assert_eq!(events.len(), 7, "{events:#?}");
    let first: Value = serde_json::from_str(&events[0]).unwrap();
    assert_eq!(first["object"], "chat.completion.chunk");
    assert_eq!(first["model"], "s");
    assert_eq!(first["choices"][0]["delta"]["role"], "assistant");
    assert_eq!(content(&events).concat(), "one two three four");
    let fin: Value = serde_json::from_str(&events[4]).unwrap();
    assert_eq!(fin["choices"][0]["finish_reason"], "stop");
    let usage: Value = serde_json::from_str(&events[5]).unwrap();
    assert_eq!(usage["choices"], json!([]));
    assert_eq!(usage["usage"]["completion_tokens"], 4);
    assert_eq!(usage["id"], first["id"]);
    assert_eq!(events[6], "[DONE]");
}

#[tokio::test]
async fn first_token_and_chunk_delays_pace_the_stream() {
    let sim = sim().await;
    let reply =
        Reply { first_token_delay_ms: 2000, chunk_delay_ms: 50, chunks: 3, ..Reply::default() };
    sim.set("paced", Behaviour::Ok(reply));
    let start = Instant::now();
    let resp = Client::connect(sim.local_addr)
        .await
        .send("POST", "/v1/chat/completions", Some(request("paced", true)), &[])
        .await;
    // Headers and the role chunk come at once; the content waits. Wall time: the simulator
    // serves a real socket. Half the first-token delay tells "at once" from "after the
    // delay" and leaves a loaded machine its slack.
    let head = start.elapsed();
    assert!(head < Duration::from_millis(1000), "head took {head:?}");
    let (events, _) = events(resp).await;
    assert_eq!(content(&events).len(), 3);
    assert!(start.elapsed() >= Duration::from_millis(2100));
}

#[tokio::test]
async fn stall_after_sends_k_chunks_then_holds_the_connection() {
    let sim = sim().await;
    sim.set("stall", Behaviour::Ok(Reply { stall_after: Some(2), ..Reply::default() }));
    let resp = Client::connect(sim.local_addr)
        .await
        .send("POST", "/v1/chat/completions", Some(request("stall", true)), &[])
        .await;
    let mut body = resp.into_body();
    let mut text = String::new();
    let got_more = tokio::time::timeout(Duration::from_millis(400), async {
        while let Some(Ok(frame)) = body.frame().await {
            text.push_str(std::str::from_utf8(frame.data_ref().unwrap()).unwrap());
        }
    })
    .await;
    assert!(got_more.is_err(), "stream ended: {text}");
    assert_eq!(text.matches("\"content\"").count(), 3, "role + 2 pieces: {text}");
    assert_eq!(sim.stats().connections.open, 1);
    drop(body);
    eventually("client disconnect seen", PATIENCE, || sim.stats().connections.closed == 1).await;
}

#[tokio::test]
async fn drop_after_closes_the_stream_abruptly() {
    let sim = sim().await;
    sim.set("drop", Behaviour::Ok(Reply { drop_after: Some(1), ..Reply::default() }));
    let resp = Client::connect(sim.local_addr)
        .await
        .send("POST", "/v1/chat/completions", Some(request("drop", true)), &[])
        .await;
    let (events, failed) = events(resp).await;
    assert!(failed, "the body must end in an error, not a clean end: {events:?}");
    assert_eq!(content(&events), ["Hel"]);
    assert!(!events.iter().any(|e| e == "[DONE]"));
    eventually("close counted", PATIENCE, || sim.stats().connections.closed == 1).await;
}

#[tokio::test]
async fn stream_error_sends_an_in_band_error_frame() {
    let sim = sim().await;
    sim.set(
        "se",
        serde_json::from_value(
            json!({"kind": "stream_error", "after": 2, "message": "upstream died"}),
        )
        .unwrap(),
    );
    let resp = Client::connect(sim.local_addr)
        .await
        .send("POST", "/v1/chat/completions", Some(request("se", true)), &[])
        .await;
    let (events, failed) = events(resp).await;
    assert!(!failed);
    assert_eq!(content(&events).len(), 2);
    let last: Value = serde_json::from_str(events.last().unwrap()).unwrap();
    assert_eq!(
        last,
        json!({"error": {"message": "upstream died", "type": "server_error", "param": null, "code": null}})
    );
    // Non-streaming callers get the same failure as a 500.
    let (status, _, v) = chat(sim.local_addr, "se").await;
    assert_eq!((status.as_u16(), v["error"]["message"].as_str()), (500, Some("upstream died")));
}

#[tokio::test]
async fn client_leaving_mid_stream_is_counted_as_closed() {
    let sim = sim().await;
    sim.set(
        "slowstream",
        Behaviour::Ok(Reply { chunk_delay_ms: 100, chunks: 50, ..Reply::default() }),
    );
    let mut stream = TcpStream::connect(sim.local_addr).await.unwrap();
    stream.write_all(&raw_request("slowstream", true)).await.unwrap();
    let mut buf = [0u8; 4096];
    let n = stream.read(&mut buf).await.unwrap();
    assert!(String::from_utf8_lossy(&buf[..n]).starts_with("HTTP/1.1 200"));
    drop(stream);
    eventually("close seen", PATIENCE, || sim.stats().connections.closed == 1).await;
}

// === Keys and inspection ===

#[tokio::test]
async fn accepted_keys_reject_other_requests_with_401() {
    let sim = sim().await;
    sim.set_keys(vec!["sk-good-key-123456".into()]);
    let body = Some(request("k", false));
    let (status, _, raw) =
        call(sim.local_addr, "POST", "/v1/chat/completions", body.clone(), &[]).await;
    assert_eq!(status, 401);
    let v: Value = serde_json::from_slice(&raw).unwrap();
    assert!(v["error"]["message"].as_str().unwrap().starts_with("You didn't provide an API key"));
    let (status, _, raw) = call(
        sim.local_addr,
        "POST",
        "/v1/chat/completions",
        body.clone(),
        &[("authorization", "Bearer sk-wrong-key-0000000")],
    )
    .await;
    assert_eq!(status, 401);
    let v: Value = serde_json::from_slice(&raw).unwrap();
    assert_eq!(v["error"]["code"], "invalid_api_key");
    let (status, _, _) = call(
        sim.local_addr,
        "POST",
        "/v1/chat/completions",
        body,
        &[("authorization", "Bearer sk-good-key-123456"), ("x-trace", "t1")],
    )
    .await;
    assert_eq!(status, 200);
    assert_eq!(sim.requests("k"), 3);
    let last = sim.last_request("k").unwrap();
    assert_eq!(last.header("Authorization").as_deref(), Some("Bearer sk-good-key-123456"));
    assert_eq!(last.header("x-trace").as_deref(), Some("t1"));
    assert_eq!(last.path(), "/v1/chat/completions");
    assert_eq!(last.body_json()["messages"][0]["content"], "say hi to me");
}

// === Control API ===

#[tokio::test]
async fn control_api_scripts_reads_and_resets() {
    let sim = sim().await;
    let addr = sim.local_addr;
    let put = |path: &'static str, body: Value| async move {
        call(addr, "PUT", path, Some(body), &[]).await.0
    };
    assert_eq!(
        put("/_sim/models/openai/gpt-4o", json!({"kind": "status", "status": 503})).await,
        204
    );
    assert_eq!(
        put("/_sim/models/anthropic%2Fclaude", json!({"kind": "ok", "text": "hi"})).await,
        204
    );
    assert_eq!(put("/_sim/models/x", json!({"kind": "ok", "txt": "typo"})).await, 400);
    let (status, _, _) = call(
        addr,
        "POST",
        "/_sim/script",
        Some(json!({"model": "a/b", "behaviour": {"kind": "malformed"}})),
        &[],
    )
    .await;
    assert_eq!(status, 204);
    let (status, _, _) =
        call(addr, "POST", "/_sim/script", Some(json!({"c": {"kind": "hang"}})), &[]).await;
    assert_eq!(status, 204);

    assert_eq!(chat(addr, "openai/gpt-4o").await.0, 503);
    assert_eq!(chat(addr, "anthropic/claude").await.2["choices"][0]["message"]["content"], "hi");
    assert_eq!(
        call(addr, "POST", "/v1/chat/completions", Some(request("a/b", false)), &[]).await.0,
        200
    );

    let (_, _, body) = call(addr, "GET", "/_sim/models/c", None, &[]).await;
    assert_eq!(serde_json::from_slice::<Value>(&body).unwrap(), json!({"kind": "hang"}));

    let (status, _, body) = call(addr, "GET", "/_sim/stats", None, &[]).await;
    assert_eq!(status, 200);
    let stats: Value = serde_json::from_slice(&body).unwrap();
    assert_eq!(stats["models"]["openai/gpt-4o"], json!({"requests": 1}));
    assert_eq!(stats["requests"], 3);
    assert!(stats["connections"]["opened"].as_u64().unwrap() >= 9);

    let (status, _, _) = call(addr, "GET", "/_sim/last_request?model=never-seen", None, &[]).await;
    assert_eq!(status, 404);
    call(
        addr,
        "POST",
        "/v1/chat/completions",
        Some(request("openai/gpt-4o", false)),
        &[("x-pass", "through")],
    )
    .await;
    let (status, _, body) =
        call(addr, "GET", "/_sim/last_request?model=openai/gpt-4o", None, &[]).await;
    assert_eq!(status, 200);
    let last: Value = serde_json::from_slice(&body).unwrap();
    assert_eq!(last["headers"]["x-pass"], "through");
    assert_eq!(last["body"]["model"], "openai/gpt-4o");
    assert_eq!(last["path"], "/v1/chat/completions");

    assert_eq!(put("/_sim/keys", json!(["k1"])).await, 204);
    assert_eq!(chat(addr, "z").await.0, 401);
    assert_eq!(call(addr, "POST", "/_sim/reset", None, &[]).await.0, 204);
    assert_eq!(chat(addr, "openai/gpt-4o").await.0, 200);
    let stats = sim.stats();
    assert_eq!((stats.requests, stats.models.len()), (1, 1));
}

#[tokio::test]
async fn script_file_loads_into_a_server() {
    let dir = tempfile::tempdir().unwrap();
    let path = dir.path().join("script.json");
    std::fs::write(
        &path,
        r#"{"primary": {"kind": "status", "status": 500}, "fallback": {"kind": "ok"}}"#,
    )
    .unwrap();
    let script = switchyard_sim::load_script(&path).unwrap();
    let sim = sim().await;
    sim.set_script(script);
    assert_eq!(chat(sim.local_addr, "primary").await.0, 500);
    assert_eq!(chat(sim.local_addr, "fallback").await.0, 200);
    std::fs::write(&path, r#"{"primary": {"kind": "nope"}}"#).unwrap();
    assert!(switchyard_sim::load_script(&path).is_err());
}

#[tokio::test]
async fn dropping_the_handle_stops_the_listener() {
    let sim = sim().await;
    let addr = sim.local_addr;
    drop(sim);
    // The listener closes on its task's next turn: polled, not slept on.
    let deadline = Instant::now() + Duration::from_secs(5);
    while TcpStream::connect(addr).await.is_ok() {
        assert!(Instant::now() < deadline, "the listener still accepts after the handle dropped");
        tokio::task::yield_now().await;
    }
}

/// Not a correctness test: `cargo nextest run -p switchyard-sim --run-ignored only` prints
/// the request rate over keep-alive connections, to catch the simulator becoming the
/// bottleneck of the load benchmark.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
#[ignore]
async fn throughput_over_keep_alive() {
    let sim = sim().await;
    let (conns, per_conn) = (32u32, 1000u32);
    let start = Instant::now();
    let mut tasks = Vec::new();
    for _ in 0..conns {
        let addr = sim.local_addr;
        tasks.push(tokio::spawn(async move {
            let mut client = Client::connect(addr).await;
            for _ in 0..per_conn {
                let resp = client
                    .send("POST", "/v1/chat/completions", Some(request("m", false)), &[])
                    .await;
                assert_eq!(resp.status(), 200);
                resp.into_body().collect().await.unwrap();
            }
        }));
    }
    for task in tasks {
        task.await.unwrap();
    }
    let elapsed = start.elapsed();
    let total = conns * per_conn;
    println!(
        "{total} requests in {elapsed:?}: {:.0} req/s",
        f64::from(total) / elapsed.as_secs_f64()
    );
    assert_eq!(sim.stats().connections.opened, u64::from(conns));
}

#[tokio::test]
async fn no_done_ends_the_stream_after_the_finish_and_usage_without_the_marker() {
    let sim = sim().await;
    sim.set("s", Behaviour::Ok(Reply { chunks: 2, no_done: true, ..Reply::default() }));
    let resp = Client::connect(sim.local_addr)
        .await
        .send("POST", "/v1/chat/completions", Some(request("s", true)), &[])
        .await;
    let (events, failed) = events(resp).await;
    assert!(!failed, "the body ends cleanly");
    // role, 2 pieces, finish, usage — and no [DONE]
    assert_eq!(events.len(), 5, "{events:#?}");
    let usage: Value = serde_json::from_str(&events[4]).unwrap();
    assert_eq!(usage["choices"], json!([]));
    assert!(usage["usage"]["total_tokens"].is_u64());
}

#[tokio::test]
async fn bad_frame_after_puts_one_line_that_is_not_json_between_pieces() {
    let sim = sim().await;
    let reply = Reply {
        text: Some("a b c".into()),
        chunks: 3,
        bad_frame_after: Some(1),
        ..Reply::default()
    };
    sim.set("s", Behaviour::Ok(reply));
    let resp = Client::connect(sim.local_addr)
        .await
        .send("POST", "/v1/chat/completions", Some(request("s", true)), &[])
        .await;
    let (events, failed) = events(resp).await;
    assert!(!failed);
    let bad: Vec<usize> = (0..events.len())
        .filter(|i| events[*i] != "[DONE]" && serde_json::from_str::<Value>(&events[*i]).is_err())
        .collect();
    assert_eq!(bad, [2], "after the role chunk and one piece: {events:#?}");
    assert_eq!(content(&events).concat(), "a b c", "the whole answer around it");
    assert_eq!(events.last().map(String::as_str), Some("[DONE]"));
}

#[tokio::test]
async fn a_prompt_past_the_context_window_gets_openais_context_length_400() {
    let sim = sim().await;
    // The request's prompt is four words.
    sim.set("small", Behaviour::Ok(Reply { context_window: Some(3), ..Reply::default() }));
    sim.set("fits", Behaviour::Ok(Reply { context_window: Some(4), ..Reply::default() }));
    let (status, _, v) = chat(sim.local_addr, "small").await;
    assert_eq!(status, StatusCode::BAD_REQUEST);
    assert_eq!(v["error"]["code"], "context_length_exceeded");
    assert_eq!(v["error"]["type"], "invalid_request_error");
    assert_eq!(v["error"]["param"], "messages");
    assert!(
        v["error"]["message"]
            .as_str()
            .unwrap()
            .starts_with("This model's maximum context length is 3 tokens.")
    );
    let (status, _, _) = chat(sim.local_addr, "fits").await;
    assert_eq!(status, StatusCode::OK);
}

// === Prefill continuation ===

/// A request that continues `prefill`: the user's turn, then the start of the answer.
fn continuation(model: &str, prefill: &str, stream: bool) -> Value {
    json!({"model": model, "stream": stream, "stream_options": {"include_usage": true},
           "continue_final_message": true, "add_generation_prompt": false,
           "messages": [{"role": "user", "content": "say hi to me"},
                        {"role": "assistant", "content": prefill, "prefix": true}]})
}

#[tokio::test]
async fn a_prefill_that_starts_the_answer_gets_only_the_rest_streamed_from_the_cut_piece() {
    let sim = sim().await;
    // "one two three four five" in 5 pieces: "one ", "two t", "hree", " four", " five".
    let text = "one two three four five";
    sim.set("c", Behaviour::Ok(Reply { text: Some(text.into()), ..Reply::default() }));
    // A prefill that ends inside the third piece: its rest, then the last two pieces.
    let resp = Client::connect(sim.local_addr)
        .await
        .send("POST", "/v1/chat/completions", Some(continuation("c", "one two th", true)), &[])
        .await;
    let (frames, failed) = events(resp).await;
    assert!(!failed);
    assert_eq!(content(&frames), ["ree", " four", " five"]);
    let usage: Value = serde_json::from_str(&frames[frames.len() - 2]).unwrap();
    // The continuation's own tokens: "ree four five".
    assert_eq!(usage["usage"]["completion_tokens"], 3);
    assert_eq!(frames.last().map(String::as_str), Some("[DONE]"));

    // A stream cut after 2 of 5 pieces, continued: 3 pieces, which a scripted drop after 2
    // cuts again (the faults count this stream's own pieces).
    sim.set(
        "c",
        Behaviour::Ok(Reply { text: Some(text.into()), drop_after: Some(2), ..Reply::default() }),
    );
    let resp = Client::connect(sim.local_addr)
        .await
        .send("POST", "/v1/chat/completions", Some(continuation("c", "one two t", true)), &[])
        .await;
    let (cut, failed) = events(resp).await;
    assert!(failed);
    assert_eq!(content(&cut), ["hree", " four"]);
}

#[tokio::test]
async fn a_prefill_that_is_not_a_prefix_gets_the_whole_answer() {
    let sim = sim().await;
    sim.set("c", Behaviour::Ok(Reply::text("one two three")));
    let (_, _, body) = call(
        sim.local_addr,
        "POST",
        "/v1/chat/completions",
        Some(continuation("c", "uno", false)),
        &[],
    )
    .await;
    let v: Value = serde_json::from_slice(&body).unwrap();
    assert_eq!(v["choices"][0]["message"]["content"], "one two three");
    let (_, _, body) = call(
        sim.local_addr,
        "POST",
        "/v1/chat/completions",
        Some(continuation("c", "one two", false)),
        &[],
    )
    .await;
    let v: Value = serde_json::from_slice(&body).unwrap();
    assert_eq!(v["choices"][0]["message"]["content"], " three");
    assert_eq!(v["usage"]["completion_tokens"], 1);
}

#[tokio::test]
async fn rejects_prefill_answers_a_prefill_with_openais_400_and_other_requests_as_usual() {
    let sim = sim().await;
    sim.set(
        "r",
        Behaviour::Ok(Reply { rejects_prefill: true, delay_ms: 10_000, ..Reply::default() }),
    );
    let (status, _, body) = call(
        sim.local_addr,
        "POST",
        "/v1/chat/completions",
        Some(continuation("r", "Hel", true)),
        &[],
    )
    .await;
    assert_eq!(status, 400);
    let v: Value = serde_json::from_slice(&body).unwrap();
    assert_eq!(v["error"]["type"], "invalid_request_error");
    assert_eq!(
        v["error"]["message"],
        "Unrecognized request argument supplied: continue_final_message"
    );
    sim.set("r", Behaviour::Ok(Reply { rejects_prefill: true, ..Reply::default() }));
    let (status, _, v) = chat(sim.local_addr, "r").await;
    assert_eq!(status, 200);
    assert_eq!(v["choices"][0]["message"]["content"], "Hello from r.");
}

fn with_tools(model: &str, stream: bool, last: Value) -> Value {
    json!({"model": model, "stream": stream, "stream_options": {"include_usage": true},
           "messages": [{"role": "user", "content": "weather in Paris?"}, last],
           "tools": [
               {"type": "function", "function": {"name": "clock", "parameters": {"type": "object"}}},
               {"type": "function", "function": {"name": "weather", "parameters": {
                   "type": "object",
                   "properties": {"city": {"type": "string"}, "days": {"type": "integer"}},
                   "required": ["city", "days"]}}}],
           "tool_choice": {"type": "function", "function": {"name": "weather"}}})
}

#[tokio::test]
async fn call_tools_answers_a_request_offering_tools_with_a_call_of_the_chosen_tool() {
    let sim = sim().await;
    let user = json!({"role": "user", "content": "please"});
    // Off by default: the same request gets text.
    let (_, _, body) = call(
        sim.local_addr,
        "POST",
        "/v1/chat/completions",
        Some(with_tools("t", false, user.clone())),
        &[],
    )
    .await;
    let v: Value = serde_json::from_slice(&body).unwrap();
    assert_eq!(v["choices"][0]["message"]["content"], "Hello from t.");
    assert!(v["choices"][0]["message"].get("tool_calls").is_none(), "{v}");

    sim.set("t", Behaviour::Ok(Reply { call_tools: true, chunks: 2, ..Reply::default() }));
    let (status, _, body) = call(
        sim.local_addr,
        "POST",
        "/v1/chat/completions",
        Some(with_tools("t", false, user.clone())),
        &[],
    )
    .await;
    assert_eq!(status, 200);
    let v: Value = serde_json::from_slice(&body).unwrap();
    let message = &v["choices"][0]["message"];
    assert_eq!(message["content"], Value::Null);
    assert_eq!(v["choices"][0]["finish_reason"], "tool_calls");
    let id = v["id"].as_str().unwrap().trim_start_matches("chatcmpl-");
    let calls = message["tool_calls"].as_array().unwrap();
    assert_eq!(calls.len(), 1);
    assert_eq!(calls[0]["id"], format!("call_{id}"));
    assert_eq!(calls[0]["type"], "function");
    assert_eq!(calls[0]["function"]["name"], "weather");
    let arguments: Value =
        serde_json::from_str(calls[0]["function"]["arguments"].as_str().unwrap()).unwrap();
    assert_eq!(arguments, json!({"city": "sim", "days": 1}));

    // Streamed: the call opens with its id and name, then its arguments come in pieces.
    let resp = Client::connect(sim.local_addr)
        .await
        .send("POST", "/v1/chat/completions", Some(with_tools("t", true, user)), &[])
        .await;
    let (events, failed) = events(resp).await;
    assert!(!failed);
    let frames: Vec<Value> = events.iter().filter_map(|e| serde_json::from_str(e).ok()).collect();
    let deltas: Vec<&Value> =
        frames.iter().filter_map(|f| f["choices"][0]["delta"]["tool_calls"].get(0)).collect();
    assert_eq!(deltas[0]["index"], 0);
    assert_eq!(deltas[0]["function"]["name"], "weather");
    assert!(deltas[0]["id"].as_str().unwrap().starts_with("call_"));
    assert!(
        deltas[1..].iter().all(|d| d.get("id").is_none() && d["function"].get("name").is_none())
    );
    let streamed: String =
        deltas.iter().filter_map(|d| d["function"]["arguments"].as_str()).collect();
    assert_eq!(serde_json::from_str::<Value>(&streamed).unwrap(), arguments);
    assert!(content(&events).is_empty(), "{events:#?}");
    let finish = frames.iter().find_map(|f| f["choices"][0]["finish_reason"].as_str());
    assert_eq!(finish, Some("tool_calls"));
    assert_eq!(events.last().unwrap(), "[DONE]");

    // After the tool's result, and with tool_choice none, the model answers in text.
    let result = json!({"role": "tool", "tool_call_id": "call_1", "content": "sunny"});
    let (_, _, body) = call(
        sim.local_addr,
        "POST",
        "/v1/chat/completions",
        Some(with_tools("t", false, result)),
        &[],
    )
    .await;
    let v: Value = serde_json::from_slice(&body).unwrap();
    assert_eq!(v["choices"][0]["message"]["content"], "Hello from t.");
    assert_eq!(v["choices"][0]["finish_reason"], "stop");
    let mut none = with_tools("t", false, json!({"role": "user", "content": "please"}));
    none["tool_choice"] = json!("none");
    let (_, _, body) = call(sim.local_addr, "POST", "/v1/chat/completions", Some(none), &[]).await;
    let v: Value = serde_json::from_slice(&body).unwrap();
    assert_eq!(v["choices"][0]["message"]["content"], "Hello from t.");
}
