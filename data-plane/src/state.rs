//! The node's current config, readable from any request without a lock, and what of it the
//! last-known-good file does not hold yet.

use std::collections::BTreeSet;
use std::sync::Arc;
use std::sync::atomic::{AtomicBool, Ordering};

use arc_swap::ArcSwapOption;
use parking_lot::Mutex;
use tokio::sync::Notify;

use crate::config::NodeConfig;

/// What a published config changed.
pub enum Changed {
    /// Everything (a snapshot).
    All,
    /// These resources (upserted or deleted).
    Resources(Vec<String>),
}

/// Changes published since the persister last took them: the newest config, and either
/// "everything" or the names it must write again (coalesced, so a persister that fell
/// behind writes each changed resource once, at its newest value).
#[derive(Default)]
pub struct Unsaved {
    pub config: Option<Arc<NodeConfig>>,
    pub all: bool,
    pub names: BTreeSet<String>,
}

/// Past this many distinct changed resources the persister rewrites everything instead:
/// the list would cost more than the rewrite saves.
const MAX_UNSAVED_NAMES: usize = 100_000;

pub struct NodeState {
    config: ArcSwapOption<NodeConfig>,
    unsaved: Mutex<Unsaved>,
    saved: Notify,
    /// Woken on every publish, for the prober: it marks the breakers it owns at once, not a
    /// tick later, so no request meets an unmarked breaker of a new config.
    published: Notify,
    /// Set once the node is shutting down: `/readyz` answers 503 so load balancers stop
    /// sending new requests while those in flight finish.
    draining: AtomicBool,
}

impl NodeState {
    pub fn new(initial: Option<NodeConfig>) -> Arc<Self> {
        Arc::new(Self {
            config: ArcSwapOption::new(initial.map(Arc::new)),
            unsaved: Mutex::default(),
            saved: Notify::new(),
            published: Notify::new(),
            draining: AtomicBool::new(false),
        })
    }

    /// The config in force; `None` until a first one is applied (the node is not ready).
    pub fn current(&self) -> Option<Arc<NodeConfig>> {
        self.config.load_full()
    }

    pub fn version(&self) -> i64 {
        self.config.load().as_ref().map_or(0, |c| c.version)
    }

    pub fn publish(&self, config: NodeConfig, changed: Changed) {
        let config = Arc::new(config);
        self.config.store(Some(Arc::clone(&config)));
        let mut unsaved = self.unsaved.lock();
        unsaved.config = Some(config);
        match changed {
            Changed::All => unsaved.all = true,
            Changed::Resources(names) if !unsaved.all => {
                unsaved.names.extend(names);
                if unsaved.names.len() > MAX_UNSAVED_NAMES {
                    unsaved.all = true;
                }
            }
            Changed::Resources(_) => {}
        }
        if unsaved.all {
            unsaved.names.clear();
        }
        drop(unsaved);
        self.saved.notify_one();
        self.published.notify_one();
    }

    /// Resolves once a config is published after the last time it resolved (at once if one
    /// was published meanwhile).
    pub async fn published(&self) {
        self.published.notified().await;
    }

    /// Marks the whole config in force as not yet on disk (a file of an older format).
    pub fn unsaved_all(&self) {
        let mut unsaved = self.unsaved.lock();
        unsaved.config = self.current();
        unsaved.all = true;
        unsaved.names.clear();
        drop(unsaved);
        self.saved.notify_one();
    }

    /// Waits until something is published, then takes what is not saved yet.
    pub async fn next_unsaved(&self) -> Unsaved {
        loop {
            let unsaved = std::mem::take(&mut *self.unsaved.lock());
            if unsaved.config.is_some() {
                return unsaved;
            }
            self.saved.notified().await;
        }
    }

    pub fn start_draining(&self) {
        self.draining.store(true, Ordering::Relaxed);
    }

    pub fn is_draining(&self) -> bool {
        self.draining.load(Ordering::Relaxed)
    }
}
