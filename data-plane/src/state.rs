//! The node's current config, readable from any request without a lock.

use std::sync::Arc;
use std::sync::atomic::{AtomicBool, Ordering};

use arc_swap::ArcSwapOption;
use tokio::sync::watch;

use crate::config::NodeConfig;

pub struct NodeState {
    config: ArcSwapOption<NodeConfig>,
    /// Every published config, for the persister (which only wants the newest).
    published: watch::Sender<Option<Arc<NodeConfig>>>,
    /// Set once the node is shutting down: `/readyz` answers 503 so load balancers stop
    /// sending new requests while those in flight finish.
    draining: AtomicBool,
}

impl NodeState {
    pub fn new(initial: Option<NodeConfig>) -> Arc<Self> {
        let initial = initial.map(Arc::new);
        let (published, _) = watch::channel(initial.clone());
        Arc::new(Self {
            config: ArcSwapOption::new(initial),
            published,
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

    pub fn publish(&self, config: NodeConfig) {
        let config = Arc::new(config);
        self.config.store(Some(Arc::clone(&config)));
        self.published.send_replace(Some(config));
    }

    pub fn subscribe(&self) -> watch::Receiver<Option<Arc<NodeConfig>>> {
        self.published.subscribe()
    }

    pub fn start_draining(&self) {
        self.draining.store(true, Ordering::Relaxed);
    }

    pub fn is_draining(&self) -> bool {
        self.draining.load(Ordering::Relaxed)
    }
}
