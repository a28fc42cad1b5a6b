//! `switchyard-bench`: one run measures, at the same concurrency, the simulator called
//! directly (the limit), a bare hyper pass-through proxy that forwards bytes without parsing
//! them (the floor of one Rust proxy hop), and the node with its primary healthy and with
//! its primary always failing (breaker open, served by the fallback).
//!
//! It builds nothing: it starts the release `switchyard` binary found next to itself (or
//! `--switchyard PATH`) as sim, control plane and node on loopback with temporary
//! directories, and re-executes itself as `switchyard-bench passthrough` so the
//! pass-through's CPU time is measurable from /proc like the node's. `--surfaces` adds
//! Messages, Responses and embeddings requests (`/v1/messages`, `/v1/responses`,
//! `/v1/embeddings`, native and translated, each with its pass-through floor); `--baseline-switchyard PATH` a node of another build beside this one's. See
//! docs/BENCHMARKS.md for what each column means.

use std::net::SocketAddr;
use std::path::PathBuf;
use std::process::ExitCode;
use std::time::Duration;

mod ab;
mod backend;
mod catalog;
mod chaos;
mod client;
mod error;
mod fanout;
mod flags;
mod fleet;
mod fleet_breaker;
mod host;
mod keys;
mod limits;
mod load;
mod overhead;
mod passthrough;
mod proc;
mod retry_storm;
mod stats;
mod storm;
mod streams;
mod translate;

use error::Result;
use overhead::Options;

const USAGE: &str = "usage: switchyard-bench [--switchyard PATH] [--concurrency 1,32] \
[--warmup-secs 2] [--duration-secs 5] [--runs 3] [--max-steal-pct 5] [--surfaces] \
[--baseline-switchyard PATH]
       switchyard-bench keys [--count 100000] [--store embedded,etcd] [--runs 3] [--changes 5]
       switchyard-bench fleet [--nodes 1000] [--store embedded,etcd] [--changes 20] [--slow 100] [--keys 0]
       switchyard-bench fleet-breaker [--nodes 10] [--clients 3] [--rps 5] [--hot-rps N] [--rounds 3] [--observe-secs 20] [--fleet off,on] [--json]
       switchyard-bench streams [--streams 2000] [--chunks 200] [--chunk-delay-ms 20] [--runs 3] [--prefill]
       switchyard-bench translate [--runs 5] [--ms 200] [--no-e2e] [--conns 1] [--e2e-secs 4]
       switchyard-bench retries [--requests 3000] [--concurrency 8] [--models 16]
       switchyard-bench limits [--nodes 3] [--rpm 6000] [--concurrency 12] [--duration-secs 75]
       switchyard-bench limit-cost|otel-cost|tls-cost|deployment-cost [--concurrency 1,8] [--pairs 8] [--warmup-secs 1] [--duration-secs 3]
       switchyard-bench build-cost --baseline PATH [--concurrency 1,8] [--pairs 8] [--warmup-secs 1] [--duration-secs 3]
       switchyard-bench chaos --baseline PATH [--concurrency 1,8] [--runs 3] [--nodes 3] [--changes 20]
       switchyard-bench storm [--concurrency 32] [--duration-secs 60] [--outage-secs 120] [--store embedded,etcd]
       switchyard-bench passthrough --listen ADDR --upstream ADDR   (started by the bench)";

/// A concurrency's targets are measured again when the hypervisor took more than this share
/// of the machine's CPU time (steal) during any of them (`--max-steal-pct`).
const DEFAULT_MAX_STEAL_PCT: f64 = 5.0;

/// The same allocator as the `switchyard` binary, so the pass-through floor and the node
/// differ by their work, not by their malloc.
#[global_allocator]
static ALLOCATOR: mimalloc::MiMalloc = mimalloc::MiMalloc;

fn main() -> ExitCode {
    let args: Vec<String> = std::env::args().skip(1).collect();
    let result = match args.first().map(String::as_str) {
        Some("passthrough") => parse_passthrough(&args[1..])
            .and_then(|(listen, upstream)| passthrough::main(listen, upstream)),
        Some("keys") => keys::main(&args[1..]),
        Some("fleet") => fanout::main(&args[1..]),
        Some("fleet-breaker") => fleet_breaker::main(&args[1..]),
        Some("streams") => streams::main(&args[1..]),
        Some("translate") => translate::main(&args[1..]),
        Some("chaos") => chaos::main(&args[1..]),
        Some("retries") => retry_storm::main(&args[1..]),
        Some("limits") => limits::main(&args[1..]),
        Some("limit-cost") => ab::main(ab::Compare::Limits, &args[1..]),
        Some("otel-cost") => ab::main(ab::Compare::Otel, &args[1..]),
        Some("build-cost") => ab::main(ab::Compare::Build, &args[1..]),
        Some("deployment-cost") => ab::main(ab::Compare::Deployments, &args[1..]),
        Some("tls-cost") => ab::main(ab::Compare::Tls, &args[1..]),
        Some("storm") => storm::main(&args[1..]),
        Some("-h" | "--help") => {
            println!("{USAGE}");
            Ok(())
        }
        _ => parse_options(&args).and_then(overhead::main),
    };
    match result {
        Ok(()) => ExitCode::SUCCESS,
        Err(e) => {
            eprintln!("switchyard-bench: {e}");
            ExitCode::FAILURE
        }
    }
}

fn parse_options(args: &[String]) -> Result<Options> {
    let mut switchyard = None;
    let mut concurrency = vec![1, 32];
    let mut warmup = Duration::from_secs(2);
    let mut duration = Duration::from_secs(5);
    let mut runs = 3;
    let mut max_steal_pct = DEFAULT_MAX_STEAL_PCT;
    let mut surfaces = false;
    let mut baseline = None;
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
            "--surfaces" => surfaces = true,
            "--baseline-switchyard" => {
                let path = PathBuf::from(value()?);
                if !path.is_file() {
                    return Err(format!(
                        "--baseline-switchyard: {} is not a file (the `switchyard` binary of the build to compare with)",
                        path.display()
                    ));
                }
                baseline = Some(path);
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
    Ok(Options {
        switchyard,
        concurrency,
        warmup,
        duration,
        runs,
        max_steal_pct,
        surfaces,
        baseline,
    })
}

/// `passthrough --listen ADDR --upstream ADDR`, both on loopback.
fn parse_passthrough(args: &[String]) -> Result<(SocketAddr, SocketAddr)> {
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
    Ok((listen, upstream))
}
