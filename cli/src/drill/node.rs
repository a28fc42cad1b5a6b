//! The drill's side of a node's HTTP API: requests as an app sends them, through Chat
//! Completions or Anthropic's Messages (plain and streamed, timed chunk by chunk), `/readyz` for the applied config version, `/metrics` for
//! breaker transitions. One pooled client; `http://` and `https://` node URLs.

use std::collections::BTreeMap;
use std::time::{Duration, Instant};

use bytes::Bytes;
use http::{Request, StatusCode, Uri};
use http_body_util::{BodyExt, Full};
use hyper_util::client::legacy::Client;
use hyper_util::client::legacy::connect::HttpConnector;
use hyper_util::rt::TokioExecutor;
use serde_json::Value;
use switchyard_tls::words;

use crate::drill::observe::{Observation, StreamTiming, attempts, continued, error_code};
use crate::drill::report::Surface;

type Https = hyper_rustls::HttpsConnector<HttpConnector>;

/// Why the node could not be used.
#[derive(Debug, thiserror::Error)]
pub enum NodeError {
    #[error("--node {0:?}: {1}")]
    Url(String, String),
    #[error("the node at {url} does not answer: {reason}")]
    Unreachable { url: String, reason: String },
    #[error("the node at {url} answered {path} with {status}: {body}")]
    Answer { url: String, path: &'static str, status: u16, body: String },
}

#[derive(Clone)]
pub struct Node {
    client: Client<Https, Full<Bytes>>,
    base: String,
    key: String,
    surface: Surface,
}

/// What a request asks of the chain.
#[derive(Clone, Debug)]
pub struct Ask {
    pub model: String,
    /// Sent as `fallback_models` when not empty; otherwise the key's defaults form the chain.
    pub fallback_models: Vec<String>,
    /// Sent as `models` (exactly this chain) when set.
    pub models: Option<Vec<String>>,
    pub stream: bool,
}

impl Node {
    /// `ca`: the CA an `https://` node's certificate must be signed by (`--node-ca`).
    pub fn new(
        url: &str,
        key: &str,
        ca: Option<&std::path::Path>,
        surface: Surface,
    ) -> Result<Self, NodeError> {
        let uri: Uri = url
            .parse()
            .map_err(|e: http::uri::InvalidUri| NodeError::Url(url.into(), e.to_string()))?;
        match uri.scheme_str() {
            Some("http" | "https") => {}
            _ => return Err(NodeError::Url(url.into(), "give an http:// or https:// URL".into())),
        }
        if uri.host().is_none() {
            return Err(NodeError::Url(url.into(), "no host".into()));
        }
        let builder = match ca {
            Some(ca) => {
                let ca = switchyard_tls::files::Source::new("--node-ca", ca);
                let config = switchyard_tls::config::client_config(Some(ca), None, &[])
                    .map_err(|e| NodeError::Url(url.into(), e.to_string()))?;
                hyper_rustls::HttpsConnectorBuilder::new().with_tls_config((*config).clone())
            }
            None => hyper_rustls::HttpsConnectorBuilder::new().with_webpki_roots(),
        };
        let https = builder.https_or_http().enable_http1().build();
        let client = Client::builder(TokioExecutor::new()).build(https);
        Ok(Self {
            client,
            base: url.trim_end_matches('/').to_owned(),
            key: key.to_owned(),
            surface,
        })
    }

    pub fn url(&self) -> &str {
        &self.base
    }

    fn unreachable(&self, e: impl std::fmt::Display) -> NodeError {
        NodeError::Unreachable { url: self.base.clone(), reason: e.to_string() }
    }

    async fn get(&self, path: &'static str) -> Result<(StatusCode, Bytes), NodeError> {
        let request = Request::get(format!("{}{path}", self.base))
            .body(Full::default())
            .map_err(|e| self.unreachable(e))?;
        let response = tokio::time::timeout(Duration::from_secs(10), self.client.request(request))
            .await
            .map_err(|_| self.unreachable("no answer within 10 s"))?
            .map_err(|e| self.unreachable(words::chain(&e)))?;
        let status = response.status();
        let body = response.into_body().collect().await.map_err(|e| self.unreachable(e))?;
        Ok((status, body.to_bytes()))
    }

    /// The config version the node has applied (`/readyz`).
    pub async fn config_version(&self) -> Result<i64, NodeError> {
        let (status, body) = self.get("/readyz").await?;
        let value: Value = serde_json::from_slice(&body).unwrap_or(Value::Null);
        match value.get("config_version").and_then(Value::as_i64) {
            Some(v) if status == StatusCode::OK => Ok(v),
            _ => Err(NodeError::Answer {
                url: self.base.clone(),
                path: "/readyz",
                status: status.as_u16(),
                body: String::from_utf8_lossy(&body).chars().take(300).collect(),
            }),
        }
    }

    /// `switchyard_breaker_transitions_total` by (provider, upstream model), summed over `to`.
    pub async fn breaker_transitions(&self) -> Result<BTreeMap<(String, String), u64>, NodeError> {
        Ok(transitions(&self.metrics().await?))
    }

    /// `switchyard_breaker_state` by (provider, upstream model): 0 closed, 1 half-open, 2 open.
    pub async fn breaker_states(&self) -> Result<BTreeMap<(String, String), u64>, NodeError> {
        Ok(per_breaker(&self.metrics().await?, "switchyard_breaker_state{"))
    }

    async fn metrics(&self) -> Result<String, NodeError> {
        let (status, body) = self.get("/metrics").await?;
        if status != StatusCode::OK {
            return Err(NodeError::Answer {
                url: self.base.clone(),
                path: "/metrics",
                status: status.as_u16(),
                body: String::new(),
            });
        }
        Ok(String::from_utf8_lossy(&body).into_owned())
    }

    fn body(&self, ask: &Ask, content: &str) -> Value {
        let mut body = match self.surface {
            Surface::Chat => serde_json::json!({
                "messages": [{"role": "user", "content": content}],
            }),
            // `max_tokens` is required on Messages; ample for a drill's short answer.
            Surface::Messages => serde_json::json!({
                "messages": [{"role": "user", "content": content}],
                "max_tokens": 1024,
            }),
            Surface::Responses => serde_json::json!({"input": content, "store": false}),
        };
        match &ask.models {
            Some(models) => body["models"] = serde_json::json!(models),
            None => {
                body["model"] = Value::String(ask.model.clone());
                if !ask.fallback_models.is_empty() {
                    body["fallback_models"] = serde_json::json!(ask.fallback_models);
                }
            }
        }
        if ask.stream {
            body["stream"] = Value::Bool(true);
        }
        body
    }

    /// Sends one request through the drill's surface and records what it came to. A stream
    /// is read event by event until its end marker (`[DONE]`, or `message_stop` on
    /// Messages), an error event or its end, and given up after `give_up`.
    pub async fn send(
        &self,
        ask: &Ask,
        content: &str,
        epoch: Instant,
        give_up: Duration,
    ) -> Observation {
        let started = epoch.elapsed();
        let sent = Instant::now();
        let mut observation = Observation {
            started,
            finished: started,
            status: None,
            error: None,
            served_model: None,
            degraded: false,
            attempts: Vec::new(),
            stream: None,
        };
        let body = self.body(ask, content).to_string();
        let mut request = Request::post(format!("{}{}", self.base, self.surface.path()))
            .header("content-type", "application/json");
        request = match self.surface {
            Surface::Chat | Surface::Responses => {
                request.header("authorization", format!("Bearer {}", self.key))
            }
            // As the Anthropic SDKs send it.
            Surface::Messages => {
                request.header("x-api-key", &self.key).header("anthropic-version", "2023-06-01")
            }
        };
        let request = request.body(Full::new(Bytes::from(body)));
        let request = match request {
            Ok(r) => r,
            Err(e) => {
                observation.error = Some(e.to_string());
                return observation;
            }
        };
        let answer = tokio::time::timeout(give_up, async {
            let response = self.client.request(request).await.map_err(|e| words::chain(&e))?;
            Ok::<_, String>(response)
        })
        .await;
        let response = match answer {
            Ok(Ok(r)) => r,
            Ok(Err(e)) => {
                observation.error = Some(e);
                observation.finished = epoch.elapsed();
                return observation;
            }
            Err(_) => {
                observation.error = Some("no answer in time".to_owned());
                observation.finished = epoch.elapsed();
                return observation;
            }
        };
        let status = response.status();
        observation.status = Some(status.as_u16());
        observation.degraded = response
            .headers()
            .get("x-switchyard-degraded")
            .is_some_and(|v| v.as_bytes().eq_ignore_ascii_case(b"true"));
        let is_stream = ask.stream && status == StatusCode::OK;
        let mut body = response.into_body();
        if !is_stream {
            let left = give_up.saturating_sub(sent.elapsed());
            match tokio::time::timeout(left, body.collect()).await {
                Ok(Ok(collected)) => {
                    let value: Value =
                        serde_json::from_slice(&collected.to_bytes()).unwrap_or(Value::Null);
                    observation.served_model =
                        value.get("model").and_then(Value::as_str).map(str::to_owned);
                    observation.attempts = attempts(&value);
                    observation.error = error_code(&value);
                }
                Ok(Err(e)) => observation.error = Some(e.to_string()),
                Err(_) => observation.error = Some("the body did not end in time".to_owned()),
            }
            observation.finished = epoch.elapsed();
            return observation;
        }

        let mut timing = StreamTiming::default();
        let mut pending = Vec::new();
        let deadline = tokio::time::Instant::from_std(sent + give_up);
        'read: loop {
            let frame = match tokio::time::timeout_at(deadline, body.frame()).await {
                Err(_) => {
                    timing.hung = true;
                    break;
                }
                Ok(None) => break,
                Ok(Some(Err(e))) => {
                    observation.error = Some(e.to_string());
                    break;
                }
                Ok(Some(Ok(frame))) => frame,
            };
            let Ok(data) = frame.into_data() else { continue };
            pending.extend_from_slice(&data);
            while let Some(end) = find_event_end(&pending) {
                let event: Vec<u8> = pending.drain(..end).collect();
                for line in String::from_utf8_lossy(&event).lines() {
                    let Some(payload) = line.strip_prefix("data:").map(str::trim) else {
                        continue;
                    };
                    if payload == "[DONE]" {
                        timing.done = true;
                        break 'read;
                    }
                    let Ok(event) = serde_json::from_str::<Value>(payload) else { continue };
                    if read_event(self.surface, &event, &mut observation, &mut timing, sent) {
                        break 'read;
                    }
                }
            }
        }
        observation.stream = Some(timing);
        observation.finished = epoch.elapsed();
        observation
    }
}

/// Records one streamed event (a Chat chunk, a Messages or a Responses event); true when it
/// ends the stream (an error event, Messages' `message_stop`, Responses' last event).
fn read_event(
    surface: Surface,
    event: &Value,
    observation: &mut Observation,
    timing: &mut StreamTiming,
    sent: Instant,
) -> bool {
    if let Some(code) = error_code(event) {
        timing.error_code = Some(code);
        timing.error_at = Some(sent.elapsed());
        return true;
    }
    let content = match surface {
        Surface::Chat => {
            if observation.served_model.is_none() {
                observation.served_model =
                    event.get("model").and_then(Value::as_str).map(str::to_owned);
            }
            if observation.attempts.is_empty() {
                observation.attempts = attempts(event);
            }
            if let Some(n) = continued(event) {
                timing.continuations = n;
            }
            event.pointer("/choices/0/delta/content")
        }
        // The model and the report ride in `message_start`'s message; text in text deltas.
        Surface::Messages => match event.get("type").and_then(Value::as_str) {
            Some("message_start") => {
                let message = &event["message"];
                observation.served_model =
                    message.get("model").and_then(Value::as_str).map(str::to_owned);
                observation.attempts = attempts(message);
                None
            }
            Some("message_stop") => {
                timing.done = true;
                return true;
            }
            Some("content_block_delta") => event.pointer("/delta/text"),
            _ => None,
        },
        // The model and the report ride in `response.created`'s response; a failure after
        // the commit point ends the stream with `response.failed` (or an `error` event).
        Surface::Responses => match event.get("type").and_then(Value::as_str) {
            Some("response.created") => {
                let response = &event["response"];
                observation.served_model =
                    response.get("model").and_then(Value::as_str).map(str::to_owned);
                observation.attempts = attempts(response);
                None
            }
            Some("response.completed" | "response.incomplete") => {
                timing.done = true;
                return true;
            }
            Some("response.failed") => {
                timing.error_code =
                    error_code(&event["response"]).or_else(|| Some("failed".to_owned()));
                timing.error_at = Some(sent.elapsed());
                return true;
            }
            Some("error") => {
                timing.error_code = event
                    .get("code")
                    .and_then(Value::as_str)
                    .map(str::to_owned)
                    .or_else(|| Some("error".to_owned()));
                timing.error_at = Some(sent.elapsed());
                return true;
            }
            Some("response.output_text.delta") => event.get("delta"),
            _ => None,
        },
    };
    if let Some(content) = content.and_then(Value::as_str).filter(|t| !t.is_empty()) {
        timing.content_chunks += 1;
        timing.last_content = Some(sent.elapsed());
        timing.text.push_str(content);
    }
    false
}

/// The end of the first complete SSE event in `buf` (after its blank line), if any.
fn find_event_end(buf: &[u8]) -> Option<usize> {
    let lf = buf.windows(2).position(|w| w == b"\n\n").map(|i| i + 2);
    let crlf = buf.windows(4).position(|w| w == b"\r\n\r\n").map(|i| i + 4);
    match (lf, crlf) {
        (Some(a), Some(b)) => Some(a.min(b)),
        (a, b) => a.or(b),
    }
}

/// Reads `switchyard_breaker_transitions_total{provider=…,upstream_model=…,to=…} N` lines.
pub fn transitions(metrics: &str) -> BTreeMap<(String, String), u64> {
    per_breaker(metrics, "switchyard_breaker_transitions_total{")
}

/// The series starting with `prefix` (a name and its `{`), summed per (provider, upstream
/// model) label pair.
fn per_breaker(metrics: &str, prefix: &str) -> BTreeMap<(String, String), u64> {
    let mut found = BTreeMap::new();
    for line in metrics.lines() {
        let Some(rest) = line.strip_prefix(prefix) else {
            continue;
        };
        let Some((labels, value)) = rest.rsplit_once("} ") else { continue };
        let label = |name: &str| {
            labels.split("\",").find_map(|pair| {
                let (k, v) = pair.split_once("=\"")?;
                (k.trim_start_matches(',') == name).then(|| v.trim_end_matches('"').to_owned())
            })
        };
        let (Some(provider), Some(model)) = (label("provider"), label("upstream_model")) else {
            continue;
        };
        let count = value.trim().parse::<f64>().unwrap_or(0.0) as u64;
        *found.entry((provider, model)).or_default() += count;
    }
    found
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn transitions_are_summed_per_breaker_over_their_target_state() {
        let text = "# TYPE switchyard_breaker_transitions counter\n\
            switchyard_breaker_transitions_total{provider=\"demo\",upstream_model=\"p\",to=\"open\"} 2\n\
            switchyard_breaker_transitions_total{provider=\"demo\",upstream_model=\"p\",to=\"half_open\"} 1\n\
            switchyard_breaker_transitions_total{provider=\"demo\",upstream_model=\"q\",to=\"open\"} 1\n\
            switchyard_breaker_state{provider=\"demo\",upstream_model=\"p\"} 2\n";
        let t = transitions(text);
        assert_eq!(t[&("demo".to_owned(), "p".to_owned())], 3);
        assert_eq!(t[&("demo".to_owned(), "q".to_owned())], 1);
        assert_eq!(t.len(), 2);
    }

    #[test]
    fn sse_events_end_at_a_blank_line() {
        assert_eq!(find_event_end(b"data: x\n\ndata: y"), Some(9));
        assert_eq!(find_event_end(b"data: x\r\n\r\n"), Some(11));
        assert_eq!(find_event_end(b"data: x\n"), None);
    }

    #[test]
    fn node_urls_need_a_scheme_and_a_host() {
        assert!(Node::new("127.0.0.1:8080", "k", None, Surface::Chat).is_err());
        assert!(Node::new("ftp://h", "k", None, Surface::Chat).is_err());
        assert!(Node::new("http://127.0.0.1:8080/", "k", None, Surface::Chat).is_ok());
    }
}
