//! The fleet's breaker view (docs/operating.md, "The fleet's breaker view").
//!
//! Every replica follows the stored breaker records (`breakers/`, each node's own breakers
//! as it last reported them) and the presence records (`nodes/`, the connected nodes) and
//! derives from them, in [`View`], one view: the deployments some node's breaker holds
//! open, who opened each, and which connected node probes it for the fleet (the opener
//! while it is connected, else the lowest node id). The view goes to every node stream of
//! the replica as one `FleetBreakers` message, encoded once, at the stream's start and
//! whenever it changes ([`Fleet::subscribe`]). Replicas read the same records, so nodes on
//! different replicas hear the same view.
//!
//! A deployment also opens for the fleet before any node's own breaker does: nodes report
//! what their breakers counted while a window holds a failure (`BreakerWindows`), and the
//! replica adds up the fleet's newest calls of each deployment into one window of
//! `window_size` calls, judged by the breaker policy. A deployment that dies thus costs the
//! fleet one window of failed calls (plus those made while the word travels), not one per
//! node. The node whose failures weighed most is named its opener (and prober); it opens its
//! own breaker to probe, and its record carries the opening to the other replicas.
//!
//! A deployment stays open for the fleet until a probe closes it (a node's record turns
//! closed with cause `probe_succeeded`): from then on, records of it that opened before the
//! closing no longer count (those nodes close their own breakers on hearing the closing),
//! and one that opens after it opens it for the fleet again.

use std::collections::{BTreeMap, BTreeSet};
use std::sync::Arc;
use std::time::Duration;

use parking_lot::Mutex;
use serde::Deserialize;
use tokio::sync::watch;
use tracing::{info, warn};

use switchyard_backoff::Backoff;
use switchyard_proto::node::BreakerState;
use switchyard_proto::node::encoded::EncodedControlMessage;
use switchyard_proto::node::v1::{self as pb, control_message};

use switchyard_catalog::{BreakerPolicy, Catalog};

use crate::events::BreakerRecord;
use crate::fanout::ConfigCache;
use crate::layout::Layout;
use crate::store::{EventKind, Revision, Store, StoreError};

/// A deployment open for the fleet is open for each node until the prober's next probe
/// plus this: time for the probe to be made (its timeout is 5 s by default) and its outcome
/// to come back. A prober that goes silent for longer leaves every node to its own breaker.
pub const PROBE_SLACK: Duration = Duration::from_secs(10);
/// A closing is sent this long, so a node that reconnects meanwhile still hears it.
const CLOSING_KEPT_MS: i64 = 60_000;
/// The view is derived again at least this often, so that closings age out.
const TICK: Duration = Duration::from_secs(1);
/// Window reports older than this no longer count toward the fleet's window.
const WINDOW_KEPT_MS: i64 = 60_000;
const RECONNECT: Backoff = Backoff::new(Duration::from_millis(100), Duration::from_secs(2));

/// A deployment: (provider, upstream model).
type Deployment = (String, String);

/// One deployment open for the fleet.
#[derive(Clone, Debug, PartialEq)]
struct Opening {
    since_unix_ms: i64,
    opened_by: String,
    /// The latest `until` given, kept while every node's record is half-open (which names
    /// no next probe).
    until_unix_ms: i64,
}

#[derive(Clone, Debug, PartialEq)]
struct Closing {
    at_unix_ms: i64,
    closed_by: String,
}

/// What the view is derived from, and what it keeps between derivations (the openings and
/// closings). No I/O and no clock of its own: the tests drive it.
#[derive(Debug)]
pub struct View {
    enabled: bool,
    /// By store key (one per node and deployment).
    records: BTreeMap<String, BreakerRecord>,
    /// Connected nodes, by store key → node id.
    nodes: BTreeMap<String, String>,
    open: BTreeMap<Deployment, Opening>,
    closed: BTreeMap<Deployment, Closing>,
    /// The breaker policy of the catalog, and of deployments a model overrides it for.
    policy: BreakerPolicy,
    policies: BTreeMap<Deployment, BreakerPolicy>,
    /// The fleet's newest window reports of each deployment, oldest first: (at, node,
    /// calls, failures).
    windows: BTreeMap<Deployment, std::collections::VecDeque<(i64, String, u32, u32)>>,
    /// Deployments the fleet's window opened: when, and the node whose failures weighed
    /// most. They count as that node's open record until its own record says more.
    tripped: BTreeMap<Deployment, (i64, String)>,
}

impl Default for View {
    fn default() -> Self {
        Self {
            enabled: true,
            records: BTreeMap::new(),
            nodes: BTreeMap::new(),
            open: BTreeMap::new(),
            closed: BTreeMap::new(),
            policy: BreakerPolicy::default(),
            policies: BTreeMap::new(),
            windows: BTreeMap::new(),
            tripped: BTreeMap::new(),
        }
    }
}

fn is_open(record: &BreakerRecord) -> bool {
    BreakerState::is_open(&record.state)
}

impl View {
    pub fn set_enabled(&mut self, enabled: bool) {
        self.enabled = enabled;
    }

    /// The breaker policy: the catalog's, and a model's override for each of its
    /// deployments (its own provider and upstream model, or each of its `deployments`), as
    /// the nodes' breakers have it.
    pub fn set_policies(&mut self, catalog: &Catalog) {
        self.policy = catalog.breaker_policy;
        self.policies = catalog
            .models
            .iter()
            .filter_map(|m| Some((m, catalog.breaker_policy.with_override(m.breaker.as_ref()?))))
            .flat_map(|(m, policy)| {
                m.deployment_models()
                    .into_iter()
                    .map(move |d| ((d.provider.clone(), d.breaker_upstream().to_owned()), policy))
            })
            .collect();
    }

    /// Takes in what a node's breakers counted; opens a deployment for the fleet when the
    /// fleet's newest `window_size` calls of it trip the policy.
    pub fn observe(&mut self, node: &str, windows: Vec<pb::BreakerWindow>, now_ms: i64) {
        if !self.enabled {
            return;
        }
        for w in windows {
            let deployment = (w.provider, w.upstream_model);
            if self.open.contains_key(&deployment) || self.tripped.contains_key(&deployment) {
                continue;
            }
            let reports = self.windows.entry(deployment.clone()).or_default();
            reports.push_back((now_ms, node.to_owned(), w.calls, w.failures));
            while reports.front().is_some_and(|r| now_ms - r.0 >= WINDOW_KEPT_MS) {
                reports.pop_front();
            }
            let policy = self.policies.get(&deployment).copied().unwrap_or(self.policy);
            // The newest reports, until they hold a window of calls.
            let (mut calls, mut failures) = (0u64, 0u64);
            let mut by_node: BTreeMap<&str, u64> = BTreeMap::new();
            for (_, node, c, f) in reports.iter().rev() {
                calls += u64::from(*c);
                failures += u64::from(*f);
                *by_node.entry(node.as_str()).or_default() += u64::from(*f);
                if calls >= u64::from(policy.window_size) {
                    break;
                }
            }
            let trips = calls >= u64::from(policy.min_requests)
                && calls > 0
                && failures as f64 / calls as f64 >= policy.failure_rate_threshold;
            if !trips {
                continue;
            }
            // The node that saw most of the failures (the lowest id of equals).
            let opener = by_node
                .iter()
                .max_by(|a, b| a.1.cmp(b.1).then(b.0.cmp(a.0)))
                .map_or_else(String::new, |(n, _)| (*n).to_owned());
            self.windows.remove(&deployment);
            self.tripped.insert(deployment, (now_ms, opener));
        }
    }

    pub fn put_record(&mut self, key: String, record: BreakerRecord) {
        self.records.insert(key, record);
    }

    pub fn remove_record(&mut self, key: &str) {
        self.records.remove(key);
    }

    pub fn put_node(&mut self, key: String, node_id: String) {
        self.nodes.insert(key, node_id);
    }

    pub fn remove_node(&mut self, key: &str) {
        self.nodes.remove(key);
    }

    /// The prober of an opening: its opener while connected, else the lowest connected
    /// node id; "" when no node is connected.
    fn prober(&self, opened_by: &str) -> String {
        let connected: BTreeSet<&String> = self.nodes.values().collect();
        if connected.iter().any(|n| n.as_str() == opened_by) {
            return opened_by.to_owned();
        }
        connected.first().map_or_else(String::new, |n| (*n).clone())
    }

    /// Derives the view from the records as they are now, and the message for the nodes.
    pub fn derive(&mut self, now_ms: i64) -> pb::FleetBreakers {
        if !self.enabled {
            self.open.clear();
            self.closed.clear();
            return pb::FleetBreakers { enabled: false, open: vec![], closed: vec![] };
        }
        self.closed.retain(|_, c| now_ms - c.at_unix_ms < CLOSING_KEPT_MS);
        // A trip holds until a probe closes the deployment after it, or a minute passes
        // (the opener's own record holds it open from when it opens its breaker to probe).
        let closed = &self.closed;
        self.tripped.retain(|d, (at, _)| {
            now_ms - *at < CLOSING_KEPT_MS && closed.get(d).is_none_or(|c| c.at_unix_ms < *at)
        });
        self.windows
            .retain(|_, reports| reports.back().is_some_and(|r| now_ms - r.0 < WINDOW_KEPT_MS));
        let trips: Vec<BreakerRecord> = self
            .tripped
            .iter()
            .map(|((provider, upstream_model), (at, node))| BreakerRecord {
                node_id: node.clone(),
                provider: provider.clone(),
                upstream_model: upstream_model.clone(),
                state: BreakerState::Open.as_str().to_owned(),
                since_unix_ms: *at,
                failure_rate: 0.0,
                calls_in_window: 0,
                next_probe_unix_ms: 0,
                cause: "fleet_window".to_owned(),
                cooldown_ms: 0,
                last_probe_unix_ms: 0,
                last_probe_outcome: String::new(),
                last_probe_latency_ms: 0,
                boot_id: String::new(),
            })
            .collect();
        let mut by_deployment: BTreeMap<Deployment, Vec<&BreakerRecord>> = BTreeMap::new();
        for record in self.records.values().chain(&trips) {
            let key = (record.provider.clone(), record.upstream_model.clone());
            by_deployment.entry(key).or_default().push(record);
        }
        // Gone from every node (the nodes left, or restarted): nothing to keep open.
        self.open.retain(|d, _| by_deployment.contains_key(d));
        let mut open = Vec::new();
        for (deployment, records) in &by_deployment {
            // A probe closed it since it opened: closed for the fleet.
            if let Some(opening) = self.open.get(deployment) {
                let closing = records
                    .iter()
                    .filter(|r| {
                        r.state == BreakerState::Closed.as_str()
                            && r.cause == "probe_succeeded"
                            && r.since_unix_ms >= opening.since_unix_ms
                    })
                    .max_by_key(|r| r.since_unix_ms);
                if let Some(r) = closing {
                    let closing =
                        Closing { at_unix_ms: r.since_unix_ms, closed_by: r.node_id.clone() };
                    self.closed.insert(deployment.clone(), closing);
                    self.open.remove(deployment);
                }
            }
            let closed_at = self.closed.get(deployment).map_or(i64::MIN, |c| c.at_unix_ms);
            // Records that opened before the last closing are old news: their nodes close
            // them on hearing it.
            let opened: Vec<&&BreakerRecord> =
                records.iter().filter(|r| is_open(r) && r.since_unix_ms > closed_at).collect();
            if opened.is_empty() {
                // Every node's own breaker closed (their own probes, with the fleet view
                // off or cut off): nothing is open any more.
                self.open.remove(deployment);
                continue;
            }
            let first = opened.iter().min_by_key(|r| (r.since_unix_ms, &r.node_id));
            let opening = self.open.entry(deployment.clone()).or_insert_with(|| Opening {
                since_unix_ms: first.map_or(now_ms, |r| r.since_unix_ms),
                opened_by: first.map_or_else(String::new, |r| r.node_id.clone()),
                until_unix_ms: 0,
            });
            let opened_by = opening.opened_by.clone();
            let prober = self.prober(&opened_by);
            // The prober's next probe says how long (none while its probe is in flight);
            // while it has not opened its breaker to probe yet, the latest any node named.
            let of_prober: Vec<i64> = opened
                .iter()
                .filter(|r| r.node_id == prober)
                .map(|r| r.next_probe_unix_ms)
                .collect();
            let next_probe = match of_prober.is_empty() {
                false => of_prober.into_iter().max(),
                true => opened.iter().map(|r| r.next_probe_unix_ms).max(),
            }
            .unwrap_or(0);
            let slack = i64::try_from(PROBE_SLACK.as_millis()).unwrap_or(i64::MAX);
            let Some(opening) = self.open.get_mut(deployment) else { continue };
            if next_probe > 0 {
                // Never earlier than already given: a node may already count on it.
                opening.until_unix_ms = opening.until_unix_ms.max(next_probe.saturating_add(slack));
            } else if opening.until_unix_ms == 0 {
                // Half-open everywhere, no next probe named yet: a probe is in flight.
                opening.until_unix_ms = now_ms.saturating_add(slack);
            }
            // Nodes whose own breaker is open (a trip is the fleet's, not a node's).
            let mut open_on: Vec<String> = opened
                .iter()
                .filter(|r| r.cause != "fleet_window")
                .map(|r| r.node_id.clone())
                .collect();
            open_on.sort();
            open_on.dedup();
            open.push(pb::FleetBreaker {
                provider: deployment.0.clone(),
                upstream_model: deployment.1.clone(),
                since_unix_ms: opening.since_unix_ms,
                opened_by,
                prober,
                until_unix_ms: opening.until_unix_ms,
                open_on,
            });
        }
        let closed = self
            .closed
            .iter()
            .filter(|(d, _)| !self.open.contains_key(*d))
            .map(|((provider, upstream_model), c)| pb::FleetClosing {
                provider: provider.clone(),
                upstream_model: upstream_model.clone(),
                at_unix_ms: c.at_unix_ms,
                closed_by: c.closed_by.clone(),
            })
            .collect();
        pb::FleetBreakers { enabled: true, open, closed }
    }
}

/// The view as derived last, for node streams and the admin API.
#[derive(Debug)]
pub struct Published {
    pub view: pb::FleetBreakers,
    /// The connected nodes, by id: each treats the open deployments as open.
    pub nodes: BTreeSet<String>,
    /// The `FleetBreakers` control message, encoded once for every node stream.
    pub message: EncodedControlMessage,
}

impl Published {
    fn new(view: pb::FleetBreakers, nodes: BTreeSet<String>) -> Self {
        let message = EncodedControlMessage::new(&pb::ControlMessage {
            msg: Some(control_message::Msg::FleetBreakers(view.clone())),
        });
        Self { view, nodes, message }
    }
}

/// The replica's fleet view: derived from the store by [`run`], read by node streams and
/// `ListBreakers`.
pub struct Fleet {
    view: Mutex<View>,
    published: watch::Sender<Arc<Published>>,
    /// The catalog revision `breaker_policy.fleet` was last read at.
    catalog: Mutex<Option<Revision>>,
}

impl Fleet {
    pub fn new() -> Arc<Self> {
        // Until the records are read: on, nothing open.
        let nothing = pb::FleetBreakers { enabled: true, open: vec![], closed: vec![] };
        let (published, _) = watch::channel(Arc::new(Published::new(nothing, BTreeSet::new())));
        Arc::new(Self { view: Mutex::new(View::default()), published, catalog: Mutex::new(None) })
    }

    /// The current view, and every later one.
    pub fn subscribe(&self) -> watch::Receiver<Arc<Published>> {
        self.published.subscribe()
    }

    pub fn current(&self) -> Arc<Published> {
        Arc::clone(&self.published.borrow())
    }

    /// Changes the inputs with `change`, derives the view and publishes it if it changed.
    fn update(&self, change: impl FnOnce(&mut View)) {
        let mut view = self.view.lock();
        change(&mut view);
        let derived = view.derive(switchyard_time::now_ms());
        let nodes: BTreeSet<String> = view.nodes.values().cloned().collect();
        // Published under the lock, so two updates never publish out of order.
        self.published.send_if_modified(|current| {
            if current.view == derived && current.nodes == nodes {
                return false;
            }
            *current = Arc::new(Published::new(derived, nodes));
            true
        });
    }

    /// Reads `breaker_policy.fleet` from the cached catalog when it changed.
    fn read_catalog(&self, cache: &ConfigCache) {
        let Some((value, revision)) = cache.resource("catalog") else { return };
        let mut seen = self.catalog.lock();
        if *seen == Some(revision) {
            return;
        }
        *seen = Some(revision);
        drop(seen);
        match serde_json::from_slice::<Catalog>(&value) {
            Ok(catalog) => {
                let enabled = catalog.breaker_policy.fleet;
                info!(enabled, "fleet breaker view");
                self.update(|v| {
                    v.set_enabled(enabled);
                    v.set_policies(&catalog);
                });
            }
            Err(e) => warn!(error = %e, "cannot read the breaker policy from the catalog"),
        }
    }

    /// A node's window report (see [`View::observe`]).
    pub fn observe(&self, node: &str, windows: pb::BreakerWindows) {
        let now = switchyard_time::now_ms();
        self.update(|v| v.observe(node, windows.windows, now));
    }
}

/// Keeps `fleet` derived from the store until the process ends.
pub async fn run(
    fleet: Arc<Fleet>,
    store: Arc<dyn Store>,
    layout: Layout,
    cache: Arc<ConfigCache>,
) {
    tokio::spawn(follow(
        Arc::clone(&fleet),
        Arc::clone(&store),
        layout.breakers_prefix(),
        Input::Breakers,
    ));
    tokio::spawn(follow(Arc::clone(&fleet), store, layout.nodes_prefix(), Input::Nodes));
    let mut tick = tokio::time::interval(TICK);
    // Config changes, for `breaker_policy` as soon as it is applied.
    let (_, mut config) = cache.subscribe(Revision::MAX);
    loop {
        tokio::select! {
            _ = tick.tick() => {}
            changed = config.recv() => {
                if let Err(tokio::sync::broadcast::error::RecvError::Closed) = changed {
                    (_, config) = cache.subscribe(Revision::MAX);
                }
            }
        }
        fleet.read_catalog(&cache);
        fleet.update(|_| {});
    }
}

/// The one field of a presence record (`nodes::NodeRecord`) the view needs.
#[derive(Deserialize)]
struct Presence {
    node_id: String,
}

#[derive(Clone, Copy)]
enum Input {
    Breakers,
    Nodes,
}

impl Input {
    fn put(self, view: &mut View, key: String, value: &[u8]) {
        match self {
            Input::Breakers => match serde_json::from_slice::<BreakerRecord>(value) {
                Ok(record) => view.put_record(key, record),
                Err(e) => warn!(key, error = %e, "unreadable breaker record"),
            },
            Input::Nodes => match serde_json::from_slice::<Presence>(value) {
                Ok(record) => view.put_node(key, record.node_id),
                Err(e) => warn!(key, error = %e, "unreadable node record"),
            },
        }
    }

    fn remove(self, view: &mut View, key: &str) {
        match self {
            Input::Breakers => view.remove_record(key),
            Input::Nodes => view.remove_node(key),
        }
    }

    fn clear(self, view: &mut View) {
        match self {
            Input::Breakers => view.records.clear(),
            Input::Nodes => view.nodes.clear(),
        }
    }
}

/// Lists `prefix`, then watches it; lists again after any failure.
async fn follow(fleet: Arc<Fleet>, store: Arc<dyn Store>, prefix: String, input: Input) {
    let mut failures = 0;
    loop {
        match follow_once(&fleet, store.as_ref(), &prefix, input).await {
            Ok(()) => warn!(%prefix, "fleet view watch ended; listing again"),
            Err(e) => warn!(%prefix, error = %e, "fleet view watch failed; listing again"),
        }
        tokio::time::sleep(RECONNECT.delay(failures)).await;
        failures = failures.saturating_add(1);
    }
}

async fn follow_once(
    fleet: &Fleet,
    store: &dyn Store,
    prefix: &str,
    input: Input,
) -> Result<(), StoreError> {
    let listing = store.list(prefix).await?;
    fleet.update(|view| {
        input.clear(view);
        for kv in &listing.kvs {
            input.put(view, kv.key.clone(), &kv.value);
        }
    });
    let mut watch = store.watch(prefix, listing.revision + 1).await?;
    while let Some(batch) = watch.next().await {
        let batch = batch?;
        fleet.update(|view| {
            for event in batch.events {
                match event.kind {
                    EventKind::Put => input.put(view, event.kv.key, &event.kv.value),
                    EventKind::Delete => input.remove(view, &event.kv.key),
                }
            }
        });
    }
    Ok(())
}

#[cfg(test)]
mod tests {
    #![allow(clippy::unwrap_used)]
    use super::*;

    const SLACK: i64 = PROBE_SLACK.as_millis() as i64;

    fn record(node: &str, state: &str, cause: &str, since: i64, next_probe: i64) -> BreakerRecord {
        BreakerRecord {
            node_id: node.into(),
            provider: "azure-east".into(),
            upstream_model: "gpt-4o".into(),
            state: state.into(),
            since_unix_ms: since,
            failure_rate: 1.0,
            calls_in_window: 20,
            next_probe_unix_ms: next_probe,
            cause: cause.into(),
            cooldown_ms: 5_000,
            last_probe_unix_ms: 0,
            last_probe_outcome: String::new(),
            last_probe_latency_ms: 0,
            boot_id: String::new(),
        }
    }

    fn report(view: &mut View, r: BreakerRecord) {
        view.put_record(format!("breakers/{}/{}/{}", r.node_id, r.provider, r.upstream_model), r);
    }

    fn connect(view: &mut View, node: &str) {
        view.put_node(format!("nodes/{node}"), node.into());
    }

    fn view_of(nodes: &[&str]) -> View {
        let mut view = View::default();
        for node in nodes {
            connect(&mut view, node);
        }
        view
    }

    #[test]
    fn the_first_node_to_open_a_deployment_opens_it_for_the_fleet_and_probes_it() {
        let mut view = view_of(&["n1", "n2", "n3", "n4"]);
        assert!(view.derive(1_000).open.is_empty());
        report(&mut view, record("n3", "open", "failure_rate", 1_000, 6_000));
        report(&mut view, record("n2", "open", "failure_rate", 1_200, 6_200));
        let derived = view.derive(1_300);
        assert!(derived.enabled);
        assert_eq!(derived.open.len(), 1, "{derived:?}");
        let open = &derived.open[0];
        assert_eq!(
            (open.provider.as_str(), open.upstream_model.as_str()),
            ("azure-east", "gpt-4o")
        );
        assert_eq!((open.opened_by.as_str(), open.prober.as_str()), ("n3", "n3"));
        assert_eq!(open.since_unix_ms, 1_000);
        assert_eq!(open.open_on, ["n2", "n3"]);
        // Until the prober's next probe, and time for it to be made and reported.
        assert_eq!(open.until_unix_ms, 6_000 + SLACK);
        // Its probe fails: open again, until its next one.
        report(&mut view, record("n3", "half_open", "cooldown_elapsed", 6_000, 0));
        assert_eq!(view.derive(6_000).open[0].until_unix_ms, 6_000 + SLACK, "kept half-open");
        report(&mut view, record("n3", "open", "probe_failed", 6_100, 11_100));
        let open = &view.derive(6_100).open[0];
        assert_eq!((open.since_unix_ms, open.opened_by.as_str()), (1_000, "n3"));
        assert_eq!(open.until_unix_ms, 11_100 + SLACK);
    }

    #[test]
    fn the_prober_is_the_opener_while_connected_else_the_lowest_node_and_moves_when_it_leaves() {
        let mut view = view_of(&["n2", "n3", "n4"]);
        report(&mut view, record("n3", "open", "failure_rate", 1_000, 6_000));
        assert_eq!(view.derive(1_000).open[0].prober, "n3");
        // The opener leaves (its record stays for the grace period): the lowest node id.
        view.remove_node("nodes/n3");
        assert_eq!(view.derive(2_000).open[0].prober, "n2");
        view.remove_node("nodes/n2");
        assert_eq!(view.derive(2_000).open[0].prober, "n4");
        // The opener is back: it probes again.
        connect(&mut view, "n3");
        assert_eq!(view.derive(3_000).open[0].prober, "n3");
        // Nobody connected: nobody probes; still open (the records say so).
        for node in ["n3", "n4"] {
            view.remove_node(&format!("nodes/{node}"));
        }
        let open = &view.derive(3_000).open[0];
        assert_eq!((open.prober.as_str(), open.opened_by.as_str()), ("", "n3"));
    }

    #[test]
    fn a_probe_that_succeeds_closes_the_deployment_for_the_fleet_and_later_failures_open_it_again()
    {
        let mut view = view_of(&["n1", "n2"]);
        report(&mut view, record("n1", "open", "failure_rate", 1_000, 6_000));
        report(&mut view, record("n2", "open", "failure_rate", 1_100, 6_100));
        assert_eq!(view.derive(1_100).open.len(), 1);
        // n1's probe closes it; n2's own breaker is still open from before.
        report(&mut view, record("n1", "closed", "probe_succeeded", 6_050, 0));
        let derived = view.derive(6_060);
        assert!(derived.open.is_empty(), "{derived:?}");
        assert_eq!(derived.closed.len(), 1);
        let closed = &derived.closed[0];
        assert_eq!((closed.at_unix_ms, closed.closed_by.as_str()), (6_050, "n1"));
        // n2 closes on hearing it; the closing is still listed for a node reconnecting.
        report(&mut view, record("n2", "closed", "fleet_closed", 6_200, 0));
        let derived = view.derive(6_300);
        assert!(derived.open.is_empty() && derived.closed.len() == 1);
        // Failures after the closing open it again, for everyone.
        report(&mut view, record("n2", "open", "failure_rate", 9_000, 14_000));
        let derived = view.derive(9_000);
        assert_eq!(derived.open[0].opened_by, "n2");
        assert!(derived.closed.is_empty(), "open again: not listed as closed");
        // A closing ages out after a minute.
        report(&mut view, record("n2", "closed", "probe_succeeded", 10_000, 0));
        assert_eq!(view.derive(10_000).closed.len(), 1);
        assert!(view.derive(10_000 + CLOSING_KEPT_MS).closed.is_empty());
    }

    #[test]
    fn a_success_from_before_the_opening_closes_nothing_and_gone_nodes_leave_nothing_open() {
        let mut view = view_of(&["n1", "n2"]);
        // n2 recovered an earlier outage on its own; then n1 opens the deployment.
        report(&mut view, record("n2", "closed", "probe_succeeded", 500, 0));
        report(&mut view, record("n1", "open", "failure_rate", 1_000, 6_000));
        assert_eq!(view.derive(1_000).open.len(), 1);
        // n1 is gone for good: its records go, and nothing holds the deployment open.
        view.remove_record("breakers/n1/azure-east/gpt-4o");
        view.remove_node("nodes/n1");
        assert!(view.derive(40_000).open.is_empty());
    }

    #[test]
    fn with_the_fleet_view_off_nothing_is_listed() {
        let mut view = view_of(&["n1"]);
        report(&mut view, record("n1", "open", "failure_rate", 1_000, 6_000));
        view.set_enabled(false);
        let derived = view.derive(1_000);
        assert!(!derived.enabled && derived.open.is_empty() && derived.closed.is_empty());
        view.set_enabled(true);
        assert_eq!(view.derive(1_000).open.len(), 1);
    }

    fn counted(calls: u32, failures: u32) -> Vec<pb::BreakerWindow> {
        vec![pb::BreakerWindow {
            provider: "azure-east".into(),
            upstream_model: "gpt-4o".into(),
            calls,
            failures,
        }]
    }

    #[test]
    fn the_fleets_newest_calls_make_one_window_that_opens_the_deployment_for_every_node() {
        let mut view = view_of(&["n1", "n2", "n3", "n4"]);
        view.set_policies(&Catalog {
            breaker_policy: BreakerPolicy {
                window_size: 20,
                min_requests: 20,
                ..BreakerPolicy::default()
            },
            ..Catalog::default()
        });
        // Four nodes, four failures each: 16 calls, no node near its own window of 20.
        for node in ["n1", "n2", "n3", "n4"] {
            view.observe(node, counted(4, 4), 1_000);
        }
        assert!(view.derive(1_000).open.is_empty(), "16 calls: fewer than min_requests");
        // n3 fails three more, n2 one: the fleet's window of 20 calls is all failures.
        view.observe("n3", counted(3, 3), 1_100);
        view.observe("n2", counted(1, 1), 1_100);
        let derived = view.derive(1_100);
        assert_eq!(derived.open.len(), 1, "{derived:?}");
        let open = &derived.open[0];
        // The node with most of the failures opened it and probes it.
        assert_eq!((open.opened_by.as_str(), open.prober.as_str()), ("n3", "n3"));
        assert_eq!(open.since_unix_ms, 1_100);
        assert!(open.open_on.is_empty(), "no node's own breaker is open: {open:?}");
        assert_eq!(open.until_unix_ms, 1_100 + SLACK);
        // The prober opens its own breaker to probe: its next probe sets the time.
        report(&mut view, record("n3", "open", "fleet_open", 1_200, 2_200));
        let open = &view.derive(1_200).open[0];
        assert_eq!((open.opened_by.as_str(), open.since_unix_ms), ("n3", 1_100));
        assert_eq!(open.open_on, ["n3"]);
        // Its probe succeeds: closed for everyone, and the trip with it.
        report(&mut view, record("n3", "closed", "probe_succeeded", 2_250, 0));
        let derived = view.derive(2_300);
        assert!(derived.open.is_empty() && derived.closed.len() == 1, "{derived:?}");
    }

    #[test]
    fn a_models_breaker_override_holds_for_each_of_its_deployments() {
        let mut view = view_of(&["n1"]);
        let model: switchyard_catalog::Model = serde_json::from_value(serde_json::json!({
            "name": "gpt",
            "deployments": [
                {"provider": "azure-west", "upstream_model": "gpt-4o"},
                {"provider": "azure-east", "upstream_model": "gpt-4o"},
            ],
            "breaker": {"window_size": 4, "min_requests": 4},
        }))
        .unwrap();
        view.set_policies(&Catalog {
            breaker_policy: BreakerPolicy {
                window_size: 20,
                min_requests: 20,
                ..BreakerPolicy::default()
            },
            models: vec![model],
            ..Catalog::default()
        });
        // Four failures: far from the catalog's 20, but the model's window of 4.
        view.observe("n1", counted(4, 4), 1_000);
        let derived = view.derive(1_000);
        assert_eq!(derived.open.len(), 1, "{derived:?}");
        assert_eq!(derived.open[0].provider, "azure-east");

        // A wildcard's override holds for its one breaker, `*`.
        let wildcard: switchyard_catalog::Model = serde_json::from_value(serde_json::json!({
            "name": "azure-east/*", "provider": "azure-east",
            "breaker": {"window_size": 4, "min_requests": 4},
        }))
        .unwrap();
        let mut view = view_of(&["n1"]);
        view.set_policies(&Catalog {
            breaker_policy: BreakerPolicy {
                window_size: 20,
                min_requests: 20,
                ..BreakerPolicy::default()
            },
            models: vec![wildcard],
            ..Catalog::default()
        });
        let star = vec![pb::BreakerWindow {
            provider: "azure-east".into(),
            upstream_model: "*".into(),
            calls: 4,
            failures: 4,
        }];
        view.observe("n1", star, 1_000);
        assert_eq!(view.derive(1_000).open.len(), 1);
    }

    #[test]
    fn successes_in_the_fleets_window_weigh_against_its_failures() {
        let mut view = view_of(&["n1", "n2"]);
        view.set_policies(&Catalog {
            breaker_policy: BreakerPolicy {
                window_size: 10,
                min_requests: 10,
                failure_rate_threshold: 0.5,
                ..BreakerPolicy::default()
            },
            ..Catalog::default()
        });
        // 10 calls, 4 failures: 40 %.
        view.observe("n1", counted(5, 2), 1_000);
        view.observe("n2", counted(5, 2), 1_000);
        assert!(view.derive(1_000).open.is_empty());
        // The newest 10: 5 + 5 with 5 failures, 50 %.
        view.observe("n2", counted(5, 3), 1_100);
        assert_eq!(view.derive(1_100).open[0].opened_by, "n2");
        // Off: reports are not counted.
        let mut off = view_of(&["n1"]);
        off.set_enabled(false);
        off.observe("n1", counted(100, 100), 1_000);
        off.set_enabled(true);
        assert!(off.derive(1_000).open.is_empty());
    }
}
