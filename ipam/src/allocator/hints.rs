//! The blocks each host was last seen to own, so an allocation tries them without listing the
//! host's affinities first (one datastore read fewer per allocation). A hint is only ever a guess:
//! every take checks the block's affinity in its own write, and an allocation the hinted blocks
//! cannot serve lists the affinities afresh before it claims anything, so a stale hint costs a
//! round, never a duplicate or a leaked block. Releasing an affinity forgets the host's hint.

use std::{
    collections::BTreeMap,
    sync::{Arc, Mutex, PoisonError},
};

use ipnetwork::IpNetwork;

/// Per host, the blocks confirmed affine to it when last listed or claimed; shared by clones.
#[derive(Clone, Debug, Default)]
pub(crate) struct Hints(Arc<Mutex<BTreeMap<String, Vec<IpNetwork>>>>);

impl Hints {
    pub(crate) fn get(&self, host: &str) -> Option<Vec<IpNetwork>> {
        self.0
            .lock()
            .unwrap_or_else(PoisonError::into_inner)
            .get(host)
            .cloned()
    }

    pub(crate) fn set(&self, host: &str, blocks: Vec<IpNetwork>) {
        self.0
            .lock()
            .unwrap_or_else(PoisonError::into_inner)
            .insert(host.to_owned(), blocks);
    }

    pub(crate) fn forget(&self, host: &str) {
        self.0
            .lock()
            .unwrap_or_else(PoisonError::into_inner)
            .remove(host);
    }
}
