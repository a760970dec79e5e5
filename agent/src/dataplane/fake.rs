//! In-memory fake of the kernel seam, for unit tests only.

use std::{
    collections::BTreeMap,
    sync::{Arc, Mutex},
};

use aya::maps::MapError;

use super::kernel::{KernelError, MapIo};

#[derive(Default)]
struct Inner<K, V> {
    entries: BTreeMap<K, V>,
    mutations: u64,
    fail_writes: u32,
}

/// A fake map; clones share contents, so a test can inspect what a driver wrote.
pub(crate) struct FakeMap<K, V> {
    name: String,
    inner: Arc<Mutex<Inner<K, V>>>,
}

impl<K, V> Clone for FakeMap<K, V> {
    fn clone(&self) -> Self {
        Self {
            name: self.name.clone(),
            inner: Arc::clone(&self.inner),
        }
    }
}

impl<K: Ord + Clone, V: Clone> FakeMap<K, V> {
    pub(crate) fn new(name: &str) -> Self {
        Self {
            name: name.to_owned(),
            inner: Arc::new(Mutex::new(Inner {
                entries: BTreeMap::new(),
                mutations: 0,
                fail_writes: 0,
            })),
        }
    }

    fn lock(&self) -> std::sync::MutexGuard<'_, Inner<K, V>> {
        self.inner
            .lock()
            .unwrap_or_else(std::sync::PoisonError::into_inner)
    }

    /// Contents as if an earlier run had written them (not counted as mutations).
    pub(crate) fn preload(&self, entries: &[(K, V)]) {
        self.lock().entries.extend(entries.iter().cloned());
    }

    pub(crate) fn contents(&self) -> Vec<(K, V)> {
        self.lock()
            .entries
            .iter()
            .map(|(k, v)| (k.clone(), v.clone()))
            .collect()
    }

    pub(crate) fn mutations(&self) -> u64 {
        self.lock().mutations
    }

    pub(crate) fn fail_next_writes(&self, n: u32) {
        self.lock().fail_writes = n;
    }
}

impl<K: Ord + Clone + Send, V: Clone + Send> MapIo<K, V> for FakeMap<K, V> {
    fn name(&self) -> &str {
        &self.name
    }

    fn read_all(&self) -> Result<Vec<(K, V)>, KernelError> {
        Ok(self.contents())
    }

    fn write(&mut self, key: &K, value: &V) -> Result<(), KernelError> {
        let mut inner = self.lock();
        if inner.fail_writes > 0 {
            inner.fail_writes -= 1;
            return Err(KernelError::MapOp {
                map: self.name.clone(),
                op: "write",
                source: Box::new(MapError::KeyNotFound),
            });
        }
        inner.entries.insert(key.clone(), value.clone());
        inner.mutations += 1;
        Ok(())
    }

    fn delete(&mut self, key: &K) -> Result<(), KernelError> {
        let mut inner = self.lock();
        if inner.entries.remove(key).is_some() {
            inner.mutations += 1;
        }
        Ok(())
    }
}
