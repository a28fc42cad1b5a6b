//! The fleet's view of keys with limits (docs/limits.md): the latest windows of every node
//! (and of every earlier run of a node), gathered from this replica's node streams and,
//! through the store, from every other replica's; and, for the node that just reported,
//! what all the others used.
//!
//! Windows are whole (a node sends its full last minute and day, never deltas), so an entry
//! is replaced, never added to: a resend or a node that moved to another replica cannot be
//! counted twice — when two replicas hold the same (node, run), the newer wins.

use std::collections::{BTreeMap, HashMap};
use std::sync::Arc;
use std::sync::atomic::{AtomicBool, Ordering};
use std::time::Duration;

use parking_lot::Mutex;
use serde::{Deserialize, Serialize};
use tracing::{debug, warn};

use switchyard_proto::node::v1 as pb;
use switchyard_time::now_ms;

use crate::layout::Layout;
use crate::store::{EventKind, LeaseId, Store};

/// How often this replica publishes its nodes' windows for the other replicas.
pub const PUBLISH_INTERVAL: Duration = Duration::from_millis(100);
const WINDOW_SECS: i64 = 60;
const SECONDS_PER_DAY: i64 = 86_400;
/// An entry not refreshed for this long is dropped (its node stopped, or moved on).
const KEEP_MS: i64 = 65_000;

/// One node run's window for one key, as stored for the other replicas.
#[derive(Clone, Debug, Default, PartialEq, Serialize, Deserialize)]
pub struct KeyWindow {
    pub key_id: String,
    /// (Unix second, requests, tokens).
    pub slots: Vec<(i64, u64, u64)>,
    pub day: i64,
    pub day_tokens: u64,
    pub day_micro_usd: u64,
}

impl KeyWindow {
    fn from_pb(w: pb::KeyUsageWindow) -> Self {
        Self {
            key_id: w.key_id,
            slots: w.slots.into_iter().map(|s| (s.second, s.requests, s.tokens)).collect(),
            day: w.day,
            day_tokens: w.day_tokens,
            day_micro_usd: w.day_micro_usd,
        }
    }
}

/// One node run's windows.
#[derive(Clone, Debug, PartialEq, Serialize, Deserialize)]
pub struct RunWindows {
    pub node_id: String,
    pub boot_id: String,
    pub at_unix_ms: i64,
    pub keys: Vec<KeyWindow>,
    /// Its node stream ended: its seconds still count, but it takes no share.
    #[serde(default)]
    pub ended: bool,
}

/// What one key used over the fleet (or part of it), as of now.
#[derive(Clone, Debug, Default, PartialEq)]
pub struct KeyTotals {
    /// Second → (requests, tokens), within the window.
    pub seconds: BTreeMap<i64, (u64, u64)>,
    pub day_tokens: u64,
    pub day_micro_usd: u64,
    /// Node runs alive (reported in the last [`ALIVE_MS`]) that used the key in the last
    /// [`RECENT_SECS`], and the requests they admitted then.
    pub active_runs: u32,
    pub recent_requests: u64,
}

/// A run that reported this recently is alive (nodes report every 100 ms).
const ALIVE_MS: i64 = 2_000;
/// The traffic a node's share is measured on.
const RECENT_SECS: i64 = 10;

impl KeyTotals {
    pub fn requests(&self) -> u64 {
        self.seconds.values().map(|(r, _)| r).sum()
    }

    pub fn tokens(&self) -> u64 {
        self.seconds.values().map(|(_, t)| t).sum()
    }
}

type RunId = (String, String);

#[derive(Default)]
struct Inner {
    local: HashMap<RunId, RunWindows>,
    /// Replica key in the store → what that replica published.
    peers: HashMap<String, Vec<RunWindows>>,
}

pub struct FleetLedger {
    inner: Mutex<Inner>,
    changed: AtomicBool,
}

impl Default for FleetLedger {
    fn default() -> Self {
        Self::new()
    }
}

impl FleetLedger {
    pub fn new() -> Self {
        Self { inner: Mutex::default(), changed: AtomicBool::new(false) }
    }

    /// Takes a node's windows and answers with what every other node run used.
    pub fn on_report(&self, node_id: &str, usage: pb::LimitUsage) -> pb::LimitState {
        let now = now_ms();
        let run = (node_id.to_owned(), usage.boot_id);
        let windows = RunWindows {
            node_id: run.0.clone(),
            boot_id: run.1.clone(),
            at_unix_ms: now,
            keys: usage.keys.into_iter().map(KeyWindow::from_pb).collect(),
            ended: false,
        };
        let mut inner = self.inner.lock();
        inner.local.insert(run.clone(), windows);
        self.changed.store(true, Ordering::Relaxed);
        let totals = fleet(&inner, now, Some(&run));
        drop(inner);
        let day = now.div_euclid(1000).div_euclid(SECONDS_PER_DAY);
        let mut state = pb::LimitState::default();
        for (key_id, t) in totals {
            state.shares.push(pb::KeyShare {
                key_id: key_id.clone(),
                nodes: t.active_runs,
                recent_requests: t.recent_requests,
            });
            state.others.push(pb::KeyUsageWindow {
                key_id,
                slots: t
                    .seconds
                    .iter()
                    .map(|(s, (r, tk))| pb::LimitSlot { second: *s, requests: *r, tokens: *tk })
                    .collect(),
                day,
                day_tokens: t.day_tokens,
                day_micro_usd: t.day_micro_usd,
            });
        }
        state
    }

    /// A node's stream ended: its runs keep counting until their seconds age out, but no
    /// longer take a share of what is left.
    pub fn ended(&self, node_id: &str) {
        let mut inner = self.inner.lock();
        for (run, w) in inner.local.iter_mut() {
            if run.0 == node_id {
                w.ended = true;
            }
        }
        self.changed.store(true, Ordering::Relaxed);
    }

    /// This replica's node runs, for the other replicas; `None` when nothing changed.
    fn take_published(&self) -> Option<Vec<RunWindows>> {
        if !self.changed.swap(false, Ordering::Relaxed) {
            return None;
        }
        let now = now_ms();
        let mut inner = self.inner.lock();
        inner.local.retain(|_, w| keep(w, now));
        Some(inner.local.values().cloned().collect())
    }

    /// Forgets every other replica's windows, before a fresh listing replaces them (a
    /// replica gone while the watch was down must not linger).
    fn clear_peers(&self) {
        self.inner.lock().peers.clear();
    }

    fn set_peer(&self, replica: String, runs: Option<Vec<RunWindows>>) {
        let mut inner = self.inner.lock();
        match runs {
            Some(runs) => inner.peers.insert(replica, runs),
            None => inner.peers.remove(&replica),
        };
    }
}

fn keep(w: &RunWindows, now: i64) -> bool {
    let day = now.div_euclid(1000).div_euclid(SECONDS_PER_DAY);
    now - w.at_unix_ms < KEEP_MS
        || w.keys.iter().any(|k| k.day == day && (k.day_tokens > 0 || k.day_micro_usd > 0))
}

/// Every key's totals over the fleet's node runs, the newest copy of each run counted once,
/// leaving `except` out.
fn fleet(inner: &Inner, now: i64, except: Option<&RunId>) -> BTreeMap<String, KeyTotals> {
    let mut newest: HashMap<RunId, &RunWindows> = HashMap::new();
    for w in inner.local.values().chain(inner.peers.values().flatten()) {
        let id = (w.node_id.clone(), w.boot_id.clone());
        if except == Some(&id) || !keep(w, now) {
            continue;
        }
        match newest.get(&id) {
            Some(seen) if seen.at_unix_ms >= w.at_unix_ms => {}
            _ => {
                newest.insert(id, w);
            }
        }
    }
    let now_s = now.div_euclid(1000);
    let day = now_s.div_euclid(SECONDS_PER_DAY);
    let mut totals: BTreeMap<String, KeyTotals> = BTreeMap::new();
    for w in newest.values() {
        let alive = !w.ended && now - w.at_unix_ms < ALIVE_MS;
        for k in &w.keys {
            let t = totals.entry(k.key_id.clone()).or_default();
            if alive {
                let recent: u64 = k
                    .slots
                    .iter()
                    .filter(|(s, _, _)| *s > now_s - RECENT_SECS)
                    .map(|(_, r, _)| r)
                    .sum();
                t.recent_requests += recent;
                t.active_runs += u32::from(recent > 0);
            }
            for (second, requests, tokens) in &k.slots {
                if *second > now_s - WINDOW_SECS && *second <= now_s {
                    let slot = t.seconds.entry(*second).or_default();
                    slot.0 += requests;
                    slot.1 += tokens;
                }
            }
            if k.day == day {
                t.day_tokens += k.day_tokens;
                t.day_micro_usd += k.day_micro_usd;
            }
        }
    }
    totals
}

/// The fleet's totals from what every replica published (for `switchyard usage`).
pub async fn fleet_totals(
    store: &dyn Store,
    layout: &Layout,
) -> Result<BTreeMap<String, KeyTotals>, crate::store::StoreError> {
    let listing = store.list(&layout.limits_prefix()).await?;
    let mut inner = Inner::default();
    for kv in listing.kvs {
        if let Ok(runs) = serde_json::from_slice::<Vec<RunWindows>>(&kv.value) {
            inner.peers.insert(kv.key, runs);
        }
    }
    Ok(fleet(&inner, now_ms(), None))
}

/// Publishes this replica's node runs every [`PUBLISH_INTERVAL`] while they change, under
/// the replica's lease, and follows what the other replicas publish.
pub async fn run(
    ledger: Arc<FleetLedger>,
    store: Arc<dyn Store>,
    layout: Layout,
    replica: String,
    lease: LeaseId,
) {
    let own_key = layout.limits(&replica);
    let follower =
        tokio::spawn(follow(Arc::clone(&ledger), Arc::clone(&store), layout, own_key.clone()));
    let mut tick = tokio::time::interval(PUBLISH_INTERVAL);
    tick.set_missed_tick_behavior(tokio::time::MissedTickBehavior::Delay);
    loop {
        tick.tick().await;
        let Some(runs) = ledger.take_published() else { continue };
        let Ok(value) = serde_json::to_vec(&runs) else { continue };
        if let Err(e) = store.put(&own_key, value, Some(lease)).await {
            // The next change publishes again; meanwhile the others use what they had.
            debug!(error = %e, "could not publish limit windows");
            ledger.changed.store(true, Ordering::Relaxed);
        }
        if follower.is_finished() {
            warn!("stopped following the other replicas' limit windows");
        }
    }
}

async fn follow(ledger: Arc<FleetLedger>, store: Arc<dyn Store>, layout: Layout, own_key: String) {
    let prefix = layout.limits_prefix();
    loop {
        let Ok(listing) = store.list(&prefix).await else {
            tokio::time::sleep(Duration::from_secs(1)).await;
            continue;
        };
        ledger.clear_peers();
        for kv in &listing.kvs {
            if kv.key != own_key {
                let runs = serde_json::from_slice(&kv.value).ok();
                ledger.set_peer(kv.key.clone(), runs);
            }
        }
        let Ok(mut watch) = store.watch(&prefix, listing.revision + 1).await else {
            tokio::time::sleep(Duration::from_secs(1)).await;
            continue;
        };
        while let Some(Ok(batch)) = watch.next().await {
            for event in batch.events {
                if event.kv.key == own_key {
                    continue;
                }
                let runs = match event.kind {
                    EventKind::Put => serde_json::from_slice(&event.kv.value).ok(),
                    EventKind::Delete => None,
                };
                ledger.set_peer(event.kv.key, runs);
            }
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    fn usage(boot: &str, key: &str, second: i64, requests: u64) -> pb::LimitUsage {
        pb::LimitUsage {
            boot_id: boot.into(),
            keys: vec![pb::KeyUsageWindow {
                key_id: key.into(),
                slots: vec![pb::LimitSlot { second, requests, tokens: requests * 10 }],
                day: second.div_euclid(SECONDS_PER_DAY),
                day_tokens: requests * 10,
                day_micro_usd: requests,
            }],
        }
    }

    #[test]
    fn a_node_hears_what_every_other_run_used_and_not_itself() {
        let ledger = FleetLedger::new();
        let now_s = now_ms() / 1000;
        ledger.on_report("n1", usage("b1", "k", now_s, 5));
        ledger.on_report("n2", usage("b1", "k", now_s - 1, 7));
        // n1 restarted: its earlier run still counts for the others, and for itself.
        let state = ledger.on_report("n1", usage("b2", "k", now_s, 1));
        let others = &state.others[0];
        let requests: u64 = others.slots.iter().map(|s| s.requests).sum();
        assert_eq!(requests, 12, "{state:?}");
        assert_eq!(others.day_tokens, 120);
        assert_eq!((state.shares[0].nodes, state.shares[0].recent_requests), (2, 12));
        // A resend replaces, never adds.
        let state = ledger.on_report("n2", usage("b1", "k", now_s - 1, 7));
        let requests: u64 = state.others[0].slots.iter().map(|s| s.requests).sum();
        assert_eq!(requests, 6);
    }

    #[test]
    fn seconds_outside_the_window_do_not_count_and_a_peer_copy_counts_once() {
        let now = now_ms();
        let now_s = now / 1000;
        let mut inner = Inner::default();
        let old = RunWindows {
            node_id: "n1".into(),
            boot_id: "b".into(),
            at_unix_ms: now - 1000,
            ended: false,
            keys: vec![KeyWindow {
                key_id: "k".into(),
                slots: vec![(now_s - 61, 100, 0), (now_s - 2, 3, 0)],
                day: now_s / SECONDS_PER_DAY,
                day_tokens: 0,
                day_micro_usd: 0,
            }],
        };
        let mut newer = old.clone();
        newer.at_unix_ms = now;
        newer.keys[0].slots.push((now_s, 1, 0));
        inner.local.insert(("n1".into(), "b".into()), old);
        inner.peers.insert("other".into(), vec![newer]);
        let totals = fleet(&inner, now, None);
        assert_eq!(totals["k"].requests(), 4, "{totals:?}");
        assert_eq!((totals["k"].active_runs, totals["k"].recent_requests), (1, 4));
    }
}
