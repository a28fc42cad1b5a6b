//! The failover executor: tries a chain's entries in order, each attempt under its own
//! timeout and inside the chain's optional deadline, skipping entries whose breaker is
//! open, and reports what every attempt did.

use std::sync::Arc;
use std::time::{Duration, Instant};

use http::{HeaderValue, StatusCode};
use opentelemetry::context::FutureExt as _;
use tracing::{Instrument, debug, debug_span};

use switchyard_catalog::{FailoverReason, Model};

use crate::breaker::{Admission, Outcome, Permit, State};
use crate::chain::{Chain, Deployments, Entry, Target};
use crate::chaos::Injector;
use crate::config::NodeConfig;
use crate::deployment::{Answered, Cap, Full, Slot};
use crate::error::ApiError;
use crate::failure::{self, Code, Failure, Verdict};
use crate::metrics::{InjectedLabels, ProviderModelLabels, RetryLabels};
use crate::otel;
use crate::providers::{
    CallError, Completion, NativeCall, ProviderRuntime, StreamError, StreamEvent, UpstreamError,
    UpstreamStream,
};
use crate::report::{AttemptReason, AttemptReport, AttemptStatus, all_failed_message};
use crate::request::ChatRequest;
use crate::retry::{self, FailedCall, NoRetry};
use crate::services::Services;
use crate::structured::OutputCheck;

/// An attempt is not started with less than `min(1000 ms, its timeout)` left of the
/// chain's `deadline_ms`: it could not do useful work (docs/http-api.md,
/// "Chain-wide options: `redundancy`").
pub const FAIR_MINIMUM: Duration = Duration::from_millis(1000);

pub struct Served {
    pub output: Output,
    /// The model as the serving deployment serves it (its provider and upstream model).
    pub model: Arc<Model>,
    /// The serving deployment, for a model with `deployments`.
    pub deployment: Option<Arc<str>>,
    pub attempts: Vec<AttemptReport>,
}

pub enum Output {
    Completion(Completion),
    /// Boxed: a stream's parser state is several times a completion's size, and results
    /// move through a few frames before they are answered.
    Stream(Box<CommittedStream>),
}

/// A stream whose first content arrived in time: its model is locked (docs/http-api.md,
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
    /// The request counted in flight at its deployment and provider while the stream lasts.
    pub slot: Option<Slot>,
}

pub struct Failed {
    pub error: ApiError,
    pub attempts: Vec<AttemptReport>,
    /// Every model's breaker was open and none due for a probe, and the chain's degraded
    /// answer asked not to wait (`when_all_open`): no model was tried.
    pub all_open: bool,
}

/// Runs a request's chain; what the request path holds of the node's [`Services`].
pub struct Executor {
    services: Arc<Services>,
}

/// One request's run through its chain: what each of its attempts and calls reads.
#[derive(Clone, Copy)]
struct Run<'r> {
    services: &'r Services,
    chain: &'r Chain,
    request: &'r ChatRequest<'r>,
    config: &'r NodeConfig,
    /// Goes upstream with every call (docs/http-api.md, "Response headers").
    request_id: &'r HeaderValue,
}

/// What one call of an attempt brought.
enum Called {
    Completion(Completion),
    /// What the upstream sent up to its first content, and the rest of it.
    Stream(Vec<StreamEvent>, UpstreamStream),
}

/// What the failed attempts of a chain said so far.
#[derive(Default)]
struct Tally {
    last_failure: Option<(FailoverReason, Code)>,
    /// The soonest any upstream said it would take calls again: the chain's `Retry-After`
    /// when every failure was a rate limit.
    retry_at: Option<Instant>,
}

/// Where a chain goes after an attempt.
enum Next {
    /// The answer, served or the client's own error: the chain ends here.
    Answer(Result<Served, Failed>),
    /// Failed over for this reason: on to the next entry.
    GoOn(FailoverReason),
    /// Failed for a reason outside the chain's `on`: no entry is tried after it.
    Stop,
}

/// A line of the report for a model not called.
fn skipped(model: &Model, reason: AttemptReason) -> AttemptReport {
    AttemptReport {
        model: model.name.clone(),
        status: AttemptStatus::Skipped,
        reason: Some(reason),
        latency_ms: 0,
        retries: 0,
        probe: false,
        injected: None,
        deployment: None,
        local_limit: false,
    }
}

impl Tally {
    /// Takes in how the attempt on `target` went (`attempts` go with the answer, when there
    /// is one).
    fn after(
        &mut self,
        chain: &Chain,
        target: Target<'_>,
        result: AttemptResult,
        attempts: &mut Vec<AttemptReport>,
    ) -> Next {
        match result {
            AttemptResult::Served(output) => {
                let attempts = std::mem::take(attempts);
                Next::Answer(Ok(Served {
                    output,
                    model: Arc::clone(target.model),
                    deployment: target.deployment().cloned(),
                    attempts,
                }))
            }
            AttemptResult::ClientError(status, error) => {
                Next::Answer(Err(client_error(chain, status, error, std::mem::take(attempts))))
            }
            AttemptResult::Failover(reason, code, at) => {
                self.last_failure = Some((reason, code));
                self.retry_at = soonest(self.retry_at, at);
                if chain.fails_over_on(reason) { Next::GoOn(reason) } else { Next::Stop }
            }
        }
    }
}

enum AttemptResult {
    Served(Output),
    /// With when the upstream said it would take calls again, if its last answer had a
    /// `Retry-After`.
    Failover(FailoverReason, Code, Option<Instant>),
    ClientError(StatusCode, UpstreamError),
}

/// Where a chain goes after the attempt on a model with `deployments`.
enum Step {
    Next(Next),
    /// No deployment admitted a call (every breaker open): skipped, with when the first is
    /// due for a probe (if a prober does not own it).
    Skipped(Option<Instant>),
}

impl Executor {
    pub fn new(services: Arc<Services>) -> Self {
        Self { services }
    }

    /// `request_id` goes upstream with every call (docs/http-api.md, "Response headers").
    pub async fn run(
        &self,
        chain: &Chain,
        request: &ChatRequest<'_>,
        config: &NodeConfig,
        request_id: &HeaderValue,
    ) -> Result<Served, Failed> {
        let services = &self.services;
        Run { services, chain, request, config, request_id }.execute().await
    }
}

impl Run<'_> {
    /// The chain's entries in order, then the entries skipped on a breaker no prober tests.
    async fn execute(self) -> Result<Served, Failed> {
        let Self { chain, config, .. } = self;
        let started = Instant::now();
        // The budget grows with requests, not attempts: a request that fails over must not
        // earn its failing model more retries than one that does not.
        config.retry_budget.deposit(started);
        let mut attempts: Vec<AttemptReport> = Vec::with_capacity(chain.entries.len());
        // Entries skipped on an open breaker, with when each is due for a probe.
        let mut skipped: Vec<(usize, Instant)> = Vec::new();
        let mut tried = false;
        let mut tally = Tally::default();
        // After a context-length refusal: the window the prompt did not fit in. Only a model
        // with a larger one can take it (docs/http-api.md, "Failover").
        let mut too_long_for: Option<u64> = None;

        for (i, entry) in chain.entries.iter().enumerate() {
            if let Some(window) = too_long_for
                && entry.model.context_window.is_none_or(|w| w <= window)
            {
                self.skip_smaller_window(&entry.model, &mut attempts);
                continue;
            }
            let Some(timeout) = budget(chain, entry, started) else { break };
            if let Some(deployments) = &entry.deployments {
                let step =
                    self.deployments(i, deployments, timeout, &mut tally, &mut attempts).await;
                let next = match step {
                    Step::Next(next) => next,
                    Step::Skipped(ready_at) => {
                        if let Some(ready_at) = ready_at {
                            skipped.push((i, ready_at));
                        }
                        continue;
                    }
                };
                tried = true;
                match next {
                    Next::Answer(answer) => return answer,
                    Next::Stop => break,
                    Next::GoOn(FailoverReason::ContextLength) => {
                        too_long_for = entry.model.context_window;
                    }
                    Next::GoOn(_) => {}
                }
                continue;
            }
            let breaker = self.services.breaker(config, &entry.model);
            let (admission, transition) = breaker.try_acquire(Instant::now());
            self.services.report_transition(transition);
            let permit = match admission {
                Admission::Admitted(permit) => permit,
                Admission::Rejected { ready_at, probed } => {
                    // A probed breaker's half-open test is its prober's (docs/http-api.md,
                    // "Failover"): never forced onto a user request.
                    if !probed {
                        skipped.push((i, ready_at));
                    }
                    self.skip_open(&entry.model, &mut attempts);
                    continue;
                }
            };
            tried = true;
            let target = entry.target();
            let slot = match self.slot(target) {
                Ok(slot) => slot,
                Err(full) => {
                    drop(permit);
                    match self.turned_away(target, full, &mut tally, &mut attempts) {
                        Next::Stop => break,
                        _ => continue,
                    }
                }
            };
            let result = self.attempt(i, target, timeout, permit, slot, &mut attempts);
            match tally.after(chain, target, result.await, &mut attempts) {
                Next::Answer(answer) => return answer,
                Next::Stop => break,
                Next::GoOn(FailoverReason::ContextLength) => {
                    too_long_for = entry.model.context_window;
                }
                Next::GoOn(_) => {}
            }
        }

        // Every entry's breaker was open and none is due for a probe: a chain with a degraded
        // answer for this moment gets it now, without a probe and without waiting.
        let now = Instant::now();
        if !tried
            && chain.degraded.as_ref().is_some_and(|d| d.when_all_open)
            && attempts.len() == chain.entries.len()
            && skipped.iter().all(|(_, ready_at)| *ready_at > now)
        {
            let mut failed = all_failed(chain, attempts, None, None);
            failed.all_open = true;
            return Err(failed);
        }

        // No entry could serve and some were skipped on a breaker no prober tests (open
        // probing off): a request is not failed on breaker state alone (docs/http-api.md,
        // "Failover"). Those entries are forced as probes, the one due soonest first, so a
        // healthy model whose breaker is still open from an earlier outage serves instead of
        // a dead one being tried again and again. A breaker with a probe in flight is left to
        // it (concurrent forced probes are one probe), and a forced probe that fails never
        // lengthens a cool-down.
        let chain_goes_on =
            tally.last_failure.is_none_or(|(reason, _)| chain.fails_over_on(reason));
        if chain_goes_on {
            skipped.sort_by_key(|(_, ready_at)| *ready_at);
        } else {
            skipped.clear();
        }
        for (i, _) in skipped {
            let entry = &chain.entries[i];
            let Some(timeout) = budget(chain, entry, started) else { break };
            // A model with deployments is forced on its first one its key may use.
            let target = match &entry.deployments {
                Some(d) => d.target(d.allowed.trailing_zeros() as usize),
                None => entry.target(),
            };
            let breaker = self.services.breaker(config, target.model);
            let Some((permit, transition)) = breaker.force_probe(Instant::now()) else {
                continue;
            };
            self.services.report_transition(transition);
            let mut probe_report = Vec::with_capacity(1);
            let slot = match self.slot(target) {
                Ok(slot) => slot,
                Err(_full) => continue,
            };
            let result = self.attempt(i, target, timeout, permit, slot, &mut probe_report).await;
            if let Some(mut report) = probe_report.pop() {
                report.probe = true;
                // The skipped line of this entry: entries with deployments push one line
                // per deployment tried, so it is looked up by model rather than position.
                let skipped = attempts
                    .iter()
                    .position(|a| a.model == report.model && a.status == AttemptStatus::Skipped);
                match skipped {
                    Some(at) => attempts[at] = report,
                    None => attempts.push(report),
                }
            }
            match tally.after(chain, target, result, &mut attempts) {
                Next::Answer(answer) => return answer,
                Next::Stop => break,
                Next::GoOn(_) => {}
            }
        }

        Err(all_failed(chain, attempts, tally.last_failure, tally.retry_at))
    }

    /// One attempt: a call to the entry's model and, when its retry policy, the time left,
    /// the node's retry budget and the breaker allow, more calls to the same model. Every
    /// call counts in the breaker. Retries happen only before a stream commits (nothing has
    /// reached the client yet); a client that goes away drops this future, and with it any
    /// backoff in progress.
    async fn attempt(
        &self,
        index: usize,
        target: Target<'_>,
        timeout: Duration,
        permit: Permit,
        mut slot: Option<Slot>,
        attempts: &mut Vec<AttemptReport>,
    ) -> AttemptResult {
        let Self { chain, request, config, .. } = *self;
        let entry = &chain.entries[index];
        let model = target.model;
        let span = debug_span!("attempt", model = %model.name, provider = %model.provider);
        let started = Instant::now();
        let deadline = started + timeout;
        // A stream's every call must bring its first content by then, retries included.
        let first_token = deadline.min(started + entry.first_token_timeout);
        let limit = if request.stream { first_token } else { deadline };
        let policy = retry::Policy::resolve(
            config.catalog.retry_policy.as_ref(),
            model.retry.as_ref(),
            request.redundancy.max_retries,
        );
        let mut permit = permit;
        let mut retries = 0;
        // One per attempt: every call of the attempt (retries too) draws its own fault, and
        // the attempt reports the first one that touched it.
        let mut injector = Injector::new(target.faults);
        loop {
            // With OpenTelemetry on, each call is a CLIENT span of its own, current while the
            // call runs so that its context goes upstream as `traceparent`.
            let call_cx = otel::client_span(
                model,
                || config.catalog.provider(&model.provider),
                index,
                retries,
            );
            let drawn = injector.injected().len();
            let called_at = Instant::now();
            let call = self
                .call(target, timeout, deadline, first_token, &mut injector)
                .instrument(span.clone());
            // Two awaits rather than a wrapper on both paths: without OpenTelemetry the call
            // is polled as it was before spans were made on the OpenTelemetry API.
            let called = match &call_cx {
                Some(cx) => call.with_context(cx.clone()).await,
                None => call.await,
            };
            if let (Some(slot), Ok(_)) = (&slot, &called) {
                slot.answered(Answered::Ok(called_at.elapsed()), Instant::now());
            }
            let call_span = call_cx.as_ref();
            if let Some(fault) = injector.injected().get(drawn) {
                otel::injected(call_span, &fault.name);
            }
            let failure = match called {
                Ok(Called::Completion(completion)) => {
                    otel::call_answered(call_span, Some(&completion));
                    self.services
                        .report_transition(permit.record(Outcome::Success, Instant::now()));
                    self.finish_attempt(target, started, None, retries, &injector, attempts);
                    return AttemptResult::Served(Output::Completion(completion));
                }
                Ok(Called::Stream(buffered, upstream)) => {
                    otel::call_answered(call_span, None);
                    let stall = Duration::from_millis(model.stall_timeout_ms().into());
                    let slot = slot.take();
                    let stream = CommittedStream {
                        buffered,
                        upstream,
                        permit,
                        deadline,
                        timeout,
                        stall,
                        slot,
                    };
                    self.finish_attempt(target, started, None, retries, &injector, attempts);
                    return AttemptResult::Served(Output::Stream(Box::new(stream)));
                }
                Err(failure) => failure,
            };
            debug!(model = %model.name, ?failure, retries, "call failed");
            if let Failure::InvalidOutput(invalid) = &failure {
                self.services.metrics.invalid_output(&model.name, invalid.kind()).inc();
            }
            let retry_after = failure.retry_after();
            let retry_at = retry_after.map(|wait| Instant::now() + wait);
            let mut too_long = false;
            let (outcome, result, failed) = match failure::classify(failure) {
                Verdict::Failover { reason, breaker, code } => {
                    otel::call_failed(call_span, reason.as_str(), true);
                    if let Some(slot) = &slot {
                        let answered = match reason {
                            FailoverReason::RateLimit => Answered::RateLimited,
                            _ => Answered::Other,
                        };
                        slot.answered(answered, Instant::now());
                    }
                    (
                        breaker,
                        AttemptResult::Failover(reason, code, retry_at),
                        Some(FailedCall { reason, retryable: code.retryable(), retry_after }),
                    )
                }
                Verdict::Stop { status, error, breaker, context_length } => {
                    let result = if context_length
                        && chain.fails_over_on(FailoverReason::ContextLength)
                        && larger_window_after(chain, index)
                    {
                        let reason = FailoverReason::ContextLength;
                        otel::call_failed(call_span, reason.as_str(), true);
                        AttemptResult::Failover(reason, Code::ContextLength, None)
                    } else {
                        otel::call_failed(call_span, status.as_str(), false);
                        AttemptResult::ClientError(status, error)
                    };
                    too_long = context_length;
                    (breaker, result, None)
                }
            };
            // The call's span ends here, before any backoff: a retry is a call of its own.
            drop(call_cx);
            // A failure the upstream is not to blame for releases the permit unjudged.
            let opened = match outcome {
                Some(outcome) => {
                    let transition = permit.record(outcome, Instant::now());
                    let opened = transition.as_ref().is_some_and(|t| t.to == State::Open);
                    self.services.report_transition(transition);
                    opened
                }
                None => {
                    drop(permit);
                    false
                }
            };
            let next = match failed {
                // The request is at fault: the same call would fail the same way.
                None => None,
                Some(failed) => {
                    let time = limit.saturating_duration_since(started);
                    let next = if opened {
                        Err(NoRetry::BreakerOpen)
                    } else {
                        self.next_call(&policy, retries, failed, limit, time, model).await
                    };
                    next.inspect_err(|why| {
                        if policy.max_retries > 0 {
                            debug!(model = %model.name, why = why.as_str(), retries, "not retried");
                        }
                    })
                    .ok()
                }
            };
            if let Some(next) = next {
                permit = next;
                retries += 1;
                continue;
            }
            let reason = match &result {
                AttemptResult::Failover(reason, ..) => AttemptReason::Failover(*reason),
                // With no larger model after it, still reported as what it was.
                _ if too_long => AttemptReason::Failover(FailoverReason::ContextLength),
                _ => AttemptReason::ClientError,
            };
            self.finish_attempt(target, started, Some(reason), retries, &injector, attempts);
            return result;
        }
    }

    /// One upstream call of an attempt: a plain completion, checked against the request's
    /// `response_format` when the chain asks (its `output`), or a stream read up to its
    /// first content.
    async fn call(
        &self,
        target: Target<'_>,
        timeout: Duration,
        deadline: Instant,
        first_token: Instant,
        injector: &mut Injector<'_>,
    ) -> Result<Called, Failure> {
        let Self { chain, request, config, request_id, .. } = *self;
        let output: Option<&OutputCheck> = chain.output.as_deref();
        let model = target.model;
        let Some(provider) = config.providers.get(&model.provider) else {
            return Err(Failure::Unconfigured(model.provider.clone()));
        };
        // Translating adapters translated when the chain was formed; the others build their
        // pass-through body for this call only.
        let body = match target.body {
            Some(body) => body.clone(),
            None => provider.body(model, request).map_err(Failure::Call)?,
        };
        if request.stream {
            let native = provider.native_call(request);
            let opened = open_until_first_token(
                provider,
                model,
                body,
                first_token,
                request_id,
                native,
                injector,
            );
            let (buffered, upstream) = opened.await.map_err(|(failure, skipped)| {
                // A committed stream counts its own when it ends.
                if skipped > 0 && self.services.metrics.malformed_frames(&model.name, skipped, Instant::now()) {
                    tracing::warn!(model = %model.name, skipped, "upstream stream frames did not parse and were skipped before the stream failed (this warning repeats at most once a minute per model)");
                }
                failure
            })?;
            return Ok(Called::Stream(buffered, upstream));
        }
        let deadline = tokio::time::Instant::from_std(deadline);
        if let Some(embeddings) = &request.embeddings {
            let call = provider.embed(model, body, embeddings, Some(request_id), injector);
            return match tokio::time::timeout_at(deadline, call).await {
                Err(_elapsed) => Err(Failure::Call(CallError::Timeout(timeout))),
                Ok(Ok(answer)) => Ok(Called::Completion(answer)),
                Ok(Err(e)) => Err(Failure::Call(e)),
            };
        }
        let call = provider.complete(
            model,
            body,
            Some(request_id),
            provider.native_call(request),
            injector,
        );
        match tokio::time::timeout_at(deadline, call).await {
            Err(_elapsed) => Err(Failure::Call(CallError::Timeout(timeout))),
            Ok(Ok(completion)) => {
                if let Some(output) = output {
                    let checked = match (completion.messages, completion.responses) {
                        (true, _) => output.check_message(completion.verbatim()),
                        (_, true) => output.check_response(completion.verbatim()),
                        _ => output.check(completion.choices()),
                    };
                    checked.map_err(Failure::InvalidOutput)?;
                }
                Ok(Called::Completion(completion))
            }
            Ok(Err(e)) => Err(Failure::Call(e)),
        }
    }

    /// Decides whether retry number `retries` follows the failed call; if so, waits and
    /// returns the breaker's permit for it. `limit` is when the attempt's time (or a
    /// stream's first-token time) runs out, `time` how long the attempt had in all. Not
    /// called when the failed call opened the breaker: that is never retried.
    async fn next_call(
        &self,
        policy: &retry::Policy,
        retries: u32,
        failed: FailedCall,
        limit: Instant,
        time: Duration,
        model: &Model,
    ) -> Result<Permit, NoRetry> {
        let config = self.config;
        let left = limit.saturating_duration_since(Instant::now());
        let wait = retry::decide(policy, retries, failed, left, FAIR_MINIMUM.min(time))?;
        if !config.retry_budget.try_withdraw(policy.budget, Instant::now()) {
            self.services
                .metrics
                .retry_budget_refusals
                .get_or_create(&ProviderModelLabels {
                    provider: model.provider.clone(),
                    model: model.name.clone(),
                })
                .inc();
            return Err(NoRetry::Budget);
        }
        debug!(model = %model.name, reason = failed.reason.as_str(), wait_ms = wait.as_millis() as u64, "retrying");
        // Awaited here, inside the request's future: a client that disconnects drops it,
        // and nothing keeps sleeping or calls again.
        tokio::time::sleep(wait).await;
        // The breaker may have opened meanwhile (other requests' failures): never retry
        // into an open one.
        let (admission, transition) =
            self.services.breaker(config, model).try_acquire(Instant::now());
        self.services.report_transition(transition);
        let Admission::Admitted(permit) = admission else { return Err(NoRetry::BreakerOpen) };
        self.services
            .metrics
            .retries
            .get_or_create(&RetryLabels {
                provider: model.provider.clone(),
                model: model.name.clone(),
                reason: failed.reason.as_str(),
            })
            .inc();
        Ok(permit)
    }

    /// Reports a model passed over after a context-length refusal: its window is no larger
    /// than the one the prompt did not fit in.
    fn skip_smaller_window(&self, model: &Model, attempts: &mut Vec<AttemptReport>) {
        self.services.metrics.model(&model.name).attempt("skipped", "context_window").inc();
        attempts.push(skipped(model, AttemptReason::ContextWindow));
    }

    /// Reports a model passed over because its breaker (every deployment's) is open.
    fn skip_open(&self, model: &Model, attempts: &mut Vec<AttemptReport>) {
        self.services.metrics.model(&model.name).attempt("skipped", "circuit_open").inc();
        attempts.push(skipped(model, AttemptReason::CircuitOpen));
    }

    /// The attempt on a model with `deployments`: its deployments in the order the pool
    /// gives (balance or session), each tried while its breaker admits and its cap has room;
    /// a failover-class failure goes on to the next deployment inside the attempt's time,
    /// anything else ends the attempt as it would on one deployment. Every deployment tried
    /// is a line of the report.
    async fn deployments(
        &self,
        index: usize,
        deployments: &Deployments,
        timeout: Duration,
        tally: &mut Tally,
        attempts: &mut Vec<AttemptReport>,
    ) -> Step {
        let Self { chain, config, .. } = *self;
        let entry = &chain.entries[index];
        let started = Instant::now();
        let end = started + timeout;
        let pool = &deployments.pool;
        let order = pool.order(
            deployments.allowed,
            chain.session.as_deref(),
            &self.services.loads,
            started,
        );
        let mut tried = false;
        let mut ready_at: Option<Instant> = None;
        let mut last = None;
        for k in order.iter() {
            let left = end.saturating_duration_since(Instant::now());
            // A deployment after a failed one gets what is left, if that is enough to work.
            if tried && left < FAIR_MINIMUM.min(timeout) {
                break;
            }
            let target = deployments.target(k);
            let breaker = self.services.breaker(config, target.model);
            let (admission, transition) = breaker.try_acquire(Instant::now());
            self.services.report_transition(transition);
            let permit = match admission {
                Admission::Admitted(permit) => permit,
                Admission::Rejected { ready_at: at, probed } => {
                    if !probed {
                        ready_at = Some(ready_at.map_or(at, |r| r.min(at)));
                    }
                    continue;
                }
            };
            tried = true;
            let slot = match self.slot(target) {
                Ok(slot) => slot,
                Err(full) => {
                    drop(permit);
                    match self.turned_away(target, full, tally, attempts) {
                        Next::GoOn(reason) => {
                            last = Some(reason);
                            continue;
                        }
                        next => return Step::Next(next),
                    }
                }
            };
            let result = self.attempt(index, target, left, permit, slot, attempts).await;
            match tally.after(chain, target, result, attempts) {
                // Another deployment of the model has the same window: on to the next model.
                Next::GoOn(FailoverReason::ContextLength) => {
                    return Step::Next(Next::GoOn(FailoverReason::ContextLength));
                }
                Next::GoOn(reason) => last = Some(reason),
                next => return Step::Next(next),
            }
        }
        match last {
            Some(reason) => Step::Next(Next::GoOn(reason)),
            None if tried => Step::Next(Next::Stop),
            None => {
                self.skip_open(&entry.model, attempts);
                Step::Skipped(ready_at)
            }
        }
    }

    /// Counts a call to `target` in flight at its deployment and provider, under their caps
    /// (docs/catalog.md, "Upstream concurrency"). `None` when nothing needs counting: a model
    /// with one deployment, no cap on it or its provider.
    fn slot(&self, target: Target<'_>) -> Result<Option<Slot>, Full> {
        let model = target.model;
        let config = self.config;
        let cap = Cap::of(model.max_concurrency, model.adaptive);
        let provider = config
            .providers
            .get(&model.provider)
            .and_then(|p| Cap::of(p.def.max_concurrency, p.def.adaptive))
            .map(|cap| (self.services.loads.provider(&model.provider), cap));
        let deployment = match target.member {
            Some(member) => Some((Arc::clone(member.load(&self.services.loads)), cap)),
            None => cap.map(|cap| {
                let id = format!("{}/{}", model.provider, model.upstream_model);
                (self.services.loads.deployment(&model.provider, &id), Some(cap))
            }),
        };
        if deployment.is_none() && provider.is_none() {
            return Ok(None);
        }
        Slot::take(deployment, provider).map(Some)
    }

    /// A call a cap turned away: reported as a local rate limit, failed over at once.
    fn turned_away(
        &self,
        target: Target<'_>,
        full: Full,
        tally: &mut Tally,
        attempts: &mut Vec<AttemptReport>,
    ) -> Next {
        let model = target.model;
        debug!(model = %model.name, deployment = ?target.deployment(), ?full, "over the cap on requests in flight");
        let reason = FailoverReason::RateLimit;
        let metrics = self.services.metrics.model(&model.name);
        metrics.attempt(AttemptStatus::Failed.as_str(), reason.as_str()).inc();
        if let Some(member) = target.member {
            member
                .attempts(&self.services.metrics, AttemptStatus::Failed.as_str(), reason.as_str())
                .inc();
        }
        attempts.push(AttemptReport {
            status: AttemptStatus::Failed,
            deployment: target.deployment().cloned(),
            local_limit: true,
            ..skipped(model, AttemptReason::Failover(reason))
        });
        tally.last_failure = Some((reason, Code::RateLimited));
        if self.chain.fails_over_on(reason) { Next::GoOn(reason) } else { Next::Stop }
    }

    /// Reports an attempt: metrics, and its line in the failover report. `failed` says why
    /// it failed; `None`: it served.
    fn finish_attempt(
        &self,
        target: Target<'_>,
        started: Instant,
        failed: Option<AttemptReason>,
        retries: u32,
        injector: &Injector<'_>,
        attempts: &mut Vec<AttemptReport>,
    ) {
        let (status, reason) = match failed {
            None => (AttemptStatus::Served, None),
            Some(reason) => (AttemptStatus::Failed, Some(reason)),
        };
        let model = target.model;
        for fault in injector.injected() {
            let labels = InjectedLabels {
                fault: fault.name.clone(),
                model: model.name.clone(),
                kind: fault.kind.flag(),
            };
            self.services.metrics.injected_faults.get_or_create(&labels).inc();
        }
        let reason_str = reason.map_or("", AttemptReason::as_str);
        let metrics = self.services.metrics.model(&model.name);
        metrics.attempt(status.as_str(), reason_str).inc();
        metrics.duration.observe(started.elapsed().as_secs_f64());
        if let Some(member) = target.member {
            member.attempts(&self.services.metrics, status.as_str(), reason_str).inc();
        }
        attempts.push(AttemptReport {
            model: model.name.clone(),
            status,
            reason,
            latency_ms: started.elapsed().as_millis() as u64,
            retries,
            probe: false,
            injected: injector.first().map(|f| f.name.clone()),
            deployment: target.deployment().cloned(),
            local_limit: false,
        });
    }
}

/// Whether a model after entry `index` has a larger `context_window` than its model: a
/// context-length refusal fails over only then. A window left out of the catalog is larger
/// than none and smaller than none.
fn larger_window_after(chain: &Chain, index: usize) -> bool {
    let Some(window) = chain.entries.get(index).and_then(|e| e.model.context_window) else {
        return false;
    };
    chain.entries.iter().skip(index + 1).any(|e| e.model.context_window.is_some_and(|w| w > window))
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
    Failed { error, attempts, all_open: false }
}

/// The earlier of two moments, either of which may be unknown.
fn soonest(a: Option<Instant>, b: Option<Instant>) -> Option<Instant> {
    match (a, b) {
        (Some(a), Some(b)) => Some(a.min(b)),
        (a, b) => a.or(b),
    }
}

/// 429 when every failure was a rate limit, else 502 (docs/http-api.md, "Errors"). A 429
/// carries `retry_at`, the soonest any upstream said it would take calls again.
fn all_failed(
    chain: &Chain,
    attempts: Vec<AttemptReport>,
    last_failure: Option<(FailoverReason, Code)>,
    retry_at: Option<Instant>,
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
        // Nothing tried: the model's breaker is open and its prober, not this request, tests
        // it (docs/http-api.md, "Failover").
        let reason = match last_failure {
            Some((r, _)) => r.as_str(),
            None => attempts.last().and_then(|a| a.reason).map_or("unknown", AttemptReason::as_str),
        };
        let explanation = explanation.or(last_failure.is_none().then_some(
            "its circuit breaker is open and the gateway's probes, not requests, test when it recovers",
        ));
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
        retry_at: if all_rate_limited { retry_at } else { None },
    };
    Failed { error, attempts, all_open: false }
}

/// Opens the upstream stream and reads it until its first content (or its end), all before
/// `first_token`: until then the attempt can still fail over and the client has seen nothing.
/// A failure comes with the number of frames that did not parse before it.
pub async fn open_until_first_token(
    provider: &Arc<ProviderRuntime>,
    model: &Model,
    body: bytes::Bytes,
    first_token: Instant,
    request_id: &HeaderValue,
    native: Option<NativeCall<'_>>,
    injector: &mut Injector<'_>,
) -> Result<(Vec<StreamEvent>, UpstreamStream), (Failure, u32)> {
    let started = Instant::now();
    let waited = || first_token.saturating_duration_since(started);
    let deadline = tokio::time::Instant::from_std(first_token);
    let timed_out = || Failure::Call(CallError::Timeout(waited()));
    let mut upstream = tokio::time::timeout_at(
        deadline,
        provider.open_stream(model, body, Some(request_id), native, injector),
    )
    .await
    .map_err(|_| (timed_out(), 0))?
    .map_err(|e| (Failure::Call(e), 0))?;
    let mut buffered = Vec::new();
    loop {
        let next = tokio::time::timeout_at(deadline, upstream.next()).await;
        let skipped = upstream.skipped_frames();
        match next {
            Err(_) => return Err((timed_out(), skipped)),
            Ok(None) => {
                let ended = StreamError::Connection("the stream ended before any content".into());
                return Err((Failure::Stream(ended), skipped));
            }
            Ok(Some(Err(e))) => return Err((Failure::Stream(e), skipped)),
            Ok(Some(Ok(StreamEvent::Error(e)))) => return Err((Failure::InBand(e), skipped)),
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

#[cfg(test)]
mod tests {
    use std::collections::HashMap;
    use std::sync::Mutex;

    use prometheus_client::metrics::counter::Counter;
    use serde_json::{Value, json};

    use super::*;
    use crate::breaker::Breakers;
    use crate::config::Change;
    use crate::metrics::InvalidOutputLabels;
    use crate::structured;
    use crate::telemetry::Telemetry;

    /// An OpenAI-style upstream on loopback answering each upstream model with its own
    /// content, and counting the calls each got.
    async fn upstream(
        contents: HashMap<&'static str, String>,
    ) -> (String, Arc<Mutex<Vec<String>>>) {
        use axum::routing::post;
        let calls = Arc::new(Mutex::new(Vec::new()));
        let seen = Arc::clone(&calls);
        let contents = Arc::new(contents);
        let app = axum::Router::new().route(
            "/v1/chat/completions",
            post(move |body: String| {
                let (seen, contents) = (Arc::clone(&seen), Arc::clone(&contents));
                async move {
                    let body: Value = serde_json::from_str(&body).unwrap();
                    let model = body["model"].as_str().unwrap().to_owned();
                    seen.lock().unwrap().push(model.clone());
                    let answer = json!({"id": "c", "object": "chat.completion", "created": 1,
                        "model": model,
                        "choices": [{"index": 0, "finish_reason": "stop",
                            "message": {"role": "assistant", "content": contents[model.as_str()]}}],
                        "usage": {"prompt_tokens": 5, "completion_tokens": 9, "total_tokens": 14}});
                    ([(http::header::CONTENT_TYPE, "application/json")], answer.to_string())
                }
            }),
        );
        let listener = tokio::net::TcpListener::bind("127.0.0.1:0").await.unwrap();
        let addr = listener.local_addr().unwrap();
        tokio::spawn(async move { axum::serve(listener, app).await });
        (format!("http://{addr}/v1"), calls)
    }

    fn config(url: &str) -> NodeConfig {
        // A retry policy that would retry every reason it may: invalid output is still not
        // retried.
        let models: Vec<Value> = ["a", "b", "c"]
            .map(|m| json!({"name": m, "provider": "p", "upstream_model": m}))
            .into();
        let catalog = json!({
            "providers": [{"name": "p", "kind": "openai-compatible", "base_url": url}],
            "models": models,
            "retry_policy": {"max_retries": 2, "base_backoff_ms": 1, "max_backoff_ms": 1,
                "on": ["connection_error", "server_error", "rate_limit", "timeout"]}
        });
        let change = Change::Snapshot {
            version: 1,
            resources: vec![("catalog".into(), serde_json::to_vec(&catalog).unwrap())],
        };
        NodeConfig::default().apply(change).unwrap()
    }

    fn executor() -> Executor {
        let telemetry = Arc::new(Telemetry::new("n".into(), Counter::default()));
        let metrics = Arc::new(crate::metrics::Metrics::new());
        Executor::new(Arc::new(Services::new(telemetry, metrics, Breakers::new())))
    }

    fn key() -> crate::keys::Key {
        crate::keys::Key {
            id: "k1".into(),
            digest: [0; 32],
            status: switchyard_catalog::KeyStatus::Active,
            settings: Default::default(),
        }
    }

    #[tokio::test]
    async fn invalid_answers_fail_over_with_one_compiled_schema_and_closed_breakers() {
        let person = json!({"type": "object", "properties": {"name": {"type": "string"}},
                            "required": ["name"], "additionalProperties": false});
        let (url, calls) = upstream(HashMap::from([
            ("a", "Sure! The name is Ada.".to_owned()),
            ("b", json!({"name": 7}).to_string()),
            ("c", json!({"name": "Ada"}).to_string()),
        ]))
        .await;
        let config = config(&url);
        let executor = executor();
        let body = json!({"models": ["a", "b", "c"],
            "messages": [{"role": "user", "content": "Who?"}],
            "response_format": {"type": "json_schema",
                                "json_schema": {"name": "person", "strict": true, "schema": person}},
            "redundancy": {"on": ["server_error", "invalid_output"]}})
        .to_string();
        let request = ChatRequest::parse(body.as_bytes()).unwrap();

        let before = structured::tests::compiled();
        let chain = crate::chain::resolve(&request, &key(), &config).unwrap();
        let Ok(served) =
            executor.run(&chain, &request, &config, &crate::request_id::generate()).await
        else {
            panic!("expected the third model to serve")
        };
        assert_eq!(structured::tests::compiled() - before, 1, "one schema compiled per request");
        // The next request with the same response_format finds it compiled.
        let again = crate::chain::resolve(&request, &key(), &config).unwrap();
        assert!(Arc::ptr_eq(chain.output.as_ref().unwrap(), again.output.as_ref().unwrap()));
        assert_eq!(structured::tests::compiled() - before, 1);

        assert_eq!(served.model.name, "c");
        let reasons: Vec<_> =
            served.attempts.iter().map(|a| (a.status, a.reason.map(|r| r.as_str()))).collect();
        assert_eq!(
            reasons,
            [
                (AttemptStatus::Failed, Some("invalid_output")),
                (AttemptStatus::Failed, Some("invalid_output")),
                (AttemptStatus::Served, None)
            ]
        );
        assert_eq!(*calls.lock().unwrap(), ["a", "b", "c"], "no retry of an invalid output");
        for model in ["a", "b", "c"] {
            let breaker = executor.services.breaker(&config, &config.models[model]);
            let snapshot = breaker.snapshot();
            assert_eq!(snapshot.state, State::Closed, "{model}");
            assert_eq!(snapshot.failure_rate, 0.0, "{model}: the provider answered");
        }
        let counted = |model: &str, kind| {
            let labels = InvalidOutputLabels { model: model.into(), kind };
            executor.services.metrics.invalid_outputs.get_or_create(&labels).get()
        };
        assert_eq!((counted("a", "not_json"), counted("b", "schema")), (1, 1));
        assert_eq!(
            executor.services.metrics.model("a").attempt("failed", "invalid_output").get(),
            1
        );
    }

    #[tokio::test]
    async fn without_invalid_output_in_on_the_first_answer_is_served_unchecked() {
        let (url, calls) =
            upstream(HashMap::from([("a", "not JSON at all".to_owned()), ("b", "{}".to_owned())]))
                .await;
        let config = config(&url);
        let body = json!({"models": ["a", "b"], "messages": [{"role": "user", "content": "x"}],
            "response_format": {"type": "json_object"}})
        .to_string();
        let request = ChatRequest::parse(body.as_bytes()).unwrap();
        let before = structured::tests::compiled();
        let chain = crate::chain::resolve(&request, &key(), &config).unwrap();
        assert!(chain.output.is_none());
        let Ok(served) =
            executor().run(&chain, &request, &config, &crate::request_id::generate()).await
        else {
            panic!()
        };
        assert_eq!(served.model.name, "a");
        assert_eq!(*calls.lock().unwrap(), ["a"]);
        assert_eq!(structured::tests::compiled(), before);
    }

    #[tokio::test]
    async fn the_last_invalid_answer_ends_the_chain_naming_invalid_output() {
        let (url, _) = upstream(HashMap::from([("a", "nope".to_owned())])).await;
        let config = config(&url);
        let body = json!({"model": "a", "messages": [{"role": "user", "content": "x"}],
            "response_format": {"type": "json_object"},
            "redundancy": {"on": ["invalid_output"]}})
        .to_string();
        let request = ChatRequest::parse(body.as_bytes()).unwrap();
        let chain = crate::chain::resolve(&request, &key(), &config).unwrap();
        let Err(failed) =
            executor().run(&chain, &request, &config, &crate::request_id::generate()).await
        else {
            panic!()
        };
        match failed.error {
            ApiError::AllFailed { status, message, .. } => {
                assert_eq!(status, StatusCode::BAD_GATEWAY);
                assert!(message.contains("(invalid_output)"), "{message}");
                assert!(message.contains("response_format"), "{message}");
            }
            other => panic!("{other:?}"),
        }
    }

    #[test]
    fn a_streams_schema_is_not_compiled() {
        let body = json!({"model": "a", "stream": true,
            "messages": [{"role": "user", "content": "x"}],
            "response_format": {"type": "json_schema",
                                "json_schema": {"name": "x", "schema": {"type": "objekt"}}},
            "redundancy": {"on": ["invalid_output"]}})
        .to_string();
        let request = ChatRequest::parse(body.as_bytes()).unwrap();
        let chain = crate::chain::resolve(&request, &key(), &config("http://127.0.0.1:9/v1"));
        assert!(chain.unwrap().output.is_none(), "streams are not validated");
    }

    #[test]
    fn an_invalid_schema_is_refused_when_the_chain_is_formed() {
        let body = json!({"model": "a", "messages": [{"role": "user", "content": "x"}],
            "response_format": {"type": "json_schema",
                                "json_schema": {"name": "x", "schema": {"type": "objekt"}}},
            "redundancy": {"on": ["invalid_output"]}})
        .to_string();
        let request = ChatRequest::parse(body.as_bytes()).unwrap();
        match crate::chain::resolve(&request, &key(), &config("http://127.0.0.1:9/v1")) {
            Err(ApiError::InvalidRequest { param, .. }) => {
                assert_eq!(param.as_deref(), Some("response_format.json_schema.schema"))
            }
            other => panic!("{other:?}"),
        }
    }

    /// A catalog whose model `m` has two deployments, `p/dead` (503s) and `p/a`, and a
    /// second model `b`; the upstream answers `a` and `b` and counts every call.
    async fn pool_config(balance: &str, cap: Option<u32>) -> (NodeConfig, Arc<Mutex<Vec<String>>>) {
        use axum::routing::post;
        let calls = Arc::new(Mutex::new(Vec::new()));
        let seen = Arc::clone(&calls);
        let app = axum::Router::new().route(
            "/v1/chat/completions",
            post(move |body: String| {
                let seen = Arc::clone(&seen);
                async move {
                    let body: Value = serde_json::from_str(&body).unwrap();
                    let model = body["model"].as_str().unwrap().to_owned();
                    seen.lock().unwrap().push(model.clone());
                    if model == "dead" {
                        return (StatusCode::SERVICE_UNAVAILABLE, "down".to_owned());
                    }
                    let answer = json!({"id": "c", "object": "chat.completion", "created": 1,
                        "model": model, "choices": [{"index": 0, "finish_reason": "stop",
                            "message": {"role": "assistant", "content": "hi"}}]});
                    (StatusCode::OK, answer.to_string())
                }
            }),
        );
        let listener = tokio::net::TcpListener::bind("127.0.0.1:0").await.unwrap();
        let addr = listener.local_addr().unwrap();
        tokio::spawn(async move { axum::serve(listener, app).await });
        let url = format!("http://{addr}/v1");
        let catalog = json!({
            "providers": [{"name": "p", "kind": "openai-compatible", "base_url": url}],
            "models": [
                {"name": "m", "balance": balance, "deployments": [
                    {"provider": "p", "upstream_model": "dead", "max_concurrency": cap},
                    {"provider": "p", "upstream_model": "a"}]},
                {"name": "b", "provider": "p", "upstream_model": "b"}
            ]
        });
        let change = Change::Snapshot {
            version: 1,
            resources: vec![("catalog".into(), serde_json::to_vec(&catalog).unwrap())],
        };
        (NodeConfig::default().apply(change).unwrap(), calls)
    }

    fn lines(attempts: &[AttemptReport]) -> Vec<(String, String, String, bool)> {
        attempts
            .iter()
            .map(|a| {
                let reason = a.reason.map_or("", AttemptReason::as_str).to_owned();
                let deployment = a.deployment.as_deref().unwrap_or_default().to_owned();
                (
                    format!("{}@{deployment}", a.model),
                    a.status.as_str().to_owned(),
                    reason,
                    a.local_limit,
                )
            })
            .collect()
    }

    #[tokio::test]
    async fn a_failing_deployment_hands_the_attempt_to_the_next_one_and_the_chain_stays() {
        let (config, calls) = pool_config("weighted", None).await;
        let executor = executor();
        let body = br#"{"models":["m","b"],"messages":[{"role":"user","content":"hi"}]}"#;
        let request = ChatRequest::parse(body).unwrap();
        let chain = crate::chain::resolve(&request, &key(), &config).unwrap();
        let id = crate::request_id::generate();
        // Weights 1:1: the first request is the dead deployment's turn.
        let Ok(served) = executor.run(&chain, &request, &config, &id).await else {
            panic!("served by the model's other deployment")
        };
        assert_eq!(served.model.name, "m");
        assert_eq!(served.deployment.as_deref(), Some("p/a"));
        assert_eq!(
            lines(&served.attempts),
            [
                ("m@p/dead".into(), "failed".into(), "server_error".into(), false),
                ("m@p/a".into(), "served".into(), String::new(), false),
            ]
        );
        assert_eq!(*calls.lock().unwrap(), ["dead", "a"], "the chain's `b` is never called");
    }

    #[tokio::test]
    async fn a_full_cap_fails_over_at_once_without_a_call() {
        let (config, calls) = pool_config("weighted", Some(1)).await;
        let executor = executor();
        let body = br#"{"models":["m","b"],"messages":[{"role":"user","content":"hi"}]}"#;
        let request = ChatRequest::parse(body).unwrap();
        let chain = crate::chain::resolve(&request, &key(), &config).unwrap();
        // The dead deployment's one place is taken.
        let pool = &chain.entries[0].deployments.as_ref().unwrap().pool;
        let load = Arc::clone(pool.load(0, &executor.services.loads));
        let held = Slot::take(Some((load, Cap::of(Some(1), false))), None).unwrap();
        let Ok(served) =
            executor.run(&chain, &request, &config, &crate::request_id::generate()).await
        else {
            panic!("served by the deployment with room")
        };
        assert_eq!(
            lines(&served.attempts),
            [
                ("m@p/dead".into(), "failed".into(), "rate_limit".into(), true),
                ("m@p/a".into(), "served".into(), String::new(), false),
            ]
        );
        assert_eq!(*calls.lock().unwrap(), ["a"], "no call to the full one");
        drop(held);
        assert_eq!(pool.load(0, &executor.services.loads).in_flight(), 0);
        assert_eq!(pool.load(1, &executor.services.loads).in_flight(), 0, "the served call left");
    }
}
