//! Closed-loop load on keep-alive connections: what is sent to a target and one timed phase.

use std::net::SocketAddr;
use std::sync::Arc;
use std::time::Instant;

use bytes::Bytes;
use http_body_util::{BodyExt, Full};
use hyper::client::conn::http1::SendRequest;
use hyper::{Request, header};

use crate::error::Result;

/// Which path a target measures: the default run has the first five; `--surfaces` adds the
/// Messages, Responses and embeddings ones, `--baseline-switchyard` a node of another build; `translate` drives the node.
#[derive(Clone, Copy, PartialEq, Eq, Debug)]
pub enum Kind {
    Direct,
    Passthrough,
    NodeHealthy,
    NodeFailing,
    /// Healthy, with a key that has all four limits (too high to bind): what deciding and
    /// counting them costs.
    NodeLimited,
    /// Healthy, on a node of the `--baseline-switchyard` build: the same request before and
    /// after a change, in one run.
    NodeBaseline,
    /// The pass-through forwarding a Messages body to the simulator's `/v1/messages`: the
    /// floor of the two Messages targets below.
    MessagesPassthrough,
    /// `/v1/messages` served by an Anthropic-kind model: the body goes on as sent.
    MessagesAnthropic,
    /// `/v1/messages` served by an OpenAI-kind model: translated to Chat and back.
    MessagesOpenAi,
    /// The three Messages targets above, streamed (`"stream": true`).
    MessagesStreamPassthrough,
    MessagesStreamAnthropic,
    MessagesStreamOpenAi,
    /// The pass-through forwarding a streamed Chat body: the floor of the streamed Responses
    /// target (a Responses request reaches an OpenAI-kind model as a Chat request).
    StreamPassthrough,
    /// `/v1/responses` served by an OpenAI-kind model: translated to Chat and back, plain
    /// and streamed; and by an Anthropic-kind model (translated to Messages and back).
    ResponsesOpenAi,
    ResponsesStreamOpenAi,
    ResponsesAnthropic,
    /// The pass-through forwarding an embeddings body to the simulator's `/v1/embeddings`:
    /// the floor of the node's embeddings target.
    EmbeddingsPassthrough,
    /// `/v1/embeddings` served by an OpenAI-kind embedding model.
    EmbeddingsOpenAi,
}

/// The API a target speaks: its path, its credential header and its answer's shape.
#[derive(Clone, Copy, PartialEq, Eq, Debug)]
pub enum Api {
    Chat,
    Messages,
    Responses,
    Embeddings,
}

impl Kind {
    /// The default run's targets.
    pub const DEFAULT: [Kind; 5] =
        [Kind::Direct, Kind::Passthrough, Kind::NodeHealthy, Kind::NodeFailing, Kind::NodeLimited];

    /// What `--surfaces` adds, each floor before the targets measured against it.
    pub const SURFACES: [Kind; 12] = [
        Kind::MessagesPassthrough,
        Kind::MessagesAnthropic,
        Kind::MessagesOpenAi,
        Kind::MessagesStreamPassthrough,
        Kind::MessagesStreamAnthropic,
        Kind::MessagesStreamOpenAi,
        Kind::ResponsesOpenAi,
        Kind::ResponsesAnthropic,
        Kind::StreamPassthrough,
        Kind::ResponsesStreamOpenAi,
        Kind::EmbeddingsPassthrough,
        Kind::EmbeddingsOpenAi,
    ];

    pub fn label(self) -> &'static str {
        match self {
            Kind::Direct => "sim direct",
            Kind::Passthrough => "hyper pass-through",
            Kind::NodeHealthy => "node, primary healthy",
            Kind::NodeFailing => "node, primary failing",
            Kind::NodeLimited => "node, healthy, key with limits",
            Kind::NodeBaseline => "node (baseline), primary healthy",
            Kind::MessagesPassthrough => "hyper pass-through, Messages",
            Kind::MessagesAnthropic => "node, messages → anthropic",
            Kind::MessagesOpenAi => "node, messages → openai",
            Kind::MessagesStreamPassthrough => "hyper pass-through, Messages streamed",
            Kind::MessagesStreamAnthropic => "node, messages → anthropic, streamed",
            Kind::MessagesStreamOpenAi => "node, messages → openai, streamed",
            Kind::StreamPassthrough => "hyper pass-through, streamed",
            Kind::ResponsesOpenAi => "node, responses → openai",
            Kind::ResponsesStreamOpenAi => "node, responses → openai, streamed",
            Kind::ResponsesAnthropic => "node, responses → anthropic",
            Kind::EmbeddingsPassthrough => "hyper pass-through, embeddings",
            Kind::EmbeddingsOpenAi => "node, embeddings → openai",
        }
    }

    /// The API the target speaks.
    pub fn api(self) -> Api {
        match self {
            Kind::Direct
            | Kind::Passthrough
            | Kind::StreamPassthrough
            | Kind::NodeHealthy
            | Kind::NodeFailing
            | Kind::NodeLimited
            | Kind::NodeBaseline => Api::Chat,
            Kind::MessagesPassthrough
            | Kind::MessagesAnthropic
            | Kind::MessagesOpenAi
            | Kind::MessagesStreamPassthrough
            | Kind::MessagesStreamAnthropic
            | Kind::MessagesStreamOpenAi => Api::Messages,
            Kind::ResponsesOpenAi | Kind::ResponsesStreamOpenAi | Kind::ResponsesAnthropic => {
                Api::Responses
            }
            Kind::EmbeddingsPassthrough | Kind::EmbeddingsOpenAi => Api::Embeddings,
        }
    }

    /// Whether the target speaks Anthropic's Messages API.
    pub fn is_messages(self) -> bool {
        self.api() == Api::Messages
    }

    /// Whether the target is a Switchyard node (its CPU is the node's).
    pub fn is_node(self) -> bool {
        !matches!(
            self,
            Kind::Direct
                | Kind::Passthrough
                | Kind::MessagesPassthrough
                | Kind::MessagesStreamPassthrough
                | Kind::StreamPassthrough
                | Kind::EmbeddingsPassthrough
        )
    }

    /// The pass-through forwarding what this target is sent: the floor its ratios are taken
    /// against.
    pub fn floor(self) -> Kind {
        match self {
            Kind::Direct
            | Kind::Passthrough
            | Kind::NodeHealthy
            | Kind::NodeFailing
            | Kind::NodeLimited
            | Kind::NodeBaseline
            | Kind::ResponsesOpenAi
            | Kind::ResponsesAnthropic => Kind::Passthrough,
            Kind::StreamPassthrough | Kind::ResponsesStreamOpenAi => Kind::StreamPassthrough,
            Kind::EmbeddingsPassthrough | Kind::EmbeddingsOpenAi => Kind::EmbeddingsPassthrough,
            Kind::MessagesPassthrough | Kind::MessagesAnthropic | Kind::MessagesOpenAi => {
                Kind::MessagesPassthrough
            }
            Kind::MessagesStreamPassthrough
            | Kind::MessagesStreamAnthropic
            | Kind::MessagesStreamOpenAi => Kind::MessagesStreamPassthrough,
        }
    }

    /// The endpoint the target is sent to.
    pub fn path(self) -> &'static str {
        match self.api() {
            Api::Chat => "/v1/chat/completions",
            Api::Messages => "/v1/messages",
            Api::Responses => "/v1/responses",
            Api::Embeddings => "/v1/embeddings",
        }
    }
}

/// The version header Anthropic's SDKs send with every Messages request.
const ANTHROPIC_VERSION: (&str, &str) = ("anthropic-version", "2023-06-01");

/// What one target is sent: every request of a run is the same bytes.
pub struct Target {
    pub kind: Kind,
    pub addr: SocketAddr,
    pub host: String,
    /// The credential: `Bearer KEY` for OpenAI APIs' targets (`Authorization`), the key itself
    /// for Messages targets (`x-api-key`, as Anthropic's SDKs send it).
    pub auth: Option<String>,
    pub body: Bytes,
    /// The process whose CPU and RSS are the proxy's (none for the simulator itself).
    pub proxy_pid: Option<u32>,
    /// HTTPS (`tls-cost`); plain HTTP without.
    pub tls: Option<crate::client::Tls>,
}

impl Target {
    /// The request's headers beside `Host` and `Content-Type`, as its API's clients send them.
    pub fn headers(&self) -> Vec<(&'static str, &str)> {
        let mut headers = Vec::with_capacity(2);
        if self.kind.is_messages() {
            headers.push(ANTHROPIC_VERSION);
        }
        if let Some(auth) = &self.auth {
            let name = if self.kind.is_messages() { "x-api-key" } else { "authorization" };
            headers.push((name, auth.as_str()));
        }
        headers
    }

    fn request(&self) -> Result<Request<Full<Bytes>>> {
        let mut req = Request::post(self.kind.path())
            .header(header::HOST, &self.host)
            .header(header::CONTENT_TYPE, "application/json");
        for (name, value) in self.headers() {
            req = req.header(name, value);
        }
        req.body(Full::new(self.body.clone())).map_err(|e| format!("request: {e}"))
    }
}

/// One closed-loop phase on already-open connections: each connection sends its next
/// request as soon as the previous response body has been read, until `until`.
/// Returns the connections (kept alive for the next phase), the latencies in nanoseconds
/// (when `record`) and the count of non-200 responses.
pub async fn phase(
    conns: Vec<SendRequest<Full<Bytes>>>,
    target: &Arc<Target>,
    until: Instant,
    record: bool,
) -> Result<(Vec<SendRequest<Full<Bytes>>>, Vec<u64>, u64)> {
    let mut tasks = Vec::with_capacity(conns.len());
    for mut sender in conns {
        let target = Arc::clone(target);
        tasks.push(tokio::spawn(async move {
            let mut latencies = Vec::with_capacity(if record { 1 << 16 } else { 0 });
            let mut non_200 = 0u64;
            while Instant::now() < until {
                sender.ready().await.map_err(|e| format!("connection lost: {e}"))?;
                let req = target.request()?;
                let start = Instant::now();
                let resp = sender.send_request(req).await.map_err(|e| format!("request: {e}"))?;
                let ok = resp.status() == hyper::StatusCode::OK;
                resp.into_body().collect().await.map_err(|e| format!("response body: {e}"))?;
                let elapsed = start.elapsed();
                non_200 += u64::from(!ok);
                if record {
                    latencies.push(u64::try_from(elapsed.as_nanos()).unwrap_or(u64::MAX));
                }
            }
            Ok::<_, String>((sender, latencies, non_200))
        }));
    }
    let mut conns = Vec::with_capacity(tasks.len());
    let mut all = Vec::new();
    let mut non_200 = 0;
    for task in tasks {
        let (sender, latencies, bad) = task.await.map_err(|e| format!("load task: {e}"))??;
        conns.push(sender);
        all.extend(latencies);
        non_200 += bad;
    }
    Ok((conns, all, non_200))
}
