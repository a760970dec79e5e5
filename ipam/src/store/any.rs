//! Choosing a datastore at run time: `embedded:PATH`, `etcd:URL[,URL…]` or `kubernetes`.

use std::{path::PathBuf, str::FromStr, time::Duration};

use super::{
    Key, Kind, Op, Store, StoreError, Versioned, Write,
    embedded::{EmbeddedStore, Sharing},
    etcd::EtcdStore,
    kubernetes::KubeStore,
    memory::MemoryStore,
};

/// The default datastore: the agent's embedded file.
pub const DEFAULT_DATASTORE: &str = "embedded:/var/lib/weir/ipam.redb";

/// Where the IPAM data lives.
#[derive(Clone, Debug, PartialEq, Eq)]
pub enum Datastore {
    /// A redb file.
    Embedded(PathBuf),
    /// etcd client URLs.
    Etcd(Vec<String>),
    /// The Kubernetes API server of the in-cluster config or the kubeconfig.
    Kubernetes,
}

/// A datastore argument that could not be understood.
#[derive(Debug, thiserror::Error, PartialEq, Eq)]
#[error(
    "datastore {given:?} is not understood: write embedded:PATH, etcd:URL[,URL…] or kubernetes (for example etcd:http://127.0.0.1:2379)"
)]
pub struct DatastoreParseError {
    /// What was given.
    pub given: String,
}

impl FromStr for Datastore {
    type Err = DatastoreParseError;

    fn from_str(s: &str) -> Result<Self, Self::Err> {
        let bad = || DatastoreParseError {
            given: s.to_owned(),
        };
        if s == "kubernetes" {
            return Ok(Self::Kubernetes);
        }
        if let Some(p) = s.strip_prefix("embedded:") {
            if p.trim().is_empty() {
                return Err(bad());
            }
            return Ok(Self::Embedded(PathBuf::from(p)));
        }
        if let Some(urls) = s.strip_prefix("etcd:") {
            let urls: Vec<String> = urls
                .split(',')
                .map(str::trim)
                .filter(|u| !u.is_empty())
                .map(str::to_owned)
                .collect();
            if urls.is_empty()
                || !urls
                    .iter()
                    .all(|u| u.starts_with("http://") || u.starts_with("https://"))
            {
                return Err(bad());
            }
            return Ok(Self::Etcd(urls));
        }
        Err(bad())
    }
}

impl Datastore {
    /// Opens the datastore; an embedded file is shared with other processes ([`Sharing::Shared`]), and one held
    /// exclusively elsewhere is waited for up to `wait`.
    pub async fn open(&self, wait: Duration) -> Result<AnyStore, StoreError> {
        self.open_with(wait, Sharing::Shared).await
    }

    /// Opens the datastore; an embedded file is opened as `sharing` says, and waited for up to `wait` while
    /// another process holds it in a way that excludes this one.
    pub async fn open_with(
        &self,
        wait: Duration,
        sharing: Sharing,
    ) -> Result<AnyStore, StoreError> {
        match self {
            Self::Embedded(p) => {
                let p = p.clone();
                let store = tokio::task::spawn_blocking(move || {
                    EmbeddedStore::open_with(&p, wait, sharing)
                })
                .await
                .map_err(|e| StoreError::Unavailable {
                    backend: "embedded",
                    location: self.to_string(),
                    detail: "the open was interrupted".into(),
                    source: Some(Box::new(e)),
                })??;
                Ok(AnyStore::Embedded(store))
            }
            Self::Etcd(urls) => Ok(AnyStore::Etcd(EtcdStore::connect(urls).await?)),
            Self::Kubernetes => Ok(AnyStore::Kubernetes(KubeStore::connect().await?)),
        }
    }
}

impl std::fmt::Display for Datastore {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        match self {
            Self::Embedded(p) => write!(f, "{}", p.display()),
            Self::Etcd(urls) => write!(f, "etcd:{}", urls.join(",")),
            Self::Kubernetes => f.write_str("kubernetes"),
        }
    }
}

/// Any backend, chosen at run time.
#[derive(Clone, Debug)]
pub enum AnyStore {
    /// In memory.
    Memory(MemoryStore),
    /// redb.
    Embedded(EmbeddedStore),
    /// etcd.
    Etcd(EtcdStore),
    /// Kubernetes custom resources.
    Kubernetes(KubeStore),
}

impl AnyStore {
    /// The embedded store's health (a fault while its writes fail); `None` for the other backends, whose
    /// outages are their server's (each request reports them).
    pub fn health(&self) -> Option<super::embedded::StoreHealth> {
        match self {
            Self::Embedded(s) => Some(s.health()),
            Self::Memory(_) | Self::Etcd(_) | Self::Kubernetes(_) => None,
        }
    }
}

impl Store for AnyStore {
    fn backend(&self) -> &'static str {
        match self {
            Self::Memory(s) => s.backend(),
            Self::Embedded(s) => s.backend(),
            Self::Etcd(s) => s.backend(),
            Self::Kubernetes(s) => s.backend(),
        }
    }

    fn atomic_txn_limit(&self) -> Option<usize> {
        match self {
            Self::Memory(s) => s.atomic_txn_limit(),
            Self::Embedded(s) => s.atomic_txn_limit(),
            Self::Etcd(s) => s.atomic_txn_limit(),
            Self::Kubernetes(s) => s.atomic_txn_limit(),
        }
    }

    async fn get(&self, key: &Key) -> Result<Option<Versioned>, StoreError> {
        match self {
            Self::Memory(s) => s.get(key).await,
            Self::Embedded(s) => s.get(key).await,
            Self::Etcd(s) => s.get(key).await,
            Self::Kubernetes(s) => s.get(key).await,
        }
    }

    async fn list(&self, kind: Kind, prefix: &str) -> Result<Vec<(String, Versioned)>, StoreError> {
        match self {
            Self::Memory(s) => s.list(kind, prefix).await,
            Self::Embedded(s) => s.list(kind, prefix).await,
            Self::Etcd(s) => s.list(kind, prefix).await,
            Self::Kubernetes(s) => s.list(kind, prefix).await,
        }
    }

    async fn list_relaxed(
        &self,
        kind: Kind,
        prefix: &str,
    ) -> Result<Vec<(String, Versioned)>, StoreError> {
        match self {
            Self::Memory(s) => s.list_relaxed(kind, prefix).await,
            Self::Embedded(s) => s.list_relaxed(kind, prefix).await,
            Self::Etcd(s) => s.list_relaxed(kind, prefix).await,
            Self::Kubernetes(s) => s.list_relaxed(kind, prefix).await,
        }
    }

    async fn txn(&self, ops: Vec<Op>) -> Result<(), StoreError> {
        match self {
            Self::Memory(s) => s.txn(ops).await,
            Self::Embedded(s) => s.txn(ops).await,
            Self::Etcd(s) => s.txn(ops).await,
            Self::Kubernetes(s) => s.txn(ops).await,
        }
    }

    async fn read_modify_write<T, F>(&self, keys: Vec<Key>, f: F) -> Result<T, StoreError>
    where
        T: Send + 'static,
        F: FnMut(&[Option<Vec<u8>>]) -> (Vec<Write>, T) + Send + 'static,
    {
        match self {
            Self::Memory(s) => s.read_modify_write(keys, f).await,
            Self::Embedded(s) => s.read_modify_write(keys, f).await,
            Self::Etcd(s) => s.read_modify_write(keys, f).await,
            Self::Kubernetes(s) => s.read_modify_write(keys, f).await,
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn datastore_arguments_parse() {
        assert_eq!(
            "embedded:/tmp/x.redb".parse(),
            Ok(Datastore::Embedded("/tmp/x.redb".into()))
        );
        assert_eq!(
            "etcd:http://a:1,http://b:2".parse(),
            Ok(Datastore::Etcd(vec![
                "http://a:1".into(),
                "http://b:2".into()
            ]))
        );
        assert_eq!("kubernetes".parse(), Ok(Datastore::Kubernetes));
        for bad in [
            "",
            "embedded:",
            "etcd:",
            "etcd:a:1",
            "consul:x",
            "kubernetes:x",
        ] {
            assert!(bad.parse::<Datastore>().is_err(), "{bad}");
        }
    }
}
