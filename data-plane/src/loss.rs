//! Events the node could not keep, counted by why, and reported to the control plane until
//! it acks them (docs/operating.md, "No event lost silently"). A bound that discards an
//! event never does so silently: the loss is counted in
//! `switchyard_failover_events_dropped_total`, logged (at most every [`WARN_INTERVAL`]),
//! shown in `/readyz`'s body, and stored as a counted `events.lost` audit entry once a
//! control plane takes the report.
//!
//! Reports are held like failover events: at most one report per (events, reason) is in
//! flight; what is lost meanwhile is added to the next. A report keeps its id across
//! resends, so a control plane that stored one but whose ack was lost writes the same audit
//! entry again instead of a second one. A node keeps the reports no control plane acked yet
//! in `<data-dir>/events-lost` ([`save`], [`load`]) for its next start: at its stop, and
//! while it runs within a tick of a change ([`crate::custody`]), so that a kill keeps them too.
//! Events a kill took with it are counted from `<data-dir>/events-at-risk`
//! ([`AtRisk`], [`take_at_risk`]) as `node_killed`.

use std::io;
use std::path::Path;

use parking_lot::Mutex;
use prost::Message;

use std::collections::BTreeMap;
use std::time::{Duration, Instant};

use prometheus_client::metrics::counter::Counter;

use switchyard_proto::node::v1 as pb;

/// Loss warnings are logged at most this often (a storm would otherwise log per event).
const WARN_INTERVAL: Duration = Duration::from_secs(10);

/// Why an event was discarded.
#[derive(Clone, Copy, Debug, PartialEq, Eq, PartialOrd, Ord)]
pub enum Reason {
    /// The memory bound was reached and the node has no spool (no `--data-dir`).
    MemoryFull,
    /// The spool's thread could not take the event as fast as they came.
    SpoolBusy,
    /// The spool reached `--event-spool-max-mib`.
    SpoolFull,
    /// The spool's directory or files cannot be written.
    SpoolUnwritable,
    /// A record read back (from the spool, or a batch held for resending) was unreadable.
    Unreadable,
    /// Held in memory, never sent, when the node's process ended without stopping (a kill,
    /// a crash): counted by its next start.
    NodeKilled,
    /// Held in memory, sent to a control plane that had not acked them, when the node's
    /// process ended without stopping: stored or not, the node cannot tell (the audit log
    /// may hold some of them). Counted by its next start.
    NodeKilledUnacked,
}

impl Reason {
    pub fn as_str(self) -> &'static str {
        match self {
            Reason::MemoryFull => "memory_full",
            Reason::SpoolBusy => "spool_busy",
            Reason::SpoolFull => "spool_full",
            Reason::SpoolUnwritable => "spool_unwritable",
            Reason::Unreadable => "unreadable",
            Reason::NodeKilled => "node_killed",
            Reason::NodeKilledUnacked => "node_killed_unacked",
        }
    }
}

/// Which events were lost.
#[derive(Clone, Copy, Debug, PartialEq, Eq, PartialOrd, Ord)]
pub enum Lost {
    /// `api:model_failover` and `api:degraded_response` events.
    Failover,
    /// Breaker transitions (`breaker.*`).
    Breaker,
}

impl Lost {
    pub fn as_str(self) -> &'static str {
        match self {
            Lost::Failover => "failover",
            Lost::Breaker => "breaker",
        }
    }
}

/// The spool as `/readyz` shows it.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum SpoolState {
    /// No `--data-dir`: nothing beyond the memory bound is kept.
    None,
    Ok,
    /// The last event offered to it did not fit.
    Full,
    /// It could not be opened, or the last write failed.
    Unwritable,
}

impl SpoolState {
    pub fn as_str(self) -> &'static str {
        match self {
            SpoolState::None => "none",
            SpoolState::Ok => "ok",
            SpoolState::Full => "full",
            SpoolState::Unwritable => "unwritable",
        }
    }
}

#[derive(Clone, Copy)]
struct Pending {
    count: u64,
    first_unix_ms: i64,
    last_unix_ms: i64,
}

struct Report {
    report: pb::EventsLost,
    /// Sent on the current stream; a new stream sends it again.
    sent: bool,
}

struct Inner {
    total: u64,
    pending: BTreeMap<(Lost, Reason), Pending>,
    /// Reports sent or to send, by id, until acked.
    in_flight: BTreeMap<String, Report>,
    next_report: u64,
    spool: SpoolState,
    last_warning: Option<Instant>,
    /// Lost since the last warning.
    unwarned: u64,
    /// Grows with every change to what is unacked, so that [`Losses::changes`] tells when
    /// the saved copy is stale.
    changes: u64,
}

pub struct Losses {
    /// `switchyard_failover_events_dropped_total`.
    counter: Counter,
    /// Tells this node run's report ids from those of its earlier runs.
    boot_id: String,
    inner: Mutex<Inner>,
}

impl Losses {
    pub fn new(counter: Counter, boot_id: String) -> Self {
        Self {
            counter,
            boot_id,
            inner: Mutex::new(Inner {
                total: 0,
                pending: BTreeMap::new(),
                in_flight: BTreeMap::new(),
                next_report: 0,
                spool: SpoolState::None,
                last_warning: None,
                unwarned: 0,
                changes: 0,
            }),
        }
    }

    /// Counts `n` events of `what` discarded for `reason`, and logs it (rate-limited).
    pub fn lose(&self, what: Lost, reason: Reason, n: u64) {
        if n == 0 {
            return;
        }
        let now = switchyard_time::now_ms();
        // The metric is the failover events' (the storm benchmark's sum); a lost breaker
        // transition is logged and reported.
        if what == Lost::Failover {
            self.counter.inc_by(n);
        }
        let mut inner = self.inner.lock();
        inner.total += n;
        inner.unwarned += n;
        inner.changes += 1;
        let pending = inner.pending.entry((what, reason)).or_insert(Pending {
            count: 0,
            first_unix_ms: now,
            last_unix_ms: now,
        });
        pending.count += n;
        pending.last_unix_ms = now;
        let due = inner.last_warning.is_none_or(|at| at.elapsed() >= WARN_INTERVAL);
        if due {
            let (lost, total) = (inner.unwarned, inner.total);
            inner.unwarned = 0;
            inner.last_warning = Some(Instant::now());
            drop(inner);
            tracing::warn!(
                lost,
                total,
                events = what.as_str(),
                reason = reason.as_str(),
                "events lost: counted, and reported to the control plane as events.lost"
            );
        }
    }

    /// Everything lost since the node started.
    pub fn total(&self) -> u64 {
        self.inner.lock().total
    }

    pub fn set_spool(&self, state: SpoolState) {
        self.inner.lock().spool = state;
    }

    pub fn spool(&self) -> SpoolState {
        self.inner.lock().spool
    }

    /// Reports to send on the current stream: those not sent on it yet, including new ones
    /// for what was lost since (one per (events, reason) with none in flight).
    pub fn reports_to_send(&self) -> Vec<pb::EventsLost> {
        let mut inner = self.inner.lock();
        let busy: Vec<(String, String)> = inner
            .in_flight
            .values()
            .map(|r| (r.report.events.clone(), r.report.reason.clone()))
            .collect();
        let ready: Vec<(Lost, Reason)> = inner
            .pending
            .keys()
            .filter(|(what, reason)| {
                !busy.iter().any(|(w, r)| w == what.as_str() && r == reason.as_str())
            })
            .copied()
            .collect();
        for key in ready {
            self.report_pending(&mut inner, key);
        }
        inner
            .in_flight
            .values_mut()
            .filter(|r| !r.sent)
            .map(|r| {
                r.sent = true;
                r.report.clone()
            })
            .collect()
    }

    /// Moves what is counted for `key` into a new report, to send.
    fn report_pending(&self, inner: &mut Inner, key: (Lost, Reason)) {
        let Some(p) = inner.pending.remove(&key) else { return };
        inner.next_report += 1;
        let id = format!("lost_{}_{}", self.boot_id, inner.next_report);
        let report = pb::EventsLost {
            id: id.clone(),
            count: p.count,
            reason: key.1.as_str().to_owned(),
            events: key.0.as_str().to_owned(),
            first_unix_ms: p.first_unix_ms,
            last_unix_ms: p.last_unix_ms,
        };
        inner.in_flight.insert(id, Report { report, sent: false });
    }

    /// The control plane stored report `id`.
    pub fn ack(&self, id: &str) {
        let mut inner = self.inner.lock();
        if inner.in_flight.remove(id).is_some() {
            inner.changes += 1;
        }
    }

    /// Changes the unacked losses since the node started: a different value than before,
    /// something to save.
    pub fn changes(&self) -> u64 {
        self.inner.lock().changes
    }

    /// A stream ended: the reports it did not ack go out again on the next.
    pub fn requeue(&self) {
        for r in self.inner.lock().in_flight.values_mut() {
            r.sent = false;
        }
    }

    /// Every report not yet acked, what is counted but not yet in a report included (for
    /// [`save`]).
    pub fn unacked(&self) -> Vec<pb::EventsLost> {
        let mut inner = self.inner.lock();
        let keys: Vec<(Lost, Reason)> = inner.pending.keys().copied().collect();
        for key in keys {
            self.report_pending(&mut inner, key);
        }
        inner.in_flight.values().map(|r| r.report.clone()).collect()
    }

    /// Reports an earlier run of the node saved: sent, under their ids, like its own.
    pub fn restore(&self, reports: Vec<pb::EventsLost>) {
        let mut inner = self.inner.lock();
        for report in reports {
            inner.in_flight.insert(report.id.clone(), Report { report, sent: false });
        }
        inner.changes += 1;
    }

    /// Whether some loss is not yet acked by a control plane.
    pub fn unreported(&self) -> bool {
        let inner = self.inner.lock();
        !inner.pending.is_empty() || !inner.in_flight.is_empty()
    }
}

/// The file in the data dir that keeps unacked reports across a restart.
const FILE: &str = "events-lost";

/// Writes `reports` (length-delimited protobuf) to `<dir>/events-lost`, replacing it
/// whole (a temporary file, synced, renamed); with none, removes the file.
pub fn save(dir: &Path, reports: &[pb::EventsLost]) -> io::Result<()> {
    let path = dir.join(FILE);
    if reports.is_empty() {
        return match std::fs::remove_file(&path) {
            Err(e) if e.kind() != io::ErrorKind::NotFound => Err(e),
            _ => Ok(()),
        };
    }
    let mut out = Vec::new();
    for report in reports {
        report.encode_length_delimited(&mut out).map_err(io::Error::other)?;
    }
    let tmp = dir.join(format!("{FILE}.tmp"));
    let mut file = std::fs::File::create(&tmp)?;
    io::Write::write_all(&mut file, &out)?;
    file.sync_all()?;
    std::fs::rename(&tmp, &path)
}

/// The reports an earlier run saved. The file stays: it is replaced by the next [`save`],
/// so a node killed before a control plane acked them still has them. An unreadable rest
/// is logged and skipped.
pub fn load(dir: &Path) -> io::Result<Vec<pb::EventsLost>> {
    let path = dir.join(FILE);
    let bytes = match std::fs::read(&path) {
        Ok(bytes) => bytes,
        Err(e) if e.kind() == io::ErrorKind::NotFound => return Ok(Vec::new()),
        Err(e) => return Err(e),
    };
    let mut reports = Vec::new();
    let mut rest = bytes.as_slice();
    while !rest.is_empty() {
        match pb::EventsLost::decode_length_delimited(&mut rest) {
            Ok(report) => reports.push(report),
            Err(e) => {
                tracing::warn!(file = %path.display(), error = %e, "the saved count of lost events ends unreadable; skipping the rest");
                break;
            }
        }
    }
    Ok(reports)
}

/// The file in the data dir that says how many failover events the running node holds in
/// memory only: those a kill would take with it.
const AT_RISK_FILE: &str = "events-at-risk";

/// Removes the record of events held in memory only: none are (a clean stop, or a start
/// that has counted them).
pub fn clear_at_risk(dir: &Path) -> io::Result<()> {
    match std::fs::remove_file(dir.join(AT_RISK_FILE)) {
        Err(e) if e.kind() != io::ErrorKind::NotFound => Err(e),
        _ => Ok(()),
    }
}

/// Failover events held in memory only, by whether a control plane may have them.
#[derive(Clone, Copy, Debug, Default, PartialEq, Eq)]
pub struct AtRiskCount {
    /// Never sent.
    pub unsent: u64,
    /// Sent, not acked.
    pub unacked: u64,
}

/// The running node's record of how many failover events it holds in memory only, written
/// in place: one write of a fixed width, which a kill of the process cannot tear.
pub struct AtRisk {
    path: std::path::PathBuf,
    file: Option<std::fs::File>,
    recorded: Option<AtRiskCount>,
}

impl AtRisk {
    pub fn new(dir: &Path) -> Self {
        Self { path: dir.join(AT_RISK_FILE), file: None, recorded: None }
    }

    /// What the file says, as far as this run wrote it.
    pub fn recorded(&self) -> Option<AtRiskCount> {
        self.recorded
    }

    /// Records `count`. Blocks on the disk (a write to the page cache, not a sync).
    pub fn record(&mut self, count: AtRiskCount) -> io::Result<()> {
        use std::os::unix::fs::FileExt;
        let file = match &mut self.file {
            Some(file) => file,
            None => self.file.insert(
                std::fs::OpenOptions::new()
                    .create(true)
                    .write(true)
                    .truncate(true)
                    .open(&self.path)?,
            ),
        };
        // u64::MAX has 20 digits: every record overwrites the whole of the last one.
        let line = format!("{:<20} {:<20}\n", count.unsent, count.unacked);
        file.write_all_at(line.as_bytes(), 0)?;
        self.recorded = Some(count);
        Ok(())
    }
}

/// What an earlier run recorded with [`AtRisk`] and did not clear: it ended without
/// stopping, and those events are gone. Leaves the record in place: the caller clears it
/// ([`clear_at_risk`]) once the count is saved as a loss. An unreadable record counts as
/// none, and says so.
pub fn take_at_risk(dir: &Path) -> io::Result<AtRiskCount> {
    let path = dir.join(AT_RISK_FILE);
    let text = match std::fs::read_to_string(&path) {
        Ok(text) => text,
        Err(e) if e.kind() == io::ErrorKind::NotFound => return Ok(AtRiskCount::default()),
        Err(e) => return Err(e),
    };
    let mut fields = text.split_whitespace().map(str::parse::<u64>);
    match (fields.next(), fields.next()) {
        (Some(Ok(unsent)), Some(Ok(unacked))) => Ok(AtRiskCount { unsent, unacked }),
        _ => {
            tracing::warn!(file = %path.display(), "an unreadable count of events at risk; taken as none");
            Ok(AtRiskCount::default())
        }
    }
}

#[cfg(test)]
mod tests {
    #![allow(clippy::unwrap_used)]
    use super::*;

    #[test]
    fn losses_are_reported_until_acked_and_what_comes_meanwhile_goes_in_the_next_report() {
        let losses = Losses::new(Counter::default(), "b1".into());
        losses.lose(Lost::Failover, Reason::SpoolFull, 3);
        losses.lose(Lost::Failover, Reason::SpoolFull, 2);
        let first = losses.reports_to_send();
        assert_eq!(first.len(), 1);
        assert_eq!((first[0].count, first[0].reason.as_str()), (5, "spool_full"));
        assert!(losses.reports_to_send().is_empty(), "sent on this stream already");
        // More lost while the first report is in flight: held for a report of its own.
        losses.lose(Lost::Failover, Reason::SpoolFull, 4);
        assert!(losses.reports_to_send().is_empty());
        // The stream ends unacked: the same report (same id) goes out again.
        losses.requeue();
        let again = losses.reports_to_send();
        assert_eq!(again, first);
        losses.ack(&first[0].id);
        let next = losses.reports_to_send();
        assert_eq!(next.len(), 1);
        assert_eq!(next[0].count, 4);
        assert_ne!(next[0].id, first[0].id);
        assert!(losses.unreported());
        losses.ack(&next[0].id);
        assert!(!losses.unreported());
        assert_eq!((losses.total(), losses.counter.get()), (9, 9));
    }

    #[test]
    fn unacked_reports_are_saved_for_the_next_start_and_sent_under_their_ids() {
        let dir = tempfile::tempdir().unwrap();
        let losses = Losses::new(Counter::default(), "b1".into());
        losses.lose(Lost::Failover, Reason::SpoolUnwritable, 7);
        let sent = losses.reports_to_send();
        losses.lose(Lost::Failover, Reason::SpoolUnwritable, 2);
        let unacked = losses.unacked();
        assert_eq!(unacked.len(), 2, "the one sent and the one counted since");
        save(dir.path(), &unacked).unwrap();

        let next = Losses::new(Counter::default(), "b2".into());
        next.restore(load(dir.path()).unwrap());
        assert!(dir.path().join(FILE).exists(), "kept until saved again: a kill keeps it");
        let mut resent = next.reports_to_send();
        resent.sort_by_key(|r| r.count);
        assert_eq!((resent[0].count, resent[1].count), (2, 7));
        assert_eq!(resent[1].id, sent[0].id, "the same id: one audit entry");
        assert_eq!(next.total(), 0, "the counter is this run's");
        save(dir.path(), &[]).unwrap();
        assert!(load(dir.path()).unwrap().is_empty());
    }

    #[test]
    fn the_count_at_risk_is_written_over_in_place_and_read_by_the_next_start() {
        let dir = tempfile::tempdir().unwrap();
        let none = AtRiskCount::default();
        assert_eq!(take_at_risk(dir.path()).unwrap(), none, "no record: none");
        let mut record = AtRisk::new(dir.path());
        record.record(AtRiskCount { unsent: 123_456, unacked: 9_999 }).unwrap();
        let later = AtRiskCount { unsent: 7, unacked: 3 };
        record.record(later).unwrap();
        assert_eq!(take_at_risk(dir.path()).unwrap(), later, "no digits left behind");
        assert_eq!(take_at_risk(dir.path()).unwrap(), later, "read, not taken: cleared apart");
        clear_at_risk(dir.path()).unwrap();
        assert_eq!(take_at_risk(dir.path()).unwrap(), none);
    }

    #[test]
    fn each_reason_and_kind_is_reported_apart() {
        let losses = Losses::new(Counter::default(), "b1".into());
        losses.lose(Lost::Failover, Reason::MemoryFull, 1);
        losses.lose(Lost::Failover, Reason::Unreadable, 2);
        losses.lose(Lost::Breaker, Reason::MemoryFull, 3);
        let mut reports: Vec<_> =
            losses.reports_to_send().into_iter().map(|r| (r.events, r.reason, r.count)).collect();
        reports.sort();
        assert_eq!(
            reports,
            [
                ("breaker".to_owned(), "memory_full".to_owned(), 3),
                ("failover".to_owned(), "memory_full".to_owned(), 1),
                ("failover".to_owned(), "unreadable".to_owned(), 2),
            ]
        );
    }
}
