//! `switchyard-bench storm`: every request fails over, as fast as `--concurrency`
//! connections can send them, and every failover event must reach the audit log or be
//! counted as lost. Per store (the embedded one and a real etcd), two runs:
//!
//! - a storm of `--duration-secs` with the control plane up: can one control plane store
//!   what one node produces?
//! - the same storm, with the control plane stopped for `--outage-secs` in the middle of it
//!   (and the run lengthened by as much): the node spools what it cannot hand over, and
//!   drains it once a control plane (a new process on the same address and store) returns.
//!
//! Each run reports failovers served (the node's `switchyard_failovers_total`), events in
//! the audit log (read from the store once the control plane is stopped), events the node
//! counted as lost, the node's peak RSS and spool size, and how long the backlog took to
//! drain.

use std::path::PathBuf;
use std::sync::Arc;
use std::time::{Duration, Instant};

use bytes::Bytes;
use serde_json::json;

use crate::catalog::{FAILING, SECONDARY, catalog_yaml};
use crate::client::{connect_many, metrics_text};
use crate::error::Result;
use crate::flags::{self, bounded};
use crate::fleet::{Fleet, start_control};
use crate::host::{self, mib, status_kib};
use crate::load::{Kind, Target, phase};
use crate::stats::sum_metric;
use switchyard_test_support::etcd::EtcdProcess;

use switchyard_control_plane::audit;
use switchyard_control_plane::layout::Layout;

/// How long a backlog may take to reach the audit log before the run gives up on it.
const DRAIN_LIMIT: Duration = Duration::from_secs(600);

#[derive(Clone, Copy, PartialEq, Eq, clap::ValueEnum)]
enum Store {
    Embedded,
    Etcd,
}

impl Store {
    fn label(self) -> &'static str {
        match self {
            Store::Embedded => "embedded",
            Store::Etcd => "etcd",
        }
    }
}

struct Options {
    switchyard: PathBuf,
    concurrency: usize,
    duration: Duration,
    outage: Duration,
    stores: Vec<Store>,
    /// The node's `--event-spool-max-mib`.
    spool_mib: u64,
}

/// `switchyard-bench storm`'s flags.
#[derive(clap::Args)]
#[command(args_override_self = true)]
pub struct Args {
    #[command(flatten)]
    switchyard: flags::Switchyard,
    /// Connections sending (1–1024).
    #[arg(long, value_name = "N", default_value = "32", value_parser = bounded::<usize>(1, 1024))]
    concurrency: usize,
    /// Seconds of load before the outage (2–3600).
    #[arg(long, value_name = "SECS", default_value = "60", value_parser = bounded::<u64>(2, 3_600))]
    duration_secs: u64,
    /// Seconds the control plane is away (1–3600).
    #[arg(long, value_name = "SECS", default_value = "120", value_parser = bounded::<u64>(1, 3_600))]
    outage_secs: u64,
    /// Stores to run the control plane on, comma-separated.
    #[arg(
        long,
        value_name = "STORE,STORE",
        value_delimiter = ',',
        default_value = "embedded,etcd"
    )]
    store: Vec<Store>,
    /// The node's `--event-spool-max-mib` (1–1048576).
    #[arg(long, value_name = "MIB", default_value = "256", value_parser = bounded::<u64>(1, 1_048_576))]
    spool_mib: u64,
}

fn options(a: Args) -> Result<Options> {
    Ok(Options {
        switchyard: a.switchyard.existing()?,
        concurrency: a.concurrency,
        duration: Duration::from_secs(a.duration_secs),
        outage: Duration::from_secs(a.outage_secs),
        stores: a.store,
        spool_mib: a.spool_mib,
    })
}

struct Row {
    store: Store,
    outage: Option<Duration>,
    failovers: u64,
    stored: u64,
    lost: u64,
    non_200: u64,
    load_secs: f64,
    peak_rss_mib: f64,
    peak_held: u64,
    peak_spool_mib: f64,
    /// From the end of the storm (or the control plane's return) until nothing was held.
    drain_secs: f64,
    /// Events the control plane up at the end stored per second, from its start (the
    /// storm's, or its return after the outage) until the node held nothing.
    ingest_per_sec: f64,
}

pub fn main(args: Args) -> Result<()> {
    let o = options(args)?;
    let rt = host::runtime(host::Threads::Two)?;
    let mut rows = Vec::new();
    for &store in &o.stores {
        for outage in [None, Some(o.outage)] {
            let row = rt.block_on(run(&o, store, outage))?;
            eprintln!(
                "  {} {}: {} failovers, {} stored, {} lost, drained in {:.1} s",
                store.label(),
                outage.map_or("storm".to_owned(), |d| format!("storm + {} s outage", d.as_secs())),
                row.failovers,
                row.stored,
                row.lost,
                row.drain_secs
            );
            rows.push(row);
        }
    }
    print(&o, &rows);
    Ok(())
}

async fn run(o: &Options, store: Store, outage: Option<Duration>) -> Result<Row> {
    let dir = tempfile::Builder::new()
        .prefix("switchyard-bench-storm-")
        .tempdir()
        .map_err(|e| format!("temp dir: {e}"))?;
    let d = dir.path();
    let bin = o.switchyard.as_path();
    // Declared first, so it outlives everything that talks to it.
    let etcd = match store {
        Store::Etcd => Some(EtcdProcess::start().await),
        Store::Embedded => None,
    };
    let store_url = match &etcd {
        Some(e) => format!("etcd://{}", e.endpoint().trim_start_matches("http://")),
        None => format!("file://{}", d.join("store").display()),
    };
    let spool = o.spool_mib.to_string();
    let node_args = ["--event-spool-max-mib", spool.as_str()];
    let fleet = Fleet::start_on(bin, d, &store_url, catalog_yaml, &node_args).await?;
    fleet.script("failing", json!({"kind": "status", "status": 503})).await?;
    let Fleet { sim, cp, node, key, token, .. } = fleet;
    let _sim = sim;
    let control_addr = cp.addr;
    let mut cp = Some(cp);

    let target = Arc::new(Target {
        kind: Kind::NodeFailing,
        addr: node.addr,
        host: node.addr.to_string(),
        auth: Some(format!("Bearer {key}")),
        body: Bytes::from(
            json!({"model": FAILING, "fallback_models": [SECONDARY],
                "messages": [{"role": "user", "content": "storm"}]})
            .to_string(),
        ),
        proxy_pid: Some(node.pid()),
        tls: None,
    });
    let conns = connect_many(node.addr, o.concurrency).await?;
    let load_for = o.duration + outage.unwrap_or_default();
    let started = Instant::now();
    let load = tokio::spawn({
        let target = Arc::clone(&target);
        async move { phase(conns, &target, started + load_for, false).await }
    });

    let (mut peak_rss, mut peak_held, mut peak_spool) = (0u64, 0u64, 0u64);
    let mut sample = |text: &str| {
        peak_held = peak_held.max(sum_metric(text, "switchyard_failover_events_held"));
        peak_spool = peak_spool.max(sum_metric(text, "switchyard_failover_event_spool_bytes"));
        peak_rss = peak_rss.max(status_kib(node.pid(), "VmRSS").unwrap_or(0));
    };
    let mut tick = tokio::time::interval(Duration::from_millis(500));
    let outage_at = started + o.duration / 2;
    let mut back_at = None;
    while !load.is_finished() {
        tick.tick().await;
        if let Ok(text) = metrics_text(node.addr).await {
            sample(&text);
        }
        if let Some(outage) = outage {
            // Once: after its return the control plane stays up.
            if cp.is_some() && back_at.is_none() && Instant::now() >= outage_at {
                eprintln!("  control plane stopped for {} s", outage.as_secs());
                cp = None;
            }
            if cp.is_none() && back_at.is_none() && Instant::now() >= outage_at + outage {
                let listen = control_addr.to_string();
                cp = Some(start_control(
                    bin,
                    &store_url,
                    &listen,
                    &token,
                    &d.join("control-2.log"),
                )?);
                back_at = Some(Instant::now());
                eprintln!("  control plane back");
            }
        }
    }
    let (_, _, non_200) = load.await.map_err(|e| format!("load task: {e}"))??;
    let load_secs = started.elapsed().as_secs_f64();
    let ended = Instant::now();

    // The backlog (memory and spool) reaches the audit log.
    let drain_from = back_at.unwrap_or(ended);
    let drained_at = loop {
        let text = metrics_text(node.addr).await?;
        sample(&text);
        if sum_metric(&text, "switchyard_failover_events_held") == 0
            && sum_metric(&text, "switchyard_failover_event_spool_bytes") == 0
        {
            break Instant::now();
        }
        if ended.elapsed() > DRAIN_LIMIT {
            return Err(format!("the node still held events {DRAIN_LIMIT:?} after the storm"));
        }
        tokio::time::sleep(Duration::from_millis(100)).await;
    };
    let text = metrics_text(node.addr).await?;
    let failovers = sum_metric(&text, "switchyard_failovers_total");
    let lost = sum_metric(&text, "switchyard_failover_events_dropped_total");
    let drain_secs = drained_at.duration_since(drain_from).as_secs_f64();
    // What the control plane that is up now stored since it started, over that time: with
    // an outage, the new process took the whole backlog as well as the live storm.
    let cp_text = metrics_text(control_addr).await?;
    let cp_stored = sum_metric(&cp_text, "switchyard_control_failover_events_stored_total");
    let cp_since = back_at.unwrap_or(started);
    let ingest_per_sec = cp_stored as f64 / drained_at.duration_since(cp_since).as_secs_f64();
    // Stopped first: the embedded store is one process's at a time.
    drop(cp);
    let stored = count_events(&store_url).await?;
    drop(etcd);
    Ok(Row {
        store,
        outage,
        failovers,
        stored,
        lost,
        non_200,
        load_secs,
        peak_rss_mib: mib(peak_rss),
        peak_held,
        peak_spool_mib: peak_spool as f64 / (1024.0 * 1024.0),
        drain_secs,
        ingest_per_sec,
    })
}

/// Failover events in the audit log, read from the store the control plane wrote it to:
/// each event once by its id (a node resends a batch whose ack it lost), failover events
/// only (not degraded answers, nor `events.lost` entries). Read a stored value at a time,
/// so that millions of events are counted without holding them all.
async fn count_events(store_url: &str) -> Result<u64> {
    let store = switchyard_control_plane::store::open(store_url, Default::default())
        .await
        .map_err(|e| format!("open {store_url}: {e}"))?;
    let prefix = Layout::new("/switchyard/").audit_prefix();
    let mut ids = std::collections::HashSet::new();
    let mut from = prefix.clone();
    loop {
        let page = store
            .list_keys(&prefix, &from, 1_000)
            .await
            .map_err(|e| format!("listing the audit log: {e}"))?;
        for key in &page.keys {
            let Some(kv) = store.get(key).await.map_err(|e| format!("reading {key}: {e}"))? else {
                continue;
            };
            for event in audit::decode(&kv) {
                if event.degraded.is_empty() && event.lost.is_none() {
                    ids.insert(event.id);
                }
            }
        }
        match page.keys.last() {
            Some(last) if page.keys.len() == 1_000 => from = format!("{last}\0"),
            _ => return Ok(ids.len() as u64),
        }
    }
}

fn print(o: &Options, rows: &[Row]) {
    println!(
        "### Failover-event storm ({} connections, every request failing over, node spool bound {} MiB)\n",
        o.concurrency, o.spool_mib
    );
    println!(
        "| store | run | load s | failovers served | events stored | counted lost | stored + lost = served | non-200 | failovers/s | node peak RSS MiB | peak events held | peak spool MiB | drain s | events/s stored by the control plane |"
    );
    println!("|---|---|---:|---:|---:|---:|---|---:|---:|---:|---:|---:|---:|---:|");
    for r in rows {
        let run = r
            .outage
            .map_or("storm".to_owned(), |d| format!("storm, control plane away {} s", d.as_secs()));
        let verdict = if r.stored + r.lost == r.failovers && r.lost == 0 {
            "yes, none lost"
        } else if r.stored + r.lost == r.failovers {
            "yes"
        } else {
            "NO"
        };
        println!(
            "| {} | {run} | {:.0} | {} | {} | {} | {verdict} | {} | {:.0} | {:.1} | {} | {:.1} | {:.1} | {:.0} |",
            r.store.label(),
            r.load_secs,
            r.failovers,
            r.stored,
            r.lost,
            r.non_200,
            r.failovers as f64 / r.load_secs,
            r.peak_rss_mib,
            r.peak_held,
            r.peak_spool_mib,
            r.drain_secs,
            r.ingest_per_sec,
        );
    }
}
