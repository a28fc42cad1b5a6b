//! A value built from files, rebuilt when they change: certificate rotation without a
//! restart (docs/operating.md, "TLS").
//!
//! Handshakes ask for the value; at most once per [`CHECK_INTERVAL`] the asking handshake
//! looks at the files' metadata (a `stat` each, no read), and only when one changed are they
//! read and the value rebuilt. A rebuild that fails (a key copied before its certificate, a
//! half-written file) keeps the last good value and logs why, naming the file; the files are
//! tried again when they change next.

use std::sync::{Arc, Mutex, MutexGuard};
use std::time::{Duration, Instant, SystemTime};

use tracing::{info, warn};

use crate::files::{Source, TlsError};

/// How often at most the files are looked at.
pub const CHECK_INTERVAL: Duration = Duration::from_secs(1);

/// What tells one version of a file from the next. The length and inode besides the
/// modification time: a copy over a file can truncate and write it within one tick of a
/// coarse file-system clock, and a rename (Kubernetes' secret volumes swap a symlink) can
/// bring in a file with an older time.
#[derive(Clone, Debug, PartialEq, Eq)]
struct Fingerprint {
    modified: Option<SystemTime>,
    len: u64,
    inode: u64,
}

fn fingerprint(file: &Source) -> Option<Fingerprint> {
    let meta = std::fs::metadata(&file.path).ok()?;
    #[cfg(unix)]
    let inode = std::os::unix::fs::MetadataExt::ino(&meta);
    #[cfg(not(unix))]
    let inode = 0;
    Some(Fingerprint { modified: meta.modified().ok(), len: meta.len(), inode })
}

pub type Loader<T> = Box<dyn Fn(&[Source]) -> Result<T, TlsError> + Send + Sync>;

pub struct Reloading<T> {
    what: &'static str,
    files: Vec<Source>,
    load: Loader<T>,
    state: Mutex<State<T>>,
}

struct State<T> {
    current: Arc<T>,
    /// The files as they were when last read (read after taking this, so a write during
    /// the read shows as a change next time).
    seen: Vec<Option<Fingerprint>>,
    checked: Instant,
}

impl<T> std::fmt::Debug for Reloading<T> {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("Reloading").field("what", &self.what).field("files", &self.files).finish()
    }
}

impl<T> Reloading<T> {
    /// Reads the files once; an error here is a start-up error.
    pub fn open(what: &'static str, files: Vec<Source>, load: Loader<T>) -> Result<Self, TlsError> {
        let seen = files.iter().map(fingerprint).collect();
        let current = Arc::new(load(&files)?);
        let state = Mutex::new(State { current, seen, checked: Instant::now() });
        Ok(Self { what, files, load, state })
    }

    /// The current value, rebuilt first if the files changed since the last look.
    pub fn get(&self) -> Arc<T> {
        let mut state = self.lock();
        if state.checked.elapsed() >= CHECK_INTERVAL {
            state.checked = Instant::now();
            let now: Vec<_> = self.files.iter().map(fingerprint).collect();
            if now != state.seen {
                state.seen = now;
                match (self.load)(&self.files) {
                    Ok(value) => {
                        state.current = Arc::new(value);
                        info!(what = self.what, files = %self.names(), "reloaded");
                    }
                    Err(e) => warn!(
                        what = self.what,
                        error = %e,
                        "the files changed but cannot be used; keeping the previous ones"
                    ),
                }
            }
        }
        Arc::clone(&state.current)
    }

    fn names(&self) -> String {
        self.files.iter().map(ToString::to_string).collect::<Vec<_>>().join(", ")
    }

    fn lock(&self) -> MutexGuard<'_, State<T>> {
        // A panic while holding the lock leaves a whole value behind: use it.
        self.state.lock().unwrap_or_else(std::sync::PoisonError::into_inner)
    }
}

#[cfg(test)]
mod tests {
    #![allow(clippy::unwrap_used)]
    use super::*;

    fn text_file(files: &[Source]) -> Result<String, TlsError> {
        let text = std::fs::read_to_string(&files[0].path)
            .map_err(|source| TlsError::Read { file: files[0].clone(), source })?;
        if text.is_empty() {
            return Err(TlsError::NoCertificate(files[0].clone()));
        }
        Ok(text)
    }

    #[test]
    fn a_changed_file_is_read_again_and_a_bad_one_keeps_the_last_good_value() {
        let dir = tempfile::tempdir().unwrap();
        let path = dir.path().join("f");
        std::fs::write(&path, "one").unwrap();
        let r =
            Reloading::open("test", vec![Source::new("--f", &path)], Box::new(text_file)).unwrap();
        assert_eq!(*r.get(), "one");
        std::fs::write(&path, "two!").unwrap();
        // Not looked at again within the interval.
        assert_eq!(*r.get(), "one");
        r.lock().checked -= CHECK_INTERVAL;
        assert_eq!(*r.get(), "two!");
        std::fs::write(&path, "").unwrap();
        r.lock().checked -= CHECK_INTERVAL;
        assert_eq!(*r.get(), "two!", "an unusable file keeps the last good value");
        std::fs::write(&path, "three").unwrap();
        r.lock().checked -= CHECK_INTERVAL;
        assert_eq!(*r.get(), "three");
    }

    #[test]
    fn an_unreadable_file_at_start_is_an_error() {
        let dir = tempfile::tempdir().unwrap();
        let file = Source::new("--f", dir.path().join("missing"));
        assert!(Reloading::open("test", vec![file], Box::new(text_file)).is_err());
    }
}
