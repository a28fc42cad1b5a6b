//! Closed-loop load on keep-alive connections: what is sent to a target and one timed phase.

use std::net::SocketAddr;
use std::sync::Arc;
use std::time::Instant;

use bytes::Bytes;
use http_body_util::{BodyExt, Full};
use hyper::client::conn::http1::SendRequest;
use hyper::{Request, header};

use crate::error::Result;

/// Which path a target measures: the default run has all four; `translate` drives the node.
#[derive(Clone, Copy, PartialEq, Eq, Debug)]
pub enum Kind {
    Direct,
    Passthrough,
    NodeHealthy,
    NodeFailing,
    /// Healthy, with a key that has all four limits (too high to bind): what deciding and
    /// counting them costs.
    NodeLimited,
}

impl Kind {
    pub const ALL: [Kind; 5] =
        [Kind::Direct, Kind::Passthrough, Kind::NodeHealthy, Kind::NodeFailing, Kind::NodeLimited];

    pub fn label(self) -> &'static str {
        match self {
            Kind::Direct => "sim direct",
            Kind::Passthrough => "hyper pass-through",
            Kind::NodeHealthy => "node, primary healthy",
            Kind::NodeFailing => "node, primary failing",
            Kind::NodeLimited => "node, healthy, key with limits",
        }
    }
}

/// What one target is sent: every request of a run is the same bytes.
pub struct Target {
    pub kind: Kind,
    pub addr: SocketAddr,
    pub host: String,
    pub auth: Option<String>,
    pub body: Bytes,
    /// The process whose CPU and RSS are the proxy's (none for the simulator itself).
    pub proxy_pid: Option<u32>,
    /// HTTPS (`tls-cost`); plain HTTP without.
    pub tls: Option<crate::client::Tls>,
}

impl Target {
    fn request(&self) -> Result<Request<Full<Bytes>>> {
        let mut req = Request::post("/v1/chat/completions")
            .header(header::HOST, &self.host)
            .header(header::CONTENT_TYPE, "application/json");
        if let Some(auth) = &self.auth {
            req = req.header(header::AUTHORIZATION, auth);
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
