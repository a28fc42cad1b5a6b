//! `switchyard drill` (docs/cli.md, docs/operating.md "Drills"): five failure scenarios
//! run on purpose against a running fleet, through one node and one API key.
//!
//! A drill checks everything it can before it injects anything (the control plane, the
//! key, the chain, the node, a healthy first answer), then injects its fault with a short
//! TTL and only for the drill's key, waits until the node has applied it, sends its
//! requests, and clears the fault on every way out — an error, a verdict, or Ctrl-C. The
//! verdicts are judged in [`verdict`] from what the answers reported.

pub mod error;
mod node;
mod observe;
pub mod report;
mod verdict;

use std::collections::BTreeMap;
use std::sync::Arc;
use std::sync::atomic::{AtomicU32, Ordering};
use std::time::{Duration, Instant};

use clap::Args;
use switchyard_catalog::catalog::Continuation;
use switchyard_catalog::fault::{Fault, FaultKind, FaultTarget, MAX_TTL};
use switchyard_catalog::keys::hash_secret;
use switchyard_catalog::{Catalog, Model};
use switchyard_proto::admin::v1 as pb;
use switchyard_time::format_duration;

use crate::admin::{Admin, AdminOpts, print};
use crate::error::CliError;
use crate::output;
use crate::output::drill::drill_report;
use crate::token::Secret;
use error::DrillError;
use node::{Ask, Node, NodeError};
use observe::Observation;
use report::{DrillReport, Latency, Scenario, Surface};
use verdict::Reference;

#[derive(Debug, Args)]
pub struct DrillArgs {
    /// Which scenario to run.
    #[arg(value_enum)]
    pub scenario: Scenario,
    /// The node to send the drill's requests through (its HTTP URL).
    #[arg(long, value_name = "URL")]
    pub node: String,
    /// For an `https://` node: PEM CA certificate(s) its certificate must be signed by
    /// (default: the public web's CAs).
    #[arg(long, value_name = "FILE")]
    pub node_ca: Option<std::path::PathBuf>,
    /// The API key the requests use; the fault touches only this key's calls.
    #[arg(long, value_name = "KEY", env = "SWITCHYARD_DRILL_KEY", hide_env_values = true)]
    pub key: Secret,
    /// The model the requests ask for: the chain's first model.
    #[arg(long, value_name = "M")]
    pub model: String,
    /// The rest of the chain, as an app sends it (`fallback_models`); without it the key's
    /// failoverDefaults form the chain.
    #[arg(long, value_name = "M,...", value_delimiter = ',')]
    pub fallback_models: Vec<String>,
    /// The API the requests come through: `chat` (/v1/chat/completions) or `messages`
    /// (/v1/messages, Anthropic's shape).
    #[arg(long, value_enum, default_value_t = Surface::Chat)]
    pub surface: Surface,
    /// How many requests to send [default: 40; stream-stall and stream-cut 8; all-down 20].
    #[arg(long, value_name = "N", value_parser = clap::value_parser!(u32).range(1..=100_000))]
    pub requests: Option<u32>,
    /// stream-cut: cut the primary's streams after K content chunks [default: just past the
    /// middle of the healthy answer, (N + 3) / 2 of its N chunks: the fault cuts every call,
    /// the continuation's too, so the continuation must come in fewer than K chunks].
    #[arg(long, value_name = "K", value_parser = clap::value_parser!(u32).range(1..=100_000))]
    pub cut_after: Option<u32>,
    /// How many requests are in flight at once [default: 4; stream-cut 1].
    #[arg(long, value_name = "N", value_parser = clap::value_parser!(u32).range(1..=256))]
    pub concurrency: Option<u32>,
    /// How long the injected fault lives if the drill cannot clear it (killed), 1s to 24h
    /// [default: 5m, longer when the drill needs it].
    #[arg(long, value_name = "DURATION", value_parser = crate::chaos::ttl)]
    pub ttl: Option<Duration>,
    #[command(flatten)]
    pub opts: AdminOpts,
}

impl DrillArgs {
    /// Requests in flight at once: `--concurrency`, else 4 — but one for stream-cut. Each cut
    /// is a failure of a primary call and each continuation a success, so one stream at a
    /// time keeps the primary's failure rate below half; several at a time can put failures
    /// ahead and open its breaker, and a stream cut then may find no model to continue it.
    fn concurrency(&self) -> u32 {
        self.concurrency.unwrap_or(match self.scenario {
            Scenario::StreamCut => 1,
            _ => 4,
        })
    }
}

/// How long the node may take to apply an injected or cleared fault.
const APPLY_WAIT: Duration = Duration::from_secs(5);
/// A plain request that has not answered by then is recorded as unanswered.
const PLAIN_GIVE_UP: Duration = Duration::from_secs(120);
/// Requests sent to a model outside the chain during `all-down`.
const OUTSIDE_REQUESTS: usize = 5;
const DEFAULT_TTL: Duration = Duration::from_secs(5 * 60);

/// What the drill learnt before injecting anything.
struct Plan {
    chain: Vec<String>,
    key_id: String,
    /// A model outside the chain that served before the drill (all-down).
    outside: Option<String>,
    window_size: u32,
    cooldown_ms: u64,
    stall_timeout: Duration,
    /// stream-cut: the content chunks after which the primary's streams are cut.
    cut_after: Option<u32>,
    /// stream-cut: what healthy streams of the drill's request answered.
    reference: Option<Reference>,
}

/// What every drill request asks: the same words each time, so stream-cut's healthy
/// streams before the fault are the same request as the cut ones.
fn drill_content(scenario: Scenario) -> String {
    format!("Switchyard drill: {}", scenario.name())
}

/// The cut a stream-cut drill makes in an answer of `chunks` content chunks: `K` from
/// `--cut-after`, else just past the middle. The fault cuts every call, the continuation's
/// too, and counts the chunk with the finish reason as one of its K: a continuation ends
/// whole only when its rest and that chunk come in fewer than K, so K is the least with
/// `chunks - K + 1 < K`.
fn cut_after(given: Option<u32>, chunks: u32) -> Result<u32, DrillError> {
    let k = given.unwrap_or_else(|| 2.max((chunks + 3) / 2));
    if k < chunks {
        return Ok(k);
    }
    Err(DrillError::Chain(match given {
        Some(k) => format!(
            "--cut-after {k}: the healthy answer has {chunks} content chunk(s), so a cut after {k} would not cut it; give a K below {chunks}"
        ),
        None => format!(
            "the healthy answer has {chunks} content chunk(s): too few for stream-cut to cut and continue (it needs 4 or more)"
        ),
    }))
}

pub async fn drill(args: DrillArgs) -> Result<(), CliError> {
    let scenario = args.scenario;
    if args.cut_after.is_some() && scenario != Scenario::StreamCut {
        return Err(CliError::Usage(format!(
            "--cut-after goes with stream-cut, not {}",
            scenario.name()
        )));
    }
    // Continuation (what stream-cut judges) is built for Chat Completions streams only; a
    // broken /v1/messages stream ends with an `error` event (docs/messages.md).
    match (scenario, args.surface) {
        (Scenario::StreamCut, Surface::Messages) => {
            return Err(CliError::Usage(
                "--surface messages: stream-cut judges stream continuation, which /v1/messages does not do (a broken Messages stream ends with an error event); run it with --surface chat"
                    .to_owned(),
            ));
        }
        (Scenario::StreamCut, Surface::Responses) => {
            return Err(CliError::Usage(
                "--surface responses: stream-cut counts continuations by the report a continued Chat stream carries, which a Responses stream does not carry; run it with --surface chat"
                    .to_owned(),
            ));
        }
        _ => {}
    }
    // Listening for Ctrl-C from the start: one pressed while the drill injects still clears.
    let interrupted = tokio::signal::ctrl_c();
    tokio::pin!(interrupted);
    let node = Node::new(&args.node, &args.key.0, args.node_ca.as_deref(), args.surface)
        .map_err(|e| CliError::Usage(e.to_string()))?;
    let mut admin = Admin::connect(&args.opts).await?;
    let plan = tokio::select! {
        plan = plan(&args, &mut admin, &node) => plan?,
        _ = &mut interrupted => return Err(DrillError::Interrupted(scenario.name()).into()),
    };
    let requests = args.requests.unwrap_or_else(|| scenario.default_requests());
    let give_up = match scenario {
        Scenario::StreamStall => plan.stall_timeout + verdict::STALL_SLACK + Duration::from_secs(5),
        _ => PLAIN_GIVE_UP,
    };
    // Short: the fault outlives a drill that is killed outright only by this much. A stalled
    // stream takes its whole stall timeout, so those drills get what their rounds need.
    let ttl = args.ttl.unwrap_or_else(|| match scenario {
        Scenario::StreamStall => {
            let rounds = requests.div_ceil(args.concurrency()).min(1_000);
            DEFAULT_TTL.max((give_up.saturating_mul(rounds) + Duration::from_secs(60)).min(MAX_TTL))
        }
        _ => DEFAULT_TTL,
    });
    let before = node.breaker_transitions().await.map_err(DrillError::from)?;

    let faults = faults(scenario, &plan, &args.model);
    let mut injected = Vec::new();
    let mut version = 0;
    for fault in &faults {
        // Named before it is sent: a write the control plane made but could not confirm is
        // cleared like the others.
        injected.push(fault.name.clone());
        let result = tokio::select! {
            result = inject(&mut admin, fault, ttl) => Some(result),
            _ = &mut interrupted => None,
        };
        match result {
            Some(Ok(v)) => version = version.max(v),
            Some(Err(e)) => {
                clear(&mut admin, &injected).await;
                return Err(e);
            }
            None => {
                clear(&mut admin, &injected).await;
                return Err(DrillError::Interrupted(scenario.name()).into());
            }
        }
    }

    // From here on every way out clears the faults.
    let outcome = tokio::select! {
        outcome = run(scenario, &node, &args, &plan, requests, give_up, version) => Some(outcome),
        _ = &mut interrupted => None,
    };
    let cleared_at = clear(&mut admin, &injected).await;
    let cleared = match cleared_at {
        Some(v) => wait_applied(&node, v).await.is_ok(),
        None => false,
    };
    let Some(outcome) = outcome else {
        return Err(DrillError::Interrupted(scenario.name()).into());
    };
    let (observations, outside, took) = outcome?;
    let after = node.breaker_transitions().await.map_err(DrillError::from)?;

    let report = report(
        scenario,
        &args,
        &plan,
        &catalog_of(&mut admin).await?,
        Judged {
            observations: &observations,
            outside: &outside,
            took,
            before: &before,
            after: &after,
            faults: injected,
            cleared,
        },
    );
    if args.opts.json {
        print(&output::json(&report)?)?
    } else {
        print(&drill_report(&report))?
    }
    let failed = report.expectations.iter().filter(|e| e.holds == Some(false)).count();
    if failed > 0 || !report.faults_cleared {
        return Err(DrillError::Failed {
            scenario: scenario.name(),
            failed: failed + usize::from(!report.faults_cleared),
            total: report.expectations.len() + usize::from(!report.faults_cleared),
        }
        .into());
    }
    Ok(())
}

async fn catalog_of(admin: &mut Admin) -> Result<Catalog, CliError> {
    let request = admin.request(pb::GetCatalogRequest {});
    let reply = admin.client.get_catalog(request).await.map_err(|s| admin.status(s))?;
    serde_json::from_str(&reply.into_inner().catalog_json)
        .map_err(|e| CliError::BadResponse(format!("the catalog does not parse: {e}")))
}

/// Checks what can be checked before injecting: the model, the key, the chain, the node and
/// a first answer from the healthy chain.
async fn plan(args: &DrillArgs, admin: &mut Admin, node: &Node) -> Result<Plan, CliError> {
    let catalog = catalog_of(admin).await?;
    let model: &Model =
        catalog.model(&args.model).ok_or_else(|| DrillError::UnknownModel(args.model.clone()))?;
    for fallback in &args.fallback_models {
        if catalog.model(fallback).is_none() {
            return Err(DrillError::Chain(format!(
                "--fallback-models: {fallback:?} is not in the catalog"
            ))
            .into());
        }
    }
    let request = admin.request(pb::ListKeysRequest {
        secret_sha256: hash_secret(&args.key.0),
        ..Default::default()
    });
    let keys =
        admin.client.list_keys(request).await.map_err(|s| admin.status(s))?.into_inner().keys;
    let key = keys.into_iter().find(|k| k.status == "active").ok_or(DrillError::UnknownKey)?;

    let mut chain = vec![args.model.clone()];
    if args.fallback_models.is_empty() {
        let defaults = key.failover_defaults.as_ref().map(|d| d.models.clone()).unwrap_or_default();
        if let Some(at) = defaults.iter().position(|m| *m == args.model) {
            chain.extend(defaults[at + 1..].iter().cloned());
        }
    } else {
        chain.extend(args.fallback_models.iter().cloned());
    }
    let mut seen = std::collections::HashSet::new();
    chain.retain(|m| seen.insert(m.clone()));
    if matches!(args.scenario, Scenario::PrimaryDown | Scenario::PrimaryFlaky) && chain.len() < 2 {
        return Err(DrillError::Chain(format!(
            "{} needs a chain of two or more models, and {} is alone for this key: give \
             --fallback-models, or the key failoverDefaults that list it (switchyard keys set-defaults)",
            args.scenario.name(),
            args.model
        ))
        .into());
    }
    if args.scenario == Scenario::StreamCut {
        let continues = chain
            .iter()
            .any(|m| catalog.model(m).is_some_and(|m| m.continuation == Continuation::Prefill));
        if !continues {
            return Err(DrillError::Chain(format!(
                "stream-cut needs a model in the chain that can continue a stream, and none of {} has `continuation: prefill` in the catalog (docs/catalog.md); nothing was injected",
                chain.join(", ")
            ))
            .into());
        }
    }

    node.config_version().await.map_err(DrillError::from)?;
    let ask = Ask {
        model: args.model.clone(),
        fallback_models: args.fallback_models.clone(),
        models: None,
        stream: false,
    };
    let first = settled(node, &ask, &args.model, args.scenario).await;
    if args.scenario != Scenario::AllDown {
        chain_closed(node, &catalog, &chain).await;
    }
    match first.status {
        None => {
            return Err(DrillError::Node(NodeError::Unreachable {
                url: node.url().to_owned(),
                reason: first.error.unwrap_or_default(),
            })
            .into());
        }
        Some(401) => {
            return Err(DrillError::Unhealthy(format!(
                "the node refused the key (401 {})",
                first.error.unwrap_or_default()
            ))
            .into());
        }
        Some(200) if first.served() => {}
        Some(status) => {
            return Err(DrillError::Unhealthy(format!(
                "a request for {} got {status} {}",
                args.model,
                first.error.unwrap_or_default()
            ))
            .into());
        }
    }
    if args.scenario != Scenario::AllDown
        && first.served_model.as_deref() != Some(args.model.as_str())
    {
        return Err(DrillError::Unhealthy(format!(
            "{} did not serve a request (served by {}: {}); a drill starts from a healthy \
             primary (`switchyard breakers` shows its breaker)",
            args.model,
            first.served_model.as_deref().unwrap_or("nothing"),
            verdict::outcomes(std::slice::from_ref(&first))
        ))
        .into());
    }

    let (mut cut, mut reference) = (None, None);
    if args.scenario == Scenario::StreamCut {
        let (chunks, healthy) = references(node, &ask, &args.model).await?;
        cut = Some(cut_after(args.cut_after, chunks)?);
        reference = Some(healthy);
    }

    let mut outside = None;
    if args.scenario == Scenario::AllDown {
        let usable = catalog.models.iter().filter(|m| {
            !chain.contains(&m.name)
                && (key.allowed_models.is_empty() || key.allowed_models.contains(&m.name))
                && (key.allowed_regions.is_empty()
                    || m.deployment_models().iter().any(|d| {
                        catalog
                            .provider(&d.provider)
                            .and_then(|p| p.region.as_ref())
                            .is_some_and(|r| key.allowed_regions.contains(r))
                    }))
        });
        for candidate in usable.take(3) {
            let ask = Ask { models: Some(vec![candidate.name.clone()]), ..ask.clone() };
            let answer = node
                .send(
                    &ask,
                    "Switchyard drill: a model outside the chain",
                    Instant::now(),
                    PLAIN_GIVE_UP,
                )
                .await;
            if answer.served() && answer.served_model.as_deref() == Some(candidate.name.as_str()) {
                outside = Some(candidate.name.clone());
                break;
            }
        }
    }

    let policy = model
        .breaker
        .as_ref()
        .map_or(catalog.breaker_policy, |o| catalog.breaker_policy.with_override(o));
    Ok(Plan {
        chain,
        key_id: key.id,
        outside,
        window_size: policy.window_size,
        cooldown_ms: policy.cooldown_ms,
        stall_timeout: Duration::from_millis(u64::from(model.stall_timeout_ms())),
        cut_after: cut,
        reference,
    })
}

/// stream-cut: two healthy streams of the drill's request, before the fault. Their text is
/// what every cut stream must come to, and the first's content chunks say where to cut.
async fn references(node: &Node, ask: &Ask, model: &str) -> Result<(u32, Reference), CliError> {
    let ask = Ask { stream: true, ..ask.clone() };
    let content = drill_content(Scenario::StreamCut);
    let mut healthy = Vec::new();
    for _ in 0..2 {
        let answer = node.send(&ask, &content, Instant::now(), PLAIN_GIVE_UP).await;
        let whole = answer.served() && answer.served_model.as_deref() == Some(model);
        match answer.stream {
            Some(stream) if whole && stream.error_code.is_none() => healthy.push(stream),
            _ => {
                return Err(DrillError::Unhealthy(format!(
                    "a stream for {model} before the fault did not end whole from it ({})",
                    verdict::outcomes(std::slice::from_ref(&answer))
                ))
                .into());
            }
        }
    }
    let (first, second) = (&healthy[0], &healthy[1]);
    let reference = if first.text == second.text {
        Reference::Text(first.text.clone())
    } else {
        Reference::NotJudged(format!(
            "two healthy streams of the same request differ ({} and {} bytes): {model} does not answer the same way twice",
            first.text.len(),
            second.text.len()
        ))
    };
    Ok((first.content_chunks, reference))
}

/// How long a drill waits for its primary's breaker to close before it starts (an earlier
/// drill, or a real incident, may have left it open).
const SETTLE: Duration = Duration::from_secs(60);

/// The first request, sent again every half second while the primary's breaker is open on
/// the node, up to [`SETTLE`]: a drill starts from a healthy chain.
async fn settled(node: &Node, ask: &Ask, model: &str, scenario: Scenario) -> Observation {
    let started = Instant::now();
    let mut said = false;
    loop {
        let first = node
            .send(
                ask,
                "Switchyard drill: a request before the fault",
                Instant::now(),
                PLAIN_GIVE_UP,
            )
            .await;
        let waiting =
            scenario != Scenario::AllDown && first.skipped(model) && started.elapsed() < SETTLE;
        if !waiting {
            return first;
        }
        if !said {
            eprintln!(
                "waiting up to {} for {model}'s breaker on the node to close before the drill",
                format_duration(SETTLE)
            );
            said = true;
        }
        tokio::time::sleep(Duration::from_millis(500)).await;
    }
}

/// Waits, up to [`SETTLE`], until the breakers of the chain's later models are closed on the
/// node too: a fallback left open by an earlier drill (all-down, say) would turn this drill's
/// failovers into errors. Their breakers close on the node's own probes, within one
/// `probe.open_interval_ms` of a recovery. A breaker the node never used reads as closed.
async fn chain_closed(node: &Node, catalog: &Catalog, chain: &[String]) {
    let breakers: Vec<(String, String)> =
        chain.iter().skip(1).filter_map(|name| catalog.model(name)).map(breaker_of).collect();
    let started = Instant::now();
    let mut said = false;
    while started.elapsed() < SETTLE {
        let Ok(states) = node.breaker_states().await else { return };
        let open: Vec<&str> = breakers
            .iter()
            .filter(|b| states.get(*b).is_some_and(|s| *s != 0))
            .map(|(_, model)| model.as_str())
            .collect();
        if open.is_empty() {
            return;
        }
        if !said {
            eprintln!(
                "waiting up to {} for the breakers of {} on the node to close before the drill",
                format_duration(SETTLE),
                open.join(", ")
            );
            said = true;
        }
        tokio::time::sleep(Duration::from_millis(200)).await;
    }
}

/// The faults a scenario injects, each only for the drill's key.
fn faults(scenario: Scenario, plan: &Plan, model: &str) -> Vec<Fault> {
    let tag: String = (0..6)
        .map(|_| char::from(b"abcdefghijklmnopqrstuvwxyz0123456789"[rand::random_range(0..36)]))
        .collect();
    let fault = |name: String, model: &str, rate: f64, kind: FaultKind| Fault {
        name,
        target: FaultTarget::Model(model.to_owned()),
        key_id: Some(plan.key_id.clone()),
        rate,
        kind,
        expires_at_unix_ms: 0,
    };
    let base = format!("drill-{}-{tag}", scenario.name());
    let unavailable = FaultKind::Status { status: 503, retry_after_secs: None };
    match scenario {
        Scenario::PrimaryDown => vec![fault(base, model, 1.0, unavailable)],
        Scenario::PrimaryFlaky => vec![fault(base, model, 0.5, unavailable)],
        Scenario::StreamStall => vec![fault(base, model, 1.0, FaultKind::StallAfter { chunks: 3 })],
        Scenario::StreamCut => {
            let chunks = plan.cut_after.unwrap_or(2);
            vec![fault(base, model, 1.0, FaultKind::DropAfter { chunks })]
        }
        Scenario::AllDown => plan
            .chain
            .iter()
            .enumerate()
            .map(|(i, m)| fault(format!("{base}-{}", i + 1), m, 1.0, unavailable.clone()))
            .collect(),
    }
}

async fn inject(admin: &mut Admin, fault: &Fault, ttl: Duration) -> Result<i64, CliError> {
    let request = admin.request(pb::InjectFaultRequest {
        fault_json: serde_json::to_string(fault)?,
        ttl_ms: u64::try_from(ttl.as_millis()).unwrap_or(u64::MAX),
    });
    let reply = admin.client.inject_fault(request).await.map_err(|s| admin.status(s))?;
    Ok(reply.into_inner().version)
}

/// Clears the drill's faults; the store version of the last clearing, `None` when one
/// could not be cleared (it then ends with its TTL; said on stderr).
async fn clear(admin: &mut Admin, names: &[String]) -> Option<i64> {
    let mut version = Some(0);
    for name in names {
        let request = admin.request(pb::ClearFaultsRequest { name: name.clone(), all: false });
        match admin.client.clear_faults(request).await {
            Ok(reply) => version = version.map(|v| v.max(reply.into_inner().version)),
            // Gone already (its TTL ended, or its inject never landed): nothing to clear.
            Err(status) if status.code() == tonic::Code::NotFound => {}
            Err(status) => {
                eprintln!(
                    "warning: could not clear fault {name} ({}); it ends with its TTL, or run \
                     `switchyard chaos clear {name}`",
                    status.message()
                );
                version = None;
            }
        }
    }
    version
}

async fn wait_applied(node: &Node, version: i64) -> Result<(), DrillError> {
    let started = Instant::now();
    let mut at = 0;
    while started.elapsed() < APPLY_WAIT {
        at = node.config_version().await?;
        if at >= version {
            return Ok(());
        }
        tokio::time::sleep(Duration::from_millis(20)).await;
    }
    Err(DrillError::NotApplied {
        url: node.url().to_owned(),
        waited: APPLY_WAIT,
        at,
        wanted: version,
    })
}

type Outcome = (Vec<Observation>, Vec<Observation>, Duration);

/// Waits for the fault to be in force on the node, then sends the drill's requests.
async fn run(
    scenario: Scenario,
    node: &Node,
    args: &DrillArgs,
    plan: &Plan,
    requests: u32,
    give_up: Duration,
    version: i64,
) -> Result<Outcome, CliError> {
    wait_applied(node, version).await?;
    let ask = Ask {
        model: args.model.clone(),
        fallback_models: args.fallback_models.clone(),
        models: None,
        stream: matches!(scenario, Scenario::StreamStall | Scenario::StreamCut),
    };
    let content = drill_content(scenario);
    let epoch = Instant::now();
    let next = Arc::new(AtomicU32::new(0));
    let mut workers = tokio::task::JoinSet::new();
    for _ in 0..args.concurrency().min(requests) {
        let (node, ask, content, next) = (node.clone(), ask.clone(), content.clone(), next.clone());
        workers.spawn(async move {
            let mut mine = Vec::new();
            while next.fetch_add(1, Ordering::Relaxed) < requests {
                mine.push(node.send(&ask, &content, epoch, give_up).await);
            }
            mine
        });
    }
    let mut observations = Vec::with_capacity(requests as usize);
    while let Some(done) = workers.join_next().await {
        observations.extend(
            done.map_err(|e| CliError::BadResponse(format!("a drill worker failed: {e}")))?,
        );
    }
    let took = epoch.elapsed();
    observations.sort_by_key(|o| o.started);

    let mut outside = Vec::new();
    if let Some(model) = &plan.outside {
        let ask = Ask { models: Some(vec![model.clone()]), ..ask };
        for _ in 0..OUTSIDE_REQUESTS {
            outside.push(
                node.send(
                    &ask,
                    "Switchyard drill: a model outside the chain",
                    epoch,
                    PLAIN_GIVE_UP,
                )
                .await,
            );
        }
    }
    Ok((observations, outside, took))
}

struct Judged<'a> {
    observations: &'a [Observation],
    outside: &'a [Observation],
    took: Duration,
    before: &'a BTreeMap<(String, String), u64>,
    after: &'a BTreeMap<(String, String), u64>,
    faults: Vec<String>,
    cleared: bool,
}

fn report(
    scenario: Scenario,
    args: &DrillArgs,
    plan: &Plan,
    catalog: &Catalog,
    j: Judged<'_>,
) -> DrillReport {
    let obs = j.observations;
    let primary = &plan.chain[0];
    let mut transitions = BTreeMap::new();
    for model in &plan.chain {
        if let Some(m) = catalog.model(model) {
            let breaker = breaker_of(m);
            let changed = j
                .after
                .get(&breaker)
                .copied()
                .unwrap_or(0)
                .saturating_sub(j.before.get(&breaker).copied().unwrap_or(0));
            transitions.insert(model.clone(), changed);
        }
    }
    let expectations = match scenario {
        Scenario::PrimaryDown => verdict::primary_down(
            obs,
            &plan.chain,
            plan.window_size,
            args.concurrency() as usize,
            Duration::from_millis(plan.cooldown_ms),
        ),
        Scenario::PrimaryFlaky => verdict::primary_flaky(
            obs,
            transitions.get(primary).copied().unwrap_or(0),
            j.took,
            plan.cooldown_ms,
        ),
        Scenario::StreamStall => verdict::stream_stall(obs, plan.stall_timeout),
        Scenario::AllDown => {
            verdict::all_down(obs, plan.outside.as_deref().map(|m| (m, j.outside)))
        }
        Scenario::StreamCut => {
            let none = Reference::NotJudged("no healthy stream was read".to_owned());
            verdict::stream_cut(obs, plan.reference.as_ref().unwrap_or(&none))
        }
    };
    let latencies: Vec<Duration> = obs.iter().map(Observation::latency).collect();
    let n = obs.len().max(1) as f64;
    let passed = j.cleared && expectations.iter().all(|e| e.holds != Some(false));
    DrillReport {
        scenario,
        surface: args.surface,
        node: args.node.clone(),
        key_id: plan.key_id.clone(),
        chain: plan.chain.clone(),
        faults: j.faults,
        cut_after: plan.cut_after,
        requests: obs.len(),
        concurrency: args.concurrency(),
        took_ms: j.took.as_secs_f64() * 1000.0,
        latency_ms: Latency {
            p50: verdict::percentile_ms(&latencies, 50.0),
            p99: verdict::percentile_ms(&latencies, 99.0),
        },
        primary_calls_per_request: f64::from(obs.iter().map(|o| o.calls_to(primary)).sum::<u32>())
            / n,
        upstream_calls_per_request: f64::from(obs.iter().map(Observation::calls).sum::<u32>()) / n,
        breaker_transitions: transitions,
        expectations,
        faults_cleared: j.cleared,
        passed,
    }
}

/// The breaker a drill watches for model `m`: its own, or for a model with deployments its
/// first deployment's (a drill reads one breaker per model).
fn breaker_of(m: &switchyard_catalog::Model) -> (String, String) {
    match m.deployments.first() {
        Some(d) => (d.provider.clone(), d.upstream_model.clone()),
        None => (m.provider.clone(), m.upstream_model.clone()),
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn stream_cut_cuts_past_the_middle_so_one_continuation_ends_the_answer() {
        // 5 chunks: a cut after 3 leaves 2 and the finish chunk, which the same cut would
        // cut again; after 4, 1 and the finish chunk.
        assert_eq!(cut_after(None, 5).ok(), Some(4));
        assert_eq!(cut_after(None, 4).ok(), Some(3));
        assert_eq!(cut_after(None, 8).ok(), Some(5));
        assert!(cut_after(None, 3).is_err());
        assert_eq!(cut_after(Some(1), 5).ok(), Some(1));
        let refused = cut_after(Some(5), 5).err().map(|e| e.to_string()).unwrap_or_default();
        assert!(refused.starts_with("--cut-after 5: the healthy answer has 5"), "{refused}");
    }
}
