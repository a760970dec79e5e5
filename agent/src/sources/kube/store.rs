//! What the watchers have delivered, converted: one store per kind, keyed by (namespace, name)
//! (namespace empty for cluster-scoped kinds). A relist (the watcher's `Init` … `InitDone`, at
//! start and after 410 Gone) is buffered and swapped in whole, so objects deleted while the watch
//! was broken disappear and unchanged ones are no change at all.

use std::collections::BTreeMap;

/// An object's key: (namespace, name); the namespace is empty for Namespaces and Nodes.
pub type Key = (String, String);

/// The objects of one kind.
#[derive(Debug)]
pub struct KindStore<T> {
    live: BTreeMap<Key, T>,
    relist: Option<BTreeMap<Key, T>>,
    synced: bool,
}

impl<T> Default for KindStore<T> {
    fn default() -> Self {
        Self {
            live: BTreeMap::new(),
            relist: None,
            synced: false,
        }
    }
}

impl<T: PartialEq> KindStore<T> {
    /// A (re)list starts.
    pub fn init(&mut self) {
        self.relist = Some(BTreeMap::new());
    }

    /// An object of the list under way.
    pub fn init_apply(&mut self, key: Key, value: T) {
        self.relist
            .get_or_insert_with(BTreeMap::new)
            .insert(key, value);
    }

    /// The list is complete: it replaces what was known. Answers the keys of the objects that
    /// changed, came or went (none for a relist of unchanged objects).
    pub fn init_done(&mut self) -> Vec<Key> {
        self.synced = true;
        let listed = self.relist.take().unwrap_or_default();
        let mut changed: Vec<Key> = listed
            .iter()
            .filter(|(key, value)| self.live.get(*key) != Some(*value))
            .map(|(key, _)| key.clone())
            .collect();
        changed.extend(
            self.live
                .keys()
                .filter(|key| !listed.contains_key(*key))
                .cloned(),
        );
        self.live = listed;
        changed
    }

    /// An object was added or modified. True when its converted form changed.
    pub fn apply(&mut self, key: Key, value: T) -> bool {
        if self.live.get(&key) == Some(&value) {
            return false;
        }
        self.live.insert(key, value);
        true
    }

    /// An object was deleted. True when it was known.
    pub fn delete(&mut self, key: &Key) -> bool {
        self.live.remove(key).is_some()
    }

    /// True once a first list completed.
    #[must_use]
    pub fn synced(&self) -> bool {
        self.synced
    }

    /// The objects.
    #[must_use]
    pub fn live(&self) -> &BTreeMap<Key, T> {
        &self.live
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    fn key(name: &str) -> Key {
        ("ns".to_owned(), name.to_owned())
    }

    #[test]
    fn a_relist_of_the_same_objects_is_no_change_and_drops_the_vanished() {
        let mut s = KindStore::default();
        s.init();
        s.init_apply(key("a"), 1);
        s.init_apply(key("b"), 2);
        assert!(!s.synced());
        assert_eq!(
            s.init_done(),
            [key("a"), key("b")],
            "the first list is a change"
        );
        assert!(s.synced());
        assert!(!s.apply(key("a"), 1), "an unchanged object");
        assert!(s.apply(key("a"), 3));
        s.init();
        s.init_apply(key("a"), 3);
        s.init_apply(key("b"), 2);
        assert_eq!(
            s.init_done(),
            Vec::<Key>::new(),
            "a relist of the same objects changes nothing"
        );
        s.init();
        s.init_apply(key("a"), 4);
        s.init_apply(key("c"), 5);
        assert_eq!(
            s.init_done(),
            [key("a"), key("c"), key("b")],
            "a changed, c came and b was deleted while the watch was broken"
        );
        assert_eq!(
            s.live().keys().cloned().collect::<Vec<_>>(),
            [key("a"), key("c")]
        );
        assert!(s.delete(&key("a")));
        assert!(!s.delete(&key("a")));
    }
}
