//! A key's own limits, held for the whole fleet with no network call on the request path
//! (docs/limits.md has the design and its error bound).
//!
//! Each node counts what it admits for every limited key, per second (requests, tokens)
//! and per UTC day (tokens, micro-dollars), and sends its whole current window to its
//! control plane every [`REPORT_INTERVAL`]. The control plane answers with what every
//! *other* node used, per second, so a decision adds the node's own live counts to the
//! fleet's as of a moment ago. Two nodes deciding at once could each take all that is left;
//! so between two answers a node admits at most its share of what was left (its recent
//! share of the key's requests). A node that has heard nothing for [`STALE`] keeps counting
//! what it knew of the others and holds itself to an even share of the limit.

use std::collections::HashMap;
use std::sync::Arc;
use std::time::{Duration, Instant};

use parking_lot::{Mutex, RwLock};

use switchyard_catalog::Limits;
use switchyard_proto::node::v1 as pb;

/// How often a node sends its windows, and so how fresh its view of the others is.
pub const REPORT_INTERVAL: Duration = Duration::from_millis(100);
/// Between two views a node admits at most this many times its part of the limit's average
/// rate (`rpm / 60` per second, over the nodes using the key) ...
const BURST: f64 = 3.0;
/// ... or this many requests, or the whole limit if it is smaller.
const MIN_BURST: u64 = 10;
/// A view of the others older than this is no longer trusted for shares.
pub const STALE: Duration = Duration::from_secs(2);
const WINDOW_SECS: i64 = 60;
/// The traffic a node's share of what is left is measured on.
const RECENT_SECS: i64 = 10;
const SECONDS_PER_DAY: i64 = 86_400;
/// Seconds kept: the window and one more, so a report never misses the second that is
/// just leaving it.
const SLOTS: usize = 64;

/// Which limit a request met.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum Limit {
    Rpm,
    Tpm,
    TokensPerDay,
    UsdPerDay,
}

impl Limit {
    pub fn as_str(self) -> &'static str {
        match self {
            Limit::Rpm => "rpm",
            Limit::Tpm => "tpm",
            Limit::TokensPerDay => "tokens_per_day",
            Limit::UsdPerDay => "usd_per_day",
        }
    }

    /// The error code: a per-minute limit is a rate limit, a daily one a budget.
    pub fn code(self) -> &'static str {
        match self {
            Limit::Rpm | Limit::Tpm => "gateway_rate_limited",
            Limit::TokensPerDay | Limit::UsdPerDay => "budget_exceeded",
        }
    }
}

/// OpenAI's `x-ratelimit-*` values for a key with `rpm` or `tpm`.
#[derive(Clone, Debug, Default, PartialEq)]
pub struct RateHeaders {
    /// (limit, remaining, reset) for requests, then for tokens.
    pub requests: Option<(u64, u64, Duration)>,
    pub tokens: Option<(u64, u64, Duration)>,
}

// Names built at compile time: a limited key's every answer carries these.
const LIMIT_REQUESTS: http::HeaderName =
    http::HeaderName::from_static("x-ratelimit-limit-requests");
const REMAINING_REQUESTS: http::HeaderName =
    http::HeaderName::from_static("x-ratelimit-remaining-requests");
const RESET_REQUESTS: http::HeaderName =
    http::HeaderName::from_static("x-ratelimit-reset-requests");
const LIMIT_TOKENS: http::HeaderName = http::HeaderName::from_static("x-ratelimit-limit-tokens");
const REMAINING_TOKENS: http::HeaderName =
    http::HeaderName::from_static("x-ratelimit-remaining-tokens");
const RESET_TOKENS: http::HeaderName = http::HeaderName::from_static("x-ratelimit-reset-tokens");

impl RateHeaders {
    /// Writes the headers into `headers`, in OpenAI's names and formats.
    pub fn write(&self, headers: &mut http::HeaderMap) {
        let mut put = |names: [http::HeaderName; 3],
                       (limit, remaining, reset): (u64, u64, Duration)| {
            let [limit_name, remaining_name, reset_name] = names;
            headers.insert(limit_name, limit.into());
            headers.insert(remaining_name, remaining.into());
            if let Ok(v) = http::HeaderValue::from_str(&reset_text(reset)) {
                headers.insert(reset_name, v);
            }
        };
        if let Some(requests) = self.requests {
            put([LIMIT_REQUESTS, REMAINING_REQUESTS, RESET_REQUESTS], requests);
        }
        if let Some(tokens) = self.tokens {
            put([LIMIT_TOKENS, REMAINING_TOKENS, RESET_TOKENS], tokens);
        }
    }
}

/// `350ms`, `12s`, `1m0s`: the form OpenAI's reset headers take.
pub fn reset_text(d: Duration) -> String {
    let ms = d.as_millis();
    if ms < 1000 {
        format!("{ms}ms")
    } else if ms < 60_000 {
        format!("{}s", ms.div_ceil(1000))
    } else {
        let s = ms.div_ceil(1000);
        format!("{}m{}s", s / 60, s % 60)
    }
}

#[derive(Debug, PartialEq)]
pub enum Decision {
    Admitted(RateHeaders),
    Blocked { limit: Limit, retry_after: Duration, headers: RateHeaders },
}

#[derive(Default)]
struct Sums {
    requests: u64,
    tokens: u64,
    own_requests: u64,
    own_tokens: u64,
    oldest_request: Option<i64>,
    oldest_token: Option<i64>,
}

#[derive(Clone, Copy, Debug, Default)]
struct Slot {
    second: i64,
    requests: u64,
    tokens: u64,
}

struct KeyLedger {
    /// This node's seconds, indexed by `second % SLOTS`.
    own: [Slot; SLOTS],
    day: i64,
    day_tokens: u64,
    day_micro_usd: u64,
    /// Every other node's seconds and day, as of `state_at`.
    others: Vec<Slot>,
    others_day: i64,
    others_day_tokens: u64,
    others_day_micro_usd: u64,
    /// Other nodes using the key now, and their recent requests, as of `state_at`.
    other_nodes: u32,
    others_recent: u64,
    state_at: Option<Instant>,
    /// This node's share of what is left between two views, and the window's requests when
    /// the last view arrived.
    share: f64,
    requests_at_state: u64,
    admitted_since_state: u64,
    /// The key's daily budgets (micro-dollars, tokens) as of its last request, for
    /// [`Ledger::budget_use`].
    budgets: (Option<u64>, Option<u64>),
}

impl Default for KeyLedger {
    fn default() -> Self {
        Self {
            own: [Slot::default(); SLOTS],
            day: 0,
            day_tokens: 0,
            day_micro_usd: 0,
            others: Vec::new(),
            others_day: 0,
            others_day_tokens: 0,
            others_day_micro_usd: 0,
            other_nodes: 0,
            others_recent: 0,
            state_at: None,
            share: 1.0,
            requests_at_state: 0,
            admitted_since_state: 0,
            budgets: (None, None),
        }
    }
}

impl KeyLedger {
    fn own_slot(&mut self, second: i64) -> &mut Slot {
        let slot = &mut self.own[second.rem_euclid(SLOTS as i64) as usize];
        if slot.second != second {
            *slot = Slot { second, ..Slot::default() };
        }
        slot
    }

    fn roll_day(&mut self, day: i64) {
        if self.day != day {
            self.day = day;
            self.day_tokens = 0;
            self.day_micro_usd = 0;
        }
    }

    /// Seconds of the window ending at `now_s` (this node's, then the others').
    fn window(&self, now_s: i64) -> impl Iterator<Item = &Slot> {
        let live = move |s: &&Slot| s.second > now_s - WINDOW_SECS && s.second <= now_s;
        self.own.iter().filter(live).chain(self.others.iter().filter(live))
    }

    fn others_day(&self, day: i64) -> (u64, u64) {
        if self.others_day == day {
            (self.others_day_tokens, self.others_day_micro_usd)
        } else {
            (0, 0)
        }
    }

    /// When the window will hold less than `limit` of what `of` counts, at the earliest.
    fn room_in(&self, now_s: i64, used: u64, limit: u64, of: fn(&Slot) -> u64) -> Duration {
        let mut seconds: Vec<(i64, u64)> =
            self.window(now_s).map(|s| (s.second, of(s))).filter(|(_, n)| *n > 0).collect();
        seconds.sort_unstable();
        let mut left = used;
        for (second, n) in seconds {
            left = left.saturating_sub(n);
            if left < limit {
                let secs = (second + WINDOW_SECS - now_s).max(1);
                return Duration::from_secs(secs as u64);
            }
        }
        Duration::from_secs(1)
    }

    /// The window's totals, this node's part of them, and the oldest second that counts
    /// requests or tokens (for OpenAI's "reset" headers).
    fn sums(&self, now_s: i64) -> Sums {
        let mut w = Sums::default();
        let mut add = |s: &Slot, own: bool| {
            if s.second <= now_s - WINDOW_SECS || s.second > now_s {
                return;
            }
            w.requests += s.requests;
            w.tokens = w.tokens.saturating_add(s.tokens);
            if own {
                w.own_requests += s.requests;
                w.own_tokens = w.own_tokens.saturating_add(s.tokens);
            }
            if s.requests > 0 {
                w.oldest_request = Some(w.oldest_request.map_or(s.second, |o| o.min(s.second)));
            }
            if s.tokens > 0 {
                w.oldest_token = Some(w.oldest_token.map_or(s.second, |o| o.min(s.second)));
            }
        };
        self.own.iter().for_each(|s| add(s, true));
        self.others.iter().for_each(|s| add(s, false));
        w
    }
}

/// The node's counts and its view of the fleet, for every key with limits.
pub struct Ledger {
    keys: RwLock<HashMap<String, Arc<Mutex<KeyLedger>>>>,
    /// When the last view of the fleet arrived.
    viewed_at: Mutex<Option<Instant>>,
}

impl Default for Ledger {
    fn default() -> Self {
        Self::new()
    }
}

impl Ledger {
    pub fn new() -> Self {
        Self { keys: RwLock::new(HashMap::new()), viewed_at: Mutex::new(None) }
    }

    fn key(&self, key_id: &str) -> Arc<Mutex<KeyLedger>> {
        if let Some(k) = self.keys.read().get(key_id) {
            return Arc::clone(k);
        }
        let mut keys = self.keys.write();
        Arc::clone(keys.entry(key_id.to_owned()).or_default())
    }

    /// Decides a request of a key with `limits` at `now_ms` (Unix milliseconds); an admitted
    /// request is counted at once. `now` is the monotonic clock, for the view's age.
    pub fn admit(&self, key_id: &str, limits: &Limits, now_ms: i64, now: Instant) -> Decision {
        let now_s = now_ms.div_euclid(1000);
        let day = now_s.div_euclid(SECONDS_PER_DAY);
        let ledger = self.key(key_id);
        let mut k = ledger.lock();
        k.roll_day(day);
        k.budgets = (limits.micro_usd_per_day(), limits.tokens_per_day);
        let fresh = k.state_at.is_some_and(|at| now.duration_since(at) < STALE);
        // Cut off from the fleet, a node still counts what it last knew of the others (their
        // use only grows while it cannot hear of it), and holds itself to an even share of
        // the limit among the nodes it last knew of.
        let nodes = u64::from(k.other_nodes) + 1;
        let over = |used: u64, own: u64, limit: u64| {
            used >= limit || (!fresh && own >= limit.div_ceil(nodes))
        };

        // One pass over the window for every figure the decision and the headers need.
        let w = k.sums(now_s);
        let (requests, tokens) = (w.requests, w.tokens);
        let own_requests = w.own_requests;
        let reset = |oldest: Option<i64>| {
            oldest.map_or(Duration::ZERO, |s| {
                Duration::from_secs((s + WINDOW_SECS - now_s).max(0) as u64)
            })
        };
        let headers = RateHeaders {
            requests: limits
                .rpm
                .map(|rpm| (rpm, rpm.saturating_sub(requests + 1), reset(w.oldest_request))),
            tokens: limits.tpm.map(|tpm| (tpm, tpm.saturating_sub(tokens), reset(w.oldest_token))),
        };
        let until_midnight =
            Duration::from_millis(((day + 1) * SECONDS_PER_DAY * 1000 - now_ms).max(1000) as u64);
        let (others_tokens, others_micro_usd) = k.others_day(day);
        let blocked = |limit, retry_after| Decision::Blocked {
            limit,
            retry_after,
            headers: RateHeaders {
                requests: headers
                    .requests
                    .map(|(l, r, reset)| (l, r.min(l.saturating_sub(requests)), reset)),
                ..headers.clone()
            },
        };
        if let Some(budget) = limits.micro_usd_per_day()
            && over(k.day_micro_usd + others_micro_usd, k.day_micro_usd, budget)
        {
            return blocked(Limit::UsdPerDay, until_midnight);
        }
        if let Some(budget) = limits.tokens_per_day
            && over(k.day_tokens.saturating_add(others_tokens), k.day_tokens, budget)
        {
            return blocked(Limit::TokensPerDay, until_midnight);
        }
        if let Some(rpm) = limits.rpm {
            if over(requests, own_requests, rpm) {
                let retry = k.room_in(now_s, requests, rpm, |s| s.requests);
                return blocked(Limit::Rpm, retry);
            }
            // This node's share of what was left when the view arrived is spent: the rest
            // is the other nodes' until the next view (a tenth of a second away).
            // ... and never more than a burst of the limit's average rate: a view is up to a
            // few hundred ms old, and what the others admitted meanwhile is not in it, so
            // the faster every node may admit between views, the further past the limit a
            // fleet under load would go. Small limits may still be used in one go.
            let nodes = f64::from(k.other_nodes) + 1.0;
            let burst = (rpm as f64 * BURST * REPORT_INTERVAL.as_secs_f64() / 60.0 / nodes)
                .max(rpm.min(MIN_BURST) as f64);
            let allowance = (rpm.saturating_sub(k.requests_at_state) as f64 * k.share).min(burst);
            if fresh && k.admitted_since_state as f64 >= allowance {
                return blocked(Limit::Rpm, Duration::from_secs(1));
            }
        }
        if let Some(tpm) = limits.tpm
            && over(tokens, w.own_tokens, tpm)
        {
            let retry = k.room_in(now_s, tokens, tpm, |s| s.tokens);
            return blocked(Limit::Tpm, retry);
        }
        k.own_slot(now_s).requests += 1;
        k.admitted_since_state += 1;
        Decision::Admitted(headers)
    }

    /// What each key with a daily budget has used of it over the fleet today, as of this
    /// node's last view of the others: (key, `usd_per_day` or `tokens_per_day`, used ÷
    /// budget). Keys this node has had no request for since it started are not in it.
    pub fn budget_use(&self, now_ms: i64) -> Vec<(String, &'static str, f64)> {
        let day = now_ms.div_euclid(1000).div_euclid(SECONDS_PER_DAY);
        let keys = self.keys.read();
        let mut used = Vec::new();
        for (key_id, ledger) in keys.iter() {
            let k = ledger.lock();
            let (own_tokens, own_micro_usd) =
                if k.day == day { (k.day_tokens, k.day_micro_usd) } else { (0, 0) };
            let (others_tokens, others_micro_usd) = k.others_day(day);
            let (usd_budget, token_budget) = k.budgets;
            let ratio = |spent: u64, budget: u64| spent as f64 / budget.max(1) as f64;
            if let Some(budget) = usd_budget {
                let spent = own_micro_usd.saturating_add(others_micro_usd);
                used.push((key_id.clone(), Limit::UsdPerDay.as_str(), ratio(spent, budget)));
            }
            if let Some(budget) = token_budget {
                let spent = own_tokens.saturating_add(others_tokens);
                used.push((key_id.clone(), Limit::TokensPerDay.as_str(), ratio(spent, budget)));
            }
        }
        used
    }

    /// Counts what a served request used (its tokens, at its served model's prices). Free
    /// for keys without limits: they have no ledger.
    pub fn record(&self, key_id: &str, tokens: u64, micro_usd: u64, now_ms: i64) {
        let Some(ledger) = self.keys.read().get(key_id).map(Arc::clone) else {
            return;
        };
        let now_s = now_ms.div_euclid(1000);
        let mut k = ledger.lock();
        k.roll_day(now_s.div_euclid(SECONDS_PER_DAY));
        // Token counts come from upstream answers: they saturate, never wrap or panic.
        let slot = k.own_slot(now_s);
        slot.tokens = slot.tokens.saturating_add(tokens);
        k.day_tokens = k.day_tokens.saturating_add(tokens);
        k.day_micro_usd += micro_usd;
    }

    /// This node's current window and day for every key it counted. `None` when it counted
    /// nothing and its config has no key with limits (`limited`): there is then nothing to
    /// send nor a view to ask for. A node with limited keys reports even when idle, so that
    /// it learns what the others use before its first request.
    pub fn report(&self, boot_id: &str, now_ms: i64, limited: bool) -> Option<pb::LimitUsage> {
        let now_s = now_ms.div_euclid(1000);
        let day = now_s.div_euclid(SECONDS_PER_DAY);
        let keys = self.keys.read();
        if keys.is_empty() && !limited {
            return None;
        }
        let mut windows = Vec::with_capacity(keys.len());
        for (key_id, ledger) in keys.iter() {
            let k = ledger.lock();
            let slots: Vec<pb::LimitSlot> = k
                .own
                .iter()
                .filter(|s| s.second > now_s - WINDOW_SECS && (s.requests > 0 || s.tokens > 0))
                .map(|s| pb::LimitSlot { second: s.second, requests: s.requests, tokens: s.tokens })
                .collect();
            let today = k.day == day;
            windows.push(pb::KeyUsageWindow {
                key_id: key_id.clone(),
                slots,
                day,
                day_tokens: if today { k.day_tokens } else { 0 },
                day_micro_usd: if today { k.day_micro_usd } else { 0 },
            });
        }
        Some(pb::LimitUsage { boot_id: boot_id.to_owned(), keys: windows })
    }

    /// How old the last view of the fleet is (`/readyz` shows it); `None` before the first.
    pub fn view_age(&self, now: Instant) -> Option<Duration> {
        self.viewed_at.lock().map(|at| now.saturating_duration_since(at))
    }

    /// Takes the control plane's view of every other node, received at `now`.
    pub fn apply(&self, state: pb::LimitState, now_ms: i64, now: Instant) {
        *self.viewed_at.lock() = Some(now);
        let now_s = now_ms.div_euclid(1000);
        let shares: HashMap<&str, (u32, u64)> = state
            .shares
            .iter()
            .map(|s| (s.key_id.as_str(), (s.nodes, s.recent_requests)))
            .collect();
        let mut seen = std::collections::HashSet::new();
        for window in &state.others {
            seen.insert(window.key_id.clone());
            let ledger = self.key(&window.key_id);
            let mut k = ledger.lock();
            k.others = window
                .slots
                .iter()
                .map(|s| Slot { second: s.second, requests: s.requests, tokens: s.tokens })
                .collect();
            k.others_day = window.day;
            k.others_day_tokens = window.day_tokens;
            k.others_day_micro_usd = window.day_micro_usd;
            (k.other_nodes, k.others_recent) =
                shares.get(window.key_id.as_str()).copied().unwrap_or((0, 0));
            settle(&mut k, now_s, now);
        }
        // Keys nobody else used: the view is that the others used nothing.
        let keys = self.keys.read();
        for (key_id, ledger) in keys.iter() {
            if !seen.contains(key_id) {
                let mut k = ledger.lock();
                k.others.clear();
                k.others_day_tokens = 0;
                k.others_day_micro_usd = 0;
                k.other_nodes = 0;
                k.others_recent = 0;
                settle(&mut k, now_s, now);
            }
        }
    }

    /// Forgets keys that no longer have limits (their ledgers would only be reported).
    pub fn retain(&self, limited: impl Fn(&str) -> bool) {
        self.keys.write().retain(|k, _| limited(k));
    }
}

/// A fresh view: this node's share of what is left — its part of the key's recent traffic
/// among the nodes using it now, with one request's worth given to each so that a node that
/// has served none yet still gets some — and the window's requests when the view arrived.
fn settle(k: &mut KeyLedger, now_s: i64, now: Instant) {
    k.state_at = Some(now);
    k.admitted_since_state = 0;
    let own_recent: u64 = k
        .own
        .iter()
        .filter(|s| s.second > now_s - RECENT_SECS && s.second <= now_s)
        .map(|s| s.requests)
        .sum();
    let nodes = f64::from(k.other_nodes) + 1.0;
    k.share = (own_recent as f64 + 1.0) / ((own_recent + k.others_recent) as f64 + nodes);
    k.requests_at_state = k.window(now_s).map(|s| s.requests).sum();
}

/// `switchyard_key_budget_used_ratio{key, limit}` at `/metrics`: [`Ledger::budget_use`],
/// read at each scrape (so a new UTC day shows at once, before any request).
#[derive(Debug)]
pub struct BudgetCollector(pub Arc<Ledger>);

impl std::fmt::Debug for Ledger {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("Ledger").finish_non_exhaustive()
    }
}

#[derive(Clone, Debug, Hash, PartialEq, Eq, prometheus_client::encoding::EncodeLabelSet)]
struct BudgetLabels {
    /// The API key's id (never its secret): only keys with a daily budget.
    key: String,
    /// `usd_per_day` or `tokens_per_day`.
    limit: &'static str,
}

impl prometheus_client::collector::Collector for BudgetCollector {
    fn encode(
        &self,
        mut encoder: prometheus_client::encoding::DescriptorEncoder,
    ) -> Result<(), std::fmt::Error> {
        use prometheus_client::encoding::EncodeMetric;
        use prometheus_client::metrics::family::Family;
        use prometheus_client::metrics::gauge::Gauge;
        let family = Family::<BudgetLabels, Gauge<f64, std::sync::atomic::AtomicU64>>::default();
        for (key, limit, ratio) in self.0.budget_use(switchyard_time::now_ms()) {
            family.get_or_create(&BudgetLabels { key, limit }).set(ratio);
        }
        let metric = encoder.encode_descriptor(
            "key_budget_used_ratio",
            "What a key with a daily budget used of it over the fleet today, as of this node's last view (1 is the whole budget), by key and limit",
            None,
            family.metric_type(),
        )?;
        family.encode(metric)
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    const T0: i64 = 1_796_219_557_000; // a Unix millisecond mid-day

    fn rpm(n: u64) -> Limits {
        Limits { rpm: Some(n), ..Default::default() }
    }

    fn admitted(d: &Decision) -> bool {
        matches!(d, Decision::Admitted(_))
    }

    fn view(
        others: &[(i64, u64, u64)],
        nodes: u32,
        day_tokens: u64,
        day_micro_usd: u64,
    ) -> pb::LimitState {
        pb::LimitState {
            others: vec![pb::KeyUsageWindow {
                key_id: "k".into(),
                slots: others
                    .iter()
                    .map(|(second, requests, tokens)| pb::LimitSlot {
                        second: *second,
                        requests: *requests,
                        tokens: *tokens,
                    })
                    .collect(),
                day: T0 / 1000 / SECONDS_PER_DAY,
                day_tokens,
                day_micro_usd,
            }],
            shares: vec![pb::KeyShare {
                key_id: "k".into(),
                nodes,
                recent_requests: others.iter().filter(|o| o.0 > T0 / 1000 - 10).map(|o| o.1).sum(),
            }],
        }
    }

    #[test]
    fn a_lone_node_admits_up_to_the_limit_then_says_when_there_is_room() {
        let ledger = Ledger::new();
        let now = Instant::now();
        for i in 0..3 {
            let d = ledger.admit("k", &rpm(3), T0 + i * 10_000, now);
            assert!(admitted(&d), "{i}: {d:?}");
        }
        match ledger.admit("k", &rpm(3), T0 + 30_000, now) {
            Decision::Blocked { limit, retry_after, headers } => {
                assert_eq!(limit, Limit::Rpm);
                assert_eq!(limit.code(), "gateway_rate_limited");
                // The first request's second leaves the window 60 s after it: 30 s from now.
                assert_eq!(retry_after, Duration::from_secs(30));
                assert_eq!(headers.requests.map(|(l, r, _)| (l, r)), Some((3, 0)));
            }
            other => panic!("{other:?}"),
        }
        assert!(admitted(&ledger.admit("k", &rpm(3), T0 + 60_001, now)), "room again");
    }

    #[test]
    fn what_the_other_nodes_used_counts_and_a_node_takes_only_its_share_between_views() {
        let ledger = Ledger::new();
        let now = Instant::now();
        let s = T0 / 1000;
        ledger.apply(view(&[(s - 5, 50, 0)], 1, 0, 0), T0, now);
        // 10 left; this node has served nothing, the other one 50: its share is 1/52 of
        // what is left, so one request until the next view.
        assert!(admitted(&ledger.admit("k", &rpm(60), T0, now)));
        assert!(!admitted(&ledger.admit("k", &rpm(60), T0, now)));
        // A fresh view (nobody else used more) lets it go on, never past the limit.
        let mut total = 1;
        for _ in 0..100 {
            ledger.apply(view(&[(s - 5, 50, 0)], 1, 0, 0), T0, now);
            while admitted(&ledger.admit("k", &rpm(60), T0, now)) {
                total += 1;
            }
        }
        assert_eq!(total, 10);
        let d = ledger.admit("k", &rpm(60), T0, now);
        assert!(matches!(d, Decision::Blocked { limit: Limit::Rpm, .. }), "{d:?}");
    }

    #[test]
    fn between_views_a_node_takes_its_share_of_what_is_left_in_bursts() {
        let now = Instant::now();
        let burst = |limit: u64| {
            let ledger = Ledger::new();
            ledger.apply(view(&[], 1, 0, 0), T0, now);
            (0..10_000).filter(|_| admitted(&ledger.admit("k", &rpm(limit), T0, now))).count()
        };
        // Two idle nodes: half of what is left each, but at most three times the node's part
        // of the average rate per view (6000 rpm over 2 nodes: 15 per tenth of a second) ...
        assert_eq!(burst(6000), 15);
        // ... or 10, or a small limit whole (its half here, by the share).
        assert_eq!(burst(60), 10);
        assert_eq!(burst(4), 2);
    }

    #[test]
    fn cut_off_from_the_fleet_a_node_holds_to_an_even_share() {
        let ledger = Ledger::new();
        let then = Instant::now();
        ledger.apply(view(&[], 2, 0, 0), T0, then);
        let later = then + STALE + Duration::from_millis(1);
        let n = (0..100).filter(|_| admitted(&ledger.admit("k", &rpm(60), T0, later))).count();
        assert_eq!(n, 20, "a third of 60 for one of three nodes");
    }

    #[test]
    fn tokens_and_dollars_count_what_served_and_budgets_wait_for_midnight() {
        let ledger = Ledger::new();
        let now = Instant::now();
        let tpm = Limits { tpm: Some(100), ..Default::default() };
        assert!(admitted(&ledger.admit("k", &tpm, T0, now)));
        ledger.record("k", 100, 0, T0);
        let d = ledger.admit("k", &tpm, T0 + 1000, now);
        assert!(matches!(d, Decision::Blocked { limit: Limit::Tpm, .. }), "{d:?}");

        let usd = Limits { usd_per_day: Some(1.0), ..Default::default() };
        ledger.apply(view(&[], 1, 0, 600_000), T0, now);
        assert!(admitted(&ledger.admit("k", &usd, T0, now)));
        ledger.record("k", 10, 400_000, T0);
        match ledger.admit("k", &usd, T0, now) {
            Decision::Blocked { limit, retry_after, .. } => {
                assert_eq!((limit, limit.code()), (Limit::UsdPerDay, "budget_exceeded"));
                let midnight = (T0 / 1000 / SECONDS_PER_DAY + 1) * SECONDS_PER_DAY * 1000;
                assert_eq!(retry_after, Duration::from_millis((midnight - T0) as u64));
            }
            other => panic!("{other:?}"),
        }
        // Keys without limits have no ledger: recording for them is a no-op.
        ledger.record("free", 10, 10, T0);
        assert!(ledger.report("b", T0, false).unwrap().keys.iter().all(|k| k.key_id != "free"));
    }

    #[test]
    fn reports_carry_the_window_and_the_day() {
        let ledger = Ledger::new();
        assert!(ledger.report("b", T0, false).is_none(), "nothing to say");
        assert_eq!(ledger.report("b", T0, true).unwrap().keys.len(), 0, "idle, but limited keys");
        let now = Instant::now();
        ledger.admit("k", &rpm(10), T0 - 61_000, now);
        ledger.admit("k", &rpm(10), T0, now);
        ledger.record("k", 7, 3, T0);
        let r = ledger.report("b", T0, false).unwrap();
        let k = &r.keys[0];
        assert_eq!(k.slots.len(), 1, "the second 61 s ago has left the window");
        assert_eq!((k.slots[0].requests, k.slots[0].tokens), (1, 7));
        assert_eq!((k.day_tokens, k.day_micro_usd), (7, 3));
    }

    #[test]
    fn reset_headers_read_like_openais() {
        assert_eq!(reset_text(Duration::from_millis(350)), "350ms");
        assert_eq!(reset_text(Duration::from_millis(11_200)), "12s");
        assert_eq!(reset_text(Duration::from_secs(60)), "1m0s");
        let h = RateHeaders { requests: Some((60, 59, Duration::from_secs(1))), tokens: None };
        let mut headers = http::HeaderMap::new();
        h.write(&mut headers);
        let got: Vec<(String, String)> =
            headers.iter().map(|(k, v)| (k.to_string(), v.to_str().unwrap().to_owned())).collect();
        assert_eq!(
            got,
            [
                ("x-ratelimit-limit-requests".to_owned(), "60".to_owned()),
                ("x-ratelimit-remaining-requests".to_owned(), "59".to_owned()),
                ("x-ratelimit-reset-requests".to_owned(), "1s".to_owned()),
            ]
        );
    }

    #[test]
    fn budget_use_is_the_fleets_spend_over_each_daily_budget_and_resets_at_midnight() {
        let ledger = Ledger::new();
        let now = Instant::now();
        let limits =
            Limits { usd_per_day: Some(1.0), tokens_per_day: Some(1000), ..Default::default() };
        assert!(admitted(&ledger.admit("k", &limits, T0, now)));
        ledger.record("k", 100, 300_000, T0);
        // The other nodes spent 600,000 micro-dollars and 800 tokens today.
        ledger.apply(view(&[], 1, 800, 600_000), T0, now);
        let mut used = ledger.budget_use(T0);
        used.sort_by(|a, b| a.1.cmp(b.1));
        assert_eq!(
            used,
            vec![("k".to_owned(), "tokens_per_day", 0.9), ("k".to_owned(), "usd_per_day", 0.9)]
        );
        // A key with only a per-minute limit has no daily budget to show.
        assert!(admitted(&ledger.admit("m", &rpm(10), T0, now)));
        assert!(ledger.budget_use(T0).iter().all(|(key, _, _)| key != "m"));
        // The next UTC day starts at nothing spent, before any request of it.
        let tomorrow = T0 + SECONDS_PER_DAY * 1000;
        assert!(ledger.budget_use(tomorrow).iter().all(|(_, _, ratio)| *ratio == 0.0));
    }
}
