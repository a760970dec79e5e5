//! A slab: values under small integer ids that stay valid until removed; a removed id is reused.

/// Values by id.
pub(super) struct Slab<T> {
    items: Vec<Option<T>>,
    free: Vec<usize>,
}

impl<T> Slab<T> {
    pub(super) fn new() -> Self {
        Self {
            items: Vec::new(),
            free: Vec::new(),
        }
    }

    pub(super) fn insert(&mut self, value: T) -> usize {
        if let Some(id) = self.free.pop() {
            self.items[id] = Some(value);
            id
        } else {
            self.items.push(Some(value));
            self.items.len() - 1
        }
    }

    pub(super) fn remove(&mut self, id: usize) -> Option<T> {
        let value = self.items.get_mut(id)?.take();
        if value.is_some() {
            self.free.push(id);
        }
        value
    }

    pub(super) fn get(&self, id: usize) -> Option<&T> {
        self.items.get(id)?.as_ref()
    }

    pub(super) fn get_mut(&mut self, id: usize) -> Option<&mut T> {
        self.items.get_mut(id)?.as_mut()
    }

    pub(super) fn iter(&self) -> impl Iterator<Item = (usize, &T)> {
        self.items
            .iter()
            .enumerate()
            .filter_map(|(id, v)| v.as_ref().map(|v| (id, v)))
    }

    pub(super) fn len(&self) -> usize {
        self.items.len() - self.free.len()
    }
}

#[cfg(test)]
mod tests {
    use super::Slab;

    #[test]
    fn removed_ids_are_reused_and_others_stay() {
        let mut slab = Slab::new();
        let (a, b) = (slab.insert("a"), slab.insert("b"));
        assert_eq!(slab.remove(a), Some("a"));
        assert_eq!(slab.remove(a), None, "a second remove is nothing");
        let c = slab.insert("c");
        assert_eq!(c, a, "the freed id is reused");
        assert_eq!(slab.get(b), Some(&"b"));
        assert_eq!(slab.len(), 2);
        assert_eq!(slab.iter().count(), 2);
    }
}
