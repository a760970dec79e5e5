//! One datastore trait (get, list, compare-and-swap writes with revisions, multi-key transactions) and its
//! backends: memory, embedded (redb), etcd and Kubernetes (CRDs).

use std::{fmt, future::Future};

pub mod any;
pub mod embedded;
pub mod etcd;
pub mod kubernetes;
pub mod memory;
pub mod overlay;
pub mod watch;

pub use any::{AnyStore, Datastore};

/// The kinds of object the IPAM keeps.
#[derive(Clone, Copy, Debug, PartialEq, Eq, Hash, PartialOrd, Ord)]
pub enum Kind {
    /// `IpPool`.
    Pool,
    /// The `IpamConfig` singleton.
    Config,
    /// `Reservation`.
    Reservation,
    /// `Block`.
    Block,
    /// `BlockAffinity`.
    Affinity,
    /// `Handle`.
    Handle,
    /// A cluster-wide security identity (`Identity`, named by its number).
    Identity,
    /// The index from a label set to its identity (`IdentityKey`, named by a hash of the labels).
    IdentityKey,
    /// A node record (`NodeRecord`, named by the node): addresses, labels, heartbeat.
    Node,
    /// An endpoint record (`EndpointRecord`, named `<node>/<namespace>/<pod>`): a pod's addresses and labels.
    Endpoint,
}

impl Kind {
    /// Every kind.
    pub const ALL: [Kind; 10] = [
        Kind::Pool,
        Kind::Config,
        Kind::Reservation,
        Kind::Block,
        Kind::Affinity,
        Kind::Handle,
        Kind::Identity,
        Kind::IdentityKey,
        Kind::Node,
        Kind::Endpoint,
    ];

    /// The kind's path segment in key-value stores.
    pub fn as_str(self) -> &'static str {
        match self {
            Self::Pool => "pools",
            Self::Config => "config",
            Self::Reservation => "reservations",
            Self::Block => "blocks",
            Self::Affinity => "affinities",
            Self::Handle => "handles",
            Self::Identity => "identities",
            Self::IdentityKey => "identitykeys",
            Self::Node => "nodes",
            Self::Endpoint => "endpoints",
        }
    }
}

/// A key: a kind and a name inside it.
#[derive(Clone, Debug, PartialEq, Eq, Hash, PartialOrd, Ord)]
pub struct Key {
    /// The kind.
    pub kind: Kind,
    /// The name.
    pub name: String,
}

impl Key {
    /// A key.
    pub fn new(kind: Kind, name: impl Into<String>) -> Self {
        Self {
            kind,
            name: name.into(),
        }
    }
}

impl fmt::Display for Key {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        write!(f, "{}/{}", self.kind.as_str(), self.name)
    }
}

/// A stored value's revision (etcd mod_revision, Kubernetes resourceVersion, a commit counter in redb).
#[derive(Clone, Copy, Debug, PartialEq, Eq, PartialOrd, Ord, Hash)]
pub struct Revision(pub u64);

/// A stored value and its revision.
#[derive(Clone, Debug, PartialEq, Eq)]
pub struct Versioned {
    /// The serialized object.
    pub value: Vec<u8>,
    /// Its revision.
    pub revision: Revision,
}

/// One operation of a transaction. Every operation is conditional.
#[derive(Clone, Debug, PartialEq, Eq)]
pub enum Op {
    /// Create; fails if the key exists.
    Create {
        /// The key.
        key: Key,
        /// The value.
        value: Vec<u8>,
    },
    /// Replace; fails unless the key exists at `revision`.
    Update {
        /// The key.
        key: Key,
        /// The value.
        value: Vec<u8>,
        /// The revision the caller read.
        revision: Revision,
    },
    /// Delete; fails unless the key exists at `revision`.
    Delete {
        /// The key.
        key: Key,
        /// The revision the caller read.
        revision: Revision,
    },
    /// Write nothing; fails unless the key is at `revision` (`None`: absent).
    Check {
        /// The key.
        key: Key,
        /// The revision the caller read.
        revision: Option<Revision>,
    },
}

impl Op {
    /// The key the operation touches.
    pub fn key(&self) -> &Key {
        match self {
            Op::Create { key, .. }
            | Op::Update { key, .. }
            | Op::Delete { key, .. }
            | Op::Check { key, .. } => key,
        }
    }
}

/// What a read-modify-write callback wants done with each key it read.
#[derive(Clone, Debug, PartialEq, Eq)]
pub enum Write {
    /// Leave the key as it is; the decision rests on its value (a store that can checks it is unchanged).
    Keep,
    /// Leave the key as it is; the decision did not look at it, so nothing needs checking (a store that checks
    /// every key read may still check it). An allocation from a full block, say, never used the handle.
    Unread,
    /// Store a new value.
    Put(Vec<u8>),
    /// Delete the key.
    Delete,
}

/// A datastore failure.
#[derive(Debug, thiserror::Error)]
pub enum StoreError {
    /// A compare-and-swap lost: someone else wrote first. Retry with fresh reads.
    #[error("{key} was changed by someone else (compare-and-swap conflict): retry with fresh data")]
    Conflict {
        /// The key that changed.
        key: String,
    },
    /// The datastore cannot be reached or refused the request.
    #[error("the {backend} datastore at {location} is unavailable: {detail}")]
    Unavailable {
        /// Which backend.
        backend: &'static str,
        /// Where it was looked for.
        location: String,
        /// What went wrong and what to do.
        detail: String,
        /// The underlying error.
        #[source]
        source: Option<Box<dyn std::error::Error + Send + Sync>>,
    },
    /// A stored value could not be decoded.
    #[error(
        "stored object {key} cannot be decoded ({source}): it was written by an incompatible version"
    )]
    Corrupt {
        /// The key.
        key: String,
        /// The decode error.
        #[source]
        source: serde_json::Error,
    },
    /// A store without multi-object transactions (Kubernetes) wrote some keys of a transaction but lost the race
    /// for the rest, and could not finish it.
    #[error(
        "wrote {written} but not {unwritten} (the datastore has no multi-object transactions): run `weir ipam check`, \
         and `weir ipam check --repair` when it reports handle counts that differ from their blocks"
    )]
    Torn {
        /// Keys written.
        written: String,
        /// Keys not written.
        unwritten: String,
    },
    /// A watch asked for changes after a revision the datastore has compacted away.
    #[error(
        "the datastore has compacted the history up to revision {compacted} (asked to watch from {asked}): list again"
    )]
    Compacted {
        /// The revision asked for.
        asked: u64,
        /// The oldest revision still kept.
        compacted: u64,
    },
    /// A fault injected by a test.
    #[error("injected datastore fault ({what})")]
    Injected {
        /// Which fault.
        what: &'static str,
    },
}

impl StoreError {
    /// Whether a retry with fresh reads may succeed.
    pub fn is_conflict(&self) -> bool {
        matches!(self, Self::Conflict { .. })
    }
}

/// How many times a read-modify-write retries a conflict before giving up.
pub const RMW_RETRIES: usize = 100;

/// A datastore with compare-and-swap semantics.
pub trait Store: Send + Sync + 'static {
    /// A short name for messages (`memory`, `embedded`, `etcd`, `kubernetes`).
    fn backend(&self) -> &'static str;

    /// How many operations one [`Store::txn`] may hold and still apply atomically; `None`: transactions are not
    /// atomic over several keys (Kubernetes), so several operations cannot be made one (see [`overlay`]).
    fn atomic_txn_limit(&self) -> Option<usize> {
        Some(usize::MAX)
    }

    /// Reads one key.
    fn get(&self, key: &Key) -> impl Future<Output = Result<Option<Versioned>, StoreError>> + Send;

    /// Lists a kind's keys that start with `prefix`, in name order.
    fn list(
        &self,
        kind: Kind,
        prefix: &str,
    ) -> impl Future<Output = Result<Vec<(String, Versioned)>, StoreError>> + Send;

    /// [`Store::list`], where the answer may lag the newest writes a little (etcd: served by the member without
    /// a consensus round, which under write load waits behind in-flight fsyncs). Only for listings whose use a
    /// later compare-and-swap checks (the allocation hot path's affinity index). The default is [`Store::list`].
    fn list_relaxed(
        &self,
        kind: Kind,
        prefix: &str,
    ) -> impl Future<Output = Result<Vec<(String, Versioned)>, StoreError>> + Send {
        self.list(kind, prefix)
    }

    /// Applies every operation atomically, or none with [`StoreError::Conflict`] naming the first failed check.
    /// Stores without multi-key transactions (Kubernetes) apply them in order, each one compare-and-swap.
    fn txn(&self, ops: Vec<Op>) -> impl Future<Output = Result<(), StoreError>> + Send;

    /// Reads `keys`, lets `f` decide what to write, and writes that atomically, conditional on nothing having
    /// changed since the read; retries conflicts with fresh reads. `f` may run several times. Backends with a
    /// local writer (redb) run it inside one write transaction and group-commit several callers.
    fn read_modify_write<T, F>(
        &self,
        keys: Vec<Key>,
        f: F,
    ) -> impl Future<Output = Result<T, StoreError>> + Send
    where
        T: Send + 'static,
        F: FnMut(&[Option<Vec<u8>>]) -> (Vec<Write>, T) + Send + 'static,
    {
        cas_read_modify_write(self, keys, f)
    }
}

/// The generic read-modify-write loop: read, decide, one conditional transaction, retry on conflict.
pub async fn cas_read_modify_write<S, T, F>(
    store: &S,
    keys: Vec<Key>,
    mut f: F,
) -> Result<T, StoreError>
where
    S: Store + ?Sized,
    F: FnMut(&[Option<Vec<u8>>]) -> (Vec<Write>, T) + Send,
{
    let mut last = None;
    for _ in 0..RMW_RETRIES {
        let mut read = Vec::with_capacity(keys.len());
        for k in &keys {
            read.push(store.get(k).await?);
        }
        let values: Vec<Option<Vec<u8>>> = read
            .iter()
            .map(|v| v.as_ref().map(|v| v.value.clone()))
            .collect();
        let (writes, out) = f(&values);
        let ops = plan_ops(&keys, &read, writes);
        if ops.iter().all(|o| matches!(o, Op::Check { .. })) {
            return Ok(out);
        }
        match store.txn(ops).await {
            Ok(()) => return Ok(out),
            Err(e) if e.is_conflict() => last = Some(e),
            Err(e) => return Err(e),
        }
    }
    Err(last.unwrap_or(StoreError::Conflict {
        key: "read-modify-write".into(),
    }))
}

/// Turns a read and the writes decided on it into conditional operations.
pub fn plan_ops(keys: &[Key], read: &[Option<Versioned>], writes: Vec<Write>) -> Vec<Op> {
    let mut ops = Vec::with_capacity(keys.len());
    for (i, key) in keys.iter().enumerate() {
        let rev = read.get(i).and_then(|r| r.as_ref().map(|v| v.revision));
        let w = writes.get(i).cloned().unwrap_or(Write::Keep);
        let key = key.clone();
        ops.push(match (w, rev) {
            (Write::Keep | Write::Unread, revision) => Op::Check { key, revision },
            (Write::Put(value), None) => Op::Create { key, value },
            (Write::Put(value), Some(revision)) => Op::Update {
                key,
                value,
                revision,
            },
            (Write::Delete, Some(revision)) => Op::Delete { key, revision },
            (Write::Delete, None) => Op::Check {
                key,
                revision: None,
            },
        });
    }
    ops
}
