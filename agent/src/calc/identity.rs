//! Security identities: every distinct label set (pod labels plus its namespace and the
//! namespace's labels) and every policy CIDR gets a number, **allocated** (never hashed), persisted
//! in the state directory (`identities.json`) and stable across restarts. Numbers below
//! `maps_schema::identity::FIRST_ALLOCATED` are reserved (host, world, unmanaged).

use std::{
    collections::BTreeMap,
    fs, io,
    path::{Path, PathBuf},
    sync::Arc,
};

use serde::{Deserialize, Serialize};

use crate::calc::identity_store::ClusterIdentities;

/// Errors of the identity store.
#[derive(Debug, thiserror::Error)]
pub enum IdentityError {
    /// Reading or writing failed.
    #[error("cannot {op} the identity store {path}: {source}")]
    Io {
        /// What was being done.
        op: &'static str,
        /// The file.
        path: PathBuf,
        /// The cause.
        #[source]
        source: io::Error,
    },
    /// The file does not parse.
    #[error(
        "the identity store {path} is corrupt ({source}); restore it, or move it aside to renumber every identity (established flows keep working, policy is rebuilt)"
    )]
    Corrupt {
        /// The file.
        path: PathBuf,
        /// The cause.
        #[source]
        source: serde_json::Error,
    },
    /// The numbers ran out.
    #[error("no security identities are left; remove unused label sets and restart")]
    Exhausted,
    /// The cluster-wide allocation through the datastore failed.
    #[error("cannot allocate a cluster-wide security identity: {source}")]
    Cluster {
        /// The cause.
        #[source]
        source: ipam::identity::IdentityError,
    },
    /// The thread asking the datastore panicked.
    #[error(
        "the thread allocating a cluster-wide security identity panicked; see the log above and report it"
    )]
    ClusterPanicked,
}

/// A label set, canonical: sorted `key=value` pairs.
#[derive(Clone, Debug, PartialEq, Eq, PartialOrd, Ord, Hash, Serialize, Deserialize)]
pub struct LabelSet(pub BTreeMap<String, String>);

/// Label key carrying the pod's namespace inside a label set.
pub const NAMESPACE_LABEL: &str = "weir.dev/namespace";
/// Prefix of the namespace's own labels inside a pod's label set.
pub const NAMESPACE_LABELS_PREFIX: &str = "weir.dev/ns-label:";

impl LabelSet {
    /// A pod's identity labels: its labels, its namespace, and the namespace's labels.
    #[must_use]
    pub fn for_pod(
        labels: &BTreeMap<String, String>,
        namespace: &str,
        namespace_labels: &BTreeMap<String, String>,
    ) -> Self {
        let mut set = labels.clone();
        set.insert(NAMESPACE_LABEL.to_owned(), namespace.to_owned());
        for (k, v) in namespace_labels {
            set.insert(format!("{NAMESPACE_LABELS_PREFIX}{k}"), v.clone());
        }
        Self(set)
    }

    /// The identity label set of a policy CIDR.
    #[must_use]
    pub fn for_cidr(cidr: &ipnetwork::IpNetwork) -> Self {
        Self(BTreeMap::from([(
            "weir.dev/cidr".to_owned(),
            cidr.to_string(),
        )]))
    }

    fn canonical(&self) -> String {
        self.0
            .iter()
            .map(|(k, v)| format!("{k}={v}"))
            .collect::<Vec<_>>()
            .join(",")
    }
}

#[derive(Default, Serialize, Deserialize)]
struct File {
    next: u32,
    identities: BTreeMap<String, u32>,
}

/// The allocator, backed by one file, or by the datastore when identities are cluster-wide (the file is
/// then only this node's cache in memory, never written).
pub struct Identities {
    path: PathBuf,
    file: File,
    /// Allocated in memory since the last successful write (`allocate` + `persist`).
    unsaved: bool,
    /// Cluster-wide numbers from the datastore.
    cluster: Option<Arc<ClusterIdentities>>,
}

impl Identities {
    /// Loads the store (absent file: empty).
    pub fn load(path: &Path) -> Result<Self, IdentityError> {
        let file = match fs::read(path) {
            Ok(bytes) => {
                serde_json::from_slice(&bytes).map_err(|source| IdentityError::Corrupt {
                    path: path.to_owned(),
                    source,
                })?
            }
            Err(e) if e.kind() == io::ErrorKind::NotFound => File::default(),
            Err(source) => {
                return Err(IdentityError::Io {
                    op: "read",
                    path: path.to_owned(),
                    source,
                });
            }
        };
        Ok(Self {
            path: path.to_owned(),
            file,
            unsaved: false,
            cluster: None,
        })
    }

    /// Cluster-wide identities: every number comes from `cluster` (the datastore), cached here.
    #[must_use]
    pub fn cluster(cluster: Arc<ClusterIdentities>) -> Self {
        Self {
            path: PathBuf::new(),
            file: File::default(),
            unsaved: false,
            cluster: Some(cluster),
        }
    }

    /// Asks the datastore for `labels`' number and caches it (cluster-wide mode only).
    fn cached_from_cluster(
        &mut self,
        cluster: &ClusterIdentities,
        labels: &LabelSet,
        key: String,
    ) -> Result<u32, IdentityError> {
        let id = cluster.allocate(labels)?;
        self.file.identities.insert(key, id);
        Ok(id)
    }

    /// The identity of `labels`, allocating a new one in memory if needed: a batch of allocations
    /// is written once by `persist`, which must succeed before any of them is used.
    pub fn allocate(&mut self, labels: &LabelSet) -> Result<u32, IdentityError> {
        let key = labels.canonical();
        if let Some(id) = self.file.identities.get(&key) {
            return Ok(*id);
        }
        if let Some(cluster) = self.cluster.clone() {
            return self.cached_from_cluster(&cluster, labels, key);
        }
        let id = self.file.next.max(maps_schema::identity::FIRST_ALLOCATED);
        self.file.next = id.checked_add(1).ok_or(IdentityError::Exhausted)?;
        self.file.identities.insert(key, id);
        self.unsaved = true;
        Ok(id)
    }

    /// Writes the allocations `allocate` made since the last write (nothing to do: no write).
    /// On failure they stay in memory, unsaved, and the next `persist` writes them again.
    pub fn persist_allocated(&mut self) -> Result<(), IdentityError> {
        if self.unsaved {
            self.persist()?;
            self.unsaved = false;
        }
        Ok(())
    }

    /// Number of allocated identities.
    #[must_use]
    pub fn len(&self) -> usize {
        self.file.identities.len()
    }

    /// True when nothing is allocated.
    #[must_use]
    pub fn is_empty(&self) -> bool {
        self.file.identities.is_empty()
    }

    /// The identity of `labels`, allocating (and persisting) a new one if needed.
    pub fn get_or_allocate(&mut self, labels: &LabelSet) -> Result<u32, IdentityError> {
        let key = labels.canonical();
        if let Some(id) = self.file.identities.get(&key) {
            return Ok(*id);
        }
        if let Some(cluster) = self.cluster.clone() {
            return self.cached_from_cluster(&cluster, labels, key);
        }
        let id = self.file.next.max(maps_schema::identity::FIRST_ALLOCATED);
        let next = id.checked_add(1).ok_or(IdentityError::Exhausted)?;
        self.file.identities.insert(key.clone(), id);
        let previous_next = std::mem::replace(&mut self.file.next, next);
        if let Err(e) = self.persist() {
            self.file.identities.remove(&key);
            self.file.next = previous_next;
            return Err(e);
        }
        self.unsaved = false;
        Ok(id)
    }

    /// The identity of `labels` if one was allocated.
    #[must_use]
    pub fn get(&self, labels: &LabelSet) -> Option<u32> {
        self.file.identities.get(&labels.canonical()).copied()
    }

    fn persist(&self) -> Result<(), IdentityError> {
        let bytes = serde_json::to_vec_pretty(&self.file).map_err(|e| IdentityError::Io {
            op: "serialise",
            path: self.path.clone(),
            source: io::Error::other(e),
        })?;
        crate::fsutil::write_state(&self.path, &bytes).map_err(|source| IdentityError::Io {
            op: "write",
            path: self.path.clone(),
            source,
        })
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn identities_are_allocated_stable_and_distinct() {
        let dir = tempfile::tempdir().expect("tmp");
        let path = dir.path().join("identities.json");
        let web = LabelSet::for_pod(
            &BTreeMap::from([("app".into(), "web".into())]),
            "default",
            &BTreeMap::new(),
        );
        let web_other_ns = LabelSet::for_pod(
            &BTreeMap::from([("app".into(), "web".into())]),
            "prod",
            &BTreeMap::new(),
        );
        let mut ids = Identities::load(&path).expect("empty");
        let a = ids.get_or_allocate(&web).expect("web");
        let b = ids.get_or_allocate(&web_other_ns).expect("web prod");
        assert!(a >= maps_schema::identity::FIRST_ALLOCATED);
        assert_ne!(a, b, "the namespace is part of the identity");
        assert_eq!(ids.get_or_allocate(&web).expect("again"), a);
        let mut reloaded = Identities::load(&path).expect("reload");
        assert_eq!(reloaded.get(&web), Some(a), "stable across restarts");
        let c = reloaded
            .get_or_allocate(&LabelSet::for_cidr(&"10.0.0.0/8".parse().expect("cidr")))
            .expect("cidr");
        assert!(c > b, "numbers are never reused");
    }

    #[test]
    fn a_batch_of_allocations_is_written_once_and_survives_a_restart() {
        let dir = tempfile::tempdir().expect("tmp");
        let path = dir.path().join("identities.json");
        let mut ids = Identities::load(&path).expect("empty");
        let nets: Vec<LabelSet> = ["10.0.0.0/8", "10.1.0.0/16"]
            .iter()
            .map(|n| LabelSet::for_cidr(&n.parse().expect("cidr")))
            .collect();
        let a = ids.allocate(&nets[0]).expect("a");
        let b = ids.allocate(&nets[1]).expect("b");
        assert_ne!(a, b);
        assert!(!path.exists(), "allocate alone writes nothing");
        ids.persist_allocated().expect("persist");
        let reloaded = Identities::load(&path).expect("reload");
        assert_eq!(
            (reloaded.get(&nets[0]), reloaded.get(&nets[1])),
            (Some(a), Some(b))
        );
        // Nothing new: no write (a removed file stays removed).
        fs::remove_file(&path).expect("rm");
        ids.persist_allocated().expect("nothing to do");
        assert!(!path.exists());
    }
}
