//! `switchyard`: one binary for the control plane, the data-plane node, the all-in-one dev
//! mode and the admin commands (docs/cli.md; the names and flags there are a contract).
#![forbid(unsafe_code)]
#![cfg_attr(test, allow(clippy::unwrap_used, clippy::expect_used, clippy::panic))]

mod admin;
mod chaos;
mod drill;
mod error;
mod output;
mod serve;
mod token;

use std::process::ExitCode;

use clap::error::{ContextKind, ContextValue, ErrorKind};
use clap::{CommandFactory, Parser, Subcommand};

use crate::error::CliError;
use crate::serve::ServeError;

#[derive(Debug, Parser)]
#[command(
    name = "switchyard",
    version,
    about = "An LLM gateway that keeps AI features up when a provider fails"
)]
struct Cli {
    #[command(subcommand)]
    command: Command,
}

#[derive(Debug, Subcommand)]
enum Command {
    /// All-in-one: control plane (embedded store) + node + simulated providers.
    Dev(serve::DevArgs),
    /// Run a control plane (needs an admin token).
    ///
    /// The admin token, at least 16 characters, comes from SWITCHYARD_ADMIN_TOKEN or
    /// --admin-token-file: without one the control plane does not start. Every admin call,
    /// reads too, must present it.
    Control(serve::ControlArgs),
    /// Run a data-plane node.
    Node(serve::NodeArgs),
    /// Run simulated providers (OpenAI-compatible, scriptable faults) for demos and tests.
    Sim(serve::SimArgs),
    /// Apply a catalog file (providers, models, breaker policy, webhooks); declarative.
    Apply(admin::ApplyArgs),
    /// Print the stored catalog, in the format `apply -f` takes.
    Catalog(admin::CatalogArgs),
    /// Manage API keys.
    Keys(admin::KeysArgs),
    /// List the data-plane nodes of the fleet.
    Nodes(admin::NodesArgs),
    /// Show every node's circuit breakers.
    Breakers(admin::BreakersArgs),
    /// Show failover events from the audit log; --follow keeps streaming new ones.
    Events(admin::EventsArgs),
    /// Show usage totals per key and model.
    Usage(admin::UsageArgs),
    /// Manage webhook subscriptions and see their deliveries.
    Webhooks(admin::WebhooksArgs),
    /// Inject faults for drills (every node applies them at its upstream call), list, clear.
    Chaos(chaos::ChaosArgs),
    /// Run a failure drill through a node: inject a fault for one key, send requests, judge
    /// what the fleet did, clear the fault.
    Drill(drill::DrillArgs),
}

/// The request path allocates many small, short-lived buffers on every worker thread;
/// mimalloc's thread-local heaps take them without glibc's arena locks
/// (docs/BENCHMARKS.md, "Figures behind design choices").
#[global_allocator]
static ALLOCATOR: mimalloc::MiMalloc = mimalloc::MiMalloc;

#[tokio::main]
async fn main() -> ExitCode {
    let args: Vec<std::ffi::OsString> = std::env::args_os().collect();
    let cli = match Cli::try_parse_from(&args) {
        Ok(cli) => cli,
        Err(e) => plain_usage(e, &args).exit(),
    };
    let otel = match init_tracing(&cli.command) {
        Ok(otel) => otel,
        Err(e) => return exit(Err(e)),
    };
    let result = run(cli.command).await;
    if let Some(otel) = otel {
        // Sends the spans and log records still queued; blocking, so off the workers.
        let _ = tokio::task::spawn_blocking(move || otel.shutdown()).await;
    }
    exit(result)
}

/// Under a "required argument missing" error, clap's usage line lists besides the missing
/// arguments every one the command line or the environment gave (`--control` from
/// `SWITCHYARD_CONTROL`, `--json`), which reads as if those were required too: the
/// subcommand's own usage line (`switchyard keys create [OPTIONS] --name <NAME>`) is shown
/// instead.
fn plain_usage(mut error: clap::Error, args: &[std::ffi::OsString]) -> clap::Error {
    if error.kind() != ErrorKind::MissingRequiredArgument {
        return error;
    }
    let mut command = Cli::command();
    command.build();
    // The subcommand the words name; an option's value that happens to be a subcommand's
    // name can only mislead the usage line, never the parse.
    for word in args.iter().skip(1).filter_map(|a| a.to_str()) {
        if let Some(sub) = command.find_subcommand(word).cloned() {
            command = sub;
        }
    }
    error.insert(ContextKind::Usage, ContextValue::StyledStr(command.render_usage()));
    error
}

fn exit(result: Result<(), CliError>) -> ExitCode {
    match result {
        Ok(()) => ExitCode::SUCCESS,
        // `switchyard catalog | head` closes our stdout early; that is not a failure.
        Err(CliError::Stdout(e)) if e.kind() == std::io::ErrorKind::BrokenPipe => ExitCode::SUCCESS,
        Err(e) => {
            for line in e.report() {
                eprintln!("{line}");
            }
            ExitCode::from(e.exit_code())
        }
    }
}

async fn run(command: Command) -> Result<(), CliError> {
    match command {
        Command::Dev(args) => Ok(serve::dev(args).await?),
        Command::Control(args) => Ok(serve::control(args).await?),
        Command::Node(args) => Ok(serve::node(args).await?),
        Command::Sim(args) => Ok(serve::sim(args).await?),
        Command::Apply(args) => admin::apply(args).await,
        Command::Catalog(args) => admin::catalog(args).await,
        Command::Keys(args) => admin::keys(args).await,
        Command::Nodes(args) => admin::nodes(args).await,
        Command::Breakers(args) => admin::breakers(args).await,
        Command::Events(args) => admin::events(args).await,
        Command::Usage(args) => admin::usage(args).await,
        Command::Webhooks(args) => admin::webhooks(args).await,
        Command::Chaos(args) => chaos::chaos(args).await,
        Command::Drill(args) => drill::drill(args).await,
    }
}

/// Servers log at info; admin commands stay quiet so their stdout and stderr are only
/// what they mean to say. `RUST_LOG` overrides both.
///
/// A server whose environment sets an OTLP endpoint also exports traces and log records
/// (docs/operating.md, "Traces and log records"); one whose OTLP variables are wrong does not
/// start, so an operator never runs a gateway that silently exports nothing.
fn init_tracing(command: &Command) -> Result<Option<switchyard_otel::Otel>, CliError> {
    let service = match command {
        Command::Node(_) | Command::Dev(_) => Some("switchyard-node"),
        Command::Control(_) => Some("switchyard-control"),
        _ => None,
    };
    let settings = match service {
        Some(name) => switchyard_otel::settings_from_env(name).map_err(ServeError::from)?,
        None => None,
    };
    let default = match command {
        Command::Dev(_) | Command::Control(_) | Command::Node(_) | Command::Sim(_) => "info",
        _ => "warn",
    };
    let filter = tracing_subscriber::EnvFilter::try_from_default_env()
        .unwrap_or_else(|_| tracing_subscriber::EnvFilter::new(default));
    let Some(settings) = settings else {
        fmt_only(filter);
        return Ok(None);
    };
    let otel = switchyard_otel::init(&settings).map_err(ServeError::from)?;
    if let Command::Node(_) = command {
        // A node makes its spans on the OpenTelemetry API, not as `tracing` spans: the layer
        // would have nothing to export, and a `tracing` stack with it (per-layer filters, a
        // registry) costs every debug span and event of the request path more than the
        // plain one. So the node's log output is set up exactly as without OpenTelemetry.
        fmt_only(filter);
        switchyard_otel::announce(&settings);
        return Ok(Some(otel));
    }
    // The control plane's admin calls are `tracing` spans of `SPAN_TARGET`, which the layer
    // exports (`switchyard dev` runs one beside its node); they are not log lines.
    let filter = match format!("{}=off", switchyard_otel::SPAN_TARGET).parse() {
        Ok(directive) => filter.add_directive(directive),
        Err(_) => filter,
    };
    use tracing_subscriber::prelude::*;
    let log = tracing_subscriber::fmt::layer()
        .with_writer(std::io::stderr)
        .with_ansi(colour())
        .with_filter(filter);
    let _ = tracing_subscriber::registry().with(log).with(otel.layer()).try_init();
    switchyard_otel::announce(&settings);
    Ok(Some(otel))
}

/// The log output alone, to stderr.
fn fmt_only(filter: tracing_subscriber::EnvFilter) {
    // try_init: a server that installs its own subscriber keeps it.
    let _ = tracing_subscriber::fmt()
        .with_env_filter(filter)
        .with_writer(std::io::stderr)
        .with_ansi(colour())
        .try_init();
}

/// Colour codes only on a terminal: a log file, `journalctl` or `kubectl logs` would show
/// them as escape sequences.
fn colour() -> bool {
    use std::io::IsTerminal;
    std::io::stderr().is_terminal()
}

#[cfg(test)]
mod tests {
    use clap::CommandFactory;
    use switchyard_catalog::FailoverReason;

    use super::*;
    use crate::admin::{KeysCommand, control_urls, read_token};

    fn parse(args: &[&str]) -> Result<Cli, clap::Error> {
        Cli::try_parse_from(std::iter::once("switchyard").chain(args.iter().copied()))
    }

    fn keys(args: &[&str]) -> admin::KeysArgs {
        let mut all = vec!["keys"];
        all.extend_from_slice(args);
        match parse(&all).unwrap().command {
            Command::Keys(k) => k,
            other => panic!("{other:?}"),
        }
    }

    /// The usage line of a refused command line, as printed.
    fn usage_line(args: &[&str]) -> String {
        let args: Vec<std::ffi::OsString> =
            std::iter::once("switchyard").chain(args.iter().copied()).map(Into::into).collect();
        let error = plain_usage(Cli::try_parse_from(&args).unwrap_err(), &args);
        let text = error.to_string();
        text.lines().find(|l| l.starts_with("Usage: ")).unwrap_or_default().to_owned()
    }

    #[test]
    fn a_missing_required_flag_shows_the_plain_usage_line_not_the_flags_given() {
        let line = usage_line(&["keys", "create", "--control", "http://cp:7400", "--json"]);
        assert_eq!(line, "Usage: switchyard keys create [OPTIONS] --name <NAME>");
    }

    #[test]
    fn the_command_tree_is_consistent() {
        Cli::command().debug_assert();
    }

    #[test]
    fn keys_create_takes_lists_and_json_after_the_subcommand() {
        let k = keys(&[
            "create",
            "--name",
            "app",
            "--default-models",
            "a, b,c",
            "--allowed-regions",
            "eu",
            "--on",
            "timeout,rate_limit,invalid_output",
            "--json",
        ]);
        assert!(k.opts.json);
        let KeysCommand::Create(c) = k.command else { panic!() };
        assert_eq!(c.default_models, ["a", "b", "c"]);
        assert_eq!(c.allowed_regions, ["eu"]);
        assert_eq!(
            c.options.on,
            Some(vec![
                FailoverReason::Timeout,
                FailoverReason::RateLimit,
                FailoverReason::InvalidOutput
            ])
        );
    }

    #[test]
    fn json_may_also_come_before_the_keys_subcommand() {
        assert!(keys(&["--json", "list"]).opts.json);
    }

    #[test]
    fn unknown_triggers_are_a_usage_error_naming_the_choices() {
        let err =
            parse(&["keys", "create", "--name", "a", "--default-models", "a", "--on", "oops"])
                .unwrap_err();
        let text = err.to_string();
        assert!(text.contains(r#"unknown trigger "oops""#), "{text}");
        assert!(
            text.contains(
                "connection_error, server_error, rate_limit, timeout, context_length, invalid_output"
            ),
            "{text}"
        );
        assert_eq!(err.exit_code(), 2);
    }

    #[test]
    fn empty_list_entries_are_refused() {
        let err =
            parse(&["keys", "create", "--name", "a", "--default-models", "a,,b"]).unwrap_err();
        assert!(err.to_string().contains("empty entry"), "{err}");
    }

    #[test]
    fn set_defaults_needs_models_or_clear_but_not_both() {
        assert!(parse(&["keys", "set-defaults", "k1"]).is_err());
        assert!(parse(&["keys", "set-defaults", "k1", "--clear", "--models", "a"]).is_err());
        let KeysCommand::SetDefaults(s) = keys(&["set-defaults", "k1", "--clear"]).command else {
            panic!()
        };
        assert!(s.clear);
        let KeysCommand::SetDefaults(s) =
            keys(&["set-defaults", "k1", "--models", "a,b", "--timeout-ms", "20000"]).command
        else {
            panic!()
        };
        assert_eq!((s.models.len(), s.options.timeout_ms), (2, Some(20_000)));
    }

    #[test]
    fn apply_takes_a_file_and_dry_run() {
        let Command::Apply(a) = parse(&["apply", "-f", "c.yaml", "--dry-run"]).unwrap().command
        else {
            panic!()
        };
        assert!(a.dry_run);
        assert_eq!(a.file, std::path::Path::new("c.yaml"));
        assert!(parse(&["apply"]).is_err());
    }

    #[test]
    fn admin_commands_take_control_and_json() {
        let Command::Nodes(n) =
            parse(&["nodes", "--control", "http://cp:7400", "--json"]).unwrap().command
        else {
            panic!()
        };
        assert_eq!((n.opts.control.as_str(), n.opts.json), ("http://cp:7400", true));
        assert!(
            matches!(parse(&["catalog", "--json"]).unwrap().command, Command::Catalog(c) if c.opts.json)
        );
    }

    #[test]
    fn report_commands_take_their_flags() {
        let Command::Events(e) =
            parse(&["events", "--follow", "--limit", "5", "--key", "key_1", "--json"])
                .unwrap()
                .command
        else {
            panic!()
        };
        assert!(e.follow && e.opts.json);
        assert_eq!((e.limit, e.key.as_deref()), (5, Some("key_1")));
        let Command::Usage(u) = parse(&["usage", "--key", "k"]).unwrap().command else { panic!() };
        assert_eq!(u.key.as_deref(), Some("k"));
        assert!(
            matches!(parse(&["breakers", "--json"]).unwrap().command, Command::Breakers(b) if b.opts.json)
        );
    }

    #[test]
    fn webhooks_commands_take_their_flags() {
        use crate::admin::WebhooksCommand;
        let webhooks = |args: &[&str]| {
            let mut all = vec!["webhooks"];
            all.extend_from_slice(args);
            match parse(&all).map(|c| c.command) {
                Ok(Command::Webhooks(w)) => Ok(w.command),
                Ok(other) => panic!("{other:?}"),
                Err(e) => Err(e),
            }
        };
        let WebhooksCommand::Add(add) = webhooks(&[
            "add",
            "oncall",
            "--url",
            "https://h.example.com",
            "--events",
            "api:model_failover, breaker.opened",
            "--keys",
            "k1,k2",
            "--batch-max-events",
            "20",
        ])
        .unwrap() else {
            panic!()
        };
        assert_eq!(add.events, ["api:model_failover", "breaker.opened"]);
        assert_eq!((add.keys.len(), add.batch_max_events, add.internal), (2, Some(20), false));
        assert!(webhooks(&["add", "x", "--url", "https://h"]).is_err(), "--events is required");
        assert!(webhooks(&["redeliver", "oncall"]).is_err(), "ids or --all-dead");
        assert!(matches!(
            webhooks(&["redeliver", "oncall", "--all-dead"]).unwrap(),
            WebhooksCommand::Redeliver { all_dead: true, .. }
        ));
        assert!(matches!(
            webhooks(&["deliveries", "oncall", "--limit", "5"]).unwrap(),
            WebhooksCommand::Deliveries { limit: 5, .. }
        ));
    }

    fn chaos(args: &[&str]) -> Result<chaos::ChaosCommand, clap::Error> {
        let mut all = vec!["chaos"];
        all.extend_from_slice(args);
        match parse(&all)?.command {
            Command::Chaos(c) => Ok(c.command),
            other => panic!("{other:?}"),
        }
    }

    /// The error of a command line clap refuses: its text and exit code.
    fn refused(args: &[&str]) -> (String, i32) {
        let err = chaos(args).unwrap_err();
        (err.to_string(), err.exit_code())
    }

    #[test]
    fn chaos_inject_builds_each_kind_of_fault() {
        use switchyard_catalog::fault::{FaultKind, FaultTarget};
        let cases: [(&[&str], FaultKind); 7] = [
            (
                &["--status", "503", "--retry-after", "2"],
                FaultKind::Status { status: 503, retry_after_secs: Some(2) },
            ),
            (&["--delay-ms", "250"], FaultKind::Delay { ms: 250 }),
            (&["--hang"], FaultKind::Hang),
            (&["--reset"], FaultKind::Reset),
            (&["--malformed"], FaultKind::Malformed),
            (&["--stall-after", "3"], FaultKind::StallAfter { chunks: 3 }),
            (&["--drop-after", "0"], FaultKind::DropAfter { chunks: 0 }),
        ];
        for (kind_args, kind) in cases {
            let mut args = vec!["inject", "drill", "--model", "sim/primary"];
            args.extend_from_slice(kind_args);
            let chaos::ChaosCommand::Inject(inject) = chaos(&args).unwrap() else { panic!() };
            let fault = inject.fault().unwrap();
            assert_eq!(fault.kind, kind, "{args:?}");
            assert_eq!(fault.target, FaultTarget::Model("sim/primary".into()));
            assert_eq!((fault.rate, fault.key_id.as_deref()), (1.0, None));
            assert_eq!(inject.ttl, None, "the control plane's default applies");
        }
        let chaos::ChaosCommand::Inject(inject) = chaos(&[
            "inject",
            "d2",
            "--provider",
            "openai",
            "--key",
            "key_a",
            "--rate",
            "0.5",
            "--ttl",
            "90s",
            "--hang",
            "--json",
        ])
        .unwrap() else {
            panic!()
        };
        let fault = inject.fault().unwrap();
        assert_eq!(fault.target, FaultTarget::Provider("openai".into()));
        assert_eq!((fault.rate, fault.key_id.as_deref()), (0.5, Some("key_a")));
        assert_eq!(inject.ttl, Some(std::time::Duration::from_secs(90)));
    }

    #[test]
    fn chaos_inject_wants_exactly_one_kind_and_one_target_naming_the_flags() {
        let (text, code) = refused(&["inject", "d", "--model", "m"]);
        assert_eq!(code, 2);
        for flag in ["--status", "--delay-ms", "--hang", "--reset", "--malformed", "--stall-after"]
        {
            assert!(text.contains(flag), "{flag} not in: {text}");
        }
        let (text, code) = refused(&["inject", "d", "--model", "m", "--hang", "--reset"]);
        assert_eq!(code, 2);
        assert!(text.contains("--hang") && text.contains("--reset"), "{text}");
        let (text, _) = refused(&["inject", "d", "--hang"]);
        assert!(text.contains("--model") && text.contains("--provider"), "{text}");
        let (text, _) = refused(&["inject", "d", "--model", "m", "--provider", "p", "--hang"]);
        assert!(text.contains("--model") && text.contains("--provider"), "{text}");
        let chaos::ChaosCommand::Inject(alone) =
            chaos(&["inject", "d", "--model", "m", "--hang", "--retry-after", "3"]).unwrap()
        else {
            panic!()
        };
        let err = alone.fault().unwrap_err();
        assert!(err.to_string().contains("--status"), "{err}");
        assert_eq!(err.exit_code(), 2);
    }

    #[test]
    fn chaos_inject_refuses_out_of_range_values_naming_the_flag() {
        for (args, flag) in [
            (&["--rate", "1.5"][..], "--rate"),
            (&["--rate", "-0.1"], "--rate"),
            (&["--rate", "half"], "--rate"),
            (&["--ttl", "500ms"], "--ttl"),
            (&["--ttl", "25h"], "--ttl"),
            (&["--ttl", "0"], "--ttl"),
            (&["--status", "200"], "--status"),
            (&["--delay-ms", "0"], "--delay-ms"),
        ] {
            let mut all = vec!["inject", "d", "--model", "m"];
            all.extend_from_slice(args);
            if !args.contains(&"--status") && !args.contains(&"--delay-ms") {
                all.push("--hang");
            }
            let (text, code) = refused(&all);
            assert_eq!(code, 2, "{args:?}");
            assert!(text.contains(flag), "{args:?}: {text}");
        }
        let (text, code) = refused(&["inject", "bad/name", "--model", "m", "--hang"]);
        assert_eq!(code, 2);
        assert!(text.contains("<NAME>") && text.contains("1-64 characters"), "{text}");
        assert!(chaos(&["inject", "d", "--model", "m", "--hang", "--ttl", "1s"]).is_ok());
        assert!(chaos(&["inject", "d", "--model", "m", "--hang", "--ttl", "24h"]).is_ok());
        assert!(chaos(&["inject", "d", "--model", "m", "--hang", "--rate", "0"]).is_ok());
    }

    #[test]
    fn chaos_clear_takes_a_name_or_all_and_list_takes_json() {
        assert!(matches!(
            chaos(&["clear", "drill"]).unwrap(),
            chaos::ChaosCommand::Clear(c) if c.name.as_deref() == Some("drill") && !c.all
        ));
        assert!(
            matches!(chaos(&["clear", "--all"]).unwrap(), chaos::ChaosCommand::Clear(c) if c.all)
        );
        assert_eq!(refused(&["clear"]).1, 2);
        assert_eq!(refused(&["clear", "drill", "--all"]).1, 2);
        let Command::Chaos(c) = parse(&["chaos", "list", "--json"]).unwrap().command else {
            panic!()
        };
        assert!(c.opts.json && matches!(c.command, chaos::ChaosCommand::List));
    }

    #[test]
    fn serve_commands_parse() {
        assert!(matches!(parse(&["dev"]).unwrap().command, Command::Dev(_)));
        assert!(matches!(
            parse(&["node", "--control", "http://127.0.0.1:7400", "--listen", "127.0.0.1:8080"])
                .unwrap()
                .command,
            Command::Node(_)
        ));
    }

    #[test]
    fn the_token_comes_from_the_file_or_the_environment() {
        assert_eq!(
            read_token(None, Some(" t0k-0123456789abcdef \n".into())).unwrap(),
            "t0k-0123456789abcdef"
        );
        assert!(matches!(read_token(None, None), Err(CliError::NoToken)));
        assert!(matches!(read_token(None, Some(" ".into())), Err(CliError::NoToken)));
        assert!(matches!(read_token(None, Some("nope".into())), Err(CliError::Token(_))));
        let dir = std::env::temp_dir().join(format!("sy-cli-token-{}", std::process::id()));
        std::fs::write(&dir, "from-file-0123456789\n").unwrap();
        assert_eq!(
            read_token(Some(&dir), Some("env-0123456789abcdef".into())).unwrap(),
            "from-file-0123456789"
        );
        std::fs::remove_file(&dir).unwrap();
        assert!(matches!(read_token(Some(&dir), None), Err(CliError::TokenFile { .. })));
    }

    #[test]
    fn control_urls_get_a_scheme_and_may_be_a_list() {
        assert_eq!(control_urls("127.0.0.1:7400"), ["http://127.0.0.1:7400"]);
        assert_eq!(
            control_urls("https://cp.example.com/, http://b:7400,"),
            ["https://cp.example.com", "http://b:7400"]
        );
    }
}
