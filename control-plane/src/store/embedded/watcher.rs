//! Watchers: each watch is a task that reads the shared history from its own cursor and
//! sends what matches its prefix down the watch's stream.
//!
//! Reading from the shared history, rather than having the writer push to every watcher,
//! keeps the writer thread from ever waiting on a slow reader: a watcher that falls behind
//! reads on at its own pace and is cut off with [`StoreError::Compacted`] only once
//! retention passes its cursor, as an etcd watcher is.

use std::sync::Arc;

use parking_lot::Mutex;
use tokio::sync::{mpsc, watch};

use super::state::State;
use crate::store::api::{Revision, StoreError, WatchBatch, WatchEvent};

/// Most revisions a watcher copies out of history per lock acquisition.
const WATCH_CHUNK: usize = 256;

/// One watch: the task that feeds its stream.
pub(super) struct Watcher {
    pub(super) state: Arc<Mutex<State>>,
    /// The writer's latest applied revision; a change means new history to read.
    pub(super) revisions: watch::Receiver<Revision>,
    pub(super) prefix: String,
    /// The next revision this watcher has not yet looked at.
    pub(super) cursor: Revision,
    pub(super) tx: mpsc::Sender<Result<WatchBatch, StoreError>>,
}

impl Watcher {
    /// Runs until the stream is dropped, the store closes, or retention passes the cursor.
    pub(super) async fn run(mut self) {
        loop {
            self.revisions.borrow_and_update();
            let gathered = {
                let st = self.state.lock();
                if self.cursor < st.floor {
                    Err(st.floor)
                } else {
                    let start = st.history.partition_point(|(r, _)| *r < self.cursor);
                    let mut batches = Vec::new();
                    for (rev, events) in st.history.range(start..).take(WATCH_CHUNK) {
                        let events: Vec<WatchEvent> = events
                            .iter()
                            .filter(|e| e.kv.key.starts_with(&self.prefix))
                            .cloned()
                            .collect();
                        if !events.is_empty() {
                            batches.push(WatchBatch { events });
                        }
                        self.cursor = rev + 1;
                    }
                    Ok((batches, self.cursor > st.revision))
                }
            };
            let (batches, caught_up) = match gathered {
                Ok(gathered) => gathered,
                Err(compact_revision) => {
                    let _ = self.tx.send(Err(StoreError::Compacted { compact_revision })).await;
                    return;
                }
            };
            for batch in batches {
                if self.tx.send(Ok(batch)).await.is_err() {
                    return;
                }
            }
            if caught_up {
                tokio::select! {
                    changed = self.revisions.changed() => if changed.is_err() { return },
                    () = self.tx.closed() => return,
                }
            }
        }
    }
}
