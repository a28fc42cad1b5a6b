//! A real, throw-away `etcd` for tests: one member on loopback ports reserved for it (see
//! [`crate::port`]: no other process can take them between reserving and etcd's bind) with a
//! temporary data directory, killed when the handle is dropped.
//!
//! [`EtcdCluster`] starts several members instead, optionally with TLS on client and peer
//! URLs, and turns etcd authentication on through its Auth RPCs (for which, and for finding
//! the leader, it also uses tonic and `switchyard-proto`'s etcd client).
//!
//! The single member needs only std, tokio and tempfile:
//!
//! ```ignore
//! let etcd = EtcdProcess::start().await;
//! let store = EtcdStore::connect(&[etcd.endpoint().to_owned()]).await?;
//! ```
//!
//! The binary is `$SWITCHYARD_ETCD_BIN`, else `etcd` on `PATH`, else `/usr/bin/etcd`. A
//! missing binary fails the test with install instructions: these tests are never skipped.

use std::net::SocketAddr;
use std::path::{Path, PathBuf};
use std::process::Stdio;
use std::time::{Duration, Instant};

use tokio::io::{AsyncReadExt, AsyncWriteExt};
use tokio::process::{Child, Command};

use crate::port::ReservedPort;

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
        let mut child = etcd_command(binary, log)
            .map_err(|e| format!("log file: {e}"))?
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

/// `binary` with its output in `log`, killed with its handle, and without a data directory
/// of the environment's choosing.
fn etcd_command(binary: &Path, log: std::fs::File) -> std::io::Result<Command> {
    let log_err = log.try_clone()?;
    let mut command = Command::new(binary);
    command
        .env_remove("ETCD_DATA_DIR")
        .stdin(Stdio::null())
        .stdout(Stdio::from(log))
        .stderr(Stdio::from(log_err))
        .kill_on_drop(true);
    Ok(command)
}

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

// === Clusters with TLS and authentication ===

/// PEM files for a cluster's TLS: the CA that signed every member's certificate, and one
/// certificate (valid for 127.0.0.1) the members use as server and peer certificate. With
/// TLS, client and peer URLs are `https://` and both require client certificates signed by
/// the CA (`--client-cert-auth`, `--peer-client-cert-auth`).
#[derive(Clone, Debug)]
pub struct TlsFiles {
    pub ca: PathBuf,
    pub cert: PathBuf,
    pub key: PathBuf,
}

#[derive(Clone, Debug)]
pub struct ClusterOptions {
    pub members: usize,
    pub tls: Option<TlsFiles>,
    /// etcd's `--auth-token-ttl`: how long a simple token lives unused.
    pub auth_token_ttl: Option<Duration>,
    /// Raft timings (`--heartbeat-interval`, `--election-timeout`), in milliseconds.
    pub heartbeat_ms: u64,
    pub election_ms: u64,
}

impl Default for ClusterOptions {
    fn default() -> Self {
        // Timings loose enough that a loaded test machine does not trigger elections on its
        // own, tight enough that a real one finishes in about a second.
        Self { members: 3, tls: None, auth_token_ttl: None, heartbeat_ms: 50, election_ms: 500 }
    }
}

/// What [`EtcdCluster::enable_auth`] sets up: a root user, and a user whose role may read
/// and write only the keys under `prefix`.
#[derive(Clone, Debug)]
pub struct AuthSetup {
    pub root_password: String,
    pub user: String,
    pub password: String,
    pub prefix: String,
}

/// Several etcd members on loopback forming one cluster; each can be killed and started
/// again (same name, ports and data). Killed on drop.
pub struct EtcdCluster {
    members: Vec<Member>,
    tls: Option<TlsFiles>,
    /// Root credentials once auth is on: the harness's own calls (status) use them.
    root: Option<String>,
    /// Dropped last: the members' data directories and logs.
    dir: tempfile::TempDir,
}

struct Member {
    name: String,
    child: Option<Child>,
    client_url: String,
    args: Vec<String>,
    log: PathBuf,
    /// Client, peer and metrics (plain `/health`) ports, held for the cluster's life.
    ports: [ReservedPort; 3],
}

impl EtcdCluster {
    /// Starts every member and waits until the cluster has a leader and each member is
    /// healthy. Panics (failing the test) when etcd is missing or does not come up.
    pub async fn start(options: ClusterOptions) -> Self {
        let binary = find_binary();
        let dir = tempfile::tempdir().expect("temp dir for the etcd cluster");
        let scheme = if options.tls.is_some() { "https" } else { "http" };
        let mut members = Vec::new();
        for i in 0..options.members {
            let ports = [ReservedPort::new(), ReservedPort::new(), ReservedPort::new()];
            members.push((format!("m{i}"), ports));
        }
        let initial_cluster = members
            .iter()
            .map(|(name, ports)| format!("{name}={scheme}://{}", ports[1].addr()))
            .collect::<Vec<_>>()
            .join(",");
        let members = members
            .into_iter()
            .map(|(name, ports)| {
                let client_url = format!("{scheme}://{}", ports[0].addr());
                let peer_url = format!("{scheme}://{}", ports[1].addr());
                let mut args = vec![
                    format!("--name={name}"),
                    format!("--data-dir={}", dir.path().join(&name).display()),
                    format!("--listen-client-urls={client_url}"),
                    format!("--advertise-client-urls={client_url}"),
                    format!("--listen-peer-urls={peer_url}"),
                    format!("--initial-advertise-peer-urls={peer_url}"),
                    format!("--listen-metrics-urls=http://{}", ports[2].addr()),
                    format!("--initial-cluster={initial_cluster}"),
                    "--initial-cluster-state=new".to_owned(),
                    "--initial-cluster-token=switchyard-test".to_owned(),
                    format!("--heartbeat-interval={}", options.heartbeat_ms),
                    format!("--election-timeout={}", options.election_ms),
                ];
                if let Some(ttl) = options.auth_token_ttl {
                    args.push(format!("--auth-token-ttl={}", ttl.as_secs().max(1)));
                }
                if let Some(tls) = &options.tls {
                    let (ca, cert, key) = (tls.ca.display(), tls.cert.display(), tls.key.display());
                    args.extend([
                        format!("--trusted-ca-file={ca}"),
                        format!("--cert-file={cert}"),
                        format!("--key-file={key}"),
                        "--client-cert-auth".to_owned(),
                        format!("--peer-trusted-ca-file={ca}"),
                        format!("--peer-cert-file={cert}"),
                        format!("--peer-key-file={key}"),
                        "--peer-client-cert-auth".to_owned(),
                    ]);
                }
                let log = dir.path().join(format!("{name}.log"));
                Member { name, child: None, client_url, args, log, ports }
            })
            .collect();
        let mut cluster = Self { members, tls: options.tls, root: None, dir };
        for i in 0..cluster.members.len() {
            cluster.spawn(&binary, i);
        }
        for i in 0..cluster.members.len() {
            cluster.wait_healthy(i).await;
        }
        cluster
    }

    pub fn len(&self) -> usize {
        self.members.len()
    }

    pub fn is_empty(&self) -> bool {
        self.members.is_empty()
    }

    /// Every member's client URL (`https://127.0.0.1:PORT` with TLS).
    pub fn endpoints(&self) -> Vec<String> {
        self.members.iter().map(|m| m.client_url.clone()).collect()
    }

    /// `etcd://127.0.0.1:P1,127.0.0.1:P2,…`, the control plane's `--store`.
    pub fn store_url(&self) -> String {
        let hosts: Vec<String> =
            self.members.iter().map(|m| m.ports[0].addr().to_string()).collect();
        format!("etcd://{}", hosts.join(","))
    }

    pub fn name(&self, member: usize) -> &str {
        &self.members[member].name
    }

    /// Where member `i` logs.
    pub fn log_path(&self, member: usize) -> &Path {
        &self.members[member].log
    }

    pub fn dir(&self) -> &Path {
        self.dir.path()
    }

    /// Kills member `i` (SIGKILL: no goodbye to its peers). Its ports stay reserved.
    pub async fn kill(&mut self, member: usize) {
        if let Some(mut child) = self.members[member].child.take() {
            let _ = child.kill().await;
        }
    }

    /// Starts member `i` again on its data, without waiting (a member of a cluster without
    /// quorum is not healthy on its own: see [`Self::wait_healthy`]).
    pub fn restart(&mut self, member: usize) {
        assert!(self.members[member].child.is_none(), "member {member} is running");
        self.spawn(&find_binary(), member);
    }

    /// Waits until member `i` is healthy (it has a leader and answers).
    pub async fn wait_healthy(&mut self, member: usize) {
        let started = Instant::now();
        let addr = self.members[member].ports[2].addr();
        loop {
            let m = &mut self.members[member];
            if let Some(child) = m.child.as_mut()
                && let Ok(Some(status)) = child.try_wait()
            {
                let log = std::fs::read_to_string(&m.log).unwrap_or_default();
                panic!("etcd member {} exited with {status}; its log:\n{}", m.name, tail(&log));
            }
            if healthy(addr).await {
                return;
            }
            if started.elapsed() > READY_TIMEOUT {
                let log = std::fs::read_to_string(&m.log).unwrap_or_default();
                panic!(
                    "etcd member {} not healthy after {READY_TIMEOUT:?}; its log:\n{}",
                    m.name,
                    tail(&log)
                );
            }
            // Polling interval of the health check.
            tokio::time::sleep(Duration::from_millis(25)).await;
        }
    }

    fn spawn(&mut self, binary: &Path, member: usize) {
        let m = &mut self.members[member];
        let log = std::fs::OpenOptions::new()
            .create(true)
            .append(true)
            .open(&m.log)
            .expect("etcd log file");
        let child = etcd_command(binary, log)
            .expect("etcd log file")
            .args(&m.args)
            .spawn()
            .unwrap_or_else(|e| panic!("spawning {}: {e}", binary.display()));
        m.child = Some(child);
    }

    /// A gRPC channel to member `i`, presenting `identity` (certificate, key) when the
    /// cluster has TLS.
    pub async fn channel(
        &self,
        member: usize,
        identity: Option<(&Path, &Path)>,
    ) -> tonic::transport::Channel {
        use switchyard_tls::connect::ClientTls;
        use switchyard_tls::files::Source;
        use tonic::transport::Endpoint;
        let url = self.members[member].client_url.clone();
        let endpoint = Endpoint::from_shared(url.clone())
            .expect("member URL")
            .connect_timeout(Duration::from_secs(2))
            .timeout(Duration::from_secs(5));
        match &self.tls {
            Some(tls) => {
                let (cert, key) = identity.unwrap_or((&tls.cert, &tls.key));
                let client = ClientTls::new(
                    Some(Source::new("--etcd-ca", &tls.ca)),
                    Some((Source::new("--etcd-cert", cert), Source::new("--etcd-key", key))),
                )
                .expect("TLS files");
                endpoint.connect_with_connector_lazy(client.connector(&url).expect("member URL"))
            }
            None => endpoint.connect_lazy(),
        }
    }

    /// Turns authentication on through etcd's Auth RPCs (as `etcdctl user add`, `role add`,
    /// `role grant-permission --prefix`, `auth enable` would): user `root` with the root
    /// role, and `setup.user` whose role may read and write the keys under `setup.prefix`.
    pub async fn enable_auth(&mut self, setup: &AuthSetup) {
        use switchyard_proto::etcd as pb;
        use switchyard_proto::etcd::auth_client::AuthClient;
        let mut auth = AuthClient::new(self.channel(0, None).await);
        auth.user_add(pb::AuthUserAddRequest {
            name: "root".into(),
            password: setup.root_password.clone(),
        })
        .await
        .expect("add user root");
        auth.role_add(pb::AuthRoleAddRequest { name: "root".into() }).await.expect("add role root");
        auth.user_grant_role(pb::AuthUserGrantRoleRequest {
            user: "root".into(),
            role: "root".into(),
        })
        .await
        .expect("grant root");
        let role = format!("{}-role", setup.user);
        auth.role_add(pb::AuthRoleAddRequest { name: role.clone() }).await.expect("add role");
        // The empty prefix is every key: etcd's "\0" to "\0".
        let key = if setup.prefix.is_empty() { vec![0] } else { setup.prefix.as_bytes().to_vec() };
        auth.role_grant_permission(pb::AuthRoleGrantPermissionRequest {
            name: role.clone(),
            perm: Some(pb::Permission {
                perm_type: pb::permission::Type::Readwrite as i32,
                key,
                range_end: prefix_end(setup.prefix.as_bytes()),
            }),
        })
        .await
        .expect("grant the prefix");
        auth.user_add(pb::AuthUserAddRequest {
            name: setup.user.clone(),
            password: setup.password.clone(),
        })
        .await
        .expect("add the user");
        auth.user_grant_role(pb::AuthUserGrantRoleRequest { user: setup.user.clone(), role })
            .await
            .expect("grant the role");
        auth.auth_enable(pb::AuthEnableRequest {}).await.expect("enable auth");
        self.root = Some(setup.root_password.clone());
    }

    /// The index of the member that currently leads, asked of the live members through
    /// `Maintenance.Status`; `None` when none of them knows of a leader.
    pub async fn leader(&self) -> Option<usize> {
        use switchyard_proto::etcd as pb;
        use switchyard_proto::etcd::maintenance_client::MaintenanceClient;
        let mut ids = vec![None; self.members.len()];
        let mut leader = None;
        for (i, member) in self.members.iter().enumerate() {
            if member.child.is_none() {
                continue;
            }
            let mut client = MaintenanceClient::new(self.channel(i, None).await);
            let mut request = tonic::Request::new(pb::StatusRequest {});
            if let Some(token) = self.root_token(i).await {
                request.metadata_mut().insert("token", token.parse().expect("ASCII token"));
            }
            if let Ok(response) = client.status(request).await {
                let status = response.into_inner();
                ids[i] = status.header.map(|h| h.member_id);
                if status.leader != 0 {
                    leader = Some(status.leader);
                }
            }
        }
        let leader = leader?;
        ids.iter().position(|id| *id == Some(leader))
    }

    async fn root_token(&self, member: usize) -> Option<String> {
        use switchyard_proto::etcd as pb;
        use switchyard_proto::etcd::auth_client::AuthClient;
        let password = self.root.clone()?;
        let mut auth = AuthClient::new(self.channel(member, None).await);
        let response = auth
            .authenticate(pb::AuthenticateRequest { name: "root".into(), password })
            .await
            .ok()?;
        Some(response.into_inner().token)
    }
}

/// etcd's prefix convention: the range end is the prefix with its last byte plus one.
fn prefix_end(prefix: &[u8]) -> Vec<u8> {
    let mut end = prefix.to_vec();
    while let Some(last) = end.pop() {
        if last < 0xff {
            end.push(last + 1);
            return end;
        }
    }
    vec![0]
}
