//! `switchyard-bench passthrough`: the floor of one Rust proxy hop, started by the default
//! run as a child so its CPU time is measurable from /proc like the node's.

use std::io::Read;
use std::net::SocketAddr;

use hyper::Request;
use hyper::body::Incoming;
use hyper_util::client::legacy::Client;
use hyper_util::client::legacy::connect::HttpConnector;
use hyper_util::rt::{TokioExecutor, TokioIo};
use tokio::net::TcpListener;

use crate::error::Result;
use crate::host;

/// `passthrough --listen ADDR --upstream ADDR`, both on loopback.
#[derive(clap::Args)]
#[command(args_override_self = true)]
pub struct Args {
    /// Where to listen.
    #[arg(long, value_name = "ADDR")]
    listen: SocketAddr,
    /// Where to forward every request.
    #[arg(long, value_name = "ADDR")]
    upstream: SocketAddr,
}

impl Args {
    /// The listening and the upstream address, refused unless both are on loopback.
    pub fn addrs(&self) -> Result<(SocketAddr, SocketAddr)> {
        if !self.listen.ip().is_loopback() || !self.upstream.ip().is_loopback() {
            return Err("passthrough: loopback addresses only".into());
        }
        Ok((self.listen, self.upstream))
    }
}

/// Serves until the bench that started us is gone.
pub fn main(listen: SocketAddr, upstream: SocketAddr) -> Result<()> {
    // Stop when the bench is gone (its end of our stdin closes), whatever killed it.
    std::thread::spawn(|| {
        let mut sink = [0u8; 64];
        while matches!(std::io::stdin().read(&mut sink), Ok(n) if n > 0) {}
        std::process::exit(0);
    });
    // The same runtime shape as the node's `#[tokio::main]`: one worker per core.
    let rt = host::runtime(host::Threads::PerCore)?;
    rt.block_on(passthrough(listen, upstream))
}

/// A bare HTTP/1.1 proxy: each request goes to `upstream` over a pooled keep-alive
/// connection with its head and body untouched (only the URI made absolute for the pool),
/// and the response streams back as it arrives. No JSON is parsed, nothing is buffered.
async fn passthrough(listen: SocketAddr, upstream: SocketAddr) -> Result<()> {
    let listener = TcpListener::bind(listen).await.map_err(|e| format!("bind {listen}: {e}"))?;
    let local = listener.local_addr().map_err(|e| format!("local addr: {e}"))?;
    println!("switchyard-bench passthrough listening on {local}");
    let mut connector = HttpConnector::new();
    connector.set_nodelay(true);
    let client: Client<HttpConnector, Incoming> =
        Client::builder(TokioExecutor::new()).build(connector);
    loop {
        let (stream, _) = listener.accept().await.map_err(|e| format!("accept: {e}"))?;
        let _ = stream.set_nodelay(true);
        let client = client.clone();
        tokio::spawn(async move {
            let service = hyper::service::service_fn(move |req: Request<Incoming>| {
                forward(client.clone(), upstream, req)
            });
            let _ = hyper::server::conn::http1::Builder::new()
                .serve_connection(TokioIo::new(stream), service)
                .await;
        });
    }
}

type BoxError = Box<dyn std::error::Error + Send + Sync + 'static>;

async fn forward(
    client: Client<HttpConnector, Incoming>,
    upstream: SocketAddr,
    mut req: Request<Incoming>,
) -> std::result::Result<hyper::Response<Incoming>, BoxError> {
    let path = req.uri().path_and_query().map_or("/", |p| p.as_str());
    let uri = format!("http://{upstream}{path}").parse::<hyper::Uri>().map_err(BoxError::from)?;
    *req.uri_mut() = uri;
    client.request(req).await.map_err(BoxError::from)
}
