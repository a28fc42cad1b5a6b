//! `switchyard-bench fleet`: one control plane serving `--nodes` node streams (the scale
//! goals of docs/BENCHMARKS.md, "The goals, and what they mean": a thousand nodes; one change
//! acked by all of them in under 1 s p99; the control plane under 2 GiB).
//!
//! Per store: a control plane started (etcd through the harness's throw-away etcd, as
//! `keys` does), `--nodes` lean node clients connected from this process
//! (switchyard-test-support's `node_fleet`: real `NodeControl.Connect` streams, each on its own
//! connection, acking what they receive) and at the current version. Then `--changes` keys
//! created through the admin API, one at a time, each timed from the request until every
//! node had it; the control plane's VmRSS/VmHWM and CPU ticks, and the store revisions
//! (every store write is one) per change. Then the same with `--slow` of the nodes not
//! reading their stream: the fast nodes' times; more changes (untimed) until every slow
//! stream has fallen behind its queue bound (the control plane's
//! `switchyard_control_node_resyncs_total`), and once the slow nodes read again, how long
//! until they had the last version; the resync count says they were resynced rather than
//! buffered for.

use std::path::PathBuf;
use std::time::{Duration, Instant};

use switchyard_proto::admin::v1::{self as admin, admin_client::AdminClient};
use tonic::transport::Channel;

use crate::backend::{Backend, Stores};
use crate::error::Result;
use crate::flags::{self, bounded};
use crate::host::{self, clock_ticks, cpu_ticks, mib, status_kib};
use crate::proc::Proc;
use crate::stats::{fmt, pct, sum_metric};
use switchyard_test_support::etcd;
use switchyard_test_support::node_fleet::{FleetNode, connect_fleet, time_to_all, wait_all};

/// How long every node may take to have one change before the run fails.
const CHANGE_LIMIT: Duration = Duration::from_secs(60);
/// Untimed changes at most while waiting for the slow nodes to fall behind.
const MAX_FILLER: usize = 5_000;

struct Options {
    switchyard: PathBuf,
    nodes: usize,
    backends: Vec<Backend>,
    changes: usize,
    slow: usize,
    /// Keys created before the nodes connect: the size of each node's snapshot.
    keys: usize,
}

/// `switchyard-bench fleet`'s flags.
#[derive(clap::Args)]
#[command(args_override_self = true)]
pub struct Args {
    #[command(flatten)]
    switchyard: flags::Switchyard,
    /// Nodes connected to the control plane (1–10000).
    #[arg(long, value_name = "N", default_value = "1000", value_parser = bounded::<usize>(1, 10_000))]
    nodes: usize,
    #[command(flatten)]
    store: Stores,
    /// Changes timed to every node (1–1000).
    #[arg(long, value_name = "N", default_value = "20", value_parser = bounded::<usize>(1, 1_000))]
    changes: usize,
    /// Nodes that read their stream slowly (0–10000, below --nodes).
    #[arg(long, value_name = "N", default_value = "100", value_parser = bounded::<usize>(0, 10_000))]
    slow: usize,
    /// Keys created before the nodes connect: the size of each node's snapshot (0–1000000).
    #[arg(long, value_name = "N", default_value = "0", value_parser = bounded::<usize>(0, 1_000_000))]
    keys: usize,
}

fn options(a: Args) -> Result<Options> {
    let o = Options {
        switchyard: a.switchyard.existing()?,
        nodes: a.nodes,
        backends: a.store.list,
        changes: a.changes,
        slow: a.slow,
        keys: a.keys,
    };
    if o.slow >= o.nodes {
        return Err(format!("--slow {} must be below --nodes {}", o.slow, o.nodes));
    }
    Ok(o)
}

pub fn main(args: Args) -> Result<()> {
    let options = options(args)?;
    // Every node client lives on this runtime; two workers, like the machine's two cores.
    let rt = host::runtime(host::Threads::Two)?;
    rt.block_on(run(options))
}

/// One phase's figures (all nodes reading, or with the slow group stalled).
#[derive(Default)]
struct Phase {
    /// Request sent → the last (fast) node had the change, per change, ms.
    all_ms: Vec<f64>,
    rss_mib: f64,
    hwm_mib: f64,
    cpu_ms_per_change: f64,
    store_writes_per_change: f64,
}

#[derive(Default)]
struct Slow {
    /// Changes (timed and untimed) until every slow stream had fallen behind, if it did.
    behind_after: Option<usize>,
    /// Reading again → every slow node had the last version, ms.
    caught_up_ms: f64,
    /// The control plane's resync count during the phase (`None`: it has no such metric).
    resyncs: Option<u64>,
}

struct Row {
    backend: Backend,
    connect_ms: f64,
    all: Phase,
    slowed: Phase,
    slow: Slow,
}

async fn run(o: Options) -> Result<()> {
    let ticks = clock_ticks() as f64;
    let mut rows = Vec::new();
    for &backend in &o.backends {
        eprintln!("switchyard-bench fleet: {} with {} nodes", backend.label(), o.nodes);
        rows.push(one(&o, backend, ticks).await?);
    }
    println!(
        "### Fleet: one control plane, {} nodes, {} keys, {} changes per phase ({} slow in the second)\n",
        o.nodes, o.keys, o.changes, o.slow
    );
    println!(
        "| store | phase | connect all ms | change → all nodes ms p50 | p99 | max | control VmRSS MiB | VmHWM MiB | control CPU ms/change | store writes/change | slow behind after changes | slow caught up ms | streams resynced |"
    );
    println!("|---|---|---:|---:|---:|---:|---:|---:|---:|---:|---:|---:|---:|");
    for r in &rows {
        for (phase, p, slow) in
            [("all reading", &r.all, None), ("slow stalled", &r.slowed, Some(&r.slow))]
        {
            println!(
                "| {} | {phase} | {} | {} | {} | {} | {} | {} | {} | {} | {} | {} | {} |",
                r.backend.label(),
                if slow.is_none() { fmt(Some(r.connect_ms), 0) } else { String::new() },
                fmt(pct(&p.all_ms, 0.5), 1),
                fmt(pct(&p.all_ms, 0.99), 1),
                fmt(p.all_ms.iter().copied().reduce(f64::max), 1),
                fmt(Some(p.rss_mib), 1),
                fmt(Some(p.hwm_mib), 1),
                fmt(Some(p.cpu_ms_per_change), 2),
                fmt(Some(p.store_writes_per_change), 2),
                slow.map_or(String::new(), |s| s
                    .behind_after
                    .map_or_else(|| "not behind".to_owned(), |n| n.to_string())),
                slow.map_or(String::new(), |s| fmt(Some(s.caught_up_ms), 0)),
                slow.map_or(String::new(), |s| s
                    .resyncs
                    .map_or_else(|| "no metric".to_owned(), |n| format!("{n} of {}", o.slow))),
            );
        }
    }
    println!();
    Ok(())
}

async fn one(o: &Options, backend: Backend, ticks: f64) -> Result<Row> {
    let dir = tempfile::Builder::new()
        .prefix("switchyard-bench-fleet-")
        .tempdir()
        .map_err(|e| format!("temp dir: {e}"))?;
    let d = dir.path();
    // Declared before anything that talks to it, so it outlives them (dropped last).
    let etcd = match backend {
        Backend::Etcd => Some(etcd::EtcdProcess::start().await),
        Backend::Embedded => None,
    };
    let store_url = match &etcd {
        Some(e) => format!("etcd://{}", e.endpoint().trim_start_matches("http://")),
        None => format!("file://{}", d.join("store").display()),
    };
    let token = format!("bench-admin-token-{}", std::process::id());
    let cp = crate::fleet::start_control(
        &o.switchyard,
        &store_url,
        "127.0.0.1:0",
        &token,
        &d.join("control.log"),
    )?;
    let control = format!("http://{}", cp.addr);
    let mut admin = Admin::connect(&control, &token).await?;
    let seeding = Instant::now();
    for i in 0..o.keys {
        admin.create_key(&format!("bench-seed-{i:07}")).await?;
    }
    if o.keys > 0 {
        eprintln!("  {} keys created in {:.1} s", o.keys, seeding.elapsed().as_secs_f64());
    }
    let first = admin.create_key("bench-before-the-fleet").await?;
    let (rss0, hwm0) = (mib(status_kib(cp.pid(), "VmRSS")?), mib(status_kib(cp.pid(), "VmHWM")?));

    let started = Instant::now();
    let nodes = connect_fleet(&control, "bench", o.nodes, 64).await?;
    wait_all(&nodes, first, CHANGE_LIMIT).await?;
    let connect_ms = started.elapsed().as_secs_f64() * 1e3;
    eprintln!(
        "  {} nodes connected and at version {first} in {connect_ms:.0} ms; control VmRSS {rss0:.1} → {:.1} MiB, VmHWM {hwm0:.1} → {:.1} MiB",
        o.nodes,
        mib(status_kib(cp.pid(), "VmRSS")?),
        mib(status_kib(cp.pid(), "VmHWM")?)
    );
    // Let the connection burst (presence, breaker adoption) settle before measuring.
    tokio::time::sleep(Duration::from_secs(2)).await;

    let all = phase(o, &cp, &mut admin, &nodes, "all", ticks).await?;
    eprintln!(
        "  all reading: p50 {} ms, p99 {} ms",
        fmt(pct(&all.all_ms, 0.5), 1),
        fmt(pct(&all.all_ms, 0.99), 1)
    );

    let (slow_nodes, fast) = nodes.split_at(o.slow);
    for node in slow_nodes {
        node.pause();
    }
    let resyncs_before = resyncs(&control).await;
    let slowed = phase(o, &cp, &mut admin, fast, "slow", ticks).await?;
    let mut slow = Slow::default();
    // More changes, untimed, until every slow stream has fallen behind (or give up).
    let mut changes = o.changes;
    let mut last = nodes.iter().map(FleetNode::version).max().unwrap_or(0);
    if let Some(before) = resyncs_before {
        while changes < o.changes + MAX_FILLER && o.slow > 0 {
            let now = resyncs(&control).await.unwrap_or(0);
            if now >= before + o.slow as u64 {
                slow.behind_after = Some(changes);
                break;
            }
            last = admin.create_key(&format!("bench-filler-{changes}")).await?;
            changes += 1;
            wait_all(fast, last, CHANGE_LIMIT).await?;
        }
    }
    let (rss, hwm) = (mib(status_kib(cp.pid(), "VmRSS")?), mib(status_kib(cp.pid(), "VmHWM")?));
    eprintln!(
        "  slow stalled: fast p50 {} ms, p99 {} ms; behind after {:?} changes; control VmRSS {rss:.1} MiB, VmHWM {hwm:.1} MiB",
        fmt(pct(&slowed.all_ms, 0.5), 1),
        fmt(pct(&slowed.all_ms, 0.99), 1),
        slow.behind_after
    );
    let resumed = Instant::now();
    for node in slow_nodes {
        node.resume();
    }
    wait_all(slow_nodes, last, CHANGE_LIMIT).await?;
    slow.caught_up_ms = resumed.elapsed().as_secs_f64() * 1e3;
    slow.resyncs = match (resyncs_before, resyncs(&control).await) {
        (Some(a), Some(b)) => Some(b.saturating_sub(a)),
        _ => None,
    };
    drop(nodes);
    drop(cp);
    drop(etcd);
    Ok(Row { backend, connect_ms, all, slowed, slow })
}

/// `--changes` key creations, each timed until every node of `nodes` had it.
async fn phase(
    o: &Options,
    cp: &Proc,
    admin: &mut Admin,
    nodes: &[FleetNode],
    name: &str,
    ticks: f64,
) -> Result<Phase> {
    let mut p = Phase::default();
    let cpu_before = cpu_ticks(cp.pid())?;
    let mut first_version = None;
    let mut last_version = 0;
    for i in 0..o.changes {
        let sent = Instant::now();
        let version = admin.create_key(&format!("bench-{name}-{i}")).await?;
        wait_all(nodes, version, CHANGE_LIMIT).await?;
        let took = time_to_all(nodes, version, sent).ok_or("a node lost its receipt times")?;
        p.all_ms.push(took.as_secs_f64() * 1e3);
        first_version.get_or_insert(version);
        last_version = version;
    }
    let cpu = cpu_ticks(cp.pid())?.saturating_sub(cpu_before) as f64;
    p.cpu_ms_per_change = cpu / ticks * 1e3 / o.changes as f64;
    // Every store write is one revision: what happened between the first and the last
    // change (the changes themselves, presence, anything else), per change.
    if o.changes > 1 {
        let span = last_version - first_version.unwrap_or(last_version);
        p.store_writes_per_change = span as f64 / (o.changes - 1) as f64;
    }
    p.rss_mib = mib(status_kib(cp.pid(), "VmRSS")?);
    p.hwm_mib = mib(status_kib(cp.pid(), "VmHWM")?);
    Ok(p)
}

/// The control plane's `switchyard_control_node_resyncs_total` (`None` when it has none:
/// a control plane older than the metric).
async fn resyncs(control: &str) -> Option<u64> {
    let addr = control.trim_start_matches("http://").parse().ok()?;
    let text = crate::client::metrics_text(addr).await.ok()?;
    text.contains("switchyard_control_node_resyncs")
        .then(|| sum_metric(&text, "switchyard_control_node_resyncs_total"))
}

struct Admin {
    client: AdminClient<Channel>,
    bearer: tonic::metadata::MetadataValue<tonic::metadata::Ascii>,
}

impl Admin {
    async fn connect(control: &str, token: &str) -> Result<Admin> {
        let channel = tonic::transport::Endpoint::from_shared(control.to_owned())
            .map_err(|e| format!("{control}: {e}"))?
            .connect()
            .await
            .map_err(|e| format!("admin API at {control}: {e}"))?;
        let client = AdminClient::new(channel);
        let bearer = format!("Bearer {token}").parse().map_err(|_| "admin token not ASCII")?;
        Ok(Admin { client, bearer })
    }

    /// Creates a key; returns the store revision of the write.
    async fn create_key(&mut self, name: &str) -> Result<i64> {
        let mut request = tonic::Request::new(admin::CreateKeyRequest {
            name: name.into(),
            ..Default::default()
        });
        request.metadata_mut().insert("authorization", self.bearer.clone());
        let created =
            self.client.create_key(request).await.map_err(|e| format!("CreateKey {name}: {e}"))?;
        Ok(created.into_inner().version)
    }
}
