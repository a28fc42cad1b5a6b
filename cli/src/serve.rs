//! The long-running subcommands: `control`, `node` and `dev`.

use std::net::SocketAddr;
use std::path::{Path, PathBuf};
use std::time::Duration;

use clap::Args;
use switchyard_sim::{Behaviour, Reply, StatusReply};

use switchyard_control_plane::audit::{self, AuditRetention};
use switchyard_control_plane::reports::BREAKER_GRACE;
use switchyard_control_plane::server::{self, ControlError, ControlOptions};
use switchyard_control_plane::webhooks::DeliveryOptions;
use switchyard_data_plane::node::{self, NodeError, NodeOptions};

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
}

#[derive(Debug, Args)]
pub struct ControlArgs {
    /// Where keys, catalog and node presence live: etcd://host:2379[,host:2379] or file://DIR.
    #[arg(long, env = "SWITCHYARD_STORE")]
    pub store: String,
    /// Address of the gRPC listener (admin API and node streams).
    #[arg(long, default_value = "127.0.0.1:7400", env = "SWITCHYARD_LISTEN")]
    pub listen: SocketAddr,
    /// Key prefix in the store.
    #[arg(long, default_value = "/switchyard/")]
    pub prefix: String,
    /// File holding the admin token (instead of SWITCHYARD_ADMIN_TOKEN).
    #[arg(long)]
    pub admin_token_file: Option<PathBuf>,
    /// File holding the node join token (instead of SWITCHYARD_JOIN_TOKEN).
    #[arg(long)]
    pub join_token_file: Option<PathBuf>,
    /// Failover events kept in the audit log; the oldest beyond this are pruned.
    #[arg(long, default_value_t = AuditRetention::default().max_entries)]
    pub audit_max_entries: usize,
    /// Age after which audit-log events are pruned: 30s, 15m, 12h, 7d.
    #[arg(long, default_value = "7d", value_parser = audit::parse_max_age)]
    pub audit_max_age: std::time::Duration,
    /// Webhook events not delivered after this long become dead letters (once the endpoint
    /// fails again): 30s, 15m, 12h, 7d.
    #[arg(long, default_value = "24h", value_parser = audit::parse_max_age)]
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
    #[arg(long, default_value = "30s", value_parser = audit::parse_max_age)]
    pub node_grace: Duration,
    /// On SIGTERM or SIGINT, how long calls in flight may take to finish once node streams
    /// are closed: 10s, 1m.
    #[arg(long, default_value = "10s", value_parser = parse_shutdown_duration)]
    pub drain_timeout: Duration,
}

#[derive(Debug, Args)]
pub struct NodeArgs {
    /// Control-plane URL(s), comma-separated; the node fails over between them.
    #[arg(long, env = "SWITCHYARD_CONTROL", default_value = "http://127.0.0.1:7400")]
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
    /// Largest accepted request body; larger ones get 413.
    #[arg(long, default_value_t = switchyard_data_plane::http::DEFAULT_MAX_BODY_BYTES)]
    pub max_body_bytes: usize,
    /// Longest a client may take to send a request's head, and longest an idle keep-alive
    /// connection stays open: 500ms, 30s, 2m.
    #[arg(long, default_value = "30s", value_parser = parse_header_read_timeout)]
    pub header_read_timeout: Duration,
    /// Longest a client may take to send a request's body once its head is in; a slower
    /// one gets 408: 10s, 30s, 2m.
    #[arg(long, default_value = "30s", value_parser = parse_shutdown_duration)]
    pub body_read_timeout: Duration,
    /// On SIGTERM or SIGINT, how long requests and streams in flight may take to finish
    /// before their connections are closed: 30s, 2m.
    #[arg(long, default_value = "30s", value_parser = parse_shutdown_duration)]
    pub drain_timeout: Duration,
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
    #[arg(long, default_value = "127.0.0.1:7400")]
    pub control_listen: SocketAddr,
    #[arg(long, default_value = "127.0.0.1:8080")]
    pub listen: SocketAddr,
    /// Address of the simulated providers (port 0: any free port).
    #[arg(long, default_value = "127.0.0.1:0")]
    pub sim_listen: SocketAddr,
}

pub async fn control(args: ControlArgs) -> Result<(), ServeError> {
    let admin_token = secret_from("SWITCHYARD_ADMIN_TOKEN", args.admin_token_file.as_deref())?
        .ok_or_else(|| {
            ServeError::Config(
                "no admin token: set SWITCHYARD_ADMIN_TOKEN or pass --admin-token-file".into(),
            )
        })?;
    let join_token = secret_from("SWITCHYARD_JOIN_TOKEN", args.join_token_file.as_deref())?;
    let control = server::start(ControlOptions {
        store_url: args.store,
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
    })
    .await?;
    // The one line on stdout: scripts and tests read the bound address from it.
    println!("switchyard control listening on {}", control.local_addr);
    control.run().await?;
    Ok(())
}

pub async fn node(args: NodeArgs) -> Result<(), ServeError> {
    let join_token = secret_from("SWITCHYARD_JOIN_TOKEN", args.join_token_file.as_deref())?;
    let controls: Vec<String> = args
        .control
        .split(',')
        .map(str::trim)
        .filter(|c| !c.is_empty())
        .map(String::from)
        .collect();
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
    })
    .await?;
    println!("switchyard node {} listening on {}", node.node_id, node.local_addr);
    node.run().await?;
    Ok(())
}

pub async fn dev(args: DevArgs) -> Result<(), ServeError> {
    // Kept across runs, so keys created in one dev session still work in the next.
    let dir = args.data_dir.unwrap_or_else(|| std::env::temp_dir().join("switchyard-dev"));
    std::fs::create_dir_all(&dir)
        .map_err(|e| ServeError::Config(format!("cannot create {}: {e}", dir.display())))?;
    let admin_token = std::env::var("SWITCHYARD_ADMIN_TOKEN")
        .ok()
        .filter(|t| !t.is_empty())
        .unwrap_or_else(|| format!("dev-{:032x}", rand_u128()));

    // Simulated providers: the demo's primary model always answers 503, its fallback works.
    let sim = switchyard_sim::start(args.sim_listen).await?;
    sim.set(DEMO_PRIMARY_UPSTREAM, Behaviour::Status(StatusReply::new(503)));
    sim.set(
        DEMO_FALLBACK_UPSTREAM,
        Behaviour::Ok(Reply::text(
            "Hello from the fallback model: the primary failed and Switchyard moved on.",
        )),
    );

    let control = server::start(ControlOptions {
        store_url: format!("file://{}", dir.join("store").display()),
        listen: args.control_listen,
        prefix: "/switchyard/".into(),
        admin_token: admin_token.clone(),
        join_token: None,
        audit: Default::default(),
        webhooks: DeliveryOptions::default(),
        disconnect_grace: BREAKER_GRACE,
        drain_timeout: server::DEFAULT_DRAIN_TIMEOUT,
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
        join_token: None,
        max_body_bytes: switchyard_data_plane::http::DEFAULT_MAX_BODY_BYTES,
        header_read_timeout: switchyard_data_plane::http::DEFAULT_HEADER_READ_TIMEOUT,
        body_read_timeout: switchyard_data_plane::serve::DEFAULT_BODY_READ_TIMEOUT,
        drain_timeout: switchyard_data_plane::serve::DEFAULT_DRAIN_TIMEOUT,
    })
    .await?;
    let url = format!("http://{}", node.local_addr);
    println!("Switchyard dev is running (data in {}).", dir.display());
    println!();
    println!("  node (OpenAI-compatible HTTP):  {url}");
    println!("  control plane (gRPC):           {control_url}");
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
    println!("Admin commands from another terminal:");
    println!("  export SWITCHYARD_CONTROL={control_url}");
    println!("  export SWITCHYARD_ADMIN_TOKEN={admin_token}");
    println!("  switchyard catalog; switchyard keys list; switchyard nodes; switchyard events");
    node.run().await?;
    Ok(())
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

/// Applies the demo catalog (pointing at this run's simulator) and creates a demo key whose
/// default chain is primary → fallback. Returns the key's secret.
async fn seed_demo(control_url: &str, admin_token: &str, sim_url: &str) -> Result<String, String> {
    use switchyard_proto::admin::v1 as admin;
    let catalog = serde_json::json!({
        "providers": [{"name": "demo", "kind": "openai-compatible", "base_url": format!("{sim_url}/v1"), "region": "local"}],
        "models": [
            {"name": DEMO_PRIMARY, "provider": "demo", "upstream_model": DEMO_PRIMARY_UPSTREAM,
             "price": {"input_per_mtok": 0.05, "output_per_mtok": 0.4}},
            {"name": DEMO_FALLBACK, "provider": "demo", "upstream_model": DEMO_FALLBACK_UPSTREAM,
             "price": {"input_per_mtok": 0.25, "output_per_mtok": 2.0}}
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
    let request = authed(
        &auth,
        admin::CreateKeyRequest {
            name: "dev-demo".into(),
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

fn rand_u128() -> u128 {
    use std::hash::{BuildHasher, Hasher};
    // Two independently seeded SipHash states: enough for a throwaway dev token.
    let a = std::collections::hash_map::RandomState::new().build_hasher().finish();
    let b = std::collections::hash_map::RandomState::new().build_hasher().finish();
    (u128::from(a) << 64) | u128::from(b)
}

/// A secret from the environment variable `var`, or else from `file`.
fn secret_from(var: &str, file: Option<&Path>) -> Result<Option<String>, ServeError> {
    if let Some(path) = file {
        let text = std::fs::read_to_string(path)
            .map_err(|e| ServeError::Config(format!("cannot read {}: {e}", path.display())))?;
        let secret = text.trim();
        if secret.is_empty() {
            return Err(ServeError::Config(format!("{} is empty", path.display())));
        }
        return Ok(Some(secret.to_owned()));
    }
    Ok(std::env::var(var).ok().filter(|v| !v.is_empty()))
}

/// `--drain-timeout`, `--body-read-timeout`: a duration from 1 ms to one hour.
fn parse_shutdown_duration(text: &str) -> Result<Duration, String> {
    let duration = switchyard_time::parse_duration(text).map_err(|e| e.to_string())?;
    if duration > Duration::from_secs(3_600) {
        return Err(format!("{:?} is out of range: at most 1h", text.trim()));
    }
    Ok(duration)
}

/// `--header-read-timeout`: a number with `ms`, `s` or `m`, from 1 ms to one hour.
fn parse_header_read_timeout(text: &str) -> Result<Duration, String> {
    let text = text.trim();
    let (digits, unit) =
        text.split_at(text.find(|c: char| !c.is_ascii_digit()).unwrap_or(text.len()));
    let n: u64 = digits.parse().map_err(|_| format!("{text:?} is not a duration like 30s"))?;
    let duration = match unit {
        "ms" => Duration::from_millis(n),
        "s" => Duration::from_secs(n),
        "m" => Duration::from_secs(n.saturating_mul(60)),
        _ => return Err(format!("unknown unit {unit:?} in {text:?}; use ms, s or m")),
    };
    if duration.is_zero() || duration > Duration::from_secs(3_600) {
        return Err(format!("{text:?} is out of range: from 1ms to 60m"));
    }
    Ok(duration)
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn header_read_timeout_takes_ms_s_and_m_and_refuses_zero_and_bare_numbers() {
        assert_eq!(parse_header_read_timeout("500ms"), Ok(Duration::from_millis(500)));
        assert_eq!(parse_header_read_timeout("30s"), Ok(Duration::from_secs(30)));
        assert_eq!(parse_header_read_timeout("2m"), Ok(Duration::from_secs(120)));
        assert!(parse_header_read_timeout("0s").unwrap_err().contains("out of range"));
        assert!(parse_header_read_timeout("61m").unwrap_err().contains("out of range"));
        assert!(parse_header_read_timeout("30").unwrap_err().contains("unknown unit"));
        assert!(parse_header_read_timeout("s").unwrap_err().contains("not a duration"));
    }

    #[test]
    fn drain_and_body_timeouts_take_human_durations_and_refuse_zero_and_more_than_an_hour() {
        assert_eq!(parse_shutdown_duration("30s"), Ok(Duration::from_secs(30)));
        assert_eq!(parse_shutdown_duration("2m"), Ok(Duration::from_secs(120)));
        assert_eq!(parse_shutdown_duration("250ms"), Ok(Duration::from_millis(250)));
        assert_eq!(parse_shutdown_duration("45"), Ok(Duration::from_secs(45)));
        assert!(parse_shutdown_duration("0s").unwrap_err().contains("more than zero"));
        assert!(parse_shutdown_duration("2h").unwrap_err().contains("out of range"));
        assert!(parse_shutdown_duration("soon").unwrap_err().contains("not a duration"));
    }
}
