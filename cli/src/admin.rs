//! The admin commands (docs/cli.md): a thin gRPC client of `switchyard.admin.v1`.
//!
//! Everything that can be checked without the control plane (the catalog file, list and
//! trigger syntax, the token's presence) is checked here first, so a mistake costs no
//! round trip and sends nothing.

use std::io::Write;
use std::path::PathBuf;
use std::time::Duration;

use clap::{Args, Subcommand};
use switchyard_catalog::{Catalog, CredentialRef, FailoverReason, Webhook};
use switchyard_proto::admin::v1 as pb;
use switchyard_proto::admin::v1::admin_client::AdminClient;
use tonic::metadata::{Ascii, MetadataValue};
use tonic::transport::{Channel, Endpoint};

use switchyard_tls::config as tls_config;
use switchyard_tls::connect::{ClientTls, is_https};
use switchyard_tls::files::Source;
use switchyard_tls::words;

use crate::error::CliError;
use crate::output;
use crate::output::apply::{ApplyView, apply_result};
use crate::output::breakers::{BreakerView, FleetView, breakers_table, fleet_table};
use crate::output::events::{EventView, event_line};
use crate::output::keys::{
    KeySecretView, KeyView, KeyWithWarnings, key_details, key_secret, keys_rows, keys_table,
};
use crate::output::nodes::{
    NodeView, NodesView, nodes_json_head, nodes_json_tail, nodes_rows, nodes_table,
};
use crate::output::usage::{LimitView, UsageView, limits_table, usage_table};
use crate::output::webhooks::{DeliveriesView, deliveries, webhooks_table};
use crate::token::{self, ADMIN_TOKEN_ENV};
use switchyard_catalog::file as catalog_file;

/// Options every admin command takes. `global` lets them follow a nested subcommand
/// (`switchyard keys create --json`) as well as precede it (`switchyard keys --json create`).
#[derive(Debug, Clone, Args)]
#[command(next_help_heading = "Admin options")]
pub struct AdminOpts {
    /// The control plane's gRPC URL; a comma-separated list is tried in order.
    #[arg(
        long,
        env = "SWITCHYARD_CONTROL",
        default_value = "http://127.0.0.1:7400",
        global = true
    )]
    pub control: String,
    /// File holding the admin token (instead of SWITCHYARD_ADMIN_TOKEN).
    #[arg(long, global = true, value_name = "FILE")]
    pub admin_token_file: Option<PathBuf>,
    /// Print JSON for scripts instead of tables.
    #[arg(long, global = true)]
    pub json: bool,
    /// PEM CA certificate(s) that an `https://` control plane's certificate must be signed
    /// by (default: the public web's CAs).
    #[arg(long, global = true, env = "SWITCHYARD_CONTROL_CA", value_name = "FILE")]
    pub control_ca: Option<PathBuf>,
    /// PEM client certificate for a control plane that requires one (mutual TLS).
    #[arg(
        long,
        global = true,
        env = "SWITCHYARD_TLS_CERT",
        value_name = "FILE",
        requires = "tls_key"
    )]
    pub tls_cert: Option<PathBuf>,
    /// PEM private key of --tls-cert.
    #[arg(
        long,
        global = true,
        env = "SWITCHYARD_TLS_KEY",
        value_name = "FILE",
        requires = "tls_cert"
    )]
    pub tls_key: Option<PathBuf>,
}

#[derive(Debug, Args)]
pub struct ApplyArgs {
    /// The catalog file (YAML or JSON): providers, models, breaker policy, webhooks.
    #[arg(short = 'f', long = "file", value_name = "FILE")]
    pub file: PathBuf,
    /// Show what would change without storing anything.
    #[arg(long)]
    pub dry_run: bool,
    #[command(flatten)]
    pub opts: AdminOpts,
}

#[derive(Debug, Args)]
pub struct CatalogArgs {
    #[command(flatten)]
    pub opts: AdminOpts,
}

#[derive(Debug, Args)]
pub struct NodesArgs {
    /// Show at most N nodes (at least 1); without it, every node, a page at a time.
    #[arg(long, value_name = "N", value_parser = clap::value_parser!(u64).range(1..))]
    pub limit: Option<u64>,
    /// Only nodes connected to this control plane (as the CONTROL PLANE column shows it).
    #[arg(long, value_name = "ADDRESS", value_parser = non_empty)]
    pub control_plane: Option<String>,
    /// Only nodes whose last heartbeat is at least this old (30s, 5m, ...).
    #[arg(long, value_name = "DURATION", value_parser = duration)]
    pub stale: Option<Duration>,
    /// Only nodes that rejected a config version they have not since replaced.
    #[arg(long)]
    pub rejected: bool,
    /// Continue a listing stopped by --limit where it stopped (the token it printed).
    #[arg(long, value_name = "TOKEN", value_parser = page_token)]
    pub page_token: Option<String>,
    #[command(flatten)]
    pub opts: AdminOpts,
}

#[derive(Debug, Args)]
pub struct ListKeysArgs {
    /// Show at most N keys (at least 1); without it, every key, a page at a time.
    #[arg(long, value_name = "N", value_parser = clap::value_parser!(u64).range(1..))]
    pub limit: Option<u64>,
    /// Only active or only revoked keys.
    #[arg(long, value_name = "STATUS", value_parser = ["active", "revoked"])]
    pub status: Option<String>,
    /// Only keys whose name starts with this (case-sensitive).
    #[arg(long, value_name = "TEXT", value_parser = non_empty)]
    pub name_prefix: Option<String>,
    /// Only keys whose id starts with this.
    #[arg(long, value_name = "TEXT", value_parser = non_empty)]
    pub id_prefix: Option<String>,
    /// Continue a listing stopped by --limit where it stopped (the token it printed).
    #[arg(long, value_name = "TOKEN", value_parser = page_token)]
    pub page_token: Option<String>,
}

/// Keys or nodes asked for in one page: the control plane's own cap.
const PAGE: u64 = 1_000;

fn non_empty(text: &str) -> Result<String, String> {
    if text.is_empty() { Err("must not be empty".to_owned()) } else { Ok(text.to_owned()) }
}

fn duration(text: &str) -> Result<Duration, String> {
    switchyard_time::parse_duration(text).map_err(|e| e.to_string())
}

/// A token as listings print it: letters, digits and dots. Anything else is a mistake
/// (a truncated paste, the flag's value forgotten) caught before a round trip.
fn page_token(text: &str) -> Result<String, String> {
    let text = text.trim();
    if text.is_empty() {
        return Err("must not be empty".to_owned());
    }
    if text.len() > 8_192 || !text.bytes().all(|b| b.is_ascii_alphanumeric() || b == b'.') {
        return Err("not a token a listing printed (letters, digits and dots)".to_owned());
    }
    Ok(text.to_owned())
}

#[derive(Debug, Args)]
pub struct BreakersArgs {
    /// Only the fleet's view: the deployments open for every node, who opened each and
    /// which node probes it (with --json: `{"enabled", "open": [...]}`).
    #[arg(long)]
    pub fleet: bool,
    #[command(flatten)]
    pub opts: AdminOpts,
}

#[derive(Debug, Args)]
pub struct EventsArgs {
    /// Keep streaming events as they are recorded (with --json: one JSON object per line).
    #[arg(long)]
    pub follow: bool,
    /// How many of the newest events to show first (at least 1).
    // 0 is refused rather than defined: on the wire 0 means "the server's default" (100),
    // so passing it through would print 100 events to someone who asked for none.
    #[arg(long, default_value_t = 100, value_name = "N", value_parser = clap::value_parser!(u32).range(1..))]
    pub limit: u32,
    /// Only this API key's events.
    #[arg(long, value_name = "ID")]
    pub key: Option<String>,
    #[command(flatten)]
    pub opts: AdminOpts,
}

#[derive(Debug, Args)]
pub struct UsageArgs {
    /// Only this API key.
    #[arg(long, value_name = "ID")]
    pub key: Option<String>,
    /// Show each limited key's use of its limits in the current window (the last minute,
    /// the UTC day), fleet-wide, instead of the totals.
    #[arg(long, conflicts_with = "since")]
    pub limits: bool,
    /// Only usage from this time on (RFC 3339, or a duration back from now like 24h),
    /// rounded down to the whole hour.
    #[arg(long, value_name = "T", value_parser = since)]
    pub since: Option<i64>,
    #[command(flatten)]
    pub opts: AdminOpts,
}

#[derive(Debug, Args)]
pub struct WebhooksArgs {
    #[command(subcommand)]
    pub command: WebhooksCommand,
    #[command(flatten)]
    pub opts: AdminOpts,
}

/// `add`, `remove`, `enable` and `disable` edit the catalog's `webhooks` section (read,
/// change, apply only if nobody changed it meanwhile). `apply -f` stays the declarative
/// source of truth: a later apply of a file without the subscription removes it again.
#[derive(Debug, Subcommand)]
pub enum WebhooksCommand {
    /// Add a subscription to the catalog.
    Add(AddWebhookArgs),
    /// List the catalog's subscriptions.
    List,
    /// Remove a subscription from the catalog (its dead letters stay listed).
    Remove {
        #[arg(value_name = "NAME")]
        name: String,
    },
    /// Resume deliveries to a disabled subscription (events from now on).
    Enable {
        #[arg(value_name = "NAME")]
        name: String,
    },
    /// Stop deliveries to a subscription; events meanwhile are not kept for it.
    Disable {
        #[arg(value_name = "NAME")]
        name: String,
    },
    /// A subscription's delivery state: backlog, failing attempts, dead letters.
    Deliveries {
        #[arg(value_name = "NAME")]
        name: String,
        /// Owed events and dead letters listed at most, each (at least 1).
        #[arg(long, default_value_t = 100, value_name = "N", value_parser = clap::value_parser!(u32).range(1..))]
        limit: u32,
    },
    /// Queue events for one subscription again: dead letters, or failover events from the
    /// audit log, by id; or every dead letter with --all-dead.
    Redeliver {
        #[arg(value_name = "NAME")]
        name: String,
        #[arg(value_name = "EVENT_ID", required_unless_present = "all_dead")]
        event_ids: Vec<String>,
        #[arg(long)]
        all_dead: bool,
    },
}

#[derive(Debug, Args)]
pub struct AddWebhookArgs {
    #[arg(value_name = "NAME")]
    pub name: String,
    /// Where events are POSTed (http:// or https://).
    #[arg(long)]
    pub url: String,
    /// Event types: api:model_failover, breaker.opened, breaker.half_open, breaker.closed,
    /// node.disconnected, or * for all.
    #[arg(long, value_delimiter = ',', value_parser = list_item, value_name = "LIST", required = true)]
    pub events: Vec<String>,
    /// Signing secret reference, env:NAME or file:PATH (a whsec_<base64> value suits the
    /// Standard Webhooks verifier libraries).
    // Parsed after clap: clap's own error would echo the value, and a mistaken value here
    // is often the secret itself.
    #[arg(long, value_name = "REF")]
    pub secret: Option<String>,
    /// Only failover events of these API key ids.
    #[arg(long, value_delimiter = ',', value_parser = list_item, value_name = "IDS")]
    pub keys: Vec<String>,
    /// Allow a private or loopback target.
    #[arg(long)]
    pub internal: bool,
    /// Add it disabled.
    #[arg(long)]
    pub disabled: bool,
    /// Deliver up to N events per request, as a JSON array.
    #[arg(long, value_name = "N")]
    pub batch_max_events: Option<u32>,
}

#[derive(Debug, Args)]
pub struct KeysArgs {
    #[command(subcommand)]
    pub command: KeysCommand,
    #[command(flatten)]
    pub opts: AdminOpts,
}

#[derive(Debug, Subcommand)]
pub enum KeysCommand {
    /// Create an API key; its secret is printed once.
    Create(CreateKeyArgs),
    /// List every key, in id order, a page at a time (secrets are never shown, only their
    /// last four characters).
    List(ListKeysArgs),
    /// Show one key.
    Show {
        /// The key's id, as `keys list` shows it.
        #[arg(value_name = "ID")]
        id: String,
    },
    /// Revoke a key; requests with it are refused at once.
    Revoke {
        /// The key's id, as `keys list` shows it.
        #[arg(value_name = "ID")]
        id: String,
    },
    /// Replace a key's secret; the old one stops working at once. Prints the new one once.
    Rotate {
        /// The key's id, as `keys list` shows it.
        #[arg(value_name = "ID")]
        id: String,
    },
    /// Set (or with --clear, remove) the key's default failover chain.
    SetDefaults(SetDefaultsArgs),
    /// Set (or with --clear, remove) the key's own limits, held for the whole fleet.
    SetLimits(SetLimitsArgs),
}

#[derive(Debug, Args)]
#[command(group(
    clap::ArgGroup::new("limit").required(true).multiple(true)
        .args(["rpm", "tpm", "tokens_per_day", "usd_per_day", "clear"])
))]
pub struct SetLimitsArgs {
    /// The key's id, as `keys list` shows it.
    #[arg(value_name = "ID")]
    pub id: String,
    /// Requests per sliding minute.
    #[arg(long, value_name = "N", value_parser = clap::value_parser!(u64).range(1..=switchyard_catalog::keys::LIMIT_MAX))]
    pub rpm: Option<u64>,
    /// Tokens (prompt and completion) per sliding minute.
    #[arg(long, value_name = "N", value_parser = clap::value_parser!(u64).range(1..=switchyard_catalog::keys::LIMIT_MAX))]
    pub tpm: Option<u64>,
    /// Tokens per UTC day.
    #[arg(long, value_name = "N", value_parser = clap::value_parser!(u64).range(1..=switchyard_catalog::keys::LIMIT_MAX))]
    pub tokens_per_day: Option<u64>,
    /// US dollars per UTC day, at the catalog's prices of the models that served.
    #[arg(long, value_name = "X", value_parser = usd_per_day)]
    pub usd_per_day: Option<f64>,
    /// Remove every limit of the key.
    #[arg(long, conflicts_with_all = ["rpm", "tpm", "tokens_per_day", "usd_per_day"])]
    pub clear: bool,
}

fn since(text: &str) -> Result<i64, String> {
    switchyard_time::parse_since(text, switchyard_time::now_ms()).map_err(|e| e.to_string())
}

fn usd_per_day(text: &str) -> Result<f64, String> {
    let usd: f64 = text.trim().parse().map_err(|_| format!("{text:?} is not a number"))?;
    let limits = switchyard_catalog::Limits { usd_per_day: Some(usd), ..Default::default() };
    match limits.validate() {
        Ok(()) => Ok(usd),
        Err(e) => Err(e.0.into_iter().map(|f| f.message).collect::<Vec<_>>().join("; ")),
    }
}

#[derive(Debug, Args)]
pub struct CreateKeyArgs {
    /// A name to tell the key apart (an app, a team).
    #[arg(long)]
    pub name: String,
    /// Default failover chain for requests that name only `model`: up to 3 models, in order.
    #[arg(long, value_delimiter = ',', value_parser = list_item, value_name = "A,B,C")]
    pub default_models: Vec<String>,
    /// Models the key may use (default: all).
    #[arg(long, value_delimiter = ',', value_parser = list_item, value_name = "LIST")]
    pub allowed_models: Vec<String>,
    /// Provider regions the key may use (default: all).
    #[arg(long, value_delimiter = ',', value_parser = list_item, value_name = "LIST")]
    pub allowed_regions: Vec<String>,
    #[command(flatten)]
    pub options: ChainOptions,
}

#[derive(Debug, Args)]
pub struct SetDefaultsArgs {
    /// The key's id, as `keys list` shows it.
    #[arg(value_name = "ID")]
    pub id: String,
    /// The default chain: up to 3 models, in order. Without it, the key's chain and options
    /// are kept and only the degraded answer changes.
    #[arg(
        long,
        value_delimiter = ',',
        value_parser = list_item,
        value_name = "A,B,C",
        required_unless_present_any = ["clear", "degraded_message"]
    )]
    pub models: Vec<String>,
    /// Remove the key's defaults.
    #[arg(long, conflicts_with_all = ["models", "timeout_ms", "first_token_timeout_ms", "on", "degraded_message", "degraded_when_all_open"])]
    pub clear: bool,
    #[command(flatten)]
    pub options: ChainOptions,
    /// The answer clients get, labelled as degraded, when no model of a chain can serve
    /// (1 to 4096 bytes).
    #[arg(long, value_name = "TEXT")]
    pub degraded_message: Option<String>,
    /// With --degraded-message: answer at once, without trying a model, when every model's
    /// breaker is open.
    #[arg(long, requires = "degraded_message")]
    pub degraded_when_all_open: bool,
}

impl SetDefaultsArgs {
    fn degraded(&self) -> Option<pb::Degraded> {
        self.degraded_message.as_ref().map(|message| pb::Degraded {
            message: message.clone(),
            when_all_open: self.degraded_when_all_open,
        })
    }
}

/// Chain-wide options stored with a key's defaults; out-of-range values are clamped by the
/// control plane, which says so in its warnings.
#[derive(Debug, Args)]
pub struct ChainOptions {
    /// Time allowed for one attempt (1000–300000).
    #[arg(long, value_name = "MS")]
    pub timeout_ms: Option<u32>,
    /// Streaming: wait for the first token before failing over (500–60000).
    #[arg(long, value_name = "MS")]
    pub first_token_timeout_ms: Option<u32>,
    /// Which failures fail over: connection_error,server_error,rate_limit,timeout,
    /// context_length (the default: these five), and invalid_output (opt-in: structured
    /// answers that break the request's response_format).
    #[arg(long, value_delimiter = ',', value_parser = failover_reason, value_name = "LIST")]
    pub on: Option<Vec<FailoverReason>>,
    /// Streaming: end a stream that breaks after its first token with an error frame,
    /// instead of continuing the answer with a model that can (the default).
    #[arg(long)]
    pub no_continue_streams: bool,
}

impl ChainOptions {
    fn is_set(&self) -> bool {
        self.timeout_ms.is_some()
            || self.first_token_timeout_ms.is_some()
            || self.on.is_some()
            || self.no_continue_streams
    }

    fn defaults(&self, models: Vec<String>) -> pb::FailoverDefaults {
        pb::FailoverDefaults {
            models,
            timeout_ms: self.timeout_ms,
            first_token_timeout_ms: self.first_token_timeout_ms,
            on: self.on.iter().flatten().map(|r| r.as_str().to_owned()).collect(),
            degraded: None,
            continue_streams: self.no_continue_streams.then_some(false),
        }
    }
}

/// One entry of a comma-separated list: `a,,b` and `a, ` are mistakes, not empty names.
pub fn list_item(text: &str) -> Result<String, String> {
    let item = text.trim();
    if item.is_empty() { Err("empty entry in the list".to_owned()) } else { Ok(item.to_owned()) }
}

pub fn failover_reason(text: &str) -> Result<FailoverReason, String> {
    FailoverReason::parse(text.trim()).ok_or_else(|| {
        let all: Vec<&str> = FailoverReason::ACCEPTED.iter().map(|r| r.as_str()).collect();
        format!("unknown trigger {text:?}; expected one of {}", all.join(", "))
    })
}

// === connection ===

/// A connected admin client; every request it builds carries the admin token.
pub struct Admin {
    pub client: AdminClient<Channel>,
    auth: MetadataValue<Ascii>,
    url: String,
    tls: Option<ClientTls>,
}

impl Admin {
    /// Connects to the first control plane of `--control` that answers. Only connecting
    /// moves on to the next URL: once a request is sent it is never repeated elsewhere, so
    /// a `keys create` cannot happen twice.
    pub async fn connect(opts: &AdminOpts) -> Result<Self, CliError> {
        let token =
            read_token(opts.admin_token_file.as_deref(), std::env::var(ADMIN_TOKEN_ENV).ok())?;
        let auth = MetadataValue::try_from(format!("Bearer {token}"))
            .map_err(|_| CliError::TokenInvalid)?;
        let urls = control_urls(&opts.control);
        // Read once, before any connection: a bad file is named whichever URL answers.
        let tls = if urls.iter().any(|url| is_https(url)) {
            let ca = opts.control_ca.clone().map(|path| Source::new("--control-ca", path));
            let identity = tls_config::pair_flags(opts.tls_cert.clone(), opts.tls_key.clone())
                .map_err(|e| CliError::Tls(e.to_string()))?;
            Some(ClientTls::new(ca, identity).map_err(|e| CliError::Tls(e.to_string()))?)
        } else {
            None
        };
        let mut failures = Vec::new();
        for url in &urls {
            let endpoint = Endpoint::from_shared(url.clone())
                .map_err(|e| CliError::BadControlUrl { url: url.clone(), reason: e.to_string() })?
                .connect_timeout(Duration::from_secs(5))
                .timeout(Duration::from_secs(30));
            let connected = match &tls {
                Some(tls) if is_https(url) => match tls.connector(url) {
                    Ok(connector) => endpoint.connect_with_connector(connector).await,
                    Err(e) => {
                        failures.push(e.to_string());
                        continue;
                    }
                },
                _ => endpoint.connect().await,
            };
            match connected {
                Ok(channel) => {
                    let client = AdminClient::new(channel);
                    return Ok(Self { client, auth, url: url.clone(), tls });
                }
                Err(e) => failures.push(format!("{url}: {}", words::chain(&e))),
            }
        }
        Err(CliError::Unreachable { urls: urls.join(", "), failures })
    }

    pub fn request<T>(&self, message: T) -> tonic::Request<T> {
        let mut request = tonic::Request::new(message);
        request.metadata_mut().insert("authorization", self.auth.clone());
        request
    }

    pub fn status(&self, status: tonic::Status) -> CliError {
        let mut error = CliError::from_status(status, &self.url);
        // With TLS 1.3 a refused client certificate shows only under the call.
        if let (Some(refusal), CliError::Status { message, hint, .. }) =
            (self.tls.as_ref().and_then(ClientTls::take_refusal), &mut error)
        {
            message.push_str(": ");
            message.push_str(&refusal);
            *hint = None;
        }
        error
    }
}

/// The token from `--admin-token-file` if given, else from the environment. A token shorter
/// than the control plane accepts is refused here, with the reason, before any round trip.
pub fn read_token(file: Option<&std::path::Path>, env: Option<String>) -> Result<String, CliError> {
    let token = match file {
        Some(path) => std::fs::read_to_string(path)
            .map_err(|source| CliError::TokenFile { path: path.display().to_string(), source })?,
        None => env.unwrap_or_default(),
    };
    let token = token.trim();
    if token.is_empty() {
        return Err(match file {
            Some(path) => CliError::TokenFileEmpty(path.display().to_string()),
            None => CliError::NoToken,
        });
    }
    let source = file.map_or_else(|| ADMIN_TOKEN_ENV.to_owned(), |p| p.display().to_string());
    token::check(token, &source)?;
    Ok(token.to_owned())
}

/// `--control` as nodes take it: one URL or a comma-separated list. `127.0.0.1:7400` is
/// what people type; gRPC needs a scheme.
pub fn control_urls(text: &str) -> Vec<String> {
    text.split(',')
        .map(|u| u.trim().trim_end_matches('/'))
        .filter(|u| !u.is_empty())
        .map(|u| if u.contains("://") { u.to_owned() } else { format!("http://{u}") })
        .collect()
}

pub fn print(text: &str) -> Result<(), CliError> {
    let mut stdout = std::io::stdout().lock();
    stdout.write_all(text.as_bytes()).and_then(|()| stdout.flush()).map_err(CliError::Stdout)
}

fn warn(warnings: &[String]) {
    for w in warnings {
        eprintln!("warning: {w}");
    }
}

/// Where a paged listing stands: how many more items `--limit` allows, the token of the
/// next page, and whether the listing is over.
struct Pages {
    remaining: Option<u64>,
    token: String,
    started: bool,
    /// The token to continue with when `--limit` stopped the listing before its end.
    stopped_at: Option<String>,
}

impl Pages {
    fn new(limit: Option<u64>, token: Option<String>) -> Self {
        Self {
            remaining: limit,
            token: token.unwrap_or_default(),
            started: false,
            stopped_at: None,
        }
    }

    /// The next request's `limit` and `page_token`, or `None` when the listing is over. A
    /// page asks for no more than `--limit` leaves, so a token printed at the stop continues
    /// right after the last item shown.
    fn next_request(&mut self) -> Option<(u32, String)> {
        if self.started && (self.token.is_empty() || self.remaining == Some(0)) {
            return None;
        }
        self.started = true;
        let size = self.remaining.map_or(PAGE, |r| r.min(PAGE));
        Some((u32::try_from(size).unwrap_or(u32::MAX), self.token.clone()))
    }

    /// Records a page's answer; trims what a control plane from before paging (which sends
    /// everything, and no token) returned past `--limit`.
    fn took<T>(&mut self, items: &mut Vec<T>, next_token: String) -> Result<(), CliError> {
        if let Some(remaining) = self.remaining.as_mut() {
            items.truncate(usize::try_from(*remaining).unwrap_or(usize::MAX));
            *remaining -= items.len() as u64;
        }
        if !next_token.is_empty() && next_token == self.token {
            return Err(CliError::BadResponse(
                "the control plane sent the same page token twice; the listing would not end"
                    .into(),
            ));
        }
        self.token = next_token;
        if self.remaining == Some(0) && !self.token.is_empty() {
            self.stopped_at = Some(self.token.clone());
        }
        Ok(())
    }

    /// On stderr, so that `--json` output stays one document.
    fn say_where_to_continue(&self, what: &str) {
        if let Some(token) = &self.stopped_at {
            eprintln!("more {what} may follow: continue with --page-token {token}");
        }
    }
}

/// Every key (or those the filters keep), printed a page at a time as pages arrive: a
/// million keys print without the CLI holding more than a page.
async fn list_keys(admin: &mut Admin, args: ListKeysArgs, json: bool) -> Result<(), CliError> {
    let now = switchyard_time::now_ms();
    let mut pages = Pages::new(args.limit, args.page_token);
    let mut array = output::JsonArray::new(0);
    let mut shown = 0usize;
    while let Some((limit, page_token)) = pages.next_request() {
        let request = admin.request(pb::ListKeysRequest {
            secret_sha256: String::new(),
            limit,
            page_token,
            status: args.status.clone().unwrap_or_default(),
            name_prefix: args.name_prefix.clone().unwrap_or_default(),
            id_prefix: args.id_prefix.clone().unwrap_or_default(),
        });
        let reply = admin.client.list_keys(request).await.map_err(|s| admin.status(s))?;
        let reply = reply.into_inner();
        let mut keys = reply.keys;
        pages.took(&mut keys, reply.next_page_token)?;
        let views: Vec<KeyView> = keys.into_iter().map(KeyView::from).collect();
        let mut text = String::new();
        if json {
            for view in &views {
                text.push_str(&array.item(view)?);
            }
        } else if !views.is_empty() {
            text = keys_rows(&views, now, shown == 0);
        }
        shown += views.len();
        print(&text)?;
    }
    if json {
        print(&format!("{}\n", array.end()))?;
    } else if shown == 0 {
        print(&keys_table(&[], now))?;
    }
    pages.say_where_to_continue("keys");
    Ok(())
}

fn key_of(key: Option<pb::ApiKey>) -> Result<KeyView, CliError> {
    key.map(KeyView::from).ok_or_else(|| CliError::BadResponse("the reply holds no key".into()))
}

// === commands ===

pub async fn apply(args: ApplyArgs) -> Result<(), CliError> {
    let catalog = catalog_file::load(&args.file)?;
    let catalog_json = serde_json::to_string(&catalog).map_err(CliError::Json)?;
    let mut admin = Admin::connect(&args.opts).await?;
    let request = admin.request(pb::ApplyCatalogRequest {
        catalog_json,
        dry_run: args.dry_run,
        expected_version: None,
    });
    let reply = admin.client.apply_catalog(request).await.map_err(|s| admin.status(s))?;
    let reply = reply.into_inner();
    let view = ApplyView {
        changes: reply.changes,
        applied: reply.applied,
        dry_run: args.dry_run,
        version: reply.version,
    };
    if args.opts.json { print(&output::json(&view)?) } else { print(&apply_result(&view)) }
}

pub async fn catalog(args: CatalogArgs) -> Result<(), CliError> {
    let mut admin = Admin::connect(&args.opts).await?;
    let request = admin.request(pb::GetCatalogRequest {});
    let reply = admin.client.get_catalog(request).await.map_err(|s| admin.status(s))?;
    let reply = reply.into_inner();
    // Read into the apply schema, so what we print is exactly what `apply -f` accepts.
    let catalog: Catalog = if reply.catalog_json.trim().is_empty() {
        Catalog::default()
    } else {
        serde_json::from_str(&reply.catalog_json).map_err(|e| {
            CliError::BadResponse(format!(
                "the stored catalog is not in the format this CLI reads ({e}); \
                 is the CLI older than the control plane?"
            ))
        })?
    };
    if args.opts.json {
        print(&output::json(&catalog)?)
    } else {
        let yaml = catalog_file::to_yaml(&catalog).map_err(CliError::Yaml)?;
        print(&format!("# switchyard catalog, version {}\n{yaml}", reply.version))
    }
}

/// Every node (or those the filters keep), printed a page at a time as pages arrive.
pub async fn nodes(args: NodesArgs) -> Result<(), CliError> {
    let mut admin = Admin::connect(&args.opts).await?;
    let json = args.opts.json;
    let now = switchyard_time::now_ms();
    let mut pages = Pages::new(args.limit, args.page_token);
    let mut array = output::JsonArray::new(2);
    let mut config_version = None;
    let (mut shown, mut opened) = (0usize, false);
    while let Some((limit, page_token)) = pages.next_request() {
        let request = admin.request(pb::ListNodesRequest {
            limit,
            page_token,
            control_plane: args.control_plane.clone().unwrap_or_default(),
            stale_for_ms: args
                .stale
                .map_or(0, |d| u64::try_from(d.as_millis()).unwrap_or(u64::MAX)),
            rejected_only: args.rejected,
        });
        let reply = admin.client.list_nodes(request).await.map_err(|s| admin.status(s))?;
        let reply = reply.into_inner();
        let mut nodes = reply.nodes;
        pages.took(&mut nodes, reply.next_page_token)?;
        // The config version of the first page: the one the lags are counted against.
        let version = *config_version.get_or_insert(reply.config_version);
        let views: Vec<NodeView> = nodes.into_iter().map(NodeView::from).collect();
        let mut text = String::new();
        if json {
            if !opened {
                opened = true;
                text.push_str(&nodes_json_head(version));
            }
            for view in &views {
                text.push_str(&array.item(view)?);
            }
        } else if !views.is_empty() {
            text = nodes_rows(&views, now, shown == 0);
        }
        shown += views.len();
        print(&text)?;
    }
    let version = config_version.unwrap_or_default();
    if json {
        print(&nodes_json_tail(&array))?;
    } else if shown == 0 {
        print(&nodes_table(&NodesView { config_version: version, nodes: vec![] }, now))?;
    }
    pages.say_where_to_continue("nodes");
    Ok(())
}

pub async fn breakers(args: BreakersArgs) -> Result<(), CliError> {
    let mut admin = Admin::connect(&args.opts).await?;
    let request = admin.request(pb::ListBreakersRequest {});
    let reply = admin.client.list_breakers(request).await.map_err(|s| admin.status(s))?;
    let reply = reply.into_inner();
    let fleet = FleetView::from_reply(reply.fleet_enabled, reply.fleet);
    let breakers: Vec<BreakerView> = reply.breakers.into_iter().map(Into::into).collect();
    let now = switchyard_time::now_ms();
    match (args.fleet, args.opts.json) {
        (true, true) => print(&output::json(&fleet)?),
        (true, false) => print(&fleet_table(&fleet, now)),
        // The array of node rows, as before the fleet view: scripts keep working.
        (false, true) => print(&output::json(&breakers)?),
        (false, false) => {
            print(&format!("{}\n{}", breakers_table(&breakers, now), fleet_table(&fleet, now)))
        }
    }
}

/// Prints each event as it arrives (one line, or one JSON object per line), so that
/// `--follow` output can be piped into another program as it happens.
pub async fn events(args: EventsArgs) -> Result<(), CliError> {
    let mut admin = Admin::connect(&args.opts).await?;
    let request = admin.request(pb::ListEventsRequest {
        limit: args.limit,
        follow: args.follow,
        key_id: args.key.unwrap_or_default(),
    });
    let reply = admin.client.list_events(request).await.map_err(|s| admin.status(s))?;
    let mut stream = reply.into_inner();
    let mut printed = 0usize;
    let ended = |status| {
        if args.follow { CliError::follow_ended(status, &admin.url) } else { admin.status(status) }
    };
    while let Some(event) = stream.message().await.map_err(ended)? {
        let view = EventView::from(event);
        let line = if args.opts.json {
            let mut line = view.json()?;
            line.push('\n');
            line
        } else {
            event_line(&view)
        };
        print(&line)?;
        printed += 1;
    }
    if printed == 0 && !args.opts.json {
        eprintln!("no failover events");
    }
    Ok(())
}

pub async fn usage(args: UsageArgs) -> Result<(), CliError> {
    let mut admin = Admin::connect(&args.opts).await?;
    let request = admin.request(pb::GetUsageRequest {
        key_id: args.key.unwrap_or_default(),
        since_unix_ms: args.since.unwrap_or(0),
    });
    let reply = admin.client.get_usage(request).await.map_err(|s| admin.status(s))?.into_inner();
    if args.limits {
        let rows: Vec<LimitView> = reply.limits.into_iter().map(Into::into).collect();
        let now = switchyard_time::now_ms();
        return if args.opts.json {
            print(&output::json(&rows)?)
        } else {
            print(&limits_table(&rows, now))
        };
    }
    let rows: Vec<UsageView> = reply.rows.into_iter().map(Into::into).collect();
    if args.opts.json { print(&output::json(&rows)?) } else { print(&usage_table(&rows)) }
}

pub async fn keys(args: KeysArgs) -> Result<(), CliError> {
    let json = args.opts.json;
    if let KeysCommand::Create(create) = &args.command
        && create.default_models.is_empty()
        && create.options.is_set()
    {
        return Err(CliError::Usage(
            "--timeout-ms, --first-token-timeout-ms and --on belong to the default chain: \
             give --default-models too"
                .into(),
        ));
    }
    let mut admin = Admin::connect(&args.opts).await?;
    match args.command {
        KeysCommand::Create(create) => {
            let failover_defaults = (!create.default_models.is_empty())
                .then(|| create.options.defaults(create.default_models));
            let request = admin.request(pb::CreateKeyRequest {
                name: create.name,
                failover_defaults,
                allowed_models: create.allowed_models,
                allowed_regions: create.allowed_regions,
            });
            let reply = admin.client.create_key(request).await.map_err(|s| admin.status(s))?;
            print_secret("Created", reply.into_inner(), json)
        }
        KeysCommand::List(list) => list_keys(&mut admin, list, json).await,
        KeysCommand::Show { id } => {
            let request = admin.request(pb::KeyIdRequest { id });
            let reply = admin.client.get_key(request).await.map_err(|s| admin.status(s))?;
            print_key(None, reply.into_inner(), json)
        }
        KeysCommand::Revoke { id } => {
            let request = admin.request(pb::KeyIdRequest { id });
            let reply = admin.client.revoke_key(request).await.map_err(|s| admin.status(s))?;
            print_key(Some("Revoked"), reply.into_inner(), json)
        }
        KeysCommand::Rotate { id } => {
            let request = admin.request(pb::KeyIdRequest { id });
            let reply = admin.client.rotate_key(request).await.map_err(|s| admin.status(s))?;
            print_secret("Rotated", reply.into_inner(), json)
        }
        KeysCommand::SetLimits(set) => {
            let limits = (!set.clear).then_some(pb::KeyLimits {
                rpm: set.rpm,
                tpm: set.tpm,
                tokens_per_day: set.tokens_per_day,
                usd_per_day: set.usd_per_day,
            });
            let request = admin.request(pb::SetKeyLimitsRequest { id: set.id, limits });
            let reply = admin.client.set_key_limits(request).await.map_err(|s| admin.status(s))?;
            let verb = if set.clear { "Cleared the limits of" } else { "Set the limits of" };
            print_key(Some(verb), reply.into_inner(), json)
        }
        KeysCommand::SetDefaults(set) => {
            let degraded = set.degraded();
            let failover_defaults = if set.clear {
                None
            } else if set.models.is_empty() {
                // Only the degraded answer changes: the key's chain and options stay.
                let request = admin.request(pb::KeyIdRequest { id: set.id.clone() });
                let current = admin.client.get_key(request).await.map_err(|s| admin.status(s))?;
                let mut defaults =
                    current.into_inner().key.and_then(|k| k.failover_defaults).unwrap_or_default();
                let given = set.options.defaults(Vec::new());
                defaults.timeout_ms = given.timeout_ms.or(defaults.timeout_ms);
                defaults.first_token_timeout_ms =
                    given.first_token_timeout_ms.or(defaults.first_token_timeout_ms);
                if !given.on.is_empty() {
                    defaults.on = given.on;
                }
                defaults.continue_streams = given.continue_streams.or(defaults.continue_streams);
                defaults.degraded = degraded;
                Some(defaults)
            } else {
                Some(pb::FailoverDefaults { degraded, ..set.options.defaults(set.models) })
            };
            let request =
                admin.request(pb::SetKeyDefaultsRequest { id: set.id, failover_defaults });
            let reply =
                admin.client.set_key_defaults(request).await.map_err(|s| admin.status(s))?;
            let verb = if set.clear { "Cleared the defaults of" } else { "Set the defaults of" };
            print_key(Some(verb), reply.into_inner(), json)
        }
    }
}

fn print_secret(verb: &str, reply: pb::KeySecretResponse, json: bool) -> Result<(), CliError> {
    let key = key_of(reply.key)?;
    if json {
        let view = KeySecretView {
            key,
            secret: reply.secret,
            warnings: reply.warnings,
            version: reply.version,
        };
        return print(&output::json(&view)?);
    }
    warn(&reply.warnings);
    print(&key_secret(verb, &key, &reply.secret))
}

fn print_key(verb: Option<&str>, reply: pb::KeyResponse, json: bool) -> Result<(), CliError> {
    let key = key_of(reply.key)?;
    if json {
        return print(&output::json(&KeyWithWarnings {
            key,
            warnings: reply.warnings,
            version: reply.version,
        })?);
    }
    warn(&reply.warnings);
    let mut text = verb.map(|v| format!("{v} key {}\n\n", key.id)).unwrap_or_default();
    text.push_str(&key_details(&key, switchyard_time::now_ms()));
    print(&text)
}

// === webhooks ===

pub async fn webhooks(args: WebhooksArgs) -> Result<(), CliError> {
    let json = args.opts.json;
    let mut admin = Admin::connect(&args.opts).await?;
    match args.command {
        WebhooksCommand::List => {
            let (catalog, _) = admin.catalog().await?;
            if json {
                print(&output::json(&catalog.webhooks)?)
            } else {
                print(&webhooks_table(&catalog.webhooks))
            }
        }
        WebhooksCommand::Add(add) => {
            let secret = add
                .secret
                .as_deref()
                .map(|text| CredentialRef::parse(text.trim()))
                .transpose()
                .map_err(|e| CliError::Usage(format!("--secret: {e}")))?;
            let webhook = Webhook {
                name: add.name,
                url: add.url,
                events: add.events,
                secret,
                internal: add.internal,
                keys: add.keys,
                enabled: !add.disabled,
                batch_max_events: add.batch_max_events,
            };
            admin
                .edit_catalog(json, |catalog| {
                    if catalog.webhooks.iter().any(|w| w.name == webhook.name) {
                        return Err(CliError::Usage(format!(
                            "a webhook named {:?} exists; remove it first or edit the catalog file",
                            webhook.name
                        )));
                    }
                    catalog.webhooks.push(webhook);
                    Ok(())
                })
                .await
        }
        WebhooksCommand::Remove { name } => {
            admin
                .edit_catalog(json, |catalog| {
                    let before = catalog.webhooks.len();
                    catalog.webhooks.retain(|w| w.name != name);
                    if catalog.webhooks.len() == before {
                        return Err(CliError::Usage(format!("no webhook named {name:?}")));
                    }
                    Ok(())
                })
                .await
        }
        WebhooksCommand::Enable { name } => admin.set_enabled(json, &name, true).await,
        WebhooksCommand::Disable { name } => admin.set_enabled(json, &name, false).await,
        WebhooksCommand::Deliveries { name, limit } => {
            let request = admin.request(pb::ListDeliveriesRequest { webhook: name, limit });
            let reply = admin.client.list_deliveries(request).await.map_err(|s| admin.status(s))?;
            let view = DeliveriesView::from(reply.into_inner());
            if json {
                print(&output::json(&view)?)
            } else {
                print(&deliveries(&view, switchyard_time::now_ms()))
            }
        }
        WebhooksCommand::Redeliver { name, event_ids, all_dead } => {
            let request =
                admin.request(pb::RedeliverRequest { webhook: name.clone(), event_ids, all_dead });
            let reply = admin.client.redeliver(request).await.map_err(|s| admin.status(s))?;
            let reply = reply.into_inner();
            if json {
                print(&output::json(&serde_json::json!({
                    "webhook": name,
                    "requeued": reply.requeued,
                    "not_found": reply.not_found,
                }))?)
            } else {
                for id in &reply.not_found {
                    eprintln!("warning: no dead letter or audit entry {id:?}");
                }
                print(&format!("queued {} event(s) for redelivery to {name}\n", reply.requeued))
            }
        }
    }
}

impl Admin {
    async fn catalog(&mut self) -> Result<(Catalog, i64), CliError> {
        let request = self.request(pb::GetCatalogRequest {});
        let reply = self.client.get_catalog(request).await.map_err(|s| self.status(s))?;
        let reply = reply.into_inner();
        let catalog = if reply.catalog_json.trim().is_empty() {
            Catalog::default()
        } else {
            serde_json::from_str(&reply.catalog_json).map_err(|e| {
                CliError::BadResponse(format!("the stored catalog is unreadable here ({e})"))
            })?
        };
        Ok((catalog, reply.version))
    }

    /// Read, change, apply: the apply is refused if the catalog changed since it was read.
    async fn edit_catalog(
        &mut self,
        json: bool,
        change: impl FnOnce(&mut Catalog) -> Result<(), CliError>,
    ) -> Result<(), CliError> {
        let (mut catalog, version) = self.catalog().await?;
        change(&mut catalog)?;
        let catalog_json = serde_json::to_string(&catalog)?;
        let request = self.request(pb::ApplyCatalogRequest {
            catalog_json,
            dry_run: false,
            expected_version: Some(version),
        });
        let reply = self.client.apply_catalog(request).await.map_err(|s| self.status(s))?;
        let reply = reply.into_inner();
        let view = ApplyView {
            changes: reply.changes,
            applied: reply.applied,
            dry_run: false,
            version: reply.version,
        };
        if json { print(&output::json(&view)?) } else { print(&apply_result(&view)) }
    }

    async fn set_enabled(&mut self, json: bool, name: &str, enabled: bool) -> Result<(), CliError> {
        self.edit_catalog(json, |catalog| {
            let webhook = catalog
                .webhooks
                .iter_mut()
                .find(|w| w.name == name)
                .ok_or_else(|| CliError::Usage(format!("no webhook named {name:?}")))?;
            webhook.enabled = enabled;
            Ok(())
        })
        .await
    }
}

#[cfg(test)]
mod paging_tests {
    use super::*;

    #[test]
    fn pages_ask_for_what_the_limit_leaves_and_stop_with_a_token_to_continue() {
        let mut pages = Pages::new(Some(2_500), None);
        assert_eq!(pages.next_request(), Some((1_000, String::new())));
        let mut page: Vec<u32> = vec![0; 1_000];
        pages.took(&mut page, "t1".into()).unwrap();
        assert_eq!(pages.next_request(), Some((1_000, "t1".into())));
        pages.took(&mut page, "t2".into()).unwrap();
        assert_eq!(pages.next_request(), Some((500, "t2".into())), "only what --limit leaves");
        let mut last: Vec<u32> = vec![0; 500];
        pages.took(&mut last, "t3".into()).unwrap();
        assert_eq!(pages.next_request(), None);
        assert_eq!(pages.stopped_at.as_deref(), Some("t3"));
    }

    #[test]
    fn pages_end_with_the_listing_and_trim_an_unpaged_answer_to_the_limit() {
        let mut pages = Pages::new(None, Some("start".into()));
        assert_eq!(pages.next_request(), Some((1_000, "start".into())));
        let mut empty: Vec<u32> = vec![];
        pages.took(&mut empty, "more".into()).unwrap();
        assert!(pages.next_request().is_some(), "an empty page with a token is not the end");
        pages.took(&mut empty, String::new()).unwrap();
        assert_eq!(pages.next_request(), None);
        assert_eq!(pages.stopped_at, None);

        // A control plane from before paging sends everything, without a token.
        let mut pages = Pages::new(Some(3), None);
        pages.next_request();
        let mut all: Vec<u32> = (0..10).collect();
        pages.took(&mut all, String::new()).unwrap();
        assert_eq!(all, [0, 1, 2]);
        assert_eq!((pages.next_request(), pages.stopped_at), (None, None));
    }

    #[test]
    fn a_token_sent_twice_is_an_error_not_an_endless_listing() {
        let mut pages = Pages::new(None, None);
        pages.next_request();
        pages.took(&mut Vec::<u32>::new(), "same".into()).unwrap();
        pages.next_request();
        assert!(pages.took(&mut Vec::<u32>::new(), "same".into()).is_err());
    }

    #[test]
    fn a_malformed_page_token_is_refused_before_a_round_trip() {
        assert!(page_token("k1.6b65795f61").is_ok());
        for bad in ["", "  ", "k1.6b 65", "k1/x", "--json"] {
            assert!(page_token(bad).is_err(), "{bad:?}");
        }
    }
}
