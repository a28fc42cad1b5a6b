//! The node's prober (docs/catalog.md, "`probe`"): for every model, one minimal call every
//! `open_interval_ms` (jittered) while its breaker is open, so that no user request is the
//! test subject and a recovered model is back in use within one interval; for a model with
//! a `probe`, also one when it saw no real call from this node for `interval_ms`.
//!
//! A probe goes through the same provider adapter as a request (credentials, injected
//! faults, the model's translation), bounded by `timeout_ms`, and its outcome is classified
//! by `failure::classify` and settles a breaker permit like any call. Its answer, usage
//! included, is dropped: a probe belongs to no key and is never billed. The request path
//! pays nothing for any of this: the idle clock is kept by the breaker under the lock a
//! request takes anyway.
//!
//! With a fleet view (docs/operating.md, "The fleet's breaker view") the prober also lays
//! it over the node's breakers as it arrives, and probes a deployment open for the fleet
//! only when the control plane named this node its prober; with none (cut off, or
//! `breaker_policy.fleet: false`) it probes its own open breakers as before.

use std::collections::HashSet;
use std::sync::Arc;
use std::time::{Duration, Instant};

use tokio::sync::watch;
use tokio::task::JoinSet;
use tracing::debug;

use switchyard_catalog::Model;

use crate::app::App;
use crate::breaker::{Breaker, Due, FleetView, Outcome, Permit, ProbeOutcome};
use crate::chaos::{self, Injector};
use crate::config::NodeConfig;
use crate::failure::{self, Failure, Verdict};
use crate::metrics::{BreakerLabels, InjectedLabels, ProbeLabels};
use crate::providers::{CallError, Completion};
use crate::request::ChatRequest;

/// How often the prober looks for due probes. A probe starts at most this late: small next
/// to a breaker's cool-down (30 s by default) and to a probe interval (at least 1 s).
const TICK: Duration = Duration::from_millis(250);

/// The probe's request: one user message, at most one output token. `max_tokens` is the
/// field every adapter maps (Anthropic's and Gemini's translations included).
const PROBE_BODY: &[u8] = br#"{"messages":[{"role":"user","content":"ping"}],"max_tokens":1}"#;
/// An embedding model's probe: one short input.
const EMBEDDINGS_PROBE_BODY: &[u8] = br#"{"input":"ping"}"#;

/// Now on tokio's clock: the time itself in production, a test's paused clock under
/// `start_paused`, so that the prober's waits (ticks, intervals, cool-downs) are tested
/// without waiting.
fn now() -> Instant {
    tokio::time::Instant::now().into_std()
}

/// One breaker the prober watches, with the probe of the model that names it.
#[derive(Clone)]
pub struct Target {
    pub model: Arc<Model>,
    pub breaker: Arc<Breaker>,
    /// Probed when idle this long (the model's `probe`); `None`: only while open.
    pub idle: Option<Duration>,
    pub timeout: Duration,
}

/// Runs until the node drains; in-flight probes are dropped with it (their permits free
/// their half-open slots). `fleet` is the control plane's fleet view (`None` while the node
/// has none), laid over the breakers as it changes.
pub async fn run(app: Arc<App>, mut fleet: watch::Receiver<Option<FleetView>>) {
    let mut tick = tokio::time::interval(TICK);
    tick.set_missed_tick_behavior(tokio::time::MissedTickBehavior::Delay);
    let mut version = None;
    let mut targets = Vec::new();
    let mut in_flight = JoinSet::new();
    let mut fleet_open = true;
    loop {
        let fleet_changed = async {
            match fleet_open {
                true => fleet.changed().await.is_ok(),
                false => std::future::pending().await,
            }
        };
        tokio::select! {
            _ = tick.tick() => {}
            // A new config: its breakers are marked now, before requests meet them.
            () = app.state.published() => {}
            // The fleet's word reaches the breakers at once: the bound on calls to a dead
            // deployment counts from here.
            changed = fleet_changed => {
                fleet_open = changed;
                let view = fleet.borrow_and_update().clone();
                for t in app.services.breakers.apply_fleet(view.as_ref(), now()) {
                    app.services.report_transition(Some(t));
                }
            }
        }
        while in_flight.try_join_next().is_some() {}
        if app.state.is_draining() {
            return;
        }
        let Some(config) = app.state.current() else { continue };
        if version != Some(config.version) {
            targets = plan(&app, &config, now());
            version = Some(config.version);
        }
        let now = now();
        for target in &targets {
            // Named the fleet's prober: its own breaker opens, and is probed from here on.
            app.services.report_transition(target.breaker.mirror_fleet(now));
            let Some((permit, due, transition)) = target.breaker.acquire_probe(now, target.idle)
            else {
                continue;
            };
            app.services.report_transition(transition);
            let (app, config, target) = (Arc::clone(&app), Arc::clone(&config), target.clone());
            in_flight.spawn(async move { probe(&app, &config, &target, permit, due).await });
        }
    }
}

/// The breakers to probe under `config`, each marked probed; every other breaker is
/// unmarked, so a model whose probing was turned off (`open_interval_ms: 0` and no idle
/// `probe`) gets its half-open tests from user requests again. Models sharing a breaker (the
/// same provider and upstream model) are one target: the first of them in the catalog
/// decides its intervals and timeout.
pub fn plan(app: &App, config: &NodeConfig, now: Instant) -> Vec<Target> {
    let mut seen = HashSet::new();
    let mut targets = Vec::new();
    for model in &config.catalog.models {
        let idle = config.catalog.probe_for(model).filter(|p| p.interval_ms > 0);
        let open = config.catalog.open_probe_for(model);
        let timeout = match (idle, open) {
            (None, None) => continue,
            (Some(policy), _) => policy.timeout_ms,
            (None, Some((_, timeout))) => timeout,
        };
        // A model with deployments is probed at each of them.
        let deployments = match config.pools.get(&model.name) {
            Some(pool) => pool.members.iter().map(|m| &m.model).collect(),
            None => config.models.get(&model.name).into_iter().collect::<Vec<_>>(),
        };
        for model in deployments {
            if !seen.insert((model.provider.clone(), model.upstream_model.clone())) {
                continue;
            }
            let breaker = app.services.breaker(config, model);
            let open = open.map(|(interval, _)| Duration::from_millis(interval));
            breaker.set_probed(true, open, now);
            targets.push(Target {
                model: Arc::clone(model),
                breaker,
                idle: idle.map(|p| Duration::from_millis(p.interval_ms)),
                timeout: Duration::from_millis(timeout),
            });
        }
    }
    for breaker in app.services.breakers.all() {
        let key = (breaker.provider().to_owned(), breaker.upstream_model().to_owned());
        if !seen.contains(&key) {
            breaker.set_probed(false, None, now);
        }
    }
    targets
}

/// One probe: the call, its outcome into the breaker, the metrics, and the breaker's new
/// state with its last probe for the control plane.
pub async fn probe(app: &App, config: &NodeConfig, target: &Target, permit: Permit, due: Due) {
    let model = &target.model;
    let started = now();
    let faults = chaos::matching_probe(&config.faults, &model.name, &model.provider);
    let mut injector = Injector::new(&faults);
    let outcome = match call(config, model, target.timeout, &mut injector).await {
        // The answer and its usage go nowhere: a probe is billed to no key.
        Ok(_completion) => Some(Outcome::Success),
        Err(failure) => {
            debug!(model = %model.name, ?failure, "probe failed");
            match failure::classify(failure) {
                Verdict::Failover { breaker, .. } | Verdict::Stop { breaker, .. } => breaker,
            }
        }
    };
    let ended = now();
    let transition = permit.record_probe(outcome, started, ended);
    let metrics = &app.services.metrics;
    let outcome = ProbeOutcome::of(outcome);
    let (provider, upstream_model) = (&model.provider, &model.upstream_model);
    metrics
        .probes
        .get_or_create(&ProbeLabels {
            provider: provider.clone(),
            upstream_model: upstream_model.clone(),
            outcome: outcome.as_str(),
        })
        .inc();
    metrics
        .probe_duration
        .get_or_create(&BreakerLabels {
            provider: provider.clone(),
            upstream_model: upstream_model.clone(),
        })
        .observe(ended.duration_since(started).as_secs_f64());
    for fault in injector.injected() {
        let labels = InjectedLabels {
            fault: fault.name.clone(),
            model: model.name.clone(),
            kind: fault.kind.flag(),
        };
        metrics.injected_faults.get_or_create(&labels).inc();
    }
    debug!(
        model = %model.name, due = ?due, outcome = outcome.as_str(),
        latency_ms = ended.duration_since(started).as_millis() as u64, "probed"
    );
    // A transition carries the last probe with it; otherwise the probe is reported alone.
    match transition {
        Some(t) => app.services.report_transition(Some(t)),
        None => app.services.report_probed(target.breaker.snapshot()),
    }
}

/// The probe's call: a plain (not streamed) completion through the model's adapter.
async fn call(
    config: &NodeConfig,
    model: &Model,
    timeout: Duration,
    injector: &mut Injector<'_>,
) -> Result<Completion, Failure> {
    let Some(provider) = config.providers.get(&model.provider) else {
        return Err(Failure::Unconfigured(model.provider.clone()));
    };
    // An embedding model is probed with an embeddings call: a chat call would fail however
    // healthy the model is.
    let embedding = model.model_type == switchyard_catalog::ModelType::Embedding;
    let probe_body = if embedding { EMBEDDINGS_PROBE_BODY } else { PROBE_BODY };
    let parsed = if embedding {
        ChatRequest::embeddings(probe_body)
    } else {
        ChatRequest::parse(probe_body)
    };
    let request = parsed.map_err(|e| {
        Failure::Call(CallError::Unsupported { message: format!("{e:?}"), param: None })
    })?;
    let body = provider.body(model, &request).map_err(Failure::Call)?;
    let called = match &request.embeddings {
        Some(embeddings) => {
            let call = provider.embed(model, body, embeddings, None, injector);
            tokio::time::timeout(timeout, call).await
        }
        None => {
            tokio::time::timeout(timeout, provider.complete(model, body, None, None, injector))
                .await
        }
    };
    match called {
        Err(_elapsed) => Err(Failure::Call(CallError::Timeout(timeout))),
        Ok(result) => result.map_err(Failure::Call),
    }
}

#[cfg(test)]
mod tests {
    use std::sync::Mutex;
    use std::sync::atomic::{AtomicU16, Ordering};

    use prometheus_client::metrics::counter::Counter;
    use serde_json::{Value, json};

    use switchyard_catalog::FailoverReason;
    use switchyard_proto::node::v1::node_message::Msg;

    use super::*;
    use crate::breaker::Breakers;
    use crate::breaker::State;
    use crate::chain::{Chain, Entry};
    use crate::config::Change;
    use crate::metrics::Metrics;
    use crate::report::{AttemptReason, AttemptStatus};
    use crate::services::Services;
    use crate::state::NodeState;
    use crate::telemetry::Telemetry;

    /// An OpenAI-style upstream on loopback that keeps every body it receives and answers
    /// `status` (200 with a completion and its usage, else a server error).
    struct Upstream {
        url: String,
        bodies: Arc<Mutex<Vec<Value>>>,
        status: Arc<AtomicU16>,
    }

    impl Upstream {
        fn requests(&self) -> usize {
            self.bodies.lock().unwrap().len()
        }
    }

    async fn upstream() -> Upstream {
        use axum::routing::post;
        let bodies = Arc::new(Mutex::new(Vec::new()));
        let status = Arc::new(AtomicU16::new(200));
        let (kept, answer) = (Arc::clone(&bodies), Arc::clone(&status));
        let app = axum::Router::new().route(
            "/v1/chat/completions",
            post(move |body: String| {
                let (kept, answer) = (Arc::clone(&kept), Arc::clone(&answer));
                async move {
                    kept.lock().unwrap().push(serde_json::from_str::<Value>(&body).unwrap());
                    let status = http::StatusCode::from_u16(answer.load(Ordering::SeqCst)).unwrap();
                    let body = if status.is_success() {
                        json!({"id": "c1", "object": "chat.completion", "created": 1, "model": "up",
                            "choices": [{"index": 0, "message": {"role": "assistant", "content": "p"}, "finish_reason": "length"}],
                            "usage": {"prompt_tokens": 5, "completion_tokens": 1, "total_tokens": 6}})
                    } else {
                        json!({"error": {"message": "overloaded", "type": "server_error", "param": null, "code": null}})
                    };
                    (status, [(http::header::CONTENT_TYPE, "application/json")], body.to_string())
                }
            }),
        );
        let embedded = Arc::clone(&bodies);
        let app = app.route(
            "/v1/embeddings",
            post(move |body: String| {
                let kept = Arc::clone(&embedded);
                async move {
                    kept.lock().unwrap().push(serde_json::from_str::<Value>(&body).unwrap());
                    let body = json!({"object": "list", "model": "up",
                        "data": [{"object": "embedding", "index": 0, "embedding": [0.6, 0.8]}],
                        "usage": {"prompt_tokens": 1, "total_tokens": 1}});
                    ([(http::header::CONTENT_TYPE, "application/json")], body.to_string())
                }
            }),
        );
        let listener = tokio::net::TcpListener::bind("127.0.0.1:0").await.unwrap();
        let addr = listener.local_addr().unwrap();
        tokio::spawn(async move { axum::serve(listener, app).await });
        Upstream { url: format!("http://{addr}/v1"), bodies, status }
    }

    /// A node's shared state with one model `m` at `url`, probed every second when `probe`.
    fn app(url: &str, probe: bool) -> App {
        app_with(url, probe.then(|| json!({"interval_ms": 1000, "timeout_ms": 500})))
    }

    /// A node's shared state with one model `m` at `url` and the catalog's `probe`.
    fn app_with(url: &str, probe: Option<Value>) -> App {
        let mut catalog = json!({
            "providers": [{"name": "p", "kind": "openai-compatible", "base_url": url}],
            "models": [{"name": "m", "provider": "p", "upstream_model": "up"}],
            "breaker_policy": {"window_size": 2, "min_requests": 2, "cooldown_ms": 100,
                               "max_cooldown_ms": 1000}
        });
        if let Some(probe) = probe {
            catalog["probe"] = probe;
        }
        app_of(&catalog)
    }

    /// A node's shared state with this catalog.
    fn app_of(catalog: &Value) -> App {
        let change = Change::Snapshot {
            version: 1,
            resources: vec![("catalog".into(), serde_json::to_vec(&catalog).unwrap())],
        };
        let config = NodeConfig::default().apply(change).unwrap();
        let telemetry = Arc::new(Telemetry::new("n".into(), Counter::default()));
        let services = Services::new(telemetry, Arc::new(Metrics::new()), Breakers::new());
        App::new(NodeState::new(Some(config)), services, 1 << 20)
    }

    fn probes(app: &App, outcome: &'static str) -> u64 {
        let labels = ProbeLabels { provider: "p".into(), upstream_model: "up".into(), outcome };
        app.services.metrics.probes.get_or_create(&labels).get()
    }

    /// A user request for `m` alone, as the executor runs it: its attempts.
    async fn user_request(app: &App) -> Vec<(AttemptStatus, Option<AttemptReason>, bool)> {
        let config = app.state.current().unwrap();
        let chain = Chain {
            entries: vec![Entry {
                model: Arc::clone(&config.models["m"]),
                timeout: Duration::from_secs(5),
                first_token_timeout: Duration::from_secs(5),
                body: None,
                faults: Vec::new(),
                deployments: None,
            }],
            on: FailoverReason::ALL.to_vec(),
            deadline: None,
            degraded: None,
            output: None,
            continue_streams: true,
            session: None,
        };
        let body = br#"{"model":"m","messages":[{"role":"user","content":"hi"}]}"#;
        let request = ChatRequest::parse(body).unwrap();
        let attempts =
            match app.executor.run(&chain, &request, &config, &crate::request_id::generate()).await
            {
                Ok(served) => served.attempts,
                Err(failed) => failed.attempts,
            };
        attempts.into_iter().map(|a| (a.status, a.reason, a.probe)).collect()
    }

    /// Opens `m`'s breaker with two failed user requests.
    async fn open(app: &App, up: &Upstream) {
        up.status.store(503, Ordering::SeqCst);
        for _ in 0..2 {
            user_request(app).await;
        }
        let config = app.state.current().unwrap();
        assert_eq!(
            app.services.breaker(&config, &config.models["m"]).snapshot().state,
            State::Open
        );
    }

    #[tokio::test]
    async fn an_embedding_model_is_probed_with_an_embeddings_call() {
        let up = upstream().await;
        let catalog = json!({
            "providers": [{"name": "p", "kind": "openai-compatible", "base_url": up.url}],
            "models": [{"name": "m", "provider": "p", "upstream_model": "up",
                        "type": "embedding", "dimensions": 2}],
            "probe": {"interval_ms": 1000, "timeout_ms": 500}
        });
        let app = app_of(&catalog);
        let config = app.state.current().unwrap();
        let targets = plan(&app, &config, Instant::now());
        let target = &targets[0];
        let later = Instant::now() + Duration::from_secs(2);
        let (permit, due, _) = target.breaker.acquire_probe(later, target.idle).unwrap();
        probe(&app, &config, target, permit, due).await;
        assert_eq!(*up.bodies.lock().unwrap(), [json!({"model": "up", "input": "ping"})]);
        assert_eq!(probes(&app, "success"), 1);
    }

    #[tokio::test]
    async fn an_idle_model_is_probed_with_one_token_and_billed_to_no_key() {
        let up = upstream().await;
        let app = app(&up.url, true);
        let config = app.state.current().unwrap();
        let targets = plan(&app, &config, Instant::now());
        // Probing began (the breaker was created) no later than this.
        let t0 = Instant::now();
        assert_eq!(targets.len(), 1);
        let target = &targets[0];
        let interval = target.idle.expect("probed when idle");
        assert_eq!(interval, Duration::from_millis(1_000));
        assert!(target.breaker.acquire_probe(t0 + interval / 2, target.idle).is_none());
        let (permit, due, _) = target.breaker.acquire_probe(t0 + interval, target.idle).unwrap();
        assert_eq!(due, Due::Idle);
        probe(&app, &config, target, permit, due).await;

        let bodies = up.bodies.lock().unwrap().clone();
        assert_eq!(bodies.len(), 1);
        assert_eq!(bodies[0]["max_tokens"], 1);
        assert_eq!(bodies[0]["model"], "up");
        assert_eq!(bodies[0]["messages"], json!([{"role": "user", "content": "ping"}]));
        assert_eq!(probes(&app, "success"), 1);
        assert!(app.services.telemetry.usage_report(0).is_none(), "no usage for a probe");
        // The control plane hears of it: the breaker, closed, with its last probe.
        let reports = app.services.telemetry.take_breaker_reports();
        match reports.as_slice() {
            [Msg::Probed(r)] => {
                assert_eq!((r.from.as_str(), r.to.as_str()), ("closed", "closed"));
                assert_eq!(r.last_probe_outcome, "success");
                assert!(r.last_probe_unix_ms > 0);
            }
            other => panic!("{other:?}"),
        }
    }

    #[tokio::test]
    async fn an_open_breaker_is_probed_within_one_open_interval_and_a_probe_in_flight_is_its_only_test()
     {
        let up = upstream().await;
        // No `probe` block: open probing is on by default, idle probing off.
        let app = app(&up.url, false);
        let config = app.state.current().unwrap();
        let target = plan(&app, &config, Instant::now()).remove(0);
        assert_eq!(target.idle, None);
        open(&app, &up).await;
        assert_eq!(up.requests(), 2);
        // The breaker's own cool-down is 100 ms; open probing replaces it with the interval
        // (5 s by default, jittered down by up to a fifth).
        let next = target.breaker.snapshot().next_probe.unwrap();
        let wait = next.duration_since(std::time::SystemTime::now()).unwrap_or_default();
        assert!(wait <= Duration::from_secs(5) && wait > Duration::from_secs(3), "{wait:?}");
        let due_at = Instant::now() + Duration::from_secs(5);
        assert!(target.breaker.acquire_probe(Instant::now(), None).is_none(), "not due yet");

        // Due: the probe takes the half-open slot. While it is in flight a user request is
        // skipped and never reaches the upstream: nothing is forced beside a probe.
        let (permit, due, t) = target.breaker.acquire_probe(due_at, None).unwrap();
        assert_eq!((due, t.map(|t| t.to)), (Due::HalfOpen, Some(State::HalfOpen)));
        assert_eq!(
            user_request(&app).await,
            [(AttemptStatus::Skipped, Some(AttemptReason::CircuitOpen), false)]
        );
        assert_eq!(up.requests(), 2);
        // The probe fails: open again, the next probe one interval on (not doubled).
        probe(&app, &config, &target, permit, due).await;
        assert_eq!(up.requests(), 3);
        let s = target.breaker.snapshot();
        assert_eq!(s.state, State::Open);
        assert!(s.cooldown <= Duration::from_secs(5), "{:?}", s.cooldown);
        assert_eq!(probes(&app, "failure"), 1);

        // It succeeds: closed, and the next user request is served.
        up.status.store(200, Ordering::SeqCst);
        let (permit, due, _) =
            target.breaker.acquire_probe(Instant::now() + Duration::from_secs(5), None).unwrap();
        probe(&app, &config, &target, permit, due).await;
        assert_eq!(target.breaker.snapshot().state, State::Closed);
        assert_eq!(probes(&app, "success"), 1);
        assert_eq!(user_request(&app).await, [(AttemptStatus::Served, None, false)]);
        // Every breaker report went out, the transitions carrying the probe that made them.
        let reports = app.services.telemetry.take_breaker_reports();
        let last = reports.iter().rev().find_map(|m| match m {
            Msg::Breaker(t) if t.to == "closed" => Some(t),
            _ => None,
        });
        assert_eq!(last.map(|t| t.last_probe_outcome.as_str()), Some("success"));
    }

    #[tokio::test]
    async fn with_probing_off_every_breaker_open_forces_a_user_request_through() {
        let up = upstream().await;
        let app = app_with(&up.url, Some(json!({"interval_ms": 0, "open_interval_ms": 0})));
        let config = app.state.current().unwrap();
        assert!(plan(&app, &config, Instant::now()).is_empty(), "nothing to probe");
        open(&app, &up).await;
        up.status.store(200, Ordering::SeqCst);
        // Every entry open, none probed: the request is not failed on breaker state alone;
        // it is the probe, and its success closes the breaker.
        assert_eq!(user_request(&app).await, [(AttemptStatus::Served, None, true)]);
        assert_eq!(up.requests(), 3);
        let breaker = app.services.breaker(&config, &config.models["m"]);
        assert_eq!(breaker.snapshot().state, State::Closed);
    }

    #[tokio::test]
    async fn with_open_probing_a_lone_open_model_fails_at_once_and_is_never_forced() {
        let up = upstream().await;
        let app = app(&up.url, false);
        let config = app.state.current().unwrap();
        plan(&app, &config, Instant::now());
        open(&app, &up).await;
        up.status.store(200, Ordering::SeqCst);
        assert_eq!(
            user_request(&app).await,
            [(AttemptStatus::Skipped, Some(AttemptReason::CircuitOpen), false)]
        );
        assert_eq!(up.requests(), 2, "the prober, not a request, tests it");
    }

    #[tokio::test(start_paused = true)]
    async fn the_prober_probes_on_its_own_and_stops_when_the_node_drains() {
        let up = upstream().await;
        let app = Arc::new(app(&up.url, true));
        let (_fleet, view) = watch::channel(None);
        let prober = tokio::spawn(run(Arc::clone(&app), view));
        // Interval 1 s from the first plan: the first probe within a few ticks after it.
        tokio::time::timeout(Duration::from_secs(5), async {
            while probes(&app, "success") == 0 {
                tokio::time::sleep(Duration::from_millis(20)).await;
            }
        })
        .await
        .expect("an idle probe");
        app.state.start_draining();
        tokio::time::timeout(TICK * 4, prober).await.expect("stops at the drain").unwrap();
        assert_eq!(up.requests(), 1, "one probe in the interval, none after the drain");
    }

    /// Polls `done` every 20 ms for up to 5 s (of the test's clock).
    async fn until(what: &str, mut done: impl FnMut() -> bool) {
        tokio::time::timeout(Duration::from_secs(5), async {
            while !done() {
                tokio::time::sleep(Duration::from_millis(20)).await;
            }
        })
        .await
        .unwrap_or_else(|_| panic!("{what}"));
    }

    #[tokio::test(start_paused = true)]
    async fn the_prober_probes_only_what_the_fleet_names_it_for_and_closes_on_the_fleets_word() {
        use crate::breaker::{FleetOpen, FleetView};
        let up = upstream().await;
        let probe = json!({"interval_ms": 3_600_000, "timeout_ms": 500, "open_interval_ms": 1_000});
        let app = Arc::new(app_with(&up.url, Some(probe)));
        let (fleet, view) = watch::channel(None);
        let prober = tokio::spawn(run(Arc::clone(&app), view));
        let config = app.state.current().unwrap();
        let breaker = app.services.breaker(&config, &config.models["m"]);
        let key = ("p".to_owned(), "up".to_owned());
        let word = |probing: bool| FleetOpen {
            since: std::time::SystemTime::now(),
            opened_by: "n2".into(),
            prober: if probing { "n1".into() } else { "n2".into() },
            probing,
            until: Instant::now() + Duration::from_secs(60),
        };
        let open_for_fleet = |probing: bool| FleetView {
            open: [(key.clone(), word(probing))].into(),
            closed: vec![],
        };

        // Open here too, but another node is the fleet's prober: no probe from this node over
        // two of its open intervals (a wait, on the paused clock: what is shown is that
        // nothing happens). The user requests opened the breaker on the real clock, which
        // the paused one passes by those two intervals.
        open(&app, &up).await;
        fleet.send_replace(Some(open_for_fleet(false)));
        tokio::time::sleep(Duration::from_millis(2_200)).await;
        assert_eq!(up.requests(), 2, "the two failures, no probe");

        // The prober elsewhere closed it: closed here without a test of its own.
        let closed = FleetView {
            open: Default::default(),
            closed: vec![(key.0.clone(), key.1.clone(), std::time::SystemTime::now())],
        };
        fleet.send_replace(Some(closed));
        until("closed on the fleet's word", || breaker.snapshot().state == State::Closed).await;
        assert_eq!(breaker.snapshot().cause.map(|c| c.as_str()), Some("fleet_closed"));
        assert_eq!(up.requests(), 2);

        // Named the prober of a deployment open for the fleet: its own breaker opens and it
        // probes within one open interval; the upstream is back, so the probe closes it.
        up.status.store(200, Ordering::SeqCst);
        fleet.send_replace(Some(open_for_fleet(true)));
        until("a probe from the fleet's prober", || up.requests() == 3).await;
        until("closed by its probe", || breaker.snapshot().state == State::Closed).await;
        assert_eq!(breaker.snapshot().cause.map(|c| c.as_str()), Some("probe_succeeded"));
        // The view still names it until the control plane hears of the closing: the prober
        // does not open its breaker again meanwhile (a few of its ticks).
        tokio::time::sleep(TICK * 3).await;
        assert_eq!(breaker.snapshot().state, State::Closed);

        // Cut off from the control plane: it probes its own open breaker again.
        open(&app, &up).await;
        fleet.send_replace(Some(open_for_fleet(false)));
        let failed = up.requests();
        fleet.send_replace(None);
        until("its own probe once cut off", || up.requests() > failed).await;
        prober.abort();
    }

    #[test]
    fn the_probe_body_is_one_user_message_and_one_token() {
        let request = ChatRequest::parse(PROBE_BODY).unwrap();
        assert!(!request.stream);
        let body: Value = serde_json::from_slice(PROBE_BODY).unwrap();
        assert_eq!(body["max_tokens"], 1);
        assert_eq!(body["messages"].as_array().unwrap().len(), 1);
        assert_eq!(body["messages"][0]["role"], "user");
    }
}
