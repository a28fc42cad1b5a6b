//! Harness for Switchyard's end-to-end tests: real `switchyard` processes (and a real etcd)
//! on loopback, driven the way users drive them — the CLI and HTTP.
#![allow(clippy::expect_used, clippy::unwrap_used, clippy::panic)]

use std::io::Write;
use std::net::SocketAddr;
use std::path::{Path, PathBuf};
use std::process::Stdio;
use std::time::{Duration, Instant};

use http_body_util::{BodyExt, Full};
use hyper::body::Bytes;
use tokio::io::{AsyncBufReadExt, AsyncReadExt, AsyncWriteExt, BufReader};
use tokio::process::{Child, Command};

pub mod fake_node;
pub mod gateway;
pub mod otlp;
pub mod tls;

/// For a process that must come back on the address it had (a control plane that nodes look
/// for, a webhook receiver a subscription points at); every other process binds port 0 and
/// [`Proc::start`] reads the address it bound.
pub use switchyard_test_support::port::ReservedPort;
/// A throw-away etcd, a fleet of lean node clients and test certificates, shared with the
/// store tests and the bench.
pub use switchyard_test_support::{etcd, node_fleet, pki};
/// Wall-clock milliseconds since the Unix epoch, as the processes under test stamp them.
pub use switchyard_time::now_ms;

pub const ADMIN_TOKEN: &str = "e2e-admin-token-0123456789";

/// How long a test waits for something that takes milliseconds on an idle machine (a
/// process to start, a change to reach a node): generous, because the machine may be busy,
/// and paid in full only by a test that fails. Bounds that are the behaviour under test
/// ("within a second") are written out where they are asserted.
pub const PATIENCE: Duration = Duration::from_secs(30);

/// Makes room for `needed` open files in this test process (and the processes it starts,
/// which inherit the limit), raising the soft limit up to the hard one; fails naming the
/// limit when even the hard limit is too low.
pub fn ensure_open_files(needed: u64) {
    use rustix::process::{Resource, Rlimit, getrlimit, setrlimit};
    let Rlimit { current, maximum } = getrlimit(Resource::Nofile);
    if current.is_none_or(|c| c >= needed) {
        return;
    }
    assert!(
        maximum.is_none_or(|m| m >= needed),
        "this test needs {needed} open files; the hard limit is {maximum:?} (raise it: ulimit -Hn)"
    );
    let wanted = Rlimit { current: maximum, maximum };
    setrlimit(Resource::Nofile, wanted).expect("raising the open-files soft limit");
}

/// The `switchyard` binary cargo built next to this test (target/<profile>/switchyard).
pub fn switchyard_bin() -> PathBuf {
    if let Some(path) = std::env::var_os("SWITCHYARD_BIN") {
        return PathBuf::from(path);
    }
    let exe = std::env::current_exe().expect("test executable path");
    // target/<profile>/deps/<test> → target/<profile>/switchyard
    let profile_dir = exe.parent().and_then(Path::parent).expect("target dir");
    let bin = profile_dir.join("switchyard");
    assert!(
        bin.is_file(),
        "{} not found: build it first (`cargo build -p switchyard-cli`; `cargo nextest run --workspace` does)",
        bin.display()
    );
    bin
}

/// The Python with the official `openai` and `anthropic` SDKs: `$SWITCHYARD_PYTHON`, else
/// the repository's `.venv` that `.ci/run` creates.
pub fn python() -> PathBuf {
    if let Some(p) = std::env::var_os("SWITCHYARD_PYTHON") {
        return PathBuf::from(p);
    }
    let venv = PathBuf::from(env!("CARGO_MANIFEST_DIR")).join("../.venv/bin/python");
    assert!(
        venv.is_file(),
        "{} not found: run .ci/run (it creates .venv with the `openai` package), or set SWITCHYARD_PYTHON \
         to a Python that has it (`python3 -m venv .venv && .venv/bin/pip install openai`)",
        venv.display()
    );
    venv
}

/// The Claude Code version `.ci/run` installs and the tests were written against.
pub const CLAUDE_CODE_VERSION: &str = "2.1.197";

/// Claude Code's `claude` binary: `$SWITCHYARD_CLAUDE`, else the one `.ci/run` installs into
/// the repository's `.tools/npm`. Missing, it fails the test with how to install it: a test
/// of Claude Code that skips where it is absent would pass without having run.
pub fn claude() -> PathBuf {
    if let Some(p) = std::env::var_os("SWITCHYARD_CLAUDE") {
        return PathBuf::from(p);
    }
    let bin =
        PathBuf::from(env!("CARGO_MANIFEST_DIR")).join("../.tools/npm/node_modules/.bin/claude");
    assert!(
        bin.is_file(),
        "{} not found: run .ci/run (it installs Claude Code into .tools/npm), or `npm install \
         --prefix .tools/npm @anthropic-ai/claude-code@{CLAUDE_CODE_VERSION}`, or set \
         SWITCHYARD_CLAUDE to a `claude` binary",
        bin.display()
    );
    bin
}

/// The Codex CLI version `.ci/run` installs and the tests were written against.
pub const CODEX_VERSION: &str = "0.171.0";

/// The Codex CLI's `codex` binary: `$SWITCHYARD_CODEX`, else the one `.ci/run` installs into
/// the repository's `.tools/npm`. Missing, it fails the test with how to install it.
pub fn codex() -> PathBuf {
    if let Some(p) = std::env::var_os("SWITCHYARD_CODEX") {
        return PathBuf::from(p);
    }
    let bin =
        PathBuf::from(env!("CARGO_MANIFEST_DIR")).join("../.tools/codex/node_modules/.bin/codex");
    assert!(
        bin.is_file(),
        "{} not found: run .ci/run (it installs Codex into .tools/codex), or `npm install \
         --prefix .tools/codex @openai/codex@{CODEX_VERSION}`, or set SWITCHYARD_CODEX to a \
         `codex` binary",
        bin.display()
    );
    bin
}

/// A running `switchyard` server process, killed on drop.
pub struct Proc {
    pub child: Child,
    pub addr: SocketAddr,
    pub log: PathBuf,
}

impl Proc {
    /// Starts `switchyard ARGS` and waits for its "listening on ADDR" line on stdout: with
    /// `--listen 127.0.0.1:0` the process binds a port of its own, and `addr` is where it did.
    pub async fn start(args: &[&str], envs: &[(&str, &str)], log: PathBuf) -> Proc {
        match Self::try_start(args, envs, log).await {
            Ok(proc) => proc,
            Err(why) => panic!("{why}"),
        }
    }

    /// Like [`Proc::start`], but says why it did not start instead of panicking.
    pub async fn try_start(
        args: &[&str],
        envs: &[(&str, &str)],
        log: PathBuf,
    ) -> Result<Proc, String> {
        let log_file = std::fs::File::create(&log).unwrap();
        let mut cmd = Command::new(switchyard_bin());
        cmd.args(args)
            .env("RUST_LOG", "info")
            .env_remove("SWITCHYARD_JOIN_TOKEN")
            .env_remove("SWITCHYARD_ADMIN_TOKEN")
            .stdin(Stdio::null())
            .stdout(Stdio::piped())
            .stderr(Stdio::from(log_file))
            .kill_on_drop(true);
        for (k, v) in envs {
            cmd.env(k, v);
        }
        let mut child = cmd.spawn().unwrap();
        let stdout = child.stdout.take().unwrap();
        let mut lines = BufReader::new(stdout).lines();
        // What the process prints on stdout is kept too, beside its log (`stdout_text`).
        let mut stdout_log = std::fs::File::create(stdout_path(&log)).unwrap();
        let addr = tokio::time::timeout(PATIENCE, async {
            while let Some(line) = lines.next_line().await.unwrap() {
                let _ = writeln!(stdout_log, "{line}");
                if let Some((_, addr)) = line.split_once("listening on ") {
                    return addr.trim().parse::<SocketAddr>().ok();
                }
            }
            None
        })
        .await
        .ok()
        .flatten();
        let Some(addr) = addr else {
            let _ = child.kill().await;
            let log_text = std::fs::read_to_string(&log).unwrap_or_default();
            return Err(format!("switchyard {args:?} did not start; its log:\n{log_text}"));
        };
        // Keep draining stdout so the process never blocks on a full pipe.
        tokio::spawn(async move {
            while let Ok(Some(line)) = lines.next_line().await {
                let _ = writeln!(stdout_log, "{line}");
            }
        });
        Ok(Proc { child, addr, log })
    }

    pub fn url(&self) -> String {
        format!("http://{}", self.addr)
    }

    pub async fn kill(mut self) {
        let _ = self.child.kill().await;
        let _ = self.child.wait().await;
    }

    pub fn log_text(&self) -> String {
        std::fs::read_to_string(&self.log).unwrap_or_default()
    }

    /// Everything the process printed on stdout so far (its log, `log_text`, is stderr).
    pub fn stdout_text(&self) -> String {
        std::fs::read_to_string(stdout_path(&self.log)).unwrap_or_default()
    }
}

/// Where [`Proc`] keeps a process's stdout: beside its log, `NAME.log` → `NAME.stdout`.
fn stdout_path(log: &Path) -> PathBuf {
    log.with_extension("stdout")
}

/// Starts the simulator (`switchyard sim`, as every test and benchmark starts it) with its
/// log in `log`.
pub async fn start_sim(log: PathBuf) -> Proc {
    Proc::start(&switchyard_test_support::sim::SIM_ARGS, &[], log).await
}

/// Starts a control plane on `store` (`etcd://…` or `file://…`), listening on `listen`.
pub async fn start_control(store: &str, listen: &str, dir: &Path, name: &str) -> Proc {
    start_control_with_env(store, listen, dir, name, &[]).await
}

/// Like [`start_control`], with more environment (e.g. `OTEL_*`).
pub async fn start_control_with_env(
    store: &str,
    listen: &str,
    dir: &Path,
    name: &str,
    env: &[(&str, &str)],
) -> Proc {
    start_control_with(store, listen, dir, name, env, &[]).await
}

/// Like [`start_control_with_env`], with more flags (e.g. `--tls-cert`).
pub async fn start_control_with(
    store: &str,
    listen: &str,
    dir: &Path,
    name: &str,
    env: &[(&str, &str)],
    flags: &[&str],
) -> Proc {
    let mut envs = vec![("SWITCHYARD_ADMIN_TOKEN", ADMIN_TOKEN)];
    envs.extend_from_slice(env);
    let mut args = vec!["control", "--store", store, "--listen", listen];
    args.extend_from_slice(flags);
    Proc::start(&args, &envs, dir.join(format!("{name}.log"))).await
}

/// Starts a node following the given control planes (comma-separated URLs).
pub async fn start_node(controls: &str, data_dir: &Path, listen: &str, log: PathBuf) -> Proc {
    let data = data_dir.display().to_string();
    Proc::start(&["node", "--control", controls, "--listen", listen, "--data-dir", &data], &[], log)
        .await
}

pub struct CliOutput {
    pub success: bool,
    pub code: Option<i32>,
    pub stdout: String,
    pub stderr: String,
}

impl CliOutput {
    pub fn json(&self) -> serde_json::Value {
        assert!(self.success, "command failed: {}\n{}", self.stderr, self.stdout);
        serde_json::from_str(&self.stdout)
            .unwrap_or_else(|e| panic!("stdout is not JSON ({e}): {}", self.stdout))
    }
}

/// Runs an admin command against `control` with the e2e admin token.
pub async fn cli(control: &str, args: &[&str]) -> CliOutput {
    cli_with_env(control, args, &[("SWITCHYARD_ADMIN_TOKEN", ADMIN_TOKEN)]).await
}

pub async fn cli_with_env(control: &str, args: &[&str], envs: &[(&str, &str)]) -> CliOutput {
    let mut cmd = Command::new(switchyard_bin());
    cmd.args(args).env("SWITCHYARD_CONTROL", control).env_remove("SWITCHYARD_ADMIN_TOKEN");
    for (k, v) in envs {
        cmd.env(k, v);
    }
    let out = cmd.output().await.unwrap();
    CliOutput {
        success: out.status.success(),
        code: out.status.code(),
        stdout: String::from_utf8_lossy(&out.stdout).into_owned(),
        stderr: String::from_utf8_lossy(&out.stderr).into_owned(),
    }
}

pub struct HttpResponse {
    pub status: u16,
    pub headers: String,
    pub body: String,
}

impl HttpResponse {
    pub fn json(&self) -> serde_json::Value {
        serde_json::from_str(&self.body).unwrap_or(serde_json::Value::Null)
    }

    /// A response header's value (the first, if sent more than once).
    pub fn header(&self, name: &str) -> Option<String> {
        self.headers.lines().skip(1).find_map(|l| {
            let (k, v) = l.split_once(':')?;
            k.trim().eq_ignore_ascii_case(name).then(|| v.trim().to_owned())
        })
    }
}

/// An HTTP/1.1 GET on a connection of its own; `None` if nothing answers.
pub async fn http_get(addr: SocketAddr, path: &str, bearer: Option<&str>) -> Option<HttpResponse> {
    http_request(addr, "GET", path, bearer, None).await
}

/// An HTTP/1.1 request on a connection of its own, with an optional JSON body.
pub async fn http_request(
    addr: SocketAddr,
    method: &str,
    path: &str,
    bearer: Option<&str>,
    body: Option<&[u8]>,
) -> Option<HttpResponse> {
    http_request_with(addr, method, path, bearer, &[], body).await
}

/// [`http_request`] with more request headers, sent as given (`name`, raw `value`).
pub async fn http_request_with(
    addr: SocketAddr,
    method: &str,
    path: &str,
    bearer: Option<&str>,
    headers: &[(&str, &[u8])],
    body: Option<&[u8]>,
) -> Option<HttpResponse> {
    let stream = tokio::net::TcpStream::connect(addr).await.ok()?;
    read_response(http_send(stream, addr, method, path, bearer, headers, body).await?).await
}

/// Reads `body` into `received` until `enough` holds for what came so far, or the body ends
/// (cut off, too: what came before the cut is kept); whether `enough` was reached.
pub async fn read_body_until(
    body: &mut hyper::body::Incoming,
    received: &mut Vec<u8>,
    enough: impl Fn(&[u8]) -> bool,
) -> bool {
    while !enough(received) {
        let Some(Ok(frame)) = body.frame().await else { return false };
        if let Ok(data) = frame.into_data() {
            received.extend_from_slice(&data);
        }
    }
    true
}

/// A response read to its end; `None` if the body could not be.
pub async fn read_response(
    (head, body): (hyper::http::response::Parts, hyper::body::Incoming),
) -> Option<HttpResponse> {
    let body = String::from_utf8_lossy(&body.collect().await.ok()?.to_bytes()).into_owned();
    Some(HttpResponse { status: head.status.as_u16(), headers: response_head(&head), body })
}

/// One HTTP/1.1 request on `stream` (plain TCP, or TLS from [`tls`]), on hyper's client:
/// the response's head and its body, unread; `None` if the connection or the exchange fails.
pub async fn http_send<S>(
    stream: S,
    addr: SocketAddr,
    method: &str,
    path: &str,
    bearer: Option<&str>,
    headers: &[(&str, &[u8])],
    body: Option<&[u8]>,
) -> Option<(hyper::http::response::Parts, hyper::body::Incoming)>
where
    S: tokio::io::AsyncRead + tokio::io::AsyncWrite + Unpin + Send + 'static,
{
    use hyper::header::{AUTHORIZATION, CONTENT_TYPE, HOST};
    let (mut sender, connection) =
        hyper::client::conn::http1::handshake(hyper_util::rt::TokioIo::new(stream)).await.ok()?;
    // The connection ends when the response has been read and `sender` is dropped.
    tokio::spawn(connection);
    let mut request =
        hyper::Request::builder().method(method).uri(path).header(HOST, addr.to_string());
    if let Some(key) = bearer {
        request = request.header(AUTHORIZATION, format!("Bearer {key}"));
    }
    if body.is_some() {
        request = request.header(CONTENT_TYPE, "application/json");
    }
    for (name, value) in headers {
        // As given: a test's malformed value (a tab, UTF-8) is what the node must judge.
        request = request.header(*name, hyper::header::HeaderValue::from_bytes(value).ok()?);
    }
    let body = Full::new(Bytes::copy_from_slice(body.unwrap_or_default()));
    let response = sender.send_request(request.body(body).ok()?).await.ok()?;
    Some(response.into_parts())
}

/// A response's status line and headers as they came on the wire (header names lower-case),
/// one per line.
pub fn response_head(response: &hyper::http::response::Parts) -> String {
    let mut head = format!(
        "{:?} {} {}",
        response.version,
        response.status.as_u16(),
        response.status.canonical_reason().unwrap_or_default()
    );
    for (name, value) in &response.headers {
        head.push_str(&format!("\r\n{name}: {}", String::from_utf8_lossy(value.as_bytes())));
    }
    head
}

/// A minimal HTTP/1.1 keep-alive server on loopback (a webhook receiver, say): each request's
/// path and body go to `reply`, whose bytes are written back as the whole response.
pub async fn http_receiver(
    reply: impl Fn(&str, &[u8]) -> &'static [u8] + Send + Sync + 'static,
) -> SocketAddr {
    let listener = tokio::net::TcpListener::bind("127.0.0.1:0").await.unwrap();
    let addr = listener.local_addr().unwrap();
    let reply = std::sync::Arc::new(reply);
    tokio::spawn(async move {
        while let Ok((mut socket, _)) = listener.accept().await {
            let reply = std::sync::Arc::clone(&reply);
            tokio::spawn(async move {
                let mut buf = Vec::new();
                let mut chunk = [0u8; 65536];
                loop {
                    let head_end = buf.windows(4).position(|w| w == b"\r\n\r\n");
                    let length = head_end.map(|end| {
                        let head = String::from_utf8_lossy(&buf[..end]).to_ascii_lowercase();
                        let length = head
                            .lines()
                            .find_map(|l| l.strip_prefix("content-length:"))
                            .and_then(|v| v.trim().parse::<usize>().ok());
                        (end, head, length.unwrap_or(0))
                    });
                    let Some((end, head, length)) =
                        length.filter(|(end, _, length)| buf.len() >= end + 4 + length)
                    else {
                        match socket.read(&mut chunk).await {
                            Ok(0) | Err(_) => return,
                            Ok(n) => buf.extend_from_slice(&chunk[..n]),
                        }
                        continue;
                    };
                    let path = head.split_whitespace().nth(1).unwrap_or_default().to_owned();
                    let answer = reply(&path, &buf[end + 4..end + 4 + length]);
                    buf.drain(..end + 4 + length);
                    if socket.write_all(answer).await.is_err() {
                        return;
                    }
                }
            });
        }
    });
    addr
}

/// Polls `check` every 10 ms until it returns `Some`, or panics after `timeout` naming `what`.
pub async fn eventually<T, F, Fut>(timeout: Duration, what: &str, mut check: F) -> T
where
    F: FnMut() -> Fut,
    Fut: std::future::Future<Output = Option<T>>,
{
    let start = Instant::now();
    loop {
        if let Some(value) = check().await {
            return value;
        }
        if start.elapsed() > timeout {
            panic!("timed out after {timeout:?} waiting for: {what}");
        }
        // The polling interval.
        tokio::time::sleep(Duration::from_millis(10)).await;
    }
}

/// The config version a node reports on /readyz (`None`: not ready or not answering).
pub async fn node_version(addr: SocketAddr) -> Option<i64> {
    let response = http_get(addr, "/readyz", None).await?;
    if response.status != 200 {
        return None;
    }
    response.json()["config_version"].as_i64()
}

/// Percentile (0–100) of a list of durations, nearest rank.
pub fn percentile(samples: &[Duration], p: f64) -> Duration {
    let mut sorted = samples.to_vec();
    sorted.sort();
    let rank = ((p / 100.0) * sorted.len() as f64).ceil() as usize;
    sorted[rank.clamp(1, sorted.len()) - 1]
}

/// Runs `tests/e2e/SCRIPT` (a Python check with the official SDKs in `.venv`) with `args`,
/// without any `OPENAI_*` or `ANTHROPIC_*` setting of the environment leaking in; asserts it succeeded and
/// returns what it printed.
pub async fn sdk_script(script: &str, args: &[&str]) -> String {
    let path = Path::new(env!("CARGO_MANIFEST_DIR")).join("e2e").join(script);
    let out = Command::new(python())
        .arg(&path)
        .args(args)
        .env_remove("OPENAI_API_KEY")
        .env_remove("OPENAI_BASE_URL")
        .env_remove("OPENAI_MAX_RETRIES")
        .env_remove("ANTHROPIC_API_KEY")
        .env_remove("ANTHROPIC_AUTH_TOKEN")
        .env_remove("ANTHROPIC_BASE_URL")
        .output()
        .await
        .unwrap();
    let stdout = String::from_utf8_lossy(&out.stdout).into_owned();
    assert!(
        out.status.success(),
        "{script} failed:\n{stdout}\n{}",
        String::from_utf8_lossy(&out.stderr)
    );
    stdout
}

/// `promtool check metrics` on `text`: its exit status and what it printed.
pub async fn promtool(text: &str) -> (bool, String) {
    let mut child = Command::new("promtool")
        .args(["check", "metrics"])
        .stdin(Stdio::piped())
        .stdout(Stdio::piped())
        .stderr(Stdio::piped())
        .spawn()
        .expect(
            "promtool not found: install Debian's `prometheus` package (`.ci/run` does), \
             which ships it",
        );
    let mut stdin = child.stdin.take().expect("promtool's stdin");
    stdin.write_all(text.as_bytes()).await.expect("promtool takes the metrics text");
    drop(stdin);
    let out = child.wait_with_output().await.expect("promtool ran");
    let said =
        format!("{}{}", String::from_utf8_lossy(&out.stdout), String::from_utf8_lossy(&out.stderr));
    (out.status.success(), said)
}
