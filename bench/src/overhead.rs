//! The default run: the simulator direct, the bare hyper pass-through and the node (primary
//! healthy, primary failing) under the same closed-loop load, one concurrency at a time;
//! with `--surfaces` also Messages, Responses and embeddings requests (native and
//! translated, each with the pass-through forwarding what reaches the simulator as its floor), with `--baseline-switchyard` a node of another
//! build beside this one's.

use std::net::SocketAddr;
use std::path::PathBuf;
use std::sync::Arc;
use std::time::{Duration, Instant};

use bytes::Bytes;
use serde_json::json;

use crate::catalog::{
    ANTHROPIC_PRIMARY, ANTHROPIC_SECONDARY, EMBED, EMBED_SECONDARY, FAILING, PRIMARY, SECONDARY,
    catalog_with_embeddings_yaml, catalog_yaml,
};
use crate::client::{connect, http, metrics_text, post};
use crate::error::Result;
use crate::fleet::Fleet;
use crate::host::{self, clock_ticks, cpu_ticks, ctx_switches, mib, status_kib, steal_ticks};
use crate::load::{Api, Kind, Target, phase};
use crate::proc::Proc;
use crate::stats::{fmt, median, pct, percentile};

/// Attempts at one concurrency of one run before the least disturbed one is kept.
const MAX_ATTEMPTS: usize = 4;

/// The default run's flags (parsed in `main`, whose usage text they belong to).
pub struct Options {
    pub switchyard: PathBuf,
    pub concurrency: Vec<usize>,
    pub warmup: Duration,
    pub duration: Duration,
    pub runs: usize,
    pub max_steal_pct: f64,
    /// Adds the Messages, Responses and embeddings targets ([`Kind::SURFACES`]).
    pub surfaces: bool,
    /// Another build's `switchyard`, whose node is measured beside this build's.
    pub baseline: Option<PathBuf>,
}

/// What one target measured in one run at one concurrency.
#[derive(Clone, Debug)]
pub struct Sample {
    kind: Kind,
    conns: usize,
    requests: u64,
    rps: f64,
    pub p50_us: f64,
    p99_us: f64,
    /// Either side of p99, for the progress line only: on an oversubscribed host the tail
    /// is a cliff (a thread waiting out another's time slice), and whether p99 lands
    /// before or on it is what moves it by milliseconds between runs.
    p98_us: f64,
    p999_us: f64,
    /// Proxy CPU (utime+stime) per measured request, µs.
    pub proxy_cpu_us: Option<f64>,
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
    pub non_200: u64,
}

pub struct Bench {
    sim: SocketAddr,
    sim_pid: u32,
    control_pid: u32,
    ticks_per_sec: f64,
}

impl Bench {
    /// Measures against `fleet`'s simulator and control plane.
    pub fn new(fleet: &Fleet) -> Result<Self> {
        Ok(Self {
            sim: fleet.sim.addr,
            sim_pid: fleet.sim.pid(),
            control_pid: fleet.cp.pid(),
            ticks_per_sec: clock_ticks() as f64,
        })
    }

    async fn failing_upstream_requests(&self) -> Result<u64> {
        let (_, stats) = http(self.sim, "GET", "/_sim/stats", None, None).await?;
        Ok(stats["models"]["failing"]["requests"].as_u64().unwrap_or(0))
    }

    pub async fn measure(
        &self,
        target: &Arc<Target>,
        conns: usize,
        warmup: Duration,
        duration: Duration,
    ) -> Result<Sample> {
        let mut senders = Vec::with_capacity(conns);
        for _ in 0..conns {
            senders.push(match &target.tls {
                Some(tls) => crate::client::connect_tls(target.addr, tls).await?,
                None => connect(target.addr).await?,
            });
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
                .map(|pid| status_kib(pid, "VmHWM"))
                .transpose()?
                .map(mib),
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

pub fn main(options: Options) -> Result<()> {
    // One thread for the load generator: on a small machine it should take at most one
    // core away from the processes it measures, and the same core for every target.
    let rt = host::runtime(host::Threads::Current)?;
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

    let catalog = if options.surfaces { catalog_with_embeddings_yaml } else { catalog_yaml };
    let fleet = Fleet::start(bin, d, catalog).await?;
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

    // The baseline node: another build's `switchyard` on the same control plane and
    // simulator, sent exactly what this build's node is sent.
    let baseline = match &options.baseline {
        Some(bin) => Some(fleet.add_node_with_env(bin, d, "node-baseline", &[]).await?),
        None => None,
    };

    let chat = json!([{"role": "user", "content": "Say hello."}]);
    let direct_body = json!({"model": "primary", "messages": chat}).to_string();
    let node_body = |model: &str| {
        json!({"model": model, "fallback_models": [SECONDARY], "messages": chat}).to_string()
    };
    // The same prompt as a Messages body, with the `max_tokens` that API requires; the node's
    // also names a fallback, as the Chat bodies do.
    let messages_body = |model: &str, fallback: Option<&str>, stream: bool| {
        let mut body = json!({"model": model, "max_tokens": 256, "messages": chat});
        if let Some(fallback) = fallback {
            body["fallback_models"] = json!([fallback]);
        }
        if stream {
            body["stream"] = json!(true);
        }
        body.to_string()
    };
    // The same prompt as a Responses body, and as a streamed Chat body for its floor.
    let responses_body = |model: &str, fallback: &str, stream: bool| {
        json!({"model": model, "fallback_models": [fallback], "input": "Say hello.",
               "max_output_tokens": 256, "store": false, "stream": stream})
        .to_string()
    };
    let stream_body = json!({"model": "primary", "messages": chat, "stream": true}).to_string();
    // One input to embed, to the simulator's model and to the node's chain of two.
    let embed_direct = json!({"model": "embed", "input": "Say hello."}).to_string();
    let embed_body =
        json!({"model": EMBED, "fallback_models": [EMBED_SECONDARY], "input": "Say hello."})
            .to_string();
    let bearer = Some(format!("Bearer {key}"));
    let limited_key = fleet
        .limited_key
        .as_deref()
        .ok_or("this switchyard has no key limits (keys set-limits)")?;
    let limited_bearer = Some(format!("Bearer {limited_key}"));
    // Messages clients send the key bare, in `x-api-key`.
    let x_api_key = Some(key.to_owned());

    let mut kinds = Kind::DEFAULT.to_vec();
    if baseline.is_some() {
        // Beside this build's node, so the two are measured one after the other.
        let at = kinds.iter().position(|k| *k == Kind::NodeHealthy).map_or(kinds.len(), |i| i + 1);
        kinds.insert(at, Kind::NodeBaseline);
    }
    if options.surfaces {
        kinds.extend(Kind::SURFACES);
    }
    let mut targets: Vec<Arc<Target>> = Vec::with_capacity(kinds.len());
    for &kind in &kinds {
        let (addr, auth, body, proxy_pid) = match kind {
            Kind::Direct => (sim.addr, None, direct_body.clone(), None),
            Kind::Passthrough => (pass.addr, None, direct_body.clone(), Some(pass.pid())),
            Kind::NodeHealthy => (node.addr, bearer.clone(), node_body(PRIMARY), Some(node.pid())),
            Kind::NodeFailing => (node.addr, bearer.clone(), node_body(FAILING), Some(node.pid())),
            Kind::NodeLimited => {
                (node.addr, limited_bearer.clone(), node_body(PRIMARY), Some(node.pid()))
            }
            Kind::NodeBaseline => {
                let base = baseline.as_ref().ok_or("no baseline node")?;
                (base.addr, bearer.clone(), node_body(PRIMARY), Some(base.pid()))
            }
            Kind::MessagesPassthrough | Kind::MessagesStreamPassthrough => {
                let stream = kind == Kind::MessagesStreamPassthrough;
                (pass.addr, None, messages_body("primary", None, stream), Some(pass.pid()))
            }
            Kind::MessagesAnthropic | Kind::MessagesStreamAnthropic => {
                let stream = kind == Kind::MessagesStreamAnthropic;
                let body = messages_body(ANTHROPIC_PRIMARY, Some(ANTHROPIC_SECONDARY), stream);
                (node.addr, x_api_key.clone(), body, Some(node.pid()))
            }
            Kind::MessagesOpenAi | Kind::MessagesStreamOpenAi => {
                let stream = kind == Kind::MessagesStreamOpenAi;
                let body = messages_body(PRIMARY, Some(SECONDARY), stream);
                (node.addr, x_api_key.clone(), body, Some(node.pid()))
            }
            Kind::StreamPassthrough => (pass.addr, None, stream_body.clone(), Some(pass.pid())),
            Kind::ResponsesOpenAi | Kind::ResponsesStreamOpenAi => {
                let stream = kind == Kind::ResponsesStreamOpenAi;
                let body = responses_body(PRIMARY, SECONDARY, stream);
                (node.addr, bearer.clone(), body, Some(node.pid()))
            }
            Kind::ResponsesAnthropic => {
                let body = responses_body(ANTHROPIC_PRIMARY, ANTHROPIC_SECONDARY, false);
                (node.addr, bearer.clone(), body, Some(node.pid()))
            }
            Kind::EmbeddingsPassthrough => {
                (pass.addr, None, embed_direct.clone(), Some(pass.pid()))
            }
            Kind::EmbeddingsOpenAi => {
                (node.addr, bearer.clone(), embed_body.clone(), Some(node.pid()))
            }
        };
        targets.push(Arc::new(Target {
            kind,
            addr,
            host: addr.to_string(),
            auth,
            body: Bytes::from(body),
            proxy_pid,
            tls: None,
        }));
    }
    for t in &targets {
        check(t).await?;
    }

    let ticks = clock_ticks();
    let bench = Bench::new(&fleet)?;
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
                for t in run_order(&targets, run) {
                    let s = bench.measure(t, conns, options.warmup, options.duration).await?;
                    eprintln!(
                        "  run {run} c={conns} {:<36} {:>8.0} req/s  p50 {:>7.1} µs  p98 {:>7.1}  p99 {:>7.1}  p99.9 {:>7.1} µs  steal {:>4.1} %",
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
                group.sort_by_key(|s| kinds.iter().position(|k| *k == s.kind));
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
    print_floors(&runs, &options.concurrency);
    print_baseline(&runs, &options.concurrency);
    drop((pass, baseline, node, cp, sim));
    Ok(())
}

/// The targets in the order run `run` measures them: this build's node and the baseline's
/// take turns going first, so neither is always the one measured after the other.
fn run_order(targets: &[Arc<Target>], run: usize) -> Vec<&Arc<Target>> {
    let mut order: Vec<&Arc<Target>> = targets.iter().collect();
    let at = |kind: Kind| order.iter().position(|t| t.kind == kind);
    if run.is_multiple_of(2)
        && let (Some(node), Some(baseline)) = (at(Kind::NodeHealthy), at(Kind::NodeBaseline))
    {
        order.swap(node, baseline);
    }
    order
}

/// The model a target's check answer must come from: the simulator's own name for the
/// pass-through and direct targets, the catalog model for the node's.
fn expected_model(kind: Kind) -> &'static str {
    match kind {
        Kind::Direct
        | Kind::Passthrough
        | Kind::StreamPassthrough
        | Kind::MessagesPassthrough
        | Kind::MessagesStreamPassthrough => "primary",
        Kind::NodeHealthy
        | Kind::NodeLimited
        | Kind::NodeBaseline
        | Kind::MessagesOpenAi
        | Kind::MessagesStreamOpenAi
        | Kind::ResponsesOpenAi
        | Kind::ResponsesStreamOpenAi => PRIMARY,
        Kind::NodeFailing => SECONDARY,
        Kind::MessagesAnthropic | Kind::MessagesStreamAnthropic | Kind::ResponsesAnthropic => {
            ANTHROPIC_PRIMARY
        }
        Kind::EmbeddingsPassthrough => "embed",
        Kind::EmbeddingsOpenAi => EMBED,
    }
}

/// Whether a target's requests ask for a stream.
fn streamed(kind: Kind) -> bool {
    matches!(
        kind,
        Kind::MessagesStreamPassthrough
            | Kind::MessagesStreamAnthropic
            | Kind::MessagesStreamOpenAi
            | Kind::StreamPassthrough
            | Kind::ResponsesStreamOpenAi
    )
}

/// Each target must answer 200 with a whole answer in its API's shape, from the model the
/// case means, before it is measured: otherwise the figures measure an error path.
async fn check(t: &Target) -> Result<()> {
    let (status, headers, body) = post(t.addr, t.kind.path(), &t.headers(), t.body.clone()).await?;
    let text = String::from_utf8_lossy(&body);
    let want = expected_model(t.kind);
    let (whole, model) = if streamed(t.kind) {
        let events: Vec<serde_json::Value> = text
            .lines()
            .filter_map(|l| l.strip_prefix("data:"))
            .filter_map(|d| serde_json::from_str::<serde_json::Value>(d.trim()).ok())
            .collect();
        // Each API's stream names the model in its first event and ends with its own
        // last one, which a stream cut short lacks.
        let (first, end) = match t.kind.api() {
            Api::Messages => ("message_start", "event: message_stop"),
            Api::Responses => ("response.created", "event: response.completed"),
            Api::Chat | Api::Embeddings => ("", "data: [DONE]"),
        };
        let model = match t.kind.api() {
            Api::Messages => events
                .iter()
                .find(|v| v["type"] == first)
                .and_then(|v| v["message"]["model"].as_str()),
            Api::Responses => events
                .iter()
                .find(|v| v["type"] == first)
                .and_then(|v| v["response"]["model"].as_str()),
            Api::Chat | Api::Embeddings => events.first().and_then(|v| v["model"].as_str()),
        };
        (text.contains(end), model.map(str::to_owned))
    } else {
        let v: serde_json::Value = serde_json::from_slice(&body).unwrap_or_default();
        let whole = match t.kind.api() {
            Api::Chat => v["object"] == "chat.completion",
            Api::Messages => v["type"] == "message",
            Api::Responses => v["object"] == "response" && v["status"] == "completed",
            Api::Embeddings => v["object"] == "list" && v["data"][0]["embedding"].is_array(),
        };
        (whole, v["model"].as_str().map(str::to_owned))
    };
    // A Messages answer names the model as its API does (an Anthropic model's as the
    // provider sent it); the node says which catalog model served in `x-served-model`.
    let served = if t.kind.api() != Api::Chat && t.kind.is_node() {
        headers.get("x-served-model").and_then(|v| v.to_str().ok()).map(str::to_owned)
    } else {
        model
    };
    if status != 200 || !whole || served.as_deref() != Some(want) {
        return Err(format!(
            "{}: check request got {status}, served by {served:?}, whole answer {whole} \
             (expected 200 from {want}): {text}",
            t.kind.label()
        ));
    }
    Ok(())
}

// === Report ===

/// Per-run figures derived against the same run's direct and pass-through rows.
struct Derived {
    added_p50_us: Option<f64>,
    added_p99_us: Option<f64>,
    /// What the node adds beyond the bare proxy hop: the latency goals are judged on these,
    /// because on a saturated 2-core host the hop alone can exceed an absolute tail goal.
    over_pass_p50_us: Option<f64>,
    over_pass_p99_us: Option<f64>,
    /// Against the target's own floor ([`Kind::floor`]): the pass-through forwarding the
    /// same API's body.
    cpu_vs_pass: Option<f64>,
    p50_vs_pass: Option<f64>,
    /// Against the Chat pass-through, whatever the target's API.
    cpu_vs_chat_pass: Option<f64>,
    p50_vs_chat_pass: Option<f64>,
}

fn derive(run: &[Sample], s: &Sample) -> Derived {
    let find = |k: Kind| run.iter().find(|x| x.kind == k && x.conns == s.conns);
    // The simulator direct is a Chat request: what a Messages target adds over it would
    // include the simulator's own difference between its two APIs.
    let direct = find(Kind::Direct).filter(|_| s.kind.api() == Api::Chat);
    let pass = find(s.kind.floor());
    let chat_pass = find(Kind::Passthrough);
    let proxied = s.kind != Kind::Direct;
    let node = s.kind.is_node();
    let cpu = |p: &Sample| p.proxy_cpu_us.zip(s.proxy_cpu_us).map(|(p, me)| me / p);
    let p50 = |p: &Sample| (s.p50_us / p.p50_us).is_finite().then(|| s.p50_us / p.p50_us);
    Derived {
        added_p50_us: direct.filter(|_| proxied).map(|d| s.p50_us - d.p50_us),
        added_p99_us: direct.filter(|_| proxied).map(|d| s.p99_us - d.p99_us),
        over_pass_p50_us: pass.filter(|_| node).map(|p| s.p50_us - p.p50_us),
        over_pass_p99_us: pass.filter(|_| node).map(|p| s.p99_us - p.p99_us),
        cpu_vs_pass: pass.and_then(cpu),
        p50_vs_pass: pass.filter(|_| proxied).and_then(p50),
        cpu_vs_chat_pass: chat_pass.and_then(cpu),
        p50_vs_chat_pass: chat_pass.filter(|_| proxied).and_then(p50),
    }
}

/// The median over runs of one figure of one (kind, concurrency) row.
fn med_of(
    runs: &[Vec<Sample>],
    kind: Kind,
    conns: usize,
    f: impl Fn(&[Sample], &Sample) -> Option<f64>,
) -> Option<f64> {
    let values: Vec<f64> = runs
        .iter()
        .filter_map(|run| {
            run.iter().find(|s| s.kind == kind && s.conns == conns).and_then(|s| f(run, s))
        })
        .collect();
    median(&values)
}

fn print_table(runs: &[Vec<Sample>]) {
    println!(
        "| target | conns | req/s | p50 ms | p99 ms | added p50 ms | added p99 ms | proxy CPU µs/req | CPU × pass-through | p50 × pass-through | proxy ctx switches/req | sim CPU µs/req | control CPU µs/req | proxy peak RSS MiB | primary attempts/req | host steal % | non-200 |"
    );
    println!(
        "|---|---:|---:|---:|---:|---:|---:|---:|---:|---:|---:|---:|---:|---:|---:|---:|---:|"
    );
    let Some(first) = runs.first() else { return };
    for s in first {
        let (k, c) = (s.kind, s.conns);
        let m = |f: fn(&[Sample], &Sample) -> Option<f64>| med_of(runs, k, c, f);
        println!(
            "| {} | {c} | {} | {} | {} | {} | {} | {} | {} | {} | {} | {} | {} | {} | {} | {} | {} |",
            k.label(),
            fmt(m(|_, s| Some(s.rps)), 0),
            fmt(m(|_, s| Some(s.p50_us / 1e3)), 3),
            fmt(m(|_, s| Some(s.p99_us / 1e3)), 3),
            fmt(m(|r, s| derive(r, s).added_p50_us.map(|v| v / 1e3)), 3),
            fmt(m(|r, s| derive(r, s).added_p99_us.map(|v| v / 1e3)), 3),
            fmt(m(|_, s| s.proxy_cpu_us), 1),
            fmt(m(|r, s| derive(r, s).cpu_vs_pass), 2),
            fmt(m(|r, s| derive(r, s).p50_vs_pass), 2),
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

/// The Messages targets and the baseline node against their own floor and against the Chat
/// pass-through (only when the run has them).
fn print_floors(runs: &[Vec<Sample>], concurrency: &[usize]) {
    let shown = [Kind::NodeHealthy, Kind::NodeBaseline]
        .into_iter()
        .chain(Kind::SURFACES)
        .filter(|k| runs.iter().flatten().any(|s| s.kind == *k))
        .collect::<Vec<_>>();
    if !shown.iter().any(|k| *k != Kind::NodeHealthy) {
        return;
    }
    println!("### Against each floor (medians over runs of each run's ratio)\n");
    println!(
        "| target | conns | its pass-through | proxy CPU µs/req | CPU × its pass-through | CPU × Chat pass-through | p50 ms | p50 × its pass-through | p50 × Chat pass-through |"
    );
    println!("|---|---:|---|---:|---:|---:|---:|---:|---:|");
    for &c in concurrency {
        for &k in &shown {
            let m = |f: fn(&[Sample], &Sample) -> Option<f64>| med_of(runs, k, c, f);
            println!(
                "| {} | {c} | {} | {} | {} | {} | {} | {} | {} |",
                k.label(),
                k.floor().label(),
                fmt(m(|_, s| s.proxy_cpu_us), 1),
                fmt(m(|r, s| derive(r, s).cpu_vs_pass), 2),
                fmt(m(|r, s| derive(r, s).cpu_vs_chat_pass), 2),
                fmt(m(|_, s| Some(s.p50_us / 1e3)), 3),
                fmt(m(|r, s| derive(r, s).p50_vs_pass), 2),
                fmt(m(|r, s| derive(r, s).p50_vs_chat_pass), 2),
            );
        }
    }
    println!();
}

/// This build's node against the baseline build's, from each run's pair of rows (only when
/// the run has a baseline).
fn print_baseline(runs: &[Vec<Sample>], concurrency: &[usize]) {
    if !runs.iter().flatten().any(|s| s.kind == Kind::NodeBaseline) {
        return;
    }
    println!("### This build against the baseline, primary healthy (ratios of each run's pair)\n");
    println!(
        "| conns | baseline CPU µs/req | this build CPU µs/req | CPU this / baseline (median) | min–max | baseline p50 ms | this build p50 ms | p50 this / baseline (median) | min–max |"
    );
    println!("|---:|---:|---:|---:|---|---:|---:|---:|---|");
    for &c in concurrency {
        let pairs: Vec<(&Sample, &Sample)> = runs
            .iter()
            .filter_map(|run| {
                let find = |k: Kind| run.iter().find(|s| s.kind == k && s.conns == c);
                find(Kind::NodeBaseline).zip(find(Kind::NodeHealthy))
            })
            .collect();
        let cpu: Vec<f64> = pairs
            .iter()
            .filter_map(|(b, n)| n.proxy_cpu_us.zip(b.proxy_cpu_us).map(|(n, b)| n / b))
            .collect();
        let p50: Vec<f64> = pairs.iter().map(|(b, n)| n.p50_us / b.p50_us).collect();
        let m = |k: Kind, f: fn(&[Sample], &Sample) -> Option<f64>| med_of(runs, k, c, f);
        println!(
            "| {c} | {} | {} | {} | {}–{} | {} | {} | {} | {}–{} |",
            fmt(m(Kind::NodeBaseline, |_, s| s.proxy_cpu_us), 1),
            fmt(m(Kind::NodeHealthy, |_, s| s.proxy_cpu_us), 1),
            fmt(median(&cpu), 3),
            fmt(pct(&cpu, 0.0), 3),
            fmt(pct(&cpu, 1.0), 3),
            fmt(m(Kind::NodeBaseline, |_, s| Some(s.p50_us / 1e3)), 3),
            fmt(m(Kind::NodeHealthy, |_, s| Some(s.p50_us / 1e3)), 3),
            fmt(median(&p50), 3),
            fmt(pct(&p50, 0.0), 3),
            fmt(pct(&p50, 1.0), 3),
        );
    }
    println!();
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
        let limited = med_of(runs, Kind::NodeLimited, c, |_, s| s.proxy_cpu_us)
            .zip(med_of(runs, Kind::NodeHealthy, c, |_, s| s.proxy_cpu_us))
            .map(|(l, h)| l / h);
        println!(
            "| CPU/req, key with all four limits ≤ 1.05× without | {c} | {} | – | {} |",
            fmt(limited, 3),
            verdict(limited.is_some_and(|r| r <= 1.05))
        );
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
