//! `switchyard-bench limits`: how far a fleet lets a key past its requests-per-minute limit
//! under load. `--nodes` nodes on one control plane, one key at `--rpm`, `--concurrency`
//! closed-loop connections spread over the nodes round robin, for `--duration-secs`; every
//! answer's status and time are kept, and the report gives the most 200s in any 60 s
//! window (in one-second steps) against the limit.

use std::time::{Duration, Instant};

use bytes::Bytes;
use http_body_util::{BodyExt, Full};
use hyper::{Request, header};
use serde_json::json;

use crate::catalog::{PRIMARY, catalog_yaml};
use crate::client::{connect, http};
use crate::error::Result;
use crate::flags;
use crate::fleet::Fleet;
use crate::host;
use crate::proc::cli;

struct Options {
    switchyard: std::path::PathBuf,
    nodes: usize,
    rpm: u64,
    concurrency: usize,
    duration: Duration,
}

/// `switchyard-bench limits`'s flags.
#[derive(clap::Args)]
#[command(args_override_self = true)]
pub struct Args {
    #[command(flatten)]
    switchyard: flags::Switchyard,
    /// Nodes sharing the key (at least 1).
    #[arg(long, value_name = "N", default_value = "3")]
    nodes: u64,
    /// The key's requests per minute (at least 1).
    #[arg(long, value_name = "N", default_value = "6000")]
    rpm: u64,
    /// Connections sending, over all nodes (at least 1).
    #[arg(long, value_name = "N", default_value = "12")]
    concurrency: u64,
    /// How long to send, in seconds (at least 61: more than one minute's window).
    #[arg(long, value_name = "SECS", default_value = "75")]
    duration_secs: u64,
}

fn options(a: Args) -> Result<Options> {
    Ok(Options {
        switchyard: a.switchyard.path()?,
        nodes: a.nodes.max(1) as usize,
        rpm: a.rpm.max(1),
        concurrency: a.concurrency.max(1) as usize,
        duration: Duration::from_secs(a.duration_secs.max(61)),
    })
}

pub fn main(args: Args) -> Result<()> {
    let options = options(args)?;
    let runtime = host::runtime(host::Threads::PerCore)?;
    runtime.block_on(run(options))
}

async fn run(o: Options) -> Result<()> {
    let dir = tempfile::Builder::new()
        .prefix("switchyard-bench-limits-")
        .tempdir()
        .map_err(|e| format!("temp dir: {e}"))?;
    let bin = o.switchyard.as_path();
    let fleet = Fleet::start(bin, dir.path(), catalog_yaml).await?;
    let mut nodes = vec![fleet.node.addr];
    let mut extra = Vec::new();
    for i in 1..o.nodes {
        let node = fleet.add_node(bin, dir.path(), &format!("node{i}")).await?;
        nodes.push(node.addr);
        extra.push(node);
    }
    let keys = cli(bin, &fleet.control, &fleet.token, &["keys", "list"])?;
    let id = keys
        .as_array()
        .and_then(|k| k.iter().find(|k| k["name"] == "bench"))
        .and_then(|k| k["id"].as_str())
        .ok_or("the bench key is not listed")?
        .to_owned();
    let rpm = o.rpm.to_string();
    let set = cli(bin, &fleet.control, &fleet.token, &["keys", "set-limits", &id, "--rpm", &rpm])?;
    let version = set["version"].as_i64().unwrap_or(0);
    // Every node has the limit and has heard what the fleet used before the load starts.
    for addr in &nodes {
        let started = Instant::now();
        loop {
            let (_, ready) = http(*addr, "GET", "/readyz", None, None).await?;
            let applied = ready["config_version"].as_i64().unwrap_or(0) >= version;
            if applied && ready["limits_view_age_ms"].as_u64().is_some() {
                break;
            }
            if started.elapsed() > Duration::from_secs(30) {
                return Err(format!("node {addr} did not apply the limit: {ready}"));
            }
            tokio::time::sleep(Duration::from_millis(20)).await;
        }
    }
    eprintln!(
        "switchyard-bench limits: {} node(s), rpm {}, {} connection(s), {} s; logs in {}",
        nodes.len(),
        o.rpm,
        o.concurrency,
        o.duration.as_secs(),
        dir.path().display()
    );

    let body = Bytes::from(
        json!({"model": PRIMARY, "messages": [{"role": "user", "content": "hi"}]}).to_string(),
    );
    let auth = format!("Bearer {}", fleet.key);
    let epoch = Instant::now();
    let until = epoch + o.duration;
    let mut workers = tokio::task::JoinSet::new();
    for c in 0..o.concurrency {
        let addr = nodes[c % nodes.len()];
        let (body, auth) = (body.clone(), auth.clone());
        workers.spawn(async move {
            let mut seen: Vec<(f64, u16)> = Vec::new();
            let mut sender = connect(addr).await?;
            while Instant::now() < until {
                let req = Request::post("/v1/chat/completions")
                    .header(header::HOST, addr.to_string())
                    .header(header::CONTENT_TYPE, "application/json")
                    .header(header::AUTHORIZATION, auth.as_str())
                    .body(Full::new(body.clone()))
                    .map_err(|e| format!("request: {e}"))?;
                let resp = sender.send_request(req).await.map_err(|e| format!("send: {e}"))?;
                let status = resp.status().as_u16();
                resp.into_body().collect().await.map_err(|e| format!("body: {e}"))?;
                seen.push((epoch.elapsed().as_secs_f64(), status));
            }
            Ok::<_, String>(seen)
        });
    }
    let mut all: Vec<(f64, u16)> = Vec::new();
    while let Some(done) = workers.join_next().await {
        all.extend(done.map_err(|e| format!("worker: {e}"))??);
    }
    let admitted: Vec<f64> = all.iter().filter(|(_, s)| *s == 200).map(|(t, _)| *t).collect();
    let refused = all.iter().filter(|(_, s)| *s == 429).count();
    let other = all.len() - admitted.len() - refused;
    let seconds = o.duration.as_secs();
    let most = (0..seconds.saturating_sub(59))
        .map(|start| {
            let (from, to) = (start as f64, start as f64 + 60.0);
            admitted.iter().filter(|t| **t >= from && **t < to).count()
        })
        .max()
        .unwrap_or(0);
    let over = 100.0 * (most as f64 - o.rpm as f64) / o.rpm as f64;
    println!("### A key's rpm under load ({} nodes, {} connections)\n", nodes.len(), o.concurrency);
    println!(
        "| rpm | answers | admitted | refused 429 | other | most admitted in a 60 s window | over the limit |"
    );
    println!("|---:|---:|---:|---:|---:|---:|---:|");
    println!(
        "| {} | {} | {} | {refused} | {other} | {most} | {over:+.1} % |",
        o.rpm,
        all.len(),
        admitted.len()
    );
    drop(extra);
    if other > 0 {
        return Err(format!("{other} answers were neither 200 nor 429"));
    }
    Ok(())
}
