//! Where things live in the store, below one prefix (`/switchyard/` by default).
//!
//! `config/` holds everything nodes receive (the node stream watches only it);
//! `nodes/` holds node presence, kept apart so heartbeats never wake config watchers.

#[derive(Clone, Debug)]
pub struct Layout {
    prefix: String,
}

/// The resource name of the catalog below `config/`.
pub const CATALOG: &str = "catalog";
/// The resource-name prefix of API keys below `config/`.
pub const KEYS: &str = "keys/";

impl Layout {
    pub fn new(prefix: &str) -> Self {
        let mut prefix = prefix.to_owned();
        if !prefix.ends_with('/') {
            prefix.push('/');
        }
        Self { prefix }
    }

    pub fn config_prefix(&self) -> String {
        format!("{}config/", self.prefix)
    }

    pub fn catalog(&self) -> String {
        format!("{}config/{CATALOG}", self.prefix)
    }

    pub fn keys_prefix(&self) -> String {
        format!("{}config/{KEYS}", self.prefix)
    }

    pub fn key(&self, id: &str) -> String {
        format!("{}config/{KEYS}{id}", self.prefix)
    }

    pub fn nodes_prefix(&self) -> String {
        format!("{}nodes/", self.prefix)
    }

    pub fn node(&self, id: &str) -> String {
        format!("{}nodes/{id}", self.prefix)
    }

    /// The resource name nodes see for a store key under `config/`.
    pub fn resource_name<'k>(&self, key: &'k str) -> Option<&'k str> {
        key.strip_prefix(&self.prefix)?.strip_prefix("config/")
    }
}
