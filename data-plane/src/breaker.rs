//! Circuit breakers, one per (provider name, upstream model) (docs/catalog.md,
//! "`breaker_policy`"; how the executor uses them: docs/http-api.md, "Failover").
//!
//! A [`Breaker`] is a small state machine — [`State::Closed`] → [`State::Open`] →
//! [`State::HalfOpen`] → closed or open again — driven by the outcomes the executor reports
//! through a [`Permit`]. It does no I/O and reads no clock of its own: time is passed in, and
//! every state change comes back to the caller as a [`Transition`] (the node forwards it to
//! the control plane and updates its metrics). [`Breakers`] is the node's registry.
//!
//! A breaker is *probed* when the node's prober owns its half-open test (docs/catalog.md,
//! "`probe`"): by default every breaker is, while open, tested every `open_interval_ms`
//! (jittered) whatever its cool-down, so a model is back in use within one interval of
//! recovering and no user request is the test subject; a model with a `probe` is also
//! probed when idle. [`Breaker::acquire_probe`] says when a probe is due, from the
//! breaker's own record of the node's last real call. With open probing off
//! (`open_interval_ms: 0`) the cool-down, doubled on every failed half-open test, decides
//! when a user request may test the model.
//!
//! The fleet's view (docs/operating.md, "The fleet's breaker view") lies over a breaker as a
//! [`FleetOpen`]: while the control plane says a deployment is open, every node rejects its
//! calls as if its own breaker were open, and only the node named its prober tests it (that
//! node opens its own breaker to run the open-breaker probes, [`Breaker::mirror_fleet`]). A
//! probe that closes it anywhere closes it everywhere: a node closes its own open breaker on
//! the control plane's word ([`FleetView::closed`]). Kept in the breaker's own state, under
//! the lock `try_acquire` takes anyway, so the request path pays one comparison for it.

use std::collections::{HashMap, VecDeque};
use std::sync::{Arc, OnceLock};
use std::time::{Duration, Instant, SystemTime};

use parking_lot::{Mutex, RwLock};

use switchyard_catalog::BreakerPolicy;

/// What one upstream call came to, as far as the breaker cares.
///
/// The executor classifies: a client's own 4xx says nothing about the upstream's health and
/// is reported as [`Outcome::Success`]; connection errors, 5xx and 429 are failures.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum Outcome {
    Success,
    Failure,
    /// A failure too, for the failure rate; in a row they also trip the breaker on their own.
    Timeout,
}

/// A breaker's state: the one type the node stream, the control plane's records, the admin
/// API and the CLI spell it with.
pub use switchyard_proto::node::BreakerState as State;

/// Why a breaker changed state.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum Cause {
    /// Trip: at least `min_requests` calls in the window and a failure rate at or above
    /// `failure_rate_threshold`.
    FailureRate,
    /// Trip: `consecutive_timeouts` timeouts in a row.
    ConsecutiveTimeouts,
    /// Trip: a half-open probe failed; the cool-down doubles.
    ProbeFailed,
    /// Open → half-open: the cool-down has passed.
    CooldownElapsed,
    /// Half-open → closed: every probe succeeded.
    ProbesSucceeded,
    /// Open → half-open before the cool-down passed: no other entry of a chain could serve,
    /// so the executor forced a probe (docs/http-api.md, "Failover"). A forced probe that
    /// fails leaves the cool-down as it was: it never doubles it.
    ForcedProbe,
    /// Closed → open: the deployment is open for the fleet and this node is its prober, so
    /// it runs the open-breaker probes for every node.
    FleetOpen,
    /// Open or half-open → closed: another node's probe closed the deployment for the fleet.
    FleetClosed,
}

impl Cause {
    /// The wire name (`BreakerTransition.cause` in the node proto).
    pub fn as_str(self) -> &'static str {
        match self {
            Cause::FailureRate => "failure_rate",
            Cause::ConsecutiveTimeouts => "consecutive_timeouts",
            Cause::ProbeFailed => "probe_failed",
            Cause::CooldownElapsed => "cooldown_elapsed",
            Cause::ProbesSucceeded => "probe_succeeded",
            Cause::ForcedProbe => "forced_probe",
            Cause::FleetOpen => "fleet_open",
            Cause::FleetClosed => "fleet_closed",
        }
    }
}

/// One state change, for the control plane and the metrics.
#[derive(Clone, Debug, PartialEq)]
pub struct Transition {
    pub provider: String,
    pub upstream_model: String,
    pub from: State,
    pub to: State,
    pub cause: Cause,
    pub at: SystemTime,
    /// Over the window when the transition happened (0–1).
    pub failure_rate: f64,
    pub calls_in_window: u32,
    /// When the breaker will admit a probe; set only when `to` is [`State::Open`].
    pub next_probe: Option<SystemTime>,
    /// The cool-down in force: the one just started when opening, otherwise the one the next
    /// opening would use.
    pub cooldown: Duration,
    pub last_probe: Option<LastProbe>,
}

/// How a probe went: the breaker's outcome, or `Error` when the gateway could not make the
/// call (a request it could not build) and the breaker did not count it.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum ProbeOutcome {
    Success,
    Failure,
    Timeout,
    Error,
}

impl ProbeOutcome {
    pub fn of(outcome: Option<Outcome>) -> Self {
        match outcome {
            Some(Outcome::Success) => Self::Success,
            Some(Outcome::Failure) => Self::Failure,
            Some(Outcome::Timeout) => Self::Timeout,
            None => Self::Error,
        }
    }

    /// The wire name (`last_probe_outcome` in the node proto) and the metrics label.
    pub fn as_str(self) -> &'static str {
        match self {
            Self::Success => "success",
            Self::Failure => "failure",
            Self::Timeout => "timeout",
            Self::Error => "error",
        }
    }
}

/// A breaker's last probe, for `switchyard breakers`.
#[derive(Clone, Copy, Debug, PartialEq)]
pub struct LastProbe {
    /// When it started.
    pub at: SystemTime,
    pub outcome: ProbeOutcome,
    pub latency: Duration,
}

/// Why a probe is due.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum Due {
    /// Open with its cool-down passed, or half-open with a slot free.
    HalfOpen,
    /// Closed, and no real call (nor probe) for the probe's interval.
    Idle,
}

/// A breaker as it is now, for `ListBreakers` and `/metrics`.
#[derive(Clone, Debug, PartialEq)]
pub struct Snapshot {
    pub provider: String,
    pub upstream_model: String,
    /// The stored state: an open breaker whose cool-down has passed reads as open until the
    /// next call moves it to half-open.
    pub state: State,
    pub since: SystemTime,
    /// The cause of the last transition; `None` for a breaker that never changed state.
    pub cause: Option<Cause>,
    pub failure_rate: f64,
    pub calls_in_window: u32,
    /// Set while open.
    pub next_probe: Option<SystemTime>,
    pub cooldown: Duration,
    pub last_probe: Option<LastProbe>,
}

/// Whether a call may go upstream.
#[derive(Debug)]
pub enum Admission {
    Admitted(Permit),
    /// Skip this entry (`circuit_open`). `ready_at` is when it is due for a probe (in the past
    /// for a half-open breaker whose probes are all in flight): when no entry of a chain
    /// could serve, the executor forces probes on the rejected ones not `probed`, soonest
    /// first. A probed breaker's half-open test is the prober's, never a user request's.
    Rejected {
        ready_at: Instant,
        probed: bool,
    },
}

// === impl Breaker ===

pub struct Breaker {
    provider: String,
    upstream_model: String,
    // Held for a few comparisons at a time, never across an await. A panic elsewhere while
    // holding it leaves counters still coherent enough for a breaker (parking_lot's locks
    // are not poisoned); failing every request after it would be worse.
    inner: Mutex<Inner>,
}

struct Inner {
    policy: BreakerPolicy,
    state: State,
    since: Instant,
    cause: Option<Cause>,
    /// Last `window_size` outcomes, oldest first; `true` is a failure.
    window: VecDeque<bool>,
    failures: u32,
    timeouts_in_a_row: u32,
    /// Of the current or last opening; `None` once closed, so the next opening starts again
    /// at `cooldown_ms`.
    cooldown: Option<Duration>,
    /// When open: when the cool-down ends.
    ready_at: Instant,
    /// When half-open: probes admitted and not yet settled, and probes that succeeded.
    probes_in_flight: u32,
    probes_succeeded: u32,
    /// Bumped on every state change. A permit remembers the generation it was admitted in
    /// and its outcome counts only in that one: a call started before the breaker opened says
    /// nothing about the upstream since.
    generation: u64,
    /// The prober owns the half-open test (open probing, or the model's `probe`).
    probed: bool,
    /// Open probing: while open, a probe every this long (jittered), in place of the
    /// cool-down. `None`: the cool-down decides.
    open_interval: Option<Duration>,
    /// Half-open through a forced probe before the cool-down ended: the cool-down and its
    /// end as they were, restored if the probe fails (a forced probe never doubles it).
    forced_early: Option<(Duration, Instant)>,
    /// Idle probes count from the latest of: the last real call admitted, the last probe
    /// started, the moment probing began (so a node start or a catalog change does not
    /// probe everything at once). Written under the lock `try_acquire` holds anyway, so the
    /// request path pays nothing for it.
    idle_since: Instant,
    /// The last probe, and when it started (an `Instant`, for the idle clock).
    last_probe: Option<(Instant, ProbeOutcome, Duration)>,
    /// The fleet's word: open for every node until `until` (see [`FleetOpen`]).
    fleet: Option<FleetOpen>,
    /// The fleet opening (by its `since`) this node last took up as prober: it opens its
    /// own breaker once per opening, so that its own probe's closing is not undone before
    /// the control plane's word of it comes back.
    mirrored: Option<SystemTime>,
    /// Calls counted in the window since the last [`Breaker::take_window_report`], and
    /// failures among them: the control plane adds up the fleet's.
    unreported: (u32, u32),
}

/// A deployment the control plane says is open for the whole fleet.
#[derive(Clone, Debug, PartialEq)]
pub struct FleetOpen {
    /// When the first node opened it, and which.
    pub since: SystemTime,
    pub opened_by: String,
    /// The node that probes it for the fleet ("" while none is connected).
    pub prober: String,
    /// This node is the prober.
    pub probing: bool,
    /// Open for this node until then, unless the control plane says more: past it, the
    /// node's own breaker decides again.
    pub until: Instant,
}

impl Inner {
    /// The fleet's word while it holds and this node is not the prober (the prober goes by
    /// its own breaker, which it opened to probe).
    fn fleet_rejects(&self, now: Instant) -> Option<Instant> {
        self.fleet.as_ref().filter(|f| !f.probing && now < f.until).map(|f| f.until)
    }
}

impl Breaker {
    pub fn new(provider: &str, upstream_model: &str, policy: BreakerPolicy) -> Arc<Self> {
        let now = Instant::now();
        Arc::new(Self {
            provider: provider.to_owned(),
            upstream_model: upstream_model.to_owned(),
            inner: Mutex::new(Inner {
                window: VecDeque::with_capacity(policy.window_size as usize),
                policy,
                state: State::Closed,
                since: now,
                cause: None,
                failures: 0,
                timeouts_in_a_row: 0,
                cooldown: None,
                ready_at: now,
                probes_in_flight: 0,
                probes_succeeded: 0,
                generation: 0,
                probed: false,
                open_interval: None,
                forced_early: None,
                idle_since: now,
                last_probe: None,
                fleet: None,
                unreported: (0, 0),
                mirrored: None,
            }),
        })
    }

    pub fn provider(&self) -> &str {
        &self.provider
    }

    pub fn upstream_model(&self) -> &str {
        &self.upstream_model
    }

    /// Admit a call or reject it. An open breaker whose cool-down has passed turns half-open
    /// here (and says so in the transition).
    pub fn try_acquire(self: &Arc<Self>, now: Instant) -> (Admission, Option<Transition>) {
        let mut inner = self.inner.lock();
        // Open for the fleet: skipped like an open breaker whose prober is another node.
        if let Some(until) = inner.fleet_rejects(now) {
            return (Admission::Rejected { ready_at: until, probed: true }, None);
        }
        let mut transition = None;
        if inner.state == State::Open {
            if now < inner.ready_at || inner.probed {
                let ready_at = inner.ready_at;
                return (Admission::Rejected { ready_at, probed: inner.probed }, None);
            }
            transition =
                Some(self.transition(&mut inner, State::HalfOpen, Cause::CooldownElapsed, now));
        }
        let probed = inner.probed;
        let admission = match inner.state {
            State::Closed => Admission::Admitted(self.permit(&inner, Kind::Call, false)),
            State::HalfOpen => {
                if !probed && inner.has_free_slot() {
                    inner.probes_in_flight += 1;
                    Admission::Admitted(self.permit(&inner, Kind::Probe, false))
                } else {
                    Admission::Rejected { ready_at: inner.since, probed }
                }
            }
            // Turned half-open above.
            State::Open => Admission::Rejected { ready_at: inner.ready_at, probed },
        };
        if matches!(admission, Admission::Admitted(_)) {
            inner.idle_since = inner.idle_since.max(now);
        }
        (admission, transition)
    }

    /// Admit one call whatever the breaker says, unless a probe of it is in flight: no other
    /// entry of the chain could serve, and breakers alone never fail a request
    /// (docs/http-api.md, "Failover"). An open breaker turns half-open now and the call is
    /// its probe; a closed one (it closed meanwhile) takes it as an ordinary call. Concurrent
    /// forced probes are one probe: while one (or the prober's) is in flight, `None`. A
    /// forced probe that fails before the cool-down ended leaves the cool-down as it was.
    /// The permit reports itself as a probe in every case, as the attempt report does.
    pub fn force_probe(self: &Arc<Self>, now: Instant) -> Option<(Permit, Option<Transition>)> {
        let mut inner = self.inner.lock();
        // The prober owns this breaker's test (it may have since the request was turned
        // away), or a probe is in flight: concurrent forced probes are one probe.
        if inner.probed
            || (inner.state == State::HalfOpen && inner.probes_in_flight > 0)
            || inner.fleet_rejects(now).is_some()
        {
            return None;
        }
        let mut transition = None;
        if inner.state == State::Open {
            let early = now < inner.ready_at;
            let kept = (inner.cooldown_in_force(), inner.ready_at);
            let cause = if early { Cause::ForcedProbe } else { Cause::CooldownElapsed };
            transition = Some(self.transition(&mut inner, State::HalfOpen, cause, now));
            if early {
                inner.forced_early = Some(kept);
            }
        }
        let permit = match inner.state {
            State::Closed => self.permit(&inner, Kind::Call, true),
            _ => {
                inner.probes_in_flight += 1;
                self.permit(&inner, Kind::Probe, true)
            }
        };
        inner.idle_since = inner.idle_since.max(now);
        Some((permit, transition))
    }

    /// Whether the prober owns this breaker's half-open test, and how (`open_interval`: open
    /// probing's interval, `None` for a cool-down's end only). Turning probing on starts the
    /// idle clock now; an open breaker's next probe moves no later than one interval away.
    pub fn set_probed(&self, probed: bool, open_interval: Option<Duration>, now: Instant) {
        let mut inner = self.inner.lock();
        let open_interval = open_interval.filter(|_| probed);
        if inner.probed != probed && probed {
            inner.idle_since = inner.idle_since.max(now);
        }
        inner.probed = probed;
        if inner.open_interval != open_interval {
            inner.open_interval = open_interval;
            if let (State::Open, Some(interval)) = (inner.state, open_interval) {
                inner.ready_at = inner.ready_at.min(now + interval);
            }
        }
    }

    /// The calls counted in the window since the last report and the failures among them,
    /// when the control plane should hear of them: some failed, or the window still holds a
    /// failure (its successes then weigh against the failures). `None` for a clean window:
    /// a healthy fleet reports nothing.
    pub fn take_window_report(&self) -> Option<(u32, u32)> {
        let mut inner = self.inner.lock();
        let (calls, failures) = std::mem::take(&mut inner.unreported);
        (calls > 0 && (failures > 0 || inner.failures > 0)).then_some((calls, failures))
    }

    /// Lays the fleet's word over this breaker (`None`: the deployment is not open for the
    /// fleet, or the node has no fleet view).
    pub fn set_fleet(&self, fleet: Option<FleetOpen>) {
        self.inner.lock().fleet = fleet;
    }

    pub fn fleet(&self) -> Option<FleetOpen> {
        self.inner.lock().fleet.clone()
    }

    /// This node is the fleet's prober of an open deployment: its own breaker opens (if it
    /// is closed), so that its open-breaker probes (or, unprobed, its cool-down) test the
    /// deployment for every node.
    pub fn mirror_fleet(&self, now: Instant) -> Option<Transition> {
        let mut inner = self.inner.lock();
        let since = inner.fleet.as_ref().filter(|f| f.probing && now < f.until)?.since;
        if inner.mirrored == Some(since) {
            return None;
        }
        inner.mirrored = Some(since);
        (inner.state == State::Closed)
            .then(|| self.transition(&mut inner, State::Open, Cause::FleetOpen, now))
    }

    /// Another node's probe closed the deployment for the fleet at `at`: this node's own
    /// breaker closes too if it opened before then (one that opened since saw failures of
    /// its own after the closing, and stays open). A probe in flight here loses its slot.
    pub fn close_for_fleet(&self, at: SystemTime, now: Instant) -> Option<Transition> {
        let mut inner = self.inner.lock();
        let opened_before = wall(inner.since) <= at;
        (inner.state != State::Closed && opened_before)
            .then(|| self.transition(&mut inner, State::Closed, Cause::FleetClosed, now))
    }

    /// A permit for the prober's call, when one is due at `now` (see [`Due`]); `idle` is the
    /// probe's `interval_ms` for a model probed when idle, `None` for one probed only while
    /// open. An open breaker whose next probe is due turns half-open here and the probe
    /// holds its slot. The probe is no real call: it restarts the idle clock but does not
    /// count as the node's traffic.
    pub fn acquire_probe(
        self: &Arc<Self>,
        now: Instant,
        idle: Option<Duration>,
    ) -> Option<(Permit, Due, Option<Transition>)> {
        let mut inner = self.inner.lock();
        // Another node probes it for the fleet.
        if inner.fleet_rejects(now).is_some() {
            return None;
        }
        let mut transition = None;
        let (kind, due) = match inner.state {
            State::Open if now >= inner.ready_at => {
                transition =
                    Some(self.transition(&mut inner, State::HalfOpen, Cause::CooldownElapsed, now));
                (Kind::Probe, Due::HalfOpen)
            }
            State::Open => return None,
            State::HalfOpen if inner.has_free_slot() => (Kind::Probe, Due::HalfOpen),
            State::HalfOpen => return None,
            State::Closed if idle.is_some_and(|i| now >= inner.idle_since + i) => {
                (Kind::Call, Due::Idle)
            }
            State::Closed => return None,
        };
        if kind == Kind::Probe {
            inner.probes_in_flight += 1;
        }
        inner.idle_since = inner.idle_since.max(now);
        Some((self.permit(&inner, kind, false), due, transition))
    }

    pub fn snapshot(&self) -> Snapshot {
        let inner = self.inner.lock();
        Snapshot {
            provider: self.provider.clone(),
            upstream_model: self.upstream_model.clone(),
            state: inner.state,
            since: wall(inner.since),
            cause: inner.cause,
            failure_rate: inner.failure_rate(),
            calls_in_window: inner.calls(),
            next_probe: (inner.state == State::Open).then(|| wall(inner.ready_at)),
            cooldown: inner.cooldown_in_force(),
            last_probe: inner.last_probe(),
        }
    }

    /// Use `policy` from the next call on; the state, window and cool-down carry over. A
    /// smaller window drops its oldest outcomes.
    pub fn set_policy(&self, policy: BreakerPolicy) {
        let mut inner = self.inner.lock();
        if inner.policy != policy {
            inner.policy = policy;
            inner.trim_window();
        }
    }

    fn permit(self: &Arc<Self>, inner: &Inner, kind: Kind, forced: bool) -> Permit {
        Permit {
            breaker: Arc::clone(self),
            kind,
            forced,
            generation: inner.generation,
            settled: false,
        }
    }

    fn record(
        &self,
        kind: Kind,
        generation: u64,
        outcome: Outcome,
        now: Instant,
    ) -> Option<Transition> {
        let mut inner = self.inner.lock();
        if inner.generation != generation {
            return None;
        }
        match (kind, inner.state) {
            (Kind::Call, State::Closed) => {
                inner.push(outcome);
                let (calls, failures) = inner.unreported;
                inner.unreported = (
                    calls.saturating_add(1),
                    failures.saturating_add(u32::from(outcome != Outcome::Success)),
                );
                let cause = if inner.timeouts_in_a_row >= inner.policy.consecutive_timeouts {
                    // Checked first: the more specific cause when both hold.
                    Some(Cause::ConsecutiveTimeouts)
                } else if inner.calls() >= inner.policy.min_requests
                    && inner.failure_rate() >= inner.policy.failure_rate_threshold
                {
                    Some(Cause::FailureRate)
                } else {
                    None
                };
                cause.map(|cause| self.transition(&mut inner, State::Open, cause, now))
            }
            (Kind::Probe, State::HalfOpen) => {
                inner.probes_in_flight = inner.probes_in_flight.saturating_sub(1);
                if outcome != Outcome::Success {
                    return Some(self.transition(&mut inner, State::Open, Cause::ProbeFailed, now));
                }
                inner.probes_succeeded += 1;
                (inner.probes_succeeded >= inner.policy.half_open_probes).then(|| {
                    self.transition(&mut inner, State::Closed, Cause::ProbesSucceeded, now)
                })
            }
            // The generation pins the state a permit was admitted in.
            _ => None,
        }
    }

    /// A permit went away without an outcome (the client hung up): free its probe slot.
    fn abandon(&self, kind: Kind, generation: u64) {
        let mut inner = self.inner.lock();
        if kind == Kind::Probe && inner.generation == generation && inner.state == State::HalfOpen {
            inner.probes_in_flight = inner.probes_in_flight.saturating_sub(1);
            // A forced probe that went away: the next test is an ordinary half-open test.
            if inner.probes_in_flight == 0 {
                inner.forced_early = None;
            }
        }
    }

    fn transition(&self, inner: &mut Inner, to: State, cause: Cause, now: Instant) -> Transition {
        let from = inner.state;
        // Read before the window is cleared on closing: the report says what led here.
        let failure_rate = inner.failure_rate();
        let calls_in_window = inner.calls();
        let forced_early = inner.forced_early.take();
        match to {
            State::Open => {
                let (cooldown, ready_at) = match (forced_early, inner.open_interval) {
                    // A forced probe before the cool-down ended: the period stands.
                    (Some((cooldown, ready_at)), _) if from == State::HalfOpen => {
                        (cooldown, ready_at.max(now))
                    }
                    // Open probing: the next probe one interval on, never doubled.
                    (_, Some(interval)) => {
                        let interval = jittered(interval);
                        (interval, now + interval)
                    }
                    (_, None) => {
                        let cooldown = match inner.cooldown {
                            // Re-opening from half-open: twice the last, capped.
                            Some(last) if from == State::HalfOpen => {
                                (last * 2).min(Duration::from_millis(inner.policy.max_cooldown_ms))
                            }
                            _ => Duration::from_millis(inner.policy.cooldown_ms),
                        };
                        (cooldown, now + cooldown)
                    }
                };
                inner.cooldown = Some(cooldown);
                inner.ready_at = ready_at;
            }
            State::HalfOpen => {
                inner.probes_in_flight = 0;
                inner.probes_succeeded = 0;
            }
            State::Closed => {
                inner.cooldown = None;
                inner.window.clear();
                inner.failures = 0;
            }
        }
        inner.timeouts_in_a_row = 0;
        inner.state = to;
        inner.since = now;
        inner.cause = Some(cause);
        inner.generation += 1;
        Transition {
            provider: self.provider.clone(),
            upstream_model: self.upstream_model.clone(),
            from,
            to,
            cause,
            at: wall(now),
            failure_rate,
            calls_in_window,
            next_probe: (to == State::Open).then(|| wall(inner.ready_at)),
            cooldown: inner.cooldown_in_force(),
            last_probe: inner.last_probe(),
        }
    }
}

impl std::fmt::Debug for Breaker {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("Breaker")
            .field("provider", &self.provider)
            .field("upstream_model", &self.upstream_model)
            .field("state", &self.inner.lock().state)
            .finish()
    }
}

impl Inner {
    fn has_free_slot(&self) -> bool {
        self.probes_in_flight + self.probes_succeeded < self.policy.half_open_probes
    }

    fn last_probe(&self) -> Option<LastProbe> {
        self.last_probe.map(|(at, outcome, latency)| LastProbe { at: wall(at), outcome, latency })
    }

    fn push(&mut self, outcome: Outcome) {
        let failed = outcome != Outcome::Success;
        self.window.push_back(failed);
        self.failures += u32::from(failed);
        self.trim_window();
        if outcome == Outcome::Timeout {
            self.timeouts_in_a_row += 1;
        } else {
            self.timeouts_in_a_row = 0;
        }
    }

    fn trim_window(&mut self) {
        // A validated policy has window_size ≥ 1; keep at least the newest outcome anyway.
        let size = self.policy.window_size.max(1) as usize;
        while self.window.len() > size {
            if self.window.pop_front() == Some(true) {
                self.failures -= 1;
            }
        }
    }

    fn calls(&self) -> u32 {
        u32::try_from(self.window.len()).unwrap_or(u32::MAX)
    }

    fn failure_rate(&self) -> f64 {
        if self.window.is_empty() {
            0.0
        } else {
            f64::from(self.failures) / self.window.len() as f64
        }
    }

    fn cooldown_in_force(&self) -> Duration {
        self.cooldown.unwrap_or(Duration::from_millis(self.policy.cooldown_ms))
    }
}

/// An open probing interval with its jitter: uniform in [80 %, 100 %] of `interval`, so that
/// nodes opened by one outage do not probe in step, and a recovered model is never unused
/// for longer than one interval.
fn jittered(interval: Duration) -> Duration {
    interval.mul_f64(rand::random_range(0.8..=1.0))
}

/// The wall-clock time of `at`. Callers pass `Instant`s (tests build them without sleeping);
/// reports need wall time. One process-wide anchor maps one to the other consistently, so
/// `at` and `next_probe` of a transition are exactly the cool-down apart.
fn wall(at: Instant) -> SystemTime {
    static ANCHOR: OnceLock<(Instant, SystemTime)> = OnceLock::new();
    let (instant, system) = *ANCHOR.get_or_init(|| (Instant::now(), SystemTime::now()));
    match at.checked_duration_since(instant) {
        Some(later) => system + later,
        // Only instants from before the first report; saturate rather than panic.
        None => system.checked_sub(instant - at).unwrap_or(SystemTime::UNIX_EPOCH),
    }
}

// === impl Permit ===

#[derive(Clone, Copy, Debug, PartialEq, Eq)]
enum Kind {
    /// Admitted while closed; its outcome goes into the window.
    Call,
    /// Holds a half-open probe slot.
    Probe,
}

/// Leave to make one upstream call. Report how it went with [`Permit::record`]; dropping it
/// instead (the client went away) records nothing and frees a probe slot.
#[must_use = "record the call's outcome, or drop the permit if the call was abandoned"]
pub struct Permit {
    breaker: Arc<Breaker>,
    kind: Kind,
    forced: bool,
    generation: u64,
    settled: bool,
}

impl Permit {
    pub fn record(mut self, outcome: Outcome, now: Instant) -> Option<Transition> {
        self.settled = true;
        self.breaker.record(self.kind, self.generation, outcome, now)
    }

    /// Settles a probe's permit: `outcome` as [`Permit::record`] (`None`: not counted, as a
    /// dropped permit), and the probe, started at `started`, becomes the breaker's last.
    pub fn record_probe(
        mut self,
        outcome: Option<Outcome>,
        started: Instant,
        now: Instant,
    ) -> Option<Transition> {
        self.settled = true;
        let latency = now.saturating_duration_since(started);
        self.breaker.inner.lock().last_probe = Some((started, ProbeOutcome::of(outcome), latency));
        match outcome {
            Some(outcome) => self.breaker.record(self.kind, self.generation, outcome, now),
            None => {
                self.breaker.abandon(self.kind, self.generation);
                None
            }
        }
    }

    /// A half-open probe, or a call forced through by [`Breaker::force_probe`]; the attempt
    /// is reported with `probe: true`.
    pub fn is_probe(&self) -> bool {
        self.forced || self.kind == Kind::Probe
    }
}

impl Drop for Permit {
    fn drop(&mut self) {
        if !self.settled {
            self.breaker.abandon(self.kind, self.generation);
        }
    }
}

impl std::fmt::Debug for Permit {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("Permit")
            .field("provider", &self.breaker.provider)
            .field("upstream_model", &self.breaker.upstream_model)
            .field("probe", &self.is_probe())
            .finish()
    }
}

// === impl Breakers ===

/// The control plane's fleet view as a node holds it (the node proto's `FleetBreakers`).
#[derive(Clone, Debug, Default, PartialEq)]
pub struct FleetView {
    /// Deployments open for the fleet, by (provider, upstream model).
    pub open: HashMap<(String, String), FleetOpen>,
    /// Deployments a probe closed, and when: (provider, upstream model, at).
    pub closed: Vec<(String, String, SystemTime)>,
}

type Deployments = HashMap<(String, String), FleetOpen>;

/// Every breaker of the node, created on first use. Cloning shares the registry: the config
/// stream reads the breakers' window reports from its clone.
#[derive(Clone, Debug, Default)]
pub struct Breakers(Arc<Registry>);

#[derive(Debug, Default)]
pub struct Registry {
    // Nested so a hit looks up by borrowed `&str`s and allocates nothing; read on every
    // request, written once per new (provider, model).
    by_provider: RwLock<HashMap<String, HashMap<String, Arc<Breaker>>>>,
    /// The fleet's open deployments, for breakers created after the view arrived.
    fleet: Mutex<Deployments>,
}

impl std::ops::Deref for Breakers {
    type Target = Registry;

    fn deref(&self) -> &Registry {
        &self.0
    }
}

impl Breakers {
    pub fn new() -> Self {
        Self::default()
    }
}

impl Registry {
    /// Each breaker's [`Breaker::take_window_report`]: (provider, upstream model, calls,
    /// failures).
    pub fn window_reports(&self) -> Vec<(String, String, u32, u32)> {
        self.all()
            .iter()
            .filter_map(|b| {
                let (calls, failures) = b.take_window_report()?;
                Some((b.provider.clone(), b.upstream_model.clone(), calls, failures))
            })
            .collect()
    }

    /// The breaker of (`provider`, `upstream_model`), with `policy` (the catalog's, with the
    /// model's override applied) in force from its next call on.
    pub fn get(&self, provider: &str, upstream_model: &str, policy: BreakerPolicy) -> Arc<Breaker> {
        let found = self
            .by_provider
            .read()
            .get(provider)
            .and_then(|models| models.get(upstream_model))
            .cloned();
        if let Some(breaker) = found {
            breaker.set_policy(policy);
            return breaker;
        }
        let mut map = self.by_provider.write();
        // Another request may have created it between the two locks.
        let breaker = map
            .entry(provider.to_owned())
            .or_default()
            .entry(upstream_model.to_owned())
            .or_insert_with(|| {
                let breaker = Breaker::new(provider, upstream_model, policy);
                // Read under the registry's write lock: a view applied meanwhile either is
                // read here or reaches this breaker through `apply_fleet`'s walk after it.
                let key = (provider.to_owned(), upstream_model.to_owned());
                breaker.set_fleet(self.fleet.lock().get(&key).cloned());
                breaker
            });
        breaker.set_policy(policy);
        Arc::clone(breaker)
    }

    /// Takes in the control plane's fleet view (`None`: the node has none, cut off from the
    /// control plane or with `breaker_policy.fleet` off; every breaker goes by itself
    /// again). Returns the transitions of breakers it closed (a probe elsewhere closed their
    /// deployment), for the caller to report.
    pub fn apply_fleet(&self, view: Option<&FleetView>, now: Instant) -> Vec<Transition> {
        let open = view.map(|v| v.open.clone()).unwrap_or_default();
        // Before the walk: a breaker created meanwhile reads the new view.
        *self.fleet.lock() = open.clone();
        let all = self.all();
        for breaker in &all {
            let key = (breaker.provider.clone(), breaker.upstream_model.clone());
            breaker.set_fleet(open.get(&key).cloned());
        }
        let Some(view) = view else { return Vec::new() };
        let mut transitions = Vec::new();
        for (provider, upstream_model, at) in &view.closed {
            // Open for the fleet again since: that opening stands.
            if open.contains_key(&(provider.clone(), upstream_model.clone())) {
                continue;
            }
            let found =
                all.iter().find(|b| &b.provider == provider && &b.upstream_model == upstream_model);
            transitions.extend(found.and_then(|b| b.close_for_fleet(*at, now)));
        }
        transitions
    }

    /// Every breaker, in no particular order.
    pub fn all(&self) -> Vec<Arc<Breaker>> {
        self.by_provider.read().values().flat_map(|models| models.values().cloned()).collect()
    }

    /// Every breaker, sorted by provider then model.
    pub fn snapshots(&self) -> Vec<Snapshot> {
        // Each breaker's own lock is taken after the registry's is released.
        let mut snapshots: Vec<Snapshot> = self.all().iter().map(|b| b.snapshot()).collect();
        snapshots.sort_by(|a, b| {
            (&a.provider, &a.upstream_model).cmp(&(&b.provider, &b.upstream_model))
        });
        snapshots
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    fn policy() -> BreakerPolicy {
        BreakerPolicy {
            window_size: 10,
            min_requests: 4,
            failure_rate_threshold: 0.5,
            consecutive_timeouts: 3,
            cooldown_ms: 1_000,
            max_cooldown_ms: 3_000,
            half_open_probes: 1,
            fleet: true,
        }
    }

    fn ms(n: u64) -> Duration {
        Duration::from_millis(n)
    }

    fn admit(b: &Arc<Breaker>, now: Instant) -> Permit {
        match b.try_acquire(now).0 {
            Admission::Admitted(p) => p,
            Admission::Rejected { .. } => panic!("rejected at {now:?}"),
        }
    }

    fn is_rejected(b: &Arc<Breaker>, now: Instant) -> bool {
        matches!(b.try_acquire(now).0, Admission::Rejected { .. })
    }

    fn call(b: &Arc<Breaker>, outcome: Outcome, now: Instant) -> Option<Transition> {
        admit(b, now).record(outcome, now)
    }

    fn state(b: &Breaker) -> State {
        b.snapshot().state
    }

    /// Opens a breaker with `policy()` by failure rate at `t0`.
    fn opened(t0: Instant) -> Arc<Breaker> {
        let b = Breaker::new("openai", "gpt-5-nano", policy());
        for _ in 0..3 {
            assert!(call(&b, Outcome::Failure, t0).is_none());
        }
        assert!(call(&b, Outcome::Failure, t0).is_some());
        assert_eq!(state(&b), State::Open);
        b
    }

    #[test]
    fn opens_on_failure_rate_after_min_requests() {
        let t0 = Instant::now();
        let b = Breaker::new("openai", "gpt-5-nano", policy());
        call(&b, Outcome::Success, t0);
        call(&b, Outcome::Failure, t0);
        assert!(call(&b, Outcome::Success, t0).is_none());
        // Fourth call: min_requests reached, 2 of 4 failed = threshold.
        let t = call(&b, Outcome::Failure, t0).expect("opens");
        assert_eq!((t.from, t.to, t.cause), (State::Closed, State::Open, Cause::FailureRate));
        assert!(is_rejected(&b, t0));
    }

    #[test]
    fn does_not_open_below_min_requests() {
        let t0 = Instant::now();
        let b = Breaker::new("openai", "gpt-5-nano", policy());
        for _ in 0..3 {
            assert!(call(&b, Outcome::Failure, t0).is_none());
        }
        assert_eq!(state(&b), State::Closed);
        assert_eq!(b.snapshot().failure_rate, 1.0);
    }

    #[test]
    fn opens_on_consecutive_timeouts() {
        let t0 = Instant::now();
        let b = Breaker::new(
            "openai",
            "gpt-5-nano",
            BreakerPolicy { window_size: 20, min_requests: 20, ..policy() },
        );
        for _ in 0..6 {
            call(&b, Outcome::Success, t0);
        }
        call(&b, Outcome::Timeout, t0);
        call(&b, Outcome::Timeout, t0);
        // A plain failure breaks the row.
        call(&b, Outcome::Failure, t0);
        call(&b, Outcome::Timeout, t0);
        assert!(call(&b, Outcome::Timeout, t0).is_none());
        assert_eq!(state(&b), State::Closed);
        let t = call(&b, Outcome::Timeout, t0).expect("opens");
        assert_eq!(t.cause, Cause::ConsecutiveTimeouts);
        assert_eq!(t.to, State::Open);
    }

    #[test]
    fn open_rejects_until_cooldown() {
        let t0 = Instant::now();
        let b = opened(t0);
        match b.try_acquire(t0 + ms(999)) {
            (Admission::Rejected { ready_at, probed: false }, None) => {
                assert_eq!(ready_at, t0 + ms(1_000))
            }
            other => panic!("{other:?}"),
        }
        let (admission, t) = b.try_acquire(t0 + ms(1_000));
        let permit = match admission {
            Admission::Admitted(p) => p,
            Admission::Rejected { .. } => panic!("still open after the cool-down"),
        };
        assert!(permit.is_probe());
        let t = t.expect("open → half-open is reported");
        assert_eq!((t.from, t.to, t.cause), (State::Open, State::HalfOpen, Cause::CooldownElapsed));
    }

    #[test]
    fn half_open_admits_only_the_configured_probes() {
        let t0 = Instant::now();
        let b = opened(t0);
        b.set_policy(BreakerPolicy { half_open_probes: 2, ..policy() });
        let t1 = t0 + ms(1_000);
        let p1 = admit(&b, t1);
        let p2 = admit(&b, t1);
        assert!(p1.is_probe() && p2.is_probe());
        match b.try_acquire(t1).0 {
            // Due already: its probes are under way.
            Admission::Rejected { ready_at, .. } => assert_eq!(ready_at, t1),
            Admission::Admitted(_) => panic!("third probe admitted"),
        }
        // A success frees no slot for a third probe: two successes are all it needs.
        assert!(p1.record(Outcome::Success, t1).is_none());
        assert!(is_rejected(&b, t1));
        drop(p2);
    }

    #[test]
    fn closes_after_all_probes_succeed() {
        let t0 = Instant::now();
        let b = opened(t0);
        b.set_policy(BreakerPolicy { half_open_probes: 2, ..policy() });
        let t1 = t0 + ms(1_000);
        let p1 = admit(&b, t1);
        let p2 = admit(&b, t1);
        assert!(p1.record(Outcome::Success, t1).is_none());
        assert_eq!(state(&b), State::HalfOpen);
        let t = p2.record(Outcome::Success, t1).expect("closes");
        assert_eq!(
            (t.from, t.to, t.cause),
            (State::HalfOpen, State::Closed, Cause::ProbesSucceeded)
        );
        assert_eq!(t.next_probe, None);
        let s = b.snapshot();
        assert_eq!((s.state, s.calls_in_window), (State::Closed, 0), "window cleared");
        assert!(!admit(&b, t1).is_probe());
    }

    #[test]
    fn reopens_with_doubled_cooldown_capped_at_max() {
        let t0 = Instant::now();
        let b = opened(t0);
        let mut now = t0;
        let mut wait = ms(1_000);
        for expected in [2_000, 3_000, 3_000] {
            now += wait;
            assert!(is_rejected(&b, now - ms(1)));
            let t = call(&b, Outcome::Failure, now).expect("probe failure re-opens");
            assert_eq!((t.from, t.to, t.cause), (State::HalfOpen, State::Open, Cause::ProbeFailed));
            assert_eq!(t.cooldown, ms(expected));
            assert_eq!(t.next_probe, Some(t.at + ms(expected)));
            wait = ms(expected);
        }
    }

    #[test]
    fn cooldown_resets_after_closing() {
        let t0 = Instant::now();
        let b = opened(t0);
        let t1 = t0 + ms(1_000);
        call(&b, Outcome::Timeout, t1).expect("re-opens at 2 s");
        let t2 = t1 + ms(2_000);
        let closed = call(&b, Outcome::Success, t2).expect("closes");
        assert_eq!(closed.cooldown, ms(1_000));
        for _ in 0..3 {
            call(&b, Outcome::Failure, t2);
        }
        let t = call(&b, Outcome::Failure, t2).expect("opens again");
        assert_eq!(t.cooldown, ms(1_000));
        assert_eq!(t.next_probe, Some(t.at + ms(1_000)));
    }

    #[test]
    fn dropped_permit_frees_the_probe_slot() {
        let t0 = Instant::now();
        let b = opened(t0);
        let t1 = t0 + ms(1_000);
        let probe = admit(&b, t1);
        assert!(is_rejected(&b, t1));
        drop(probe);
        let s = b.snapshot();
        assert_eq!((s.state, s.cause), (State::HalfOpen, Some(Cause::CooldownElapsed)));
        let t = call(&b, Outcome::Success, t1).expect("the next probe closes it");
        assert_eq!(t.to, State::Closed);
        // A dropped call in the closed state leaves no trace in the window either.
        drop(admit(&b, t1));
        assert_eq!(b.snapshot().calls_in_window, 0);
    }

    #[test]
    fn force_probe_admits_when_open() {
        let t0 = Instant::now();
        let b = opened(t0);
        let (probe, t) = b.force_probe(t0 + ms(10)).expect("admitted");
        assert!(probe.is_probe());
        let t = t.expect("reported");
        assert_eq!((t.from, t.to, t.cause), (State::Open, State::HalfOpen, Cause::ForcedProbe));
        // It holds the only probe slot.
        assert!(is_rejected(&b, t0 + ms(10)));
        // Its failure re-opens the breaker, the cool-down as it was.
        let t = probe.record(Outcome::Failure, t0 + ms(20)).expect("re-opens");
        assert_eq!((t.to, t.cause, t.cooldown), (State::Open, Cause::ProbeFailed, ms(1_000)));
        // And its success closes it.
        let (probe, _) = b.force_probe(t0 + ms(30)).expect("admitted");
        let t = probe.record(Outcome::Success, t0 + ms(40)).expect("closes");
        assert_eq!(t.to, State::Closed);
        // Forced on a closed breaker: an ordinary call, still reported as a probe.
        let (probe, t) = b.force_probe(t0 + ms(50)).expect("admitted");
        assert!(t.is_none() && probe.is_probe());
        assert!(probe.record(Outcome::Failure, t0 + ms(50)).is_none());
        assert_eq!(b.snapshot().calls_in_window, 1);
    }

    #[test]
    fn policy_change_keeps_state() {
        let t0 = Instant::now();
        let breakers = Breakers::new();
        let b = breakers.get("openai", "gpt-5-nano", policy());
        for outcome in [Outcome::Success, Outcome::Success, Outcome::Failure] {
            call(&b, outcome, t0);
        }
        let lenient = BreakerPolicy { failure_rate_threshold: 0.9, ..policy() };
        assert!(Arc::ptr_eq(&b, &breakers.get("openai", "gpt-5-nano", lenient)));
        assert_eq!(b.snapshot().calls_in_window, 3, "window kept");
        // 2 of 4 would trip the old policy; the new one is in force from this call on.
        assert!(call(&b, Outcome::Failure, t0).is_none());
        // A smaller window drops the oldest outcomes (the two successes).
        breakers.get(
            "openai",
            "gpt-5-nano",
            BreakerPolicy { window_size: 2, min_requests: 2, ..lenient },
        );
        assert_eq!(b.snapshot().calls_in_window, 2);
        let t = call(&b, Outcome::Failure, t0).expect("2 of the last 2 failed");
        assert_eq!((t.failure_rate, t.calls_in_window), (1.0, 2));
        // An open breaker stays open, on the cool-down it started with.
        breakers.get("openai", "gpt-5-nano", BreakerPolicy { cooldown_ms: 60_000, ..lenient });
        assert_eq!(breakers.snapshots()[0].state, State::Open);
        assert!(is_rejected(&b, t0 + ms(999)));
        assert!(!is_rejected(&b, t0 + ms(1_000)));
    }

    #[test]
    fn transitions_report_cause_and_rate() {
        let t0 = Instant::now();
        let b = Breaker::new("anthropic", "claude-sonnet-4", policy());
        for outcome in [Outcome::Success, Outcome::Success, Outcome::Failure, Outcome::Success] {
            call(&b, outcome, t0);
        }
        call(&b, Outcome::Failure, t0);
        let t = call(&b, Outcome::Failure, t0).expect("3 of 6 failed");
        assert_eq!(t.provider, "anthropic");
        assert_eq!(t.upstream_model, "claude-sonnet-4");
        assert_eq!(
            (t.from.as_str(), t.to.as_str(), t.cause.as_str()),
            ("closed", "open", "failure_rate")
        );
        assert_eq!((t.failure_rate, t.calls_in_window), (0.5, 6));
        assert_eq!(t.cooldown, ms(1_000));
        assert_eq!(t.next_probe, Some(t.at + ms(1_000)));
        let s = b.snapshot();
        assert_eq!(
            (s.state, s.cause, s.next_probe, s.since),
            (State::Open, Some(Cause::FailureRate), t.next_probe, t.at)
        );
        let t = call(&b, Outcome::Success, t0 + ms(1_000)).expect("closes");
        assert_eq!(t.cause.as_str(), "probe_succeeded");
        // What led to closing is reported before the window is cleared.
        assert_eq!((t.failure_rate, t.calls_in_window), (0.5, 6));
    }

    #[test]
    fn the_window_slides_old_outcomes_fall_out() {
        let t0 = Instant::now();
        let b = Breaker::new("openai", "gpt-5-nano", BreakerPolicy { window_size: 4, ..policy() });
        // One failure short of tripping: 1 of 4.
        for outcome in [Outcome::Failure, Outcome::Success, Outcome::Success, Outcome::Success] {
            call(&b, outcome, t0);
        }
        // The old failure falls out as this one comes in: still 1 of 4.
        assert!(call(&b, Outcome::Failure, t0).is_none());
        let s = b.snapshot();
        assert_eq!((s.calls_in_window, s.failure_rate), (4, 0.25));
        // 2 of 4 trips.
        assert!(call(&b, Outcome::Failure, t0).is_some());
    }

    #[test]
    fn a_call_admitted_before_opening_does_not_count_after() {
        let t0 = Instant::now();
        let b = Breaker::new("openai", "gpt-5-nano", policy());
        let late = admit(&b, t0);
        for _ in 0..4 {
            call(&b, Outcome::Failure, t0);
        }
        let probe = admit(&b, t0 + ms(1_000));
        // The stale success neither closes the breaker nor uses the probe's slot.
        assert!(late.record(Outcome::Success, t0 + ms(1_000)).is_none());
        assert_eq!(state(&b), State::HalfOpen);
        assert!(probe.record(Outcome::Success, t0 + ms(1_000)).is_some());
    }

    #[test]
    fn registry_get_returns_one_breaker_per_provider_and_model() {
        let breakers = Breakers::new();
        let a = breakers.get("openai", "gpt-5-nano", policy());
        let b = breakers.get("azure", "gpt-5-nano", policy());
        let c = breakers.get("openai", "gpt-5", policy());
        assert!(Arc::ptr_eq(&a, &breakers.get("openai", "gpt-5-nano", policy())));
        assert!(!Arc::ptr_eq(&a, &b) && !Arc::ptr_eq(&a, &c));
        let names: Vec<_> = breakers
            .snapshots()
            .into_iter()
            .map(|s| format!("{}/{}", s.provider, s.upstream_model))
            .collect();
        assert_eq!(names, ["azure/gpt-5-nano", "openai/gpt-5", "openai/gpt-5-nano"]);
    }

    // === the prober's decisions ===

    const INTERVAL: Duration = Duration::from_millis(5_000);

    /// Probed when idle and at its cool-down's end (open probing off).
    fn probed(t0: Instant) -> Arc<Breaker> {
        let b = Breaker::new("openai", "gpt-5-nano", policy());
        b.set_probed(true, None, t0);
        b
    }

    fn probe_at(b: &Arc<Breaker>, now: Instant) -> Option<(Permit, Due)> {
        b.acquire_probe(now, Some(INTERVAL)).map(|(permit, due, _)| (permit, due))
    }

    #[test]
    fn an_idle_probe_is_due_an_interval_after_the_last_real_call_or_probe() {
        let t0 = Instant::now();
        let b = probed(t0);
        // Probing began at t0: nothing is due before one interval.
        assert!(probe_at(&b, t0 + ms(4_999)).is_none());
        // A real call restarts the idle clock.
        call(&b, Outcome::Success, t0 + ms(4_000));
        assert!(probe_at(&b, t0 + ms(8_999)).is_none());
        let (permit, due) = probe_at(&b, t0 + ms(9_000)).expect("idle for an interval");
        assert_eq!(due, Due::Idle);
        assert!(!permit.is_probe(), "a closed breaker's probe is an ordinary call for it");
        // The probe restarts the clock too, in flight or not: no second probe meanwhile.
        assert!(probe_at(&b, t0 + ms(9_001)).is_none());
        assert!(
            permit.record_probe(Some(Outcome::Success), t0 + ms(9_000), t0 + ms(9_020)).is_none()
        );
        assert!(probe_at(&b, t0 + ms(13_999)).is_none());
        assert!(probe_at(&b, t0 + ms(14_000)).is_some());
        // Its outcome went into the window like a real call's, and it is the last probe.
        let s = b.snapshot();
        assert_eq!(s.calls_in_window, 2);
        let last = s.last_probe.expect("recorded");
        assert_eq!((last.outcome, last.latency), (ProbeOutcome::Success, ms(20)));
        assert_eq!(last.at, wall(t0 + ms(9_000)));
    }

    #[test]
    fn an_open_breaker_is_due_for_a_probe_when_its_cooldown_has_passed() {
        let t0 = Instant::now();
        let b = probed(t0);
        for _ in 0..4 {
            call(&b, Outcome::Failure, t0);
        }
        assert_eq!(state(&b), State::Open);
        // Open is never idle: no probe before the cool-down, however long the quiet.
        assert!(b.acquire_probe(t0 + ms(999), Some(Duration::from_millis(1))).is_none());
        let (permit, due, t) = b.acquire_probe(t0 + ms(1_000), Some(INTERVAL)).expect("due");
        assert_eq!(due, Due::HalfOpen);
        assert!(permit.is_probe());
        let t = t.expect("open → half-open is reported");
        assert_eq!((t.from, t.to, t.cause), (State::Open, State::HalfOpen, Cause::CooldownElapsed));
        // Its one slot is taken: no second probe.
        assert!(probe_at(&b, t0 + ms(1_001)).is_none());
        drop(permit);
    }

    #[test]
    fn a_probe_holds_the_half_open_slot_and_user_requests_are_skipped() {
        let t0 = Instant::now();
        let b = probed(t0);
        for _ in 0..4 {
            call(&b, Outcome::Failure, t0);
        }
        // Due, but a user request does not turn it half-open: the prober does.
        match b.try_acquire(t0 + ms(1_500)) {
            (Admission::Rejected { probed: true, .. }, None) => {}
            other => panic!("{other:?}"),
        }
        assert_eq!(state(&b), State::Open);
        let (probe, _) = probe_at(&b, t0 + ms(1_500)).expect("due");
        // While it is in flight, user requests are skipped.
        assert!(is_rejected(&b, t0 + ms(1_600)));
        // It fails: open again, on the doubled cool-down, and it is the last probe.
        let t = probe.record_probe(Some(Outcome::Failure), t0 + ms(1_500), t0 + ms(1_700));
        let t = t.expect("re-opens");
        assert_eq!((t.to, t.cause, t.cooldown), (State::Open, Cause::ProbeFailed, ms(2_000)));
        let last = t.last_probe.expect("the transition carries the probe");
        assert_eq!((last.outcome, last.latency), (ProbeOutcome::Failure, ms(200)));
        assert!(is_rejected(&b, t0 + ms(3_700)), "skipped while open, due or not");
        // The next probe succeeds: closed, and user requests flow.
        let (probe, due) = probe_at(&b, t0 + ms(3_700)).expect("due again");
        assert_eq!(due, Due::HalfOpen);
        let t = probe.record_probe(Some(Outcome::Success), t0 + ms(3_700), t0 + ms(3_710));
        assert_eq!(t.map(|t| (t.to, t.cause)), Some((State::Closed, Cause::ProbesSucceeded)));
        assert!(!is_rejected(&b, t0 + ms(3_720)));
    }

    #[test]
    fn the_prober_sends_every_half_open_probe_one_after_another() {
        let t0 = Instant::now();
        let b = probed(t0);
        b.set_policy(BreakerPolicy { half_open_probes: 2, ..policy() });
        for _ in 0..4 {
            call(&b, Outcome::Failure, t0);
        }
        let (first, _) = probe_at(&b, t0 + ms(1_000)).expect("due");
        // User requests never take the second slot.
        assert!(is_rejected(&b, t0 + ms(1_000)));
        assert!(
            first.record_probe(Some(Outcome::Success), t0 + ms(1_000), t0 + ms(1_010)).is_none()
        );
        assert!(is_rejected(&b, t0 + ms(1_010)));
        let (second, due) = probe_at(&b, t0 + ms(1_010)).expect("the second slot is the prober's");
        assert_eq!(due, Due::HalfOpen);
        let t = second.record_probe(Some(Outcome::Success), t0 + ms(1_010), t0 + ms(1_020));
        assert_eq!(t.map(|t| t.to), Some(State::Closed));
    }

    #[test]
    fn a_probe_the_gateway_could_not_make_frees_its_slot_uncounted() {
        let t0 = Instant::now();
        let b = probed(t0);
        for _ in 0..4 {
            call(&b, Outcome::Failure, t0);
        }
        let (probe, _) = probe_at(&b, t0 + ms(1_000)).expect("due");
        assert!(probe.record_probe(None, t0 + ms(1_000), t0 + ms(1_001)).is_none());
        let s = b.snapshot();
        assert_eq!(s.state, State::HalfOpen);
        assert_eq!(s.last_probe.map(|p| p.outcome), Some(ProbeOutcome::Error));
        assert!(probe_at(&b, t0 + ms(1_002)).is_some(), "the slot is free again");
    }

    #[test]
    fn unprobed_again_a_user_request_takes_the_half_open_slot() {
        let t0 = Instant::now();
        let b = probed(t0);
        for _ in 0..4 {
            call(&b, Outcome::Failure, t0);
        }
        assert!(is_rejected(&b, t0 + ms(1_000)));
        b.set_probed(false, None, t0 + ms(1_000));
        match b.try_acquire(t0 + ms(1_000)) {
            (Admission::Admitted(p), Some(t)) => {
                assert!(p.is_probe());
                assert_eq!(t.to, State::HalfOpen);
            }
            other => panic!("{other:?}"),
        }
    }

    // === forced probes and open probing (a healthy fallback never waits on a dead model) ===

    #[test]
    fn a_forced_probe_never_doubles_the_cooldown_however_often_it_fails() {
        let t0 = Instant::now();
        let b = opened(t0);
        let ready_at = b.snapshot().next_probe.expect("open");
        // Twenty requests in a few milliseconds, each forcing a probe that fails.
        for i in 0..20 {
            let now = t0 + ms(i);
            let (probe, _) = b.force_probe(now).expect("admitted: none in flight");
            let t = probe.record(Outcome::Failure, now).expect("re-opens");
            assert_eq!((t.to, t.cooldown), (State::Open, ms(1_000)), "request {i}");
        }
        // The cool-down's end is where the first opening put it.
        assert_eq!(b.snapshot().next_probe, Some(ready_at));
        // Once it ended, a failed half-open test doubles it: once per cool-down period.
        let (probe, _) = b.force_probe(t0 + ms(1_000)).expect("admitted");
        let t = probe.record(Outcome::Failure, t0 + ms(1_000)).expect("re-opens");
        assert_eq!((t.cause, t.cooldown), (Cause::ProbeFailed, ms(2_000)));
    }

    #[test]
    fn concurrent_forced_probes_are_one_probe() {
        let t0 = Instant::now();
        let b = opened(t0);
        let (first, _) = b.force_probe(t0 + ms(10)).expect("admitted");
        // While it is in flight, no second forced probe goes upstream.
        assert!(b.force_probe(t0 + ms(11)).is_none());
        assert!(b.force_probe(t0 + ms(12)).is_none());
        let t = first.record(Outcome::Failure, t0 + ms(13)).expect("re-opens");
        assert_eq!(t.cooldown, ms(1_000));
        // Settled: the next request may force one again.
        assert!(b.force_probe(t0 + ms(14)).is_some());
    }

    #[test]
    fn a_breaker_the_prober_owns_is_never_forced_onto_a_request() {
        let t0 = Instant::now();
        let b = opened(t0);
        b.set_probed(true, Some(ms(5_000)), t0);
        assert!(b.force_probe(t0 + ms(10)).is_none());
        assert_eq!(state(&b), State::Open);
    }

    #[test]
    fn an_abandoned_forced_probe_leaves_the_next_failed_test_to_double_the_cooldown() {
        let t0 = Instant::now();
        let b = opened(t0);
        // Forced early, then the client went away: the permit is dropped unsettled.
        let (probe, _) = b.force_probe(t0 + ms(10)).expect("admitted");
        drop(probe);
        // The next test fails after the cool-down: an ordinary failed half-open test.
        let (probe, _) = b.force_probe(t0 + ms(1_000)).expect("admitted");
        let t = probe.record(Outcome::Failure, t0 + ms(1_000)).expect("re-opens");
        assert_eq!((t.cause, t.cooldown), (Cause::ProbeFailed, ms(2_000)));
    }

    fn open_probed(t0: Instant, interval: Duration) -> Arc<Breaker> {
        let b = Breaker::new("openai", "gpt-5-nano", policy());
        b.set_probed(true, Some(interval), t0);
        b
    }

    #[test]
    fn open_probing_tests_an_open_breaker_every_interval_without_doubling() {
        let t0 = Instant::now();
        // A cool-down far longer than the interval: the interval decides.
        let long = BreakerPolicy { cooldown_ms: 60_000, max_cooldown_ms: 300_000, ..policy() };
        let b = Breaker::new("openai", "gpt-5-nano", long);
        b.set_probed(true, Some(ms(5_000)), t0);
        for _ in 0..4 {
            call(&b, Outcome::Failure, t0);
        }
        let mut now = t0;
        for round in 0..10 {
            let s = b.snapshot();
            assert_eq!(s.state, State::Open, "round {round}");
            // Jittered in [80 %, 100 %] of the interval, never doubled.
            assert!((ms(4_000)..=ms(5_000)).contains(&s.cooldown), "round {round}: {s:?}");
            // A user request is never the test subject, even past the interval.
            assert!(is_rejected(&b, now + ms(5_000)), "round {round}");
            assert!(b.acquire_probe(now + s.cooldown - ms(1), None).is_none(), "round {round}");
            now += s.cooldown;
            let (probe, due, _) = b.acquire_probe(now, None).expect("due");
            assert_eq!(due, Due::HalfOpen);
            assert!(b.acquire_probe(now, None).is_none(), "one probe at a time");
            let t = probe.record(Outcome::Failure, now).expect("re-opens");
            assert_eq!(t.cause, Cause::ProbeFailed);
        }
    }

    #[test]
    fn open_probing_closes_a_recovered_model_within_one_interval_and_ignores_idleness() {
        let t0 = Instant::now();
        let b = open_probed(t0, ms(5_000));
        for _ in 0..4 {
            call(&b, Outcome::Failure, t0);
        }
        // Not due before 80 % of the interval, due at the interval.
        assert!(b.acquire_probe(t0 + ms(3_999), None).is_none());
        let (probe, _, t) = b.acquire_probe(t0 + ms(5_000), None).expect("due within one interval");
        assert_eq!(t.expect("half-open").to, State::HalfOpen);
        let t = probe.record(Outcome::Success, t0 + ms(5_010)).expect("closes");
        assert_eq!(t.to, State::Closed);
        // Closed and probed only while open: no idle probe, however long it stays unused.
        assert!(b.acquire_probe(t0 + ms(3_600_000), None).is_none());
    }

    // === the fleet's view ===

    fn fleet_open(prober: &str, probing: bool, until: Instant) -> FleetOpen {
        FleetOpen {
            since: SystemTime::UNIX_EPOCH,
            opened_by: "n1".into(),
            prober: prober.into(),
            probing,
            until,
        }
    }

    #[test]
    fn a_deployment_open_for_the_fleet_is_skipped_here_until_the_word_runs_out() {
        let t0 = Instant::now();
        // Open probing on, as by default; this node's own breaker never saw a failure.
        let b = open_probed(t0, ms(1_000));
        b.set_fleet(Some(fleet_open("n2", false, t0 + ms(5_000))));
        match b.try_acquire(t0 + ms(10)) {
            // Skipped like a breaker another node probes: never forced onto a request.
            (Admission::Rejected { ready_at, probed: true }, None) => {
                assert_eq!(ready_at, t0 + ms(5_000))
            }
            other => panic!("{other:?}"),
        }
        assert!(b.force_probe(t0 + ms(10)).is_none());
        assert!(b.acquire_probe(t0 + ms(10), Some(ms(1))).is_none(), "n2 probes, not this node");
        assert_eq!(state(&b), State::Closed, "its own breaker is left as it was");
        // Past the word with no news: its own breaker decides again.
        assert!(!is_rejected(&b, t0 + ms(5_000)));
        // And at once when the view is dropped (cut off from the control plane).
        b.set_fleet(Some(fleet_open("n2", false, t0 + ms(60_000))));
        assert!(is_rejected(&b, t0 + ms(5_001)));
        b.set_fleet(None);
        assert!(!is_rejected(&b, t0 + ms(5_001)));
    }

    #[test]
    fn only_the_prober_probes_an_open_deployment_and_it_opens_its_own_breaker_to_do_so() {
        let t0 = Instant::now();
        let interval = ms(1_000);
        // This node is the prober; its own breaker is closed.
        let prober = open_probed(t0, interval);
        prober.set_fleet(Some(fleet_open("me", true, t0 + ms(30_000))));
        let t = prober.mirror_fleet(t0).expect("opens its own breaker");
        assert_eq!((t.from, t.to, t.cause), (State::Closed, State::Open, Cause::FleetOpen));
        assert_eq!(t.cause.as_str(), "fleet_open");
        assert!(prober.mirror_fleet(t0 + ms(1)).is_none(), "once");
        // Its open-breaker probes run as its own would, every interval (jittered).
        assert!(prober.acquire_probe(t0 + ms(799), None).is_none());
        let (probe, due, _) = prober.acquire_probe(t0 + interval, None).expect("due");
        assert_eq!(due, Due::HalfOpen);
        let t = probe.record(Outcome::Success, t0 + interval).expect("closes");
        assert_eq!((t.to, t.cause), (State::Closed, Cause::ProbesSucceeded));
        // The fleet's word of its closing is still on its way: it stays closed.
        assert!(prober.mirror_fleet(t0 + interval + ms(250)).is_none());
        assert_eq!(state(&prober), State::Closed);
        // A new opening (a later `since`) is taken up again.
        let again = FleetOpen {
            since: SystemTime::UNIX_EPOCH + ms(1),
            ..fleet_open("me", true, t0 + ms(30_000))
        };
        prober.set_fleet(Some(again));
        assert!(prober.mirror_fleet(t0 + interval + ms(500)).is_some());

        // Another node, whose own breaker opened before it heard the fleet: its probes wait
        // while the fleet's prober is another node, and resume once it has no fleet view.
        let other = open_probed(t0, interval);
        for _ in 0..4 {
            call(&other, Outcome::Failure, t0);
        }
        other.set_fleet(Some(fleet_open("me", false, t0 + ms(30_000))));
        assert!(other.mirror_fleet(t0).is_none(), "not its prober");
        assert!(other.acquire_probe(t0 + ms(10_000), None).is_none());
        other.set_fleet(None);
        assert!(other.acquire_probe(t0 + ms(10_000), None).is_some(), "its own probing again");
    }

    #[test]
    fn a_probe_elsewhere_closes_breakers_that_opened_before_it_and_no_later_one() {
        let t0 = Instant::now();
        let breakers = Breakers::new();
        let before = breakers.get("azure-east", "gpt-4o", policy());
        for _ in 0..4 {
            call(&before, Outcome::Failure, t0);
        }
        let closing = wall(t0 + ms(2_000));
        let after = breakers.get("azure-west", "gpt-4o", policy());
        for _ in 0..4 {
            call(&after, Outcome::Failure, t0 + ms(3_000));
        }
        let view = FleetView {
            open: HashMap::new(),
            closed: vec![
                ("azure-east".into(), "gpt-4o".into(), closing),
                ("azure-west".into(), "gpt-4o".into(), closing),
            ],
        };
        let closed = breakers.apply_fleet(Some(&view), t0 + ms(3_100));
        assert_eq!(closed.len(), 1, "{closed:?}");
        assert_eq!(
            (closed[0].provider.as_str(), closed[0].to, closed[0].cause),
            ("azure-east", State::Closed, Cause::FleetClosed)
        );
        assert_eq!(state(&before), State::Closed);
        assert!(!is_rejected(&before, t0 + ms(3_100)), "serves again at once");
        assert_eq!(state(&after), State::Open, "failures after the closing stand");
        // The view again (it is resent whole): nothing more to close.
        assert!(breakers.apply_fleet(Some(&view), t0 + ms(3_200)).is_empty());
    }

    #[test]
    fn the_view_reaches_breakers_made_before_and_after_it_and_leaves_with_the_control_plane() {
        let t0 = Instant::now();
        let breakers = Breakers::new();
        let existing = breakers.get("azure-east", "gpt-4o", policy());
        let word = fleet_open("n2", false, t0 + ms(5_000));
        let view = FleetView {
            open: [
                (("azure-east".to_owned(), "gpt-4o".to_owned()), word.clone()),
                (("openai".to_owned(), "gpt-4o".to_owned()), word.clone()),
            ]
            .into(),
            closed: vec![],
        };
        assert!(breakers.apply_fleet(Some(&view), t0).is_empty());
        assert_eq!(existing.fleet(), Some(word.clone()));
        // First used after the view came: it takes the view in as it is made.
        let later = breakers.get("openai", "gpt-4o", policy());
        assert_eq!(later.fleet(), Some(word));
        assert!(is_rejected(&later, t0));
        let untouched = breakers.get("openai", "gpt-5", policy());
        assert!(!is_rejected(&untouched, t0));
        // Cut off: every breaker goes by itself.
        breakers.apply_fleet(None, t0);
        assert!(existing.fleet().is_none() && later.fleet().is_none());
        assert!(!is_rejected(&later, t0));
        assert!(breakers.get("azure-east", "gpt-4o", policy()).fleet().is_none());
    }

    #[test]
    fn window_reports_cover_calls_while_the_window_holds_a_failure_and_nothing_when_clean() {
        let t0 = Instant::now();
        let breakers = Breakers::new();
        let b = breakers.get("azure-east", "gpt-4o", policy());
        call(&b, Outcome::Success, t0);
        assert!(breakers.window_reports().is_empty(), "a clean window is not reported");
        call(&b, Outcome::Failure, t0);
        call(&b, Outcome::Success, t0);
        assert_eq!(breakers.window_reports(), [("azure-east".into(), "gpt-4o".into(), 2, 1)]);
        // The failure is still in the window: its successes go up too, once each.
        call(&b, Outcome::Success, t0);
        assert_eq!(breakers.window_reports(), [("azure-east".into(), "gpt-4o".into(), 1, 0)]);
        assert!(breakers.window_reports().is_empty());
    }
}
