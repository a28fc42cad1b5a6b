//! The node's config: an immutable snapshot, built from the control plane's resources and
//! swapped in whole. Requests read it without taking a lock.

use std::collections::{BTreeMap, HashMap};
use std::sync::Arc;

use serde::Deserialize;

use switchyard_catalog::{ApiKeyRecord, Catalog, Fault, Model};

use crate::providers::ProviderRuntime;
use crate::retry;
use crate::shards::ShardedMap;
use crate::structured;

/// Resource names, as the control plane sends them.
const CATALOG: &str = "catalog";
const KEYS: &str = "keys/";
const FAULTS: &str = "faults/";

#[derive(Debug, thiserror::Error)]
pub enum ConfigError {
    #[error("resource {name}: {reason}")]
    Invalid { name: String, reason: String },
}

/// One applied config version.
#[derive(Clone, Debug, Default)]
pub struct NodeConfig {
    /// The store revision this config reflects.
    pub version: i64,
    pub catalog: Arc<Catalog>,
    /// By key id.
    pub keys: ShardedMap<Arc<ApiKeyRecord>>,
    /// By hex SHA-256 of the secret: the lookup each request makes.
    pub keys_by_hash: ShardedMap<Arc<ApiKeyRecord>>,
    /// The catalog's models by gateway name.
    pub models: HashMap<String, Arc<Model>>,
    /// Providers with their connection pools and resolved credentials, by name.
    pub providers: HashMap<String, Arc<ProviderRuntime>>,
    /// The node's retry budget. It counts traffic, not config, so every version shares
    /// the one the node started with; its limits come from the catalog's `retry_policy`.
    pub retry_budget: Arc<retry::Budget>,
    /// Compiled `response_format`s (structured outputs), kept across requests. Like the
    /// retry budget, every version shares the one the node started with: a schema means the
    /// same under any config.
    pub schemas: Arc<structured::Compiled>,
    /// Injected faults in force, by name; empty unless a drill is on, which is all the
    /// request path checks then.
    pub faults: Arc<[Arc<Fault>]>,
    /// Active keys with limits: while there are any, the node reports its limit windows
    /// (kept as a count so a key change costs O(1), not a scan of every key).
    pub limited_keys: usize,
}

/// An active key with at least one limit: the node counts it for the fleet.
pub fn limited(key: &ApiKeyRecord) -> bool {
    key.is_active() && key.limits.is_some_and(|l| !l.is_empty())
}

/// A change to apply: a full snapshot replaces everything, an update patches.
pub enum Change {
    Snapshot { version: i64, resources: Vec<(String, Vec<u8>)> },
    Update { version: i64, upserts: Vec<(String, Vec<u8>)>, deletes: Vec<String> },
}

impl Change {
    pub fn version(&self) -> i64 {
        match self {
            Self::Snapshot { version, .. } | Self::Update { version, .. } => *version,
        }
    }
}

enum Parsed {
    Catalog(Catalog),
    Key(ApiKeyRecord),
    Fault(Fault),
    /// A resource kind this node does not know (a newer control plane); ignored.
    Unknown,
}

fn parse(name: &str, value: &[u8]) -> Result<Parsed, ConfigError> {
    let invalid = |reason: String| ConfigError::Invalid { name: name.to_owned(), reason };
    if name == CATALOG {
        let catalog: Catalog = serde_json::from_slice(value).map_err(|e| invalid(e.to_string()))?;
        catalog.validate().map_err(|e| invalid(e.to_string()))?;
        Ok(Parsed::Catalog(catalog))
    } else if let Some(id) = name.strip_prefix(KEYS) {
        let key: ApiKeyRecord =
            serde_json::from_slice(value).map_err(|e| invalid(e.to_string()))?;
        if key.id != id {
            return Err(invalid(format!("holds key id {:?}", key.id)));
        }
        Ok(Parsed::Key(key))
    } else if let Some(fault_name) = name.strip_prefix(FAULTS) {
        let fault: Fault = serde_json::from_slice(value).map_err(|e| invalid(e.to_string()))?;
        if fault.name != fault_name {
            return Err(invalid(format!("holds fault {:?}", fault.name)));
        }
        fault.validate().map_err(|e| invalid(e.to_string()))?;
        Ok(Parsed::Fault(fault))
    } else {
        Ok(Parsed::Unknown)
    }
}

impl NodeConfig {
    /// Builds the config that results from `change`, or says why it cannot be applied (the
    /// current config then stays in force: all or nothing).
    pub fn apply(&self, change: Change) -> Result<NodeConfig, ConfigError> {
        let snapshot = matches!(change, Change::Snapshot { .. });
        let (version, mut next, upserts, deletes) = match change {
            Change::Snapshot { version, resources } => {
                // Warm provider pools survive a resync; set_catalog drops the stale ones.
                let fresh = NodeConfig {
                    providers: self.providers.clone(),
                    retry_budget: Arc::clone(&self.retry_budget),
                    schemas: Arc::clone(&self.schemas),
                    ..Default::default()
                };
                (version, fresh, resources, Vec::new())
            }
            Change::Update { version, upserts, deletes } => {
                (version, self.clone(), upserts, deletes)
            }
        };
        // Parse everything before changing anything.
        let parsed = upserts
            .iter()
            .map(|(name, value)| parse(name, value))
            .collect::<Result<Vec<_>, _>>()?;
        // Faults are few and change rarely: the list is rebuilt whole when one changes.
        let touches_faults = deletes.iter().any(|n| n.starts_with(FAULTS))
            || parsed.iter().any(|p| matches!(p, Parsed::Fault(_)));
        let mut faults: BTreeMap<String, Arc<Fault>> = if touches_faults {
            next.faults.iter().map(|f| (f.name.clone(), Arc::clone(f))).collect()
        } else {
            BTreeMap::new()
        };
        for name in &deletes {
            if name == CATALOG {
                next.set_catalog(Catalog::default());
            } else if let Some(id) = name.strip_prefix(KEYS)
                && let Some(old) = next.keys.remove(id)
            {
                next.limited_keys -= usize::from(limited(&old));
                next.keys_by_hash.remove(&old.secret_sha256);
            } else if let Some(fault) = name.strip_prefix(FAULTS) {
                faults.remove(fault);
            }
        }
        for item in parsed {
            match item {
                Parsed::Catalog(catalog) => next.set_catalog(catalog),
                Parsed::Key(key) => {
                    let key = Arc::new(key);
                    next.limited_keys += usize::from(limited(&key));
                    if let Some(old) = next.keys.insert(key.id.clone(), Arc::clone(&key)) {
                        next.limited_keys -= usize::from(limited(&old));
                        next.keys_by_hash.remove(&old.secret_sha256);
                    }
                    next.keys_by_hash.insert(key.secret_sha256.clone(), key);
                }
                Parsed::Fault(fault) => {
                    faults.insert(fault.name.clone(), Arc::new(fault));
                }
                Parsed::Unknown => {}
            }
        }
        if touches_faults {
            next.faults = faults.into_values().collect();
        }
        if snapshot && !upserts.iter().any(|(name, _)| name == CATALOG) {
            next.set_catalog(Catalog::default());
        }
        next.version = version;
        Ok(next)
    }

    /// Installs a catalog, keeping the connection pool of every provider whose definition
    /// did not change (a catalog edit must not drop warm connections).
    fn set_catalog(&mut self, catalog: Catalog) {
        self.models =
            catalog.models.iter().map(|m| (m.name.clone(), Arc::new(m.clone()))).collect();
        let old = std::mem::take(&mut self.providers);
        self.providers = catalog
            .providers
            .iter()
            .map(|p| {
                let runtime = match old.get(&p.name) {
                    Some(existing) if existing.def == *p => Arc::clone(existing),
                    _ => Arc::new(ProviderRuntime::new(p.clone())),
                };
                (p.name.clone(), runtime)
            })
            .collect();
        self.catalog = Arc::new(catalog);
    }

    /// The config as resources, the form in which it is persisted and re-applied.
    /// Writes the config as [`Persisted`]'s JSON, each record serialised straight into
    /// `out`: no intermediate tree, which with a fleet's worth of keys was most of the
    /// node's memory (docs/BENCHMARKS.md, "Figures behind design choices").
    /// Injected faults are left out: a node restarted while its control plane is away serves
    /// without a drill, whose end (its lease) it could not learn.
    pub fn write_persisted(&self, out: &mut impl std::io::Write) -> Result<(), serde_json::Error> {
        let io = serde_json::Error::io;
        write!(out, "{{\"version\":{},\"resources\":{{", self.version).map_err(io)?;
        serde_json::to_writer(&mut *out, CATALOG)?;
        out.write_all(b":").map_err(io)?;
        serde_json::to_writer(&mut *out, &*self.catalog)?;
        for (id, key) in self.keys.iter() {
            out.write_all(b",").map_err(io)?;
            serde_json::to_writer(&mut *out, &format!("{KEYS}{id}"))?;
            out.write_all(b":").map_err(io)?;
            serde_json::to_writer(&mut *out, &**key)?;
        }
        out.write_all(b"}}").map_err(io)
    }
}

/// The last-known-good config as kept in the node's data dir: its resources as the control
/// plane sent them, re-applied through [`NodeConfig::apply`] on start.
#[derive(Debug, Deserialize)]
pub struct Persisted {
    pub version: i64,
    pub resources: BTreeMap<String, Box<serde_json::value::RawValue>>,
}

impl Persisted {
    pub fn into_change(self) -> Change {
        let resources = self
            .resources
            .into_iter()
            .map(|(name, value)| (name, value.get().as_bytes().to_vec()))
            .collect();
        Change::Snapshot { version: self.version, resources }
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    fn key_json(id: &str, hash: &str) -> Vec<u8> {
        serde_json::to_vec(&serde_json::json!({
            "id": id, "name": "n", "created_unix_ms": 1, "status": "active",
            "secret_sha256": hash, "secret_hint": "abcd"
        }))
        .unwrap()
    }

    #[test]
    fn an_update_patches_and_a_snapshot_replaces() {
        let base = NodeConfig::default()
            .apply(Change::Snapshot {
                version: 5,
                resources: vec![
                    ("keys/k1".into(), key_json("k1", "h1")),
                    ("keys/k2".into(), key_json("k2", "h2")),
                ],
            })
            .unwrap();
        assert_eq!(base.keys_by_hash.len(), 2);
        let next = base
            .apply(Change::Update {
                version: 6,
                upserts: vec![("keys/k1".into(), key_json("k1", "h9"))],
                deletes: vec!["keys/k2".into()],
            })
            .unwrap();
        assert_eq!(next.version, 6);
        assert!(next.keys_by_hash.contains_key("h9"));
        assert!(
            !next.keys_by_hash.contains_key("h1"),
            "a rotated key's old hash must stop working"
        );
        assert!(!next.keys.contains_key("k2"));
        assert_eq!(base.keys.len(), 2, "the old snapshot is untouched");
    }

    #[test]
    fn an_invalid_resource_rejects_the_whole_change() {
        let base = NodeConfig::default();
        let err = base
            .apply(Change::Update {
                version: 2,
                upserts: vec![
                    ("keys/k1".into(), key_json("k1", "h1")),
                    ("catalog".into(), b"{\"modles\":[]}".to_vec()),
                ],
                deletes: vec![],
            })
            .unwrap_err();
        assert!(err.to_string().contains("catalog"), "{err}");
    }

    fn fault_json(name: &str, status: u16) -> Vec<u8> {
        serde_json::to_vec(&serde_json::json!({
            "name": name, "target": {"model": "m"}, "rate": 1.0,
            "kind": {"type": "status", "status": status}, "expires_at_unix_ms": 0
        }))
        .unwrap()
    }

    fn fault_names(config: &NodeConfig) -> Vec<&str> {
        config.faults.iter().map(|f| f.name.as_str()).collect()
    }

    #[test]
    fn faults_arrive_change_and_go_with_the_config() {
        assert!(NodeConfig::default().faults.is_empty());
        let base = NodeConfig::default()
            .apply(Change::Snapshot {
                version: 3,
                resources: vec![
                    ("keys/k1".into(), key_json("k1", "h1")),
                    ("faults/a".into(), fault_json("a", 503)),
                ],
            })
            .unwrap();
        assert_eq!(fault_names(&base), ["a"]);
        let next = base
            .apply(Change::Update {
                version: 4,
                upserts: vec![("faults/b".into(), fault_json("b", 429))],
                deletes: vec![],
            })
            .unwrap();
        assert_eq!(fault_names(&next), ["a", "b"]);
        let next = next
            .apply(Change::Update {
                version: 5,
                upserts: vec![("faults/b".into(), fault_json("b", 500))],
                deletes: vec!["faults/a".into()],
            })
            .unwrap();
        assert_eq!(fault_names(&next), ["b"]);
        assert!(matches!(
            next.faults[0].kind,
            switchyard_catalog::FaultKind::Status { status: 500, .. }
        ));
        assert_eq!(fault_names(&base), ["a"], "the old snapshot is untouched");
        let resynced = next
            .apply(Change::Snapshot {
                version: 6,
                resources: vec![("keys/k1".into(), key_json("k1", "h1"))],
            })
            .unwrap();
        assert!(resynced.faults.is_empty(), "a snapshot without faults ends them all");
    }

    #[test]
    fn an_invalid_fault_rejects_the_whole_change() {
        let base = NodeConfig::default();
        let bad = [
            ("faults/a", b"{\"name\": \"a\"}".to_vec(), "missing field"),
            ("faults/a", fault_json("b", 503), "holds fault"),
            ("faults/a", fault_json("a", 200), "status"),
        ];
        for (name, value, why) in bad {
            let err = base
                .apply(Change::Update {
                    version: 2,
                    upserts: vec![("keys/k1".into(), key_json("k1", "h1")), (name.into(), value)],
                    deletes: vec![],
                })
                .unwrap_err()
                .to_string();
            assert!(err.contains(name) && err.contains(why), "{err}");
        }
    }

    #[test]
    fn faults_are_not_persisted() {
        let cfg = NodeConfig::default()
            .apply(Change::Snapshot {
                version: 7,
                resources: vec![("faults/a".into(), fault_json("a", 503))],
            })
            .unwrap();
        let mut bytes = Vec::new();
        cfg.write_persisted(&mut bytes).unwrap();
        let again = NodeConfig::default()
            .apply(serde_json::from_slice::<Persisted>(&bytes).unwrap().into_change())
            .unwrap();
        assert!(again.faults.is_empty());
    }

    #[test]
    fn persisted_config_round_trips() {
        let cfg = NodeConfig::default()
            .apply(Change::Snapshot {
                version: 7,
                resources: vec![("keys/k1".into(), key_json("k1", "h1"))],
            })
            .unwrap();
        let again = NodeConfig::default()
            .apply({
                let mut bytes = Vec::new();
                cfg.write_persisted(&mut bytes).unwrap();
                serde_json::from_slice::<Persisted>(&bytes).unwrap().into_change()
            })
            .unwrap();
        assert_eq!(again.version, 7);
        assert!(again.keys_by_hash.contains_key("h1"));
    }

    #[test]
    fn the_retry_budget_outlives_config_changes() {
        let base = NodeConfig::default();
        let next = base
            .apply(Change::Snapshot {
                version: 3,
                resources: vec![("keys/k1".into(), key_json("k1", "h1"))],
            })
            .unwrap();
        let next = next
            .apply(Change::Update { version: 4, upserts: vec![], deletes: vec!["keys/k1".into()] })
            .unwrap();
        assert!(
            Arc::ptr_eq(&base.retry_budget, &next.retry_budget),
            "a resync must not hand every request a fresh budget"
        );
        assert!(Arc::ptr_eq(&base.schemas, &next.schemas), "nor forget compiled schemas");
    }
}
