//! A driver for one BPF map: the desired contents come from a manager; `apply` reconciles.
//!
//! The first apply (and any after `request_resync`) reads the whole map back and classifies every
//! key: already correct (nothing written), out of sync (written), orphan (deleted). Later applies
//! touch only the keys a manager changed. A failure keeps the remaining keys dirty for the retry.

use std::{
    collections::{HashMap, HashSet},
    hash::Hash,
};

use serde::Serialize;

use super::kernel::{KernelError, MapIo};

/// What a driver did, for metrics and `weir status`.
#[derive(Clone, Copy, Debug, Default, PartialEq, Eq, Serialize)]
pub struct DriverStats {
    /// Entries written (created or replaced).
    pub writes: u64,
    /// Entries deleted (orphans and removals).
    pub deletes: u64,
    /// Applies that failed.
    pub errors: u64,
    /// Full resyncs done.
    pub resyncs: u64,
}

/// Desired contents of one map and the reconciliation of the kernel's copy.
pub struct MapDriver<K, V> {
    io: Box<dyn MapIo<K, V>>,
    desired: HashMap<K, V>,
    dirty: HashSet<K>,
    resync: bool,
    stats: DriverStats,
}

impl<K, V> MapDriver<K, V>
where
    K: Clone + Eq + Hash + Send,
    V: Clone + PartialEq + Send,
{
    /// A driver whose first apply is a full resync.
    pub fn new(io: Box<dyn MapIo<K, V>>) -> Self {
        Self {
            io,
            desired: HashMap::new(),
            dirty: HashSet::new(),
            resync: true,
            stats: DriverStats::default(),
        }
    }

    /// The map's name.
    pub fn name(&self) -> &str {
        self.io.name()
    }

    /// Manager side: the key should hold `value`. No kernel I/O.
    pub fn set(&mut self, key: K, value: V) {
        if self.desired.get(&key) != Some(&value) {
            self.dirty.insert(key.clone());
            self.desired.insert(key, value);
        }
    }

    /// Manager side: the key should not exist. No kernel I/O.
    pub fn remove(&mut self, key: &K) {
        if self.desired.remove(key).is_some() {
            self.dirty.insert(key.clone());
        }
    }

    /// Manager side: replace the whole desired contents (only changes become dirty).
    pub fn replace_all(&mut self, contents: HashMap<K, V>) {
        let stale: Vec<K> = self
            .desired
            .keys()
            .filter(|k| !contents.contains_key(*k))
            .cloned()
            .collect();
        for key in stale {
            self.remove(&key);
        }
        for (key, value) in contents {
            self.set(key, value);
        }
    }

    /// The desired value of a key.
    pub fn desired(&self, key: &K) -> Option<&V> {
        self.desired.get(key)
    }

    /// Every desired entry.
    pub fn entries(&self) -> impl Iterator<Item = (&K, &V)> {
        self.desired.iter()
    }

    /// Number of desired entries.
    pub fn len(&self) -> usize {
        self.desired.len()
    }

    /// True when there are no desired entries.
    pub fn is_empty(&self) -> bool {
        self.desired.is_empty()
    }

    /// The next apply reads the whole map back.
    pub fn request_resync(&mut self) {
        self.resync = true;
    }

    /// True when an apply has work to do.
    pub fn is_dirty(&self) -> bool {
        self.resync || !self.dirty.is_empty()
    }

    /// Counters so far.
    pub fn stats(&self) -> DriverStats {
        self.stats
    }

    /// Reconciles the kernel's map with the desired contents.
    pub fn apply(&mut self) -> Result<(), KernelError> {
        let result = if self.resync {
            self.full_resync()
        } else {
            self.apply_dirty()
        };
        if result.is_err() {
            self.stats.errors += 1;
        }
        result
    }

    fn full_resync(&mut self) -> Result<(), KernelError> {
        let kernel: HashMap<K, V> = self.io.read_all()?.into_iter().collect();
        // The kernel's copy is the truth now: only what differs from it is dirty.
        self.dirty.clear();
        for (key, value) in &kernel {
            if !self.desired.contains_key(key) {
                self.io.delete(key)?;
                self.stats.deletes += 1;
            } else if self.desired.get(key) != Some(value) {
                self.dirty.insert(key.clone());
            }
        }
        for key in self.desired.keys() {
            if !kernel.contains_key(key) {
                self.dirty.insert(key.clone());
            }
        }
        self.resync = false;
        self.stats.resyncs += 1;
        self.apply_dirty()
    }

    fn apply_dirty(&mut self) -> Result<(), KernelError> {
        let keys: Vec<K> = self.dirty.iter().cloned().collect();
        for key in keys {
            match self.desired.get(&key) {
                Some(value) => {
                    self.io.write(&key, value)?;
                    self.stats.writes += 1;
                }
                None => {
                    self.io.delete(&key)?;
                    self.stats.deletes += 1;
                }
            }
            self.dirty.remove(&key);
        }
        Ok(())
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::dataplane::fake::FakeMap;

    #[test]
    fn first_apply_classifies_and_sweeps_then_only_dirty_keys_are_written() {
        let fake = FakeMap::<u32, u64>::new("t_v1");
        fake.preload(&[(1, 10), (2, 99), (3, 30)]);
        let mut driver = MapDriver::new(Box::new(fake.clone()));
        driver.set(1, 10); // already correct
        driver.set(2, 20); // out of sync
        driver.set(4, 40); // missing
        driver.apply().expect("apply");
        assert_eq!(
            fake.contents(),
            vec![(1, 10), (2, 20), (4, 40)],
            "orphan 3 swept"
        );
        assert_eq!(
            driver.stats().writes,
            2,
            "only out-of-sync and missing keys are written"
        );
        assert_eq!(driver.stats().deletes, 1);
        assert!(!driver.is_dirty());

        driver.set(1, 10);
        assert!(!driver.is_dirty(), "setting the same value is not a change");
        driver.remove(&4);
        driver.apply().expect("apply");
        assert_eq!(fake.contents(), vec![(1, 10), (2, 20)]);
        assert_eq!(driver.stats().writes, 2);
        assert_eq!(driver.stats().deletes, 2);
    }

    #[test]
    fn a_restart_over_unchanged_state_writes_nothing() {
        let fake = FakeMap::<u32, u64>::new("t_v1");
        fake.preload(&[(1, 10), (2, 20)]);
        let mut driver = MapDriver::new(Box::new(fake.clone()));
        driver.replace_all(HashMap::from([(1, 10), (2, 20)]));
        driver.apply().expect("apply");
        assert_eq!(driver.stats().writes, 0);
        assert_eq!(driver.stats().deletes, 0);
        assert_eq!(fake.mutations(), 0);
    }

    #[test]
    fn a_failed_write_keeps_the_key_dirty_and_the_retry_completes() {
        let fake = FakeMap::<u32, u64>::new("t_v1");
        let mut driver = MapDriver::new(Box::new(fake.clone()));
        driver.set(1, 10);
        fake.fail_next_writes(1);
        assert!(driver.apply().is_err());
        assert!(driver.is_dirty());
        assert_eq!(driver.stats().errors, 1);
        driver.apply().expect("retry");
        assert_eq!(fake.contents(), vec![(1, 10)]);
    }
}
