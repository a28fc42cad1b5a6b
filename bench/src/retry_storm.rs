//! `switchyard-bench retries`: a retry storm, bounded. Every request's first model answers
//! 503 to every call and the catalog allows `max_retries: 3`; the node's retry budget must
//! keep upstream calls per request near `1 + budget_ratio` (plus the floor), not 4.
//!
//! The same storm runs twice, each on a fresh fleet: with the budget of the catalog below,
//! and with a budget too large to bind, which shows what the retries alone would send.
//! The failing calls are spread over `--models` upstream models (all scripted to 503), each
//! breaker's window larger than the calls it receives: a breaker that opened would stop
//! the calls and hide what the budget does.

use std::net::SocketAddr;
use std::path::PathBuf;
use std::sync::Arc;
use std::sync::atomic::{AtomicUsize, Ordering};
use std::time::Instant;

use bytes::Bytes;
use http_body_util::{BodyExt, Full};
use hyper::{Request, header};
use serde_json::json;

use crate::client::{connect, http, metrics_text};
use crate::error::Result;
use crate::flags::{self, bounded};
use crate::fleet::Fleet;
use crate::host;
use crate::stats::sum_metric;

const MAX_RETRIES: u32 = 3;
const BUDGET_RATIO: f64 = 0.2;
const BUDGET_MIN_PER_SEC: u32 = 10;
/// The node's budget window (the data plane's `BUDGET_WINDOW_SECS`).
const BUDGET_WINDOW_SECS: f64 = 10.0;
/// Each failing model's breaker needs this many calls before it may open.
const BREAKER_WINDOW: usize = 1000;

struct Options {
    switchyard: PathBuf,
    requests: usize,
    concurrency: usize,
    models: usize,
}

/// `switchyard-bench retries`'s flags.
#[derive(clap::Args)]
#[command(args_override_self = true)]
pub struct Args {
    #[command(flatten)]
    switchyard: flags::Switchyard,
    /// Requests sent (100–1000000).
    #[arg(long, value_name = "N", default_value = "3000", value_parser = bounded::<usize>(100, 1_000_000))]
    requests: usize,
    /// Connections sending (1–1024).
    #[arg(long, value_name = "N", default_value = "8", value_parser = bounded::<usize>(1, 1024))]
    concurrency: usize,
    /// Failing models the requests are spread over (1–256).
    #[arg(long, value_name = "N", default_value = "16", value_parser = bounded::<usize>(1, 256))]
    models: usize,
}

fn options(a: Args) -> Result<Options> {
    let o = Options {
        switchyard: a.switchyard.existing()?,
        requests: a.requests,
        concurrency: a.concurrency,
        models: a.models,
    };
    // Without a budget every request makes 1 + MAX_RETRIES calls to its failing model.
    let per_model = o.requests.div_ceil(o.models) * (1 + MAX_RETRIES as usize);
    if per_model >= BREAKER_WINDOW {
        return Err(format!(
            "--requests {} over --models {} sends up to {per_model} calls to one model, and its \
             breaker would open at {BREAKER_WINDOW}: raise --models",
            o.requests, o.models
        ));
    }
    Ok(o)
}

pub fn main(args: Args) -> Result<()> {
    let options = options(args)?;
    let rt = host::runtime(host::Threads::Current)?;
    rt.block_on(async {
        println!(
            "### Retry storm: first model 503 on every call, max_retries {MAX_RETRIES}, {} requests at {} connections\n",
            options.requests, options.concurrency
        );
        println!(
            "| budget | upstream calls/req to the failing model | bound | retries | budget refusals | non-200 | seconds | verdict |"
        );
        println!("|---|---:|---:|---:|---:|---:|---:|---|");
        storm(&options, Some((BUDGET_RATIO, BUDGET_MIN_PER_SEC))).await?;
        storm(&options, None).await?;
        println!();
        Ok(())
    })
}

fn catalog(sim: SocketAddr, models: usize, budget: Option<(f64, u32)>) -> String {
    // No binding budget: a ratio of 1 and the largest floor the catalog accepts.
    let (ratio, floor) = budget.unwrap_or((1.0, 10_000));
    let mut yaml = format!(
        "providers:
  - name: sim
    kind: openai-compatible
    base_url: http://{sim}/v1
    region: us
models:
  - name: sim/secondary
    provider: sim
    upstream_model: secondary
"
    );
    for i in 0..models {
        yaml.push_str(&format!(
            "  - name: sim/failing-{i}\n    provider: sim\n    upstream_model: failing-{i}\n"
        ));
    }
    yaml.push_str(&format!(
        "retry_policy:
  max_retries: {MAX_RETRIES}
  on: [server_error]
  base_backoff_ms: 1
  max_backoff_ms: 4
  budget_ratio: {ratio}
  budget_min_per_sec: {floor}
breaker_policy:
  window_size: {BREAKER_WINDOW}
  min_requests: {BREAKER_WINDOW}
  failure_rate_threshold: 1.0
  consecutive_timeouts: 5
  cooldown_ms: 1000
  max_cooldown_ms: 1000
  half_open_probes: 1
"
    ));
    yaml
}

async fn storm(options: &Options, budget: Option<(f64, u32)>) -> Result<()> {
    let dir = tempfile::Builder::new()
        .prefix("switchyard-bench-retries-")
        .tempdir()
        .map_err(|e| format!("temp dir: {e}"))?;
    let models = options.models;
    let fleet =
        Fleet::start(&options.switchyard, dir.path(), |sim| catalog(sim, models, budget)).await?;
    for i in 0..models {
        fleet.script(&format!("failing-{i}"), json!({"kind": "status", "status": 503})).await?;
    }
    let bodies: Arc<Vec<Bytes>> = Arc::new(
        (0..models)
            .map(|i| {
                let body = json!({"model": format!("sim/failing-{i}"),
                    "fallback_models": ["sim/secondary"],
                    "messages": [{"role": "user", "content": "hi"}]});
                Bytes::from(body.to_string())
            })
            .collect(),
    );
    let calls_before = failing_calls(fleet.sim.addr, models).await?;
    let next = Arc::new(AtomicUsize::new(0));
    let start = Instant::now();
    let mut tasks = vec![];
    for _ in 0..options.concurrency {
        let mut sender = connect(fleet.node.addr).await?;
        let (next, bodies, total) = (Arc::clone(&next), Arc::clone(&bodies), options.requests);
        let (host, auth) = (fleet.node.addr.to_string(), format!("Bearer {}", fleet.key));
        tasks.push(tokio::spawn(async move {
            let mut non_200 = 0u64;
            loop {
                let i = next.fetch_add(1, Ordering::Relaxed);
                if i >= total {
                    return Ok::<_, String>(non_200);
                }
                sender.ready().await.map_err(|e| format!("connection lost: {e}"))?;
                let req = Request::post("/v1/chat/completions")
                    .header(header::HOST, &host)
                    .header(header::AUTHORIZATION, &auth)
                    .header(header::CONTENT_TYPE, "application/json")
                    .body(Full::new(bodies[i % bodies.len()].clone()))
                    .map_err(|e| format!("request: {e}"))?;
                let resp = sender.send_request(req).await.map_err(|e| format!("request: {e}"))?;
                non_200 += u64::from(resp.status() != hyper::StatusCode::OK);
                resp.into_body().collect().await.map_err(|e| format!("body: {e}"))?;
            }
        }));
    }
    let mut non_200 = 0;
    for t in tasks {
        non_200 += t.await.map_err(|e| format!("load task: {e}"))??;
    }
    let secs = start.elapsed().as_secs_f64();
    let calls = failing_calls(fleet.sim.addr, models).await? - calls_before;
    let metrics = metrics_text(fleet.node.addr).await?;
    let n = options.requests as f64;
    let per_req = calls as f64 / n;
    let (label, bound) = match budget {
        Some((ratio, floor)) => {
            let windows = (secs / BUDGET_WINDOW_SECS).ceil().max(1.0);
            let floor_retries = f64::from(floor) * BUDGET_WINDOW_SECS * windows;
            (format!("ratio {ratio}, floor {floor}/s"), Some(1.0 + ratio + floor_retries / n))
        }
        None => ("none binding (ratio 1, floor 10000/s)".to_owned(), None),
    };
    let verdict = match bound {
        Some(b) if per_req <= b => "bounded",
        Some(_) => "NOT bounded",
        None => "what the retries alone send",
    };
    println!(
        "| {label} | {per_req:.3} | {} | {} | {} | {non_200} | {secs:.1} | {verdict} |",
        bound.map_or_else(|| "–".to_owned(), |b| format!("≤ {b:.3}")),
        sum_metric(&metrics, "switchyard_upstream_retries_total"),
        sum_metric(&metrics, "switchyard_retry_budget_refusals_total"),
    );
    Ok(())
}

/// Calls the simulator received for the failing models.
async fn failing_calls(sim: SocketAddr, models: usize) -> Result<u64> {
    let (_, stats) = http(sim, "GET", "/_sim/stats", None, None).await?;
    Ok((0..models)
        .map(|i| stats["models"][format!("failing-{i}")]["requests"].as_u64().unwrap_or(0))
        .sum())
}
