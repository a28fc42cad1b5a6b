//! A real, throw-away `etcd` for tests: one member on loopback ports reserved for it (see
//! `port.rs`: no other process can take them between reserving and etcd's bind) with a
//! temporary data directory, killed when the handle is dropped.
//!
//! Self-contained (std + tokio + tempfile, and `port.rs` next to it) so other test crates can
//! copy the two files as they are:
//!
//! ```ignore
//! let etcd = EtcdProcess::start().await;
//! let store = EtcdStore::connect(&[etcd.endpoint().to_owned()]).await?;
//! ```
//!
//! The binary is `$SWITCHYARD_ETCD_BIN`, else `etcd` on `PATH`, else `/usr/bin/etcd`. A
//! missing binary fails the test with install instructions: these tests are never skipped.
#![allow(dead_code, clippy::expect_used, clippy::panic)]

use std::net::SocketAddr;
use std::path::{Path, PathBuf};
use std::process::Stdio;
use std::time::{Duration, Instant};

use tokio::io::{AsyncReadExt, AsyncWriteExt};
use tokio::process::{Child, Command};

#[path = "port.rs"]
pub mod port;
use port::ReservedPort;

/// How long a started member may take to elect itself and answer.
const READY_TIMEOUT: Duration = Duration::from_secs(20);

pub struct EtcdProcess {
    child: Child,
    endpoint: String,
    /// The client and peer ports, held for as long as etcd runs.
    _ports: [ReservedPort; 2],
    /// Dropped after `child` (fields drop in order), so etcd is killed before its data dir goes.
    data: tempfile::TempDir,
}

impl EtcdProcess {
    /// Starts etcd and waits until it serves requests. Panics (failing the test) when etcd is
    /// not installed or does not come up.
    pub async fn start() -> Self {
        let binary = find_binary();
        match Self::try_start(&binary).await {
            Ok(process) => process,
            Err(e) => panic!("could not start etcd ({}): {e}", binary.display()),
        }
    }

    /// `http://127.0.0.1:PORT`, the client URL.
    pub fn endpoint(&self) -> &str {
        &self.endpoint
    }

    pub fn data_dir(&self) -> &Path {
        self.data.path()
    }

    /// Kills etcd now (it is also killed on drop). Its ports stay held until the handle is
    /// dropped: whoever still connects there is refused, rather than meeting another
    /// process that took a freed port.
    pub async fn stop(&mut self) {
        let _ = self.child.kill().await;
    }

    async fn try_start(binary: &Path) -> Result<Self, String> {
        let data = tempfile::tempdir().map_err(|e| format!("temp dir: {e}"))?;
        let reserve = || ReservedPort::try_new().map_err(|e| format!("reserving a port: {e}"));
        let (client, peer) = (reserve()?, reserve()?);
        let client_url = format!("http://{}", client.addr());
        let peer_url = format!("http://{}", peer.addr());
        let log_path = data.path().join("etcd.log");
        let log = std::fs::File::create(&log_path).map_err(|e| format!("log file: {e}"))?;
        let log_err = log.try_clone().map_err(|e| format!("log file: {e}"))?;
        let mut child = Command::new(binary)
            .arg("--name=test")
            .arg(format!("--data-dir={}", data.path().join("data").display()))
            .arg(format!("--listen-client-urls={client_url}"))
            .arg(format!("--advertise-client-urls={client_url}"))
            .arg(format!("--listen-peer-urls={peer_url}"))
            .arg(format!("--initial-advertise-peer-urls={peer_url}"))
            .arg(format!("--initial-cluster=test={peer_url}"))
            .arg("--initial-cluster-state=new")
            // Short raft timings make the single member lead within milliseconds and lower
            // etcd's minimum lease TTL (1.5 election timeouts, rounded up) to 1 s.
            .arg("--heartbeat-interval=10")
            .arg("--election-timeout=100")
            .env_remove("ETCD_DATA_DIR")
            .stdin(Stdio::null())
            .stdout(Stdio::from(log))
            .stderr(Stdio::from(log_err))
            .kill_on_drop(true)
            .spawn()
            .map_err(|e| format!("spawning {}: {e}", binary.display()))?;

        let started = Instant::now();
        let addr = client.addr();
        loop {
            if let Ok(Some(status)) = child.try_wait() {
                let log = std::fs::read_to_string(&log_path).unwrap_or_default();
                return Err(format!("etcd exited with {status}; its log:\n{}", tail(&log)));
            }
            if healthy(addr).await {
                return Ok(Self { child, endpoint: client_url, _ports: [client, peer], data });
            }
            if started.elapsed() > READY_TIMEOUT {
                let _ = child.kill().await;
                let log = std::fs::read_to_string(&log_path).unwrap_or_default();
                return Err(format!(
                    "etcd not healthy after {READY_TIMEOUT:?}; its log:\n{}",
                    tail(&log)
                ));
            }
            // Polling interval of the health check.
            tokio::time::sleep(Duration::from_millis(25)).await;
        }
    }
}

const INSTALL_HINT: &str = "Install it with `apt-get install etcd-server` (Debian/Ubuntu), put an \
    etcd 3.4+ binary on PATH, or point $SWITCHYARD_ETCD_BIN at one.";

fn find_binary() -> PathBuf {
    if let Some(path) = std::env::var_os("SWITCHYARD_ETCD_BIN") {
        let path = PathBuf::from(path);
        if !path.is_file() {
            panic!(
                "$SWITCHYARD_ETCD_BIN is {} but no such file exists. {INSTALL_HINT}",
                path.display()
            );
        }
        return path;
    }
    let on_path = std::env::var_os("PATH")
        .into_iter()
        .flat_map(|paths| std::env::split_paths(&paths).collect::<Vec<_>>())
        .map(|dir| dir.join("etcd"))
        .find(|candidate| candidate.is_file());
    if let Some(path) = on_path {
        return path;
    }
    let fallback = PathBuf::from("/usr/bin/etcd");
    if fallback.is_file() {
        return fallback;
    }
    panic!(
        "etcd is required by this test but was not found (looked for `etcd` on PATH and at \
         /usr/bin/etcd). {INSTALL_HINT}"
    );
}

/// etcd's `/health` is true only once the member has a leader and serves requests.
async fn healthy(addr: SocketAddr) -> bool {
    let attempt = async {
        let mut stream = tokio::net::TcpStream::connect(addr).await.ok()?;
        stream.write_all(b"GET /health HTTP/1.0\r\nHost: 127.0.0.1\r\n\r\n").await.ok()?;
        let mut body = String::new();
        stream.read_to_string(&mut body).await.ok()?;
        Some(body.contains("\"health\":\"true\""))
    };
    matches!(tokio::time::timeout(Duration::from_secs(1), attempt).await, Ok(Some(true)))
}

fn tail(log: &str) -> String {
    let lines: Vec<&str> = log.lines().collect();
    lines[lines.len().saturating_sub(30)..].join("\n")
}
