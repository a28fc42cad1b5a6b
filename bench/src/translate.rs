//! `switchyard-bench translate`: what translating one typical request (system + user +
//! two tools) and its response costs per provider adapter — OpenAI (identity), Anthropic,
//! Gemini.
//!
//! In-process: the node's own adapters (`switchyard_data_plane::providers`) on one thread.
//! The upstream responses they decode are the simulator's real answers to the adapters' own
//! requests (captured once at start, non-streamed and streamed), so each adapter decodes its
//! provider's wire format. Each operation runs in a timed loop of ~`--ms` milliseconds;
//! `--runs` loops per operation, interleaved across adapters; the median ns/op is reported.
//!
//! End to end (unless `--no-e2e`): the same request through a node whose model is served by
//! an openai-compatible, an anthropic or a gemini provider (all the simulator), closed loop on
//! `--conns` connections: node CPU µs per request, the difference being translation.

use std::hint::black_box;
use std::net::SocketAddr;
use std::path::Path;
use std::sync::Arc;
use std::time::{Duration, Instant};

use bytes::Bytes;
use http_body_util::{BodyExt, Full};
use hyper::{Request, header};
use serde_json::{Value, json};
use switchyard_catalog::{Model, Provider};
use switchyard_data_plane::providers::anthropic::Anthropic;
use switchyard_data_plane::providers::gemini::Gemini;
use switchyard_data_plane::providers::openai::OpenAi;
use switchyard_data_plane::providers::sse::{Frame, Parser};
use switchyard_data_plane::providers::{Adapter, StreamEvent};
use switchyard_data_plane::request::ChatRequest;

use crate::catalog::{PRIMARY, SECONDARY};
use crate::client::{connect, connect_many, http};
use crate::error::Result;
use crate::flags::{self, bounded};
use crate::fleet::Fleet;
use crate::host::{self, clock_ticks, cpu_ticks};
use crate::load::{Kind, Target, phase};
use crate::proc::Proc;
use crate::stats::{fmt, median, percentile};

struct Options {
    switchyard: std::path::PathBuf,
    runs: usize,
    ms: u64,
    e2e: bool,
    conns: usize,
    e2e_secs: f64,
}

/// `switchyard-bench translate`'s flags.
#[derive(clap::Args)]
#[command(args_override_self = true)]
pub struct Args {
    #[command(flatten)]
    switchyard: flags::Switchyard,
    /// Runs (1–20).
    #[arg(long, value_name = "N", default_value = "5", value_parser = bounded::<usize>(1, 20))]
    runs: usize,
    /// Milliseconds each in-process figure is timed over (10–5000).
    #[arg(long, value_name = "MS", default_value = "200", value_parser = bounded::<u64>(10, 5_000))]
    ms: u64,
    /// In-process only: no node, no simulator.
    #[arg(long)]
    no_e2e: bool,
    /// Connections to the node end to end (1–256).
    #[arg(long, value_name = "N", default_value = "1", value_parser = bounded::<usize>(1, 256))]
    conns: usize,
    /// Seconds each end-to-end figure is measured over (1–60).
    #[arg(long, value_name = "SECS", default_value = "4", value_parser = bounded::<u32>(1, 60))]
    e2e_secs: u32,
}

fn options(a: Args) -> Result<Options> {
    Ok(Options {
        switchyard: a.switchyard.existing()?,
        runs: a.runs,
        ms: a.ms,
        e2e: !a.no_e2e,
        conns: a.conns,
        e2e_secs: f64::from(a.e2e_secs),
    })
}

pub fn main(args: Args) -> Result<()> {
    let o = options(args)?;
    let rt = host::runtime(host::Threads::Current)?;
    rt.block_on(run(o))
}

/// A support-bot request: a system prompt, a user turn, two tools with JSON-schema
/// parameters, sampling options.
fn typical_request(model: &str, stream: bool) -> Value {
    json!({
        "model": model,
        "messages": [
            {"role": "system", "content": "You are the support assistant of an online shop. Answer in two sentences at most, in the customer's language. Use the tools to look orders up; never invent an order status."},
            {"role": "user", "content": "Hi, where is my order 48213? It was supposed to arrive yesterday and the tracking page shows nothing."}
        ],
        "tools": [
            {"type": "function", "function": {
                "name": "get_order_status",
                "description": "Look up the shipping status of an order by its number.",
                "parameters": {"type": "object", "properties": {
                    "order_id": {"type": "string", "description": "The order number, digits only"}
                }, "required": ["order_id"]}
            }},
            {"type": "function", "function": {
                "name": "open_refund",
                "description": "Open a refund request for an order that did not arrive.",
                "parameters": {"type": "object", "properties": {
                    "order_id": {"type": "string"},
                    "reason": {"type": "string", "enum": ["not_arrived", "damaged", "other"]},
                    "amount_eur": {"type": "number", "minimum": 0}
                }, "required": ["order_id", "reason"]}
            }}
        ],
        "tool_choice": "auto",
        "temperature": 0.2,
        "max_tokens": 256,
        "stream": stream
    })
}

/// One provider kind: its adapter, catalog entries, and the simulator's captured answers.
struct Case {
    label: &'static str,
    adapter: Box<dyn Adapter>,
    provider: Provider,
    model: Model,
    completion: Vec<u8>,
    frames: Vec<Frame>,
}

fn catalog_entries(sim: SocketAddr, kind: &str, upstream: &str) -> Result<(Provider, Model)> {
    let base = if kind == "openai-compatible" {
        format!("http://{sim}/v1")
    } else {
        format!("http://{sim}")
    };
    let provider = serde_json::from_value(json!({"name": "sim", "kind": kind, "base_url": base}))
        .map_err(|e| format!("provider: {e}"))?;
    let model = serde_json::from_value(
        json!({"name": "bench/model", "provider": "sim", "upstream_model": upstream, "max_tokens": 512}),
    )
    .map_err(|e| format!("model: {e}"))?;
    Ok((provider, model))
}

/// Sends an adapter's upstream request to the simulator and returns the 200 body.
async fn call(sim: SocketAddr, req: http::Request<Full<Bytes>>) -> Result<Vec<u8>> {
    let (mut parts, body) = req.into_parts();
    let path = parts.uri.path_and_query().map_or("/", |p| p.as_str()).to_owned();
    parts.uri = path.parse().map_err(|e| format!("uri: {e}"))?;
    parts.headers.insert(header::HOST, sim.to_string().parse().map_err(|e| format!("host: {e}"))?);
    let mut sender = connect(sim).await?;
    let resp = sender
        .send_request(Request::from_parts(parts, body))
        .await
        .map_err(|e| format!("{path}: {e}"))?;
    let status = resp.status();
    let bytes = resp.into_body().collect().await.map_err(|e| format!("{path}: {e}"))?.to_bytes();
    if status != 200 {
        return Err(format!("{path}: {status} {}", String::from_utf8_lossy(&bytes)));
    }
    Ok(bytes.to_vec())
}

async fn cases(sim: SocketAddr) -> Result<Vec<Case>> {
    let mut out = Vec::new();
    let kinds: [(&'static str, &str, &str, Box<dyn Adapter>); 3] = [
        ("OpenAI (identity)", "openai-compatible", "primary", Box::new(OpenAi)),
        ("Anthropic", "anthropic", "claude-sim", Box::new(Anthropic)),
        ("Gemini", "gemini", "gemini-sim", Box::new(Gemini)),
    ];
    for (label, kind, upstream, adapter) in kinds {
        let (provider, model) = catalog_entries(sim, kind, upstream)?;
        let plain = typical_request("bench/model", false).to_string().into_bytes();
        let streamed = typical_request("bench/model", true).to_string().into_bytes();
        let req = ChatRequest::parse(&plain).map_err(|e| format!("parse: {e:?}"))?;
        let up =
            adapter.build(&provider, &model, &req, None).map_err(|e| format!("{label}: {e}"))?;
        let completion = call(sim, up).await?;
        adapter.completion(&completion).map_err(|e| format!("{label} completion: {e}"))?;
        let req = ChatRequest::parse(&streamed).map_err(|e| format!("parse: {e:?}"))?;
        let up =
            adapter.build(&provider, &model, &req, None).map_err(|e| format!("{label}: {e}"))?;
        let body = call(sim, up).await?;
        let mut parser = Parser::default();
        parser.push(&body).map_err(|e| format!("{label} stream: {e}"))?;
        let mut frames = Vec::new();
        while let Some(frame) = parser.next_frame().map_err(|e| format!("{label} stream: {e}"))? {
            frames.push(frame);
            if frames.len() > 10_000 {
                return Err(format!("{label}: more than 10000 frames"));
            }
        }
        out.push(Case { label, adapter, provider, model, completion, frames });
    }
    Ok(out)
}

#[derive(Clone, Copy, PartialEq, Eq, Debug)]
enum Op {
    Parse,
    Request,
    Completion,
    Stream,
}

const OPS: [Op; 4] = [Op::Parse, Op::Request, Op::Completion, Op::Stream];

fn once(case: &Case, op: Op, plain: &[u8]) -> Result<()> {
    match op {
        Op::Parse => {
            black_box(ChatRequest::parse(black_box(plain)).map_err(|e| format!("{e:?}"))?);
        }
        Op::Request => {
            // The adapter needs a parsed request; the report subtracts `Parse` from this.
            let req = ChatRequest::parse(plain).map_err(|e| format!("{e:?}"))?;
            black_box(
                case.adapter
                    .build(&case.provider, &case.model, black_box(&req), None)
                    .map_err(|e| e.to_string())?,
            );
        }
        Op::Completion => {
            black_box(
                case.adapter.completion(black_box(&case.completion)).map_err(|e| e.to_string())?,
            );
        }
        Op::Stream => {
            let mut decoder = case.adapter.stream_decoder(&case.model.upstream_model);
            let mut events = 0usize;
            let mut done = false;
            for frame in &case.frames {
                let out: Vec<StreamEvent> = decoder.decode(black_box(frame))?;
                events += out.len();
                done = matches!(out.last(), Some(StreamEvent::Done));
                black_box(out);
            }
            // A stream without an end marker (Gemini's) is closed by the reader.
            if !done {
                let out = decoder.close();
                events += out.len();
                black_box(out);
            }
            black_box(events);
        }
    }
    Ok(())
}

/// ns per call of `op`, over a loop of about `ms` milliseconds (at least 10 calls).
fn timed(case: &Case, op: Op, ms: u64, plain: &[u8]) -> Result<f64> {
    let budget = Duration::from_millis(ms);
    let start = Instant::now();
    let mut n = 0u64;
    // Checked every 16 calls: Instant::now() is ~25 ns, small against µs-scale work.
    while n < 10 || (start.elapsed() < budget && n < 50_000_000) {
        for _ in 0..16 {
            once(case, op, plain)?;
        }
        n += 16;
    }
    Ok(start.elapsed().as_nanos() as f64 / n as f64)
}

async fn run(o: Options) -> Result<()> {
    let dir = tempfile::Builder::new()
        .prefix("switchyard-bench-translate-")
        .tempdir()
        .map_err(|e| format!("temp dir: {e}"))?;
    let bin = o.switchyard.as_path();
    let sim = Proc::start_sim(bin, &dir.path().join("sim.log"))?;
    // The same answer from every format: ~40 words in 20 streamed chunks.
    let text = "Your order 48213 left our warehouse on Monday and is with the carrier; the tracking page updates once it is scanned at the depot. I have opened a check with them and will write to you by tomorrow noon.";
    for model in ["primary", "claude-sim", "gemini-sim"] {
        let body = json!({"model": model, "behaviour": {"kind": "ok", "chunks": 20, "text": text}});
        let (status, v) =
            http(sim.addr, "POST", "/_sim/script", None, Some(body.to_string())).await?;
        if status >= 300 {
            return Err(format!("scripting the simulator's {model}: {status} {v}"));
        }
    }
    let cases = cases(sim.addr).await?;
    drop(sim);
    let plain = typical_request("bench/model", false).to_string().into_bytes();
    for c in &cases {
        eprintln!("  {} completion: {}", c.label, String::from_utf8_lossy(&c.completion));
    }
    eprintln!(
        "switchyard-bench translate: request {} bytes; completions {:?} bytes; stream frames {:?}",
        plain.len(),
        cases.iter().map(|c| c.completion.len()).collect::<Vec<_>>(),
        cases.iter().map(|c| c.frames.len()).collect::<Vec<_>>()
    );
    // results[case][op] = ns per run
    let mut results = vec![vec![Vec::new(); OPS.len()]; cases.len()];
    for run in 1..=o.runs {
        for (oi, &op) in OPS.iter().enumerate() {
            for (ci, case) in cases.iter().enumerate() {
                let ns = timed(case, op, o.ms, &plain)?;
                results[ci][oi].push(ns);
            }
        }
        eprintln!("  run {run} done");
    }
    let med = |ci: usize, op: Op| {
        let oi = OPS.iter().position(|x| *x == op).unwrap_or(0);
        median(&results[ci][oi])
    };
    println!(
        "### Translation, in-process (medians of {} runs of ~{} ms each; one thread)\n",
        o.runs, o.ms
    );
    println!(
        "| adapter | parse client body µs | build upstream request µs | decode completion µs | request + response µs | × OpenAI | stream: frames | decode stream µs | per frame µs |"
    );
    println!("|---|---:|---:|---:|---:|---:|---:|---:|---:|");
    let total = |ci: usize| {
        // `Request` includes its own parse; the translation proper is the difference.
        let req = med(ci, Op::Request).zip(med(ci, Op::Parse)).map(|(r, p)| (r - p).max(0.0));
        req.zip(med(ci, Op::Completion)).map(|(r, c)| r + c)
    };
    for (ci, case) in cases.iter().enumerate() {
        let req = med(ci, Op::Request).zip(med(ci, Op::Parse)).map(|(r, p)| (r - p).max(0.0));
        let us = |v: Option<f64>| fmt(v.map(|v| v / 1e3), 2);
        println!(
            "| {} | {} | {} | {} | {} | {} | {} | {} | {} |",
            case.label,
            us(med(ci, Op::Parse)),
            us(req),
            us(med(ci, Op::Completion)),
            us(total(ci)),
            fmt(total(ci).zip(total(0)).map(|(a, b)| a / b), 2),
            case.frames.len(),
            us(med(ci, Op::Stream)),
            us(med(ci, Op::Stream).map(|v| v / case.frames.len().max(1) as f64)),
        );
    }
    println!();
    if o.e2e {
        e2e(&o, dir.path()).await?;
    }
    Ok(())
}

fn e2e_catalog(sim: SocketAddr) -> String {
    format!(
        r#"providers:
  - name: sim
    kind: openai-compatible
    base_url: http://{sim}/v1
  - name: sim-anthropic
    kind: anthropic
    base_url: http://{sim}
  - name: sim-gemini
    kind: gemini
    base_url: http://{sim}
models:
  - name: {primary}
    provider: sim
    upstream_model: primary
  - name: {secondary}
    provider: sim
    upstream_model: secondary
  - name: sim-anthropic/claude
    provider: sim-anthropic
    upstream_model: claude-sim
    max_tokens: 512
  - name: sim-gemini/gemini
    provider: sim-gemini
    upstream_model: gemini-sim
"#,
        primary = PRIMARY,
        secondary = SECONDARY,
    )
}

async fn e2e(o: &Options, dir: &Path) -> Result<()> {
    let dir = dir.join("e2e");
    std::fs::create_dir_all(&dir).map_err(|e| format!("{}: {e}", dir.display()))?;
    let fleet = Fleet::start(&o.switchyard, &dir, e2e_catalog).await?;
    let ticks = clock_ticks() as f64;
    let models = [
        ("openai-compatible", PRIMARY),
        ("anthropic", "sim-anthropic/claude"),
        ("gemini", "sim-gemini/gemini"),
    ];
    let targets: Vec<Arc<Target>> = models
        .iter()
        .map(|(_, m)| {
            Arc::new(Target {
                kind: Kind::NodeHealthy,
                addr: fleet.node.addr,
                host: fleet.node.addr.to_string(),
                auth: Some(format!("Bearer {}", fleet.key)),
                body: Bytes::from(typical_request(m, false).to_string()),
                proxy_pid: Some(fleet.node.pid()),
                tls: None,
            })
        })
        .collect();
    for (t, (kind, m)) in targets.iter().zip(&models) {
        let body = String::from_utf8_lossy(&t.body).into_owned();
        let (status, v) =
            http(t.addr, "POST", "/v1/chat/completions", Some(&fleet.key), Some(body)).await?;
        if status != 200 || v["model"] != *m {
            return Err(format!("{kind}: check request got {status}: {v}"));
        }
    }
    let mut rows: Vec<Vec<(f64, f64, f64, f64)>> = vec![Vec::new(); targets.len()];
    let warm = Duration::from_secs(1);
    let window = Duration::from_secs_f64(o.e2e_secs);
    for run in 1..=o.runs.min(5) {
        for (i, t) in targets.iter().enumerate() {
            let conns = connect_many(t.addr, o.conns).await?;
            let (conns, _, _) = phase(conns, t, Instant::now() + warm, false).await?;
            let (node0, sim0) = (cpu_ticks(fleet.node.pid())?, cpu_ticks(fleet.sim.pid())?);
            let start = Instant::now();
            let (conns, mut lat, non_200) = phase(conns, t, start + window, true).await?;
            let wall = start.elapsed().as_secs_f64();
            let (node1, sim1) = (cpu_ticks(fleet.node.pid())?, cpu_ticks(fleet.sim.pid())?);
            drop(conns);
            if non_200 > 0 {
                return Err(format!("{}: {non_200} non-200 answers", models[i].0));
            }
            let n = lat.len() as f64;
            lat.sort_unstable();
            let per = |d: u64| d as f64 / ticks * 1e6 / n;
            let p50 = percentile(&lat, 0.5) / 1e3;
            rows[i].push((n / wall, p50, per(node1 - node0), per(sim1 - sim0)));
            eprintln!(
                "  e2e run {run} {:<18} {:>7.0} req/s p50 {:>6.1} µs node {:>5.1} µs/req",
                models[i].0,
                n / wall,
                p50,
                per(node1 - node0)
            );
        }
    }
    println!(
        "### Translation, end to end through a node (c={}, medians of {} runs of {} s)\n",
        o.conns,
        rows[0].len(),
        o.e2e_secs
    );
    println!(
        "| provider kind | req/s | p50 µs | node CPU µs/req | added vs openai-compatible µs/req | sim CPU µs/req |"
    );
    println!("|---|---:|---:|---:|---:|---:|");
    let m = |i: usize, g: fn(&(f64, f64, f64, f64)) -> f64| {
        median(&rows[i].iter().map(g).collect::<Vec<_>>())
    };
    for (i, (kind, _)) in models.iter().enumerate() {
        println!(
            "| {kind} | {} | {} | {} | {} | {} |",
            fmt(m(i, |r| r.0), 0),
            fmt(m(i, |r| r.1), 1),
            fmt(m(i, |r| r.2), 1),
            fmt(m(i, |r| r.2).zip(m(0, |r| r.2)).map(|(a, b)| a - b), 1),
            fmt(m(i, |r| r.3), 1),
        );
    }
    println!();
    Ok(())
}
