//! `switchyard-bench limit-cost`: what a key's limits cost the node per request.
//!
//! The same node serves two keys, one with all four limits set (too high to bind) and one
//! without, at the same concurrency. The pair is measured `--pairs` times in alternating
//! order (AB, BA, …), so that a slow drift of a shared host lands on both sides equally, and
//! the report gives the median of the per-pair CPU ratios with their spread. A second,
//! in-process figure times the limit path itself (decide, write the rate headers, count the
//! usage) on the node's own ledger: an upper bound on what the keys can differ by that no
//! neighbour's noise can blur.

use std::sync::Arc;
use std::time::{Duration, Instant};

use bytes::Bytes;
use serde_json::json;

use switchyard_catalog::keys::Limits;
use switchyard_data_plane::limits::{Decision, Ledger};
use switchyard_time::now_ms;

use crate::catalog::{PRIMARY, SECONDARY, catalog_yaml};
use crate::error::Result;
use crate::flags::bounded;
use crate::fleet::Fleet;
use crate::host::thread_cpu_ns;
use crate::load::{Kind, Target};
use crate::overhead::{Bench, Sample};
use crate::proc::default_switchyard;
use crate::stats::{fmt, median, pct};

const USAGE: &str = "usage: switchyard-bench limit-cost [--switchyard PATH] [--concurrency 1,8] \
[--pairs 8] [--warmup-secs 1] [--duration-secs 3]";

/// Calls of the limit path timed in-process, per repetition.
const PATH_CALLS: u32 = 200_000;

struct Options {
    switchyard: std::path::PathBuf,
    concurrency: Vec<usize>,
    pairs: usize,
    warmup: Duration,
    duration: Duration,
}

fn parse(args: &[String]) -> Result<Options> {
    let mut o = Options {
        switchyard: default_switchyard()?,
        concurrency: vec![1, 8],
        pairs: 8,
        warmup: Duration::from_secs(1),
        duration: Duration::from_secs(3),
    };
    let mut it = args.iter();
    while let Some(flag) = it.next() {
        let mut value = || it.next().ok_or_else(|| format!("{flag} needs a value\n{USAGE}"));
        match flag.as_str() {
            "--switchyard" => o.switchyard = value()?.into(),
            "--concurrency" => {
                o.concurrency = value()?
                    .split(',')
                    .map(|c| bounded(c.trim(), 1, 1024, "--concurrency"))
                    .collect::<Result<Vec<_>>>()?;
            }
            "--pairs" => o.pairs = bounded(value()?, 1, 100, "--pairs")?,
            "--warmup-secs" => {
                o.warmup = Duration::from_secs(bounded(value()?, 0, 60, "--warmup-secs")? as u64);
            }
            "--duration-secs" => {
                o.duration =
                    Duration::from_secs(bounded(value()?, 1, 600, "--duration-secs")? as u64);
            }
            "-h" | "--help" => return Err(USAGE.to_owned()),
            other => return Err(format!("unknown argument {other:?}\n{USAGE}")),
        }
    }
    Ok(o)
}

pub fn main(args: &[String]) -> Result<()> {
    let options = parse(args)?;
    // The load generator's one thread, as in the default run.
    let runtime = tokio::runtime::Builder::new_current_thread()
        .enable_all()
        .build()
        .map_err(|e| format!("runtime: {e}"))?;
    runtime.block_on(run(options))
}

async fn run(o: Options) -> Result<()> {
    let path_ns = limit_path_ns()?;

    let dir = tempfile::Builder::new()
        .prefix("switchyard-bench-limit-cost-")
        .tempdir()
        .map_err(|e| format!("temp dir: {e}"))?;
    let fleet = Fleet::start(&o.switchyard, dir.path(), catalog_yaml).await?;
    let limited_key =
        fleet.limited_key.clone().ok_or("this switchyard has no key limits (keys set-limits)")?;
    let body = Bytes::from(
        json!({
            "model": PRIMARY,
            "fallback_models": [SECONDARY],
            "messages": [{"role": "user", "content": "Say hello."}],
        })
        .to_string(),
    );
    let node = &fleet.node;
    let target = |kind, key: &str| {
        Arc::new(Target {
            kind,
            addr: node.addr,
            host: node.addr.to_string(),
            auth: Some(format!("Bearer {key}")),
            body: body.clone(),
            proxy_pid: Some(node.pid()),
        })
    };
    let plain = target(Kind::NodeHealthy, &fleet.key);
    let limited = target(Kind::NodeLimited, &limited_key);
    let bench = Bench::new(&fleet)?;
    eprintln!(
        "switchyard-bench limit-cost: {} pair(s) × concurrency {:?}, {} s warm-up + {} s each; logs in {}",
        o.pairs,
        o.concurrency,
        o.warmup.as_secs(),
        o.duration.as_secs(),
        dir.path().display()
    );

    println!(
        "| conns | CPU µs/req, no limits | CPU µs/req, four limits | ratio (median of pairs) | ratio p25–p75 | ratio min–max | added p50 µs (median) |"
    );
    println!("|---:|---:|---:|---:|---:|---:|---:|");
    for &conns in &o.concurrency {
        let mut ratios = Vec::with_capacity(o.pairs);
        let (mut cpu_plain, mut cpu_limited, mut p50_added) = (Vec::new(), Vec::new(), Vec::new());
        for pair in 0..o.pairs {
            // AB then BA: whichever side goes second in one pair goes first in the next.
            let order = if pair % 2 == 0 { [&plain, &limited] } else { [&limited, &plain] };
            let mut got: Vec<Sample> = Vec::with_capacity(2);
            for t in order {
                got.push(bench.measure(t, conns, o.warmup, o.duration).await?);
            }
            let (p, l) = if pair % 2 == 0 { (&got[0], &got[1]) } else { (&got[1], &got[0]) };
            if p.non_200 + l.non_200 > 0 {
                return Err(format!(
                    "c={conns} pair {pair}: {} non-200 answers (plain {}, limited {}): the \
                     figures would measure an error path",
                    p.non_200 + l.non_200,
                    p.non_200,
                    l.non_200
                ));
            }
            let (Some(pc), Some(lc)) = (p.proxy_cpu_us, l.proxy_cpu_us) else {
                return Err("node CPU not measured".into());
            };
            eprintln!(
                "  c={conns} pair {}: no limits {pc:.1} µs/req, four limits {lc:.1} µs/req (×{:.3})",
                pair + 1,
                lc / pc
            );
            ratios.push(lc / pc);
            cpu_plain.push(pc);
            cpu_limited.push(lc);
            p50_added.push(l.p50_us - p.p50_us);
        }
        println!(
            "| {conns} | {} | {} | {} | {}–{} | {}–{} | {} |",
            fmt(median(&cpu_plain), 1),
            fmt(median(&cpu_limited), 1),
            fmt(median(&ratios), 3),
            fmt(pct(&ratios, 0.25), 3),
            fmt(pct(&ratios, 0.75), 3),
            fmt(pct(&ratios, 0.0), 3),
            fmt(pct(&ratios, 1.0), 3),
            fmt(median(&p50_added), 1),
        );
    }
    println!(
        "\nThe limit path in-process (decide, write the rate headers, count the usage; median \
         of 5 × {PATH_CALLS} calls, the thread's CPU time): {path_ns:.0} ns per request."
    );
    Ok(())
}

/// Nanoseconds per request of the node's limit path on its own ledger: `admit`, the
/// `x-ratelimit-*` headers written into a response's header map, and `record` of the
/// served usage — everything a limited key does that a key without limits does not.
fn limit_path_ns() -> Result<f64> {
    let ledger = Ledger::new();
    let limits = Limits {
        rpm: Some(1_000_000_000_000),
        tpm: Some(1_000_000_000_000),
        tokens_per_day: Some(1_000_000_000_000),
        usd_per_day: Some(1_000_000_000.0),
    };
    let mut headers = http::HeaderMap::with_capacity(16);
    let mut reps = Vec::with_capacity(5);
    for _ in 0..5 {
        let start = thread_cpu_ns()?;
        for _ in 0..PATH_CALLS {
            headers.clear();
            let rate = match ledger.admit("key-bench", &limits, now_ms(), Instant::now()) {
                Decision::Admitted(rate) => rate,
                Decision::Blocked { headers, .. } => headers,
            };
            rate.write(&mut headers);
            ledger.record("key-bench", 12, 3, now_ms());
            std::hint::black_box(&headers);
        }
        reps.push(thread_cpu_ns()?.saturating_sub(start) as f64 / f64::from(PATH_CALLS));
    }
    Ok(median(&reps).unwrap_or(f64::NAN))
}
