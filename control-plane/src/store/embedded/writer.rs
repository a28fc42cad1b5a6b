//! The writer thread: the only code that mutates the state or touches the files once the
//! store is open.
//!
//! One thread, not a task, because every write ends in an fsync, which would block a
//! runtime worker. A change is planned against the state, made durable, and only then
//! applied, so readers never see a write a crash could still lose. Transactions waiting in
//! the queue together are committed with one fsync (a group commit, [`Writer::txn_group`]),
//! lease expiry runs on the same thread between commands, and the snapshot is rewritten
//! here when the log grows too long.

use std::collections::HashSet;
use std::fs::File;
use std::io::Write;
use std::sync::Arc;
use std::sync::mpsc as std_mpsc;
use std::time::{Duration, Instant};

use parking_lot::Mutex;
use rand::{Rng, SeedableRng};
use tokio::sync::{oneshot, watch};

use super::format::{Change, LogEntry, Record, SNAPSHOT_FILE, SNAPSHOT_TMP_FILE};
use super::options::Options;
use super::recovery::{Files, in_dir, sync_dir};
use super::state::{MAX_LEASE_TTL, State, deadline};
use crate::store::api::{LeaseId, Revision, StoreError, Txn, TxnOp, TxnResult};

/// How often the writer thread looks for expired leases.
const EXPIRY_TICK: Duration = Duration::from_millis(250);
/// The writer keeps its log-line buffer between records up to this capacity.
const MAX_KEPT_LINE: usize = 1024 * 1024;
/// Transactions committed with one fsync at most (see [`Writer::txn_group`]).
const MAX_GROUP: usize = 64;

pub(super) type TxnReply = oneshot::Sender<Result<TxnResult, StoreError>>;

/// A request to the writer thread; each carries the channel its answer goes back on.
pub(super) enum Command {
    Txn(Txn, TxnReply),
    Grant(Duration, oneshot::Sender<Result<LeaseId, StoreError>>),
    KeepAlive(LeaseId, oneshot::Sender<Result<Duration, StoreError>>),
    Revoke(LeaseId, oneshot::Sender<Result<(), StoreError>>),
    Compact(Revision, oneshot::Sender<Result<(), StoreError>>),
    Close(oneshot::Sender<()>),
}

/// A transaction of a group commit, planned and waiting for the group's fsync.
struct Planned {
    reply: TxnReply,
    succeeded: bool,
    changes: Vec<Change>,
}

/// Whether `txn` compares or changes a key in `written` (or deletes a prefix holding one).
fn touches(txn: &Txn, written: &HashSet<String>) -> bool {
    txn.compare.iter().any(|c| written.contains(&c.key))
        || txn.success.iter().chain(&txn.failure).any(|op| match op {
            TxnOp::Put { key, .. } | TxnOp::Delete { key } => written.contains(key),
            TxnOp::DeletePrefix { prefix } => {
                written.iter().any(|k| k.starts_with(prefix.as_str()))
            }
            TxnOp::DeleteRange { start, end } => {
                written.iter().any(|k| start.as_str() <= k.as_str() && k.as_str() < end.as_str())
            }
        })
}

pub(super) struct Writer {
    state: Arc<Mutex<State>>,
    files: Files,
    seq: u64,
    log_len: u64,
    options: Options,
    revisions: watch::Sender<Revision>,
    rng: rand::rngs::StdRng,
    /// After a failed write the log may end in a partial record; refusing further writes
    /// keeps what is on disk replayable.
    failed: Option<String>,
    /// The log line being encoded, reused from record to record.
    line: Vec<u8>,
}

impl Writer {
    /// Takes over the directory recovery opened (`files`, with `log_len` bytes of records up
    /// to sequence number `seq`); `revisions` is told every revision applied.
    pub(super) fn new(
        state: Arc<Mutex<State>>,
        files: Files,
        seq: u64,
        log_len: u64,
        options: Options,
        revisions: watch::Sender<Revision>,
    ) -> Self {
        Self {
            state,
            files,
            seq,
            log_len,
            options,
            revisions,
            rng: rand::rngs::StdRng::from_os_rng(),
            failed: None,
            line: Vec::new(),
        }
    }

    /// The thread's loop: handles commands until the store closes or is dropped.
    pub(super) fn run(mut self, commands: std_mpsc::Receiver<Command>) {
        let mut last_expiry = Instant::now();
        // A command taken from the queue while gathering a group commit, handled next.
        let mut next = None;
        loop {
            let command = match next.take() {
                Some(command) => Ok(command),
                None => commands.recv_timeout(EXPIRY_TICK),
            };
            match command {
                Ok(Command::Close(done)) => {
                    drop(self);
                    let _ = done.send(());
                    return;
                }
                Ok(command) => next = self.handle(command, &commands),
                Err(std_mpsc::RecvTimeoutError::Timeout) => {}
                Err(std_mpsc::RecvTimeoutError::Disconnected) => return,
            }
            if last_expiry.elapsed() >= EXPIRY_TICK {
                last_expiry = Instant::now();
                self.expire_leases();
            }
        }
    }

    /// Commits `txn` together with the transactions queued behind it, with one write and
    /// one fsync for all of them ("group commit"): in an outage storm the audit log arrives
    /// as several transactions at once (etcd's limit of 128 operations each), and an fsync
    /// per transaction was the largest single cost of the control plane. Transactions are
    /// planned in queue order against the state before the group; one that touches a key an
    /// earlier member writes ends the group there, so every plan is the one it would have
    /// had alone. Returns the first queued command that is not a transaction.
    fn txn_group(
        &mut self,
        txn: Txn,
        reply: TxnReply,
        commands: &std_mpsc::Receiver<Command>,
    ) -> Option<Command> {
        let mut queued = vec![(txn, reply)];
        let mut rest = None;
        while queued.len() < MAX_GROUP {
            match commands.try_recv() {
                Ok(Command::Txn(txn, reply)) => queued.push((txn, reply)),
                Ok(other) => {
                    rest = Some(other);
                    break;
                }
                Err(_) => break,
            }
        }
        let mut group: Vec<Planned> = Vec::with_capacity(queued.len());
        // A lone transaction cannot conflict with anything: no key set to build.
        let track = queued.len() > 1;
        let mut written: HashSet<String> = HashSet::new();
        for (txn, reply) in queued {
            if !written.is_empty() && touches(&txn, &written) {
                self.commit_group(std::mem::take(&mut group));
                written.clear();
            }
            match self.state.lock().plan_txn(txn) {
                Ok((succeeded, changes)) => {
                    if track {
                        written.extend(changes.iter().map(|c| c.key().to_owned()));
                    }
                    group.push(Planned { reply, succeeded, changes });
                }
                Err(e) => {
                    let _ = reply.send(Err(e));
                }
            }
        }
        self.commit_group(group);
        rest
    }

    /// Makes the planned transactions durable with one fsync, applies them in order and
    /// answers each with the revision its own commit reached.
    fn commit_group(&mut self, group: Vec<Planned>) {
        if group.is_empty() {
            return;
        }
        let mut replies = Vec::with_capacity(group.len());
        let mut records = Vec::with_capacity(group.len());
        for planned in group {
            // A transaction that changes nothing reports the revision it saw.
            let writes = !planned.changes.is_empty();
            replies.push((planned.reply, planned.succeeded, records.len() + usize::from(writes)));
            if writes {
                records.push(Record::Commit { changes: planned.changes });
            }
        }
        let start = self.state.lock().revision;
        match self.write_records(records) {
            Ok(revisions) => {
                for (reply, succeeded, applied) in replies {
                    // `applied` counts this transaction's own record, if it has one.
                    let revision = applied.checked_sub(1).and_then(|i| revisions.get(i)).copied();
                    let revision = revision.unwrap_or(start);
                    let _ = reply.send(Ok(TxnResult { succeeded, revision }));
                }
            }
            // Nothing of the group was applied; each member learns why (a lone transaction
            // gets the error itself, as before group commits).
            Err(e) => {
                let message = e.to_string();
                let mut lone = (replies.len() == 1).then_some(e);
                for (reply, _, _) in replies {
                    let e = lone.take().unwrap_or_else(|| StoreError::Unavailable(message.clone()));
                    let _ = reply.send(Err(e));
                }
            }
        }
    }

    /// Carries out `command`; returns a command taken from the queue meanwhile (see
    /// [`Self::txn_group`]), to be handled next.
    fn handle(
        &mut self,
        command: Command,
        commands: &std_mpsc::Receiver<Command>,
    ) -> Option<Command> {
        match command {
            Command::Txn(txn, reply) => return self.txn_group(txn, reply, commands),
            Command::Grant(ttl, reply) => {
                let _ = reply.send(self.grant(ttl));
            }
            Command::KeepAlive(id, reply) => {
                let _ = reply.send(self.keep_alive(id));
            }
            Command::Revoke(id, reply) => {
                let _ = reply.send(self.revoke(id));
            }
            Command::Compact(revision, reply) => {
                let _ = reply.send(self.compact(revision));
            }
            Command::Close(_) => {}
        }
        None
    }

    fn grant(&mut self, ttl: Duration) -> Result<LeaseId, StoreError> {
        if ttl > MAX_LEASE_TTL {
            return Err(StoreError::InvalidRequest(format!(
                "lease TTL {ttl:?} is longer than the maximum {MAX_LEASE_TTL:?}"
            )));
        }
        let ttl_ms = u64::try_from(ttl.as_millis()).unwrap_or(u64::MAX).max(1);
        let id = {
            let st = self.state.lock();
            loop {
                // etcd lease IDs are positive; 0 means "no lease".
                let id = self.rng.random::<i64>() & i64::MAX;
                if id != 0 && !st.leases.contains_key(&id) {
                    break id;
                }
            }
        };
        self.write(Record::Grant { id, ttl_ms })?;
        Ok(id)
    }

    fn keep_alive(&mut self, id: LeaseId) -> Result<Duration, StoreError> {
        // Deadlines are not persisted (a restart renews every lease), so this needs no write.
        let mut st = self.state.lock();
        let now = Instant::now();
        match st.leases.get_mut(&id) {
            Some(lease) if lease.deadline > now => {
                lease.deadline = deadline(now, lease.ttl);
                Ok(lease.ttl)
            }
            _ => Err(StoreError::LeaseNotFound(id)),
        }
    }

    fn revoke(&mut self, id: LeaseId) -> Result<(), StoreError> {
        if !self.state.lock().leases.contains_key(&id) {
            return Err(StoreError::LeaseNotFound(id));
        }
        self.write(Record::Revoke { id })
    }

    fn compact(&mut self, revision: Revision) -> Result<(), StoreError> {
        let (current, floor) = {
            let st = self.state.lock();
            (st.revision, st.floor)
        };
        if revision > current {
            return Err(StoreError::InvalidRequest(format!(
                "cannot compact to revision {revision}: the store is at revision {current}"
            )));
        }
        if revision <= floor {
            return Ok(());
        }
        self.write(Record::Compact { revision })
    }

    fn expire_leases(&mut self) {
        let now = Instant::now();
        let expired: Vec<LeaseId> = self
            .state
            .lock()
            .leases
            .iter()
            .filter(|(_, l)| l.deadline <= now)
            .map(|(id, _)| *id)
            .collect();
        for id in expired {
            if let Err(e) = self.write(Record::Revoke { id }) {
                tracing::error!(error = %e, lease = id, "embedded store could not expire a lease");
                return;
            }
        }
    }

    /// Makes `record` durable, then applies it and wakes the watchers.
    fn write(&mut self, record: Record) -> Result<(), StoreError> {
        self.write_records(vec![record]).map(|_| ())
    }

    /// Makes `records` durable with one write and one fsync, then applies them in order and
    /// wakes the watchers. Returns the store's revision after each record.
    fn write_records(&mut self, records: Vec<Record>) -> Result<Vec<Revision>, StoreError> {
        // A group of transactions that all changed nothing: no fsync for an empty write.
        if records.is_empty() {
            return Ok(Vec::new());
        }
        if let Some(reason) = &self.failed {
            return Err(StoreError::Unavailable(format!(
                "embedded store stopped accepting writes: {reason}"
            )));
        }
        let entries: Vec<LogEntry> = records
            .into_iter()
            .zip(self.seq + 1..)
            .map(|(record, seq)| LogEntry { seq, record })
            .collect();
        let mut line = std::mem::take(&mut self.line);
        line.clear();
        for entry in &entries {
            serde_json::to_writer(&mut line, entry)
                .map_err(|e| StoreError::Corrupt(format!("encoding a record: {e}")))?;
            line.push(b'\n');
        }
        let written = self.files.log.write_all(&line).and_then(|()| self.files.log.sync_data());
        let line_len = line.len() as u64;
        // Kept for the next record, unless one huge record would pin its size for good.
        if line.capacity() <= MAX_KEPT_LINE {
            self.line = line;
        }
        if let Err(e) = written {
            let e = in_dir(&self.files.dir, e.into());
            self.failed = Some(e.to_string());
            return Err(e);
        }
        self.log_len += line_len;
        let mut revisions = Vec::with_capacity(entries.len());
        {
            let mut st = self.state.lock();
            let now = Instant::now();
            for entry in entries {
                self.seq = entry.seq;
                st.apply(entry.record, now, self.options.retain_revisions);
                revisions.push(st.revision);
            }
        }
        if let Some(revision) = revisions.last() {
            self.revisions.send_replace(*revision);
        }
        if self.log_len > self.options.log_rewrite_bytes
            && let Err(e) = self.rewrite()
        {
            // The records themselves are durable in the log; only the rewrite failed.
            let e = in_dir(&self.files.dir, e);
            tracing::error!(error = %e, "embedded store could not rewrite its snapshot");
        }
        Ok(revisions)
    }

    fn rewrite(&mut self) -> Result<(), StoreError> {
        // Copied under the lock, encoded outside it: readers wait for a copy, not for JSON.
        let snapshot = self.state.lock().snapshot(self.seq);
        // Streamed to the file: a snapshot of a full audit log is large, and as one buffer it
        // would be allocated, page-faulted in and freed on every rewrite.
        let tmp = self.files.dir.join(SNAPSHOT_TMP_FILE);
        let mut out = std::io::BufWriter::with_capacity(256 * 1024, File::create(&tmp)?);
        serde_json::to_writer(&mut out, &snapshot)
            .map_err(|e| StoreError::Corrupt(format!("encoding the snapshot: {e}")))?;
        drop(snapshot);
        let file = out.into_inner().map_err(|e| e.into_error())?;
        file.sync_all()?;
        drop(file);
        std::fs::rename(&tmp, self.files.dir.join(SNAPSHOT_FILE))?;
        sync_dir(&self.files.dir)?;
        // Records up to `seq` are in the snapshot now; should this truncate not happen, replay
        // skips them by their sequence number.
        self.files.log.set_len(0)?;
        self.files.log.sync_all()?;
        self.log_len = 0;
        Ok(())
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::store::api::Compare;

    fn put_op(key: &str, value: &str) -> TxnOp {
        TxnOp::Put { key: key.into(), value: value.as_bytes().to_vec(), lease: None }
    }

    #[test]
    fn a_transaction_touching_a_key_written_earlier_in_the_group_ends_the_group() {
        let written: HashSet<String> = ["audit/1".to_owned()].into();
        let put = |key: &str| Txn { success: vec![put_op(key, "x")], ..Txn::default() };
        assert!(!touches(&put("audit/2"), &written));
        assert!(touches(&put("audit/1"), &written));
        let compare = Txn { compare: vec![Compare::absent("audit/1")], ..Txn::default() };
        assert!(touches(&compare, &written));
        let in_failure =
            Txn { failure: vec![TxnOp::Delete { key: "audit/1".into() }], ..Txn::default() };
        assert!(touches(&in_failure, &written));
        let prefix = Txn {
            success: vec![TxnOp::DeletePrefix { prefix: "audit/".into() }],
            ..Txn::default()
        };
        assert!(touches(&prefix, &written));
        let other_prefix =
            Txn { success: vec![TxnOp::DeletePrefix { prefix: "keys/".into() }], ..Txn::default() };
        assert!(!touches(&other_prefix, &written));
    }
}
