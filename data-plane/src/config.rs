//! The node's config: an immutable snapshot, built from the control plane's resources and
//! swapped in whole. Requests read it without taking a lock.

use std::collections::{BTreeMap, HashMap, HashSet};
use std::sync::Arc;

use arc_swap::ArcSwap;
use parking_lot::Mutex;
use serde::Deserialize;

use switchyard_catalog::{Catalog, Fault, Model};

use crate::deployment::Pool;
use crate::keys::{Key, KeyParser};
use crate::providers::ProviderRuntime;
use crate::retry;
use crate::shards::ShardedMap;
use crate::structured;

/// Resource names, as the control plane sends them.
pub const CATALOG: &str = "catalog";
pub const KEYS: &str = "keys/";
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
    pub keys: ShardedMap<Box<str>, Arc<Key>>,
    /// By SHA-256 of the secret: the lookup each request makes.
    pub keys_by_hash: ShardedMap<[u8; 32], Arc<Key>>,
    /// The catalog's models by gateway name; wildcards are in `wildcards`, not here.
    pub models: HashMap<String, Arc<Model>>,
    /// The deployments of the catalog's models that have several (`deployments`), by gateway
    /// name. Such a model's entry in `models` is its first deployment, with `deployments`
    /// kept to say it has a pool here.
    pub pools: HashMap<String, Arc<Pool>>,
    /// The catalog's wildcard models (`openai/*`), the longest prefix first: the first that
    /// a name falls under is the one that serves it (docs/catalog.md, "Wildcard models").
    pub wildcards: Arc<[Arc<Model>]>,
    /// The names under wildcards that have their own breakers and metric series. Like those,
    /// it lives as long as the node: every version shares the one the node started with.
    pub wildcard_names: Arc<WildcardNames>,
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

/// A model as `models` holds it: itself, or for one with `deployments` its first deployment
/// (what code that knows no pools — a stream's continuation, a probe's default — calls).
fn base(m: &Model) -> Model {
    match m.deployment_models().into_iter().next() {
        Some(first) if !m.deployments.is_empty() => {
            Model { deployments: m.deployments.clone(), ..first }
        }
        _ => m.clone(),
    }
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
    Key(Key),
    Fault(Fault),
    /// A resource kind this node does not know (a newer control plane); ignored.
    Unknown,
}

fn parse(keys: &mut KeyParser, name: &str, value: &[u8]) -> Result<Parsed, ConfigError> {
    let invalid = |reason: String| ConfigError::Invalid { name: name.to_owned(), reason };
    if name == CATALOG {
        let catalog: Catalog = serde_json::from_slice(value).map_err(|e| invalid(e.to_string()))?;
        catalog.validate().map_err(|e| invalid(e.to_string()))?;
        Ok(Parsed::Catalog(catalog))
    } else if let Some(id) = name.strip_prefix(KEYS) {
        let key = keys.parse(value).map_err(invalid)?;
        if &*key.id != id {
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
        match change {
            Change::Snapshot { version, resources } => {
                let mut snapshot = self.begin_snapshot(version);
                snapshot.add(resources)?;
                Ok(snapshot.finish())
            }
            Change::Update { version, upserts, deletes } => {
                self.update(version, &upserts, &deletes)
            }
        }
    }

    fn update(
        &self,
        version: i64,
        upserts: &[(String, Vec<u8>)],
        deletes: &[String],
    ) -> Result<NodeConfig, ConfigError> {
        // Parse everything before changing anything.
        let mut keys = KeyParser::default();
        let parsed = upserts
            .iter()
            .map(|(name, value)| parse(&mut keys, name, value))
            .collect::<Result<Vec<_>, _>>()?;
        let mut next = self.clone();
        // Faults are few and change rarely: the list is rebuilt whole when one changes.
        let touches_faults = deletes.iter().any(|n| n.starts_with(FAULTS))
            || parsed.iter().any(|p| matches!(p, Parsed::Fault(_)));
        let mut faults: BTreeMap<String, Arc<Fault>> = if touches_faults {
            next.faults.iter().map(|f| (f.name.clone(), Arc::clone(f))).collect()
        } else {
            BTreeMap::new()
        };
        for name in deletes {
            if name == CATALOG {
                next.set_catalog(Catalog::default());
            } else if let Some(id) = name.strip_prefix(KEYS) {
                next.remove_key(id);
            } else if let Some(fault) = name.strip_prefix(FAULTS) {
                faults.remove(fault);
            }
        }
        for item in parsed {
            next.put(item, &mut faults, None);
        }
        if touches_faults {
            next.faults = faults.into_values().collect();
        }
        next.version = version;
        Ok(next)
    }

    /// Starts a snapshot at `version`, built from chunks as they arrive: no chunk is kept
    /// once added, and keys unchanged since this config are shared with it, so a resync
    /// holds one copy of the fleet's keys, not two.
    pub fn begin_snapshot(&self, version: i64) -> SnapshotBuilder {
        // Warm provider pools survive a resync; set_catalog drops the stale ones.
        let next = NodeConfig {
            version,
            providers: self.providers.clone(),
            retry_budget: Arc::clone(&self.retry_budget),
            schemas: Arc::clone(&self.schemas),
            wildcard_names: Arc::clone(&self.wildcard_names),
            ..Default::default()
        };
        SnapshotBuilder {
            next,
            // A first snapshot has nothing to share: no lookup per key.
            previous: (!self.keys.is_empty()).then(|| self.keys.clone()),
            faults: BTreeMap::new(),
            keys: KeyParser::default(),
            catalog: false,
        }
    }

    fn remove_key(&mut self, id: &str) {
        if let Some(old) = self.keys.remove(id) {
            self.limited_keys -= usize::from(old.limited());
            self.keys_by_hash.remove(&old.digest);
        }
    }

    /// Installs one parsed resource. `previous`: keys of an older config to share when equal.
    fn put(
        &mut self,
        item: Parsed,
        faults: &mut BTreeMap<String, Arc<Fault>>,
        previous: Option<&ShardedMap<Box<str>, Arc<Key>>>,
    ) {
        match item {
            Parsed::Catalog(catalog) => self.set_catalog(catalog),
            Parsed::Key(key) => {
                let key = match previous.and_then(|p| p.get(&*key.id)) {
                    Some(old) if **old == key => Arc::clone(old),
                    _ => Arc::new(key),
                };
                self.limited_keys += usize::from(key.limited());
                if let Some(old) = self.keys.insert(key.id.clone(), Arc::clone(&key)) {
                    self.limited_keys -= usize::from(old.limited());
                    self.keys_by_hash.remove(&old.digest);
                }
                self.keys_by_hash.insert(key.digest, key);
            }
            Parsed::Fault(fault) => {
                faults.insert(fault.name.clone(), Arc::new(fault));
            }
            Parsed::Unknown => {}
        }
    }

    /// Installs a catalog, keeping the connection pool of every provider whose definition
    /// did not change (a catalog edit must not drop warm connections).
    fn set_catalog(&mut self, catalog: Catalog) {
        let (wildcards, models): (Vec<&Model>, Vec<&Model>) =
            catalog.models.iter().partition(|m| m.is_wildcard());
        self.models = models.into_iter().map(|m| (m.name.clone(), Arc::new(base(m)))).collect();
        self.pools = catalog
            .models
            .iter()
            .filter_map(|m| Some((m.name.clone(), Arc::new(Pool::of(&catalog, m)?))))
            .collect();
        let mut wildcards: Vec<Arc<Model>> =
            wildcards.into_iter().map(|m| Arc::new(m.clone())).collect();
        wildcards.sort_by_key(|m| std::cmp::Reverse(m.name.len()));
        self.wildcards = wildcards.into();
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

    /// A resource as the node's last-known-good keeps it (`None`: not in this config, or
    /// not kept — injected faults are left out: a node restarted while its control plane is
    /// away serves without a drill, whose end it could not learn).
    pub fn stored(&self, name: &str) -> Result<Option<Vec<u8>>, serde_json::Error> {
        if name == CATALOG {
            return serde_json::to_vec(&*self.catalog).map(Some);
        }
        match name.strip_prefix(KEYS).and_then(|id| self.keys.get(id)) {
            Some(key) => key.to_json().map(Some),
            None => Ok(None),
        }
    }
}

/// The most names under one wildcard that get their own breaker and metric series on a node;
/// the names past it are served folded into the wildcard (docs/catalog.md, "Wildcard
/// models"). A client choosing names must not grow the node's breakers, the breaker states
/// it reports and its metric series without bound.
pub const WILDCARD_NAMES_MAX: usize = 256;

/// Which names under wildcards this node has admitted, up to [`WILDCARD_NAMES_MAX`] per
/// wildcard, first come first kept. A request reads it without a lock; only a name seen for
/// the first time takes the writers' mutex (at most `WILDCARD_NAMES_MAX` times a wildcard).
#[derive(Debug, Default)]
pub struct WildcardNames {
    admitted: ArcSwap<Admitted>,
    writer: Mutex<()>,
}

#[derive(Clone, Debug, Default)]
struct Admitted {
    names: HashSet<Box<str>>,
    /// How many names each wildcard (by its catalog name) admitted.
    per_wildcard: HashMap<Box<str>, usize>,
}

impl WildcardNames {
    /// Whether `name`, under `wildcard`, has its own breaker and metric series: it had
    /// already, or `wildcard` has room for one more.
    pub fn admit(&self, wildcard: &str, name: &str) -> bool {
        let full = |admitted: &Admitted| {
            admitted.per_wildcard.get(wildcard).is_some_and(|n| *n >= WILDCARD_NAMES_MAX)
        };
        let current = self.admitted.load();
        if current.names.contains(name) {
            return true;
        }
        if full(&current) {
            return false;
        }
        let _writer = self.writer.lock();
        let current = self.admitted.load_full();
        if current.names.contains(name) {
            return true;
        }
        if full(&current) {
            return false;
        }
        let mut next = Admitted::clone(&current);
        next.names.insert(name.into());
        let count = next.per_wildcard.entry(wildcard.into()).or_default();
        *count += 1;
        if *count == WILDCARD_NAMES_MAX {
            tracing::warn!(
                wildcard,
                max = WILDCARD_NAMES_MAX,
                "a wildcard admitted the most names a node tracks: new names under it are \
                 served folded into it, under its own name"
            );
        }
        self.admitted.store(Arc::new(next));
        true
    }
}

/// A snapshot being applied as its chunks arrive (see [`NodeConfig::begin_snapshot`]).
pub struct SnapshotBuilder {
    next: NodeConfig,
    previous: Option<ShardedMap<Box<str>, Arc<Key>>>,
    faults: BTreeMap<String, Arc<Fault>>,
    keys: KeyParser,
    catalog: bool,
}

impl SnapshotBuilder {
    pub fn version(&self) -> i64 {
        self.next.version
    }

    /// Adds a chunk of resources. An error rejects the whole snapshot: the builder is then
    /// dropped and the config in force stays.
    pub fn add(&mut self, resources: Vec<(String, Vec<u8>)>) -> Result<(), ConfigError> {
        for (name, value) in resources {
            let item = parse(&mut self.keys, &name, &value)?;
            self.catalog |= matches!(item, Parsed::Catalog(_));
            self.next.put(item, &mut self.faults, self.previous.as_ref());
        }
        Ok(())
    }

    pub fn finish(mut self) -> NodeConfig {
        if !self.catalog {
            self.next.set_catalog(Catalog::default());
        }
        self.next.faults = self.faults.into_values().collect();
        self.next
    }
}

/// The last-known-good file of nodes before the incremental one (`config.json`: the whole
/// config as one JSON object), read once on upgrade.
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

    use switchyard_catalog::keys::secret_digest;

    fn key_json(id: &str, secret: &str) -> Vec<u8> {
        crate::keys::record(id, secret, serde_json::json!({}))
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
        assert!(next.keys_by_hash.contains_key(&secret_digest("h9")));
        assert!(
            !next.keys_by_hash.contains_key(&secret_digest("h1")),
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
    fn a_resync_shares_the_keys_that_did_not_change() {
        let base = NodeConfig::default()
            .apply(Change::Snapshot {
                version: 3,
                resources: vec![
                    ("keys/k1".into(), key_json("k1", "s1")),
                    ("keys/k2".into(), key_json("k2", "s2")),
                ],
            })
            .unwrap();
        let mut snapshot = base.begin_snapshot(9);
        snapshot.add(vec![("keys/k1".into(), key_json("k1", "s1"))]).unwrap();
        snapshot.add(vec![("keys/k2".into(), key_json("k2", "rotated"))]).unwrap();
        let next = snapshot.finish();
        assert_eq!(next.version, 9);
        assert!(Arc::ptr_eq(base.keys.get("k1").unwrap(), next.keys.get("k1").unwrap()));
        assert!(!next.keys_by_hash.contains_key(&secret_digest("s2")));
        assert!(next.keys_by_hash.contains_key(&secret_digest("rotated")));
        assert!(
            base.keys_by_hash.contains_key(&secret_digest("s2")),
            "the old config is untouched"
        );
    }

    #[test]
    fn a_bad_chunk_rejects_the_snapshot_naming_the_resource() {
        let mut snapshot = NodeConfig::default().begin_snapshot(2);
        snapshot.add(vec![("keys/k1".into(), key_json("k1", "s1"))]).unwrap();
        let err = snapshot.add(vec![("keys/k2".into(), key_json("k3", "s3"))]).unwrap_err();
        assert!(err.to_string().contains("keys/k2") && err.to_string().contains("k3"), "{err}");
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
