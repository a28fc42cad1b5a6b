//! `POST /v1/messages`: the scripted behaviours in Anthropic's wire format, over loopback.
#![allow(clippy::unwrap_used, clippy::expect_used)]

use std::net::SocketAddr;

use bytes::Bytes;
use http_body_util::{BodyExt, Full};
use hyper::{HeaderMap, Request, StatusCode};
use hyper_util::rt::TokioIo;
use serde_json::{Value, json};
use tokio::net::TcpStream;

use switchyard_sim::{Behaviour, Reply, SimServer, StatusReply, StreamErrorReply, start};

async fn sim() -> SimServer {
    start("127.0.0.1:0".parse().unwrap()).await.unwrap()
}

/// One request on a fresh connection: status, headers, whole body (`None` if the
/// connection broke first).
async fn post(
    addr: SocketAddr,
    body: Value,
    headers: &[(&str, &str)],
) -> Option<(StatusCode, HeaderMap, Bytes)> {
    post_to(addr, "/v1/messages", body, headers).await
}

async fn post_to(
    addr: SocketAddr,
    path: &str,
    body: Value,
    headers: &[(&str, &str)],
) -> Option<(StatusCode, HeaderMap, Bytes)> {
    let stream = TcpStream::connect(addr).await.unwrap();
    let (mut sender, conn) =
        hyper::client::conn::http1::handshake(TokioIo::new(stream)).await.unwrap();
    tokio::spawn(async move {
        let _ = conn.await;
    });
    let mut req = Request::post(path)
        .header("host", "sim")
        .header("content-type", "application/json")
        .header("anthropic-version", "2023-06-01");
    for (k, v) in headers {
        req = req.header(*k, *v);
    }
    let body = Bytes::from(serde_json::to_vec(&body).unwrap());
    let resp = sender.send_request(req.body(Full::new(body)).unwrap()).await.ok()?;
    let (parts, body) = resp.into_parts();
    let body = body.collect().await.ok()?.to_bytes();
    Some((parts.status, parts.headers, body))
}

fn request(model: &str, stream: bool) -> Value {
    json!({"model": model, "max_tokens": 64, "stream": stream,
           "messages": [{"role": "user", "content": "say hi to me"}]})
}

/// `(event name, data)` of every SSE frame.
fn events(body: &[u8]) -> Vec<(String, Value)> {
    std::str::from_utf8(body)
        .unwrap()
        .split("\n\n")
        .filter(|f| !f.trim().is_empty())
        .map(|f| {
            let mut name = String::new();
            let mut data = Value::Null;
            for line in f.lines() {
                if let Some(n) = line.strip_prefix("event: ") {
                    name = n.to_owned();
                } else if let Some(d) = line.strip_prefix("data: ") {
                    data = serde_json::from_str(d).unwrap_or(Value::String(d.to_owned()));
                }
            }
            (name, data)
        })
        .collect()
}

#[tokio::test]
async fn an_unscripted_model_answers_an_anthropic_message() {
    let s = sim().await;
    let (status, headers, body) =
        post(s.local_addr, request("claude-sim", false), &[]).await.unwrap();
    assert_eq!(status, StatusCode::OK);
    assert!(headers.contains_key("request-id"));
    let v: Value = serde_json::from_slice(&body).unwrap();
    assert_eq!(v["type"], "message");
    assert!(v["id"].as_str().unwrap().starts_with("msg_"));
    assert_eq!(v["content"], json!([{"type": "text", "text": "Hello from claude-sim."}]));
    assert_eq!(v["stop_reason"], "end_turn");
    assert_eq!(v["usage"]["input_tokens"], 4);
    assert_eq!(v["usage"]["output_tokens"], 3);
    assert_eq!(s.requests("claude-sim"), 1);
    assert_eq!(s.last_request("claude-sim").unwrap().path(), "/v1/messages");
}

#[tokio::test]
async fn a_stream_is_anthropics_event_sequence() {
    let s = sim().await;
    s.set("claude-sim", Behaviour::Ok(Reply { chunks: 2, ..Reply::text("one two") }));
    let (status, headers, body) =
        post(s.local_addr, request("claude-sim", true), &[]).await.unwrap();
    assert_eq!(status, StatusCode::OK);
    assert!(headers["content-type"].to_str().unwrap().starts_with("text/event-stream"));
    let events = events(&body);
    let names: Vec<&str> = events.iter().map(|(n, _)| n.as_str()).collect();
    assert_eq!(
        names,
        [
            "message_start",
            "content_block_start",
            "ping",
            "content_block_delta",
            "content_block_delta",
            "content_block_stop",
            "message_delta",
            "message_stop"
        ]
    );
    for (name, data) in &events {
        assert_eq!(data["type"], name.as_str(), "the data's type names the event");
    }
    let text: String = events.iter().filter_map(|(_, d)| d["delta"]["text"].as_str()).collect();
    assert_eq!(text, "one two");
    assert_eq!(events[6].1["delta"]["stop_reason"], "end_turn");
    assert_eq!(events[6].1["usage"]["output_tokens"], 2);
}

#[tokio::test]
async fn a_tools_request_gets_a_tool_use_plain_and_streamed() {
    let s = sim().await;
    let mut body = request("claude-sim", false);
    body["tools"] = json!([{"name": "get_weather", "input_schema": {"type": "object",
        "properties": {"location": {"type": "string"}}, "required": ["location"]}}]);
    body["tool_choice"] = json!({"type": "any"});
    let (_, _, plain) = post(s.local_addr, body.clone(), &[]).await.unwrap();
    let v: Value = serde_json::from_slice(&plain).unwrap();
    assert_eq!(v["stop_reason"], "tool_use");
    assert_eq!(v["content"][0]["name"], "get_weather");
    assert_eq!(v["content"][0]["input"], json!({"location": "sim"}));
    body["stream"] = json!(true);
    let (_, _, streamed) = post(s.local_addr, body, &[]).await.unwrap();
    let events = events(&streamed);
    assert_eq!(events[1].1["content_block"]["type"], "tool_use");
    let json: String =
        events.iter().filter_map(|(_, d)| d["delta"]["partial_json"].as_str()).collect();
    assert_eq!(serde_json::from_str::<Value>(&json).unwrap(), json!({"location": "sim"}));
    assert!(events.iter().any(|(_, d)| d["delta"]["stop_reason"] == "tool_use"));
}

#[tokio::test]
async fn scripted_statuses_send_anthropic_error_bodies() {
    let s = sim().await;
    for (status, kind) in [
        (529, "overloaded_error"),
        (429, "rate_limit_error"),
        (500, "api_error"),
        (404, "not_found_error"),
        (400, "invalid_request_error"),
    ] {
        s.set("claude-sim", Behaviour::Status(StatusReply::new(status)));
        let (got, headers, body) =
            post(s.local_addr, request("claude-sim", false), &[]).await.unwrap();
        assert_eq!(got.as_u16(), status);
        let v: Value = serde_json::from_slice(&body).unwrap();
        assert_eq!(v["type"], "error");
        assert_eq!(v["error"]["type"], kind, "{status}");
        assert!(v["request_id"].is_string());
        assert_eq!(status == 429, headers.contains_key("retry-after"));
    }
    let (status, _, body) =
        post(s.local_addr, json!({"model": "claude-sim", "messages": []}), &[]).await.unwrap();
    assert_eq!(status, StatusCode::BAD_REQUEST);
    assert!(String::from_utf8_lossy(&body).contains("max_tokens"));
}

#[tokio::test]
async fn a_prompt_past_the_context_window_is_too_long_and_no_message_stop_ends_without_it() {
    let s = sim().await;
    s.set("claude-sim", Behaviour::Ok(Reply { context_window: Some(3), ..Reply::default() }));
    let (status, _, body) = post(s.local_addr, request("claude-sim", false), &[]).await.unwrap();
    assert_eq!(status, StatusCode::BAD_REQUEST);
    let v: Value = serde_json::from_slice(&body).unwrap();
    assert_eq!(v["error"]["type"], "invalid_request_error");
    assert_eq!(v["error"]["message"], "prompt is too long: 4 tokens > 3 maximum");
    s.set("claude-sim", Behaviour::Ok(Reply { no_done: true, ..Reply::default() }));
    let (_, _, body) = post(s.local_addr, request("claude-sim", true), &[]).await.unwrap();
    let names: Vec<String> = events(&body).into_iter().map(|(n, _)| n).collect();
    assert_eq!(names.last().map(String::as_str), Some("message_delta"), "{names:?}");
}

#[tokio::test]
async fn stream_error_is_an_in_band_overloaded_error_event() {
    let s = sim().await;
    s.set("claude-sim", Behaviour::StreamError(StreamErrorReply { after: 1, message: None }));
    let (_, _, body) = post(s.local_addr, request("claude-sim", true), &[]).await.unwrap();
    let events = events(&body);
    let (name, data) = events.last().unwrap();
    assert_eq!(name, "error");
    assert_eq!(data["error"], json!({"type": "overloaded_error", "message": "Overloaded"}));
    assert_eq!(events.iter().filter(|(n, _)| n == "content_block_delta").count(), 1);
    // Not streaming, the same failure is Anthropic's 529.
    let (status, _, _) = post(s.local_addr, request("claude-sim", false), &[]).await.unwrap();
    assert_eq!(status.as_u16(), 529);
}

#[tokio::test]
async fn drop_after_and_reset_break_the_connection() {
    let s = sim().await;
    s.set("claude-sim", Behaviour::Ok(Reply { drop_after: Some(1), ..Reply::default() }));
    assert!(post(s.local_addr, request("claude-sim", true), &[]).await.is_none());
    s.set("claude-sim", Behaviour::Reset);
    assert!(post(s.local_addr, request("claude-sim", false), &[]).await.is_none());
    s.set("claude-sim", Behaviour::Malformed);
    let (status, _, body) = post(s.local_addr, request("claude-sim", false), &[]).await.unwrap();
    assert_eq!(status, StatusCode::OK);
    assert!(serde_json::from_slice::<Value>(&body).is_err());
}

#[tokio::test]
async fn accepted_keys_are_checked_in_x_api_key() {
    let s = sim().await;
    s.set_keys(vec!["sk-ant-good".into()]);
    let (status, _, body) = post(s.local_addr, request("claude-sim", false), &[]).await.unwrap();
    assert_eq!(status, StatusCode::UNAUTHORIZED);
    let v: Value = serde_json::from_slice(&body).unwrap();
    assert_eq!(v["error"]["type"], "authentication_error");
    let bearer = [("authorization", "Bearer sk-ant-good")];
    assert_eq!(post(s.local_addr, request("claude-sim", false), &bearer).await.unwrap().0, 401);
    let key = [("x-api-key", "sk-ant-good")];
    assert_eq!(post(s.local_addr, request("claude-sim", false), &key).await.unwrap().0, 200);
}

/// api.anthropic.com serves Messages at `/v1/messages` only: a base URL that already ends in
/// `/v1` (`…/v1/v1/messages`) or lacks it gets Anthropic's own 404 body.
#[tokio::test]
async fn messages_off_the_real_path_get_anthropics_404() {
    let s = sim().await;
    for path in ["/v1/v1/messages", "/messages", "/v1/complete"] {
        let (status, _, body) =
            post_to(s.local_addr, path, request("claude-sim", false), &[]).await.unwrap();
        assert_eq!(status, 404, "{path}");
        let v: Value = serde_json::from_slice(&body).unwrap();
        assert_eq!(v["type"], "error", "{path}: {v}");
        assert_eq!(v["error"]["type"], "not_found_error", "{path}: {v}");
        assert!(v["request_id"].is_string());
    }
    assert_eq!(s.requests("claude-sim"), 0, "a request to a wrong path reaches no model");
}

fn continuation(model: &str, prefill: &str, stream: bool) -> Value {
    json!({"model": model, "max_tokens": 64, "stream": stream,
           "messages": [{"role": "user", "content": "say hi to me"},
                        {"role": "assistant", "content": [{"type": "text", "text": prefill}]}]})
}

#[tokio::test]
async fn a_prefill_gets_the_rest_of_the_answer_and_rejects_prefill_gets_anthropics_400() {
    let sim = sim().await;
    sim.set("c", Behaviour::Ok(Reply::text("one two three four five")));
    let (status, _, body) =
        post(sim.local_addr, continuation("c", "one two t", true), &[]).await.unwrap();
    assert_eq!(status, 200);
    let events = events(&body);
    let deltas: Vec<&str> = events
        .iter()
        .filter(|(n, _)| n == "content_block_delta")
        .filter_map(|(_, d)| d["delta"]["text"].as_str())
        .collect();
    assert_eq!(deltas, ["hree", " four", " five"]);
    let delta = events.iter().find(|(n, _)| n == "message_delta").unwrap();
    assert_eq!(delta.1["usage"]["output_tokens"], 3);
    let (_, _, body) = post(sim.local_addr, continuation("c", "nope", false), &[]).await.unwrap();
    let v: Value = serde_json::from_slice(&body).unwrap();
    assert_eq!(v["content"][0]["text"], "one two three four five");

    sim.set("r", Behaviour::Ok(Reply { rejects_prefill: true, ..Reply::default() }));
    let (status, _, body) =
        post(sim.local_addr, continuation("r", "Hel", true), &[]).await.unwrap();
    assert_eq!(status, 400);
    let v: Value = serde_json::from_slice(&body).unwrap();
    assert_eq!(v["type"], "error");
    assert_eq!(v["error"]["type"], "invalid_request_error");
    let (status, _, _) = post(sim.local_addr, request("r", false), &[]).await.unwrap();
    assert_eq!(status, 200);
}
