//! A/B benchmarks of the node: the same load against two configurations that differ in one
//! thing, measured in `--pairs` alternating pairs (AB, BA, …) so that a slow drift of a
//! shared host lands on both sides equally; the report gives the median of the per-pair
//! CPU ratios with their spread.
//!
//! - `switchyard-bench limit-cost`: one node serves two keys, one with all four limits set
//!   (too high to bind) and one without. A second, in-process figure times the limit path
//!   itself (decide, write the rate headers, count the usage) on the node's own ledger: an
//!   upper bound on what the keys can differ by that no neighbour's noise can blur.
//! - `switchyard-bench otel-cost`: two nodes on one control plane, one exporting traces and
//!   log records to an OTLP endpoint where nothing listens (the collector is down), one with
//!   OpenTelemetry off.
//! - `switchyard-bench tls-cost`: TLS on the node's two network sides, each against the
//!   plaintext node in the same run: clients over HTTPS (keep-alive HTTP/1.1, so a
//!   connection's handshake is paid in the warm-up and the figure is the record layer's
//!   cost per request), and the node's config stream to a control plane over TLS (its own
//!   simulator and control plane: one embedded store serves one control plane).
//! - `switchyard-bench deployment-cost`: one node, a model of one deployment (A) against a
//!   model of three deployments on the same simulator (B, weighted; and again balanced by
//!   `least_latency`): what picking a deployment, its breaker and its in-flight count cost.
//! - `switchyard-bench build-cost --baseline PATH`: the request path of two builds — a node
//!   of `PATH` (A) and one of this build (B), both on this build's control plane — so a
//!   change's cost per request is measured against the build before it, in one run.

use std::sync::Arc;
use std::time::{Duration, Instant};

use bytes::Bytes;
use serde_json::json;

use switchyard_catalog::keys::Limits;
use switchyard_data_plane::limits::{Decision, Ledger};
use switchyard_time::now_ms;

use std::path::{Path, PathBuf};

use crate::catalog::{
    DEPLOYED, DEPLOYED_LEAST_LATENCY, PRIMARY, SECONDARY, catalog_with_deployments_yaml,
    catalog_yaml,
};
use crate::client::{Tls, connect_tls, get_status};
use crate::error::Result;
use crate::flags::{self, bounded};
use crate::fleet::{Fleet, FleetTls};
use crate::host::{self, thread_cpu_ns};
use crate::load::{Kind, Target};
use crate::overhead::{Bench, Sample};
use crate::proc::Proc;
use crate::stats::{fmt, median, pct};
use switchyard_test_support::pki::Ca;

/// Calls of the limit path timed in-process, per repetition.
const PATH_CALLS: u32 = 200_000;

struct Options {
    switchyard: std::path::PathBuf,
    /// `build-cost`: the other build's `switchyard`.
    baseline: Option<std::path::PathBuf>,
    concurrency: Vec<usize>,
    pairs: usize,
    warmup: Duration,
    duration: Duration,
}

/// The A/B comparisons' flags.
#[derive(clap::Args)]
#[command(args_override_self = true)]
pub struct Args {
    #[command(flatten)]
    switchyard: flags::Switchyard,
    /// `build-cost`: the `switchyard` binary of the build to compare with.
    #[arg(long, value_name = "PATH")]
    baseline: Option<PathBuf>,
    #[command(flatten)]
    concurrency: flags::Concurrency,
    /// Alternating pairs of measurements (AB, BA, …), 1–100.
    #[arg(long, value_name = "N", default_value = "8", value_parser = bounded::<usize>(1, 100))]
    pairs: usize,
    /// Warm-up before each measurement, in seconds (0–60).
    #[arg(long, value_name = "SECS", default_value = "1", value_parser = bounded::<u64>(0, 60))]
    warmup_secs: u64,
    /// Length of each measurement, in seconds (1–600).
    #[arg(long, value_name = "SECS", default_value = "3", value_parser = bounded::<u64>(1, 600))]
    duration_secs: u64,
}

fn options(a: Args) -> Result<Options> {
    Ok(Options {
        switchyard: a.switchyard.path()?,
        baseline: a.baseline,
        concurrency: a.concurrency.list,
        pairs: a.pairs,
        warmup: Duration::from_secs(a.warmup_secs),
        duration: Duration::from_secs(a.duration_secs),
    })
}

/// Which comparison to run.
#[derive(Clone, Copy, PartialEq, Eq)]
pub enum Compare {
    Limits,
    Otel,
    Tls,
    Build,
    Deployments,
}

pub fn main(compare: Compare, args: Args) -> Result<()> {
    let options = options(args)?;
    // The load generator's one thread, as in the default run.
    let runtime = host::runtime(host::Threads::Current)?;
    runtime.block_on(run(compare, options))
}

async fn run(compare: Compare, o: Options) -> Result<()> {
    let path_ns = match compare {
        Compare::Limits => Some(limit_path_ns()?),
        Compare::Otel | Compare::Tls | Compare::Build | Compare::Deployments => None,
    };

    let dir = tempfile::Builder::new()
        .prefix("switchyard-bench-ab-")
        .tempdir()
        .map_err(|e| format!("temp dir: {e}"))?;
    let catalog: fn(std::net::SocketAddr) -> String = match compare {
        Compare::Deployments => catalog_with_deployments_yaml,
        _ => catalog_yaml,
    };
    let fleet = Fleet::start(&o.switchyard, dir.path(), catalog).await?;
    let body = Bytes::from(
        json!({
            "model": PRIMARY,
            "fallback_models": [SECONDARY],
            "messages": [{"role": "user", "content": "Say hello."}],
        })
        .to_string(),
    );
    let target = |kind, node: &Proc, key: &str| {
        Arc::new(Target {
            kind,
            addr: node.addr,
            host: node.addr.to_string(),
            auth: Some(format!("Bearer {key}")),
            body: body.clone(),
            proxy_pid: Some(node.pid()),
            tls: None,
        })
    };
    // A: the configuration without the thing measured; B: with it (tls-cost has two Bs).
    let mut other_node = None;
    let mut kept = Kept::default();
    let mut extra: Vec<(&str, Arc<Target>)> = Vec::new();
    let (a, b, labels) = match compare {
        Compare::Limits => {
            let limited_key = fleet
                .limited_key
                .clone()
                .ok_or("this switchyard has no key limits (keys set-limits)")?;
            (
                target(Kind::NodeHealthy, &fleet.node, &fleet.key),
                target(Kind::NodeLimited, &fleet.node, &limited_key),
                ("no limits", "four limits"),
            )
        }
        Compare::Otel => {
            // A port that was free a moment ago: nothing answers there.
            let dead = std::net::TcpListener::bind("127.0.0.1:0")
                .and_then(|l| l.local_addr())
                .map_err(|e| format!("a free port: {e}"))?;
            let endpoint = format!("http://{dead}");
            let exporting = fleet
                .add_node_with_env(
                    &o.switchyard,
                    dir.path(),
                    "node-otel",
                    // gRPC, as the published figures were measured (before http/protobuf
                    // became the default).
                    &[
                        ("OTEL_EXPORTER_OTLP_ENDPOINT", &endpoint),
                        ("OTEL_EXPORTER_OTLP_PROTOCOL", "grpc"),
                    ],
                )
                .await?;
            let node = other_node.insert(exporting);
            (
                target(Kind::NodeHealthy, &fleet.node, &fleet.key),
                target(Kind::NodeHealthy, node, &fleet.key),
                ("OpenTelemetry off", "exporting to a dead endpoint"),
            )
        }
        Compare::Build => {
            let baseline =
                o.baseline.as_deref().filter(|p| p.is_file()).ok_or(
                    "build-cost needs --baseline PATH, a `switchyard` binary to compare with",
                )?;
            let node = other_node
                .insert(fleet.add_node_with_env(baseline, dir.path(), "node-baseline", &[]).await?);
            (
                target(Kind::NodeHealthy, node, &fleet.key),
                target(Kind::NodeHealthy, &fleet.node, &fleet.key),
                ("baseline build", "this build"),
            )
        }
        Compare::Deployments => {
            let [single, weighted, least_latency] = deployment_targets(&fleet);
            extra.push(("three deployments, least_latency", least_latency));
            (single, weighted, ("one deployment", "three deployments, weighted"))
        }
        Compare::Tls => {
            tls_nodes(&o.switchyard, dir.path(), &fleet, &mut kept).await?;
            let (Some(https), Some(tls_fleet)) = (&kept.https_node, &kept.fleet) else {
                return Err("the TLS nodes did not start".into());
            };
            let mut https_target = target(Kind::NodeHealthy, https, &fleet.key);
            if let Some(t) = Arc::get_mut(&mut https_target) {
                t.tls = kept.client.clone();
            }
            let stream = target(Kind::NodeHealthy, &tls_fleet.node, &tls_fleet.key);
            extra.push(("config stream over TLS", stream));
            (
                target(Kind::NodeHealthy, &fleet.node, &fleet.key),
                https_target,
                ("plaintext", "clients over HTTPS"),
            )
        }
    };
    let bench = Bench::new(&fleet)?;
    eprintln!(
        "switchyard-bench: A = {}, B = {}; {} pair(s) × concurrency {:?}, {} s warm-up + {} s each; logs in {}",
        labels.0,
        labels.1,
        o.pairs,
        o.concurrency,
        o.warmup.as_secs(),
        o.duration.as_secs(),
        dir.path().display()
    );

    let variants: Vec<(&str, Arc<Target>)> = std::iter::once((labels.1, b)).chain(extra).collect();
    for (b_label, b) in &variants {
        if variants.len() > 1 {
            println!("\nB = {b_label}:\n");
        }
        println!(
            "| conns | A: CPU µs/req, {} | B: CPU µs/req, {} | B/A (median of pairs) | B/A p25–p75 | B/A min–max | B's added p50 µs (median) |",
            labels.0, b_label
        );
        println!("|---:|---:|---:|---:|---:|---:|---:|");
        for &conns in &o.concurrency {
            let mut ratios = Vec::with_capacity(o.pairs);
            let (mut cpu_a, mut cpu_b, mut p50_added) = (Vec::new(), Vec::new(), Vec::new());
            for pair in 0..o.pairs {
                // AB then BA: whichever side goes second in one pair goes first in the next.
                let order = if pair % 2 == 0 { [&a, b] } else { [b, &a] };
                let mut got: Vec<Sample> = Vec::with_capacity(2);
                for t in order {
                    got.push(bench.measure(t, conns, o.warmup, o.duration).await?);
                }
                let (sa, sb) = if pair % 2 == 0 { (&got[0], &got[1]) } else { (&got[1], &got[0]) };
                if sa.non_200 + sb.non_200 > 0 {
                    return Err(format!(
                        "c={conns} pair {pair}: {} non-200 answers (A {}, B {}): the figures would \
                         measure an error path",
                        sa.non_200 + sb.non_200,
                        sa.non_200,
                        sb.non_200
                    ));
                }
                let (Some(ca), Some(cb)) = (sa.proxy_cpu_us, sb.proxy_cpu_us) else {
                    return Err("node CPU not measured".into());
                };
                eprintln!(
                    "  c={conns} pair {}: A {ca:.1} µs/req, B {cb:.1} µs/req (×{:.3})",
                    pair + 1,
                    cb / ca
                );
                ratios.push(cb / ca);
                cpu_a.push(ca);
                cpu_b.push(cb);
                p50_added.push(sb.p50_us - sa.p50_us);
            }
            println!(
                "| {conns} | {} | {} | {} | {}–{} | {}–{} | {} |",
                fmt(median(&cpu_a), 1),
                fmt(median(&cpu_b), 1),
                fmt(median(&ratios), 3),
                fmt(pct(&ratios, 0.25), 3),
                fmt(pct(&ratios, 0.75), 3),
                fmt(pct(&ratios, 0.0), 3),
                fmt(pct(&ratios, 1.0), 3),
                fmt(median(&p50_added), 1),
            );
        }
    }
    if let Some(path_ns) = path_ns {
        println!(
            "\nThe limit path in-process (decide, write the rate headers, count the usage; \
             median of 5 × {PATH_CALLS} calls, the thread's CPU time): {path_ns:.0} ns per request."
        );
    }
    drop(other_node);
    drop(kept);
    Ok(())
}

/// `deployment-cost`'s targets on `fleet`'s node: the primary (one deployment), then the
/// models of three deployments, weighted and `least_latency`; each with the secondary as
/// fallback, as every A/B body has.
fn deployment_targets(fleet: &Fleet) -> [Arc<Target>; 3] {
    [PRIMARY, DEPLOYED, DEPLOYED_LEAST_LATENCY].map(|model| {
        let body = json!({
            "model": model,
            "fallback_models": [SECONDARY],
            "messages": [{"role": "user", "content": "Say hello."}],
        });
        Arc::new(Target {
            kind: Kind::NodeHealthy,
            addr: fleet.node.addr,
            host: fleet.node.addr.to_string(),
            auth: Some(format!("Bearer {}", fleet.key)),
            body: Bytes::from(body.to_string()),
            proxy_pid: Some(fleet.node.pid()),
            tls: None,
        })
    })
}

/// What `tls-cost` starts beside the plaintext fleet, kept alive for the whole run.
#[derive(Default)]
struct Kept {
    /// The certificates' files.
    ca: Option<Ca>,
    /// The load generator's TLS to the HTTPS node.
    client: Option<Tls>,
    /// The node serving HTTPS, on the plaintext control plane.
    https_node: Option<Proc>,
    /// A simulator, a control plane serving TLS and a node whose config stream is TLS.
    fleet: Option<Fleet>,
}

/// Starts the two TLS nodes of `tls-cost`: one serving HTTPS on `fleet`'s control plane,
/// and one of a second fleet whose control plane serves TLS (its node's config stream is
/// TLS, its listener plaintext), into `kept`.
async fn tls_nodes(bin: &Path, dir: &Path, fleet: &Fleet, kept: &mut Kept) -> Result<()> {
    let ca = kept.ca.insert(Ca::new("switchyard-bench CA"));
    let node_leaf = ca.leaf("node", &["localhost", "127.0.0.1"]);
    let control_leaf = ca.leaf("control", &["localhost", "127.0.0.1"]);
    let tls = Tls::new(ca.cert_path(), "localhost")?;
    let (cert, key) = (node_leaf.cert.display().to_string(), node_leaf.key.display().to_string());
    let data = dir.join("node-https").display().to_string();
    let node = Proc::start(
        bin,
        &[
            "node",
            "--control",
            &fleet.control,
            "--listen",
            "127.0.0.1:0",
            "--data-dir",
            &data,
            "--tls-cert",
            &cert,
            "--tls-key",
            &key,
        ],
        &[],
        &dir.join("node-https.log"),
    )?;
    wait_ready_tls(node.addr, &tls).await?;
    kept.client = Some(tls);
    let tls_dir = dir.join("tls-fleet");
    std::fs::create_dir_all(&tls_dir).map_err(|e| format!("{}: {e}", tls_dir.display()))?;
    let store = format!("file://{}", tls_dir.join("store").display());
    let files = FleetTls { ca: ca.cert_path(), cert: &control_leaf.cert, key: &control_leaf.key };
    let tls_fleet =
        Fleet::start_with(bin, &tls_dir, &store, catalog_yaml, &[], Some(&files)).await?;
    kept.https_node = Some(node);
    kept.fleet = Some(tls_fleet);
    Ok(())
}

/// Polls the HTTPS node's `/readyz` until 200 (its first config applied), for 20 s at most.
async fn wait_ready_tls(addr: std::net::SocketAddr, tls: &Tls) -> Result<()> {
    let by = Instant::now() + Duration::from_secs(20);
    loop {
        if let Ok(mut sender) = connect_tls(addr, tls).await
            && let Ok(200) = get_status(&mut sender, "localhost", "/readyz", None).await
        {
            return Ok(());
        }
        if Instant::now() > by {
            return Err(format!("{addr}: the HTTPS node's /readyz not 200 within 20 s"));
        }
        tokio::time::sleep(Duration::from_millis(50)).await;
    }
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
