//! A value built from files, rebuilt when they change: certificate rotation without a
//! restart (docs/operating.md, "TLS").
//!
//! Handshakes ask for the value; at most once per [`CHECK_INTERVAL`] the asking handshake
//! looks at the files' metadata (a `stat` each, no read), and only when one changed are they
//! read and the value rebuilt. Only that one handshake does file work: the others take the
//! current value at once, never waiting on its look. A rebuild that fails (a key copied before its certificate, a
//! half-written file) keeps the last good value and logs why, naming the file; the files are
//! tried again when they change next.

use std::sync::Arc;

use arc_swap::ArcSwap;
use parking_lot::Mutex;
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
    current: ArcSwap<T>,
    check: Mutex<Check>,
}

struct Check {
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
        let current = ArcSwap::from_pointee(load(&files)?);
        let check = Mutex::new(Check { seen, checked: Instant::now() });
        Ok(Self { what, files, load, current, check })
    }

    /// The current value, rebuilt first if the files changed since the last look (unless
    /// another caller is looking right now: then the value as it is).
    pub fn get(&self) -> Arc<T> {
        if let Some(mut check) = self.check.try_lock()
            && check.checked.elapsed() >= CHECK_INTERVAL
        {
            check.checked = Instant::now();
            let now: Vec<_> = self.files.iter().map(fingerprint).collect();
            if now != check.seen {
                check.seen = now;
                self.reload();
            }
        }
        self.current.load_full()
    }

    fn reload(&self) {
        match (self.load)(&self.files) {
            Ok(value) => {
                self.current.store(Arc::new(value));
                info!(what = self.what, files = %self.names(), "reloaded");
            }
            Err(e) => warn!(
                what = self.what,
                error = %e,
                "the files changed but cannot be used; keeping the previous ones"
            ),
        }
    }

    fn names(&self) -> String {
        self.files.iter().map(ToString::to_string).collect::<Vec<_>>().join(", ")
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
        r.check.lock().checked -= CHECK_INTERVAL;
        assert_eq!(*r.get(), "two!");
        std::fs::write(&path, "").unwrap();
        r.check.lock().checked -= CHECK_INTERVAL;
        assert_eq!(*r.get(), "two!", "an unusable file keeps the last good value");
        std::fs::write(&path, "three").unwrap();
        r.check.lock().checked -= CHECK_INTERVAL;
        assert_eq!(*r.get(), "three");
    }

    #[test]
    fn a_caller_never_waits_while_another_looks_at_the_files() {
        let dir = tempfile::tempdir().unwrap();
        let path = dir.path().join("f");
        std::fs::write(&path, "one").unwrap();
        let r =
            Reloading::open("test", vec![Source::new("--f", &path)], Box::new(text_file)).unwrap();
        std::fs::write(&path, "two!").unwrap();
        let mut looking = r.check.lock();
        looking.checked -= CHECK_INTERVAL;
        // Another handshake is looking (it holds the check): this one takes the value as it
        // is instead of waiting, and the change is seen once the look is over.
        assert_eq!(*r.get(), "one");
        drop(looking);
        assert_eq!(*r.get(), "two!");
    }

    #[test]
    fn an_unreadable_file_at_start_is_an_error() {
        let dir = tempfile::tempdir().unwrap();
        let file = Source::new("--f", dir.path().join("missing"));
        assert!(Reloading::open("test", vec![file], Box::new(text_file)).is_err());
    }
}
