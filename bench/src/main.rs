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

use clap::{Parser, Subcommand};

use error::Result;
use overhead::Options;

/// A concurrency's targets are measured again when the hypervisor took more than this share
/// of the machine's CPU time (steal) during any of them (`--max-steal-pct`).
const DEFAULT_MAX_STEAL_PCT: f64 = 5.0;

/// The same allocator as the `switchyard` binary, so the pass-through floor and the node
/// differ by their work, not by their malloc.
#[global_allocator]
static ALLOCATOR: mimalloc::MiMalloc = mimalloc::MiMalloc;

/// What a node costs per request, and the benchmarks behind docs/BENCHMARKS.md. Without a
/// subcommand: the simulator direct, a bare pass-through and the node, at each concurrency.
#[derive(Parser)]
#[command(
    name = "switchyard-bench",
    args_conflicts_with_subcommands = true,
    args_override_self = true
)]
struct Cli {
    #[command(subcommand)]
    command: Option<Command>,
    #[command(flatten)]
    run: RunArgs,
}

#[derive(Subcommand)]
enum Command {
    /// The control plane with many keys: start-up, snapshot and change latency per store.
    Keys(keys::Args),
    /// Many nodes on one control plane: how fast a change reaches them all.
    Fleet(fanout::Args),
    /// The fleet's breakers: failed requests before every node skips a dead deployment.
    FleetBreaker(fleet_breaker::Args),
    /// Many concurrent streams through one node.
    Streams(streams::Args),
    /// What translating between wire formats costs per request.
    Translate(translate::Args),
    /// Fault injection: its cost per request, and how fast a fault reaches a fleet.
    Chaos(chaos::Args),
    /// A retry storm, bounded by the retry budget.
    Retries(retry_storm::Args),
    /// A key's limit under load, over several nodes.
    Limits(limits::Args),
    /// A/B: a key with limits against one without.
    LimitCost(ab::Args),
    /// A/B: OpenTelemetry exporting to a collector that is down, against it off.
    OtelCost(ab::Args),
    /// A/B: a node of another build (`--baseline PATH`) against one of this build.
    BuildCost(ab::Args),
    /// A/B: a model of three deployments against a model of one.
    DeploymentCost(ab::Args),
    /// A/B: TLS on the node's two network sides against plaintext.
    TlsCost(ab::Args),
    /// Failover events during a control-plane outage.
    Storm(storm::Args),
    /// The bare pass-through proxy (started by the default run).
    #[command(hide = true)]
    Passthrough(passthrough::Args),
}

/// The default run's flags.
#[derive(clap::Args)]
struct RunArgs {
    #[command(flatten)]
    switchyard: flags::Switchyard,
    /// Concurrencies to measure, comma-separated (each 1–1024).
    #[arg(long, value_name = "N,N", value_delimiter = ',', default_value = "1,32",
        value_parser = flags::bounded::<usize>(1, 1024))]
    concurrency: Vec<usize>,
    /// Warm-up before each measurement, in seconds.
    #[arg(long, value_name = "SECS", default_value = "2", value_parser = flags::secs)]
    warmup_secs: Duration,
    /// Length of each measurement, in seconds.
    #[arg(long, value_name = "SECS", default_value = "5", value_parser = flags::secs)]
    duration_secs: Duration,
    /// Runs per target (1–20); the tables give medians.
    #[arg(long, value_name = "N", default_value = "3", value_parser = flags::bounded::<usize>(1, 20))]
    runs: usize,
    /// Measure a concurrency again when the hypervisor took more than this share of CPU
    /// time (steal), in (0, 100].
    #[arg(long, value_name = "PCT", default_value_t = DEFAULT_MAX_STEAL_PCT, value_parser = steal_pct)]
    max_steal_pct: f64,
    /// Add Messages, Responses and embeddings requests, native and translated.
    #[arg(long)]
    surfaces: bool,
    /// A node of another build beside this one's: its `switchyard` binary.
    #[arg(long, value_name = "PATH")]
    baseline_switchyard: Option<PathBuf>,
}

fn steal_pct(v: &str) -> std::result::Result<f64, String> {
    v.parse::<f64>()
        .ok()
        .filter(|p| *p > 0.0 && *p <= 100.0)
        .ok_or_else(|| format!("expected a percentage in (0, 100], got {v:?}"))
}

fn main() -> ExitCode {
    let cli = Cli::parse();
    let result = match cli.command {
        Some(Command::Passthrough(args)) => {
            args.addrs().and_then(|(listen, upstream)| passthrough::main(listen, upstream))
        }
        Some(Command::Keys(args)) => keys::main(args),
        Some(Command::Fleet(args)) => fanout::main(args),
        Some(Command::FleetBreaker(args)) => fleet_breaker::main(args),
        Some(Command::Streams(args)) => streams::main(args),
        Some(Command::Translate(args)) => translate::main(args),
        Some(Command::Chaos(args)) => chaos::main(args),
        Some(Command::Retries(args)) => retry_storm::main(args),
        Some(Command::Limits(args)) => limits::main(args),
        Some(Command::LimitCost(args)) => ab::main(ab::Compare::Limits, args),
        Some(Command::OtelCost(args)) => ab::main(ab::Compare::Otel, args),
        Some(Command::BuildCost(args)) => ab::main(ab::Compare::Build, args),
        Some(Command::DeploymentCost(args)) => ab::main(ab::Compare::Deployments, args),
        Some(Command::TlsCost(args)) => ab::main(ab::Compare::Tls, args),
        Some(Command::Storm(args)) => storm::main(args),
        None => options(cli.run).and_then(overhead::main),
    };
    match result {
        Ok(()) => ExitCode::SUCCESS,
        Err(e) => {
            eprintln!("switchyard-bench: {e}");
            ExitCode::FAILURE
        }
    }
}

fn options(a: RunArgs) -> Result<Options> {
    if let Some(path) = &a.baseline_switchyard
        && !path.is_file()
    {
        return Err(format!(
            "--baseline-switchyard: {} is not a file (the `switchyard` binary of the build to compare with)",
            path.display()
        ));
    }
    Ok(Options {
        switchyard: a.switchyard.existing()?,
        concurrency: a.concurrency,
        warmup: a.warmup_secs,
        duration: a.duration_secs,
        runs: a.runs,
        max_steal_pct: a.max_steal_pct,
        surfaces: a.surfaces,
        baseline: a.baseline_switchyard,
    })
}

#[cfg(test)]
mod tests {
    #![allow(clippy::unwrap_used)]
    use super::*;

    /// Every `switchyard-bench` command line in docs/BENCHMARKS.md's code blocks, as words.
    fn documented() -> Vec<Vec<String>> {
        let doc = include_str!("../../docs/BENCHMARKS.md");
        let mut lines = Vec::new();
        let mut in_code = false;
        let mut pending = String::new();
        for line in doc.lines() {
            if line.starts_with("```") {
                in_code = !in_code;
                continue;
            }
            if !in_code {
                continue;
            }
            let code = line.split(" #").next().unwrap_or("").trim_end();
            pending.push_str(code.strip_suffix('\\').unwrap_or(code));
            pending.push(' ');
            if code.ends_with('\\') {
                continue;
            }
            let command = std::mem::take(&mut pending);
            if let Some(at) = command.find("target/release/switchyard-bench") {
                lines.push(command[at..].split_whitespace().map(str::to_owned).collect());
            } else if let Some(at) = command.find("target/debug/switchyard-bench") {
                lines.push(command[at..].split_whitespace().map(str::to_owned).collect());
            }
        }
        lines
    }

    #[test]
    fn every_documented_command_line_parses() {
        let lines = documented();
        assert!(lines.len() >= 20, "found only {} command lines", lines.len());
        for words in lines {
            if let Err(e) = Cli::try_parse_from(&words) {
                panic!("{}: {e}", words.join(" "));
            }
        }
    }

    #[test]
    fn a_bad_value_is_refused_naming_its_flag() {
        for words in [
            &["switchyard-bench", "--runs", "0"][..],
            &["switchyard-bench", "--concurrency", "1,2000"],
            &["switchyard-bench", "fleet", "--store", "sqlite"],
            &["switchyard-bench", "fleet-breaker", "--fleet", "maybe"],
            &["switchyard-bench", "streams", "--chunks", "x"],
            &["switchyard-bench", "storm", "--duration-secs", "1"],
        ] {
            let flag = words[words.len() - 2];
            let Err(e) = Cli::try_parse_from(words) else {
                panic!("{} was accepted", words.join(" "));
            };
            assert!(e.to_string().contains(flag), "{}: {e}", words.join(" "));
            assert_ne!(e.exit_code(), 0);
        }
    }

    #[test]
    fn the_defaults_are_the_documented_ones() {
        let cli = Cli::try_parse_from(["switchyard-bench"]).unwrap();
        assert!(cli.command.is_none());
        assert_eq!(cli.run.concurrency, [1, 32]);
        assert_eq!(cli.run.warmup_secs, Duration::from_secs(2));
        assert_eq!(cli.run.duration_secs, Duration::from_secs(5));
        assert_eq!(cli.run.runs, 3);
        assert_eq!(cli.run.max_steal_pct, DEFAULT_MAX_STEAL_PCT);
    }

    #[test]
    fn a_subcommands_flags_belong_to_it() {
        // The default run's flags are not a subcommand's, nor the other way round.
        assert!(Cli::try_parse_from(["switchyard-bench", "--surfaces", "keys"]).is_err());
        assert!(Cli::try_parse_from(["switchyard-bench", "--pairs", "4"]).is_err());
        assert!(Cli::try_parse_from(["switchyard-bench", "limit-cost", "--pairs", "4"]).is_ok());
        // `file` is the embedded store's other name.
        assert!(Cli::try_parse_from(["switchyard-bench", "keys", "--store", "file,etcd"]).is_ok());
    }
}
