//! The kernel seam for BPF maps. Drivers talk to a [`MapIo`]; the real one is a pinned aya map, the
//! fake (unit tests) a `BTreeMap`.

use std::{hash::Hash, path::Path};

use aya::{
    Pod,
    maps::{
        HashMap, Map, MapData, MapError,
        lpm_trie::{Key as LpmKey, LpmTrie},
    },
};

/// Errors from the kernel seam.
#[derive(Debug, thiserror::Error)]
pub enum KernelError {
    /// A pinned map could not be opened.
    #[error("cannot open the pinned map {path}: {source}; is the agent's pin root intact?")]
    OpenMap {
        /// The pin.
        path: String,
        /// The cause.
        #[source]
        source: Box<MapError>,
    },
    /// Attaching, updating or unpinning a program link failed.
    #[error("cannot {op} {what}: {source}")]
    Attach {
        /// The operation.
        op: &'static str,
        /// What it was applied to.
        what: String,
        /// The cause.
        #[source]
        source: Box<dyn std::error::Error + Send + Sync>,
    },
    /// A map operation failed.
    #[error("{op} on map {map} failed: {source}")]
    MapOp {
        /// The map's name.
        map: String,
        /// The operation.
        op: &'static str,
        /// The cause.
        #[source]
        source: Box<MapError>,
    },
}

/// One BPF map as drivers see it.
pub trait MapIo<K, V>: Send {
    /// The map's (versioned) name.
    fn name(&self) -> &str;
    /// Every entry the kernel holds.
    fn read_all(&self) -> Result<Vec<(K, V)>, KernelError>;
    /// Creates or replaces an entry.
    fn write(&mut self, key: &K, value: &V) -> Result<(), KernelError>;
    /// Deletes an entry; deleting a missing one is not an error.
    fn delete(&mut self, key: &K) -> Result<(), KernelError>;
}

fn open(path: &Path) -> Result<Map, KernelError> {
    let open_err = |source| KernelError::OpenMap {
        path: path.display().to_string(),
        source: Box::new(source),
    };
    let data = MapData::from_pin(path).map_err(open_err)?;
    Map::from_map_data(data).map_err(open_err)
}

fn is_not_found(e: &MapError) -> bool {
    matches!(e, MapError::KeyNotFound)
        || matches!(e, MapError::SyscallError(s) if s.io_error.raw_os_error() == Some(libc::ENOENT))
}

/// A pinned hash (or LRU hash) map.
pub struct PinnedHash<K, V> {
    name: String,
    map: HashMap<MapData, K, V>,
}

impl<K: Pod, V: Pod> PinnedHash<K, V> {
    /// Opens the map pinned at `path`.
    pub fn open(name: &str, path: &Path) -> Result<Self, KernelError> {
        let map = HashMap::try_from(open(path)?).map_err(|source| KernelError::OpenMap {
            path: path.display().to_string(),
            source: Box::new(source),
        })?;
        Ok(Self {
            name: name.to_owned(),
            map,
        })
    }

    fn op_err(&self, op: &'static str) -> impl Fn(MapError) -> KernelError + '_ {
        move |source| KernelError::MapOp {
            map: self.name.clone(),
            op,
            source: Box::new(source),
        }
    }
}

impl<K: Pod + Send + Eq + Hash, V: Pod + Send> MapIo<K, V> for PinnedHash<K, V> {
    fn name(&self) -> &str {
        &self.name
    }

    fn read_all(&self) -> Result<Vec<(K, V)>, KernelError> {
        self.map
            .iter()
            .collect::<Result<Vec<_>, _>>()
            .map_err(self.op_err("read"))
    }

    fn write(&mut self, key: &K, value: &V) -> Result<(), KernelError> {
        let name = self.name.clone();
        self.map
            .insert(key, value, 0)
            .map_err(|source| KernelError::MapOp {
                map: name,
                op: "write",
                source: Box::new(source),
            })
    }

    fn delete(&mut self, key: &K) -> Result<(), KernelError> {
        match self.map.remove(key) {
            Err(e) if !is_not_found(&e) => Err(KernelError::MapOp {
                map: self.name.clone(),
                op: "delete",
                source: Box::new(e),
            }),
            _ => Ok(()),
        }
    }
}

/// A prefix key of an LPM trie: (prefix length, data).
#[derive(Clone, Copy, Debug, PartialEq, Eq, Hash, PartialOrd, Ord)]
pub struct Prefix<K> {
    /// Prefix length in bits.
    pub len: u32,
    /// The address bytes.
    pub data: K,
}

/// A pinned LPM trie.
pub struct PinnedLpm<K, V> {
    name: String,
    map: LpmTrie<MapData, K, V>,
}

impl<K: Pod, V: Pod> PinnedLpm<K, V> {
    /// Opens the trie pinned at `path`.
    pub fn open(name: &str, path: &Path) -> Result<Self, KernelError> {
        let map = LpmTrie::try_from(open(path)?).map_err(|source| KernelError::OpenMap {
            path: path.display().to_string(),
            source: Box::new(source),
        })?;
        Ok(Self {
            name: name.to_owned(),
            map,
        })
    }
}

impl<K: Pod + Send, V: Pod + Send> MapIo<Prefix<K>, V> for PinnedLpm<K, V> {
    fn name(&self) -> &str {
        &self.name
    }

    fn read_all(&self) -> Result<Vec<(Prefix<K>, V)>, KernelError> {
        let mut out = Vec::new();
        for entry in self.map.iter() {
            let (key, value) = entry.map_err(|source| KernelError::MapOp {
                map: self.name.clone(),
                op: "read",
                source: Box::new(source),
            })?;
            out.push((
                Prefix {
                    len: key.prefix_len(),
                    data: key.data(),
                },
                value,
            ));
        }
        Ok(out)
    }

    fn write(&mut self, key: &Prefix<K>, value: &V) -> Result<(), KernelError> {
        let name = self.name.clone();
        self.map
            .insert(&LpmKey::new(key.len, key.data), value, 0)
            .map_err(|source| KernelError::MapOp {
                map: name,
                op: "write",
                source: Box::new(source),
            })
    }

    fn delete(&mut self, key: &Prefix<K>) -> Result<(), KernelError> {
        match self.map.remove(&LpmKey::new(key.len, key.data)) {
            Err(e) if !is_not_found(&e) => Err(KernelError::MapOp {
                map: self.name.clone(),
                op: "delete",
                source: Box::new(e),
            }),
            _ => Ok(()),
        }
    }
}
