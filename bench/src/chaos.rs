//! `switchyard-bench chaos`: what fault injection costs a node, and how fast a fault's end
//! reaches a fleet.
//!
//! Cost: in one run, the node of a build without fault injection (`--baseline PATH`) and
//! the node of this build, each with its own simulator and control plane, under the same
//! closed-loop load as the default run, and the bare hyper pass-through beside them; this
//! build is measured with no fault in force and with a fault in force on a model the
//! measured requests never use. Targets interleave within each run.
//!
//! Reach: one control plane and `--nodes` nodes; each of `--changes` rounds injects a fault
//! (a 1 ms delay, which touches neither the breaker nor the answer), clears it, injects it
//! again with a 1 s TTL and lets it expire. A node is polled with requests whose report
//! names the fault (`injected`) while the fault is in force there. Each figure is the time
//! until the last node saw the change: from just before `chaos inject`/`chaos clear` was
//! run, and from the fault's `expires_at` for the TTL.

use std::net::SocketAddr;
use std::path::{Path, PathBuf};
use std::sync::Arc;
use std::time::{Duration, Instant, SystemTime};

use bytes::Bytes;
use serde_json::{Value, json};

use crate::catalog::{FAILING, PRIMARY, SECONDARY, catalog_yaml};
use crate::client::{connect, http};
use crate::error::Result;
use crate::flags::{self, bounded};
use crate::fleet::Fleet;
use crate::host::{self, clock_ticks, cpu_ticks};
use crate::load::{Kind, Target, phase};
use crate::proc::{Proc, cli};
use crate::stats::{fmt, median, percentile};

/// The goal for the feature's cost: this build's node CPU per request within this share of
/// the baseline's, with and without a fault in force elsewhere.
const COST_GOAL: f64 = 0.02;
/// The goal for a change to reach every node, p99.
const REACH_GOAL: Duration = Duration::from_secs(1);
/// How often each node is asked whether the fault is in force while waiting for a change.
const POLL: Duration = Duration::from_millis(2);

struct Options {
    switchyard: PathBuf,
    baseline: Option<PathBuf>,
    concurrency: Vec<usize>,
    runs: usize,
    warmup: Duration,
    duration: Duration,
    nodes: usize,
    changes: usize,
    cost: bool,
    reach: bool,
}

/// `switchyard-bench chaos`'s flags.
#[derive(clap::Args)]
#[command(args_override_self = true)]
pub struct Args {
    #[command(flatten)]
    switchyard: flags::Switchyard,
    /// A `switchyard` built without fault injection, for the cost.
    #[arg(long, value_name = "PATH")]
    baseline: Option<PathBuf>,
    #[command(flatten)]
    concurrency: flags::Concurrency,
    /// Runs per target (1–20).
    #[arg(long, value_name = "N", default_value = "3", value_parser = bounded::<usize>(1, 20))]
    runs: usize,
    /// Warm-up before each measurement, in seconds.
    #[arg(long, value_name = "SECS", default_value = "2", value_parser = flags::secs)]
    warmup_secs: Duration,
    /// Length of each measurement, in seconds.
    #[arg(long, value_name = "SECS", default_value = "5", value_parser = flags::secs)]
    duration_secs: Duration,
    /// Nodes in the fleet the faults reach (1–32).
    #[arg(long, value_name = "N", default_value = "3", value_parser = bounded::<usize>(1, 32))]
    nodes: usize,
    /// Fault changes timed to every node (1–1000).
    #[arg(long, value_name = "N", default_value = "20", value_parser = bounded::<usize>(1, 1000))]
    changes: usize,
    /// Skip the cost (no --baseline needed).
    #[arg(long)]
    no_cost: bool,
    /// Skip the reach.
    #[arg(long)]
    no_reach: bool,
}

fn options(a: Args) -> Result<Options> {
    let o = Options {
        switchyard: a.switchyard.existing()?,
        baseline: a.baseline,
        concurrency: a.concurrency.list,
        runs: a.runs,
        warmup: a.warmup_secs,
        duration: a.duration_secs,
        nodes: a.nodes,
        changes: a.changes,
        cost: !a.no_cost,
        reach: !a.no_reach,
    };
    if let Some(baseline) = &o.baseline
        && !baseline.is_file()
    {
        return Err(format!("{} not found: build it or pass its path", baseline.display()));
    }
    if o.cost && o.baseline.is_none() {
        return Err("--baseline PATH (a `switchyard` built without fault injection) is needed \
                    for the cost; pass --no-cost to measure only the reach"
            .to_owned());
    }
    Ok(o)
}

pub fn main(args: Args) -> Result<()> {
    let options = options(args)?;
    // One thread for the load generator, as in the default run.
    let rt = host::runtime(host::Threads::Current)?;
    rt.block_on(async {
        if let (true, Some(baseline)) = (options.cost, &options.baseline) {
            cost(&options, baseline).await?;
        }
        if options.reach {
            reach(&options).await?;
        }
        Ok(())
    })
}

// === cost ===

/// The targets of the cost table, in the order each run measures them.
#[derive(Clone, Copy, PartialEq, Eq, Debug)]
enum Case {
    Passthrough,
    Baseline,
    NoFault,
    FaultElsewhere,
}

impl Case {
    const ALL: [Case; 4] = [Case::Passthrough, Case::Baseline, Case::NoFault, Case::FaultElsewhere];

    fn label(self) -> &'static str {
        match self {
            Case::Passthrough => "hyper pass-through",
            Case::Baseline => "node, build without chaos",
            Case::NoFault => "node, no fault",
            Case::FaultElsewhere => "node, fault on another model",
        }
    }
}

struct Sample {
    case: Case,
    conns: usize,
    rps: f64,
    p50_us: f64,
    cpu_us: f64,
    non_200: u64,
}

async fn cost(options: &Options, baseline: &Path) -> Result<()> {
    let dir = tempfile::Builder::new()
        .prefix("switchyard-bench-chaos-")
        .tempdir()
        .map_err(|e| format!("temp dir: {e}"))?;
    let (base_dir, this_dir) = (dir.path().join("baseline"), dir.path().join("this"));
    for d in [&base_dir, &this_dir] {
        std::fs::create_dir_all(d).map_err(|e| format!("{}: {e}", d.display()))?;
    }
    let base = Fleet::start(baseline, &base_dir, catalog_yaml).await?;
    let this = Fleet::start(&options.switchyard, &this_dir, catalog_yaml).await?;
    let me = std::env::current_exe().map_err(|e| format!("own path: {e}"))?;
    let pass = Proc::start(
        &me,
        &["passthrough", "--listen", "127.0.0.1:0", "--upstream", &this.sim.addr.to_string()],
        &[],
        &dir.path().join("passthrough.log"),
    )?;

    let messages = json!([{"role": "user", "content": "Say hello."}]);
    let direct = json!({"model": "primary", "messages": messages}).to_string();
    let chain =
        json!({"model": PRIMARY, "fallback_models": [SECONDARY], "messages": messages}).to_string();
    let target = |addr: SocketAddr, key: Option<&str>, body: &str, pid: u32| {
        Arc::new(Target {
            kind: Kind::NodeHealthy,
            addr,
            host: addr.to_string(),
            auth: key.map(|k| format!("Bearer {k}")),
            body: Bytes::from(body.to_owned()),
            proxy_pid: Some(pid),
            tls: None,
        })
    };
    let pass_t = target(pass.addr, None, &direct, pass.pid());
    let base_t = target(base.node.addr, Some(&base.key), &chain, base.node.pid());
    let this_t = target(this.node.addr, Some(&this.key), &chain, this.node.pid());
    for t in [&pass_t, &base_t, &this_t] {
        let auth = t.auth.as_deref().and_then(|a| a.strip_prefix("Bearer "));
        let body = String::from_utf8_lossy(&t.body).into_owned();
        let (status, v) = http(t.addr, "POST", "/v1/chat/completions", auth, Some(body)).await?;
        if status != 200 {
            return Err(format!("{}: check request got {status}: {v}", t.addr));
        }
    }
    let fault_args = ["chaos", "inject", "bench-elsewhere", "--model", FAILING];
    let fault_args = [&fault_args[..], &["--status", "503", "--ttl", "1h"]].concat();

    eprintln!(
        "switchyard-bench chaos: {} run(s) × concurrency {:?}; baseline {}, this build {}; logs in {}",
        options.runs,
        options.concurrency,
        baseline.display(),
        options.switchyard.display(),
        dir.path().display()
    );
    let mut runs: Vec<Vec<Sample>> = Vec::new();
    for run in 1..=options.runs {
        let mut samples = Vec::new();
        for &conns in &options.concurrency {
            for case in Case::ALL {
                let t = match case {
                    Case::Passthrough => &pass_t,
                    Case::Baseline => &base_t,
                    Case::NoFault | Case::FaultElsewhere => &this_t,
                };
                if case == Case::FaultElsewhere {
                    cli(&options.switchyard, &this.control, &this.token, &fault_args)?;
                }
                let s = measure(case, t, conns, options.warmup, options.duration).await;
                if case == Case::FaultElsewhere {
                    cli(
                        &options.switchyard,
                        &this.control,
                        &this.token,
                        &["chaos", "clear", "bench-elsewhere"],
                    )?;
                }
                let s = s?;
                eprintln!(
                    "  run {run} c={conns} {:<30} {:>8.0} req/s  p50 {:>7.1} µs  CPU {:>6.1} µs/req",
                    case.label(),
                    s.rps,
                    s.p50_us,
                    s.cpu_us
                );
                samples.push(s);
            }
        }
        runs.push(samples);
    }
    print_cost(&runs, &options.concurrency);
    drop((pass, base, this));
    Ok(())
}

async fn measure(
    case: Case,
    target: &Arc<Target>,
    conns: usize,
    warmup: Duration,
    duration: Duration,
) -> Result<Sample> {
    let mut senders = Vec::with_capacity(conns);
    for _ in 0..conns {
        senders.push(connect(target.addr).await?);
    }
    let (senders, _, _) = phase(senders, target, Instant::now() + warmup, false).await?;
    let pid = target.proxy_pid.ok_or("a cost target has a process")?;
    let before = cpu_ticks(pid)?;
    let start = Instant::now();
    let (senders, mut latencies, non_200) = phase(senders, target, start + duration, true).await?;
    let wall = start.elapsed();
    let after = cpu_ticks(pid)?;
    drop(senders);
    latencies.sort_unstable();
    let n = latencies.len();
    if n == 0 {
        return Err(format!("{}: no request completed", case.label()));
    }
    Ok(Sample {
        case,
        conns,
        rps: n as f64 / wall.as_secs_f64(),
        p50_us: percentile(&latencies, 0.5) / 1e3,
        cpu_us: after.saturating_sub(before) as f64 / clock_ticks() as f64 * 1e6 / n as f64,
        non_200,
    })
}

fn print_cost(runs: &[Vec<Sample>], concurrency: &[usize]) {
    let med = |case: Case, conns: usize, f: &dyn Fn(&Sample) -> f64| {
        let v: Vec<f64> =
            runs.iter().flatten().filter(|s| s.case == case && s.conns == conns).map(f).collect();
        median(&v)
    };
    // Each run's ratio against the same run's pass-through or baseline, then the median.
    let ratio = |case: Case, over: Case, conns: usize| {
        let v: Vec<f64> = runs
            .iter()
            .filter_map(|run| {
                let find = |c: Case| run.iter().find(|s| s.case == c && s.conns == conns);
                find(case).zip(find(over)).map(|(a, b)| a.cpu_us / b.cpu_us)
            })
            .collect();
        median(&v)
    };
    println!("### Cost of fault injection (medians of {} runs)\n", runs.len());
    println!(
        "| target | conns | req/s | p50 ms | node CPU µs/req | CPU × pass-through | CPU × build without chaos | non-200 |"
    );
    println!("|---|---:|---:|---:|---:|---:|---:|---:|");
    for &c in concurrency {
        for case in Case::ALL {
            let vs_base = match case {
                Case::NoFault | Case::FaultElsewhere => ratio(case, Case::Baseline, c),
                _ => None,
            };
            let non_200: u64 = runs
                .iter()
                .flatten()
                .filter(|s| s.case == case && s.conns == c)
                .map(|s| s.non_200)
                .sum();
            println!(
                "| {} | {c} | {} | {} | {} | {} | {} | {non_200} |",
                case.label(),
                fmt(med(case, c, &|s| s.rps), 0),
                fmt(med(case, c, &|s| s.p50_us / 1e3), 3),
                fmt(med(case, c, &|s| s.cpu_us), 1),
                fmt(
                    (case != Case::Passthrough)
                        .then(|| ratio(case, Case::Passthrough, c))
                        .flatten(),
                    2
                ),
                fmt(vs_base, 3),
            );
        }
    }
    println!();
    println!("| goal | conns | no fault | fault elsewhere | verdict |");
    println!("|---|---:|---:|---:|---|");
    for &c in concurrency {
        let a = ratio(Case::NoFault, Case::Baseline, c);
        let b = ratio(Case::FaultElsewhere, Case::Baseline, c);
        let ok = a.zip(b).is_some_and(|(a, b)| a <= 1.0 + COST_GOAL && b <= 1.0 + COST_GOAL);
        println!(
            "| node CPU/req within {:.0} % of the build without chaos | {c} | {} | {} | {} |",
            COST_GOAL * 100.0,
            fmt(a, 3),
            fmt(b, 3),
            if ok { "met" } else { "NOT met" }
        );
    }
    println!();
}

// === reach ===

async fn reach(options: &Options) -> Result<()> {
    let dir = tempfile::Builder::new()
        .prefix("switchyard-bench-reach-")
        .tempdir()
        .map_err(|e| format!("temp dir: {e}"))?;
    let d = dir.path();
    let bin = options.switchyard.as_path();
    let fleet = Fleet::start(bin, d, catalog_yaml).await?;
    let mut nodes = vec![];
    for i in 1..options.nodes {
        nodes.push(fleet.add_node(bin, d, &format!("node-{i}")).await?);
    }
    let addrs: Vec<SocketAddr> =
        std::iter::once(fleet.node.addr).chain(nodes.iter().map(|n| n.addr)).collect();
    let body =
        json!({"models": [PRIMARY, SECONDARY], "messages": [{"role": "user", "content": "hi"}]})
            .to_string();
    let probe = Probe { addrs: addrs.clone(), key: fleet.key.clone(), body };
    eprintln!(
        "switchyard-bench chaos: reach over {} node(s), {} change(s) of each kind; logs in {}",
        addrs.len(),
        options.changes,
        d.display()
    );

    let (mut injected, mut cleared, mut expired) = (vec![], vec![], vec![]);
    let cmd = |args: &[&str]| cli(bin, &fleet.control, &fleet.token, args);
    for i in 0..options.changes {
        let name = format!("reach-{i}");
        let inject = ["chaos", "inject", &name, "--model", PRIMARY, "--delay-ms", "1"];
        let t0 = Instant::now();
        cmd(&[&inject[..], &["--ttl", "10m"]].concat())?;
        injected.push(probe.until_all(&name, true, t0).await?);
        let t0 = Instant::now();
        cmd(&["chaos", "clear", &name])?;
        cleared.push(probe.until_all(&name, false, t0).await?);

        let name = format!("reach-ttl-{i}");
        let inject = ["chaos", "inject", &name, "--model", PRIMARY, "--delay-ms", "1"];
        let stored = cmd(&[&inject[..], &["--ttl", "1s"]].concat())?;
        let expires = stored["expires_at_unix_ms"]
            .as_i64()
            .ok_or_else(|| format!("chaos inject printed no expiry: {stored}"))?;
        probe.until_all(&name, true, Instant::now()).await?;
        expired.push(probe.until_all_after(&name, expires).await?);
    }
    let row = |what: &str, v: &mut Vec<Duration>| {
        v.sort_unstable();
        let ns: Vec<u64> = v.iter().map(|d| d.as_nanos() as u64).collect();
        let (p50, p99) = (percentile(&ns, 0.5) / 1e6, percentile(&ns, 0.99) / 1e6);
        let max = ns.last().map_or(0.0, |n| *n as f64 / 1e6);
        let ok = p99 <= REACH_GOAL.as_secs_f64() * 1e3;
        println!(
            "| {what} | {} | {p50:.0} | {p99:.0} | {max:.0} | {} |",
            v.len(),
            if ok { "met" } else { "NOT met" }
        );
    };
    println!("### A fault's start and end reaching every node ({} nodes)\n", addrs.len());
    println!("| change | changes | p50 ms | p99 ms | max ms | p99 ≤ 1 s |");
    println!("|---|---:|---:|---:|---:|---|");
    row("`chaos inject` → in force on every node", &mut injected);
    row("`chaos clear` → gone from every node", &mut cleared);
    row("TTL end (`expires_at`) → gone from every node", &mut expired);
    println!();
    drop((nodes, fleet));
    Ok(())
}

/// Asks nodes whether a fault is in force for them: a request whose first attempt's
/// report names the fault.
struct Probe {
    addrs: Vec<SocketAddr>,
    key: String,
    body: String,
}

impl Probe {
    async fn in_force(&self, addr: SocketAddr, name: &str) -> Result<bool> {
        let (status, v) =
            http(addr, "POST", "/v1/chat/completions", Some(&self.key), Some(self.body.clone()))
                .await?;
        if status != 200 {
            return Err(format!("{addr}: reach probe got {status}: {v}"));
        }
        Ok(first_injected(&v) == Some(name))
    }

    /// Waits until every node agrees that the fault is (`want`) in force; the time from
    /// `t0` until the last one did.
    async fn until_all(&self, name: &str, want: bool, t0: Instant) -> Result<Duration> {
        let mut pending = self.addrs.clone();
        let mut last = Duration::ZERO;
        while !pending.is_empty() {
            if t0.elapsed() > Duration::from_secs(30) {
                return Err(format!(
                    "{name}: {} node(s) did not see the change in 30 s",
                    pending.len()
                ));
            }
            let mut still = vec![];
            for addr in pending {
                if self.in_force(addr, name).await? == want {
                    last = t0.elapsed();
                } else {
                    still.push(addr);
                }
            }
            pending = still;
            if !pending.is_empty() {
                tokio::time::sleep(POLL).await;
            }
        }
        Ok(last)
    }

    /// Waits until the fault is gone from every node; the time from `expires_unix_ms`
    /// (zero when a node was already past it at the first look).
    async fn until_all_after(&self, name: &str, expires_unix_ms: i64) -> Result<Duration> {
        let now_ms = || {
            SystemTime::now()
                .duration_since(SystemTime::UNIX_EPOCH)
                .map(|d| d.as_millis() as i64)
                .unwrap_or(0)
        };
        let wait = u64::try_from(expires_unix_ms - now_ms()).unwrap_or(0);
        let expires = Instant::now() + Duration::from_millis(wait);
        self.until_all(name, false, Instant::now()).await?;
        Ok(Instant::now().saturating_duration_since(expires))
    }
}

/// The `injected` of the first attempt of a multi-model chain's report.
fn first_injected(v: &Value) -> Option<&str> {
    v["secureai"]["failover"]["attempts"][0]["injected"].as_str()
}
