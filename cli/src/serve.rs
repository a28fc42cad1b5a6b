//! The long-running subcommands: `control`, `node` and `dev`.

use std::net::SocketAddr;
use std::path::{Path, PathBuf};
use std::time::Duration;

use clap::Args;
use switchyard_sim::{Behaviour, Reply, StatusReply};

use switchyard_control_plane::audit::AuditRetention;
use switchyard_control_plane::reports::BREAKER_GRACE;
use switchyard_control_plane::server::{self, ControlError, ControlOptions};
use switchyard_control_plane::store::etcd::{EtcdCredentials, EtcdOptions, EtcdTls};
use switchyard_control_plane::webhooks::DeliveryOptions;
use switchyard_data_plane::node::{self, NodeError, NodeOptions};

use switchyard_tls::accept::Acceptor;
use switchyard_tls::config::{self as tls_config, H2, HTTP11};
use switchyard_tls::connect::ClientTls;
use switchyard_tls::files::{Source, TlsError};

use crate::token::{self, ADMIN_TOKEN_ENV, JOIN_TOKEN_ENV};

/// The etcd user the control plane authenticates as (with [`ETCD_PASSWORD_ENV`]).
const ETCD_USER_ENV: &str = "SWITCHYARD_ETCD_USER";
const ETCD_PASSWORD_ENV: &str = "SWITCHYARD_ETCD_PASSWORD";

#[derive(Debug, thiserror::Error)]
pub enum ServeError {
    #[error("{0}")]
    Config(String),
    #[error(transparent)]
    Control(#[from] ControlError),
    #[error(transparent)]
    Node(#[from] NodeError),
    #[error(transparent)]
    Sim(#[from] switchyard_sim::SimError),
    #[error(transparent)]
    Otel(#[from] switchyard_otel::OtelError),
    #[error(transparent)]
    Tls(#[from] TlsError),
}

/// How long a client may take over the TLS handshake on the control plane's listener.
const CONTROL_HANDSHAKE_TIMEOUT: Duration = Duration::from_secs(10);

#[derive(Debug, Args)]
pub struct ControlArgs {
    /// Where keys, catalog and node presence live: etcd://host:2379[,host:2379] or file://DIR.
    #[arg(long, env = "SWITCHYARD_STORE")]
    pub store: String,
    /// CA certificate (PEM) that signed the etcd members' certificates: etcd endpoints are
    /// reached over https:// and verified against it.
    #[arg(long, env = "SWITCHYARD_ETCD_CA", value_name = "FILE")]
    pub etcd_ca: Option<PathBuf>,
    /// Client certificate (PEM) for etcd's --client-cert-auth (with --etcd-key).
    #[arg(long, env = "SWITCHYARD_ETCD_CERT", value_name = "FILE", requires_all = ["etcd_key", "etcd_ca"])]
    pub etcd_cert: Option<PathBuf>,
    /// Private key (PEM) of --etcd-cert.
    #[arg(long, env = "SWITCHYARD_ETCD_KEY", value_name = "FILE", requires = "etcd_cert")]
    pub etcd_key: Option<PathBuf>,
    /// Address of the gRPC listener (admin API and node streams).
    #[arg(long, default_value = "127.0.0.1:7400", env = "SWITCHYARD_LISTEN")]
    pub listen: SocketAddr,
    /// Key prefix in the store.
    #[arg(long, default_value = "/switchyard/")]
    pub prefix: String,
    /// File holding the admin token (instead of SWITCHYARD_ADMIN_TOKEN); one of the two is
    /// required, at least 16 characters.
    #[arg(long)]
    pub admin_token_file: Option<PathBuf>,
    /// File holding the node join token (instead of SWITCHYARD_JOIN_TOKEN).
    #[arg(long)]
    pub join_token_file: Option<PathBuf>,
    /// Failover events kept in the audit log; the oldest beyond this are pruned.
    #[arg(long, default_value_t = AuditRetention::default().max_entries)]
    pub audit_max_entries: usize,
    /// Age after which audit-log events are pruned: 30s, 15m, 12h, 7d.
    #[arg(long, default_value = "7d", value_parser = switchyard_time::parse_duration)]
    pub audit_max_age: std::time::Duration,
    /// Webhook events not delivered after this long become dead letters (once the endpoint
    /// fails again): 30s, 15m, 12h, 7d.
    #[arg(long, default_value = "24h", value_parser = switchyard_time::parse_duration)]
    pub webhook_max_age: Duration,
    /// Time limit of one webhook request, in milliseconds.
    #[arg(long, default_value_t = 10_000, value_name = "MS")]
    pub webhook_timeout_ms: u64,
    /// Webhook requests in flight per subscription.
    #[arg(long, default_value_t = 8, value_parser = clap::value_parser!(u16).range(1..=256))]
    pub webhook_concurrency: u16,
    /// First retry backoff ceiling, in milliseconds; doubles per failure (full jitter).
    #[arg(long, default_value_t = 500, value_name = "MS")]
    pub webhook_min_backoff_ms: u64,
    /// Largest retry backoff, in milliseconds.
    #[arg(long, default_value_t = 60_000, value_name = "MS")]
    pub webhook_max_backoff_ms: u64,
    /// How long a node may be gone before `node.disconnected` is sent (and its breaker
    /// records go): 30s, 5m.
    #[arg(long, default_value = "30s", value_parser = switchyard_time::parse_duration)]
    pub node_grace: Duration,
    /// On SIGTERM or SIGINT, how long calls in flight may take to finish once node streams
    /// are closed: 10s, 1m.
    #[arg(long, default_value = "10s", value_parser = parse_server_timeout)]
    pub drain_timeout: Duration,
    /// PEM certificate (chain) of the gRPC listener: with --tls-key it serves TLS only.
    /// Re-read when the file changes.
    #[arg(long, env = "SWITCHYARD_TLS_CERT", value_name = "FILE", requires = "tls_key")]
    pub tls_cert: Option<PathBuf>,
    /// PEM private key of --tls-cert. Re-read when the file changes.
    #[arg(long, env = "SWITCHYARD_TLS_KEY", value_name = "FILE", requires = "tls_cert")]
    pub tls_key: Option<PathBuf>,
    /// PEM CA certificate(s): nodes and admin clients must present a certificate signed by
    /// one (mutual TLS; the join and admin tokens still apply). Needs --tls-cert.
    #[arg(long, env = "SWITCHYARD_CLIENT_CA", value_name = "FILE", requires = "tls_cert")]
    pub client_ca: Option<PathBuf>,
    /// Turns the web console (`/ui` on this listener) off.
    #[arg(long)]
    pub no_ui: bool,
}

#[derive(Debug, Args)]
pub struct NodeArgs {
    /// Control-plane URL(s), comma-separated; the node fails over between them.
    #[arg(
        long,
        env = "SWITCHYARD_CONTROL",
        default_value = "http://127.0.0.1:7400",
        value_parser = parse_control_urls
    )]
    pub control: String,
    /// Address of the HTTP listener.
    #[arg(long, default_value = "127.0.0.1:8080")]
    pub listen: SocketAddr,
    /// Keeps the node's identity and last-known-good config.
    #[arg(long)]
    pub data_dir: Option<PathBuf>,
    /// Stable node id (default: generated once and kept in --data-dir).
    #[arg(long)]
    pub node_id: Option<String>,
    /// File holding the join token (instead of SWITCHYARD_JOIN_TOKEN).
    #[arg(long)]
    pub join_token_file: Option<PathBuf>,
    /// Largest accepted request body, in bytes (at least 1); larger ones get 413.
    #[arg(
        long,
        default_value_t = switchyard_data_plane::http::DEFAULT_MAX_BODY_BYTES,
        value_parser = parse_max_body_bytes
    )]
    pub max_body_bytes: usize,
    /// Longest a client may take to send a request's head, and longest an idle keep-alive
    /// connection stays open: 500ms, 30s, 2m.
    #[arg(long, default_value = "30s", value_parser = parse_server_timeout)]
    pub header_read_timeout: Duration,
    /// Longest a client may take to send a request's body once its head is in; a slower
    /// one gets 408: 10s, 30s, 2m.
    #[arg(long, default_value = "30s", value_parser = parse_server_timeout)]
    pub body_read_timeout: Duration,
    /// On SIGTERM or SIGINT, how long requests and streams in flight may take to finish
    /// before their connections are closed: 30s, 2m.
    #[arg(long, default_value = "30s", value_parser = parse_server_timeout)]
    pub drain_timeout: Duration,
    /// Largest size of the failover events kept in --data-dir while no control plane takes
    /// them, in MiB (at least 1); beyond it events are counted as lost.
    #[arg(long, default_value_t = 256, value_parser = parse_spool_mib)]
    pub event_spool_max_mib: u64,
    /// Failover events held in memory for the control plane (sent or queued, not yet
    /// acked), at least 1; beyond it they go to the spool in --data-dir, or are counted as
    /// lost without one.
    #[arg(long, default_value_t = switchyard_data_plane::telemetry::MAX_EVENTS, value_parser = parse_event_buffer)]
    pub event_buffer_events: usize,
    /// PEM CA certificate(s) that `https://` control planes' certificates must be signed by
    /// (default: the public web's CAs). Re-read when the file changes.
    #[arg(long, env = "SWITCHYARD_CONTROL_CA", value_name = "FILE")]
    pub control_ca: Option<PathBuf>,
    /// PEM certificate (chain): the HTTP listener serves HTTPS (HTTP/1.1 and HTTP/2), and it
    /// is the node's client certificate for control planes that require one. Re-read when
    /// the file changes.
    #[arg(long, env = "SWITCHYARD_TLS_CERT", value_name = "FILE", requires = "tls_key")]
    pub tls_cert: Option<PathBuf>,
    /// PEM private key of --tls-cert. Re-read when the file changes.
    #[arg(long, env = "SWITCHYARD_TLS_KEY", value_name = "FILE", requires = "tls_cert")]
    pub tls_key: Option<PathBuf>,
}

#[derive(Debug, Args)]
pub struct SimArgs {
    /// Address of the simulator's HTTP listener.
    #[arg(long, default_value = "127.0.0.1:9100")]
    pub listen: SocketAddr,
    /// JSON file of model name → behaviour, e.g. {"primary": {"kind": "status", "status": 503}}.
    #[arg(long, value_name = "FILE")]
    pub script: Option<PathBuf>,
    /// Accept only these bearer keys (comma-separated); by default any request is accepted.
    #[arg(long, value_delimiter = ',')]
    pub keys: Vec<String>,
}

#[derive(Debug, Args)]
pub struct DevArgs {
    /// Directory for the embedded store and the node's data (default: $TMPDIR/switchyard-dev).
    #[arg(long)]
    pub data_dir: Option<PathBuf>,
    /// Address of the control plane's gRPC listener (admin API and node streams): what
    /// SWITCHYARD_CONTROL points the admin commands at.
    #[arg(long, default_value = "127.0.0.1:7400")]
    pub control_listen: SocketAddr,
    /// Address of the node's HTTP listener: the OpenAI-compatible API apps call.
    #[arg(long, default_value = "127.0.0.1:8080")]
    pub listen: SocketAddr,
    /// Address of the simulated providers (port 0: any free port).
    #[arg(long, default_value = "127.0.0.1:0")]
    pub sim_listen: SocketAddr,
}

/// Raises this process's soft limit on open files to its hard limit. A control plane holds
/// a connection per node and a node one per client and upstream; the usual soft limit of
/// 1,024 would refuse the thousandth (accept failing with "too many open files") while the
/// hard limit allows far more. What the hard limit is stays the administrator's call.
fn raise_open_files() {
    use rustix::process::{Resource, Rlimit, getrlimit, setrlimit};
    let Rlimit { current, maximum } = getrlimit(Resource::Nofile);
    if current.is_none() || current == maximum {
        return;
    }
    match setrlimit(Resource::Nofile, Rlimit { current: maximum, maximum }) {
        Ok(()) => tracing::debug!(from = ?current, to = ?maximum, "raised the open-files limit"),
        Err(e) => tracing::warn!(limit = ?current, error = %e, "cannot raise the open-files limit"),
    }
}

pub async fn control(args: ControlArgs) -> Result<(), ServeError> {
    raise_open_files();
    let admin_token = secret_from("SWITCHYARD_ADMIN_TOKEN", args.admin_token_file.as_deref())?
        .ok_or_else(|| {
            ServeError::Config(
                "no admin token: set SWITCHYARD_ADMIN_TOKEN or pass --admin-token-file".into(),
            )
        })?;
    let join_token = secret_from("SWITCHYARD_JOIN_TOKEN", args.join_token_file.as_deref())?;
    let tls = control_acceptor(&args)?;
    let etcd = EtcdOptions {
        tls: args.etcd_ca.map(|ca| EtcdTls { ca, identity: args.etcd_cert.zip(args.etcd_key) }),
        credentials: etcd_credentials()?,
        key_scope: String::new(),
    };
    let control = server::start(ControlOptions {
        store_url: args.store,
        etcd,
        listen: args.listen,
        prefix: args.prefix,
        admin_token,
        join_token,
        audit: AuditRetention { max_entries: args.audit_max_entries, max_age: args.audit_max_age },
        webhooks: DeliveryOptions {
            max_age: args.webhook_max_age,
            timeout: Duration::from_millis(args.webhook_timeout_ms.max(1)),
            concurrency: usize::from(args.webhook_concurrency),
            min_backoff: Duration::from_millis(args.webhook_min_backoff_ms.max(1)),
            max_backoff: Duration::from_millis(
                args.webhook_max_backoff_ms.max(args.webhook_min_backoff_ms),
            ),
        },
        disconnect_grace: args.node_grace,
        drain_timeout: args.drain_timeout,
        tls,
        ui: !args.no_ui,
    })
    .await?;
    // The one line on stdout: scripts and tests read the bound address from it.
    println!("switchyard control listening on {}", control.local_addr);
    control.run().await?;
    Ok(())
}

pub async fn node(args: NodeArgs) -> Result<(), ServeError> {
    raise_open_files();
    let join_token = secret_from("SWITCHYARD_JOIN_TOKEN", args.join_token_file.as_deref())?;
    let controls: Vec<String> = args
        .control
        .split(',')
        .map(str::trim)
        .filter(|c| !c.is_empty())
        .map(String::from)
        .collect();
    // Every file is read once here: a missing or unusable one stops the start, named.
    let identity = tls_config::pair_flags(args.tls_cert.clone(), args.tls_key.clone())?;
    let listen_tls = match &identity {
        Some(pair) => Some(Acceptor::new(
            tls_config::server_config(pair.clone(), None, &[H2, HTTP11])?,
            args.header_read_timeout,
            None,
        )),
        None => None,
    };
    let any_https = controls.iter().any(|url| switchyard_tls::connect::is_https(url));
    if args.control_ca.is_some() && !any_https {
        tracing::warn!(
            "--control-ca is set but no --control URL is https://: the config stream is plaintext"
        );
    }
    let control_tls = if any_https {
        let ca = args.control_ca.map(|path| Source::new("--control-ca", path));
        Some(ClientTls::new(ca, identity)?)
    } else {
        None
    };
    let node = node::start(NodeOptions {
        controls,
        listen: args.listen,
        data_dir: args.data_dir,
        node_id: args.node_id,
        join_token,
        max_body_bytes: args.max_body_bytes,
        header_read_timeout: args.header_read_timeout,
        body_read_timeout: args.body_read_timeout,
        drain_timeout: args.drain_timeout,
        event_spool_max_bytes: args.event_spool_max_mib * 1024 * 1024,
        event_buffer_events: args.event_buffer_events,
        control_tls,
        listen_tls,
    })
    .await?;
    println!("switchyard node {} listening on {}", node.node_id, node.local_addr);
    node.run().await?;
    Ok(())
}

/// The control plane's TLS from its flags, every file read once (a missing or unusable one
/// stops the start, named). ALPN offers HTTP/2 (gRPC) and HTTP/1.1 (`/metrics`).
fn control_acceptor(args: &ControlArgs) -> Result<Option<Acceptor>, ServeError> {
    let Some(identity) = tls_config::pair_flags(args.tls_cert.clone(), args.tls_key.clone())?
    else {
        return Ok(None);
    };
    let client_ca = args.client_ca.clone().map(|path| Source::new("--client-ca", path));
    let trust = client_ca.as_ref().map(ToString::to_string);
    let config = tls_config::server_config(identity, client_ca, &[H2, HTTP11])?;
    Ok(Some(Acceptor::new(config, CONTROL_HANDSHAKE_TIMEOUT, trust)))
}

pub async fn dev(args: DevArgs) -> Result<(), ServeError> {
    raise_open_files();
    // Kept across runs, so keys created in one dev session still work in the next.
    let dir = args.data_dir.unwrap_or_else(|| std::env::temp_dir().join("switchyard-dev"));
    std::fs::create_dir_all(&dir)
        .map_err(|e| ServeError::Config(format!("cannot create {}: {e}", dir.display())))?;
    // A token the user supplied is used but never printed: it may be their real one.
    let env_admin_token = secret_from(ADMIN_TOKEN_ENV, None)?;
    let admin_token_from_env = env_admin_token.is_some();
    let admin_token = env_admin_token.unwrap_or_else(|| format!("dev-{:032x}", rand_u128()));
    let join_token = secret_from(JOIN_TOKEN_ENV, None)?;

    // Simulated providers: the demo's primary model always answers 503, its fallback works.
    let sim = switchyard_sim::start(args.sim_listen).await?;
    sim.set(DEMO_PRIMARY_UPSTREAM, Behaviour::Status(StatusReply::new(503)));
    sim.set(
        DEMO_FALLBACK_UPSTREAM,
        Behaviour::Ok(Reply::text(
            "Hello from the fallback model: the primary failed and Switchyard moved on.",
        )),
    );
    // The embeddings demo: the primary fails as the chat one does.
    sim.set(DEMO_EMBED_PRIMARY_UPSTREAM, Behaviour::Status(StatusReply::new(503)));
    // A healthy chain for `switchyard drill` to break on purpose.
    let drill_reply = |model: &str| Reply {
        chunks: 8,
        ..Reply::text(format!("Hello from {model}: healthy until a drill says otherwise."))
    };
    sim.set(DEMO_DRILL_PRIMARY_UPSTREAM, Behaviour::Ok(drill_reply(DEMO_DRILL_PRIMARY)));
    sim.set(DEMO_DRILL_FALLBACK_UPSTREAM, Behaviour::Ok(drill_reply(DEMO_DRILL_FALLBACK)));

    let control = server::start(ControlOptions {
        store_url: format!("file://{}", dir.join("store").display()),
        etcd: EtcdOptions::default(),
        listen: args.control_listen,
        prefix: "/switchyard/".into(),
        admin_token: admin_token.clone(),
        join_token: join_token.clone(),
        audit: Default::default(),
        webhooks: DeliveryOptions::default(),
        disconnect_grace: BREAKER_GRACE,
        drain_timeout: server::DEFAULT_DRAIN_TIMEOUT,
        tls: None,
        ui: true,
    })
    .await?;
    let control_url = format!("http://{}", control.local_addr);
    // The control plane stops with the process, after the node: on Ctrl-C the node drains
    // and hands its failover events to it, which it could not if this stopped first.
    tokio::spawn(async move {
        if let Err(e) = control.run_until(std::future::pending()).await {
            tracing::error!(error = %e, "control plane stopped");
        }
    });
    let demo_key = seed_demo(&control_url, &admin_token, &sim.base_url())
        .await
        .map_err(|e| ServeError::Config(format!("setting up the demo catalog: {e}")))?;
    let node = node::start(NodeOptions {
        controls: vec![control_url.clone()],
        listen: args.listen,
        data_dir: Some(dir.join("node")),
        node_id: Some("dev-node".into()),
        join_token: join_token.clone(),
        max_body_bytes: switchyard_data_plane::http::DEFAULT_MAX_BODY_BYTES,
        header_read_timeout: switchyard_data_plane::http::DEFAULT_HEADER_READ_TIMEOUT,
        body_read_timeout: switchyard_data_plane::serve::DEFAULT_BODY_READ_TIMEOUT,
        drain_timeout: switchyard_data_plane::serve::DEFAULT_DRAIN_TIMEOUT,
        event_spool_max_bytes: switchyard_data_plane::spool::DEFAULT_MAX_BYTES,
        event_buffer_events: switchyard_data_plane::telemetry::MAX_EVENTS,
        control_tls: None,
        listen_tls: None,
    })
    .await?;
    let url = format!("http://{}", node.local_addr);
    let bin = this_command();
    println!("Switchyard dev is running (data in {}).", dir.display());
    println!();
    println!("  node (OpenAI-compatible HTTP):  {url}");
    println!("  control plane (gRPC):           {control_url}");
    println!("  web console (admin token):      {control_url}/ui");
    println!("  simulated providers:            {}", sim.base_url());
    println!("  demo API key (shown once):      {demo_key}");
    println!();
    println!("A request whose primary model fails and whose fallback answers:");
    println!();
    println!("  curl -s {url}/v1/chat/completions \\");
    println!("    -H 'Authorization: Bearer {demo_key}' -H 'Content-Type: application/json' \\");
    println!(
        "    -d '{{\"model\": \"{DEMO_PRIMARY}\", \"messages\": [{{\"role\": \"user\", \"content\": \"Hello\"}}]}}'"
    );
    println!();
    println!("The same through Anthropic's Messages API (what the Anthropic SDKs and Claude Code");
    println!("send), with an Anthropic-kind fallback:");
    println!();
    println!("  curl -s {url}/v1/messages \\");
    println!("    -H 'x-api-key: {demo_key}' -H 'Content-Type: application/json' \\");
    println!(
        "    -d '{{\"model\": \"{DEMO_PRIMARY}\", \"fallback_models\": [\"{DEMO_CLAUDE}\"], \"max_tokens\": 256, \"messages\": [{{\"role\": \"user\", \"content\": \"Hello\"}}]}}'"
    );
    println!();
    println!("And through OpenAI's Responses API (client.responses in the OpenAI SDKs, the Agents");
    println!("SDK; stateless: the whole conversation in `input`):");
    println!();
    println!("  curl -s {url}/v1/responses \\");
    println!("    -H 'Authorization: Bearer {demo_key}' -H 'Content-Type: application/json' \\");
    println!(
        "    -d '{{\"model\": \"{DEMO_PRIMARY}\", \"fallback_models\": [\"{DEMO_CLAUDE}\"], \"input\": \"Hello\", \"store\": false}}'"
    );
    println!();
    println!("And embeddings (client.embeddings in the OpenAI SDKs), failing over between two");
    println!("embedding models of the same dimensions:");
    println!();
    println!("  curl -s {url}/v1/embeddings \\");
    println!("    -H 'Authorization: Bearer {demo_key}' -H 'Content-Type: application/json' \\");
    println!(
        "    -d '{{\"model\": \"{DEMO_EMBED_PRIMARY}\", \"fallback_models\": [\"{DEMO_EMBED_FALLBACK}\"], \"input\": [\"Hello\", \"world\"]}}'"
    );
    println!();
    println!("Admin commands from another terminal:");
    println!("  export SWITCHYARD_CONTROL={control_url}");
    if admin_token_from_env {
        println!("  # SWITCHYARD_ADMIN_TOKEN: the one set in this environment (not shown)");
    } else {
        println!("  export SWITCHYARD_ADMIN_TOKEN={admin_token}");
    }
    println!("  {bin} catalog; {bin} keys list; {bin} nodes; {bin} events");
    println!();
    println!("A drill (injects a fault for the demo key only, judges what happened, clears it;");
    println!("also primary-flaky, stream-stall, all-down, and stream-cut: streams cut mid-answer");
    println!("and continued by the node, each judged whole, byte for byte):");
    println!();
    println!(
        "  {bin} drill primary-down --node {url} --key {demo_key} \\\n    --model {DEMO_DRILL_PRIMARY} --fallback-models {DEMO_DRILL_FALLBACK}"
    );
    println!();
    if join_token.is_some() {
        println!("Other nodes join with the SWITCHYARD_JOIN_TOKEN set in this environment.");
    } else {
        println!(
            "Other nodes may join from this host without a token (SWITCHYARD_JOIN_TOKEN unset)."
        );
    }
    node.run().await?;
    Ok(())
}

/// How to run this binary from the shell `dev` was started in, for the commands it prints:
/// `switchyard` when that is what PATH finds, else the binary's path (relative to the
/// working directory when below it: `target/release/switchyard` after `cargo run
/// --release`), so the lines can be pasted as they are.
fn this_command() -> String {
    let Ok(exe) = std::env::current_exe() else { return "switchyard".to_owned() };
    let cwd = std::env::current_dir().ok();
    let on_path = std::env::var_os("PATH").and_then(|paths| {
        std::env::split_paths(&paths).map(|dir| dir.join("switchyard")).find(|p| p.is_file())
    });
    let same = |a: &Path, b: &Path| match (a.canonicalize(), b.canonicalize()) {
        (Ok(a), Ok(b)) => a == b,
        _ => false,
    };
    command_for(&exe, cwd.as_deref(), on_path.filter(|p| same(p, &exe)).is_some())
}

fn command_for(exe: &Path, cwd: Option<&Path>, found_on_path: bool) -> String {
    if found_on_path {
        return "switchyard".to_owned();
    }
    let shown = cwd.and_then(|cwd| exe.strip_prefix(cwd).ok()).unwrap_or(exe);
    // A bare name would be looked up in PATH, which does not have it.
    let text = match shown.parent() {
        Some(dir) if dir.as_os_str().is_empty() => format!("./{}", shown.display()),
        _ => shown.display().to_string(),
    };
    let plain = |c: char| c.is_ascii_alphanumeric() || "/._-+".contains(c);
    // Quoted for the shell when it holds anything else (a space in a home directory).
    if text.chars().all(plain) { text } else { format!("'{}'", text.replace('\'', r"'\''")) }
}

fn authed<T>(
    auth: &tonic::metadata::MetadataValue<tonic::metadata::Ascii>,
    message: T,
) -> tonic::Request<T> {
    let mut request = tonic::Request::new(message);
    request.metadata_mut().insert("authorization", auth.clone());
    request
}

const DEMO_PRIMARY: &str = "demo/flaky-primary";
const DEMO_FALLBACK: &str = "demo/steady-fallback";
const DEMO_PRIMARY_UPSTREAM: &str = "flaky-primary";
const DEMO_FALLBACK_UPSTREAM: &str = "steady-fallback";
const DEMO_DRILL_PRIMARY: &str = "demo/drill-primary";
const DEMO_DRILL_FALLBACK: &str = "demo/drill-fallback";
const DEMO_DRILL_PRIMARY_UPSTREAM: &str = "drill-primary";
const DEMO_DRILL_FALLBACK_UPSTREAM: &str = "drill-fallback";
const DEMO_CLAUDE: &str = "demo/claude-fallback";
const DEMO_CLAUDE_UPSTREAM: &str = "claude-fallback";
const DEMO_EMBED_PRIMARY: &str = "demo/embed-primary";
const DEMO_EMBED_FALLBACK: &str = "demo/embed-fallback";
const DEMO_EMBED_PRIMARY_UPSTREAM: &str = "embed-primary";
const DEMO_EMBED_FALLBACK_UPSTREAM: &str = "embed-fallback";
/// The simulator's vectors' length when none is asked for.
const DEMO_EMBED_DIMENSIONS: u32 = switchyard_sim::embed::DEFAULT_DIMENSIONS;
const DEMO_KEY_NAME: &str = "dev-demo";

/// Applies the demo catalog (pointing at this run's simulator, `sim_base_url` being its
/// OpenAI-compatible base URL, `/v1` included) and returns the secret of the demo key, whose
/// default chain is primary → fallback.
///
/// Over a data directory kept from an earlier run the oldest active demo key is reused (same
/// id, so its usage and events stay together) with its secret rotated: only the secret's hash
/// is stored, so the old secret cannot be shown again. Other active demo keys, which earlier
/// releases left behind by creating one per start, are revoked.
async fn seed_demo(
    control_url: &str,
    admin_token: &str,
    sim_base_url: &str,
) -> Result<String, String> {
    use switchyard_proto::admin::v1 as admin;
    let catalog = serde_json::json!({
        "providers": [
            {"name": "demo", "kind": "openai-compatible", "base_url": sim_base_url, "region": "local"},
            // The simulator speaks Anthropic's Messages API on the same listener.
            {"name": "demo-anthropic", "kind": "anthropic", "base_url": sim_base_url, "region": "local"}
        ],
        "models": [
            {"name": DEMO_PRIMARY, "provider": "demo", "upstream_model": DEMO_PRIMARY_UPSTREAM,
             "price": {"input_per_mtok": 0.05, "output_per_mtok": 0.4}},
            {"name": DEMO_FALLBACK, "provider": "demo", "upstream_model": DEMO_FALLBACK_UPSTREAM,
             "price": {"input_per_mtok": 0.25, "output_per_mtok": 2.0}},
            // The primary continues its own streams (the simulator takes a prefill), so
            // `drill stream-cut` runs against it. Not the fallback: its answer differs, and a
            // stream stalled on the primary (`drill stream-stall`, not continued on the model
            // that stalled) is to end with its error frame, not be continued there.
            {"name": DEMO_DRILL_PRIMARY, "provider": "demo", "upstream_model": DEMO_DRILL_PRIMARY_UPSTREAM,
             "stall_timeout_ms": 2000, "continuation": "prefill"},
            {"name": DEMO_DRILL_FALLBACK, "provider": "demo", "upstream_model": DEMO_DRILL_FALLBACK_UPSTREAM},
            {"name": DEMO_CLAUDE, "provider": "demo-anthropic", "upstream_model": DEMO_CLAUDE_UPSTREAM,
             "reasoning": true},
            {"name": DEMO_EMBED_PRIMARY, "provider": "demo", "upstream_model": DEMO_EMBED_PRIMARY_UPSTREAM,
             "type": "embedding", "dimensions": DEMO_EMBED_DIMENSIONS},
            {"name": DEMO_EMBED_FALLBACK, "provider": "demo", "upstream_model": DEMO_EMBED_FALLBACK_UPSTREAM,
             "type": "embedding", "dimensions": DEMO_EMBED_DIMENSIONS}
        ],
        "breaker_policy": {"cooldown_ms": 10000}
    });
    let auth: tonic::metadata::MetadataValue<_> = format!("Bearer {admin_token}")
        .parse()
        .map_err(|_| "the admin token is not a valid header value")?;
    let channel = tonic::transport::Endpoint::from_shared(control_url.to_owned())
        .map_err(|e| e.to_string())?
        .connect()
        .await
        .map_err(|e| e.to_string())?;
    let mut client = admin::admin_client::AdminClient::new(channel);
    client
        .apply_catalog(authed(
            &auth,
            admin::ApplyCatalogRequest {
                catalog_json: catalog.to_string(),
                dry_run: false,
                expected_version: None,
            },
        ))
        .await
        .map_err(|e| e.message().to_owned())?;
    let keys = client
        .list_keys(authed(
            &auth,
            // Only the demo keys, in one page: a store shared with many other keys costs
            // `dev` nothing (the demo keys are few; extras are revoked below).
            admin::ListKeysRequest {
                name_prefix: DEMO_KEY_NAME.into(),
                status: "active".into(),
                limit: 1_000,
                ..Default::default()
            },
        ))
        .await
        .map_err(|e| e.message().to_owned())?
        .into_inner()
        .keys;
    let mut demo_keys: Vec<_> =
        keys.into_iter().filter(|k| k.name == DEMO_KEY_NAME && k.status == "active").collect();
    demo_keys.sort_by_key(|k| k.created_unix_ms);
    let mut demo_keys = demo_keys.into_iter();
    if let Some(reused) = demo_keys.next() {
        for extra in demo_keys {
            client
                .revoke_key(authed(&auth, admin::KeyIdRequest { id: extra.id }))
                .await
                .map_err(|e| e.message().to_owned())?;
        }
        let rotated = client
            .rotate_key(authed(&auth, admin::KeyIdRequest { id: reused.id }))
            .await
            .map_err(|e| e.message().to_owned())?;
        return Ok(rotated.into_inner().secret);
    }
    let request = authed(
        &auth,
        admin::CreateKeyRequest {
            name: DEMO_KEY_NAME.into(),
            failover_defaults: Some(admin::FailoverDefaults {
                models: vec![DEMO_PRIMARY.into(), DEMO_FALLBACK.into()],
                ..Default::default()
            }),
            allowed_models: vec![],
            allowed_regions: vec![],
        },
    );
    let created = client.create_key(request).await.map_err(|e| e.message().to_owned())?;
    Ok(created.into_inner().secret)
}

pub async fn sim(args: SimArgs) -> Result<(), ServeError> {
    // Read the script before binding, so a bad file fails without a listener ever appearing.
    let script = args.script.as_deref().map(switchyard_sim::load_script).transpose()?;
    let sim = switchyard_sim::start(args.listen).await?;
    if let Some(script) = script {
        sim.set_script(script);
    }
    sim.set_keys(args.keys);
    println!("switchyard sim listening on {}", sim.local_addr);
    std::future::pending::<()>().await;
    Ok(())
}

/// 128 random bits for the dev admin token, from the thread RNG (seeded by the OS).
fn rand_u128() -> u128 {
    rand::random()
}

/// A token from `file` when one is given, else from the environment variable `var`; a token
/// shorter than [`token::MIN_TOKEN_CHARS`] is refused, naming where it was read.
/// The etcd user name and password, from the environment only (a flag would show the
/// password in the process list).
fn etcd_credentials() -> Result<Option<EtcdCredentials>, ServeError> {
    let var = |name: &str| std::env::var(name).ok().filter(|v| !v.is_empty());
    match (var(ETCD_USER_ENV), var(ETCD_PASSWORD_ENV)) {
        (None, None) => Ok(None),
        (Some(user), Some(password)) => Ok(Some(EtcdCredentials { user, password })),
        (Some(_), None) => Err(ServeError::Config(format!(
            "{ETCD_USER_ENV} is set but {ETCD_PASSWORD_ENV} is not: etcd authentication needs both"
        ))),
        (None, Some(_)) => Err(ServeError::Config(format!(
            "{ETCD_PASSWORD_ENV} is set but {ETCD_USER_ENV} is not: etcd authentication needs both"
        ))),
    }
}

fn secret_from(var: &str, file: Option<&Path>) -> Result<Option<String>, ServeError> {
    let too_short = |e: token::TokenError| ServeError::Config(e.to_string());
    if let Some(path) = file {
        let text = std::fs::read_to_string(path)
            .map_err(|e| ServeError::Config(format!("cannot read {}: {e}", path.display())))?;
        let secret = text.trim();
        if secret.is_empty() {
            return Err(ServeError::Config(format!("{} is empty", path.display())));
        }
        token::check(secret, &path.display().to_string()).map_err(too_short)?;
        return Ok(Some(secret.to_owned()));
    }
    let Some(secret) = std::env::var(var).ok().filter(|v| !v.is_empty()) else {
        return Ok(None);
    };
    token::check(&secret, var).map_err(too_short)?;
    Ok(Some(secret))
}

/// `--control` of a node: one URL or a comma-separated list, each `http://` or `https://`
/// with a host, read with a real URL parser. The text is kept as given.
fn parse_control_urls(text: &str) -> Result<String, String> {
    let mut urls = text.split(',').map(str::trim).filter(|u| !u.is_empty()).peekable();
    if urls.peek().is_none() {
        return Err("no control-plane URL; expected one like http://127.0.0.1:7400".to_owned());
    }
    for url in urls {
        check_control_url(url)?;
    }
    Ok(text.to_owned())
}

fn check_control_url(url: &str) -> Result<(), String> {
    let uri: http::Uri = url
        .parse()
        .map_err(|e| format!("{url:?} is not a URL ({e}); expected one like http://HOST:7400"))?;
    match uri.scheme_str() {
        Some(s) if s.eq_ignore_ascii_case("http") || s.eq_ignore_ascii_case("https") => {}
        Some(other) => {
            return Err(format!("{url:?}: the scheme must be http or https, not {other:?}"));
        }
        None => return Err(format!("{url:?} has no scheme: write http://{url} or https://{url}")),
    }
    if uri.host().is_none_or(str::is_empty) {
        return Err(format!("{url:?} has no host"));
    }
    Ok(())
}

/// `--max-body-bytes`: a byte count of at least 1 (0 would refuse every request with a body).
fn parse_max_body_bytes(text: &str) -> Result<usize, String> {
    let n: usize =
        text.trim().parse().map_err(|e| format!("{text:?} is not a number of bytes: {e}"))?;
    if n == 0 {
        return Err("must be at least 1: 0 would refuse every request with a body".to_owned());
    }
    Ok(n)
}

/// `--event-buffer-events`: at least 1, at most 10 million (a few GiB of memory).
fn parse_event_buffer(text: &str) -> Result<usize, String> {
    let n: usize =
        text.trim().parse().map_err(|e| format!("{text:?} is not a number of events: {e}"))?;
    if !(1..=10_000_000).contains(&n) {
        return Err(format!("{n} is out of range: from 1 to 10000000"));
    }
    Ok(n)
}

/// `--event-spool-max-mib`: at least 1, at most 1 TiB.
fn parse_spool_mib(text: &str) -> Result<u64, String> {
    let n: u64 =
        text.trim().parse().map_err(|e| format!("{text:?} is not a number of MiB: {e}"))?;
    if !(1..=1024 * 1024).contains(&n) {
        return Err(format!("{n} is out of range: from 1 to 1048576 (1 TiB)"));
    }
    Ok(n)
}

/// `--header-read-timeout`, `--body-read-timeout`, `--drain-timeout`: a duration as every
/// duration flag takes it (`500ms`, `30s`, `2m`, or plain seconds), from 1 ms to one hour —
/// longer would keep a stuck client or a stopping process around past any operator's patience.
fn parse_server_timeout(text: &str) -> Result<Duration, String> {
    let duration = switchyard_time::parse_duration(text).map_err(|e| e.to_string())?;
    if duration > Duration::from_secs(3_600) {
        return Err(format!("{:?} is out of range: from 1ms to 1h", text.trim()));
    }
    Ok(duration)
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn server_timeouts_take_durations_and_refuse_zero_and_over_an_hour() {
        assert_eq!(parse_server_timeout("500ms"), Ok(Duration::from_millis(500)));
        assert_eq!(parse_server_timeout("30s"), Ok(Duration::from_secs(30)));
        assert_eq!(parse_server_timeout("2m"), Ok(Duration::from_secs(120)));
        assert_eq!(parse_server_timeout("30"), Ok(Duration::from_secs(30)));
        assert!(parse_server_timeout("0s").unwrap_err().contains("more than zero"));
        assert!(parse_server_timeout("61m").unwrap_err().contains("out of range"));
        assert!(parse_server_timeout("s").unwrap_err().contains("not a duration"));
    }

    #[test]
    fn control_urls_need_an_http_scheme_and_a_host_each() {
        assert!(parse_control_urls("http://127.0.0.1:7400").is_ok());
        assert!(parse_control_urls("https://cp.example.com, http://[::1]:7400,").is_ok());
        for bad in
            ["notaurl", "127.0.0.1:7400", "ftp://cp:7400", "http://", "http://ok:1,notaurl", ","]
        {
            assert!(parse_control_urls(bad).is_err(), "{bad:?} was accepted");
        }
        let why = parse_control_urls("http://a:1,notaurl").unwrap_err();
        assert!(why.contains("\"notaurl\"") && why.contains("scheme"), "{why}");
    }

    #[test]
    fn dev_prints_commands_as_the_shell_can_run_them() {
        let exe = Path::new("/work/repo/target/release/switchyard");
        assert_eq!(
            command_for(exe, Some(Path::new("/work/repo")), false),
            "target/release/switchyard"
        );
        assert_eq!(command_for(exe, Some(Path::new("/tmp")), false), exe.display().to_string());
        assert_eq!(command_for(exe, None, true), "switchyard");
        let here = Path::new("/opt/sy/switchyard");
        assert_eq!(command_for(here, Some(Path::new("/opt/sy")), false), "./switchyard");
        let spaced = Path::new("/home/a b/target/debug/switchyard");
        assert_eq!(command_for(spaced, None, false), "'/home/a b/target/debug/switchyard'");
    }

    #[test]
    fn max_body_bytes_refuses_zero() {
        assert_eq!(parse_max_body_bytes("1048576"), Ok(1_048_576));
        assert!(parse_max_body_bytes("0").unwrap_err().contains("at least 1"));
        assert!(parse_max_body_bytes("-1").is_err());
    }

    #[test]
    fn a_one_character_token_is_refused_from_a_file() {
        let dir = tempfile::tempdir().unwrap();
        let file = dir.path().join("token");
        std::fs::write(&file, "x\n").unwrap();
        let err = secret_from("SWITCHYARD_TEST_UNSET_VARIABLE", Some(&file)).unwrap_err();
        assert!(err.to_string().contains("too short"), "{err}");
        std::fs::write(&file, "0123456789abcdef\n").unwrap();
        let token = secret_from("SWITCHYARD_TEST_UNSET_VARIABLE", Some(&file)).unwrap();
        assert_eq!(token.as_deref(), Some("0123456789abcdef"));
    }
}
