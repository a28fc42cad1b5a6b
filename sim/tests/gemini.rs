//! The Gemini endpoints over real loopback HTTP: the same behaviours as for OpenAI, in
//! Gemini's wire format.
#![allow(clippy::unwrap_used, clippy::expect_used)]

use std::net::SocketAddr;
use std::time::Duration;

use bytes::Bytes;
use http_body_util::{BodyExt, Full};
use hyper::body::Incoming;
use hyper::{Request, Response, StatusCode};
use hyper_util::rt::TokioIo;
use serde_json::{Value, json};
use tokio::net::TcpStream;

use switchyard_sim::{Behaviour, Reply, SimServer, StatusReply, StreamErrorReply, start};

async fn sim() -> SimServer {
    start("127.0.0.1:0".parse().unwrap()).await.unwrap()
}

async fn send(
    addr: SocketAddr,
    path: &str,
    body: &Value,
    headers: &[(&str, &str)],
) -> Response<Incoming> {
    let stream = TcpStream::connect(addr).await.unwrap();
    let (mut sender, conn) =
        hyper::client::conn::http1::handshake(TokioIo::new(stream)).await.unwrap();
    tokio::spawn(async move {
        let _ = conn.await;
    });
    let mut req =
        Request::post(path).header("host", "sim").header("content-type", "application/json");
    for (k, v) in headers {
        req = req.header(*k, *v);
    }
    let body = Bytes::from(serde_json::to_vec(body).unwrap());
    sender.send_request(req.body(Full::new(body)).unwrap()).await.unwrap()
}

fn request() -> Value {
    json!({"contents": [{"role": "user", "parts": [{"text": "say hi to me"}]}]})
}

async fn generate(addr: SocketAddr, model: &str) -> (StatusCode, Value) {
    let path = format!("/v1beta/models/{model}:generateContent");
    let resp = send(addr, &path, &request(), &[]).await;
    let status = resp.status();
    let body = resp.into_body().collect().await.unwrap().to_bytes();
    (status, serde_json::from_slice(&body).unwrap_or(Value::Null))
}

/// `data:` payloads of a stream, and whether the body ended in an error.
async fn stream(addr: SocketAddr, model: &str) -> (StatusCode, Vec<String>, bool) {
    let path = format!("/v1beta/models/{model}:streamGenerateContent?alt=sse");
    let resp = send(addr, &path, &request(), &[]).await;
    let status = resp.status();
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
        .split("\r\n\r\n")
        .filter(|e| !e.is_empty())
        .map(|e| e.strip_prefix("data: ").unwrap().to_owned())
        .collect();
    (status, data, failed)
}

fn texts(events: &[String]) -> Vec<String> {
    events
        .iter()
        .filter_map(|e| serde_json::from_str::<Value>(e).ok())
        .filter_map(|v| {
            v["candidates"][0]["content"]["parts"][0]["text"].as_str().map(str::to_owned)
        })
        .filter(|t| !t.is_empty())
        .collect()
}

#[tokio::test]
async fn generate_content_answers_with_the_model_from_the_path() {
    let sim = sim().await;
    let (status, v) = generate(sim.local_addr, "gemini-sim").await;
    assert_eq!(status, StatusCode::OK);
    assert_eq!(v["candidates"][0]["content"]["parts"][0]["text"], "Hello from gemini-sim.");
    assert_eq!(v["candidates"][0]["finishReason"], "STOP");
    assert_eq!(v["usageMetadata"]["promptTokenCount"], 4);
    assert_eq!(v["modelVersion"], "gemini-sim");
    assert_eq!(sim.requests("gemini-sim"), 1);
    assert!(sim.last_request("gemini-sim").unwrap().path().ends_with(":generateContent"));
}

#[tokio::test]
async fn a_stream_sends_chunks_then_a_finish_chunk_and_ends() {
    let sim = sim().await;
    let (status, events, failed) = stream(sim.local_addr, "gemini-sim").await;
    assert_eq!(status, StatusCode::OK);
    assert!(!failed);
    assert_eq!(texts(&events).concat(), "Hello from gemini-sim.");
    let last: Value = serde_json::from_str(events.last().unwrap()).unwrap();
    assert_eq!(last["candidates"][0]["finishReason"], "STOP");
    assert_eq!(last["usageMetadata"]["candidatesTokenCount"], 3);
    assert!(!events.iter().any(|e| e == "[DONE]"));
}

#[tokio::test]
async fn scripted_statuses_send_google_error_bodies() {
    let sim = sim().await;
    for (status, google) in [
        (429, "RESOURCE_EXHAUSTED"),
        (503, "UNAVAILABLE"),
        (400, "INVALID_ARGUMENT"),
        (500, "INTERNAL"),
    ] {
        sim.set("g", Behaviour::Status(StatusReply::new(status)));
        let (got, v) = generate(sim.local_addr, "g").await;
        assert_eq!(got.as_u16(), status);
        assert_eq!(v["error"]["code"], status);
        assert_eq!(v["error"]["status"], google);
        assert!(v["error"]["message"].as_str().is_some_and(|m| !m.is_empty()));
    }
}

#[tokio::test]
async fn a_prompt_past_the_context_window_gets_googles_token_count_400() {
    let sim = sim().await;
    sim.set("g", Behaviour::Ok(Reply { context_window: Some(3), ..Reply::default() }));
    let (status, v) = generate(sim.local_addr, "g").await;
    assert_eq!(status, StatusCode::BAD_REQUEST);
    assert_eq!(v["error"]["status"], "INVALID_ARGUMENT");
    assert_eq!(
        v["error"]["message"],
        "The input token count (4) exceeds the maximum number of tokens allowed (3)."
    );
}

#[tokio::test]
async fn keys_are_read_from_x_goog_api_key_when_set() {
    let sim = sim().await;
    sim.set_keys(vec!["AIza-good".into()]);
    let path = "/v1beta/models/g:generateContent";
    let missing = send(sim.local_addr, path, &request(), &[]).await;
    assert_eq!(missing.status(), StatusCode::FORBIDDEN);
    let wrong = send(sim.local_addr, path, &request(), &[("x-goog-api-key", "nope")]).await;
    assert_eq!(wrong.status(), StatusCode::BAD_REQUEST);
    let body: Value =
        serde_json::from_slice(&wrong.into_body().collect().await.unwrap().to_bytes()).unwrap();
    assert_eq!(body["error"]["details"][0]["reason"], "API_KEY_INVALID");
    let good = send(sim.local_addr, path, &request(), &[("x-goog-api-key", "AIza-good")]).await;
    assert_eq!(good.status(), StatusCode::OK);
}

#[tokio::test]
async fn tools_get_a_function_call() {
    let sim = sim().await;
    let body = json!({"contents": [{"role": "user", "parts": [{"text": "weather?"}]}],
        "tools": [{"functionDeclarations": [{"name": "get_weather", "parameters": {"type": "OBJECT",
            "properties": {"city": {"type": "STRING"}}, "required": ["city"]}}]}]});
    let resp = send(sim.local_addr, "/v1beta/models/g:generateContent", &body, &[]).await;
    let v: Value =
        serde_json::from_slice(&resp.into_body().collect().await.unwrap().to_bytes()).unwrap();
    assert_eq!(
        v["candidates"][0]["content"]["parts"][0]["functionCall"],
        json!({"name": "get_weather", "args": {"city": "sim"}})
    );
}

#[tokio::test]
async fn malformed_drop_and_stream_error_behave_as_for_openai() {
    let sim = sim().await;
    sim.set("m", Behaviour::Malformed);
    let path = "/v1beta/models/m:generateContent";
    let resp = send(sim.local_addr, path, &request(), &[]).await;
    assert_eq!(resp.status(), StatusCode::OK);
    let body = resp.into_body().collect().await.unwrap().to_bytes();
    assert!(serde_json::from_slice::<Value>(&body).is_err());

    sim.set("d", Behaviour::Ok(Reply { drop_after: Some(1), ..Reply::default() }));
    let (_, events, failed) = stream(sim.local_addr, "d").await;
    assert!(failed, "{events:?}");
    assert_eq!(texts(&events), ["He"]);

    sim.set(
        "e",
        Behaviour::StreamError(StreamErrorReply { after: 2, message: Some("boom".into()) }),
    );
    let (_, events, _) = stream(sim.local_addr, "e").await;
    assert_eq!(texts(&events).len(), 2);
    let last: Value = serde_json::from_str(events.last().unwrap()).unwrap();
    assert_eq!(last["error"]["message"], "boom");

    sim.set("s", Behaviour::Ok(Reply { stall_after: Some(1), ..Reply::default() }));
    // Nothing to poll for: the proof is an end that never comes. 300 ms of silence is far
    // longer than the simulator takes to send a whole unstalled stream.
    let stalled =
        tokio::time::timeout(Duration::from_millis(300), stream(sim.local_addr, "s")).await;
    assert!(stalled.is_err(), "a stalled stream must not end");
}

/// Google serves generateContent under `/v1beta/models/`: a wrong version or a doubled prefix
/// gets Google's 404 envelope (`NOT_FOUND`), so a wrong base URL fails.
#[tokio::test]
async fn generate_off_the_real_path_gets_googles_404() {
    let sim = sim().await;
    for path in [
        "/v1/models/g:generateContent",
        "/v1beta/v1beta/models/g:generateContent",
        "/v1beta/models/g:generateContents",
    ] {
        let resp = send(sim.local_addr, path, &request(), &[("x-goog-api-key", "AIza-k")]).await;
        assert_eq!(resp.status(), 404, "{path}");
        let body = resp.into_body().collect().await.unwrap().to_bytes();
        let v: Value = serde_json::from_slice(&body).unwrap();
        assert_eq!(v["error"]["code"], 404, "{path}: {v}");
        assert_eq!(v["error"]["status"], "NOT_FOUND", "{path}: {v}");
    }
    assert_eq!(sim.requests("g"), 0, "a request to a wrong path reaches no model");
}

#[tokio::test]
async fn a_model_turn_last_gets_the_rest_and_rejects_prefill_gets_invalid_argument() {
    let sim = sim().await;
    sim.set("c", Behaviour::Ok(Reply::text("one two three four five")));
    let body = json!({"contents": [
        {"role": "user", "parts": [{"text": "say hi to me"}]},
        {"role": "model", "parts": [{"text": "one two t"}]}]});
    let path = "/v1beta/models/c:generateContent";
    let resp = send(sim.local_addr, path, &body, &[]).await;
    assert_eq!(resp.status(), 200);
    let v: Value =
        serde_json::from_slice(&resp.into_body().collect().await.unwrap().to_bytes()).unwrap();
    assert_eq!(v["candidates"][0]["content"]["parts"][0]["text"], "hree four five");
    assert_eq!(v["usageMetadata"]["candidatesTokenCount"], 3);

    sim.set("r", Behaviour::Ok(Reply { rejects_prefill: true, ..Reply::default() }));
    let resp =
        send(sim.local_addr, "/v1beta/models/r:streamGenerateContent?alt=sse", &body, &[]).await;
    assert_eq!(resp.status(), 400);
    let v: Value =
        serde_json::from_slice(&resp.into_body().collect().await.unwrap().to_bytes()).unwrap();
    assert_eq!(v["error"]["status"], "INVALID_ARGUMENT");
    let (status, _) = generate(sim.local_addr, "r").await;
    assert_eq!(status, 200);
}
