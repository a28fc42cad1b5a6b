//! What the `keys`, `streams` and `translate` subcommands share: /proc readings, readiness
//! polls, a simulator + control plane + node on loopback with one catalog, and summary
//! statistics.

use std::net::SocketAddr;
use std::path::Path;
use std::time::{Duration, Instant};

use bytes::Bytes;
use http_body_util::{BodyExt, Full};
use hyper::client::conn::http1::SendRequest;
use hyper::{Request, header};

use crate::{Proc, Result, cli, connect, http};

/// A `/proc/PID/status` field in KiB (`VmRSS`, `VmHWM`).
pub fn status_kib(pid: u32, field: &str) -> Result<u64> {
    let status = std::fs::read_to_string(format!("/proc/{pid}/status"))
        .map_err(|e| format!("cannot read /proc/{pid}/status: {e}"))?;
    status
        .lines()
        .find_map(|l| l.strip_prefix(field).and_then(|r| r.strip_prefix(':')))
        .and_then(|v| v.trim().trim_end_matches("kB").trim().parse().ok())
        .ok_or_else(|| format!("/proc/{pid}/status has no {field}"))
}

pub fn mib(kib: u64) -> f64 {
    kib as f64 / 1024.0
}

/// The soft `Max open files` limit of this process (children inherit it).
pub fn open_files_limit() -> Option<u64> {
    let limits = std::fs::read_to_string("/proc/self/limits").ok()?;
    let line = limits.lines().find(|l| l.starts_with("Max open files"))?;
    line.split_whitespace().nth(3)?.parse().ok()
}

/// Polls `/readyz` until it is 200 with `config_version >= min_version`, every `every`,
/// for at most `timeout`. Returns the version the node reported.
pub async fn wait_ready(
    addr: SocketAddr,
    min_version: i64,
    every: Duration,
    timeout: Duration,
) -> Result<i64> {
    let by = Instant::now() + timeout;
    loop {
        // A node that is still starting may refuse the connection: that is "not ready".
        if let Ok((200, ready)) = http(addr, "GET", "/readyz", None, None).await
            && let Some(v) = ready["config_version"].as_i64().filter(|v| *v >= min_version)
        {
            return Ok(v);
        }
        if Instant::now() > by {
            return Err(format!(
                "{addr}: /readyz not 200 with config_version >= {min_version} within {timeout:?}"
            ));
        }
        tokio::time::sleep(every).await;
    }
}

/// `GET path` on an open keep-alive connection: the status only (the body is drained).
pub async fn get_status(
    sender: &mut SendRequest<Full<Bytes>>,
    host: &str,
    path: &str,
    auth: Option<&str>,
) -> Result<u16> {
    sender.ready().await.map_err(|e| format!("connection lost: {e}"))?;
    let mut req = Request::get(path).header(header::HOST, host);
    if let Some(key) = auth {
        req = req.header(header::AUTHORIZATION, format!("Bearer {key}"));
    }
    let req = req.body(Full::new(Bytes::new())).map_err(|e| format!("request: {e}"))?;
    let resp = sender.send_request(req).await.map_err(|e| format!("GET {path}: {e}"))?;
    let status = resp.status().as_u16();
    resp.into_body().collect().await.map_err(|e| format!("GET {path}: {e}"))?;
    Ok(status)
}

/// A simulator, a control plane on the embedded store with `catalog` applied and one key,
/// and a node that has applied both. Everything dies with the value.
pub struct Fleet {
    pub sim: Proc,
    pub cp: Proc,
    pub node: Proc,
    /// The key's secret.
    pub key: String,
}

impl Fleet {
    pub async fn start(
        bin: &Path,
        dir: &Path,
        catalog: impl Fn(SocketAddr) -> String,
    ) -> Result<Fleet> {
        let logs = |name: &str| dir.join(format!("{name}.log"));
        let sim = Proc::start(bin, &["sim", "--listen", "127.0.0.1:0"], &[], &logs("sim"))?;
        let token = format!("bench-admin-token-{}", std::process::id());
        let store = format!("file://{}", dir.join("store").display());
        let cp = Proc::start(
            bin,
            &["control", "--store", &store, "--listen", "127.0.0.1:0"],
            &[("SWITCHYARD_ADMIN_TOKEN", &token)],
            &logs("control"),
        )?;
        let control = format!("http://{}", cp.addr);
        let file = dir.join("catalog.yaml");
        std::fs::write(&file, catalog(sim.addr)).map_err(|e| format!("catalog: {e}"))?;
        let applied = cli(bin, &control, &token, &["apply", "-f", &file.display().to_string()])?;
        let created = cli(bin, &control, &token, &["keys", "create", "--name", "bench"])?;
        let key = created["key"].as_str().ok_or("keys create printed no key")?.to_owned();
        let version = created["version"].as_i64().max(applied["version"].as_i64()).unwrap_or(0);
        let node_dir = dir.join("node").display().to_string();
        let node = Proc::start(
            bin,
            &["node", "--control", &control, "--listen", "127.0.0.1:0", "--data-dir", &node_dir],
            &[],
            &logs("node"),
        )?;
        wait_ready(node.addr, version, Duration::from_millis(50), Duration::from_secs(20)).await?;
        Ok(Fleet { sim, cp, node, key })
    }

    /// Scripts one of the simulator's upstream models.
    pub async fn script(&self, model: &str, behaviour: serde_json::Value) -> Result<()> {
        let body = serde_json::json!({"model": model, "behaviour": behaviour}).to_string();
        let (status, v) = http(self.sim.addr, "POST", "/_sim/script", None, Some(body)).await?;
        if status >= 300 {
            return Err(format!("scripting the simulator's {model} failed: {status} {v}"));
        }
        Ok(())
    }
}

/// Opens `n` keep-alive HTTP/1.1 connections to `addr`, one after another.
pub async fn connect_many(addr: SocketAddr, n: usize) -> Result<Vec<SendRequest<Full<Bytes>>>> {
    let mut conns = Vec::with_capacity(n);
    for _ in 0..n {
        conns.push(connect(addr).await?);
    }
    Ok(conns)
}

pub fn median(v: &[f64]) -> Option<f64> {
    crate::median(v.to_vec())
}

/// Nearest-rank percentile of unsorted values.
pub fn pct(v: &[f64], q: f64) -> Option<f64> {
    let mut v: Vec<f64> = v.iter().copied().filter(|x| x.is_finite()).collect();
    if v.is_empty() {
        return None;
    }
    v.sort_by(f64::total_cmp);
    let rank = ((q * v.len() as f64).ceil() as usize).clamp(1, v.len());
    Some(v[rank - 1])
}

pub fn f(v: Option<f64>, decimals: usize) -> String {
    crate::fmt(v, decimals)
}
