//! `switchyard chaos` (docs/cli.md): inject faults that every node applies at its upstream
//! call, list them, clear them. Everything the CLI can check (exactly one kind, a model or
//! a provider, the rate, the TTL, the name) is checked here, so a mistake sends nothing;
//! the control plane checks the rest (the names exist, the name is free).

use std::time::Duration;

use clap::{ArgGroup, Args, Subcommand};
use switchyard_catalog::fault::{
    DEFAULT_TTL, Fault, FaultKind, FaultTarget, MAX_TTL, MIN_TTL, NAME_RULE, is_valid_name,
};
use switchyard_proto::admin::v1 as pb;
use switchyard_time::{format_duration, now_ms, parse_duration};
use tonic::Code;

use crate::admin::{Admin, AdminOpts, print};
use crate::error::CliError;
use crate::output;
use crate::output::chaos::{ClearedView, FaultView, InjectedView, cleared, faults_table, injected};

#[derive(Debug, Args)]
pub struct ChaosArgs {
    #[command(subcommand)]
    pub command: ChaosCommand,
    #[command(flatten)]
    pub opts: AdminOpts,
}

#[derive(Debug, Subcommand)]
pub enum ChaosCommand {
    /// Inject a fault: matching upstream calls fail (or slow down) on every node until its
    /// TTL ends or it is cleared.
    Inject(InjectArgs),
    /// List the faults in force: name, target, key, kind, rate, time left.
    List,
    /// End a fault at once on every node, or every fault with --all.
    Clear(ClearArgs),
}

#[derive(Debug, Args)]
#[command(group(ArgGroup::new("target").required(true).args(["model", "provider"])))]
#[command(group(
    ArgGroup::new("kind")
        .required(true)
        .args(["status", "delay_ms", "hang", "reset", "malformed", "stall_after", "drop_after"])
))]
pub struct InjectArgs {
    /// The fault's name (letters, digits, '.', '_', '-'; at most 64); affected attempts
    /// carry it as `injected`.
    #[arg(value_name = "NAME", value_parser = fault_name)]
    pub name: String,
    /// Calls to this model (its catalog name).
    #[arg(long, value_name = "M")]
    pub model: Option<String>,
    /// Calls to any model of this provider.
    #[arg(long, value_name = "P")]
    pub provider: Option<String>,
    /// Only calls made for this API key id.
    #[arg(long, value_name = "ID")]
    pub key: Option<String>,
    /// The probability that a matching call is affected, 0 to 1.
    #[arg(long, value_name = "P", default_value_t = 1.0, value_parser = rate, allow_negative_numbers = true)]
    pub rate: f64,
    /// How long the fault lives, 1s to 24h [default: 10m].
    #[arg(long, value_name = "DURATION", value_parser = ttl)]
    pub ttl: Option<Duration>,
    /// Answer as the provider would with this HTTP error status (400-599), error body included.
    #[arg(long, value_name = "N", value_parser = clap::value_parser!(u16).range(400..=599))]
    pub status: Option<u16>,
    /// With --status: the Retry-After the answer carries, in seconds.
    // Checked in `fault`: clap takes `requires` as met by any member of the kind group.
    #[arg(long, value_name = "S")]
    pub retry_after: Option<u64>,
    /// Wait this long before making the real call (1-600000).
    #[arg(long, value_name = "N", value_parser = clap::value_parser!(u64).range(1..=600_000))]
    pub delay_ms: Option<u64>,
    /// Never answer: the attempt's timeout fires.
    #[arg(long)]
    pub hang: bool,
    /// Reset the connection: a connection error.
    #[arg(long)]
    pub reset: bool,
    /// Answer 200 with a body that does not parse.
    #[arg(long)]
    pub malformed: bool,
    /// Streams stop sending (but stay open) after K content chunks.
    #[arg(long, value_name = "K")]
    pub stall_after: Option<u32>,
    /// Streams are cut off after K content chunks.
    #[arg(long, value_name = "K")]
    pub drop_after: Option<u32>,
}

#[derive(Debug, Args)]
#[command(group(ArgGroup::new("which").required(true).args(["name", "all"])))]
pub struct ClearArgs {
    /// The fault to end.
    #[arg(value_name = "NAME", value_parser = fault_name)]
    pub name: Option<String>,
    /// End every fault.
    #[arg(long)]
    pub all: bool,
}

fn fault_name(text: &str) -> Result<String, String> {
    if is_valid_name(text) { Ok(text.to_owned()) } else { Err(NAME_RULE.to_owned()) }
}

fn rate(text: &str) -> Result<f64, String> {
    let rate: f64 = text.trim().parse().map_err(|_| format!("{text:?} is not a number"))?;
    if (0.0..=1.0).contains(&rate) {
        Ok(rate)
    } else {
        Err("must be between 0 and 1 (a probability: 0.5 affects half the calls)".to_owned())
    }
}

pub fn ttl(text: &str) -> Result<Duration, String> {
    let ttl = parse_duration(text).map_err(|e| e.to_string())?;
    if (MIN_TTL..=MAX_TTL).contains(&ttl) {
        Ok(ttl)
    } else {
        Err(format!(
            "must be between {} and {}",
            format_duration(MIN_TTL),
            format_duration(MAX_TTL)
        ))
    }
}

impl InjectArgs {
    /// The fault to send; clap's groups guarantee one target and one kind.
    pub fn fault(&self) -> Result<Fault, CliError> {
        let target = match (&self.model, &self.provider) {
            (Some(m), None) => FaultTarget::Model(m.clone()),
            (None, Some(p)) => FaultTarget::Provider(p.clone()),
            _ => return Err(CliError::Usage("give exactly one of --model and --provider".into())),
        };
        if self.retry_after.is_some() && self.status.is_none() {
            return Err(CliError::Usage("--retry-after goes with --status".into()));
        }
        let kind = if let Some(status) = self.status {
            FaultKind::Status { status, retry_after_secs: self.retry_after }
        } else if let Some(ms) = self.delay_ms {
            FaultKind::Delay { ms }
        } else if self.hang {
            FaultKind::Hang
        } else if self.reset {
            FaultKind::Reset
        } else if self.malformed {
            FaultKind::Malformed
        } else if let Some(chunks) = self.stall_after {
            FaultKind::StallAfter { chunks }
        } else if let Some(chunks) = self.drop_after {
            FaultKind::DropAfter { chunks }
        } else {
            return Err(CliError::Usage(
                "give one kind: --status, --delay-ms, --hang, --reset, --malformed, \
                 --stall-after or --drop-after"
                    .into(),
            ));
        };
        Ok(Fault {
            name: self.name.clone(),
            target,
            key_id: self.key.clone(),
            rate: self.rate,
            kind,
            expires_at_unix_ms: 0,
        })
    }
}

/// The control plane names invalid fields by the flags without their dashes (`model:`,
/// `rate:`); said to someone at a terminal, they are the flags.
fn as_flags(message: &str) -> String {
    const FLAGS: [&str; 9] =
        ["model", "provider", "key", "rate", "ttl", "status", "delay-ms", "retry-after", "target"];
    message
        .split("; ")
        .map(|part| match part.split_once(": ") {
            Some(("name", rest)) => format!("NAME: {rest}"),
            Some(("target", rest)) => format!("--model/--provider: {rest}"),
            Some((path, rest)) if FLAGS.contains(&path) => format!("--{path}: {rest}"),
            _ => part.to_owned(),
        })
        .collect::<Vec<_>>()
        .join("; ")
}

fn refused(admin: &Admin, status: tonic::Status) -> CliError {
    match admin.status(status) {
        CliError::Status { code, message, hint }
            if matches!(code, Code::InvalidArgument | Code::AlreadyExists | Code::NotFound) =>
        {
            CliError::Status { code, message: as_flags(&message), hint }
        }
        other => other,
    }
}

fn decode(json: &str) -> Result<Fault, CliError> {
    serde_json::from_str(json).map_err(|e| {
        CliError::BadResponse(format!(
            "a fault is not in the format this CLI reads ({e}); is the CLI older than the control plane?"
        ))
    })
}

pub async fn chaos(args: ChaosArgs) -> Result<(), CliError> {
    let json = args.opts.json;
    match args.command {
        ChaosCommand::Inject(inject) => {
            // Built before connecting: a mistake costs no round trip.
            let fault = inject.fault()?;
            let ttl = inject.ttl.unwrap_or(DEFAULT_TTL);
            let mut admin = Admin::connect(&args.opts).await?;
            let request = admin.request(pb::InjectFaultRequest {
                fault_json: serde_json::to_string(&fault)?,
                ttl_ms: u64::try_from(ttl.as_millis()).unwrap_or(u64::MAX),
            });
            let reply = admin.client.inject_fault(request).await.map_err(|s| refused(&admin, s))?;
            let reply = reply.into_inner();
            let view = InjectedView { fault: decode(&reply.fault_json)?, version: reply.version };
            if json { print(&output::json(&view)?) } else { print(&injected(&view, now_ms())) }
        }
        ChaosCommand::List => {
            let mut admin = Admin::connect(&args.opts).await?;
            let request = admin.request(pb::ListFaultsRequest {});
            let reply = admin.client.list_faults(request).await.map_err(|s| admin.status(s))?;
            let faults = reply
                .into_inner()
                .faults_json
                .iter()
                .map(|f| decode(f))
                .collect::<Result<Vec<_>, _>>()?;
            let now = now_ms();
            if json {
                let views: Vec<FaultView> =
                    faults.into_iter().map(|f| FaultView::new(f, now)).collect();
                print(&output::json(&views)?)
            } else {
                print(&faults_table(&faults, now))
            }
        }
        ChaosCommand::Clear(clear) => {
            let mut admin = Admin::connect(&args.opts).await?;
            let request = admin.request(pb::ClearFaultsRequest {
                name: clear.name.unwrap_or_default(),
                all: clear.all,
            });
            let reply = admin.client.clear_faults(request).await.map_err(|s| refused(&admin, s))?;
            let reply = reply.into_inner();
            let view = ClearedView { cleared: reply.cleared, version: reply.version };
            if json { print(&output::json(&view)?) } else { print(&cleared(&view)) }
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn the_control_planes_field_names_become_flags() {
        assert_eq!(
            as_flags(
                r#"model: unknown model "x": not in the catalog; key: unknown API key id "k""#
            ),
            r#"--model: unknown model "x": not in the catalog; --key: unknown API key id "k""#
        );
        assert_eq!(
            as_flags(r#"name: a fault named "d" is in force; clear it first"#),
            r#"NAME: a fault named "d" is in force; clear it first"#
        );
        assert_eq!(
            as_flags("no fault named \"d\" is in force"),
            "no fault named \"d\" is in force"
        );
    }
}
