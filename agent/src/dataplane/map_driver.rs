//! A driver for one BPF map: the desired contents come from a manager; `apply` reconciles.
//!
//! The first apply (and any after `request_resync`) reads the whole map back and classifies every
//! key: already correct (nothing written), out of sync (written), orphan (deleted). Later applies
//! touch only the keys a manager changed. A failing key does not stop the others: it stays dirty
//! and is retried with backoff (`retry`); `apply_due` also holds back the writes a caller refuses
//! (the security order of `plane`).

use std::{
    collections::{HashMap, hash_map::Entry},
    hash::Hash,
    time::Instant,
};

use serde::Serialize;

use super::retry::Backoff;
use crate::fasthash::{FastMap, FastSet};
use crate::kernel::{KernelError, MapIo};

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
    /// Drift repaired: entries a refresh found missing, altered or extra although the driver had
    /// them in sync, and pins found removed (in the status and metrics as `DataplaneStats::repairs`).
    #[serde(skip)]
    pub repairs: u64,
}

/// Desired contents of one map and the reconciliation of the kernel's copy.
pub struct MapDriver<K, V> {
    io: Box<dyn MapIo<K, V>>,
    /// Keys are the agent's own numbers (ids, addresses, ports), hashed with the fast hasher
    /// (`fasthash`): a converge sets and applies 100,000s of them.
    desired: FastMap<K, V>,
    dirty: FastSet<K>,
    resync: bool,
    /// The pending read back is a periodic refresh: what differs from what the driver had in
    /// sync is drift from outside, counted and logged as a repair.
    refreshing: bool,
    stats: DriverStats,
    backoff: Backoff<K>,
    backoff_resync: Backoff<()>,
}

impl<K, V> MapDriver<K, V>
where
    K: Clone + Eq + Hash + Send + std::fmt::Debug,
    V: Clone + PartialEq + Send,
{
    /// A driver whose first apply is a full resync.
    pub fn new(io: Box<dyn MapIo<K, V>>) -> Self {
        Self {
            io,
            desired: FastMap::default(),
            dirty: FastSet::default(),
            resync: true,
            refreshing: false,
            stats: DriverStats::default(),
            backoff: Backoff::default(),
            backoff_resync: Backoff::default(),
        }
    }

    /// The map's name.
    pub fn name(&self) -> &str {
        self.io.name()
    }

    /// Manager side: the key should hold `value`. No kernel I/O.
    pub fn set(&mut self, key: K, value: V) {
        match self.desired.entry(key) {
            Entry::Occupied(mut e) => {
                if *e.get() != value {
                    self.dirty.insert(e.key().clone());
                    e.insert(value);
                }
            }
            Entry::Vacant(e) => {
                self.dirty.insert(e.key().clone());
                e.insert(value);
            }
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

    /// A periodic refresh (Felix's refresh timer): the next apply checks the map's pin and reads
    /// the whole map back; whatever differs from what the driver had in sync (an entry missing,
    /// altered or extra, a pin removed) is drift from outside: repaired, counted and logged.
    pub fn refresh(&mut self) {
        self.resync = true;
        self.refreshing = true;
    }

    /// True when an apply has work to do.
    pub fn is_dirty(&self) -> bool {
        self.resync || !self.dirty.is_empty()
    }

    /// Counters so far.
    pub fn stats(&self) -> DriverStats {
        self.stats
    }

    /// True once the kernel's copy has been read back (since the last `request_resync`).
    pub fn is_synced(&self) -> bool {
        !self.resync
    }

    /// Keys still to be written or deleted (after an apply: those that failed or waited).
    pub fn pending_keys(&self) -> impl Iterator<Item = &K> {
        self.dirty.iter()
    }

    /// Reconciles the kernel's map with the desired contents, retrying every dirty key now. A
    /// failing key does not stop the others: it stays dirty and the first error is returned.
    pub fn apply(&mut self) -> Result<(), KernelError> {
        let pending = self.reconcile(None, &|_, _| true);
        match pending.error {
            Some(e) => Err(e),
            None => Ok(()),
        }
    }

    /// Reconciles, leaving alone the keys in backoff at `now` and the writes `allow` refuses
    /// (deletes always go: they only close). Returns what is left to do.
    pub fn apply_due(&mut self, now: Instant, allow: &dyn Fn(&K, &V) -> bool) -> Pending {
        self.reconcile(Some(now), allow)
    }

    fn reconcile(&mut self, now: Option<Instant>, allow: &dyn Fn(&K, &V) -> bool) -> Pending {
        let mut pending = Pending {
            driver: self.io.name().to_owned(),
            ..Pending::default()
        };
        if self.resync
            && self.refreshing
            && let Err(e) = self.check_pin()
        {
            pending.failed += 1;
            pending.error = Some(e);
        }
        if self.resync {
            match self.read_back(now) {
                Ok(true) => {}
                Ok(false) => pending.waiting += 1,
                Err(e) => {
                    pending.failed += 1;
                    pending.error = Some(e);
                }
            }
        }
        if !self.resync {
            self.apply_dirty(now, allow, &mut pending);
        }
        if pending.error.is_some() {
            self.stats.errors += 1;
        }
        pending.retry_at = match (self.backoff.next_due(), self.backoff_resync.next_due()) {
            (Some(a), Some(b)) => Some(a.min(b)),
            (a, b) => a.or(b),
        };
        pending
    }

    /// Reads the whole map back and classifies every key; orphans become dirty deletes. False
    /// when an earlier failed read back is still in backoff.
    fn read_back(&mut self, now: Option<Instant>) -> Result<bool, KernelError> {
        if let Some(now) = now
            && !self.backoff_resync.is_due(&(), now)
        {
            return Ok(false);
        }
        let all = match self.io.read_all() {
            Ok(all) => all,
            Err(e) => {
                self.backoff_resync
                    .failed(&(), now.unwrap_or_else(Instant::now));
                return Err(e);
            }
        };
        self.backoff_resync.succeeded(&());
        // The common refresh: the kernel holds exactly what is desired. Its keys are distinct, so
        // as many equal entries as desired ones means nothing is missing, altered or extra: one
        // pass of lookups, no copy of the map.
        if all.len() == self.desired.len()
            && all.iter().all(|(k, v)| self.desired.get(k) == Some(v))
        {
            self.refreshing = false;
            self.dirty.clear();
            self.backoff.retain(|_| false);
            self.resync = false;
            self.stats.resyncs += 1;
            return Ok(true);
        }
        let kernel: HashMap<K, V> = all.into_iter().collect();
        if std::mem::take(&mut self.refreshing) {
            self.count_drift(&kernel);
        }
        // The kernel's copy is the truth now: only what differs from it is dirty.
        self.dirty.clear();
        for (key, value) in &kernel {
            if self.desired.get(key) != Some(value) {
                self.dirty.insert(key.clone());
            }
        }
        for key in self.desired.keys() {
            if !kernel.contains_key(key) {
                self.dirty.insert(key.clone());
            }
        }
        let dirty = &self.dirty;
        self.backoff.retain(|k| dirty.contains(k));
        self.resync = false;
        self.stats.resyncs += 1;
        Ok(true)
    }

    /// A refresh found the map's pin gone: pins the map this driver holds open again.
    fn check_pin(&mut self) -> Result<(), KernelError> {
        if self.io.pin_present() {
            return Ok(());
        }
        self.io.repin()?;
        self.stats.repairs += 1;
        tracing::warn!(
            driver = self.io.name(),
            found = "pin removed",
            "drift repaired: the map is pinned again"
        );
        Ok(())
    }

    /// Counts and logs (once per refresh) what the kernel's copy holds that differs from what
    /// the driver had in sync: keys not dirty before the read back.
    fn count_drift(&mut self, kernel: &HashMap<K, V>) {
        const SAMPLE: usize = 3;
        let (mut missing, mut altered, mut extra) = (Vec::new(), Vec::new(), Vec::new());
        for (key, value) in &self.desired {
            if self.dirty.contains(key) {
                continue;
            }
            match kernel.get(key) {
                None => missing.push(key),
                Some(v) if v != value => altered.push(key),
                Some(_) => {}
            }
        }
        for key in kernel.keys() {
            if !self.desired.contains_key(key) && !self.dirty.contains(key) {
                extra.push(key);
            }
        }
        let found = missing.len() + altered.len() + extra.len();
        if found == 0 {
            return;
        }
        self.stats.repairs += found as u64;
        let sample = |keys: &[&K]| format!("{:?}", &keys[..keys.len().min(SAMPLE)]);
        tracing::warn!(
            driver = self.io.name(),
            missing = missing.len(),
            altered = altered.len(),
            extra = extra.len(),
            missing_keys = %sample(&missing),
            altered_keys = %sample(&altered),
            extra_keys = %sample(&extra),
            "drift found in the kernel's map; repairing"
        );
    }

    fn apply_dirty(
        &mut self,
        now: Option<Instant>,
        allow: &dyn Fn(&K, &V) -> bool,
        pending: &mut Pending,
    ) {
        let keys: Vec<K> = self.dirty.iter().cloned().collect();
        for key in keys {
            if let Some(now) = now
                && !self.backoff.is_due(&key, now)
            {
                pending.waiting += 1;
                continue;
            }
            let result = match self.desired.get(&key) {
                Some(value) if !allow(&key, value) => {
                    pending.held += 1;
                    continue;
                }
                Some(value) => self.io.write(&key, value).map(|()| self.stats.writes += 1),
                None => self.io.delete(&key).map(|()| self.stats.deletes += 1),
            };
            match result {
                Ok(()) => {
                    self.dirty.remove(&key);
                    self.backoff.succeeded(&key);
                }
                Err(e) => {
                    pending.failed += 1;
                    self.backoff.failed(&key, now.unwrap_or_else(Instant::now));
                    pending.error.get_or_insert(e);
                }
            }
        }
    }
}

/// What one apply of a driver left undone, for the apply report.
#[derive(Debug, Default)]
pub struct Pending {
    /// The driver (a map's name, or `attachments`).
    pub driver: String,
    /// Items whose kernel operation failed in this apply (now in backoff).
    pub failed: usize,
    /// Items not tried: still in backoff from an earlier failure.
    pub waiting: usize,
    /// Writes held back for security order (an endpoint whose policy is not written yet).
    pub held: usize,
    /// The first error of this apply.
    pub error: Option<KernelError>,
    /// When the earliest item in backoff may be retried.
    pub retry_at: Option<Instant>,
}

impl Pending {
    /// True when nothing is left to do.
    pub fn is_clean(&self) -> bool {
        self.failed == 0 && self.waiting == 0 && self.held == 0 && self.error.is_none()
    }
}

impl std::fmt::Display for Pending {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        write!(
            f,
            "{}: {} failed, {} waiting to retry, {} held",
            self.driver, self.failed, self.waiting, self.held
        )?;
        if let Some(e) = &self.error {
            write!(f, " ({e})")?;
        }
        Ok(())
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::kernel::fake::FakeMap;

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
