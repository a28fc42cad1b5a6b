//! One node per data dir: an OS lock on `DIR/lock`, held for the process's life. Two nodes
//! sharing a data dir would share a node id and spool files (a supervisor that starts a
//! node again while the old one still drains does this), so the second refuses to start,
//! naming the directory and the holder's PID. The lock is the operating system's
//! (`flock`): it ends with the process however the process ends, so a killed node never
//! leaves a stale lock behind.

use std::fs::{File, OpenOptions, TryLockError};
use std::io::{Read, Seek, SeekFrom, Write};
use std::path::{Path, PathBuf};

pub const FILE: &str = "lock";

#[derive(Debug, thiserror::Error)]
pub enum LockError {
    #[error(
        "data dir {dir} is in use by another switchyard node (pid {holder}); give each node its own --data-dir"
    )]
    Held { dir: PathBuf, holder: String },
    #[error("data dir {dir}: cannot lock {FILE}: {source}")]
    Io { dir: PathBuf, source: std::io::Error },
}

/// Held while the node runs; dropping it (or the process ending) releases the directory.
#[derive(Debug)]
pub struct DirLock {
    _file: File,
}

impl DirLock {
    /// Locks `dir` (which exists) for this process, writing its PID into the lock file.
    pub fn acquire(dir: &Path) -> Result<Self, LockError> {
        let io = |source| LockError::Io { dir: dir.to_owned(), source };
        let mut file = OpenOptions::new()
            .read(true)
            .write(true)
            .create(true)
            .truncate(false)
            .open(dir.join(FILE))
            .map_err(io)?;
        match file.try_lock() {
            Ok(()) => {}
            Err(TryLockError::WouldBlock) => {
                let mut holder = String::new();
                let _ = file.read_to_string(&mut holder);
                let holder = match holder.trim() {
                    "" => "unknown".to_owned(),
                    pid => pid.to_owned(),
                };
                return Err(LockError::Held { dir: dir.to_owned(), holder });
            }
            Err(TryLockError::Error(e)) => return Err(io(e)),
        }
        file.set_len(0).map_err(io)?;
        file.seek(SeekFrom::Start(0)).map_err(io)?;
        writeln!(file, "{}", std::process::id()).map_err(io)?;
        file.flush().map_err(io)?;
        Ok(Self { _file: file })
    }
}

#[cfg(test)]
mod tests {
    #![allow(clippy::unwrap_used)]
    use super::*;

    #[test]
    fn a_second_lock_on_one_dir_is_refused_naming_the_holder_until_the_first_is_dropped() {
        let dir = tempfile::tempdir().unwrap();
        let first = DirLock::acquire(dir.path()).unwrap();
        // Another open file description, as another process would have.
        match DirLock::acquire(dir.path()) {
            Err(LockError::Held { dir: named, holder }) => {
                assert_eq!(named, dir.path());
                assert_eq!(holder, std::process::id().to_string());
            }
            other => panic!("{other:?}"),
        }
        drop(first);
        DirLock::acquire(dir.path()).unwrap();
    }
}
