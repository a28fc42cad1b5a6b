//! `switchyard-bench streams`: N concurrent `stream: true` requests, one HTTP/1.1
//! connection each, through one node and — in the same run, one after the other — straight
//! to the simulator. The simulator's `primary` is scripted to stream `--chunks` content
//! chunks `--chunk-delay-ms` apart.
//!
//! Per run and target: the node's idle VmRSS is read, N connections are opened, then the requests start evenly over `--ramp-ms`, so every stream is open at once
//! from the end of the ramp until the first ones finish (chunks × delay later). VmRSS of the
//! node is sampled every 50 ms; its peak minus idle, over N, is the memory per open stream.
//! Node CPU (utime+stime) from the first request to the last stream's end, over the chunks
//! the client received, is the CPU per 1,000 chunks. TTFT is from sending a request to the
//! first SSE event with non-empty `content`. Every stream must end with `data: [DONE]`.

use std::net::SocketAddr;
use std::sync::Arc;
use std::time::{Duration, Instant};

use bytes::Bytes;
use http_body_util::{BodyExt, Full};
use hyper::client::conn::http1::SendRequest;
use hyper::{Request, header};
use serde_json::json;

use crate::catalog::{PREFILL, PRIMARY, catalog_yaml};
use crate::client::connect_many;
use crate::error::Result;
use crate::flags::{self, bounded};
use crate::fleet::Fleet;
use crate::host::{self, clock_ticks, cpu_ticks, mib, open_files_limit, status_kib};
use crate::proc::Proc;
use crate::stats::{fmt, median, pct};

struct Options {
    switchyard: std::path::PathBuf,
    streams: usize,
    chunks: u32,
    chunk_delay_ms: u64,
    ramp_ms: u64,
    runs: usize,
    /// Stream from a model that can continue an answer: the node keeps what each stream
    /// delivered, and the figures show what that costs.
    prefill: bool,
}

/// `switchyard-bench streams`'s flags.
#[derive(clap::Args)]
#[command(args_override_self = true)]
pub struct Args {
    #[command(flatten)]
    switchyard: flags::Switchyard,
    /// Concurrent streams (1–20000).
    #[arg(long, value_name = "N", default_value = "2000", value_parser = bounded::<usize>(1, 20_000))]
    streams: usize,
    /// Chunks per stream (1–2000).
    #[arg(long, value_name = "N", default_value = "200", value_parser = bounded::<u32>(1, 2_000))]
    chunks: u32,
    /// The simulator's delay between chunks, in milliseconds (0–1000).
    #[arg(long, value_name = "MS", default_value = "20", value_parser = bounded::<u64>(0, 1_000))]
    chunk_delay_ms: u64,
    /// Time over which the streams are opened, in milliseconds (0–60000).
    #[arg(long, value_name = "MS", default_value = "1000", value_parser = bounded::<u64>(0, 60_000))]
    ramp_ms: u64,
    /// Runs (1–20).
    #[arg(long, value_name = "N", default_value = "3", value_parser = bounded::<usize>(1, 20))]
    runs: usize,
    /// Stream from a model that can continue an answer (the node keeps what each stream
    /// delivered).
    #[arg(long)]
    prefill: bool,
}

fn options(a: Args) -> Result<Options> {
    Ok(Options {
        switchyard: a.switchyard.existing()?,
        streams: a.streams,
        chunks: a.chunks,
        chunk_delay_ms: a.chunk_delay_ms,
        ramp_ms: a.ramp_ms,
        runs: a.runs,
        prefill: a.prefill,
    })
}

pub fn main(args: Args) -> Result<()> {
    let o = options(args)?;
    // The node holds a client and an upstream socket per stream, the simulator one (plus the
    // node's idle pool), the bench one: all inherit this process's limit.
    let need = (o.streams as u64) * 2 + 256;
    match open_files_limit() {
        Some(limit) if limit < need => {
            return Err(format!(
                "open-file limit {limit} < {need} needed for {} streams: run under `ulimit -n {}`",
                o.streams,
                need.next_power_of_two()
            ));
        }
        _ => {}
    }
    // One thread, like the load benchmark: the client takes at most one core.
    let rt = host::runtime(host::Threads::Current)?;
    rt.block_on(run(o))
}

/// One run against one target.
#[derive(Debug, Default)]
struct Sample {
    ttft_ms: Vec<f64>,
    total_ms: Vec<f64>,
    done: usize,
    chunks: u64,
    errors: Vec<String>,
    wall_s: f64,
    /// The proxy (node or pass-through) or, for direct, the simulator.
    idle_rss_kib: u64,
    peak_rss_kib: u64,
    after_rss_kib: u64,
    /// Open file descriptors of the same process after the streams ended.
    after_fds: usize,
    proxy_cpu_s: f64,
    sim_cpu_s: f64,
}

async fn run(o: Options) -> Result<()> {
    let dir = tempfile::Builder::new()
        .prefix("switchyard-bench-streams-")
        .tempdir()
        .map_err(|e| format!("temp dir: {e}"))?;
    let fleet = Fleet::start(&o.switchyard, dir.path(), catalog_yaml).await?;
    // Enough text for `chunks` pieces of one word each.
    let text = (0..o.chunks).map(|i| format!("w{i} ")).collect::<String>();
    fleet
        .script(
            "primary",
            json!({"kind": "ok", "chunks": o.chunks, "chunk_delay_ms": o.chunk_delay_ms, "text": text}),
        )
        .await?;
    let ticks = clock_ticks() as f64;
    let messages = json!([{"role": "user", "content": "Stream me a story."}]);
    let model = if o.prefill { PREFILL } else { PRIMARY };
    let node_body = json!({"model": model, "messages": messages, "stream": true});
    let direct_body = json!({"model": "primary", "messages": messages, "stream": true});
    let node = Target {
        addr: fleet.node.addr,
        auth: Some(format!("Bearer {}", fleet.key)),
        body: Bytes::from(node_body.to_string()),
    };
    let direct =
        Target { addr: fleet.sim.addr, auth: None, body: Bytes::from(direct_body.to_string()) };
    // The floor of a proxy hop for streams: the bench's own bare hyper pass-through
    // (bytes forwarded as they arrive, nothing parsed), in front of the same simulator.
    let me = std::env::current_exe().map_err(|e| format!("own path: {e}"))?;
    let sim_addr = fleet.sim.addr.to_string();
    let pass = Proc::start(
        &me,
        &["passthrough", "--listen", "127.0.0.1:0", "--upstream", &sim_addr],
        &[],
        &dir.path().join("passthrough.log"),
    )?;
    let passthrough = Target { addr: pass.addr, auth: None, body: direct.body.clone() };
    let (node, direct, passthrough) = (Arc::new(node), Arc::new(direct), Arc::new(passthrough));
    let sim_pid = fleet.sim.pid();
    let targets = [
        ("node", &node, Some(fleet.node.pid())),
        ("hyper pass-through", &passthrough, Some(pass.pid())),
        ("sim direct", &direct, None),
    ];
    eprintln!(
        "switchyard-bench streams: {} runs × {} streams × {} chunks {} ms apart, ramp {} ms; logs in {}",
        o.runs,
        o.streams,
        o.chunks,
        o.chunk_delay_ms,
        o.ramp_ms,
        dir.path().display()
    );
    // Warm-up: a few streams through each, so one-time allocations (pools, metric
    // families) are in the idle figure rather than the per-stream one.
    for (label, t, pid) in &targets {
        let w = load(t, 16, 0, &o, *pid, sim_pid, ticks).await?;
        if w.done != 16 {
            return Err(format!(
                "warm-up {label}: {} of 16 streams completed: {:?}",
                w.done, w.errors
            ));
        }
    }
    let mut runs = Vec::new();
    for run in 1..=o.runs {
        let mut samples = Vec::new();
        for (label, t, pid) in &targets {
            let s = load(t, o.streams, o.ramp_ms, &o, *pid, sim_pid, ticks).await?;
            eprintln!(
                "  run {run} {label:<18}: {} done of {}, {} chunks, TTFT p50 {} p99 {} ms, RSS idle {:.1} peak {:.1} after {:.1} MiB ({} fds), proxy CPU {:.2} s, sim CPU {:.2} s, {:.1} s{}",
                s.done,
                o.streams,
                s.chunks,
                fmt(pct(&s.ttft_ms, 0.5), 1),
                fmt(pct(&s.ttft_ms, 0.99), 1),
                mib(s.idle_rss_kib),
                mib(s.peak_rss_kib),
                mib(s.after_rss_kib),
                s.after_fds,
                s.proxy_cpu_s,
                s.sim_cpu_s,
                s.wall_s,
                s.errors.first().map(|e| format!("; first error: {e}")).unwrap_or_default()
            );
            samples.push(s);
        }
        runs.push(samples);
    }
    report(&o, &runs);
    drop(pass);
    drop(fleet);
    Ok(())
}

fn report(o: &Options, runs: &[Vec<Sample>]) {
    let n = o.streams as f64;
    let labels = ["node", "hyper pass-through", "sim direct"];
    println!(
        "### Streams: {} concurrent, {} chunks × {} ms (per run)\n",
        o.streams, o.chunks, o.chunk_delay_ms
    );
    println!(
        "| run | target | completed with [DONE] | chunks received | TTFT p50 ms | TTFT p99 ms | added TTFT p50 ms | added TTFT p99 ms | stream p50 s | idle VmRSS MiB | peak VmRSS MiB | RSS/stream KiB | VmRSS after MiB | fds after | proxy CPU ms/1000 chunks | CPU × pass-through | sim CPU ms/1000 chunks |"
    );
    println!(
        "|---:|---|---:|---:|---:|---:|---:|---:|---:|---:|---:|---:|---:|---:|---:|---:|---:|"
    );
    let per_stream = |s: &Sample| (s.peak_rss_kib.saturating_sub(s.idle_rss_kib)) as f64 / n;
    let cpu_per_k = |s: &Sample, cpu: f64| cpu * 1e3 / (s.chunks as f64 / 1e3);
    for (i, run) in runs.iter().enumerate() {
        let direct = &run[2];
        for (j, s) in run.iter().enumerate() {
            let proxy = j < 2;
            let added =
                |q: f64| pct(&s.ttft_ms, q).zip(pct(&direct.ttft_ms, q)).map(|(a, b)| a - b);
            let dash = || "–".to_owned();
            println!(
                "| {} | {} | {} / {} | {} | {} | {} | {} | {} | {} | {:.1} | {:.1} | {:.1} | {:.1} | {} | {} | {} | {:.1} |",
                i + 1,
                labels[j],
                s.done,
                o.streams,
                s.chunks,
                fmt(pct(&s.ttft_ms, 0.5), 2),
                fmt(pct(&s.ttft_ms, 0.99), 2),
                if proxy { fmt(added(0.5), 2) } else { dash() },
                if proxy { fmt(added(0.99), 2) } else { dash() },
                fmt(pct(&s.total_ms, 0.5).map(|v| v / 1e3), 2),
                mib(s.idle_rss_kib),
                mib(s.peak_rss_kib),
                per_stream(s),
                mib(s.after_rss_kib),
                s.after_fds,
                if proxy { format!("{:.1}", cpu_per_k(s, s.proxy_cpu_s)) } else { dash() },
                if proxy {
                    format!("{:.2}", s.proxy_cpu_s / run[1].proxy_cpu_s.max(1e-9))
                } else {
                    dash()
                },
                cpu_per_k(s, s.sim_cpu_s),
            );
        }
    }
    let med = |_: usize, g: &dyn Fn(&[Sample]) -> Option<f64>| {
        median(&runs.iter().filter_map(|r| g(r)).collect::<Vec<_>>())
    };
    let added = |q: f64| {
        move |r: &[Sample]| pct(&r[0].ttft_ms, q).zip(pct(&r[2].ttft_ms, q)).map(|(a, b)| a - b)
    };
    let all_done = runs.iter().flatten().all(|s| s.done == o.streams);
    println!("\n### Streams: summary over {} runs\n", runs.len());
    println!("| figure | value | goal | verdict |");
    println!("|---|---:|---|---|");
    let v = |ok: bool| if ok { "met" } else { "NOT met" };
    let first = runs.first().map(|r| per_stream(&r[0]));
    println!(
        "| node RSS per open stream, run 1 (fresh node after warm-up) | {} KiB | ≤ 64 KiB | {} |",
        fmt(first, 1),
        v(first.is_some_and(|r| r <= 64.0))
    );
    println!(
        "| node RSS per open stream, later runs (median; memory kept from run 1 reused) | {} KiB | – | – |",
        fmt(median(&runs.iter().skip(1).map(|r| per_stream(&r[0])).collect::<Vec<_>>()), 1)
    );
    println!(
        "| node idle VmRSS before each run | {} MiB | bounded | see reading |",
        runs.iter()
            .map(|r| format!("{:.1}", mib(r[0].idle_rss_kib)))
            .collect::<Vec<_>>()
            .join(" → ")
    );
    println!(
        "| node / pass-through CPU per 1,000 chunks (median) | {} / {} ms | – | {}× |",
        fmt(med(0, &|r| Some(cpu_per_k(&r[0], r[0].proxy_cpu_s))), 1),
        fmt(med(0, &|r| Some(cpu_per_k(&r[1], r[1].proxy_cpu_s))), 1),
        fmt(med(0, &|r| Some(r[0].proxy_cpu_s / r[1].proxy_cpu_s.max(1e-9))), 2)
    );
    println!(
        "| TTFT p50: direct / pass-through / node (median) | {} / {} / {} ms | – | – |",
        fmt(med(0, &|r| pct(&r[2].ttft_ms, 0.5)), 2),
        fmt(med(0, &|r| pct(&r[1].ttft_ms, 0.5)), 2),
        fmt(med(0, &|r| pct(&r[0].ttft_ms, 0.5)), 2)
    );
    println!("| node added TTFT p50 (median) | {} ms | – | – |", fmt(med(0, &added(0.5)), 2));
    println!("| node added TTFT p99 (median) | {} ms | – | – |", fmt(med(0, &added(0.99)), 2));
    println!(
        "| streams completed with [DONE] (node+pass+direct per run) | {} | all | {} |",
        runs.iter()
            .map(|r| r.iter().map(|s| s.done.to_string()).collect::<Vec<_>>().join("+"))
            .collect::<Vec<_>>()
            .join(", "),
        v(all_done)
    );
    println!();
}

struct Target {
    addr: SocketAddr,
    auth: Option<String>,
    body: Bytes,
}

/// One result per stream: TTFT, total, chunks, whether `[DONE]` came.
struct One {
    ttft: Option<Duration>,
    total: Duration,
    chunks: u64,
    done: bool,
}

#[allow(clippy::too_many_arguments)]
async fn load(
    t: &Arc<Target>,
    n: usize,
    ramp_ms: u64,
    o: &Options,
    proxy_pid: Option<u32>,
    sim_pid: u32,
    ticks: f64,
) -> Result<Sample> {
    let watched = proxy_pid.unwrap_or(sim_pid);
    // Idle: before the connections, so the per-stream figure includes each connection.
    let mut s = Sample { idle_rss_kib: status_kib(watched, "VmRSS")?, ..Sample::default() };
    let conns = connect_many(t.addr, n).await?;
    let proxy_cpu = || proxy_pid.map_or(Ok(0), cpu_ticks);
    let (proxy_before, sim_before) = (proxy_cpu()?, cpu_ticks(sim_pid)?);
    let stream_time = Duration::from_millis(o.chunk_delay_ms * u64::from(o.chunks));
    let start = Instant::now();
    // Every stream gets its own bound: the ramp, its nominal length, and 30 s of slack.
    let deadline = start + Duration::from_millis(ramp_ms) + stream_time + Duration::from_secs(30);
    let mut tasks = Vec::with_capacity(n);
    for (i, sender) in conns.into_iter().enumerate() {
        let t = Arc::clone(t);
        let at = start + Duration::from_millis(ramp_ms * i as u64 / n as u64);
        tasks.push(tokio::spawn(async move {
            tokio::time::sleep_until(at.into()).await;
            tokio::time::timeout_at(deadline.into(), one_stream(sender, &t))
                .await
                .map_err(|_| "stream did not finish before its deadline".to_owned())?
        }));
    }
    // RSS sampler: every 50 ms until every stream has ended.
    let mut peak = s.idle_rss_kib;
    let mut results = Vec::with_capacity(n);
    let mut pending = tasks.into_iter();
    let mut sampler = tokio::time::interval(Duration::from_millis(50));
    let mut next = pending.next();
    while let Some(mut task) = next.take() {
        tokio::select! {
            r = &mut task => {
                results.push(r.map_err(|e| format!("stream task: {e}"))?);
                next = pending.next();
            }
            _ = sampler.tick() => {
                if let Ok(kib) = status_kib(watched, "VmRSS") {
                    peak = peak.max(kib);
                }
                next = Some(task);
            }
        }
    }
    s.wall_s = start.elapsed().as_secs_f64();
    s.proxy_cpu_s = proxy_cpu()?.saturating_sub(proxy_before) as f64 / ticks;
    s.sim_cpu_s = cpu_ticks(sim_pid)?.saturating_sub(sim_before) as f64 / ticks;
    s.peak_rss_kib = peak;
    // After the connections closed and the node had a moment to drop them.
    tokio::time::sleep(Duration::from_millis(300)).await;
    s.after_rss_kib = status_kib(watched, "VmRSS")?;
    s.after_fds = std::fs::read_dir(format!("/proc/{watched}/fd")).map_or(0, |d| d.count());
    for r in results {
        match r {
            Ok(one) => {
                s.chunks += one.chunks;
                if one.done {
                    s.done += 1;
                } else {
                    s.errors.push(format!("ended without [DONE] after {} chunks", one.chunks));
                }
                if let Some(ttft) = one.ttft {
                    s.ttft_ms.push(ttft.as_secs_f64() * 1e3);
                }
                s.total_ms.push(one.total.as_secs_f64() * 1e3);
            }
            Err(e) => s.errors.push(e),
        }
    }
    Ok(s)
}

async fn one_stream(mut sender: SendRequest<Full<Bytes>>, t: &Target) -> Result<One> {
    sender.ready().await.map_err(|e| format!("connection lost: {e}"))?;
    let mut req = Request::post("/v1/chat/completions")
        .header(header::HOST, t.addr.to_string())
        .header(header::CONTENT_TYPE, "application/json");
    if let Some(auth) = &t.auth {
        req = req.header(header::AUTHORIZATION, auth);
    }
    let req = req.body(Full::new(t.body.clone())).map_err(|e| format!("request: {e}"))?;
    let start = Instant::now();
    let resp = sender.send_request(req).await.map_err(|e| format!("request: {e}"))?;
    if resp.status() != hyper::StatusCode::OK {
        let status = resp.status();
        let body = resp.into_body().collect().await.map(|b| b.to_bytes()).unwrap_or_default();
        return Err(format!("status {status}: {}", String::from_utf8_lossy(&body)));
    }
    let mut body = resp.into_body();
    let mut buf: Vec<u8> = Vec::with_capacity(1024);
    let mut one = One { ttft: None, total: Duration::ZERO, chunks: 0, done: false };
    while let Some(frame) = body.frame().await {
        let frame = frame.map_err(|e| format!("body: {e}"))?;
        let Ok(data) = frame.into_data() else { continue };
        buf.extend_from_slice(&data);
        // Whole events only; a partial one stays in `buf`.
        let mut consumed = 0;
        while let Some(end) = find(&buf[consumed..], b"\n\n") {
            let event = &buf[consumed..consumed + end];
            consumed += end + 2;
            if event.starts_with(b"data: [DONE]") {
                one.done = true;
                continue;
            }
            if find(event, b"\"error\"").is_some() && find(event, b"\"choices\"").is_none() {
                return Err(format!("in-band error: {}", String::from_utf8_lossy(event)));
            }
            one.chunks += 1;
            if one.ttft.is_none() && has_content(event) {
                one.ttft = Some(start.elapsed());
            }
        }
        buf.drain(..consumed);
    }
    one.total = start.elapsed();
    Ok(one)
}

fn find(hay: &[u8], needle: &[u8]) -> Option<usize> {
    hay.windows(needle.len()).position(|w| w == needle)
}

/// An event whose `"content":"…"` is not empty.
fn has_content(event: &[u8]) -> bool {
    const KEY: &[u8] = b"\"content\":\"";
    let mut rest = event;
    while let Some(i) = find(rest, KEY) {
        rest = &rest[i + KEY.len()..];
        if rest.first().is_some_and(|c| *c != b'"') {
            return true;
        }
    }
    false
}
