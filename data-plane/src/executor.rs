//! The failover executor: tries a chain's entries in order, each attempt under its own
//! timeout and inside the chain's optional deadline, skipping entries whose breaker is
//! open, and reports what every attempt did.

use std::sync::Arc;
use std::time::{Duration, Instant};

use http::StatusCode;
use tracing::{Instrument, debug, debug_span};

use switchyard_catalog::{BreakerPolicy, FailoverReason, Model};
use switchyard_proto::node::v1 as pb;

use crate::breaker::{Admission, Breakers, Outcome, Permit, Transition};
use crate::chain::{Chain, Entry};
use crate::chaos::Injector;
use crate::config::NodeConfig;
use crate::error::ApiError;
use crate::failure::{self, Code, Failure, Verdict};
use crate::metrics::{BreakerLabels, InjectedLabels, Metrics, TransitionLabels};
use crate::providers::{
    CallError, Completion, ProviderRuntime, StreamError, StreamEvent, UpstreamError, UpstreamStream,
};
use crate::report::{AttemptReason, AttemptReport, AttemptStatus, all_failed_message};
use crate::request::ChatRequest;
use crate::telemetry::Telemetry;

/// DESIGN §1: an attempt is not started with less than `min(1000 ms, its timeout)` left.
const FAIR_MINIMUM: Duration = Duration::from_millis(1000);

pub struct Served {
    pub output: Output,
    pub model: Arc<Model>,
    pub attempts: Vec<AttemptReport>,
}

pub enum Output {
    Completion(Completion),
    Stream(CommittedStream),
}

/// A stream whose first content arrived in time: its model is locked (DESIGN §1
/// "Streaming"). The breaker permit travels with it, to be settled when the stream ends.
pub struct CommittedStream {
    /// What the upstream sent up to and including the first content chunk.
    pub buffered: Vec<StreamEvent>,
    pub upstream: UpstreamStream,
    pub permit: Permit,
    /// `timeout_ms` bounds the whole attempt, the stream's body included.
    pub deadline: Instant,
    /// The attempt's time (its `timeout_ms`, cut to the chain's deadline).
    pub timeout: Duration,
    /// The model's `stall_timeout_ms`: the longest gap allowed between two chunks.
    pub stall: Duration,
}

pub struct Failed {
    pub error: ApiError,
    pub attempts: Vec<AttemptReport>,
}

/// What is shared by every request of a node.
pub struct Executor {
    pub breakers: Breakers,
    pub telemetry: Arc<Telemetry>,
    pub metrics: Arc<Metrics>,
}

enum AttemptResult {
    Served(Output),
    Failover(FailoverReason, Code),
    ClientError(StatusCode, UpstreamError),
}

impl Executor {
    pub async fn run(
        &self,
        chain: &Chain,
        request: &ChatRequest<'_>,
        config: &NodeConfig,
    ) -> Result<Served, Failed> {
        let started = Instant::now();
        let mut attempts: Vec<AttemptReport> = Vec::with_capacity(chain.entries.len());
        // Entries skipped on an open breaker, with when each is due for a probe.
        let mut skipped: Vec<(usize, Instant)> = Vec::new();
        let mut tried = false;
        let mut last_failure: Option<(FailoverReason, Code)> = None;

        for (i, entry) in chain.entries.iter().enumerate() {
            let Some(timeout) = budget(chain, entry, started) else { break };
            let breaker = self.breaker(config, &entry.model);
            let (admission, transition) = breaker.try_acquire(Instant::now());
            self.report_transition(transition);
            let permit = match admission {
                Admission::Admitted(permit) => permit,
                Admission::Rejected { ready_at } => {
                    skipped.push((i, ready_at));
                    self.metrics.model(&entry.model.name).attempt("skipped", "circuit_open").inc();
                    attempts.push(AttemptReport {
                        model: entry.model.name.clone(),
                        status: AttemptStatus::Skipped,
                        reason: Some(AttemptReason::CircuitOpen),
                        latency_ms: 0,
                        probe: false,
                        injected: None,
                    });
                    continue;
                }
            };
            tried = true;
            match self.attempt(entry, timeout, permit, request, config, &mut attempts).await {
                AttemptResult::Served(output) => {
                    return Ok(Served { output, model: Arc::clone(&entry.model), attempts });
                }
                AttemptResult::ClientError(status, error) => {
                    return Err(client_error(chain, status, error, attempts));
                }
                AttemptResult::Failover(reason, code) => {
                    last_failure = Some((reason, code));
                    if !chain.fails_over_on(reason) {
                        break;
                    }
                }
            }
        }

        // Every entry's breaker was open: do not fail on breaker state alone, probe the one
        // due soonest (DESIGN §1), so a fleet never turns a partial outage into a total one.
        if !tried && let Some(&(i, _)) = skipped.iter().min_by_key(|(_, ready_at)| *ready_at) {
            let entry = &chain.entries[i];
            if let Some(timeout) = budget(chain, entry, started) {
                let breaker = self.breaker(config, &entry.model);
                let (permit, transition) = breaker.force_probe(Instant::now());
                self.report_transition(transition);
                let mut probe_report = Vec::with_capacity(1);
                let result =
                    self.attempt(entry, timeout, permit, request, config, &mut probe_report).await;
                if let Some(mut report) = probe_report.pop() {
                    report.probe = true;
                    attempts[i] = report;
                }
                match result {
                    AttemptResult::Served(output) => {
                        return Ok(Served { output, model: Arc::clone(&entry.model), attempts });
                    }
                    AttemptResult::ClientError(status, error) => {
                        return Err(client_error(chain, status, error, attempts));
                    }
                    AttemptResult::Failover(reason, code) => last_failure = Some((reason, code)),
                }
            }
        }

        Err(all_failed(chain, attempts, last_failure))
    }

    fn breaker(&self, config: &NodeConfig, model: &Model) -> Arc<crate::breaker::Breaker> {
        let policy: BreakerPolicy = match &model.breaker {
            Some(o) => config.catalog.breaker_policy.with_override(o),
            None => config.catalog.breaker_policy,
        };
        self.breakers.get(&model.provider, &model.upstream_model, policy)
    }

    async fn attempt(
        &self,
        entry: &Entry,
        timeout: Duration,
        permit: Permit,
        request: &ChatRequest<'_>,
        config: &NodeConfig,
        attempts: &mut Vec<AttemptReport>,
    ) -> AttemptResult {
        let model = &entry.model;
        let span = debug_span!("attempt", model = %model.name, provider = %model.provider);
        let started = Instant::now();
        let provider = config.providers.get(&model.provider).cloned();
        let deadline = started + timeout;
        let mut injector = Injector::new(&entry.faults);
        let result = match provider {
            None => Err(Failure::Unconfigured(model.provider.clone())),
            Some(provider) => {
                // Translating adapters translated when the chain was formed; the others
                // build their pass-through body for this attempt only.
                let body = match &entry.body {
                    Some(body) => Ok(body.clone()),
                    None => provider.body(model, request),
                };
                match body {
                    Err(e) => Err(Failure::Call(e)),
                    Ok(body) if request.stream => {
                        let first_token = deadline.min(started + entry.first_token_timeout);
                        match open_until_first_token(
                            &provider,
                            model,
                            body,
                            first_token,
                            &mut injector,
                        )
                        .instrument(span)
                        .await
                        {
                            Ok((buffered, upstream)) => {
                                let stall = Duration::from_millis(model.stall_timeout_ms().into());
                                let stream = CommittedStream {
                                    buffered,
                                    upstream,
                                    permit,
                                    deadline,
                                    timeout,
                                    stall,
                                };
                                self.finish_attempt(
                                    model,
                                    started,
                                    AttemptStatus::Served,
                                    None,
                                    &injector,
                                    attempts,
                                );
                                return AttemptResult::Served(Output::Stream(stream));
                            }
                            Err(failure) => Err(failure),
                        }
                    }
                    Ok(body) => {
                        let call = provider.complete(model, body, &mut injector);
                        match tokio::time::timeout(timeout, call).instrument(span).await {
                            Err(_elapsed) => Err(Failure::Call(CallError::Timeout(timeout))),
                            Ok(Ok(completion)) => Ok(completion),
                            Ok(Err(e)) => Err(Failure::Call(e)),
                        }
                    }
                }
            }
        };
        let (outcome, result) = match result {
            Ok(completion) => {
                (Some(Outcome::Success), AttemptResult::Served(Output::Completion(completion)))
            }
            Err(failure) => {
                debug!(model = %model.name, ?failure, "attempt failed");
                match failure::classify(failure) {
                    Verdict::Failover { reason, breaker, code } => {
                        (breaker, AttemptResult::Failover(reason, code))
                    }
                    Verdict::Stop { status, error, breaker } => {
                        (breaker, AttemptResult::ClientError(status, error))
                    }
                }
            }
        };
        // A failure the upstream is not to blame for releases the permit unjudged.
        if let Some(outcome) = outcome {
            self.report_transition(permit.record(outcome, Instant::now()));
        }
        let (status, reason) = match &result {
            AttemptResult::Served(_) => (AttemptStatus::Served, None),
            AttemptResult::Failover(reason, _) => {
                (AttemptStatus::Failed, Some(AttemptReason::Failover(*reason)))
            }
            AttemptResult::ClientError(..) => {
                (AttemptStatus::Failed, Some(AttemptReason::ClientError))
            }
        };
        self.finish_attempt(model, started, status, reason, &injector, attempts);
        result
    }

    /// Reports an attempt: metrics, and its line in the failover report.
    fn finish_attempt(
        &self,
        model: &Model,
        started: Instant,
        status: AttemptStatus,
        reason: Option<AttemptReason>,
        injector: &Injector<'_>,
        attempts: &mut Vec<AttemptReport>,
    ) {
        for fault in injector.injected() {
            let labels = InjectedLabels {
                fault: fault.name.clone(),
                model: model.name.clone(),
                kind: fault.kind.flag(),
            };
            self.metrics.injected_faults.get_or_create(&labels).inc();
        }
        let metrics = self.metrics.model(&model.name);
        metrics.attempt(status.as_str(), reason.map_or("", AttemptReason::as_str)).inc();
        metrics.duration.observe(started.elapsed().as_secs_f64());
        attempts.push(AttemptReport {
            model: model.name.clone(),
            status,
            reason,
            latency_ms: started.elapsed().as_millis() as u64,
            probe: false,
            injected: injector.first().map(|f| f.name.clone()),
        });
    }

    /// Logs a breaker transition, updates its metrics and queues it for the control plane.
    pub fn report_transition(&self, transition: Option<Transition>) {
        let Some(t) = transition else { return };
        let state = match t.to {
            crate::breaker::State::Closed => 0,
            crate::breaker::State::HalfOpen => 1,
            crate::breaker::State::Open => 2,
        };
        self.metrics
            .breaker_state
            .get_or_create(&BreakerLabels {
                provider: t.provider.clone(),
                upstream_model: t.upstream_model.clone(),
            })
            .set(state);
        self.metrics
            .breaker_transitions
            .get_or_create(&TransitionLabels {
                provider: t.provider.clone(),
                upstream_model: t.upstream_model.clone(),
                to: t.to.as_str(),
            })
            .inc();
        tracing::info!(
            provider = %t.provider, model = %t.upstream_model,
            from = t.from.as_str(), to = t.to.as_str(), cause = t.cause.as_str(),
            "circuit breaker changed state"
        );
        self.telemetry.push_transition(pb::BreakerTransition {
            provider: t.provider,
            upstream_model: t.upstream_model,
            from: t.from.as_str().to_owned(),
            to: t.to.as_str().to_owned(),
            cause: t.cause.as_str().to_owned(),
            at_unix_ms: switchyard_time::unix_ms(t.at),
            failure_rate: t.failure_rate,
            calls_in_window: t.calls_in_window,
            next_probe_unix_ms: t.next_probe.map_or(0, switchyard_time::unix_ms),
            cooldown_ms: t.cooldown.as_millis() as u64,
        });
    }
}

/// The time this attempt may take: its timeout, cut to what is left of the chain's
/// deadline; `None` when too little is left to start it.
fn budget(chain: &Chain, entry: &Entry, started: Instant) -> Option<Duration> {
    let Some(deadline) = chain.deadline else { return Some(entry.timeout) };
    let left = deadline.saturating_sub(started.elapsed());
    if left < FAIR_MINIMUM.min(entry.timeout) { None } else { Some(entry.timeout.min(left)) }
}

fn client_error(
    chain: &Chain,
    status: StatusCode,
    error: UpstreamError,
    attempts: Vec<AttemptReport>,
) -> Failed {
    let error = ApiError::Upstream {
        status,
        message: error.message,
        kind: error.kind,
        code: error.code,
        param: error.param,
        attempts: chain.is_multi_model().then(|| attempts.clone()),
    };
    Failed { error, attempts }
}

/// 429 when every failure was a rate limit, else 502 (DESIGN §1 "All attempts failed").
fn all_failed(
    chain: &Chain,
    attempts: Vec<AttemptReport>,
    last_failure: Option<(FailoverReason, Code)>,
) -> Failed {
    let failures: Vec<_> = attempts.iter().filter(|a| a.status == AttemptStatus::Failed).collect();
    let all_rate_limited = !failures.is_empty()
        && failures
            .iter()
            .all(|a| a.reason == Some(AttemptReason::Failover(FailoverReason::RateLimit)));
    let status =
        if all_rate_limited { StatusCode::TOO_MANY_REQUESTS } else { StatusCode::BAD_GATEWAY };
    let explanation = last_failure.and_then(|(_, code)| code.explanation());
    let message = if chain.is_multi_model() {
        let message = all_failed_message(&attempts);
        match (explanation, attempts.last()) {
            (Some(why), Some(last)) => format!("{message}; `{}`: {why}.", last.model),
            _ => message,
        }
    } else {
        let reason = last_failure.map_or("unknown", |(r, _)| r.as_str());
        match explanation {
            Some(why) => {
                format!("The model `{}` failed ({reason}): {why}.", chain.requested_model())
            }
            None => format!("The model `{}` failed ({reason}).", chain.requested_model()),
        }
    };
    let error = ApiError::AllFailed {
        status,
        message,
        attempts: chain.is_multi_model().then(|| attempts.clone()),
    };
    Failed { error, attempts }
}

/// Opens the upstream stream and reads it until its first content (or its end), all before
/// `first_token`: until then the attempt can still fail over and the client has seen nothing.
async fn open_until_first_token(
    provider: &Arc<ProviderRuntime>,
    model: &Model,
    body: bytes::Bytes,
    first_token: Instant,
    injector: &mut Injector<'_>,
) -> Result<(Vec<StreamEvent>, UpstreamStream), Failure> {
    let started = Instant::now();
    let waited = || first_token.saturating_duration_since(started);
    let deadline = tokio::time::Instant::from_std(first_token);
    let timed_out = || Failure::Call(CallError::Timeout(waited()));
    let mut upstream =
        tokio::time::timeout_at(deadline, provider.open_stream(model, body, injector))
            .await
            .map_err(|_| timed_out())?
            .map_err(Failure::Call)?;
    let mut buffered = Vec::new();
    loop {
        match tokio::time::timeout_at(deadline, upstream.next()).await {
            Err(_) => return Err(timed_out()),
            Ok(None) => {
                return Err(Failure::Stream(StreamError::Connection(
                    "the stream ended before any content".into(),
                )));
            }
            Ok(Some(Err(e))) => return Err(Failure::Stream(e)),
            Ok(Some(Ok(StreamEvent::Error(e)))) => return Err(Failure::InBand(e)),
            Ok(Some(Ok(event))) => {
                let commits =
                    matches!(event, StreamEvent::Done | StreamEvent::Chunk { commits: true, .. });
                buffered.push(event);
                if commits {
                    return Ok((buffered, upstream));
                }
            }
        }
    }
}
