//! Retries inside one attempt — the inner loop; failover is the outer one. Here: the policy
//! in force for one attempt, the decision "retry now or fail over", and the node's retry
//! budget, which keeps retries a bounded share of what the node sends upstream so that a
//! struggling provider is not hit with a storm of them (docs/catalog.md, "Retries").
//!
//! The executor drives the loop; this module does no I/O and reads no clock of its own.

use std::sync::LazyLock;
use std::sync::atomic::{AtomicU64, Ordering};
use std::time::{Duration, Instant};

use switchyard_backoff::Backoff;
use switchyard_catalog::FailoverReason;
use switchyard_catalog::catalog::{
    BACKOFF_MS_RANGE, MAX_BACKOFF_MS_MAX, MAX_RETRIES, MAX_RETRY_AFTER_MS_MAX, RetryOverride,
    RetryPolicy,
};

/// The policy's values where the catalog sets none.
static DEFAULTS: LazyLock<RetryPolicy> = LazyLock::new(RetryPolicy::default);

/// The budget counts over the last this many seconds.
pub const BUDGET_WINDOW_SECS: u32 = 10;

/// The retry policy of one attempt: the catalog's `retry_policy`, the model's `retry:` over
/// it, and the request's `redundancy.max_retries` over both.
#[derive(Clone, Copy, Debug, PartialEq)]
pub struct Policy {
    pub max_retries: u32,
    /// Whether each reason is retried, in [`FailoverReason::ALL`] order.
    on: [bool; FailoverReason::ALL.len()],
    pub backoff: Backoff,
    pub max_retry_after: Duration,
    pub budget: BudgetRule,
}

/// How many retries the node's budget allows: `ratio` of its requests over the window, plus
/// `min_per_sec` for each second of it.
#[derive(Clone, Copy, Debug, PartialEq)]
pub struct BudgetRule {
    pub ratio: f64,
    pub min_per_sec: u32,
}

impl Policy {
    /// Without a `retry_policy`, a model override or a request asking for retries there are
    /// none: a failed call fails its attempt. Fields left out take the policy's defaults.
    ///
    /// Values are clamped into their ranges: the control plane refuses a catalog outside
    /// them, so this only matters for a snapshot from a control plane with other limits,
    /// which must not make the node misbehave.
    pub fn resolve(
        global: Option<&RetryPolicy>,
        model: Option<&RetryOverride>,
        requested: Option<u32>,
    ) -> Policy {
        // Field by field, without building the merged policy: this runs for every attempt.
        let p = global.unwrap_or(&DEFAULTS);
        let configured = global.is_some() || model.is_some();
        let field = |o: Option<u64>, g: u64| o.unwrap_or(g);
        let max_retries = requested
            .or(model.and_then(|m| m.max_retries))
            .unwrap_or(if configured { p.max_retries } else { 0 });
        let on = model.and_then(|m| m.on.as_deref()).unwrap_or(&p.on);
        let base = field(model.and_then(|m| m.base_backoff_ms), p.base_backoff_ms)
            .clamp(BACKOFF_MS_RANGE.0, BACKOFF_MS_RANGE.1);
        let max = field(model.and_then(|m| m.max_backoff_ms), p.max_backoff_ms)
            .clamp(base, MAX_BACKOFF_MS_MAX);
        let max_retry_after = field(model.and_then(|m| m.max_retry_after_ms), p.max_retry_after_ms)
            .min(MAX_RETRY_AFTER_MS_MAX);
        let ratio = model.and_then(|m| m.budget_ratio).unwrap_or(p.budget_ratio);
        let ratio = if ratio.is_finite() { ratio.clamp(0.0, 1.0) } else { 0.0 };
        let min_per_sec = model.and_then(|m| m.budget_min_per_sec).unwrap_or(p.budget_min_per_sec);
        let mut mask = [false; FailoverReason::ALL.len()];
        for (slot, reason) in mask.iter_mut().zip(FailoverReason::ALL) {
            *slot = on.contains(&reason);
        }
        Policy {
            max_retries: max_retries.min(MAX_RETRIES),
            on: mask,
            backoff: Backoff::new(Duration::from_millis(base), Duration::from_millis(max)),
            max_retry_after: Duration::from_millis(max_retry_after),
            budget: BudgetRule { ratio, min_per_sec },
        }
    }

    pub fn retries_on(&self, reason: FailoverReason) -> bool {
        FailoverReason::ALL.iter().position(|r| *r == reason).is_some_and(|i| self.on[i])
    }
}

/// A failed call, as far as the retry decision cares.
#[derive(Clone, Copy, Debug)]
pub struct FailedCall {
    pub reason: FailoverReason,
    /// Whether another call could go differently (`failure::Code::retryable`).
    pub retryable: bool,
    /// The upstream's `Retry-After`, both forms already read as a wait.
    pub retry_after: Option<Duration>,
}

/// Why an attempt fails over instead of retrying.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum NoRetry {
    /// The reason is not in the retry `on`.
    NotInOn,
    /// Another call would fail the same way (a refused credential, a gateway bug).
    Futile,
    /// The attempt has made every retry its policy allows.
    Exhausted,
    /// The upstream asked for a wait beyond `max_retry_after_ms`.
    RetryAfterTooLong,
    /// The wait plus a fair minimum for the call does not fit what is left of the attempt's
    /// timeout and the chain's deadline.
    NoTimeLeft,
    /// The node's retry budget is spent.
    Budget,
    /// The model's circuit breaker is open.
    BreakerOpen,
}

impl NoRetry {
    pub fn as_str(self) -> &'static str {
        match self {
            Self::NotInOn => "not_in_on",
            Self::Futile => "futile",
            Self::Exhausted => "exhausted",
            Self::RetryAfterTooLong => "retry_after_too_long",
            Self::NoTimeLeft => "no_time_left",
            Self::Budget => "budget",
            Self::BreakerOpen => "breaker_open",
        }
    }
}

/// Whether retry number `retries` (0 for the first) may follow `failed`, and after what
/// wait: the upstream's `Retry-After` when it sent one, else full-jitter backoff. `left` is
/// what remains of the attempt (its timeout cut to the chain's deadline, and a stream's
/// first-token timeout); `fair_minimum` is the least a call is worth starting with. The
/// budget and the breaker are asked after this says yes.
pub fn decide(
    policy: &Policy,
    retries: u32,
    failed: FailedCall,
    left: Duration,
    fair_minimum: Duration,
) -> Result<Duration, NoRetry> {
    if !policy.retries_on(failed.reason) {
        return Err(NoRetry::NotInOn);
    }
    if !failed.retryable {
        return Err(NoRetry::Futile);
    }
    if retries >= policy.max_retries {
        return Err(NoRetry::Exhausted);
    }
    let wait = match failed.retry_after {
        Some(asked) if asked > policy.max_retry_after => return Err(NoRetry::RetryAfterTooLong),
        Some(asked) => asked,
        None => policy.backoff.delay(retries),
    };
    if wait.saturating_add(fair_minimum) > left {
        return Err(NoRetry::NoTimeLeft);
    }
    Ok(wait)
}

// === impl Budget ===

/// The node's retry budget: retries over the last [`BUDGET_WINDOW_SECS`] stay within
/// `ratio × requests + min_per_sec × BUDGET_WINDOW_SECS` over the same window, where
/// requests are the chat requests the node ran, one each however many attempts and retries
/// they made (neither failovers nor retries earn retries).
///
/// Lock-free: a ring of per-second counters, each tagged with its second, so a slot left
/// from an earlier lap reads as empty and is reset by the first count of its new second.
#[derive(Debug)]
pub struct Budget {
    epoch: Instant,
    requests: [Slot; BUDGET_WINDOW_SECS as usize],
    retries: [Slot; BUDGET_WINDOW_SECS as usize],
}

impl Default for Budget {
    fn default() -> Self {
        Self::new(Instant::now())
    }
}

impl Budget {
    pub fn new(epoch: Instant) -> Self {
        Self { epoch, requests: Default::default(), retries: Default::default() }
    }

    /// Counts one chat request.
    pub fn deposit(&self, now: Instant) {
        let second = self.second(now);
        slot(&self.requests, second).add(second);
    }

    /// Takes one retry from the budget, or says it is spent.
    pub fn try_withdraw(&self, rule: BudgetRule, now: Instant) -> bool {
        let second = self.second(now);
        // Count first, then check: two requests racing for the last retry cannot both
        // see it free; at worst both are refused.
        let counter = slot(&self.retries, second);
        counter.add(second);
        let retries = sum(&self.retries, second) as f64;
        let requests = sum(&self.requests, second) as f64;
        let allowance =
            rule.ratio * requests + f64::from(rule.min_per_sec) * f64::from(BUDGET_WINDOW_SECS);
        if retries <= allowance {
            true
        } else {
            counter.remove(second);
            false
        }
    }

    fn second(&self, now: Instant) -> u32 {
        // Wraps after 136 years of uptime; the tag comparison wraps with it.
        now.saturating_duration_since(self.epoch).as_secs() as u32
    }
}

fn slot(ring: &[Slot], second: u32) -> &Slot {
    &ring[(second % BUDGET_WINDOW_SECS) as usize]
}

fn sum(ring: &[Slot], second: u32) -> u64 {
    ring.iter().map(|s| s.count(second)).sum()
}

/// One second's count: the second in the high 32 bits, the count in the low 32.
#[derive(Debug, Default)]
struct Slot(AtomicU64);

impl Slot {
    fn add(&self, second: u32) {
        let _ = self.0.fetch_update(Ordering::AcqRel, Ordering::Acquire, |v| {
            Some(if tag(v) == second { v.saturating_add(1) } else { pack(second, 1) })
        });
    }

    fn remove(&self, second: u32) {
        let _ = self.0.fetch_update(Ordering::AcqRel, Ordering::Acquire, |v| {
            (tag(v) == second && count(v) > 0).then(|| v - 1)
        });
    }

    /// The count, if the slot holds a second of the window that ends at `now`.
    fn count(&self, now: u32) -> u64 {
        let v = self.0.load(Ordering::Acquire);
        if now.wrapping_sub(tag(v)) < BUDGET_WINDOW_SECS { count(v) } else { 0 }
    }
}

fn pack(second: u32, count: u32) -> u64 {
    (u64::from(second) << 32) | u64::from(count)
}

fn tag(v: u64) -> u32 {
    (v >> 32) as u32
}

fn count(v: u64) -> u64 {
    v & u64::from(u32::MAX)
}

#[cfg(test)]
mod tests {
    use std::time::{SystemTime, UNIX_EPOCH};

    use super::*;

    const FAIR: Duration = Duration::from_millis(1000);

    fn policy(max_retries: u32) -> Policy {
        Policy::resolve(Some(&RetryPolicy { max_retries, ..RetryPolicy::default() }), None, None)
    }

    fn failed(reason: FailoverReason, retry_after: Option<Duration>) -> FailedCall {
        FailedCall { reason, retryable: true, retry_after }
    }

    fn ms(n: u64) -> Duration {
        Duration::from_millis(n)
    }

    // === resolution ===

    #[test]
    fn without_a_policy_there_are_no_retries_unless_the_request_asks() {
        assert_eq!(Policy::resolve(None, None, None).max_retries, 0);
        let asked = Policy::resolve(None, None, Some(3));
        assert_eq!(asked, Policy { max_retries: 3, ..policy(1) }, "the defaults, three retries");
        assert_eq!(policy(1), Policy::resolve(Some(&RetryPolicy::default()), None, None));
    }

    #[test]
    fn the_request_lowers_or_raises_the_count_and_the_model_overrides_the_catalog() {
        let global = RetryPolicy { max_retries: 2, base_backoff_ms: 50, ..RetryPolicy::default() };
        assert_eq!(Policy::resolve(Some(&global), None, Some(0)).max_retries, 0);
        assert_eq!(Policy::resolve(Some(&global), None, Some(4)).max_retries, 4);
        let o = RetryOverride {
            max_retries: Some(3),
            on: Some(vec![FailoverReason::Timeout]),
            ..RetryOverride::default()
        };
        let p = Policy::resolve(Some(&global), Some(&o), None);
        assert_eq!(p.max_retries, 3);
        assert_eq!(p.backoff.base, ms(50), "unset override fields inherit the catalog's");
        assert!(p.retries_on(FailoverReason::Timeout));
        assert!(!p.retries_on(FailoverReason::ServerError));
        let alone = Policy::resolve(None, Some(&o), None);
        assert_eq!((alone.max_retries, alone.backoff.base), (3, ms(100)), "over the defaults");
    }

    #[test]
    fn resolution_agrees_with_the_catalogs_own_merge() {
        let global = RetryPolicy {
            max_retries: 3,
            on: vec![FailoverReason::RateLimit],
            base_backoff_ms: 20,
            max_backoff_ms: 400,
            max_retry_after_ms: 700,
            budget_ratio: 0.5,
            budget_min_per_sec: 4,
        };
        let o = RetryOverride {
            on: Some(vec![FailoverReason::Timeout, FailoverReason::ServerError]),
            max_backoff_ms: Some(900),
            budget_min_per_sec: Some(2),
            ..RetryOverride::default()
        };
        let merged = global.with_override(&o);
        assert_eq!(
            Policy::resolve(Some(&global), Some(&o), None),
            Policy::resolve(Some(&merged), None, None)
        );
    }

    #[test]
    fn defaults_retry_connection_errors_rate_limits_and_server_errors_but_not_timeouts() {
        let p = policy(1);
        assert!(p.retries_on(FailoverReason::ConnectionError));
        assert!(p.retries_on(FailoverReason::RateLimit));
        assert!(p.retries_on(FailoverReason::ServerError));
        assert!(!p.retries_on(FailoverReason::Timeout));
        assert_eq!(p.backoff, Backoff::new(ms(100), ms(2_000)));
        assert_eq!(p.max_retry_after, ms(10_000));
        assert_eq!(p.budget, BudgetRule { ratio: 0.2, min_per_sec: 10 });
    }

    #[test]
    fn out_of_range_values_are_clamped() {
        let wild = RetryPolicy {
            max_retries: 50,
            base_backoff_ms: 0,
            max_backoff_ms: 10_000_000,
            max_retry_after_ms: u64::MAX,
            budget_ratio: f64::NAN,
            ..RetryPolicy::default()
        };
        let p = Policy::resolve(Some(&wild), None, Some(9));
        assert_eq!(p.max_retries, MAX_RETRIES);
        assert_eq!(p.backoff, Backoff::new(ms(1), ms(MAX_BACKOFF_MS_MAX)));
        assert_eq!(p.max_retry_after, ms(MAX_RETRY_AFTER_MS_MAX));
        assert_eq!(p.budget.ratio, 0.0);
        let inverted = RetryPolicy { base_backoff_ms: 500, max_backoff_ms: 100, ..wild };
        assert_eq!(Policy::resolve(Some(&inverted), None, None).backoff.max, ms(500));
    }

    // === the decision ===

    /// Every way a failed call is or is not retried.
    #[test]
    fn retry_or_fail_over() {
        use FailoverReason as R;
        let p = Policy::resolve(
            Some(&RetryPolicy { max_retries: 2, max_retry_after_ms: 5_000, ..Default::default() }),
            None,
            None,
        );
        let long = Duration::from_secs(60);
        let futile = FailedCall { retryable: false, ..failed(R::ServerError, None) };
        type Want = Result<Option<Duration>, NoRetry>;
        let table: Vec<(&str, u32, FailedCall, Duration, Want)> = vec![
            ("503, time left", 0, failed(R::ServerError, None), long, Ok(None)),
            ("reset, time left", 1, failed(R::ConnectionError, None), long, Ok(None)),
            ("timeout is not in on", 0, failed(R::Timeout, None), long, Err(NoRetry::NotInOn)),
            ("a refused credential", 0, futile, long, Err(NoRetry::Futile)),
            ("retries used up", 2, failed(R::ServerError, None), long, Err(NoRetry::Exhausted)),
            (
                "Retry-After within the cap is the wait",
                0,
                failed(R::RateLimit, Some(ms(3_000))),
                long,
                Ok(Some(ms(3_000))),
            ),
            (
                "Retry-After at the cap",
                0,
                failed(R::RateLimit, Some(ms(5_000))),
                long,
                Ok(Some(ms(5_000))),
            ),
            (
                "Retry-After beyond the cap fails over now",
                0,
                failed(R::RateLimit, Some(ms(5_001))),
                long,
                Err(NoRetry::RetryAfterTooLong),
            ),
            (
                "Retry-After longer than what is left",
                0,
                failed(R::RateLimit, Some(ms(3_000))),
                ms(3_500),
                Err(NoRetry::NoTimeLeft),
            ),
            (
                "Retry-After plus the fair minimum just fits",
                0,
                failed(R::RateLimit, Some(ms(3_000))),
                ms(4_000),
                Ok(Some(ms(3_000))),
            ),
            (
                "less than the fair minimum left",
                0,
                failed(R::ServerError, None),
                ms(999),
                Err(NoRetry::NoTimeLeft),
            ),
        ];
        for (case, retries, call, left, want) in table {
            let got = decide(&p, retries, call, left, FAIR);
            match (got, want) {
                (Ok(wait), Ok(Some(exact))) => assert_eq!(wait, exact, "{case}"),
                (Ok(wait), Ok(None)) => {
                    assert!(wait <= p.backoff.ceiling(retries), "{case}: {wait:?}")
                }
                (got, want) => assert_eq!(got.map(Some), want, "{case}"),
            }
        }
    }

    #[test]
    fn a_policy_of_no_retries_never_retries() {
        let p = Policy::resolve(None, None, None);
        let got = decide(&p, 0, failed(FailoverReason::ServerError, None), ms(60_000), FAIR);
        assert_eq!(got, Err(NoRetry::Exhausted));
    }

    /// Both forms of `Retry-After`, read by the one parser, into the decision.
    #[test]
    fn retry_after_in_seconds_and_as_an_http_date() {
        // Sun, 06 Nov 1994 08:49:37 GMT, the example date of RFC 9110.
        let now = UNIX_EPOCH + Duration::from_secs(784_111_777);
        let seconds = switchyard_time::retry_after("4", now);
        let date = switchyard_time::retry_after("Sun, 06 Nov 1994 08:49:41 GMT", now);
        assert_eq!(seconds, Some(Duration::from_secs(4)));
        assert_eq!(date, Some(Duration::from_secs(4)));
        let past = switchyard_time::retry_after("Sun, 06 Nov 1994 08:49:00 GMT", now);
        assert_eq!(past, Some(Duration::ZERO), "a date in the past means now");
        assert_eq!(switchyard_time::retry_after("soon", now), None);

        let p = Policy::resolve(
            Some(&RetryPolicy { max_retry_after_ms: 3_000, ..Default::default() }),
            None,
            None,
        );
        let call = |retry_after| failed(FailoverReason::RateLimit, retry_after);
        let left = Duration::from_secs(30);
        assert_eq!(decide(&p, 0, call(seconds), left, FAIR), Err(NoRetry::RetryAfterTooLong));
        assert_eq!(decide(&p, 0, call(date), left, FAIR), Err(NoRetry::RetryAfterTooLong));
        let soon = switchyard_time::retry_after("Sun, 06 Nov 1994 08:49:39 GMT", now);
        assert_eq!(decide(&p, 0, call(soon), left, FAIR), Ok(Duration::from_secs(2)));
        assert_eq!(decide(&p, 0, call(past), left, FAIR), Ok(Duration::ZERO));
        let unparsable = switchyard_time::retry_after("soon", SystemTime::now());
        let wait = decide(&p, 0, call(unparsable), left, FAIR).unwrap();
        assert!(wait <= p.backoff.ceiling(0), "no usable Retry-After: backoff");
    }

    /// Full jitter: waits uniform in `[0, min(max, base × 2^n)]`.
    #[test]
    fn backoff_waits_are_spread_uniformly_up_to_the_ceiling() {
        let p = policy(5);
        let left = Duration::from_secs(60);
        let call = failed(FailoverReason::ServerError, None);
        for (retry, ceiling) in [(0, 100), (1, 200), (3, 800), (4, 1_600), (5, 2_000), (9, 2_000)] {
            assert_eq!(p.backoff.ceiling(retry), ms(ceiling), "retry {retry}");
        }
        for (retry, ceiling) in [(0, 100), (2, 400), (4, 1_600)] {
            let samples = 4_000;
            let mut quarters = [0u32; 4];
            let mut total = 0.0;
            for _ in 0..samples {
                let wait = decide(&p, retry, call, left, FAIR).unwrap();
                assert!(wait <= ms(ceiling), "retry {retry}: {wait:?} above {ceiling} ms");
                let share = wait.as_secs_f64() / ms(ceiling).as_secs_f64();
                quarters[((share * 4.0) as usize).min(3)] += 1;
                total += share;
            }
            let mean = total / f64::from(samples);
            assert!((0.45..0.55).contains(&mean), "retry {retry}: mean {mean} of the ceiling");
            for (i, n) in quarters.iter().enumerate() {
                let share = f64::from(*n) / f64::from(samples);
                assert!((0.20..0.30).contains(&share), "retry {retry}: quarter {i} has {share}");
            }
        }
    }

    // === the budget ===

    fn at(budget: &Budget, secs: f64) -> Instant {
        budget.epoch + Duration::from_secs_f64(secs)
    }

    fn withdrawals(budget: &Budget, rule: BudgetRule, now: Instant) -> u32 {
        let mut n = 0;
        while budget.try_withdraw(rule, now) {
            n += 1;
            assert!(n < 100_000, "the budget never ran out");
        }
        n
    }

    #[test]
    fn the_floor_allows_min_per_sec_for_each_second_of_the_window_with_no_requests() {
        let b = Budget::default();
        let rule = BudgetRule { ratio: 0.2, min_per_sec: 3 };
        assert_eq!(withdrawals(&b, rule, at(&b, 0.5)), 30);
        assert!(!b.try_withdraw(rule, at(&b, 9.9)), "spent for the whole window");
        assert_eq!(withdrawals(&b, rule, at(&b, 10.0)), 30, "refilled once they leave it");
    }

    #[test]
    fn retries_stay_within_the_ratio_of_requests_plus_the_floor() {
        let b = Budget::default();
        let rule = BudgetRule { ratio: 0.2, min_per_sec: 1 };
        for i in 0..500 {
            b.deposit(at(&b, f64::from(i) / 100.0));
        }
        // 0.2 × 500 + 1 × 10.
        assert_eq!(withdrawals(&b, rule, at(&b, 5.0)), 110);
        // At 10.5 s the requests of second 0 have left the window: 400 remain, 90 allowed.
        assert!(!b.try_withdraw(rule, at(&b, 9.5)));
        assert!(!b.try_withdraw(rule, at(&b, 10.5)));
        assert_eq!(withdrawals(&b, rule, at(&b, 12.5)), 0, "the retries at 5 s still count");
        assert_eq!(withdrawals(&b, rule, at(&b, 15.5)), 10, "only the floor once all left");
    }

    #[test]
    fn a_ratio_of_zero_leaves_only_the_floor() {
        let b = Budget::default();
        for _ in 0..1000 {
            b.deposit(at(&b, 0.0));
        }
        assert_eq!(withdrawals(&b, BudgetRule { ratio: 0.0, min_per_sec: 0 }, at(&b, 0.0)), 0);
    }

    #[test]
    fn concurrent_withdrawals_never_exceed_the_budget() {
        let b = std::sync::Arc::new(Budget::default());
        let rule = BudgetRule { ratio: 0.1, min_per_sec: 2 };
        let now = at(&b, 1.0);
        for _ in 0..1000 {
            b.deposit(now);
        }
        let threads: Vec<_> = (0..4)
            .map(|_| {
                let b = std::sync::Arc::clone(&b);
                std::thread::spawn(move || (0..200).filter(|_| b.try_withdraw(rule, now)).count())
            })
            .collect();
        let granted: usize = threads.into_iter().map(|t| t.join().unwrap()).sum();
        assert!(granted <= 120, "0.1 × 1000 + 2 × 10 = 120, granted {granted}");
        assert!(granted >= 100, "refusals under contention are rare: {granted}");
    }
}
