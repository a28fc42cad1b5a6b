//! A model's deployments (docs/catalog.md, "Deployments"): the order an attempt tries them
//! in — by weight, by latency, by load, or by the request's session — and the requests in
//! flight to each deployment and provider, with the caps on them (`max_concurrency`,
//! `adaptive`).
//!
//! Picking reads atomics only: the weighted rotation is one counter, and a deployment's load
//! (requests in flight, its latency average, its cap) lives in [`Load`], shared by every
//! config version through [`Loads`].

use std::collections::HashMap;
use std::hash::BuildHasher as _;
use std::sync::atomic::{AtomicU32, AtomicU64, Ordering};
use std::sync::{Arc, OnceLock};
use std::time::{Duration, Instant};

use parking_lot::RwLock;
use prometheus_client::metrics::counter::Counter;
use prometheus_client::metrics::gauge::Gauge;
use rand::Rng as _;

use switchyard_catalog::{Balance, Catalog, Model};

use crate::metrics::{DeploymentAttemptLabels, Metrics, UpstreamLabels};

/// Most deployments a model may list (`apply` refuses more): the members a request may use
/// are a bit set.
pub use switchyard_catalog::MAX_DEPLOYMENTS;

/// How fast the latency average follows new answers: each weighs this much.
const LATENCY_WEIGHT: f64 = 0.3;
/// A deployment nobody called for this long looks this much (1/e) cheaper, so one that was
/// slow once is tried again now and then rather than never.
const IDLE_DECAY: Duration = Duration::from_secs(10);

// === Pool ===

/// A model's deployments under one config version.
#[derive(Debug)]
pub struct Pool {
    pub balance: Balance,
    pub members: Box<[Member]>,
    /// `weighted`: request n takes `schedule[n mod len]`, a round of the weights (reduced by
    /// their greatest common divisor) laid out by smooth weighted round robin, so the shares
    /// are exact over each round and a deployment's turns are spread through it.
    schedule: Box<[u8]>,
    next: AtomicU64,
}

#[derive(Debug)]
pub struct Member {
    /// `<provider>/<upstream_model>`: reports, metrics and the CLI name it so.
    pub id: Arc<str>,
    /// The catalog model as this deployment serves it: its provider, upstream model and cap.
    pub model: Arc<Model>,
    pub weight: u32,
    /// The deployment's region, else its provider's: what keys' `allowed_regions` check.
    pub region: Option<String>,
    load: OnceLock<Arc<Load>>,
    /// `switchyard_deployment_attempts_total` of its served attempts: resolved once, as the
    /// request path counts one on almost every request.
    served: OnceLock<Counter>,
}

impl Member {
    /// Its load, looked up once per config version.
    pub fn load(&self, loads: &Loads) -> &Arc<Load> {
        self.load.get_or_init(|| loads.deployment(&self.model.provider, &self.id))
    }

    /// The counter of its attempts with `status` and `reason`.
    pub fn attempts(
        &self,
        metrics: &Metrics,
        status: &'static str,
        reason: &'static str,
    ) -> Counter {
        let labels = |status, reason| DeploymentAttemptLabels {
            model: self.model.name.clone(),
            deployment: self.id.to_string(),
            status,
            reason,
        };
        if status == "served" && reason.is_empty() {
            let served = self.served.get_or_init(|| {
                metrics.deployment_attempts.get_or_create(&labels(status, reason)).clone()
            });
            return served.clone();
        }
        metrics.deployment_attempts.get_or_create(&labels(status, reason)).clone()
    }
}

impl Pool {
    /// `model`'s pool, or `None` when a single provider serves it.
    pub fn of(catalog: &Catalog, model: &Model) -> Option<Pool> {
        if model.deployments.is_empty() {
            return None;
        }
        let members: Box<[Member]> = model
            .deployments
            .iter()
            .zip(model.deployment_models())
            .take(MAX_DEPLOYMENTS)
            .map(|(d, m)| Member {
                id: d.id().into(),
                region: d
                    .region
                    .clone()
                    .or_else(|| catalog.provider(&d.provider).and_then(|p| p.region.clone())),
                weight: d.weight.max(1),
                model: Arc::new(m),
                load: OnceLock::new(),
                served: OnceLock::new(),
            })
            .collect();
        Some(Pool {
            balance: model.balance,
            schedule: schedule(&members),
            next: AtomicU64::new(0),
            members,
        })
    }

    /// Every member, as a bit set.
    pub fn all(&self) -> u64 {
        if self.members.len() >= 64 { u64::MAX } else { (1u64 << self.members.len()) - 1 }
    }

    /// The order in which an attempt tries the members in `allowed`: the first is the pick,
    /// the rest are where a failure goes next. With a `session`, the session's own order
    /// (rendezvous hashing: each member's score for the session, highest first), so every
    /// node sends a session to the same deployment while it is healthy.
    pub fn order(&self, allowed: u64, session: Option<&str>, loads: &Loads, now: Instant) -> Order {
        let mut order = Order::default();
        for i in (0..self.members.len()).filter(|i| allowed & (1 << i) != 0) {
            order.items[order.len] = i as u8;
            order.len += 1;
        }
        let slice = &mut order.items[..order.len];
        if slice.len() < 2 {
            return order;
        }
        if let Some(session) = session {
            let score = |i: u8| rendezvous(session, &self.members[usize::from(i)]);
            slice.sort_by(|a, b| score(*b).total_cmp(&score(*a)));
            return order;
        }
        match self.balance {
            Balance::Weighted => {
                let n = self.next.fetch_add(1, Ordering::Relaxed);
                let first = self.schedule[(n % self.schedule.len() as u64) as usize];
                // The pick first, then the rest in catalog order from it.
                let at = slice.iter().position(|i| *i >= first).unwrap_or(0);
                slice.rotate_left(at);
            }
            Balance::LeastBusy => {
                // Ties go round, so equally idle deployments share the traffic.
                let start = self.next.fetch_add(1, Ordering::Relaxed) as usize % slice.len();
                slice.rotate_left(start);
                slice.sort_by_key(|i| self.load(usize::from(*i), loads).in_flight());
            }
            Balance::LeastLatency => {
                // Each member's cost read once, not once per comparison.
                let mut costs = [0f64; MAX_DEPLOYMENTS];
                for i in slice.iter() {
                    costs[usize::from(*i)] = self.load(usize::from(*i), loads).cost(now);
                }
                let cost = |i: u8| costs[usize::from(i)];
                // Power of two choices: two members at random, the cheaper first; then the
                // rest, cheapest first, for failover.
                let mut rng = rand::rng();
                let a = rng.random_range(0..slice.len());
                let mut b = rng.random_range(0..slice.len() - 1);
                if b >= a {
                    b += 1;
                }
                let first = if cost(slice[b]) < cost(slice[a]) { b } else { a };
                slice[..=first].rotate_right(1);
                slice[1..].sort_by(|x, y| cost(*x).total_cmp(&cost(*y)));
            }
        }
        order
    }

    /// The load of member `i`, looked up once per config version.
    pub fn load(&self, i: usize, loads: &Loads) -> &Arc<Load> {
        self.members[i].load(loads)
    }
}

/// The longest round `weighted` lays out; weights whose reduced sum is larger are scaled
/// down to fit (shares then within a fraction of a percent).
const SCHEDULE_MAX: u64 = 4096;

/// One round of smooth weighted round robin over `members`' weights: each step every member
/// gains its weight, the richest goes and pays the total.
fn schedule(members: &[Member]) -> Box<[u8]> {
    let g = members.iter().fold(0, |g, m| gcd(g, u64::from(m.weight)));
    let mut weights: Vec<u64> = members.iter().map(|m| u64::from(m.weight) / g.max(1)).collect();
    let total: u64 = weights.iter().sum();
    if total > SCHEDULE_MAX {
        for w in &mut weights {
            *w = (*w * SCHEDULE_MAX / total).max(1);
        }
    }
    let total: i64 = weights.iter().sum::<u64>() as i64;
    let mut current = vec![0i64; weights.len()];
    let mut round = Vec::with_capacity(total as usize);
    for _ in 0..total {
        for (c, w) in current.iter_mut().zip(&weights) {
            *c += *w as i64;
        }
        let (richest, _) = current
            .iter()
            .enumerate()
            .max_by_key(|(i, c)| (**c, std::cmp::Reverse(*i)))
            .unwrap_or((0, &0));
        current[richest] -= total;
        round.push(richest as u8);
    }
    if round.is_empty() {
        round.push(0);
    }
    round.into()
}

fn gcd(mut a: u64, mut b: u64) -> u64 {
    while b != 0 {
        (a, b) = (b, a % b);
    }
    a
}

/// Weighted rendezvous score of `member` for `session` (higher wins): `-w / ln(u)` for the
/// session and member's hash `u` in (0, 1), so a member's share of sessions follows its weight.
fn rendezvous(session: &str, member: &Member) -> f64 {
    // A fixed seed: every node of the fleet computes the same order.
    let hash = foldhash::fast::FixedState::with_seed(0x5717_c4a2).hash_one((session, &*member.id));
    let u = ((hash >> 11) as f64 + 0.5) / (1u64 << 53) as f64;
    -f64::from(member.weight) / u.ln()
}

/// The session a request names (docs/catalog.md, "Session affinity"): the first present of
/// `x-session-affinity` and the session headers Claude Code and Codex send.
pub fn session_key(headers: &http::HeaderMap) -> Option<&str> {
    ["x-session-affinity", "x-claude-code-session-id", "session-id"]
        .iter()
        .find_map(|name| headers.get(*name)?.to_str().ok())
        .map(str::trim)
        .filter(|s| !s.is_empty())
}

/// The members an attempt tries, in order: on the stack, a model has at most
/// [`MAX_DEPLOYMENTS`].
#[derive(Clone, Copy, Debug)]
pub struct Order {
    items: [u8; MAX_DEPLOYMENTS],
    len: usize,
}

impl Default for Order {
    fn default() -> Self {
        Self { items: [0; MAX_DEPLOYMENTS], len: 0 }
    }
}

impl Order {
    pub fn as_slice(&self) -> &[u8] {
        &self.items[..self.len]
    }

    pub fn iter(&self) -> impl Iterator<Item = usize> + '_ {
        self.as_slice().iter().map(|i| usize::from(*i))
    }
}

// === Load ===

/// Requests in flight to one deployment or provider, its latency, and its cap.
#[derive(Debug)]
pub struct Load {
    /// The gauge is the count: `switchyard_upstream_in_flight`.
    in_flight: Gauge,
    limit_gauge: Gauge,
    /// The cap in force: `max_concurrency`, or below it while `adaptive` backs off; 0 until
    /// the first capped request sets it.
    limit: AtomicU32,
    /// Answers since the cap last grew (AIMD's additive step: one per cap's worth).
    answered: AtomicU32,
    /// Decaying average of time to first byte, µs, as `f64` bits.
    latency: AtomicU64,
    /// When it was last fed, ms after `epoch`.
    fed_at: AtomicU64,
    epoch: Instant,
}

/// A cap on a load: `max_concurrency` and whether `adaptive` moves it.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub struct Cap {
    pub max: u32,
    pub adaptive: bool,
}

impl Cap {
    pub fn of(max_concurrency: Option<u32>, adaptive: bool) -> Option<Cap> {
        max_concurrency.map(|max| Cap { max: max.max(1), adaptive })
    }
}

/// What an answer tells the adaptive cap.
#[derive(Clone, Copy, Debug)]
pub enum Answered {
    /// Its first byte after this long.
    Ok(Duration),
    /// A 429: the provider wants fewer requests.
    RateLimited,
    /// Anything else: the cap is not moved by it.
    Other,
}

impl Load {
    fn new(in_flight: Gauge, limit_gauge: Gauge) -> Self {
        Self {
            in_flight,
            limit_gauge,
            limit: AtomicU32::new(0),
            answered: AtomicU32::new(0),
            latency: AtomicU64::new(0f64.to_bits()),
            fed_at: AtomicU64::new(0),
            epoch: Instant::now(),
        }
    }

    pub fn in_flight(&self) -> i64 {
        self.in_flight.get()
    }

    /// The cap now in force, if `cap` is set.
    pub fn limit(&self, cap: Cap) -> u32 {
        if !cap.adaptive {
            return cap.max;
        }
        match self.limit.load(Ordering::Relaxed) {
            0 => cap.max,
            l => l.min(cap.max),
        }
    }

    /// Counts a request in, unless `cap` is full: then `false`, and nothing is counted.
    pub fn enter(&self, cap: Option<Cap>) -> bool {
        let before = self.in_flight.inc();
        if let Some(cap) = cap {
            let limit = self.limit(cap);
            self.limit_gauge.set(i64::from(limit));
            if before >= i64::from(limit) {
                self.in_flight.dec();
                return false;
            }
        }
        true
    }

    fn leave(&self) {
        self.in_flight.dec();
    }

    /// Takes in an answer: its latency into the average, and with an adaptive `cap`, AIMD —
    /// a 429 or an answer over twice the average cuts the cap by a tenth (at least one), and
    /// each cap's worth of good answers raises it by one, up to `max_concurrency`.
    pub fn answered(&self, answered: Answered, cap: Option<Cap>, now: Instant) {
        let slow = match answered {
            Answered::Ok(latency) => {
                let sample = latency.as_secs_f64() * 1e6;
                let before = f64::from_bits(self.latency.load(Ordering::Relaxed));
                let next = if before == 0.0 {
                    sample
                } else {
                    before + LATENCY_WEIGHT * (sample - before)
                };
                self.latency.store(next.to_bits(), Ordering::Relaxed);
                self.fed_at.store(self.ms(now), Ordering::Relaxed);
                before > 0.0 && sample > 2.0 * before
            }
            Answered::RateLimited => true,
            Answered::Other => return,
        };
        let Some(cap) = cap.filter(|c| c.adaptive) else { return };
        let limit = self.limit(cap);
        let next = if slow {
            self.answered.store(0, Ordering::Relaxed);
            limit.saturating_sub((limit / 10).max(1)).max(1)
        } else if self.answered.fetch_add(1, Ordering::Relaxed) + 1 >= limit {
            self.answered.store(0, Ordering::Relaxed);
            (limit + 1).min(cap.max)
        } else {
            return;
        };
        self.limit.store(next, Ordering::Relaxed);
        self.limit_gauge.set(i64::from(next));
    }

    /// What `least_latency` compares: the latency average, fading while the deployment sits
    /// idle, times the requests in flight plus the one to send.
    pub fn cost(&self, now: Instant) -> f64 {
        let latency = f64::from_bits(self.latency.load(Ordering::Relaxed));
        let idle = self.ms(now).saturating_sub(self.fed_at.load(Ordering::Relaxed));
        let faded = latency * (-(idle as f64) / IDLE_DECAY.as_millis() as f64).exp();
        faded * (self.in_flight().max(0) + 1) as f64
    }

    fn ms(&self, now: Instant) -> u64 {
        now.saturating_duration_since(self.epoch).as_millis() as u64
    }
}

/// A request counted in flight at a deployment and its provider, until dropped.
#[derive(Debug, Default)]
pub struct Slot {
    loads: [Option<(Arc<Load>, Option<Cap>)>; 2],
}

impl Slot {
    /// Counts a request in at `deployment` (if tracked) and `provider` (if capped), each under
    /// its cap; `Err` names which cap was full, and nothing stays counted.
    pub fn take(
        deployment: Option<(Arc<Load>, Option<Cap>)>,
        provider: Option<(Arc<Load>, Cap)>,
    ) -> Result<Slot, Full> {
        let mut slot = Slot::default();
        if let Some((load, cap)) = deployment {
            if !load.enter(cap) {
                return Err(Full::Deployment);
            }
            slot.loads[0] = Some((load, cap));
        }
        if let Some((load, cap)) = provider {
            if !load.enter(Some(cap)) {
                return Err(Full::Provider);
            }
            slot.loads[1] = Some((load, Some(cap)));
        }
        Ok(slot)
    }

    /// Tells both loads how the call went (see [`Load::answered`]).
    pub fn answered(&self, answered: Answered, now: Instant) {
        for (load, cap) in self.loads.iter().flatten() {
            load.answered(answered, *cap, now);
        }
    }
}

impl Drop for Slot {
    fn drop(&mut self) {
        for (load, _) in self.loads.iter().flatten() {
            load.leave();
        }
    }
}

/// Which cap turned a request away.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum Full {
    Deployment,
    Provider,
}

// === Loads ===

/// Every load of the node, created on first use and kept across config versions (a cap
/// and a latency average describe the upstream, not the config).
pub struct Loads {
    metrics: Arc<Metrics>,
    /// By (provider, deployment id); a provider's own load has deployment "".
    by_key: RwLock<HashMap<(String, String), Arc<Load>>>,
}

impl std::fmt::Debug for Loads {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("Loads").finish_non_exhaustive()
    }
}

impl Loads {
    pub fn new(metrics: Arc<Metrics>) -> Self {
        Self { metrics, by_key: RwLock::default() }
    }

    pub fn deployment(&self, provider: &str, id: &str) -> Arc<Load> {
        self.get(provider, id)
    }

    pub fn provider(&self, provider: &str) -> Arc<Load> {
        self.get(provider, "")
    }

    fn get(&self, provider: &str, deployment: &str) -> Arc<Load> {
        let key = (provider.to_owned(), deployment.to_owned());
        if let Some(load) = self.by_key.read().get(&key) {
            return Arc::clone(load);
        }
        let labels = UpstreamLabels { provider: key.0.clone(), deployment: key.1.clone() };
        let mut map = self.by_key.write();
        let load = map.entry(key).or_insert_with(|| {
            Arc::new(Load::new(
                self.metrics.upstream_in_flight.get_or_create(&labels).clone(),
                self.metrics.upstream_concurrency_limit.get_or_create(&labels).clone(),
            ))
        });
        Arc::clone(load)
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    fn ordered(
        pool: &Pool,
        allowed: u64,
        session: Option<&str>,
        loads: &Loads,
        now: Instant,
    ) -> Vec<usize> {
        pool.order(allowed, session, loads, now).iter().collect()
    }

    fn pool(yaml: serde_json::Value) -> (Pool, Loads) {
        let catalog: Catalog = serde_json::from_value(serde_json::json!({
            "providers": [
                {"name": "a", "kind": "openai", "base_url": "https://a.example/v1", "region": "eu"},
                {"name": "b", "kind": "openai", "base_url": "https://b.example/v1", "region": "us"},
                {"name": "c", "kind": "openai", "base_url": "https://c.example/v1"}
            ],
            "models": [yaml]
        }))
        .unwrap();
        catalog.validate().unwrap();
        let pool = Pool::of(&catalog, &catalog.models[0]).unwrap();
        (pool, Loads::new(Arc::new(Metrics::default())))
    }

    fn three(balance: &str, weights: [u32; 3]) -> (Pool, Loads) {
        pool(serde_json::json!({
            "name": "m", "balance": balance,
            "deployments": [
                {"provider": "a", "upstream_model": "x", "weight": weights[0]},
                {"provider": "b", "upstream_model": "x", "weight": weights[1]},
                {"provider": "c", "upstream_model": "x", "weight": weights[2], "region": "ap"}
            ]
        }))
    }

    #[test]
    fn weighted_shares_are_exact_over_each_round_of_the_weights() {
        let (pool, loads) = three("weighted", [3, 1, 2]);
        let now = Instant::now();
        let mut counts = [0; 3];
        for _ in 0..600 {
            counts[ordered(&pool, pool.all(), None, &loads, now)[0]] += 1;
        }
        assert_eq!(counts, [300, 100, 200]);
        // Spread out, not in runs: the heaviest never takes a whole round's share in a row.
        let firsts: Vec<usize> =
            (0..6).map(|_| ordered(&pool, pool.all(), None, &loads, now)[0]).collect();
        assert!(firsts.windows(3).all(|w| w.iter().any(|i| *i != 0)), "{firsts:?}");
    }

    #[test]
    fn the_order_after_the_pick_holds_every_allowed_member_once() {
        let (pool, loads) = three("weighted", [1, 1, 1]);
        let now = Instant::now();
        for _ in 0..3 {
            let mut order = ordered(&pool, 0b101, None, &loads, now);
            assert_eq!(order.len(), 2);
            order.sort();
            assert_eq!(order, [0, 2], "a member the key may not use is never tried");
        }
        assert_eq!(pool.members[0].region.as_deref(), Some("eu"), "the provider's region");
        assert_eq!(pool.members[2].region.as_deref(), Some("ap"), "the deployment's own");
        assert_eq!(&*pool.members[1].id, "b/x");
        assert_eq!(pool.members[1].model.provider, "b");
    }

    #[test]
    fn a_session_keeps_its_deployment_and_moves_to_its_own_next_choice() {
        let (pool, loads) = three("least_busy", [1, 1, 1]);
        let now = Instant::now();
        let order = ordered(&pool, pool.all(), Some("session-1"), &loads, now);
        for _ in 0..20 {
            assert_eq!(ordered(&pool, pool.all(), Some("session-1"), &loads, now), order);
        }
        // Without its first choice, the session's second, every time.
        let without = pool.all() & !(1 << order[0]);
        assert_eq!(ordered(&pool, without, Some("session-1"), &loads, now)[0], order[1]);
        // Sessions spread over the deployments.
        let mut firsts = [0; 3];
        for s in 0..300 {
            firsts[ordered(&pool, pool.all(), Some(&format!("s{s}")), &loads, now)[0]] += 1;
        }
        assert!(firsts.iter().all(|n| *n > 50), "{firsts:?}");
    }

    #[test]
    fn least_busy_picks_the_fewest_in_flight() {
        let (pool, loads) = three("least_busy", [1, 1, 1]);
        let now = Instant::now();
        let busy: Vec<Slot> = [0, 0, 2]
            .iter()
            .map(|i| Slot::take(Some((Arc::clone(pool.load(*i, &loads)), None)), None).unwrap())
            .collect();
        for _ in 0..10 {
            assert_eq!(ordered(&pool, pool.all(), None, &loads, now)[0], 1);
        }
        drop(busy);
        assert_eq!(pool.load(0, &loads).in_flight(), 0, "a dropped slot leaves");
    }

    #[test]
    fn least_latency_avoids_the_slow_one_and_tries_it_again_once_it_has_been_idle() {
        let (pool, loads) = pool(serde_json::json!({
            "name": "m", "balance": "least_latency",
            "deployments": [{"provider": "a", "upstream_model": "x"}, {"provider": "b", "upstream_model": "x"}]
        }));
        let now = Instant::now();
        pool.load(0, &loads).answered(Answered::Ok(Duration::from_millis(100)), None, now);
        pool.load(1, &loads).answered(Answered::Ok(Duration::from_millis(500)), None, now);
        for _ in 0..20 {
            assert_eq!(ordered(&pool, pool.all(), None, &loads, now), [0, 1]);
        }
        // The fast one stays fed; the slow one fades while nobody calls it.
        let later = now + Duration::from_secs(30);
        pool.load(0, &loads).answered(Answered::Ok(Duration::from_millis(100)), None, later);
        assert_eq!(ordered(&pool, pool.all(), None, &loads, later)[0], 1);
    }

    #[test]
    fn a_full_cap_turns_away_and_counts_nothing() {
        let loads = Loads::new(Arc::new(Metrics::default()));
        let (d, p) = (loads.deployment("a", "a/x"), loads.provider("a"));
        let one = Some(Cap { max: 1, adaptive: false });
        let two = Cap { max: 2, adaptive: false };
        let take = |d: &Arc<Load>, cap| {
            Slot::take(Some((Arc::clone(d), cap)), Some((Arc::clone(&p), two)))
        };
        let held = take(&d, one).unwrap();
        assert_eq!(take(&d, one).unwrap_err(), Full::Deployment);
        let other = loads.deployment("a", "a/y");
        let second = take(&other, None).unwrap();
        assert_eq!(take(&other, None).unwrap_err(), Full::Provider);
        assert_eq!((d.in_flight(), other.in_flight(), p.in_flight()), (1, 1, 2));
        drop((held, second));
        assert_eq!((d.in_flight(), other.in_flight(), p.in_flight()), (0, 0, 0));
    }

    #[test]
    fn an_adaptive_cap_backs_off_on_429s_and_slowness_and_grows_back_to_its_max() {
        let load = Loads::new(Arc::new(Metrics::default())).deployment("a", "a/x");
        let max = Cap { max: 20, adaptive: true };
        let cap = Some(max);
        let now = Instant::now();
        let ok = Answered::Ok(Duration::from_millis(100));
        load.answered(ok, cap, now);
        assert_eq!(load.limit(max), 20);
        load.answered(Answered::RateLimited, cap, now);
        assert_eq!(load.limit(max), 18);
        load.answered(Answered::Ok(Duration::from_secs(1)), cap, now);
        assert_eq!(load.limit(max), 17, "an answer over twice the average");
        for _ in 0..100 {
            load.answered(Answered::RateLimited, cap, now);
        }
        assert_eq!(load.limit(max), 1, "never below one");
        for _ in 0..1000 {
            load.answered(ok, cap, now);
        }
        assert_eq!(load.limit(max), 20, "back up, never past max_concurrency");
        let fixed = Cap { max: 5, adaptive: false };
        load.answered(Answered::RateLimited, Some(fixed), now);
        assert_eq!(load.limit(fixed), 5, "a fixed cap stays");
    }
}
