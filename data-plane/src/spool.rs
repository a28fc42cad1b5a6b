//! Failover events the node cannot hand to a control plane yet (one is slow, or none is
//! reachable), kept on disk in `--data-dir` so that a storm or an outage loses none of
//! them, and read back oldest first once a control plane takes them again.
//!
//! Files: `<data-dir>/event-spool/<seq>.events`, each a run of records (a little-endian
//! `u32` length, then one protobuf `FailoverEvent`), appended to and read in `seq` order.
//! A file is deleted once read to its end. The spool's total size is bounded; an event
//! that does not fit, cannot be written or cannot be read back is counted as lost, by
//! reason ([`crate::loss`]), and reported to the control plane as `events.lost`.
//!
//! All file work runs on one thread of the spool's own: the request path only hands an
//! event to a bounded channel and never waits on the disk.

use std::collections::BTreeMap;
use std::fs::{self, File, OpenOptions};
use std::io::{self, BufWriter, Read, Seek, SeekFrom, Write};
use std::path::{Path, PathBuf};
use std::sync::mpsc::{Receiver, RecvTimeoutError, SyncSender, sync_channel};
use std::time::Duration;

use std::sync::Arc;

use prometheus_client::metrics::gauge::Gauge;
use prost::Message;
use tokio::sync::oneshot;

use switchyard_proto::node::v1 as pb;

use crate::loss::{Losses, Lost, Reason, SpoolState};

/// The spool's default bound on disk (`--event-spool-max-mib`).
pub const DEFAULT_MAX_BYTES: u64 = 256 * 1024 * 1024;
/// Files are this large at most, so that a drained part of the spool is freed soon.
const SEGMENT_BYTES: u64 = 4 * 1024 * 1024;
/// Events on their way to the spool thread; beyond this the request path counts the event
/// lost instead of waiting.
const CHANNEL_EVENTS: usize = 16 * 1024;
/// New files start here and count up; events handed back at shutdown go below the oldest.
const FIRST_SEQ: u64 = 1 << 40;
/// A record larger than this is not an event this node wrote: the rest of its file is
/// skipped.
const MAX_RECORD_BYTES: u32 = 16 * 1024 * 1024;

pub struct Spool {
    tx: SyncSender<Command>,
}

/// What [`Spool::open`] found on disk.
pub struct Opened {
    pub spool: Spool,
    /// Events already spooled by an earlier run, still to be sent.
    pub records: u64,
}

/// Events read back, oldest first.
pub struct Batch {
    pub events: Vec<pb::FailoverEvent>,
    /// Events this spool has disposed of since it opened, counting those found on disk at
    /// open: read back, or lost (full spool, unreadable record). Once it equals the events
    /// sent to the spool plus those found, the spool is empty.
    pub disposed: u64,
}

enum Command {
    Append(pb::FailoverEvent),
    /// Events older than everything spooled (the node's memory at shutdown).
    Prepend(Vec<pb::FailoverEvent>, oneshot::Sender<io::Result<()>>),
    Read(usize, oneshot::Sender<Batch>),
}

impl Spool {
    /// Opens (creating) the spool in `dir`, counting what an earlier run left there. Blocks
    /// on the disk: call it from a blocking context.
    pub fn open(dir: &Path, max_bytes: u64, lost: Arc<Losses>, bytes: Gauge) -> io::Result<Opened> {
        fs::create_dir_all(dir)?;
        let mut segments = BTreeMap::new();
        let mut records = 0;
        for entry in fs::read_dir(dir)? {
            let entry = entry?;
            let name = entry.file_name();
            let Some(seq) = name.to_str().and_then(|n| n.strip_suffix(".events")) else {
                continue;
            };
            let Ok(seq) = seq.parse::<u64>() else { continue };
            let size = entry.metadata()?.len();
            records += count_records(&entry.path())?;
            segments.insert(seq, size);
        }
        let total = segments.values().sum();
        bytes.set(i64::try_from(total).unwrap_or(i64::MAX));
        let state = State {
            dir: dir.to_owned(),
            max_bytes,
            segments,
            total,
            writer: None,
            offsets: BTreeMap::new(),
            disposed: 0,
            state: SpoolState::Ok,
            lost,
            bytes,
        };
        state.lost.set_spool(SpoolState::Ok);
        let (tx, rx) = sync_channel(CHANNEL_EVENTS);
        std::thread::Builder::new().name("event-spool".into()).spawn(move || state.run(rx))?;
        Ok(Opened { spool: Spool { tx }, records })
    }

    /// Hands an event to the spool without waiting; `false` when the spool's channel is
    /// full or its thread is gone (the event is then the caller's to count as lost).
    pub fn append(&self, event: pb::FailoverEvent) -> bool {
        self.tx.try_send(Command::Append(event)).is_ok()
    }

    /// Up to `max` events, oldest first; `None` if the spool thread is gone.
    pub async fn read(&self, max: usize) -> Option<Batch> {
        let (reply, answer) = oneshot::channel();
        self.send(Command::Read(max, reply)).await.ok()?;
        answer.await.ok()
    }

    /// Writes `events` ahead of everything spooled, durably, before returning.
    pub async fn prepend(&self, events: Vec<pb::FailoverEvent>) -> io::Result<()> {
        let (reply, answer) = oneshot::channel();
        self.send(Command::Prepend(events, reply)).await?;
        answer.await.map_err(|_| gone())?
    }

    /// A command that must not be dropped: waits for room off the async threads.
    async fn send(&self, command: Command) -> io::Result<()> {
        let tx = self.tx.clone();
        tokio::task::spawn_blocking(move || tx.send(command).map_err(|_| gone()))
            .await
            .map_err(|_| gone())?
    }
}

fn gone() -> io::Error {
    io::Error::other("the event spool's thread has stopped")
}

struct Writer {
    seq: u64,
    file: BufWriter<File>,
    /// The file's size after the last successful flush: what a failed write is cut back to.
    flushed_bytes: u64,
    /// Records in the buffer since then, which a failed write loses.
    unflushed: u64,
}

struct State {
    dir: PathBuf,
    max_bytes: u64,
    /// Every file of the spool by sequence number, with its size.
    segments: BTreeMap<u64, u64>,
    total: u64,
    writer: Option<Writer>,
    /// Where reading resumes in a file read in part: the offset of its next record.
    offsets: BTreeMap<u64, u64>,
    disposed: u64,
    /// As last told to `lost` (for `/readyz`), so that it is told only of changes.
    state: SpoolState,
    lost: Arc<Losses>,
    bytes: Gauge,
}

impl State {
    fn run(mut self, rx: Receiver<Command>) {
        loop {
            let command = match rx.recv_timeout(Duration::from_millis(100)) {
                Ok(command) => command,
                // Idle: what was appended reaches the file, so a crash loses little.
                Err(RecvTimeoutError::Timeout) => {
                    self.flush();
                    continue;
                }
                Err(RecvTimeoutError::Disconnected) => {
                    self.flush();
                    return;
                }
            };
            match command {
                Command::Append(event) => self.append(&event),
                Command::Prepend(events, reply) => {
                    let _ = reply.send(self.prepend(&events));
                }
                Command::Read(max, reply) => {
                    self.flush();
                    let events = self.read(max);
                    let _ = reply.send(Batch { events, disposed: self.disposed });
                }
            }
            self.bytes.set(i64::try_from(self.total).unwrap_or(i64::MAX));
        }
    }

    fn path(&self, seq: u64) -> PathBuf {
        self.dir.join(format!("{seq:020}.events"))
    }

    fn lose(&mut self, reason: Reason, n: u64) {
        self.disposed += n;
        self.lost.lose(Lost::Failover, reason, n);
    }

    fn set_state(&mut self, state: SpoolState) {
        if self.state != state {
            self.state = state;
            self.lost.set_spool(state);
        }
    }

    fn append(&mut self, event: &pb::FailoverEvent) {
        let record = encode(event);
        let size = record.len() as u64;
        if self.total + size > self.max_bytes {
            self.set_state(SpoolState::Full);
            self.lose(Reason::SpoolFull, 1);
            return;
        }
        match self.write(&record) {
            Ok(()) => self.set_state(SpoolState::Ok),
            Err(e) => self.fail_writer(&e, 1),
        }
    }

    /// A write or flush failed (a full disk, say): the records buffered since the last
    /// successful flush, and `extra` not yet buffered, are lost and counted; the file is cut
    /// back to what was flushed, so that no torn record is read back later (and counted a
    /// second time), and the next event opens a new file.
    fn fail_writer(&mut self, error: &io::Error, extra: u64) {
        if self.state != SpoolState::Unwritable {
            tracing::error!(error = %error, dir = %self.dir.display(), "cannot write the event spool; events that do not fit in memory are counted as lost until it can");
        }
        let mut lost = extra;
        if let Some(writer) = self.writer.take() {
            lost += writer.unflushed;
            // Without the buffer: dropping a BufWriter would try to write it once more.
            let (file, _unwritten) = writer.file.into_parts();
            let size = self.segments.get(&writer.seq).copied().unwrap_or(0);
            self.total -= size.saturating_sub(writer.flushed_bytes);
            if writer.flushed_bytes == 0 {
                drop(file);
                self.segments.remove(&writer.seq);
                let _ = fs::remove_file(self.path(writer.seq));
            } else {
                self.segments.insert(writer.seq, writer.flushed_bytes);
                if let Err(e) = file.set_len(writer.flushed_bytes) {
                    tracing::warn!(error = %e, "could not cut the event spool's file back");
                }
            }
        }
        self.set_state(SpoolState::Unwritable);
        self.lose(Reason::SpoolUnwritable, lost);
    }

    fn write(&mut self, record: &[u8]) -> io::Result<()> {
        let size = record.len() as u64;
        let full = self
            .writer
            .as_ref()
            .is_none_or(|w| self.segments.get(&w.seq).copied().unwrap_or(0) + size > SEGMENT_BYTES);
        if full {
            self.flush();
            let seq = self.segments.keys().next_back().map_or(FIRST_SEQ, |last| last + 1);
            let file = OpenOptions::new().create(true).append(true).open(self.path(seq))?;
            self.segments.insert(seq, 0);
            let writer = Writer { seq, file: BufWriter::new(file), flushed_bytes: 0, unflushed: 0 };
            self.writer = Some(writer);
        }
        let Some(writer) = self.writer.as_mut() else { return Ok(()) };
        writer.file.write_all(record)?;
        writer.unflushed += 1;
        *self.segments.entry(writer.seq).or_default() += size;
        self.total += size;
        Ok(())
    }

    fn flush(&mut self) {
        let Some(writer) = self.writer.as_mut() else { return };
        match writer.file.flush() {
            Ok(()) => {
                writer.flushed_bytes = self.segments.get(&writer.seq).copied().unwrap_or(0);
                writer.unflushed = 0;
            }
            Err(e) => self.fail_writer(&e, 0),
        }
    }

    fn prepend(&mut self, events: &[pb::FailoverEvent]) -> io::Result<()> {
        let seq = self.segments.keys().next().map_or(FIRST_SEQ, |first| first - 1);
        let mut out = Vec::new();
        for event in events {
            out.extend_from_slice(&encode(event));
        }
        let mut file = File::create(self.path(seq))?;
        file.write_all(&out)?;
        file.sync_all()?;
        self.segments.insert(seq, out.len() as u64);
        self.total += out.len() as u64;
        Ok(())
    }

    fn read(&mut self, max: usize) -> Vec<pb::FailoverEvent> {
        let mut events = Vec::new();
        while events.len() < max {
            let Some(&seq) = self.segments.keys().next() else { break };
            let offset = self.offsets.remove(&seq).unwrap_or(0);
            match self.read_segment(seq, offset, max - events.len(), &mut events) {
                Ok(Some(next)) => {
                    self.offsets.insert(seq, next);
                    break;
                }
                Ok(None) => {}
                Err(e) => {
                    self.offsets.insert(seq, offset);
                    tracing::error!(error = %e, dir = %self.dir.display(), "could not read the event spool");
                    break;
                }
            }
        }
        self.disposed += events.len() as u64;
        events
    }

    /// Reads file `seq` from `offset` into `out`, up to `max` events. Returns where to
    /// resume, or `None` when the file was read to its end and removed.
    fn read_segment(
        &mut self,
        seq: u64,
        mut offset: u64,
        max: usize,
        out: &mut Vec<pb::FailoverEvent>,
    ) -> io::Result<Option<u64>> {
        let size = self.segments.get(&seq).copied().unwrap_or(0);
        let mut file = File::open(self.path(seq))?;
        file.seek(SeekFrom::Start(offset))?;
        let mut file = io::BufReader::new(file);
        let mut read = 0;
        while offset < size {
            if read == max {
                return Ok(Some(offset));
            }
            let mut len = [0u8; 4];
            let len = match file.read_exact(&mut len) {
                Ok(()) => u32::from_le_bytes(len),
                Err(e) if e.kind() == io::ErrorKind::UnexpectedEof => break,
                Err(e) => return Err(e),
            };
            let mut body = vec![0; len.min(MAX_RECORD_BYTES) as usize];
            if len > MAX_RECORD_BYTES || file.read_exact(&mut body).is_err() {
                // A torn or foreign tail (a crash mid-write): what follows cannot be framed.
                tracing::warn!(file = %self.path(seq).display(), "the event spool's file ends in an unreadable record; skipping the rest");
                self.lose(Reason::Unreadable, 1);
                break;
            }
            offset += 4 + u64::from(len);
            read += 1;
            match pb::FailoverEvent::decode(body.as_slice()) {
                Ok(event) => out.push(event),
                Err(e) => {
                    tracing::warn!(error = %e, "an unreadable failover event in the spool is lost");
                    self.lose(Reason::Unreadable, 1);
                }
            }
        }
        self.remove(seq)?;
        Ok(None)
    }

    fn remove(&mut self, seq: u64) -> io::Result<()> {
        if self.writer.as_ref().is_some_and(|w| w.seq == seq) {
            self.writer = None;
        }
        if let Some(size) = self.segments.remove(&seq) {
            self.total -= size;
        }
        match fs::remove_file(self.path(seq)) {
            Err(e) if e.kind() != io::ErrorKind::NotFound => Err(e),
            _ => Ok(()),
        }
    }
}

fn encode(event: &pb::FailoverEvent) -> Vec<u8> {
    let len = event.encoded_len();
    let mut out = Vec::with_capacity(4 + len);
    out.extend_from_slice(&u32::try_from(len).unwrap_or(u32::MAX).to_le_bytes());
    event.encode(&mut out).unwrap_or_default();
    out
}

/// Records in a file, counted by their length prefixes (a torn tail counts as one).
fn count_records(path: &Path) -> io::Result<u64> {
    let size = fs::metadata(path)?.len();
    let mut file = io::BufReader::new(File::open(path)?);
    let (mut offset, mut records) = (0u64, 0u64);
    while offset < size {
        let mut len = [0u8; 4];
        if file.read_exact(&mut len).is_err() {
            return Ok(records + 1);
        }
        let len = u64::from(u32::from_le_bytes(len));
        records += 1;
        offset += 4 + len;
        if offset > size || len > u64::from(MAX_RECORD_BYTES) {
            return Ok(records);
        }
        file.seek_relative(i64::try_from(len).unwrap_or(i64::MAX))?;
    }
    Ok(records)
}

#[cfg(test)]
mod tests {
    use super::*;

    fn event(i: usize) -> pb::FailoverEvent {
        pb::FailoverEvent { id: format!("evt_{i}"), key_id: "k".into(), ..Default::default() }
    }

    fn ids(events: &[pb::FailoverEvent]) -> Vec<String> {
        events.iter().map(|e| e.id.clone()).collect()
    }

    fn open(dir: &Path, max: u64) -> (Opened, Arc<Losses>) {
        let lost = Arc::new(Losses::new(Default::default(), "b".into()));
        (Spool::open(dir, max, Arc::clone(&lost), Gauge::default()).unwrap(), lost)
    }

    async fn read_all(spool: &Spool) -> (Vec<String>, u64) {
        let mut all = Vec::new();
        loop {
            let batch = spool.read(7).await.unwrap();
            if batch.events.is_empty() {
                return (all, batch.disposed);
            }
            all.extend(ids(&batch.events));
        }
    }

    #[tokio::test]
    async fn events_come_back_in_order_and_the_files_are_removed() {
        let dir = tempfile::tempdir().unwrap();
        let (opened, lost) = open(dir.path(), DEFAULT_MAX_BYTES);
        assert_eq!(opened.records, 0);
        for i in 0..20 {
            assert!(opened.spool.append(event(i)));
        }
        let (read, disposed) = read_all(&opened.spool).await;
        assert_eq!(read, (0..20).map(|i| format!("evt_{i}")).collect::<Vec<_>>());
        assert_eq!((disposed, lost.total()), (20, 0));
        assert_eq!(fs::read_dir(dir.path()).unwrap().count(), 0, "drained files are deleted");
    }

    #[tokio::test]
    async fn a_restart_finds_what_was_spooled_and_what_was_prepended_comes_first() {
        let dir = tempfile::tempdir().unwrap();
        {
            let (opened, _) = open(dir.path(), DEFAULT_MAX_BYTES);
            for i in 10..13 {
                assert!(opened.spool.append(event(i)));
            }
            opened.spool.prepend(vec![event(1), event(2)]).await.unwrap();
            // A read forces the appended events to the file before this spool goes away.
            let _ = opened.spool.read(0).await;
        }
        let (opened, _) = open(dir.path(), DEFAULT_MAX_BYTES);
        assert_eq!(opened.records, 5);
        let (read, disposed) = read_all(&opened.spool).await;
        assert_eq!(read, ["evt_1", "evt_2", "evt_10", "evt_11", "evt_12"]);
        assert_eq!(disposed, 5);
    }

    #[tokio::test]
    async fn a_full_spool_counts_what_it_cannot_keep() {
        let dir = tempfile::tempdir().unwrap();
        let one = encode(&event(0)).len() as u64;
        let (opened, lost) = open(dir.path(), one * 3);
        for i in 0..5 {
            assert!(opened.spool.append(event(i)));
        }
        let (read, disposed) = read_all(&opened.spool).await;
        assert_eq!(read, ["evt_0", "evt_1", "evt_2"]);
        assert_eq!((lost.total(), disposed), (2, 5), "the lost count as disposed of");
        assert_eq!(lost.spool(), SpoolState::Full);
        let reports = lost.reports_to_send();
        assert_eq!((reports[0].reason.as_str(), reports[0].count), ("spool_full", 2));
    }

    #[tokio::test]
    async fn a_full_disk_counts_every_event_it_took_and_the_spool_recovers_after() {
        let dir = tempfile::tempdir().unwrap();
        let (opened, lost) = open(dir.path(), DEFAULT_MAX_BYTES);
        // The first file the spool opens is a disk that is always full.
        std::os::unix::fs::symlink("/dev/full", dir.path().join(format!("{FIRST_SEQ:020}.events")))
            .unwrap();
        for i in 0..5 {
            assert!(opened.spool.append(event(i)));
        }
        // A read flushes first: the write fails, and all five are counted.
        let batch = opened.spool.read(10).await.unwrap();
        assert!(batch.events.is_empty());
        assert_eq!((lost.total(), batch.disposed), (5, 5));
        assert_eq!(lost.spool(), SpoolState::Unwritable);
        let reports = lost.reports_to_send();
        assert_eq!((reports[0].reason.as_str(), reports[0].count), ("spool_unwritable", 5));
        // Room again: the next events go to a new file and come back whole.
        for i in 5..8 {
            assert!(opened.spool.append(event(i)));
        }
        let (read, _) = read_all(&opened.spool).await;
        assert_eq!(read, ["evt_5", "evt_6", "evt_7"]);
        assert_eq!((lost.total(), lost.spool()), (5, SpoolState::Ok));
    }

    #[tokio::test]
    async fn a_torn_record_at_the_end_of_a_file_is_counted_lost_and_the_rest_read() {
        let dir = tempfile::tempdir().unwrap();
        let mut bytes = encode(&event(1));
        bytes.extend_from_slice(&encode(&event(2))[..5]);
        fs::write(dir.path().join(format!("{:020}.events", FIRST_SEQ)), bytes).unwrap();
        let (opened, lost) = open(dir.path(), DEFAULT_MAX_BYTES);
        assert_eq!(opened.records, 2);
        let (read, disposed) = read_all(&opened.spool).await;
        assert_eq!(read, ["evt_1"]);
        assert_eq!((lost.total(), disposed), (1, 2));
    }
}
