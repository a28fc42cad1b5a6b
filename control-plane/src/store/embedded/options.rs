//! The embedded store's tunables, apart so that the recovery and the writer thread can
//! read them without depending on the store that owns them.

/// Tunables; [`Default`] is what `file://DIR` uses.
#[derive(Clone, Debug)]
pub struct Options {
    /// Revisions of history kept for watchers; older ones are compacted automatically.
    pub retain_revisions: usize,
    /// Log size that triggers a snapshot rewrite and log truncation.
    pub log_rewrite_bytes: u64,
    /// Batches buffered per watcher. A watcher that does not keep up is not dropped for
    /// that alone: it reads on from history at its own pace, and only when automatic
    /// retention passes its position does its stream yield
    /// [`StoreError::Compacted`](crate::store::StoreError::Compacted) and
    /// end (memory stays bounded by this buffer plus the shared history).
    pub watch_buffer: usize,
}

impl Default for Options {
    fn default() -> Self {
        Self { retain_revisions: 10_000, log_rewrite_bytes: 64 * 1024 * 1024, watch_buffer: 64 }
    }
}
