//! The one kernel seam: every kernel operation a driver or upkeep task does goes through one of
//! these traits, whose real implementations are thin (aya, netlink, bpffs, `bpf()` batches) and
//! whose one fake (`fake::FakeKernel`, unit tests) implements them all.
//!
//! - [`MapIo`]: one BPF map (hash, LRU hash, LPM trie): read back, write, delete.
//! - [`Attacher`]: the endpoint programs on workload links (`tc_links::TcLinks`).
//! - [`XdpIo`]: the XDP prefilter on named interfaces (`prefilter::PinnedXdp`).
//! - [`CtIo`]: the conntrack maps of one layout and the programs' created-entries counter
//!   (`conntrack::PinnedCt`: batch lookups and deletes).
//! - [`CountersIo`]: the per-CPU verdict counters (`counters::PinnedCounters`).
//! - [`SysctlIo`]: `/proc/sys` (`node_setup::ProcSysctl`).
//! - [`PinIo`]: the map pins under the pin root (`pins::BpffsPins`), for stale-pin removal.

use std::{hash::Hash, path::Path};

use maps_schema::{
    CtEntry,
    conntrack::{Ct4Key, Ct6Key},
};

use aya::{
    Pod,
    maps::{
        HashMap, Map, MapData, MapError,
        lpm_trie::{Key as LpmKey, LpmTrie},
    },
    programs::TcAttachType,
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
    /// A file or syscall operation failed.
    #[error("cannot {op} {what}: {source}")]
    Io {
        /// The operation.
        op: &'static str,
        /// What it was applied to.
        what: String,
        /// The cause.
        #[source]
        source: std::io::Error,
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

/// What one hook of a workload link holds, as the driver classifies it.
#[derive(Clone, Copy, Debug, Default, PartialEq, Eq)]
pub struct Hook {
    /// The program the mechanism's own attachment runs there, if it is live on this interface.
    pub ours: Option<u32>,
    /// Something else of weir's is there that must go once ours is in place.
    pub leftovers: bool,
}

/// The kernel operations of the attachment driver; the real one uses aya, netlink and bpffs.
pub trait Attacher: Send {
    /// Link pins present: (ifname, program).
    fn pinned(&self) -> Result<Vec<(String, String)>, KernelError>;
    /// True when a link pin exists for (ifname, program).
    fn has_pin(&self, ifname: &str, program: &str) -> bool;
    /// Reads back `program`'s hook on interface `ifname` (index `ifindex`).
    fn hook(
        &mut self,
        ifname: &str,
        ifindex: u32,
        program: &str,
        hook: TcAttachType,
    ) -> Result<Hook, KernelError>;
    /// The id of the program this agent attaches as `program`.
    fn current(&self, program: &str) -> u32;
    /// True while interface `ifname` exists with index `ifindex` (it may vanish before the link
    /// watcher says so: a pod's veth dies with its namespace).
    fn link_exists(&self, ifname: &str, ifindex: u32) -> bool;
    /// Attaches `program` to `ifname` anew (a pin that outlived its interface is replaced).
    fn attach(
        &mut self,
        ifname: &str,
        ifindex: u32,
        program: &str,
        hook: TcAttachType,
    ) -> Result<(), KernelError>;
    /// Points the existing attachment at the current program (atomic).
    fn update(
        &mut self,
        ifname: &str,
        ifindex: u32,
        program: &str,
        hook: TcAttachType,
    ) -> Result<(), KernelError>;
    /// Removes the leftovers at `program`'s hook; returns how many went.
    fn sweep(
        &mut self,
        ifname: &str,
        ifindex: u32,
        program: &str,
        hook: TcAttachType,
    ) -> Result<u64, KernelError>;
    /// Removes the pin (detaching the link once nothing else holds it).
    fn unpin(&mut self, ifname: &str, program: &str) -> Result<(), KernelError>;
}

/// The XDP prefilter's attachments: one pinned XDP link per interface.
pub trait XdpIo: Send {
    /// Interfaces that have a prefilter link pin.
    fn pinned(&self) -> Result<Vec<String>, KernelError>;
    /// The program the pinned link of `ifname` runs, if its pin opens.
    fn pinned_program(&self, ifname: &str) -> Option<u32>;
    /// True when the pinned link of `ifname` runs on the interface of that name now (not on one
    /// that was deleted and recreated under the same name).
    fn pin_is_live(&self, ifname: &str) -> bool;
    /// The id of the prefilter program this agent loaded.
    fn current(&self) -> u32;
    /// True while interface `ifname` exists.
    fn link_exists(&self, ifname: &str) -> bool;
    /// Attaches the current program to `ifname` (through an existing pin: replaced atomically).
    fn attach(&mut self, ifname: &str) -> Result<attach::AttachMode, KernelError>;
    /// Removes the pin of `ifname` (detaching its link).
    fn unpin(&mut self, ifname: &str) -> Result<(), KernelError>;
}

/// The conntrack maps of one layout (`ct4`/`ct6`) and the programs' created-entries counter.
pub trait CtIo: Send {
    /// Every IPv4 entry.
    fn entries4(&self) -> Result<Vec<(Ct4Key, CtEntry)>, KernelError>;
    /// Every IPv6 entry.
    fn entries6(&self) -> Result<Vec<(Ct6Key, CtEntry)>, KernelError>;
    /// Deletes IPv4 entries (missing ones are skipped); returns how many went.
    fn delete4(&mut self, keys: &[Ct4Key]) -> Result<u64, KernelError>;
    /// Deletes IPv6 entries; returns how many went.
    fn delete6(&mut self, keys: &[Ct6Key]) -> Result<u64, KernelError>;
    /// Capacity of (`ct4`, `ct6`).
    fn capacity(&self) -> (u64, u64);
    /// Entries the programs created (IPv4, IPv6) since the counter's pin was made; `None` without it.
    fn created(&self) -> Option<[u64; 2]>;
}

/// The verdict counters: one slot per (reason, direction), summed over CPUs.
pub trait CountersIo: Send {
    /// (packets, bytes) of slot `index`.
    fn slot(&self, index: u32) -> Result<(u64, u64), KernelError>;
}

/// Kernel settings under `/proc/sys`.
pub trait SysctlIo: Send {
    /// The current value (trimmed), `None` when the file cannot be read.
    fn get(&self, path: &str) -> Option<String>;
    /// Writes `value`.
    fn set(&mut self, path: &str, value: &str) -> Result<(), std::io::Error>;
}

/// The map pins of the pin root.
pub trait PinIo: Send {
    /// File names in the maps directory.
    fn map_pins(&self) -> Result<Vec<String>, KernelError>;
    /// Removes one (a missing one is not an error).
    fn remove_map_pin(&mut self, name: &str) -> Result<(), KernelError>;
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
