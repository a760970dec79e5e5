//! A write-back overlay over another store, so that several IPAM operations become one durable transaction.
//!
//! Operations run against the overlay exactly as against a store: each key is read from the base once and then
//! served from the overlay, and writes stay in memory. [`Overlay::commit`] then writes everything in one
//! conditional transaction on the base: every key an operation's compare-and-swap relied on (read by a
//! read-modify-write, or named by a transaction) must still be at the revision the overlay first read, and every
//! written key is created, updated or deleted on that condition. So the operations take effect together or not
//! at all, and nothing reaches the base before the commit: dropping an overlay, or [rolling back](Overlay::rollback)
//! to a [`Mark`], leaves no trace. Plain reads (`get`, `list`) are not conditions, as they are not on the base.
//!
//! Only for stores whose transactions are atomic over several keys ([`Store::atomic_txn_limit`]).

use std::{
    collections::{BTreeMap, BTreeSet},
    sync::{Arc, Mutex, MutexGuard},
};

use super::{Key, Kind, Op, Revision, Store, StoreError, Versioned, Write};

/// Revisions of values written in the overlay start here, far above any base revision, so a compare-and-swap
/// inside the overlay never mistakes a base revision for an overlay one.
const OVERLAY_REVISIONS: u64 = 1 << 62;

#[derive(Debug)]
enum Undo {
    /// A write replaced `key`'s overlay entry (`None`: it had none).
    Written {
        key: Key,
        before: Option<Option<Versioned>>,
    },
    /// `key` became a condition of the commit.
    Relied { key: Key },
}

#[derive(Debug, Default)]
struct State {
    /// Base values as first read (`None`: absent in the base).
    base: BTreeMap<Key, Option<Versioned>>,
    /// Keys whose base revision a write decided on: conditions of the commit.
    relied: BTreeSet<Key>,
    /// Written keys: their value in the overlay (`None`: deleted).
    written: BTreeMap<Key, Option<Versioned>>,
    next_revision: u64,
    undo: Vec<Undo>,
}

impl State {
    /// The overlay's value of a key already read or written; `None` when the base must be read first.
    fn view(&self, key: &Key) -> Option<Option<Versioned>> {
        self.written
            .get(key)
            .or_else(|| self.base.get(key))
            .cloned()
    }

    fn rely(&mut self, key: &Key) {
        if self.relied.insert(key.clone()) {
            self.undo.push(Undo::Relied { key: key.clone() });
        }
    }

    fn write(&mut self, key: &Key, value: Option<Vec<u8>>) {
        let value = value.map(|value| {
            self.next_revision += 1;
            Versioned {
                value,
                revision: Revision(OVERLAY_REVISIONS + self.next_revision),
            }
        });
        let before = self.written.insert(key.clone(), value);
        self.undo.push(Undo::Written {
            key: key.clone(),
            before,
        });
    }
}

/// A point to roll an overlay back to ([`Overlay::mark`]).
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub struct Mark(usize);

/// A write-back overlay over `S`. Clones share the overlay.
#[derive(Clone, Debug)]
pub struct Overlay<S> {
    base: S,
    state: Arc<Mutex<State>>,
}

impl<S: Store + Clone> Overlay<S> {
    /// An empty overlay over `base`.
    pub fn new(base: S) -> Self {
        Self {
            base,
            state: Arc::default(),
        }
    }

    fn lock(&self) -> MutexGuard<'_, State> {
        self.state
            .lock()
            .unwrap_or_else(std::sync::PoisonError::into_inner)
    }

    /// The base store.
    pub fn base(&self) -> &S {
        &self.base
    }

    /// The current point, to [roll back](Self::rollback) to.
    pub fn mark(&self) -> Mark {
        Mark(self.lock().undo.len())
    }

    /// Forgets every write and condition made since `mark` (base reads stay cached: they are still what the
    /// base said).
    pub fn rollback(&self, mark: Mark) {
        let mut s = self.lock();
        while s.undo.len() > mark.0 {
            match s.undo.pop() {
                Some(Undo::Written { key, before: None }) => {
                    s.written.remove(&key);
                }
                Some(Undo::Written {
                    key,
                    before: Some(v),
                }) => {
                    s.written.insert(key, v);
                }
                Some(Undo::Relied { key }) => {
                    s.relied.remove(&key);
                }
                None => break,
            }
        }
    }

    /// How many operations [`Self::commit`] would send.
    pub fn op_count(&self) -> usize {
        let s = self.lock();
        s.relied.union(&s.written.keys().cloned().collect()).count()
    }

    /// How many keys the overlay has written.
    pub fn writes(&self) -> usize {
        self.lock().written.len()
    }

    /// The commit's operations: a conditional write per written key, a check per other relied-on key.
    fn ops(&self) -> Vec<Op> {
        let s = self.lock();
        let keys: BTreeSet<&Key> = s.relied.iter().chain(s.written.keys()).collect();
        let mut ops = Vec::with_capacity(keys.len());
        for key in keys {
            let base = s.base.get(key).and_then(|v| v.as_ref().map(|v| v.revision));
            let key = key.clone();
            ops.push(match (s.written.get(&key), base) {
                (None | Some(None), None) => Op::Check {
                    key,
                    revision: None,
                },
                (None, revision @ Some(_)) => Op::Check { key, revision },
                (Some(Some(v)), None) => Op::Create {
                    key,
                    value: v.value.clone(),
                },
                (Some(Some(v)), Some(revision)) => Op::Update {
                    key,
                    value: v.value.clone(),
                    revision,
                },
                (Some(None), Some(revision)) => Op::Delete { key, revision },
            });
        }
        ops
    }

    /// Writes everything in one conditional transaction on the base. [`StoreError::Conflict`]: someone else
    /// changed a key the operations decided on; nothing was written, run them again on a fresh overlay.
    pub async fn commit(&self) -> Result<(), StoreError> {
        let ops = self.ops();
        if ops.iter().all(|o| matches!(o, Op::Check { .. })) {
            return Ok(());
        }
        self.base.txn(ops).await
    }

    /// The overlay's value of `key`, reading the base the first time.
    async fn view(&self, key: &Key) -> Result<Option<Versioned>, StoreError> {
        if let Some(v) = self.lock().view(key) {
            return Ok(v);
        }
        let read = self.base.get(key).await?;
        Ok(self.lock().base.entry(key.clone()).or_insert(read).clone())
    }
}

fn holds(op: &Op, current: Option<Revision>) -> bool {
    match op {
        Op::Create { .. } => current.is_none(),
        Op::Update { revision, .. } | Op::Delete { revision, .. } => current == Some(*revision),
        Op::Check { revision, .. } => current == *revision,
    }
}

impl<S: Store + Clone> Store for Overlay<S> {
    fn backend(&self) -> &'static str {
        self.base.backend()
    }

    fn atomic_txn_limit(&self) -> Option<usize> {
        // Operations on an overlay become one transaction on the base only at the commit.
        None
    }

    async fn get(&self, key: &Key) -> Result<Option<Versioned>, StoreError> {
        self.view(key).await
    }

    async fn list(&self, kind: Kind, prefix: &str) -> Result<Vec<(String, Versioned)>, StoreError> {
        let listed = self.base.list(kind, prefix).await?;
        let s = self.lock();
        let mut out: BTreeMap<String, Versioned> = BTreeMap::new();
        for (name, v) in listed {
            let key = Key::new(kind, name.clone());
            match s.view(&key) {
                Some(Some(seen)) => {
                    out.insert(name, seen);
                }
                Some(None) => {}
                None => {
                    out.insert(name, v);
                }
            }
        }
        for (key, v) in s
            .written
            .range(Key::new(kind, prefix)..)
            .take_while(|(k, _)| k.kind == kind && k.name.starts_with(prefix))
        {
            match v {
                Some(v) => {
                    out.insert(key.name.clone(), v.clone());
                }
                None => {
                    out.remove(&key.name);
                }
            }
        }
        Ok(out.into_iter().collect())
    }

    async fn txn(&self, ops: Vec<Op>) -> Result<(), StoreError> {
        for op in &ops {
            self.view(op.key()).await?;
        }
        let mut s = self.lock();
        for op in &ops {
            let current = s.view(op.key()).flatten().map(|v| v.revision);
            if !holds(op, current) {
                return Err(StoreError::Conflict {
                    key: op.key().to_string(),
                });
            }
        }
        for op in ops {
            s.rely(op.key());
            match op {
                Op::Create { key, value } | Op::Update { key, value, .. } => {
                    s.write(&key, Some(value));
                }
                Op::Delete { key, .. } => s.write(&key, None),
                Op::Check { .. } => {}
            }
        }
        Ok(())
    }

    async fn read_modify_write<T, F>(&self, keys: Vec<Key>, mut f: F) -> Result<T, StoreError>
    where
        T: Send + 'static,
        F: FnMut(&[Option<Vec<u8>>]) -> (Vec<Write>, T) + Send + 'static,
    {
        let mut values = Vec::with_capacity(keys.len());
        for k in &keys {
            values.push(self.view(k).await?.map(|v| v.value));
        }
        let (writes, out) = f(&values);
        let mut s = self.lock();
        for (i, key) in keys.iter().enumerate() {
            s.rely(key);
            match writes.get(i) {
                Some(Write::Put(v)) => s.write(key, Some(v.clone())),
                Some(Write::Delete) if values[i].is_some() => s.write(key, None),
                _ => {}
            }
        }
        Ok(out)
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::store::memory::MemoryStore;

    fn key(name: &str) -> Key {
        Key::new(Kind::Block, name)
    }

    async fn put(s: &impl Store, name: &str, value: &[u8]) {
        let v = value.to_vec();
        s.read_modify_write(vec![key(name)], move |_| (vec![Write::Put(v.clone())], ()))
            .await
            .expect("put");
    }

    async fn value(s: &impl Store, name: &str) -> Option<Vec<u8>> {
        s.get(&key(name)).await.expect("get").map(|v| v.value)
    }

    #[tokio::test]
    async fn writes_reach_the_base_only_at_the_commit_and_all_at_once() {
        let base = MemoryStore::new();
        put(&base, "a", b"a0").await;
        let o = Overlay::new(base.clone());
        put(&o, "a", b"a1").await;
        put(&o, "b", b"b1").await;
        assert_eq!(value(&o, "a").await.as_deref(), Some(&b"a1"[..]));
        assert_eq!(value(&base, "a").await.as_deref(), Some(&b"a0"[..]));
        assert_eq!(value(&base, "b").await, None);
        let writes = base.writes();
        o.commit().await.expect("commit");
        assert_eq!(base.writes(), writes + 1, "one transaction");
        assert_eq!(value(&base, "a").await.as_deref(), Some(&b"a1"[..]));
        assert_eq!(value(&base, "b").await.as_deref(), Some(&b"b1"[..]));
    }

    #[tokio::test]
    async fn a_key_changed_in_the_base_meanwhile_fails_the_whole_commit() {
        let base = MemoryStore::new();
        put(&base, "a", b"a0").await;
        let o = Overlay::new(base.clone());
        put(&o, "b", b"b1").await;
        // Read "a" in a read-modify-write (a condition) without writing it.
        o.read_modify_write(vec![key("a")], |_| (vec![Write::Keep], ()))
            .await
            .expect("read");
        put(&base, "a", b"a-other").await;
        let e = o.commit().await.expect_err("conflict");
        assert!(e.is_conflict(), "{e}");
        assert_eq!(value(&base, "b").await, None, "nothing written");
    }

    #[tokio::test]
    async fn rollback_forgets_writes_and_conditions_since_the_mark() {
        let base = MemoryStore::new();
        put(&base, "a", b"a0").await;
        let o = Overlay::new(base.clone());
        put(&o, "a", b"a1").await;
        let mark = o.mark();
        put(&o, "a", b"a2").await;
        put(&o, "c", b"c2").await;
        o.txn(vec![Op::Delete {
            key: key("a"),
            revision: o.get(&key("a")).await.expect("get").expect("a").revision,
        }])
        .await
        .expect("delete");
        assert_eq!(value(&o, "a").await, None);
        o.rollback(mark);
        assert_eq!(value(&o, "a").await.as_deref(), Some(&b"a1"[..]));
        assert_eq!(value(&o, "c").await, None);
        assert_eq!(o.op_count(), 1);
        o.commit().await.expect("commit");
        assert_eq!(value(&base, "a").await.as_deref(), Some(&b"a1"[..]));
        assert_eq!(value(&base, "c").await, None);
    }

    #[tokio::test]
    async fn compare_and_swap_holds_inside_the_overlay() {
        let base = MemoryStore::new();
        let o = Overlay::new(base.clone());
        let create = |v: &[u8]| Op::Create {
            key: key("x"),
            value: v.to_vec(),
        };
        o.txn(vec![create(b"1")]).await.expect("first create");
        let e = o.txn(vec![create(b"2")]).await.expect_err("exists");
        assert!(e.is_conflict());
        let stale = Op::Update {
            key: key("x"),
            value: b"3".to_vec(),
            revision: Revision(1),
        };
        assert!(o.txn(vec![stale]).await.expect_err("stale").is_conflict());
        let listed = o.list(Kind::Block, "").await.expect("list");
        assert_eq!(listed.len(), 1);
        assert_eq!(listed[0].1.value, b"1");
        o.commit().await.expect("commit");
        assert_eq!(value(&base, "x").await.as_deref(), Some(&b"1"[..]));
    }
}
