//! `switchyard-bench fleet-breaker`: what a deployment that dies costs a fleet, with the
//! fleet's breaker view (`breaker_policy.fleet: true`: a breaker opening on one node is
//! relayed to every node, and one node probes for the fleet; docs/operating.md, "The
//! fleet's breaker view") and with each node alone (`fleet: false`).
//!
//! Per mode, one simulator, one control plane (embedded store) and `--nodes` nodes, the
//! catalog below. Each round kills a model of its own (`sim/dying-R`, so that every round
//! starts from closed breakers with full windows): `--clients` connections per node send
//! it requests at `--rps` per node in all (the first node at `--hot-rps`, when given: one busy
//! node among quiet ones), with `sim/secondary` as the fallback that serves; the simulator is scripted to answer it 503, and the round measures
//!
//! - the failed user calls it received before the whole fleet stopped sending: the
//!   simulator's request counter for the model, less the probes the nodes counted
//!   (`switchyard_probes_total`), less the user calls a node still made after it had
//!   stopped (seen in the answers);
//! - the time from the failure until every node skipped it: a node skips it from its
//!   first answer that reports the model `skipped`, or the first scrape of its /metrics
//!   with the breaker not closed (`switchyard_breaker_state` ≥ 1), whichever comes first;
//! - the probes sent to it while it is down, over `--observe-secs` from that moment,
//!   per minute.
//!
//! A `switchyard` that refuses the `fleet` field (a build from before the fleet view) runs
//! the `fleet: false` mode without it (each node alone is all it does) and reports the
//! other as pending.

use std::net::SocketAddr;
use std::path::PathBuf;
use std::sync::Arc;
use std::sync::atomic::{AtomicBool, Ordering};
use std::time::{Duration, Instant};

use bytes::Bytes;
use http_body_util::{BodyExt, Full};
use hyper::client::conn::http1::SendRequest;
use hyper::{Request, header};
use parking_lot::Mutex;
use serde_json::{Value, json};
use tokio::sync::{Barrier, RwLock};
use tokio::task::JoinSet;

use crate::client::{connect, http, metrics_text};
use crate::error::Result;
use crate::flags::{self, bounded};
use crate::fleet::Fleet;
use crate::host;
use crate::proc::Proc;
use crate::stats::{fmt, median, pct, sum_labelled};

/// The breaker policy every mode shares (the catalog's defaults, written out so that the
/// figures say what they were measured with): a node's breaker opens on its 10th failed
/// call after a window of successes.
const WINDOW_SIZE: usize = 20;
const MIN_REQUESTS: usize = 10;
const FAILURE_RATE_THRESHOLD: f64 = 0.5;

/// The model that serves while a round's model is down.
const SECONDARY: &str = "sim/secondary";

/// Paced load before the failure, so every client is in its steady rhythm when it comes.
const LEAD_IN: Duration = Duration::from_secs(1);
/// How often the nodes' breakers are looked at until every node skips the dead model.
const POLL: Duration = Duration::from_millis(50);
/// How long the fleet may keep calling the dead model before the round fails.
const STOP_LIMIT: Duration = Duration::from_secs(60);

struct Options {
    switchyard: PathBuf,
    nodes: usize,
    clients: usize,
    rps: usize,
    /// The first node's rate (`--rps` unless given).
    hot_rps: Option<usize>,
    rounds: usize,
    observe: Duration,
    /// `fleet:` values to measure, in this order.
    modes: Vec<bool>,
    json: bool,
}

/// `switchyard-bench fleet-breaker`'s flags.
#[derive(clap::Args)]
#[command(args_override_self = true)]
pub struct Args {
    #[command(flatten)]
    switchyard: flags::Switchyard,
    /// Nodes in the fleet (1–100).
    #[arg(long, value_name = "N", default_value = "10", value_parser = bounded::<usize>(1, 100))]
    nodes: usize,
    /// Clients sending to each node (1–64).
    #[arg(long, value_name = "N", default_value = "3", value_parser = bounded::<usize>(1, 64))]
    clients: usize,
    /// Requests per second to each node (1–1000).
    #[arg(long, value_name = "N", default_value = "5", value_parser = bounded::<usize>(1, 1_000))]
    rps: usize,
    /// The first node's rate (1–1000; --rps unless given).
    #[arg(long, value_name = "N", value_parser = bounded::<usize>(1, 1_000))]
    hot_rps: Option<usize>,
    /// Rounds per mode (1–50).
    #[arg(long, value_name = "N", default_value = "3", value_parser = bounded::<usize>(1, 50))]
    rounds: usize,
    /// How long each round watches, in seconds (5–600).
    #[arg(long, value_name = "SECS", default_value = "20", value_parser = bounded::<u64>(5, 600))]
    observe_secs: u64,
    /// The catalog's `fleet:` values to measure, in this order (on and/or off).
    #[arg(long, value_name = "off,on", value_delimiter = ',', default_value = "off,on",
        value_parser = fleet_mode)]
    fleet: Vec<bool>,
    /// The figures, every round's too, as JSON.
    #[arg(long)]
    json: bool,
}

fn options(a: Args) -> Result<Options> {
    let mut modes = Vec::new();
    for fleet in a.fleet {
        if !modes.contains(&fleet) {
            modes.push(fleet);
        }
    }
    Ok(Options {
        switchyard: a.switchyard.existing()?,
        nodes: a.nodes,
        clients: a.clients,
        rps: a.rps,
        hot_rps: a.hot_rps,
        rounds: a.rounds,
        observe: Duration::from_secs(a.observe_secs),
        modes,
        json: a.json,
    })
}

/// One `--fleet` value: `on` (`fleet: true`) or `off` (`fleet: false`).
fn fleet_mode(value: &str) -> std::result::Result<bool, String> {
    match value.trim() {
        "on" | "true" => Ok(true),
        "off" | "false" => Ok(false),
        other => Err(format!("expected on and/or off, got {other:?}")),
    }
}

/// The catalog of one mode: the secondary and one model per round, and the breaker policy
/// with `fleet` when `Some` (left out for a build that does not know the field).
fn catalog(sim: SocketAddr, rounds: usize, fleet: Option<bool>) -> String {
    let mut yaml = format!(
        "providers:
  - name: sim
    kind: openai-compatible
    base_url: http://{sim}/v1
    region: us
models:
  - name: {SECONDARY}
    provider: sim
    upstream_model: secondary
"
    );
    for r in 0..rounds {
        yaml.push_str(&format!(
            "  - name: sim/{m}\n    provider: sim\n    upstream_model: {m}\n",
            m = dying(r)
        ));
    }
    yaml.push_str(&format!(
        "breaker_policy:
  window_size: {WINDOW_SIZE}
  min_requests: {MIN_REQUESTS}
  failure_rate_threshold: {FAILURE_RATE_THRESHOLD}
"
    ));
    if let Some(fleet) = fleet {
        yaml.push_str(&format!("  fleet: {fleet}\n"));
    }
    yaml
}

/// Round `r`'s upstream model (its gateway name is `sim/` and this).
fn dying(r: usize) -> String {
    format!("dying-{r}")
}

pub fn main(args: Args) -> Result<()> {
    let o = options(args)?;
    let rt = host::runtime(host::Threads::Two)?;
    let mut modes = Vec::new();
    // Whether this `switchyard` refused `breaker_policy.fleet`: found out by the first
    // mode, believed by the next.
    let mut refused = false;
    for &fleet in &o.modes {
        let result = if refused && fleet {
            Mode { fleet, field_written: false, rounds: Vec::new(), pending: true }
        } else {
            rt.block_on(run_mode(&o, fleet, refused))?
        };
        refused |= !result.field_written;
        modes.push(result);
    }
    if o.json {
        println!("{}", report_json(&o, &modes));
    } else {
        print_table(&o, &modes);
    }
    Ok(())
}

/// One mode's rounds.
struct Mode {
    fleet: bool,
    /// Whether the catalog carried `fleet:` (false: the build refused it).
    field_written: bool,
    rounds: Vec<Round>,
    /// `fleet: true` on a build without the field: not measured.
    pending: bool,
}

/// What one round measured.
#[derive(Debug)]
struct Round {
    /// User calls the simulator received for the dead model before the fleet stopped
    /// (its counter, less probes, less the calls made after a node had stopped).
    failed_calls: i64,
    /// The same, counted from the answers (a cross-check: the two should agree).
    answers_failed_calls: u64,
    /// User calls a node made after it had begun skipping the model.
    calls_after_stop: u64,
    /// The failure → the last node seen skipping it.
    all_skip_ms: f64,
    /// The first node seen skipping it → the last: how long the fleet took to follow it.
    first_to_all_ms: f64,
    /// Each node's time to skip it.
    node_skip_ms: Vec<f64>,
    /// Probes counted by the nodes over the observation window, and that window.
    probes: u64,
    window_secs: f64,
    /// Requests answered with anything but 200 (the fallback serves: expected none).
    non_200: u64,
}

impl Round {
    fn probes_per_min(&self) -> f64 {
        self.probes as f64 / self.window_secs * 60.0
    }
}

async fn run_mode(o: &Options, fleet: bool, refused: bool) -> Result<Mode> {
    let dir = tempfile::Builder::new()
        .prefix("switchyard-bench-fleet-breaker-")
        .tempdir()
        .map_err(|e| format!("temp dir: {e}"))?;
    let mut d = dir.path().to_path_buf();
    let bin = o.switchyard.as_path();
    let rounds = o.rounds;
    let mut field = (!refused).then_some(fleet);
    let fleet_procs = match Fleet::start(bin, &d, |sim| catalog(sim, rounds, field)).await {
        Err(e) if field.is_some() && refuses_fleet_field(&e) => {
            eprintln!(
                "switchyard-bench fleet-breaker: this switchyard refuses breaker_policy.fleet (a build from before the fleet view)"
            );
            if fleet {
                return Ok(Mode { fleet, field_written: false, rounds: Vec::new(), pending: true });
            }
            // Each node alone is all such a build does: measure it without the field.
            field = None;
            d = d.join("without-field");
            std::fs::create_dir(&d).map_err(|e| format!("{}: {e}", d.display()))?;
            Fleet::start(bin, &d, |sim| catalog(sim, rounds, None)).await?
        }
        other => other?,
    };
    let mut extra: Vec<Proc> = Vec::new();
    for i in 1..o.nodes {
        extra.push(fleet_procs.add_node(bin, &d, &format!("node{i}")).await?);
    }
    let nodes: Vec<SocketAddr> =
        std::iter::once(fleet_procs.node.addr).chain(extra.iter().map(|p| p.addr)).collect();
    eprintln!(
        "switchyard-bench fleet-breaker: fleet: {} ({}), {} nodes; logs in {}",
        fleet,
        if field.is_some() { "in the catalog" } else { "not in the catalog" },
        nodes.len(),
        d.display()
    );
    let mut results = Vec::new();
    for r in 0..o.rounds {
        let round = run_round(o, &fleet_procs, &nodes, r).await?;
        eprintln!(
            "  round {}: {} failed calls before every node skipped it ({} by the answers), all skipping after {:.0} ms ({:.0} ms after the first), {} probes in {:.1} s ({:.1}/min), {} calls after the stop, {} non-200",
            r + 1,
            round.failed_calls,
            round.answers_failed_calls,
            round.all_skip_ms,
            round.first_to_all_ms,
            round.probes,
            round.window_secs,
            round.probes_per_min(),
            round.calls_after_stop,
            round.non_200
        );
        results.push(round);
    }
    drop(extra);
    drop(fleet_procs);
    Ok(Mode { fleet, field_written: field.is_some(), rounds: results, pending: false })
}

/// Whether `switchyard apply` failed because the catalog's `fleet` field is unknown to it.
fn refuses_fleet_field(error: &str) -> bool {
    error.contains("unknown field") && error.contains("fleet")
}

/// One answer as the bench saw it.
#[derive(Clone, Copy, Debug)]
struct Record {
    sent: Instant,
    node: usize,
    /// Upstream calls to the round's model that failed (retries included).
    failed_calls: u32,
    /// The node skipped the model (its breaker, or the fleet's, open).
    skipped: bool,
}

/// What an answer's failover report says about `model`: upstream calls to it that failed,
/// and whether it was skipped. The report is under `secureai.failover.attempts` in a
/// served answer and under `secureai.attempts` when every model failed.
fn classify(body: &Value, model: &str) -> (u32, bool) {
    let attempts = body["secureai"]["failover"]["attempts"]
        .as_array()
        .or_else(|| body["secureai"]["attempts"].as_array());
    let Some(attempt) = attempts.and_then(|a| a.iter().find(|a| a["model"] == model)) else {
        return (0, false);
    };
    let retries = u32::try_from(attempt["retries"].as_u64().unwrap_or(0)).unwrap_or(u32::MAX);
    match attempt["status"].as_str() {
        // A local limit refuses the call before it leaves the node.
        Some("failed") if attempt["local_limit"] != true => (retries.saturating_add(1), false),
        Some("skipped") => (0, true),
        _ => (0, false),
    }
}

/// Each node's first sign of skipping the model: the earlier of its first answer reporting
/// it skipped and `seen_open[node]` (a scrape that found its breaker not closed).
fn stop_times(records: &[Record], seen_open: &[Option<Instant>]) -> Vec<Option<Instant>> {
    let mut stops = seen_open.to_vec();
    for r in records.iter().filter(|r| r.skipped) {
        if let Some(stop) = stops.get_mut(r.node) {
            *stop = Some(stop.map_or(r.sent, |s| s.min(r.sent)));
        }
    }
    stops
}

/// Failed calls sent before and after their node's stop.
fn split_calls(records: &[Record], stops: &[Option<Instant>]) -> (u64, u64) {
    let (mut before, mut after) = (0u64, 0u64);
    for r in records {
        let calls = u64::from(r.failed_calls);
        match stops.get(r.node).copied().flatten() {
            Some(stop) if r.sent > stop => after += calls,
            _ => before += calls,
        }
    }
    (before, after)
}

async fn run_round(o: &Options, fleet: &Fleet, nodes: &[SocketAddr], r: usize) -> Result<Round> {
    let upstream = dying(r);
    let model = format!("sim/{upstream}");
    let body = Bytes::from(
        json!({"model": model, "fallback_models": [SECONDARY],
            "messages": [{"role": "user", "content": "hi"}]})
        .to_string(),
    );
    let auth = format!("Bearer {}", fleet.key);
    let records = Arc::new(Mutex::new(Vec::<Record>::new()));
    let stop = Arc::new(AtomicBool::new(false));
    let warmed = Arc::new(Barrier::new(nodes.len() * o.clients + 1));
    let gate = Arc::new(RwLock::new(()));
    // Every node's breaker window full of successes before the failure: its breaker then
    // opens on its MIN_REQUESTS-th failure (ratio WINDOW_SIZE × threshold), as in service.
    let warm_each = (WINDOW_SIZE + 2).div_ceil(o.clients);
    let mut clients = JoinSet::new();
    for (n, &addr) in nodes.iter().enumerate() {
        let rps = if n == 0 { o.hot_rps.unwrap_or(o.rps) } else { o.rps };
        let every = Duration::from_secs_f64(o.clients as f64 / rps as f64);
        for c in 0..o.clients {
            // Spread over the interval, so a node's requests (and the fleet's) are evenly
            // spaced rather than in bursts.
            let slot = (c * nodes.len() + n) as f64 / (o.clients * nodes.len()) as f64;
            let client = Client {
                addr,
                node: n,
                model: model.clone(),
                auth: auth.clone(),
                body: body.clone(),
                records: Arc::clone(&records),
                stop: Arc::clone(&stop),
                warmed: Arc::clone(&warmed),
                gate: Arc::clone(&gate),
            };
            clients.spawn(client.run(warm_each, every, every.mul_f64(slot)));
        }
    }
    warmed.wait().await;
    tokio::time::sleep(LEAD_IN).await;
    // A client that ended already failed its warm-up (or lost its node).
    if let Some(ended) = clients.try_join_next() {
        stop.store(true, Ordering::Relaxed);
        ended.map_err(|e| format!("client: {e}"))??;
        return Err("a client ended before the failure".into());
    }

    let probes_before = probes(nodes, &upstream).await?;
    // No request in flight between reading the counter and the failure (a few ms the
    // clients wait out): every call it counts from here on failed.
    let (calls_before, failed_at) = {
        let _failing = gate.write().await;
        let calls = sim_requests(fleet.sim.addr, &upstream).await?;
        let at = Instant::now();
        fleet.script(&upstream, json!({"kind": "status", "status": 503})).await?;
        (calls, at)
    };

    // Until every node skips the model.
    let mut seen_open: Vec<Option<Instant>> = vec![None; nodes.len()];
    let all_stopped = loop {
        for (n, &addr) in nodes.iter().enumerate() {
            if seen_open[n].is_none() {
                let text = metrics_text(addr).await?;
                let state = sum_labelled(
                    &text,
                    "switchyard_breaker_state",
                    &[("provider", "sim"), ("upstream_model", &upstream)],
                );
                if state >= 1.0 {
                    seen_open[n] = Some(Instant::now());
                }
            }
        }
        let stops = stop_times(&records.lock(), &seen_open);
        if let Some(last) = stops.iter().copied().collect::<Option<Vec<_>>>() {
            break last.into_iter().max().unwrap_or(failed_at);
        }
        if failed_at.elapsed() > STOP_LIMIT {
            let calling: Vec<usize> =
                stops.iter().enumerate().filter(|(_, s)| s.is_none()).map(|(n, _)| n).collect();
            stop.store(true, Ordering::Relaxed);
            return Err(format!(
                "round {}: nodes {calling:?} still called {model} {STOP_LIMIT:?} after it died",
                r + 1
            ));
        }
        tokio::time::sleep(POLL).await;
    };

    // The observation window: probes while the model is down and every node skips it.
    let window_from = Instant::now();
    let probes_from = probes(nodes, &upstream).await?;
    tokio::time::sleep_until((window_from + o.observe).into()).await;
    stop.store(true, Ordering::Relaxed);
    let mut non_200 = 0;
    while let Some(done) = clients.join_next().await {
        non_200 += done.map_err(|e| format!("client: {e}"))??;
    }
    // Read once the load is over: no user call is in flight, only a probe may be.
    let probes_to = probes(nodes, &upstream).await?;
    let calls_to = sim_requests(fleet.sim.addr, &upstream).await?;
    let window_secs = window_from.elapsed().as_secs_f64();
    // Healed: its breakers close at their next probe and stay out of the later rounds.
    fleet.script(&upstream, json!({"kind": "ok"})).await?;

    let records = std::mem::take(&mut *records.lock());
    let stops = stop_times(&records, &seen_open);
    let (answers_failed_calls, calls_after_stop) = split_calls(&records, &stops);
    let user_calls = calls_to.saturating_sub(calls_before) as i64
        - probes_to.saturating_sub(probes_before) as i64;
    let first_stopped = stops.iter().flatten().min().copied().unwrap_or(all_stopped);
    let ms = |t: Option<Instant>| {
        t.map_or(f64::NAN, |t| t.saturating_duration_since(failed_at).as_secs_f64() * 1e3)
    };
    Ok(Round {
        failed_calls: user_calls - calls_after_stop as i64,
        answers_failed_calls,
        calls_after_stop,
        all_skip_ms: ms(Some(all_stopped)),
        first_to_all_ms: all_stopped.saturating_duration_since(first_stopped).as_secs_f64() * 1e3,
        node_skip_ms: stops.into_iter().map(ms).collect(),
        probes: probes_to.saturating_sub(probes_from),
        window_secs,
        non_200,
    })
}

/// One client connection of one node: the warm-up, then paced requests until `stop`.
struct Client {
    addr: SocketAddr,
    node: usize,
    model: String,
    auth: String,
    body: Bytes,
    records: Arc<Mutex<Vec<Record>>>,
    stop: Arc<AtomicBool>,
    warmed: Arc<Barrier>,
    /// Held (shared) by each request, and by the failure alone: see [`run_round`].
    gate: Arc<RwLock<()>>,
}

impl Client {
    /// `warm` requests back to back (each must be served by the model itself), then one
    /// every `every` from `offset` after everyone has warmed up. Returns the non-200 count.
    async fn run(self, warm: usize, every: Duration, offset: Duration) -> Result<u64> {
        let warmed_up = async {
            let mut sender = connect(self.addr).await?;
            for _ in 0..warm {
                let (status, body) = self.send(&mut sender).await?;
                if status != 200 || body["model"] != self.model.as_str() {
                    return Err(format!(
                        "warm-up on {}: {} was not served by itself: {status} {body}",
                        self.addr, self.model
                    ));
                }
            }
            Ok(sender)
        }
        .await;
        // Waited for even after an error, so the other clients are not left waiting.
        self.warmed.wait().await;
        let mut sender = warmed_up?;
        let mut tick = tokio::time::interval_at(tokio::time::Instant::now() + offset, every);
        tick.set_missed_tick_behavior(tokio::time::MissedTickBehavior::Delay);
        let mut non_200 = 0;
        loop {
            tick.tick().await;
            if self.stop.load(Ordering::Relaxed) {
                return Ok(non_200);
            }
            let (sent, status, body) = {
                let _sending = self.gate.read().await;
                let sent = Instant::now();
                let (status, body) = self.send(&mut sender).await?;
                (sent, status, body)
            };
            let (failed_calls, skipped) = classify(&body, &self.model);
            non_200 += u64::from(status != 200);
            self.records.lock().push(Record { sent, node: self.node, failed_calls, skipped });
        }
    }

    async fn send(&self, sender: &mut SendRequest<Full<Bytes>>) -> Result<(u16, Value)> {
        sender.ready().await.map_err(|e| format!("connection to {} lost: {e}", self.addr))?;
        let req = Request::post("/v1/chat/completions")
            .header(header::HOST, self.addr.to_string())
            .header(header::CONTENT_TYPE, "application/json")
            .header(header::AUTHORIZATION, self.auth.as_str())
            .body(Full::new(self.body.clone()))
            .map_err(|e| format!("request: {e}"))?;
        let resp = sender.send_request(req).await.map_err(|e| format!("send: {e}"))?;
        let status = resp.status().as_u16();
        let bytes = resp.into_body().collect().await.map_err(|e| format!("body: {e}"))?.to_bytes();
        Ok((status, serde_json::from_slice(&bytes).unwrap_or(Value::Null)))
    }
}

/// The simulator's request count for `upstream` (probes and user calls alike).
async fn sim_requests(sim: SocketAddr, upstream: &str) -> Result<u64> {
    let (status, stats) = http(sim, "GET", "/_sim/stats", None, None).await?;
    if status != 200 {
        return Err(format!("the simulator's /_sim/stats answered {status}"));
    }
    Ok(stats["models"][upstream]["requests"].as_u64().unwrap_or(0))
}

/// Probes of `upstream` the nodes have counted, every outcome.
async fn probes(nodes: &[SocketAddr], upstream: &str) -> Result<u64> {
    let mut sum = 0.0;
    for &addr in nodes {
        let text = metrics_text(addr).await?;
        sum += sum_labelled(
            &text,
            "switchyard_probes_total",
            &[("provider", "sim"), ("upstream_model", upstream)],
        );
    }
    Ok(sum as u64)
}

fn label(m: &Mode) -> String {
    match (m.fleet, m.field_written) {
        (true, _) => "fleet (`fleet: true`)".to_owned(),
        (false, true) => "each node alone (`fleet: false`)".to_owned(),
        (false, false) => "each node alone (no `fleet` field in this build)".to_owned(),
    }
}

/// One figure's median and p99 across a mode's rounds.
fn spread(rounds: &[Round], figure: impl Fn(&Round) -> f64) -> (Option<f64>, Option<f64>) {
    let v: Vec<f64> = rounds.iter().map(figure).collect();
    (median(&v), pct(&v, 0.99))
}

fn print_table(o: &Options, modes: &[Mode]) {
    let hot = o.hot_rps.map_or_else(String::new, |r| format!(" (the first node {r})"));
    println!(
        "### A deployment that dies: {} nodes, {} clients each, {} req/s per node{hot}, {} rounds per mode, probes over {} s\n",
        o.nodes,
        o.clients,
        o.rps,
        o.rounds,
        o.observe.as_secs()
    );
    println!(
        "| breaker view | failed calls before the fleet stops, median | p99 | every node skipping after ms, median | p99 | first → every node ms, median | probes/min while down, median | p99 | calls after a node stopped | non-200 |"
    );
    println!("|---|---:|---:|---:|---:|---:|---:|---:|---:|---:|");
    for m in modes {
        if m.pending {
            println!(
                "| {} | pending: this `switchyard` has no `breaker_policy.fleet` | | | | | | | | |",
                label(m)
            );
            continue;
        }
        let (calls50, calls99) = spread(&m.rounds, |r| r.failed_calls as f64);
        let (skip50, skip99) = spread(&m.rounds, |r| r.all_skip_ms);
        let (follow50, _) = spread(&m.rounds, |r| r.first_to_all_ms);
        let (probes50, probes99) = spread(&m.rounds, Round::probes_per_min);
        println!(
            "| {} | {} | {} | {} | {} | {} | {} | {} | {} | {} |",
            label(m),
            fmt(calls50, 0),
            fmt(calls99, 0),
            fmt(skip50, 0),
            fmt(skip99, 0),
            fmt(follow50, 0),
            fmt(probes50, 1),
            fmt(probes99, 1),
            m.rounds.iter().map(|r| r.calls_after_stop).sum::<u64>(),
            m.rounds.iter().map(|r| r.non_200).sum::<u64>(),
        );
    }
    println!();
}

fn report_json(o: &Options, modes: &[Mode]) -> Value {
    let modes: Vec<Value> = modes
        .iter()
        .map(|m| {
            let figure = |f: &dyn Fn(&Round) -> f64| {
                let (p50, p99) = spread(&m.rounds, f);
                json!({"median": p50, "p99": p99})
            };
            json!({
                "fleet": m.fleet,
                "field_written": m.field_written,
                "pending": m.pending,
                "failed_calls": figure(&|r| r.failed_calls as f64),
                "all_skip_ms": figure(&|r| r.all_skip_ms),
                "first_to_all_ms": figure(&|r| r.first_to_all_ms),
                "probes_per_min": figure(&Round::probes_per_min),
                "rounds": m.rounds.iter().map(|r| json!({
                    "failed_calls": r.failed_calls,
                    "answers_failed_calls": r.answers_failed_calls,
                    "calls_after_stop": r.calls_after_stop,
                    "all_skip_ms": r.all_skip_ms,
                    "first_to_all_ms": r.first_to_all_ms,
                    "node_skip_ms": r.node_skip_ms,
                    "probes": r.probes,
                    "window_secs": r.window_secs,
                    "probes_per_min": r.probes_per_min(),
                    "non_200": r.non_200,
                })).collect::<Vec<_>>(),
            })
        })
        .collect();
    json!({
        "nodes": o.nodes,
        "clients_per_node": o.clients,
        "rps_per_node": o.rps,
        "first_node_rps": o.hot_rps.unwrap_or(o.rps),
        "rounds": o.rounds,
        "observe_secs": o.observe.as_secs(),
        "breaker_policy": {"window_size": WINDOW_SIZE, "min_requests": MIN_REQUESTS,
            "failure_rate_threshold": FAILURE_RATE_THRESHOLD},
        "modes": modes,
    })
}

#[cfg(test)]
mod tests {
    use super::*;

    fn record(sent: Instant, node: usize, failed_calls: u32, skipped: bool) -> Record {
        Record { sent, node, failed_calls, skipped }
    }

    #[test]
    fn a_served_answer_reports_the_failed_call_and_a_skip() {
        let failed = json!({"model": "sim/secondary", "secureai": {"failover": {"occurred": true,
            "attempts": [{"model": "sim/dying-0", "status": "failed", "reason": "server_error"},
                         {"model": "sim/secondary", "status": "served"}]}}});
        assert_eq!(classify(&failed, "sim/dying-0"), (1, false));
        let retried = json!({"secureai": {"attempts": [
            {"model": "sim/dying-0", "status": "failed", "retries": 2}]}});
        assert_eq!(classify(&retried, "sim/dying-0"), (3, false));
        let skipped = json!({"secureai": {"failover": {"attempts": [
            {"model": "sim/dying-0", "status": "skipped", "reason": "circuit_open"},
            {"model": "sim/secondary", "status": "served"}]}}});
        assert_eq!(classify(&skipped, "sim/dying-0"), (0, true));
        let local = json!({"secureai": {"failover": {"attempts": [
            {"model": "sim/dying-0", "status": "failed", "reason": "rate_limit", "local_limit": true}]}}});
        assert_eq!(classify(&local, "sim/dying-0"), (0, false));
        assert_eq!(classify(&json!({"model": "sim/dying-0"}), "sim/dying-0"), (0, false));
    }

    #[test]
    fn a_node_stops_at_its_first_skip_or_open_breaker_and_later_calls_count_apart() {
        let t0 = Instant::now();
        let at = |ms: u64| t0 + Duration::from_millis(ms);
        let records = [
            record(at(10), 0, 1, false),
            record(at(20), 1, 1, false),
            record(at(30), 0, 0, true),
            // After node 1's breaker was seen open: a call after its stop.
            record(at(40), 1, 1, false),
            // Node 0 called again after it had stopped.
            record(at(50), 0, 1, false),
            record(at(60), 1, 0, true),
        ];
        // Node 1's breaker was seen open before its first skipped answer; node 2 neither.
        let seen_open = [Some(at(35)), Some(at(35)), None];
        let stops = stop_times(&records, &seen_open);
        assert_eq!(stops, vec![Some(at(30)), Some(at(35)), None]);
        assert_eq!(split_calls(&records, &stops), (2, 2));
    }

    #[test]
    fn the_fleet_field_is_written_only_when_asked() {
        let sim: SocketAddr = "127.0.0.1:9".parse().unwrap();
        assert!(catalog(sim, 2, Some(true)).ends_with("  fleet: true\n"));
        assert!(catalog(sim, 2, Some(false)).ends_with("  fleet: false\n"));
        let without = catalog(sim, 2, None);
        assert!(!without.contains("fleet"));
        assert!(without.contains("upstream_model: dying-1\n"));
        // What this source tree's catalog makes of them.
        let parsed = switchyard_catalog::file::parse("bench.yaml", &without).unwrap();
        parsed.validate().unwrap();
        assert_eq!(parsed.models.len(), 3);
        assert!(parsed.breaker_policy.fleet, "on unless the catalog says otherwise");
        let off = switchyard_catalog::file::parse("bench.yaml", &catalog(sim, 2, Some(false)));
        assert!(!off.unwrap().breaker_policy.fleet);
    }
}
