//! Following a store's changes: a consistent listing of some kinds at one revision ([`WatchStore::list_at`]),
//! then the changes made after it ([`WatchStore::watch`]). etcd watches; the other backends have no watch
//! (`Ok(None)`), so a follower lists again on a timer.

use std::{collections::BTreeMap, future::Future};

use tokio::sync::mpsc;

use super::{Kind, Revision, Store, StoreError, Versioned};

/// Every row of some kinds, read at one revision.
#[derive(Clone, Debug, Default, PartialEq, Eq)]
pub struct Listing {
    /// Per kind: its rows, in name order.
    pub rows: BTreeMap<Kind, Vec<(String, Versioned)>>,
    /// The revision of the read (`None`: the store has no revision to watch from).
    pub revision: Option<Revision>,
}

/// One key's change.
#[derive(Clone, Debug, PartialEq, Eq)]
pub struct Change {
    /// The key's kind.
    pub kind: Kind,
    /// The key's name.
    pub name: String,
    /// The new value (`None`: deleted).
    pub value: Option<Vec<u8>>,
    /// The revision of the change.
    pub revision: Revision,
}

/// The changes after a listing, in revision order, one batch per watch response. The stream ends with an
/// error when the watch breaks ([`StoreError::Compacted`]: the revision asked for is gone, list again).
pub type Changes = mpsc::Receiver<Result<Vec<Change>, StoreError>>;

/// A store whose changes can be followed.
pub trait WatchStore: Store {
    /// Every row of `kinds` at one revision. The default lists each kind on its own, without a revision.
    fn list_at(
        &self,
        kinds: Vec<Kind>,
    ) -> impl Future<Output = Result<Listing, StoreError>> + Send {
        async move {
            let mut rows = BTreeMap::new();
            for kind in kinds {
                rows.insert(kind, self.list(kind, "").await?);
            }
            Ok(Listing {
                rows,
                revision: None,
            })
        }
    }

    /// The changes to `kinds` after revision `after`; `None`: this store cannot watch (list again instead).
    fn watch(
        &self,
        kinds: Vec<Kind>,
        after: Revision,
    ) -> impl Future<Output = Result<Option<Changes>, StoreError>> + Send {
        let _ = (kinds, after);
        async { Ok(None) }
    }
}

impl WatchStore for super::memory::MemoryStore {}
impl WatchStore for super::embedded::EmbeddedStore {}
impl WatchStore for super::kubernetes::KubeStore {}

impl WatchStore for super::AnyStore {
    async fn list_at(&self, kinds: Vec<Kind>) -> Result<Listing, StoreError> {
        match self {
            Self::Memory(s) => s.list_at(kinds).await,
            Self::Embedded(s) => s.list_at(kinds).await,
            Self::Etcd(s) => s.list_at(kinds).await,
            Self::Kubernetes(s) => s.list_at(kinds).await,
        }
    }

    async fn watch(
        &self,
        kinds: Vec<Kind>,
        after: Revision,
    ) -> Result<Option<Changes>, StoreError> {
        match self {
            Self::Memory(s) => s.watch(kinds, after).await,
            Self::Embedded(s) => s.watch(kinds, after).await,
            Self::Etcd(s) => s.watch(kinds, after).await,
            Self::Kubernetes(s) => s.watch(kinds, after).await,
        }
    }
}
