//! The in-memory store for tests, with injectable conflicts and crashes.

use std::{
    collections::BTreeMap,
    sync::{Arc, Mutex, MutexGuard},
};

use super::{Key, Kind, Op, Revision, Store, StoreError, Versioned};

/// Faults to inject into writes, as per-mille probabilities.
#[derive(Clone, Copy, Debug, Default)]
pub struct Faults {
    /// A transaction reports a conflict without applying (a racing writer won).
    pub conflict_per_mille: u32,
    /// A transaction fails before applying (the process died before the write).
    pub fail_before_per_mille: u32,
    /// A transaction applies, then reports failure (the process died after the write).
    pub fail_after_per_mille: u32,
}

#[derive(Debug, Default)]
struct Inner {
    data: BTreeMap<Key, Versioned>,
    revision: u64,
    faults: Faults,
    rng: u64,
    writes: u64,
}

impl Inner {
    fn roll(&mut self, per_mille: u32) -> bool {
        if per_mille == 0 {
            return false;
        }
        // xorshift64*
        self.rng ^= self.rng >> 12;
        self.rng ^= self.rng << 25;
        self.rng ^= self.rng >> 27;
        let r = self.rng.wrapping_mul(0x2545_f491_4f6c_dd1d);
        (r % 1000) < u64::from(per_mille)
    }
}

/// A store held in memory. Clones share the data.
#[derive(Clone, Debug, Default)]
pub struct MemoryStore {
    inner: Arc<Mutex<Inner>>,
}

impl MemoryStore {
    /// An empty store.
    pub fn new() -> Self {
        Self::default()
    }

    fn lock(&self) -> MutexGuard<'_, Inner> {
        self.inner
            .lock()
            .unwrap_or_else(std::sync::PoisonError::into_inner)
    }

    /// Injects faults into later writes, drawn from `seed`.
    pub fn set_faults(&self, faults: Faults, seed: u64) {
        let mut g = self.lock();
        g.faults = faults;
        g.rng = seed | 1;
    }

    /// How many transactions were applied.
    pub fn writes(&self) -> u64 {
        self.lock().writes
    }

    /// Writes `value` at `key` unconditionally (test setup of hand-made objects).
    pub fn force_put(&self, key: Key, value: Vec<u8>) {
        let mut g = self.lock();
        g.revision += 1;
        let revision = Revision(g.revision);
        g.data.insert(key, Versioned { value, revision });
    }
}

fn check(data: &BTreeMap<Key, Versioned>, op: &Op) -> bool {
    let cur = data.get(op.key()).map(|v| v.revision);
    match op {
        Op::Create { .. } => cur.is_none(),
        Op::Update { revision, .. } | Op::Delete { revision, .. } => cur == Some(*revision),
        Op::Check { revision, .. } => cur == *revision,
    }
}

impl Store for MemoryStore {
    fn backend(&self) -> &'static str {
        "memory"
    }

    async fn get(&self, key: &Key) -> Result<Option<Versioned>, StoreError> {
        Ok(self.lock().data.get(key).cloned())
    }

    async fn list(&self, kind: Kind, prefix: &str) -> Result<Vec<(String, Versioned)>, StoreError> {
        let g = self.lock();
        let start = Key::new(kind, prefix);
        Ok(g.data
            .range(start..)
            .take_while(|(k, _)| k.kind == kind && k.name.starts_with(prefix))
            .map(|(k, v)| (k.name.clone(), v.clone()))
            .collect())
    }

    async fn txn(&self, ops: Vec<Op>) -> Result<(), StoreError> {
        let mut g = self.lock();
        let faults = g.faults;
        if g.roll(faults.conflict_per_mille) {
            let key = ops.first().map(|o| o.key().to_string()).unwrap_or_default();
            return Err(StoreError::Conflict { key });
        }
        if g.roll(faults.fail_before_per_mille) {
            return Err(StoreError::Injected {
                what: "crash before write",
            });
        }
        if let Some(bad) = ops.iter().find(|op| !check(&g.data, op)) {
            return Err(StoreError::Conflict {
                key: bad.key().to_string(),
            });
        }
        g.writes += 1;
        for op in ops {
            match op {
                Op::Create { key, value } | Op::Update { key, value, .. } => {
                    g.revision += 1;
                    let revision = Revision(g.revision);
                    g.data.insert(key, Versioned { value, revision });
                }
                Op::Delete { key, .. } => {
                    g.data.remove(&key);
                }
                Op::Check { .. } => {}
            }
        }
        if g.roll(faults.fail_after_per_mille) {
            return Err(StoreError::Injected {
                what: "crash after write",
            });
        }
        Ok(())
    }
}
