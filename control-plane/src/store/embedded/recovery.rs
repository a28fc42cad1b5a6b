//! Opening a directory: taking its lock, loading the snapshot and replaying the log after
//! it into a [`State`], and leaving the log ready for appends.
//!
//! Recovery trusts only what was durable when a write returned: a torn last line of the log
//! is a write whose caller never heard back, so it is dropped, and records the snapshot
//! already holds (a crash between a snapshot rewrite and the log truncation) are skipped.

use std::fs::{File, OpenOptions};
use std::io::{BufRead, BufReader};
use std::path::{Path, PathBuf};
use std::time::{Duration, Instant};

use super::format::{LOCK_FILE, LOG_FILE, LogEntry, SNAPSHOT_FILE, Snapshot};
use super::options::Options;
use super::state::State;
use crate::store::api::StoreError;

/// A process that just dropped its store releases the lock a moment later (its writer
/// thread finishes the last fsync first); waiting this long spares a reopen in the same
/// process a spurious "in use" error while a real second process still fails fast.
const LOCK_WAIT: Duration = Duration::from_secs(2);

/// The open directory: owned by the writer thread once recovery hands it over.
pub(super) struct Files {
    pub(super) dir: PathBuf,
    pub(super) log: File,
    /// Held (and locked) for as long as the writer lives.
    _lock: File,
}

pub(super) struct Recovered {
    pub(super) state: State,
    pub(super) files: Files,
    /// The sequence number of the last record applied.
    pub(super) seq: u64,
    /// Bytes of whole records in the log.
    pub(super) log_len: u64,
}

/// Opens `dir`, creating it if need be. An I/O error names the directory.
pub(super) fn recover(dir: &Path, options: &Options) -> Result<Recovered, StoreError> {
    load(dir, options).map_err(|e| in_dir(dir, e))
}

/// Names `dir` in an I/O error, which on its own says what failed but not where.
pub(super) fn in_dir(dir: &Path, e: StoreError) -> StoreError {
    match e {
        StoreError::Io(source) => StoreError::Directory { dir: dir.to_path_buf(), source },
        other => other,
    }
}

fn load(dir: &Path, options: &Options) -> Result<Recovered, StoreError> {
    std::fs::create_dir_all(dir)?;
    let lock_file = acquire_lock(dir)?;
    let now = Instant::now();

    let mut state = State::empty();
    let mut seq = 0;
    let snapshot_path = dir.join(SNAPSHOT_FILE);
    if snapshot_path.exists() {
        let bytes = std::fs::read(&snapshot_path)?;
        let snap: Snapshot = serde_json::from_slice(&bytes)
            .map_err(|e| StoreError::Corrupt(format!("{}: {e}", snapshot_path.display())))?;
        seq = snap.seq;
        state = State::from_snapshot(snap, now);
    }

    let log_path = dir.join(LOG_FILE);
    let mut log_len = 0u64;
    if log_path.exists() {
        let mut reader = BufReader::new(File::open(&log_path)?);
        let mut line = Vec::new();
        loop {
            line.clear();
            let n = reader.read_until(b'\n', &mut line)?;
            if n == 0 {
                break;
            }
            if line.last() != Some(&b'\n') {
                // A torn final line is a write that never returned to its caller: drop it.
                tracing::warn!(path = %log_path.display(), "dropping torn last record of the embedded store log");
                break;
            }
            let entry: LogEntry = serde_json::from_slice(&line).map_err(|e| {
                StoreError::Corrupt(format!("{} at byte {log_len}: {e}", log_path.display()))
            })?;
            if entry.seq > seq {
                state.apply(entry.record, now, options.retain_revisions);
                seq = entry.seq;
            }
            log_len += n as u64;
        }
    }
    let log = OpenOptions::new().create(true).append(true).open(&log_path)?;
    if log.metadata()?.len() != log_len {
        log.set_len(log_len)?;
        log.sync_all()?;
    }
    sync_dir(dir)?;
    Ok(Recovered {
        state,
        files: Files { dir: dir.to_path_buf(), log, _lock: lock_file },
        seq,
        log_len,
    })
}

// The lock is what keeps two processes from interleaving writes to one log.
fn acquire_lock(dir: &Path) -> Result<File, StoreError> {
    let path = dir.join(LOCK_FILE);
    let file = OpenOptions::new().create(true).truncate(false).write(true).open(&path)?;
    let started = Instant::now();
    loop {
        match file.try_lock() {
            Ok(()) => return Ok(file),
            Err(std::fs::TryLockError::WouldBlock) if started.elapsed() < LOCK_WAIT => {
                std::thread::sleep(Duration::from_millis(20));
            }
            Err(std::fs::TryLockError::WouldBlock) => {
                return Err(StoreError::Unavailable(format!(
                    "store directory {} is in use by another process (lock held on {})",
                    dir.display(),
                    path.display()
                )));
            }
            Err(std::fs::TryLockError::Error(e)) => return Err(e.into()),
        }
    }
}

pub(super) fn sync_dir(dir: &Path) -> Result<(), StoreError> {
    File::open(dir)?.sync_all()?;
    Ok(())
}
