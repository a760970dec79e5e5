//! Map keys written by several sources at once (a pod address that is also a node address, two
//! CIDRs with the same prefix): every source's value is kept, ordered, and the last one wins —
//! the same outcome as writing the sources in that order from scratch. Changed keys are recorded
//! for the flush to the map driver.
//!
//! A key almost always has one source (a pod address), so its sources are a sorted `Vec`: one
//! small allocation per key, where a `BTreeMap` allocates a node of eleven slots.

use std::{
    collections::{HashMap, HashSet},
    hash::Hash,
};

/// Values of `K` by source `S`.
pub(super) struct Layered<K, S> {
    /// Each key's sources, sorted by source.
    values: HashMap<K, Vec<(S, u32)>>,
    dirty: HashSet<K>,
}

impl<K: Copy + Eq + Hash, S: Ord> Layered<K, S> {
    pub(super) fn new() -> Self {
        Self {
            values: HashMap::new(),
            dirty: HashSet::new(),
        }
    }

    /// Source `source` says `key` holds `value`.
    pub(super) fn set(&mut self, key: K, source: S, value: u32) {
        let sources = self.values.entry(key).or_default();
        match sources.binary_search_by(|(s, _)| s.cmp(&source)) {
            Ok(at) if sources[at].1 == value => {}
            Ok(at) => {
                sources[at].1 = value;
                self.dirty.insert(key);
            }
            Err(at) => {
                if sources.is_empty() {
                    sources.reserve_exact(1);
                }
                sources.insert(at, (source, value));
                self.dirty.insert(key);
            }
        }
    }

    /// Source `source` no longer says anything about `key`.
    pub(super) fn unset(&mut self, key: K, source: &S) {
        if let Some(sources) = self.values.get_mut(&key)
            && let Ok(at) = sources.binary_search_by(|(s, _)| s.cmp(source))
        {
            sources.remove(at);
            if sources.is_empty() {
                self.values.remove(&key);
            }
            self.dirty.insert(key);
        }
    }

    /// The value in force for `key`: the last source's.
    pub(super) fn winner(&self, key: &K) -> Option<u32> {
        self.values.get(key).and_then(|s| s.last()).map(|(_, v)| *v)
    }

    /// The keys changed since the last call.
    pub(super) fn take_dirty(&mut self) -> Vec<K> {
        self.dirty.drain().collect()
    }
}

#[cfg(test)]
mod tests {
    use super::Layered;

    #[test]
    fn the_last_source_wins_and_removing_it_reveals_the_one_below() {
        let mut l = Layered::new();
        l.set(1_u8, "a", 10);
        l.set(1, "b", 20);
        assert_eq!(l.winner(&1), Some(20));
        l.unset(1, &"b");
        assert_eq!(l.winner(&1), Some(10));
        assert_eq!(l.take_dirty(), vec![1]);
        l.set(1, "a", 10);
        assert!(l.take_dirty().is_empty(), "the same value is no change");
        l.unset(1, &"a");
        assert_eq!(l.winner(&1), None);
    }
}
