//! What the node reports to the control plane: failover events and breaker reports (at
//! least once: held until acked, sent again on a new stream), counts of events lost
//! ([`crate::loss`], likewise), usage totals. Requests only push into bounded in-memory
//! queues; the config-stream task drains them. Failover events beyond the memory bound go
//! to the node's spool on disk ([`crate::spool`]) and come back, in order, as the control
//! plane takes them; so do events held in memory that no control plane acked in time
//! ([`Telemetry::spill_held`], called by [`crate::custody`]).

use parking_lot::Mutex;
use std::collections::{BTreeMap, HashMap, VecDeque};
use std::sync::Arc;
use std::sync::atomic::{AtomicBool, Ordering};
use tokio::time::Instant;

use prometheus_client::metrics::counter::Counter;
use prost::Message;

use switchyard_proto::node::v1::{self as pb, node_message};

use crate::limits::Ledger;
use crate::loss::{Losses, Lost, Reason, SpoolState};
use crate::spool::Spool;

/// Events held in memory (queued or sent but not acked) by default
/// (`--event-buffer-events`); beyond this new events go to the spool, or are counted lost.
pub const MAX_EVENTS: usize = 10_000;
/// During an outage every request fails over: batches keep that to a few messages (and
/// store transactions) per second instead of one per request. The control plane stores a
/// stream's batches one after another, one write round each (`MIN_WRITE_INTERVAL` apart),
/// so this batch size over that interval bounds the events per second one node can have
/// stored. Larger batches store no faster and arrive as larger bursts of control-plane
/// work, which on a shared host shows in the node's tail latency (docs/BENCHMARKS.md,
/// "Figures behind design choices").
const EVENTS_PER_BATCH: usize = 500;
/// Breaker reports held (queued or sent but not acked); beyond this the oldest goes, and a
/// transition among them is counted lost.
const MAX_TRANSITIONS: usize = 1_000;

/// Events read back from the spool at a time, at most.
const REFILL_EVENTS: usize = 2 * EVENTS_PER_BATCH;

#[derive(Default)]
struct EventQueue {
    /// While the spool holds events, newer ones go there too, so that they leave in order.
    spooling: bool,
    /// Events handed to the spool (those an earlier run left there included).
    spooled: u64,
    pending: VecDeque<pb::FailoverEvent>,
    /// Batches sent and not yet acked, kept encoded: one buffer per batch instead of a deep
    /// copy of every event's strings, and only a reconnect ever reads one back.
    in_flight: BTreeMap<u64, InFlight>,
    held: usize,
    next_seq: u64,
    /// Events that ever came into memory (pushed, or read back from the spool), and those
    /// that left it (acked, spooled, counted lost). Memory is first in, first out, so the
    /// oldest event held is number `left + 1`: how [`Telemetry::held_longer_than`] ages
    /// events without a clock reading per event.
    entered: u64,
    left: u64,
}

struct InFlight {
    events: usize,
    encoded: Vec<u8>,
}

#[derive(Default, Clone, Copy)]
struct Totals {
    requests: u64,
    prompt_tokens: u64,
    completion_tokens: u64,
    cost_usd: f64,
}

/// Breaker transitions and probe reports, numbered, held until a `BreakersAck` covers them.
#[derive(Default)]
struct BreakerQueue {
    reports: VecDeque<BreakerReport>,
    next_seq: u64,
}

struct BreakerReport {
    seq: u64,
    report: node_message::Msg,
    /// Sent on the current stream; a new stream sends it again.
    sent: bool,
}

pub struct Telemetry {
    pub node_id: String,
    boot_id: String,
    events: Mutex<EventQueue>,
    /// Taken by whoever moves events between memory and the spool (the config stream's
    /// refill, a spill), so that one's events never overtake the other's.
    spool_io: tokio::sync::Mutex<()>,
    /// `entered` as it was at past moments (oldest first), for [`Self::held_longer_than`].
    entered_at: Mutex<VecDeque<(Instant, u64)>>,
    /// A config stream is open: a control plane may ack what the node holds.
    connected: AtomicBool,
    /// Events held in memory at most.
    max_events: usize,
    spool: Option<Spool>,
    /// Every event discarded, counted and reported ([`crate::loss`]).
    pub losses: Arc<Losses>,
    /// Breaker transitions and probe reports, in one queue so that they reach the control
    /// plane in the order they happened: each carries the breaker's whole state, and the
    /// newest one is what `switchyard breakers` shows.
    transitions: Mutex<BreakerQueue>,
    /// Key id → served model → totals: nested so that a request finds its entry by
    /// borrowed names and allocates only the first time a pair is seen.
    usage: Mutex<HashMap<String, HashMap<String, Totals>>>,
    usage_dirty: AtomicBool,
    /// Every limited key's counts and the fleet's, for the request path's decisions.
    pub limits: Arc<Ledger>,
}

impl Telemetry {
    /// `events_dropped` counts the failover events lost (`switchyard_failover_events_dropped_total`).
    pub fn new(node_id: String, events_dropped: Counter) -> Self {
        let boot_id = format!("{:016x}", rand::random::<u64>());
        Self {
            node_id,
            losses: Arc::new(Losses::new(events_dropped, boot_id.clone())),
            boot_id,
            events: Mutex::default(),
            spool_io: tokio::sync::Mutex::new(()),
            entered_at: Mutex::default(),
            connected: AtomicBool::new(false),
            max_events: MAX_EVENTS,
            spool: None,
            transitions: Mutex::default(),
            usage: Mutex::default(),
            usage_dirty: AtomicBool::new(false),
            limits: Arc::new(Ledger::new()),
        }
    }

    /// This node's limit windows, for its control plane.
    pub fn limit_report(&self, now_ms: i64, limited: bool) -> Option<pb::LimitUsage> {
        self.limits.report(&self.boot_id, now_ms, limited)
    }

    /// Holds at most `max` failover events in memory (at least 1).
    pub fn with_max_events(mut self, max: usize) -> Self {
        self.max_events = max.max(1);
        self
    }

    /// Keeps failover events that do not fit in memory in `spool`, counting `records` an
    /// earlier run left there as not yet sent.
    pub fn with_spool(mut self, spool: Spool, records: u64) -> Self {
        let q = self.events.get_mut();
        q.spooling = records > 0;
        q.spooled = records;
        self.spool = Some(spool);
        self
    }

    pub fn push_event(&self, event: pb::FailoverEvent) {
        // With no control plane connected nothing will ack an event soon: it goes straight
        // to the spool, whose thread writes it at once, where memory would lose it to a kill
        // ([`crate::custody`]). One atomic load: no lock and no disk on this path.
        let spool_first = self.spool.is_some() && !self.connected();
        let mut q = self.events.lock();
        let room = !q.spooling && q.held < self.max_events;
        if room && !spool_first {
            q.held += 1;
            q.entered += 1;
            q.pending.push_back(event);
            return;
        }
        let Some(spool) = &self.spool else {
            drop(q);
            // A node with a `--data-dir` whose spool could not be opened says why.
            let reason = match self.losses.spool() {
                SpoolState::Unwritable => Reason::SpoolUnwritable,
                _ => Reason::MemoryFull,
            };
            self.losses.lose(Lost::Failover, reason, 1);
            return;
        };
        match spool.append(event) {
            None => {
                q.spooling = true;
                q.spooled += 1;
            }
            // The spool's thread is behind: memory, while it has room, rather than a loss.
            Some(event) if room => {
                q.held += 1;
                q.entered += 1;
                q.pending.push_back(event);
            }
            Some(_) => {
                drop(q);
                self.losses.lose(Lost::Failover, Reason::SpoolBusy, 1);
            }
        }
    }

    /// Moves spooled events back into memory once what memory held has gone out, so that
    /// they leave in the order they happened.
    pub async fn refill_from_spool(&self) {
        let Some(spool) = &self.spool else { return };
        let _io = self.spool_io.lock().await;
        let room = {
            let q = self.events.lock();
            if !q.spooling || !q.pending.is_empty() {
                return;
            }
            self.max_events.saturating_sub(q.held).min(REFILL_EVENTS)
        };
        if room == 0 {
            return;
        }
        let Some(batch) = spool.read(room).await else { return };
        // Nothing reached `pending` meanwhile: while spooling, new events go to the spool,
        // and a requeue after a reconnect puts older ones in front, where they belong.
        let mut q = self.events.lock();
        q.held += batch.events.len();
        q.entered += batch.events.len() as u64;
        q.pending.extend(batch.events);
        if batch.disposed >= q.spooled {
            q.spooling = false;
        }
    }

    /// The node is stopping and no control plane took its events: everything held in
    /// memory goes to the spool, ahead of what is already there, for the next start.
    pub async fn spool_held(&self) -> std::io::Result<usize> {
        self.requeue_in_flight();
        self.spill_held().await
    }

    /// Everything held in memory (sent and not acked included) goes to the spool, on disk,
    /// ahead of what is already there, and new events follow it there until the spool has
    /// drained: no control plane acked them in time ([`crate::custody`]), or the node is
    /// stopping. Returns how many. A batch in flight that a control plane acks later is
    /// sent again from the spool: delivery stays at least once, and in order.
    pub async fn spill_held(&self) -> std::io::Result<usize> {
        let Some(spool) = &self.spool else { return Ok(0) };
        let _io = self.spool_io.lock().await;
        // Taken whole under the lock (no decoding there: requests wait on it to push).
        let (in_flight, pending, held) = {
            let mut q = self.events.lock();
            let held = q.held;
            q.left += held as u64;
            q.held = 0;
            if held > 0 {
                // Set with the events taken: an event pushed from now on goes to the spool
                // behind them, never to memory ahead of them.
                q.spooling = true;
                q.spooled += held as u64;
            }
            (std::mem::take(&mut q.in_flight), std::mem::take(&mut q.pending), held)
        };
        let mut events = Vec::with_capacity(held);
        for (seq, batch) in in_flight {
            match pb::FailoverEvents::decode(batch.encoded.as_slice()) {
                Ok(decoded) => events.extend(decoded.events),
                // Only our own encoding is ever read here; should it fail, the loss is counted.
                Err(e) => {
                    tracing::error!(seq, error = %e, "could not read back an unacked event batch");
                    self.losses.lose(Lost::Failover, Reason::Unreadable, batch.events as u64);
                }
            }
        }
        events.extend(pending);
        if events.len() < held {
            let mut q = self.events.lock();
            q.spooled = q.spooled.saturating_sub((held - events.len()) as u64);
        }
        let n = events.len();
        if n > 0
            && let Err(e) = spool.prepend(events).await
        {
            // Counted, and reported like any loss (saved for the next start if the node stops).
            self.losses.lose(Lost::Failover, Reason::SpoolUnwritable, n as u64);
            let mut q = self.events.lock();
            q.spooled = q.spooled.saturating_sub(n as u64);
            return Err(e);
        }
        Ok(n)
    }

    /// Everything the spool took so far is on the disk.
    pub async fn sync_spool(&self) -> std::io::Result<()> {
        match &self.spool {
            Some(spool) => spool.sync().await,
            None => Ok(()),
        }
    }

    /// Whether an event held in memory came into it more than `bound` ago. Meant to be
    /// called at a steady tick (each call notes the moment): it answers with the tick's
    /// precision.
    pub fn held_longer_than(&self, bound: std::time::Duration) -> bool {
        let now = Instant::now();
        let (entered, left) = {
            let q = self.events.lock();
            (q.entered, q.left)
        };
        let mut seen = self.entered_at.lock();
        seen.push_back((now, entered));
        // The newest mark at least `bound` old says which events are that old: those that
        // had entered by then. It stays (the older ones go) for the next call.
        let mut old = None;
        while let Some(&(at, n)) = seen.front() {
            if now.duration_since(at) < bound {
                break;
            }
            old = seen.pop_front().map(|_| (at, n));
        }
        if let Some(mark) = old {
            seen.push_front(mark);
        }
        let old = old.map(|(_, n)| n);
        old.is_some_and(|n| n > left)
    }

    /// Stops `task` (the config stream's) while it is not moving events between the spool
    /// and memory: aborted in the middle of a refill, it would drop events already taken
    /// off the spool.
    pub async fn abort_between_refills(&self, task: &tokio::task::JoinHandle<()>) {
        let _io = self.spool_io.lock().await;
        task.abort();
    }

    pub fn set_connected(&self, connected: bool) {
        self.connected.store(connected, Ordering::Relaxed);
    }

    /// A config stream is open.
    pub fn connected(&self) -> bool {
        self.connected.load(Ordering::Relaxed)
    }

    /// The node is stopping, no control plane took its events, and it has no spool to keep
    /// them in: they are lost, and counted (the count is kept for the next start when the
    /// node has a data dir). Returns how many.
    pub fn drop_held(&self) -> usize {
        self.requeue_in_flight();
        let n = {
            let mut q = self.events.lock();
            q.left += q.held as u64;
            q.held = 0;
            let n = q.pending.len();
            q.pending.clear();
            n
        };
        let reason = match self.losses.spool() {
            SpoolState::Unwritable => Reason::SpoolUnwritable,
            _ => Reason::MemoryFull,
        };
        self.losses.lose(Lost::Failover, reason, n as u64);
        n
    }

    pub fn has_spool(&self) -> bool {
        self.spool.is_some()
    }

    /// The next batch to send, now in flight until [`Self::ack_events`].
    pub fn next_event_batch(&self) -> Option<pb::FailoverEvents> {
        let batch = {
            let mut q = self.events.lock();
            if q.pending.is_empty() {
                return None;
            }
            let n = q.pending.len().min(EVENTS_PER_BATCH);
            let events: Vec<_> = q.pending.drain(..n).collect();
            q.next_seq += 1;
            pb::FailoverEvents { seq: q.next_seq, events }
        };
        // Encoded outside the lock, which requests take to push their events. Only this
        // task acks, requeues and takes batches, so nothing can miss the batch meanwhile.
        let encoded = batch.encode_to_vec();
        let events = batch.events.len();
        self.events.lock().in_flight.insert(batch.seq, InFlight { events, encoded });
        Some(batch)
    }

    /// The control plane stored every batch up to `seq`.
    pub fn ack_events(&self, seq: u64) {
        let mut q = self.events.lock();
        let acked: Vec<u64> = q.in_flight.range(..=seq).map(|(s, _)| *s).collect();
        for s in acked {
            if let Some(batch) = q.in_flight.remove(&s) {
                q.held -= batch.events;
                q.left += batch.events as u64;
            }
        }
    }

    /// A stream ended: whatever was sent but not acked goes out again, first.
    pub fn requeue_in_flight(&self) {
        for r in self.transitions.lock().reports.iter_mut() {
            r.sent = false;
        }
        self.losses.requeue();
        let mut q = self.events.lock();
        let batches = std::mem::take(&mut q.in_flight);
        for (seq, batch) in batches.into_iter().rev() {
            match pb::FailoverEvents::decode(batch.encoded.as_slice()) {
                Ok(decoded) => {
                    for event in decoded.events.into_iter().rev() {
                        q.pending.push_front(event);
                    }
                }
                // Only our own encoding is ever read here; should it fail, the loss is counted.
                Err(e) => {
                    tracing::error!(seq, error = %e, "could not read back an unacked event batch");
                    q.held -= batch.events;
                    q.left += batch.events as u64;
                    self.losses.lose(Lost::Failover, Reason::Unreadable, batch.events as u64);
                }
            }
        }
    }

    pub fn events_held(&self) -> usize {
        self.events.lock().held
    }

    /// The events held in memory only, by whether they were sent.
    pub fn events_at_risk(&self) -> crate::loss::AtRiskCount {
        let q = self.events.lock();
        let unsent = q.pending.len();
        crate::loss::AtRiskCount {
            unsent: unsent as u64,
            unacked: q.held.saturating_sub(unsent) as u64,
        }
    }

    pub fn push_transition(&self, transition: pb::BreakerTransition) {
        self.push_breaker_report(node_message::Msg::Breaker(transition));
    }

    /// A breaker as a probe left it (`probed` in the node proto).
    pub fn push_probed(&self, report: pb::BreakerTransition) {
        self.push_breaker_report(node_message::Msg::Probed(report));
    }

    fn push_breaker_report(&self, mut report: node_message::Msg) {
        let mut t = self.transitions.lock();
        let dropped = if t.reports.len() >= MAX_TRANSITIONS { t.reports.pop_front() } else { None };
        t.next_seq += 1;
        let seq = t.next_seq;
        if let node_message::Msg::Breaker(b) | node_message::Msg::Probed(b) = &mut report {
            b.seq = seq;
        }
        t.reports.push_back(BreakerReport { seq, report, sent: false });
        drop(t);
        // A probe's report only refreshes what a later report carries too; a transition
        // is an event.
        if let Some(BreakerReport { report: node_message::Msg::Breaker(_), .. }) = dropped {
            self.losses.lose(Lost::Breaker, Reason::MemoryFull, 1);
        }
    }

    /// Breaker transitions and probe reports not yet sent on this stream, oldest first, as
    /// node messages; they stay held until [`Self::ack_breakers`].
    pub fn take_breaker_reports(&self) -> Vec<node_message::Msg> {
        let mut t = self.transitions.lock();
        t.reports
            .iter_mut()
            .filter(|r| !r.sent)
            .map(|r| {
                r.sent = true;
                r.report.clone()
            })
            .collect()
    }

    /// The control plane stored every breaker report up to `seq`.
    pub fn ack_breakers(&self, seq: u64) {
        let mut t = self.transitions.lock();
        while t.reports.front().is_some_and(|r| r.seq <= seq) {
            t.reports.pop_front();
        }
    }

    /// Breaker reports sent or queued, not yet acked.
    pub fn breakers_held(&self) -> usize {
        self.transitions.lock().reports.len()
    }

    /// Usage is billed to the model that served.
    pub fn record_usage(&self, key_id: &str, model: &str, prompt: u64, completion: u64, cost: f64) {
        let mut usage = self.usage.lock();
        let models = match usage.get_mut(key_id) {
            Some(models) => models,
            None => usage.entry(key_id.to_owned()).or_default(),
        };
        let totals = match models.get_mut(model) {
            Some(totals) => totals,
            None => models.entry(model.to_owned()).or_default(),
        };
        totals.requests += 1;
        // Upstream-reported counts: saturating, so no count a provider sends panics or wraps.
        totals.prompt_tokens = totals.prompt_tokens.saturating_add(prompt);
        totals.completion_tokens = totals.completion_tokens.saturating_add(completion);
        totals.cost_usd += cost;
        self.usage_dirty.store(true, Ordering::Relaxed);
    }

    /// Totals since this process started, if anything changed since the last report.
    pub fn usage_report(&self, now_ms: i64) -> Option<pb::UsageReport> {
        if !self.usage_dirty.swap(false, Ordering::Relaxed) {
            return None;
        }
        let usage = self.usage.lock();
        let entries = usage
            .iter()
            .flat_map(|(key_id, models)| models.iter().map(move |(model, t)| (key_id, model, t)))
            .map(|(key_id, model, t)| pb::UsageEntry {
                key_id: key_id.clone(),
                model: model.clone(),
                requests: t.requests,
                prompt_tokens: t.prompt_tokens,
                completion_tokens: t.completion_tokens,
                cost_usd: t.cost_usd,
            })
            .collect();
        Some(pb::UsageReport { boot_id: self.boot_id.clone(), at_unix_ms: now_ms, entries })
    }

    /// After a failed send the next report must go out even if nothing new happened.
    pub fn mark_usage_dirty(&self) {
        self.usage_dirty.store(true, Ordering::Relaxed);
    }
}

/// A node's telemetry with a spool in `dir`, connected to a control plane.
#[cfg(test)]
pub(crate) fn spooled_for_tests(dir: &std::path::Path) -> Telemetry {
    let t = Telemetry::new("n".into(), Counter::default());
    let opened = crate::spool::Spool::open(
        dir,
        crate::spool::DEFAULT_MAX_BYTES,
        Arc::clone(&t.losses),
        Default::default(),
    )
    .unwrap_or_else(|e| panic!("{e}"));
    let t = t.with_spool(opened.spool, opened.records);
    t.set_connected(true);
    t
}

#[cfg(test)]
mod tests {
    use super::*;

    fn event(id: &str) -> pb::FailoverEvent {
        pb::FailoverEvent {
            id: id.into(),
            key_id: "key_1".into(),
            requested_model: "m1".into(),
            served_model: "m2".into(),
            attempts: vec![pb::Attempt {
                model: "m1".into(),
                status: "failed".into(),
                reason: "server_error".into(),
                latency_ms: 7,
                ..Default::default()
            }],
            status: 200,
            ..Default::default()
        }
    }

    #[test]
    fn events_stay_held_until_acked_and_go_out_again_after_a_reconnect() {
        let t = Telemetry::new("n".into(), Counter::default());
        t.push_event(event("a"));
        t.push_event(event("b"));
        let first = t.next_event_batch().unwrap();
        assert_eq!(first.events.len(), 2);
        assert!(t.next_event_batch().is_none());
        t.push_event(event("c"));
        let second = t.next_event_batch().unwrap();
        t.requeue_in_flight();
        // Both unacked batches come back whole, in their order, before anything newer.
        t.push_event(event("d"));
        let again = t.next_event_batch().unwrap();
        assert_eq!(again.events, [event("a"), event("b"), event("c"), event("d")]);
        assert!(again.seq > second.seq);
        assert_eq!(t.events_held(), 4);
        t.ack_events(again.seq);
        assert_eq!(t.events_held(), 0);
        assert_eq!(t.losses.total(), 0);
    }

    #[test]
    fn a_full_buffer_drops_and_counts() {
        let t = Telemetry::new("n".into(), Counter::default());
        for i in 0..MAX_EVENTS + 3 {
            t.push_event(event(&i.to_string()));
        }
        assert_eq!(t.losses.total(), 3);
        assert_eq!(t.events_held(), MAX_EVENTS);
        let reports = t.losses.reports_to_send();
        assert_eq!((reports[0].reason.as_str(), reports[0].count), ("memory_full", 3));
    }

    #[tokio::test]
    async fn events_beyond_memory_are_spooled_and_leave_in_order() {
        let dir = tempfile::tempdir().unwrap();
        let t = Telemetry::new("n".into(), Counter::default());
        let opened = crate::spool::Spool::open(
            dir.path(),
            crate::spool::DEFAULT_MAX_BYTES,
            Arc::clone(&t.losses),
            Default::default(),
        )
        .unwrap();
        let t = t.with_spool(opened.spool, opened.records);
        t.set_connected(true);
        let total = MAX_EVENTS + 1_200;
        for i in 0..total {
            t.push_event(event(&i.to_string()));
        }
        assert_eq!(t.events_held(), MAX_EVENTS);
        let mut sent = Vec::new();
        while sent.len() < total + 1 {
            t.refill_from_spool().await;
            let Some(batch) = t.next_event_batch() else {
                panic!("nothing to send after {} of {total} events", sent.len())
            };
            // A newer event arriving mid-drain still leaves after every spooled one.
            if sent.is_empty() {
                t.push_event(event("late"));
            }
            sent.extend(batch.events.iter().map(|e| e.id.clone()));
            t.ack_events(batch.seq);
        }
        let mut expected: Vec<String> = (0..total).map(|i| i.to_string()).collect();
        expected.push("late".into());
        assert_eq!(sent, expected);
        assert_eq!(t.losses.total(), 0);
        // Drained: new events are kept in memory again.
        t.refill_from_spool().await;
        t.push_event(event("after"));
        assert_eq!(t.next_event_batch().unwrap().events, [event("after")]);
    }

    fn spooled(dir: &std::path::Path) -> Telemetry {
        super::spooled_for_tests(dir)
    }

    /// Sends (and acks) everything held and spooled, as a control plane that takes it all
    /// would; returns the ids in the order sent.
    async fn send_all(t: &Telemetry) -> Vec<String> {
        let mut sent = Vec::new();
        loop {
            t.refill_from_spool().await;
            let Some(batch) = t.next_event_batch() else { return sent };
            sent.extend(batch.events.iter().map(|e| e.id.clone()));
            t.ack_events(batch.seq);
        }
    }

    #[tokio::test]
    async fn with_no_control_plane_connected_events_go_straight_to_the_spool_and_leave_in_order() {
        let dir = tempfile::tempdir().unwrap();
        let t = spooled(dir.path());
        t.push_event(event("a"));
        t.set_connected(false);
        t.push_event(event("b"));
        t.push_event(event("c"));
        assert_eq!(t.events_held(), 1, "only what came while connected is in memory");
        t.set_connected(true);
        let sent = send_all(&t).await;
        assert_eq!(sent, ["a", "b", "c"]);
        assert_eq!(t.losses.total(), 0);
    }

    #[tokio::test(start_paused = true)]
    async fn an_event_held_past_the_bound_is_found_at_the_next_look() {
        let bound = std::time::Duration::from_secs(1);
        let tick = std::time::Duration::from_millis(250);
        let t = Telemetry::new("n".into(), Counter::default());
        assert!(!t.held_longer_than(bound));
        t.push_event(event("a"));
        // A look notes what came in by then: `a`, here; `b` comes half a bound later.
        assert!(!t.held_longer_than(bound));
        for _ in 0..2 {
            tokio::time::advance(tick).await;
            assert!(!t.held_longer_than(bound));
        }
        t.push_event(event("b"));
        tokio::time::advance(tick).await;
        assert!(!t.held_longer_than(bound), "a is 750 ms old");
        tokio::time::advance(tick).await;
        assert!(t.held_longer_than(bound), "a is a bound old");
        // Both acked; `c`, sent and not acked, is looked at until it is a bound old.
        let batch = t.next_event_batch().unwrap();
        t.ack_events(batch.seq);
        t.push_event(event("c"));
        let sent = t.next_event_batch().unwrap();
        for _ in 0..4 {
            assert!(!t.held_longer_than(bound));
            tokio::time::advance(tick).await;
        }
        assert!(t.held_longer_than(bound), "c is a bound old");
        t.ack_events(sent.seq);
        assert!(!t.held_longer_than(bound), "nothing held");
    }

    #[tokio::test]
    async fn spilled_events_wait_on_disk_ahead_of_newer_ones_and_leave_in_order() {
        let dir = tempfile::tempdir().unwrap();
        let t = spooled(dir.path());
        t.push_event(event("a"));
        t.push_event(event("b"));
        let in_flight = t.next_event_batch().unwrap();
        t.push_event(event("c"));
        assert_eq!(t.spill_held().await.unwrap(), 3, "sent and queued alike");
        assert_eq!(t.events_held(), 0);
        t.push_event(event("d"));
        // A late ack of a spilled batch changes nothing: its events are sent again.
        t.ack_events(in_flight.seq);
        let sent = send_all(&t).await;
        assert_eq!(sent, ["a", "b", "c", "d"]);
        assert_eq!(t.losses.total(), 0);
        // The spool drained: new events are held in memory again.
        t.refill_from_spool().await;
        t.push_event(event("e"));
        assert_eq!(t.events_held(), 1);
    }

    #[tokio::test]
    async fn spilled_events_are_found_by_the_next_start() {
        let dir = tempfile::tempdir().unwrap();
        {
            let t = spooled(dir.path());
            t.push_event(event("a"));
            t.spill_held().await.unwrap();
            t.push_event(event("b"));
            t.sync_spool().await.unwrap();
        }
        let t = spooled(dir.path());
        t.refill_from_spool().await;
        let ids: Vec<String> =
            t.next_event_batch().unwrap().events.into_iter().map(|e| e.id).collect();
        assert_eq!(ids, ["a", "b"]);
    }

    fn transition(to: &str) -> pb::BreakerTransition {
        pb::BreakerTransition { provider: "p".into(), to: to.into(), ..Default::default() }
    }

    #[test]
    fn breaker_reports_stay_held_until_acked_and_go_out_again_after_a_reconnect() {
        let t = Telemetry::new("n".into(), Counter::default());
        t.push_transition(transition("open"));
        t.push_probed(transition("open"));
        let sent = t.take_breaker_reports();
        assert_eq!(sent.len(), 2);
        assert!(t.take_breaker_reports().is_empty(), "sent on this stream already");
        let seqs: Vec<u64> = sent
            .iter()
            .map(|m| match m {
                node_message::Msg::Breaker(b) | node_message::Msg::Probed(b) => b.seq,
                _ => 0,
            })
            .collect();
        assert_eq!(seqs, [1, 2]);
        t.ack_breakers(1);
        t.push_transition(transition("half_open"));
        // The stream ends: the unacked probe report and the new transition go out, in order.
        t.requeue_in_flight();
        let again = t.take_breaker_reports();
        assert!(matches!(&again[0], node_message::Msg::Probed(b) if b.seq == 2));
        assert!(
            matches!(&again[1], node_message::Msg::Breaker(b) if b.seq == 3 && b.to == "half_open")
        );
        t.ack_breakers(3);
        assert_eq!(t.breakers_held(), 0);
    }

    #[test]
    fn a_full_breaker_queue_counts_a_transition_it_drops_as_lost() {
        let t = Telemetry::new("n".into(), Counter::default());
        t.push_transition(transition("open"));
        for _ in 0..MAX_TRANSITIONS {
            t.push_probed(transition("open"));
        }
        assert_eq!(t.breakers_held(), MAX_TRANSITIONS);
        let reports = t.losses.reports_to_send();
        assert_eq!(reports.len(), 1);
        assert_eq!((reports[0].events.as_str(), reports[0].count), ("breaker", 1));
        assert_eq!(t.losses.total(), 1);
    }

    #[test]
    fn usage_reports_are_cumulative_totals() {
        let t = Telemetry::new("n".into(), Counter::default());
        t.record_usage("k", "m", 10, 5, 0.5);
        t.record_usage("k", "m", 1, 1, 0.25);
        t.record_usage("k", "other", 3, 0, 0.0);
        let mut r = t.usage_report(0).unwrap();
        r.entries.sort_by(|a, b| a.model.cmp(&b.model));
        assert_eq!(r.entries.len(), 2);
        assert_eq!((r.entries[0].model.as_str(), r.entries[0].requests), ("m", 2));
        assert_eq!(r.entries[0].prompt_tokens, 11);
        assert_eq!((r.entries[1].model.as_str(), r.entries[1].prompt_tokens), ("other", 3));
        assert!(t.usage_report(0).is_none(), "nothing new, nothing sent");
    }
}
