//! Failover events the node cannot hand to a control plane yet (one is slow, or none is
//! reachable), kept on disk in `--data-dir` so that a storm or an outage loses none of
//! them, and read back oldest first once a control plane takes them again.
//!
//! Files: `<data-dir>/event-spool/<seq>.events`, each a run of records (a little-endian
//! `u32` length, then one protobuf `FailoverEvent`), appended to and read in `seq` order.
//! A file the writer has moved on from is sealed: compressed (LZ4) into `<seq>.sealed`,
//! which replaces it. Events of a storm differ in little but their ids and times, so a
//! sealed file holds several times the events in the same bytes, and the bound lasts as
//! many times longer. A file is deleted once read to its end. The spool's total size is bounded; an event
//! that does not fit, cannot be written or cannot be read back is counted as lost, by
//! reason ([`crate::loss`]), and reported to the control plane as `events.lost`.
//!
//! All file work runs on one thread of the spool's own: the request path only hands an
//! event to a bounded channel and never waits on the disk. The thread writes what it was
//! handed as soon as its channel is empty, so an event in the spool survives a kill of the
//! process; [`Spool::sync`] (every tick of [`crate::custody`]) puts it on the disk itself.

use std::collections::{BTreeMap, BTreeSet};
use std::fs::{self, File, OpenOptions};
use std::io::{self, BufWriter, Read, Seek, SeekFrom, Write};
use std::path::{Path, PathBuf};
use std::sync::mpsc::{
    Receiver, RecvTimeoutError, SyncSender, TryRecvError, TrySendError, sync_channel,
};
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
/// A sealed file starts with this, then the number of records it holds (`u32`, little
/// endian), then the LZ4 block of the records as the `.events` file had them.
const SEALED_MAGIC: &[u8; 4] = b"SYS1";
/// What a sealed file may decompress to at most: a segment and its last record.
const MAX_SEALED_RAW: usize = (SEGMENT_BYTES + 4 + MAX_RECORD_BYTES as u64) as usize;

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

// Nearly every command is an `Append`: boxing its event would allocate once per spooled
// event to make the rare other commands smaller.
#[allow(clippy::large_enum_variant)]
enum Command {
    Append(pb::FailoverEvent),
    /// Events older than everything spooled (the node's memory at shutdown).
    Prepend(Vec<pb::FailoverEvent>, oneshot::Sender<io::Result<()>>),
    Read(usize, oneshot::Sender<Batch>),
    /// Everything appended so far, on the disk (not only handed to the kernel).
    Sync(oneshot::Sender<io::Result<()>>),
}

impl Spool {
    /// Opens (creating) the spool in `dir`, counting what an earlier run left there. Blocks
    /// on the disk: call it from a blocking context.
    pub fn open(dir: &Path, max_bytes: u64, lost: Arc<Losses>, bytes: Gauge) -> io::Result<Opened> {
        Self::open_with_segments(dir, max_bytes, SEGMENT_BYTES, lost, bytes)
    }

    fn open_with_segments(
        dir: &Path,
        max_bytes: u64,
        segment_bytes: u64,
        lost: Arc<Losses>,
        bytes: Gauge,
    ) -> io::Result<Opened> {
        fs::create_dir_all(dir)?;
        let mut segments = BTreeMap::new();
        let mut records = 0;
        let mut sealed = BTreeSet::new();
        let mut raw = Vec::new();
        for entry in fs::read_dir(dir)? {
            let entry = entry?;
            let name = entry.file_name();
            let Some((seq, kind)) = name.to_str().and_then(|n| n.split_once('.')) else {
                continue;
            };
            let Ok(seq) = seq.parse::<u64>() else { continue };
            match kind {
                "events" => raw.push((seq, entry.path())),
                "sealed" => {
                    records += sealed_records(&entry.path())?;
                    segments.insert(seq, entry.metadata()?.len());
                    sealed.insert(seq);
                }
                // A sealing that a crash cut short; its `.events` file is still there.
                "sealing" => fs::remove_file(entry.path())?,
                _ => {}
            }
        }
        for (seq, path) in raw {
            if sealed.contains(&seq) {
                // A crash after sealing and before the original went: the sealed file is whole
                // (it was renamed into place complete).
                fs::remove_file(&path)?;
                continue;
            }
            records += count_records(&path)?;
            segments.insert(seq, fs::metadata(&path)?.len());
        }
        let total = segments.values().sum();
        bytes.set(i64::try_from(total).unwrap_or(i64::MAX));
        let state = State {
            dir: dir.to_owned(),
            max_bytes,
            segment_bytes,
            segments,
            sealed,
            cache: None,
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

    /// Hands an event to the spool without waiting; gives it back when the spool's channel
    /// is full or its thread is gone (the caller keeps it elsewhere, or counts it lost).
    #[must_use = "a refused event is the caller's to keep or to count as lost"]
    pub fn append(&self, event: pb::FailoverEvent) -> Option<pb::FailoverEvent> {
        let refused = match self.tx.try_send(Command::Append(event)) {
            Ok(()) => return None,
            Err(TrySendError::Full(command) | TrySendError::Disconnected(command)) => command,
        };
        match refused {
            Command::Append(event) => Some(event),
            // Only an append was sent.
            _ => Some(pb::FailoverEvent::default()),
        }
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

    /// Writes everything appended so far to the disk (`fdatasync`), before returning.
    pub async fn sync(&self) -> io::Result<()> {
        let (reply, answer) = oneshot::channel();
        self.send(Command::Sync(reply)).await?;
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
    /// Flushed since the last `fdatasync`.
    unsynced: bool,
}

struct State {
    dir: PathBuf,
    max_bytes: u64,
    /// A file takes records up to this size, then is sealed ([`SEGMENT_BYTES`]).
    segment_bytes: u64,
    /// Every file of the spool by sequence number, with its size on disk.
    segments: BTreeMap<u64, u64>,
    /// The files of `segments` that are sealed (compressed).
    sealed: BTreeSet<u64>,
    /// The sealed file being read, decompressed, so that reading it in batches decompresses
    /// it once.
    cache: Option<(u64, Vec<u8>)>,
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
            let command = match rx.try_recv() {
                Ok(command) => command,
                // Nothing more queued: what was appended goes to the file now (one write for
                // a whole burst), so a process killed a moment later has it on disk.
                Err(TryRecvError::Empty) => {
                    self.flush();
                    match rx.recv_timeout(Duration::from_millis(100)) {
                        Ok(command) => command,
                        Err(RecvTimeoutError::Timeout) => continue,
                        Err(RecvTimeoutError::Disconnected) => return,
                    }
                }
                Err(TryRecvError::Disconnected) => {
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
                Command::Sync(reply) => {
                    self.flush();
                    let _ = reply.send(self.sync());
                }
            }
            self.bytes.set(i64::try_from(self.total).unwrap_or(i64::MAX));
        }
    }

    fn path(&self, seq: u64) -> PathBuf {
        self.dir.join(format!("{seq:020}.events"))
    }

    fn sealed_path(&self, seq: u64) -> PathBuf {
        self.dir.join(format!("{seq:020}.sealed"))
    }

    /// Compresses file `seq`, which the writer has left, into its sealed form. On any error
    /// the file stays as it was: nothing is lost, the spool only holds less.
    fn seal(&mut self, seq: u64) {
        match self.try_seal(seq) {
            Ok(size) => {
                let before = self.segments.insert(seq, size).unwrap_or(0);
                self.total = self.total - before + size;
                self.sealed.insert(seq);
            }
            Err(e) => {
                tracing::warn!(error = %e, file = %self.path(seq).display(), "could not compress a full event-spool file; it stays as written");
            }
        }
    }

    fn try_seal(&self, seq: u64) -> io::Result<u64> {
        let raw = fs::read(self.path(seq))?;
        let records = count_in(&raw);
        let mut out = Vec::with_capacity(raw.len() / 3);
        out.extend_from_slice(SEALED_MAGIC);
        out.extend_from_slice(&records.to_le_bytes());
        out.extend_from_slice(&lz4_flex::block::compress_prepend_size(&raw));
        // Written aside, on disk before it is renamed into place: a sealed file is always
        // whole, also after a power cut.
        let sealing = self.dir.join(format!("{seq:020}.sealing"));
        let written = File::create(&sealing).and_then(|mut file| {
            file.write_all(&out)?;
            file.sync_all()
        });
        if let Err(e) = written.and_then(|()| fs::rename(&sealing, self.sealed_path(seq))) {
            let _ = fs::remove_file(&sealing);
            return Err(e);
        }
        // The original must go, or a later start would read its events a second time: if it
        // cannot, the sealed copy goes instead and the file stays as written.
        if let Err(e) = fs::remove_file(self.path(seq)) {
            let _ = fs::remove_file(self.sealed_path(seq));
            return Err(e);
        }
        Ok(out.len() as u64)
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
        let full = self.writer.as_ref().is_none_or(|w| {
            self.segments.get(&w.seq).copied().unwrap_or(0) + size > self.segment_bytes
        });
        if full {
            self.flush();
            if let Some(previous) = self.writer.take() {
                self.seal(previous.seq);
            }
            let seq = self.segments.keys().next_back().map_or(FIRST_SEQ, |last| last + 1);
            let file = OpenOptions::new().create(true).append(true).open(self.path(seq))?;
            self.segments.insert(seq, 0);
            let writer = Writer {
                seq,
                file: BufWriter::new(file),
                flushed_bytes: 0,
                unflushed: 0,
                unsynced: false,
            };
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
        if writer.unflushed == 0 {
            return;
        }
        match writer.file.flush() {
            Ok(()) => {
                writer.flushed_bytes = self.segments.get(&writer.seq).copied().unwrap_or(0);
                writer.unflushed = 0;
                writer.unsynced = true;
            }
            Err(e) => self.fail_writer(&e, 0),
        }
    }

    /// The file being written, on the disk. (Sealed and prepended files are synced as they
    /// are written.)
    fn sync(&mut self) -> io::Result<()> {
        let Some(writer) = self.writer.as_mut().filter(|w| w.unsynced) else { return Ok(()) };
        writer.file.get_ref().sync_data()?;
        writer.unsynced = false;
        Ok(())
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
        offset: u64,
        max: usize,
        out: &mut Vec<pb::FailoverEvent>,
    ) -> io::Result<Option<u64>> {
        if self.sealed.contains(&seq) {
            return self.read_sealed(seq, offset, max, out);
        }
        let size = self.segments.get(&seq).copied().unwrap_or(0);
        let mut file = File::open(self.path(seq))?;
        file.seek(SeekFrom::Start(offset))?;
        let mut file = io::BufReader::new(file);
        self.read_records(seq, &mut file, offset, size, max, out)
    }

    /// [`Self::read_segment`] for a sealed file: decompressed once, then read in batches from
    /// memory.
    fn read_sealed(
        &mut self,
        seq: u64,
        offset: u64,
        max: usize,
        out: &mut Vec<pb::FailoverEvent>,
    ) -> io::Result<Option<u64>> {
        let raw = match self.cache.take() {
            Some((cached, raw)) if cached == seq => raw,
            _ => match unseal(&fs::read(self.sealed_path(seq))?) {
                Ok(raw) => raw,
                Err((records, why)) => {
                    tracing::warn!(file = %self.sealed_path(seq).display(), %why, records, "an unreadable sealed event-spool file: its events are lost");
                    self.lose(Reason::Unreadable, u64::from(records));
                    self.remove(seq)?;
                    return Ok(None);
                }
            },
        };
        let size = raw.len() as u64;
        let mut reader = io::Cursor::new(raw.as_slice());
        reader.set_position(offset);
        let next = self.read_records(seq, &mut reader, offset, size, max, out)?;
        if next.is_some() {
            self.cache = Some((seq, raw));
        }
        Ok(next)
    }

    /// Reads records from `file` (at `offset` of `size` bytes) into `out`, up to `max`; the
    /// rest of [`Self::read_segment`].
    fn read_records(
        &mut self,
        seq: u64,
        file: &mut impl Read,
        mut offset: u64,
        size: u64,
        max: usize,
        out: &mut Vec<pb::FailoverEvent>,
    ) -> io::Result<Option<u64>> {
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
        let path = if self.sealed.remove(&seq) { self.sealed_path(seq) } else { self.path(seq) };
        match fs::remove_file(path) {
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

/// Records in an unsealed file's bytes, counted by their length prefixes (a torn tail
/// counts as one).
fn count_in(raw: &[u8]) -> u32 {
    let (mut offset, mut records) = (0usize, 0u32);
    while offset < raw.len() {
        records += 1;
        let Some(len) = raw.get(offset..offset + 4) else { break };
        let len = u32::from_le_bytes([len[0], len[1], len[2], len[3]]);
        offset = offset.saturating_add(4).saturating_add(len as usize);
    }
    records
}

/// The records a sealed file says it holds.
fn sealed_records(path: &Path) -> io::Result<u64> {
    let mut header = [0u8; 8];
    match File::open(path)?.read_exact(&mut header) {
        Ok(()) if &header[..4] == SEALED_MAGIC => {
            Ok(u64::from(u32::from_le_bytes([header[4], header[5], header[6], header[7]])))
        }
        // Not one of ours or cut short: reading it will count it as one lost record.
        _ => Ok(1),
    }
}

/// A sealed file's bytes back to the records it was made of; on failure, how many records
/// it said it held (at least one) and why.
fn unseal(sealed: &[u8]) -> Result<Vec<u8>, (u32, String)> {
    let Some((header, block)) = sealed.split_at_checked(8) else {
        return Err((1, "shorter than its header".into()));
    };
    if &header[..4] != SEALED_MAGIC {
        return Err((1, "not a sealed event-spool file".into()));
    }
    let records = u32::from_le_bytes([header[4], header[5], header[6], header[7]]).max(1);
    let raw_len = block.get(..4).map(|b| u32::from_le_bytes([b[0], b[1], b[2], b[3]]) as usize);
    if raw_len.is_none_or(|len| len > MAX_SEALED_RAW) {
        return Err((records, "its stated size is not a spool file's".into()));
    }
    lz4_flex::block::decompress_size_prepended(block).map_err(|e| (records, e.to_string()))
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
            assert!(opened.spool.append(event(i)).is_none());
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
                assert!(opened.spool.append(event(i)).is_none());
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
            assert!(opened.spool.append(event(i)).is_none());
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
            assert!(opened.spool.append(event(i)).is_none());
        }
        // The spool's thread writes a burst as soon as it has taken it: the first write fails
        // and every event of it is counted; the file is dropped, and the rest go to a new one.
        let (read, disposed) = read_all(&opened.spool).await;
        let failed = lost.total();
        assert!(failed >= 1, "the full disk refused the first write");
        assert_eq!(read, (failed as usize..5).map(|i| format!("evt_{i}")).collect::<Vec<_>>());
        assert_eq!(disposed, 5, "read or counted, every one");
        let reports = lost.reports_to_send();
        assert_eq!((reports[0].reason.as_str(), reports[0].count), ("spool_unwritable", failed));
        for i in 5..8 {
            assert!(opened.spool.append(event(i)).is_none());
        }
        let (read, _) = read_all(&opened.spool).await;
        assert_eq!(read, ["evt_5", "evt_6", "evt_7"]);
        assert_eq!((lost.total(), lost.spool()), (failed, SpoolState::Ok));
    }

    /// A storm's events: alike but for their ids, times and request ids.
    fn storm_event(i: usize) -> pb::FailoverEvent {
        pb::FailoverEvent {
            id: format!("evt_{i:020}"),
            at_unix_ms: 1_780_000_000_000 + i as i64,
            node_id: "node-7f3a".into(),
            key_id: "key_xzuv9qwod9esz7ae".into(),
            requested_model: "gpt-4o".into(),
            served_model: "claude-sonnet".into(),
            attempts: vec![
                pb::Attempt {
                    model: "gpt-4o".into(),
                    status: "skipped".into(),
                    reason: "circuit_open".into(),
                    ..Default::default()
                },
                pb::Attempt {
                    model: "claude-sonnet".into(),
                    status: "served".into(),
                    latency_ms: 40 + (i % 7) as u64,
                    ..Default::default()
                },
            ],
            status: 200,
            request_id: format!("req_{:016x}", i.wrapping_mul(0x9e37_79b9_7f4a_7c15)),
            ..Default::default()
        }
    }

    fn files(dir: &Path, suffix: &str) -> usize {
        fs::read_dir(dir)
            .unwrap()
            .filter(|e| e.as_ref().unwrap().file_name().to_string_lossy().ends_with(suffix))
            .count()
    }

    fn open_small_segments(dir: &Path, max: u64) -> (Opened, Arc<Losses>) {
        let lost = Arc::new(Losses::new(Default::default(), "b".into()));
        let opened =
            Spool::open_with_segments(dir, max, 64 * 1024, Arc::clone(&lost), Gauge::default())
                .unwrap();
        (opened, lost)
    }

    /// The sealed files in `dir`, oldest first.
    fn sealed_files(dir: &Path) -> Vec<PathBuf> {
        let mut sealed: Vec<PathBuf> = fs::read_dir(dir)
            .unwrap()
            .map(|e| e.unwrap().path())
            .filter(|p| p.extension().is_some_and(|x| x == "sealed"))
            .collect();
        sealed.sort();
        sealed
    }

    /// Spools `n` storm events in small files (so that most are sealed) and closes the
    /// spool, as a node that stops does.
    async fn spool_and_close(dir: &Path, n: usize) {
        let (opened, _) = open_small_segments(dir, DEFAULT_MAX_BYTES);
        for i in 0..n {
            while opened.spool.append(storm_event(i)).is_some() {
                tokio::task::yield_now().await;
            }
        }
        // A read forces the appended events to the file before this spool goes away.
        let _ = opened.spool.read(0).await;
    }

    #[tokio::test]
    async fn full_files_are_sealed_smaller_and_read_back_whole_in_order() {
        let dir = tempfile::tempdir().unwrap();
        let (opened, lost) = open_small_segments(dir.path(), DEFAULT_MAX_BYTES);
        let n = 5_000;
        let raw: usize = (0..n).map(|i| encode(&storm_event(i)).len()).sum();
        for i in 0..n {
            // The channel is bounded: a full one is the caller's loss, which this test must not
            // have, so it waits for room as a slower producer would.
            while opened.spool.append(storm_event(i)).is_some() {
                tokio::task::yield_now().await;
            }
        }
        let _ = opened.spool.read(0).await;
        let on_disk: u64 =
            fs::read_dir(dir.path()).unwrap().map(|e| e.unwrap().metadata().unwrap().len()).sum();
        assert!(files(dir.path(), ".sealed") >= 10, "every full file is sealed");
        assert_eq!(files(dir.path(), ".events"), 1, "only the file being written stays as written");
        assert!(
            on_disk * 3 < raw as u64,
            "sealed, the spool holds {raw} bytes of events in {on_disk}: expected at least a third less"
        );
        let (read, disposed) = read_all(&opened.spool).await;
        assert_eq!(read, (0..n).map(|i| storm_event(i).id).collect::<Vec<_>>());
        assert_eq!((disposed, lost.total()), (n as u64, 0));
        assert_eq!(fs::read_dir(dir.path()).unwrap().count(), 0, "drained files are deleted");
    }

    #[tokio::test]
    async fn the_bound_counts_sealed_files_at_their_size_on_disk() {
        let dir = tempfile::tempdir().unwrap();
        let one = encode(&storm_event(0)).len() as u64;
        // Room for 1,000 events as written; sealed, 3,000 fit.
        let (opened, lost) = open_small_segments(dir.path(), one * 1_000);
        for i in 0..3_000 {
            while opened.spool.append(storm_event(i)).is_some() {
                tokio::task::yield_now().await;
            }
        }
        let (read, disposed) = read_all(&opened.spool).await;
        assert_eq!(lost.total(), 0, "3,000 events fit in a bound of 1,000 unsealed");
        assert_eq!((read.len(), disposed), (3_000, 3_000));
    }

    #[tokio::test]
    async fn a_restart_reads_sealed_files_and_a_crash_mid_seal_loses_and_doubles_nothing() {
        let dir = tempfile::tempdir().unwrap();
        spool_and_close(dir.path(), 1_500).await;
        // A crash after a sealed file was renamed into place, before its original went: the
        // original comes back beside it. And one in the middle of writing another: a partial
        // `.sealing` file.
        let sealed = sealed_files(dir.path())[0].clone();
        let seq: u64 = sealed.file_stem().unwrap().to_str().unwrap().parse().unwrap();
        let raw = unseal(&fs::read(&sealed).unwrap()).unwrap();
        fs::write(dir.path().join(format!("{seq:020}.events")), &raw).unwrap();
        fs::write(dir.path().join(format!("{:020}.sealing", seq + 1_000)), b"SYS1\x05").unwrap();

        let (opened, lost) = open_small_segments(dir.path(), DEFAULT_MAX_BYTES);
        assert_eq!(opened.records, 1_500);
        let (read, disposed) = read_all(&opened.spool).await;
        assert_eq!(read, (0..1_500).map(|i| storm_event(i).id).collect::<Vec<_>>());
        assert_eq!((disposed, lost.total()), (1_500, 0));
    }

    #[tokio::test]
    async fn a_damaged_sealed_file_counts_every_event_it_held_as_lost() {
        let dir = tempfile::tempdir().unwrap();
        spool_and_close(dir.path(), 1_500).await;
        let first = sealed_files(dir.path())[0].clone();
        let mut bytes = fs::read(&first).unwrap();
        let held = u64::from(u32::from_le_bytes(bytes[4..8].try_into().unwrap()));
        // Past the header, the compressed block is cut in half.
        bytes.truncate(8 + (bytes.len() - 8) / 2);
        fs::write(&first, bytes).unwrap();

        let (opened, lost) = open_small_segments(dir.path(), DEFAULT_MAX_BYTES);
        let (read, disposed) = read_all(&opened.spool).await;
        assert!(held > 0);
        assert_eq!(lost.total(), held, "the damaged file's events, counted");
        assert_eq!(read.len() as u64 + held, 1_500, "every other event read back");
        assert_eq!(disposed, 1_500);
        assert_eq!(lost.reports_to_send()[0].reason.as_str(), "unreadable");
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
