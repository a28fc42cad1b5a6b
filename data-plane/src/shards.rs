//! A map split into shards behind `Arc`s, so that a config update copies only the shards it
//! touches: cloning a whole map of every API key for each key change made one change cost
//! in proportion to the fleet's keys (docs/BENCHMARKS.md, "Figures behind design choices"); with
//! `SHARDS` shards a change copies about 1/SHARDS of it.

use std::borrow::Borrow;
use std::collections::HashMap;
use std::hash::{BuildHasher, Hash};
use std::sync::Arc;

use foldhash::fast::{FixedState, RandomState};

const SHARDS: usize = 256;

#[derive(Clone, Debug)]
pub struct ShardedMap<K, V> {
    // foldhash, not SipHash: a million keys are hashed twice each when a snapshot is
    // applied, and every request hashes its key's digest. What is hashed comes from the
    // control plane, or is a SHA-256 digest, which a client cannot steer into collisions.
    shards: Vec<Arc<HashMap<K, V, RandomState>>>,
}

impl<K, V> Default for ShardedMap<K, V> {
    fn default() -> Self {
        Self { shards: (0..SHARDS).map(|_| Arc::new(HashMap::default())).collect() }
    }
}

fn shard_of<Q: Hash + ?Sized>(key: &Q) -> usize {
    // Any fixed hash works: shards only need to spread keys evenly within one process. A key
    // and its borrowed form hash alike (`Borrow`'s contract), so both find the same shard.
    // Its seed is not the maps' (those are random): within a shard, where every key has the
    // same shard bits, the map's own hash still spreads them.
    (FixedState::with_seed(0x5157_c4ad).hash_one(key) as usize) % SHARDS
}

impl<K: Hash + Eq + Clone, V: Clone> ShardedMap<K, V> {
    pub fn get<Q: Hash + Eq + ?Sized>(&self, key: &Q) -> Option<&V>
    where
        K: Borrow<Q>,
    {
        self.shards[shard_of(key)].get(key)
    }

    pub fn contains_key<Q: Hash + Eq + ?Sized>(&self, key: &Q) -> bool
    where
        K: Borrow<Q>,
    {
        self.get(key).is_some()
    }

    /// Copies the key's shard first if another snapshot still shares it.
    pub fn insert(&mut self, key: K, value: V) -> Option<V> {
        Arc::make_mut(&mut self.shards[shard_of(&key)]).insert(key, value)
    }

    pub fn remove<Q: Hash + Eq + ?Sized>(&mut self, key: &Q) -> Option<V>
    where
        K: Borrow<Q>,
    {
        let shard = &mut self.shards[shard_of(key)];
        if !shard.contains_key(key) {
            return None;
        }
        Arc::make_mut(shard).remove(key)
    }

    pub fn len(&self) -> usize {
        self.shards.iter().map(|s| s.len()).sum()
    }

    pub fn is_empty(&self) -> bool {
        self.len() == 0
    }

    pub fn iter(&self) -> impl Iterator<Item = (&K, &V)> {
        self.shards.iter().flat_map(|s| s.iter())
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn a_clone_shares_shards_until_one_is_written() {
        let mut a: ShardedMap<String, i32> = ShardedMap::default();
        for i in 0..1000 {
            a.insert(format!("k{i}"), i);
        }
        let mut b = a.clone();
        b.insert("k1".into(), -1);
        b.remove("k2");
        assert_eq!(a.get("k1"), Some(&1), "the original is untouched");
        assert_eq!(a.get("k2"), Some(&2));
        assert_eq!(b.get("k1"), Some(&-1));
        assert!(!b.contains_key("k2"));
        assert_eq!(b.len(), 999);
        let shared = a.shards.iter().zip(&b.shards).filter(|(x, y)| Arc::ptr_eq(x, y)).count();
        assert!(shared >= SHARDS - 2, "only the written shards were copied: {shared} shared");
    }
}
