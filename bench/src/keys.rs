//! `switchyard-bench keys`: a store with many API keys, and what it costs to hand them to a
//! node — snapshot bytes, time to ready, memory, one key change's propagation, and a
//! restart from the node's last-known-good with no control plane.
//!
//! Per backend (the embedded store and a real etcd): a control plane on the empty store
//! gets the catalog through `switchyard apply` and is stopped; the bench then writes the
//! keys straight into the store with the control plane's own `Layout` and `ApiKeyRecord`
//! JSON (128 puts per transaction, etcd's default `--max-txn-ops`), lists `config/` — what
//! the control plane streams to a node as its snapshot — and closes the store. Then, per run:
//! control plane started, a node with an empty data dir started and timed to `/readyz`,
//! `--changes` keys revoked one at a time with `switchyard keys revoke` while `/v1/models`
//! with that key is polled on a keep-alive connection until it answers 401, then node and
//! control plane stopped and the node restarted on its data dir alone.

use std::net::SocketAddr;
use std::path::Path;
use std::process::{Command, Stdio};
use std::time::{Duration, Instant};

use serde_json::Value;
use switchyard_catalog::keys::hash_secret;
use switchyard_catalog::{ApiKeyRecord, FailoverDefaults, KeyStatus};
use switchyard_control_plane::layout::Layout;
use switchyard_control_plane::store::{self, Txn, TxnOp};

use crate::backend::{Backend, Stores};
use switchyard_test_support::etcd;

use crate::catalog::{PRIMARY, SECONDARY};
use crate::client::{connect, get_status};
use crate::error::Result;
use crate::flags::{self, bounded};
use crate::fleet::wait_ready;
use crate::host::{self, clock_ticks, cpu_ticks, mib, status_kib};
use crate::proc::{Proc, cli};
use crate::stats::{fmt, median, pct};

struct Options {
    switchyard: std::path::PathBuf,
    counts: Vec<usize>,
    backends: Vec<Backend>,
    runs: usize,
    changes: usize,
}

/// `switchyard-bench keys`'s flags.
#[derive(clap::Args)]
#[command(args_override_self = true)]
pub struct Args {
    #[command(flatten)]
    switchyard: flags::Switchyard,
    /// Keys in the store, comma-separated, e.g. 0,100000 (each at most 1000000).
    #[arg(long, value_name = "N,N", value_delimiter = ',', default_value = "100000",
        value_parser = bounded::<usize>(0, 1_000_000))]
    count: Vec<usize>,
    #[command(flatten)]
    store: Stores,
    /// Runs per store and count (1–20).
    #[arg(long, value_name = "N", default_value = "3", value_parser = bounded::<usize>(1, 20))]
    runs: usize,
    /// Changes timed per run (1–50).
    #[arg(long, value_name = "N", default_value = "20", value_parser = bounded::<usize>(1, 50))]
    changes: usize,
}

fn options(a: Args) -> Result<Options> {
    Ok(Options {
        switchyard: a.switchyard.existing()?,
        counts: a.count,
        backends: a.store.list,
        runs: a.runs,
        changes: a.changes,
    })
}

pub fn main(args: Args) -> Result<()> {
    let options = options(args)?;
    // Multi-threaded: the store clients and the etcd harness use tokio's process and I/O
    // drivers; nothing here is a load generator that must stay on one core.
    let rt = host::runtime(host::Threads::Two)?;
    rt.block_on(run(options))
}

/// What one backend × count measured in one run.
#[derive(Clone, Debug, Default)]
struct Sample {
    cp_start_ms: f64,
    cp_rss_mib: f64,
    node_ready_ms: f64,
    /// A second fresh node, started once the control plane has its config loaded (the
    /// first node's wait included the control plane reading the store).
    warm_ready_ms: f64,
    warm_ready_cpu_ms: f64,
    /// CPU the node and the control plane spent from the node's start to its ready.
    node_ready_cpu_ms: f64,
    cp_snapshot_cpu_ms: f64,
    node_rss_mib: f64,
    node_hwm_mib: f64,
    /// CLI start → the revoked key answered 401 at the node, per change.
    change_ms: Vec<f64>,
    /// CLI start → CLI exited (the write committed and acknowledged), per change.
    cli_ms: Vec<f64>,
    node_cpu_ms_per_change: f64,
    cp_cpu_ms_per_change: f64,
    lkg_bytes: u64,
    /// What the node's last-known-good files grew by per change (`config.log` lines, and
    /// a whole `config.base` if one was rewritten meanwhile).
    lkg_written_per_change: f64,
    /// From the last change answering 401 to its version in the node's last-known-good.
    persist_lag_ms: f64,
    restart_ready_ms: f64,
    restart_rss_mib: f64,
}

struct Seeded {
    resources: usize,
    bytes: usize,
    seed_secs: f64,
    revision: i64,
    /// (id, secret) of the keys the runs revoke.
    victims: Vec<(String, String)>,
}

async fn run(o: Options) -> Result<()> {
    let ticks = clock_ticks() as f64;
    let mut rows = Vec::new();
    for &backend in &o.backends {
        for &count in &o.counts {
            eprintln!("switchyard-bench keys: {} with {count} keys", backend.label());
            let (seeded, samples) = one(&o, backend, count, ticks).await?;
            rows.push((backend, count, seeded, samples));
        }
    }
    println!("### Keys: snapshot, ready, memory, one change (medians of {} runs)\n", o.runs);
    println!(
        "| store | keys | resources | snapshot bytes | messages | seed s | control start ms | control RSS MiB | node ready ms (control plane just started) | node ready ms (control plane running) | its CPU ms | first node CPU to ready ms | control CPU for the first snapshot ms | node VmRSS MiB | node VmHWM MiB | LKG on disk MiB | change → 401 ms p50 | p99 | max | CLI ms | last change → persisted ms | LKG bytes written/change | node CPU ms/change | control CPU ms/change | restart (LKG, no control) ready ms | restart VmRSS MiB |"
    );
    println!(
        "|---|---:|---:|---:|---:|---:|---:|---:|---:|---:|---:|---:|---:|---:|---:|---:|---:|---:|---:|---:|---:|---:|---:|---:|---:|---:|"
    );
    for (backend, count, s, samples) in &rows {
        let m = |g: fn(&Sample) -> f64| median(&samples.iter().map(g).collect::<Vec<_>>());
        let changes: Vec<f64> = samples.iter().flat_map(|x| x.change_ms.clone()).collect();
        let clis: Vec<f64> = samples.iter().flat_map(|x| x.cli_ms.clone()).collect();
        println!(
            "| {} | {count} | {} | {} | {} | {:.1} | {} | {} | {} | {} | {} | {} | {} | {} | {} | {} | {} | {} | {} | {} | {} | {} | {} | {} | {} | {} |",
            backend.label(),
            s.resources,
            s.bytes,
            s.resources.div_ceil(500).max(1),
            s.seed_secs,
            fmt(m(|x| x.cp_start_ms), 0),
            fmt(m(|x| x.cp_rss_mib), 1),
            fmt(m(|x| x.node_ready_ms), 0),
            fmt(m(|x| x.warm_ready_ms), 0),
            fmt(m(|x| x.warm_ready_cpu_ms), 0),
            fmt(m(|x| x.node_ready_cpu_ms), 0),
            fmt(m(|x| x.cp_snapshot_cpu_ms), 0),
            fmt(m(|x| x.node_rss_mib), 1),
            fmt(m(|x| x.node_hwm_mib), 1),
            fmt(m(|x| x.lkg_bytes as f64 / 1048576.0), 1),
            fmt(median(&changes), 1),
            fmt(pct(&changes, 0.99), 1),
            fmt(changes.iter().copied().reduce(f64::max), 1),
            fmt(median(&clis), 1),
            fmt(m(|x| x.persist_lag_ms), 0),
            fmt(m(|x| x.lkg_written_per_change), 0),
            fmt(m(|x| x.node_cpu_ms_per_change), 1),
            fmt(m(|x| x.cp_cpu_ms_per_change), 1),
            fmt(m(|x| x.restart_ready_ms), 0),
            fmt(m(|x| x.restart_rss_mib), 1),
        );
    }
    println!();
    for (backend, count, _, samples) in &rows {
        for (i, s) in samples.iter().enumerate() {
            eprintln!(
                "  {} {count} run {}: ready {:.0} ms, RSS {:.1} MiB, changes {:?} ms, restart {:.0} ms",
                backend.label(),
                i + 1,
                s.node_ready_ms,
                s.node_rss_mib,
                s.change_ms.iter().map(|v| (v * 10.0).round() / 10.0).collect::<Vec<_>>(),
                s.restart_ready_ms
            );
        }
    }
    Ok(())
}

fn catalog_yaml() -> String {
    // The node never calls these models here; the address only has to be well-formed.
    format!(
        "providers:\n  - name: sim\n    kind: openai-compatible\n    base_url: http://127.0.0.1:9/v1\n    region: us\nmodels:\n  - name: {}\n    provider: sim\n    upstream_model: primary\n  - name: {}\n    provider: sim\n    upstream_model: secondary\n",
        PRIMARY, SECONDARY
    )
}

async fn one(
    o: &Options,
    backend: Backend,
    count: usize,
    ticks: f64,
) -> Result<(Seeded, Vec<Sample>)> {
    let dir = tempfile::Builder::new()
        .prefix("switchyard-bench-keys-")
        .tempdir()
        .map_err(|e| format!("temp dir: {e}"))?;
    let d = dir.path();
    let bin = o.switchyard.as_path();
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

    // The catalog through the admin API, as an operator would; then the control plane goes.
    {
        let cp = start_control(bin, &store_url, &token, &d.join("control-0.log"))?;
        let file = d.join("catalog.yaml");
        std::fs::write(&file, catalog_yaml()).map_err(|e| format!("catalog: {e}"))?;
        cli(
            bin,
            &format!("http://{}", cp.addr),
            &token,
            &["apply", "-f", &file.display().to_string()],
        )?;
    }
    let seeded = seed(&store_url, count, o.runs * o.changes).await?;
    eprintln!(
        "  seeded {count} keys in {:.1} s: {} resources, {} bytes, revision {}",
        seeded.seed_secs, seeded.resources, seeded.bytes, seeded.revision
    );

    let mut samples = Vec::new();
    for run in 0..o.runs {
        let mut s = Sample::default();
        let started = Instant::now();
        let cp =
            start_control(bin, &store_url, &token, &d.join(format!("control-{}.log", run + 1)))?;
        s.cp_start_ms = started.elapsed().as_secs_f64() * 1e3;
        let control = format!("http://{}", cp.addr);
        let node_dir = d.join(format!("node-{run}"));
        let node_dir_s = node_dir.display().to_string();
        let node_args = [
            "node",
            "--control",
            control.as_str(),
            "--listen",
            "127.0.0.1:0",
            "--data-dir",
            node_dir_s.as_str(),
        ];

        let started = Instant::now();
        let cp_idle = cpu_ticks(cp.pid())?;
        let node = Proc::start(bin, &node_args, &[], &d.join(format!("node-{run}.log")))?;
        let version = wait_ready(
            node.addr,
            seeded.revision,
            Duration::from_millis(2),
            Duration::from_secs(120),
        )
        .await?;
        s.node_ready_ms = started.elapsed().as_secs_f64() * 1e3;
        let ms = |t: u64| t as f64 / ticks * 1e3;
        s.node_ready_cpu_ms = ms(cpu_ticks(node.pid())?);
        s.cp_snapshot_cpu_ms = ms(cpu_ticks(cp.pid())?.saturating_sub(cp_idle));
        // Memory once the snapshot is applied and persisted, after a moment to settle.
        tokio::time::sleep(Duration::from_millis(500)).await;
        s.node_rss_mib = mib(status_kib(node.pid(), "VmRSS")?);
        s.node_hwm_mib = mib(status_kib(node.pid(), "VmHWM")?);
        s.cp_rss_mib = mib(status_kib(cp.pid(), "VmRSS")?);
        {
            let dir = d.join(format!("node-{run}-warm"));
            let dir = dir.display().to_string();
            let args =
                ["node", "--control", &control, "--listen", "127.0.0.1:0", "--data-dir", &dir];
            let started = Instant::now();
            let warm = Proc::start(bin, &args, &[], &d.join(format!("node-{run}-warm.log")))?;
            wait_ready(warm.addr, version, Duration::from_millis(2), Duration::from_secs(120))
                .await?;
            s.warm_ready_ms = started.elapsed().as_secs_f64() * 1e3;
            s.warm_ready_cpu_ms = cpu_ticks(warm.pid())? as f64 / ticks * 1e3;
        }

        let victims = &seeded.victims[run * o.changes..(run + 1) * o.changes];
        // The snapshot's base must be on disk before the changes, so that what they write
        // is measured apart from it.
        let by = Instant::now() + Duration::from_secs(120);
        while persisted_version(&node_dir).is_none_or(|v| v < version) {
            if Instant::now() > by {
                return Err(format!("snapshot version {version} not persisted within 120 s"));
            }
            tokio::time::sleep(Duration::from_millis(5)).await;
        }
        let lkg_before = lkg_files(&node_dir);
        let (node_before, cp_before) = (cpu_ticks(node.pid())?, cpu_ticks(cp.pid())?);
        let mut last_version = version;
        let mut last_rejected = Instant::now();
        for (id, secret) in victims {
            let (change, cli_ms, v) = revoke(bin, &control, &token, node.addr, id, secret).await?;
            last_rejected = Instant::now();
            s.change_ms.push(change);
            s.cli_ms.push(cli_ms);
            last_version = last_version.max(v);
        }
        // Every change must have been applied, not merely rejected by a side path.
        wait_ready(node.addr, last_version, Duration::from_millis(2), Duration::from_secs(10))
            .await?;
        // The node persists each applied version after applying it (data-plane persist.rs):
        // wait until the last one is on disk, so the restart below tests what it should and
        // the CPU figure includes the writes.
        let by = Instant::now() + Duration::from_secs(120);
        while persisted_version(&node_dir).is_none_or(|v| v < last_version) {
            if Instant::now() > by {
                return Err(format!("version {last_version} not persisted within 120 s"));
            }
            tokio::time::sleep(Duration::from_millis(2)).await;
        }
        s.persist_lag_ms = last_rejected.elapsed().as_secs_f64() * 1e3;
        let lkg_after = lkg_files(&node_dir);
        let base_written = if lkg_after.base_modified != lkg_before.base_modified {
            lkg_after.base_bytes
        } else {
            0
        };
        s.lkg_written_per_change = (lkg_after.log_bytes.saturating_sub(lkg_before.log_bytes)
            + base_written) as f64
            / o.changes as f64;
        let per_change =
            |b: u64, a: u64| (a.saturating_sub(b)) as f64 / ticks * 1e3 / o.changes as f64;
        s.node_cpu_ms_per_change = per_change(node_before, cpu_ticks(node.pid())?);
        s.cp_cpu_ms_per_change = per_change(cp_before, cpu_ticks(cp.pid())?);
        drop(node);
        drop(cp);
        s.lkg_bytes = dir_bytes(&node_dir);

        // The same data dir, its control plane gone: the last-known-good config serves.
        let started = Instant::now();
        let node = Proc::start(bin, &node_args, &[], &d.join(format!("node-{run}-restart.log")))?;
        let v =
            wait_ready(node.addr, 0, Duration::from_millis(2), Duration::from_secs(120)).await?;
        s.restart_ready_ms = started.elapsed().as_secs_f64() * 1e3;
        if v < last_version {
            return Err(format!("restarted node serves version {v}, expected {last_version}"));
        }
        tokio::time::sleep(Duration::from_millis(500)).await;
        s.restart_rss_mib = mib(status_kib(node.pid(), "VmRSS")?);
        drop(node);
        eprintln!(
            "  run {}: control {:.0} ms, node ready {:.0} ms, RSS {:.1} MiB, change {:.1} ms, restart {:.0} ms",
            run + 1,
            s.cp_start_ms,
            s.node_ready_ms,
            s.node_rss_mib,
            median(&s.change_ms).unwrap_or(f64::NAN),
            s.restart_ready_ms
        );
        samples.push(s);
    }
    drop(etcd);
    Ok((seeded, samples))
}

fn start_control(bin: &Path, store: &str, token: &str, log: &Path) -> Result<Proc> {
    crate::fleet::start_control(bin, store, "127.0.0.1:0", token, log)
}

/// Writes `count` active keys (each with two-model `failoverDefaults`, as keys usually have)
/// and lists `config/`. `victims` of them get known secrets, for the change measurements.
async fn seed(url: &str, count: usize, victims: usize) -> Result<Seeded> {
    let store =
        store::open(url, Default::default()).await.map_err(|e| format!("open {url}: {e}"))?;
    let layout = Layout::new("/switchyard/");
    let started = Instant::now();
    let now = switchyard_time::now_ms();
    let mut victim_keys = Vec::new();
    let mut batch = Vec::with_capacity(128);
    // The victims are extra keys beyond `count`, so `--count 0` still has something to revoke.
    let total = count + victims;
    for i in 0..total {
        let id = format!("key_bench{i:07}");
        let secret = format!("sy-bench{i:07}{:0>32}", i * 7919);
        let record = ApiKeyRecord {
            id: id.clone(),
            name: format!("tenant-{i}"),
            created_unix_ms: now,
            updated_unix_ms: now,
            status: KeyStatus::Active,
            secret_sha256: hash_secret(&secret),
            secret_hint: secret[secret.len() - 4..].to_owned(),
            failover_defaults: Some(FailoverDefaults {
                models: vec![PRIMARY.into(), SECONDARY.into()],
                timeout_ms: None,
                first_token_timeout_ms: None,
                on: None,
                degraded: None,
                continue_streams: None,
                session_affinity: None,
            }),
            allowed_models: vec![],
            allowed_regions: vec![],
            limits: None,
        };
        if i >= count {
            victim_keys.push((id.clone(), secret));
        }
        let value = serde_json::to_vec(&record).map_err(|e| format!("record: {e}"))?;
        batch.push(TxnOp::Put { key: layout.key(&id), value, lease: None });
        if batch.len() == 128 || i + 1 == total {
            let txn = Txn { compare: vec![], success: std::mem::take(&mut batch), failure: vec![] };
            store.txn(txn).await.map_err(|e| format!("seeding: {e}"))?;
        }
    }
    let seed_secs = started.elapsed().as_secs_f64();
    let listing = store.list(&layout.config_prefix()).await.map_err(|e| format!("list: {e}"))?;
    let bytes = listing
        .kvs
        .iter()
        .map(|kv| layout.resource_name(&kv.key).map_or(0, str::len) + kv.value.len())
        .sum();
    let seeded = Seeded {
        resources: listing.kvs.len(),
        bytes,
        seed_secs,
        revision: listing.revision,
        victims: victim_keys,
    };
    drop(store);
    // The embedded store's writer thread releases its lock a moment after the drop.
    tokio::time::sleep(Duration::from_millis(300)).await;
    Ok(seeded)
}

/// Revokes one key with the CLI while polling `/v1/models` with it on a keep-alive
/// connection. Returns (CLI start → 401 ms, CLI start → CLI exit ms, the write's version).
async fn revoke(
    bin: &Path,
    control: &str,
    token: &str,
    node: SocketAddr,
    id: &str,
    secret: &str,
) -> Result<(f64, f64, i64)> {
    let host = node.to_string();
    let mut conn = connect(node).await?;
    let status = get_status(&mut conn, &host, "/v1/models", Some(secret)).await?;
    if status != 200 {
        return Err(format!("key {id} answers {status} before its revocation"));
    }
    let started = Instant::now();
    let (bin, control, token, id_owned) =
        (bin.to_owned(), control.to_owned(), token.to_owned(), id.to_owned());
    let cli_task = tokio::task::spawn_blocking(move || {
        let out = Command::new(&bin)
            .args(["keys", "revoke", &id_owned, "--json"])
            .env("SWITCHYARD_CONTROL", &control)
            .env("SWITCHYARD_ADMIN_TOKEN", &token)
            .stdin(Stdio::null())
            .output();
        (out, Instant::now())
    });
    let deadline = started + Duration::from_secs(30);
    let rejected = loop {
        let status = get_status(&mut conn, &host, "/v1/models", Some(secret)).await?;
        if status == 401 {
            break Instant::now();
        }
        if Instant::now() > deadline {
            return Err(format!("key {id} still answers {status} 30 s after its revocation"));
        }
        tokio::time::sleep(Duration::from_micros(500)).await;
    };
    let (out, exited) = cli_task.await.map_err(|e| format!("cli task: {e}"))?;
    let out = out.map_err(|e| format!("switchyard keys revoke: {e}"))?;
    if !out.status.success() {
        return Err(format!("keys revoke failed: {}", String::from_utf8_lossy(&out.stderr)));
    }
    let v: Value = serde_json::from_slice(&out.stdout).map_err(|e| format!("revoke JSON: {e}"))?;
    let version = v["version"].as_i64().unwrap_or(0);
    let ms = |t: Instant| t.duration_since(started).as_secs_f64() * 1e3;
    Ok((ms(rejected), ms(exited), version))
}

/// The version of the node's persisted last-known-good (docs/operating.md): the last whole
/// line of `config.log`, else the first line of `config.base` — both begin
/// `{"version":N`.
fn persisted_version(dir: &Path) -> Option<i64> {
    use std::io::{BufRead, Read, Seek, SeekFrom};
    let leading = |line: &str| -> Option<i64> {
        let rest = line.strip_prefix("{\"version\":")?;
        rest[..rest.find(|c: char| !c.is_ascii_digit())?].parse().ok()
    };
    let mut first = String::new();
    let base = std::fs::File::open(dir.join("config.base")).ok()?;
    std::io::BufReader::new(base).read_line(&mut first).ok()?;
    let base_version = leading(&first)?;
    // Log lines are short: the tail holds the last whole one.
    let log_version = std::fs::File::open(dir.join("config.log")).ok().and_then(|mut log| {
        let len = log.metadata().ok()?.len();
        log.seek(SeekFrom::Start(len.saturating_sub(64 * 1024))).ok()?;
        let mut tail = String::new();
        log.read_to_string(&mut tail).ok()?;
        let whole = &tail[..tail.rfind('\n')?];
        leading(whole.rsplit('\n').next()?)
    });
    Some(log_version.map_or(base_version, |v| v.max(base_version)))
}

struct LkgFiles {
    base_bytes: u64,
    base_modified: Option<std::time::SystemTime>,
    log_bytes: u64,
}

fn lkg_files(dir: &Path) -> LkgFiles {
    let base = std::fs::metadata(dir.join("config.base")).ok();
    LkgFiles {
        base_bytes: base.as_ref().map_or(0, |m| m.len()),
        base_modified: base.and_then(|m| m.modified().ok()),
        log_bytes: std::fs::metadata(dir.join("config.log")).map_or(0, |m| m.len()),
    }
}

fn dir_bytes(dir: &Path) -> u64 {
    let Ok(entries) = std::fs::read_dir(dir) else { return 0 };
    entries
        .flatten()
        .map(|e| match e.metadata() {
            Ok(m) if m.is_dir() => dir_bytes(&e.path()),
            Ok(m) => m.len(),
            Err(_) => 0,
        })
        .sum()
}
