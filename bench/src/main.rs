//! `switchyard-bench`: one run measures, at the same concurrency, the simulator called
//! directly (the limit), a bare hyper pass-through proxy that forwards bytes without parsing
//! them (the floor of one Rust proxy hop), and the node with its primary healthy and with
//! its primary always failing (breaker open, served by the fallback).
//!
//! It builds nothing: it starts the release `switchyard` binary found next to itself (or
//! `--switchyard PATH`) as sim, control plane and node on loopback with temporary
//! directories, and re-executes itself as `switchyard-bench passthrough` so the
//! pass-through's CPU time is measurable from /proc like the node's. See
//! docs/BENCHMARKS.md for what each column means.

use std::fs::File;
use std::io::{BufRead, BufReader, Read};
use std::net::SocketAddr;
use std::path::{Path, PathBuf};
use std::process::{Child, Command, ExitCode, Stdio};
use std::sync::Arc;
use std::sync::mpsc;
use std::time::{Duration, Instant};

use bytes::Bytes;
use http_body_util::{BodyExt, Full};
use hyper::body::Incoming;
use hyper::client::conn::http1::SendRequest;
use hyper::{Request, header};
use hyper_util::client::legacy::Client;
use hyper_util::client::legacy::connect::HttpConnector;
use hyper_util::rt::{TokioExecutor, TokioIo};
use serde_json::{Value, json};
use tokio::net::{TcpListener, TcpStream};

mod fleet;

use fleet::Fleet;
mod keys;
mod streams;
mod translate;

/// The e2e harness's throw-away etcd (std + tokio + tempfile only), for `keys --store etcd`.
#[path = "../../control-plane/tests/support/etcd.rs"]
mod etcd;

type Result<T> = std::result::Result<T, String>;

const USAGE: &str = "usage: switchyard-bench [--switchyard PATH] [--concurrency 1,32] \
[--warmup-secs 2] [--duration-secs 5] [--runs 3] [--max-steal-pct 5]
       switchyard-bench keys [--count 100000] [--store embedded,etcd] [--runs 3] [--changes 5]
       switchyard-bench streams [--streams 2000] [--chunks 200] [--chunk-delay-ms 20] [--runs 3]
       switchyard-bench translate [--runs 5] [--ms 200] [--no-e2e] [--conns 1] [--e2e-secs 4]
       switchyard-bench passthrough --listen ADDR --upstream ADDR   (started by the bench)";

/// A concurrency's targets are measured again when the hypervisor took more than this share
/// of the machine's CPU time (steal) during any of them (`--max-steal-pct`).
const DEFAULT_MAX_STEAL_PCT: f64 = 5.0;
/// Attempts at one concurrency of one run before the least disturbed one is kept.
const MAX_ATTEMPTS: usize = 4;

/// Gateway model names → simulator upstream models. `failing` is scripted to answer 503
/// before the node sees any traffic; `secondary` is the fallback that serves instead.
const PRIMARY: &str = "sim/primary";
const FAILING: &str = "sim/failing";
const SECONDARY: &str = "sim/secondary";

/// A short cool-down so half-open probes do happen inside every measured window: the
/// attempts-per-request figure is then the steady state of an open breaker that keeps
/// probing, not an artefact of a 30 s default cool-down outlasting the window.
const BREAKER_POLICY: &str = "breaker_policy:
  window_size: 20
  min_requests: 10
  failure_rate_threshold: 0.5
  consecutive_timeouts: 5
  cooldown_ms: 1000
  max_cooldown_ms: 1000
  half_open_probes: 1
";

/// The same allocator as the `switchyard` binary, so the pass-through floor and the node
/// differ by their work, not by their malloc.
#[global_allocator]
static ALLOCATOR: mimalloc::MiMalloc = mimalloc::MiMalloc;

fn main() -> ExitCode {
    let args: Vec<String> = std::env::args().skip(1).collect();
    let result = match args.first().map(String::as_str) {
        Some("passthrough") => passthrough_main(&args[1..]),
        Some("keys") => keys::main(&args[1..]),
        Some("streams") => streams::main(&args[1..]),
        Some("translate") => translate::main(&args[1..]),
        Some("-h" | "--help") => {
            println!("{USAGE}");
            Ok(())
        }
        _ => bench_main(&args),
    };
    match result {
        Ok(()) => ExitCode::SUCCESS,
        Err(e) => {
            eprintln!("switchyard-bench: {e}");
            ExitCode::FAILURE
        }
    }
}

// === Options ===

struct Options {
    switchyard: PathBuf,
    concurrency: Vec<usize>,
    warmup: Duration,
    duration: Duration,
    runs: usize,
    max_steal_pct: f64,
}

fn parse_options(args: &[String]) -> Result<Options> {
    let mut switchyard = None;
    let mut concurrency = vec![1, 32];
    let mut warmup = Duration::from_secs(2);
    let mut duration = Duration::from_secs(5);
    let mut runs = 3;
    let mut max_steal_pct = DEFAULT_MAX_STEAL_PCT;
    let mut it = args.iter();
    while let Some(flag) = it.next() {
        let mut value = || it.next().ok_or_else(|| format!("{flag} needs a value\n{USAGE}"));
        let secs = |v: &str| {
            v.parse::<f64>()
                .ok()
                .filter(|s| *s > 0.0 && *s <= 600.0)
                .map(Duration::from_secs_f64)
                .ok_or_else(|| format!("{flag}: expected seconds in (0, 600], got {v:?}"))
        };
        match flag.as_str() {
            "--switchyard" => switchyard = Some(PathBuf::from(value()?)),
            "--concurrency" => {
                concurrency = value()?
                    .split(',')
                    .map(|c| c.trim().parse::<usize>().ok().filter(|c| (1..=1024).contains(c)))
                    .collect::<Option<Vec<_>>>()
                    .ok_or_else(|| "--concurrency: expected e.g. 1,32 (each 1–1024)".to_owned())?;
            }
            "--warmup-secs" => warmup = secs(value()?)?,
            "--duration-secs" => duration = secs(value()?)?,
            "--runs" => {
                let v = value()?;
                runs = v
                    .parse()
                    .ok()
                    .filter(|r| (1..=20).contains(r))
                    .ok_or_else(|| format!("--runs: expected 1–20, got {v:?}"))?;
            }
            "--max-steal-pct" => {
                let v = value()?;
                max_steal_pct =
                    v.parse::<f64>().ok().filter(|p| *p > 0.0 && *p <= 100.0).ok_or_else(|| {
                        format!("--max-steal-pct: expected a percentage in (0, 100], got {v:?}")
                    })?;
            }
            other => return Err(format!("unknown argument {other:?}\n{USAGE}")),
        }
    }
    let switchyard = match switchyard {
        Some(p) => p,
        // `cargo run --release -p switchyard-bench` puts us in target/release, next to the
        // `switchyard` binary `cargo build --release -p switchyard-cli` made.
        None => std::env::current_exe()
            .map_err(|e| format!("cannot find our own path: {e}"))?
            .with_file_name("switchyard"),
    };
    if !switchyard.is_file() {
        return Err(format!(
            "{} not found: build it with `cargo build --release -p switchyard-cli` or pass --switchyard PATH",
            switchyard.display()
        ));
    }
    Ok(Options { switchyard, concurrency, warmup, duration, runs, max_steal_pct })
}

/// The `switchyard` binary next to ours (`target/release/switchyard`).
fn default_switchyard() -> Result<PathBuf> {
    Ok(std::env::current_exe()
        .map_err(|e| format!("cannot find our own path: {e}"))?
        .with_file_name("switchyard"))
}

/// An integer flag value in `lo..=hi`.
fn bounded(v: &str, lo: usize, hi: usize, flag: &str) -> Result<usize> {
    v.parse()
        .ok()
        .filter(|n| (lo..=hi).contains(n))
        .ok_or_else(|| format!("{flag}: expected {lo}–{hi}, got {v:?}"))
}

fn unix_ms() -> i64 {
    std::time::SystemTime::now()
        .duration_since(std::time::UNIX_EPOCH)
        .map_or(0, |d| i64::try_from(d.as_millis()).unwrap_or(i64::MAX))
}

// === Child processes ===

/// A child process that is killed when dropped, so every exit path of the bench (errors
/// included) leaves nothing running.
struct Proc {
    child: Child,
    addr: SocketAddr,
}

impl Proc {
    /// Starts `bin ARGS` and waits for its `listening on ADDR` line on stdout; stderr goes
    /// to `log`.
    fn start(bin: &Path, args: &[&str], envs: &[(&str, &str)], log: &Path) -> Result<Proc> {
        let log_file =
            File::create(log).map_err(|e| format!("cannot create {}: {e}", log.display()))?;
        let mut cmd = Command::new(bin);
        cmd.args(args)
            // Each server's own default log filter: what a user runs.
            .env_remove("RUST_LOG")
            .env_remove("SWITCHYARD_JOIN_TOKEN")
            .env_remove("SWITCHYARD_ADMIN_TOKEN")
            .env_remove("SWITCHYARD_CONTROL")
            .envs(envs.iter().copied())
            // The pass-through exits when its stdin closes, i.e. when we are gone.
            .stdin(Stdio::piped())
            .stdout(Stdio::piped())
            .stderr(log_file);
        let mut child =
            cmd.spawn().map_err(|e| format!("cannot start {} {args:?}: {e}", bin.display()))?;
        let Some(stdout) = child.stdout.take() else {
            let _ = child.kill();
            return Err("child has no stdout".into());
        };
        let (tx, rx) = mpsc::channel();
        // Keeps draining stdout after the address line so the child never blocks on a full pipe.
        std::thread::spawn(move || {
            let mut tx = Some(tx);
            for line in BufReader::new(stdout).lines() {
                let Ok(line) = line else { break };
                let addr = line
                    .split_once("listening on ")
                    .and_then(|(_, a)| a.trim().parse::<SocketAddr>().ok());
                if let (Some(addr), Some(tx)) = (addr, tx.take()) {
                    let _ = tx.send(addr);
                }
            }
        });
        match rx.recv_timeout(Duration::from_secs(30)) {
            Ok(addr) => Ok(Proc { child, addr }),
            Err(_) => {
                let _ = child.kill();
                let _ = child.wait();
                Err(format!(
                    "{} {args:?} did not print `listening on ADDR` within 30 s; see {}",
                    bin.display(),
                    log.display()
                ))
            }
        }
    }

    fn pid(&self) -> u32 {
        self.child.id()
    }
}

impl Drop for Proc {
    fn drop(&mut self) {
        let _ = self.child.kill();
        let _ = self.child.wait();
    }
}

/// Runs an admin command of the CLI and parses its `--json` output.
fn cli(bin: &Path, control: &str, token: &str, args: &[&str]) -> Result<Value> {
    let out = Command::new(bin)
        .args(args)
        .arg("--json")
        .env("SWITCHYARD_CONTROL", control)
        .env("SWITCHYARD_ADMIN_TOKEN", token)
        .stdin(Stdio::null())
        .output()
        .map_err(|e| format!("cannot run switchyard {args:?}: {e}"))?;
    if !out.status.success() {
        return Err(format!(
            "switchyard {args:?} failed: {}",
            String::from_utf8_lossy(&out.stderr).trim()
        ));
    }
    serde_json::from_slice(&out.stdout)
        .map_err(|e| format!("switchyard {args:?} printed no JSON ({e})"))
}

// === /proc ===

/// utime + stime of a process, in clock ticks (fields 14 and 15 of /proc/PID/stat).
fn cpu_ticks(pid: u32) -> Result<u64> {
    let stat = std::fs::read_to_string(format!("/proc/{pid}/stat"))
        .map_err(|e| format!("cannot read /proc/{pid}/stat: {e}"))?;
    // The command name (field 2) is in parentheses and may itself contain spaces or ')';
    // the fields after the last ')' start at field 3.
    let rest = stat.rsplit_once(')').map(|(_, r)| r).ok_or("malformed /proc/PID/stat")?;
    let fields: Vec<&str> = rest.split_whitespace().collect();
    let field = |n: usize| -> Result<u64> {
        fields
            .get(n - 3)
            .and_then(|f| f.parse().ok())
            .ok_or_else(|| format!("/proc/{pid}/stat: no field {n}"))
    };
    Ok(field(14)? + field(15)?)
}

/// The machine's steal time (CPU time the hypervisor gave to other guests), in clock
/// ticks summed over all CPUs, and the number of CPUs (`/proc/stat`). On a shared VM a
/// neighbour's burst shows up here, and in every latency measured meanwhile.
fn steal_ticks() -> Result<(u64, usize)> {
    let stat = std::fs::read_to_string("/proc/stat")
        .map_err(|e| format!("cannot read /proc/stat: {e}"))?;
    let total = stat
        .lines()
        .find_map(|l| l.strip_prefix("cpu "))
        .and_then(|l| l.split_whitespace().nth(7))
        .and_then(|v| v.parse().ok())
        .ok_or("/proc/stat: no steal field on the cpu line")?;
    let cpus = stat
        .lines()
        .filter(|l| {
            l.strip_prefix("cpu").is_some_and(|r| r.starts_with(|c: char| c.is_ascii_digit()))
        })
        .count();
    Ok((total, cpus.max(1)))
}

/// Peak resident set size (VmHWM) in KiB.
fn peak_rss_kib(pid: u32) -> Result<u64> {
    let status = std::fs::read_to_string(format!("/proc/{pid}/status"))
        .map_err(|e| format!("cannot read /proc/{pid}/status: {e}"))?;
    status
        .lines()
        .find_map(|l| l.strip_prefix("VmHWM:"))
        .and_then(|v| v.trim().trim_end_matches("kB").trim().parse().ok())
        .ok_or_else(|| format!("/proc/{pid}/status has no VmHWM"))
}

/// Context switches (voluntary + involuntary) over every thread of a process: at low
/// concurrency, wake-ups rather than parsing dominate a proxy's CPU time, and this shows it.
fn ctx_switches(pid: u32) -> Result<u64> {
    let tasks = std::fs::read_dir(format!("/proc/{pid}/task"))
        .map_err(|e| format!("cannot list /proc/{pid}/task: {e}"))?;
    let mut total = 0;
    for task in tasks.flatten() {
        // A thread may exit between the listing and the read; it is then simply not counted.
        let Ok(status) = std::fs::read_to_string(task.path().join("status")) else { continue };
        total += status
            .lines()
            .filter_map(|l| {
                l.strip_prefix("voluntary_ctxt_switches:")
                    .or_else(|| l.strip_prefix("nonvoluntary_ctxt_switches:"))
            })
            .filter_map(|v| v.trim().parse::<u64>().ok())
            .sum::<u64>();
    }
    Ok(total)
}

/// Clock ticks per second for /proc times. Without libc there is no sysconf; `getconf`
/// answers it, and Linux has reported 100 (USER_HZ) to user space on every common
/// architecture for decades, so that is the fallback.
fn clock_ticks() -> u64 {
    Command::new("getconf")
        .arg("CLK_TCK")
        .output()
        .ok()
        .and_then(|o| String::from_utf8(o.stdout).ok())
        .and_then(|s| s.trim().parse().ok())
        .filter(|t| *t > 0)
        .unwrap_or(100)
}

// === HTTP client ===

async fn connect(addr: SocketAddr) -> Result<SendRequest<Full<Bytes>>> {
    let stream = TcpStream::connect(addr).await.map_err(|e| format!("connect {addr}: {e}"))?;
    stream.set_nodelay(true).map_err(|e| format!("nodelay: {e}"))?;
    let (sender, conn) = hyper::client::conn::http1::handshake(TokioIo::new(stream))
        .await
        .map_err(|e| format!("handshake {addr}: {e}"))?;
    // The connection task ends when its sender is dropped.
    tokio::spawn(async move {
        let _ = conn.await;
    });
    Ok(sender)
}

/// One request on a fresh connection (setup and stats only, never in a measured loop).
async fn http(
    addr: SocketAddr,
    method: &str,
    path: &str,
    auth: Option<&str>,
    body: Option<String>,
) -> Result<(u16, Value)> {
    let mut sender = connect(addr).await?;
    let mut req = Request::builder()
        .method(method)
        .uri(path)
        .header(header::HOST, addr.to_string())
        .header(header::CONTENT_TYPE, "application/json");
    if let Some(key) = auth {
        req = req.header(header::AUTHORIZATION, format!("Bearer {key}"));
    }
    let req = req
        .body(Full::new(Bytes::from(body.unwrap_or_default())))
        .map_err(|e| format!("request: {e}"))?;
    let resp = sender.send_request(req).await.map_err(|e| format!("{method} {path}: {e}"))?;
    let status = resp.status().as_u16();
    let bytes =
        resp.into_body().collect().await.map_err(|e| format!("{method} {path}: {e}"))?.to_bytes();
    Ok((status, serde_json::from_slice(&bytes).unwrap_or(Value::Null)))
}

/// The node's Prometheus text (not JSON, so not through [`http`]).
async fn metrics_text(addr: SocketAddr) -> Result<String> {
    let mut sender = connect(addr).await?;
    let req = Request::get("/metrics")
        .header(header::HOST, addr.to_string())
        .body(Full::new(Bytes::new()))
        .map_err(|e| format!("request: {e}"))?;
    let resp = sender.send_request(req).await.map_err(|e| format!("GET /metrics: {e}"))?;
    let body = resp.into_body().collect().await.map_err(|e| format!("GET /metrics: {e}"))?;
    Ok(String::from_utf8_lossy(&body.to_bytes()).into_owned())
}

// === Targets and load ===

#[derive(Clone, Copy, PartialEq, Eq, Debug)]
enum Kind {
    Direct,
    Passthrough,
    NodeHealthy,
    NodeFailing,
}

impl Kind {
    const ALL: [Kind; 4] = [Kind::Direct, Kind::Passthrough, Kind::NodeHealthy, Kind::NodeFailing];

    fn label(self) -> &'static str {
        match self {
            Kind::Direct => "sim direct",
            Kind::Passthrough => "hyper pass-through",
            Kind::NodeHealthy => "node, primary healthy",
            Kind::NodeFailing => "node, primary failing",
        }
    }
}

/// What one target is sent: every request of a run is the same bytes.
struct Target {
    kind: Kind,
    addr: SocketAddr,
    host: String,
    auth: Option<String>,
    body: Bytes,
    /// The process whose CPU and RSS are the proxy's (none for the simulator itself).
    proxy_pid: Option<u32>,
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
async fn phase(
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

/// What one target measured in one run at one concurrency.
#[derive(Clone, Debug)]
struct Sample {
    kind: Kind,
    conns: usize,
    requests: u64,
    rps: f64,
    p50_us: f64,
    p99_us: f64,
    /// Either side of p99, for the progress line only: on an oversubscribed host the tail
    /// is a cliff (a thread waiting out another's time slice), and whether p99 lands
    /// before or on it is what moves it by milliseconds between runs.
    p98_us: f64,
    p999_us: f64,
    /// Proxy CPU (utime+stime) per measured request, µs.
    proxy_cpu_us: Option<f64>,
    /// The simulator's CPU per measured request, µs (the same work behind every target).
    sim_cpu_us: f64,
    /// The control plane's CPU per measured request, µs: what the node's telemetry
    /// (failover events, usage) costs on the other side of its stream.
    control_cpu_us: f64,
    /// The proxy's context switches per measured request.
    proxy_ctx_per_req: Option<f64>,
    /// The proxy's VmHWM after this window, MiB.
    proxy_rss_mib: Option<f64>,
    /// Upstream requests to the failing primary per measured request.
    primary_per_req: Option<f64>,
    /// The machine's steal time during the window, % of all CPUs' time.
    steal_pct: f64,
    non_200: u64,
}

/// Nearest-rank percentile of sorted samples.
fn percentile(sorted: &[u64], q: f64) -> f64 {
    if sorted.is_empty() {
        return f64::NAN;
    }
    let rank = ((q * sorted.len() as f64).ceil() as usize).clamp(1, sorted.len());
    sorted[rank - 1] as f64
}

struct Bench {
    sim: SocketAddr,
    sim_pid: u32,
    control_pid: u32,
    ticks_per_sec: f64,
}

impl Bench {
    async fn failing_upstream_requests(&self) -> Result<u64> {
        let (_, stats) = http(self.sim, "GET", "/_sim/stats", None, None).await?;
        Ok(stats["models"]["failing"]["requests"].as_u64().unwrap_or(0))
    }

    async fn measure(
        &self,
        target: &Arc<Target>,
        conns: usize,
        warmup: Duration,
        duration: Duration,
    ) -> Result<Sample> {
        let mut senders = Vec::with_capacity(conns);
        for _ in 0..conns {
            senders.push(connect(target.addr).await?);
        }
        // Warm-up: connections, pools and caches settle; for the failing primary, its
        // breaker opens here. Nothing of it is counted.
        let (senders, _, _) = phase(senders, target, Instant::now() + warmup, false).await?;

        let cpu = |pid: Option<u32>| pid.map(cpu_ticks).transpose();
        let proxy_before = cpu(target.proxy_pid)?;
        let sim_before = cpu_ticks(self.sim_pid)?;
        let control_before = cpu_ticks(self.control_pid)?;
        let ctx_before = target.proxy_pid.map(ctx_switches).transpose()?;
        let (steal_before, cpus) = steal_ticks()?;
        let primary_before = if target.kind == Kind::NodeFailing {
            Some(self.failing_upstream_requests().await?)
        } else {
            None
        };
        let start = Instant::now();
        let (senders, mut latencies, non_200) =
            phase(senders, target, start + duration, true).await?;
        let wall = start.elapsed();
        let proxy_after = cpu(target.proxy_pid)?;
        let sim_after = cpu_ticks(self.sim_pid)?;
        let control_after = cpu_ticks(self.control_pid)?;
        let ctx_after = target.proxy_pid.map(ctx_switches).transpose()?;
        let (steal_after, _) = steal_ticks()?;
        let primary_after = match primary_before {
            Some(_) => Some(self.failing_upstream_requests().await?),
            None => None,
        };
        drop(senders);

        latencies.sort_unstable();
        let n = latencies.len() as u64;
        if n == 0 {
            return Err(format!("{}: no request completed", target.kind.label()));
        }
        let per_req_us = |ticks: u64| ticks as f64 / self.ticks_per_sec * 1e6 / n as f64;
        Ok(Sample {
            kind: target.kind,
            conns,
            requests: n,
            rps: n as f64 / wall.as_secs_f64(),
            p50_us: percentile(&latencies, 0.50) / 1e3,
            p99_us: percentile(&latencies, 0.99) / 1e3,
            p98_us: percentile(&latencies, 0.98) / 1e3,
            p999_us: percentile(&latencies, 0.999) / 1e3,
            proxy_cpu_us: proxy_before
                .zip(proxy_after)
                .map(|(b, a)| per_req_us(a.saturating_sub(b))),
            sim_cpu_us: per_req_us(sim_after.saturating_sub(sim_before)),
            control_cpu_us: per_req_us(control_after.saturating_sub(control_before)),
            proxy_ctx_per_req: ctx_before
                .zip(ctx_after)
                .map(|(b, a)| a.saturating_sub(b) as f64 / n as f64),
            proxy_rss_mib: target
                .proxy_pid
                .map(peak_rss_kib)
                .transpose()?
                .map(|kib| kib as f64 / 1024.0),
            primary_per_req: primary_before
                .zip(primary_after)
                .map(|(b, a)| a.saturating_sub(b) as f64 / n as f64),
            steal_pct: steal_after.saturating_sub(steal_before) as f64
                / (wall.as_secs_f64() * self.ticks_per_sec * cpus as f64)
                * 100.0,
            non_200,
        })
    }
}

// === The run ===

fn bench_main(args: &[String]) -> Result<()> {
    let options = parse_options(args)?;
    // One thread for the load generator: on a small machine it should take at most one
    // core away from the processes it measures, and the same core for every target.
    let rt = tokio::runtime::Builder::new_current_thread()
        .enable_all()
        .build()
        .map_err(|e| format!("runtime: {e}"))?;
    rt.block_on(bench(options))
}

async fn bench(options: Options) -> Result<()> {
    let dir = tempfile::Builder::new()
        .prefix("switchyard-bench-")
        .tempdir()
        .map_err(|e| format!("temp dir: {e}"))?;
    let bin = options.switchyard.as_path();
    let d = dir.path();
    let logs = |name: &str| d.join(format!("{name}.log"));

    let fleet = Fleet::start(bin, d, catalog_yaml).await?;
    // The failing primary answers 503 to every request the node sends it (it sends none
    // before it is ready).
    fleet.script("failing", json!({"kind": "status", "status": 503})).await?;
    let (sim, cp, node, key) = (&fleet.sim, &fleet.cp, &fleet.node, fleet.key.as_str());

    let me = std::env::current_exe().map_err(|e| format!("own path: {e}"))?;
    let sim_addr = sim.addr.to_string();
    let pass = Proc::start(
        &me,
        &["passthrough", "--listen", "127.0.0.1:0", "--upstream", &sim_addr],
        &[],
        &logs("passthrough"),
    )?;

    let messages = json!([{"role": "user", "content": "Say hello."}]);
    let direct_body = json!({"model": "primary", "messages": messages}).to_string();
    let node_body = |model: &str| {
        json!({"model": model, "fallback_models": [SECONDARY], "messages": messages}).to_string()
    };
    let auth = Some(format!("Bearer {key}"));
    let targets: Vec<Arc<Target>> = Kind::ALL
        .iter()
        .map(|&kind| {
            let (addr, auth, body, proxy_pid) = match kind {
                Kind::Direct => (sim.addr, None, direct_body.clone(), None),
                Kind::Passthrough => (pass.addr, None, direct_body.clone(), Some(pass.pid())),
                Kind::NodeHealthy => {
                    (node.addr, auth.clone(), node_body(PRIMARY), Some(node.pid()))
                }
                Kind::NodeFailing => {
                    (node.addr, auth.clone(), node_body(FAILING), Some(node.pid()))
                }
            };
            Arc::new(Target {
                kind,
                addr,
                host: addr.to_string(),
                auth,
                body: Bytes::from(body),
                proxy_pid,
            })
        })
        .collect();

    // Each target must answer 200 before it is measured, and the node's answers must come
    // from the model the case means: otherwise the figures measure an error path.
    for t in &targets {
        let auth = t.auth.as_deref().and_then(|a| a.strip_prefix("Bearer "));
        let body = String::from_utf8_lossy(&t.body).into_owned();
        let (status, v) = http(t.addr, "POST", "/v1/chat/completions", auth, Some(body)).await?;
        let want = match t.kind {
            Kind::Direct | Kind::Passthrough => "primary",
            Kind::NodeHealthy => PRIMARY,
            Kind::NodeFailing => SECONDARY,
        };
        if status != 200 || v["model"] != want {
            return Err(format!(
                "{}: check request got {status}, model {} (expected 200 from {want}): {v}",
                t.kind.label(),
                v["model"]
            ));
        }
    }

    let ticks = clock_ticks();
    let bench = Bench {
        sim: sim.addr,
        sim_pid: sim.pid(),
        control_pid: cp.pid(),
        ticks_per_sec: ticks as f64,
    };
    eprintln!(
        "switchyard-bench: {} run(s) × concurrency {:?} × {} targets, {:.1} s warm-up + {:.1} s measured each; CLK_TCK {ticks}; logs in {}",
        options.runs,
        options.concurrency,
        targets.len(),
        options.warmup.as_secs_f64(),
        options.duration.as_secs_f64(),
        d.display()
    );

    let mut runs: Vec<Vec<Sample>> = Vec::with_capacity(options.runs);
    for run in 1..=options.runs {
        let mut samples = Vec::new();
        // Targets interleave within a run, so slow drifts of a shared machine spread over
        // all of them instead of landing on one.
        for &conns in &options.concurrency {
            // The targets of one concurrency are compared with each other, so a neighbour's
            // burst of steal time during any of them measures them all again; after
            // MAX_ATTEMPTS the least disturbed attempt is kept (its steal is in the table).
            let mut kept: Option<(f64, Vec<Sample>)> = None;
            for attempt in 1..=MAX_ATTEMPTS {
                let mut group = Vec::with_capacity(targets.len());
                for t in &targets {
                    let s = bench.measure(t, conns, options.warmup, options.duration).await?;
                    eprintln!(
                        "  run {run} c={conns} {:<22} {:>8.0} req/s  p50 {:>7.1} µs  p98 {:>7.1}  p99 {:>7.1}  p99.9 {:>7.1} µs  steal {:>4.1} %",
                        t.kind.label(),
                        s.rps,
                        s.p50_us,
                        s.p98_us,
                        s.p99_us,
                        s.p999_us,
                        s.steal_pct
                    );
                    group.push(s);
                }
                let steal = group.iter().map(|s| s.steal_pct).fold(0.0, f64::max);
                if kept.as_ref().is_none_or(|(k, _)| steal < *k) {
                    kept = Some((steal, group));
                }
                if steal <= options.max_steal_pct {
                    break;
                }
                eprintln!(
                    "  run {run} c={conns}: steal {steal:.1} % > {} % (attempt {attempt} of {MAX_ATTEMPTS})",
                    options.max_steal_pct
                );
            }
            samples.extend(kept.map(|(_, group)| group).unwrap_or_default());
        }
        println!("### Run {run}\n");
        print_table(&[samples.clone()]);
        runs.push(samples);
    }
    if runs.len() > 1 {
        println!("### Median of {} runs\n", runs.len());
        print_table(&runs);
    }
    // Failover events the node could not hand to the control plane fast enough are dropped
    // and counted; a benchmark that fails over on every request must say whether it did.
    let dropped = metrics_text(node.addr).await.ok().and_then(|text| events_dropped(&text));
    print_goals(&runs, &options.concurrency, dropped);
    drop((pass, node, cp, sim));
    Ok(())
}

fn catalog_yaml(sim: SocketAddr) -> String {
    format!(
        r#"providers:
  - name: sim
    kind: openai-compatible
    base_url: http://{sim}/v1
    region: us
models:
  - name: {PRIMARY}
    provider: sim
    upstream_model: primary
  - name: {FAILING}
    provider: sim
    upstream_model: failing
  - name: {SECONDARY}
    provider: sim
    upstream_model: secondary
{BREAKER_POLICY}"#
    )
}

// === Report ===

fn median(mut v: Vec<f64>) -> Option<f64> {
    v.retain(|x| x.is_finite());
    if v.is_empty() {
        return None;
    }
    v.sort_by(f64::total_cmp);
    let m = v.len() / 2;
    Some(if v.len() % 2 == 1 { v[m] } else { (v[m - 1] + v[m]) / 2.0 })
}

/// Per-run figures derived against the same run's direct and pass-through rows.
struct Derived {
    added_p50_us: Option<f64>,
    added_p99_us: Option<f64>,
    /// What the node adds beyond the bare proxy hop: the latency goals are judged on these,
    /// because on a saturated 2-core host the hop alone can exceed an absolute tail goal.
    over_pass_p50_us: Option<f64>,
    over_pass_p99_us: Option<f64>,
    cpu_vs_pass: Option<f64>,
}

fn derive(run: &[Sample], s: &Sample) -> Derived {
    let find = |k: Kind| run.iter().find(|x| x.kind == k && x.conns == s.conns);
    let direct = find(Kind::Direct);
    let pass = find(Kind::Passthrough);
    let proxied = s.kind != Kind::Direct;
    let node = matches!(s.kind, Kind::NodeHealthy | Kind::NodeFailing);
    Derived {
        added_p50_us: direct.filter(|_| proxied).map(|d| s.p50_us - d.p50_us),
        added_p99_us: direct.filter(|_| proxied).map(|d| s.p99_us - d.p99_us),
        over_pass_p50_us: pass.filter(|_| node).map(|p| s.p50_us - p.p50_us),
        over_pass_p99_us: pass.filter(|_| node).map(|p| s.p99_us - p.p99_us),
        cpu_vs_pass: pass.and_then(|p| p.proxy_cpu_us).zip(s.proxy_cpu_us).map(|(p, me)| me / p),
    }
}

/// The median over runs of one figure of one (kind, concurrency) row.
fn med_of(
    runs: &[Vec<Sample>],
    kind: Kind,
    conns: usize,
    f: impl Fn(&[Sample], &Sample) -> Option<f64>,
) -> Option<f64> {
    median(
        runs.iter()
            .filter_map(|run| {
                run.iter().find(|s| s.kind == kind && s.conns == conns).and_then(|s| f(run, s))
            })
            .collect(),
    )
}

fn fmt(v: Option<f64>, decimals: usize) -> String {
    v.map_or_else(|| "–".to_owned(), |v| format!("{v:.decimals$}"))
}

fn print_table(runs: &[Vec<Sample>]) {
    println!(
        "| target | conns | req/s | p50 ms | p99 ms | added p50 ms | added p99 ms | proxy CPU µs/req | CPU × pass-through | proxy ctx switches/req | sim CPU µs/req | control CPU µs/req | proxy peak RSS MiB | primary attempts/req | host steal % | non-200 |"
    );
    println!("|---|---:|---:|---:|---:|---:|---:|---:|---:|---:|---:|---:|---:|---:|---:|---:|");
    let Some(first) = runs.first() else { return };
    for s in first {
        let (k, c) = (s.kind, s.conns);
        let m = |f: fn(&[Sample], &Sample) -> Option<f64>| med_of(runs, k, c, f);
        println!(
            "| {} | {c} | {} | {} | {} | {} | {} | {} | {} | {} | {} | {} | {} | {} | {} | {} |",
            k.label(),
            fmt(m(|_, s| Some(s.rps)), 0),
            fmt(m(|_, s| Some(s.p50_us / 1e3)), 3),
            fmt(m(|_, s| Some(s.p99_us / 1e3)), 3),
            fmt(m(|r, s| derive(r, s).added_p50_us.map(|v| v / 1e3)), 3),
            fmt(m(|r, s| derive(r, s).added_p99_us.map(|v| v / 1e3)), 3),
            fmt(m(|_, s| s.proxy_cpu_us), 1),
            fmt(m(|r, s| derive(r, s).cpu_vs_pass), 2),
            fmt(m(|_, s| s.proxy_ctx_per_req), 1),
            fmt(m(|_, s| Some(s.sim_cpu_us)), 1),
            fmt(m(|_, s| Some(s.control_cpu_us)), 1),
            fmt(m(|_, s| s.proxy_rss_mib), 1),
            fmt(m(|_, s| s.primary_per_req), 4),
            fmt(m(|_, s| Some(s.steal_pct)), 1),
            // Non-200 answers summed over runs: any at all is worth a look.
            runs.iter()
                .flatten()
                .filter(|x| x.kind == k && x.conns == c)
                .map(|x| x.non_200)
                .sum::<u64>(),
        );
    }
    let total: u64 = runs.iter().flatten().map(|s| s.requests).sum();
    println!("\n({total} measured requests in this table)\n");
}

/// The node's `switchyard_failover_events_dropped_total`, from its `/metrics` text.
fn events_dropped(metrics: &str) -> Option<u64> {
    metrics.lines().find_map(|line| {
        let value = line.strip_prefix("switchyard_failover_events_dropped_total ")?;
        value.trim().parse::<f64>().ok().map(|v| v as u64)
    })
}

fn print_goals(runs: &[Vec<Sample>], concurrency: &[usize], dropped: Option<u64>) {
    let verdict = |ok: bool| if ok { "met" } else { "NOT met" };
    println!("### Goals (medians over runs)\n");
    println!("| goal | conns | node, primary healthy | node, primary failing | verdict |");
    println!("|---|---:|---:|---:|---|");
    for &c in concurrency {
        let both = |f: fn(&[Sample], &Sample) -> Option<f64>| {
            (med_of(runs, Kind::NodeHealthy, c, f), med_of(runs, Kind::NodeFailing, c, f))
        };
        let row = |goal: &str, (h, f): (Option<f64>, Option<f64>), limit: f64, d: usize| {
            let ok = h.zip(f).is_some_and(|(h, f)| h <= limit && f <= limit);
            println!("| {goal} | {c} | {} | {} | {} |", fmt(h, d), fmt(f, d), verdict(ok));
        };
        row("CPU/req ≤ 2× pass-through", both(|r, s| derive(r, s).cpu_vs_pass), 2.0, 2);
        if c == 1 {
            row(
                "p50 over pass-through ≤ 0.1 ms",
                both(|r, s| derive(r, s).over_pass_p50_us.map(|v| v / 1e3)),
                0.1,
                3,
            );
        }
        row(
            "p99 over pass-through ≤ 1 ms",
            both(|r, s| derive(r, s).over_pass_p99_us.map(|v| v / 1e3)),
            1.0,
            3,
        );
        let f = med_of(runs, Kind::NodeFailing, c, |_, s| s.primary_per_req);
        println!(
            "| primary attempts/req < 0.05 | {c} | – | {} | {} |",
            fmt(f, 4),
            verdict(f.is_some_and(|f| f < 0.05))
        );
    }
    // Over the node's whole life, i.e. every target and run of this invocation.
    let shown = dropped.map_or_else(|| "unknown".to_owned(), |d| d.to_string());
    println!(
        "| failover events dropped by the node = 0 | all | – | {shown} | {} |",
        verdict(dropped == Some(0))
    );
    println!();
}

// === The pass-through ===

fn passthrough_main(args: &[String]) -> Result<()> {
    let mut listen = None;
    let mut upstream = None;
    let mut it = args.iter();
    while let Some(flag) = it.next() {
        let value = it.next().ok_or_else(|| format!("{flag} needs a value"))?;
        let addr = value.parse::<SocketAddr>().map_err(|e| format!("{flag} {value}: {e}"))?;
        match flag.as_str() {
            "--listen" => listen = Some(addr),
            "--upstream" => upstream = Some(addr),
            other => return Err(format!("passthrough: unknown argument {other:?}")),
        }
    }
    let (Some(listen), Some(upstream)) = (listen, upstream) else {
        return Err(format!("passthrough needs --listen and --upstream\n{USAGE}"));
    };
    if !listen.ip().is_loopback() || !upstream.ip().is_loopback() {
        return Err("passthrough: loopback addresses only".into());
    }
    // Stop when the bench is gone (its end of our stdin closes), whatever killed it.
    std::thread::spawn(|| {
        let mut sink = [0u8; 64];
        while matches!(std::io::stdin().read(&mut sink), Ok(n) if n > 0) {}
        std::process::exit(0);
    });
    // The same runtime shape as the node's `#[tokio::main]`: one worker per core.
    let rt = tokio::runtime::Builder::new_multi_thread()
        .enable_all()
        .build()
        .map_err(|e| format!("runtime: {e}"))?;
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

#[cfg(test)]
mod tests {
    use super::events_dropped;

    #[test]
    fn events_dropped_reads_the_counter_and_nothing_else() {
        let text = "# HELP switchyard_failover_events_dropped Failover events dropped\n\
                    # TYPE switchyard_failover_events_dropped counter\n\
                    switchyard_failover_events_dropped_total 97880\n\
                    switchyard_failover_events_total{model=\"a\"} 3\n";
        assert_eq!(events_dropped(text), Some(97_880));
        assert_eq!(events_dropped("switchyard_failover_events_total 3\n"), None);
    }
}
