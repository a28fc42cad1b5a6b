//! The node's current config, readable from any request without a lock.

use std::sync::Arc;

use arc_swap::ArcSwapOption;
use tokio::sync::watch;

use crate::config::NodeConfig;

pub struct NodeState {
    config: ArcSwapOption<NodeConfig>,
    /// Every published config, for the persister (which only wants the newest).
    published: watch::Sender<Option<Arc<NodeConfig>>>,
}

impl NodeState {
    pub fn new(initial: Option<NodeConfig>) -> Arc<Self> {
        let initial = initial.map(Arc::new);
        let (published, _) = watch::channel(initial.clone());
        Arc::new(Self { config: ArcSwapOption::new(initial), published })
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
}
